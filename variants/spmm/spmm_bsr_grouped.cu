// spmm, block-sparse kernel on tensor cores, block rows grouped to share b (float16):
// out[M, N] = w[M, K] @ b[K, N], w in BSR with 32 x 32 blocks (row-major, empty blocks absent).
//
// The single-row BSR kernels stream, per non-empty block, its 2 KiB A block and a 32 x TN
// slab of b: 32 FLOP per byte from L2 whatever N is. Here a CTA owns a GROUP of G
// consecutive block rows (warp r owns block row r of the group: 32 rows x TN columns of
// fp32 accumulators in registers) and one TN-column tile of out. It walks the group's
// entries (the column blocks present in any of its rows, ascending; the host builds them:
// adaptive/backends/cuda_sparse.py, `w_bsr32_g{G}_*`) and stages, per entry, the b slab
// ONCE plus the A blocks of the rows that have it (absent ones are skipped), through a
// STAGES-deep cp.async pipeline; each warp whose row has the block runs its mma.sync steps
// (ldmatrix x4 for A, x4.trans for b, m16n8k16, fp16 in, fp32 sums), the others skip the
// math; every __syncthreads is reached by all threads. The b slab is reused by about
// G d / (1 - (1 - d)^G) rows at block density d (1.4 at 10%, G = 8; 2.2 at 25%).
// Rows of b past K and columns past N read as zero; rows past M and columns past N are not
// written; a block row without blocks is written as zeros.
// SPLIT > 1 (grid.z = SPLIT) divides each group's entries into SPLIT contiguous shares, one
// CTA each, for shapes with too few groups x column tiles to fill the GPU: every CTA writes
// its fp32 partial tile to its slice of `workspace`, and the last CTA of a tile (an atomic
// counter per tile) adds the other slices to its own registers, writes out and resets the
// counter to zero (the workspace stays reusable).
// Config macros: GROUP (4, 8; = warps per CTA), TN (64, 128), STAGES (>= 2), SPLIT (>= 1).
// Kernel arguments: gptr int32 [n_groups + 1], gk int32 [E] (column block of entry e),
// gblk int32 [E * GROUP] (the BSR block of entry e in group row r, or -1), and with
// SPLIT > 1 workspace: SPLIT * M * N floats, then one unsigned counter per CTA tile.
// Needs T == __half (the prelude of adaptive/nvrtc.py provides T and cuda_fp16.h).

#include "adaptive_ptx.cuh"

#ifndef GROUP
#define GROUP 8
#endif
#ifndef TN
#define TN 128
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef SPLIT
#define SPLIT 1
#endif

#define BS 32
#define NWARPS GROUP
#define NTHREADS (NWARPS * 32)
#define MT (BS / 16)
#define NT (TN / 8)
#define A_LD (BS + 8)                   // padded rows: conflict-free ldmatrix
#define B_LD (TN + 8)
#define A_BLOCK (BS * A_LD)
#define A_STAGE (GROUP * A_BLOCK)       // one A block per group row
#define B_STAGE (BS * B_LD)

static_assert(TN % 16 == 0, "TN must be a multiple of 16");
static_assert(STAGES >= 2 && STAGES <= 32, "STAGES must be 2 to 32");
static_assert(SPLIT >= 1, "SPLIT must be >= 1");

