/*
attention_forward.cu: joint attention under the block mask (prefix pass and suffix pass).

  version 1  one warp per (sample, head, query), key by key with an online softmax on CUDA
             cores (train_vla.cu's fp32 path: attention_forward_kernel1)
  version 2  tensor cores (WMMA, bf16): 64 queries x 64 keys per step, scores and softmax in
             shared memory, output accumulated in fp32 (train_vla.cu's bf16 path:
             attention_forward_kernel2)

  make -C dev/cuda attention_forward && dev/cuda/attention_forward
*/
#include "common.h"

#if defined(ENABLE_FP32)
static const int V2_THREADS = 0;  // version 2 exists in bf16 builds only
#else
static const int V2_THREADS = ATT_THREADS;
#endif

typedef struct {
    int B, NH, HS, NI, T, Ns, suffix;  // NI image keys, T text keys (some padded), suffix pass or not
    float *q, *kp, *vp, *ks, *vs, *valid;  // host copies (rounded to floatX)
    floatX *d_q, *d_kp, *d_vp, *d_ks, *d_vs;
    float* d_valid;
    AttnKeys keys;
} Case;

static Case make_case(int B, int NH, int HS, int NI, int T, int H, int suffix, uint64_t seed) {
    Case k;
    memset(&k, 0, sizeof(k));
    k.B = B; k.NH = NH; k.HS = HS; k.NI = NI; k.T = T; k.Ns = 1 + H; k.suffix = suffix;
    int Np = NI + T, D = NH * HS, Tq = suffix ? k.Ns : Np;
    k.q = random_floats((size_t)B * Tq * D, 2.0f, seed);
    k.kp = random_floats((size_t)B * Np * D, 2.0f, seed + 1);
    k.vp = random_floats((size_t)B * Np * D, 1.0f, seed + 2);
    k.ks = random_floats((size_t)B * k.Ns * D, 2.0f, seed + 3);
    k.vs = random_floats((size_t)B * k.Ns * D, 1.0f, seed + 4);
    k.valid = (float*)mallocCheck((size_t)B * Np * sizeof(float));
    for (int b = 0; b < B; b++) {
        int text_len = 1 + (b * 7 + 3) % T;  // instructions of different lengths, the rest pads
        for (int j = 0; j < Np; j++) { k.valid[b * Np + j] = (j < NI || j - NI < text_len) ? 1.0f : 0.0f; }
    }
    k.d_q = to_device_x(k.q, (size_t)B * Tq * D);
    k.d_kp = to_device_x(k.kp, (size_t)B * Np * D);
    k.d_vp = to_device_x(k.vp, (size_t)B * Np * D);
    k.d_ks = to_device_x(k.ks, (size_t)B * k.Ns * D);
    k.d_vs = to_device_x(k.vs, (size_t)B * k.Ns * D);
    k.d_valid = to_device_f(k.valid, (size_t)B * Np);
    k.keys = AttnKeys{k.d_kp, k.d_vp, suffix ? k.d_ks : NULL, suffix ? k.d_vs : NULL, k.d_valid, B, NH, HS, Np, k.Ns, Tq};
    return k;
}

static void free_case(Case* k) {
    free(k->q); free(k->kp); free(k->vp); free(k->ks); free(k->vs); free(k->valid);
    cudaCheck(cudaFree(k->d_q)); cudaCheck(cudaFree(k->d_kp)); cudaCheck(cudaFree(k->d_vp));
    cudaCheck(cudaFree(k->d_ks)); cudaCheck(cudaFree(k->d_vs)); cudaCheck(cudaFree(k->d_valid));
}

// the reference, in double: out (B, Tq, D), lse (B, NH, Tq)
static void attention_reference(const Case* k, double* out, double* lse) {
    const AttnKeys& a = k->keys;
    int D = a.NH * a.HS, nk = a.Np + (k->suffix ? a.Ns : 0);
    double scale = 1.0 / sqrt((double)a.HS);
    double* s = (double*)mallocCheck((size_t)nk * sizeof(double));
    for (int b = 0; b < a.B; b++) {
        for (int h = 0; h < a.NH; h++) {
            for (int i = 0; i < a.Tq; i++) {
                const float* qi = k->q + ((size_t)b * a.Tq + i) * D + h * a.HS;
                double mx = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    bool vis = j < a.Np ? k->valid[b * a.Np + j] != 0.0f : (i > 0 || j == a.Np);
                    const float* kj = j < a.Np ? k->kp + ((size_t)b * a.Np + j) * D : k->ks + ((size_t)b * a.Ns + j - a.Np) * D;
                    double dot = 0.0;
                    for (int c = 0; c < a.HS; c++) { dot += (double)qi[c] * kj[h * a.HS + c]; }
                    s[j] = vis ? dot * scale : -INFINITY;
                    mx = fmax(mx, s[j]);
                }
                double sum = 0.0;
                for (int j = 0; j < nk; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                double* o = out + ((size_t)b * a.Tq + i) * D + h * a.HS;
                for (int c = 0; c < a.HS; c++) { o[c] = 0.0; }
                for (int j = 0; j < nk; j++) {
                    const float* vj = j < a.Np ? k->vp + ((size_t)b * a.Np + j) * D : k->vs + ((size_t)b * a.Ns + j - a.Np) * D;
                    for (int c = 0; c < a.HS; c++) { o[c] += s[j] / sum * vj[h * a.HS + c]; }
                }
                lse[((size_t)b * a.NH + h) * a.Tq + i] = mx + log(sum);
            }
        }
    }
    free(s);
}

