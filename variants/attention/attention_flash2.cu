// attention, FlashAttention-2-style fused kernel (float16 / bfloat16) on mma.sync tensor
// cores: out[b, h] = softmax(q kᵀ · scale [+ causal mask]) v for q [B, H, Lq, D], k and v
// [B, H, Lk, D]. A CTA owns BR = 32 * NWARPS query rows of one (b, h); each warp owns 32
// rows (two m16 tiles), so every K/V fragment read from shared memory by ldmatrix feeds
// four mma instead of two (the 16-rows-per-warp kernel is bound by shared-memory reads).
// The q tile lives in shared memory (ldmatrix per k-step; 32 rows of q in registers would
// not fit beside the 32 x HD fp32 output). K and V tiles of BC keys are staged by
// cp.async: V(j) loads while S = Q K(j)ᵀ is computed and K(j+1) while P V(j) is.
// P goes from the S accumulators to fp16/bf16 A fragments in registers (the C layout of
// m16n8 matches the A layout of m16k16). exp2 with scale·log2(e) folded in (ex2.approx).
// Causal: the mask is bottom-right aligned (row i sees keys j <= i + Lk - Lq), key tiles
// past a CTA's last diagonal are skipped and the heaviest row blocks are issued first.
// PAIR = 1 balances the causal triangle: a CTA serves row block nb-1-x and then row block x
// (nb row blocks, grid ceil(nb / 2)), so every CTA reads nb + 1 row blocks' width of keys
// where the unpaired grid's read 1 to nb: half the CTAs, of equal work. That shortens a
// grid of several waves (S148: 0.73-0.80x), not one wave, whose time is its heaviest CTA's.
// KSPLIT = 2 splits each row block's keys between two warp groups (NWARPS warps each over
// the same BR rows): a step stages 2 * BC keys, group g takes tiles g, g + 2, ...; at the end
// group 1 hands its (m, l, o) to group 0 through shared memory, which merges and stores.
// It halves the serial chain of a row block (one wave of CTAs runs as long as its
// heaviest: B=1 H=16 1024² causal, 128 CTAs, the last rows' 16 key tiles) and doubles the
// warps an SM has to hide latency with.
// Keys past Lk read as zero and are masked; rows past Lq are computed but never stored.
// Config macros: HD (head dim; must equal D), BC (keys per tile), NWARPS (warps over the
// rows), PAIR, KSPLIT.
// Dynamic shared memory: (BR + 2 * KSPLIT * BC) * (HD + 8) * 2 bytes (KSPLIT's merge reuses it).

#include "adaptive_ptx.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef BC
#define BC 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef PAIR
#define PAIR 0
#endif
#ifndef KSPLIT
#define KSPLIT 1
#endif
#define MT 2                    // m16 tiles per warp
#define WR (16 * MT)            // query rows per warp
#define BR (WR * NWARPS)        // query rows per CTA
#define NTHREADS (NWARPS * KSPLIT * 32)
#define KT (KSPLIT * BC)        // keys staged a step: BC for each warp group
static_assert(KSPLIT == 1 || KSPLIT == 2, "one or two warp groups over the keys");
// The first key of a warp group's BC keys in the step starting at key j0. A group whose
// keys all lie past the CTA's last needed key computes them masked beside the other group
// (no branch: the step lasts as long either way). (A macro: with KSPLIT = 1 the kernel's
// text is flash2_mma's as measured; a variable naming j0 again changed ptxas' schedule.)
#if KSPLIT > 1
#define KEY0(j0) ((j0) + grp * BC)
#else
#define KEY0(j0) (j0)
#endif
#define LDS (HD + 8)            // padded rows: conflict-free ldmatrix and cp.async
#define NEG_INF (-__int_as_float(0x7f800000))

