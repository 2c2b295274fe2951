/*
fill.cu: the copies and casts of the fp32 buffers (vla/cuda/copy.cuh), and the velocity head's bias
rows (vla/cuda/flow_loss.cuh).

  fill:       p[0 .. n) = v (sampling's time t, the same for every sample, and the stop flag)
  scale:      x (n) *= *scale, the scalar read on the device (the summed gradients scaled to the
              mean's once the step's valid entries are counted)
  convert:    out (n) floatX = inp (n) fp32, rounded to nearest even (the weights' compute copies,
              the fp32-accumulated key/value gradients, sampling's x_t)
  bias_rows:  out (rows, n) fp32 = bias (n), floatX, in every row: the velocity head's bias, onto
              which its fp32 product is then added (matmul_forward_accumulate_f32, beta = 1): the
              velocity v = f_ln W^T + b is summed in fp32, as LeRobot computes action_out_proj
              after casting the expert's output to float32

  fill, scale, bias_rows: the header's fill_kernel, scale_kernel and bias_rows_kernel, one thread
             per value (the trainer launches them with LAUNCH_1D)
  convert, version 1  (this program's) one value per thread, scalar loads and stores
           version 2  x128::size values per thread, 128-bit loads and stores (the header's
                      convert_kernel2; n a multiple of x128::size, 16-byte aligned pointers), which
                      its launcher `convert` runs at BLOCK where the size and pointers allow (checked
                      there: elsewhere the header's own one-value kernel, version 1's, takes the call)
  (gather_rows and scatter_rows, copy.cuh's other kernels, are checked and timed in embeddings.cu.)

  nvcc -O3 -std=c++17 -arch=sm_90 fill.cu -o fill && ./fill
*/
#include "common.h"
#include "../../vla/cuda/copy.cuh"
#include "../../vla/cuda/flow_loss.cuh"

// Every kernel here is exact: fill and bias_rows copy values (a floatX widened to fp32 is exact),
// scale is one fp32 product (the host's float product has the same bits), convert is one rounding
// to nearest even (as the host's fx rounds). No tolerance: the bits are compared.
static const int BLOCKS[] = {32, 100, 256, 1024};  // one thread per value (or pack): any block size, 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// convert, version 1: one value per thread, scalar loads and stores

__global__ void convert_kernel1(floatX* out, const float* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fx(inp[i]); }
}

// version 1 or 2 at `block` threads; version 0: the launcher `convert` (BLOCK threads)
static void run_convert(int version, int block, floatX* out, const float* inp, size_t n) {
    if (version == 0) {
        convert(out, inp, n);
        return;
    }
    if (version == 1) {
        convert_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(out, inp, n);
    } else {
        convert_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(out, inp, n);
    }
    launchCheck();
}

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
        snprintf(what, sizeof(what), "fill (n %d, v %g) block %d", n, v, bl);
        check_exact(what, got, want, n);
        snprintf(what, sizeof(what), "fill (n %d, v %g) block %d: p[n] untouched", n, v, bl);
        check_true(what, isnan(got[n]));
        free(got);
    }
    cudaCheck(cudaFree(p));
    free(want);
}

static void check_scale(size_t n, float s, uint64_t seed) {
    float* x = random_floats(n + 1, 4.0f, seed);  // one more: the value past n keeps its own
    float* want = (float*)mallocCheck((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) { want[i] = x[i] * s; }
    want[n] = x[n];
    float* d_x = to_device_f(x, n + 1);
    float* d_s = to_device_f(&s, 1);
    char what[200];
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int bl = BLOCKS[bi];
        cudaCheck(cudaMemcpy(d_x, x, (n + 1) * sizeof(float), cudaMemcpyHostToDevice));
        scale_kernel<<<ceil_div(n, bl), bl, 0, main_stream>>>(d_x, n, d_s);
        launchCheck();
        float* got = from_device_f(d_x, n + 1);
        snprintf(what, sizeof(what), "scale (n %zu, by %g) block %d, and x[n] untouched", n, s, bl);
        check_exact(what, got, want, n + 1);
        free(got);
    }
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_s));
    free(x); free(want);
}

