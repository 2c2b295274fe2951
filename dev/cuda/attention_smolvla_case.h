/*
attention_smolvla_case.h: the inputs of one SmolVLA or pi0 attention call for attention_smolvla.cu,
and LeRobot's eager_attention_forward and its autograd backward in double (the references).

A call is one of the passes the model makes (PASS_*, below): Tq queries per sample, which are the
tokens q0 .. q0+Tq-1 of the sample's token sequence, against keys 0 .. Nk0+Nk1-1 of it, the first
Nk0 held in one tensor and the rest in another (the prefix's and the suffix's projections). The
mask is one int per token: its cumulative block id, or -1 for a pad (token_blocks).

The two models lay their tokens out differently (MODEL_*): SmolVLA's prefix ends with the state
and its actions are causal; pi0's suffix starts with the state and its actions are one block.
pi0 fills masked scores with -2.3819763e38 where SmolVLA fills -FLT_MAX: the probabilities are the
same (exp of either fill minus a visible score's max is 0, and a row that sees no key is uniform
either way), so one reference serves both.
*/
#ifndef DEV_CUDA_ATTENTION_SMOLVLA_CASE_H
#define DEV_CUDA_ATTENTION_SMOLVLA_CASE_H

#include "common.h"
#include <float.h>

// The calls of SmolVLA's attention (layer parity as smolvlm_with_expert.py's forward chooses it)
enum {
    PASS_PREFIX,        // odd layers' VLM over the prefix alone, and the prefix prefill of sampling
    PASS_JOINT_PREFIX,  // even layers, the prefix rows of the joint attention: keys [prefix ; suffix]
    PASS_JOINT_SUFFIX,  // even layers, the action rows of the joint attention: keys [prefix ; suffix]
    PASS_CROSS,         // odd layers, the expert's queries on the prefix keys re-projected by the expert
    PASS_VISION,        // SigLIP: plain bidirectional attention, no mask, n_kv_head = n_head
    PASS_RANDOM,        // random block ids and pads (not monotone), a fully padded sample: the general rule
    N_PASSES
};
static const char* pass_names[N_PASSES] = {"prefix", "joint prefix rows", "joint suffix rows", "cross", "vision",
                                           "random mask"};

// Whose token layout a case has (the passes above at that model's layout; pi0 has no cross layers)
enum { MODEL_SMOLVLA, MODEL_PI0 };
static const char* model_names[2] = {"smolvla", "pi0"};

// make_att_2d_masks' data as one int per token: the cumsum of the block flags, -1 for a pad.
// Key j is visible to query i iff 0 <= block[j] <= block[i] (both valid, cumsum[j] <= cumsum[i]).
static void token_blocks(int* block, const int* valid, const int* flags, int n) {
    int cum = 0;
    for (int t = 0; t < n; t++) {
        cum += flags[t];
        block[t] = valid[t] ? cum : -1;
    }
}

// One sample's tokens as SmolVLA lays them out (embed_prefix, embed_suffix): NI image tokens and
// T text tokens (flag 0: one bidirectional block; text past text_len is padding), the state
// (flag 1: its own block), H actions (flag 1 each: causal among themselves). block (NI+T+1+H).
static void flow_token_blocks(int* block, int NI, int T, int text_len, int H) {
    int n = NI + T + 1 + H;
    int* valid = (int*)mallocCheck(n * sizeof(int));
    int* flags = (int*)mallocCheck(n * sizeof(int));
    for (int t = 0; t < n; t++) {
        valid[t] = !(t >= NI && t < NI + T && t - NI >= text_len);
        flags[t] = t >= NI + T;
    }
    token_blocks(block, valid, flags, n);
    free(valid); free(flags);
}

// One sample's tokens as pi0 lays them out (embed_prefix, embed_suffix): NI image tokens and T text
// tokens (flag 0: one bidirectional block; text past text_len is padding), then the suffix: the
// state (flag 1: its own block) and H actions, the first flagged 1 and the rest 0, so that they
// form one block and see each other both ways. block (NI+T+1+H).
static void pi0_token_blocks(int* block, int NI, int T, int text_len, int H) {
    int n = NI + T + 1 + H;
    int* valid = (int*)mallocCheck(n * sizeof(int));
    int* flags = (int*)mallocCheck(n * sizeof(int));
    for (int t = 0; t < n; t++) {
        valid[t] = !(t >= NI && t < NI + T && t - NI >= text_len);
        flags[t] = t == NI + T || t == NI + T + 1;
    }
    token_blocks(block, valid, flags, n);
    free(valid); free(flags);
}

