// CPU emulation test of the dlbridge CUDA kernels (no GPU needed): runs every
// kernel body with one fiber per CUDA thread (host_shim.h; barriers emulate
// __syncthreads / __shfl_xor_sync) and checks against a double-precision
// reference, including strided / negative-stride / 0-dim / empty cases.
//   g++ -std=c++20 -O2 -pthread -o /tmp/dlb_host_test kernels/cuda/host_test.cpp && /tmp/dlb_host_test
//   (pass any argument to also check the bf16 rounding on all 2^32 floats)
#include "host_shim.h"
#include "elementwise.cu"
#include "softmax.cu"
#include "sum.cu"
#include <random>
#include <cassert>
static std::mt19937_64 rng(12345);
static long long rnd(long long lo, long long hi) { return std::uniform_int_distribution<long long>(lo, hi)(rng); }
static int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 20) { printf("FAIL %s:%d ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } } while (0)

// ---- bf16 reference: nearest by exact double distance, ties to even
static unsigned short bf16_ref(float f) {
    unsigned u = __float_as_uint(f);
    if (std::isnan(f)) return 0xffff;  // marker
    unsigned lo = u & 0xffff0000u;      // truncation toward zero (same sign)
    unsigned hi = lo + 0x10000u;        // next magnitude (may be inf / overflow into nan? lo max finite -> inf)
    if ((u & 0xffffu) == 0) return lo >> 16;
    double dl = fabs((double)f - (double)__uint_as_float(lo));
    double dh;
    float fh = __uint_as_float(hi);
    if (std::isinf(fh)) {
        // distance to "2^128" as if exponent continued
        double next = ldexp(1.0, 128) * (f < 0 ? -1 : 1);
        dh = fabs((double)f - next);
    } else dh = fabs((double)f - (double)fh);
    if (dl < dh) return lo >> 16;
    if (dh < dl) return hi >> 16;
    return ((lo >> 16) & 1) ? hi >> 16 : lo >> 16;
}
static void test_bf16() {
    unsigned long long n = 0;
    for (unsigned long long x = 0; x <= 0xffffffffull; ++x) {
        unsigned u = (unsigned)x; float f = __uint_as_float(u);
        unsigned short got = dlb_f32_to_bf16(f);
        if (std::isnan(f)) {
            CHECK(std::isnan(dlb_bf16_to_f32(got)) && ((got >> 15) == (u >> 31)), "bf16 nan %08x -> %04x", u, got);
        } else {
            unsigned short want = bf16_ref(f);
            CHECK(got == want, "bf16 %08x -> %04x want %04x", u, got, want);
        }
        ++n;
    }
    for (unsigned h = 0; h < 65536; ++h) {
        float f = dlb_bf16_to_f32(h);
        CHECK(std::isnan(f) ? true : dlb_f32_to_bf16(f) == h, "bf16 roundtrip %04x", h);
    }
    printf("bf16 conversion: %llu floats checked\n", n);
}

// ---- views
struct View { std::vector<long long> shape, strides; long long base; long long span; };
static DlbIndexer mk(const std::vector<long long>& shape, const std::vector<long long>& strides) {
    DlbIndexer ix; memset(&ix, 0x5a, sizeof ix);  // garbage in unused slots
    ix.ndim = (int)shape.size();
    for (size_t d = 0; d < shape.size(); ++d) { ix.shape[d] = shape[d]; ix.strides[d] = strides[d]; }
    return ix;
}
static long long ref_off(const std::vector<long long>& shape, const std::vector<long long>& strides, long long i) {
    // independent: build multi-index from the front
    long long off = 0, rest = i;
    long long total = 1; for (auto s : shape) total *= s;
    for (size_t d = 0; d < shape.size(); ++d) {
        total /= shape[d];
        long long id = rest / total; rest %= total;
        off += id * strides[d];
    }
    return off;
}
static long long numel(const std::vector<long long>& s) { long long n = 1; for (auto x : s) n *= x; return n; }
// arbitrary strides (may be 0/negative) -> base so min offset is 0
static View any_view(const std::vector<long long>& shape) {
    View v; v.shape = shape; long long mn = 0, mx = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
        long long s = rnd(-7, 7); v.strides.push_back(s);
        if (shape[d] > 0) { if (s > 0) mx += s * (shape[d] - 1); else mn += s * (shape[d] - 1); }
    }
    v.base = -mn; v.span = mx - mn + 1; return v;
}
// non-overlapping: permuted dense layout with random sign flips
static View perm_view(const std::vector<long long>& shape) {
    View v; v.shape = shape; size_t nd = shape.size();
    std::vector<size_t> p(nd); for (size_t i = 0; i < nd; ++i) p[i] = i;
    std::shuffle(p.begin(), p.end(), rng);
    v.strides.assign(nd, 0); long long st = 1;
    for (size_t k = nd; k-- > 0;) { size_t d = p[k]; v.strides[d] = st; st *= std::max<long long>(shape[d], 1); }
    long long mn = 0, mx = 0;
    for (size_t d = 0; d < nd; ++d) {
        if (rnd(0, 1)) v.strides[d] = -v.strides[d];
        if (shape[d] > 0) { long long e = v.strides[d] * (shape[d] - 1); if (e > 0) mx += e; else mn += e; }
    }
    v.base = -mn; v.span = mx - mn + 1; return v;
}
static std::vector<long long> rshape(int maxnd, long long maxd) {
    int nd = (int)rnd(0, maxnd); std::vector<long long> s;
    for (int i = 0; i < nd; ++i) s.push_back(rnd(0, 9) == 0 ? 0 : rnd(1, maxd));
    return s;
}
static void test_offset() {
    for (int t = 0; t < 20000; ++t) {
        auto shape = rshape(8, 5); auto v = any_view(shape);
        DlbIndexer ix = mk(shape, v.strides);
        long long n = numel(shape);
        for (long long i = 0; i < n; ++i) CHECK(dlb_offset(ix, i) == ref_off(shape, v.strides, i), "offset");
    }
    DlbIndexer z = mk({}, {}); CHECK(dlb_offset(z, 0) == 0, "0-dim");
    // large
    DlbIndexer big = mk({3, 1LL << 33}, {-(1LL << 33), 1});
    CHECK(dlb_offset(big, (1LL << 33) * 2 + 5) == -(1LL << 34) + 5, "big");
    printf("dlb_offset ok\n");
}

template <class E> double tod(typename E::storage s) { return (double)E::load(s); }
template <class E> typename E::storage fromd(double d) { return E::store((typename E::acc)d); }

typedef void (*BinK)(const void*, DlbIndexer, const void*, DlbIndexer, void*, DlbIndexer, long long, int);
template <class E, class Op, class K>
static void test_binary(const char* name, K kern) {
    typedef typename E::storage S; typedef typename E::acc A;
    for (int t = 0; t < 300; ++t) {
        auto shape = rshape(4, 6); long long n = numel(shape);
        bool contig = rnd(0, 3) == 0;
        View va, vb, vo;
        if (contig) {
            std::vector<long long> st(shape.size()); long long s = 1;
            for (size_t k = shape.size(); k-- > 0;) { st[k] = s; s *= shape[k]; }
            va = vb = vo = View{shape, st, 0, std::max<long long>(n, 1)};
        } else { va = any_view(shape); vb = any_view(shape); vo = perm_view(shape); }
        std::vector<S> a(va.span), b(vb.span), o(vo.span, (S)0);
        for (auto& x : a) x = fromd<E>(std::uniform_real_distribution<double>(-4, 4)(rng));
        for (auto& x : b) x = fromd<E>(std::uniform_real_distribution<double>(-4, 4)(rng));
        unsigned grid = (unsigned)rnd(1, 3), block = 32u << rnd(0, 2);
        launch(grid, block, [&] { kern(a.data() + va.base, mk(shape, va.strides), b.data() + vb.base, mk(shape, vb.strides),
                                       o.data() + vo.base, mk(shape, vo.strides), n, contig ? 1 : 0); });
        Op op;
        for (long long i = 0; i < n; ++i) {
            S want = E::store(op(E::load(a[va.base + ref_off(shape, va.strides, i)]), E::load(b[vb.base + ref_off(shape, vb.strides, i)])));
            S got = o[vo.base + ref_off(shape, vo.strides, i)];
            CHECK(memcmp(&want, &got, sizeof(S)) == 0, "%s i=%lld", name, i);
        }
    }
    printf("%s ok\n", name);
}
template <class E, class Op, class K>
static void test_unary(const char* name, K kern) {
    typedef typename E::storage S;
    for (int t = 0; t < 300; ++t) {
        auto shape = rshape(4, 6); long long n = numel(shape);
        bool contig = rnd(0, 3) == 0;
        View va, vo;
        if (contig) {
            std::vector<long long> st(shape.size()); long long s = 1;
            for (size_t k = shape.size(); k-- > 0;) { st[k] = s; s *= shape[k]; }
            va = vo = View{shape, st, 0, std::max<long long>(n, 1)};
        } else { va = any_view(shape); vo = perm_view(shape); }
        std::vector<S> a(va.span), o(vo.span, (S)0);
        for (auto& x : a) x = fromd<E>(std::uniform_real_distribution<double>(-4, 4)(rng));
        if (a.size() > 2) { a[0] = fromd<E>(NAN); a[1] = fromd<E>(-0.0); }
        unsigned grid = (unsigned)rnd(1, 3), block = 32u << rnd(0, 2);
        launch(grid, block, [&] { kern(a.data() + va.base, mk(shape, va.strides), o.data() + vo.base, mk(shape, vo.strides), n, contig ? 1 : 0); });
        for (long long i = 0; i < n; ++i) {
            double x = tod<E>(a[va.base + ref_off(shape, va.strides, i)]);
            double y = tod<E>(o[vo.base + ref_off(shape, vo.strides, i)]);
            double w = Op::ref(x);
            double tol = sizeof(S) == 2 ? 1e-2 : (sizeof(S) == 4 ? 1e-6 : 1e-14);
            CHECK((std::isnan(w) && std::isnan(y)) || fabs(w - y) <= tol * (1 + fabs(w)), "%s x=%g got %g want %g", name, x, y, w);
        }
    }
    printf("%s ok\n", name);
}
struct RefRelu { static double ref(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0); } };
struct RefGelu { static double ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); } };

