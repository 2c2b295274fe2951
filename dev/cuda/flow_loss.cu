/*
flow_loss.cu: the flow-matching objective. For actions a, noise eps (B, H, Amax, the action dims
zero-padded to Amax) and a flow time t per sample: the model's input x_t = t eps + (1 - t) a and
the target velocity u = eps - a; for the predicted velocity v (fp32), the loss is LeRobot's mean of
(v - u)^2 over the valid entries, taken over a whole optimizer step. The valid entries are the
first A dims of the chunk slots inside the episode (action_is_pad = 0) in SmolVLA, of every slot in
pi0 (action_is_pad NULL). The kernels compute the sum and dv = 2 (v - u) on the valid entries (0
elsewhere) and count the entries, each micro-step adding to the step's; the step's end divides
(loss_normalize_kernel: loss = sum / max(1, entries), and the factor the summed gradients are
scaled by, scale_kernel). With --balance tasks, each sample's squared errors and entries (over its
slots inside the episode, in both families: the trainer passes action_is_pad there) are added to
its task's. Sampling's Euler step: x (fp32) += dt v, and x's floatX copy.

  inputs     version 1 (this program's): two kernels, x_t and the target apart (eps and a read
             twice), one thread per value (flow_xt_kernel1, flow_target_kernel1);
             version 2: one kernel for both (flow_inputs_kernel)
  loss       version 1 (this program's): one block strides over every value, writing dv and
             summing the squares in the block into the sum (flow_loss_kernel1); the entries
             counted on one thread (valid_entries_kernel1);
             version 2: one thread per value, one partial sum of squares per block, the partials
             added in order in double on one thread, so the loss has the same bits on every run
             (flow_loss_kernel, then sum_finalize_kernel of vla/cuda/adamw.cuh); the entries
             counted by one block (valid_entries_kernel)
  step's end version 1: loss_normalize_kernel, then scale_kernel (vla/cuda/copy.cuh) over the gradients
  per task   version 1 (this program's): one thread per sample over its H A entries
             (sample_loss_kernel1); version 2: one block per sample (sample_loss_kernel); then, in
             both, one thread per task adding its samples' sums in sample order (task_loss_add_kernel)
  Euler step version 1: one thread per value (euler_step_f32_kernel)
  The last version of each is the trainer's (vla/cuda/flow_loss.cuh); the benchmark launches it as
  the trainer does, with BLOCK threads; the checks at blocks of 32 to 1024.

  nvcc -O3 -std=c++17 -arch=sm_90 flow_loss.cu -o flow_loss && ./flow_loss
*/
#include "common.h"
#include "../../vla/cuda/flow_loss.cuh"
#include "../../vla/cuda/adamw.cuh"
#include "../../vla/cuda/copy.cuh"

// Tolerances: x_t and dv are a few fp32 operations rounded to floatX: 1e-5 in fp32 builds, 1e-2
// in bf16 (8 significant bits, 2^-8 = 3.9e-3 relative at worst). The target and the Euler step's
// fp32 x are one or two fp32 operations: 1e-6. The loss and the per-sample sums add fp32 squares
// (all positive: a tree of at most 10 additions per term in a block, or a thread's run of up to a
// few thousand, sqrt(n) 2^-24 typically), the partials in double: 1e-5. Counts are exact.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-6;
static const double TOL_SUM = 1e-5;
static const int BLOCKS[] = {32, 96, 256, 1024};  // multiples of 32 (block_sum's warps), 96 with 3 warps
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int N_VERSIONS = 2;

// ----------------------------------------------------------------------------
// version 1

// x_t = t eps + (1 - t) a: one thread per value
__global__ void flow_xt_kernel1(floatX* x_t, const float* actions, const float* eps, const float* t, int HA, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float tb = t[i / HA];
    x_t[i] = fx(tb * eps[i] + (1.0f - tb) * actions[i]);
}

// u = eps - a: one thread per value
__global__ void flow_target_kernel1(float* target, const float* actions, const float* eps, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { target[i] = eps[i] - actions[i]; }
}

