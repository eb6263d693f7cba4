#ifndef DLBRIDGE_COMPILE_DIVGUARD_H_
#define DLBRIDGE_COMPILE_DIVGUARD_H_
#include <csetjmp>
#include <stdexcept>
namespace dlbridge_divguard {
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
}  // namespace dlbridge_divguard
extern "C" __attribute__((visibility("hidden"), noreturn, used)) void __ubsan_handle_divrem_overflow_abort(void*, void*, void*) {
  if (dlbridge_divguard::t_jmp != nullptr) std::longjmp(*dlbridge_divguard::t_jmp, 1);
  __builtin_trap();
}
#endif  // DLBRIDGE_COMPILE_DIVGUARD_H_
