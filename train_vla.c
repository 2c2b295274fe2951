/*
train_vla.c: the CPU reference trainer of a pi0-style Vision-Language-Action policy, in C with
OpenMP. Same model, same sections and same checkpoints as train_vla.cu; the PyTorch oracle
(dev/model.py) is the third, independent copy that test_vla.c checks both against.

Tensor-shape legend:
  B   samples (per rank)           L   layers (both stacks)
  Np  prefix tokens                 Ns  suffix tokens = 1 + H (state, H actions)
  T   Np + Ns                       d / da   VLM / expert width
  f / fa  MLP widths                NH, HS  heads, head size; D = NH*HS
  H   chunk length                  A / S   action / state dims
  PD  3*p*p pixels per patch        NI  image tokens (cameras x patches per camera)

Invariants worth knowing before reading:
- Prefix queries never see the suffix, so the prefix stack runs first, all layers, caching its
  keys and values; the suffix stack then attends to [cached prefix K/V, its own K/V]. Inference
  reuses the cache across its 10 Euler steps. Backward runs the suffix first, which deposits
  gradients into the prefix K/V of every layer, then the prefix.
- The prefix's output after the last layer feeds nothing: its last layer computes ln1, k, v only.
- Linear weights are (out, in); y = x W^T + b, as torch.nn.Linear.
- Loss = sum over unmasked (sample, slot, dim) of (v - u)^2 / (B H A): the mean over ranks of
  per-rank losses is the global loss, so simulated ranks (-g N) average gradients like DDP.

Reproduce the oracle's numbers (what test_vla checks):
  make test    (runs data/synthetic, then /usr/bin/python3 dev/model.py ... --debug-state, then ./test_vla)
*/
#include "vla.h"
#include <omp.h>
#include <signal.h>

// ----------------------------------------------------------------------------
// utilities

static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static inline float gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

// ----------------------------------------------------------------------------
// kernels: forward and backward of every operation. Backward kernels accumulate (+=) into
// parameter gradients and into input gradients unless said otherwise.

// C (M, N) += A (M, K) @ B (K, N), row-major. Register tiles of GEMM_TM x GEMM_TN outputs: per k,
// GEMM_TM broadcasts of A times one row segment of B, so every load feeds GEMM_TM FMAs.
// 6 x 32 measured fastest on the 2-core AVX-512 dev machine (dev/cuda will hold GPU variants).
#define GEMM_TM 6
#define GEMM_TN 32
static void gemm_acc(float* C, const float* A, const float* B, int M, int K, int N) {
    int mt = (M + GEMM_TM - 1) / GEMM_TM, nt = (N + GEMM_TN - 1) / GEMM_TN;
    #pragma omp parallel for schedule(static)
    for (int tile = 0; tile < mt * nt; tile++) {
        int m0 = (tile / nt) * GEMM_TM, n0 = (tile % nt) * GEMM_TN;
        if (m0 + GEMM_TM <= M && n0 + GEMM_TN <= N) {
            float acc[GEMM_TM][GEMM_TN];
            memset(acc, 0, sizeof(acc));
            for (int k = 0; k < K; k++) {
                const float* b = B + (size_t)k * N + n0;
                for (int i = 0; i < GEMM_TM; i++) {
                    float a = A[(size_t)(m0 + i) * K + k];
                    #pragma omp simd
                    for (int j = 0; j < GEMM_TN; j++) { acc[i][j] += a * b[j]; }
                }
            }
            for (int i = 0; i < GEMM_TM; i++) {
                float* c = C + (size_t)(m0 + i) * N + n0;
                for (int j = 0; j < GEMM_TN; j++) { c[j] += acc[i][j]; }
            }
        } else {  // a ragged edge tile
            int m1 = m0 + GEMM_TM < M ? m0 + GEMM_TM : M, n1 = n0 + GEMM_TN < N ? n0 + GEMM_TN : N;
            for (int i = m0; i < m1; i++) {
                for (int j = n0; j < n1; j++) {
                    float s = 0.0f;
                    for (int k = 0; k < K; k++) { s += A[(size_t)i * K + k] * B[(size_t)k * N + j]; }
                    C[(size_t)i * N + j] += s;
                }
            }
        }
    }
}

// out (R, C) = in (C, R)^T, into a scratch buffer that grows as needed (calls are sequential)
static float* transpose_scratch(const float* in, int C, int R) {
    static float* buf = NULL;
    static size_t cap = 0;
    size_t n = (size_t)C * R;
    if (n > cap) {
        free(buf);
        buf = (float*)mallocCheck(n * sizeof(float));
        cap = n;
    }
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) { buf[(size_t)r * C + c] = in[(size_t)c * R + r]; }
    }
    return buf;
}

// out (N, OC) = inp (N, C) @ w (OC, C)^T + bias (OC)
static void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) { out[(size_t)n * OC + o] = bias != NULL ? bias[o] : 0.0f; }
    }
    gemm_acc(out, inp, transpose_scratch(w, OC, C), N, C, OC);
}

// dinp (N, C) += dout @ w; dw (OC, C) += dout^T @ inp; db (OC) += column sums. dinp, db may be NULL.
static void matmul_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                            const float* w, int N, int C, int OC) {
    if (dinp != NULL) { gemm_acc(dinp, dout, w, N, OC, C); }
    gemm_acc(dw, transpose_scratch(dout, N, OC), inp, OC, N, C);
    if (db != NULL) {
        for (int n = 0; n < N; n++) {
            for (int o = 0; o < OC; o++) { db[o] += dout[(size_t)n * OC + o]; }
        }
    }
}

// out = x / sqrt(mean(x^2) + eps) * w, per row of C
static void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) { ss += x[c] * x[c]; }
        float r = 1.0f / sqrtf(ss / (float)C + 1e-6f);
        rstd[n] = r;
        float* y = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { y[c] = x[c] * r * w[c]; }
    }
}

// y_c = x_c r w_c with r = (mean x^2 + eps)^-1/2, so
// dx_c = r w_c dy_c - x_c r^3 / C * sum_j dy_j w_j x_j  and  dw_c = sum_rows dy_c x_c r.
static void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        float r = rstd[n];
        float dot = 0.0f;
        for (int c = 0; c < C; c++) { dot += dy[c] * w[c] * x[c]; }
        float k = dot * r * r * r / (float)C;
        float* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) { dx[c] += r * w[c] * dy[c] - k * x[c]; }
    }
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) { s += dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n]; }
        dw[c] += s;
    }
}

// RoPE, rotate-half, in place on x (B, Tg, NH*HS); row i of a sample sits at position pos0 + i.
// Backward is the same rotation by the negative angle (sign = -1).
static void rope_rotate(float* x, const float* cos_t, const float* sin_t, int B, int Tg, int pos0, int NH, int HS, float sign) {
    int half = HS / 2;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Tg; i++) {
            const float* cs = cos_t + (size_t)(pos0 + i) * half;
            const float* sn = sin_t + (size_t)(pos0 + i) * half;
            float* row = x + ((size_t)b * Tg + i) * NH * HS;
            for (int h = 0; h < NH; h++) {
                float* v = row + h * HS;
                for (int k = 0; k < half; k++) {
                    float x1 = v[k], x2 = v[k + half], s = sign * sn[k];
                    v[k] = x1 * cs[k] - x2 * s;
                    v[k + half] = x2 * cs[k] + x1 * s;
                }
            }
        }
    }
}

