/*
matmul.cu: the matrix products of every linear layer (forward, input gradient, weight gradient)
and the bias gradient, row-major as the model calls them:

  forward          out (N, OC) = inp (N, C) W^T [+ bias] [+ residual]; row strides for reading or
                   writing part of a wider matrix; with GELU-tanh on the fp32 sum (the frozen
                   vision tower's fc1, matmul_forward_gelu)
  input gradient   dinp (N, C) = dout (N, OC) W [+ beta dinp]
  weight gradient  dW (OC, C) += dout^T inp, fp32
  bias gradient    db (OC) += the column sums of dout, fp32, in two fixed-order stages: partial sums
                   of chunks of rows, then the chunks' sum in order (vla/cuda/column_sum.cuh)

  products, version 1  (this program's) one thread per output value, its fp32 sum over the inner
                       dimension read straight from global memory (matmul_forward_kernel1,
                       matmul_backward_input_kernel1, matmul_backward_weight_kernel1)
            version 2  cuBLASLt, fp32 accumulation (vla/cuda/matmul.cuh's matmul_forward,
                       matmul_forward_gelu with the GELU_BIAS epilogue, matmul_backward_input,
                       matmul_backward_weight), one plan per shape and alignment (matmul_plan)
  bias gradient's first stage,
            version 1  (this program's) a thread per column, scalar loads (column_partial_kernel1)
            version 2  128-bit loads: a lane per 8 columns (4 in fp32), 8 warps over a chunk's rows,
                       their sums added in warp order (the header's column_partial_kernel2; the
                       width, the row stride and the pointer in whole 16-byte packs, which its
                       launcher bias_backward asks); column_sum_kernel adds the chunks in both

  nvcc -O3 -std=c++17 -arch=sm_90 matmul.cu -lcublasLt -o matmul && ./matmul
*/
#include "common.h"
#include "../../vla/cuda/matmul.cuh"
#include "../../vla/cuda/column_sum.cuh"
#include "../../vla/cuda/gelu.cuh"

// floatX outputs carry its rounding: 2^-8 relative for bf16 (the fp32 sums of bf16 products are
// rounded once to bf16 when stored); fp32 outputs (weight and bias gradients) only the fp32
// accumulation of inputs that are exact in fp32 (to_device_x rounded them already).
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-5;
static const int BLOCKS_V1[] = {32, 100, 1024};  // version 1: one thread per output, any block size
static const int N_BLOCKS_V1 = sizeof(BLOCKS_V1) / sizeof(BLOCKS_V1[0]);

// ----------------------------------------------------------------------------
// version 1: one thread per output value

// out (N, OC; row stride ld_out) = inp (N, C; ld_inp) w (OC, C)^T [+ bias (OC)] [+ res (N, OC; ld_out)],
// then GELU-tanh where asked, of the fp32 sum
__global__ void matmul_forward_kernel1(floatX* out, const floatX* inp, const floatX* w, const floatX* bias,
                                       const floatX* res, int N, int C, int OC, int ld_out, int ld_inp, int gelu) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * OC) { return; }
    int o = (int)(idx % OC);
    size_t n = idx / OC;
    float s = bias != NULL ? f32(bias[o]) : 0.0f;
    for (int c = 0; c < C; c++) { s += f32(inp[n * ld_inp + c]) * f32(w[(size_t)o * C + c]); }
    if (res != NULL) { s += f32(res[n * ld_out + o]); }
    out[n * ld_out + o] = fx(gelu ? gelu_tanh(s) : s);
}

// dinp (N, C) = dout (N, OC; ld_dout) w (OC, C) [+ beta dinp]
__global__ void matmul_backward_input_kernel1(floatX* dinp, const floatX* dout, const floatX* w, int N, int C, int OC,
                                              float beta, int ld_dout) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) { return; }
    int c = (int)(idx % C);
    size_t n = idx / C;
    float s = 0.0f;
    for (int o = 0; o < OC; o++) { s += f32(dout[n * ld_dout + o]) * f32(w[(size_t)o * C + c]); }
    dinp[idx] = fx(beta != 0.0f ? s + beta * f32(dinp[idx]) : s);
}

