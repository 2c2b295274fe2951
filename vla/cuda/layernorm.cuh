/*
vla/cuda/layernorm.cuh: LayerNorm with weight and bias (SigLIP's layer_norm1/2 and post_layernorm),
forward (mean and rstd kept) and backward (the input's gradient, the weight's and the bias's through
the column sums).
*/
#ifndef VLA_CUDA_LAYERNORM_CUH
#define VLA_CUDA_LAYERNORM_CUH

#include "common.cuh"
#include "profiler.cuh"
#include "column_sum.cuh"

// ---- LayerNorm with weight and bias (SigLIP's layer_norm1/2 and post_layernorm)

#define LAYERNORM_EPS 1e-6f  // SigLIP's layer_norm_eps
// Both kernels keep values in registers (90 to 120 a thread): at most 512 threads (__launch_bounds__)
#define LAYERNORM_MAX_BLOCK 512

// out = (x - mean) rstd w + b per row of C; mean and rstd kept. One warp per row, 128-bit loads.
#define LAYERNORM_FWD2_VALS 64  // values of a row per lane
__global__ void __launch_bounds__(LAYERNORM_MAX_BLOCK) layernorm_forward_kernel2(floatX* out, float* mean, float* rstd,
                                                                                  const floatX* inp, const floatX* w,
                                                                                  const floatX* b, int N, int C) {
    const int PACKS = LAYERNORM_FWD2_VALS / x128::size;  // lane l holds packs l, l + 32, ...
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }
    const floatX* x = inp + (size_t)row * C;
    x128 xv[PACKS];
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < PACKS; j++) {
        int c = (lane + 32 * j) * x128::size;
        if (c < C) {
            xv[j] = load128(x + c);
            #pragma unroll
            for (int k = 0; k < x128::size; k++) { s += f32(xv[j].v[k]); }
        }
    }
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    #pragma unroll
    for (int j = 0; j < PACKS; j++) {
        if ((lane + 32 * j) * x128::size < C) {
            #pragma unroll
            for (int k = 0; k < x128::size; k++) {
                float d = f32(xv[j].v[k]) - m;
                v += d * d;
            }
        }
    }
    float r = rsqrtf(warp_sum(v) / (float)C + LAYERNORM_EPS);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    floatX* y = out + (size_t)row * C;
    #pragma unroll
    for (int j = 0; j < PACKS; j++) {
        int c = (lane + 32 * j) * x128::size;
        if (c < C) {
            x128 wv = load128(w + c), bv = load128(b + c), o;
            #pragma unroll
            for (int k = 0; k < x128::size; k++) {
                o.v[k] = fx((f32(xv[j].v[k]) - m) * r * f32(wv.v[k]) + f32(bv.v[k]));
            }
            store128(y + c, o);
        }
    }
}

