// spmm, block-sparse kernel on tensor cores, rows balanced across CTAs (float16):
// out[M, N] = w[M, K] @ b[K, N], w in BSR with 32 x 32 blocks (row-major, empty blocks absent).
//
// At N = 256 the BSR walk is bound by the bytes it moves from L2 (per non-empty block a
// 2 KiB A block and a 32 x TN slab of b: 18 KiB at TN = 256), so this kernel aims at keeping
// many bytes in flight on every SM and the SMs equally busy:
//   * a CTA owns TN columns of RPC block rows; the block rows are taken from `order` (the
//     block rows sorted by non-empty block count, most first) in snake order: CTA c of P
//     gets positions c, 2P - 1 - c, 2P + c, ... so the heaviest row is paired with the
//     lightest and every CTA gets about the same number of blocks;
//   * the CTA's rows are one stream of blocks through a STAGES-deep cp.async pipeline
//     (STAGES - 1 blocks in flight, no drain between rows); when a row's last block is
//     multiplied its 32 x TN result is written (fp16) and the accumulators are zeroed, while
//     the next row's first blocks are already on their way.
// The inner product is spmm_bsr_mma.cu's: ldmatrix (x4, x4.trans) and mma.sync m16n8k16,
// fp16 in, fp32 sums; each warp owns all 32 rows and TN / NWARPS columns.
// Rows of b past K and columns past N read as zero; rows past M and columns past N are
// not written; a block row without blocks is written as zeros.
// Config macros: TN (128, 256), NWARPS (4, 8), STAGES (>= 2), RPC (block rows per CTA, 1-4).
// Needs T == __half (the prelude of adaptive/nvrtc.py provides T and cuda_fp16.h).

#include "adaptive_ptx.cuh"

#ifndef TN
#define TN 128
#endif
#ifndef NWARPS
#define NWARPS 8
#endif
#ifndef STAGES
#define STAGES 8
#endif
#ifndef RPC
#define RPC 2
#endif

#define BS 32
#define NTHREADS (NWARPS * 32)
#define WN (TN / NWARPS)                // columns of out per warp (all 32 rows)
#define MT (BS / 16)
#define NT (WN / 8)
#define A_LD (BS + 8)                   // padded rows: conflict-free ldmatrix
#define B_LD (TN + 8)
#define A_STAGE (BS * A_LD)
#define B_STAGE (BS * B_LD)

static_assert(WN % 16 == 0, "each warp needs a multiple of 16 columns");
static_assert(STAGES >= 2, "the pipeline needs two stages");
static_assert(RPC >= 1 && RPC <= 4, "RPC (block rows per CTA) must be 1 to 4");

