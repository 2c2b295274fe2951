/*
test_emulate.cu: tests of the CPU emulation of CUDA (emulate.h), written as ordinary CUDA C++.
Barriers, shuffles and shared memory must mean what they mean on a GPU, the matrix products
must follow cuBLASLt's column-major conventions, and every misuse emulate.h promises to catch
must end the program with its one-line message (checked in a child process).

  make build/emu/test_emulate && build/emu/test_emulate

It also compiles with nvcc (make dev/cuda/emu/test_emulate), where the misuse checks are skipped.
*/
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#include <mma.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef CUDA_EMULATION
#include <nccl.h>
#include <thread>
#include <vector>
#endif

static int n_passed = 0, n_failed = 0;
static void check(int ok, const char* what) {
    printf("%s %s\n", ok ? "  ok  " : " FAIL ", what);
    if (ok) { n_passed++; } else { n_failed++; }
}

#define cudaCheck(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)
#define cublasCheck(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    printf("cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__); exit(1); } } while (0)

// ----------------------------------------------------------------------------
// kernels

// sum of the block's inputs through shared memory, halving with a barrier at each level
__global__ void block_sum_kernel(float* out, const float* in, int n) {
    __shared__ float buf[1024];
    int t = threadIdx.x;
    buf[t] = t < n ? in[blockIdx.x * n + t] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) { buf[t] += buf[t + stride]; }
        __syncthreads();
    }
    if (t == 0) { out[blockIdx.x] = buf[0]; }
}

// every lane: the warp's sum by xor shuffles, by down shuffles (lane 0), lane 5's value, a ballot
__global__ void warp_ops_kernel(float* xor_sum, float* down_sum, float* bcast, unsigned* ballot, const float* in) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = in[i], s = v, d = v;
    for (int off = 16; off > 0; off /= 2) { s += __shfl_xor_sync(0xffffffffu, s, off); }
    for (int off = 16; off > 0; off /= 2) { d += __shfl_down_sync(0xffffffffu, d, off); }
    xor_sum[i] = s;
    down_sum[i] = d;
    bcast[i] = __shfl_sync(0xffffffffu, v, 5);
    ballot[i] = __ballot_sync(0xffffffffu, v > 0.0f);
}

// reverses each block's slice through dynamic shared memory
__global__ void reverse_kernel(int* out, const int* in) {
    extern __shared__ int tile[];
    int t = threadIdx.x, n = blockDim.x;
    tile[t] = in[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = tile[n - 1 - t];
}

// 2D blocks and a 2D grid: every thread writes its own coordinates
__global__ void coords_kernel(int* out, int width) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    out[y * width + x] = y * 1000 + x;
}

// one warp: 16x16 (bf16 or fp16) @ 16x16 (the same, column-major) into fp32, through WMMA
template <typename T>
__global__ void wmma_kernel(float* c, const T* a, const T* b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.5f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; i++) { acc.x[i] *= 2.0f; }
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

// misuse: half the block returns before the barrier
// mma.sync m16n8k16 (bf16): each lane gathers its fragments by PTX's element formulas (groupID g =
// lane / 4, t = lane % 4; A's a_i at row g + 8 for i in {2,3,6,7}, column 2t + (i % 2) + 8 for i >= 4;
// B's b_i at row 2t + (i % 2) + 8 for i >= 2, column g; D's d_i at row g + 8 for i >= 2, column
// 2t + (i % 2)), two elements a register, the lower index in the low half
__global__ void mma_16816_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {  // a (16,16), b (16,8), d (16,8)
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned short ea[8], eb[4];
    for (int i = 0; i < 8; i++) {
        int row = g + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0), col = 2 * t + i % 2 + (i >= 4 ? 8 : 0);
        memcpy(&ea[i], &a[row * 16 + col], 2);
    }
    for (int i = 0; i < 4; i++) { memcpy(&eb[i], &b[(2 * t + i % 2 + (i >= 2 ? 8 : 0)) * 8 + g], 2); }
    uint32_t ra[4], rb[2];
    for (int r = 0; r < 4; r++) { ra[r] = (uint32_t)ea[2 * r] | (uint32_t)ea[2 * r + 1] << 16; }
    for (int r = 0; r < 2; r++) { rb[r] = (uint32_t)eb[2 * r] | (uint32_t)eb[2 * r + 1] << 16; }
    float acc[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    emu_mma_m16n8k16_bf16(acc, ra, rb);
    for (int i = 0; i < 4; i++) { d[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + i % 2] = acc[i]; }
}

// ldmatrix x4, plain and transposed, from a (32, 8) tile of 16-bit values in shared memory (four
// 8x8 matrices, one under the other): lane l gives row l, and what each lane receives is written out
__global__ void ldmatrix_kernel(uint32_t* plain, uint32_t* trans, const unsigned short* in) {
    extern __shared__ uint16_t tile16[];
    int lane = threadIdx.x;
    for (int c = 0; c < 8; c++) { tile16[lane * 8 + c] = in[lane * 8 + c]; }
    __syncwarp();
    uint32_t r[4];
    emu_ldmatrix_x4(r, tile16 + lane * 8, false);
    for (int j = 0; j < 4; j++) { plain[lane * 4 + j] = r[j]; }
    emu_ldmatrix_x4(r, tile16 + lane * 8, true);
    for (int j = 0; j < 4; j++) { trans[lane * 4 + j] = r[j]; }
}

