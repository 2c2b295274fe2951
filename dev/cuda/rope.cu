/*
rope.cu: rotary position embedding (rotate-half) of q and k at per-row positions, forward and
backward, as SmolVLA applies it (LeRobot's apply_rope).
  Row r of a call (rows of Tg per sample) sits at position pos[(r / Tg) * pos_stride + r % Tg]:
  the (B, T) position ids of the sequence (cumsum of the valid tokens - 1, so pads do not advance
  them), read from the prefix's first token (the VLM) or from its Np-th (the expert's joint layers),
  or the cross layers' own ids. Each head pairs channel k < HS/2 with k + HS/2 and rotates the
  pair by the angle pos / theta^(2k/HS): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). The
  backward is the rotation by minus the angle (the transpose), sign -1. The input is floatX
  (forward of q and k, backward of q, in place) or fp32 (backward of k and v's gradients, which
  are accumulated in fp32); the output is floatX. The angles' tables (T, HS/2) are fp32, the
  presets' rope_theta (vla/config.h) their base.

  version 1  (this program's) one thread per (row, head), looping over the head's pairs: a warp's
             lanes read and write HS values apart (rope_at_kernel1<Tin>, Tin float or floatX)
  version 2  one thread per (row, head, pair), consecutive threads on consecutive pairs, scalar
             loads: the header's rope_at_kernel<Tin>, which its launcher rope_at runs at BLOCK

  nvcc -O3 -std=c++17 -arch=sm_90 rope.cu -o rope && ./rope
*/
#include "common.h"
#include "../../vla/cuda/rope.cuh"
#include "../../vla/config.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value),
// twice over for a forward-then-backward round trip; in fp32 builds only fp32 arithmetic and the
// fp32 cos/sin tables (6e-8 relative) separate the kernel from the reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);
static const int N_VERSIONS = 2;
static int THETA;  // the smolvla preset's rope_theta (main checks that every preset has it)

typedef struct {
    int B, Tg, pos_stride, NH, HS, T;  // T: positions in the tables
    int* pos_h;    // (B, pos_stride) host position ids, each in [0, T)
    int* pos;      // device copy
    float* cos_t;  // (T, HS/2) device tables
    float* sin_t;
} Case;

// positions: a sample's ids grow by 0 or 1 per token (pads repeat the last), from a random start
static Case make_case(int B, int Tg, int pos_stride, int NH, int HS, uint64_t seed) {
    Case k = {B, Tg, pos_stride, NH, HS, pos_stride + 8, NULL, NULL, NULL, NULL};
    Rng r;
    rng_init(&r, seed, 0);
    k.pos_h = (int*)mallocCheck((size_t)B * pos_stride * sizeof(int));
    for (int b = 0; b < B; b++) {
        int p = (int)(rng_u64(&r) % 8);
        for (int j = 0; j < pos_stride; j++) {
            k.pos_h[b * pos_stride + j] = p;
            p += rng_uniform(&r) < 0.8 ? 1 : 0;
        }
    }
    int half = HS / 2;
    float* cs = (float*)mallocCheck((size_t)k.T * half * sizeof(float));
    float* sn = (float*)mallocCheck((size_t)k.T * half * sizeof(float));
    for (int pos = 0; pos < k.T; pos++) {
        for (int j = 0; j < half; j++) {
            double angle = pos * pow((double)THETA, -2.0 * j / (double)HS);
            cs[pos * half + j] = (float)cos(angle);
            sn[pos * half + j] = (float)sin(angle);
        }
    }
    cudaCheck(cudaMalloc(&k.pos, (size_t)B * pos_stride * sizeof(int)));
    cudaCheck(cudaMemcpy(k.pos, k.pos_h, (size_t)B * pos_stride * sizeof(int), cudaMemcpyHostToDevice));
    k.cos_t = to_device_f(cs, (size_t)k.T * half);
    k.sin_t = to_device_f(sn, (size_t)k.T * half);
    free(cs); free(sn);
    return k;
}

static void free_case(Case* k) {
    cudaCheck(cudaFree(k->pos)); cudaCheck(cudaFree(k->cos_t)); cudaCheck(cudaFree(k->sin_t));
    free(k->pos_h);
}

static size_t case_numel(const Case* k) { return (size_t)k->B * k->Tg * k->NH * k->HS; }