// Joint attention under the block mask. Queries are the prefix (suffix = 0: keys are the valid
// prefix) or the suffix (suffix = 1: keys are the valid prefix, the state token, and for action
// queries every action token). q/out (B, Tq, D), kp/vp (B, Np, D), ks/vs (B, Ns, D),
// key_valid (B, Np), lse (B, NH, Tq) saved for the backward pass.
typedef struct {
    int B, NH, HS, Np, Ns;
    const float* kp; const float* vp; const float* key_valid;
    const float* ks; const float* vs;  // NULL for the prefix pass
} AttnKeys;

static inline int attn_n_keys(const AttnKeys* a, int i) {
    return a->Np + (a->ks == NULL ? 0 : (i == 0 ? 1 : a->Ns));
}
static inline const float* attn_key(const AttnKeys* a, const float* pfx, const float* sfx, int b, int j) {
    int D = a->NH * a->HS;
    return j < a->Np ? pfx + ((size_t)b * a->Np + j) * D : sfx + ((size_t)b * a->Ns + (j - a->Np)) * D;
}

static void attention_forward(float* out, float* lse, const float* q, int Tq, const AttnKeys* a) {
    int NH = a->NH, HS = a->HS, D = NH * HS;
    float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < Tq; i++) {
                float scores[a->Np + a->Ns];
                const float* qi = q + ((size_t)b * Tq + i) * D + h * HS;
                int nk = attn_n_keys(a, i);
                float mx = -INFINITY;
                for (int j = 0; j < nk; j++) {
                    if (j < a->Np && a->key_valid[(size_t)b * a->Np + j] == 0.0f) { scores[j] = -INFINITY; continue; }
                    const float* kj = attn_key(a, a->kp, a->ks, b, j) + h * HS;
                    float s = 0.0f;
                    for (int c = 0; c < HS; c++) { s += qi[c] * kj[c]; }
                    scores[j] = s * scale;
                    if (scores[j] > mx) { mx = scores[j]; }
                }
                float sum = 0.0f;
                for (int j = 0; j < nk; j++) {
                    scores[j] = expf(scores[j] - mx);  // masked keys: exp(-inf) = 0
                    sum += scores[j];
                }
                float* oi = out + ((size_t)b * Tq + i) * D + h * HS;
                for (int c = 0; c < HS; c++) { oi[c] = 0.0f; }
                for (int j = 0; j < nk; j++) {
                    if (scores[j] == 0.0f) { continue; }
                    const float* vj = attn_key(a, a->vp, a->vs, b, j) + h * HS;
                    float p = scores[j] / sum;
                    for (int c = 0; c < HS; c++) { oi[c] += p * vj[c]; }
                }
                lse[((size_t)b * NH + h) * Tq + i] = mx + logf(sum);
            }
        }
    }
}

// Recomputes the probabilities from lse. With P = softmax(S), O = P V:
// dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K * scale, dK += dS^T Q * scale.
// dq is overwritten; dkp/dvp (prefix) and dks/dvs (suffix) accumulate. Parallel over (b, h) so
// every thread owns its key-gradient slices.
static void attention_backward(float* dq, float* dkp, float* dvp, float* dks, float* dvs, const float* dout,
                               const float* q, const float* out, const float* lse, int Tq, const AttnKeys* a) {
    int NH = a->NH, HS = a->HS, D = NH * HS;
    float scale = 1.0f / sqrtf((float)HS);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < Tq; i++) {
                size_t row = ((size_t)b * Tq + i) * D + h * HS;
                const float* qi = q + row;
                const float* doi = dout + row;
                const float* oi = out + row;
                float* dqi = dq + row;
                float l = lse[((size_t)b * NH + h) * Tq + i];
                float delta = 0.0f;
                for (int c = 0; c < HS; c++) { delta += doi[c] * oi[c]; dqi[c] = 0.0f; }
                int nk = attn_n_keys(a, i);
                for (int j = 0; j < nk; j++) {
                    if (j < a->Np && a->key_valid[(size_t)b * a->Np + j] == 0.0f) { continue; }
                    const float* kj = attn_key(a, a->kp, a->ks, b, j) + h * HS;
                    const float* vj = attn_key(a, a->vp, a->vs, b, j) + h * HS;
                    float* dkj = (float*)attn_key(a, dkp, dks, b, j) + h * HS;
                    float* dvj = (float*)attn_key(a, dvp, dvs, b, j) + h * HS;
                    float s = 0.0f, dp = 0.0f;
                    for (int c = 0; c < HS; c++) { s += qi[c] * kj[c]; dp += doi[c] * vj[c]; }
                    float p = expf(s * scale - l);
                    float ds = p * (dp - delta) * scale;
                    for (int c = 0; c < HS; c++) {
                        dqi[c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                        dvj[c] += p * doi[c];
                    }
                }
            }
        }
    }
}

// act = gelu_tanh(gate) * up
static void geglu_forward(float* act, const float* gate, const float* up, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { act[i] = gelu_tanh(gate[i]) * up[i]; }
}

// dgate, dup are overwritten
static void geglu_backward(float* dgate, float* dup, const float* dact, const float* gate, const float* up, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        dgate[i] = dact[i] * up[i] * gelu_tanh_grad(gate[i]);
        dup[i] = dact[i] * gelu_tanh(gate[i]);
    }
}

// pixels u8 (B, cam, img, img, 3) -> patches (B, cam * np, p*p*3) as x/127.5 - 1, patch-major,
// then pixel row, pixel column, channel
static void patchify(float* patches, const uint8_t* images, int B, int n_cam, int img, int p) {
    int g = img / p, pd = 3 * p * p;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int cam = 0; cam < n_cam; cam++) {
            const uint8_t* im = images + ((size_t)b * n_cam + cam) * img * img * 3;
            for (int pr = 0; pr < g; pr++) {
                for (int pc = 0; pc < g; pc++) {
                    float* dst = patches + (((size_t)b * n_cam + cam) * g * g + pr * g + pc) * pd;
                    for (int y = 0; y < p; y++) {
                        const uint8_t* src = im + ((size_t)(pr * p + y) * img + pc * p) * 3;
                        for (int k = 0; k < 3 * p; k++) { dst[y * 3 * p + k] = (float)src[k] / 127.5f - 1.0f; }
                    }
                }
            }
        }
    }
}

// Sinusoidal embedding of the flow time: da values, half sin half cos, periods geometric from
// 4e-3 to 4.0. Computed in double from the float t, as the oracle does.
static void time_embedding(float* out, float t, int da) {
    int half = da / 2;
    for (int k = 0; k < half; k++) {
        double fraction = half > 1 ? (double)k / (double)(half - 1) : 0.0;
        double period = 4e-3 * pow(4.0 / 4e-3, fraction);
        double angle = 2.0 * 3.141592653589793 * (double)t / period;
        out[k] = (float)sin(angle);
        out[half + k] = (float)cos(angle);
    }
}

// ----------------------------------------------------------------------------
// model

static inline int imax(int a, int b) { return a > b ? a : b; }
// rows per sample of the longer stack: backward scratch serves both
static inline size_t max_rows(const VLAConfig* c) { return (size_t)imax(vla_n_prefix(c), vla_n_suffix(c)); }

