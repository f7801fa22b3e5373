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
// counts). Config macros: HD (head dim; must equal D), KPS (keys per split), BN (keys per
// staged tile), NWARPS. Dynamic shared memory: max(4 * BN * (HD + 8) * 2, NWARPS * (16 * HD
// + 32) * 4) bytes. Workspace (floats): B*Hkv*S*R*HD partial outputs, then B*Hkv*S*R (m, l)
// pairs, then B*Hkv counters (S = ceil_div(Lk, KPS) splits).

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
#define LDS (HD + 8)            // padded rows: conflict-free ldmatrix and cp.async
#define STAGE_ELEMS (BN * LDS)
#define CW_STRIDE (16 * HD + 32)  // floats per warp in the merge buffer: o[16][HD], m[16], l[16]
#define NEG_INF (-__int_as_float(0x7f800000))
#define MB (HD >= 128 ? 8 : 4)  // splits merged a step by the last CTA (registers: 6 a split)

// Keys [j0, j0 + BN) of one kv head (rows of HD elements) into a shared tile (row stride
// LDS); keys at or past j_end are zero-filled (they are masked too).
__device__ __forceinline__ void load_tile(unsigned dst, const T* __restrict__ src, int j0,
                                          int j_end) {
    constexpr int RSTEP = NTHREADS / (HD / 8);             // rows per pass of the CTA
    static_assert(BN % RSTEP == 0, "tile rows must divide among the threads");
    const int rt = threadIdx.x / (HD / 8), col = (threadIdx.x % (HD / 8)) * 8;
    #pragma unroll
    for (int i = 0; i < BN / RSTEP; ++i) {
        const int j = j0 + rt + i * RSTEP;
        const bool in = j < j_end;
        cp_async16(dst + ((rt + i * RSTEP) * LDS + col) * 2,
                   in ? (const void*)(src + (size_t)j * HD + col) : (const void*)src,
                   in ? 16 : 0);
    }
}

