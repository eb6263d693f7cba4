//! Empty: a build script makes cargo resolve `[build-dependencies]`, whose
//! features then unify with the other host dependencies'.
#![forbid(unsafe_code)]

fn main() {}
