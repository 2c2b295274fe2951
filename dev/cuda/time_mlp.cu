/*
time_mlp.cu: the elementwise kernels of the action tokens' time MLP and of sampling: the action
embedding with the flow time, SiLU forward and backward, SmolVLA's Euler step, fp32 -> floatX.

  action embedding, version 1  action_embed_kernel: one thread per value of a_emb (R, 2da),
                               a copy of a_in or the sinusoidal embedding of the sample's flow time
                               (half sin, half cos, periods 4e-3 .. 4), computed in double
  SiLU,             version 1  silu_forward_kernel and silu_backward_kernel (d = dy s (1 + x (1 - s)),
                               in place or not): one thread per value
  Euler step,       version 1  euler_step_f32_kernel: x += dt v in fp32 (v fp32, dt = -1/steps), and
                               x's floatX copy
  convert,          version 1  convert_kernel: one value per thread
                    version 2  convert_kernel2: x128::size values per thread, 128-bit loads and stores
                               (n a multiple of x128::size, 16-byte aligned pointers)

  make -C dev/cuda time_mlp && dev/cuda/time_mlp
*/
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 relative)
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const int BLOCKS[4] = {32, 128, 256, 1024};

static floatX* device_x(size_t n) {
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    return d;
}

// ---- action embedding: a_emb (B*H, 2da) = [a_in (B*H, da), time embedding of t[b] (da)]

// train_vla.c's time_embedding, in double: periods geometric from 4e-3 to 4.0
static void time_embedding_reference(double* out, double t, int da) {
    int half = da / 2;
    for (int k = 0; k < half; k++) {
        double fraction = half > 1 ? (double)k / (half - 1) : 0.0;
        double angle = 2.0 * M_PI * t / (4e-3 * pow(1000.0, fraction));
        out[k] = sin(angle);
        out[half + k] = cos(angle);
    }
}

static void check_action_embed(int B, int H, int da, uint64_t seed) {
    size_t R = (size_t)B * H;
    float* a_in = random_floats(R * da, 2.0f, seed);
    float* t = random_floats(B, 0.5f, seed + 1);
    for (int b = 0; b < B; b++) { t[b] = b == 0 ? 1.0f : b == 1 ? 0.001f : 0.5005f + 0.999f * t[b]; }  // in [0.001, 1]
    floatX* d_a_in = to_device_x(a_in, R * da);
    float* d_t = to_device_f(t, B);
    double* ref_emb = (double*)mallocCheck(R * da * sizeof(double));
    float* want_copy = (float*)mallocCheck(R * da * sizeof(float));
    for (size_t r = 0; r < R; r++) {
        time_embedding_reference(ref_emb + r * da, t[r / H], da);
        memcpy(want_copy + r * da, a_in + r * da, da * sizeof(float));
    }
    floatX* a_emb = device_x(R * 2 * da);
    float* got_copy = (float*)mallocCheck(R * da * sizeof(float));
    float* got_emb = (float*)mallocCheck(R * da * sizeof(float));
    for (int bi = 0; bi < 4; bi++) {
        poison(a_emb, R * 2 * da * sizeof(floatX));
        action_embed_kernel<<<ceil_div(R * 2 * da, BLOCKS[bi]), BLOCKS[bi], 0, main_stream>>>(a_emb, d_a_in, d_t, B, H, da);
        launchCheck();
        float* got = from_device_x(a_emb, R * 2 * da);
        for (size_t r = 0; r < R; r++) {
            memcpy(got_copy + r * da, got + r * 2 * da, da * sizeof(float));
            memcpy(got_emb + r * da, got + r * 2 * da + da, da * sizeof(float));
        }
        char what[200];
        snprintf(what, sizeof(what), "v1 action embed (B %d, H %d, da %d) block %d: a_in half", B, H, da, BLOCKS[bi]);
        check_exact(what, got_copy, want_copy, R * da);  // a copy: the same bits
        snprintf(what, sizeof(what), "v1 action embed (B %d, H %d, da %d) block %d: time half", B, H, da, BLOCKS[bi]);
        check_close(what, got_emb, ref_emb, R * da, TOL_X);  // sin/cos in double, stored as floatX
        free(got);
    }
    free(a_in); free(t); free(ref_emb); free(want_copy); free(got_copy); free(got_emb);
    cudaCheck(cudaFree(d_a_in)); cudaCheck(cudaFree(d_t)); cudaCheck(cudaFree(a_emb));
}

