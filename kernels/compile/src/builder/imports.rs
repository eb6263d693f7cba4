//! What a library generated from a kernel's text may call.
//!
//! A generated library's imports are judged by the library that provides
//! each one, as its ELF symbol versions name it (`memcpy@GLIBC_2.14` comes
//! from `libc.so.6`), so a spelling the fragment checks never saw (a
//! function pointer, a macro, a glibc alias) is judged by what the compiled
//! code really calls:
//!
//! - the C library (and the dynamic loader): only the functions of
//!   [`C_LIBRARY`], those that return to their caller and keep none of the
//!   text's code to run later: math, memory and strings, allocation,
//!   formatted output and input on the standard streams, conversions,
//!   sorting, clocks, locks; never files, threads, signals, processes, exits,
//!   dynamic loading, memory protection or system calls;
//! - the math libraries (`libm`, `libmvec`): all of it;
//! - the GCC runtime (`libgcc_s`): its arithmetic helpers and the unwinder
//!   functions exception handling uses ([`GCC_UNWIND`]);
//! - the C++ runtime (`libstdc++`): only the parts of [`CXX_RUNTIME`]
//!   (exceptions, allocation, strings, containers' helpers, ...), less
//!   what of them keeps code to run later ([`CXX_DENIED`]);
//! - no other library, and no symbol without a version (what the text
//!   declares and never defines, or what the process happens to have
//!   loaded).

/// What C and C++ call to run code at exit: `static` and `thread_local`
/// objects with destructors register theirs through the first three.
pub(crate) const EXIT_HOOKS: [&str; 6] =
    ["__cxa_atexit", "__cxa_thread_atexit", "__cxa_thread_atexit_impl", "atexit", "at_quick_exit", "on_exit"];

/// What the C library offers to leave a function past its callers, end a
/// thread in the middle of a call, or run code later, outside any call,
/// each with what it would do: named in the error, ahead of the general
/// rule that they are not in [`C_LIBRARY`].
///
/// `longjmp` (and its fortified `__longjmp_chk`) is not among them: the
/// division check's handler calls it (`divguard.h`); the text's own use of it
/// is refused by name, after preprocessing (`fragments.rs`).
const CONTROL_IMPORTS: [(&str, &str); 41] = [
    ("_longjmp", "jumps out of its function past the generated code that called it"),
    ("siglongjmp", "jumps out of its function past the generated code that called it"),
    ("setcontext", "switches to another execution context, past the generated code that called it"),
    ("swapcontext", "switches to another execution context, past the generated code that called it"),
    ("makecontext", "makes an execution context to switch to, past the generated code"),
    ("_Unwind_ForcedUnwind", "unwinds the stack past the generated code that called it"),
    ("_Unwind_RaiseException", "unwinds the stack past the generated code's exception handling"),
    ("pthread_exit", "ends the calling thread in the middle of a call"),
    ("thrd_exit", "ends the calling thread in the middle of a call"),
    ("pthread_cancel", "cancels a thread in the middle of a call"),
    ("pthread_key_create", "registers a destructor that runs when a thread exits, after the call returned"),
    ("tss_create", "registers a destructor that runs when a thread exits, after the call returned"),
    ("__pthread_key_create", "registers a destructor that runs when a thread exits, after the call returned"),
    ("pthread_atfork", "registers code that runs when the process forks"),
    ("signal", "installs a signal handler: code that runs later, outside any call"),
    ("sigaction", "installs a signal handler: code that runs later, outside any call"),
    ("__sigaction", "installs a signal handler: code that runs later, outside any call"),
    ("bsd_signal", "installs a signal handler: code that runs later, outside any call"),
    ("sysv_signal", "installs a signal handler: code that runs later, outside any call"),
    ("__sysv_signal", "installs a signal handler: code that runs later, outside any call"),
    ("sigset", "installs a signal handler: code that runs later, outside any call"),
    ("syscall", "makes raw system calls (a signal handler, a thread of its own) that no check of the library sees"),
    ("ssignal", "installs a signal handler: code that runs later, outside any call"),
    ("sigvec", "installs a signal handler: code that runs later, outside any call"),
    ("_Unwind_Resume_or_Rethrow", "raises an exception of its own making past the generated code's exception handling"),
    ("register_printf_specifier", "registers code that every later `printf` in the process runs"),
    ("register_printf_function", "registers code that every later `printf` in the process runs"),
    ("register_printf_modifier", "registers code that every later `printf` in the process runs"),
    ("register_printf_type", "registers code that every later `printf` in the process runs"),
    ("fopencookie", "makes a stream whose functions run whenever it is used or flushed, at exit too"),
    ("error_print_progname", "is a hook the C library's `error` calls, later, outside any call"),
    ("timer_create", "can run code on a thread the C library starts, after the call"),
    ("mq_notify", "can run code on a thread the C library starts, after the call"),
    ("lio_listio", "can run code on a thread the C library starts, after the call"),
    ("aio_read", "can run code on a thread the C library starts, after the call"),
    ("aio_write", "can run code on a thread the C library starts, after the call"),
    ("aio_fsync", "can run code on a thread the C library starts, after the call"),
    ("getaddrinfo_a", "can run code on a thread the C library starts, after the call"),
    ("pthread_create", "starts a thread that can run the text's code after the call returned"),
    ("thrd_create", "starts a thread that can run the text's code after the call returned"),
    ("__cxa_finalize", "runs the exit handlers of every library in the process, in the middle of a call"),
];

