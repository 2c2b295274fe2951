/*
matmul.cu: the matrix products of every linear layer (forward, input gradient, weight gradient)
and the bias gradient.

  version 1  cuBLASLt through train_vla.cu's wrappers: matmul_forward (out = inp W^T [+ bias]
             [+ residual]), matmul_backward_input (dinp = dout W [+ beta dinp]) and
             matmul_backward_weight (fp32 dW += dout^T inp), fp32 accumulation, row strides for
             reading or writing part of a wider matrix, one plan per shape and alignment
             (matmul_plan); the bias gradient in two fixed-order stages, column_partial_kernel
             (column sums of chunks of rows) then column_sum_kernel (the chunks, in order);
             matmul_forward_gelu (out = GELU-tanh(inp W^T + bias), cuBLASLt's GELU_BIAS epilogue:
             the frozen vision tower's fc1), benchmarked against fc1 then gelu_forward
  version 2  the bias gradient's first stage with 128-bit loads (column_partial_kernel2: a lane
             per 8 columns, 8 warps over a chunk's rows, their sums added in warp order), where
             the width, the row stride and the pointer allow; bias_backward picks it

  make -C dev/cuda matmul && dev/cuda/matmul
*/
#include "common.h"

// floatX outputs carry its rounding: 2^-8 relative for bf16 (the fp32 sums of bf16 products are
// rounded once to bf16 when stored); fp32 outputs (weight and bias gradients) only the fp32
// accumulation of inputs that are exact in fp32 (to_device_x rounded them already).
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-5;

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
// GELU of the fp32 sum (cuBLASLt's epilogue), then one rounding to floatX; in fp32 builds up to
// 1e-4, for cuBLASLt's own tanh
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
    poison(out, (size_t)N * OC * sizeof(floatX));
    matmul_forward_gelu(out, d_inp, d_w, d_bias, N, C, OC);
    float* got = from_device_x(out, (size_t)N * OC);
    char what[200];
    snprintf(what, sizeof(what), "v1 forward with the GELU epilogue (N %d, C %d, OC %d, bias)", N, C, OC);
    check_close(what, got, ref, (size_t)N * OC, sizeof(floatX) == 4 ? 1e-4 : TOL_X);
    free(inp); free(w); free(bias); free(ref); free(got);
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
    poison(out, (size_t)N * ldo * sizeof(floatX));
    matmul_forward(out, d_inp, d_w, d_bias, d_res, N, C, OC, k->ld_out, k->ld_inp);
    float* full = from_device_x(out, (size_t)N * ldo);
    float* got = dense_rows(full, N, OC, ldo);
    char what[300];
    snprintf(what, sizeof(what), "v1 forward %s (N %d, C %d, OC %d%s%s, ld_out %d, ld_inp %d)", k->name, N, C, OC,
             k->bias ? ", bias" : "", k->res ? ", residual" : "", ldo, ldi);
    check_close(what, got, ref, (size_t)N * OC, TOL_X);
    if (ldo > OC) { check_gaps(what, out, N, OC, ldo); }
    free(inp); free(w); free(bias); free(res); free(ref); free(full); free(got);
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
    floatX* dinp;
    if (k->beta != 0.0f) {
        dinp = to_device_x(dinp0, (size_t)N * C);
    } else {
        cudaCheck(cudaMalloc(&dinp, (size_t)N * C * sizeof(floatX)));
        poison(dinp, (size_t)N * C * sizeof(floatX));
    }
    double* ref = (double*)mallocCheck((size_t)N * C * sizeof(double));
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            double s = k->beta != 0.0f ? (double)k->beta * dinp0[(size_t)n * C + c] : 0.0;
            for (int o = 0; o < OC; o++) { s += (double)dout[(size_t)n * ldd + o] * w[(size_t)o * C + c]; }
            ref[(size_t)n * C + c] = s;
        }
    }
    matmul_backward_input(dinp, d_dout, d_w, N, C, OC, k->beta, k->ld_dout);
    float* got = from_device_x(dinp, (size_t)N * C);
    char what[300];
    snprintf(what, sizeof(what), "v1 backward input %s (N %d, C %d, OC %d, beta %g, ld_dout %d)", k->name, N, C, OC,
             k->beta, ldd);
    check_close(what, got, ref, (size_t)N * C, TOL_X);
    free(dout); free(w); free(dinp0); free(ref); free(got);
    cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(dinp));
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
    matmul_backward_weight(dw, d_dout, d_inp, N, C, OC, k->ld_dout, k->ld_inp);
    float* got = from_device_f(dw, (size_t)OC * C);
    char what[300];
    snprintf(what, sizeof(what), "v1 backward weight %s (N %d, C %d, OC %d, ld_dout %d, ld_inp %d), dw += ", k->name,
             N, C, OC, ldd, ldi);
    check_close(what, got, ref, (size_t)OC * C, TOL_F);
    free(dout); free(inp); free(dw0); free(ref); free(got);
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
    // version 1 at several block sizes and chunk heights, version 2 (where its 128-bit loads fit) at
    // those chunk heights, then the launcher (BLOCK, colsum_rows(N))
    int blocks[4] = {32, 64, 256, 1024}, rows[2] = {CHUNK_ROWS, 5};
    bool v2 = packable(OC, x128::size, d_dout) && ld % x128::size == 0;
    for (int ri = 0; ri < 3; ri++) {
        int rows_per_block = ri < 2 ? rows[ri] : colsum_rows(N), chunks = ceil_div(N, rows_per_block);
        float* partial;  // exactly the scratch this chunking needs
        cudaCheck(cudaMalloc(&partial, (size_t)chunks * OC * sizeof(float)));
        for (int bi = 0; bi < (ri < 2 ? 5 : 1); bi++) {
            if (bi == 4 && !v2) { continue; }
            cudaCheck(cudaMemcpy(db, db0, OC * sizeof(float), cudaMemcpyHostToDevice));
            poison(partial, (size_t)chunks * OC * sizeof(float));
            if (ri < 2 && bi == 4) {
                column_partial_kernel2<<<dim3(ceil_div(OC, 32 * x128::size), chunks), 32 * COLPART2_WARPS, 0, main_stream>>>(
                    partial, d_dout, N, OC, ld, rows_per_block);
                launchCheck();
                column_sum(db, partial, chunks, OC);
                snprintf(what, sizeof(what), "v2 bias backward %s (N %d, OC %d, ld %d), %d rows per chunk, db += ",
                         k->name, N, OC, ld, rows_per_block);
            } else if (ri < 2) {
                int block = blocks[bi];
                column_partial_kernel<<<dim3(ceil_div(OC, block), chunks), block, 0, main_stream>>>(partial, d_dout, N, OC,
                                                                                                   ld, rows_per_block);
                launchCheck();
                column_sum(db, partial, chunks, OC);
                snprintf(what, sizeof(what), "v1 bias backward %s (N %d, OC %d, ld %d) block %d, %d rows per chunk, db += ",
                         k->name, N, OC, ld, block, rows_per_block);
            } else {
                bias_backward(db, partial, d_dout, N, OC, k->ld);
                snprintf(what, sizeof(what), "v%d bias_backward launcher %s (N %d, OC %d, ld %d), db += ", v2 ? 2 : 1,
                         k->name, N, OC, ld);
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
        snprintf(what, sizeof(what), "v1 plan cache: call %d of one shape (N %d, C %d, OC %d, bias)", i + 1, N, C, OC);
        check_close(what, got, ref[i], (size_t)N * OC, TOL_X);
        free(got);
    }
    int n1 = n_matmul_plans;
    snprintf(what, sizeof(what), "v1 plan cache: one shape called twice made 1 plan (%d)", n1 - n0);
    check_true(what, n1 == n0 + 1);
    poison(out, (size_t)N * OC * sizeof(floatX));
    matmul_forward(out, d_inp[1], d_w[1] + 8, d_bias[1], NULL, N, C, OC);
    int n2 = n_matmul_plans;
    forward_reference(ref[1], inp[1], w[1] + 8, bias[1], NULL, N, C, OC, OC, C);
    float* got = from_device_x(out, (size_t)N * OC);
    snprintf(what, sizeof(what), "v1 plan cache: W %u-byte aligned (N %d, C %d, OC %d, bias)",
             pointer_alignment(d_w[1] + 8), N, C, OC);
    check_close(what, got, ref[1], (size_t)N * OC, TOL_X);
    snprintf(what, sizeof(what), "v1 plan cache: a less aligned W made its own plan (%d)", n2 - n1);
    check_true(what, n2 == n1 + 1);
    matmul_forward(out, d_inp[0], d_w[0], d_bias[0], NULL, N, C, OC);
    matmul_forward(out, d_inp[0], d_w[0] + 8, d_bias[0], NULL, N, C, OC);
    snprintf(what, sizeof(what), "v1 plan cache: both alignments again made no plan (%d)", n_matmul_plans - n2);
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
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        int kind = runs[i].kind, N = runs[i].N, C = runs[i].C, OC = runs[i].OC;
        double ms = time_ms([&]() {
            if (kind == 0) { matmul_forward(out, x, w, NULL, NULL, N, C, OC); }
            if (kind == 1) { matmul_forward(out, x, w, NULL, y, N, C, OC); }
            if (kind == 2) { matmul_backward_input(out, y, w, N, C, OC, 0.0f); }
            if (kind == 3) { matmul_backward_weight(dw, y, x, N, C, OC); }
        }, 20);
        double flops = 2.0 * N * C * OC;
        printf("bench v1 %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", runs[i].name, N, C, OC, ms,
               flops / (ms * 1e-3) / 1e12);
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
        printf("bench v1 %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", "vision fc1 then gelu", V, Cv, Fv, ms_two,
               flops / (ms_two * 1e-3) / 1e12);
        printf("bench v1 %-28s (N %d, C %d, OC %d): %8.3f ms, %7.1f TFLOP/s\n", "vision fc1, GELU epilogue", V, Cv, Fv,
               ms_one, flops / (ms_one * 1e-3) / 1e12);
        free(hv);
        cudaCheck(cudaFree(xv)); cudaCheck(cudaFree(wv)); cudaCheck(cudaFree(bv)); cudaCheck(cudaFree(fc1));
        cudaCheck(cudaFree(act));
    }
    double ms = time_ms([&]() { bias_backward(db, partial, y, P, d); }, 20);
    double bytes = (double)P * d * sizeof(floatX);  // dout once; the partial sums are CHUNK_ROWS times fewer
    printf("bench v1 %-28s (N %d, OC %d): %8.3f ms, %7.1f GB/s\n", "bias backward", P, d, ms, bytes / (ms * 1e-3) / 1e9);
    free(h);
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(y)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(partial));
}

int main(void) {
    dev_init("matmul");
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
