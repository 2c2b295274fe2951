/*
vla/attention_wmma.cuh: version 2 of SmolVLA's attention (forward, and the backward's dq and dk/dv
kernels), on the tensor cores through WMMA. fp16 builds run it because their GPUs (sm_70, sm_75)
have no bf16 mma.sync for version 4; bf16 test builds compile it so that
dev/cuda/attention_smolvla.cu can time it against version 4.

A block takes 64 rows (4 warps of 16) of one (sample, head) and walks the other side 64 rows at a
time, head dims padded with zeros to HSP. Scores go through shared memory, where row and column are
known (a WMMA fragment's layout is not), for the mask and the online softmax.

Included by train_vla.cu after version 1, whose GqaAttn and gqa_* helpers it uses; its launchers
stay in train_vla.cu with the other versions'. Its extern __shared__ is why the emulation builds
read a copy that dev/cuda/emu/launch.sed rewrote (build/emu/vla/attention_wmma.cuh).
*/
#ifndef VLA_ATTENTION_WMMA_CUH
#define VLA_ATTENTION_WMMA_CUH

#include <mma.h>

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
            lse[((size_t)b * a.NH + h) * a.Tq + i0 + rr] = row_l[rr] > 0.0f ? row_m[rr] + logf(row_l[rr]) : ATTN_NO_KEY_LSE;
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

#endif  // VLA_ATTENTION_WMMA_CUH
