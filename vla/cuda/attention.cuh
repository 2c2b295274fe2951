/*
vla/cuda/attention.cuh: attention as LeRobot computes it: grouped-query heads (query head h reads kv
head h / (NH/NKV)), a per-token block mask (a query sees keys of its block and earlier ones, pads
nothing), finfo.min fill, keys from one or two tensors (the expert's cross layers read the VLM's).
Forward writes out and the log-sum-exp; backward the query's gradient and accumulates the keys' and
values'. Versions: 4 (flash attention on mma.sync, bf16 builds), 2 (WMMA tiles, fp16 builds), 1 (a
warp a query) and 5 (head sizes past 128); attention_version chooses, for the launchers
gqa_attention_forward and _backward and for the config table alike.
VLA_ATTENTION_WMMA, defined before including this header, compiles version 2 in bf16 builds too (dev/cuda).
*/
#ifndef VLA_CUDA_ATTENTION_CUH
#define VLA_CUDA_ATTENTION_CUH

#include "common.cuh"
#include "profiler.cuh"
#include "copy.cuh"
#include <mma.h>

// ---- attention: the softmax backward's shared term (SmolVLA's GQA kernels below)

// delta (B, NH, Tq): delta_i = sum_j P_ij dP_ij = rowsum(dO_i * O_i) since O = P V. Warp per (row, head).
__global__ void attention_delta_kernel(float* delta, const floatX* dout, const floatX* out, int rows, int Tq,
                                       int NH, int HS) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= rows * NH) { return; }
    int h = warp % NH, row = warp / NH;
    size_t at = (size_t)row * NH * HS + (size_t)h * HS;
    float s = 0.0f;
    for (int c = lane; c < HS; c += 32) { s += f32(dout[at + c]) * f32(out[at + c]); }
    s = warp_sum(s);
    if (lane == 0) { delta[((size_t)(row / Tq) * NH + h) * Tq + row % Tq] = s; }
}

// Version 2: 128-bit loads, HS / x128::size lanes per (row, head), summed by xor shuffles
__global__ void attention_delta_kernel2(float* delta, const floatX* dout, const floatX* out, int rows, int Tq, int NH,
                                        int HS) {
    int lanes = HS / x128::size;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, pair = idx / lanes;  // pair: (row, head)
    bool live = pair < (size_t)rows * NH;
    float s = 0.0f;
    if (live) {
        size_t at = pair * HS + idx % lanes * x128::size;  // ((row, head) rows of HS)
        x128 d = load128(dout + at), o = load128(out + at);
        #pragma unroll
        for (int k = 0; k < x128::size; k++) { s += f32(d.v[k]) * f32(o.v[k]); }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) { s += __shfl_xor_sync(0xffffffffu, s, offset); }
    if (live && idx % lanes == 0) {
        size_t row = pair / NH, h = pair % NH;
        delta[(row / Tq * NH + h) * Tq + row % Tq] = s;
    }
}

// ---- attention as LeRobot computes it (GQA, per-token block mask, finfo.min fill): dev/cuda/attention_smolvla.cu

// One attention call: Tq queries of NH heads against nk = Nk0 + Nk1 keys/values of NKV heads, the
// first Nk0 from k0/v0, the rest from k1/v1. GQA: query head h reads kv head h / (NH / NKV).
// The mask as make_att_2d_masks derives it: block[t] is token t's cumulative block id or -1 for a
// pad; key j is visible to query i (token q0 + i) iff 0 <= block[j] <= block[q0 + i]. NULL: no mask.
typedef struct {
    const floatX* k0; const floatX* v0;  // (B, Nk0, NKV*HS) keys and values 0 .. Nk0-1
    const floatX* k1; const floatX* v1;  // (B, Nk1, NKV*HS) keys Nk0 .. nk-1, NULL when Nk1 = 0
    const int* block;                    // (B, Nt) per-token block ids, -1 for pads; NULL: no mask
    int B, NH, NKV, HS;
    int Tq, q0;                          // queries per sample; the token of query 0 in block
    int Nk0, Nk1, Nt;                    // Nt: tokens per sample in block (q0 + Tq and nk at most Nt)
} GqaAttn;

// LeRobot fills masked scores with finfo(float32).min, not -inf: a masked key gets exp = 0 where
// a query sees some key; where it sees none, the softmax is uniform (output the mean of the values,
// lse -FLT_MAX). The backward reads that mark: dv gets dO / nk at every key, q and k nothing.
#define ATTN_NO_KEY_LSE (-FLT_MAX)

static __host__ __device__ __forceinline__ int gqa_n_keys(const GqaAttn& a) { return a.Nk0 + a.Nk1; }

// offset of head g of key (value, gradient) j of sample b: in the first tensor below Nk0, else the second
static __host__ __device__ __forceinline__ size_t gqa_key_at(const GqaAttn& a, int b, int j, int g) {
    size_t row = j < a.Nk0 ? (size_t)b * a.Nk0 + j : (size_t)b * a.Nk1 + (j - a.Nk0);
    return row * a.NKV * a.HS + (size_t)g * a.HS;
}

// block ids of query i and key j of sample b; without a mask every query sees every key
static __device__ __forceinline__ int gqa_query_block(const GqaAttn& a, int b, int i) {
    return a.block != nullptr ? a.block[(size_t)b * a.Nt + a.q0 + i] : INT_MAX;
}
static __device__ __forceinline__ int gqa_key_block(const GqaAttn& a, int b, int j) {
    return a.block != nullptr ? a.block[(size_t)b * a.Nt + j] : 0;
}
static __device__ __forceinline__ bool gqa_sees(int query_block, int key_block) {
    return key_block >= 0 && key_block <= query_block;
}

// Versions 1 and 5 (below): one warp per (sample, head, query), online softmax, VALS values of a head
// a lane (head sizes up to 32 VALS). out (B, Tq, NH*HS), lse (B, NH, Tq).
template <int VALS>
static __device__ __forceinline__ void gqa_attention_forward_warp(floatX* out, float* lse, const floatX* q, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS;
    float qv[VALS], acc[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        qv[u] = c < a.HS ? f32(q[row + c]) : 0.0f;
        acc[u] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < nk; j++) {
        if (!gqa_sees(qb, gqa_key_block(a, b, j))) { continue; }  // the same for the whole warp
        const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + gqa_key_at(a, b, j, g);
        const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
        float s = 0.0f;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { s += qv[u] * f32(kj[c]); } }
        s = warp_sum(s) * scale;
        float m_new = fmaxf(mx, s), corr = expf(mx - m_new), p = expf(s - m_new);
        sum = sum * corr + p;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) {
            acc[u] = acc[u] * corr + (c < a.HS ? p * f32(vj[c]) : 0.0f);
        }
        mx = m_new;
    }
    bool seen = sum > 0.0f;  // sum >= 1 once a key is visible: the maximum's own term
    if (!seen) {  // no key visible: the uniform softmax of the fills, the mean of every value
        for (int j = 0; j < nk; j++) {
            const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { acc[u] += f32(vj[c]); } }
        }
        sum = (float)nk;
    }
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { out[row + c] = fx(acc[u] / sum); } }
    if (lane == 0) { lse[((size_t)b * a.NH + h) * a.Tq + i] = seen ? mx + logf(sum) : ATTN_NO_KEY_LSE; }
}

// Versions 1 and 5 backward, query side: P = exp(scale S - lse), dP = dO V^T, dS = P * (dP - delta),
// dq = scale dS K. One warp per (sample, head, query); dq (B, Tq, NH*HS) overwritten.
template <int VALS>
static __device__ __forceinline__ void gqa_attention_backward_dq_warp(floatX* dq, const floatX* dout, const floatX* q,
                                                                     const float* lse, const float* delta, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS, stat = ((size_t)b * a.NH + h) * a.Tq + i;
    float l = lse[stat], dl = delta[stat];
    float qv[VALS], dov[VALS], acc[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        qv[u] = c < a.HS ? f32(q[row + c]) : 0.0f;
        dov[u] = c < a.HS ? f32(dout[row + c]) : 0.0f;
        acc[u] = 0.0f;
    }
    for (int j = 0; j < nk; j++) {
        if (!gqa_sees(qb, gqa_key_block(a, b, j))) { continue; }
        const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + gqa_key_at(a, b, j, g);
        const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
        float s = 0.0f, dp = 0.0f;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) {
            if (c < a.HS) { s += qv[u] * f32(kj[c]); dp += dov[u] * f32(vj[c]); }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        float p = expf(s * scale - l);
        float ds = p * (dp - dl) * scale;
        #pragma unroll
        for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { acc[u] += ds * f32(kj[c]); } }
    }
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { dq[row + c] = fx(acc[u]); } }
}

