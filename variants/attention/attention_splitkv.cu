// attention, split-KV decode kernel (flash-decoding) for few query rows and long key/value
// caches, grouped-query heads read once: q [B, H, Lq, D], k and v [B, Hkv, Lk, D], G = H / Hkv.
// A CTA owns one (b, kv head, split of KPS keys) and all R = G * Lq query rows that read this
// kv head (row r is query head hkv * G + r / Lq, position r % Lq), so each k and v element is
// read from memory once. K/V tiles of BN keys are staged in shared memory by 16-byte cp.async,
// double-buffered (tile j + 1 loads while tile j is used). The rows form MT = ceil(R / 16)
// m16 tiles; each warp owns one m tile and a slice of the keys of every tile (KW = NWARPS / MT
// warps per m tile, chunks of 16 keys dealt round-robin): S = Q Kᵀ and O += P V on mma.sync
// tensor cores (fp32 accumulation), fp32 online softmax (running max and sum per row, in
// the log2 domain: x = s · scale · log2(e)), masked keys as -inf, fully masked rows give 0.
// The warps of an m tile merge through shared memory; with one split the CTA writes out,
// otherwise it writes (O, m, l) of its rows to the workspace and the last CTA of the
// (b, kv head) (an atomic counter, reset to 0 by that CTA) merges the splits and writes out.
// Causal: bottom-right aligned, row i sees keys j <= i + Lk - Lq (rows may see different
// counts). Padding mask (MASKED = 1): as attention_splitkv2.cu's (mask, mask_sb, mask_sh,
// mask_bool; boolean or additive, broadcast over batch and heads by zero strides); MASKED = 0
// reads none. Config macros: HD (head dim; must equal D), KPS (keys per split), BN (keys per
// staged tile), NWARPS, MASKED. Dynamic shared memory: max(4 * BN * (HD + 8) * 2, NWARPS *
// (16 * HD + 32) * 4) bytes. Workspace (floats): B*Hkv*S*R*HD partial outputs, then
// B*Hkv*S*R (m, l) pairs, then B*Hkv counters (S = ceil_div(Lk, KPS) splits). The tile copy,
// the warp step's softmax and P V, the warp partials and the split merge are in
// adaptive_splitkv.cuh (shared with attention_splitkv2.cu).

#include "adaptive_ptx.cuh"

#ifndef HD
#define HD 128
#endif
#ifndef KPS
#define KPS 256
#endif
#ifndef BN
#define BN 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#define NTHREADS (NWARPS * 32)
#if NWARPS >= 8                  // 8 warps: two CTAs an SM (at most 128 registers, no spill)
#define LAUNCH_BOUNDS __launch_bounds__(NTHREADS, 2)
#else
#define LAUNCH_BOUNDS __launch_bounds__(NTHREADS)
#endif
#define MB (HD >= 128 ? 8 : 4)  // splits merged a step by the last CTA (registers: 6 a split)

#include "adaptive_splitkv.cuh"     // LDS, CW_STRIDE, NEG_INF; load_tile, softmax_step, ...
#define STAGE_ELEMS (BN * LDS)

