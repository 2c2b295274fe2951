/*
embeddings.cu: the vision tower's position embedding, forward and backward, and the row copies
between activations (SmolVLA's expert-mode backward gathers the state rows of the VLM's layers).

  add_periodic:     x (n) += table[i % period]: the position table (Nv, Cv) added to every image's
                    Nv patch rows (floatX)
  pos_emb_backward: dpos (Nv, Cv) += the rows of dx (NV, Nv, Cv) summed over the images in order
                    (fp32, accumulated)
  gather_rows:      out (B * count, C) = rows first .. first+count-1 of every sample of x (B, T, C),
                    floatX and fp32 (gather_rows_f32: norm statistics, log-sums, key/value gradients)

  version 1  one thread per value (train_vla.cu: add_periodic_kernel, pos_emb_backward_kernel,
             gather_rows_kernel, gather_rows_f32_kernel)

  make -C dev/cuda embeddings && dev/cuda/embeddings
*/
#include "common.h"

// Tolerances. Copies (gather_rows): exact, 0. One fp32 addition stored in floatX (add_periodic):
// 1e-5 in fp32 builds, 1e-2 in bf16 (8 significant bits: 2^-8 = 3.9e-3 relative at worst). Sums
// of fp32 values in order (the position gradient): 1e-5, their inputs being exact.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const int BLOCKS[4] = {32, 100, 256, 1024};  // one thread per value: any block size, 100 included

static void check_position(int NV, int Nv, int Cv, uint64_t seed) {
    size_t n = (size_t)NV * Nv * Cv, period = (size_t)Nv * Cv;
    float* x = random_floats(n, 1.0f, seed);
    float* table = random_floats(period, 0.5f, seed + 1);
    float* dx = random_floats(n, 1.0f, seed + 2);
    float* dpos0 = random_floats(period, 1.0f, seed + 3);
    double* ref = (double*)callocCheck(n, sizeof(double));
    double* ref_pos = (double*)callocCheck(period, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        ref[i] = (double)round_x(x[i]) + round_x(table[i % period]);
        ref_pos[i % period] += dx[i];
    }
    floatX* d_table = to_device_x(table, period);
    float* d_dx = to_device_f(dx, n);
    char what[200];
    for (int bi = 0; bi < 4; bi++) {
        int block = BLOCKS[bi];
        floatX* d_x = to_device_x(x, n);
        add_periodic_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(d_x, d_table, n, period);
        launchCheck();
        float* got = from_device_x(d_x, n);
        snprintf(what, sizeof(what), "v1 add_periodic (NV %d, Nv %d, Cv %d) block %d: x", NV, Nv, Cv, block);
        check_close(what, got, ref, n, TOL_X);
        free(got);
        cudaCheck(cudaFree(d_x));
        float* d_pos = to_device_f(dpos0, period);
        pos_emb_backward_kernel<<<ceil_div(period, block), block, 0, main_stream>>>(d_pos, d_dx, NV, Nv, Nv, Cv);
        launchCheck();
        snprintf(what, sizeof(what), "v1 pos_emb_backward (NV %d, Nv %d, Cv %d) block %d: dpos (+=)", NV, Nv, Cv, block);
        check_accumulated(what, d_pos, dpos0, ref_pos, period, 1e-5);
        cudaCheck(cudaFree(d_pos));
    }
    free(x); free(table); free(dx); free(dpos0); free(ref); free(ref_pos);
    cudaCheck(cudaFree(d_table)); cudaCheck(cudaFree(d_dx));
}