__global__ void divergent_barrier_kernel(float* out) {
    if (threadIdx.x >= 16) { return; }
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// misuse: a barrier inside a branch that part of a warp takes while the rest shuffles
__global__ void divergent_shuffle_kernel(float* out) {
    float v = 1.0f;
    if (threadIdx.x < 8) { __syncthreads(); } else { v = __shfl_xor_sync(0xffffffffu, v, 1); }
    out[threadIdx.x] = v;
}

__global__ void write_kernel(float* out, int i) { out[i] = 1.0f; }

#ifdef CUDA_EMULATION
// a race: thread 0 posts a value that every thread reads, with (barrier 1) or without the barrier
// between them; without it, the threads that run before thread 0 read garbage
__global__ void broadcast_kernel(float* out, float v, int barrier) {
    __shared__ float posted;
    if (threadIdx.x == 0) { posted = v; }
    if (barrier) { __syncthreads(); }
    out[threadIdx.x] = posted;
}

// cp.async: each thread copies 16 bytes of in (two groups: the first 8 floats of its 16, then the
// next 8) into shared memory and writes what its first 4 floats read at three moments: after the
// issue (out[0..3]), after wait_group 1 (out[4..7]: the first group landed, the second not), after
// wait_group 0 (out[8..11])
__global__ void cp_async_kernel(float* out, const float* in) {
    extern __shared__ float stage[];
    int t = threadIdx.x;
    float* mine = stage + 16 * t;
    for (int k = 0; k < 2; k++) {
        emu_cp_async16(mine + 8 * k, in + 16 * t + 8 * k);
        emu_cp_async16(mine + 8 * k + 4, in + 16 * t + 8 * k + 4);
        emu_cp_async_commit();
    }
    float* o = out + 24 * t;
    for (int i = 0; i < 4; i++) { o[i] = mine[i]; }
    emu_cp_async_wait(1);
    for (int i = 0; i < 4; i++) { o[4 + i] = mine[i]; o[12 + i] = mine[8 + i]; }
    emu_cp_async_wait(0);
    for (int i = 0; i < 4; i++) { o[8 + i] = mine[i]; o[16 + i] = mine[8 + i]; o[20 + i] = mine[12 + i]; }
}

__global__ void cp_async_misaligned_kernel(const float* in) {
    extern __shared__ float stage[];
    emu_cp_async16(stage, in + 1);
}
#endif

__global__ void add_kernel(float* x, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] += v; }
}

// ----------------------------------------------------------------------------
// misuse checks: run the bad thing in a child, expect exit 3 and the message

#ifdef CUDA_EMULATION
static void expect_death(const char* what, void (*bad)(void), const char* needle) {
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); exit(1); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        bad();
        _exit(0);
    }
    close(fds[1]);
    char msg[2048] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof(msg) - 1 && (r = read(fds[0], msg + got, sizeof(msg) - 1 - got)) > 0) { got += (size_t)r; }
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 3 && strstr(msg, needle) != NULL;
    char line[2300];
    char* nl = strchr(msg, '\n');
    if (nl) { *nl = 0; }
    snprintf(line, sizeof(line), "%s: %s", what, msg);
    check(ok, line);
}

static void bad_barrier(void) {
    float* d;
    cudaMalloc(&d, 32 * sizeof(float));
    divergent_barrier_kernel<<<1, 32>>>(d);
}
static void bad_shuffle(void) {
    float* d;
    cudaMalloc(&d, 32 * sizeof(float));
    divergent_shuffle_kernel<<<1, 32>>>(d);
}
static void bad_host_read(void) {
    float* d;
    cudaMalloc(&d, 64 * sizeof(float));
    volatile float x = d[3];
    (void)x;
}
static void bad_out_of_bounds(void) {
    float* d;
    cudaMalloc(&d, 100 * sizeof(float));
    write_kernel<<<1, 1>>>(d, 144);  // in the guard page after the allocation
}
static void bad_copy_kind(void) {
    float* d;
    float h[4];
    cudaMalloc(&d, sizeof(h));
    cudaMemcpy(d, h, sizeof(h), cudaMemcpyDeviceToHost);
}
static void bad_block(void) {
    float* d;
    cudaMalloc(&d, 4);
    write_kernel<<<1, 2048>>>(d, 0);
}
// over 48 KiB of dynamic shared memory: never allowed for write_kernel, allowed up to 64 KiB for
// reverse_kernel (main does that before these run)
static void bad_smem_never_set(void) {
    float* d;
    cudaMalloc(&d, 4);
    write_kernel<<<1, 1, 49 * 1024>>>(d, 0);
}
static void bad_smem_set_lower(void) {
    int* d;
    cudaMalloc(&d, 64 * sizeof(int));
    reverse_kernel<<<1, 64, 96 * 1024>>>(d, d);
}
static void bad_capture_copy(void) {
    float* d;
    float h[4] = {0};
    cudaStream_t s;
    cudaMalloc(&d, sizeof(h));
    cudaStreamCreate(&s);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice);  // synchronous: the legacy stream
}
static void bad_cp_async(void) {
    float* d;
    cudaMalloc(&d, 64 * sizeof(float));
    cp_async_misaligned_kernel<<<1, 32, 64>>>(d);
}
static void bad_schedule(void) {
    float* d;
    cudaMalloc(&d, 32 * sizeof(float));
    setenv("CUDA_EMU_SCHEDULE", "backwards", 1);
    emu::schedule = -1;
    write_kernel<<<1, 1>>>(d, 0);
}