// The loss in one block: the threads stride over the n values writing dv = 2 (v - u) on the valid
// entries (0 elsewhere); their squares summed in the block into *sum (added to when `accumulate`)
__global__ void flow_loss_kernel1(floatX* dv, float* sum, const float* v, const float* target,
                                  const float* action_is_pad, int A, int Amax, int n, int accumulate) {
    __shared__ float shared[32];
    float sq = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float mask = (i % Amax < A && (action_is_pad == NULL || action_is_pad[i / Amax] == 0.0f)) ? 1.0f : 0.0f;
        float diff = v[i] - target[i];
        dv[i] = fx(mask * 2.0f * diff);
        sq += mask * diff * diff;
    }
    sq = block_sum(sq, shared);
    if (threadIdx.x == 0) { *sum = (accumulate ? *sum : 0.0f) + sq; }
}

// The valid entries into *count (added to when `accumulate`), counted on one thread
__global__ void valid_entries_kernel1(float* count, const float* action_is_pad, int n_slots, int A, int accumulate) {
    float s = 0.0f;
    for (int i = 0; i < n_slots; i++) { s += action_is_pad == NULL || action_is_pad[i] == 0.0f ? 1.0f : 0.0f; }
    *count = (accumulate ? *count : 0.0f) + s * (float)A;
}

// sample b's squared errors and entries over its slots in the episode into sums[2 b], sums[2 b + 1]:
// one thread per sample
__global__ void sample_loss_kernel1(float* sums, const float* v, const float* target, const float* action_is_pad, int B,
                                    int H, int A, int Amax) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) { return; }
    float sq = 0.0f, n = 0.0f;
    for (int e = 0; e < H * A; e++) {
        int r = b * H + e / A;
        if (action_is_pad != NULL && action_is_pad[r] != 0.0f) { continue; }
        float diff = v[(size_t)r * Amax + e % A] - target[(size_t)r * Amax + e % A];
        sq += diff * diff;
        n += 1.0f;
    }
    sums[2 * b] = sq;
    sums[2 * b + 1] = n;
}

// ----------------------------------------------------------------------------
// the problems and their references

typedef struct {
    int B, H, A, Amax, n, pi0;           // pi0: every slot counts in the loss (no action_is_pad)
    float *actions, *eps, *t, *pad, *v;  // host copies: (B, H, Amax) x2, (B), (B, H), (B, H, Amax)
    float *d_actions, *d_eps, *d_t, *d_pad, *d_v;
} Case;

