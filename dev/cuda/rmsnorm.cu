/*
rmsnorm.cu: RMSNorm, forward and backward (input_layernorm and post_attention_layernorm of every
  VLM and expert layer, the expert's final norm).
  forward:  out = x r w with r = (mean x^2 + eps)^-1/2 per row; rstd = r kept for the backward (eps a
            parameter: SmolLM2's SMOLVLA_RMS_EPS = 1e-5)
  backward: dx = r w dy - x r^3 / C sum_j dy_j w_j x_j, added into the fp32 residual gradient dres
            and written as its floatX copy dres_x; dw += sum over rows of dy x r

  version 1  forward: one warp per row, scalar loads (rmsnorm_forward_kernel, train_vla.cu's for
             the widths version 2 does not take: the tiny preset's expert, 36, in bf16 and fp16)
             backward: one block per chunk of rows, thread t owns columns t + j blockDim.x;
             dw as per-chunk partial sums added in chunk order, so the result is deterministic
             (rmsnorm_backward_kernel, here, then column_sum_kernel)
  version 2  forward: the same warp per row with 128-bit loads and stores (rmsnorm_forward_kernel2;
             C a multiple of x128::size)
             backward: one warp per row, so a row needs no block barrier; each lane keeps its
             columns' dw sums in registers and the warps' sums meet in shared memory, added in warp
             order (rmsnorm_backward_kernel2, then column_sum_kernel; C <= 32 * RMSNORM_BWD2_COLS)
             Both train_vla.cu's, launched by its rmsnorm_forward (version 2 where C and the
             pointers allow it) and rmsnorm_backward.
  Both backward versions take blocks of at most RMSNORM_MAX_BLOCK (512) threads (their registers).

  make -C dev/cuda rmsnorm && dev/cuda/rmsnorm
*/
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds the kernel and the reference differ only by fp32 arithmetic
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
// fp32 outputs (rstd, dres, dw) computed in fp32 from the floatX inputs the reference also sees
static const double TOL_F = 1e-5;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

static floatX* alloc_x(size_t n) {
    floatX* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(floatX)));
    return p;
}

static float* alloc_f(size_t n) {
    float* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    return p;
}

// ----------------------------------------------------------------------------
// references, in double

static void rmsnorm_forward_reference(double* out, double* rstd, const float* x, const float* w, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += (double)xn[c] * xn[c]; }
        double r = 1.0 / sqrt(ss / C + (double)SMOLVLA_RMS_EPS);
        rstd[n] = r;
        for (int c = 0; c < C; c++) { out[(size_t)n * C + c] = xn[c] * r * w[c]; }
    }
}

// dres (N, C) and dw (C) hold their values before the call and are accumulated into; r is the
// rstd the kernel is given
static void rmsnorm_backward_reference(double* dres, double* dw, const float* dout, const float* x, const float* w,
                                       const float* rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        double r = rstd[n], dot = 0.0;
        for (int c = 0; c < C; c++) { dot += (double)dy[c] * w[c] * xn[c]; }
        double k = dot * r * r * r / C;
        for (int c = 0; c < C; c++) {
            dres[(size_t)n * C + c] += r * w[c] * dy[c] - k * xn[c];
            dw[c] += (double)dy[c] * xn[c] * r;
        }
    }
}

// ----------------------------------------------------------------------------
// kernels: train_vla.cu's (common.h includes it whole) but version 1 of the backward pass

#define RMSNORM_BWD_COLS 8  // columns per thread: C <= RMSNORM_BWD_COLS * blockDim.x
// dx and dw as train_vla.cu's rmsnorm_backward_kernel2 says; one block per chunk of rows, thread t
// owns columns t + j * blockDim.x, the row's sum by a block reduction (82 registers a thread on
// sm_90 unbounded: at most RMSNORM_MAX_BLOCK threads, as version 2)
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_kernel(float* dres, floatX* dres_x, float* dw_partial, const floatX* dout,
                                        const floatX* inp, const floatX* w, const float* rstd, int N, int C,
                                        int rows_per_block) {
    __shared__ float shared[32];
    float dw_acc[RMSNORM_BWD_COLS];
    #pragma unroll
    for (int j = 0; j < RMSNORM_BWD_COLS; j++) { dw_acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0; n < r1; n++) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < RMSNORM_BWD_COLS; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c < C) { dot += f32(dy[c]) * f32(w[c]) * f32(x[c]); }
        }
        float k = block_sum(dot, shared) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < RMSNORM_BWD_COLS; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c < C) {
                float xv = f32(x[c]), dyv = f32(dy[c]);
                float g = dres[(size_t)n * C + c] + r * f32(w[c]) * dyv - k * xv;
                dres[(size_t)n * C + c] = g;
                dres_x[(size_t)n * C + c] = fx(g);
                dw_acc[j] += dyv * xv * r;
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < RMSNORM_BWD_COLS; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < C) { dw_partial[(size_t)blockIdx.x * C + c] = dw_acc[j]; }
    }
}

