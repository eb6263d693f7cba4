//! `float16` and `bfloat16`: the element types of f16 (`kDLFloat` 16) and
//! bf16 (`kDLBfloat` 16) tensors in generated kernels, one C++ definition
//! (`include/dlbridge_compile/halfs.h`) that the system compiler (CPU backend)
//! and NVRTC (CUDA backend) both take.
//!
//! Each is a 2-byte storage type (`static_assert`ed) that converts to `float`
//! implicitly and is built from a `float`, a `double` (rounded once, not
//! through float) or anything that converts to float (integers, the other
//! 2-byte type):
//! arithmetic happens in `float`, an expression is evaluated in `float` and
//! rounded once when it is stored (PyTorch's "opmath" for reduced-precision
//! types, as Inductor's fused kernels do; NumPy rounds after every operator).
//! Compound assignment (`+=` ...) and `++`/`--` round after each step.
//! Rounding is to nearest, ties to even; NaN stays NaN (quiet), infinities
//! and signed zeros are kept, f16 subnormals are exact.
//!
//! Conversions: on the CPU f16 goes through the compiler's `_Float16` where
//! it has one (GCC 12+, Clang 15+ on x86-64; F16C instructions under
//! `-march=native`), else — and always on CUDA, and for bf16 — through the
//! bit-level routines below (F. Giesen's round-to-nearest-even conversion).
//! `DLBRIDGE_SOFT_HALF` forces the bit-level routines (the tests compare the
//! two paths over every f16 value).
//!
//! A known sharp edge, the same as CuPy's `float16` class: in `c ? h : 0`
//! with `h` a float16 each operand converts to the other's type, so the
//! compiler calls it ambiguous; write `c ? h : T(0)` or `c ? float(h) : 0.f`.

#[cfg(test)]
mod tests {
    use std::process::Command;

    use crate::builder::toolchain::Compiler;
    use crate::codegen::headers::HALFS_H as HALF_TYPES;

