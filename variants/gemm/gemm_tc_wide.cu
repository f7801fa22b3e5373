// gemm on tensor cores, wide tiles (fp16/bf16 in, fp32 accumulation): every warp computes
// a 64 x 64 sub-tile (4 m16 x 8 n8 mma.sync m16n8k16 per k16 step, fed by 4 + 4 ldmatrix.x4),
// a block of WARPS_M x WARPS_N warps a BM x BN tile, K in BK-wide tiles brought in by
// cp.async (zero-fill at the matrix edge) into a STAGES-deep ring in dynamic shared memory.
// Shared tiles are unpadded with 16-byte chunks XOR-swizzled by row so that both the
// cp.async stores and the ldmatrix reads are bank-conflict free. Fragments are double
// buffered in registers (ldmatrix for step k+1 is issued before the mma of step k). Tiles
// are rasterised in groups of GROUP_M block rows for L2 reuse of the B panel.
// Any M, N, K: rows that are not 16-byte aligned (K or N not a multiple of 8, or an input
// pointer not 16-byte aligned) take a (slow) element-by-element load path, zeros outside.
// Dynamic shared memory: STAGES * (BM * BK + BK * BN) * 2 bytes.
// Config: BM, BN, BK (32 | 64), WARPS_M, WARPS_N, STAGES. Convention: convention.md.
#include "adaptive_ptx.cuh"

#define THREADS (WARPS_M * WARPS_N * 32)
#define WTM (BM / WARPS_M)            // warp tile rows
#define WTN (BN / WARPS_N)            // warp tile cols
#define MT (WTM / 16)                 // m16 tiles per warp
#define NT (WTN / 8)                  // n8 tiles per warp
#define KSTEPS (BK / 16)              // k16 steps per k tile
#define A_CPR (BK / 8)                // 16-byte chunks per A tile row
#define B_CPR (BN / 8)                // 16-byte chunks per B tile row
#define A_ROW_BYTES (BK * 2)
#define B_ROW_BYTES (BN * 2)
#define A_STAGE_BYTES (BM * BK * 2)
#define STAGE_BYTES (A_STAGE_BYTES + BK * BN * 2)
#define A_ITERS (BM * A_CPR / THREADS)  // A chunks each thread copies per k tile
#define B_ITERS (BK * B_CPR / THREADS)
#define A_RSTEP (THREADS / A_CPR)       // A rows between a thread's chunks
#define B_RSTEP (THREADS / B_CPR)
#ifndef GROUP_M
#define GROUP_M 8
#endif

#if BK != 32 && BK != 64
#error "gemm_tc_wide: BK must be 32 or 64"
#endif
#if (BM * A_CPR) % THREADS != 0 || (BK * B_CPR) % THREADS != 0 || B_CPR < 8
#error "gemm_tc_wide: tile copy does not divide evenly over the threads"
#endif

#if defined(ADAPTIVE_DTYPE_BFLOAT16)
typedef __nv_bfloat162 T2;
__device__ __forceinline__ T2 to_t2(float x, float y) { return __floats2bfloat162_rn(x, y); }
#else
typedef __half2 T2;
__device__ __forceinline__ T2 to_t2(float x, float y) { return __floats2half2_rn(x, y); }
#endif

// Physical 16-byte chunk of logical chunk `c` in row `r`: 8 consecutive rows read at the
// same logical chunk land in 8 distinct 16-byte bank groups.
__device__ __forceinline__ int a_swz(int r, int c) {
#if BK == 64
    return c ^ (r & 7);               // 128-byte rows: one row per bank line
#else
    return c ^ ((r >> 1) & 3);        // 64-byte rows: two rows per bank line
#endif
}
__device__ __forceinline__ int b_swz(int r, int c) { return c ^ (r & 7); }

// Per-thread copy state: the next k tile's source of the thread's first A and B chunk
// (advanced by BK columns of A / BK rows of B per tile), and which of its A rows are inside M.
struct Copier {
    const T* a_src;
    const T* b_src;
    unsigned a_rows_ok;   // bit i: row ar + i * A_RSTEP < M
    bool b_col_ok;        // the thread's 8 B columns are inside N
    int ak;               // the thread's A column offset within the tile (elements)
};

