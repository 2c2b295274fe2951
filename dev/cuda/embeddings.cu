/*
embeddings.cu: the vision tower's position embedding, forward and backward, and the row copies
between activations (the expert-mode backward gathers the state rows of the VLM's layers; pi0's
suffix scatters its state and action tokens into place and gathers them back).

  add_periodic:     x (n) += table[i % period]: the position table (Nv, Cv) added to every image's
                    Nv patch rows (floatX)
  pos_emb_backward: dpos (NI, d) += the first NI rows of every sample of dx (B, Np, d), summed over
                    the samples in order (fp32, accumulated); the vision tower's call: the images'
                    patch rows, NI = Np = Nv
  gather_rows:      out (B * count, C) = rows first .. first+count-1 of every sample of x (B, T, C),
                    floatX and fp32 (gather_rows_f32: norm statistics, log-sums, key/value gradients)
  scatter_rows:     the inverse: those rows of out (B, T, C) = x (B * count, C), the others left
                    alone (floatX)

  version 1  (this program's) one thread per row, looping over the row's values: the lanes of a
             warp read and write C values apart, uncoalesced (add_periodic_kernel1,
             gather_rows_kernel1, scatter_rows_kernel1); the position gradient as one launch per
             sample, each adding its rows into dpos (pos_emb_backward_kernel1: B read-modify-writes
             of dpos)
  version 2  one thread per value, consecutive threads on consecutive values; the position gradient
             sums a value's samples in order in a register and adds once: the trainer's
             (vla/cuda/embedding.cuh: add_periodic_kernel, pos_emb_backward_kernel; vla/cuda/copy.cuh:
             gather_rows_kernel, gather_rows_f32_kernel, scatter_rows_kernel), launched as it does
             with LAUNCH_1D (BLOCK threads)

  nvcc -O3 -std=c++17 -arch=sm_90 embeddings.cu -o embeddings && ./embeddings
*/
#include "common.h"
#include "../../vla/cuda/embedding.cuh"
#include "../../vla/cuda/copy.cuh"

// Tolerances. Copies (gather_rows, scatter_rows): exact. One fp32 addition stored in floatX
// (add_periodic): 1e-5 in fp32 builds, 1e-2 in bf16 (8 significant bits: 2^-8 = 3.9e-3 relative at
// worst). Sums of fp32 values (the position gradient): 1e-5, their inputs being exact and the sums
// at most a few terms of fp32 rounding (2^-24 each).
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-5;
static const int BLOCKS[] = {32, 100, 256, 1024};  // a thread per row or per value: any block size, 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int N_VERSIONS = 2;

// ----------------------------------------------------------------------------
// version 1: a thread per row

// x (rows, Cv) += table (Nv, Cv) row r % Nv: one thread per patch row
__global__ void add_periodic_kernel1(floatX* x, const floatX* table, int rows, int Nv, int Cv) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) { return; }
    floatX* row = x + (size_t)r * Cv;
    const floatX* t = table + (size_t)(r % Nv) * Cv;
    for (int k = 0; k < Cv; k++) { row[k] = fx(f32(row[k]) + f32(t[k])); }
}

// dpos (n) += dx_b (n): one sample's first NI rows, one thread per value; launched once per sample
__global__ void pos_emb_backward_kernel1(float* dpos, const float* dx_b, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dpos[i] += dx_b[i]; }
}

// out (B * count, C) = rows first .. first+count-1 of every sample of x (B, T, C): one thread per row
template <typename V>
__global__ void gather_rows_kernel1(V* out, const V* x, int B, int T, int first, int count, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * count) { return; }
    const V* src = x + ((size_t)(row / count) * T + first + row % count) * C;
    for (int k = 0; k < C; k++) { out[(size_t)row * C + k] = src[k]; }
}

// rows first .. first+count-1 of every sample of out (B, T, C) = x (B * count, C): one thread per row
__global__ void scatter_rows_kernel1(floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B * count) { return; }
    floatX* dst = out + ((size_t)(row / count) * T + first + row % count) * C;
    for (int k = 0; k < C; k++) { dst[k] = x[(size_t)row * C + k]; }
}

// ----------------------------------------------------------------------------
// launchers: version v at `block` threads a block (version 2 at BLOCK is the trainer's launch)

