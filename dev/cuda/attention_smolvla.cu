/*
attention_smolvla.cu: SmolVLA's attention as LeRobot 0.6.1 computes it (eager_attention_forward in
lerobot/policies/smolvla/smolvlm_with_expert.py), forward and backward, for every call the model
makes: GQA (n_head query heads over n_kv_head key/value heads), scores in fp32 scaled by
1/sqrt(head size), the block mask of make_att_2d_masks given as one int per token, masked scores
filled with float32's most negative value as LeRobot fills them. And pi0's (lerobot/policies/pi0),
the same computation at its shapes: 8 query heads of 256 on one kv head (scale 1/16), every layer
joint, its suffix the state then 50 actions in one block (attention_smolvla_case.h).

  nvcc -O3 -std=c++17 -arch=sm_90 attention_smolvla.cu -lcublasLt -o attention_smolvla
  (fp16 builds, for GPUs without bf16 tensor cores, add -DENABLE_FP16; fp32 builds -DENABLE_FP32)

  the calls    prefix        the VLM over the prefix alone (odd layers; the prefill of sampling)
               joint         even layers: [prefix ; suffix] queries on [prefix ; suffix] keys, as two
                             calls, the prefix rows and the action rows, both on the keys of both
               cross         odd layers: the action queries on the prefix keys re-projected by the
                             expert (its k_proj / v_proj of the VLM's roped keys and values)
               vision        SigLIP: 1024 tokens, no mask, n_kv_head = n_head
  pi0's calls  prefix        the VLM over the prefix alone (the prefill of sampling)
               joint         every layer: the prefix rows (which see only the prefix) and the suffix
                             rows (the expert's: the state and the actions) on [prefix ; suffix] keys
               vision        SigLIP so400m: 256 tokens, 16 heads of 72
  delta      rowsum(dO * O) per head, vla/cuda/attention.cuh's: attention_delta_kernel (a warp per
             row and head, with version 1) and attention_delta (128-bit loads, HS / 8 lanes a row and
             head where they fit: attention_delta_kernel2; with the other versions)
  version 1  vla/cuda/attention.cuh's: one warp per (sample, head, query) for the forward and dq, one
             warp per (sample, kv head, key) for dk and dv over the query heads that share it; online
             softmax on CUDA cores (every build, every shape; fp32 builds run it), here at several
             block sizes
  version 2  vla/cuda/attention.cuh's: tensor cores through WMMA, 64x64 tiles, the key loop stopped
             after the last key any query of the tile can see (fp16 builds run it; this program
             defines VLA_ATTENTION_WMMA so that bf16 builds compile it too and time it against 4)
  version 3  this program's: the vision tower's calls (no mask, a kv head per query head), the
             products through cuBLASLt over a strided batch of the images, the softmax (and its
             backward) a warp per row between them on scores in scratch; with every image a pass
             or 16 or 8 (scores that stay in L2), and in bf16 builds with the scores in bf16
  version 4  vla/cuda/attention.cuh's (bf16 builds, head sizes multiples of 8 up to 64): flash
             attention through mma.sync m16n8k16, scores, probabilities and outputs in registers;
             here at 64 and at 128 queries a forward block (the launcher picks by the call's size)
  version 5  vla/cuda/attention.cuh's: version 1 with 8 values of a head a lane (version 1's hold
             4), so head sizes up to 256: pi0's Gemma layers, which no other version takes
  trainer    vla/cuda/attention.cuh's launchers gqa_attention_forward / gqa_attention_backward: what
             trains (version 4 in bf16 builds where it fits, 2 in fp16 builds, 5 past head size 128,
             1 otherwise)

Each version refuses, in one line, a call it cannot take (version_refusal says why: the limits in
its code), rather than compute it wrongly; at pi0's head size every version but 5 refuses.
dev/cuda/README.md compares the versions and their timings.

  make -C dev/cuda attention_smolvla && dev/cuda/attention_smolvla
  make build/emu/dev/cuda/attention_smolvla && build/emu/dev/cuda/attention_smolvla   (checks only)
*/
#include "common.h"
#define VLA_ATTENTION_WMMA  // version 2 in bf16 builds too (the header compiles it for fp16 builds alone)
#include "../../vla/cuda/attention.cuh"
#include "../../vla/cuda/matmul.cuh"
#include "attention_smolvla_case.h"
#include <float.h>
#include <limits.h>

// ----------------------------------------------------------------------------
// version 3: cuBLASLt products around a softmax (calls without a mask whose keys are one tensor
// with a kv head per query head: the vision tower's). The products run head by head over a
// strided batch of the samples, the softmax in rows of scores between them (fp32, or floatX as
// LeRobot's eager attention keeps them). The probabilities are written as floatX over the scores
// they come from, at the start of each row (bytes of scores already read: see the kernels), so one
// (B, Tq, nk) buffer holds both; the backward pass needs two (scores then P, dP then dS). A warp
// per row.

static int attention3_samples_per_pass = 0;  // images a pass when they are batched per head; 0: all
static int attention3_floatx_scores = 0;     // 1: the scores in floatX (half their traffic)

// rows of n scores s of type TS (row stride ld elements; row r is query r % Tq of the batch's
// product r / Tq) -> P = softmax of scale * s as floatX over the row's start, and its
// log-sum-exp at lse[(r / Tq) * lse_slot + r % Tq]
template <typename TS>
__global__ void attention_softmax_rows_kernel(TS* s, float* lse, int rows, int n, int ld, float scale, int Tq,
                                              long long lse_slot) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows) { return; }
    TS* row = s + (size_t)warp * ld;
    float m = -INFINITY, l = 0.0f;
    for (int j = lane; j < n; j += 32) { m = fmaxf(m, f32(row[j]) * scale); }
    for (int offset = 16; offset > 0; offset /= 2) { m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset)); }
    for (int j = lane; j < n; j += 32) { l += expf(f32(row[j]) * scale - m); }
    l = warp_sum(l);
    float row_lse = m + logf(l);
    floatX* p = (floatX*)row;
    // P[j] lies in the bytes of score j * sizeof(floatX) / sizeof(TS) <= j: read in this pass or an
    // earlier one; within a pass, every lane reads before any writes
    for (int j0 = 0; j0 < n; j0 += 32) {
        int j = j0 + lane;
        float v = j < n ? expf(f32(row[j]) * scale - row_lse) : 0.0f;
        __syncwarp();
        if (j < n) { p[j] = fx(v); }
    }
    if (lane == 0) { lse[(warp / Tq) * lse_slot + warp % Tq] = row_lse; }
}

// the backward's rows: scores s and dP of type TS (row stride ld elements) -> P = exp(scale s -
// lse) over s and dS = P (dP - delta) over dP, both floatX at their rows' starts (as the forward
// writes P); lse and delta of row r at (r / Tq) * lse_slot + r % Tq
template <typename TS>
__global__ void attention_softmax_backward_rows_kernel(TS* s, TS* dp, const float* lse, const float* delta, int rows,
                                                       int n, int ld, float scale, int Tq, long long lse_slot) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows) { return; }
    long long at = (warp / Tq) * lse_slot + warp % Tq;
    float row_lse = lse[at], row_delta = delta[at];
    TS* srow = s + (size_t)warp * ld;
    TS* dprow = dp + (size_t)warp * ld;
    floatX* p = (floatX*)srow;
    floatX* ds = (floatX*)dprow;
    for (int j0 = 0; j0 < n; j0 += 32) {
        int j = j0 + lane;
        float pj = 0.0f, dsj = 0.0f;
        if (j < n) {
            pj = expf(f32(srow[j]) * scale - row_lse);
            dsj = pj * (f32(dprow[j]) - row_delta);
        }
        __syncwarp();
        if (j < n) {
            p[j] = fx(pj);
            ds[j] = fx(dsj);
        }
    }
}