// The two schedules and cp.async's deferred landing: what each shows of a missing barrier or wait
static void test_races(void) {
    const int n = 96;  // three warps
    float *d, h[n];
    cudaCheck(cudaMalloc(&d, n * sizeof(float)));
    for (int reverse = 0; reverse < 2; reverse++) {
        emu_set_schedule(reverse);
        int right[2] = {1, 1};
        for (int barrier = 0; barrier < 2; barrier++) {
            broadcast_kernel<<<1, n>>>(d, 7.0f, barrier);
            cudaCheck(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
            for (int i = 0; i < n; i++) { right[barrier] &= h[i] == 7.0f; }
        }
        char what[200];
        snprintf(what, sizeof(what), "%s schedule: with the barrier every thread reads thread 0's value; without it %s",
                 reverse ? "reverse" : "forward", reverse ? "the threads that run first read garbage (the race shows)" :
                 "the race hides (thread 0 runs first)");
        check(right[1] && right[0] == !reverse, what);
    }
    emu_set_schedule(0);
    cudaFree(d);

    const int threads = 64;
    float hin[16 * threads], hout[24 * threads];
    for (int i = 0; i < 16 * threads; i++) { hin[i] = (float)i; }
    float *din, *dout;
    cudaCheck(cudaMalloc(&din, sizeof(hin)));
    cudaCheck(cudaMalloc(&dout, sizeof(hout)));
    cudaCheck(cudaMemcpy(din, hin, sizeof(hin), cudaMemcpyHostToDevice));
    cp_async_kernel<<<1, threads, 16 * threads * sizeof(float)>>>(dout, din);
    cudaCheck(cudaMemcpy(hout, dout, sizeof(hout), cudaMemcpyDeviceToHost));
    int before = 1, first = 1, all = 1;
    for (int t = 0; t < threads; t++) {
        const float* o = hout + 24 * t;
        const float* x = hin + 16 * t;
        for (int i = 0; i < 4; i++) {
            before &= isnan(o[i]);
            first &= o[4 + i] == x[i] && isnan(o[12 + i]);
            all &= o[8 + i] == x[i] && o[16 + i] == x[8 + i] && o[20 + i] == x[12 + i];
        }
    }
    check(before, "cp.async: the destination reads as garbage (NaN) from the issue until the wait");
    check(first, "cp.async.wait_group 1 lands every committed group but the newest");
    check(all, "cp.async.wait_group 0 lands them all, each 16 bytes where it was sent");
    cudaFree(din);
    cudaFree(dout);
}
static void bad_capture_sync(void) {
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaStreamSynchronize(s);
}
#endif

// ----------------------------------------------------------------------------
// CUDA graphs by stream capture: a memset, a kernel and a cuBLASLt product with a bias are recorded,
// not run; each launch of the graph replays them with the arguments of the capture (the product's
// bias pointer changed afterwards does not reach it)

static void test_graph(cublasLtHandle_t lt) {
    const int n = 300;
    float h[n], *x, *a, *b, *bias1, *bias2, *d;
    cudaCheck(cudaMalloc(&x, n * 4)); cudaCheck(cudaMalloc(&a, 2 * 4)); cudaCheck(cudaMalloc(&b, 4));
    cudaCheck(cudaMalloc(&bias1, 2 * 4)); cudaCheck(cudaMalloc(&bias2, 2 * 4)); cudaCheck(cudaMalloc(&d, 2 * 4));
    const float ha[2] = {1.0f, 2.0f}, hb = 3.0f, hb1[2] = {10.0f, 20.0f}, hb2[2] = {100.0f, 200.0f}, zero[2] = {0, 0};
    cudaCheck(cudaMemcpy(a, ha, sizeof(ha), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(b, &hb, 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(bias1, hb1, sizeof(hb1), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(bias2, hb2, sizeof(hb2), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d, zero, sizeof(zero), cudaMemcpyHostToDevice));
    for (int i = 0; i < n; i++) { h[i] = 7.0f; }
    cudaCheck(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice));
    // d (2, 1) = a (2, 1) b (1, 1) + bias, column-major
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias1, sizeof(bias1)));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 2, 1, 2));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 1, 1, 1));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 2, 1, 2));
    float alpha = 1.0f, beta = 0.0f;
    cudaStream_t s;
    cudaCheck(cudaStreamCreate(&s));
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaCheck(cudaMemsetAsync(x, 0, n * 4, s));
    add_kernel<<<(n + 127) / 128, 128, 0, s>>>(x, 1.5f, n);
    cudaCheck(cudaGetLastError());
    cublasCheck(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, NULL, NULL, 0, s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamEndCapture(s, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    cudaCheck(cudaGraphDestroy(graph));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias2, sizeof(bias2)));
    float got[n], gd[2];
    cudaCheck(cudaMemcpy(got, x, sizeof(got), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(gd, d, sizeof(gd), cudaMemcpyDeviceToHost));
    int untouched = gd[0] == 0.0f && gd[1] == 0.0f;
    for (int i = 0; i < n; i++) { untouched &= got[i] == 7.0f; }
    check(untouched, "graph capture: the captured memset, kernel and product do not run");
    int ok = 1;
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice));
        cudaCheck(cudaGraphLaunch(exec, s));
        cudaCheck(cudaStreamSynchronize(s));
        cudaCheck(cudaMemcpy(got, x, sizeof(got), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(gd, d, sizeof(gd), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; i++) { ok &= got[i] == 1.5f; }
        ok &= gd[0] == 13.0f && gd[1] == 26.0f;
    }
    check(ok, "graph launched twice: memset, kernel, and the product with the bias of its capture, each time");
#ifdef CUDA_EMULATION
    // what each piece handed to the device: three eager operations, then one graph launch
    cudaEvent_t e0, e1, e2;
    cudaCheck(cudaEventCreate(&e0)); cudaCheck(cudaEventCreate(&e1)); cudaCheck(cudaEventCreate(&e2));
    uint64_t before = emu_launch_count();
    cudaCheck(cudaEventRecord(e0, s));
    cudaCheck(cudaMemsetAsync(x, 0, n * 4, s));
    add_kernel<<<(n + 127) / 128, 128, 0, s>>>(x, 1.5f, n);
    cublasCheck(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, NULL, NULL, 0, s));
    cudaCheck(cudaEventRecord(e1, s));
    cudaCheck(cudaGraphLaunch(exec, s));
    cudaCheck(cudaEventRecord(e2, s));
    char what[160];
    snprintf(what, sizeof(what), "launch count: %llu eager operations (want 3), %llu for a graph of 3 (want 1), %llu in all",
             (unsigned long long)emu_event_launches(e0, e1), (unsigned long long)emu_event_launches(e1, e2),
             (unsigned long long)(emu_launch_count() - before));
    check(emu_event_launches(e0, e1) == 3 && emu_event_launches(e1, e2) == 1 && emu_launch_count() - before == 4, what);
    check(cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal) == cudaErrorStreamCaptureUnsupported,
          "the legacy default stream cannot capture");
    cudaEventDestroy(e0); cudaEventDestroy(e1); cudaEventDestroy(e2);
#endif
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaStreamDestroy(s));
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(x); cudaFree(a); cudaFree(b); cudaFree(bias1); cudaFree(bias2); cudaFree(d);
}

#ifdef CUDA_EMULATION
// ----------------------------------------------------------------------------
// several devices and NCCL: ranks on their own threads, as a trainer drives them

static void test_devices(void) {
    int n = 0;
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("CUDA_EMU_DEVICES", "3", 1);
    cudaGetDeviceCount(&n);
    int ok3 = n == 3 && cudaSetDevice(2) == cudaSuccess && cudaSetDevice(3) != cudaSuccess;
    setenv("CUDA_VISIBLE_DEVICES", "1,7", 1);  // device 7 does not exist: one visible
    cudaGetDeviceCount(&n);
    int ok_vis = n == 1;
    unsetenv("CUDA_VISIBLE_DEVICES");
    cudaSetDevice(0);
    check(ok3 && ok_vis, "CUDA_EMU_DEVICES=3 gives 3 devices; CUDA_VISIBLE_DEVICES keeps the existing ones it lists");
}