// x (NV, Nv, Cv) += the table (Nv, Cv) in every image
static void add_periodic(int v, int block, floatX* x, const floatX* table, int NV, int Nv, int Cv) {
    size_t n = (size_t)NV * Nv * Cv, period = (size_t)Nv * Cv;
    if (v == 1) {
        add_periodic_kernel1<<<ceil_div((size_t)NV * Nv, block), block, 0, main_stream>>>(x, table, NV * Nv, Nv, Cv);
    } else {
        add_periodic_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(x, table, n, period);
    }
    launchCheck();
}

// dpos (NI, d) += the first NI rows of every sample of dx (B, Np, d)
static void pos_emb_backward(int v, int block, float* dpos, const float* dx, int B, int NI, int Np, int d) {
    size_t n = (size_t)NI * d;
    if (v == 1) {
        for (int b = 0; b < B; b++) {
            const float* dx_b = dx + (size_t)b * Np * d;
            pos_emb_backward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dpos, dx_b, n);
            launchCheck();
        }
        return;
    }
    pos_emb_backward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(dpos, dx, B, NI, Np, d);
    launchCheck();
}

static void gather_rows(int v, int block, floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t n = (size_t)B * count * C;
    if (v == 1) {
        gather_rows_kernel1<floatX><<<ceil_div((size_t)B * count, block), block, 0, main_stream>>>(out, x, B, T, first,
                                                                                                 count, C);
    } else {
        gather_rows_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, x, B, T, first, count, C);
    }
    launchCheck();
}

static void gather_rows_f32(int v, int block, float* out, const float* x, int B, int T, int first, int count, int C) {
    size_t n = (size_t)B * count * C;
    if (v == 1) {
        gather_rows_kernel1<float><<<ceil_div((size_t)B * count, block), block, 0, main_stream>>>(out, x, B, T, first,
                                                                                                count, C);
    } else {
        gather_rows_f32_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, x, B, T, first, count, C);
    }
    launchCheck();
}

static void scatter_rows(int v, int block, floatX* out, const floatX* x, int B, int T, int first, int count, int C) {
    size_t n = (size_t)B * count * C;
    if (v == 1) {
        scatter_rows_kernel1<<<ceil_div((size_t)B * count, block), block, 0, main_stream>>>(out, x, B, T, first, count,
                                                                                           C);
    } else {
        scatter_rows_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, x, B, T, first, count, C);
    }
    launchCheck();
}

// ----------------------------------------------------------------------------
// checks (the references are the definitions above, in double)

// the position table added to NV images of Nv patches of Cv; its gradient from dx (NV, Np, Cv),
// whose first Nv rows a sample are the patches' (Np = Nv in the vision tower)
static void check_position(int NV, int Nv, int Np, int Cv, uint64_t seed) {
    size_t n = (size_t)NV * Nv * Cv, period = (size_t)Nv * Cv, n_dx = (size_t)NV * Np * Cv;
    float* x = random_floats(n, 1.0f, seed);
    float* table = random_floats(period, 0.5f, seed + 1);
    float* dx = random_floats(n_dx, 1.0f, seed + 2);
    float* dpos0 = random_floats(period, 1.0f, seed + 3);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_pos = (double*)callocCheck(period, sizeof(double));
    for (size_t i = 0; i < n; i++) { ref[i] = (double)round_x(x[i]) + round_x(table[i % period]); }
    for (int b = 0; b < NV; b++) {
        for (size_t i = 0; i < period; i++) { ref_pos[i] += dx[(size_t)b * Np * Cv + i]; }
    }
    floatX* d_table = to_device_x(table, period);
    float* d_dx = to_device_f(dx, n_dx);
    floatX* d_x;
    cudaCheck(cudaMalloc(&d_x, n * sizeof(floatX)));
    floatX* x_in = (floatX*)mallocCheck(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) { x_in[i] = fx(x[i]); }
    char what[200];
    for (int v = 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            int block = BLOCKS[bi];
            cudaCheck(cudaMemcpy(d_x, x_in, n * sizeof(floatX), cudaMemcpyHostToDevice));  // x is added to in place
            add_periodic(v, block, d_x, d_table, NV, Nv, Cv);
            float* got = from_device_x(d_x, n);
            snprintf(what, sizeof(what), "v%d add_periodic (NV %d, Nv %d, Cv %d) block %d: x", v, NV, Nv, Cv, block);
            check_close(what, got, ref, n, TOL_X);
            free(got);
            float* d_pos = to_device_f(dpos0, period);
            pos_emb_backward(v, block, d_pos, d_dx, NV, Nv, Np, Cv);
            snprintf(what, sizeof(what), "v%d pos_emb_backward (B %d, NI %d of Np %d, d %d) block %d: dpos (+=)", v, NV,
                     Nv, Np, Cv, block);
            check_accumulated(what, d_pos, dpos0, ref_pos, period, TOL_F);
            cudaCheck(cudaFree(d_pos));
        }
    }
    free(x); free(table); free(dx); free(dpos0); free(ref); free(ref_pos); free(x_in);
    cudaCheck(cudaFree(d_table)); cudaCheck(cudaFree(d_dx)); cudaCheck(cudaFree(d_x));
}

