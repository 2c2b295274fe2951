/*
dev/cuda/emu/vla/cuda/ptx.cuh: the emulation's versions of vla/cuda/ptx.cuh (see it for what each function
does). The emulated builds read the headers of vla/ from copies in build/emu/vla that
launch.sed rewrote; the Makefile copies this file to build/emu/vla/cuda/ptx.cuh instead, where
vla/cuda/common.cuh's #include "ptx.cuh" finds it.
Same names, same signatures; the work is emulate.h's.
*/
#ifndef VLA_PTX_CUH
#define VLA_PTX_CUH

#include "common.cuh"

static __device__ __forceinline__ void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    emu_mma_m16n8k16_bf16(d, a, b);
}

// (memcpy: a store through a uint32_t* would break C++'s aliasing rules on the host)
static __device__ __forceinline__ void store_x2(floatX* p, uint32_t u) {
    memcpy(p, &u, 4);
}

// The copies land at the wait, their destination garbage until then (emu_cp_async16).
static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    emu_cp_async16(smem, gmem);
}
static __device__ __forceinline__ void cp_async_commit(void) {
    emu_cp_async_commit();
}
template <int n>
static __device__ __forceinline__ void cp_async_wait(void) {
    emu_cp_async_wait(n);
}

template <bool TRANS>
static __device__ __forceinline__ void ldsm_x4(uint32_t* r, const floatX* row) {
    emu_ldmatrix_x4(r, row, TRANS);
}

// exp2f: the host has no ex2.approx
static __device__ __forceinline__ float fast_exp2(float x) {
    return exp2f(x);
}

// what emu_launch_count() counted between the two events
static long long event_launches(cudaEvent_t from, cudaEvent_t to) {
    return (long long)emu_event_launches(from, to);
}

#endif  // VLA_PTX_CUH