// Versions 1 and 5 backward, key side: dv += P^T dO, dk += scale dS^T Q. One warp per (sample, kv head, key);
// dk0/dv0 (B, Nk0, NKV*HS), dk1/dv1 (B, Nk1, NKV*HS) fp32, accumulated in a fixed order.
template <int VALS>
static __device__ __forceinline__ void gqa_attention_backward_dkdv_warp(float* dk0, float* dv0, float* dk1, float* dv1,
                                                                        const floatX* dout, const floatX* q,
                                                                        const float* lse, const float* delta,
                                                                        GqaAttn a) {
    int nk = gqa_n_keys(a);
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NKV * nk) { return; }
    int j = warp % nk, g = warp / nk % a.NKV, b = warp / (nk * a.NKV);
    int G = a.NH / a.NKV, kb = gqa_key_block(a, b, j);
    float scale = 1.0f / sqrtf((float)a.HS), uniform = 1.0f / (float)nk;
    size_t at = gqa_key_at(a, b, j, g);
    const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + at;
    const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + at;
    float kv[VALS], vv[VALS], dk[VALS], dv[VALS];
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) {
        kv[u] = c < a.HS ? f32(kj[c]) : 0.0f;
        vv[u] = c < a.HS ? f32(vj[c]) : 0.0f;
        dk[u] = 0.0f;
        dv[u] = 0.0f;
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i = 0; i < a.Tq; i++) {
            size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS,
                   stat = ((size_t)b * a.NH + h) * a.Tq + i;
            float l = lse[stat];
            if (l == ATTN_NO_KEY_LSE) {  // a query that sees no key: P = 1/nk everywhere, no dS
                #pragma unroll
                for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                    if (c < a.HS) { dv[u] += uniform * f32(dout[row + c]); }
                }
                continue;
            }
            if (!gqa_sees(gqa_query_block(a, b, i), kb)) { continue; }
            float s = 0.0f, dp = 0.0f;
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                if (c < a.HS) { s += f32(q[row + c]) * kv[u]; dp += f32(dout[row + c]) * vv[u]; }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            float p = expf(s * scale - l);
            float ds = p * (dp - delta[stat]) * scale;
            #pragma unroll
            for (int u = 0, c = lane; u < VALS; u++, c += 32) {
                if (c < a.HS) { dv[u] += p * f32(dout[row + c]); dk[u] += ds * f32(q[row + c]); }
            }
        }
    }
    float* dkj = (j < a.Nk0 ? dk0 : dk1) + at;
    float* dvj = (j < a.Nk0 ? dv0 : dv1) + at;
    #pragma unroll
    for (int u = 0, c = lane; u < VALS; u++, c += 32) { if (c < a.HS) { dkj[c] += dk[u]; dvj[c] += dv[u]; } }
}