// ----------------------------------------------------------------------------
// the versions, launched directly (version 0: the launcher train_vla.cu calls)

static void run_forward(int version, int block, floatX* out, float* rstd, const floatX* inp, const floatX* w, int N,
                        int C) {
    if (version == 0) {
        rmsnorm_forward(out, rstd, inp, w, N, C, SMOLVLA_RMS_EPS);
    } else if (version == 1) {
        rmsnorm_forward_kernel<<<ceil_div((size_t)N * 32, block), block, 0, main_stream>>>(out, rstd, inp, w, N, C,
                                                                                           SMOLVLA_RMS_EPS);
        launchCheck();
    } else {
        rmsnorm_forward_kernel2<<<ceil_div((size_t)N * 32, block), block, 0, main_stream>>>(out, rstd, inp, w, N, C,
                                                                                            SMOLVLA_RMS_EPS);
        launchCheck();
    }
}

// partial: scratch of (ceil(N / rows_per_block), C) floats
static void run_backward(int version, int block, int rows_per_block, float* dres, floatX* dres_x, float* dw,
                         float* partial, const floatX* dout, const floatX* inp, const floatX* w, const float* rstd, int N,
                         int C) {
    int chunks = ceil_div(N, rows_per_block);
    if (version == 1) {
        rmsnorm_backward_kernel<<<chunks, block, 0, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                  rows_per_block);
    } else {
        size_t smem = (size_t)(block / 32) * C * sizeof(float);
        rmsnorm_backward_kernel2<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                       rows_per_block);
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
}

// ----------------------------------------------------------------------------
// checks

static void check_forward(int N, int C, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_floats(n, 2.0f, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_rstd = (double*)mallocCheck(N * sizeof(double));
    rmsnorm_forward_reference(ref, ref_rstd, x, w, N, C);
    floatX* out = alloc_x(n);
    float* rstd = alloc_f(N);
    int v2 = C % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version == 2 && !v2) { continue; }
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            poison(out, n * sizeof(floatX));
            poison(rstd, N * sizeof(float));
            run_forward(version, BLOCKS[bi], out, rstd, d_x, d_w, N, C);
            float* got = from_device_x(out, n);
            float* got_rstd = from_device_f(rstd, N);
            char what[160];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher forward (N %d, C %d)", N, C);
            } else {
                snprintf(what, sizeof(what), "v%d forward (N %d, C %d) block %d", version, N, C, BLOCKS[bi]);
            }
            char item[200];
            snprintf(item, sizeof(item), "%s: out", what);
            check_close(item, got, ref, n, TOL_X);
            snprintf(item, sizeof(item), "%s: rstd", what);
            check_close(item, got_rstd, ref_rstd, N, TOL_F);
            free(got); free(got_rstd);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(rstd));
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_w));
    free(x); free(w); free(ref); free(ref_rstd);
}

