/*
vla/cuda/rmsnorm.cuh: RMSNorm, out = x / sqrt(mean(x^2) + eps) * (offset + w): Llama's (offset 0,
SmolVLA) and Gemma's (offset 1, pi0). The forward keeps rstd; the backward writes the input's gradient
and the weight's through the column sums.
*/
#ifndef VLA_CUDA_RMSNORM_CUH
#define VLA_CUDA_RMSNORM_CUH

#include "common.cuh"
#include "profiler.cuh"
#include "column_sum.cuh"

// out = x / sqrt(mean(x^2) + eps) * (offset + w), rstd kept: offset 0 is Llama's norm (SmolVLA), 1
// Gemma's (pi0, whose weight is the scale's distance from 1). One warp per row of C, 128-bit loads
// and stores: C a multiple of x128::size (dev/cuda/rmsnorm.cu's version 2; its version 1 has scalar loads).
__global__ void rmsnorm_forward_kernel2(floatX* out, float* rstd, const floatX* inp, const floatX* w, int N, int C,
                                        float eps, float offset) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }
    const floatX* x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        x128 v = load128(x + c);
        #pragma unroll
        for (int k = 0; k < x128::size; k++) { ss += f32(v.v[k]) * f32(v.v[k]); }
    }
    float r = rsqrtf(warp_sum(ss) / (float)C + eps);
    if (lane == 0) { rstd[row] = r; }
    floatX* y = out + (size_t)row * C;
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        x128 v = load128(x + c), wv = load128(w + c), o;
        #pragma unroll
        for (int k = 0; k < x128::size; k++) { o.v[k] = fx(f32(v.v[k]) * r * (offset + f32(wv.v[k]))); }
        store128(y + c, o);
    }
}

// y_c = x_c r s_c with r = (mean x^2 + eps)^-1/2 and the scale s = offset + w, so
// dx_c = r s_c dy_c - x_c r^3 / C * sum_j dy_j s_j x_j   and   dw_c = sum_rows dy_c x_c r.
// dx added to dres (fp32) and dres_x (floatX); block dw sums to dw_partial (gridDim.x, C), in warp order.
#define RMSNORM_MAX_BLOCK 512
#define RMSNORM_BWD2_COLS 32
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_kernel2(float* dres, floatX* dres_x,
    float* dw_partial, const floatX* dout, const floatX* inp, const floatX* w, const float* rstd, int N, int C,
    int rows_per_block, float offset) {
    extern __shared__ float warp_dw[];  // (warps, C)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    float acc[RMSNORM_BWD2_COLS];
    #pragma unroll
    for (int j = 0; j < RMSNORM_BWD2_COLS; j++) { acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0 + warp; n < r1; n += n_warps) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < RMSNORM_BWD2_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) { dot += f32(dy[c]) * (offset + f32(w[c])) * f32(x[c]); }
        }
        float k = warp_sum(dot) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < RMSNORM_BWD2_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) {
                float xv = f32(x[c]), dyv = f32(dy[c]);
                float g = dres[(size_t)n * C + c] + r * (offset + f32(w[c])) * dyv - k * xv;
                dres[(size_t)n * C + c] = g;
                dres_x[(size_t)n * C + c] = fx(g);
                acc[j] += dyv * xv * r;
            }
        }
    }
    #pragma unroll
    for (int j = 0; j < RMSNORM_BWD2_COLS; j++) {
        int c = lane + 32 * j;
        if (c < C) { warp_dw[warp * C + c] = acc[j]; }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < n_warps; k++) { s += warp_dw[k * C + c]; }
        dw_partial[(size_t)blockIdx.x * C + c] = s;
    }
}

// RMSNorm's backward past version 2's width (pi0's VLM, 2048), dev/cuda/rmsnorm.cu's versions 3 and 4.
// Columns a lane owns: C <= 32 * 64 = 2048
#define RMSNORM_BWD3_COLS 64

