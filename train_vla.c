/*
train_vla.c: the CPU reference trainer of LeRobot's robot policies, in C with OpenMP: today SmolVLA
and pi0, two families of one model (the flow_ section: a VLM and an action expert trained by flow
matching). Same models, same sections and same checkpoints as train_vla.cu; dev/model.py (the
PyTorch oracle, dev/smolvla.py's math) is the third, independent copy that test_vla.c checks both
against, and LeRobot 0.6.1's own SmolVLA (dev/lerobot) the ground truth of all three.

Tensor-shape legend:
  B   samples (per rank)               H   chunk: action tokens
  NV  images (cameras x samples)       S   image side; p patch; G = S/p; Nv = G*G patches per image
  Cv  SigLIP width; Fv its MLP width   s   pixel-shuffle factor; NI = Nv/s^2 image tokens per camera
  C   VLM width; F its MLP width       Ce  expert width; Fe its MLP width
  NH  query heads; NKV key/value heads (GQA); HS head size; D = NH*HS; KV = NKV*HS
  Np  prefix tokens: [images][max_text language tokens][state]; T = Np + H
  V / P / R   vision rows (NV*Nv), prefix rows (B*Np), action rows (B*H)
  Smax / Amax  state_proj's / action_in_proj's padded widths; S_d / A the dataset's dims

Invariants worth knowing before reading:
- One parameter table (vla/config.h's FLOW_PARAMETERS) drives everything. What trains is its `train`
  column under the run's --train mode (expert, vlm, all): the trainable part of every tensor is a
  prefix of it (flow_trainable_numel). Frozen elements get no gradient, no AdamW moments and
  never change; the moments of the trainable ones are packed in table order (FlowOptDomain), and
  that packed domain is what ZeRO-1 shards and what a checkpoint's m and v hold.
- The prefix never sees the actions: the VLM runs first over the prefix and keeps its keys/values
  per layer, the expert attends to them (joint layers) or to their re-projection (cross layers).
  Sampling reuses them across its 10 Euler steps. Backward runs the expert first, which deposits
  gradients into the VLM's keys/values, then the VLM, only as far down as something trains.
- Linear weights are (out, in); y = x W^T + b, as torch.nn.Linear.
- The loss is LeRobot's: the squared error over the dataset's A action dims of the chunk slots
  inside the episode, divided by the number of those entries (not by B H A). A training step
  normalizes by the entries of the whole step (every simulated rank and micro-step), as
  train_vla.cu does, so -g N -b B/N and -g 1 -b B take the same step.

Reproduce the oracle's numbers (what test_vla checks):
  make test     (data/synthetic writes build/test/{a,b,s}.bin, dev/model.py the debug states and
                 a_train.txt, dev/lerobot LeRobot's references, then ./test_vla build/test build/lerobot_ref)
  build/venv/bin/python dev/model.py -i build/test/a.bin -p tiny --dtype float64 -b 4 --seed 1337 --train 5 \
      -n 5 -l 1e-3 -u 2 -w 0.1 -c 0.5 --train-mode all     (the losses of ./train_vla_cpu -p tiny -b 4 ...)
*/
#include "vla/common.h"            // defines: vla_fail, mallocCheck, vla_catch_call, paths and checked sizes
#include "vla/config.h"            // defines: FlowConfig, its presets and parameter table, the row counts
#include "vla/shards.h"            // defines: Shard: the data shards, memory-mapped and checked
#include "vla/dataset.h"           // defines: Dataset, Batch and its layout, ModelInputs
#include "vla/sampler.h"           // defines: the global sampler, --balance tasks' TaskBalance
#include "vla/loader.h"            // defines: Loader: batches assembled by worker threads into a ring
#include "vla/checkpoint.h"        // defines: Checkpoint: the checkpoint file, written and read
#include "vla/cli.h"               // defines: TrainArgs: the command line
#include "vla/schedule.h"          // defines: the learning-rate schedule
#include "vla/logging.h"           // defines: Logger: log.jsonl and the progress line
#include "vla/runs.h"              // defines: the run folder, resume, checkpoints kept, the config table
#include "vla/run_record.h"        // defines: run.json, the run's settings, and -y 1 continuing with them
#include "vla/evaluation.h"        // defines: --eval-every, evaluations in the background while the run trains
#include "vla/policy.h"            // defines: the policy libraries' C ABI, shared by both
#include <omp.h>
#include <signal.h>

// ----------------------------------------------------------------------------
// utilities

// e^x to within 2 ulp of expf, in arithmetic alone, so that the compiler vectorizes the loops
// that call it (libm's expf is a call per value): x = n ln 2 + r with n the nearest integer to
// x / ln 2 (adding and removing 1.5 * 2^23 rounds it) and |r| <= ln(2) / 2, e^r by its degree-7
// Taylor-minimax polynomial, times 2^n built in the exponent's bits. Below -87.3 (e^x under
// float's smallest normal, which a softmax or sigmoid cannot tell from 0) it returns 0 (so
// exp(-inf) = 0), above 88.7 infinity, and NaN for NaN.
static inline float vla_expf(float x) {
    float xc = x > -87.33654f ? x : -87.33654f;  // (NaN takes the lower bound here, and stays NaN below)
    xc = xc < 88.72283f ? xc : 88.72283f;
    float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // (ln 2 in two parts: the first exact times n)
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int ni = (int)n, half = ni >> 1;  // 2^n as 2^half 2^(n - half): both normal for n in -126 .. 128
    int bits0 = (half + 127) << 23, bits1 = (ni - half + 127) << 23;
    float s0, s1;
    memcpy(&s0, &bits0, sizeof(s0));
    memcpy(&s1, &bits1, sizeof(s1));
    float y = p * s0 * s1 + (x - x);  // (+ 0, or NaN for NaN: no branch, which would change what vectorizes)
    return x < -87.33654f ? 0.0f : (x > 88.72283f ? INFINITY : y);
}

// tanh u = 1 - 2 / (e^2u + 1): exact at both ends (e^2u = 0 or infinity), within 1e-7 near 0
static inline float vla_tanhf(float u) { return 1.0f - 2.0f / (vla_expf(2.0f * u) + 1.0f); }

static inline float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + vla_tanhf(k * (x + 0.044715f * x * x * x)));
}

static inline float gelu_tanh_grad(float x) {
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x);
    float th = vla_tanhf(u);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

static inline float silu(float x) { return x / (1.0f + vla_expf(-x)); }

// ----------------------------------------------------------------------------
// kernels: forward and backward of every operation. Backward kernels accumulate (+=) into
// parameter gradients and into input gradients unless said otherwise.

// C (M, N) += op(A) @ op(B), or C = op(A) @ op(B) + a bias row (or none), row-major, where op(A)
// (M, K) is A or, with ta, the transpose of an A stored (K, M), and op(B) (K, N) is B or, with tb,
// the transpose of a B stored (N, K) (a Linear's weight). Goto's blocking: for each block of
// GEMM_KC steps of k, op(A) and op(B) are packed into panels of mr rows and of nr columns, k by k
// (zeros past M and N), and each pair of panels accumulates an mr x nr tile of C in registers: per
// k, two vectors of the B panel and mr broadcasts of A, 2 mr fused multiply-adds on 2 mr vector
// accumulators. The tile is sized for the CPU found at run time: 12 x 32 (24 of AVX-512's 32
// registers of 16 floats), 6 x 16 (12 of AVX2's 16 of 8), or 6 x 16 in the compiler's vector
// extensions for the target it builds for (the portable one); a last panel of few rows runs a tile
// of a third or two thirds of the rows. Every output sums its k blocks in order (the first onto C,
// or onto its bias or zero) and each block in k order, one fused multiply-add a step, so the result
// is the same for any thread count, any way of sharing the work, and either x86 tile.
#define GEMM_KC 256
#define GEMM_MC 192          // rows of op(A) a block (a multiple of every tile's mr)
#define GEMM_NC_PANELS 16    // column panels of op(B) a block (512 KiB of the AVX-512 tile's)
#define GEMM_FEW_ROWS 96     // products of at most this many rows pack op(A) in every thread
typedef float gemm_v8 __attribute__((vector_size(32)));
typedef int gemm_i8 __attribute__((vector_size(32)));
typedef float gemm_v16 __attribute__((vector_size(64)));
typedef void (*GemmTileFn)(int kc, const float* a, const float* b, float* c, int ldc, const float* init, int ldi,
                           int mr, int nr);
typedef struct { int mr, nr; GemmTileFn tile[3]; const char* name; } GemmKernel;  // (tile: see gemm_tile_for)

// The tile function for vector type VT of VL floats, panels of MR rows, ROWS of them computed (MR,
// or fewer for the last panel of a product whose rows it does not fill): C[0:mr, 0:nr] (row stride
// ldc) = init (row stride ldi: C itself to accumulate, a bias row or zeros at stride 0) + the panel
// pair's product over kc steps; an edge tile stores its valid part alone.
#define GEMM_TILE(NAME, ATTR, VT, VL, MR, ROWS)                                                  \
    ATTR static void NAME(int kc, const float* a, const float* b, float* c, int ldc, const float* init, int ldi, \
                          int mr, int nr) {                                                      \
        VT acc[ROWS][2];                                                                         \
        for (int i = 0; i < ROWS; i++) { acc[i][0] = acc[i][1] = (VT){0}; }                     \
        for (int i = 0; i < mr; i++) { /* C's rows arrive while the panels are multiplied */      \
            __builtin_prefetch(c + (size_t)i * ldc, 1);                                          \
            __builtin_prefetch(c + (size_t)i * ldc + 2 * VL - 1, 1);                             \
        }                                                                                        \
        for (int k = 0; k < kc; k++, a += MR, b += 2 * VL) {                                     \
            VT b0, b1;                                                                           \
            memcpy(&b0, b, sizeof(b0));                                                          \
            memcpy(&b1, b + VL, sizeof(b1));                                                     \
            for (int i = 0; i < ROWS; i++) {                                                     \
                acc[i][0] += a[i] * b0;                                                          \
                acc[i][1] += a[i] * b1;                                                          \
            }                                                                                    \
        }                                                                                        \
        if (mr == ROWS && nr == 2 * VL) {                                                        \
            for (int i = 0; i < ROWS; i++) {                                                     \
                VT r0, r1;                                                                       \
                memcpy(&r0, init + (size_t)i * ldi, sizeof(r0));                                 \
                memcpy(&r1, init + (size_t)i * ldi + VL, sizeof(r1));                            \
                r0 += acc[i][0];                                                                 \
                r1 += acc[i][1];                                                                 \
                memcpy(c + (size_t)i * ldc, &r0, sizeof(r0));                                    \
                memcpy(c + (size_t)i * ldc + VL, &r1, sizeof(r1));                               \
            }                                                                                    \
            return;                                                                              \
        }                                                                                        \
        float t[ROWS][2 * VL];                                                                   \
        memcpy(t, acc, sizeof(t));                                                               \
        for (int i = 0; i < mr; i++) {                                                           \
            for (int j = 0; j < nr; j++) { c[(size_t)i * ldc + j] = init[(size_t)i * ldi + j] + t[i][j]; } \
        }                                                                                        \
    }
