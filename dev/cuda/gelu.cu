/*
gelu.cu: the activation of SigLIP's MLP (the vision tower's fc1 -> act -> fc2), forward and
backward, elementwise over the (V, Fv) output of fc1. SigLIP's hidden_act is gelu_pytorch_tanh,
the tanh approximation of GELU, not the erf form:
  forward:  gelu(x) = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
  backward: d = dy gelu'(x) (overwritten; d may be dy), with
            gelu'(x) = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 0.044715 x^2)

  version 1  one thread per element, scalar loads (gelu_forward_kernel1, gelu_backward_kernel1, here)
  version 2  x128::size elements per thread, 128-bit loads and stores (gelu_forward_kernel2,
             gelu_backward_kernel2 of vla/cuda/gelu.cuh; n a multiple of x128::size, 16-byte aligned
             pointers): the trainer's, launched by the header's gelu_forward / gelu_backward
  Both use the header's gelu_tanh and gelu_tanh_grad; the references are gelu_reference.h's.

  nvcc -O3 -std=c++17 -arch=sm_90 gelu.cu -o gelu && ./gelu
*/
#include "common.h"
#include "../../vla/cuda/gelu.cuh"
#include "gelu_reference.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (tanhf, the cube) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: version 2 is the header's; version 1 one thread per value

// out = gelu_tanh(inp)
__global__ void gelu_forward_kernel1(floatX* out, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = fx(gelu_tanh(f32(inp[i]))); }
}

// d = dy gelu'(x); d may be dy (in place)
__global__ void gelu_backward_kernel1(floatX* d, const floatX* dy, const floatX* inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { d[i] = fx(f32(dy[i]) * gelu_tanh_grad(f32(inp[i]))); }
}

// a launcher per version with its block size (version 0, the header's gelu_forward and
// gelu_backward, runs version 2 at BLOCK)

static void gelu_forward1(floatX* out, const floatX* inp, size_t n, int block) {
    gelu_forward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(out, inp, n);
    launchCheck();
}

static void gelu_forward2(floatX* out, const floatX* inp, size_t n, int block) {
    gelu_forward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(out, inp, n);
    launchCheck();
}

static void gelu_backward1(floatX* d, const floatX* dy, const floatX* inp, size_t n, int block) {
    gelu_backward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(d, dy, inp, n);
    launchCheck();
}

static void gelu_backward2(floatX* d, const floatX* dy, const floatX* inp, size_t n, int block) {
    gelu_backward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(d, dy, inp, n);
    launchCheck();
}

// ----------------------------------------------------------------------------
// references, in double (gelu_reference and gelu_grad_reference: gelu_reference.h)

static void gelu_forward_reference(double* out, const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) { out[i] = gelu_reference(x[i]); }
}

static void gelu_backward_reference(double* d, const float* dy, const float* x, size_t n) {
    for (size_t i = 0; i < n; i++) { d[i] = (double)dy[i] * gelu_grad_reference(x[i]); }
}

// the tanh form is not the erf form, but it stays within 1e-3 of it (4.7e-4 at worst,
// near |x| = 2.7): the reference is the function SigLIP names, not a different GELU
static void check_gelu_reference_near_erf(void) {
    double worst = 0.0;
    for (int i = 0; i <= 2000; i++) {
        double x = -10.0 + 20.0 * i / 2000;
        double err = fabs(gelu_reference(x) - 0.5 * x * (1.0 + erf(x / sqrt(2.0))));
        worst = err > worst ? err : worst;
    }
    char what[120];
    snprintf(what, sizeof(what), "reference gelu (tanh) within 1e-3 of x Phi(x) on [-10, 10] (worst %.1e)", worst);
    check_true(what, worst < 1e-3 && worst > 1e-4);
}

// ----------------------------------------------------------------------------
// checks

static void run_forward(int version, int block, floatX* out, const floatX* inp, size_t n) {
    if (version == 0) {
        gelu_forward(out, inp, n);
    } else if (version == 1) {
        gelu_forward1(out, inp, n, block);
    } else {
        gelu_forward2(out, inp, n, block);
    }
}

