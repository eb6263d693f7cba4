use std::process::Command;

#[test]
fn demo_command_reports_equal_pointers() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge")).arg("demo").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pointers equal = true"), "{text}");
    assert!(text.contains("strides [1, 4]"), "{text}");
}

#[test]
fn unknown_command_fails_with_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlbridge")).arg("frobnicate").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}
