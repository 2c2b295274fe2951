/*
vla/cuda/patchify.cuh: images (n_img, 3, S, S) cut into patches in the patch convolution's weight
order, so that the convolution is one matmul.
*/
#ifndef VLA_CUDA_PATCHIFY_CUH
#define VLA_CUDA_PATCHIFY_CUH

#include "common.cuh"

// images (n_img, 3, S, S) -> patches (n_img * g*g, 3*p*p) in conv-weight order: the conv is a Linear
__global__ void patchify_chw_kernel(floatX* patches, const floatX* images, int n_img, int S, int p) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int g = S / p, PD = 3 * p * p;
    if (idx >= (size_t)n_img * g * g * PD) { return; }
    int e = (int)(idx % PD), kx = e % p, ky = e / p % p, ch = e / (p * p);
    size_t patch = idx / PD;
    int gx = (int)(patch % g), gy = (int)(patch / g % g);
    size_t img = patch / ((size_t)g * g);
    patches[idx] = images[((img * 3 + ch) * S + (size_t)gy * p + ky) * S + (size_t)gx * p + kx];
}

#endif  // VLA_CUDA_PATCHIFY_CUH
