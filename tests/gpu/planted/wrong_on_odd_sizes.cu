// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// BAD (wrong_on_odd_sizes): loads 4 elements per lane with no tail loop; right when C is a
// multiple of 128, wrong (tail unwritten, sum short) otherwise.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    int full = C / 128 * 128;
    float m = -INFINITY;
    for (int c = threadIdx.x * 4; c < full; c += 128)
        for (int j = 0; j < 4; ++j) m = fmaxf(m, to_f32(xr[c + j]));
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float s = 0.f;
    for (int c = threadIdx.x * 4; c < full; c += 128)
        for (int j = 0; j < 4; ++j) s += __expf(to_f32(xr[c + j]) - m);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    for (int c = threadIdx.x * 4; c < full; c += 128)
        for (int j = 0; j < 4; ++j) o[c + j] = from_f32<T>(__expf(to_f32(xr[c + j]) - m) / s);
}
