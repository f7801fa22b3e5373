// adaptive_splitkv.cuh: the device code of adaptive's split-KV decode attention kernels
// (variants/attention/attention_splitkv.cu: splitkv_mma, attention_splitkv2.cu: splitkv2_mma)
// that is the same in both: the K/V tile copy, the warp step's scores, online softmax and
// P V on mma.sync, the store of a warp's partial for the merge of an m tile's warps, and the
// merge of the splits' partials of a (row, 4 columns). A kernel includes it by name after
// "adaptive_ptx.cuh" (whose helpers it calls) and after its config macros; the library puts
// its text in place of that line (adaptive/headers.py), as for adaptive_ptx.cuh, so it is
// part of every kernel's cache key and travels inside each variant's source in packs.
// The kernel defines, before the include:
//   HD        head dim (elements of a q, k, v row; a multiple of 16)
//   BN        keys per staged K/V tile
//   NTHREADS  threads of the CTA
//   T         the 16-bit element type (the prelude's)
//   MASKED    1: the kernel reads a padding mask (softmax_step adds each key's mask_logit);
//             0 or undefined: no mask (the mask arguments are not read: the code is as it was
//             before masks existed)
// and this header defines, for the kernel too:
//   LDS        (HD + 8): row stride (elements) of the shared tiles, padded so that ldmatrix
//              and cp.async are conflict-free
//   CW_STRIDE  (16 * HD + 32): floats per warp in the warp-merge buffer (o[16][HD], m[16],
//              l[16])
//   NEG_INF    -inf (masked keys; the running max of a row that has seen no key)
// No other macro of the kernel may be a name used here (template parameters HALVES, MSTEP, N;
// function parameters such as R, S, g, t, o, s).
// Fragments are those of mma.sync m16n8k16 (adaptive_ptx.cuh): lane = 4 g + t holds rows g
// and g + 8 of a warp's m16 tile; logits are in the log2 domain (x = s * scale * log2(e)).
// The CPU tests run this text as written (tests/cpu/test_attention_splitkv_emu.py).
#ifndef ADAPTIVE_SPLITKV_CUH
#define ADAPTIVE_SPLITKV_CUH

#define LDS (HD + 8)              // padded rows: conflict-free ldmatrix and cp.async
#define CW_STRIDE (16 * HD + 32)  // floats per warp in the merge buffer: o[16][HD], m[16], l[16]
#define NEG_INF (-__int_as_float(0x7f800000))
#ifndef MASKED
#define MASKED 0
#endif

// The padding mask's row of a query row (b, query head h, position i): its first element,
// b * sb + h * sh + i * Lk (strides 0 where the mask is broadcast; below 2^31: requires).
__device__ __forceinline__ int mask_row(int b, int h, int i, int Lk, int sb, int sh) {
    return b * sb + h * sh + i * Lk;
}

// The log2-domain logit term of mask element e: boolean (1 byte, nonzero: seen), 0 where seen
// and -inf where hidden; additive (T), the value times log2(e) (-inf stays -inf).
__device__ __forceinline__ float mask_logit(const void* mask, int e, int is_bool) {
    if (is_bool) return static_cast<const unsigned char*>(mask)[e] ? 0.f : NEG_INF;
    return to_f32(static_cast<const T*>(mask)[e]) * 1.4426950408889634f;
}

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

