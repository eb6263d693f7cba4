//! Building a kernel from source into a library this process may run: the
//! system compiler (`toolchain.rs`), the check of the user's fragments in the
//! compiler's own preprocessed output (`fragments.rs`), the check of the
//! compiled library's ELF file before it is opened (`elf.rs`), the disk cache
//! and its sealed entries (`cache.rs`, under the directory `dirs.rs` names),
//! and the specialisations per dtype combination that are built on first use
//! and kept (`specialise.rs`).
//!
//! A new cache rule goes in `cache.rs`; a new check of what the compiler made
//! in `fragments.rs` (source) or `elf.rs` (library). Building uses the
//! generated source (`codegen/`) and the registry's plugin loader and trusted
//! directories; it knows nothing of a kernel's kind.

pub(crate) mod cache;
pub(crate) mod dirs;
pub(crate) mod elf;
pub(crate) mod fragments;
pub(crate) mod imports;
pub(crate) mod specialise;
pub(crate) mod toolchain;