typedef struct {
    int model, pass, B, NH, NKV, HS;
    int Tq, q0, Nk0, Nk1, Nt;                 // as GqaAttn (attention_smolvla.cu) takes them
    float *q, *k0, *v0, *k1, *v1, *dout;      // host copies of the inputs (rounded to floatX)
    int* block;                               // (B, Nt), NULL without a mask
    float *out, *lse;                         // host copies of the forward's O (floatX) and lse (fp32), or NULL
    floatX *d_q, *d_k0, *d_v0, *d_k1, *d_v1, *d_dout, *d_out;
    int* d_block;
    float* d_lse;
} Case;

// head g of key (or value) j of sample b on the host: from the first tensor or, past Nk0, the second
static const float* host_key(const Case* k, const float* x0, const float* x1, int b, int j, int g) {
    size_t row = j < k->Nk0 ? (size_t)b * k->Nk0 + j : (size_t)b * k->Nk1 + (j - k->Nk0);
    return (j < k->Nk0 ? x0 : x1) + row * k->NKV * k->HS + (size_t)g * k->HS;
}

static bool host_visible(const Case* k, int b, int i, int j) {
    if (k->block == NULL) { return true; }
    const int* blk = k->block + (size_t)b * k->Nt;
    return blk[j] >= 0 && blk[j] <= blk[k->q0 + i];
}

// the probabilities of one query row and head as LeRobot computes them: scores q.k / sqrt(HS),
// torch.where(mask, scores, finfo(float32).min), softmax. With no key visible every score is
// -FLT_MAX and the softmax is uniform (1/nk); otherwise exp(-FLT_MAX - max) is exactly 0 and *lse
// is the log-sum-exp of the visible scores. Returns whether any key is visible.
static bool reference_probs(const Case* k, int b, int h, int i, double* p, double* lse) {
    int nk = k->Nk0 + k->Nk1, g = h / (k->NH / k->NKV);
    const float* qi = k->q + ((size_t)b * k->Tq + i) * k->NH * k->HS + (size_t)h * k->HS;
    double scale = 1.0 / sqrt((double)k->HS), mx = -INFINITY;
    bool any = false;
    for (int j = 0; j < nk; j++) {
        const float* kj = host_key(k, k->k0, k->k1, b, j, g);
        double dot = 0.0;
        for (int c = 0; c < k->HS; c++) { dot += (double)qi[c] * kj[c]; }
        bool vis = host_visible(k, b, i, j);
        any |= vis;
        p[j] = vis ? dot * scale : -(double)FLT_MAX;
        mx = fmax(mx, p[j]);
    }
    double sum = 0.0;
    for (int j = 0; j < nk; j++) { p[j] = exp(p[j] - mx); sum += p[j]; }
    for (int j = 0; j < nk; j++) { p[j] /= sum; }
    *lse = mx + log(sum);
    return any;
}

// The forward in double: out (B, Tq, NH*HS), lse (B, NH, Tq) where some key is visible, and
// sees (B, NH, Tq): 1 there, 0 for rows that see no key (their lse, -FLT_MAX + log nk, is not
// what is checked: the kernels mark them, see attention_smolvla.cu).
static void forward_reference(const Case* k, double* out, double* lse, int* sees) {
    int nk = k->Nk0 + k->Nk1, D = k->NH * k->HS;
    double* p = (double*)mallocCheck((size_t)nk * sizeof(double));
    for (int b = 0; b < k->B; b++) {
        for (int h = 0; h < k->NH; h++) {
            int g = h / (k->NH / k->NKV);
            for (int i = 0; i < k->Tq; i++) {
                size_t stat = ((size_t)b * k->NH + h) * k->Tq + i;
                sees[stat] = reference_probs(k, b, h, i, p, &lse[stat]);
                double* o = out + ((size_t)b * k->Tq + i) * D + (size_t)h * k->HS;
                for (int c = 0; c < k->HS; c++) { o[c] = 0.0; }
                for (int j = 0; j < nk; j++) {
                    const float* vj = host_key(k, k->v0, k->v1, b, j, g);
                    for (int c = 0; c < k->HS; c++) { o[c] += p[j] * vj[c]; }
                }
            }
        }
    }
    free(p);
}

typedef struct {
    double* dq;                     // (B, Tq, NH*HS)
    double *dk0, *dv0, *dk1, *dv1;  // (B, Nk0, NKV*HS) x2, (B, Nk1, NKV*HS) x2
    double* delta;                  // (B, NH, Tq)
} Grads;

