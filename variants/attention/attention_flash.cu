// attention, fused flash-style kernel (float16 / bfloat16) on tensor cores:
// out[b, h] = softmax(q kᵀ · scale [+ causal mask]) v for q [B, H, Lq, D], k and v
// [B, H, Lk, D]. A CTA owns BR = 16 * NWARPS query rows of one (b, h); each warp keeps 16
// rows of q as mma.sync fragments in registers, with their running max, sum and output.
// K and V tiles of BC keys are staged in shared memory by cp.async: V(j) loads while
// S = Q K(j)ᵀ is computed and K(j+1) while P V(j) is, so loads overlap the arithmetic.
// The causal mask is bottom-right aligned: row i sees keys j <= i + Lk - Lq. Keys past Lk
// read as zero and are masked; rows past Lq are computed but never stored.
// Config macros: HD (head dim; must equal D), BC (keys per tile), NWARPS.
// Dynamic shared memory: 2 * BC * (HD + 8) * 2 bytes.

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
#define BR (16 * NWARPS)
#define NEG_INF (-__int_as_float(0x7f800000))
#define KV_LD (HD + 8)          // padded rows: conflict-free ldmatrix

// BC rows of k or v starting at key j0 into shared memory; rows past Lk are zero-filled.
__device__ __forceinline__ void load_tile(T* dst, const T* __restrict__ src, int j0, int Lk) {
    constexpr int CHUNKS = BC * HD / 8;
    #pragma unroll
    for (int c = threadIdx.x; c < CHUNKS; c += NWARPS * 32) {
        const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
        const bool in = j0 + r < Lk;
        cp_async16(dst + r * KV_LD + col, in ? (const void*)(src + (size_t)(j0 + r) * HD + col)
                                             : (const void*)src, in ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(NWARPS * 32)
attention_flash(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                T* __restrict__ out, int Lq, int Lk, float scale, int causal)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* k_s = reinterpret_cast<T*>(smem_raw);
    T* v_s = k_s + BC * KV_LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const size_t bh = blockIdx.y;
    const T* qb = q + bh * Lq * HD;
    const T* kb = k + bh * Lk * HD;
    const T* vb = v + bh * Lk * HD;
    const int row0 = blockIdx.x * BR + warp * 16;            // this warp's first query row
    const int shift = Lk - Lq;                               // causal: row i sees j <= i + shift
    const float scale_log2 = scale * 1.4426950408889634f;

    // Keys this CTA needs: all, or (causal) up to its last row's diagonal.
    int kv_end = Lk;
    if (causal) kv_end = min(Lk, blockIdx.x * BR + BR - 1 + shift + 1);
    const int n_tiles = (kv_end + BC - 1) / BC;

    load_tile(k_s, kb, 0, Lk);
    cp_async_commit();

    // q fragments straight from global memory (read once per CTA)
    unsigned qf[HD / 16][4];
    {
        const int r_lo = row0 + g, r_hi = row0 + g + 8;
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            const int c = ks * 16 + 2 * t;
            const unsigned* lo = reinterpret_cast<const unsigned*>(qb + (size_t)r_lo * HD + c);
            const unsigned* hi = reinterpret_cast<const unsigned*>(qb + (size_t)r_hi * HD + c);
            qf[ks][0] = r_lo < Lq ? lo[0] : 0u;
            qf[ks][1] = r_hi < Lq ? hi[0] : 0u;
            qf[ks][2] = r_lo < Lq ? lo[4] : 0u;
            qf[ks][3] = r_hi < Lq ? hi[4] : 0u;
        }
    }

    float o[HD / 8][4];
    #pragma unroll
    for (int i = 0; i < HD / 8; ++i)
        #pragma unroll
        for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
    float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};

    for (int jt = 0; jt < n_tiles; ++jt) {
        const int j0 = jt * BC;
        cp_async_wait<0>();
        __syncthreads();                       // K(j) visible; every warp is done with V(j-1)
        load_tile(v_s, vb, j0, Lk);
        cp_async_commit();

        float s[BC / 8][4];
        #pragma unroll
        for (int i = 0; i < BC / 8; ++i)
            #pragma unroll
            for (int e = 0; e < 4; ++e) s[i][e] = 0.f;
        #pragma unroll
        for (int ks = 0; ks < HD / 16; ++ks) {
            #pragma unroll
            for (int np = 0; np < BC / 16; ++np) {
                unsigned bf[4];
                const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(bf, k_s + key * KV_LD + ks * 16 + ((lane >> 3) & 1) * 8);
                mma16816(s[2 * np], qf[ks], bf);
                mma16816(s[2 * np + 1], qf[ks], bf + 2);
            }
        }

        // mask, then the online softmax update (rows g and g + 8 of the warp)
        const bool edge = (j0 + BC > Lk) || (causal && j0 + BC - 1 > row0 + shift);
        float mx[2] = {NEG_INF, NEG_INF};
        #pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[nt][e] * scale_log2;
                if (edge) {
                    const int key = j0 + nt * 8 + 2 * t + (e & 1);
                    const int row = row0 + g + (e >> 1) * 8;
                    if (key >= Lk || (causal && key > row + shift)) x = NEG_INF;
                }
                s[nt][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        }
        float alpha[2];
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r]);
            const float m_use = m_new == NEG_INF ? 0.f : m_new;   // row fully masked so far
            alpha[r] = exp2f(m_run[r] - m_use);
            m_run[r] = m_new;
            mx[r] = m_use;
            l_run[r] *= alpha[r];
        }
        #pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] - mx[e >> 1]);
                s[nt][e] = p;
                l_run[e >> 1] += p;
            }
        }
        #pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
        }

        cp_async_wait<0>();
        __syncthreads();                       // V(j) visible; every warp is done with K(j)
        if (jt + 1 < n_tiles) load_tile(k_s, kb, j0 + BC, Lk);
        cp_async_commit();

        #pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            unsigned pf[4];
            pf[0] = pack2(s[2 * kk][0], s[2 * kk][1]);
            pf[1] = pack2(s[2 * kk][2], s[2 * kk][3]);
            pf[2] = pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pf[3] = pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            #pragma unroll
            for (int dp = 0; dp < HD / 16; ++dp) {
                unsigned bf[4];
                ldmatrix_x4_trans(bf, v_s + (kk * 16 + (lane & 15)) * KV_LD + dp * 16 + (lane >> 4) * 8);
                mma16816(o[2 * dp], pf, bf);
                mma16816(o[2 * dp + 1], pf, bf + 2);
            }
        }
    }
    cp_async_wait<0>();

    T* ob = out + bh * Lq * HD;
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
                pack2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        }
    }
}
