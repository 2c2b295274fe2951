/*
vla/cuda/matmul.cuh: the matrix products of train_vla.cu through cuBLASLt. It owns the plan cache (the
descriptors, layouts and algorithm of each product shape, made once: the heuristic query costs tens
of microseconds of host time and a step has hundreds of products) and matmul_cublaslt, which runs
one product, or a strided batch of them, in cuBLASLt's column-major terms, and the row-major
products the model calls: matmul_forward (with GELU: matmul_forward_gelu), matmul_backward_input,
matmul_backward_weight, and the two that add into fp32.

Included by train_vla.cu after main_stream and vla/cuda/profiler.cuh; it uses cublasCheck and vla_fail.
*/
#ifndef VLA_MATMUL_CUH
#define VLA_MATMUL_CUH

#include <cublasLt.h>
#include "common.cuh"
#include "profiler.cuh"

static void cublas_check_(cublasStatus_t status, const char* file, int line) {
    if (status == CUBLAS_STATUS_ALLOC_FAILED) {
        vla_fail_no_memory("cuBLAS is out of memory at %s:%d: " VLA_NO_MEMORY_FIX, file, line);
    }
    if (status != CUBLAS_STATUS_SUCCESS) { vla_fail("cuBLAS error %d at %s:%d", (int)status, file, line); }
}
#define cublasCheck(call) cublas_check_((call), __FILE__, __LINE__)

// Per GPU, so per host thread, as main_stream
static thread_local cublasLtHandle_t cublaslt;
static thread_local void* cublaslt_workspace;
static const size_t CUBLASLT_WORKSPACE_BYTES = 32 << 20;
#if defined(ENABLE_FP32)
static cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
#elif defined(ENABLE_FP16)
static cudaDataType_t CUBLAS_FLOATX = CUDA_R_16F;  // fp32 compute (CUBLAS_COMPUTE_32F): tensor cores from sm_70
#else
static cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
#endif

// Largest power of two (at most 256) that divides the address: what cuBLASLt may assume.
static uint32_t pointer_alignment(const void* p) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)p % a) != 0) { a /= 2; }
    return a;
}

// cuBLASLt descriptors and the algorithm chosen for one product shape. Made once per shape: the
// heuristic query costs tens of microseconds of host time and a step has hundreds of products.
typedef struct {
    int m, n, k, lda, ldb, ldd, transa, transb, bias, gelu;  // gelu: GELU-tanh on the output (the epilogue)
    cudaDataType_t d_type;
    uint32_t align[4];  // of A, B, C, D: what the algorithm may assume
    int batch;                            // products in one call (strided batch), 1: one
    long long stride_a, stride_b, stride_d;  // elements from one product's matrix to the next's (C: D's)
} MatmulKey;

// A strided batch of products: `count` of them, each matrix `a`, `b`, `d` elements after the
// previous one's (C follows D)
typedef struct {
    int count;
    long long a, b, d;
} MatmulBatch;

typedef struct {
    MatmulKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lcd;  // C and D share a layout
    cublasLtMatmulAlgo_t algo;
} MatmulPlan;

static thread_local MatmulPlan* matmul_plans = NULL;  // plans belong to a device's cuBLASLt handle
static thread_local int n_matmul_plans = 0, cap_matmul_plans = 0;

static MatmulPlan* matmul_plan(const MatmulKey* key) {
    for (int i = 0; i < n_matmul_plans; i++) {
        if (memcmp(&matmul_plans[i].key, key, sizeof(*key)) == 0) { return &matmul_plans[i]; }
    }
    if (n_matmul_plans == cap_matmul_plans) {  // (the plans made so far stay if this fails: a policy goes on)
        int cap = cap_matmul_plans > 0 ? 2 * cap_matmul_plans : 64;
        MatmulPlan* grown = (MatmulPlan*)realloc(matmul_plans, cap * sizeof(MatmulPlan));
        if (grown == NULL) { vla_fail_no_memory("out of memory for matrix product plans: " VLA_NO_MEMORY_FIX); }
        matmul_plans = grown;
        cap_matmul_plans = cap;
    }
    MatmulPlan* p = &matmul_plans[n_matmul_plans];
    p->key = *key;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (key->bias || key->gelu) {
        uint32_t epilogue = key->gelu ? (key->bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU) :
                                        CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(
            cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    }
    int m = key->m, n = key->n, k = key->k;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, CUBLAS_FLOATX, key->transa ? k : m, key->transa ? m : k, key->lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, CUBLAS_FLOATX, key->transb ? n : k, key->transb ? k : n, key->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lcd, key->d_type, m, n, key->ldd));
    if (key->batch > 1) {
        cublasLtMatrixLayout_t layouts[3] = {p->la, p->lb, p->lcd};
        const long long strides[3] = {key->stride_a, key->stride_b, key->stride_d};
        for (int i = 0; i < 3; i++) {
            int32_t count = key->batch;
            int64_t stride = strides[i];
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                         sizeof(count)));
            cublasCheck(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &stride, sizeof(stride)));
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) {
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &key->align[i], sizeof(key->align[i])));
    }
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(
        cublasLtMatmulAlgoGetHeuristic(cublaslt, p->desc, p->la, p->lb, p->lcd, p->lcd, pref, 1, &heuristic, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
        vla_fail("cuBLASLt has no algorithm for a %d x %d x %d product (transa %d, transb %d)", m, n, k, key->transa,
                 key->transb);
    }
    p->algo = heuristic.algo;
    n_matmul_plans++;
    return p;
}