static Case make_case(int B, int H, int A, int Amax, int pi0, uint64_t seed) {
    Case k;
    k.B = B; k.H = H; k.A = A; k.Amax = Amax; k.n = B * H * Amax; k.pi0 = pi0;
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

// what the loss's kernels are given for action_is_pad: NULL in pi0
static const float* loss_pad(const Case* k) { return k->pi0 ? NULL : k->d_pad; }

// whether value i is a valid entry of the loss
static int loss_valid(const Case* k, int i) { return i % k->Amax < k->A && (k->pi0 || k->pad[i / k->Amax] == 0.0f); }

// the reference, in double: x_t, u, dv (B, H, Amax), the sum of squares and the valid entries
static double flow_reference(const Case* k, double* x_t, double* u, double* dv, double* entries) {
    double sum = 0.0;
    *entries = 0.0;
    for (int i = 0; i < k->n; i++) {
        double t = k->t[i / (k->H * k->Amax)];
        double m = loss_valid(k, i) ? 1.0 : 0.0;
        x_t[i] = t * k->eps[i] + (1.0 - t) * k->actions[i];
        u[i] = (double)k->eps[i] - k->actions[i];
        double diff = k->v[i] - u[i];
        dv[i] = m * 2.0 * diff;
        sum += m * diff * diff;
        *entries += m;
    }
    return sum;
}

// ----------------------------------------------------------------------------
// launchers: version v at `block` threads (version 2 at BLOCK is the trainer's launch)

static void run_inputs(int v, int block, const Case* k, floatX* x_t, float* target) {
    int HA = k->H * k->Amax, n = k->n;
    if (v == 1) {
        flow_xt_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(x_t, k->d_actions, k->d_eps, k->d_t, HA, n);
        launchCheck();
        flow_target_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(target, k->d_actions, k->d_eps, n);
    } else {
        flow_inputs_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(x_t, target, k->d_actions, k->d_eps, k->d_t,
                                                                          HA, n);
    }
    launchCheck();
}

// One micro-step's loss, as the trainer's forward ends: dv, the sum into scalars[0] and the valid
// entries into scalars[3], added to the step's after its first micro-step; partial: one float a
// block of the values
static void run_loss(int v, int block, const Case* k, floatX* dv, float* partial, float* scalars, const float* target,
                     int micro) {
    const float* is_pad = loss_pad(k);
    int n_slots = k->B * k->H;
    if (v == 1) {
        valid_entries_kernel1<<<1, 1, 0, main_stream>>>(scalars + 3, is_pad, n_slots, k->A, micro > 0);
        launchCheck();
        flow_loss_kernel1<<<1, block, 0, main_stream>>>(dv, scalars, k->d_v, target, is_pad, k->A, k->Amax, k->n,
                                                        micro > 0);
        launchCheck();
        return;
    }
    valid_entries_kernel<<<1, block, 0, main_stream>>>(scalars + 3, is_pad, n_slots, k->A, micro > 0);
    launchCheck();
    int blocks = ceil_div(k->n, block);
    flow_loss_kernel<<<blocks, block, 0, main_stream>>>(dv, partial, k->d_v, target, is_pad, k->A, k->Amax, k->n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(scalars, partial, blocks, 1.0, 0, micro > 0);
    launchCheck();
}

// The step's end (flow_loss_finish): the mean into scalars[0], its factor into scalars[4], the
// gradients g (n) scaled by it
static void run_finish(int block, float* scalars, float* g, size_t n) {
    loss_normalize_kernel<<<1, 1, 0, main_stream>>>(scalars);
    launchCheck();
    scale_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(g, n, scalars + 4);
    launchCheck();
}

// each sample's sums into sample_sums (B, 2), then added to their tasks' task_sums (n_tasks, 2)
static void run_task_losses(int v, int block, const Case* k, float* sample_sums, float* task_sums, const float* target,
                            const int* task, int n_tasks, int micro) {
    if (v == 1) {
        sample_loss_kernel1<<<ceil_div(k->B, block), block, 0, main_stream>>>(sample_sums, k->d_v, target, k->d_pad,
                                                                             k->B, k->H, k->A, k->Amax);
    } else {
        sample_loss_kernel<<<k->B, block, 0, main_stream>>>(sample_sums, k->d_v, target, k->d_pad, k->H, k->A, k->Amax);
    }
    launchCheck();
    dim3 grid = ceil_div(n_tasks, block);
    task_loss_add_kernel<<<grid, block, 0, main_stream>>>(task_sums, sample_sums, task, k->B, n_tasks, micro == 0);
    launchCheck();
}

// ----------------------------------------------------------------------------
// checks

static void describe(char* out, size_t size, int v, const Case* k, int block, const char* what) {
    snprintf(out, size, "v%d %s (B %d, H %d, A %d of %d) block %d: %s", v, k->pi0 ? "pi0" : "SmolVLA", k->B, k->H, k->A,
             k->Amax, block, what);
}

// the inputs, one micro-step's loss and the step's end, at every version and block size
static void check_case(const Case* k) {
    size_t n = k->n;
    double* ref_x = (double*)mallocCheck(n * sizeof(double));
    double* ref_u = (double*)mallocCheck(n * sizeof(double));
    double* ref_dv = (double*)mallocCheck(n * sizeof(double));
    double entries, ref_sum = flow_reference(k, ref_x, ref_u, ref_dv, &entries);
    double ref_inv = 1.0 / (entries > 1.0 ? entries : 1.0), ref_loss = ref_sum * ref_inv;
    double* ref_g = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) { ref_g[i] = k->v[i] * ref_inv; }
    floatX *x_t, *dv;
    float *target, *partial, *scalars;  // scalars: the trainer's 8
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));  // at most one partial per value (block >= 1)
    cudaCheck(cudaMalloc(&scalars, 8 * sizeof(float)));
    char what[240], line[300];
    for (int v = 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            int block = BLOCKS[bi];
            poison(x_t, n * sizeof(floatX));
            poison(target, n * sizeof(float));
            run_inputs(v, block, k, x_t, target);
            float* got_x = from_device_x(x_t, n);
            float* got_u = from_device_f(target, n);
            describe(what, sizeof(what), v, k, block, "x_t");
            check_close(what, got_x, ref_x, n, TOL_X);
            describe(what, sizeof(what), v, k, block, "target");
            check_close(what, got_u, ref_u, n, TOL_F);

            poison(dv, n * sizeof(floatX));
            poison(partial, n * sizeof(float));
            poison(scalars, 8 * sizeof(float));  // micro-step 0 overwrites the sums
            run_loss(v, block, k, dv, partial, scalars, target, 0);
            float* got_dv = from_device_x(dv, n);
            float* got_sums = from_device_f(scalars, 8);
            float* d_g = to_device_f(k->v, n);  // stand-in gradients, scaled at the step's end
            run_finish(block, scalars, d_g, n);
            float* got_loss = from_device_f(scalars, 8);
            float* got_g = from_device_f(d_g, n);
            describe(what, sizeof(what), v, k, block, "dv");
            check_close(what, got_dv, ref_dv, n, TOL_X);
            describe(what, sizeof(what), v, k, block, "sum of squares");
            check_close(what, got_sums, &ref_sum, 1, TOL_SUM);
            describe(what, sizeof(what), v, k, block, "mean loss");
            check_close(what, got_loss, &ref_loss, 1, TOL_SUM);
            describe(what, sizeof(what), v, k, block, "valid entries and their inverse");
            snprintf(line, sizeof(line), "%s: %.0f (want %.0f)", what, got_loss[3], entries);
            check_true(line, got_loss[3] == (float)entries && fabs(got_loss[4] - ref_inv) <= 1e-6 * ref_inv);
            describe(what, sizeof(what), v, k, block, "gradients scaled to the mean's");
            check_close(what, got_g, ref_g, n, TOL_F);
            cudaCheck(cudaFree(d_g));

            // the same launch again: no atomics, so the same bits
            poison(dv, n * sizeof(floatX));
            poison(scalars, 8 * sizeof(float));
            run_loss(v, block, k, dv, partial, scalars, target, 0);
            float* again_dv = from_device_x(dv, n);
            float* again_sums = from_device_f(scalars, 8);
            describe(what, sizeof(what), v, k, block, "sum and dv, second run");
            int same = memcmp(got_sums, again_sums, sizeof(float)) == 0 &&
                       memcmp(got_dv, again_dv, n * sizeof(float)) == 0;
            snprintf(line, sizeof(line), "%s: %s", what, same ? "bitwise equal" : "bits differ");
            check_true(line, same);
            free(got_x); free(got_u); free(got_dv); free(got_sums); free(got_loss); free(got_g); free(again_dv);
            free(again_sums);
        }
    }
    cudaCheck(cudaFree(x_t)); cudaCheck(cudaFree(dv)); cudaCheck(cudaFree(target));
    cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(scalars));
    free(ref_x); free(ref_u); free(ref_dv); free(ref_g);
}

