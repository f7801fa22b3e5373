// attention, split-KV decode kernel with a deep K/V pipeline and a short merge (flash-decoding
// for few query rows and long key/value caches, grouped-query heads read once per CTA):
// q [B, H, Lq, D], k and v [B, Hkv, Lk, D], G = H / Hkv, R = G * Lq rows read a kv head (row
// r is query head hkv * G + r / Lq, position r % Lq). A CTA owns one (b, kv head, split of KPS
// keys, group of RB rows): blockIdx.x = split * RG + row group (RG = ceil_div(R, RB); the row
// groups of a split run side by side, so a K/V tile read by one is still in L2 for the
// others). Against splitkv_mma (attention_splitkv.cu) it cuts the serial latency of a CTA:
//   * STAGES-deep cp.async ring: q's rows (to shared memory; A fragments by ldmatrix, no q
//     registers held) and the first STAGES - 1 tiles are issued together, and tile
//     j + STAGES - 1 is issued as tile j is consumed (one barrier a tile);
//   * a warp step covers KC keys (16 or 32: with 32, four independent score chains per warp);
//     the rows' m16 tiles (MT) are shared by KW = NWARPS / MT warps, chunks dealt round-robin;
//   * the split's partial is published by one fence and one atomic (thread 0, after the
//     barrier), and the last CTA of a (b, kv head, row group) merges the splits with MB = 16
//     splits' loads in flight a thread (one L2 round trip for up to 16 splits; threads the
//     rows leave over take further steps of 16, combined in shared memory);
//   * RB < R spreads large row counts (speculative decode) over RG CTAs a split: each merges
//     its own rows (RG last CTAs in parallel, not one merging every row).
// Softmax in fp32, log2 domain (x = s * scale * log2(e)), masked keys -inf, fully masked rows
// give 0. Causal: bottom-right aligned, row i sees keys j <= i + Lk - Lq. Padding mask
// (MASKED = 1): mask [B or 1, 1 or H, Lq, Lk], boolean (1 byte, nonzero: seen) or additive in
// T, row (b, h, i) at element b * mask_sb + h * mask_sh + i * Lk (strides 0 where broadcast);
// a hidden key is -inf as a causally masked one, an additive value joins the logit (its log2
// e multiple); it combines with causal. MASKED = 0 reads no mask argument (null): the code is
// that of the kernel before masks. Config macros: HD (head dim; must equal D), KPS (keys per
// split), BN (keys per staged tile), NWARPS, STAGES (tiles in the ring), KC (keys a warp
// step), RB (rows per CTA, a multiple of 16), MASKED (0 or 1). Dynamic shared memory:
// max((STAGES * 2 * BN + QR) * (HD + 8) * 2, NWARPS * (16 * HD + 32) * 4) bytes, QR = 16 *
// ceil_div(min(R, RB), 16) rows of q after the ring (sized by the shape: decode's few rows
// leave room for a second CTA an SM). Workspace (floats, S =
// ceil_div(Lk, KPS) splits): B*Hkv*S*R*HD partial outputs, then B*Hkv*S*R (m, l) pairs, then
// B*Hkv*RG counters (each reset to 0 by the CTA that merges). The tile copy, the warp step's
// softmax and P V, the warp partials and the split merge are in adaptive_splitkv.cuh (shared
// with attention_splitkv.cu).

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
#ifndef STAGES
#define STAGES 3
#endif
#ifndef KC
#define KC 16
#endif
#ifndef RB
#define RB 256
#endif
#define NTHREADS (NWARPS * 32)
#if NWARPS >= 16                 // 512 threads: 128 registers a thread is the SM's file
#define LAUNCH_BOUNDS __launch_bounds__(NTHREADS, 1)
#elif NWARPS >= 8                // two CTAs an SM (at most 128 registers, no spill)
#define LAUNCH_BOUNDS __launch_bounds__(NTHREADS, 2)
#else
#define LAUNCH_BOUNDS __launch_bounds__(NTHREADS)
#endif
#define NH (KC / 16)              // 16-key halves of a warp step
#define MB 16                     // splits whose loads a merging thread has in flight

#include "adaptive_splitkv.cuh"   // LDS, CW_STRIDE, NEG_INF; load_tile, softmax_step, ...
#define STAGE_BYTES (BN * LDS * 2)

static_assert(KC == 16 || KC == 32, "a warp step is 16 or 32 keys");
static_assert(BN % KC == 0 && STAGES >= 2, "tiles hold whole warp steps; two stages at least");
static_assert(RB % 16 == 0, "row groups of whole m16 tiles");