// dw (OC, C) fp32 += dout (N, OC; ld_dout)^T inp (N, C; ld_inp)
__global__ void matmul_backward_weight_kernel1(float* dw, const floatX* dout, const floatX* inp, int N, int C, int OC,
                                               int ld_dout, int ld_inp) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)OC * C) { return; }
    int c = (int)(idx % C), o = (int)(idx / C);
    float s = 0.0f;
    for (int n = 0; n < N; n++) { s += f32(dout[(size_t)n * ld_dout + o]) * f32(inp[(size_t)n * ld_inp + c]); }
    dw[idx] += s;
}

// bias gradient, version 1 of the first stage: partial (gridDim.y, C) = the column sums of x's chunks
// of rows_per_block rows, a thread per column
__global__ void column_partial_kernel1(float* partial, const floatX* x, int N, int C, int ld, int rows_per_block) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    int r0 = blockIdx.y * rows_per_block, r1 = min(r0 + rows_per_block, N);
    float s = 0.0f;
    for (int n = r0; n < r1; n++) { s += f32(x[(size_t)n * ld + c]); }
    partial[(size_t)blockIdx.y * C + c] = s;
}

// ----------------------------------------------------------------------------
// launchers: version 1 at `block` threads a block, version 2 the header's (block unused); row
// strides 0: dense

static void forward(int version, int block, floatX* out, const floatX* inp, const floatX* w, const floatX* bias,
                    const floatX* res, int N, int C, int OC, int ld_out = 0, int ld_inp = 0, int gelu = 0) {
    if (version == 2) {
        if (gelu) {
            matmul_forward_gelu(out, inp, w, bias, N, C, OC);  // (dense, no residual: its one call)
        } else {
            matmul_forward(out, inp, w, bias, res, N, C, OC, ld_out, ld_inp);
        }
        return;
    }
    size_t n = (size_t)N * OC;
    matmul_forward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(out, inp, w, bias, res, N, C, OC,
                                                                          ld_out > 0 ? ld_out : OC,
                                                                          ld_inp > 0 ? ld_inp : C, gelu);
    launchCheck();
}

static void backward_input(int version, int block, floatX* dinp, const floatX* dout, const floatX* w, int N, int C,
                           int OC, float beta, int ld_dout = 0) {
    if (version == 2) {
        matmul_backward_input(dinp, dout, w, N, C, OC, beta, ld_dout);
        return;
    }
    size_t n = (size_t)N * C;
    matmul_backward_input_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dinp, dout, w, N, C, OC, beta,
                                                                                 ld_dout > 0 ? ld_dout : OC);
    launchCheck();
}

static void backward_weight(int version, int block, float* dw, const floatX* dout, const floatX* inp, int N, int C,
                            int OC, int ld_dout = 0, int ld_inp = 0) {
    if (version == 2) {
        matmul_backward_weight(dw, dout, inp, N, C, OC, ld_dout, ld_inp);
        return;
    }
    size_t n = (size_t)OC * C;
    matmul_backward_weight_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dw, dout, inp, N, C, OC,
                                                                                  ld_dout > 0 ? ld_dout : OC,
                                                                                  ld_inp > 0 ? ld_inp : C);
    launchCheck();
}

// the versions a check runs: version 1 at each of BLOCKS_V1, then version 2
static const int N_RUNS = N_BLOCKS_V1 + 1;
static int run_version(int i) { return i < N_BLOCKS_V1 ? 1 : 2; }
static int run_block(int i) { return i < N_BLOCKS_V1 ? BLOCKS_V1[i] : 0; }
static const char* run_name(int i) {
    static char name[40];
    if (i < N_BLOCKS_V1) {
        snprintf(name, sizeof(name), "v1 block %d", BLOCKS_V1[i]);
    } else {
        snprintf(name, sizeof(name), "v2");
    }
    return name;
}

// rows x width values in [-scale, scale) stored with row stride ld; the gaps between rows hold NaN,
// so a product that reads past a row's width fails its check
static float* random_rows(int rows, int width, int ld, float scale, uint64_t seed) {
    float* x = random_floats((size_t)rows * ld, scale, seed);
    for (int r = 0; r < rows; r++) {
        for (int c = width; c < ld; c++) { x[(size_t)r * ld + c] = NAN; }
    }
    return x;
}

// the dense (rows, width) part of a matrix stored with row stride ld
static float* dense_rows(const float* x, int rows, int width, int ld) {
    float* d = (float*)mallocCheck((size_t)rows * width * sizeof(float));
    for (int r = 0; r < rows; r++) { memcpy(d + (size_t)r * width, x + (size_t)r * ld, width * sizeof(float)); }
    return d;
}

