/*
prefix.cu: the VLM's prefix as LeRobot's embed_prefix / embed_suffix and forward build it, and the
gradients that leave it (modeling_smolvla.py, modeling_pi0.py, vla_utils.make_att_2d_masks), for
both families: SmolVLA (the state token the prefix's last, the actions causal, the image tokens
times sqrt(C)) and pi0 (the state the suffix's first, the actions seeing each other, the image
tokens as they are).

  sequence    per sample, the tokens [NI image tokens, all cameras][T language][state][actions] carry
              a pad flag (language: the token mask; everything else valid) and a block flag
              (att_masks: 0 for images and language, 1 for the state and the first action, and in
              SmolVLA for every action). LeRobot's mask is make_att_2d_masks: query i sees key j iff
              cumsum(att)[j] <= cumsum(att)[i] and both are valid; its RoPE positions are
              cumsum(pad) - 1; the expert's cross-attention layers use the suffix's positions minus
              their smallest. The kernel hands the attention kernels one int per token instead of
              the 2-D mask: block = cumsum(att), or -1 for a pad, read as "query i sees key j iff
              0 <= block[j] <= block[i]" (vla/cuda/attention.cuh's GqaAttn)
  embed       x (B, Np, C), Np = n_cam NI + T (+ 1, SmolVLA's state): every camera's NI image tokens
              (the connector's output, camera-major: image cam * B + b) times img_scale (sqrt(C) in
              SmolVLA, 1 in pi0), the language tokens' rows of embed_tokens times sqrt(C), then
              SmolVLA's state token as it is
  embed_tokens_backward
              dtable (vocab, C) fp32 += sqrt(C) times the language rows of dx (B, Np, C) fp32,
              summed by token id; the pad id's row gets nothing (nn.Embedding's padding_idx)
  prefix_image_grad
              dimg (n_cam B NI, C) floatX, camera-major = img_scale times the image rows of dx

  version 1  (this program's) sequence: one thread per token, each counting the valid tokens and
             the block starts up to itself (n (n + 1) / 2 flags read a sample); embed: three
             kernels, one per part (images, language, state), one thread per value each;
             embed_tokens_backward: one thread per value of the table, each scanning every
             language position for its id (no atomics, the same bits every run);
             prefix_image_grad: one thread per value of dx's image rows, in dx's order
  version 2  sequence: one thread per sample, the counts running along its tokens
             (flow_sequence_kernel); embed: one kernel, one thread per value of x
             (flow_prefix_embed_kernel); embed_tokens_backward: one block per language
             position, which works only where it is its id's first and then sums that id's rows in
             position order, threads over the columns (embed_tokens_backward_kernel);
             prefix_image_grad: one thread per value of dimg (prefix_image_grad_kernel). The
             trainer's (vla/cuda/embedding.cuh); "trainer" below is its launch as
             flow_prefix_embed / flow_prefix_embed_backward write it (BLOCK threads), checked
             at the tiny and pi0_tiny presets' shapes

  nvcc -O3 -std=c++17 -arch=sm_90 prefix.cu -o prefix && ./prefix
*/
#include "common.h"
#include "../../vla/cuda/embedding.cuh"

// Integer outputs and copies: exact. floatX outputs of one fp32 product (embed, image grad): 1e-5
// in fp32 builds, 1e-2 in bf16 (8 significant bits: 3.9e-3 per value at worst). fp32 sums of up to
// B T rows (embed_tokens backward): 1e-5.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-5;
static const int BLOCKS[] = {32, 100, 256, 1024};  // any block size works for each: 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int N_VERSIONS = 2;

// The shapes of one call. NI: image tokens per camera; pi0: the family's rules (above)
typedef struct {
    int B, n_cam, NI, T, C, vocab, pad, chunk, pi0;
} Prefix;
static int prefix_images(const Prefix* p) { return p->n_cam * p->NI; }
static int prefix_tokens(const Prefix* p) { return p->n_cam * p->NI + p->T + !p->pi0; }  // Np
static int suffix_tokens(const Prefix* p) { return p->chunk + p->pi0; }                  // H
static float image_scale(const Prefix* p) { return p->pi0 ? 1.0f : sqrtf((float)p->C); }

