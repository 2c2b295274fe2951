/*
patchify.cu: SigLIP's patch embedding as a gather and a Linear. SigLIP embeds an image with a
Conv2d(3, Cv, kernel p, stride p, no padding) and flattens its output grid row-major into tokens;
a stride-p convolution is a Linear over each p x p patch, flattened the way the conv weight
(Cv, 3, p, p) is: channel, then row, then column. So the trainer gathers

  patches (n_img * g*g, 3*p*p) from images (n_img, 3, S, S), g = S / p (floored, as the conv's
  output size (S - p) / p + 1 is: pixels past the last whole patch are never read)

and hands them to the Linear with the conv weight as it is stored (matmul_forward, weight
(Cv, 3*p*p)). Nothing flows back into the pixels, so there is no backward.

  version 1  (this program's) one thread per patch, looping over its 3 p^2 values: a warp's lanes
             write 3 p^2 values apart (patchify_kernel1)
  version 2  one thread per value written, gathering its pixel: consecutive threads write
             consecutive values (the header's patchify_chw_kernel, which the trainer launches with
             LAUNCH_1D)

This program checks the gather against the layout above, and gather + the Linear (vla/cuda/matmul.cuh's
matmul_forward) against the convolution computed from its definition, so a layout that only agrees
with itself cannot pass.

  nvcc -O3 -std=c++17 -arch=sm_90 patchify.cu -lcublasLt -o patchify && ./patchify
*/
#include "common.h"
#include "../../vla/cuda/patchify.cuh"
#include "../../vla/cuda/matmul.cuh"

// The gather copies floatX values: exact, 0. The Linear's output is floatX from fp32 sums of
// 3 p^2 products: 1e-5 in fp32 builds, 1e-2 in bf16 (8 significant bits, 3.9e-3 per value).
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const int BLOCKS[] = {32, 100, 256, 1024};  // one thread per value: any block size, 100 included
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int N_VERSIONS = 2;

// ----------------------------------------------------------------------------
// version 1: one thread per patch

// images (n_img, 3, S, S) -> patches (n_img * g*g, 3*p*p) in conv-weight order, g = S / p
__global__ void patchify_kernel1(floatX* patches, const floatX* images, int n_img, int S, int p) {
    size_t patch = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int g = S / p, PD = 3 * p * p;
    if (patch >= (size_t)n_img * g * g) { return; }
    int gx = (int)(patch % g), gy = (int)(patch / g % g);
    size_t img = patch / ((size_t)g * g);
    floatX* out = patches + patch * PD;
    for (int ch = 0; ch < 3; ch++) {
        const floatX* plane = images + (img * 3 + ch) * S * S + (size_t)gy * p * S + (size_t)gx * p;
        for (int ky = 0; ky < p; ky++) {
            for (int kx = 0; kx < p; kx++) { *out++ = plane[(size_t)ky * S + kx]; }
        }
    }
}

// ----------------------------------------------------------------------------
// references, in double

// patches in token order (image, grid row, grid column), each patch's values in conv-weight order
static void patchify_reference(double* patches, const float* images, int n_img, int S, int p) {
    int g = S / p;
    size_t at = 0;
    for (int img = 0; img < n_img; img++) {
        for (int gy = 0; gy < g; gy++) {
            for (int gx = 0; gx < g; gx++) {
                for (int ch = 0; ch < 3; ch++) {
                    for (int ky = 0; ky < p; ky++) {
                        for (int kx = 0; kx < p; kx++) {
                            int y = gy * p + ky, x = gx * p + kx;
                            patches[at++] = images[(((size_t)img * 3 + ch) * S + y) * S + x];
                        }
                    }
                }
            }
        }
    }
}

