// softmax, one block per row: block = THREADS threads; row = blockIdx.x.
// Config: THREADS (128..1024), VEC (elements per load), CACHE (1: keep the row in dynamic
// shared memory, so x is read from memory once). Convention: convention.md.
#ifndef VEC
#define VEC 1
#endif
#ifndef CACHE
#define CACHE 0
#endif
struct alignas(sizeof(T) * VEC) VecT { T v[VEC]; };

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    float mn = fmaxf(m, m2);
    float a = (m == -INFINITY) ? 0.f : s * __expf(m - mn);
    float b = (m2 == -INFINITY) ? 0.f : s2 * __expf(m2 - mn);
    m = mn;
    s = a + b;
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_block(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float red_m[32], red_s[32];
    int row = blockIdx.x;
    const T* xr = x + (size_t)row * C;
    T* orow = out + (size_t)row * C;
    T* cache = reinterpret_cast<T*>(smem_raw);
    bool vec = (VEC > 1) && (C % VEC == 0) &&
               (((size_t)xr | (size_t)orow) % (sizeof(T) * VEC) == 0);
    float m = -INFINITY, s = 0.f;
    if (vec) {
        for (int c = threadIdx.x * VEC; c < C; c += THREADS * VEC) {
            VecT v = *reinterpret_cast<const VecT*>(xr + c);
            if (CACHE) *reinterpret_cast<VecT*>(cache + c) = v;
#pragma unroll
            for (int j = 0; j < VEC; ++j) merge(m, s, to_f32(v.v[j]), 1.f);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += THREADS) {
            T v = xr[c];
            if (CACHE) cache[c] = v;
            merge(m, s, to_f32(v), 1.f);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        merge(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { red_m[warp] = m; red_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? red_m[lane] : -INFINITY;
        s = lane < THREADS / 32 ? red_s[lane] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            float s2 = __shfl_xor_sync(0xffffffffu, s, o);
            merge(m, s, m2, s2);
        }
        if (lane == 0) { red_m[0] = m; red_s[0] = s; }
    }
    __syncthreads();
    m = red_m[0];
    float inv = 1.f / red_s[0];
    const T* src = CACHE ? cache : xr;
    if (vec) {
        for (int c = threadIdx.x * VEC; c < C; c += THREADS * VEC) {
            VecT v = *reinterpret_cast<const VecT*>(src + c);
            VecT w;
#pragma unroll
            for (int j = 0; j < VEC; ++j) w.v[j] = from_f32<T>(__expf(to_f32(v.v[j]) - m) * inv);
            *reinterpret_cast<VecT*>(orow + c) = w;
        }
    } else {
        for (int c = threadIdx.x; c < C; c += THREADS)
            orow[c] = from_f32<T>(__expf(to_f32(src[c]) - m) * inv);
    }
}
