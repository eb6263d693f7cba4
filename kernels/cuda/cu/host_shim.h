// Host (CPU) emulation of the CUDA features the dlbridge kernels use; only for host_test.cpp.
// Host emulation of the CUDA features used by the dlbridge kernels.
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <barrier>
#include <vector>
#include <functional>
#define DLB_HOST_TEST 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
inline _Float16 dlb_host_bits_to_half(unsigned short h) { _Float16 f; memcpy(&f, &h, 2); return f; }
inline unsigned short dlb_host_half_to_bits(_Float16 f) { unsigned short h; memcpy(&h, &f, 2); return h; }
using std::erf; using std::exp; using std::fmax;
inline float __frcp_rn(float x) { return 1.0f / x; }
// Atomics on host memory, through std::atomic_ref (C++20).
#include <atomic>
inline unsigned int atomicCAS(unsigned int* p, unsigned int compare, unsigned int value) {
    std::atomic_ref<unsigned int>(*p).compare_exchange_strong(compare, value);
    return compare;  // the old value either way
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }
inline double __drcp_rn(double x) { return 1.0 / x; }
// per-block emulation state
static std::barrier<>* g_block_bar;
static std::barrier<>* g_warp_bar[32];
static unsigned long long g_shfl[32][32];
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long b = 0; memcpy(&b, &v, sizeof(T));
    g_shfl[w][lane] = b;
    g_warp_bar[w]->arrive_and_wait();
    b = g_shfl[w][lane ^ o];
    g_warp_bar[w]->arrive_and_wait();
    T r; memcpy(&r, &b, sizeof(T)); return r;
}
inline void launch(unsigned grid, unsigned block, const std::function<void()>& k) {
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> bb(block); g_block_bar = &bb;
        for (unsigned w = 0; w < (block + 31) / 32; ++w) { g_warp_bar[w] = new std::barrier<>(32); }
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; ++t) ts.emplace_back([=, &k] {
            threadIdx.x = t; blockIdx.x = b; blockDim.x = block; gridDim.x = grid; k(); });
        for (auto& t : ts) t.join();
        for (unsigned w = 0; w < (block + 31) / 32; ++w) delete g_warp_bar[w];
    }
}
