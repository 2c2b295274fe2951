/*
train_vla.cu: the GPU trainer of SmolVLA (LeRobot 0.6.1's Vision-Language-Action policy), in CUDA
C++. Same model, same sections and same checkpoints as train_vla.c (the CPU reference); the
PyTorch oracle (dev/model.py) and LeRobot's own references (dev/lerobot) are the independent
copies that test_vla_gpu.cu checks this file against. The model section's comment has the shape
legend: NV images, V vision rows, P = B*Np prefix rows, R = B*H action rows, C / Ce / Cv widths,
D = NH*HS, KV = NKV*HS (GQA), Smax / Amax padded state / action dims.

Precision (PRECISION=BF16, the default): weights and activations in bf16 (floatX); fp32 master
weights, AdamW moments, gradients, residual-stream gradients, norm statistics, softmax and every
accumulation. PRECISION=FP32 makes floatX float, for testing against the oracle at 1e-4.
PRECISION=FP16 (GPUs without bf16: sm_70, sm_75) makes floatX IEEE half, the rest as in bf16, with
dynamic loss scaling: fp16's 5 exponent bits flush small gradients to zero, so the loss gradient is
scaled by S before the backward, unscaled with the mean's factor, and a step whose gradients hold
Inf/NaN is skipped and halves S (see "dynamic loss scaling" among the kernels).

Invariants worth knowing before reading:
- What trains is --train (expert, vlm, all: TRAIN_MODE_*): each tensor's trainable elements are
  a prefix of it, packed in table order into one domain (SmolOptDomain), which holds the floatX
  weights that train, the gradients, the master weights, the moments, the checkpoint's m and v,
  the gradient buckets and the ZeRO-1 shards. Frozen weights live on the device as floatX only.
- The VLM runs first over the prefix and keeps its keys/values per layer; the expert attends to
  them. Backward runs the expert first, which deposits gradients into the VLM's keys/values
  (dp_k, dp_v), then the VLM, as far down as something trains.
- The loss is LeRobot's mean over valid entries, taken over the whole optimizer step (every
  micro-step and rank): the passes compute sums, divided once every rank's are in.
- Linear weights are (out, in), row-major; y = x W^T + b. cuBLASLt is column-major, so a
  row-major (N, C) activation is a column-major (C, N) matrix: see matmul_forward (vla/matmul.cuh).
- Every reduction runs in a fixed order (no floating-point atomics): two runs give the same bits.

Reproduce the oracle's numbers (what test_vla_gpu checks):
  make test     (on a GPU: build/gpu/test_vla_gpu_bf16 build/test build/gpu/train_vla_bf16 --smolvla build/lerobot_ref;
                 without one, the same tests run under the CPU emulation in dev/cuda/emu)
  python3 dev/model.py -i build/test/a.bin -p tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 \
      -l 1e-3 -u 2 -w 0.1 -c 0.5 --train-mode all     (the losses of ./train_vla -p tiny -b 4 ...)
*/
#include "vla/common.h"
#include "vla/config.h"
#include "vla/shards.h"
#include "vla/dataset.h"
#include "vla/sampler.h"
#include "vla/loader.h"
#include "vla/loss_scale.h"
#include "vla/checkpoint.h"
#include "vla/cli.h"
#include "vla/schedule.h"
#include "vla/logging.h"
#include "vla/runs.h"
#include "vla/bootstrap.h"
#include "vla/policy.h"
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <mma.h>
#include <signal.h>
#if defined(MULTI_GPU)
#include <nccl.h>
#include <omp.h>
#endif

// ----------------------------------------------------------------------------
// utilities

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#elif defined(ENABLE_FP16)
typedef __half floatX;
#define PRECISION_NAME "fp16"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif

// the checks, floatX conversions, warp and block sums and 16-byte packs (vla/cuda_common.cuh)
#include "vla/cuda_common.cuh"

// PTX instructions as functions (mma.sync, cp.async, ldmatrix, ex2.approx); the emulation has its own
#include "vla/ptx.cuh"

// ----------------------------------------------------------------------------
// kernels: forward and backward of every operation

// x_t = t eps + (1 - t) a, the model's input; u = eps - a, the target. (B, H, A) each.
__global__ void flow_inputs_kernel(floatX* x_t, float* target, const float* actions, const float* eps,
                                   const float* t, int HA, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float tb = t[i / HA];
    x_t[i] = fx(tb * eps[i] + (1.0f - tb) * actions[i]);
    target[i] = eps[i] - actions[i];
}

// out = x / sqrt(mean(x^2) + eps) * (offset + w), rstd kept: offset 0 is Llama's norm (SmolVLA), 1
// Gemma's (pi0, whose weight is the scale's distance from 1). One warp per row of C.
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* w, int N, int C,
                                       float eps, float offset) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }  // whole warps leave together
    const floatX* x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = f32(x[c]);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / (float)C + eps);
    if (lane == 0) { rstd[row] = r; }
    floatX* y = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) { y[c] = fx(f32(x[c]) * r * (offset + f32(w[c]))); }
}

// Version 2: 128-bit loads and stores; version 1 takes the widths that are not multiples of x128::size.
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
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_kernel2(float* dres, floatX* dres_x, float* dw_partial, const floatX* dout,
                                         const floatX* inp, const floatX* w, const float* rstd, int N, int C,
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

// Version 3 backward: train_vla.cu's rmsnorm_backward_kernel2 (a warp per row, scalar loads, each
// lane's dw sums in registers) with the input gradient through offset + w, 64 columns a lane and
// the warps' sums added by rmsnorm_dw_in_warp_order. Shared memory: C floats.
__global__ void __launch_bounds__(RMSNORM_MAX_BLOCK) rmsnorm_backward_kernel3(float* dres, floatX* dres_x,
                                                                               float* dw_partial, const floatX* dout,
                                                                               const floatX* inp, const floatX* w,
                                                                               const float* rstd, int N, int C,
                                                                               int rows_per_block, float offset) {
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
        for (int j = 0; j < RMSNORM_BWD3_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) { dot += f32(dy[c]) * (f32(w[c]) + offset) * f32(x[c]); }
        }
        float k = warp_sum(dot) * r * r * r / (float)C;
        #pragma unroll
        for (int j = 0; j < RMSNORM_BWD3_COLS; j++) {
            int c = lane + 32 * j;
            if (c < C) {
                float xv = f32(x[c]), dyv = f32(dy[c]);
                float g = dres[(size_t)n * C + c] + r * (f32(w[c]) + offset) * dyv - k * xv;
                dres[(size_t)n * C + c] = g;
                dres_x[(size_t)n * C + c] = fx(g);
                acc[j] += dyv * xv * r;
            }
        }
    }
    rmsnorm_dw_in_warp_order<1>(dw_partial, dw_row, acc, C);
}

// Version 4 backward: version 3 with 128-bit loads and stores (dres two or one 16-byte packs of
// fp32 per pack of floatX); C a multiple of x128::size, rows 16-byte aligned
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

// partial (gridDim.y, C): column sums of x's row chunks; with column_sum_kernel, the bias gradient.
__global__ void column_partial_kernel(float* partial, const floatX* x, int N, int C, int ld, int rows_per_block) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    int r0 = blockIdx.y * rows_per_block, r1 = min(r0 + rows_per_block, N);
    float s = 0.0f;
    for (int n = r0; n < r1; n++) { s += f32(x[(size_t)n * ld + c]); }
    partial[(size_t)blockIdx.y * C + c] = s;
}

// Version 2: 128-bit loads (C, ld multiples of x128::size), warps' sums added in warp order.
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

// ---- attention: the softmax backward's shared term (SmolVLA's GQA kernels below)

// delta (B, NH, Tq): delta_i = sum_j P_ij dP_ij = rowsum(dO_i * O_i) since O = P V. Warp per (row, head).
__global__ void attention_delta_kernel(float* delta, const floatX* dout, const floatX* out, int rows, int Tq,
                                       int NH, int HS) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows * NH) { return; }
    int h = warp % NH, row = warp / NH;
    size_t at = (size_t)row * NH * HS + (size_t)h * HS;
    float s = 0.0f;
    for (int c = lane; c < HS; c += 32) { s += f32(dout[at + c]) * f32(out[at + c]); }
    s = warp_sum(s);
    if (lane == 0) { delta[((size_t)(row / Tq) * NH + h) * Tq + row % Tq] = s; }
}

// Version 2: 128-bit loads, HS / x128::size lanes per (row, head), summed by xor shuffles
__global__ void attention_delta_kernel2(float* delta, const floatX* dout, const floatX* out, int rows, int Tq, int NH,
                                        int HS) {
    int lanes = HS / x128::size;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, pair = idx / lanes;  // pair: (row, head)
    bool live = pair < (size_t)rows * NH;
    float s = 0.0f;
    if (live) {
        size_t at = pair * HS + idx % lanes * x128::size;  // ((row, head) rows of HS)
        x128 d = load128(dout + at), o = load128(out + at);
        #pragma unroll
        for (int k = 0; k < x128::size; k++) { s += f32(d.v[k]) * f32(o.v[k]); }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) { s += __shfl_xor_sync(0xffffffffu, s, offset); }
    if (live && idx % lanes == 0) {
        size_t row = pair / NH, h = pair % NH;
        delta[(row / Tq * NH + h) * Tq + row % Tq] = s;
    }
}

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

// a_emb (R, 2da) = [a_in (R, da), sin/cos time embedding (da)], periods geometric 4e-3..4.0, in double
__global__ void action_embed_kernel(floatX* a_emb, const floatX* a_in, const float* t, int B, int H, int da) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * H * 2 * da) { return; }
    int col = (int)(idx % (2 * da));
    size_t row = idx / (2 * da);
    if (col < da) {
        a_emb[idx] = a_in[row * da + col];
        return;
    }
    int half = da / 2, k = (col - da) % half;
    double fraction = half > 1 ? (double)k / (double)(half - 1) : 0.0;
    double period = 4e-3 * pow(4.0 / 4e-3, fraction);
    double angle = 2.0 * 3.141592653589793 * (double)t[row / H] / period;
    a_emb[idx] = fx((float)(col - da < half ? sin(angle) : cos(angle)));
}

// out (B * count, C) = rows first .. first+count-1 of every sample of x (B, T, C)
__global__ void gather_rows_kernel(floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[idx] = x[((row / count) * T + first + row % count) * C + idx % C];
}

// dpos (NI, d) += the image rows of dx (B, Np, d), summed over samples in order
__global__ void pos_emb_backward_kernel(float* dpos, const float* dx, int B, int NI, int Np, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)NI * d) { return; }
    float s = 0.0f;
    for (int b = 0; b < B; b++) { s += dx[(size_t)b * Np * d + idx]; }
    dpos[idx] += s;
}

// out = (sum of partial in order, in double) * scale, or its sqrt; added to out when `accumulate`.
__global__ void sum_finalize_kernel(float* out, const float* partial, int n, double scale, int take_sqrt, int accumulate) {
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
            for (int k = 0; k < x128::size; k++) { o.v[k] = fx((f32(xv[j].v[k]) - m) * r * f32(wv.v[k]) + f32(bv.v[k])); }
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
                                                                                    float* partial, const floatX* dout,
                                                                                    const floatX* inp, const floatX* w,
                                                                                    const float* mean, const float* rstd,
                                                                                    int N, int C, int rows_per_block) {
    layernorm_backward_rows<LAYERNORM_BWD3_VALS>(dres, dres_x, partial, dout, inp, w, mean, rstd, N, C, rows_per_block);
}

// ---- SwiGLU, silu(gate) * up (the Llama MLP of the VLM and the expert)

// For gates far below zero e^-x overflows to inf and both give 0 (not NaN): x / inf and 0 (1 + x).
static __device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

static __device__ __forceinline__ float silu_grad(float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

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

// ---- stored frames of any size resized with padding (LeRobot's resize_with_pad)

// resize_with_pad at the model's size S for h x w frames: resized size, padding, torch's scales
typedef struct {
    int h, w;                 // stored frame
    int S;                    // the model's square image size
    int rh, rw;               // resized (keeping the aspect ratio), at most S
    int pad_top, pad_left;    // rows above and columns to the left: S - rh and S - rw, or half of them (centred)
    float scale_h, scale_w;   // source pixels per resized pixel: h / rh and w / rw in float, as torch
} ResizePad;

// torch's bilinear source index, align_corners=False: pixel d reads i0, i1 with weight l on i1.
// One fused multiply-add as torch does (rounding first moves src by an ulp); min keeps reads inside.
static __device__ __forceinline__ void resize_source(int d, float scale, int in, int* i0, int* i1, float* l) {
    float src = fmaxf(fmaf(scale, (float)d + 0.5f, -0.5f), 0.0f);
    int i = min((int)src, in - 1);  // src >= 0: truncation is floor
    *i0 = i;
    *i1 = i + (i < in - 1 ? 1 : 0);
    *l = src - (float)i;
}

// Channel c of the bilinear blend of four taps of an (h, w, 3) u8 frame, in [0, 1], in torch's order
static __device__ __forceinline__ float bilinear_u8(const uint8_t* f, int w, int c, int y0, int y1, float ly, int x0,
                                                    int x1, float lx) {
    float p00 = (float)f[((size_t)y0 * w + x0) * 3 + c] / 255.0f, p01 = (float)f[((size_t)y0 * w + x1) * 3 + c] / 255.0f;
    float p10 = (float)f[((size_t)y1 * w + x0) * 3 + c] / 255.0f, p11 = (float)f[((size_t)y1 * w + x1) * 3 + c] / 255.0f;
    return (1.0f - ly) * ((1.0f - lx) * p00 + lx * p01) + ly * ((1.0f - lx) * p10 + lx * p11);
}

// out: n_img images (3, S, S); frames: n_img (h, w, 3) u8. x128::size pixels of a row per thread.
__global__ void resize_pad_kernel2(floatX* out, const uint8_t* frames, ResizePad r, int n_img, size_t in_stride,
                                   size_t out_stride) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int packs = r.S / x128::size;
    if (idx >= (size_t)n_img * r.S * packs) { return; }
    int xs = (int)(idx % packs) * x128::size, y = (int)(idx / packs % r.S);
    size_t img = idx / ((size_t)packs * r.S);
    const uint8_t* f = frames + img * in_stride;
    int yr = y - r.pad_top, y0 = 0, y1 = 0;
    bool copy = r.rh == r.h && r.rw == r.w, row_padded = y < r.pad_top || yr >= r.rh;
    float ly = 0.0f;
    if (!row_padded && !copy) { resize_source(yr, r.scale_h, r.h, &y0, &y1, &ly); }
    x128 o[3];
    #pragma unroll
    for (int k = 0; k < x128::size; k++) {
        int x = xs + k, xr = x - r.pad_left;
        float v[3] = {0.0f, 0.0f, 0.0f};
        if (!row_padded && x >= r.pad_left && xr < r.rw) {
            if (copy) {
                const uint8_t* p = f + ((size_t)yr * r.w + xr) * 3;
                #pragma unroll
                for (int c = 0; c < 3; c++) { v[c] = (float)p[c] / 255.0f; }
            } else {
                int x0, x1;
                float lx;
                resize_source(xr, r.scale_w, r.w, &x0, &x1, &lx);
                #pragma unroll
                for (int c = 0; c < 3; c++) { v[c] = bilinear_u8(f, r.w, c, y0, y1, ly, x0, x1, lx); }
            }
        }
        #pragma unroll
        for (int c = 0; c < 3; c++) { o[c].v[k] = fx(v[c] * 2.0f - 1.0f); }
    }
    size_t plane = (size_t)r.S * r.S;
    #pragma unroll
    for (int c = 0; c < 3; c++) { store128(out + img * out_stride + c * plane + (size_t)y * r.S + xs, o[c]); }
}

// ---- attention as LeRobot computes it (GQA, per-token block mask, finfo.min fill): dev/cuda/attention_smolvla.cu

// One attention call: Tq queries of NH heads against nk = Nk0 + Nk1 keys/values of NKV heads, the
// first Nk0 from k0/v0, the rest from k1/v1. GQA: query head h reads kv head h / (NH / NKV).
// The mask as make_att_2d_masks derives it: block[t] is token t's cumulative block id or -1 for a
// pad; key j is visible to query i (token q0 + i) iff 0 <= block[j] <= block[q0 + i]. NULL: no mask.
typedef struct {
    const floatX* k0; const floatX* v0;  // (B, Nk0, NKV*HS) keys and values 0 .. Nk0-1
    const floatX* k1; const floatX* v1;  // (B, Nk1, NKV*HS) keys Nk0 .. nk-1, NULL when Nk1 = 0
    const int* block;                    // (B, Nt) per-token block ids, -1 for pads; NULL: no mask
    int B, NH, NKV, HS;
    int Tq, q0;                          // queries per sample; the token of query 0 in block
    int Nk0, Nk1, Nt;                    // Nt: tokens per sample in block (q0 + Tq and nk at most Nt)
} GqaAttn;

// LeRobot fills masked scores with finfo(float32).min, not -inf: a masked key gets exp = 0 where
// a query sees some key; where it sees none, the softmax is uniform (output the mean of the values,
// lse -FLT_MAX). The backward reads that mark: dv gets dO / nk at every key, q and k nothing.
#define ATTN_NO_KEY_LSE (-FLT_MAX)

static __host__ __device__ __forceinline__ int gqa_n_keys(const GqaAttn& a) { return a.Nk0 + a.Nk1; }

// offset of head g of key (value, gradient) j of sample b: in the first tensor below Nk0, else the second
static __host__ __device__ __forceinline__ size_t gqa_key_at(const GqaAttn& a, int b, int j, int g) {
    size_t row = j < a.Nk0 ? (size_t)b * a.Nk0 + j : (size_t)b * a.Nk1 + (j - a.Nk0);
    return row * a.NKV * a.HS + (size_t)g * a.HS;
}

// block ids of query i and key j of sample b; without a mask every query sees every key
static __device__ __forceinline__ int gqa_query_block(const GqaAttn& a, int b, int i) {
    return a.block != nullptr ? a.block[(size_t)b * a.Nt + a.q0 + i] : INT_MAX;
}
static __device__ __forceinline__ int gqa_key_block(const GqaAttn& a, int b, int j) {
    return a.block != nullptr ? a.block[(size_t)b * a.Nt + j] : 0;
}
static __device__ __forceinline__ bool gqa_sees(int query_block, int key_block) {
    return key_block >= 0 && key_block <= query_block;
}

// Versions 1 and 5 (below): one warp per (sample, head, query), online softmax, VALS values of a head
// a lane (head sizes up to 32 VALS). out (B, Tq, NH*HS), lse (B, NH, Tq).
template <int VALS>
static __device__ __forceinline__ void gqa_attention_forward_warp(floatX* out, float* lse, const floatX* q, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS;
    float qv[VALS], acc[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        qv[u] = c < a.HS ? f32(q[row + c]) : 0.0f;
        acc[u] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < nk; j++) {
        if (!gqa_sees(qb, gqa_key_block(a, b, j))) { continue; }  // the same for the whole warp
        const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + gqa_key_at(a, b, j, g);
        const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
        float s = 0.0f;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { s += qv[u] * f32(kj[c]); } }
        s = warp_sum(s) * scale;
        float m_new = fmaxf(mx, s), corr = expf(mx - m_new), p = expf(s - m_new);
        sum = sum * corr + p;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) { acc[u] = acc[u] * corr + (c < a.HS ? p * f32(vj[c]) : 0.0f); }
        mx = m_new;
    }
    bool seen = sum > 0.0f;  // sum >= 1 once a key is visible: the maximum's own term
    if (!seen) {  // no key visible: the uniform softmax of the fills, the mean of every value
        for (int j = 0; j < nk; j++) {
            const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { acc[u] += f32(vj[c]); } }
        }
        sum = (float)nk;
    }
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { out[row + c] = fx(acc[u] / sum); } }
    if (lane == 0) { lse[((size_t)b * a.NH + h) * a.Tq + i] = seen ? mx + logf(sum) : ATTN_NO_KEY_LSE; }
}

// Versions 1 and 5 backward, query side: P = exp(scale S - lse), dP = dO V^T, dS = P * (dP - delta),
// dq = scale dS K. One warp per (sample, head, query); dq (B, Tq, NH*HS) overwritten.
template <int VALS>
static __device__ __forceinline__ void gqa_attention_backward_dq_warp(floatX* dq, const floatX* dout, const floatX* q,
                                                                     const float* lse, const float* delta, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS, stat = ((size_t)b * a.NH + h) * a.Tq + i;
    float l = lse[stat], dl = delta[stat];
    float qv[VALS], dov[VALS], acc[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        qv[u] = c < a.HS ? f32(q[row + c]) : 0.0f;
        dov[u] = c < a.HS ? f32(dout[row + c]) : 0.0f;
        acc[u] = 0.0f;
    }
    for (int j = 0; j < nk; j++) {
        if (!gqa_sees(qb, gqa_key_block(a, b, j))) { continue; }
        const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + gqa_key_at(a, b, j, g);
        const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
        float s = 0.0f, dp = 0.0f;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) {
            if (c < a.HS) { s += qv[u] * f32(kj[c]); dp += dov[u] * f32(vj[c]); }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        float p = expf(s * scale - l);
        float ds = p * (dp - dl) * scale;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { acc[u] += ds * f32(kj[c]); } }
    }
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { dq[row + c] = fx(acc[u]); } }
}

// Versions 1 and 5 backward, key side: dv += P^T dO, dk += scale dS^T Q. One warp per (sample, kv head, key);
// dk0/dv0 (B, Nk0, NKV*HS), dk1/dv1 (B, Nk1, NKV*HS) fp32, accumulated in a fixed order.
template <int VALS>
static __device__ __forceinline__ void gqa_attention_backward_dkdv_warp(float* dk0, float* dv0, float* dk1, float* dv1,
                                                                       const floatX* dout, const floatX* q, const float* lse,
                                                                       const float* delta, GqaAttn a) {
    int nk = gqa_n_keys(a);
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NKV * nk) { return; }
    int j = warp % nk, g = warp / nk % a.NKV, b = warp / (nk * a.NKV);
    int G = a.NH / a.NKV, kb = gqa_key_block(a, b, j);
    float scale = 1.0f / sqrtf((float)a.HS), uniform = 1.0f / (float)nk;
    size_t at = gqa_key_at(a, b, j, g);
    const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + at;
    const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + at;
    float kv[VALS], vv[VALS], dk[VALS], dv[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        kv[u] = c < a.HS ? f32(kj[c]) : 0.0f;
        vv[u] = c < a.HS ? f32(vj[c]) : 0.0f;
        dk[u] = 0.0f;
        dv[u] = 0.0f;
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i = 0; i < a.Tq; i++) {
            size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS, stat = ((size_t)b * a.NH + h) * a.Tq + i;
            float l = lse[stat];
            if (l == ATTN_NO_KEY_LSE) {  // a query that sees no key: P = 1/nk everywhere, no dS
                #pragma unroll
                for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                    if (c < a.HS) { dv[u] += uniform * f32(dout[row + c]); }
                }
                continue;
            }
            if (!gqa_sees(gqa_query_block(a, b, i), kb)) { continue; }
            float s = 0.0f, dp = 0.0f;
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                if (c < a.HS) { s += f32(q[row + c]) * kv[u]; dp += f32(dout[row + c]) * vv[u]; }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            float p = expf(s * scale - l);
            float ds = p * (dp - delta[stat]) * scale;
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                if (c < a.HS) { dv[u] += p * f32(dout[row + c]); dk[u] += ds * f32(q[row + c]); }
            }
        }
    }
    float* dkj = (j < a.Nk0 ? dk0 : dk1) + at;
    float* dvj = (j < a.Nk0 ? dv0 : dv1) + at;
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { dkj[c] += dk[u]; dvj[c] += dv[u]; } }
}

