/*
layernorm.cu: LayerNorm with weight and bias, forward and backward, over rows of C: the vision
tower's layer_norm1, layer_norm2 and post_layernorm (SigLIP, eps 1e-6, torch.nn.LayerNorm); and
the column sums that give a bias its gradient (vla/cuda/column_sum.cuh's bias_backward: LayerNorm's
db is such a sum, and every linear layer's bias gradient is one).
  forward:  out = (x - m) r w + b per row, with m = mean x and r = (mean (x - m)^2 + 1e-6)^-1/2 (the
            biased variance, as torch.nn.LayerNorm); mean = m and rstd = r kept in fp32 for the
            backward. The variance is taken about the mean (two passes), never as E[x^2] - m^2,
            which cancels catastrophically when |m| is large against the spread.
  backward: with xh = (x - m) r and g = dy w, the gradient through the centring and the scaling is
            dx = r (g - mean g - xh mean(g xh)), added into the fp32 residual gradient dres and
            written as its floatX copy dres_x; dw += sum over rows of dy xh, db += sum of dy, both
            from per-chunk partial sums that the header's column_sum adds in chunk order (no
            atomics: the same bits every run)
  column sums: db (C) += sum over the N rows (stride ld) of dout, in two fixed-order stages:
            per-chunk partial sums (column_partial_*), then their sum in chunk order (column_sum)

  Kernels named _vN are this program's; _kernelN vla/cuda/layernorm.cuh's and column_sum.cuh's.
  version 1  forward: one warp per row, scalar loads, x read once per pass (layernorm_forward_v1)
             backward: one block per chunk of rows, thread t owns columns t + j blockDim.x, the
             two row sums by block reductions (layernorm_backward_v1; C <= LAYERNORM_V1_COLS *
             blockDim.x)
  version 2  forward: version 1 with 128-bit loads and stores, the row held in registers across
             the mean, variance and output passes (layernorm_forward_kernel2, the header's; C a
             multiple of x128::size, at most 32 * LAYERNORM_FWD2_VALS)
             backward: one warp per row with 128-bit loads and stores, so a row needs no block
             barrier; each lane keeps its columns' dw and db sums in registers, and the warps' sums
             meet in shared memory, added in warp order (the header's layernorm_backward_kernel2; C a
             multiple of x128::size, at most 32 * LAYERNORM_BWD2_VALS = 1024)
  version 3  backward: version 2 with 48 columns a lane, widths up to 1536 (pi0's SigLIP so400m,
             1152), blocks of at most LAYERNORM_BWD3_BLOCK (256) threads (layernorm_backward_kernel3,
             the header's)
  version 0  the header's launchers, what trains, at BLOCK: layernorm_forward (version 2) and
             layernorm_backward (the header's layernorm_backward_kernel2, version 2's kernel, up to
             1024 wide; version 3 past that)
  All but the version 1 forward take blocks of at most LAYERNORM_MAX_BLOCK (512) threads.
  column sums, version 1: one thread per column of a chunk of rows, scalar loads (column_partial_v1)
             version 2: a lane per 16-byte pack of columns, the block's warps over the chunk's
             rows, their sums added in warp order (column_partial_kernel2, the header's; C and ld
             multiples of x128::size; COLPART2_WARPS warps a block)
             version 0: the header's bias_backward (version 2 where C, ld and the pointer allow it)

  nvcc -O3 -std=c++17 -arch=sm_90 layernorm.cu -o layernorm && ./layernorm
*/
#include "common.h"
#include "../../vla/cuda/layernorm.cuh"
#include "../../vla/cuda/column_sum.cuh"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds the kernel and the reference differ only by fp32 arithmetic
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
// fp32 outputs (mean, rstd, dres, dw, db) computed in fp32 from the floatX inputs the reference
// also sees: sums of up to a few thousand terms, each rounding by 6e-8
static const double TOL_F = 1e-5;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: this program's versions (the header's are version 2 forward, 3 backward)

// Version 1 forward: out = (x - mean) rstd w + b per row of C; mean and rstd kept. One warp per row,
// scalar loads.
__global__ void layernorm_forward_v1(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* w,
                                     const floatX* b, int N, int C) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= N) { return; }  // whole warps leave together
    const floatX* x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) { s += f32(x[c]); }
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = f32(x[c]) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / (float)C + LAYERNORM_EPS);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    floatX* y = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) { y[c] = fx((f32(x[c]) - m) * r * f32(w[c]) + f32(b[c])); }
}

