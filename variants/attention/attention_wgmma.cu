// attention on Hopper's warpgroup tensor cores (wgmma; float16 / bfloat16, sm_90a):
// out[b, h] = softmax(q kᵀ · scale [+ causal mask]) v for q [B, H, Lq, D], k and v
// [B, Hkv, Lk, D]: query head h reads key/value head h / (H / Hkv) (grouped-query attention
// as it arrives, no repeated copy of k and v).
// A CTA owns BM = 64 * NWG query rows of one (b, h); each warpgroup (128 threads) owns 64 of
// them and issues S = q kᵀ as one m64nBN wgmma chain with both operands in shared memory,
// then O += P v as one m64nHD chain with P from registers (the S accumulators packed to
// 16 bits: the accumulator layout is the A-fragment layout) and v read transposed (MN-major)
// from its tile as stored. q, k and v tiles are stored 128-byte swizzled (adaptive_wgmma.cuh),
// 1024-byte aligned; K/V tiles of BN keys are double-buffered by cp.async: tile j + 1 loads
// while tile j is computed. Online softmax in fp32 in the log2 domain (ex2.approx), scale
// folded in as in attention_flash2.cu (a negative scale negates the q tile).
// PIPE = 1 overlaps a warpgroup's softmax with its tensor cores as FlashAttention-3 does:
// S(j) and P(j - 1) v(j - 1) are issued together, and the softmax of S(j) runs while the
// second product does (P in two register halves; K loaded a tile ahead of V).
// Causal: the mask is bottom-right aligned (row i sees keys j <= i + Lk - Lq), key tiles past
// a CTA's last diagonal are skipped and the heaviest row blocks are issued first.
// Keys past Lk read as zero and are masked; rows past Lq are computed but never stored; a row
// that sees no key gives zeros.
// MASKED = 1 reads a padding mask as the split-KV kernels do (boolean or additive,
// [B or 1, 1 or H, Lq, Lk]: mask, mask_sb, mask_sh, mask_bool), each key's term added to its
// log2-domain logit, and leaves out the key tiles before the first and past the last one a
// CTA's rows see in a boolean mask (a mask holding the causal triangle and a batch's left
// padding, as transformers passes a padded prefill, then costs what causal does; the
// heaviest row blocks go first here too); 0: the mask arguments are not read.
// Config macros: HD (head dim; must equal D), BN (keys per tile), NWG (warpgroups a CTA),
// PIPE, MASKED.
// Dynamic shared memory: (BM + 4 * BN) * HD * 2 + 1024 bytes (the 1024: alignment slack).

#include "adaptive_ptx.cuh"
#include "adaptive_wgmma.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef NWG
#define NWG 1
#endif
#ifndef PIPE
#define PIPE 0
#endif
#ifndef MASKED
#define MASKED 0
#endif
#define BM (64 * NWG)               // query rows per CTA
#define NTHREADS (128 * NWG)
#define Q_BYTES (BM * HD * 2)
#define KV_BYTES (BN * HD * 2)      // one K or V tile
#define NEG_INF (-__int_as_float(0x7f800000))
static_assert(HD == 64 || HD == 128, "head dim 64 or 128");
static_assert(BN == 64 || BN == 128, "64 or 128 keys a tile");

