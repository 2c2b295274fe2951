/*
time_mlp.cu: the action tokens' time MLP and sampling's Euler step. The action tokens are
action_time_mlp_out(silu(action_time_mlp_in([a_in, time embedding of t]))), a_in the action_in_proj
of x_t (A = B * H rows of Ce):

  a_emb (A, 2Ce) = [a_in (A, Ce), sin/cos of 2 pi t[b] / period (Ce)]: half sines, half cosines,
                   periods geometric from 4e-3 to 4 (vla/cuda/embedding.cuh's action_embed_kernel)
  t_pre (A, Ce)  = a_emb W_in^T + b_in,  t_act = silu(t_pre),  tok (A, Ce) = t_act W_out^T + b_out
                   (vla/cuda/matmul.cuh's matmul_forward, vla/cuda/glu.cuh's silu_forward_kernel)
  backward: dt_act = dtok W_out, dt_pre = dt_act silu'(t_pre) in place (silu_backward_kernel;
            silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)), d a_emb = dt_pre W_in, and the weights'
            fp32 gradients dW_out += dtok^T t_act, dW_in += dt_pre^T a_emb
  Euler step: x (fp32) += dt v (fp32 velocities, dt = -1/steps), and x's floatX copy
              (vla/cuda/flow_loss.cuh's euler_step_f32_kernel)

  action embedding, version 1  (this program's) one thread per row of a_emb: its copy of a_in, then
                               each frequency's sine and cosine (action_embed_kernel1); a warp's
                               lanes write 2Ce values apart
                    version 2  one thread per value of a_emb, consecutive threads on consecutive
                               values (the header's action_embed_kernel; LAUNCH_1D in the trainer)
  SiLU, Euler step             the headers' silu_forward_kernel, silu_backward_kernel and
                               euler_step_f32_kernel: one thread per value (LAUNCH_1D)
  the time MLP                 the trainer's sequence of launches, forward and backward, with either
                               version of the embedding and cuBLASLt's products (matmul.cuh, checked
                               and timed alone in matmul.cu)

  nvcc -O3 -std=c++17 -arch=sm_90 time_mlp.cu -lcublasLt -o time_mlp && ./time_mlp
*/
#include "common.h"
#include "../../vla/cuda/embedding.cuh"
#include "../../vla/cuda/glu.cuh"
#include "../../vla/cuda/matmul.cuh"
#include "../../vla/cuda/flow_loss.cuh"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 relative). The
// time MLP rounds each of a_emb, t_pre, t_act and its output to floatX (bf16: 1e-2, the errors of
// the steps adding in quadrature); in fp32 builds only fp32 roundings of sums of up to 2Ce products.
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;
static const int BLOCKS[4] = {32, 128, 256, 1024};
static const int N_BLOCKS = 4;

static floatX* device_x(size_t n) {
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    return d;
}

// ----------------------------------------------------------------------------
// action embedding, version 1: one thread per row

// a_emb (B*H, 2da) = [a_in (B*H, da), sin/cos time embedding of t[row / H] (da)], in double
__global__ void action_embed_kernel1(floatX* a_emb, const floatX* a_in, const float* t, int B, int H, int da) {
    size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= (size_t)B * H) { return; }
    floatX* out = a_emb + row * 2 * da;
    for (int k = 0; k < da; k++) { out[k] = a_in[row * da + k]; }
    int half = da / 2;
    for (int k = 0; k < half; k++) {
        double fraction = half > 1 ? (double)k / (double)(half - 1) : 0.0;
        double angle = 2.0 * 3.141592653589793 * (double)t[row / H] / (4e-3 * pow(1000.0, fraction));
        out[da + k] = fx((float)sin(angle));
        out[da + half + k] = fx((float)cos(angle));
    }
}

// version v at `block` threads a block (version 2 at BLOCK is the trainer's launch)
static void run_action_embed(int version, int block, floatX* a_emb, const floatX* a_in, const float* t, int B, int H,
                             int da) {
    size_t R = (size_t)B * H;
    if (version == 1) {
        action_embed_kernel1<<<ceil_div(R, block), block, 0, main_stream>>>(a_emb, a_in, t, B, H, da);
    } else {
        action_embed_kernel<<<ceil_div(R * 2 * da, block), block, 0, main_stream>>>(a_emb, a_in, t, B, H, da);
    }
    launchCheck();
}