// Version 1: 4 values of a head a lane (head sizes up to 128). Version 5: 8 (up to 256: pi0's Gemma
// layers, 8 query heads of 256 on one kv head), at most ATT5_MAX_BLOCK threads a block (ptxas gives
// its backward 68 (dq) and 80 (dk/dv) registers on sm_90 unbounded: 1,024 threads would not launch;
// bounded at 256 nothing spills). The launchers take version 5 past head size 128.
#define ATT5_VALS 8
#define ATT5_MAX_BLOCK 256
__global__ void gqa_attention_forward_kernel1(floatX* out, float* lse, const floatX* q, GqaAttn a) {
    gqa_attention_forward_warp<4>(out, lse, q, a);
}
__global__ void gqa_attention_backward_dq_kernel1(floatX* dq, const floatX* dout, const floatX* q, const float* lse,
                                                  const float* delta, GqaAttn a) {
    gqa_attention_backward_dq_warp<4>(dq, dout, q, lse, delta, a);
}
__global__ void gqa_attention_backward_dkdv_kernel1(float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                                    const floatX* q, const float* lse, const float* delta, GqaAttn a) {
    gqa_attention_backward_dkdv_warp<4>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_forward_kernel5(floatX* out, float* lse,
    const floatX* q, GqaAttn a) {
    gqa_attention_forward_warp<ATT5_VALS>(out, lse, q, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_backward_dq_kernel5(floatX* dq, const floatX* dout,
                                                                                    const floatX* q, const float* lse,
                                                                                    const float* delta, GqaAttn a) {
    gqa_attention_backward_dq_warp<ATT5_VALS>(dq, dout, q, lse, delta, a);
}
__global__ void __launch_bounds__(ATT5_MAX_BLOCK) gqa_attention_backward_dkdv_kernel5(float* dk0, float* dv0,
    float* dk1, float* dv1, const floatX* dout, const floatX* q, const float* lse, const float* delta, GqaAttn a) {
    gqa_attention_backward_dkdv_warp<ATT5_VALS>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
}

#if defined(ENABLE_FP16) || (defined(VLA_ATTENTION_WMMA) && !defined(ENABLE_FP32))
// fp16 GPUs (sm_70, sm_75) have no bf16 mma.sync for version 4: version 2 runs on WMMA instead
#define ATT_TILE 64
#define ATT_THREADS 128
using namespace nvcuda;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, floatX, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::row_major> FragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::col_major> FragBt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// One tile row's slice of a head, x128::size columns at a time when the head size allows it
// (HS a multiple of x128::size: every 16 bytes of a row are aligned), else one by one; zeros
// past HS, or for the whole row when there is no source row (src NULL).
static __device__ __forceinline__ void load_tile_slice(floatX* dst, const floatX* src, int HS, int c) {
    if (HS % x128::size == 0) {
        x128 v;
        if (src != nullptr && c < HS) {
            v = load128(src + c);
        } else {
            #pragma unroll
            for (int k = 0; k < x128::size; k++) { v.v[k] = fx(0.0f); }
        }
        store128(dst + c, v);
    } else {
        #pragma unroll
        for (int k = 0; k < x128::size; k++) {
            dst[c + k] = (src != nullptr && c + k < HS) ? src[c + k] : fx(0.0f);
        }
    }
}

// tile (ATT_TILE, HSP) <- rows first.. of one head of a (rows, D) tensor: zeros past n_rows and HS
template <int HSP>
static __device__ void load_query_tile(floatX* tile, const floatX* x, int b, int h, int first, int n_rows,
                                       int HS, int D) {
    const int packs = HSP / x128::size;
    for (int e = threadIdx.x; e < ATT_TILE * packs; e += blockDim.x) {
        int r = e / packs, c = e % packs * x128::size;
        const floatX* src = first + r < n_rows ? x + ((size_t)b * n_rows + first + r) * D + (size_t)h * HS : nullptr;
        load_tile_slice(tile + r * HSP, src, HS, c);
    }
}

// out (16, 64) of this warp = A rows (16, HSP) times B rows (64, HSP) transposed: scores
template <int HSP>
static __device__ void warp_scores(float* out, const floatX* a_rows, const floatX* b_rows) {
    #pragma unroll
    for (int n = 0; n < ATT_TILE / 16; n++) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
        #pragma unroll
        for (int k = 0; k < HSP / 16; k++) {
            FragA fa;
            FragBt fb;
            wmma::load_matrix_sync(fa, a_rows + k * 16, HSP);
            wmma::load_matrix_sync(fb, b_rows + (size_t)n * 16 * HSP + k * 16, HSP);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, ATT_TILE, wmma::mem_row_major);
    }
}

// acc[n] += P (16, 64) of this warp times V (64, HSP), column block n
template <int HSP>
static __device__ void warp_accumulate(FragC* acc, const floatX* p_rows, const floatX* v) {
    #pragma unroll
    for (int n = 0; n < HSP / 16; n++) {
        #pragma unroll
        for (int k = 0; k < ATT_TILE / 16; k++) {
            FragA fa;
            FragB fb;
            wmma::load_matrix_sync(fa, p_rows + k * 16, ATT_TILE);
            wmma::load_matrix_sync(fb, v + (size_t)k * 16 * HSP + n * 16, HSP);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// Where a lane of version 2's lane pairs (a row each, lane / 2 of the warp's 16, a half of it each,
// lane % 2) works at step k of its half's n columns: the steps are rotated by the row and the half,
// so that at every step the warp's 32 lanes touch 32 different banks (the rows of S, P and O start
// in the same bank)
static __device__ __forceinline__ int att_rotated_col(int k, int lane, int n) {
    int half = lane % 2;
    return half * n + (k + lane / 2 + 16 * half) % n;
}

// tile (ATT_TILE, HSP) <- head g of keys (or values) first.. of sample b: zeros past nk and HS
template <int HSP>
static __device__ void gqa_load_key_tile(floatX* tile, const GqaAttn& a, const floatX* x0, const floatX* x1,
                                         int b, int g, int first) {
    const int packs = HSP / x128::size;
    int nk = gqa_n_keys(a);
    for (int e = threadIdx.x; e < ATT_TILE * packs; e += blockDim.x) {
        int r = e / packs, c = e % packs * x128::size, j = first + r;
        const floatX* src = j < nk ? (j < a.Nk0 ? x0 : x1) + gqa_key_at(a, b, j, g) : nullptr;
        load_tile_slice(tile + r * HSP, src, a.HS, c);
    }
}

// blk (ATT_TILE) <- the block ids of keys first.. (key_side) or queries first.. of sample b; -1
// past the end, so that rows and columns that are not there see and are seen by nothing
static __device__ void gqa_load_blocks(int* blk, const GqaAttn& a, int b, int first, bool key_side) {
    for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) {
        int t = first + r;
        if (key_side) {
            blk[r] = t < gqa_n_keys(a) ? gqa_key_block(a, b, t) : -1;
        } else {
            blk[r] = t < a.Tq ? gqa_query_block(a, b, t) : -1;
        }
    }
}

// the largest v over the block, to every thread (blockDim.x a multiple of 32); shared: 32 ints
static __device__ int block_max_int(int v, int* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        int o = __shfl_xor_sync(0xffffffffu, v, offset);
        v = o > v ? o : v;
    }
    __syncthreads();  // the previous call's readers are done with shared
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    v = lane < n_warps ? shared[lane] : INT_MIN;
    for (int offset = 16; offset > 0; offset /= 2) {
        int o = __shfl_xor_sync(0xffffffffu, v, offset);
        v = o > v ? o : v;
    }
    return v;
}

// How many keys the query tile (block ids qblk, in shared memory) needs: one past the last key
// that any of its queries sees. The keys after it are skipped: the joint layer's prefix rows stop
// before the suffix, which they never see.
static __device__ int gqa_key_end(const GqaAttn& a, int b, const int* qblk, int* shared) {
    if (a.block == nullptr) { return gqa_n_keys(a); }
    int qmax = -1, end = 0;
    for (int r = 0; r < ATT_TILE; r++) { qmax = qblk[r] > qmax ? qblk[r] : qmax; }
    for (int j = threadIdx.x; j < gqa_n_keys(a); j += blockDim.x) {
        if (gqa_sees(qmax, gqa_key_block(a, b, j))) { end = j + 1; }
    }
    return block_max_int(end, shared);
}

// Q, K, V (64, HSP) floatX, P (64, 64) floatX, S (64, 64) and O (64, HSP) fp32, row max and sum, the
// query and key block ids, 32 ints for block_max_int
template <int HSP>
static size_t gqa_attention_forward_smem2(void) {
    return 3 * (size_t)ATT_TILE * HSP * 2 + (size_t)ATT_TILE * ATT_TILE * 2 + (size_t)ATT_TILE * ATT_TILE * 4 +
           (size_t)ATT_TILE * HSP * 4 + 4 * ATT_TILE * 4 + 32 * 4;
}

// Version 2 forward: a block takes 64 queries of one (sample, head) and walks the keys of its kv
// head 64 at a time, up to the last one the tile sees.
template <int HSP>
__global__ void __launch_bounds__(ATT_THREADS) gqa_attention_forward_kernel2(floatX* out, float* lse, const floatX* q,
                                                                              GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    floatX* Qs = (floatX*)att_smem;    // (64, HSP)
    floatX* Ks = Qs + ATT_TILE * HSP;  // (64, HSP)
    floatX* Vs = Ks + ATT_TILE * HSP;  // (64, HSP)
    floatX* Ps = Vs + ATT_TILE * HSP;  // (64, 64) probabilities
    float* S = (float*)(Ps + ATT_TILE * ATT_TILE);   // (64, 64) scores
    float* O = S + ATT_TILE * ATT_TILE;              // (64, HSP) unnormalized output
    float* row_m = O + ATT_TILE * HSP;               // (64) running max
    float* row_l = row_m + ATT_TILE;                 // (64) running sum
    int* qblk = (int*)(row_l + ATT_TILE);            // (64) block ids of the queries
    int* kblk = qblk + ATT_TILE;                     // (64) block ids of the key tile
    int* scratch = kblk + ATT_TILE;                  // (32)
    int i0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z;
    int g = h / (a.NH / a.NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int nk = gqa_n_keys(a), D = a.NH * a.HS;
    float scale = 1.0f / sqrtf((float)a.HS);
    load_query_tile<HSP>(Qs, q, b, h, i0, a.Tq, a.HS, D);
    gqa_load_blocks(qblk, a, b, i0, false);
    for (int e = threadIdx.x; e < ATT_TILE * HSP; e += blockDim.x) { O[e] = 0.0f; }
    for (int r = threadIdx.x; r < ATT_TILE; r += blockDim.x) { row_m[r] = -INFINITY; row_l[r] = 0.0f; }
    __syncthreads();
    int key_end = gqa_key_end(a, b, qblk, scratch);
    // each warp owns rows 16w..16w+15 of S, P, O; a lane pair owns one row, a half of it each
    int r = warp * 16 + lane / 2, half = lane % 2, qb = qblk[r];
    for (int j0 = 0; j0 < key_end; j0 += ATT_TILE) {
        __syncthreads();  // the previous tile's K, V and block ids are no longer read
        gqa_load_key_tile<HSP>(Ks, a, a.k0, a.k1, b, g, j0);
        gqa_load_key_tile<HSP>(Vs, a, a.v0, a.v1, b, g, j0);
        gqa_load_blocks(kblk, a, b, j0, true);
        __syncthreads();
        warp_scores<HSP>(S + warp * 16 * ATT_TILE, Qs + warp * 16 * HSP, Ks);
        __syncwarp();
        float* srow = S + r * ATT_TILE;
        float tile_max = -INFINITY;
        for (int k = 0; k < 32; k++) {
            int c = att_rotated_col(k, lane, 32);
            float s = gqa_sees(qb, kblk[c]) ? srow[c] * scale : -INFINITY;  // masked: exactly 0 below
            srow[c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float m_old = row_m[r], m_new = fmaxf(m_old, tile_max);
        float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: exp gives 0, not NaN
        float psum = 0.0f;
        for (int k = 0; k < 32; k++) {
            int c = att_rotated_col(k, lane, 32);
            float p = expf(srow[c] - m_ref);
            Ps[r * ATT_TILE + c] = fx(p);
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        float corr = expf(m_old - m_ref);
        for (int k = 0; k < HSP / 2; k++) { O[r * HSP + att_rotated_col(k, lane, HSP / 2)] *= corr; }
        __syncwarp();  // both lanes of the pair have read row_m, row_l
        if (half == 0) {
            row_m[r] = m_new;
            row_l[r] = row_l[r] * corr + psum;
        }
        __syncwarp();
        FragC acc[HSP / 16];
        #pragma unroll
        for (int n = 0; n < HSP / 16; n++) {
            wmma::load_matrix_sync(acc[n], O + warp * 16 * HSP + n * 16, HSP, wmma::mem_row_major);
        }
        warp_accumulate<HSP>(acc, Ps + warp * 16 * ATT_TILE, Vs);
        #pragma unroll
        for (int n = 0; n < HSP / 16; n++) {
            wmma::store_matrix_sync(O + warp * 16 * HSP + n * 16, acc[n], HSP, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_TILE * a.HS; e += blockDim.x) {
        int rr = e / a.HS, c = e % a.HS;
        if (i0 + rr >= a.Tq) { continue; }
        float o;
        if (row_l[rr] > 0.0f) {
            o = O[rr * HSP + c] / row_l[rr];
        } else {  // no key visible: the uniform softmax of the fills, the mean of every value
            o = 0.0f;
            for (int j = 0; j < nk; j++) { o += f32(((j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g))[c]); }
            o /= (float)nk;
        }
        out[((size_t)b * a.Tq + i0 + rr) * D + (size_t)h * a.HS + c] = fx(o);
    }
    for (int rr = threadIdx.x; rr < ATT_TILE; rr += blockDim.x) {
        if (i0 + rr < a.Tq) {
            lse[((size_t)b * a.NH + h) * a.Tq + i0 + rr] =
                row_l[rr] > 0.0f ? row_m[rr] + logf(row_l[rr]) : ATTN_NO_KEY_LSE;
        }
    }
}

// both backward kernels: four (64, HSP) floatX tiles, two (64, 64) floatX and two (64, 64) fp32,
// two rows of statistics, two of block ids, 32 ints for block_max_int
template <int HSP>
static size_t gqa_attention_backward_smem2(void) {
    return 4 * (size_t)ATT_TILE * HSP * 2 + 2 * (size_t)ATT_TILE * ATT_TILE * 2 + 2 * (size_t)ATT_TILE * ATT_TILE * 4 +
           4 * ATT_TILE * 4 + 32 * 4;
}

// Version 2 backward, query side: dq = scale dS K for 64 queries per block, key tile by key tile
// up to the last key the tile sees; dq overwritten (0 for a query that sees no key).
template <int HSP>
__global__ void __launch_bounds__(ATT_THREADS) gqa_attention_backward_dq_kernel2(floatX* dq, const floatX* dout,
                                                                                  const floatX* q, const float* lse,
                                                                                  const float* delta, GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    floatX* Qs = (floatX*)att_smem;     // (64, HSP)
    floatX* dOs = Qs + ATT_TILE * HSP;  // (64, HSP)
    floatX* Ks = dOs + ATT_TILE * HSP;  // (64, HSP)
    floatX* Vs = Ks + ATT_TILE * HSP;   // (64, HSP)
    floatX* dSs = Vs + ATT_TILE * HSP;  // (64, 64)
    float* S = (float*)(dSs + ATT_TILE * ATT_TILE);  // (64, 64)
    float* dP = S + ATT_TILE * ATT_TILE;             // (64, 64)
    float* row_lse = dP + ATT_TILE * ATT_TILE;
    float* row_delta = row_lse + ATT_TILE;
    int* qblk = (int*)(row_delta + ATT_TILE);
    int* kblk = qblk + ATT_TILE;
    int* scratch = kblk + ATT_TILE;
    int i0 = blockIdx.x * ATT_TILE, h = blockIdx.y, b = blockIdx.z;
    int g = h / (a.NH / a.NKV), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int D = a.NH * a.HS;
    float scale = 1.0f / sqrtf((float)a.HS);
    load_query_tile<HSP>(Qs, q, b, h, i0, a.Tq, a.HS, D);
    load_query_tile<HSP>(dOs, dout, b, h, i0, a.Tq, a.HS, D);
    gqa_load_blocks(qblk, a, b, i0, false);
    for (int rr = threadIdx.x; rr < ATT_TILE; rr += blockDim.x) {
        size_t stat = ((size_t)b * a.NH + h) * a.Tq + i0 + rr;
        row_lse[rr] = i0 + rr < a.Tq ? lse[stat] : 0.0f;
        row_delta[rr] = i0 + rr < a.Tq ? delta[stat] : 0.0f;
    }
    __syncthreads();
    int key_end = gqa_key_end(a, b, qblk, scratch);
    FragC acc[HSP / 16];
    #pragma unroll
    for (int n = 0; n < HSP / 16; n++) { wmma::fill_fragment(acc[n], 0.0f); }
    int r = warp * 16 + lane / 2, qb = qblk[r];  // a lane pair a row, half of it each (att_rotated_col)
    for (int j0 = 0; j0 < key_end; j0 += ATT_TILE) {
        __syncthreads();
        gqa_load_key_tile<HSP>(Ks, a, a.k0, a.k1, b, g, j0);
        gqa_load_key_tile<HSP>(Vs, a, a.v0, a.v1, b, g, j0);
        gqa_load_blocks(kblk, a, b, j0, true);
        __syncthreads();
        warp_scores<HSP>(S + warp * 16 * ATT_TILE, Qs + warp * 16 * HSP, Ks);
        warp_scores<HSP>(dP + warp * 16 * ATT_TILE, dOs + warp * 16 * HSP, Vs);
        __syncwarp();
        for (int k = 0; k < 32; k++) {
            int c = att_rotated_col(k, lane, 32);
            float ds = 0.0f;
            if (gqa_sees(qb, kblk[c])) {
                float p = expf(S[r * ATT_TILE + c] * scale - row_lse[r]);
                ds = p * (dP[r * ATT_TILE + c] - row_delta[r]) * scale;
            }
            dSs[r * ATT_TILE + c] = fx(ds);
        }
        __syncwarp();
        warp_accumulate<HSP>(acc, dSs + warp * 16 * ATT_TILE, Ks);
    }
    __syncthreads();
    float* stage = S;  // (64, HSP) fp32 over S and dP, free now
    #pragma unroll
    for (int n = 0; n < HSP / 16; n++) {
        wmma::store_matrix_sync(stage + warp * 16 * HSP + n * 16, acc[n], HSP, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ATT_TILE * a.HS; e += blockDim.x) {
        int rr = e / a.HS, c = e % a.HS;
        if (i0 + rr < a.Tq) { dq[((size_t)b * a.Tq + i0 + rr) * D + (size_t)h * a.HS + c] = fx(stage[rr * HSP + c]); }
    }
}

// Version 2 backward, key side: dv += P^T dO and dk += scale dS^T Q for 64 keys of one kv head
// per block (4 warps of 16 keys), over the NH / NKV query heads that read it, query tile by query
// tile in a fixed order; every key row is written by one block only, accumulating into fp32.
template <int HSP>
__global__ void __launch_bounds__(ATT_THREADS) gqa_attention_backward_dkdv_kernel2(float* dk0, float* dv0, float* dk1,
                                                                                    float* dv1, const floatX* dout,
                                                                                    const floatX* q, const float* lse,
                                                                                    const float* delta, GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    floatX* Ks = (floatX*)att_smem;          // (64 keys, HSP)
    floatX* Vs = Ks + ATT_TILE * HSP;
    floatX* Qs = Vs + ATT_TILE * HSP;        // (64 queries, HSP)
    floatX* dOs = Qs + ATT_TILE * HSP;
    floatX* Pt = dOs + ATT_TILE * HSP;       // (64 keys, 64 queries)
    floatX* dSt = Pt + ATT_TILE * ATT_TILE;
    float* St = (float*)(dSt + ATT_TILE * ATT_TILE);  // (64 keys, 64 queries)
    float* dPt = St + ATT_TILE * ATT_TILE;
    float* q_lse = dPt + ATT_TILE * ATT_TILE;
    float* q_delta = q_lse + ATT_TILE;
    int* qblk = (int*)(q_delta + ATT_TILE);
    int* kblk = qblk + ATT_TILE;
    int j0 = blockIdx.x * ATT_TILE, g = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int nk = gqa_n_keys(a), D = a.NH * a.HS, G = a.NH / a.NKV;
    float scale = 1.0f / sqrtf((float)a.HS), uniform = 1.0f / (float)nk;
    gqa_load_key_tile<HSP>(Ks, a, a.k0, a.k1, b, g, j0);
    gqa_load_key_tile<HSP>(Vs, a, a.v0, a.v1, b, g, j0);
    gqa_load_blocks(kblk, a, b, j0, true);
    FragC acc_dk[HSP / 16], acc_dv[HSP / 16];
    #pragma unroll
    for (int n = 0; n < HSP / 16; n++) { wmma::fill_fragment(acc_dk[n], 0.0f); wmma::fill_fragment(acc_dv[n], 0.0f); }
    int r = warp * 16 + lane / 2, j = j0 + r;  // a lane pair a key row, half of it each (att_rotated_col)
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i0 = 0; i0 < a.Tq; i0 += ATT_TILE) {
            __syncthreads();  // the previous tile's Q, dO and statistics are no longer read
            load_query_tile<HSP>(Qs, q, b, h, i0, a.Tq, a.HS, D);
            load_query_tile<HSP>(dOs, dout, b, h, i0, a.Tq, a.HS, D);
            gqa_load_blocks(qblk, a, b, i0, false);
            for (int cc = threadIdx.x; cc < ATT_TILE; cc += blockDim.x) {
                size_t stat = ((size_t)b * a.NH + h) * a.Tq + i0 + cc;
                q_lse[cc] = i0 + cc < a.Tq ? lse[stat] : 0.0f;
                q_delta[cc] = i0 + cc < a.Tq ? delta[stat] : 0.0f;
            }
            __syncthreads();
            int kb = kblk[r];
            warp_scores<HSP>(St + warp * 16 * ATT_TILE, Ks + warp * 16 * HSP, Qs);
            warp_scores<HSP>(dPt + warp * 16 * ATT_TILE, Vs + warp * 16 * HSP, dOs);
            __syncwarp();
            for (int k = 0; k < 32; k++) {
                int c = att_rotated_col(k, lane, 32);
                float p = 0.0f, ds = 0.0f;
                if (j < nk && i0 + c < a.Tq) {
                    if (q_lse[c] == ATTN_NO_KEY_LSE) {  // a query that sees no key: P = 1/nk, no dS
                        p = uniform;
                    } else if (gqa_sees(qblk[c], kb)) {
                        p = expf(St[r * ATT_TILE + c] * scale - q_lse[c]);
                        ds = p * (dPt[r * ATT_TILE + c] - q_delta[c]) * scale;
                    }
                }
                Pt[r * ATT_TILE + c] = fx(p);
                dSt[r * ATT_TILE + c] = fx(ds);
            }
            __syncwarp();
            warp_accumulate<HSP>(acc_dv, Pt + warp * 16 * ATT_TILE, dOs);
            warp_accumulate<HSP>(acc_dk, dSt + warp * 16 * ATT_TILE, Qs);
        }
    }
    float* stage = St;  // (64, HSP) fp32 over St and dP^T
    for (int which = 0; which < 2; which++) {
        __syncthreads();
        #pragma unroll
        for (int n = 0; n < HSP / 16; n++) {
            wmma::store_matrix_sync(stage + warp * 16 * HSP + n * 16, which == 0 ? acc_dk[n] : acc_dv[n], HSP,
                                    wmma::mem_row_major);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_TILE * a.HS; e += blockDim.x) {
            int rr = e / a.HS, c = e % a.HS, jj = j0 + rr;
            if (jj >= nk) { continue; }
            float* dst = which == 0 ? (jj < a.Nk0 ? dk0 : dk1) : (jj < a.Nk0 ? dv0 : dv1);
            dst[gqa_key_at(a, b, jj, g) + c] += stage[rr * HSP + c];
        }
    }
}
#endif

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
// Version 4 (bf16, head sizes multiples of 8 up to 64): flash attention through mma.sync m16n8k16.
// PTX documents fragment layouts (WMMA does not), so scores, probabilities and outputs stay in
// registers. 4 warps own 64 rows (128 in large forward calls); the other side streams through shared
// memory, two cp.async stages. In a 16x8 accumulator lane 4 g + t holds rows g, g + 8 at columns 2t,
// 2t + 1: a row's max or sum is two quad shuffles. The backward: dq and dk/dv kernels, no atomics.
#define ATT4_ROWS 64
#define ATT4_THREADS 128
// unmasked dk/dv blocks a multiprocessor holds: 3, not ptxas's 2 at 178 registers (three spill to L1)
#define ATT4_DKDV_BLOCKS 3

// two neighbouring floatX as one register (what store_x2 stores), the first in the low half
static __device__ __forceinline__ uint32_t pack_f2(float lo, float hi) {
    floatX x[2] = {fx(lo), fx(hi)};
    uint16_t l, h;
    memcpy(&l, &x[0], 2);
    memcpy(&h, &x[1], 2);
    return (uint32_t)l | (uint32_t)h << 16;
}

// tile (64, HSP + 8) <- rows first.. of one head (then head1's), zeros past; HSP + 8 avoids bank conflicts.
template <int HSP>
static __device__ void att4_load_tile(floatX* tile, const floatX* head, int first, int n_rows, int HS, size_t D,
                                      const floatX* head1 = NULL, int n_rows1 = 0) {
    const int LD = HSP + 8, pieces = HSP / 8;
    for (int e = threadIdx.x; e < ATT4_ROWS * pieces; e += blockDim.x) {
        int r = e / pieces, c = e % pieces * 8, row = first + r;
        floatX* dst = tile + r * LD + c;
        if (row < n_rows && c < HS) {
            cp_async16(dst, head + (size_t)row * D + c);
        } else if (row >= n_rows && row < n_rows + n_rows1 && c < HS) {
            cp_async16(dst, head1 + (size_t)(row - n_rows) * D + c);
        } else {
            x128 zero;
            #pragma unroll
            for (int k = 0; k < x128::size; k++) { zero.v[k] = fx(0.0f); }
            store128(dst, zero);
        }
    }
}

// Fragments from a row-major floatX tile at p: the A operand (16x16) in a[0..3]'s quarter order
static __device__ __forceinline__ void att4_frag_a(uint32_t* a, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<false>(a, p + (l % 8 + 8 * (m % 2)) * ld + 8 * (m / 2));
}
// the B operands (16x8) of two 8-column tiles whose columns are the tile's rows: b[0..1], b[2..3]
static __device__ __forceinline__ void att4_frag_b2_rows(uint32_t* b, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<false>(b, p + (l % 8 + 8 * (m / 2)) * ld + 8 * (m % 2));
}
// the same pair as the tile holds it, B(k, n) = p[k ld + n]: transposed loads
static __device__ __forceinline__ void att4_frag_b2_cols(uint32_t* b, const floatX* p, int ld) {
    int l = threadIdx.x % 32, m = l / 8;
    ldsm_x4<true>(b, p + (l % 8 + 8 * (m % 2)) * ld + 8 * (m / 2));
}

// s[mt] (16 x 64) = A[mt] (16 x HSP) times the tile's 64 rows transposed; each B fragment serves all MT
template <int HSP, int MT = 1>
static __device__ __forceinline__ void att4_products(float (*s)[ATT4_ROWS / 8][4], const uint32_t (*af)[HSP / 16][4],
                                                     const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j++) { s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f; }
    }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j += 2) {
        #pragma unroll
        for (int kk = 0; kk < HSP / 16; kk++) {
            uint32_t bf[4];
            att4_frag_b2_rows(bf, tile + j * 8 * LD + kk * 16, LD);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(s[mt][j], af[mt][kk], bf);
                mma_16816(s[mt][j + 1], af[mt][kk], bf + 2);
            }
        }
    }
}

// The same for one row tile, A from shared memory a k step at a time (the dk/dv register budget)
template <int HSP>
static __device__ __forceinline__ void att4_products_smem(float (*s)[4], const floatX* a, const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) { s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f; }
    #pragma unroll
    for (int kk = 0; kk < HSP / 16; kk++) {
        uint32_t af[4];
        att4_frag_a(af, a + kk * 16, LD);
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j += 2) {
            uint32_t bf[4];
            att4_frag_b2_rows(bf, tile + j * 8 * LD + kk * 16, LD);
            mma_16816(s[j], af, bf);
            mma_16816(s[j + 1], af, bf + 2);
        }
    }
}

// acc[mt] (16 x HSP) += P[mt] (16 x 64: accumulators p[mt] rounded to floatX) times the tile (64 x HSP)
template <int HSP, int MT = 1>
static __device__ __forceinline__ void att4_accumulate(float (*acc)[HSP / 8][4], const float (*p)[ATT4_ROWS / 8][4],
                                                       const floatX* tile) {
    const int LD = HSP + 8;
    #pragma unroll
    for (int kk = 0; kk < ATT4_ROWS / 16; kk++) {
        uint32_t pa[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const float* lo = p[mt][2 * kk];
            const float* hi = p[mt][2 * kk + 1];
            pa[mt][0] = pack_f2(lo[0], lo[1]);
            pa[mt][1] = pack_f2(lo[2], lo[3]);
            pa[mt][2] = pack_f2(hi[0], hi[1]);
            pa[mt][3] = pack_f2(hi[2], hi[3]);
        }
        #pragma unroll
        for (int n = 0; n < HSP / 8; n += 2) {
            uint32_t bf[4];
            att4_frag_b2_cols(bf, tile + kk * 16 * LD + n * 8, LD);
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_16816(acc[mt][n], pa[mt], bf);
                mma_16816(acc[mt][n + 1], pa[mt], bf + 2);
            }
        }
    }
}

static __device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#define LOG2E_F 1.4426950408889634f

// shared memory of version 4: six (64, HSP + 8) tiles, two stages of 64 lse/delta and of 64 block ids
template <int HSP>
static size_t gqa_attention_smem4(void) {
    return 6 * (size_t)ATT4_ROWS * (HSP + 8) * sizeof(floatX) + 4 * ATT4_ROWS * sizeof(float) +
           2 * ATT4_ROWS * sizeof(int);
}
template <int HSP>
static __device__ __forceinline__ int* att4_block_ids(float* smem) {
    return (int*)((floatX*)smem + 6 * ATT4_ROWS * (HSP + 8) + 8 * ATT4_ROWS);
}

// ids (64) <- block ids of rows first.. of sample b (token offset + row); -1 past n: seen by nothing
static __device__ __forceinline__ void att4_load_block_ids(int* ids, const GqaAttn& a, int b, int first, int offset,
                                                           int n) {
    for (int i = threadIdx.x; i < ATT4_ROWS; i += blockDim.x) {
        int t = first + i;
        ids[i] = t < n ? a.block[(size_t)b * a.Nt + offset + t] : -1;
    }
}

// head h of sample b of a (B, rows, D) tensor: where its row 0 starts
static __device__ __forceinline__ const floatX* att4_head(const floatX* x, int b, int rows, int h, int HS, size_t D) {
    return x + (size_t)b * rows * D + (size_t)h * HS;
}

// Tile `next` of x and y into stage next % 2, committed; that stage was last read before a barrier.
template <int HSP>
static __device__ __forceinline__ void att4_prefetch(floatX* stages, const floatX* x, const floatX* y, int next,
                                                     int n_tiles, int n_rows, int HS, size_t D, const floatX* x1 = NULL,
                                                     const floatX* y1 = NULL, int n_rows1 = 0) {
    if (next >= n_tiles) { return; }
    const int TILE = ATT4_ROWS * (HSP + 8);
    floatX* to = stages + (next % 2) * 2 * TILE;
    att4_load_tile<HSP>(to, x, next * ATT4_ROWS, n_rows, HS, D, x1, n_rows1);
    att4_load_tile<HSP>(to + TILE, y, next * ATT4_ROWS, n_rows, HS, D, y1, n_rows1);
    cp_async_commit();
}

// kv head g of sample b: its row 0 in the first key tensor (k0, v0) and in the second (NULL: none)
static __device__ __forceinline__ const floatX* att4_kv0(const floatX* x, const GqaAttn& a, int b, int g) {
    return x + (size_t)b * a.Nk0 * a.NKV * a.HS + (size_t)g * a.HS;
}
static __device__ __forceinline__ const floatX* att4_kv1(const floatX* x, const GqaAttn& a, int b, int g) {
    return a.Nk1 > 0 ? x + (size_t)b * a.Nk1 * a.NKV * a.HS + (size_t)g * a.HS : NULL;
}

// key tile `next` of kv head g: keys, values (and block ids when masked) into stage next % 2
template <int HSP, bool MASK>
static __device__ __forceinline__ void att4_prefetch_keys(floatX* KV, int* kblk, const GqaAttn& a, int b, int g,
                                                          int next, int n_tiles) {
    if (next >= n_tiles) { return; }
    att4_prefetch<HSP>(KV, att4_kv0(a.k0, a, b, g), att4_kv0(a.v0, a, b, g), next, n_tiles, a.Nk0, a.HS,
                       (size_t)a.NKV * a.HS, att4_kv1(a.k1, a, b, g), att4_kv1(a.v1, a, b, g), a.Nk1);
    if (MASK) { att4_load_block_ids(kblk + (next % 2) * ATT4_ROWS, a, b, next * ATT4_ROWS, 0, gqa_n_keys(a)); }
}

// acc's row r <- the mean of all nk values of kv head g: the output of a query that sees no key
template <int HSP>
static __device__ void att4_mean_values(float (*acc)[4], int r, const GqaAttn& a, int b, int g) {
    int t = threadIdx.x % 4, nk = gqa_n_keys(a);
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        int c = n * 8 + 2 * t;
        float s0 = 0.0f, s1 = 0.0f;
        if (c < a.HS) {
            for (int j = 0; j < nk; j++) {
                const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g) + c;
                s0 += f32(vj[0]);
                s1 += f32(vj[1]);
            }
        }
        acc[n][2 * r] = s0 / (float)nk;
        acc[n][2 * r + 1] = s1 / (float)nk;
    }
}