// vla/config.h's presets (FLOW_PRESETS): n_cam, (img / patch / scale_factor)^2 image tokens a
// camera, max_text, d_model, vocab, pad_token, chunk; tiny and pi0_tiny at 3 samples, smolvla at
// batch 32 and pi0 at 8 (the benchmark's)
static const Prefix TINY = {3, 1, 4, 16, 48, 256, 0, 8, 0};           // 32 px in 8 px patches, shuffle 2
static const Prefix PI0_TINY = {3, 1, 16, 16, 64, 256, 0, 8, 1};      // 32 px in 8 px patches
static const Prefix SMOLVLA = {32, 2, 64, 48, 960, 49280, 2, 50, 0};  // 512 px in 16 px patches, shuffle 4
static const Prefix PI0 = {8, 2, 256, 48, 2048, 257152, 0, 50, 1};    // 224 px in 14 px patches

// ----------------------------------------------------------------------------
// version 1

// One thread per token (b, j) of the sequence of n = Np + H: the flags of tokens 0..j counted again
// by every token. Positions never decrease along a sample, so the suffix's smallest is its first's.
__global__ void flow_sequence_kernel1(int* block, int* pos, int* x_pos, const float* token_mask, int B, int NI, int T,
                                      int Np, int H, int causal) {
    int n = Np + H;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * n) { return; }
    int b = (int)(idx / n), j = (int)(idx % n);
    int cum = 0, n_valid = 0, valid = 1, lowest = 0;
    for (int q = 0; q <= j; q++) {
        valid = q < NI || q >= NI + T || token_mask[(size_t)b * T + (q - NI)] != 0.0f;
        cum += q >= NI + T && (causal || q <= NI + T + 1);  // the state, the first action, or (causal) any action
        n_valid += valid;
        if (q == Np) { lowest = n_valid - 1; }
    }
    block[idx] = valid ? cum : -1;
    pos[idx] = n_valid - 1;
    if (j >= Np) { x_pos[(size_t)b * H + (j - Np)] = n_valid - 1 - lowest; }
}

// x's image rows (b, i < n_img) = img_scale * image token (i / NI) * B + b's row i % NI
__global__ void prefix_images_kernel1(floatX* x, const floatX* img_tok, int B, int n_cam, int NI, int Np, int C,
                                      float img_scale) {
    int n_img = n_cam * NI;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * n_img * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % n_img), b = (int)(idx / ((size_t)C * n_img));
    float v = f32(img_tok[(((size_t)(i / NI) * B + b) * NI + i % NI) * C + k]) * img_scale;
    x[((size_t)b * Np + i) * C + k] = fx(v);
}

// x's language rows (b, first + q) = scale * embed row tokens[b, q]
__global__ void prefix_language_kernel1(floatX* x, const floatX* embed, const int32_t* tokens, int B, int first, int T,
                                        int Np, int C, float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) { return; }
    int k = (int)(idx % C), q = (int)(idx / C % T), b = (int)(idx / ((size_t)C * T));
    float v = f32(embed[(size_t)tokens[(size_t)b * T + q] * C + k]) * scale;
    x[((size_t)b * Np + first + q) * C + k] = fx(v);
}

// x's last row of every sample = state_tok (B, C)
__global__ void prefix_state_kernel1(floatX* x, const floatX* state_tok, int B, int Np, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * C) { return; }
    x[((idx / C) * Np + Np - 1) * C + idx % C] = state_tok[idx];
}

// dtable (vocab, C) += scale * the language rows of dx with id v (not the pad id): one thread per
// value of the table, reading every position's id; rows of ids that do not occur stay as they are
__global__ void embed_tokens_backward_kernel1(float* dtable, const float* dx, const int32_t* tokens, int B, int first,
                                              int T, int Np, int C, int vocab, int pad, float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)vocab * C) { return; }
    int v = (int)(idx / C), k = (int)(idx % C);
    if (v == pad) { return; }
    float s = 0.0f;
    int seen = 0;
    for (int q = 0; q < B * T; q++) {
        if (tokens[q] == v) {
            s += dx[((size_t)(q / T) * Np + first + q % T) * C + k];
            seen = 1;
        }
    }
    if (seen) { dtable[idx] += scale * s; }
}

// dimg (n_cam B NI, C), camera-major = scale * dx's image rows: one thread per value read, (b, i, k)
__global__ void prefix_image_grad_kernel1(floatX* dimg, const float* dx, int B, int n_cam, int NI, int Np, int C,
                                          float scale) {
    int n_img = n_cam * NI;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * n_img * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % n_img), b = (int)(idx / ((size_t)C * n_img));
    dimg[(((size_t)(i / NI) * B + b) * NI + i % NI) * C + k] = fx(scale * dx[((size_t)b * Np + i) * C + k]);
}

