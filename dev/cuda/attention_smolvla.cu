/*
attention_smolvla.cu: SmolVLA's attention as LeRobot 0.6.1 computes it (eager_attention_forward in
lerobot/policies/smolvla/smolvlm_with_expert.py), forward and backward, for every call the model
makes: GQA (n_head query heads over n_kv_head key/value heads), scores in fp32 scaled by
1/sqrt(head size), the block mask of make_att_2d_masks given as one int per token, masked scores
filled with float32's most negative value as LeRobot fills them.

  the calls    prefix        the VLM over the prefix alone (odd layers; the prefill of sampling)
               joint         even layers: [prefix ; suffix] queries on [prefix ; suffix] keys, as two
                             calls, the prefix rows and the action rows, both on the keys of both
               cross         odd layers: the action queries on the prefix keys re-projected by the
                             expert (its k_proj / v_proj of the VLM's roped keys and values)
               vision        SigLIP: 1024 tokens, no mask, n_kv_head = n_head
  delta      rowsum(dO * O) per head: train_vla.cu's attention_delta_kernel, both versions
  version 1  one warp per (sample, head, query) for the forward and dq, one warp per (sample, kv
             head, key) for dk and dv over the query heads that share it; online softmax on CUDA
             cores (the fp32 path)
  version 2  tensor cores (WMMA, bf16), 64x64 tiles as train_vla.cu's attention_*_kernel2, with the
             kv head of each query head, the key loop stopped after the last key any query of the
             tile can see, and the dk/dv block walking every query head of its kv head (the bf16 path)

The kernels and launchers between the two banners below are self-contained and move into
train_vla.cu as they are (they use its attention helpers: ATT_TILE, load_query_tile, warp_scores,
warp_accumulate, attention_delta_kernel, padded_head_dim).

  make -C dev/cuda attention_smolvla && dev/cuda/attention_smolvla
  make build/emu/dev/cuda/attention_smolvla && build/emu/dev/cuda/attention_smolvla   (checks only)
*/
#include "attention_smolvla_case.h"
#include <float.h>
#include <limits.h>

// ----------------------------------------------------------------------------
// kernels and launchers (what moves into train_vla.cu)

// One attention call of SmolVLA. Tq queries per sample, of NH heads, against nk = Nk0 + Nk1 keys and
// values of NKV heads: the first Nk0 from k0/v0, the rest from k1/v1 (the joint layer's prefix and
// suffix live in different tensors). GQA: query head h reads kv head h / (NH / NKV), the order of
// repeat_kv's expand(B, L, NKV, NH / NKV, HS).reshape(B, L, NH, HS).
// The mask, per token as make_att_2d_masks derives it: block[t] is token t's cumulative block id
// (the cumsum of the block flags) or -1 for a pad; key j is token j, query i is token q0 + i, and
// key j is visible to query i iff 0 <= block[j] <= block[q0 + i]. block NULL: no mask (vision).
typedef struct {
    const floatX* k0; const floatX* v0;  // (B, Nk0, NKV*HS) keys and values 0 .. Nk0-1
    const floatX* k1; const floatX* v1;  // (B, Nk1, NKV*HS) keys Nk0 .. nk-1, NULL when Nk1 = 0
    const int* block;                    // (B, Nt) per-token block ids, -1 for pads; NULL: no mask
    int B, NH, NKV, HS;
    int Tq, q0;                          // queries per sample; the token of query 0 in block
    int Nk0, Nk1, Nt;                    // Nt: tokens per sample in block (q0 + Tq and nk at most Nt)
} GqaAttn;

// LeRobot fills masked scores with torch.finfo(float32).min, not -inf. Where a query sees some key,
// a masked one gets exp(-FLT_MAX - max) = 0: exactly as if it were skipped. Where it sees none (a
// padded query) every score is -FLT_MAX and the softmax is uniform: its output is the mean of all
// nk values. Such a row's lse is stored as -FLT_MAX (what fp32 makes of -FLT_MAX + log nk), and the
// backward reads that mark: dv gets dO / nk at every key, while q and k get nothing (torch.where
// routes no gradient to the fill).
#define ATTN_NO_KEY_LSE (-FLT_MAX)

