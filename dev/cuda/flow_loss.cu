/*
flow_loss.cu: the flow-matching inputs and loss. For actions a, noise eps and a flow time t per
sample: the model's input x_t = t eps + (1 - t) a and the target velocity u = eps - a; for the
predicted velocity v, loss = sum over unmasked slots of (v - u)^2 / (B H A) (masked slots count
zero but stay in the denominator) and dv = mask * 2 / (B H A) * (v - u). (B, H, A) each.

  version 1  one thread per value: flow_inputs_kernel; flow_loss_kernel writes dv and one
             partial sum of squares per block, sum_finalize_kernel adds the partials in order in
             double on one thread, so the loss has the same bits on every run (train_vla.cu)

  make -C dev/cuda flow_loss && dev/cuda/flow_loss
*/
#include "common.h"

typedef struct {
    int B, H, A, n;
    float *actions, *eps, *t, *mask, *v;  // host copies: (B, H, A), (B, H, A), (B), (B, H), (B, H, A) rounded to floatX
    float *d_actions, *d_eps, *d_t, *d_mask;
    floatX* d_v;
} Case;

static Case make_case(int B, int H, int A, uint64_t seed) {
    Case k;
    k.B = B; k.H = H; k.A = A; k.n = B * H * A;
    k.actions = random_floats(k.n, 1.0f, seed);
    k.eps = random_floats(k.n, 1.0f, seed + 1);
    k.v = random_floats(k.n, 1.5f, seed + 2);
    k.t = random_floats(B, 0.5f, seed + 3);
    for (int b = 0; b < B; b++) { k.t[b] += 0.5f; }  // flow times in [0, 1)
    // action slots past an episode's end are masked: about a quarter at random, and the last
    // slot of every sample
    k.mask = random_floats((size_t)B * H, 1.0f, seed + 4);
    for (int s = 0; s < B * H; s++) { k.mask[s] = (k.mask[s] > -0.5f && s % H != H - 1) ? 1.0f : 0.0f; }
    k.d_actions = to_device_f(k.actions, k.n);
    k.d_eps = to_device_f(k.eps, k.n);
    k.d_t = to_device_f(k.t, B);
    k.d_mask = to_device_f(k.mask, (size_t)B * H);
    k.d_v = to_device_x(k.v, k.n);
    return k;
}

static void free_case(Case* k) {
    free(k->actions); free(k->eps); free(k->t); free(k->mask); free(k->v);
    cudaCheck(cudaFree(k->d_actions)); cudaCheck(cudaFree(k->d_eps)); cudaCheck(cudaFree(k->d_t));
    cudaCheck(cudaFree(k->d_mask)); cudaCheck(cudaFree(k->d_v));
}

// the reference, in double: x_t, u, dv (B, H, A) and the loss
static double flow_reference(const Case* k, double* x_t, double* u, double* dv) {
    double sum = 0.0;
    for (int i = 0; i < k->n; i++) {
        double t = k->t[i / (k->H * k->A)], m = k->mask[i / k->A];
        x_t[i] = t * k->eps[i] + (1.0 - t) * k->actions[i];
        u[i] = (double)k->eps[i] - k->actions[i];
        double diff = k->v[i] - u[i];
        dv[i] = m * 2.0 / k->n * diff;
        sum += m * diff * diff;
    }
    return sum / k->n;
}

// version 1, the inputs: x_t and the target
static void run_inputs(int block, const Case* k, floatX* x_t, float* target) {
    flow_inputs_kernel<<<ceil_div(k->n, block), block, 0, main_stream>>>(x_t, target, k->d_actions, k->d_eps, k->d_t, k->H * k->A, k->n);
    launchCheck();
}

