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
#include "glu.h"
#include "gelu_reference.h"

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
// checks (glu.h): the trainer's launcher, versions 1 and 2 at every block size;
// the gates through both saturated tails of tanh and gelu's dip near -0.75 (range 6), and where tanh
// saturates to +-1 in fp32 (gelu = x or 0, gelu' = 1 or 0) and the cube is large: both finite there
static void geglu_forward0(floatX* act, const floatX* gate, const floatX* up, size_t n, int) {
    geglu_forward(act, gate, up, n);
}
static void geglu_backward0(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                           size_t n, int) {
    geglu_backward(dgate, dup, dact, gate, up, n);
}
static const Glu GEGLU = {{geglu_forward0, geglu_forward1, geglu_forward2},
                        {geglu_backward0, geglu_backward1, geglu_backward2},
                        geglu_forward_reference, geglu_backward_reference, 6.0f, {-100.0f, 100.0f, -12.0f, 0.0f}};

// ----------------------------------------------------------------------------
// benchmark at the pi0 shapes: the VLM's MLP (16384 wide) over an 8-sample prefix of 560 tokens
// (2 cameras x 256 image tokens + 48 text), and the action expert's (4096 wide) over 8 suffixes of 51
// (the state and 50 actions)

static void benchmark(void) {
    glu_benchmark_shape(&GEGLU, "vlm", 8 * 560, 16384);
    glu_benchmark_shape(&GEGLU, "expert", 8 * 51, 4096);
}

int main(void) {
    dev_init("geglu");
    check_gelu_grad_reference();
    // one element; odd sizes that leave the last block partly empty (version 1 only); a size that
    // is a multiple of x128::size in fp32 only (2052) and ones that are in both precisions: three
    // rows of the VLM's MLP width (16384) and two of the expert's (4096) among them
    size_t sizes[] = {1, 37, 1000, 2052, 4099, 3 * 16384, 2 * 4096};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { glu_check_size(&GEGLU, sizes[i], 100 + 10 * i); }
    return dev_finish(benchmark);
}