// rows first..first+count-1 of every sample of src (B, T, C), floatX and fp32
static void check_gather(int B, int T, int first, int count, int C, uint64_t seed) {
    size_t n_src = (size_t)B * T * C, n = (size_t)B * count * C;
    float* src = random_floats(n_src, 1.0f, seed);
    for (size_t i = 0; i < n_src; i++) { src[i] = round_x(src[i]); }  // floatX values: the copy is exact either way
    double* ref = (double*)mallocCheck(n * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int r = 0; r < count; r++) {
            for (int c = 0; c < C; c++) { ref[((size_t)b * count + r) * C + c] = src[((size_t)b * T + first + r) * C + c]; }
        }
    }
    floatX* d_src = to_device_x(src, n_src);
    float* d_src_f = to_device_f(src, n_src);
    floatX* out;
    float* out_f;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out_f, n * sizeof(float)));
    char what[200];
    for (int bi = 0; bi < 4; bi++) {
        int block = BLOCKS[bi];
        poison(out, n * sizeof(floatX));
        poison(out_f, n * sizeof(float));
        gather_rows_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, d_src, B, T, first, count, C);
        launchCheck();
        gather_rows_f32_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out_f, d_src_f, B, T, first, count, C);
        launchCheck();
        float* got = from_device_x(out, n);
        float* got_f = from_device_f(out_f, n);
        snprintf(what, sizeof(what), "v1 gather_rows (B %d, T %d, C %d) rows %d..%d block %d", B, T, C, first,
                 first + count - 1, block);
        check_close(what, got, ref, n, 0.0);
        snprintf(what, sizeof(what), "v1 gather_rows_f32 (B %d, T %d, C %d) rows %d..%d block %d", B, T, C, first,
                 first + count - 1, block);
        check_close(what, got_f, ref, n, 0.0);
        free(got); free(got_f);
    }
    free(src); free(ref);
    cudaCheck(cudaFree(d_src)); cudaCheck(cudaFree(d_src_f)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(out_f));
}

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v1 %-22s %8.4f ms, %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    // the smolvla preset, batch 32: 2 cameras of 512 px in 16 px patches (1024 patches of 768),
    // the state rows of the VLM's 177-token prefix at width 960
    const int NV = 64, Nv = 1024, Cv = 768, B = 32, Np = 177, C = 960;
    size_t n = (size_t)NV * Nv * Cv, period = (size_t)Nv * Cv, X = sizeof(floatX);
    float* h = random_floats(period, 1.0f, 7);
    floatX* table = to_device_x(h, period);
    floatX *x, *rows, *prefix;
    float *dx, *dpos;
    cudaCheck(cudaMalloc(&x, n * X));
    cudaCheck(cudaMalloc(&dx, n * sizeof(float)));
    cudaCheck(cudaMalloc(&dpos, period * sizeof(float)));
    cudaCheck(cudaMalloc(&prefix, (size_t)B * Np * C * X));
    cudaCheck(cudaMalloc(&rows, (size_t)B * C * X));
    cudaCheck(cudaMemset(x, 0, n * X));
    cudaCheck(cudaMemset(dx, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(dpos, 0, period * sizeof(float)));
    cudaCheck(cudaMemset(prefix, 0, (size_t)B * Np * C * X));
    const int bl = BLOCK;
    bench("add_periodic", 2.0 * n * X, [&]() { LAUNCH_1D(add_periodic_kernel, n, x, table, n, period); });
    bench("pos_emb_backward", (double)n * 4 + 2.0 * period * 4, [&]() {
        pos_emb_backward_kernel<<<ceil_div(period, bl), bl, 0, main_stream>>>(dpos, dx, NV, Nv, Nv, Cv);
        launchCheck();
    });
    bench("gather_rows (state)", 2.0 * B * C * X, [&]() {
        LAUNCH_1D(gather_rows_kernel, (size_t)B * C, rows, prefix, B, Np, Np - 1, 1, C);
    });
    free(h);
    cudaCheck(cudaFree(table)); cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dpos));
    cudaCheck(cudaFree(prefix)); cudaCheck(cudaFree(rows));
}

int main(void) {
    dev_init("embeddings");
    // value counts that fill no block exactly; one image; the tiny preset's 16 patches of 32
    struct { int NV, Nv, Cv; } pos_shapes[] = {{1, 4, 6}, {3, 16, 32}, {5, 9, 20}};
    for (size_t i = 0; i < sizeof(pos_shapes) / sizeof(pos_shapes[0]); i++) {
        check_position(pos_shapes[i].NV, pos_shapes[i].Nv, pos_shapes[i].Cv, 100 + 10 * i);
    }
    // a run of rows, one row (the state row, the prefix's last), the whole sample
    struct { int B, T, first, count, C; } rows[] = {{2, 9, 3, 4, 5}, {3, 30, 29, 1, 48}, {2, 7, 0, 7, 12}};
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        check_gather(rows[i].B, rows[i].T, rows[i].first, rows[i].count, rows[i].C, 200 + 10 * i);
    }
    return dev_finish(benchmark);
}