// The whole CTA stages one A block and its 32 x TN slab of b (rows k0.., columns n0..).
__device__ __forceinline__ void load_stage(__half* as, __half* bs, const __half* __restrict__ a_blk,
                                           const __half* __restrict__ b, int k0, int n0,
                                           int N, int K, bool vec_ok) {
    constexpr int A_CHUNKS = BS * BS / 8;          // 16-byte pieces: 4 a row
    #pragma unroll
    for (int c0 = 0; c0 < A_CHUNKS; c0 += NTHREADS) {
        const int c = c0 + threadIdx.x;
        if (A_CHUNKS % NTHREADS == 0 || c < A_CHUNKS) {
            const int r = c / (BS / 8), col = (c % (BS / 8)) * 8;
            cp_async16(as + r * A_LD + col, a_blk + r * BS + col, 16);
        }
    }
    constexpr int B_CHUNKS = BS * TN / 8;
    #pragma unroll
    for (int c0 = 0; c0 < B_CHUNKS; c0 += NTHREADS) {
        const int c = c0 + threadIdx.x;
        if (B_CHUNKS % NTHREADS == 0 || c < B_CHUNKS) {
            const int r = c / (TN / 8), col = (c % (TN / 8)) * 8;
            const int k = k0 + r, n = n0 + col;
            __half* dst = bs + r * B_LD + col;
            if (vec_ok && n + 8 <= N) {
                const bool in = k < K;
                cp_async16(dst, in ? (const void*)(b + (size_t)k * N + n) : (const void*)b,
                           in ? 16 : 0);
            } else {
                #pragma unroll
                for (int i = 0; i < 8; ++i)
                    dst[i] = (k < K && n + i < N) ? b[(size_t)k * N + n + i] : __float2half(0.f);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
spmm_bsr_rows(const int* __restrict__ indptr, const int* __restrict__ indices,
              const __half* __restrict__ values, const int* __restrict__ order,
              const __half* __restrict__ b, __half* __restrict__ out, int M, int N, int K)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* a_s = reinterpret_cast<__half*>(smem_raw);
    __half* b_s = a_s + STAGES * A_STAGE;

    const int R = (M + BS - 1) / BS, P = gridDim.y, cta = blockIdx.y, n0 = blockIdx.x * TN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wn0 = warp * WN;
    const bool vec_ok = (N % 8) == 0;

    // This CTA's block rows (snake order over `order`) as one stream of blocks: stream
    // position j of row q is block first[q] + j, for end[q - 1] <= j < end[q].
    int row[RPC], first[RPC], end[RPC];
    int total = 0;
    #pragma unroll
    for (int q = 0; q < RPC; ++q) {
        const int p = q * P + ((q & 1) ? P - 1 - cta : cta);
        const int r = p < R ? order[p] : -1;
        const int s = r >= 0 ? indptr[r] : 0;
        const int n = r >= 0 ? indptr[r + 1] - s : 0;
        row[q] = r;
        first[q] = s - total;
        total += n;
        end[q] = total;
    }
    auto block_at = [&](int j) {   // the block at stream position j < total
        int blk = first[0] + j;
        #pragma unroll
        for (int q = 1; q < RPC; ++q)
            if (j >= end[q - 1]) blk = first[q] + j;   // the last row that starts at or before j
        return blk;
    };
    auto load = [&](int j, int kb) {   // stage stream position j (CTA-uniform), column block kb
        const int st = j % STAGES;
        load_stage(a_s + st * A_STAGE, b_s + st * B_STAGE,
                   values + (size_t)block_at(j) * (BS * BS), b, kb * BS, n0, N, K, vec_ok);
    };

    float acc[MT][NT][4];
    #pragma unroll
    for (int i = 0; i < MT; ++i)
        #pragma unroll
        for (int j = 0; j < NT; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) load(s, indices[block_at(s)]);
        cp_async_commit();
    }
    // the column block of the next position to stage, read one iteration ahead so that its
    // latency hides behind the mma work
    int kb_next = STAGES - 1 < total ? indices[block_at(STAGES - 1)] : 0;

    const int g = lane >> 2, t = lane & 3;
    int i = 0;   // stream position, carried from row to row
    #pragma unroll
    for (int q = 0; q < RPC; ++q) {
        for (; i < end[q]; ++i) {
            cp_async_wait<STAGES - 2>();   // position i landed (this thread's copies) ...
            __syncthreads();               // ... everyone's; stage (i - 1) % STAGES is free
            const int nxt = i + STAGES - 1;
            if (nxt < total) load(nxt, kb_next);
            cp_async_commit();
            kb_next = nxt + 1 < total ? indices[block_at(nxt + 1)] : 0;
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
                    ldmatrix_x4_trans(bf, bs + (ks * 16 + (lane & 15)) * B_LD + wn0 + np * 16 + (lane >> 4) * 8);
                    #pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma16816<__half>(acc[mt][2 * np], af[mt], bf);
                        mma16816<__half>(acc[mt][2 * np + 1], af[mt], bf + 2);
                    }
                }
            }
        }
        // row q is complete (zeros if it has no blocks): write it, start the next from zero
        if (row[q] >= 0) {
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                #pragma unroll
                for (int half_row = 0; half_row < 2; ++half_row) {
                    const int orow = row[q] * BS + mt * 16 + g + half_row * 8;
                    if (orow >= M) continue;
                    #pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const int col = n0 + wn0 + nt * 8 + 2 * t;
                        const float x0 = acc[mt][nt][2 * half_row], x1 = acc[mt][nt][2 * half_row + 1];
                        __half* dst = out + (size_t)orow * N + col;
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
        if (q + 1 < RPC) {
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
        }
    }
    cp_async_wait<0>();
}
