/*
vla/cuda_common.cuh: the CUDA utilities every part of train_vla.cu uses, as llm.c keeps them in
llmc/cuda_common.h: the checks (cudaCheck, cublasCheck: file and line, and a hint for a user's
mistake), the conversions between float and floatX (f32, fx), warp and block sums, and Packed128,
16 bytes moved with one load or store, with the test of whether a call's pointers allow it.
It owns run_aborting, set by the NCCL watchdog (vla/watchdog.cuh) so the checks stay quiet once
it has aborted the run.

Included by train_vla.cu right after it defines floatX; it uses vla_fail from vla/common.h.
*/

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
    if (err == cudaErrorMemoryAllocation) { vla_fail_no_memory("out of GPU memory at %s:%d: " VLA_NO_MEMORY_FIX, file, line); }
    vla_fail("CUDA error %s at %s:%d", cudaGetErrorString(err), file, line);
}
#define cudaCheck(call) cuda_check_((call), __FILE__, __LINE__)

static void cublas_check_(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_ALLOC_FAILED) {
        vla_fail_no_memory("cuBLAS is out of memory at %s:%d: " VLA_NO_MEMORY_FIX, file, line);
    }
    if (status != CUBLAS_STATUS_SUCCESS) { vla_fail("cuBLAS error %d at %s:%d", (int)status, file, line); }
}
#define cublasCheck(call) cublas_check_((call), __FILE__, __LINE__)

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
static __device__ __forceinline__ void store128(T* p, const Packed128<T>& x) { *reinterpret_cast<Packed128<T>*>(p) = x; }

// Whether n elements from each pointer can be moved 16 bytes at a time
static bool packable(size_t n, int size, const void* a, const void* b = NULL, const void* c = NULL) {
    return n % size == 0 && (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && (uintptr_t)c % 16 == 0;
}
