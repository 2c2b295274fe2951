/*
vla/cuda/profiler.cuh: the step profiler of train_vla.cu (--profile STEP, and the policy library's
VLA_PROFILE_ACT): where one training step's or one sampling call's GPU time goes, by phase,
by operation and by shape. It owns the marks (events on main_stream, with the host's clock),
their report, and the names the model code calls: prof_phase at each phase, a ProfOp for the
scope of each named operation, prof_begin / prof_stop / prof_end around the profiled work,
prof_free at the end. Off, each of those is one branch.

Included by train_vla.cu after its launchers' state (main_stream) and before the first
operation that marks itself; it uses cudaCheck, mallocCheck, vla_fail and wall_seconds from
train_vla.cu and vla/common.h.
*/
#ifndef VLA_PROFILER_CUH
#define VLA_PROFILER_CUH

#include "common.cuh"

#include <exception>

// ---- the step profiler (--profile STEP): where one training step's GPU time goes
// Marks are events on main_stream. The time from one mark to the next is charged to the phase
// (vision forward, VLM backward, optimizer, ...) and the operation the first mark names (a matrix
// product, attention, a norm; "other kernels" for what runs between named ones). All of a step's
// kernels run on main_stream (NCCL's on a stream main_stream waits for: the wait is charged where
// it happens), so the marks tile the step's GPU time. Products and attention record their FLOPs
// and shapes too, for TFLOP/s per shape. Off (one branch per call) except in the profiled step.
struct ProfMark {
    const char* phase;
    const char* op;   // NULL: the kernels between named operations
    double flops;     // a product's or an attention call's, else 0
    char shape[64];   // its sizes
    double host;      // the host's clock when it was recorded (s)
};
struct Profiler {
    int on;
    int stopped;  // recording ended (prof_stop), the report not yet printed (prof_end)
    int depth;  // ProfOps open: only the outermost marks (attention's products are attention's)
    const char* phase;
    int n, cap;
    ProfMark* marks;
    cudaEvent_t* events;  // marks[i] was recorded by events[i]
};
static thread_local Profiler prof = {0, 0, 0, "step", 0, 0, NULL, NULL};

static void prof_mark(const char* op, double flops = 0.0, const char* shape = NULL) {
    if (!prof.on) { return; }
    if (prof.n == prof.cap) {
        int cap = prof.cap > 0 ? 2 * prof.cap : 4096;
        prof.marks = (ProfMark*)realloc(prof.marks, cap * sizeof(ProfMark));
        prof.events = (cudaEvent_t*)realloc(prof.events, cap * sizeof(cudaEvent_t));
        if (prof.marks == NULL || prof.events == NULL) { vla_fail("--profile: out of host memory for %d marks", cap); }
        for (int i = prof.cap; i < cap; i++) { cudaCheck(cudaEventCreate(&prof.events[i])); }
        prof.cap = cap;
    }
    ProfMark* k = &prof.marks[prof.n];
    k->phase = prof.phase;
    k->op = op;
    k->flops = flops;
    snprintf(k->shape, sizeof(k->shape), "%s", shape != NULL ? shape : "");
    k->host = wall_seconds();
    cudaCheck(cudaEventRecord(prof.events[prof.n++], main_stream));
}

// What runs from here on belongs to `phase` (a string literal)
static void prof_phase(const char* phase) {
    if (!prof.on) { return; }
    prof.phase = phase;
    prof_mark(NULL);
}

// An operation for the scope of this object: its launches (and those of operations it calls) are
// charged to `op`. The policy library's failures are C++ exceptions (vla/common.h's vla_catch_call):
// a scope left by one marks nothing (a throw while one is in flight would end the process), and a
// failed mark at a scope's normal end may throw.
struct ProfOp {
    ProfOp(const char* op, double flops = 0.0, const char* shape = NULL) {
        if (prof.depth++ == 0) { prof_mark(op, flops, shape); }
    }
    ~ProfOp() noexcept(false) {
        if (--prof.depth == 0 && std::uncaught_exceptions() == 0) { prof_mark(NULL); }
    }
};

static void prof_begin(void) {
    prof.on = 1;
    prof.n = 0;
    prof_phase("step");
}

static void prof_free(void) {
    for (int i = 0; i < prof.cap; i++) { cudaCheck(cudaEventDestroy(prof.events[i])); }
    free(prof.marks);
    free(prof.events);
    prof = Profiler{0, 0, 0, "step", 0, 0, NULL, NULL};
}

// One row of a report: the marks whose phase and op (or op and shape) match, summed
struct ProfRow {
    const char* phase;
    const char* op;
    const char* shape;
    int calls;
    double ms, flops;
    double host_ms;  // the host's time issuing the row's work: near ms where the GPU waited for launches
};

