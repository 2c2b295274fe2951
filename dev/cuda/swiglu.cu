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
#include "glu.h"

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
// checks (glu.h): the trainer's launcher, versions 1 and 2 at every block size;
// the gates through both tails of the sigmoid and the dip near -1.28 (range 8), and where e^-x
// overflows fp32 (x < -88.7) or the sigmoid rounds to 1: silu and silu' must stay finite there
static void swiglu_forward0(floatX* act, const floatX* gate, const floatX* up, size_t n, int) {
    swiglu_forward(act, gate, up, n);
}
static void swiglu_backward0(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                           size_t n, int) {
    swiglu_backward(dgate, dup, dact, gate, up, n);
}
static const Glu SWIGLU = {{swiglu_forward0, swiglu_forward1, swiglu_forward2},
                        {swiglu_backward0, swiglu_backward1, swiglu_backward2},
                        swiglu_forward_reference, swiglu_backward_reference, 8.0f, {-100.0f, 20.0f, -90.0f, 0.0f}};

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: the VLM's MLP over a 32-sample prefix of 177 tokens, and the
// action expert's over 32 chunks of 50 actions

static void benchmark(void) {
    glu_benchmark_shape(&SWIGLU, "vlm", 32 * 177, 2560);
    glu_benchmark_shape(&SWIGLU, "expert", 32 * 50, 2048);
}

int main(void) {
    dev_init("swiglu");
    check_silu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size
    // that is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions:
    // three rows of the VLM's MLP width and two of the expert's among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 3 * 2560, 2 * 2048};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { glu_check_size(&SWIGLU, sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