// ----------------------------------------------------------------------------
// launchers: version v at `block` threads; version 0 is the trainer's launch of version 2, as
// flow_prefix_embed and flow_prefix_embed_backward write it (LAUNCH_1D with BLOCK threads;
// embed_tokens_backward a block of BLOCK per language position)

static void run_sequence(int v, int block, const Prefix* p, int* blk, int* pos, int* x_pos, const float* token_mask) {
    int B = p->B, NI = prefix_images(p), T = p->T, Np = prefix_tokens(p), H = suffix_tokens(p), causal = !p->pi0;
    if (v == 0) {
        LAUNCH_1D(flow_sequence_kernel, B, blk, pos, x_pos, token_mask, B, NI, T, Np, H, causal);
    } else if (v == 1) {
        dim3 grid = ceil_div((size_t)B * (Np + H), block);
        flow_sequence_kernel1<<<grid, block, 0, main_stream>>>(blk, pos, x_pos, token_mask, B, NI, T, Np, H, causal);
        launchCheck();
    } else {
        flow_sequence_kernel<<<ceil_div(B, block), block, 0, main_stream>>>(blk, pos, x_pos, token_mask, B, NI, T, Np,
                                                                            H, causal);
        launchCheck();
    }
}

static void run_embed(int v, int block, const Prefix* p, floatX* x, const floatX* img_tok, const floatX* embed,
                      const int32_t* tokens, const floatX* state_tok) {
    int B = p->B, n_img = prefix_images(p), T = p->T, Np = prefix_tokens(p), C = p->C;
    float scale = sqrtf((float)C), img_scale = image_scale(p);
    if (v == 0) {
        LAUNCH_1D(flow_prefix_embed_kernel, (size_t)B * Np * C, x, img_tok, embed, tokens, state_tok, B, p->n_cam,
                  p->NI, T, Np, C, scale, img_scale);
    } else if (v == 1) {
        dim3 grid = ceil_div((size_t)B * n_img * C, block);
        prefix_images_kernel1<<<grid, block, 0, main_stream>>>(x, img_tok, B, p->n_cam, p->NI, Np, C, img_scale);
        launchCheck();
        grid = ceil_div((size_t)B * T * C, block);
        prefix_language_kernel1<<<grid, block, 0, main_stream>>>(x, embed, tokens, B, n_img, T, Np, C, scale);
        launchCheck();
        if (Np > n_img + T) {  // SmolVLA's state token
            prefix_state_kernel1<<<ceil_div((size_t)B * C, block), block, 0, main_stream>>>(x, state_tok, B, Np, C);
            launchCheck();
        }
    } else {
        dim3 grid = ceil_div((size_t)B * Np * C, block);
        flow_prefix_embed_kernel<<<grid, block, 0, main_stream>>>(x, img_tok, embed, tokens, state_tok, B, p->n_cam,
                                                                  p->NI, T, Np, C, scale, img_scale);
        launchCheck();
    }
}

static void run_embed_tokens_backward(int v, int block, const Prefix* p, float* dtable, const float* dx,
                                      const int32_t* tokens) {
    int B = p->B, T = p->T, Np = prefix_tokens(p), C = p->C;
    float scale = sqrtf((float)C);
    if (v == 1) {
        dim3 grid = ceil_div((size_t)p->vocab * C, block);
        embed_tokens_backward_kernel1<<<grid, block, 0, main_stream>>>(dtable, dx, tokens, B, prefix_images(p), T, Np,
                                                                       C, p->vocab, p->pad, scale);
    } else {
        block = v == 0 ? BLOCK : block;
        embed_tokens_backward_kernel<<<B * T, block, 0, main_stream>>>(dtable, dx, tokens, B, prefix_images(p), T, Np,
                                                                       C, p->pad, scale);
    }
    launchCheck();
}

static void run_image_grad(int v, int block, const Prefix* p, floatX* dimg, const float* dx) {
    int B = p->B, Np = prefix_tokens(p), C = p->C;
    size_t n = (size_t)B * prefix_images(p) * C;
    if (v == 0) {
        LAUNCH_1D(prefix_image_grad_kernel, n, dimg, dx, B, p->n_cam, p->NI, Np, C, image_scale(p));
    } else if (v == 1) {
        prefix_image_grad_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dimg, dx, B, p->n_cam, p->NI, Np, C,
                                                                                 image_scale(p));
        launchCheck();
    } else {
        prefix_image_grad_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(dimg, dx, B, p->n_cam, p->NI, Np, C,
                                                                                image_scale(p));
        launchCheck();
    }
}

