/*
prefix.cu: SmolVLA's prefix as LeRobot's embed_prefix / embed_suffix and forward build it, and the
gradients that leave it (modeling_smolvla.py, vla_utils.make_att_2d_masks).

  sequence    per sample, the tokens [NI image tokens, all cameras][T language][state][H actions] carry
              a pad flag (language: the token mask; everything else valid) and a block flag
              (att_masks: 0 for images and language, 1 for the state and every action). LeRobot's
              mask is make_att_2d_masks: query i sees key j iff cumsum(att)[j] <= cumsum(att)[i]
              and both are valid; its RoPE positions are cumsum(pad) - 1; the expert's
              cross-attention layers use the actions' positions minus their smallest. The kernel
              hands the attention kernels one int per token instead of the 2-D mask: block =
              cumsum(att), or -1 for a pad, read as "query i sees key j iff 0 <= block[j] <=
              block[i]" (train_vla.cu's GqaAttn)
  embed       x (B, Np, C), Np = n_cam NI + T + 1: every camera's NI image tokens (the connector's
              output, camera-major: image cam * B + b) and the language tokens' rows of
              embed_tokens, both times sqrt(C), then the state token as it is
  embed_tokens_backward
              dtable (vocab, C) fp32 += sqrt(C) times the language rows of dx (B, Np, C) fp32,
              summed by token id; the pad id's row gets nothing (nn.Embedding's padding_idx)
  prefix_image_grad
              dimg (n_cam B NI, C) floatX, camera-major = sqrt(C) times the image rows of dx

  version 1  one thread per sample (smolvla_sequence_kernel); one thread per value
             (smolvla_prefix_embed_kernel, prefix_image_grad_kernel); one block per language
             position, which works only where it is its id's first and then sums that id's rows
             in position order: no atomics, the same bits every run (embed_tokens_backward_kernel)

  make -C dev/cuda prefix && dev/cuda/prefix
*/
#include "common.h"

// Integer outputs and copies: exact. floatX outputs of one fp32 product (embed, image grad): 1e-5
// in fp32 builds, 1e-2 in bf16 (8 significant bits: 3.9e-3 per value at worst). fp32 sums of up to
// B T rows (embed_tokens backward): 1e-5.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const double TOL_F = 1e-5;
static const int BLOCKS[] = {32, 100, 256, 1024};  // any block size works for each: 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: train_vla.cu's (common.h includes it whole): smolvla_sequence_kernel,
// smolvla_prefix_embed_kernel, embed_tokens_backward_kernel, prefix_image_grad_kernel; the trainer
// launches them with BLOCK threads (smolvla_prefix_embed, smolvla_prefix_embed_backward)

// ----------------------------------------------------------------------------
// references

// LeRobot's pad_masks and att_masks of sample b over n = NI + T + 1 + H tokens, as embed_prefix and
// embed_suffix append them
static void sequence_flags(int* pad, int* att, const float* token_mask, int b, int NI, int T, int H) {
    int j = 0;
    for (int i = 0; i < NI; i++, j++) { pad[j] = 1; att[j] = 0; }  // images: img_masks are all true here
    for (int q = 0; q < T; q++, j++) { pad[j] = token_mask[(size_t)b * T + q] != 0.0f; att[j] = 0; }
    pad[j] = 1; att[j] = 1; j++;                                   // the state: its own block
    for (int a = 0; a < H; a++, j++) { pad[j] = 1; att[j] = 1; }   // each action its own block
}

// block (B, n): cumsum(att) where valid, -1 for a pad; pos (B, n) = cumsum(pad) - 1; x_pos (B, H):
// the actions' positions minus their smallest; mask (B, n, n): make_att_2d_masks
static void sequence_reference(int* block, int* pos, int* x_pos, unsigned char* mask, const float* token_mask, int B,
                               int NI, int T, int H) {
    int Np = NI + T + 1, n = Np + H;
    int* pad = (int*)mallocCheck(n * sizeof(int));
    int* att = (int*)mallocCheck(n * sizeof(int));
    int* cum = (int*)mallocCheck(n * sizeof(int));
    for (int b = 0; b < B; b++) {
        sequence_flags(pad, att, token_mask, b, NI, T, H);
        int c = 0, v = 0;
        for (int j = 0; j < n; j++) {
            c += att[j];
            v += pad[j];
            cum[j] = c;
            block[(size_t)b * n + j] = pad[j] ? c : -1;
            pos[(size_t)b * n + j] = v - 1;
        }
        int lowest = INT_MAX;
        const int* act_pos = pos + (size_t)b * n + Np;
        for (int a = 0; a < H; a++) { lowest = act_pos[a] < lowest ? act_pos[a] : lowest; }
        for (int a = 0; a < H; a++) { x_pos[(size_t)b * H + a] = act_pos[a] - lowest; }
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < n; j++) { mask[((size_t)b * n + i) * n + j] = cum[j] <= cum[i] && pad[i] && pad[j]; }
        }
    }
    free(pad); free(att); free(cum);
}