extern "C" __global__ void LAUNCH_BOUNDS
attention_splitkv2(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   T* __restrict__ out, int Lq, int Lk, int H, int Hkv, float scale,
                   int causal, float* __restrict__ workspace, const void* __restrict__ mask,
                   int mask_sb, int mask_sh, int mask_bool)
{
    static_assert(sizeof(T) == 2, "16-bit elements");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int G = H / Hkv, R = G * Lq;
    const int RG = (R + RB - 1) / RB;                      // row groups (CTAs a split)
    const int rgrp = blockIdx.x % RG, split = blockIdx.x / RG, nsplit = gridDim.x / RG;
    const int r0 = rgrp * RB, RC = min(RB, R - r0);        // this CTA's rows [r0, r0 + RC)
    const int MT = (RC + 15) >> 4;                         // m16 tiles (<= NWARPS: requires)
    const int KW = NWARPS / MT;                            // warps per m tile
    const int mtile = warp / KW, kslice = warp % KW;
    const bool active = mtile < MT;
    const int bk = blockIdx.y;                             // b * Hkv + kv head
    const int b = bk / Hkv, hkv = bk % Hkv;
    const int j_beg = split * KPS, j_end = min(Lk, j_beg + KPS);
    const int n_tiles = (j_end - j_beg + BN - 1) / BN;
    const T* kb = k + (size_t)bk * Lk * HD;
    const T* vb = v + (size_t)bk * Lk * HD;
    const float sl = scale * 1.4426950408889634f;          // logits in the log2 domain

    // the ring: stage s holds K at s * 2 * STAGE_BYTES, V after it; q's rows of this CTA (one
    // contiguous block of q) follow the ring. q and the first STAGES - 1 tiles go out
    // together, each tile its own commit group (empty ones too: the wait below counts groups)
    const unsigned ring = smem_u32(smem_raw), q_base = ring + STAGES * 2 * STAGE_BYTES;
    const size_t row0 = ((size_t)b * H + (size_t)hkv * G) * Lq + r0;   // rows r of q, out
    for (int idx = threadIdx.x; idx < MT * 16 * (HD / 8); idx += NTHREADS) {
        const int rl = idx / (HD / 8), col = (idx % (HD / 8)) * 8;
        const bool in = rl < RC;
        cp_async16(q_base + (rl * LDS + col) * 2,
                   in ? (const void*)(q + (row0 + rl) * HD + col) : (const void*)q, in ? 16 : 0);
    }
    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles) {
            load_tile(ring + s * 2 * STAGE_BYTES, kb, j_beg + s * BN, j_end);
            load_tile(ring + s * 2 * STAGE_BYTES + STAGE_BYTES, vb, j_beg + s * BN, j_end);
        }
        cp_async_commit();
    }

    // the last visible key (inclusive) of this thread's two rows (g and g + 8 of the warp's
    // m tile), capped by this split's end; with a mask, the rows' mask rows
    int lim[2];
    int mrow[2] = {0, 0};
    #pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
        const int rl = mtile * 16 + g + 8 * r2;
        const int i = (r0 + rl) % Lq;
        lim[r2] = active && rl < RC ? min(j_end - 1, causal ? i + Lk - Lq : Lk - 1) : -1;
#if MASKED
        if (lim[r2] >= 0)
            mrow[r2] = mask_row(b, hkv * G + (r0 + rl) / Lq, i, Lk, mask_sb, mask_sh);
