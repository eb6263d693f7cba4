//! The check of every library dlbridge compiles, from its ELF file, before it
//! is opened.
//!
//! Opening a shared library runs its initialisers: the functions of
//! `DT_INIT`, `DT_INIT_ARRAY` and `DT_PREINIT_ARRAY` (what C++ static
//! constructors, `__attribute__((constructor))` and `.ctors` become), and
//! `DT_FINI`/`DT_FINI_ARRAY` run when it is closed. A library generated for an
//! `ElementwiseKernel`, a `ReductionKernel` or a definition must run nothing
//! before its kernel is called, so it may have only the initialisers and
//! finalisers an empty library built by the same compiler and flags has (the
//! C runtime's own): the same number of each, whose code starts with the same
//! bytes, and `.init`/`.fini` of the same size. They are compared by count and
//! by the code they point at, never by symbol name (a preamble may define a
//! function called `frame_dummy`). Its dynamic symbol table exports its entry
//! points and nothing else (the generated libraries are linked with a version
//! script that makes everything else local). What it imports is judged by
//! the library that provides each symbol (`imports.rs`): code that leaves
//! its callers, starts threads or keeps the text's code to run later is
//! refused however the text spelt the call.
//!
//! `dlbridge.load_inline` compiles the user's own C++, whose constructors run
//! when it is loaded (as torch's `load_inline`): its libraries are checked to
//! be ELF shared objects, their initialisers allowed.
//!
//! On systems whose libraries are not ELF (macOS), the check is not made.

use std::path::Path;
use std::sync::OnceLock;

use dlbridge_core::{Error, ErrorKind, Result};

use crate::builder::imports::{self, Refusal};
use crate::builder::toolchain::Compiler;

/// What a library may have.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Policy<'a> {
    /// Generated code: no initialiser beyond the empty library's, exports
    /// exactly these entry points.
    Generated { exports: &'a [&'a str] },
    /// The user's own C++ (`load_inline`): initialisers and exports allowed.
    UserCode,
}

/// The linker version script of generated libraries: `exports` global,
/// everything else local.
pub(crate) fn version_script(exports: &[&str]) -> String {
    let names: String = exports.iter().map(|e| format!(" {e};")).collect();
    format!("{{\n  global:{names}\n  local: *;\n}};\n")
}

/// What runs when a library is opened or closed, as the check compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoadTime {
    /// Per array (preinit, init, fini): the first bytes of each entry's code.
    arrays: [Vec<Vec<u8>>; 3],
    /// `.init`'s and `.fini`'s sizes (0: absent).
    init_fini: [u64; 2],
    /// Whether `DT_INIT` / `DT_FINI` point at the start of `.init` / `.fini`.
    at_start: [bool; 2],
    /// Functions resolved at load (IFUNC: relocations of the resolver kind,
    /// symbols of the GNU indirect-function type), whose resolvers run
    /// inside `dlopen`, before any initialiser.
    ifuncs: usize,
    /// Whether loading it would make the process's stack executable (a
    /// `PT_GNU_STACK` with `PF_X`, or none).
    exec_stack: bool,
    /// Loadable segments both writable and executable.
    wx_segments: usize,
    /// Hooks the C runtime's own start-up and tear-down code calls when the
    /// library defines them (`__gmon_start__` from `_init`, the
    /// `_ITM_*TMCloneTable` pair from `frame_dummy`, `__cxa_finalize`), that
    /// it defines, and the size of `.tm_clone_table`.
    runtime_hooks: Vec<String>,
    tm_clone_table: u64,
    /// The symbols it defines (functions, data, labels; any binding) under
    /// names outside C++'s mangling (not `_Z...`), sorted.
    plain_symbols: Vec<String>,
    /// What it imports: each symbol with the library file its version
    /// names (`None`: unversioned) and whether the reference is weak, sorted.
    imports: Vec<(String, Option<String>, bool)>,
}

/// Unmangled symbols the generated code's runtime defines itself: the
/// handler the integer-division check calls and the checked stand-ins for
/// the C library's divisions (`dlbridge_compile/divguard.h`).
const RUNTIME_DEFINES: [&str; 5] = ["__ubsan_handle_divrem_overflow_abort", "__wrap_div", "__wrap_ldiv", "__wrap_lldiv", "__wrap_imaxdiv"];

