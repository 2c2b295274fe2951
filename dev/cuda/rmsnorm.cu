/*
rmsnorm.cu: RMSNorm, forward and backward (input_layernorm and post_attention_layernorm of every
  VLM and expert layer, the expert's final norm), Llama's (SmolVLA) and Gemma's (pi0).
  forward:  out = x r (offset + w) with r = (mean x^2 + eps)^-1/2 per row; rstd = r kept for the
            backward (eps a parameter: SmolLM2's 1e-5, Gemma's 1e-6)
  backward: dx = r (offset + w) dy - x r^3 / C sum_j dy_j (offset + w_j) x_j, added into the fp32
            residual gradient dres and written as its floatX copy dres_x; dw += sum over rows of
            dy x r (the offset does not change it)
  offset 0 is SmolVLA's norm; 1 Gemma's (pi0: its weight is the scale's distance from 1, the
  offset added to w in fp32 as Gemma's norm computes it, w.float() + 1).

  Kernels named _vN are this program's, _kernelN vla/cuda/rmsnorm.cuh's. Every backward version
  writes per-chunk partial sums of dw that the header's column_sum adds in chunk order, so the
  result is deterministic.
  version 1  forward: one warp per row, scalar loads (rmsnorm_forward_v1; any width)
             backward: one block per chunk of rows, thread t owns columns t + j blockDim.x, the
             row's sum by a block reduction (rmsnorm_backward_v1; offset 0 only,
             C <= RMSNORM_V1_COLS * blockDim.x)
  version 2  forward: version 1 with 128-bit loads and stores (rmsnorm_forward_kernel2, the
             header's; C a multiple of x128::size)
             backward: one warp per row, so a row needs no block barrier; each lane keeps its
             columns' dw sums in registers and the warps' sums meet in shared memory, added in warp
             order (the header's rmsnorm_backward_kernel2; C <= 32 * RMSNORM_BWD2_COLS = 1024)
  version 3  backward: version 2 with 64 columns a lane (C <= 2048: pi0's VLM width), the warps'
             sums added in warp order into one shared row of C floats (rmsnorm_backward_v3; any
             width up to 2048; at offset 0 the bits of version 2)
  version 4  backward: version 3 with 128-bit loads and stores (rmsnorm_backward_kernel4, the
             header's; C a multiple of x128::size)
  version 0  the header's launchers, what trains: rmsnorm_forward and rmsnorm_backward, at BLOCK
  The backward versions take blocks of at most RMSNORM_MAX_BLOCK (512) threads (their registers:
  versions 3 and 4 keep 64 dw sums a lane, 127 registers on sm_90 in bf16 with nothing spilled; in
  fp32 builds version 4 spills 24 bytes).

  nvcc -O3 -std=c++17 -arch=sm_90 rmsnorm.cu -o rmsnorm && ./rmsnorm
*/
#include "common.h"
#include "../../vla/cuda/rmsnorm.cuh"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds the kernel and the reference differ only by fp32 arithmetic
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
// fp32 outputs (rstd, dres, dw) computed in fp32 from the floatX inputs the reference also sees
static const double TOL_F = 1e-5;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const float FLOW_EPS = 1e-5f;  // SmolLM2's RMSNorm eps (flow_rms_eps of a SmolVLA config)

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

// offset: 0 for SmolVLA's norm (x r w), 1 for Gemma's (x r (1 + w))
static void rmsnorm_forward_reference(double* out, double* rstd, const float* x, const float* w, int N, int C,
                                      double eps, double offset) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) { ss += (double)xn[c] * xn[c]; }
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = r;
        for (int c = 0; c < C; c++) { out[(size_t)n * C + c] = xn[c] * r * (offset + w[c]); }
    }
}

