/*
vla/cuda/pixel_shuffle.cuh: the connector's pixel shuffle (SmolVLM's space-to-depth of the vision
grid by scale factor s) and its inverse, the backward.
*/
#ifndef VLA_CUDA_PIXEL_SHUFFLE_CUH
#define VLA_CUDA_PIXEL_SHUFFLE_CUH

#include "common.cuh"
#include "profiler.cuh"

// ---- the connector's pixel shuffle and its inverse

// Offset in x (N, h*w, C) of channel (a s + b) C + e of token i2 (w/s) + j2 of image n, shuffled
static __device__ __forceinline__ size_t pixel_shuffle_source(size_t n, int t, int m, int h, int w, int C, int s) {
    int ws = w / s;
    int i2 = t / ws, j2 = t % ws;
    int a = m / (s * C), b = m / C % s, e = m % C;
    return (n * h * w + (size_t)(i2 * s + a) * w + j2 * s + b) * C + e;
}

// out (N, (h/s)(w/s), C s^2) from x (N, h*w, C), x128::size channels per thread
__global__ void pixel_shuffle_forward_kernel2(floatX* out, const floatX* inp, int N, int h, int w, int C, int s) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    size_t Cs = (size_t)C * s * s, tokens = (size_t)(h / s) * (w / s);
    if (idx >= N * tokens * Cs) { return; }
    int m = (int)(idx % Cs);
    size_t row = idx / Cs;
    store128(out + idx, load128(inp + pixel_shuffle_source(row / tokens, (int)(row % tokens), m, h, w, C, s)));
}

// dinp (N, h*w, C) overwritten from dout (N, (h/s)(w/s), C s^2): the inverse permutation
__global__ void pixel_shuffle_backward_kernel2(floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (idx >= (size_t)N * h * w * C) { return; }
    int e = (int)(idx % C);
    size_t p = idx / C;
    int j = (int)(p % w), i = (int)(p / w % h);
    size_t n = p / ((size_t)w * h);
    size_t t = n * (h / s) * (w / s) + (size_t)(i / s) * (w / s) + j / s;
    store128(dinp + idx, load128(dout + t * C * s * s + (size_t)((i % s) * s + j % s) * C + e));
}

static void pixel_shuffle_check_grid(int h, int w, int s) {
    if (s < 1 || h % s != 0 || w % s != 0) {
        vla_fail("pixel_shuffle: scale factor %d does not divide the %d x %d patch grid: pick a scale factor (or an "
                 "image and patch size) that does", s, h, w);
    }
}

static void pixel_shuffle_forward(floatX* out, const floatX* inp, int N, int h, int w, int C, int s) {
    ProfOp prof_op("pixel shuffle");
    pixel_shuffle_check_grid(h, w, s);
    check_packable("pixel_shuffle_forward", C, out, inp);
    size_t n = (size_t)N * h * w * C;
    pixel_shuffle_forward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(out, inp, N, h, w, C, s);
    launchCheck();
}

static void pixel_shuffle_backward(floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s) {
    ProfOp prof_op("pixel shuffle");
    pixel_shuffle_check_grid(h, w, s);
    check_packable("pixel_shuffle_backward", C, dinp, dout);
    size_t n = (size_t)N * h * w * C;
    pixel_shuffle_backward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(dinp, dout, N, h, w, C,
                                                                                               s);
    launchCheck();
}


#endif  // VLA_CUDA_PIXEL_SHUFFLE_CUH
