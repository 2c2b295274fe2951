/*
glu.cu: the gated activations of the MLPs (act = a(gate) up), forward and backward, elementwise over
the (N, F) gate and up projections: down_proj(a(gate_proj(x)) * up_proj(x)).
  SwiGLU (SmolVLA's VLM and expert, transformers' LlamaMLP): a = silu, silu(x) = x sigmoid(x);
    dgate = dact up silu'(gate), dup = dact silu(gate), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
  GeGLU (pi0's, transformers' GemmaMLP with gelu_pytorch_tanh): a = gelu, the tanh form;
    gelu and gelu' are vla/cuda/gelu.cuh's gelu_tanh and gelu_tanh_grad (SigLIP's activation,
    gelu.cu), the references gelu_reference.h's

  version 1  one thread per element, scalar loads (swiglu_/geglu_forward_kernel1, _backward_kernel1,
             here)
  version 2  x128::size elements per thread, 128-bit loads and stores (swiglu_/geglu_forward_kernel2,
             _backward_kernel2 of vla/cuda/glu.cuh; n a multiple of x128::size, 16-byte aligned
             pointers): the trainer's, launched by the header's glu_forward and
             _backward
  (The header's silu_forward_kernel and silu_backward_kernel, SiLU alone for the action-time MLP,
  are checked and timed by time_mlp.cu.)
Each activation: every version checked against its double reference on fresh random inputs
(outputs poisoned first) at every block size, and timed at its model's shapes (SmolVLA's: a
32-sample prefix of 177 tokens through the VLM's 2560, 32 chunks of 50 through the expert's 2048;
pi0's: 8 x 560 rows through 16384 (2 cameras x 256 image tokens + 48 text), 8 x 51 through 4096).

  nvcc -O3 -std=c++17 -arch=sm_90 glu.cu -o glu && ./glu
*/
#include "common.h"
#include "../../vla/cuda/glu.cuh"
#include "gelu_reference.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (the activation, the products) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

typedef void (*GluForward)(floatX* act, const floatX* gate, const floatX* up, size_t n, int block);
typedef void (*GluBackward)(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                            size_t n, int block);
typedef struct {
    GluForward forward[3];    // versions 0 (the header's launcher: block unused), 1, 2
    GluBackward backward[3];
    void (*forward_reference)(double* act, const float* gate, const float* up, size_t n);
    void (*backward_reference)(double* dgate, double* dup, const float* dact, const float* gate, const float* up,
                               size_t n);
    float gate_range;  // gates drawn in [-range, range]
    float edges[4];    // the first four gates: where the activation's arithmetic saturates or overflows
} Glu;