// a warp's acc (16 x HSP) into rows row0.. (below T) as floatX, rows g and g + 8 times mul[0], mul[1]
template <int HSP>
static __device__ __forceinline__ void att4_store_rows(floatX* head, const float (*acc)[4], int row0, int T, int HS,
                                                       size_t D, const float* mul) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        if (row >= T) { continue; }
        #pragma unroll
        for (int n = 0; n < HSP / 8; n++) {
            int c = n * 8 + 2 * t;
            if (c < HS) {
                store_x2(head + (size_t)row * D + c, pack_f2(acc[n][2 * r] * mul[r], acc[n][2 * r + 1] * mul[r]));
            }
        }
    }
}

// whether key tile jt needs masking: every tile of a masked call, else a last partial one
template <bool MASK>
static __device__ __forceinline__ bool att4_has_holes(int jt, int N) { return MASK || (jt + 1) * ATT4_ROWS > N; }

// s <- -inf where the query does not see the key (MASK: block ids; else keys from N on): exp gives 0
template <bool MASK>
static __device__ __forceinline__ void att4_mask_scores(float (*s)[4], const int* qb, const int* kb, int key0, int N) {
    int t = threadIdx.x % 4;
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            int col = j * 8 + 2 * t + i % 2;
            bool seen = MASK ? gqa_sees(qb[i / 2], kb[col]) : key0 + col < N;  // (kb: -1 past N)
            if (!seen) { s[j][i] = -INFINITY; }
        }
    }
}

