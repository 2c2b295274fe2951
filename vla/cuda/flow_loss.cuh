/*
vla/cuda/flow_loss.cuh: the flow-matching objective: the noisy input x_t and target u, the fp32 velocity
head's bias, the masked squared error and its gradient, the mean over valid entries, the per-task
losses of --balance tasks, and sampling's Euler step.
*/
#ifndef VLA_CUDA_FLOW_LOSS_CUH
#define VLA_CUDA_FLOW_LOSS_CUH

#include "common.cuh"

// x_t = t eps + (1 - t) a, the model's input; u = eps - a, the target. (B, H, A) each.
__global__ void flow_inputs_kernel(floatX* x_t, float* target, const float* actions, const float* eps,
                                   const float* t, int HA, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float tb = t[i / HA];
    x_t[i] = fx(tb * eps[i] + (1.0f - tb) * actions[i]);
    target[i] = eps[i] - actions[i];
}

// out (rows, n) fp32 = bias (n) in every row: the velocity head's fp32 product adds onto it
__global__ void bias_rows_kernel(float* out, const floatX* bias, int rows, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * n) { out[i] = f32(bias[i % n]); }
}

// The loss's valid entries of a micro-batch into *count (added to when `accumulate`). One block.
__global__ void valid_entries_kernel(float* count, const float* action_is_pad, int n_slots, int A, int accumulate) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n_slots; i += blockDim.x) {
        s += action_is_pad == NULL || action_is_pad[i] == 0.0f ? 1.0f : 0.0f;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) { *count = (accumulate ? *count : 0.0f) + s * (float)A; }
}

// The flow-matching loss: sum of (v - u)^2 over the first A dims of the slots in the episode (every slot
// where action_is_pad is NULL: pi0), per-block sums into partial, dv = 2 (v - u) there. A sum: the
// step's valid entries are known only later.
__global__ void flow_loss_kernel(floatX* dv, float* partial, const float* v, const float* target,
                                 const float* action_is_pad, int A, int Amax, int n) {
    __shared__ float shared[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float sq = 0.0f;
    if (i < n) {
        float mask = (i % Amax < A && (action_is_pad == NULL || action_is_pad[i / Amax] == 0.0f)) ? 1.0f : 0.0f;
        float diff = v[i] - target[i];
        dv[i] = fx(mask * 2.0f * diff);
        sq = mask * diff * diff;
    }
    sq = block_sum(sq, shared);
    if (threadIdx.x == 0) { partial[blockIdx.x] = sq; }
}

// scalars[0] / max(1, scalars[3]) -> the mean loss in scalars[0], its factor in scalars[4]. One thread.
__global__ void loss_normalize_kernel(float* scalars) {
    float inv = 1.0f / fmaxf(1.0f, scalars[3]);
    scalars[0] *= inv;
    scalars[4] = inv;
}

// --balance tasks: sample b's squared errors and entries into sums[2 b], sums[2 b + 1]. One block each.
__global__ void sample_loss_kernel(float* sums, const float* v, const float* target, const float* action_is_pad, int H,
                                   int A, int Amax) {
    __shared__ float shared[32];
    int b = blockIdx.x;
    float sq = 0.0f, n = 0.0f;
    for (int e = threadIdx.x; e < H * A; e += blockDim.x) {
        int r = b * H + e / A;
        if (action_is_pad != NULL && action_is_pad[r] != 0.0f) { continue; }
        float diff = v[(size_t)r * Amax + e % A] - target[(size_t)r * Amax + e % A];
        sq += diff * diff;
        n += 1.0f;
    }
    sq = block_sum(sq, shared);
    n = block_sum(n, shared);
    if (threadIdx.x == 0) { sums[2 * b] = sq; sums[2 * b + 1] = n; }
}

// ... added to its task's (task_sums (T, 2)) in sample order; `first` starts from zero. One thread per task.
__global__ void task_loss_add_kernel(float* task_sums, const float* sample_sums, const int* task, int B, int T,
                                     int first) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) { return; }
    float sq = first ? 0.0f : task_sums[2 * t], n = first ? 0.0f : task_sums[2 * t + 1];
    for (int b = 0; b < B; b++) {
        if (task[b] == t) { sq += sample_sums[2 * b]; n += sample_sums[2 * b + 1]; }
    }
    task_sums[2 * t] = sq;
    task_sums[2 * t + 1] = n;
}

// One Euler step, x (fp32) += dt v, and the model's floatX copy of x
__global__ void euler_step_f32_kernel(float* x, floatX* x_model, const float* v, float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float y = x[i] + dt * v[i];
        x[i] = y;
        x_model[i] = fx(y);
    }
}

#endif  // VLA_CUDA_FLOW_LOSS_CUH