// Per-lane byte offsets of ldmatrix within a tile of row stride LDS: K rows as the B
// operand of S = Q Kᵀ (ldmatrix_x4), V rows as the B operand of O += P V (ldmatrix_x4_trans)
// and rows of q as an A operand (ldmatrix_x4, the same addresses as V's).
__device__ __forceinline__ unsigned k_lane_offset(int lane) {
    return (((lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8) * 2;
}
__device__ __forceinline__ unsigned v_lane_offset(int lane) {
    return ((lane & 15) * LDS + (lane >> 4) * 8) * 2;
}

// Accumulator fragments set to 0.
template <int N>
__device__ __forceinline__ void zero_frags(float (&a)[N][4]) {
    #pragma unroll
    for (int i = 0; i < N; ++i)
        #pragma unroll
        for (int e = 0; e < 4; ++e) a[i][e] = 0.f;
}

// s += k16 slice ks of S = Q Kᵀ for a warp step of HALVES * 16 keys: qa the A fragment of
// the warp's m tile at this slice, k_lane_base the K stage's address plus the lane's offset
// (k_lane_offset), key0 the step's first key in the stage; s[2h], s[2h + 1] are keys
// key0 + 16h .. + 7 and + 8 .. + 15.
template <int HALVES>
__device__ __forceinline__ void qk_slice(float (&s)[2 * HALVES][4], const unsigned* qa,
                                         unsigned k_lane_base, int key0, int ks) {
    #pragma unroll
    for (int h = 0; h < HALVES; ++h) {
        unsigned bf[4];
        ldmatrix_x4(bf, k_lane_base + ((key0 + h * 16) * LDS + ks * 16) * 2);
        mma16816(s[2 * h], qa, bf);
        mma16816(s[2 * h + 1], qa, bf + 2);
    }
}

// The online-softmax step of a warp step's HALVES * 16 keys (the first jc) on this thread's
// two rows: scores s scaled by sl into the log2 domain, keys past a row's last visible key
// (lim[r], inclusive) set to -inf; with MASKED, each other key's mask_logit added (the
// row's mask row starts at element mrow[r] of mask; read only for keys <= lim[r], so never
// past Lk; is_bool: the mask's kind); the running max m_run and sum l_run updated,
// P = 2^(x - m)
// packed into A fragments pf (pf[h]: keys 16h..16h+15), and o rescaled by 2^(m_old - m_new)
// (skipped when that is 1 for every row of the warp). A row fully masked so far keeps
// m = -inf and adds nothing (its p are 2^-inf = 0).
template <int HALVES>
__device__ __forceinline__ void softmax_step(float (&s)[2 * HALVES][4], int jc, int t,
                                             const int (&lim)[2], float sl, float (&m_run)[2],
                                             float (&l_run)[2], unsigned (&pf)[HALVES][4],
                                             float (&o)[HD / 8][4],
                                             const int (&mrow)[2], const void* mask,
                                             int is_bool) {
    float mx[2] = {NEG_INF, NEG_INF};
    #pragma unroll
    for (int nt = 0; nt < 2 * HALVES; ++nt)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = jc + nt * 8 + 2 * t + (e & 1);
#if MASKED
            const float x = key > lim[e >> 1] ? NEG_INF
                          : s[nt][e] * sl + mask_logit(mask, mrow[e >> 1] + key, is_bool);
#else
            const float x = key > lim[e >> 1] ? NEG_INF : s[nt][e] * sl;
#endif
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
    #pragma unroll
    for (int nt = 0; nt < 2 * HALVES; ++nt) {
        const float p0 = ex2(s[nt][0] - m_use[0]), p1 = ex2(s[nt][1] - m_use[0]);
        const float p2 = ex2(s[nt][2] - m_use[1]), p3 = ex2(s[nt][3] - m_use[1]);
        l_run[0] += p0 + p1;
        l_run[1] += p2 + p3;
        pf[nt >> 1][2 * (nt & 1)] = pack2(p0, p1);
        pf[nt >> 1][2 * (nt & 1) + 1] = pack2(p2, p3);
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
        #pragma unroll
        for (int dt = 0; dt < HD / 8; ++dt) {
            o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
        }
    }
}

// o += P V for the warp step: pf from softmax_step, v_lane_base the V stage's address plus
// the lane's offset (v_lane_offset), key0 the step's first key in the stage.
template <int HALVES>
__device__ __forceinline__ void pv_step(float (&o)[HD / 8][4], const unsigned (&pf)[HALVES][4],
                                        unsigned v_lane_base, int key0) {
    #pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp)
        #pragma unroll
        for (int h = 0; h < HALVES; ++h) {
            unsigned bf[4];
            ldmatrix_x4_trans(bf, v_lane_base + ((key0 + h * 16) * LDS + dp * 16) * 2);
            mma16816(o[2 * dp], pf[h], bf);
            mma16816(o[2 * dp + 1], pf[h], bf + 2);
        }
}

// This warp's partial of its m tile into its slot (CW_STRIDE floats) of the merge buffer:
// o unnormalised (o[16][HD]), then the running max m[16] and sum l[16] of each row (the
// quad's four partial sums added first).
__device__ __forceinline__ void store_warp_partial(float* mine, const float (&o)[HD / 8][4],
                                                   const float (&m_run)[2],
                                                   const float (&l_run)[2], int g, int t) {
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

// Folds the splits' partials of one (row, 4 columns) into (m_tot, den, num): MSTEP splits a
// step, [s0, s0 + MSTEP) for s0 = s_first, s_first + s_stride, ... below S (a step's loads
// issued together: one L2 round trip a step, not one a split). ml0 and x0 point at split 0's
// (m, l) pair and 4 columns of the row; split s is s * R pairs and rows further (R rows a
// split). Loads through L2 (__ldcg): other CTAs wrote the partials.
template <int MSTEP>
__device__ __forceinline__ void merge_splits(const float2* ml0, const float4* x0, int R,
                                             int S, int s_first, int s_stride, float& m_tot,
                                             float& den, float4& num) {
    for (int s0 = s_first; s0 < S; s0 += s_stride) {
        float2 ml[MSTEP];
        float4 x[MSTEP];
        #pragma unroll
        for (int u = 0; u < MSTEP; ++u) {
            if (s0 + u < S) {
                ml[u] = __ldcg(ml0 + (size_t)(s0 + u) * R);
                x[u] = __ldcg(x0 + (size_t)(s0 + u) * R * (HD / 4));
            } else {
                ml[u] = make_float2(NEG_INF, 0.f);
                x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
        float m_new = m_tot;
        #pragma unroll
        for (int u = 0; u < MSTEP; ++u) m_new = fmaxf(m_new, ml[u].x);
        if (m_new == NEG_INF) continue;                // no split so far saw a key of the row
        const float a = ex2(m_tot - m_new);            // ex2(-inf) = 0
        den *= a;
        num.x *= a; num.y *= a; num.z *= a; num.w *= a;
        #pragma unroll
        for (int u = 0; u < MSTEP; ++u) {
            const float f = ex2(ml[u].x - m_new);      // a split that saw nothing: 0
            den += ml[u].y * f;
            num.x += x[u].x * f; num.y += x[u].y * f; num.z += x[u].z * f; num.w += x[u].w * f;
        }
        m_tot = m_new;
    }
}

// 4 columns of an output row: num / den as T (0 where the row saw no key: den = 0).
__device__ __forceinline__ void store_out4(T* dst, const float4& num, float den) {
    const float inv = den > 0.f ? 1.f / den : 0.f;
    *reinterpret_cast<unsigned*>(dst) = pack2(num.x * inv, num.y * inv);
    *reinterpret_cast<unsigned*>(dst + 2) = pack2(num.z * inv, num.w * inv);
}

#endif  // ADAPTIVE_SPLITKV_CUH