// Version 1 backward: y = xh w + b with xh = (x - m) r, so with g = dy w (the gradient reaching xh):
//   dx_c = r (g_c - 1/C sum_j g_j - xh_c 1/C sum_j g_j xh_j),  dw_c = sum_rows dy_c xh_c,  db_c = sum_rows dy_c.
// dx into dres and dres_x; partial (2, gridDim.x, C): the block's dw, then db sums. One block per
// chunk of rows; thread t owns columns t + j * blockDim.x, the row sums by block reductions.
#define LAYERNORM_V1_COLS 8  // columns per thread: C <= LAYERNORM_V1_COLS * blockDim.x
__global__ void __launch_bounds__(LAYERNORM_MAX_BLOCK) layernorm_backward_v1(float* dres, floatX* dres_x,
                                                                              float* partial, const floatX* dout,
                                                                              const floatX* inp, const floatX* w,
                                                                              const float* mean, const float* rstd,
                                                                              int N, int C, int rows_per_block) {
    __shared__ float shared[32];
    float dw_acc[LAYERNORM_V1_COLS], db_acc[LAYERNORM_V1_COLS];
    #pragma unroll
    for (int j = 0; j < LAYERNORM_V1_COLS; j++) { dw_acc[j] = 0.0f; db_acc[j] = 0.0f; }
    int r0 = blockIdx.x * rows_per_block, r1 = min(r0 + rows_per_block, N);
    for (int n = r0; n < r1; n++) {
        const floatX* x = inp + (size_t)n * C;
        const floatX* dy = dout + (size_t)n * C;
        float m = mean[n], r = rstd[n], sum_g = 0.0f, sum_gxh = 0.0f;
        #pragma unroll
        for (int j = 0; j < LAYERNORM_V1_COLS; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c < C) {
                float g = f32(dy[c]) * f32(w[c]), xh = (f32(x[c]) - m) * r;
                sum_g += g;
                sum_gxh += g * xh;
            }
        }
        float mean_g = block_sum(sum_g, shared) / (float)C;
        float mean_gxh = block_sum(sum_gxh, shared) / (float)C;
        #pragma unroll
        for (int j = 0; j < LAYERNORM_V1_COLS; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c < C) {
                float dyv = f32(dy[c]), xh = (f32(x[c]) - m) * r;
                float d = dres[(size_t)n * C + c] + r * (dyv * f32(w[c]) - mean_g - xh * mean_gxh);
                dres[(size_t)n * C + c] = d;
                dres_x[(size_t)n * C + c] = fx(d);
                dw_acc[j] += dyv * xh;
                db_acc[j] += dyv;
            }
        }
    }
    float* dw_partial = partial + (size_t)blockIdx.x * C;
    float* db_partial = partial + ((size_t)gridDim.x + blockIdx.x) * C;
    #pragma unroll
    for (int j = 0; j < LAYERNORM_V1_COLS; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < C) {
            dw_partial[c] = dw_acc[j];
            db_partial[c] = db_acc[j];
        }
    }
}

// ----------------------------------------------------------------------------
// the versions, launched directly; version 0 the header's launchers (what trains)

// Whether each version takes this width (and pointers) at this block size. Versions 2 and 3
// backward: whole 16-byte packs, the width a lane's registers hold, the warps' sums within 48 KB of
// shared memory, blocks the registers allow (version 3's: the header's layernorm_backward3_fits)
static bool forward_takes(int version, int C, const floatX* out, const floatX* inp, const floatX* w, const floatX* b,
                          int block) {
    return version == 1 || layernorm_forward2_fits(out, inp, w, b, C, version == 0 ? BLOCK : block);
}

static bool backward_takes(int version, int C, const float* dres, const floatX* dres_x, const floatX* dout,
                           const floatX* inp, const floatX* w, int block) {
    bool packs = packable(C, x128::size, dres, dres_x, dout) && packable(C, x128::size, inp, w);
    bool fits2 = packs && C <= 32 * LAYERNORM_BWD2_VALS && (size_t)(block / 32) * C * sizeof(float) <= 48 * 1024 &&
                 block <= LAYERNORM_MAX_BLOCK;
    switch (version) {
        case 0: return backward_takes(2, C, dres, dres_x, dout, inp, w, BLOCK) ||
                       backward_takes(3, C, dres, dres_x, dout, inp, w, BLOCK);
        case 1: return C <= LAYERNORM_V1_COLS * block && block <= LAYERNORM_MAX_BLOCK;
        case 2: return fits2;
        default: return layernorm_backward3_fits(dres, dres_x, dout, inp, w, C, block);
    }
}