// ROWS rows of a [n, HD] matrix starting at row r0 into shared memory (row stride LDS);
// rows past n are zero-filled. 16-byte cp.async, NTHREADS threads.
template <int ROWS>
__device__ __forceinline__ void load_rows(T* dst, const T* __restrict__ src, int r0, int n) {
    static_assert(sizeof(T) == 2, "16-bit elements (offsets below are in bytes)");
    constexpr int RSTEP = NTHREADS / (HD / 8);             // rows per pass of the CTA
    static_assert(ROWS % RSTEP == 0, "tile rows must divide among the threads");
    const int rt = threadIdx.x / (HD / 8), col = (threadIdx.x % (HD / 8)) * 8;
    const T* s0 = src + (size_t)(r0 + rt) * HD + col;
    const unsigned d0 = smem_u32(dst + rt * LDS + col);
    #pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        const bool in = r0 + rt + i * RSTEP < n;
        cp_async16(d0 + i * RSTEP * LDS * 2, in ? (const void*)(s0 + (size_t)i * RSTEP * HD)
                                               : (const void*)src, in ? 16 : 0);
    }
}

// The sign bit of every element of the ROWS x HD tile that this thread's load_rows wrote.
template <int ROWS>
__device__ __forceinline__ void negate_rows(T* dst) {
    constexpr int RSTEP = NTHREADS / (HD / 8);
    const int rt = threadIdx.x / (HD / 8), col = (threadIdx.x % (HD / 8)) * 8;
    #pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        uint4* p = reinterpret_cast<uint4*>(dst + (rt + i * RSTEP) * LDS + col);
        uint4 x = *p;
        x.x ^= 0x80008000u; x.y ^= 0x80008000u; x.z ^= 0x80008000u; x.w ^= 0x80008000u;
        *p = x;
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
attention_flash2(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 T* __restrict__ out, int Lq, int Lk, float scale, int causal)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* q_s = reinterpret_cast<T*>(smem_raw);
    T* k_s = q_s + BR * LDS;
    T* v_s = k_s + KT * LDS;
#if KSPLIT > 1
    // warp: its rows (warp % NWARPS); grp: its half of each step's keys (warp / NWARPS)
    const int warp = (threadIdx.x >> 5) % NWARPS, grp = (threadIdx.x >> 5) / NWARPS;
    const int lane = threadIdx.x & 31;
#else
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#endif
    const int g = lane >> 2, t = lane & 3;
    const size_t bh = blockIdx.y;
    const T* qb = q + bh * Lq * HD;
    const T* kb = k + bh * Lk * HD;
    const T* vb = v + bh * Lk * HD;
    T* ob = out + bh * Lq * HD;
#if PAIR
    const int nb = (Lq + BR - 1) / BR, heavy = nb - 1 - (int)blockIdx.x;
    const int passes = heavy == (int)blockIdx.x ? 1 : 2;     // the middle block of an odd nb
#else
    const int passes = 1;
#endif
    for (int pass = 0; pass < passes; ++pass) {
#if PAIR
        const int mb = pass == 0 ? heavy : (int)blockIdx.x;
        if (pass) __syncthreads();          // every warp is done with the first block's q and K
#else
        // causal: the row blocks with the most key tiles are issued first
        const int mb = causal ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
#endif
        const int cta_row0 = mb * BR;
        const int row0 = cta_row0 + warp * WR;                   // this warp's first query row
        const int shift = Lk - Lq;                     // causal: row i sees j <= i + shift
        // Scores stay unscaled: max over raw s, then p = 2^(s·c - m·c) with one FFMA, where
        // c = |scale|·log2(e) > 0 (a negative scale negates the q tile instead, exactly; a zero
        // scale becomes a tiny one, so masked -inf · c stays -inf and the softmax stays uniform).
        const float c_log2 = fmaxf(fabsf(scale) * 1.4426950408889634f, 1e-30f);

        // Keys this CTA needs: all, or (causal) up to its last row's diagonal.
        int kv_end = Lk;
        if (causal) kv_end = max(0, min(Lk, cta_row0 + BR + shift));
        const int n_tiles = (kv_end + KT - 1) / KT;             // steps of KT keys

        load_rows<BR>(q_s, qb, cta_row0, Lq);
        if (n_tiles > 0) load_rows<KT>(k_s, kb, 0, Lk);
        cp_async_commit();
        if (scale < 0.f) {          // each thread flips the sign bit of the q chunks it loaded
            cp_async_wait<0>();
            negate_rows<BR>(q_s);   // the barrier at the top of the loop publishes them
        }

        float o[MT][HD / 8][4];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int i = 0; i < HD / 8; ++i)
                #pragma unroll
                for (int e = 0; e < 4; ++e) o[mt][i][e] = 0.f;
        float m_run[MT][2], l_run[MT][2];
        #pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            #pragma unroll
            for (int r = 0; r < 2; ++r) { m_run[mt][r] = NEG_INF; l_run[mt][r] = 0.f; }

        // per-lane ldmatrix addresses (bytes); tiles advance by constant offsets
        const unsigned q_warp = smem_u32(q_s + (warp * WR + (lane & 15)) * LDS + (lane >> 4) * 8);
#if KSPLIT > 1
        T* const k_g = k_s + grp * BC * LDS;                     // this group's keys
        T* const v_g = v_s + grp * BC * LDS;
#else
        T* const k_g = k_s;
        T* const v_g = v_s;
#endif
        const unsigned k_lane = smem_u32(k_g + ((lane & 7) + ((lane >> 4) << 3)) * LDS
                                         + ((lane >> 3) & 1) * 8);
        const unsigned v_lane = smem_u32(v_g + (lane & 15) * LDS + (lane >> 4) * 8);

        for (int jt = 0; jt < n_tiles; ++jt) {
            const int j0 = jt * KT;
            cp_async_wait<0>();
            __syncthreads();                       // K(j) (and q) visible; all done with V(j-1)
            load_rows<KT>(v_s, vb, j0, Lk);
            cp_async_commit();

            float s[MT][BC / 8][4];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                #pragma unroll
                for (int i = 0; i < BC / 8; ++i)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][i][e] = 0.f;
            #pragma unroll
            for (int ks = 0; ks < HD / 16; ++ks) {
                unsigned qa[MT][4];
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    ldmatrix_x4(qa[mt], q_warp + (mt * 16 * LDS + ks * 16) * 2);
                #pragma unroll
                for (int np = 0; np < BC / 16; ++np) {
                    unsigned bf[4];
                    ldmatrix_x4(bf, k_lane + (np * 16 * LDS + ks * 16) * 2);
                    #pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        mma16816(s[mt][2 * np], qa[mt], bf);
                        mma16816(s[mt][2 * np + 1], qa[mt], bf + 2);
                    }
                }
            }

            // mask, online softmax update, P to 16-bit A fragments (rows g and g + 8 per tile)
            const bool edge = (KEY0(j0) + BC > Lk) || (causal && KEY0(j0) + BC - 1 > row0 + shift);
            unsigned pk[MT][BC / 8][2];
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float mx[2] = {NEG_INF, NEG_INF};
                #pragma unroll
                for (int nt = 0; nt < BC / 8; ++nt) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float x = s[mt][nt][e];
                        if (edge) {
                            const int key = KEY0(j0) + nt * 8 + 2 * t + (e & 1);
                            const int row = row0 + mt * 16 + g + (e >> 1) * 8;
                            if (key >= Lk || (causal && key > row + shift)) x = NEG_INF;
                        }
                        s[mt][nt][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
                }
                float alpha[2];
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    const float m_new = fmaxf(m_run[mt][r], mx[r]);
                    const float m_use = m_new == NEG_INF ? 0.f : m_new;   // row fully masked so far
                    alpha[r] = ex2((m_run[mt][r] - m_use) * c_log2);
                    m_run[mt][r] = m_new;
                    mx[r] = -m_use * c_log2;            // p = 2^(s·c + mx)
                    l_run[mt][r] *= alpha[r];
                }
                #pragma unroll
                for (int nt = 0; nt < BC / 8; ++nt) {
                    const float p0 = ex2(fmaf(s[mt][nt][0], c_log2, mx[0]));
                    const float p1 = ex2(fmaf(s[mt][nt][1], c_log2, mx[0]));
                    const float p2 = ex2(fmaf(s[mt][nt][2], c_log2, mx[1]));
                    const float p3 = ex2(fmaf(s[mt][nt][3], c_log2, mx[1]));
                    l_run[mt][0] += p0 + p1;
                    l_run[mt][1] += p2 + p3;
                    pk[mt][nt][0] = pack2(p0, p1);
                    pk[mt][nt][1] = pack2(p2, p3);
                }
                // rescale the output only when some row's max moved (late tiles rarely move it)
                if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
                    #pragma unroll
                    for (int dt = 0; dt < HD / 8; ++dt) {
                        o[mt][dt][0] *= alpha[0]; o[mt][dt][1] *= alpha[0];
                        o[mt][dt][2] *= alpha[1]; o[mt][dt][3] *= alpha[1];
                    }
                }
            }

            cp_async_wait<0>();
            __syncthreads();                       // V(j) visible; every warp is done with K(j)
            if (jt + 1 < n_tiles) load_rows<KT>(k_s, kb, j0 + KT, Lk);
            cp_async_commit();

            #pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk) {
                #pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                    unsigned bf[4];
                    ldmatrix_x4_trans(bf, v_lane + (kk * 16 * LDS + dp * 16) * 2);
                    #pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const unsigned pf[4] = {pk[mt][2 * kk][0], pk[mt][2 * kk][1],
                                                pk[mt][2 * kk + 1][0], pk[mt][2 * kk + 1][1]};
                        mma16816(o[mt][2 * dp], pf, bf);
                        mma16816(o[mt][2 * dp + 1], pf, bf + 2);
                    }
                }
            }
        }
        cp_async_wait<0>();