// ---- SiLU: out = x sigmoid(x); backward d = dy s (1 + x (1 - s)), s = sigmoid(x)

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void check_silu(size_t n, uint64_t seed) {
    float* x = random_floats(n, 8.0f, seed);  // through both saturations
    float* dy = random_floats(n, 1.0f, seed + 1);
    floatX* d_x = to_device_x(x, n);
    floatX* d_dy = to_device_x(dy, n);
    double* ref_out = (double*)mallocCheck(n * sizeof(double));
    double* ref_d = (double*)mallocCheck(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double s = sigmoid(x[i]);
        ref_out[i] = x[i] * s;
        ref_d[i] = dy[i] * s * (1.0 + x[i] * (1.0 - s));
    }
    floatX* out = device_x(n);
    char what[200];
    for (int bi = 0; bi < 4; bi++) {
        int block = BLOCKS[bi];
        poison(out, n * sizeof(floatX));
        silu_forward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, d_x, n);
        launchCheck();
        float* got = from_device_x(out, n);
        snprintf(what, sizeof(what), "v1 silu forward (n %zu) block %d", n, block);
        check_close(what, got, ref_out, n, TOL_X);
        free(got);
        for (int in_place = 0; in_place < 2; in_place++) {
            if (in_place) {  // the trainer's call: d is dy
                cudaCheck(cudaMemcpy(out, d_dy, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
                silu_backward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, out, d_x, n);
            } else {
                poison(out, n * sizeof(floatX));
                silu_backward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, d_dy, d_x, n);
            }
            launchCheck();
            got = from_device_x(out, n);
            snprintf(what, sizeof(what), "v1 silu backward%s (n %zu) block %d", in_place ? " in place" : "", n, block);
            check_close(what, got, ref_d, n, TOL_X);
            free(got);
        }
    }
    free(x); free(dy); free(ref_out); free(ref_d);
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_dy)); cudaCheck(cudaFree(out));
}

// ---- Euler step: x (fp32) += dt v (fp32 velocities, LeRobot's euler_integrate), x_model = floatX(x)

static void check_euler(int n, uint64_t seed) {
    const float dt = -0.1f;
    float* x0 = random_floats(n, 2.0f, seed);
    float* v = random_floats(n, 3.0f, seed + 1);
    float* d_v = to_device_f(v, n);
    float* x = to_device_f(x0, n);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    for (int i = 0; i < n; i++) { ref[i] = (double)x0[i] + (double)dt * v[i]; }
    floatX* x_model = device_x(n);
    float* want_model = (float*)mallocCheck(n * sizeof(float));
    for (int bi = 0; bi < 4; bi++) {
        int block = BLOCKS[bi];
        cudaCheck(cudaMemcpy(x, x0, n * sizeof(float), cudaMemcpyHostToDevice));
        poison(x_model, n * sizeof(floatX));
        euler_step_f32_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(x, x_model, d_v, dt, n);
        launchCheck();
        float* got_x = from_device_f(x, n);
        float* got_model = from_device_x(x_model, n);
        for (int i = 0; i < n; i++) { want_model[i] = round_x(got_x[i]); }
        char what[200];
        snprintf(what, sizeof(what), "v1 euler step (n %d) block %d: x", n, block);
        check_close(what, got_x, ref, n, 1e-5);  // two fp32 roundings
        snprintf(what, sizeof(what), "v1 euler step (n %d) block %d: x_model", n, block);
        check_close(what, got_model, ref, n, TOL_X);
        snprintf(what, sizeof(what), "v1 euler step (n %d) block %d: x_model == floatX(x)", n, block);
        check_exact(what, got_model, want_model, n);
        free(got_x); free(got_model);
    }
    free(x0); free(v); free(ref); free(want_model);
    cudaCheck(cudaFree(d_v)); cudaCheck(cudaFree(x)); cudaCheck(cudaFree(x_model));
}

// ---- convert: fp32 -> floatX

// version 0: the launcher `convert`, which picks version 2 where the sizes and pointers allow
static void run_convert(int version, int block, floatX* out, const float* inp, size_t n) {
    if (version == 0) {
        convert(out, inp, n);
        return;
    }
    if (version == 1) {
        convert_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, inp, n);
    } else {
        convert_kernel2<<<ceil_div(n / x128::size, block), block, 0, main_stream>>>(out, inp, n);
    }
    launchCheck();
}