// y = xh w + b with xh = (x - m) r, so with g = dy w (the gradient reaching xh):
//   dx_c = r (g_c - 1/C sum_j g_j - xh_c 1/C sum_j g_j xh_j),  dw_c = sum_rows dy_c xh_c,  db_c = sum_rows dy_c.
// dx into dres and dres_x; partial (2, gridDim.x, C): the block's dw, then db sums. One warp per row.
#define LAYERNORM_BWD2_VALS 32  // columns per lane: widths up to 1024
template <int VALS>
static __device__ __forceinline__ void layernorm_backward_rows(float* dres, floatX* dres_x, float* partial,
                                                               const floatX* dout, const floatX* inp, const floatX* w,
                                                               const float* mean, const float* rstd, int N, int C,
                                                               int rows_per_block) {
    typedef Packed128<float> f128;
    const int PACKS = VALS / x128::size;
    extern __shared__ float warp_sums[];  // (warps, C)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    float dw_acc[VALS], db_acc[VALS];
    #pragma unroll
    for (int j = 0; j < VALS; j++) { dw_acc[j] = 0.0f; db_acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0 + warp; n < r1; n += n_warps) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float m = mean[n], r = rstd[n], sum_g = 0.0f, sum_gxh = 0.0f;
        #pragma unroll
        for (int j = 0; j < PACKS; j++) {
            int c = (lane + 32 * j) * x128::size;
            if (c < C) {
                x128 xv = load128(x + c), dyv = load128(dy + c), wv = load128(w + c);
                #pragma unroll
                for (int k = 0; k < x128::size; k++) {
                    float g = f32(dyv.v[k]) * f32(wv.v[k]), xh = (f32(xv.v[k]) - m) * r;
                    sum_g += g;
                    sum_gxh += g * xh;
                }
            }
        }
        float mean_g = warp_sum(sum_g) / (float)C, mean_gxh = warp_sum(sum_gxh) / (float)C;
        #pragma unroll
        for (int j = 0; j < PACKS; j++) {
            int c = (lane + 32 * j) * x128::size;
            if (c < C) {
                x128 xv = load128(x + c), dyv = load128(dy + c), wv = load128(w + c), o;
                float* d = dres + (size_t)n * C + c;
                #pragma unroll
                for (int k0 = 0; k0 < x128::size; k0 += f128::size) {
                    f128 dv = load128(d + k0);
                    #pragma unroll
                    for (int i = 0; i < f128::size; i++) {
                        int k = k0 + i;
                        float dyk = f32(dyv.v[k]), xh = (f32(xv.v[k]) - m) * r;
                        dv.v[i] += r * (dyk * f32(wv.v[k]) - mean_g - xh * mean_gxh);
                        o.v[k] = fx(dv.v[i]);
                        dw_acc[j * x128::size + k] += dyk * xh;
                        db_acc[j * x128::size + k] += dyk;
                    }
                    store128(d + k0, dv);
                }
                store128(dres_x + (size_t)n * C + c, o);
            }
        }
    }
    for (int part = 0; part < 2; part++) {  // dw, then db through the same shared memory
        #pragma unroll
        for (int j = 0; j < PACKS; j++) {
            int c = (lane + 32 * j) * x128::size;
            if (c < C) {
                #pragma unroll
                for (int k = 0; k < x128::size; k++) {
                    warp_sums[warp * C + c + k] = part == 0 ? dw_acc[j * x128::size + k] : db_acc[j * x128::size + k];
                }
            }
        }
        __syncthreads();
        float* out = partial + ((size_t)part * gridDim.x + blockIdx.x) * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float s = 0.0f;
            for (int k = 0; k < n_warps; k++) { s += warp_sums[k * C + c]; }
            out[c] = s;
        }
        __syncthreads();  // every warp has read the dw sums before db overwrites them
    }
}

__global__ void __launch_bounds__(LAYERNORM_MAX_BLOCK) layernorm_backward_kernel2(float* dres, floatX* dres_x,
                                                                                   float* partial, const floatX* dout,
                                                                                   const floatX* inp, const floatX* w,
                                                                                   const float* mean, const float* rstd,
                                                                                   int N, int C, int rows_per_block) {
    layernorm_backward_rows<LAYERNORM_BWD2_VALS>(dres, dres_x, partial, dout, inp, w, mean, rstd, N, C, rows_per_block);
}

// Version 3: version 2 with 48 columns a lane, widths up to 1536 (pi0's SigLIP so400m, 1152), at most
// LAYERNORM_BWD3_BLOCK threads a block (its 96 sums a lane in registers)
#define LAYERNORM_BWD3_VALS 48
#define LAYERNORM_BWD3_BLOCK 256
__global__ void __launch_bounds__(LAYERNORM_BWD3_BLOCK) layernorm_backward_kernel3(float* dres, floatX* dres_x,
    float* partial, const floatX* dout, const floatX* inp, const floatX* w, const float* mean, const float* rstd,
    int N, int C, int rows_per_block) {
    layernorm_backward_rows<LAYERNORM_BWD3_VALS>(dres, dres_x, partial, dout, inp, w, mean, rstd, N, C, rows_per_block);
}