// rows first..first+count-1 of every sample of (B, T, C): gathered (floatX and fp32) and scattered back
static void check_rows(int B, int T, int first, int count, int C, uint64_t seed) {
    size_t n_all = (size_t)B * T * C, n = (size_t)B * count * C;
    float* src = random_floats(n_all, 1.0f, seed);
    float* rows = random_floats(n, 1.0f, seed + 1);
    // floatX values: the copies are exact in either type
    for (size_t i = 0; i < n_all; i++) { src[i] = round_x(src[i]); }
    for (size_t i = 0; i < n; i++) { rows[i] = round_x(rows[i]); }
    float* want_gather = (float*)mallocCheck(n * sizeof(float));
    float* before = (float*)mallocCheck(n_all * sizeof(float));   // the scatter's target: NaN in its rows
    float* want_scatter = (float*)mallocCheck(n_all * sizeof(float));
    memcpy(before, src, n_all * sizeof(float));
    memcpy(want_scatter, src, n_all * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int r = 0; r < count; r++) {
            for (int c = 0; c < C; c++) {
                size_t in_rows = ((size_t)b * count + r) * C + c, in_all = ((size_t)b * T + first + r) * C + c;
                want_gather[in_rows] = src[in_all];
                want_scatter[in_all] = rows[in_rows];
                before[in_all] = NAN;
            }
        }
    }
    floatX* d_src = to_device_x(src, n_all);
    float* d_src_f = to_device_f(src, n_all);
    floatX* d_rows = to_device_x(rows, n);
    floatX* out;
    float* out_f;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out_f, n * sizeof(float)));
    char what[200], shape[120];
    snprintf(shape, sizeof(shape), "(B %d, T %d, C %d) rows %d..%d", B, T, C, first, first + count - 1);
    for (int v = 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            int block = BLOCKS[bi];
            poison(out, n * sizeof(floatX));
            poison(out_f, n * sizeof(float));
            gather_rows(v, block, out, d_src, B, T, first, count, C);
            gather_rows_f32(v, block, out_f, d_src_f, B, T, first, count, C);
            float* got = from_device_x(out, n);
            float* got_f = from_device_f(out_f, n);
            snprintf(what, sizeof(what), "v%d gather_rows %s block %d", v, shape, block);
            check_exact(what, got, want_gather, n);
            snprintf(what, sizeof(what), "v%d gather_rows_f32 %s block %d", v, shape, block);
            check_exact(what, got_f, want_gather, n);
            free(got); free(got_f);

            floatX* d_all = to_device_x(before, n_all);  // the other rows hold values that must stay
            scatter_rows(v, block, d_all, d_rows, B, T, first, count, C);
            float* got_all = from_device_x(d_all, n_all);
            snprintf(what, sizeof(what), "v%d scatter_rows %s block %d (the other rows kept)", v, shape, block);
            check_exact(what, got_all, want_scatter, n_all);
            free(got_all);
            cudaCheck(cudaFree(d_all));
        }
    }
    free(src); free(rows); free(want_gather); free(before); free(want_scatter);
    cudaCheck(cudaFree(d_src)); cudaCheck(cudaFree(d_src_f)); cudaCheck(cudaFree(d_rows));
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(out_f));
}