static void check_convert(size_t n, uint64_t seed) {
    float* h = random_floats(n + 1, 3.0f, seed);  // one more: an input 4 bytes off 16-byte alignment
    float* d = to_device_f(h, n + 1);
    double* ref = (double*)mallocCheck(n * sizeof(double));
    float* want = (float*)mallocCheck(n * sizeof(float));
    floatX* out = device_x(n);
    for (int off = 0; off < 2; off++) {
        for (size_t i = 0; i < n; i++) {
            ref[i] = h[off + i];
            want[i] = round_x(h[off + i]);
        }
        for (int version = 0; version <= 2; version++) {
            // version 2 needs whole packs and aligned pointers
            if (version == 2 && (off != 0 || n % x128::size != 0)) { continue; }
            for (int bi = 0; bi < (version == 0 ? 1 : 4); bi++) {
                poison(out, n * sizeof(floatX));
                run_convert(version, BLOCKS[bi], out, d + off, n);
                float* got = from_device_x(out, n);
                char what[200], name[40];
                if (version == 0) {
                    snprintf(name, sizeof(name), "launcher (v%d)", packable(n, x128::size, out, d + off) ? 2 : 1);
                } else {
                    snprintf(name, sizeof(name), "v%d block %d", version, BLOCKS[bi]);
                }
                snprintf(what, sizeof(what), "convert %s (n %zu, input %s)", name, n, off ? "unaligned" : "aligned");
                check_close(what, got, ref, n, TOL_X);
                check_exact(what, got, want, n);  // round to nearest even, as the host rounds
                free(got);
            }
        }
    }
    free(h); free(ref); free(want);
    cudaCheck(cudaFree(d)); cudaCheck(cudaFree(out));
}

// ---- benchmark: the smolvla preset's action tokens (32 samples x 50 actions, Ce 720); convert on
// 64M values (a weight-sized conversion). The Euler step (32 x 50 x Amax values) is launch-bound.

static void benchmark(void) {
    const int B = 32, H = 50, da = 720;
    const size_t R = (size_t)B * H, n_conv = (size_t)64 << 20;
    float* h = random_floats(n_conv, 3.0f, 900);
    floatX* a = to_device_x(h, R * 2 * da);
    floatX* b = to_device_x(h + R * 2 * da, R * 2 * da);
    floatX* c = device_x(R * 2 * da);
    float* t = to_device_f(h, B);  // values in [-3, 3): any time does for timing
    float* f = to_device_f(h, n_conv);
    floatX* out = device_x(n_conv);
    size_t n = R * da;
    double ms = time_ms([&]() { LAUNCH_1D(action_embed_kernel, R * 2 * da, c, a, t, B, H, da); }, 20);
    printf("bench v1 action embed (R %zu, da %d): %8.3f ms, %7.1f GB/s\n", R, da, ms,
           (double)R * 3 * da * sizeof(floatX) / (ms * 1e-3) / 1e9);
    ms = time_ms([&]() { LAUNCH_1D(silu_forward_kernel, n, c, a, n); }, 20);
    printf("bench v1 silu forward (n %zu): %8.3f ms, %7.1f GB/s\n", n, ms, (double)n * 2 * sizeof(floatX) / (ms * 1e-3) / 1e9);
    ms = time_ms([&]() { LAUNCH_1D(silu_backward_kernel, n, c, b, a, n); }, 20);
    printf("bench v1 silu backward (n %zu): %8.3f ms, %7.1f GB/s\n", n, ms, (double)n * 3 * sizeof(floatX) / (ms * 1e-3) / 1e9);
    for (int version = 1; version <= 2; version++) {
        ms = time_ms([&]() { run_convert(version, BLOCK, out, f, n_conv); }, 20);
        printf("bench v%d convert (n %zu): %8.3f ms, %7.1f GB/s\n", version, n_conv, ms,
               (double)n_conv * (sizeof(float) + sizeof(floatX)) / (ms * 1e-3) / 1e9);
    }
    free(h);
    cudaCheck(cudaFree(a)); cudaCheck(cudaFree(b)); cudaCheck(cudaFree(c)); cudaCheck(cudaFree(t));
    cudaCheck(cudaFree(f)); cudaCheck(cudaFree(out));
}

int main(void) {
    dev_init("time_mlp");
    // da 2: one frequency (fraction 0); widths that do not fill a block; rows of several samples
    int embed_shapes[][3] = {{2, 3, 4}, {3, 5, 2}, {2, 7, 12}, {4, 16, 32}};
    for (int i = 0; i < 4; i++) { check_action_embed(embed_shapes[i][0], embed_shapes[i][1], embed_shapes[i][2], 10 + i); }
    size_t sizes[3] = {1, 1000, 4097};
    for (int i = 0; i < 3; i++) { check_silu(sizes[i], 20 + i); }
    for (int i = 0; i < 3; i++) { check_euler((int)sizes[i], 30 + i); }
    size_t conv_sizes[4] = {1, 8, 1024, 4104};
    for (int i = 0; i < 4; i++) { check_convert(conv_sizes[i], 40 + i); }
    return dev_finish(benchmark);
}
