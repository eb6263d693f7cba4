//! Launch configurations of the built-in CUDA kernels, from the output's size.
//!
//! Elementwise kernels use grid-stride loops: [`ELEMENTWISE_BLOCK`] threads a
//! block and enough blocks to fill the device ([`BLOCKS_PER_SM`] per
//! multiprocessor) or cover the elements, whichever is fewer. Last-dim
//! reductions (softmax, sum, mean) run a warp per row for short rows, a block
//! per row for longer ones, and split long rows that are too few to fill the
//! device into pieces with a second pass ([`rows`]), grid-stride over rows.

/// Threads per block of an elementwise kernel.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Resident blocks aimed for per multiprocessor.
pub const BLOCKS_PER_SM: u32 = 32;
/// The grid's x dimension limit.
pub const MAX_GRID_X: u64 = (1 << 31) - 1;

/// A kernel launch: blocks, threads per block, dynamic shared memory bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Blocks (grid x).
    pub grid: u32,
    /// Threads per block (block x).
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub shared: u32,
}

/// The launch of an elementwise kernel over `n` elements on a device with `sms`
/// multiprocessors; `None` when there is nothing to do.
pub fn elementwise(n: u64, sms: u32) -> Option<Launch> {
    if n == 0 {
        return None;
    }
    let needed = n.div_ceil(u64::from(ELEMENTWISE_BLOCK));
    let fill = u64::from(sms.max(1)) * u64::from(BLOCKS_PER_SM);
    let grid = needed.min(fill).min(MAX_GRID_X) as u32;
    Some(Launch { grid, block: ELEMENTWISE_BLOCK, shared: 0 })
}

/// Rows of at most this many elements take a warp each (several rows a
/// block, warp shuffles only); longer rows a block each.
pub const WARP_ROW_MAX_COLS: u64 = 1024;
/// Threads a block of warp-per-row reductions (8 rows at a time).
pub const WARP_ROWS_BLOCK: u32 = 256;
/// Threads a block of softmax, at most (`DLB_SOFTMAX_MAX_BLOCK` in softmax.cu:
/// its threads need more registers than a 1024-thread block leaves them).
pub const SOFTMAX_MAX_BLOCK: u32 = 512;
/// Elements a thread of a block-per-row reduction aims to read (two 16-byte loads of f32).
pub const ROW_ELEMS_PER_THREAD: u64 = 8;

/// Threads a multiprocessor holds at once (every architecture NVRTC targets
/// since Volta holds at least 2048 but Turing's 1024; a split aims to fill this many).
pub const THREADS_PER_SM: u64 = 2048;
/// Pieces of a split row are multiples of this many elements (a piece of a
/// 16-byte aligned contiguous row starts 16-byte aligned for any element size).
pub const PIECE_ALIGN: u64 = 8;

/// The launch of a last-dim reduction (softmax, sum) and its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLaunch {
    /// Blocks and threads.
    pub launch: Launch,
    /// A warp per row (or piece) (`warp_rows = 1` in the kernel), else a block.
    pub warp_rows: bool,
    /// Pieces a row is cut into: 1, one pass; more, a first pass over
    /// `rows * splits` pieces of [`RowLaunch::chunk`] columns writing partial
    /// results, then a second pass combining each row's.
    pub splits: u64,
    /// Columns a piece (the whole row when `splits` is 1).
    pub chunk: u64,
}

/// Threads a block for rows (or pieces) of `cols` elements: about
/// [`ROW_ELEMS_PER_THREAD`] each, a power of two from 128 (or `max_block`,
/// if smaller) to `max_block`.
pub fn row_block(cols: u64, max_block: u32) -> u32 {
    let max = u64::from(max_block.clamp(32, 1024));
    cols.div_ceil(ROW_ELEMS_PER_THREAD).clamp(128.min(max), max).next_power_of_two().min(max) as u32
}