// ----------------------------------------------------------------------------
// references

// LeRobot's pad_masks and att_masks of sample b over n = NI + T + n_after tokens, as embed_prefix and
// embed_suffix append them: images, language, then the state and the actions (n_after of them)
static void sequence_flags(int* pad, int* att, const float* token_mask, int b, int NI, int T, int n_after,
                           int causal) {
    int j = 0;
    for (int i = 0; i < NI; i++, j++) { pad[j] = 1; att[j] = 0; }  // images: img_masks are all true here
    for (int q = 0; q < T; q++, j++) { pad[j] = token_mask[(size_t)b * T + q] != 0.0f; att[j] = 0; }
    // the state its own block; the first action starts the actions' block, and (causal) so does each
    for (int a = 0; a < n_after; a++, j++) { pad[j] = 1; att[j] = a <= 1 || causal; }
}

// block (B, n): cumsum(att) where valid, -1 for a pad; pos (B, n) = cumsum(pad) - 1; x_pos (B, H):
// the suffix's positions minus their smallest; mask (B, n, n): make_att_2d_masks. n = Np + H.
static void sequence_reference(int* block, int* pos, int* x_pos, unsigned char* mask, const float* token_mask,
                               const Prefix* p) {
    int NI = prefix_images(p), T = p->T, Np = prefix_tokens(p), H = suffix_tokens(p), n = Np + H;
    int* pad = (int*)mallocCheck(n * sizeof(int));
    int* att = (int*)mallocCheck(n * sizeof(int));
    int* cum = (int*)mallocCheck(n * sizeof(int));
    for (int b = 0; b < p->B; b++) {
        sequence_flags(pad, att, token_mask, b, NI, T, n - NI - T, !p->pi0);
        int c = 0, v = 0;
        for (int j = 0; j < n; j++) {
            c += att[j];
            v += pad[j];
            cum[j] = c;
            block[(size_t)b * n + j] = pad[j] ? c : -1;
            pos[(size_t)b * n + j] = v - 1;
        }
        int lowest = INT_MAX;
        const int* suffix_pos = pos + (size_t)b * n + Np;
        for (int a = 0; a < H; a++) { lowest = suffix_pos[a] < lowest ? suffix_pos[a] : lowest; }
        for (int a = 0; a < H; a++) { x_pos[(size_t)b * H + a] = suffix_pos[a] - lowest; }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) { mask[((size_t)b * n + i) * n + j] = cum[j] <= cum[i] && pad[i] && pad[j]; }
        }
    }
    free(pad); free(att); free(cum);
}

// x (B, Np, C) per sample: [camera 0's NI tokens]...[T language rows of table][SmolVLA's state];
// the images times img_scale, the language times sqrt(C)
static void embed_reference(double* x, const float* img_tok, const float* table, const int32_t* tokens,
                            const float* state_tok, const Prefix* p) {
    int B = p->B, NI = p->NI, T = p->T, C = p->C;
    double scale = sqrt((double)C), img_scale = p->pi0 ? 1.0 : scale;
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        for (int cam = 0; cam < p->n_cam; cam++) {
            const float* img = img_tok + ((size_t)cam * B + b) * NI * C;  // image cam * B + b
            for (size_t e = 0; e < (size_t)NI * C; e++) { x[at++] = img[e] * img_scale; }
        }
        for (int q = 0; q < T; q++) {
            const float* row = table + (size_t)tokens[(size_t)b * T + q] * C;
            for (int k = 0; k < C; k++) { x[at++] = row[k] * scale; }
        }
        if (p->pi0) { continue; }
        for (int k = 0; k < C; k++) { x[at++] = state_tok[(size_t)b * C + k]; }
    }
}