// each family's tiles of all MR rows, two thirds and a third of them
#define GEMM_TILES(NAME, ATTR, VT, VL, MR)                \
    GEMM_TILE(NAME##_full, ATTR, VT, VL, MR, MR)          \
    GEMM_TILE(NAME##_two_thirds, ATTR, VT, VL, MR, MR * 2 / 3) \
    GEMM_TILE(NAME##_third, ATTR, VT, VL, MR, MR / 3)
GEMM_TILES(gemm_tile_portable, , gemm_v8, 8, 6)
#if defined(__x86_64__) && defined(__GNUC__)
GEMM_TILES(gemm_tile_avx2, __attribute__((target("avx2,fma"))), gemm_v8, 8, 6)
GEMM_TILES(gemm_tile_avx512, __attribute__((target("avx512f,fma"))), gemm_v16, 16, 12)
#endif
#define GEMM_KERNEL(MR, NR, NAME, TEXT) {MR, NR, {NAME##_full, NAME##_two_thirds, NAME##_third}, TEXT}

// The tile that computes a panel of mr valid rows: the one of the fewest rows that covers them
static inline GemmTileFn gemm_tile_for(const GemmKernel* g, int mr) {
    return g->tile[mr <= g->mr / 3 ? 2 : mr <= g->mr * 2 / 3 ? 1 : 0];
}

// The tiles this CPU can run, best first (i = 0, 1, ...; NULL past the last): gemm_kernel() is
// the first, the others are there for the tests, which hold every one to the same bits.
static const GemmKernel* gemm_kernel_at(int i) {
    static const GemmKernel portable = GEMM_KERNEL(6, 16, gemm_tile_portable, "portable 6x16");
    const GemmKernel* found[3];
    int n = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    static const GemmKernel avx2 = GEMM_KERNEL(6, 16, gemm_tile_avx2, "AVX2 6x16");
    static const GemmKernel avx512 = GEMM_KERNEL(12, 32, gemm_tile_avx512, "AVX-512 12x32");
    if (__builtin_cpu_supports("avx512f")) { found[n++] = &avx512; }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { found[n++] = &avx2; }
#endif
    found[n++] = &portable;
    return i >= 0 && i < n ? found[i] : NULL;
}
static const GemmKernel* gemm_kernel(void) { return gemm_kernel_at(0); }

// Eight lines of eight values (x[i][k]) transposed in registers into d + k * R (k = 0..7), the
// vector shuffles' three rounds: pairs of values, pairs of pairs, then halves; the first n of
// each transposed vector are stored (n < 8: a panel's last lines, the others repeat one of them).
static inline void gemm_transpose8(float* d, int R, const float* const* line, int k, int n) {
    gemm_v8 x[8], t[8], u[8];
    for (int i = 0; i < 8; i++) { memcpy(&x[i], line[i] + k, sizeof(x[i])); }
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(x[i], x[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(x[i], x[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {  // values k, k + 4 of lines i .. i + 3; k + 1, k + 5; ...
        u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int j = 0; j < 4; j++) {
        gemm_v8 first = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        gemm_v8 second = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        if (n == 8) {
            memcpy(d + (size_t)j * R, &first, sizeof(first));
            memcpy(d + (size_t)(j + 4) * R, &second, sizeof(second));
        } else if (n == 4) {
            memcpy(d + (size_t)j * R, &first, 4 * sizeof(float));
            memcpy(d + (size_t)(j + 4) * R, &second, 4 * sizeof(float));
        } else {
            for (int i = 0; i < n; i++) { d[(size_t)j * R + i] = first[i]; d[(size_t)(j + 4) * R + i] = second[i]; }
        }
    }
}

// Panel p of width R (mr rows of op(A), or nr columns of op(B)) for the k block
// k0..k0+kc, into d: R values a k, zeros past `extent` (M or N). The source holds the panel's R
// lines either along k (line r at src + r * ld, as A's rows or a transposed B's: along_k) or
// across it (step k at src + k * ld, as a transposed A's or B's rows). Lines along k are
// transposed eight by eight.
static inline void gemm_pack(float* d, const float* src, int R, int along_k, int extent, int ld, int p, int k0,
                             int kc) {
    int r0 = p * R, lines = extent - r0 < R ? extent - r0 : R;
    if (lines < R) { memset(d, 0, (size_t)R * kc * sizeof(float)); }
    if (along_k) {
        for (int r = 0; r < lines; r += 8) {
            int n = lines - r < 8 ? lines - r : 8;
            const float* line[8];
            for (int i = 0; i < 8; i++) { line[i] = src + (size_t)(r0 + r + (i < n ? i : n - 1)) * ld + k0; }
            int k = 0;
            for (; k + 8 <= kc; k += 8) { gemm_transpose8(d + (size_t)k * R + r, R, line, k, n); }
            for (; k < kc; k++) {
                for (int i = 0; i < n; i++) { d[(size_t)k * R + r + i] = line[i][k]; }
            }
        }
    } else {
        for (int k = 0; k < kc; k++) {  // (fixed-size copies: inlined, where a copy of `lines` calls memcpy)
            const float* s = src + (size_t)(k0 + k) * ld + r0;
            float* t = d + (size_t)k * R;
            int r = 0;
            for (; r + 8 <= lines; r += 8) { memcpy(t + r, s + r, 8 * sizeof(float)); }
            for (; r < lines; r++) { t[r] = s[r]; }
        }
    }
}

// Scratch memory, one block per thread that computes (freed when the thread ends): the products'
// packed panels, and the attention's scores with their panels. Models computing in two threads at
// once (two policies of libvla.so) never share one. Grown before a parallel region, which no
// failure may leave.
typedef struct { float* buf; size_t cap; } GemmScratch;
static pthread_key_t gemm_key;
static pthread_once_t gemm_key_once = PTHREAD_ONCE_INIT;
static int gemm_key_made = 0;
static void gemm_scratch_free(void* arg) {
    GemmScratch* s = (GemmScratch*)arg;
    free(s->buf);
    free(s);
}
static void gemm_key_make(void) { gemm_key_made = pthread_key_create(&gemm_key, gemm_scratch_free) == 0; }
static float* gemm_scratch(size_t n) {
    pthread_once(&gemm_key_once, gemm_key_make);
    if (!gemm_key_made) { vla_fail("cannot make a thread-specific key for the matrix products' panels: too many in use"); }
    GemmScratch* s = (GemmScratch*)pthread_getspecific(gemm_key);
    if (s == NULL) {
        s = (GemmScratch*)callocCheck(1, sizeof(GemmScratch));
        if (pthread_setspecific(gemm_key, s) != 0) {
            free(s);
            vla_fail_no_memory("out of memory for a thread's matrix-product panels: " VLA_NO_MEMORY_FIX);
        }
    }
    if (n > s->cap) {
        free(s->buf);
        s->buf = NULL;  // (an allocation that fails below leaves none, not the freed one)
        s->cap = 0;
        // 64-byte lines: a panel's vector loads never straddle two
        s->buf = (float*)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (s->buf == NULL) {
            vla_fail_no_memory("out of memory for %zu floats of matrix-product panels: " VLA_NO_MEMORY_FIX, n);
        }
        s->cap = n;
    }
    return s->buf;
}

// How a team of nt threads shares a product, three ways (each output is one tile's sum in the same
// order whichever):
// - GEMM_ROWS: each thread takes a share of op(A)'s row panels and every column. It packs its
//   rows GEMM_MC at a time into its own block, which stays in its core's L2 while used; op(B)'s
//   panels of a k block are packed by the threads together and read by all, so the threads meet
//   once a k block (two buffers of panels alternate). The way when op(A) is the larger to pack.
// - GEMM_COLS: each thread takes a share of op(B)'s column panels and every row, and packs just
//   the column panels it uses; op(A)'s panels of a k block are packed by the threads together and
//   read by all, as above. The way for more than GEMM_FEW_ROWS rows when op(B) is the larger (a
//   prefix's products, the vision MLP's first).
// - GEMM_COLS_OWN_A: the columns shared as in GEMM_COLS, but each thread packs all of op(A), a
//   block at a time as GEMM_ROWS does, so no thread waits for another: the way for at most
//   GEMM_FEW_ROWS rows (the expert's actions), which cost little to pack twice.
enum { GEMM_ROWS, GEMM_COLS, GEMM_COLS_OWN_A };
typedef struct { int way, mp, np, kcmax; size_t a_block, a_panels, b_panels; } GemmPlan;
static GemmPlan gemm_plan(const GemmKernel* g, int M, int K, int N, int nt) {
    GemmPlan p;
    p.mp = (M + g->mr - 1) / g->mr;
    p.np = (N + g->nr - 1) / g->nr;
    p.kcmax = K < GEMM_KC ? K : GEMM_KC;
    p.way = nt <= 1 || M <= GEMM_FEW_ROWS ? GEMM_COLS_OWN_A
            : p.mp >= 2 * nt && (long long)(nt - 1) * M > N ? GEMM_ROWS : GEMM_COLS;
    int block_rows = p.mp * g->mr < GEMM_MC ? p.mp * g->mr : GEMM_MC;
    p.a_block = ((size_t)block_rows * p.kcmax + 15) / 16 * 16;  // (64-byte lines)
    p.a_panels = ((size_t)p.mp * g->mr * p.kcmax + 15) / 16 * 16;
    p.b_panels = ((size_t)p.np * g->nr * p.kcmax + 15) / 16 * 16;
    return p;
}

// Floats of the panels a team of up to nt threads computing this product uses, whichever way it
// shares it: two buffers of op(B)'s panels and two of op(A)'s (the buffers the threads read
// together alternate), and an op(A) block a thread
static size_t gemm_panel_floats(const GemmKernel* g, int M, int K, int N, int nt) {
    GemmPlan p = gemm_plan(g, M, K, N, nt);
    return (p.b_panels + p.a_panels) * 2 + p.a_block * (size_t)(nt > 1 ? nt : 1);
}

// Thread t's share of n items (contiguous, as OpenMP's static schedule)
static inline int share_begin(int n, int t, int nt) { return (int)((long long)n * t / nt); }

// C (row stride ldc) += op(A) op(B), with A and B stored at row strides lda and ldb (so a head's
// columns of a wider matrix are operands too), or with `set`, C = op(A) op(B) + bias (N floats; NULL:
// none; with K = 0, the bias or zeros alone), computed by thread t of a team of nt that all call it
// with the same arguments and the same panels (gemm_panel_floats of them). A team of one needs no
// OpenMP team at all: attention calls it from inside its own parallel loop.
static void gemm_part(const GemmKernel* g, float* C, int ldc, const float* A, int lda, int ta, const float* B,
                      int ldb, int tb, int M, int K, int N, int set, const float* bias, float* panels, int t, int nt) {
    static const float zeros[64] = {0};  // (a row at least as wide as every tile's columns)
    if (K <= 0) {  // (no k block to set C on: thread t sets its share of the rows)
        for (int m = share_begin(M, t, nt); set && m < share_begin(M, t + 1, nt); m++) {
            for (int n = 0; n < N; n++) { C[(size_t)m * ldc + n] = bias != NULL ? bias[n] : 0.0f; }
        }
        return;
    }
    int MR = g->mr, NR = g->nr;
    GemmPlan plan = gemm_plan(g, M, K, N, nt);
    // panels at the stride of a whole k block, so that a thread's panels stay where they are when
    // the last block is shorter (a thread that waits for no other may still be reading its
    // neighbour's columns of the block before)
    size_t astride = (size_t)MR * plan.kcmax, bstride = (size_t)NR * plan.kcmax;
    int shared_a = plan.way == GEMM_COLS, shared_b = plan.way == GEMM_ROWS;
    float* own_a = panels + (plan.b_panels + plan.a_panels) * 2 + plan.a_block * (size_t)t;
    int a0 = shared_b ? share_begin(plan.mp, t, nt) : 0, a1 = shared_b ? share_begin(plan.mp, t + 1, nt) : plan.mp;
    int j0 = shared_b ? 0 : share_begin(plan.np, t, nt), j1 = shared_b ? plan.np : share_begin(plan.np, t + 1, nt);
    for (int k0 = 0, round = 0; k0 < K; k0 += GEMM_KC, round++) {
        int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
        float* pb = panels + (shared_b ? plan.b_panels * (size_t)(round & 1) : 0);
        float* pa = panels + plan.b_panels * 2 + plan.a_panels * (size_t)(round & 1);
        if (shared_b) {
            for (int p = share_begin(plan.np, t, nt); p < share_begin(plan.np, t + 1, nt); p++) {
                gemm_pack(pb + (size_t)p * bstride, B, NR, tb, N, ldb, p, k0, kc);
            }
        }
        if (shared_a) {
            for (int p = share_begin(plan.mp, t, nt); p < share_begin(plan.mp, t + 1, nt); p++) {
                gemm_pack(pa + (size_t)p * astride, A, MR, !ta, M, lda, p, k0, kc);
            }
        }
        if (shared_a || shared_b) {
            #pragma omp barrier
        }
        // GEMM_MC rows of op(A) at a time (their block stays in the core's L2) against
        // GEMM_NC_PANELS column panels at a time (those stay in L2 too): one row panel stays in L1
        // while the column panels stream past it from L2
        for (int i0 = a0; i0 < a1; i0 += GEMM_MC / MR) {
            int i1 = i0 + GEMM_MC / MR < a1 ? i0 + GEMM_MC / MR : a1;
            const float* ablock = shared_a ? pa + (size_t)i0 * astride : own_a;
            for (int p = i0; !shared_a && p < i1; p++) {
                gemm_pack(own_a + (size_t)(p - i0) * astride, A, MR, !ta, M, lda, p, k0, kc);
            }
            for (int jp = j0; !shared_b && i0 == a0 && jp < j1; jp++) {  // (a thread's own column panels)
                gemm_pack(pb + (size_t)jp * bstride, B, NR, tb, N, ldb, jp, k0, kc);
            }
            for (int jb = j0; jb < j1; jb += GEMM_NC_PANELS) {
                int je = jb + GEMM_NC_PANELS < j1 ? jb + GEMM_NC_PANELS : j1;
                for (int ip = i0; ip < i1; ip++) {
                    int m0 = ip * MR, mr = M - m0 < MR ? M - m0 : MR;
                    for (int jp = jb; jp < je; jp++) {
                        int n0 = jp * NR, nr = N - n0 < NR ? N - n0 : NR;
                        const float* init = !set || k0 > 0 ? NULL : bias != NULL ? bias + n0 : zeros;
                        float* c = C + (size_t)m0 * ldc + n0;
                        gemm_tile_for(g, mr)(kc, ablock + (size_t)(ip - i0) * astride, pb + (size_t)jp * bstride, c,
                                             ldc, init != NULL ? init : c, init != NULL ? 0 : ldc, mr, nr);
                    }
                }
            }
        }
    }
}

// gemm_part by a team of nt threads (1: the calling thread alone) on panels sized for nt (OpenMP
// may give fewer)
static void gemm_team(float* C, int ldc, const float* A, int lda, int ta, const float* B, int ldb, int tb, int M,
                      int K, int N, int set, const float* bias, float* panels, int nt) {
    if (M <= 0 || N <= 0) { return; }
    if (nt <= 1) {
        gemm_part(gemm_kernel(), C, ldc, A, lda, ta, B, ldb, tb, M, K, N, set, bias, panels, 0, 1);
        return;
    }
    #pragma omp parallel num_threads(nt)
    gemm_part(gemm_kernel(), C, ldc, A, lda, ta, B, ldb, tb, M, K, N, set, bias, panels, omp_get_thread_num(),
              omp_get_num_threads());
}

// C (M, N) += op(A) op(B) (gemm_acc), or = op(A) op(B) + bias (gemm_set; bias NULL: none), on
// contiguous operands, by the OpenMP team
static void gemm_run(float* C, const float* A, int ta, const float* B, int tb, int M, int K, int N, int set,
                     const float* bias) {
    if (M <= 0 || N <= 0) { return; }
    int nt = omp_get_max_threads();
    float* panels = gemm_scratch(gemm_panel_floats(gemm_kernel(), M, K, N, nt));
    gemm_team(C, N, A, ta ? M : K, ta, B, tb ? K : N, tb, M, K, N, set, bias, panels, nt);
}
static void gemm_acc(float* C, const float* A, int ta, const float* B, int tb, int M, int K, int N) {
    gemm_run(C, A, ta, B, tb, M, K, N, 0, NULL);
}
static void gemm_set(float* C, const float* A, int ta, const float* B, int tb, int M, int K, int N,
                     const float* bias) {
    gemm_run(C, A, ta, B, tb, M, K, N, 1, bias);
}

// out (N, OC) = inp (N, C) @ w (OC, C)^T + bias (OC)
static void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC) {
    gemm_set(out, inp, 0, w, 1, N, C, OC, bias);
}

// dinp (N, C) += dout @ w; dw (OC, C) += dout^T @ inp; db (OC) += column sums. dinp, db may be NULL.
// out = x / sqrt(mean(x^2) + eps) * (offset + w), per row of C: offset 0 is Llama's norm (SmolVLA),
// 1 Gemma's (pi0), whose stored weight is the scale's distance from 1
static void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps,
                            float offset) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) { ss += x[c] * x[c]; }
        float r = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[n] = r;
        float* y = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { y[c] = x[c] * r * (offset + w[c]); }
    }
}

// y_c = x_c r s_c with r = (mean x^2 + eps)^-1/2 and the scale s = offset + w, so
// dx_c = r s_c dy_c - x_c r^3 / C * sum_j dy_j s_j x_j  and  dw_c = sum_rows dy_c x_c r.
// dw may be NULL: a frozen norm (SmolVLA's last VLM layer) passes its gradient through only.
static void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int N, int C, float offset) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        float r = rstd[n];
        float dot = 0.0f;
        for (int c = 0; c < C; c++) { dot += dy[c] * (offset + w[c]) * x[c]; }
        float k = dot * r * r * r / (float)C;
        float* dx = dinp + (size_t)n * C;
        for (int c = 0; c < C; c++) { dx[c] += r * (offset + w[c]) * dy[c] - k * x[c]; }
    }
    if (dw == NULL) { return; }
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) { s += dout[(size_t)n * C + c] * inp[(size_t)n * C + c] * rstd[n]; }
        dw[c] += s;
    }
}

// The operations SmolVLA adds (LayerNorm with bias, RoPE at given positions, GQA attention under a
// block mask, SwiGLU, pixel shuffle, resize with padding, ...), each as LeRobot 0.6.1 computes it
// (dev/smolvla.py is the PyTorch oracle they follow where the rounding matters). A NULL gradient
// pointer means nobody needs that gradient (a frozen tensor, an input below the trained part): its
// product is skipped, not computed and dropped.

#define FLOW_MIN_PERIOD 4e-3  // the time embedding's shortest period (LeRobot's min_period)
#define FLOW_MAX_PERIOD 4.0   // and its longest (max_period)
#define FLOW_NUM_STEPS 10     // Euler steps of sampling (num_steps)

// The backward of matmul_forward (a Linear with or without bias) with every output optional:
// dinp (N, C) += dout @ w, dw (OC, C) += dout^T @ inp, db (OC) += column sums of dout.
static void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                            int N, int C, int OC) {
    if (dinp != NULL) { gemm_acc(dinp, dout, 0, w, 0, N, OC, C); }
    if (dw != NULL) { gemm_acc(dw, dout, 1, inp, 0, OC, N, C); }
    if (db != NULL) {
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) { s += dout[(size_t)n * OC + o]; }
            db[o] += s;
        }
    }
}

// SigLIP's LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b per row of C (biased variance).
// mean, rstd (N) are kept for the backward.
static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int N, int C, float eps) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) { m += x[c]; }
        m /= (float)C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) { var += (x[c] - m) * (x[c] - m); }
        float r = 1.0f / sqrtf(var / (float)C + eps);
        mean[n] = m;
        rstd[n] = r;
        float* y = out + (size_t)n * C;
        for (int c = 0; c < C; c++) { y[c] = (x[c] - m) * r * w[c] + b[c]; }
    }
}

// With xh = (x - mean) rstd and g = dy w: dx = rstd (g - mean(g) - xh mean(g xh)), since mean and
// rstd depend on every x of the row; dw += dy xh, db += dy, summed over rows (parallel over columns).
static void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int N, int C) {
    if (dinp != NULL) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float* x = inp + (size_t)n * C;
            const float* dy = dout + (size_t)n * C;
            float m = mean[n], r = rstd[n], sum_g = 0.0f, sum_gx = 0.0f;
            for (int c = 0; c < C; c++) {
                float g = dy[c] * w[c];
                sum_g += g;
                sum_gx += g * (x[c] - m) * r;
            }
            sum_g /= (float)C;
            sum_gx /= (float)C;
            float* dx = dinp + (size_t)n * C;
            for (int c = 0; c < C; c++) { dx[c] += r * (dy[c] * w[c] - sum_g - (x[c] - m) * r * sum_gx); }
        }
    }
    if (dw != NULL || db != NULL) {
        #pragma omp parallel for schedule(static)
        for (int c = 0; c < C; c++) {
            float sw = 0.0f, sb = 0.0f;
            for (int n = 0; n < N; n++) {
                float dy = dout[(size_t)n * C + c];
                sw += dy * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
                sb += dy;
            }
            if (dw != NULL) { dw[c] += sw; }
            if (db != NULL) { db[c] += sb; }
        }
    }
}

// cos/sin (n_pos, HS/2) of RoPE's angles as LeRobot's apply_rope computes them: the timescale
// theta^e with e = float32(2/HS) * k in float32 (torch's float pow is the correctly rounded one,
// which pow in double then rounding gives), the angle as a float32 DIVISION pos / timescale (not
// a product with an inverse frequency: that rounds differently), then sin and cos of that float.
static void rope_table(float* cos_t, float* sin_t, int n_pos, int HS, int theta) {
    int half = HS / 2;
    float step = (float)(2.0 / HS);
    for (int k = 0; k < half; k++) {
        float timescale = (float)pow((double)theta, (double)(step * (float)k));
        for (int pos = 0; pos < n_pos; pos++) {
            float angle = (float)pos / timescale;
            cos_t[(size_t)pos * half + k] = (float)cos((double)angle);
            sin_t[(size_t)pos * half + k] = (float)sin((double)angle);
        }
    }
}

// RoPE (rotate-half) in place on x (N, NH*HS), row n at position pos[n]: dimension k < HS/2
// pairs with k + HS/2. The backward is the rotation by the negative angle (sign = -1).
static void rope_at(float* x, const float* cos_t, const float* sin_t, const int* pos, int N, int NH, int HS,
                    float sign) {
    int half = HS / 2;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* cs = cos_t + (size_t)pos[n] * half;
        const float* sn = sin_t + (size_t)pos[n] * half;
        for (int h = 0; h < NH; h++) {
            float* v = x + ((size_t)n * NH + h) * HS;
            for (int k = 0; k < half; k++) {
                float x1 = v[k], x2 = v[k + half], s = sign * sn[k];
                v[k] = x1 * cs[k] - x2 * s;
                v[k + half] = x2 * cs[k] + x1 * s;
            }
        }
    }
}

// Softmax attention with grouped-query heads under openpi's block mask. Per sample, queries are
// Tq consecutive tokens of a sequence of Nt, starting at sequence index q0; keys/values are the
// sequence's first Nk0 tokens (buffer 0) followed by Nk1 more (buffer 1), so the expert's joint
// layers read [the VLM's prefix K/V ; their own] without a copy. GQA: key/value head j serves
// query heads j*g .. j*g + g - 1, g = NH / NKV (LeRobot's repeat_interleave).
// Mask: query i sees key j iff both are valid and block[j] <= block[i] (cumulative block ids:
// images and language 0, the state 1, action k 2 + k). valid NULL: no mask (the vision tower).
typedef struct {
    const float *k0, *v0;   // (B, Nk0, KV)
    const float *k1, *v1;   // (B, Nk1, KV), NULL when Nk1 = 0
    const int* block;       // (B, Nt)
    int B, NH, NKV, HS;
    int Tq, q0;             // queries per sample, sequence index of the first
    int Nk0, Nk1, Nt;       // keys per sample in buffer 0 (sequence 0 ..) and buffer 1 (sequence Nk0 ..), the
                            // mask's row length
    const float* valid;     // (B, Nt) 1 = a real token, or NULL (train_vla.c's own: the GPU's block is -1 at pads)
} GqaAttn;

static inline int gqa_query_sees(const GqaAttn* a, int b, int i, int j) {
    if (a->valid == NULL) { return 1; }
    const float* valid = a->valid + (size_t)b * a->Nt;
    const int* block = a->block + (size_t)b * a->Nt;
    int qi = a->q0 + i;
    return valid[qi] != 0.0f && valid[j] != 0.0f && block[j] <= block[qi];
}

// x . y over n floats (y NULL: the sum of x, as if y were ones, the same bits): two vectors of 8
// partial sums in a fixed order, then the lanes pairwise and the tail. A plain `s += x[c] * y[c]`
// loop may not be reordered by the compiler, so it waits out each addition's latency.
static inline float dot_f32(const float* x, const float* y, int n) {
    gemm_v8 s0 = {0}, s1 = {0}, one = {1, 1, 1, 1, 1, 1, 1, 1};
    int c = 0;
    for (; c + 16 <= n; c += 16) {
        gemm_v8 x0, x1, y0 = one, y1 = one;
        memcpy(&x0, x + c, sizeof(x0)); memcpy(&x1, x + c + 8, sizeof(x1));
        if (y != NULL) { memcpy(&y0, y + c, sizeof(y0)); memcpy(&y1, y + c + 8, sizeof(y1)); }
        s0 += x0 * y0;
        s1 += x1 * y1;
    }
    for (; c + 8 <= n; c += 8) {
        gemm_v8 x0, y0 = one;
        memcpy(&x0, x + c, sizeof(x0));
        if (y != NULL) { memcpy(&y0, y + c, sizeof(y0)); }
        s0 += x0 * y0;
    }
    s0 += s1;
    float r = ((s0[0] + s0[1]) + (s0[2] + s0[3])) + ((s0[4] + s0[5]) + (s0[6] + s0[7]));
    for (; c < n; c++) { r += x[c] * (y != NULL ? y[c] : 1.0f); }
    return r;
}

// The largest of n floats (exact in any order)
static inline float max_f32(const float* x, int n) {
    gemm_v8 m;
    int c = 0;
    if (n < 8) {
        float r = -INFINITY;
        for (; c < n; c++) { r = x[c] > r ? x[c] : r; }
        return r;
    }
    memcpy(&m, x, sizeof(m));
    for (c = 8; c + 8 <= n; c += 8) {
        gemm_v8 v;
        memcpy(&v, x + c, sizeof(v));
        gemm_i8 more = v > m;  // (lanes of -1 where v is larger)
        m = (gemm_v8)(((gemm_i8)v & more) | ((gemm_i8)m & ~more));
    }
    float r = m[0];
    for (int i = 1; i < 8; i++) { r = m[i] > r ? m[i] : r; }
    for (; c < n; c++) { r = x[c] > r ? x[c] : r; }
    return r;
}

// Attention is computed a (sample, head) at a time as matrix products on the head's columns: the
// scores S = Q K^T, then O = P V (and the backward's five products), each by gemm_part. Work is
// split over threads one way or the other, which gives the same bits: whole heads per thread
// when they divide evenly enough (the vision tower's 12 a camera; each thread then has its own
// scores and panels), else the threads share each head's products and rows.
typedef struct {
    int units, outer, inner;  // heads (or key heads) to do; threads over them; threads within one
    size_t slot, panels;      // floats of one thread's scratch (its tables of rows x nk, then panels),
                              // and where its panels start (64-byte aligned, as the slots)
    float* scratch;
} GqaPlan;