static void check_backward(int N, int C, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_floats(n, 2.0f, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    float* dout = random_floats(n, 1.0f, seed + 2);
    float* dres0 = random_floats(n, 0.5f, seed + 3);  // what dres holds before: the kernel adds to it
    float* dw0 = random_floats(C, 1.0f, seed + 4);     // the same for dw
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    floatX* d_dout = to_device_x(dout, n);
    // the rstd the forward pass would keep (fp32), given to the kernel and the reference alike
    double* fwd = (double*)mallocCheck(n * sizeof(double));
    double* rstd64 = (double*)mallocCheck(N * sizeof(double));
    rmsnorm_forward_reference(fwd, rstd64, x, w, N, C);
    float* rstd = (float*)mallocCheck(N * sizeof(float));
    for (int i = 0; i < N; i++) { rstd[i] = (float)rstd64[i]; }
    float* d_rstd = to_device_f(rstd, N);

    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_dw = (double*)mallocCheck(C * sizeof(double));
    for (size_t i = 0; i < n; i++) { ref[i] = dres0[i]; }
    for (int c = 0; c < C; c++) { ref_dw[c] = dw0[c]; }
    rmsnorm_backward_reference(ref, ref_dw, dout, x, w, rstd, N, C);

    float* dres = alloc_f(n);
    floatX* dres_x = alloc_x(n);
    float* dw = alloc_f(C);
    float* partial = alloc_f(n);  // enough for one row per chunk
    int rows[2] = {CHUNK_ROWS, 3};  // the trainer's chunk, and one that splits rows unevenly
    for (int version = 1; version <= 2; version++) {
        for (int bi = version == 2 ? -1 : 0; bi < N_BLOCKS; bi++) {  // -1: the launcher (version 2)
            int block = bi < 0 ? BLOCK : BLOCKS[bi];
            // both: at most RMSNORM_MAX_BLOCK threads (their registers); version 1: each thread holds
            // at most RMSNORM_BWD_COLS columns; version 2: each lane RMSNORM_BWD2_COLS, and the warps'
            // partial sums must fit in shared memory
            if (block > RMSNORM_MAX_BLOCK) { continue; }
            if (version == 1 && C > RMSNORM_BWD_COLS * block) { continue; }
            if (version == 2 && (C > 32 * RMSNORM_BWD2_COLS || (size_t)(block / 32) * C * sizeof(float) > 48 * 1024)) { continue; }
            for (int ri = 0; ri < (bi < 0 ? 1 : 2); ri++) {
                cudaCheck(cudaMemcpy(dres, dres0, n * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(dw, dw0, C * sizeof(float), cudaMemcpyHostToDevice));
                poison(dres_x, n * sizeof(floatX));
                poison(partial, n * sizeof(float));
                char what[160];
                if (bi < 0) {
                    rmsnorm_backward(dres, dres_x, dw, partial, d_dout, d_x, d_w, d_rstd, N, C);
                    snprintf(what, sizeof(what), "launcher backward (N %d, C %d)", N, C);
                } else {
                    run_backward(version, block, rows[ri], dres, dres_x, dw, partial, d_dout, d_x, d_w, d_rstd, N, C);
                    snprintf(what, sizeof(what), "v%d backward (N %d, C %d) block %d, %d rows per block", version, N, C,
                             block, rows[ri]);
                }
                float* got = from_device_f(dres, n);
                float* got_x = from_device_x(dres_x, n);
                float* got_dw = from_device_f(dw, C);
                char item[200];
                snprintf(item, sizeof(item), "%s: dres += dx", what);
                check_close(item, got, ref, n, TOL_F);
                snprintf(item, sizeof(item), "%s: dres_x", what);
                check_close(item, got_x, ref, n, TOL_X);
                snprintf(item, sizeof(item), "%s: dw +=", what);
                check_close(item, got_dw, ref_dw, C, TOL_F);
                free(got); free(got_x); free(got_dw);
            }
        }
    }
    cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(partial));
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_rstd));
    free(x); free(w); free(dout); free(dres0); free(dw0); free(fwd); free(rstd64); free(rstd); free(ref); free(ref_dw);
}

// ----------------------------------------------------------------------------
// benchmark at the base preset: the prefix rows of a 16-sample batch at the VLM width

static void benchmark(void) {
    const int N = 16 * 440, C = 960;
    size_t n = (size_t)N * C;
    float* h = random_floats(n, 1.0f, 7);
    floatX* x = to_device_x(h, n);
    floatX* dout = to_device_x(h, n);
    floatX* w = to_device_x(h, C);
    floatX* out = alloc_x(n);
    floatX* dres_x = alloc_x(n);
    float* rstd = alloc_f(N);
    float* dres = to_device_f(h, n);
    float* dw = to_device_f(h, C);
    float* partial = alloc_f(colsum_chunks(N) * C);  // (the launcher's chunks, CHUNK_ROWS's at most)
    rmsnorm_forward(out, rstd, x, w, N, C, SMOLVLA_RMS_EPS);  // a real rstd for the backward

    double fwd_bytes = 2.0 * n * sizeof(floatX) + C * sizeof(floatX) + N * sizeof(float);
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_forward(version, block, out, rstd, x, w, N, C); }, 20);
            printf("bench v%d forward (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, C, block, ms,
                   fwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    // dout and x read, dres read and written, dres_x written, the partial sums written and read
    int chunks = ceil_div(N, CHUNK_ROWS);
    double bwd_bytes = 3.0 * n * sizeof(floatX) + 2.0 * n * sizeof(float) + 2.0 * chunks * C * sizeof(float) +
                       N * sizeof(float) + C * (sizeof(floatX) + 2 * sizeof(float));
    for (int version = 1; version <= 2; version++) {
        for (int block = 128; block <= RMSNORM_MAX_BLOCK; block *= 2) {
            if (version == 2 && (size_t)(block / 32) * C * sizeof(float) > 48 * 1024) { continue; }
            double ms = time_ms([&]() {
                run_backward(version, block, CHUNK_ROWS, dres, dres_x, dw, partial, dout, x, w, rstd, N, C);
            }, 20);
            printf("bench v%d backward (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, C, block, ms,
                   bwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(rstd)); cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dw));
    cudaCheck(cudaFree(partial));
    free(h);
}

int main(void) {
    dev_init("rmsnorm");
    // odd widths (scalar path only), widths where version 2 applies (multiples of x128::size),
    // the VLM width, the widest version 1 of the backward takes at 256 threads; row counts that leave the
    // last warp's block or the last chunk partly empty
    struct { int N, C; } shapes[] = {{7, 37}, {45, 64}, {13, 300}, {33, 24}, {70, 960}, {3, 2048}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_forward(shapes[i].N, shapes[i].C, 100 + 10 * i);
        check_backward(shapes[i].N, shapes[i].C, 200 + 10 * i);
    }
    return dev_finish(benchmark);
}