static void run_forward(int version, int block, floatX* out, float* mean, float* rstd, const floatX* inp,
                        const floatX* w, const floatX* b, int N, int C) {
    int grid = ceil_div((size_t)N * 32, block);
    switch (version) {
        case 1: layernorm_forward_v1<<<grid, block, 0, main_stream>>>(out, mean, rstd, inp, w, b, N, C); break;
        case 2: layernorm_forward_kernel2<<<grid, block, 0, main_stream>>>(out, mean, rstd, inp, w, b, N, C); break;
        default: layernorm_forward(out, mean, rstd, inp, w, b, N, C); return;
    }
    launchCheck();
}

// partial: scratch of 2 * ceil(N / rows_per_block) * C floats (version 0: its own rows, colsum_rows(N))
static void run_backward(int version, int block, int rows_per_block, float* dres, floatX* dres_x, float* dw, float* db,
                         float* partial, const floatX* dout, const floatX* inp, const floatX* w, const float* mean,
                         const float* rstd, int N, int C) {
    if (version == 0) {
        layernorm_backward(dres, dres_x, dw, db, partial, dout, inp, w, mean, rstd, N, C);
        return;
    }
    int chunks = ceil_div(N, rows_per_block);
    size_t smem = (size_t)(block / 32) * C * sizeof(float);
    switch (version) {
        case 1:
            layernorm_backward_v1<<<chunks, block, 0, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean, rstd, N,
                                                                    C, rows_per_block);
            break;
        case 2:
            layernorm_backward_kernel2<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean, rstd,
                                                                       N, C, rows_per_block);
            break;
        default:
            layernorm_backward_kernel3<<<chunks, block, smem, main_stream>>>(dres, dres_x, partial, dout, inp, w, mean,
                                                                            rstd, N, C, rows_per_block);
            break;
    }
    launchCheck();
    column_sum(dw, partial, chunks, C);
    column_sum(db, partial + (size_t)chunks * C, chunks, C);
}

// ----------------------------------------------------------------------------
// references, in double

static void layernorm_forward_reference(double* out, double* mean, double* rstd, const float* x, const float* w,
                                        const float* b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++) { s += xn[c]; }
        double m = s / C, v = 0.0;
        for (int c = 0; c < C; c++) { v += (xn[c] - m) * (xn[c] - m); }
        double r = 1.0 / sqrt(v / C + 1e-6);
        mean[n] = m;
        rstd[n] = r;
        for (int c = 0; c < C; c++) { out[(size_t)n * C + c] = (xn[c] - m) * r * w[c] + b[c]; }
    }
}

// dres (N, C), dw and db (C) hold their values before the call and are accumulated into; mean
// and rstd are the fp32 statistics the kernel is given
static void layernorm_backward_reference(double* dres, double* dw, double* db, const float* dout, const float* x,
                                         const float* w, const float* mean, const float* rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float* xn = x + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        double m = mean[n], r = rstd[n], sum_g = 0.0, sum_gxh = 0.0;
        for (int c = 0; c < C; c++) {
            double g = (double)dy[c] * w[c], xh = (xn[c] - m) * r;
            sum_g += g;
            sum_gxh += g * xh;
        }
        for (int c = 0; c < C; c++) {
            double xh = (xn[c] - m) * r;
            dres[(size_t)n * C + c] += r * ((double)dy[c] * w[c] - sum_g / C - xh * sum_gxh / C);
            dw[c] += dy[c] * xh;
            db[c] += dy[c];
        }
    }
}

