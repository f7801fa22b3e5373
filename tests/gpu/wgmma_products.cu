// The two wgmma products of adaptive_wgmma.cuh alone, on one warpgroup, with the tile layout
// and descriptor steps attention_wgmma.cu uses: where the attention kernel disagrees with the
// reference on the device, these say which product (and which layout path) does.
//   wgmma_ss_product: d [64 x PN] = a [64 x PK] b [PN x PK]ᵀ, a and b stored 128-byte swizzled
//     K-major (PK = 128: two 64-column halves a block apart), PK / 16 k-steps.
//   wgmma_rs_product: d [64 x PN] = p [64 x PK] v [PK x PN], p from registers (the m16n8k16 A
//     layout, a warp's 16 rows), v stored swizzled MN-major (PN = 128: its halves LBO apart).
// d is written row-major from the accumulator layout. Config macros: PN, PK (64 or 128).
// The descriptors' byte offsets are arguments (a_lbo, a_sbo: q and k's; b_lbo, b_sbo: v's),
// the PTX ISA's reading (16, 1024; PK * 128, 1024) by default, so that where the device
// disagrees a test can try other readings without another compile.
// tests/cpu/test_attention_wgmma_emu.py runs them emulated, tests/gpu/test_attention_wgmma_cuda.py
// on the device.

#include "adaptive_ptx.cuh"
#include "adaptive_wgmma.cuh"

#ifndef PN
#define PN 64
#endif
extern __shared__ __align__(16) unsigned char smem_raw[];   // both kernels' tiles
#ifndef PK
#define PK 64
#endif

// byte offset of 16-byte chunk c (of COLS / 8) of row r in a tile of ROWS rows (as
// attention_wgmma.cu's swizzled<ROWS>)
__device__ __forceinline__ unsigned chunk_at(int rows, int r, int c) {
    return (c >> 3) * (rows * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// ROWS x COLS of src (row-major) into the swizzled tile at shared address dst, 128 threads
__device__ __forceinline__ void store_tile(unsigned char* base, unsigned dst, const T* src,
                                           int rows, int cols) {
    for (int idx = threadIdx.x; idx < rows * cols / 8; idx += 128) {
        const int r = idx / (cols / 8), c = idx % (cols / 8);
        *reinterpret_cast<uint4*>(base + dst + chunk_at(rows, r, c)) =
            *reinterpret_cast<const uint4*>(src + r * cols + c * 8);
    }
}

__device__ __forceinline__ void write_d(float* out, const float* d) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < PN / 8; ++j)
        for (int e = 0; e < 4; ++e)
            out[(warp * 16 + g + 8 * (e >> 1)) * PN + 8 * j + 2 * t + (e & 1)] = d[4 * j + e];
}

extern "C" __global__ void __launch_bounds__(128)
wgmma_ss_product(const T* a, const T* b, float* out, int a_lbo, int a_sbo) {
    const unsigned raw = smem_u32(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* p = smem_raw - raw;               // shared address -> generic pointer
    const unsigned a_s = base, b_s = base + 64 * PK * 2;
    store_tile(p, a_s, a, 64, PK);
    store_tile(p, b_s, b, PN, PK);
    fence_proxy_async();
    __syncthreads();
    float d[PN / 2];
    for (int i = 0; i < PN / 2; ++i) d[i] = 0.f;
    wgmma_hold<PN / 2>(d);
    wgmma_fence();
    #pragma unroll
    for (int ks = 0; ks < PK / 16; ++ks) {
        const unsigned half = ks >> 2, col = (ks & 3) * 32;
        wgmma_ss<PN>(d, wgmma_desc(a_s + half * (64 * 128) + col, a_lbo, a_sbo),
                     wgmma_desc(b_s + half * (PN * 128) + col, a_lbo, a_sbo));
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<PN / 2>(d);
    write_d(out, d);
}

extern "C" __global__ void __launch_bounds__(128)
wgmma_rs_product(const T* pm, const T* v, float* out, int b_lbo, int b_sbo) {
    const unsigned raw = smem_u32(smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* p = smem_raw - raw;
    store_tile(p, base, v, PK, PN);                  // PK rows (keys) of PN columns
    fence_proxy_async();
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    unsigned a[PK / 16][4];                          // the m16n8k16 A layout of warp's rows
    for (int kk = 0; kk < PK / 16; ++kk) {
        const T* r0 = pm + (warp * 16 + g) * PK + kk * 16 + 2 * t;
        const T* r8 = r0 + 8 * PK;
        a[kk][0] = pack2(to_f32(r0[0]), to_f32(r0[1]));
        a[kk][1] = pack2(to_f32(r8[0]), to_f32(r8[1]));
        a[kk][2] = pack2(to_f32(r0[8]), to_f32(r0[9]));
        a[kk][3] = pack2(to_f32(r8[8]), to_f32(r8[9]));
    }
    float d[PN / 2];
    for (int i = 0; i < PN / 2; ++i) d[i] = 0.f;
    wgmma_hold<PN / 2>(d);
    wgmma_hold<PK / 4>(&a[0][0]);
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < PK / 16; ++kk)
        wgmma_rs_tn<PN>(d, a[kk], wgmma_desc(base + kk * 2048, b_lbo, b_sbo));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<PN / 2>(d);
    wgmma_hold<PK / 4>(&a[0][0]);
    write_d(out, d);
}