// Version 1: 4 values of a head a lane (head sizes up to 128). Version 5: 8 (up to 256: pi0's Gemma
// layers, 8 query heads of 256 on one kv head), at most ATT5_MAX_BLOCK threads a block (ptxas gives
// its backward 68 (dq) and 80 (dk/dv) registers on sm_90 unbounded: 1,024 threads would not launch;
// bounded at 256 nothing spills). The launchers take version 5 past head size 128.
#define ATT5_VALS 8
#define ATT5_MAX_BLOCK 256
__global__ void gqa_attention_forward_kernel1(floatX* out, float* lse, const floatX* q, GqaAttn a) {
    gqa_attention_forward_warp<4>(out, lse, q, a);
}
__global__ void gqa_attention_backward_dq_kernel1(floatX* dq, const floatX* dout, const floatX* q, const float* lse,
                                                  const float* delta, GqaAttn a) {
    gqa_attention_backward_dq_warp<4>(dq, dout, q, lse, delta, a);
}
__global__ void gqa_attention_backward_dkdv_kernel1(float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                                    const floatX* q, const float* lse, const float* delta, GqaAttn a) {
    gqa_attention_backward_dkdv_warp<4>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_forward_kernel5(floatX* out, float* lse, const floatX* q,
                                                                                GqaAttn a) {
    gqa_attention_forward_warp<ATT5_VALS>(out, lse, q, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_backward_dq_kernel5(floatX* dq, const floatX* dout,
                                                                                    const floatX* q, const float* lse,
                                                                                    const float* delta, GqaAttn a) {
    gqa_attention_backward_dq_warp<ATT5_VALS>(dq, dout, q, lse, delta, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_backward_dkdv_kernel5(float* dk0, float* dv0, float* dk1,
                                                                                      float* dv1, const floatX* dout,
                                                                                      const floatX* q, const float* lse,
                                                                                      const float* delta, GqaAttn a) {
    gqa_attention_backward_dkdv_warp<ATT5_VALS>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
}


#if defined(ENABLE_FP16) || (defined(TESTING) && !defined(ENABLE_FP32))
// fp16 GPUs (sm_70, sm_75) have no bf16 mma.sync for version 4: version 2 runs on WMMA instead
#include "vla/attention_wmma.cuh"
#endif

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
// Version 4 (bf16, head sizes multiples of 8 up to 64): flash attention through mma.sync m16n8k16.
// PTX documents fragment layouts (WMMA does not), so scores, probabilities and outputs stay in
// registers. 4 warps own 64 rows (128 in large forward calls); the other side streams through shared
// memory, two cp.async stages. In a 16x8 accumulator lane 4 g + t holds rows g, g + 8 at columns 2t,
// 2t + 1: a row's max or sum is two quad shuffles. The backward: dq and dk/dv kernels, no atomics.
#define ATT4_ROWS 64
#define ATT4_THREADS 128
// unmasked dk/dv blocks a multiprocessor holds: 3, not ptxas's 2 at 178 registers (three spill to L1)
#define ATT4_DKDV_BLOCKS 3

// two neighbouring floatX as one register (what store_x2 stores), the first in the low half
static __device__ __forceinline__ uint32_t pack_f2(float lo, float hi) {
    floatX x[2] = {fx(lo), fx(hi)};
    uint16_t l, h;
    memcpy(&l, &x[0], 2);
    memcpy(&h, &x[1], 2);
    return (uint32_t)l | (uint32_t)h << 16;
}

// tile (64, HSP + 8) <- rows first.. of one head (then head1's), zeros past; HSP + 8 avoids bank conflicts.
template <int HSP>
static __device__ void att4_load_tile(floatX* tile, const floatX* head, int first, int n_rows, int HS, size_t D,
                                      const floatX* head1 = NULL, int n_rows1 = 0) {
    const int LD = HSP + 8, pieces = HSP / 8;
    for (int e = threadIdx.x; e < ATT4_ROWS * pieces; e += blockDim.x) {
        int r = e / pieces, c = e % pieces * 8, row = first + r;
        floatX* dst = tile + r * LD + c;
        if (row < n_rows && c < HS) {
            cp_async16(dst, head + (size_t)row * D + c);
        } else if (row >= n_rows && row < n_rows + n_rows1 && c < HS) {
            cp_async16(dst, head1 + (size_t)(row - n_rows) * D + c);
        } else {
            x128 zero;
            #pragma unroll
            for (int k = 0; k < x128::size; k++) { zero.v[k] = fx(0.0f); }
            store128(dst, zero);
        }
    }
}

// Fragments from a row-major floatX tile at p: the A operand (16x16) in a[0..3]'s quarter order
static __device__ __forceinline__ void att4_frag_a(uint32_t* a, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<false>(a, p + (l % 8 + 8 * (m % 2)) * ld + 8 * (m / 2));
}
// the B operands (16x8) of two 8-column tiles whose columns are the tile's rows: b[0..1], b[2..3]
static __device__ __forceinline__ void att4_frag_b2_rows(uint32_t* b, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<false>(b, p + (l % 8 + 8 * (m / 2)) * ld + 8 * (m % 2));
}
// the same pair as the tile holds it, B(k, n) = p[k ld + n]: transposed loads
static __device__ __forceinline__ void att4_frag_b2_cols(uint32_t* b, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<true>(b, p + (l % 8 + 8 * (m % 2)) * ld + 8 * (m / 2));
}

// s[mt] (16 x 64) = A[mt] (16 x HSP) times the tile's 64 rows transposed; each B fragment serves all MT
template <int HSP, int MT = 1>
static __device__ __forceinline__ void att4_products(float (*s)[ATT4_ROWS / 8][4], const uint32_t (*af)[HSP / 16][4],
                                                     const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j++) { s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f; }
    }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j += 2) {
        #pragma unroll
        for (int kk = 0; kk < HSP / 16; kk++) {
            uint32_t bf[4];
            att4_frag_b2_rows(bf, tile + j * 8 * LD + kk * 16, LD);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(s[mt][j], af[mt][kk], bf);
                mma_16816(s[mt][j + 1], af[mt][kk], bf + 2);
            }
        }
    }
}

// The same for one row tile, A from shared memory a k step at a time (the dk/dv register budget)
template <int HSP>
static __device__ __forceinline__ void att4_products_smem(float (*s)[4], const floatX* a, const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) { s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f; }
    #pragma unroll
    for (int kk = 0; kk < HSP / 16; kk++) {
        uint32_t af[4];
        att4_frag_a(af, a + kk * 16, LD);
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j += 2) {
            uint32_t bf[4];
            att4_frag_b2_rows(bf, tile + j * 8 * LD + kk * 16, LD);
            mma_16816(s[j], af, bf);
            mma_16816(s[j + 1], af, bf + 2);
        }
    }
}

// acc[mt] (16 x HSP) += P[mt] (16 x 64: accumulators p[mt] rounded to floatX) times the tile (64 x HSP)
template <int HSP, int MT = 1>
static __device__ __forceinline__ void att4_accumulate(float (*acc)[HSP / 8][4], const float (*p)[ATT4_ROWS / 8][4],
                                                       const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int kk = 0; kk < ATT4_ROWS / 16; kk++) {
        uint32_t pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const float* lo = p[mt][2 * kk];
            const float* hi = p[mt][2 * kk + 1];
            pa[mt][0] = pack_f2(lo[0], lo[1]);
            pa[mt][1] = pack_f2(lo[2], lo[3]);
            pa[mt][2] = pack_f2(hi[0], hi[1]);
            pa[mt][3] = pack_f2(hi[2], hi[3]);
        }
        #pragma unroll
        for (int n = 0; n < HSP / 8; n += 2) {
            uint32_t bf[4];
            att4_frag_b2_cols(bf, tile + kk * 16 * LD + n * 8, LD);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][n], pa[mt], bf);
                mma_16816(acc[mt][n + 1], pa[mt], bf + 2);
            }
        }
    }
}

static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#define LOG2E_F 1.4426950408889634f

// shared memory of version 4: six (64, HSP + 8) tiles, two stages of 64 lse/delta and of 64 block ids
template <int HSP>
static size_t gqa_attention_smem4(void) {
    return 6 * (size_t)ATT4_ROWS * (HSP + 8) * sizeof(floatX) + 4 * ATT4_ROWS * sizeof(float) + 2 * ATT4_ROWS * sizeof(int);
}
template <int HSP>
static __device__ __forceinline__ int* att4_block_ids(float* smem) {
    return (int*)((floatX*)smem + 6 * ATT4_ROWS * (HSP + 8) + 8 * ATT4_ROWS);
}

// ids (64) <- block ids of rows first.. of sample b (token offset + row); -1 past n: seen by nothing
static __device__ __forceinline__ void att4_load_block_ids(int* ids, const GqaAttn& a, int b, int first, int offset,
                                                           int n) {
    for (int i = threadIdx.x; i < ATT4_ROWS; i += blockDim.x) {
        int t = first + i;
        ids[i] = t < n ? a.block[(size_t)b * a.Nt + offset + t] : -1;
    }
}

// head h of sample b of a (B, rows, D) tensor: where its row 0 starts
static __device__ __forceinline__ const floatX* att4_head(const floatX* x, int b, int rows, int h, int HS, size_t D) {
    return x + (size_t)b * rows * D + (size_t)h * HS;
}

// Tile `next` of x and y into stage next % 2, committed; that stage was last read before a barrier.
template <int HSP>
static __device__ __forceinline__ void att4_prefetch(floatX* stages, const floatX* x, const floatX* y, int next,
                                                     int n_tiles, int n_rows, int HS, size_t D, const floatX* x1 = NULL,
                                                     const floatX* y1 = NULL, int n_rows1 = 0) {
    if (next >= n_tiles) { return; }
    const int TILE = ATT4_ROWS * (HSP + 8);
    floatX* to = stages + (next % 2) * 2 * TILE;
    att4_load_tile<HSP>(to, x, next * ATT4_ROWS, n_rows, HS, D, x1, n_rows1);
    att4_load_tile<HSP>(to + TILE, y, next * ATT4_ROWS, n_rows, HS, D, y1, n_rows1);
    cp_async_commit();
}

// kv head g of sample b: its row 0 in the first key tensor (k0, v0) and in the second (NULL: none)
static __device__ __forceinline__ const floatX* att4_kv0(const floatX* x, const GqaAttn& a, int b, int g) {
    return x + (size_t)b * a.Nk0 * a.NKV * a.HS + (size_t)g * a.HS;
}
static __device__ __forceinline__ const floatX* att4_kv1(const floatX* x, const GqaAttn& a, int b, int g) {
    return a.Nk1 > 0 ? x + (size_t)b * a.Nk1 * a.NKV * a.HS + (size_t)g * a.HS : NULL;
}

// key tile `next` of kv head g: keys, values (and block ids when masked) into stage next % 2
template <int HSP, bool MASK>
static __device__ __forceinline__ void att4_prefetch_keys(floatX* KV, int* kblk, const GqaAttn& a, int b, int g,
                                                          int next, int n_tiles) {
    if (next >= n_tiles) { return; }
    att4_prefetch<HSP>(KV, att4_kv0(a.k0, a, b, g), att4_kv0(a.v0, a, b, g), next, n_tiles, a.Nk0, a.HS,
                       (size_t)a.NKV * a.HS, att4_kv1(a.k1, a, b, g), att4_kv1(a.v1, a, b, g), a.Nk1);
    if (MASK) { att4_load_block_ids(kblk + (next % 2) * ATT4_ROWS, a, b, next * ATT4_ROWS, 0, gqa_n_keys(a)); }
}

// acc's row r <- the mean of all nk values of kv head g: the output of a query that sees no key
template <int HSP>
static __device__ void att4_mean_values(float (*acc)[4], int r, const GqaAttn& a, int b, int g) {
    int t = threadIdx.x % 4, nk = gqa_n_keys(a);
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        int c = n * 8 + 2 * t;
        float s0 = 0.0f, s1 = 0.0f;
        if (c < a.HS) {
            for (int j = 0; j < nk; j++) {
                const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g) + c;
                s0 += f32(vj[0]);
                s1 += f32(vj[1]);
            }
        }
        acc[n][2 * r] = s0 / (float)nk;
        acc[n][2 * r + 1] = s1 / (float)nk;
    }
}

// a warp's acc (16 x HSP) into rows row0.. (below T) as floatX, rows g and g + 8 times mul[0], mul[1]
template <int HSP>
static __device__ __forceinline__ void att4_store_rows(floatX* head, const float (*acc)[4], int row0, int T, int HS,
                                                       size_t D, const float* mul) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        if (row >= T) { continue; }
        #pragma unroll
        for (int n = 0; n < HSP / 8; n++) {
            int c = n * 8 + 2 * t;
            if (c < HS) { store_x2(head + (size_t)row * D + c, pack_f2(acc[n][2 * r] * mul[r], acc[n][2 * r + 1] * mul[r])); }
        }
    }
}

// whether key tile jt needs masking: every tile of a masked call, else a last partial one
template <bool MASK>
static __device__ __forceinline__ bool att4_has_holes(int jt, int N) { return MASK || (jt + 1) * ATT4_ROWS > N; }

// s <- -inf where the query does not see the key (MASK: block ids; else keys from N on): exp gives 0
template <bool MASK>
static __device__ __forceinline__ void att4_mask_scores(float (*s)[4], const int* qb, const int* kb, int key0, int N) {
    int t = threadIdx.x % 4;
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            int col = j * 8 + 2 * t + i % 2;
            bool seen = MASK ? gqa_sees(qb[i / 2], kb[col]) : key0 + col < N;  // (kb: -1 past N)
            if (!seen) { s[j][i] = -INFINITY; }
        }
    }
}

// The online softmax over one key tile: s (16 x 64) -> 2^(s sl2 - m), with m (running max of rows g,
// g + 8) and l (this lane's part of the sum) updated and o rescaled by 2^(m_old - m_new).
template <int HSP, bool MASK, bool HOLES>
static __device__ __forceinline__ void att4_online_softmax(float (*s)[4], float (*o)[4], float* m, float* l, float sl2,
                                                           const int* qb, const int* kb, int key0, int N) {
    if (HOLES) { att4_mask_scores<MASK>(s, qb, kb, key0, N); }
    float mx[2] = {-INFINITY, -INFINITY};  // the rows' largest raw scores
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { mx[i / 2] = fmaxf(mx[i / 2], s[j][i]); }
    }
    float corr[2], base[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {  // (no key seen yet: m stays -inf, base 0, no NaN)
        float mnew = fmaxf(m[r], quad_max(mx[r]) * sl2);
        base[r] = mnew == -INFINITY ? 0.0f : mnew;
        corr[r] = fast_exp2(m[r] - base[r]);
        m[r] = mnew;
        l[r] *= corr[r];
    }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {  // 2^(s sl2 - base): one FFMA, one MUFU.EX2
            s[j][i] = fast_exp2(fmaf(s[j][i], sl2, -base[i / 2]));
            l[i / 2] += s[j][i];
        }
    }
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { o[n][i] *= corr[i / 2]; }
    }
}

// Version 4 forward: 64 MT queries of one (sample, head) a block, softmax in base 2; MT = 2 for large calls.
template <int HSP, int MT, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS) gqa_attention_forward_kernel4(floatX* out, float* lse, const floatX* q,
                                                                              GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Qs = (floatX*)att_smem;  // MT slabs of 64 queries
    floatX* KV = Qs + MT * TILE;     // stage s: keys at KV + 2 s TILE, their values after them
    int* kblk = att4_block_ids<HSP>(att_smem);  // stage s: the keys' block ids at kblk + 64 s
    int i0 = blockIdx.x * ATT4_ROWS * MT, h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        att4_load_tile<HSP>(Qs + mt * TILE, att4_head(q, b, T, h, HS, D), i0 + mt * ATT4_ROWS, T, HS, D);
    }
    int n_tiles = (N + ATT4_ROWS - 1) / ATT4_ROWS;
    att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, 0, n_tiles);
    int qb[MT][2];  // rows g and g + 8: their block ids (masked calls; -1 past T)
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = i0 + mt * ATT4_ROWS + warp * 16 + g + 8 * r;
            qb[mt][r] = MASK && row < T ? gqa_query_block(a, b, row) : -1;
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[MT][HSP / 16][4];
    float o[MT][HSP / 8][4];
    float m[MT][2], l[MT][2];  // rows g and g + 8 of each row tile; l: this lane's part of the sum
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int kk = 0; kk < HSP / 16; kk++) { att4_frag_a(qf[mt][kk], Qs + mt * TILE + warp * 16 * LD + kk * 16, LD); }
        #pragma unroll
        for (int n = 0; n < HSP / 8; n++) { o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f; }
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    const float sl2 = LOG2E_F / sqrtf((float)HS);
    for (int jt = 0; jt < n_tiles; jt++) {
        const floatX* Kt = KV + (jt % 2) * 2 * TILE;
        const int* kb = kblk + (jt % 2) * ATT4_ROWS;
        att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, jt + 1, n_tiles);
        float s[MT][ATT4_ROWS / 8][4];
        att4_products<HSP, MT>(s, qf, Kt);
        if (att4_has_holes<MASK>(jt, N)) {
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att4_online_softmax<HSP, MASK, true>(s[mt], o[mt], m[mt], l[mt], sl2, qb[mt], kb, jt * ATT4_ROWS, N);
            }
        } else {
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att4_online_softmax<HSP, MASK, false>(s[mt], o[mt], m[mt], l[mt], sl2, qb[mt], kb, jt * ATT4_ROWS, N);
            }
        }
        att4_accumulate<HSP, MT>(o, s, Kt + TILE);
        cp_async_wait<0>();
        __syncthreads();
    }
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        int row0 = i0 + mt * ATT4_ROWS + warp * 16;
        float inv[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + g + 8 * r;
            float sum = quad_sum(l[mt][r]);
            bool none = MASK && sum == 0.0f;  // (vision: every row sees every key)
            inv[r] = none ? 1.0f : 1.0f / sum;
            if (none && row < T) { att4_mean_values<HSP>(o[mt], r, a, b, kvh); }
            if (t == 0 && row < T) {
                lse[((size_t)b * a.NH + h) * T + row] = none ? ATTN_NO_KEY_LSE : (m[mt][r] + log2f(sum)) / LOG2E_F;
            }
        }
        att4_store_rows<HSP>((floatX*)att4_head(out, b, T, h, HS, D), o[mt], row0, T, HS, D, inv);
    }
}

// s <- dS / scale = P (dP - delta), P = 2^(s sl2 - lse2): 0 where masked or lse2 = +inf
template <bool MASK, bool HOLES>
static __device__ __forceinline__ void att4_dq_scores(float (*s)[4], const float (*dp)[4], const float* lse2,
                                                      const float* dl, float sl2, const int* qb, const int* kb,
                                                      int key0, int N) {
    if (HOLES) { att4_mask_scores<MASK>(s, qb, kb, key0, N); }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { s[j][i] = fast_exp2(fmaf(s[j][i], sl2, -lse2[i / 2])) * (dp[j][i] - dl[i / 2]); }
    }
}

// Version 4 backward, query side: dq = scale dS K for 64 queries of one (sample, head); overwritten.
template <int HSP, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS) gqa_attention_backward_dq_kernel4(floatX* dq, const floatX* dout,
                                                                                  const floatX* q, const float* lse,
                                                                                  const float* delta, GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Qs = (floatX*)att_smem;
    floatX* dOs = Qs + TILE;
    floatX* KV = dOs + TILE;  // two stages of keys then values, as the forward's
    int* kblk = att4_block_ids<HSP>(att_smem);
    int i0 = blockIdx.x * ATT4_ROWS, h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS;
    att4_load_tile<HSP>(Qs, att4_head(q, b, T, h, HS, D), i0, T, HS, D);
    att4_load_tile<HSP>(dOs, att4_head(dout, b, T, h, HS, D), i0, T, HS, D);
    int n_tiles = (N + ATT4_ROWS - 1) / ATT4_ROWS;
    att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, 0, n_tiles);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HSP / 16][4], dof[HSP / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HSP / 16; kk++) {
        att4_frag_a(qf[kk], Qs + warp * 16 * LD + kk * 16, LD);
        att4_frag_a(dof[kk], dOs + warp * 16 * LD + kk * 16, LD);
    }
    float lse2[2], dl[2];  // rows g and g + 8: lse in base 2 (+inf where P is 0: past T, no key seen), delta
    int qb[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = i0 + warp * 16 + g + 8 * r;
        size_t stat = ((size_t)b * a.NH + h) * T + row;
        float l = row < T ? lse[stat] : ATTN_NO_KEY_LSE;
        lse2[r] = l == ATTN_NO_KEY_LSE ? INFINITY : l * LOG2E_F;
        dl[r] = row < T ? delta[stat] : 0.0f;
        qb[r] = MASK && row < T ? gqa_query_block(a, b, row) : -1;
    }
    float acc[HSP / 8][4];
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) { acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f; }
    const float scale = 1.0f / sqrtf((float)HS), sl2 = LOG2E_F * scale;
    for (int jt = 0; jt < n_tiles; jt++) {
        const floatX* Kt = KV + (jt % 2) * 2 * TILE;
        const int* kb = kblk + (jt % 2) * ATT4_ROWS;
        att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, jt + 1, n_tiles);
        float s[ATT4_ROWS / 8][4], dp[ATT4_ROWS / 8][4];
        att4_products<HSP>(&s, &qf, Kt);
        att4_products<HSP>(&dp, &dof, Kt + TILE);
        if (att4_has_holes<MASK>(jt, N)) {
            att4_dq_scores<MASK, true>(s, dp, lse2, dl, sl2, qb, kb, jt * ATT4_ROWS, N);
        } else {
            att4_dq_scores<MASK, false>(s, dp, lse2, dl, sl2, qb, kb, jt * ATT4_ROWS, N);
        }
        att4_accumulate<HSP>(&acc, &s, Kt);
        cp_async_wait<0>();
        __syncthreads();
    }
    const float mul[2] = {scale, scale};
    att4_store_rows<HSP>((floatX*)att4_head(dq, b, T, h, HS, D), acc, i0 + warp * 16, T, HS, D, mul);
}

// st <- query tile's 64 lse in base 2 (+inf past T: P = 0; -inf: no key seen, P uniform), then deltas
static __device__ __forceinline__ void att4_load_stats(float* st, const float* lse_h, const float* delta_h, int tile,
                                                       int T) {
    for (int i = threadIdx.x; i < ATT4_ROWS; i += blockDim.x) {
        int row = tile * ATT4_ROWS + i;
        float l = row < T ? lse_h[row] : 0.0f;
        st[i] = row >= T ? INFINITY : l == ATTN_NO_KEY_LSE ? -INFINITY : l * LOG2E_F;
        st[ATT4_ROWS + i] = row < T ? delta_h[row] : 0.0f;
    }
}

// Version 4 backward, key side: dv += P^T dO, dk += scale dS^T Q for 64 keys of one (sample, kv head)
// over its GQA group, on the transposes (S^T = K Q^T). Accumulates dk0/dv0, dk1/dv1, or writes dkx/dvx.
template <int HSP, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS, MASK ? 1 : ATT4_DKDV_BLOCKS) gqa_attention_backward_dkdv_kernel4(
    float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout, const floatX* q, const float* lse,
    const float* delta, GqaAttn a, floatX* dkx, floatX* dvx) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Ks = (floatX*)att_smem;
    floatX* Vs = Ks + TILE;
    floatX* QD = Vs + TILE;  // stage s: queries at QD + 2 s TILE, their dO after them
    float* stats = (float*)(QD + 4 * TILE);  // stage s: 64 lse (base 2) at stats + 128 s, 64 deltas after them
    int* qblk = att4_block_ids<HSP>(att_smem);  // stage s: the queries' block ids at qblk + 64 s
    int j0 = blockIdx.x * ATT4_ROWS, kvh = blockIdx.y, b = blockIdx.z, G = a.NH / a.NKV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS, Dkv = (size_t)a.NKV * HS;
    att4_load_tile<HSP>(Ks, att4_kv0(a.k0, a, b, kvh), j0, a.Nk0, HS, Dkv, att4_kv1(a.k1, a, b, kvh), a.Nk1);
    att4_load_tile<HSP>(Vs, att4_kv0(a.v0, a, b, kvh), j0, a.Nk0, HS, Dkv, att4_kv1(a.v1, a, b, kvh), a.Nk1);
    // step u n_qt + it: query tile it of the group's head kvh G + u
    int n_qt = (T + ATT4_ROWS - 1) / ATT4_ROWS, n_steps = G * n_qt;
    auto prefetch = [&](int step) {
        if (step >= n_steps) { return; }
        int hh = kvh * G + step / n_qt, it = step % n_qt, stage = step % 2;
        size_t head = (size_t)b * a.NH + hh;
        att4_load_tile<HSP>(QD + stage * 2 * TILE, att4_head(q, b, T, hh, HS, D), it * ATT4_ROWS, T, HS, D);
        att4_load_tile<HSP>(QD + stage * 2 * TILE + TILE, att4_head(dout, b, T, hh, HS, D), it * ATT4_ROWS, T, HS, D);
        cp_async_commit();
        att4_load_stats(stats + stage * 2 * ATT4_ROWS, lse + head * T, delta + head * T, it, T);
        if (MASK) { att4_load_block_ids(qblk + stage * ATT4_ROWS, a, b, it * ATT4_ROWS, a.q0, T); }
    };
    prefetch(0);
    int kb[2];  // keys g and g + 8: their block ids (masked calls)
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = j0 + warp * 16 + g + 8 * r;
        kb[r] = MASK && key < N ? gqa_key_block(a, b, key) : -1;
    }
    cp_async_wait<0>();
    __syncthreads();
    float dka[HSP / 8][4], dva[HSP / 8][4];
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.0f;
        dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.0f;
    }
    const float scale = 1.0f / sqrtf((float)HS), sl2 = LOG2E_F * scale, uniform = 1.0f / (float)N;
    for (int step = 0; step < n_steps; step++) {
        const floatX* Qt = QD + (step % 2) * 2 * TILE;
        const float* st = stats + (step % 2) * 2 * ATT4_ROWS;
        const int* qbt = qblk + (step % 2) * ATT4_ROWS;
        prefetch(step + 1);
        float p[ATT4_ROWS / 8][4], ds[ATT4_ROWS / 8][4];
        att4_products_smem<HSP>(p, Ks + warp * 16 * LD, Qt);          // S^T
        att4_products_smem<HSP>(ds, Vs + warp * 16 * LD, Qt + TILE);  // dP^T
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                int col = j * 8 + 2 * t + i % 2;  // the query in the tile
                float l2 = st[col];               // (+inf past T: P is 0)
                // selects, not branches: no divergence; no key seen (l2 -inf): P uniform, no dS
                bool none = MASK && l2 == -INFINITY, seen = !MASK || gqa_sees(qbt[col], kb[i / 2]);
                float e = fast_exp2(fmaf(p[j][i], sl2, -l2));
                float pj = none ? uniform : seen ? e : 0.0f;
                ds[j][i] = none ? 0.0f : pj * (ds[j][i] - st[ATT4_ROWS + col]);
                p[j][i] = pj;
            }
        }
        att4_accumulate<HSP>(&dva, &p, Qt + TILE);  // dV += P^T dO
        att4_accumulate<HSP>(&dka, &ds, Qt);        // dK += dS^T Q (scaled below)
        cp_async_wait<0>();
        __syncthreads();
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = j0 + warp * 16 + g + 8 * r;
        if (key >= N) { continue; }
        bool first = key < a.Nk0;
        size_t at = gqa_key_at(a, b, key, kvh);
        float* dk = first ? dk0 : dk1;
        float* dv = first ? dv0 : dv1;
        #pragma unroll
        for (int n = 0; n < HSP / 8; n++) {
            int c = n * 8 + 2 * t;
            if (c >= HS) { continue; }
            if (dkx != NULL) {  // (the same for the whole launch)
                store_x2(dkx + at + c, pack_f2(dka[n][2 * r] * scale, dka[n][2 * r + 1] * scale));
                store_x2(dvx + at + c, pack_f2(dva[n][2 * r], dva[n][2 * r + 1]));
                continue;
            }
            dk[at + c] += dka[n][2 * r] * scale;
            dk[at + c + 1] += dka[n][2 * r + 1] * scale;
            dv[at + c] += dva[n][2 * r];
            dv[at + c + 1] += dva[n][2 * r + 1];
        }
    }
}
#endif  // bf16 builds