/// What the C++ runtime offers to start a thread or keep code to run
/// later, by the start of its mangled name (every overload).
const CXX_DENIED: [(&str, &str); 13] = [
    ("_ZSt15set_new_handler", "(`std::set_new_handler`) installs code that any later failed allocation in the process runs"),
    ("_ZSt13set_terminate", "(`std::set_terminate`) installs code that any later `std::terminate` in the process runs"),
    ("_ZSt14set_unexpected", "(`std::set_unexpected`) installs code that the process runs later"),
    ("_ZNSt6thread15_M_start_thread", "(`std::thread`) starts a thread that can run the text's code after the call returned"),
    ("_ZSt16__at_thread_exit", "(`std::__at_thread_exit`) registers code that runs when the thread exits, after the call returned"),
    ("_ZSt25notify_all_at_thread_exit", "(`std::notify_all_at_thread_exit`) registers work that runs when the thread exits"),
    (
        "_ZNSt13__future_base13_State_baseV211_Make_ready",
        "(a `*_at_thread_exit` result of `std::promise`) registers work that runs when the thread exits",
    ),
    (
        "_ZNSt8ios_base17register_callback",
        "(`std::ios_base::register_callback`) registers code that runs when a stream changes or is destroyed, at exit too",
    ),
    ("_ZNSt6locale6global", "(`std::locale::global`) changes the locale of all the process's later code"),
    (
        "_ZNSt6locale5_Impl",
        "(a locale's facets, installed or replaced) puts the text's own facet, code that runs whenever anything formats through that locale, into a locale other code may use",
    ),
    ("_ZNSt6localeaSE", "(`std::locale::operator=`) replaces a locale other code may use (`std::locale::classic()`)"),
    (
        "_ZNSt3pmr20set_default_resource",
        "(`std::pmr::set_default_resource`) installs code that any later allocation through the default resource runs",
    ),
    ("_ZNSt8ios_base15sync_with_stdio", "(`std::ios_base::sync_with_stdio`) changes how all the process's later standard streams work"),
];