// Every version that takes n (version 2 and the launcher: whole 16-byte packs) at every block size
static void glu_check_size(const Glu* g, size_t n, uint64_t seed) {
    float* gate = random_floats(n, g->gate_range, seed);
    float* up = random_floats(n, 2.0f, seed + 1);
    float* dact = random_floats(n, 1.0f, seed + 2);
    for (size_t k = 0; k < 4 && n >= 4; k++) { gate[k] = g->edges[k]; }  // both must stay finite there
    floatX* d_gate = to_device_x(gate, n);
    floatX* d_up = to_device_x(up, n);
    floatX* d_dact = to_device_x(dact, n);
    double* ref_act = (double*)mallocCheck(n * sizeof(double));
    double* ref_dgate = (double*)mallocCheck(n * sizeof(double));
    double* ref_dup = (double*)mallocCheck(n * sizeof(double));
    g->forward_reference(ref_act, gate, up, n);
    g->backward_reference(ref_dgate, ref_dup, dact, gate, up, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
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
            poison(act, n * sizeof(floatX));
            g->forward[version](act, d_gate, d_up, n, BLOCKS[bi]);
            float* got = from_device_x(act, n);
            snprintf(item, sizeof(item), "%s forward: act", what);
            check_close(item, got, ref_act, n, TOL_X);
            free(got);

            poison(dgate, n * sizeof(floatX));
            poison(dup, n * sizeof(floatX));
            g->backward[version](dgate, dup, d_dact, d_gate, d_up, n, BLOCKS[bi]);
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

// Versions 1 and 2 at every block size on (N, F): time and achieved bandwidth
static void glu_benchmark_shape(const Glu* g, const char* name, int N, int F) {
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
            double ms = time_ms([&]() { g->forward[version](act, gate, up, n, block); }, 20);
            printf("bench v%d forward  %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block,
                   ms, 3.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // gate, up read; act written
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { g->backward[version](dgate, dup, dact, gate, up, n, block); }, 20);
            printf("bench v%d backward %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block,
                   ms, 5.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // dact, gate, up read; dgate, dup written
        }
    }
    cudaCheck(cudaFree(gate)); cudaCheck(cudaFree(up)); cudaCheck(cudaFree(dact));
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    free(h);
}

// ============================================================================
// SwiGLU

// kernels: version 2 is the header's (silu and silu_grad too); version 1 one thread per value

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

// a launcher per version with its block size (version 0, the header's glu_forward and
// glu_backward, runs version 2 at BLOCK)

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
// checks: the header's launcher, versions 1 and 2 at every block size;
// the gates through both tails of the sigmoid and the dip near -1.28 (range 8), and where e^-x
// overflows fp32 (x < -88.7) or the sigmoid rounds to 1: silu and silu' must stay finite there
static void swiglu_forward0(floatX* act, const floatX* gate, const floatX* up, size_t n, int) {
    glu_forward(act, gate, up, n, false);
}
static void swiglu_backward0(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                             size_t n, int) {
    glu_backward(dgate, dup, dact, gate, up, n, false);
}
static const Glu SWIGLU = {{swiglu_forward0, swiglu_forward1, swiglu_forward2},
                           {swiglu_backward0, swiglu_backward1, swiglu_backward2},
                           swiglu_forward_reference, swiglu_backward_reference, 8.0f, {-100.0f, 20.0f, -90.0f, 0.0f}};

// ============================================================================
// GeGLU

// kernels (gelu_tanh and gelu_tanh_grad: vla/cuda/gelu.cuh's, which glu.cuh includes)

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
// launchers: one per version with its block size (the header's glu_forward / glu_backward run
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
// checks: the header's launcher, versions 1 and 2 at every block size;
// the gates through both saturated tails of tanh and gelu's dip near -0.75 (range 6), and where tanh
// saturates to +-1 in fp32 (gelu = x or 0, gelu' = 1 or 0) and the cube is large: both finite there
static void geglu_forward0(floatX* act, const floatX* gate, const floatX* up, size_t n, int) {
    glu_forward(act, gate, up, n, true);
}
static void geglu_backward0(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                            size_t n, int) {
    glu_backward(dgate, dup, dact, gate, up, n, true);
}
static const Glu GEGLU = {{geglu_forward0, geglu_forward1, geglu_forward2},
                          {geglu_backward0, geglu_backward1, geglu_backward2},
                          geglu_forward_reference, geglu_backward_reference, 6.0f, {-100.0f, 100.0f, -12.0f, 0.0f}};

// ----------------------------------------------------------------------------
// benchmarks at the models' shapes

static void benchmark(void) {
    glu_benchmark_shape(&SWIGLU, "swiglu vlm", 32 * 177, 2560);
    glu_benchmark_shape(&SWIGLU, "swiglu expert", 32 * 50, 2048);
    glu_benchmark_shape(&GEGLU, "geglu pi0 vlm", 8 * 560, 16384);
    glu_benchmark_shape(&GEGLU, "geglu pi0 expert", 8 * 51, 4096);
}

int main(void) {
    dev_init("glu");
    check_silu_grad_reference();
    check_gelu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size that
    // is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions: rows
    // of each model's MLP widths among them
    size_t swiglu_sizes[] = {1, 37, 1000, 2052, 4099, 3 * 2560, 2 * 2048};
    size_t geglu_sizes[] = {1, 37, 1000, 2052, 4099, 3 * 16384, 2 * 4096};
    for (size_t i = 0; i < sizeof(swiglu_sizes) / sizeof(swiglu_sizes[0]); i++) {
        glu_check_size(&SWIGLU, swiglu_sizes[i], 100 + 10 * i);
        glu_check_size(&GEGLU, geglu_sizes[i], 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
