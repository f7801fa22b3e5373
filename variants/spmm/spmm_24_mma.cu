// spmm, 2:4 sparse weight on sparse tensor cores (float16), for few columns of b (decode and
// small batches: N = 1..64): out[M, N] = w[M, K] @ b[K, N], w 2:4 structured, read in its
// compressed fragment form (w_24_vals, w_24_meta: half the weight's bytes plus 1/16 for
// metadata; layout in convention.md), so the kernel streams ~9/16 of a dense GEMV's bytes.
//
// A CTA owns ROWS = 16 MT WR rows of out and NP = 8 NT columns. Its WR x WK warps split the
// rows (WR) and the K chunks (WK): per slab of KC = 32 UNROLL WK columns of K the CTA
// stages b[slab, NP columns] in shared memory (rows past K and columns past N as zeros),
// and each warp multiplies its UNROLL chunks of 32 columns for its MT row tiles with
// mma.sp m16n8k32 (fp16 in, fp32 accumulate), B fragments by ldmatrix.trans. The weight's
// fragments for the next slab are loaded into registers before the current slab is
// computed (two register sets, ping-pong), so weight bytes stay in flight while b is staged.
// The WK partial sums meet in shared memory (float atomics) and the CTA writes out.
// DIRECT = 1 (NT = 1: N <= 8, decode): no b slab; each lane reads its B fragment straight
// from global memory (b is a few KB, L1-resident), so warps stream without barriers.
// Config macros: NT (1, 2, 4, 8), MT (1, 2), WR, WK, DIRECT (0, 1). Needs T == __half.

#include "adaptive_ptx.cuh"

#ifndef NT
#define NT 1
#endif
#ifndef MT
#define MT 1
#endif
#ifndef WR
#define WR 1
#endif
#ifndef WK
#define WK 4
#endif
#ifndef DIRECT
#define DIRECT 0
#endif
#if DIRECT && NT != 1
#error "DIRECT needs NT == 1"
#endif

#define UNROLL (4 / MT)                 // chunks per warp per slab: 2 KB of weight in flight
#define NP (8 * NT)                     // columns of out per CTA
#define LDB (NP >= 16 ? NP + 8 : NP)    // padded rows of the b slab: conflict-free ldmatrix
#define ROWS (16 * MT * WR)             // rows of out per CTA
#define CPS (UNROLL * WK)               // 32-column chunks per slab
#define KC (32 * CPS)                   // columns of K per slab
#define NWARPS (WR * WK)

struct Frags {
    uint4 a[UNROLL][MT];
    unsigned e[UNROLL][MT];
};

// This warp's weight fragments of slab s (zeros past the last chunk / row tile).
__device__ __forceinline__ void load_frags(Frags& f, const uint4* __restrict__ vals,
                                           const unsigned* __restrict__ meta, int s, int wk,
                                           int tile0, int n_tiles, int n_chunks, int lane) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int j = s * CPS + wk * UNROLL + u;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const int tile = tile0 + mt;
            f.a[u][mt] = make_uint4(0u, 0u, 0u, 0u);
            f.e[u][mt] = 0x44444444u;
            if (j < n_chunks && tile < n_tiles) {
                const size_t frag = (size_t)tile * n_chunks + j;
                f.a[u][mt] = load_stream16(vals + frag * 32 + lane);
                if ((lane & 3) < 2)
                    f.e[u][mt] = __ldg(meta + frag * 16 + (lane >> 2) * 2 + (lane & 3));
            }
        }
    }
}

// b[s KC .. + KC, n0 .. n0 + NP] into bs (row-major, LDB halves a row), zeros outside b.
__device__ __forceinline__ void stage_b(T* bs, const T* __restrict__ b, int s, int n0, int N,
                                        int K, bool vec) {
    const int k0 = s * KC;
    if (vec) {   // N % 8 == 0 and b 16-byte aligned: whole 16-byte runs of a row
        for (int idx = threadIdx.x; idx < KC * (NP / 8); idx += NWARPS * 32) {
            const int kk = idx / (NP / 8), v = idx % (NP / 8);
            const int k = k0 + kk, n = n0 + 8 * v;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (k < K && n < N) x = __ldg(reinterpret_cast<const uint4*>(b + (size_t)k * N + n));
            *reinterpret_cast<uint4*>(bs + kk * LDB + 8 * v) = x;
        }
    } else {
        for (int idx = threadIdx.x; idx < KC * NP; idx += NWARPS * 32) {
            const int kk = idx / NP, nn = idx % NP;
            const int k = k0 + kk, n = n0 + nn;
            bs[kk * LDB + nn] = (k < K && n < N) ? b[(size_t)k * N + n] : from_f32<T>(0.f);
        }
    }
}

