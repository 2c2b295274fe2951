/*
geglu.cu: the GeGLU of the MLP, forward and backward, elementwise over the (N, F) gate and up
projections.
  forward:  act = gelu(gate) up, with gelu the tanh approximation
            gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  backward: dgate = dact up gelu'(gate), dup = dact gelu(gate) (both overwritten)

  version 1  one thread per element, scalar loads (geglu_forward_kernel, geglu_backward_kernel)
  version 2  x128::size elements per thread, 128-bit loads and stores (geglu_forward_kernel2,
             geglu_backward_kernel2; n a multiple of x128::size)

  make -C dev/cuda geglu && dev/cuda/geglu
*/
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (tanhf, the products) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// references, in double

static const double GELU_K = 0.7978845608028654;  // sqrt(2/pi)

static double gelu_reference(double x) { return 0.5 * x * (1.0 + tanh(GELU_K * (x + 0.044715 * x * x * x))); }

// d/dx of the above: the product rule over x/2 and (1 + tanh(u)), with du/dx = k (1 + 3 0.044715 x^2)
static double gelu_grad_reference(double x) {
    double th = tanh(GELU_K * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x);
}

static void geglu_forward_reference(double* act, const float* gate, const float* up, size_t n) {
    for (size_t i = 0; i < n; i++) { act[i] = gelu_reference(gate[i]) * up[i]; }
}

static void geglu_backward_reference(double* dgate, double* dup, const float* dact, const float* gate, const float* up,
                                     size_t n) {
    for (size_t i = 0; i < n; i++) {
        dgate[i] = (double)dact[i] * up[i] * gelu_grad_reference(gate[i]);
        dup[i] = (double)dact[i] * gelu_reference(gate[i]);
    }
}

// the derivative above against central differences of gelu_reference, so a slip in the
// derivative cannot hide in both the kernel and the reference
static void check_gelu_grad_reference(void) {
    const int n = 101;
    float got[n];
    double ref[n];
    for (int i = 0; i < n; i++) {
        double x = -6.0 + 12.0 * i / (n - 1), h = 1e-5;
        got[i] = (float)gelu_grad_reference(x);
        ref[i] = (gelu_reference(x + h) - gelu_reference(x - h)) / (2.0 * h);
    }
    // central differences err by h^2 f''' ~ 1e-10, the float of the result by 6e-8
    check_close("reference gelu' against central differences on [-6, 6]", got, ref, n, 1e-6);
}

// ----------------------------------------------------------------------------
// the versions, launched directly (version 0: the launcher train_vla.cu calls)

static void run_forward(int version, int block, floatX* act, const floatX* gate, const floatX* up, size_t n) {
    if (version == 0) {
        geglu_forward(act, gate, up, n);
    } else if (version == 1) {
        geglu_forward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(act, gate, up, n);
        launchCheck();
    } else {
        geglu_forward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(act, gate, up, n);
        launchCheck();
    }
}

static void run_backward(int version, int block, floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                         const floatX* up, size_t n) {
    if (version == 0) {
        geglu_backward(dgate, dup, dact, gate, up, n);
    } else if (version == 1) {
        geglu_backward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
        launchCheck();
    } else {
        geglu_backward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
        launchCheck();
    }
}

// ----------------------------------------------------------------------------
// checks

static void check_size(size_t n, uint64_t seed) {
    float* gate = random_floats(n, 5.0f, seed);  // through both tails of tanh and the bend near 0
    float* up = random_floats(n, 2.0f, seed + 1);
    float* dact = random_floats(n, 1.0f, seed + 2);
    floatX* d_gate = to_device_x(gate, n);
    floatX* d_up = to_device_x(up, n);
    floatX* d_dact = to_device_x(dact, n);
    double* ref_act = (double*)mallocCheck(n * sizeof(double));
    double* ref_dgate = (double*)mallocCheck(n * sizeof(double));
    double* ref_dup = (double*)mallocCheck(n * sizeof(double));
    geglu_forward_reference(ref_act, gate, up, n);
    geglu_backward_reference(ref_dgate, ref_dup, dact, gate, up, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
    int v2 = n % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version == 2 && !v2) { continue; }
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
// benchmark at the base preset: the prefix rows of a 16-sample batch at the VLM's MLP width

static void benchmark(void) {
    const int N = 16 * 440, F = 2560;
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
            printf("bench v%d forward  (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, F, block, ms,
                   3.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // gate, up read; act written
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_backward(version, block, dgate, dup, dact, gate, up, n); }, 20);
            printf("bench v%d backward (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, F, block, ms,
                   5.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // dact, gate, up read; dgate, dup written
        }
    }
    cudaCheck(cudaFree(gate)); cudaCheck(cudaFree(up)); cudaCheck(cudaFree(dact));
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    free(h);
}

int main(void) {
    dev_init("geglu");
    check_gelu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size
    // that is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions,
    // three rows of the VLM's MLP width among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 3 * 2560};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { check_size(sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
