#ifndef DLBRIDGE_COMPILE_LIBMVEC_H_
#define DLBRIDGE_COMPILE_LIBMVEC_H_
// Vector variants of libm functions (glibc's libmvec: at most 4 ulp, glibc's
// documented bound for them): with these declarations the compiler vectorises
// loops that call tanh, exp, erf, ... instead of calling the scalar function
// per element. Only when the toolchain found libmvec (it then defines
// DLBRIDGE_LIBMVEC and links -lmvec). Each pragma is on its own line before
// its own declaration (GCC misattributes several `_Pragma`s on one line).
#if defined(DLBRIDGE_LIBMVEC)
extern "C" {
#pragma omp declare simd notinbranch
double sin(double);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
double cos(double);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
double tan(double);
#pragma omp declare simd notinbranch
float tanf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
double asin(double);
#pragma omp declare simd notinbranch
float asinf(float);
#pragma omp declare simd notinbranch
double acos(double);
#pragma omp declare simd notinbranch
float acosf(float);
#pragma omp declare simd notinbranch
double atan(double);
#pragma omp declare simd notinbranch
float atanf(float);
#pragma omp declare simd notinbranch
double sinh(double);
#pragma omp declare simd notinbranch
float sinhf(float);
#pragma omp declare simd notinbranch
double cosh(double);
#pragma omp declare simd notinbranch
float coshf(float);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
double asinh(double);
#pragma omp declare simd notinbranch
float asinhf(float);
#pragma omp declare simd notinbranch
double acosh(double);
#pragma omp declare simd notinbranch
float acoshf(float);
#pragma omp declare simd notinbranch
double atanh(double);
#pragma omp declare simd notinbranch
float atanhf(float);
#pragma omp declare simd notinbranch
double erf(double);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
double erfc(double);
#pragma omp declare simd notinbranch
float erfcf(float);
#pragma omp declare simd notinbranch
double expm1(double);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
double log1p(double);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
double log2(double);
#pragma omp declare simd notinbranch
float log2f(float);
#pragma omp declare simd notinbranch
double log10(double);
#pragma omp declare simd notinbranch
float log10f(float);
#pragma omp declare simd notinbranch
double exp2(double);
#pragma omp declare simd notinbranch
float exp2f(float);
#pragma omp declare simd notinbranch
double exp10(double);
#pragma omp declare simd notinbranch
float exp10f(float);
#pragma omp declare simd notinbranch
double cbrt(double);
#pragma omp declare simd notinbranch
float cbrtf(float);
#pragma omp declare simd notinbranch
double pow(double, double);
#pragma omp declare simd notinbranch
float powf(float, float);
#pragma omp declare simd notinbranch
double atan2(double, double);
#pragma omp declare simd notinbranch
float atan2f(float, float);
#pragma omp declare simd notinbranch
double hypot(double, double);
#pragma omp declare simd notinbranch
float hypotf(float, float);
}
#endif
#endif  // DLBRIDGE_COMPILE_LIBMVEC_H_