// Each of R ranks, on its own thread and device: all-reduce (average) of rank-dependent values,
// reduce-scatter (sum), all-gather, broadcast from rank 1. Returns the mismatches.
static void nccl_rank(int rank, int R, ncclUniqueId id, int* bad, int* init_rc) {
    cudaSetDevice(rank);
    ncclComm_t comm;
    *init_rc = ncclCommInitRank(&comm, R, id, rank);
    if (*init_rc != ncclSuccess) { return; }
    const int n = 6;
    float h[n * 3], got[n * 3];
    for (int i = 0; i < n * R; i++) { h[i] = (float)(rank * 100 + i); }
    float *d_send, *d_recv;
    cudaMalloc(&d_send, sizeof(h));
    cudaMalloc(&d_recv, sizeof(h));
    cudaMemcpy(d_send, h, sizeof(h), cudaMemcpyHostToDevice);
    ncclAllReduce(d_send, d_recv, n, ncclFloat, ncclAvg, comm, 0);
    cudaMemcpy(got, d_recv, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++) { *bad += got[i] != (float)(100.0 * (R - 1) / 2.0 + i); }
    ncclReduceScatter(d_send, d_recv, n, ncclFloat, ncclSum, comm, 0);  // my share: elements rank*n ..
    cudaMemcpy(got, d_recv, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++) { *bad += got[i] != (float)(100 * (R * (R - 1) / 2) + R * (rank * n + i)); }
    ncclAllGather(d_send, d_recv, n, ncclFloat, comm, 0);
    cudaMemcpy(got, d_recv, n * R * sizeof(float), cudaMemcpyDeviceToHost);
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < n; i++) { *bad += got[r * n + i] != (float)(r * 100 + i); }
    }
    ncclBroadcast(d_send, d_recv, n, ncclFloat, 1, comm, 0);
    cudaMemcpy(got, d_recv, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; i++) { *bad += got[i] != (float)(100 + i); }
    cudaFree(d_send);
    cudaFree(d_recv);
    ncclCommDestroy(comm);
}

static void test_nccl(void) {
    const int R = 3;
    setenv("CUDA_EMU_DEVICES", "3", 1);
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    int bad[R] = {0}, rc[R] = {0};
    std::vector<std::thread> threads;
    for (int r = 0; r < R; r++) { threads.emplace_back(nccl_rank, r, R, id, &bad[r], &rc[r]); }
    for (auto& t : threads) { t.join(); }
    int ok = 1;
    for (int r = 0; r < R; r++) { ok &= bad[r] == 0 && rc[r] == ncclSuccess; }
    check(ok, "NCCL over 3 ranks on 3 threads: all-reduce (avg), reduce-scatter, all-gather, broadcast");
}

// A hang (CUDA_EMU_NCCL_FAULT=1:0:hang): rank 0 waits in its all-reduce until ncclCommAbort
static void nccl_waiter(ncclComm_t comm, float* d, ncclResult_t* rc) { *rc = ncclAllReduce(d, d, 4, ncclFloat, ncclSum, comm, 0); }
static void nccl_init(int rank, ncclUniqueId id, ncclComm_t* comm) {
    cudaSetDevice(rank);
    ncclCommInitRank(comm, 2, id, rank);
}

static void test_nccl_faults(void) {
    setenv("CUDA_EMU_DEVICES", "2", 1);
    for (int kind = 0; kind < 2; kind++) {
        setenv("CUDA_EMU_NCCL_FAULT", kind == 0 ? "1:0:error" : "1:0:hang", 1);
        ncclUniqueId id;
        ncclGetUniqueId(&id);
        ncclComm_t comms[2];
        std::thread t0(nccl_init, 0, id, &comms[0]), t1(nccl_init, 1, id, &comms[1]);
        t0.join();
        t1.join();
        float* d;
        cudaMalloc(&d, 16);
        cudaMemset(d, 0, 16);
        ncclResult_t rc0 = ncclSuccess, rc1 = ncclSuccess;
        std::thread w0(nccl_waiter, comms[0], d, &rc0), w1(nccl_waiter, comms[1], d, &rc1);
        usleep(200000);  // both are in their call by now: rank 0 waits for rank 1, which failed or hangs
        ncclResult_t async1 = ncclSuccess;
        ncclCommGetAsyncError(comms[1], &async1);
        ncclCommAbort(comms[0]);
        w0.join();
        w1.join();
        if (kind == 0) {
            check(async1 == ncclSystemError && rc0 != ncclSuccess,
                  "an injected NCCL error shows as the failing rank's asynchronous error; abort frees the waiting rank");
        } else {
            check(async1 == ncclSuccess && rc0 != ncclSuccess && rc1 != ncclSuccess,
                  "an injected NCCL hang holds every rank until ncclCommAbort, which makes their calls fail");
        }
        cudaFree(d);
    }
    unsetenv("CUDA_EMU_NCCL_FAULT");
    setenv("CUDA_EMU_DEVICES", "1", 1);
}
#endif

// ----------------------------------------------------------------------------
// cuBLASLt: D = alpha op(A) op(B) + beta C + bias, checked against loops

static float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