#endif
    }

    float o[HD / 8][4];
    zero_frags(o);
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};

    // per-lane ldmatrix offsets (bytes) within a stage; q's m tile (A fragments as V's)
    const unsigned k_lane = k_lane_offset(lane), v_lane = v_lane_offset(lane);
    const unsigned q_tile = q_base + mtile * 16 * LDS * 2 + v_lane;

    for (int jt = 0; jt < n_tiles; ++jt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();        // tile jt visible to every warp; every warp is past tile jt - 1
        if (jt + STAGES - 1 < n_tiles) {                   // into the stage tile jt - 1 used
            const int jn = j_beg + (jt + STAGES - 1) * BN;
            const int wr = (jt + STAGES - 1) % STAGES;
            load_tile(ring + wr * 2 * STAGE_BYTES, kb, jn, j_end);
            load_tile(ring + wr * 2 * STAGE_BYTES + STAGE_BYTES, vb, jn, j_end);
        }
        cp_async_commit();
        const int j0 = j_beg + jt * BN;
        const unsigned ks_base = ring + (jt % STAGES) * 2 * STAGE_BYTES;
        const unsigned vs_base = ks_base + STAGE_BYTES;

        if (active) {
            for (int c = kslice; c < BN / KC && j0 + c * KC < j_end; c += KW) {
                const int jc = j0 + c * KC;
                float s[2 * NH][4];
                zero_frags(s);
                #pragma unroll
                for (int ks = 0; ks < HD / 16; ++ks) {
                    unsigned qa[4];
                    ldmatrix_x4(qa, q_tile + ks * 16 * 2);
                    qk_slice<NH>(s, qa, ks_base + k_lane, c * KC, ks);
                }
                unsigned pf[NH][4];
                softmax_step<NH>(s, jc, t, lim, sl, m_run, l_run, pf, o, mrow, mask,
                                 mask_bool);
                pv_step<NH>(o, pf, vs_base + v_lane, c * KC);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();                           // every warp is done with the ring

    // merge the KW warps of each m tile through shared memory (the ring is free)
    float* cw = reinterpret_cast<float*>(smem_raw);
    if (active) store_warp_partial(cw + warp * CW_STRIDE, o, m_run, l_run, g, t);
    __syncthreads();

    const int S = nsplit;
    const size_t part = (size_t)bk * S + split;            // this CTA's partial block
    float* ws_o = workspace;
    float* ws_ml = workspace + (size_t)gridDim.y * S * R * HD;
    unsigned* counters = reinterpret_cast<unsigned*>(ws_ml + (size_t)gridDim.y * S * R * 2);
    for (int idx = threadIdx.x; idx < RC * (HD / 4); idx += NTHREADS) {
        const int rl = idx / (HD / 4), d = (idx % (HD / 4)) * 4;
        const int mt = rl >> 4, rr = rl & 15;
        float m_tot = NEG_INF;
        for (int w = 0; w < KW; ++w)
            m_tot = fmaxf(m_tot, cw[(mt * KW + w) * CW_STRIDE + 16 * HD + rr]);
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        float den = 0.f;
        for (int w = 0; w < KW; ++w) {
            const float* src = cw + (mt * KW + w) * CW_STRIDE;
            const float mw = src[16 * HD + rr];
            const float f = mw == NEG_INF ? 0.f : ex2(mw - m_tot);
            const float4 x = *reinterpret_cast<const float4*>(src + rr * HD + d);
            num.x += x.x * f; num.y += x.y * f; num.z += x.z * f; num.w += x.w * f;
            den += src[16 * HD + 16 + rr] * f;
        }
        if (S == 1) {
            store_out4(out + (row0 + rl) * HD + d, num, den);
        } else {
            const size_t p = part * R + r0 + rl;
            *reinterpret_cast<float4*>(ws_o + p * HD + d) = num;
            if (d == 0) *reinterpret_cast<float2*>(ws_ml + p * 2) = make_float2(m_tot, den);
        }
    }
    if (S == 1) return;

    // publish: the barrier orders every thread's partial before thread 0's fence and atomic
    // (release); the last CTA's fence after it (acquire) and the barrier order its reads
    __syncthreads();
    const int ctr = bk * RG + rgrp;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&counters[ctr], 1u) == (unsigned)(S - 1);
        if (last) __threadfence();
    }
    __syncthreads();
    if (!last) return;
    // the last CTA of this (b, kv head, row group): merge the splits, 4 columns a thread, MB
    // splits' loads in flight at once (one L2 round trip a step, not one a split). Where the
    // rows leave threads over (decode's few rows), P parts of the threads take every P-th
    // step of an item, and the parts meet in shared memory (one round trip for P * MB splits)
    const int items = RC * (HD / 4);
    const int P = max(1, min(NTHREADS / items, (S + MB - 1) / MB));
    // [P][items] (num[4], m, den, 2 unused): 8 floats an entry, so num's float4 is 16-byte
    // aligned (a 6-float entry put every other one off by 8 bytes: a misaligned-address
    // fault on the H200, run S8)
    float* parts = reinterpret_cast<float*>(smem_raw);
    for (int idx = threadIdx.x; idx < items * P; idx += NTHREADS) {
        const int item = idx % items, part = idx / items;
        // this item's (m, l) and partial of split 0; split s is s * R pairs and rows further
        const size_t p0 = (size_t)bk * S * R + r0 + item / (HD / 4);
        const float2* ml0 = reinterpret_cast<const float2*>(ws_ml) + p0;
        const float4* x0 = reinterpret_cast<const float4*>(ws_o + p0 * HD) + item % (HD / 4);
        float m_tot = NEG_INF, den = 0.f;
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        merge_splits<MB>(ml0, x0, R, S, part * MB, P * MB, m_tot, den, num);
        if (P == 1) {
            store_out4(out + (row0 + item / (HD / 4)) * HD + (item % (HD / 4)) * 4, num, den);
        } else {
            float* mine = parts + (size_t)idx * 8;
            *reinterpret_cast<float4*>(mine) = num;
            mine[4] = m_tot;
            mine[5] = den;
        }
    }
    if (P > 1) {
        __syncthreads();
        for (int item = threadIdx.x; item < items; item += NTHREADS) {
            float m_tot = NEG_INF;
            for (int part = 0; part < P; ++part)
                m_tot = fmaxf(m_tot, parts[((size_t)part * items + item) * 8 + 4]);
            float den = 0.f;
            float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int part = 0; part < P; ++part) {
                const float* src = parts + ((size_t)part * items + item) * 8;
                const float f = src[4] == NEG_INF ? 0.f : ex2(src[4] - m_tot);
                const float4 x = *reinterpret_cast<const float4*>(src);
                num.x += x.x * f; num.y += x.y * f; num.z += x.z * f; num.w += x.w * f;
                den += src[5] * f;
            }
            store_out4(out + (row0 + item / (HD / 4)) * HD + (item % (HD / 4)) * 4, num, den);
        }
    }
    if (threadIdx.x == 0) counters[ctr] = 0u;
}