// version 1, the loss: dv, partial (one per block) and the loss, from the device's target
static void run_loss(int block, const Case* k, floatX* dv, float* partial, float* loss, const float* target) {
    int blocks = ceil_div(k->n, block);
    flow_loss_kernel<<<blocks, block, 0, main_stream>>>(dv, partial, k->d_v, target, k->d_mask, k->A, k->n, 2.0f / (float)k->n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(loss, partial, blocks, 1.0 / (double)k->n, 0, 0);
    launchCheck();
}

static void check_case(const Case* k) {
    size_t n = k->n;
    double* ref_x = (double*)mallocCheck(n * sizeof(double));
    double* ref_u = (double*)mallocCheck(n * sizeof(double));
    double* ref_dv = (double*)mallocCheck(n * sizeof(double));
    double ref_loss = flow_reference(k, ref_x, ref_u, ref_dv);
    floatX *x_t, *dv;
    float *target, *partial, *loss;
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));  // at most one partial per value (block >= 1)
    cudaCheck(cudaMalloc(&loss, sizeof(float)));
    // Tolerances: x_t and dv are a few fp32 operations rounded to floatX: 1e-5 in fp32 builds,
    // 1e-2 in bf16 (8 significant bits, 2^-8 = 3.9e-3 relative at worst). The target is one
    // fp32 subtraction: 1e-5. The loss adds fp32 squares within a block (a tree of at most
    // log2(1024) = 10 additions per term, each 2^-24 relative) and the partials in double: 1e-5.
    double tol_x = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
    int blocks[4] = {32, 96, 256, 1024};  // multiples of 32 (block_sum's warps), 96 with 3 warps
    for (int bi = 0; bi < 4; bi++) {
        int block = blocks[bi];
        char what[160];
        poison(x_t, n * sizeof(floatX));
        poison(target, n * sizeof(float));
        run_inputs(block, k, x_t, target);
        float* got_x = from_device_x(x_t, n);
        float* got_u = from_device_f(target, n);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d) block %d: x_t", k->B, k->H, k->A, block);
        check_close(what, got_x, ref_x, n, tol_x);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d) block %d: target", k->B, k->H, k->A, block);
        check_close(what, got_u, ref_u, n, 1e-5);

        poison(dv, n * sizeof(floatX));
        poison(partial, n * sizeof(float));
        poison(loss, sizeof(float));
        run_loss(block, k, dv, partial, loss, target);
        float* got_dv = from_device_x(dv, n);
        float* got_loss = from_device_f(loss, 1);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d) block %d: dv", k->B, k->H, k->A, block);
        check_close(what, got_dv, ref_dv, n, tol_x);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d) block %d: loss", k->B, k->H, k->A, block);
        check_close(what, got_loss, &ref_loss, 1, 1e-5);

        // the same launch again: no atomics, so the same bits
        poison(dv, n * sizeof(floatX));
        poison(loss, sizeof(float));
        run_loss(block, k, dv, partial, loss, target);
        float* again_dv = from_device_x(dv, n);
        float* again_loss = from_device_f(loss, 1);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d) block %d: loss and dv, second run", k->B, k->H, k->A, block);
        int same = memcmp(got_loss, again_loss, sizeof(float)) == 0 && memcmp(got_dv, again_dv, n * sizeof(float)) == 0;
        char line[300];
        snprintf(line, sizeof(line), "%s: %s", what, same ? "bitwise equal" : "bits differ");
        check_true(line, same);
        free(got_x); free(got_u); free(got_dv); free(got_loss); free(again_dv); free(again_loss);
    }
    cudaCheck(cudaFree(x_t)); cudaCheck(cudaFree(dv)); cudaCheck(cudaFree(target));
    cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(loss));
    free(ref_x); free(ref_u); free(ref_dv);
}

static void benchmark(void) {
    const int B = 16, H = 50, A = 32;  // the base preset, batch 16: small enough that launches dominate
    Case k = make_case(B, H, A, 7);
    size_t n = k.n;
    floatX *x_t, *dv;
    float *target, *partial, *loss;
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));
    cudaCheck(cudaMalloc(&loss, sizeof(float)));
    run_inputs(256, &k, x_t, target);
    // bytes each step moves: actions, eps in, x_t, target out; v, target, mask in, dv, partials out
    double bytes_in = (double)n * (4 + 4 + sizeof(floatX) + 4) + B * 4;
    double bytes_loss = (double)n * (sizeof(floatX) + 4 + 4 + sizeof(floatX)) + 2.0 * ceil_div(n, 256) * 4;
    double ms = time_ms([&]() { run_inputs(256, &k, x_t, target); }, 20);
    printf("bench v1 flow inputs (B %d, H %d, A %d): %8.4f ms, %7.1f GB/s\n", B, H, A, ms, bytes_in / (ms * 1e-3) / 1e9);
    ms = time_ms([&]() { run_loss(256, &k, dv, partial, loss, target); }, 20);
    printf("bench v1 flow loss + finalize (B %d, H %d, A %d): %8.4f ms, %7.1f GB/s\n", B, H, A, ms,
           bytes_loss / (ms * 1e-3) / 1e9);
    cudaCheck(cudaFree(x_t)); cudaCheck(cudaFree(dv)); cudaCheck(cudaFree(target));
    cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(loss));
    free_case(&k);
}

int main(void) {
    dev_init("flow_loss");
    // value counts that fill no block exactly, one smaller than a warp, one over several blocks
    struct { int B, H, A; } shapes[] = { {1, 4, 3}, {3, 8, 4}, {2, 50, 7}, {5, 13, 32} };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        Case k = make_case(shapes[i].B, shapes[i].H, shapes[i].A, 100 + 10 * i);
        check_case(&k);
        free_case(&k);
    }
    return dev_finish(benchmark);
}
