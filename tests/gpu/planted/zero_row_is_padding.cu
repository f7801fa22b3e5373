// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// BAD (regimes tiny, constant): a row whose values are all (nearly) zero is taken for
// padding and written as zeros; its softmax is uniform, 1/C.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY, a = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) {
        m = fmaxf(m, to_f32(xr[c]));
        a = fmaxf(a, fabsf(to_f32(xr[c])));
    }
    for (int k = 16; k > 0; k >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, k));
    }
    float s = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) s += __expf(to_f32(xr[c]) - m);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    float inv = a < 1e-30f ? 0.f : 1.f / s;
    for (int c = threadIdx.x; c < C; c += 32) o[c] = from_f32<T>(__expf(to_f32(xr[c]) - m) * inv);
}
