#ifndef DLBRIDGE_COMPILE_DIVGUARD_H_
#define DLBRIDGE_COMPILE_DIVGUARD_H_
#include <cinttypes>
#include <cerrno>
#include <cfenv>
#include <csetjmp>
#include <exception>
#include <cstdlib>
#include <stdexcept>
namespace dlbridge_divguard {
/// The thread's floating-point environment (rounding mode, exception flags
/// and traps) and its `errno`, put back as they were when the scope ends:
/// code that calls `fesetround` or `feenableexcept`, or sets `errno`,
/// changes them for its own call only, never for the caller's later
/// arithmetic or another kernel on the thread. `errno` starts at 0, so a
/// call never reads what code before it left there.
struct FloatEnv {
  std::fenv_t saved;
  int saved_errno;
  FloatEnv() : saved_errno(errno) {
    std::fegetenv(&saved);
    errno = 0;
  }
  ~FloatEnv() {
    std::fesetenv(&saved);
    errno = saved_errno;
  }
  FloatEnv(const FloatEnv&) = delete;
  FloatEnv& operator=(const FloatEnv&) = delete;
};
inline thread_local std::jmp_buf* t_jmp = nullptr;
struct Restore {
  std::jmp_buf* prev;
  ~Restore() { t_jmp = prev; }
};
/// Runs f(); an integer division or modulo by zero inside it throws std::domain_error.
template <typename F>
void guarded(F&& f) {
  std::jmp_buf buf;
  Restore restore{t_jmp};
  if (setjmp(buf) != 0) throw std::domain_error("integer division or modulo by zero");
  t_jmp = &buf;
  f();
}
/// Runs f() under the division check and hands back what it threw (null:
/// nothing). The handler that takes the exception ends inside the check too:
/// ending the handler of a foreign (not C++) exception runs its cleanup,
/// which may be a kernel text's code. A foreign exception becomes a
/// std::runtime_error saying so; a division by zero, the check's
/// std::domain_error.
template <typename F>
std::exception_ptr captured(F&& f) noexcept {
  std::exception_ptr out;
  try {
    guarded([&] {
      try {
        f();
      } catch (...) {
        out = std::current_exception();
        if (!out) out = std::make_exception_ptr(std::runtime_error("a foreign (not C++) exception ended its code"));
      }
    });
  } catch (...) {
    out = std::current_exception();
  }
  return out;
}
}  // namespace dlbridge_divguard
extern "C" __attribute__((visibility("hidden"), noreturn, used)) void __ubsan_handle_divrem_overflow_abort(void*, void*, void*) {
  if (dlbridge_divguard::t_jmp != nullptr) std::longjmp(*dlbridge_divguard::t_jmp, 1);
  __builtin_trap();
}
// The C library's own divisions (div, ldiv, lldiv, imaxdiv) are compiled
// without the check: a library is linked with `--wrap` for each
// (DIVGUARD_WRAP), so its calls reach these, whose divisions are checked.
#define DLBRIDGE_CHECKED_DIV(NAME, RESULT, ARG)                                                \
  __attribute__((visibility("hidden"), used)) RESULT __wrap_##NAME(ARG a, ARG b) { \
    RESULT r;                                                                              \
    r.quot = a / b;                                                                        \
    r.rem = a % b;                                                                         \
    return r;                                                                              \
  }
extern "C" {
DLBRIDGE_CHECKED_DIV(div, div_t, int)
DLBRIDGE_CHECKED_DIV(ldiv, ldiv_t, long)
DLBRIDGE_CHECKED_DIV(lldiv, lldiv_t, long long)
DLBRIDGE_CHECKED_DIV(imaxdiv, imaxdiv_t, intmax_t)
}
#undef DLBRIDGE_CHECKED_DIV
#endif  // DLBRIDGE_COMPILE_DIVGUARD_H_