// Two micro-steps of one optimizer step (k1 then k2, the same shapes): their sums and entries
// added, the mean taken once over both
static void check_micro_steps(const Case* k1, const Case* k2) {
    size_t n = k1->n;
    double* ref_x = (double*)mallocCheck(n * sizeof(double));
    double* ref_u = (double*)mallocCheck(n * sizeof(double));
    double* ref_dv1 = (double*)mallocCheck(n * sizeof(double));
    double* ref_dv2 = (double*)mallocCheck(n * sizeof(double));
    double e1, e2, s1 = flow_reference(k1, ref_x, ref_u, ref_dv1, &e1);
    double s2 = flow_reference(k2, ref_x, ref_u, ref_dv2, &e2);
    double entries = e1 + e2, ref_loss = (s1 + s2) / (entries > 1.0 ? entries : 1.0);
    floatX *x_t, *dv;
    float *t1, *t2, *partial, *scalars;
    cudaCheck(cudaMalloc(&x_t, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dv, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&t1, n * sizeof(float)));
    cudaCheck(cudaMalloc(&t2, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));
    cudaCheck(cudaMalloc(&scalars, 8 * sizeof(float)));
    char what[240], line[300];
    for (int v = 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            int block = BLOCKS[bi];
            run_inputs(v, block, k1, x_t, t1);
            run_inputs(v, block, k2, x_t, t2);
            poison(scalars, 8 * sizeof(float));
            run_loss(v, block, k1, dv, partial, scalars, t1, 0);
            poison(dv, n * sizeof(floatX));
            run_loss(v, block, k2, dv, partial, scalars, t2, 1);
            float* got_dv = from_device_x(dv, n);
            loss_normalize_kernel<<<1, 1, 0, main_stream>>>(scalars);
            launchCheck();
            float* got = from_device_f(scalars, 8);
            describe(what, sizeof(what), v, k1, block, "two micro-steps: the second's dv");
            check_close(what, got_dv, ref_dv2, n, TOL_X);
            describe(what, sizeof(what), v, k1, block, "two micro-steps: the mean over both");
            check_close(what, got, &ref_loss, 1, TOL_SUM);
            describe(what, sizeof(what), v, k1, block, "two micro-steps: entries added");
            snprintf(line, sizeof(line), "%s: %.0f (want %.0f)", what, got[3], entries);
            check_true(line, got[3] == (float)entries);
            free(got_dv); free(got);
        }
    }
    cudaCheck(cudaFree(x_t)); cudaCheck(cudaFree(dv)); cudaCheck(cudaFree(t1)); cudaCheck(cudaFree(t2));
    cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(scalars));
    free(ref_x); free(ref_u); free(ref_dv1); free(ref_dv2);
}

