// spmm, 2:4 sparse weight streamed at copy bandwidth (float16), for few columns of b (decode
// and small batches, N = 1..64): out[M, N] = w[M, K] @ b[K, N], w in its compressed fragment
// form (w_24_vals, w_24_meta: 9/16 of the dense bytes; layout in convention.md), on sparse
// tensor cores (mma.sp m16n8k32, fp16 in, fp32 sums).
//
// Why not sparse24_mma's structure: that kernel holds one slab of weight fragments in
// registers (2 KB a warp), so each warp's K loop waits on DRAM latency once per slab; with
// M = 4096 there are only 256 row tiles for 132 SMs; and at N > 8 each slab of b is staged
// by plain loads between two barriers. Here the weight streams through a STAGES-deep ring of
// cp.async stages in shared memory, (STAGES - 1) stages always in flight, and the work is
// cut along K too, so every SM streams the same number of bytes whatever M is.
//
// Work: a CTA of W warps owns row blocks of TILES = W MT row tiles (warp w: tiles w MT ..
// + MT - 1 of the block) and all NP = 8 NT columns (N <= NP: one column tile, the weight is
// read once). A unit is one row block x CH chunks of 32 columns of K; the units, row block
// by row block, K ascending, are split evenly over the grid (stream-K): CTA i takes units
// [U i / G, U (i + 1) / G) as one pipeline. Per unit, a stage holds its warps' fragments
// (CH x 512 bytes of values and CH x 64 of metadata a tile, one 16-byte cp.async a lane and
// chunk: each lane reads back only its own values) and the b slab of those CH chunks. At the
// end of a row block (or of its range) a CTA that covered the block's whole K writes out;
// a CTA that covered part of it adds its fp32 sums to `workspace` (red.add) and, once its
// range is done, counts its units on the block's counter: the CTA completing the count
// converts the block's sums to out and leaves the workspace and the counter at zero. A CTA
// has at most two such blocks (its first and its last).
//
// The b slab of a unit, KC = 32 CH rows of b: row-major [KC][LDB] (ldmatrix.trans gives the
// B fragments) when N >= 8, by cp.async when N % 8 == 0 and b is 16-byte aligned; for N < 8
// transposed [8][LDK] (b's columns as rows: plain ldmatrix gives the fragments), by cp.async
// of b itself when N == 1 (rows 1..7 stay zero); otherwise (odd N, misaligned b) by plain
// loads. Rows of b past K and columns past N are zeros; nothing past K, M or N is read or
// written.
// Config macros: W (warps), MT (row tiles a warp), CH (chunks a stage), STAGES (>= 2),
// NT (column tiles of 8: N <= 8 NT), OCC (CTAs an SM the grid assumes: register bound).
// Workspace: M * N floats, then one unsigned counter per row block. Needs T == __half.

#include "adaptive_ptx.cuh"

#ifndef W
#define W 4
#endif
#ifndef MT
#define MT 1
#endif
#ifndef CH
#define CH 8
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef NT
#define NT 1
#endif
#ifndef OCC
#define OCC 1
#endif

#define NTHREADS (W * 32)
#define TILES (W * MT)                      // row tiles a row block
#define ROWS (16 * TILES)
#define KC (32 * CH)                        // rows of b a unit
#define NP (8 * NT)
#define LDB (NT == 1 ? 8 : NP + 8)          // row-major slab: conflict-free ldmatrix.trans
#define LDK (KC + 8)                        // transposed slab: conflict-free ldmatrix
#define VALS_BYTES (TILES * CH * 512)
#define META_BYTES (TILES * CH * 64)
#define B_BYTES (NT == 1 ? 512 * CH + 128 : 512 * CH * (NT + 1))
#define STAGE_BYTES (VALS_BYTES + META_BYTES + B_BYTES)