// Copy the A tile [BM x BK] at (m0, k0) and the B tile [BK x BN] at (k0, n0) into the stage
// at shared address `st` with 16-byte cp.async, zero fill outside (needs K % 8 == 0,
// N % 8 == 0 and 16-byte aligned inputs). k0 is the tile's first k.
__device__ __forceinline__ void load_stage_vec(unsigned st, Copier& cp, const T* __restrict__ a,
                                               const T* __restrict__ b, int N, int K, int k0) {
    const int tid = threadIdx.x;
    const int ar = tid / A_CPR, ac = tid % A_CPR;
    const int br = tid / B_CPR, bc = tid % B_CPR;
    const bool ak_ok = k0 + cp.ak < K;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
        const int r = ar + i * A_RSTEP;   // r & 7 does not depend on i: A_RSTEP % 8 == 0
        const unsigned dst = st + r * A_ROW_BYTES + (a_swz(r, ac) << 4);
        const bool ok = ak_ok && ((cp.a_rows_ok >> i) & 1u);
        cp_async16(dst, ok ? cp.a_src + (size_t)i * A_RSTEP * K : a, ok ? 16 : 0);
    }
    const unsigned bst = st + A_STAGE_BYTES;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
        const int r = br + i * B_RSTEP;
        const unsigned dst = bst + r * B_ROW_BYTES + (b_swz(r, bc) << 4);
        const bool ok = cp.b_col_ok && k0 + r < K;
        cp_async16(dst, ok ? cp.b_src + (size_t)i * B_RSTEP * N : b, ok ? 16 : 0);
    }
    cp.a_src += BK;
    cp.b_src += (size_t)BK * N;
}

// The same tiles element by element with bounds checks (any alignment, any K and N):
// a slow path kept small in registers.
__device__ __noinline__ void load_stage_elem(unsigned st, const T* __restrict__ a,
                                             const T* __restrict__ b, int M, int N, int K,
                                             int m0, int n0, int k0) {
#pragma unroll 1
    for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
        const int r = e / BK, k = e % BK, gm = m0 + r, gk = k0 + k;
        const T v = (gm < M && gk < K) ? a[(size_t)gm * K + gk] : from_f32<T>(0.f);
        const unsigned dst = st + r * A_ROW_BYTES + (a_swz(r, k / 8) << 4) + (k % 8) * 2;
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(dst), "h"(*reinterpret_cast<const unsigned short*>(&v)));
    }
#pragma unroll 1
    for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
        const int r = e / BN, n = e % BN, gk = k0 + r, gn = n0 + n;
        const T v = (gk < K && gn < N) ? b[(size_t)gk * N + gn] : from_f32<T>(0.f);
        const unsigned dst = st + A_STAGE_BYTES + r * B_ROW_BYTES + (b_swz(r, n / 8) << 4) +
                             (n % 8) * 2;
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(dst), "h"(*reinterpret_cast<const unsigned short*>(&v)));
    }
}

template <bool ALIGNED>
__device__ __forceinline__ void load_stage(unsigned st, Copier& cp, const T* __restrict__ a,
                                           const T* __restrict__ b, int M, int N, int K,
                                           int m0, int n0, int k0) {
    if (ALIGNED)
        load_stage_vec(st, cp, a, b, N, K, k0);
    else
        load_stage_elem(st, a, b, M, N, K, m0, n0, k0);
}

// A and B fragments of k16 step `ks` of the stage at shared address `st` for warp (wm, wn).
__device__ __forceinline__ void load_frags(unsigned (&af)[MT][4], unsigned (&bf)[NT][2],
                                           unsigned st, int ks, int wm, int wn, int lane) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int r = wm * WTM + i * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
        const unsigned p = st + r * A_ROW_BYTES + (a_swz(r, c) << 4);
        ldmatrix_x4(af[i], p);
    }
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
        const int r = ks * 16 + (lane & 15), c = (wn * WTN + j * 8) / 8 + (lane >> 4);
        const unsigned p = st + A_STAGE_BYTES + r * B_ROW_BYTES + (b_swz(r, c) << 4);
        ldmatrix_x4_trans(bf[j][0], bf[j][1], bf[j + 1][0], bf[j + 1][1], p);
    }
}