// The byte offset of 16-byte chunk c (0 .. HD / 8 - 1) of row r in a swizzled tile of ROWS
// rows: the row's 64-element half c / 8 is a block of ROWS 128-byte rows of its own.
template <int ROWS>
__device__ __forceinline__ unsigned swizzled(int r, int c) {
    return (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// ROWS rows of a [n, HD] matrix starting at row r0 into the swizzled tile at shared address
// dst; rows past n are zero-filled. 16-byte cp.async, NTHREADS threads.
template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const T* __restrict__ src, int r0,
                                          int n) {
    static_assert(sizeof(T) == 2, "16-bit elements (offsets below are in bytes)");
    constexpr int CHUNKS = ROWS * HD / 8;
    static_assert(CHUNKS % NTHREADS == 0, "tile chunks must divide among the threads");
    #pragma unroll
    for (int i = 0; i < CHUNKS / NTHREADS; ++i) {
        const int idx = i * NTHREADS + (int)threadIdx.x;
        const int r = idx / (HD / 8), c = idx % (HD / 8);
        const bool in = r0 + r < n;
        cp_async16(dst + swizzled<ROWS>(r, c),
                   in ? (const void*)(src + (size_t)(r0 + r) * HD + c * 8) : (const void*)src,
                   in ? 16 : 0);
    }
}

// The sign bit of every element of the ROWS x HD tile that this thread's load_tile wrote.
template <int ROWS>
__device__ __forceinline__ void negate_tile(unsigned char* tile) {
    constexpr int CHUNKS = ROWS * HD / 8;
    #pragma unroll
    for (int i = 0; i < CHUNKS / NTHREADS; ++i) {
        const int idx = i * NTHREADS + (int)threadIdx.x;
        uint4* p = reinterpret_cast<uint4*>(tile + swizzled<ROWS>(idx / (HD / 8), idx % (HD / 8)));
        uint4 x = *p;
        x.x ^= 0x80008000u; x.y ^= 0x80008000u; x.z ^= 0x80008000u; x.w ^= 0x80008000u;
        *p = x;
    }
}

#if MASKED
// The padding mask's term for element e of the mask, in the log2 domain: boolean (1 byte,
// nonzero: seen) 0 or -inf; additive (T) the value times log2(e) (as the split-KV kernels'
// mask_logit, adaptive_splitkv.cuh).
__device__ __forceinline__ float mask_term(const void* mask, size_t e, int is_bool) {
    if (is_bool) return static_cast<const unsigned char*>(mask)[e] ? 0.f : NEG_INF;
    return to_f32(static_cast<const T*>(mask)[e]) * 1.4426950408889634f;
}
#endif

// The online softmax of one tile's scores s (this thread's BN / 2 of rows g and g + 8 of its
// warp's 16, keys from j0): masked, m and l updated, P packed to 16-bit A fragments (the
// accumulator layout is the A layout: keys 16 kk .. 16 kk + 15 are pk[kk]); alpha: the
// factors the output's rows are to be rescaled by (rescale_rows).
__device__ __forceinline__ void online_softmax(float* s, unsigned (*pk)[4], float* alpha,
                                               float* m_run, float* l_run, int j0, int row0,
                                               int g, int t, int Lk, int causal, int shift,
                                               float c_log2, const void* mask,
                                               const size_t* mrow, int mask_bool) {
#if MASKED
    // every key's mask term is added to its logit: the scores go to the log2 domain here
    // (x = s·c + term) and the max and exponents below read them with c = 1
    const bool edge = true;
#else
    const bool edge = (j0 + BN > Lk) || (causal && j0 + BN - 1 > row0 + shift);
#endif
    float mx[2] = {NEG_INF, NEG_INF};
    #pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            float x = s[nt * 4 + e];
            if (edge) {
                const int key = j0 + nt * 8 + 2 * t + (e & 1);
                const int row = row0 + g + (e >> 1) * 8;
                if (key >= Lk || (causal && key > row + shift)) x = NEG_INF;
#if MASKED
                else x = x * c_log2 + mask_term(mask, mrow[e >> 1] + key, mask_bool);
#endif
            }
            s[nt * 4 + e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
    }
#if MASKED
    c_log2 = 1.f;              // x is in the log2 domain already
#endif
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m_run[r], mx[r]);
        const float m_use = m_new == NEG_INF ? 0.f : m_new;   // row fully masked so far
        alpha[r] = ex2((m_run[r] - m_use) * c_log2);
        m_run[r] = m_new;
        mx[r] = -m_use * c_log2;            // p = 2^(s·c + mx)
        l_run[r] *= alpha[r];
    }
    #pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
        const float p0 = ex2(fmaf(s[nt * 4 + 0], c_log2, mx[0]));
        const float p1 = ex2(fmaf(s[nt * 4 + 1], c_log2, mx[0]));
        const float p2 = ex2(fmaf(s[nt * 4 + 2], c_log2, mx[1]));
        const float p3 = ex2(fmaf(s[nt * 4 + 3], c_log2, mx[1]));
        l_run[0] += p0 + p1;
        l_run[1] += p2 + p3;
        pk[nt >> 1][(nt & 1) * 2 + 0] = pack2(p0, p1);
        pk[nt >> 1][(nt & 1) * 2 + 1] = pack2(p2, p3);
    }
}

