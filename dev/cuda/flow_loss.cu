/*
flow_loss.cu: SmolVLA's flow-matching inputs and loss. For actions a, noise eps (B, H, Amax, the
action dims zero-padded to Amax) and a flow time t per sample: the model's input
x_t = t eps + (1 - t) a and the target velocity u = eps - a; for the predicted velocity v (fp32),
the loss is LeRobot's mean of (v - u)^2 over the valid entries (the first A dims of the chunk
slots inside the episode, action_is_pad = 0), taken over a whole optimizer step: the kernels
compute the sum and dv = 2 (v - u) on the valid entries (0 elsewhere), count the entries, and
the step's end divides (loss_normalize_kernel: loss = sum / max(1, entries), and the factor the
summed gradients are scaled by, scale_kernel).

  version 1  one thread per value: flow_inputs_kernel; smolvla_loss_kernel writes dv and one
             partial sum of squares per block, sum_finalize_kernel adds the partials in order in
             double on one thread, so the loss has the same bits on every run; valid_entries_kernel
             counts in one block (train_vla.cu)

  make -C dev/cuda flow_loss && dev/cuda/flow_loss
*/
#include "common.h"

typedef struct {
    int B, H, A, Amax, n;
    float *actions, *eps, *t, *pad, *v;  // host copies: (B, H, Amax) x2, (B), (B, H), (B, H, Amax)
    float *d_actions, *d_eps, *d_t, *d_pad, *d_v;
} Case;

static Case make_case(int B, int H, int A, int Amax, uint64_t seed) {
    Case k;
    k.B = B; k.H = H; k.A = A; k.Amax = Amax; k.n = B * H * Amax;
    k.actions = random_floats(k.n, 1.0f, seed);
    k.eps = random_floats(k.n, 1.0f, seed + 1);
    k.v = random_floats(k.n, 1.5f, seed + 2);
    k.t = random_floats(B, 0.5f, seed + 3);
    for (int b = 0; b < B; b++) { k.t[b] += 0.5f; }  // flow times in [0, 1)
    // chunk slots past an episode's end are pads: about a quarter at random, and the last slot of
    // every sample; the actions' padded dims are zero
    k.pad = random_floats((size_t)B * H, 1.0f, seed + 4);
    for (int s = 0; s < B * H; s++) { k.pad[s] = (k.pad[s] > -0.5f && s % H != H - 1) ? 0.0f : 1.0f; }
    for (int i = 0; i < k.n; i++) { if (i % Amax >= A) { k.actions[i] = 0.0f; } }
    k.d_actions = to_device_f(k.actions, k.n);
    k.d_eps = to_device_f(k.eps, k.n);
    k.d_t = to_device_f(k.t, B);
    k.d_pad = to_device_f(k.pad, (size_t)B * H);
    k.d_v = to_device_f(k.v, k.n);
    return k;
}

static void free_case(Case* k) {
    free(k->actions); free(k->eps); free(k->t); free(k->pad); free(k->v);
    cudaCheck(cudaFree(k->d_actions)); cudaCheck(cudaFree(k->d_eps)); cudaCheck(cudaFree(k->d_t));
    cudaCheck(cudaFree(k->d_pad)); cudaCheck(cudaFree(k->d_v));
}

// the reference, in double: x_t, u, dv (B, H, Amax), the sum of squares and the valid entries
static double flow_reference(const Case* k, double* x_t, double* u, double* dv, double* entries) {
    double sum = 0.0;
    *entries = 0.0;
    for (int i = 0; i < k->n; i++) {
        double t = k->t[i / (k->H * k->Amax)];
        double m = (i % k->Amax < k->A && k->pad[i / k->Amax] == 0.0f) ? 1.0 : 0.0;
        x_t[i] = t * k->eps[i] + (1.0 - t) * k->actions[i];
        u[i] = (double)k->eps[i] - k->actions[i];
        double diff = k->v[i] - u[i];
        dv[i] = m * 2.0 * diff;
        sum += m * diff * diff;
        *entries += m;
    }
    return sum;
}

// version 1, the inputs: x_t and the target
static void run_inputs(int block, const Case* k, floatX* x_t, float* target) {
    flow_inputs_kernel<<<ceil_div(k->n, block), block, 0, main_stream>>>(x_t, target, k->d_actions, k->d_eps, k->d_t,
                                                                         k->H * k->Amax, k->n);
    launchCheck();
}

