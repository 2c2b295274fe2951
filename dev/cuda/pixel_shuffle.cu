/*
pixel_shuffle.cu: the connector's pixel shuffle (SmolVLM, scale factor s): every s x s square of
the vision tower's h x w patch grid becomes one token of s*s times the width, before the
connector's Linear(C s^2 -> d). (N, h*w, C) -> (N, (h/s)*(w/s), C*s*s); the backward is the
inverse permutation. Both are pure copies: the checks want the same bits.

  transformers' FlowVLMConnector.pixel_shuffle does, with height = width = sqrt(h*w):
    view (N, h, w, C) -> view (N, h, w/s, C s) -> permute(0, 2, 1, 3)
    -> reshape (N, w/s, h/s, C s^2) -> permute(0, 2, 1, 3) -> reshape (N, (h/s)(w/s), C s^2)
  Following one value through it: the second view packs the s patches j2 s + b (b < s) of a
  grid row side by side, so channel k = b C + e; after the first transpose the grid rows i of
  one column group j2 are consecutive, and the reshape packs the s rows i2 s + a (a < s) side by
  side, so channel a s C + k; the second transpose puts the row groups i2 back in front. Hence

    out[n][i2 (w/s) + j2][(a s + b) C + e] = x[n][(i2 s + a) w + (j2 s + b)][e]

  for i2 < h/s, j2 < w/s, a, b < s, e < C: the output channels are grouped by the patch's row
  offset a first, then its column offset b, each group the patch's C channels in order. (The
  model's grid is square; the same chain with height and width kept apart gives the formula
  above for h != w, which the checks also cover.)

  version 1  one thread per value of the written tensor, gathering its source through the
             header's pixel_shuffle_source (pixel_shuffle_forward_kernel1,
             pixel_shuffle_backward_kernel1, here)
  version 2  x128::size consecutive channels per thread, 128-bit loads and stores: runs of C
             channels stay together in both layouts (pixel_shuffle_forward_kernel2,
             pixel_shuffle_backward_kernel2 of vla/cuda/pixel_shuffle.cuh; C a multiple of
             x128::size, 16-byte aligned pointers): the trainer's, launched by the header's
             pixel_shuffle_forward / _backward

  nvcc -O3 -std=c++17 -arch=sm_90 pixel_shuffle.cu -o pixel_shuffle && ./pixel_shuffle
*/
#include "common.h"
#include "../../vla/cuda/pixel_shuffle.cuh"

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

// ----------------------------------------------------------------------------
// kernels: version 2 is the header's (pixel_shuffle_source too); version 1 one thread per value

// out (N, (h/s)(w/s), C s^2) from x (N, h*w, C). One thread per value of out.
__global__ void pixel_shuffle_forward_kernel1(floatX* out, const floatX* inp, int N, int h, int w, int C, int s) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t Cs = (size_t)C * s * s, tokens = (size_t)(h / s) * (w / s);
    if (idx >= N * tokens * Cs) { return; }
    int m = (int)(idx % Cs);
    size_t row = idx / Cs;
    out[idx] = inp[pixel_shuffle_source(row / tokens, (int)(row % tokens), m, h, w, C, s)];
}

// dinp (N, h*w, C) overwritten from dout (N, (h/s)(w/s), C s^2): the inverse permutation. One
// thread per value of dinp.
__global__ void pixel_shuffle_backward_kernel1(floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * h * w * C) { return; }
    int e = (int)(idx % C);
    size_t p = idx / C;
    int j = (int)(p % w), i = (int)(p / w % h);
    size_t n = p / ((size_t)w * h);
    size_t t = n * (h / s) * (w / s) + (size_t)(i / s) * (w / s) + j / s;
    dinp[idx] = dout[t * C * s * s + (size_t)((i % s) * s + j % s) * C + e];
}

// a launcher per version with its block size (version 0, the header's pixel_shuffle_forward and
// pixel_shuffle_backward, runs version 2 at BLOCK)

static void pixel_shuffle_forward1(floatX* out, const floatX* inp, int N, int h, int w, int C, int s, int block) {
    size_t n = (size_t)N * h * w * C;
    pixel_shuffle_forward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(out, inp, N, h, w, C, s);
    launchCheck();
}

static void pixel_shuffle_forward2(floatX* out, const floatX* inp, int N, int h, int w, int C, int s, int block) {
    size_t n = (size_t)N * h * w * C;
    pixel_shuffle_forward_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(out, inp, N, h, w, C, s);
    launchCheck();
}

