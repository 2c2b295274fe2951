/*
dev/bench_gemm.c: the CPU trainer's matrix products (train_vla.c's gemm_acc, what train_vla_cpu
and libvla.so run) at the smolvla preset's shapes, in GFLOP/s: each Linear's forward
(x @ W^T), its input gradient (dy @ W) and its weight gradient (dy^T @ x). dev/bench_gemm.sh runs
it beside PyTorch on the same shapes and threads.

    make dev/bench_gemm && dev/bench_gemm [--threads N] [--reps N] [--rows-scale X]

Each line: the layer, M x K x N of the product, its kind and the median GFLOP/s of --reps runs
(after one warm-up). --rows-scale multiplies the rows (the tokens of the batch: 1 is one sample).
The first line names the tile train_vla.c chose for this CPU and its ceiling: every thread
multiplying one pair of panels that stay in its L1 cache over and over (no packing, no memory
traffic), the most these products could reach on these cores and threads.
*/
#define VLA_LIBRARY
#include "../train_vla.c"

// One Linear of the smolvla preset: rows (tokens of one sample), in, out
typedef struct { const char* name; int rows, in, out; } BenchLinear;
// GFLOP/s of the tile alone on all threads, each with its own L1-resident panels, for ~0.5 s
static double tile_ceiling(const GemmKernel* g) {
    int kc = GEMM_KC, reps = 1;
    double seconds = 0.0;
    while (seconds < 0.5 && reps < (1 << 28)) {
        reps *= 4;
        double t0 = wall_seconds();
        #pragma omp parallel
        {
            float* a = (float*)aligned_alloc(64, sizeof(float) * g->mr * kc);
            float* b = (float*)aligned_alloc(64, sizeof(float) * g->nr * kc);
            float* c = (float*)aligned_alloc(64, sizeof(float) * g->mr * g->nr);
            if (a != NULL && b != NULL && c != NULL) {
                for (int i = 0; i < g->mr * kc; i++) { a[i] = 1e-3f * (float)(i % 7); }
                for (int i = 0; i < g->nr * kc; i++) { b[i] = 1e-3f * (float)(i % 5); }
                memset(c, 0, sizeof(float) * g->mr * g->nr);
                for (int r = 0; r < reps; r++) { g->tile[0](kc, a, b, c, g->nr, c, g->nr, g->mr, g->nr); }
                if (c[0] == 12345.0f) { printf(" "); }  // (the sums are used)
            }
            free(a); free(b); free(c);
        }
        seconds = wall_seconds() - t0;
    }
    return omp_get_max_threads() * 2.0 * g->mr * g->nr * kc * (double)reps / seconds * 1e-9;
}

static const BenchLinear BENCH_LINEARS[] = {
    {"vision qkv/o (1024 patches)", 1024, 768, 768},
    {"vision fc1", 1024, 768, 3072},
    {"vision fc2", 1024, 3072, 768},
    {"connector (64 tokens)", 64, 12288, 960},
    {"vlm q/o (113 prefix tokens)", 113, 960, 960},
    {"vlm k/v", 113, 960, 320},
    {"vlm gate/up", 113, 960, 2560},
    {"vlm down", 113, 2560, 960},
    {"expert gate/up (50 actions)", 50, 720, 2048},
    {"expert down", 50, 2048, 720},
};

int main(int argc, char** argv) {
    int threads = 0, reps = 5;
    double scale = 1.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) { threads = atoi(argv[i + 1]); }
        else if (strcmp(argv[i], "--reps") == 0) { reps = atoi(argv[i + 1]); }
        else if (strcmp(argv[i], "--rows-scale") == 0) { scale = atof(argv[i + 1]); }
        else { fprintf(stderr, "error: unknown option %s: use --threads N, --reps N, --rows-scale X\n", argv[i]); return 1; }
    }
    if (threads > 0) { omp_set_num_threads(threads); }
    if (reps < 1 || reps > 1000 || !(scale > 0.0)) { fprintf(stderr, "error: --reps 1..1000, --rows-scale > 0\n"); return 1; }
    const GemmKernel* kernel = gemm_kernel();
    printf("train_vla.c gemm_acc, %d threads, median of %d; tile %s, its ceiling %.1f GFLOP/s\n",
           omp_get_max_threads(), reps, kernel->name, tile_ceiling(kernel));
    for (size_t l = 0; l < sizeof(BENCH_LINEARS) / sizeof(BENCH_LINEARS[0]); l++) {
        const BenchLinear* L = &BENCH_LINEARS[l];
        int M = (int)(L->rows * scale + 0.5), C = L->in, OC = L->out;
        if (M < 1) { M = 1; }
        float* x = (float*)mallocCheck((size_t)M * C * sizeof(float));
        float* w = (float*)mallocCheck((size_t)OC * C * sizeof(float));
        float* y = (float*)mallocCheck((size_t)M * OC * sizeof(float));
        float* dx = (float*)mallocCheck((size_t)M * C * sizeof(float));
        float* dw = (float*)mallocCheck((size_t)OC * C * sizeof(float));
        for (size_t i = 0; i < (size_t)M * C; i++) { x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f; }
        for (size_t i = 0; i < (size_t)OC * C; i++) { w[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f; }
        for (size_t i = 0; i < (size_t)M * OC; i++) { y[i] = (float)((i * 9176u) % 1000) * 1e-3f - 0.5f; }
        const char* kinds[3] = {"forward x@W^T", "input grad dy@W", "weight grad dy^T@x"};
        for (int kind = 0; kind < 3; kind++) {
            double t[1001];
            for (int r = 0; r <= reps; r++) {
                double t0 = wall_seconds();
                if (kind == 0) { gemm_acc(y, x, 0, w, 1, M, C, OC); }
                else if (kind == 1) { gemm_acc(dx, y, 0, w, 0, M, OC, C); }
                else { gemm_acc(dw, y, 1, x, 0, OC, M, C); }
                t[r] = wall_seconds() - t0;
            }
            qsort(t + 1, (size_t)reps, sizeof(double), compare_doubles);  // (t[0]: the warm-up)
            double med = t[1 + reps / 2], flop = 2.0 * M * C * OC;
            printf("%-28s %5d x %5d x %5d  %-19s %8.1f GFLOP/s\n", L->name, kind == 2 ? OC : M,
                   kind == 0 ? C : kind == 1 ? OC : M, kind == 1 ? C : kind == 0 ? OC : C, kinds[kind],
                   flop / med * 1e-9);
        }
        free(x); free(w); free(y); free(dx); free(dw);
    }
    return 0;
}