// A product writes its rows only: the gaps (columns width..ld-1) of a poisoned output keep the poison.
static void check_gaps(const char* what, const floatX* d, int rows, int width, int ld) {
    size_t n = (size_t)rows * ld * sizeof(floatX);
    uint8_t* h = (uint8_t*)mallocCheck(n);
    cudaCheck(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    size_t touched = 0;
    for (int r = 0; r < rows; r++) {
        for (size_t b = ((size_t)r * ld + width) * sizeof(floatX); b < (size_t)(r + 1) * ld * sizeof(floatX); b++) {
            touched += h[b] != 0xFF;
        }
    }
    char msg[300];
    snprintf(msg, sizeof(msg), "%s: gaps between rows untouched (%zu bytes written)", what, touched);
    check_true(msg, touched == 0);
    free(h);
}

// ---- forward: out (N, OC; stride ld_out) = inp (N, C; stride ld_inp) W^T [+ bias] [+ res]

typedef struct {
    int N, C, OC, bias, res, ld_out, ld_inp;  // ld 0: dense
    const char* name;
} FwdCase;

// ref (N, OC) dense
static void forward_reference(double* ref, const float* inp, const float* w, const float* bias, const float* res, int N,
                              int C, int OC, int ldo, int ldi) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double s = bias != NULL ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) { s += (double)inp[(size_t)n * ldi + c] * w[(size_t)o * C + c]; }
            if (res != NULL) { s += res[(size_t)n * ldo + o]; }
            ref[(size_t)n * OC + o] = s;
        }
    }
}

// ---- the fc1 of a frozen vision tower: out (N, OC) = GELU-tanh(inp W^T + bias) in one product.
// GELU of the fp32 sum (cuBLASLt's epilogue; version 1's gelu_tanh), then one rounding to floatX;
// in fp32 builds up to 1e-4, for cuBLASLt's own tanh
static void check_forward_gelu(int N, int C, int OC, uint64_t seed) {
    float* inp = random_floats((size_t)N * C, 1.0f, seed);
    float* w = random_floats((size_t)OC * C, 1.0f, seed + 1);
    float* bias = random_floats(OC, 1.0f, seed + 2);
    floatX* d_inp = to_device_x(inp, (size_t)N * C);
    floatX* d_w = to_device_x(w, (size_t)OC * C);
    floatX* d_bias = to_device_x(bias, OC);
    double* ref = (double*)mallocCheck((size_t)N * OC * sizeof(double));
    forward_reference(ref, inp, w, bias, NULL, N, C, OC, OC, C);
    for (size_t i = 0; i < (size_t)N * OC; i++) {
        double x = ref[i];
        ref[i] = 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
    }
    floatX* out;
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(floatX)));
    for (int i = 0; i < N_RUNS; i++) {
        poison(out, (size_t)N * OC * sizeof(floatX));
        forward(run_version(i), run_block(i), out, d_inp, d_w, d_bias, NULL, N, C, OC, 0, 0, 1);
        float* got = from_device_x(out, (size_t)N * OC);
        char what[200];
        snprintf(what, sizeof(what), "%s forward with GELU (N %d, C %d, OC %d, bias)", run_name(i), N, C, OC);
        check_close(what, got, ref, (size_t)N * OC, sizeof(floatX) == 4 ? 1e-4 : TOL_X);
        free(got);
    }
    free(inp); free(w); free(bias); free(ref);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(out));
}