// The output's rows g and g + 8 times alpha, skipped where no row's max moved in the warp
// (late tiles rarely move it).
__device__ __forceinline__ void rescale_rows(float* o, const float* alpha) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
        #pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            o[dt * 4 + 0] *= alpha[0]; o[dt * 4 + 1] *= alpha[0];
            o[dt * 4 + 2] *= alpha[1]; o[dt * 4 + 3] *= alpha[1];
        }
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS)
attention_wgmma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                T* __restrict__ out, int Lq, int Lk, int H, int Hkv, float scale, int causal,
                const void* __restrict__ mask, int mask_sb, int mask_sh, int mask_bool)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the swizzle repeats every 8 rows of 128 bytes: tiles start 1024-byte aligned
    const unsigned raw = smem_u32(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned q_s = base, k_s = base + Q_BYTES, v_s = k_s + 2 * KV_BYTES;
    const int wg = (int)threadIdx.x >> 7, warp = ((int)threadIdx.x >> 5) & 3;
    const int lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t bh = blockIdx.y;                      // b * H + h
    const size_t bkv = bh / H * Hkv + bh % H / (H / Hkv);   // b * Hkv + its kv head
    const T* qb = q + bh * Lq * HD;
    const T* kb = k + bkv * Lk * HD;
    const T* vb = v + bkv * Lk * HD;
    T* ob = out + bh * Lq * HD;
    // causal (or masked: a mask holding the causal triangle, below): the row blocks with the
    // most key tiles are issued first
    const int mb = (causal || MASKED) ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int cta_row0 = mb * BM;
    const int row0 = cta_row0 + wg * 64 + warp * 16;   // this warp's rows: row0 + g, + 8
    const int shift = Lk - Lq;                         // causal: row i sees j <= i + shift
    // scores stay unscaled: p = 2^(s·c - m·c), c = |scale|·log2(e) (attention_flash2.cu)
    const float c_log2 = fmaxf(fabsf(scale) * 1.4426950408889634f, 1e-30f);
    // the mask rows of this thread's two query rows (rows past Lq, computed and never
    // stored, read the last row's: the mask has Lq rows)
    size_t mrow[2] = {0, 0};
#if MASKED
    for (int r = 0; r < 2; ++r)
        mrow[r] = (size_t)(bh / H) * mask_sb + (size_t)(bh % H) * mask_sh
                  + (size_t)min(row0 + g + 8 * r, Lq - 1) * Lk;
#endif

    int kv_end = Lk;
    if (causal) kv_end = max(0, min(Lk, cta_row0 + BM + shift));
    int n_tiles = (kv_end + BN - 1) / BN;
    int t0 = 0;                // the first key tile computed
#if MASKED
    // A masked prefill arrives not causal (transformers' mask holds the triangle, and a
    // left-padded batch's hides its padding): the key tiles before the first and past the
    // last one any of this CTA's rows sees in a boolean mask are left out, found from the
    // ends (16-byte loads where the mask's rows are Lk % 16 == 0 bytes, as a padded batch's,
    // else byte loads; an additive mask: every tile). Exact: a left-out tile is hidden from
    // every stored row.
    if (mask_bool) {
        const unsigned char* mb_rows = static_cast<const unsigned char*>(mask)
            + (size_t)(bh / H) * mask_sb + (size_t)(bh % H) * mask_sh;
        const bool wide = (Lk & 15) == 0 && (reinterpret_cast<size_t>(mask) & 15) == 0;
        auto seen_in = [&](int tile) {   // whether any stored row of the CTA sees a key of it
            const int j0 = tile * BN;
            int seen = 0;
            if (wide) {
                for (int idx = threadIdx.x; idx < BM * (BN / 16); idx += NTHREADS) {
                    const int row = cta_row0 + idx / (BN / 16);
                    const int key = j0 + idx % (BN / 16) * 16;
                    if (row < Lq && key < Lk) {
                        const uint4 m = *reinterpret_cast<const uint4*>(
                            mb_rows + (size_t)row * Lk + key);
                        seen |= (m.x | m.y | m.z | m.w) != 0u;
                    }
                }
            } else {
                for (int idx = threadIdx.x; idx < BM * BN; idx += NTHREADS) {
                    const int row = cta_row0 + idx / BN, key = j0 + idx % BN;
                    if (row < Lq && key < Lk) seen |= mb_rows[(size_t)row * Lk + key];
                }
            }
            return __syncthreads_or(seen) != 0;
        };
        while (n_tiles > 0 && !seen_in(n_tiles - 1)) --n_tiles;
        while (t0 < n_tiles && !seen_in(t0)) ++t0;
    }
#endif

    // a tile's K and V buffers are those of its index's parity
    load_tile<BM>(q_s, qb, cta_row0, Lq);
    if (t0 < n_tiles) {
        load_tile<BN>(k_s + (t0 & 1) * KV_BYTES, kb, t0 * BN, Lk);
        load_tile<BN>(v_s + (t0 & 1) * KV_BYTES, vb, t0 * BN, Lk);
    }
#if PIPE
    if (t0 + 1 < n_tiles)      // K runs a tile ahead
        load_tile<BN>(k_s + ((t0 + 1) & 1) * KV_BYTES, kb, (t0 + 1) * BN, Lk);
#endif
    cp_async_commit();
    if (scale < 0.f) {          // each thread flips the sign bit of the q chunks it loaded
        cp_async_wait<0>();
        negate_tile<BM>(smem_raw + (q_s - raw));   // the loop's first barrier publishes them
    }

    float o[HD / 2];
    #pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};
    const unsigned q_wg = q_s + wg * 64 * 128;         // this warpgroup's 64 rows of q
    // the pieces of a step: S(j) = q K(j)ᵀ issued into acc; O += P V(j) issued with P in p
    auto issue_s = [&](float* acc, int j) {
        const unsigned k_b = k_s + (j & 1) * KV_BYTES;
        #pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
        wgmma_hold<BN / 2>(acc);
        wgmma_fence();
        // HD / 16 k-steps, each 32 bytes further along a 128-byte row of its 64-column half
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            const unsigned half = ks >> 2, col = (ks & 3) * 32;
            wgmma_ss<BN>(acc, wgmma_desc(q_wg + half * (BM * 128) + col, 16, 1024),
                         wgmma_desc(k_b + half * (BN * 128) + col, 16, 1024));
        }
        wgmma_commit();
    };
    auto issue_pv = [&](unsigned (*p)[4], int j) {
        // BN / 16 k-steps of 16 keys (2048 bytes of the tile); v's two 64-column halves
        // (HD = 128) are LBO = BN * 128 bytes apart, its 8-key groups 1024
        const unsigned v_b = v_s + (j & 1) * KV_BYTES;
        wgmma_hold<HD / 2>(o);
        wgmma_hold<BN / 4>(&p[0][0]);
        wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            wgmma_rs_tn<HD>(o, p[kk], wgmma_desc(v_b + kk * 2048, BN * 128, 1024));
        wgmma_commit();
    };
    float s[BN / 2], alpha[2];
    auto softmax = [&](unsigned (*p)[4], int j0) {
        online_softmax(s, p, alpha, m_run, l_run, j0, row0, g, t, Lk, causal, shift, c_log2,
                       mask, mrow, mask_bool);
    };

