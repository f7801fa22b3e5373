// softmax with the row held in registers: x is read from global memory once, 16 bytes
// per load, every load of a thread issued before any use; one exp per element.
// Two layouts from one source:
//   reg_row  (THREADS defined): one block of THREADS threads per row; grid = R.
//   reg_warp (G defined): G lanes (a sub-warp) per row, 128 / G rows per block.
// ITEMS: 16-byte vectors per thread, so a row fits when C <= TPR * ITEMS * VEC.
// STREAM=1 (an `options` macro): ld.global.cs / st.global.cs (evict-first) instead of
// ld.global.nc / plain stores. Convention: convention.md.
//
// Reduction in one shared-memory round: each thread keeps (m_t, s_t) with s_t relative to
// its own max; a warp reduces max then rescales and reduces sums (one exp per thread);
// warps meet in shared memory once; the final scale is exp(m_t - M) / S.

#include "adaptive_ptx.cuh"

#ifndef ITEMS
#define ITEMS 1
#endif
#ifndef STREAM
#define STREAM 0
#endif
#ifdef THREADS
#define TPR THREADS
#define ROWS 1
#else
#define TPR G
#define ROWS (128 / G)
#endif

constexpr int VEC = 16 / (int)sizeof(T);
constexpr int NT = TPR * ROWS;                       // threads per block
constexpr int WIDTH = TPR < 32 ? TPR : 32;           // shuffle width of a row's lanes
constexpr int NW = TPR > 32 ? TPR / 32 : 1;          // warps per row
constexpr float LOG2E = 1.4426950408889634f;
struct alignas(16) VecT { T v[VEC]; };

__device__ __forceinline__ VecT load16(const T* p) {
    int4 r;
#if STREAM
    r = __ldcs(reinterpret_cast<const int4*>(p));
#else
    r = __ldg(reinterpret_cast<const int4*>(p));
#endif
    return *reinterpret_cast<VecT*>(&r);
}

__device__ __forceinline__ void store16(T* p, const VecT& v) {
    int4 r = *reinterpret_cast<const int4*>(&v);
#if STREAM
    __stcs(reinterpret_cast<int4*>(p), r);
#else
    *reinterpret_cast<int4*>(p) = r;
#endif
}

// (m, s) over `width` lanes: max first, then each lane rescales its sum once.
__device__ __forceinline__ void lanes_reduce(float& m, float& s, int width) {
    float mx = m;
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1)
        if (o < width) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o, WIDTH));
    s = (m == -INFINITY) ? 0.f : s * ex2((m - mx) * LOG2E);
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1)
        if (o < width) s += __shfl_xor_sync(0xffffffffu, s, o, WIDTH);
    m = mx;
}

extern "C" __global__ void __launch_bounds__(NT)
softmax_reg(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    const int lane = threadIdx.x;                    // 0..TPR-1 within the row
    const int row = blockIdx.x * ROWS + threadIdx.y;
    const bool live = row < R;                       // no early exit: all lanes shuffle
    const T* xr = x + (size_t)(live ? row : 0) * C;
    T* orow = out + (size_t)(live ? row : 0) * C;
    const bool vec = (C % VEC == 0) && ((((size_t)xr) | ((size_t)orow)) % 16 == 0);

    float e[ITEMS][VEC];
    if (vec) {
        VecT v[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            int c = (i * TPR + lane) * VEC;
            if (live && c < C) v[i] = load16(xr + c);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            bool ok = live && (i * TPR + lane) * VEC < C;
#pragma unroll
            for (int j = 0; j < VEC; ++j) e[i][j] = ok ? to_f32(v[i].v[j]) : -INFINITY;
        }
    } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                int c = (i * TPR + lane) * VEC + j;
                e[i][j] = (live && c < C) ? to_f32(xr[c]) : -INFINITY;
            }
    }

    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < VEC; ++j) m = fmaxf(m, e[i][j]);
    const float mref = (m == -INFINITY) ? 0.f : m;  // padding gives ex2(-inf) = 0
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; ++i)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            e[i][j] = ex2((e[i][j] - mref) * LOG2E);
            s += e[i][j];
        }

    const float m_own = m;
    lanes_reduce(m, s, WIDTH);
#if TPR > 32
    __shared__ float red_m[NW], red_s[NW];
    const int warp = lane / 32, wl = lane % 32;
    if (wl == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    m = red_m[wl % NW];                              // each group of NW lanes: a full copy
    s = red_s[wl % NW];
    lanes_reduce(m, s, NW);
#endif
    // m: row max, s: row sum of exp(x - m)
    const float scale = (m_own == -INFINITY) ? 0.f : ex2((m_own - m) * LOG2E) / s;
    if (!live) return;
    if (vec) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            int c = (i * TPR + lane) * VEC;
            if (c < C) {
                VecT w;
#pragma unroll
                for (int j = 0; j < VEC; ++j) w.v[j] = from_f32<T>(e[i][j] * scale);
                store16(orow + c, w);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i)
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                int c = (i * TPR + lane) * VEC + j;
                if (c < C) orow[c] = from_f32<T>(e[i][j] * scale);
            }
    }
}