__device__ __forceinline__ void mma_all(float (&acc)[MT][NT][4], const unsigned (&af)[MT][4],
                                        const unsigned (&bf)[NT][2]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int jj = (i & 1) ? NT - 1 - j : j;   // serpentine: reuse B registers
            mma16816(acc[i][jj], af[i], bf[jj]);
        }
}

template <bool ALIGNED>
__device__ __forceinline__ void mainloop(float (&acc)[MT][NT][4], unsigned smem,
                                         const T* __restrict__ a, const T* __restrict__ b,
                                         int M, int N, int K, int m0, int n0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int KT = (K + BK - 1) / BK;
    Copier cp;
    {
        const int tid = threadIdx.x;
        const int ar = tid / A_CPR, ac = tid % A_CPR;
        const int br = tid / B_CPR, bc = tid % B_CPR;
        cp.ak = ac * 8;
        cp.a_src = a + (size_t)(m0 + ar) * K + ac * 8;
        cp.b_src = b + (size_t)br * N + n0 + bc * 8;
        cp.b_col_ok = n0 + bc * 8 < N;
        cp.a_rows_ok = 0;
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i)
            cp.a_rows_ok |= (m0 + ar + i * A_RSTEP < M ? 1u : 0u) << i;
    }

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage<ALIGNED>(smem + s * STAGE_BYTES, cp, a, b, M, N, K, m0, n0, s * BK);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();
    __syncthreads();

    unsigned af[2][MT][4], bf[2][NT][2];
    int rd = 0, wr = STAGES - 1;
    load_frags(af[0], bf[0], smem, 0, wm, wn, lane);
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            if (ks == KSTEPS - 1) {   // the next stage must be resident before its fragments
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                rd = (rd + 1 == STAGES) ? 0 : rd + 1;
            }
            load_frags(af[(ks + 1) & 1], bf[(ks + 1) & 1], smem + rd * STAGE_BYTES,
                       (ks + 1) % KSTEPS, wm, wn, lane);
            if (ks == 0) {            // refill the stage every warp finished reading
                const int pf = kt + STAGES - 1;
                if (pf < KT)
                    load_stage<ALIGNED>(smem + wr * STAGE_BYTES, cp, a, b, M, N, K, m0, n0,
                                        pf * BK);
                cp_async_commit();
                wr = (wr + 1 == STAGES) ? 0 : wr + 1;
            }
            mma_all(acc, af[ks & 1], bf[ks & 1]);
        }
    }
    cp_async_wait<0>();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_tc_wide(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
             int M, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const unsigned smem = smem_u32(smem_raw);

    // grouped rasterisation: GROUP_M block rows sweep the block columns together
    const int tiles_n = gridDim.x, tiles_m = gridDim.y;
    const int pid = blockIdx.y * tiles_n + blockIdx.x;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int tm = first_m + (pid % per_group) % group_rows;
    const int tn = (pid % per_group) / group_rows;
    const int m0 = tm * BM, n0 = tn * BN;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;

    const bool aligned = (K % 8 == 0) && (N % 8 == 0) && ((size_t)a % 16 == 0) &&
                         ((size_t)b % 16 == 0);
    if (aligned)
        mainloop<true>(acc, smem, a, b, M, N, K, m0, n0);
    else
        mainloop<false>(acc, smem, a, b, M, N, K, m0, n0);

    // epilogue: c0,c1 at (row, col..col+1), c2,c3 at (row+8, col..col+1)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const bool pairs = (N % 2 == 0) && ((size_t)out % 4 == 0);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int row = m0 + wm * WTM + i * 16 + lane / 4;
            const int col = n0 + wn * WTN + j * 8 + (lane % 4) * 2;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row + h * 8;
                if (r >= M || col >= N) continue;
                T* p = out + (size_t)r * N + col;
                if (pairs) {   // N even: col + 1 < N too
                    *reinterpret_cast<T2*>(p) = to_t2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                } else {
                    p[0] = from_f32<T>(acc[i][j][2 * h]);
                    if (col + 1 < N) p[1] = from_f32<T>(acc[i][j][2 * h + 1]);
                }
            }
        }
    }
}