// ---- the model's glue: patches, the prefix and its mask, RoPE, GELU, the fp32 velocity head and loss

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

// x (n) += table[i % period]: the vision position embedding added to every image's patches
__global__ void add_periodic_kernel(floatX* x, const floatX* table, size_t n, size_t period) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] = fx(f32(x[i]) + f32(table[i % period])); }
}

// The mask and RoPE positions, as embed_prefix / embed_suffix flag the tokens of the sequence
// [images | language | state | actions] (the state is the prefix's last token or the suffix's first:
// Np, H = the suffix's tokens). block (B, Np + H): make_att_2d_masks' cumsum, -1 for a pad; pos =
// cumsum(valid) - 1; x_pos (B, H): the cross layers'.
__global__ void smolvla_sequence_kernel(int* block, int* pos, int* x_pos, const float* token_mask, int B, int NI, int T,
                                        int Np, int H, int causal) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) { return; }
    int n = Np + H, cum = 0, n_valid = 0;
    for (int j = 0; j < n; j++) {
        int valid = j < NI || j >= NI + T || token_mask[(size_t)b * T + (j - NI)] != 0.0f;
        // the state and every action start a block (causal actions), or the state and the first action
        cum += j >= NI + T && (causal || j <= NI + T + 1);
        n_valid += valid;
        block[(size_t)b * n + j] = valid ? cum : -1;
        pos[(size_t)b * n + j] = n_valid - 1;
    }
    int lowest = pos[(size_t)b * n + Np];
    for (int j = 1; j < H; j++) { lowest = min(lowest, pos[(size_t)b * n + Np + j]); }
    for (int j = 0; j < H; j++) { x_pos[(size_t)b * H + j] = pos[(size_t)b * n + Np + j] - lowest; }
}

// The prefix x (B, Np, C): per sample each camera's NI image tokens (image cam * B + b) times
// img_scale, the language rows times sqrt(C), then (SmolVLA: Np = the images, T and 1) state_tok
// (B, C). Token ids are checked by the data path.
__global__ void smolvla_prefix_embed_kernel(floatX* x, const floatX* img_tok, const floatX* embed, const int32_t* tokens,
                                            const floatX* state_tok, int B, int n_cam, int NI, int T, int Np, int C,
                                            float scale, float img_scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int n_img = n_cam * NI;
    if (idx >= (size_t)B * Np * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % Np), b = (int)(idx / ((size_t)C * Np));
    float v;
    if (i < n_img) {
        v = f32(img_tok[(((size_t)(i / NI) * B + b) * NI + i % NI) * C + k]) * img_scale;
    } else if (i < n_img + T) {
        v = f32(embed[(size_t)tokens[(size_t)b * T + (i - n_img)] * C + k]) * scale;
    } else {
        v = f32(state_tok[(size_t)b * C + k]);
    }
    x[idx] = fx(v);
}

// RoPE (rotate-half) of rows of NH heads of HS, row r at position pos[(r / Tg) * pos_stride + r % Tg]:
// dimension k < HS/2 pairs with k + HS/2 and turns by the table's angle; sign -1 rotates back.
template <typename Tin>
__global__ void rope_at_kernel(floatX* out, const Tin* in, const float* cos_t, const float* sin_t, const int* pos,
                               int rows, int Tg, int pos_stride, int NH, int HS, float sign) {
    int half = HS / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * NH * half) { return; }
    int k = (int)(idx % half), h = (int)(idx / half % NH);
    size_t row = idx / ((size_t)half * NH);
    int at_pos = pos[(row / Tg) * pos_stride + row % Tg];
    size_t at = row * NH * HS + (size_t)h * HS + k;
    float c = cos_t[(size_t)at_pos * half + k], s = sign * sin_t[(size_t)at_pos * half + k];
    float x1 = f32(in[at]), x2 = f32(in[at + half]);
    out[at] = fx(x1 * c - x2 * s);
    out[at + half] = fx(x2 * c + x1 * s);
}

// out (B * count, C) fp32 = rows first .. first+count-1 of every sample of x (B, T, C)
__global__ void gather_rows_f32_kernel(float* out, const float* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[idx] = x[((row / count) * T + first + row % count) * C + idx % C];
}

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

// out (B, T, C): rows first .. first+count-1 of every sample = x (B * count, C) (gather_rows_kernel's
// inverse; the other rows are left alone)
__global__ void scatter_rows_kernel(floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * count * C) { return; }
    size_t row = idx / C;
    out[((row / count) * T + first + row % count) * C + idx % C] = x[idx];
}

// out (rows, n) fp32 = bias (n) in every row: the velocity head's fp32 product adds onto it
__global__ void bias_rows_kernel(float* out, const floatX* bias, int rows, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * n) { out[i] = f32(bias[i % n]); }
}

// The loss's valid entries of a micro-batch into *count (added to when `accumulate`). One block.
__global__ void valid_entries_kernel(float* count, const float* action_is_pad, int n_slots, int A, int accumulate) {
    __shared__ float shared[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n_slots; i += blockDim.x) { s += action_is_pad == NULL || action_is_pad[i] == 0.0f ? 1.0f : 0.0f; }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) { *count = (accumulate ? *count : 0.0f) + s * (float)A; }
}

// The flow-matching loss: sum of (v - u)^2 over the first A dims of the slots in the episode (every slot
// where action_is_pad is NULL: pi0), per-block sums into partial, dv = 2 (v - u) there. A sum: the
// step's valid entries are known only later.
__global__ void smolvla_loss_kernel(floatX* dv, float* partial, const float* v, const float* target,
                                    const float* action_is_pad, int A, int Amax, int n) {
    __shared__ float shared[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float sq = 0.0f;
    if (i < n) {
        float mask = (i % Amax < A && (action_is_pad == NULL || action_is_pad[i / Amax] == 0.0f)) ? 1.0f : 0.0f;
        float diff = v[i] - target[i];
        dv[i] = fx(mask * 2.0f * diff);
        sq = mask * diff * diff;
    }
    sq = block_sum(sq, shared);
    if (threadIdx.x == 0) { partial[blockIdx.x] = sq; }
}

// scalars[0] / max(1, scalars[3]) -> the mean loss in scalars[0], its factor in scalars[4]. One thread.
__global__ void loss_normalize_kernel(float* scalars) {
    float inv = 1.0f / fmaxf(1.0f, scalars[3]);
    scalars[0] *= inv;
    scalars[4] = inv;
}

// --balance tasks: sample b's squared errors and entries into sums[2 b], sums[2 b + 1]. One block each.
__global__ void sample_loss_kernel(float* sums, const float* v, const float* target, const float* action_is_pad, int H,
                                   int A, int Amax) {
    __shared__ float shared[32];
    int b = blockIdx.x;
    float sq = 0.0f, n = 0.0f;
    for (int e = threadIdx.x; e < H * A; e += blockDim.x) {
        int r = b * H + e / A;
        if (action_is_pad != NULL && action_is_pad[r] != 0.0f) { continue; }
        float diff = v[(size_t)r * Amax + e % A] - target[(size_t)r * Amax + e % A];
        sq += diff * diff;
        n += 1.0f;
    }
    sq = block_sum(sq, shared);
    n = block_sum(n, shared);
    if (threadIdx.x == 0) { sums[2 * b] = sq; sums[2 * b + 1] = n; }
}

// ... added to its task's (task_sums (T, 2)) in sample order; `first` starts from zero. One thread per task.
__global__ void task_loss_add_kernel(float* task_sums, const float* sample_sums, const int* task, int B, int T,
                                     int first) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) { return; }
    float sq = first ? 0.0f : task_sums[2 * t], n = first ? 0.0f : task_sums[2 * t + 1];
    for (int b = 0; b < B; b++) {
        if (task[b] == t) { sq += sample_sums[2 * b]; n += sample_sums[2 * b + 1]; }
    }
    task_sums[2 * t] = sq;
    task_sums[2 * t + 1] = n;
}

__global__ void scale_kernel(float* x, size_t n, const float* scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] *= *scale; }
}

// One Euler step, x (fp32) += dt v, and the model's floatX copy of x
__global__ void euler_step_f32_kernel(float* x, floatX* x_model, const float* v, float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float y = x[i] + dt * v[i];
        x[i] = y;
        x_model[i] = fx(y);
    }
}

// dtable (vocab, C) += scale * the language rows of dx (B, Np, C) by token id, none for the pad id.
// Block p works only at its id's first position, summing that id's rows in order: no atomics.
__global__ void embed_tokens_backward_kernel(float* dtable, const float* dx, const int32_t* tokens, int B, int first,
                                             int T, int Np, int C, int pad, float scale) {
    int p = blockIdx.x, tok = tokens[p];
    if (tok == pad) { return; }
    for (int q = 0; q < p; q++) {
        if (tokens[q] == tok) { return; }  // the same for the whole block
    }
    for (int k = threadIdx.x; k < C; k += blockDim.x) {
        float s = 0.0f;
        for (int q = p; q < B * T; q++) {
            if (tokens[q] == tok) { s += dx[((size_t)(q / T) * Np + first + q % T) * C + k]; }
        }
        dtable[(size_t)tok * C + k] += scale * s;
    }
}

// dimg (n_cam * B * NI, C) floatX, camera-major = scale * the image rows of dx (B, Np, C) fp32
__global__ void prefix_image_grad_kernel(floatX* dimg, const float* dx, int B, int n_cam, int NI, int Np, int C,
                                         float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n_cam * B * NI * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % NI);
    size_t img = idx / ((size_t)C * NI);
    int b = (int)(img % B), cam = (int)(img / B);
    dimg[idx] = fx(scale * dx[((size_t)b * Np + (size_t)cam * NI + i) * C + k]);
}

// ----------------------------------------------------------------------------
// launchers: grid arithmetic and the error check after every launch

// Per GPU, so per host thread: with MULTI_GPU each rank's thread drives its own device
static thread_local cudaStream_t main_stream;   // all compute
static thread_local cudaStream_t copy_stream;   // host-to-device batch copies, ordered by events

#define launchCheck() cudaCheck(cudaGetLastError())
static const int BLOCK = 256;
static const int CHUNK_ROWS = 32;  // rows per block of the two-stage column sums, at most

// Rows per chunk of the two-stage column sums: CHUNK_ROWS while that leaves 256 chunks, fewer for a small N
static int colsum_rows(size_t N) {
    size_t rows = N / 256;
    return rows >= (size_t)CHUNK_ROWS ? CHUNK_ROWS : rows <= (size_t)(BLOCK / 32) ? BLOCK / 32 : (int)rows;
}
static size_t colsum_chunks(size_t N) { return ceil_div(N, (size_t)colsum_rows(N)); }

// the step profiler (--profile STEP): marks on main_stream, reported by phase, operation and shape
#include "vla/profiler.cuh"

// cuBLASLt: a plan per product shape, and the row-major matmul_* the model calls (vla/matmul.cuh)
#include "vla/matmul.cuh"

static void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* w, int N, int C, float eps,
                            float offset = 0.0f) {
    ProfOp prof_op("rmsnorm");
    if (packable(C, x128::size, out, inp, w)) {
        rmsnorm_forward_kernel2<<<ceil_div((size_t)N * 32, BLOCK), BLOCK, 0, main_stream>>>(out, rstd, inp, w, N, C, eps,
                                                                                             offset);
    } else {
        rmsnorm_forward_kernel<<<ceil_div((size_t)N * 32, BLOCK), BLOCK, 0, main_stream>>>(out, rstd, inp, w, N, C, eps,
                                                                                            offset);
    }
    launchCheck();
}

static void column_sum(float* out, const float* partial, int n_chunks, int C) {
    column_sum_kernel<<<ceil_div(C, 32), 32 * COLSUM_WARPS, 0, main_stream>>>(out, partial, n_chunks, C);
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
    } else if (packable(C, x128::size, dout, inp, w) && packable(C, x128::size, dres, dres_x)) {  // 4, wider rows
        rmsnorm_backward_kernel4<<<chunks, BLOCK, C * sizeof(float), main_stream>>>(dres, dres_x, partial, dout, inp, w,
                                                                                    rstd, N, C, rows, offset);
    } else {  // 3
        rmsnorm_backward_kernel3<<<chunks, BLOCK, C * sizeof(float), main_stream>>>(dres, dres_x, partial, dout, inp, w,
                                                                                    rstd, N, C, rows, offset);
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
}

// db (OC) += column sums of dout; partial: scratch of (colsum_chunks(N), OC) floats
static void bias_backward(float* db, float* partial, const floatX* dout, int N, int OC, int ld = 0) {
    int chunks = (int)colsum_chunks(N);
    ld = ld > 0 ? ld : OC;
    if (packable(OC, x128::size, dout) && ld % x128::size == 0) {
        column_partial_kernel2<<<dim3(ceil_div(OC, 32 * x128::size), chunks), 32 * COLPART2_WARPS, 0, main_stream>>>(
            partial, dout, N, OC, ld, colsum_rows(N));
    } else {
        column_partial_kernel<<<dim3(ceil_div(OC, BLOCK), chunks), BLOCK, 0, main_stream>>>(partial, dout, N, OC, ld,
                                                                                            colsum_rows(N));
    }
    launchCheck();
    column_sum(db, partial, chunks, OC);
}

static void convert(floatX* out, const float* inp, size_t n) {
    if (packable(n, x128::size, out, inp)) {
        convert_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(out, inp, n);
    } else {
        convert_kernel<<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, inp, n);
    }
    launchCheck();
}

static int padded_head_dim(int HS) { return HS <= 16 ? 16 : HS <= 32 ? 32 : HS <= 64 ? 64 : 128; }

// ---- LayerNorm, SwiGLU, GELU-tanh, pixel shuffle, resize: BLOCK threads, 16 bytes a load

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
    layernorm_forward_kernel2<<<ceil_div((size_t)N * 32, BLOCK), BLOCK, 0, main_stream>>>(out, mean, rstd, inp, w, b, N, C);
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
        layernorm_backward_kernel2<<<chunks, BLOCK, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean, rstd,
                                                                         N, C, rows);
    } else {
        layernorm_backward_kernel3<<<chunks, BLOCK, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean, rstd,
                                                                         N, C, rows);
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
    column_sum(db, partial + (size_t)chunks * C, chunks, C);
}

// n values of every pointer in whole 16-byte packs, else a one-line error naming the operation
static void check_packable(const char* what, size_t n, const void* a, const void* b, const void* c = NULL,
                           const void* d = NULL, const void* e = NULL) {
    if (!packable(n, x128::size, a, b, c) || !packable(n, x128::size, d, e)) {
        vla_fail("%s: %zu values, or a pointer, not in whole 16-byte packs of %d (the kernel's loads)", what, n,
                 x128::size);
    }
}

static void swiglu_forward(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    ProfOp prof_op("swiglu");
    check_packable("swiglu_forward", n, act, gate, up);
    swiglu_forward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void swiglu_backward(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up, size_t n) {
    ProfOp prof_op("swiglu");
    check_packable("swiglu_backward", n, dgate, dup, dact, gate, up);
    swiglu_backward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
}

static void geglu_forward(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    ProfOp prof_op("geglu");
    check_packable("geglu_forward", n, act, gate, up);
    geglu_forward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void geglu_backward(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up, size_t n) {
    ProfOp prof_op("geglu");
    check_packable("geglu_backward", n, dgate, dup, dact, gate, up);
    geglu_backward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
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
    pixel_shuffle_backward_kernel2<<<ceil_div(n / x128::size, BLOCK), BLOCK, 0, main_stream>>>(dinp, dout, N, h, w, C, s);
    launchCheck();
}

// resize_with_pad's sizes with Python's arithmetic (the same correctly rounded doubles, int() truncating);
// centred: resize_with_pad_torch's padding (pi0), half above and to the left, the odd one below and right
static ResizePad resize_pad_plan(int h, int w, int S, int centred = 0) {
    ResizePad r;
    r.h = h; r.w = w; r.S = S;
    if (h == S && w == S) {  // resize_with_pad returns the frame untouched
        r.rh = h;
        r.rw = w;
    } else {
        double ratio = fmax((double)w / S, (double)h / S);
        r.rh = (int)(h / ratio);
        r.rw = (int)(w / ratio);
    }
    if (r.rh < 1 || r.rw < 1 || r.rh > S || r.rw > S) {
        vla_fail("resize_pad: a %d x %d frame resizes to %d x %d at image size %d: the frame's aspect ratio is too "
                 "extreme for this image size (crop the frames, or use a larger image size)", h, w, r.rh, r.rw, S);
    }
    r.pad_top = centred ? (S - r.rh) / 2 : S - r.rh;
    r.pad_left = centred ? (S - r.rw) / 2 : S - r.rw;
    r.scale_h = (float)h / (float)r.rh;  // torch: static_cast<float>(input_size) / output_size
    r.scale_w = (float)w / (float)r.rw;
    return r;
}

static bool resize_pad2_fits(const floatX* out, int S, size_t out_stride) {
    return packable(S, x128::size, out) && out_stride % x128::size == 0;
}

// out (n_img, 3, S, S) from frames (n_img, h, w, 3) u8; strides in elements, 0 means packed
static void resize_pad(floatX* out, const uint8_t* frames, int n_img, int h, int w, int S, size_t in_stride = 0,
                       size_t out_stride = 0, int centred = 0) {
    ProfOp prof_op("resize");
    ResizePad r = resize_pad_plan(h, w, S, centred);
    in_stride = in_stride > 0 ? in_stride : (size_t)h * w * 3;
    out_stride = out_stride > 0 ? out_stride : (size_t)3 * S * S;
    if (!resize_pad2_fits(out, S, out_stride)) {
        vla_fail("resize_pad: image size %d or its images' place not in whole 16-byte packs of %d (the kernel's "
                 "stores)", S, x128::size);
    }
    size_t n = (size_t)n_img * S * (S / x128::size);
    resize_pad_kernel2<<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, frames, r, n_img, in_stride, out_stride);
    launchCheck();
}

// ---- attention's launchers: version 4 (bf16) where it fits, version 2 (fp16) where its tiles fit, else 1
// (5 past head size 128)

// what the kernels assume of a call; a mistake here is the caller's
static void gqa_attention_check(const GqaAttn& a) {
    if (a.NKV <= 0 || a.NH % a.NKV != 0) { vla_fail("attention: %d query heads are not a multiple of %d kv heads", a.NH, a.NKV); }
    if (a.HS > 32 * ATT5_VALS) { vla_fail("attention: head size %d: the kernels take head sizes up to %d", a.HS, 32 * ATT5_VALS); }
    if (a.Nk0 + a.Nk1 <= 0) { vla_fail("attention: %d + %d keys: a call needs at least one", a.Nk0, a.Nk1); }
    if (a.Nk1 > 0 && (a.k1 == nullptr || a.v1 == nullptr)) { vla_fail("attention: %d second keys but no k1/v1 tensors", a.Nk1); }
    if (a.block != nullptr && (a.q0 + a.Tq > a.Nt || a.Nk0 + a.Nk1 > a.Nt)) {
        vla_fail("attention: queries %d.. (%d) or %d keys past the mask's %d tokens", a.q0, a.Tq, a.Nk0 + a.Nk1, a.Nt);
    }
}

static void gqa_attention_forward1(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    gqa_attention_forward_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, BLOCK), BLOCK, 0, main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward1(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    gqa_attention_backward_dq_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, BLOCK), BLOCK, 0, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel1<<<ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, BLOCK), BLOCK, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

// Version 5 (head sizes past version 1's 128, up to 256: pi0's) at ATT5_MAX_BLOCK threads
static void gqa_attention_forward5(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    gqa_attention_forward_kernel5<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, ATT5_MAX_BLOCK), ATT5_MAX_BLOCK, 0, main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward5(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    gqa_attention_backward_dq_kernel5<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, ATT5_MAX_BLOCK), ATT5_MAX_BLOCK, 0, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel5<<<ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, ATT5_MAX_BLOCK), ATT5_MAX_BLOCK, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

#if defined(ENABLE_FP16) || (defined(TESTING) && !defined(ENABLE_FP32))
// (dynamic shared memory is set once per GPU: each rank's thread drives one)
template <int HSP>
static void gqa_attention_forward2(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    size_t smem = gqa_attention_forward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_forward_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    gqa_attention_forward_kernel2<HSP><<<dim3(ceil_div(a.Tq, ATT_TILE), a.NH, a.B), ATT_THREADS, smem, main_stream>>>(out, lse, q, a);
    launchCheck();
}

template <int HSP>
static void gqa_attention_backward2(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    size_t smem = gqa_attention_backward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dq_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dkdv_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    gqa_attention_backward_dq_kernel2<HSP><<<dim3(ceil_div(a.Tq, ATT_TILE), a.NH, a.B), ATT_THREADS, smem, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel2<HSP><<<dim3(ceil_div(gqa_n_keys(a), ATT_TILE), a.NKV, a.B), ATT_THREADS, smem, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

// whether version 2 takes head size HS (up to 128) and its tiles fit shared memory: not on a T4 at 64
// nor a V100 at 128
static bool attention2_fits(int HS, bool backward) {
    if (HS > 128) { return false; }
    static thread_local size_t limit = 0;
    if (limit == 0) {
        int device;
        cudaDeviceProp prop;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaGetDeviceProperties(&prop, device));
        limit = prop.sharedMemPerBlockOptin;
    }
    size_t smem;
    switch (padded_head_dim(HS)) {
        case 16: smem = backward ? gqa_attention_backward_smem2<16>() : gqa_attention_forward_smem2<16>(); break;
        case 32: smem = backward ? gqa_attention_backward_smem2<32>() : gqa_attention_forward_smem2<32>(); break;
        case 64: smem = backward ? gqa_attention_backward_smem2<64>() : gqa_attention_forward_smem2<64>(); break;
        default: smem = backward ? gqa_attention_backward_smem2<128>() : gqa_attention_forward_smem2<128>(); break;
    }
    return smem <= limit;
}

static void gqa_attention_forward2_any(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_forward2<16>(out, lse, q, a); break;
        case 32: gqa_attention_forward2<32>(out, lse, q, a); break;
        case 64: gqa_attention_forward2<64>(out, lse, q, a); break;
        default: gqa_attention_forward2<128>(out, lse, q, a); break;
    }
}
static void gqa_attention_backward2_any(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                        const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_backward2<16>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 32: gqa_attention_backward2<32>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 64: gqa_attention_backward2<64>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        default: gqa_attention_backward2<128>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
    }
}
#endif

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
// version 4 takes head sizes multiples of 8 up to 64, rows 16-byte aligned
static bool attention4_fits(const GqaAttn& a, const void* x, const void* y, const void* z = NULL) {
    return a.Tq > 0 && a.HS % 8 == 0 && a.HS <= 64 && packable(a.HS, 8, a.k0, a.v0, x) && packable(a.HS, 8, y, z) &&
           (a.Nk1 == 0 || packable(a.HS, 8, a.k1, a.v1));
}

// version 4's kernels by padded head size (16, 32, 64), row tiles a warp (1, 2) and mask (0, 1)
typedef void (*Attention4Forward)(floatX*, float*, const floatX*, GqaAttn);
typedef void (*Attention4Dq)(floatX*, const floatX*, const floatX*, const float*, const float*, GqaAttn);
typedef void (*Attention4Dkdv)(float*, float*, float*, float*, const floatX*, const floatX*, const float*, const float*,
                               GqaAttn, floatX*, floatX*);
static const Attention4Forward ATT4_FORWARD[3][2][2] = {
    {{gqa_attention_forward_kernel4<16, 1, false>, gqa_attention_forward_kernel4<16, 1, true>},
     {gqa_attention_forward_kernel4<16, 2, false>, gqa_attention_forward_kernel4<16, 2, true>}},
    {{gqa_attention_forward_kernel4<32, 1, false>, gqa_attention_forward_kernel4<32, 1, true>},
     {gqa_attention_forward_kernel4<32, 2, false>, gqa_attention_forward_kernel4<32, 2, true>}},
    {{gqa_attention_forward_kernel4<64, 1, false>, gqa_attention_forward_kernel4<64, 1, true>},
     {gqa_attention_forward_kernel4<64, 2, false>, gqa_attention_forward_kernel4<64, 2, true>}}};
static const Attention4Dq ATT4_DQ[3][2] = {
    {gqa_attention_backward_dq_kernel4<16, false>, gqa_attention_backward_dq_kernel4<16, true>},
    {gqa_attention_backward_dq_kernel4<32, false>, gqa_attention_backward_dq_kernel4<32, true>},
    {gqa_attention_backward_dq_kernel4<64, false>, gqa_attention_backward_dq_kernel4<64, true>}};
static const Attention4Dkdv ATT4_DKDV[3][2] = {
    {gqa_attention_backward_dkdv_kernel4<16, false>, gqa_attention_backward_dkdv_kernel4<16, true>},
    {gqa_attention_backward_dkdv_kernel4<32, false>, gqa_attention_backward_dkdv_kernel4<32, true>},
    {gqa_attention_backward_dkdv_kernel4<64, false>, gqa_attention_backward_dkdv_kernel4<64, true>}};
static const size_t ATT4_SMEM[3] = {gqa_attention_smem4<16>(), gqa_attention_smem4<32>(), gqa_attention_smem4<64>()};

