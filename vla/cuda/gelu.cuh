/*
vla/cuda/gelu.cuh: GELU with tanh (gelu_pytorch_tanh, SigLIP's MLP activation), forward and
backward, 16 bytes a load.
*/
#ifndef VLA_CUDA_GELU_CUH
#define VLA_CUDA_GELU_CUH

#include "common.cuh"
#include "profiler.cuh"

static __device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f;
    float th = tanhf(k * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

// SigLIP's MLP activation (gelu_pytorch_tanh), 128-bit loads and stores
__global__ void gelu_forward_kernel2(floatX* out, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) { return; }
    x128 x = load128(inp + i), o;
    #pragma unroll
    for (int k = 0; k < x128::size; k++) { o.v[k] = fx(gelu_tanh(f32(x.v[k]))); }
    store128(out + i, o);
}

// d = dy gelu'(x); d may be dy (each thread reads its dy before writing)
__global__ void gelu_backward_kernel2(floatX* d, const floatX* dy, const floatX* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) { return; }
    x128 x = load128(inp + i), g = load128(dy + i), o;
    #pragma unroll
    for (int k = 0; k < x128::size; k++) { o.v[k] = fx(f32(g.v[k]) * gelu_tanh_grad(f32(x.v[k]))); }
    store128(d + i, o);
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n) {
    ProfOp prof_op("gelu");
    check_packable("gelu_forward", n, out, inp);
    gelu_forward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(out, inp, n);
    launchCheck();
}

static void gelu_backward(floatX* d, const floatX* dy, const floatX* inp, size_t n) {
    ProfOp prof_op("gelu");
    check_packable("gelu_backward", n, d, dy, inp);
    gelu_backward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(d, dy, inp, n);
    launchCheck();
}

#endif  // VLA_CUDA_GELU_CUH