// --balance tasks: two micro-steps (k1, k2) of samples of n_tasks tasks (task 1 has none), each
// sample's squared errors and entries over its slots in the episode added to its task's
static void check_task_losses(const Case* k1, const Case* k2, int n_tasks) {
    int B = k1->B;
    const Case* ks[2] = {k1, k2};
    int32_t* task = (int32_t*)mallocCheck(2 * B * sizeof(int32_t));  // per micro-step, per sample
    for (int i = 0; i < 2 * B; i++) { task[i] = (i * 7 + 3) % n_tasks == 1 ? 0 : (i * 7 + 3) % n_tasks; }
    double* ref = (double*)callocCheck(2 * (size_t)n_tasks * 2, sizeof(double));  // after each micro-step
    float* target[2];
    float* d_target[2];
    for (int m = 0; m < 2; m++) {
        const Case* k = ks[m];
        target[m] = (float*)mallocCheck(k->n * sizeof(float));
        for (int i = 0; i < k->n; i++) { target[m][i] = k->eps[i] - k->actions[i]; }  // as the device's fp32
        d_target[m] = to_device_f(target[m], k->n);
        double* r = ref + (size_t)m * n_tasks * 2;
        if (m == 1) { memcpy(r, ref, (size_t)n_tasks * 2 * sizeof(double)); }
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < k->H; h++) {
                int slot = b * k->H + h;
                if (k->pad[slot] != 0.0f) { continue; }
                for (int e = 0; e < k->A; e++) {
                    double diff = (double)k->v[(size_t)slot * k->Amax + e] - target[m][(size_t)slot * k->Amax + e];
                    r[2 * task[m * B + b]] += diff * diff;
                    r[2 * task[m * B + b] + 1] += 1.0;
                }
            }
        }
    }
    int* d_task = to_device_i(task, 2 * B);
    float *sample_sums, *task_sums;
    cudaCheck(cudaMalloc(&sample_sums, 2 * B * sizeof(float)));
    cudaCheck(cudaMalloc(&task_sums, 2 * n_tasks * sizeof(float)));
    char what[240];
    for (int v = 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            int block = BLOCKS[bi];
            poison(task_sums, 2 * n_tasks * sizeof(float));  // micro-step 0 overwrites them
            for (int m = 0; m < 2; m++) {
                poison(sample_sums, 2 * B * sizeof(float));
                run_task_losses(v, block, ks[m], sample_sums, task_sums, d_target[m], d_task + m * B, n_tasks, m);
                float* got = from_device_f(task_sums, 2 * n_tasks);
                const double* r = ref + (size_t)m * n_tasks * 2;
                float* sq = (float*)mallocCheck(n_tasks * sizeof(float));
                float* cnt = (float*)mallocCheck(n_tasks * sizeof(float));
                float* want_cnt = (float*)mallocCheck(n_tasks * sizeof(float));
                double* want_sq = (double*)mallocCheck(n_tasks * sizeof(double));
                for (int t = 0; t < n_tasks; t++) {
                    sq[t] = got[2 * t]; cnt[t] = got[2 * t + 1];
                    want_sq[t] = r[2 * t]; want_cnt[t] = (float)r[2 * t + 1];
                }
                char item[120];
                snprintf(item, sizeof(item), "%d tasks, after micro-step %d: squared errors", n_tasks, m);
                describe(what, sizeof(what), v, ks[m], block, item);
                check_close(what, sq, want_sq, n_tasks, TOL_SUM);
                snprintf(item, sizeof(item), "%d tasks, after micro-step %d: entries", n_tasks, m);
                describe(what, sizeof(what), v, ks[m], block, item);
                check_exact(what, cnt, want_cnt, n_tasks);
                free(got); free(sq); free(cnt); free(want_cnt); free(want_sq);
            }
        }
    }
    for (int m = 0; m < 2; m++) { free(target[m]); cudaCheck(cudaFree(d_target[m])); }
    cudaCheck(cudaFree(d_task)); cudaCheck(cudaFree(sample_sums)); cudaCheck(cudaFree(task_sums));
    free(task); free(ref);
}

