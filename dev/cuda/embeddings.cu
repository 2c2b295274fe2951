/*
embeddings.cu: the model's token embeddings and their backward, and the row copies between the
stacks' residual streams.

  prefix:  images u8 (n_img, img, img, 3) -> patches (n_img * g*g, p*p*3) as x/127.5 - 1, g = img/p
           (patch_out, the patches through patch_w, is a matmul: not here); tokens x (B, Np, d):
           image rows patch_out + pos_emb, text rows text_emb[token id]; key_valid (B, Np)
  backward: dpos_emb (NI, d) += image rows of dx summed over samples; dtext_emb (256, d) += the
           text rows of dx by token id (both fp32, accumulated)
  suffix:  tokens x (B, Ns, da) = [state token, H action tokens]; gather_rows copies a run of
           rows per sample (the action rows out of the suffix, the image rows out of dx);
           scatter_action_grad puts the velocity head's input gradient back in the suffix's
           rows (fp32 and floatX, the state row zero)

  version 1  one thread per value for every kernel but text_emb_backward_kernel, which has one
             block per token id summing its rows in order (train_vla.cu: patchify_kernel,
             prefix_embed_kernel, pos_emb_backward_kernel, text_emb_backward_kernel,
             gather_rows_kernel, suffix_embed_kernel, scatter_action_grad_kernel)

  make -C dev/cuda embeddings && dev/cuda/embeddings
*/
#include "common.h"

typedef struct {
    int B, n_cam, img, p, T, d, H, da;
    int g, NI, Np, Ns, n_img;
    uint8_t* images;         // (n_img, img, img, 3)
    int32_t* tokens;         // (B, T): token ids (bytes), 0 past the instruction
    float* text_mask;        // (B, T)
    float *patch_out, *pos_emb, *text_emb;  // (B*NI, d), (NI, d), (256, d), rounded to floatX
    float* dx;                              // (B, Np, d) fp32: the prefix's residual gradient
    float *state_tok, *act_tok, *dfin;      // (B, da), (B*H, da) rounded to floatX; (B*H, da) fp32
    uint8_t* d_images;
    int32_t* d_tokens;
    float *d_text_mask, *d_dx, *d_dfin;
    floatX *d_patch_out, *d_pos_emb, *d_text_emb, *d_state_tok, *d_act_tok;
} Case;