// The last-dim kernels of one dtype: plain (a warp or a block a row), and
// split rows (partial + finish, random pieces); sum with a random scale (mean).
template <class E> struct RowKernels {
    typedef typename E::storage S; typedef typename E::acc A;
    void (*softmax)(const S*, DlbIndexer, long long, S*, DlbIndexer, long long, long long, long long, int);
    void (*softmax_partial)(const S*, DlbIndexer, long long, A*, long long, long long, long long, long long, int);
    void (*softmax_finish)(const S*, DlbIndexer, long long, S*, DlbIndexer, long long, const A*, long long, long long, long long, long long, int);
    void (*sum)(const S*, DlbIndexer, long long, S*, DlbIndexer, long long, long long, int, double);
    void (*sum_partial)(const S*, DlbIndexer, long long, A*, long long, long long, long long, long long, int);
    void (*sum_finish)(const A*, S*, DlbIndexer, long long, long long, int, double);
};

template <class E>
static void test_rows(const char* name, RowKernels<E> k, bool softmax) {
    typedef typename E::storage S; typedef typename E::acc A;
    int split_cases = 0;
    for (int t = 0; t < 70; ++t) {
        auto bshape = rshape(3, 4); long long rows = numel(bshape);
        long long cols = std::vector<long long>{0, 1, 2, 7, 31, 33, 64, 100, 1000, 1024, 3000, 5000}[rnd(0, 11)];
        // x: batch view arbitrary, column stride arbitrary nonzero, placed in a big buffer
        // Half the cases contiguous rows (the 16-byte path where a row is aligned).
        long long xcs = rnd(0, 1) ? 1 : rnd(-3, 3); if (xcs == 0) xcs = 1;
        View xb = any_view(bshape);
        for (auto& s : xb.strides) s *= std::max<long long>(cols, 1) * 3 + 1;  // keep rows mostly apart (overlap is fine for x)
        long long mn = 0, mx = 0;
        for (size_t d = 0; d < bshape.size(); ++d) if (bshape[d] > 0) { long long e = xb.strides[d] * (bshape[d] - 1); if (e > 0) mx += e; else mn += e; }
        if (cols > 0) { long long e = xcs * (cols - 1); if (e > 0) mx += e; else mn += e; }
        long long xbase = -mn, xspan = mx - mn + 1;
        // y: for softmax full shape (batch perm + col stride), for sum batch only
        std::vector<long long> yshape = bshape; if (softmax) yshape.push_back(cols);
        View yv = perm_view(yshape);
        std::vector<long long> ybst(yv.strides.begin(), yv.strides.begin() + bshape.size());
        long long ycs = softmax ? yv.strides.back() : 0;
        std::vector<S> x(xspan), y(std::max<long long>(yv.span, 1), fromd<E>(-777));
        std::normal_distribution<double> nd(0, 3);
        for (auto& v : x) v = fromd<E>(nd(rng));
        int special = (int)rnd(0, 6);
        if (special == 0 && cols > 0 && rows > 0) {  // whole row 0 = -inf
            long long r0 = xbase + ref_off(bshape, xb.strides, 0);
            for (long long c = 0; c < cols; ++c) x[r0 + c * xcs] = fromd<E>(-INFINITY);
        }
        if (special == 1 && cols > 1 && rows > 0) {  // some -inf, a NaN or a +inf in the last row
            long long rl = xbase + ref_off(bshape, xb.strides, rows - 1);
            x[rl] = fromd<E>(-INFINITY);
            x[rl + rnd(1, cols - 1) * xcs] = fromd<E>(rnd(0, 1) ? NAN : INFINITY);
        }
        // A warp per row (several rows a block) or a block per row; or split rows.
        int warp_rows = (int)rnd(0, 1);
        unsigned grid = (unsigned)rnd(1, 4), block = warp_rows ? 32u * (unsigned)rnd(1, 4) : 32u << std::vector<int>{0, 1, 2, 3, 5}[rnd(0, 4)];
        bool split = rnd(0, 2) == 0;
        long long chunk = 8 * rnd(1, 40), splits = std::max<long long>(1, (cols + chunk - 1) / chunk);
        double scale = softmax ? 1.0 : (rnd(0, 1) ? 1.0 : 1.0 / std::max<long long>(cols, 1));
        DlbIndexer xi = mk(bshape, xb.strides), yi = mk(bshape, ybst);
        const S* xp = x.data() + xbase; S* yp = y.data() + yv.base;
        if (split) {
            ++split_cases;
            std::vector<A> part((size_t)std::max<long long>(1, rows * splits * 2), A(-555));
            int warp2 = (int)rnd(0, 1);
            unsigned grid2 = (unsigned)rnd(1, 3), block2 = warp2 ? 32u * (unsigned)rnd(1, 4) : 32u << rnd(0, 3);
            if (softmax) {
                launch(grid, block, [&] { k.softmax_partial(xp, xi, xcs, part.data(), rows, cols, splits, chunk, warp_rows); });
                launch(grid2, block2, [&] { k.softmax_finish(xp, xi, xcs, yp, yi, ycs, part.data(), rows, cols, splits, chunk, warp2); });
            } else {
                launch(grid, block, [&] { k.sum_partial(xp, xi, xcs, part.data(), rows, cols, splits, chunk, warp_rows); });
                launch(grid2, block2, [&] { k.sum_finish(part.data(), yp, yi, rows, splits, warp2, scale); });
            }
        } else if (softmax) {
            launch(grid, block, [&] { k.softmax(xp, xi, xcs, yp, yi, ycs, rows, cols, warp_rows); });
        } else {
            launch(grid, block, [&] { k.sum(xp, xi, xcs, yp, yi, rows, cols, warp_rows, scale); });
        }
        double tol = sizeof(S) == 2 ? 1e-2 : (sizeof(S) == 4 ? 1e-5 : 1e-12);
        for (long long r = 0; r < rows; ++r) {
            long long xo = xbase + ref_off(bshape, xb.strides, r);
            long long yo = yv.base + ref_off(bshape, ybst, r);
            std::vector<double> xv(cols); for (long long c = 0; c < cols; ++c) xv[c] = tod<E>(x[xo + c * xcs]);
            if (softmax) {
                double m = -INFINITY; bool nan = false;
                for (double v : xv) { m = std::max(m, v); nan |= std::isnan(v); }
                double s = 0; for (double v : xv) s += exp(v - m);
                for (long long c = 0; c < cols; ++c) {
                    double w = nan ? NAN : exp(xv[c] - m) / s, g = tod<E>(y[yo + c * ycs]);
                    CHECK((std::isnan(w) && std::isnan(g)) || fabs(w - g) <= tol * (fabs(w) + 1e-3), "%s r=%lld c=%lld cols=%lld block=%u warp_rows=%d split=%d xcs=%lld ycs=%lld got %g want %g", name, r, c, cols, block, warp_rows, (int)split, xcs, ycs, g, w);
                }
            } else {
                double s = 0, sa = 0; for (double v : xv) { s += v; sa += fabs(v); }
                s *= scale;
                sa *= scale;
                double g = tod<E>(y[yo]);
                CHECK(g == s || (std::isnan(s) && std::isnan(g)) || fabs(s - g) <= tol * (sa + fabs(s) + 1e-30) || (cols == 0 && g == 0), "%s r=%lld cols=%lld block=%u split=%d got %g want %g", name, r, cols, block, (int)split, g, s);
                if (cols == 0) CHECK(g == 0 && !std::signbit(g), "%s empty", name);
            }
        }
    }
    CHECK(split_cases > 8, "%s: %d split cases", name, split_cases);
    printf("%s ok\n", name);
}

