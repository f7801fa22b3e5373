// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// BAD (regime masked): one-pass online softmax per lane, lanes combined by rescaling. A
// lane whose columns are all -inf computes exp(-inf - -inf) = NaN and poisons its row
// (causal rows, key padding, a single visible key); right when nothing is masked.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY, s = 0.f;
    for (int c = threadIdx.x; c < C; c += 32) {
        float v = to_f32(xr[c]);
        float mn = fmaxf(m, v);
        s = s * __expf(m - mn) + __expf(v - mn);      // m = mn = -inf: NaN
        m = mn;
    }
    for (int k = 16; k > 0; k >>= 1) {
        float mo = __shfl_xor_sync(0xffffffffu, m, k);
        float so = __shfl_xor_sync(0xffffffffu, s, k);
        float mn = fmaxf(m, mo);
        s = s * __expf(m - mn) + so * __expf(mo - mn);
        m = mn;
    }
    float inv = 1.f / s;
    for (int c = threadIdx.x; c < C; c += 32) o[c] = from_f32<T>(__expf(to_f32(xr[c]) - m) * inv);
}
