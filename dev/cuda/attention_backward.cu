/*
attention_backward.cu: backward of the joint attention under the block mask (prefix and suffix
passes). With P = softmax(S) recomputed from the forward's lse and delta = rowsum(dO * O):
dV += P^T dO, dP = dO V^T, dS = P * (dP - delta), dQ = scale dS K, dK += scale dS^T Q.
dq is overwritten (floatX); the key gradients accumulate in fp32 (prefix keys into dkp/dvp,
suffix keys into dks/dvs), since the suffix pass deposits into the prefix's gradients first.

  delta      rowsum(dO * O), one warp per (query, head): attention_delta_kernel, both versions
  version 1  one warp per query for dq, one warp per key for dk and dv, on CUDA cores
             (train_vla.cu's fp32 path: attention_backward_dq_kernel1, attention_backward_dkdv_kernel1)
  version 2  tensor cores (WMMA, bf16): 64 queries per block for dq, 64 keys per block for dk and
             dv; P and dS rounded to bf16 before their products (train_vla.cu's bf16 path, through
             the launcher attention_backward: attention_backward_dq_kernel2, attention_backward_dkdv_kernel2)

  make -C dev/cuda attention_backward && dev/cuda/attention_backward
*/
#include "attention_case.h"

typedef struct {
    double *dq, *dkp, *dvp, *dks, *dvs, *delta;  // (B, Tq, D), (B, Np, D) x2, (B, Ns, D) x2, (B, NH, Tq)
} Grads;

// The backward in double from the inputs the device gets (O in floatX, lse in fp32), so the
// reference is the exact math of those inputs: P = exp(scale q.k - lse), delta = rowsum(dO * O).
static Grads backward_reference(const Case* k) {
    int D = k->NH * k->HS, Np = k->NI + k->T;
    Grads g;
    g.dq = (double*)callocCheck((size_t)k->B * k->Tq * D, sizeof(double));
    g.dkp = (double*)callocCheck((size_t)k->B * Np * D, sizeof(double));
    g.dvp = (double*)callocCheck((size_t)k->B * Np * D, sizeof(double));
    g.dks = (double*)callocCheck((size_t)k->B * k->Ns * D, sizeof(double));
    g.dvs = (double*)callocCheck((size_t)k->B * k->Ns * D, sizeof(double));
    g.delta = (double*)callocCheck((size_t)k->B * k->NH * k->Tq, sizeof(double));
    double scale = 1.0 / sqrt((double)k->HS);
    for (int b = 0; b < k->B; b++) {
        for (int h = 0; h < k->NH; h++) {
            for (int i = 0; i < k->Tq; i++) {
                size_t row = ((size_t)b * k->Tq + i) * D + h * k->HS, stat = ((size_t)b * k->NH + h) * k->Tq + i;
                const float* qi = k->q + row;
                const float* doi = k->dout + row;
                double delta = 0.0;
                for (int c = 0; c < k->HS; c++) { delta += (double)doi[c] * k->out[row + c]; }
                g.delta[stat] = delta;
                for (int j = 0; j < k->nk; j++) {
                    if (!host_visible(k, b, i, j)) { continue; }
                    const float* kj = host_key(k, k->kp, k->ks, b, j) + h * k->HS;
                    const float* vj = host_key(k, k->vp, k->vs, b, j) + h * k->HS;
                    size_t krow = (j < Np ? ((size_t)b * Np + j) : ((size_t)b * k->Ns + j - Np)) * D + h * k->HS;
                    double* dkj = (j < Np ? g.dkp : g.dks) + krow;
                    double* dvj = (j < Np ? g.dvp : g.dvs) + krow;
                    double s = 0.0, dp = 0.0;
                    for (int c = 0; c < k->HS; c++) { s += (double)qi[c] * kj[c]; dp += (double)doi[c] * vj[c]; }
                    double p = exp(s * scale - k->lse[stat]);
                    double ds = p * (dp - delta) * scale;
                    for (int c = 0; c < k->HS; c++) {
                        g.dq[row + c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                        dvj[c] += p * doi[c];
                    }
                }
            }
        }
    }
    return g;
}

static void free_grads(Grads* g) { free(g->dq); free(g->dkp); free(g->dvp); free(g->dks); free(g->dvs); free(g->delta); }

// version: 1 or 2; block: threads per block (version 1 only: warps per block = block / 32)
static void run_version(int version, int block, const Case* k, floatX* dq, float* dkp, float* dvp, float* dks,
                        float* dvs, float* delta) {
    const AttnKeys& a = k->keys;
    if (version == 1) {
        attention_delta_kernel<<<ceil_div((size_t)a.B * a.Tq * a.NH * 32, block), block, 0, main_stream>>>(delta, k->d_dout, k->d_out, a.B * a.Tq, a.Tq, a.NH, a.HS);
        launchCheck();
        attention_backward_dq_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, block), block, 0, main_stream>>>(dq, k->d_dout, k->d_q, k->d_lse, delta, a);
        launchCheck();
        attention_backward_dkdv_kernel1<<<ceil_div((size_t)a.B * a.NH * k->nk * 32, block), block, 0, main_stream>>>(dkp, dvp, dks, dvs, k->d_dout, k->d_q, k->d_lse, delta, a);
        launchCheck();
        return;
    }
#if !defined(ENABLE_FP32)
    attention_backward(dq, dkp, dvp, dks, dvs, k->d_dout, k->d_q, k->d_out, k->d_lse, delta, a);  // version 2
#endif
}

