// spmm, block-sparse kernel on tensor cores with the K walk split across warps (float16):
// out[M, N] = w[M, K] @ b[K, N], w in BSR with 32 x 32 blocks (row-major, empty blocks absent).
// A CTA owns one block row (32 rows of out) and TN columns. Unlike spmm_bsr_mma.cu, whose
// warps share one block at a time (one __syncthreads per block, one walk per CTA), each of
// the NWARPS warps here walks its own share of the block row's non-empty blocks (warp w takes
// blocks w, w + NWARPS, ...) through a private STAGES-deep cp.async pipeline (no CTA barrier
// in the loop), so NWARPS * (STAGES - 1) blocks are in flight per CTA. The warps' fp32
// partial sums are then added through shared memory and written once.
// A block's column indices are fetched 32 at a time, one per lane, and handed out by shuffle.
// Rows of b past K and columns past N read as zero; rows past M and columns past N are not
// written. Config macros: TN (16, 32, 64), NWARPS (4, 8), STAGES (2, 3).
// Needs T == __half (the prelude of adaptive/nvrtc.py provides T and cuda_fp16.h).

#include "adaptive_ptx.cuh"

#ifndef TN
#define TN 16
#endif
#ifndef NWARPS
#define NWARPS 8
#endif
#ifndef STAGES
#define STAGES 2
#endif

#define BS 32
#define MT (BS / 16)                    // 16-row mma tiles per block
#define NT (TN / 8)                     // 8-column mma tiles per warp
#define A_LD (BS + 8)                   // padded rows: conflict-free ldmatrix
#define B_LD (TN + 8)
#define A_STAGE (BS * A_LD)
#define B_STAGE (BS * B_LD)
#define WARP_SMEM (STAGES * (A_STAGE + B_STAGE))   // halves per warp

static_assert(TN % 16 == 0, "TN must be a multiple of 16");
static_assert(STAGES >= 2, "the pipeline needs two stages");
static_assert(MT * NT * 32 * 4 * 4 <= WARP_SMEM * 2, "reduction must fit in the pipeline smem");

// One warp stages one A block and its 32 x TN slab of b into its own shared memory.
__device__ __forceinline__ void warp_load(__half* as, __half* bs, const __half* __restrict__ a_blk,
                                          const __half* __restrict__ b, int k0, int n0,
                                          int N, int K, bool vec_ok, int lane) {
    constexpr int A_CHUNKS = BS * BS / 8;
    #pragma unroll
    for (int c = lane; c < A_CHUNKS; c += 32) {
        const int r = c / (BS / 8), col = (c % (BS / 8)) * 8;
        cp_async16(as + r * A_LD + col, a_blk + r * BS + col, 16);
    }
    constexpr int B_CHUNKS = BS * TN / 8;
    #pragma unroll
    for (int c = lane; c < B_CHUNKS; c += 32) {
        const int r = c / (TN / 8), col = (c % (TN / 8)) * 8;
        const int k = k0 + r, n = n0 + col;
        __half* dst = bs + r * B_LD + col;
        if (vec_ok && n + 8 <= N) {
            const bool in = k < K;
            cp_async16(dst, in ? (const void*)(b + (size_t)k * N + n) : (const void*)b, in ? 16 : 0);
        } else {
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                dst[i] = (k < K && n + i < N) ? b[(size_t)k * N + n + i] : __float2half(0.f);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NWARPS * 32)
spmm_bsr_splitk(const int* __restrict__ indptr, const int* __restrict__ indices,
                const __half* __restrict__ values, const __half* __restrict__ b,
                __half* __restrict__ out, int M, int N, int K)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __half* a_s = reinterpret_cast<__half*>(smem_raw) + warp * WARP_SMEM;
    __half* b_s = a_s + STAGES * A_STAGE;

    const int br = blockIdx.y, n0 = blockIdx.x * TN;
    const bool vec_ok = (N % 8) == 0;
    const int start = indptr[br], nblk = indptr[br + 1] - start;
    const int cnt = warp < nblk ? (nblk - warp + NWARPS - 1) / NWARPS : 0;   // this warp's blocks
    const int* my_idx = indices + start + warp;                              // stride NWARPS
    const __half* my_val = values + (size_t)(start + warp) * (BS * BS);

    float acc[MT][NT][4];
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    // column indices of blocks j .. j + 31 of this warp, one per lane (refilled every 32)
    int idx_lane = lane < cnt ? my_idx[lane * NWARPS] : 0;
    auto load = [&](int j) {   // warp-uniform j < cnt
        if (j > 0 && (j & 31) == 0)
            idx_lane = j + lane < cnt ? my_idx[(j + lane) * NWARPS] : 0;
        const int kb = __shfl_sync(0xffffffffu, idx_lane, j & 31);
        const int st = j % STAGES;
        warp_load(a_s + st * A_STAGE, b_s + st * B_STAGE, my_val + (size_t)j * NWARPS * (BS * BS),
                  b, kb * BS, n0, N, K, vec_ok, lane);
    };

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < cnt) load(s);
        cp_async_commit();
    }
    for (int i = 0; i < cnt; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncwarp();   // every lane's copies of stage i landed; stage i - 1 is no longer read
        if (i + STAGES - 1 < cnt) load(i + STAGES - 1);
        cp_async_commit();
        const __half* as = a_s + (i % STAGES) * A_STAGE;
        const __half* bs = b_s + (i % STAGES) * B_STAGE;
        #pragma unroll
        for (int ks = 0; ks < BS / 16; ++ks) {
            unsigned af[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(af[mt], as + (mt * 16 + (lane & 15)) * A_LD + ks * 16 + (lane >> 4) * 8);
            #pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bf[4];
                ldmatrix_x4_trans(bf, bs + (ks * 16 + (lane & 15)) * B_LD + np * 16 + (lane >> 4) * 8);
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<__half>(acc[mt][2 * np], af[mt], bf);
                    mma16816<__half>(acc[mt][2 * np + 1], af[mt], bf + 2);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();   // all warps done with their pipelines: the smem becomes the reduction buffer

    // partial sums in fragment order: red[warp][(mt * NT + nt) * 32 + lane] (float4, conflict-free)
    constexpr int FRAGS = MT * NT * 32;
    float4* red = reinterpret_cast<float4*>(smem_raw);
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt)
        #pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            red[warp * FRAGS + (mt * NT + nt) * 32 + lane] =
                make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
    __syncthreads();

    // each thread adds the NWARPS partials of column pairs; consecutive threads, consecutive pairs
    const float2* red2 = reinterpret_cast<const float2*>(smem_raw);
    for (int p = threadIdx.x; p < 2 * FRAGS; p += NWARPS * 32) {
        const int t = p & 3, nt = (p >> 2) % NT, g = (p / (4 * NT)) & 7;
        const int half_row = (p / (32 * NT)) & 1, mt = p / (64 * NT);
        const int f2 = 2 * ((mt * NT + nt) * 32 + g * 4 + t) + half_row;
        float2 s = red2[f2];
        #pragma unroll
        for (int w = 1; w < NWARPS; ++w) {
            const float2 v = red2[2 * w * FRAGS + f2];
            s.x += v.x; s.y += v.y;
        }
        const int row = br * BS + mt * 16 + g + half_row * 8;
        const int col = n0 + nt * 8 + 2 * t;
        if (row >= M) continue;
        __half* dst = out + (size_t)row * N + col;
        if (vec_ok && col + 1 < N) {
            *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(s.x, s.y);
        } else {
            if (col < N) dst[0] = __float2half_rn(s.x);
            if (col + 1 < N) dst[1] = __float2half_rn(s.y);
        }
    }
}