static GqaPlan gqa_plan(const GqaAttn* a, int units, int rows, int tables) {
    int nt = omp_get_max_threads(), nk = a->Nk0 + a->Nk1;
    GqaPlan g = {units, 1, nt, 0, 0, NULL};
    // whole heads per thread when the last round's idle threads cost at most an eighth of the work
    if (nt > 1 && (long long)((units + nt - 1) / nt) * nt * 8 <= (long long)units * 9) {
        g.outer = nt;
        g.inner = 1;
    }
    int big = rows > nk ? rows : nk;
    big = big > a->HS ? big : a->HS;
    g.panels = ((size_t)tables * rows * nk + 15) / 16 * 16;
    g.slot = g.panels + gemm_panel_floats(gemm_kernel(), big, big, big, g.inner);
    g.scratch = gemm_scratch(g.slot * g.outer);
    return g;
}

// The key (or value) rows of sample b at key head kvh in buffer 0 or 1, at the buffers' row stride
static inline const float* gqa_head0(const GqaAttn* a, const float* base, int b, int kvh) {
    return base + (size_t)b * a->Nk0 * a->NKV * a->HS + (size_t)kvh * a->HS;
}
static inline const float* gqa_head1(const GqaAttn* a, const float* base, int b, int kvh) {
    return base + (size_t)b * a->Nk1 * a->NKV * a->HS + (size_t)kvh * a->HS;
}

// S (rows, nk) = Q K^T, unscaled, for sample b's queries i0 .. Tq - 1 at head h
static void gqa_scores(float* S, const float* q, const GqaAttn* a, int b, int h, int i0, float* panels, int nt) {
    int D = a->NH * a->HS, KV = a->NKV * a->HS, kvh = h / (a->NH / a->NKV), rows = a->Tq - i0;
    int nk = a->Nk0 + a->Nk1;
    const float* qh = q + ((size_t)b * a->Tq + i0) * D + (size_t)h * a->HS;
    gemm_team(S, nk, qh, D, 0, gqa_head0(a, a->k0, b, kvh), KV, 1, rows, a->HS, a->Nk0, 1, NULL, panels, nt);
    if (a->Nk1 > 0) {
        gemm_team(S + a->Nk0, nk, qh, D, 0, gqa_head1(a, a->k1, b, kvh), KV, 1, rows, a->HS, a->Nk1, 1, NULL, panels,
                  nt);
    }
}

// out (B, Tq, D), lse (B, NH, Tq) for the backward. Scores q.k are scaled by HS^-0.5 after the
// product, as LeRobot. A query that sees no key at all (a language pad) gets LeRobot's row: its
// masked scores all equal float32's most negative value, so its softmax is uniform over every
// key; lse = +inf marks such a row.
static void gqa_attention_forward(float* out, float* lse, const float* q, const GqaAttn* a) {
    int NH = a->NH, HS = a->HS, D = NH * HS, KV = a->NKV * HS, group = NH / a->NKV, nk = a->Nk0 + a->Nk1;
    float scale = (float)pow((double)HS, -0.5);
    GqaPlan g = gqa_plan(a, a->B * NH, a->Tq, 1);
    #pragma omp parallel for schedule(static) num_threads(g.outer) if (g.outer > 1)
    for (int u = 0; u < g.units; u++) {
        int b = u / NH, h = u % NH, kvh = h / group;
        float* P = g.scratch + g.slot * (g.outer > 1 ? omp_get_thread_num() : 0);
        float* panels = P + g.panels;
        gqa_scores(P, q, a, b, h, 0, panels, g.inner);
        #pragma omp parallel for schedule(static) num_threads(g.inner) if (g.inner > 1)
        for (int i = 0; i < a->Tq; i++) {
            float* p = P + (size_t)i * nk;
            int seen = nk;
            for (int j = 0; j < nk; j++) { p[j] *= scale; }
            if (a->valid != NULL) {
                for (int j = 0; j < nk; j++) {
                    if (!gqa_query_sees(a, b, i, j)) { p[j] = -INFINITY; seen--; }
                }
            }
            float* l = lse + ((size_t)b * NH + h) * a->Tq + i;
            if (seen == 0) {
                for (int j = 0; j < nk; j++) { p[j] = 1.0f / (float)nk; }
                *l = INFINITY;
                continue;
            }
            float mx = max_f32(p, nk);
            for (int j = 0; j < nk; j++) { p[j] = vla_expf(p[j] - mx); }  // masked: exp(-inf) = 0, as LeRobot's
                                                                            // exp(finfo.min - max)
            float sum = dot_f32(p, NULL, nk);
            for (int j = 0; j < nk; j++) { p[j] /= sum; }
            *l = mx + logf(sum);
        }
        float* oh = out + (size_t)b * a->Tq * D + (size_t)h * HS;
        gemm_team(oh, D, P, nk, 0, gqa_head0(a, a->v0, b, kvh), KV, 0, a->Tq, a->Nk0, HS, 1, NULL, panels, g.inner);
        if (a->Nk1 > 0) {
            gemm_team(oh, D, P + a->Nk0, nk, 0, gqa_head1(a, a->v1, b, kvh), KV, 0, a->Tq, a->Nk1, HS, 0, NULL, panels,
                      g.inner);
        }
    }
}

// Recomputes P from lse. With O = P V: dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO O)),
// dQ = dS K scale, dK += dS^T Q scale. A uniform (fully masked) row's scores are constants: only
// its values get a gradient, dO / nk each.
// dq (B, Tq, D) is overwritten for queries i >= q_first, the others are left alone. Key gradients
// accumulate into dk0/dv0 (buffer 0; NULL: not needed, or only for keys j >= k0_first) and
// dk1/dv1 (buffer 1; NULL: not needed). One unit of work is a (sample, key head): its key rows
// and the query rows of the heads it serves, taken in head order, so the sums keep their order.
static void gqa_attention_backward(float* dq, float* dk0, float* dv0, float* dk1, float* dv1, const float* dout,
                                   const float* q, const float* out, const float* lse, const GqaAttn* a, int k0_first,
                                   int q_first) {
    int NH = a->NH, HS = a->HS, D = NH * HS, KV = a->NKV * HS, group = NH / a->NKV, nk = a->Nk0 + a->Nk1;
    int rows = a->Tq - q_first, nk0 = a->Nk0 - k0_first;
    if (rows <= 0) { return; }
    float scale = (float)pow((double)HS, -0.5);
    GqaPlan g = gqa_plan(a, a->B * a->NKV, rows, 2);
    #pragma omp parallel for schedule(static) num_threads(g.outer) if (g.outer > 1)
    for (int u = 0; u < g.units; u++) {
        int b = u / a->NKV, kvh = u % a->NKV;
        float* P = g.scratch + g.slot * (g.outer > 1 ? omp_get_thread_num() : 0);
        float* dS = P + (size_t)rows * nk;
        float* panels = P + g.panels;
        const float* k0h = gqa_head0(a, a->k0, b, kvh);
        const float* v0h = gqa_head0(a, a->v0, b, kvh);
        const float* k1h = a->Nk1 > 0 ? gqa_head1(a, a->k1, b, kvh) : NULL;
        const float* v1h = a->Nk1 > 0 ? gqa_head1(a, a->v1, b, kvh) : NULL;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            size_t row0 = ((size_t)b * a->Tq + q_first) * D + (size_t)h * HS;
            const float* qh = q + row0;
            const float* doh = dout + row0;
            gqa_scores(P, q, a, b, h, q_first, panels, g.inner);
            gemm_team(dS, nk, doh, D, 0, v0h, KV, 1, rows, HS, a->Nk0, 1, NULL, panels, g.inner);  // dP = dO V^T first
            if (a->Nk1 > 0) {
                gemm_team(dS + a->Nk0, nk, doh, D, 0, v1h, KV, 1, rows, HS, a->Nk1, 1, NULL, panels, g.inner);
            }
            #pragma omp parallel for schedule(static) num_threads(g.inner) if (g.inner > 1)
            for (int r = 0; r < rows; r++) {
                int i = q_first + r;
                float* p = P + (size_t)r * nk;
                float* ds = dS + (size_t)r * nk;
                float l = lse[((size_t)b * NH + h) * a->Tq + i];
                if (isinf(l)) {
                    for (int j = 0; j < nk; j++) { p[j] = 1.0f / (float)nk; ds[j] = 0.0f; }
                    continue;
                }
                float delta = dot_f32(doh + (size_t)r * D, out + row0 + (size_t)r * D, HS);
                for (int j = 0; j < nk; j++) {
                    p[j] = vla_expf(p[j] * scale - l);
                    ds[j] = p[j] * (ds[j] - delta) * scale;
                }
                if (a->valid != NULL) {
                    for (int j = 0; j < nk; j++) {
                        if (!gqa_query_sees(a, b, i, j)) { p[j] = 0.0f; ds[j] = 0.0f; }
                    }
                }
            }
            float* dqh = dq + row0;
            gemm_team(dqh, D, dS, nk, 0, k0h, KV, 0, rows, a->Nk0, HS, 1, NULL, panels, g.inner);
            if (a->Nk1 > 0) { gemm_team(dqh, D, dS + a->Nk0, nk, 0, k1h, KV, 0, rows, a->Nk1, HS, 0, NULL, panels, g.inner); }
            if (dk0 != NULL && nk0 > 0) {
                float* d = (float*)gqa_head0(a, dk0, b, kvh) + (size_t)k0_first * KV;
                gemm_team(d, KV, dS + k0_first, nk, 1, qh, D, 0, nk0, rows, HS, 0, NULL, panels, g.inner);
            }
            if (dv0 != NULL && nk0 > 0) {
                float* d = (float*)gqa_head0(a, dv0, b, kvh) + (size_t)k0_first * KV;
                gemm_team(d, KV, P + k0_first, nk, 1, doh, D, 0, nk0, rows, HS, 0, NULL, panels, g.inner);
            }
            if (dk1 != NULL && a->Nk1 > 0) {
                gemm_team((float*)gqa_head1(a, dk1, b, kvh), KV, dS + a->Nk0, nk, 1, qh, D, 0, a->Nk1, rows, HS, 0,
                          NULL, panels, g.inner);
            }
            if (dv1 != NULL && a->Nk1 > 0) {
                gemm_team((float*)gqa_head1(a, dv1, b, kvh), KV, P + a->Nk0, nk, 1, doh, D, 0, a->Nk1, rows, HS, 0,
                          NULL, panels, g.inner);
            }
        }
    }
}

static inline float silu_grad(float x) {  // d/dx x sigmoid(x) = s (1 + x (1 - s))
    float s = 1.0f / (1.0f + vla_expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

// The MLPs' gated activation act = a(gate) * up, a = silu (SwiGLU: SmolLM2's, SmolVLA) or gelu_tanh
// (GeGLU: Gemma's, pi0)
static void glu_forward(float* act, const float* gate, const float* up, size_t n, int gelu) {
    // (one loop per activation: each vectorizes alike wherever this file is compiled, and so
    // rounds alike: a loop the compiler leaves scalar in one program may fuse other products)
    if (gelu) {
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) { act[i] = gelu_tanh(gate[i]) * up[i]; }
    } else {
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) { act[i] = silu(gate[i]) * up[i]; }
    }
}

// dgate, dup are overwritten
static void glu_backward(float* dgate, float* dup, const float* dact, const float* gate, const float* up, size_t n,
                         int gelu) {
    if (gelu) {  // (one loop per activation, as glu_forward)
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            dgate[i] = dact[i] * up[i] * gelu_tanh_grad(gate[i]);
            dup[i] = dact[i] * gelu_tanh(gate[i]);
        }
    } else {
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            dgate[i] = dact[i] * up[i] * silu_grad(gate[i]);
            dup[i] = dact[i] * silu(gate[i]);
        }
    }
}

// SigLIP's MLP activation (gelu_pytorch_tanh)
static void gelu_forward(float* out, const float* inp, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { out[i] = gelu_tanh(inp[i]); }
}

// dinp is overwritten
static void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { dinp[i] = dout[i] * gelu_tanh_grad(inp[i]); }
}

// SmolVLM's pixel shuffle: (NV, G*G, Cv) patches -> (NV, (G/s)^2, s*s*Cv) tokens. Token (I, J)
// (row-major over the G/s grid) holds the s x s block of patches (I s + m, J s + k) in row-major
// (m, k) order: feature (m s + k) Cv + d is channel d of patch (I s + m, J s + k).
static void pixel_shuffle_forward(float* out, const float* inp, int NV, int G, int Cv, int s) {
    int g = G / s;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < NV; n++) {
        for (int I = 0; I < g; I++) {
            for (int J = 0; J < g; J++) {
                for (int m = 0; m < s; m++) {
                    for (int k = 0; k < s; k++) {
                        const float* src = inp + ((size_t)n * G * G + (size_t)(I * s + m) * G + J * s + k) * Cv;
                        float* dst = out + (((size_t)n * g + I) * g + J) * s * s * Cv + (size_t)(m * s + k) * Cv;
                        memcpy(dst, src, Cv * sizeof(float));
                    }
                }
            }
        }
    }
}

// A permutation: its backward moves each gradient back (dinp is overwritten)
static void pixel_shuffle_backward(float* dinp, const float* dout, int NV, int G, int Cv, int s) {
    int g = G / s;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < NV; n++) {
        for (int I = 0; I < g; I++) {
            for (int J = 0; J < g; J++) {
                for (int m = 0; m < s; m++) {
                    for (int k = 0; k < s; k++) {
                        float* dst = dinp + ((size_t)n * G * G + (size_t)(I * s + m) * G + J * s + k) * Cv;
                        const float* src = dout + (((size_t)n * g + I) * g + J) * s * s * Cv + (size_t)(m * s + k) * Cv;
                        memcpy(dst, src, Cv * sizeof(float));
                    }
                }
            }
        }
    }
}

// Bilinear taps of one axis as torch 2.x's upsample_bilinear2d (align_corners=False, no
// antialias) computes them for float32: output i samples the input at
// src = fmaf(in/out, i + 0.5, -0.5) (one rounding: torch's compiled expression is contracted),
// clamped below at 0, blending floor(src) and the next one (the last repeated at the edge).
static void bilinear_taps(int* i0, int* i1, float* w1, int n_in, int n_out) {
    float scale = (float)n_in / (float)n_out;
    for (int i = 0; i < n_out; i++) {
        float src = fmaf(scale, (float)i + 0.5f, -0.5f);
        if (src < 0.0f) { src = 0.0f; }
        int lo = (int)src;  // src >= 0: truncation is floor
        i0[i] = lo;
        i1[i] = lo + 1 < n_in ? lo + 1 : n_in - 1;
        w1[i] = src - (float)lo;
    }
}

// Channel ch of pixel (r, c) of a (h, w, 3) uint8 frame in [0, 1], as LeRobot's datasets give it
static inline float u8_unit(const uint8_t* frame, int w, int r, int c, int ch) {
    return (float)frame[((size_t)r * w + c) * 3 + ch] / 255.0f;
}

// The size an h x w frame is resized to before padding to S x S: ratio = max(w/S, h/S), then
// int(h/ratio) x int(w/ratio) (h x w itself when already S x S). 0 when a side comes out empty
// (a frame much wider than tall: LeRobot's interpolate fails on it too), else 1.
static int resized_size(int h, int w, int S, int* rh, int* rw) {
    *rh = h; *rw = w;
    if (h != S || w != S) {
        double ratio = fmax((double)w / (double)S, (double)h / (double)S);
        *rh = (int)((double)h / ratio);
        *rw = (int)((double)w / ratio);
    }
    return *rh >= 1 && *rw >= 1;
}

// One stored frame (h, w, 3) uint8 -> (3, S, S) floats in [-1, 1], as LeRobot prepares images:
// x / 255, resize with padding to S x S keeping the aspect ratio (ratio = max(w/S, h/S), size
// int(h/ratio) x int(w/ratio), bilinear; skipped when already S x S), zeros padded on the LEFT
// and TOP (SmolVLA's resize_with_pad) or centred, the odd one at the bottom and right (pi0's
// resize_with_pad_torch), then x*2-1 (so padding reads -1). Rows are blended first, then columns,
// as the oracle.
static void resize_pad(float* out, const uint8_t* frame, int h, int w, int S, int centred) {
    int rh, rw;
    if (!resized_size(h, w, S, &rh, &rw)) {
        vla_fail("a %dx%d camera frame resizes to %dx%d at %d px: nothing left of it: use frames closer to square", h,
                 w, rh, rw, S);
    }
    int y0[rh], y1[rh], x0[rw], x1[rw];
    float wy[rh], wx[rw];
    bilinear_taps(y0, y1, wy, h, rh);
    bilinear_taps(x0, x1, wx, w, rw);
    int pad_h = centred ? (S - rh) / 2 : S - rh, pad_w = centred ? (S - rw) / 2 : S - rw, resized = h != S || w != S;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int ch = 0; ch < 3; ch++) {
        for (int y = 0; y < S; y++) {
            float* dst = out + ((size_t)ch * S + y) * S;
            for (int x = 0; x < S; x++) {
                float v = 0.0f;
                if (y >= pad_h && x >= pad_w && y < pad_h + rh && x < pad_w + rw) {
                    int yy = y - pad_h, xx = x - pad_w;
                    if (!resized) {
                        v = u8_unit(frame, w, yy, xx, ch);
                    } else {
                        float c0 = u8_unit(frame, w, y0[yy], x0[xx], ch) * (1.0f - wy[yy]) +
                                   u8_unit(frame, w, y1[yy], x0[xx], ch) * wy[yy];
                        float c1 = u8_unit(frame, w, y0[yy], x1[xx], ch) * (1.0f - wy[yy]) +
                                   u8_unit(frame, w, y1[yy], x1[xx], ch) * wy[yy];
                        v = c0 * (1.0f - wx[xx]) + c1 * wx[xx];
                    }
                }
                dst[x] = v * 2.0f - 1.0f;
            }
        }
    }
}

// pixels (NV, 3, S, S) -> patches (NV*G*G, 3*p*p), each flattened in (channel, row, column) order:
// the patch embedding's stride-p convolution with weight (Cv, 3, p, p) is then a Linear.
static void patchify_chw(float* patches, const float* pixels, int NV, int S, int p) {
    int G = S / p, pd = 3 * p * p;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < NV; n++) {
        for (int gr = 0; gr < G; gr++) {
            for (int gc = 0; gc < G; gc++) {
                float* dst = patches + ((size_t)n * G * G + (size_t)gr * G + gc) * pd;
                for (int ch = 0; ch < 3; ch++) {
                    for (int y = 0; y < p; y++) {
                        const float* src =
                            pixels + (((size_t)n * 3 + ch) * S + (size_t)gr * p + y) * S + (size_t)gc * p;
                        memcpy(dst + (ch * p + y) * p, src, p * sizeof(float));
                    }
                }
            }
        }
    }
}

// LeRobot's create_sinusoidal_pos_embedding of the flow time t, in float64 then cast: dim values,
// [sin | cos] of t * (1 / period * 2 pi), period = min_period * (max_period / min_period)^fraction,
// fraction = torch.linspace(0, 1, dim/2) (which counts the second half down from the end).
static void flow_time_embedding(float* out, float t, int dim) {
    int half = dim / 2;
    double step = half > 1 ? 1.0 / (double)(half - 1) : 0.0;
    for (int k = 0; k < half; k++) {
        double fraction = k < half / 2 ? step * (double)k : 1.0 - step * (double)(half - 1 - k);
        double period = FLOW_MIN_PERIOD * pow(FLOW_MAX_PERIOD / FLOW_MIN_PERIOD, fraction);
        double angle = 1.0 / period * 2.0 * 3.141592653589793 * (double)t;
        out[k] = (float)sin(angle);
        out[half + k] = (float)cos(angle);
    }
}