#if KSPLIT > 1
        // Group 1 hands its (o, m, l) to group 0 lane for lane (a lane holds the same rows and
        // columns in both groups), float i of a lane at x[i * XS]; q, K and V are done with,
        // so their space holds it. Group 0 merges: m = max(m0, m1), each side scaled by
        // 2^((m_g - m)·c) (0 for a side that saw no key), then stores as one group would.
        {
            constexpr int XO = MT * (HD / 8) * 4, XS = NWARPS * 32;
            static_assert((XO + MT * 4) * XS * 4 <= (BR + 2 * KT) * LDS * 2,
                          "the merge fits in the kernel's shared memory");
            float* x = reinterpret_cast<float*>(smem_raw) + warp * 32 + lane;
            __syncthreads();                   // every warp is done with q, K and V
            if (grp == 1) {
                #pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    #pragma unroll
                    for (int dt = 0; dt < HD / 8; ++dt)
                        #pragma unroll
                        for (int e = 0; e < 4; ++e)
                            x[((mt * (HD / 8) + dt) * 4 + e) * XS] = o[mt][dt][e];
                    #pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        x[(XO + (mt * 2 + r) * 2) * XS] = m_run[mt][r];
                        x[(XO + (mt * 2 + r) * 2 + 1) * XS] = l_run[mt][r];
                    }
                }
            }
            __syncthreads();
            if (grp == 1) continue;            // group 0 stores
            #pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float a0[2], a1[2];
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float m1 = x[(XO + (mt * 2 + r) * 2) * XS];
                    const float l1 = x[(XO + (mt * 2 + r) * 2 + 1) * XS];
                    const float m = fmaxf(m_run[mt][r], m1);
                    const float mu = m == NEG_INF ? 0.f : m;
                    a0[r] = ex2((m_run[mt][r] - mu) * c_log2);
                    a1[r] = ex2((m1 - mu) * c_log2);
                    l_run[mt][r] = l_run[mt][r] * a0[r] + l1 * a1[r];
                }
                #pragma unroll
                for (int dt = 0; dt < HD / 8; ++dt)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e)
                        o[mt][dt][e] = o[mt][dt][e] * a0[e >> 1]
                                       + x[((mt * (HD / 8) + dt) * 4 + e) * XS] * a1[e >> 1];
            }
        }
#endif

        #pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            #pragma unroll
            for (int r = 0; r < 2; ++r) {
                float l = l_run[mt][r];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                const float inv = l > 0.f ? 1.f / l : 0.f;
                const int row = row0 + mt * 16 + g + r * 8;
                if (row >= Lq) continue;
                #pragma unroll
                for (int dt = 0; dt < HD / 8; ++dt) {
                    *reinterpret_cast<unsigned*>(ob + (size_t)row * HD + dt * 8 + 2 * t) =
                        pack2(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
                }
            }
        }
    }
}