static void test_matmul(cublasLtHandle_t lt, int transa, int transb, int bf16_inputs, int with_bias, float beta) {
    const int m = 7, n = 5, k = 9, lda_pad = 3, ldb_pad = 2;
    int a_rows = transa ? k : m, a_cols = transa ? m : k, b_rows = transb ? n : k, b_cols = transb ? k : n;
    int lda = a_rows + lda_pad, ldb = b_rows + ldb_pad, ldc = m + 1;
    size_t esz = bf16_inputs ? 2 : 4;
    float* ha = (float*)malloc((size_t)lda * a_cols * 4);
    float* hb = (float*)malloc((size_t)ldb * b_cols * 4);
    float* hc = (float*)malloc((size_t)ldc * n * 4);
    float* bias = (float*)malloc(m * 4);
    for (int i = 0; i < lda * a_cols; i++) { ha[i] = bf16_round(sinf(0.7f * i) * 0.5f); }
    for (int i = 0; i < ldb * b_cols; i++) { hb[i] = bf16_round(cosf(0.3f * i) * 0.5f); }
    for (int i = 0; i < ldc * n; i++) { hc[i] = bf16_round(0.01f * i - 0.2f); }
    for (int i = 0; i < m; i++) { bias[i] = bf16_round(0.1f * i); }
    void *da, *db, *dc, *dbias;
    cudaCheck(cudaMalloc(&da, (size_t)lda * a_cols * esz));
    cudaCheck(cudaMalloc(&db, (size_t)ldb * b_cols * esz));
    cudaCheck(cudaMalloc(&dc, (size_t)ldc * n * 4));
    cudaCheck(cudaMalloc(&dbias, (size_t)m * 4));
    if (bf16_inputs) {
        __nv_bfloat16* t = (__nv_bfloat16*)malloc((size_t)(lda * a_cols + ldb * b_cols) * 2);
        for (int i = 0; i < lda * a_cols; i++) { t[i] = __float2bfloat16(ha[i]); }
        for (int i = 0; i < ldb * b_cols; i++) { t[lda * a_cols + i] = __float2bfloat16(hb[i]); }
        cudaCheck(cudaMemcpy(da, t, (size_t)lda * a_cols * 2, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(db, t + lda * a_cols, (size_t)ldb * b_cols * 2, cudaMemcpyHostToDevice));
        free(t);
    } else {
        cudaCheck(cudaMemcpy(da, ha, (size_t)lda * a_cols * 4, cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(db, hb, (size_t)ldb * b_cols * 4, cudaMemcpyHostToDevice));
    }
    cudaCheck(cudaMemcpy(dc, hc, (size_t)ldc * n * 4, cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dbias, bias, (size_t)m * 4, cudaMemcpyHostToDevice));

    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (with_bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias)));
    }
    cudaDataType_t in_type = bf16_inputs ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, in_type, a_rows, a_cols, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, in_type, b_rows, b_cols, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes = 1 << 20;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    void* ws;
    cudaCheck(cudaMalloc(&ws, ws_bytes));
    float alpha = 1.5f;
    cublasCheck(cublasLtMatmul(lt, desc, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc, &heur.algo, ws, ws_bytes, 0));
    float* got = (float*)malloc((size_t)ldc * n * 4);
    cudaCheck(cudaMemcpy(got, dc, (size_t)ldc * n * 4, cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                double av = transa ? ha[p + i * lda] : ha[i + p * lda];
                double bv = transb ? hb[j + p * ldb] : hb[p + j * ldb];
                s += av * bv;
            }
            double want = alpha * s + beta * hc[i + j * ldc] + (with_bias ? bias[i] : 0.0);
            double e = fabs(got[i + j * ldc] - want);
            if (e > worst) { worst = e; }
        }
    }
    char what[200];
    snprintf(what, sizeof(what), "cublasLtMatmul op(A)=%s op(B)=%s %s inputs, bias %d, beta %.0f: max abs err %.1e (tol 1e-5)",
             transa ? "T" : "N", transb ? "T" : "N", bf16_inputs ? "bf16" : "fp32", with_bias, beta, worst);
    check(found == 1 && worst < 1e-5, what);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dbias); cudaFree(ws);
    free(ha); free(hb); free(hc); free(bias); free(got);
}

// a strided batch: 3 products of op(A) (m, k) op(B) (k, n), A transposed, each matrix `gap`
// elements past the end of the one before, D = alpha op(A) op(B) + beta D
static void test_matmul_batched(cublasLtHandle_t lt) {
    const int m = 4, n = 3, k = 5, batch = 3, gap = 7;
    const long long sa = (long long)k * m + gap, sb = (long long)k * n + gap, sd = (long long)m * n + gap;
    float ha[3 * (5 * 4 + 7)], hb[3 * (5 * 3 + 7)], hd[3 * (4 * 3 + 7)];
    for (int i = 0; i < batch * sa; i++) { ha[i] = sinf(0.37f * i); }
    for (int i = 0; i < batch * sb; i++) { hb[i] = cosf(0.23f * i); }
    for (int i = 0; i < batch * sd; i++) { hd[i] = 0.05f * i; }
    float *da, *db, *dd;
    cudaCheck(cudaMalloc(&da, sizeof(ha)));
    cudaCheck(cudaMalloc(&db, sizeof(hb)));
    cudaCheck(cudaMalloc(&dd, sizeof(hd)));
    cudaCheck(cudaMemcpy(da, ha, sizeof(ha), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(db, hb, sizeof(hb), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(dd, hd, sizeof(hd), cudaMemcpyHostToDevice));
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = CUBLAS_OP_T;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
    cublasLtMatrixLayout_t layouts[3] = {la, lb, ld};
    const int64_t strides[3] = {sa, sb, sd};
    for (int i = 0; i < 3; i++) {
        int32_t count = batch;
        cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                                     sizeof(strides[i])));
    }
    float alpha = 0.5f, beta = 1.0f;
    cublasCheck(cublasLtMatmul(lt, desc, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld, NULL, NULL, 0, 0));
    float got[sizeof(hd) / sizeof(float)];
    cudaCheck(cudaMemcpy(got, dd, sizeof(hd), cudaMemcpyDeviceToHost));
    double worst = 0.0;
    int gaps_kept = 1;
    for (int g = 0; g < batch; g++) {
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < m; i++) {
                double sum = 0.0;
                for (int p = 0; p < k; p++) { sum += (double)ha[g * sa + p + i * k] * hb[g * sb + p + j * k]; }
                double want = alpha * sum + beta * hd[g * sd + i + j * m];
                double e = fabs(got[g * sd + i + j * m] - want);
                if (e > worst) { worst = e; }
            }
        }
        for (int i = m * n; i < sd; i++) { gaps_kept &= got[g * sd + i] == hd[g * sd + i]; }
    }
    char what[200];
    snprintf(what, sizeof(what), "cublasLtMatmul strided batch of %d: each product's max abs err %.1e (tol 1e-5), the gaps "
             "between them untouched: %d", batch, worst, gaps_kept);
    check(worst < 1e-5 && gaps_kept, what);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(da); cudaFree(db); cudaFree(dd);
}