// version: 1 or 2; block: threads per block (version 1 only)
static void run_version(int version, int block, floatX* out, float* lse, const Case* k) {
    const AttnKeys& a = k->keys;
    if (version == 1) {
        attention_forward_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, block), block, 0, main_stream>>>(out, lse, k->d_q, a);
        launchCheck();
        return;
    }
#if !defined(ENABLE_FP32)
    attention_forward(out, lse, k->d_q, a);  // train_vla.cu's bf16 path: version 2
#endif
}

static void check_case(const Case* k, const char* name) {
    const AttnKeys& a = k->keys;
    size_t n_out = (size_t)a.B * a.Tq * a.NH * a.HS, n_lse = (size_t)a.B * a.NH * a.Tq;
    double* ref = (double*)mallocCheck(n_out * sizeof(double));
    double* ref_lse = (double*)mallocCheck(n_lse * sizeof(double));
    attention_reference(k, ref, ref_lse);
    floatX* out;
    float* lse;
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, n_lse * sizeof(float)));
    // floatX outputs carry its rounding (2^-8 relative for bf16); version 2 also rounds the
    // probabilities to bf16 before P V. lse stays in fp32.
    double tol_out = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
    int versions = sizeof(floatX) == 4 ? 1 : 2;
    for (int version = 1; version <= versions; version++) {
        int blocks[4] = {32, 64, 256, 512};
        for (int bi = 0; bi < (version == 1 ? 4 : 1); bi++) {
            poison(out, n_out * sizeof(floatX));
            poison(lse, n_lse * sizeof(float));
            run_version(version, blocks[bi], out, lse, k);
            float* got = from_device_x(out, n_out);
            float* got_lse = from_device_f(lse, n_lse);
            char what[200];
            snprintf(what, sizeof(what), "v%d %s (B %d, NH %d, HS %d, Tq %d) block %d: out", version, name, a.B, a.NH, a.HS,
                     a.Tq, version == 1 ? blocks[bi] : V2_THREADS);
            check_close(what, got, ref, n_out, tol_out);
            snprintf(what, sizeof(what), "v%d %s (B %d, NH %d, HS %d, Tq %d) block %d: lse", version, name, a.B, a.NH, a.HS,
                     a.Tq, version == 1 ? blocks[bi] : V2_THREADS);
            check_close(what, got_lse, ref_lse, n_lse, 1e-5);
            free(got); free(got_lse);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse));
    free(ref); free(ref_lse);
}

static void benchmark(int suffix) {
    const int B = 16, NH = 15, HS = 64, NI = 392, T = 48, H = 50;  // the base preset, batch 16
    Case k = make_case(B, NH, HS, NI, T, H, suffix, 7);
    const AttnKeys& a = k.keys;
    int nk = a.Np + (suffix ? a.Ns : 0);
    floatX* out;
    float* lse;
    cudaCheck(cudaMalloc(&out, (size_t)B * a.Tq * NH * HS * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, (size_t)B * NH * a.Tq * sizeof(float)));
    double flops = 4.0 * B * NH * a.Tq * nk * HS;  // Q K^T and P V over every key, masked or not
    int versions = sizeof(floatX) == 4 ? 1 : 2;
    for (int version = 1; version <= versions; version++) {
        double ms = time_ms([&]() { run_version(version, 256, out, lse, &k); }, 20);
        printf("bench v%d %s pass (B %d, NH %d, HS %d, %d queries x %d keys): %8.3f ms, %7.1f TFLOP/s\n", version,
               suffix ? "suffix" : "prefix", B, NH, HS, a.Tq, nk, ms, flops / (ms * 1e-3) / 1e12);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse));
    free_case(&k);
}

int main(void) {
    dev_init("attention_forward");
    // prefix and suffix passes; head sizes through every padding of version 2; query counts
    // that do not fill the last 64-row tile; text pads in every sample
    struct { int B, NH, HS, NI, T, H; } shapes[] = {
        {2, 3, 8, 16, 12, 6}, {2, 2, 12, 40, 30, 9}, {1, 2, 16, 64, 8, 3}, {2, 1, 32, 48, 20, 7}, {1, 2, 64, 70, 10, 5},
        {1, 1, 128, 20, 5, 4},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        for (int suffix = 0; suffix < 2; suffix++) {
            Case k = make_case(shapes[i].B, shapes[i].NH, shapes[i].HS, shapes[i].NI, shapes[i].T, shapes[i].H, suffix, 100 + i);
            check_case(&k, suffix ? "suffix pass" : "prefix pass");
            free_case(&k);
        }
    }
    if (BENCHMARKS) {
        benchmark(0);
        benchmark(1);
    } else {
        printf("benchmarks skipped: timings under the CPU emulation mean nothing\n");
    }
    return dev_finish();
}