/// What of the C++ runtime a kernel's text may use, by the start of the
/// entity's mangled name once its kind is taken off ([`cxx_entity`]):
/// exceptions and what throws them, allocation, strings and string streams,
/// the standard streams' and locales' machinery, containers' out-of-line
/// helpers, hashing, clocks, `std::call_once`, condition variables and
/// random devices. Never threads, memory resources (`std::pmr`, whose pools
/// keep the text's code to run at thread exit), futures, file streams or
/// the file system.
const CXX_RUNTIME: &[&str] = &[
    // Exceptions, what throws them, `std::terminate`.
    "St9exception",
    "St13bad_exception",
    "St9bad_alloc",
    "St20bad_array_new_length",
    "St8bad_cast",
    "St10bad_typeid",
    "St17bad_function_call",
    "St18bad_variant_access",
    "St19bad_optional_access",
    "St13runtime_error",
    "St11logic_error",
    "St12domain_error",
    "St16invalid_argument",
    "St12length_error",
    "St12out_of_range",
    "St11range_error",
    "St14overflow_error",
    "St15underflow_error",
    "St12system_error",
    "St3_V215system_category",
    "St3_V216generic_category",
    "St14error_category",
    "St15__exception_ptr",
    "St17current_exception",
    "St17rethrow_exception",
    "St18uncaught_exception",
    "St19uncaught_exceptions",
    "St9terminate",
    "St21__glibcxx_assert_fail",
    "10__cxxabiv1",
    "St7nothrow",
    "St16nested_exception",
    "St8to_chars",
    "St10from_chars",
    // Strings, string streams, the streams' and locales' machinery.
    "St7__cxx11",
    "St12__sso_string",
    "Ss",
    "Sa",
    "So",
    "Si",
    "Sd",
    "St9basic_ios",
    "St13basic_ostream",
    "St13basic_istream",
    "St14basic_iostream",
    "St15basic_streambuf",
    "St8ios_base",
    "St6locale",
    "St5ctype",
    "St7num_put",
    "St7num_get",
    "St8numpunct",
    "St7codecvt",
    "St16__ostream_insert",
    "St9use_facet",
    "St9has_facet",
    "St11char_traits",
    // Containers' out-of-line helpers, hashing.
    "St8__detail",
    "St18_Rb_tree_increment",
    "St18_Rb_tree_decrement",
    "St29_Rb_tree_insert_and_rebalance",
    "St28_Rb_tree_rebalance_for_erase",
    "St11_Hash_bytes",
    "St15_Fnv_hash_bytes",
    // Clocks, `std::call_once`, condition variables, random devices.
    "St6chrono",
    "St11__once_call",
    "St15__once_callable",
    "St18condition_variable",
    "St13random_device",
    "St6thread20hardware_concurrency",
    // Reference counts of the strings and locales.
    "9__gnu_cxx12__atomic_add",
    "9__gnu_cxx18__exchange_and_add",
];

/// Unmangled functions of the C++ runtime a kernel's text may use: the
/// exception ABI's (its `__cxa_atexit` family is judged as an exit hook
/// first), the personality routine, `dynamic_cast`, `std::call_once`'s
/// trampoline.
const CXX_PLAIN: [&str; 4] = ["__gxx_personality_v0", "__dynamic_cast", "__once_proxy", "__cxa_"];

/// `name`'s entity: a mangled name without `_Z`, a thunk's offsets, the
/// special name's kind (`TV` vtable, `TI` type info, `TS` its name, `TT`
/// VTT), the nested-name `N` and member qualifiers. `_ZNKSt9exception4whatEv`
/// is `St9exception4whatEv`; `_ZTVN10__cxxabiv117__class_type_infoE` is
/// `10__cxxabiv117__class_type_infoE`.
fn cxx_entity(name: &str) -> Option<&str> {
    let mut rest = name.strip_prefix("_Z")?;
    // Thunks: `Th` + offset `_`, `Tv` + offset `_` + virtual offset `_`, `Tc` (covariant).
    for (kind, parts) in [("Th", 1), ("Tv", 2), ("Tc", 2)] {
        if let Some(r) = rest.strip_prefix(kind) {
            let mut r = r;
            for _ in 0..parts {
                r = r.split_once('_')?.1;
            }
            rest = r;
        }
    }
    for kind in ["TV", "TI", "TS", "TT"] {
        if let Some(r) = rest.strip_prefix(kind) {
            rest = r;
            break;
        }
    }
    rest = rest.strip_prefix('N').unwrap_or(rest);
    Some(rest.trim_start_matches(['K', 'V', 'r']))
}

