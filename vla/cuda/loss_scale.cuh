/*
vla/cuda/loss_scale.cuh: dynamic loss scaling for fp16 builds (LOSS_SCALING), on the device: the scale
applied to the loss gradient, undone on the gradients, and updated after each step from the global
norm (a non-finite norm skips the step and halves the scale).
*/
#ifndef VLA_CUDA_LOSS_SCALE_CUH
#define VLA_CUDA_LOSS_SCALE_CUH

#include "common.cuh"

// ---- dynamic loss scaling (fp16 builds), on the device: every rank sees the same norm, so decides
// the same. State (LOSS_SCALER floats): next scale S, clean steps, skipped steps, last scale, factor.
enum { SCALER_NEXT = 0, SCALER_CLEAN = 1, SCALER_SKIPPED = 2, SCALER_USED = 3, SCALER_FACTOR = 4, LOSS_SCALER = 5 };
#if defined(ENABLE_FP16)
#define LOSS_SCALING 1
#else
#define LOSS_SCALING 0
#endif

// A step's first factor: S * 2^-ceil(log2(H*A)) per sample, so skips don't depend on the split. One thread.
__global__ void loss_scale_begin_kernel(float* scaler, float pow2) {
    scaler[SCALER_USED] = scaler[SCALER_NEXT];
    scaler[SCALER_FACTOR] = scaler[SCALER_NEXT] * pow2;
}

// dv (n) floatX *= the step's factor; past 65504 it is Inf and the step is skipped.
__global__ void loss_scale_grad_kernel(floatX* dv, int n, const float* scaler) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dv[i] = fx(f32(dv[i]) * scaler[SCALER_FACTOR]); }
}

// The gradients' factor (scalars[4], 1 / valid entries) over the step's scale factor. One thread.
__global__ void loss_unscale_kernel(float* scalars, const float* scaler) {
    scalars[4] /= scaler[SCALER_FACTOR];
}

// After AdamW: a non-finite norm counts a skip and halves S (>= 1); `window` clean steps double it. One thread.
__global__ void loss_scale_update_kernel(float* scaler, const float* grad_norm, int window, float max_scale) {
    if (!isfinite(*grad_norm)) {
        scaler[SCALER_SKIPPED] += 1.0f;
        scaler[SCALER_CLEAN] = 0.0f;
        scaler[SCALER_NEXT] = fmaxf(1.0f, 0.5f * scaler[SCALER_USED]);
    } else if (scaler[SCALER_CLEAN] + 1.0f >= (float)window) {
        scaler[SCALER_CLEAN] = 0.0f;
        scaler[SCALER_NEXT] = fminf(max_scale, 2.0f * scaler[SCALER_USED]);
    } else {
        scaler[SCALER_CLEAN] += 1.0f;
    }
}

#endif  // VLA_CUDA_LOSS_SCALE_CUH