extern "C" __global__ void LAUNCH_BOUNDS
attention_splitkv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  T* __restrict__ out, int Lq, int Lk, int H, int Hkv, float scale,
                  int causal, float* __restrict__ workspace, const void* __restrict__ mask,
                  int mask_sb, int mask_sh, int mask_bool)
{
    static_assert(sizeof(T) == 2, "16-bit elements");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned last;
    T* k_s = reinterpret_cast<T*>(smem_raw);               // [2][BN][LDS]
    T* v_s = k_s + 2 * STAGE_ELEMS;                        // [2][BN][LDS]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int G = H / Hkv, R = G * Lq;
    const int MT = (R + 15) >> 4;                          // m16 tiles (<= NWARPS: requires)
    const int KW = NWARPS / MT;                            // warps per m tile
    const int mtile = warp / KW, kslice = warp % KW;
    const bool active = mtile < MT;
    const int split = blockIdx.x, nsplit = gridDim.x;
    const int bk = blockIdx.y;                             // b * Hkv + kv head
    const int b = bk / Hkv, hkv = bk % Hkv;
    const int j_beg = split * KPS, j_end = min(Lk, j_beg + KPS);
    const int n_tiles = (j_end - j_beg + BN - 1) / BN;
    const T* kb = k + (size_t)bk * Lk * HD;
    const T* vb = v + (size_t)bk * Lk * HD;
    const float sl = scale * 1.4426950408889634f;          // logits in the log2 domain

    const unsigned k_base = smem_u32(k_s), v_base = smem_u32(v_s);
    load_tile(k_base, kb, j_beg, j_end);
    load_tile(v_base, vb, j_beg, j_end);
    cp_async_commit();

    // this thread's two rows (g and g + 8 of the warp's m tile): q fragments and key limits
    unsigned qa[HD / 16][4];
    int lim[2];
    int mrow[2] = {0, 0};
    #pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
        const int r = mtile * 16 + g + 8 * r2;
        const bool valid = active && r < R;
        const int i = valid ? r % Lq : 0;
        const T* qr = q + (((size_t)b * H + (size_t)hkv * G + (valid ? r / Lq : 0)) * Lq + i) * HD;
        // last visible key (inclusive), capped by this split's end
        lim[r2] = valid ? min(j_end - 1, causal ? i + Lk - Lq : Lk - 1) : -1;
#if MASKED
        if (valid)
            mrow[r2] = mask_row(b, hkv * G + r / Lq, i, Lk, mask_sb, mask_sh);
#endif
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            qa[ks][r2] = valid ? *reinterpret_cast<const unsigned*>(qr + ks * 16 + 2 * t) : 0u;
            qa[ks][2 + r2] = valid ? *reinterpret_cast<const unsigned*>(qr + ks * 16 + 8 + 2 * t)
                                   : 0u;
        }
    }

    float o[HD / 8][4];
    zero_frags(o);
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};

    // per-lane ldmatrix offsets (bytes) within a stage
    const unsigned k_lane = k_lane_offset(lane), v_lane = v_lane_offset(lane);

    for (int jt = 0; jt < n_tiles; ++jt) {
        const int j0 = j_beg + jt * BN;
        const unsigned st = (jt & 1) * STAGE_ELEMS * 2;
        if (jt + 1 < n_tiles) {
            const unsigned nx = ((jt + 1) & 1) * STAGE_ELEMS * 2;
            load_tile(k_base + nx, kb, j0 + BN, j_end);
            load_tile(v_base + nx, vb, j0 + BN, j_end);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();                       // tile jt visible to every warp

        if (active) {
            for (int c = kslice; c < BN / 16 && j0 + c * 16 < j_end; c += KW) {
                const int jc = j0 + c * 16;
                float s[2][4];
                zero_frags(s);
                #pragma unroll
                for (int ks = 0; ks < HD / 16; ++ks)
                    qk_slice<1>(s, qa[ks], k_base + st + k_lane, c * 16, ks);
                unsigned pf[1][4];
                softmax_step<1>(s, jc, t, lim, sl, m_run, l_run, pf, o, mrow, mask, mask_bool);
                pv_step<1>(o, pf, v_base + st + v_lane, c * 16);
            }
        }
        __syncthreads();                       // every warp is done with stage jt & 1
    }
    cp_async_wait<0>();

    // merge the KW warps of each m tile through shared memory (the staging area is free)
    float* cw = reinterpret_cast<float*>(smem_raw);
    if (active) store_warp_partial(cw + warp * CW_STRIDE, o, m_run, l_run, g, t);
    __syncthreads();

    const size_t part = (size_t)bk * nsplit + split;       // this CTA's partial block
    float* ws_o = workspace;
    float* ws_ml = workspace + (size_t)gridDim.y * nsplit * R * HD;
    unsigned* counters = reinterpret_cast<unsigned*>(ws_ml + (size_t)gridDim.y * nsplit * R * 2);
    const size_t out_row0 = ((size_t)b * H + (size_t)hkv * G) * Lq;   // rows r of out in order
    for (int idx = threadIdx.x; idx < R * HD; idx += NTHREADS) {
        const int r = idx / HD, d = idx % HD;
        const int mt = r >> 4, rr = r & 15;
        float m_tot = NEG_INF;
        for (int w = 0; w < KW; ++w)
            m_tot = fmaxf(m_tot, cw[(mt * KW + w) * CW_STRIDE + 16 * HD + rr]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < KW; ++w) {
            const float* src = cw + (mt * KW + w) * CW_STRIDE;
            const float mw = src[16 * HD + rr];
            const float f = mw == NEG_INF ? 0.f : ex2(mw - m_tot);
            num += src[rr * HD + d] * f;
            den += src[16 * HD + 16 + rr] * f;
        }
        if (nsplit == 1) {
            out[(out_row0 + r) * HD + d] = from_f32<T>(den > 0.f ? num / den : 0.f);
        } else {
            ws_o[(part * R + r) * HD + d] = num;
            if (d == 0) { ws_ml[(part * R + r) * 2] = m_tot; ws_ml[(part * R + r) * 2 + 1] = den; }
        }
    }
    if (nsplit == 1) return;

    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[bk], 1u) == (unsigned)(nsplit - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    // the last CTA of this (b, kv head): merge the splits, 4 columns a thread, MB splits a
    // step (their loads issued together: one L2 round trip a step, not one a split)
    for (int idx = threadIdx.x; idx < R * (HD / 4); idx += NTHREADS) {
        const int r = idx / (HD / 4), d = (idx % (HD / 4)) * 4;
        const size_t p0 = (size_t)bk * nsplit * R + r;   // split 0's partial of row r
        float m_tot = NEG_INF, den = 0.f;
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        merge_splits<MB>(reinterpret_cast<const float2*>(ws_ml) + p0,
                         reinterpret_cast<const float4*>(ws_o + p0 * HD + d), R, nsplit, 0, MB,
                         m_tot, den, num);
        store_out4(out + (out_row0 + r) * HD + d, num, den);
    }
    if (threadIdx.x == 0) counters[bk] = 0u;
}
