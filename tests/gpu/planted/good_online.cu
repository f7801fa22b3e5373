// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// GOOD (online style): one pass keeping a running max and sum per lane, lanes combined by
// rescaling; a lane or row with nothing but -inf is guarded (its rescale factor is 0).
__device__ __forceinline__ float rescale(float m, float mn) {
    return m == -INFINITY ? 0.f : __expf(m - mn);
}
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY, s = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) {
        float v = to_f32(xr[c]);
        float mn = fmaxf(m, v);
        if (mn == -INFINITY) continue;
        s = s * rescale(m, mn) + __expf(v - mn);
        m = mn;
    }
    for (int k = 16; k > 0; k >>= 1) {
        float mo = __shfl_xor_sync(0xffffffffu, m, k);
        float so = __shfl_xor_sync(0xffffffffu, s, k);
        float mn = fmaxf(m, mo);
        if (mn != -INFINITY) s = s * rescale(m, mn) + so * rescale(mo, mn);
        m = mn;
    }
    float inv = s > 0.f ? 1.f / s : 0.f;
    for (int c = threadIdx.x; c < C; c += 32)
        o[c] = from_f32<T>(m == -INFINITY ? 0.f : __expf(to_f32(xr[c]) - m) * inv);
}