// dres (N, C) and dw (C) hold their values before the call and are accumulated into; r is the
// rstd the kernel is given. The weight the input gradient sees is offset + w; dw is sum dy x r either way.
static void rmsnorm_backward_reference(double* dres, double* dw, const float* dout, const float* x, const float* w,
                                       const float* rstd, int N, int C, double offset) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        double r = rstd[n], dot = 0.0;
        for (int c = 0; c < C; c++) { dot += (double)dy[c] * (offset + w[c]) * xn[c]; }
        double k = dot * r * r * r / C;
        for (int c = 0; c < C; c++) {
            dres[(size_t)n * C + c] += r * (offset + w[c]) * dy[c] - k * xn[c];
            dw[c] += (double)dy[c] * xn[c] * r;
        }
    }
}

// ----------------------------------------------------------------------------
// kernels: this program's versions (the header's are version 2 forward, 4 backward)

// Version 1 forward: out = x r (offset + w), rstd kept; one warp per row of C, scalar loads
__global__ void rmsnorm_forward_v1(floatX* out, float* rstd, const floatX* inp, const floatX* w, int N, int C,
                                   float eps, float offset) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }  // whole warps leave together
    const floatX* x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = f32(x[c]);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / (float)C + eps);
    if (lane == 0) { rstd[row] = r; }
    floatX* y = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) { y[c] = fx(f32(x[c]) * r * (offset + f32(w[c]))); }
}

// Version 1 backward (offset 0): one block per chunk of rows, thread t owns columns t + j * blockDim.x,
// the row's sum by a block reduction; dw_partial's row blockIdx.x <- the chunk's dw sums (82 registers
// a thread on sm_90 unbounded: at most RMSNORM_MAX_BLOCK threads, as the other versions)
#define RMSNORM_V1_COLS 8  // columns per thread: C <= RMSNORM_V1_COLS * blockDim.x
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_v1(float* dres, floatX* dres_x,
                                                                          float* dw_partial, const floatX* dout,
                                                                          const floatX* inp, const floatX* w,
                                                                          const float* rstd, int N, int C,
                                                                          int rows_per_block) {
    __shared__ float shared[32];
    float dw_acc[RMSNORM_V1_COLS];
    #pragma unroll
    for (int j = 0; j < RMSNORM_V1_COLS; j++) { dw_acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0; n < r1; n++) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < RMSNORM_V1_COLS; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c < C) { dot += f32(dy[c]) * f32(w[c]) * f32(x[c]); }
        }
        float k = block_sum(dot, shared) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < RMSNORM_V1_COLS; j++) {
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
    for (int j = 0; j < RMSNORM_V1_COLS; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < C) { dw_partial[(size_t)blockIdx.x * C + c] = dw_acc[j]; }
    }
}