/// What the C runtime's start-up and tear-down code (crti, crtbegin) calls
/// when a library defines it.
const RUNTIME_HOOKS: [&str; 5] =
    ["__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable", "__cxa_finalize", "_Jv_RegisterClasses"];

/// How many bytes of each initialiser's code are compared.
const CODE_BYTES: usize = 4;

#[cfg(target_os = "linux")]
fn read(data: &[u8], what: &str) -> Result<(LoadTime, Vec<String>)> {
    use object::read::elf::{Dyn as _, ElfFile64};
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolFlags, elf};

    let bad = |m: String| Error::Coded { kind: ErrorKind::Runtime, message: format!("{what}: the compiled library {m}") };
    let file = ElfFile64::<object::Endianness>::parse(data).map_err(|e| bad(format!("is not a 64-bit ELF file: {e}")))?;
    if file.kind() != object::ObjectKind::Dynamic {
        return Err(bad("is not a shared library".into()));
    }
    let endian = file.endian();
    let dynamic = file
        .elf_section_table()
        .dynamic(endian, data)
        .map_err(|e| bad(format!("has a malformed dynamic section: {e}")))?
        .map_or(&[][..], |(d, _)| d);
    let tag = |t: elf::DynamicTag| dynamic.iter().find(|d| d.d_tag(endian) == t).map(|d| d.d_val(endian));
    // Relocated values (a RELA relocation may hold what the file leaves 0).
    let relocated: Vec<(u64, i64)> = file.dynamic_relocations().map(|it| it.map(|(at, r)| (at, r.addend())).collect()).unwrap_or_default();
    let bytes_at = |addr: u64, n: usize| -> Option<Vec<u8>> {
        // What the loader maps: the loadable segments (as the loader reads the addresses).
        file.segments().find_map(|s| {
            let (a, size) = (s.address(), s.size());
            if addr < a || addr >= a + size {
                return None;
            }
            let d = s.data().ok()?;
            let off = usize::try_from(addr - a).ok()?;
            d.get(off..off.checked_add(n)?.min(d.len())).map(<[u8]>::to_vec)
        })
    };
    let array = |at: elf::DynamicTag, size: elf::DynamicTag| -> Result<Vec<Vec<u8>>> {
        let (Some(addr), Some(size)) = (tag(at), tag(size)) else { return Ok(Vec::new()) };
        let raw = bytes_at(addr, usize::try_from(size).unwrap_or(0))
            .ok_or_else(|| bad("has an initialiser array outside its sections".into()))?;
        let mut out = Vec::new();
        for (k, chunk) in raw.chunks_exact(8).enumerate() {
            let slot = addr + 8 * k as u64;
            let mut target = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            if let Some(&(_, addend)) = relocated.iter().find(|(a, _)| *a == slot) {
                target = addend as u64;
            }
            out.push(
                bytes_at(target, CODE_BYTES).ok_or_else(|| bad(format!("has an initialiser pointing outside its code ({target:#x})")))?,
            );
        }
        Ok(out)
    };
    // An IFUNC: a resolver run while the loader relocates (x86-64's and AArch64's kinds).
    let irelative = |r: &object::Relocation| match r.flags() {
        object::RelocationFlags::Elf { r_type } => {
            r_type.0 == 37 && file.architecture() == object::Architecture::X86_64
                || r_type.0 == 1032 && file.architecture() == object::Architecture::Aarch64
        }
        _ => false,
    };
    let ifunc_symbol = |s: &dyn Fn() -> object::SymbolFlags<object::SectionIndex, object::SymbolIndex>| matches!(s(), SymbolFlags::Elf { st_info, .. } if st_info.st_type().0 == 10);
    let ifuncs = file.dynamic_relocations().map_or(0, |it| it.filter(|(_, r)| irelative(r)).count())
        + file.symbols().filter(|sym| ifunc_symbol(&|| sym.flags())).count()
        + file.dynamic_symbols().filter(|sym| ifunc_symbol(&|| sym.flags())).count();
    let stack = file
        .elf_program_headers()
        .iter()
        .find(|ph| object::read::elf::ProgramHeader::p_type(*ph, endian) == elf::PT_GNU_STACK)
        .map(|ph| object::read::elf::ProgramHeader::p_flags(ph, endian).0 & elf::PF_X.0 != 0);
    let exec_stack = stack.unwrap_or(true);
    let wx_segments = file
        .elf_program_headers()
        .iter()
        .filter(|ph| object::read::elf::ProgramHeader::p_type(*ph, endian) == elf::PT_LOAD)
        .filter(|ph| {
            let f = object::read::elf::ProgramHeader::p_flags(*ph, endian).0;
            f & elf::PF_W.0 != 0 && f & elf::PF_X.0 != 0
        })
        .count();
    let mut runtime_hooks: Vec<String> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|sym| !sym.is_undefined())
        .filter_map(|sym| sym.name().ok().filter(|n| RUNTIME_HOOKS.contains(n)).map(str::to_owned))
        .collect();
    runtime_hooks.sort();
    runtime_hooks.dedup();
    let tm_clone_table = file.section_by_name(".tm_clone_table").map_or(0, |s| s.size());
    let mut plain_symbols: Vec<String> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|sym| !sym.is_undefined() && !matches!(sym.kind(), object::SymbolKind::Section | object::SymbolKind::File))
        .filter_map(|sym| sym.name().ok().filter(|n| !n.is_empty() && !n.starts_with("_Z") && !n.contains('.')).map(str::to_owned))
        .collect();
    plain_symbols.sort();
    plain_symbols.dedup();
    let versions = file.elf_section_table().versions(endian, data).map_err(|e| bad(format!("has malformed symbol versions: {e}")))?;
    let mut imports: Vec<(String, Option<String>, bool)> = file
        .dynamic_symbols()
        .filter(|sym| sym.is_undefined())
        .filter_map(|sym| {
            let name = sym.name().ok().filter(|n| !n.is_empty())?;
            let provider = versions.as_ref().and_then(|v| {
                let version = v.version(v.version_index(endian, sym.index()).index()).ok().flatten()?;
                version.file().map(|f| String::from_utf8_lossy(f).into_owned())
            });
            Some((name.to_owned(), provider, sym.is_weak()))
        })
        .collect();
    imports.sort();
    imports.dedup();
    let section_size = |name: &str| file.section_by_name(name).map_or(0, |s| s.size());
    let section_addr = |name: &str| file.section_by_name(name).map(|s| s.address());
    let load = LoadTime {
        arrays: [
            array(elf::DT_PREINIT_ARRAY, elf::DT_PREINIT_ARRAYSZ)?,
            array(elf::DT_INIT_ARRAY, elf::DT_INIT_ARRAYSZ)?,
            array(elf::DT_FINI_ARRAY, elf::DT_FINI_ARRAYSZ)?,
        ],
        init_fini: [section_size(".init") + section_size(".ctors"), section_size(".fini") + section_size(".dtors")],
        at_start: [tag(elf::DT_INIT) == section_addr(".init"), tag(elf::DT_FINI) == section_addr(".fini")],
        ifuncs,
        exec_stack,
        wx_segments,
        runtime_hooks,
        tm_clone_table,
        plain_symbols,
        imports,
    };
    let mut exports: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| !s.is_undefined() && !s.is_local())
        .filter(|s| match s.flags() {
            SymbolFlags::Elf { st_other, .. } => {
                let vis = st_other.visibility();
                vis == elf::STV_DEFAULT || vis == elf::STV_PROTECTED
            }
            _ => true,
        })
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    exports.sort();
    Ok((load, exports))
}