int main(void) {
    // barriers and shared memory, at several block sizes
    for (int threads = 32; threads <= 1024; threads *= 4) {
        const int blocks = 3;
        float* h = (float*)malloc((size_t)blocks * threads * 4);
        for (int i = 0; i < blocks * threads; i++) { h[i] = (float)(i % 17); }
        float *d_in, *d_out, out[3];
        cudaCheck(cudaMalloc(&d_in, (size_t)blocks * threads * 4));
        cudaCheck(cudaMalloc(&d_out, blocks * 4));
        cudaCheck(cudaMemcpy(d_in, h, (size_t)blocks * threads * 4, cudaMemcpyHostToDevice));
        block_sum_kernel<<<blocks, threads>>>(d_out, d_in, threads);
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost));
        int ok = 1;
        for (int b = 0; b < blocks; b++) {
            double s = 0.0;
            for (int i = 0; i < threads; i++) { s += h[b * threads + i]; }
            ok &= out[b] == (float)s;
        }
        char what[100];
        snprintf(what, sizeof(what), "block reduction through shared memory and __syncthreads, %d threads", threads);
        check(ok, what);
        cudaFree(d_in); cudaFree(d_out); free(h);
    }
    // warp shuffles and ballot
    {
        const int n = 64;
        float h[n];
        for (int i = 0; i < n; i++) { h[i] = (float)((i * 7) % 11) - 5.0f; }
        float *d_in, *d_xor, *d_down, *d_b;
        unsigned* d_ballot;
        cudaCheck(cudaMalloc(&d_in, n * 4)); cudaCheck(cudaMalloc(&d_xor, n * 4)); cudaCheck(cudaMalloc(&d_down, n * 4));
        cudaCheck(cudaMalloc(&d_b, n * 4)); cudaCheck(cudaMalloc(&d_ballot, n * 4));
        cudaCheck(cudaMemcpy(d_in, h, sizeof(h), cudaMemcpyHostToDevice));
        warp_ops_kernel<<<1, n>>>(d_xor, d_down, d_b, d_ballot, d_in);
        float x[n], dn[n], bc[n];
        unsigned bal[n];
        cudaCheck(cudaMemcpy(x, d_xor, sizeof(x), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(dn, d_down, sizeof(dn), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(bc, d_b, sizeof(bc), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(bal, d_ballot, sizeof(bal), cudaMemcpyDeviceToHost));
        int ok_xor = 1, ok_down = 1, ok_b = 1, ok_bal = 1;
        for (int w = 0; w < n / 32; w++) {
            float s = 0.0f;
            unsigned want = 0;
            for (int l = 0; l < 32; l++) { s += h[w * 32 + l]; want |= (h[w * 32 + l] > 0.0f ? 1u : 0u) << l; }
            for (int l = 0; l < 32; l++) {
                ok_xor &= x[w * 32 + l] == s;
                ok_b &= bc[w * 32 + l] == h[w * 32 + 5];
                ok_bal &= bal[w * 32 + l] == want;
            }
            ok_down &= dn[w * 32] == s;
        }
        check(ok_xor, "__shfl_xor_sync butterfly: every lane holds its warp's sum");
        check(ok_down, "__shfl_down_sync tree: lane 0 holds its warp's sum");
        check(ok_b && ok_bal, "__shfl_sync broadcast and __ballot_sync");
        cudaFree(d_in); cudaFree(d_xor); cudaFree(d_down); cudaFree(d_b); cudaFree(d_ballot);
    }
    // dynamic shared memory, 2D grids
    {
        int h[256], out[256];
        for (int i = 0; i < 256; i++) { h[i] = i; }
        int *d_in, *d_out;
        cudaCheck(cudaMalloc(&d_in, sizeof(h))); cudaCheck(cudaMalloc(&d_out, sizeof(out)));
        cudaCheck(cudaMemcpy(d_in, h, sizeof(h), cudaMemcpyHostToDevice));
        reverse_kernel<<<4, 64, 64 * sizeof(int)>>>(d_out, d_in);
        cudaCheck(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost));
        int ok = 1;
        for (int b = 0; b < 4; b++) { for (int t = 0; t < 64; t++) { ok &= out[b * 64 + t] == h[b * 64 + 63 - t]; } }
        check(ok, "dynamic shared memory (extern __shared__)");
        // over 48 KiB once cudaFuncSetAttribute allows it (as on a GPU)
        cudaCheck(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
        cudaCheck(cudaMemset(d_out, 0, sizeof(out)));
        reverse_kernel<<<4, 64, 64 * 1024>>>(d_out, d_in);
        cudaCheck(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost));
        ok = 1;
        for (int b = 0; b < 4; b++) { for (int t = 0; t < 64; t++) { ok &= out[b * 64 + t] == h[b * 64 + 63 - t]; } }
        check(ok, "64 KiB of dynamic shared memory after cudaFuncSetAttribute raised the kernel's limit to it");
        int* d_xy;
        cudaCheck(cudaMalloc(&d_xy, 24 * 10 * sizeof(int)));
        coords_kernel<<<dim3(3, 2), dim3(8, 5)>>>(d_xy, 24);
        int xy[240];
        cudaCheck(cudaMemcpy(xy, d_xy, sizeof(xy), cudaMemcpyDeviceToHost));
        ok = 1;
        for (int y = 0; y < 10; y++) { for (int x = 0; x < 24; x++) { ok &= xy[y * 24 + x] == y * 1000 + x; } }
        check(ok, "2D grid of 2D blocks: every thread sees its own indices");
        cudaFree(d_in); cudaFree(d_out); cudaFree(d_xy);
    }
    // WMMA
    {
        __nv_bfloat16 a[256], b[256];
        float fa[256], fb[256], c[256];
        for (int i = 0; i < 256; i++) {
            fa[i] = bf16_round(sinf((float)i)); fb[i] = bf16_round(cosf(0.5f * i));
            a[i] = __float2bfloat16(fa[i]); b[i] = __float2bfloat16(fb[i]);
        }
        __nv_bfloat16 *d_a, *d_b;
        float* d_c;
        cudaCheck(cudaMalloc(&d_a, sizeof(a))); cudaCheck(cudaMalloc(&d_b, sizeof(b))); cudaCheck(cudaMalloc(&d_c, sizeof(c)));
        cudaCheck(cudaMemcpy(d_a, a, sizeof(a), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_b, b, sizeof(b), cudaMemcpyHostToDevice));
        wmma_kernel<__nv_bfloat16><<<1, 32>>>(d_c, d_a, d_b);
        cudaCheck(cudaMemcpy(c, d_c, sizeof(c), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 16; j++) {
                double s = 0.5;
                for (int p = 0; p < 16; p++) { s += (double)fa[i * 16 + p] * fb[j * 16 + p]; }  // b is column-major
                worst = fmax(worst, fabs(c[i * 16 + j] - 2.0 * s));
            }
        }
        char what[120];
        snprintf(what, sizeof(what), "WMMA 16x16x16 bf16 (row-major A, column-major B) into fp32: max abs err %.1e (tol 1e-4)", worst);
        check(worst < 1e-4, what);
        cudaFree(d_a); cudaFree(d_b); cudaFree(d_c);
    }
    // PTX's mma.sync m16n8k16 with bf16 operands, fragments gathered lane by lane as PTX lays them out
    {
        __nv_bfloat16 a[256], b[128];
        float fa[256], fb[128], d[128];
        for (int i = 0; i < 256; i++) { fa[i] = bf16_round(sinf(0.7f * i)); a[i] = __float2bfloat16(fa[i]); }
        for (int i = 0; i < 128; i++) { fb[i] = bf16_round(cosf(0.3f * i)); b[i] = __float2bfloat16(fb[i]); }
        __nv_bfloat16 *d_a, *d_b;
        float* d_d;
        cudaCheck(cudaMalloc(&d_a, sizeof(a))); cudaCheck(cudaMalloc(&d_b, sizeof(b))); cudaCheck(cudaMalloc(&d_d, sizeof(d)));
        cudaCheck(cudaMemcpy(d_a, a, sizeof(a), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_b, b, sizeof(b), cudaMemcpyHostToDevice));
        mma_16816_kernel<<<1, 32>>>(d_d, d_a, d_b);
        cudaCheck(cudaMemcpy(d, d_d, sizeof(d), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 8; j++) {
                double s = 0.5;
                for (int p = 0; p < 16; p++) { s += (double)fa[i * 16 + p] * fb[p * 8 + j]; }
                worst = fmax(worst, fabs(d[i * 8 + j] - s));
            }
        }
        char what[120];
        snprintf(what, sizeof(what), "mma.sync m16n8k16 bf16 with PTX's fragment layouts, into fp32: max abs err %.1e (tol 1e-4)", worst);
        check(worst < 1e-4, what);
        cudaFree(d_a); cudaFree(d_b); cudaFree(d_d);
    }
    // ldmatrix x4: lane l receives, of matrix j, row l / 4 at columns 2 (l % 4) and the next, or with
    // .trans rows 2 (l % 4) and the next at column l / 4
    {
        unsigned short in[256];
        for (int i = 0; i < 256; i++) { in[i] = (unsigned short)(1000 + i); }
        unsigned short* d_in;
        uint32_t *d_plain, *d_trans, plain[128], trans[128];
        cudaCheck(cudaMalloc(&d_in, sizeof(in))); cudaCheck(cudaMalloc(&d_plain, sizeof(plain)));
        cudaCheck(cudaMalloc(&d_trans, sizeof(trans)));
        cudaCheck(cudaMemcpy(d_in, in, sizeof(in), cudaMemcpyHostToDevice));
        ldmatrix_kernel<<<1, 32, sizeof(in)>>>(d_plain, d_trans, d_in);
        cudaCheck(cudaMemcpy(plain, d_plain, sizeof(plain), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(trans, d_trans, sizeof(trans), cudaMemcpyDeviceToHost));
        int ok = 1;
        for (int l = 0; l < 32; l++) {
            for (int j = 0; j < 4; j++) {
                int r = l / 4, c = 2 * (l % 4);  // matrix j is rows 8j.. of the tile
                uint32_t want_plain = in[(8 * j + r) * 8 + c] | (uint32_t)in[(8 * j + r) * 8 + c + 1] << 16;
                uint32_t want_trans = in[(8 * j + c) * 8 + r] | (uint32_t)in[(8 * j + c + 1) * 8 + r] << 16;
                ok &= plain[l * 4 + j] == want_plain && trans[l * 4 + j] == want_trans;
            }
        }
        check(ok, "ldmatrix x4 and x4.trans: every lane's four registers as PTX lays them out");
        cudaFree(d_in); cudaFree(d_plain); cudaFree(d_trans);
    }
    // bf16 conversions: round to nearest even, NaN kept
    {
        float half_ulp_up = 1.0f + 1.0f / 256.0f;         // a tie between 1 and 1 + 2^-7: to even (1)
        float above_tie = 1.0f + 1.0f / 256.0f + 1.0f / 65536.0f;
        float three_half = 1.0f + 3.0f / 256.0f;          // a tie between 1+2^-7 and 1+2^-6: to even (1+2^-6)
        int ok = __bfloat162float(__float2bfloat16(half_ulp_up)) == 1.0f &&
                 __bfloat162float(__float2bfloat16(above_tie)) == 1.0f + 1.0f / 128.0f &&
                 __bfloat162float(__float2bfloat16(three_half)) == 1.0f + 2.0f / 128.0f &&
                 isnan(__bfloat162float(__float2bfloat16(NAN)));
        check(ok, "bf16 conversion rounds to nearest even and keeps NaN");
    }
    // the same product with fp16 tiles (the WMMA shape sm_70 and sm_75 have)
    {
        __half a[256], b[256];
        float fa[256], fb[256], c[256];
        for (int i = 0; i < 256; i++) {
            a[i] = __float2half(sinf((float)i)); b[i] = __float2half(cosf(0.5f * i));
            fa[i] = __half2float(a[i]); fb[i] = __half2float(b[i]);
        }
        __half *d_a, *d_b;
        float* d_c;
        cudaCheck(cudaMalloc(&d_a, sizeof(a))); cudaCheck(cudaMalloc(&d_b, sizeof(b))); cudaCheck(cudaMalloc(&d_c, sizeof(c)));
        cudaCheck(cudaMemcpy(d_a, a, sizeof(a), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_b, b, sizeof(b), cudaMemcpyHostToDevice));
        wmma_kernel<__half><<<1, 32>>>(d_c, d_a, d_b);
        cudaCheck(cudaMemcpy(c, d_c, sizeof(c), cudaMemcpyDeviceToHost));
        double worst = 0.0;
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 16; j++) {
                double s = 0.5;
                for (int p = 0; p < 16; p++) { s += (double)fa[i * 16 + p] * fb[j * 16 + p]; }
                worst = fmax(worst, fabs(c[i * 16 + j] - 2.0 * s));
            }
        }
        char what[120];
        snprintf(what, sizeof(what), "WMMA 16x16x16 fp16 (row-major A, column-major B) into fp32: max abs err %.1e (tol 1e-4)", worst);
        check(worst < 1e-4, what);
        cudaFree(d_a); cudaFree(d_b); cudaFree(d_c);
    }
    // fp16 conversions against values known exactly (IEEE binary16: 10 fraction bits, bias 15)
    {
        const float sub = 5.9604644775390625e-8f;  // 2^-24, the smallest subnormal
        struct { float in, out; const char* what; } cases[] = {
            {65504.0f, 65504.0f, "65504, the largest finite, is exact"},
            {65519.0f, 65504.0f, "65519 rounds down to 65504"},
            {65520.0f, INFINITY, "65520 (halfway to 2^16) rounds to +Inf"},
            {-1e6f, -INFINITY, "-1e6 overflows to -Inf"},
            {INFINITY, INFINITY, "+Inf stays +Inf"},
            {1.0f + 1.0f / 2048.0f, 1.0f, "1 + 2^-11, a tie, rounds to even (1)"},
            {1.0f + 3.0f / 2048.0f, 1.0f + 2.0f / 1024.0f, "1 + 3 * 2^-11, a tie, rounds to even (1 + 2^-9)"},
            {1.0f + 1.0f / 2048.0f + 1.0f / 65536.0f, 1.0f + 1.0f / 1024.0f, "just above a tie rounds up"},
            {6.103515625e-05f, 6.103515625e-05f, "2^-14, the smallest normal, is exact"},
            {sub, sub, "2^-24, the smallest subnormal, is exact"},
            {3.0f * sub, 3.0f * sub, "3 * 2^-24 is an exact subnormal"},
            {0.5f * sub, 0.0f, "2^-25, a tie between 0 and 2^-24, rounds to even (0)"},
            {0.75f * sub, sub, "0.75 * 2^-24 rounds up to 2^-24"},
            {2.5f * sub, 2.0f * sub, "2.5 * 2^-24, a tie, rounds to even (2 * 2^-24)"},
            {1023.5f * sub, 1024.0f * sub, "the largest subnormal's rounding carries into 2^-14"},
            {-0.1f, -0.0999755859375f, "-0.1 rounds to the nearest fp16, sign kept"},
        };
        int ok = 1;
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            float got = __half2float(__float2half(cases[i].in));
            if (got != cases[i].out) {
                printf("  fp16: %s: got %.9g, want %.9g\n", cases[i].what, got, cases[i].out);
                ok = 0;
            }
        }
        ok &= isnan(__half2float(__float2half(NAN)));
        ok &= signbit(__half2float(__float2half(-0.0f))) && __half2float(__float2half(-0.0f)) == 0.0f;
        // every fp16 value converts to fp32 and back to itself
        for (unsigned bits = 0; bits < 0x10000u; bits++) {
            __half h;
            memcpy(&h, &bits, 2);
            float f = __half2float(h);
            __half back = __float2half(f);
            unsigned short b2;
            memcpy(&b2, &back, 2);
            if (!isnan(f) && b2 != bits) { ok = 0; }
        }
        check(ok, "fp16 conversion: 65504, 65520 -> Inf, ties to even, subnormals down to 2^-24, NaN kept, round trip");
    }
    // cuBLASLt conventions
    cublasLtHandle_t lt;
    cublasCheck(cublasLtCreate(&lt));
    test_matmul(lt, 1, 0, 0, 1, 0.0f);
    test_matmul(lt, 0, 0, 0, 0, 1.0f);
    test_matmul(lt, 0, 1, 1, 0, 1.0f);
    test_matmul(lt, 1, 1, 1, 1, 0.0f);
    test_matmul_batched(lt);
    test_graph(lt);
    cublasLtDestroy(lt);