// The language tokens' rows: out (N, C) = table[tokens] * scale (LeRobot scales them by sqrt(C))
static void embed_tokens_forward(float* out, const int* tokens, const float* table, int N, int C, float scale) {
    for (int n = 0; n < N; n++) {
        const float* row = table + (size_t)tokens[n] * C;
        for (int k = 0; k < C; k++) { out[(size_t)n * C + k] = row[k] * scale; }
    }
}

// dtable[tokens[n]] += dout[n] * scale, except the pad id's row: nn.Embedding(padding_idx) never
// sends it a gradient. Serial: two tokens may share a row, and its sum keeps its order.
static void embed_tokens_backward(float* dtable, const float* dout, const int* tokens, int N, int C, float scale,
                                  int pad) {
    for (int n = 0; n < N; n++) {
        if (tokens[n] == pad) { continue; }
        float* row = dtable + (size_t)tokens[n] * C;
        for (int k = 0; k < C; k++) { row[k] += dout[(size_t)n * C + k] * scale; }
    }
}

// x (NV, Nv, C) += pos (Nv, C): SigLIP's learned position of each patch, the same for every image
static void pos_emb_forward(float* x, const float* pos, int NV, int Nv, int C) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < NV; n++) {
        for (int i = 0; i < Nv; i++) {
            float* row = x + ((size_t)n * Nv + i) * C;
            for (int k = 0; k < C; k++) { row[k] += pos[(size_t)i * C + k]; }
        }
    }
}

// dpos (Nv, C) += the sum over images of dx (NV, Nv, C); parallel over patches, each sum in order
static void pos_emb_backward(float* dpos, const float* dx, int NV, int Nv, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < Nv; i++) {
        for (int n = 0; n < NV; n++) {
            const float* d = dx + ((size_t)n * Nv + i) * C;
            for (int k = 0; k < C; k++) { dpos[(size_t)i * C + k] += d[k]; }
        }
    }
}

// The time MLP's activation: out = silu(inp)
static void silu_forward(float* out, const float* inp, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { out[i] = silu(inp[i]); }
}

// dinp is overwritten (it may be dout itself)
static void silu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { dinp[i] = dout[i] * silu_grad(inp[i]); }
}

// The flow-matching loss of velocities v (R, Amax) against the target u = noise - actions, over its
// valid entries: the first A dims (the dataset's; LeRobot slices to them) of the slots inside the
// episode (is_pad (R) == 0; is_pad NULL: every slot, pi0's loss). Returns the sum of (u - v)^2 over them and their
// count in *entries. mean = 1: the loss is that sum / max(1, entries), LeRobot's mean over valid entries (not over B H
// A), and dv (R, Amax) = its gradient; mean = 0: dv = the gradient of the sum (a training step of several micro-batches
// divides by the entries of all of them: train_step). dv is 0 elsewhere.
static double flow_matching_loss(float* dv, const float* v, const float* noise, const float* actions,
                                 const float* is_pad, int R, int Am, int A, int mean, int* entries) {
    int slots = 0;
    for (int r = 0; r < R; r++) { slots += is_pad == NULL || is_pad[r] == 0.0f; }
    *entries = slots * A;
    float n = mean && slots * A > 1 ? (float)(slots * A) : 1.0f;
    double sum = 0.0;
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < Am; i++) {
            size_t k = (size_t)r * Am + i;
            float diff = v[k] - (noise[k] - actions[k]);
            int counts = (is_pad == NULL || is_pad[r] == 0.0f) && i < A;
            if (counts) { sum += (double)diff * diff; }
            dv[k] = counts ? 2.0f * diff / n : 0.0f;
        }
    }
    return sum;
}

// Per-task sums of flow_matching_loss's terms for B samples of H slots each: sample b's squared
// errors and valid entries are added to sq[task[b]] and n[task[b]] (--balance tasks' log; is_pad
// NULL: every slot counts).
static void flow_matching_task_sums(double* sq, double* n, const int* task, const float* v, const float* noise,
                                    const float* actions, const float* is_pad, int B, int H, int Am, int A) {
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            int r = b * H + h;
            if (is_pad != NULL && is_pad[r] != 0.0f) { continue; }
            for (int i = 0; i < A; i++) {
                size_t k = (size_t)r * Am + i;
                float diff = v[k] - (noise[k] - actions[k]);
                sq[task[b]] += (double)diff * diff;
            }
            n[task[b]] += A;
        }
    }
}

// ----------------------------------------------------------------------------
// the policy interface: all the step, checkpoints, evaluation and the config table ask of a
// policy, as one table of its functions over its model, which only its own section reads (as in
// train_vla.cu). The flow_ section below ends with the table of SmolVLA and pi0 (FLOW_POLICY); a new
// policy writes its section and its table, and policy_of, the one place that chooses, returns it.

typedef struct {
    void (*param_counts)(const FlowConfig* c, int mode, size_t* total, size_t* trainable);
    float* (*init_params)(const FlowConfig* c, uint64_t seed);  // the seeded weights, in its table's layout
    void* (*build)(const FlowConfig* c, int mode);              // a model training in `mode`, moments zero
    void (*set_params)(void* m, const float* params, const float* moment1, const float* moment2);  // moments NULL: 0
    // a micro-batch of a step: the loss's sum of squared errors over its valid entries (*entries),
    // the sums of each sample's task (--balance tasks), and the gradients of the sum added into the
    // step's, grad_sum (its trainable elements packed; first: overwritten); then the mean of the step's
    // gradients over its entries, and the update, which returns the gradient norm before clipping
    double (*forward)(void* m, const ModelInputs* in, int* entries);
    void (*task_sums)(void* m, const ModelInputs* in, const int* task, double* sq, double* n);
    void (*backward)(void* m, float* grad_sum, int first);
    void (*grads_finish)(void* m, const float* grad_sum, double entries);
    float (*update)(void* m, float lr, float weight_decay, int decay_on, float clip, int step, int shards);
    void (*save)(void* m, const Dataset* ds, const TrainArgs* args, int step, uint64_t sampler_pos);
    void (*sample)(void* m, const ModelInputs* in, const float* noise, float* out);  // (B, H, Amax), normalized
    void (*free)(void* m);
} Policy;

// ----------------------------------------------------------------------------
// The model: LeRobot's SmolVLA, as dev/smolvla.py computes it, and LeRobot's pi0, its second family
// (vla/config.h: what differs is a function of the family there). SmolVLA's forward:
//   frames (uint8, any size) -> resize with padding, x*2-1 -> SigLIP (patch embedding, position,
//   pre-LayerNorm layers, post-LayerNorm) -> pixel shuffle -> connector -> prefix = [image tokens
//   * sqrt(C) per camera, language * sqrt(C), state_proj(state)] -> the VLM's Llama layers over
//   the prefix (the last one computes only its keys and values) -> the expert's layers over the
//   H action tokens: joint self-attention over [prefix ; actions] in even layers, cross-attention
//   to the VLM's keys/values re-projected by the expert in odd ones -> final RMSNorm ->
//   action_out_proj = the velocity -> masked squared error on the real action dims.
// pi0's: the same towers without the pixel shuffle (a projector with a bias instead), image tokens
// unscaled, no state in the prefix; every layer joint over [prefix ; state token, actions], the
// actions bidirectional; Gemma's (1 + w) norms and GeGLU MLPs; the loss over every chunk slot.
// The prefix never sees the suffix, so the VLM runs first and alone (it is sampling's cache).
// Backward runs the expert first: it leaves gradients on the VLM's keys and values of every
// layer, which the VLM's backward then takes down its stack, as far as something trains.




// The vision layers whose activations are kept in `mode`: every one when the tower trains (its
// backward reads them all), else one, which each layer's forward overwrites in turn: nothing reads
// them again (the backward stops at the connector), only the tower's output persists.
static inline size_t flow_vis_kept(const FlowConfig* c, int mode) {
    return mode == TRAIN_MODE_ALL ? (size_t)c->vis_layers : 1;
}

// Vision rows of the backward scratch in `mode`: none unless the tower trains (only its backward
// works on V rows)
static inline size_t flow_vis_grad_rows(const FlowConfig* c, int B, int mode) {
    return mode == TRAIN_MODE_ALL ? flow_vrows(c, B) : 0;
}