static_assert(STAGES >= 2 && STAGES <= 16, "STAGES must be 2 to 16");
static_assert(CH >= 1 && CH <= 8, "CH must be 1 to 8 (its metadata: one piece a lane)");
static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "NT must be 1, 2, 4 or 8");
static_assert(B_BYTES >= (NT == 1 ? 16 * LDK : 2 * KC * LDB), "b slab too small");

struct Work {           // CTA-uniform facts of the launch
    int n_tiles, n_chunks, n_q;      // row tiles, chunks of 32 columns, units a row block
    int u0, u1;                      // this CTA's units
    bool trans, async;               // b slab layout (transposed) and how it is filled
};

// Unit u of the range into ring slot st: this warp's fragments and a share of the b slab.
__device__ __forceinline__ void load_stage(unsigned char* slot, const Work& wk,
                                           const uint4* __restrict__ vals,
                                           const unsigned* __restrict__ meta,
                                           const T* __restrict__ b, int u, int N, int K,
                                           int warp, int lane) {
    const int rb = u / wk.n_q, c0 = (u - rb * wk.n_q) * CH;
    const int nc = min(CH, wk.n_chunks - c0);
    uint4* svals = reinterpret_cast<uint4*>(slot);
    unsigned* smeta = reinterpret_cast<unsigned*>(slot + VALS_BYTES);
    T* sb = reinterpret_cast<T*>(slot + VALS_BYTES + META_BYTES);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const int tile = rb * TILES + warp * MT + m;
        if (tile >= wk.n_tiles) continue;                   // warp-uniform
        const size_t frag = (size_t)tile * wk.n_chunks + c0;
        const int local = (warp * MT + m) * CH;
#pragma unroll
        for (int c = 0; c < CH; ++c)
            if (c < nc) cp_async16(svals + (local + c) * 32 + lane, vals + (frag + c) * 32 + lane);
        if (lane < 4 * nc) cp_async16(smeta + local * 16 + 4 * lane, meta + frag * 16 + 4 * lane);
    }
    const int k0 = c0 * 32;
    if (wk.trans && wk.async) {         // N == 1: b's 8-element runs into row 0
        for (int i = threadIdx.x; i < KC / 8; i += NTHREADS) {
            const int k = k0 + 8 * i;
            const int bytes = max(0, min(16, 2 * (K - k)));
            cp_async16(sb + 8 * i, bytes > 0 ? (const void*)(b + k) : (const void*)b, bytes);
        }
    } else if (wk.trans) {
        for (int i = threadIdx.x; i < 8 * KC; i += NTHREADS) {
            const int n = i / KC, kk = i - n * KC, k = k0 + kk;
            sb[n * LDK + kk] = (k < K && n < N) ? b[(size_t)k * N + n] : from_f32<T>(0.f);
        }
    } else if (wk.async) {              // N % 8 == 0: 16-byte runs of b's rows
        for (int i = threadIdx.x; i < KC * (NP / 8); i += NTHREADS) {
            const int kk = i / (NP / 8), n = 8 * (i - kk * (NP / 8)), k = k0 + kk;
            const bool in = k < K && n < N;
            cp_async16(sb + kk * LDB + n, in ? (const void*)(b + (size_t)k * N + n)
                                             : (const void*)b, in ? 16 : 0);
        }
    } else {
        for (int i = threadIdx.x; i < KC * NP; i += NTHREADS) {
            const int kk = i / NP, n = i - kk * NP, k = k0 + kk;
            sb[kk * LDB + n] = (k < K && n < N) ? b[(size_t)k * N + n] : from_f32<T>(0.f);
        }
    }
}