/// Whether the C++ runtime's `name` is among what a kernel's text may use
/// ([`CXX_RUNTIME`], [`CXX_PLAIN`], `std::__throw_*`, `operator new` and
/// `delete`, the type information of the fundamental types).
fn cxx_allowed(name: &str) -> bool {
    if CXX_PLAIN.iter().any(|p| if p.ends_with('_') { name.starts_with(p) } else { name == *p }) {
        return true;
    }
    // `operator new`, `new[]`, `delete`, `delete[]` (every overload).
    if ["_Znw", "_Zna", "_Zdl", "_Zda"].iter().any(|p| name.starts_with(p)) {
        return true;
    }
    let Some(entity) = cxx_entity(name) else { return false };
    // `std::__throw_length_error` and its kin: `St` + length + `__throw_`.
    if let Some(r) = entity.strip_prefix("St") {
        let digits = r.len() - r.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && r[digits..].starts_with("__throw_") {
            return true;
        }
    }
    // The type information of a fundamental type or a pointer to one (`_ZTIi`, `_ZTIPKc`).
    if (name.starts_with("_ZTI") || name.starts_with("_ZTS")) && entity.trim_start_matches(['P', 'K', 'V', 'r']).len() <= 2 {
        return true;
    }
    CXX_RUNTIME.iter().any(|p| entity.starts_with(p))
}

