/*
rope.cu: rotary position embedding (rotate-half) of q and k, forward and backward.
  Row i of sample b sits at position pos = pos0 + i (pos0 = 0 in the prefix pass, Np in the
  suffix pass). Each head pairs channel k < HS/2 with k + HS/2 and rotates the pair by
  pos theta^(-2k/HS), theta = 10000: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). The
  backward is the rotation by minus the angle (the transpose), sign -1. The input is floatX
  (forward of q and k, backward of q, usually in place) or fp32 (backward of k, whose gradient
  is accumulated in fp32); the output is floatX.

  version 1  one thread per (row, head, pair), scalar loads (rope_kernel<Tin>, Tin float or floatX)
  version 2  x128::size consecutive pairs per thread, 128-bit loads and stores (rope_kernel2;
             floatX input, HS/2 a multiple of x128::size)

  make -C dev/cuda rope && dev/cuda/rope
*/
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value),
// twice over for a forward-then-backward round trip; in fp32 builds only fp32 arithmetic and the
// fp32 cos/sin tables (6e-8 relative) separate the kernel from the reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int THETA = 10000;  // VLAConfig's rope_theta in every preset

typedef struct {
    int B, Tg, pos0, NH, HS;
    float* cos_t;  // (pos0 + Tg, HS/2) device tables, as model_build makes them
    float* sin_t;
} Case;

static Case make_case(int B, int Tg, int pos0, int NH, int HS) {
    Case k = {B, Tg, pos0, NH, HS, NULL, NULL};
    int T = pos0 + Tg, half = HS / 2;
    float* cs = (float*)mallocCheck((size_t)T * half * sizeof(float));
    float* sn = (float*)mallocCheck((size_t)T * half * sizeof(float));
    for (int pos = 0; pos < T; pos++) {
        for (int j = 0; j < half; j++) {
            double angle = pos * pow((double)THETA, -2.0 * j / (double)HS);
            cs[pos * half + j] = (float)cos(angle);
            sn[pos * half + j] = (float)sin(angle);
        }
    }
    k.cos_t = to_device_f(cs, (size_t)T * half);
    k.sin_t = to_device_f(sn, (size_t)T * half);
    free(cs); free(sn);
    return k;
}

static void free_case(Case* k) {
    cudaCheck(cudaFree(k->cos_t));
    cudaCheck(cudaFree(k->sin_t));
}

static size_t case_numel(const Case* k) { return (size_t)k->B * k->Tg * k->NH * k->HS; }