static void check_forward(const FwdCase* k, uint64_t seed) {
    int N = k->N, C = k->C, OC = k->OC;
    int ldo = k->ld_out > 0 ? k->ld_out : OC, ldi = k->ld_inp > 0 ? k->ld_inp : C;
    float* inp = random_rows(N, C, ldi, 1.0f, seed);
    float* w = random_floats((size_t)OC * C, 1.0f, seed + 1);
    float* bias = k->bias ? random_floats(OC, 1.0f, seed + 2) : NULL;
    float* res = k->res ? random_rows(N, OC, ldo, 1.0f, seed + 3) : NULL;
    floatX* d_inp = to_device_x(inp, (size_t)N * ldi);
    floatX* d_w = to_device_x(w, (size_t)OC * C);
    floatX* d_bias = bias != NULL ? to_device_x(bias, OC) : NULL;
    floatX* d_res = res != NULL ? to_device_x(res, (size_t)N * ldo) : NULL;
    double* ref = (double*)mallocCheck((size_t)N * OC * sizeof(double));
    forward_reference(ref, inp, w, bias, res, N, C, OC, ldo, ldi);
    floatX* out;
    cudaCheck(cudaMalloc(&out, (size_t)N * ldo * sizeof(floatX)));
    for (int i = 0; i < N_RUNS; i++) {
        poison(out, (size_t)N * ldo * sizeof(floatX));
        forward(run_version(i), run_block(i), out, d_inp, d_w, d_bias, d_res, N, C, OC, k->ld_out, k->ld_inp);
        float* full = from_device_x(out, (size_t)N * ldo);
        float* got = dense_rows(full, N, OC, ldo);
        char what[300];
        snprintf(what, sizeof(what), "%s forward %s (N %d, C %d, OC %d%s%s, ld_out %d, ld_inp %d)", run_name(i),
                 k->name, N, C, OC, k->bias ? ", bias" : "", k->res ? ", residual" : "", ldo, ldi);
        check_close(what, got, ref, (size_t)N * OC, TOL_X);
        if (ldo > OC) { check_gaps(what, out, N, OC, ldo); }
        free(full); free(got);
    }
    free(inp); free(w); free(bias); free(res); free(ref);
    cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_bias)); cudaCheck(cudaFree(d_res));
    cudaCheck(cudaFree(out));
}

// ---- input gradient: dinp (N, C) = dout (N, OC; stride ld_dout) W [+ beta dinp]

typedef struct {
    int N, C, OC;
    float beta;
    int ld_dout;
    const char* name;
} BwdInCase;

static void check_backward_input(const BwdInCase* k, uint64_t seed) {
    int N = k->N, C = k->C, OC = k->OC, ldd = k->ld_dout > 0 ? k->ld_dout : OC;
    float* dout = random_rows(N, OC, ldd, 1.0f, seed);
    float* w = random_floats((size_t)OC * C, 1.0f, seed + 1);
    float* dinp0 = random_floats((size_t)N * C, 1.0f, seed + 2);  // what beta = 1 accumulates onto
    floatX* d_dout = to_device_x(dout, (size_t)N * ldd);
    floatX* d_w = to_device_x(w, (size_t)OC * C);
    floatX* d_dinp0 = to_device_x(dinp0, (size_t)N * C);
    floatX* dinp;
    cudaCheck(cudaMalloc(&dinp, (size_t)N * C * sizeof(floatX)));
    double* ref = (double*)mallocCheck((size_t)N * C * sizeof(double));
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            double s = k->beta != 0.0f ? (double)k->beta * dinp0[(size_t)n * C + c] : 0.0;
            for (int o = 0; o < OC; o++) { s += (double)dout[(size_t)n * ldd + o] * w[(size_t)o * C + c]; }
            ref[(size_t)n * C + c] = s;
        }
    }
    for (int i = 0; i < N_RUNS; i++) {
        if (k->beta != 0.0f) {
            cudaCheck(cudaMemcpy(dinp, d_dinp0, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));
        } else {
            poison(dinp, (size_t)N * C * sizeof(floatX));
        }
        backward_input(run_version(i), run_block(i), dinp, d_dout, d_w, N, C, OC, k->beta, k->ld_dout);
        float* got = from_device_x(dinp, (size_t)N * C);
        char what[300];
        snprintf(what, sizeof(what), "%s backward input %s (N %d, C %d, OC %d, beta %g, ld_dout %d)", run_name(i),
                 k->name, N, C, OC, k->beta, ldd);
        check_close(what, got, ref, (size_t)N * C, TOL_X);
        free(got);
    }
    free(dout); free(w); free(dinp0); free(ref);
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(dinp)); cudaCheck(cudaFree(d_dinp0));
}

// ---- weight gradient: dw (OC, C) += dout (N, OC; stride ld_dout)^T inp (N, C; stride ld_inp), fp32

typedef struct {
    int N, C, OC, ld_dout, ld_inp;
    const char* name;
} BwdWCase;