// Whether layernorm_forward_kernel2 takes these pointers, this width and this block size
static bool layernorm_forward2_fits(const floatX* out, const floatX* inp, const floatX* w, const floatX* b, int C,
                                    int block) {
    return packable(C, x128::size, out, inp, w) && packable(C, x128::size, b) && C <= 32 * LAYERNORM_FWD2_VALS &&
           block <= LAYERNORM_MAX_BLOCK;
}

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                              const floatX* b, int N, int C) {
    ProfOp prof_op("layernorm");
    if (!layernorm_forward2_fits(out, inp, w, b, C, BLOCK)) {
        vla_fail("layernorm_forward: width %d: the kernel takes 16-byte aligned rows of a multiple of %d values, up "
                 "to %d", C, x128::size, 32 * LAYERNORM_FWD2_VALS);
    }
    layernorm_forward_kernel2<<<ceil_div((size_t)N * 32, BLOCK), BLOCK, 0, main_stream>>>(out, mean, rstd, inp, w, b, N,
                                                                                          C);
    launchCheck();
}

// Whether layernorm_backward_kernel2 takes these (its warps' sums within 48 KB of shared memory)
static bool layernorm_backward2_fits(const float* dres, const floatX* dres_x, const floatX* dout, const floatX* inp,
                                     const floatX* w, int C, int block) {
    return packable(C, x128::size, dres, dres_x, dout) && packable(C, x128::size, inp, w) &&
           C <= 32 * LAYERNORM_BWD2_VALS && (size_t)(block / 32) * C * sizeof(float) <= 48 * 1024 &&
           block <= LAYERNORM_MAX_BLOCK;
}
// Version 3: the same rows, widths up to 32 * LAYERNORM_BWD3_VALS, blocks up to LAYERNORM_BWD3_BLOCK
static bool layernorm_backward3_fits(const float* dres, const floatX* dres_x, const floatX* dout, const floatX* inp,
                                     const floatX* w, int C, int block) {
    return packable(C, x128::size, dres, dres_x, dout) && packable(C, x128::size, inp, w) &&
           C <= 32 * LAYERNORM_BWD3_VALS && (size_t)(block / 32) * C * sizeof(float) <= 48 * 1024 &&
           block <= LAYERNORM_BWD3_BLOCK;
}

// dres += dx (dres_x its copy), dw += sum dy xh, db += sum dy. partial: 2 * colsum_chunks(N) * C floats
static void layernorm_backward(float* dres, floatX* dres_x, float* dw, float* db, float* partial, const floatX* dout,
                               const floatX* inp, const floatX* w, const float* mean, const float* rstd, int N, int C) {
    ProfOp prof_op("layernorm");
    bool v2 = layernorm_backward2_fits(dres, dres_x, dout, inp, w, C, BLOCK);
    if (!v2 && !layernorm_backward3_fits(dres, dres_x, dout, inp, w, C, BLOCK)) {
        vla_fail("layernorm_backward: width %d: the kernels take 16-byte aligned rows of a multiple of %d values, up "
                 "to %d", C, x128::size, 32 * LAYERNORM_BWD3_VALS);
    }
    int rows = colsum_rows(N), chunks = ceil_div(N, rows);
    size_t smem = (size_t)(BLOCK / 32) * C * sizeof(float);
    if (v2) {  // version 2 where it fits (SmolVLA's), 3 past its width of 1024
        layernorm_backward_kernel2<<<chunks, BLOCK, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean,
                                                                         rstd, N, C, rows);
    } else {
        layernorm_backward_kernel3<<<chunks, BLOCK, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean,
                                                                         rstd, N, C, rows);
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
    column_sum(db, partial + (size_t)chunks * C, chunks, C);
}

#endif  // VLA_CUDA_LAYERNORM_CUH
