//! # dlbridge-conformance
//!
//! A DLPack conformance suite any adapter's tests can call (a library, not an
//! `include!`): implement [`Harness`] for your framework — make a tensor of a
//! given [`Spec`] and export it as DLPack (producer), import a DLPack tensor
//! and read it back (consumer) — then
//!
//! ```text
//! dlbridge_conformance::conformance_tests!(MyHarness::new());
//! ```
//!
//! expands to one `#[test]` per case. A case the adapter cannot run returns
//! [`Status::Skip`] with the reason (reported as such, never as a pass); a
//! known failure is declared by the harness with its reason, and the test
//! fails loudly when it starts passing so the declaration gets removed.
//!
//! The cases come from the DLPack 1.3 header and the array API standard's
//! data-interchange rules (see `shared/DLPACK_RULES.md` in the project).

#![deny(unsafe_code)]

pub mod array;
#[allow(unsafe_code)]
pub mod cases;

use dlbridge_core::{DType, ManagedTensor, Result};

/// How a test tensor is laid out in its framework.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Compact row-major.
    Contiguous,
    /// The transpose of a compact `[shape[1], shape[0]]` tensor (2-d only).
    Transposed,
    /// Every other element of a larger compact tensor along the last dim.
    Step2,
    /// The last dim reversed (negative stride).
    Reversed,
    /// A view starting one row into a larger tensor (non-zero offset).
    Offset,
}

/// A tensor the harness is asked to make: element `i` (row-major, logical
/// order) holds `i` converted to the dtype (`i % 2 != 0` for bool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Element type.
    pub dtype: DType,
    /// Logical shape.
    pub shape: Vec<i64>,
    /// Memory layout.
    pub layout: Layout,
}

impl Spec {
    /// A contiguous tensor.
    pub fn new(dtype: DType, shape: &[i64]) -> Spec {
        Spec { dtype, shape: shape.to_vec(), layout: Layout::Contiguous }
    }
    /// The same tensor with another layout.
    pub fn with_layout(mut self, layout: Layout) -> Spec {
        self.layout = layout;
        self
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>().max(0) as usize
    }
}

/// What a consumer made of an imported tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBack {
    /// Address of element `[0, ..]` in the consumer.
    pub data_ptr: usize,
    /// Shape as the consumer sees it.
    pub shape: Vec<i64>,
    /// Dtype as the consumer sees it.
    pub dtype: DType,
    /// Elements in row-major logical order, each as f64 (bool as 0/1).
    pub values: Vec<f64>,
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The rule holds.
    Pass,
    /// The case cannot run on this adapter (why).
    Skip(String),
    /// The rule is broken (what happened).
    Fail(String),
}

/// A framework under test.
pub trait Harness {
    /// Adapter name, for reports.
    fn name(&self) -> &str;
    /// The dtypes the framework has.
    fn dtypes(&self) -> Vec<DType>;
    /// Producer side: makes a tensor of `spec` in the framework and exports
    /// it. `Ok(None)` means the framework cannot make such a tensor (the case
    /// is skipped); an error means the export failed.
    fn export(&self, spec: &Spec) -> Result<Option<ManagedTensor>>;
    /// Consumer side: imports `tensor` into the framework and reads it back.
    fn import(&self, tensor: ManagedTensor) -> Result<ReadBack>;
    /// Whether import and export share memory (pointer equality is then required).
    fn zero_copy(&self) -> bool {
        true
    }
    /// Whether the consumer can hold READ_ONLY tensors (and must not write them).
    fn accepts_read_only(&self) -> bool {
        true
    }
    /// Cases known to fail on this adapter, with the reason.
    fn known_failures(&self) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
}

/// One case of the suite.
pub type Case = fn(&dyn Harness) -> Status;

/// Runs `case` named `name` against `h`, applying the known-failure list:
/// `Ok(report)` when the outcome is acceptable, `Err(message)` otherwise.
pub fn check(h: &dyn Harness, name: &str, case: Case) -> std::result::Result<String, String> {
    let known = h.known_failures().into_iter().find(|(n, _)| *n == name).map(|(_, why)| why);
    match (case(h), known) {
        (Status::Pass, None) => Ok("pass".into()),
        (Status::Skip(why), _) => Ok(format!("skipped: {why}")),
        (Status::Fail(what), Some(why)) => Ok(format!("known failure: {why} (saw: {what})")),
        (Status::Fail(what), None) => Err(format!("{}: {name}: {what}", h.name())),
        (Status::Pass, Some(why)) => {
            Err(format!("{}: {name} is declared a known failure ({why}) but now passes: remove the declaration", h.name()))
        }
    }
}

/// Turns the suite into one `#[test]` per case for a harness expression.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            round_trip_of_every_dtype, zero_dim_and_zero_size_shapes, transposed_tensors_keep_their_layout,
            size_one_dims_with_odd_strides, strided_views_with_a_step, negative_strides_accepted_or_cleanly_refused,
            views_with_an_offset, zero_copy_where_advertised, producer_dropped_before_the_consumer,
            deleter_runs_exactly_once, read_only_is_honoured, legacy_and_versioned_structs,
            future_major_version_refused_and_released, unknown_dtype_and_device_refused,
            subbyte_padded_flag_refused_or_handled);
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let h = $harness;
                match $crate::check(&h, stringify!($case), $crate::cases::$case) {
                    Ok(report) => {
                        if report != "pass" {
                            println!("{}: {}: {report}", $crate::Harness::name(&h), stringify!($case));
                        }
                    }
                    Err(message) => panic!("{message}"),
                }
            }
        )*
    };
}

/// Every case with its name, for tools that print a table (`dlbridge conformance`).
pub fn all_cases() -> Vec<(&'static str, Case)> {
    use cases::*;
    vec![
        ("round_trip_of_every_dtype", round_trip_of_every_dtype as Case),
        ("zero_dim_and_zero_size_shapes", zero_dim_and_zero_size_shapes),
        ("transposed_tensors_keep_their_layout", transposed_tensors_keep_their_layout),
        ("size_one_dims_with_odd_strides", size_one_dims_with_odd_strides),
        ("strided_views_with_a_step", strided_views_with_a_step),
        ("negative_strides_accepted_or_cleanly_refused", negative_strides_accepted_or_cleanly_refused),
        ("views_with_an_offset", views_with_an_offset),
        ("zero_copy_where_advertised", zero_copy_where_advertised),
        ("producer_dropped_before_the_consumer", producer_dropped_before_the_consumer),
        ("deleter_runs_exactly_once", deleter_runs_exactly_once),
        ("read_only_is_honoured", read_only_is_honoured),
        ("legacy_and_versioned_structs", legacy_and_versioned_structs),
        ("future_major_version_refused_and_released", future_major_version_refused_and_released),
        ("unknown_dtype_and_device_refused", unknown_dtype_and_device_refused),
        ("subbyte_padded_flag_refused_or_handled", subbyte_padded_flag_refused_or_handled),
    ]
}
