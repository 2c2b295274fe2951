/*
fill.cu: the two fills of the trainer, fp32 buffers set from a value or a vector.

  fill:       p[0 .. n) = v (sampling's time t, the same for every sample, and the stop flag)
  bias_rows:  out (rows, n) fp32 = bias (n), floatX, in every row: the velocity head's bias, onto
              which its fp32 product is then added (matmul_forward_accumulate_f32, beta = 1): the
              velocity v = f_ln W^T + b is summed in fp32, as LeRobot computes action_out_proj
              after casting the expert's output to float32

  version 1  one thread per value (fill_kernel, bias_rows_kernel)

  make -C dev/cuda fill && dev/cuda/fill
*/
#include "common.h"

// Both copy values (a floatX widened to fp32 is exact): exact, no tolerance.
static const int BLOCKS[] = {32, 100, 256, 1024};  // one thread per value: any block size, 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: train_vla.cu's fill_kernel and bias_rows_kernel (common.h includes it whole); the
// trainer launches both with LAUNCH_1D

// ----------------------------------------------------------------------------
// checks (the references are the definitions above, written out in the loops)

static void check_fill(int n, float v) {
    float* want = (float*)mallocCheck(n * sizeof(float));
    for (int i = 0; i < n; i++) { want[i] = v; }
    float* p;
    cudaCheck(cudaMalloc(&p, (n + 1) * sizeof(float)));  // one more: the value past n stays as it was
    char what[200];
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int bl = BLOCKS[bi];
        poison(p, (n + 1) * sizeof(float));
        fill_kernel<<<ceil_div(n, bl), bl, 0, main_stream>>>(p, v, n);
        launchCheck();
        float* got = from_device_f(p, n + 1);
        snprintf(what, sizeof(what), "v1 fill (n %d, v %g) block %d", n, v, bl);
        check_exact(what, got, want, n);
        snprintf(what, sizeof(what), "v1 fill (n %d, v %g) block %d: p[n] untouched", n, v, bl);
        check_true(what, isnan(got[n]));
        free(got);
    }
    cudaCheck(cudaFree(p));
    free(want);
}

static void check_bias_rows(int rows, int n, uint64_t seed) {
    size_t total = (size_t)rows * n;
    float* bias = random_floats(n, 1.0f, seed);
    floatX* d_bias = to_device_x(bias, n);  // rounds bias to what floatX holds: the copy is exact
    float* want = (float*)mallocCheck(total * sizeof(float));
    for (int r = 0; r < rows; r++) {
        for (int k = 0; k < n; k++) { want[(size_t)r * n + k] = bias[k]; }
    }
    float* out;
    cudaCheck(cudaMalloc(&out, total * sizeof(float)));
    char what[200];
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int bl = BLOCKS[bi];
        poison(out, total * sizeof(float));
        bias_rows_kernel<<<ceil_div(total, bl), bl, 0, main_stream>>>(out, d_bias, rows, n);
        launchCheck();
        float* got = from_device_f(out, total);
        snprintf(what, sizeof(what), "v1 bias_rows (rows %d, n %d) block %d", rows, n, bl);
        check_exact(what, got, want, total);
        free(got);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d_bias));
    free(bias); free(want);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: batch 32, the 50 actions' velocities of 32 dims. Both are
// launches of a few KB: the time is the launch's, the bandwidth says so.

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v1 %-26s %8.4f ms, %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    const int B = 32, H = 50, A = 32, R = B * H;
    float *t, *v;
    floatX* bias;
    cudaCheck(cudaMalloc(&t, B * sizeof(float)));
    cudaCheck(cudaMalloc(&v, (size_t)R * A * sizeof(float)));
    cudaCheck(cudaMalloc(&bias, A * sizeof(floatX)));
    cudaCheck(cudaMemset(bias, 0, A * sizeof(floatX)));
    bench("fill (t of 32 samples)", B * 4.0, [&]() { LAUNCH_1D(fill_kernel, B, t, 0.5f, B); });
    bench("bias_rows (1600 x 32)", (double)R * A * 4 + A * sizeof(floatX),
          [&]() { LAUNCH_1D(bias_rows_kernel, (size_t)R * A, v, bias, R, A); });
    cudaCheck(cudaFree(t)); cudaCheck(cudaFree(v)); cudaCheck(cudaFree(bias));
}

int main(void) {
    dev_init("fill");
    // one value (the stop flag: 1 and 0); sampling's t for 32 samples; a count that fills no block
    // exactly
    check_fill(1, 1.0f);
    check_fill(1, 0.0f);
    check_fill(32, 0.9f);
    check_fill(1001, -3.25f);
    // one value; the smolvla preset's velocity rows (32 x 50, 32 dims); a width that is no power of
    // two with more rows than a block
    struct { int rows, n; } shapes[] = {{1, 1}, {1600, 32}, {300, 7}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_bias_rows(shapes[i].rows, shapes[i].n, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
