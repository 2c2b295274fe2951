/*
geglu.cu: the GeGLU of the Gemma MLP (pi0's VLM and action expert layers), forward and backward,
elementwise over the (N, F) gate and up projections: down_proj(gelu(gate_proj(x)) * up_proj(x)) as
transformers' GemmaMLP computes it with hidden_act gelu_pytorch_tanh (the tanh form of GELU).
  forward:  act = gelu(gate) up, with gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  backward: dgate = dact up gelu'(gate), dup = dact gelu(gate) (both overwritten)
gelu and gelu' are train_vla.cu's gelu_tanh and gelu_tanh_grad (SigLIP's activation, gelu.cu), so
the two MLPs share one formula; the references are gelu_reference.h's.

  version 1  one thread per element, scalar loads (geglu_forward_kernel1, geglu_backward_kernel1)
  version 2  x128::size elements per thread, 128-bit loads and stores (geglu_forward_kernel2,
             geglu_backward_kernel2; n a multiple of x128::size, 16-byte aligned pointers): train_vla.cu's,
             launched at BLOCK by its geglu_forward / geglu_backward as SwiGLU's are (pi0's MLP widths,
             16384 and 4096, are whole packs); version 1 lives here.

  make -C dev/cuda geglu && dev/cuda/geglu
*/
#include "gelu_reference.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (tanhf, the cube, the products) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels (gelu_tanh and gelu_tanh_grad: train_vla.cu's, which common.h includes whole)

// act = gelu(gate) * up
__global__ void geglu_forward_kernel1(floatX* act, const floatX* gate, const floatX* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { act[i] = fx(gelu_tanh(f32(gate[i])) * f32(up[i])); }
}

// dgate, dup are overwritten
__global__ void geglu_backward_kernel1(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                                       const floatX* up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    float g = f32(gate[i]), da = f32(dact[i]);
    dgate[i] = fx(da * f32(up[i]) * gelu_tanh_grad(g));
    dup[i] = fx(da * gelu_tanh(g));
}

// ----------------------------------------------------------------------------
// launchers: one per version with its block size (the trainer's geglu_forward / geglu_backward run
// version 2 at BLOCK, with a one-line failure on a size or pointer it does not take)

static void geglu_forward1(floatX* act, const floatX* gate, const floatX* up, size_t n, int block) {
    geglu_forward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void geglu_forward2(floatX* act, const floatX* gate, const floatX* up, size_t n, int block) {
    geglu_forward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(act, gate, up, n);
    launchCheck();
}

static void geglu_backward1(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                            size_t n, int block) {
    geglu_backward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
}

static void geglu_backward2(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                            size_t n, int block) {
    geglu_backward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(dgate, dup, dact, gate, up, n);
    launchCheck();
}

// ----------------------------------------------------------------------------
// references, in double

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

// ----------------------------------------------------------------------------
// checks

static void run_forward(int version, int block, floatX* act, const floatX* gate, const floatX* up, size_t n) {
    if (version == 0) {
        geglu_forward(act, gate, up, n);
    } else if (version == 1) {
        geglu_forward1(act, gate, up, n, block);
    } else {
        geglu_forward2(act, gate, up, n, block);
    }
}

static void run_backward(int version, int block, floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate,
                         const floatX* up, size_t n) {
    if (version == 0) {
        geglu_backward(dgate, dup, dact, gate, up, n);
    } else if (version == 1) {
        geglu_backward1(dgate, dup, dact, gate, up, n, block);
    } else {
        geglu_backward2(dgate, dup, dact, gate, up, n, block);
    }
}

static void check_size(size_t n, uint64_t seed) {
    float* gate = random_floats(n, 6.0f, seed);  // both saturated tails of tanh and gelu's dip near -0.75
    float* up = random_floats(n, 2.0f, seed + 1);
    float* dact = random_floats(n, 1.0f, seed + 2);
    // where tanh saturates to +-1 in fp32 (gelu = x or 0, gelu' = 1 or 0) and the cube is large:
    // both must stay finite
    if (n >= 4) { gate[0] = -100.0f; gate[1] = 100.0f; gate[2] = -12.0f; gate[3] = 0.0f; }
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
        if (version != 1 && !v2) { continue; }  // the launcher runs version 2
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
// benchmark at the pi0 shapes: the VLM's MLP (16384 wide) over an 8-sample prefix of 560 tokens
// (2 cameras x 256 image tokens + 48 text), and the action expert's (4096 wide) over 8 suffixes of 51
// (the state and 50 actions)

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
    benchmark_shape("vlm", 8 * 560, 16384);
    benchmark_shape("expert", 8 * 51, 4096);
}

int main(void) {
    dev_init("geglu");
    check_gelu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size that
    // is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions: three
    // rows of the VLM's MLP width (16384) and two of the expert's (4096) among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 3 * 16384, 2 * 4096};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { check_size(sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
