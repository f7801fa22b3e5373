// gemm on tensor cores (fp16/bf16 in, fp32 accumulation): mma.sync m16n8k16 fed by
// ldmatrix from shared memory, tiles brought in by cp.async in a STAGES-deep ring.
// Block = WARPS_M x WARPS_N warps computes a BM x BN tile; each warp a (BM/WARPS_M) x
// (BN/WARPS_N) sub-tile. BK = 32. Tiles that cross the matrix edge, or rows that are not
// 16-byte aligned (K or N not a multiple of 8), are loaded element by element with
// zeros outside, so any M, N, K work. Dynamic shared memory: STAGES*(BM*(BK+8) +
// BK*(BN+8)) elements. Config: BM, BN, WARPS_M, WARPS_N, STAGES. Convention: convention.md.
#include "adaptive_ptx.cuh"

#define BK 32
#define THREADS (WARPS_M * WARPS_N * 32)
#define WTM (BM / WARPS_M)            // warp tile rows
#define WTN (BN / WARPS_N)            // warp tile cols
#define MT (WTM / 16)                 // m16 tiles per warp
#define NT (WTN / 8)                  // n8 tiles per warp
#define AS_LD (BK + 8)                // padded row pitch (elements) of the A tile
#define BS_LD (BN + 8)                // padded row pitch of the B tile
#define A_STAGE (BM * AS_LD)
#define B_STAGE (BK * BS_LD)

// Load the A tile [BM x BK] at (m0, k0) and the B tile [BK x BN] at (k0, n0) into a stage.
__device__ __forceinline__ void load_tiles(T* As, T* Bs, const T* __restrict__ a,
                                           const T* __restrict__ b, int M, int N, int K,
                                           int m0, int n0, int k0, bool aligned) {
    const int tid = threadIdx.x;
    // A: BM rows of BK elements = BK/8 chunks of 16 bytes per row
    for (int c = tid; c < BM * (BK / 8); c += THREADS) {
        int r = c / (BK / 8), kc = (c % (BK / 8)) * 8;
        int gm = m0 + r, gk = k0 + kc;
        T* dst = As + r * AS_LD + kc;
        if (aligned && gm < M && gk + 8 <= K) {
            cp_async16(dst, a + (size_t)gm * K + gk);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                dst[j] = (gm < M && gk + j < K) ? a[(size_t)gm * K + gk + j] : from_f32<T>(0.f);
        }
    }
    // B: BK rows of BN elements
    for (int c = tid; c < BK * (BN / 8); c += THREADS) {
        int r = c / (BN / 8), nc = (c % (BN / 8)) * 8;
        int gk = k0 + r, gn = n0 + nc;
        T* dst = Bs + r * BS_LD + nc;
        if (aligned && gk < K && gn + 8 <= N) {
            cp_async16(dst, b + (size_t)gk * N + gn);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                dst[j] = (gk < K && gn + j < N) ? b[(size_t)gk * N + gn + j] : from_f32<T>(0.f);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_tc(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
        int M, int N, int K) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* As = reinterpret_cast<T*>(smem_raw);
    T* Bs = As + STAGES * A_STAGE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const bool aligned = (K % 8 == 0) && (N % 8 == 0) && ((size_t)a % 16 == 0) &&
                         ((size_t)b % 16 == 0);
    const int KT = (K + BK - 1) / BK;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_tiles(As + s * A_STAGE, Bs + s * B_STAGE, a, b, M, N, K, m0, n0,
                               s * BK, aligned);
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        int pf = kt + STAGES - 1;
        if (pf < KT) {
            int st = pf % STAGES;
            load_tiles(As + st * A_STAGE, Bs + st * B_STAGE, a, b, M, N, K, m0, n0, pf * BK,
                       aligned);
        }
        cp_async_commit();
        const T* as = As + (kt % STAGES) * A_STAGE;
        const T* bs = Bs + (kt % STAGES) * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned af[MT][4], bf[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const T* p = as + (wm * WTM + i * 16 + (lane % 16)) * AS_LD + kk + (lane / 16) * 8;
                ldmatrix_x4(af[i], p);
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const T* p = bs + (kk + (lane % 16)) * BS_LD + wn * WTN + j * 8 + (lane / 16) * 8;
                ldmatrix_x4_trans(bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1], smem_u32(p));
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    mma16816(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

    // epilogue: c0,c1 at (row, col..col+1), c2,c3 at (row+8, col..col+1)
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            int row = m0 + wm * WTM + i * 16 + lane / 4;
            int col = n0 + wn * WTN + j * 8 + (lane % 4) * 2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int r = row + h * 8;
                if (r >= M) continue;
                if (col < N) out[(size_t)r * N + col] = from_f32<T>(acc[i][j][2 * h]);
                if (col + 1 < N) out[(size_t)r * N + col + 1] = from_f32<T>(acc[i][j][2 * h + 1]);
            }
        }
    }
}
