/*
common.h: what every dev/cuda program shares: the GPU's setup, host and device copies, the
checks and the timer. A program includes the kernel library's header of its operation
(../../vla/cuda/NAME.cuh) as its last version, so what it benchmarks is what trains; its earlier
versions are kernels of its own, numbered, each saying what it changes.

Each program: a CPU reference in double precision, every kernel version checked against it at
several block sizes and shapes on fresh random inputs (outputs poisoned with NaN beforehand, so
an element nobody wrote fails), then a benchmark at the smolvla preset's shapes printing time and
achieved bandwidth or FLOP/s. Under the CPU emulation (make -C dev/cuda emu) the benchmarks are
skipped: their timings would mean nothing. The last line is `N passed, M failed`.
*/
#ifndef DEV_CUDA_COMMON_H
#define DEV_CUDA_COMMON_H

#include "../../vla/cuda/common.cuh"
#include "../../vla/rng.h"
#include <math.h>

static int n_passed = 0, n_failed = 0;

// GPU 0 and its stream (a program whose operation multiplies matrices also calls matmul_init)
static void dev_init(const char* what) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "error: no CUDA GPU is visible: run this program on a GPU, or under the emulation (make test)\n");
        exit(1);
    }
    cudaDeviceProp prop;
    cudaCheck(cudaSetDevice(0));
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    cudaCheck(cudaStreamCreate(&main_stream));
    printf("%s on %s, floatX %s\n", what, prop.name, PRECISION_NAME);
}

#if defined(CUDA_EMULATION)
static const int BENCHMARKS = 0;
#else
static const int BENCHMARKS = 1;
#endif

// Runs the benchmarks (not under the emulation, where timings mean nothing) and prints the
// closing line; returns the program's exit status.
// DEV_NO_BENCH=1: the checks alone (e.g. under compute-sanitizer, where timings mean nothing)
static int dev_finish(void (*benchmarks)(void)) {
    const char* no_bench = getenv("DEV_NO_BENCH");
    if (no_bench != NULL && strcmp(no_bench, "1") == 0) {
        printf("benchmarks skipped: DEV_NO_BENCH=1\n");
    } else if (BENCHMARKS) {
        benchmarks();
    } else {
        printf("benchmarks skipped: timings under the CPU emulation mean nothing\n");
    }
    printf("\n%d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}

// n uniform values in [-scale, scale), from the project's counter-based RNG
static float* random_floats(size_t n, float scale, uint64_t seed) {
    Rng r;
    rng_init(&r, seed, 99);
    float* x = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (float)(2.0 * rng_uniform(&r) - 1.0) * scale; }
    return x;
}

// the value a floatX holds for x (what the GPU computes with)
static float round_x(float x) { return f32(fx(x)); }

// host floats -> device floatX (rounding the host copy too, so references see what the GPU sees)
static floatX* to_device_x(float* h, size_t n) {
    floatX* tmp = (floatX*)mallocCheck(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) {
        h[i] = round_x(h[i]);
        tmp[i] = fx(h[i]);
    }
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

static float* to_device_f(const float* h, size_t n) {
    float* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(float)));
    cudaCheck(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static float* from_device_f(const float* d, size_t n) {
    float* h = (float*)mallocCheck(n * sizeof(float));
    cudaCheck(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static int* to_device_i(const int32_t* h, size_t n) {
    int* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(int)));
    cudaCheck(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

static int* from_device_i(const int* d, size_t n) {
    int* h = (int*)mallocCheck(n * sizeof(int));
    cudaCheck(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    return h;
}

// NaN in every byte pattern of floatX and float: an output element nobody writes fails its check
static void poison(void* d, size_t bytes) { cudaCheck(cudaMemset(d, 0xFF, bytes)); }

// ||got - ref|| / ||ref|| against a double reference; NaN or Inf anywhere fails
static void check_close(const char* what, const float* got, const double* ref, size_t n, double tol) {
    double num = 0.0, den = 0.0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        finite &= isfinite(got[i]) != 0;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double e = finite ? (den > 0.0 ? sqrt(num / den) : sqrt(num)) : INFINITY;
    int ok = e <= tol;
    printf("%s %s: rel err %.2e (tol %.1e)\n", ok ? "  ok  " : " FAIL ", what, e, tol);
    if (ok) { n_passed++; } else { n_failed++; }
}

// a check without a tolerance: it holds or not
static void check_true(const char* what, int ok) {
    printf("%s %s\n", ok ? "  ok  " : " FAIL ", what);
    if (ok) { n_passed++; } else { n_failed++; }
}

// got must hold exactly want's values (NaN never matches)
static void check_exact(const char* what, const float* got, const float* want, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) { bad += !(got[i] == want[i]); }
    char msg[300];
    snprintf(msg, sizeof(msg), "%s: %zu of %zu differ", what, bad, n);
    check_true(msg, bad == 0);
}

// What an accumulating kernel added to a device buffer that held `before` (after - before, exact
// to fp32's rounding of the sum) against the reference: a kernel that overwrote instead of
// adding leaves -before in the difference.
static void check_accumulated(const char* what, const float* d_after, const float* before, const double* ref, size_t n,
                              double tol) {
    float* after = from_device_f(d_after, n);
    for (size_t e = 0; e < n; e++) { after[e] -= before[e]; }
    check_close(what, after, ref, n, tol);
    free(after);
}

// median of `reps` timed runs of fn (after 3 warm-ups), in ms, with CUDA events on main_stream
template <typename F>
static double time_ms(F fn, int reps) {
    cudaEvent_t t0, t1;
    cudaCheck(cudaEventCreate(&t0));
    cudaCheck(cudaEventCreate(&t1));
    for (int i = 0; i < 3; i++) { fn(); }
    double* times = (double*)mallocCheck(reps * sizeof(double));
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(t0, main_stream));
        fn();
        cudaCheck(cudaEventRecord(t1, main_stream));
        cudaCheck(cudaEventSynchronize(t1));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, t0, t1));
        times[i] = ms;
    }
    for (int i = 1; i < reps; i++) {  // insertion sort: reps is small
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) { double t = times[j]; times[j] = times[j - 1]; times[j - 1] = t; }
    }
    double med = times[reps / 2];
    free(times);
    cudaCheck(cudaEventDestroy(t0));
    cudaCheck(cudaEventDestroy(t1));
    return med;
}

#endif  // DEV_CUDA_COMMON_H