// The backward formula against central differences of the forward reference: the loss
// sum(out * dy) is perturbed in one input, weight and bias value at a time, so a slip in the
// derivation cannot hide in both the kernel and the reference
static void check_backward_reference(void) {
    const int N = 3, C = 10;
    float* x = random_floats(N * C, 2.0f, 11);
    float* w = random_floats(C, 1.5f, 12);
    float* b = random_floats(C, 0.5f, 13);
    float* dy = random_floats(N * C, 1.0f, 14);
    for (int i = 0; i < N * C; i++) { x[i] += 1.0f; }  // a mean away from zero
    double out[N * C], mean64[N], rstd64[N];
    float mean[N], rstd[N];
    layernorm_forward_reference(out, mean64, rstd64, x, w, b, N, C);
    for (int n = 0; n < N; n++) { mean[n] = (float)mean64[n]; rstd[n] = (float)rstd64[n]; }
    double dx[N * C] = {0}, dw[C] = {0}, db[C] = {0};
    // the statistics in the float the kernel gets differ from the exact ones by 6e-8 relative
    layernorm_backward_reference(dx, dw, db, dy, x, w, mean, rstd, N, C);
    // the loss and its derivatives in double, perturbing a double copy of the inputs
    double xd[N * C], wd[C], bd[C];
    for (int i = 0; i < N * C; i++) { xd[i] = x[i]; }
    for (int c = 0; c < C; c++) { wd[c] = w[c]; bd[c] = b[c]; }
    auto loss = [&]() {
        double l = 0.0;
        for (int n = 0; n < N; n++) {
            double s = 0.0, v = 0.0;
            for (int c = 0; c < C; c++) { s += xd[n * C + c]; }
            double m = s / C;
            for (int c = 0; c < C; c++) { v += (xd[n * C + c] - m) * (xd[n * C + c] - m); }
            double r = 1.0 / sqrt(v / C + 1e-6);
            for (int c = 0; c < C; c++) { l += ((xd[n * C + c] - m) * r * wd[c] + bd[c]) * dy[n * C + c]; }
        }
        return l;
    };
    const double h = 1e-5;
    float got[N * C + 2 * C];
    double ref[N * C + 2 * C];
    for (int i = 0; i < N * C + 2 * C; i++) {
        double* p = i < N * C ? &xd[i] : i < N * C + C ? &wd[i - N * C] : &bd[i - N * C - C];
        double keep = *p;
        *p = keep + h;
        double lp = loss();
        *p = keep - h;
        double lm = loss();
        *p = keep;
        ref[i] = (lp - lm) / (2.0 * h);
        got[i] = (float)(i < N * C ? dx[i] : i < N * C + C ? dw[i - N * C] : db[i - N * C - C]);
    }
    // central differences err by h^2 f''' ~ 1e-10; the fp32 statistics and the float of the
    // result by about 1e-7
    check_close("reference backward (dx, dw, db) against central differences", got, ref, N * C + 2 * C, 1e-6);
    free(x); free(w); free(b); free(dy);
}

// ----------------------------------------------------------------------------
// checks

static floatX* alloc_x(size_t n) {
    floatX* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(floatX)));
    return p;
}

static float* alloc_f(size_t n) {
    float* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(float)));
    return p;
}

// rows of spread 2 scale about a per-row offset in [-3 scale, 3 scale], so the mean matters; at
// scale 1e-3 the variance (about 1e-6) is as large as eps, so eps matters too
static float* random_rows(int N, int C, float scale, uint64_t seed) {
    float* x = random_floats((size_t)N * C, 2.0f * scale, seed);
    float* offset = random_floats(N, 3.0f * scale, seed + 1000);
    for (size_t i = 0; i < (size_t)N * C; i++) { x[i] += offset[i / C]; }
    free(offset);
    return x;
}

static void check_forward(int N, int C, float scale, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_rows(N, C, scale, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    float* b = random_floats(C, 1.0f, seed + 2);
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    floatX* d_b = to_device_x(b, C);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_mean = (double*)mallocCheck(N * sizeof(double));
    double* ref_rstd = (double*)mallocCheck(N * sizeof(double));
    layernorm_forward_reference(ref, ref_mean, ref_rstd, x, w, b, N, C);
    floatX* out = alloc_x(n);
    float* mean = alloc_f(N);
    float* rstd = alloc_f(N);
    for (int version = 0; version <= 2; version++) {
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            if (!forward_takes(version, C, out, d_x, d_w, d_b, BLOCKS[bi])) { continue; }
            poison(out, n * sizeof(floatX));
            poison(mean, N * sizeof(float));
            poison(rstd, N * sizeof(float));
            run_forward(version, BLOCKS[bi], out, mean, rstd, d_x, d_w, d_b, N, C);
            float* got = from_device_x(out, n);
            float* got_mean = from_device_f(mean, N);
            float* got_rstd = from_device_f(rstd, N);
            char what[160], item[200];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher forward (N %d, C %d, x scale %g)", N, C, scale);
            } else {
                snprintf(what, sizeof(what), "v%d forward (N %d, C %d, x scale %g) block %d", version, N, C, scale,
                         BLOCKS[bi]);
            }
            snprintf(item, sizeof(item), "%s: out", what);
            check_close(item, got, ref, n, TOL_X);
            snprintf(item, sizeof(item), "%s: mean", what);
            check_close(item, got_mean, ref_mean, N, TOL_F);
            snprintf(item, sizeof(item), "%s: rstd", what);
            check_close(item, got_rstd, ref_rstd, N, TOL_F);
            free(got); free(got_mean); free(got_rstd);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(mean)); cudaCheck(cudaFree(rstd));
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_b));
    free(x); free(w); free(b); free(ref); free(ref_mean); free(ref_rstd);
}