static __host__ __device__ __forceinline__ int gqa_n_keys(const GqaAttn& a) { return a.Nk0 + a.Nk1; }

// offset of head g of key (or value, or their gradient) j of sample b in its tensor: the first one
// below Nk0, the second past it
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

// Version 1: one warp per (sample, head, query), key by key with an online softmax, lanes
// splitting the head dims (HS <= 128). out (B, Tq, NH*HS) and lse (B, NH, Tq) overwritten.
__global__ void gqa_attention_forward_kernel1(floatX* out, float* lse, const floatX* q, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS;
    float qv[4], acc[4];
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
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
        for (int u = 0; u < 4; u++) {
            int c = lane + 32 * u;
            if (c < a.HS) { s += qv[u] * f32(kj[c]); }
        }
        s = warp_sum(s) * scale;
        float m_new = fmaxf(mx, s), corr = expf(mx - m_new), p = expf(s - m_new);
        sum = sum * corr + p;
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = lane + 32 * u;
            acc[u] = acc[u] * corr + (c < a.HS ? p * f32(vj[c]) : 0.0f);
        }
        mx = m_new;
    }
    bool seen = sum > 0.0f;  // sum >= 1 once a key is visible: the maximum's own term
    if (!seen) {  // no key visible: the uniform softmax of the fills, the mean of every value
        for (int j = 0; j < nk; j++) {
            const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + gqa_key_at(a, b, j, g);
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = lane + 32 * u;
                if (c < a.HS) { acc[u] += f32(vj[c]); }
            }
        }
        sum = (float)nk;
    }
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
        if (c < a.HS) { out[row + c] = fx(acc[u] / sum); }
    }
    if (lane == 0) { lse[((size_t)b * a.NH + h) * a.Tq + i] = seen ? mx + logf(sum) : ATTN_NO_KEY_LSE; }
}

// Version 1 backward, query side: with P recomputed from lse, dP = dO V^T, dS = P * (dP - delta),
// dq = scale dS K. One warp per (sample, head, query); dq (B, Tq, NH*HS) overwritten. A query that
// sees no key gets dq = 0: its scores are all fills, which pass no gradient.
__global__ void gqa_attention_backward_dq_kernel1(floatX* dq, const floatX* dout, const floatX* q, const float* lse,
                                                  const float* delta, GqaAttn a) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NH * a.Tq) { return; }
    int i = warp % a.Tq, h = warp / a.Tq % a.NH, b = warp / (a.Tq * a.NH);
    int g = h / (a.NH / a.NKV), nk = gqa_n_keys(a), qb = gqa_query_block(a, b, i);
    float scale = 1.0f / sqrtf((float)a.HS);
    size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS, stat = ((size_t)b * a.NH + h) * a.Tq + i;
    float l = lse[stat], dl = delta[stat];
    float qv[4], dov[4], acc[4];
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
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
        for (int u = 0; u < 4; u++) {
            int c = lane + 32 * u;
            if (c < a.HS) { s += qv[u] * f32(kj[c]); dp += dov[u] * f32(vj[c]); }
        }
        s = warp_sum(s);
        dp = warp_sum(dp);
        float p = expf(s * scale - l);
        float ds = p * (dp - dl) * scale;
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = lane + 32 * u;
            if (c < a.HS) { acc[u] += ds * f32(kj[c]); }
        }
    }
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
        if (c < a.HS) { dq[row + c] = fx(acc[u]); }
    }
}

