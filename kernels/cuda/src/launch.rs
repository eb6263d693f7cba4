//! Launch configurations of the built-in CUDA kernels, from the output's size.
//!
//! Elementwise kernels use grid-stride loops: [`ELEMENTWISE_BLOCK`] threads a
//! block and enough blocks to fill the device ([`BLOCKS_PER_SM`] per
//! multiprocessor) or cover the elements, whichever is fewer. Last-dim
//! reductions (softmax, sum) run one block per row (grid-stride over rows),
//! with a power-of-two block between 32 and 1024 threads sized to the row.

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

/// The launch of a last-dim reduction over `rows` rows of `cols` elements.
pub fn rows(rows: u64, cols: u64, sms: u32) -> Option<Launch> {
    if rows == 0 {
        return None;
    }
    let block = cols.clamp(32, 1024).next_power_of_two().min(1024) as u32;
    let fill = u64::from(sms.max(1)) * u64::from(BLOCKS_PER_SM);
    let grid = rows.min(fill).min(MAX_GRID_X) as u32;
    Some(Launch { grid, block, shared: 0 })
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
    fn reduction_blocks_are_powers_of_two_sized_to_the_row() {
        assert_eq!(rows(0, 10, 80), None);
        assert_eq!(rows(4, 1, 80).unwrap().block, 32);
        assert_eq!(rows(4, 33, 80).unwrap().block, 64);
        assert_eq!(rows(4, 1024, 80).unwrap().block, 1024);
        assert_eq!(rows(4, 1 << 20, 80).unwrap().block, 1024);
        assert_eq!(rows(4, 0, 80).unwrap().block, 32);
        assert_eq!(rows(4096, 1024, 80).unwrap().grid, 2560);
        assert_eq!(rows(3, 1024, 80).unwrap().grid, 3);
        for c in [1u64, 31, 32, 100, 513, 5000] {
            let b = rows(1, c, 1).unwrap().block;
            assert!(b.is_power_of_two() && (32..=1024).contains(&b), "{c} -> {b}");
        }
    }
}