static bool attention3_fits(const GqaAttn& a) { return a.block == NULL && a.Nk1 == 0 && a.NKV == a.NH && a.q0 == 0; }

// Version 3 walks the smaller of the samples and the heads and batches the other in each pass: a
// head of every image per pass in training (64 images, 12 heads), every head of an image at
// inference (one or two images), so the products stay few and large. Pass p is pass p % inner of
// group p / inner; where its slot g starts, in elements: queries (and out, dO, dq) at
// (p % inner) q_pass + (p / inner) q_group + g q_slot, keys (and values, dk, dv) and the
// log-sum-exp (and delta) likewise.
typedef struct {
    int passes, inner, slots;
    long long q_pass, q_group, q_slot, kv_pass, kv_group, kv_slot, lse_pass, lse_group, lse_slot;
} Attention3Walk;

static Attention3Walk attention3_walk(const GqaAttn& a) {
    long long T = a.Tq, N = a.Nk0, D = (long long)a.NH * a.HS;
    if (a.B >= a.NH) {
        long long n = attention3_samples_per_pass > 0 && a.B % attention3_samples_per_pass == 0 ?
                      attention3_samples_per_pass : a.B;
        return Attention3Walk{(int)(a.NH * (a.B / n)), a.NH, (int)n, a.HS, n * T * D, T * D, a.HS, n * N * D, N * D, T,
                              n * a.NH * T, a.NH * T};
    }
    return Attention3Walk{a.B, a.B, a.NH, T * D, 0, a.HS, N * D, 0, a.HS, a.NH * T, 0, T};
}

// Where pass p of the walk starts: its queries', keys' and log-sum-exp's offsets (elements)
static void attention3_pass(const Attention3Walk& w, int p, long long* q, long long* kv, long long* lse) {
    int i = p % w.inner, g = p / w.inner;
    *q = i * w.q_pass + g * w.q_group;
    *kv = i * w.kv_pass + g * w.kv_group;
    *lse = i * w.lse_pass + g * w.lse_group;
}

// fp32 scratch the forward needs (one pass's scores); the backward needs twice this
static size_t attention3_scratch(int B, int NH, int Tq, int nk) {
    return (size_t)(B > NH ? B : NH) * Tq * nk;
}

// A pass's scores in scratch are row-major (Tq, nk) per slot, i.e. column-major S^T (nk, Tq); P
// is written over them as floatX with this row stride (elements)
static int attention3_p_ld(const GqaAttn& a) {
    return attention3_floatx_scores ? a.Nk0 : a.Nk0 * (int)(sizeof(float) / sizeof(floatX));
}

// the type cuBLASLt writes the scores in, and the softmax's kernels over them
static cudaDataType_t attention3_score_type(void) { return attention3_floatx_scores ? CUBLAS_FLOATX : CUDA_R_32F; }

static void attention3_softmax(void* s, float* lse, int rows, int n, float scale, int Tq, long long lse_slot) {
    size_t grid = ceil_div((size_t)rows * 32, BLOCK);
    if (attention3_floatx_scores) {
        attention_softmax_rows_kernel<floatX><<<grid, BLOCK, 0, main_stream>>>((floatX*)s, lse, rows, n, n, scale, Tq,
                                                                               lse_slot);
    } else {
        attention_softmax_rows_kernel<float><<<grid, BLOCK, 0, main_stream>>>((float*)s, lse, rows, n, n, scale, Tq,
                                                                              lse_slot);
    }
    launchCheck();
}

static void attention3_softmax_backward(void* s, void* dp, const float* lse, const float* delta, int rows, int n,
                                        float scale, int Tq, long long lse_slot) {
    size_t grid = ceil_div((size_t)rows * 32, BLOCK);
    if (attention3_floatx_scores) {
        attention_softmax_backward_rows_kernel<floatX><<<grid, BLOCK, 0, main_stream>>>(
            (floatX*)s, (floatX*)dp, lse, delta, rows, n, n, scale, Tq, lse_slot);
    } else {
        attention_softmax_backward_rows_kernel<float><<<grid, BLOCK, 0, main_stream>>>(
            (float*)s, (float*)dp, lse, delta, rows, n, n, scale, Tq, lse_slot);
    }
    launchCheck();
}

// scratch: attention3_scratch floats
static void gqa_attention_forward3(floatX* out, float* lse, const floatX* q, const GqaAttn& a, float* scratch) {
    int T = a.Tq, N = a.Nk0, HS = a.HS, D = a.NH * HS, ldp = attention3_p_ld(a);
    float scale = 1.0f / sqrtf((float)HS);
    Attention3Walk w = attention3_walk(a);
    int rows = w.slots * T;
    MatmulBatch scores = {w.slots, w.kv_slot, w.q_slot, (long long)T * N};  // K, Q -> S^T
    MatmulBatch values = {w.slots, w.kv_slot, (long long)T * ldp, w.q_slot};  // V, P -> O^T
    for (int p = 0; p < w.passes; p++) {
        long long qo, kvo, lo;
        attention3_pass(w, p, &qo, &kvo, &lo);
        // S^T (N, T) = K Q^T per slot: K column-major (HS, N) at row stride D
        matmul_cublaslt(scratch, attention3_score_type(), N, NULL, a.k0 + kvo, D, true, q + qo, D, false, N, T, HS,
                        0.0f, NULL, &scores);
        attention3_softmax(scratch, lse + lo, rows, N, scale, T, w.lse_slot);
        // O^T (HS, T) = V^T P^T
        matmul_cublaslt(out + qo, CUBLAS_FLOATX, D, NULL, a.v0 + kvo, D, false, (const floatX*)scratch, ldp, false, HS,
                        T, N, 0.0f, NULL, &values);
    }
}