// ----------------------------------------------------------------------------
// references, in double

// train_vla.c's flow_time_embedding: periods geometric from 4e-3 to 4.0
static void time_embedding_reference(double* out, double t, int da) {
    int half = da / 2;
    for (int k = 0; k < half; k++) {
        double fraction = half > 1 ? (double)k / (half - 1) : 0.0;
        double angle = 2.0 * M_PI * t / (4e-3 * pow(1000.0, fraction));
        out[k] = sin(angle);
        out[half + k] = cos(angle);
    }
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// out (N, OC) = inp (N, C) w (OC, C)^T [+ bias (OC)]
static void linear_reference(double* out, const double* inp, const float* w, const float* bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double s = bias != NULL ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) { s += inp[(size_t)n * C + c] * w[(size_t)o * C + c]; }
            out[(size_t)n * OC + o] = s;
        }
    }
}

// dinp (N, C) = dout (N, OC) w (OC, C)
static void linear_input_grad_reference(double* dinp, const double* dout, const float* w, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) { s += dout[(size_t)n * OC + o] * w[(size_t)o * C + c]; }
            dinp[(size_t)n * C + c] = s;
        }
    }
}

// dw (OC, C) = dw0 + dout (N, OC)^T inp (N, C)
static void linear_weight_grad_reference(double* dw, const float* dw0, const double* dout, const double* inp, int N,
                                         int C, int OC) {
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = dw0[(size_t)o * C + c];
            for (int n = 0; n < N; n++) { s += dout[(size_t)n * OC + o] * inp[(size_t)n * C + c]; }
            dw[(size_t)o * C + c] = s;
        }
    }
}

// ----------------------------------------------------------------------------
// checks

// flow times in [0.001, 1], the ends included: sample 0 at t = 1, sample 1 at t = 0.001
static float* flow_times(int B, uint64_t seed) {
    float* t = random_floats(B, 0.5f, seed);
    for (int b = 0; b < B; b++) { t[b] = b == 0 ? 1.0f : b == 1 ? 0.001f : 0.5005f + 0.999f * t[b]; }
    return t;
}

static void check_action_embed(int B, int H, int da, uint64_t seed) {
    size_t R = (size_t)B * H;
    float* a_in = random_floats(R * da, 2.0f, seed);
    float* t = flow_times(B, seed + 1);
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
    for (int version = 1; version <= 2; version++) {
        for (int bi = 0; bi < N_BLOCKS; bi++) {
            poison(a_emb, R * 2 * da * sizeof(floatX));
            run_action_embed(version, BLOCKS[bi], a_emb, d_a_in, d_t, B, H, da);
            float* got = from_device_x(a_emb, R * 2 * da);
            for (size_t r = 0; r < R; r++) {
                memcpy(got_copy + r * da, got + r * 2 * da, da * sizeof(float));
                memcpy(got_emb + r * da, got + r * 2 * da + da, da * sizeof(float));
            }
            char what[200];
            snprintf(what, sizeof(what), "v%d action embed (B %d, H %d, da %d) block %d: a_in half", version, B, H, da,
                     BLOCKS[bi]);
            check_exact(what, got_copy, want_copy, R * da);  // a copy: the same bits
            snprintf(what, sizeof(what), "v%d action embed (B %d, H %d, da %d) block %d: time half", version, B, H, da,
                     BLOCKS[bi]);
            check_close(what, got_emb, ref_emb, R * da, TOL_X);  // sin/cos in double, stored as floatX
            free(got);
        }
    }
    free(a_in); free(t); free(ref_emb); free(want_copy); free(got_copy); free(got_emb);
    cudaCheck(cudaFree(d_a_in)); cudaCheck(cudaFree(d_t)); cudaCheck(cudaFree(a_emb));
}