// Version 3 backward: version 2 with 64 columns a lane, the warps' sums added in warp order through one
// shared row of C floats (warp w adds its columns while the others wait): version 2's order, in C floats
// where version 2's row per warp takes 64 KiB at 2048 wide and 256 threads
#define RMSNORM_V3_COLS 64  // columns a lane owns: C <= 32 * RMSNORM_V3_COLS
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_v3(float* dres, floatX* dres_x,
                                                                          float* dw_partial, const floatX* dout,
                                                                          const floatX* inp, const floatX* w,
                                                                          const float* rstd, int N, int C,
                                                                          int rows_per_block, float offset) {
    extern __shared__ float dw_row[];  // (C)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    float acc[RMSNORM_V3_COLS];
    #pragma unroll
    for (int j = 0; j < RMSNORM_V3_COLS; j++) { acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0 + warp; n < r1; n += n_warps) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < RMSNORM_V3_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) { dot += f32(dy[c]) * (f32(w[c]) + offset) * f32(x[c]); }
        }
        float k = warp_sum(dot) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < RMSNORM_V3_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) {
                float xv = f32(x[c]), dyv = f32(dy[c]);
                float g = dres[(size_t)n * C + c] + r * (f32(w[c]) + offset) * dyv - k * xv;
                dres[(size_t)n * C + c] = g;
                dres_x[(size_t)n * C + c] = fx(g);
                acc[j] += dyv * xv * r;
            }
        }
    }
    for (int wp = 0; wp < n_warps; wp++) {
        if (warp == wp) {
            #pragma unroll
            for (int j = 0; j < RMSNORM_V3_COLS; j++) {
                int c = lane + 32 * j;
                if (c < C) { dw_row[c] = (wp == 0 ? 0.0f : dw_row[c]) + acc[j]; }
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) { dw_partial[(size_t)blockIdx.x * C + c] = dw_row[c]; }
}

// ----------------------------------------------------------------------------
// the versions, launched directly; version 0 the header's launchers (what trains)

#define N_VERSIONS 5
static const char* version_name(int version) {
    static const char* names[N_VERSIONS] = {"launcher", "v1", "v2", "v3", "v4"};
    return names[version];
}

// Version 0, the header's launchers, is checked at widths of whole 16-byte packs, the widths they are
// for; versions 1 and 3 take the others.
static bool forward_takes(int version, int C) {
    return version == 1 || C % x128::size == 0;
}

// whether a backward version takes the width (and the offset: version 1 has none) at this block size
static bool backward_takes(int version, int C, float offset, int block) {
    if (offset != 0.0f && version == 1) { return false; }
    if (version == 0) { return C <= 32 * RMSNORM_BWD3_COLS && C % x128::size == 0; }
    // every version: at most RMSNORM_MAX_BLOCK threads (their registers). Version 1: each thread holds
    // at most RMSNORM_V1_COLS columns; version 2: each lane RMSNORM_BWD2_COLS, and the warps' partial
    // sums fit in shared memory; version 3: each lane RMSNORM_V3_COLS; 4 the header's RMSNORM_BWD3_COLS,
    // in whole packs
    if (block > RMSNORM_MAX_BLOCK) { return false; }
    if (version == 1) { return C <= RMSNORM_V1_COLS * block; }
    if (version == 2) { return C <= 32 * RMSNORM_BWD2_COLS && (size_t)(block / 32) * C * sizeof(float) <= 48 * 1024; }
    if (version == 3) { return C <= 32 * RMSNORM_V3_COLS; }
    return C <= 32 * RMSNORM_BWD3_COLS && C % x128::size == 0;
}

static void run_forward(int version, int block, floatX* out, float* rstd, const floatX* inp, const floatX* w, int N,
                        int C, float eps, float offset) {
    int grid = ceil_div((size_t)N * 32, block);
    switch (version) {
        case 1: rmsnorm_forward_v1<<<grid, block, 0, main_stream>>>(out, rstd, inp, w, N, C, eps, offset); break;
        case 2: rmsnorm_forward_kernel2<<<grid, block, 0, main_stream>>>(out, rstd, inp, w, N, C, eps, offset); break;
        default: rmsnorm_forward(out, rstd, inp, w, N, C, eps, offset); return;
    }
    launchCheck();
}

// partial: scratch of (ceil(N / rows_per_block), C) floats (version 0: its own rows, colsum_rows(N))
static void run_backward(int version, int block, int rows_per_block, float* dres, floatX* dres_x, float* dw,
                         float* partial, const floatX* dout, const floatX* inp, const floatX* w, const float* rstd,
                         int N, int C, float offset) {
    if (version == 0) {
        rmsnorm_backward(dres, dres_x, dw, partial, dout, inp, w, rstd, N, C, offset);
        return;
    }
    int chunks = ceil_div(N, rows_per_block);
    size_t smem = version == 2 ? (size_t)(block / 32) * C * sizeof(float) : (size_t)C * sizeof(float);
    switch (version) {
        case 1:
            rmsnorm_backward_v1<<<chunks, block, 0, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                  rows_per_block);
            break;
        case 2:
            rmsnorm_backward_kernel2<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                     rows_per_block, offset);
            break;
        case 3:
            rmsnorm_backward_v3<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                     rows_per_block, offset);
            break;
        default:
            rmsnorm_backward_kernel4<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N,
                                                                           C, rows_per_block, offset);
            break;
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
}

