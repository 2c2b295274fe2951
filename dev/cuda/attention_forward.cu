/*
attention_forward.cu: joint attention under the block mask (prefix pass and suffix pass).

  version 1  one warp per (sample, head, query), key by key with an online softmax on CUDA
             cores (train_vla.cu's fp32 path: attention_forward_kernel1)
  version 2  tensor cores (WMMA, bf16): 64 queries x 64 keys per step, scores and softmax in
             shared memory, output accumulated in fp32 (train_vla.cu's bf16 path:
             attention_forward_kernel2)

  make -C dev/cuda attention_forward && dev/cuda/attention_forward
*/
#include "attention_case.h"

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
    forward_reference(k, ref, ref_lse);
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
    Case k = make_case(B, NH, HS, NI, T, H, suffix, FORWARD_NONE, 7);
    const AttnKeys& a = k.keys;
    int nk = attn_n_keys(a);
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

// the prefix pass and the suffix pass at the base preset's shapes
static void benchmarks(void) {
    benchmark(0);
    benchmark(1);
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
            Case k = make_case(shapes[i].B, shapes[i].NH, shapes[i].HS, shapes[i].NI, shapes[i].T, shapes[i].H, suffix,
                               FORWARD_NONE, 100 + i);
            check_case(&k, suffix ? "suffix pass" : "prefix pass");
            free_case(&k);
        }
    }
    return dev_finish(benchmarks);
}