static void check_backward_weight(const BwdWCase* k, uint64_t seed) {
    int N = k->N, C = k->C, OC = k->OC;
    int ldd = k->ld_dout > 0 ? k->ld_dout : OC, ldi = k->ld_inp > 0 ? k->ld_inp : C;
    float* dout = random_rows(N, OC, ldd, 1.0f, seed);
    float* inp = random_rows(N, C, ldi, 1.0f, seed + 1);
    float* dw0 = random_floats((size_t)OC * C, 1.0f, seed + 2);  // the gradient so far: accumulated onto
    floatX* d_dout = to_device_x(dout, (size_t)N * ldd);
    floatX* d_inp = to_device_x(inp, (size_t)N * ldi);
    float* dw = to_device_f(dw0, (size_t)OC * C);
    double* ref = (double*)mallocCheck((size_t)OC * C * sizeof(double));
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = dw0[(size_t)o * C + c];
            for (int n = 0; n < N; n++) { s += (double)dout[(size_t)n * ldd + o] * inp[(size_t)n * ldi + c]; }
            ref[(size_t)o * C + c] = s;
        }
    }
    for (int i = 0; i < N_RUNS; i++) {
        cudaCheck(cudaMemcpy(dw, dw0, (size_t)OC * C * sizeof(float), cudaMemcpyHostToDevice));
        backward_weight(run_version(i), run_block(i), dw, d_dout, d_inp, N, C, OC, k->ld_dout, k->ld_inp);
        float* got = from_device_f(dw, (size_t)OC * C);
        char what[300];
        snprintf(what, sizeof(what), "%s backward weight %s (N %d, C %d, OC %d, ld_dout %d, ld_inp %d), dw += ",
                 run_name(i), k->name, N, C, OC, ldd, ldi);
        check_close(what, got, ref, (size_t)OC * C, TOL_F);
        free(got);
    }
    free(dout); free(inp); free(dw0); free(ref);
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_inp)); cudaCheck(cudaFree(dw));
}

// ---- bias gradient: db (OC) += column sums of dout (N, OC; stride ld), fp32

typedef struct {
    int N, OC, ld;
    const char* name;
} BiasCase;

static void check_bias_backward(const BiasCase* k, uint64_t seed) {
    int N = k->N, OC = k->OC, ld = k->ld > 0 ? k->ld : k->OC;
    float* dout = random_rows(N, OC, ld, 1.0f, seed);
    float* db0 = random_floats(OC, 1.0f, seed + 1);
    floatX* d_dout = to_device_x(dout, (size_t)N * ld);
    double* ref = (double*)mallocCheck(OC * sizeof(double));
    for (int o = 0; o < OC; o++) {
        double s = db0[o];
        for (int n = 0; n < N; n++) { s += dout[(size_t)n * ld + o]; }
        ref[o] = s;
    }
    float* db = to_device_f(db0, OC);
    char what[300];
    // version 1 at several block sizes and chunk heights, version 2 at those chunk heights, then its
    // launcher (colsum_rows(N)): these two where their 128-bit loads fit
    int blocks[4] = {32, 64, 256, 1024}, rows[2] = {CHUNK_ROWS, 5};
    bool v2 = packable(OC, x128::size, d_dout) && ld % x128::size == 0;
    for (int ri = 0; ri < 3; ri++) {
        int rows_per_block = ri < 2 ? rows[ri] : colsum_rows(N), chunks = ceil_div(N, rows_per_block);
        float* partial;  // exactly the scratch this chunking needs
        cudaCheck(cudaMalloc(&partial, (size_t)chunks * OC * sizeof(float)));
        for (int bi = 0; bi < (ri < 2 ? 5 : 1); bi++) {
            if ((bi == 4 || ri == 2) && !v2) { continue; }
            cudaCheck(cudaMemcpy(db, db0, OC * sizeof(float), cudaMemcpyHostToDevice));
            poison(partial, (size_t)chunks * OC * sizeof(float));
            if (ri < 2 && bi == 4) {
                dim3 grid(ceil_div(OC, 32 * x128::size), chunks);
                column_partial_kernel2<<<grid, 32 * COLPART2_WARPS, 0, main_stream>>>(partial, d_dout, N, OC, ld,
                                                                                      rows_per_block);
                launchCheck();
                column_sum(db, partial, chunks, OC);
                snprintf(what, sizeof(what), "v2 bias backward %s (N %d, OC %d, ld %d), %d rows per chunk, db += ",
                         k->name, N, OC, ld, rows_per_block);
            } else if (ri < 2) {
                int block = blocks[bi];
                dim3 grid(ceil_div(OC, block), chunks);
                column_partial_kernel1<<<grid, block, 0, main_stream>>>(partial, d_dout, N, OC, ld, rows_per_block);
                launchCheck();
                column_sum(db, partial, chunks, OC);
                snprintf(what, sizeof(what), "v1 bias backward %s (N %d, OC %d, ld %d) block %d, %d rows per chunk, "
                         "db += ", k->name, N, OC, ld, block, rows_per_block);
            } else {
                bias_backward(db, partial, d_dout, N, OC, k->ld);
                snprintf(what, sizeof(what), "v2 bias_backward launcher %s (N %d, OC %d, ld %d), db += ", k->name, N,
                         OC, ld);
            }
            float* got = from_device_f(db, OC);
            check_close(what, got, ref, OC, TOL_F);
            free(got);
        }
        cudaCheck(cudaFree(partial));
    }
    free(dout); free(db0); free(ref);
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(db));
}