// delta (rowsum(dO O)) given; dk0, dv0 accumulate, dq overwritten; scratch: twice attention3_scratch
static void gqa_attention_backward3(floatX* dq, float* dk0, float* dv0, const floatX* dout, const floatX* q,
                                    const float* lse, const float* delta, const GqaAttn& a, float* scratch) {
    int T = a.Tq, N = a.Nk0, HS = a.HS, D = a.NH * HS, ldp = attention3_p_ld(a);
    float scale = 1.0f / sqrtf((float)HS);
    Attention3Walk w = attention3_walk(a);
    int rows = w.slots * T;
    float* s = scratch;
    float* dp = scratch + attention3_scratch(a.B, a.NH, T, N);
    const floatX* p_x = (const floatX*)s;
    const floatX* ds_x = (const floatX*)dp;
    MatmulBatch scores = {w.slots, w.kv_slot, w.q_slot, (long long)T * N};  // K or V, Q or dO -> S^T or dP^T
    MatmulBatch on_p = {w.slots, w.q_slot, (long long)T * ldp, w.kv_slot};  // dO or Q, P or dS -> dV^T or dK^T
    MatmulBatch on_ds = {w.slots, w.kv_slot, (long long)T * ldp, w.q_slot};  // K, dS -> dQ^T
    for (int p = 0; p < w.passes; p++) {
        long long qo, kvo, lo;
        attention3_pass(w, p, &qo, &kvo, &lo);
        const floatX* k = a.k0 + kvo;
        const floatX* v = a.v0 + kvo;
        const floatX* qp = q + qo;
        const floatX* dop = dout + qo;
        // S^T = K Q^T and dP^T (N, T) = V dO^T, then P and dS over them
        matmul_cublaslt(s, attention3_score_type(), N, NULL, k, D, true, qp, D, false, N, T, HS, 0.0f, NULL, &scores);
        matmul_cublaslt(dp, attention3_score_type(), N, NULL, v, D, true, dop, D, false, N, T, HS, 0.0f, NULL, &scores);
        attention3_softmax_backward(s, dp, lse + lo, delta + lo, rows, N, scale, T, w.lse_slot);
        // dV^T (HS, N) += dO^T P; dK^T += scale Q^T dS; dQ^T (HS, T) = scale K^T dS^T
        matmul_cublaslt(dv0 + kvo, CUDA_R_32F, D, NULL, dop, D, false, p_x, ldp, true, HS, N, T, 1.0f, NULL, &on_p);
        matmul_cublaslt(dk0 + kvo, CUDA_R_32F, D, NULL, qp, D, false, ds_x, ldp, true, HS, N, T, 1.0f, NULL, &on_p,
                        scale);
        matmul_cublaslt(dq + qo, CUBLAS_FLOATX, D, NULL, k, D, false, ds_x, ldp, false, HS, T, N, 0.0f, NULL,
                        &on_ds, scale);
    }
}

// ----------------------------------------------------------------------------
// the versions at a chosen block: versions 1 and 5 at a block size, version 2 at the head size's
// tiles, version 4's forward at 64 or 128 queries a block (the trainer's launchers choose these by rule)

// grids of a warp per (sample, head, query) and per (sample, kv head, key), at `block` threads a block
static size_t warp_query_grid(const GqaAttn& a, int block) { return ceil_div((size_t)a.B * a.NH * a.Tq * 32, block); }
static size_t warp_key_grid(const GqaAttn& a, int block) {
    return ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, block);
}