// The online softmax over one key tile: s (16 x 64) -> 2^(s sl2 - m), with m (running max of rows g,
// g + 8) and l (this lane's part of the sum) updated and o rescaled by 2^(m_old - m_new).
template <int HSP, bool MASK, bool HOLES>
static __device__ __forceinline__ void att4_online_softmax(float (*s)[4], float (*o)[4], float* m, float* l, float sl2,
                                                           const int* qb, const int* kb, int key0, int N) {
    if (HOLES) { att4_mask_scores<MASK>(s, qb, kb, key0, N); }
    float mx[2] = {-INFINITY, -INFINITY};  // the rows' largest raw scores
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { mx[i / 2] = fmaxf(mx[i / 2], s[j][i]); }
    }
    float corr[2], base[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {  // (no key seen yet: m stays -inf, base 0, no NaN)
        float mnew = fmaxf(m[r], quad_max(mx[r]) * sl2);
        base[r] = mnew == -INFINITY ? 0.0f : mnew;
        corr[r] = fast_exp2(m[r] - base[r]);
        m[r] = mnew;
        l[r] *= corr[r];
    }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {  // 2^(s sl2 - base): one FFMA, one MUFU.EX2
            s[j][i] = fast_exp2(fmaf(s[j][i], sl2, -base[i / 2]));
            l[i / 2] += s[j][i];
        }
    }
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { o[n][i] *= corr[i / 2]; }
    }
}

