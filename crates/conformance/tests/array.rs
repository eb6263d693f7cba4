//! The suite against dlbridge's own Array.

use dlbridge_conformance::array::ArrayHarness;
use dlbridge_conformance::{Harness, ReadBack, Spec};
use dlbridge_core::{DType, ManagedTensor, Result};

dlbridge_conformance::conformance_tests!(ArrayHarness);

#[test]
fn the_checker_flags_a_known_failure_that_now_passes() {
    #[derive(Debug)]
    struct Overcautious;
    impl Harness for Overcautious {
        fn name(&self) -> &str {
            "overcautious"
        }
        fn dtypes(&self) -> Vec<DType> {
            ArrayHarness.dtypes()
        }
        fn export(&self, spec: &Spec) -> Result<Option<ManagedTensor>> {
            ArrayHarness.export(spec)
        }
        fn import(&self, tensor: ManagedTensor) -> Result<ReadBack> {
            ArrayHarness.import(tensor)
        }
        fn known_failures(&self) -> Vec<(&'static str, &'static str)> {
            vec![("deleter_runs_exactly_once", "thought to leak")]
        }
    }
    let e = dlbridge_conformance::check(&Overcautious, "deleter_runs_exactly_once", dlbridge_conformance::cases::deleter_runs_exactly_once)
        .unwrap_err();
    assert!(e.contains("now passes"), "{e}");
}
