// adaptive_ptx.cuh: the inline-PTX helpers of adaptive's CUDA variants (sm_80 and later):
// cp.async copies into shared memory, ldmatrix fragment loads, mma.sync on tensor cores,
// ex2 and fragment packing. A variant includes it by name (adaptive_ptx.cuh); the prelude
// (T, to_f32, ADAPTIVE_DTYPE_*, cuda_fp16.h, cuda_bf16.h) comes before the variant's text.
// The library puts this text in place of that line (adaptive/headers.py), so the header is
// part of every kernel's cache key and travels inside each variant's source in packs.
// Shared-memory operands are 32-bit shared addresses (smem_u32) or generic pointers into
// shared memory. The CPU tests emulate every function here (tests/cpu/ptx_emu.h).
#ifndef ADAPTIVE_PTX_CUH
#define ADAPTIVE_PTX_CUH

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- cp.async: 16 bytes global -> shared, through L2 only ----------------------------------
// src_bytes < 16 fills the rest with zeros (0: all zeros; src must still be a valid address).
// Completion: cp_async_commit() closes a group; cp_async_wait<PENDING>() waits until at most
// PENDING groups of this thread are in flight (other threads' copies: a __syncthreads() too).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    cp_async16(smem_u32(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_u32(dst)), "l"(src));
}
// A bool would become a size of 1 byte: pass `ok ? 16 : 0`.
__device__ void cp_async16(unsigned dst, const void* src, bool) = delete;
__device__ void cp_async16(void* dst, const void* src, bool) = delete;
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// ---- ldmatrix: four 8x8 b16 matrices, row addresses from lanes 8j..8j+7 for matrix j ------
// Lane l's register j holds row l/4, columns 2(l%4), +1 of matrix j (trans: column l/4 of
// rows 2(l%4), +1). The four-register form writes registers that need not be adjacent.
__device__ __forceinline__ void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2,
                                            unsigned& r3, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2,
                                                  unsigned& r3, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
    ldmatrix_x4(r[0], r[1], r[2], r[3], addr);
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
    ldmatrix_x4_trans(r[0], r[1], r[2], r[3], addr);
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* p) {
    ldmatrix_x4(r, smem_u32(p));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const void* p) {
    ldmatrix_x4_trans(r, smem_u32(p));
}

// ---- mma.sync m16n8k16: c (4 fp32) += a (4 regs, row) * b (2 regs, col) -------------------
// ELEM is the 16-bit input type, __half or __nv_bfloat16 (default: the variant's T).
template <typename ELEM = T>
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    static_assert(sizeof(ELEM) != sizeof(ELEM), "mma16816: inputs are __half or __nv_bfloat16");
}
template <>
__device__ __forceinline__ void mma16816<__half>(float* c, const unsigned* a,
                                                 const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float* c, const unsigned* a,
                                                        const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- mma.sp m16n8k32, fp16, sparsity selector 0: 2:4-compressed a (16 x 16 kept values in
// the m16n8k16 A layout), metadata e (4-bit position pairs; rows g low half, g + 8 high half,
// from lanes 4g + t for logical columns 16t..16t+15), b 32 x 8 in four registers.
__device__ __forceinline__ void mma_sp16832(float* c, const uint4& a, const unsigned* b,
                                            unsigned e) {
    asm volatile("mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w),
                   "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
}

// 16 bytes of read-only global memory that is read once: not kept in L1.
__device__ __forceinline__ uint4 load_stream16(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// ---- scalars -------------------------------------------------------------------------------
// 2^x by the SFU (ex2.approx.ftz): ex2(-inf) = +0, relative error about 2^-22.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two floats rounded to ELEM (default T; __half or __nv_bfloat16) in one register, a low.
template <typename ELEM = T>
__device__ __forceinline__ unsigned pack2(float a, float b) {
    static_assert(sizeof(ELEM) != sizeof(ELEM), "pack2 makes __half or __nv_bfloat16 pairs");
    return 0u;
}
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
}

#endif  // ADAPTIVE_PTX_CUH
