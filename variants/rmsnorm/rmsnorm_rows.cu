// rmsnorm, G threads a row: block = (G, ROWS); row = blockIdx.x * ROWS + threadIdx.y.
// Config: G (threads per row, a multiple of 32), ROWS (rows per block), VEC (elements per
// load). The sum of squares in fp32 (warp shuffles, then shared memory across the row's
// warps); the normalised value rounded to T before the weight's product, as transformers'
// RMSNorm computes it. Convention: convention.md.
#ifndef VEC
#define VEC 1
#endif
struct alignas(sizeof(T) * VEC) VecT { T v[VEC]; };

extern "C" __global__ void rmsnorm_rows(const T* __restrict__ x, const T* __restrict__ w,
                                        T* __restrict__ out, int R, int C, float eps) {
    __shared__ float part[ROWS][G / 32];
    int row = blockIdx.x * ROWS + threadIdx.y;
    bool live = row < R;                  // no early return: the row's warps meet below
    int lane = threadIdx.x;
    const T* xr = x + (size_t)(live ? row : 0) * C;
    T* orow = out + (size_t)(live ? row : 0) * C;
    bool vec = (VEC > 1) && (C % VEC == 0) &&
               ((((size_t)xr) | ((size_t)orow) | ((size_t)w)) % (sizeof(T) * VEC) == 0);
    float s = 0.f;
    if (live) {
        if (vec) {
            for (int c = lane * VEC; c < C; c += G * VEC) {
                VecT v = *reinterpret_cast<const VecT*>(xr + c);
#pragma unroll
                for (int j = 0; j < VEC; ++j) { float f = to_f32(v.v[j]); s += f * f; }
            }
        } else {
            for (int c = lane; c < C; c += G) { float f = to_f32(xr[c]); s += f * f; }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (G > 32) {
        if ((lane & 31) == 0) part[threadIdx.y][lane >> 5] = s;
        __syncthreads();
        s = 0.f;
#pragma unroll
        for (int i = 0; i < G / 32; ++i) s += part[threadIdx.y][i];
    }
    if (!live) return;
    float r = rsqrtf(s / (float)C + eps);
    if (vec) {
        for (int c = lane * VEC; c < C; c += G * VEC) {
            VecT v = *reinterpret_cast<const VecT*>(xr + c);
            VecT g = *reinterpret_cast<const VecT*>(w + c);
            VecT y;
#pragma unroll
            for (int j = 0; j < VEC; ++j)
                y.v[j] = from_f32<T>(to_f32(g.v[j]) * to_f32(from_f32<T>(to_f32(v.v[j]) * r)));
            *reinterpret_cast<VecT*>(orow + c) = y;
        }
    } else {
        for (int c = lane; c < C; c += G)
            orow[c] = from_f32<T>(to_f32(w[c]) * to_f32(from_f32<T>(to_f32(xr[c]) * r)));
    }
}