static void check_convert(size_t n, uint64_t seed) {
    float* h = random_floats(n + 1, 3.0f, seed);  // one more: an input 4 bytes off 16-byte alignment
    float* d = to_device_f(h, n + 1);
    float* want = (float*)mallocCheck(n * sizeof(float));
    floatX* out;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    for (int off = 0; off < 2; off++) {
        for (size_t i = 0; i < n; i++) { want[i] = round_x(h[off + i]); }
        for (int version = 1; version <= 3; version++) {
            // version 2 and its launcher (3 here) need whole packs and aligned pointers
            if (version >= 2 && !packable(n, x128::size, out, d + off)) { continue; }
            for (int bi = 0; bi < (version == 3 ? 1 : N_BLOCKS); bi++) {
                poison(out, n * sizeof(floatX));
                run_convert(version % 3, BLOCKS[bi], out, d + off, n);
                float* got = from_device_x(out, n);
                char what[200], name[40];
                if (version == 3) {
                    snprintf(name, sizeof(name), "v2 launcher");
                } else {
                    snprintf(name, sizeof(name), "v%d block %d", version, BLOCKS[bi]);
                }
                snprintf(what, sizeof(what), "convert %s (n %zu, input %s)", name, n, off ? "unaligned" : "aligned");
                check_exact(what, got, want, n);  // round to nearest even, as the host rounds
                free(got);
            }
        }
    }
    free(h); free(want);
    cudaCheck(cudaFree(d)); cudaCheck(cudaFree(out));
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
        snprintf(what, sizeof(what), "bias_rows (rows %d, n %d) block %d", rows, n, bl);
        check_exact(what, got, want, total);
        free(got);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d_bias));
    free(bias); free(want);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: batch 32, the 50 actions' velocities of 32 dims (fill and
// bias_rows: launches of a few KB, whose time is the launch's, as the bandwidth says); 64M values
// for scale and convert (a gradient shard, a weight conversion) and the VLM's key/value gradients
// of a layer (7040 prefix rows x 320) for convert

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench %-40s %8.4f ms, %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    const int B = 32, H = 50, A = 32, R = B * H;
    const size_t n_big = (size_t)64 << 20, n_kv = (size_t)7040 * 320;
    float *t, *v, *big, *s;
    floatX *bias, *out;
    cudaCheck(cudaMalloc(&t, B * sizeof(float)));
    cudaCheck(cudaMalloc(&v, (size_t)R * A * sizeof(float)));
    cudaCheck(cudaMalloc(&bias, A * sizeof(floatX)));
    cudaCheck(cudaMalloc(&big, n_big * sizeof(float)));
    cudaCheck(cudaMalloc(&out, n_big * sizeof(floatX)));
    cudaCheck(cudaMemset(bias, 0, A * sizeof(floatX)));
    cudaCheck(cudaMemset(big, 0, n_big * sizeof(float)));
    float one = 1.0f;
    s = to_device_f(&one, 1);
    bench("fill (t of 32 samples)", B * 4.0, [&]() { LAUNCH_1D(fill_kernel, B, t, 0.5f, B); });
    bench("bias_rows (1600 x 32)", (double)R * A * 4 + A * sizeof(floatX),
          [&]() { LAUNCH_1D(bias_rows_kernel, (size_t)R * A, v, bias, R, A); });
    bench("scale (64M)", 2.0 * n_big * sizeof(float), [&]() { LAUNCH_1D(scale_kernel, n_big, big, n_big, s); });
    size_t sizes[2] = {n_kv, n_big};
    for (int i = 0; i < 2; i++) {
        size_t n = sizes[i];
        for (int version = 1; version <= 2; version++) {
            for (int block = 128; block <= 1024; block *= 2) {
                char name[100];
                snprintf(name, sizeof(name), "v%d convert (n %zu) block %d", version, n, block);
                bench(name, (double)n * (sizeof(float) + sizeof(floatX)),
                      [&]() { run_convert(version, block, out, big, n); });
            }
        }
    }
    cudaCheck(cudaFree(t)); cudaCheck(cudaFree(v)); cudaCheck(cudaFree(bias)); cudaCheck(cudaFree(big));
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(s));
}

int main(void) {
    dev_init("fill");
    // one value (the stop flag: 1 and 0); sampling's t for 32 samples; a count that fills no block
    // exactly
    check_fill(1, 1.0f);
    check_fill(1, 0.0f);
    check_fill(32, 0.9f);
    check_fill(1001, -3.25f);
    // one value; a count that fills no block; by 0 (a step with no valid entry) and by a fraction
    check_scale(1, 0.5f, 50);
    check_scale(1001, 0.0f, 51);
    check_scale(4099, 1.0f / 3.0f, 52);
    // one value; one pack; whole packs; packs and a remainder (4104 = 513 packs of 8, 1026 of 4;
    // 4103 neither); each from an aligned and an unaligned input
    size_t conv_sizes[] = {1, 8, 1024, 4103, 4104};
    for (size_t i = 0; i < sizeof(conv_sizes) / sizeof(conv_sizes[0]); i++) { check_convert(conv_sizes[i], 40 + i); }
    // one value; the smolvla preset's velocity rows (32 x 50, 32 dims); a width that is no power of
    // two with more rows than a block
    struct { int rows, n; } shapes[] = {{1, 1}, {1600, 32}, {300, 7}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_bias_rows(shapes[i].rows, shapes[i].n, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
