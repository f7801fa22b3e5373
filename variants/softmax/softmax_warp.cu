// softmax, one warp per row: block = (32, WARPS); row = blockIdx.x * WARPS + threadIdx.y.
// Config: WARPS (rows per block), VEC (elements per load). Convention: convention.md.
#ifndef VEC
#define VEC 1
#endif
struct alignas(sizeof(T) * VEC) VecT { T v[VEC]; };

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    float a = (m == -INFINITY) ? 0.f : s * __expf(m - mn);
    float b = (m2 == -INFINITY) ? 0.f : s2 * __expf(m2 - mn);
    m = mn;
    s = a + b;
}

extern "C" __global__ void softmax_warp(const T* __restrict__ x, T* __restrict__ out,
                                        int R, int C) {
    int row = blockIdx.x * WARPS + threadIdx.y;
    if (row >= R) return;
    int lane = threadIdx.x;
    const T* xr = x + (size_t)row * C;
    T* orow = out + (size_t)row * C;
    bool vec = (VEC > 1) && (C % VEC == 0) &&
               (((size_t)xr | (size_t)orow) % (sizeof(T) * VEC) == 0);
    float m = -INFINITY, s = 0.f;
    if (vec) {
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            VecT v = *reinterpret_cast<const VecT*>(xr + c);
#pragma unroll
            for (int j = 0; j < VEC; ++j) merge(m, s, to_f32(v.v[j]), 1.f);
        }
    } else {
        for (int c = lane; c < C; c += 32) merge(m, s, to_f32(xr[c]), 1.f);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge(m, s, m2, s2);
    }
    float inv = 1.f / s;
    if (vec) {
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            VecT v = *reinterpret_cast<const VecT*>(xr + c);
            VecT w;
#pragma unroll
            for (int j = 0; j < VEC; ++j) w.v[j] = from_f32<T>(__expf(to_f32(v.v[j]) - m) * inv);
            *reinterpret_cast<VecT*>(orow + c) = w;
        }
    } else {
        for (int c = lane; c < C; c += 32) orow[c] = from_f32<T>(__expf(to_f32(xr[c]) - m) * inv);
    }
}
