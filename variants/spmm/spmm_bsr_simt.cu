// spmm, block-sparse kernel on the CUDA cores (float32, or float16 with float32 sums):
// out[M, N] = w[M, K] @ b[K, N] with w in BSR (square BS x BS blocks, row-major each).
// A CTA owns one block row and TN columns of out and visits only the non-empty blocks of
// its block row; each thread keeps an RM x 4 tile of sums (RM = BS * TN / 4 / threads).
// Rows of b past K and columns past N read as zero.
// Config macros: BS (16, 32, 64), TN (64, 128), NWARPS (4, 8).
// T, to_f32 and from_f32 come from the backend's prelude (adaptive/nvrtc.py).

#ifndef BS
#define BS 32
#endif
#ifndef TN
#define TN 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif

#define THREADS (NWARPS * 32)
#define TX (TN / 4)
#define TY (THREADS / TX)
#define RM (BS / TY)
#define A_LD (BS + 1)

static_assert(THREADS % TX == 0 && BS % TY == 0 && RM >= 1, "BS x TN must tile the threads");


extern "C" __global__ void __launch_bounds__(THREADS)
spmm_bsr_simt(const int* __restrict__ indptr, const int* __restrict__ indices,
              const T* __restrict__ values, const T* __restrict__ b,
              T* __restrict__ out, int M, int N, int K)
{
    __shared__ float a_s[BS * A_LD];
    __shared__ __align__(16) float b_s[BS * TN];
    const int br = blockIdx.y, n0 = blockIdx.x * TN;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    float acc[RM][4];
    #pragma unroll
    for (int i = 0; i < RM; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    const int start = indptr[br], end = indptr[br + 1];
    for (int blk = start; blk < end; ++blk) {
        const T* a_blk = values + (size_t)blk * BS * BS;
        const int k0 = indices[blk] * BS;
        for (int e = threadIdx.x; e < BS * BS; e += THREADS)
            a_s[(e / BS) * A_LD + e % BS] = to_f32(a_blk[e]);
        for (int e = threadIdx.x; e < BS * TN; e += THREADS) {
            const int r = e / TN, c = e % TN, k = k0 + r, n = n0 + c;
            b_s[e] = (k < K && n < N) ? to_f32(b[(size_t)k * N + n]) : 0.f;
        }
        __syncthreads();
        #pragma unroll 8
        for (int k = 0; k < BS; ++k) {
            const float4 bv = *reinterpret_cast<const float4*>(b_s + k * TN + tx * 4);
            #pragma unroll
            for (int i = 0; i < RM; ++i) {
                const float a = a_s[(ty * RM + i) * A_LD + k];
                acc[i][0] += a * bv.x; acc[i][1] += a * bv.y;
                acc[i][2] += a * bv.z; acc[i][3] += a * bv.w;
            }
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int row = br * BS + ty * RM + i;
        if (row >= M) continue;
        #pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = n0 + tx * 4 + j;
            if (col < N) out[(size_t)row * N + col] = from_f32<T>(acc[i][j]);
        }
    }
}
