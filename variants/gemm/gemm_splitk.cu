// gemm, split-K for small M: grid.z = SPLITS slices of K; each block computes a partial
// BM x BN tile (SIMT, TM x TN per thread) into the fp32 workspace; the last block to
// finish a tile (an atomic counter per tile) sums the slices and writes out, then resets
// its counter to zero so the workspace is reusable. Config: BM, BN, BK, TM, TN, SPLITS.
// Workspace: SPLITS*M*N floats, then one unsigned counter per output tile.
#define THREADS ((BM / TM) * (BN / TN))

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_splitk(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
            int M, int N, int K, float* __restrict__ workspace) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN + 4];
    __shared__ unsigned last;
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int z = blockIdx.z;
    const int kchunk = ((K + SPLITS - 1) / SPLITS + BK - 1) / BK * BK;
    const int kbeg = z * kchunk, kend = min(K, kbeg + kchunk);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        for (int i = tid; i < BM * BK; i += THREADS) {
            int r = i / BK, c = i % BK;
            int gm = m0 + r, gk = k0 + c;
            As[c][r] = (gm < M && gk < kend) ? to_f32(a[(size_t)gm * K + gk]) : 0.f;
        }
        for (int i = tid; i < BK * BN; i += THREADS) {
            int r = i / BN, c = i % BN;
            int gk = k0 + r, gn = n0 + c;
            Bs[r][c] = (gk < kend && gn < N) ? to_f32(b[(size_t)gk * N + gn]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float ra[TM], rb[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = As[kk][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = Bs[kk][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads();
    }
    float* part = workspace + (size_t)z * M * N;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int gm = m0 + ty * TM + i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int gn = n0 + tx * TN + j;
            if (gn < N) part[(size_t)gm * N + gn] = acc[i][j];
        }
    }
    __threadfence();
    __syncthreads();
    unsigned* counters = reinterpret_cast<unsigned*>(workspace + (size_t)SPLITS * M * N);
    unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(&counters[tile], 1u) == SPLITS - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        int gm = m0 + ty * TM + i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            int gn = n0 + tx * TN + j;
            if (gn >= N) continue;
            float s = 0.f;
            for (int zz = 0; zz < SPLITS; ++zz)
                s += __ldcg(workspace + (size_t)zz * M * N + (size_t)gm * N + gn);
            out[(size_t)gm * N + gn] = from_f32<T>(s);
        }
    }
    if (tid == 0) counters[tile] = 0u;
}
