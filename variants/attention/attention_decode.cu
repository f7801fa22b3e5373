// attention, fused kernel reading k and v straight from global memory (decode: Lq small).
// One CTA per query row of one (b, h). Each key is handled by a group of LPK = HD / 8
// lanes, each lane holding 8 elements of q, k, v and the output (one 16-byte load per
// lane per key), so a warp works on 32 / LPK keys at once and UNROLL steps are loaded
// before any is used. Every group keeps its own running max, sum and output; groups meet
// through shuffles, warps through shared memory. Causal: row i sees keys j <= i + Lk - Lq.
// Config macros: HD (head dim; must equal D), NWARPS, UNROLL.

#ifndef HD
#define HD 128
#endif
#ifndef NWARPS
#define NWARPS 4
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#define LPK (HD / 8)
#define KPW (32 / LPK)
#define KEYS_PER_STEP (NWARPS * KPW)
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned short lo = (unsigned short)(w[i] & 0xffffu), hi = (unsigned short)(w[i] >> 16);
        T a, b;
        *reinterpret_cast<unsigned short*>(&a) = lo;
        *reinterpret_cast<unsigned short*>(&b) = hi;
        f[2 * i] = to_f32(a);
        f[2 * i + 1] = to_f32(b);
    }
}

extern "C" __global__ void __launch_bounds__(NWARPS * 32)
attention_decode(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 T* __restrict__ out, int Lq, int Lk, float scale, int causal)
{
    __shared__ float part_m[NWARPS], part_l[NWARPS];
    __shared__ float part_o[NWARPS][HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = lane / LPK, sub = lane % LPK;
    const int row = blockIdx.x;
    const size_t bh = blockIdx.y;
    const T* kb = k + bh * Lk * HD + sub * 8;
    const T* vb = v + bh * Lk * HD + sub * 8;
    const int kv_end = causal ? min(Lk, row + Lk - Lq + 1) : Lk;

    float qf[8];
    unpack8(*reinterpret_cast<const uint4*>(q + (bh * Lq + row) * HD + sub * 8), qf);
    const float scale_log2 = scale * 1.4426950408889634f;
    #pragma unroll
    for (int i = 0; i < 8; ++i) qf[i] *= scale_log2;

    float m = NEG_INF, l = 0.f, acc[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;

    // the loop bound is warp-uniform: the shuffles below need every lane of the warp
    for (int jw = warp * KPW; jw < kv_end; jw += UNROLL * KEYS_PER_STEP) {
        const int j0 = jw + group;
        uint4 kr[UNROLL], vr[UNROLL];
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * KEYS_PER_STEP;
            if (j < kv_end) {
                kr[u] = __ldg(reinterpret_cast<const uint4*>(kb + (size_t)j * HD));
                vr[u] = __ldg(reinterpret_cast<const uint4*>(vb + (size_t)j * HD));
            }
        }
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = j0 + u * KEYS_PER_STEP;
            float kf[8], vf[8];
            float s = 0.f;
            if (j < kv_end) {
                unpack8(kr[u], kf);
                #pragma unroll
                for (int i = 0; i < 8; ++i) s += qf[i] * kf[i];
            }
            #pragma unroll
            for (int off = 1; off < LPK; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            if (j < kv_end) {
                unpack8(vr[u], vf);
                const float m_new = fmaxf(m, s);
                const float alpha = exp2f(m - m_new), p = exp2f(s - m_new);
                l = l * alpha + p;
                #pragma unroll
                for (int i = 0; i < 8; ++i) acc[i] = acc[i] * alpha + p * vf[i];
                m = m_new;
            }
        }
    }
    // merge the groups of this warp (lanes with equal sub hold the same output slice)
    #pragma unroll
    for (int off = LPK; off < 32; off <<= 1) {
        const float m_o = __shfl_xor_sync(0xffffffffu, m, off);
        const float l_o = __shfl_xor_sync(0xffffffffu, l, off);
        const float m_new = fmaxf(m, m_o);
        const float a = m == NEG_INF ? 0.f : exp2f(m - m_new);
        const float b = m_o == NEG_INF ? 0.f : exp2f(m_o - m_new);
        l = l * a + l_o * b;
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float x_o = __shfl_xor_sync(0xffffffffu, acc[i], off);
            acc[i] = acc[i] * a + x_o * b;
        }
        m = m_new;
    }
    if (group == 0) {
        #pragma unroll
        for (int i = 0; i < 8; ++i) part_o[warp][sub * 8 + i] = acc[i];
        if (sub == 0) { part_m[warp] = m; part_l[warp] = l; }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < HD; d += NWARPS * 32) {
        float mx = NEG_INF;
        #pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, part_m[w]);
        float num = 0.f, den = 0.f;
        #pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float f = part_m[w] == NEG_INF ? 0.f : exp2f(part_m[w] - mx);
            num += part_o[w][d] * f;
            den += part_l[w] * f;
        }
        out[(bh * Lq + row) * HD + d] = from_f32<T>(den > 0.f ? num / den : 0.f);
    }
}
