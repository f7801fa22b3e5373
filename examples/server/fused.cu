// Fused elementwise glue of the example block (examples/server/block.py) on CUDA.
//
// Compiled after adaptive's dtype prelude (adaptive/nvrtc.py: `T`, to_f32, from_f32), so one
// source serves float16 and float32. Every kernel takes row-major contiguous arrays.
//
//   residual_layernorm  s = x [+ r | + rᵀ]; optionally writes s, layernorm(s) and/or
//                       layernorm(s)ᵀ ([d, P], the spmm operand), fp32 statistics
//   gelu_inplace        u = gelu_tanh(u)
//   pad_cast            float32 [L, d] -> T [P, d], rows L.. zero (a request's input)
//   split_heads         qkv [P, 3, H, Dh] -> [3, H, P, Dh] (q, k, v contiguous)
//   merge_heads         a [H, P, Dh] -> [P, H * Dh]
//   summarise           argmax and max of probs[L - 1], per-block sums of squares of x[:L]

#define TR 32           // rows of s per block
#define TC 32           // columns per shared-memory tile
#define NY 8            // blockDim.y (blockDim.x is 32): 256 threads
#define RPT (TR / NY)   // rows per thread
#define COLS 256        // columns a block writes (gridDim.y = ceil(d / COLS))

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// s[p0 + row][c0 + col] for the block's 32 x 32 tile into sh[row][col] (fp32; 0 outside).
// rt: r is stored transposed, [d, P]; it is read along p (coalesced) through `tmp`.
// Ends with the block synchronised.
__device__ __forceinline__ void load_tile(float (*sh)[TC + 1], float (*tmp)[TR + 1],
                                          const T* __restrict__ x, const T* __restrict__ r,
                                          int rt, int P, int d, int p0, int c0) {
    const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int k = 0; k < RPT; ++k) {
        const int row = ty + k * NY, p = p0 + row, c = c0 + tx;
        float v = 0.f;
        if (p < P && c < d) {
            const size_t i = (size_t)p * d + c;
            v = to_f32(x[i]);
            if (r != nullptr && !rt) v += to_f32(r[i]);
        }
        sh[row][tx] = v;
    }
    if (r != nullptr && rt) {
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int col = ty + k * NY, c = c0 + col, p = p0 + tx;
            tmp[col][tx] = (p < P && c < d) ? to_f32(r[(size_t)c * P + p]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int row = ty + k * NY;
            sh[row][tx] += tmp[tx][row];
        }
    }
    __syncthreads();
}

// grid (ceil(P / 32), ceil(d / 256)), block (32, 8). Each block computes the statistics of
// its 32 rows over all d columns (one pass, shifted by the row's first value so the fp32
// sums stay well conditioned), then writes its 256-column slice. x_out must not alias x
// or r (other blocks still read them). Null outputs are skipped; with y and yt both null
// the statistics are skipped too (a plain residual add).
extern "C" __global__ void __launch_bounds__(TR * NY)
residual_layernorm(const T* __restrict__ x, const T* __restrict__ r, int r_transposed,
                   T* __restrict__ x_out, T* __restrict__ y, T* __restrict__ yt,
                   int P, int d, float eps) {
    __shared__ float sh[TR][TC + 1];
    __shared__ float tmp[TC][TR + 1];
    __shared__ float mean_s[TR], rstd_s[TR];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int p0 = blockIdx.x * TR;
    const int rt = r_transposed;
    if (y != nullptr || yt != nullptr) {
        float shift[RPT], sum[RPT], sq[RPT];
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int p = p0 + ty + k * NY;
            float s0 = 0.f;
            if (p < P) {
                s0 = to_f32(x[(size_t)p * d]);
                if (r != nullptr) s0 += to_f32(rt ? r[p] : r[(size_t)p * d]);
            }
            shift[k] = s0;
            sum[k] = 0.f;
            sq[k] = 0.f;
        }
        for (int c0 = 0; c0 < d; c0 += TC) {
            load_tile(sh, tmp, x, r, rt, P, d, p0, c0);
            if (c0 + tx < d) {
#pragma unroll
                for (int k = 0; k < RPT; ++k) {
                    const float v = sh[ty + k * NY][tx] - shift[k];
                    sum[k] += v;
                    sq[k] += v * v;
                }
            }
            __syncthreads();   // the next tile overwrites sh and tmp
        }
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const float s = warp_sum(sum[k]), q = warp_sum(sq[k]);
            if (tx == 0) {
                const float m = s / d;
                mean_s[ty + k * NY] = shift[k] + m;
                rstd_s[ty + k * NY] = rsqrtf(fmaxf(q / d - m * m, 0.f) + eps);
            }
        }
        __syncthreads();
    }
    const int c_end = min(d, (int)(blockIdx.y + 1) * COLS);
    for (int c0 = blockIdx.y * COLS; c0 < c_end; c0 += TC) {
        load_tile(sh, tmp, x, r, rt, P, d, p0, c0);
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
            const int row = ty + k * NY, p = p0 + row, c = c0 + tx;
            const float s = sh[row][tx];
            if (p < P && c < d) {
                const size_t i = (size_t)p * d + c;
                if (x_out != nullptr) x_out[i] = from_f32<T>(s);
                if (y != nullptr) y[i] = from_f32<T>((s - mean_s[row]) * rstd_s[row]);
            }
            if (yt != nullptr) sh[row][tx] = (s - mean_s[row]) * rstd_s[row];
        }
        if (yt != nullptr) {
            __syncthreads();
#pragma unroll
            for (int k = 0; k < RPT; ++k) {
                const int col = ty + k * NY, c = c0 + col, p = p0 + tx;
                if (p < P && c < d) yt[(size_t)c * P + p] = from_f32<T>(sh[tx][col]);
            }
        }
        __syncthreads();
    }
}