// ---- the plan cache: one plan per (shape, layout, alignment), reused with new pointers

static void check_plans(void) {
    const int N = 19, C = 8, OC = 24;  // a shape no other check uses
    float* inp[2];
    float* w[2];
    float* bias[2];
    floatX *d_inp[2], *d_w[2], *d_bias[2];
    double* ref[2];
    for (int i = 0; i < 2; i++) {
        // w has 8 leading values: the second product reads it from 8 elements in (a 16-byte boundary
        // in bf16), which only a plan chosen for that alignment may do
        inp[i] = random_floats((size_t)N * C, 1.0f, 500 + 10 * i);
        w[i] = random_floats(8 + (size_t)OC * C, 1.0f, 501 + 10 * i);
        bias[i] = random_floats(OC, 1.0f, 502 + 10 * i);
        d_inp[i] = to_device_x(inp[i], (size_t)N * C);
        d_w[i] = to_device_x(w[i], 8 + (size_t)OC * C);
        d_bias[i] = to_device_x(bias[i], OC);
        ref[i] = (double*)mallocCheck((size_t)N * OC * sizeof(double));
    }
    floatX* out;
    cudaCheck(cudaMalloc(&out, (size_t)N * OC * sizeof(floatX)));
    char what[300];
    int n0 = n_matmul_plans;
    for (int i = 0; i < 2; i++) {  // the same shape twice: the second call reuses the plan, with its own bias
        poison(out, (size_t)N * OC * sizeof(floatX));
        matmul_forward(out, d_inp[i], d_w[i], d_bias[i], NULL, N, C, OC);
        forward_reference(ref[i], inp[i], w[i], bias[i], NULL, N, C, OC, OC, C);
        float* got = from_device_x(out, (size_t)N * OC);
        snprintf(what, sizeof(what), "v2 plan cache: call %d of one shape (N %d, C %d, OC %d, bias)", i + 1, N, C, OC);
        check_close(what, got, ref[i], (size_t)N * OC, TOL_X);
        free(got);
    }
    int n1 = n_matmul_plans;
    snprintf(what, sizeof(what), "v2 plan cache: one shape called twice made 1 plan (%d)", n1 - n0);
    check_true(what, n1 == n0 + 1);
    poison(out, (size_t)N * OC * sizeof(floatX));
    matmul_forward(out, d_inp[1], d_w[1] + 8, d_bias[1], NULL, N, C, OC);
    int n2 = n_matmul_plans;
    forward_reference(ref[1], inp[1], w[1] + 8, bias[1], NULL, N, C, OC, OC, C);
    float* got = from_device_x(out, (size_t)N * OC);
    snprintf(what, sizeof(what), "v2 plan cache: W %u-byte aligned (N %d, C %d, OC %d, bias)",
             pointer_alignment(d_w[1] + 8), N, C, OC);
    check_close(what, got, ref[1], (size_t)N * OC, TOL_X);
    snprintf(what, sizeof(what), "v2 plan cache: a less aligned W made its own plan (%d)", n2 - n1);
    check_true(what, n2 == n1 + 1);
    matmul_forward(out, d_inp[0], d_w[0], d_bias[0], NULL, N, C, OC);
    matmul_forward(out, d_inp[0], d_w[0] + 8, d_bias[0], NULL, N, C, OC);
    snprintf(what, sizeof(what), "v2 plan cache: both alignments again made no plan (%d)", n_matmul_plans - n2);
    check_true(what, n_matmul_plans == n2);
    free(got);
    for (int i = 0; i < 2; i++) {
        free(inp[i]); free(w[i]); free(bias[i]); free(ref[i]);
        cudaCheck(cudaFree(d_inp[i])); cudaCheck(cudaFree(d_w[i])); cudaCheck(cudaFree(d_bias[i]));
    }
    cudaCheck(cudaFree(out));
}

