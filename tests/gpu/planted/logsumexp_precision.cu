// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// BAD (regime large, fp32): out = exp(x - lse) with lse = max + log(sum) rounded to fp32:
// at |x| ~ 1e4 the subtraction loses ~1e-3 relative; exact at ordinary magnitudes.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < C; c += 32) m = fmaxf(m, to_f32(xr[c]));
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float s = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) s += expf(to_f32(xr[c]) - m);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    float lse = m + logf(s);
    for (int c = threadIdx.x; c < C; c += 32) o[c] = from_f32<T>(expf(to_f32(xr[c]) - lse));
}