static void gqa_attention_forward1_at(int block, floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    size_t grid = warp_query_grid(a, block);
    gqa_attention_forward_kernel1<<<grid, block, 0, main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward1_at(int block, floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1,
                                       const floatX* dout, const floatX* q, const float* lse, const float* delta,
                                       const GqaAttn& a) {
    size_t grid_q = warp_query_grid(a, block), grid_k = warp_key_grid(a, block);
    gqa_attention_backward_dq_kernel1<<<grid_q, block, 0, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel1<<<grid_k, block, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

static void gqa_attention_forward5_at(int block, floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    size_t grid = warp_query_grid(a, block);
    gqa_attention_forward_kernel5<<<grid, block, 0, main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward5_at(int block, floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1,
                                       const floatX* dout, const floatX* q, const float* lse, const float* delta,
                                       const GqaAttn& a) {
    size_t grid_q = warp_query_grid(a, block), grid_k = warp_key_grid(a, block);
    gqa_attention_backward_dq_kernel5<<<grid_q, block, 0, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel5<<<grid_k, block, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

// version 1 of delta (a warp per row and head) at `block` threads a block
static void attention_delta1_at(int block, float* delta, const floatX* dout, const floatX* out, const GqaAttn& a) {
    size_t grid = warp_query_grid(a, block);
    attention_delta_kernel<<<grid, block, 0, main_stream>>>(delta, dout, out, a.B * a.Tq, a.Tq, a.NH, a.HS);
    launchCheck();
}

#if defined(ENABLE_FP32)
static const int HAVE_V2 = 0, V2_THREADS = 0;  // version 2 exists in bf16 and fp16 builds only
#else
static const int HAVE_V2 = 1, V2_THREADS = ATT_THREADS;  // (VLA_ATTENTION_WMMA, above)
#endif

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
static const int HAVE_V4 = 1, V4_THREADS = ATT4_THREADS;  // version 4 in bf16 builds only
static void gqa_attention_forward4_at(int queries, floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    int hs = attention4_head_index(a.HS), tiles = queries / ATT4_ROWS;
    Attention4Forward kernel = ATT4_FORWARD[hs][tiles - 1][a.block != NULL];
    dim3 grid(ceil_div(a.Tq, queries), a.NH, a.B);
    kernel<<<grid, ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(out, lse, q, a);
    launchCheck();
}
#else
static const int HAVE_V4 = 0, V4_THREADS = 0;
#endif

// ----------------------------------------------------------------------------
// checks and benchmarks

#define N_VERSIONS 6     // 0: the trainer's launchers, then versions 1 to 5
static int only_version = -1;  // -1: every version that takes a call; else that one alone
static int v4_queries = 0;     // version 4's forward: 0 by the trainer's rule, else 64 or 128 queries a block

static const char* version_name(int version) {
    static const char* names[N_VERSIONS] = {"trainer", "v1", "v2", "v3", "v4", "v5"};
    return names[version];
}

// Why `version` does not take this call, in one line, or NULL where it does. The limits are in the
// versions' code: version 1's lanes hold 4 values of a head (qv[4], acc[4]: up to 128), version
// 5's 8 (up to 256); version 2 pads a head to 16, 32, 64 or 128 columns (padded_head_dim: a wider
// head would be cut to 128) and needs its tiles in shared memory; version 3 computes the vision
// tower's calls alone; version 4 is bf16 mma.sync on heads padded to 16, 32 or 64 columns, whose
// Q fragments and O accumulators (or dq's, or dk's and dv's) a warp holds in registers for the
// whole padded head. The trainer's launchers take version 5's heads (gqa_attention_check).
static const char* version_refusal(int version, const Case* k) {
    int masked = k->pass != PASS_VISION;
    switch (version) {
        case 0:
            return k->HS > 32 * ATT5_VALS ? "the trainer's launchers take head sizes up to 256 (gqa_attention_check)"
                                          : NULL;
        case 1: return k->HS > 128 ? "a lane holds 4 values of a head: head sizes up to 128" : NULL;
        case 2:
            if (!HAVE_V2) { return "no WMMA version in fp32 builds"; }
            if (k->HS > 128) {
                return "heads padded to 16, 32, 64 or 128 columns (padded_head_dim): head sizes up to 128";
            }
#if !defined(ENABLE_FP32)
            if (!attention2_fits(k->HS, false) || !attention2_fits(k->HS, true)) {
                return "its tiles at this head size pass the GPU's shared memory a block";
            }
#endif
            return NULL;
        case 3:
            if (masked || k->NKV != k->NH) {
                return "the vision tower's calls only: no mask, one key tensor, a kv head a query head";
            }
            return NULL;
        case 4:
            if (!HAVE_V4) { return "bf16 builds only (mma.sync m16n8k16 on bf16)"; }
            if (k->HS % 8 != 0 || k->HS > 64) {
                return "head sizes multiples of 8 up to 64 (heads padded to 16, 32 or 64 columns, a warp's fragments "
                       "and accumulators of the whole head in registers)";
            }
            return NULL;
        default: return k->HS > 32 * ATT5_VALS ? "a lane holds 8 values of a head: head sizes up to 256" : NULL;
    }
}

// Whether `version` takes this call (and is asked to run: only_version)
static bool version_takes(int version, const Case* k) {
    if (only_version >= 0 && version != only_version) { return false; }
    return version_refusal(version, k) == NULL;
}

static int version_threads(int version, int block) {
    return version == 1 || version == 5 ? block : version == 2 ? V2_THREADS : version == 4 ? V4_THREADS : BLOCK;
}

// version 3's scores: max(B, NH) x (Tq, nk) fp32 twice (the backward's S and dP), grown as the cases need
static float* v3_scratch(const Case* k) {
    static float* scratch = NULL;
    static size_t have = 0;
    size_t need = 2 * attention3_scratch(k->B, k->NH, k->Tq, k->Nk0 + k->Nk1);
    if (need > have) {
        if (scratch != NULL) { cudaCheck(cudaFree(scratch)); }
        cudaCheck(cudaMalloc(&scratch, need * sizeof(float)));
        have = need;
    }
    return scratch;
}

static GqaAttn case_attn(const Case* k) {
    return GqaAttn{k->d_k0, k->d_v0, k->d_k1, k->d_v1, k->d_block, k->B, k->NH, k->NKV, k->HS,
                   k->Tq, k->q0, k->Nk0, k->Nk1, k->Nt};
}

// The call for a version that takes it, after the trainer's checks of its heads, keys and mask; a
// version that does not take it stops the program in one line, as the trainer's launchers do
static GqaAttn version_call(int version, const Case* k) {
    const char* why = version_refusal(version, k);
    if (why != NULL) {
        vla_fail("attention_smolvla: %s does not take the %s %s call (HS %d): %s", version_name(version),
                 model_names[k->model], pass_names[k->pass], k->HS, why);
    }
    GqaAttn a = case_attn(k);
    gqa_attention_check(a);
    return a;
}

// versions 1 and 5 at `block` threads a block, the others at their own
static void run_forward(int version, int block, floatX* out, float* lse, const Case* k) {
    GqaAttn a = version_call(version, k);
    if (version == 0) { gqa_attention_forward(out, lse, k->d_q, a); }
    if (version == 1) { gqa_attention_forward1_at(block, out, lse, k->d_q, a); }
    if (version == 5) { gqa_attention_forward5_at(block, out, lse, k->d_q, a); }
#if !defined(ENABLE_FP32)
    if (version == 2) { gqa_attention_forward2_any(out, lse, k->d_q, a); }
#endif
    if (version == 3 && !attention3_fits(a)) { vla_fail("attention_smolvla: version 3 does not take this call"); }
    if (version == 3) { gqa_attention_forward3(out, lse, k->d_q, a, v3_scratch(k)); }
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    if (version == 4 && !attention4_fits(a, k->d_q, out)) {
        vla_fail("attention_smolvla: version 4 does not take this call");
    }
    if (version == 4 && v4_queries == 0) { gqa_attention_forward4(out, lse, k->d_q, a); }
    if (version == 4 && v4_queries != 0) { gqa_attention_forward4_at(v4_queries, out, lse, k->d_q, a); }
#endif
}

static void run_backward(int version, int block, const Case* k, floatX* dq, float* dk0, float* dv0, float* dk1,
                         float* dv1, float* delta) {
    GqaAttn a = version_call(version, k);
    if (version == 0) {
        gqa_attention_backward(dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_out, k->d_lse, delta, a);
        return;
    }
    if (version == 1) {  // version 1 of delta too, at the block size
        attention_delta1_at(block, delta, k->d_dout, k->d_out, a);
        gqa_attention_backward1_at(block, dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_lse, delta, a);
        return;
    }
    attention_delta(delta, k->d_dout, k->d_out, a);  // (the launchers': version 2 where it fits)
    if (version == 5) {
        gqa_attention_backward5_at(block, dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_lse, delta, a);
    }
#if !defined(ENABLE_FP32)
    if (version == 2) { gqa_attention_backward2_any(dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_lse, delta, a); }
#endif
    if (version == 3 && !attention3_fits(a)) { vla_fail("attention_smolvla: version 3 does not take this call"); }
    if (version == 3) { gqa_attention_backward3(dq, dk0, dv0, k->d_dout, k->d_q, k->d_lse, delta, a, v3_scratch(k)); }
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    if (version == 4 && !attention4_fits(a, k->d_q, k->d_dout, dq)) {
        vla_fail("attention_smolvla: version 4 does not take this call");
    }
    if (version == 4) {
        gqa_attention_backward4(dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_lse, delta, a, NULL, NULL);
    }
#endif
}

static const int V1_BLOCKS[] = {32, 96, 256};  // 96: warps of a block not a power of two
static const int N_V1_BLOCKS = sizeof(V1_BLOCKS) / sizeof(V1_BLOCKS[0]);

// Whether the checks run `version` on this call: every version that takes it, but version 5 only on
// heads past 64 (version 1's code with 4 more values a lane, which the emulation's time does not
// need to see again on every small head: SmolVLA's 128 and 200, pi0's 256 and its vision's 72)
static bool version_checked(int version, const Case* k) {
    return version_takes(version, k) && (version != 5 || k->HS > 64);
}

// The block sizes a version is checked at, from V1_BLOCKS (the others have their own): version 1
// at each; version 5 at each where version 1 cannot take the head (past 128), elsewhere at 96 alone
static int n_check_blocks(int version, const Case* k) {
    return version == 1 || (version == 5 && k->HS > 128) ? N_V1_BLOCKS : 1;
}
static int check_block(int version, const Case* k, int i) {
    return version_threads(version, version == 5 && k->HS <= 128 ? V1_BLOCKS[1] : V1_BLOCKS[i]);
}

static int case_label(char* buf, size_t n, const Case* k, int version, int block) {
    return snprintf(buf, n, "%s %s %s (B %d, NH %d, NKV %d, HS %d, Tq %d, keys %d+%d) block %d", version_name(version),
                    model_names[k->model], pass_names[k->pass], k->B, k->NH, k->NKV, k->HS, k->Tq, k->Nk0, k->Nk1,
                    block);
}

static double worst_err[N_VERSIONS] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};  // each one's largest relative error (report)

static void check_close_v(int version, const char* what, const float* got, const double* ref, size_t n, double tol) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
    double e = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (isfinite(e) && e > worst_err[version]) { worst_err[version] = e; }
    check_close(what, got, ref, n, tol);
}

static void check_forward(const Case* k) {
    int D = k->NH * k->HS;
    size_t n_out = (size_t)k->B * k->Tq * D, n_lse = (size_t)k->B * k->NH * k->Tq;
    double* ref = (double*)mallocCheck(n_out * sizeof(double));
    double* ref_lse = (double*)mallocCheck(n_lse * sizeof(double));
    int* sees = (int*)mallocCheck(n_lse * sizeof(int));
    forward_reference(k, ref, ref_lse, sees);
    size_t n_blind = 0;
    for (size_t e = 0; e < n_lse; e++) { n_blind += !sees[e]; }
    floatX* out;
    float* lse;
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, n_lse * sizeof(float)));
    // O is stored in floatX: 1e-5 in fp32 builds (fp32 sums of exact products), 1e-2 in bf16, whose
    // one rounding (2^-8 relative at most per value) costs ~1.6e-3 of the norm; version 2 also
    // rounds P to bf16 before P V (as LeRobot's bf16 runs do: probs.to(value dtype)). lse is fp32
    // in both: 1e-5. Errors of a wrong mask or a missed tile are of order 1.
    double tol_out = sizeof(floatX) == 4 ? 1e-5 : 1e-2, tol_lse = 1e-5;
    // version 3 with its scores in bf16: one more rounding per score (2^-9 of it), so lse within
    // 2e-3 (measured 4.2e-4) and O within 2e-2 (measured 5.1e-3): still far from a wrong head (order 1)
    if (attention3_floatx_scores && sizeof(floatX) < 4) { tol_out = 2e-2; tol_lse = 2e-3; }
    double* ref_seen = (double*)mallocCheck(n_lse * sizeof(double));
    double* ref_blind = (double*)mallocCheck((n_out > 0 ? n_out : 1) * sizeof(double));
    float* got_seen = (float*)mallocCheck(n_lse * sizeof(float));
    float* got_blind = (float*)mallocCheck((n_out > 0 ? n_out : 1) * sizeof(float));
    for (int version = 0; version < N_VERSIONS; version++) {
        if (!version_checked(version, k)) { continue; }
        for (int bi = 0; bi < n_check_blocks(version, k); bi++) {
            int block = check_block(version, k, bi);
            poison(out, n_out * sizeof(floatX));
            poison(lse, n_lse * sizeof(float));
            run_forward(version, block, out, lse, k);
            float* got = from_device_x(out, n_out);
            float* got_lse = from_device_f(lse, n_lse);
            char label[200], what[300];
            case_label(label, sizeof(label), k, version, block);
            snprintf(what, sizeof(what), "%s: out", label);
            check_close_v(version, what, got, ref, n_out, tol_out);
            // lse where some key is visible; where none is, the mark, and the mean of all values
            size_t n_seen = 0, n_marked = 0, n_b = 0;
            for (size_t e = 0; e < n_lse; e++) {
                if (sees[e]) {
                    ref_seen[n_seen] = ref_lse[e];
                    got_seen[n_seen++] = got_lse[e];
                    continue;
                }
                n_marked += got_lse[e] == ATTN_NO_KEY_LSE;
                size_t b = e / ((size_t)k->NH * k->Tq), h = e / k->Tq % k->NH, i = e % k->Tq;
                size_t at = (b * k->Tq + i) * D + h * k->HS;
                for (int c = 0; c < k->HS; c++) { ref_blind[n_b] = ref[at + c]; got_blind[n_b++] = got[at + c]; }
            }
            snprintf(what, sizeof(what), "%s: lse", label);
            check_close_v(version, what, got_seen, ref_seen, n_seen, tol_lse);
            if (n_blind > 0) {
                snprintf(what, sizeof(what), "%s: %zu rows that see no key marked (lse -FLT_MAX): %zu", label, n_blind,
                         n_marked);
                check_true(what, n_marked == n_blind);
                snprintf(what, sizeof(what), "%s: out of the rows that see no key (the mean of all values)", label);
                check_close_v(version, what, got_blind, ref_blind, n_b, tol_out);
            }
            free(got); free(got_lse);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse));
    free(ref); free(ref_lse); free(sees); free(ref_seen); free(ref_blind); free(got_seen); free(got_blind);
}