// ---- benchmark at the smolvla preset's shapes

static void benchmark(void) {
    const int P = 7040, d = 960, D = 960, f = 2560;  // 16 samples x 440 prefix tokens; D = 15 heads x 64
    size_t n_big = (size_t)P * f;
    float* h = random_floats(n_big, 1.0f, 900);
    floatX* x = to_device_x(h, n_big);          // inputs (P, up to f)
    floatX* y = to_device_x(h, (size_t)P * d);  // output gradients, residuals (P, d)
    floatX* w = to_device_x(h, (size_t)f * d);  // weights (up to f x d)
    floatX* out;
    float *dw, *db, *partial;
    cudaCheck(cudaMalloc(&out, n_big * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dw, (size_t)f * d * sizeof(float)));
    cudaCheck(cudaMalloc(&db, (size_t)d * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, colsum_chunks(P) * d * sizeof(float)));
    cudaCheck(cudaMemset(dw, 0, (size_t)f * d * sizeof(float)));
    cudaCheck(cudaMemset(db, 0, (size_t)d * sizeof(float)));
    struct { const char* name; int kind, N, C, OC; } runs[] = {  // kind 0 forward, 1 + residual, 2 dinp, 3 dW
        {"forward q projection", 0, P, d, D},
        {"forward MLP gate", 0, P, d, f},
        {"forward MLP down + residual", 1, P, f, d},
        {"backward input MLP down", 2, P, f, d},
        {"backward weight MLP down", 3, P, f, d},
    };
    // version 1 at BLOCK, fewer repetitions (its products take tens of milliseconds), then version 2
    for (int version = 1; version <= 2; version++) {
        for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
            int kind = runs[i].kind, N = runs[i].N, C = runs[i].C, OC = runs[i].OC;
            double ms = time_ms([&]() {
                if (kind == 0) { forward(version, BLOCK, out, x, w, NULL, NULL, N, C, OC); }
                if (kind == 1) { forward(version, BLOCK, out, x, w, NULL, y, N, C, OC); }
                if (kind == 2) { backward_input(version, BLOCK, out, y, w, N, C, OC, 0.0f); }
                if (kind == 3) { backward_weight(version, BLOCK, dw, y, x, N, C, OC); }
            }, version == 1 ? 5 : 20);
            double flops = 2.0 * N * C * OC;
            printf("bench v%d %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", version, runs[i].name, N, C, OC,
                   ms, flops / (ms * 1e-3) / 1e12);
        }
    }
    // the vision tower's fc1 at the smolvla shapes (32 samples x 2 cameras x 1024 patches, 768 -> 3072):
    // the product then the GELU kernel (a trained tower, which keeps fc1) against the GELU epilogue
    {
        const int V = 32 * 2 * 1024, Cv = 768, Fv = 3072;
        float* hv = random_floats((size_t)V * Cv, 1.0f, 901);
        floatX* xv = to_device_x(hv, (size_t)V * Cv);
        floatX* wv = to_device_x(hv, (size_t)Fv * Cv);
        floatX* bv = to_device_x(hv, Fv);
        floatX *fc1, *act;
        cudaCheck(cudaMalloc(&fc1, (size_t)V * Fv * sizeof(floatX)));
        cudaCheck(cudaMalloc(&act, (size_t)V * Fv * sizeof(floatX)));
        double flops = 2.0 * V * Cv * Fv;
        double ms_two = time_ms([&]() {
            matmul_forward(fc1, xv, wv, bv, NULL, V, Cv, Fv);
            gelu_forward(act, fc1, (size_t)V * Fv);
        }, 20);
        double ms_one = time_ms([&]() { matmul_forward_gelu(act, xv, wv, bv, V, Cv, Fv); }, 20);
        printf("bench v2 %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", "vision fc1 then gelu", V, Cv, Fv,
               ms_two, flops / (ms_two * 1e-3) / 1e12);
        printf("bench v2 %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", "vision fc1, GELU epilogue", V, Cv, Fv,
               ms_one, flops / (ms_one * 1e-3) / 1e12);
        free(hv);
        cudaCheck(cudaFree(xv)); cudaCheck(cudaFree(wv)); cudaCheck(cudaFree(bv)); cudaCheck(cudaFree(fc1));
        cudaCheck(cudaFree(act));
    }
    double bytes = (double)P * d * sizeof(floatX);  // dout once; the partial sums are CHUNK_ROWS times fewer
    int chunks = (int)colsum_chunks(P);
    for (int version = 1; version <= 2; version++) {
        double ms = time_ms([&]() {
            if (version == 2) {
                bias_backward(db, partial, y, P, d);
                return;
            }
            dim3 grid(ceil_div(d, BLOCK), chunks);
            column_partial_kernel1<<<grid, BLOCK, 0, main_stream>>>(partial, y, P, d, d, colsum_rows(P));
            launchCheck();
            column_sum(db, partial, chunks, d);
        }, 20);
        printf("bench v%d %-28s (N %d, OC %d): %8.3f ms, %7.1f GB/s\n", version, "bias backward", P, d, ms,
               bytes / (ms * 1e-3) / 1e9);
    }
    free(h);
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(y)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(partial));
}