// the gradients of the two scaled parts of the embedding: dtable (vocab, C) += what reaches each
// id's row (not the pad id's); dimg (n_cam B NI, C) = what reaches each image token
static void embed_backward_reference(double* dtable, double* dimg, const float* dx, const int32_t* tokens,
                                     const Prefix* p) {
    int B = p->B, NI = p->NI, T = p->T, C = p->C, Np = prefix_tokens(p);
    double scale = sqrt((double)C), img_scale = p->pi0 ? 1.0 : scale;
    for (int b = 0; b < B; b++) {
        const float* dxb = dx + (size_t)b * Np * C;
        for (int cam = 0; cam < p->n_cam; cam++) {
            for (int i = 0; i < NI; i++) {
                for (int k = 0; k < C; k++) {
                    dimg[(((size_t)cam * B + b) * NI + i) * C + k] = img_scale * dxb[((size_t)cam * NI + i) * C + k];
                }
            }
        }
        for (int q = 0; q < T; q++) {
            int tok = tokens[(size_t)b * T + q];
            if (tok == p->pad) { continue; }
            const float* row = dxb + ((size_t)prefix_images(p) + q) * C;
            for (int k = 0; k < C; k++) { dtable[(size_t)tok * C + k] += scale * row[k]; }
        }
    }
}

// ----------------------------------------------------------------------------
// inputs

// The (B, T) token mask as LeRobot's tokenizer pads: sample b keeps its first len_b tokens, the
// empty and the full text included; with holes, a few masked tokens inside the text too (the
// formulas hold for any mask, so the kernel must as well)
static float* make_token_mask(int B, int T, int holes, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 7);
    float* m = (float*)mallocCheck((size_t)B * T * sizeof(float));
    for (int b = 0; b < B; b++) {
        int len = b == 0 ? T : b == 1 ? 0 : (int)(rng_uniform(&r) * (T + 1)) % (T + 1);
        for (int q = 0; q < T; q++) {
            int valid = q < len && !(holes && rng_uniform(&r) < 0.25);
            m[(size_t)b * T + q] = valid ? 1.0f : 0.0f;
        }
    }
    return m;
}

// (B, T) ids in [0, vocab): the pad id where the mask is 0, random ids (from a vocabulary small
// enough that ids repeat, the pad id among them) elsewhere
static int32_t* make_tokens(const float* token_mask, int B, int T, int vocab, int pad, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 8);
    int32_t* t = (int32_t*)mallocCheck((size_t)B * T * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)B * T; i++) {
        t[i] = token_mask[i] != 0.0f ? (int32_t)(rng_uniform(&r) * vocab) % vocab : pad;
    }
    return t;
}

// 0x7F7F7F7F in every int: no block id, position or offset the kernel could mean (poison's 0xFF
// would read as -1, a pad's block id)
static void poison_ints(int* d, size_t n) { cudaCheck(cudaMemset(d, 0x7F, n * sizeof(int))); }

static void check_ints(const char* what, const int* got, const int* want, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) { bad += got[i] != want[i]; }
    char msg[300];
    snprintf(msg, sizeof(msg), "%s: %zu of %zu differ", what, bad, n);
    check_true(msg, bad == 0);
}

// "v1 ... block 32", or "trainer ..." for version 0 (at BLOCK threads)
static void version_name(char* out, size_t size, int v, int block, const char* what) {
    if (v == 0) {
        snprintf(out, size, "trainer %s", what);
    } else {
        snprintf(out, size, "v%d %s block %d", v, what, block);
    }
}

// ----------------------------------------------------------------------------
// checks