// Version 1 backward, key side: one warp per (sample, kv head, key), over the NH / NKV query heads
// that read it and all their queries in a fixed order: dv += P^T dO, dk += scale dS^T Q. Keys
// j < Nk0 land in dk0/dv0 (B, Nk0, NKV*HS), the others in dk1/dv1 (B, Nk1, NKV*HS): fp32,
// accumulated, each row by one warp only.
__global__ void gqa_attention_backward_dkdv_kernel1(float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                                    const floatX* q, const float* lse, const float* delta, GqaAttn a) {
    int nk = gqa_n_keys(a);
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (warp >= a.B * a.NKV * nk) { return; }
    int j = warp % nk, g = warp / nk % a.NKV, b = warp / (nk * a.NKV);
    int G = a.NH / a.NKV, kb = gqa_key_block(a, b, j);
    float scale = 1.0f / sqrtf((float)a.HS), uniform = 1.0f / (float)nk;
    size_t at = gqa_key_at(a, b, j, g);
    const floatX* kj = (j < a.Nk0 ? a.k0 : a.k1) + at;
    const floatX* vj = (j < a.Nk0 ? a.v0 : a.v1) + at;
    float kv[4], vv[4], dk[4], dv[4];
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
        kv[u] = c < a.HS ? f32(kj[c]) : 0.0f;
        vv[u] = c < a.HS ? f32(vj[c]) : 0.0f;
        dk[u] = 0.0f;
        dv[u] = 0.0f;
    }
    for (int h = g * G; h < (g + 1) * G; h++) {
        for (int i = 0; i < a.Tq; i++) {
            size_t row = ((size_t)b * a.Tq + i) * a.NH * a.HS + (size_t)h * a.HS, stat = ((size_t)b * a.NH + h) * a.Tq + i;
            float l = lse[stat];
            if (l == ATTN_NO_KEY_LSE) {  // a query that sees no key: P = 1/nk everywhere, no dS
                #pragma unroll
                for (int u = 0; u < 4; u++) {
                    int c = lane + 32 * u;
                    if (c < a.HS) { dv[u] += uniform * f32(dout[row + c]); }
                }
                continue;
            }
            if (!gqa_sees(gqa_query_block(a, b, i), kb)) { continue; }
            float s = 0.0f, dp = 0.0f;
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = lane + 32 * u;
                if (c < a.HS) { s += f32(q[row + c]) * kv[u]; dp += f32(dout[row + c]) * vv[u]; }
            }
            s = warp_sum(s);
            dp = warp_sum(dp);
            float p = expf(s * scale - l);
            float ds = p * (dp - delta[stat]) * scale;
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = lane + 32 * u;
                if (c < a.HS) { dv[u] += p * f32(dout[row + c]); dk[u] += ds * f32(q[row + c]); }
            }
        }
    }
    float* dkj = (j < a.Nk0 ? dk0 : dk1) + at;
    float* dvj = (j < a.Nk0 ? dv0 : dv1) + at;
    #pragma unroll
    for (int u = 0; u < 4; u++) {
        int c = lane + 32 * u;
        if (c < a.HS) { dkj[c] += dk[u]; dvj[c] += dv[u]; }
    }
}

#if !defined(ENABLE_FP32)
// Version 2 (bf16 builds): tensor cores through WMMA, on train_vla.cu's tiles (ATT_TILE = 64 rows,
// 4 warps of 16, head dims padded with zeros to HSP): scores through shared memory, where row and
// column are known for the mask and the online softmax.