static void check_backward(int N, int C, float scale, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* x = random_rows(N, C, scale, seed);
    float* w = random_floats(C, 1.5f, seed + 1);
    float* b = random_floats(C, 1.0f, seed + 2);
    float* dout = random_floats(n, 1.0f, seed + 3);
    float* dres0 = random_floats(n, 0.5f, seed + 4);  // what dres holds before: the kernel adds to it
    float* dw0 = random_floats(C, 1.0f, seed + 5);     // the same for dw and db
    float* db0 = random_floats(C, 1.0f, seed + 6);
    floatX* d_x = to_device_x(x, n);
    floatX* d_w = to_device_x(w, C);
    floatX* d_dout = to_device_x(dout, n);
    for (int c = 0; c < C; c++) { b[c] = round_x(b[c]); }  // as the forward pass sees it (the backward never reads b)
    // the statistics the forward pass would keep (fp32), given to the kernel and the reference alike
    double* fwd = (double*)mallocCheck(n * sizeof(double));
    double* mean64 = (double*)mallocCheck(N * sizeof(double));
    double* rstd64 = (double*)mallocCheck(N * sizeof(double));
    layernorm_forward_reference(fwd, mean64, rstd64, x, w, b, N, C);
    float* mean = (float*)mallocCheck(N * sizeof(float));
    float* rstd = (float*)mallocCheck(N * sizeof(float));
    for (int i = 0; i < N; i++) { mean[i] = (float)mean64[i]; rstd[i] = (float)rstd64[i]; }
    float* d_mean = to_device_f(mean, N);
    float* d_rstd = to_device_f(rstd, N);

    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_dw = (double*)mallocCheck(C * sizeof(double));
    double* ref_db = (double*)mallocCheck(C * sizeof(double));
    for (size_t i = 0; i < n; i++) { ref[i] = dres0[i]; }
    for (int c = 0; c < C; c++) { ref_dw[c] = dw0[c]; ref_db[c] = db0[c]; }
    layernorm_backward_reference(ref, ref_dw, ref_db, dout, x, w, mean, rstd, N, C);

    float* dres = alloc_f(n);
    floatX* dres_x = alloc_x(n);
    float* dw = alloc_f(C);
    float* db = alloc_f(C);
    float* partial = alloc_f(2 * n);  // enough for one row per chunk
    int rows[2] = {CHUNK_ROWS, 3};    // the launcher's chunk at most, and one that splits rows unevenly
    for (int version = 0; version <= 3; version++) {
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            int block = version == 0 ? BLOCK : BLOCKS[bi];
            if (!backward_takes(version, C, dres, dres_x, d_dout, d_x, d_w, block)) { continue; }
            for (int ri = 0; ri < (version == 0 ? 1 : 2); ri++) {
                cudaCheck(cudaMemcpy(dres, dres0, n * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(dw, dw0, C * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(db, db0, C * sizeof(float), cudaMemcpyHostToDevice));
                poison(dres_x, n * sizeof(floatX));
                poison(partial, 2 * n * sizeof(float));
                run_backward(version, block, rows[ri], dres, dres_x, dw, db, partial, d_dout, d_x, d_w, d_mean, d_rstd,
                             N, C);
                char what[160], item[200];
                if (version == 0) {
                    snprintf(what, sizeof(what), "launcher backward (N %d, C %d, x scale %g)", N, C, scale);
                } else {
                    snprintf(what, sizeof(what), "v%d backward (N %d, C %d, x scale %g) block %d, %d rows per block",
                             version, N, C, scale, block, rows[ri]);
                }
                float* got = from_device_f(dres, n);
                float* got_x = from_device_x(dres_x, n);
                float* got_dw = from_device_f(dw, C);
                float* got_db = from_device_f(db, C);
                snprintf(item, sizeof(item), "%s: dres += dx", what);
                check_close(item, got, ref, n, TOL_F);
                snprintf(item, sizeof(item), "%s: dres_x", what);
                check_close(item, got_x, ref, n, TOL_X);
                snprintf(item, sizeof(item), "%s: dw +=", what);
                check_close(item, got_dw, ref_dw, C, TOL_F);
                snprintf(item, sizeof(item), "%s: db +=", what);
                check_close(item, got_db, ref_db, C, TOL_F);
                free(got); free(got_x); free(got_dw); free(got_db);
            }
        }
    }
    cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(db));
    cudaCheck(cudaFree(partial));
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_mean)); cudaCheck(cudaFree(d_rstd));
    free(x); free(w); free(b); free(dout); free(dres0); free(dw0); free(db0); free(fwd); free(mean64); free(rstd64);
    free(mean); free(rstd); free(ref); free(ref_dw); free(ref_db);
}