// the sequence of p's shapes at every version and block size; with `trainer`, the trainer's launch too
// no trainer's launch then)
static void check_sequence(const Prefix* p, int trainer, int holes, uint64_t seed) {
    int B = p->B, T = p->T, H = suffix_tokens(p), n = prefix_tokens(p) + H;
    float* mask = make_token_mask(B, T, holes, seed);
    int* ref_block = (int*)mallocCheck((size_t)B * n * sizeof(int));
    int* ref_pos = (int*)mallocCheck((size_t)B * n * sizeof(int));
    int* ref_xpos = (int*)mallocCheck((size_t)B * H * sizeof(int));
    unsigned char* ref_mask = (unsigned char*)mallocCheck((size_t)B * n * n);
    sequence_reference(ref_block, ref_pos, ref_xpos, ref_mask, mask, p);
    float* d_mask = to_device_f(mask, (size_t)B * T);
    int *block, *pos, *x_pos;
    cudaCheck(cudaMalloc(&block, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&pos, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&x_pos, (size_t)B * H * sizeof(int)));
    char shape[160], what[240], item[300];
    snprintf(shape, sizeof(shape), "sequence %s (B %d, NI %d, T %d, H %d%s)", p->pi0 ? "pi0" : "SmolVLA", B,
             prefix_images(p), T, H, holes ? ", holes" : "");
    for (int v = trainer ? 0 : 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < (v == 0 ? 1 : N_BLOCKS); bi++) {
            int bl = BLOCKS[bi];
            poison_ints(block, (size_t)B * n);
            poison_ints(pos, (size_t)B * n);
            poison_ints(x_pos, (size_t)B * H);
            run_sequence(v, bl, p, block, pos, x_pos, d_mask);
            int* got_block = from_device_i(block, (size_t)B * n);
            int* got_pos = from_device_i(pos, (size_t)B * n);
            int* got_xpos = from_device_i(x_pos, (size_t)B * H);
            version_name(what, sizeof(what), v, bl, shape);
            snprintf(item, sizeof(item), "%s: block ids", what);
            check_ints(item, got_block, ref_block, (size_t)B * n);
            snprintf(item, sizeof(item), "%s: positions cumsum(valid) - 1", what);
            check_ints(item, got_pos, ref_pos, (size_t)B * n);
            snprintf(item, sizeof(item), "%s: cross-attention positions", what);
            check_ints(item, got_xpos, ref_xpos, (size_t)B * H);
            // the block ids as the attention kernels read them, against make_att_2d_masks pair by pair
            size_t bad = 0;
            for (int b = 0; b < B; b++) {
                for (int i = 0; i < n; i++) {
                    for (int j = 0; j < n; j++) {
                        int qb = got_block[(size_t)b * n + i], kb = got_block[(size_t)b * n + j];
                        bad += (kb >= 0 && kb <= qb) != (ref_mask[((size_t)b * n + i) * n + j] != 0);
                    }
                }
            }
            snprintf(item, sizeof(item), "%s: 0 <= block[key] <= block[query] is make_att_2d_masks: %zu of %zu "
                     "pairs differ", what, bad, (size_t)B * n * n);
            check_true(item, bad == 0);
            free(got_block); free(got_pos); free(got_xpos);
        }
    }
    cudaCheck(cudaFree(block)); cudaCheck(cudaFree(pos)); cudaCheck(cudaFree(x_pos)); cudaCheck(cudaFree(d_mask));
    free(mask); free(ref_block); free(ref_pos); free(ref_xpos); free(ref_mask);
}