extern "C" __global__ void LAUNCH_BOUNDS
attention_splitkv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  T* __restrict__ out, int Lq, int Lk, int H, int Hkv, float scale,
                  int causal, float* __restrict__ workspace)
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
    #pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
        const int r = mtile * 16 + g + 8 * r2;
        const bool valid = active && r < R;
        const int i = valid ? r % Lq : 0;
        const T* qr = q + (((size_t)b * H + (size_t)hkv * G + (valid ? r / Lq : 0)) * Lq + i) * HD;
        // last visible key (inclusive), capped by this split's end
        lim[r2] = valid ? min(j_end - 1, causal ? i + Lk - Lq : Lk - 1) : -1;
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            qa[ks][r2] = valid ? *reinterpret_cast<const unsigned*>(qr + ks * 16 + 2 * t) : 0u;
            qa[ks][2 + r2] = valid ? *reinterpret_cast<const unsigned*>(qr + ks * 16 + 8 + 2 * t)
                                   : 0u;
        }
    }

    float o[HD / 8][4];
    #pragma unroll
    for (int i = 0; i < HD / 8; ++i)
        #pragma unroll
        for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};

    // per-lane ldmatrix offsets (bytes) within a stage
    const unsigned k_lane = (((lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8) * 2;
    const unsigned v_lane = ((lane & 15) * LDS + (lane >> 4) * 8) * 2;

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
                #pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
                #pragma unroll
                for (int ks = 0; ks < HD / 16; ++ks) {
                    unsigned bf[4];
                    ldmatrix_x4(bf, k_base + st + k_lane + (c * 16 * LDS + ks * 16) * 2);
                    mma16816(s[0], qa[ks], bf);
                    mma16816(s[1], qa[ks], bf + 2);
                }
                float mx[2] = {NEG_INF, NEG_INF};
                #pragma unroll
                for (int nt = 0; nt < 2; ++nt)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = jc + nt * 8 + 2 * t + (e & 1);
                        const float x = key > lim[e >> 1] ? NEG_INF : s[nt][e] * sl;
                        s[nt][e] = x;
                        mx[e >> 1] = fmaxf(mx[e >> 1], x);
                    }
                float alpha[2], m_use[2];
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    const float m_new = fmaxf(m_run[r], mx[r]);
                    m_use[r] = m_new == NEG_INF ? 0.f : m_new;    // row fully masked so far
                    alpha[r] = ex2(m_run[r] - m_use[r]);
                    m_run[r] = m_new;
                    l_run[r] *= alpha[r];
                }
                unsigned pf[4];
                #pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    const float p0 = ex2(s[nt][0] - m_use[0]), p1 = ex2(s[nt][1] - m_use[0]);
                    const float p2 = ex2(s[nt][2] - m_use[1]), p3 = ex2(s[nt][3] - m_use[1]);
                    l_run[0] += p0 + p1;
                    l_run[1] += p2 + p3;
                    pf[2 * nt] = pack2(p0, p1);
                    pf[2 * nt + 1] = pack2(p2, p3);
                }
                if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
                    #pragma unroll
                    for (int dt = 0; dt < HD / 8; ++dt) {
                        o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0];
                        o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
                    }
                }
                #pragma unroll
                for (int dp = 0; dp < HD / 16; ++dp) {
                    unsigned bf[4];
                    ldmatrix_x4_trans(bf, v_base + st + v_lane + (c * 16 * LDS + dp * 16) * 2);
                    mma16816(o[2 * dp], pf, bf);
                    mma16816(o[2 * dp + 1], pf, bf + 2);
                }
            }
        }
        __syncthreads();                       // every warp is done with stage jt & 1
    }
    cp_async_wait<0>();

    // merge the KW warps of each m tile through shared memory (the staging area is free)
    float* cw = reinterpret_cast<float*>(smem_raw);
    if (active) {
        float* mine = cw + warp * CW_STRIDE;
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = l_run[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = g + 8 * r;
            #pragma unroll
            for (int dt = 0; dt < HD / 8; ++dt) {
                mine[row * HD + dt * 8 + 2 * t] = o[dt][2 * r];
                mine[row * HD + dt * 8 + 2 * t + 1] = o[dt][2 * r + 1];
            }
            if (t == 0) { mine[16 * HD + row] = m_run[r]; mine[16 * HD + 16 + row] = l; }
        }
    }
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
        float m_tot = NEG_INF, den = 0.f;
        float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < nsplit; s0 += MB) {
            float2 ml[MB];
            float4 x[MB];
            #pragma unroll
            for (int u = 0; u < MB; ++u) {
                const size_t p = ((size_t)bk * nsplit + s0 + u) * R + r;
                if (s0 + u < nsplit) {
                    ml[u] = __ldcg(reinterpret_cast<const float2*>(ws_ml + p * 2));
                    x[u] = __ldcg(reinterpret_cast<const float4*>(ws_o + p * HD + d));
                } else {
                    ml[u] = make_float2(NEG_INF, 0.f);
                    x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                }
            }
            float m_new = m_tot;
            #pragma unroll
            for (int u = 0; u < MB; ++u) m_new = fmaxf(m_new, ml[u].x);
            if (m_new == NEG_INF) continue;                // no split so far saw a key of row r
            const float a = ex2(m_tot - m_new);            // ex2(-inf) = 0
            den *= a;
            num.x *= a; num.y *= a; num.z *= a; num.w *= a;
            #pragma unroll
            for (int u = 0; u < MB; ++u) {
                const float f = ex2(ml[u].x - m_new);      // a split that saw nothing: 0
                den += ml[u].y * f;
                num.x += x[u].x * f; num.y += x[u].y * f; num.z += x[u].z * f; num.w += x[u].w * f;
            }
            m_tot = m_new;
        }
        const float inv = den > 0.f ? 1.f / den : 0.f;
        T* dst = out + (out_row0 + r) * HD + d;
        *reinterpret_cast<unsigned*>(dst) = pack2(num.x * inv, num.y * inv);
        *reinterpret_cast<unsigned*>(dst + 2) = pack2(num.z * inv, num.w * inv);
    }
    if (threadIdx.x == 0) counters[bk] = 0u;
}