// Two runs of each backward version give the same bits (the sums are added in a fixed order)
static void check_deterministic(int N, int C, uint64_t seed) {
    size_t n = (size_t)N * C;
    float* h = random_rows(N, C, 1.0f, seed);
    float* stats = random_floats(2 * N, 0.5f, seed + 1);
    for (int i = 0; i < N; i++) { stats[N + i] += 1.0f; }  // rstd in [0.5, 1.5]
    floatX* x = to_device_x(h, n);
    floatX* dout = to_device_x(h, n);
    floatX* w = to_device_x(h, C);
    float* mean = to_device_f(stats, N);
    float* rstd = to_device_f(stats + N, N);
    float* dres = alloc_f(n);
    floatX* dres_x = alloc_x(n);
    float* dwb = alloc_f(2 * C);
    float* partial = alloc_f(2 * colsum_chunks(N) * C);  // (the launcher's chunks, CHUNK_ROWS's at most)
    for (int version = 0; version <= 3; version++) {
        if (!backward_takes(version, C, dres, dres_x, dout, x, w, BLOCK)) { continue; }
        float* got[2];
        for (int run = 0; run < 2; run++) {
            cudaCheck(cudaMemset(dres, 0, n * sizeof(float)));
            cudaCheck(cudaMemset(dwb, 0, 2 * C * sizeof(float)));
            run_backward(version, BLOCK, CHUNK_ROWS, dres, dres_x, dwb, dwb + C, partial, dout, x, w, mean, rstd, N, C);
            got[run] = from_device_f(dwb, 2 * C);
        }
        char what[160];
        snprintf(what, sizeof(what), "%s backward (N %d, C %d): dw and db the same bits in two runs",
                 version == 0 ? "launcher" : version == 1 ? "v1" : version == 2 ? "v2" : "v3", N, C);
        check_true(what, memcmp(got[0], got[1], 2 * C * sizeof(float)) == 0);
        free(got[0]); free(got[1]);
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(mean));
    cudaCheck(cudaFree(rstd)); cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(dwb));
    cudaCheck(cudaFree(partial));
    free(h); free(stats);
}

// ----------------------------------------------------------------------------
// column sums (a bias's gradient): this program's version 1, the header's version 2 and
// bias_backward (version 0)

// Version 1: partial (gridDim.y, C) <- the column sums of the rows of chunk blockIdx.y of x (N rows
// of stride ld); one thread per column, scalar loads
__global__ void column_partial_v1(float* partial, const floatX* x, int N, int C, int ld, int rows_per_block) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    int r0 = blockIdx.y * rows_per_block, r1 = min(r0 + rows_per_block, N);
    float s = 0.0f;
    for (int n = r0; n < r1; n++) { s += f32(x[(size_t)n * ld + c]); }
    partial[(size_t)blockIdx.y * C + c] = s;
}

// Version 0 is checked where C and ld are whole 16-byte packs, the widths bias_backward is for;
// version 1 takes the others. Version 2's block is fixed (COLPART2_WARPS warps).
static bool colsum_takes(int version, int C, int ld, const floatX* x) {
    return version == 1 || (packable(C, x128::size, x) && ld % x128::size == 0);
}

// db (C) += the column sums of x (N rows of stride ld); partial: ceil(N / rows_per_block) * C floats
// (version 0: its own rows, colsum_rows(N))
static void run_colsum(int version, int block, int rows_per_block, float* db, float* partial, const floatX* x, int N,
                       int C, int ld) {
    if (version == 0) {
        bias_backward(db, partial, x, N, C, ld);
        return;
    }
    int chunks = ceil_div(N, rows_per_block);
    if (version == 1) {
        dim3 grid(ceil_div(C, block), chunks);
        column_partial_v1<<<grid, block, 0, main_stream>>>(partial, x, N, C, ld, rows_per_block);
    } else {
        dim3 grid(ceil_div(C, 32 * x128::size), chunks);
        column_partial_kernel2<<<grid, 32 * COLPART2_WARPS, 0, main_stream>>>(partial, x, N, C, ld, rows_per_block);
    }
    launchCheck();
    column_sum(db, partial, chunks, C);
}

