// Planted softmax kernel for the verifier tests. Convention: variants/softmax/convention.md
// (x[R, C] -> out[R, C], args x, out, R, C). Launch: grid R, block THREADS (one block per row).
// BAD (race): a block-wide reduction through shared memory with the __syncthreads() calls
// left out: warp 0 reads partial sums other warps may not have written yet, and every
// thread reads the broadcast total before it is stored.
extern "C" __global__ void planted(const T* __restrict__ x, T* __restrict__ out, int R, int C) {
    __shared__ float part[32];
    __shared__ float total[2];
    int row = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int nwarps = blockDim.x / 32;
    const T* xr = x + (size_t)row * C;
    T* o = out + (size_t)row * C;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f32(xr[c]));
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    if (lane == 0) part[warp] = m;
    // missing __syncthreads()
    if (warp == 0) {
        float v = lane < nwarps ? part[lane] : -INFINITY;
        for (int k = 16; k > 0; k >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, k));
        if (lane == 0) total[0] = v;
    }
    // missing __syncthreads()
    m = total[0];
    float s = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += __expf(to_f32(xr[c]) - m);
    for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
    if (lane == 0) part[warp] = s;
    if (warp == 0) {
        float v = lane < nwarps ? part[lane] : 0.f;
        for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xffffffffu, v, k);
        if (lane == 0) total[1] = v;
    }
    float inv = 1.f / total[1];
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = from_f32<T>(__expf(to_f32(xr[c]) - m) * inv);
}