// the reference, in double, with the angles computed exactly (not from the fp32 tables)
static void rope_reference(double* out, const float* x, const Case* k, int sign) {
    int half = k->HS / 2, D = k->NH * k->HS;
    for (int row = 0; row < k->B * k->Tg; row++) {
        int pos = k->pos0 + row % k->Tg;
        for (int h = 0; h < k->NH; h++) {
            for (int j = 0; j < half; j++) {
                double angle = pos * pow((double)THETA, -2.0 * j / (double)k->HS);
                double c = cos(angle), s = sign * sin(angle);
                size_t at = (size_t)row * D + (size_t)h * k->HS + j;
                double x1 = x[at], x2 = x[at + half];
                out[at] = x1 * c - x2 * s;
                out[at + half] = x2 * c + x1 * s;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// the versions, launched directly (block 0: the launcher train_vla.cu calls)

template <typename Tin>
static void run_v1(int block, floatX* out, const Tin* in, const Case* k, float sign) {
    if (block == 0) {
        rope(out, in, k->cos_t, k->sin_t, k->B, k->Tg, k->pos0, k->NH, k->HS, sign);
        return;
    }
    size_t n = (size_t)k->B * k->Tg * k->NH * (k->HS / 2);
    rope_kernel<Tin><<<ceil_div(n, block), block, 0, main_stream>>>(out, in, k->cos_t, k->sin_t, k->B * k->Tg, k->Tg,
                                                                     k->pos0, k->NH, k->HS, sign);
    launchCheck();
}

static void run_v2(int block, floatX* out, const floatX* in, const Case* k, float sign) {
    size_t n = (size_t)k->B * k->Tg * k->NH * (k->HS / 2) / x128::size;
    rope_kernel2<<<ceil_div(n, block), block, 0, main_stream>>>(out, in, k->cos_t, k->sin_t, k->B * k->Tg, k->Tg,
                                                                k->pos0, k->NH, k->HS, sign);
    launchCheck();
}

// version 1 or 2 from floatX input; in place (out holds the input) or into a poisoned out
static void run_x(int version, int block, floatX* out, const floatX* in, int in_place, size_t n, const Case* k,
                  float sign) {
    if (in_place) {
        cudaCheck(cudaMemcpy(out, in, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
    } else {
        poison(out, n * sizeof(floatX));
    }
    const floatX* src = in_place ? out : in;
    if (version == 1) { run_v1(block, out, src, k, sign); } else { run_v2(block, out, src, k, sign); }
}

// block 0: the launcher, which picks the version itself
static void label(char* what, size_t size, const char* version, const Case* k, int block, int sign, const char* how) {
    char blk[32] = "";
    if (block > 0) { snprintf(blk, sizeof(blk), " block %d,", block); }
    snprintf(what, size, "%s %s (B %d, Tg %d, pos0 %d, NH %d, HS %d)%s %s", block > 0 ? version : "launcher",
             sign > 0 ? "forward" : "backward", k->B, k->Tg, k->pos0, k->NH, k->HS, blk, how);
}

static void check_case(int B, int Tg, int pos0, int NH, int HS, uint64_t seed) {
    Case k = make_case(B, Tg, pos0, NH, HS);
    size_t n = case_numel(&k);
    float* x = random_floats(n, 2.0f, seed);       // floatX input (rounded by to_device_x)
    float* xf = random_floats(n, 2.0f, seed + 1);  // fp32 input (kept as is)
    floatX* d_x = to_device_x(x, n);
    float* d_xf = to_device_f(xf, n);
    floatX* out;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* ref_f = (double*)mallocCheck(n * sizeof(double));
    double* x64 = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) { x64[i] = x[i]; }
    int v2 = (HS / 2) % x128::size == 0;
    char what[200];
    for (int sign = 1; sign >= -1; sign -= 2) {
        rope_reference(ref, x, &k, sign);
        rope_reference(ref_f, xf, &k, sign);
        for (int version = 1; version <= 2; version++) {
            if (version == 2 && !v2) { continue; }
            for (int in_place = 0; in_place <= 1; in_place++) {
                // block 0 (the launcher) once per direction, the way the trainer calls it: in place
                for (int bi = (version == 1 && in_place ? -1 : 0); bi < N_BLOCKS; bi++) {
                    int block = bi < 0 ? 0 : BLOCKS[bi];
                    run_x(version, block, out, d_x, in_place, n, &k, (float)sign);
                    float* got = from_device_x(out, n);
                    label(what, sizeof(what), version == 1 ? "v1" : "v2", &k, block, sign,
                          in_place ? "floatX in place" : "floatX in");
                    check_close(what, got, ref, n, TOL_X);
                    free(got);
                }
            }
        }
        for (int bi = -1; bi < N_BLOCKS; bi++) {  // fp32 input: version 1 only
            int block = bi < 0 ? 0 : BLOCKS[bi];
            poison(out, n * sizeof(floatX));
            run_v1(block, out, d_xf, &k, (float)sign);
            float* got = from_device_x(out, n);
            label(what, sizeof(what), "v1", &k, block, sign, "fp32 in");
            check_close(what, got, ref_f, n, TOL_X);
            free(got);
        }
    }
    // a rotation forward then back, in place, gives the input again
    for (int version = 1; version <= 2; version++) {
        if (version == 2 && !v2) { continue; }
        cudaCheck(cudaMemcpy(out, d_x, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
        if (version == 1) {
            run_v1(BLOCK, out, (const floatX*)out, &k, 1.0f);
            run_v1(BLOCK, out, (const floatX*)out, &k, -1.0f);
        } else {
            run_v2(BLOCK, out, out, &k, 1.0f);
            run_v2(BLOCK, out, out, &k, -1.0f);
        }
        float* got = from_device_x(out, n);
        snprintf(what, sizeof(what), "v%d forward then backward (B %d, Tg %d, pos0 %d, NH %d, HS %d): the input", version,
                 B, Tg, pos0, NH, HS);
        check_close(what, got, x64, n, TOL_X);
        free(got);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_xf));
    free(x); free(xf); free(ref); free(ref_f); free(x64);
    free_case(&k);
}

// ----------------------------------------------------------------------------
// benchmark at the base preset: q of the prefix rows of a 16-sample batch, 15 heads of 64

static void benchmark(void) {
    const int B = 16, Tg = 440, NH = 15, HS = 64;
    Case k = make_case(B, Tg, 0, NH, HS);
    size_t n = case_numel(&k);
    float* h = random_floats(n, 1.0f, 7);
    floatX* x = to_device_x(h, n);
    float* xf = to_device_f(h, n);
    // the tensor read and the tensor written; the cos/sin tables (112 KiB) stay in cache
    double bytes_x = 2.0 * n * sizeof(floatX), bytes_f = n * (sizeof(float) + sizeof(floatX));
    for (int block = 64; block <= 1024; block *= 2) {
        double ms = time_ms([&]() { run_v1(block, x, (const floatX*)x, &k, 1.0f); }, 20);
        printf("bench v1 floatX in place (rows %d, NH %d, HS %d) block %4d: %7.3f ms, %7.1f GB/s\n", B * Tg, NH, HS,
               block, ms, bytes_x / (ms * 1e-3) / 1e9);
    }
    for (int block = 64; block <= 1024; block *= 2) {
        double ms = time_ms([&]() { run_v1(block, x, (const float*)xf, &k, -1.0f); }, 20);
        printf("bench v1 fp32 in         (rows %d, NH %d, HS %d) block %4d: %7.3f ms, %7.1f GB/s\n", B * Tg, NH, HS,
               block, ms, bytes_f / (ms * 1e-3) / 1e9);
    }
    for (int block = 64; block <= 1024; block *= 2) {
        double ms = time_ms([&]() { run_v2(block, x, x, &k, 1.0f); }, 20);
        printf("bench v2 floatX in place (rows %d, NH %d, HS %d) block %4d: %7.3f ms, %7.1f GB/s\n", B * Tg, NH, HS,
               block, ms, bytes_x / (ms * 1e-3) / 1e9);
    }
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(xf));
    free(h);
    free_case(&k);
}

int main(void) {
    dev_init("rope");
    // odd pair counts (version 1 only), pair counts that are multiples of x128::size in one
    // precision or both, suffix-pass positions (pos0 = Np), the base preset's 15 heads of 64
    struct { int B, Tg, pos0, NH, HS; } shapes[] = {
        {2, 5, 0, 3, 6}, {1, 7, 11, 2, 10}, {2, 9, 0, 2, 16}, {1, 5, 3, 2, 24}, {3, 4, 2, 1, 48}, {1, 6, 440, 3, 64},
        {2, 51, 440, 15, 64},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_case(shapes[i].B, shapes[i].Tg, shapes[i].pos0, shapes[i].NH, shapes[i].HS, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