// x (B, Np, C) per sample: [camera 0's NI tokens]...[T language rows of table][state]; the first
// two times sqrt(C)
static void embed_reference(double* x, const float* img_tok, const float* table, const int32_t* tokens,
                            const float* state_tok, int B, int n_cam, int NI, int T, int C) {
    double scale = sqrt((double)C);
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        for (int cam = 0; cam < n_cam; cam++) {
            const float* img = img_tok + ((size_t)cam * B + b) * NI * C;  // image cam * B + b
            for (size_t e = 0; e < (size_t)NI * C; e++) { x[at++] = img[e] * scale; }
        }
        for (int q = 0; q < T; q++) {
            const float* row = table + (size_t)tokens[(size_t)b * T + q] * C;
            for (int k = 0; k < C; k++) { x[at++] = row[k] * scale; }
        }
        for (int k = 0; k < C; k++) { x[at++] = state_tok[(size_t)b * C + k]; }
    }
}

// the gradients of the two scaled parts of the embedding: dtable (vocab, C) += what reaches each
// id's row (not the pad id's); dimg (n_cam B NI, C) = what reaches each image token
static void embed_backward_reference(double* dtable, double* dimg, const float* dx, const int32_t* tokens, int B,
                                     int n_cam, int NI, int T, int C, int pad) {
    double scale = sqrt((double)C);
    int Np = n_cam * NI + T + 1;
    for (int b = 0; b < B; b++) {
        const float* dxb = dx + (size_t)b * Np * C;
        for (int cam = 0; cam < n_cam; cam++) {
            for (int i = 0; i < NI; i++) {
                for (int k = 0; k < C; k++) {
                    dimg[(((size_t)cam * B + b) * NI + i) * C + k] = scale * dxb[((size_t)cam * NI + i) * C + k];
                }
            }
        }
        for (int q = 0; q < T; q++) {
            int tok = tokens[(size_t)b * T + q];
            if (tok == pad) { continue; }
            const float* row = dxb + ((size_t)n_cam * NI + q) * C;
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

// ----------------------------------------------------------------------------
// checks

static void check_sequence(int B, int NI, int T, int H, int holes, uint64_t seed) {
    int n = NI + T + 1 + H;
    float* mask = make_token_mask(B, T, holes, seed);
    int* ref_block = (int*)mallocCheck((size_t)B * n * sizeof(int));
    int* ref_pos = (int*)mallocCheck((size_t)B * n * sizeof(int));
    int* ref_xpos = (int*)mallocCheck((size_t)B * H * sizeof(int));
    unsigned char* ref_mask = (unsigned char*)mallocCheck((size_t)B * n * n);
    sequence_reference(ref_block, ref_pos, ref_xpos, ref_mask, mask, B, NI, T, H);
    float* d_mask = to_device_f(mask, (size_t)B * T);
    int *block, *pos, *x_pos;
    cudaCheck(cudaMalloc(&block, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&pos, (size_t)B * n * sizeof(int)));
    cudaCheck(cudaMalloc(&x_pos, (size_t)B * H * sizeof(int)));
    char what[200], item[260];
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int bl = BLOCKS[bi];
        poison_ints(block, (size_t)B * n);
        poison_ints(pos, (size_t)B * n);
        poison_ints(x_pos, (size_t)B * H);
        smolvla_sequence_kernel<<<ceil_div(B, bl), bl, 0, main_stream>>>(block, pos, x_pos, d_mask, B, NI, T, NI + T + 1, H,
                                                                          1);  // SmolVLA's: causal actions
        launchCheck();
        int* got_block = from_device_i(block, (size_t)B * n);
        int* got_pos = from_device_i(pos, (size_t)B * n);
        int* got_xpos = from_device_i(x_pos, (size_t)B * H);
        snprintf(what, sizeof(what), "v1 sequence (B %d, NI %d, T %d, H %d%s) block %d", B, NI, T, H,
                 holes ? ", holes" : "", bl);
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
        snprintf(item, sizeof(item), "%s: 0 <= block[key] <= block[query] is make_att_2d_masks: %zu of %zu pairs "
                 "differ", what, bad, (size_t)B * n * n);
        check_true(item, bad == 0);
        free(got_block); free(got_pos); free(got_xpos);
    }
    cudaCheck(cudaFree(block)); cudaCheck(cudaFree(pos)); cudaCheck(cudaFree(x_pos)); cudaCheck(cudaFree(d_mask));
    free(mask); free(ref_block); free(ref_pos); free(ref_xpos); free(ref_mask);
}

// the forward embedding and both gradients out of it, at one shape
static void check_embed(int B, int n_cam, int NI, int T, int C, int vocab, int pad, uint64_t seed) {
    int Np = n_cam * NI + T + 1;
    size_t n_img = (size_t)n_cam * B * NI * C, n_x = (size_t)B * Np * C, n_table = (size_t)vocab * C;
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
    embed_reference(ref_x, img, table, tokens, state, B, n_cam, NI, T, C);
    embed_backward_reference(ref_dtable, ref_dimg, dx, tokens, B, n_cam, NI, T, C, pad);
    // the rows no gradient may touch: ids that never occur, and the pad id
    unsigned char* touched = (unsigned char*)callocCheck(vocab, 1);
    for (size_t q = 0; q < (size_t)B * T; q++) { touched[tokens[q]] |= tokens[q] != pad; }
    floatX *x, *dimg;
    cudaCheck(cudaMalloc(&x, n_x * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dimg, n_img * sizeof(floatX)));
    float scale = sqrtf((float)C);  // what the trainer passes
    char what[200], item[260];
    snprintf(what, sizeof(what), "(B %d, %d cam x %d, T %d, C %d, vocab %d, pad %d)", B, n_cam, NI, T, C, vocab, pad);
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int bl = BLOCKS[bi];
        poison(x, n_x * sizeof(floatX));
        smolvla_prefix_embed_kernel<<<ceil_div(n_x, bl), bl, 0, main_stream>>>(x, d_img, d_table, d_tokens, d_state, B,
                                                                               n_cam, NI, T, n_cam * NI + T + 1, C, scale,
                                                                               scale);  // SmolVLA's: images scaled too
        launchCheck();
        float* got = from_device_x(x, n_x);
        snprintf(item, sizeof(item), "v1 prefix_embed %s block %d", what, bl);
        check_close(item, got, ref_x, n_x, TOL_X);
        free(got);

        poison(dimg, n_img * sizeof(floatX));
        prefix_image_grad_kernel<<<ceil_div(n_img, bl), bl, 0, main_stream>>>(dimg, d_dx, B, n_cam, NI, Np, C, scale);
        launchCheck();
        got = from_device_x(dimg, n_img);
        snprintf(item, sizeof(item), "v1 prefix_image_grad %s block %d", what, bl);
        check_close(item, got, ref_dimg, n_img, TOL_X);
        free(got);

        float* d_dtable = to_device_f(dtable0, n_table);
        embed_tokens_backward_kernel<<<B * T, bl, 0, main_stream>>>(d_dtable, d_dx, d_tokens, B, n_cam * NI, T, Np, C,
                                                                     pad, scale);
        launchCheck();
        snprintf(item, sizeof(item), "v1 embed_tokens_backward %s block %d: dtable (+=)", what, bl);
        check_accumulated(item, d_dtable, dtable0, ref_dtable, n_table, TOL_F);
        float* after = from_device_f(d_dtable, n_table);
        size_t bad = 0, rows = 0;
        for (int v = 0; v < vocab; v++) {
            if (touched[v]) { continue; }
            rows++;
            for (int k = 0; k < C; k++) { bad += !(after[(size_t)v * C + k] == dtable0[(size_t)v * C + k]); }
        }
        snprintf(item, sizeof(item), "v1 embed_tokens_backward %s block %d: the pad row and %zu unused rows untouched, "
                 "%zu values differ", what, bl, rows - 1, bad);
        check_true(item, bad == 0);
        free(after);
        cudaCheck(cudaFree(d_dtable));
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dimg)); cudaCheck(cudaFree(d_img)); cudaCheck(cudaFree(d_table));
    cudaCheck(cudaFree(d_state)); cudaCheck(cudaFree(d_tokens)); cudaCheck(cudaFree(d_dx));
    free(mask); free(tokens); free(img); free(table); free(state); free(dx); free(dtable0); free(ref_x);
    free(ref_dtable); free(ref_dimg); free(touched);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: batch 32, 2 cameras of 64 tokens, 48 language tokens, width 960,
// vocabulary 49280 (pad id 2), 50 actions

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v1 %-24s %8.4f ms, %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    const int B = 32, n_cam = 2, NI = 64, T = 48, C = 960, vocab = 49280, pad = 2, H = 50;
    const int Np = n_cam * NI + T + 1, n = Np + H;
    size_t n_img = (size_t)n_cam * B * NI * C, n_x = (size_t)B * Np * C, n_table = (size_t)vocab * C;
    size_t X = sizeof(floatX);
    float* mask = make_token_mask(B, T, 0, 1);
    int32_t* tokens = make_tokens(mask, B, T, vocab, pad, 2);
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
    float scale = sqrtf((float)C);
    bench("sequence", (double)B * T * 4 + (double)B * (2 * n + H) * 4, [&]() {
        LAUNCH_1D(smolvla_sequence_kernel, B, block, pos, x_pos, d_mask, B, n_cam * NI, T, n_cam * NI + T + 1, H, 1);
    });
    bench("prefix_embed", 2.0 * n_x * X, [&]() {  // every value read once (image, table or state), written once
        LAUNCH_1D(smolvla_prefix_embed_kernel, n_x, x, img, table, d_tokens, state, B, n_cam, NI, T, n_cam * NI + T + 1, C,
                  scale, scale);
    });
    bench("prefix_image_grad", (double)n_img * (4 + X), [&]() {
        LAUNCH_1D(prefix_image_grad_kernel, n_img, dimg, dx, B, n_cam, NI, Np, C, scale);
    });
    // the language rows of dx read, a table row read and written per position (an upper bound on
    // the rows: repeated ids share theirs)
    bench("embed_tokens_backward", (double)B * T * C * 4 * 3, [&]() {
        embed_tokens_backward_kernel<<<B * T, BLOCK, 0, main_stream>>>(dtable, dx, d_tokens, B, n_cam * NI, T, Np, C,
                                                                       pad, scale);
        launchCheck();
    });
    free(mask); free(tokens);
    cudaCheck(cudaFree(d_mask)); cudaCheck(cudaFree(d_tokens)); cudaCheck(cudaFree(block)); cudaCheck(cudaFree(pos));
    cudaCheck(cudaFree(x_pos)); cudaCheck(cudaFree(img)); cudaCheck(cudaFree(table)); cudaCheck(cudaFree(state));
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(dimg)); cudaCheck(cudaFree(dx)); cudaCheck(cudaFree(dtable));
}