// Version 4 forward: 64 MT queries of one (sample, head) a block, softmax in base 2; MT = 2 for large calls.
template <int HSP, int MT, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS) gqa_attention_forward_kernel4(floatX* out, float* lse, const floatX* q,
                                                                              GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Qs = (floatX*)att_smem;  // MT slabs of 64 queries
    floatX* KV = Qs + MT * TILE;     // stage s: keys at KV + 2 s TILE, their values after them
    int* kblk = att4_block_ids<HSP>(att_smem);  // stage s: the keys' block ids at kblk + 64 s
    int i0 = blockIdx.x * ATT4_ROWS * MT, h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        att4_load_tile<HSP>(Qs + mt * TILE, att4_head(q, b, T, h, HS, D), i0 + mt * ATT4_ROWS, T, HS, D);
    }
    int n_tiles = (N + ATT4_ROWS - 1) / ATT4_ROWS;
    att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, 0, n_tiles);
    int qb[MT][2];  // rows g and g + 8: their block ids (masked calls; -1 past T)
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = i0 + mt * ATT4_ROWS + warp * 16 + g + 8 * r;
            qb[mt][r] = MASK && row < T ? gqa_query_block(a, b, row) : -1;
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[MT][HSP / 16][4];
    float o[MT][HSP / 8][4];
    float m[MT][2], l[MT][2];  // rows g and g + 8 of each row tile; l: this lane's part of the sum
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        #pragma unroll
        for (int kk = 0; kk < HSP / 16; kk++) {
            att4_frag_a(qf[mt][kk], Qs + mt * TILE + warp * 16 * LD + kk * 16, LD);
        }
#pragma unroll
        for (int n = 0; n < HSP / 8; n++) { o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f; }
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    const float sl2 = LOG2E_F / sqrtf((float)HS);
    for (int jt = 0; jt < n_tiles; jt++) {
        const floatX* Kt = KV + (jt % 2) * 2 * TILE;
        const int* kb = kblk + (jt % 2) * ATT4_ROWS;
        att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, jt + 1, n_tiles);
        float s[MT][ATT4_ROWS / 8][4];
        att4_products<HSP, MT>(s, qf, Kt);
        if (att4_has_holes<MASK>(jt, N)) {
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att4_online_softmax<HSP, MASK, true>(s[mt], o[mt], m[mt], l[mt], sl2, qb[mt], kb, jt * ATT4_ROWS, N);
            }
        } else {
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                att4_online_softmax<HSP, MASK, false>(s[mt], o[mt], m[mt], l[mt], sl2, qb[mt], kb, jt * ATT4_ROWS, N);
            }
        }
        att4_accumulate<HSP, MT>(o, s, Kt + TILE);
        cp_async_wait<0>();
        __syncthreads();
    }
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        int row0 = i0 + mt * ATT4_ROWS + warp * 16;
        float inv[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = row0 + g + 8 * r;
            float sum = quad_sum(l[mt][r]);
            bool none = MASK && sum == 0.0f;  // (vision: every row sees every key)
            inv[r] = none ? 1.0f : 1.0f / sum;
            if (none && row < T) { att4_mean_values<HSP>(o[mt], r, a, b, kvh); }
            if (t == 0 && row < T) {
                lse[((size_t)b * a.NH + h) * T + row] = none ? ATTN_NO_KEY_LSE : (m[mt][r] + log2f(sum)) / LOG2E_F;
            }
        }
        att4_store_rows<HSP>((floatX*)att4_head(out, b, T, h, HS, D), o[mt], row0, T, HS, D, inv);
    }
}

// s <- dS / scale = P (dP - delta), P = 2^(s sl2 - lse2): 0 where masked or lse2 = +inf
template <bool MASK, bool HOLES>
static __device__ __forceinline__ void att4_dq_scores(float (*s)[4], const float (*dp)[4], const float* lse2,
                                                      const float* dl, float sl2, const int* qb, const int* kb,
                                                      int key0, int N) {
    if (HOLES) { att4_mask_scores<MASK>(s, qb, kb, key0, N); }
    #pragma unroll
    for (int j = 0; j < ATT4_ROWS / 8; j++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { s[j][i] = fast_exp2(fmaf(s[j][i], sl2, -lse2[i / 2])) * (dp[j][i] - dl[i / 2]); }
    }
}

// Version 4 backward, query side: dq = scale dS K for 64 queries of one (sample, head); overwritten.
template <int HSP, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS) gqa_attention_backward_dq_kernel4(floatX* dq, const floatX* dout,
                                                                                  const floatX* q, const float* lse,
                                                                                  const float* delta, GqaAttn a) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Qs = (floatX*)att_smem;
    floatX* dOs = Qs + TILE;
    floatX* KV = dOs + TILE;  // two stages of keys then values, as the forward's
    int* kblk = att4_block_ids<HSP>(att_smem);
    int i0 = blockIdx.x * ATT4_ROWS, h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS;
    att4_load_tile<HSP>(Qs, att4_head(q, b, T, h, HS, D), i0, T, HS, D);
    att4_load_tile<HSP>(dOs, att4_head(dout, b, T, h, HS, D), i0, T, HS, D);
    int n_tiles = (N + ATT4_ROWS - 1) / ATT4_ROWS;
    att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, 0, n_tiles);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HSP / 16][4], dof[HSP / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HSP / 16; kk++) {
        att4_frag_a(qf[kk], Qs + warp * 16 * LD + kk * 16, LD);
        att4_frag_a(dof[kk], dOs + warp * 16 * LD + kk * 16, LD);
    }
    float lse2[2], dl[2];  // rows g and g + 8: lse in base 2 (+inf where P is 0: past T, no key seen), delta
    int qb[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int row = i0 + warp * 16 + g + 8 * r;
        size_t stat = ((size_t)b * a.NH + h) * T + row;
        float l = row < T ? lse[stat] : ATTN_NO_KEY_LSE;
        lse2[r] = l == ATTN_NO_KEY_LSE ? INFINITY : l * LOG2E_F;
        dl[r] = row < T ? delta[stat] : 0.0f;
        qb[r] = MASK && row < T ? gqa_query_block(a, b, row) : -1;
    }
    float acc[HSP / 8][4];
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) { acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f; }
    const float scale = 1.0f / sqrtf((float)HS), sl2 = LOG2E_F * scale;
    for (int jt = 0; jt < n_tiles; jt++) {
        const floatX* Kt = KV + (jt % 2) * 2 * TILE;
        const int* kb = kblk + (jt % 2) * ATT4_ROWS;
        att4_prefetch_keys<HSP, MASK>(KV, kblk, a, b, kvh, jt + 1, n_tiles);
        float s[ATT4_ROWS / 8][4], dp[ATT4_ROWS / 8][4];
        att4_products<HSP>(&s, &qf, Kt);
        att4_products<HSP>(&dp, &dof, Kt + TILE);
        if (att4_has_holes<MASK>(jt, N)) {
            att4_dq_scores<MASK, true>(s, dp, lse2, dl, sl2, qb, kb, jt * ATT4_ROWS, N);
        } else {
            att4_dq_scores<MASK, false>(s, dp, lse2, dl, sl2, qb, kb, jt * ATT4_ROWS, N);
        }
        att4_accumulate<HSP>(&acc, &s, Kt);
        cp_async_wait<0>();
        __syncthreads();
    }
    const float mul[2] = {scale, scale};
    att4_store_rows<HSP>((floatX*)att4_head(dq, b, T, h, HS, D), acc, i0 + warp * 16, T, HS, D, mul);
}

// st <- query tile's 64 lse in base 2 (+inf past T: P = 0; -inf: no key seen, P uniform), then deltas
static __device__ __forceinline__ void att4_load_stats(float* st, const float* lse_h, const float* delta_h, int tile,
                                                       int T) {
    for (int i = threadIdx.x; i < ATT4_ROWS; i += blockDim.x) {
        int row = tile * ATT4_ROWS + i;
        float l = row < T ? lse_h[row] : 0.0f;
        st[i] = row >= T ? INFINITY : l == ATTN_NO_KEY_LSE ? -INFINITY : l * LOG2E_F;
        st[ATT4_ROWS + i] = row < T ? delta_h[row] : 0.0f;
    }
}