static void run_backward(int version, int block, floatX* d, const floatX* dy, const floatX* inp, size_t n) {
    if (version == 0) {
        gelu_backward(d, dy, inp, n);
    } else if (version == 1) {
        gelu_backward1(d, dy, inp, n, block);
    } else {
        gelu_backward2(d, dy, inp, n, block);
    }
}

static void check_size(size_t n, uint64_t seed) {
    float* x = random_floats(n, 6.0f, seed);  // both saturated tails and the dip near -0.75
    float* dy = random_floats(n, 1.0f, seed + 1);
    // where tanh saturates to +-1 in fp32 (gelu = x or 0, gelu' = 1 or 0) and the cube is large:
    // both must stay finite
    if (n >= 4) { x[0] = -100.0f; x[1] = 100.0f; x[2] = -12.0f; x[3] = 0.0f; }
    floatX* d_x = to_device_x(x, n);
    floatX* d_dy = to_device_x(dy, n);
    double* ref_out = (double*)mallocCheck(n * sizeof(double));
    double* ref_d = (double*)mallocCheck(n * sizeof(double));
    gelu_forward_reference(ref_out, x, n);
    gelu_backward_reference(ref_d, dy, x, n);
    floatX *out, *d;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    int v2 = n % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version != 1 && !v2) { continue; }  // the header's launcher runs version 2
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            char what[120], item[160];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher (n %zu)", n);
            } else {
                snprintf(what, sizeof(what), "v%d (n %zu) block %d", version, n, BLOCKS[bi]);
            }
            poison(out, n * sizeof(floatX));
            run_forward(version, BLOCKS[bi], out, d_x, n);
            float* got = from_device_x(out, n);
            snprintf(item, sizeof(item), "%s forward", what);
            check_close(item, got, ref_out, n, TOL_X);
            free(got);

            poison(d, n * sizeof(floatX));
            run_backward(version, BLOCKS[bi], d, d_dy, d_x, n);
            got = from_device_x(d, n);
            snprintf(item, sizeof(item), "%s backward", what);
            check_close(item, got, ref_d, n, TOL_X);
            free(got);

            // in place (d = dy), on a copy of dy
            cudaCheck(cudaMemcpy(d, d_dy, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
            run_backward(version, BLOCKS[bi], d, d, d_x, n);
            got = from_device_x(d, n);
            snprintf(item, sizeof(item), "%s backward in place", what);
            check_close(item, got, ref_d, n, TOL_X);
            free(got);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_dy));
    free(x); free(dy); free(ref_out); free(ref_d);
}

// ----------------------------------------------------------------------------
// benchmarks at the models' shapes: SigLIP's MLP over a 32-sample batch of 2 cameras, 1024 patches
// each, width 3072 (SmolVLA), and over 8 samples of 2 cameras, 256 patches each, width 4304 (pi0's
// so400m)

static void benchmark_shape(const char* name, int V, int Fv) {
    size_t n = (size_t)V * Fv;
    float* h = random_floats(n, 3.0f, 7);
    floatX* x = to_device_x(h, n);
    floatX* dy = to_device_x(h, n);
    floatX *out, *d;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_forward(version, block, out, x, n); }, 20);
            printf("bench v%d forward  %s (V %d, Fv %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, V, Fv, block,
                   ms, 2.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // x read, out written
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_backward(version, block, d, dy, x, n); }, 20);
            printf("bench v%d backward %s (V %d, Fv %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, V, Fv, block,
                   ms, 3.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // dy, x read; d written
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dy)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d));
    free(h);
}

static void benchmark(void) {
    benchmark_shape("smolvla", 32 * 2 * 1024, 3072);
    benchmark_shape("pi0", 8 * 2 * 256, 4304);
}

int main(void) {
    dev_init("gelu");
    check_gelu_grad_reference();
    check_gelu_reference_near_erf();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size
    // that is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions:
    // two rows of the vision MLP's width (3072) among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 2 * 3072, 16 * 1000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { check_size(sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