// The backward in double, as PyTorch's autograd takes eager_attention_forward apart: dV = P^T dO,
// dP = dO V^T, dS = P * (dP - delta) where the mask lets the score through and 0 where it does
// not (torch.where routes no gradient to the fill), dQ = scale dS K, dK = scale dS^T Q, summed
// over the query heads that share a key/value head (repeat_kv's expand). P is recomputed in
// double from the inputs; delta = rowsum(dO * O) from the O the device gets (floatX), as the
// kernels compute it, so the reference is the exact math of the device's inputs.
static Grads backward_reference(const Case* k) {
    int nk = k->Nk0 + k->Nk1, D = k->NH * k->HS, Dkv = k->NKV * k->HS;
    Grads g;
    g.dq = (double*)callocCheck((size_t)k->B * k->Tq * D, sizeof(double));
    g.dk0 = (double*)callocCheck((size_t)k->B * k->Nk0 * Dkv, sizeof(double));
    g.dv0 = (double*)callocCheck((size_t)k->B * k->Nk0 * Dkv, sizeof(double));
    g.dk1 = (double*)callocCheck((size_t)k->B * k->Nk1 * Dkv + 1, sizeof(double));
    g.dv1 = (double*)callocCheck((size_t)k->B * k->Nk1 * Dkv + 1, sizeof(double));
    g.delta = (double*)callocCheck((size_t)k->B * k->NH * k->Tq, sizeof(double));
    double scale = 1.0 / sqrt((double)k->HS);
    double* p = (double*)mallocCheck((size_t)nk * sizeof(double));
    for (int b = 0; b < k->B; b++) {
        for (int h = 0; h < k->NH; h++) {
            int gh = h / (k->NH / k->NKV);
            for (int i = 0; i < k->Tq; i++) {
                size_t row = ((size_t)b * k->Tq + i) * D + (size_t)h * k->HS;
                size_t stat = ((size_t)b * k->NH + h) * k->Tq + i;
                const float* qi = k->q + row;
                const float* doi = k->dout + row;
                double lse;
                reference_probs(k, b, h, i, p, &lse);
                double delta = 0.0;
                for (int c = 0; c < k->HS; c++) { delta += (double)doi[c] * k->out[row + c]; }
                g.delta[stat] = delta;
                for (int j = 0; j < nk; j++) {
                    const float* kj = host_key(k, k->k0, k->k1, b, j, gh);
                    const float* vj = host_key(k, k->v0, k->v1, b, j, gh);
                    size_t key = j < k->Nk0 ? (size_t)b * k->Nk0 + j : (size_t)b * k->Nk1 + (j - k->Nk0);
                    size_t krow = key * Dkv + (size_t)gh * k->HS;
                    double* dkj = (j < k->Nk0 ? g.dk0 : g.dk1) + krow;
                    double* dvj = (j < k->Nk0 ? g.dv0 : g.dv1) + krow;
                    double dp = 0.0;
                    for (int c = 0; c < k->HS; c++) { dp += (double)doi[c] * vj[c]; }
                    double ds = host_visible(k, b, i, j) ? p[j] * (dp - delta) * scale : 0.0;
                    for (int c = 0; c < k->HS; c++) {
                        g.dq[row + c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                        dvj[c] += p[j] * doi[c];
                    }
                }
            }
        }
    }
    free(p);
    return g;
}

static void free_grads(Grads* g) {
    free(g->dq); free(g->dk0); free(g->dv0); free(g->dk1); free(g->dv1); free(g->delta);
}

// A pass over SmolVLA's tokens: NI image tokens, T text tokens (the instruction lengths differ
// between samples, the rest pads), the state, H actions; pi0's: the same tokens, but its prefix is
// the images and the text and its suffix the state and the actions. PASS_VISION: NI tokens, no mask.
// PASS_RANDOM: NI+T+1+H tokens of random block ids (-1 .. 5, a pad one time in seven) and a last
// sample that is all pads; the queries are its tokens from a third on, the keys all of them.
static void case_shape(Case* k, int model, int pass, int NI, int T, int H) {
    int Np = model == MODEL_PI0 ? NI + T : NI + T + 1, Ns = NI + T + 1 + H - Np;  // prefix and suffix tokens
    k->model = model;
    k->pass = pass;
    k->Nt = Np + Ns;
    k->q0 = 0;
    k->Nk1 = 0;
    switch (pass) {
        case PASS_PREFIX: k->Tq = Np; k->Nk0 = Np; break;
        case PASS_JOINT_PREFIX: k->Tq = Np; k->Nk0 = Np; k->Nk1 = Ns; break;
        case PASS_JOINT_SUFFIX: k->Tq = Ns; k->q0 = Np; k->Nk0 = Np; k->Nk1 = Ns; break;
        case PASS_CROSS: k->Tq = Ns; k->q0 = Np; k->Nk0 = Np; break;
        case PASS_VISION: k->Nt = NI; k->Tq = NI; k->Nk0 = NI; break;
        default: k->q0 = k->Nt / 3; k->Tq = k->Nt - k->q0; k->Nk0 = k->Nt / 2; k->Nk1 = k->Nt - k->Nk0; break;
    }
}

// What make_case provides of the forward pass (O and lse), which the backward needs
enum { FORWARD_NONE = 0, FORWARD_HOST = 1 };

static floatX* device_copy_x(float* h, size_t n) { return n > 0 ? to_device_x(h, n) : NULL; }

static Case make_case(int model, int pass, int B, int NH, int NKV, int HS, int NI, int T, int H, int forward,
                      uint64_t seed) {
    Case k;
    memset(&k, 0, sizeof(k));
    k.B = B; k.NH = NH; k.NKV = NKV; k.HS = HS;
    case_shape(&k, model, pass, NI, T, H);
    int D = NH * HS, Dkv = NKV * HS;
    size_t n_q = (size_t)B * k.Tq * D, n_k0 = (size_t)B * k.Nk0 * Dkv, n_k1 = (size_t)B * k.Nk1 * Dkv;
    k.q = random_floats(n_q, 2.0f, seed);
    k.k0 = random_floats(n_k0, 2.0f, seed + 1);
    k.v0 = random_floats(n_k0, 1.0f, seed + 2);
    k.k1 = random_floats(n_k1 + 1, 2.0f, seed + 3);
    k.v1 = random_floats(n_k1 + 1, 1.0f, seed + 4);
    k.dout = random_floats(n_q, 1.0f, seed + 5);
    if (pass != PASS_VISION) {
        k.block = (int*)mallocCheck((size_t)B * k.Nt * sizeof(int));
        Rng r;
        rng_init(&r, seed + 6, 7);
        for (int b = 0; b < B; b++) {
            int* blk = k.block + (size_t)b * k.Nt;
            if (pass != PASS_RANDOM) {
                int text_len = 1 + (b * 7 + 3) % T;  // instructions of different lengths
                if (model == MODEL_PI0) {
                    pi0_token_blocks(blk, NI, T, text_len, H);
                } else {
                    flow_token_blocks(blk, NI, T, text_len, H);
                }
            } else {
                for (int t = 0; t < k.Nt; t++) {
                    blk[t] = (B > 1 && b == B - 1) ? -1 : (int)(rng_uniform(&r) * 7.0) - 1;
                }
            }
        }
        k.d_block = to_device_i(k.block, (size_t)B * k.Nt);
    }
    k.d_q = device_copy_x(k.q, n_q);
    k.d_k0 = device_copy_x(k.k0, n_k0);
    k.d_v0 = device_copy_x(k.v0, n_k0);
    k.d_k1 = device_copy_x(k.k1, n_k1);
    k.d_v1 = device_copy_x(k.v1, n_k1);
    k.d_dout = device_copy_x(k.dout, n_q);
    if (forward == FORWARD_HOST) {
        size_t n_lse = (size_t)B * NH * k.Tq;
        double* out = (double*)mallocCheck(n_q * sizeof(double));
        double* lse = (double*)mallocCheck(n_lse * sizeof(double));
        int* sees = (int*)mallocCheck(n_lse * sizeof(int));
        forward_reference(&k, out, lse, sees);
        k.out = (float*)mallocCheck(n_q * sizeof(float));
        k.lse = (float*)mallocCheck(n_lse * sizeof(float));
        for (size_t e = 0; e < n_q; e++) { k.out[e] = (float)out[e]; }
        for (size_t e = 0; e < n_lse; e++) { k.lse[e] = sees[e] ? (float)lse[e] : -FLT_MAX; }  // the kernels' mark
        k.d_out = to_device_x(k.out, n_q);  // rounds the host copy to floatX too
        k.d_lse = to_device_f(k.lse, n_lse);
        free(out); free(lse); free(sees);
    }
    return k;
}

static void free_case(Case* k) {
    free(k->q); free(k->k0); free(k->v0); free(k->k1); free(k->v1); free(k->dout); free(k->block);
    free(k->out); free(k->lse);
    cudaCheck(cudaFree(k->d_q)); cudaCheck(cudaFree(k->d_k0)); cudaCheck(cudaFree(k->d_v0));
    cudaCheck(cudaFree(k->d_k1)); cudaCheck(cudaFree(k->d_v1)); cudaCheck(cudaFree(k->d_dout));
    cudaCheck(cudaFree(k->d_out)); cudaCheck(cudaFree(k->d_block)); cudaCheck(cudaFree(k->d_lse));
}

#endif  // DEV_CUDA_ATTENTION_SMOLVLA_CASE_H