static void pixel_shuffle_backward1(floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s, int block) {
    size_t n = (size_t)N * h * w * C;
    pixel_shuffle_backward_kernel1<<<ceil_div(n, block), block, 0, main_stream>>>(dinp, dout, N, h, w, C, s);
    launchCheck();
}

static void pixel_shuffle_backward2(floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s, int block) {
    size_t n = (size_t)N * h * w * C;
    int grid = ceil_div(n / x128::size, block);
    pixel_shuffle_backward_kernel2<<<grid, block, 0, main_stream>>>(dinp, dout, N, h, w, C, s);
    launchCheck();
}

// ----------------------------------------------------------------------------
// references: transformers' view/permute chain step by step, not the formula the kernels use.
// A view or reshape of a contiguous tensor moves nothing; each permute(0, 2, 1, 3) is one
// materialized swap of the middle two axes.

// out (N, B, A, D)[n][b][a][d] = in (N, A, B, D)[n][a][b][d]
static void swap_middle_axes(float* out, const float* in, int N, int A, int B, int D) {
    for (int n = 0; n < N; n++) {
        for (int a = 0; a < A; a++) {
            for (int b = 0; b < B; b++) {
                for (int d = 0; d < D; d++) {
                    out[(((size_t)n * B + b) * A + a) * D + d] = in[(((size_t)n * A + a) * B + b) * D + d];
                }
            }
        }
    }
}

static void pixel_shuffle_forward_reference(float* out, const float* x, int N, int h, int w, int C, int s) {
    float* tmp = (float*)mallocCheck((size_t)N * h * w * C * sizeof(float));
    swap_middle_axes(tmp, x, N, h, w / s, C * s);                // (N, h, w/s, Cs) -> (N, w/s, h, Cs)
    swap_middle_axes(out, tmp, N, w / s, h / s, C * s * s);      // (N, w/s, h/s, Cs^2) -> (N, h/s, w/s, Cs^2)
    free(tmp);
}

// the two swaps undone in reverse order
static void pixel_shuffle_backward_reference(float* dx, const float* dout, int N, int h, int w, int C, int s) {
    float* tmp = (float*)mallocCheck((size_t)N * h * w * C * sizeof(float));
    swap_middle_axes(tmp, dout, N, h / s, w / s, C * s * s);     // (N, h/s, w/s, Cs^2) -> (N, w/s, h/s, Cs^2)
    swap_middle_axes(dx, tmp, N, w / s, h, C * s);               // (N, w/s, h, Cs) -> (N, h, w/s, Cs)
    free(tmp);
}

// The reference on a tensor whose values are their own indices, against the formula of the
// opening comment written out as loops: the chain and the formula agree (transformers' code was run once
// on such a tensor and gave the formula too)
static void check_reference_formula(int N, int h, int w, int C, int s) {
    size_t n = (size_t)N * h * w * C;
    float* x = (float*)mallocCheck(n * sizeof(float));
    float* got = (float*)mallocCheck(n * sizeof(float));
    float* want = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (float)i; }  // exact below 2^24
    pixel_shuffle_forward_reference(got, x, N, h, w, C, s);
    int hs = h / s, ws = w / s;
    for (int b0 = 0; b0 < N; b0++) {
        for (int i2 = 0; i2 < hs; i2++) {
            for (int j2 = 0; j2 < ws; j2++) {
                for (int a = 0; a < s; a++) {
                    for (int b = 0; b < s; b++) {
                        for (int e = 0; e < C; e++) {
                            size_t o = (((size_t)b0 * hs + i2) * ws + j2) * C * s * s + (size_t)(a * s + b) * C + e;
                            want[o] = x[(((size_t)b0 * h + i2 * s + a) * w + j2 * s + b) * C + e];
                        }
                    }
                }
            }
        }
    }
    char what[160];
    snprintf(what, sizeof(what), "reference chain = the opening comment's formula (N %d, %d x %d, C %d, s %d)", N, h, w,
             C, s);
    check_exact(what, got, want, n);
    pixel_shuffle_backward_reference(want, got, N, h, w, C, s);
    snprintf(what, sizeof(what), "reference backward undoes the forward (N %d, %d x %d, C %d, s %d)", N, h, w, C, s);
    check_exact(what, want, x, n);
    free(x); free(got); free(want);
}

// ----------------------------------------------------------------------------
// checks