// Activations: one table (name, elements) carved from one allocation. Vision V rows, prefix
// P rows, actions R rows; per-layer tensors are stacked layer-major, the vision tower's for Kv
// layers (flow_vis_kept). The g_* are backward scratch, shared by the towers whose backward runs
// (one after the other; the vision tower's only when it trains: flow_vis_grad_rows), row-aligned
// with the activations they are the gradients of.
#define FLOW_ACTIVATIONS(X, c, B, mode) \
    X(pixels,   flow_images(c, B) * 3 * (c)->img * (c)->img)                          /* (NV, 3, S, S) prepared images */ \
    X(patches,  flow_vrows(c, B) * flow_patch_dim(c))                              /* (V, 3pp) */ \
    X(v_res,    (flow_vis_kept(c, mode) + 1) * flow_vrows(c, B) * (c)->vis_width)     /* (Kv+1, V, Cv) layer inputs, then the last output */ \
    X(v_ln1,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_mean1,  flow_vis_kept(c, mode) * flow_vrows(c, B))                            /* (Kv, V) */ \
    X(v_rstd1,  flow_vis_kept(c, mode) * flow_vrows(c, B))                            /* (Kv, V) */ \
    X(v_q,      flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_k,      flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_v,      flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_att,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_lse,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_heads)           /* (Kv, NV, NHv, Nv) */ \
    X(v_mid,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) after attention */ \
    X(v_ln2,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_width)           /* (Kv, V, Cv) */ \
    X(v_mean2,  flow_vis_kept(c, mode) * flow_vrows(c, B))                            /* (Kv, V) */ \
    X(v_rstd2,  flow_vis_kept(c, mode) * flow_vrows(c, B))                            /* (Kv, V) */ \
    X(v_fc1,    flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_ff)              /* (Kv, V, Fv) before GELU */ \
    X(v_gelu,   flow_vis_kept(c, mode) * flow_vrows(c, B) * (c)->vis_ff)              /* (Kv, V, Fv) */ \
    X(v_out,    flow_vrows(c, B) * (c)->vis_width)                                    /* (V, Cv) after post_layernorm */ \
    X(v_omean,  flow_vrows(c, B))                                                     /* (V) */ \
    X(v_orstd,  flow_vrows(c, B))                                                     /* (V) */ \
    X(shuffled, flow_vrows(c, B) * (c)->vis_width)                                    /* (NV*NI, s*s*Cv) */ \
    X(img_tok,  flow_images(c, B) * flow_image_tokens(c) * (c)->d_model)           /* (NV*NI, C) connector output */ \
    X(state,    (size_t)(B) * (c)->max_state_dim)                                     /* (B, Smax) the batch's, for the backward */ \
    X(valid,    (size_t)(B) * (flow_n_prefix(c) + flow_n_suffix(c)))            /* (B, T) 1 = a real token */ \
    X(p_res,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_model)               /* (L, P, C) layer inputs */ \
    X(p_ln1,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_model)               /* (L, P, C) */ \
    X(p_rstd1,  (size_t)(c)->n_layer * flow_prows(c, B))                              /* (L, P) */ \
    X(p_q,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_attn(c))          /* (L, P, D) after RoPE */ \
    X(p_k,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) after RoPE: what the expert reads */ \
    X(p_v,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) */ \
    X(p_att,    (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_attn(c))          /* (L, P, D) */ \
    X(p_lse,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->n_head)                /* (L, B, NH, Np) */ \
    X(p_mid,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_model)               /* (L, P, C) after attention */ \
    X(p_ln2,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_model)               /* (L, P, C) */ \
    X(p_rstd2,  (size_t)(c)->n_layer * flow_prows(c, B))                              /* (L, P) */ \
    X(p_gate,   (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_ff)                  /* (L, P, F) */ \
    X(p_up,     (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_ff)                  /* (L, P, F) */ \
    X(p_act,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_ff)                  /* (L, P, F) */ \
    X(x_t,      flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) noisy actions */ \
    X(a_in,     flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) action_in_proj(x_t) */ \
    X(a_emb,    flow_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) [action_in, time embedding] */ \
    X(t_pre,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) before SiLU */ \
    X(t_act,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) after SiLU */ \
    X(s_res,    ((c)->n_layer + 1) * flow_rrows(c, B) * (c)->d_expert)                /* (L+1, R, Ce) layer inputs, then the last output */ \
    X(s_ln1,    (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert)              /* (L, R, Ce) */ \
    X(s_rstd1,  (size_t)(c)->n_layer * flow_rrows(c, B))                              /* (L, R) */ \
    X(s_q,      (size_t)(c)->n_layer * flow_rrows(c, B) * flow_d_attn(c))          /* (L, R, D) after RoPE */ \
    X(s_k,      (size_t)(c)->n_layer * flow_rrows(c, B) * flow_d_kv(c))            /* (L, R, KV) after RoPE (joint layers) */ \
    X(s_v,      (size_t)(c)->n_layer * flow_rrows(c, B) * flow_d_kv(c))            /* (L, R, KV) (joint layers) */ \
    X(c_k,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) p_k re-projected (cross layers) */ \
    X(c_v,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) p_v re-projected (cross layers) */ \
    X(s_att,    (size_t)(c)->n_layer * flow_rrows(c, B) * flow_d_attn(c))          /* (L, R, D) */ \
    X(s_lse,    (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->n_head)                /* (L, B, NH, Ns) */ \
    X(s_mid,    (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert)              /* (L, R, Ce) after attention */ \
    X(s_ln2,    (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert)              /* (L, R, Ce) */ \
    X(s_rstd2,  (size_t)(c)->n_layer * flow_rrows(c, B))                              /* (L, R) */ \
    X(s_gate,   (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert_ff)           /* (L, R, Fe) */ \
    X(s_up,     (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert_ff)           /* (L, R, Fe) */ \
    X(s_act,    (size_t)(c)->n_layer * flow_rrows(c, B) * (c)->d_expert_ff)           /* (L, R, Fe) */ \
    X(f_ln,     flow_rrows(c, B) * (c)->d_expert)                                     /* (R, Ce) after the expert's norm */ \
    X(f_rstd,   flow_rrows(c, B))                                                     /* (R) */ \
    X(v_t,      flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) velocities */ \
    X(d_vt,     flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) d loss / d v_t, set by the forward */ \
    /* backward scratch */ \
    X(dp_k,     (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) d p_k, from the expert and the VLM */ \
    X(dp_v,     (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) d p_v */ \
    X(g_res,    flow_max3(flow_prows(c, B) * (c)->d_model, flow_rrows(c, B) * (c)->d_expert, flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* d residual: (P, C), (R, Ce), (V, Cv) */ \
    X(g_ln,     flow_max3(flow_prows(c, B) * (c)->d_model, flow_rrows(c, B) * (c)->d_expert, flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* d of a norm's output, same shapes */ \
    X(g_att,    flow_max3(flow_prows(c, B) * flow_d_attn(c), flow_rrows(c, B) * flow_d_attn(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* (P, D), (R, D), (V, Cv) */ \
    X(g_q,      flow_max3(flow_prows(c, B) * flow_d_attn(c), flow_rrows(c, B) * flow_d_attn(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* same */ \
    X(g_k,      flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* (P, KV) cross, (R, KV), (V, Cv) */ \
    X(g_v,      flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) /* same */ \
    X(g_gate,   flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) /* (P, F), (R, Fe), (V, Fv) */ \
    X(g_up,     flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) /* same */ \
    X(g_act,    flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) /* same */ \
    X(g_emb,    flow_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) d a_emb */ \
    X(g_tok,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) */ \
    X(g_img,    flow_max3(flow_images(c, B) * flow_image_tokens(c) * (c)->d_model, (size_t)(B) * flow_state_width(c), 1)) /* (NV*NI, C) or the (B, state width) state rows */ \
    X(g_shuf,   flow_vis_grad_rows(c, B, mode) * (c)->vis_width)                      /* (NV*NI, s*s*Cv) */

typedef struct {
#define FLOW_ACT_FIELD_(nm, n) float* nm;
    FLOW_ACTIVATIONS(FLOW_ACT_FIELD_, c, B, mode)
#undef FLOW_ACT_FIELD_
} FlowActivations;

typedef struct {
    FlowConfig config;
    int mode;              // the TRAIN_MODE_* the activations are laid out for (flow_vis_kept)
    FlowParamTable table;
    float* params_memory;  // (table.total) fp32 weights
    float* grads_memory;   // (table.total); a backward writes only the part of each tensor that trains
    FlowParameters params, grads;
    int B;                 // the batch the activations are sized for
    float* acts_memory;
    FlowActivations acts;
    int* ints_memory;
    int* block;            // (B, T) cumulative block ids: images and language 0, state 1, action k 2 + k
                           // (SmolVLA's causal actions) or 2 (pi0's bidirectional ones)
    int* p_pos;            // (B, Np) RoPE positions of the prefix: cumsum(valid) - 1
    int* s_pos;            // (B, Ns) of the suffix in joint layers: they continue after the valid prefix
    int* x_pos;            // (B, Ns) of the actions in cross layers: restarted at 0 (LeRobot subtracts the row's min)
    int* tokens;           // (B, max_text) the batch's, for the backward
    float* rope_cos;       // (T, HS/2)
    float* rope_sin;       // (T, HS/2)
    float loss;
    // AdamW's state, made by its first step: moments of the trainable elements only, packed
    FlowOptDomain opt;     // the trainable prefix of each tensor in the mode the moments were made for
    float* m_memory;       // (opt.total) first moments
    float* v_memory;       // (opt.total) second moments
} FlowVLA;

// The model for config c, its activations laid out for training in `mode` (in expert or vlm mode
// one vision layer's, which leaves no way back into the vision tower)
static void flow_build(FlowVLA* m, const FlowConfig* c, int mode) {
    memset(m, 0, sizeof(*m));
    const char* problem = flow_config_problem(c);
    if (problem != NULL) { vla_fail("bad %s config: %s", FAMILY_NAMES[c->family], problem); }
    if (mode < TRAIN_MODE_EXPERT || mode > TRAIN_MODE_ALL) {
        vla_fail("SmolVLA train mode %d is not one of 0-2", mode);
    }
    m->config = *c;
    m->mode = mode;
    flow_table_build(c, &m->table);
    m->params_memory = (float*)callocCheck(m->table.total, sizeof(float));
    m->grads_memory = (float*)callocCheck(m->table.total, sizeof(float));
    flow_point(&m->params, m->params_memory, &m->table);
    flow_point(&m->grads, m->grads_memory, &m->table);
    int T = flow_n_prefix(c) + flow_n_suffix(c);  // every position is below T
    m->rope_cos = (float*)mallocCheck((size_t)T * (c->head_dim / 2) * sizeof(float));
    m->rope_sin = (float*)mallocCheck((size_t)T * (c->head_dim / 2) * sizeof(float));
    rope_table(m->rope_cos, m->rope_sin, T, c->head_dim, c->rope_theta);
}

// (Re)sizes the activations for B samples.
// Frees the activations, leaving the model at B 0 (nothing freed twice after a failure part way,
// which the policy library survives)
static void flow_drop_activations(FlowVLA* m) {
    free(m->acts_memory);
    free(m->ints_memory);
    m->acts_memory = NULL;
    m->ints_memory = NULL;
    m->B = 0;
}

static void flow_set_batch(FlowVLA* m, int B) {
    if (m->B == B) { return; }
    flow_drop_activations(m);
    const FlowConfig* c = &m->config;
    size_t total = 0;
#define FLOW_ACT_SIZE_(nm, n) total += (n);
    FLOW_ACTIVATIONS(FLOW_ACT_SIZE_, c, B, m->mode)
#undef FLOW_ACT_SIZE_
    m->acts_memory = (float*)callocCheck(total, sizeof(float));
    float* p = m->acts_memory;
#define FLOW_ACT_POINT_(nm, n) m->acts.nm = p; p += (n);
    FLOW_ACTIVATIONS(FLOW_ACT_POINT_, c, B, m->mode)
#undef FLOW_ACT_POINT_
    size_t Np = (size_t)flow_n_prefix(c), H = (size_t)flow_n_suffix(c);
    m->ints_memory = (int*)callocCheck((size_t)B * (2 * Np + 3 * H + c->max_text), sizeof(int));
    m->block = m->ints_memory;
    m->p_pos = m->block + (size_t)B * (Np + H);
    m->s_pos = m->p_pos + (size_t)B * Np;
    m->x_pos = m->s_pos + (size_t)B * H;
    m->tokens = m->x_pos + (size_t)B * H;
    m->B = B;
}

static void flow_free(FlowVLA* m) {
    free(m->params_memory); free(m->grads_memory); free(m->acts_memory); free(m->ints_memory);
    free(m->rope_cos); free(m->rope_sin); free(m->m_memory); free(m->v_memory);
}

static void flow_opt_init(FlowVLA* m, int mode);

// The weights from an array in the table's layout; AdamW's moments of the model's mode from
// moment1/2 (packed: flow_opt_domain), else zero
static void flow_set_params(FlowVLA* m, const float* params, const float* moment1, const float* moment2) {
    flow_opt_init(m, m->mode);
    memcpy(m->params_memory, params, m->table.total * sizeof(float));
    size_t n = m->opt.total * sizeof(float);
    if (moment1 != NULL) { memcpy(m->m_memory, moment1, n); } else { memset(m->m_memory, 0, n); }
    if (moment2 != NULL) { memcpy(m->v_memory, moment2, n); } else { memset(m->v_memory, 0, n); }
}

// Slice k of parameter tensor i (layer k's part of a stacked tensor; 0 for the others); NULL for a
// tensor the family does not have
static inline float* flow_param(const FlowVLA* m, int i, int k) {
    const FlowParamSpec* s = &m->table.spec[i];
    if (s->numel == 0) { return NULL; }
    return m->params_memory + s->offset + (size_t)k * flow_slice_numel(s);
}

// Its gradient when that slice trains in `mode`, else NULL (the train column: the trainable part
// of a tensor is a prefix of it, so a slice trains iff it ends within that prefix)
static inline float* flow_grad(const FlowVLA* m, int mode, int i, int k) {
    const FlowParamSpec* s = &m->table.spec[i];
    size_t per = flow_slice_numel(s);
    if (per == 0 || (size_t)(k + 1) * per > flow_trainable_numel(s, mode)) { return NULL; }
    return m->grads_memory + s->offset + (size_t)k * per;
}

// One Llama layer of the VLM or the expert: its weights (or their gradients, NULL = frozen).
typedef struct {
    FLOW_LAYER_FIELDS(float)
} FlowLayer;

// Layer l of the VLM (expert = 0) or of the expert (expert = 1); grads: its gradients in `mode`.
// The expert's k/v are the joint or cross stacks' slice that layer owns (flow_kind_index).
static FlowLayer flow_layer(const FlowVLA* m, int expert, int l, int grads, int mode) {
    const FlowConfig* c = &m->config;
    int cross = expert && flow_layer_is_cross(c, l), idx[9], slice[9];
    flow_layer_tensors(c, expert, l, idx, slice);
    float* t[9];
    for (int i = 0; i < 9; i++) {
        t[i] = grads ? flow_grad(m, mode, idx[i], slice[i]) : flow_param(m, idx[i], slice[i]);
    }
    FlowLayer w = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], expert ? c->d_expert : c->d_model,
                   expert ? c->d_expert_ff : c->d_ff, cross, flow_rms_eps(c), flow_rms_offset(c),
                   flow_mlp_gelu(c)};
    return w;
}

// One stack's activations at layer l (N rows), and `out`, the next layer's input.
typedef struct {
    float *res, *ln1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *rstd2, *gate, *up, *act, *out;
} FlowLayerActs;

static FlowLayerActs flow_layer_acts(const FlowVLA* m, int expert, int l) {
    const FlowConfig* c = &m->config;
    const FlowActivations* a = &m->acts;
    size_t N = expert ? flow_rrows(c, m->B) : flow_prows(c, m->B), L = (size_t)l;
    size_t C = expert ? c->d_expert : c->d_model, F = expert ? c->d_expert_ff : c->d_ff;
    FlowLayerActs x;
    if (expert) {
        x = (FlowLayerActs){a->s_res, a->s_ln1, a->s_rstd1, a->s_q,    a->s_k,  a->s_v,   a->s_att, a->s_lse,
                            a->s_mid, a->s_ln2, a->s_rstd2, a->s_gate, a->s_up, a->s_act, a->s_res};
    } else {
        x = (FlowLayerActs){a->p_res, a->p_ln1, a->p_rstd1, a->p_q,    a->p_k,  a->p_v,   a->p_att, a->p_lse,
                            a->p_mid, a->p_ln2, a->p_rstd2, a->p_gate, a->p_up, a->p_act, a->p_res};
    }
    FLOW_LAYER_SLOTS(x, c, N, C, F, L, L, L, L);
    return x;
}

// Vision layer l's activations (V rows), and `out`, the next layer's input. With Kv kept layers
// (flow_vis_kept) layer l's are slot l % Kv of the stacks and its input slot l % (Kv + 1) of v_res:
// every layer's side by side when the tower trains, else one set that every layer reuses, the
// residual stream going back and forth between v_res's two slots.
typedef struct {
    float *res, *ln1, *mean1, *rstd1, *q, *k, *v, *att, *lse, *mid, *ln2, *mean2, *rstd2, *fc1, *gelu, *out;
} FlowVisionActs;

static FlowVisionActs flow_vision_acts(const FlowVLA* m, int l) {
    const FlowConfig* c = &m->config;
    const FlowActivations* a = &m->acts;
    size_t kept = flow_vis_kept(c, m->mode), L = (size_t)l % kept, V = flow_vrows(c, m->B);
    size_t VC = V * c->vis_width, VF = V * c->vis_ff;
    FlowVisionActs x = {a->v_res + (size_t)l % (kept + 1) * VC, a->v_ln1 + L * VC, a->v_mean1 + L * V,
                        a->v_rstd1 + L * V, a->v_q + L * VC, a->v_k + L * VC, a->v_v + L * VC, a->v_att + L * VC,
                        a->v_lse + L * V * c->vis_heads, a->v_mid + L * VC, a->v_ln2 + L * VC, a->v_mean2 + L * V,
                        a->v_rstd2 + L * V, a->v_fc1 + L * VF, a->v_gelu + L * VF,
                        a->v_res + (size_t)(l + 1) % (kept + 1) * VC};
    return x;
}

// Rows a backward pass works on: `count` blocks of `rows` consecutive rows, block k starting at
// row first + k * stride. All rows: one block. The expert mode's VLM pass: the state row of each
// sample (see flow_backward).
typedef struct {
    int count, rows;
    size_t first, stride;
} RowBlocks;

static inline size_t rb_row(const RowBlocks* rb, int k) { return rb->first + (size_t)k * rb->stride; }

// The action tokens among the suffix rows: all of them (SmolVLA), or each sample's H after its
// state token (pi0)
static inline RowBlocks flow_action_rows(const FlowConfig* c, int B) {
    if (!flow_state_in_suffix(c)) { return (RowBlocks){1, B * c->chunk, 0, 0}; }
    return (RowBlocks){B, c->chunk, 1, (size_t)flow_n_suffix(c)};
}

// attention output -> o_proj, residual -> post_attention_layernorm -> SwiGLU (GeGLU) MLP, residual: x->out
static void flow_layer_out_forward(const FlowLayer* w, const FlowLayerActs* x, int N, int D) {
    size_t NC = (size_t)N * w->C;
    matmul_forward(x->mid, x->att, w->wo, NULL, N, D, w->C);
    for (size_t i = 0; i < NC; i++) { x->mid[i] += x->res[i]; }
    rmsnorm_forward(x->ln2, x->rstd2, x->mid, w->ln2, N, w->C, w->eps, w->offset);
    matmul_forward(x->gate, x->ln2, w->gate, NULL, N, w->C, w->F);
    matmul_forward(x->up, x->ln2, w->up, NULL, N, w->C, w->F);
    glu_forward(x->act, x->gate, x->up, (size_t)N * w->F, w->gelu);
    matmul_forward(x->out, x->act, w->down, NULL, N, w->F, w->C);
    for (size_t i = 0; i < NC; i++) { x->out[i] += x->mid[i]; }
}

// Backward of flow_layer_out_forward on the rows of rb. dres (N, C) holds d(out) and is left
// holding d(mid) (the residual plus the path through ln2 and the MLP); datt gets d(att), overwritten.
static void flow_layer_out_backward(const FlowVLA* m, const RowBlocks* rb, const FlowLayer* w, const FlowLayer* g,
                                    const FlowLayerActs* x, float* dres, float* datt, int D) {
    const FlowActivations* a = &m->acts;
    size_t C = w->C, F = w->F;
    for (int k = 0; k < rb->count; k++) {
        size_t r = rb_row(rb, k);
        int n = rb->rows;
        memset(a->g_act + r * F, 0, n * F * sizeof(float));
        linear_backward(a->g_act + r * F, g->down, NULL, dres + r * C, x->act + r * F, w->down, n, F, C);
        glu_backward(a->g_gate + r * F, a->g_up + r * F, a->g_act + r * F, x->gate + r * F, x->up + r * F, n * F,
                     w->gelu);
        memset(a->g_ln + r * C, 0, n * C * sizeof(float));
        linear_backward(a->g_ln + r * C, g->gate, NULL, a->g_gate + r * F, x->ln2 + r * C, w->gate, n, C, F);
        linear_backward(a->g_ln + r * C, g->up, NULL, a->g_up + r * F, x->ln2 + r * C, w->up, n, C, F);
        rmsnorm_backward(dres + r * C, g->ln2, a->g_ln + r * C, x->mid + r * C, w->ln2, x->rstd2 + r, n, C, w->offset);
        memset(datt + r * D, 0, n * D * sizeof(float));
        linear_backward(datt + r * D, g->wo, NULL, dres + r * C, x->att + r * D, w->wo, n, D, C);
    }
}

// Backward of ln1 and the q/k/v projections on the rows of rb: dq, dk, dv are the gradients of
// the projections' outputs, already rotated back from RoPE (dq NULL: the VLM's last layer has no
// query; dk, dv NULL: an expert cross layer's keys/values are not its own). d(res) through ln1 is
// added to dres.
static void flow_layer_qkv_backward(const FlowVLA* m, const RowBlocks* rb, const FlowLayer* w, const FlowLayer* g,
                                    const FlowLayerActs* x, float* dres, const float* dq, const float* dk,
                                    const float* dv) {
    const FlowActivations* a = &m->acts;
    size_t C = w->C, D = flow_d_attn(&m->config), KV = flow_d_kv(&m->config);
    for (int k = 0; k < rb->count; k++) {
        size_t r = rb_row(rb, k);
        int n = rb->rows;
        memset(a->g_ln + r * C, 0, n * C * sizeof(float));
        if (dq != NULL) { linear_backward(a->g_ln + r * C, g->wq, NULL, dq + r * D, x->ln1 + r * C, w->wq, n, C, D); }
        if (dk != NULL) { linear_backward(a->g_ln + r * C, g->wk, NULL, dk + r * KV, x->ln1 + r * C, w->wk, n, C, KV); }
        if (dv != NULL) { linear_backward(a->g_ln + r * C, g->wv, NULL, dv + r * KV, x->ln1 + r * C, w->wv, n, C, KV); }
        rmsnorm_backward(dres + r * C, g->ln1, a->g_ln + r * C, x->res + r * C, w->ln1, x->rstd1 + r, n, C, w->offset);
    }
}

// RoPE of rows of rb (x: (N, n_heads*HS), pos: (N)); sign -1 rotates back
static void flow_rope_rows(const FlowVLA* m, const RowBlocks* rb, float* x, const int* pos, int n_heads, float sign) {
    int HS = m->config.head_dim;
    for (int k = 0; k < rb->count; k++) {
        size_t r = rb_row(rb, k);
        rope_at(x + r * n_heads * HS, m->rope_cos, m->rope_sin, pos + r, rb->rows, n_heads, HS, sign);
    }
}

// ---- forward

// Every camera's frames -> acts.pixels (NV, 3, S, S), camera-major (image n = cam * B + b)
static void flow_prepare_images(FlowVLA* m, const ModelInputs* in) {
    const FlowConfig* c = &m->config;
    size_t per = (size_t)3 * c->img * c->img;
    for (int cam = 0; cam < c->n_cam; cam++) {
        size_t frame = (size_t)in->frame_h[cam] * in->frame_w[cam] * 3;
        for (int b = 0; b < in->B; b++) {
            resize_pad(m->acts.pixels + ((size_t)cam * in->B + b) * per, in->frames[cam] + b * frame,
                       in->frame_h[cam], in->frame_w[cam], c->img, flow_pad_centred(c));
        }
    }
}

// SigLIP over every image: pixels -> acts.v_out (V, Cv). Position i of the table is patch i (the
// bucketed position ids of SmolVLM are the identity at the trained image size).
static void flow_vision_forward(FlowVLA* m) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int NV = (int)flow_images(c, m->B), Nv = flow_grid(c) * flow_grid(c), V = (int)flow_vrows(c, m->B);
    int Cv = c->vis_width, Fv = c->vis_ff, HSv = Cv / c->vis_heads;
    size_t VC = (size_t)V * Cv;
    patchify_chw(a->patches, a->pixels, NV, c->img, c->patch);
    matmul_forward(a->v_res, a->patches, m->params.vis_patch_w, m->params.vis_patch_b, V, flow_patch_dim(c), Cv);
    pos_emb_forward(a->v_res, m->params.vis_pos, NV, Nv, Cv);
    GqaAttn keys = {.B = NV, .NH = c->vis_heads, .NKV = c->vis_heads, .HS = HSv, .Tq = Nv, .q0 = 0, .Nk0 = Nv,
                    .Nk1 = 0, .Nt = Nv};
    for (int l = 0; l < c->vis_layers; l++) {
        FlowVisionActs x = flow_vision_acts(m, l);
        layernorm_forward(x.ln1, x.mean1, x.rstd1, x.res, flow_param(m, FLOWP_vis_ln1_w, l),
                          flow_param(m, FLOWP_vis_ln1_b, l), V, Cv, FLOW_VISION_EPS);
        matmul_forward(x.q, x.ln1, flow_param(m, FLOWP_vis_wq, l), flow_param(m, FLOWP_vis_bq, l), V, Cv, Cv);
        matmul_forward(x.k, x.ln1, flow_param(m, FLOWP_vis_wk, l), flow_param(m, FLOWP_vis_bk, l), V, Cv, Cv);
        matmul_forward(x.v, x.ln1, flow_param(m, FLOWP_vis_wv, l), flow_param(m, FLOWP_vis_bv, l), V, Cv, Cv);
        keys.k0 = x.k; keys.v0 = x.v;
        gqa_attention_forward(x.att, x.lse, x.q, &keys);
        matmul_forward(x.mid, x.att, flow_param(m, FLOWP_vis_wo, l), flow_param(m, FLOWP_vis_bo, l), V, Cv, Cv);
        for (size_t i = 0; i < VC; i++) { x.mid[i] += x.res[i]; }
        layernorm_forward(x.ln2, x.mean2, x.rstd2, x.mid, flow_param(m, FLOWP_vis_ln2_w, l),
                          flow_param(m, FLOWP_vis_ln2_b, l), V, Cv, FLOW_VISION_EPS);
        matmul_forward(x.fc1, x.ln2, flow_param(m, FLOWP_vis_fc1_w, l), flow_param(m, FLOWP_vis_fc1_b, l), V, Cv,
                       Fv);
        gelu_forward(x.gelu, x.fc1, (size_t)V * Fv);
        matmul_forward(x.out, x.gelu, flow_param(m, FLOWP_vis_fc2_w, l), flow_param(m, FLOWP_vis_fc2_b, l), V, Fv,
                       Cv);
        for (size_t i = 0; i < VC; i++) { x.out[i] += x.mid[i]; }
    }
    layernorm_forward(a->v_out, a->v_omean, a->v_orstd, flow_vision_acts(m, c->vis_layers - 1).out,
                      m->params.vis_post_w, m->params.vis_post_b, V, Cv, FLOW_VISION_EPS);
}

// The prefix's embeddings p_res[0] = [camera 0 tokens]...[language][state (SmolVLA)] per
// sample, and the sequence's mask (valid, block) and RoPE positions over [prefix ; suffix]. Image
// tokens are scaled by sqrt(C) (float32's, as LeRobot) in SmolVLA and not in pi0; language by
// sqrt(C) in both; the state token is not.
static void flow_prefix_embed(FlowVLA* m, const ModelInputs* in) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = flow_image_tokens(c), Np = flow_n_prefix(c), Ns = flow_n_suffix(c);
    int T = Np + Ns, NV = (int)flow_images(c, B), Lt = c->max_text,
        S2C = c->scale_factor * c->scale_factor * c->vis_width;
    int state_at = flow_state_in_suffix(c) ? Np : Np - 1;  // the state token's sequence index
    float scale = (float)sqrt((double)C), img_scale = flow_scales_images(c) ? scale : 1.0f;
    pixel_shuffle_forward(a->shuffled, a->v_out, NV, flow_grid(c), c->vis_width, c->scale_factor);
    matmul_forward(a->img_tok, a->shuffled, m->params.connector_w, m->params.connector_b, NV * NI, S2C, C);
    for (int b = 0; b < B; b++) {
        float* x = a->p_res + (size_t)b * Np * C;
        for (int cam = 0; cam < c->n_cam; cam++) {
            const float* src = a->img_tok + ((size_t)cam * B + b) * NI * C;
            float* dst = x + (size_t)cam * NI * C;
            if (img_scale == 1.0f) { memcpy(dst, src, (size_t)NI * C * sizeof(float)); continue; }
            for (size_t i = 0; i < (size_t)NI * C; i++) { dst[i] = src[i] * img_scale; }
        }
        for (int i = 0; i < Lt; i++) {
            int tok = in->tokens[(size_t)b * Lt + i];
            if (tok < 0 || tok >= c->vocab) {
                vla_fail("token id %d of sample %d is outside the vocabulary of %d", tok, b, c->vocab);
            }
            m->tokens[(size_t)b * Lt + i] = tok;
        }
        embed_tokens_forward(x + (size_t)c->n_cam * NI * C, m->tokens + (size_t)b * Lt, m->params.embed_tokens, Lt, C,
                             scale);
        memcpy(a->state + (size_t)b * c->max_state_dim, in->state + (size_t)b * c->max_state_dim,
               c->max_state_dim * sizeof(float));
        // mask and positions over the whole sequence [prefix ; suffix]: the state token is block 1,
        // action k block 2 + k (causal) or 2 (bidirectional), everything before the state block 0
        float* valid = a->valid + (size_t)b * T;
        int* block = m->block + (size_t)b * T;
        int n_valid = 0, causal = flow_actions_causal(c);
        for (int j = 0; j < T; j++) {
            int text = j - c->n_cam * NI;
            valid[j] = text >= 0 && text < Lt ? (in->token_mask[(size_t)b * Lt + text] != 0.0f) : 1.0f;
            block[j] = j < state_at ? 0 : j == state_at ? 1 : causal ? j - state_at + 1 : 2;
            n_valid += valid[j] != 0.0f;
            if (j < Np) { m->p_pos[(size_t)b * Np + j] = n_valid - 1; }
            else { m->s_pos[(size_t)b * Ns + j - Np] = n_valid - 1; m->x_pos[(size_t)b * Ns + j - Np] = j - Np; }
        }
    }
    if (flow_state_in_suffix(c)) { return; }  // the suffix's first token (flow_suffix_embed)
    float* states = a->g_img;  // (B, C) state_proj of every sample at once, then into place
    matmul_forward(states, a->state, m->params.state_w, m->params.state_b, B, c->max_state_dim, C);
    for (int b = 0; b < B; b++) {
        memcpy(a->p_res + ((size_t)b * Np + Np - 1) * C, states + (size_t)b * C, C * sizeof(float));
    }
}

// The VLM's layers over the prefix. Its last layer computes only ln1 and the keys and values: its
// output and the final norm feed nothing (LeRobot computes and drops them).
static void flow_vlm_forward(FlowVLA* m) {
    const FlowConfig* c = &m->config;
    int P = (int)flow_prows(c, m->B), Np = flow_n_prefix(c), D = flow_d_attn(c), KV = flow_d_kv(c);
    GqaAttn keys = {.block = m->block, .B = m->B, .NH = c->n_head, .NKV = c->n_kv_head, .HS = c->head_dim, .Tq = Np,
                    .q0 = 0, .Nk0 = Np, .Nk1 = 0, .Nt = Np + flow_n_suffix(c), .valid = m->acts.valid};
    for (int l = 0; l < c->n_layer; l++) {
        FlowLayer w = flow_layer(m, 0, l, 0, 0);
        FlowLayerActs x = flow_layer_acts(m, 0, l);
        rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, P, w.C, w.eps, w.offset);
        matmul_forward(x.k, x.ln1, w.wk, NULL, P, w.C, KV);
        rope_at(x.k, m->rope_cos, m->rope_sin, m->p_pos, P, c->n_kv_head, c->head_dim, 1.0f);
        matmul_forward(x.v, x.ln1, w.wv, NULL, P, w.C, KV);
        if (l == c->n_layer - 1) { break; }
        matmul_forward(x.q, x.ln1, w.wq, NULL, P, w.C, D);
        rope_at(x.q, m->rope_cos, m->rope_sin, m->p_pos, P, c->n_head, c->head_dim, 1.0f);
        keys.k0 = x.k; keys.v0 = x.v;
        gqa_attention_forward(x.att, x.lse, x.q, &keys);
        flow_layer_out_forward(&w, &x, P, D);
    }
}

// The suffix's tokens s_res[0]: the H action tokens of the noisy chunk acts.x_t at flow time t
// (B) = action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time embedding]))),
// after pi0's state token state_proj(state).
static void flow_suffix_embed(FlowVLA* m, const float* t) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, H = c->chunk, Ns = flow_n_suffix(c), Ce = c->d_expert, A = (int)flow_arows(c, B);
    matmul_forward(a->a_in, a->x_t, m->params.action_in_w, m->params.action_in_b, A, c->max_action_dim, Ce);
    for (int b = 0; b < B; b++) {
        float temb[Ce];
        flow_time_embedding(temb, t[b], Ce);
        for (int j = 0; j < H; j++) {
            float* row = a->a_emb + ((size_t)b * H + j) * 2 * Ce;
            memcpy(row, a->a_in + ((size_t)b * H + j) * Ce, Ce * sizeof(float));
            memcpy(row + Ce, temb, Ce * sizeof(float));
        }
    }
    matmul_forward(a->t_pre, a->a_emb, m->params.time_in_w, m->params.time_in_b, A, 2 * Ce, Ce);
    silu_forward(a->t_act, a->t_pre, (size_t)A * Ce);
    if (!flow_state_in_suffix(c)) {
        matmul_forward(a->s_res, a->t_act, m->params.time_out_w, m->params.time_out_b, A, Ce, Ce);
        return;
    }
    float* states = a->g_img;  // (B, Ce)
    matmul_forward(states, a->state, m->params.state_w, m->params.state_b, B, c->max_state_dim, Ce);
    for (int b = 0; b < B; b++) {
        memcpy(a->s_res + (size_t)b * Ns * Ce, states + (size_t)b * Ce, Ce * sizeof(float));
        matmul_forward(a->s_res + ((size_t)b * Ns + 1) * Ce, a->t_act + (size_t)b * H * Ce, m->params.time_out_w,
                       m->params.time_out_b, H, Ce, Ce);
    }
}

// The expert's layers over the suffix s_res[0] -> final norm -> action_out_proj of the action
// tokens: acts.v_t. Joint layer: the suffix's q/k/v with RoPE at their positions (after the valid
// prefix), keys = [the VLM's prefix K/V of this layer ; the suffix's own], under the block mask
// (actions see the valid prefix, the state and earlier actions, or all actions in pi0). Cross layer: q with RoPE at
// positions 0.., keys and values = the VLM's post-RoPE K/V of this layer re-projected by the expert's k_proj/v_proj (no
// second RoPE), the valid prefix only. reuse_cross_kv: the re-projections from the previous call are still valid
// (sampling: the prefix does not change between Euler steps).
static void flow_expert_forward(FlowVLA* m, int reuse_cross_kv) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int R = (int)flow_rrows(c, m->B), P = (int)flow_prows(c, m->B), Np = flow_n_prefix(c),
        H = flow_n_suffix(c);
    int D = flow_d_attn(c), KV = flow_d_kv(c), Ce = c->d_expert;
    for (int l = 0; l < c->n_layer; l++) {
        FlowLayer w = flow_layer(m, 1, l, 0, 0);
        FlowLayerActs x = flow_layer_acts(m, 1, l), px = flow_layer_acts(m, 0, l);
        rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, R, Ce, w.eps, w.offset);
        matmul_forward(x.q, x.ln1, w.wq, NULL, R, Ce, D);
        GqaAttn keys = {.k0 = px.k, .v0 = px.v, .block = m->block, .B = m->B, .NH = c->n_head, .NKV = c->n_kv_head,
                        .HS = c->head_dim, .Tq = H, .q0 = Np, .Nk0 = Np, .Nk1 = 0, .Nt = Np + H, .valid = a->valid};
        if (!w.cross) {
            rope_at(x.q, m->rope_cos, m->rope_sin, m->s_pos, R, c->n_head, c->head_dim, 1.0f);
            matmul_forward(x.k, x.ln1, w.wk, NULL, R, Ce, KV);
            rope_at(x.k, m->rope_cos, m->rope_sin, m->s_pos, R, c->n_kv_head, c->head_dim, 1.0f);
            matmul_forward(x.v, x.ln1, w.wv, NULL, R, Ce, KV);
            keys.Nk1 = H; keys.k1 = x.k; keys.v1 = x.v;
        } else {
            rope_at(x.q, m->rope_cos, m->rope_sin, m->x_pos, R, c->n_head, c->head_dim, 1.0f);
            float* ck = a->c_k + (size_t)l * P * KV;
            float* cv = a->c_v + (size_t)l * P * KV;
            if (!reuse_cross_kv) {
                matmul_forward(ck, px.k, w.wk, NULL, P, KV, KV);
                matmul_forward(cv, px.v, w.wv, NULL, P, KV, KV);
            }
            keys.k0 = ck; keys.v0 = cv;
        }
        gqa_attention_forward(x.att, x.lse, x.q, &keys);
        flow_layer_out_forward(&w, &x, R, D);
    }
    rmsnorm_forward(a->f_ln, a->f_rstd, a->s_res + (size_t)c->n_layer * R * Ce, m->params.exp_norm, R, Ce,
                    flow_rms_eps(c), flow_rms_offset(c));
    RowBlocks act = flow_action_rows(c, m->B);
    for (int k = 0; k < act.count; k++) {
        matmul_forward(a->v_t + (size_t)k * act.rows * c->max_action_dim, a->f_ln + rb_row(&act, k) * Ce,
                       m->params.action_out_w, m->params.action_out_b, act.rows, Ce, c->max_action_dim);
    }
}

// Images, vision tower, prefix embeddings and the VLM: everything the actions attend to.
static void flow_encode_prefix(FlowVLA* m, const ModelInputs* in) {
    flow_set_batch(m, in->B);
    flow_prepare_images(m, in);
    flow_vision_forward(m);
    flow_prefix_embed(m, in);
    flow_vlm_forward(m);
}

// Training forward: x_t = t noise + (1 - t) actions, velocity v_t (acts.v_t), target
// u = noise - actions, the squared errors over the valid entries (flow_matching_loss). Leaves the
// gradient for the backward in acts.d_vt: of the mean (mean = 1) or of the sum (0). Returns the sum
// of squared errors, the valid entries in *entries.
static double flow_forward_loss(FlowVLA* m, const ModelInputs* in, int mean, int* entries) {
    const FlowConfig* c = &m->config;
    flow_encode_prefix(m, in);
    FlowActivations* a = &m->acts;
    int B = in->B, H = c->chunk, Am = c->max_action_dim;
    for (int b = 0; b < B; b++) {
        float t = in->t[b];
        for (int i = 0; i < H * Am; i++) {
            size_t k = (size_t)b * H * Am + i;
            a->x_t[k] = t * in->noise[k] + (1.0f - t) * in->actions[k];
        }
    }
    flow_suffix_embed(m, in->t);
    flow_expert_forward(m, 0);
    double sum = flow_matching_loss(a->d_vt, a->v_t, in->noise, in->actions,
                                    flow_loss_masks_pad(c) ? in->action_is_pad : NULL, B * H, Am, c->action_dim,
                                    mean, entries);
    m->loss = (float)(sum / (double)(*entries > 1 ? *entries : 1));
    return sum;
}

// ---- backward

// d acts.d_vt -> action_out_proj (of the action rows) -> the expert's norm and layers -> d s_res[0]
// in g_res (R, Ce).
// Gradients into the VLM's keys/values of each layer are added to dp_k/dp_v, for prefix rows
// p >= r0 of each sample (flow_backward says why not the others).
static void flow_expert_backward(FlowVLA* m, int mode, int r0) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, R = (int)flow_rrows(c, B), P = (int)flow_prows(c, B), Np = flow_n_prefix(c);
    int H = flow_n_suffix(c), D = flow_d_attn(c), KV = flow_d_kv(c), Ce = c->d_expert, L = c->n_layer;
    float* dres = a->g_res;
    memset(a->g_ln, 0, (size_t)R * Ce * sizeof(float));
    RowBlocks act = flow_action_rows(c, B);
    for (int k = 0; k < act.count; k++) {
        size_t r = rb_row(&act, k);
        linear_backward(a->g_ln + r * Ce, flow_grad(m, mode, FLOWP_action_out_w, 0),
                        flow_grad(m, mode, FLOWP_action_out_b, 0),
                        a->d_vt + (size_t)k * act.rows * c->max_action_dim, a->f_ln + r * Ce, m->params.action_out_w,
                        act.rows, Ce, c->max_action_dim);
    }
    memset(dres, 0, (size_t)R * Ce * sizeof(float));
    rmsnorm_backward(dres, flow_grad(m, mode, FLOWP_exp_norm, 0), a->g_ln, a->s_res + (size_t)L * R * Ce,
                     m->params.exp_norm, a->f_rstd, R, Ce, flow_rms_offset(c));
    RowBlocks all = {1, R, 0, 0};
    RowBlocks prefix = r0 == 0 ? (RowBlocks){1, P, 0, 0} : (RowBlocks){B, Np - r0, (size_t)r0, (size_t)Np};
    for (int l = L - 1; l >= 0; l--) {
        FlowLayer w = flow_layer(m, 1, l, 0, mode), g = flow_layer(m, 1, l, 1, mode);
        FlowLayerActs x = flow_layer_acts(m, 1, l), px = flow_layer_acts(m, 0, l);
        float* dpk = a->dp_k + (size_t)l * P * KV;
        float* dpv = a->dp_v + (size_t)l * P * KV;
        flow_layer_out_backward(m, &all, &w, &g, &x, dres, a->g_att, D);
        GqaAttn keys = {.k0 = px.k, .v0 = px.v, .block = m->block, .B = B, .NH = c->n_head, .NKV = c->n_kv_head,
                        .HS = c->head_dim, .Tq = H, .q0 = Np, .Nk0 = Np, .Nk1 = 0, .Nt = Np + H, .valid = a->valid};
        if (!w.cross) {
            keys.Nk1 = H; keys.k1 = x.k; keys.v1 = x.v;
            memset(a->g_k, 0, (size_t)R * KV * sizeof(float));
            memset(a->g_v, 0, (size_t)R * KV * sizeof(float));
            gqa_attention_backward(a->g_q, dpk, dpv, a->g_k, a->g_v, a->g_att, x.q, x.att, x.lse, &keys, r0, 0);
            rope_at(a->g_q, m->rope_cos, m->rope_sin, m->s_pos, R, c->n_head, c->head_dim, -1.0f);
            rope_at(a->g_k, m->rope_cos, m->rope_sin, m->s_pos, R, c->n_kv_head, c->head_dim, -1.0f);
            flow_layer_qkv_backward(m, &all, &w, &g, &x, dres, a->g_q, a->g_k, a->g_v);
        } else {
            float* ck = a->c_k + (size_t)l * P * KV;
            float* cv = a->c_v + (size_t)l * P * KV;
            keys.k0 = ck; keys.v0 = cv;
            memset(a->g_k, 0, (size_t)P * KV * sizeof(float));
            memset(a->g_v, 0, (size_t)P * KV * sizeof(float));
            // every prefix row's re-projected K/V gradient: the cross k_proj/v_proj weights need them all
            gqa_attention_backward(a->g_q, a->g_k, a->g_v, NULL, NULL, a->g_att, x.q, x.att, x.lse, &keys, 0, 0);
            linear_backward(NULL, g.wk, NULL, a->g_k, px.k, w.wk, P, KV, KV);
            linear_backward(NULL, g.wv, NULL, a->g_v, px.v, w.wv, P, KV, KV);
            for (int k = 0; k < prefix.count; k++) {  // through the re-projection into the VLM's post-RoPE K/V
                size_t r = rb_row(&prefix, k);
                linear_backward(dpk + r * KV, NULL, NULL, a->g_k + r * KV, NULL, w.wk, prefix.rows, KV, KV);
                linear_backward(dpv + r * KV, NULL, NULL, a->g_v + r * KV, NULL, w.wv, prefix.rows, KV, KV);
            }
            rope_at(a->g_q, m->rope_cos, m->rope_sin, m->x_pos, R, c->n_head, c->head_dim, -1.0f);
            flow_layer_qkv_backward(m, &all, &w, &g, &x, dres, a->g_q, NULL, NULL);
        }
    }
}

// d s_res[0] (g_res) -> action_time_mlp_out, SiLU, action_time_mlp_in -> action_in_proj, and
// pi0's state token -> state_proj. The time embedding half of action_time_mlp_in's input has no
// parameters behind it.
static void flow_suffix_embed_backward(FlowVLA* m, int mode) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, H = c->chunk, Ns = flow_n_suffix(c), A = (int)flow_arows(c, B), Ce = c->d_expert;
    const float* dtok = a->g_res;  // (A, Ce) d of the action tokens
    if (flow_state_in_suffix(c)) {  // the suffix's rows apart: the action tokens in g_ln, the states in g_img
        float* dstate = a->g_img;
        float* dact = a->g_ln;
        for (int b = 0; b < B; b++) {
            memcpy(dstate + (size_t)b * Ce, a->g_res + (size_t)b * Ns * Ce, Ce * sizeof(float));
            memcpy(dact + (size_t)b * H * Ce, a->g_res + ((size_t)b * Ns + 1) * Ce, (size_t)H * Ce * sizeof(float));
        }
        linear_backward(NULL, flow_grad(m, mode, FLOWP_state_w, 0), flow_grad(m, mode, FLOWP_state_b, 0), dstate,
                        a->state, m->params.state_w, B, c->max_state_dim, Ce);
        dtok = dact;
    }
    float* dtact = a->g_tok;  // (A, Ce)
    memset(dtact, 0, (size_t)A * Ce * sizeof(float));
    linear_backward(dtact, flow_grad(m, mode, FLOWP_time_out_w, 0), flow_grad(m, mode, FLOWP_time_out_b, 0), dtok,
                    a->t_act, m->params.time_out_w, A, Ce, Ce);
    silu_backward(dtact, dtact, a->t_pre, (size_t)A * Ce);
    float* demb = a->g_emb;  // (A, 2Ce)
    memset(demb, 0, (size_t)A * 2 * Ce * sizeof(float));
    linear_backward(demb, flow_grad(m, mode, FLOWP_time_in_w, 0), flow_grad(m, mode, FLOWP_time_in_b, 0), dtact,
                    a->a_emb, m->params.time_in_w, A, 2 * Ce, Ce);
    float* dain = a->g_tok;  // (A, Ce): the action_in_proj half (dtact is spent)
    for (int r = 0; r < A; r++) { memcpy(dain + (size_t)r * Ce, demb + (size_t)r * 2 * Ce, Ce * sizeof(float)); }
    linear_backward(NULL, flow_grad(m, mode, FLOWP_action_in_w, 0), flow_grad(m, mode, FLOWP_action_in_b, 0),
                    dain, a->x_t, m->params.action_in_w, A, c->max_action_dim, Ce);
}

// The VLM's layers backward, from the expert's gradients on their keys/values (dp_k, dp_v), down
// to d p_res[0] in g_res (P, C), on the prefix rows p >= r0 of each sample. Its last layer is only
// ln1 -> k/v: frozen in every mode, yet the gradient passes through it into the layers below.
static void flow_vlm_backward(FlowVLA* m, int mode, int r0) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, P = (int)flow_prows(c, B), Np = flow_n_prefix(c), D = flow_d_attn(c), KV = flow_d_kv(c);
    RowBlocks rows = r0 == 0 ? (RowBlocks){1, P, 0, 0} : (RowBlocks){B, Np - r0, (size_t)r0, (size_t)Np};
    float* dres = a->g_res;
    memset(dres, 0, (size_t)P * c->d_model * sizeof(float));
    GqaAttn keys = {.block = m->block, .B = B, .NH = c->n_head, .NKV = c->n_kv_head, .HS = c->head_dim, .Tq = Np,
                    .q0 = 0, .Nk0 = Np, .Nk1 = 0, .Nt = Np + flow_n_suffix(c), .valid = a->valid};
    for (int l = c->n_layer - 1; l >= 0; l--) {
        FlowLayer w = flow_layer(m, 0, l, 0, mode), g = flow_layer(m, 0, l, 1, mode);
        FlowLayerActs x = flow_layer_acts(m, 0, l);
        float* dk = a->dp_k + (size_t)l * P * KV;
        float* dv = a->dp_v + (size_t)l * P * KV;
        const float* dq = NULL;
        if (l < c->n_layer - 1) {
            flow_layer_out_backward(m, &rows, &w, &g, &x, dres, a->g_att, D);
            keys.k0 = x.k; keys.v0 = x.v;
            gqa_attention_backward(a->g_q, dk, dv, NULL, NULL, a->g_att, x.q, x.att, x.lse, &keys, r0, r0);
            flow_rope_rows(m, &rows, a->g_q, m->p_pos, c->n_head, -1.0f);
            dq = a->g_q;
        }
        flow_rope_rows(m, &rows, dk, m->p_pos, c->n_kv_head, -1.0f);
        flow_layer_qkv_backward(m, &rows, &w, &g, &x, dres, dq, dk, dv);
    }
}

// d p_res[0] (g_res) -> state_proj (SmolVLA's state token, every mode); embed_tokens and the
// connector (vlm, all: the pad id's row gets nothing, as nn.Embedding's padding_idx); into the
// vision tower's output (all: g_shuf holds d shuffled on return).
static void flow_prefix_embed_backward(FlowVLA* m, int mode) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = flow_image_tokens(c), Np = flow_n_prefix(c), Lt = c->max_text;
    int NV = (int)flow_images(c, B), S2C = c->scale_factor * c->scale_factor * c->vis_width;
    float scale = (float)sqrt((double)C), img_scale = flow_scales_images(c) ? scale : 1.0f;
    const float* dx = a->g_res;
    if (!flow_state_in_suffix(c)) {
        float* dstate = a->g_img;  // (B, C) the state rows
        for (int b = 0; b < B; b++) {
            memcpy(dstate + (size_t)b * C, dx + ((size_t)b * Np + Np - 1) * C, C * sizeof(float));
        }
        linear_backward(NULL, flow_grad(m, mode, FLOWP_state_w, 0), flow_grad(m, mode, FLOWP_state_b, 0), dstate,
                        a->state, m->params.state_w, B, c->max_state_dim, C);
    }
    float* demb = flow_grad(m, mode, FLOWP_embed_tokens, 0);
    for (int b = 0; b < B && demb != NULL; b++) {
        embed_tokens_backward(demb, dx + ((size_t)b * Np + (size_t)c->n_cam * NI) * C, m->tokens + (size_t)b * Lt, Lt,
                              C, scale, c->pad_token);
    }
    float* dconn = flow_grad(m, mode, FLOWP_connector_w, 0);
    int into_vision = flow_grad(m, mode, FLOWP_vis_post_w, 0) != NULL;
    if (dconn == NULL && !into_vision) { return; }
    float* dimg = a->g_img;  // (NV*NI, C) image rows, camera-major like img_tok
    for (int b = 0; b < B; b++) {
        for (int cam = 0; cam < c->n_cam; cam++) {
            const float* src = dx + ((size_t)b * Np + (size_t)cam * NI) * C;
            float* dst = dimg + ((size_t)cam * B + b) * NI * C;
            for (size_t i = 0; i < (size_t)NI * C; i++) { dst[i] = src[i] * img_scale; }
        }
    }
    if (into_vision) { memset(a->g_shuf, 0, flow_vrows(c, B) * c->vis_width * sizeof(float)); }
    linear_backward(into_vision ? a->g_shuf : NULL, dconn, flow_grad(m, mode, FLOWP_connector_b, 0), dimg,
                    a->shuffled, m->params.connector_w, NV * NI, S2C, C);
}

// d shuffled (g_shuf) -> pixel shuffle -> post_layernorm -> SigLIP layers -> position and patch
// embeddings. Nothing flows into the pixels.
static void flow_vision_backward(FlowVLA* m, int mode) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int NV = (int)flow_images(c, m->B), Nv = flow_grid(c) * flow_grid(c), V = (int)flow_vrows(c, m->B);
    int Cv = c->vis_width, Fv = c->vis_ff, HSv = Cv / c->vis_heads;
    size_t VC = (size_t)V * Cv;
    float* dres = a->g_res;
    pixel_shuffle_backward(a->g_ln, a->g_shuf, NV, flow_grid(c), Cv, c->scale_factor);  // d v_out
    memset(dres, 0, VC * sizeof(float));
    layernorm_backward(dres, flow_grad(m, mode, FLOWP_vis_post_w, 0), flow_grad(m, mode, FLOWP_vis_post_b, 0),
                       a->g_ln, flow_vision_acts(m, c->vis_layers - 1).out, m->params.vis_post_w, a->v_omean,
                       a->v_orstd, V, Cv);
    GqaAttn keys = {.B = NV, .NH = c->vis_heads, .NKV = c->vis_heads, .HS = HSv, .Tq = Nv, .q0 = 0, .Nk0 = Nv,
                    .Nk1 = 0, .Nt = Nv};
    for (int l = c->vis_layers - 1; l >= 0; l--) {
        FlowVisionActs x = flow_vision_acts(m, l);
        // MLP: out = mid + fc2(gelu(fc1(ln2(mid))))
        memset(a->g_act, 0, (size_t)V * Fv * sizeof(float));
        linear_backward(a->g_act, flow_grad(m, mode, FLOWP_vis_fc2_w, l), flow_grad(m, mode, FLOWP_vis_fc2_b, l),
                        dres, x.gelu, flow_param(m, FLOWP_vis_fc2_w, l), V, Fv, Cv);
        gelu_backward(a->g_gate, a->g_act, x.fc1, (size_t)V * Fv);
        memset(a->g_ln, 0, VC * sizeof(float));
        linear_backward(a->g_ln, flow_grad(m, mode, FLOWP_vis_fc1_w, l), flow_grad(m, mode, FLOWP_vis_fc1_b, l),
                        a->g_gate, x.ln2, flow_param(m, FLOWP_vis_fc1_w, l), V, Cv, Fv);
        layernorm_backward(dres, flow_grad(m, mode, FLOWP_vis_ln2_w, l), flow_grad(m, mode, FLOWP_vis_ln2_b, l),
                           a->g_ln, x.mid, flow_param(m, FLOWP_vis_ln2_w, l), x.mean2, x.rstd2, V, Cv);
        // attention: mid = x + out_proj(attention(q, k, v))
        memset(a->g_att, 0, VC * sizeof(float));
        linear_backward(a->g_att, flow_grad(m, mode, FLOWP_vis_wo, l), flow_grad(m, mode, FLOWP_vis_bo, l), dres,
                        x.att, flow_param(m, FLOWP_vis_wo, l), V, Cv, Cv);
        keys.k0 = x.k; keys.v0 = x.v;
        memset(a->g_k, 0, VC * sizeof(float));
        memset(a->g_v, 0, VC * sizeof(float));
        gqa_attention_backward(a->g_q, a->g_k, a->g_v, NULL, NULL, a->g_att, x.q, x.att, x.lse, &keys, 0, 0);
        memset(a->g_ln, 0, VC * sizeof(float));
        linear_backward(a->g_ln, flow_grad(m, mode, FLOWP_vis_wq, l), flow_grad(m, mode, FLOWP_vis_bq, l), a->g_q,
                        x.ln1, flow_param(m, FLOWP_vis_wq, l), V, Cv, Cv);
        linear_backward(a->g_ln, flow_grad(m, mode, FLOWP_vis_wk, l), flow_grad(m, mode, FLOWP_vis_bk, l), a->g_k,
                        x.ln1, flow_param(m, FLOWP_vis_wk, l), V, Cv, Cv);
        linear_backward(a->g_ln, flow_grad(m, mode, FLOWP_vis_wv, l), flow_grad(m, mode, FLOWP_vis_bv, l), a->g_v,
                        x.ln1, flow_param(m, FLOWP_vis_wv, l), V, Cv, Cv);
        layernorm_backward(dres, flow_grad(m, mode, FLOWP_vis_ln1_w, l), flow_grad(m, mode, FLOWP_vis_ln1_b, l),
                           a->g_ln, x.res, flow_param(m, FLOWP_vis_ln1_w, l), x.mean1, x.rstd1, V, Cv);
    }
    float* dpos = flow_grad(m, mode, FLOWP_vis_pos, 0);
    if (dpos != NULL) { pos_emb_backward(dpos, dres, NV, Nv, Cv); }
    linear_backward(NULL, flow_grad(m, mode, FLOWP_vis_patch_w, 0), flow_grad(m, mode, FLOWP_vis_patch_b, 0),
                    dres, a->patches, m->params.vis_patch_w, V, flow_patch_dim(c), Cv);
}

// Gradients of the last flow_forward's loss for the tensors that train in `mode`
// (TRAIN_MODE_EXPERT, _VLM, _ALL: LeRobot's train_expert_only / freeze_vision_encoder), into
// grads_memory: the trainable part of every tensor is overwritten, the rest is never touched.
// No work is done for gradients nothing trainable needs:
//   expert: the expert, its heads and state_proj train. SmolVLA's state token is the prefix's last
//     row (block 1): the rows before it (images and language, block 0) never see it, so only that
//     row is taken back through the (frozen) VLM: r0 = Np - 1. pi0's is in the suffix: nothing
//     goes back into the VLM (r0 = Np). Nothing reaches the vision tower.
//   vlm:    the whole prefix goes back through the VLM (all but its last layer train, and the last
//     one passes the gradient of its keys/values down), into embed_tokens and the connector; the
//     vision tower gets nothing.
//   all:    and on through the vision tower.
static void flow_backward(FlowVLA* m, int mode) {
    const FlowConfig* c = &m->config;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m->table.spec[i];
        memset(m->grads_memory + s->offset, 0, flow_trainable_numel(s, mode) * sizeof(float));
    }
    int Np = flow_n_prefix(c);
    int r0 = mode != TRAIN_MODE_EXPERT ? 0 : flow_state_in_suffix(c) ? Np : Np - 1;
    size_t kv = (size_t)c->n_layer * flow_prows(c, m->B) * flow_d_kv(c);
    memset(m->acts.dp_k, 0, kv * sizeof(float));
    memset(m->acts.dp_v, 0, kv * sizeof(float));
    flow_expert_backward(m, mode, r0);
    flow_suffix_embed_backward(m, mode);
    if (r0 < Np) {
        flow_vlm_backward(m, mode, r0);
        flow_prefix_embed_backward(m, mode);
    }
    if (flow_grad(m, mode, FLOWP_vis_post_w, 0) != NULL) {
        if (m->mode != TRAIN_MODE_ALL) {  // its forward kept one vision layer's activations
            vla_fail("a backward into the vision tower on a model built for --train %s", TRAIN_MODE_NAMES[m->mode]);
        }
        flow_vision_backward(m, mode);
    }
}

// ---- sampling

// num_steps Euler steps of dx/dt = v(x, t) from t = 1 (noise (B, H, Amax)) to t = 0 -> out
// (B, H, Amax), normalized units (un-normalizing is the caller's). The prefix runs once, and so do
// the cross layers' re-projections of its keys/values. t = float(1 + k dt) with dt = -1/num_steps
// in double, x += float(dt) v: LeRobot's euler_integrate.
static void flow_sample(FlowVLA* m, const ModelInputs* in, const float* noise, float* out) {
    const FlowConfig* c = &m->config;
    flow_encode_prefix(m, in);
    int B = in->B;
    size_t n = flow_arows(c, B) * c->max_action_dim;
    memcpy(m->acts.x_t, noise, n * sizeof(float));
    double dt = -1.0 / FLOW_NUM_STEPS;
    float t[B];
    for (int k = 0; k < FLOW_NUM_STEPS; k++) {
        for (int b = 0; b < B; b++) { t[b] = (float)(1.0 + k * dt); }
        flow_suffix_embed(m, t);
        flow_expert_forward(m, k > 0);
        for (size_t i = 0; i < n; i++) { m->acts.x_t[i] += (float)dt * m->acts.v_t[i]; }
    }
    memcpy(out, m->acts.x_t, n * sizeof(float));
}

// ---- training


// The optimizer's state for train mode `mode`: AdamW's moments of the elements that train in it
// only, packed in table order (flow_opt_domain), zero. A model trains in one mode for good: a
// second call in another mode fails.
static void flow_opt_init(FlowVLA* m, int mode) {
    if (m->m_memory != NULL) {
        if (m->opt.mode != mode) {
            vla_fail("AdamW's moments were made for train mode %s, not %s: the mode is fixed for a run",
                     TRAIN_MODE_NAMES[m->opt.mode], TRAIN_MODE_NAMES[mode]);
        }
        return;
    }
    flow_opt_domain(&m->table, mode, &m->opt);
    m->m_memory = (float*)callocCheck(m->opt.total > 0 ? m->opt.total : 1, sizeof(float));
    m->v_memory = (float*)callocCheck(m->opt.total > 0 ? m->opt.total : 1, sizeof(float));
}

// sum of squares in double: order-stable and exact enough
static double sum_squares(const float* g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)g[i] * g[i]; }
    return s;
}