static void check_backward(const Case* k, uint64_t seed) {
    int D = k->NH * k->HS, Dkv = k->NKV * k->HS;
    size_t n_q = (size_t)k->B * k->Tq * D, n_k0 = (size_t)k->B * k->Nk0 * Dkv, n_k1 = (size_t)k->B * k->Nk1 * Dkv;
    size_t n_stat = (size_t)k->B * k->NH * k->Tq;
    Grads ref = backward_reference(k);
    // the accumulators start from known random values of the gradients' size
    float* dk00 = random_floats(n_k0, 0.5f, seed);
    float* dv00 = random_floats(n_k0, 0.5f, seed + 1);
    float* dk10 = random_floats(n_k1 + 1, 0.5f, seed + 2);
    float* dv10 = random_floats(n_k1 + 1, 0.5f, seed + 3);
    floatX* dq;
    float *dk0, *dv0, *dk1 = NULL, *dv1 = NULL, *delta;
    cudaCheck(cudaMalloc(&dq, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dk0, n_k0 * sizeof(float)));
    cudaCheck(cudaMalloc(&dv0, n_k0 * sizeof(float)));
    if (n_k1 > 0) {
        cudaCheck(cudaMalloc(&dk1, n_k1 * sizeof(float)));
        cudaCheck(cudaMalloc(&dv1, n_k1 * sizeof(float)));
    }
    cudaCheck(cudaMalloc(&delta, n_stat * sizeof(float)));
    // Tolerances. delta and version 1's key gradients: fp32 sums of products of exact inputs,
    // 1e-5. dq is stored in floatX: 1e-5 in fp32 builds, 1e-2 in bf16 (one rounding to 8
    // significant bits costs ~1.6e-3 of the norm). Version 2 also rounds P (for dv) and dS (for
    // dk, dq) to bf16 before the products, one rounding more per term: measured a few 1e-3, so
    // 1e-2 keeps a margin and stays far below what a wrong mask or head gives (order 1).
    double tol_f32 = 1e-5, tol_dq = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
    int bf16_scores = attention3_floatx_scores && sizeof(floatX) < 4;  // (measured 6.5e-3 at most: 2e-2)
    if (bf16_scores) { tol_dq = 2e-2; }
    float* first[5] = {NULL, NULL, NULL, NULL, NULL};  // dq, dk0, dv0, dk1, dv1 of the last block size
    for (int version = 0; version < N_VERSIONS; version++) {
        if (!version_checked(version, k)) { continue; }
        // (versions 3 and 4 round P and dS to floatX as version 2 does: exact in fp32 builds; the
        // trainer's is one of them where it is not version 1)
        double tol_kv = version == 1 || version == 5 || sizeof(floatX) == 4 ? tol_f32 : bf16_scores ? 2e-2 : 1e-2;
        int n_runs = n_check_blocks(version, k) + 1;  // the last block size twice: same bits?
        for (int run = 0; run < n_runs; run++) {
            int bi = run < n_runs - 1 ? run : run - 1;
            int block = check_block(version, k, bi);
            poison(dq, n_q * sizeof(floatX));
            poison(delta, n_stat * sizeof(float));
            cudaCheck(cudaMemcpy(dk0, dk00, n_k0 * sizeof(float), cudaMemcpyHostToDevice));
            cudaCheck(cudaMemcpy(dv0, dv00, n_k0 * sizeof(float), cudaMemcpyHostToDevice));
            if (n_k1 > 0) {
                cudaCheck(cudaMemcpy(dk1, dk10, n_k1 * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(dv1, dv10, n_k1 * sizeof(float), cudaMemcpyHostToDevice));
            }
            run_backward(version, block, k, dq, dk0, dv0, dk1, dv1, delta);
            char label[200], what[300];
            case_label(label, sizeof(label), k, version, block);
            float* got[5] = {from_device_x(dq, n_q), from_device_f(dk0, n_k0), from_device_f(dv0, n_k0),
                             n_k1 > 0 ? from_device_f(dk1, n_k1) : NULL, n_k1 > 0 ? from_device_f(dv1, n_k1) : NULL};
            size_t sizes[5] = {n_q, n_k0, n_k0, n_k1, n_k1};
            if (run == n_runs - 1) {  // the second run at the same block size: bit for bit the first
                size_t differ = 0, total = 0, each[5] = {0, 0, 0, 0, 0};
                for (int t = 0; t < 5; t++) {
                    for (size_t e = 0; e < sizes[t]; e++) {
                        each[t] += memcmp(&got[t][e], &first[t][e], sizeof(float)) != 0;
                    }
                    differ += each[t];
                    total += sizes[t];
                }
                snprintf(what, sizeof(what), "%s: run again, dq dk dv bit for bit: %zu of %zu differ (dq %zu, dk %zu, "
                         "dv %zu)", label, differ, total, each[0], each[1] + each[3], each[2] + each[4]);
                check_true(what, differ == 0);
                for (int t = 0; t < 5; t++) { free(got[t]); free(first[t]); first[t] = NULL; }
                continue;
            }
            float* got_delta = from_device_f(delta, n_stat);
            snprintf(what, sizeof(what), "%s: delta", label);
            check_close_v(version, what, got_delta, ref.delta, n_stat, tol_f32);
            snprintf(what, sizeof(what), "%s: dq", label);
            check_close_v(version, what, got[0], ref.dq, n_q, tol_dq);
            const char* names[5] = {"dq", "dk first keys", "dv first keys", "dk second keys", "dv second keys"};
            const float* before[5] = {NULL, dk00, dv00, dk10, dv10};
            const double* refs[5] = {ref.dq, ref.dk0, ref.dv0, ref.dk1, ref.dv1};
            for (int t = 1; t < 5; t++) {
                if (sizes[t] == 0) { continue; }
                // what the kernel added, in a copy: (a - b) + b need not give back a's bits, and got
                // stays as the kernel left it for the bit-for-bit comparison of the next run
                float* added = (float*)mallocCheck(sizes[t] * sizeof(float));
                for (size_t e = 0; e < sizes[t]; e++) { added[e] = got[t][e] - before[t][e]; }
                snprintf(what, sizeof(what), "%s: %s (+=)", label, names[t]);
                check_close_v(version, what, added, refs[t], sizes[t], tol_kv);
                free(added);
            }
            free(got_delta);
            for (int t = 0; t < 5; t++) { free(first[t]); first[t] = got[t]; }
        }
    }
    cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dk0)); cudaCheck(cudaFree(dv0));
    cudaCheck(cudaFree(dk1)); cudaCheck(cudaFree(dv1)); cudaCheck(cudaFree(delta));
    free(dk00); free(dv00); free(dk10); free(dv10);
    free_grads(&ref);
}