static void run_forward(int version, int block, floatX* out, const floatX* inp, int N, int h, int w, int C, int s) {
    if (version == 0) {
        pixel_shuffle_forward(out, inp, N, h, w, C, s);
    } else if (version == 1) {
        pixel_shuffle_forward1(out, inp, N, h, w, C, s, block);
    } else {
        pixel_shuffle_forward2(out, inp, N, h, w, C, s, block);
    }
}

static void run_backward(int version, int block, floatX* dinp, const floatX* dout, int N, int h, int w, int C, int s) {
    if (version == 0) {
        pixel_shuffle_backward(dinp, dout, N, h, w, C, s);
    } else if (version == 1) {
        pixel_shuffle_backward1(dinp, dout, N, h, w, C, s, block);
    } else {
        pixel_shuffle_backward2(dinp, dout, N, h, w, C, s, block);
    }
}

static void check_shape(int N, int h, int w, int C, int s, uint64_t seed) {
    size_t n = (size_t)N * h * w * C;
    float* x = random_floats(n, 2.0f, seed);
    float* dout = random_floats(n, 1.0f, seed + 1);
    floatX* d_x = to_device_x(x, n);  // rounds x and dout to floatX: a copy must give those bits back
    floatX* d_dout = to_device_x(dout, n);
    float* want = (float*)mallocCheck(n * sizeof(float));
    float* want_dx = (float*)mallocCheck(n * sizeof(float));
    pixel_shuffle_forward_reference(want, x, N, h, w, C, s);
    pixel_shuffle_backward_reference(want_dx, dout, N, h, w, C, s);
    floatX *out, *dinp;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dinp, n * sizeof(floatX)));
    int v2 = C % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version != 1 && !v2) { continue; }  // the header's launcher runs version 2
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            char what[120], item[160];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher (N %d, %d x %d, C %d, s %d)", N, h, w, C, s);
            } else {
                snprintf(what, sizeof(what), "v%d (N %d, %d x %d, C %d, s %d) block %d", version, N, h, w, C, s,
                         BLOCKS[bi]);
            }
            // a permutation moves values without arithmetic: the same bits, no tolerance
            poison(out, n * sizeof(floatX));
            run_forward(version, BLOCKS[bi], out, d_x, N, h, w, C, s);
            float* got = from_device_x(out, n);
            snprintf(item, sizeof(item), "%s forward", what);
            check_exact(item, got, want, n);
            free(got);

            poison(dinp, n * sizeof(floatX));
            run_backward(version, BLOCKS[bi], dinp, d_dout, N, h, w, C, s);
            float* got_dx = from_device_x(dinp, n);
            snprintf(item, sizeof(item), "%s backward", what);
            check_exact(item, got_dx, want_dx, n);
            free(got_dx);
        }
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dinp)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_dout));
    free(x); free(dout); free(want); free(want_dx);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla shapes: 32 samples x 2 cameras, a 32 x 32 grid of SigLIP's 768-wide
// patches each, scale factor 4 (8 x 8 tokens of 12288)

static void benchmark(void) {
    const int N = 64, g = 32, C = 768, s = 4;
    size_t n = (size_t)N * g * g * C;
    float* h = random_floats(n, 1.0f, 7);
    floatX* x = to_device_x(h, n);
    floatX* out;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_forward(version, block, out, x, N, g, g, C, s); }, 20);
            printf("bench v%d forward  (N %d, %d x %d, C %d, s %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, g, g,
                   C, s, block, ms, 2.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // read once, written once
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_backward(version, block, out, x, N, g, g, C, s); }, 20);
            printf("bench v%d backward (N %d, %d x %d, C %d, s %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, N, g, g,
                   C, s, block, ms, 2.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);
        }
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(out));
    free(h);
}

int main(void) {
    dev_init("pixel_shuffle");
    check_reference_formula(2, 8, 8, 5, 4);
    check_reference_formula(1, 4, 6, 3, 2);
    // the model's scale factor 4 on small grids; 2 and 3; 1 (the identity); a non-square grid;
    // widths that are a multiple of x128::size in both precisions (8, 24, 64), in fp32 only (12),
    // in neither (5, 7); the model's width on its 32 x 32 grid for one image
    struct { int N, h, w, C, s; } shapes[] = {
        {2, 8, 8, 8, 4}, {3, 8, 8, 12, 4}, {1, 6, 6, 5, 3}, {2, 4, 4, 24, 2}, {2, 3, 3, 7, 1},
        {2, 4, 8, 16, 2}, {1, 16, 16, 64, 4}, {1, 32, 32, 768, 4},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_shape(shapes[i].N, shapes[i].h, shapes[i].w, shapes[i].C, shapes[i].s, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