#define ROW_KERNELS(T, E) RowKernels<E>{dlbridge_softmax_##T, dlbridge_softmax_partial_##T, dlbridge_softmax_finish_##T, \
    dlbridge_sum_##T, dlbridge_sum_partial_##T, dlbridge_sum_finish_##T}

int main(int argc, char** argv) {
    test_offset();
    test_binary<DlbF32, DlbAdd>("add_f32", dlbridge_add_f32);
    test_binary<DlbF64, DlbAdd>("add_f64", dlbridge_add_f64);
    test_binary<DlbF16, DlbAdd>("add_f16", dlbridge_add_f16);
    test_binary<DlbBF16, DlbAdd>("add_bf16", dlbridge_add_bf16);
    test_binary<DlbF32, DlbMul>("mul_f32", dlbridge_mul_f32);
    test_binary<DlbF64, DlbMul>("mul_f64", dlbridge_mul_f64);
    test_binary<DlbF16, DlbMul>("mul_f16", dlbridge_mul_f16);
    test_binary<DlbBF16, DlbMul>("mul_bf16", dlbridge_mul_bf16);
    test_unary<DlbF32, RefRelu>("relu_f32", dlbridge_relu_f32);
    test_unary<DlbF64, RefRelu>("relu_f64", dlbridge_relu_f64);
    test_unary<DlbF16, RefRelu>("relu_f16", dlbridge_relu_f16);
    test_unary<DlbBF16, RefRelu>("relu_bf16", dlbridge_relu_bf16);
    test_unary<DlbF32, RefGelu>("gelu_f32", dlbridge_gelu_f32);
    test_unary<DlbF64, RefGelu>("gelu_f64", dlbridge_gelu_f64);
    test_unary<DlbF16, RefGelu>("gelu_f16", dlbridge_gelu_f16);
    test_unary<DlbBF16, RefGelu>("gelu_bf16", dlbridge_gelu_bf16);
    test_rows<DlbF32>("softmax_f32", ROW_KERNELS(f32, DlbF32), true);
    test_rows<DlbF64>("softmax_f64", ROW_KERNELS(f64, DlbF64), true);
    test_rows<DlbF16>("softmax_f16", ROW_KERNELS(f16, DlbF16), true);
    test_rows<DlbBF16>("softmax_bf16", ROW_KERNELS(bf16, DlbBF16), true);
    test_rows<DlbF32>("sum_f32", ROW_KERNELS(f32, DlbF32), false);
    test_rows<DlbF64>("sum_f64", ROW_KERNELS(f64, DlbF64), false);
    test_rows<DlbF16>("sum_f16", ROW_KERNELS(f16, DlbF16), false);
    test_rows<DlbBF16>("sum_bf16", ROW_KERNELS(bf16, DlbBF16), false);
    if (argc > 1) test_bf16();
    printf(fails ? "FAILURES: %d\n" : "all host tests passed\n", fails);
    return fails != 0;
}