// sampling's Euler step x += dt v on fp32 x, and x's floatX copy
static void check_euler(int n, float dt, uint64_t seed) {
    float* x = random_floats(n, 1.0f, seed);
    float* vel = random_floats(n, 2.0f, seed + 1);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    for (int i = 0; i < n; i++) { ref[i] = (double)x[i] + (double)dt * vel[i]; }
    float* d_v = to_device_f(vel, n);
    floatX* x_model;
    cudaCheck(cudaMalloc(&x_model, n * sizeof(floatX)));
    char what[200];
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int block = BLOCKS[bi];
        float* d_x = to_device_f(x, n);
        poison(x_model, n * sizeof(floatX));
        euler_step_f32_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(d_x, x_model, d_v, dt, n);
        launchCheck();
        float* got = from_device_f(d_x, n);
        float* got_model = from_device_x(x_model, n);
        snprintf(what, sizeof(what), "v1 Euler step (n %d, dt %g) block %d: x", n, dt, block);
        check_close(what, got, ref, n, TOL_F);
        snprintf(what, sizeof(what), "v1 Euler step (n %d, dt %g) block %d: x's floatX copy", n, dt, block);
        check_close(what, got_model, ref, n, TOL_X);
        free(got); free(got_model);
        cudaCheck(cudaFree(d_x));
    }
    free(x); free(vel); free(ref);
    cudaCheck(cudaFree(d_v)); cudaCheck(cudaFree(x_model));
}

// ----------------------------------------------------------------------------
// benchmark at the presets' shapes: small enough that launches dominate

