//! The layout of one operand as a CUDA kernel receives it (`DlbIndexer` in
//! `kernels/cuda/cu/dlbridge_common.cuh`): the logical shape and the operand's
//! strides, in elements, innermost dim last, at most [`MAX_DIMS`] dims after
//! merging.
//!
//! Dims are merged per operand where the operand is contiguous across them
//! (`stride[d] == stride[d + 1] * shape[d + 1]`) and size-1 dims are dropped:
//! the flat row-major index of the logical shape splits the same way over the
//! merged dims, so each operand of a call may merge differently.

use dlbridge_core::{Error, Result};

/// Dims a kernel's indexer holds.
pub const MAX_DIMS: usize = 8;

/// `DlbIndexer`: 8 x i64 shape, 8 x i64 strides, i32 ndim, padded to 136 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Indexer {
    /// Dims of the logical shape (after merging), outermost first.
    pub shape: [i64; MAX_DIMS],
    /// The operand's strides for those dims, in elements.
    pub strides: [i64; MAX_DIMS],
    /// How many dims are used (0: a single element at offset 0).
    pub ndim: i32,
    _pad: i32,
}

impl Indexer {
    /// The indexer of an operand with these strides over the logical `shape`.
    pub fn new(shape: &[i64], strides: &[i64]) -> Result<Indexer> {
        if shape.len() != strides.len() {
            return Err(Error::Shape(format!("indexer: {} dims but {} strides", shape.len(), strides.len())));
        }
        let mut dims: Vec<(i64, i64)> = Vec::with_capacity(shape.len());
        for (&n, &s) in shape.iter().zip(strides) {
            if n == 1 {
                continue;
            }
            match dims.last_mut() {
                // The previous (outer) dim steps exactly over this one: one dim.
                Some(last) if last.1 == s.wrapping_mul(n) && n != 0 => {
                    last.0 *= n;
                    last.1 = s;
                }
                _ => dims.push((n, s)),
            }
        }
        if dims.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "a CUDA kernel takes operands of at most {MAX_DIMS} dims after merging contiguous ones; this one has {} (shape {shape:?}, strides {strides:?})",
                dims.len()
            )));
        }
        let mut ix = Indexer::default();
        for (d, &(n, s)) in dims.iter().enumerate() {
            ix.shape[d] = n;
            ix.strides[d] = s;
        }
        ix.ndim = dims.len() as i32;
        Ok(ix)
    }

    /// Whether element `i` is at offset `i` (one dim of stride 1, or none).
    pub fn is_contiguous(&self) -> bool {
        self.ndim == 0 || (self.ndim == 1 && self.strides[0] == 1)
    }

    /// The element offset of flat (row-major) index `i`: what `dlb_offset` computes on the device.
    pub fn offset(&self, mut i: i64) -> i64 {
        let mut off = 0;
        for d in (0..self.ndim as usize).rev() {
            let n = self.shape[d];
            off += (i % n) * self.strides[d];
            i /= n;
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_matches_the_cuda_struct() {
        assert_eq!(std::mem::size_of::<Indexer>(), 136);
        assert_eq!(std::mem::align_of::<Indexer>(), 8);
        let ix = Indexer::default();
        let base = &ix as *const Indexer as usize;
        assert_eq!(&ix.strides as *const _ as usize - base, 64);
        assert_eq!(&ix.ndim as *const _ as usize - base, 128);
    }

    /// Every logical index's offset, the slow way.
    fn offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
        let n: i64 = shape.iter().product();
        (0..n)
            .map(|mut i| {
                let mut off = 0;
                for d in (0..shape.len()).rev() {
                    off += (i % shape[d]) * strides[d];
                    i /= shape[d];
                }
                off
            })
            .collect()
    }

    #[test]
    fn merged_indexers_address_the_same_elements() {
        let cases: &[(&[i64], &[i64])] = &[
            (&[4, 5, 6], &[30, 6, 1]),
            (&[4, 5, 6], &[1, 4, 20]),
            (&[4, 5, 6], &[0, 6, 1]),
            (&[4, 1, 6], &[6, 99, 1]),
            (&[3, 4], &[-4, -1]),
            (&[2, 3, 4], &[24, 4, 1]),
            (&[2, 2, 2, 2, 2, 2, 2, 2, 2, 2], &[1024, 512, 256, 128, 64, 32, 16, 8, 4, 2]),
            (&[], &[]),
        ];
        for &(shape, strides) in cases {
            let ix = Indexer::new(shape, strides).unwrap();
            let n: i64 = shape.iter().product();
            let got: Vec<i64> = (0..n).map(|i| ix.offset(i)).collect();
            assert_eq!(got, offsets(shape, strides), "{shape:?} {strides:?} -> {ix:?}");
        }
        assert!(Indexer::new(&[4, 5, 6], &[30, 6, 1]).unwrap().is_contiguous());
        assert_eq!(Indexer::new(&[2, 3, 4], &[24, 4, 1]).unwrap().ndim, 2, "a sliced outer dim stays");
        assert!(!Indexer::new(&[4, 5], &[1, 4]).unwrap().is_contiguous());
        assert!(Indexer::new(&[], &[]).unwrap().is_contiguous());
    }

    #[test]
    fn more_than_eight_unmergeable_dims_are_refused_by_name() {
        let shape = [2i64; 9];
        let strides: Vec<i64> = (0..9).map(|d| 1 << (2 * (9 - d))).collect();
        let e = Indexer::new(&shape, &strides).unwrap_err().to_string();
        assert!(e.contains("at most 8 dims") && e.contains("has 9"), "{e}");
        assert!(Indexer::new(&[2, 3], &[1]).is_err());
    }
}