// The vision calls' key gradients in floatX (gqa_attention_backward's dkx, dvx, as the trainer asks
// for them): bit for bit the fp32 sums from zero, converted (version 4 writes them directly, the
// others accumulate, then convert)
static void check_backward_x(const Case* k) {
    if (k->pass != PASS_VISION) { return; }
    GqaAttn a = case_attn(k);
    size_t n_q = (size_t)k->B * k->Tq * k->NH * k->HS, n_kv = (size_t)k->B * a.Nk0 * k->NKV * k->HS;
    size_t n_stat = (size_t)k->B * k->NH * k->Tq;
    floatX *dq, *want_k, *want_v, *got_k, *got_v;
    float *dkf, *dvf, *delta;
    cudaCheck(cudaMalloc(&dq, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&want_k, n_kv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&want_v, n_kv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&got_k, n_kv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&got_v, n_kv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dkf, n_kv * sizeof(float)));
    cudaCheck(cudaMalloc(&dvf, n_kv * sizeof(float)));
    cudaCheck(cudaMalloc(&delta, n_stat * sizeof(float)));
    cudaCheck(cudaMemset(dkf, 0, n_kv * sizeof(float)));
    cudaCheck(cudaMemset(dvf, 0, n_kv * sizeof(float)));
    gqa_attention_backward(dq, dkf, dvf, NULL, NULL, k->d_dout, k->d_q, k->d_out, k->d_lse, delta, a);
    convert(want_k, dkf, n_kv);
    convert(want_v, dvf, n_kv);
    poison(dkf, n_kv * sizeof(float));
    poison(dvf, n_kv * sizeof(float));
    poison(got_k, n_kv * sizeof(floatX));
    poison(got_v, n_kv * sizeof(floatX));
    gqa_attention_backward(dq, dkf, dvf, NULL, NULL, k->d_dout, k->d_q, k->d_out, k->d_lse, delta, a, got_k, got_v);
    size_t bytes = n_kv * sizeof(floatX), differ = 0;
    uint8_t* h[4];
    floatX* d[4] = {want_k, want_v, got_k, got_v};
    for (int i = 0; i < 4; i++) {
        h[i] = (uint8_t*)mallocCheck(bytes);
        cudaCheck(cudaMemcpy(h[i], d[i], bytes, cudaMemcpyDeviceToHost));
    }
    for (size_t e = 0; e < n_kv; e++) {
        differ += memcmp(h[0] + e * sizeof(floatX), h[2] + e * sizeof(floatX), sizeof(floatX)) != 0;
        differ += memcmp(h[1] + e * sizeof(floatX), h[3] + e * sizeof(floatX), sizeof(floatX)) != 0;
    }
    for (int i = 0; i < 4; i++) { free(h[i]); }
    char label[200], what[300];
    case_label(label, sizeof(label), k, 0, BLOCK);
    snprintf(what, sizeof(what), "%s: dk, dv in floatX (the launcher's dkx, dvx) bit for bit the fp32 sums converted: "
             "%zu of %zu differ", label, differ, 2 * n_kv);
    check_true(what, differ == 0);
    cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(want_k)); cudaCheck(cudaFree(want_v)); cudaCheck(cudaFree(got_k));
    cudaCheck(cudaFree(got_v)); cudaCheck(cudaFree(dkf)); cudaCheck(cudaFree(dvf)); cudaCheck(cudaFree(delta));
}

// Version 4's forward again at 64 and at 128 queries a block (two row tiles a warp: training's
// vision calls, and large batches' masked ones), whichever the trainer's rule gives these calls
static void check_forward4_blocks(const Case* k) {
    if (!version_takes(4, k)) { return; }
    only_version = 4;
    for (v4_queries = 64; v4_queries <= 128; v4_queries += 64) {
        printf("(version 4, %d queries a block)\n", v4_queries);
        check_forward(k);
    }
    v4_queries = 0;
    only_version = -1;
}

