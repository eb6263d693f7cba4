#ifndef DLBRIDGE_COMPILE_NVRTC_STDINT_CUH_
#define DLBRIDGE_COMPILE_NVRTC_STDINT_CUH_
// <cstdint>'s and <cstddef>'s types, which NVRTC has no header for.
typedef decltype(static_cast<char*>(nullptr) - static_cast<char*>(nullptr)) ptrdiff_t;
typedef decltype(sizeof(0)) size_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif  // DLBRIDGE_COMPILE_NVRTC_STDINT_CUH_
