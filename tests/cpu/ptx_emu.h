// The C++ emulation of adaptive/include/adaptive_ptx.cuh, and the fp16 CUDA built-ins the
// tensor-core kernels use, for running them on the CPU under cuda_emu.HEADER (one thread per
// CUDA thread; warp-wide instructions exchange registers through the warp's barrier).
// fp16 only (__half is _Float16); fragment layouts are the PTX ISA's, as the H200 runs them
// (test_spmm_grouped_emu.py checks a kernel whose results the GPU tests check). Copies land
// at issue: a missing cp.async wait is not caught. Every function the header defines is
// defined here (test_ptx_header.py checks).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#define __align__(n)

// ---- fp16 and vector built-ins -------------------------------------------------------------
typedef _Float16 __half;
struct __half2 { __half x, y; };
// a fault the GPU raises and x86 does not (a misaligned access, run S8: a float4 at a 24-byte
// stride): written to $CUDA_EMU_FAULTS (the tests' conftest fails the test that made it,
// cuda_emu.fault_reports) and to stderr; the emulation goes on
static void emu_fault(const char* what, const void* p, int bytes) {
    static std::atomic<int> reported{0};
    if (reported++ >= 64) return;                 // the first ones say where
    char text[200];
    std::snprintf(text, sizeof text, "misaligned address: %s at %p (needs %d-byte alignment), "
                  "thread %d\n", what, p, bytes, emu_tid());
    std::fputs(text, stderr);
    if (const char* path = std::getenv("CUDA_EMU_FAULTS")) {
        if (FILE* f = std::fopen(path, "a")) {
            std::fputs(text, f);
            std::fclose(f);
        }
    }
}
static inline void emu_check_align(const void* p, int bytes, const char* what) {
    if (reinterpret_cast<std::uintptr_t>(p) % bytes) emu_fault(what, p, bytes);
}
// CUDA's vector types, aligned as CUDA's are, and every copy of one checked: a load or a
// store through a misaligned pointer is the GPU's misaligned-address fault
#define EMU_VEC4(name, E, A)                                                               \
    struct alignas(A) name {                                                               \
        E x, y, z, w;                                                                      \
        name() = default;                                                                  \
        constexpr name(E a, E b, E c, E d) : x(a), y(b), z(c), w(d) {}                     \
        name(const name& o) : x(o.x), y(o.y), z(o.z), w(o.w) {                             \
            emu_check_align(&o, A, #name " load");                                        \
        }                                                                                  \
        name& operator=(const name& o) {                                                   \
            emu_check_align(this, A, #name " store");                                     \
            emu_check_align(&o, A, #name " load");                                        \
            x = o.x; y = o.y; z = o.z; w = o.w;                                            \
            return *this;                                                                  \
        }                                                                                  \
    };
EMU_VEC4(uint4, unsigned, 16)
EMU_VEC4(float4, float, 16)
struct alignas(8) float2 {
    float x, y;
    float2() = default;
    constexpr float2(float a, float b) : x(a), y(b) {}
    float2(const float2& o) : x(o.x), y(o.y) { emu_check_align(&o, 8, "float2 load"); }
    float2& operator=(const float2& o) {
        emu_check_align(this, 8, "float2 store");
        emu_check_align(&o, 8, "float2 load");
        x = o.x; y = o.y;
        return *this;
    }
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline __half __float2half(float x) { return (__half)x; }
inline __half __float2half_rn(float x) { return (__half)x; }
inline __half2 __floats2half2_rn(float a, float b) { return {(__half)a, (__half)b}; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned short __half_as_ushort(__half h) {
    unsigned short s;
    std::memcpy(&s, &h, 2);
    return s;
}
template <> inline __half from_f32<__half>(float x) { return (__half)x; }
inline float to_f32(__half x) { return (float)x; }
template <class V> inline V __ldg(const V* p) { return *p; }
template <class V> inline V __ldcg(const V* p) { return *p; }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline float2 atomicAdd(float2* p, float2 v) {        // sm_90's vector form
    const float2 old = {atomicAdd(&p->x, v.x), atomicAdd(&p->y, v.y)};
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- shared memory and warp exchanges ------------------------------------------------------
alignas(1024) static unsigned char emu_smem[240 * 1024];   // a kernel's dynamic shared memory
static const void* emu_ptrs[1024];
static unsigned emu_regs[1024][10];
static void emu_warp_sync() { emu_warp_barriers[emu_tid() / 32]->arrive_and_wait(); }
static unsigned emu_pack(__half lo, __half hi) {
    unsigned short a, b;
    std::memcpy(&a, &lo, 2);
    std::memcpy(&b, &hi, 2);
    return a | (unsigned(b) << 16);
}
static __half emu_half(unsigned r, int i) {
    unsigned short s = i ? (r >> 16) : (r & 0xffff);
    __half h;
    std::memcpy(&h, &s, 2);
    return h;
}

// ---- adaptive_ptx.cuh ----------------------------------------------------------------------
// shared addresses are offsets into emu_smem
inline unsigned smem_u32(const void* p) {
    return (unsigned)((const unsigned char*)p - emu_smem);
}

inline void cp_async16(unsigned dst, const void* src, int src_bytes) {
    emu_check_align(emu_smem + dst, 16, "cp.async shared destination");
    emu_check_align(src, 16, "cp.async global source");
    std::memset(emu_smem + dst, 0, 16);
    std::memcpy(emu_smem + dst, src, src_bytes);
}
inline void cp_async16(void* dst, const void* src, int src_bytes) {
    cp_async16(smem_u32(dst), src, src_bytes);
}
inline void cp_async16(void* dst, const void* src) { cp_async16(dst, src, 16); }
void cp_async16(unsigned dst, const void* src, bool) = delete;
void cp_async16(void* dst, const void* src, bool) = delete;
inline void cp_async_commit() {}
template <int PENDING> inline void cp_async_wait() {}

// lane l's register j: matrix j (row addresses from lanes 8j..8j+7), row l/4, columns
// 2(l%4), +1; transposed: column l/4 of rows 2(l%4), +1
static void emu_ldmatrix(unsigned* r, unsigned addr, bool trans) {
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    emu_check_align(emu_smem + addr, 16, "ldmatrix row");
    emu_ptrs[t] = emu_smem + addr;
    emu_warp_sync();
    for (int j = 0; j < 4; ++j) {
        if (trans) {
            const __half* r0 = (const __half*)emu_ptrs[base + 8 * j + 2 * (l % 4)];
            const __half* r1 = (const __half*)emu_ptrs[base + 8 * j + 2 * (l % 4) + 1];
            r[j] = emu_pack(r0[l / 4], r1[l / 4]);
        } else {
            const __half* row = (const __half*)emu_ptrs[base + 8 * j + l / 4];
            r[j] = emu_pack(row[2 * (l % 4)], row[2 * (l % 4) + 1]);
        }
    }
    emu_warp_sync();
}
inline void ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                        unsigned addr) {
    unsigned r[4];
    emu_ldmatrix(r, addr, false);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3,
                              unsigned addr) {
    unsigned r[4];
    emu_ldmatrix(r, addr, true);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
inline void ldmatrix_x4(unsigned* r, unsigned addr) { ldmatrix_x4(r[0], r[1], r[2], r[3], addr); }
inline void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
    ldmatrix_x4_trans(r[0], r[1], r[2], r[3], addr);
}
inline void ldmatrix_x4(unsigned* r, const void* p) { ldmatrix_x4(r, smem_u32(p)); }
inline void ldmatrix_x4_trans(unsigned* r, const void* p) { ldmatrix_x4_trans(r, smem_u32(p)); }

// The warp's 16 x 16 fp16 matrix in the m16n8k16 A-fragment layout, from registers 0-3 of
// each lane's emu_regs (lane 4g + t: rows g, g + 8; columns 2t, +1 and 2t + 8, +1).
static void emu_a_fragment(int base, float (*A)[16]) {
    for (int q = 0; q < 32; ++q) {
        const int g = q / 4, tq = q % 4;
        const unsigned* R = emu_regs[base + q];
        for (int h = 0; h < 2; ++h) {
            A[g][2 * tq + h] = (float)emu_half(R[0], h);
            A[g + 8][2 * tq + h] = (float)emu_half(R[1], h);
            A[g][2 * tq + 8 + h] = (float)emu_half(R[2], h);
            A[g + 8][2 * tq + 8 + h] = (float)emu_half(R[3], h);
        }
    }
}

// m16n8k16, A row-major fragments, B column fragments, fp32 C (PTX ISA fragment layouts)
template <typename ELEM = __half>
inline void mma16816(float* c, const unsigned* a, const unsigned* b) {
    static_assert(sizeof(ELEM) == 2, "fp16 only");
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    for (int i = 0; i < 4; ++i) emu_regs[t][i] = a[i];
    for (int i = 0; i < 2; ++i) emu_regs[t][4 + i] = b[i];
    emu_warp_sync();
    float A[16][16], B[16][8];
    emu_a_fragment(base, A);
    for (int q = 0; q < 32; ++q) {
        const int g = q / 4, tq = q % 4;
        const unsigned* R = emu_regs[base + q];
        for (int h = 0; h < 2; ++h) {
            B[2 * tq + h][g] = (float)emu_half(R[4], h);
            B[2 * tq + 8 + h][g] = (float)emu_half(R[5], h);
        }
    }
    emu_warp_sync();
    const int g = l / 4, tq = l % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * tq + (i % 2);
        float s = 0.f;
        for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
        c[i] += s;
    }
}

// mma.sp m16n8k32 f16, sparsity selector 0: compressed A 16x16 in the dense m16n8k16 A
// fragment layout; metadata of row g (low 16 bits) and g+8 (high) from lane 4g+t for
// logical columns 16t..16t+15 (t = 0, 1); B 32x8: register j holds rows 8j+2t, +1 of col g.
// Metadata whose two positions are not distinct and ascending sets emu_bad_meta.
static int emu_bad_meta = 0;
inline void mma_sp16832(float* c, const uint4& a, const unsigned* b, unsigned e) {
    const int t = emu_tid(), base = t & ~31, l = t & 31;
    const unsigned in[9] = {a.x, a.y, a.z, a.w, b[0], b[1], b[2], b[3], e};
    for (int i = 0; i < 9; ++i) emu_regs[t][i] = in[i];
    emu_warp_sync();
    float C[16][16] = {}, A[16][32] = {}, B[32][8];
    emu_a_fragment(base, C);
    for (int q = 0; q < 32; ++q) {
        const int g = q / 4, tq = q % 4;
        const unsigned* R = emu_regs[base + q];
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 4; ++j) B[8 * j + 2 * tq + h][g] = (float)emu_half(R[4 + j], h);
    }
    for (int q = 0; q < 32; ++q) {
        const int g = q / 4, tq = q % 4;
        if (tq > 1) continue;
        const unsigned E = emu_regs[base + q][8];
        for (int half = 0; half < 2; ++half) {
            const int row = g + 8 * half;
            const unsigned bits = half ? (E >> 16) : (E & 0xffff);
            for (int j = 0; j < 4; ++j) {
                const unsigned code = (bits >> (4 * j)) & 0xf, p0 = code & 3, p1 = code >> 2;
                if (p0 >= p1) emu_bad_meta = 1;
                A[row][16 * tq + 4 * j + p0] = C[row][8 * tq + 2 * j];
                A[row][16 * tq + 4 * j + p1] = C[row][8 * tq + 2 * j + 1];
            }
        }
    }
    emu_warp_sync();
    const int g = l / 4, tq = l % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * tq + (i % 2);
        float s = 0.f;
        for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
        c[i] += s;
    }
}

inline uint4 load_stream16(const uint4* p) { return *p; }

inline float ex2(float x) { return std::exp2(x); }

template <typename ELEM = __half>
inline unsigned pack2(float a, float b) {
    static_assert(sizeof(ELEM) == 2, "fp16 only");
    return emu_pack((__half)a, (__half)b);
}

// ---- adaptive_wgmma.cuh --------------------------------------------------------------------
// A wgmma runs when its group is waited for (wgmma_wait), not at issue: its operands (the
// shared tiles, the A registers through the pointer given) are read then and its
// accumulators written then, the latest the ISA allows. So a kernel that reads an
// accumulator before the wait, or overwrites a tile or an A register of a product still in
// flight, computes wrong results here as it might on the device. (Fences do nothing: a
// missing fence is not caught; nor is the device reading earlier than the wait.)
// Operands are read through their descriptors as the PTX ISA lays out the 128-byte swizzle
// (see the header); a descriptor of another swizzle, or whose start is not at row 0 of a
// swizzle atom (bits 7-9 of the address: the ISA's base offset 0), is a fault.
inline void fence_proxy_async() {}
inline void wgmma_fence() {}
template <int N> inline void wgmma_hold(float*) {}
template <int N> inline void wgmma_hold(unsigned*) {}
inline unsigned long long wgmma_desc(unsigned start, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((start & 0x3FFFFu) >> 4)
           | (unsigned long long)((lbo >> 4) & 0x3FFFu) << 16
           | (unsigned long long)((sbo >> 4) & 0x3FFFu) << 32
           | 1ull << 62;
}
struct emu_desc {
    unsigned start, lbo, sbo;
    explicit emu_desc(unsigned long long d)
        : start(unsigned(d & 0x3FFF) << 4), lbo(unsigned((d >> 16) & 0x3FFF) << 4),
          sbo(unsigned((d >> 32) & 0x3FFF) << 4) {
        if ((d >> 62) != 1) emu_fault("wgmma descriptor without the 128-byte swizzle",
                                      emu_smem + start, 1024);
        if ((start >> 7) & 7) emu_fault("wgmma descriptor start inside a swizzle atom",
                                        emu_smem + start, 1024);
    }
    float at(unsigned a) const {   // the 16-bit element at unswizzled shared address a
        a ^= ((a >> 7) & 7) << 4;
        __half h;
        std::memcpy(&h, emu_smem + a, 2);
        return (float)h;
    }
    float k_major(int r, int k) const { return at(start + (r / 8) * sbo + (r % 8) * 128 + 2 * k); }
    float mn_major(int k, int n) const {
        return at(start + (n / 64) * lbo + 2 * (n % 64) + (k % 8) * 128 + (k / 8) * sbo);
    }
};
// one issued product of a thread: d (m64nN) += a * b; a from shared memory (ss: a_desc,
// K-major) or from the registers at a (rs: each warp's 16 x 16, b MN-major)
struct emu_wgmma_op {
    int n;
    float* d;
    const unsigned* a;
    unsigned long long a_desc, b_desc;
};
static std::vector<emu_wgmma_op> emu_wg_open[1024];                 // issued, not committed
static std::vector<std::vector<emu_wgmma_op>> emu_wg_groups[1024];  // committed, oldest first
static void emu_wgmma_run(const emu_wgmma_op& op) {
    const int t = emu_tid(), base = t & ~31, l = t & 31, w = (t / 32) & 3, g = l / 4, tq = l % 4;
    const emu_desc B(op.b_desc);
    float A[16][16];
    if (op.a) {      // rs: the warp's A fragments, as they are now
        for (int i = 0; i < 4; ++i) emu_regs[t][i] = op.a[i];
        emu_warp_sync();
        emu_a_fragment(base, A);
        emu_warp_sync();
    } else {         // ss: the warp's 16 rows of the shared tile
        const emu_desc Ad(op.a_desc);
        for (int r = 0; r < 16; ++r)
            for (int k = 0; k < 16; ++k) A[r][k] = Ad.k_major(16 * w + r, k);
    }
    for (int j = 0; j < op.n / 8; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = g + 8 * (e >> 1), col = 8 * j + 2 * tq + (e & 1);
            float s = 0.f;
            for (int k = 0; k < 16; ++k)
                s += A[row][k] * (op.a ? B.mn_major(k, col) : B.k_major(col, k));
            op.d[4 * j + e] += s;
        }
}
inline void wgmma_commit() {
    const int t = emu_tid();
    emu_wg_groups[t].push_back(std::move(emu_wg_open[t]));
    emu_wg_open[t].clear();
}
template <int PENDING> inline void wgmma_wait() {
    auto& groups = emu_wg_groups[emu_tid()];
    while (groups.size() > PENDING) {
        for (const emu_wgmma_op& op : groups.front()) emu_wgmma_run(op);
        groups.erase(groups.begin());
    }
}
// d (m64nN) += a (64 x 16, K-major) * b (N x 16, K-major), when waited for
template <int N>
inline void wgmma_ss(float* d, unsigned long long a_desc, unsigned long long b_desc) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
    emu_wg_open[emu_tid()].push_back({N, d, nullptr, a_desc, b_desc});
}
// d (m64nN) += a (each warp's 16 x 16 in the m16n8k16 A layout) * b (16 x N, MN-major), when
// waited for (a read then)
template <int N>
inline void wgmma_rs_tn(float* d, const unsigned* a, unsigned long long b_desc) {
    static_assert(N == 64 || N == 128, "wgmma_rs_tn: N is 64 or 128");
    emu_wg_open[emu_tid()].push_back({N, d, a, 0, b_desc});
}