// Activations: one table (name, elements) carved from one allocation, like the parameters.
// Prefix rows P = B*Np, suffix rows Q = B*Ns, action rows R = B*H.
#define VLA_ACTIVATIONS(X, c, B) \
    X(key_valid, (size_t)(B) * vla_n_prefix(c))                                      /* (B, Np) */ \
    X(patches,   (size_t)(B) * vla_n_image_tokens(c) * vla_patch_dim(c))             /* (B, NI, PD) */ \
    X(p_res,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_model)        /* (L, P, d) layer inputs */ \
    X(p_mid,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_model)        /* (L, P, d) after attention */ \
    X(p_ln1,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_model)        /* (L, P, d) */ \
    X(p_rstd1,   (size_t)(c)->n_layer * (B) * vla_n_prefix(c))                       /* (L, P) */ \
    X(p_q,       (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) after RoPE */ \
    X(p_k,       (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) after RoPE */ \
    X(p_v,       (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) */ \
    X(p_att,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) */ \
    X(p_lse,     (size_t)(c)->n_layer * (B) * (c)->n_head * vla_n_prefix(c))         /* (L, B, NH, Np) */ \
    X(p_ln2,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_model)        /* (L, P, d) */ \
    X(p_rstd2,   (size_t)(c)->n_layer * (B) * vla_n_prefix(c))                       /* (L, P) */ \
    X(p_gate,    (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_ff)           /* (L, P, f) */ \
    X(p_up,      (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_ff)           /* (L, P, f) */ \
    X(p_act,     (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * (c)->d_ff)           /* (L, P, f) */ \
    X(x_t,       (size_t)(B) * (c)->chunk * (c)->action_dim)                         /* (B, H, A) */ \
    X(a_in,      (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) action_in(x_t) */ \
    X(a_emb,     (size_t)(B) * (c)->chunk * 2 * (c)->d_expert)                       /* (R, 2da) [action_in(x_t), time emb] */ \
    X(t_pre,     (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) before SiLU */ \
    X(t_act,     (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) after SiLU */ \
    X(s_res,     (size_t)((c)->n_layer + 1) * (B) * vla_n_suffix(c) * (c)->d_expert) /* (L+1, Q, da) */ \
    X(s_mid,     (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert)       /* (L, Q, da) */ \
    X(s_ln1,     (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert)       /* (L, Q, da) */ \
    X(s_rstd1,   (size_t)(c)->n_layer * (B) * vla_n_suffix(c))                       /* (L, Q) */ \
    X(s_q,       (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * vla_d_attn(c))       /* (L, Q, D) */ \
    X(s_k,       (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * vla_d_attn(c))       /* (L, Q, D) */ \
    X(s_v,       (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * vla_d_attn(c))       /* (L, Q, D) */ \
    X(s_att,     (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * vla_d_attn(c))       /* (L, Q, D) */ \
    X(s_lse,     (size_t)(c)->n_layer * (B) * (c)->n_head * vla_n_suffix(c))         /* (L, B, NH, Ns) */ \
    X(s_ln2,     (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert)       /* (L, Q, da) */ \
    X(s_rstd2,   (size_t)(c)->n_layer * (B) * vla_n_suffix(c))                       /* (L, Q) */ \
    X(s_gate,    (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert_ff)    /* (L, Q, fa) */ \
    X(s_up,      (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert_ff)    /* (L, Q, fa) */ \
    X(s_act,     (size_t)(c)->n_layer * (B) * vla_n_suffix(c) * (c)->d_expert_ff)    /* (L, Q, fa) */ \
    X(f_in,      (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) action rows of the last layer */ \
    X(f_ln,      (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) */ \
    X(f_rstd,    (size_t)(B) * (c)->chunk)                                           /* (R) */ \
    X(v_pred,    (size_t)(B) * (c)->chunk * (c)->action_dim)                         /* (B, H, A) */ \
    /* backward scratch */ \
    X(dp_k,      (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) from both passes */ \
    X(dp_v,      (size_t)(c)->n_layer * (B) * vla_n_prefix(c) * vla_d_attn(c))       /* (L, P, D) */ \
    X(d_vpred,   (size_t)(B) * (c)->chunk * (c)->action_dim)                         /* (B, H, A) */ \
    X(d_res,     (size_t)(B) * max_rows(c) * (size_t)imax((c)->d_model, (c)->d_expert)) /* residual of either stack */ \
    X(d_ln,      (size_t)(B) * max_rows(c) * (size_t)imax((c)->d_model, (c)->d_expert)) \
    X(d_att,     (size_t)(B) * max_rows(c) * vla_d_attn(c)) \
    X(d_q,       (size_t)(B) * max_rows(c) * vla_d_attn(c)) \
    X(d_k,       (size_t)(B) * vla_n_suffix(c) * vla_d_attn(c)) \
    X(d_v,       (size_t)(B) * vla_n_suffix(c) * vla_d_attn(c)) \
    X(d_act,     (size_t)(B) * max_rows(c) * (size_t)imax((c)->d_ff, (c)->d_expert_ff)) \
    X(d_gate,    (size_t)(B) * max_rows(c) * (size_t)imax((c)->d_ff, (c)->d_expert_ff)) \
    X(d_up,      (size_t)(B) * max_rows(c) * (size_t)imax((c)->d_ff, (c)->d_expert_ff)) \
    X(d_emb,     (size_t)(B) * (c)->chunk * 2 * (c)->d_expert)                       /* (R, 2da) */ \
    X(d_tmp,     (size_t)(B) * (c)->chunk * (c)->d_expert)                           /* (R, da) */

typedef struct {
#define ACT_FIELD_(nm, n) float* nm;
    VLA_ACTIVATIONS(ACT_FIELD_, c, B)
#undef ACT_FIELD_
} Activations;

typedef struct {
    VLAConfig config;
    ParamTable table;
    float* params_memory;  // (n_params) fp32 master weights, which the CPU also computes with
    float* grads_memory;   // (n_params)
    float* m_memory;       // (n_params) AdamW first moment
    float* v_memory;       // (n_params) AdamW second moment
    ParameterTensors params, grads;
    int B;                 // batch the activations are sized for
    float* acts_memory;
    Activations acts;
    float* rope_cos;       // (T, HS/2)
    float* rope_sin;       // (T, HS/2)
    float loss;
} Model;

static void model_build(Model* m, const VLAConfig* c) {
    memset(m, 0, sizeof(*m));
    const char* problem = vla_config_problem(c);
    if (problem != NULL) { vla_fail("bad model config: %s", problem); }
    m->config = *c;
    param_table_build(c, &m->table);
    size_t n = m->table.total;
    m->params_memory = (float*)callocCheck(n, sizeof(float));
    m->grads_memory = (float*)callocCheck(n, sizeof(float));
    m->m_memory = (float*)callocCheck(n, sizeof(float));
    m->v_memory = (float*)callocCheck(n, sizeof(float));
    param_tensors_point(&m->params, m->params_memory, &m->table);
    param_tensors_point(&m->grads, m->grads_memory, &m->table);
    int T = vla_n_tokens(c), half = c->head_dim / 2;
    m->rope_cos = (float*)mallocCheck((size_t)T * half * sizeof(float));
    m->rope_sin = (float*)mallocCheck((size_t)T * half * sizeof(float));
    for (int pos = 0; pos < T; pos++) {
        for (int k = 0; k < half; k++) {
            double angle = pos * pow((double)c->rope_theta, -2.0 * k / (double)c->head_dim);
            m->rope_cos[pos * half + k] = (float)cos(angle);
            m->rope_sin[pos * half + k] = (float)sin(angle);
        }
    }
}

// (Re)sizes the activations for B samples.
static void model_set_batch(Model* m, int B) {
    if (m->B == B) { return; }
    free(m->acts_memory);
    const VLAConfig* c = &m->config;
    size_t total = 0;
#define ACT_SIZE_(nm, n) total += (n);
    VLA_ACTIVATIONS(ACT_SIZE_, c, B)
#undef ACT_SIZE_
    m->acts_memory = (float*)callocCheck(total, sizeof(float));
    float* p = m->acts_memory;
#define ACT_POINT_(nm, n) m->acts.nm = p; p += (n);
    VLA_ACTIVATIONS(ACT_POINT_, c, B)
#undef ACT_POINT_
    m->B = B;
}

static void model_free(Model* m) {
    free(m->params_memory); free(m->grads_memory); free(m->m_memory); free(m->v_memory);
    free(m->acts_memory); free(m->rope_cos); free(m->rope_sin);
}

// One stack's tensors at one layer: weights (or their gradients) and the widths.
typedef struct {
    float *ln1, *wq, *wk, *wv, *wo, *ln2, *wgate, *wup, *wdown;
    int C, F;  // width, MLP width
} LayerParams;

static LayerParams layer_params(const ParameterTensors* p, const VLAConfig* c, int expert, int l) {
    int C = expert ? c->d_expert : c->d_model, F = expert ? c->d_expert_ff : c->d_ff;
    size_t D = (size_t)vla_d_attn(c);
    LayerParams w = {expert ? p->exp_ln1 : p->vlm_ln1, expert ? p->exp_wq : p->vlm_wq, expert ? p->exp_wk : p->vlm_wk,
                     expert ? p->exp_wv : p->vlm_wv, expert ? p->exp_wo : p->vlm_wo, expert ? p->exp_ln2 : p->vlm_ln2,
                     expert ? p->exp_wgate : p->vlm_wgate, expert ? p->exp_wup : p->vlm_wup,
                     expert ? p->exp_wdown : p->vlm_wdown, C, F};
    w.ln1 += (size_t)l * C; w.ln2 += (size_t)l * C;
    w.wq += l * D * C; w.wk += l * D * C; w.wv += l * D * C; w.wo += l * C * D;
    w.wgate += (size_t)l * F * C; w.wup += (size_t)l * F * C; w.wdown += (size_t)l * C * F;
    return w;
}

// One stack's activations at one layer, for N = B * Tg rows.
typedef struct {
    float *res, *ln1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *rstd2, *gate, *up, *act, *out;
} LayerActs;

static LayerActs layer_acts(Activations* a, const VLAConfig* c, int B, int expert, int l) {
    int Tg = expert ? vla_n_suffix(c) : vla_n_prefix(c);
    size_t N = (size_t)B * Tg, C = expert ? c->d_expert : c->d_model, F = expert ? c->d_expert_ff : c->d_ff;
    size_t D = (size_t)vla_d_attn(c);
    LayerActs x;
    if (expert) {
        x = (LayerActs){a->s_res, a->s_ln1, a->s_rstd1, a->s_q, a->s_k, a->s_v, a->s_att, a->s_lse, a->s_mid,
                        a->s_ln2, a->s_rstd2, a->s_gate, a->s_up, a->s_act, a->s_res};
    } else {
        x = (LayerActs){a->p_res, a->p_ln1, a->p_rstd1, a->p_q, a->p_k, a->p_v, a->p_att, a->p_lse, a->p_mid,
                        a->p_ln2, a->p_rstd2, a->p_gate, a->p_up, a->p_act, a->p_res};
    }
    x.res += l * N * C; x.ln1 += l * N * C; x.rstd1 += l * N;
    x.q += l * N * D; x.k += l * N * D; x.v += l * N * D; x.att += l * N * D; x.lse += l * N * c->n_head;
    x.mid += l * N * C; x.ln2 += l * N * C; x.rstd2 += l * N;
    x.gate += l * N * F; x.up += l * N * F; x.act += l * N * F;
    x.out += (l + 1) * N * C;  // the next layer's input (the prefix's last layer has none: never written)
    return x;
}

// ln1, then q (unless x->q is NULL), k, v with RoPE at sequence positions pos0 ...
static void layer_qkv_forward(const Model* m, const LayerParams* w, const LayerActs* x, int B, int Tg, int pos0, int with_q) {
    const VLAConfig* c = &m->config;
    int N = B * Tg, D = vla_d_attn(c);
    rmsnorm_forward(x->ln1, x->rstd1, x->res, w->ln1, N, w->C);
    matmul_forward(x->k, x->ln1, w->wk, NULL, N, w->C, D);
    matmul_forward(x->v, x->ln1, w->wv, NULL, N, w->C, D);
    rope_rotate(x->k, m->rope_cos, m->rope_sin, B, Tg, pos0, c->n_head, c->head_dim, 1.0f);
    if (with_q) {
        matmul_forward(x->q, x->ln1, w->wq, NULL, N, w->C, D);
        rope_rotate(x->q, m->rope_cos, m->rope_sin, B, Tg, pos0, c->n_head, c->head_dim, 1.0f);
    }
}

// attention output -> wo, residual -> ln2 -> GeGLU MLP, residual: x->out
static void layer_out_forward(const LayerParams* w, const LayerActs* x, int N, int D) {
    matmul_forward(x->mid, x->att, w->wo, NULL, N, D, w->C);
    for (size_t i = 0; i < (size_t)N * w->C; i++) { x->mid[i] += x->res[i]; }
    rmsnorm_forward(x->ln2, x->rstd2, x->mid, w->ln2, N, w->C);
    matmul_forward(x->gate, x->ln2, w->wgate, NULL, N, w->C, w->F);
    matmul_forward(x->up, x->ln2, w->wup, NULL, N, w->C, w->F);
    geglu_forward(x->act, x->gate, x->up, (size_t)N * w->F);
    matmul_forward(x->out, x->act, w->wdown, NULL, N, w->F, w->C);
    for (size_t i = 0; i < (size_t)N * w->C; i++) { x->out[i] += x->mid[i]; }
}

// Prefix stack: images and text through all L VLM layers; leaves K/V of every layer in acts.
static void prefix_forward(Model* m, const Batch* batch) {
    const VLAConfig* c = &m->config;
    const ParameterTensors* w = &m->params;
    Activations* a = &m->acts;
    int B = batch->B, L = c->n_layer, d = c->d_model, D = vla_d_attn(c);
    int NI = vla_n_image_tokens(c), Np = vla_n_prefix(c);
    // embeddings: patches through patch_w plus position, text bytes through text_emb
    patchify(a->patches, batch->images, B, c->n_cam, c->img, c->patch);
    for (int b = 0; b < B; b++) {
        float* x = a->p_res + (size_t)b * Np * d;
        matmul_forward(x, a->patches + (size_t)b * NI * vla_patch_dim(c), w->patch_w, w->patch_b, NI, vla_patch_dim(c), d);
        for (int i = 0; i < NI; i++) {
            for (int k = 0; k < d; k++) { x[(size_t)i * d + k] += w->pos_emb[(size_t)i * d + k]; }
            a->key_valid[(size_t)b * Np + i] = 1.0f;
        }
        for (int i = 0; i < c->max_text; i++) {
            memcpy(x + (size_t)(NI + i) * d, w->text_emb + (size_t)batch->text[(size_t)b * c->max_text + i] * d, d * sizeof(float));
            a->key_valid[(size_t)b * Np + NI + i] = batch->text_mask[(size_t)b * c->max_text + i];
        }
    }
    AttnKeys keys = {B, c->n_head, c->head_dim, Np, vla_n_suffix(c), NULL, NULL, a->key_valid, NULL, NULL};
    for (int l = 0; l < L; l++) {
        LayerParams lw = layer_params(w, c, 0, l);
        LayerActs x = layer_acts(a, c, B, 0, l);
        int last = l == L - 1;  // the last layer's prefix output feeds nothing: only k and v
        layer_qkv_forward(m, &lw, &x, B, Np, 0, !last);
        if (last) { break; }
        keys.kp = x.k; keys.vp = x.v;
        attention_forward(x.att, x.lse, x.q, Np, &keys);
        layer_out_forward(&lw, &x, B * Np, D);
    }
}

// Suffix stack: state and noisy action tokens at flow time t (B), attending to the cached prefix.
// x_t (B, H, A) must be in acts.x_t. Writes velocities to acts.v_pred (B, H, A).
static void suffix_forward(Model* m, const float* state, const float* t, int B) {
    const VLAConfig* c = &m->config;
    const ParameterTensors* w = &m->params;
    Activations* a = &m->acts;
    int L = c->n_layer, da = c->d_expert, D = vla_d_attn(c), H = c->chunk;
    int Np = vla_n_prefix(c), Ns = vla_n_suffix(c), Q = B * Ns, R = B * H;
    // action tokens: [action_in(x_t), time embedding] -> time_in -> SiLU -> time_out
    matmul_forward(a->a_in, a->x_t, w->action_in_w, w->action_in_b, R, c->action_dim, da);
    for (int b = 0; b < B; b++) {
        float temb[da];
        time_embedding(temb, t[b], da);
        for (int h = 0; h < H; h++) {
            float* row = a->a_emb + ((size_t)b * H + h) * 2 * da;
            memcpy(row, a->a_in + ((size_t)b * H + h) * da, da * sizeof(float));
            memcpy(row + da, temb, da * sizeof(float));
        }
    }
    matmul_forward(a->t_pre, a->a_emb, w->time_in_w, w->time_in_b, R, 2 * da, da);
    for (size_t i = 0; i < (size_t)R * da; i++) { a->t_act[i] = silu(a->t_pre[i]); }
    for (int b = 0; b < B; b++) {
        float* x = a->s_res + (size_t)b * Ns * da;
        matmul_forward(x, state + (size_t)b * c->state_dim, w->state_w, w->state_b, 1, c->state_dim, da);
        matmul_forward(x + da, a->t_act + (size_t)b * H * da, w->time_out_w, w->time_out_b, H, da, da);
    }
    AttnKeys keys = {B, c->n_head, c->head_dim, Np, Ns, NULL, NULL, a->key_valid, NULL, NULL};
    for (int l = 0; l < L; l++) {
        LayerParams lw = layer_params(w, c, 1, l);
        LayerActs x = layer_acts(a, c, B, 1, l);
        layer_qkv_forward(m, &lw, &x, B, Ns, Np, 1);
        LayerActs px = layer_acts(a, c, B, 0, l);
        keys.kp = px.k; keys.vp = px.v; keys.ks = x.k; keys.vs = x.v;
        attention_forward(x.att, x.lse, x.q, Ns, &keys);
        layer_out_forward(&lw, &x, Q, D);
    }
    // velocities from the action tokens (the state token's output is not used)
    const float* last = a->s_res + (size_t)L * Q * da;
    for (int b = 0; b < B; b++) {
        memcpy(a->f_in + (size_t)b * H * da, last + ((size_t)b * Ns + 1) * da, (size_t)H * da * sizeof(float));
    }
    rmsnorm_forward(a->f_ln, a->f_rstd, a->f_in, w->final_norm, R, da);
    matmul_forward(a->v_pred, a->f_ln, w->action_out_w, w->action_out_b, R, da, c->action_dim);
}

// Flow-matching loss of a batch: x_t = t eps + (1 - t) a, target u = eps - a,
// loss = sum over unmasked slots of (v - u)^2 / (B H A). Runs the whole forward pass.
static float model_forward(Model* m, const Batch* batch) {
    const VLAConfig* c = &m->config;
    int B = batch->B, H = c->chunk, A = c->action_dim;
    model_set_batch(m, B);
    for (int b = 0; b < B; b++) {
        float t = batch->t[b];
        for (int i = 0; i < H * A; i++) {
            size_t k = (size_t)b * H * A + i;
            m->acts.x_t[k] = t * batch->eps[k] + (1.0f - t) * batch->actions[k];
        }
    }
    prefix_forward(m, batch);
    suffix_forward(m, batch->state, batch->t, B);
    double sum = 0.0;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            if (batch->action_mask[(size_t)b * H + h] == 0.0f) { continue; }
            for (int i = 0; i < A; i++) {
                size_t k = ((size_t)b * H + h) * A + i;
                float diff = m->acts.v_pred[k] - (batch->eps[k] - batch->actions[k]);
                sum += (double)diff * diff;
            }
        }
    }
    m->loss = (float)(sum / ((double)B * H * A));
    return m->loss;
}

// Backward of layer_out_forward. dres holds d(out) (N, C); on return it holds d(res) through the
// residual and ln2 only (the attention path is added by layer_qkv_backward), and a->d_att holds
// d(att).
static void layer_out_backward(Activations* a, const LayerParams* w, const LayerParams* g, const LayerActs* x,
                               float* dres, int N, int D) {
    memset(a->d_act, 0, (size_t)N * w->F * sizeof(float));
    matmul_backward(a->d_act, g->wdown, NULL, dres, x->act, w->wdown, N, w->F, w->C);
    geglu_backward(a->d_gate, a->d_up, a->d_act, x->gate, x->up, (size_t)N * w->F);
    memset(a->d_ln, 0, (size_t)N * w->C * sizeof(float));
    matmul_backward(a->d_ln, g->wgate, NULL, a->d_gate, x->ln2, w->wgate, N, w->C, w->F);
    matmul_backward(a->d_ln, g->wup, NULL, a->d_up, x->ln2, w->wup, N, w->C, w->F);
    rmsnorm_backward(dres, g->ln2, a->d_ln, x->mid, w->ln2, x->rstd2, N, w->C);  // dres is now d(mid)
    memset(a->d_att, 0, (size_t)N * D * sizeof(float));
    matmul_backward(a->d_att, g->wo, NULL, dres, x->att, w->wo, N, D, w->C);
}

// Backward of layer_qkv_forward: dq (NULL when q was not computed), dk, dv are gradients of the
// roped q/k and of v; they are rotated back in place, then d(res) through ln1 is added to dres.
static void layer_qkv_backward(const Model* m, Activations* a, const LayerParams* w, const LayerParams* g,
                               const LayerActs* x, float* dres, float* dq, float* dk, float* dv, int B, int Tg, int pos0) {
    const VLAConfig* c = &m->config;
    int N = B * Tg, D = vla_d_attn(c);
    memset(a->d_ln, 0, (size_t)N * w->C * sizeof(float));
    if (dq != NULL) {
        rope_rotate(dq, m->rope_cos, m->rope_sin, B, Tg, pos0, c->n_head, c->head_dim, -1.0f);
        matmul_backward(a->d_ln, g->wq, NULL, dq, x->ln1, w->wq, N, w->C, D);
    }
    rope_rotate(dk, m->rope_cos, m->rope_sin, B, Tg, pos0, c->n_head, c->head_dim, -1.0f);
    matmul_backward(a->d_ln, g->wk, NULL, dk, x->ln1, w->wk, N, w->C, D);
    matmul_backward(a->d_ln, g->wv, NULL, dv, x->ln1, w->wv, N, w->C, D);
    rmsnorm_backward(dres, g->ln1, a->d_ln, x->res, w->ln1, x->rstd1, N, w->C);
}

// Gradients of the last model_forward's loss into m->grads (overwritten).
static void model_backward(Model* m, const Batch* batch) {
    const VLAConfig* c = &m->config;
    const ParameterTensors* w = &m->params;
    ParameterTensors* g = &m->grads;
    Activations* a = &m->acts;
    int B = batch->B, L = c->n_layer, H = c->chunk, A = c->action_dim, D = vla_d_attn(c);
    int d = c->d_model, da = c->d_expert;
    int NI = vla_n_image_tokens(c), Np = vla_n_prefix(c), Ns = vla_n_suffix(c);
    int P = B * Np, Q = B * Ns, R = B * H;
    memset(m->grads_memory, 0, m->table.total * sizeof(float));
    memset(a->dp_k, 0, (size_t)L * P * D * sizeof(float));
    memset(a->dp_v, 0, (size_t)L * P * D * sizeof(float));

    // ---- suffix: loss -> velocities -> expert stack
    float* dv = a->d_vpred;
    float norm = 2.0f / ((float)B * H * A);
    for (int k = 0; k < R * A; k++) {
        float mask = batch->action_mask[k / A];
        dv[k] = mask * norm * (a->v_pred[k] - (batch->eps[k] - batch->actions[k]));
    }
    float* dfln = a->d_ln;
    memset(dfln, 0, (size_t)R * da * sizeof(float));
    matmul_backward(dfln, g->action_out_w, g->action_out_b, dv, a->f_ln, w->action_out_w, R, da, A);
    float* dres = a->d_res;  // (Q, da): gradient of the residual stream
    memset(dres, 0, (size_t)Q * da * sizeof(float));
    float* dfin = a->d_tmp;
    memset(dfin, 0, (size_t)R * da * sizeof(float));
    rmsnorm_backward(dfin, g->final_norm, dfln, a->f_in, w->final_norm, a->f_rstd, R, da);
    for (int b = 0; b < B; b++) {
        memcpy(dres + ((size_t)b * Ns + 1) * da, dfin + (size_t)b * H * da, (size_t)H * da * sizeof(float));
    }
    AttnKeys keys = {B, c->n_head, c->head_dim, Np, Ns, NULL, NULL, a->key_valid, NULL, NULL};
    for (int l = L - 1; l >= 0; l--) {
        LayerParams lw = layer_params(w, c, 1, l), lg = layer_params(g, c, 1, l);
        LayerActs x = layer_acts(a, c, B, 1, l), px = layer_acts(a, c, B, 0, l);
        layer_out_backward(a, &lw, &lg, &x, dres, Q, D);
        keys.kp = px.k; keys.vp = px.v; keys.ks = x.k; keys.vs = x.v;
        memset(a->d_k, 0, (size_t)Q * D * sizeof(float));
        memset(a->d_v, 0, (size_t)Q * D * sizeof(float));
        // the suffix attends to the prefix: its key/value gradients land in dp_k/dp_v of layer l
        attention_backward(a->d_q, a->dp_k + (size_t)l * P * D, a->dp_v + (size_t)l * P * D, a->d_k, a->d_v, a->d_att,
                           x.q, x.att, x.lse, Ns, &keys);
        layer_qkv_backward(m, a, &lw, &lg, &x, dres, a->d_q, a->d_k, a->d_v, B, Ns, Np);
    }
    // suffix embeddings: row 0 of each sample is the state token, rows 1..H the action tokens
    float* dtok = a->d_tmp;  // (R, da) action-token gradients
    for (int b = 0; b < B; b++) {
        matmul_backward(NULL, g->state_w, g->state_b, dres + (size_t)b * Ns * da, batch->state + (size_t)b * c->state_dim,
                        w->state_w, 1, c->state_dim, da);
        memcpy(dtok + (size_t)b * H * da, dres + ((size_t)b * Ns + 1) * da, (size_t)H * da * sizeof(float));
    }
    float* dtact = a->d_ln;
    memset(dtact, 0, (size_t)R * da * sizeof(float));
    matmul_backward(dtact, g->time_out_w, g->time_out_b, dtok, a->t_act, w->time_out_w, R, da, da);
    for (size_t i = 0; i < (size_t)R * da; i++) {  // silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
        float x = a->t_pre[i], s = 1.0f / (1.0f + expf(-x));
        dtact[i] *= s * (1.0f + x * (1.0f - s));
    }
    float* demb = a->d_emb;
    memset(demb, 0, (size_t)R * 2 * da * sizeof(float));
    matmul_backward(demb, g->time_in_w, g->time_in_b, dtact, a->a_emb, w->time_in_w, R, 2 * da, da);
    float* dain = a->d_tmp;  // only the action_in half has parameters behind it
    for (int r = 0; r < R; r++) { memcpy(dain + (size_t)r * da, demb + (size_t)r * 2 * da, da * sizeof(float)); }
    matmul_backward(NULL, g->action_in_w, g->action_in_b, dain, a->x_t, w->action_in_w, R, A, da);

    // ---- prefix: the suffix left gradients in dp_k/dp_v of every layer; the last layer's
    // prefix output is unused, so the residual gradient starts at zero
    dres = a->d_res;
    memset(dres, 0, (size_t)P * d * sizeof(float));
    keys.ks = NULL; keys.vs = NULL;
    for (int l = L - 1; l >= 0; l--) {
        LayerParams lw = layer_params(w, c, 0, l), lg = layer_params(g, c, 0, l);
        LayerActs x = layer_acts(a, c, B, 0, l);
        float* dk = a->dp_k + (size_t)l * P * D;
        float* dvv = a->dp_v + (size_t)l * P * D;
        float* dq = NULL;
        if (l < L - 1) {
            layer_out_backward(a, &lw, &lg, &x, dres, P, D);
            keys.kp = x.k; keys.vp = x.v;
            attention_backward(a->d_q, dk, dvv, NULL, NULL, a->d_att, x.q, x.att, x.lse, Np, &keys);
            dq = a->d_q;
        }
        layer_qkv_backward(m, a, &lw, &lg, &x, dres, dq, dk, dvv, B, Np, 0);
    }
    // prefix embeddings
    for (int b = 0; b < B; b++) {
        const float* dx = dres + (size_t)b * Np * d;
        matmul_backward(NULL, g->patch_w, g->patch_b, dx, a->patches + (size_t)b * NI * vla_patch_dim(c), w->patch_w,
                        NI, vla_patch_dim(c), d);
        for (size_t i = 0; i < (size_t)NI * d; i++) { g->pos_emb[i] += dx[i]; }
        for (int i = 0; i < c->max_text; i++) {
            float* row = g->text_emb + (size_t)batch->text[(size_t)b * c->max_text + i] * d;
            for (int k = 0; k < d; k++) { row[k] += dx[(size_t)(NI + i) * d + k]; }
        }
    }
}

// Euler integration of the learned velocity from noise (t = 1) to actions (t = 0), 10 steps,
// with the prefix computed once. eps (B, H, A) is the starting noise; out (B, H, A) is
// un-normalized with the dataset statistics (mean, std).
static void model_sample_actions(Model* m, const Batch* obs, const float* eps, const float* action_mean,
                                 const float* action_std, float* out) {
    const VLAConfig* c = &m->config;
    int B = obs->B, HA = c->chunk * c->action_dim, n_steps = 10;
    model_set_batch(m, B);
    prefix_forward(m, obs);
    memcpy(m->acts.x_t, eps, (size_t)B * HA * sizeof(float));
    float t[B];
    for (int k = 0; k < n_steps; k++) {
        for (int b = 0; b < B; b++) { t[b] = 1.0f - 0.1f * (float)k; }
        suffix_forward(m, obs->state, t, B);
        for (size_t i = 0; i < (size_t)B * HA; i++) { m->acts.x_t[i] -= 0.1f * m->acts.v_pred[i]; }
    }
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < HA; i++) {
            int dim = i % c->action_dim;
            out[(size_t)b * HA + i] = m->acts.x_t[(size_t)b * HA + i] * action_std[dim] + action_mean[dim];
        }
    }
}

// sum of squares in double: order-stable and exact enough
static double sum_squares(const float* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)g[i] * g[i]; }
    return s;
}

// AdamW (0.9, 0.95, 1e-8) on elements [first, first + n) of tensor t, gradients scaled by `scale`
static void adamw_range(Model* m, int t, size_t first, size_t n, float lr, float weight_decay, float scale, int step) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    const ParamSpec* s = &m->table.spec[t];
    float wd = s->decay ? weight_decay : 0.0f;
    float bc1 = 1.0f - powf(beta1, (float)(step + 1));
    float bc2 = 1.0f - powf(beta2, (float)(step + 1));
    float* p = m->params_memory + s->offset + first;
    const float* g = m->grads_memory + s->offset + first;
    float* mm = m->m_memory + s->offset + first;
    float* vv = m->v_memory + s->offset + first;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * scale;
        mm[i] = beta1 * mm[i] + (1.0f - beta1) * gi;
        vv[i] = beta2 * vv[i] + (1.0f - beta2) * gi * gi;
        float mhat = mm[i] / bc1, vhat = vv[i] / bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

// AdamW (0.9, 0.95, 1e-8) on fp32 master weights, decoupled decay on the tensors the table marks.
// Gradients are clipped to global norm `clip` first (0 disables). Returns the pre-clip norm.
// shards > 1 simulates ZeRO-1 over that many ranks as train_vla runs it: every rank updates only
// its shard of the flat buffer (zero_shard_size; a tensor may be split between ranks), and the
// global norm adds up the ranks' partial sums of squares.
static float model_update(Model* m, float lr, float weight_decay, float clip, int step, int shards) {
    size_t total = m->table.total, S = zero_shard_size(total, shards, 1);
    double squares = 0.0;  // with shards, each rank's sum added up as the all-reduce does
    for (int r = 0; r < shards; r++) {
        size_t lo = (size_t)r * S, hi = lo + S < total ? lo + S : total;
        if (lo < hi) { squares += sum_squares(m->grads_memory + lo, hi - lo); }
    }
    float norm = (float)sqrt(squares);
    float scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    for (int r = 0; r < shards; r++) {
        size_t lo = (size_t)r * S, hi = lo + S;
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            size_t first, n = zero_part(m->table.spec[t].offset, m->table.spec[t].numel, lo, hi, &first);
            if (n > 0) { adamw_range(m, t, first, n, lr, weight_decay, scale, step); }
        }
    }
    return norm;
}

// ----------------------------------------------------------------------------
// data: the batches of simulated ranks

// One optimizer step over W simulated ranks of B samples each, accum micro-steps of them, their
// batches taken from the loader in order: every batch's gradients are computed separately and
// averaged, as DDP's all-reduce over ranks and gradient accumulation over micro-steps would.
// Returns the mean loss.
static float train_step(Model* m, float* grad_sum, Loader* loader, const TrainArgs* args, int step, float* norm_out) {
    int W = args->ranks * args->accum;
    size_t n = m->table.total;
    double loss_sum = 0.0;
    for (int r = 0; r < W; r++) {
        Batch* batch = loader_next(loader);
        loss_sum += model_forward(m, batch);
        model_backward(m, batch);
        loader_release(loader);
        if (W > 1) {
            if (r == 0) { memcpy(grad_sum, m->grads_memory, n * sizeof(float)); }
            else { for (size_t i = 0; i < n; i++) { grad_sum[i] += m->grads_memory[i]; } }
        }
    }
    if (W > 1) {
        float inv = 1.0f / (float)W;
        for (size_t i = 0; i < n; i++) { m->grads_memory[i] = grad_sum[i] * inv; }
    }
    *norm_out = model_update(m, lr_at_step(args, step), args->weight_decay, args->grad_clip, step,
                             args->zero ? args->ranks : 1);
    return (float)(loss_sum / W);
}

// ----------------------------------------------------------------------------
// checkpoints of the model

static void model_save(const Model* m, const Dataset* ds, const TrainArgs* args, int step, uint64_t sampler_pos) {
    run_checkpoint_save(args, ds, &m->config, step, sampler_pos, m->params_memory, m->m_memory, m->v_memory, m->table.total);
}

// Loads weights, moments, step, seed and sampler position; the config must match the model's.
static void model_load(Model* m, const char* path, int* step, uint64_t* seed, uint64_t* sampler_pos) {
    Checkpoint ck;
    run_checkpoint_load(path, &m->config, &ck);
    size_t n = m->table.total;
    memcpy(m->params_memory, ck.params, n * sizeof(float));
    memcpy(m->m_memory, ck.m, n * sizeof(float));
    memcpy(m->v_memory, ck.v, n * sizeof(float));
    *step = (int)ck.step;
    *seed = ck.seed;
    *sampler_pos = ck.sampler_pos;
    checkpoint_free(&ck);
}

// ----------------------------------------------------------------------------
// policy interface: a checkpoint as a policy, for Python through ctypes (scripts/vla_policy.py).
// Built into libvla.so (make libvla.so). Observations in, un-normalized action chunks out.

typedef struct {
    Model model;
    float* stats;  // state_mean(S) state_std(S) action_mean(A) action_std(A), as trained with
    Batch obs;     // room for `capacity` observations
    int capacity;
} VLAPolicy;

// Loads a checkpoint; NULL and a message in err if it cannot be used. threads: OpenMP threads (0: default).
VLA_API VLAPolicy* vla_policy_load(const char* path, int threads, char* err, int err_size) {
    Checkpoint ck;
    if (checkpoint_read_checked(path, &ck, err, (size_t)err_size) != 0) { return NULL; }
    if (threads > 0 && threads_startable(threads) < threads - 1) {
        snprintf(err, (size_t)err_size, "threads=%d: this machine cannot start that many threads: pass fewer, or 0 for "
                 "OpenMP's default", threads);
        checkpoint_free(&ck);
        return NULL;
    }
    if (threads > 0) { omp_set_num_threads(threads); }
    VLAPolicy* p = (VLAPolicy*)callocCheck(1, sizeof(VLAPolicy));
    model_build(&p->model, &ck.config);
    memcpy(p->model.params_memory, ck.params, p->model.table.total * sizeof(float));
    p->stats = ck.stats;
    ck.stats = NULL;
    checkpoint_free(&ck);
    return p;
}

// The checkpoint's config, the 15 fields of VLAConfig in order.
VLA_API void vla_policy_config(const VLAPolicy* p, int32_t* out) { memcpy(out, &p->model.config, sizeof(VLAConfig)); }

// Where the policy computes, and in which precision.
VLA_API const char* vla_policy_device(const VLAPolicy* p) { (void)p; return "CPU (fp32)"; }

// Action chunks (B, H, A) in the data's units for B observations: images u8 (B, n_cam, img, img, 3),
// instructions (B strings, UTF-8, cut to max_text bytes), raw state (B, S). The starting noise
// is `noise` (B, H, A) if given, else drawn from `seed`. Returns 0, or 1 for a bad B.
VLA_API int vla_policy_act(VLAPolicy* p, int B, const uint8_t* images, const char* const* instructions, const float* state,
                           const float* noise, uint64_t seed, float* actions) {
    const VLAConfig* c = &p->model.config;
    int S = c->state_dim, A = c->action_dim;
    if (B < 1) { return 1; }
    policy_reserve(&p->obs, &p->capacity, c, B);
    policy_observations(&p->obs, c, p->stats, B, images, instructions, state, noise, seed);
    model_sample_actions(&p->model, &p->obs, p->obs.eps, p->stats + 2 * S, p->stats + 2 * S + A, actions);
    return 0;
}

VLA_API void vla_policy_free(VLAPolicy* p) {
    if (p == NULL) { return; }
    if (p->capacity > 0) { batch_free(&p->obs); }
    free(p->stats);
    model_free(&p->model);
    free(p);
}

// ----------------------------------------------------------------------------
// CLI and main

#if !defined(TESTING) && !defined(VLA_LIBRARY)
// How well the policy acts: 10-step sampling on one batch, mean squared error against the
// dataset's actions over the unmasked slots, in the data's own (un-normalized) units.
static float eval_action_mse(Model* m, Batch* batch, const Dataset* ds, uint64_t seed, uint64_t pos, int step) {
    const VLAConfig* c = &m->config;
    eval_batch(batch, ds, c, seed, pos, step);
    float* sampled = (float*)mallocCheck((size_t)batch->B * c->chunk * c->action_dim * sizeof(float));
    model_sample_actions(m, batch, batch->eps, ds->action_mean, ds->action_std, sampled);
    float mse = action_mse(batch, ds, c, sampled);
    free(sampled);
    return mse;
}

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

int main(int argc, char** argv) {
    TrainArgs args;
    train_args_parse(&args, argc, argv);
    if (args.nodes > 1) { vla_fail("--nodes %d: train_vla_cpu runs on one machine; several machines train with train_vla", args.nodes); }
    train_args_for_world(&args, args.ranks);  // simulated ranks scale the learning rate as GPUs would
    if (args.threads > 0) {
        int started = threads_startable(args.threads);
        if (started < args.threads - 1) {
            vla_fail("-t %d: this machine could start only %d threads besides the main one: use a smaller -t, such as the "
                     "%d cores here", args.threads, started, omp_get_num_procs());
        }
        omp_set_num_threads(args.threads);
    }
    Dataset ds;
    dataset_open(&ds, args.input);
    VLAConfig c = config_for_data(args.preset, args.max_text, &ds);
    Model model;
    model_build(&model, &c);

    int start = 0;
    uint64_t sampler_pos = 0;
    char resume_path[VLA_PATH_MAX];
    const char* from = run_start_checkpoint(&args, resume_path, sizeof(resume_path));
    if (from != NULL) {
        uint64_t seed;
        model_load(&model, from, &start, &seed, &sampler_pos);
        if (seed != args.seed) { printf("using the checkpoint's seed %llu\n", (unsigned long long)seed); }
        args.seed = seed;
        printf("resumed from %s at step %d\n", from, start);
    } else {
        param_init(model.params_memory, &model.table, &c, args.seed);
    }
    if (!run_has_steps_left(from, start, args.steps)) { return 0; }
    uint64_t global_batch = (uint64_t)train_global_batch(&args, args.ranks);
    int batches = args.ranks * args.accum;  // per optimizer step: every rank's micro-steps
    Loader loader;
    loader_start(&loader, &ds, &c, args.seed, sampler_pos, (uint64_t)start, args.batch, batches, args.augment,
                 args.workers, 2 * batches + 2);
    float* grad_sum = batches > 1 ? (float*)mallocCheck(model.table.total * sizeof(float)) : NULL;
    Logger logger;
    logger_open(&logger, args.output, start);

    printf("+------------------------+------------+\n");
    printf("| train_vla_cpu          | %-10s |\n", args.preset);
    printf("+------------------------+------------+\n");
    vla_config_print(&c);
    printf("| parameters             | %-10zu |\n", model.table.total);
    printf("| dataset samples        | %-10llu |\n", (unsigned long long)ds.n_samples);
    printf("| shards                 | %-10d |\n", ds.n_shards);
    char split[64];
    snprintf(split, sizeof(split), "%d x %d x %d", args.ranks, args.batch, args.accum);
    printf("| ranks x batch x accum  | %-10s |\n", split);
    printf("| effective batch        | %-10llu |\n", (unsigned long long)global_batch);
    printf("| peak learning rate     | %-10.4g |\n", args.lr);
    printf("| ZeRO-1 (simulated)     | %-10s |\n", args.zero && args.ranks > 1 ? "on" : "off");
    printf("| loader threads         | %-10d |\n", args.workers);
    printf("| augment shift (px)     | %-10d |\n", args.augment);
    printf("| OpenMP threads         | %-10d |\n", omp_get_max_threads());
    printf("+------------------------+------------+\n");

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    double timed_ms = 0.0;
    int timed_steps = 0;
    int step = start;
    for (; step < args.steps && !stop_requested; step++) {
        double t0 = wall_seconds();
        float norm;
        float loss = train_step(&model, grad_sum, &loader, &args, step, &norm);
        double ms = 1000.0 * (wall_seconds() - t0);
        if (!isfinite(loss) || !isfinite(norm)) {
            vla_fail("step %d: loss %g, grad norm %g is not finite: lower the learning rate (-l) or raise the clip; "
                     "the last checkpoint in %s is intact", step + 1, loss, norm, args.output);
        }
        if (step > start) { timed_ms += ms; timed_steps++; }  // the first step warms caches
        double sps = (double)global_batch / (ms / 1000.0);
        logger_step(&logger, step, args.steps, loss, lr_at_step(&args, step), norm, ms, sps, NAN, NAN,
                    (step + 1) % args.log_every == 0 || step + 1 == args.steps);
        int done = step + 1;
        if ((args.ckpt_every > 0 && done % args.ckpt_every == 0) || done == args.steps) {
            model_save(&model, &ds, &args, done, sampler_pos + (uint64_t)(done - start) * global_batch);
        }
    }
    if (stop_requested) {
        model_save(&model, &ds, &args, step, sampler_pos + (uint64_t)(step - start) * global_batch);
        printf("interrupted: saved step %d to %s; continue with -y 1\n", step, args.output);
    }
    loader_stop(&loader);
    printf("data loader: %d worker thread(s), the trainer waited %.1f ms for batches in %d steps\n", args.workers,
           1000.0 * loader.wait_seconds, step - start);
    Batch batch;
    batch_alloc(&batch, &c, args.batch);
    printf("eval: 10-step sampled actions vs the data, MSE %.6f (data units) on %d samples\n",
           eval_action_mse(&model, &batch, &ds, args.seed, sampler_pos + (uint64_t)(step - start) * global_batch, step),
           args.batch);
    if (timed_steps > 0) {
        printf("mean step time %.1f ms over %d steps (first excluded), %.1f samples/s\n", timed_ms / timed_steps,
               timed_steps, global_batch / (timed_ms / timed_steps / 1000.0));
    }
    logger_close(&logger);
    free(grad_sum);
    batch_free(&batch);
    model_free(&model);
    dataset_close(&ds);
    return stop_requested ? 130 : 0;
}
#endif