static uint8_t* to_device_u8(const uint8_t* h, size_t n) {
    uint8_t* d;
    cudaCheck(cudaMalloc(&d, n));
    cudaCheck(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static int32_t* to_device_i32(const int32_t* h, size_t n) {
    int32_t* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(int32_t)));
    cudaCheck(cudaMemcpy(d, h, n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return d;
}

static Case make_case(int B, int n_cam, int img, int p, int T, int d, int H, int da, uint64_t seed) {
    Case k;
    memset(&k, 0, sizeof(k));
    k.B = B; k.n_cam = n_cam; k.img = img; k.p = p; k.T = T; k.d = d; k.H = H; k.da = da;
    k.g = img / p; k.NI = n_cam * k.g * k.g; k.Np = k.NI + T; k.Ns = 1 + H; k.n_img = B * n_cam;
    Rng r;
    rng_init(&r, seed, 7);
    size_t n_pix = (size_t)k.n_img * img * img * 3;
    k.images = (uint8_t*)mallocCheck(n_pix);
    for (size_t e = 0; e < n_pix; e++) { k.images[e] = (uint8_t)(rng_uniform(&r) * 256.0); }
    // instructions of different lengths over a small alphabet, so bytes repeat within and across
    // samples (text_emb_backward sums them); byte 0 pads the rest, masked
    k.tokens = (int32_t*)mallocCheck((size_t)B * T * sizeof(int32_t));
    k.text_mask = (float*)mallocCheck((size_t)B * T * sizeof(float));
    const uint8_t alphabet[6] = {'a', 'e', 't', ' ', 1, 255};
    for (int b = 0; b < B; b++) {
        int len = 1 + (b * 5 + 2) % T;
        for (int i = 0; i < T; i++) {
            k.tokens[b * T + i] = i < len ? alphabet[(int)(rng_uniform(&r) * 6.0) % 6] : 0;
            k.text_mask[b * T + i] = i < len ? 1.0f : 0.0f;
        }
    }
    k.patch_out = random_floats((size_t)B * k.NI * d, 1.0f, seed + 1);
    k.pos_emb = random_floats((size_t)k.NI * d, 0.5f, seed + 2);
    k.text_emb = random_floats((size_t)256 * d, 1.0f, seed + 3);
    k.dx = random_floats((size_t)B * k.Np * d, 1.0f, seed + 4);
    k.state_tok = random_floats((size_t)B * da, 1.0f, seed + 5);
    k.act_tok = random_floats((size_t)B * H * da, 1.0f, seed + 6);
    k.dfin = random_floats((size_t)B * H * da, 1.0f, seed + 7);
    k.d_images = to_device_u8(k.images, n_pix);
    k.d_tokens = to_device_i32(k.tokens, (size_t)B * T);
    k.d_text_mask = to_device_f(k.text_mask, (size_t)B * T);
    k.d_patch_out = to_device_x(k.patch_out, (size_t)B * k.NI * d);
    k.d_pos_emb = to_device_x(k.pos_emb, (size_t)k.NI * d);
    k.d_text_emb = to_device_x(k.text_emb, (size_t)256 * d);
    k.d_dx = to_device_f(k.dx, (size_t)B * k.Np * d);
    k.d_state_tok = to_device_x(k.state_tok, (size_t)B * da);
    k.d_act_tok = to_device_x(k.act_tok, (size_t)B * H * da);
    k.d_dfin = to_device_f(k.dfin, (size_t)B * H * da);
    return k;
}

static void free_case(Case* k) {
    free(k->images); free(k->tokens); free(k->text_mask); free(k->patch_out); free(k->pos_emb); free(k->text_emb);
    free(k->dx); free(k->state_tok); free(k->act_tok); free(k->dfin);
    cudaCheck(cudaFree(k->d_images)); cudaCheck(cudaFree(k->d_tokens)); cudaCheck(cudaFree(k->d_text_mask));
    cudaCheck(cudaFree(k->d_patch_out)); cudaCheck(cudaFree(k->d_pos_emb)); cudaCheck(cudaFree(k->d_text_emb));
    cudaCheck(cudaFree(k->d_dx)); cudaCheck(cudaFree(k->d_state_tok)); cudaCheck(cudaFree(k->d_act_tok));
    cudaCheck(cudaFree(k->d_dfin));
}

static double* alloc_ref(size_t n) { return (double*)callocCheck(n, sizeof(double)); }

// Tolerances. Exact copies (gather, suffix tokens, text rows' key_valid, the fp32 scatter): 0.
// A few fp32 operations (x/127.5 - 1, patch_out + pos_emb) stored in floatX: 1e-5 in fp32
// builds, 1e-2 in bf16 (8 significant bits: 2^-8 = 3.9e-3 relative at worst). Sums of fp32
// values in order (the embedding gradients): 1e-5, their inputs being exact. A float rounded to
// floatX: the reference rounds it the same way (to nearest even), so 0.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static void check_prefix(const Case* k, int block) {
    int B = k->B, NI = k->NI, Np = k->Np, T = k->T, d = k->d, p = k->p, g = k->g, img = k->img;
    char what[200], shape[120];
    snprintf(shape, sizeof(shape), "(B %d, cams %d, img %d, p %d, T %d, d %d) block %d", B, k->n_cam, img, p, T, d, block);

    // patchify: patch (pr, pc) of image im holds its pixel rows pr*p.., columns pc*p.., as
    // (pixel row, pixel column, channel)
    size_t n_patch = (size_t)k->n_img * g * g * p * p * 3;
    double* ref = alloc_ref(n_patch);
    for (int im = 0; im < k->n_img; im++) {
        for (int pr = 0; pr < g; pr++) {
            for (int pc = 0; pc < g; pc++) {
                for (int y = 0; y < p; y++) {
                    for (int x = 0; x < p; x++) {
                        for (int ch = 0; ch < 3; ch++) {
                            size_t dst = (((size_t)im * g * g + pr * g + pc) * p * p + y * p + x) * 3 + ch;
                            size_t src = (((size_t)im * img + pr * p + y) * img + pc * p + x) * 3 + ch;
                            ref[dst] = k->images[src] / 127.5 - 1.0;
                        }
                    }
                }
            }
        }
    }
    floatX* patches;
    cudaCheck(cudaMalloc(&patches, n_patch * sizeof(floatX)));
    poison(patches, n_patch * sizeof(floatX));
    patchify_kernel<<<ceil_div(n_patch, block), block, 0, main_stream>>>(patches, k->d_images, k->n_img, img, p);
    launchCheck();
    float* got = from_device_x(patches, n_patch);
    snprintf(what, sizeof(what), "v1 patchify %s: patches", shape);
    check_close(what, got, ref, n_patch, TOL_X);
    free(got); free(ref);
    cudaCheck(cudaFree(patches));

    // prefix tokens and key_valid
    size_t n_x = (size_t)B * Np * d;
    ref = alloc_ref(n_x);
    double* ref_valid = alloc_ref((size_t)B * Np);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Np; i++) {
            for (int c = 0; c < d; c++) {
                double v = i < NI ? (double)k->patch_out[((size_t)b * NI + i) * d + c] + k->pos_emb[(size_t)i * d + c]
                                  : (double)k->text_emb[(size_t)k->tokens[b * T + i - NI] * d + c];
                ref[((size_t)b * Np + i) * d + c] = v;
            }
            ref_valid[b * Np + i] = i < NI ? 1.0 : k->text_mask[b * T + i - NI];
        }
    }
    floatX* x;
    float* valid;
    cudaCheck(cudaMalloc(&x, n_x * sizeof(floatX)));
    cudaCheck(cudaMalloc(&valid, (size_t)B * Np * sizeof(float)));
    poison(x, n_x * sizeof(floatX));
    poison(valid, (size_t)B * Np * sizeof(float));
    prefix_embed_kernel<<<ceil_div(n_x, block), block, 0, main_stream>>>(x, valid, k->d_patch_out, k->d_pos_emb, k->d_text_emb, k->d_tokens, k->d_text_mask, B, NI, T, d);
    launchCheck();
    got = from_device_x(x, n_x);
    float* got_valid = from_device_f(valid, (size_t)B * Np);
    snprintf(what, sizeof(what), "v1 prefix_embed %s: x", shape);
    check_close(what, got, ref, n_x, TOL_X);
    snprintf(what, sizeof(what), "v1 prefix_embed %s: key_valid", shape);
    check_close(what, got_valid, ref_valid, (size_t)B * Np, 0.0);
    free(got); free(got_valid); free(ref); free(ref_valid);
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(valid));

    // position embedding backward: the accumulator starts from known random values
    size_t n_pos = (size_t)NI * d;
    ref = alloc_ref(n_pos);
    for (int b = 0; b < B; b++) {
        for (size_t e = 0; e < n_pos; e++) { ref[e] += k->dx[(size_t)b * Np * d + e]; }
    }
    float* dpos0 = random_floats(n_pos, 1.0f, 900 + block);
    float* dpos = to_device_f(dpos0, n_pos);
    pos_emb_backward_kernel<<<ceil_div(n_pos, block), block, 0, main_stream>>>(dpos, k->d_dx, B, NI, Np, d);
    launchCheck();
    snprintf(what, sizeof(what), "v1 pos_emb_backward %s: dpos (+=)", shape);
    check_accumulated(what, dpos, dpos0, ref, n_pos, 1e-5);
    free(ref); free(dpos0);
    cudaCheck(cudaFree(dpos));

    // text embedding backward: every text row of dx (pads included: their gradient is what
    // the model gives them) into its byte's row
    size_t n_text = (size_t)256 * d;
    ref = alloc_ref(n_text);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < T; i++) {
            for (int c = 0; c < d; c++) { ref[(size_t)k->tokens[b * T + i] * d + c] += k->dx[((size_t)b * Np + NI + i) * d + c]; }
        }
    }
    float* dtext0 = random_floats(n_text, 1.0f, 950 + block);
    float* dtext = to_device_f(dtext0, n_text);
    text_emb_backward_kernel<<<256, block, 0, main_stream>>>(dtext, k->d_dx, k->d_tokens, B, NI, T, d);
    launchCheck();
    snprintf(what, sizeof(what), "v1 text_emb_backward %s: dtext (+=)", shape);
    check_accumulated(what, dtext, dtext0, ref, n_text, 1e-5);
    free(ref); free(dtext0);
    cudaCheck(cudaFree(dtext));
}

