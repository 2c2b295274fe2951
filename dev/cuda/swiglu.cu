/*
swiglu.cu: the SwiGLU of the Llama MLP (the VLM's and the action expert's layers), forward and
backward, elementwise over the (N, F) gate and up projections:
down_proj(silu(gate_proj(x)) * up_proj(x)) as transformers' LlamaMLP computes it.
  forward:  act = silu(gate) up, with silu(x) = x sigmoid(x) = x / (1 + e^-x)
  backward: dgate = dact up silu'(gate), dup = dact silu(gate) (both overwritten), with
            silu'(x) = s + x s (1 - s) = s (1 + x (1 - s)), s = sigmoid(x)

  version 1  one thread per element, scalar loads (swiglu_forward_kernel1, swiglu_backward_kernel1,
             here)
  version 2  x128::size elements per thread, 128-bit loads and stores (swiglu_forward_kernel2,
             swiglu_backward_kernel2; n a multiple of x128::size, 16-byte aligned pointers): the
             trainer's, from train_vla.cu, launched by its swiglu_forward / swiglu_backward

  make -C dev/cuda swiglu && dev/cuda/swiglu
*/
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (expf, the products) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: version 2 is train_vla.cu's (common.h includes it whole, silu and silu_grad too);
// version 1 one thread per value

// act = silu(gate) * up
__global__ void swiglu_forward_kernel1(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { act[i] = fx(silu(f32(gate[i])) * f32(up[i])); }
}

// dgate, dup are overwritten
__global__ void swiglu_backward_kernel1(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                                        const floatX* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float g = f32(gate[i]), da = f32(dact[i]);
    dgate[i] = fx(da * f32(up[i]) * silu_grad(g));
    dup[i] = fx(da * silu(g));
}

// a launcher per version with its block size (version 0, the trainer's swiglu_forward and
// swiglu_backward, runs version 2 at BLOCK)

