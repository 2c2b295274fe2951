/*
adamw.cu: the optimizer step: the global gradient norm, then AdamW on the fp32 master weights
(vla/cuda/adamw.cuh).

  global norm, version 1  (this program's) one block: its threads' grid-stride sums of squares,
                          block_sum, the square root on thread 0 (global_norm_kernel1); one
                          multiprocessor reads every gradient
               version 2  two fixed-order stages over NORM_BLOCKS blocks, the header's:
                          norm_squares_kernel (grid-stride sums of squares, block_sum per block)
                          then sum_finalize_kernel (one thread adds the block sums in order, in
                          double, and takes the square root), as the trainer launches them
  AdamW,       version 1  (this program's) two passes: the moments (adamw_moments_kernel1), then
                          the weights and their floatX copy from the moments read back
                          (adamw_weights_kernel1)
               version 2  one pass, one thread per parameter (the header's adamw_kernel): AdamW
                          (0.9, 0.95, 1e-8) with decoupled weight decay, the gradient scaled by
                          clip / norm when the norm (read on the device) exceeds clip, a non-finite
                          norm skipping the step, the floatX compute copy written alongside

  nvcc -O3 -std=c++17 -arch=sm_90 adamw.cu -o adamw && ./adamw
*/
#include "common.h"
#include "../../vla/cuda/adamw.cuh"

static const float BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f;  // the trainers' (flow_update)

static double norm_reference(const float* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)g[i] * g[i]; }
    return sqrt(s);
}

// ----------------------------------------------------------------------------
// version 1: the global norm in one block; AdamW in two passes

// *norm = sqrt(sum of g^2), one block: each thread's grid-stride sum of squares, then block_sum
__global__ void global_norm_kernel1(float* norm, const float* g, size_t n) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) { s += g[i] * g[i]; }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) { *norm = sqrtf(s); }
}

// m, v (n) = the moments after the gradient, clipped to norm `clip`; a non-finite norm: no-op
__global__ void adamw_moments_kernel1(float* m, float* v, const float* grads, size_t n, float beta1, float beta2,
                                      const float* grad_norm, float clip) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !isfinite(*grad_norm)) { return; }
    float norm = *grad_norm, scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    float g = grads[i] * scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
}

// master (n) -= lr (m / bc1 / (sqrt(v / bc2) + eps) + decay master), the moments read back; params =
// floatX(master); a non-finite norm: no-op
__global__ void adamw_weights_kernel1(float* master, floatX* params, const float* m, const float* v, size_t n, float lr,
                                      float eps, float weight_decay, float bc1, float bc2, const float* grad_norm) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !isfinite(*grad_norm)) { return; }
    float p = master[i];
    p -= lr * ((m[i] / bc1) / (sqrtf(v[i] / bc2) + eps) + weight_decay * p);
    master[i] = p;
    params[i] = fx(p);
}

// ----------------------------------------------------------------------------
// launchers: version v at `block` threads a block (version 2 at NORM_BLOCKS and BLOCK is the trainer's
// launch); partial: NORM_BLOCKS floats of scratch