// rows first..first+count-1 of every sample of src (B, rows, C) through gather_rows_kernel
static void check_gather(const char* name, const char* shape, int block, const floatX* d_src, const float* src, int B,
                         int rows, int first, int count, int C) {
    size_t n = (size_t)B * count * C;
    double* ref = alloc_ref(n);
    for (int b = 0; b < B; b++) {
        for (int r = 0; r < count; r++) {
            for (int c = 0; c < C; c++) { ref[((size_t)b * count + r) * C + c] = src[((size_t)b * rows + first + r) * C + c]; }
        }
    }
    floatX* out;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    poison(out, n * sizeof(floatX));
    gather_rows_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, d_src, B, rows, first, count, C);
    launchCheck();
    float* got = from_device_x(out, n);
    char what[200];
    snprintf(what, sizeof(what), "v1 gather_rows %s %s: rows %d..%d of %d", name, shape, first, first + count - 1, rows);
    check_close(what, got, ref, n, 0.0);
    free(got); free(ref);
    cudaCheck(cudaFree(out));
}

static void check_suffix(const Case* k, int block) {
    int B = k->B, H = k->H, Ns = k->Ns, da = k->da;
    char what[200], shape[120];
    snprintf(shape, sizeof(shape), "(B %d, H %d, da %d) block %d", B, H, da, block);

    // suffix tokens: row 0 the state token, rows 1..H the action tokens
    size_t n_x = (size_t)B * Ns * da;
    double* ref = alloc_ref(n_x);
    float* host_x = (float*)mallocCheck(n_x * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < Ns; s++) {
            for (int c = 0; c < da; c++) {
                float v = s == 0 ? k->state_tok[(size_t)b * da + c] : k->act_tok[((size_t)b * H + s - 1) * da + c];
                ref[((size_t)b * Ns + s) * da + c] = v;
                host_x[((size_t)b * Ns + s) * da + c] = v;
            }
        }
    }
    floatX* x;
    cudaCheck(cudaMalloc(&x, n_x * sizeof(floatX)));
    poison(x, n_x * sizeof(floatX));
    suffix_embed_kernel<<<ceil_div(n_x, block), block, 0, main_stream>>>(x, k->d_state_tok, k->d_act_tok, B, H, da);
    launchCheck();
    float* got = from_device_x(x, n_x);
    snprintf(what, sizeof(what), "v1 suffix_embed %s: x", shape);
    check_close(what, got, ref, n_x, 0.0);
    free(got); free(ref);

    // the action rows back out of the suffix tokens, as the velocity head reads them
    check_gather("suffix actions", shape, block, x, host_x, B, Ns, 1, H, da);
    free(host_x);
    cudaCheck(cudaFree(x));

    // the velocity head's input gradient into the suffix rows, the state row zero
    ref = alloc_ref(n_x);
    double* ref_x = alloc_ref(n_x);
    for (int b = 0; b < B; b++) {
        for (int s = 1; s < Ns; s++) {
            for (int c = 0; c < da; c++) {
                float v = k->dfin[((size_t)b * H + s - 1) * da + c];
                ref[((size_t)b * Ns + s) * da + c] = v;
                ref_x[((size_t)b * Ns + s) * da + c] = round_x(v);
            }
        }
    }
    float* dres;
    floatX* dres_x;
    cudaCheck(cudaMalloc(&dres, n_x * sizeof(float)));
    cudaCheck(cudaMalloc(&dres_x, n_x * sizeof(floatX)));
    poison(dres, n_x * sizeof(float));
    poison(dres_x, n_x * sizeof(floatX));
    scatter_action_grad_kernel<<<ceil_div(n_x, block), block, 0, main_stream>>>(dres, dres_x, k->d_dfin, B, H, da);
    launchCheck();
    float* got_f = from_device_f(dres, n_x);
    got = from_device_x(dres_x, n_x);
    snprintf(what, sizeof(what), "v1 scatter_action_grad %s: dres", shape);
    check_close(what, got_f, ref, n_x, 0.0);
    snprintf(what, sizeof(what), "v1 scatter_action_grad %s: dres_x", shape);
    check_close(what, got, ref_x, n_x, 0.0);
    free(got); free(got_f); free(ref); free(ref_x);
    cudaCheck(cudaFree(dres)); cudaCheck(cudaFree(dres_x));
}