// acc += this warp's tiles x the b slab of the unit in `slot` (its first nc chunks).
__device__ __forceinline__ void compute(float (&acc)[MT][NT][4], const unsigned char* slot,
                                        const Work& wk, int rb, int nc, int warp, int lane) {
    const uint4* svals = reinterpret_cast<const uint4*>(slot);
    const unsigned* smeta = reinterpret_cast<const unsigned*>(slot + VALS_BYTES);
    const T* sb = reinterpret_cast<const T*>(slot + VALS_BYTES + META_BYTES);
    const int tile0 = rb * TILES + warp * MT;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        if (c >= nc) break;                                 // CTA-uniform
        uint4 a[MT];
        unsigned e[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            const int local = (warp * MT + m) * CH + c;
            a[m] = svals[local * 32 + lane];
            e[m] = smeta[local * 16 + 2 * (lane >> 2) + (lane & 1)];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            unsigned bf[4];
            if (NT == 1 && wk.trans)
                ldmatrix_x4(bf, sb + (lane & 7) * LDK + c * 32 + (lane >> 3) * 8);
            else
                ldmatrix_x4_trans(bf, sb + (c * 32 + lane) * LDB + nt * 8);
#pragma unroll
            for (int m = 0; m < MT; ++m)
                if (tile0 + m < wk.n_tiles) mma_sp16832(acc[m][nt], a[m], bf, e[m]);
        }
    }
}

// This warp's sums of row block rb: to out (the CTA covered its whole K) or added to the
// workspace; then zeroed.
__device__ __forceinline__ void flush(float (&acc)[MT][NT][4], T* __restrict__ out,
                                      float* __restrict__ ws, int rb, bool whole, int M, int N,
                                      bool pairs, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const int tile = rb * TILES + warp * MT + m;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = tile * 16 + g + 8 * h;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int col = nt * 8 + 2 * t;
                float& x0 = acc[m][nt][2 * h];
                float& x1 = acc[m][nt][2 * h + 1];
                if (row < M && col < N) {
                    const size_t at = (size_t)row * N + col;
                    if (!whole && N % 2 == 0) {       // one 8-byte reduction (sm_90)
                        atomicAdd(reinterpret_cast<float2*>(ws + at), make_float2(x0, x1));
                    } else if (!whole) {
                        atomicAdd(ws + at, x0);
                        if (col + 1 < N) atomicAdd(ws + at + 1, x1);
                    } else if (pairs) {               // N even, out 4-byte aligned
                        *reinterpret_cast<__half2*>(out + at) = __floats2half2_rn(x0, x1);
                    } else {
                        out[at] = from_f32<T>(x0);
                        if (col + 1 < N) out[at + 1] = from_f32<T>(x1);
                    }
                }
                x0 = 0.f;
                x1 = 0.f;
            }
        }
    }
}

