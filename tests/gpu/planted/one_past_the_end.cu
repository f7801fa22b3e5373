// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// BAD (guards): right values, and the last row's lane 0 also writes one element past the
// end of the output (an off-by-one tail); only the guard region after the output sees it.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < C; c += 32) m = fmaxf(m, to_f32(xr[c]));
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float s = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) s += __expf(to_f32(xr[c]) - m);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < C; c += 32) o[c] = from_f32<T>(__expf(to_f32(xr[c]) - m) * inv);
    if (row == R - 1 && threadIdx.x == 0) o[C] = from_f32<T>(0.f);
}