// tile (ATT_TILE, HSP) <- head g of keys (or values) first.. of sample b: zeros past nk and HS
template <int HSP>
static __device__ void gqa_load_key_tile(__nv_bfloat16* tile, const GqaAttn& a, const floatX* x0, const floatX* x1,
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
    for (int offset = 16; offset > 0; offset /= 2) { int o = __shfl_xor_sync(0xffffffffu, v, offset); v = o > v ? o : v; }
    __syncthreads();  // the previous call's readers are done with shared
    if (lane == 0) { shared[warp] = v; }
    __syncthreads();
    v = lane < n_warps ? shared[lane] : INT_MIN;
    for (int offset = 16; offset > 0; offset /= 2) { int o = __shfl_xor_sync(0xffffffffu, v, offset); v = o > v ? o : v; }
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

// Q, K, V (64, HSP) bf16, P (64, 64) bf16, S (64, 64) and O (64, HSP) fp32, row max and sum, the
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
    __nv_bfloat16* Qs = (__nv_bfloat16*)att_smem;  // (64, HSP)
    __nv_bfloat16* Ks = Qs + ATT_TILE * HSP;         // (64, HSP)
    __nv_bfloat16* Vs = Ks + ATT_TILE * HSP;         // (64, HSP)
    __nv_bfloat16* Ps = Vs + ATT_TILE * HSP;         // (64, 64) probabilities
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
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float s = gqa_sees(qb, kblk[c]) ? srow[c] * scale : -INFINITY;  // masked: exactly 0 below
            srow[c] = s;
            tile_max = fmaxf(tile_max, s);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float m_old = row_m[r], m_new = fmaxf(m_old, tile_max);
        float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: exp gives 0, not NaN
        float psum = 0.0f;
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float p = expf(srow[c] - m_ref);
            Ps[r * ATT_TILE + c] = __float2bfloat16(p);
            psum += p;
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        float corr = expf(m_old - m_ref);
        for (int c = half * (HSP / 2); c < (half + 1) * (HSP / 2); c++) { O[r * HSP + c] *= corr; }
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
            lse[((size_t)b * a.NH + h) * a.Tq + i0 + rr] = row_l[rr] > 0.0f ? row_m[rr] + logf(row_l[rr]) : ATTN_NO_KEY_LSE;
        }
    }
}

