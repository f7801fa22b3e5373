// spmm, block-sparse kernel on tensor cores (float16): out[M, N] = w[M, K] @ b[K, N] with w
// in BSR (square BS x BS blocks, each stored row-major; empty blocks are simply absent).
// A CTA owns one block row (BS rows of out) and TN columns; it walks only that block row's
// non-empty blocks, staging each A block and the matching BS x TN slab of b in shared
// memory with cp.async (STAGES deep), and multiplies them with mma.sync m16n8k16
// (fp16 in, fp32 accumulate). Rows of b past K and columns past N read as zero.
// Config macros: BS (16, 32, 64), TN (64, 128, 256), NWARPS (4, 8), STAGES (2, 3).
// Needs T == __half (the prelude of adaptive/nvrtc.py provides T and cuda_fp16.h).

#include "adaptive_ptx.cuh"

#ifndef BS
#define BS 32
#endif
#ifndef TN
#define TN 128
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef STAGES
#define STAGES 2
#endif

#define WM (BS < 32 ? BS : 32)          // rows of out per warp
#define WARPS_M (BS / WM)
#define WARPS_N (NWARPS / WARPS_M)
#define WN (TN / WARPS_N)               // columns of out per warp
#define MT (WM / 16)
#define NT (WN / 8)
#define A_LD (BS + 8)                   // padded rows: conflict-free ldmatrix
#define B_LD (TN + 8)
#define A_STAGE (BS * A_LD)
#define B_STAGE (BS * B_LD)

static_assert(WN % 16 == 0, "each warp needs a multiple of 16 columns");
static_assert(WARPS_M * WARPS_N == NWARPS, "warps must tile the block");

// Stage one A block and its BS x TN slab of b into shared memory.
__device__ __forceinline__ void load_stage(__half* as, __half* bs, const __half* __restrict__ a_blk,
                                           const __half* __restrict__ b, int k0, int n0,
                                           int N, int K, bool vec_ok) {
    constexpr int A_CHUNKS = BS * BS / 8;
    for (int c = threadIdx.x; c < A_CHUNKS; c += NWARPS * 32) {
        const int r = c / (BS / 8), col = (c % (BS / 8)) * 8;
        cp_async16(as + r * A_LD + col, a_blk + r * BS + col, 16);
    }
    constexpr int B_CHUNKS = BS * TN / 8;
    for (int c = threadIdx.x; c < B_CHUNKS; c += NWARPS * 32) {
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
spmm_bsr_mma(const int* __restrict__ indptr, const int* __restrict__ indices,
             const __half* __restrict__ values, const __half* __restrict__ b,
             __half* __restrict__ out, int M, int N, int K)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* a_s = reinterpret_cast<__half*>(smem_raw);
    __half* b_s = a_s + STAGES * A_STAGE;

    const int br = blockIdx.y, n0 = blockIdx.x * TN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
    const bool vec_ok = (N % 8) == 0;
    const int start = indptr[br], nblk = indptr[br + 1] - start;

    float acc[MT][NT][4];
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nblk)
            load_stage(a_s + s * A_STAGE, b_s + s * B_STAGE, values + (size_t)(start + s) * BS * BS,
                       b, indices[start + s] * BS, n0, N, K, vec_ok);
        cp_async_commit();
    }
    for (int i = 0; i < nblk; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int nxt = i + STAGES - 1;
        if (nxt < nblk) {
            const int st = nxt % STAGES;
            load_stage(a_s + st * A_STAGE, b_s + st * B_STAGE, values + (size_t)(start + nxt) * BS * BS,
                       b, indices[start + nxt] * BS, n0, N, K, vec_ok);
        }
        cp_async_commit();
        const __half* as = a_s + (i % STAGES) * A_STAGE;
        const __half* bs = b_s + (i % STAGES) * B_STAGE;
        #pragma unroll
        for (int ks = 0; ks < BS / 16; ++ks) {
            unsigned af[MT][4];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ldmatrix_x4(af[mt], as + (wm0 + mt * 16 + (lane & 15)) * A_LD + ks * 16 + (lane >> 4) * 8);
            #pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bf[4];
                ldmatrix_x4_trans(bf, bs + (ks * 16 + (lane & 15)) * B_LD + wn0 + np * 16 + (lane >> 4) * 8);
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma16816<__half>(acc[mt][2 * np], af[mt], bf);
                    mma16816<__half>(acc[mt][2 * np + 1], af[mt], bf + 2);
                }
            }
        }
    }
    cp_async_wait<0>();

    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int row = br * BS + wm0 + mt * 16 + g + half_row * 8;
            if (row >= M) continue;
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int col = n0 + wn0 + nt * 8 + 2 * t;
                const float x0 = acc[mt][nt][2 * half_row], x1 = acc[mt][nt][2 * half_row + 1];
                __half* dst = out + (size_t)row * N + col;
                if (vec_ok && col + 1 < N) {
                    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x0, x1);
                } else {
                    if (col < N) dst[0] = __float2half_rn(x0);
                    if (col + 1 < N) dst[1] = __float2half_rn(x1);
                }
            }
        }
    }
}