// dw_partial's row blockIdx.x <- the sum of the warps' acc, added in warp order through one shared
// row of C floats (warp w adds its columns while the others wait): the order of version 2's sums,
// in C floats where version 2's row per warp takes 64 KiB at 2048 wide and 256 threads. A lane's
// columns come in runs of RUN: (lane + 32 j) RUN + k holds acc[j RUN + k].
template <int RUN>
static __device__ void rmsnorm_dw_in_warp_order(float* dw_partial, float* row, const float* acc, int C) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (int wp = 0; wp < n_warps; wp++) {
        if (warp == wp) {
            #pragma unroll
            for (int j = 0; j < RMSNORM_BWD3_COLS / RUN; j++) {
                #pragma unroll
                for (int k = 0; k < RUN; k++) {
                    int c = (lane + 32 * j) * RUN + k;
                    if (c < C) { row[c] = (wp == 0 ? 0.0f : row[c]) + acc[j * RUN + k]; }
                }
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) { dw_partial[(size_t)blockIdx.x * C + c] = row[c]; }
}

// The backward of rows past version 2's width: dev/cuda/rmsnorm.cu's version 4, its version 3 (a warp
// a row, 64 columns a lane, scalar loads) with 128-bit loads and stores (dres two or one 16-byte
// packs of fp32 per pack of floatX); C a multiple of x128::size, rows 16-byte aligned
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_kernel4(float* dres, floatX* dres_x,
                                                                               float* dw_partial, const floatX* dout,
                                                                               const floatX* inp, const floatX* w,
                                                                               const float* rstd, int N, int C,
                                                                               int rows_per_block, float offset) {
    typedef Packed128<float> f128;
    const int PACKS = RMSNORM_BWD3_COLS / x128::size;
    extern __shared__ float dw_row[];  // (C)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    float acc[RMSNORM_BWD3_COLS];
    #pragma unroll
    for (int j = 0; j < RMSNORM_BWD3_COLS; j++) { acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0 + warp; n < r1; n += n_warps) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        #pragma unroll
        for (int j = 0; j < PACKS; j++) {
            int c = (lane + 32 * j) * x128::size;
            if (c < C) {
                x128 xv = load128(x + c), dyv = load128(dy + c), wv = load128(w + c);
                #pragma unroll
                for (int k = 0; k < x128::size; k++) { dot += f32(dyv.v[k]) * (f32(wv.v[k]) + offset) * f32(xv.v[k]); }
            }
        }
        float kr = warp_sum(dot) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < PACKS; j++) {
            int c = (lane + 32 * j) * x128::size;
            if (c < C) {  // (the row again, from L1: holding it would double the registers)
                x128 xv = load128(x + c), dyv = load128(dy + c), wv = load128(w + c), o;
                float* d = dres + (size_t)n * C + c;
                #pragma unroll
                for (int k0 = 0; k0 < x128::size; k0 += f128::size) {
                    f128 dv = load128(d + k0);
                    #pragma unroll
                    for (int i = 0; i < f128::size; i++) {
                        int k = k0 + i;
                        float xk = f32(xv.v[k]), dyk = f32(dyv.v[k]);
                        dv.v[i] = dv.v[i] + r * (f32(wv.v[k]) + offset) * dyk - kr * xk;
                        o.v[k] = fx(dv.v[i]);
                        acc[j * x128::size + k] += dyk * xk * r;
                    }
                    store128(d + k0, dv);
                }
                store128(dres_x + (size_t)n * C + c, o);
            }
        }
    }
    rmsnorm_dw_in_warp_order<x128::size>(dw_partial, dw_row, acc, C);
}

static void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* w, int N, int C, float eps,
                            float offset = 0.0f) {
    ProfOp prof_op("rmsnorm");
    check_packable("rmsnorm_forward", C, out, inp, w);
    rmsnorm_forward_kernel2<<<ceil_div((size_t)N * 32, BLOCK), BLOCK, 0, main_stream>>>(out, rstd, inp, w, N, C, eps,
                                                                                        offset);
    launchCheck();
}

static void rmsnorm_backward(float* dres, floatX* dres_x, float* dw, float* partial, const floatX* dout,
                             const floatX* inp, const floatX* w, const float* rstd, int N, int C, float offset = 0.0f) {
    ProfOp prof_op("rmsnorm");
    if (C > 32 * RMSNORM_BWD3_COLS) { vla_fail("rmsnorm_backward: width %d over %d", C, 32 * RMSNORM_BWD3_COLS); }
    int chunks = (int)colsum_chunks(N), rows = colsum_rows(N);
    if (C <= 32 * RMSNORM_BWD2_COLS) {  // version 2
        size_t smem = (size_t)(BLOCK / 32) * C * sizeof(float);
        rmsnorm_backward_kernel2<<<chunks, BLOCK, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, rstd, N, C,
                                                                       rows, offset);
    } else {  // version 4, wider rows
        check_packable("rmsnorm_backward", C, dout, inp, w, dres, dres_x);
        rmsnorm_backward_kernel4<<<chunks, BLOCK, C * sizeof(float), main_stream>>>(dres, dres_x, partial, dout, inp, w,
                                                                                    rstd, N, C, rows, offset);
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
}

#endif  // VLA_CUDA_RMSNORM_CUH