// both backward kernels: four (64, HSP) bf16 tiles, two (64, 64) bf16 and two (64, 64) fp32,
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
    __nv_bfloat16* Qs = (__nv_bfloat16*)att_smem;  // (64, HSP)
    __nv_bfloat16* dOs = Qs + ATT_TILE * HSP;        // (64, HSP)
    __nv_bfloat16* Ks = dOs + ATT_TILE * HSP;        // (64, HSP)
    __nv_bfloat16* Vs = Ks + ATT_TILE * HSP;         // (64, HSP)
    __nv_bfloat16* dSs = Vs + ATT_TILE * HSP;        // (64, 64)
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
    int r = warp * 16 + lane / 2, half = lane % 2, qb = qblk[r];
    for (int j0 = 0; j0 < key_end; j0 += ATT_TILE) {
        __syncthreads();
        gqa_load_key_tile<HSP>(Ks, a, a.k0, a.k1, b, g, j0);
        gqa_load_key_tile<HSP>(Vs, a, a.v0, a.v1, b, g, j0);
        gqa_load_blocks(kblk, a, b, j0, true);
        __syncthreads();
        warp_scores<HSP>(S + warp * 16 * ATT_TILE, Qs + warp * 16 * HSP, Ks);
        warp_scores<HSP>(dP + warp * 16 * ATT_TILE, dOs + warp * 16 * HSP, Vs);
        __syncwarp();
        for (int c = half * 32; c < half * 32 + 32; c++) {
            float ds = 0.0f;
            if (gqa_sees(qb, kblk[c])) {
                float p = expf(S[r * ATT_TILE + c] * scale - row_lse[r]);
                ds = p * (dP[r * ATT_TILE + c] - row_delta[r]) * scale;
            }
            dSs[r * ATT_TILE + c] = __float2bfloat16(ds);
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
    __nv_bfloat16* Ks = (__nv_bfloat16*)att_smem;  // (64 keys, HSP)
    __nv_bfloat16* Vs = Ks + ATT_TILE * HSP;
    __nv_bfloat16* Qs = Vs + ATT_TILE * HSP;         // (64 queries, HSP)
    __nv_bfloat16* dOs = Qs + ATT_TILE * HSP;
    __nv_bfloat16* Pt = dOs + ATT_TILE * HSP;        // (64 keys, 64 queries)
    __nv_bfloat16* dSt = Pt + ATT_TILE * ATT_TILE;
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
    int r = warp * 16 + lane / 2, j = j0 + r, half = lane % 2;
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
            for (int c = half * 32; c < half * 32 + 32; c++) {
                float p = 0.0f, ds = 0.0f;
                if (j < nk && i0 + c < a.Tq) {
                    if (q_lse[c] == ATTN_NO_KEY_LSE) {  // a query that sees no key: P = 1/nk, no dS
                        p = uniform;
                    } else if (gqa_sees(qblk[c], kb)) {
                        p = expf(St[r * ATT_TILE + c] * scale - q_lse[c]);
                        ds = p * (dPt[r * ATT_TILE + c] - q_delta[c]) * scale;
                    }
                }
                Pt[r * ATT_TILE + c] = __float2bfloat16(p);
                dSt[r * ATT_TILE + c] = __float2bfloat16(ds);
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
#endif  // !ENABLE_FP32

// What the kernels assume of a call; a mistake here is the caller's, said in one line
static void gqa_attention_check(const GqaAttn& a) {
    if (a.NKV <= 0 || a.NH % a.NKV != 0) { vla_fail("attention: %d query heads are not a multiple of %d kv heads", a.NH, a.NKV); }
    if (a.HS > 128) { vla_fail("attention: head size %d: the kernels take head sizes up to 128", a.HS); }
    if (a.Nk0 + a.Nk1 <= 0) { vla_fail("attention: %d + %d keys: a call needs at least one", a.Nk0, a.Nk1); }
    if (a.Nk1 > 0 && (a.k1 == nullptr || a.v1 == nullptr)) { vla_fail("attention: %d second keys but no k1/v1 tensors", a.Nk1); }
    if (a.block != nullptr && (a.q0 + a.Tq > a.Nt || a.Nk0 + a.Nk1 > a.Nt)) {
        vla_fail("attention: queries %d.. (%d) or %d keys past the mask's %d tokens", a.q0, a.Tq, a.Nk0 + a.Nk1, a.Nt);
    }
}

static void gqa_attention_forward1(floatX* out, float* lse, const floatX* q, const GqaAttn& a, int block) {
    gqa_attention_forward_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, block), block, 0, main_stream>>>(out, lse, q, a);
    launchCheck();
}

static void gqa_attention_backward1(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a, int block) {
    gqa_attention_backward_dq_kernel1<<<ceil_div((size_t)a.B * a.NH * a.Tq * 32, block), block, 0, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel1<<<ceil_div((size_t)a.B * a.NKV * gqa_n_keys(a) * 32, block), block, 0, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}

#if !defined(ENABLE_FP32)
// The tensor-core kernels' dynamic shared memory is set once per GPU (each rank's thread drives one)
template <int HSP>
static void gqa_attention_forward2(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    size_t smem = gqa_attention_forward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_forward_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    gqa_attention_forward_kernel2<HSP><<<dim3(ceil_div(a.Tq, ATT_TILE), a.NH, a.B), ATT_THREADS, smem, main_stream>>>(out, lse, q, a);
    launchCheck();
}

template <int HSP>
static void gqa_attention_backward2(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                    const floatX* q, const float* lse, const float* delta, const GqaAttn& a) {
    size_t smem = gqa_attention_backward_smem2<HSP>();
    static thread_local bool configured = false;
    if (!configured) {
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dq_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaFuncSetAttribute(gqa_attention_backward_dkdv_kernel2<HSP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    gqa_attention_backward_dq_kernel2<HSP><<<dim3(ceil_div(a.Tq, ATT_TILE), a.NH, a.B), ATT_THREADS, smem, main_stream>>>(dq, dout, q, lse, delta, a);
    launchCheck();
    gqa_attention_backward_dkdv_kernel2<HSP><<<dim3(ceil_div(gqa_n_keys(a), ATT_TILE), a.NKV, a.B), ATT_THREADS, smem, main_stream>>>(dk0, dv0, dk1, dv1, dout, q, lse, delta, a);
    launchCheck();
}
#endif

// out (B, Tq, NH*HS) floatX and lse (B, NH, Tq) fp32, both overwritten
static void gqa_attention_forward(floatX* out, float* lse, const floatX* q, const GqaAttn& a) {
    gqa_attention_check(a);
#if defined(ENABLE_FP32)
    gqa_attention_forward1(out, lse, q, a, BLOCK);
#else
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_forward2<16>(out, lse, q, a); break;
        case 32: gqa_attention_forward2<32>(out, lse, q, a); break;
        case 64: gqa_attention_forward2<64>(out, lse, q, a); break;
        default: gqa_attention_forward2<128>(out, lse, q, a); break;
    }
#endif
}

// dq (B, Tq, NH*HS) floatX overwritten; dk0/dv0 (B, Nk0, NKV*HS) and dk1/dv1 (B, Nk1, NKV*HS), NULL
// when Nk1 = 0, accumulate in fp32 (the joint layer's two calls deposit into the same key
// gradients, one after the other). delta: scratch of B*NH*Tq floats.
static void gqa_attention_backward(floatX* dq, float* dk0, float* dv0, float* dk1, float* dv1, const floatX* dout,
                                   const floatX* q, const floatX* out, const float* lse, float* delta, const GqaAttn& a) {
    gqa_attention_check(a);
    attention_delta_kernel<<<ceil_div((size_t)a.B * a.Tq * a.NH * 32, BLOCK), BLOCK, 0, main_stream>>>(delta, dout, out, a.B * a.Tq, a.Tq, a.NH, a.HS);
    launchCheck();
#if defined(ENABLE_FP32)
    gqa_attention_backward1(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a, BLOCK);
#else
    switch (padded_head_dim(a.HS)) {
        case 16: gqa_attention_backward2<16>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 32: gqa_attention_backward2<32>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        case 64: gqa_attention_backward2<64>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
        default: gqa_attention_backward2<128>(dq, dk0, dv0, dk1, dv1, dout, q, lse, delta, a); break;
    }
#endif
}

// ----------------------------------------------------------------------------
// checks and benchmarks

#if defined(ENABLE_FP32)
static const int VERSIONS = 1, V2_THREADS = 0;  // version 2 exists in bf16 builds only
#else
static const int VERSIONS = 2, V2_THREADS = ATT_THREADS;
#endif

static GqaAttn case_attn(const Case* k) {
    return GqaAttn{k->d_k0, k->d_v0, k->d_k1, k->d_v1, k->d_block, k->B, k->NH, k->NKV, k->HS,
                   k->Tq, k->q0, k->Nk0, k->Nk1, k->Nt};
}

// version 1 at `block` threads per block; version 2 through the launcher (bf16 builds)
static void run_forward(int version, int block, floatX* out, float* lse, const Case* k) {
    GqaAttn a = case_attn(k);
    if (version == 1) {
        gqa_attention_check(a);
        gqa_attention_forward1(out, lse, k->d_q, a, block);
    } else {
        gqa_attention_forward(out, lse, k->d_q, a);
    }
}

static void run_backward(int version, int block, const Case* k, floatX* dq, float* dk0, float* dv0, float* dk1,
                         float* dv1, float* delta) {
    GqaAttn a = case_attn(k);
    if (version == 1) {
        gqa_attention_check(a);
        attention_delta_kernel<<<ceil_div((size_t)a.B * a.Tq * a.NH * 32, block), block, 0, main_stream>>>(delta, k->d_dout, k->d_out, a.B * a.Tq, a.Tq, a.NH, a.HS);
        launchCheck();
        gqa_attention_backward1(dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_lse, delta, a, block);
    } else {
        gqa_attention_backward(dq, dk0, dv0, dk1, dv1, k->d_dout, k->d_q, k->d_out, k->d_lse, delta, a);
    }
}

static const int V1_BLOCKS[] = {32, 96, 256};  // 96: warps of a block not a power of two
static const int N_V1_BLOCKS = sizeof(V1_BLOCKS) / sizeof(V1_BLOCKS[0]);

static int case_label(char* buf, size_t n, const Case* k, int version, int block) {
    return snprintf(buf, n, "v%d %s (B %d, NH %d, NKV %d, HS %d, Tq %d, keys %d+%d) block %d", version,
                    pass_names[k->pass], k->B, k->NH, k->NKV, k->HS, k->Tq, k->Nk0, k->Nk1, block);
}

static double worst_err[2] = {0.0, 0.0};  // the largest relative error met by each version (report)

static void check_close_v(int version, const char* what, const float* got, const double* ref, size_t n, double tol) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
    double e = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (isfinite(e) && e > worst_err[version - 1]) { worst_err[version - 1] = e; }
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
    double* ref_seen = (double*)mallocCheck(n_lse * sizeof(double));
    double* ref_blind = (double*)mallocCheck((n_out > 0 ? n_out : 1) * sizeof(double));
    float* got_seen = (float*)mallocCheck(n_lse * sizeof(float));
    float* got_blind = (float*)mallocCheck((n_out > 0 ? n_out : 1) * sizeof(float));
    for (int version = 1; version <= VERSIONS; version++) {
        for (int bi = 0; bi < (version == 1 ? N_V1_BLOCKS : 1); bi++) {
            int block = version == 1 ? V1_BLOCKS[bi] : V2_THREADS;
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
                snprintf(what, sizeof(what), "%s: %zu rows that see no key marked (lse -FLT_MAX): %zu", label, n_blind, n_marked);
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
    float* first[5] = {NULL, NULL, NULL, NULL, NULL};  // dq, dk0, dv0, dk1, dv1 of the last block size
    for (int version = 1; version <= VERSIONS; version++) {
        double tol_kv = version == 1 ? tol_f32 : 1e-2;
        int n_runs = (version == 1 ? N_V1_BLOCKS : 1) + 1;  // the last block size twice: same bits?
        for (int run = 0; run < n_runs; run++) {
            int bi = run < n_runs - 1 ? run : run - 1, block = version == 1 ? V1_BLOCKS[bi] : V2_THREADS;
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
                size_t differ = 0, total = 0;
                for (int t = 0; t < 5; t++) {
                    for (size_t e = 0; e < sizes[t]; e++) { differ += memcmp(&got[t][e], &first[t][e], sizeof(float)) != 0; }
                    total += sizes[t];
                }
                snprintf(what, sizeof(what), "%s: run again, dq dk dv bit for bit: %zu of %zu differ", label, differ, total);
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
                for (size_t e = 0; e < sizes[t]; e++) { got[t][e] -= before[t][e]; }  // what the kernel added
                snprintf(what, sizeof(what), "%s: %s (+=)", label, names[t]);
                check_close_v(version, what, got[t], refs[t], sizes[t], tol_kv);
                for (size_t e = 0; e < sizes[t]; e++) { got[t][e] += before[t][e]; }
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

// One call at SmolVLA's shapes: the forward and the backward of each version
static void benchmark(int pass, int B, int NH, int NKV, int HS, int NI, int T, int H) {
    Case k = make_case(pass, B, NH, NKV, HS, NI, T, H, FORWARD_NONE, 7);
    GqaAttn a = case_attn(&k);
    int nk = gqa_n_keys(a), D = NH * HS, Dkv = NKV * HS;
    size_t n_q = (size_t)B * a.Tq * D, n_k0 = (size_t)B * a.Nk0 * Dkv, n_k1 = (size_t)B * a.Nk1 * Dkv;
    size_t n_stat = (size_t)B * NH * a.Tq;
    cudaCheck(cudaMalloc(&k.d_out, n_q * sizeof(floatX)));
    cudaCheck(cudaMalloc(&k.d_lse, n_stat * sizeof(float)));
    gqa_attention_forward(k.d_out, k.d_lse, k.d_q, a);
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
    for (int version = 1; version <= VERSIONS; version++) {
        int reps = version == 1 ? 5 : 20;
        double ms_f = time_ms([&]() { run_forward(version, 256, out, lse, &k); }, reps);
        double ms_b = time_ms([&]() { run_backward(version, 256, &k, dq, dk0, dv0, dk1, dv1, delta); }, reps);
        printf("bench v%d %-17s (B %d, NH %d, NKV %d, HS %d, %4d queries x %4d keys): forward %8.3f ms %6.1f TFLOP/s, "
               "backward %8.3f ms %6.1f TFLOP/s\n", version, pass_names[pass], B, NH, NKV, HS, a.Tq, nk, ms_f,
               flops_fwd / (ms_f * 1e-3) / 1e12, ms_b, flops_bwd / (ms_b * 1e-3) / 1e12);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(lse)); cudaCheck(cudaFree(dq)); cudaCheck(cudaFree(dk0));
    cudaCheck(cudaFree(dv0)); cudaCheck(cudaFree(dk1)); cudaCheck(cudaFree(dv1)); cudaCheck(cudaFree(delta));
    free_case(&k);
}

// smolvla_base: batch 32, a prefix of 2 cameras x 64 image tokens + 48 text tokens (instructions of
// different lengths, the rest pads) + the state = 177 tokens, 50 actions, 15 query heads on 5 kv
// heads of 64; the vision tower: 64 images (32 samples x 2 cameras) of 1024 tokens, 12 heads of 64
static void benchmarks(void) {
    for (int pass = PASS_PREFIX; pass <= PASS_CROSS; pass++) { benchmark(pass, 32, 15, 5, 64, 128, 48, 50); }
    benchmark(PASS_VISION, 64, 12, 12, 64, 1024, 1, 0);
}

int main(void) {
    dev_init("attention_smolvla");
    // GQA groups of 1, 2, 3 and 5 query heads per kv head; head sizes through every padding of
    // version 2 and with scalar loads (8, 12); suffixes and prefixes of more than one 64-row tile
    // (a prefix of 65 tokens: the state alone in the second tile, the last key it sees the first of
    // a tile); text pads in every sample (so padded queries, which see no key)
    struct { int B, NH, NKV, HS, NI, T, H; } shapes[] = {
        {2, 3, 1, 16, 16, 6, 5}, {2, 4, 2, 64, 24, 10, 7}, {1, 2, 2, 8, 4, 3, 70}, {1, 3, 1, 32, 48, 16, 6},
        {1, 2, 1, 128, 8, 4, 3}, {2, 5, 1, 12, 10, 5, 4},
    };
    uint64_t seed = 100;
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        for (int pass = 0; pass < N_PASSES; pass++) {
            if (pass == PASS_VISION) { continue; }
            Case k = make_case(pass, shapes[s].B, shapes[s].NH, shapes[s].NKV, shapes[s].HS, shapes[s].NI, shapes[s].T,
                               shapes[s].H, FORWARD_HOST, seed);
            check_forward(&k);
            check_backward(&k, seed + 50);
            free_case(&k);
            seed += 10;
        }
    }
    // the vision tower: no mask, as many kv heads as query heads; 96 tokens: a tile and a half
    struct { int B, NH, HS, N; } vision[] = {{1, 2, 64, 96}, {2, 3, 16, 40}};
    for (size_t s = 0; s < sizeof(vision) / sizeof(vision[0]); s++) {
        Case k = make_case(PASS_VISION, vision[s].B, vision[s].NH, vision[s].NH, vision[s].HS, vision[s].N, 1, 0,
                           FORWARD_HOST, seed);
        check_forward(&k);
        check_backward(&k, seed + 50);
        free_case(&k);
        seed += 10;
    }
    printf("worst relative error: version 1 %.2e%s", worst_err[0], VERSIONS > 1 ? "" : "\n");
    if (VERSIONS > 1) { printf(", version 2 %.2e\n", worst_err[1]); }
    return dev_finish(benchmarks);
}