// the forward embedding and both gradients out of it, at one shape (c as check_sequence's)
static void check_embed(const Prefix* p, int trainer, uint64_t seed) {
    int B = p->B, T = p->T, C = p->C, vocab = p->vocab, pad = p->pad;
    size_t n_img = (size_t)B * prefix_images(p) * C, n_x = (size_t)B * prefix_tokens(p) * C;
    size_t n_table = (size_t)vocab * C;
    float* mask = make_token_mask(B, T, 0, seed);
    int32_t* tokens = make_tokens(mask, B, T, vocab, pad, seed + 1);
    float* img = random_floats(n_img, 1.0f, seed + 2);
    float* table = random_floats(n_table, 0.1f, seed + 3);
    float* state = random_floats((size_t)B * C, 1.0f, seed + 4);
    float* dx = random_floats(n_x, 1.0f, seed + 5);
    float* dtable0 = random_floats(n_table, 1.0f, seed + 6);
    floatX* d_img = to_device_x(img, n_img);
    floatX* d_table = to_device_x(table, n_table);
    floatX* d_state = to_device_x(state, (size_t)B * C);
    int* d_tokens = to_device_i(tokens, (size_t)B * T);
    float* d_dx = to_device_f(dx, n_x);
    double* ref_x = (double*)mallocCheck(n_x * sizeof(double));
    double* ref_dtable = (double*)callocCheck(n_table, sizeof(double));
    double* ref_dimg = (double*)mallocCheck(n_img * sizeof(double));
    embed_reference(ref_x, img, table, tokens, state, p);
    embed_backward_reference(ref_dtable, ref_dimg, dx, tokens, p);
    // the rows no gradient may touch: ids that never occur, and the pad id
    unsigned char* touched = (unsigned char*)callocCheck(vocab, 1);
    for (size_t q = 0; q < (size_t)B * T; q++) { touched[tokens[q]] |= tokens[q] != pad; }
    floatX *x, *dimg;
    cudaCheck(cudaMalloc(&x, n_x * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dimg, n_img * sizeof(floatX)));
    char shape[200], what[260], item[360];
    snprintf(shape, sizeof(shape), "%s (B %d, %d cam x %d, T %d, C %d, vocab %d, pad %d)", p->pi0 ? "pi0" : "SmolVLA",
             B, p->n_cam, p->NI, T, C, vocab, pad);
    for (int v = trainer ? 0 : 1; v <= N_VERSIONS; v++) {
        for (int bi = 0; bi < (v == 0 ? 1 : N_BLOCKS); bi++) {
            int bl = BLOCKS[bi];
            poison(x, n_x * sizeof(floatX));
            run_embed(v, bl, p, x, d_img, d_table, d_tokens, d_state);
            float* got = from_device_x(x, n_x);
            snprintf(item, sizeof(item), "prefix_embed %s", shape);
            version_name(what, sizeof(what), v, bl, item);
            check_close(what, got, ref_x, n_x, TOL_X);
            free(got);

            poison(dimg, n_img * sizeof(floatX));
            run_image_grad(v, bl, p, dimg, d_dx);
            got = from_device_x(dimg, n_img);
            snprintf(item, sizeof(item), "prefix_image_grad %s", shape);
            version_name(what, sizeof(what), v, bl, item);
            check_close(what, got, ref_dimg, n_img, TOL_X);
            free(got);

            float* d_dtable = to_device_f(dtable0, n_table);
            run_embed_tokens_backward(v, bl, p, d_dtable, d_dx, d_tokens);
            snprintf(item, sizeof(item), "embed_tokens_backward %s", shape);
            version_name(what, sizeof(what), v, bl, item);
            snprintf(item, sizeof(item), "%s: dtable (+=)", what);
            check_accumulated(item, d_dtable, dtable0, ref_dtable, n_table, TOL_F);
            float* after = from_device_f(d_dtable, n_table);
            size_t bad = 0, rows = 0;
            for (int t = 0; t < vocab; t++) {
                if (touched[t]) { continue; }
                rows++;
                for (int k = 0; k < C; k++) { bad += !(after[(size_t)t * C + k] == dtable0[(size_t)t * C + k]); }
            }
            snprintf(item, sizeof(item), "%s: the pad row and %zu unused rows untouched, %zu values differ", what,
                     rows - 1, bad);
            check_true(item, bad == 0);
            free(after);
            cudaCheck(cudaFree(d_dtable));
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dimg)); cudaCheck(cudaFree(d_img)); cudaCheck(cudaFree(d_table));
    cudaCheck(cudaFree(d_state)); cudaCheck(cudaFree(d_tokens)); cudaCheck(cudaFree(d_dx));
    free(mask); free(tokens); free(img); free(table); free(state); free(dx); free(dtable0); free(ref_x);
    free(ref_dtable); free(ref_dimg); free(touched);
}

