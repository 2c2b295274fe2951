/*
vla/cuda/copy.cuh: copies and casts between the model's arrays: fp32 to floatX (convert), fill,
scaling by a device scalar, and gathering or scattering a span of rows of every sample.
*/
#ifndef VLA_CUDA_COPY_CUH
#define VLA_CUDA_COPY_CUH

#include "common.cuh"

// out (B * count, C) = rows first .. first+count-1 of every sample of x (B, T, C)
__global__ void gather_rows_kernel(floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[idx] = x[((row / count) * T + first + row % count) * C + idx % C];
}


__global__ void convert_kernel(floatX* out, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fx(inp[i]); }
}

// Version 2: x128::size values per thread, 128-bit stores; version 1 takes the other sizes
__global__ void convert_kernel2(floatX* out, const float* inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size;
    if (i >= n) { return; }
    x128 o;
    #pragma unroll
    for (int k = 0; k < x128::size; k += Packed128<float>::size) {
        Packed128<float> f = load128(inp + i + k);
        #pragma unroll
        for (int j = 0; j < Packed128<float>::size; j++) { o.v[k + j] = fx(f.v[j]); }
    }
    store128(out + i, o);
}

__global__ void fill_kernel(float* p, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { p[i] = v; }
}

// out (B * count, C) fp32 = rows first .. first+count-1 of every sample of x (B, T, C)
__global__ void gather_rows_f32_kernel(float* out, const float* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[idx] = x[((row / count) * T + first + row % count) * C + idx % C];
}

// out (B, T, C): rows first .. first+count-1 of every sample = x (B * count, C) (gather_rows_kernel's
// inverse; the other rows are left alone)
__global__ void scatter_rows_kernel(floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[((row / count) * T + first + row % count) * C + idx % C] = x[idx];
}

__global__ void scale_kernel(float* x, size_t n, const float* scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] *= *scale; }
}

static void convert(floatX* out, const float* inp, size_t n) {
    if (packable(n, x128::size, out, inp)) {
        convert_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(out, inp, n);
    } else {
        convert_kernel<<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, inp, n);
    }
    launchCheck();
}

#endif  // VLA_CUDA_COPY_CUH