// ---- SiLU: out = x sigmoid(x); backward d = dy s (1 + x (1 - s)), s = sigmoid(x)

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
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int block = BLOCKS[bi];
        poison(out, n * sizeof(floatX));
        silu_forward_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(out, d_x, n);
        launchCheck();
        float* got = from_device_x(out, n);
        snprintf(what, sizeof(what), "silu forward (n %zu) block %d", n, block);
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
            snprintf(what, sizeof(what), "silu backward%s (n %zu) block %d", in_place ? " in place" : "", n, block);
            check_close(what, got, ref_d, n, TOL_X);
            free(got);
        }
    }
    free(x); free(dy); free(ref_out); free(ref_d);
    cudaCheck(cudaFree(d_x)); cudaCheck(cudaFree(d_dy)); cudaCheck(cudaFree(out));
}

// ---- the time MLP, forward and backward, as the trainer's suffix embedding and its backward run it

typedef struct {
    int B, H, Ce, A;  // A = B * H rows
    float *a_in, *t, *w_in, *b_in, *w_out, *b_out, *dtok, *dw_in0, *dw_out0;  // host inputs
    floatX *d_a_in, *d_w_in, *d_b_in, *d_w_out, *d_b_out, *d_dtok;
    float* d_t;
    floatX *a_emb, *t_pre, *t_act, *tok, *dt_act, *g_emb;  // activations and gradients
    float *dw_in, *dw_out;  // fp32 weight gradients (accumulated)
} Mlp;

static Mlp make_mlp(int B, int H, int Ce, uint64_t seed) {
    Mlp k;
    k.B = B; k.H = H; k.Ce = Ce; k.A = B * H;
    size_t A = k.A;
    // weights at 1 / sqrt(fan_in): activations of order 1, where SiLU bends
    k.a_in = random_floats(A * Ce, 1.0f, seed);
    k.t = flow_times(B, seed + 1);
    k.w_in = random_floats((size_t)Ce * 2 * Ce, (float)(1.0 / sqrt(2.0 * Ce)), seed + 2);
    k.b_in = random_floats(Ce, 0.5f, seed + 3);
    k.w_out = random_floats((size_t)Ce * Ce, (float)(1.0 / sqrt((double)Ce)), seed + 4);
    k.b_out = random_floats(Ce, 0.5f, seed + 5);
    k.dtok = random_floats(A * Ce, 1.0f, seed + 6);
    k.dw_in0 = random_floats((size_t)Ce * 2 * Ce, 1.0f, seed + 7);  // the gradients so far: added onto
    k.dw_out0 = random_floats((size_t)Ce * Ce, 1.0f, seed + 8);
    k.d_a_in = to_device_x(k.a_in, A * Ce);
    k.d_t = to_device_f(k.t, B);
    k.d_w_in = to_device_x(k.w_in, (size_t)Ce * 2 * Ce);
    k.d_b_in = to_device_x(k.b_in, Ce);
    k.d_w_out = to_device_x(k.w_out, (size_t)Ce * Ce);
    k.d_b_out = to_device_x(k.b_out, Ce);
    k.d_dtok = to_device_x(k.dtok, A * Ce);
    k.a_emb = device_x(A * 2 * Ce);
    k.t_pre = device_x(A * Ce);
    k.t_act = device_x(A * Ce);
    k.tok = device_x(A * Ce);
    k.dt_act = device_x(A * Ce);
    k.g_emb = device_x(A * 2 * Ce);
    k.dw_in = to_device_f(k.dw_in0, (size_t)Ce * 2 * Ce);
    k.dw_out = to_device_f(k.dw_out0, (size_t)Ce * Ce);
    return k;
}

static void free_mlp(Mlp* k) {
    free(k->a_in); free(k->t); free(k->w_in); free(k->b_in); free(k->w_out); free(k->b_out); free(k->dtok);
    free(k->dw_in0); free(k->dw_out0);
    floatX* xs[13] = {k->d_a_in, k->d_w_in, k->d_b_in, k->d_w_out, k->d_b_out, k->d_dtok,
                      k->a_emb, k->t_pre, k->t_act, k->tok, k->dt_act, k->g_emb, NULL};
    for (int i = 0; xs[i] != NULL; i++) { cudaCheck(cudaFree(xs[i])); }
    cudaCheck(cudaFree(k->d_t)); cudaCheck(cudaFree(k->dw_in)); cudaCheck(cudaFree(k->dw_out));
}

