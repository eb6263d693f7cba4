//! Launch configurations of the built-in CUDA kernels, from the output's size.
//!
//! Elementwise kernels use grid-stride loops: [`ELEMENTWISE_BLOCK`] threads a
//! block and enough blocks to fill the device ([`BLOCKS_PER_SM`] per
//! multiprocessor) or cover the elements, whichever is fewer. Last-dim
//! reductions (softmax, sum) run a warp per row for short rows and a block per
//! row for longer ones ([`rows`]), grid-stride over rows.

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
/// Elements a thread of a block-per-row reduction aims to read (two 16-byte loads of f32).
pub const ROW_ELEMS_PER_THREAD: u64 = 8;

/// The launch of a last-dim reduction (softmax, sum) and its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLaunch {
    /// Blocks and threads.
    pub launch: Launch,
    /// A warp per row (`warp_rows = 1` in the kernel), else a block per row.
    pub warp_rows: bool,
}

/// The launch of a last-dim reduction over `rows` rows of `cols` elements:
/// short rows (up to [`WARP_ROW_MAX_COLS`]) a warp each, [`WARP_ROWS_BLOCK`]
/// threads a block; longer rows a block each, sized so that each thread reads
/// about [`ROW_ELEMS_PER_THREAD`] elements (a power of two from 128 to 1024).
/// Grid-stride over rows either way, at most enough blocks to fill the device.
pub fn rows(rows: u64, cols: u64, sms: u32) -> Option<RowLaunch> {
    if rows == 0 {
        return None;
    }
    let fill = u64::from(sms.max(1)) * u64::from(BLOCKS_PER_SM);
    if cols <= WARP_ROW_MAX_COLS {
        let per_block = u64::from(WARP_ROWS_BLOCK / 32);
        let grid = rows.div_ceil(per_block).min(fill).min(MAX_GRID_X) as u32;
        return Some(RowLaunch { launch: Launch { grid, block: WARP_ROWS_BLOCK, shared: 0 }, warp_rows: true });
    }
    let block = cols.div_ceil(ROW_ELEMS_PER_THREAD).clamp(128, 1024).next_power_of_two().min(1024) as u32;
    let grid = rows.min(fill).min(MAX_GRID_X) as u32;
    Some(RowLaunch { launch: Launch { grid, block, shared: 0 }, warp_rows: false })
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
        assert_eq!(rows(64, 262_144, 132).unwrap().launch, Launch { grid: 64, block: 1024, shared: 0 });
        assert_eq!(rows(4096, 1 << 20, 80).unwrap().launch.grid, 2560);
        for c in [1025u64, 2000, 5000, 1 << 20] {
            let b = rows(1, c, 1).unwrap().launch.block;
            assert!(b.is_power_of_two() && (128..=1024).contains(&b), "{c} -> {b}");
        }
    }
}