// Version 4 backward, key side: dv += P^T dO, dk += scale dS^T Q for 64 keys of one (sample, kv head)
// over its GQA group, on the transposes (S^T = K Q^T). Accumulates dk0/dv0, dk1/dv1, or writes dkx/dvx.
template <int HSP, bool MASK>
__global__ void __launch_bounds__(ATT4_THREADS, MASK ? 1 : ATT4_DKDV_BLOCKS) gqa_attention_backward_dkdv_kernel4(
    float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout, const floatX* q, const float* lse,
    const float* delta, GqaAttn a, floatX* dkx, floatX* dvx) {
    extern __shared__ __align__(128) float att_smem[];
    const int LD = HSP + 8, TILE = ATT4_ROWS * LD;
    floatX* Ks = (floatX*)att_smem;
    floatX* Vs = Ks + TILE;
    floatX* QD = Vs + TILE;  // stage s: queries at QD + 2 s TILE, their dO after them
    float* stats = (float*)(QD + 4 * TILE);  // stage s: 64 lse (base 2) at stats + 128 s, 64 deltas after them
    int* qblk = att4_block_ids<HSP>(att_smem);  // stage s: the queries' block ids at qblk + 64 s
    int j0 = blockIdx.x * ATT4_ROWS, kvh = blockIdx.y, b = blockIdx.z, G = a.NH / a.NKV;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int T = a.Tq, N = gqa_n_keys(a), HS = a.HS;
    size_t D = (size_t)a.NH * HS, Dkv = (size_t)a.NKV * HS;
    att4_load_tile<HSP>(Ks, att4_kv0(a.k0, a, b, kvh), j0, a.Nk0, HS, Dkv, att4_kv1(a.k1, a, b, kvh), a.Nk1);
    att4_load_tile<HSP>(Vs, att4_kv0(a.v0, a, b, kvh), j0, a.Nk0, HS, Dkv, att4_kv1(a.v1, a, b, kvh), a.Nk1);
    // step u n_qt + it: query tile it of the group's head kvh G + u
    int n_qt = (T + ATT4_ROWS - 1) / ATT4_ROWS, n_steps = G * n_qt;
    auto prefetch = [&](int step) {
        if (step >= n_steps) { return; }
        int hh = kvh * G + step / n_qt, it = step % n_qt, stage = step % 2;
        size_t head = (size_t)b * a.NH + hh;
        att4_load_tile<HSP>(QD + stage * 2 * TILE, att4_head(q, b, T, hh, HS, D), it * ATT4_ROWS, T, HS, D);
        att4_load_tile<HSP>(QD + stage * 2 * TILE + TILE, att4_head(dout, b, T, hh, HS, D), it * ATT4_ROWS, T, HS, D);
        cp_async_commit();
        att4_load_stats(stats + stage * 2 * ATT4_ROWS, lse + head * T, delta + head * T, it, T);
        if (MASK) { att4_load_block_ids(qblk + stage * ATT4_ROWS, a, b, it * ATT4_ROWS, a.q0, T); }
    };
    prefetch(0);
    int kb[2];  // keys g and g + 8: their block ids (masked calls)
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = j0 + warp * 16 + g + 8 * r;
        kb[r] = MASK && key < N ? gqa_key_block(a, b, key) : -1;
    }
    cp_async_wait<0>();
    __syncthreads();
    float dka[HSP / 8][4], dva[HSP / 8][4];
    #pragma unroll
    for (int n = 0; n < HSP / 8; n++) {
        dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.0f;
        dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.0f;
    }
    const float scale = 1.0f / sqrtf((float)HS), sl2 = LOG2E_F * scale, uniform = 1.0f / (float)N;
    for (int step = 0; step < n_steps; step++) {
        const floatX* Qt = QD + (step % 2) * 2 * TILE;
        const float* st = stats + (step % 2) * 2 * ATT4_ROWS;
        const int* qbt = qblk + (step % 2) * ATT4_ROWS;
        prefetch(step + 1);
        float p[ATT4_ROWS / 8][4], ds[ATT4_ROWS / 8][4];
        att4_products_smem<HSP>(p, Ks + warp * 16 * LD, Qt);          // S^T
        att4_products_smem<HSP>(ds, Vs + warp * 16 * LD, Qt + TILE);  // dP^T
        #pragma unroll
        for (int j = 0; j < ATT4_ROWS / 8; j++) {
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                int col = j * 8 + 2 * t + i % 2;  // the query in the tile
                float l2 = st[col];               // (+inf past T: P is 0)
                // selects, not branches: no divergence; no key seen (l2 -inf): P uniform, no dS
                bool none = MASK && l2 == -INFINITY, seen = !MASK || gqa_sees(qbt[col], kb[i / 2]);
                float e = fast_exp2(fmaf(p[j][i], sl2, -l2));
                float pj = none ? uniform : seen ? e : 0.0f;
                ds[j][i] = none ? 0.0f : pj * (ds[j][i] - st[ATT4_ROWS + col]);
                p[j][i] = pj;
            }
        }
        att4_accumulate<HSP>(&dva, &p, Qt + TILE);  // dV += P^T dO
        att4_accumulate<HSP>(&dka, &ds, Qt);        // dK += dS^T Q (scaled below)
        cp_async_wait<0>();
        __syncthreads();
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = j0 + warp * 16 + g + 8 * r;
        if (key >= N) { continue; }
        bool first = key < a.Nk0;
        size_t at = gqa_key_at(a, b, key, kvh);
        float* dk = first ? dk0 : dk1;
        float* dv = first ? dv0 : dv1;
        #pragma unroll
        for (int n = 0; n < HSP / 8; n++) {
            int c = n * 8 + 2 * t;
            if (c >= HS) { continue; }
            if (dkx != NULL) {  // (the same for the whole launch)
                store_x2(dkx + at + c, pack_f2(dka[n][2 * r] * scale, dka[n][2 * r + 1] * scale));
                store_x2(dvx + at + c, pack_f2(dva[n][2 * r], dva[n][2 * r + 1]));
                continue;
            }
            dk[at + c] += dka[n][2 * r] * scale;
            dk[at + c + 1] += dka[n][2 * r + 1] * scale;
            dv[at + c] += dva[n][2 * r];
            dv[at + c + 1] += dva[n][2 * r + 1];
        }
    }
}
#endif  // bf16 builds

static int padded_head_dim(int HS) { return HS <= 16 ? 16 : HS <= 32 ? 32 : HS <= 64 ? 64 : 128; }

// ---- attention's launchers: version 4 (bf16) where it fits, version 2 (fp16) where its tiles fit, else 1
// (5 past head size 128)

// what the kernels assume of a call; a mistake here is the caller's
static void gqa_attention_check(const GqaAttn& a) {
    if (a.NKV <= 0 || a.NH % a.NKV != 0) {
        vla_fail("attention: %d query heads are not a multiple of %d kv heads", a.NH, a.NKV);
    }
    if (a.HS > 32 * ATT5_VALS) {
        vla_fail("attention: head size %d: the kernels take head sizes up to %d", a.HS, 32 * ATT5_VALS);
    }
    if (a.Nk0 + a.Nk1 <= 0) { vla_fail("attention: %d + %d keys: a call needs at least one", a.Nk0, a.Nk1); }
    if (a.Nk1 > 0 && (a.k1 == nullptr || a.v1 == nullptr)) {
        vla_fail("attention: %d second keys but no k1/v1 tensors", a.Nk1);
    }
    if (a.block != nullptr && (a.q0 + a.Tq > a.Nt || a.Nk0 + a.Nk1 > a.Nt)) {
        vla_fail("attention: queries %d.. (%d) or %d keys past the mask's %d tokens", a.q0, a.Tq, a.Nk0 + a.Nk1, a.Nt);
    }
}

static void gqa_attention_forward1(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    gqa_attention_forward_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, BLOCK), BLOCK, 0, main_stream>>>(out, lse,
                                                                                                              q, a);
    launchCheck();
}

static void gqa_attention_backward1(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    gqa_attention_backward_dq_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, BLOCK), BLOCK, 0, main_stream>>>(
        dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel1<<<ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, BLOCK), BLOCK, 0,
                                          main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

// Version 5 (head sizes past version 1's 128, up to 256: pi0's) at ATT5_MAX_BLOCK threads
static void gqa_attention_forward5(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    gqa_attention_forward_kernel5<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, ATT5_MAX_BLOCK), ATT5_MAX_BLOCK, 0,
                                    main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward5(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    gqa_attention_backward_dq_kernel5<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, ATT5_MAX_BLOCK), ATT5_MAX_BLOCK, 0,
                                        main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel5<<<ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, ATT5_MAX_BLOCK),
                                          ATT5_MAX_BLOCK, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

#if defined(ENABLE_FP16) || (defined(VLA_ATTENTION_WMMA) && !defined(ENABLE_FP32))
// (dynamic shared memory is set once per GPU: each rank's thread drives one)
template <int HSP>
static void gqa_attention_forward2(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    size_t smem = gqa_attention_forward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_forward_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
        configured = true;
    }
    dim3 grid(ceil_div(a.Tq, ATT_TILE), a.NH, a.B);
    gqa_attention_forward_kernel2<HSP><<<grid, ATT_THREADS, smem, main_stream>>>(out, lse, q, a);
    launchCheck();
}

template <int HSP>
static void gqa_attention_backward2(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    size_t smem = gqa_attention_backward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dq_kernel2<HSP>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dkdv_kernel2<HSP>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    dim3 query_tiles(ceil_div(a.Tq, ATT_TILE), a.NH, a.B), key_tiles(ceil_div(gqa_n_keys(a), ATT_TILE), a.NKV, a.B);
    gqa_attention_backward_dq_kernel2<HSP><<<query_tiles, ATT_THREADS, smem, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel2<HSP><<<key_tiles, ATT_THREADS, smem, main_stream>>>(dk0, dv0, dk1, dv1, dout, q,
                                                                                            lse, delta, a);
    launchCheck();
}

// whether version 2 takes head size HS (up to 128) and its tiles fit shared memory: not on a T4 at 64
// nor a V100 at 128
static bool attention2_fits(int HS, bool backward) {
    if (HS > 128) { return false; }
    static thread_local size_t limit = 0;
    if (limit == 0) {
        int device;
        cudaDeviceProp prop;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaGetDeviceProperties(&prop, device));
        limit = prop.sharedMemPerBlockOptin;
    }
    size_t smem;
    switch (padded_head_dim(HS)) {
        case 16: smem = backward ? gqa_attention_backward_smem2<16>() : gqa_attention_forward_smem2<16>(); break;
        case 32: smem = backward ? gqa_attention_backward_smem2<32>() : gqa_attention_forward_smem2<32>(); break;
        case 64: smem = backward ? gqa_attention_backward_smem2<64>() : gqa_attention_forward_smem2<64>(); break;
        default: smem = backward ? gqa_attention_backward_smem2<128>() : gqa_attention_forward_smem2<128>(); break;
    }
    return smem <= limit;
}

static void gqa_attention_forward2_any(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_forward2<16>(out, lse, q, a); break;
        case 32: gqa_attention_forward2<32>(out, lse, q, a); break;
        case 64: gqa_attention_forward2<64>(out, lse, q, a); break;
        default: gqa_attention_forward2<128>(out, lse, q, a); break;
    }
}
static void gqa_attention_backward2_any(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                        const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_backward2<16>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 32: gqa_attention_backward2<32>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 64: gqa_attention_backward2<64>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        default: gqa_attention_backward2<128>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
    }
}
#endif

#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
// version 4 takes head sizes multiples of 8 up to 64, rows 16-byte aligned
static bool attention4_fits(const GqaAttn& a, const void* x, const void* y, const void* z = NULL) {
    return a.Tq > 0 && a.HS % 8 == 0 && a.HS <= 64 && packable(a.HS, 8, a.k0, a.v0, x) && packable(a.HS, 8, y, z) &&
           (a.Nk1 == 0 || packable(a.HS, 8, a.k1, a.v1));
}

// version 4's kernels by padded head size (16, 32, 64), row tiles a warp (1, 2) and mask (0, 1)
typedef void (*Attention4Forward)(floatX*, float*, const floatX*, GqaAttn);
typedef void (*Attention4Dq)(floatX*, const floatX*, const floatX*, const float*, const float*, GqaAttn);
typedef void (*Attention4Dkdv)(float*, float*, float*, float*, const floatX*, const floatX*, const float*, const float*,
                               GqaAttn, floatX*, floatX*);