// the reference, in double, with the angles computed exactly (not from the fp32 tables)
static void rope_reference(double* out, const float* x, const Case* k, int sign) {
    int half = k->HS / 2, D = k->NH * k->HS;
    for (int row = 0; row < k->B * k->Tg; row++) {
        int pos = k->pos_h[(row / k->Tg) * k->pos_stride + row % k->Tg];
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
// version 1: one thread per (row, head)

template <typename Tin>
__global__ void rope_at_kernel1(floatX* out, const Tin* in, const float* cos_t, const float* sin_t, const int* pos,
                                int rows, int Tg, int pos_stride, int NH, int HS, float sign) {
    int half = HS / 2;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * NH) { return; }
    size_t row = idx / NH, at = idx * HS;
    int at_pos = pos[(row / Tg) * pos_stride + row % Tg];
    for (int k = 0; k < half; k++) {
        float c = cos_t[(size_t)at_pos * half + k], s = sign * sin_t[(size_t)at_pos * half + k];
        float x1 = f32(in[at + k]), x2 = f32(in[at + k + half]);
        out[at + k] = fx(x1 * c - x2 * s);
        out[at + k + half] = fx(x2 * c + x1 * s);
    }
}

// ----------------------------------------------------------------------------
// version v at a block size (block 0: the header's launcher, version 2 at BLOCK, as the trainer calls it)
template <typename Tin>
static void run_rope(int version, int block, floatX* out, const Tin* in, const Case* k, float sign) {
    int rows = k->B * k->Tg;
    if (block == 0) {
        rope_at(out, in, k->cos_t, k->sin_t, k->pos, rows, k->Tg, k->pos_stride, k->NH, k->HS, sign);
        return;
    }
    if (version == 1) {
        size_t n = (size_t)rows * k->NH;
        rope_at_kernel1<Tin><<<ceil_div(n, block), block, 0, main_stream>>>(out, in, k->cos_t, k->sin_t, k->pos, rows,
                                                                             k->Tg, k->pos_stride, k->NH, k->HS, sign);
    } else {
        size_t n = (size_t)rows * k->NH * (k->HS / 2);
        rope_at_kernel<Tin><<<ceil_div(n, block), block, 0, main_stream>>>(out, in, k->cos_t, k->sin_t, k->pos, rows,
                                                                            k->Tg, k->pos_stride, k->NH, k->HS, sign);
    }
    launchCheck();
}

static void check_case(int B, int Tg, int pos_stride, int NH, int HS, uint64_t seed) {
    Case k = make_case(B, Tg, pos_stride, NH, HS, seed);
    size_t n = case_numel(&k);
    float* x = random_floats(n, 2.0f, seed);       // floatX input (rounded by to_device_x)
    float* xf = random_floats(n, 2.0f, seed + 1);  // fp32 input (kept as is)
    floatX* d_x = to_device_x(x, n);
    float* d_xf = to_device_f(xf, n);
    floatX* out;
    cudaCheck(cudaMalloc(&out, n * sizeof(floatX)));
    double* ref = (double*)mallocCheck(n * sizeof(double));
    double* x64 = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) { x64[i] = x[i]; }
    char what[200], shape[100];
    snprintf(shape, sizeof(shape), "(B %d, Tg %d, pos_stride %d, NH %d, HS %d)", B, Tg, pos_stride, NH, HS);
    for (int sign = 1; sign >= -1; sign -= 2) {
        for (int fp32_in = 0; fp32_in <= 1; fp32_in++) {
            rope_reference(ref, fp32_in ? xf : x, &k, sign);
            for (int vb = -1; vb < N_VERSIONS * N_BLOCKS; vb++) {  // -1: the launcher
                int version = vb < 0 ? 2 : 1 + vb / N_BLOCKS, block = vb < 0 ? 0 : BLOCKS[vb % N_BLOCKS];
                if (fp32_in) {
                    poison(out, n * sizeof(floatX));
                    run_rope(version, block, out, d_xf, &k, (float)sign);
                } else {  // in place, as the trainer calls it
                    cudaCheck(cudaMemcpy(out, d_x, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
                    run_rope(version, block, out, (const floatX*)out, &k, (float)sign);
                }
                float* got = from_device_x(out, n);
                char name[40] = "launcher (v2)";
                if (block > 0) { snprintf(name, sizeof(name), "v%d", version); }
                snprintf(what, sizeof(what), "%s %s %s, %s", name, sign > 0 ? "forward" : "backward", shape,
                         fp32_in ? "fp32 in" : "floatX in place");
                if (block > 0) { snprintf(what + strlen(what), sizeof(what) - strlen(what), ", block %d", block); }
                check_close(what, got, ref, n, TOL_X);
                free(got);
            }
        }
    }
    // a rotation forward then back, in place, gives the input again
    for (int version = 1; version <= N_VERSIONS; version++) {
        cudaCheck(cudaMemcpy(out, d_x, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
        run_rope(version, BLOCK, out, (const floatX*)out, &k, 1.0f);
        run_rope(version, BLOCK, out, (const floatX*)out, &k, -1.0f);
        float* got = from_device_x(out, n);
        snprintf(what, sizeof(what), "v%d forward then backward %s: the input", version, shape);
        check_close(what, got, x64, n, TOL_X);
        free(got);
    }
    cudaCheck(cudaFree(out)); cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_xf));
    free(x); free(xf); free(ref); free(x64);
    free_case(&k);
}

// ----------------------------------------------------------------------------
// benchmark at the smolvla preset (a 32-sample batch): q of the prefix rows (2 cameras of 64 tokens, 48
// of text, the state: 15 heads of 64), floatX in place, and the backward of k from fp32 (5 heads);
// and at pi0's, q of its 560 prefix rows, 8 heads of 256

static void bench_preset(const char* preset, int B) {
    const FlowConfig* c = &flow_preset(preset)->config;
    int Tg = flow_n_prefix(c), HS = c->head_dim;
    for (int kind = 0; kind < 2; kind++) {  // 0: q, floatX in place; 1: k's gradient, fp32 in
        int NH = kind == 0 ? c->n_head : c->n_kv_head;
        Case k = make_case(B, Tg, Tg + c->chunk, NH, HS, 7);
        size_t n = case_numel(&k);
        float* h = random_floats(n, 1.0f, 7);
        floatX* x = to_device_x(h, n);
        float* xf = to_device_f(h, n);
        // the tensor read and the tensor written; the cos/sin tables stay in cache
        double bytes = kind == 0 ? 2.0 * n * sizeof(floatX) : n * (sizeof(float) + sizeof(floatX));
        for (int version = 1; version <= N_VERSIONS; version++) {
            for (int block = 64; block <= 1024; block *= 2) {
                double ms = time_ms([&]() {
                    if (kind == 0) {
                        run_rope(version, block, x, (const floatX*)x, &k, 1.0f);
                    } else {
                        run_rope(version, block, x, (const float*)xf, &k, -1.0f);
                    }
                }, 20);
                printf("bench v%d %-8s %-16s (rows %d, NH %2d, HS %3d) block %4d: %7.3f ms, %7.1f GB/s\n", version,
                       preset, kind == 0 ? "floatX in place" : "fp32 in", B * Tg, NH, HS, block, ms,
                       bytes / (ms * 1e-3) / 1e9);
            }
        }
        cudaCheck(cudaFree(x)); cudaCheck(cudaFree(xf));
        free(h);
        free_case(&k);
    }
}

static void benchmark(void) {
    bench_preset("smolvla", 32);
    bench_preset("pi0", 32);
}

int main(void) {
    dev_init("rope");
    THETA = flow_preset("smolvla")->config.rope_theta;
    int same_theta = 1;
    for (int i = 0; i < FLOW_N_PRESETS; i++) { same_theta &= FLOW_PRESETS[i].config.rope_theta == THETA; }
    check_true("every preset's rope_theta is the smolvla preset's (the one checked here)", same_theta);
    // odd pair counts, the prefix (pos_stride = Tg), the expert's rows past the prefix (pos_stride
    // > Tg), the tiny presets' 12 and 8, the smolvla preset's 64 and pi0's 256 head dims
    struct { int B, Tg, pos_stride, NH, HS; } shapes[] = {
        {2, 5, 5, 3, 6}, {1, 7, 18, 2, 10}, {2, 9, 9, 4, 12}, {3, 4, 10, 2, 12}, {2, 6, 6, 8, 8}, {1, 6, 40, 3, 64},
        {2, 50, 227, 15, 64}, {1, 5, 12, 2, 256},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        check_case(shapes[i].B, shapes[i].Tg, shapes[i].pos_stride, shapes[i].NH, shapes[i].HS, 100 + 10 * i);
    }
    return dev_finish(benchmark);
}