// flow_suffix_embed's launches from a_in (the action tokens of SmolVLA: no state token in the
// suffix), the embedding's version at `block`
static void mlp_forward(const Mlp* k, int version, int block) {
    int A = k->A, Ce = k->Ce;
    run_action_embed(version, block, k->a_emb, k->d_a_in, k->d_t, k->B, k->H, Ce);
    matmul_forward(k->t_pre, k->a_emb, k->d_w_in, k->d_b_in, NULL, A, 2 * Ce, Ce);
    LAUNCH_1D(silu_forward_kernel, (size_t)A * Ce, k->t_act, k->t_pre, (size_t)A * Ce);
    matmul_forward(k->tok, k->t_act, k->d_w_out, k->d_b_out, NULL, A, Ce, Ce);
}

// flow_suffix_embed_backward's, from dtok down to d a_emb and the two weights' gradients
static void mlp_backward(const Mlp* k) {
    int A = k->A, Ce = k->Ce;
    matmul_backward_input(k->dt_act, k->d_dtok, k->d_w_out, A, Ce, Ce, 0.0f);
    matmul_backward_weight(k->dw_out, k->d_dtok, k->t_act, A, Ce, Ce);
    LAUNCH_1D(silu_backward_kernel, (size_t)A * Ce, k->dt_act, k->dt_act, k->t_pre, (size_t)A * Ce);
    matmul_backward_input(k->g_emb, k->dt_act, k->d_w_in, A, 2 * Ce, Ce, 0.0f);
    matmul_backward_weight(k->dw_in, k->dt_act, k->a_emb, A, 2 * Ce, Ce);
}