// version 1, the loss: dv, partial (one per block), the sum into scalars[0] and the valid entries
// into scalars[3], then the mean (scalars[0]) and its factor (scalars[4]), from the device's target
static void run_loss(int block, const Case* k, floatX* dv, float* partial, float* scalars, const float* target) {
    int blocks = ceil_div(k->n, block);
    smolvla_loss_kernel<<<blocks, block, 0, main_stream>>>(dv, partial, k->d_v, target, k->d_pad, k->A, k->Amax, k->n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(scalars, partial, blocks, 1.0, 0, 0);
    launchCheck();
    valid_entries_kernel<<<1, block, 0, main_stream>>>(scalars + 3, k->d_pad, k->B * k->H, k->A, 0);
    launchCheck();
    loss_normalize_kernel<<<1, 1, 0, main_stream>>>(scalars);
    launchCheck();
}

static void check_case(const Case* k) {
    size_t n = k->n;
    double* ref_x = (double*)mallocCheck(n * sizeof(double));
    double* ref_u = (double*)mallocCheck(n * sizeof(double));
    double* ref_dv = (double*)mallocCheck(n * sizeof(double));
    double entries, ref_sum = flow_reference(k, ref_x, ref_u, ref_dv, &entries);
    double ref_loss = ref_sum / (entries > 1.0 ? entries : 1.0);
    floatX *x_t, *dv;
    float *target, *partial, *loss;  // loss: the 8 scalars of the trainer
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));  // at most one partial per value (block >= 1)
    cudaCheck(cudaMalloc(&loss, 8 * sizeof(float)));
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
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: x_t", k->B, k->H, k->A, k->Amax, block);
        check_close(what, got_x, ref_x, n, tol_x);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: target", k->B, k->H, k->A, k->Amax, block);
        check_close(what, got_u, ref_u, n, 1e-5);

        poison(dv, n * sizeof(floatX));
        poison(partial, n * sizeof(float));
        poison(loss, 8 * sizeof(float));
        run_loss(block, k, dv, partial, loss, target);
        float* got_dv = from_device_x(dv, n);
        float* got_loss = from_device_f(loss, 8);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: dv", k->B, k->H, k->A, k->Amax, block);
        check_close(what, got_dv, ref_dv, n, tol_x);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: loss", k->B, k->H, k->A, k->Amax, block);
        check_close(what, got_loss, &ref_loss, 1, 1e-5);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: valid entries %.0f and their inverse", k->B,
                 k->H, k->A, k->Amax, block, entries);
        double ref_inv = 1.0 / (entries > 1.0 ? entries : 1.0);
        check_true(what, got_loss[3] == (float)entries && fabs(got_loss[4] - ref_inv) <= 1e-6 * ref_inv);
        // the summed gradients scaled to the mean's: scale_kernel by scalars[4]
        float* d_g = to_device_f(k->v, n);
        scale_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(d_g, n, loss + 4);
        launchCheck();
        float* got_g = from_device_f(d_g, n);
        double* ref_g = (double*)mallocCheck(n * sizeof(double));
        for (size_t i = 0; i < n; i++) { ref_g[i] = k->v[i] * ref_inv; }
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: gradients scaled", k->B, k->H, k->A, k->Amax, block);
        check_close(what, got_g, ref_g, n, 1e-6);
        cudaCheck(cudaFree(d_g));
        free(got_g); free(ref_g);

        // the same launch again: no atomics, so the same bits
        poison(dv, n * sizeof(floatX));
        poison(loss, 8 * sizeof(float));
        run_loss(block, k, dv, partial, loss, target);
        float* again_dv = from_device_x(dv, n);
        float* again_loss = from_device_f(loss, 8);
        snprintf(what, sizeof(what), "v1 (B %d, H %d, A %d of %d) block %d: loss and dv, second run", k->B, k->H, k->A, k->Amax, block);
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
    const int B = 32, H = 50, A = 6, Amax = 32;  // the smolvla preset, batch 32: small enough that launches dominate
    Case k = make_case(B, H, A, Amax, 7);
    size_t n = k.n;
    floatX *x_t, *dv;
    float *target, *partial, *loss;
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));
    cudaCheck(cudaMalloc(&loss, 8 * sizeof(float)));
    run_inputs(256, &k, x_t, target);
    // bytes each step moves: actions, eps in, x_t, target out; v, target, mask in, dv, partials out
    double bytes_in = (double)n * (4 + 4 + sizeof(floatX) + 4) + B * 4;
    double bytes_loss = (double)n * (4 + 4 + 4 + sizeof(floatX)) + 2.0 * ceil_div(n, 256) * 4;
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
    // value counts that fill no block exactly, one smaller than a warp, one over several blocks;
    // padded action dims (A < Amax) and none
    struct { int B, H, A, Amax; } shapes[] = { {1, 4, 3, 3}, {3, 8, 4, 32}, {2, 50, 7, 32}, {5, 13, 32, 32} };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        Case k = make_case(shapes[i].B, shapes[i].H, shapes[i].A, shapes[i].Amax, 100 + 10 * i);
        check_case(&k);
        free_case(&k);
    }
    return dev_finish(benchmark);
}