static void matmul_plans_free(void) {
    for (int i = 0; i < n_matmul_plans; i++) {
        MatmulPlan* p = &matmul_plans[i];
        cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
        cublasCheck(cublasLtMatrixLayoutDestroy(p->lcd));
        cublasCheck(cublasLtMatmulDescDestroy(p->desc));
    }
    free(matmul_plans);
    matmul_plans = NULL;
    n_matmul_plans = cap_matmul_plans = 0;
}

// This thread's cuBLASLt: the handle and workspace (on the current device), and their release with the plans
static void matmul_init(void) {
    cublasCheck(cublasLtCreate(&cublaslt));
    cudaCheck(cudaMalloc(&cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
}
static void matmul_free(void) {
    matmul_plans_free();
    cudaCheck(cudaFree(cublaslt_workspace));
    cublasCheck(cublasLtDestroy(cublaslt));
}

// D (m, n) = alpha op(A) op(B) + beta C (+ bias (m)) in cuBLASLt's column-major terms, then
// GELU-tanh where `gelu` asks (cuBLASLt's epilogue, on the fp32 sum before it is rounded to D's
// type); A, B are floatX, C and D of d_type (floatX or fp32); C is D unless `c` is given (then with
// D's layout); `batch` (NULL: one product) makes it a strided batch of them. The wrappers below
// speak row-major.
static void matmul_cublaslt(void* d, cudaDataType_t d_type, int ldd, const void* c, const floatX* a, int lda,
                            bool transa, const floatX* b, int ldb, bool transb, int m, int n, int k, float beta,
                            const floatX* bias, const MatmulBatch* batch = NULL, float alpha = 1.0f,
                            bool gelu = false) {
    int count = batch != NULL ? batch->count : 1;
    char shape[64] = "";
    if (prof.on) {
        int at = snprintf(shape, sizeof(shape), "%d x %d x %d %c%c%s%s%s", m, n, k, transa ? 'T' : 'N',
                          transb ? 'T' : 'N', d_type == CUDA_R_32F && CUBLAS_FLOATX != CUDA_R_32F ? " fp32 out" : "",
                          bias != NULL ? " +bias" : "", gelu ? " +gelu" : "");
        if (count > 1) { snprintf(shape + at, sizeof(shape) - at, ", batch %d", count); }
    }
    ProfOp prof_op("matmul", 2.0 * m * n * k * count, shape);
    const void* c_ptr = c != NULL ? c : d;
    MatmulKey key;
    memset(&key, 0, sizeof(key));  // padding too: keys are compared bytewise
    key.m = m; key.n = n; key.k = k; key.lda = lda; key.ldb = ldb; key.ldd = ldd;
    key.transa = transa; key.transb = transb; key.bias = bias != NULL; key.gelu = gelu; key.d_type = d_type;
    key.align[0] = pointer_alignment(a); key.align[1] = pointer_alignment(b);
    key.align[2] = pointer_alignment(c_ptr); key.align[3] = pointer_alignment(d);
    key.batch = count;
    if (count > 1) {  // every product's matrices must have the alignment of the first's
        key.stride_a = batch->a; key.stride_b = batch->b; key.stride_d = batch->d;
        size_t d_size = d_type == CUDA_R_32F ? sizeof(float) : sizeof(floatX);
        const size_t step[4] = {batch->a * sizeof(floatX), batch->b * sizeof(floatX), batch->d * d_size,
                                batch->d * d_size};
        for (int i = 0; i < 4; i++) {
            uint32_t s_align = pointer_alignment((const void*)(uintptr_t)step[i]);
            if (s_align < key.align[i]) { key.align[i] = s_align; }
        }
    }
    MatmulPlan* p = matmul_plan(&key);
    if (bias != NULL) {
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasCheck(cublasLtMatmul(cublaslt, p->desc, &alpha, a, p->la, b, p->lb, &beta, c_ptr, p->lcd, d, p->lcd, &p->algo,
                               cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, main_stream));
}

// out (N, OC) = inp (N, C) @ w (OC, C)^T [+ bias (OC)] [+ res (N, OC)]; row strides ld_out, ld_inp
// (0: dense). Column-major: out^T (OC, N) = W (stored as (C, OC), transposed) times inp^T (C, N).
static void matmul_forward(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, const floatX* res,
                           int N, int C, int OC, int ld_out = 0, int ld_inp = 0) {
    matmul_cublaslt(out, CUBLAS_FLOATX, ld_out > 0 ? ld_out : OC, res, w, C, true, inp, ld_inp > 0 ? ld_inp : C, false,
                    OC, N, C, res != NULL ? 1.0f : 0.0f, bias);
}

// out (N, OC) = GELU-tanh(inp (N, C) @ w (OC, C)^T + bias (OC)) in one product (cuBLASLt's GELU_BIAS
// epilogue): where nothing needs the pre-activation (the frozen vision tower's MLP), this saves
// writing it, reading it back and a kernel. GELU is taken of the fp32 sum, before its rounding to
// floatX (matmul_forward then gelu_forward round in between).
static void matmul_forward_gelu(floatX* out, const floatX* inp, const floatX* w, const floatX* bias, int N, int C,
                                int OC) {
    matmul_cublaslt(out, CUBLAS_FLOATX, OC, NULL, w, C, true, inp, C, false, OC, N, C, 0.0f, bias, NULL, 1.0f, true);
}

// dinp (N, C) = dout (N, OC) @ w (OC, C) [+ beta * dinp]; dout row stride ld_dout (0: dense).
// Column-major: dinp^T (C, N) = W (C, OC) times dout^T (OC, N).
static void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* w, int N, int C, int OC, float beta,
                                  int ld_dout = 0) {
    matmul_cublaslt(dinp, CUBLAS_FLOATX, C, NULL, w, C, false, dout, ld_dout > 0 ? ld_dout : OC, false, C, N, OC,
                    beta, NULL);
}

// dw (OC, C) += dout (N, OC)^T @ inp (N, C) into fp32 gradients; row strides ld_dout, ld_inp.
// Column-major: dw^T (C, OC) = inp^T (C, N) times dout (N, OC).
static void matmul_backward_weight(float* dw, const floatX* dout, const floatX* inp, int N, int C, int OC,
                                   int ld_dout = 0, int ld_inp = 0) {
    matmul_cublaslt(dw, CUDA_R_32F, C, NULL, inp, ld_inp > 0 ? ld_inp : C, false, dout, ld_dout > 0 ? ld_dout : OC,
                    true, C, OC, N, 1.0f, NULL);
}

// out (N, OC) fp32 += inp (N, C) @ w (OC, C)^T: a product kept in fp32 (SmolVLA's velocity head,
// whose output LeRobot takes in float32). Column-major as matmul_forward.
static void matmul_forward_accumulate_f32(float* out, const floatX* inp, const floatX* w, int N, int C, int OC) {
    matmul_cublaslt(out, CUDA_R_32F, OC, NULL, w, C, true, inp, C, false, OC, N, C, 1.0f, NULL);
}

// dinp (N, C) fp32 += dout (N, OC) @ w (OC, C): an input gradient added into fp32 (the expert's
// cross layers add theirs into the VLM's key/value gradients); row strides ld_dinp, ld_dout (0:
// dense). Column-major as matmul_backward_input.
static void matmul_backward_input_accumulate_f32(float* dinp, const floatX* dout, const floatX* w, int N, int C, int OC,
                                                 int ld_dinp = 0, int ld_dout = 0) {
    matmul_cublaslt(dinp, CUDA_R_32F, ld_dinp > 0 ? ld_dinp : C, NULL, w, C, false, dout, ld_dout > 0 ? ld_dout : OC,
                    false, C, N, OC, 1.0f, NULL);
}

#endif  // VLA_MATMUL_CUH