// SigLIP's patch embedding from torch's Conv2d definition, out channel o at output pixel (oy, ox):
// b[o] + sum over (ch, ky, kx) of w[o, ch, ky, kx] in[ch, oy*p + ky, ox*p + kx]; then
// flatten(2).transpose(1, 2): token oy * g + ox, channel o. out (n_img * g*g, Cv).
static void patch_embedding_reference(double* out, const float* images, const float* w, const float* b, int n_img,
                                      int S, int p, int Cv) {
    int g = (S - p) / p + 1;  // Conv2d's output size, no padding, no dilation
    for (int img = 0; img < n_img; img++) {
        for (int o = 0; o < Cv; o++) {
            for (int oy = 0; oy < g; oy++) {
                for (int ox = 0; ox < g; ox++) {
                    double s = b[o];
                    for (int ch = 0; ch < 3; ch++) {
                        for (int ky = 0; ky < p; ky++) {
                            for (int kx = 0; kx < p; kx++) {
                                double wv = w[(((size_t)o * 3 + ch) * p + ky) * p + kx];
                                s += wv * images[(((size_t)img * 3 + ch) * S + oy * p + ky) * S + ox * p + kx];
                            }
                        }
                    }
                    out[(((size_t)img * g + oy) * g + ox) * Cv + o] = s;
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------
// checks

// version v at `block` threads a block (version 2 at BLOCK is the trainer's launch)
static void run_patchify(int version, int block, floatX* patches, const floatX* images, int n_img, int S, int p) {
    int g = S / p;
    size_t n_patch = (size_t)n_img * g * g, n = n_patch * 3 * p * p;
    if (version == 1) {
        patchify_kernel1<<<ceil_div(n_patch, block), block, 0, main_stream>>>(patches, images, n_img, S, p);
    } else {
        patchify_chw_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(patches, images, n_img, S, p);
    }
    launchCheck();
}

static void check_shape(int n_img, int S, int p, int Cv, uint64_t seed) {
    int g = S / p, PD = 3 * p * p, V = n_img * g * g;
    size_t n_pix = (size_t)n_img * 3 * S * S, n = (size_t)V * PD, n_out = (size_t)V * Cv;
    float* images = random_floats(n_pix, 1.0f, seed);  // x * 2 - 1 of pixels in [0, 1]
    float* w = random_floats((size_t)Cv * PD, 0.2f, seed + 1);
    float* b = random_floats(Cv, 0.5f, seed + 2);
    floatX* d_images = to_device_x(images, n_pix);
    floatX* d_w = to_device_x(w, (size_t)Cv * PD);
    floatX* d_b = to_device_x(b, Cv);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_out = (double*)mallocCheck(n_out * sizeof(double));
    patchify_reference(ref, images, n_img, S, p);
    patch_embedding_reference(ref_out, images, w, b, n_img, S, p, Cv);
    floatX *patches, *out;
    cudaCheck(cudaMalloc(&patches, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    char what[200];
    for (int version = 1; version <= N_VERSIONS; version++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            poison(patches, n * sizeof(floatX));
            run_patchify(version, BLOCKS[bi], patches, d_images, n_img, S, p);
            float* got = from_device_x(patches, n);
            snprintf(what, sizeof(what), "v%d patchify (%d images 3 x %d x %d, p %d) block %d", version, n_img, S, S, p,
                     BLOCKS[bi]);
            check_close(what, got, ref, n, 0.0);
            free(got);
        }
        // the patches of the last block size through the Linear, against the convolution
        poison(out, n_out * sizeof(floatX));
        matmul_forward(out, patches, d_w, d_b, NULL, V, PD, Cv);
        float* got = from_device_x(out, n_out);
        snprintf(what, sizeof(what), "v%d patchify + Linear = Conv2d stride %d (%d images 3 x %d x %d -> %d x %d x %d)",
                 version, p, n_img, S, S, g, g, Cv);
        check_close(what, got, ref_out, n_out, TOL_X);
        free(got);
    }
    cudaCheck(cudaFree(patches)); cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(d_images)); cudaCheck(cudaFree(d_w)); cudaCheck(cudaFree(d_b));
    free(images); free(w); free(b); free(ref); free(ref_out);
}

// ----------------------------------------------------------------------------
// benchmark at the presets' shapes: smolvla's 32 samples of 2 cameras, 512 x 512 in 16 x 16 patches,
// 768 wide; pi0's, 224 x 224 in 14 x 14, 1152 wide. The gather at each block size, then the patch
// embedding whole: the gather (version 2 at BLOCK) and the Linear.

static void bench_shape(const char* preset, int n_img, int S, int p, int Cv) {
    int g = S / p, PD = 3 * p * p, V = n_img * g * g;
    size_t n = (size_t)n_img * 3 * S * S;  // every pixel is read once and written once (p divides S)
    floatX *images, *patches, *w, *out;
    cudaCheck(cudaMalloc(&images, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&patches, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&w, (size_t)Cv * PD * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out, (size_t)V * Cv * sizeof(floatX)));
    cudaCheck(cudaMemset(images, 0, n * sizeof(floatX)));
    cudaCheck(cudaMemset(w, 0, (size_t)Cv * PD * sizeof(floatX)));
    for (int version = 1; version <= N_VERSIONS; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_patchify(version, block, patches, images, n_img, S, p); }, 20);
            printf("bench v%d patchify %-7s (%d images 3 x %d x %d -> %d x %d patches of %d) block %4d: %7.3f ms, "
                   "%7.1f GB/s\n", version, preset, n_img, S, S, g, g, PD, block, ms,
                   2.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);
        }
    }
    double ms = time_ms([&]() {
        run_patchify(2, BLOCK, patches, images, n_img, S, p);
        matmul_forward(out, patches, w, NULL, NULL, V, PD, Cv);
    }, 20);
    printf("bench v2 patch embedding %-7s (N %d, C %d, OC %d), gather + Linear: %7.3f ms, %7.1f TFLOP/s\n", preset, V,
           PD, Cv, ms, 2.0 * V * PD * Cv / (ms * 1e-3) / 1e12);
    cudaCheck(cudaFree(images)); cudaCheck(cudaFree(patches)); cudaCheck(cudaFree(w)); cudaCheck(cudaFree(out));
}

static void benchmark(void) {
    bench_shape("smolvla", 64, 512, 16, 768);
    bench_shape("pi0", 64, 224, 14, 1152);
}

int main(void) {
    dev_init("patchify");
    matmul_init();
    // one patch; a 3 x 3 grid; the tiny preset's image (32 px, p 8); p 1 (every pixel a patch); a
    // size the patch does not divide (10 = 3 * 3 + 1: the conv never reads the last row and column)
    struct { int n_img, S, p, Cv; } shapes[] = {{1, 4, 4, 6}, {3, 12, 4, 20}, {2, 32, 8, 32}, {2, 5, 1, 7},
                                                {2, 10, 3, 9}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_shape(shapes[i].n_img, shapes[i].S, shapes[i].p, shapes[i].Cv, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
