/*
vla/cuda/embedding.cuh: the embeddings around the transformers: the vision position embedding (added,
and its gradient), the prefix (image tokens, language tokens, state) with its attention blocks and
RoPE positions, the suffix's action-time embedding, and the token table's and image tokens' gradients.
*/
#ifndef VLA_CUDA_EMBEDDING_CUH
#define VLA_CUDA_EMBEDDING_CUH

#include "common.cuh"

// a_emb (R, 2da) = [a_in (R, da), sin/cos time embedding (da)], periods geometric 4e-3..4.0, in double
__global__ void action_embed_kernel(floatX* a_emb, const floatX* a_in, const float* t, int B, int H, int da) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * H * 2 * da) { return; }
    int col = (int)(idx % (2 * da));
    size_t row = idx / (2 * da);
    if (col < da) {
        a_emb[idx] = a_in[row * da + col];
        return;
    }
    int half = da / 2, k = (col - da) % half;
    double fraction = half > 1 ? (double)k / (double)(half - 1) : 0.0;
    double period = 4e-3 * pow(4.0 / 4e-3, fraction);
    double angle = 2.0 * 3.141592653589793 * (double)t[row / H] / period;
    a_emb[idx] = fx((float)(col - da < half ? sin(angle) : cos(angle)));
}

// dpos (NI, d) += the image rows of dx (B, Np, d), summed over samples in order
__global__ void pos_emb_backward_kernel(float* dpos, const float* dx, int B, int NI, int Np, int d) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)NI * d) { return; }
    float s = 0.0f;
    for (int b = 0; b < B; b++) { s += dx[(size_t)b * Np * d + idx]; }
    dpos[idx] += s;
}

// x (n) += table[i % period]: the vision position embedding added to every image's patches
__global__ void add_periodic_kernel(floatX* x, const floatX* table, size_t n, size_t period) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] = fx(f32(x[i]) + f32(table[i % period])); }
}

// The mask and RoPE positions, as embed_prefix / embed_suffix flag the tokens of the sequence
// [images | language | state | actions] (the state is the prefix's last token or the suffix's first:
// Np, H = the suffix's tokens). block (B, Np + H): make_att_2d_masks' cumsum, -1 for a pad; pos =
// cumsum(valid) - 1; x_pos (B, H): the cross layers'.
__global__ void flow_sequence_kernel(int* block, int* pos, int* x_pos, const float* token_mask, int B, int NI, int T,
                                     int Np, int H, int causal) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) { return; }
    int n = Np + H, cum = 0, n_valid = 0;
    for (int j = 0; j < n; j++) {
        int valid = j < NI || j >= NI + T || token_mask[(size_t)b * T + (j - NI)] != 0.0f;
        // the state and every action start a block (causal actions), or the state and the first action
        cum += j >= NI + T && (causal || j <= NI + T + 1);
        n_valid += valid;
        block[(size_t)b * n + j] = valid ? cum : -1;
        pos[(size_t)b * n + j] = n_valid - 1;
    }
    int lowest = pos[(size_t)b * n + Np];
    for (int j = 1; j < H; j++) { lowest = min(lowest, pos[(size_t)b * n + Np + j]); }
    for (int j = 0; j < H; j++) { x_pos[(size_t)b * H + j] = pos[(size_t)b * n + Np + j] - lowest; }
}

// The prefix x (B, Np, C): per sample each camera's NI image tokens (image cam * B + b) times
// img_scale, the language rows times sqrt(C), then (SmolVLA: Np = the images, T and 1) state_tok
// (B, C). Token ids are checked by the data path.
__global__ void flow_prefix_embed_kernel(floatX* x, const floatX* img_tok, const floatX* embed, const int32_t* tokens,
                                         const floatX* state_tok, int B, int n_cam, int NI, int T, int Np, int C,
                                         float scale, float img_scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int n_img = n_cam * NI;
    if (idx >= (size_t)B * Np * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % Np), b = (int)(idx / ((size_t)C * Np));
    float v;
    if (i < n_img) {
        v = f32(img_tok[(((size_t)(i / NI) * B + b) * NI + i % NI) * C + k]) * img_scale;
    } else if (i < n_img + T) {
        v = f32(embed[(size_t)tokens[(size_t)b * T + (i - n_img)] * C + k]) * scale;
    } else {
        v = f32(state_tok[(size_t)b * C + k]);
    }
    x[idx] = fx(v);
}

// dtable (vocab, C) += scale * the language rows of dx (B, Np, C) by token id, none for the pad id.
// Block p works only at its id's first position, summing that id's rows in order: no atomics.
__global__ void embed_tokens_backward_kernel(float* dtable, const float* dx, const int32_t* tokens, int B, int first,
                                             int T, int Np, int C, int pad, float scale) {
    int p = blockIdx.x, tok = tokens[p];
    if (tok == pad) { return; }
    for (int q = 0; q < p; q++) {
        if (tokens[q] == tok) { return; }  // the same for the whole block
    }
    for (int k = threadIdx.x; k < C; k += blockDim.x) {
        float s = 0.0f;
        for (int q = p; q < B * T; q++) {
            if (tokens[q] == tok) { s += dx[((size_t)(q / T) * Np + first + q % T) * C + k]; }
        }
        dtable[(size_t)tok * C + k] += scale * s;
    }
}

// dimg (n_cam * B * NI, C) floatX, camera-major = scale * the image rows of dx (B, Np, C) fp32
__global__ void prefix_image_grad_kernel(floatX* dimg, const float* dx, int B, int n_cam, int NI, int Np, int C,
                                         float scale) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)n_cam * B * NI * C) { return; }
    int k = (int)(idx % C), i = (int)(idx / C % NI);
    size_t img = idx / ((size_t)C * NI);
    int b = (int)(img % B), cam = (int)(img / B);
    dimg[idx] = fx(scale * dx[((size_t)b * Np + (size_t)cam * NI + i) * C + k]);
}

#endif  // VLA_CUDA_EMBEDDING_CUH