/// The C library's functions (and data) a kernel's text may use: each
/// returns to its caller and keeps none of the text's code or memory to use
/// after the call. Fortified (`__printf_chk`) and ISO-renamed
/// (`__isoc23_strtol`) spellings are judged by the function they stand for.
const C_LIBRARY: &[&str] = &[
    // Memory and strings.
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "memchr",
    "memrchr",
    "mempcpy",
    "memmem",
    "bzero",
    "bcopy",
    "explicit_bzero",
    "strlen",
    "strnlen",
    "strcmp",
    "strncmp",
    "strcasecmp",
    "strncasecmp",
    "strcpy",
    "strncpy",
    "stpcpy",
    "stpncpy",
    "strcat",
    "strncat",
    "strchr",
    "strrchr",
    "strchrnul",
    "strstr",
    "strcasestr",
    "strspn",
    "strcspn",
    "strpbrk",
    "strtok",
    "strtok_r",
    "strdup",
    "strndup",
    "strcoll",
    "strxfrm",
    "strerror",
    "strerror_r",
    "__xpg_strerror_r",
    "wcslen",
    "wcscmp",
    "wcsncmp",
    "wcscpy",
    "wcsncpy",
    "wcschr",
    "wmemcpy",
    "wmemmove",
    "wmemset",
    "wmemcmp",
    "wmemchr",
    // Allocation.
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "memalign",
    "valloc",
    "malloc_usable_size",
    // Formatted input and output on the standard streams (no files: a file
    // such as `/proc/self/mem` writes any of the process's memory).
    "printf",
    "fprintf",
    "sprintf",
    "snprintf",
    "vprintf",
    "vfprintf",
    "vsprintf",
    "vsnprintf",
    "asprintf",
    "vasprintf",
    "puts",
    "fputs",
    "putchar",
    "fputc",
    "putc",
    "fwrite",
    "fflush",
    "perror",
    "sscanf",
    "vsscanf",
    "fscanf",
    "fgets",
    "fgetc",
    "getc",
    "feof",
    "ferror",
    "clearerr",
    "stdout",
    "stderr",
    "stdin",
    // Conversions and character classes.
    "strtol",
    "strtoul",
    "strtoll",
    "strtoull",
    "strtod",
    "strtof",
    "strtold",
    "strtoimax",
    "strtoumax",
    "atoi",
    "atol",
    "atoll",
    "atof",
    "isalnum",
    "isalpha",
    "isdigit",
    "isspace",
    "isupper",
    "islower",
    "isxdigit",
    "ispunct",
    "isprint",
    "toupper",
    "tolower",
    "__ctype_b_loc",
    "__ctype_tolower_loc",
    "__ctype_toupper_loc",
    // Sorting and searching (their comparison runs inside the call).
    "qsort",
    "qsort_r",
    "bsearch",
    // The math the C library itself holds.
    "abs",
    "labs",
    "llabs",
    "imaxabs",
    "div",
    "ldiv",
    "lldiv",
    "imaxdiv",
    "frexp",
    "frexpf",
    "frexpl",
    "ldexp",
    "ldexpf",
    "ldexpl",
    "modf",
    "modff",
    "modfl",
    "scalbn",
    "scalbnf",
    "scalbnl",
    "copysign",
    "copysignf",
    "copysignl",
    "isinf",
    "isinff",
    "isnan",
    "isnanf",
    "finite",
    "finitef",
    "__isinf",
    "__isinff",
    "__isnan",
    "__isnanf",
    "__finite",
    "__finitef",
    "__signbit",
    "__signbitf",
    // Random numbers, clocks, the process's own facts.
    "rand",
    "srand",
    "rand_r",
    "random",
    "srandom",
    "drand48",
    "erand48",
    "lrand48",
    "nrand48",
    "mrand48",
    "jrand48",
    "srand48",
    "getrandom",
    "time",
    "clock",
    "clock_gettime",
    "gettimeofday",
    "nanosleep",
    "usleep",
    "getpid",
    "gettid",
    "getenv",
    "secure_getenv",
    "sysconf",
    "sched_yield",
    "sched_getcpu",
    "get_nprocs",
    "get_nprocs_conf",
    "__errno_location",
    // Locks (a lock held past the call is the caller's deadlock, not code run later).
    "pthread_mutex_init",
    "pthread_mutex_destroy",
    "pthread_mutex_lock",
    "pthread_mutex_trylock",
    "pthread_mutex_unlock",
    "pthread_mutex_timedlock",
    "pthread_mutex_clocklock",
    "pthread_once",
    "pthread_self",
    "pthread_equal",
    "pthread_spin_init",
    "pthread_spin_destroy",
    "pthread_spin_lock",
    "pthread_spin_trylock",
    "pthread_spin_unlock",
    "pthread_rwlock_init",
    "pthread_rwlock_destroy",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_tryrdlock",
    "pthread_rwlock_trywrlock",
    "pthread_rwlock_unlock",
    "pthread_cond_init",
    "pthread_cond_destroy",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "pthread_cond_signal",
    "pthread_cond_broadcast",
    "__libc_single_threaded",
    // What failing checks call: they end the process loudly.
    "__assert_fail",
    "abort",
    "__stack_chk_fail",
    "__chk_fail",
    // The generated code's own runtime: `setjmp`/`longjmp` of the division
    // check (the text's own use is refused by name), thread-local storage.
    "_setjmp",
    "setjmp",
    "__sigsetjmp",
    "longjmp",
    "__longjmp_chk",
    "__tls_get_addr",
];

/// What the GCC runtime's unwinder offers that exception handling uses
/// inside a call (the rest of its functions are arithmetic helpers named
/// `__<op><mode><n>`, such as `__muldc3`).
const GCC_UNWIND: [&str; 8] = [
    "_Unwind_Resume",
    "_Unwind_DeleteException",
    "_Unwind_Backtrace",
    "_Unwind_GetIP",
    "_Unwind_GetIPInfo",
    "_Unwind_GetCFA",
    "_Unwind_GetRegionStart",
    "_Unwind_GetLanguageSpecificData",
];