int main(void) {
    dev_init("matmul");
    matmul_init();
    check_plans();
    // odd sizes, tiny dims, bias and residual, and the strided views the trainer uses: state rows
    // in the suffix stream (stride Ns*da: 5 samples, da 12, Ns 7), the first half of (R, 2da) rows
    FwdCase fwd[] = {
        {37, 12, 20, 0, 0, 0, 0, "dense"},
        {37, 12, 20, 1, 0, 0, 0, "dense"},
        {37, 12, 20, 1, 1, 0, 0, "dense"},
        {64, 48, 32, 0, 1, 0, 0, "MLP down"},
        {4, 4, 4, 1, 0, 0, 0, "tiny"},
        {1, 7, 5, 1, 0, 0, 0, "one row"},
        {5, 4, 12, 1, 0, 7 * 12, 0, "state rows"},
        {30, 12, 16, 1, 0, 0, 2 * 12, "half of 2da"},
        {23, 6, 10, 1, 1, 3 * 10, 16, "both strided"},
    };
    for (size_t i = 0; i < sizeof(fwd) / sizeof(fwd[0]); i++) { check_forward(&fwd[i], 100 + 10 * i); }
    check_forward_gelu(37, 12, 20, 150);
    check_forward_gelu(64, 48, 96, 160);  // (the small preset's vision MLP: 48 -> 96)
    BwdInCase bin[] = {
        {37, 12, 20, 0.0f, 0, "dense"},
        {37, 12, 20, 1.0f, 0, "accumulate"},
        {64, 48, 32, 1.0f, 0, "accumulate"},
        {4, 4, 4, 0.0f, 0, "tiny"},
        {1, 5, 7, 1.0f, 0, "one row"},
        {30, 12, 16, 0.0f, 2 * 16, "half of 2da"},
        {5, 12, 12, 1.0f, 7 * 12, "state rows"},
    };
    for (size_t i = 0; i < sizeof(bin) / sizeof(bin[0]); i++) { check_backward_input(&bin[i], 200 + 10 * i); }
    BwdWCase bw[] = {
        {37, 12, 20, 0, 0, "dense"},
        {64, 48, 32, 0, 0, "MLP"},
        {4, 4, 4, 0, 0, "tiny"},
        {1, 3, 5, 0, 0, "one row"},
        {5, 4, 12, 7 * 12, 0, "state_w"},
        {30, 4, 12, 2 * 12, 0, "action_in_w"},
        {23, 6, 10, 3 * 10, 16, "both strided"},
    };
    for (size_t i = 0; i < sizeof(bw) / sizeof(bw[0]); i++) { check_backward_weight(&bw[i], 300 + 10 * i); }
    BiasCase bb[] = {
        {37, 20, 0, "dense"},
        {100, 4, 0, "tall"},
        {1, 3, 0, "one row"},
        {64, 300, 0, "wider than a block"},
        {5, 12, 7 * 12, "state_b"},
        {30, 12, 2 * 12, "action_in_b"},
        {70, 768, 0, "vision width, a partial chunk"},
        {41, 16, 3 * 16, "strided, 16 columns"},
        {300, 264, 0, "264 columns: a block's 256 and 8 more"},
    };
    for (size_t i = 0; i < sizeof(bb) / sizeof(bb[0]); i++) { check_bias_backward(&bb[i], 400 + 10 * i); }
    return dev_finish(benchmark);
}