#ifdef CUDA_EMULATION
    // fresh device memory reads as NaN
    {
        float* d;
        float h[8];
        cudaCheck(cudaMalloc(&d, sizeof(h)));
        cudaCheck(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
        int all_nan = 1;
        for (int i = 0; i < 8; i++) { all_nan &= isnan(h[i]); }
        check(all_nan, "cudaMalloc'd memory reads as NaN until written");
        cudaFree(d);
    }
    expect_death("half a block returns before __syncthreads", bad_barrier, "reached by 16 of 32 threads");
    expect_death("part of a warp at a barrier, the rest at a shuffle", bad_shuffle, "cannot go on");
    expect_death("host code reads device memory", bad_host_read, "host code touched device memory");
    expect_death("kernel writes past an allocation", bad_out_of_bounds, "past the end of a 400-byte device allocation");
    expect_death("cudaMemcpy with the wrong direction", bad_copy_kind, "the destination is device memory");
    expect_death("block of 2048 threads", bad_block, "a block holds 1 to 1024 threads");
    expect_death("49 KiB of dynamic shared memory, never allowed", bad_smem_never_set, "it was never set there");
    expect_death("96 KiB of dynamic shared memory, allowed 64", bad_smem_set_lower, "it was set lower");
    expect_death("a synchronous copy while a stream captures", bad_capture_copy, "while stream");
    expect_death("synchronizing the capturing stream", bad_capture_sync, "synchronize after cudaStreamEndCapture");
    expect_death("cp.async from an address not 16-byte aligned", bad_cp_async, "must be 16-byte aligned");
    expect_death("an unknown CUDA_EMU_SCHEDULE", bad_schedule, "CUDA_EMU_SCHEDULE=backwards: expected forward");
    test_races();
    test_devices();
    test_nccl();
    test_nccl_faults();
#endif
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