static void check_colsum(int N, int C, int ld, uint64_t seed) {
    size_t n = (size_t)N * ld;
    float* x = random_floats(n, 1.0f, seed);
    float* db0 = random_floats(C, 1.0f, seed + 1);  // what db holds before: the sums are added to it
    floatX* d_x = to_device_x(x, n);
    double* ref = (double*)mallocCheck(C * sizeof(double));
    for (int c = 0; c < C; c++) {
        double s = db0[c];
        for (int r = 0; r < N; r++) { s += x[(size_t)r * ld + c]; }
        ref[c] = s;
    }
    float* db = alloc_f(C);
    float* partial = alloc_f((size_t)N * C);  // enough for one row per chunk
    int rows[2] = {CHUNK_ROWS, 3};           // the launcher's chunk at most, and one that splits rows unevenly
    for (int version = 0; version <= 2; version++) {
        if (!colsum_takes(version, C, ld, d_x)) { continue; }
        int n_blocks = version == 1 ? N_BLOCKS : 1;
        for (int bi = 0; bi < n_blocks; bi++) {
            for (int ri = 0; ri < (version == 0 ? 1 : 2); ri++) {
                cudaCheck(cudaMemcpy(db, db0, C * sizeof(float), cudaMemcpyHostToDevice));
                poison(partial, (size_t)N * C * sizeof(float));
                run_colsum(version, BLOCKS[bi], rows[ri], db, partial, d_x, N, C, ld);
                float* got = from_device_f(db, C);
                char what[200];
                if (version == 0) {
                    snprintf(what, sizeof(what), "bias_backward (N %d, C %d, ld %d): db +=", N, C, ld);
                } else if (version == 1) {
                    snprintf(what, sizeof(what), "column sums v1 (N %d, C %d, ld %d) block %d, %d rows per block: "
                             "db +=", N, C, ld, BLOCKS[bi], rows[ri]);
                } else {
                    snprintf(what, sizeof(what), "column sums v2 (N %d, C %d, ld %d) %d rows per block: db +=", N, C,
                             ld, rows[ri]);
                }
                check_close(what, got, ref, C, TOL_F);
                free(got);
            }
        }
    }
    cudaCheck(cudaFree(db)); cudaCheck(cudaFree(partial)); cudaCheck(cudaFree(d_x));
    free(x); free(db0); free(ref);
}

// ----------------------------------------------------------------------------
// benchmarks at the vision tower's shapes: SmolVLA's, every patch of a 32-sample batch of two cameras
// (1024 patches each) at 768 (and its MLP's 3072 for the biases); pi0's so400m, 8 samples of two
// cameras of 256 patches at 1152 (and 4304). Version 0 (the header's launchers) at BLOCK, the others
// at each block size they take.

static void benchmark_shape(const char* name, int N, int C) {
    size_t n = (size_t)N * C;
    float* h = random_floats(n, 1.0f, 7);
    floatX* x = to_device_x(h, n);
    floatX* dout = to_device_x(h, n);
    floatX* w = to_device_x(h, C);
    floatX* b = to_device_x(h + C, C);
    floatX* out = alloc_x(n);
    floatX* dres_x = alloc_x(n);
    float* mean = alloc_f(N);
    float* rstd = alloc_f(N);
    float* dres = to_device_f(h, n);
    float* dw = to_device_f(h, C);
    float* db = to_device_f(h, C);
    float* partial = alloc_f(2 * colsum_chunks(N) * C);  // (the launcher's chunks, CHUNK_ROWS's at most)
    layernorm_forward(out, mean, rstd, x, w, b, N, C);  // real statistics for the backward

    // x read, out written, w and b read, mean and rstd written
    double fwd_bytes = 2.0 * n * sizeof(floatX) + 2.0 * C * sizeof(floatX) + 2.0 * N * sizeof(float);
    for (int version = 0; version <= 2; version++) {
        for (int block = version == 0 ? BLOCK : 64; block <= (version == 0 ? BLOCK : 1024); block *= 2) {
            if (!forward_takes(version, C, out, x, w, b, block)) { continue; }
            double ms = time_ms([&]() { run_forward(version, block, out, mean, rstd, x, w, b, N, C); }, 20);
            printf("bench %-8s forward  %s (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n",
                   version == 0 ? "launcher" : version == 1 ? "v1" : "v2", name, N, C, block, ms,
                   fwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    for (int version = 0; version <= 3; version++) {
        // dout and x read, dres read and written, dres_x written, the partial sums of dw and db
        // written and read, the statistics read, w read, dw and db read and written
        int rows = version == 0 ? colsum_rows(N) : CHUNK_ROWS, chunks = ceil_div(N, rows);
        double bwd_bytes = 3.0 * n * sizeof(floatX) + 2.0 * n * sizeof(float) + 4.0 * chunks * C * sizeof(float) +
                           2.0 * N * sizeof(float) + C * (sizeof(floatX) + 4 * sizeof(float));
        for (int block = version == 0 ? BLOCK : 128; block <= (version == 0 ? BLOCK : 1024); block *= 2) {
            if (!backward_takes(version, C, dres, dres_x, dout, x, w, block)) { continue; }
            double ms = time_ms([&]() {
                run_backward(version, block, rows, dres, dres_x, dw, db, partial, dout, x, w, mean, rstd, N, C);
            }, 20);
            printf("bench %-8s backward %s (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n",
                   version == 0 ? "launcher" : version == 1 ? "v1" : version == 2 ? "v2" : "v3", name, N, C, block, ms,
                   bwd_bytes / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dout)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(b));
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dres_x)); cudaCheck(cudaFree(mean)); cudaCheck(cudaFree(rstd));
    cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dw)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(partial));
    free(h);
}