#if PIPE
    // FlashAttention-3's overlap within a warpgroup: step j issues S(j) and O += P(j - 1) V(j - 1)
    // together, waits for S(j) alone and computes its softmax (P(j) into the other half of pk:
    // P(j - 1)'s registers are still being read) while the tensor cores run P(j - 1) V(j - 1),
    // then waits for that and rescales the output. K runs a tile ahead of V: step j loads
    // K(j + 1) and V(j), into the buffers S(j - 1) and P(j - 2) V(j - 2) are done with.
    unsigned pk[2][BN / 16][4];
    if (t0 < n_tiles) {
        cp_async_wait<0>();
        fence_proxy_async();   // this thread's copies (and q's negation) seen by the wgmma
        __syncthreads();       // everyone's: q, K(t0), K(t0 + 1) and V(t0)
        issue_s(s, t0);
        wgmma_wait<0>();
        wgmma_hold<BN / 2>(s);
        softmax(pk[0], t0 * BN);   // o is zero: nothing to rescale
    }
    // one step; P(j - 1) in prev, P(j) into next (each pk half named at compile time: an
    // index computed at run time would put pk in local memory)
    auto step = [&](int jt, unsigned (*prev)[4], unsigned (*next)[4]) {
        if (jt + 1 < n_tiles) load_tile<BN>(k_s + ((jt + 1) & 1) * KV_BYTES, kb, (jt + 1) * BN, Lk);
        load_tile<BN>(v_s + (jt & 1) * KV_BYTES, vb, jt * BN, Lk);
        cp_async_commit();
        issue_s(s, jt);
        issue_pv(prev, jt - 1);
        wgmma_wait<1>();                     // S(j)
        wgmma_hold<BN / 2>(s);
        softmax(next, jt * BN);
        wgmma_wait<0>();                     // P(j - 1) V(j - 1)
        wgmma_hold<HD / 2>(o);
        wgmma_hold<BN / 4>(&prev[0][0]);     // P(j - 1)'s registers read by then
        rescale_rows(o, alpha);
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();       // K(j + 1), V(j) landed; everyone done with K(j), V(j - 1)
    };
    for (int jt = t0 + 1; jt < n_tiles; jt += 2) {   // P(t0) in pk[0]
        step(jt, pk[0], pk[1]);
        if (jt + 1 < n_tiles) step(jt + 1, pk[1], pk[0]);
    }
    if (t0 < n_tiles) {        // the last tile's P v
        if ((n_tiles - 1 - t0) & 1) issue_pv(pk[1], n_tiles - 1);
        else issue_pv(pk[0], n_tiles - 1);
        wgmma_wait<0>();
        wgmma_hold<HD / 2>(o);
        wgmma_hold<BN / 4>(&pk[0][0][0]);
        wgmma_hold<BN / 4>(&pk[1][0][0]);
    }
