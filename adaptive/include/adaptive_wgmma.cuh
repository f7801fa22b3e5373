// adaptive_wgmma.cuh: the warpgroup tensor-core helpers of adaptive's sm_90a variants
// (wgmma.mma_async, Hopper only: a variant including this header compiles for sm_90a and
// claims cc == 90). Included after adaptive_ptx.cuh; the CPU tests emulate every function
// here (tests/cpu/ptx_emu.h).
//
// Shared-memory operands are described by 64-bit descriptors (wgmma_desc) of tiles in the
// 128-byte swizzled layout: rows of 64 16-bit elements (128 bytes), the 16-byte chunk c of
// row r stored at chunk c ^ (r % 8), eight rows (1024 bytes) a swizzle atom; a tile starts
// 1024-byte aligned. Two majors of one layout:
//  - K-major (the k dimension along the row: q and k for S = q kᵀ): element (r, k) of an
//    m-or-n x 16 operand at start + (r / 8) * SBO + (r % 8) * 128 + 2 k, SBO = 1024 for rows
//    that follow each other; the start steps by 32 bytes a k16 step within the 64 elements
//    of a row (the swizzle is applied to the address, so the step stays a plain offset).
//  - MN-major (n along the row, k down the rows: v for O = P v, whose rows are keys):
//    element (k, n) at start + (n / 64) * LBO + 2 (n % 64) + (k % 8) * 128 + (k / 8) * SBO.
// Accumulators (m64nN, fp32): warp w of the warpgroup holds rows 16 w + g and 16 w + g + 8
// (g = lane / 4), d[4 j + e] at column 8 j + 2 (lane % 4) + (e & 1), row + 8 for e >= 2: the
// mma.sync m16n8 C layout repeated over n. A from registers: each warp's 16 rows in the
// mma.sync m16n8k16 A layout.
#ifndef ADAPTIVE_WGMMA_CUH
#define ADAPTIVE_WGMMA_CUH

#if defined(ADAPTIVE_DTYPE_BFLOAT16)
#define ADAPTIVE_WGMMA_AB ".bf16.bf16"
#else
#define ADAPTIVE_WGMMA_AB ".f16.f16"
#endif

// Writes to shared memory by this thread's generic proxy (st.shared, cp.async) made visible
// to the async proxy the wgmma reads through; then a barrier publishes other threads'.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Before a warpgroup's first wgmma of a batch: its register operands (accumulators, A)
// written by ordinary instructions are ordered before the wgmma reads them.
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most PENDING committed groups of this warpgroup are in flight.
template <int PENDING>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}
// Keeps the compiler from moving reads or writes of the N registers at r across this
// point: around a batch of wgmma (which read and write them asynchronously until the wait).
template <int N>
__device__ __forceinline__ void wgmma_hold(float* r) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_hold(unsigned* r) {
    #pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}

// The descriptor of a 128-byte-swizzled operand at shared address `start` (offsets in bytes,
// multiples of 16; see the top of this file for what LBO and SBO step over).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned start, unsigned lbo,
                                                         unsigned sbo) {
    return (unsigned long long)((start & 0x3FFFFu) >> 4)
           | (unsigned long long)((lbo >> 4) & 0x3FFFu) << 16
           | (unsigned long long)((sbo >> 4) & 0x3FFFu) << 32
           | 1ull << 62;                                  // 128-byte swizzle
}

// The accumulator operands of m64n64 (32 registers a thread) and m64n128 (64), and their
// places in the instruction's text: the same for both products.
#define ADAPTIVE_WGMMA_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
    "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ADAPTIVE_WGMMA_D32 ADAPTIVE_WGMMA_D8(0), ADAPTIVE_WGMMA_D8(8), ADAPTIVE_WGMMA_D8(16), \
    ADAPTIVE_WGMMA_D8(24)
#define ADAPTIVE_WGMMA_D64 ADAPTIVE_WGMMA_D32, ADAPTIVE_WGMMA_D8(32), ADAPTIVE_WGMMA_D8(40), \
    ADAPTIVE_WGMMA_D8(48), ADAPTIVE_WGMMA_D8(56)
#define ADAPTIVE_WGMMA_L32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, " \
    "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31"
#define ADAPTIVE_WGMMA_L64 ADAPTIVE_WGMMA_L32 ", %32, %33, %34, %35, %36, %37, %38, %39, " \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ADAPTIVE_WGMMA_R32 "{" ADAPTIVE_WGMMA_L32 "}"
#define ADAPTIVE_WGMMA_R64 "{" ADAPTIVE_WGMMA_L64 "}"
// one wgmma with the accumulators always added to (scale-d 1, a predicate the instruction
// takes in a register), SHAPE "m64nNk16", then its operands after the accumulators
#define ADAPTIVE_WGMMA(SHAPE, D_REGS, OPERANDS) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32" \
    ADAPTIVE_WGMMA_AB " " D_REGS ", " OPERANDS ";\n}\n"

// d (m64nN fp32) += a (64 x 16, K-major in shared memory) * b (N x 16, K-major): S = q kᵀ.
// (Always accumulating: with the first k-step's scale-d 0 in place of zeroed accumulators,
// ptxas serialized attention_wgmma's PIPE = 1 chains, C7511.)
template <int N>
__device__ __forceinline__ void wgmma_ss(float* d, unsigned long long a_desc,
                                         unsigned long long b_desc) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
    if constexpr (N == 64)
        asm volatile(ADAPTIVE_WGMMA("m64n64k16", ADAPTIVE_WGMMA_R32, "%32, %33, p, 1, 1, 0, 0")
                     : ADAPTIVE_WGMMA_D32 : "l"(a_desc), "l"(b_desc));
    else
        asm volatile(ADAPTIVE_WGMMA("m64n128k16", ADAPTIVE_WGMMA_R64, "%64, %65, p, 1, 1, 0, 0")
                     : ADAPTIVE_WGMMA_D64 : "l"(a_desc), "l"(b_desc));
}

// d (m64nN fp32) += a (64 x 16 from registers) * b (16 x N, MN-major in shared memory):
// O += P v.
template <int N>
__device__ __forceinline__ void wgmma_rs_tn(float* d, const unsigned* a,
                                            unsigned long long b_desc) {
    static_assert(N == 64 || N == 128, "wgmma_rs_tn: N is 64 or 128");
    if constexpr (N == 64)
        asm volatile(ADAPTIVE_WGMMA("m64n64k16", ADAPTIVE_WGMMA_R32,
                                    "{%32, %33, %34, %35}, %36, p, 1, 1, 1")
                     : ADAPTIVE_WGMMA_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
    else
        asm volatile(ADAPTIVE_WGMMA("m64n128k16", ADAPTIVE_WGMMA_R64,
                                    "{%64, %65, %66, %67}, %68, p, 1, 1, 1")
                     : ADAPTIVE_WGMMA_D64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}

#endif  // ADAPTIVE_WGMMA_CUH