// AdamW (0.9, 0.95, 1e-8) on elements [first, first + n) of tensor i's trainable prefix (their
// moments at opt.offset[i] + first), gradients scaled by `scale`, decoupled decay where the table
// or decay_on (DECAY_ON_*) says. The fp32 weights are the master copy (the CPU computes with them too).
static void adamw_range(FlowVLA* m, int i, size_t first, size_t n, float lr, float weight_decay, int decay_on,
                        float scale, int step) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    const FlowParamSpec* s = &m->table.spec[i];
    float wd = flow_decay(s, weight_decay, decay_on);
    float bc1 = 1.0f - powf(beta1, (float)(step + 1)), bc2 = 1.0f - powf(beta2, (float)(step + 1));
    float* p = m->params_memory + s->offset + first;
    const float* g = m->grads_memory + s->offset + first;
    float* mm = m->m_memory + m->opt.offset[i] + first;
    float* vv = m->v_memory + m->opt.offset[i] + first;
    #pragma omp parallel for schedule(static)
    for (size_t j = 0; j < n; j++) {
        float gj = g[j] * scale;
        mm[j] = beta1 * mm[j] + (1.0f - beta1) * gj;
        vv[j] = beta2 * vv[j] + (1.0f - beta2) * gj * gj;
        float mhat = mm[j] / bc1, vhat = vv[j] / bc2;
        p[j] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[j]);
    }
}