// a call's row in those tables; the first call on a GPU sets every kernel's dynamic shared memory
static int attention4_head_index(int HS) {
    static thread_local bool configured = false;
    if (!configured) {
        for (int i = 0; i < 3; i++) {
            int smem = (int)ATT4_SMEM[i];
            for (int m = 0; m < 2; m++) {
                for (int t = 0; t < 2; t++) {
                    cudaCheck(cudaFuncSetAttribute(ATT4_FORWARD[i][t][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                }
                cudaCheck(cudaFuncSetAttribute(ATT4_DQ[i][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                cudaCheck(cudaFuncSetAttribute(ATT4_DKDV[i][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            }
        }
        configured = true;
    }
    int padded = padded_head_dim(HS);
    return padded == 16 ? 0 : padded == 32 ? 1 : 2;
}

// two row tiles a warp where that still makes 1,024 blocks or more, else one: blocks stay many
static void gqa_attention_forward4(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    int hs = attention4_head_index(a.HS), mask = a.block != NULL;
    int tiles = (long long)ceil_div(a.Tq, 2 * ATT4_ROWS) * a.NH * a.B >= 1024 ? 2 : 1;
    Attention4Forward kernel = ATT4_FORWARD[hs][tiles - 1][mask];
    kernel<<<dim3(ceil_div(a.Tq, tiles * ATT4_ROWS), a.NH, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(out, lse, q, a);
    launchCheck();
}

// delta given; dq overwritten, dk0/dv0 (dk1/dv1) accumulate, or dkx/dvx overwritten in floatX
static void gqa_attention_backward4(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a,
                                    floatX* dkx, floatX* dvx) {
    int hs = attention4_head_index(a.HS), mask = a.block != NULL;
    Attention4Dq dq_kernel = ATT4_DQ[hs][mask];
    Attention4Dkdv dkdv_kernel = ATT4_DKDV[hs][mask];
    dq_kernel<<<dim3(ceil_div(a.Tq, ATT4_ROWS), a.NH, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    dkdv_kernel<<<dim3(ceil_div(gqa_n_keys(a), ATT4_ROWS), a.NKV, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a, dkx, dvx);
    launchCheck();
}
#endif

// the version that takes a call at head size HS in this build (the config table's rows)
static const char* attention_version_name(int HS) {
#if defined(ENABLE_FP32)
    (void)HS;
    return "v1: a warp a query";
#elif defined(ENABLE_FP16)
    (void)HS;
    return "v2: WMMA tiles";
#else
    return HS % 8 == 0 && HS <= 64 ? "v4: flash, mma.sync" : "v1: a warp a query";
#endif
}

// delta (B, NH, Tq) = rowsum(dO * O) per head: version 2 where 128-bit loads fit, else version 1
static void attention_delta(float* delta, const floatX* dout, const floatX* out, const GqaAttn& a) {
    size_t rows = (size_t)a.B * a.Tq;
    int lanes = a.HS / x128::size;
    if (packable(a.HS, x128::size, dout, out) && lanes <= 32 && (lanes & (lanes - 1)) == 0) {
        attention_delta_kernel2<<<ceil_div(rows * a.NH * lanes, (size_t)BLOCK), BLOCK, 0, main_stream>>>(delta, dout, out, (int)rows, a.Tq, a.NH, a.HS);
    } else {
        attention_delta_kernel<<<ceil_div(rows * a.NH * 32, (size_t)BLOCK), BLOCK, 0, main_stream>>>(delta, dout, out, (int)rows, a.Tq, a.NH, a.HS);
    }
    launchCheck();
}

static void attention_prof_shape(char* shape, size_t n, const GqaAttn& a) {
    shape[0] = '\0';
    if (prof.on) { snprintf(shape, n, "B %d, %d/%d heads of %d, %d x %d", a.B, a.NH, a.NKV, a.HS, a.Tq, a.Nk0 + a.Nk1); }
}

// out (B, Tq, NH*HS) floatX and lse (B, NH, Tq) fp32, both overwritten
static void gqa_attention_forward(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    char shape[64];
    attention_prof_shape(shape, sizeof(shape), a);
    ProfOp prof_op("attention fwd", 4.0 * a.B * a.NH * a.Tq * (a.Nk0 + a.Nk1) * a.HS, shape);  // (as if unmasked)
    gqa_attention_check(a);
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    if (attention4_fits(a, q, out)) {
        gqa_attention_forward4(out, lse, q, a);
        return;
    }
#elif defined(ENABLE_FP16)
    if (attention2_fits(a.HS, false)) {
        gqa_attention_forward2_any(out, lse, q, a);
        return;
    }
#endif
    if (a.HS > 128) { gqa_attention_forward5(out, lse, q, a); }
    else { gqa_attention_forward1(out, lse, q, a); }
}

// dq (B, Tq, NH*HS) floatX overwritten; dk0/dv0 (B, Nk0, NKV*HS), dk1/dv1 (B, Nk1, NKV*HS; NULL when
// Nk1 = 0) accumulate in fp32. delta: B*NH*Tq floats scratch. dkx, dvx: floatX key gradients, overwritten.
static void gqa_attention_backward(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                   const floatX* q, const floatX* out, const float* lse, float* delta, const GqaAttn& a,
                                   floatX* dkx = NULL, floatX* dvx = NULL) {
    char shape[64];
    attention_prof_shape(shape, sizeof(shape), a);
    ProfOp prof_op("attention bwd", 10.0 * a.B * a.NH * a.Tq * (a.Nk0 + a.Nk1) * a.HS, shape);
    gqa_attention_check(a);
    if (dkx != NULL && (a.Nk1 != 0 || dvx == NULL)) { vla_fail("attention: floatX key gradients need one key tensor and both of dk, dv"); }
    attention_delta(delta, dout, out, a);
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    if (attention4_fits(a, q, dout, dq)) {
        gqa_attention_backward4(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a, dkx, dvx);
        return;
    }
#endif
    size_t n_kv = (size_t)a.B * a.Nk0 * a.NKV * a.HS;
    if (dkx != NULL) {
        cudaCheck(cudaMemsetAsync(dk0, 0, n_kv * sizeof(float), main_stream));
        cudaCheck(cudaMemsetAsync(dv0, 0, n_kv * sizeof(float), main_stream));
    }
#if defined(ENABLE_FP16)
    if (attention2_fits(a.HS, true)) {
        gqa_attention_backward2_any(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    } else
#endif
    if (a.HS > 128) {
        gqa_attention_backward5(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    } else {
        gqa_attention_backward1(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    }
    if (dkx != NULL) {
        convert(dkx, dk0, n_kv);
        convert(dvx, dv0, n_kv);
    }
}

// ---- the model's own launchers

// RoPE at per-row positions: rows of Tg per sample
template <typename Tin>
static void rope_at(floatX* out, const Tin* in, const float* cos_t, const float* sin_t, const int* pos, int rows, int Tg,
                    int pos_stride, int NH, int HS, float sign) {
    ProfOp prof_op("rope");
    size_t n = (size_t)rows * NH * (HS / 2);
    rope_at_kernel<Tin><<<ceil_div(n, BLOCK), BLOCK, 0, main_stream>>>(out, in, cos_t, sin_t, pos, rows, Tg, pos_stride,
                                                                       NH, HS, sign);
    launchCheck();
}

#if defined(TESTING)
// For the tests (test_vla_gpu.cu, dev/cuda): a floatX device array (n) as host floats
static float* from_device_x(const floatX* d, size_t n) {
    floatX* tmp = (floatX*)mallocCheck(n * sizeof(floatX));
    cudaCheck(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    float* h = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { h[i] = f32(tmp[i]); }
    free(tmp);
    return h;
}
#endif

#define LAUNCH_1D(kernel, n, ...) \
    do { kernel<<<ceil_div((n), BLOCK), BLOCK, 0, main_stream>>>(__VA_ARGS__); launchCheck(); } while (0)

// The GPUs a run asks for are there: fails with a hint otherwise. Returns how many are visible.
static int gpu_check_visible(int wanted) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        vla_fail("no CUDA GPU is visible (%s): train on the CPU with train_vla_cpu, or check the driver and "
                 "CUDA_VISIBLE_DEVICES", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (wanted > count) {
        vla_fail("-g %d asks for more GPUs than the %d visible: lower -g or check CUDA_VISIBLE_DEVICES", wanted, count);
    }
    return count;
}

// This thread's GPU: device `device`, its streams, cuBLASLt and workspace.
static void gpu_init(int device, cudaDeviceProp* prop) {
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(prop, device));
    // blocking streams: setup's synchronous copies (legacy stream) stay ordered with the kernels
    cudaCheck(cudaStreamCreate(&main_stream));
    cudaCheck(cudaStreamCreate(&copy_stream));
    cublasCheck(cublasLtCreate(&cublaslt));
    cudaCheck(cudaMalloc(&cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES));
}

static void gpu_shutdown(void) {
    prof_free();
    matmul_plans_free();
    cudaCheck(cudaFree(cublaslt_workspace));
    cublasCheck(cublasLtDestroy(cublaslt));
    cudaCheck(cudaStreamDestroy(main_stream));
    cudaCheck(cudaStreamDestroy(copy_stream));
}


#define NORM_BLOCKS 256  // fixed, so the global norm sums in the same order on every GPU

// ----------------------------------------------------------------------------
// model: LeRobot's SmolVLA, as dev/smolvla.py and train_vla.c compute it (same functions, same order):
//   frames -> resize with padding, x*2-1 -> SigLIP -> pixel shuffle -> connector -> prefix = [image
//   tokens * sqrt(C), language * sqrt(C), state_proj(state)] -> the VLM's Llama layers -> the expert's
//   layers over the H action tokens (joint self-attention in even layers, cross-attention to the VLM's
//   re-projected keys/values in odd ones) -> RMSNorm -> action_out_proj (fp32) -> masked squared error.
// The prefix never sees the actions, so the VLM runs first and alone (it is sampling's cache).
// Shapes: NV = n_cam * B images (camera-major: image cam * B + b), S image side, p patch,
// G = S/p, Nv = G*G patches per image, V = NV * Nv vision rows, Cv / Fv vision widths, NI image
// tokens per camera, C / F VLM widths, Ce / Fe expert widths, Np prefix tokens, H chunk,
// T = Np + H sequence, P = B * Np prefix rows, R = B * H action rows, D = NH*HS query width,
// KV = NKV*HS key/value width (GQA), Smax / Amax padded state / action dims.

enum {
#define SMOL_INDEX_(nm, ...) SMOLP_##nm,
    SMOLVLA_PARAMETERS(SMOL_INDEX_, c)
#undef SMOL_INDEX_
};

typedef struct {
#define SMOL_FIELD_X_(nm, ...) floatX* nm;
    SMOLVLA_PARAMETERS(SMOL_FIELD_X_, c)
#undef SMOL_FIELD_X_
} SmolParametersX;

// The inputs of one batch, in device memory. Frames keep each camera's size; the forward resizes them.
typedef struct {
    int B;
    const uint8_t* frames[VLA_MAX_CAM];  // camera k (the prefix's order): sample b's (frame_h[k], frame_w[k], 3)
                                         // u8 frame at frames[k] + b * frame_stride
    int frame_h[VLA_MAX_CAM], frame_w[VLA_MAX_CAM];
    size_t frame_stride;         // bytes from a sample's frames to the next's (0: each camera's frames packed)
    const int32_t* tokens;       // (B, max_text) token ids in [0, vocab), right-padded
    const float* token_mask;     // (B, max_text) 1 = a real token, 0 = padding
    const float* state;          // (B, max_state_dim) normalized, zero-padded
    const float* actions;        // (B, H, max_action_dim) normalized, zero-padded
    const float* action_is_pad;  // (B, H) 1 = a chunk slot past the episode's end (no loss)
    const float* t;              // (B) flow time
    const float* noise;          // (B, H, max_action_dim)
} SmolInputs;

static inline size_t smolvla_images(const SmolVLAConfig* c, int B) { return (size_t)c->n_cam * B; }
static inline size_t smolvla_vrows(const SmolVLAConfig* c, int B) { return smolvla_images(c, B) * smolvla_grid(c) * smolvla_grid(c); }
static inline size_t smolvla_prows(const SmolVLAConfig* c, int B) { return (size_t)B * smolvla_n_prefix(c); }
static inline size_t smolvla_rrows(const SmolVLAConfig* c, int B) { return (size_t)B * smolvla_n_suffix(c); }
static inline size_t smolvla_arows(const SmolVLAConfig* c, int B) { return (size_t)B * c->chunk; }
// pi0's suffix holds the state token before the actions: what only that layout needs has no elements otherwise
static inline size_t smolvla_pi0_rows(const SmolVLAConfig* c, size_t rows) { return smolvla_state_in_suffix(c) ? rows : 0; }
static inline size_t smolvla_max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

// Vision layers kept: all when the tower trains, else one slot each layer overwrites
static inline size_t smolvla_vis_kept(const SmolVLAConfig* c, int mode) { return mode == TRAIN_MODE_ALL ? (size_t)c->vis_layers : 1; }

// Per-layer slots of the attention and MLP halves at recompute level rc: every layer's, or one refilled
static inline size_t smolvla_attn_slots(size_t layers, int rc) { return rc >= RECOMPUTE_ATTN ? 1 : layers; }
static inline size_t smolvla_mlp_slots(size_t layers, int rc) { return rc >= RECOMPUTE_LAYER ? 1 : layers; }
static inline size_t smolvla_vis_attn(const SmolVLAConfig* c, int mode, int rc) { return smolvla_attn_slots(smolvla_vis_kept(c, mode), rc); }
static inline size_t smolvla_vis_mlp(const SmolVLAConfig* c, int mode, int rc) { return smolvla_mlp_slots(smolvla_vis_kept(c, mode), rc); }

static inline size_t smolvla_vis_grad_rows(const SmolVLAConfig* c, int B, int mode) { return mode == TRAIN_MODE_ALL ? smolvla_vrows(c, B) : 0; }

// Column-sum partials of the backward's widest (rows, columns)
static size_t smolvla_partial_size(const SmolVLAConfig* c, int B, int mode) {
    size_t V = colsum_chunks(smolvla_vis_grad_rows(c, B, mode)), P = colsum_chunks(smolvla_prows(c, B));
    size_t R = colsum_chunks(smolvla_rrows(c, B)), S = colsum_chunks((size_t)B);
    size_t vision = V * (2 * (size_t)c->vis_width > (size_t)c->vis_ff ? 2 * (size_t)c->vis_width : (size_t)c->vis_ff);
    size_t actions = R * (c->d_expert > c->max_action_dim ? c->d_expert : c->max_action_dim);
    return smolvla_max3(vision, smolvla_max3(P * c->d_model, S * c->d_model, 1), actions);
}

// Activations: (type, name, elements), carved from one allocation per type (X floatX, F fp32, I int),
// stacked layer-major. The g_* are backward scratch shared by the towers; r_* one VLM layer's state rows.
#define SMOLVLA_GPU_ACTIVATIONS(X, F, I, c, B, mode, rc) \
    X(pixels,   smolvla_images(c, B) * 3 * (c)->img * (c)->img)                          /* (NV, 3, S, S) prepared images */ \
    X(patches,  smolvla_vrows(c, B) * smolvla_patch_dim(c))                              /* (V, 3pp) */ \
    X(v_res,    (smolvla_vis_kept(c, mode) + 1) * smolvla_vrows(c, B) * (c)->vis_width)     /* (Kv+1, V, Cv) layer inputs, then the last output */ \
    X(v_ln1,    smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    F(v_mean1,  smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B))                                     /* (Ka, V) */ \
    F(v_rstd1,  smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B))                                     /* (Ka, V) */ \
    X(v_q,      smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_k,      smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_v,      smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_att,    smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    F(v_lse,    smolvla_vis_attn(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_heads)                    /* (Ka, NV, NHv, Nv) */ \
    X(v_mid,    smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                     /* (Km, V, Cv) after attention */ \
    X(v_ln2,    smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_width)                     /* (Km, V, Cv) */ \
    F(v_mean2,  smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B))                                      /* (Km, V) */ \
    F(v_rstd2,  smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B))                                      /* (Km, V) */ \
    X(v_fc1,    smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_ff)                        /* (Km, V, Fv) before GELU */ \
    X(v_gelu,   smolvla_vis_mlp(c, mode, rc) * smolvla_vrows(c, B) * (c)->vis_ff)                        /* (Km, V, Fv) */ \
    X(v_out,    smolvla_vrows(c, B) * (c)->vis_width)                                    /* (V, Cv) after post_layernorm */ \
    F(v_omean,  smolvla_vrows(c, B))                                                     /* (V) */ \
    F(v_orstd,  smolvla_vrows(c, B))                                                     /* (V) */ \
    X(shuffled, smolvla_vrows(c, B) * (c)->vis_width)                                    /* (NV*NI, s*s*Cv) */ \
    X(img_tok,  smolvla_images(c, B) * smolvla_image_tokens(c) * (c)->d_model)           /* (NV*NI, C) connector output */ \
    X(state_x,  (size_t)(B) * (c)->max_state_dim)                                     /* (B, Smax) the batch's state */ \
    X(state_tok, (size_t)(B) * smolvla_state_width(c))                                /* (B, C or Ce) state_proj(state) */ \
    I(tokens,   (size_t)(B) * (c)->max_text)                                          /* (B, Lt) the batch's ids, for the backward */ \
    I(block,    (size_t)(B) * (smolvla_n_prefix(c) + smolvla_n_suffix(c)))            /* (B, T) block ids, -1 = a pad */ \
    I(pos,      (size_t)(B) * (smolvla_n_prefix(c) + smolvla_n_suffix(c)))            /* (B, T) RoPE positions */ \
    I(x_pos,    smolvla_rrows(c, B))                                                     /* (B, Ns) the cross layers' positions */ \
    X(p_res,    (size_t)(c)->n_layer * smolvla_prows(c, B) * (c)->d_model)               /* (L, P, C) layer inputs */ \
    X(p_ln1,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_model)               /* (La, P, C) */ \
    F(p_rstd1,  smolvla_attn_slots((c)->n_layer, rc) * smolvla_prows(c, B))                              /* (La, P) */ \
    X(p_q,      smolvla_attn_slots((c)->n_layer, rc) * smolvla_prows(c, B) * smolvla_d_attn(c))          /* (La, P, D) after RoPE */ \
    X(p_k,      (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) after RoPE: what the expert reads */ \
    X(p_v,      (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) */ \
    X(p_att,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_prows(c, B) * smolvla_d_attn(c))          /* (La, P, D) */ \
    F(p_lse,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->n_head)                /* (La, B, NH, Np) */ \
    X(p_mid,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_model)                /* (Lm, P, C) after attention */ \
    X(p_ln2,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_model)                /* (Lm, P, C) */ \
    F(p_rstd2,  smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B))                               /* (Lm, P) */ \
    X(p_gate,   smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(p_up,     smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(p_act,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(x_t,      smolvla_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) noisy actions */ \
    F(target,   smolvla_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) u = noise - actions */ \
    F(x_sample, smolvla_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) Euler state */ \
    F(t_sample, (size_t)(B))                                                          /* (B) Euler time */ \
    X(a_in,     smolvla_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) action_in_proj(x_t) */ \
    X(a_emb,    smolvla_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) [action_in, time embedding] */ \
    X(t_pre,    smolvla_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) before SiLU */ \
    X(t_act,    smolvla_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) after SiLU */ \
    X(a_tok,    smolvla_pi0_rows(c, smolvla_arows(c, B)) * (c)->d_expert)                /* (A, Ce) pi0: the action tokens, before their place */ \
    X(s_res,    ((c)->n_layer + 1) * smolvla_rrows(c, B) * (c)->d_expert)                /* (L+1, R, Ce) layer inputs, then the last output */ \
    X(s_ln1,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert)              /* (La, R, Ce) */ \
    F(s_rstd1,  smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B))                              /* (La, R) */ \
    X(s_q,      smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * smolvla_d_attn(c))          /* (La, R, D) after RoPE */ \
    X(s_k,      smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * smolvla_d_kv(c))            /* (La, R, KV) after RoPE (joint layers) */ \
    X(s_v,      smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * smolvla_d_kv(c))            /* (La, R, KV) (joint layers) */ \
    X(c_k,      (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) p_k re-projected (cross layers) */ \
    X(c_v,      (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) p_v re-projected (cross layers) */ \
    X(s_att,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * smolvla_d_attn(c))          /* (La, R, D) */ \
    F(s_lse,    smolvla_attn_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->n_head)                /* (La, B, NH, Ns) */ \
    X(s_mid,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert)               /* (Lm, R, Ce) after attention */ \
    X(s_ln2,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert)               /* (Lm, R, Ce) */ \
    F(s_rstd2,  smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B))                               /* (Lm, R) */ \
    X(s_gate,   smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(s_up,     smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(s_act,    smolvla_mlp_slots((c)->n_layer, rc) * smolvla_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(f_ln,     smolvla_rrows(c, B) * (c)->d_expert)                                     /* (R, Ce) after the expert's norm */ \
    F(f_rstd,   smolvla_rrows(c, B))                                                     /* (R) */ \
    X(f_act,    smolvla_pi0_rows(c, smolvla_arows(c, B)) * (c)->d_expert)                /* (A, Ce) pi0: f_ln's action rows */ \
    F(v_t,      smolvla_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) velocities, fp32 */ \
    X(d_vt,     smolvla_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) d loss / d v_t, set by the forward */ \
    F(loss_partial, (size_t)ceil_div(smolvla_arows(c, B) * (c)->max_action_dim, BLOCK))  /* the loss's per-block sums */ \
    F(scalars,  8)                                                                    /* loss (first its sum), grad norm, stop, valid entries, their inverse */ \
    /* backward scratch */ \
    F(dp_k,     (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) d p_k, from the expert and the VLM */ \
    F(dp_v,     (size_t)(c)->n_layer * smolvla_prows(c, B) * smolvla_d_kv(c))            /* (L, P, KV) d p_v */ \
    F(g_res,    smolvla_max3(smolvla_prows(c, B) * (c)->d_model, smolvla_rrows(c, B) * (c)->d_expert, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_res_x,  smolvla_max3(smolvla_prows(c, B) * (c)->d_model, smolvla_rrows(c, B) * (c)->d_expert, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_ln,     smolvla_max3(smolvla_prows(c, B) * (c)->d_model, smolvla_rrows(c, B) * (c)->d_expert, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_att,    smolvla_max3(smolvla_prows(c, B) * smolvla_d_attn(c), smolvla_rrows(c, B) * smolvla_d_attn(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_q,      smolvla_max3(smolvla_prows(c, B) * smolvla_d_attn(c), smolvla_rrows(c, B) * smolvla_d_attn(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    F(g_kf,     smolvla_max3(smolvla_prows(c, B) * smolvla_d_kv(c), smolvla_rrows(c, B) * smolvla_d_kv(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    F(g_vf,     smolvla_max3(smolvla_prows(c, B) * smolvla_d_kv(c), smolvla_rrows(c, B) * smolvla_d_kv(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_kx,     smolvla_max3(smolvla_prows(c, B) * smolvla_d_kv(c), smolvla_rrows(c, B) * smolvla_d_kv(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_vx,     smolvla_max3(smolvla_prows(c, B) * smolvla_d_kv(c), smolvla_rrows(c, B) * smolvla_d_kv(c), smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_gate,   smolvla_max3(smolvla_prows(c, B) * (c)->d_ff, smolvla_rrows(c, B) * (c)->d_expert_ff, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    X(g_up,     smolvla_max3(smolvla_prows(c, B) * (c)->d_ff, smolvla_rrows(c, B) * (c)->d_expert_ff, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    X(g_act,    smolvla_max3(smolvla_prows(c, B) * (c)->d_ff, smolvla_rrows(c, B) * (c)->d_expert_ff, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    F(delta,    smolvla_max3(smolvla_prows(c, B) * (c)->n_head, smolvla_rrows(c, B) * (c)->n_head, smolvla_vis_grad_rows(c, B, mode) * (c)->vis_heads)) \
    F(g_dw,     smolvla_max3((c)->d_model, (c)->d_expert, (c)->vis_width))               /* a frozen norm's dw, dropped */ \
    F(partial,  smolvla_partial_size(c, B, mode))                                        /* column-sum partials */ \
    X(g_emb,    smolvla_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) d a_emb */ \
    X(g_tok,    smolvla_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) */ \
    X(g_state,  smolvla_pi0_rows(c, (size_t)(B)) * (c)->d_expert)                        /* (B, Ce) pi0: d of the state tokens */ \
    X(g_img,    smolvla_images(c, B) * smolvla_image_tokens(c) * (c)->d_model)           /* (NV*NI, C) d img_tok */ \
    X(g_shuf,   smolvla_vis_grad_rows(c, B, mode) * (c)->vis_width)                      /* (NV*NI, s*s*Cv) d shuffled */ \
    X(r_res,    (size_t)(B) * (c)->d_model)                                           /* (B, C) one VLM layer's state rows */ \
    X(r_ln1,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    F(r_rstd1,  (size_t)(B))                                                          /* (B) */ \
    X(r_q,      (size_t)(B) * smolvla_d_attn(c))                                      /* (B, D) */ \
    X(r_att,    (size_t)(B) * smolvla_d_attn(c))                                      /* (B, D) */ \
    F(r_lse,    (size_t)(B) * (c)->n_head)                                            /* (B, NH) */ \
    X(r_mid,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    X(r_ln2,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    F(r_rstd2,  (size_t)(B))                                                          /* (B) */ \
    X(r_gate,   (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    X(r_up,     (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    X(r_act,    (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    F(r_dk,     (size_t)(B) * smolvla_d_kv(c))                                        /* (B, KV) their key gradients */ \
    F(r_dv,     (size_t)(B) * smolvla_d_kv(c))                                        /* (B, KV) */

typedef struct {
#define SMOL_ACT_X_(nm, n) floatX* nm;
#define SMOL_ACT_F_(nm, n) float* nm;
#define SMOL_ACT_I_(nm, n) int* nm;
    SMOLVLA_GPU_ACTIVATIONS(SMOL_ACT_X_, SMOL_ACT_F_, SMOL_ACT_I_, c, B, mode, rc)
#undef SMOL_ACT_X_
#undef SMOL_ACT_F_
#undef SMOL_ACT_I_
} SmolActivations;

// What the weights and the activations take on the device: smolvla_model_bytes, smolvla_act_bytes
#include "vla/memory.cuh"

// The gradient buckets (MULTI_GPU): one layer's trainable ranges each, in the backward's order
typedef struct {
    int n;          // buckets: smolvla_bucket_count
    int* first;     // (n + 1)
    size_t* offset; // (ranges) into the trainable domain
    size_t* count;
} SmolBuckets;

// Sampling's state (smolvla_sample): the Euler steps as one CUDA graph, and what the last call took
typedef struct {
    int use_graph;          // replay the Euler steps as a CUDA graph (the policy library's default)
    int warm;               // the steps ran once for these activations (their products' plans exist)
    cudaGraphExec_t graph;  // captured for these activations; NULL until then (set_batch drops both)
    cudaEvent_t marks[3];   // before the prefix, before the Euler steps, after them
    float ms[2];            // device time of the last call: the prefix, the Euler steps
    long long launches[2];  // what they handed the device, where it is counted (the CPU emulation); else -1
    int profile_call;       // > 0: the call (1, 2, ...) to time by phase and operation, its steps launched one by one
    int calls;              // calls so far
} SmolSampling;

typedef struct {
    SmolVLAConfig config;
    int mode;                              // TRAIN_MODE_*: what trains, so what has a gradient
    int recompute;                         // RECOMPUTE_*: what the backward runs again (smolvla_set_recompute)
    SmolParamTable table;
    SmolOptDomain domain;                  // the trainable elements, packed: tensor i's at domain.offset[i]
    size_t frozen_at[SMOLVLA_NUM_TENSORS]; // where a tensor's frozen remainder starts in params_memory
    size_t n_opt;                          // trainable elements: domain.total
    size_t n_train;                        // the domain padded to a whole number of ZeRO shards of 16
    size_t n_params;                       // params_memory's elements: the domain, then the frozen remainders
    size_t shard_lo, shard_hi;             // the domain elements whose optimizer state this model keeps
    floatX* params_memory;  // (n_params) the compute copy of every weight, the only copy of a frozen one
    float* grads_memory;    // (n_train) fp32 gradients of the trainable domain
    float* master;          // (shard) fp32 master weights of the trainable elements
    float* m_memory;        // (shard) AdamW's first moments
    float* v_memory;        // (shard) AdamW's second moments
    size_t opt_bytes;       // device bytes of the three above (what the tests assert)
    float* norm_partial;    // (NORM_BLOCKS) the gradient norm's per-block sums
    float* scaler;          // (LOSS_SCALER) fp16 builds' dynamic loss scale (loss_scale_begin_kernel); else NULL
    int loss_scale_window;  // clean steps before the scale doubles
    SmolParametersX params; // each tensor's first slice (stacked tensors: smolvla_param)
    SmolParameters grads;   // NULL for a tensor with no trainable part (smolvla_grad says which slices train)
    int B;                  // batch the activations are sized for
    floatX* acts_x;         // one allocation per activation type
    float* acts_f;
    int* acts_i;
    SmolActivations acts;
    float* rope_cos;        // (T, HS/2) device: LeRobot's angles at positions 0 .. T-1
    float* rope_sin;
    size_t device_bytes;    // what this model holds on the GPU
    size_t act_bytes;       // of which the activations
    SmolBuckets buckets;
    struct Dist* dist;      // the data-parallel ranks it trains with (MULTI_GPU); NULL: alone
    SmolSampling sampling;
} SmolVLA;

static void* smolvla_device_malloc(SmolVLA* m, size_t bytes) {
    void* p;
    cudaCheck(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    m->device_bytes += bytes;
    return p;
}

// Slice k of parameter tensor i: in the trainable domain when it trains, else in the frozen remainder
static inline floatX* smolvla_param(const SmolVLA* m, int i, int k) {
    const SmolParamSpec* s = &m->table.spec[i];
    size_t at = (size_t)k * (smolvla_slice_numel(s)), n_train = m->domain.numel[i];
    return m->params_memory + (at < n_train ? m->domain.offset[i] + at : m->frozen_at[i] + (at - n_train));
}

static inline float* smolvla_grad(const SmolVLA* m, int i, int k) {
    const SmolParamSpec* s = &m->table.spec[i];
    size_t per = smolvla_slice_numel(s);
    if (per == 0 || (size_t)(k + 1) * per > m->domain.numel[i]) { return NULL; }
    return m->grads_memory + m->domain.offset[i] + (size_t)k * per;
}

// ZeRO-1: this model keeps one shard's optimizer state (gradients reduce-scattered, weights all-gathered)
static int smolvla_sharded(const SmolVLA* m) { return m->shard_hi - m->shard_lo < m->n_train; }

// The model's calls into the data-parallel section (nothing without NCCL)
static int smolvla_bucket(const SmolVLAConfig* c, int tower, int layer);
static void smolvla_buckets_build(SmolBuckets* b, const SmolVLAConfig* c, const SmolParamTable* t, const SmolOptDomain* d);
static void smolvla_bucket_done(SmolVLA* m, int b);
static void dist_step_sums(SmolVLA* m);
static void zero_sum_squares(SmolVLA* m);
static void zero_gather_params(SmolVLA* m);

// fp16 builds: the dynamic loss scale's state (a checkpoint's or --loss-scale's) onto the device
static void smolvla_set_loss_scale(SmolVLA* m, const LossScaleState* st, int window) {
    if (m->scaler == NULL) { return; }
    float h[LOSS_SCALER] = {st->scale, (float)st->clean, (float)st->skipped, st->scale, 1.0f};
    cudaCheck(cudaMemcpy(m->scaler, h, sizeof(h), cudaMemcpyHostToDevice));
    m->loss_scale_window = window;
}

// The loss scale after the last step and the one it ran with (`used`); whether it was skipped (Inf/NaN)
static int smolvla_read_loss_scale(SmolVLA* m, LossScaleState* st, float* used) {
    float h[LOSS_SCALER];
    cudaCheck(cudaMemcpyAsync(h, m->scaler, sizeof(h), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    int skipped = (uint64_t)h[SCALER_SKIPPED] != st->skipped;
    st->scale = h[SCALER_NEXT]; st->clean = (uint32_t)h[SCALER_CLEAN]; st->skipped = (uint64_t)h[SCALER_SKIPPED];
    if (used != NULL) { *used = h[SCALER_USED]; }
    return skipped;
}

// What of config c in `mode` the GPU trainer's kernels do not take, in one line, or NULL: checked by
// smolvla_build and, before anything is read or allocated, by a run
static const char* smolvla_gpu_problem(const SmolVLAConfig* c, int mode) {
    static char msg[320];
    const char* problem = smolvla_config_problem(c);
    if (problem != NULL) { snprintf(msg, sizeof(msg), "bad %s config: %s", FAMILY_NAMES[c->family], problem); return msg; }
    if (c->head_dim > 32 * ATT5_VALS || c->vis_width / c->vis_heads > 32 * ATT5_VALS) {
        snprintf(msg, sizeof(msg), "head sizes %d and %d: the GPU attention kernels take head sizes up to %d", c->head_dim,
                 c->vis_width / c->vis_heads, 32 * ATT5_VALS);
        return msg;
    }
    if (c->d_model > 32 * RMSNORM_BWD3_COLS || c->d_expert > 32 * RMSNORM_BWD3_COLS ||
        c->vis_width > 32 * LAYERNORM_FWD2_VALS) {
        snprintf(msg, sizeof(msg), "widths %d (VLM), %d (expert), %d (vision): the GPU trainer's norms take widths up to "
                 "%d; train this model with train_vla_cpu", c->d_model, c->d_expert, c->vis_width, 32 * RMSNORM_BWD3_COLS);
        return msg;
    }
    if (mode == TRAIN_MODE_ALL && c->vis_width > 32 * LAYERNORM_BWD3_VALS) {
        snprintf(msg, sizeof(msg), "--train all: the vision tower's width %d is past the GPU trainer's LayerNorm backward "
                 "(up to %d): train it with --train vlm (the vision tower frozen) or with train_vla_cpu", c->vis_width,
                 32 * LAYERNORM_BWD3_VALS);
        return msg;
    }
    // the kernels of the vision tower, the connector and the MLPs move 16 bytes at a time
    if (c->vis_width % x128::size != 0 || c->vis_ff % x128::size != 0 || c->img % x128::size != 0 ||
        c->d_ff % x128::size != 0 || c->d_expert_ff % x128::size != 0) {
        snprintf(msg, sizeof(msg), "the GPU trainer takes vision and MLP widths and image sizes that are multiples of %d "
                 "(%s); this model has %d, %d, %d, %d and %d", x128::size, PRECISION_NAME, c->vis_width, c->vis_ff, c->img,
                 c->d_ff, c->d_expert_ff);
        return msg;
    }
    return NULL;
}

// The model for config c in `mode`; ZeRO-1: optimizer state of shard `shard_rank` only
static void smolvla_build(SmolVLA* m, const SmolVLAConfig* c, int mode, int shard_rank = 0, int shard_world = 1) {
    memset(m, 0, sizeof(*m));
    const char* problem = smolvla_gpu_problem(c, mode);
    if (problem != NULL) { vla_fail("%s", problem); }
    if (mode < TRAIN_MODE_EXPERT || mode > TRAIN_MODE_ALL) { vla_fail("train mode %d is not one of 0-2", mode); }
    m->config = *c;
    m->mode = mode;
    smolvla_table_build(c, &m->table);
    smolvla_opt_domain(&m->table, mode, &m->domain);
    m->n_opt = m->domain.total;
    size_t shard = zero_shard_size(m->n_opt, shard_world, 16);
    m->n_train = shard * shard_world;
    m->shard_lo = (size_t)shard_rank * shard;
    m->shard_hi = m->shard_lo + shard;
    m->n_params = m->n_train;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        m->frozen_at[i] = m->n_params;
        m->n_params += (m->table.spec[i].numel - m->domain.numel[i] + 15) / 16 * 16;  // 32 bytes of bf16
    }
    m->params_memory = (floatX*)smolvla_device_malloc(m, m->n_params * sizeof(floatX));
    m->grads_memory = (float*)smolvla_device_malloc(m, m->n_train * sizeof(float));
    cudaCheck(cudaMemset(m->params_memory, 0, m->n_params * sizeof(floatX)));
    cudaCheck(cudaMemset(m->grads_memory, 0, m->n_train * sizeof(float)));  // the padding stays zero (the norm adds it)
    // optimizer state for the shard's trainable elements only: a frozen tensor is its floatX copy alone
    size_t before = m->device_bytes;
    m->master = (float*)smolvla_device_malloc(m, shard * sizeof(float));
    m->m_memory = (float*)smolvla_device_malloc(m, shard * sizeof(float));
    m->v_memory = (float*)smolvla_device_malloc(m, shard * sizeof(float));
    m->opt_bytes = m->device_bytes - before;
    cudaCheck(cudaMemset(m->master, 0, shard * sizeof(float)));
    cudaCheck(cudaMemset(m->m_memory, 0, shard * sizeof(float)));
    cudaCheck(cudaMemset(m->v_memory, 0, shard * sizeof(float)));
    m->norm_partial = (float*)smolvla_device_malloc(m, NORM_BLOCKS * sizeof(float));
    if (LOSS_SCALING) {
        m->scaler = (float*)smolvla_device_malloc(m, LOSS_SCALER * sizeof(float));
        LossScaleState fresh = {VLA_LOSS_SCALE_DEFAULT, 0, 0};
        smolvla_set_loss_scale(m, &fresh, VLA_LOSS_SCALE_WINDOW_DEFAULT);
    }
    int i = 0;
#define SMOL_POINT_X_(nm, ...) \
    m->params.nm = m->table.spec[i].numel > 0 ? smolvla_param(m, i, 0) : NULL; \
    m->grads.nm = m->domain.numel[i] > 0 ? m->grads_memory + m->domain.offset[i] : NULL; \
    i++;
    SMOLVLA_PARAMETERS(SMOL_POINT_X_, c)
#undef SMOL_POINT_X_
    smolvla_buckets_build(&m->buckets, c, &m->table, &m->domain);
    // RoPE as LeRobot's apply_rope: timescale theta^e, e = float32(2/HS) * k, pow correctly rounded
    // (in double, then float); angle = pos / timescale in float32
    int T = smolvla_n_prefix(c) + smolvla_n_suffix(c), half = c->head_dim / 2;
    float* cs = (float*)mallocCheck((size_t)T * half * 2 * sizeof(float));
    for (int k = 0; k < half; k++) {
        float e = (float)(2.0 / c->head_dim) * (float)k;
        float timescale = (float)pow((double)c->rope_theta, (double)e);
        for (int pos = 0; pos < T; pos++) {
            float angle = (float)pos / timescale;
            cs[(size_t)pos * half + k] = (float)cos((double)angle);
            cs[(size_t)T * half + (size_t)pos * half + k] = (float)sin((double)angle);
        }
    }
    m->rope_cos = (float*)smolvla_device_malloc(m, (size_t)T * half * 2 * sizeof(float));
    m->rope_sin = m->rope_cos + (size_t)T * half;
    cudaCheck(cudaMemcpy(m->rope_cos, cs, (size_t)T * half * 2 * sizeof(float), cudaMemcpyHostToDevice));
    free(cs);
    if (m->device_bytes != smolvla_model_bytes(c, mode, shard_world)) {  // what --memory's tables add
        vla_fail("internal: smolvla_build holds %zu bytes, smolvla_model_bytes says %zu", m->device_bytes,
                 smolvla_model_bytes(c, mode, shard_world));
    }
}

// The weights from a host array in the table's layout; AdamW's moments from moment1/2, else zero
static void smolvla_set_params(SmolVLA* m, const float* params, const float* moment1 = NULL,
                               const float* moment2 = NULL) {
    size_t widest = 0, lo = m->shard_lo, hi = m->shard_hi;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        if (m->table.spec[i].numel > widest) { widest = m->table.spec[i].numel; }
    }
    float* scratch;
    cudaCheck(cudaMalloc(&scratch, widest * sizeof(float)));
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &m->table.spec[i];
        size_t n_train = m->domain.numel[i], o = m->domain.offset[i], first;
        cudaCheck(cudaMemcpyAsync(scratch, params + s->offset, s->numel * sizeof(float), cudaMemcpyHostToDevice,
                                  main_stream));
        if (n_train > 0) { convert(m->params_memory + o, scratch, n_train); }
        if (n_train < s->numel) { convert(m->params_memory + m->frozen_at[i], scratch + n_train, s->numel - n_train); }
        size_t n = zero_part(o, n_train, lo, hi, &first);
        if (n > 0) {
            cudaCheck(cudaMemcpyAsync(m->master + (o + first - lo), scratch + first, n * sizeof(float),
                                      cudaMemcpyDeviceToDevice, main_stream));
        }
        cudaCheck(cudaStreamSynchronize(main_stream));  // the scratch is reused by the next tensor
    }
    cudaCheck(cudaFree(scratch));
    float* moments[2] = {m->m_memory, m->v_memory};
    const float* given[2] = {moment1, moment2};
    size_t n = (m->n_opt > lo ? (m->n_opt < hi ? m->n_opt : hi) - lo : 0);  // the shard's real elements
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaMemset(moments[k], 0, (hi - lo) * sizeof(float)));
        if (given[k] != NULL && n > 0) { cudaCheck(cudaMemcpy(moments[k], given[k] + lo, n * sizeof(float), cudaMemcpyHostToDevice)); }
    }
}

// Frees the activations and the sampling graph that reads them, leaving the model at B 0. What is
// freed is forgotten first: a failure part way (which the policy library survives) leaves nothing
// freed twice, and the activations still held counted.
static void smolvla_drop_activations(SmolVLA* m) {
    m->sampling.warm = 0;
    if (m->sampling.graph != NULL) {
        cudaGraphExec_t graph = m->sampling.graph;
        m->sampling.graph = NULL;
        cudaCheck(cudaGraphExecDestroy(graph));
    }
    m->device_bytes -= m->act_bytes;
    m->act_bytes = 0;
    m->B = 0;
    void* acts[3] = {m->acts_x, m->acts_f, m->acts_i};
    m->acts_x = NULL;
    m->acts_f = NULL;
    m->acts_i = NULL;
    for (int k = 0; k < 3; k++) { cudaCheck(cudaFree(acts[k])); }
}

static void smolvla_set_batch(SmolVLA* m, int B) {
    if (m->B == B) { return; }
    smolvla_drop_activations(m);
    const SmolVLAConfig* c = &m->config;
    int mode = m->mode, rc = m->recompute;
    size_t nx, nf, ni;
    smolvla_act_counts(c, mode, B, rc, &nx, &nf, &ni);
    m->acts_x = (floatX*)smolvla_device_malloc(m, nx * sizeof(floatX));
    m->act_bytes += nx * sizeof(floatX);
    m->acts_f = (float*)smolvla_device_malloc(m, nf * sizeof(float));
    m->act_bytes += nf * sizeof(float);
    m->acts_i = (int*)smolvla_device_malloc(m, ni * sizeof(int));
    m->act_bytes += ni * sizeof(int);  // (smolvla_act_bytes's sum, counted as it is allocated)
    floatX* px = m->acts_x;
    float* pf = m->acts_f;
    int* pi = m->acts_i;
#define SMOL_POINT_X_(nm, n) m->acts.nm = px; px += smolvla_act_slot_x(n);
#define SMOL_POINT_F_(nm, n) m->acts.nm = pf; pf += smolvla_act_slot_4(n);
#define SMOL_POINT_I_(nm, n) m->acts.nm = pi; pi += smolvla_act_slot_4(n);
    SMOLVLA_GPU_ACTIVATIONS(SMOL_POINT_X_, SMOL_POINT_F_, SMOL_POINT_I_, c, B, mode, rc)
#undef SMOL_POINT_X_
#undef SMOL_POINT_F_
#undef SMOL_POINT_I_
    m->B = B;
}

// Recompute level rc (RECOMPUTE_*; none when built) from now on: the activations are sized again
static void smolvla_set_recompute(SmolVLA* m, int rc) {
    if (rc < RECOMPUTE_NONE || rc > RECOMPUTE_LAYER) { vla_fail("recompute level %d is not one of 0-2", rc); }
    if (m->recompute == rc) { return; }
    m->recompute = rc;
    int B = m->B;
    m->B = 0;
    if (m->acts_x != NULL) { smolvla_set_batch(m, B); }
}

static void smolvla_free(SmolVLA* m) {
    cudaCheck(cudaFree(m->params_memory)); cudaCheck(cudaFree(m->grads_memory));
    cudaCheck(cudaFree(m->master)); cudaCheck(cudaFree(m->m_memory)); cudaCheck(cudaFree(m->v_memory));
    cudaCheck(cudaFree(m->norm_partial));
    if (m->scaler != NULL) { cudaCheck(cudaFree(m->scaler)); }
    cudaCheck(cudaFree(m->acts_x)); cudaCheck(cudaFree(m->acts_f)); cudaCheck(cudaFree(m->acts_i));
    cudaCheck(cudaFree(m->rope_cos));
    free(m->buckets.first); free(m->buckets.offset); free(m->buckets.count);
    if (m->sampling.graph != NULL) { cudaCheck(cudaGraphExecDestroy(m->sampling.graph)); }
    for (int k = 0; k < 3 && m->sampling.marks[0] != NULL; k++) { cudaCheck(cudaEventDestroy(m->sampling.marks[k])); }
}

// One Llama layer of the VLM or the expert: its weights (floatX) or gradients (float, NULL = frozen)
template <typename T>
struct SmolLayer {
    T *ln1, *wq, *wk, *wv, *wo, *ln2, *gate, *up, *down;
    int C, F;   // stream width, MLP width
    int cross;  // an expert layer attending to the VLM's re-projected keys/values
    float eps, offset;  // its RMSNorms' (the family's)
    int gelu;           // GeGLU (pi0) rather than SwiGLU
};

template <typename T>
static SmolLayer<T> smolvla_layer(const SmolVLA* m, int expert, int l, int grads) {
    const SmolVLAConfig* c = &m->config;
    int cross = expert && smolvla_layer_is_cross(c, l), kind = smolvla_kind_index(c, l);
    int wk = expert ? (cross ? SMOLP_exp_wk_cross : SMOLP_exp_wk_joint) : SMOLP_vlm_wk;
    int wv = expert ? (cross ? SMOLP_exp_wv_cross : SMOLP_exp_wv_joint) : SMOLP_vlm_wv;
    int idx[9] = {expert ? SMOLP_exp_ln1 : SMOLP_vlm_ln1, expert ? SMOLP_exp_wq : SMOLP_vlm_wq, wk, wv,
                  expert ? SMOLP_exp_wo : SMOLP_vlm_wo, expert ? SMOLP_exp_ln2 : SMOLP_vlm_ln2,
                  expert ? SMOLP_exp_gate : SMOLP_vlm_gate, expert ? SMOLP_exp_up : SMOLP_vlm_up,
                  expert ? SMOLP_exp_down : SMOLP_vlm_down};
    T* t[9];
    for (int i = 0; i < 9; i++) {
        int k = expert && (i == 2 || i == 3) ? kind : l;
        t[i] = grads ? (T*)(void*)smolvla_grad(m, idx[i], k) : (T*)(void*)smolvla_param(m, idx[i], k);
    }
    SmolLayer<T> w = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], expert ? c->d_expert : c->d_model,
                      expert ? c->d_expert_ff : c->d_ff, cross, smolvla_rms_eps(c), smolvla_rms_offset(c),
                      smolvla_mlp_gelu(c)};
    return w;
}

// One stack's activations at layer l (N rows), and `out`, the next layer's input
typedef struct {
    floatX *res, *ln1, *q, *k, *v, *att, *mid, *ln2, *gate, *up, *act, *out;
    float *rstd1, *lse, *rstd2;
} SmolLayerActs;

static SmolLayerActs smolvla_layer_acts(const SmolVLA* m, int expert, int l) {
    const SmolVLAConfig* c = &m->config;
    const SmolActivations* a = &m->acts;
    size_t N = expert ? smolvla_rrows(c, m->B) : smolvla_prows(c, m->B), L = (size_t)l;
    size_t La = L % smolvla_attn_slots(c->n_layer, m->recompute), Lm = L % smolvla_mlp_slots(c->n_layer, m->recompute);
    size_t C = expert ? c->d_expert : c->d_model, F = expert ? c->d_expert_ff : c->d_ff;
    size_t D = smolvla_d_attn(c), KV = smolvla_d_kv(c);
    SmolLayerActs x;
    if (expert) {
        x = SmolLayerActs{a->s_res, a->s_ln1, a->s_q, a->s_k, a->s_v, a->s_att, a->s_mid, a->s_ln2, a->s_gate, a->s_up,
                          a->s_act, a->s_res, a->s_rstd1, a->s_lse, a->s_rstd2};
    } else {
        x = SmolLayerActs{a->p_res, a->p_ln1, a->p_q, a->p_k, a->p_v, a->p_att, a->p_mid, a->p_ln2, a->p_gate, a->p_up,
                          a->p_act, a->p_res, a->p_rstd1, a->p_lse, a->p_rstd2};
    }
    size_t Lkv = expert ? La : L;  // the VLM's keys/values are the expert's too: one slot per layer
    x.res += L * N * C; x.ln1 += La * N * C; x.rstd1 += La * N;
    x.q += La * N * D; x.k += Lkv * N * KV; x.v += Lkv * N * KV; x.att += La * N * D; x.lse += La * N * c->n_head;
    x.mid += Lm * N * C; x.ln2 += Lm * N * C; x.rstd2 += Lm * N;
    x.gate += Lm * N * F; x.up += Lm * N * F; x.act += Lm * N * F;
    x.out += (L + 1) * N * C;  // the VLM's last layer has no output (never written: p_res has L slices)
    return x;
}

// Vision layer l's activations (V rows) and `out`: slot l % Kv, input l % (Kv + 1) of v_res
typedef struct {
    floatX *res, *ln1, *q, *k, *v, *att, *mid, *ln2, *fc1, *gelu, *out;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
} SmolVisionActs;

static SmolVisionActs smolvla_vision_acts(const SmolVLA* m, int l) {
    const SmolVLAConfig* c = &m->config;
    const SmolActivations* a = &m->acts;
    size_t kept = smolvla_vis_kept(c, m->mode), V = smolvla_vrows(c, m->B);
    size_t La = (size_t)l % smolvla_vis_attn(c, m->mode, m->recompute), Lm = (size_t)l % smolvla_vis_mlp(c, m->mode, m->recompute);
    size_t VC = V * c->vis_width, VF = V * c->vis_ff;
    SmolVisionActs x = {a->v_res + (size_t)l % (kept + 1) * VC, a->v_ln1 + La * VC, a->v_q + La * VC, a->v_k + La * VC,
                        a->v_v + La * VC, a->v_att + La * VC, a->v_mid + Lm * VC, a->v_ln2 + Lm * VC, a->v_fc1 + Lm * VF,
                        a->v_gelu + Lm * VF, a->v_res + (size_t)(l + 1) % (kept + 1) * VC,
                        a->v_mean1 + La * V, a->v_rstd1 + La * V, a->v_lse + La * V * c->vis_heads, a->v_mean2 + Lm * V,
                        a->v_rstd2 + Lm * V};
    return x;
}

// Attention under the sequence's mask: Tq queries from token q0, keys k0/v0 (Nk0) then k1/v1 (Nk1)
static GqaAttn smolvla_attn(const SmolVLA* m, int Tq, int q0, const floatX* k0, const floatX* v0, int Nk0, const floatX* k1,
                         const floatX* v1, int Nk1) {
    const SmolVLAConfig* c = &m->config;
    GqaAttn a = {k0, v0, k1, v1, m->acts.block, m->B, c->n_head, c->n_kv_head, c->head_dim,
                 Tq, q0, Nk0, Nk1, smolvla_n_prefix(c) + smolvla_n_suffix(c)};
    return a;
}

static void smolvla_rmsnorm_backward(SmolVLA* m, float* dres, floatX* dres_x, float* dw, const floatX* dout,
                                  const floatX* inp, const floatX* w, const float* rstd, int N, int C) {
    if (dw == NULL) {
        dw = m->acts.g_dw;
        cudaCheck(cudaMemsetAsync(dw, 0, C * sizeof(float), main_stream));
    }
    rmsnorm_backward(dres, dres_x, dw, m->acts.partial, dout, inp, w, rstd, N, C, smolvla_rms_offset(&m->config));
}

// attention output -> o_proj + residual -> RMSNorm -> SwiGLU (GeGLU) MLP + residual; with_out 0 skips down_proj
static void smolvla_layer_out_forward(const SmolLayer<floatX>* w, const SmolLayerActs* x, int N, int D, int with_out = 1) {
    matmul_forward(x->mid, x->att, w->wo, NULL, x->res, N, D, w->C);
    rmsnorm_forward(x->ln2, x->rstd2, x->mid, w->ln2, N, w->C, w->eps, w->offset);
    matmul_forward(x->gate, x->ln2, w->gate, NULL, NULL, N, w->C, w->F);
    matmul_forward(x->up, x->ln2, w->up, NULL, NULL, N, w->C, w->F);
    if (w->gelu) { geglu_forward(x->act, x->gate, x->up, (size_t)N * w->F); }
    else { swiglu_forward(x->act, x->gate, x->up, (size_t)N * w->F); }
    if (with_out) { matmul_forward(x->out, x->act, w->down, NULL, x->mid, N, w->F, w->C); }
}

// Backward of smolvla_layer_out_forward: dres, dres_x hold d(out) (N, C), left holding d(mid); g_att d(att)
static void smolvla_layer_out_backward(SmolVLA* m, const SmolLayer<floatX>* w, const SmolLayer<float>* g,
                                    const SmolLayerActs* x, float* dres, floatX* dres_x, int N, int D) {
    SmolActivations* a = &m->acts;
    int C = w->C, F = w->F;
    matmul_backward_input(a->g_act, dres_x, w->down, N, F, C, 0.0f);
    if (g->down != NULL) { matmul_backward_weight(g->down, dres_x, x->act, N, F, C); }
    if (w->gelu) { geglu_backward(a->g_gate, a->g_up, a->g_act, x->gate, x->up, (size_t)N * F); }
    else { swiglu_backward(a->g_gate, a->g_up, a->g_act, x->gate, x->up, (size_t)N * F); }
    matmul_backward_input(a->g_ln, a->g_gate, w->gate, N, C, F, 0.0f);
    matmul_backward_input(a->g_ln, a->g_up, w->up, N, C, F, 1.0f);
    if (g->gate != NULL) { matmul_backward_weight(g->gate, a->g_gate, x->ln2, N, C, F); }
    if (g->up != NULL) { matmul_backward_weight(g->up, a->g_up, x->ln2, N, C, F); }
    smolvla_rmsnorm_backward(m, dres, dres_x, g->ln2, a->g_ln, x->mid, w->ln2, x->rstd2, N, C);
    matmul_backward_input(a->g_att, dres_x, w->wo, N, D, C, 0.0f);
    if (g->wo != NULL) { matmul_backward_weight(g->wo, dres_x, x->att, N, D, C); }
}

// Backward of ln1 and q/k/v, rotated back from RoPE (dq NULL: the VLM's last layer; dk, dv NULL: cross)
static void smolvla_layer_qkv_backward(SmolVLA* m, const SmolLayer<floatX>* w, const SmolLayer<float>* g,
                                    const SmolLayerActs* x, float* dres, floatX* dres_x, const floatX* dq,
                                    const floatX* dk, const floatX* dv, int N) {
    SmolActivations* a = &m->acts;
    int C = w->C, D = smolvla_d_attn(&m->config), KV = smolvla_d_kv(&m->config);
    float beta = 0.0f;
    if (dq != NULL) {
        matmul_backward_input(a->g_ln, dq, w->wq, N, C, D, beta);
        if (g->wq != NULL) { matmul_backward_weight(g->wq, dq, x->ln1, N, C, D); }
        beta = 1.0f;
    }
    if (dk != NULL) {
        matmul_backward_input(a->g_ln, dk, w->wk, N, C, KV, beta);
        if (g->wk != NULL) { matmul_backward_weight(g->wk, dk, x->ln1, N, C, KV); }
        matmul_backward_input(a->g_ln, dv, w->wv, N, C, KV, 1.0f);
        if (g->wv != NULL) { matmul_backward_weight(g->wv, dv, x->ln1, N, C, KV); }
    }
    smolvla_rmsnorm_backward(m, dres, dres_x, g->ln1, a->g_ln, x->res, w->ln1, x->rstd1, N, C);
}

// ---- forward

// Every camera's frames -> acts.pixels (NV, 3, S, S), camera-major (image n = cam * B + b)
static void smolvla_prepare_images(SmolVLA* m, const SmolInputs* in) {
    const SmolVLAConfig* c = &m->config;
    size_t per = (size_t)3 * c->img * c->img;
    for (int cam = 0; cam < c->n_cam; cam++) {
        resize_pad(m->acts.pixels + (size_t)cam * in->B * per, in->frames[cam], in->B, in->frame_h[cam], in->frame_w[cam],
                   c->img, in->frame_stride, 0, smolvla_pad_centred(c));
    }
}

// SigLIP's attention call of a layer: its images' own keys and values, no mask
static GqaAttn smolvla_vision_attn(const SmolVLA* m, const SmolVisionActs& x) {
    const SmolVLAConfig* c = &m->config;
    int NV = (int)smolvla_images(c, m->B), Nv = smolvla_grid(c) * smolvla_grid(c);
    GqaAttn a = {x.k, x.v, NULL, NULL, NULL, NV, c->vis_heads, c->vis_heads, c->vis_width / c->vis_heads, Nv, 0, Nv, 0,
                 Nv};
    return a;
}

// SigLIP layer l: x.res -> x.out. redo (the backward's recomputation): only what that level dropped,
// by the same kernels on the same inputs: attn the attention half, layer all but fc2.
static void smolvla_vision_layer_forward(SmolVLA* m, int l, int redo) {
    const SmolVLAConfig* c = &m->config;
    int V = (int)smolvla_vrows(c, m->B), Cv = c->vis_width, Fv = c->vis_ff;
    SmolVisionActs x = smolvla_vision_acts(m, l);
    layernorm_forward(x.ln1, x.mean1, x.rstd1, x.res, smolvla_param(m, SMOLP_vis_ln1_w, l), smolvla_param(m, SMOLP_vis_ln1_b, l),
                      V, Cv);
    matmul_forward(x.q, x.ln1, smolvla_param(m, SMOLP_vis_wq, l), smolvla_param(m, SMOLP_vis_bq, l), NULL, V, Cv, Cv);
    matmul_forward(x.k, x.ln1, smolvla_param(m, SMOLP_vis_wk, l), smolvla_param(m, SMOLP_vis_bk, l), NULL, V, Cv, Cv);
    matmul_forward(x.v, x.ln1, smolvla_param(m, SMOLP_vis_wv, l), smolvla_param(m, SMOLP_vis_bv, l), NULL, V, Cv, Cv);
    gqa_attention_forward(x.att, x.lse, x.q, smolvla_vision_attn(m, x));
    if (redo == RECOMPUTE_ATTN) { return; }
    matmul_forward(x.mid, x.att, smolvla_param(m, SMOLP_vis_wo, l), smolvla_param(m, SMOLP_vis_bo, l), x.res, V, Cv, Cv);
    layernorm_forward(x.ln2, x.mean2, x.rstd2, x.mid, smolvla_param(m, SMOLP_vis_ln2_w, l), smolvla_param(m, SMOLP_vis_ln2_b, l),
                      V, Cv);
    if (m->mode == TRAIN_MODE_ALL) {  // the backward pass reads fc1 (GELU's derivative)
        matmul_forward(x.fc1, x.ln2, smolvla_param(m, SMOLP_vis_fc1_w, l), smolvla_param(m, SMOLP_vis_fc1_b, l), NULL, V, Cv, Fv);
        gelu_forward(x.gelu, x.fc1, (size_t)V * Fv);
    } else {  // a frozen tower: GELU in the product's epilogue
        matmul_forward_gelu(x.gelu, x.ln2, smolvla_param(m, SMOLP_vis_fc1_w, l), smolvla_param(m, SMOLP_vis_fc1_b, l), V, Cv, Fv);
    }
    if (redo != RECOMPUTE_NONE) { return; }
    matmul_forward(x.out, x.gelu, smolvla_param(m, SMOLP_vis_fc2_w, l), smolvla_param(m, SMOLP_vis_fc2_b, l), x.mid, V, Fv, Cv);
}

// SigLIP over every image: pixels -> acts.v_out (V, Cv); position ids are the identity
static void smolvla_vision_forward(SmolVLA* m) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int NV = (int)smolvla_images(c, m->B), Nv = smolvla_grid(c) * smolvla_grid(c), V = (int)smolvla_vrows(c, m->B);
    int Cv = c->vis_width;
    size_t VC = (size_t)V * Cv;
    LAUNCH_1D(patchify_chw_kernel, (size_t)V * smolvla_patch_dim(c), a->patches, a->pixels, NV, c->img, c->patch);
    matmul_forward(a->v_res, a->patches, m->params.vis_patch_w, m->params.vis_patch_b, NULL, V, smolvla_patch_dim(c), Cv);
    LAUNCH_1D(add_periodic_kernel, VC, a->v_res, m->params.vis_pos, VC, (size_t)Nv * Cv);
    for (int l = 0; l < c->vis_layers; l++) { smolvla_vision_layer_forward(m, l, RECOMPUTE_NONE); }
    layernorm_forward(a->v_out, a->v_omean, a->v_orstd, smolvla_vision_acts(m, c->vis_layers - 1).out, m->params.vis_post_w,
                      m->params.vis_post_b, V, Cv);
}

// p_res[0] = [camera tokens][language][state (SmolVLA)] per sample, block ids and RoPE positions of
// [prefix ; suffix]; sqrt(C) in float32, for the image tokens too in SmolVLA. state_tok: the state's
// token, the prefix's last (SmolVLA) or the suffix's first (pi0: smolvla_suffix_embed places it).
static void smolvla_prefix_embed(SmolVLA* m, const SmolInputs* in) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = smolvla_image_tokens(c), Np = smolvla_n_prefix(c), Lt = c->max_text;
    int NV = (int)smolvla_images(c, B), S2C = c->scale_factor * c->scale_factor * c->vis_width, G = smolvla_grid(c);
    float scale = sqrtf((float)C);
    pixel_shuffle_forward(a->shuffled, a->v_out, NV, G, G, c->vis_width, c->scale_factor);
    matmul_forward(a->img_tok, a->shuffled, m->params.connector_w, m->params.connector_b, NULL, NV * NI, S2C, C);
    convert(a->state_x, in->state, (size_t)B * c->max_state_dim);
    matmul_forward(a->state_tok, a->state_x, m->params.state_w, m->params.state_b, NULL, B, c->max_state_dim,
                   smolvla_state_width(c));
    cudaCheck(cudaMemcpyAsync(a->tokens, in->tokens, (size_t)B * Lt * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                              main_stream));
    LAUNCH_1D(smolvla_prefix_embed_kernel, (size_t)B * Np * C, a->p_res, a->img_tok, m->params.embed_tokens, a->tokens,
              a->state_tok, B, c->n_cam, NI, Lt, Np, C, scale, smolvla_scales_images(c) ? scale : 1.0f);
    LAUNCH_1D(smolvla_sequence_kernel, B, a->block, a->pos, a->x_pos, in->token_mask, B, c->n_cam * NI, Lt, Np,
              smolvla_n_suffix(c), smolvla_actions_causal(c));
}

// VLM layer l; the last computes only ln1, keys and values. redo: keys and values kept at every level.
static void smolvla_vlm_layer_forward(SmolVLA* m, int l, int redo) {
    const SmolVLAConfig* c = &m->config;
    int P = (int)smolvla_prows(c, m->B), Np = smolvla_n_prefix(c), T = Np + smolvla_n_suffix(c);
    int D = smolvla_d_attn(c), KV = smolvla_d_kv(c);
    SmolLayer<floatX> w = smolvla_layer<floatX>(m, 0, l, 0);
    SmolLayerActs x = smolvla_layer_acts(m, 0, l);
    rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, P, w.C, w.eps, w.offset);
    if (redo == RECOMPUTE_NONE) {
        matmul_forward(x.k, x.ln1, w.wk, NULL, NULL, P, w.C, KV);
        rope_at(x.k, x.k, m->rope_cos, m->rope_sin, m->acts.pos, P, Np, T, c->n_kv_head, c->head_dim, 1.0f);
        matmul_forward(x.v, x.ln1, w.wv, NULL, NULL, P, w.C, KV);
    }
    if (l == c->n_layer - 1) { return; }
    matmul_forward(x.q, x.ln1, w.wq, NULL, NULL, P, w.C, D);
    rope_at(x.q, x.q, m->rope_cos, m->rope_sin, m->acts.pos, P, Np, T, c->n_head, c->head_dim, 1.0f);
    gqa_attention_forward(x.att, x.lse, x.q, smolvla_attn(m, Np, 0, x.k, x.v, Np, NULL, NULL, 0));
    if (redo == RECOMPUTE_ATTN) { return; }
    smolvla_layer_out_forward(&w, &x, P, D, redo == RECOMPUTE_NONE);
}

static void smolvla_vlm_forward(SmolVLA* m) {
    for (int l = 0; l < m->config.n_layer; l++) { smolvla_vlm_layer_forward(m, l, RECOMPUTE_NONE); }
}

// s_res[0]: the action tokens action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time
// embedding]))), after pi0's state token (state_tok, made by smolvla_prefix_embed)
static void smolvla_suffix_embed(SmolVLA* m, const float* t) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, H = c->chunk, Ns = smolvla_n_suffix(c), Ce = c->d_expert, A = (int)smolvla_arows(c, B);
    matmul_forward(a->a_in, a->x_t, m->params.action_in_w, m->params.action_in_b, NULL, A, c->max_action_dim, Ce);
    LAUNCH_1D(action_embed_kernel, (size_t)A * 2 * Ce, a->a_emb, a->a_in, t, B, H, Ce);
    matmul_forward(a->t_pre, a->a_emb, m->params.time_in_w, m->params.time_in_b, NULL, A, 2 * Ce, Ce);
    LAUNCH_1D(silu_forward_kernel, (size_t)A * Ce, a->t_act, a->t_pre, (size_t)A * Ce);
    if (!smolvla_state_in_suffix(c)) {
        matmul_forward(a->s_res, a->t_act, m->params.time_out_w, m->params.time_out_b, NULL, A, Ce, Ce);
        return;
    }
    matmul_forward(a->a_tok, a->t_act, m->params.time_out_w, m->params.time_out_b, NULL, A, Ce, Ce);
    LAUNCH_1D(scatter_rows_kernel, (size_t)B * Ce, a->s_res, a->state_tok, B, Ns, 0, 1, Ce);
    LAUNCH_1D(scatter_rows_kernel, (size_t)A * Ce, a->s_res, a->a_tok, B, Ns, 1, H, Ce);
}

// Expert layer l over the suffix (the actions, after pi0's state token). Joint layer: the suffix's
// q/k/v with RoPE after the valid prefix, keys = [the VLM's K/V ; the suffix's own] under the block mask. Cross layer: q with RoPE from 0, keys/values = the
// VLM's post-RoPE K/V re-projected by the expert (no second RoPE). reuse_cross_kv: re-projections valid.
static void smolvla_expert_layer_forward(SmolVLA* m, int l, int reuse_cross_kv, int redo) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int R = (int)smolvla_rrows(c, m->B), P = (int)smolvla_prows(c, m->B), Np = smolvla_n_prefix(c);
    int H = smolvla_n_suffix(c), T = Np + H, D = smolvla_d_attn(c), KV = smolvla_d_kv(c), Ce = c->d_expert;
    SmolLayer<floatX> w = smolvla_layer<floatX>(m, 1, l, 0);
    SmolLayerActs x = smolvla_layer_acts(m, 1, l), px = smolvla_layer_acts(m, 0, l);
    rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, R, Ce, w.eps, w.offset);
    matmul_forward(x.q, x.ln1, w.wq, NULL, NULL, R, Ce, D);
    GqaAttn keys;
    if (!w.cross) {
        rope_at(x.q, x.q, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_head, c->head_dim, 1.0f);
        matmul_forward(x.k, x.ln1, w.wk, NULL, NULL, R, Ce, KV);
        rope_at(x.k, x.k, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_kv_head, c->head_dim, 1.0f);
        matmul_forward(x.v, x.ln1, w.wv, NULL, NULL, R, Ce, KV);
        keys = smolvla_attn(m, H, Np, px.k, px.v, Np, x.k, x.v, H);
    } else {
        rope_at(x.q, x.q, m->rope_cos, m->rope_sin, a->x_pos, R, H, H, c->n_head, c->head_dim, 1.0f);
        floatX* ck = a->c_k + (size_t)l * P * KV;
        floatX* cv = a->c_v + (size_t)l * P * KV;
        if (!reuse_cross_kv && redo == RECOMPUTE_NONE) {
            matmul_forward(ck, px.k, w.wk, NULL, NULL, P, KV, KV);
            matmul_forward(cv, px.v, w.wv, NULL, NULL, P, KV, KV);
        }
        keys = smolvla_attn(m, H, Np, ck, cv, Np, NULL, NULL, 0);
    }
    gqa_attention_forward(x.att, x.lse, x.q, keys);
    if (redo == RECOMPUTE_ATTN) { return; }
    smolvla_layer_out_forward(&w, &x, R, D, redo == RECOMPUTE_NONE);
}

// The expert's layers over s_res[0] -> final norm -> action_out_proj of the action rows (pi0's
// gathered into f_act first): acts.v_t (B, H, Amax), fp32
static void smolvla_expert_forward(SmolVLA* m, int reuse_cross_kv) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int R = (int)smolvla_rrows(c, m->B), A = (int)smolvla_arows(c, m->B), Ce = c->d_expert;
    for (int l = 0; l < c->n_layer; l++) { smolvla_expert_layer_forward(m, l, reuse_cross_kv, RECOMPUTE_NONE); }
    rmsnorm_forward(a->f_ln, a->f_rstd, a->s_res + (size_t)c->n_layer * R * Ce, m->params.exp_norm, R, Ce,
                    smolvla_rms_eps(c), smolvla_rms_offset(c));
    const floatX* actions = a->f_ln;
    if (smolvla_state_in_suffix(c)) {
        LAUNCH_1D(gather_rows_kernel, (size_t)A * Ce, a->f_act, a->f_ln, m->B, smolvla_n_suffix(c), 1, c->chunk, Ce);
        actions = a->f_act;
    }
    // the velocity in fp32: the bias in every row, the product added on it (beta = 1)
    LAUNCH_1D(bias_rows_kernel, (size_t)A * c->max_action_dim, a->v_t, m->params.action_out_b, A, c->max_action_dim);
    matmul_forward_accumulate_f32(a->v_t, actions, m->params.action_out_w, A, Ce, c->max_action_dim);
}

// Images, vision tower, prefix embeddings and the VLM: everything the actions attend to
static void smolvla_encode_prefix(SmolVLA* m, const SmolInputs* in) {
    smolvla_set_batch(m, in->B);
    prof_phase("images");
    smolvla_prepare_images(m, in);
    prof_phase("vision fwd");
    smolvla_vision_forward(m);
    prof_phase("prefix embed");
    smolvla_prefix_embed(m, in);
    prof_phase("vlm fwd");
    smolvla_vlm_forward(m);
}

// Training forward. Flow matching: x_t = t noise + (1 - t) actions, target u = noise - actions,
// velocity v_t. The loss is LeRobot's mean over valid entries of the whole step, so the forward only
// sums: errors into acts.scalars[0], entries into scalars[3]; smolvla_loss_finish divides.
static void smolvla_forward(SmolVLA* m, const SmolInputs* in, int micro) {
    const SmolVLAConfig* c = &m->config;
    smolvla_encode_prefix(m, in);
    SmolActivations* a = &m->acts;
    int B = in->B, HA = c->chunk * c->max_action_dim, n = B * HA;
    prof_phase("expert fwd");
    LAUNCH_1D(flow_inputs_kernel, n, a->x_t, a->target, in->actions, in->noise, in->t, HA, n);
    smolvla_suffix_embed(m, in->t);
    smolvla_expert_forward(m, 0);
    prof_phase("loss");
    const float* is_pad = smolvla_loss_masks_pad(c) ? in->action_is_pad : NULL;  // pi0's loss counts every slot
    valid_entries_kernel<<<1, BLOCK, 0, main_stream>>>(a->scalars + 3, is_pad, B * c->chunk, c->action_dim, micro > 0);
    launchCheck();
    int blocks = ceil_div(n, BLOCK);
    smolvla_loss_kernel<<<blocks, BLOCK, 0, main_stream>>>(a->d_vt, a->loss_partial, a->v_t, a->target, is_pad,
                                                           c->action_dim, c->max_action_dim, n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(a->scalars, a->loss_partial, blocks, 1.0, 0, micro > 0);
    launchCheck();
    if (m->scaler != NULL) {  // fp16: the backward starts from the scaled loss's gradient
        if (micro == 0) {
            int e = 0;
            while ((1LL << e) < (long long)c->chunk * c->action_dim) { e++; }
            loss_scale_begin_kernel<<<1, 1, 0, main_stream>>>(m->scaler, ldexpf(1.0f, -e));
            launchCheck();
        }
        LAUNCH_1D(loss_scale_grad_kernel, n, a->d_vt, n, m->scaler);
    }
}

// Once the sums hold every micro-step and rank: the mean loss, and the gradients scaled to the mean's
static void smolvla_loss_finish(SmolVLA* m) {
    loss_normalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars);
    launchCheck();
    if (m->scaler != NULL) {
        loss_unscale_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars, m->scaler);
        launchCheck();
    }
    size_t n = m->shard_hi - m->shard_lo;
    LAUNCH_1D(scale_kernel, n, m->grads_memory + m->shard_lo, n, m->acts.scalars + 4);
}

// ---- backward

// d acts.d_vt -> the expert -> d s_res[0] in g_res / g_res_x (R, Ce); VLM k/v gradients into dp_k/dp_v
static void smolvla_expert_backward(SmolVLA* m, int state_only) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, R = (int)smolvla_rrows(c, B), A = (int)smolvla_arows(c, B), P = (int)smolvla_prows(c, B);
    int Np = smolvla_n_prefix(c), H = smolvla_n_suffix(c), T = Np + H, D = smolvla_d_attn(c), KV = smolvla_d_kv(c);
    int Ce = c->d_expert, L = c->n_layer;
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    if (!smolvla_state_in_suffix(c)) {
        matmul_backward_input(a->g_ln, a->d_vt, m->params.action_out_w, A, Ce, c->max_action_dim, 0.0f);
        matmul_backward_weight(m->grads.action_out_w, a->d_vt, a->f_ln, A, Ce, c->max_action_dim);
    } else {  // the action rows' gradients into place; the state rows' output feeds nothing
        matmul_backward_input(a->g_tok, a->d_vt, m->params.action_out_w, A, Ce, c->max_action_dim, 0.0f);
        matmul_backward_weight(m->grads.action_out_w, a->d_vt, a->f_act, A, Ce, c->max_action_dim);
        cudaCheck(cudaMemsetAsync(a->g_ln, 0, (size_t)R * Ce * sizeof(floatX), main_stream));
        LAUNCH_1D(scatter_rows_kernel, (size_t)A * Ce, a->g_ln, a->g_tok, B, H, 1, c->chunk, Ce);
    }
    bias_backward(m->grads.action_out_b, a->partial, a->d_vt, A, c->max_action_dim);
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)R * Ce * sizeof(float), main_stream));
    smolvla_rmsnorm_backward(m, dres, dres_x, m->grads.exp_norm, a->g_ln, a->s_res + (size_t)L * R * Ce, m->params.exp_norm,
                          a->f_rstd, R, Ce);
    for (int l = L - 1; l >= 0; l--) {
        if (m->recompute != RECOMPUTE_NONE) { smolvla_expert_layer_forward(m, l, 0, m->recompute); }
        SmolLayer<floatX> w = smolvla_layer<floatX>(m, 1, l, 0);
        SmolLayer<float> g = smolvla_layer<float>(m, 1, l, 1);
        SmolLayerActs x = smolvla_layer_acts(m, 1, l), px = smolvla_layer_acts(m, 0, l);
        float* dpk = a->dp_k + (size_t)l * P * KV;
        float* dpv = a->dp_v + (size_t)l * P * KV;
        smolvla_layer_out_backward(m, &w, &g, &x, dres, dres_x, R, D);
        if (!w.cross) {
            cudaCheck(cudaMemsetAsync(a->g_kf, 0, (size_t)R * KV * sizeof(float), main_stream));
            cudaCheck(cudaMemsetAsync(a->g_vf, 0, (size_t)R * KV * sizeof(float), main_stream));
            gqa_attention_backward(a->g_q, dpk, dpv, a->g_kf, a->g_vf, a->g_att, x.q, x.att, x.lse, a->delta,
                                   smolvla_attn(m, H, Np, px.k, px.v, Np, x.k, x.v, H));
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_head, c->head_dim, -1.0f);
            rope_at(a->g_kx, a->g_kf, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_kv_head, c->head_dim, -1.0f);
            convert(a->g_vx, a->g_vf, (size_t)R * KV);
            smolvla_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, a->g_q, a->g_kx, a->g_vx, R);
        } else {
            floatX* ck = a->c_k + (size_t)l * P * KV;
            floatX* cv = a->c_v + (size_t)l * P * KV;
            cudaCheck(cudaMemsetAsync(a->g_kf, 0, (size_t)P * KV * sizeof(float), main_stream));
            cudaCheck(cudaMemsetAsync(a->g_vf, 0, (size_t)P * KV * sizeof(float), main_stream));
            // every prefix row's: the cross k_proj/v_proj weights need them all
            gqa_attention_backward(a->g_q, a->g_kf, a->g_vf, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta,
                                   smolvla_attn(m, H, Np, ck, cv, Np, NULL, NULL, 0));
            convert(a->g_kx, a->g_kf, (size_t)P * KV);
            convert(a->g_vx, a->g_vf, (size_t)P * KV);
            matmul_backward_weight(g.wk, a->g_kx, px.k, P, KV, KV);
            matmul_backward_weight(g.wv, a->g_vx, px.v, P, KV, KV);
            // through the re-projection into the VLM's post-RoPE K/V (fp32, accumulated)
            size_t first = state_only ? (size_t)(Np - 1) * KV : 0;
            int rows = state_only ? B : P, ld = state_only ? Np * KV : KV;
            matmul_backward_input_accumulate_f32(dpk + first, a->g_kx + first, w.wk, rows, KV, KV, ld, ld);
            matmul_backward_input_accumulate_f32(dpv + first, a->g_vx + first, w.wv, rows, KV, KV, ld, ld);
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->x_pos, R, H, H, c->n_head, c->head_dim, -1.0f);
            smolvla_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, a->g_q, NULL, NULL, R);
        }
        smolvla_bucket_done(m, smolvla_bucket(c, TOWER_EXPERT, l));
    }
}

// d s_res[0] (g_res_x) -> action_time_mlp_out, SiLU, action_time_mlp_in -> action_in_proj; pi0's
// state token -> state_proj
static void smolvla_suffix_embed_backward(SmolVLA* m) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, R = (int)smolvla_arows(c, B), Ce = c->d_expert;
    const floatX* dtok = a->g_res_x;  // (A, Ce) d of the action tokens
    if (smolvla_state_in_suffix(c)) {  // the suffix's rows apart: the action tokens into g_ln, the states
        int Ns = smolvla_n_suffix(c);
        LAUNCH_1D(gather_rows_kernel, (size_t)B * Ce, a->g_state, a->g_res_x, B, Ns, 0, 1, Ce);
        LAUNCH_1D(gather_rows_kernel, (size_t)R * Ce, a->g_ln, a->g_res_x, B, Ns, 1, c->chunk, Ce);
        matmul_backward_weight(m->grads.state_w, a->g_state, a->state_x, B, c->max_state_dim, Ce);
        bias_backward(m->grads.state_b, a->partial, a->g_state, B, Ce);
        dtok = a->g_ln;
    }
    floatX* dtact = a->g_tok;  // (A, Ce)
    matmul_backward_input(dtact, dtok, m->params.time_out_w, R, Ce, Ce, 0.0f);
    matmul_backward_weight(m->grads.time_out_w, dtok, a->t_act, R, Ce, Ce);
    bias_backward(m->grads.time_out_b, a->partial, dtok, R, Ce);
    LAUNCH_1D(silu_backward_kernel, (size_t)R * Ce, dtact, dtact, a->t_pre, (size_t)R * Ce);
    matmul_backward_input(a->g_emb, dtact, m->params.time_in_w, R, 2 * Ce, Ce, 0.0f);
    matmul_backward_weight(m->grads.time_in_w, dtact, a->a_emb, R, 2 * Ce, Ce);
    bias_backward(m->grads.time_in_b, a->partial, dtact, R, Ce);
    // only the action_in half of g_emb has parameters behind it: read it with row stride 2 Ce
    matmul_backward_weight(m->grads.action_in_w, a->g_emb, a->x_t, R, c->max_action_dim, Ce, 2 * Ce);
    bias_backward(m->grads.action_in_b, a->partial, a->g_emb, R, Ce, 2 * Ce);
}

// The state rows (row Np - 1 of each sample) of a VLM layer's x into the r_*: B rows of one query
static SmolLayerActs smolvla_state_rows(SmolVLA* m, const SmolLayerActs* x, int last) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, Np = smolvla_n_prefix(c), C = c->d_model, F = c->d_ff, D = smolvla_d_attn(c);
    SmolLayerActs r = {a->r_res, a->r_ln1, a->r_q, NULL, NULL, a->r_att, a->r_mid, a->r_ln2, a->r_gate, a->r_up, a->r_act,
                       NULL, a->r_rstd1, a->r_lse, a->r_rstd2};
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.res, x->res, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.ln1, x->ln1, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B, r.rstd1, x->rstd1, B, Np, Np - 1, 1, 1);
    if (last) { return r; }  // the last layer: ln1, k and v only
    LAUNCH_1D(gather_rows_kernel, (size_t)B * D, r.q, x->q, B, Np, Np - 1, 1, D);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * D, r.att, x->att, B, Np, Np - 1, 1, D);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * c->n_head, r.lse, x->lse, B * c->n_head, Np, Np - 1, 1, 1);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.mid, x->mid, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.ln2, x->ln2, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B, r.rstd2, x->rstd2, B, Np, Np - 1, 1, 1);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.gate, x->gate, B, Np, Np - 1, 1, F);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.up, x->up, B, Np, Np - 1, 1, F);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.act, x->act, B, Np, Np - 1, 1, F);
    return r;
}

// The VLM's layers backward from dp_k, dp_v down to d p_res[0] in g_res / g_res_x (P rows, or B state
// rows). The last layer (ln1 -> k/v) is frozen in every mode, yet the gradient passes through it.
static void smolvla_vlm_backward(SmolVLA* m, int state_only) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, P = (int)smolvla_prows(c, B), Np = smolvla_n_prefix(c), T = Np + smolvla_n_suffix(c);
    int D = smolvla_d_attn(c), KV = smolvla_d_kv(c);
    int N = state_only ? B : P;  // rows taken down
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * c->d_model * sizeof(float), main_stream));
    for (int l = c->n_layer - 1; l >= 0; l--) {
        int last = l == c->n_layer - 1;
        if (m->recompute != RECOMPUTE_NONE) { smolvla_vlm_layer_forward(m, l, m->recompute); }  // every row: same kernels
        SmolLayer<floatX> w = smolvla_layer<floatX>(m, 0, l, 0);
        SmolLayer<float> g = smolvla_layer<float>(m, 0, l, 1);
        SmolLayerActs all = smolvla_layer_acts(m, 0, l);
        SmolLayerActs x = state_only ? smolvla_state_rows(m, &all, last) : all;
        float* dk = a->dp_k + (size_t)l * P * KV;
        float* dv = a->dp_v + (size_t)l * P * KV;
        const floatX* dq = NULL;
        if (!last) {
            smolvla_layer_out_backward(m, &w, &g, &x, dres, dres_x, N, D);
            // the taken rows' queries (the state's, token Np - 1, or all) over every prefix key
            GqaAttn keys = smolvla_attn(m, state_only ? 1 : Np, state_only ? Np - 1 : 0, all.k, all.v, Np, NULL, NULL, 0);
            gqa_attention_backward(a->g_q, dk, dv, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta, keys);
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->pos + (state_only ? Np - 1 : 0), N, N / B, T,
                    c->n_head, c->head_dim, -1.0f);
            dq = a->g_q;
        }
        if (state_only) {  // the state rows of this layer's key/value gradients
            LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * KV, a->r_dk, dk, B, Np, Np - 1, 1, KV);
            LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * KV, a->r_dv, dv, B, Np, Np - 1, 1, KV);
            dk = a->r_dk;
            dv = a->r_dv;
        }
        rope_at(a->g_kx, dk, m->rope_cos, m->rope_sin, a->pos + (state_only ? Np - 1 : 0), N, N / B, T, c->n_kv_head,
                c->head_dim, -1.0f);
        convert(a->g_vx, dv, (size_t)N * KV);
        smolvla_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, dq, a->g_kx, a->g_vx, N);
        smolvla_bucket_done(m, smolvla_bucket(c, TOWER_VLM, l));
    }
}

// d p_res[0] -> state_proj (SmolVLA's state token); embed_tokens (not the pad id's row) and the
// connector; g_shuf = d shuffled
static void smolvla_prefix_embed_backward(SmolVLA* m, int state_only) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = smolvla_image_tokens(c), Np = smolvla_n_prefix(c), Lt = c->max_text;
    int NV = (int)smolvla_images(c, B), S2C = c->scale_factor * c->scale_factor * c->vis_width;
    float scale = sqrtf((float)C);
    if (!smolvla_state_in_suffix(c)) {  // the state rows: row Np - 1 of each sample, or the B rows of state_only
        const floatX* dstate = state_only ? a->g_res_x : a->g_res_x + (size_t)(Np - 1) * C;
        int ld = state_only ? C : Np * C;
        matmul_backward_weight(m->grads.state_w, dstate, a->state_x, B, c->max_state_dim, C, ld);
        bias_backward(m->grads.state_b, a->partial, dstate, B, C, ld);
    }
    if (state_only) { return; }
    if (m->grads.embed_tokens != NULL) {
        embed_tokens_backward_kernel<<<B * Lt, BLOCK, 0, main_stream>>>(m->grads.embed_tokens, a->g_res, a->tokens, B,
                                                                        c->n_cam * NI, Lt, Np, C, c->pad_token, scale);
        launchCheck();
    }
    if (m->grads.connector_w == NULL) { return; }
    LAUNCH_1D(prefix_image_grad_kernel, (size_t)NV * NI * C, a->g_img, a->g_res, B, c->n_cam, NI, Np, C,
              smolvla_scales_images(c) ? scale : 1.0f);
    matmul_backward_weight(m->grads.connector_w, a->g_img, a->shuffled, NV * NI, S2C, C);
    if (m->grads.connector_b != NULL) { bias_backward(m->grads.connector_b, a->partial, a->g_img, NV * NI, C); }
    if (m->grads.vis_post_w != NULL) {
        matmul_backward_input(a->g_shuf, a->g_img, m->params.connector_w, NV * NI, S2C, C, 0.0f);
    }
}

// d shuffled (g_shuf) -> pixel shuffle -> post_layernorm -> SigLIP layers -> patch embeddings
static void smolvla_vision_backward(SmolVLA* m) {
    const SmolVLAConfig* c = &m->config;
    SmolActivations* a = &m->acts;
    int NV = (int)smolvla_images(c, m->B), G = smolvla_grid(c), Nv = G * G, V = (int)smolvla_vrows(c, m->B);
    int Cv = c->vis_width, Fv = c->vis_ff;
    size_t VC = (size_t)V * Cv;
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    pixel_shuffle_backward(a->g_ln, a->g_shuf, NV, G, G, Cv, c->scale_factor);  // d v_out
    cudaCheck(cudaMemsetAsync(dres, 0, VC * sizeof(float), main_stream));
    layernorm_backward(dres, dres_x, m->grads.vis_post_w, m->grads.vis_post_b, a->partial, a->g_ln,
                       smolvla_vision_acts(m, c->vis_layers - 1).out, m->params.vis_post_w, a->v_omean, a->v_orstd, V, Cv);
    for (int l = c->vis_layers - 1; l >= 0; l--) {
        if (m->recompute != RECOMPUTE_NONE) { smolvla_vision_layer_forward(m, l, m->recompute); }
        SmolVisionActs x = smolvla_vision_acts(m, l);
        // MLP: out = mid + fc2(gelu(fc1(ln2(mid))))
        matmul_backward_input(a->g_act, dres_x, smolvla_param(m, SMOLP_vis_fc2_w, l), V, Fv, Cv, 0.0f);
        matmul_backward_weight(smolvla_grad(m, SMOLP_vis_fc2_w, l), dres_x, x.gelu, V, Fv, Cv);
        bias_backward(smolvla_grad(m, SMOLP_vis_fc2_b, l), a->partial, dres_x, V, Cv);
        gelu_backward(a->g_gate, a->g_act, x.fc1, (size_t)V * Fv);
        matmul_backward_input(a->g_ln, a->g_gate, smolvla_param(m, SMOLP_vis_fc1_w, l), V, Cv, Fv, 0.0f);
        matmul_backward_weight(smolvla_grad(m, SMOLP_vis_fc1_w, l), a->g_gate, x.ln2, V, Cv, Fv);
        bias_backward(smolvla_grad(m, SMOLP_vis_fc1_b, l), a->partial, a->g_gate, V, Fv);
        layernorm_backward(dres, dres_x, smolvla_grad(m, SMOLP_vis_ln2_w, l), smolvla_grad(m, SMOLP_vis_ln2_b, l), a->partial,
                           a->g_ln, x.mid, smolvla_param(m, SMOLP_vis_ln2_w, l), x.mean2, x.rstd2, V, Cv);
        // attention: mid = x + out_proj(attention(q, k, v))
        matmul_backward_input(a->g_att, dres_x, smolvla_param(m, SMOLP_vis_wo, l), V, Cv, Cv, 0.0f);
        matmul_backward_weight(smolvla_grad(m, SMOLP_vis_wo, l), dres_x, x.att, V, Cv, Cv);
        bias_backward(smolvla_grad(m, SMOLP_vis_bo, l), a->partial, dres_x, V, Cv);
        gqa_attention_backward(a->g_q, a->g_kf, a->g_vf, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta,
                               smolvla_vision_attn(m, x), a->g_kx, a->g_vx);  // (dk, dv in floatX)
        const floatX* dqkv[3] = {a->g_q, a->g_kx, a->g_vx};
        const int wi[3] = {SMOLP_vis_wq, SMOLP_vis_wk, SMOLP_vis_wv}, bi[3] = {SMOLP_vis_bq, SMOLP_vis_bk, SMOLP_vis_bv};
        for (int j = 0; j < 3; j++) {
            matmul_backward_input(a->g_ln, dqkv[j], smolvla_param(m, wi[j], l), V, Cv, Cv, j > 0 ? 1.0f : 0.0f);
            matmul_backward_weight(smolvla_grad(m, wi[j], l), dqkv[j], x.ln1, V, Cv, Cv);
            bias_backward(smolvla_grad(m, bi[j], l), a->partial, dqkv[j], V, Cv);
        }
        layernorm_backward(dres, dres_x, smolvla_grad(m, SMOLP_vis_ln1_w, l), smolvla_grad(m, SMOLP_vis_ln1_b, l), a->partial,
                           a->g_ln, x.res, smolvla_param(m, SMOLP_vis_ln1_w, l), x.mean1, x.rstd1, V, Cv);
        smolvla_bucket_done(m, smolvla_bucket(c, TOWER_VISION, l));
    }
    // patch i's position row, summed over the images in order; the patch embedding
    LAUNCH_1D(pos_emb_backward_kernel, (size_t)Nv * Cv, m->grads.vis_pos, dres, NV, Nv, Nv, Cv);
    matmul_backward_weight(m->grads.vis_patch_w, dres_x, a->patches, V, smolvla_patch_dim(c), Cv);
    bias_backward(m->grads.vis_patch_b, a->partial, dres_x, V, Cv);
}

// Gradients of the last forward's loss sum into grads_memory (overwritten when zero_grads), each bucket
// averaged once final. The expert first, then the VLM, as far down as something trains:
//   expert: the expert, its heads, state_proj; only SmolVLA's state row goes back through the frozen
//           VLM (pi0's state token is the expert's: nothing goes into the VLM).
//   vlm:    the whole prefix back into embed_tokens and the connector.
//   all:    and on through the vision tower.
static void smolvla_backward(SmolVLA* m, int zero_grads) {
    const SmolVLAConfig* c = &m->config;
    int state_only = m->mode == TRAIN_MODE_EXPERT;
    int into_vlm = !(state_only && smolvla_state_in_suffix(c));
    prof_phase("expert bwd");
    if (zero_grads) { cudaCheck(cudaMemsetAsync(m->grads_memory, 0, m->n_train * sizeof(float), main_stream)); }
    size_t kv = (size_t)c->n_layer * smolvla_prows(c, m->B) * smolvla_d_kv(c);
    cudaCheck(cudaMemsetAsync(m->acts.dp_k, 0, kv * sizeof(float), main_stream));
    cudaCheck(cudaMemsetAsync(m->acts.dp_v, 0, kv * sizeof(float), main_stream));
    smolvla_expert_backward(m, state_only);
    smolvla_suffix_embed_backward(m);
    smolvla_bucket_done(m, smolvla_bucket(c, TOWER_EXPERT, -1));
    if (into_vlm) {
        prof_phase("vlm bwd");
        smolvla_vlm_backward(m, state_only);
        prof_phase("prefix bwd");
        smolvla_prefix_embed_backward(m, state_only);
    }
    smolvla_bucket_done(m, smolvla_bucket(c, TOWER_VLM, -1));
    if (m->mode == TRAIN_MODE_ALL) {
        prof_phase("vision bwd");
        smolvla_vision_backward(m);
        smolvla_bucket_done(m, smolvla_bucket(c, TOWER_VISION, -1));
    }
}

// After a step's last backward: loss sums, entries and stop flag summed over the ranks, then the means
static void smolvla_grads_finish(SmolVLA* m, int stop) {
    LAUNCH_1D(fill_kernel, 1, m->acts.scalars + 2, stop ? 1.0f : 0.0f, 1);
    dist_step_sums(m);
    smolvla_loss_finish(m);
}

// ---- sampling

// Euler steps of dx/dt = v(x, t) in acts.x_sample from t = 1 to 0, as LeRobot's euler_integrate:
// t = float(1 + k dt), dt = -1/n_steps in double, x += float(dt) v. A CUDA graph of it replays.
static void smolvla_euler_steps(SmolVLA* m) {
    SmolActivations* a = &m->acts;
    int B = m->B, n = (int)smolvla_arows(&m->config, B) * m->config.max_action_dim, n_steps = 10;
    convert(a->x_t, a->x_sample, n);
    double dt = -1.0 / n_steps;
    for (int k = 0; k < n_steps; k++) {
        LAUNCH_1D(fill_kernel, B, a->t_sample, (float)(1.0 + k * dt), B);
        smolvla_suffix_embed(m, a->t_sample);
        smolvla_expert_forward(m, k > 0);
        LAUNCH_1D(euler_step_f32_kernel, n, a->x_sample, a->x_t, a->v_t, (float)dt, n);
    }
}

// Noise (B, H, Amax, device) -> out (B, H, Amax, host): the prefix once, then the Euler steps (a CUDA graph)
static void smolvla_sample(SmolVLA* m, const SmolInputs* in, const float* noise, float* out) {
    SmolSampling* s = &m->sampling;
    if (s->marks[0] == NULL) {
        for (int k = 0; k < 3; k++) { cudaCheck(cudaEventCreate(&s->marks[k])); }
    }
    int profiled = ++s->calls == s->profile_call;
    double t0 = wall_seconds();
    if (profiled) { prof_begin(); }
    cudaCheck(cudaEventRecord(s->marks[0], main_stream));
    smolvla_encode_prefix(m, in);
    prof_phase("euler steps");
    SmolActivations* a = &m->acts;
    int n = (int)smolvla_arows(&m->config, in->B) * m->config.max_action_dim;
    cudaCheck(cudaMemcpyAsync(a->x_sample, noise, n * sizeof(float), cudaMemcpyDeviceToDevice, main_stream));
    cudaCheck(cudaEventRecord(s->marks[1], main_stream));
    if (!s->use_graph || !s->warm || profiled) {
        smolvla_euler_steps(m);
        s->warm = 1;
    } else {
        if (s->graph == NULL) {
            cudaGraph_t graph = NULL;
            cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
            smolvla_euler_steps(m);
            cudaCheck(cudaStreamEndCapture(main_stream, &graph));
            cudaCheck(cudaGraphInstantiate(&s->graph, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
        }
        cudaCheck(cudaGraphLaunch(s->graph, main_stream));
    }
    cudaCheck(cudaEventRecord(s->marks[2], main_stream));
    cudaCheck(cudaMemcpyAsync(out, a->x_sample, n * sizeof(float), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaEventElapsedTime(&s->ms[k], s->marks[k], s->marks[k + 1]));
        s->launches[k] = event_launches(s->marks[k], s->marks[k + 1]);
    }
    if (profiled) { prof_end("sampling call", s->calls, 1000.0 * (wall_seconds() - t0)); }
}

// ---- optimizer: AdamW on the trainable elements only

// The trainable gradients' global norm into acts.scalars[1], a fixed grid; ZeRO-1 ranks add their sums
static void smolvla_global_norm(SmolVLA* m) {
    int sharded = smolvla_sharded(m);
    norm_squares_kernel<<<NORM_BLOCKS, BLOCK, 0, main_stream>>>(m->norm_partial, m->grads_memory + m->shard_lo,
                                                                 m->shard_hi - m->shard_lo);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars + 1, m->norm_partial, NORM_BLOCKS, 1.0, !sharded, 0);
    launchCheck();
    if (sharded) {
        zero_sum_squares(m);
        sum_finalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars + 1, m->acts.scalars + 1, 1, 1.0, 1, 0);
        launchCheck();
    }
}

// AdamW (0.9, 0.95, 1e-8) on the shard's trainable master weights, a launch per tensor, decoupled decay
// where the table or decay_on (DECAY_ON_*) says; the floatX copy refreshed (ZeRO-1: all-gathered).
// fp16: an Inf/NaN step changes only the loss scale, yet counts.
static void smolvla_update(SmolVLA* m, float lr, float weight_decay, int decay_on, float clip, int step) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    smolvla_global_norm(m);
    float bc1 = 1.0f - powf(beta1, (float)(step + 1)), bc2 = 1.0f - powf(beta2, (float)(step + 1));
    size_t lo = m->shard_lo;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        size_t first, n = zero_part(m->domain.offset[i], m->domain.numel[i], lo, m->shard_hi, &first);
        if (n == 0) { continue; }
        size_t a = m->domain.offset[i] + first;  // in the domain; the state arrays start at lo
        LAUNCH_1D(adamw_kernel, n, m->master + (a - lo), m->params_memory + a, m->grads_memory + a, m->m_memory + (a - lo),
                  m->v_memory + (a - lo), n, lr, beta1, beta2, eps,
                  smolvla_decay(&m->table.spec[i], weight_decay, decay_on), bc1, bc2, m->acts.scalars + 1, clip);
    }
    if (m->scaler != NULL) {
        loss_scale_update_kernel<<<1, 1, 0, main_stream>>>(m->scaler, m->acts.scalars + 1, m->loss_scale_window,
                                                           VLA_LOSS_SCALE_MAX);
        launchCheck();
    }
    if (smolvla_sharded(m)) { zero_gather_params(m); }
}

// Loss, gradient norm (before clipping) and stop flag of the last step over every rank, waiting for them
static void smolvla_read_scalars(SmolVLA* m, float* loss, float* norm, int* stop = NULL) {
    float s[3];
    cudaCheck(cudaMemcpyAsync(s, m->acts.scalars, sizeof(s), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    if (loss != NULL) { *loss = s[0]; }
    if (norm != NULL) { *norm = s[1]; }
    if (stop != NULL) { *stop = s[2] > 0.0f; }
}

// ---- FLOPs, for MFU: vla/flops.h
#include "vla/flops.h"

// ----------------------------------------------------------------------------
// data parallel: one rank per GPU, a host thread each; gradients summed bucket by bucket (NCCL),
// ZeRO-1 with --zero, a watchdog. Without NCCL, vla/single_gpu.cuh's stand-ins.

// the gradient buckets, numbered in the order the backward finishes them (vla/buckets.cuh)
#include "vla/buckets.cuh"

// What the ranks of a run share, read-only once they train
typedef struct {
    TrainArgs args;
    Dataset ds;
    SmolVLAConfig config;
    const char* from;      // checkpoint to start from, or NULL: from the seed
    Checkpoint initial;    // the starting weights (and moments), read or drawn once; the moments go once
                           // every rank has them, the weights stay: checkpoints take the frozen ones
    int start;             // optimizer steps already done
    uint64_t sampler_pos;  // global samples consumed before `start`
    LossScaleState loss_scale;  // fp16 builds: the dynamic loss scale the run starts with
    int world;             // ranks over all nodes
    int local_ranks;       // GPUs of this process, one thread each
    int node, nodes;       // this process's place among the nodes, and how many
    TaskBalance balance_storage;
    const TaskBalance* balance;  // --balance tasks' sequence (balance_storage), or NULL: the plain one
} Run;

#if defined(MULTI_GPU)
static void nccl_check_(ncclResult_t r, const char* file, int line) {
    if (r != ncclSuccess && run_aborting) { wait_for_abort(); }
    if (r != ncclSuccess) {
        vla_fail("NCCL error '%s' at %s:%d: rerun with NCCL_DEBUG=INFO to see why", ncclGetErrorString(r), file, line);
    }
}
#define ncclCheck(call) nccl_check_((call), __FILE__, __LINE__)

#if defined(ENABLE_FP32)
static const ncclDataType_t NCCL_FLOATX = ncclFloat;
#elif defined(ENABLE_FP16)
static const ncclDataType_t NCCL_FLOATX = ncclHalf;
#else
static const ncclDataType_t NCCL_FLOATX = ncclBfloat16;
#endif

#define DIST_TIMED_WAITS 4  // a step waits on NCCL once (ZeRO-1: three times)

// One rank's side: the communicator, the communication stream and its events
typedef struct Dist {
    int sync;  // the backward pass sums its buckets over the ranks as they finish (a step's last micro-step)
    ncclComm_t comm;
    cudaStream_t comm_stream;
    cudaEvent_t* bucket_ready;  // (smolvla_bucket_count) their gradients are final on the main stream
    cudaEvent_t scalars_ready, comm_done;
    // the main stream's waits on the communication stream in one step: begin and end of wait i
    cudaEvent_t wait_begin[DIST_TIMED_WAITS], wait_end[DIST_TIMED_WAITS];
    int waits;  // recorded this step
} Dist;

// Work on the communication stream ordered after the main stream's so far (`ready`), ...
static void comm_after_main(Dist* d, cudaEvent_t ready) {
    cudaCheck(cudaEventRecord(ready, main_stream));
    cudaCheck(cudaStreamWaitEvent(d->comm_stream, ready, 0));
}
// ... and the main stream's next work after the communication stream's (the first waits timed)
static void main_after_comm(Dist* d) {
    cudaEvent_t done = d->comm_done;
    if (d->waits < DIST_TIMED_WAITS) {
        cudaCheck(cudaEventRecord(d->wait_begin[d->waits], main_stream));
        done = d->wait_end[d->waits++];
    }
    cudaCheck(cudaEventRecord(done, d->comm_stream));
    ProfOp prof_op("nccl wait");
    cudaCheck(cudaStreamWaitEvent(main_stream, done, 0));
}

// x (n device floats) summed over the ranks in place; nothing for a model alone (d NULL)
static void dist_sum(Dist* d, float* x, size_t n) {
    if (d == NULL) { return; }
    comm_after_main(d, d->scalars_ready);
    ncclCheck(ncclAllReduce(x, x, n, ncclFloat, ncclSum, d->comm, d->comm_stream));
    main_after_comm(d);
}

// Bucket b's gradients are final: sum them over the ranks while the backward goes on
static void smolvla_bucket_done(SmolVLA* m, int b) {
    Dist* d = m->dist;
    const SmolBuckets* k = &m->buckets;
    if (d == NULL || !d->sync || smolvla_sharded(m) || k->first[b] == k->first[b + 1]) { return; }  // ZeRO-1: at the end
    cudaCheck(cudaEventRecord(d->bucket_ready[b], main_stream));
    cudaCheck(cudaStreamWaitEvent(d->comm_stream, d->bucket_ready[b], 0));
    ncclCheck(ncclGroupStart());
    for (int r = k->first[b]; r < k->first[b + 1]; r++) {
        ncclCheck(ncclAllReduce(m->grads_memory + k->offset[r], m->grads_memory + k->offset[r], k->count[r], ncclFloat,
                                ncclSum, d->comm, d->comm_stream));
    }
    ncclCheck(ncclGroupEnd());
}

// The step's sums over the ranks after its last backward (ZeRO-1: gradients reduce-scattered)
static void dist_step_sums(SmolVLA* m) {
    Dist* d = m->dist;
    if (d != NULL) {
        comm_after_main(d, d->scalars_ready);
        if (smolvla_sharded(m)) {
            size_t S = m->shard_hi - m->shard_lo;
            ncclCheck(ncclReduceScatter(m->grads_memory, m->grads_memory + m->shard_lo, S, ncclFloat, ncclSum, d->comm,
                                        d->comm_stream));
        }
        ncclCheck(ncclAllReduce(m->acts.scalars, m->acts.scalars, 4, ncclFloat, ncclSum, d->comm, d->comm_stream));
        main_after_comm(d);
    }
}

static void zero_sum_squares(SmolVLA* m) {
    comm_after_main(m->dist, m->dist->scalars_ready);
    ncclCheck(ncclAllReduce(m->acts.scalars + 1, m->acts.scalars + 1, 1, ncclFloat, ncclSum, m->dist->comm,
                            m->dist->comm_stream));
    main_after_comm(m->dist);
}

static void zero_gather_params(SmolVLA* m) {
    comm_after_main(m->dist, m->dist->scalars_ready);
    ncclCheck(ncclAllGather(m->params_memory + m->shard_lo, m->params_memory, m->shard_hi - m->shard_lo, NCCL_FLOATX,
                            m->dist->comm, m->dist->comm_stream));
    main_after_comm(m->dist);
}

// Optimizer state made whole (n_train): itself, or all-gathered into `gathered` (every rank calls it)
static const float* zero_gather_state(SmolVLA* m, float* gathered, const float* shard) {
    if (smolvla_sharded(m)) {
        comm_after_main(m->dist, m->dist->scalars_ready);
        ncclCheck(ncclAllGather(shard, gathered, m->shard_hi - m->shard_lo, ncclFloat, m->dist->comm, m->dist->comm_stream));
        main_after_comm(m->dist);
        return gathered;
    }
    return shard;
}

#if !defined(TESTING) && !defined(VLA_LIBRARY)

// Any -g and --nodes: NCCL serves them (the build without it refuses more than one GPU)
static void dist_check_args(const TrainArgs* args) {}

// The run's NCCL id: node 0's, handed to the other nodes (dist_share_id) before any rank joins with it
static ncclUniqueId nccl_id;

static void dist_share_id(const Run* run) {
    const TrainArgs* args = &run->args;
    if (run->node == 0) { ncclCheck(ncclGetUniqueId(&nccl_id)); }
    if (run->nodes > 1) {  // node 0 hands its id to the others, once they prove they run the same thing
        printf("node %d of %d: %d GPU(s), meeting at %s, run token %s\n", run->node, run->nodes, run->local_ranks,
               args->master, args->run_token != NULL ? "set" : "not set");  // (never the token itself)
        BootIdentity me = boot_identity(args, &run->config, run->node, run->nodes, run->start, run->ds.n_samples);
        char err[1024];
        if (bootstrap_exchange(args->master, args->bind, args->run_token, &me, &nccl_id, sizeof(nccl_id),
                               args->bootstrap_timeout, err, sizeof(err)) != 0) {
            vla_fail("%s", err);
        }
    }
}

// faults: a watchdog thread over the communicators (vla/watchdog.cuh)
#include "vla/watchdog.cuh"

// This rank's communicator (rank `rank`, local GPU `local`), stream and events
static void dist_init(Dist* d, SmolVLA* m, const Run* run, int rank, Watchdog* w, int local) {
    memset(d, 0, sizeof(*d));
    int n_buckets = m->buckets.n;
    ncclCheck(ncclCommInitRank(&d->comm, run->world, nccl_id, rank));
    w->comms[local] = d->comm;
    cudaCheck(cudaStreamCreate(&d->comm_stream));
    d->bucket_ready = (cudaEvent_t*)mallocCheck(n_buckets * sizeof(cudaEvent_t));
    for (int b = 0; b < n_buckets; b++) { cudaCheck(cudaEventCreateWithFlags(&d->bucket_ready[b], cudaEventDisableTiming)); }
    cudaCheck(cudaEventCreateWithFlags(&d->scalars_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&d->comm_done, cudaEventDisableTiming));
    for (int i = 0; i < DIST_TIMED_WAITS; i++) {
        cudaCheck(cudaEventCreate(&d->wait_begin[i]));
        cudaCheck(cudaEventCreate(&d->wait_end[i]));
    }
    m->dist = d;
}

static void dist_free(Dist* d, const SmolVLA* m, Watchdog* w, int local) {
    w->comms[local] = NULL;  // (every rank has finished its collectives before it gets here)
    for (int b = 0; b < m->buckets.n; b++) { cudaCheck(cudaEventDestroy(d->bucket_ready[b])); }
    free(d->bucket_ready);
    cudaCheck(cudaEventDestroy(d->scalars_ready));
    cudaCheck(cudaEventDestroy(d->comm_done));
    for (int i = 0; i < DIST_TIMED_WAITS; i++) {
        cudaCheck(cudaEventDestroy(d->wait_begin[i]));
        cudaCheck(cudaEventDestroy(d->wait_end[i]));
    }
    cudaCheck(cudaStreamDestroy(d->comm_stream));
    ncclCheck(ncclCommDestroy(d->comm));
}

static void dist_barrier(void) {
    #pragma omp barrier
}

static void dist_step_begin(Dist* d) { d->waits = 0; }

// The time the main stream waited on the communication stream this step, per wait
static double dist_wait_ms(Dist* d) {
    double total = 0.0;
    for (int i = 0; i < d->waits; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, d->wait_begin[i], d->wait_end[i]));
        if (ms > 0.0f) { total += ms; }
    }
    return total;
}

// Rank 0's closing line on NCCL: what its compute waited for it, per timed step and in all
static void dist_print_waits(double wait_ms, int steps, double step_ms, int world) {
    printf("communication: rank 0's compute waited %.2f ms per step for NCCL, %.1f%% of the step time "
           "(world size %d)\n", wait_ms / steps, 100.0 * wait_ms / step_ms, world);
}

// The process's ranks, a thread each running train(run, w, its local GPU); 1 if a request stopped one
static int run_ranks(Run* run, Watchdog* w, int (*train)(Run*, Watchdog*, int)) {
    int stopped = 0;
    #pragma omp parallel num_threads(run->local_ranks) reduction(| : stopped)
    stopped |= train(run, w, omp_get_thread_num());
    return stopped;
}
#endif  // the trainer's side

#else  // the build without NCCL: one GPU alone, nothing to sum over ranks, gather or watch
#include "vla/single_gpu.cuh"
#endif  // MULTI_GPU

// ----------------------------------------------------------------------------
// data: device batches fed from the loader's pinned ring, --balance tasks' per-task losses

#include "vla/device_batch.cuh"

// After the forward of device batch k, micro-step `micro` of the step: its samples' sums into their tasks'
static void task_losses_add(TaskLosses* tl, const SmolVLA* m, const SmolInputs* in, int k, int micro) {
    if (tl->tb == NULL) { return; }
    const SmolVLAConfig* c = &m->config;
    sample_loss_kernel<<<in->B, BLOCK, 0, main_stream>>>(tl->sample_sums, m->acts.v_t, m->acts.target, in->action_is_pad,
                                                         c->chunk, c->action_dim, c->max_action_dim);
    launchCheck();
    task_loss_add_kernel<<<ceil_div(tl->T, BLOCK), BLOCK, 0, main_stream>>>(tl->task_sums, tl->sample_sums,
                                                                          tl->dev_task + (size_t)k * tl->B, in->B, tl->T,
                                                                          micro == 0);
    launchCheck();
}

// 10 Euler steps from a device batch's noise -> sampled (B, H, A) on the host, un-normalized
static void smolvla_sample_actions(SmolVLA* m, const SmolBatch* dev, const float* action_mean, const float* action_std,
                                   float* sampled) {
    const SmolVLAConfig* c = &m->config;
    int B = dev->B, H = c->chunk, A = c->action_dim, Amax = c->max_action_dim;
    float* normalized = (float*)mallocCheck((size_t)B * H * Amax * sizeof(float));
    SmolInputs in = smolvla_inputs(dev);
    smolvla_sample(m, &in, dev->eps, normalized);
    for (size_t slot = 0; slot < (size_t)B * H; slot++) {
        for (int d = 0; d < A; d++) {
            sampled[slot * A + d] = normalized[slot * Amax + d] * action_std[d] + action_mean[d];
        }
    }
    free(normalized);
}

// ----------------------------------------------------------------------------
// checkpoints of the model

// Writes a checkpoint (rank 0): every weight in fp32, and the moments; every rank calls it (ZeRO-1)
static void smolvla_save(SmolVLA* m, float* params, const Dataset* ds, const TrainArgs* args, int step,
                         uint64_t sampler_pos, int write, const LossScaleState* loss_scale) {
    if (!write && !smolvla_sharded(m)) { return; }
    size_t total = m->n_train;
    float* gathered = NULL;  // ZeRO-1: room for one state array's shards, gathered
    if (smolvla_sharded(m)) { cudaCheck(cudaMalloc(&gathered, total * sizeof(float))); }
    float* host = write ? (float*)mallocCheck(3 * total * sizeof(float)) : NULL;
    const float* state[3] = {m->master, m->m_memory, m->v_memory};
    for (int k = 0; k < 3; k++) {
        const float* whole = zero_gather_state(m, gathered, state[k]);
        if (!write) { continue; }
        cudaCheck(cudaMemcpyAsync(host + k * total, whole, total * sizeof(float), cudaMemcpyDeviceToHost, main_stream));
        cudaCheck(cudaStreamSynchronize(main_stream));
    }
    cudaCheck(cudaStreamSynchronize(main_stream));  // (the gathers are done before their buffer goes)
    if (write) {
        for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
            memcpy(params + m->table.spec[i].offset, host + m->domain.offset[i], m->domain.numel[i] * sizeof(float));
        }
        run_checkpoint_save(args, ds, &m->config, step, sampler_pos, params, m->table.total, host + total,
                            host + 2 * total, m->n_opt, loss_scale);
    }
    free(host);
    if (gathered != NULL) { cudaCheck(cudaFree(gathered)); }
}

// ----------------------------------------------------------------------------
// policy interface: libvla_gpu.so for scripts/vla_policy.py (device="cuda"), as libvla.so from train_vla.c

#if defined(VLA_LIBRARY)
#include "vla/policy_gpu.cuh"
#endif  // VLA_LIBRARY

// ----------------------------------------------------------------------------
// CLI and main

#if !defined(TESTING) && !defined(VLA_LIBRARY)
// How well the policy acts: 10-step sampling on one batch, MSE against its actions (data units)
static float eval_action_mse(SmolVLA* m, SmolBatch* dev, const Dataset* ds, uint64_t seed, uint64_t pos, int step) {
    const SmolVLAConfig* c = &m->config;
    SmolBatch host;
    smolvla_batch_alloc(&host, c, &ds->cams, dev->B);
    eval_batch(&host, ds, c, seed, pos, step);
    cudaCheck(cudaMemcpy(dev->memory, host.memory, host.bytes, cudaMemcpyHostToDevice));
    float* sampled = (float*)mallocCheck((size_t)dev->B * c->chunk * c->action_dim * sizeof(float));
    smolvla_sample_actions(m, dev, ds->action_mean, ds->action_std, sampled);
    float mse = action_mse(&host, ds, c, sampled);
    free(sampled);
    smolvla_batch_free(&host);
    return mse;
}

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

// --memory and the config table at the start (vla/report.cuh)
#include "vla/report.cuh"

// One GPU's training: rank node * local_ranks + local; rank 0 logs. Returns 1 if stopped early.
static int train_rank(Run* run, Watchdog* watchdog, int local) {
    const TrainArgs* args = &run->args;
    const SmolVLAConfig* c = &run->config;
    int rank = run->node * run->local_ranks + local, world = run->world, lead = rank == 0;
    cudaDeviceProp prop;
    gpu_init(local, &prop);
    SmolVLA model;
    smolvla_build(&model, c, args->train_mode, args->zero ? rank : 0, args->zero ? world : 1);
    smolvla_set_recompute(&model, args->recompute);
    smolvla_set_params(&model, run->initial.params, run->initial.m, run->initial.v);
    LossScaleState scale = run->loss_scale;  // fp16 builds: after each step, read back from the device
    LossScaleState logged = scale;           // what a step's log line shows: the scale it ran with
    smolvla_set_loss_scale(&model, &scale, args->loss_scale_window);
    dist_barrier();  // every rank has its copy of the moments before they go
    if (local == 0) {  // the weights stay for the checkpoints' frozen values
        free(run->initial.m);
        free(run->initial.v);
        run->initial.m = run->initial.v = NULL;
    }
    Dist dist;
    dist_init(&dist, &model, run, rank, watchdog, local);

    int64_t global_batch = train_global_batch(args, world);
    // every rank's micro-batches: W = world x accum per step, this rank's every world-th from `rank`
    Loader loader;
    loader_start_balanced(&loader, &run->ds, c, args->seed, run->sampler_pos, (uint64_t)run->start, args->batch,
                          world * args->accum, args->augment, args->workers, 4, world, rank, run->balance);
    TaskLosses task_losses;  // --balance tasks: the loss of each task, logged
    task_losses_init(&task_losses, run->balance, &run->ds, args->batch);
    loader_pin(&loader, 1);
    SmolBatch dev[2];                         // micro-batch j lands in dev[j % 2]
    cudaEvent_t uploaded[2], consumed[2];     // its copy landed; the compute that read it is done
    for (int k = 0; k < 2; k++) {
        device_batch_alloc(&model, &dev[k], &run->ds.cams, args->batch);
        cudaCheck(cudaEventCreateWithFlags(&uploaded[k], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&consumed[k], cudaEventDisableTiming));
    }
    smolvla_set_batch(&model, args->batch);
    Logger logger = {};
    if (lead) {
        logger_open(&logger, args->output, run->start);
        // what --recompute saves: every step's line says it
        logger.saved_bytes = (double)(smolvla_act_bytes(c, args->train_mode, args->batch) - model.act_bytes);
    }
    if (lead && run->balance != NULL) { logger.n_tasks = task_losses.T; logger.task_loss = task_losses.task_loss; }
    if (model.scaler != NULL) { logger.loss_scale = &logged; }
    double peak = device_peak_flops(prop.name), flops = smolvla_flops_per_sample(c, args->train_mode);

    double timed_ms = 0.0, peak_mem = 0.0, comm_wait_ms = 0.0;
    int timed_steps = 0, step = run->start, stopped = 0;
    int64_t job = 0, jobs = (int64_t)(args->steps - run->start) * args->accum;
    batch_upload(&loader, &dev[0], consumed[0], uploaded[0], &task_losses, 0);
    for (; step < args->steps && !stopped; step++) {
        double t0 = wall_seconds();
        if (lead && step + 1 == args->profile) { prof_begin(); }
        watchdog->step[local] = step;
        watchdog->busy_since[local] = t0;
        dist_step_begin(&dist);
        for (int micro = 0; micro < args->accum; micro++, job++) {
            SmolBatch* batch = &dev[job % 2];
            cudaCheck(cudaStreamWaitEvent(main_stream, uploaded[job % 2], 0));
            dist.sync = micro == args->accum - 1;  // communicate on the last micro-step only
            SmolInputs in = smolvla_inputs(batch);
            smolvla_forward(&model, &in, micro);
            task_losses_add(&task_losses, &model, &in, (int)(job % 2), micro);
            smolvla_backward(&model, micro == 0);
            cudaCheck(cudaEventRecord(consumed[job % 2], main_stream));
            // while the GPU computes: hand the host slot back once copied, start the next batch's copy
            cudaCheck(cudaEventSynchronize(uploaded[job % 2]));
            loader_release(&loader);
            if (job + 1 < jobs) {
                int k = (int)((job + 1) % 2);
                batch_upload(&loader, &dev[k], consumed[k], uploaded[k], &task_losses, k);
            }
        }
        prof_phase("grads");
        smolvla_grads_finish(&model, stop_requested);
        prof_phase("optimizer");
        smolvla_update(&model, lr_at_step(args, step), args->weight_decay, args->decay_on, args->grad_clip, step);
        task_losses_reduce(&task_losses, &model);
        float loss, norm, used_scale = 0.0f;
        smolvla_read_scalars(&model, &loss, &norm, &stopped);
        task_losses_read(&task_losses);
        int skipped = model.scaler != NULL && smolvla_read_loss_scale(&model, &scale, &used_scale);
        logged = scale;
        logged.scale = used_scale;
        watchdog->busy_since[local] = 0.0;
        double ms = 1000.0 * (wall_seconds() - t0);
        double wait_ms = dist_wait_ms(&dist);
        if (step > run->start && step + 1 != args->profile) { timed_ms += ms; comm_wait_ms += wait_ms; timed_steps++; }
        int done = step + 1;
        prof_stop();  // (the profiled step's work ends here, before any checkpoint)
        char left[2 * VLA_PATH_MAX + 128];
        if (skipped && used_scale <= 1.0f) {  // not a scale too large: the model overflows fp16 itself
            if (!lead) { break; }
            vla_fail("step %d: Inf/NaN gradients at loss scale %g, the smallest: fp16's range is too small for this run: "
                     "lower the learning rate (-l), or train in bf16 or fp32 (PRECISION=BF16 on sm_80 and newer); %s", done,
                     (double)used_scale, train_checkpoint_left(args->output, left, sizeof(left)));
        }
        if (!skipped && (!isfinite(loss) || !isfinite(norm))) {  // every rank sees the same values: rank 0 reports and exits
            if (!lead) { break; }
            vla_fail("step %d: loss %g, grad norm %g is not finite: lower the learning rate (-l) or raise the clip; %s",
                     done, loss, norm, train_checkpoint_left(args->output, left, sizeof(left)));
        }
        if (train_ckpt_due(args, done, stopped)) {
            smolvla_save(&model, run->initial.params, &run->ds, args, done,
                         run->sampler_pos + (uint64_t)(done - run->start) * global_batch, lead,
                         model.scaler != NULL ? &scale : NULL);
        }
        if (!lead) { continue; }
        size_t free_b, total_b;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        double mem_gib = (double)(total_b - free_b) / (1024.0 * 1024.0 * 1024.0);
        if (mem_gib > peak_mem) { peak_mem = mem_gib; }
        double sps = (double)global_batch / (ms / 1000.0);
        logger_step(&logger, step, args->steps, loss, lr_at_step(args, step), norm, ms, sps,
                    peak > 0.0 ? flops * sps / (peak * world) : NAN, mem_gib,
                    done % args->log_every == 0 || done == args->steps);
        if (done == args->profile) { prof_end("step", done, ms); }
    }
    cudaCheck(cudaStreamSynchronize(copy_stream));
    loader_pin(&loader, 0);
    loader_stop(&loader);
    if (stopped && step >= args->steps) { stopped = 0; }  // a stop in the last step: that step's checkpoint ends the run
    if (lead) {
        if (stopped) { train_report_interrupt(args, step); }
        if (model.scaler != NULL) {
            printf("fp16 loss scaling: %llu step(s) of this run's %d skipped for Inf/NaN gradients (%llu in all), loss scale "
                   "now %g\n", (unsigned long long)(scale.skipped - run->loss_scale.skipped), step - run->start,
                   (unsigned long long)scale.skipped, (double)scale.scale);
        }
        printf("data loader: %d worker thread(s) per GPU, rank 0 waited %.1f ms for batches in %d steps\n", args->workers,
               1000.0 * loader.wait_seconds, step - run->start);
        printf("eval: 10-step sampled actions vs the data, MSE %.6f (data units) on %d samples\n",
               eval_action_mse(&model, &dev[0], &run->ds, args->seed,
                               run->sampler_pos + (uint64_t)(step - run->start) * global_batch, step),
               args->batch);
        double gib = 1024.0 * 1024.0 * 1024.0;
        if (timed_steps > 0) {
            double ms = timed_ms / timed_steps, sps = global_batch / (ms / 1000.0);
            printf("mean step time %.1f ms over %d steps (first excluded), %.1f samples/s", ms, timed_steps, sps);
            if (peak > 0.0) { printf(", MFU %.1f%%", 100.0 * flops * sps / (peak * world)); }
            char saved[32];
            printf(", peak GPU memory %.2f GiB (%.2f GiB held by the model, %.2f GiB of it activations; --recompute %s "
                   "saves %s)\n", peak_mem, (double)model.device_bytes / gib, (double)model.act_bytes / gib,
                   RECOMPUTE_NAMES[model.recompute], format_bytes(saved, sizeof(saved), logger.saved_bytes));
            dist_print_waits(comm_wait_ms, timed_steps, timed_ms, world);
        }
        logger_close(&logger);
        if (stop_requested && step >= args->steps) { train_report_interrupt(args, step); }  // the run is complete
    }
    task_losses_free(&task_losses);
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaFree(dev[k].memory));
        cudaCheck(cudaEventDestroy(uploaded[k]));
        cudaCheck(cudaEventDestroy(consumed[k]));
    }
    dist_free(&dist, &model, watchdog, local);
    smolvla_free(&model);
    gpu_shutdown();
    return stopped;
}

int main(int argc, char** argv) {
    Run run;
    // past the file size limit (ulimit -f) a write then fails with EFBIG, said in one line and its
    // temporary file removed; the signal's default would end the run without a word
    signal(SIGXFSZ, SIG_IGN);
    memset(&run, 0, sizeof(run));
    TrainArgs* args = &run.args;
    train_args_parse(args, argc, argv);
    if (args->memory) {  // the preset's sizes (its cameras): no dataset, no GPU
        SmolVLAConfig c = smolvla_preset(args->preset)->config;
        if (args->max_text > 0) { c.max_text = args->max_text; }
        print_memory_table(&c, args->preset, args->train_mode, args->batch);
        return 0;
    }
    if (!LOSS_SCALING) { train_args_no_loss_scale(args, "this train_vla (built for " PRECISION_NAME ")"); }
    run.loss_scale.scale = args->loss_scale;
    gpu_check_visible(args->ranks);
    dist_check_args(args);
    run.local_ranks = args->ranks;
    run.node = args->node_rank;
    run.nodes = args->nodes;
    run.world = run.nodes * run.local_ranks;
    train_args_for_world(args, run.world);
    if (run.node == 0) { run_folder_open(args); }  // node 0 writes the run: it owns the output folder until it ends
    dataset_open(&run.ds, args->input);
    if (args->balance == BALANCE_TASKS) {  // before a checkpoint is read: it must have been trained with the same
        task_balance_build(&run.balance_storage, &run.ds, args->task_weights);
        args->balance_id = run.balance_storage.fingerprint;
        run.balance = &run.balance_storage;
    }
    char resume_path[VLA_PATH_MAX];
    run.from = run_start_checkpoint(args, resume_path, sizeof(resume_path));
    run.config = run_config(args, run.from, &run.ds);
    const char* gpu_problem = smolvla_gpu_problem(&run.config, args->train_mode);
    if (gpu_problem != NULL) { vla_fail("%s", gpu_problem); }
    if (run.from != NULL && args->weights_only) {  // fine-tuning: the weights alone, fresh moments, step 0
        run_weights_load(run.from, &run.config, &run.ds, &run.initial);
        printf("fine-tuning the weights of %s\n", run.from);
    } else if (run.from != NULL) {
        Checkpoint* ck = &run.initial;
        run_checkpoint_load(run.from, &run.config, args, &run.ds, ck);
        run.start = (int)ck->step;
        run.sampler_pos = ck->sampler_pos;
        if (ck->seed != args->seed) { printf("using the checkpoint's seed %llu\n", (unsigned long long)ck->seed); }
        args->seed = ck->seed;
        printf("resumed from %s at step %d\n", run.from, run.start);
        if (LOSS_SCALING && ck->loss_scale.scale > 0.0f) {  // it goes on where it was (--loss-scale starts runs)
            run.loss_scale = ck->loss_scale;
            printf("resumed the loss scale %g (%u clean steps, %llu skipped)\n", (double)run.loss_scale.scale,
                   run.loss_scale.clean, (unsigned long long)run.loss_scale.skipped);
        }
    } else {  // the same init for every rank
        SmolParamTable t;
        smolvla_table_build(&run.config, &t);
        run.initial.params = (float*)mallocCheck(t.total * sizeof(float));
        smolvla_param_init(run.initial.params, &t, &run.config, args->seed);
    }
    if (!run_has_steps_left(run.from, run.start, args->steps)) { return 0; }
    if (args->profile > 0 && (args->profile <= run.start || args->profile > args->steps)) {
        vla_fail("--profile %d: this run trains steps %d to %d: profile one of them (one after the first, which warms up)",
                 args->profile, run.start + 1, args->steps);
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (run.node == 0) {
        print_config(&run, &prop, smolvla_flops_per_sample(&run.config, args->train_mode), device_peak_flops(prop.name));
    }
    dist_share_id(&run);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);  // a closed terminal or a dropped ssh saves too
    Watchdog watchdog;
    watchdog_start(&watchdog, &run);
    int stopped = run_ranks(&run, &watchdog, train_rank);
    watchdog_stop(&watchdog);
    if (run.balance != NULL) { task_balance_free(&run.balance_storage); }
    checkpoint_free(&run.initial);
    dataset_close(&run.ds);
    return stopped ? 130 : 0;
}
#endif
