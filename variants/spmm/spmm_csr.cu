// spmm, custom CSR kernel: out[M, N] = w[M, K] @ b[K, N] with w in CSR (int32 indices).
// One warp per row. The warp's lanes form GROUPS = 32 / LANES_N groups; each group
// walks every GROUPS-th non-zero of the row and each of its LANES_N lanes loads VEC
// contiguous elements of the matching row of b (one vector load), so a warp covers
// LANES_N * VEC columns; the groups' partial sums meet through warp shuffles.
// Config macros: VEC (1, 2, 4, 8; VEC * sizeof(T) <= 16), LANES_N (divides 32), WARPS.
// T, to_f32 and from_f32 come from the backend's prelude (adaptive/nvrtc.py).

#ifndef VEC
#define VEC 4
#endif
#ifndef LANES_N
#define LANES_N 32
#endif
#ifndef WARPS
#define WARPS 4
#endif

#define GROUPS (32 / LANES_N)


// VEC elements of T starting at p (aligned to VEC * sizeof(T)) into floats.
template <int V>
__device__ __forceinline__ void load_vec(const float* __restrict__ p, float* v) {
    if constexpr (V == 4) {
        float4 x = __ldg(reinterpret_cast<const float4*>(p));
        v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
    } else if constexpr (V == 2) {
        float2 x = __ldg(reinterpret_cast<const float2*>(p));
        v[0] = x.x; v[1] = x.y;
    } else {
        #pragma unroll
        for (int i = 0; i < V; ++i) v[i] = __ldg(p + i);
    }
}

template <int V>
__device__ __forceinline__ void load_vec(const __half* __restrict__ p, float* v) {
    if constexpr (V == 8) {
        uint4 x = __ldg(reinterpret_cast<const uint4*>(p));
        const __half2* h = reinterpret_cast<const __half2*>(&x);
        #pragma unroll
        for (int i = 0; i < 4; ++i) { float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
    } else if constexpr (V == 4) {
        uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
        const __half2* h = reinterpret_cast<const __half2*>(&x);
        #pragma unroll
        for (int i = 0; i < 2; ++i) { float2 f = __half22float2(h[i]); v[2 * i] = f.x; v[2 * i + 1] = f.y; }
    } else if constexpr (V == 2) {
        float2 f = __half22float2(__ldg(reinterpret_cast<const __half2*>(p)));
        v[0] = f.x; v[1] = f.y;
    } else {
        #pragma unroll
        for (int i = 0; i < V; ++i) v[i] = __half2float(p[i]);
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
spmm_csr(const int* __restrict__ indptr, const int* __restrict__ indices,
         const T* __restrict__ values, const T* __restrict__ b, T* __restrict__ out,
         int M, int N, int K)
{
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (row >= M) return;
    const int group = lane / LANES_N;
    const int col = (blockIdx.y * LANES_N + lane % LANES_N) * VEC;
    const bool active = col < N;   // N % VEC == 0, so a vector is all in or all out
    float acc[VEC];
    #pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
    const int start = __ldg(indptr + row), end = __ldg(indptr + row + 1);
    int j = start + group;
    // two non-zeros per step keep two loads of b in flight
    for (; j + GROUPS < end; j += 2 * GROUPS) {
        const int c0 = __ldg(indices + j), c1 = __ldg(indices + j + GROUPS);
        const float a0 = to_f32(values[j]), a1 = to_f32(values[j + GROUPS]);
        if (active) {
            float v0[VEC], v1[VEC];
            load_vec<VEC>(b + (size_t)c0 * N + col, v0);
            load_vec<VEC>(b + (size_t)c1 * N + col, v1);
            #pragma unroll
            for (int i = 0; i < VEC; ++i) acc[i] += a0 * v0[i] + a1 * v1[i];
        }
    }
    if (j < end && active) {
        const int c0 = __ldg(indices + j);
        const float a0 = to_f32(values[j]);
        float v0[VEC];
        load_vec<VEC>(b + (size_t)c0 * N + col, v0);
        #pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += a0 * v0[i];
    }
    #pragma unroll
    for (int off = LANES_N; off < 32; off <<= 1) {
        #pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    }
    if (group == 0 && active) {
        #pragma unroll
        for (int i = 0; i < VEC; ++i) out[(size_t)row * N + col + i] = from_f32<T>(acc[i]);
    }
}