static void check_mlp(int B, int H, int Ce, uint64_t seed) {
    Mlp k = make_mlp(B, H, Ce, seed);
    size_t A = k.A;
    // the reference in double, no intermediate rounded
    double* emb = (double*)mallocCheck(A * 2 * Ce * sizeof(double));
    double* pre = (double*)mallocCheck(A * Ce * sizeof(double));
    double* act = (double*)mallocCheck(A * Ce * sizeof(double));
    double* tok = (double*)mallocCheck(A * Ce * sizeof(double));
    double* dtok = (double*)mallocCheck(A * Ce * sizeof(double));
    double* dpre = (double*)mallocCheck(A * Ce * sizeof(double));
    double* demb = (double*)mallocCheck(A * 2 * Ce * sizeof(double));
    double* dw_out = (double*)mallocCheck((size_t)Ce * Ce * sizeof(double));
    double* dw_in = (double*)mallocCheck((size_t)Ce * 2 * Ce * sizeof(double));
    for (size_t r = 0; r < A; r++) {
        for (int c = 0; c < Ce; c++) { emb[r * 2 * Ce + c] = k.a_in[r * Ce + c]; }
        time_embedding_reference(emb + r * 2 * Ce + Ce, k.t[r / H], Ce);
    }
    linear_reference(pre, emb, k.w_in, k.b_in, (int)A, 2 * Ce, Ce);
    for (size_t i = 0; i < A * Ce; i++) { act[i] = pre[i] * sigmoid(pre[i]); }
    linear_reference(tok, act, k.w_out, k.b_out, (int)A, Ce, Ce);
    for (size_t i = 0; i < A * Ce; i++) { dtok[i] = k.dtok[i]; }
    linear_input_grad_reference(dpre, dtok, k.w_out, (int)A, Ce, Ce);
    for (size_t i = 0; i < A * Ce; i++) {
        double s = sigmoid(pre[i]);
        dpre[i] *= s * (1.0 + pre[i] * (1.0 - s));
    }
    linear_input_grad_reference(demb, dpre, k.w_in, (int)A, 2 * Ce, Ce);
    linear_weight_grad_reference(dw_out, k.dw_out0, dtok, act, (int)A, Ce, Ce);
    linear_weight_grad_reference(dw_in, k.dw_in0, dpre, emb, (int)A, 2 * Ce, Ce);
    char what[200], head[120];
    for (int version = 1; version <= 2; version++) {
        floatX* outs[4] = {k.a_emb, k.t_pre, k.t_act, k.tok};
        for (int i = 0; i < 4; i++) { poison(outs[i], (i == 0 ? 2 : 1) * A * Ce * sizeof(floatX)); }
        poison(k.dt_act, A * Ce * sizeof(floatX));
        poison(k.g_emb, A * 2 * Ce * sizeof(floatX));
        cudaCheck(cudaMemcpy(k.dw_in, k.dw_in0, (size_t)Ce * 2 * Ce * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(k.dw_out, k.dw_out0, (size_t)Ce * Ce * sizeof(float), cudaMemcpyHostToDevice));
        mlp_forward(&k, version, BLOCK);
        mlp_backward(&k);
        snprintf(head, sizeof(head), "time MLP, v%d embedding (B %d, H %d, Ce %d)", version, B, H, Ce);
        const char* names[4] = {"a_emb", "t_pre", "t_act", "action tokens"};
        const double* refs[4] = {emb, pre, act, tok};
        for (int i = 0; i < 4; i++) {
            size_t n = (i == 0 ? 2 : 1) * A * Ce;
            float* got = from_device_x(outs[i], n);
            snprintf(what, sizeof(what), "%s: %s", head, names[i]);
            check_close(what, got, refs[i], n, TOL_X);
            free(got);
        }
        float* got = from_device_x(k.dt_act, A * Ce);
        snprintf(what, sizeof(what), "%s: d t_pre (silu backward in place)", head);
        check_close(what, got, dpre, A * Ce, TOL_X);
        free(got);
        got = from_device_x(k.g_emb, A * 2 * Ce);
        snprintf(what, sizeof(what), "%s: d a_emb", head);
        check_close(what, got, demb, A * 2 * Ce, TOL_X);
        free(got);
        // fp32 sums of floatX products; the terms carry the floatX roundings of t_act, dt_pre, a_emb
        got = from_device_f(k.dw_out, (size_t)Ce * Ce);
        snprintf(what, sizeof(what), "%s: dW_out += ", head);
        check_close(what, got, dw_out, (size_t)Ce * Ce, TOL_X);
        free(got);
        got = from_device_f(k.dw_in, (size_t)Ce * 2 * Ce);
        snprintf(what, sizeof(what), "%s: dW_in += ", head);
        check_close(what, got, dw_in, (size_t)Ce * 2 * Ce, TOL_X);
        free(got);
    }
    free(emb); free(pre); free(act); free(tok); free(dtok); free(dpre); free(demb); free(dw_out); free(dw_in);
    free_mlp(&k);
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
    for (int bi = 0; bi < N_BLOCKS; bi++) {
        int block = BLOCKS[bi];
        cudaCheck(cudaMemcpy(x, x0, n * sizeof(float), cudaMemcpyHostToDevice));
        poison(x_model, n * sizeof(floatX));
        euler_step_f32_kernel<<<ceil_div(n, block), block, 0, main_stream>>>(x, x_model, d_v, dt, n);
        launchCheck();
        float* got_x = from_device_f(x, n);
        float* got_model = from_device_x(x_model, n);
        for (int i = 0; i < n; i++) { want_model[i] = round_x(got_x[i]); }
        char what[200];
        snprintf(what, sizeof(what), "euler step (n %d) block %d: x", n, block);
        check_close(what, got_x, ref, n, 1e-5);  // two fp32 roundings
        snprintf(what, sizeof(what), "euler step (n %d) block %d: x_model", n, block);
        check_close(what, got_model, ref, n, TOL_X);
        snprintf(what, sizeof(what), "euler step (n %d) block %d: x_model == floatX(x)", n, block);
        check_exact(what, got_model, want_model, n);
        free(got_x); free(got_model);
    }
    free(x0); free(v); free(ref); free(want_model);
    cudaCheck(cudaFree(d_v)); cudaCheck(cudaFree(x)); cudaCheck(cudaFree(x_model));
}

// ----------------------------------------------------------------------------
// benchmark at the presets' action tokens: 32 samples x 50 actions, Ce 720 (smolvla) and 1024 (pi0's
// expert, whose time MLP has the same shape); the Euler step at 32 x 50 x 32 values (launch-bound)

static void bench_preset(const char* preset, int B, int H, int Ce) {
    Mlp k = make_mlp(B, H, Ce, 900);
    size_t A = k.A, n = A * Ce;
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { run_action_embed(version, block, k.a_emb, k.d_a_in, k.d_t, B, H, Ce); }, 20);
            printf("bench v%d action embed %-7s (A %zu, Ce %d) block %4d: %8.4f ms, %7.1f GB/s\n", version, preset, A,
                   Ce, block, ms, (double)A * 3 * Ce * sizeof(floatX) / (ms * 1e-3) / 1e9);
        }
    }
    double ms = time_ms([&]() { LAUNCH_1D(silu_forward_kernel, n, k.t_act, k.t_pre, n); }, 20);
    printf("bench silu forward %-7s (n %zu): %8.4f ms, %7.1f GB/s\n", preset, n, ms,
           (double)n * 2 * sizeof(floatX) / (ms * 1e-3) / 1e9);
    ms = time_ms([&]() { LAUNCH_1D(silu_backward_kernel, n, k.dt_act, k.dt_act, k.t_pre, n); }, 20);
    printf("bench silu backward %-7s (n %zu): %8.4f ms, %7.1f GB/s\n", preset, n, ms,
           (double)n * 3 * sizeof(floatX) / (ms * 1e-3) / 1e9);
    // the products' FLOPs: forward 2A (2Ce Ce + Ce Ce), backward twice that
    double flops = 2.0 * A * 3.0 * Ce * Ce;
    ms = time_ms([&]() { mlp_forward(&k, 2, BLOCK); }, 20);
    printf("bench time MLP forward %-7s (A %zu, Ce %d): %8.4f ms, %7.1f TFLOP/s\n", preset, A, Ce, ms,
           flops / (ms * 1e-3) / 1e12);
    ms = time_ms([&]() { mlp_backward(&k); }, 20);
    printf("bench time MLP backward %-7s (A %zu, Ce %d): %8.4f ms, %7.1f TFLOP/s\n", preset, A, Ce, ms,
           2.0 * flops / (ms * 1e-3) / 1e12);
    free_mlp(&k);
}