#[cfg(not(target_os = "linux"))]
fn read(_data: &[u8], _what: &str) -> Result<(LoadTime, Vec<String>)> {
    Ok((
        LoadTime {
            arrays: Default::default(),
            init_fini: [0; 2],
            at_start: [true; 2],
            ifuncs: 0,
            exec_stack: false,
            wx_segments: 0,
            runtime_hooks: Vec::new(),
            tm_clone_table: 0,
            plain_symbols: Vec::new(),
            imports: Vec::new(),
        },
        Vec::new(),
    ))
}

/// What an empty library built by `compiler` with its flags has: built once
/// per process.
fn baseline(compiler: &Compiler) -> Result<&'static (LoadTime, Vec<String>)> {
    static BASE: OnceLock<std::result::Result<(LoadTime, Vec<String>), String>> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("dlbridge-empty-").tempdir().map_err(|e| format!("cannot create a directory: {e}"))?;
        let (cpp, so, script) = (dir.path().join("empty.cpp"), dir.path().join("empty.so"), dir.path().join("exports.map"));
        std::fs::write(&cpp, "extern \"C\" __attribute__((visibility(\"default\"))) void dlbridge_empty(void) {}\n")
            .and_then(|()| std::fs::write(&script, version_script(&["dlbridge_empty"])))
            .map_err(|e| format!("cannot write the empty library's source: {e}"))?;
        compiler.compile_with(&cpp, &so, "the empty library", &[], &link_flags(&script)).map_err(|e| e.to_string())?;
        let bytes = std::fs::read(&so).map_err(|e| format!("cannot read the empty library: {e}"))?;
        read(&bytes, "the empty library").map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|m| Error::Coded {
        kind: ErrorKind::Runtime,
        message: format!("cannot build the empty library the compiled kernels are checked against: {m}"),
    })
}