// The whole CTA stages the 32 x TN slab of b at rows k0.., columns n0...
__device__ __forceinline__ void load_b(__half* bs, const __half* __restrict__ b, int k0, int n0,
                                       int N, int K, bool vec_ok) {
    constexpr int B_CHUNKS = BS * TN / 8;          // 16-byte pieces
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

// One warp stages its row's A block (32 x 32, row-major in the BSR values).
__device__ __forceinline__ void load_a(__half* as, const __half* __restrict__ a_blk, int lane) {
    #pragma unroll
    for (int c = lane; c < BS * BS / 8; c += 32) {
        const int r = c / (BS / 8), col = (c % (BS / 8)) * 8;
        cp_async16(as + r * A_LD + col, a_blk + r * BS + col, 16);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
spmm_bsr_grouped(const int* __restrict__ gptr, const int* __restrict__ gk,
                 const int* __restrict__ gblk, const __half* __restrict__ values,
                 const __half* __restrict__ b, __half* __restrict__ out, int M, int N, int K
#if SPLIT > 1
                 , float* __restrict__ workspace
#endif
                 )
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* a_s = reinterpret_cast<__half*>(smem_raw);
    __half* b_s = a_s + STAGES * A_STAGE;

    const int grp = blockIdx.y, n0 = blockIdx.x * TN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool vec_ok = (N % 8) == 0;
#if SPLIT > 1
    // this CTA's share of the group's entries
    const int g_start = gptr[grp], g_count = gptr[grp + 1] - g_start;
    const int share = (g_count + SPLIT - 1) / SPLIT;
    const int start = g_start + min(g_count, (int)blockIdx.z * share);
    const int count = min(g_count, ((int)blockIdx.z + 1) * share) - (start - g_start);
#else
    const int start = gptr[grp], count = gptr[grp + 1] - start;
#endif

    // Stage entry j (CTA-uniform) with column block kb; this warp's A block is blk (-1: none).
    // `present` has bit s set when stage s holds this warp's A block (warp-uniform).
    unsigned present = 0;
    auto load = [&](int j, int kb, int blk) {
        const int st = j % STAGES;
        load_b(b_s + st * B_STAGE, b, kb * BS, n0, N, K, vec_ok);
        if (blk >= 0)
            load_a(a_s + st * A_STAGE + warp * A_BLOCK, values + (size_t)blk * (BS * BS), lane);
        present = (present & ~(1u << st)) | (static_cast<unsigned>(blk >= 0) << st);
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
        if (s < count) load(s, gk[start + s], gblk[(size_t)(start + s) * GROUP + warp]);
        cp_async_commit();
    }
    // the next entry to stage, read one iteration ahead so that its latency hides behind
    // the mma work
    int kb_next = 0, blk_next = -1;
    if (STAGES - 1 < count) {
        kb_next = gk[start + STAGES - 1];
        blk_next = gblk[(size_t)(start + STAGES - 1) * GROUP + warp];
    }

    const __half* a_warp = a_s + warp * A_BLOCK;
    for (int i = 0; i < count; ++i) {
        cp_async_wait<STAGES - 2>();   // entry i landed (this thread's copies) ...
        __syncthreads();               // ... everyone's; stage (i - 1) % STAGES is free
        const int nxt = i + STAGES - 1;
        if (nxt < count) load(nxt, kb_next, blk_next);
        cp_async_commit();
        if (nxt + 1 < count) {
            kb_next = gk[start + nxt + 1];
            blk_next = gblk[(size_t)(start + nxt + 1) * GROUP + warp];
        }
        const int st = i % STAGES;
        if (!((present >> st) & 1u)) continue;     // this warp's row lacks the block
        const __half* as = a_warp + st * A_STAGE;
        const __half* bs = b_s + st * B_STAGE;
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

    const int g = lane >> 2, t = lane & 3;
    const int row0 = (grp * GROUP + warp) * BS;
#if SPLIT > 1
    {
        // publish this share's partial sums, then let the tile's last CTA add them up
        float* part = workspace + (size_t)blockIdx.z * M * N;
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int row = row0 + mt * 16 + g + half_row * 8;
                if (row >= M) continue;
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int col = n0 + nt * 8 + 2 * t;
                    if (col < N) part[(size_t)row * N + col] = acc[mt][nt][2 * half_row];
                    if (col + 1 < N) part[(size_t)row * N + col + 1] = acc[mt][nt][2 * half_row + 1];
                }
            }
        __threadfence();
        __syncthreads();
        __shared__ int last;
        unsigned* counters = reinterpret_cast<unsigned*>(workspace + (size_t)SPLIT * M * N);
        const int tile = blockIdx.y * gridDim.x + blockIdx.x;
        if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1u) == SPLIT - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int row = row0 + mt * 16 + g + half_row * 8;
                if (row >= M) continue;
                #pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int col = n0 + nt * 8 + 2 * t;
                    for (int z = 0; z < SPLIT; ++z) {
                        if (z == (int)blockIdx.z) continue;
                        const float* other = workspace + (size_t)z * M * N + (size_t)row * N + col;
                        if (col < N) acc[mt][nt][2 * half_row] += __ldcg(other);
                        if (col + 1 < N) acc[mt][nt][2 * half_row + 1] += __ldcg(other + 1);
                    }
                }
            }
        if (threadIdx.x == 0) counters[tile] = 0u;   // the workspace stays reusable
    }
#endif
    // this warp's 32 x TN tile (zeros when its row has no blocks)
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int row = row0 + mt * 16 + g + half_row * 8;
            if (row >= M) continue;
            #pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int col = n0 + nt * 8 + 2 * t;
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