static void check_case(const Case* k, const char* name, uint64_t seed) {
    int D = k->NH * k->HS, Np = k->NI + k->T;
    size_t n_q = (size_t)k->B * k->Tq * D, n_p = (size_t)k->B * Np * D, n_s = (size_t)k->B * k->Ns * D;
    size_t n_stat = (size_t)k->B * k->NH * k->Tq;
    Grads ref = backward_reference(k);
    // the accumulators start from known random values of the gradients' size
    float* dkp0 = random_floats(n_p, 0.5f, seed);
    float* dvp0 = random_floats(n_p, 0.5f, seed + 1);
    float* dks0 = random_floats(n_s, 0.5f, seed + 2);
    float* dvs0 = random_floats(n_s, 0.5f, seed + 3);
    floatX* dq;
    float *dkp, *dvp, *dks, *dvs, *delta;
    cudaCheck(cudaMalloc(&dq, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dkp, n_p * sizeof(float)));
    cudaCheck(cudaMalloc(&dvp, n_p * sizeof(float)));
    cudaCheck(cudaMalloc(&dks, n_s * sizeof(float)));
    cudaCheck(cudaMalloc(&dvs, n_s * sizeof(float)));
    cudaCheck(cudaMalloc(&delta, n_stat * sizeof(float)));
    // Tolerances. delta and version 1's key gradients: fp32 sums of products of exact inputs,
    // 1e-5. dq is stored in floatX: 1e-5 in fp32 builds, 1e-2 in bf16, where one rounding to bf16
    // (8 significant bits: 2^-8 = 3.9e-3 relative at most per value) costs about 1.6e-3 of the
    // norm (version 1's dq measures that). Version 2 also rounds P (for dv) and dS (for dk, dq) to bf16 before the
    // products: one such rounding per term for dk and dv (measured ~2e-3), two for dq with its
    // store (measured ~2.5e-3, as sqrt(2) x 1.6e-3 predicts). 1e-2 keeps a 4x margin over that
    // and stays far below what a wrong mask or a missed tile gives (errors of order 1).
    double tol_f32 = 1e-5, tol_dq = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
    int versions = sizeof(floatX) == 4 ? 1 : 2;
    for (int version = 1; version <= versions; version++) {
        int blocks[4] = {32, 64, 256, 512};
        double tol_kv = version == 1 ? tol_f32 : 1e-2;
        for (int bi = 0; bi < (version == 1 ? 4 : 1); bi++) {
            int block = version == 1 ? blocks[bi] : V2_THREADS;
            poison(dq, n_q * sizeof(floatX));
            poison(delta, n_stat * sizeof(float));
            cudaCheck(cudaMemcpy(dkp, dkp0, n_p * sizeof(float), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(dvp, dvp0, n_p * sizeof(float), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(dks, dks0, n_s * sizeof(float), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(dvs, dvs0, n_s * sizeof(float), cudaMemcpyHostToDevice));
            // the prefix pass has no suffix keys: NULL, as train_vla.cu passes it
            run_version(version, block, k, dq, dkp, dvp, k->suffix ? dks : NULL, k->suffix ? dvs : NULL, delta);
            char prefix[160], what[200];
            snprintf(prefix, sizeof(prefix), "v%d %s (B %d, NH %d, HS %d, Tq %d, keys %d) block %d", version, name, k->B,
                     k->NH, k->HS, k->Tq, k->nk, block);
            float* got_delta = from_device_f(delta, n_stat);
            snprintf(what, sizeof(what), "%s: delta", prefix);
            check_close(what, got_delta, ref.delta, n_stat, tol_f32);
            float* got_dq = from_device_x(dq, n_q);
            snprintf(what, sizeof(what), "%s: dq", prefix);
            check_close(what, got_dq, ref.dq, n_q, tol_dq);
            snprintf(what, sizeof(what), "%s: dk prefix (+=)", prefix);
            check_accumulated(what, dkp, dkp0, ref.dkp, n_p, tol_kv);
            snprintf(what, sizeof(what), "%s: dv prefix (+=)", prefix);
            check_accumulated(what, dvp, dvp0, ref.dvp, n_p, tol_kv);
            if (k->suffix) {
                snprintf(what, sizeof(what), "%s: dk suffix (+=)", prefix);
                check_accumulated(what, dks, dks0, ref.dks, n_s, tol_kv);
                snprintf(what, sizeof(what), "%s: dv suffix (+=)", prefix);
                check_accumulated(what, dvs, dvs0, ref.dvs, n_s, tol_kv);
            }
            free(got_delta); free(got_dq);
        }
    }
    cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dkp)); cudaCheck(cudaFree(dvp));
    cudaCheck(cudaFree(dks)); cudaCheck(cudaFree(dvs)); cudaCheck(cudaFree(delta));
    free(dkp0); free(dvp0); free(dks0); free(dvs0);
    free_grads(&ref);
}

static void benchmark(int suffix) {
    const int B = 16, NH = 15, HS = 64, NI = 392, T = 48, H = 50;  // the base preset, batch 16
    Case k = make_case(B, NH, HS, NI, T, H, suffix, FORWARD_DEVICE, 7);
    int D = NH * HS, Np = NI + T;
    size_t n_q = (size_t)B * k.Tq * D, n_p = (size_t)B * Np * D, n_s = (size_t)B * k.Ns * D;
    floatX* dq;
    float *dkp, *dvp, *dks, *dvs, *delta;
    cudaCheck(cudaMalloc(&dq, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dkp, n_p * sizeof(float)));
    cudaCheck(cudaMalloc(&dvp, n_p * sizeof(float)));
    cudaCheck(cudaMalloc(&dks, n_s * sizeof(float)));
    cudaCheck(cudaMalloc(&dvs, n_s * sizeof(float)));
    cudaCheck(cudaMalloc(&delta, (size_t)B * NH * k.Tq * sizeof(float)));
    cudaCheck(cudaMemset(dkp, 0, n_p * sizeof(float)));
    cudaCheck(cudaMemset(dvp, 0, n_p * sizeof(float)));
    cudaCheck(cudaMemset(dks, 0, n_s * sizeof(float)));
    cudaCheck(cudaMemset(dvs, 0, n_s * sizeof(float)));
    // the backward's five products (S, dP, dV, dQ, dK) over every key, masked or not; version 2
    // computes S and dP twice (once per kernel), which is not counted
    double flops = 10.0 * B * NH * k.Tq * k.nk * HS;
    int versions = sizeof(floatX) == 4 ? 1 : 2;
    for (int version = 1; version <= versions; version++) {
        double ms = time_ms([&]() { run_version(version, 256, &k, dq, dkp, dvp, suffix ? dks : NULL, suffix ? dvs : NULL, delta); }, 20);
        printf("bench v%d %s pass (B %d, NH %d, HS %d, %d queries x %d keys): %8.3f ms, %7.1f TFLOP/s\n", version,
               suffix ? "suffix" : "prefix", B, NH, HS, k.Tq, k.nk, ms, flops / (ms * 1e-3) / 1e12);
    }
    cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dkp)); cudaCheck(cudaFree(dvp));
    cudaCheck(cudaFree(dks)); cudaCheck(cudaFree(dvs)); cudaCheck(cudaFree(delta));
    free_case(&k);
}

// the prefix pass and the suffix pass at the base preset's shapes
static void benchmarks(void) {
    benchmark(0);
    benchmark(1);
}

int main(void) {
    dev_init("attention_backward");
    // prefix and suffix passes; head sizes through every padding of version 2; query and key
    // counts that do not fill the last 64-row tile, and more than one tile of each (the last
    // shape's suffix pass has 71 queries); text pads in every sample
    struct { int B, NH, HS, NI, T, H; } shapes[] = {
        {2, 3, 8, 16, 12, 6}, {2, 2, 12, 40, 30, 9}, {1, 2, 16, 64, 8, 3}, {2, 1, 32, 48, 20, 7}, {1, 2, 64, 70, 10, 5},
        {1, 1, 128, 20, 5, 4}, {1, 1, 16, 60, 9, 70},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        for (int suffix = 0; suffix < 2; suffix++) {
            Case k = make_case(shapes[i].B, shapes[i].NH, shapes[i].HS, shapes[i].NI, shapes[i].T, shapes[i].H, suffix,
                               FORWARD_HOST, 100 + 10 * i);
            check_case(&k, suffix ? "suffix pass" : "prefix pass", 500 + 10 * i);
            free_case(&k);
        }
    }
    return dev_finish(benchmarks);
}