// ----------------------------------------------------------------------------
// benchmark

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(int v, const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v%d %-42s %8.4f ms, %7.1f GB/s\n", v, name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    // the smolvla preset, batch 32: 2 cameras of 512 px in 16 px patches (1024 patches of 768),
    // the state rows of the VLM's 177-token prefix at width 960; pi0's suffix at batch 8: the state
    // and 50 action tokens of its 1024-wide expert
    const int NV = 64, Nv = 1024, Cv = 768, B = 32, Np = 177, C = 960;
    const int B0 = 8, Ns = 51, H = 50, Ce = 1024;
    size_t n = (size_t)NV * Nv * Cv, period = (size_t)Nv * Cv, X = sizeof(floatX);
    float* h = random_floats(period, 1.0f, 7);
    floatX* table = to_device_x(h, period);
    floatX *x, *rows, *prefix, *suffix, *tokens;
    float *dx, *dpos;
    cudaCheck(cudaMalloc(&x, n * X));
    cudaCheck(cudaMalloc(&dx, n * sizeof(float)));
    cudaCheck(cudaMalloc(&dpos, period * sizeof(float)));
    cudaCheck(cudaMalloc(&prefix, (size_t)B * Np * C * X));
    cudaCheck(cudaMalloc(&rows, (size_t)B * C * X));
    cudaCheck(cudaMalloc(&suffix, (size_t)B0 * Ns * Ce * X));
    cudaCheck(cudaMalloc(&tokens, (size_t)B0 * H * Ce * X));
    cudaCheck(cudaMemset(x, 0, n * X));
    cudaCheck(cudaMemset(dx, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(dpos, 0, period * sizeof(float)));
    cudaCheck(cudaMemset(prefix, 0, (size_t)B * Np * C * X));
    cudaCheck(cudaMemset(suffix, 0, (size_t)B0 * Ns * Ce * X));
    cudaCheck(cudaMemset(tokens, 0, (size_t)B0 * H * Ce * X));
    char name[120];
    for (int v = 1; v <= N_VERSIONS; v++) {
        snprintf(name, sizeof(name), "add_periodic (%d x %d x %d)", NV, Nv, Cv);
        // x read and written, the table read once (its rows then come from the cache)
        bench(v, name, 2.0 * n * X + (double)period * X, [&]() { add_periodic(v, BLOCK, x, table, NV, Nv, Cv); });
        snprintf(name, sizeof(name), "pos_emb_backward (%d x %d x %d)", NV, Nv, Cv);
        // dx read once; dpos read and written once (version 2) or once a sample (version 1)
        double dpos_passes = v == 1 ? 2.0 * NV : 2.0;
        bench(v, name, (double)n * 4 + dpos_passes * period * 4,
              [&]() { pos_emb_backward(v, BLOCK, dpos, dx, NV, Nv, Nv, Cv); });
        snprintf(name, sizeof(name), "gather_rows (state rows, %d x %d of %d)", B, C, Np);
        bench(v, name, 2.0 * B * C * X, [&]() { gather_rows(v, BLOCK, rows, prefix, B, Np, Np - 1, 1, C); });
        snprintf(name, sizeof(name), "scatter_rows (pi0 actions, %d x %d x %d)", B0, H, Ce);
        bench(v, name, 2.0 * B0 * H * Ce * X, [&]() { scatter_rows(v, BLOCK, suffix, tokens, B0, Ns, 1, H, Ce); });
    }
    free(h);
    cudaCheck(cudaFree(table)); cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dpos));
    cudaCheck(cudaFree(prefix)); cudaCheck(cudaFree(rows)); cudaCheck(cudaFree(suffix)); cudaCheck(cudaFree(tokens));
}

int main(void) {
    dev_init("embeddings");
    // (NV, Nv, Np, Cv): value counts that fill no block exactly; one image; the tiny preset's 16
    // patches of 32; samples of more rows than the position table has (pos_emb_backward's NI < Np)
    struct { int NV, Nv, Np, Cv; } pos_shapes[] = {{1, 4, 4, 6}, {3, 16, 16, 32}, {5, 9, 9, 20}, {3, 7, 11, 13}};
    for (size_t i = 0; i < sizeof(pos_shapes) / sizeof(pos_shapes[0]); i++) {
        check_position(pos_shapes[i].NV, pos_shapes[i].Nv, pos_shapes[i].Np, pos_shapes[i].Cv, 100 + 10 * i);
    }
    // (B, T, first, count, C): a run of rows, one row (the state row, the prefix's last), the whole
    // sample, pi0's action rows after the state (rows 1..H of H + 1), more rows than a block of 32 holds
    struct { int B, T, first, count, C; } rows[] = {
        {2, 9, 3, 4, 5}, {3, 30, 29, 1, 48}, {2, 7, 0, 7, 12}, {2, 9, 1, 8, 16}, {5, 20, 2, 17, 3}};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        check_rows(rows[i].B, rows[i].T, rows[i].first, rows[i].count, rows[i].C, 200 + 10 * i);
    }
    return dev_finish(benchmark);
}
