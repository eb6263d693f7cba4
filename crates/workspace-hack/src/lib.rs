//! No code. Depending on this crate turns on, in the workspace's shared
//! dependencies, the features the whole workspace turns on, so that a build
//! of some packages (`cargo run -p ...`) reuses the artefacts of a build of
//! all of them (`cargo test --workspace`) instead of rebuilding everything
//! above a dependency built with other features. See its `Cargo.toml`.

#![forbid(unsafe_code)]
