/*
glu.h: what swiglu.cu and geglu.cu share, the two gated activations of an MLP (act = a(gate) up):
the checks of every version against a double reference on fresh random inputs (outputs poisoned
first), and the benchmark. Each program describes its activation as a Glu: its launchers per
version (0: the trainer's, at BLOCK; 1 and 2 at a block size), its references, the gates' range
and four gate values at the activation's edges.
*/
#ifndef DEV_CUDA_GLU_H
#define DEV_CUDA_GLU_H
#include "common.h"

// floatX outputs carry its rounding: bf16 keeps 8 significant bits (2^-8 = 3.9e-3 per value);
// in fp32 builds only fp32 arithmetic (the activation, the products) separates kernel and reference
static const double TOL_X = sizeof(floatX) == 4 ? 1e-5 : 1e-2;

static const int BLOCKS[] = {32, 64, 128, 256, 512, 1024};
static const int N_BLOCKS = sizeof(BLOCKS) / sizeof(BLOCKS[0]);

typedef void (*GluForward)(floatX* act, const floatX* gate, const floatX* up, size_t n, int block);
typedef void (*GluBackward)(floatX* dgate, floatX* dup, const floatX* dact, const floatX* gate, const floatX* up,
                            size_t n, int block);
typedef struct {
    GluForward forward[3];    // versions 0 (the trainer's launcher: block unused), 1, 2
    GluBackward backward[3];
    void (*forward_reference)(double* act, const float* gate, const float* up, size_t n);
    void (*backward_reference)(double* dgate, double* dup, const float* dact, const float* gate, const float* up,
                               size_t n);
    float gate_range;  // gates drawn in [-range, range]
    float edges[4];    // the first four gates: where the activation's arithmetic saturates or overflows
} Glu;

// Every version that takes n (version 2 and the launcher: whole 16-byte packs) at every block size
static void glu_check_size(const Glu* g, size_t n, uint64_t seed) {
    float* gate = random_floats(n, g->gate_range, seed);
    float* up = random_floats(n, 2.0f, seed + 1);
    float* dact = random_floats(n, 1.0f, seed + 2);
    for (size_t k = 0; k < 4 && n >= 4; k++) { gate[k] = g->edges[k]; }  // both must stay finite there
    floatX* d_gate = to_device_x(gate, n);
    floatX* d_up = to_device_x(up, n);
    floatX* d_dact = to_device_x(dact, n);
    double* ref_act = (double*)mallocCheck(n * sizeof(double));
    double* ref_dgate = (double*)mallocCheck(n * sizeof(double));
    double* ref_dup = (double*)mallocCheck(n * sizeof(double));
    g->forward_reference(ref_act, gate, up, n);
    g->backward_reference(ref_dgate, ref_dup, dact, gate, up, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
    int v2 = n % x128::size == 0;
    for (int version = 0; version <= 2; version++) {
        if (version != 1 && !v2) { continue; }  // the trainer's launcher runs version 2
        for (int bi = 0; bi < (version == 0 ? 1 : N_BLOCKS); bi++) {
            char what[120], item[160];
            if (version == 0) {
                snprintf(what, sizeof(what), "launcher (n %zu)", n);
            } else {
                snprintf(what, sizeof(what), "v%d (n %zu) block %d", version, n, BLOCKS[bi]);
            }
            poison(act, n * sizeof(floatX));
            g->forward[version](act, d_gate, d_up, n, BLOCKS[bi]);
            float* got = from_device_x(act, n);
            snprintf(item, sizeof(item), "%s forward: act", what);
            check_close(item, got, ref_act, n, TOL_X);
            free(got);

            poison(dgate, n * sizeof(floatX));
            poison(dup, n * sizeof(floatX));
            g->backward[version](dgate, dup, d_dact, d_gate, d_up, n, BLOCKS[bi]);
            float* got_dgate = from_device_x(dgate, n);
            float* got_dup = from_device_x(dup, n);
            snprintf(item, sizeof(item), "%s backward: dgate", what);
            check_close(item, got_dgate, ref_dgate, n, TOL_X);
            snprintf(item, sizeof(item), "%s backward: dup", what);
            check_close(item, got_dup, ref_dup, n, TOL_X);
            free(got_dgate); free(got_dup);
        }
    }
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    cudaCheck(cudaFree(d_gate)); cudaCheck(cudaFree(d_up)); cudaCheck(cudaFree(d_dact));
    free(gate); free(up); free(dact); free(ref_act); free(ref_dgate); free(ref_dup);
}

// Versions 1 and 2 at every block size on (N, F): time and achieved bandwidth
static void glu_benchmark_shape(const Glu* g, const char* name, int N, int F) {
    size_t n = (size_t)N * F;
    float* h = random_floats(n, 3.0f, 7);
    floatX* gate = to_device_x(h, n);
    floatX* up = to_device_x(h, n);
    floatX* dact = to_device_x(h, n);
    floatX *act, *dgate, *dup;
    cudaCheck(cudaMalloc(&act, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dgate, n * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dup, n * sizeof(floatX)));
    for (int version = 1; version <= 2; version++) {
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { g->forward[version](act, gate, up, n, block); }, 20);
            printf("bench v%d forward  %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block, ms,
                   3.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // gate, up read; act written
        }
        for (int block = 64; block <= 1024; block *= 2) {
            double ms = time_ms([&]() { g->backward[version](dgate, dup, dact, gate, up, n, block); }, 20);
            printf("bench v%d backward %s (N %d, F %d) block %4d: %7.3f ms, %7.1f GB/s\n", version, name, N, F, block, ms,
                   5.0 * n * sizeof(floatX) / (ms * 1e-3) / 1e9);  // dact, gate, up read; dgate, dup written
        }
    }
    cudaCheck(cudaFree(gate)); cudaCheck(cudaFree(up)); cudaCheck(cudaFree(dact));
    cudaCheck(cudaFree(act)); cudaCheck(cudaFree(dgate)); cudaCheck(cudaFree(dup));
    free(h);
}

#endif  // DEV_CUDA_GLU_H