// DIRECT: lane (g, t)'s B fragment of chunk j: register r = rows 32 j + 8 r + 2 t, + 1 of
// column n0 + g (zeros past K and N)
__device__ __forceinline__ void load_b_direct(unsigned* bf, const T* __restrict__ b, int j,
                                              int n0, int N, int K, int lane) {
    const int n = n0 + (lane >> 2), k0 = j * 32 + 2 * (lane & 3);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int k = k0 + 8 * r;
        unsigned lo = 0u, hi = 0u;
        if (n < N && k < K) lo = __half_as_ushort(b[(size_t)k * N + n]);
        if (n < N && k + 1 < K) hi = __half_as_ushort(b[(size_t)(k + 1) * N + n]);
        bf[r] = lo | (hi << 16);
    }
}

__device__ __forceinline__ void compute(float (&acc)[MT][NT][4], const Frags& f, const T* bs,
                                        const T* __restrict__ b, int s, int wk, int n_chunks,
                                        int n0, int N, int K, int lane) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (s * CPS + wk * UNROLL + u >= n_chunks) break;       // warp-uniform
        const T* rows = bs + ((wk * UNROLL + u) * 32 + lane) * LDB;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            unsigned bf[4];
#if DIRECT
            load_b_direct(bf, b, s * CPS + wk * UNROLL + u, n0, N, K, lane);
#else
            ldmatrix_x4_trans(bf, rows + nt * 8);
#endif
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mma_sp16832(acc[mt][nt], f.a[u][mt], bf, f.e[u][mt]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NWARPS * 32)
spmm_24_mma(const uint4* __restrict__ vals, const unsigned* __restrict__ meta,
            const T* __restrict__ b, T* __restrict__ out, int M, int N, int K) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* bs = reinterpret_cast<T*>(smem_raw);                 // [KC][LDB]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wr = warp % WR, wk = warp / WR;
    const int n_tiles = (M + 15) >> 4, n_chunks = (K + 31) >> 5;
    const int n_slabs = (n_chunks + CPS - 1) / CPS;
    const int tile0 = blockIdx.x * (MT * WR) + wr * MT;
    const int n0 = blockIdx.y * NP;
    const bool vec = (N % 8 == 0) && ((reinterpret_cast<size_t>(b) & 15) == 0);

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

#if DIRECT
#define STAGE(s_)
#else
#define STAGE(s_) __syncthreads(); stage_b(bs, b, (s_), n0, N, K, vec); __syncthreads();
#endif
    Frags f0, f1;
    load_frags(f0, vals, meta, 0, wk, tile0, n_tiles, n_chunks, lane);
    for (int s = 0; s < n_slabs; s += 2) {
        STAGE(s)                        // barriers around it: the last slab is consumed first
        if (s + 1 < n_slabs) load_frags(f1, vals, meta, s + 1, wk, tile0, n_tiles, n_chunks, lane);
        compute(acc, f0, bs, b, s, wk, n_chunks, n0, N, K, lane);
        if (s + 1 >= n_slabs) break;
        STAGE(s + 1)
        if (s + 2 < n_slabs) load_frags(f0, vals, meta, s + 2, wk, tile0, n_tiles, n_chunks, lane);
        compute(acc, f1, bs, b, s + 1, wk, n_chunks, n0, N, K, lane);
    }

    const int g = lane >> 2, t = lane & 3;
    float* red = reinterpret_cast<float*>(smem_raw);        // [ROWS][NP], over the b slab
    __syncthreads();
    for (int idx = threadIdx.x; idx < ROWS * NP; idx += NWARPS * 32) red[idx] = 0.f;
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = (wr * MT + mt) * 16 + g + 8 * (i >> 1);
                atomicAdd(red + r * NP + nt * 8 + 2 * t + (i & 1), acc[mt][nt][i]);
            }
    __syncthreads();
    for (int idx = threadIdx.x; idx < ROWS * NP; idx += NWARPS * 32) {
        const int row = blockIdx.x * ROWS + idx / NP, col = n0 + idx % NP;
        if (row < M && col < N) out[(size_t)row * N + col] = from_f32<T>(red[idx]);
    }
}