// the global norm of g (n) into *norm (device); version 2 at `grid` blocks
static void global_norm(int version, float* norm, float* partial, const float* g, size_t n, int grid, int block) {
    if (version == 1) {
        global_norm_kernel1<<<1, block, 0, main_stream>>>(norm, g, n);
        launchCheck();
        return;
    }
    norm_squares_kernel<<<grid, block, 0, main_stream>>>(partial, g, n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(norm, partial, grid, 1.0, 1, 0);
    launchCheck();
}

static void adamw(int version, int block, float* master, floatX* params, const float* grads, float* m, float* v,
                  size_t n, float lr, float weight_decay, float bc1, float bc2, const float* grad_norm, float clip) {
    if (version == 1) {
        adamw_moments_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(m, v, grads, n, BETA1, BETA2, grad_norm,
                                                                             clip);
        launchCheck();
        adamw_weights_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(master, params, m, v, n, lr, EPS,
                                                                             weight_decay, bc1, bc2, grad_norm);
    } else {
        adamw_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(master, params, grads, m, v, n, lr, BETA1, BETA2,
                                                                    EPS, weight_decay, bc1, bc2, grad_norm, clip);
    }
    launchCheck();
}

// ----------------------------------------------------------------------------
// checks

static void check_norm(size_t n, uint64_t seed) {
    float* g = random_floats(n, 1e-2f, seed);
    float* d_g = to_device_f(g, n);
    double ref = norm_reference(g, n);
    float *norm, *partial;
    cudaCheck(cudaMalloc(&norm, sizeof(float)));
    cudaCheck(cudaMalloc(&partial, NORM_BLOCKS * sizeof(float)));
    // version 1 and version 2 at the trainer's grid at several block sizes, then version 2 at a small
    // grid: the grid-stride loops must cover every element whatever the grid
    int blocks[4] = {32, 128, 256, 1024};
    for (int version = 1; version <= 3; version++) {
        for (int bi = 0; bi < (version < 3 ? 4 : 1); bi++) {
            int block = version < 3 ? blocks[bi] : BLOCK, grid = version < 3 ? NORM_BLOCKS : 3;
            poison(norm, sizeof(float));
            poison(partial, NORM_BLOCKS * sizeof(float));
            global_norm(version < 3 ? version : 2, norm, partial, d_g, n, grid, block);
            float* got = from_device_f(norm, 1);
            char what[200];
            snprintf(what, sizeof(what), "v%d global norm (n %zu) grid %d block %d", version < 3 ? version : 2, n,
                     version == 1 ? 1 : grid, block);
            // fp32 sums of squares (non-negative terms: no cancellation), each thread's of n / threads
            // terms in turn, each rounding at most 2^-24 of its sum so far (halved by the square
            // root), then the block's tree and, for version 2, the blocks' sum in double
            double terms = ceil((double)n / (version == 1 ? block : (double)grid * block));
            check_close(what, got, &ref, 1, 1e-5 + 0.5 * terms * ldexp(1.0, -24));
            free(got);
        }
    }
    free(g);
    cudaCheck(cudaFree(d_g)); cudaCheck(cudaFree(norm)); cudaCheck(cudaFree(partial));
}

// ---- AdamW

typedef struct {
    size_t n;
    int step;           // 0: the first step, moments start at zero
    float clip_ratio;   // clip = ratio * the gradient norm: < 1 clips, > 1 does not, 0 disables clipping
    float weight_decay;
} AdamCase;

typedef struct {
    float *master, *grads, *m, *v;  // host: the state before the step
    float *d_master, *d_grads, *d_m, *d_v, *d_norm, *d_partial;
    floatX* d_params;
    double norm;  // of grads, in double
} AdamState;

static AdamState adam_state(const AdamCase* k, uint64_t seed) {
    AdamState s;
    size_t n = k->n;
    s.master = random_floats(n, 0.1f, seed);
    s.grads = random_floats(n, 1e-2f, seed + 1);
    s.m = random_floats(n, 1e-2f, seed + 2);
    s.v = random_floats(n, 1e-4f, seed + 3);
    for (size_t i = 0; i < n; i++) {
        s.v[i] = fabsf(s.v[i]);  // a second moment is non-negative
        if (k->step == 0) { s.m[i] = 0.0f; s.v[i] = 0.0f; }
    }
    s.norm = norm_reference(s.grads, n);
    s.d_master = to_device_f(s.master, n);
    s.d_grads = to_device_f(s.grads, n);
    s.d_m = to_device_f(s.m, n);
    s.d_v = to_device_f(s.v, n);
    cudaCheck(cudaMalloc(&s.d_params, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&s.d_norm, sizeof(float)));
    cudaCheck(cudaMalloc(&s.d_partial, NORM_BLOCKS * sizeof(float)));
    return s;
}

static void adam_state_free(AdamState* s) {
    free(s->master); free(s->grads); free(s->m); free(s->v);
    cudaCheck(cudaFree(s->d_master)); cudaCheck(cudaFree(s->d_grads)); cudaCheck(cudaFree(s->d_m));
    cudaCheck(cudaFree(s->d_v)); cudaCheck(cudaFree(s->d_params)); cudaCheck(cudaFree(s->d_norm));
    cudaCheck(cudaFree(s->d_partial));
}

// back to the state before the step, the outputs poisoned
static void adam_reset(const AdamState* s, size_t n) {
    cudaCheck(cudaMemcpy(s->d_master, s->master, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(s->d_m, s->m, n * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(s->d_v, s->v, n * sizeof(float), cudaMemcpyHostToDevice));
    poison(s->d_params, n * sizeof(floatX));
    poison(s->d_norm, sizeof(float));
}

// the trainers' bias corrections, in float as they compute them
static void bias_corrections(int step, float* bc1, float* bc2) {
    *bc1 = 1.0f - powf(BETA1, (float)(step + 1));
    *bc2 = 1.0f - powf(BETA2, (float)(step + 1));
}

// the whole step as flow_update runs it: the norm (version 2, the trainer's launch), then AdamW's
// version at `block`
static void adam_step(int version, const AdamState* s, size_t n, float lr, float weight_decay, float clip, int step,
                      int block) {
    float bc1, bc2;
    bias_corrections(step, &bc1, &bc2);
    global_norm(2, s->d_norm, s->d_partial, s->d_grads, n, NORM_BLOCKS, BLOCK);
    adamw(version, block, s->d_master, s->d_params, s->d_grads, s->d_m, s->d_v, n, lr, weight_decay, bc1, bc2,
          s->d_norm, clip);
}

// train_vla.c's adamw_range in double (from the same float constants)
static void adam_reference(double* master, double* m, double* v, const AdamState* s, size_t n, double lr,
                           double weight_decay, double clip, int step) {
    double b1 = BETA1, b2 = BETA2, scale = (clip > 0.0 && s->norm > clip) ? clip / s->norm : 1.0;
    double bc1 = 1.0 - pow(b1, step + 1), bc2 = 1.0 - pow(b2, step + 1);
    for (size_t i = 0; i < n; i++) {
        double g = s->grads[i] * scale, p = s->master[i];
        m[i] = b1 * s->m[i] + (1.0 - b1) * g;
        v[i] = b2 * s->v[i] + (1.0 - b2) * g * g;
        master[i] = p - lr * ((m[i] / bc1) / (sqrt(v[i] / bc2) + (double)EPS) + weight_decay * p);
    }
}

static void check_adamw(const AdamCase* k, uint64_t seed) {
    size_t n = k->n;
    const float lr = 1e-2f;  // updates of about lr against weights of 0.1: the update check below sees them whole
    AdamState s = adam_state(k, seed);
    float clip = (float)(k->clip_ratio * s.norm);
    double* ref_master = (double*)mallocCheck(n * sizeof(double));
    double* ref_m = (double*)mallocCheck(n * sizeof(double));
    double* ref_v = (double*)mallocCheck(n * sizeof(double));
    double* ref_update = (double*)mallocCheck(n * sizeof(double));
    adam_reference(ref_master, ref_m, ref_v, &s, n, lr, k->weight_decay, clip, k->step);
    for (size_t i = 0; i < n; i++) { ref_update[i] = ref_master[i] - s.master[i]; }
    float* update = (float*)mallocCheck(n * sizeof(float));
    float* params_want = (float*)mallocCheck(n * sizeof(float));
    int blocks[4] = {32, 64, 256, 1024};
    for (int vb = 0; vb < 8; vb++) {
        int version = 1 + vb / 4, block = blocks[vb % 4];
        adam_reset(&s, n);
        adam_step(version, &s, n, lr, k->weight_decay, clip, k->step, block);
        float* master = from_device_f(s.d_master, n);
        float* m = from_device_f(s.d_m, n);
        float* v = from_device_f(s.d_v, n);
        float* params = from_device_x(s.d_params, n);
        for (size_t i = 0; i < n; i++) {
            update[i] = (float)((double)master[i] - s.master[i]);
            params_want[i] = round_x(master[i]);
        }
        char what[300], head[200];
        snprintf(head, sizeof(head), "v%d adamw (n %zu, step %d, clip %s, decay %g) block %d", version, n, k->step,
                 k->clip_ratio == 0.0f ? "off" : k->clip_ratio < 1.0f ? "active" : "inactive", k->weight_decay, block);
        // fp32 arithmetic throughout: a few roundings of 2^-24 per value
        snprintf(what, sizeof(what), "%s: master", head);
        check_close(what, master, ref_master, n, 1e-5);
        // the step itself (about lr), where an error would hide under the weights' size: fp32
        // roundings of the update, plus the rounding of the new weight (2^-24 * 0.1, small next to lr)
        snprintf(what, sizeof(what), "%s: master - old", head);
        check_close(what, update, ref_update, n, 1e-5);
        snprintf(what, sizeof(what), "%s: m", head);
        check_close(what, m, ref_m, n, 1e-5);
        snprintf(what, sizeof(what), "%s: v", head);
        check_close(what, v, ref_v, n, 1e-5);
        // the compute copy: floatX of the new weights (bf16 keeps 8 bits: 2^-8 relative)
        snprintf(what, sizeof(what), "%s: params", head);
        check_close(what, params, ref_master, n, sizeof(floatX) == 4 ? 1e-5 : 1e-2);
        snprintf(what, sizeof(what), "%s: params == floatX(master)", head);
        check_exact(what, params, params_want, n);
        free(master); free(m); free(v); free(params);
    }
    free(ref_master); free(ref_m); free(ref_v); free(ref_update); free(update); free(params_want);
    adam_state_free(&s);
}

// Every reduction runs in a fixed order: the same step twice gives the same bits.
static void check_determinism(int version, size_t n) {
    AdamCase k = {n, 7, 0.5f, 0.1f};
    AdamState s = adam_state(&k, 77);
    float clip = (float)(0.5 * s.norm);
    float* out[2][5];
    for (int run = 0; run < 2; run++) {
        adam_reset(&s, n);
        adam_step(version, &s, n, 1e-2f, 0.1f, clip, 7, BLOCK);
        out[run][0] = from_device_f(s.d_norm, 1);
        out[run][1] = from_device_f(s.d_master, n);
        out[run][2] = from_device_f(s.d_m, n);
        out[run][3] = from_device_f(s.d_v, n);
        out[run][4] = from_device_x(s.d_params, n);
    }
    const char* names[5] = {"norm", "master", "m", "v", "params"};
    for (int j = 0; j < 5; j++) {
        size_t len = j == 0 ? 1 : n;
        char what[200];
        snprintf(what, sizeof(what), "v%d determinism (n %zu): %s the same bits twice", version, n, names[j]);
        check_true(what, memcmp(out[0][j], out[1][j], len * sizeof(float)) == 0);
        free(out[0][j]); free(out[1][j]);
    }
    adam_state_free(&s);
}

// A gradient holding an Inf or a NaN (an overflow) makes the norm non-finite: the step changes
// nothing, the floatX copy included (it keeps its poison).
static void check_nonfinite(int version, float bad) {
    const size_t n = 1000;
    AdamCase k = {n, 3, 0.5f, 0.1f};
    AdamState s = adam_state(&k, 88);
    s.grads[n / 2] = bad;
    cudaCheck(cudaMemcpy(s.d_grads, s.grads, n * sizeof(float), cudaMemcpyHostToDevice));
    adam_reset(&s, n);
    adam_step(version, &s, n, 1e-2f, 0.1f, 1.0f, 3, BLOCK);
    float* norm = from_device_f(s.d_norm, 1);
    float* master = from_device_f(s.d_master, n);
    float* m = from_device_f(s.d_m, n);
    float* v = from_device_f(s.d_v, n);
    uint8_t* params = (uint8_t*)mallocCheck(n * sizeof(floatX));
    cudaCheck(cudaMemcpy(params, s.d_params, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    size_t written = 0;
    for (size_t i = 0; i < n * sizeof(floatX); i++) { written += params[i] != 0xFF; }
    char what[200], head[100];
    snprintf(head, sizeof(head), "v%d adamw with a gradient of %g (n %zu)", version, bad, n);
    snprintf(what, sizeof(what), "%s: the norm is not finite", head);
    check_true(what, !isfinite(norm[0]));
    snprintf(what, sizeof(what), "%s: master", head);
    check_exact(what, master, s.master, n);
    snprintf(what, sizeof(what), "%s: m", head);
    check_exact(what, m, s.m, n);
    snprintf(what, sizeof(what), "%s: v", head);
    check_exact(what, v, s.v, n);
    snprintf(what, sizeof(what), "%s: params untouched (%zu bytes written)", head, written);
    check_true(what, written == 0);
    free(norm); free(master); free(m); free(v); free(params);
    adam_state_free(&s);
}

// ---- benchmark: 64M parameters (the base preset has about 300M; bandwidth is what matters)

static void benchmark(void) {
    const size_t n = (size_t)64 << 20;
    AdamCase k = {n, 3, 0.5f, 0.1f};
    AdamState s = adam_state(&k, 999);
    float clip = (float)(0.5 * s.norm);
    for (int version = 1; version <= 2; version++) {
        for (int block = 256; block <= 1024; block *= 2) {
            double ms = time_ms(
                [&]() { global_norm(version, s.d_norm, s.d_partial, s.d_grads, n, NORM_BLOCKS, block); }, 20);
            printf("bench v%d global norm (n %zu) grid %3d block %4d: %8.3f ms, %7.1f GB/s\n", version, n,
                   version == 1 ? 1 : NORM_BLOCKS, block, ms, (double)n * sizeof(float) / (ms * 1e-3) / 1e9);
        }
    }
    float bc1, bc2;
    bias_corrections(3, &bc1, &bc2);
    // what a step must move: read master, grad, m, v; write master, m, v and the floatX copy (version
    // 1 moves m and v twice more, which its time shows against the same bytes)
    double bytes = (double)n * (7 * sizeof(float) + sizeof(floatX));
    for (int version = 1; version <= 2; version++) {
        for (int block = 128; block <= 1024; block *= 2) {
            double ms = time_ms([&]() {
                adamw(version, block, s.d_master, s.d_params, s.d_grads, s.d_m, s.d_v, n, 1e-4f, 0.1f, bc1, bc2,
                      s.d_norm, clip);
            }, 20);
            printf("bench v%d adamw (n %zu) block %4d: %8.3f ms, %7.1f GB/s\n", version, n, block, ms,
                   bytes / (ms * 1e-3) / 1e9);
        }
    }
    adam_state_free(&s);
}

int main(void) {
    dev_init("adamw");
    size_t norm_sizes[4] = {1, 1000, 65539, 300000};
    for (int i = 0; i < 4; i++) { check_norm(norm_sizes[i], 10 + i); }
    // first and later steps; clipping active, inactive and off; decay on and off; odd sizes
    AdamCase cases[] = {
        {4099, 0, 0.5f, 0.1f},
        {4099, 9, 2.0f, 0.0f},
        {1000, 3, 0.0f, 0.1f},
        {1000, 3, 0.25f, 0.0f},
        {1, 0, 0.5f, 0.1f},
        {257, 20, 4.0f, 0.1f},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) { check_adamw(&cases[i], 100 + 10 * i); }
    for (int version = 1; version <= 2; version++) {
        check_determinism(version, 100003);
        check_nonfinite(version, INFINITY);
        check_nonfinite(version, NAN);
    }
    return dev_finish(benchmark);
}