/// The launch of a last-dim reduction over `rows` rows of `cols` elements:
/// short rows (up to [`WARP_ROW_MAX_COLS`]) a warp each, [`WARP_ROWS_BLOCK`]
/// threads a block; longer rows a block each, sized so that each thread reads
/// about [`ROW_ELEMS_PER_THREAD`] elements (a power of two from 128 to 1024);
/// long rows in too few rows to fill the device with a block each are split
/// into pieces (a multiple of [`PIECE_ALIGN`] columns, at least a full
/// block's worth) so that the pieces fill it. Grid-stride over rows (pieces)
/// either way, at most enough blocks to fill the device.
pub fn rows(rows: u64, cols: u64, sms: u32) -> Option<RowLaunch> {
    rows_within(rows, cols, sms, 1024)
}

/// [`rows`] with blocks of at most `max_block` threads (a power of two from
/// 32 to 1024), for kernels whose shared memory or registers allow no more.
pub fn rows_within(rows: u64, cols: u64, sms: u32, max_block: u32) -> Option<RowLaunch> {
    if rows == 0 {
        return None;
    }
    let sms = u64::from(sms.max(1));
    let fill = sms * u64::from(BLOCKS_PER_SM);
    if cols <= WARP_ROW_MAX_COLS {
        let per_block = u64::from(WARP_ROWS_BLOCK / 32);
        let grid = rows.div_ceil(per_block).min(fill).min(MAX_GRID_X) as u32;
        let launch = Launch { grid, block: WARP_ROWS_BLOCK, shared: 0 };
        return Some(RowLaunch { launch, warp_rows: true, splits: 1, chunk: cols });
    }
    let block = row_block(cols, max_block);
    let resident = sms * (THREADS_PER_SM / u64::from(block)).max(1);
    if rows < resident {
        // Pieces: enough to fill the device, at most one per largest block's share of the row (rounded up).
        let min_piece = u64::from(max_block.clamp(32, 1024)) * ROW_ELEMS_PER_THREAD;
        let wanted = resident.div_ceil(rows).min(cols.div_ceil(min_piece));
        if wanted > 1 {
            let chunk = cols.div_ceil(wanted).next_multiple_of(PIECE_ALIGN);
            let splits = cols.div_ceil(chunk);
            let block = row_block(chunk, max_block);
            let grid = (rows * splits).min(fill).min(MAX_GRID_X) as u32;
            return Some(RowLaunch { launch: Launch { grid, block, shared: 0 }, warp_rows: false, splits, chunk });
        }
    }
    let grid = rows.min(fill).min(MAX_GRID_X) as u32;
    Some(RowLaunch { launch: Launch { grid, block, shared: 0 }, warp_rows: false, splits: 1, chunk: cols })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elementwise_grids_cover_small_tensors_and_fill_large_devices() {
        assert_eq!(elementwise(0, 132), None);
        assert_eq!(elementwise(1, 132), Some(Launch { grid: 1, block: 256, shared: 0 }));
        assert_eq!(elementwise(256, 132).unwrap().grid, 1);
        assert_eq!(elementwise(257, 132).unwrap().grid, 2);
        // 4096x1024: 16384 blocks wanted, 132 SMs x 32 resident: a grid-stride loop covers the rest.
        assert_eq!(elementwise(4096 * 1024, 132).unwrap().grid, 132 * 32);
        assert_eq!(elementwise(u64::MAX, u32::MAX).unwrap().grid as u64, MAX_GRID_X);
        // An unknown SM count still launches.
        assert_eq!(elementwise(1 << 20, 0).unwrap().grid, 32);
    }

    #[test]
    fn short_rows_take_a_warp_each_and_long_rows_a_block_sized_to_the_row() {
        assert_eq!(rows(0, 10, 80), None);
        // Up to 1024 elements: a warp a row, 8 rows a block.
        for cols in [0u64, 1, 32, 128, 1024] {
            let l = rows(4096, cols, 132).unwrap();
            assert!(l.warp_rows, "{cols}");
            assert_eq!((l.launch.block, l.launch.grid), (256, 512), "{cols}");
        }
        assert_eq!(rows(65536, 128, 132).unwrap().launch.grid, 132 * 32);
        assert_eq!(rows(3, 100, 132).unwrap().launch.grid, 1);
        // Longer rows: a block each, about 8 elements a thread.
        let l = rows(8192, 1025, 132).unwrap();
        assert!(!l.warp_rows);
        assert_eq!(l.launch.block, 256);
        assert_eq!(rows(4096, 4096, 132).unwrap().launch.block, 512);
        assert_eq!(rows(1024, 8192, 132).unwrap().launch.block, 1024);
        assert_eq!(rows(4096, 1 << 20, 80).unwrap().launch.grid, 2560);
    }

    #[test]
    fn long_rows_in_few_rows_are_split_into_pieces_that_fill_the_device() {
        // 64 rows of 262144 on 132 SMs: 264 resident 1024-thread blocks; 5 pieces a row.
        let l = rows(64, 262_144, 132).unwrap();
        assert_eq!((l.splits, l.chunk, l.launch.block, l.launch.grid), (5, 52_432, 1024, 320));
        assert_eq!(l.chunk % PIECE_ALIGN, 0);
        assert!(l.chunk * l.splits >= 262_144 && l.chunk * (l.splits - 1) < 262_144);
        // One row of 16M (a reduction to a scalar): a piece per resident block.
        let l = rows(1, 1 << 24, 132).unwrap();
        assert_eq!((l.splits, l.launch.block), (264, 1024));
        assert!(l.chunk * l.splits >= 1 << 24 && l.chunk * (l.splits - 1) < 1 << 24);
        // Rows that fill the device on their own are not split.
        for (r, c) in [(4096u64, 4096u64), (1024, 8192), (8192, 2048)] {
            let l = rows(r, c, 132).unwrap();
            assert_eq!((l.splits, l.chunk), (1, c), "{r}x{c}");
        }
        // Pieces never smaller than 8192 elements: a 9000-element row stays whole or splits in two.
        let l = rows(1, 9000, 132).unwrap();
        assert_eq!((l.splits, l.chunk), (2, 4504));
        assert_eq!(rows(1, 8192, 132).unwrap().splits, 1);
        assert_eq!(rows(1, 2000, 132).unwrap().splits, 1);
        // A softmax block holds at most 512 threads: longer rows take more elements a thread.
        let l = rows_within(1024, 8192, 132, SOFTMAX_MAX_BLOCK).unwrap();
        assert_eq!((l.launch.block, l.splits), (512, 1));
        let l = rows_within(3, 200_000, 132, SOFTMAX_MAX_BLOCK).unwrap();
        assert!(l.launch.block == 512 && l.splits > 1 && l.chunk >= 4000, "{l:?}");
        assert_eq!(rows_within(4096, 100, 132, SOFTMAX_MAX_BLOCK).unwrap().launch.block, WARP_ROWS_BLOCK);
        // Whatever the sizes, pieces cover the row exactly once and stay aligned.
        for (r, c, sms) in [(3u64, 1u64 << 30, 1u32), (7, 100_003, 132), (1, 1 << 40, 132), (200, 65_537, 16)] {
            let l = rows(r, c, sms).unwrap();
            assert!(l.chunk.is_multiple_of(PIECE_ALIGN) || l.splits == 1, "{r}x{c}");
            assert!(l.chunk * l.splits >= c && l.chunk * (l.splits - 1) < c, "{r}x{c}: {l:?}");
            assert!(l.launch.grid >= 1 && u64::from(l.launch.grid) <= MAX_GRID_X);
        }
        for c in [1025u64, 2000, 5000, 1 << 20] {
            let b = rows(1, c, 1).unwrap().launch.block;
            assert!(b.is_power_of_two() && (128..=1024).contains(&b), "{c} -> {b}");
        }
    }
}