// u = 0.5 u (1 + tanh(0.7978845608 (u + 0.044715 u³))), computed in fp32; grid-stride.
extern "C" __global__ void gelu_inplace(T* __restrict__ u, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = to_f32(u[i]);
        u[i] = from_f32<T>(0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
    }
}

// dst[p, c] = p < L ? src[p, c] : 0 in T: the request's float32 rows, padded to P on the
// device (no host-side fp16 conversion or zero padding); 32-bit indices (< 2^31).
extern "C" __global__ void pad_cast(const float* __restrict__ src, T* __restrict__ dst,
                                    int L, int P, int d) {
    const unsigned n = (unsigned)P * d, valid = (unsigned)L * d;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = from_f32<T>(i < valid ? src[i] : 0.f);
}

// out[j, h, p, e] = qkv[p, j, h, e] for j in {q, k, v}; grid-stride over qkv's elements.
// 32-bit index maths (64-bit division is slow): the launcher keeps P * 3 * H * Dh < 2^31.
extern "C" __global__ void split_heads(const T* __restrict__ qkv, T* __restrict__ out,
                                       int P, int H, int Dh) {
    const unsigned n = (unsigned)P * 3u * H * Dh;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned e = i % Dh, t = i / Dh, h = t % H, t2 = t / H, j = t2 % 3u, p = t2 / 3u;
        out[((j * H + h) * P + p) * Dh + e] = qkv[i];
    }
}

// out[p, h, e] = a[h, p, e]; grid-stride over out's elements (32-bit, as split_heads).
extern "C" __global__ void merge_heads(const T* __restrict__ a, T* __restrict__ out,
                                       int P, int H, int Dh) {
    const unsigned n = (unsigned)P * H * Dh;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned e = i % Dh, t = i / Dh, h = t % H, p = t / H;
        out[i] = a[(h * P + p) * Dh + e];
    }
}

// out[0] = argmax probs[L-1] (first of equals), out[1] = its value (block 0), and
// out[2 + b] = block b's share of the sum of squares of x[:L]; the host adds the shares, so
// a request needs one small copy back instead of three. Any grid; blockDim a multiple of 32.
extern "C" __global__ void __launch_bounds__(1024)
summarise(const T* __restrict__ x, const T* __restrict__ probs, int L, int d, int V,
          float* __restrict__ out) {
    __shared__ float red_sq[32], red_v[32];
    __shared__ int red_i[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float sq = 0.f;
    const long long n = (long long)L * d, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_f32(x[i]);
        sq += v * v;
    }
    float best = -INFINITY;
    int arg = 0x7fffffff;
    if (blockIdx.x == 0) {
        const T* row = probs + (long long)(L - 1) * V;
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float v = to_f32(row[j]);
            if (v > best) { best = v; arg = j; }      // j rises: the first of equals stays
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sq += __shfl_xor_sync(0xffffffffu, sq, o);
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, arg, o);
        if (ov > best || (ov == best && oi < arg)) { best = ov; arg = oi; }
    }
    if (lane == 0) { red_sq[warp] = sq; red_v[warp] = best; red_i[warp] = arg; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f, b = -INFINITY;
        int a = 0x7fffffff;
        for (int w = 0; w < nwarps; ++w) {
            s += red_sq[w];
            if (red_v[w] > b || (red_v[w] == b && red_i[w] < a)) { b = red_v[w]; a = red_i[w]; }
        }
        out[2 + blockIdx.x] = s;
        if (blockIdx.x == 0) {
            out[0] = (float)a;
            out[1] = b;
        }
    }
}