// ----------------------------------------------------------------------------
// benchmark at the presets' shapes: smolvla at batch 32 (2 cameras of 64 tokens, 48 language
// tokens, width 960, vocabulary 49280, pad id 2, 50 actions), pi0 at batch 8 (2 cameras of 256
// tokens, 48 language tokens, width 2048, vocabulary 257152, the state and 50 actions)

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, int v, double bytes, int reps, F fn) {
    double ms = time_ms(fn, reps);
    printf("bench %-8s v%d %-16s %9.4f ms, %7.1f GB/s\n", name, v, v == 1 ? "(this program's)" : "(the trainer's)",
           ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark_preset(const char* preset, Prefix p) {
    int B = p.B, T = p.T, C = p.C, Np = prefix_tokens(&p), H = suffix_tokens(&p), n = Np + H;
    size_t n_img = (size_t)B * prefix_images(&p) * C, n_x = (size_t)B * Np * C, n_table = (size_t)p.vocab * C;
    size_t X = sizeof(floatX);
    printf("%s at batch %d: %d prefix tokens (%d image tokens), %d suffix tokens, width %d\n", preset, B, Np,
           prefix_images(&p), H, C);
    float* mask = make_token_mask(B, T, 0, 1);
    int32_t* tokens = make_tokens(mask, B, T, p.vocab, p.pad, 2);
    float* d_mask = to_device_f(mask, (size_t)B * T);
    int* d_tokens = to_device_i(tokens, (size_t)B * T);
    int *block, *pos, *x_pos;
    floatX *img, *table, *state, *x, *dimg;
    float *dx, *dtable;
    cudaCheck(cudaMalloc(&block, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&pos, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&x_pos, (size_t)B * H * sizeof(int)));
    cudaCheck(cudaMalloc(&img, n_img * X));
    cudaCheck(cudaMalloc(&table, n_table * X));
    cudaCheck(cudaMalloc(&state, (size_t)B * C * X));
    cudaCheck(cudaMalloc(&x, n_x * X));
    cudaCheck(cudaMalloc(&dimg, n_img * X));
    cudaCheck(cudaMalloc(&dx, n_x * sizeof(float)));
    cudaCheck(cudaMalloc(&dtable, n_table * sizeof(float)));
    cudaCheck(cudaMemset(img, 0, n_img * X));
    cudaCheck(cudaMemset(table, 0, n_table * X));
    cudaCheck(cudaMemset(state, 0, (size_t)B * C * X));
    cudaCheck(cudaMemset(dx, 0, n_x * sizeof(float)));
    cudaCheck(cudaMemset(dtable, 0, n_table * sizeof(float)));
    for (int v = 1; v <= N_VERSIONS; v++) {
        int bv = v == N_VERSIONS ? 0 : v;  // version 2 as the trainer launches it
        bench("sequence", v, (double)B * T * 4 + (double)B * (2 * n + H) * 4, 20,
              [&]() { run_sequence(bv, BLOCK, &p, block, pos, x_pos, d_mask); });
        // every value read once (image, table or state), written once
        bench("embed", v, 2.0 * n_x * X, 20, [&]() { run_embed(bv, BLOCK, &p, x, img, table, d_tokens, state); });
        bench("dimg", v, (double)n_img * (4 + X), 20, [&]() { run_image_grad(bv, BLOCK, &p, dimg, dx); });
        // the language rows of dx read, a table row read and written per position (an upper bound on
        // the rows: repeated ids share theirs); version 1 also reads every id once a table value
        bench("dtable", v, (double)B * T * C * 4 * 3, v == 1 ? 5 : 20,
              [&]() { run_embed_tokens_backward(bv, BLOCK, &p, dtable, dx, d_tokens); });
    }
    free(mask); free(tokens);
    cudaCheck(cudaFree(d_mask)); cudaCheck(cudaFree(d_tokens)); cudaCheck(cudaFree(block)); cudaCheck(cudaFree(pos));
    cudaCheck(cudaFree(x_pos)); cudaCheck(cudaFree(img)); cudaCheck(cudaFree(table)); cudaCheck(cudaFree(state));
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dimg)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dtable));
}

static void benchmark(void) {
    benchmark_preset("smolvla", SMOLVLA);
    benchmark_preset("pi0", PI0);
}

int main(void) {
    dev_init("prefix");
    // (B, n_cam, NI per camera, T, C, vocab, pad, chunk, pi0). The sequence: one sample, one of
    // each; more samples than a 32-thread block holds; the smolvla and pi0 presets' sequences; each
    // right-padded, then with holes in the text
    Prefix seq[] = {{1, 1, 1, 1, 1, 3, 0, 1, 0}, {37, 1, 4, 16, 1, 3, 0, 8, 0}, {3, 2, 64, 48, 1, 3, 0, 50, 0},
                    {1, 1, 1, 1, 1, 3, 0, 1, 1}, {37, 2, 3, 16, 1, 3, 0, 8, 1}, {2, 2, 256, 48, 1, 3, 0, 50, 1}};
    for (int holes = 0; holes <= 1; holes++) {
        for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
            check_sequence(&seq[i], 0, holes, 100 + 10 * i + holes);
        }
    }
    // The embedding: the smallest; the tiny preset's shapes; three cameras and a vocabulary of 5
    // (every id repeats, pad id 2); more positions than fill a warp; each in both families
    Prefix emb[] = {{1, 1, 1, 1, 1, 3, 0, 1, 0}, {2, 1, 4, 16, 48, 256, 0, 8, 0}, {3, 3, 2, 7, 20, 5, 2, 4, 0},
                    {4, 2, 4, 40, 33, 50, 7, 4, 0}};
    for (int pi0 = 0; pi0 <= 1; pi0++) {
        for (size_t i = 0; i < sizeof(emb) / sizeof(emb[0]); i++) {
            emb[i].pi0 = pi0;
            check_embed(&emb[i], 0, 200 + 10 * i + pi0);
        }
    }
    // the trainer's launches, at the tiny presets of both families (3 samples)
    const char* presets[] = {"tiny", "pi0_tiny"};
    const Prefix* shapes[] = {&TINY, &PI0_TINY};
    for (int i = 0; i < 2; i++) {
        printf("%s preset, 3 samples:\n", presets[i]);
        check_sequence(shapes[i], 1, 1, 300 + 10 * i);
        check_embed(shapes[i], 1, 400 + 10 * i);
    }
    return dev_finish(benchmark);
}
