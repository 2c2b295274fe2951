/*
attention_case.h: what attention_forward.cu and attention_backward.cu share: the inputs of one
attention pass (random queries, keys, values and output gradients, instructions of different
lengths padded in every sample) and the forward pass in double.
*/
#ifndef DEV_CUDA_ATTENTION_CASE_H
#define DEV_CUDA_ATTENTION_CASE_H

#include "common.h"

#if defined(ENABLE_FP32)
static const int V2_THREADS = 0;  // version 2 exists in bf16 builds only
#else
static const int V2_THREADS = ATT_THREADS;
#endif

typedef struct {
    int B, NH, HS, NI, T, Ns, suffix, Tq, nk;  // NI image keys, T text keys (some padded), suffix pass or not
    float *q, *kp, *vp, *ks, *vs, *valid;     // host copies of the inputs (rounded to floatX)
    float *dout, *out, *lse;                  // host copies of dO, the forward's O (floatX) and lse (fp32)
    floatX *d_q, *d_kp, *d_vp, *d_ks, *d_vs, *d_dout, *d_out;
    float *d_valid, *d_lse;
    AttnKeys keys;
} Case;

// key (or value) row j of sample b on the host: prefix tensor below Np, suffix tensor past it
static const float* host_key(const Case* k, const float* pfx, const float* sfx, int b, int j) {
    int D = k->NH * k->HS, Np = k->NI + k->T;
    return j < Np ? pfx + ((size_t)b * Np + j) * D : sfx + ((size_t)b * k->Ns + j - Np) * D;
}

static bool host_visible(const Case* k, int b, int i, int j) {
    int Np = k->NI + k->T;
    return j < Np ? k->valid[b * Np + j] != 0.0f : (i > 0 || j == Np);
}