// One AdamW step over the optimizer's domain in `mode` (the trainable prefix of each tensor:
// frozen elements have no moments and neither move nor decay), at 0-based step `step`, after
// clipping the gradients to global norm `clip` (0 disables), the norm taken over the trainable
// gradients. Returns the norm before clipping.
// shards > 1 simulates ZeRO-1 over that many ranks as train_vla runs it: the packed trainable
// domain (FlowOptDomain) is cut into shards of zero_shard_size (a tensor may be split between
// ranks, zero_part says where), each rank adds up the squares of its shard's gradients and the
// norm adds up the ranks' sums, as the all-reduce does; then each rank updates its shard alone.
static float flow_update(FlowVLA* m, int mode, float lr, float weight_decay, int decay_on, float clip, int step,
                         int shards) {
    flow_opt_init(m, mode);
    const FlowOptDomain* d = &m->opt;
    size_t S = zero_shard_size(d->total, shards, 1);
    double squares = 0.0;
    for (int r = 0; r < shards; r++) {
        double rank_squares = 0.0;
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            size_t first, n = zero_part(d->offset[i], d->numel[i], (size_t)r * S, (size_t)(r + 1) * S, &first);
            if (n > 0) { rank_squares += sum_squares(m->grads_memory + m->table.spec[i].offset + first, n); }
        }
        squares += rank_squares;
    }
    float norm = (float)sqrt(squares);
    float scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    for (int r = 0; r < shards; r++) {
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            size_t first, n = zero_part(d->offset[i], d->numel[i], (size_t)r * S, (size_t)(r + 1) * S, &first);
            if (n > 0) { adamw_range(m, i, first, n, lr, weight_decay, decay_on, scale, step); }
        }
    }
    return norm;
}

// ---- checkpoints (vla/checkpoint.h's version 2: every weight, the moments of the trainable domain)

// Writes step `step`: all weights, the packed moments of args->train_mode, the dataset's statistics
// and tokenizer.
static void flow_save(FlowVLA* m, const Dataset* ds, const TrainArgs* args, int step, uint64_t sampler_pos) {
    flow_opt_init(m, args->train_mode);
    run_checkpoint_save(args, ds, &m->config, step, sampler_pos, m->params_memory, m->table.total, m->m_memory,
                        m->v_memory, m->opt.total, NULL);
}

// ---- the flow_ policy: the interface's functions over FlowVLA

static void* flow_new(const FlowConfig* c, int mode) {
    FlowVLA* m = (FlowVLA*)mallocCheck(sizeof(FlowVLA));
    flow_build(m, c, mode);
    flow_opt_init(m, mode);
    return m;
}

static double flow_forward_(void* model, const ModelInputs* in, int* entries) {
    return flow_forward_loss((FlowVLA*)model, in, 0, entries);
}

static void flow_task_sums(void* model, const ModelInputs* in, const int* task, double* sq, double* n) {
    const FlowVLA* m = (const FlowVLA*)model;
    const FlowConfig* c = &m->config;
    flow_matching_task_sums(sq, n, task, m->acts.v_t, in->noise, in->actions,
                            flow_loss_masks_pad(c) ? in->action_is_pad : NULL, in->B, c->chunk, c->max_action_dim,
                            c->action_dim);
}

static void flow_backward_(void* model, float* grad_sum, int first) {
    FlowVLA* m = (FlowVLA*)model;
    flow_backward(m, m->mode);
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const float* g = m->grads_memory + m->table.spec[i].offset;
        float* acc = grad_sum + m->opt.offset[i];
        if (first) { memcpy(acc, g, m->opt.numel[i] * sizeof(float)); }
        else { for (size_t j = 0; j < m->opt.numel[i]; j++) { acc[j] += g[j]; } }
    }
}

static void flow_grads_finish(void* model, const float* grad_sum, double entries) {
    FlowVLA* m = (FlowVLA*)model;
    float inv = (float)(1.0 / entries);
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        float* g = m->grads_memory + m->table.spec[i].offset;
        const float* acc = grad_sum + m->opt.offset[i];
        for (size_t j = 0; j < m->opt.numel[i]; j++) { g[j] = acc[j] * inv; }
    }
}

// (the casts from the interface's opaque model)
#define FLOW_AS_(m) ((FlowVLA*)(m))
static void flow_set_params_(void* m, const float* p, const float* m1, const float* m2) {
    flow_set_params(FLOW_AS_(m), p, m1, m2);
}
static float flow_update_(void* m, float lr, float wd, int decay_on, float clip, int step, int shards) {
    return flow_update(FLOW_AS_(m), FLOW_AS_(m)->mode, lr, wd, decay_on, clip, step, shards);
}
static void flow_save_(void* m, const Dataset* ds, const TrainArgs* args, int step, uint64_t pos) {
    flow_save(FLOW_AS_(m), ds, args, step, pos);
}
static void flow_sample_(void* m, const ModelInputs* in, const float* noise, float* out) {
    flow_sample(FLOW_AS_(m), in, noise, out);
}
static void flow_delete(void* m) { flow_free(FLOW_AS_(m)); free(m); }
#undef FLOW_AS_

static const Policy FLOW_POLICY = {
    .param_counts = flow_param_counts, .init_params = flow_init_params, .build = flow_new,
    .set_params = flow_set_params_, .forward = flow_forward_, .task_sums = flow_task_sums,
    .backward = flow_backward_, .grads_finish = flow_grads_finish, .update = flow_update_,
    .save = flow_save_, .sample = flow_sample_, .free = flow_delete,
};

// ----------------------------------------------------------------------------
// a step of the loop

