// Host (CPU) emulation of the CUDA features the dlbridge kernels use, for host_test.cpp and
// the generated kernels' tests (kernels/compile/tests/cuda_host_emulation.rs).
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
// Per-block emulation: each CUDA thread of a block is a fiber (ucontext) of one
// OS thread, run round-robin; a fiber runs until it waits at a barrier
// (`__syncthreads`, a warp shuffle's exchange), which releases once every
// fiber it waits for has arrived. Only the order of the threads' steps between
// barriers is the emulation's (in order of threadIdx, warps interleaved at
// each barrier), as on a GPU it is the scheduler's; no OS thread per CUDA
// thread, so a block of 1024 threads costs microseconds to start.
#include <memory>
#include <ucontext.h>
struct DlbFiber { ucontext_t ctx; std::unique_ptr<char[]> stack; bool done = false; };
static std::vector<DlbFiber>* g_fibers;
static unsigned g_current;
static ucontext_t g_scheduler;
static unsigned g_block_arrived; static unsigned long long g_block_gen;
static unsigned g_warp_arrived[32]; static unsigned long long g_warp_gen[32];
static unsigned long long g_shfl[32][32];
// Runs the next fiber that has not finished; back here, this fiber's CUDA indices again.
inline void dlb_yield() {
    unsigned me = g_current, n = (unsigned)g_fibers->size(), next = me;
    do { next = (next + 1) % n; } while ((*g_fibers)[next].done && next != me);
    if (next == me) {
        // Every other thread of the block has returned: this barrier can never release.
        fprintf(stderr, "thread %u of block %u waits at a barrier the block's other threads left\n", me, blockIdx.x);
        abort();
    }
    g_current = next;
    threadIdx.x = next;
    swapcontext(&(*g_fibers)[me].ctx, &(*g_fibers)[next].ctx);
    threadIdx.x = me;
}
inline void dlb_wait(unsigned& arrived, unsigned long long& gen, unsigned count) {
    unsigned long long mine = gen;
    if (++arrived == count) { arrived = 0; ++gen; return; }
    while (gen == mine) dlb_yield();
}
inline void __syncthreads() { dlb_wait(g_block_arrived, g_block_gen, blockDim.x); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned width = blockDim.x - 32 * w < 32 ? blockDim.x - 32 * w : 32;
    unsigned long long b = 0; memcpy(&b, &v, sizeof(T));
    g_shfl[w][lane] = b;
    dlb_wait(g_warp_arrived[w], g_warp_gen[w], width);
    b = g_shfl[w][lane ^ o];
    dlb_wait(g_warp_arrived[w], g_warp_gen[w], width);
    T r; memcpy(&r, &b, sizeof(T)); return r;
}
static const std::function<void()>* g_kernel;
static void dlb_fiber_main() {
    (*g_kernel)();
    (*g_fibers)[g_current].done = true;
    // Finished: on to another fiber that has not, else back to the scheduler.
    unsigned me = g_current, n = (unsigned)g_fibers->size(), next = me;
    do { next = (next + 1) % n; } while ((*g_fibers)[next].done && next != me);
    if (next == me) { setcontext(&g_scheduler); }
    g_current = next;
    threadIdx.x = next;
    setcontext(&(*g_fibers)[next].ctx);
}
inline void launch(unsigned grid, unsigned block, const std::function<void()>& k) {
    constexpr size_t kStack = 256 * 1024;
    std::vector<DlbFiber> fibers(block);
    for (auto& f : fibers) f.stack.reset(new char[kStack]);
    g_fibers = &fibers; g_kernel = &k;
    blockDim.x = block; gridDim.x = grid;
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        g_block_arrived = 0;
        for (auto& a : g_warp_arrived) a = 0;
        for (auto& f : fibers) {
            f.done = false;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.get();
            f.ctx.uc_stack.ss_size = kStack;
            f.ctx.uc_link = &g_scheduler;
            makecontext(&f.ctx, dlb_fiber_main, 0);
        }
        g_current = 0;
        threadIdx.x = 0;
        swapcontext(&g_scheduler, &fibers[0].ctx);
    }
    threadIdx.x = 0;
}
