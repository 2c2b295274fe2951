/*
vla/cuda/column_sum.cuh: column sums of a row-major (N, C) array in a fixed order, in two stages
(partial sums of row chunks, then their sum): the bias gradients (bias_backward) and the norms'
weight gradients. No atomics, so two runs give the same bits.
*/
#ifndef VLA_CUDA_COLUMN_SUM_CUH
#define VLA_CUDA_COLUMN_SUM_CUH

#include "common.cuh"

// partial (gridDim.y, C): column sums of x's row chunks; with column_sum_kernel, the bias gradient.
// 128-bit loads (C, ld multiples of x128::size), warps' sums added in warp order (dev/cuda/layernorm.cu's
// version 2; its version 1 has a thread a column).
#define COLPART2_WARPS 8
__global__ void __launch_bounds__(32 * COLPART2_WARPS) column_partial_kernel2(float* partial, const floatX* x, int N,
                                                                               int C, int ld, int rows_per_block) {
    __shared__ float sums[COLPART2_WARPS][32 * x128::size];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = (blockIdx.x * 32 + lane) * x128::size;
    int r0 = blockIdx.y * rows_per_block, r1 = min(r0 + rows_per_block, N);
    float s[x128::size];
    #pragma unroll
    for (int k = 0; k < x128::size; k++) { s[k] = 0.0f; }
    if (c < C) {
        for (int n = r0 + warp; n < r1; n += COLPART2_WARPS) {
            x128 v = load128(x + (size_t)n * ld + c);
            #pragma unroll
            for (int k = 0; k < x128::size; k++) { s[k] += f32(v.v[k]); }
        }
    }
    #pragma unroll
    for (int k = 0; k < x128::size; k++) { sums[warp][lane * x128::size + k] = s[k]; }
    __syncthreads();
    for (int i = threadIdx.x; i < 32 * x128::size; i += blockDim.x) {
        int col = blockIdx.x * 32 * x128::size + i;
        if (col >= C) { continue; }
        float t = 0.0f;
        for (int w = 0; w < COLPART2_WARPS; w++) { t += sums[w][i]; }
        partial[(size_t)blockIdx.y * C + col] = t;
    }
}

// out (C) += the sum of partial (n_chunks, C) over its chunks, warps' sums added in warp order
#define COLSUM_WARPS 32
__global__ void __launch_bounds__(32 * COLSUM_WARPS) column_sum_kernel(float* out, const float* partial, int n_chunks,
                                                                        int C) {
    __shared__ float sums[COLSUM_WARPS][32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, c = blockIdx.x * 32 + lane;
    float s = 0.0f;
    if (c < C) {
        for (int j = warp; j < n_chunks; j += COLSUM_WARPS) { s += partial[(size_t)j * C + c]; }
    }
    sums[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c < C) {
        float t = 0.0f;
        for (int w = 0; w < COLSUM_WARPS; w++) { t += sums[w][lane]; }
        out[c] += t;
    }
}

static const int CHUNK_ROWS = 32;  // rows per block of the two-stage column sums, at most

// Rows per chunk of the two-stage column sums: CHUNK_ROWS while that leaves 256 chunks, fewer for a small N
static int colsum_rows(size_t N) {
    size_t rows = N / 256;
    return rows >= (size_t)CHUNK_ROWS ? CHUNK_ROWS : rows <= (size_t)(BLOCK / 32) ? BLOCK / 32 : (int)rows;
}
static size_t colsum_chunks(size_t N) { return ceil_div(N, (size_t)colsum_rows(N)); }

static void column_sum(float* out, const float* partial, int n_chunks, int C) {
    column_sum_kernel<<<ceil_div(C, 32), 32 * COLSUM_WARPS, 0, main_stream>>>(out, partial, n_chunks, C);
    launchCheck();
}
// db (OC) += column sums of dout; partial: scratch of (colsum_chunks(N), OC) floats
static void bias_backward(float* db, float* partial, const floatX* dout, int N, int OC, int ld = 0) {
    int chunks = (int)colsum_chunks(N);
    ld = ld > 0 ? ld : OC;
    check_packable("bias_backward", OC, dout, NULL);
    if (ld % x128::size != 0) { vla_fail("bias_backward: a row stride of %d, not whole packs of %d", ld, x128::size); }
    dim3 grid(ceil_div(OC, 32 * x128::size), chunks);
    column_partial_kernel2<<<grid, 32 * COLPART2_WARPS, 0, main_stream>>>(partial, dout, N, OC, ld, colsum_rows(N));
    launchCheck();
    column_sum(db, partial, chunks, OC);
}

#endif  // VLA_CUDA_COLUMN_SUM_CUH