/// The flags that link a generated library with the version script `script`.
pub(crate) fn link_flags(script: &Path) -> Vec<String> {
    if cfg!(target_os = "linux") { vec![format!("-Wl,--version-script={}", script.display())] } else { Vec::new() }
}

/// Checks the library `bytes` under `policy`; `what` names the kernel in
/// errors. See the module's documentation.
pub(crate) fn check(compiler: &Compiler, bytes: &[u8], what: &str, policy: Policy<'_>) -> Result<()> {
    let (load, exports) = read(bytes, what)?;
    let Policy::Generated { exports: allowed } = policy else { return Ok(()) };
    let (base, base_exports) = baseline(compiler)?;
    let refuse = |m: String| Error::Coded {
        kind: ErrorKind::Value,
        message: format!(
            "{what}: {m}; code in a kernel's text may not run when its library is loaded (use `dlbridge.load_inline` for C++ of your own that must)"
        ),
    };
    for (k, name) in ["preinitialiser", "initialiser", "finaliser"].iter().enumerate() {
        if load.arrays[k] != base.arrays[k] {
            return Err(refuse(format!(
                "its compiled library has {} {name} functions where an empty library has {} (a global with a constructor or destructor, or a function marked to run at load, in the preamble? `<iostream>` defines one, and \
                 `__attribute__((target_clones(...)))` makes one that picks the clone)",
                load.arrays[k].len(),
                base.arrays[k].len()
            )));
        }
    }
    if load.ifuncs > base.ifuncs {
        return Err(refuse(
            "its compiled library has a function resolved at load (an IFUNC: `__attribute__((ifunc))`, `target_clones` or \
             `@gnu_indirect_function`), whose resolver would run inside `dlopen`"
                .into(),
        ));
    }
    if load.exec_stack && !base.exec_stack {
        return Err(refuse("its compiled library asks for an executable stack (`.note.GNU-stack` marked \"x\"), which loading it would give the whole process".into()));
    }
    if load.wx_segments > base.wx_segments {
        return Err(refuse("its compiled library has a segment both writable and executable".into()));
    }
    if let Some(h) = load.runtime_hooks.iter().find(|h| !base.runtime_hooks.contains(h)) {
        return Err(refuse(format!(
            "its compiled library defines `{h}`, which the C runtime's own code calls when the library is loaded or unloaded"
        )));
    }
    if load.tm_clone_table > base.tm_clone_table {
        return Err(refuse(
            "its compiled library has a `.tm_clone_table`, which the C runtime registers when the library is loaded".into(),
        ));
    }
    if load.init_fini != base.init_fini || load.at_start != base.at_start {
        return Err(refuse("its compiled library adds code to the `.init` or `.fini` sections run at load and unload".into()));
    }
    // A symbol of a name outside C++'s mangling is what C code and the
    // libraries the generated code calls bind to (`_setjmp`, `stderr`): the
    // text defines none (assembler text, a symbol attribute, `#pragma weak`,
    // a global variable outside any namespace would).
    let plain: Vec<&String> = load
        .plain_symbols
        .iter()
        .filter(|n| !allowed.contains(&n.as_str()) && !RUNTIME_DEFINES.contains(&n.as_str()) && !base.plain_symbols.contains(n))
        .collect();
    if let Some(first) = plain.first() {
        let list: Vec<String> = plain.iter().take(5).map(|e| format!("`{e}`")).collect();
        if plain.iter().any(|n| n.starts_with("__tls_")) {
            // The guard and initialiser GCC makes for a `thread_local` with a
            // dynamic initialiser, wherever the variable is.
            return Err(refuse(format!(
                "its compiled library defines {}: a `thread_local` variable with an initialiser that runs code (its first use \
                 on each thread would run it); initialise it with a constant, or make it a local of the function that uses it",
                list.join(", ")
            )));
        }
        return Err(Error::Coded {
            kind: ErrorKind::Value,
            message: format!(
                "{what}: its compiled library defines {} under a name outside C++'s mangling, which the libraries the generated code calls could bind to \
                 (a global variable outside any namespace? make it `static` or put it in a namespace: `namespace k {{ ... }}`; `{first}` may not be defined)",
                list.join(", ")
            ),
        });
    }
    // Every import the empty library lacks, judged by the library that
    // provides it (`imports.rs`); the first of the most telling kind named.
    let refusal = load
        .imports
        .iter()
        // The C runtime's own weak references (`__cxa_finalize`, `__gmon_start__`) are the
        // empty library's; the text's call of the same function is a strong one, judged.
        .filter(|(name, _, weak)| !base.imports.iter().any(|(b, _, w)| b == name && w == weak))
        .filter_map(|(name, file, _)| imports::judge(name, file.as_deref()).err().map(|r| (name, r)))
        .min_by_key(|(_, r)| r.rank());
    if let Some((name, refusal)) = refusal {
        let message = match refusal {
            Refusal::Control(does) => {
                format!(
                    "its compiled library calls `{name}`, which {does}: a kernel's text may not (throw an exception to end a call with an error)"
                )
            }
            Refusal::ExitHook => format!(
                "its compiled library calls `{name}`, which registers code to run when the process or a thread exits: a kernel's text \
                 may not (a `static` or `thread_local` object with a destructor in the text? give it none, or keep it in the caller's memory)"
            ),
            Refusal::NotAllowed(from) => format!(
                "its compiled library calls `{name}` from {from}: a kernel's text may not (docs/compile.md lists what it may call; \
                 `dlbridge.load_inline` compiles C++ of your own that needs more)"
            ),
            Refusal::Unversioned => format!(
                "its compiled library calls `{name}`, which none of the libraries the generated code links provides: a kernel's text may not \
                 (a function the text declares and never defines? or one the process happens to have loaded)"
            ),
        };
        return Err(Error::Coded { kind: ErrorKind::Value, message: format!("{what}: {message}") });
    }
    let extra: Vec<&String> = exports.iter().filter(|e| !allowed.contains(&e.as_str()) && !base_exports.contains(e)).collect();
    if !extra.is_empty() {
        let list: Vec<String> = extra.iter().take(5).map(|e| format!("`{e}`")).collect();
        return Err(refuse(format!("its compiled library exports {} beyond its entry points", list.join(", "))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a library built from `body` (plus the entry point) with
    /// the kernels' flags.
    fn library(c: &Compiler, body: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let (cpp, so) = (dir.path().join("t.cpp"), dir.path().join("t.so"));
        std::fs::write(&cpp, format!("{body}\nextern \"C\" __attribute__((visibility(\"default\"))) void dlbridge_empty(void) {{}}\n"))
            .unwrap();
        c.compile_with(&cpp, &so, "t", &[], &[]).unwrap();
        std::fs::read(&so).unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn code_that_would_run_at_load_is_refused_from_the_elf_file_alone() {
        let c = Compiler::get().expect("a C++ compiler");
        let policy = Policy::Generated { exports: &["dlbridge_empty"] };
        check(c, &library(c, ""), "t", policy).expect("an empty library passes");
        let cases = [
            ("volatile int g; __attribute__((constructor)) static void f() { g = 1; }", "initialiser functions"),
            ("volatile int g; struct S { S() { g = 2; } } s;", "initialiser functions"),
            ("asm(\".section .note.GNU-stack,\\\"x\\\",@progbits\\n.text\");", "executable stack"),
            ("asm(\".pushsection .wtext,\\\"awx\\\",@progbits\\n nop\\n .popsection\");", "both writable and executable"),
            ("extern \"C\" void __gmon_start__(void) {}", "`__gmon_start__`"),
            (
                "extern \"C\" void* dlb_res(void) { return 0; }\nasm(\".type dlb_if, @gnu_indirect_function\\n.set dlb_if, dlb_res\\n.section .data.rel\\n.quad dlb_if\\n.text\");",
                "IFUNC",
            ),
            ("namespace k { __attribute__((visibility(\"default\"))) void extra() {} }", "exports `_ZN1k5extraEv`"),
            ("int dlb_plain = 1;", "defines `dlb_plain` under a name outside C++'s mangling"),
            ("asm(\".globl _setjmp\\n_setjmp: ret\");", "defines `_setjmp` under a name"),
        ];
        for (body, says) in cases {
            let e = check(c, &library(c, body), "t", policy).expect_err(body).to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    /// Whatever the spelling (a pointer taken in a static initialiser of
    /// constants, a glibc alias no token check names), a library importing a
    /// function that leaves its callers or runs code later is refused.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_importing_what_leaves_its_callers_or_runs_later_is_refused() {
        let c = Compiler::get().expect("a C++ compiler");
        let policy = Policy::Generated { exports: &["dlbridge_empty"] };
        let cases = [
            (
                "#include <pthread.h>\nextern \"C\" int __pthread_key_create(pthread_key_t*, void (*)(void*));\nnamespace k { void d(void*) {} int f() { pthread_key_t key; return __pthread_key_create(&key, d); } }",
                "`__pthread_key_create`",
            ),
            (
                "#include <ucontext.h>\nnamespace k { int (*const go)(const ucontext_t*) = setcontext; int f(ucontext_t* u) { return go(u); } }",
                "`setcontext`",
            ),
            ("#include <pthread.h>\nnamespace k { void f() { pthread_exit(nullptr); } }", "`pthread_exit`"),
            ("#include <csignal>\nnamespace k { void h(int) {} void f() { std::signal(SIGUSR1, h); } }", "`signal`"),
            ("#include <unistd.h>\nnamespace k { long f() { return syscall(39); } }", "`syscall`"),
            ("#include <exception>\nnamespace k { void h() {} void f() { std::set_terminate(h); } }", "std::set_terminate"),
            ("#include <new>\nnamespace k { void h() {} void f() { std::set_new_handler(h); } }", "std::set_new_handler"),
            ("#include <signal.h>\nnamespace k { void h(int) {} void f() { ssignal(SIGUSR1, h); } }", "`ssignal`"),
            ("#include <error.h>\nnamespace k { void h() {} void f() { error_print_progname = h; } }", "`error_print_progname`"),
            (
                "#include <printf.h>\nnamespace k { int f() { return register_printf_specifier('Q', nullptr, nullptr); } }",
                "`register_printf_specifier`",
            ),
            (
                "#include <cstdio>\nnamespace k { FILE* f() { return fopencookie(nullptr, \"w\", cookie_io_functions_t{}); } }",
                "`fopencookie`",
            ),
            (
                "#include <unwind.h>\nnamespace k { void f(_Unwind_Exception* e) { _Unwind_Resume_or_Rethrow(e); } }",
                "`_Unwind_Resume_or_Rethrow`",
            ),
            (
                "#include <ctime>\n#include <csignal>\nnamespace k { int f() { timer_t t; return timer_create(CLOCK_REALTIME, nullptr, &t); } }",
                "`timer_create`",
            ),
            ("#include <csetjmp>\nnamespace k { sigjmp_buf b; void f() { siglongjmp(b, 1); } }", "`siglongjmp`"),
        ];
        for (body, says) in cases {
            let e = check(c, &library(c, body), "t", policy).expect_err(body).to_string();
            assert!(e.contains(says) && e.contains("a kernel's text may not"), "{body}: {e}");
        }
    }

    /// The C and C++ a kernel's text commonly uses passes the import check.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_using_math_strings_containers_and_exceptions_passes() {
        let c = Compiler::get().expect("a C++ compiler");
        let policy = Policy::Generated { exports: &["dlbridge_empty"] };
        let body = r#"#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>
namespace k {
std::mutex m;
double f(const char* s, double x, int n) {
    std::lock_guard<std::mutex> g(m);
    std::vector<double> v(static_cast<std::size_t>(n), x);
    std::sort(v.begin(), v.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", std::sin(x) + std::exp(x));
    std::string t(buf);
    std::ostringstream o;
    o << t << std::strlen(s);
    void* p = std::malloc(16);
    std::memset(p, 0, 16);
    std::free(p);
    if (n < 0) throw std::runtime_error(o.str());
    std::complex<double> z(x, 1.0);
    return v.empty() ? std::abs(z * z) : v[0] + std::strtod(s, nullptr);
}
}"#;
        check(c, &library(c, body), "t", policy).expect("common C and C++ passes");
    }

    /// What the C library offers beyond what a kernel's text may call is
    /// refused, naming the function and where it comes from.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_calling_outside_what_kernels_may_call_is_refused() {
        let c = Compiler::get().expect("a C++ compiler");
        let policy = Policy::Generated { exports: &["dlbridge_empty"] };
        let cases = [
            ("#include <cstdlib>\nnamespace k { void f() { std::exit(0); } }", "`exit` from the C library"),
            ("#include <cstdlib>\nnamespace k { int f() { return std::system(\"true\"); } }", "`system` from the C library"),
            ("#include <dlfcn.h>\nnamespace k { void* f() { return dlopen(\"libz.so\", RTLD_NOW); } }", "`dlopen` from the C library"),
            ("#include <sys/mman.h>\nnamespace k { int f(void* p) { return mprotect(p, 4096, 7); } }", "`mprotect` from the C library"),
            ("#include <unistd.h>\nnamespace k { int f() { return fork(); } }", "`fork` from the C library"),
            (
                "#include <pthread.h>\nnamespace k { void* r(void*) { return nullptr; } int f() { pthread_t t; return pthread_create(&t, nullptr, r, nullptr); } }",
                "`pthread_create`, which starts a thread",
            ),
            ("#include <thread>\nnamespace k { void r() {} void f() { std::thread(r).detach(); } }", "(`std::thread`) starts a thread"),
            ("namespace k { int helper(int); int f() { return helper(1); } }", "`_ZN1k6helperEi`, which none of the libraries"),
            (
                "extern \"C\" int PyRun_SimpleString(const char*);\nnamespace k { int f() { return PyRun_SimpleString(\"1\"); } }",
                "`PyRun_SimpleString`, which none",
            ),
            (
                "extern \"C\" void __register_frame(void*);\nnamespace k { void f(void* p) { __register_frame(p); } }",
                "`__register_frame` from the GCC runtime",
            ),
        ];
        for (body, says) in cases {
            let e = check(c, &library(c, body), "t", policy).expect_err(body).to_string();
            assert!(e.contains(says) && e.contains("a kernel's text may not"), "{body}: {e}");
        }
    }

    /// Parts of the C++ runtime that keep the text's code, or work it
    /// registered, to run after the call (at thread exit) are refused, as
    /// is the C library's file access (`/proc/self/mem` writes any memory).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_library_using_runtime_parts_that_run_later_or_open_files_is_refused() {
        let c = Compiler::get().expect("a C++ compiler");
        let policy = Policy::Generated { exports: &["dlbridge_empty"] };
        let cases = [
            (
                "#include <memory_resource>\nnamespace k { void* f() { auto* p = new std::pmr::synchronized_pool_resource(); return p->allocate(16); } }",
                "`_ZNSt3pmr",
            ),
            (
                "#include <future>\nnamespace k { void f() { auto* p = new std::promise<int>; p->set_value_at_thread_exit(1); } }",
                "thread exits",
            ),
            (
                "#include <cstdio>\nnamespace k { std::FILE* f() { return std::fopen(\"/proc/self/mem\", \"r+b\"); } }",
                "`fopen` from the C library",
            ),
            ("#include <fstream>\nnamespace k { void f() { std::ofstream o(\"/tmp/x\"); o << 1; } }", "from the C++ runtime"),
            ("#include <cxxabi.h>\nnamespace k { void f() { abi::__cxa_finalize(nullptr); } }", "runs the exit handlers of every library"),
            (
                "#include <locale>\nnamespace k { struct F : std::numpunct<char> {}; void f() { std::locale l(std::locale::classic(), new F); } }",
                "a locale's facets",
            ),
            (
                "#include <locale>\nnamespace k { void f() { const_cast<std::locale&>(std::locale::classic()) = std::locale(); } }",
                "`std::locale::operator=`",
            ),
        ];
        for (body, says) in cases {
            let e = check(c, &library(c, body), "t", policy).expect_err(body).to_string();
            assert!(e.contains(says) && e.contains("a kernel's text may not"), "{body}: {e}");
        }
    }

    #[test]
    fn the_version_script_keeps_only_the_entry_points() {
        assert_eq!(version_script(&["dlbridge_plugin"]), "{\n  global: dlbridge_plugin;\n  local: *;\n};\n");
    }
}
