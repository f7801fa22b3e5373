// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid ceil_div(R, ROWS), block (32, ROWS).
// GOOD (serial style): lane 0 of each row's warp walks the row alone, three passes, the
// exponentials in double precision; the other lanes idle. Slow, and right everywhere.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    int row = blockIdx.x * ROWS + threadIdx.y;
    if (row >= R || threadIdx.x != 0) return;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    double m = -INFINITY;
    for (int c = 0; c < C; ++c) m = fmax(m, (double)to_f32(xr[c]));
    double s = 0.0;
    for (int c = 0; c < C; ++c) s += exp((double)to_f32(xr[c]) - m);
    for (int c = 0; c < C; ++c) o[c] = from_f32<T>((float)(exp((double)to_f32(xr[c]) - m) / s));
}
