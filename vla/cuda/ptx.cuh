/*
vla/cuda/ptx.cuh: the PTX instructions train_vla.cu's kernels use beyond CUDA C++, each as a function:
mma.sync m16n8k16 (bf16 products, fp32 accumulators), a 32-bit store of two floatX, cp.async of
16 bytes with its commit and wait, ldmatrix x4 and ex2.approx (the tensor-core attention of
version 4, bf16 builds); and event_launches, the launches between two events, which only the CPU
emulation counts (-1 here).

Plain CUDA. The emulation (dev/cuda/emu) has its own versions of the same functions in
dev/cuda/emu/vla/cuda/ptx.cuh: its builds read the headers from copies in build/emu/vla that
dev/cuda/emu/launch.sed rewrote, and the Makefile puts the emulation's ptx.cuh there in place of
this one. Included by vla/cuda/common.cuh, after floatX.
*/
#ifndef VLA_PTX_CUH
#define VLA_PTX_CUH

#include "common.cuh"

// d (16x8, fp32) += a (16x16, row-major) b (16x8, column-major), bf16 products, the warp together.
// Lane 4 g + t passes: a[r] = A row g + 8 (r % 2), columns 2t + 8 (r / 2) and the next; b[r] = B
// column g, rows 2t + 8 r and the next; two bf16 a register, the lower index in the low half.
static __device__ __forceinline__ void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// two neighbouring floatX as one 32-bit store (p 4-byte aligned), the first in the low half
static __device__ __forceinline__ void store_x2(floatX* p, uint32_t u) {
    *reinterpret_cast<uint32_t*>(p) = u;
}

// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80); a
// thread's copies are committed as a group and waited for (at most n groups left in flight).
static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int n>
static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory, the warp together. Lane l
// gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned) and receives, of
// matrix j, in r[j] the two elements at row l / 4, columns 2 (l % 4) and the next; transposed
// (.trans), those at rows 2 (l % 4) and the next of column l / 4. One instruction for what would
// take four 32-bit loads (eight 16-bit ones transposed).
template <bool TRANS>
static __device__ __forceinline__ void ldsm_x4(uint32_t* r, const floatX* row) {
    unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
    }
}

// 2^x for the softmax's probabilities: one MUFU.EX2 (ex2.approx.ftz). exp2f's ex2.approx without
// ftz wraps it in a range test and two multiplies that keep results below 2^-126 as denormals, a
// probability that small being one no sum here can tell from 0; the kernels take 64 of these a
// lane per key tile.
static __device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The launches (kernels, products, copies; a graph's launch counts once) on a stream between two of
// its events: the emulation counts them, a GPU does not
static long long event_launches(cudaEvent_t from, cudaEvent_t to) {
    (void)from;
    (void)to;
    return -1;
}

#endif  // VLA_PTX_CUH