// One optimizer step over W = ranks x accum simulated ranks of B samples each (the loader's jobs
// of the step, in order: every rank's micro-steps), as DDP with gradient accumulation takes it:
// each micro-batch's forward and backward in the model's train mode, their gradients of the
// trainable elements summed (grad_sum: packed), then the update on their mean. The loss is
// LeRobot's mean over valid entries (flow_matching_loss), taken over the whole step: the squared
// errors of all W micro-batches divided by all their valid entries, and the gradients likewise
// (the passes compute the gradients of the sums). So -g 4 -b 2, -g 2 -b 2 -d 8 and -g 1 -b 8 take
// the same step up to the order of fp32 sums, whatever the pads of each micro-batch; the GPU
// trainer divides the same way. Returns the loss; the gradient norm before clipping in *norm_out.
// With tb (--balance tasks), task_loss (T) gets the step's mean loss of each task over its valid
// entries in all W micro-batches (NaN for a task with none).
static float train_step(const Policy* P, void* m, float* grad_sum, Loader* loader, const TrainArgs* args, int step,
                        float* norm_out, const TaskBalance* tb, const Dataset* ds, double* task_loss) {
    int W = args->ranks * args->accum;
    double squares = 0.0;
    int64_t entries = 0;
    int T = tb != NULL ? tb->n_tasks : 0;
    double* task_n = T > 0 ? (double*)callocCheck((size_t)T, sizeof(double)) : NULL;
    int* task = T > 0 ? (int*)mallocCheck((size_t)args->batch * sizeof(int)) : NULL;
    for (int t = 0; t < T; t++) { task_loss[t] = 0.0; }
    for (int r = 0; r < W; r++) {
        ModelInputs in = model_inputs(loader_next(loader));
        int n;
        squares += P->forward(m, &in, &n);
        entries += n;
        if (T > 0) {
            const uint64_t* idx = loader_indices(loader);
            for (int b = 0; b < in.B; b++) { task[b] = task_balance_task_of(tb, ds, idx[b]); }
            P->task_sums(m, &in, task, task_loss, task_n);
        }
        P->backward(m, grad_sum, r == 0);
        loader_release(loader);
    }
    double divisor = (double)(entries > 1 ? entries : 1);
    P->grads_finish(m, grad_sum, divisor);
    *norm_out = P->update(m, lr_at_step(args, step), args->weight_decay, args->decay_on, args->grad_clip, step,
                          args->zero ? args->ranks : 1);
    for (int t = 0; t < T; t++) { task_loss[t] = task_n[t] > 0.0 ? task_loss[t] / task_n[t] : NAN; }
    free(task_n); free(task);
    return (float)(squares / divisor);
}

// 10-step sampling from the batch's eps: actions (B, H, A) in the data's units, the dataset's
// action dims of the normalized (B, H, Amax) chunk un-normalized with action_mean/std (A each)
static void sample_actions(const Policy* P, void* m, const FlowConfig* c, const Batch* batch, const float* action_mean,
                           const float* action_std, float* actions) {
    size_t rows = (size_t)batch->B * c->chunk;
    float* chunk = (float*)mallocCheck(rows * c->max_action_dim * sizeof(float));
    ModelInputs in = model_inputs(batch);
    P->sample(m, &in, batch->eps, chunk);
    policy_actions(chunk, rows, c->max_action_dim, c->action_dim, action_mean, action_std, actions);
    free(chunk);
}

// ----------------------------------------------------------------------------
// policy interface: a checkpoint as a policy, for Python through ctypes (scripts/vla_policy.py).
// Built into libvla.so (make libvla.so, -DVLA_LIBRARY). Raw observations in, action chunks out.
// Errors: every entry point that can fail runs its work in vla_catch_call (vla/common.h), so an
// allocation that fails or any other vla_fail returns POLICY_NO_MEMORY or POLICY_FAILED with its
// line (vla_policy_last_error) instead of ending the host process; no allocation happens inside
// an OpenMP parallel region (the kernels' scratch is sized before theirs), which no failure may
// leave. Threads: a policy runs one call at a time (its lock: the activations and observations
// are its scratch); separate policies share nothing but read-only tables, so they run in
// parallel in separate threads (each thread has its own matrix-product panels and OpenMP team).

#ifdef VLA_LIBRARY
struct VLAPolicy {
    PolicyFacts facts;  // the checkpoint's config, train mode and tokenizer (first: vla/policy.h reads it)
    FlowVLA model;      // its config's n_cam: the cameras of the last call's observations (policy_present_cameras)
    float* stats;       // state_mean(S) state_std(S) action_mean(A) action_std(A), as trained with
    Batch obs;      // room for `capacity` observations of the last call's camera sizes
    int capacity;
    int threads;        // OpenMP threads of its calls (0: what the calling thread has)
    pthread_mutex_t lock;  // held by the call that runs
};

// The memory sized by the last call's batch: the observations and the activations. A failed call
// releases it (its layout may be half made), and the next call lays its batch out anew.
static void policy_drop_batch(VLAPolicy* p) {
    if (p->capacity > 0) { batch_free(&p->obs); }
    p->capacity = 0;
    flow_drop_activations(&p->model);
}

static void policy_destroy(VLAPolicy* p) {
    if (p == NULL) { return; }
    policy_drop_batch(p);
    free(p->stats);
    flow_free(&p->model);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static void policy_load(void* arg) {
    PolicyLoad* l = (PolicyLoad*)arg;
    const char* path = l->path;
    if (checkpoint_read_checked(path, &l->ck, l->err, (size_t)l->err_size) != 0) { return; }
    Checkpoint* ck = &l->ck;
    checkpoint_note_unverified(path, ck);
    if (policy_takes_strings(ck->tokenizer) && ck->config.vocab < VLA_TEXT_VOCAB) {  // (no trainer writes one)
        snprintf(l->err, (size_t)l->err_size,
                 "checkpoint %s has a text table of %d rows, but the policy's instructions "
                 "are UTF-8 bytes as token ids (up to 255): use a checkpoint of a preset",
                 path, ck->config.vocab);
        return;
    }
    if (l->threads > 0 && threads_startable(l->threads) < l->threads - 1) {
        snprintf(l->err, (size_t)l->err_size,
                 "threads=%d: this machine cannot start that many threads: pass fewer, or 0 "
                 "for OpenMP's default",
                 l->threads);
        return;
    }
    VLAPolicy* p = (VLAPolicy*)callocCheck(1, sizeof(VLAPolicy));
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        vla_fail_no_memory("cannot make a policy's lock: " VLA_NO_MEMORY_FIX);
    }
    l->p = p;
    p->threads = l->threads;
    flow_build(&p->model, &ck->config, ck->train_mode);
    memcpy(p->model.params_memory, ck->params, p->model.table.total * sizeof(float));
    policy_facts_set(&p->facts, ck);
    p->stats = ck->stats;
    ck->stats = NULL;
    l->loaded = 1;
}

// Where the policy computes, and in which precision.
VLA_API const char* vla_policy_device(const VLAPolicy* p) { (void)p; return "CPU (fp32)"; }

// Action chunks (B, H, A) in the data's units for B observations: cam_hw the n_cam (height, width)
// pairs of this call's frames ((0, 0): a camera the observation lacks, policy_present_cameras),
// images[k] camera k's B frames (B, h_k, w_k, 3) u8 HWC of any size (resized with padding to the
// model's), the instructions as strings or token ids (texts NULL; see policy_observations), raw
// state (B, S). The starting noise is `noise` (B, H, max_action_dim) if given, else drawn from
// `seed`. Sets a->rc to POLICY_OK or why not (vla/policy.h's POLICY_* codes).
static void policy_act(void* arg) {
    PolicyAct* a = (PolicyAct*)arg;
    VLAPolicy* p = a->p;
    FlowConfig* c = &p->model.config;
    int B = a->B;  // (vla/policy.h checked the call: a->cams are the cameras present, a->frames theirs)
    for (int k = 0; k < a->cams.n; k++) {
        int rh, rw;
        if (!resized_size((int)a->cams.height[k], (int)a->cams.width[k], c->img, &rh, &rw)) {
            a->rc = POLICY_BAD_CAMERA;
            return;
        }
    }
    if (c->n_cam != a->cams.n) {  // another set of cameras than the last call's: the activations are laid out again
        c->n_cam = a->cams.n;
        p->model.B = 0;
    }
    policy_reserve(&p->obs, &p->capacity, c, &a->cams, B);
    policy_observations(&p->obs, c, p->stats, B, a->frames, a->texts, a->ids, a->n_ids, a->state, a->noise, a->seed);
    int S = c->state_dim, A = c->action_dim, Am = c->max_action_dim;
    const float *action_mean = p->stats + 2 * S, *action_std = p->stats + 2 * S + A;
    size_t rows = (size_t)B * c->chunk;
    a->chunk = (float*)mallocCheck(rows * Am * sizeof(float));
    ModelInputs in = model_inputs(&p->obs);
    flow_sample(&p->model, &in, p->obs.eps, a->chunk);
    policy_actions(a->chunk, rows, Am, A, action_mean, action_std, a->actions);
    a->rc = POLICY_OK;
}

// Runs one act call on its policy: one at a time (the lock), with the policy's OpenMP threads, a
// failure caught and the batch's memory released after it.
static int policy_call_act(PolicyAct* a) {
    VLAPolicy* p = a->p;
    pthread_mutex_lock(&p->lock);
    // OpenMP's thread count is the calling thread's setting: set for this call, then put back
    int outer_threads = p->threads > 0 ? omp_get_max_threads() : 0;
    if (p->threads > 0) { omp_set_num_threads(p->threads); }
    int rc = policy_status(vla_catch_call(policy_act, a));
    if (p->threads > 0) { omp_set_num_threads(outer_threads); }
    free(a->chunk);
    if (rc != POLICY_OK) {
        policy_drop_batch(p);
    } else {
        rc = a->rc;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

// Frees the policy (NULL: nothing). No call on it may be running or come after.
VLA_API void vla_policy_free(VLAPolicy* p) {
    policy_status(VLA_CAUGHT_NONE);
    policy_destroy(p);
}
#endif

// ----------------------------------------------------------------------------
// CLI and main

#if !defined(TESTING) && !defined(VLA_LIBRARY)
// How well the policy acts: 10-step sampling on one batch, mean squared error against the
// dataset's actions over the slots inside the episode, on its action dims, in its own units.
static float eval_action_mse(const Policy* P, void* m, const FlowConfig* c, Batch* batch, const Dataset* ds,
                             uint64_t seed, uint64_t pos, int step) {
    eval_batch(batch, ds, c, seed, pos, step);
    float* sampled = (float*)mallocCheck((size_t)batch->B * c->chunk * c->action_dim * sizeof(float));
    sample_actions(P, m, c, batch, ds->action_mean, ds->action_std, sampled);
    float mse = action_mse(batch, ds, c, sampled);
    free(sampled);
    return mse;
}

// The one place that chooses a policy: each section's table, by vla/config.h's FAMILY_POLICY
static const Policy* const POLICIES[] = {&FLOW_POLICY};
static const Policy* policy_of(int family) { return POLICIES[FAMILY_POLICY[family]]; }

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

int main(int argc, char** argv) {
    TrainArgs args;
    // past the file size limit (ulimit -f) a write then fails with EFBIG, said in one line and its
    // temporary file removed; the signal's default would end the run without a word
    signal(SIGXFSZ, SIG_IGN);
    train_args_parse(&args, argc, argv);
    run_record_resume(&args);  // -y 1: the settings of the run's run.json, the flags given on top
    eval_check(&args);          // --eval-every: what its evaluation needs is there
    // the CPU reference keeps every activation: the memory options are the GPU trainer's
    if (args.recompute != RECOMPUTE_NONE) {
        vla_fail(
            "--recompute %s: train_vla_cpu keeps every activation (the reference): drop it, or train with train_vla",
            RECOMPUTE_NAMES[args.recompute]);
    }
    if (args.memory) { vla_fail("--memory prints train_vla's GPU memory: run it with train_vla"); }
    if (args.profile > 0) { vla_fail("--profile times train_vla's GPU kernels: run it with train_vla"); }
    train_args_no_loss_scale(&args, "train_vla_cpu (fp32)");
    if (args.nodes > 1) {
        vla_fail("--nodes %d: train_vla_cpu runs on one machine; several machines train with train_vla", args.nodes);
    }
    train_args_for_world(&args, args.ranks);  // simulated ranks scale the learning rate as GPUs would
    if (args.threads > 0) {
        int started = threads_startable(args.threads);
        if (started < args.threads - 1) {
            vla_fail(
                "-t %d: this machine could start only %d threads besides the main one: use a smaller -t, such as the "
                "%d cores here",
                args.threads, started, omp_get_num_procs());
        }
        omp_set_num_threads(args.threads);
    }
    run_folder_open(&args);  // this process owns the output folder until it ends
    Dataset ds;
    dataset_open(&ds, args.input);
    char resume_path[VLA_PATH_MAX];
    const char* from = run_start_checkpoint(&args, resume_path, sizeof(resume_path));
    FlowConfig c = run_config(&args, from, &ds);
    const Policy* P = policy_of(c.family);
    void* model = P->build(&c, args.train_mode);
    size_t n_params, n_trainable;
    P->param_counts(&c, args.train_mode, &n_params, &n_trainable);

    TaskBalance balance;
    if (args.balance == BALANCE_TASKS) {
        task_balance_build(&balance, &ds, args.task_weights);
        args.balance_id = balance.fingerprint;
    }
    int start = 0;
    uint64_t sampler_pos = 0;
    if (from != NULL && args.weights_only) {  // fine-tuning: the weights alone, fresh moments (zero), step 0
        Checkpoint ck;
        run_weights_load(from, &c, &ds, &ck);
        P->set_params(model, ck.params, NULL, NULL);
        checkpoint_free(&ck);
        printf("fine-tuning the weights of %s\n", from);
    } else if (from != NULL) {
        Checkpoint ck;
        run_checkpoint_load(from, &c, &args, &ds, &ck);
        P->set_params(model, ck.params, ck.m, ck.v);
        start = (int)ck.step;
        sampler_pos = ck.sampler_pos;
        if (ck.seed != args.seed) { printf("using the checkpoint's seed %llu\n", (unsigned long long)ck.seed); }
        args.seed = ck.seed;
        checkpoint_free(&ck);
        printf("resumed from %s at step %d\n", from, start);
    } else {
        float* params = P->init_params(&c, args.seed);
        P->set_params(model, params, NULL, NULL);
        free(params);
    }
    if (!run_has_steps_left(from, start, args.steps)) { return 0; }
    run_record_write(&args, start, "train_vla_cpu");
    uint64_t global_batch = (uint64_t)train_global_batch(&args, args.ranks);
    int batches = args.ranks * args.accum;  // per optimizer step: every rank's micro-steps
    Loader loader;
    const TaskBalance* tb = args.balance == BALANCE_TASKS ? &balance : NULL;
    loader_start_balanced(&loader, &ds, &c, args.seed, sampler_pos, (uint64_t)start, args.batch, batches, args.augment,
                          args.workers, 2 * batches + 2, 1, 0, tb);
    float* grad_sum = (float*)mallocCheck((n_trainable > 0 ? n_trainable : 1) * sizeof(float));
    Logger logger;
    logger_open(&logger, args.output, start);
    double* task_loss = tb != NULL ? (double*)callocCheck((size_t)tb->n_tasks, sizeof(double)) : NULL;
    if (tb != NULL) { logger.n_tasks = tb->n_tasks; logger.task_loss = task_loss; }

    table_run_rows("train_vla_cpu", "ranks", &args, &c, n_params, n_trainable, from, &ds, args.ranks);
    table_data_rows(&args, tb, &ds);
    table_row("OpenMP threads", "%d", omp_get_max_threads());
    table_rule();
    schedule_warn(&args);

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);  // a closed terminal or a dropped ssh saves too
    int timed_steps = 0;
    double* step_ms = (double*)mallocCheck((size_t)(args.steps > start ? args.steps - start : 1) * sizeof(double));
    int step = start;
    Evaluator evaluator;
    char eval_cmd[4 * VLA_PATH_MAX];
    eval_init(&evaluator, &args, eval_cmd, sizeof(eval_cmd));
    for (; step < args.steps && !stop_requested; step++) {
        double t0 = wall_seconds(), waited = loader.wait_seconds;
        float norm;
        float loss = train_step(P, model, grad_sum, &loader, &args, step, &norm, tb, &ds, task_loss);
        double ms = 1000.0 * (wall_seconds() - t0);
        logger.wait_ms = 1000.0 * (loader.wait_seconds - waited);
        logger.epoch = (double)(sampler_pos + (uint64_t)(step + 1 - start) * global_batch) / (double)ds.n_samples;
        if (!isfinite(loss) || !isfinite(norm)) {
            char left[2 * VLA_PATH_MAX + 128];
            vla_fail("step %d: loss %g, grad norm %g is not finite: lower the learning rate (-l) or raise the clip; %s",
                     step + 1, loss, norm, train_checkpoint_left(args.output, left, sizeof(left)));
        }
        if (step > start) { step_ms[timed_steps++] = ms; }  // the first step warms caches
        double sps = (double)global_batch / (ms / 1000.0);
        logger_step(&logger, step, args.steps, loss, lr_at_step(&args, step), norm, ms, sps, NAN, NAN,
                    (step + 1) % args.log_every == 0 || step + 1 == args.steps);
        int done = step + 1;
        if (train_ckpt_due(&args, done, 0)) {
            P->save(model, &ds, &args, done, sampler_pos + (uint64_t)(done - start) * global_batch);
        }
        if (eval_due(&args, done)) { eval_start(&evaluator, &logger, done); }
        eval_poll(&evaluator, &logger);
    }
    int status = 0;
    if (stop_requested && step < args.steps) {  // (after the last step, its checkpoint written, the run is complete)
        if (train_ckpt_due(&args, step, 1)) {
            P->save(model, &ds, &args, step, sampler_pos + (uint64_t)(step - start) * global_batch);
        }
        status = train_report_interrupt(&args, step);
    }
    loader_stop(&loader);
    printf("data loader: %d worker thread(s), the trainer waited %.1f ms for batches in %d steps\n", args.workers,
           1000.0 * loader.wait_seconds, step - start);
    Batch batch;
    batch_alloc(&batch, &c, &ds.cams, args.batch);
    printf("eval: 10-step sampled actions vs the data, MSE %.6f (data units, %d action dims) on %d samples\n",
           eval_action_mse(P, model, &c, &batch, &ds, args.seed, sampler_pos + (uint64_t)(step - start) * global_batch,
                           step),
           c.action_dim, args.batch);
    if (timed_steps > 0) {
        double timed_ms = 0.0;
        for (int i = 0; i < timed_steps; i++) { timed_ms += step_ms[i]; }
        printf("mean step time %.1f ms over %d steps (first excluded), %.1f samples/s\n", timed_ms / timed_steps,
               timed_steps, global_batch / (timed_ms / timed_steps / 1000.0));
        qsort(step_ms, (size_t)timed_steps, sizeof(double), compare_doubles);
        double median = timed_steps % 2 ? step_ms[timed_steps / 2]
                                        : 0.5 * (step_ms[timed_steps / 2 - 1] + step_ms[timed_steps / 2]);
        printf("median step time %.1f ms, fastest %.1f, slowest %.1f\n", median, step_ms[0], step_ms[timed_steps - 1]);
    }
    free(step_ms);
    eval_finish(&evaluator, &logger, &stop_requested);
    logger_close(&logger);
    if (stop_requested && step >= args.steps) { status = train_report_interrupt(&args, step); }
    free(task_loss);
    if (tb != NULL) { task_balance_free(&balance); }
    free(grad_sum);
    batch_free(&batch);
    P->free(model);
    dataset_close(&ds);
    return status;
}
#endif