// One call at a model's shapes: the forward and the backward of each version and variant that takes
// it, beside the trainer's launchers: version 3 with every image a pass, 16 and 8 (B >= NH), and in
// bf16 builds with its scores in bf16; version 4 at 64 and 128 queries a forward block
static void benchmark(int model, int pass, int B, int NH, int NKV, int HS, int NI, int T, int H) {
    Case k = make_case(model, pass, B, NH, NKV, HS, NI, T, H, FORWARD_NONE, 7);
    GqaAttn a = case_attn(&k);
    int first = 0;  // the forward the backward's timings read: the first version that takes the call
    while (version_refusal(first, &k) != NULL) { first++; }
    int nk = gqa_n_keys(a), D = NH * HS, Dkv = NKV * HS;
    size_t n_q = (size_t)B * a.Tq * D, n_k0 = (size_t)B * a.Nk0 * Dkv, n_k1 = (size_t)B * a.Nk1 * Dkv;
    size_t n_stat = (size_t)B * NH * a.Tq;
    cudaCheck(cudaMalloc(&k.d_out, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&k.d_lse, n_stat * sizeof(float)));
    run_forward(first, 256, k.d_out, k.d_lse, &k);
    floatX* dq;
    float *dk0, *dv0, *dk1 = NULL, *dv1 = NULL, *delta;
    cudaCheck(cudaMalloc(&dq, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dk0, n_k0 * sizeof(float)));
    cudaCheck(cudaMalloc(&dv0, n_k0 * sizeof(float)));
    cudaCheck(cudaMemset(dk0, 0, n_k0 * sizeof(float)));
    cudaCheck(cudaMemset(dv0, 0, n_k0 * sizeof(float)));
    if (n_k1 > 0) {
        cudaCheck(cudaMalloc(&dk1, n_k1 * sizeof(float)));
        cudaCheck(cudaMalloc(&dv1, n_k1 * sizeof(float)));
        cudaCheck(cudaMemset(dk1, 0, n_k1 * sizeof(float)));
        cudaCheck(cudaMemset(dv1, 0, n_k1 * sizeof(float)));
    }
    cudaCheck(cudaMalloc(&delta, n_stat * sizeof(float)));
    floatX* out;
    float* lse;
    cudaCheck(cudaMalloc(&out, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, n_stat * sizeof(float)));
    // Q K^T and P V over every key, masked or not (4 B NH Tq nk HS); the backward's five products
    // (S, dP, dV, dQ, dK) likewise; version 2 computes S and dP twice, which is not counted
    double flops_fwd = 4.0 * B * NH * a.Tq * nk * HS, flops_bwd = 2.5 * flops_fwd;
    const int per_pass[] = {0, 16, 8};  // version 3: 8 images of 1,024 tokens are 32 MiB of fp32 scores
    for (int version = 0; version < N_VERSIONS; version++) {
        if (!version_takes(version, &k)) { continue; }
        int variants = version == 3 ? 3 * (1 + HAVE_V2) : version == 4 ? 2 : 1;
        for (int variant = 0; variant < variants; variant++) {
            int n = per_pass[variant % 3];
            if (version == 3 && n > 0 && (B < NH || B % n != 0 || n >= B)) { continue; }
            attention3_samples_per_pass = version == 3 ? n : 0;
            attention3_floatx_scores = version == 3 && variant >= 3;
            v4_queries = version == 4 ? 64 * (1 + variant) : 0;
            int reps = version == 1 || version == 5 ? 5 : 20;
            double ms_f = time_ms([&]() { run_forward(version, 256, out, lse, &k); }, reps);
            double ms_b = time_ms([&]() { run_backward(version, 256, &k, dq, dk0, dv0, dk1, dv1, delta); }, reps);
            char per[48] = "";
            int at = n > 0 ? snprintf(per, sizeof(per), ", %d a pass", n) : 0;
            if (attention3_floatx_scores) { snprintf(per + at, sizeof(per) - at, ", bf16 scores"); }
            if (version == 4) { snprintf(per, sizeof(per), ", %d queries a block", v4_queries); }
            printf("bench %-7s %-7s %-17s (B %d, NH %d, NKV %d, HS %d, %4d queries x %4d keys%s): forward %8.3f ms "
                   "%6.1f TFLOP/s, backward %8.3f ms %6.1f TFLOP/s\n", version_name(version), model_names[model],
                   pass_names[pass], B, NH, NKV, HS, a.Tq, nk, per, ms_f, flops_fwd / (ms_f * 1e-3) / 1e12, ms_b,
                   flops_bwd / (ms_b * 1e-3) / 1e12);
        }
        attention3_samples_per_pass = 0;
        attention3_floatx_scores = 0;
        v4_queries = 0;
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse)); cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dk0));
    cudaCheck(cudaFree(dv0)); cudaCheck(cudaFree(dk1)); cudaCheck(cudaFree(dv1)); cudaCheck(cudaFree(delta));
    free_case(&k);
}

// smolvla_base: batch 32, a prefix of 2 cameras x 64 image tokens + 48 text tokens (instructions of
// different lengths, the rest pads) + the state = 177 tokens, 50 actions, 15 query heads on 5 kv
// heads of 64; the vision tower: 64 images (32 samples x 2 cameras) of 1024 tokens, 12 heads of 64,
// and inference's 2 images (one sample, 2 cameras).
// pi0: batch 8, a prefix of 2 cameras x 256 image tokens + 48 text tokens = 560, a suffix of the
// state and 50 actions = 51, 8 query heads on one kv head of 256: the prefill of sampling (the
// prefix alone) and the joint layers' prefix rows and suffix rows (the expert's, and sampling's
// steps); SigLIP so400m: 16 images (8 samples x 2 cameras) of 256 tokens, 16 heads of 72
static void benchmarks(void) {
    for (int pass = PASS_PREFIX; pass <= PASS_CROSS; pass++) {
        benchmark(MODEL_SMOLVLA, pass, 32, 15, 5, 64, 128, 48, 50);
    }
    benchmark(MODEL_SMOLVLA, PASS_VISION, 64, 12, 12, 64, 1024, 1, 0);
    benchmark(MODEL_SMOLVLA, PASS_VISION, 2, 12, 12, 64, 1024, 1, 0);
    for (int pass = PASS_PREFIX; pass <= PASS_JOINT_SUFFIX; pass++) {
        benchmark(MODEL_PI0, pass, 8, 8, 1, 256, 512, 48, 50);
    }
    benchmark(MODEL_PI0, PASS_VISION, 16, 16, 16, 72, 256, 1, 0);
}

// pi0's mask from its block ids (pi0_token_blocks) against the rule LeRobot's pi0 masks with, token
// pair by token pair: prefix tokens see every valid prefix token and no suffix token; the state sees the
// prefix and itself; an action sees the prefix, the state and every action; a pad sees nothing and
// nothing sees it. The kernels and the reference read the same ids, so only this check can tell a
// wrong layout (SmolVLA's causal actions, say) from pi0's.
static void check_pi0_mask(void) {
    const int NI = 4, T = 5, text_len = 3, H = 4, n = NI + T + 1 + H;
    int block[n];
    pi0_token_blocks(block, NI, T, text_len, H);
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            bool pad_i = i >= NI + text_len && i < NI + T, pad_j = j >= NI + text_len && j < NI + T;
            bool prefix_j = j < NI + T, action_i = i > NI + T;
            bool want = !pad_i && !pad_j && (prefix_j || j == i || action_i);
            bool got = block[j] >= 0 && block[j] <= block[i];
            wrong += want != got;
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "pi0's mask (%d images, %d of %d text tokens, the state, %d actions) as LeRobot's: "
             "%d of %d pairs wrong", NI, text_len, T, H, wrong, n * n);
    check_true(what, wrong == 0);
}