static void swiglu_forward1(floatX* act, const floatX* gate, const floatX* up, size_t n, int block) {
    swiglu_forward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void swiglu_forward2(floatX* act, const floatX* gate, const floatX* up, size_t n, int block) {
    swiglu_forward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void swiglu_backward1(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                             size_t n, int block) {
    swiglu_backward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
}

static void swiglu_backward2(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                             size_t n, int block) {
    swiglu_backward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
}

// ----------------------------------------------------------------------------
// references, in double

static double sigmoid_reference(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu_reference(double x) { return x * sigmoid_reference(x); }

// d/dx of x s(x): s + x s', with s' = s (1 - s)
static double silu_grad_reference(double x) {
    double s = sigmoid_reference(x);
    return s + x * s * (1.0 - s);
}

static void swiglu_forward_reference(double* act, const float* gate, const float* up, size_t n) {
    for (size_t i = 0; i < n; i++) { act[i] = silu_reference(gate[i]) * up[i]; }
}

static void swiglu_backward_reference(double* dgate, double* dup, const float* dact, const float* gate,
                                      const float* up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dgate[i] = (double)dact[i] * up[i] * silu_grad_reference(gate[i]);
        dup[i] = (double)dact[i] * silu_reference(gate[i]);
    }
}

// the derivative above against central differences of silu_reference, so a slip in the
// derivative cannot hide in both the kernel and the reference
static void check_silu_grad_reference(void) {
    const int n = 101;
    float got[n];
    double ref[n];
    for (int i = 0; i < n; i++) {
        double x = -12.0 + 24.0 * i / (n - 1), h = 1e-5;
        got[i] = (float)silu_grad_reference(x);
        ref[i] = (silu_reference(x + h) - silu_reference(x - h)) / (2.0 * h);
    }
    // central differences err by h^2 f''' ~ 1e-10, the float of the result by 6e-8
    check_close("reference silu' against central differences on [-12, 12]", got, ref, n, 1e-6);
}

// ----------------------------------------------------------------------------
// checks

static void run_forward(int version, int block, floatX* act, const floatX* gate, const floatX* up, size_t n) {
    if (version == 0) {
        swiglu_forward(act, gate, up, n);
    } else if (version == 1) {
        swiglu_forward1(act, gate, up, n, block);
    } else {
        swiglu_forward2(act, gate, up, n, block);
    }
}

static void run_backward(int version, int block, floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                         const floatX* up, size_t n) {
    if (version == 0) {
        swiglu_backward(dgate, dup, dact, gate, up, n);
    } else if (version == 1) {
        swiglu_backward1(dgate, dup, dact, gate, up, n, block);
    } else {
        swiglu_backward2(dgate, dup, dact, gate, up, n, block);
    }
}

static void check_size(size_t n, uint64_t seed) {
    float* gate = random_floats(n, 8.0f, seed);  // through both tails of the sigmoid and the dip near -1.28
    float* up = random_floats(n, 2.0f, seed + 1);
    float* dact = random_floats(n, 1.0f, seed + 2);
    // gates where e^-x overflows fp32 (x < -88.7) or the sigmoid rounds to 1: silu and silu' must
    // stay finite
    if (n >= 4) { gate[0] = -100.0f; gate[1] = 20.0f; gate[2] = -90.0f; gate[3] = 0.0f; }
    floatX* d_gate = to_device_x(gate, n);
    floatX* d_up = to_device_x(up, n);
    floatX* d_dact = to_device_x(dact, n);
    double* ref_act = (double*)mallocCheck(n * sizeof(double));
    double* ref_dgate = (double*)mallocCheck(n * sizeof(double));
    double* ref_dup = (double*)mallocCheck(n * sizeof(double));
    swiglu_forward_reference(ref_act, gate, up, n);
    swiglu_backward_reference(ref_dgate, ref_dup, dact, gate, up, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
    int v2 = n % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version != 1 && !v2) { continue; }  // the trainer's launcher runs version 2
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            char what[120], item[160];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher (n %zu)", n);
            } else {
                snprintf(what, sizeof(what), "v%d (n %zu) block %d", version, n, BLOCKS[bi]);
            }
            poison(act, n * sizeof(floatX));
            run_forward(version, BLOCKS[bi], act, d_gate, d_up, n);
            float* got = from_device_x(act, n);
            snprintf(item, sizeof(item), "%s forward: act", what);
            check_close(item, got, ref_act, n, TOL_X);
            free(got);

            poison(dgate, n * sizeof(floatX));
            poison(dup, n * sizeof(floatX));
            run_backward(version, BLOCKS[bi], dgate, dup, d_dact, d_gate, d_up, n);
            float* got_dgate = from_device_x(dgate, n);
            float* got_dup = from_device_x(dup, n);
            snprintf(item, sizeof(item), "%s backward: dgate", what);
            check_close(item, got_dgate, ref_dgate, n, TOL_X);
            snprintf(item, sizeof(item), "%s backward: dup", what);
            check_close(item, got_dup, ref_dup, n, TOL_X);
            free(got_dgate); free(got_dup);
        }
    }
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    cudaCheck(cudaFree(d_gate)); cudaCheck(cudaFree(d_up)); cudaCheck(cudaFree(d_dact));
    free(gate); free(up); free(dact); free(ref_act); free(ref_dgate); free(ref_dup);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: the VLM's MLP over a 32-sample prefix of 177 tokens, and the
// action expert's over 32 chunks of 50 actions

static void benchmark_shape(const char* name, int N, int F) {
    size_t n = (size_t)N * F;
    float* h = random_floats(n, 3.0f, 7);
    floatX* gate = to_device_x(h, n);
    floatX* up = to_device_x(h, n);
    floatX* dact = to_device_x(h, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_forward(version, block, act, gate, up, n); }, 20);
            printf("bench v%d forward  %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block, ms,
                   3.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // gate, up read; act written
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_backward(version, block, dgate, dup, dact, gate, up, n); }, 20);
            printf("bench v%d backward %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block, ms,
                   5.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // dact, gate, up read; dgate, dup written
        }
    }
    cudaCheck(cudaFree(gate)); cudaCheck(cudaFree(up)); cudaCheck(cudaFree(dact));
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    free(h);
}

static void benchmark(void) {
    benchmark_shape("vlm", 32 * 177, 2560);
    benchmark_shape("expert", 32 * 50, 2048);
}

int main(void) {
    dev_init("swiglu");
    check_silu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size
    // that is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions:
    // three rows of the VLM's MLP width and two of the expert's among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 3 * 2560, 2 * 2048};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { check_size(sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