static void check_case(const Case* k) {
    int blocks[4] = {32, 100, 256, 1024};  // one thread per value: any block size, 100 included
    for (int bi = 0; bi < 4; bi++) {
        check_prefix(k, blocks[bi]);
        check_suffix(k, blocks[bi]);
        // the image rows out of the prefix's tokens (here the patch outputs as a (B, Np, d) tensor)
        char shape[120];
        snprintf(shape, sizeof(shape), "(B %d, NI %d, Np %d, d %d) block %d", k->B, k->NI, k->Np, k->d, blocks[bi]);
        size_t n_x = (size_t)k->B * k->Np * k->d;
        float* src = random_floats(n_x, 1.0f, 777);
        floatX* d_src = to_device_x(src, n_x);
        check_gather("prefix images", shape, blocks[bi], d_src, src, k->B, k->Np, 0, k->NI, k->d);
        free(src);
        cudaCheck(cudaFree(d_src));
    }
}

// median time of fn and the bandwidth of `bytes` in it
template <typename F>
static void bench(const char* name, double bytes, F fn) {
    double ms = time_ms(fn, 20);
    printf("bench v1 %-22s %8.4f ms, %7.1f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void benchmark(void) {
    // the base preset, batch 16: 2 cameras of 224x224 in 16x16 patches (392 image tokens), 48
    // text tokens, d 960; chunk 50, d_expert 720
    const int B = 16, n_cam = 2, img = 224, p = 16, T = 48, d = 960, H = 50, da = 720;
    Case k = make_case(B, n_cam, img, p, T, d, H, da, 7);
    int NI = k.NI, Np = k.Np, Ns = k.Ns;
    size_t n_patch = (size_t)k.n_img * img * img * 3, n_x = (size_t)B * Np * d, n_s = (size_t)B * Ns * da;
    size_t X = sizeof(floatX);
    floatX *patches, *x, *sx, *gathered, *dres_x;
    float *valid, *dpos, *dtext, *dres;
    cudaCheck(cudaMalloc(&patches, n_patch * X));
    cudaCheck(cudaMalloc(&x, n_x * X));
    cudaCheck(cudaMalloc(&valid, (size_t)B * Np * sizeof(float)));
    cudaCheck(cudaMalloc(&dpos, (size_t)NI * d * sizeof(float)));
    cudaCheck(cudaMalloc(&dtext, (size_t)256 * d * sizeof(float)));
    cudaCheck(cudaMalloc(&sx, n_s * X));
    cudaCheck(cudaMalloc(&gathered, (size_t)B * NI * d * X));
    cudaCheck(cudaMalloc(&dres, n_s * sizeof(float)));
    cudaCheck(cudaMalloc(&dres_x, n_s * X));
    cudaCheck(cudaMemset(dpos, 0, (size_t)NI * d * sizeof(float)));
    cudaCheck(cudaMemset(dtext, 0, (size_t)256 * d * sizeof(float)));
    const int bl = BLOCK;
    // bytes each kernel asks for (cache hits included), reads plus writes
    bench("patchify", (double)n_patch * (1 + X), [&]() {
        patchify_kernel<<<ceil_div(n_patch, bl), bl, 0, main_stream>>>(patches, k.d_images, k.n_img, img, p);
        launchCheck();
    });
    bench("prefix_embed", (double)B * NI * d * 3 * X + (double)B * T * d * 2 * X + (double)B * Np * 4, [&]() {
        prefix_embed_kernel<<<ceil_div(n_x, bl), bl, 0, main_stream>>>(x, valid, k.d_patch_out, k.d_pos_emb, k.d_text_emb, k.d_tokens, k.d_text_mask, B, NI, T, d);
        launchCheck();
    });
    bench("pos_emb_backward", (double)B * NI * d * 4 + 2.0 * NI * d * 4, [&]() {
        pos_emb_backward_kernel<<<ceil_div((size_t)NI * d, bl), bl, 0, main_stream>>>(dpos, k.d_dx, B, NI, Np, d);
        launchCheck();
    });
    bench("text_emb_backward", (double)B * T * d * 4 + 2.0 * 256 * d * 4, [&]() {
        text_emb_backward_kernel<<<256, bl, 0, main_stream>>>(dtext, k.d_dx, k.d_tokens, B, NI, T, d);
        launchCheck();
    });
    bench("gather_rows (images)", 2.0 * B * NI * d * X, [&]() {
        gather_rows_kernel<<<ceil_div((size_t)B * NI * d, bl), bl, 0, main_stream>>>(gathered, x, B, Np, 0, NI, d);
        launchCheck();
    });
    bench("suffix_embed", 2.0 * n_s * X, [&]() {
        suffix_embed_kernel<<<ceil_div(n_s, bl), bl, 0, main_stream>>>(sx, k.d_state_tok, k.d_act_tok, B, H, da);
        launchCheck();
    });
    bench("scatter_action_grad", (double)B * H * da * 4 + (double)n_s * (4 + X), [&]() {
        scatter_action_grad_kernel<<<ceil_div(n_s, bl), bl, 0, main_stream>>>(dres, dres_x, k.d_dfin, B, H, da);
        launchCheck();
    });
    cudaCheck(cudaFree(patches)); cudaCheck(cudaFree(x)); cudaCheck(cudaFree(valid)); cudaCheck(cudaFree(dpos));
    cudaCheck(cudaFree(dtext)); cudaCheck(cudaFree(sx)); cudaCheck(cudaFree(gathered)); cudaCheck(cudaFree(dres));
    cudaCheck(cudaFree(dres_x));
    free_case(&k);
}

int main(void) {
    dev_init("embeddings");
    // one and two cameras; grids of 2, 4, 6 patches a side; patch sides 4, 8, 14; text with pads
    // in every sample; value counts that fill no block exactly
    struct { int B, n_cam, img, p, T, d, H, da; } shapes[] = {
        {1, 1, 16, 8, 6, 24, 3, 20}, {2, 2, 32, 8, 16, 48, 8, 32}, {3, 2, 24, 4, 11, 20, 5, 12}, {2, 1, 28, 14, 5, 40, 4, 36},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        Case k = make_case(shapes[i].B, shapes[i].n_cam, shapes[i].img, shapes[i].p, shapes[i].T, shapes[i].d, shapes[i].H,
                           shapes[i].da, 100 + 20 * i);
        check_case(&k);
        free_case(&k);
    }
    return dev_finish(benchmark);
}
