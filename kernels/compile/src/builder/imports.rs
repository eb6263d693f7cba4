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
//!   formatted input and output, conversions, sorting, clocks, locks; never
//!   threads, signals, processes, exits, dynamic loading, memory protection
//!   or system calls;
//! - the math libraries (`libm`, `libmvec`): all of it;
//! - the GCC runtime (`libgcc_s`): its arithmetic helpers and the unwinder
//!   functions exception handling uses ([`GCC_UNWIND`]);
//! - the C++ runtime (`libstdc++`): all but what starts a thread or keeps
//!   the text's code to run later ([`CXX_DENIED`], and [`CONTROL_IMPORTS`]'s
//!   mangled names);
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
const CONTROL_IMPORTS: [(&str, &str); 40] = [
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
];

/// What the C++ runtime offers to start a thread or keep code to run
/// later, by the start of its mangled name (every overload).
const CXX_DENIED: [(&str, &str); 11] = [
    ("_ZSt15set_new_handler", "(`std::set_new_handler`) installs code that any later failed allocation in the process runs"),
    ("_ZSt13set_terminate", "(`std::set_terminate`) installs code that any later `std::terminate` in the process runs"),
    ("_ZSt14set_unexpected", "(`std::set_unexpected`) installs code that the process runs later"),
    ("_ZNSt6thread15_M_start_thread", "(`std::thread`) starts a thread that can run the text's code after the call returned"),
    ("_ZSt16__at_thread_exit", "(`std::__at_thread_exit`) registers code that runs when the thread exits, after the call returned"),
    ("_ZSt25notify_all_at_thread_exit", "(`std::notify_all_at_thread_exit`) registers work that runs when the thread exits"),
    (
        "_ZNSt13__future_base11_State_baseV211_Make_ready",
        "(a `*_at_thread_exit` result of `std::promise`) registers work that runs when the thread exits",
    ),
    (
        "_ZNSt8ios_base17register_callback",
        "(`std::ios_base::register_callback`) registers code that runs when a stream changes or is destroyed, at exit too",
    ),
    ("_ZNSt6locale6global", "(`std::locale::global`) changes the locale of all the process's later code"),
    (
        "_ZNSt3pmr20set_default_resource",
        "(`std::pmr::set_default_resource`) installs code that any later allocation through the default resource runs",
    ),
    ("_ZNSt8ios_base15sync_with_stdio", "(`std::ios_base::sync_with_stdio`) changes how all the process's later standard streams work"),
];

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
    // Formatted input and output, streams.
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
    "dprintf",
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
    "fopen",
    "fclose",
    "fread",
    "fgets",
    "fgetc",
    "getc",
    "fseek",
    "ftell",
    "rewind",
    "feof",
    "ferror",
    "clearerr",
    "fileno",
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
    // Run by the C runtime's own code (compared with the empty library's).
    "__cxa_finalize",
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
        "libstdc++" => Ok(()),
        "libgcc_s" if GCC_UNWIND.contains(&name) || gcc_helper(name) => Ok(()),
        "libgcc_s" => {
            Err(Refusal::NotAllowed("the GCC runtime (`libgcc_s`), beyond its arithmetic helpers and the unwinding exceptions use".into()))
        }
        "libc" | "libpthread" | "librt" | "libdl" if C_LIBRARY.contains(&plain(name)) => Ok(()),
        s if s.starts_with("ld-linux") && C_LIBRARY.contains(&plain(name)) => Ok(()),
        "libc" | "libpthread" | "librt" | "libdl" => Err(Refusal::NotAllowed(format!(
            "the C library (`{file}`), whose functions a kernel's text may use are its math, memory and string functions, allocation, \
             formatted input and output, conversions, sorting, clocks and locks"
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
        assert_eq!(judge("_ZNSt13runtime_errorC1EPKc", Some("libstdc++.so.6")), Ok(()));
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