static const Attention4Forward ATT4_FORWARD[3][2][2] = {
    {{gqa_attention_forward_kernel4<16, 1, false>, gqa_attention_forward_kernel4<16, 1, true>},
     {gqa_attention_forward_kernel4<16, 2, false>, gqa_attention_forward_kernel4<16, 2, true>}},
    {{gqa_attention_forward_kernel4<32, 1, false>, gqa_attention_forward_kernel4<32, 1, true>},
     {gqa_attention_forward_kernel4<32, 2, false>, gqa_attention_forward_kernel4<32, 2, true>}},
    {{gqa_attention_forward_kernel4<64, 1, false>, gqa_attention_forward_kernel4<64, 1, true>},
     {gqa_attention_forward_kernel4<64, 2, false>, gqa_attention_forward_kernel4<64, 2, true>}}};
static const Attention4Dq ATT4_DQ[3][2] = {
    {gqa_attention_backward_dq_kernel4<16, false>, gqa_attention_backward_dq_kernel4<16, true>},
    {gqa_attention_backward_dq_kernel4<32, false>, gqa_attention_backward_dq_kernel4<32, true>},
    {gqa_attention_backward_dq_kernel4<64, false>, gqa_attention_backward_dq_kernel4<64, true>}};
static const Attention4Dkdv ATT4_DKDV[3][2] = {
    {gqa_attention_backward_dkdv_kernel4<16, false>, gqa_attention_backward_dkdv_kernel4<16, true>},
    {gqa_attention_backward_dkdv_kernel4<32, false>, gqa_attention_backward_dkdv_kernel4<32, true>},
    {gqa_attention_backward_dkdv_kernel4<64, false>, gqa_attention_backward_dkdv_kernel4<64, true>}};
static const size_t ATT4_SMEM[3] = {gqa_attention_smem4<16>(), gqa_attention_smem4<32>(), gqa_attention_smem4<64>()};

// a call's row in those tables; the first call on a GPU sets every kernel's dynamic shared memory
static int attention4_head_index(int HS) {
    static thread_local bool configured = false;
    if (!configured) {
        for (int i = 0; i < 3; i++) {
            int smem = (int)ATT4_SMEM[i];
            for (int m = 0; m < 2; m++) {
                for (int t = 0; t < 2; t++) {
                    cudaCheck(
                        cudaFuncSetAttribute(ATT4_FORWARD[i][t][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                }
                cudaCheck(cudaFuncSetAttribute(ATT4_DQ[i][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
                cudaCheck(cudaFuncSetAttribute(ATT4_DKDV[i][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            }
        }
        configured = true;
    }
    int padded = padded_head_dim(HS);
    return padded == 16 ? 0 : padded == 32 ? 1 : 2;
}

// two row tiles a warp where that still makes 1,024 blocks or more, else one: blocks stay many
static void gqa_attention_forward4(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    int hs = attention4_head_index(a.HS), mask = a.block != NULL;
    int tiles = (long long)ceil_div(a.Tq, 2 * ATT4_ROWS) * a.NH * a.B >= 1024 ? 2 : 1;
    Attention4Forward kernel = ATT4_FORWARD[hs][tiles - 1][mask];
    kernel<<<dim3(ceil_div(a.Tq, tiles * ATT4_ROWS), a.NH, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(out, lse,
                                                                                                             q, a);
    launchCheck();
}

// delta given; dq overwritten, dk0/dv0 (dk1/dv1) accumulate, or dkx/dvx overwritten in floatX
static void gqa_attention_backward4(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a,
                                    floatX* dkx, floatX* dvx) {
    int hs = attention4_head_index(a.HS), mask = a.block != NULL;
    Attention4Dq dq_kernel = ATT4_DQ[hs][mask];
    Attention4Dkdv dkdv_kernel = ATT4_DKDV[hs][mask];
    dq_kernel<<<dim3(ceil_div(a.Tq, ATT4_ROWS), a.NH, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(dq, dout, q,
                                                                                                        lse, delta, a);
    launchCheck();
    dkdv_kernel<<<dim3(ceil_div(gqa_n_keys(a), ATT4_ROWS), a.NKV, a.B), ATT4_THREADS, ATT4_SMEM[hs], main_stream>>>(
        dk0, dv0, dk1, dv1, dout, q, lse, delta, a, dkx, dvx);
    launchCheck();
}
#endif

// The version that runs a call of head size HS in this build, its forward or its backward: bf16
// builds version 4 where it takes the call (`packed`: its tensors allow 16-byte loads, as
// attention4_fits says), fp16 builds version 2 where its tiles fit in shared memory, else version 1,
// or 5 past head size 128. The launchers ask it, and so does the config table (for packed calls,
// as the model's are).
enum { ATTENTION_V1 = 1, ATTENTION_V2 = 2, ATTENTION_V4 = 4, ATTENTION_V5 = 5 };
static int attention_version(int HS, bool backward, bool packed) {
#if defined(ENABLE_FP16)
    (void)packed;
    if (attention2_fits(HS, backward)) { return ATTENTION_V2; }
#elif !defined(ENABLE_FP32)
    (void)backward;
    if (packed && HS % 8 == 0 && HS <= 64) { return ATTENTION_V4; }
#else
    (void)backward;
    (void)packed;
#endif
    return HS > 128 ? ATTENTION_V5 : ATTENTION_V1;
}

static const char* attention_version_name(int version) {
    return version == ATTENTION_V4   ? "v4: flash, mma.sync"
           : version == ATTENTION_V2 ? "v2: WMMA tiles"
           : version == ATTENTION_V5 ? "v5: a warp a query, 8 values a lane"
                                     : "v1: a warp a query";
}

// delta (B, NH, Tq) = rowsum(dO * O) per head: version 2 where 128-bit loads fit, else version 1
static void attention_delta(float* delta, const floatX* dout, const floatX* out, const GqaAttn& a) {
    size_t rows = (size_t)a.B * a.Tq;
    int lanes = a.HS / x128::size;
    if (packable(a.HS, x128::size, dout, out) && lanes <= 32 && (lanes & (lanes - 1)) == 0) {
        attention_delta_kernel2<<<ceil_div(rows * a.NH * lanes, (size_t)BLOCK), BLOCK, 0, main_stream>>>(
            delta, dout, out, (int)rows, a.Tq, a.NH, a.HS);
    } else {
        attention_delta_kernel<<<ceil_div(rows * a.NH * 32, (size_t)BLOCK), BLOCK, 0, main_stream>>>(
            delta, dout, out, (int)rows, a.Tq, a.NH, a.HS);
    }
    launchCheck();
}

static void attention_prof_shape(char* shape, size_t n, const GqaAttn& a) {
    shape[0] = '\0';
    if (prof.on) {
        snprintf(shape, n, "B %d, %d/%d heads of %d, %d x %d", a.B, a.NH, a.NKV, a.HS, a.Tq, a.Nk0 + a.Nk1);
    }
}

// out (B, Tq, NH*HS) floatX and lse (B, NH, Tq) fp32, both overwritten
static void gqa_attention_forward(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    char shape[64];
    attention_prof_shape(shape, sizeof(shape), a);
    ProfOp prof_op("attention fwd", 4.0 * a.B * a.NH * a.Tq * (a.Nk0 + a.Nk1) * a.HS, shape);  // (as if unmasked)
    gqa_attention_check(a);
    bool packed = false;
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    packed = attention4_fits(a, q, out);
#endif
    switch (attention_version(a.HS, false, packed)) {
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
        case ATTENTION_V4: gqa_attention_forward4(out, lse, q, a); break;
#endif
#if defined(ENABLE_FP16)
        case ATTENTION_V2: gqa_attention_forward2_any(out, lse, q, a); break;
#endif
        case ATTENTION_V5: gqa_attention_forward5(out, lse, q, a); break;
        default: gqa_attention_forward1(out, lse, q, a); break;
    }
}

// dq (B, Tq, NH*HS) floatX overwritten; dk0/dv0 (B, Nk0, NKV*HS), dk1/dv1 (B, Nk1, NKV*HS; NULL when
// Nk1 = 0) accumulate in fp32. delta: B*NH*Tq floats scratch. dkx, dvx: floatX key gradients, overwritten.
static void gqa_attention_backward(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                   const floatX* q, const floatX* out, const float* lse, float* delta, const GqaAttn& a,
                                   floatX* dkx = NULL, floatX* dvx = NULL) {
    char shape[64];
    attention_prof_shape(shape, sizeof(shape), a);
    ProfOp prof_op("attention bwd", 10.0 * a.B * a.NH * a.Tq * (a.Nk0 + a.Nk1) * a.HS, shape);
    gqa_attention_check(a);
    if (dkx != NULL && (a.Nk1 != 0 || dvx == NULL)) {
        vla_fail("attention: floatX key gradients need one key tensor and both of dk, dv");
    }
    attention_delta(delta, dout, out, a);
    bool packed = false;
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    packed = attention4_fits(a, q, dout, dq);
#endif
    int version = attention_version(a.HS, true, packed);
#if !defined(ENABLE_FP32) && !defined(ENABLE_FP16)
    if (version == ATTENTION_V4) {  // (writes dkx, dvx itself)
        gqa_attention_backward4(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a, dkx, dvx);
        return;
    }
#endif
    size_t n_kv = (size_t)a.B * a.Nk0 * a.NKV * a.HS;
    if (dkx != NULL) {
        cudaCheck(cudaMemsetAsync(dk0, 0, n_kv * sizeof(float), main_stream));
        cudaCheck(cudaMemsetAsync(dv0, 0, n_kv * sizeof(float), main_stream));
    }
    switch (version) {
#if defined(ENABLE_FP16)
        case ATTENTION_V2: gqa_attention_backward2_any(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
#endif
        case ATTENTION_V5: gqa_attention_backward5(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        default: gqa_attention_backward1(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
    }
    if (dkx != NULL) {
        convert(dkx, dk0, n_kv);
        convert(dvx, dv0, n_kv);
    }
}

#endif  // VLA_CUDA_ATTENTION_CUH