// a bias's gradient over N rows of C
static void benchmark_colsum(const char* name, int N, int C) {
    size_t n = (size_t)N * C;
    float* h = random_floats(n, 1.0f, 8);
    floatX* x = to_device_x(h, n);
    float* db = to_device_f(h, C);
    float* partial = alloc_f(colsum_chunks(N) * C);
    for (int version = 0; version <= 2; version++) {
        int rows = version == 0 ? colsum_rows(N) : CHUNK_ROWS, chunks = ceil_div(N, rows);
        // x read, the partial sums written and read, db read and written
        double bytes = n * sizeof(floatX) + 2.0 * chunks * C * sizeof(float) + 2.0 * C * sizeof(float);
        for (int block = version == 1 ? 64 : BLOCK; block <= (version == 1 ? 1024 : BLOCK); block *= 2) {
            double ms = time_ms([&]() { run_colsum(version, block, rows, db, partial, x, N, C, C); }, 20);
            printf("bench %-13s %s (N %d, C %d) block %4d: %7.3f ms, %7.1f GB/s\n",
                   version == 0 ? "bias_backward" : version == 1 ? "colsum v1" : "colsum v2", name, N, C,
                   version == 2 ? 32 * COLPART2_WARPS : block, ms, bytes / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(db)); cudaCheck(cudaFree(partial));
    free(h);
}

static void benchmark(void) {
    benchmark_shape("smolvla", 32 * 2 * 1024, 768);
    benchmark_shape("pi0", 8 * 2 * 256, 1152);
    benchmark_colsum("smolvla", 32 * 2 * 1024, 768);
    benchmark_colsum("smolvla mlp", 32 * 2 * 1024, 3072);
    benchmark_colsum("pi0", 8 * 2 * 256, 1152);
    benchmark_colsum("pi0 mlp", 8 * 2 * 256, 4304);
}

int main(void) {
    dev_init("layernorm");
    check_backward_reference();
    // odd widths (version 1 only), widths where versions 2 and 3 apply (multiples of x128::size: 300
    // in fp32 builds only), the vision widths (768, pi0's 1152: version 3's backward), the widest
    // version 2 forward takes; row counts that leave the last warp's block or the last chunk partly
    // empty; rows whose variance is eps's size
    struct { int N, C; float scale; } shapes[] = {
        {7, 37, 1.0f}, {45, 64, 1.0f}, {13, 300, 1.0f}, {33, 24, 1.0f}, {70, 768, 1.0f}, {3, 2048, 1.0f}, {1, 8, 1.0f},
        {20, 768, 1e-3f}, {21, 1152, 1.0f},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_forward(shapes[i].N, shapes[i].C, shapes[i].scale, 100 + 10 * i);
        check_backward(shapes[i].N, shapes[i].C, shapes[i].scale, 200 + 10 * i);
    }
    check_deterministic(100, 768, 300);
    // column sums: one row; widths in no whole pack (5, 37), in packs in fp32 only (12, 300), in both;
    // a row stride past the width (the action embedding's halves, ld 2 C); the vision widths; row
    // counts that leave the last chunk partly empty
    struct { int N, C, ld; } sums[] = {
        {1, 8, 8}, {7, 5, 5}, {100, 37, 40}, {45, 24, 48}, {50, 12, 12}, {13, 300, 300}, {300, 64, 64},
        {1000, 768, 768}, {33, 3072, 3072}, {70, 720, 1440}, {20, 4304, 4304},
    };
    for (size_t i = 0; i < sizeof(sums) / sizeof(sums[0]); i++) {
        check_colsum(sums[i].N, sums[i].C, sums[i].ld, 400 + 10 * i);
    }
    return dev_finish(benchmark);
}