int main(void) {
    dev_init("prefix");
    // (B, NI image tokens of all cameras, T, H): one sample, one of each; the tiny preset with more
    // samples than a 32-thread block holds; the smolvla preset's sequence; each right-padded, then
    // with holes in the text
    struct { int B, NI, T, H; } seq[] = {{1, 1, 1, 1}, {37, 4, 16, 8}, {3, 128, 48, 50}};
    for (int holes = 0; holes <= 1; holes++) {
        for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
            check_sequence(seq[i].B, seq[i].NI, seq[i].T, seq[i].H, holes, 100 + 10 * i + holes);
        }
    }
    // (B, n_cam, NI per camera, T, C, vocab, pad): the smallest; the tiny preset; three cameras and
    // a vocabulary of 5 (every id repeats, pad id 2); more positions than fill a warp
    struct { int B, n_cam, NI, T, C, vocab, pad; } emb[] = {
        {1, 1, 1, 1, 1, 3, 0}, {2, 1, 4, 16, 48, 256, 0}, {3, 3, 2, 7, 20, 5, 2}, {4, 2, 4, 40, 33, 50, 7}};
    for (size_t i = 0; i < sizeof(emb) / sizeof(emb[0]); i++) {
        check_embed(emb[i].B, emb[i].n_cam, emb[i].NI, emb[i].T, emb[i].C, emb[i].vocab, emb[i].pad, 200 + 10 * i);
    }
    return dev_finish(benchmark);
}
