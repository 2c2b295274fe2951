/*
vla/cuda/glu.cuh: the MLPs' gated activations, act = a(gate) * up, a = silu (SwiGLU, SmolVLA's
Llama layers) or gelu_tanh (GeGLU, pi0's Gemma layers), forward and backward, and SiLU alone (the
action-time MLP).
*/
#ifndef VLA_CUDA_GLU_CUH
#define VLA_CUDA_GLU_CUH

#include "common.cuh"
#include "profiler.cuh"
#include "gelu.cuh"

__global__ void silu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = f32(inp[i]);
        out[i] = fx(x / (1.0f + expf(-x)));
    }
}

// d = dy silu'(x), silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x); d may be dy (in place)
__global__ void silu_backward_kernel(floatX* d, const floatX* dy, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = f32(inp[i]), s = 1.0f / (1.0f + expf(-x));
        d[i] = fx(f32(dy[i]) * s * (1.0f + x * (1.0f - s)));
    }
}

// ---- SwiGLU, silu(gate) * up (the Llama MLP of the VLM and the expert)

// For gates far below zero e^-x overflows to inf and both give 0 (not NaN): x / inf and 0 (1 + x).
static __device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

static __device__ __forceinline__ float silu_grad(float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

// The MLPs' gated activation act = a(gate) * up and its backward, a = silu (SwiGLU: SmolVLA's Llama
// layers) or gelu_tanh (GeGLU: pi0's Gemma layers), 128-bit loads and stores (dev/cuda/glu.cu);
// dgate, dup overwritten
template <bool GELU>
static __device__ __forceinline__ void glu_forward_pack(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) { return; }
    x128 g = load128(gate + i), u = load128(up + i), o;
    #pragma unroll
    for (int k = 0; k < x128::size; k++) {
        float gk = f32(g.v[k]);
        o.v[k] = fx((GELU ? gelu_tanh(gk) : silu(gk)) * f32(u.v[k]));
    }
    store128(act + i, o);
}

template <bool GELU>
static __device__ __forceinline__ void glu_backward_pack(floatX* dgate, floatX* dup, const floatX* dact,
                                                         const floatX* gate, const floatX* up, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) { return; }
    x128 g = load128(gate + i), u = load128(up + i), d = load128(dact + i), dg, du;
    #pragma unroll
    for (int k = 0; k < x128::size; k++) {
        float gk = f32(g.v[k]), dk = f32(d.v[k]);
        dg.v[k] = fx(dk * f32(u.v[k]) * (GELU ? gelu_tanh_grad(gk) : silu_grad(gk)));
        du.v[k] = fx(dk * (GELU ? gelu_tanh(gk) : silu(gk)));
    }
    store128(dgate + i, dg);
    store128(dup + i, du);
}

__global__ void swiglu_forward_kernel2(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    glu_forward_pack<false>(act, gate, up, n);
}
__global__ void swiglu_backward_kernel2(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                                        const floatX* up, size_t n) {
    glu_backward_pack<false>(dgate, dup, dact, gate, up, n);
}
__global__ void geglu_forward_kernel2(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    glu_forward_pack<true>(act, gate, up, n);
}
__global__ void geglu_backward_kernel2(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                                       const floatX* up, size_t n) {
    glu_backward_pack<true>(dgate, dup, dact, gate, up, n);
}

// act = a(gate) * up, a = gelu_tanh (GeGLU, pi0) or silu (SwiGLU, SmolVLA)
static void glu_forward(floatX* act, const floatX* gate, const floatX* up, size_t n, bool gelu) {
    ProfOp prof_op(gelu ? "geglu" : "swiglu");
    check_packable(gelu ? "geglu_forward" : "swiglu_forward", n, act, gate, up);
    int grid = ceil_div(n / x128::size, BLOCK);
    if (gelu) { geglu_forward_kernel2<<<grid, BLOCK, 0, main_stream>>>(act, gate, up, n); }
    else { swiglu_forward_kernel2<<<grid, BLOCK, 0, main_stream>>>(act, gate, up, n); }
    launchCheck();
}

// dgate, dup overwritten
static void glu_backward(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up, size_t n,
                         bool gelu) {
    ProfOp prof_op(gelu ? "geglu" : "swiglu");
    check_packable(gelu ? "geglu_backward" : "swiglu_backward", n, dgate, dup, dact, gate, up);
    int grid = ceil_div(n / x128::size, BLOCK);
    if (gelu) { geglu_backward_kernel2<<<grid, BLOCK, 0, main_stream>>>(dgate, dup, dact, gate, up, n); }
    else { swiglu_backward_kernel2<<<grid, BLOCK, 0, main_stream>>>(dgate, dup, dact, gate, up, n); }
    launchCheck();
}

#endif  // VLA_CUDA_GLU_CUH