// ----------------------------------------------------------------------------
// checks

static int label(char* buf, size_t n, int version, const char* pass, int N, int C, float eps, float offset) {
    return snprintf(buf, n, "%s %s (N %d, C %d, eps %.0e, offset %.0f)", version_name(version), pass, N, C, eps,
                    offset);
}

// Row 0 a thousand times smaller: its mean square (about 1.3e-6) is of eps's order, so eps decides
// its rstd (1e-5 for 1e-6 moves it by a factor 2.7) where the other rows would not see it (3e-6)
static void small_first_row(float* x, int C) {
    for (int c = 0; c < C; c++) { x[c] *= 1e-3f; }
}

static void check_forward(int N, int C, float eps, float offset, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_floats(n, 2.0f, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    small_first_row(x, C);
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_rstd = (double*)mallocCheck(N * sizeof(double));
    rmsnorm_forward_reference(ref, ref_rstd, x, w, N, C, eps, offset);
    floatX* out = alloc_x(n);
    float* rstd = alloc_f(N);
    for (int version = 0; version < N_VERSIONS; version++) {
        if (!forward_takes(version, C)) { continue; }
        int launcher = version == 0;
        for (int bi = 0; bi < (launcher ? 1 : N_BLOCKS); bi++) {
            poison(out, n * sizeof(floatX));
            poison(rstd, N * sizeof(float));
            run_forward(version, BLOCKS[bi], out, rstd, d_x, d_w, N, C, eps, offset);
            float* got = from_device_x(out, n);
            float* got_rstd = from_device_f(rstd, N);
            char what[160], item[200];
            int at = label(what, sizeof(what), version, "forward", N, C, eps, offset);
            if (!launcher) { snprintf(what + at, sizeof(what) - at, " block %d", BLOCKS[bi]); }
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

static void check_backward(int N, int C, float eps, float offset, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_floats(n, 2.0f, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    float* dout = random_floats(n, 1.0f, seed + 2);
    float* dres0 = random_floats(n, 0.5f, seed + 3);  // what dres holds before: the kernel adds to it
    float* dw0 = random_floats(C, 1.0f, seed + 4);     // the same for dw
    small_first_row(x, C);
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    floatX* d_dout = to_device_x(dout, n);
    // the rstd the forward pass would keep (fp32), given to the kernel and the reference alike
    double* fwd = (double*)mallocCheck(n * sizeof(double));
    double* rstd64 = (double*)mallocCheck(N * sizeof(double));
    rmsnorm_forward_reference(fwd, rstd64, x, w, N, C, eps, offset);
    float* rstd = (float*)mallocCheck(N * sizeof(float));
    for (int i = 0; i < N; i++) { rstd[i] = (float)rstd64[i]; }
    float* d_rstd = to_device_f(rstd, N);

    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_dw = (double*)mallocCheck(C * sizeof(double));
    for (size_t i = 0; i < n; i++) { ref[i] = dres0[i]; }
    for (int c = 0; c < C; c++) { ref_dw[c] = dw0[c]; }
    rmsnorm_backward_reference(ref, ref_dw, dout, x, w, rstd, N, C, offset);

    float* dres = alloc_f(n);
    floatX* dres_x = alloc_x(n);
    float* dw = alloc_f(C);
    float* partial = alloc_f(n);  // enough for one row per chunk
    int rows[2] = {CHUNK_ROWS, 3};  // the launchers' chunk, and one that splits rows unevenly
    for (int version = 0; version < N_VERSIONS; version++) {
        int launcher = version == 0;
        for (int bi = 0; bi < (launcher ? 1 : N_BLOCKS); bi++) {
            int block = launcher ? BLOCK : BLOCKS[bi];
            if (!backward_takes(version, C, offset, block)) { continue; }
            for (int ri = 0; ri < (launcher ? 1 : 2); ri++) {
                cudaCheck(cudaMemcpy(dres, dres0, n * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(dw, dw0, C * sizeof(float), cudaMemcpyHostToDevice));
                poison(dres_x, n * sizeof(floatX));
                poison(partial, n * sizeof(float));
                run_backward(version, block, rows[ri], dres, dres_x, dw, partial, d_dout, d_x, d_w, d_rstd, N, C,
                             offset);
                char what[160], item[200];
                int at = label(what, sizeof(what), version, "backward", N, C, eps, offset);
                if (!launcher) {
                    snprintf(what + at, sizeof(what) - at, " block %d, %d rows per block", block, rows[ri]);
                }
                float* got = from_device_f(dres, n);
                float* got_x = from_device_x(dres_x, n);
                float* got_dw = from_device_f(dw, C);
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

// the bytes of n elements of size `size` at two device pointers: how many elements differ
static size_t count_differing(const void* a, const void* b, size_t n, size_t size) {
    uint8_t* ha = (uint8_t*)mallocCheck(n * size);
    uint8_t* hb = (uint8_t*)mallocCheck(n * size);
    cudaCheck(cudaMemcpy(ha, a, n * size, cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(hb, b, n * size, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t e = 0; e < n; e++) { differ += memcmp(ha + e * size, hb + e * size, size) != 0; }
    free(ha); free(hb);
    return differ;
}

// Offset 0 is SmolVLA's norm: version 3's backward gives version 2's bits there (dres, dres_x and dw:
// the same sums in the same order), so a launcher may take it for both models without changing
// SmolVLA's numbers. (Version 4 sums a row in another order: checked against the reference only.)
static void check_offset_zero_bits(int N, int C, uint64_t seed) {
    if (!backward_takes(2, C, 0.0f, BLOCK)) { return; }
    size_t n = (size_t)N * C;
    float* x = random_floats(n, 2.0f, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    float* dout = random_floats(n, 1.0f, seed + 2);
    float* dres0 = random_floats(n, 0.5f, seed + 3);
    float* rstd = random_floats(N, 0.5f, seed + 4);
    for (int i = 0; i < N; i++) { rstd[i] += 1.0f; }  // in [0.5, 1.5]
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    floatX* d_dout = to_device_x(dout, n);
    float* d_rstd = to_device_f(rstd, N);
    floatX* dres_x[2] = {alloc_x(n), alloc_x(n)};
    float *dres[2] = {alloc_f(n), alloc_f(n)}, *dw[2] = {alloc_f(C), alloc_f(C)};
    float* partial = alloc_f(n);
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaMemcpy(dres[k], dres0, n * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(dw[k], 0, C * sizeof(float)));
        run_backward(2 + k, BLOCK, CHUNK_ROWS, dres[k], dres_x[k], dw[k], partial, d_dout, d_x, d_w, d_rstd, N, C,
                     0.0f);
    }
    size_t differ = count_differing(dres[0], dres[1], n, sizeof(float)) +
                    count_differing(dres_x[0], dres_x[1], n, sizeof(floatX)) +
                    count_differing(dw[0], dw[1], C, sizeof(float));
    char what[200];
    snprintf(what, sizeof(what), "v3 backward offset 0 (N %d, C %d): dres, dres_x, dw bit for bit v2's: %zu of %zu "
             "differ", N, C, differ, 2 * n + C);
    check_true(what, differ == 0);
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaFree(dres_x[k])); cudaCheck(cudaFree(dres[k])); cudaCheck(cudaFree(dw[k]));
    }
    cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_rstd));
    free(x); free(w); free(dout); free(dres0); free(rstd);
}

// ----------------------------------------------------------------------------
// benchmarks at the models' shapes (offset 0 for SmolVLA's, 1 for pi0's): SmolVLA's VLM over a
// 32-sample prefix of 177 tokens at 960, its expert over 32 chunks of 50 actions at 720; pi0's VLM
// over 8 x 560 prefix rows at 2048, its expert over 8 x 51 suffix rows at 1024. Version 0 (the
// header's launchers) at BLOCK, the others at each block size they take.

static void benchmark_shape(const char* name, int N, int C, float eps, float offset) {
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
    float* partial = alloc_f(colsum_chunks(N) * C);  // the launcher's chunks: CHUNK_ROWS's or more
    rmsnorm_forward(out, rstd, x, w, N, C, eps, offset);  // a real rstd for the backward

    double fwd_bytes = 2.0 * n * sizeof(floatX) + C * sizeof(floatX) + N * sizeof(float);
    for (int version = 0; version <= 2; version++) {
        if (!forward_takes(version, C)) { continue; }
        for (int block = version == 0 ? BLOCK : 64; block <= (version == 0 ? BLOCK : 1024); block *= 2) {
            double ms = time_ms([&]() { run_forward(version, block, out, rstd, x, w, N, C, eps, offset); }, 20);
            printf("bench %-8s forward  %s (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n", version_name(version), name,
                   N, C, block, ms, fwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    for (int version = 0; version < N_VERSIONS; version++) {
        // dout and x read, dres read and written, dres_x written, the partial sums written and read
        int rows = version == 0 ? colsum_rows(N) : CHUNK_ROWS, chunks = ceil_div(N, rows);
        double bwd_bytes = 3.0 * n * sizeof(floatX) + 2.0 * n * sizeof(float) + 2.0 * chunks * C * sizeof(float) +
                           N * sizeof(float) + C * (sizeof(floatX) + 2 * sizeof(float));
        for (int block = version == 0 ? BLOCK : 128; block <= (version == 0 ? BLOCK : RMSNORM_MAX_BLOCK); block *= 2) {
            if (!backward_takes(version, C, offset, block)) { continue; }
            double ms = time_ms([&]() {
                run_backward(version, block, rows, dres, dres_x, dw, partial, dout, x, w, rstd, N, C, offset);
            }, 20);
            printf("bench %-8s backward %s (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n", version_name(version), name,
                   N, C, block, ms, bwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(rstd)); cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dw));
    cudaCheck(cudaFree(partial));
    free(h);
}

static void benchmark(void) {
    benchmark_shape("smolvla vlm", 32 * 177, 960, FLOW_EPS, 0.0f);
    benchmark_shape("smolvla expert", 32 * 50, 720, FLOW_EPS, 0.0f);
    benchmark_shape("pi0 vlm", 8 * 560, 2048, 1e-6f, 1.0f);
    benchmark_shape("pi0 expert", 8 * 51, 1024, 1e-6f, 1.0f);
}

int main(void) {
    dev_init("rmsnorm");
    // SmolVLA's (eps 1e-5): odd widths (scalar paths only), widths where versions 2 and 4 apply
    // (multiples of x128::size), the VLM width, the widest version 1 of the backward takes at 256
    // threads; row counts that leave the last warp's block or the last chunk partly empty. pi0's (eps
    // 1e-6): the VLM's and the expert's widths, 2048 (past version 2's backward) and 1024. Each at
    // offset 0 (every version) and 1 (Gemma's: every version but version 1's backward).
    struct { int N, C; float eps; } shapes[] = {
        {7, 37, FLOW_EPS}, {45, 64, FLOW_EPS}, {13, 300, FLOW_EPS}, {33, 24, FLOW_EPS},
        {70, 960, FLOW_EPS}, {3, 2048, FLOW_EPS}, {37, 2048, 1e-6f}, {21, 1024, 1e-6f},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        for (int offset = 0; offset <= 1; offset++) {
            check_forward(shapes[i].N, shapes[i].C, shapes[i].eps, (float)offset, 100 + 10 * i);
            check_backward(shapes[i].N, shapes[i].C, shapes[i].eps, (float)offset, 200 + 10 * i);
        }
        check_offset_zero_bits(shapes[i].N, shapes[i].C, 300 + 10 * i);
    }
    return dev_finish(benchmark);
}