/// Why a generated library may not import a symbol.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It leaves its callers, ends a thread or keeps code to run later:
    /// what it would do.
    Control(&'static str),
    /// It registers code to run at exit ([`EXIT_HOOKS`]).
    ExitHook,
    /// It is not among what the library that provides it may be asked for
    /// (the library's description).
    NotAllowed(String),
    /// No library the generated code links provides it.
    Unversioned,
}

impl Refusal {
    /// Which refusal is reported first when a library has several.
    pub(crate) fn rank(&self) -> u8 {
        match self {
            Refusal::Control(_) => 0,
            Refusal::ExitHook => 1,
            Refusal::NotAllowed(_) => 2,
            Refusal::Unversioned => 3,
        }
    }
}

/// `name` as the function it stands for: `__printf_chk` is `printf`,
/// `__isoc23_strtol` is `strtol`.
fn plain(name: &str) -> &str {
    let name = name.strip_prefix("__isoc99_").or_else(|| name.strip_prefix("__isoc23_")).unwrap_or(name);
    match name.strip_prefix("__").and_then(|n| n.strip_suffix("_chk")) {
        Some(n) if !n.is_empty() => n,
        _ => name,
    }
}

/// Whether `name` is one of the GCC runtime's arithmetic helpers
/// (`__muldc3`, `__divti3`, `__truncdfhf2`, `__popcountdi2`).
fn gcc_helper(name: &str) -> bool {
    name.strip_prefix("__").is_some_and(|n| {
        n.len() > 1 && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) && n.ends_with(|c: char| c.is_ascii_digit())
    })
}

