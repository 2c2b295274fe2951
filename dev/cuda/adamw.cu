/*
adamw.cu: the optimizer step: the global gradient norm, then AdamW on the fp32 master weights.

  version 1  global norm in two fixed-order stages: norm_squares_kernel (a fixed grid of
             NORM_BLOCKS blocks, grid-stride sums of squares, then block_sum) and
             sum_finalize_kernel (one thread adds the block sums in order, in double, and takes
             the square root); adamw_kernel: one thread per parameter, AdamW (0.9, 0.95, 1e-8)
             with decoupled weight decay, the gradient scaled by clip / norm when the norm (read on
             the device) exceeds clip, the floatX compute copy written alongside

  make -C dev/cuda adamw && dev/cuda/adamw
*/
#include "common.h"

static const float BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f;  // model_update's

static double norm_reference(const float* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)g[i] * g[i]; }
    return sqrt(s);
}

// the global norm of g (n) into *norm (device): the two kernels of global_norm at a given grid and block
static void global_norm_kernels(float* norm, float* partial, const float* g, size_t n, int grid, int block) {
    norm_squares_kernel<<<grid, block, 0, main_stream>>>(partial, g, n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(norm, partial, grid, 1.0, 1, 0);
    launchCheck();
}

static void check_norm(size_t n, uint64_t seed) {
    float* g = random_floats(n, 1e-2f, seed);
    float* d_g = to_device_f(g, n);
    double ref = norm_reference(g, n);
    float *norm, *partial;
    cudaCheck(cudaMalloc(&norm, sizeof(float)));
    cudaCheck(cudaMalloc(&partial, NORM_BLOCKS * sizeof(float)));
    // the trainer's grid at several block sizes, and a small grid: the grid-stride loop must cover
    // every element whatever the grid
    int grids[2] = {NORM_BLOCKS, 3}, blocks[4] = {32, 128, 256, 1024};
    for (int gi = 0; gi < 2; gi++) {
        for (int bi = 0; bi < (gi == 0 ? 4 : 1); bi++) {
            int block = gi == 0 ? blocks[bi] : BLOCK;
            poison(norm, sizeof(float));
            poison(partial, NORM_BLOCKS * sizeof(float));
            global_norm_kernels(norm, partial, d_g, n, grids[gi], block);
            float* got = from_device_f(norm, 1);
            char what[200];
            snprintf(what, sizeof(what), "v1 global norm (n %zu) grid %d block %d", n, grids[gi], block);
            // fp32 sums of squares (non-negative terms: no cancellation), finished in double
            check_close(what, got, &ref, 1, 1e-5);
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

// model_update's bias corrections, in float as it computes them
static void bias_corrections(int step, float* bc1, float* bc2) {
    *bc1 = 1.0f - powf(BETA1, (float)(step + 1));
    *bc2 = 1.0f - powf(BETA2, (float)(step + 1));
}

// the whole step as model_update runs it (global_norm's kernels, then adamw_kernel at `block`)
static void adam_step(const AdamState* s, size_t n, float lr, float weight_decay, float clip, int step, int block) {
    float bc1, bc2;
    bias_corrections(step, &bc1, &bc2);
    global_norm_kernels(s->d_norm, s->d_partial, s->d_grads, n, NORM_BLOCKS, BLOCK);
    adamw_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(s->d_master, s->d_params, s->d_grads, s->d_m, s->d_v, n, lr,
                                                               BETA1, BETA2, EPS, weight_decay, bc1, bc2, s->d_norm, clip);
    launchCheck();
}

// train_vla.c's model_update in double (from the same float constants)
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
    for (int bi = 0; bi < 4; bi++) {
        adam_reset(&s, n);
        adam_step(&s, n, lr, k->weight_decay, clip, k->step, blocks[bi]);
        float* master = from_device_f(s.d_master, n);
        float* m = from_device_f(s.d_m, n);
        float* v = from_device_f(s.d_v, n);
        float* params = from_device_x(s.d_params, n);
        for (size_t i = 0; i < n; i++) {
            update[i] = (float)((double)master[i] - s.master[i]);
            params_want[i] = round_x(master[i]);
        }
        char what[300], head[200];
        snprintf(head, sizeof(head), "v1 adamw (n %zu, step %d, clip %s, decay %g) block %d", n, k->step,
                 k->clip_ratio == 0.0f ? "off" : k->clip_ratio < 1.0f ? "active" : "inactive", k->weight_decay, blocks[bi]);
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
static void check_determinism(size_t n) {
    AdamCase k = {n, 7, 0.5f, 0.1f};
    AdamState s = adam_state(&k, 77);
    float clip = (float)(0.5 * s.norm);
    float* out[2][5];
    for (int run = 0; run < 2; run++) {
        adam_reset(&s, n);
        adam_step(&s, n, 1e-2f, 0.1f, clip, 7, BLOCK);
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
        snprintf(what, sizeof(what), "v1 determinism (n %zu): %s the same bits twice", n, names[j]);
        check_true(what, memcmp(out[0][j], out[1][j], len * sizeof(float)) == 0);
        free(out[0][j]); free(out[1][j]);
    }
    adam_state_free(&s);
}

// ---- benchmark: 64M parameters (the base preset has about 300M; bandwidth is what matters)

static void benchmark(void) {
    const size_t n = (size_t)64 << 20;
    AdamCase k = {n, 3, 0.5f, 0.1f};
    AdamState s = adam_state(&k, 999);
    float clip = (float)(0.5 * s.norm);
    double ms = time_ms([&]() { global_norm_kernels(s.d_norm, s.d_partial, s.d_grads, n, NORM_BLOCKS, BLOCK); }, 20);
    printf("bench v1 global norm (n %zu): %8.3f ms, %7.1f GB/s\n", n, ms, (double)n * sizeof(float) / (ms * 1e-3) / 1e9);
    float bc1, bc2;
    bias_corrections(3, &bc1, &bc2);
    ms = time_ms([&]() {
        adamw_kernel<<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(s.d_master, s.d_params, s.d_grads, s.d_m, s.d_v, n, 1e-4f,
                                                                   BETA1, BETA2, EPS, 0.1f, bc1, bc2, s.d_norm, clip);
        launchCheck();
    }, 20);
    // read master, grad, m, v; write master, m, v and the floatX copy
    double bytes = (double)n * (7 * sizeof(float) + sizeof(floatX));
    printf("bench v1 adamw (n %zu): %8.3f ms, %7.1f GB/s\n", n, ms, bytes / (ms * 1e-3) / 1e9);
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
    check_determinism(100003);
    return dev_finish(benchmark);
}