    /// The bit-level routines (`DLBRIDGE_SOFT_HALF`, what CUDA and compilers
    /// without `_Float16` use) against the compiler's own `_Float16`: every
    /// f16 value to float, and to f16 again every f16 value, every midpoint
    /// between neighbours (ties to even), the specials and 2^22 random float
    /// bit patterns. bf16 against a reference written in the test.
    #[test]
    fn the_bit_level_conversions_match_the_compilers_float16_and_round_bf16_to_nearest_even() {
        let Ok(cxx) = Compiler::get() else {
            eprintln!("skipped: no C++ compiler");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let src = format!(
            "#include <cstdint>\n#include <cstdio>\n#include <cstring>\n#include <cmath>\n\
             #define __host__\n#define __device__\n#define __forceinline__ inline\n#define DLBRIDGE_SOFT_HALF 1\n{HALF_TYPES}\n{MAIN}"
        );
        let cpp = dir.path().join("halfs.cpp");
        let exe = dir.path().join("halfs");
        std::fs::write(&cpp, src).unwrap();
        let (prog, pre) = cxx.command.split_first().unwrap();
        let out = Command::new(prog).args(pre).args(["-O2", "-std=c++17", "-o"]).arg(&exe).arg(&cpp).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let run = Command::new(&exe).output().unwrap();
        let text = String::from_utf8_lossy(&run.stdout);
        if text.trim() == "skipped" {
            eprintln!("skipped: {} has no _Float16 to compare with", cxx.version);
            return;
        }
        assert!(run.status.success() && text.contains("checked"), "{text}");
    }

    const MAIN: &str = r#"
static uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static int bad = 0;
static long checked = 0;
#if defined(__FLT16_MAX__)
static void check(float f) {
  _Float16 n = static_cast<_Float16>(f);
  uint16_t want;
  std::memcpy(&want, &n, 2);
  uint16_t got = float16(f).bits;
  bool nan = std::isnan(f);
  bool same = nan ? ((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0 && (got & 0x8000) == (want & 0x8000)) : got == want;
  if (!same && bad++ < 10) std::printf("f16(%a): got %04x want %04x\n", f, got, want);
  ++checked;
}
// bf16 reference: round to nearest even by hand, on the 64-bit value.
static void check_bf16(float f) {
  uint32_t u = bits_of(f);
  uint16_t got = bfloat16(f).bits;
  if (std::isnan(f)) {
    if (!((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0) && bad++ < 10) std::printf("bf16(nan %08x): got %04x\n", u, got);
  } else {
    uint32_t hi = u >> 16, lo = u & 0xffff;
    uint32_t want = hi + (lo > 0x8000 || (lo == 0x8000 && (hi & 1)));
    if (got != static_cast<uint16_t>(want) && bad++ < 10) std::printf("bf16(%a): got %04x want %04x\n", f, got, want);
    float back = bfloat16(f);
    if (bits_of(back) != (static_cast<uint32_t>(got) << 16) && bad++ < 10) std::printf("bf16 back(%04x)\n", got);
  }
  ++checked;
}
int main() {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 n;
    uint16_t b = static_cast<uint16_t>(h);
    std::memcpy(&n, &b, 2);
    float want = static_cast<float>(n), got = dlbridge_f16_to_f32(b);
    if (!(bits_of(want) == bits_of(got) || (std::isnan(want) && std::isnan(got))) && bad++ < 10)
      std::printf("f32(%04x): got %a want %a\n", h, got, want);
    check(want);
    float up = static_cast<float>(static_cast<_Float16>(dlbridge_f16_to_f32(static_cast<uint16_t>(h + 1))));
    if (!std::isnan(want) && !std::isnan(up) && !std::isinf(want)) check((want + up) / 2);  // the midpoint: a tie
  }
  const float specials[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, -1e30f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                            1e-10f, INFINITY, -INFINITY, NAN, -NAN, 3.3895314e38f};
  for (float f : specials) {
    check(f);
    check_bf16(f);
  }
  uint32_t x = 2463534242u;
  for (int k = 0; k < (1 << 22); ++k) {
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    check(float_of(x));
    check_bf16(float_of(x));
  }
  // Doubles: f16 against the compiler's correctly rounded double -> _Float16,
  // bf16 against rounding the 52-bit mantissa to 7 bits by hand (normal range).
  uint64_t y = 88172645463325252ull;
  for (int k = 0; k < (1 << 21); ++k) {
    y ^= y << 13; y ^= y >> 7; y ^= y << 17;
    double d;
    uint64_t b = (y & 0x800fffffffffffffull) | (static_cast<uint64_t>(1023 - 30 + (y >> 52) % 48) << 52);  // |d| in [2^-30, 2^18)
    std::memcpy(&d, &b, 8);
    _Float16 n = static_cast<_Float16>(d);
    uint16_t want;
    std::memcpy(&want, &n, 2);
    if (float16(d).bits != want && bad++ < 10) std::printf("f16(double %a): got %04x want %04x\n", d, float16(d).bits, want);
    uint64_t hi = b >> 45, lo = b & ((1ull << 45) - 1);
    hi += (lo > (1ull << 44) || (lo == (1ull << 44) && (hi & 1)));
    uint64_t rb = hi << 45;
    double r;
    std::memcpy(&r, &rb, 8);
    uint16_t wb = static_cast<uint16_t>(bits_of(static_cast<float>(r)) >> 16);
    if (bfloat16(d).bits != wb && bad++ < 10) std::printf("bf16(double %a): got %04x want %04x\n", d, bfloat16(d).bits, wb);
    checked += 2;
  }
  // The other 2-byte type and integers convert through float.
  if (bfloat16(float16(1.5f)).bits != 0x3fc0 || float16(bfloat16(-2.0f)).bits != 0xc000 || float16(3).bits != 0x4200) ++bad;
  if (bad) return 1;
  std::printf("checked %ld\n", checked);
  return 0;
}
#else
int main() { std::printf("skipped\n"); return 0; }
#endif
"#;
}
