/*
vla/cuda/adamw.cuh: the optimizer step: the global gradient norm in a fixed order (NORM_BLOCKS block
sums, then one sum in double), and AdamW on the fp32 master weights, clipped, with the floatX copy.
*/
#ifndef VLA_CUDA_ADAMW_CUH
#define VLA_CUDA_ADAMW_CUH

#include "common.cuh"

// out = (sum of partial in order, in double) * scale, or its sqrt; added to out when `accumulate`.
__global__ void sum_finalize_kernel(float* out, const float* partial, int n, double scale, int take_sqrt,
                                    int accumulate) {
    double s = 0.0;
    for (int j = 0; j < n; j++) { s += (double)partial[j]; }
    s *= scale;
    float v = (float)(take_sqrt ? sqrt(s) : s);
    *out = accumulate ? *out + v : v;
}

// per-block sums of squares of g (n) into partial (gridDim.x): the global norm's first stage
__global__ void norm_squares_kernel(float* partial, const float* g, size_t n) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        s += g[i] * g[i];
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) { partial[blockIdx.x] = s; }
}

// AdamW on fp32 master weights, clipped to norm `clip` (device), then the floatX copy; a non-finite norm: no-op
__global__ void adamw_kernel(float* master, floatX* params, const float* grads, float* m, float* v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2,
                             const float* grad_norm, float clip) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !isfinite(*grad_norm)) { return; }
    float norm = *grad_norm, scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    float g = grads[i] * scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = master[i];
    p -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p);
    master[i] = p;
    params[i] = fx(p);
}

#define NORM_BLOCKS 256  // fixed, so the global norm sums in the same order on every GPU

#endif  // VLA_CUDA_ADAMW_CUH
