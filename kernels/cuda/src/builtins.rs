//! The CUDA C sources of the built-in CUDA kernels (`kernels/cuda/cu`), their
//! entry points, and their PTX through NVRTC and the [`PtxCache`].

use std::sync::Arc;

use dlbridge_core::Result;

use crate::nvrtc::{Output, PtxCache};

/// `dlbridge_common.cuh`: `DlbIndexer`, `dlb_offset`, dtype traits, the block
/// reduction; shared by the built-in sources and the generated ones.
pub const COMMON: &str = include_str!("../cu/dlbridge_common.cuh");
const INCLUDE: &str = "#include \"dlbridge_common.cuh\"";

/// One source file of built-in kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The file's name (NVRTC's program name).
    pub name: &'static str,
    /// The operations it defines (entry points `dlbridge_<op>_<dtype>`).
    pub ops: &'static [&'static str],
    text: &'static str,
}

/// The dtypes every built-in CUDA kernel is instantiated for.
pub const DTYPES: [&str; 4] = ["f32", "f64", "f16", "bf16"];

/// Every built-in source.
pub const SOURCES: [Source; 3] = [
    Source { name: "elementwise.cu", ops: &["add", "mul", "relu", "gelu"], text: include_str!("../cu/elementwise.cu") },
    Source { name: "softmax.cu", ops: &["softmax", "softmax_partial", "softmax_finish"], text: include_str!("../cu/softmax.cu") },
    Source { name: "sum.cu", ops: &["sum", "sum_partial", "sum_finish"], text: include_str!("../cu/sum.cu") },
];

impl Source {
    /// The source as NVRTC gets it: the shared header pasted in place of its `#include`.
    pub fn text(&self) -> String {
        self.text.replacen(INCLUDE, COMMON, 1)
    }

    /// The entry points this source defines.
    pub fn entry_points(&self) -> Vec<String> {
        self.ops.iter().flat_map(|op| DTYPES.iter().map(move |d| format!("dlbridge_{op}_{d}"))).collect()
    }

    /// Its PTX for `arch` (an NVRTC `--gpu-architecture=compute_XY` option), compiled once.
    pub fn ptx(&self, cache: &PtxCache, arch: &str) -> Result<Arc<str>> {
        cache.get_or_compile(&self.text(), self.name, &options(arch))
    }

    /// Its CUBIN for `arch` (`--gpu-architecture=sm_XY`), compiled once.
    pub fn cubin(&self, cache: &PtxCache, arch: &str) -> Result<Arc<[u8]>> {
        cache.get_or_compile_to(&self.text(), self.name, &options(arch), Output::Cubin)
    }
}

/// The NVRTC options of the built-in kernels.
pub fn options(arch: &str) -> Vec<String> {
    vec![arch.to_string(), "--std=c++17".into(), "-default-device".into()]
}

/// The source that defines `dlbridge_<op>_<dtype>`.
pub fn source_of(op: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| s.ops.contains(&op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_includes_the_shared_header_once_and_gets_it_pasted() {
        for s in SOURCES {
            assert_eq!(s.text.matches(INCLUDE).count(), 1, "{}", s.name);
            let t = s.text();
            assert!(!t.contains(INCLUDE) && t.contains("struct DlbIndexer"), "{}", s.name);
        }
        assert_eq!(source_of("gelu").unwrap().name, "elementwise.cu");
        assert_eq!(
            source_of("sum").unwrap().entry_points()[..4],
            ["dlbridge_sum_f32", "dlbridge_sum_f64", "dlbridge_sum_f16", "dlbridge_sum_bf16"]
        );
        assert_eq!(
            source_of("softmax_partial").unwrap().entry_points()[4..8],
            [
                "dlbridge_softmax_partial_f32",
                "dlbridge_softmax_partial_f64",
                "dlbridge_softmax_partial_f16",
                "dlbridge_softmax_partial_bf16"
            ]
        );
        assert!(source_of("matmul").is_none());
        // The launcher's softmax block limit is the one the kernels are compiled for.
        let softmax = source_of("softmax").unwrap().text();
        assert!(softmax.contains(&format!("#define DLB_SOFTMAX_MAX_BLOCK {}\n", crate::launch::SOFTMAX_MAX_BLOCK)));
        assert_eq!(softmax.matches("__launch_bounds__(DLB_SOFTMAX_MAX_BLOCK, 1)").count(), 3);
    }
}