// The last CTA of row block rb: its workspace sums to out, the workspace back to zero.
__device__ __forceinline__ void finish(T* __restrict__ out, float* __restrict__ ws, int rb,
                                       int M, int N, bool pairs) {
    const int rows = min(ROWS, M - rb * ROWS);
    const size_t base = (size_t)rb * ROWS * N;
    if (pairs) {                        // N even: two columns a thread and step
#pragma unroll 4
        for (int i = threadIdx.x; i < rows * N / 2; i += NTHREADS) {
            const size_t at = base + 2 * i;
            const float2 x = __ldcg(reinterpret_cast<const float2*>(ws + at));
            *reinterpret_cast<__half2*>(out + at) = __floats2half2_rn(x.x, x.y);
            *reinterpret_cast<float2*>(ws + at) = make_float2(0.f, 0.f);
        }
        return;
    }
    for (int i = threadIdx.x; i < rows * N; i += NTHREADS) {
        const size_t at = base + i;
        out[at] = from_f32<T>(__ldcg(ws + at));
        ws[at] = 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS, OCC)
spmm_24_stream(const uint4* __restrict__ vals, const unsigned* __restrict__ meta,
               const T* __restrict__ b, T* __restrict__ out, int M, int N, int K,
               float* __restrict__ workspace) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ int last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Work wk;
    wk.n_tiles = (M + 15) >> 4;
    wk.n_chunks = (K + 31) >> 5;
    wk.n_q = (wk.n_chunks + CH - 1) / CH;
    const long long units = (long long)((wk.n_tiles + TILES - 1) / TILES) * wk.n_q;
    wk.u0 = (int)(units * blockIdx.x / gridDim.x);
    wk.u1 = (int)(units * (blockIdx.x + 1) / gridDim.x);
    const bool aligned = (reinterpret_cast<size_t>(b) & 15) == 0;
    wk.trans = NT == 1 && N < 8;
    wk.async = aligned && (wk.trans ? N == 1 : N % 8 == 0);
    const bool pairs = N % 2 == 0 && (reinterpret_cast<size_t>(out) & 3) == 0;
    const int n_local = wk.u1 - wk.u0;

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][nt][i] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_local)
            load_stage(smem_raw + s * STAGE_BYTES, wk, vals, meta, b, wk.u0 + s, N, K, warp,
                       lane);
        cp_async_commit();
    }
    if (wk.trans && wk.async) {          // N == 1: rows 1..7 of every transposed slab are 0
        constexpr int PIECES = 7 * LDK / 8;                 // 16-byte pieces of rows 1..7
        for (int i = threadIdx.x; i < STAGES * PIECES; i += NTHREADS) {
            const int st = i / PIECES;
            unsigned char* rows = smem_raw + st * STAGE_BYTES + VALS_BYTES + META_BYTES + 2 * LDK;
            reinterpret_cast<uint4*>(rows)[i - st * PIECES] = make_uint4(0u, 0u, 0u, 0u);
        }
    }                                    // (the first barrier of the loop orders it)
    for (int j = 0; j < n_local; ++j) {
        cp_async_wait<STAGES - 2>();     // unit j landed (this thread's copies) ...
        __syncthreads();                 // ... everyone's; slot (j - 1) % STAGES is free
        const int next = j + STAGES - 1;
        if (next < n_local)
            load_stage(smem_raw + (next % STAGES) * STAGE_BYTES, wk, vals, meta, b,
                       wk.u0 + next, N, K, warp, lane);
        cp_async_commit();
        const int u = wk.u0 + j, rb = u / wk.n_q, q = u - rb * wk.n_q;
        compute(acc, smem_raw + (j % STAGES) * STAGE_BYTES, wk, rb,
                min(CH, wk.n_chunks - q * CH), warp, lane);
        if (q == wk.n_q - 1 || j == n_local - 1)
            flush(acc, out, workspace, rb, rb * wk.n_q >= wk.u0 && q == wk.n_q - 1, M, N,
                  pairs, warp, lane);
    }
    cp_async_wait<0>();

    // row blocks covered in part: count this CTA's units; the one completing a count ends it
    const int rb_a = wk.u0 / wk.n_q, rb_b = (wk.u1 - 1) / wk.n_q;
    const bool part_a = wk.u0 % wk.n_q != 0 || wk.u1 < (rb_a + 1) * wk.n_q;
    const bool part_b = rb_b != rb_a && wk.u1 % wk.n_q != 0;
    if (!part_a && !part_b) return;                         // CTA-uniform
    unsigned* counters = reinterpret_cast<unsigned*>(workspace + (size_t)M * N);
    __threadfence();                     // this thread's sums reach L2 before the count
    __syncthreads();
    if (threadIdx.x == 0) {
        int flags = 0;
        if (part_a) {
            const unsigned mine = min(wk.u1, (rb_a + 1) * wk.n_q) - wk.u0;
            if (atomicAdd(counters + rb_a, mine) + mine == (unsigned)wk.n_q) flags |= 1;
        }
        if (part_b) {
            const unsigned mine = wk.u1 - rb_b * wk.n_q;
            if (atomicAdd(counters + rb_b, mine) + mine == (unsigned)wk.n_q) flags |= 2;
        }
        last = flags;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (last & 1) finish(out, workspace, rb_a, M, N, pairs);
    if (last & 2) finish(out, workspace, rb_b, M, N, pairs);
    if (threadIdx.x == 0) {              // the workspace stays reusable
        if (last & 1) counters[rb_a] = 0u;
        if (last & 2) counters[rb_b] = 0u;
    }
}