static void benchmark(void) {
    bench_preset("smolvla", 32, 50, 720);
    bench_preset("pi0", 32, 50, 1024);
    const int n = 32 * 50 * 32;
    float *x, *v;
    floatX* x_model;
    cudaCheck(cudaMalloc(&x, n * sizeof(float)));
    cudaCheck(cudaMalloc(&v, n * sizeof(float)));
    cudaCheck(cudaMemset(x, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(v, 0, n * sizeof(float)));
    x_model = device_x(n);
    double ms = time_ms([&]() { LAUNCH_1D(euler_step_f32_kernel, n, x, x_model, v, -0.1f, n); }, 20);
    printf("bench euler step (n %d): %8.4f ms, %7.1f GB/s\n", n, ms,
           (double)n * (3 * sizeof(float) + sizeof(floatX)) / (ms * 1e-3) / 1e9);
    cudaCheck(cudaFree(x)); cudaCheck(cudaFree(v)); cudaCheck(cudaFree(x_model));
}

int main(void) {
    dev_init("time_mlp");
    matmul_init();
    // da 2: one frequency (fraction 0); widths that do not fill a block; rows of several samples
    int embed_shapes[][3] = {{2, 3, 4}, {3, 5, 2}, {2, 7, 12}, {4, 16, 32}};
    for (int i = 0; i < 4; i++) {
        check_action_embed(embed_shapes[i][0], embed_shapes[i][1], embed_shapes[i][2], 10 + i);
    }
    size_t sizes[3] = {1, 1000, 4097};
    for (int i = 0; i < 3; i++) { check_silu(sizes[i], 20 + i); }
    // the tiny presets' chunk of 8 actions at their widths (36, pi0_tiny's 32), 5 frequencies, and
    // more rows (400) than a block at the small preset's 48
    int mlp_shapes[][3] = {{2, 8, 36}, {2, 8, 32}, {3, 5, 10}, {8, 50, 48}};
    for (int i = 0; i < 4; i++) { check_mlp(mlp_shapes[i][0], mlp_shapes[i][1], mlp_shapes[i][2], 50 + 10 * i); }
    for (int i = 0; i < 3; i++) { check_euler((int)sizes[i], 30 + i); }
    return dev_finish(benchmark);
}
