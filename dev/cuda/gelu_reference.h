/*
gelu_reference.h: gelu_pytorch_tanh and its derivative in double, the reference of gelu.cu (SigLIP's
MLP activation) and glu.cu (Gemma's MLP activation, gelu(gate) * up), and the check of that
derivative against central differences.
  gelu(x)  = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
  gelu'(x) = (1 + tanh(u))/2 + x/2 (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 0.044715 x^2)
*/
#ifndef DEV_CUDA_GELU_REFERENCE_H
#define DEV_CUDA_GELU_REFERENCE_H

#include "common.h"

static const double SQRT_2_OVER_PI = 0.79788456080286535588;  // sqrt(2 / pi)

static double gelu_reference(double x) {
    return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
}

// d/dx of x/2 (1 + tanh u): the product rule, with tanh' = 1 - tanh^2 and du/dx above
static double gelu_grad_reference(double x) {
    double t = tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x));
    double du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

// the derivative above against central differences of gelu_reference, so a slip in the
// derivative cannot hide in both the kernel and the reference
static void check_gelu_grad_reference(void) {
    const int n = 101;
    float got[n];
    double ref[n];
    for (int i = 0; i < n; i++) {
        double x = -8.0 + 16.0 * i / (n - 1), h = 1e-5;
        got[i] = (float)gelu_grad_reference(x);
        ref[i] = (gelu_reference(x + h) - gelu_reference(x - h)) / (2.0 * h);
    }
    // central differences err by h^2 f''' ~ 1e-10, the float of the result by 6e-8
    check_close("reference gelu' against central differences on [-8, 8]", got, ref, n, 1e-6);
}

#endif  // DEV_CUDA_GELU_REFERENCE_H