// the forward in double, to give the backward the O and lse it would get: out (B, Tq, D), lse (B, NH, Tq)
static void forward_reference(const Case* k, double* out, double* lse) {
    int D = k->NH * k->HS;
    double scale = 1.0 / sqrt((double)k->HS);
    double* s = (double*)mallocCheck((size_t)k->nk * sizeof(double));
    for (int b = 0; b < k->B; b++) {
        for (int h = 0; h < k->NH; h++) {
            for (int i = 0; i < k->Tq; i++) {
                const float* qi = k->q + ((size_t)b * k->Tq + i) * D + h * k->HS;
                double mx = -INFINITY;
                for (int j = 0; j < k->nk; j++) {
                    const float* kj = host_key(k, k->kp, k->ks, b, j) + h * k->HS;
                    double dot = 0.0;
                    for (int c = 0; c < k->HS; c++) { dot += (double)qi[c] * kj[c]; }
                    s[j] = host_visible(k, b, i, j) ? dot * scale : -INFINITY;
                    mx = fmax(mx, s[j]);
                }
                double sum = 0.0;
                for (int j = 0; j < k->nk; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                double* o = out + ((size_t)b * k->Tq + i) * D + h * k->HS;
                for (int c = 0; c < k->HS; c++) { o[c] = 0.0; }
                for (int j = 0; j < k->nk; j++) {
                    const float* vj = host_key(k, k->vp, k->vs, b, j) + h * k->HS;
                    for (int c = 0; c < k->HS; c++) { o[c] += s[j] / sum * vj[c]; }
                }
                lse[((size_t)b * k->NH + h) * k->Tq + i] = mx + log(sum);
            }
        }
    }
    free(s);
}

// What make_case provides of the forward pass (O and lse), which the backward needs
enum { FORWARD_NONE = 0, FORWARD_HOST = 1, FORWARD_DEVICE = 2 };

// Inputs of one pass. FORWARD_HOST: O and lse from the double reference, rounded to what the
// device stores (floatX, fp32); FORWARD_DEVICE (the benchmark, too big for the host): from
// attention_forward on the device, the host copies of O and lse staying NULL; FORWARD_NONE: neither.
static Case make_case(int B, int NH, int HS, int NI, int T, int H, int suffix, int forward, uint64_t seed) {
    Case k;
    memset(&k, 0, sizeof(k));
    k.B = B; k.NH = NH; k.HS = HS; k.NI = NI; k.T = T; k.Ns = 1 + H; k.suffix = suffix;
    int Np = NI + T, D = NH * HS;
    k.Tq = suffix ? k.Ns : Np;
    k.nk = Np + (suffix ? k.Ns : 0);
    k.q = random_floats((size_t)B * k.Tq * D, 2.0f, seed);
    k.kp = random_floats((size_t)B * Np * D, 2.0f, seed + 1);
    k.vp = random_floats((size_t)B * Np * D, 1.0f, seed + 2);
    k.ks = random_floats((size_t)B * k.Ns * D, 2.0f, seed + 3);
    k.vs = random_floats((size_t)B * k.Ns * D, 1.0f, seed + 4);
    k.dout = random_floats((size_t)B * k.Tq * D, 1.0f, seed + 5);
    k.valid = (float*)mallocCheck((size_t)B * Np * sizeof(float));
    for (int b = 0; b < B; b++) {
        int text_len = 1 + (b * 7 + 3) % T;  // instructions of different lengths, the rest pads
        for (int j = 0; j < Np; j++) { k.valid[b * Np + j] = (j < NI || j - NI < text_len) ? 1.0f : 0.0f; }
    }
    k.d_q = to_device_x(k.q, (size_t)B * k.Tq * D);
    k.d_kp = to_device_x(k.kp, (size_t)B * Np * D);
    k.d_vp = to_device_x(k.vp, (size_t)B * Np * D);
    k.d_ks = to_device_x(k.ks, (size_t)B * k.Ns * D);
    k.d_vs = to_device_x(k.vs, (size_t)B * k.Ns * D);
    k.d_dout = to_device_x(k.dout, (size_t)B * k.Tq * D);
    k.d_valid = to_device_f(k.valid, (size_t)B * Np);
    k.keys = AttnKeys{k.d_kp, k.d_vp, suffix ? k.d_ks : NULL, suffix ? k.d_vs : NULL, k.d_valid, B, NH, HS, Np, k.Ns, k.Tq};
    size_t n_out = (size_t)B * k.Tq * D, n_lse = (size_t)B * NH * k.Tq;
    if (forward == FORWARD_HOST) {
        double* out = (double*)mallocCheck(n_out * sizeof(double));
        double* lse = (double*)mallocCheck(n_lse * sizeof(double));
        forward_reference(&k, out, lse);
        k.out = (float*)mallocCheck(n_out * sizeof(float));
        k.lse = (float*)mallocCheck(n_lse * sizeof(float));
        for (size_t e = 0; e < n_out; e++) { k.out[e] = (float)out[e]; }
        for (size_t e = 0; e < n_lse; e++) { k.lse[e] = (float)lse[e]; }
        k.d_out = to_device_x(k.out, n_out);  // rounds the host copy to floatX too
        k.d_lse = to_device_f(k.lse, n_lse);
        free(out); free(lse);
    } else if (forward == FORWARD_DEVICE) {
        cudaCheck(cudaMalloc(&k.d_out, n_out * sizeof(floatX)));
        cudaCheck(cudaMalloc(&k.d_lse, n_lse * sizeof(float)));
        attention_forward(k.d_out, k.d_lse, k.d_q, k.keys);
    }
    return k;
}

static void free_case(Case* k) {
    free(k->q); free(k->kp); free(k->vp); free(k->ks); free(k->vs); free(k->valid); free(k->dout);
    free(k->out); free(k->lse);
    cudaCheck(cudaFree(k->d_q)); cudaCheck(cudaFree(k->d_kp)); cudaCheck(cudaFree(k->d_vp));
    cudaCheck(cudaFree(k->d_ks)); cudaCheck(cudaFree(k->d_vs)); cudaCheck(cudaFree(k->d_dout));
    cudaCheck(cudaFree(k->d_out)); cudaCheck(cudaFree(k->d_valid)); cudaCheck(cudaFree(k->d_lse));
}

#endif  // DEV_CUDA_ATTENTION_CASE_H