template <typename F>
static void bench(int v, const char* name, const Case* k, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v%d %-26s (%s, B %d, H %d, A %d of %d): %8.4f ms, %7.1f GB/s\n", v, name, k->pi0 ? "pi0" : "SmolVLA",
           k->B, k->H, k->A, k->Amax, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark_case(const Case* k) {
    size_t n = k->n, X = sizeof(floatX);
    int B = k->B, n_tasks = 4;
    floatX *x_t, *dv;
    float *target, *partial, *scalars, *sample_sums, *task_sums;
    cudaCheck(cudaMalloc(&x_t, n * X));
    cudaCheck(cudaMalloc(&dv, n * X));
    cudaCheck(cudaMalloc(&target, n * sizeof(float)));
    cudaCheck(cudaMalloc(&partial, n * sizeof(float)));
    cudaCheck(cudaMalloc(&scalars, 8 * sizeof(float)));
    cudaCheck(cudaMalloc(&sample_sums, 2 * B * sizeof(float)));
    cudaCheck(cudaMalloc(&task_sums, 2 * n_tasks * sizeof(float)));
    int32_t* task = (int32_t*)mallocCheck(B * sizeof(int32_t));
    for (int b = 0; b < B; b++) { task[b] = b % n_tasks; }
    int* d_task = to_device_i(task, B);
    run_inputs(2, BLOCK, k, x_t, target);
    // bytes each step moves: actions, eps in, x_t, target out; v, target, mask in, dv, partials out
    double bytes_in = (double)n * (4 + 4 + X + 4) + B * 4;
    double bytes_loss = (double)n * (4 + 4 + X) + (double)B * k->H * 4 + 2.0 * ceil_div(n, BLOCK) * 4;
    double bytes_task = (double)B * k->H * (k->A * 8 + 4);  // the valid entries' v and u, the pad flags
    for (int v = 1; v <= N_VERSIONS; v++) {
        bench(v, "flow inputs", k, bytes_in, [&]() { run_inputs(v, BLOCK, k, x_t, target); });
        bench(v, "loss + entries + finalize", k, bytes_loss,
              [&]() { run_loss(v, BLOCK, k, dv, partial, scalars, target, 0); });
        bench(v, "per-task losses", k, bytes_task,
              [&]() { run_task_losses(v, BLOCK, k, sample_sums, task_sums, target, d_task, n_tasks, 0); });
    }
    bench(1, "Euler step", k, (double)n * (4 + 4 + 4 + X), [&]() {
        LAUNCH_1D(euler_step_f32_kernel, n, partial, x_t, target, -0.1f, (int)n);
    });
    free(task);
    cudaCheck(cudaFree(x_t)); cudaCheck(cudaFree(dv)); cudaCheck(cudaFree(target)); cudaCheck(cudaFree(partial));
    cudaCheck(cudaFree(scalars)); cudaCheck(cudaFree(sample_sums)); cudaCheck(cudaFree(task_sums));
    cudaCheck(cudaFree(d_task));
}

static void benchmark(void) {
    // the smolvla preset at batch 32 (a dataset's 6 action dims of 32, 50 slots), pi0's at batch 8
    Case smol = make_case(32, 50, 6, 32, 0, 7);
    Case pi0 = make_case(8, 50, 6, 32, 1, 8);
    benchmark_case(&smol);
    benchmark_case(&pi0);
    free_case(&smol);
    free_case(&pi0);
}

int main(void) {
    dev_init("flow_loss");
    // value counts that fill no block exactly, one smaller than a warp, one over several blocks;
    // padded action dims (A < Amax) and none; SmolVLA's loss (pads left out) and pi0's (every slot)
    struct { int B, H, A, Amax; } shapes[] = { {1, 4, 3, 3}, {3, 8, 4, 32}, {2, 50, 7, 32}, {5, 13, 32, 32} };
    int n_shapes = sizeof(shapes) / sizeof(shapes[0]);
    for (int pi0 = 0; pi0 <= 1; pi0++) {
        for (int i = 0; i < n_shapes; i++) {
            Case k = make_case(shapes[i].B, shapes[i].H, shapes[i].A, shapes[i].Amax, pi0, 100 + 10 * i);
            check_case(&k);
            free_case(&k);
        }
    }
    for (int pi0 = 0; pi0 <= 1; pi0++) {
        Case k1 = make_case(3, 8, 4, 32, pi0, 300), k2 = make_case(3, 8, 4, 32, pi0, 310);
        check_micro_steps(&k1, &k2);
        free_case(&k1);
        free_case(&k2);
    }
    // per task: more samples than a 32-thread block holds, and one sample
    struct { int B, H, A, Amax, tasks; } task_shapes[] = {{37, 8, 5, 32, 4}, {1, 50, 6, 32, 3}};
    for (int i = 0; i < 2; i++) {
        Case k1 = make_case(task_shapes[i].B, task_shapes[i].H, task_shapes[i].A, task_shapes[i].Amax, 0, 400 + 10 * i);
        Case k2 = make_case(task_shapes[i].B, task_shapes[i].H, task_shapes[i].A, task_shapes[i].Amax, 0, 405 + 10 * i);
        check_task_losses(&k1, &k2, task_shapes[i].tasks);
        free_case(&k1);
        free_case(&k2);
    }
    check_euler(1, -0.1f, 500);       // one value
    check_euler(3001, -0.1f, 510);    // several blocks, none full
    return dev_finish(benchmark);
}