/// Judges an import of a generated library: `name`, provided by the library
/// file `file` its version names (`None`: it has no version).
pub(crate) fn judge(name: &str, file: Option<&str>) -> Result<(), Refusal> {
    if let Some((_, why)) = CONTROL_IMPORTS.iter().find(|(c, _)| *c == name) {
        return Err(Refusal::Control(why));
    }
    if let Some((_, why)) = CXX_DENIED.iter().find(|(p, _)| name.starts_with(p)) {
        return Err(Refusal::Control(why));
    }
    if EXIT_HOOKS.contains(&name) {
        return Err(Refusal::ExitHook);
    }
    let Some(file) = file else { return Err(Refusal::Unversioned) };
    let stem = file.split(".so").next().unwrap_or(file);
    match stem {
        "libm" | "libmvec" => Ok(()),
        "libstdc++" if cxx_allowed(name) => Ok(()),
        "libstdc++" => Err(Refusal::NotAllowed(format!(
            "the C++ runtime (`{file}`), whose parts a kernel's text may use are its exceptions, allocation, strings and string streams, \
             containers' helpers, hashing, clocks, `std::call_once` and condition variables (not threads, `std::pmr` memory resources, \
             futures, file streams or the file system)"
        ))),
        "libgcc_s" if GCC_UNWIND.contains(&name) || gcc_helper(name) => Ok(()),
        "libgcc_s" => {
            Err(Refusal::NotAllowed("the GCC runtime (`libgcc_s`), beyond its arithmetic helpers and the unwinding exceptions use".into()))
        }
        "libc" | "libpthread" | "librt" | "libdl" if C_LIBRARY.contains(&plain(name)) => Ok(()),
        s if s.starts_with("ld-linux") && C_LIBRARY.contains(&plain(name)) => Ok(()),
        "libc" | "libpthread" | "librt" | "libdl" => Err(Refusal::NotAllowed(format!(
            "the C library (`{file}`), whose functions a kernel's text may use are its math, memory and string functions, allocation, \
             formatted output and input on the standard streams, conversions, sorting, clocks and locks (no files)"
        ))),
        s if s.starts_with("ld-linux") => Err(Refusal::NotAllowed(format!("the dynamic loader (`{file}`)"))),
        _ => Err(Refusal::NotAllowed(format!("`{file}`, a library the generated code does not link"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_are_judged_by_the_library_that_provides_them() {
        assert_eq!(judge("memcpy", Some("libc.so.6")), Ok(()));
        assert_eq!(judge("__vsnprintf_chk", Some("libc.so.6")), Ok(()));
        assert_eq!(judge("__isoc23_strtol", Some("libc.so.6")), Ok(()));
        assert_eq!(judge("__tls_get_addr", Some("ld-linux-x86-64.so.2")), Ok(()));
        assert_eq!(judge("_ZGVdN4v_exp", Some("libmvec.so.1")), Ok(()));
        assert_eq!(judge("feenableexcept", Some("libm.so.6")), Ok(()));
        assert_eq!(judge("__muldc3", Some("libgcc_s.so.1")), Ok(()));
        assert_eq!(judge("_Unwind_Resume", Some("libgcc_s.so.1")), Ok(()));
        for name in [
            "_ZNSt13runtime_errorC1EPKc",
            "_ZNKSt9exception4whatEv",
            "_ZTVN10__cxxabiv117__class_type_infoE",
            "_ZTIi",
            "_ZTIPKc",
            "_ZSt20__throw_length_errorPKc",
            "_Znwm",
            "_ZdlPvm",
            "__cxa_begin_catch",
            "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm",
            "_ZThn16_NSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEED1Ev",
            "_ZNSo9_M_insertIdEERSoT_",
            "_ZNSt6chrono3_V212steady_clock3nowEv",
        ] {
            assert_eq!(judge(name, Some("libstdc++.so.6")), Ok(()), "{name}");
        }
        for name in [
            "_ZNSt3pmr26synchronized_pool_resourceC1ERKNS_12pool_optionsEPNS_15memory_resourceE",
            "_ZTVNSt3pmr26synchronized_pool_resourceE",
            "_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode",
            "_ZNSt10filesystem6removeERKNS_7__cxx114pathE",
            "_ZN9__gnu_cxx27__verbose_terminate_handlerEv",
        ] {
            assert!(matches!(judge(name, Some("libstdc++.so.6")), Err(Refusal::NotAllowed(_))), "{name}");
        }
        assert!(matches!(
            judge("_ZNSt13__future_base13_State_baseV211_Make_ready6_M_setEv", Some("libstdc++.so.6")),
            Err(Refusal::Control(_))
        ));
        assert!(matches!(judge("fopen", Some("libc.so.6")), Err(Refusal::NotAllowed(_))));
        for (name, file) in [("dlopen", "libc.so.6"), ("exit", "libc.so.6"), ("mprotect", "libc.so.6"), ("__exit_chk", "libc.so.6")] {
            assert!(matches!(judge(name, Some(file)), Err(Refusal::NotAllowed(_))), "{name}");
        }
        assert!(matches!(judge("__register_frame", Some("libgcc_s.so.1")), Err(Refusal::NotAllowed(_))));
        assert!(matches!(judge("_Unwind_SetIP", Some("libgcc_s.so.1")), Err(Refusal::NotAllowed(_))));
        assert!(matches!(judge("pthread_create", Some("libc.so.6")), Err(Refusal::Control(_))));
        assert!(matches!(
            judge("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE", Some("libstdc++.so.6")),
            Err(Refusal::Control(_))
        ));
        assert_eq!(judge("__cxa_thread_atexit", Some("libstdc++.so.6")), Err(Refusal::ExitHook));
        assert_eq!(judge("PyRun_SimpleString", None), Err(Refusal::Unversioned));
        assert!(matches!(judge("cudaMalloc", Some("libcudart.so.12")), Err(Refusal::NotAllowed(_))));
    }

    #[test]
    fn fortified_and_renamed_spellings_stand_for_their_function() {
        assert_eq!(plain("__printf_chk"), "printf");
        assert_eq!(plain("__isoc99_sscanf"), "sscanf");
        assert_eq!(plain("__chk_fail"), "__chk_fail");
        assert_eq!(plain("__stack_chk_fail"), "__stack_chk_fail");
        assert!(gcc_helper("__truncdfhf2") && gcc_helper("__popcountdi2") && !gcc_helper("__register_frame") && !gcc_helper("__"));
    }
}
