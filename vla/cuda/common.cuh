/*
vla/cuda/common.cuh: what every kernel header of vla/cuda and the trainer share: the precision (floatX, set by
the build: bf16 by default, ENABLE_FP32 or ENABLE_FP16), the check (cudaCheck: file and
line, and a hint for a user's mistake), the conversions between float and floatX (f32, fx), warp and
block sums, Packed128 (16 bytes moved with one load or store) and the test of whether a call's
pointers allow it, the stream the launchers run on (main_stream: one per host thread,
so per GPU), BLOCK and the launch check. It owns run_aborting, set by the NCCL watchdog so the checks
stay quiet once it has aborted the run.
*/
#ifndef VLA_CUDA_COMMON_CUH
#define VLA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include "../common.h"

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#elif defined(ENABLE_FP16)
typedef __half floatX;
#define PRECISION_NAME "fp16"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif

// Set once the NCCL watchdog aborts the run: the errors the abort causes in the ranks' threads
// are its consequence, not news, and the watchdog's one line stays the only one
static volatile int run_aborting = 0;
static void wait_for_abort(void) {
    for (;;) { pause(); }
}

static void cuda_check_(cudaError_t err, const char* file, int line) {
    if (err == cudaSuccess) { return; }
    if (run_aborting) { wait_for_abort(); }
    // (in the policy library both are caught at its entry point: vla_catch_call)
    if (err == cudaErrorMemoryAllocation) {
        vla_fail_no_memory("out of GPU memory at %s:%d: " VLA_NO_MEMORY_FIX, file, line);
    }
    vla_fail("CUDA error %s at %s:%d", cudaGetErrorString(err), file, line);
}
#define cudaCheck(call) cuda_check_((call), __FILE__, __LINE__)

static __device__ __host__ __forceinline__ float f32(float x) { return x; }
#if defined(ENABLE_FP16)
static __device__ __host__ __forceinline__ float f32(__half x) { return __half2float(x); }
#else
static __device__ __host__ __forceinline__ float f32(__nv_bfloat16 x) { return __bfloat162float(x); }
#endif
static __device__ __host__ __forceinline__ floatX fx(float x) {
#if defined(ENABLE_FP32)
    return x;
#elif defined(ENABLE_FP16)
    return __float2half(x);
#else
    return __float2bfloat16(x);
#endif
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) { v += __shfl_xor_sync(0xffffffffu, v, offset); }
    return v;
}

// Sum over a block whose size is a multiple of 32; every thread gets it. `shared` holds 32
// floats; the leading barrier lets back-to-back calls reuse it.
static __device__ float block_sum(float v, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    return warp_sum(lane < n_warps ? shared[lane] : 0.0f);
}

static inline int ceil_div(size_t a, size_t b) { return (int)((a + b - 1) / b); }

// 16 bytes of T, moved with one 128-bit load or store: 8 bf16 or 4 fp32 values
template <typename T>
struct __align__(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};
typedef Packed128<floatX> x128;
template <typename T>
static __device__ __forceinline__ Packed128<T> load128(const T* p) { return *reinterpret_cast<const Packed128<T>*>(p); }
template <typename T>
static __device__ __forceinline__ void store128(T* p, const Packed128<T>& x) {
    *reinterpret_cast<Packed128<T>*>(p) = x;
}

// Whether n elements from each pointer can be moved 16 bytes at a time
static bool packable(size_t n, int size, const void* a, const void* b = NULL, const void* c = NULL) {
    return n % size == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
}

// PTX instructions as functions (mma.sync, cp.async, ldmatrix, ex2.approx); the emulation has its own
#include "ptx.cuh"

// Per GPU, so per host thread: with MULTI_GPU each rank's thread drives its own device
static thread_local cudaStream_t main_stream;   // all compute

#define launchCheck() cudaCheck(cudaGetLastError())
static const int BLOCK = 256;
// n values of every pointer in whole 16-byte packs, else a one-line error naming the operation
static void check_packable(const char* what, size_t n, const void* a, const void* b, const void* c = NULL,
                           const void* d = NULL, const void* e = NULL) {
    if (!packable(n, x128::size, a, b, c) || !packable(n, x128::size, d, e)) {
        vla_fail("%s: %zu values, or a pointer, not in whole 16-byte packs of %d (the kernel's loads)", what, n,
                 x128::size);
    }
}

#define LAUNCH_1D(kernel, n, ...) \
    do { kernel<<<ceil_div((n), BLOCK), BLOCK, 0, main_stream>>>(__VA_ARGS__); launchCheck(); } while (0)

// A floatX device array (n) as host floats (the tests' and dev/cuda's reads of device outputs)
static float* from_device_x(const floatX* d, size_t n) {
    floatX* tmp = (floatX*)mallocCheck(n * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    float* h = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { h[i] = f32(tmp[i]); }
    free(tmp);
    return h;
}

#endif  // VLA_CUDA_COMMON_CUH