static int prof_row_cmp(const void* a, const void* b) {
    double x = ((const ProfRow*)a)->ms, y = ((const ProfRow*)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

// The row of rows[0..*n) for this key (added if new)
static ProfRow* prof_row(ProfRow* rows, int* n, const char* phase, const char* op, const char* shape) {
    for (int i = 0; i < *n; i++) {
        if (strcmp(rows[i].phase, phase) == 0 && strcmp(rows[i].op, op) == 0 && strcmp(rows[i].shape, shape) == 0) {
            return &rows[i];
        }
    }
    rows[*n] = ProfRow{phase, op, shape, 0, 0.0, 0.0, 0.0};
    return &rows[(*n)++];
}

// rows (sorted) as a table: `first` and `second` name the columns shown of phase, op, shape
static void prof_print(const ProfRow* rows, int n, int max_rows, double total_ms, const char* first,
                       const char* second) {
    printf("| %-16s |", first);
    if (second != NULL) { printf(" %-36s |", second); }
    printf(" %6s | %9s | %6s | %7s | %9s |\n|---|%s ---:| ---:| ---:| ---:| ---:|\n", "calls", "ms", "step", "TFLOP/s",
           "host ms", second != NULL ? "---|" : "");
    double rest = 0.0;
    for (int i = 0; i < n; i++) {
        const ProfRow* r = &rows[i];
        if (i >= max_rows) {
            rest += r->ms;
            continue;
        }
        char tf[16] = "";
        if (r->flops > 0.0 && r->ms > 0.0) { snprintf(tf, sizeof(tf), "%.1f", r->flops / (r->ms * 1e9)); }
        const char* cols[3] = {r->phase, r->op, r->shape};
        const char* a = cols[strcmp(first, "phase") == 0 ? 0 : 1];
        printf("| %-16s |", a);
        if (second != NULL) { printf(" %-36s |", cols[strcmp(second, "operation") == 0 ? 1 : 2]); }
        printf(" %6d | %9.3f | %5.1f%% | %7s | %9.3f |\n", r->calls, r->ms, 100.0 * r->ms / total_ms, tf, r->host_ms);
    }
    if (n > max_rows) { printf("(%d more rows, %.1f%% of the step)\n", n - max_rows, 100.0 * rest / total_ms); }
}

// Stops recording, waits for the step and prints its GPU time by phase and operation, then the
// products and attention calls by shape. wall_ms: the step's wall time on the host.
// Ends the recording where the profiled work ends (the training loop: before a checkpoint is
// written, which is not the step's); prof_end prints later
static void prof_stop(void) {
    if (!prof.on) { return; }
    prof_phase("end");
    prof.on = 0;
    prof.stopped = 1;
}

static void prof_end(const char* what, int index, double wall_ms) {
    prof_stop();
    if (!prof.stopped) { return; }
    prof.stopped = 0;
    cudaCheck(cudaEventSynchronize(prof.events[prof.n - 1]));
    int n = prof.n - 1;  // intervals
    ProfRow* by_phase = (ProfRow*)mallocCheck((size_t)n * sizeof(ProfRow));
    ProfRow* by_op = (ProfRow*)mallocCheck((size_t)n * sizeof(ProfRow));
    ProfRow* by_shape = (ProfRow*)mallocCheck((size_t)n * sizeof(ProfRow));
    int n_phase = 0, n_op = 0, n_shape = 0;
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, prof.events[i], prof.events[i + 1]));
        const ProfMark* k = &prof.marks[i];
        const char* op = k->op != NULL ? k->op : "other kernels";
        ProfRow* rows[3] = {prof_row(by_phase, &n_phase, k->phase, "", ""), prof_row(by_op, &n_op, k->phase, op, ""),
                            k->flops > 0.0 ? prof_row(by_shape, &n_shape, "", op, k->shape) : NULL};
        for (int r = 0; r < 3; r++) {
            if (rows[r] == NULL) { continue; }
            rows[r]->calls += k->op != NULL;
            rows[r]->ms += ms;
            rows[r]->flops += k->flops;
            rows[r]->host_ms += 1000.0 * (prof.marks[i + 1].host - k->host);
        }
        total += ms;
    }
    qsort(by_phase, n_phase, sizeof(ProfRow), prof_row_cmp);
    qsort(by_op, n_op, sizeof(ProfRow), prof_row_cmp);
    qsort(by_shape, n_shape, sizeof(ProfRow), prof_row_cmp);
    printf("\nprofile of %s %d: %.3f ms of GPU time from its first mark to its last (%.1f ms on the host's clock, "
           "%d marks; host ms: the host's time between the same marks, issuing the work: near ms, the GPU waited for "
           "launches)\nby phase (calls: the named operations in it):\n", what, index, total, wall_ms, prof.n);
    prof_print(by_phase, n_phase, n_phase, total, "phase", NULL);
    printf("\nby phase and operation (\"other kernels\": the elementwise and small kernels between named ones):\n");
    prof_print(by_op, n_op, 40, total, "phase", "operation");
    printf("\nthe products (cuBLASLt's m x n x k, column-major, op(A) op(B)) and attention calls (FLOPs as if "
           "unmasked) by shape:\n");
    prof_print(by_shape, n_shape, 40, total, "operation", "shape");
    printf("\n");
    free(by_phase);
    free(by_op);
    free(by_shape);
}

#endif  // VLA_PROFILER_CUH