#else
    unsigned pk[BN / 16][4];
    for (int jt = t0; jt < n_tiles; ++jt) {
        const int j0 = jt * BN, buf = jt & 1;
        cp_async_wait<0>();
        fence_proxy_async();   // this thread's copies (and q's negation) seen by the wgmma
        __syncthreads();       // everyone's; every warpgroup is done with tile jt - 1
        if (jt + 1 < n_tiles) {
            load_tile<BN>(k_s + (buf ^ 1) * KV_BYTES, kb, j0 + BN, Lk);
            load_tile<BN>(v_s + (buf ^ 1) * KV_BYTES, vb, j0 + BN, Lk);
        }
        cp_async_commit();
        issue_s(s, jt);
        wgmma_wait<0>();
        wgmma_hold<BN / 2>(s);
        softmax(pk, j0);
        rescale_rows(o, alpha);
        issue_pv(pk, jt);
        wgmma_wait<0>();
        wgmma_hold<HD / 2>(o);
        wgmma_hold<BN / 4>(&pk[0][0]);   // P's registers stay P's until the wgmma read them
    }
#endif

    #pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int row = row0 + g + r * 8;
        if (row >= Lq) continue;
        #pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            *reinterpret_cast<unsigned*>(ob + (size_t)row * HD + dt * 8 + 2 * t) =
                pack2(o[dt * 4 + 2 * r] * inv, o[dt * 4 + 2 * r + 1] * inv);
        }
    }
}