// Which versions take a pi0 call at its head size, 256: version 5 alone, and the trainer's launchers,
// which run it. Each other version says why not in the one line it stops with when asked (version_call).
static void check_refusals(const Case* k) {
    int takers = 0;
    printf("the %s %s call at HS %d, NH %d, NKV %d:\n", model_names[k->model], pass_names[k->pass], k->HS, k->NH,
           k->NKV);
    for (int version = 0; version < N_VERSIONS; version++) {
        const char* why = version_refusal(version, k);
        printf("  %-7s %s\n", version_name(version), why == NULL ? "takes it" : why);
        takers |= (why == NULL) << version;
    }
    check_true("at head size 256 version 5 (and the trainer's launchers, through it) takes the call, every other "
               "version refuses it", takers == ((1 << 5) | 1));
}

int main(void) {
    dev_init("attention_smolvla");
    matmul_init();  // version 3's products
    // GQA groups of 1, 2, 3 and 5 query heads per kv head; head sizes through every padding of
    // version 2 and with scalar loads (8, 12); suffixes and prefixes of more than one 64-row tile
    // (a prefix of 65 tokens: the state alone in the second tile, the last key it sees the first of
    // a tile); text pads in every sample (so padded queries, which see no key); a head of 200, past
    // 128 and not a multiple of 32 (version 5 alone)
    struct { int B, NH, NKV, HS, NI, T, H; } shapes[] = {
        {2, 3, 1, 16, 16, 6, 5}, {2, 4, 2, 64, 24, 10, 7}, {1, 2, 2, 8, 4, 3, 70}, {1, 3, 1, 32, 48, 16, 6},
        {1, 2, 1, 128, 8, 4, 3}, {2, 5, 1, 12, 10, 5, 4}, {1, 2, 1, 200, 6, 3, 3},
    };
    uint64_t seed = 100;
    // ATTENTION_VISION_ONLY=1: the vision tower's cases alone (e.g. under compute-sanitizer)
    const char* vision_only = getenv("ATTENTION_VISION_ONLY");
    size_t n_shapes = vision_only != NULL && strcmp(vision_only, "1") == 0 ? 0 : sizeof(shapes) / sizeof(shapes[0]);
    for (size_t s = 0; s < n_shapes; s++) {
        for (int pass = 0; pass < N_PASSES; pass++) {
            if (pass == PASS_VISION) { continue; }
            Case k = make_case(MODEL_SMOLVLA, pass, shapes[s].B, shapes[s].NH, shapes[s].NKV, shapes[s].HS,
                               shapes[s].NI, shapes[s].T, shapes[s].H, FORWARD_HOST, seed);
            check_forward(&k);
            check_backward(&k, seed + 50);
            check_forward4_blocks(&k);
            free_case(&k);
            seed += 10;
        }
    }
    // pi0's Gemma layers: 8 query heads on one kv head, pi0's layout (the state and one block of
    // actions in the suffix, text pads in the prefix). At its head size, 256, which version 5 alone
    // takes, in every call pi0 makes (fewer tokens than pi0's 560 + 51, for the emulation): the
    // prefill of sampling (prefix), the joint layers' prefix rows and suffix rows, and the random
    // mask. At 64, where versions 2 and 4 take it too, the suffix rows on keys [56 prefix ; 12
    // suffix]: the state and the action block straddle the first 64-key tile's end (the prefix rows
    // are SmolVLA's prefix, checked above)
    struct { int B, NH, NKV, HS, NI, T, H, passes; } pi0_shapes[] = {
        {2, 8, 1, 256, 16, 6, 5, 4}, {1, 8, 1, 64, 48, 8, 11, 1},
    };
    const int pi0_passes[] = {PASS_JOINT_SUFFIX, PASS_PREFIX, PASS_JOINT_PREFIX, PASS_RANDOM};
    check_pi0_mask();
    for (size_t s = 0; s < (n_shapes > 0 ? sizeof(pi0_shapes) / sizeof(pi0_shapes[0]) : 0); s++) {
        for (int p = 0; p < pi0_shapes[s].passes; p++) {
            Case k = make_case(MODEL_PI0, pi0_passes[p], pi0_shapes[s].B, pi0_shapes[s].NH, pi0_shapes[s].NKV,
                               pi0_shapes[s].HS, pi0_shapes[s].NI, pi0_shapes[s].T, pi0_shapes[s].H, FORWARD_HOST,
                               seed);
            if (k.HS == 256 && p == 0) { check_refusals(&k); }
            check_forward(&k);
            check_backward(&k, seed + 50);
            check_forward4_blocks(&k);
            free_case(&k);
            seed += 10;
        }
    }
    // the vision tower: no mask, as many kv heads as query heads; 96 tokens: a tile and a half;
    // version 3 batches the images per head (B >= NH) or the heads per image (B < NH)
    // (and a head size of 24, padded to 32: the small preset's; 72, pi0's SigLIP's, padded to 128
    // by version 2 and past version 4's 64)
    struct { int model, B, NH, HS, N; } vision[] = {
        {MODEL_SMOLVLA, 1, 2, 64, 96}, {MODEL_SMOLVLA, 2, 3, 16, 40}, {MODEL_SMOLVLA, 3, 2, 32, 40},
        {MODEL_SMOLVLA, 2, 2, 24, 70}, {MODEL_PI0, 1, 2, 72, 40},
    };
    for (size_t s = 0; s < sizeof(vision) / sizeof(vision[0]); s++) {
        Case k = make_case(vision[s].model, PASS_VISION, vision[s].B, vision[s].NH, vision[s].NH, vision[s].HS,
                           vision[s].N, 1, 0, FORWARD_HOST, seed);
        check_forward(&k);
        check_backward(&k, seed + 50);
        check_backward_x(&k);
        only_version = 3;
        if (k.B >= k.NH && k.B > 1) {  // version 3 again, one image a pass
            attention3_samples_per_pass = 1;
            printf("(version 3, one image a pass)\n");
            check_forward(&k);
            check_backward(&k, seed + 50);
            attention3_samples_per_pass = 0;
        }
        if (HAVE_V2) {  // and with its scores in bf16 (bf16 builds)
            attention3_floatx_scores = 1;
            printf("(version 3, the scores in bf16)\n");
            check_forward(&k);
            check_backward(&k, seed + 50);
            attention3_floatx_scores = 0;
        }
        only_version = -1;
        check_forward4_blocks(&k);
        free_case(&k);
        seed += 10;
    }
    printf("worst relative error: the trainer's %.2e, version 1 %.2e", worst_err[0], worst_err[1]);
    if (HAVE_V2) { printf(", version 2 %.2e", worst_err[2]); }
    printf(", version 3 %.2e", worst_err[3]);
    if (HAVE_V4) { printf(", version 4 %.2e", worst_err[4]); }
    printf(", version 5 %.2e\n", worst_err[5]);
    return dev_finish(benchmarks);
}
