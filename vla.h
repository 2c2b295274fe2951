/*
vla.h: the plumbing shared by train_vla.c (CPU reference), train_vla.cu (GPU trainer) and
test_vla.c. The model math lives in the trainers; everything here is written once:

  the model: SmolVLA           SmolVLAConfig, SMOLVLA_PRESETS, smolvla_preset(), train modes
  the parameter table          SMOLVLA_PARAMETERS: our name, LeRobot's name, tower, shape, what
                               trains in which mode, decay, init of every tensor
  safetensors                  LeRobot's model.safetensors read by name, shape-checked
  a counter-based RNG          splitmix64 keyed by (seed, stream); uniform, normal, Beta(1.5,1)
  dataset shards               mmap'd reader, every size checked against the file length
  sample assembly              images, instruction token ids + pad mask, normalized state, action chunk
  task balance                 --balance tasks: a weighted round robin over the tasks, each task's
                               samples in per-pass permutations from (seed, task, pass)
  distributed sampler          per-epoch permutation from (seed, epoch), disjoint rank slices
  checkpoints                  atomic write (temp + rename), keep last N, resume newest
  command line                 getopt_long, -h lists every option with its default
  the run folder               one owner (a lock), the folder checked before each write, nothing
                               of an earlier run dropped (--new-run moves it aside)
  logging                      rank-0 step lines on stdout, JSON lines in the output folder

Errors in user input end the process with one line on stderr that names the problem and how
to fix it, and exit status 1. Nothing here calls abort() on bad input. The readers of files
(shard_open_checked, dataset_open_checked, checkpoint_read_checked) return their error instead,
leaving nothing open or allocated, for the policy library and the fuzzers (dev/fuzz); the
trainers call the wrappers that fail with it.
*/
#ifndef VLA_H
#define VLA_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// utilities: errors that say what to do, checked allocation and file calls

// train_vla.cu compiles this header as C++
#ifdef __cplusplus
#define VLA_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define VLA_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

// One line on stderr, exit status 1. Used for every user-facing failure.
static inline void vla_fail(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void vla_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    exit(1);
}

static inline void* malloc_check_(size_t size, const char* file, int line) {
    void* p = malloc(size > 0 ? size : 1);
    if (p == NULL) {
        vla_fail("out of memory allocating %zu bytes at %s:%d: use a smaller batch (-b) or preset",
                 size, file, line);
    }
    return p;
}
#define mallocCheck(size) malloc_check_((size), __FILE__, __LINE__)

static inline void* calloc_check_(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
    if (p == NULL) {
        vla_fail("out of memory allocating %zu x %zu bytes at %s:%d: use a smaller batch (-b) or preset",
                 n, size, file, line);
    }
    return p;
}
#define callocCheck(n, size) calloc_check_((n), (size), __FILE__, __LINE__)

static inline FILE* fopen_check_(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        vla_fail("cannot open %s (mode %s): %s (at %s:%d)", path, mode, strerror(errno), file, line);
    }
    return f;
}
#define fopenCheck(path, mode) fopen_check_((path), (mode), __FILE__, __LINE__)

static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// a*b for sizes read from files: overflow is a corrupt file, not a crash
static inline uint64_t mul_check(uint64_t a, uint64_t b, const char* path, const char* what) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        vla_fail("%s: size of %s overflows 64 bits: the file is corrupt, regenerate it", path, what);
    }
    return r;
}

// Paths the trainers build (checkpoints, the log, temporary files) fit buffers of this size;
// longer ones are refused where they come in (-o, -i), never cut.
#define VLA_PATH_MAX 4096

// "1.25 GiB": a byte count for messages
static inline const char* human_bytes(uint64_t n, char* buf, size_t size) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)n;
    int u = 0;
    while (x >= 1024.0 && u < 4) { x /= 1024.0; u++; }
    snprintf(buf, size, u == 0 ? "%.0f %s" : "%.2f %s", x, units[u]);
    return buf;
}

// How to fix a write into folder dir that failed with errno err, said as what it is: no space
// (ENOSPC, EDQUOT), a file past the size limit (EFBIG), no permission or a read-only file system
// (EACCES, EPERM, EROFS), else the disk itself. The caller says where to go on from there.
static inline const char* write_failure_fix(int err, const char* dir, char* buf, size_t size) {
    if (err == EFBIG) {
        snprintf(buf, size, "the file is larger than the file size limit allows (ulimit -f, or the file system's "
                 "largest file): raise the limit");
    } else if (err == ENOSPC || err == EDQUOT) {
        struct statvfs vfs;
        char avail[32];
        if (statvfs(dir, &vfs) == 0) {
            snprintf(buf, size, "free space in %s (%s free there)", dir,
                     human_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize, avail, sizeof(avail)));
        } else {
            snprintf(buf, size, "free space in %s", dir);
        }
    } else if (err == EROFS) {
        snprintf(buf, size, "%s is on a read-only file system: remount it read-write", dir);
    } else if (err == EACCES || err == EPERM) {
        snprintf(buf, size, "this user may not write into %s: make it writable", dir);
    } else {
        snprintf(buf, size, "check the disk that holds %s", dir);
    }
    return buf;
}

// The folder a path is in ("." for a bare name), into buf.
static inline const char* path_folder(const char* path, char* buf, size_t size) {
    snprintf(buf, size, "%s", path);
    char* slash = strrchr(buf, '/');
    if (slash == NULL) { snprintf(buf, size, "."); } else if (slash == buf) { buf[1] = '\0'; } else { *slash = '\0'; }
    return buf;
}

// (the run folder's checks, below: a write into it stops when the folder is not the run's any more)
static inline int run_folder_intact(void);
static inline void run_folder_check(const char* dir, const char* what);

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320: what zlib.crc32 and `gzip` compute), by
// slicing-by-8: eight bytes per step through eight 256-entry tables. 1.3 to 1.8 GB/s on one x86
// core: a 2.4 GB smolvla checkpoint costs 1.4 to 1.9 s of CPU to checksum, small beside writing or
// reading it. crc32_update(crc32_update(0, a), b) is the CRC of a then b.
static uint32_t crc32_table[8][256];
static pthread_once_t crc32_once = PTHREAD_ONCE_INIT;

static void crc32_build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) { c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
        crc32_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {  // table t: the byte followed by t zero bytes
        for (int t = 1; t < 8; t++) { crc32_table[t][i] = (crc32_table[t - 1][i] >> 8) ^ crc32_table[0][crc32_table[t - 1][i] & 0xFF]; }
    }
}

static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    pthread_once(&crc32_once, crc32_build_tables);
    const uint8_t* p = (const uint8_t*)data;
    uint32_t c = ~crc;
    for (; n > 0 && ((uintptr_t)p & 7) != 0; n--) { c = crc32_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); }
    for (; n >= 8; n -= 8, p += 8) {  // little-endian loads (every machine train_vla builds for)
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc32_table[7][lo & 0xFF] ^ crc32_table[6][(lo >> 8) & 0xFF] ^ crc32_table[5][(lo >> 16) & 0xFF] ^
            crc32_table[4][lo >> 24] ^ crc32_table[3][hi & 0xFF] ^ crc32_table[2][(hi >> 8) & 0xFF] ^
            crc32_table[1][(hi >> 16) & 0xFF] ^ crc32_table[0][hi >> 24];
    }
    for (; n > 0; n--) { c = crc32_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); }
    return ~c;
}

// A file written whole or not at all: into path.PID.tmp (so two writers never share one), flushed
// to disk, renamed over path. A failed write removes the temporary file and says what failed (a
// full disk: how much space the file needed; a rename, no permission, a read-only folder: that;
// the run folder moved or removed: that, by run_folder_check). Nothing is renamed into a folder
// that replaced the run's. The CRC-32 of what was written accumulates as it goes.
typedef struct {
    FILE* f;
    const char* path;
    char tmp[VLA_PATH_MAX + 32];
    uint64_t bytes;  // the whole file's size, for the message when a write fails
    uint32_t crc;    // crc32_update of every byte written so far
} AtomicFile;

static inline void atomic_file_fail(AtomicFile* a, const char* what, int err) __attribute__((noreturn));
static inline void atomic_file_fail(AtomicFile* a, const char* what, int err) {
    if (a->f != NULL) { fclose(a->f); }
    a->f = NULL;
    unlink(a->tmp);
    run_folder_check(NULL, a->path);
    char dir[VLA_PATH_MAX + 32], need[32], fix[VLA_PATH_MAX + 128];
    path_folder(a->path, dir, sizeof(dir));
    write_failure_fix(err, dir, fix, sizeof(fix));
    if (strcmp(what, "renaming") == 0) {
        vla_fail("renaming %s to %s failed: %s; the temporary file was removed: %s, or write elsewhere (-o)", a->tmp,
                 a->path, strerror(err), fix);
    }
    int space = err == ENOSPC || err == EDQUOT || err == EFBIG, partial = strcmp(what, "writing") == 0;
    vla_fail("%s %s failed: %s%s%s%s: %s, or write elsewhere (-o)", what, a->path, strerror(err),
             space ? ": the file needs " : "", space ? human_bytes(a->bytes, need, sizeof(need)) : "",
             partial ? "; the partial file was removed" : "", fix);
}

static inline void atomic_file_open(AtomicFile* a, const char* path, uint64_t bytes) {
    a->path = path;
    a->bytes = bytes;
    a->f = NULL;
    a->crc = 0;
    if (snprintf(a->tmp, sizeof(a->tmp), "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof(a->tmp)) {
        vla_fail("path %.80s... is longer than %d bytes: use a shorter output folder (-o)", path, VLA_PATH_MAX - 1);
    }
    a->f = fopen(a->tmp, "wb");
    if (a->f == NULL) { atomic_file_fail(a, "creating", errno); }
}

static inline void atomic_file_write(AtomicFile* a, const void* p, size_t size, size_t n) {
    if (n > 0 && fwrite(p, size, n, a->f) != n) { atomic_file_fail(a, "writing", errno); }
    a->crc = crc32_update(a->crc, p, size * n);
}

// Writes n bytes over those at `offset`, already written (a field known only at the end, such as
// a checksum), leaving the file positioned at its end; the CRC of the writes is not changed.
static inline void atomic_file_patch(AtomicFile* a, uint64_t offset, const void* p, size_t n) {
    if (fseeko(a->f, (off_t)offset, SEEK_SET) != 0 || fwrite(p, 1, n, a->f) != n || fseeko(a->f, 0, SEEK_END) != 0) {
        atomic_file_fail(a, "writing", errno);
    }
}

static inline void atomic_file_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) { atomic_file_fail(a, "writing", errno); }
    int rc = fclose(a->f);
    a->f = NULL;
    if (rc != 0) { atomic_file_fail(a, "writing", errno); }
    if (!run_folder_intact()) { atomic_file_fail(a, "writing", ENOENT); }
    if (rename(a->tmp, a->path) != 0) { atomic_file_fail(a, "renaming", errno); }
}

// Whether n threads can run at once here (OpenMP's runtime ends the process with its own lines
// when it cannot start the threads -t asks for): starts n - 1 threads that wait, then joins them.
// Returns the number that started besides the caller, n - 1 when all did.
typedef struct { pthread_mutex_t lock; pthread_cond_t go; int released; } ThreadProbe;
static inline void* thread_probe_wait(void* arg) {
    ThreadProbe* p = (ThreadProbe*)arg;
    pthread_mutex_lock(&p->lock);
    while (!p->released) { pthread_cond_wait(&p->go, &p->lock); }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}
static inline int threads_startable(int n) {
    ThreadProbe probe = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_t* ids = (pthread_t*)mallocCheck((size_t)(n > 1 ? n : 1) * sizeof(pthread_t));
    int started = 0;
    while (started < n - 1 && pthread_create(&ids[started], NULL, thread_probe_wait, &probe) == 0) { started++; }
    pthread_mutex_lock(&probe.lock);
    probe.released = 1;
    pthread_cond_broadcast(&probe.go);
    pthread_mutex_unlock(&probe.lock);
    for (int i = 0; i < started; i++) { pthread_join(ids[i], NULL); }
    free(ids);
    return started;
}

// ----------------------------------------------------------------------------
// the parameter table's columns (the table itself is SMOLVLA_PARAMETERS below)

// where a tensor sits in its tower: the tower's inputs (embeddings), a per-layer tensor with a
// leading layer count, or the head
enum { KIND_INPUT = 0, KIND_LAYER = 1, KIND_HEAD = 2 };
enum { INIT_NORMAL = 0, INIT_NORMAL_OUT = 1, INIT_ZERO = 2, INIT_ONE = 3 };
#define VLA_COUNT_(...) +1

// Bounds on every size a file can carry (checkpoint headers, shard headers): generous for real
// models, and small enough that every size derived from them fits an int (token counts, patch
// size, attention width, state + action) and the parameter count fits 64 bits with room to spare.
#define VLA_MAX_CAM 16
#define VLA_MAX_IMG 4096
#define VLA_MAX_DIM 4096          // state_dim, action_dim
#define VLA_MAX_TEXT 1024         // max_text (also --max-text's bound)
#define VLA_MAX_CHUNK 1024        // chunk
#define VLA_MAX_WIDTH 65536       // d_model, d_ff, d_expert, d_expert_ff, n_head x head_dim
#define VLA_MAX_LAYER 1024
#define VLA_MAX_HEAD 1024         // n_head, head_dim
#define VLA_MAX_TOKENS 16384      // image tokens + text + 1 + chunk
#define VLA_MAX_PARAMS (1ULL << 36)  // 256 GiB of fp32 weights
#define VLA_MAX_STEPS (1 << 30)   // optimizer steps of a run (-n's bound)

// ZeRO-1: rank r of W keeps the optimizer state (master weights, AdamW moments) of the elements
// [r S, (r+1) S) of a flat parameter buffer of `total` elements padded to W S, with S a multiple
// of `align`. Shards do not follow tensor boundaries: a tensor may be split between ranks.
static inline size_t zero_shard_size(size_t total, int world, size_t align) {
    size_t unit = (size_t)world * align;
    return (total + unit - 1) / unit * align;
}

// The part of a tensor (elements [offset, offset + numel) of the flat buffer) inside the shard
// [lo, hi): returns how many elements, and in *first where they start, relative to the tensor.
static inline size_t zero_part(size_t offset, size_t numel, size_t lo, size_t hi, size_t* first) {
    size_t a = offset > lo ? offset : lo, b = offset + numel < hi ? offset + numel : hi;
    *first = a > offset ? a - offset : 0;
    return b > a ? b - a : 0;
}

// ----------------------------------------------------------------------------
// RNG: counter-based (splitmix64 of key + counter * golden ratio). A stream is keyed by
// (seed, stream id), and any draw can be reached by seeking, so the oracle reproduces it with
// vectorized numpy and every rank derives its own samples' noise without talking to the others.

#define RNG_GOLDEN 0x9E3779B97F4A7C15ULL
#define RNG_STREAM_INIT 1ULL                 // parameter init: normal i uses draws 2i, 2i+1
#define RNG_STREAM_EPOCH(e) ((2ULL << 56) + (uint64_t)(e))  // sampler permutation of epoch e
#define RNG_STREAM_NOISE(s) ((3ULL << 56) + (uint64_t)(s))  // t and eps of optimizer step s

static inline uint64_t rng_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

typedef struct {
    uint64_t key;
    uint64_t counter;
} Rng;

static inline void rng_init(Rng* r, uint64_t seed, uint64_t stream) {
    r->key = rng_mix64(seed + RNG_GOLDEN) ^ rng_mix64(stream * RNG_GOLDEN + 1);
    r->counter = 0;
}
static inline uint64_t rng_u64(Rng* r) {
    r->counter++;
    return rng_mix64(r->key + r->counter * RNG_GOLDEN);
}
// uniform in [0, 1), 53 bits
static inline double rng_uniform(Rng* r) { return (double)(rng_u64(r) >> 11) * 0x1.0p-53; }
// standard normal by Box-Muller (cosine branch); always two draws
static inline double rng_normal(Rng* r) {
    double u1 = ((double)(rng_u64(r) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log is finite
    double u2 = (double)(rng_u64(r) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
// flow time t = 0.999 * Beta(1.5, 1) + 0.001, with Beta(1.5, 1) = U^(1/1.5)
static inline double rng_flow_time(Rng* r) { return 0.999 * pow(rng_uniform(r), 1.0 / 1.5) + 0.001; }

// Number of RNG draws one sample's flow noise of `width` dims uses: 1 for t, 2 per eps entry.
static inline uint64_t flow_noise_draws_width(int chunk, int width) { return 1 + 2 * (uint64_t)chunk * width; }

// t and eps (chunk, width) of global sample g at optimizer step s: identical whatever rank
// computes them. The model above draws action_dim dims; SmolVLA all max_action_dim (LeRobot's
// noise is (B, H, 32)), so the same stream gives either.
static inline void flow_noise_width(int chunk, int width, uint64_t seed, uint64_t step, uint64_t g, float* t, float* eps) {
    Rng r;
    rng_init(&r, seed, RNG_STREAM_NOISE(step));
    r.counter = g * flow_noise_draws_width(chunk, width);
    *t = (float)rng_flow_time(&r);
    for (int i = 0; i < chunk * width; i++) { eps[i] = (float)rng_normal(&r); }
}

// ----------------------------------------------------------------------------
// the model: SmolVLA, exactly as LeRobot 0.6.1 computes it (shared/SMOLVLA.md; dev/smolvla.py is
// its PyTorch oracle, dev/model.py the oracle with this file's plumbing). Its config, presets and
// parameter table, whose rows carry LeRobot's tensor names so that a LeRobot model.safetensors
// loads by name. test_vla and test_vla_gpu check both trainers against LeRobot's own references
// (dev/lerobot) and against dev/model.py.
//
// Tokens: prefix = [camera 0 | camera 1 | ... (img/patch/scale)^2 each][max_text language][state],
// suffix = [chunk action tokens]. Layer l is joint self-attention over [prefix; suffix] when
// l % self_attn_every == 0, otherwise the actions cross-attend the VLM's keys and values of that
// layer, re-projected by the expert (smolvla_layer_is_cross).

typedef struct {
    int32_t n_cam;           // cameras; frames keep their stored size and are resized on the device
    int32_t state_dim;       // the dataset's state dims, zero-padded to max_state_dim
    int32_t action_dim;      // the dataset's action dims, zero-padded to max_action_dim; the loss's width
    int32_t img;             // the vision tower's image side: frames are resized with padding to it
    int32_t patch;           // vision patch side
    int32_t vis_width;       // Cv, SigLIP width
    int32_t vis_ff;          // SigLIP MLP width
    int32_t vis_layers;      // SigLIP layers
    int32_t vis_heads;       // SigLIP heads (head size Cv / vis_heads)
    int32_t scale_factor;    // pixel shuffle: s x s neighbouring patches become one token
    int32_t vocab;           // language vocabulary
    int32_t pad_token;       // the tokenizer's pad id (its embedding row gets no gradient, as LeRobot's padding_idx)
    int32_t max_text;        // language tokens, right-padded
    int32_t d_model;         // C, VLM width
    int32_t d_ff;            // VLM MLP width
    int32_t n_layer;         // VLM layers kept, and expert layers
    int32_t n_head;          // query heads of both stacks
    int32_t n_kv_head;       // key/value heads of both stacks (GQA)
    int32_t head_dim;        // HS
    int32_t d_expert;        // Ce, expert width
    int32_t d_expert_ff;     // expert MLP width
    int32_t self_attn_every; // layer l is joint self-attention iff l % self_attn_every == 0
    int32_t chunk;           // H, action tokens
    int32_t max_state_dim;   // state_proj's input width
    int32_t max_action_dim;  // action_in_proj's input and action_out_proj's output width
    int32_t rope_theta;      // 10000: SmolVLA's rope ignores the text config's rope_theta
} SmolVLAConfig;

#define SMOLVLA_CONFIG_FIELDS(X) \
    X(n_cam) X(state_dim) X(action_dim) X(img) X(patch) X(vis_width) X(vis_ff) X(vis_layers) X(vis_heads) \
    X(scale_factor) X(vocab) X(pad_token) X(max_text) X(d_model) X(d_ff) X(n_layer) X(n_head) X(n_kv_head) \
    X(head_dim) X(d_expert) X(d_expert_ff) X(self_attn_every) X(chunk) X(max_state_dim) X(max_action_dim) \
    X(rope_theta)

#define SMOLVLA_VISION_EPS 1e-6f  // SigLIP's LayerNorm
#define SMOLVLA_RMS_EPS 1e-5f     // SmolLM2's RMSNorm, VLM and expert

static inline int smolvla_grid(const SmolVLAConfig* c) { return c->img / c->patch; }
static inline int smolvla_patch_dim(const SmolVLAConfig* c) { return 3 * c->patch * c->patch; }
static inline int smolvla_image_tokens(const SmolVLAConfig* c) {  // per camera, after the pixel shuffle
    int g = smolvla_grid(c) / c->scale_factor;
    return g * g;
}
static inline int smolvla_n_prefix(const SmolVLAConfig* c) {
    return c->n_cam * smolvla_image_tokens(c) + c->max_text + 1;
}
static inline int smolvla_d_attn(const SmolVLAConfig* c) { return c->n_head * c->head_dim; }
static inline int smolvla_d_kv(const SmolVLAConfig* c) { return c->n_kv_head * c->head_dim; }
// The layer schedule, named once: cross-attention layers are those that are not joint.
static inline int smolvla_layer_is_cross(const SmolVLAConfig* c, int l) { return l % c->self_attn_every != 0; }
static inline int smolvla_n_joint(const SmolVLAConfig* c) { return (c->n_layer + c->self_attn_every - 1) / c->self_attn_every; }
static inline int smolvla_n_cross(const SmolVLAConfig* c) { return c->n_layer - smolvla_n_joint(c); }
// Layer l's index among the layers of its kind (the slice of the joint or cross stacks it owns).
static inline int smolvla_kind_index(const SmolVLAConfig* c, int l) {
    int joints_upto = l / c->self_attn_every + 1;  // joint layers in [0, l]
    return smolvla_layer_is_cross(c, l) ? l + 1 - joints_upto - 1 : joints_upto - 1;
}
// LeRobot's expert MLP width: Llama's 4 * int(2 Ce / 3) rounded up to a multiple of 256.
static inline int smolvla_expert_ff(int d_expert) { return 256 * ((4 * (2 * d_expert / 3) + 255) / 256); }

typedef struct {
    const char* name;
    const char* what;
    SmolVLAConfig config;
} SmolVLAPreset;

// n_cam, state_dim and action_dim come from the dataset. smolvla is lerobot/smolvla_base's model
// (SmolVLM2-500M's first 16 layers and its 720-wide expert); tiny runs the tests in seconds.
static const SmolVLAPreset SMOLVLA_PRESETS[] = {
    // name      what                                     cam S  A  img  p  Cv   Cv_ff Lv NHv s  vocab pad text C    C_ff  L   NH NKV HS  Ce   Ce_ff n  H   Smax Amax theta
    {"tiny",    "tests: runs in seconds on one core",     {1, 4, 4, 32,  8, 32,  64,   1, 2,  2, 256,  0,  16,  48,  96,   2,  4, 2,  12, 36,  256,  2, 8,  32,  32,  10000}},
    {"small",   "Meta-World from scratch on the CPU",     {2, 4, 4, 64,  8, 48,  96,   1, 2,  2, 256,  0,  48,  64,  192,  2,  4, 2,  16, 48,  256,  2, 8,  32,  32,  10000}},
    {"smolvla", "lerobot/smolvla_base's sizes (450M)",    {2, 32, 32, 512, 16, 768, 3072, 12, 12, 4, 49280, 2, 48, 960, 2560, 16, 15, 5,  64, 720, 2048, 2, 50, 32,  32,  10000}},
};
#define SMOLVLA_N_PRESETS ((int)(sizeof(SMOLVLA_PRESETS) / sizeof(SMOLVLA_PRESETS[0])))

static inline const SmolVLAPreset* smolvla_preset(const char* name) {
    for (int i = 0; i < SMOLVLA_N_PRESETS; i++) {
        if (strcmp(SMOLVLA_PRESETS[i].name, name) == 0) { return &SMOLVLA_PRESETS[i]; }
    }
    return NULL;
}

// The first field where two configs differ ("name a vs b"), or NULL when they agree.
static inline const char* smolvla_config_diff(const SmolVLAConfig* a, const SmolVLAConfig* b) {
    static char msg[96];
#define SMOL_DIFF_(f) if (a->f != b->f) { snprintf(msg, sizeof(msg), #f " %d vs %d", a->f, b->f); return msg; }
    SMOLVLA_CONFIG_FIELDS(SMOL_DIFF_)
#undef SMOL_DIFF_
    return NULL;
}

static inline void smolvla_config_print(const SmolVLAConfig* c) {
#define SMOL_PRINT_(f) printf("| %-22s | %-10d |\n", #f, c->f);
    SMOLVLA_CONFIG_FIELDS(SMOL_PRINT_)
#undef SMOL_PRINT_
}

// What trains: LeRobot's train_expert_only / freeze_vision_encoder as one mode (--train).
// expert: the action expert and the state/action/time projections (LeRobot's default, and the
// smolvla preset's); vlm: also the VLM but its frozen vision tower, last layer and final norm;
// all: everything. The presets trained from scratch (tiny, small) default to all.
enum { TRAIN_MODE_EXPERT = 0, TRAIN_MODE_VLM = 1, TRAIN_MODE_ALL = 2 };
static const char* const TRAIN_MODE_NAMES[] = {"expert", "vlm", "all"};
#define TRAIN_MODE_COUNT 3

// The mode named `name`, or -1.
static inline int train_mode_parse(const char* name) {
    for (int m = 0; m < TRAIN_MODE_COUNT; m++) {
        if (strcmp(name, TRAIN_MODE_NAMES[m]) == 0) { return m; }
    }
    return -1;
}

// Activation recomputation (--recompute, the GPU trainer's): what of each layer the forward keeps
// for the backward. none: everything; attn: the MLP half, the attention half (input norm, queries,
// keys/values of the layer's own, attention output and its log-sum-exp) is run again from the
// layer's input in the backward; layer: the layer's input alone (and what another layer reads: the
// VLM's keys/values, the cross layers' re-projections), the whole layer run again. Not part of a
// checkpoint: a run may continue with another setting.
enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTN = 1, RECOMPUTE_LAYER = 2 };
static const char* const RECOMPUTE_NAMES[] = {"none", "attn", "layer"};
#define RECOMPUTE_COUNT 3

// The recompute level named `name`, or -1.
static inline int recompute_parse(const char* name) {
    for (int r = 0; r < RECOMPUTE_COUNT; r++) {
        if (strcmp(name, RECOMPUTE_NAMES[r]) == 0) { return r; }
    }
    return -1;
}

// A preset's default mode: the released model fine-tunes its expert, the others train from scratch.
static inline int smolvla_default_train_mode(const char* preset) {
    return strcmp(preset, "smolvla") == 0 ? TRAIN_MODE_EXPERT : TRAIN_MODE_ALL;
}

// The towers, in the order the data meets them.
enum { TOWER_VISION = 0, TOWER_VLM = 1, TOWER_EXPERT = 2 };
// The train column: in which modes a tensor trains. The VLM's layer stacks train in vlm and all
// modes except their last layer, which LeRobot always freezes (with the VLM's final norm and
// lm_head: their outputs feed nothing; the last layer's keys and values do feed the expert).
enum { TRAIN_ALWAYS = 0, TRAIN_VLM = 1, TRAIN_VLM_BUT_LAST = 2, TRAIN_VISION = 3, TRAIN_NEVER = 4 };
// How slice i of a stacked tensor maps to LeRobot's layer number (the %d in its name).
enum { SLICES_NONE = 0, SLICES_VISION = 1, SLICES_ALL = 2, SLICES_JOINT = 3, SLICES_CROSS = 4 };

#define SMOL_VIS "model.vlm_with_expert.vlm.model.vision_model."
#define SMOL_TXT "model.vlm_with_expert.vlm.model.text_model."
#define SMOL_EXP "model.vlm_with_expert.lm_expert."

// Linear weights are (out, in) as torch stores them; per-layer tensors are stacked with a leading
// layer count (the vision layers, all L layers, or the joint / cross layers of the expert's k/v,
// whose input widths differ: Ce in joint layers, the VLM's key/value width in cross layers).
//  X(name,       lerobot name,                                          tower,        kind,        train,              decay init             slices         nd d0 d1 d2)
#define SMOLVLA_PARAMETERS(X, c) \
    X(vis_patch_w,  SMOL_VIS "embeddings.patch_embedding.weight",        TOWER_VISION, KIND_INPUT, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->vis_width, smolvla_patch_dim(c), 1) \
    X(vis_patch_b,  SMOL_VIS "embeddings.patch_embedding.bias",          TOWER_VISION, KIND_INPUT, TRAIN_VISION,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(vis_pos,      SMOL_VIS "embeddings.position_embedding.weight",     TOWER_VISION, KIND_INPUT, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_NONE,   2, smolvla_grid(c) * smolvla_grid(c), (c)->vis_width, 1) \
    X(vis_ln1_w,    SMOL_VIS "encoder.layers.%d.layer_norm1.weight",     TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ONE,        SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln1_b,    SMOL_VIS "encoder.layers.%d.layer_norm1.bias",       TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wq,       SMOL_VIS "encoder.layers.%d.self_attn.q_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bq,       SMOL_VIS "encoder.layers.%d.self_attn.q_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wk,       SMOL_VIS "encoder.layers.%d.self_attn.k_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bk,       SMOL_VIS "encoder.layers.%d.self_attn.k_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wv,       SMOL_VIS "encoder.layers.%d.self_attn.v_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bv,       SMOL_VIS "encoder.layers.%d.self_attn.v_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wo,       SMOL_VIS "encoder.layers.%d.self_attn.out_proj.weight", TOWER_VISION, KIND_LAYER, TRAIN_VISION,    1, INIT_NORMAL_OUT, SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bo,       SMOL_VIS "encoder.layers.%d.self_attn.out_proj.bias",   TOWER_VISION, KIND_LAYER, TRAIN_VISION,    0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln2_w,    SMOL_VIS "encoder.layers.%d.layer_norm2.weight",     TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ONE,        SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln2_b,    SMOL_VIS "encoder.layers.%d.layer_norm2.bias",       TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_fc1_w,    SMOL_VIS "encoder.layers.%d.mlp.fc1.weight",         TOWER_VISION, KIND_LAYER, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_ff, (c)->vis_width) \
    X(vis_fc1_b,    SMOL_VIS "encoder.layers.%d.mlp.fc1.bias",           TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_ff, 1) \
    X(vis_fc2_w,    SMOL_VIS "encoder.layers.%d.mlp.fc2.weight",         TOWER_VISION, KIND_LAYER, TRAIN_VISION,       1, INIT_NORMAL_OUT, SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_ff) \
    X(vis_fc2_b,    SMOL_VIS "encoder.layers.%d.mlp.fc2.bias",           TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_post_w,   SMOL_VIS "post_layernorm.weight",                    TOWER_VISION, KIND_HEAD,  TRAIN_VISION,       0, INIT_ONE,        SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(vis_post_b,   SMOL_VIS "post_layernorm.bias",                      TOWER_VISION, KIND_HEAD,  TRAIN_VISION,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(connector_w,  "model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight", \
                                                                         TOWER_VLM,    KIND_INPUT, TRAIN_VLM,          1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_model, (c)->vis_width * (c)->scale_factor * (c)->scale_factor, 1) \
    X(embed_tokens, SMOL_TXT "embed_tokens.weight",                      TOWER_VLM,    KIND_INPUT, TRAIN_VLM,          1, INIT_NORMAL,     SLICES_NONE,   2, (c)->vocab, (c)->d_model, 1) \
    X(state_w,      "model.state_proj.weight",                           TOWER_VLM,    KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_model, (c)->max_state_dim, 1) \
    X(state_b,      "model.state_proj.bias",                             TOWER_VLM,    KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_model, 1, 1) \
    X(vlm_ln1,      SMOL_TXT "layers.%d.input_layernorm.weight",         TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 0, INIT_ONE,        SLICES_ALL,    2, (c)->n_layer, (c)->d_model, 1) \
    X(vlm_wq,       SMOL_TXT "layers.%d.self_attn.q_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, smolvla_d_attn(c), (c)->d_model) \
    X(vlm_wk,       SMOL_TXT "layers.%d.self_attn.k_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, smolvla_d_kv(c), (c)->d_model) \
    X(vlm_wv,       SMOL_TXT "layers.%d.self_attn.v_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, smolvla_d_kv(c), (c)->d_model) \
    X(vlm_wo,       SMOL_TXT "layers.%d.self_attn.o_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_model, smolvla_d_attn(c)) \
    X(vlm_ln2,      SMOL_TXT "layers.%d.post_attention_layernorm.weight", TOWER_VLM,   KIND_LAYER, TRAIN_VLM_BUT_LAST, 0, INIT_ONE,        SLICES_ALL,    2, (c)->n_layer, (c)->d_model, 1) \
    X(vlm_gate,     SMOL_TXT "layers.%d.mlp.gate_proj.weight",           TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_ff, (c)->d_model) \
    X(vlm_up,       SMOL_TXT "layers.%d.mlp.up_proj.weight",             TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_ff, (c)->d_model) \
    X(vlm_down,     SMOL_TXT "layers.%d.mlp.down_proj.weight",           TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_model, (c)->d_ff) \
    X(vlm_norm,     SMOL_TXT "norm.weight",                              TOWER_VLM,    KIND_HEAD,  TRAIN_NEVER,        0, INIT_ONE,        SLICES_NONE,   1, (c)->d_model, 1, 1) \
    X(action_in_w,  "model.action_in_proj.weight",                       TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, (c)->max_action_dim, 1) \
    X(action_in_b,  "model.action_in_proj.bias",                         TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(time_in_w,    "model.action_time_mlp_in.weight",                   TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, 2 * (c)->d_expert, 1) \
    X(time_in_b,    "model.action_time_mlp_in.bias",                     TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(time_out_w,   "model.action_time_mlp_out.weight",                  TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, (c)->d_expert, 1) \
    X(time_out_b,   "model.action_time_mlp_out.bias",                    TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(exp_ln1,      SMOL_EXP "layers.%d.input_layernorm.weight",         TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       0, INIT_ONE,        SLICES_ALL,    2, (c)->n_layer, (c)->d_expert, 1) \
    X(exp_wq,       SMOL_EXP "layers.%d.self_attn.q_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, smolvla_d_attn(c), (c)->d_expert) \
    X(exp_wk_joint, SMOL_EXP "layers.%d.self_attn.k_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_JOINT,  3, smolvla_n_joint(c), smolvla_d_kv(c), (c)->d_expert) \
    X(exp_wv_joint, SMOL_EXP "layers.%d.self_attn.v_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_JOINT,  3, smolvla_n_joint(c), smolvla_d_kv(c), (c)->d_expert) \
    X(exp_wk_cross, SMOL_EXP "layers.%d.self_attn.k_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_CROSS,  3, smolvla_n_cross(c), smolvla_d_kv(c), smolvla_d_kv(c)) \
    X(exp_wv_cross, SMOL_EXP "layers.%d.self_attn.v_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_CROSS,  3, smolvla_n_cross(c), smolvla_d_kv(c), smolvla_d_kv(c)) \
    X(exp_wo,       SMOL_EXP "layers.%d.self_attn.o_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_expert, smolvla_d_attn(c)) \
    X(exp_ln2,      SMOL_EXP "layers.%d.post_attention_layernorm.weight", TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,      0, INIT_ONE,        SLICES_ALL,    2, (c)->n_layer, (c)->d_expert, 1) \
    X(exp_gate,     SMOL_EXP "layers.%d.mlp.gate_proj.weight",           TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_expert_ff, (c)->d_expert) \
    X(exp_up,       SMOL_EXP "layers.%d.mlp.up_proj.weight",             TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_expert_ff, (c)->d_expert) \
    X(exp_down,     SMOL_EXP "layers.%d.mlp.down_proj.weight",           TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_expert, (c)->d_expert_ff) \
    X(exp_norm,     SMOL_EXP "norm.weight",                              TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       0, INIT_ONE,        SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(action_out_w, "model.action_out_proj.weight",                      TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->max_action_dim, (c)->d_expert, 1) \
    X(action_out_b, "model.action_out_proj.bias",                        TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->max_action_dim, 1, 1)

enum { SMOLVLA_NUM_TENSORS = 0 SMOLVLA_PARAMETERS(VLA_COUNT_, c) };

typedef struct {
    const char* name;
    const char* lerobot;  // LeRobot's name; %d is the layer number for stacked tensors
    int tower, kind, train, decay, init, slices, ndim;
    int64_t shape[3];
    size_t numel;
    size_t offset;  // in elements, into the one flat allocation
} SmolParamSpec;

typedef struct {
    SmolParamSpec spec[SMOLVLA_NUM_TENSORS];
    size_t total;
} SmolParamTable;

static inline void smolvla_table_build(const SmolVLAConfig* c, SmolParamTable* t) {
    int i = 0;
    size_t offset = 0;
#define SMOL_SPEC_(nm, lr, tw, knd, trn, dec, ini, sl, nd, d0, d1, d2) \
    t->spec[i] = (SmolParamSpec){#nm, lr, tw, knd, trn, dec, ini, sl, nd, {d0, d1, d2}, \
                                 (size_t)(d0) * (size_t)(d1) * (size_t)(d2), offset}; \
    offset += t->spec[i].numel; \
    i++;
    SMOLVLA_PARAMETERS(SMOL_SPEC_, c)
#undef SMOL_SPEC_
    t->total = offset;
}

// One float* per tensor, carved from a flat buffer in table order.
typedef struct {
#define SMOL_FIELD_(nm, ...) float* nm;
    SMOLVLA_PARAMETERS(SMOL_FIELD_, c)
#undef SMOL_FIELD_
} SmolParameters;

static inline void smolvla_point(SmolParameters* p, float* base, const SmolParamTable* t) {
    int i = 0;
#define SMOL_POINT_(nm, ...) p->nm = base + t->spec[i++].offset;
    SMOLVLA_PARAMETERS(SMOL_POINT_, c)
#undef SMOL_POINT_
}

// Slices (layers) of a tensor: its leading dimension when stacked, else 1.
static inline size_t smolvla_slices(const SmolParamSpec* s) { return s->slices == SLICES_NONE ? 1 : (size_t)s->shape[0]; }

// The elements of a tensor that train in `mode`: a prefix of it (stacked tensors are layer-major,
// so "every layer but the last" is the first numel - numel/L elements). 0 = frozen.
static inline size_t smolvla_trainable_numel(const SmolParamSpec* s, int mode) {
    switch (s->train) {
        case TRAIN_ALWAYS: return s->numel;
        case TRAIN_VLM: return mode >= TRAIN_MODE_VLM ? s->numel : 0;
        case TRAIN_VLM_BUT_LAST: return mode >= TRAIN_MODE_VLM ? s->numel - s->numel / smolvla_slices(s) : 0;
        case TRAIN_VISION: return mode == TRAIN_MODE_ALL ? s->numel : 0;
        default: return 0;
    }
}

static inline size_t smolvla_trainable_count(const SmolParamTable* t, int mode) {
    size_t n = 0;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) { n += smolvla_trainable_numel(&t->spec[i], mode); }
    return n;
}

// The optimizer's domain in a mode: the trainable prefix of every tensor, packed in table order.
// AdamW's moments exist for these elements only (tensor i's at offset[i], numel[i] of them); its
// weight decay applies where the table's decay column says (smolvla_decay).
typedef struct {
    int mode;
    size_t offset[SMOLVLA_NUM_TENSORS];  // tensor i's first moment in the packed m and v
    size_t numel[SMOLVLA_NUM_TENSORS];   // its trainable elements: the first numel[i] (0 = frozen)
    size_t total;                        // elements of m and of v: smolvla_trainable_count
} SmolOptDomain;

static inline void smolvla_opt_domain(const SmolParamTable* t, int mode, SmolOptDomain* d) {
    d->mode = mode;
    d->total = 0;
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        d->offset[i] = d->total;
        d->numel[i] = smolvla_trainable_numel(&t->spec[i], mode);
        d->total += d->numel[i];
    }
}

// The decoupled weight decay of tensor s: `weight_decay` on the tensors the table marks, else 0.
static inline float smolvla_decay(const SmolParamSpec* s, float weight_decay) { return s->decay ? weight_decay : 0.0f; }

// LeRobot's layer number of slice i of a stacked tensor.
static inline int smolvla_slice_layer(const SmolVLAConfig* c, const SmolParamSpec* s, int i) {
    if (s->slices == SLICES_JOINT) { return i * c->self_attn_every; }
    if (s->slices == SLICES_CROSS) {  // the i-th layer that is not joint
        for (int l = 0, k = 0; l < c->n_layer; l++) {
            if (smolvla_layer_is_cross(c, l) && k++ == i) { return l; }
        }
    }
    return i;
}

// The one validation of a SmolVLA config: fields positive and bounded, the shapes consistent.
static inline const char* smolvla_config_problem(const SmolVLAConfig* c) {
    static char msg[256];
#define SMOL_POSITIVE_(f) if (c->f <= 0 && strcmp(#f, "pad_token") != 0) { \
        snprintf(msg, sizeof(msg), #f " must be positive (got %d)", c->f); return msg; }
    SMOLVLA_CONFIG_FIELDS(SMOL_POSITIVE_)
#undef SMOL_POSITIVE_
#define SMOL_BOUND_(f, max) if (c->f > (max)) { snprintf(msg, sizeof(msg), #f " %d is past its bound %d", c->f, (int)(max)); return msg; }
    SMOL_BOUND_(n_cam, VLA_MAX_CAM) SMOL_BOUND_(img, VLA_MAX_IMG) SMOL_BOUND_(patch, c->img)
    SMOL_BOUND_(vis_width, VLA_MAX_WIDTH) SMOL_BOUND_(vis_ff, VLA_MAX_WIDTH) SMOL_BOUND_(vis_layers, VLA_MAX_LAYER)
    SMOL_BOUND_(vis_heads, c->vis_width) SMOL_BOUND_(scale_factor, c->img / c->patch) SMOL_BOUND_(vocab, 1 << 24)
    SMOL_BOUND_(pad_token, c->vocab - 1) SMOL_BOUND_(max_text, VLA_MAX_TEXT) SMOL_BOUND_(d_model, VLA_MAX_WIDTH)
    SMOL_BOUND_(d_ff, VLA_MAX_WIDTH) SMOL_BOUND_(n_layer, VLA_MAX_LAYER) SMOL_BOUND_(n_head, VLA_MAX_HEAD)
    SMOL_BOUND_(n_kv_head, c->n_head) SMOL_BOUND_(head_dim, VLA_MAX_HEAD) SMOL_BOUND_(d_expert, VLA_MAX_WIDTH)
    SMOL_BOUND_(d_expert_ff, VLA_MAX_WIDTH) SMOL_BOUND_(self_attn_every, c->n_layer) SMOL_BOUND_(chunk, VLA_MAX_CHUNK)
    SMOL_BOUND_(max_state_dim, VLA_MAX_DIM) SMOL_BOUND_(max_action_dim, VLA_MAX_DIM)
    SMOL_BOUND_(state_dim, c->max_state_dim) SMOL_BOUND_(action_dim, c->max_action_dim)
#undef SMOL_BOUND_
    if (c->pad_token < 0) { snprintf(msg, sizeof(msg), "pad_token must not be negative (got %d)", c->pad_token); return msg; }
    if (c->img % c->patch != 0 || (c->img / c->patch) % c->scale_factor != 0) {
        snprintf(msg, sizeof(msg), "img %d / patch %d must be a whole grid that scale_factor %d divides", c->img, c->patch,
                 c->scale_factor);
        return msg;
    }
    if (c->vis_width % c->vis_heads != 0) {
        snprintf(msg, sizeof(msg), "vis_width %d is not a multiple of vis_heads %d", c->vis_width, c->vis_heads);
        return msg;
    }
    if (c->n_head % c->n_kv_head != 0) {
        snprintf(msg, sizeof(msg), "n_head %d is not a multiple of n_kv_head %d (GQA)", c->n_head, c->n_kv_head);
        return msg;
    }
    if (c->head_dim % 2 != 0 || c->d_expert % 2 != 0) {
        snprintf(msg, sizeof(msg), "head_dim %d (RoPE) and d_expert %d (time embedding) must be even", c->head_dim,
                 c->d_expert);
        return msg;
    }
    uint64_t tokens = (uint64_t)smolvla_n_prefix(c) + (uint64_t)c->chunk;
    uint64_t vis_tokens = (uint64_t)(c->img / c->patch) * (uint64_t)(c->img / c->patch);
    if (tokens > VLA_MAX_TOKENS || vis_tokens > VLA_MAX_TOKENS) {
        snprintf(msg, sizeof(msg), "%llu tokens (%llu per image in the vision tower) are past the bound %d",
                 (unsigned long long)tokens, (unsigned long long)vis_tokens, VLA_MAX_TOKENS);
        return msg;
    }
    uint64_t total = 0, numel;
    int bad = 0;
#define SMOL_COUNT_(nm, lr, tw, knd, trn, dec, ini, sl, nd, d0, d1, d2) \
    bad |= __builtin_mul_overflow((uint64_t)(d0), (uint64_t)(d1), &numel); \
    bad |= __builtin_mul_overflow(numel, (uint64_t)(d2), &numel); \
    bad |= __builtin_add_overflow(total, numel, &total);
    SMOLVLA_PARAMETERS(SMOL_COUNT_, c)
#undef SMOL_COUNT_
    if (bad || total > VLA_MAX_PARAMS) { snprintf(msg, sizeof(msg), "the parameter count is past the bound 2^36"); return msg; }
    return NULL;
}

// A config as "name value" lines (every field of SMOLVLA_CONFIG_FIELDS once; dev/smolvla.py
// --c-config writes them from a LeRobot policy folder). Returns 0, or 1 with err set.
static inline int smolvla_config_read(const char* path, SmolVLAConfig* c, char* err, size_t err_size) {
    FILE* f = fopen(path, "r");
    if (f == NULL) { snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno)); return 1; }
    memset(c, 0, sizeof(*c));
    int seen[64] = {0};
    char key[64];
    long long value;
    int status = 0;
    while (status == 0) {
        int got = fscanf(f, "%63s %lld", key, &value);
        if (got == EOF) { break; }
        if (got != 2 || value < INT32_MIN || value > INT32_MAX) {
            snprintf(err, err_size, "%s: a line is not 'name integer'", path);
            status = 1;
            break;
        }
        int i = 0, found = 0;
#define SMOL_READ_(f) if (strcmp(key, #f) == 0) { c->f = (int32_t)value; seen[i]++; found = 1; } i++;
        SMOLVLA_CONFIG_FIELDS(SMOL_READ_)
#undef SMOL_READ_
        if (!found) { snprintf(err, err_size, "%s: unknown field '%s'", path, key); status = 1; }
    }
    fclose(f);
    int i = 0;
#define SMOL_SEEN_(f) if (status == 0 && seen[i] != 1) { \
        snprintf(err, err_size, "%s: field " #f " appears %d times (once expected)", path, seen[i]); status = 1; } i++;
    SMOLVLA_CONFIG_FIELDS(SMOL_SEEN_)
#undef SMOL_SEEN_
    const char* problem = status == 0 ? smolvla_config_problem(c) : NULL;
    if (problem != NULL) { snprintf(err, err_size, "%s: %s", path, problem); status = 1; }
    return status;
}

// Parameters from the seed: normal(0, 0.02), output projections / sqrt(2L)
// of their tower's depth, biases 0, norm scales 1. (Imported weights replace them.)
static inline void smolvla_param_init(float* params, const SmolParamTable* t, const SmolVLAConfig* c, uint64_t seed) {
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &t->spec[i];
        float* p = params + s->offset;
        if (s->init == INIT_ZERO || s->init == INIT_ONE) {
            float v = s->init == INIT_ONE ? 1.0f : 0.0f;
            for (size_t j = 0; j < s->numel; j++) { p[j] = v; }
            continue;
        }
        int depth = s->tower == TOWER_VISION ? c->vis_layers : c->n_layer;
        float std = s->init == INIT_NORMAL_OUT ? 0.02f / sqrtf(2.0f * (float)depth) : 0.02f;
        Rng r;
        rng_init(&r, seed, RNG_STREAM_INIT);
        r.counter = 2 * (uint64_t)s->offset;
        for (size_t j = 0; j < s->numel; j++) { p[j] = (float)rng_normal(&r) * std; }
    }
}

// ----------------------------------------------------------------------------
// safetensors: what LeRobot's model.safetensors is. An 8-byte little-endian header length, a
// JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data. The reader maps the file, parses that header with a small parser of its own,
// and checks every tensor's extent against the file before handing out a byte.

enum { ST_F32 = 0, ST_BF16 = 1, ST_F16 = 2, ST_F64 = 3, ST_I64 = 4, ST_I32 = 5, ST_U8 = 6, ST_BOOL = 7 };
static const char* const ST_DTYPE_NAMES[] = {"F32", "BF16", "F16", "F64", "I64", "I32", "U8", "BOOL"};
static const int ST_DTYPE_BYTES[] = {4, 2, 2, 8, 8, 4, 1, 1};
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20)  // the format's own limit on the header, 100 MB

typedef struct {
    char name[256];
    int dtype, ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;  // into the data section
} SafeTensorInfo;

typedef struct {
    uint8_t* map;
    size_t size;
    const uint8_t* data;  // the data section
    uint64_t data_size;
    int n;
    SafeTensorInfo* tensors;
} SafeTensors;

typedef struct { const char* p; const char* end; } StJson;

static inline void st_skip_space(StJson* j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) { j->p++; }
}
static inline int st_expect(StJson* j, char ch) {
    st_skip_space(j);
    if (j->p >= j->end || *j->p != ch) { return 1; }
    j->p++;
    return 0;
}
// A JSON string into out (escapes other than \" \\ \/ refused: tensor names have none). Control
// characters are refused, as JSON refuses them: a name holding a newline would split the one-line
// error that names it.
static inline int st_string(StJson* j, char* out, size_t size) {
    if (st_expect(j, '"')) { return 1; }
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        char ch = *j->p++;
        if ((unsigned char)ch < 0x20) { return 1; }
        if (ch == '\\') {
            if (j->p >= j->end || (*j->p != '"' && *j->p != '\\' && *j->p != '/')) { return 1; }
            ch = *j->p++;
        }
        if (n + 1 >= size) { return 1; }
        out[n++] = ch;
    }
    if (j->p >= j->end) { return 1; }
    j->p++;
    out[n] = '\0';
    return 0;
}
static inline int st_uint(StJson* j, uint64_t* v) {
    st_skip_space(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') { return 1; }
    uint64_t x = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > (UINT64_MAX - 9) / 10) { return 1; }
        x = x * 10 + (uint64_t)(*j->p++ - '0');
    }
    *v = x;
    return 0;
}
// [u, u, ...] into v (at most max); returns the count, or -1.
static inline int st_uint_array(StJson* j, uint64_t* v, int max) {
    if (st_expect(j, '[')) { return -1; }
    st_skip_space(j);
    int n = 0;
    if (j->p < j->end && *j->p == ']') { j->p++; return 0; }
    for (;;) {
        if (n >= max || st_uint(j, &v[n])) { return -1; }
        n++;
        st_skip_space(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        return st_expect(j, ']') ? -1 : n;
    }
}
// Skips one JSON value of the __metadata__ kind: a string or an object of strings.
static inline int st_skip_value(StJson* j) {
    char buf[4096];
    st_skip_space(j);
    if (j->p < j->end && *j->p == '"') { return st_string(j, buf, sizeof(buf)); }
    if (st_expect(j, '{')) { return 1; }
    st_skip_space(j);
    if (j->p < j->end && *j->p == '}') { j->p++; return 0; }
    for (;;) {
        if (st_string(j, buf, sizeof(buf)) || st_expect(j, ':') || st_string(j, buf, sizeof(buf))) { return 1; }
        st_skip_space(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        return st_expect(j, '}');
    }
}

static inline void safetensors_close(SafeTensors* st) {
    if (st->map != NULL && st->map != MAP_FAILED) { munmap(st->map, st->size); }
    free(st->tensors);
    memset(st, 0, sizeof(*st));
}

// Returns 0, or 1 with a one-line reason in err (and nothing left open).
static inline int safetensors_open(SafeTensors* st, const char* path, char* err, size_t err_size) {
    memset(st, 0, sizeof(*st));
#define ST_REJECT_(...) do { snprintf(err, err_size, __VA_ARGS__); safetensors_close(st); return 1; } while (0)
    int fd = open(path, O_RDONLY);
    if (fd < 0) { snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno)); return 1; }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
        close(fd);
        snprintf(err, err_size, "%s is not a safetensors file (not a regular file of at least 8 bytes)", path);
        return 1;
    }
    st->size = (size_t)sb.st_size;
    st->map = (uint8_t*)mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (st->map == MAP_FAILED) { st->map = NULL; ST_REJECT_("cannot map %s: %s", path, strerror(errno)); }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) { header_len = (header_len << 8) | st->map[i]; }
    if (header_len > ST_MAX_HEADER || header_len > st->size - 8) {
        ST_REJECT_("%s: header length %llu does not fit the file of %zu bytes (truncated or not safetensors)", path,
                   (unsigned long long)header_len, st->size);
    }
    st->data = st->map + 8 + header_len;
    st->data_size = st->size - 8 - header_len;
    StJson j = {(const char*)st->map + 8, (const char*)st->map + 8 + header_len};
    int cap = 0;
    if (st_expect(&j, '{')) { ST_REJECT_("%s: the header is not a JSON object", path); }
    st_skip_space(&j);
    int empty = j.p < j.end && *j.p == '}';
    if (empty) { j.p++; }
    while (!empty) {
        char name[256];
        if (st_string(&j, name, sizeof(name)) || st_expect(&j, ':')) { ST_REJECT_("%s: a malformed header entry", path); }
        if (strcmp(name, "__metadata__") == 0) {
            if (st_skip_value(&j)) { ST_REJECT_("%s: a malformed __metadata__", path); }
        } else {
            if (st->n == cap) {
                cap = cap == 0 ? 64 : 2 * cap;
                SafeTensorInfo* grown = (SafeTensorInfo*)realloc(st->tensors, (size_t)cap * sizeof(SafeTensorInfo));
                if (grown == NULL) { ST_REJECT_("%s: out of memory for the header", path); }
                st->tensors = grown;
            }
            SafeTensorInfo* t = &st->tensors[st->n];
            memset(t, 0, sizeof(*t));
            snprintf(t->name, sizeof(t->name), "%s", name);
            int have_dtype = 0, have_shape = 0, have_offsets = 0;
            if (st_expect(&j, '{')) { ST_REJECT_("%s: tensor %s: not an object", path, name); }
            for (;;) {
                char field[64];
                if (st_string(&j, field, sizeof(field)) || st_expect(&j, ':')) {
                    ST_REJECT_("%s: tensor %s: a malformed field", path, name);
                }
                if (strcmp(field, "dtype") == 0) {
                    char dt[16];
                    if (st_string(&j, dt, sizeof(dt))) { ST_REJECT_("%s: tensor %s: a malformed dtype", path, name); }
                    t->dtype = -1;
                    for (int k = 0; k < (int)(sizeof(ST_DTYPE_BYTES) / sizeof(int)); k++) {
                        if (strcmp(dt, ST_DTYPE_NAMES[k]) == 0) { t->dtype = k; }
                    }
                    if (t->dtype < 0) { ST_REJECT_("%s: tensor %s has dtype %s, which train_vla does not read", path, name, dt); }
                    have_dtype = 1;
                } else if (strcmp(field, "shape") == 0) {
                    uint64_t dims[ST_MAX_DIMS];
                    int nd = st_uint_array(&j, dims, ST_MAX_DIMS);
                    if (nd < 0) { ST_REJECT_("%s: tensor %s: a malformed shape", path, name); }
                    t->ndim = nd;
                    t->numel = 1;
                    for (int k = 0; k < nd; k++) {
                        if (dims[k] > (1ULL << 40) || __builtin_mul_overflow(t->numel, dims[k], &t->numel)) {
                            ST_REJECT_("%s: tensor %s: its shape overflows", path, name);
                        }
                        t->shape[k] = (int64_t)dims[k];
                    }
                    have_shape = 1;
                } else if (strcmp(field, "data_offsets") == 0) {
                    uint64_t off[2];
                    if (st_uint_array(&j, off, 2) != 2) { ST_REJECT_("%s: tensor %s: malformed data_offsets", path, name); }
                    t->begin = off[0];
                    t->end = off[1];
                    have_offsets = 1;
                } else {
                    ST_REJECT_("%s: tensor %s: unknown field %s", path, name, field);
                }
                st_skip_space(&j);
                if (j.p < j.end && *j.p == ',') { j.p++; continue; }
                if (st_expect(&j, '}')) { ST_REJECT_("%s: tensor %s: a malformed entry", path, name); }
                break;
            }
            if (!have_dtype || !have_shape || !have_offsets) {
                ST_REJECT_("%s: tensor %s lacks its dtype, shape or data_offsets", path, name);
            }
            uint64_t bytes;
            if (__builtin_mul_overflow(t->numel, (uint64_t)ST_DTYPE_BYTES[t->dtype], &bytes) || t->begin > t->end ||
                t->end > st->data_size || t->end - t->begin != bytes) {
                ST_REJECT_("%s: tensor %s: data_offsets [%llu, %llu) do not hold its %llu bytes within the %llu-byte "
                           "data section (truncated?)", path, name, (unsigned long long)t->begin,
                           (unsigned long long)t->end, (unsigned long long)bytes, (unsigned long long)st->data_size);
            }
            st->n++;
        }
        st_skip_space(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        if (st_expect(&j, '}')) { ST_REJECT_("%s: the header is not a well-formed JSON object", path); }
        break;
    }
#undef ST_REJECT_
    return 0;
}

static inline const SafeTensorInfo* safetensors_find(const SafeTensors* st, const char* name) {
    for (int i = 0; i < st->n; i++) {
        if (strcmp(st->tensors[i].name, name) == 0) { return &st->tensors[i]; }
    }
    return NULL;
}

static inline float st_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float mag;
    if (exp == 0) { mag = ldexpf((float)man, -24); }
    else if (exp == 31) { mag = man ? NAN : INFINITY; }
    else { mag = ldexpf((float)(man | 0x400), (int)exp - 25); }
    uint32_t bits;
    memcpy(&bits, &mag, 4);
    bits |= sign;
    memcpy(&mag, &bits, 4);
    return mag;
}

// A floating-point tensor as float32 (bf16 and f16 widened exactly, f64 rounded).
static inline int safetensors_read_f32(const SafeTensors* st, const SafeTensorInfo* t, float* out) {
    const uint8_t* p = st->data + t->begin;
    for (uint64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
            case ST_F32: memcpy(&out[i], p + 4 * i, 4); break;
            case ST_BF16: {
                uint32_t bits = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
                memcpy(&out[i], &bits, 4);
                break;
            }
            case ST_F16: out[i] = st_half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8))); break;
            case ST_F64: {
                double d;
                memcpy(&d, p + 8 * i, 8);
                out[i] = (float)d;
                break;
            }
            default: return 1;
        }
    }
    return 0;
}

// LeRobot's weights into the flat parameter buffer, every tensor of the table by its LeRobot
// name, shape-checked (the flattened shape must match; patch_embedding's (Cv, 3, p, p) is our
// (Cv, 3 p p)). Tensors of the file the table does not hold (lm_head) are ignored here.
static inline int smolvla_load_safetensors(const SafeTensors* st, const SmolVLAConfig* c, const SmolParamTable* t,
                                           float* params, char* err, size_t err_size) {
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &t->spec[i];
        size_t n_slices = smolvla_slices(s), per = s->numel / n_slices;
        for (size_t k = 0; k < n_slices; k++) {
            char name[256];
            if (s->slices == SLICES_NONE) { snprintf(name, sizeof(name), "%s", s->lerobot); }
            else { snprintf(name, sizeof(name), s->lerobot, smolvla_slice_layer(c, s, (int)k)); }
            const SafeTensorInfo* ti = safetensors_find(st, name);
            if (ti == NULL) { snprintf(err, err_size, "the weights lack %s (for %s)", name, s->name); return 1; }
            int64_t lead = s->slices == SLICES_NONE ? s->shape[0] : s->shape[1];
            if (ti->numel != per || ti->ndim < 1 || ti->shape[0] != lead) {
                snprintf(err, err_size, "%s has %llu values with leading size %lld; this config's %s needs %zu with %lld",
                         name, (unsigned long long)ti->numel, ti->ndim > 0 ? (long long)ti->shape[0] : -1LL, s->name,
                         per, (long long)lead);
                return 1;
            }
            if (safetensors_read_f32(st, ti, params + s->offset + k * per)) {
                snprintf(err, err_size, "%s has dtype %s, not a floating-point type", name, ST_DTYPE_NAMES[ti->dtype]);
                return 1;
            }
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// dataset shards (SPEC section 3). One file, version 2:
//   header (512 bytes)
//   images         u8  (n_frames, frame bytes)        each frame: its cameras one after another,
//                                                     camera k cam_height[k] x cam_width[k] x 3 (HWC)
//   state          f32 (n_frames, state_dim)
//   action         f32 (n_frames, action_dim)
//   frame_episode  u32 (n_frames)                    episode of each frame, shard-local
//   episodes       ShardEpisode (n_episodes)
//   task_offsets   u64 (n_tasks + 1)                 into task_text
//   task_text      u8  (task_bytes)                  UTF-8, not NUL-terminated
//   stats          f32 state_mean(S) state_std(S) action_mean(A) action_std(A)
//   token_offsets  u64 (n_tasks + 1)                 into tokens
//   tokens         i32 (n_tokens)                    each task's instruction as ids in [0, vocab)
// Sections follow each other in this order, each at the first 64-byte boundary after the one
// before; the header records the offsets and the reader checks that they are exactly there.
// The header names the tokenizer of the ids: "bytes" (id = UTF-8 byte, vocab 256: the presets
// trained from scratch) or a tokenizer.json as "<its basename>:<first 16 hex digits of its
// sha256>". Version 1 (256-byte header: the first 128 bytes of this one, then zeros; the first
// 8 sections; every camera img x img) still reads: the reader maps it to the same view, camera
// sizes img x img, tokenizer "bytes", tokens made from the task text (the frames are not copied).

#define SHARD_MAGIC 0x44414C56u  // "VLAD"
#define SHARD_VERSION 2u
#define SHARD_ALIGN 64
#define SHARD_HEADER_V1 256             // bytes of version 1's header
#define SHARD_TOKENIZER_BYTES "bytes"   // token id = UTF-8 byte
#define SHARD_MAX_VOCAB (1u << 24)
#define VLA_TEXT_VOCAB 256              // the byte tokenizer's vocabulary (the tiny and small presets' text table)
// A std below this counts as zero: the dimension is constant and is only centered.
#define VLA_MIN_STD 1e-6f

typedef struct {
    uint32_t magic, version;
    uint32_t n_cam;
    uint32_t img;                       // side of every camera when all are img x img, else 0
    uint32_t state_dim, action_dim;
    uint64_t n_frames, n_episodes, n_tasks, task_bytes;
    uint64_t off_images, off_state, off_action, off_frame_episode;
    uint64_t off_episodes, off_task_offsets, off_task_text, off_stats;
    uint64_t file_size;
    // version 2 from here on
    uint64_t n_tokens;                  // token ids of all tasks
    uint64_t off_token_offsets, off_tokens;
    uint32_t vocab;                     // every id is in [0, vocab)
    uint32_t reserved0;
    char tokenizer[64];                 // NUL-terminated: "bytes" or "<tokenizer.json basename>:<16 hex>"
    uint32_t cam_height[VLA_MAX_CAM];   // camera k's pixels (0 past n_cam)
    uint32_t cam_width[VLA_MAX_CAM];
    uint64_t reserved[20];
} ShardHeader;
VLA_STATIC_ASSERT(sizeof(ShardHeader) == 512 && VLA_MAX_CAM == 16, "shard header is 512 bytes");
VLA_STATIC_ASSERT(offsetof(ShardHeader, n_tokens) == 128, "version 1's fields come first, where they were");

typedef struct {
    uint64_t first_frame;
    uint32_t length;
    uint32_t task;
} ShardEpisode;
VLA_STATIC_ASSERT(sizeof(ShardEpisode) == 16, "episode record is 16 bytes");

// The cameras of a frame: camera k is height[k] x width[k] pixels, u8 HWC, the cameras one after
// another. A shard's come from its header (shard_cameras); a batch's images are laid out the same.
typedef struct {
    int n;
    uint32_t height[VLA_MAX_CAM], width[VLA_MAX_CAM];
} Cameras;

// Byte offset of camera k in a frame's images; k = n gives the bytes of a whole frame.
static inline size_t camera_offset(const Cameras* cams, int k) {
    size_t off = 0;
    for (int j = 0; j < k; j++) { off += (size_t)cams->height[j] * cams->width[j] * 3; }
    return off;
}

static inline size_t cameras_frame_bytes(const Cameras* cams) { return camera_offset(cams, cams->n); }

static inline Cameras cameras_square(int n, int img) {
    Cameras cams;
    memset(&cams, 0, sizeof(cams));
    cams.n = n;
    for (int k = 0; k < n && k < VLA_MAX_CAM; k++) { cams.height[k] = cams.width[k] = (uint32_t)img; }
    return cams;
}

static inline int cameras_equal(const Cameras* a, const Cameras* b) {
    int same = a->n == b->n;
    for (int k = 0; same && k < a->n; k++) { same = a->height[k] == b->height[k] && a->width[k] == b->width[k]; }
    return same;
}

// The side when every camera is img x img, else 0.
static inline uint32_t cameras_square_side(const Cameras* cams) {
    for (int k = 0; k < cams->n; k++) {
        if (cams->height[k] != cams->width[k] || cams->height[k] != cams->height[0]) { return 0; }
    }
    return cams->n > 0 ? cams->height[0] : 0;
}

// "8x12, 16x16" (height x width of each camera), for messages
static inline const char* cameras_describe(const Cameras* cams, char* buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < cams->n && at < size; k++) {
        at += (size_t)snprintf(buf + at, size - at, "%s%ux%u", k > 0 ? ", " : "", cams->height[k], cams->width[k]);
    }
    return buf;
}

static inline Cameras shard_cameras(const ShardHeader* h) {
    if (h->version == 1) { return cameras_square((int)h->n_cam, (int)h->img); }
    Cameras cams;
    memset(&cams, 0, sizeof(cams));
    cams.n = (int)h->n_cam;
    for (int k = 0; k < cams.n && k < VLA_MAX_CAM; k++) { cams.height[k] = h->cam_height[k]; cams.width[k] = h->cam_width[k]; }
    return cams;
}

// Token ids of UTF-8 text under the "bytes" tokenizer: one id per byte, its value.
static inline void tokens_from_bytes(int32_t* ids, const uint8_t* text, size_t n) {
    for (size_t k = 0; k < n; k++) { ids[k] = (int32_t)text[k]; }
}

typedef struct {
    char path[VLA_PATH_MAX];
    ShardHeader h;       // a version-1 file's as version 2 would say it (cameras, tokenizer, n_tokens)
    uint8_t* map;
    size_t map_size;
    const uint8_t* images;
    const float* state;
    const float* action;
    const uint32_t* frame_episode;
    const ShardEpisode* episodes;
    const uint64_t* task_offsets;
    const uint8_t* task_text;
    const float* stats;
    const uint64_t* token_offsets;  // (n_tasks + 1) into tokens
    const int32_t* tokens;          // (n_tokens)
    int32_t* owned_tokens;          // version 1: the tokens made from task_text at open (else NULL)
    // The tables that addresses are computed from (frame_episode, episodes, task_offsets,
    // token_offsets, tokens) are private copies, checked at open: a file rewritten in place while
    // mapped cannot steer a read outside the mapping. The rest (images, state, action, task_text,
    // stats) is read in place; shard_unchanged notices a change, the SIGBUS handler a truncation.
    void* tables;
    uint64_t dev, ino, size;        // the file as opened: shard_unchanged compares them
    int64_t mtime_ns;
} Shard;

static inline uint64_t align_up(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

// The sections in file order; version 1 has the first SHARD_SECTIONS_V1.
enum { SHARD_SECTIONS_V1 = 8, SHARD_SECTIONS = 10 };
static const char* const SHARD_SECTION_NAMES[SHARD_SECTIONS] = {
    "images", "state", "action", "frame_episode", "episodes", "task_offsets", "task_text", "stats",
    "token_offsets", "tokens"};

static inline int shard_n_sections(const ShardHeader* h) { return h->version == 1 ? SHARD_SECTIONS_V1 : SHARD_SECTIONS; }
static inline uint64_t shard_header_bytes(const ShardHeader* h) { return h->version == 1 ? SHARD_HEADER_V1 : sizeof(ShardHeader); }

// The header's offset fields, in file order.
static inline void shard_section_offsets(ShardHeader* h, uint64_t* offs[SHARD_SECTIONS]) {
    uint64_t* all[SHARD_SECTIONS] = {&h->off_images, &h->off_state, &h->off_action, &h->off_frame_episode,
                                     &h->off_episodes, &h->off_task_offsets, &h->off_task_text, &h->off_stats,
                                     &h->off_token_offsets, &h->off_tokens};
    memcpy(offs, all, sizeof(all));
}

// Byte sizes of the sections, in file order (the counts must be bounded first: see the reader).
static inline void shard_section_sizes(const ShardHeader* h, const char* path, uint64_t sizes[SHARD_SECTIONS]) {
    Cameras cams = shard_cameras(h);
    sizes[0] = mul_check(h->n_frames, cameras_frame_bytes(&cams), path, "images");
    sizes[1] = mul_check(mul_check(h->n_frames, h->state_dim, path, "state"), 4, path, "state");
    sizes[2] = mul_check(mul_check(h->n_frames, h->action_dim, path, "action"), 4, path, "action");
    sizes[3] = mul_check(h->n_frames, 4, path, "frame_episode");
    sizes[4] = mul_check(h->n_episodes, sizeof(ShardEpisode), path, "episodes");
    if (h->n_tasks == UINT64_MAX) { vla_fail("%s: n_tasks is corrupt: regenerate the shard", path); }
    sizes[5] = mul_check(h->n_tasks + 1, 8, path, "task offsets");
    sizes[6] = h->task_bytes;
    sizes[7] = 8ULL * ((uint64_t)h->state_dim + h->action_dim);
    sizes[8] = h->version == 1 ? 0 : sizes[5];
    sizes[9] = h->version == 1 ? 0 : mul_check(h->n_tokens, 4, path, "tokens");
}

// Fills the offsets and file_size of a header whose version and counts are set.
static inline void shard_header_layout(ShardHeader* h) {
    uint64_t sizes[SHARD_SECTIONS], *offs[SHARD_SECTIONS];
    shard_section_sizes(h, "(new shard)", sizes);
    shard_section_offsets(h, offs);
    uint64_t pos = shard_header_bytes(h);
    for (int i = 0; i < shard_n_sections(h); i++) {
        pos = align_up(pos, SHARD_ALIGN);
        *offs[i] = pos;
        pos += sizes[i];
    }
    h->file_size = pos;
}

// The mapped shards, for the SIGBUS handler: a shard truncated while mapped makes a read past its
// new end fault, and the handler names the shard instead of dying as "Bus error". Shards are opened
// and closed before and after the loader's threads run, so the table does not change under a read.
typedef struct { const uint8_t* start; size_t size; char* path; } ShardMapping;
static ShardMapping* shard_mappings = NULL;
static int shard_n_mappings = 0, shard_mappings_cap = 0;
static struct sigaction shard_sigbus_previous;

static inline void shard_sigbus_write(const char* text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, text, n);
        if (w <= 0) { return; }
        text += w;
        n -= (size_t)w;
    }
}

// Async-signal-safe: write(2) and _exit. A fault outside every shard goes to the handler before.
static inline void shard_on_sigbus(int sig, siginfo_t* info, void* context) {
    const uint8_t* at = (const uint8_t*)info->si_addr;
    for (int i = 0; i < shard_n_mappings; i++) {
        if (at >= shard_mappings[i].start && at < shard_mappings[i].start + shard_mappings[i].size) {
            shard_sigbus_write("error: dataset shard ");
            shard_sigbus_write(shard_mappings[i].path);
            shard_sigbus_write(" was truncated while this run read it: restore the shard and continue with -y 1, or "
                               "start a new run on the new data\n");
            _exit(1);
        }
    }
    sigaction(SIGBUS, &shard_sigbus_previous, NULL);  // the fault repeats under the previous handler
    (void)sig; (void)context;
}

// Makes shard_on_sigbus the SIGBUS handler, the one there before its fallback. Called when the
// first shard opens and again when the loader starts: a library may install its own in between
// (the CUDA emulation does, for its device memory), and then handles the faults that are not ours.
static inline void shard_sigbus_install(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == shard_on_sigbus) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = shard_on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &shard_sigbus_previous);
}

static inline void shard_mapping_add(const uint8_t* start, size_t size, const char* path) {
    if (shard_mappings_cap == 0) { shard_sigbus_install(); }
    if (shard_n_mappings == shard_mappings_cap) {
        shard_mappings_cap = shard_mappings_cap > 0 ? 2 * shard_mappings_cap : 16;
        shard_mappings = (ShardMapping*)realloc(shard_mappings, (size_t)shard_mappings_cap * sizeof(ShardMapping));
        if (shard_mappings == NULL) { vla_fail("out of memory listing the mapped shards"); }
    }
    ShardMapping m = {start, size, strdup(path)};
    shard_mappings[shard_n_mappings++] = m;
}

static inline void shard_mapping_remove(const uint8_t* start) {
    for (int i = 0; i < shard_n_mappings; i++) {
        if (shard_mappings[i].start == start) {
            free(shard_mappings[i].path);
            shard_mappings[i] = shard_mappings[--shard_n_mappings];
            return;
        }
    }
}

static inline void shard_close(Shard* s) {
    if (s->map != NULL) {
        shard_mapping_remove(s->map);
        munmap(s->map, s->map_size);
    }
    s->map = NULL;
    free(s->owned_tokens);
    s->owned_tokens = NULL;
    free(s->tables);
    s->tables = NULL;
}

static inline int64_t stat_mtime_ns(const struct stat* st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

// 0 while the shard's file is the one opened (same file, size and modification time), else 1 with
// a line naming the shard and what changed in err. A stat, cheap enough to call every batch.
static inline int shard_unchanged(const Shard* s, char* err, size_t err_size) {
    struct stat st;
    char what[160];
    if (stat(s->path, &st) != 0) {
        snprintf(what, sizeof(what), "it can no longer be read: %s", strerror(errno));
    } else if ((uint64_t)st.st_dev != s->dev || (uint64_t)st.st_ino != s->ino) {
        snprintf(what, sizeof(what), "another file took its name");
    } else if ((uint64_t)st.st_size != s->size) {
        snprintf(what, sizeof(what), "its size went from %llu to %llu bytes", (unsigned long long)s->size,
                 (unsigned long long)st.st_size);
    } else if (stat_mtime_ns(&st) != s->mtime_ns) {
        snprintf(what, sizeof(what), "it was rewritten");
    } else {
        return 0;
    }
    snprintf(err, err_size, "dataset shard %s changed while this run read it (%s): restore the shard and continue with "
             "-y 1, or start a new run on the new data", s->path, what);
    return 1;
}

// Opens and checks a shard of version 1 or 2: every size against the file, every index in range,
// every token id in its vocabulary, every state and action value finite, the statistics those of
// the values. Returns 0, or 1 with the reason in err and nothing left open.
static inline int shard_open_checked(Shard* s, const char* path, char* err, size_t err_size) {
    memset(s, 0, sizeof(*s));
#define SHARD_REJECT_(...) do { snprintf(err, err_size, __VA_ARGS__); shard_close(s); return 1; } while (0)
    if (snprintf(s->path, sizeof(s->path), "%s", path) >= (int)sizeof(s->path)) {
        SHARD_REJECT_("dataset path %.80s... is longer than %d bytes: use a shorter path", path, VLA_PATH_MAX - 1);
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) { SHARD_REJECT_("cannot open dataset shard %s: %s: check the -i path", path, strerror(errno)); }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        SHARD_REJECT_("dataset shard %s is not a regular file (%s): pass shard files or folders of them with -i", path,
                      e != 0 ? strerror(e) : "a device, pipe or socket");
    }
    uint64_t len = (uint64_t)st.st_size;
    if (len < SHARD_HEADER_V1) {
        close(fd);
        SHARD_REJECT_("%s: %llu bytes is shorter than a shard header (256): the file is truncated, regenerate it",
                      path, (unsigned long long)len);
    }
    s->map = (uint8_t*)mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        SHARD_REJECT_("%s: mmap failed: %s", path, strerror(map_errno));
    }
    s->map_size = len;
    shard_mapping_add(s->map, len, path);
    s->dev = (uint64_t)st.st_dev; s->ino = (uint64_t)st.st_ino; s->size = len; s->mtime_ns = stat_mtime_ns(&st);
    ShardHeader* h = &s->h;
    memcpy(h, s->map, offsetof(ShardHeader, n_tokens));  // version 1's fields; the rest stays zero for now
    if (h->magic == 0x43414C56u) {  // CKPT_MAGIC, "VLAC" (the checkpoints' section is below)
        SHARD_REJECT_("%s is a train_vla checkpoint, not a dataset shard: pass shards with -i (a checkpoint to start from "
                      "goes to --init)", path);
    }
    if (h->magic != SHARD_MAGIC) {
        SHARD_REJECT_("%s: bad magic 0x%08x (want 0x%08x): not a train_vla dataset shard; convert it with the tools in data/",
                      path, h->magic, SHARD_MAGIC);
    }
    if (h->version != 1 && h->version != SHARD_VERSION) {
        SHARD_REJECT_("%s: shard version %u, this build reads versions 1 and %u: regenerate the shard with this version's "
                      "data/ tools", path, h->version, SHARD_VERSION);
    }
    if (h->version != 1) {
        if (len < sizeof(ShardHeader)) {
            SHARD_REJECT_("%s: %llu bytes is shorter than a version-2 shard header (512): the file is truncated, "
                          "regenerate it", path, (unsigned long long)len);
        }
        memcpy(h, s->map, sizeof(ShardHeader));
    }
    if (h->n_cam < 1 || h->n_cam > VLA_MAX_CAM || (h->version == 1 && (h->img < 1 || h->img > VLA_MAX_IMG)) ||
        h->state_dim < 1 || h->state_dim > VLA_MAX_DIM || h->action_dim < 1 || h->action_dim > VLA_MAX_DIM ||
        h->n_frames < 1 || h->n_frames > UINT32_MAX || h->n_episodes < 1 || h->n_episodes > h->n_frames ||
        h->n_tasks < 1 || h->n_tasks > UINT32_MAX) {
        SHARD_REJECT_("%s: header sizes out of range (n_cam %u, img %u, state %u, action %u, frames %llu, episodes %llu, "
                      "tasks %llu): the file is corrupt, regenerate it", path, h->n_cam, h->img, h->state_dim,
                      h->action_dim, (unsigned long long)h->n_frames, (unsigned long long)h->n_episodes,
                      (unsigned long long)h->n_tasks);
    }
    if (h->version == 1) {  // the same view as version 2: its cameras, byte tokens (made below)
        for (uint32_t k = 0; k < h->n_cam; k++) { h->cam_height[k] = h->cam_width[k] = h->img; }
        snprintf(h->tokenizer, sizeof(h->tokenizer), "%s", SHARD_TOKENIZER_BYTES);
        h->vocab = VLA_TEXT_VOCAB;
        h->n_tokens = h->task_bytes;
    } else {
        for (int k = 0; k < VLA_MAX_CAM; k++) {
            uint32_t ch = h->cam_height[k], cw = h->cam_width[k];
            int inside = k < (int)h->n_cam;
            if (inside && (ch < 1 || ch > VLA_MAX_IMG || cw < 1 || cw > VLA_MAX_IMG)) {
                SHARD_REJECT_("%s: camera %d is %ux%u pixels (height x width), outside 1 to %d: the file is corrupt, "
                              "regenerate it", path, k, ch, cw, VLA_MAX_IMG);
            }
            if (!inside && (ch != 0 || cw != 0)) {
                SHARD_REJECT_("%s: camera %d has a size (%ux%u) but the shard has %u camera(s): the file is corrupt, "
                              "regenerate it", path, k, ch, cw, h->n_cam);
            }
        }
        Cameras cams = shard_cameras(h);
        if (h->img != cameras_square_side(&cams)) {
            char sizes[256];
            SHARD_REJECT_("%s: img %u disagrees with the camera sizes (%s, height x width; img is their side when all are "
                          "square and equal, else 0): the file is corrupt, regenerate it", path, h->img,
                          cameras_describe(&cams, sizes, sizeof(sizes)));
        }
        if (memchr(h->tokenizer, '\0', sizeof(h->tokenizer)) == NULL) {
            SHARD_REJECT_("%s: the tokenizer name is not NUL-terminated within its %d bytes: the file is corrupt, "
                          "regenerate it", path, (int)sizeof(h->tokenizer));
        }
        int printable = h->tokenizer[0] != '\0';
        for (const char* p = h->tokenizer; *p != '\0'; p++) { printable &= *p >= 0x20 && *p < 0x7f; }
        if (!printable) {
            SHARD_REJECT_("%s: the tokenizer name is empty or not printable ASCII: the file is corrupt, regenerate it",
                          path);
        }
        if (h->vocab < 1 || h->vocab > SHARD_MAX_VOCAB) {
            SHARD_REJECT_("%s: vocabulary size %u of tokenizer %s is outside 1 to %u: the file is corrupt, regenerate it",
                          path, h->vocab, h->tokenizer, SHARD_MAX_VOCAB);
        }
        if (strcmp(h->tokenizer, SHARD_TOKENIZER_BYTES) == 0 && h->vocab != VLA_TEXT_VOCAB) {
            SHARD_REJECT_("%s: tokenizer \"bytes\" with a vocabulary of %u, not %d: the file is corrupt, regenerate it",
                          path, h->vocab, VLA_TEXT_VOCAB);
        }
        if (h->n_tokens > len / 4) {
            SHARD_REJECT_("%s: %llu tokens cannot fit in the %llu-byte file: the file is corrupt, regenerate it", path,
                          (unsigned long long)h->n_tokens, (unsigned long long)len);
        }
    }
    if (h->file_size != len) {
        SHARD_REJECT_("%s: header says %llu bytes but the file has %llu: the file is truncated or padded, regenerate it",
                      path, (unsigned long long)h->file_size, (unsigned long long)len);
    }
    // every section where the writers put it: in order, each at the first 64-byte boundary after the
    // one before, the last ending the file. So sizes computed from the header (the cameras') are the
    // sizes of the sections in the file.
    uint64_t sizes[SHARD_SECTIONS], *off_fields[SHARD_SECTIONS], offs[SHARD_SECTIONS];
    shard_section_sizes(h, path, sizes);  // the counts are bounded, so none of these products overflows
    shard_section_offsets(h, off_fields);
    uint64_t end = shard_header_bytes(h);
    for (int i = 0; i < shard_n_sections(h); i++) {
        offs[i] = *off_fields[i];
        const char* name = SHARD_SECTION_NAMES[i];
        if (offs[i] % SHARD_ALIGN != 0) {
            SHARD_REJECT_("%s: section %s starts at offset %llu, not a multiple of %d as the format requires: the file "
                          "is corrupt, regenerate it", path, name, (unsigned long long)offs[i], SHARD_ALIGN);
        }
        uint64_t next;
        if (offs[i] < shard_header_bytes(h) || __builtin_add_overflow(offs[i], sizes[i], &next) || next > len) {
            SHARD_REJECT_("%s: section %s (offset %llu, %llu bytes) does not fit in the %llu-byte file: the sizes disagree "
                          "with the file length, regenerate it", path, name, (unsigned long long)offs[i],
                          (unsigned long long)sizes[i], (unsigned long long)len);
        }
        if (offs[i] != align_up(end, SHARD_ALIGN)) {
            if (i == 1) {  // the images section's size is the cameras'
                Cameras cams = shard_cameras(h);
                char sizes_text[256];
                SHARD_REJECT_("%s: the camera sizes (%s, height x width) make %llu frames %llu bytes of images, ending at "
                              "offset %llu, but the next section starts at %llu: the camera sizes disagree with the "
                              "file; it is corrupt, regenerate it", path, cameras_describe(&cams, sizes_text,
                              sizeof(sizes_text)), (unsigned long long)h->n_frames, (unsigned long long)sizes[0],
                              (unsigned long long)end, (unsigned long long)offs[i]);
            }
            SHARD_REJECT_("%s: section %s starts at offset %llu, but what comes before it ends at %llu (next boundary "
                          "%llu): the header's sizes disagree with the layout; the file is corrupt, regenerate it", path,
                          name, (unsigned long long)offs[i], (unsigned long long)end,
                          (unsigned long long)align_up(end, SHARD_ALIGN));
        }
        end = next;
    }
    if (end != len) {
        SHARD_REJECT_("%s: the last section ends at offset %llu but the file has %llu bytes: the header's sizes disagree "
                      "with the layout; the file is corrupt, regenerate it", path, (unsigned long long)end,
                      (unsigned long long)len);
    }
    s->images = s->map + h->off_images;
    s->state = (const float*)(s->map + h->off_state);
    s->action = (const float*)(s->map + h->off_action);
    s->task_text = s->map + h->off_task_text;
    s->stats = (const float*)(s->map + h->off_stats);
    // the index tables copied, then checked: what is checked is what is read (sections 3, 4, 5,
    // 8, 9, each a multiple of 8 bytes once aligned)
    const int copied[5] = {3, 4, 5, 8, 9};
    uint64_t table_bytes = 0, at = 0;
    for (int k = 0; k < 5; k++) { table_bytes += align_up(sizes[copied[k]], 8); }
    s->tables = mallocCheck(table_bytes);
    void* table[SHARD_SECTIONS] = {NULL};
    for (int k = 0; k < 5 && k < (h->version == 1 ? 3 : 5); k++) {
        table[copied[k]] = (uint8_t*)s->tables + at;
        memcpy(table[copied[k]], s->map + offs[copied[k]], sizes[copied[k]]);
        at += align_up(sizes[copied[k]], 8);
    }
    s->frame_episode = (const uint32_t*)table[3];
    s->episodes = (const ShardEpisode*)table[4];
    s->task_offsets = (const uint64_t*)table[5];
    if (h->version != 1) {
        s->token_offsets = (const uint64_t*)table[8];
        s->tokens = (const int32_t*)table[9];
    }
    // the tables that index into other sections: every index in range
    for (uint64_t e = 0; e < h->n_episodes; e++) {
        const ShardEpisode* ep = &s->episodes[e];
        if (ep->length == 0 || ep->first_frame >= h->n_frames || ep->length > h->n_frames - ep->first_frame ||
            ep->task >= h->n_tasks) {
            SHARD_REJECT_("%s: episode %llu (first frame %llu, length %u, task %u) is out of range: the file is corrupt, "
                          "regenerate it", path, (unsigned long long)e, (unsigned long long)ep->first_frame, ep->length,
                          ep->task);
        }
        for (uint64_t f = ep->first_frame; f < ep->first_frame + ep->length; f++) {
            if (s->frame_episode[f] != e) {
                SHARD_REJECT_("%s: frame %llu belongs to episode %u but episode %llu claims it: the file is corrupt, "
                              "regenerate it", path, (unsigned long long)f, s->frame_episode[f], (unsigned long long)e);
            }
        }
    }
    for (uint64_t f = 0; f < h->n_frames; f++) {
        if (s->frame_episode[f] >= h->n_episodes) {
            SHARD_REJECT_("%s: frame %llu names episode %u of %llu: the file is corrupt, regenerate it",
                          path, (unsigned long long)f, s->frame_episode[f], (unsigned long long)h->n_episodes);
        }
    }
    if (s->task_offsets[0] != 0 || s->task_offsets[h->n_tasks] != h->task_bytes) {
        SHARD_REJECT_("%s: task string table does not span task_text: the file is corrupt, regenerate it", path);
    }
    for (uint64_t k = 0; k < h->n_tasks; k++) {
        if (s->task_offsets[k + 1] < s->task_offsets[k]) {
            SHARD_REJECT_("%s: task offsets are not increasing at task %llu: the file is corrupt, regenerate it",
                          path, (unsigned long long)k);
        }
    }
    if (h->version == 1) {  // byte tokens of the task text: the one copy a version-1 shard needs
        s->owned_tokens = (int32_t*)mallocCheck((h->task_bytes > 0 ? h->task_bytes : 1) * sizeof(int32_t));
        tokens_from_bytes(s->owned_tokens, s->task_text, h->task_bytes);
        s->token_offsets = s->task_offsets;
        s->tokens = s->owned_tokens;
    }
    // the token ids: a table that spans them, every id in the vocabulary, "bytes" ids the text's bytes
    if (s->token_offsets[0] != 0 || s->token_offsets[h->n_tasks] != h->n_tokens) {
        SHARD_REJECT_("%s: token offsets do not span the %llu tokens: the file is corrupt, regenerate it", path,
                      (unsigned long long)h->n_tokens);
    }
    int bytes = strcmp(h->tokenizer, SHARD_TOKENIZER_BYTES) == 0;
    for (uint64_t k = 0; k < h->n_tasks; k++) {
        uint64_t t0 = s->token_offsets[k], t1 = s->token_offsets[k + 1];
        if (t1 < t0) {
            SHARD_REJECT_("%s: token offsets are not increasing at task %llu: the file is corrupt, regenerate it",
                          path, (unsigned long long)k);
        }
        for (uint64_t t = t0; t < t1; t++) {
            if (s->tokens[t] < 0 || (uint32_t)s->tokens[t] >= h->vocab) {
                SHARD_REJECT_("%s: task %llu has token id %d, outside the vocabulary [0, %u) of tokenizer %s: the file is "
                              "corrupt, regenerate it", path, (unsigned long long)k, s->tokens[t], h->vocab, h->tokenizer);
            }
        }
        uint64_t b0 = s->task_offsets[k], n_text = s->task_offsets[k + 1] - b0;
        int same = n_text == t1 - t0;
        for (uint64_t t = 0; bytes && same && t < n_text; t++) { same = s->tokens[t0 + t] == (int32_t)s->task_text[b0 + t]; }
        if (bytes && !same) {
            SHARD_REJECT_("%s: the tokens of task %llu are not the bytes of its text, as tokenizer \"bytes\" says: the "
                          "file is corrupt, regenerate it", path, (unsigned long long)k);
        }
    }
    // the values the model reads: a NaN or Inf here would end training as a non-finite loss
    const float* values[2] = {s->state, s->action};
    const uint32_t dims[2] = {h->state_dim, h->action_dim};
    for (int which = 0; which < 2; which++) {
        for (uint64_t i = 0; i < h->n_frames * dims[which]; i++) {
            float x = values[which][i];
            if (!isfinite(x)) {
                SHARD_REJECT_("%s: frame %llu, %s column %llu is %s: the data is corrupt; fix or drop that episode and "
                              "convert again", path, (unsigned long long)(i / dims[which]), which == 0 ? "state" : "action",
                              (unsigned long long)(i % dims[which]), isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf");
            }
        }
    }
    // The statistics against the frames they describe: every writer stores the mean and population
    // std of the shard's own frames, so they agree up to float rounding. The bounds catch what
    // would change training (a mean 10 stds off shifts every normalized value by 10; a std 10 times
    // too large or too small scales them by 10) and leave room for any writer's rounding. A shard
    // that passes pools exactly (dataset_open), so a dataset of such shards has statistics that
    // describe its pooled frames. Non-finite or negative stored values are dataset_open's to name.
    const float* stored[2] = {s->stats, s->stats + 2 * h->state_dim};
    for (int which = 0; which < 2; which++) {
        uint32_t D = dims[which];
        for (uint32_t d = 0; d < D; d++) {
            double sum = 0.0, sq = 0.0;
            for (uint64_t f = 0; f < h->n_frames; f++) { sum += values[which][f * D + d]; }
            double mean = sum / (double)h->n_frames;
            for (uint64_t f = 0; f < h->n_frames; f++) {
                double dx = values[which][f * D + d] - mean;
                sq += dx * dx;
            }
            double sd = sqrt(sq / (double)h->n_frames), m = stored[which][d], msd = stored[which][D + d];
            if (!isfinite(m) || !isfinite(msd) || msd < 0.0) { continue; }
            double scale = sd > msd ? sd : msd;
            const char* column = which == 0 ? "state" : "action";
            if (fabs(m - mean) > 10.0 * scale + 1e-5 * fabs(mean) + 1e-6) {
                SHARD_REJECT_("%s: %s column %u: the stored mean %.6g is %.3g stds from the frames' mean %.6g (std %.6g): "
                              "the statistics do not describe the data; regenerate the shard", path, column, d, m,
                              fabs(m - mean) / (scale > 0.0 ? scale : 1.0), mean, sd);
            }
            int varying = sd >= VLA_MIN_STD && sd >= 1e-6 * fabs(mean);  // above the rounding of the values
            if (varying && (msd < 0.1 * sd || msd > 10.0 * sd)) {
                SHARD_REJECT_("%s: %s column %u: the stored std %.6g is %.3g times the frames' std %.6g: the statistics "
                              "do not describe the data; regenerate the shard", path, column, d, msd, msd / sd, sd);
            }
        }
    }
    return 0;
#undef SHARD_REJECT_
}

static inline void shard_open(Shard* s, const char* path) {
    char err[VLA_PATH_MAX + 512];
    if (shard_open_checked(s, path, err, sizeof(err)) != 0) { vla_fail("%s", err); }
}

// Writes a header (its version and counts set) and its sections (data: one array per section, in
// file order), each at its offset with zeros between.
static inline void shard_write_sections(const char* path, ShardHeader* h, const void* const data[SHARD_SECTIONS]) {
    shard_header_layout(h);
    uint64_t sizes[SHARD_SECTIONS], *offs[SHARD_SECTIONS];
    shard_section_sizes(h, path, sizes);
    shard_section_offsets(h, offs);
    AtomicFile out;
    atomic_file_open(&out, path, h->file_size);
    uint8_t zeros[SHARD_ALIGN] = {0};
    uint64_t pos = shard_header_bytes(h);
    atomic_file_write(&out, h, 1, pos);
    for (int i = 0; i < shard_n_sections(h); i++) {
        atomic_file_write(&out, zeros, 1, *offs[i] - pos);
        atomic_file_write(&out, data[i], 1, sizes[i]);
        pos = *offs[i] + sizes[i];
    }
    atomic_file_commit(&out);
}

// Writes a shard from in-memory arrays (tests, data/synthetic, the fuzz seeds): images (n_frames,
// frame bytes of cams), each frame its cameras one after another; instructions as byte tokens.
static inline void shard_write(const char* path, const Cameras* cams, uint32_t state_dim, uint32_t action_dim,
                               uint64_t n_frames, const uint8_t* images, const float* state, const float* action,
                               uint64_t n_episodes, const ShardEpisode* episodes, uint64_t n_tasks,
                               const char* const* tasks, const float* stats) {
    ShardHeader h;
    memset(&h, 0, sizeof(h));
    h.magic = SHARD_MAGIC;
    h.version = SHARD_VERSION;
    h.n_cam = (uint32_t)cams->n; h.img = cameras_square_side(cams); h.state_dim = state_dim; h.action_dim = action_dim;
    for (int k = 0; k < cams->n; k++) { h.cam_height[k] = cams->height[k]; h.cam_width[k] = cams->width[k]; }
    h.n_frames = n_frames; h.n_episodes = n_episodes; h.n_tasks = n_tasks;
    snprintf(h.tokenizer, sizeof(h.tokenizer), "%s", SHARD_TOKENIZER_BYTES);
    h.vocab = VLA_TEXT_VOCAB;
    uint64_t* task_offsets = (uint64_t*)mallocCheck((n_tasks + 1) * sizeof(uint64_t));
    task_offsets[0] = 0;
    for (uint64_t k = 0; k < n_tasks; k++) { task_offsets[k + 1] = task_offsets[k] + strlen(tasks[k]); }
    h.task_bytes = h.n_tokens = task_offsets[n_tasks];
    uint8_t* text = (uint8_t*)mallocCheck(h.task_bytes + 1);
    for (uint64_t k = 0; k < n_tasks; k++) { memcpy(text + task_offsets[k], tasks[k], strlen(tasks[k])); }
    int32_t* tokens = (int32_t*)mallocCheck((h.n_tokens + 1) * sizeof(int32_t));
    tokens_from_bytes(tokens, text, h.task_bytes);  // where another tokenizer would plug in
    uint32_t* frame_episode = (uint32_t*)mallocCheck(n_frames * sizeof(uint32_t));
    for (uint64_t e = 0; e < n_episodes; e++) {
        for (uint32_t f = 0; f < episodes[e].length; f++) { frame_episode[episodes[e].first_frame + f] = (uint32_t)e; }
    }
    const void* data[SHARD_SECTIONS] = {images, state, action, frame_episode, episodes, task_offsets, text, stats,
                                        task_offsets, tokens};
    shard_write_sections(path, &h, data);
    free(task_offsets); free(text); free(tokens); free(frame_episode);
}

// Writes an open shard again in version 1's layout: the format of data/metaworld_mt10.bin.xz and
// of older tools, for the tests and fuzz seeds of the reader's version-1 path. Needs every camera
// img x img and byte tokens, all version 1 can say.
static inline void shard_write_v1(const char* path, const Shard* s) {
    if (s->h.img == 0 || strcmp(s->h.tokenizer, SHARD_TOKENIZER_BYTES) != 0) {
        vla_fail("%s: version 1 holds only square cameras of one size and byte tokens", s->path);
    }
    ShardHeader h;
    memset(&h, 0, sizeof(h));
    memcpy(&h, &s->h, offsetof(ShardHeader, n_tokens));
    h.version = 1;
    const void* data[SHARD_SECTIONS] = {s->images, s->state, s->action, s->frame_episode, s->episodes,
                                        s->task_offsets, s->task_text, s->stats, NULL, NULL};
    shard_write_sections(path, &h, data);
}

// Mean/std over frames, as the writers store them (population std).
static inline void shard_compute_stats(uint64_t n_frames, const float* state, int S, const float* action, int A, float* stats) {
    const float* src[2] = {state, action};
    int dims[2] = {S, A};
    float* out = stats;
    for (int which = 0; which < 2; which++) {
        int D = dims[which];
        for (int d = 0; d < D; d++) {
            double sum = 0.0, sq = 0.0;
            for (uint64_t i = 0; i < n_frames; i++) {
                double x = src[which][i * D + d];
                sum += x;
                sq += x * x;
            }
            double mean = sum / (double)n_frames;
            double var = sq / (double)n_frames - mean * mean;
            out[d] = (float)mean;
            out[D + d] = (float)sqrt(var > 0.0 ? var : 0.0);
        }
        out += 2 * D;
    }
}

// ----------------------------------------------------------------------------
// dataset: one or more shards read as one, with pooled normalization statistics

typedef struct {
    int n_shards;
    Shard* shards;
    uint64_t* first_sample;  // (n_shards + 1) cumulative frame counts
    uint64_t n_samples;      // every frame starts a sample
    int n_cam, img, state_dim, action_dim;  // img: the side when every camera is img x img, else 0
    Cameras cams;            // every shard's cameras (they agree)
    char tokenizer[64];      // of every shard's token ids (they agree)
    uint32_t vocab;
    float* state_mean;   // (S)
    float* state_std;    // (S) zero std replaced by 1 so normalization never divides by 0
    float* action_mean;  // (A)
    float* action_std;   // (A)
} Dataset;

static inline int compare_strings(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

// Expands a comma-separated list of files and folders (every *.bin inside, sorted).
static inline int dataset_list_files(const char* spec, char*** out) {
    int n = 0, cap = 16;
    char** files = (char**)mallocCheck(cap * sizeof(char*));
    char* copy = strdup(spec);
    for (char* tok = strtok(copy, ","); tok != NULL; tok = strtok(NULL, ",")) {
        struct stat st;
        if (stat(tok, &st) != 0) { vla_fail("dataset path %s: %s: check -i", tok, strerror(errno)); }
        if (S_ISDIR(st.st_mode)) {
            DIR* dir = opendir(tok);
            if (dir == NULL) { vla_fail("cannot list %s: %s", tok, strerror(errno)); }
            int before = n;
            for (struct dirent* de = readdir(dir); de != NULL; de = readdir(dir)) {
                size_t len = strlen(de->d_name);
                if (len < 5 || strcmp(de->d_name + len - 4, ".bin") != 0) { continue; }
                if (n == cap) { cap *= 2; files = (char**)realloc(files, cap * sizeof(char*)); }
                files[n] = (char*)mallocCheck(strlen(tok) + len + 2);
                sprintf(files[n], "%s/%s", tok, de->d_name);
                n++;
            }
            closedir(dir);
            qsort(files + before, n - before, sizeof(char*), compare_strings);
            if (n == before) { vla_fail("folder %s holds no *.bin shards: generate data first (see README)", tok); }
        } else {
            if (n == cap) { cap *= 2; files = (char**)realloc(files, cap * sizeof(char*)); }
            files[n++] = strdup(tok);
        }
    }
    free(copy);
    if (n == 0) { vla_fail("no dataset shards given: pass -i FILE[,FILE|DIR...]"); }
    *out = files;
    return n;
}

static inline void dataset_close(Dataset* ds) {
    for (int i = 0; i < ds->n_shards; i++) { shard_close(&ds->shards[i]); }
    free(ds->shards); free(ds->first_sample);
    free(ds->state_mean); free(ds->state_std); free(ds->action_mean); free(ds->action_std);
    memset(ds, 0, sizeof(*ds));
}

// Opens the shards of spec as one dataset. Returns 0, or 1 with the reason in err and nothing
// left open.
static inline int dataset_open_checked(Dataset* ds, const char* spec, char* err, size_t err_size) {
    memset(ds, 0, sizeof(*ds));
    char** files;
    int n_files = dataset_list_files(spec, &files);
    ds->shards = (Shard*)callocCheck(n_files, sizeof(Shard));
    ds->first_sample = (uint64_t*)callocCheck(n_files + 1, sizeof(uint64_t));
    int failed = 0;
    for (int i = 0; i < n_files && !failed; i++) {
        Shard* s = &ds->shards[i];
        if (shard_open_checked(s, files[i], err, err_size) != 0) { failed = 1; continue; }
        ds->n_shards = i + 1;
        if (i == 0) {
            ds->n_cam = s->h.n_cam; ds->img = s->h.img; ds->state_dim = s->h.state_dim; ds->action_dim = s->h.action_dim;
            ds->cams = shard_cameras(&s->h);
            snprintf(ds->tokenizer, sizeof(ds->tokenizer), "%s", s->h.tokenizer);
            ds->vocab = s->h.vocab;
        } else if ((int)s->h.n_cam != ds->n_cam || (int)s->h.img != ds->img || (int)s->h.state_dim != ds->state_dim ||
                   (int)s->h.action_dim != ds->action_dim) {
            snprintf(err, err_size, "%s has cameras/img/state/action %u/%u/%u/%u but %s has %d/%d/%d/%d: shards of one "
                     "dataset must agree", files[i], s->h.n_cam, s->h.img, s->h.state_dim, s->h.action_dim, files[0],
                     ds->n_cam, ds->img, ds->state_dim, ds->action_dim);
            failed = 1;
        } else {
            Cameras cams = shard_cameras(&s->h);
            char mine[256], first[256];
            if (!cameras_equal(&cams, &ds->cams)) {
                snprintf(err, err_size, "%s has cameras of %s pixels but %s has %s (height x width): shards of one dataset "
                         "must agree", files[i], cameras_describe(&cams, mine, sizeof(mine)), files[0],
                         cameras_describe(&ds->cams, first, sizeof(first)));
                failed = 1;
            } else if (strcmp(s->h.tokenizer, ds->tokenizer) != 0 || s->h.vocab != ds->vocab) {
                snprintf(err, err_size, "%s has the token ids of tokenizer %s (vocabulary %u) but %s has %s (%u): shards of "
                         "one dataset must agree: convert them with one tokenizer", files[i], s->h.tokenizer, s->h.vocab,
                         files[0], ds->tokenizer, ds->vocab);
                failed = 1;
            }
        }
        ds->first_sample[i + 1] = ds->first_sample[i] + s->h.n_frames;
    }
    for (int i = 0; i < n_files; i++) { free(files[i]); }
    free(files);
    if (failed) { dataset_close(ds); return 1; }
    ds->n_samples = ds->first_sample[ds->n_shards];
    // pooled statistics: shard means and variances weighted by frame counts
    int S = ds->state_dim, A = ds->action_dim;
    float* means[2] = {ds->state_mean = (float*)callocCheck(S, 4), ds->action_mean = (float*)callocCheck(A, 4)};
    float* stds[2] = {ds->state_std = (float*)callocCheck(S, 4), ds->action_std = (float*)callocCheck(A, 4)};
    int dims[2] = {S, A};
    for (int which = 0; which < 2; which++) {
        for (int d = 0; d < dims[which]; d++) {
            double sum = 0.0, sq = 0.0;
            for (int i = 0; i < ds->n_shards; i++) {
                const float* st = ds->shards[i].stats + (which == 0 ? 0 : 2 * S);
                double n = (double)ds->shards[i].h.n_frames, m = st[d], sd = st[dims[which] + d];
                if (!isfinite(m) || !isfinite(sd) || sd < 0.0) {
                    snprintf(err, err_size, "%s: normalization statistics hold NaN, Inf or a negative std: regenerate the "
                             "shard", ds->shards[i].path);
                    dataset_close(ds);
                    return 1;
                }
                sum += n * m;
                sq += n * (sd * sd + m * m);
            }
            double mean = sum / (double)ds->n_samples, var = sq / (double)ds->n_samples - mean * mean;
            double sd = sqrt(var > 0.0 ? var : 0.0);
            means[which][d] = (float)mean;
            stds[which][d] = ds->n_shards == 1 ? ds->shards[0].stats[(which == 0 ? 0 : 2 * S) + dims[which] + d] : (float)sd;
            if (!(stds[which][d] >= VLA_MIN_STD)) { stds[which][d] = 1.0f; }
        }
    }
    return 0;
}

static inline void dataset_open(Dataset* ds, const char* spec) {
    char err[2 * VLA_PATH_MAX + 512];
    if (dataset_open_checked(ds, spec, err, sizeof(err)) != 0) { vla_fail("%s", err); }
}

// ----------------------------------------------------------------------------
// a batch: what the model reads, assembled from the shards (dev/model.py's build_batch): each
// camera's frames apart at their stored size (the model resizes them with padding), state and
// actions normalized and zero-padded to max_state_dim / max_action_dim, action_is_pad = 1 past
// the episode's end, and flow noise over all max_action_dim dims (LeRobot's noise is (B, H, 32)).

typedef struct {
    int B;
    Cameras cams;            // the dataset's: camera k is cams.height[k] x cams.width[k]
    uint8_t* images[VLA_MAX_CAM];  // per camera (B, h_k, w_k, 3) uint8 HWC
    int32_t* tokens;         // (B, max_text) token ids, the config's pad_token past the instruction
    float* token_mask;       // (B, max_text) 1 = instruction token, 0 = pad
    float* state;            // (B, Smax) normalized, zero-padded
    float* actions;          // (B, H, Amax) normalized (slots past the episode repeat its last action), zero-padded
    float* action_is_pad;    // (B, H) 1 = a slot past the episode's end (no loss)
    float* t;                // (B) flow time
    float* eps;              // (B, H, Amax) flow noise
    void* memory;            // one block holding all of the above, so a GPU trainer pins and copies it at once
    size_t bytes;
} SmolBatch;

// Why the model of config c cannot read dataset ds, or NULL when it can.
static inline const char* smolvla_data_problem(const SmolVLAConfig* c, const Dataset* ds) {
    static char msg[256];
    if (c->n_cam != ds->cams.n || c->state_dim != (int)ds->state_dim || c->action_dim != (int)ds->action_dim) {
        snprintf(msg, sizeof(msg), "the model's n_cam/state_dim/action_dim (%d, %d, %d) differ from the dataset's (%d, %d, %d): "
                 "use data with the same cameras and dims", c->n_cam, c->state_dim, c->action_dim, ds->cams.n,
                 ds->state_dim, ds->action_dim);
        return msg;
    }
    return NULL;
}

// Points the arrays of a batch of B samples whose frames hold `cams` into `base` (NULL: only
// measures), each at a 64-byte boundary. Returns the bytes it needs; the same layout serves host
// and device copies.
static inline size_t smolvla_batch_layout(SmolBatch* b, uint8_t* base, const SmolVLAConfig* c, const Cameras* cams, int B) {
    size_t off = 0, HA = (size_t)c->chunk * c->max_action_dim;
    if (cams->n != c->n_cam) { vla_fail("a batch of %d cameras for a model of %d", cams->n, c->n_cam); }
    memset(b, 0, sizeof(*b));
    b->cams = *cams;
#define SMOL_CARVE_(field, type, count) \
    field = base != NULL ? (type*)(base + off) : NULL; \
    off += align_up((size_t)(count) * sizeof(type), 64);
    for (int k = 0; k < cams->n; k++) {
        SMOL_CARVE_(b->images[k], uint8_t, (size_t)B * (camera_offset(cams, k + 1) - camera_offset(cams, k)))
    }
    SMOL_CARVE_(b->tokens, int32_t, (size_t)B * c->max_text)
    SMOL_CARVE_(b->token_mask, float, (size_t)B * c->max_text)
    SMOL_CARVE_(b->state, float, (size_t)B * c->max_state_dim)
    SMOL_CARVE_(b->actions, float, (size_t)B * HA)
    SMOL_CARVE_(b->action_is_pad, float, (size_t)B * c->chunk)
    SMOL_CARVE_(b->t, float, (size_t)B)
    SMOL_CARVE_(b->eps, float, (size_t)B * HA)
#undef SMOL_CARVE_
    b->B = B;
    b->memory = base;
    b->bytes = off;
    return off;
}

static inline void smolvla_batch_alloc(SmolBatch* b, const SmolVLAConfig* c, const Cameras* cams, int B) {
    size_t bytes = smolvla_batch_layout(b, NULL, c, cams, B);
    smolvla_batch_layout(b, (uint8_t*)callocCheck(bytes, 1), c, cams, B);
}

static inline void smolvla_batch_free(SmolBatch* b) { free(b->memory); }

// Camera k's image of sample i of the batch.
static inline uint8_t* smolvla_batch_image(const SmolBatch* b, int k, int i) {
    return b->images[k] + (size_t)i * (camera_offset(&b->cams, k + 1) - camera_offset(&b->cams, k));
}

// Row i's language input: the instruction's n ids cut to max_text, right-padded with the pad id,
// mask 1 on the ids: LeRobot's tokenizer call (truncation, padding_side "right", its pad id; the
// whole rule is written down in data/vla_shard.py). ids may be the row itself.
static inline void batch_set_text(SmolBatch* b, const SmolVLAConfig* c, int i, const int32_t* ids, size_t n) {
    int32_t* row = b->tokens + (size_t)i * c->max_text;
    float* mask = b->token_mask + (size_t)i * c->max_text;
    if (n > (size_t)c->max_text) { n = (size_t)c->max_text; }
    memmove(row, ids, n * sizeof(int32_t));
    for (int k = 0; k < c->max_text; k++) {
        if ((size_t)k >= n) { row[k] = c->pad_token; }
        mask[k] = (size_t)k < n ? 1.0f : 0.0f;
    }
}

// Sample `index` (a global frame number) into row i of the batch: images, tokens and their mask,
// normalized padded state, the action chunk (slots past the episode repeat its last action and
// are marked as pads). The flow noise is batch_fill's.
static inline void dataset_assemble(const Dataset* ds, const SmolVLAConfig* c, uint64_t index, SmolBatch* b, int i) {
    int shard = 0;
    while (index >= ds->first_sample[shard + 1]) { shard++; }
    const Shard* s = &ds->shards[shard];
    uint64_t f = index - ds->first_sample[shard];
    const ShardEpisode* ep = &s->episodes[s->frame_episode[f]];
    if (!cameras_equal(&b->cams, &ds->cams)) {
        vla_fail("a batch laid out for other cameras than the dataset's: allocate it with the dataset's cameras");
    }
    const char* problem = smolvla_data_problem(c, ds);
    if (problem != NULL) { vla_fail("%s", problem); }
    const uint8_t* frame = s->images + f * cameras_frame_bytes(&ds->cams);
    for (int k = 0; k < c->n_cam; k++) {
        size_t bytes = camera_offset(&ds->cams, k + 1) - camera_offset(&ds->cams, k);
        memcpy(smolvla_batch_image(b, k, i), frame + camera_offset(&ds->cams, k), bytes);
    }
    uint64_t t0 = s->token_offsets[ep->task], len = s->token_offsets[ep->task + 1] - t0;
    batch_set_text(b, c, i, s->tokens + t0, len < (uint64_t)c->max_text ? (size_t)len : (size_t)c->max_text);
    int S = c->state_dim, A = c->action_dim, Smax = c->max_state_dim, Amax = c->max_action_dim, H = c->chunk;
    for (int d = 0; d < Smax; d++) {
        b->state[(size_t)i * Smax + d] = d < S ? (s->state[f * S + d] - ds->state_mean[d]) / ds->state_std[d] : 0.0f;
    }
    uint64_t last = ep->first_frame + ep->length - 1;
    for (int h = 0; h < H; h++) {
        uint64_t g = f + h;
        int inside = g <= last;
        if (!inside) { g = last; }
        float* a = b->actions + ((size_t)i * H + h) * Amax;
        for (int d = 0; d < Amax; d++) { a[d] = d < A ? (s->action[g * A + d] - ds->action_mean[d]) / ds->action_std[d] : 0.0f; }
        b->action_is_pad[(size_t)i * H + h] = inside ? 0.0f : 1.0f;
    }
}

// 0 when every shard that samples idx (B of them) came from is the file opened, else 1 with the
// line of shard_unchanged in err. Called after a batch is assembled: a batch read while a shard
// changed is never trained on.
static inline int dataset_unchanged(const Dataset* ds, const uint64_t* idx, int B, char* err, size_t err_size) {
    uint8_t* checked = (uint8_t*)callocCheck((size_t)ds->n_shards, 1);
    int changed = 0;
    for (int i = 0; i < B && !changed; i++) {
        int shard = 0;
        while (idx[i] >= ds->first_sample[shard + 1]) { shard++; }
        if (!checked[shard]) { changed = shard_unchanged(&ds->shards[shard], err, err_size); }
        checked[shard] = 1;
    }
    free(checked);
    return changed;
}

// ----------------------------------------------------------------------------
// task-balanced sampling (--balance tasks): position p of the global sequence picks a task by a
// fixed schedule of period P, then that task's next sample. A task is an instruction text (the
// same text in several shards is one task), numbered in order of first appearance over the
// shards' task tables; its samples are its episodes' frames. With integer weights w_t (default 1
// for every task with samples, 0 for one without; divided by their gcd) and P = sum w_t, slot j = p % P of the schedule is the smooth
// weighted round robin's pick (equal weights: 0, 1, ..., T-1), and the draw is task t's
// k-th with k = (p / P) w_t + (earlier slots of t in the period). Draw k of task t is its
// permutation of pass k / n_t (from (seed, task, pass)) at k % n_t. So any position's sample
// follows from (seed, p) alone: resuming needs only the position, ranks taking disjoint slices
// of [sG, (s+1)G) stay disjoint, and a global batch G that is a multiple of P holds task t exactly
// G w_t / P times (equal weights, T not dividing G: floor or ceil of G / T times each, since
// every window of G positions holds each residue mod T that often). Weight-0 tasks are never drawn.

enum { BALANCE_NONE = 0, BALANCE_TASKS = 1 };
static const char* const BALANCE_NAMES[] = {"none", "tasks"};
#define BALANCE_COUNT 2
#define VLA_MAX_TASK_PERIOD (1u << 20)   // sum of the weights after dividing by their gcd
#define RNG_STREAM_TASK_PASS(t, e) ((5ULL << 56) + ((uint64_t)(t) << 32) + (uint64_t)(e))  // task t's pass e

typedef struct {
    int n_tasks;               // T
    uint32_t* weight;          // (T) divided by their gcd
    uint32_t period;           // P = sum of the weights
    uint32_t* slot_task;       // (P) the task of each slot of the period
    uint32_t* slot_draw;       // (P) slots of the same task earlier in the period
    uint64_t* task_first;      // (T + 1) offsets into samples
    uint32_t* samples;         // (n) each task's sample indices, ascending
    uint32_t* shard_task_base; // (n_shards + 1) into local_task
    uint32_t* local_task;      // a shard's task index (its table) -> the balance's task
    uint64_t fingerprint;      // of (T, weights): checkpoints record it; 0 never
} TaskBalance;

// "1,3" into at most max non-negative integer weights; fails with one line on anything else.
static inline int task_weights_parse(const char* s, uint32_t* out, int max) {
    int n = 0;
    uint64_t sum = 0;
    const char* p = s;
    while (1) {
        char* end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > 1000000 || (*end != ',' && *end != '\0') || (p[0] < '0' || p[0] > '9')) {
            vla_fail("--task-weights %s: weights are whole numbers from 0 to 1000000, one per task, comma-separated "
                     "(such as 1,3)", s);
        }
        if (n == max) { vla_fail("--task-weights %s: more than %d weights", s, max); }
        out[n++] = (uint32_t)v;
        sum += (uint64_t)v;
        if (*end == '\0') { break; }
        p = end + 1;
    }
    if (sum == 0) { vla_fail("--task-weights %s: the weights sum to 0: give at least one task a positive weight", s); }
    return n;
}

static inline uint64_t balance_gcd(uint64_t a, uint64_t b) { while (b != 0) { uint64_t t = a % b; a = b; b = t; } return a; }

// The tasks of dataset ds and the schedule of `weights` (NULL: equal). Fails with one line when
// the weights are not one per task or their period is too long, or a drawn task has no samples.
static inline void task_balance_build(TaskBalance* tb, const Dataset* ds, const char* weights) {
    memset(tb, 0, sizeof(*tb));
    if (ds->n_samples > UINT32_MAX) { vla_fail("dataset has %llu samples; the sampler supports up to 2^32", (unsigned long long)ds->n_samples); }
    // tasks by text, in order of first appearance
    uint64_t n_local = 0;
    for (int i = 0; i < ds->n_shards; i++) { n_local += ds->shards[i].h.n_tasks; }
    tb->shard_task_base = (uint32_t*)mallocCheck((size_t)(ds->n_shards + 1) * sizeof(uint32_t));
    tb->local_task = (uint32_t*)mallocCheck((size_t)(n_local > 0 ? n_local : 1) * sizeof(uint32_t));
    int* first_shard = (int*)mallocCheck((size_t)(n_local > 0 ? n_local : 1) * sizeof(int));
    uint64_t* first_local = (uint64_t*)mallocCheck((size_t)(n_local > 0 ? n_local : 1) * sizeof(uint64_t));
    uint32_t at = 0;
    int T = 0;
    for (int i = 0; i < ds->n_shards; i++) {
        const Shard* s = &ds->shards[i];
        tb->shard_task_base[i] = at;
        for (uint64_t k = 0; k < s->h.n_tasks; k++) {
            const uint8_t* text = s->task_text + s->task_offsets[k];
            uint64_t len = s->task_offsets[k + 1] - s->task_offsets[k];
            int found = -1;
            for (int t = 0; t < T && found < 0; t++) {
                const Shard* o = &ds->shards[first_shard[t]];
                uint64_t ol = o->task_offsets[first_local[t] + 1] - o->task_offsets[first_local[t]];
                if (ol == len && memcmp(o->task_text + o->task_offsets[first_local[t]], text, len) == 0) { found = t; }
            }
            if (found < 0) { found = T; first_shard[T] = i; first_local[T] = k; T++; }
            tb->local_task[at++] = (uint32_t)found;
        }
    }
    tb->shard_task_base[ds->n_shards] = at;
    free(first_shard); free(first_local);
    tb->n_tasks = T;
    // each task's samples
    tb->task_first = (uint64_t*)callocCheck((size_t)T + 1, sizeof(uint64_t));
    tb->samples = (uint32_t*)mallocCheck((size_t)(ds->n_samples > 0 ? ds->n_samples : 1) * sizeof(uint32_t));
    for (int pass = 0; pass < 2; pass++) {
        uint64_t* fill = pass == 0 ? NULL : (uint64_t*)mallocCheck((size_t)(T > 0 ? T : 1) * sizeof(uint64_t));
        if (pass == 1) {
            for (int t = 0; t < T; t++) { tb->task_first[t + 1] += tb->task_first[t]; fill[t] = tb->task_first[t]; }
        }
        for (int i = 0; i < ds->n_shards; i++) {
            const Shard* s = &ds->shards[i];
            for (uint64_t f = 0; f < s->h.n_frames; f++) {
                uint32_t t = tb->local_task[tb->shard_task_base[i] + s->episodes[s->frame_episode[f]].task];
                if (pass == 0) { tb->task_first[t + 1]++; }
                else { tb->samples[fill[t]++] = (uint32_t)(ds->first_sample[i] + f); }
            }
        }
        free(fill);
    }
    // weights, divided by their gcd
    tb->weight = (uint32_t*)mallocCheck((size_t)(T > 0 ? T : 1) * sizeof(uint32_t));
    if (weights == NULL) {  // equal over the tasks that have samples (a table may name a task no episode has)
        for (int t = 0; t < T; t++) { tb->weight[t] = tb->task_first[t + 1] > tb->task_first[t] ? 1 : 0; }
    } else {
        uint32_t* w = (uint32_t*)mallocCheck((size_t)(T + 1) * sizeof(uint32_t));
        int n = task_weights_parse(weights, w, T + 1);
        if (n != T) { vla_fail("--task-weights %s: %d weights for the dataset's %d tasks: give one per task, in the order "
                               "the config table lists the tasks", weights, n, T); }
        memcpy(tb->weight, w, (size_t)T * sizeof(uint32_t));
        free(w);
    }
    uint64_t g = 0, period = 0;
    const char* named = weights != NULL ? weights : "(none: equal)";  // what the errors below quote
    for (int t = 0; t < T; t++) { g = balance_gcd(g, tb->weight[t]); }
    for (int t = 0; t < T; t++) {
        tb->weight[t] = (uint32_t)(tb->weight[t] / g);
        period += tb->weight[t];
        if (tb->weight[t] > 0 && tb->task_first[t + 1] == tb->task_first[t]) {
            vla_fail("--task-weights %s: task %d has no samples (no episode of its instruction) but weight %u: give it "
                     "weight 0", named, t, tb->weight[t]);
        }
    }
    if (T == 0 || period == 0) { vla_fail("--balance tasks: the dataset has no task to draw from"); }
    if (period > VLA_MAX_TASK_PERIOD) {
        vla_fail("--task-weights %s: the weights (divided by their gcd) sum to %llu, above %u: use smaller weights", named,
                 (unsigned long long)period, VLA_MAX_TASK_PERIOD);
    }
    tb->period = (uint32_t)period;
    // smooth weighted round robin over one period: each slot goes to the task furthest behind its
    // share (ties to the lowest index); task t gets exactly w_t slots, spread out
    tb->slot_task = (uint32_t*)mallocCheck(period * sizeof(uint32_t));
    tb->slot_draw = (uint32_t*)mallocCheck(period * sizeof(uint32_t));
    int64_t* credit = (int64_t*)callocCheck((size_t)T, sizeof(int64_t));
    uint32_t* drawn = (uint32_t*)callocCheck((size_t)T, sizeof(uint32_t));
    for (uint32_t j = 0; j < period; j++) {
        int best = -1;
        for (int t = 0; t < T; t++) {
            if (tb->weight[t] == 0) { continue; }
            credit[t] += tb->weight[t];
            if (best < 0 || credit[t] > credit[best]) { best = t; }
        }
        credit[best] -= (int64_t)period;
        tb->slot_task[j] = (uint32_t)best;
        tb->slot_draw[j] = drawn[best]++;
    }
    free(credit); free(drawn);
    uint64_t h = 1469598103934665603ULL;  // FNV-1a over T and the weights
    for (int t = -1; t < T; t++) {
        uint32_t v = t < 0 ? (uint32_t)T : tb->weight[t];
        for (int k = 0; k < 4; k++) { h ^= (v >> (8 * k)) & 0xff; h *= 1099511628211ULL; }
    }
    tb->fingerprint = h != 0 ? h : 1;
}

static inline void task_balance_free(TaskBalance* tb) {
    free(tb->weight); free(tb->slot_task); free(tb->slot_draw); free(tb->task_first); free(tb->samples);
    free(tb->shard_task_base); free(tb->local_task);
}

// Config-table rows: each task's weight, sample count and instruction (cut to 40 bytes).
static inline void task_balance_print(const TaskBalance* tb, const Dataset* ds) {
    for (int t = 0; t < tb->n_tasks; t++) {
        const char* text = "";
        uint64_t len = 0;
        for (int i = 0; i < ds->n_shards && len == 0 && text[0] == '\0'; i++) {
            for (uint32_t k = tb->shard_task_base[i]; k < tb->shard_task_base[i + 1]; k++) {
                if (tb->local_task[k] != (uint32_t)t) { continue; }
                const Shard* s = &ds->shards[i];
                uint64_t local = k - tb->shard_task_base[i];
                text = (const char*)s->task_text + s->task_offsets[local];
                len = s->task_offsets[local + 1] - s->task_offsets[local];
                break;
            }
        }
        printf("| task %-4d w %-4u n %-7llu| %.*s\n", t, tb->weight[t],
               (unsigned long long)(tb->task_first[t + 1] - tb->task_first[t]), (int)(len < 40 ? len : 40), text);
    }
}

// The balance's task of global sample `index`.
static inline int task_balance_task_of(const TaskBalance* tb, const Dataset* ds, uint64_t index) {
    int shard = 0;
    while (index >= ds->first_sample[shard + 1]) { shard++; }
    const Shard* s = &ds->shards[shard];
    return (int)tb->local_task[tb->shard_task_base[shard] + s->episodes[s->frame_episode[index - ds->first_sample[shard]]].task];
}


// ----------------------------------------------------------------------------
// distributed sampler: position `pos` counts samples consumed by all ranks together.
// Sample at position pos is perm_e[pos % N] with e = pos / N, a fresh permutation per epoch
// from (seed, epoch); with --balance tasks, sampler_balanced_at's, from (seed, pos) too. Step s
// covers positions [s*G, (s+1)*G) of the global batch G = B*W; rank r takes
// [s*G + r*B, s*G + (r+1)*B): disjoint across ranks, an epoch fully covered, resumable from pos
// alone, and the same samples whatever the world size.

typedef struct {
    uint64_t n;          // samples per epoch
    uint64_t seed;
    uint64_t pos;        // global position of the next step's first sample
    int64_t epoch[2];    // epochs whose permutations are cached (epoch e in slot e % 2), -1 if none
    uint32_t* perm[2];   // (n) each: two slots so a prefetcher straddling an epoch end never thrashes
    const TaskBalance* balance;  // NULL: the plain sequence; else --balance tasks' (sampler_set_balance)
    int64_t* task_pass[2];       // (T) each with balance: the pass of each task cached in perm[k], -1 if none
} Sampler;

static inline void sampler_init(Sampler* s, uint64_t n, uint64_t seed) {
    if (n > UINT32_MAX) { vla_fail("dataset has %llu samples; the sampler supports up to 2^32", (unsigned long long)n); }
    s->n = n; s->seed = seed; s->pos = 0;
    s->balance = NULL; s->task_pass[0] = s->task_pass[1] = NULL;
    for (int k = 0; k < 2; k++) {
        s->epoch[k] = -1;
        s->perm[k] = (uint32_t*)mallocCheck(n * sizeof(uint32_t));
    }
}

static inline void sampler_free(Sampler* s) {
    free(s->perm[0]); free(s->perm[1]); free(s->task_pass[0]); free(s->task_pass[1]);
}

// Fisher-Yates from the epoch's stream; the modulo bias (< n / 2^64) is negligible.
static inline void sampler_permutation(uint32_t* perm, uint64_t n, uint64_t seed, uint64_t epoch) {
    for (uint64_t i = 0; i < n; i++) { perm[i] = (uint32_t)i; }
    Rng r;
    rng_init(&r, seed, RNG_STREAM_EPOCH(epoch));
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = rng_u64(&r) % (i + 1);
        uint32_t tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp;
    }
}

// Switches sampler s to the balanced sequence of tb (which must outlive it). Task t's passes are
// cached in the sampler's two permutation slots at offset task_first[t] (pass e in slot e % 2).
static inline void sampler_set_balance(Sampler* s, const TaskBalance* tb) {
    s->balance = tb;
    for (int k = 0; k < 2; k++) {
        free(s->task_pass[k]);
        s->task_pass[k] = (int64_t*)mallocCheck((size_t)tb->n_tasks * sizeof(int64_t));
        for (int t = 0; t < tb->n_tasks; t++) { s->task_pass[k][t] = -1; }
    }
}

static inline uint64_t sampler_balanced_at(Sampler* s, uint64_t pos) {
    const TaskBalance* tb = s->balance;
    uint32_t j = (uint32_t)(pos % tb->period);
    uint32_t t = tb->slot_task[j];
    uint64_t nt = tb->task_first[t + 1] - tb->task_first[t];
    uint64_t k = (pos / tb->period) * tb->weight[t] + tb->slot_draw[j];
    int64_t e = (int64_t)(k / nt);
    int slot = (int)(e % 2);
    uint32_t* perm = s->perm[slot] + tb->task_first[t];
    if (s->task_pass[slot][t] != e) {
        const uint32_t* own = tb->samples + tb->task_first[t];
        for (uint64_t i = 0; i < nt; i++) { perm[i] = own[i]; }
        Rng r;
        rng_init(&r, s->seed, RNG_STREAM_TASK_PASS(t, e));
        for (uint64_t i = nt - 1; i > 0; i--) {
            uint64_t q = rng_u64(&r) % (i + 1);
            uint32_t tmp = perm[i]; perm[i] = perm[q]; perm[q] = tmp;
        }
        s->task_pass[slot][t] = e;
    }
    return perm[k % nt];
}

static inline uint64_t sampler_at(Sampler* s, uint64_t pos) {
    if (s->balance != NULL) { return sampler_balanced_at(s, pos); }
    int64_t e = (int64_t)(pos / s->n);
    int slot = (int)(e % 2);
    if (s->epoch[slot] != e) { sampler_permutation(s->perm[slot], s->n, s->seed, (uint64_t)e); s->epoch[slot] = e; }
    return s->perm[slot][pos % s->n];
}

// The B sample indices of rank r (of W) for the step starting at s->pos. Does not advance.
static inline void sampler_rank_indices(Sampler* s, int B, int r, uint64_t* out) {
    for (int i = 0; i < B; i++) { out[i] = sampler_at(s, s->pos + (uint64_t)r * B + i); }
}

static inline void sampler_advance(Sampler* s, int B, int W) { s->pos += (uint64_t)B * W; }

// ----------------------------------------------------------------------------
// batches of ranks, augmentation, and the prefetching loader

#define RNG_STREAM_AUGMENT(s) ((4ULL << 56) + (uint64_t)(s))  // image shifts of optimizer step s

// Random shift (pad by replicating the border, crop back) of every camera image of a sample, by
// up to `shift` pixels in x and y: the augmentation DrQ and many VLA recipes use. Drawn from
// (seed, step, global sample), so it is the same whatever rank or thread assembles the sample.
// Sample i of the batch is global sample g of the step.
static inline void augment_shift(SmolBatch* b, int i, int shift, uint64_t seed, uint64_t step, uint64_t g) {
    const Cameras* cams = &b->cams;
    Rng r;
    rng_init(&r, seed, RNG_STREAM_AUGMENT(step));
    r.counter = g * 2 * (uint64_t)cams->n;
    int span = 2 * shift + 1;
    size_t largest = 0;
    for (int cam = 0; cam < cams->n; cam++) {
        size_t bytes = camera_offset(cams, cam + 1) - camera_offset(cams, cam);
        if (bytes > largest) { largest = bytes; }
    }
    uint8_t* tmp = (uint8_t*)mallocCheck(largest);
    for (int cam = 0; cam < cams->n; cam++) {
        int dx = (int)(rng_u64(&r) % (uint64_t)span) - shift, dy = (int)(rng_u64(&r) % (uint64_t)span) - shift;
        int h = (int)cams->height[cam], w = (int)cams->width[cam];
        uint8_t* im = smolvla_batch_image(b, cam, i);
        memcpy(tmp, im, (size_t)h * w * 3);
        for (int y = 0; y < h; y++) {
            int sy = y + dy < 0 ? 0 : (y + dy >= h ? h - 1 : y + dy);
            for (int x = 0; x < w; x++) {
                int sx = x + dx < 0 ? 0 : (x + dx >= w ? w - 1 : x + dx);
                memcpy(im + ((size_t)y * w + x) * 3, tmp + ((size_t)sy * w + sx) * 3, 3);
            }
        }
    }
    free(tmp);
}

// The batch of rank r (of W, B samples each) for optimizer step `step` of a run whose step
// `first_step` started at sampler position `first_pos`: samples, flow noise keyed by the
// sample's place in the global batch (so neither depends on W), optional shift augmentation.
// `sampler` is only read through sampler_at (callers serialize access to it).
static inline void batch_fill_indices(uint64_t* idx, Sampler* sampler, uint64_t first_pos, uint64_t first_step,
                                      uint64_t step, int B, int W, int r) {
    uint64_t pos = first_pos + (step - first_step) * (uint64_t)B * W + (uint64_t)r * B;
    for (int i = 0; i < B; i++) { idx[i] = sampler_at(sampler, pos + i); }
}

static inline void batch_fill(SmolBatch* batch, const Dataset* ds, const SmolVLAConfig* c, const uint64_t* idx,
                              uint64_t seed, uint64_t step, int r, int augment) {
    int B = batch->B, H = c->chunk, Amax = c->max_action_dim;
    for (int i = 0; i < B; i++) {
        uint64_t g = (uint64_t)r * B + i;
        dataset_assemble(ds, c, idx[i], batch, i);
        flow_noise_width(H, Amax, seed, step, g, &batch->t[i], batch->eps + (size_t)i * H * Amax);
        if (augment > 0) { augment_shift(batch, i, augment, seed, step, g); }
    }
}

// Worker threads assemble the batches of upcoming (step, rank) jobs into a ring of slots, so
// the trainer's step does not wait on assembly. The loader's job j is the global job
// g = j * stride + offset, which is step first_step + g / W, rank g % W (W batches per step: ranks
// times micro-steps); slot j % n_slots holds it. A GPU rank takes every `stride`-th job from its
// `offset`; one loader for all takes them all. Content depends only on (step, rank): bit-exact
// whatever the timing.
enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_READY = 2 };

typedef struct {
    const Dataset* ds;
    SmolVLAConfig config;
    Sampler sampler;       // guarded by mu
    uint64_t seed, first_pos, first_step;
    int B, W, augment;
    int stride, offset;    // the global jobs this loader takes
    int n_slots;
    SmolBatch* slots;
    int64_t* slot_job;     // job a slot holds
    uint64_t* slot_idx;    // (n_slots, B) the global sample indices of each slot's batch
    int* slot_state;
    int64_t next_job;      // the next job a worker takes
    int64_t consume_job;   // the job the trainer takes next
    int n_threads;
    pthread_t* threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int failed;            // a worker's batch came from a shard that changed: error says which
    char error[VLA_PATH_MAX + 256];
    double wait_seconds;   // time the trainer spent waiting for a batch
} Loader;

// The step and rank (into *rank) of the loader's job j
static inline uint64_t loader_job(const Loader* L, int64_t j, int* rank) {
    int64_t g = j * L->stride + L->offset;
    *rank = (int)(g % L->W);
    return L->first_step + (uint64_t)(g / L->W);
}

static inline void* loader_worker(void* arg) {
    Loader* L = (Loader*)arg;
    pthread_mutex_lock(&L->mu);
    while (!L->stop) {
        int64_t j = L->next_job;
        int slot = (int)(j % L->n_slots);
        if (L->slot_state[slot] != SLOT_FREE) {  // the ring is full: wait for the trainer
            pthread_cond_wait(&L->cv, &L->mu);
            continue;
        }
        L->next_job++;
        L->slot_job[slot] = j;
        L->slot_state[slot] = SLOT_FILLING;
        int r;
        uint64_t step = loader_job(L, j, &r);
        uint64_t* idx = L->slot_idx + (size_t)slot * L->B;
        batch_fill_indices(idx, &L->sampler, L->first_pos, L->first_step, step, L->B, L->W, r);
        pthread_mutex_unlock(&L->mu);
        batch_fill(&L->slots[slot], L->ds, &L->config, idx, L->seed, step, r, L->augment);
        char err[sizeof(L->error)];
        int changed = dataset_unchanged(L->ds, idx, L->B, err, sizeof(err));
        pthread_mutex_lock(&L->mu);
        if (changed && !L->failed) {  // the trainer stops at its next batch, in its own thread
            L->failed = 1;
            memcpy(L->error, err, sizeof(err));
        }
        L->slot_state[slot] = SLOT_READY;
        pthread_cond_broadcast(&L->cv);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

// Starts n_threads workers (0: none; loader_next then assembles in the caller's thread), taking
// the global jobs offset, offset + stride, ... (every job: stride 1, offset 0), from the
// balanced sequence of `balance` (--balance tasks; it must outlive the loader) or, if NULL, the plain one.
static inline void loader_start_balanced(Loader* L, const Dataset* ds, const SmolVLAConfig* c, uint64_t seed,
                                         uint64_t first_pos, uint64_t first_step, int B, int W, int augment,
                                         int n_threads, int n_slots, int stride, int offset, const TaskBalance* balance) {
    memset(L, 0, sizeof(*L));
    L->ds = ds; L->config = *c; L->seed = seed; L->first_pos = first_pos; L->first_step = first_step;
    L->B = B; L->W = W; L->augment = augment; L->n_threads = n_threads;
    L->stride = stride; L->offset = offset;
    L->n_slots = n_slots < 1 ? 1 : n_slots;
    sampler_init(&L->sampler, ds->n_samples, seed);
    if (balance != NULL) { sampler_set_balance(&L->sampler, balance); }
    L->slots = (SmolBatch*)callocCheck(L->n_slots, sizeof(SmolBatch));
    L->slot_job = (int64_t*)callocCheck(L->n_slots, sizeof(int64_t));
    L->slot_idx = (uint64_t*)callocCheck((size_t)L->n_slots * B, sizeof(uint64_t));
    L->slot_state = (int*)callocCheck(L->n_slots, sizeof(int));
    for (int k = 0; k < L->n_slots; k++) { smolvla_batch_alloc(&L->slots[k], c, &ds->cams, B); }
    shard_sigbus_install();
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->threads = (pthread_t*)callocCheck(n_threads > 0 ? n_threads : 1, sizeof(pthread_t));
    for (int t = 0; t < n_threads; t++) {
        if (pthread_create(&L->threads[t], NULL, loader_worker, L) != 0) {
            vla_fail("cannot start data loader thread %d: %s: use fewer --workers", t, strerror(errno));
        }
    }
}

static inline void loader_start_strided(Loader* L, const Dataset* ds, const SmolVLAConfig* c, uint64_t seed,
                                        uint64_t first_pos, uint64_t first_step, int B, int W, int augment,
                                        int n_threads, int n_slots, int stride, int offset) {
    loader_start_balanced(L, ds, c, seed, first_pos, first_step, B, W, augment, n_threads, n_slots, stride, offset, NULL);
}

static inline void loader_start(Loader* L, const Dataset* ds, const SmolVLAConfig* c, uint64_t seed, uint64_t first_pos,
                                uint64_t first_step, int B, int W, int augment, int n_threads, int n_slots) {
    loader_start_strided(L, ds, c, seed, first_pos, first_step, B, W, augment, n_threads, n_slots, 1, 0);
}

// The batch of the next job in order (steps ascending, ranks within a step). Valid until loader_release.
static inline SmolBatch* loader_next(Loader* L) {
    int64_t j = L->consume_job;
    int slot = (int)(j % L->n_slots);
    if (L->n_threads == 0) {  // synchronous: assemble here
        uint64_t* idx = L->slot_idx + (size_t)slot * L->B;
        int r;
        uint64_t step = loader_job(L, j, &r);
        batch_fill_indices(idx, &L->sampler, L->first_pos, L->first_step, step, L->B, L->W, r);
        batch_fill(&L->slots[slot], L->ds, &L->config, idx, L->seed, step, r, L->augment);
        if (dataset_unchanged(L->ds, idx, L->B, L->error, sizeof(L->error)) != 0) { vla_fail("%s", L->error); }
        return &L->slots[slot];
    }
    double t0 = wall_seconds();
    pthread_mutex_lock(&L->mu);
    while (!(L->slot_state[slot] == SLOT_READY && L->slot_job[slot] == j) && !L->failed) {
        pthread_cond_wait(&L->cv, &L->mu);
    }
    int failed = L->failed;
    pthread_mutex_unlock(&L->mu);
    if (failed) { vla_fail("%s", L->error); }
    L->wait_seconds += wall_seconds() - t0;
    return &L->slots[slot];
}

// The global sample indices (B) of the batch loader_next returned last. Valid until loader_release.
static inline const uint64_t* loader_indices(const Loader* L) {
    return L->slot_idx + (size_t)(L->consume_job % L->n_slots) * L->B;
}

// Hands the slot of the current job back to the workers.
static inline void loader_release(Loader* L) {
    int slot = (int)(L->consume_job % L->n_slots);
    pthread_mutex_lock(&L->mu);
    L->slot_state[slot] = SLOT_FREE;
    L->consume_job++;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
}

static inline void loader_stop(Loader* L) {
    pthread_mutex_lock(&L->mu);
    L->stop = 1;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    for (int t = 0; t < L->n_threads; t++) { pthread_join(L->threads[t], NULL); }
    for (int k = 0; k < L->n_slots; k++) { smolvla_batch_free(&L->slots[k]); }
    free(L->slots); free(L->slot_job); free(L->slot_idx); free(L->slot_state); free(L->threads);
    sampler_free(&L->sampler);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
}

// ----------------------------------------------------------------------------
// fp16 mixed precision's dynamic loss scaling (train_vla built with PRECISION=FP16; the defaults
// are torch's GradScaler's). Other builds and train_vla_cpu refuse the flags (train_args_no_loss_scale).
#define VLA_LOSS_SCALE_DEFAULT 65536.0f
#define VLA_LOSS_SCALE_WINDOW_DEFAULT 2000
#define VLA_LOSS_SCALE_MAX 16777216.0f  // 2^24: past it a doubling is not taken
#define VLA_LOSS_SCALE_WINDOW_MAX 1000000  // the device counts clean steps in a float: exact far past this

// What a checkpoint records of the dynamic loss scale: 0 for scale where nothing was recorded
// (train_vla_cpu, bf16 and fp32 builds, files written before fp16 existed).
typedef struct {
    float scale;      // the scale the next step starts with
    uint32_t clean;   // clean steps since it last changed
    uint64_t skipped; // steps skipped for Inf/NaN gradients, over the whole run
} LossScaleState;

// ----------------------------------------------------------------------------
// checkpoints, version 2 (SPEC section 4): header (512 bytes), the dataset's normalization
// statistics state_mean(S) state_std(S) action_mean(A) action_std(A), every fp32 master weight
// in table order (n_params, frozen ones included, so a checkpoint is the whole model), then AdamW's
// m and v for the elements that train in the header's train mode only (n_trainable each, packed
// as SmolOptDomain packs them: each tensor's trainable prefix, in table order). Independent of
// precision and world size. The RNG is counter-based, so (seed, step) is its state. Version 1
// held the model train_vla trained before SmolVLA; it is refused with that said.
// The checksum is the CRC-32 of the whole file with its own 4 bytes (crc) read as zero: computed
// as the file is written (the field is patched in last) and checked as it is read. Files written
// before it existed hold 0 in flags and load unverified, with a note; the run's batch, world size
// and dataset fingerprint are 0 there and in files no training run wrote (converters, tools).

#define CKPT_MAGIC 0x43414C56u  // "VLAC"
#define CKPT_VERSION 2u
#define CKPT_HEADER_BYTES 512

typedef struct {
    uint32_t magic, version;
    SmolVLAConfig config;  // 26 x int32
    int32_t train_mode;    // TRAIN_MODE_*: which elements have moments
    uint32_t pad0;
    uint64_t step;         // optimizer steps done
    uint64_t seed;
    uint64_t sampler_pos;  // global samples consumed
    uint64_t n_params;     // weights: every element of the table
    uint64_t n_trainable;  // elements of m and of v
    uint64_t file_size;
    char tokenizer[64];    // NUL-terminated: the token ids the model was trained on (the shards' tokenizer)
    uint32_t balance;      // BALANCE_*: the sampler's sequence (files before --balance hold 0 here: none)
    uint32_t pad1;
    uint64_t balance_id;   // with balance: TaskBalance's fingerprint of the tasks' count and weights; else 0
    float loss_scale;      // fp16 builds: the dynamic loss scale the next step starts with; 0: none recorded
    uint32_t loss_scale_clean;    // fp16 builds: clean steps since the scale last changed
    uint64_t loss_scale_skipped;  // fp16 builds: steps skipped for Inf/NaN gradients so far
    uint32_t flags;        // CKPT_FLAG_*: CKPT_FLAG_CRC where crc holds the file's checksum
    uint32_t crc;          // CRC-32 of the file with these 4 bytes as zero
    uint32_t batch;        // the run's -b (per-rank micro-batch); 0: not a training run's file
    uint32_t world;        // its ranks over all nodes
    uint64_t total_batch;  // samples per optimizer step (-b x world x micro-steps)
    uint64_t data_id;      // dataset_fingerprint of the data it trained on
    uint64_t reserved[27];
} CheckpointHeader;
VLA_STATIC_ASSERT(sizeof(CheckpointHeader) == CKPT_HEADER_BYTES, "checkpoint header is 512 bytes");
VLA_STATIC_ASSERT(offsetof(CheckpointHeader, step) == 120 && offsetof(CheckpointHeader, tokenizer) == 168,
                  "checkpoint header fields are where SPEC says");
VLA_STATIC_ASSERT(offsetof(CheckpointHeader, loss_scale) == 248 && offsetof(CheckpointHeader, loss_scale_skipped) == 256,
                  "the loss scale's fields are where the README says");
VLA_STATIC_ASSERT(offsetof(CheckpointHeader, flags) == 264 && offsetof(CheckpointHeader, crc) == 268 &&
                  offsetof(CheckpointHeader, total_batch) == 280 && offsetof(CheckpointHeader, data_id) == 288,
                  "the checksum's and the run's fields are where the README says");
#define CKPT_FLAG_CRC 1u

// What a checkpoint records of the run that wrote it (all 0 where it records nothing).
typedef struct {
    uint32_t batch, world;  // -b, ranks over all nodes
    uint64_t total_batch;   // samples per optimizer step
    uint64_t data_id;       // dataset_fingerprint
} CheckpointRun;

typedef struct {
    SmolVLAConfig config;
    int train_mode;
    char tokenizer[64];
    int balance;           // BALANCE_*
    uint64_t balance_id;   // TaskBalance's fingerprint, 0 without balance
    LossScaleState loss_scale;  // fp16 builds' dynamic loss scale; scale 0: none recorded
    CheckpointRun run;     // the batch, world size and data of the run that wrote it
    int has_crc;           // read: the file carried a checksum, and it matched
    uint64_t step, seed, sampler_pos;
    uint64_t n_params, n_trainable;
    float* stats;   // state_mean(S) state_std(S) action_mean(A) action_std(A), S and A the dataset's
    float* params;  // (n_params)
    float* m;       // (n_trainable)
    float* v;       // (n_trainable)
} Checkpoint;

static inline uint64_t ckpt_file_size(const SmolVLAConfig* c, uint64_t n_params, uint64_t n_trainable) {
    return CKPT_HEADER_BYTES + 8ULL * (uint64_t)(c->state_dim + c->action_dim) + 4ULL * n_params + 8ULL * n_trainable;
}

// The element counts a config and mode imply: (all weights, those with moments).
static inline void ckpt_counts(const SmolVLAConfig* c, int mode, uint64_t* n_params, uint64_t* n_trainable) {
    SmolParamTable t;
    smolvla_table_build(c, &t);
    *n_params = t.total;
    *n_trainable = smolvla_trainable_count(&t, mode);
}

// Atomic: written to a temporary file, flushed to disk, then renamed over the final name. The
// counts are the checkpoint's n_params and n_trainable, which must be those its config implies.
static inline void checkpoint_write(const char* path, const Checkpoint* ck) {
    CheckpointHeader h;
    memset(&h, 0, sizeof(h));
    uint64_t n_params, n_trainable;
    ckpt_counts(&ck->config, ck->train_mode, &n_params, &n_trainable);
    if (n_params != ck->n_params || n_trainable != ck->n_trainable) {
        vla_fail("checkpoint %s: %llu weights and %llu moments for a model of %llu and %llu (a trainer's bug)", path,
                 (unsigned long long)ck->n_params, (unsigned long long)ck->n_trainable, (unsigned long long)n_params,
                 (unsigned long long)n_trainable);
    }
    h.magic = CKPT_MAGIC; h.version = CKPT_VERSION; h.config = ck->config; h.train_mode = ck->train_mode;
    h.step = ck->step; h.seed = ck->seed; h.sampler_pos = ck->sampler_pos;
    h.balance = (uint32_t)ck->balance; h.balance_id = ck->balance_id;
    h.loss_scale = ck->loss_scale.scale; h.loss_scale_clean = ck->loss_scale.clean;
    h.loss_scale_skipped = ck->loss_scale.skipped;
    h.flags = CKPT_FLAG_CRC;
    h.batch = ck->run.batch; h.world = ck->run.world; h.total_batch = ck->run.total_batch; h.data_id = ck->run.data_id;
    h.n_params = n_params; h.n_trainable = n_trainable;
    h.file_size = ckpt_file_size(&ck->config, n_params, n_trainable);
    snprintf(h.tokenizer, sizeof(h.tokenizer), "%s", ck->tokenizer);
    AtomicFile out;
    atomic_file_open(&out, path, h.file_size);
    atomic_file_write(&out, &h, sizeof(h), 1);
    atomic_file_write(&out, ck->stats, sizeof(float), 2 * (size_t)(ck->config.state_dim + ck->config.action_dim));
    atomic_file_write(&out, ck->params, sizeof(float), n_params);
    atomic_file_write(&out, ck->m, sizeof(float), n_trainable);
    atomic_file_write(&out, ck->v, sizeof(float), n_trainable);
    atomic_file_patch(&out, offsetof(CheckpointHeader, crc), &out.crc, sizeof(out.crc));  // (crc was 0 in the sum)
    atomic_file_commit(&out);
}

static inline void checkpoint_free(Checkpoint* ck) { free(ck->stats); free(ck->params); free(ck->m); free(ck->v); }

// Reads the header and checks it against the file: the config by smolvla_config_problem, the
// train mode, the counts and sizes in checked arithmetic, the step and sampler position in range.
// Returns 0 on success; on failure writes a message into err (so callers can skip an incomplete
// file or fail with it).
static inline int checkpoint_read_header(const char* path, CheckpointHeader* h, char* err, size_t err_size) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {  // (checked before opening: a pipe would block)
        snprintf(err, err_size, "%s is %s, not a checkpoint file: pass a ckpt_*.bin file", path,
                 S_ISDIR(st.st_mode) ? "a folder" : "a device, pipe or socket");
        return 1;
    }
    FILE* f = fopen(path, "rb");
    if (f == NULL) { snprintf(err, err_size, "cannot open checkpoint %s: %s", path, strerror(errno)); return 1; }
    if (fstat(fileno(f), &st) != 0) {
        snprintf(err, err_size, "cannot stat checkpoint %s: %s", path, strerror(errno));
        fclose(f);
        return 1;
    }
    memset(h, 0, sizeof(*h));
    size_t got = fread(h, 1, sizeof(*h), f);
    fclose(f);
    if (got >= 8 && h->magic == CKPT_MAGIC && h->version == 1) {
        snprintf(err, err_size, "checkpoint %s has version 1: it holds the model train_vla trained before SmolVLA, which "
                 "this build no longer reads: start a new run", path);
        return 1;
    }
    if (got != sizeof(*h)) {
        snprintf(err, err_size, "checkpoint %s is %lld bytes, shorter than its header: it is truncated", path, (long long)st.st_size);
        return 1;
    }
    if (h->magic != CKPT_MAGIC) { snprintf(err, err_size, "%s is not a train_vla checkpoint (bad magic 0x%08x)", path, h->magic); return 1; }
    if (h->version != CKPT_VERSION) {
        snprintf(err, err_size, "checkpoint %s has version %u, this build reads %u", path, h->version, CKPT_VERSION);
        return 1;
    }
    const char* problem = smolvla_config_problem(&h->config);
    if (problem != NULL) { snprintf(err, err_size, "checkpoint %s holds a bad config (%s): it is corrupt", path, problem); return 1; }
    if (h->train_mode < 0 || h->train_mode >= TRAIN_MODE_COUNT) {
        snprintf(err, err_size, "checkpoint %s holds train mode %d, not one of 0 (expert), 1 (vlm), 2 (all): it is corrupt",
                 path, h->train_mode);
        return 1;
    }
    if (memchr(h->tokenizer, '\0', sizeof(h->tokenizer)) == NULL || h->tokenizer[0] == '\0') {
        snprintf(err, err_size, "checkpoint %s names no tokenizer (or an unterminated one): it is corrupt", path);
        return 1;
    }
    if (h->balance >= BALANCE_COUNT || (h->balance == BALANCE_NONE) != (h->balance_id == 0)) {
        snprintf(err, err_size, "checkpoint %s holds balance mode %u with weights fingerprint %llu, not a pair a trainer "
                 "writes: it is corrupt", path, h->balance, (unsigned long long)h->balance_id);
        return 1;
    }
    // the loss scale as train_vla writes it: 0 (none), or a scale in [1, VLA_LOSS_SCALE_MAX] with
    // fewer clean steps than the largest window and no more skipped steps than steps
    if (h->loss_scale == 0.0f ? (h->loss_scale_clean != 0 || h->loss_scale_skipped != 0)
                              : !(h->loss_scale >= 1.0f && h->loss_scale <= VLA_LOSS_SCALE_MAX) ||
                                    h->loss_scale_clean >= VLA_LOSS_SCALE_WINDOW_MAX || h->loss_scale_skipped > h->step) {
        snprintf(err, err_size, "checkpoint %s holds loss scale %g (%u clean, %llu skipped steps at step %llu), not a "
                 "state train_vla writes: it is corrupt", path, (double)h->loss_scale, h->loss_scale_clean,
                 (unsigned long long)h->loss_scale_skipped, (unsigned long long)h->step);
        return 1;
    }
    if ((h->flags & ~CKPT_FLAG_CRC) != 0 || (h->flags == 0 && h->crc != 0)) {
        snprintf(err, err_size, "checkpoint %s holds flags 0x%x and checksum 0x%08x, not what a trainer writes: it is "
                 "corrupt", path, h->flags, h->crc);
        return 1;
    }
    // the run's record: all 0, or a batch, world and total batch that is a whole number of micro-steps
    int no_run = h->batch == 0 && h->world == 0 && h->total_batch == 0 && h->data_id == 0;
    if (!no_run && (h->batch == 0 || h->world == 0 || h->total_batch == 0 ||
                    h->total_batch % ((uint64_t)h->batch * h->world) != 0)) {
        snprintf(err, err_size, "checkpoint %s records -b %u on %u rank(s) and %llu samples per step, not a run a trainer "
                 "writes: it is corrupt", path, h->batch, h->world, (unsigned long long)h->total_batch);
        return 1;
    }
    uint64_t n_params, n_trainable;  // bounded: smolvla_config_problem checked the count
    ckpt_counts(&h->config, h->train_mode, &n_params, &n_trainable);
    uint64_t size = ckpt_file_size(&h->config, n_params, n_trainable);
    if (h->n_params != n_params || h->n_trainable != n_trainable || h->file_size != size || (uint64_t)st.st_size != size) {
        snprintf(err, err_size, "checkpoint %s is %lld bytes, its header implies %llu: it is truncated or corrupt",
                 path, (long long)st.st_size, (unsigned long long)size);
        return 1;
    }
    // every optimizer step consumes at least one sample, and fewer than 2^33
    if (h->step > VLA_MAX_STEPS || h->sampler_pos < h->step || h->sampler_pos > (h->step << 33)) {
        snprintf(err, err_size, "checkpoint %s says step %llu after %llu samples, out of range (steps 0 to %d, at least "
                 "one sample each): it is corrupt", path, (unsigned long long)h->step,
                 (unsigned long long)h->sampler_pos, VLA_MAX_STEPS);
        return 1;
    }
    return 0;
}

// Loads a whole checkpoint, allocating its arrays. Returns 0, or 1 with the reason in err and
// nothing allocated.
static inline int checkpoint_read_checked(const char* path, Checkpoint* ck, char* err, size_t err_size) {
    memset(ck, 0, sizeof(*ck));
    CheckpointHeader h;
    if (checkpoint_read_header(path, &h, err, err_size) != 0) { return 1; }
    ck->config = h.config; ck->train_mode = h.train_mode; ck->step = h.step; ck->seed = h.seed;
    ck->sampler_pos = h.sampler_pos; ck->n_params = h.n_params; ck->n_trainable = h.n_trainable;
    ck->balance = (int)h.balance; ck->balance_id = h.balance_id;
    ck->loss_scale.scale = h.loss_scale; ck->loss_scale.clean = h.loss_scale_clean;
    ck->loss_scale.skipped = h.loss_scale_skipped;
    ck->run.batch = h.batch; ck->run.world = h.world; ck->run.total_batch = h.total_batch; ck->run.data_id = h.data_id;
    ck->has_crc = (h.flags & CKPT_FLAG_CRC) != 0;
    memcpy(ck->tokenizer, h.tokenizer, sizeof(ck->tokenizer));
    int S = h.config.state_dim, A = h.config.action_dim;
    size_t n_stats = 2 * (size_t)(S + A), nt = (size_t)h.n_trainable;
    ck->stats = (float*)mallocCheck(n_stats * sizeof(float));
    ck->params = (float*)mallocCheck(h.n_params * sizeof(float));
    ck->m = (float*)mallocCheck((nt > 0 ? nt : 1) * sizeof(float));
    ck->v = (float*)mallocCheck((nt > 0 ? nt : 1) * sizeof(float));
    FILE* f = fopen(path, "rb");
    int bad = f == NULL || fseeko(f, (off_t)sizeof(h), SEEK_SET) != 0 || fread(ck->stats, sizeof(float), n_stats, f) != n_stats ||
              fread(ck->params, 4, h.n_params, f) != h.n_params || fread(ck->m, 4, nt, f) != nt ||
              fread(ck->v, 4, nt, f) != nt;
    if (f != NULL) { fclose(f); }
    if (bad) { snprintf(err, err_size, "checkpoint %s: short read: the file changed while loading or is truncated", path); }
    // the statistics as trainers write them: finite means, stds of at least VLA_MIN_STD
    for (int i = 0; i < 2 * (S + A) && !bad; i++) {
        int is_std = i < 2 * S ? i >= S : i >= 2 * S + A;
        if (!isfinite(ck->stats[i]) || (is_std && !(ck->stats[i] >= VLA_MIN_STD))) {
            snprintf(err, err_size, "checkpoint %s: normalization statistic %d is %g (NaN, Inf or a std below %g): it is "
                     "corrupt", path, i, (double)ck->stats[i], (double)VLA_MIN_STD);
            bad = 1;
        }
    }
    if (!bad && ck->has_crc) {  // the CRC of what was read, the header's crc as 0 (checkpoint_write's sum)
        CheckpointHeader zeroed = h;
        zeroed.crc = 0;
        uint32_t crc = crc32_update(0, &zeroed, sizeof(zeroed));
        crc = crc32_update(crc, ck->stats, n_stats * sizeof(float));
        crc = crc32_update(crc, ck->params, h.n_params * sizeof(float));
        crc = crc32_update(crc, ck->m, nt * sizeof(float));
        crc = crc32_update(crc, ck->v, nt * sizeof(float));
        if (crc != h.crc) {
            snprintf(err, err_size, "checkpoint %s: checksum mismatch: the file is corrupt (CRC-32 0x%08x, its header says "
                     "0x%08x)", path, crc, h.crc);
            bad = 1;
        }
    }
    // finite weights (a run that diverged writes none: it stops at a non-finite loss); the first
    // bad one is named by its tensor. One pass over memory, cheap beside reading the file.
    if (!bad) {
        SmolParamTable t;
        smolvla_table_build(&h.config, &t);
        for (int i = 0; i < SMOLVLA_NUM_TENSORS && !bad; i++) {
            const float* w = ck->params + t.spec[i].offset;
            for (size_t k = 0; k < t.spec[i].numel; k++) {
                if (!isfinite(w[k])) {
                    snprintf(err, err_size, "checkpoint %s: weight %zu of %s (%zu elements) is %g: its weights are not "
                             "finite, the run that wrote it diverged", path, k, t.spec[i].name, t.spec[i].numel, (double)w[k]);
                    bad = 1;
                    break;
                }
            }
        }
    }
    if (bad) {
        checkpoint_free(ck);
        memset(ck, 0, sizeof(*ck));
        return 1;
    }
    return 0;
}

// The note that a checkpoint without a checksum (written before checkpoints carried one) was
// loaded unverified.
static inline void checkpoint_note_unverified(const char* path, const Checkpoint* ck) {
    if (!ck->has_crc) {
        fprintf(stderr, "note: checkpoint %s carries no checksum (an older train_vla's): it loaded unverified\n", path);
    }
}

// Loads a whole checkpoint; fails with one line on any problem.
static inline void checkpoint_read(const char* path, Checkpoint* ck) {
    char err[VLA_PATH_MAX + 512];
    if (checkpoint_read_checked(path, ck, err, sizeof(err)) != 0) {
        struct stat st;
        int regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        vla_fail("%s%s", err, regular ? ": delete it or pick another with --init" : "");
    }
    checkpoint_note_unverified(path, ck);
}

// Whether the file's checksum matches (a streaming read, no allocation of the model: -y 1 checks
// the newest checkpoints this way before choosing one). Returns 0 when it does or the file
// carries none (its header already checked by checkpoint_read_header), else 1 with the reason.
static inline int checkpoint_verify(const char* path, char* err, size_t err_size) {
    CheckpointHeader h;
    if (checkpoint_read_header(path, &h, err, err_size) != 0) { return 1; }
    if ((h.flags & CKPT_FLAG_CRC) == 0) { return 0; }
    FILE* f = fopen(path, "rb");
    if (f == NULL) { snprintf(err, err_size, "cannot open checkpoint %s: %s", path, strerror(errno)); return 1; }
    size_t chunk = (size_t)8 << 20;
    uint8_t* buf = (uint8_t*)mallocCheck(chunk);
    uint64_t left = h.file_size;
    uint32_t crc = 0;
    int first = 1, bad = 0;
    while (left > 0 && !bad) {
        size_t want = left < chunk ? (size_t)left : chunk;
        if (fread(buf, 1, want, f) != want) { bad = 1; break; }
        if (first) { memset(buf + offsetof(CheckpointHeader, crc), 0, sizeof(h.crc)); first = 0; }
        crc = crc32_update(crc, buf, want);
        left -= want;
    }
    fclose(f);
    free(buf);
    if (bad) {
        snprintf(err, err_size, "checkpoint %s: short read: the file changed while loading or is truncated", path);
        return 1;
    }
    if (crc != h.crc) {
        snprintf(err, err_size, "checkpoint %s: checksum mismatch: the file is corrupt (CRC-32 0x%08x, its header says "
                 "0x%08x)", path, crc, h.crc);
        return 1;
    }
    return 0;
}

// The output folder's name has room for these (train_args_parse checks -o against it).
#define VLA_CKPT_NAME_MAX 48  // "/ckpt_0123456789.bin.<pid>.tmp" and "/log.jsonl.<pid>.tmp"

static inline void checkpoint_path(char* out, size_t size, const char* dir, uint64_t step) {
    if (snprintf(out, size, "%s/ckpt_%08llu.bin", dir, (unsigned long long)step) >= (int)size) {
        vla_fail("checkpoint path in %.80s... is longer than %zu bytes: use a shorter output folder (-o)", dir, size - 1);
    }
}

// The step of a checkpoint's file name, for exactly the names checkpoint_path writes: "ckpt_",
// the step in at least 8 digits (zero-padded to 8, no leading zero past them), ".bin". Returns 1
// and sets *step for such a name, else 0: a copy named ckpt_9.bin or ckpt_+0000009.bin is not a
// checkpoint of this run folder (-y 1 would open ckpt_00000009.bin), nor is ckpt_-1.bin.
static inline int checkpoint_step_of_name(const char* name, uint64_t* step) {
    if (strncmp(name, "ckpt_", 5) != 0) { return 0; }
    const char* p = name + 5;
    uint64_t x = 0;
    size_t digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) { return 0; }  // past 2^64 - 1
        x = x * 10 + d;
    }
    if (digits < 8 || (digits > 8 && name[5] == '0') || strcmp(p, ".bin") != 0) { return 0; }
    *step = x;
    return 1;
}

// Steps of the (at most max) newest complete checkpoints in dir, newest first. Incomplete files
// are reported and skipped.
static inline int checkpoint_list(const char* dir, uint64_t* steps, int max) {
    DIR* d = opendir(dir);
    if (d == NULL) { return 0; }
    int n = 0;
    for (struct dirent* de = readdir(d); de != NULL; de = readdir(d)) {
        uint64_t step;
        if (!checkpoint_step_of_name(de->d_name, &step)) { continue; }
        char path[VLA_PATH_MAX + 300], err[VLA_PATH_MAX + 1024];
        CheckpointHeader h;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (checkpoint_read_header(path, &h, err, sizeof(err)) != 0) {
            fprintf(stderr, "warning: skipping %s\n", err);
            continue;
        }
        // keep the `max` newest, newest first: insert into the sorted list, dropping the oldest
        int at = n < max ? n++ : max;
        if (at == max && (max == 0 || step <= steps[max - 1])) { continue; }
        if (at == max) { at = max - 1; }
        for (; at > 0 && steps[at - 1] < step; at--) { steps[at] = steps[at - 1]; }
        steps[at] = step;
    }
    closedir(d);
    return n;
}

// Deletes all but the newest `keep` complete checkpoints (a killed save's temporary file goes when
// the next run takes the folder: run_folder_remove_stale).
static inline void checkpoint_prune(const char* dir, int keep) {
    uint64_t steps[4096];
    int n = checkpoint_list(dir, steps, 4096);
    for (int i = keep; i < n; i++) {
        char path[VLA_PATH_MAX];
        checkpoint_path(path, sizeof(path), dir, steps[i]);
        unlink(path);
    }
}

// ----------------------------------------------------------------------------
// command line

typedef struct {
    const char* input;      // shards: files and folders, comma-separated
    const char* output;     // output folder: checkpoints and the log
    const char* preset;     // -p: the model's sizes (a run from a checkpoint without -p takes the checkpoint's)
    int preset_given;       // -p was given
    int train_mode;         // --train: TRAIN_MODE_*, what trains (unless given: the checkpoint's, else the preset's default)
    int train_given;        // --train was given
    int recompute;          // --recompute: RECOMPUTE_*, what the GPU trainer's backward runs again (none on the CPU)
    int memory;             // --memory: print the activation memory table and exit (the GPU trainer)
    int profile;            // --profile STEP: time that step's GPU work by phase and operation (the GPU trainer), 0: off
    int max_text;           // --max-text: instruction tokens the model reads, 0: the checkpoint's or the preset's
    const char* init;       // checkpoint to start from (weights, optimizer, step; weights alone with weights_only)
    int weights_only;       // --weights-only: from --init's weights alone (fine-tuning: step 0, fresh optimizer)
    int batch;              // per-rank micro-batch
    int ranks;              // GPUs (CUDA) or simulated ranks (CPU)
    int total_batch;        // -d: samples per optimizer step over all ranks and micro-steps, 0: batch x ranks
    int lr_scale;           // LR_SCALE_*: how the peak learning rate grows with the world size
    int accum;              // micro-steps per optimizer step, from -d (train_args_for_world)
    int zero;               // -z 1: ZeRO-1, the optimizer state sharded over the ranks
    int nodes, node_rank;   // machines of the run and this one's place (Slurm's environment by default)
    const char* master;     // host:port of node 0, where the other nodes fetch NCCL's unique id
    float bootstrap_timeout;  // seconds the nodes wait for each other at the start
    float nccl_timeout;       // seconds one step may take (collectives included) before the run is aborted as hung
    float lr_base;          // -l as given; lr is it scaled by --lr-scale (train_args_for_world)
    int steps;              // optimizer steps in total
    float lr, min_lr_frac, weight_decay, grad_clip;
    int warmup;
    uint64_t seed;
    int resume;             // -y 1: continue from the newest complete checkpoint in output
    int new_run;            // --new-run: move the run the output folder holds into previous_<N>/ and start anew
    int ckpt_every, keep;
    int no_checkpoint;      // --no-checkpoint: write none (benchmarks); the run's weights are not kept
    int log_every;
    int threads;            // OpenMP threads, 0: the runtime's default
    int workers;            // data loader threads, 0: assemble in the training thread
    int augment;            // random image shift in pixels, 0: off
    int balance;            // --balance: BALANCE_*, the sampler's sequence
    const char* task_weights;  // --task-weights: one whole number per task, NULL: equal
    uint64_t balance_id;    // the trainer's TaskBalance fingerprint once built (checkpoints record it), 0: none
    float loss_scale;       // --loss-scale: fp16 builds' initial dynamic loss scale
    int loss_scale_window;  // --loss-scale-window: clean steps before the scale doubles
} TrainArgs;

enum { LR_SCALE_NONE = 0, LR_SCALE_LINEAR = 1, LR_SCALE_SQRT = 2 };
static const char* const LR_SCALE_NAMES[] = {"none", "linear", "sqrt"};
#define LR_SCALE_COUNT ((int)(sizeof(LR_SCALE_NAMES) / sizeof(LR_SCALE_NAMES[0])))

static inline void train_args_defaults(TrainArgs* a) {
    memset(a, 0, sizeof(*a));
    a->input = "data/default";
    a->output = "out";
    a->preset = "small";
    a->train_mode = TRAIN_MODE_ALL;  // the default preset's
    a->max_text = 0;
    a->init = NULL;
    a->batch = 8; a->ranks = 1; a->steps = 1000;
    a->total_batch = 0; a->lr_scale = LR_SCALE_NONE; a->accum = 1; a->zero = 0;
    a->nodes = 1; a->node_rank = 0; a->master = NULL; a->bootstrap_timeout = 120.0f; a->nccl_timeout = 600.0f;
    a->lr = 3e-4f; a->min_lr_frac = 0.1f; a->weight_decay = 0.01f; a->grad_clip = 1.0f;
    a->lr_base = a->lr;
    a->warmup = 100;
    a->seed = 1337;
    a->resume = 0; a->ckpt_every = 200; a->keep = 3; a->log_every = 1; a->threads = 0;
    a->workers = 2; a->augment = 0;
    a->loss_scale = VLA_LOSS_SCALE_DEFAULT; a->loss_scale_window = VLA_LOSS_SCALE_WINDOW_DEFAULT;
}

// Builds without dynamic loss scaling (train_vla_cpu, train_vla in bf16 or fp32) refuse its flags
// rather than ignore them: `what` names the build.
static inline void train_args_no_loss_scale(const TrainArgs* a, const char* what) {
    if (a->loss_scale != VLA_LOSS_SCALE_DEFAULT || a->loss_scale_window != VLA_LOSS_SCALE_WINDOW_DEFAULT) {
        vla_fail("--loss-scale and --loss-scale-window are for fp16 mixed precision; %s does not scale the loss: drop "
                 "them, or build train_vla with PRECISION=FP16", what);
    }
}

static inline void train_args_usage(const char* prog) {
    TrainArgs d;
    train_args_defaults(&d);
    printf("usage: %s [options]\n", prog);
    printf("  -i, --input LIST       dataset shards: files or folders of *.bin, comma-separated (%s)\n", d.input);
    printf("  -o, --output DIR       folder for checkpoints and log.jsonl (%s)\n", d.output);
    printf("  -p, --preset NAME      model size:");
    for (int i = 0; i < SMOLVLA_N_PRESETS; i++) { printf(" %s", SMOLVLA_PRESETS[i].name); }
    printf(" (%s)\n", d.preset);
    printf("      --train MODE       what trains: expert (the action expert), vlm (also the VLM but its vision tower,\n"
           "                         last layer and final norm), all (everything); default: expert for smolvla, all\n"
           "                         for the presets trained from scratch\n");
    printf("      --recompute LEVEL  activation recomputation (train_vla): none (keep every activation), attn (run\n"
           "                         each layer's attention half again in the backward), layer (keep each layer's\n"
           "                         input alone, run the layer again): less memory for one more forward (%s)\n",
           RECOMPUTE_NAMES[d.recompute]);
    printf("      --memory           train_vla: print the activation memory per --train and --recompute at a few\n"
           "                         batch sizes for -p's model, and the largest batch that fits, then exit\n");
    printf("      --profile STEP     train_vla: time step STEP's GPU work by phase (vision, VLM, expert, optimizer..)\n"
           "                         and operation (matmul, attention, norms..), the products' shapes and TFLOP/s\n"
           "                         too, and print the tables after the run (STEP > the first, which warms up)\n");
    printf("      --max-text N       instruction tokens the model reads (longer ones are cut), 0: the preset's (%d)\n",
           d.max_text);
    printf("  -b, --batch N          samples per rank per step (%d)\n", d.batch);
    printf("  -g, --gpus N           ranks: GPUs for train_vla, simulated ranks for train_vla_cpu (%d)\n", d.ranks);
    printf("  -d, --total-batch N    samples per optimizer step over all ranks; a multiple of -b x ranks, the rest\n"
           "                         accumulated over micro-steps; 0: -b x ranks (%d)\n", d.total_batch);
    printf("  -n, --steps N          optimizer steps in total (%d)\n", d.steps);
    printf("  -l, --lr X             peak learning rate (%g)\n", d.lr);
    printf("      --lr-scale MODE    grow the peak learning rate with the world size: none, linear, sqrt (%s)\n",
           LR_SCALE_NAMES[d.lr_scale]);
    printf("  -z, --zero 0|1         1: ZeRO-1, AdamW state and master weights sharded over the ranks (%d)\n", d.zero);
    printf("      --nodes N          machines of a multi-node run; -g GPUs on each (%d; Slurm's SLURM_NNODES when set)\n", d.nodes);
    printf("      --node-rank R      this machine's place, 0 .. N-1 (%d; Slurm's SLURM_NODEID when set)\n", d.node_rank);
    printf("      --master HOST:PORT node 0's address and a free port (VLA_MASTER, or MASTER_ADDR and MASTER_PORT)\n");
    printf("      --bootstrap-timeout S  seconds the nodes wait for each other at the start (%g)\n", d.bootstrap_timeout);
    printf("      --nccl-timeout S   seconds one step may take (collectives included) before the run is aborted (%g)\n", d.nccl_timeout);
    printf("      --min-lr-frac X    cosine floor as a fraction of the peak (%g)\n", d.min_lr_frac);
    printf("  -u, --warmup N         linear warmup steps (%d)\n", d.warmup);
    printf("  -w, --weight-decay X   AdamW decay on matrices (%g)\n", d.weight_decay);
    printf("  -c, --clip X           global gradient-norm clip, 0 disables (%g)\n", d.grad_clip);
    printf("  -s, --seed N           seed for init, sampler and flow noise (%llu)\n", (unsigned long long)d.seed);
    printf("  -y, --resume 0|1       1: continue from the newest complete checkpoint in the output folder (%d)\n", d.resume);
    printf("      --new-run          start anew in an output folder that holds a run: its checkpoints and log move\n"
           "                         into <output>/previous_<N>/ (nothing is deleted)\n");
    printf("      --init FILE        start from this checkpoint (weights, optimizer, step, sampler, seed: it continues)\n");
    printf("      --weights-only     with --init: its weights alone (fine-tuning: step 0, fresh optimizer, this run's seed\n"
           "                         and the dataset's statistics; its sizes, and cameras and dims from the dataset)\n");
    printf("  -k, --ckpt-every N     checkpoint every N steps and at the end, 0: only at the end (%d)\n", d.ckpt_every);
    printf("      --keep N           checkpoints kept in the output folder (%d)\n", d.keep);
    printf("      --no-checkpoint    write no checkpoint, not even at the end or on Ctrl-C (benchmarks: the weights\n"
           "                         trained are not kept)\n");
    printf("      --log-every N      print a step line every N steps (%d)\n", d.log_every);
    printf("  -t, --threads N        OpenMP threads, 0: runtime default (%d)\n", d.threads);
    printf("      --workers N        data loader threads filling a ring of batches ahead of the trainer (%d)\n", d.workers);
    printf("      --augment-shift N  random image shift of up to N pixels per camera, 0: off (%d)\n", d.augment);
    printf("      --balance MODE     none: every sample once per epoch; tasks: every global batch draws the tasks\n"
           "                         in equal proportion (or --task-weights'), each task's samples in turn (%s)\n",
           BALANCE_NAMES[d.balance]);
    printf("      --task-weights W   with --balance tasks: one whole number per task, comma-separated (1,3: three\n"
           "                         samples of task 1 per one of task 0); default equal\n");
    printf("      --loss-scale S     fp16 builds (PRECISION=FP16): the initial dynamic loss scale (%g)\n", d.loss_scale);
    printf("      --loss-scale-window N  fp16 builds: clean steps before the loss scale doubles; a step with Inf/NaN\n"
           "                         gradients is skipped and halves it (%d)\n", d.loss_scale_window);
    printf("  -h, --help             this message\n");
}

static inline long parse_int_arg(const char* name, const char* s, long lo, long hi) {
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        vla_fail("--%s %s: expected an integer in [%ld, %ld]", name, s, lo, hi);
    }
    return v;
}

static inline float parse_float_arg(const char* name, const char* s, float lo, float hi) {
    char* end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
        vla_fail("--%s %s: expected a number in [%g, %g]", name, s, lo, hi);
    }
    return v;
}

// --master "host:port" or "[ipv6]:port" into host and port; NULL on success, else what is wrong with it.
// train_args_parse checks it early, bootstrap_exchange splits it.
static inline const char* boot_parse_master(const char* master, char* host, size_t size, char* port, size_t port_size) {
    const char* bad_form = "expected host:port (node 0's address and a free port)";
    const char* colon = strrchr(master, ':');
    if (colon == NULL || colon == master || colon[1] == '\0') { return bad_form; }
    const char* h = master;
    size_t n = (size_t)(colon - master);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') { h++; n -= 2; }
    if (n == 0 || n >= size || strlen(colon + 1) >= port_size) { return bad_form; }
    memcpy(host, h, n);
    host[n] = '\0';
    snprintf(port, port_size, "%s", colon + 1);
    for (const char* p = port; *p; p++) {
        if (*p < '0' || *p > '9') { return bad_form; }
    }
    // getaddrinfo would take 0 as "any port" and wrap 65536 and up: refuse them here
    long number = strtol(port, NULL, 10);
    if (number < 1 || number > 65535) { return "the port is out of range: pick one from 1 to 65535"; }
    return NULL;
}

static inline void train_args_parse(TrainArgs* a, int argc, char** argv) {
    train_args_defaults(a);
    enum { OPT_MIN_LR = 1000, OPT_INIT, OPT_KEEP, OPT_LOG_EVERY, OPT_WORKERS, OPT_AUGMENT, OPT_LR_SCALE, OPT_NODES,
           OPT_NODE_RANK, OPT_MASTER, OPT_BOOT_TIMEOUT, OPT_NCCL_TIMEOUT, OPT_MAX_TEXT, OPT_TRAIN, OPT_WEIGHTS_ONLY, OPT_BALANCE,
           OPT_TASK_WEIGHTS, OPT_RECOMPUTE, OPT_MEMORY, OPT_LOSS_SCALE, OPT_LOSS_SCALE_WINDOW, OPT_PROFILE,
           OPT_NO_CHECKPOINT, OPT_NEW_RUN };
    static const struct option longs[] = {
        {"input", required_argument, 0, 'i'},        {"output", required_argument, 0, 'o'},
        {"preset", required_argument, 0, 'p'},       {"batch", required_argument, 0, 'b'},
        {"gpus", required_argument, 0, 'g'},         {"steps", required_argument, 0, 'n'},
        {"lr", required_argument, 0, 'l'},           {"min-lr-frac", required_argument, 0, OPT_MIN_LR},
        {"warmup", required_argument, 0, 'u'},       {"weight-decay", required_argument, 0, 'w'},
        {"clip", required_argument, 0, 'c'},         {"seed", required_argument, 0, 's'},
        {"resume", required_argument, 0, 'y'},       {"init", required_argument, 0, OPT_INIT},
        {"new-run", no_argument, 0, OPT_NEW_RUN},
        {"weights-only", no_argument, 0, OPT_WEIGHTS_ONLY},
        {"ckpt-every", required_argument, 0, 'k'},   {"keep", required_argument, 0, OPT_KEEP},
        {"no-checkpoint", no_argument, 0, OPT_NO_CHECKPOINT},
        {"log-every", required_argument, 0, OPT_LOG_EVERY}, {"threads", required_argument, 0, 't'},
        {"workers", required_argument, 0, OPT_WORKERS}, {"augment-shift", required_argument, 0, OPT_AUGMENT},
        {"total-batch", required_argument, 0, 'd'},  {"lr-scale", required_argument, 0, OPT_LR_SCALE},
        {"zero", required_argument, 0, 'z'},         {"nodes", required_argument, 0, OPT_NODES},
        {"node-rank", required_argument, 0, OPT_NODE_RANK}, {"master", required_argument, 0, OPT_MASTER},
        {"bootstrap-timeout", required_argument, 0, OPT_BOOT_TIMEOUT},
        {"nccl-timeout", required_argument, 0, OPT_NCCL_TIMEOUT},
        {"max-text", required_argument, 0, OPT_MAX_TEXT}, {"train", required_argument, 0, OPT_TRAIN},
        {"balance", required_argument, 0, OPT_BALANCE}, {"task-weights", required_argument, 0, OPT_TASK_WEIGHTS},
        {"recompute", required_argument, 0, OPT_RECOMPUTE}, {"memory", no_argument, 0, OPT_MEMORY},
        {"profile", required_argument, 0, OPT_PROFILE},
        {"loss-scale", required_argument, 0, OPT_LOSS_SCALE},
        {"loss-scale-window", required_argument, 0, OPT_LOSS_SCALE_WINDOW},
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int opt, nodes_given = 0, rank_given = 0, ckpt_given = 0;
    while ((opt = getopt_long(argc, argv, ":i:o:p:b:g:d:n:l:u:w:c:s:y:k:t:z:h", longs, NULL)) != -1) {
        switch (opt) {
            case 'i': a->input = optarg; break;
            case 'o': a->output = optarg; break;
            case 'p':
                if (smolvla_preset(optarg) == NULL) { vla_fail("unknown preset '%s': use tiny, small or smolvla", optarg); }
                a->preset = optarg;
                a->preset_given = 1;
                break;
            case 'b': a->batch = (int)parse_int_arg("batch", optarg, 1, 1 << 20); break;
            case 'g': a->ranks = (int)parse_int_arg("gpus", optarg, 1, 1024); break;
            case 'd': a->total_batch = (int)parse_int_arg("total-batch", optarg, 0, 1 << 30); break;
            case 'z': a->zero = (int)parse_int_arg("zero", optarg, 0, 1); break;
            case OPT_NODES: a->nodes = (int)parse_int_arg("nodes", optarg, 1, 4096); nodes_given = 1; break;
            case OPT_NODE_RANK: a->node_rank = (int)parse_int_arg("node-rank", optarg, 0, 4095); rank_given = 1; break;
            case OPT_MASTER: a->master = optarg; break;
            case OPT_BOOT_TIMEOUT: a->bootstrap_timeout = parse_float_arg("bootstrap-timeout", optarg, 0.1f, 1e6f); break;
            case OPT_NCCL_TIMEOUT: a->nccl_timeout = parse_float_arg("nccl-timeout", optarg, 0.1f, 1e7f); break;
            case OPT_TRAIN:
                a->train_mode = train_mode_parse(optarg);
                if (a->train_mode < 0) { vla_fail("--train %s: use expert, vlm or all", optarg); }
                a->train_given = 1;
                break;
            case OPT_RECOMPUTE:
                a->recompute = recompute_parse(optarg);
                if (a->recompute < 0) { vla_fail("--recompute %s: use none, attn or layer", optarg); }
                break;
            case OPT_MEMORY: a->memory = 1; break;
            case OPT_PROFILE: a->profile = (int)parse_int_arg("profile", optarg, 1, VLA_MAX_STEPS); break;
            case OPT_BALANCE:
                for (a->balance = 0; a->balance < BALANCE_COUNT && strcmp(optarg, BALANCE_NAMES[a->balance]) != 0; a->balance++) {}
                if (a->balance == BALANCE_COUNT) { vla_fail("--balance %s: use none or tasks", optarg); }
                break;
            case OPT_TASK_WEIGHTS: a->task_weights = optarg; break;
            case OPT_MAX_TEXT: a->max_text = (int)parse_int_arg("max-text", optarg, 0, VLA_MAX_TEXT); break;
            case OPT_LR_SCALE:
                for (a->lr_scale = 0; a->lr_scale < LR_SCALE_COUNT && strcmp(optarg, LR_SCALE_NAMES[a->lr_scale]) != 0;
                     a->lr_scale++) {}
                if (a->lr_scale == LR_SCALE_COUNT) { vla_fail("--lr-scale %s: use none, linear or sqrt", optarg); }
                break;
            case 'n': a->steps = (int)parse_int_arg("steps", optarg, 1, VLA_MAX_STEPS); break;
            case 'l': a->lr = parse_float_arg("lr", optarg, 0.0f, 10.0f); break;
            case OPT_MIN_LR: a->min_lr_frac = parse_float_arg("min-lr-frac", optarg, 0.0f, 1.0f); break;
            case 'u': a->warmup = (int)parse_int_arg("warmup", optarg, 0, 1L << 30); break;
            case 'w': a->weight_decay = parse_float_arg("weight-decay", optarg, 0.0f, 10.0f); break;
            case 'c': a->grad_clip = parse_float_arg("clip", optarg, 0.0f, 1e9f); break;
            case 's': a->seed = (uint64_t)parse_int_arg("seed", optarg, 0, 0x7fffffffffffffffL); break;
            case 'y': a->resume = (int)parse_int_arg("resume", optarg, 0, 1); break;
            case OPT_INIT: a->init = optarg; break;
            case OPT_NEW_RUN: a->new_run = 1; break;
            case OPT_WEIGHTS_ONLY: a->weights_only = 1; break;
            case 'k': a->ckpt_every = (int)parse_int_arg("ckpt-every", optarg, 0, 1L << 30); ckpt_given = 1; break;
            case OPT_NO_CHECKPOINT: a->no_checkpoint = 1; break;
            case OPT_KEEP: a->keep = (int)parse_int_arg("keep", optarg, 1, 4096); break;
            case OPT_LOG_EVERY: a->log_every = (int)parse_int_arg("log-every", optarg, 1, 1L << 30); break;
            case 't': a->threads = (int)parse_int_arg("threads", optarg, 0, 4096); break;
            case OPT_WORKERS: a->workers = (int)parse_int_arg("workers", optarg, 0, 256); break;
            case OPT_AUGMENT: a->augment = (int)parse_int_arg("augment-shift", optarg, 0, 1024); break;
            case OPT_LOSS_SCALE: a->loss_scale = parse_float_arg("loss-scale", optarg, 1.0f, VLA_LOSS_SCALE_MAX); break;
            case OPT_LOSS_SCALE_WINDOW:
                a->loss_scale_window = (int)parse_int_arg("loss-scale-window", optarg, 1, VLA_LOSS_SCALE_WINDOW_MAX);
                break;
            case 'h': train_args_usage(argv[0]); exit(0);
            case ':': vla_fail("option %s needs a value: see %s -h", argv[optind - 1], argv[0]);
            default: vla_fail("unknown option %s: see %s -h", argv[optind - 1], argv[0]);
        }
    }
    if (optind < argc) { vla_fail("unexpected argument '%s': options take the form -x VALUE, see %s -h", argv[optind], argv[0]); }
    if (a->resume && a->init != NULL) { vla_fail("-y 1 and --init both pick a checkpoint: use one of them"); }
    if (a->resume && a->new_run) {
        vla_fail("-y 1 continues the run in %s and --new-run moves it aside to start anew: use one of them", a->output);
    }
    if (a->weights_only && a->init == NULL) {
        vla_fail("--weights-only takes the weights of --init FILE: give the checkpoint to fine-tune from with --init");
    }
    if (a->no_checkpoint && ckpt_given) {
        vla_fail("--no-checkpoint writes no checkpoint and -k %d asks for them: drop one of the two", a->ckpt_every);
    }
    if (!a->train_given) { a->train_mode = smolvla_default_train_mode(a->preset); }
    if (a->task_weights != NULL && a->balance != BALANCE_TASKS) {
        vla_fail("--task-weights %s weighs the tasks of --balance tasks: add --balance tasks", a->task_weights);
    }
    if (a->task_weights != NULL) {  // the form and the sum now, the count once the dataset is open
        uint32_t* w = (uint32_t*)mallocCheck((strlen(a->task_weights) / 2 + 1) * sizeof(uint32_t));
        task_weights_parse(a->task_weights, w, (int)(strlen(a->task_weights) / 2 + 1));
        free(w);
    }
    size_t out_len = strlen(a->output);
    if (out_len == 0 || out_len + VLA_CKPT_NAME_MAX >= VLA_PATH_MAX) {
        vla_fail("-o of %zu bytes: the output folder's path must be 1 to %d bytes long (checkpoint names follow it): use a "
                 "shorter one", out_len, VLA_PATH_MAX - 1 - VLA_CKPT_NAME_MAX);
    }
    a->lr_base = a->lr;
    // a Slurm allocation of several nodes: its node count, this node's place, the master from the
    // environment (the sbatch script in scripts/ sets VLA_MASTER); flags override it
    const char* slurm_nodes = getenv("SLURM_NNODES");
    const char* slurm_id = getenv("SLURM_NODEID");
    if (!nodes_given && slurm_nodes != NULL) { a->nodes = (int)parse_int_arg("nodes (SLURM_NNODES)", slurm_nodes, 1, 4096); }
    if (!rank_given && slurm_id != NULL && a->nodes > 1) {
        a->node_rank = (int)parse_int_arg("node-rank (SLURM_NODEID)", slurm_id, 0, 4095);
    }
    static char master_env[300];
    if (a->master == NULL && getenv("VLA_MASTER") != NULL) { a->master = getenv("VLA_MASTER"); }
    if (a->master == NULL && getenv("MASTER_ADDR") != NULL && getenv("MASTER_PORT") != NULL) {
        snprintf(master_env, sizeof(master_env), "%s:%s", getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
        a->master = master_env;
    }
    if (a->node_rank >= a->nodes) {
        vla_fail("--node-rank %d with --nodes %d: node ranks go from 0 to %d", a->node_rank, a->nodes, a->nodes - 1);
    }
    if (a->nodes > 1 && a->master == NULL) {
        vla_fail("--nodes %d needs --master HOST:PORT (node 0's address and a free port), or VLA_MASTER", a->nodes);
    }
    char host[256], port[16];
    const char* problem = a->nodes > 1 ? boot_parse_master(a->master, host, sizeof(host), port, sizeof(port)) : NULL;
    if (problem != NULL) { vla_fail("--master %s: %s", a->master, problem); }
}

// For a run of `world` ranks (GPUs over all nodes, or simulated ranks): the micro-steps per
// optimizer step that -d asks for, and the peak learning rate scaled by --lr-scale.
static inline void train_args_for_world(TrainArgs* a, int world) {
    int64_t per_micro = (int64_t)a->batch * world;
    if (per_micro > (1 << 30)) {
        vla_fail("-b %d x %d rank(s) is %lld samples per step, past the bound 2^30: use a smaller batch", a->batch, world,
                 (long long)per_micro);
    }
    if (a->total_batch == 0) {
        a->accum = 1;
    } else if (a->total_batch % per_micro != 0) {
        vla_fail("-d %d is not a multiple of -b %d x %d rank(s) = %lld: make the total batch one", a->total_batch,
                 a->batch, world, (long long)per_micro);
    } else {
        a->accum = (int)(a->total_batch / per_micro);
    }
    float factor = a->lr_scale == LR_SCALE_LINEAR ? (float)world : a->lr_scale == LR_SCALE_SQRT ? sqrtf((float)world) : 1.0f;
    a->lr = a->lr_base * factor;
}

// Whether a checkpoint is written once `done` steps are: every -k steps, at the end, and when the
// run was stopped early; never with --no-checkpoint
static inline int train_ckpt_due(const TrainArgs* a, int done, int stopped) {
    if (a->no_checkpoint) { return 0; }
    return (a->ckpt_every > 0 && done % a->ckpt_every == 0) || done == a->steps || stopped;
}

// The end of a failed run's error about what it leaves: "the last checkpoint in DIR (step N) is
// intact, continue with -y 1" when the folder holds one, else that it holds none to continue from.
static inline const char* train_checkpoint_left(const char* dir, char* buf, size_t size) {
    uint64_t steps[1];
    if (checkpoint_list(dir, steps, 1) == 1) {
        snprintf(buf, size, "the last checkpoint in %s (step %llu) is intact, continue with -y 1 -o %s",
                 dir, (unsigned long long)steps[0], dir);
    } else {
        snprintf(buf, size, "%s holds no checkpoint to continue from", dir);
    }
    return buf;
}

// What a run stopped by a signal (INT, TERM, HUP) at step `step` prints: where its last step went,
// or that --no-checkpoint kept nothing. A signal after the last step stopped nothing: the run is
// complete (its last checkpoint written). Returns the exit status: 130 interrupted, 0 complete.
static inline int train_report_interrupt(const TrainArgs* a, int step) {
    if (step >= a->steps) {
        printf("the run is complete: all %d steps done%s%s (the signal came after the last step)\n", a->steps,
               a->no_checkpoint ? ", no checkpoint written (--no-checkpoint)" : ", the last checkpoint is in ",
               a->no_checkpoint ? "" : a->output);
        return 0;
    }
    if (a->no_checkpoint) {
        printf("interrupted at step %d: no checkpoint written (--no-checkpoint)\n", step);
    } else {
        printf("interrupted: saved step %d to %s; continue with -y 1 -o %s\n", step, a->output, a->output);
    }
    return 130;
}

// Samples per optimizer step: the effective batch
static inline int64_t train_global_batch(const TrainArgs* a, int world) { return (int64_t)a->batch * world * a->accum; }

// ----------------------------------------------------------------------------
// learning-rate schedule: linear warmup to the peak, then cosine down to min_lr_frac * peak

static inline float lr_at_step(const TrainArgs* a, int step) {
    if (step < a->warmup) { return a->lr * (float)(step + 1) / (float)a->warmup; }
    int decay_steps = a->steps - a->warmup;
    float progress = decay_steps > 0 ? (float)(step - a->warmup) / (float)decay_steps : 1.0f;
    if (progress > 1.0f) { progress = 1.0f; }
    float floor_lr = a->lr * a->min_lr_frac;
    return floor_lr + 0.5f * (a->lr - floor_lr) * (1.0f + cosf(3.14159265358979f * progress));
}

// ----------------------------------------------------------------------------
// the run folder (-o): one owner, nothing of an earlier run lost
//
// The process that writes a run's checkpoints and log (the CPU trainer; the GPU trainer's node 0)
// owns its folder: an exclusive flock on <out>/.lock for the run's lifetime, the lock file naming
// the owner (pid, host, start). The kernel releases the lock when its process ends however it
// ends, so a lock left by a killed trainer is taken over (its line is still there, and said). The
// folder's identity (device, inode; the folder held open, so that a folder made in the place of a
// removed one cannot get its inode) is taken with the lock and checked before every write: a
// folder removed, moved or replaced under the run stops it, with nothing written elsewhere.
// A folder holds a run when it holds a checkpoint file (ckpt_*.bin) or a non-empty log.jsonl. A
// new run into it is refused, saying how to continue it (-y 1) or move it aside (--new-run, into
// <out>/previous_<N>/); -y 1 starts from scratch only where there is no run at all.

typedef struct {
    char path[VLA_PATH_MAX];  // -o as given
    dev_t dev;                // the folder's identity when the run took it
    ino_t ino;
    int dir_fd;               // the folder, held open: its inode cannot go to a folder made in its place
    int lock_fd;              // <path>/.lock, locked; -1: this process owns no run folder
} RunFolder;
static RunFolder run_folder = {"", 0, 0, -1, -1};  // one run per process

static inline void make_dir(const char* dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int err = errno;
        char parent[VLA_PATH_MAX], fix[VLA_PATH_MAX + 128];
        path_folder(dir, parent, sizeof(parent));
        struct stat st;
        if ((err == ENOENT || err == ENOTDIR) && stat(parent, &st) != 0) {
            snprintf(fix, sizeof(fix), "%s does not exist: create it first", parent);
        } else {
            write_failure_fix(err, parent, fix, sizeof(fix));
        }
        vla_fail("cannot create the output folder %s: %s: %s, or pick another with -o", dir, strerror(err), fix);
    }
}

// What a file of a run folder is: 1 a checkpoint (ckpt_*.bin), 2 the log, 3 a temporary file a
// save left (ckpt_*.tmp, log.jsonl.*tmp: the <name>.tmp and <name>.<pid>.tmp forms), 0 none of them.
enum { RUN_FILE_NONE = 0, RUN_FILE_CHECKPOINT = 1, RUN_FILE_LOG = 2, RUN_FILE_TEMP = 3 };
static inline int run_file_kind(const char* name) {
    size_t n = strlen(name);
    int is_ckpt = strncmp(name, "ckpt_", 5) == 0, is_log = strncmp(name, "log.jsonl", 9) == 0;
    if (n > 4 && strcmp(name + n - 4, ".tmp") == 0 && (is_ckpt || (is_log && name[9] == '.'))) { return RUN_FILE_TEMP; }
    if (is_ckpt && n > 9 && strcmp(name + n - 4, ".bin") == 0) { return RUN_FILE_CHECKPOINT; }
    return strcmp(name, "log.jsonl") == 0 ? RUN_FILE_LOG : RUN_FILE_NONE;
}

// Whether dir holds a run (a checkpoint file or a non-empty log.jsonl); what it holds, said in words
// ("2 checkpoint files and log.jsonl (4.1 KiB)"), into what; the checkpoint files it counts, into
// *n_checkpoints where not NULL.
static inline int run_folder_holds_run(const char* dir, char* what, size_t size, int* n_checkpoints) {
    int checkpoints = 0;
    uint64_t log_bytes = 0;
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        int kind = run_file_kind(de->d_name);
        char path[VLA_PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (kind == RUN_FILE_CHECKPOINT) { checkpoints++; }
        if (kind == RUN_FILE_LOG && stat(path, &st) == 0) { log_bytes = (uint64_t)st.st_size; }
    }
    if (d != NULL) { closedir(d); }
    char ckpts[64] = "", logged[64] = "", bytes[32];
    if (checkpoints > 0) { snprintf(ckpts, sizeof(ckpts), "%d checkpoint file%s", checkpoints, checkpoints > 1 ? "s" : ""); }
    if (log_bytes > 0) { snprintf(logged, sizeof(logged), "log.jsonl (%s)", human_bytes(log_bytes, bytes, sizeof(bytes))); }
    snprintf(what, size, "%s%s%s", ckpts, checkpoints > 0 && log_bytes > 0 ? " and " : "", logged);
    if (n_checkpoints != NULL) { *n_checkpoints = checkpoints; }
    return checkpoints > 0 || log_bytes > 0;
}

// Whether path names a file in the run folder (its folder has the folder's identity).
static inline int run_folder_contains(const char* path) {
    char dir[VLA_PATH_MAX];
    struct stat st;
    return run_folder.lock_fd >= 0 && stat(path_folder(path, dir, sizeof(dir)), &st) == 0 &&
           st.st_dev == run_folder.dev && st.st_ino == run_folder.ino;
}

// Where the owned folder is now, from the lock file the process holds open: "moved to X" or
// "removed", into buf.
static inline const char* run_folder_whereabouts(char* buf, size_t size) {
    char link[64], now[VLA_PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", run_folder.lock_fd);
    ssize_t n = readlink(link, now, sizeof(now) - 1);
    if (n <= 0) { snprintf(buf, size, "removed or moved"); return buf; }
    now[n] = '\0';
    size_t len = strlen(now);
    if (len > 10 && strcmp(now + len - 10, " (deleted)") == 0) { snprintf(buf, size, "removed"); return buf; }
    if (len > 6 && strcmp(now + len - 6, "/.lock") == 0) { now[len - 6] = '\0'; }
    snprintf(buf, size, "moved to %s", now);
    return buf;
}

// Whether the run folder is where it was, the same folder (1 too where this process owns none).
static inline int run_folder_intact(void) {
    struct stat st;
    return run_folder.lock_fd < 0 ||
           (stat(run_folder.path, &st) == 0 && st.st_dev == run_folder.dev && st.st_ino == run_folder.ino);
}

// Before each write into the run folder (what: "step 40's checkpoint", "step 41's log line"): the
// folder must be the one the run took. Removed, moved or replaced: the run stops in one line,
// nothing written. A process that owns no folder (the tests' saves) makes it where missing.
static inline void run_folder_check(const char* dir, const char* what) {
    if (run_folder.lock_fd < 0) {
        if (dir != NULL) { make_dir(dir); }
        return;
    }
    if (run_folder_intact()) { return; }
    struct stat st;
    char where[VLA_PATH_MAX + 32];
    if (stat(run_folder.path, &st) != 0) {
        vla_fail("the output folder %s was %s during the run: %s was not written; put the folder back and continue "
                 "with -y 1 -o %s", run_folder.path, run_folder_whereabouts(where, sizeof(where)), what, run_folder.path);
    }
    if (st.st_dev != run_folder.dev || st.st_ino != run_folder.ino) {
        vla_fail("the output folder %s was replaced during the run (the run's folder was %s): %s was not written into "
                 "the new one; put the run's folder back and continue with -y 1 -o %s", run_folder.path,
                 run_folder_whereabouts(where, sizeof(where)), what, run_folder.path);
    }
}

// At exit: the lock file is emptied (a lock file that names a process tells of one that ended
// without this), and the kernel drops the lock with the process.
static inline void run_folder_release(void) {
    if (run_folder.lock_fd >= 0 && ftruncate(run_folder.lock_fd, 0) != 0) {}
}

// -i must not read from the run folder: the trainer writes its checkpoints there (and a
// checkpoint read as a shard is not data).
static inline void run_folder_check_input(const char* spec) {
    char** files;
    int n = dataset_list_files(spec, &files);
    for (int i = 0; i < n; i++) {
        if (run_folder_contains(files[i])) {
            vla_fail("-i %s reads %s from the output folder %s, where the run writes its checkpoints: keep the dataset "
                     "and the run in separate folders (-i, -o)", spec, files[i], run_folder.path);
        }
    }
    for (int i = 0; i < n; i++) { free(files[i]); }
    free(files);
}

// Makes the folder's first unused previous_<N>/ (its path into prev), for `who`'s message.
static inline void run_folder_make_previous(const char* dir, const char* who, char* prev, size_t size) {
    for (int k = 1;; k++) {
        snprintf(prev, size, "%s/previous_%d", dir, k);
        if (mkdir(prev, 0755) == 0) { return; }
        if (errno != EEXIST) {
            int err = errno;
            char fix[VLA_PATH_MAX + 128];
            vla_fail("%s: cannot create %s: %s: %s", who, prev, strerror(err), write_failure_fix(err, dir, fix, sizeof(fix)));
        }
    }
}

// --new-run: the earlier run's files (checkpoints, log.jsonl, temporary files) move into the
// folder's first unused previous_<N>/, said in one line that starts with `who`. Nothing is deleted.
static inline void run_folder_move_aside(const char* dir, const char* who) {
    char what[128];
    if (!run_folder_holds_run(dir, what, sizeof(what), NULL)) { return; }
    char prev[VLA_PATH_MAX + 32];
    run_folder_make_previous(dir, who, prev, sizeof(prev));
    int moved = 0;
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        if (run_file_kind(de->d_name) == RUN_FILE_NONE) { continue; }
        char from[VLA_PATH_MAX + 300], to[VLA_PATH_MAX + 332];
        snprintf(from, sizeof(from), "%s/%s", dir, de->d_name);
        snprintf(to, sizeof(to), "%s/%s", prev, de->d_name);
        if (rename(from, to) != 0) {
            vla_fail("%s: moving %s into %s failed: %s (%d file(s) of the earlier run are there already, the rest where "
                     "they were): move them by hand", who, from, prev, strerror(errno), moved);
        }
        moved++;
    }
    if (d != NULL) { closedir(d); }
    printf("%s: moved the earlier run in %s (%s) into %s/\n", who, dir, what, prev);
}

// --init of one of the folder's own checkpoints at step `step` takes the run back there: its later
// checkpoints would be pruned or overwritten by the steps taken again, and -y 1 could pick one of
// them up. They move into previous_<N>/ with a copy of log.jsonl (whose later lines the run
// drops, saying so), said in one line.
static inline void run_folder_go_back(const char* dir, const char* init, uint64_t step) {
    uint64_t steps[4096];
    int n = checkpoint_list(dir, steps, 4096), later = 0;
    while (later < n && steps[later] > step) { later++; }
    if (later == 0) { return; }
    char prev[VLA_PATH_MAX + 32], who[VLA_PATH_MAX + 64];
    snprintf(who, sizeof(who), "--init %s", init);
    run_folder_make_previous(dir, who, prev, sizeof(prev));
    for (int i = 0; i < later; i++) {
        char from[VLA_PATH_MAX], to[VLA_PATH_MAX + 64];
        checkpoint_path(from, sizeof(from), dir, steps[i]);
        snprintf(to, sizeof(to), "%s/%s", prev, strrchr(from, '/') + 1);
        if (rename(from, to) != 0) { vla_fail("%s: moving %s into %s failed: %s", who, from, prev, strerror(errno)); }
    }
    char log_path[VLA_PATH_MAX + 16], copy[VLA_PATH_MAX + 64];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", dir);
    snprintf(copy, sizeof(copy), "%s/log.jsonl", prev);
    FILE* in = fopen(log_path, "rb");
    int copied = in != NULL;
    if (in != NULL) {
        FILE* out = fopen(copy, "wb");
        char buf[65536];
        size_t got;
        int bad = out == NULL;
        while (!bad && (got = fread(buf, 1, sizeof(buf), in)) > 0) { bad = fwrite(buf, 1, got, out) != got; }
        if (out != NULL && fclose(out) != 0) { bad = 1; }
        fclose(in);
        if (bad) { vla_fail("%s: copying %s into %s failed: %s", who, log_path, prev, strerror(errno)); }
    }
    printf("%s goes back to step %llu: the %d later checkpoint(s) (up to step %llu)%s moved into %s/\n", who,
           (unsigned long long)step, later, (unsigned long long)steps[0], copied ? " and a copy of log.jsonl" : "",
           prev);
}

// Temporary files left by a save that was killed (SIGINT, then SIGKILL): no other process writes
// here, so they are removed, each said with its size.
static inline void run_folder_remove_stale(const char* dir) {
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        if (run_file_kind(de->d_name) != RUN_FILE_TEMP) { continue; }
        char path[VLA_PATH_MAX + 300], bytes[32];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) { continue; }
        if (unlink(path) == 0) {
            printf("removed %s (%s), a temporary file left by a save that was killed\n", path,
                   human_bytes((uint64_t)st.st_size, bytes, sizeof(bytes)));
        }
    }
    if (d != NULL) { closedir(d); }
}

// Takes the run folder a->output for this process (the writer of the run), in this order: the
// folder made, locked (another trainer there: refused, naming it), -i checked against it, then
// --new-run moves the earlier run aside or stale temporary files go; a new run into a folder that
// holds a run is refused. A run continues the folder's run with -y 1 (run_start_checkpoint) or
// --init of one of its checkpoints (without --weights-only); every other run is new.
static inline void run_folder_open(const TrainArgs* a) {
    const char* dir = a->output;
    make_dir(dir);
    snprintf(run_folder.path, sizeof(run_folder.path), "%s", dir);
    char lock_path[VLA_PATH_MAX + 16], fix[VLA_PATH_MAX + 128];
    snprintf(lock_path, sizeof(lock_path), "%s/.lock", dir);
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        vla_fail("cannot write into the output folder %s (creating %s: %s): %s, or pick another with -o", dir, lock_path,
                 strerror(err), write_failure_fix(err, dir, fix, sizeof(fix)));
    }
    int locked = flock(fd, LOCK_EX | LOCK_NB), err = errno;
    char holder[256];  // the line of the trainer that holds it, or held it and was killed
    ssize_t got = pread(fd, holder, sizeof(holder) - 1, 0);
    holder[got > 0 ? got : 0] = '\0';
    holder[strcspn(holder, "\n")] = '\0';
    if (locked != 0 && err == EWOULDBLOCK) {
        vla_fail("the output folder %s is in use by another trainer (%s): wait for it to end, or write elsewhere with -o",
                 dir, holder[0] != '\0' ? holder : "it has just started");
    }
    if (locked != 0) {
        vla_fail("cannot lock %s: %s: pick an output folder on a file system with locks (-o)", lock_path, strerror(err));
    }
    if (holder[0] != '\0') { printf("note: %s names %s, which ended without releasing it: taking it over\n", lock_path, holder); }
    char host[128] = "?", started[64];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(started, sizeof(started), "%Y-%m-%d %H:%M:%S UTC", &utc);
    char line[300];
    int len = snprintf(line, sizeof(line), "pid %d on %s, since %s\n", (int)getpid(), host, started);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        int err = errno;
        vla_fail("cannot write %s: %s: %s, or pick another output folder with -o", lock_path, strerror(err),
                 write_failure_fix(err, dir, fix, sizeof(fix)));
    }
    struct stat st;
    run_folder.dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (run_folder.dir_fd < 0 || fstat(run_folder.dir_fd, &st) != 0) {
        vla_fail("cannot open the output folder %s: %s", dir, strerror(errno));
    }
    run_folder.dev = st.st_dev;
    run_folder.ino = st.st_ino;
    run_folder.lock_fd = fd;
    atexit(run_folder_release);

    run_folder_check_input(a->input);
    int continues = a->resume || (a->init != NULL && !a->weights_only && run_folder_contains(a->init));
    if (a->new_run && a->init != NULL && run_folder_contains(a->init)) {
        vla_fail("--init %s is in %s, the run --new-run moves aside: copy it elsewhere first, or continue that run "
                 "without --new-run", a->init, dir);
    }
    if (a->new_run) { run_folder_move_aside(dir, "--new-run"); }
    CheckpointHeader h;
    char problem[VLA_PATH_MAX + 512];  // (a bad --init is refused, with this, when it is read)
    if (continues && !a->resume && checkpoint_read_header(a->init, &h, problem, sizeof(problem)) == 0) {
        run_folder_go_back(dir, a->init, h.step);
    }
    run_folder_remove_stale(dir);
    char what[128];
    if (!continues && run_folder_holds_run(dir, what, sizeof(what), NULL)) {
        vla_fail("the output folder %s holds a run (%s): continue it with -y 1 -o %s, or start anew with --new-run (the "
                 "earlier run moves into %s/previous_<N>/)", dir, what, dir, dir);
    }
}

// ----------------------------------------------------------------------------
// logging: rank 0 prints; every step also goes to <output>/log.jsonl

typedef struct {
    FILE* jsonl;
    char path[VLA_PATH_MAX];
    double t_start;
    int n_tasks;              // > 0: each line also holds "task_loss", the step's mean loss per task
    const double* task_loss;  // (n_tasks) set by the trainer before logger_step; NaN: no sample of it this step
    double saved_bytes;       // > 0: each line also holds the activation memory --recompute saves (the GPU trainer's)
    const LossScaleState* loss_scale;  // fp16 builds, set by the trainer: the scale the step ran with and the skips so far
} Logger;

// bytes as "12.34 GiB" from 1 GiB up, else "12.3 MiB"
static inline const char* format_bytes(char* out, size_t size, double bytes) {
    if (bytes >= 1024.0 * 1024.0 * 1024.0) { snprintf(out, size, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }
    else { snprintf(out, size, "%.1f MiB", bytes / (1024.0 * 1024.0)); }
    return out;
}

// Opens <dir>/log.jsonl for a run that continues after step `start` (0: from scratch). Lines of
// later steps are dropped, so that every step is there once: a run killed after logging a step
// and before checkpointing it logs that step again when it resumes. So are a partial last line and
// lines that are not a step's ({"step": ...). Each kind dropped is said. Nothing else truncates
// the log: run_folder_open refuses a new run into a folder that holds one.
static inline void logger_open(Logger* lg, const char* dir, int start) {
    run_folder_check(dir, "log.jsonl");
    lg->n_tasks = 0;
    lg->task_loss = NULL;
    lg->saved_bytes = 0.0;
    lg->loss_scale = NULL;
    snprintf(lg->path, sizeof(lg->path), "%s/log.jsonl", dir);
    FILE* old = fopen(lg->path, "r");
    if (old != NULL) {
        char* line = NULL;
        size_t cap = 0, kept_bytes = 0, kept_cap = 0;
        char* kept = NULL;
        int dropped = 0, later = 0, partial = 0, foreign = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, old)) > 0) {
            int step;
            if (line[n - 1] != '\n') { partial++; dropped++; continue; }
            if (strncmp(line, "{\"step\":", 8) != 0 || sscanf(line, "{\"step\": %d", &step) != 1) {
                foreign++; dropped++; continue;
            }
            if (step > start) { later++; dropped++; continue; }
            if (kept_bytes + (size_t)n > kept_cap) {
                kept_cap = 2 * (kept_bytes + (size_t)n);
                kept = (char*)realloc(kept, kept_cap);
                if (kept == NULL) { vla_fail("out of memory reading %s", lg->path); }
            }
            memcpy(kept + kept_bytes, line, (size_t)n);
            kept_bytes += (size_t)n;
        }
        fclose(old);
        free(line);
        if (dropped > 0) {
            AtomicFile out;
            atomic_file_open(&out, lg->path, kept_bytes);
            atomic_file_write(&out, kept, 1, kept_bytes);
            atomic_file_commit(&out);
            if (later > 0) {
                printf("%s: dropped %d line(s) past step %d, where this run continues: it logs those steps again\n",
                       lg->path, later, start);
            }
            if (partial > 0) { printf("%s: dropped a partial last line, cut by a run that was killed\n", lg->path); }
            if (foreign > 0) {
                printf("%s: dropped %d line(s) that are not a step's (they do not start with {\"step\":)\n", lg->path,
                       foreign);
            }
        }
        free(kept);
    }
    lg->jsonl = fopenCheck(lg->path, "a");
    lg->t_start = wall_seconds();
}

// One step's line. mfu and mem_gib are NAN where they mean nothing (the CPU trainer).
static inline void logger_step(Logger* lg, int step, int steps, float loss, float lr, float norm, double ms,
                        double samples_per_s, double mfu, double mem_gib, int print) {
    if (print) {
        double eta = ms * (steps - step - 1) / 1000.0;
        char extra[192] = "";
        if (!isnan(mfu)) { snprintf(extra, sizeof(extra), " | MFU %5.1f%% | %5.2f GiB", 100.0 * mfu, mem_gib); }
        else if (!isnan(mem_gib)) { snprintf(extra, sizeof(extra), " | %5.2f GiB", mem_gib); }  // a GPU of unknown peak
        if (lg->saved_bytes > 0.0) {
            char saved[32];
            size_t n = strlen(extra);
            snprintf(extra + n, sizeof(extra) - n, " | recompute saves %s", format_bytes(saved, sizeof(saved), lg->saved_bytes));
        }
        if (lg->loss_scale != NULL) {
            size_t used = strlen(extra);
            snprintf(extra + used, sizeof(extra) - used, " | scale %g, %llu skipped", (double)lg->loss_scale->scale,
                     (unsigned long long)lg->loss_scale->skipped);
        }
        printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %7.1f samples/s%s | ETA %dm%02ds\n",
               step + 1, steps, loss, lr, norm, ms, samples_per_s, extra, (int)(eta / 60), (int)eta % 60);
        fflush(stdout);
    }
    char what[64];
    snprintf(what, sizeof(what), "step %d's log line", step + 1);
    run_folder_check(NULL, what);
    fprintf(lg->jsonl, "{\"step\": %d, \"loss\": %.8g, \"lr\": %.6g", step + 1, loss, lr);
    // JSON has no Inf or NaN: an fp16 step skipped for its gradients' Inf/NaN logs no norm
    if (isfinite(norm)) { fprintf(lg->jsonl, ", \"grad_norm\": %.6g", norm); }
    fprintf(lg->jsonl, ", \"ms\": %.3f, \"samples_per_s\": %.3f", ms, samples_per_s);
    if (!isnan(mfu)) { fprintf(lg->jsonl, ", \"mfu\": %.5f", mfu); }
    if (!isnan(mem_gib)) { fprintf(lg->jsonl, ", \"gpu_mem_gib\": %.4f", mem_gib); }
    if (lg->saved_bytes > 0.0) { fprintf(lg->jsonl, ", \"recompute_saved_bytes\": %.0f", lg->saved_bytes); }
    if (lg->loss_scale != NULL) {
        fprintf(lg->jsonl, ", \"loss_scale\": %.9g, \"skipped_steps\": %llu", (double)lg->loss_scale->scale,
                (unsigned long long)lg->loss_scale->skipped);
    }
    if (lg->n_tasks > 0) {
        fprintf(lg->jsonl, ", \"task_loss\": [");
        for (int t = 0; t < lg->n_tasks; t++) {
            if (isnan(lg->task_loss[t])) { fprintf(lg->jsonl, "%snull", t > 0 ? ", " : ""); }
            else { fprintf(lg->jsonl, "%s%.8g", t > 0 ? ", " : "", lg->task_loss[t]); }
        }
        fprintf(lg->jsonl, "]");
    }
    fprintf(lg->jsonl, "}\n");
    if (fflush(lg->jsonl) != 0 || ferror(lg->jsonl)) {
        int err = errno;
        char dir[VLA_PATH_MAX], fix[VLA_PATH_MAX + 128];
        vla_fail("writing %s failed: %s: %s, then continue with -y 1 -o %s", lg->path, strerror(err),
                 write_failure_fix(err, path_folder(lg->path, dir, sizeof(dir)), fix, sizeof(fix)), dir);
    }
}

static inline void logger_close(Logger* lg) {
    if (lg->jsonl != NULL) { fclose(lg->jsonl); }
}

// ----------------------------------------------------------------------------
// runs: what both trainers do around their model (config, where to start, checkpoints)

// An instruction of the dataset: its text, its token ids, and where it was first met (shard order).
typedef struct { const uint8_t* text; uint64_t len; const int32_t* ids; uint64_t n_ids; size_t order; } Instruction;

static inline int instruction_compare_text(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    int c = memcmp(a->text, b->text, a->len < b->len ? a->len : b->len);
    if (c == 0) { c = a->len < b->len ? -1 : a->len > b->len; }
    return c != 0 ? c : (a->order < b->order ? -1 : a->order > b->order);
}

// Token ids in lexicographic order (a prefix before what extends it), then first met.
static inline int instruction_compare_ids(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    uint64_t m = a->n_ids < b->n_ids ? a->n_ids : b->n_ids;
    for (uint64_t k = 0; k < m; k++) {
        if (a->ids[k] != b->ids[k]) { return a->ids[k] < b->ids[k] ? -1 : 1; }
    }
    if (a->n_ids != b->n_ids) { return a->n_ids < b->n_ids ? -1 : 1; }
    return a->order < b->order ? -1 : a->order > b->order;
}

static inline int instruction_compare_order(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    return a->order < b->order ? -1 : a->order > b->order;
}

typedef struct { size_t first, count; } InstructionGroup;  // a run of the sorted instructions

static inline int instruction_group_compare(const void* pa, const void* pb, void* ins) {
    size_t a = ((const Instruction*)ins)[((const InstructionGroup*)pa)->first].order;
    size_t b = ((const Instruction*)ins)[((const InstructionGroup*)pb)->first].order;
    return a < b ? -1 : a > b;
}

// Warns when distinct instructions of the dataset read the same once their token ids are cut to
// max_text: the model could not tell those tasks apart. One line per group, naming its
// instructions, in the order the shards first name them; the first VLA_COLLISION_LINES groups and
// VLA_COLLISION_NAMES names a group, then how many more. Sorting makes it O(n log n): sorted by
// their ids, the instructions of a group are neighbours, and the longest prefix two instructions
// share is shared by two neighbours. Returns the number of instructions that collide with an
// earlier one.
#define VLA_COLLISION_LINES 10
#define VLA_COLLISION_NAMES 10
static inline int dataset_warn_text_collisions(const Dataset* ds, int max_text) {
    // the distinct instructions over all shards (each shard has its own table), with their tokens
    size_t n = 0, cap = 0;
    for (int s = 0; s < ds->n_shards; s++) { cap += ds->shards[s].h.n_tasks; }
    Instruction* ins = (Instruction*)mallocCheck((cap > 0 ? cap : 1) * sizeof(Instruction));
    for (int s = 0; s < ds->n_shards; s++) {
        const Shard* sh = &ds->shards[s];
        for (uint64_t k = 0; k < sh->h.n_tasks; k++) {
            Instruction t = {sh->task_text + sh->task_offsets[k], sh->task_offsets[k + 1] - sh->task_offsets[k],
                             sh->tokens + sh->token_offsets[k], sh->token_offsets[k + 1] - sh->token_offsets[k], n};
            ins[n++] = t;
        }
    }
    qsort(ins, n, sizeof(Instruction), instruction_compare_text);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {  // the first of equal texts stays
        if (distinct == 0 || ins[distinct - 1].len != ins[i].len ||
            memcmp(ins[distinct - 1].text, ins[i].text, ins[i].len) != 0) { ins[distinct++] = ins[i]; }
    }
    n = distinct;
    qsort(ins, n, sizeof(Instruction), instruction_compare_ids);
    // the fewest tokens that keep every pair apart: one past their longest common prefix
    uint64_t need = 1;
    for (size_t i = 0; i + 1 < n; i++) {
        uint64_t p = 0, m = ins[i].n_ids < ins[i + 1].n_ids ? ins[i].n_ids : ins[i + 1].n_ids;
        while (p < m && ins[i].ids[p] == ins[i + 1].ids[p]) { p++; }
        if (p + 1 > need) { need = p + 1; }
    }
    // the groups: runs of neighbours equal in their first max_text ids (and as long once cut)
    InstructionGroup* groups = (InstructionGroup*)mallocCheck((n > 0 ? n : 1) * sizeof(InstructionGroup));
    size_t n_groups = 0;
    int collisions = 0;
    for (size_t i = 0; i < n;) {
        uint64_t li = ins[i].n_ids < (uint64_t)max_text ? ins[i].n_ids : (uint64_t)max_text;
        size_t j = i + 1;
        while (j < n) {
            uint64_t lj = ins[j].n_ids < (uint64_t)max_text ? ins[j].n_ids : (uint64_t)max_text;
            if (li != lj || memcmp(ins[i].ids, ins[j].ids, li * sizeof(int32_t)) != 0) { break; }
            j++;
        }
        if (j - i > 1) {
            qsort(ins + i, j - i, sizeof(Instruction), instruction_compare_order);
            InstructionGroup g = {i, j - i};
            groups[n_groups++] = g;
            collisions += (int)(j - i - 1);
        }
        i = j;
    }
    qsort_r(groups, n_groups, sizeof(InstructionGroup), instruction_group_compare, ins);
    const char* unit = strcmp(ds->tokenizer, SHARD_TOKENIZER_BYTES) == 0 ? "bytes" : "tokens";
    for (size_t g = 0; g < n_groups && g < VLA_COLLISION_LINES; g++) {
        const Instruction* first = &ins[groups[g].first];
        printf("warning: these instructions are the same in their first %d %s, so the model reads them as one task: ",
               max_text, unit);
        for (size_t k = 0; k < groups[g].count && k < VLA_COLLISION_NAMES; k++) {
            printf("%s\"%.*s\"", k > 0 ? ", " : "", (int)first[k].len, (const char*)first[k].text);
        }
        if (groups[g].count > VLA_COLLISION_NAMES) { printf(" and %zu more", groups[g].count - VLA_COLLISION_NAMES); }
        printf(" (--max-text %llu keeps every instruction distinct)\n", (unsigned long long)need);
    }
    if (n_groups > VLA_COLLISION_LINES) {
        printf("warning: and %zu more groups of instructions the same in their first %d %s: %d of the %zu distinct "
               "instructions read as another (--max-text %llu keeps every instruction distinct)\n",
               n_groups - VLA_COLLISION_LINES, max_text, unit, collisions, n, (unsigned long long)need);
    }
    free(groups); free(ins);
    return collisions;
}

// A model's sizes (`what`: "preset NAME" or the checkpoint they come from) with the dataset's
// cameras, state and action dims, and max_text tokens of instruction (0: the sizes' own). Cameras
// may have any size (the model resizes them with padding); state and action dims must fit
// max_state_dim / max_action_dim, the token ids the vocabulary. Warns when instructions become
// identical once cut.
static inline SmolVLAConfig config_with_data(SmolVLAConfig c, const char* what, int max_text, const Dataset* ds) {
    if (ds->cams.n > VLA_MAX_CAM) { vla_fail("the dataset has %d cameras, past the bound %d", ds->cams.n, VLA_MAX_CAM); }
    if (ds->state_dim > c.max_state_dim || ds->action_dim > c.max_action_dim) {
        vla_fail("the dataset's state and action have %d and %d dims, but %s pads them to %d and %d: pick data "
                 "with at most that many dims", ds->state_dim, ds->action_dim, what, c.max_state_dim, c.max_action_dim);
    }
    if (ds->vocab > (uint32_t)c.vocab) {
        vla_fail("the dataset's instructions are token ids of tokenizer %s, a vocabulary of %u, but %s's text "
                 "table has %d rows: convert the data with the model's tokenizer, or with byte tokens (the data/ tools' "
                 "default) for the presets trained from scratch", ds->tokenizer, ds->vocab, what, c.vocab);
    }
    c.n_cam = ds->cams.n; c.state_dim = ds->state_dim; c.action_dim = ds->action_dim;
    if (max_text > 0) { c.max_text = max_text; }
    const char* problem = smolvla_config_problem(&c);
    if (problem != NULL) { vla_fail("%s does not fit the dataset: %s: pick another preset", what, problem); }
    dataset_warn_text_collisions(ds, c.max_text);
    return c;
}

// The model config of preset `preset` on dataset ds (max_text 0: the preset's).
static inline SmolVLAConfig config_for_data(const char* preset, int max_text, const Dataset* ds) {
    char what[80];
    snprintf(what, sizeof(what), "preset %s", preset);
    return config_with_data(smolvla_preset(preset)->config, what, max_text, ds);
}

// The first field where model sizes `sizes` and config c differ, the fields the data and
// --max-text set (cameras, state and action dims, max_text) aside: no tensor depends on them.
static inline const char* smolvla_sizes_diff(SmolVLAConfig sizes, const SmolVLAConfig* c) {
    sizes.n_cam = c->n_cam; sizes.state_dim = c->state_dim; sizes.action_dim = c->action_dim; sizes.max_text = c->max_text;
    return smolvla_config_diff(&sizes, c);
}

// The preset whose sizes c has, or NULL.
static inline const char* smolvla_preset_of(const SmolVLAConfig* c) {
    for (int i = 0; i < SMOLVLA_N_PRESETS; i++) {
        if (smolvla_sizes_diff(SMOLVLA_PRESETS[i].config, c) == NULL) { return SMOLVLA_PRESETS[i].name; }
    }
    return NULL;
}

// The checkpoint a run starts from: --init, or with -y 1 the newest intact one in the output
// folder (written into buf; a corrupt one is skipped with one line saying so), or NULL to start
// from the seed. Checking a checksum reads the file once more (~2 s for 2.4 GB, then cached).
static inline const char* run_start_checkpoint(const TrainArgs* args, char* buf, size_t size) {
    if (!args->resume) { return args->init; }
    enum { NEWEST = 64 };
    uint64_t steps[NEWEST];
    int n = checkpoint_list(args->output, steps, NEWEST);
    for (int i = 0; i < n; i++) {
        char err[VLA_PATH_MAX + 512];
        checkpoint_path(buf, size, args->output, steps[i]);
        if (checkpoint_verify(buf, err, sizeof(err)) == 0) { return buf; }
        fprintf(stderr, "warning: skipping %s; %s\n", err,
                i + 1 < n ? "falling back to the one before it" : "there is no older one");
    }
    if (n > 0) {
        vla_fail("no intact checkpoint in %s (the %d complete one%s failed the checks above): pick an intact one with "
                 "--init, or start anew with --new-run (the run moves into %s/previous_<N>/) or in another folder (-o)",
                 args->output, n, n == 1 ? "" : "s", args->output);
    }
    // checkpoint files, none of them usable: refused (they may be recovered; a new run would prune
    // them). A log alone is of a run that stopped before its first checkpoint: it moves aside.
    char what[128];
    int checkpoints;
    if (run_folder_holds_run(args->output, what, sizeof(what), &checkpoints) && checkpoints > 0) {
        vla_fail("-y 1: %s holds a run (%s) but no checkpoint that can continue it (the warnings above say why): start "
                 "anew with --new-run (the run moves into %s/previous_<N>/), or continue from a checkpoint of yours with "
                 "--init", args->output, what, args->output);
    }
    if (run_folder.lock_fd >= 0) { run_folder_move_aside(args->output, "-y 1 found no checkpoint to continue"); }
    printf("-y 1: no checkpoint in %s yet: starting from scratch\n", args->output);
    return NULL;
}

// A checkpoint's weights read token ids of its tokenizer: the dataset's must be of the same one.
static inline void run_check_tokenizer(const char* path, const Checkpoint* ck, const Dataset* ds) {
    if (strcmp(ck->tokenizer, ds->tokenizer) != 0) {
        vla_fail("checkpoint %s was trained on token ids of tokenizer %s, the dataset's are of %s: convert the data with "
                 "the checkpoint's tokenizer", path, ck->tokenizer, ds->tokenizer);
    }
}

// The model a run trains. From the seed: -p's sizes. From a checkpoint `from` (-y 1, --init): its
// sizes unless -p is given, and its --train mode unless --train is given. Cameras, state and action
// dims come from the dataset and the text length from --max-text, else from the checkpoint or
// the preset. Continuing a checkpoint then needs all of them unchanged (run_checkpoint_load says
// which differs); a weights-only start (--weights-only) does not, since no tensor depends on them:
// a model imported from LeRobot, or trained on other data, fine-tunes on this dataset as it is.
// With -p too, a weights-only start checks that the checkpoint has the preset's sizes.
static inline SmolVLAConfig run_config(TrainArgs* a, const char* from, const Dataset* ds) {
    if (from == NULL) { return config_for_data(a->preset, a->max_text, ds); }
    CheckpointHeader h;
    char err[VLA_PATH_MAX + 512];
    if (checkpoint_read_header(from, &h, err, sizeof(err)) != 0) { vla_fail("%s", err); }
    if (!a->train_given) { a->train_mode = h.train_mode; }
    if (a->preset_given && !a->weights_only) { return config_for_data(a->preset, a->max_text, ds); }
    char what[VLA_PATH_MAX + 32];
    snprintf(what, sizeof(what), "the model of %s", from);
    SmolVLAConfig c = config_with_data(h.config, what, a->max_text > 0 ? a->max_text : h.config.max_text, ds);
    if (a->preset_given) {
        const char* diff = smolvla_sizes_diff(c, &smolvla_preset(a->preset)->config);
        if (diff != NULL) {
            vla_fail("checkpoint %s has other sizes than preset %s (%s, checkpoint vs preset): drop -p to fine-tune the "
                     "checkpoint's model", from, a->preset, diff);
        }
    } else {
        const char* preset = smolvla_preset_of(&c);
        a->preset = preset != NULL ? preset : "(checkpoint's)";
    }
    return c;
}

// --init FILE --weights-only: the checkpoint's weights (all of them, frozen ones too) as the start
// of a new run of model c on dataset ds: the sizes must be c's (run_config made c from them) and the
// token ids of the same tokenizer; its moments, step, sampler position, seed and statistics are not
// used (the run starts at step 0 with fresh moments, its own seed and the dataset's statistics).
static inline void run_weights_load(const char* path, const SmolVLAConfig* c, const Dataset* ds, Checkpoint* ck) {
    checkpoint_read(path, ck);
    const char* diff = smolvla_sizes_diff(ck->config, c);
    if (diff != NULL) {
        vla_fail("checkpoint %s has other sizes than this run's model (%s, checkpoint vs this run): drop -p to "
                 "fine-tune the checkpoint's model", path, diff);
    }
    run_check_tokenizer(path, ck, ds);
    free(ck->m); free(ck->v);
    ck->m = ck->v = NULL;
    ck->step = 0;
    ck->sampler_pos = 0;
}

// How a run starts, for its config table's "start" row (the "from" row names the checkpoint):
// from the seed, continuing a checkpoint, or from a checkpoint's weights alone (fine-tuning).
static inline const char* run_start_kind(const TrainArgs* a, const char* from) {
    return from == NULL ? "seed" : a->weights_only ? "weights" : "continue";
}

// FNV-1a, 64 bits: the dataset fingerprint's hash (a few MB at most, so speed does not matter).
static inline uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    for (size_t k = 0; k < n; k++) { h = (h ^ p[k]) * 0x100000001B3ULL; }
    return h;
}

// A 64-bit fingerprint of the data a run trains on, never 0: of each shard in order, its sizes
// (cameras, dims, frames, episodes, tasks, tokens, tokenizer), its statistics, episode table and
// task text; not the frames (cheap at start-up, and a version-1 shard fingerprints as its
// version-2 conversion). Checkpoints record it so that a resume on other data is caught.
static inline uint64_t dataset_fingerprint(const Dataset* ds) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < ds->n_shards; i++) {
        const Shard* s = &ds->shards[i];
        Cameras cams = shard_cameras(&s->h);
        uint64_t sizes[9] = {(uint64_t)cams.n, s->h.state_dim, s->h.action_dim, s->h.n_frames, s->h.n_episodes,
                             s->h.n_tasks, s->h.task_bytes, s->h.n_tokens, s->h.vocab};
        h = fnv1a64(h, sizes, sizeof(sizes));
        h = fnv1a64(h, cams.height, (size_t)cams.n * sizeof(uint32_t));
        h = fnv1a64(h, cams.width, (size_t)cams.n * sizeof(uint32_t));
        h = fnv1a64(h, s->h.tokenizer, strnlen(s->h.tokenizer, sizeof(s->h.tokenizer)));
        h = fnv1a64(h, s->stats, 2 * (size_t)(s->h.state_dim + s->h.action_dim) * sizeof(float));
        h = fnv1a64(h, s->episodes, (size_t)s->h.n_episodes * sizeof(ShardEpisode));
        h = fnv1a64(h, s->task_offsets, (size_t)(s->h.n_tasks + 1) * sizeof(uint64_t));
        h = fnv1a64(h, s->task_text, (size_t)s->h.task_bytes);
    }
    return h != 0 ? h : 1;
}

// Writes step `step` of a run: host copies of every fp32 master weight (n_params, table order)
// and the AdamW moments of the elements trainable in args->train_mode (n_trainable each, packed as
// SmolOptDomain), with the dataset's normalization statistics and tokenizer; keeps the newest
// args->keep checkpoints. loss_scale: fp16 builds' dynamic loss scale, NULL where there is none.
static inline void run_checkpoint_save(const TrainArgs* args, const Dataset* ds, const SmolVLAConfig* c, int step,
                                       uint64_t sampler_pos, float* params, size_t n_params, float* m, float* v,
                                       size_t n_trainable, const LossScaleState* loss_scale) {
    int S = c->state_dim, A = c->action_dim;
    float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
    memcpy(stats, ds->state_mean, S * sizeof(float));
    memcpy(stats + S, ds->state_std, S * sizeof(float));
    memcpy(stats + 2 * S, ds->action_mean, A * sizeof(float));
    memcpy(stats + 2 * S + A, ds->action_std, A * sizeof(float));
    Checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.config = *c; ck.train_mode = args->train_mode; ck.step = (uint64_t)step; ck.seed = args->seed;
    ck.sampler_pos = sampler_pos; ck.n_params = n_params; ck.n_trainable = n_trainable;
    ck.balance = args->balance; ck.balance_id = args->balance_id;
    int world = args->ranks * args->nodes;
    ck.run.batch = (uint32_t)args->batch; ck.run.world = (uint32_t)world;
    ck.run.total_batch = (uint64_t)train_global_batch(args, world); ck.run.data_id = dataset_fingerprint(ds);
    if (loss_scale != NULL) { ck.loss_scale = *loss_scale; }
    ck.stats = stats; ck.params = params; ck.m = m; ck.v = v;
    snprintf(ck.tokenizer, sizeof(ck.tokenizer), "%s", ds->tokenizer);
    char path[VLA_PATH_MAX], what[64];
    snprintf(what, sizeof(what), "step %d's checkpoint", step);
    run_folder_check(args->output, what);
    checkpoint_path(path, sizeof(path), args->output, (uint64_t)step);
    checkpoint_write(path, &ck);
    checkpoint_prune(args->output, args->keep);
    free(stats);
}

// What a resume of checkpoint ck by a run of args on dataset ds says: another dataset is refused
// (its weights alone may start a run: --weights-only); another batch or world size is said in one
// line; a checkpoint that records no run gets a note that none of this could be checked.
static inline void run_check_resume(const char* path, const Checkpoint* ck, const TrainArgs* args, const Dataset* ds) {
    const CheckpointRun* was = &ck->run;
    if (was->batch == 0) {
        fprintf(stderr, "note: checkpoint %s records no batch size, world size or dataset (an older train_vla's, or a "
                "converter's): this resume cannot check them\n", path);
        return;
    }
    uint64_t data_id = dataset_fingerprint(ds);
    if (was->data_id != data_id) {
        vla_fail("checkpoint %s trained on another dataset (fingerprint %016llx, -i %s has %016llx): continue it on the "
                 "data it trained on, or start from its weights alone with --init %s --weights-only", path,
                 (unsigned long long)was->data_id, args->input, (unsigned long long)data_id, path);
    }
    int world = args->ranks * args->nodes;
    uint64_t total = (uint64_t)train_global_batch(args, world);
    if (was->batch != (uint32_t)args->batch || was->world != (uint32_t)world || was->total_batch != total) {
        printf("resuming with -b %d on %d rank(s), %llu samples per step (the checkpoint's run: -b %u on %u, %llu): the "
               "sampler continues from sample %llu; %s\n", args->batch, world, (unsigned long long)total, was->batch,
               was->world, (unsigned long long)was->total_batch, (unsigned long long)ck->sampler_pos,
               was->total_batch != total ? "the loss curve's steps change size"
                                         : "steps keep their size, the losses their values only to rounding");
    }
}

// Reads a checkpoint to continue the model of config c on dataset ds with args' train mode and
// balance (args->balance_id once the trainer built its TaskBalance); fails if it was written for
// another model, mode, tokenizer, balance or dataset, and says what changes with the batch.
static inline void run_checkpoint_load(const char* path, const SmolVLAConfig* c, const TrainArgs* args, const Dataset* ds,
                                       Checkpoint* ck) {
    int mode = args->train_mode, balance = args->balance;
    uint64_t balance_id = args->balance_id;
    checkpoint_read(path, ck);
    if (ck->balance != balance) {
        vla_fail("checkpoint %s trained with --balance %s, this run with --balance %s: pass --balance %s to continue it",
                 path, BALANCE_NAMES[ck->balance], BALANCE_NAMES[balance], BALANCE_NAMES[ck->balance]);
    }
    if (ck->balance_id != balance_id) {
        vla_fail("checkpoint %s balanced other task weights (or another task count) than this run: pass the "
                 "--task-weights it trained with to continue it", path);
    }
    const char* diff = smolvla_config_diff(&ck->config, c);
    if (diff != NULL) {
        vla_fail("checkpoint %s was written for another model (%s, checkpoint vs this run): use the same preset, "
                 "--max-text and dataset, or another output folder (-o)", path, diff);
    }
    if (ck->train_mode != mode) {
        vla_fail("checkpoint %s trained with --train %s, this run with --train %s: pass --train %s to continue it",
                 path, TRAIN_MODE_NAMES[ck->train_mode], TRAIN_MODE_NAMES[mode], TRAIN_MODE_NAMES[ck->train_mode]);
    }
    run_check_tokenizer(path, ck, ds);
    run_check_resume(path, ck, args, ds);
}

// Whether a run that continues from checkpoint `from` at step `start` has steps left to take
// (1), or is done (0, said on stdout). A checkpoint past the run's end is refused.
static inline int run_has_steps_left(const char* from, int start, int steps) {
    if (start > steps) {
        vla_fail("checkpoint %s is at step %d, past this run's end (-n %d): pass -n above %d to train further, or "
                 "another output folder (-o) for a new run", from, start, steps, start);
    }
    if (start == steps) { printf("already at step %d of %d: nothing to do (raise -n to train further)\n", start, steps); }
    return start < steps;
}

// The batch the end-of-run evaluation samples actions for: B samples from sampler position pos,
// with the flow noise of step `step` (its eps is the starting noise).
static inline void eval_batch(SmolBatch* batch, const Dataset* ds, const SmolVLAConfig* c, uint64_t seed, uint64_t pos,
                              int step) {
    Sampler sampler;
    sampler_init(&sampler, ds->n_samples, seed);
    uint64_t* idx = (uint64_t*)mallocCheck((size_t)batch->B * sizeof(uint64_t));
    batch_fill_indices(idx, &sampler, pos, 0, 0, batch->B, 1, 0);
    batch_fill(batch, ds, c, idx, seed, (uint64_t)step, 0, 0);
    char err[VLA_PATH_MAX + 256];
    if (dataset_unchanged(ds, idx, batch->B, err, sizeof(err)) != 0) { vla_fail("%s", err); }
    free(idx);
    sampler_free(&sampler);
}

// Mean squared error of sampled actions (B, H, A: the dataset's dims, data units) against the
// batch's over the slots inside the episode, in the data's own units.
static inline float action_mse(const SmolBatch* batch, const Dataset* ds, const SmolVLAConfig* c, const float* sampled) {
    int A = c->action_dim, Amax = c->max_action_dim, H = c->chunk;
    double se = 0.0;
    size_t n = 0;
    for (size_t k = 0; k < (size_t)batch->B * H * A; k++) {
        size_t slot = k / A;
        int dim = (int)(k % A);
        if (batch->action_is_pad[slot] != 0.0f) { continue; }
        double truth = (double)batch->actions[slot * Amax + dim] * ds->action_std[dim] + ds->action_mean[dim];
        se += (sampled[k] - truth) * (sampled[k] - truth);
        n++;
    }
    return (float)(se / (double)(n > 0 ? n : 1));
}

// ----------------------------------------------------------------------------
// multi-node bootstrap: node 0 hands a small payload (NCCL's unique id) to the other nodes over one
// TCP exchange, after checking that every node runs the same configuration

#define BOOT_MAGIC 0x544f4f42u  // "BOOT"
#define BOOT_VERSION 4u  // 2: min_lr_frac and augment joined the fields; 3: SmolVLA's config and train mode;
                         // 4: fp16's --loss-scale and --loss-scale-window (ranks scaled apart sum wrong gradients)
#define BOOT_MAX_PAYLOAD 1024

// What every node of a run must agree on; floats go as their bits so they compare exactly
#define BOOT_FIELDS(X) \
    X(gpus_per_node) X(nodes) X(batch) X(accum) X(zero) X(steps) X(warmup) X(start_step) X(seed) X(samples) \
    X(lr_bits) X(min_lr_frac_bits) X(weight_decay_bits) X(clip_bits) X(lr_scale) X(augment) X(train_mode) \
    X(loss_scale_bits) X(loss_scale_window)

typedef struct {
    uint32_t magic, version;
    int32_t node_rank, pad;
    SmolVLAConfig config;
#define BOOT_FIELD_(f) int64_t f;
    BOOT_FIELDS(BOOT_FIELD_)
#undef BOOT_FIELD_
} BootIdentity;

typedef struct {
    uint32_t status;  // 0: welcome, the payload follows; 1: refused, a message follows
    uint32_t length;
} BootReply;

static inline int64_t boot_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (int64_t)u;
}

// This node's identity for a run of `gpus_per_node` x `nodes` GPUs starting at `start_step` on
// `samples` samples
static inline BootIdentity boot_identity(const TrainArgs* a, const SmolVLAConfig* c, int node_rank, int nodes,
                                         int start_step, uint64_t samples) {
    BootIdentity id;
    memset(&id, 0, sizeof(id));
    id.magic = BOOT_MAGIC; id.version = BOOT_VERSION; id.node_rank = node_rank; id.config = *c;
    id.gpus_per_node = a->ranks; id.nodes = nodes; id.batch = a->batch; id.accum = a->accum; id.zero = a->zero;
    id.steps = a->steps; id.warmup = a->warmup; id.start_step = start_step; id.seed = (int64_t)a->seed;
    id.samples = (int64_t)samples; id.lr_bits = boot_float_bits(a->lr_base);
    id.min_lr_frac_bits = boot_float_bits(a->min_lr_frac); id.weight_decay_bits = boot_float_bits(a->weight_decay);
    id.clip_bits = boot_float_bits(a->grad_clip); id.lr_scale = a->lr_scale; id.augment = a->augment;
    id.train_mode = a->train_mode;
    id.loss_scale_bits = boot_float_bits(a->loss_scale); id.loss_scale_window = a->loss_scale_window;
    return id;
}

// Names the first field where two identities differ (into msg), or returns 0 when they agree
static inline int boot_identity_diff(const BootIdentity* a, const BootIdentity* b, char* msg, size_t size) {
    const char* cfg = smolvla_config_diff(&a->config, &b->config);
    if (cfg != NULL) { snprintf(msg, size, "model %s", cfg); return 1; }
#define BOOT_DIFF_(f) \
    if (a->f != b->f) { snprintf(msg, size, #f " %lld vs %lld", (long long)a->f, (long long)b->f); return 1; }
    BOOT_FIELDS(BOOT_DIFF_)
#undef BOOT_DIFF_
    return 0;
}

// What node 0 makes of the n bytes a connection sent as its hello. fds[k] >= 0 (k from 1): node
// k has joined. BOOT_HELLO_JOINS: node *rank joins; BOOT_HELLO_REFUSED: a node of this run that
// must not join, why says so in one line; BOOT_HELLO_FOREIGN: not one of ours (a port scanner, an
// older train_vla), to be dropped without an answer.
enum { BOOT_HELLO_FOREIGN = 0, BOOT_HELLO_JOINS = 1, BOOT_HELLO_REFUSED = 2 };
static inline int boot_hello_parse(const BootIdentity* self, const void* msg, size_t n, const int* fds, int* rank,
                                   char* why, size_t why_size) {
    BootIdentity other;
    if (n != sizeof(other)) { return BOOT_HELLO_FOREIGN; }
    memcpy(&other, msg, sizeof(other));
    if (other.magic != BOOT_MAGIC || other.version != BOOT_VERSION) { return BOOT_HELLO_FOREIGN; }
    char diff[192];
    if (other.node_rank < 1 || other.node_rank >= self->nodes || fds[other.node_rank] >= 0) {
        snprintf(why, why_size, "node rank %d is out of range or taken twice (--nodes %lld)", other.node_rank,
                 (long long)self->nodes);
        return BOOT_HELLO_REFUSED;
    }
    if (boot_identity_diff(self, &other, diff, sizeof(diff))) {
        snprintf(why, why_size, "node %d disagrees with node 0 on %s (node 0 vs node %d)", other.node_rank, diff,
                 other.node_rank);
        return BOOT_HELLO_REFUSED;
    }
    *rank = other.node_rank;
    return BOOT_HELLO_JOINS;
}

// What a node makes of node 0's reply header (the n bytes received): BOOT_REPLY_PAYLOAD: the
// payload of payload_bytes follows; BOOT_REPLY_REFUSED: a refusal of *length bytes follows, fewer
// than text_size; BOOT_REPLY_BAD: neither (not node 0 of this run).
enum { BOOT_REPLY_BAD = 0, BOOT_REPLY_PAYLOAD = 1, BOOT_REPLY_REFUSED = 2 };
static inline int boot_reply_parse(const void* msg, size_t n, size_t payload_bytes, size_t text_size, uint32_t* length) {
    BootReply reply;
    if (n != sizeof(reply)) { return BOOT_REPLY_BAD; }
    memcpy(&reply, msg, sizeof(reply));
    *length = reply.length;
    if (reply.status == 0 && reply.length == payload_bytes) { return BOOT_REPLY_PAYLOAD; }
    if (reply.status == 1 && reply.length < text_size) { return BOOT_REPLY_REFUSED; }
    return BOOT_REPLY_BAD;
}

// Node 0's refusal (n bytes, up to a NUL) as one printable line in out: control bytes become '?'
static inline void boot_refusal_text(const void* msg, size_t n, char* out, size_t size) {
    const uint8_t* p = (const uint8_t*)msg;
    size_t k = 0;
    for (; k < n && k + 1 < size && p[k] != 0; k++) { out[k] = p[k] < 0x20 || p[k] == 0x7f ? '?' : (char)p[k]; }
    if (size > 0) { out[k] = '\0'; }
}

// All of buf over fd, before the deadline (wall_seconds); 0 on success
static inline int boot_io(int fd, void* buf, size_t n, int sending, double deadline) {
    uint8_t* p = (uint8_t*)buf;
    while (n > 0) {
        double left = deadline - wall_seconds();
        if (left <= 0.0) { return 1; }
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        if (poll(&pfd, 1, (int)(left * 1000.0) + 1) <= 0) { continue; }
        ssize_t r = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r <= 0) {
            if (r < 0 && (errno == EINTR || errno == EAGAIN)) { continue; }
            return 1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

// Node 0: listens on the master's port, takes one hello from each of the other nodes within
// timeout_s, checks that they agree with its own identity, and sends them the payload.
// Other nodes: connect to the master (retrying until timeout_s, node 0 may start later), send
// their identity and receive the payload. 0 on success; else 1 and a one-line reason in err.
static inline int bootstrap_exchange(const char* master, const BootIdentity* self, void* payload, size_t payload_bytes,
                                     double timeout_s, char* err, size_t err_size) {
    char host[256], port[16];
    const char* problem = boot_parse_master(master, host, sizeof(host), port, sizeof(port));
    if (problem != NULL) { snprintf(err, err_size, "--master %s: %s", master, problem); return 1; }
    if (payload_bytes > BOOT_MAX_PAYLOAD) { snprintf(err, err_size, "bootstrap payload too large"); return 1; }
    double deadline = wall_seconds() + timeout_s;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int nodes = (int)self->nodes;
    if (self->node_rank == 0) {
        hints.ai_flags = AI_PASSIVE;
        if (getaddrinfo(NULL, port, &hints, &res) != 0 || res == NULL) {
            snprintf(err, err_size, "--master %s: cannot listen on port %s", master, port);
            return 1;
        }
        int lfd = socket(res->ai_family, SOCK_STREAM, 0), one = 1;
        if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, nodes) != 0) {
            int e = errno;
            snprintf(err, err_size, "--master %s: cannot listen on port %s of this machine (%s)%s", master, port,
                     strerror(e), e == EADDRINUSE ? ": the port is in use, pick another" : "");
            if (lfd >= 0) { close(lfd); }
            freeaddrinfo(res);
            return 1;
        }
        freeaddrinfo(res);
        int* fds = (int*)callocCheck(nodes, sizeof(int));
        int joined = 0, failed = 0;
        for (int k = 1; k < nodes; k++) { fds[k] = -1; }
        while (joined < nodes - 1 && !failed) {
            double left = deadline - wall_seconds();
            struct pollfd pfd = {lfd, POLLIN, 0};
            if (left <= 0.0 || poll(&pfd, 1, (int)(left * 1000.0) + 1) <= 0) {
                if (wall_seconds() < deadline) { continue; }
                snprintf(err, err_size, "only %d of the %d other node(s) reached the master %s within %.0f s: start every "
                         "node with --nodes %d and this --master", joined, nodes - 1, master, timeout_s, nodes);
                failed = 1;
                break;
            }
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0) { continue; }
            // each hello gets a few seconds of its own, so a connection that stays silent (a port
            // scanner) cannot hold up the real nodes
            BootIdentity other;
            char why[320];
            int rank = 0, hello = boot_io(fd, &other, sizeof(other), 0, fmin(deadline, wall_seconds() + 5.0)) != 0
                                      ? BOOT_HELLO_FOREIGN
                                      : boot_hello_parse(self, &other, sizeof(other), fds, &rank, why, sizeof(why));
            if (hello == BOOT_HELLO_FOREIGN) {
                close(fd);  // not one of ours, or too slow: keep waiting for the real nodes
                continue;
            }
            if (hello == BOOT_HELLO_JOINS) {
                fds[rank] = fd;
                joined++;
                continue;
            }
            BootReply reply = {1, (uint32_t)strlen(why)};
            boot_io(fd, &reply, sizeof(reply), 1, deadline);
            boot_io(fd, why, reply.length, 1, deadline);
            close(fd);
            snprintf(err, err_size, "%s: start every node with the same flags and data", why);
            failed = 1;
        }
        for (int k = 1; k < nodes; k++) {
            if (fds[k] < 0) { continue; }
            BootReply reply = {(uint32_t)failed, 0};
            const char* refusal = "another node disagrees with node 0: see node 0's error";
            reply.length = failed ? (uint32_t)strlen(refusal) : (uint32_t)payload_bytes;
            boot_io(fds[k], &reply, sizeof(reply), 1, deadline + 5.0);
            boot_io(fds[k], failed ? (void*)refusal : payload, reply.length, 1, deadline + 5.0);
            close(fds[k]);
        }
        free(fds);
        close(lfd);
        return failed;
    }
    if (getaddrinfo(host, port, &hints, &res) != 0 || res == NULL) {
        snprintf(err, err_size, "--master %s: cannot resolve host %s: give node 0's name or address", master, host);
        return 1;
    }
    int fd = -1;
    while (fd < 0 && wall_seconds() < deadline) {  // node 0 may not listen yet: retry until the deadline
        for (struct addrinfo* ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            int s = socket(ai->ai_family, SOCK_STREAM, 0);
            if (s < 0) { continue; }
            fcntl(s, F_SETFL, O_NONBLOCK);
            int rc = connect(s, ai->ai_addr, ai->ai_addrlen);
            if (rc != 0 && errno == EINPROGRESS) {
                struct pollfd pfd = {s, POLLOUT, 0};
                int soerr = 1;
                socklen_t len = sizeof(soerr);
                if (poll(&pfd, 1, 1000) > 0 && getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) { rc = 0; }
            }
            if (rc == 0) { fd = s; } else { close(s); }
        }
        if (fd < 0) { usleep(200000); }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, err_size, "could not reach the master %s within %.0f s: start node 0 with the same --master, and "
                 "check the address, the port and the firewall", master, timeout_s);
        return 1;
    }
    BootReply reply;
    char raw[512] = "", text[512];
    uint32_t length = 0;
    int bad = boot_io(fd, (void*)self, sizeof(*self), 1, deadline) != 0 || boot_io(fd, &reply, sizeof(reply), 0, deadline) != 0;
    int kind = bad ? BOOT_REPLY_BAD : boot_reply_parse(&reply, sizeof(reply), payload_bytes, sizeof(raw), &length);
    if (kind == BOOT_REPLY_PAYLOAD) {
        bad = boot_io(fd, payload, payload_bytes, 0, deadline) != 0;
        close(fd);
        if (!bad) { return 0; }
    } else if (kind == BOOT_REPLY_REFUSED) {
        boot_io(fd, raw, length, 0, deadline);
        close(fd);
        boot_refusal_text(raw, length, text, sizeof(text));
        snprintf(err, err_size, "the master %s refused node %d: %s", master, self->node_rank, text);
        return 1;
    } else {
        close(fd);
    }
    snprintf(err, err_size, "the master %s did not answer node %d within %.0f s: check that node 0 runs the same "
             "train_vla", master, self->node_rank, timeout_s);
    return 1;
}

// ----------------------------------------------------------------------------
// policies: a checkpoint serving raw observations (libvla.so from train_vla.c, libvla_gpu.so from
// train_vla.cu, both behind scripts/vla_policy.py)

#ifdef __cplusplus
#define VLA_API extern "C" __attribute__((visibility("default")))
#else
#define VLA_API __attribute__((visibility("default")))
#endif

// Makes room in obs for B observations of cameras `cams`; *capacity is what it holds (0 before
// the first call). Frames of other sizes than last time re-lay the batch out.
static inline void policy_reserve(SmolBatch* obs, int* capacity, const SmolVLAConfig* c, const Cameras* cams, int B) {
    if (B <= *capacity && cameras_equal(&obs->cams, cams)) { return; }
    if (*capacity > 0) { smolvla_batch_free(obs); }
    smolvla_batch_alloc(obs, c, cams, B);
    *capacity = B;
}

// What vla_policy_act and vla_policy_act_tokens return (libvla.so and libvla_gpu.so alike).
enum {
    POLICY_OK = 0,
    POLICY_BAD_BATCH = 1,   // B < 1
    POLICY_BAD_CAMERA = 2,  // a camera size outside [1, VLA_MAX_IMG], or one whose resize leaves nothing
    POLICY_BAD_TOKENS = 3,  // a negative token count, or an id outside [0, vocab)
    POLICY_NOT_BYTES = 4,   // strings for a checkpoint whose tokenizer is not "bytes": pass its token ids
};

// Strings are token ids only under the "bytes" tokenizer (an instruction's UTF-8 bytes); a checkpoint
// trained on another tokenizer's ids takes ids (vla_policy_act_tokens), never silent byte ids.
static inline int policy_takes_strings(const char* tokenizer) { return strcmp(tokenizer, SHARD_TOKENIZER_BYTES) == 0; }

// B instructions as token ids: ids holds them one after another, n_ids[b] for observation b.
static inline int policy_check_tokens(const SmolVLAConfig* c, int B, const int32_t* ids, const int32_t* n_ids) {
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        if (n_ids[b] < 0) { return POLICY_BAD_TOKENS; }
        for (int32_t k = 0; k < n_ids[b]; k++, at++) {
            if (ids[at] < 0 || ids[at] >= c->vocab) { return POLICY_BAD_TOKENS; }
        }
    }
    return POLICY_OK;
}

// The model's batch for B raw observations: images[k] camera k's frames u8 (B, h_k, w_k, 3) HWC of
// any size (obs->cams, the model resizes them); the instructions as `texts` (B UTF-8 strings, their
// bytes the ids: the "bytes" tokenizer) or, texts NULL, as token ids (`ids` and `n_ids` as
// policy_check_tokens takes them), cut to max_text and right-padded with pad_token as the trainer's
// batches; raw state (B, S) normalized with the checkpoint's statistics (state_mean(S) state_std(S)
// ...) and zero-padded; the starting noise in obs->eps: `noise` (B, H, max_action_dim) if given,
// else drawn from `seed`.
static inline void policy_observations(SmolBatch* obs, const SmolVLAConfig* c, const float* stats, int B,
                                       const uint8_t* const* images, const char* const* texts, const int32_t* ids,
                                       const int32_t* n_ids, const float* state, const float* noise, uint64_t seed) {
    int S = c->state_dim, Smax = c->max_state_dim, HA = c->chunk * c->max_action_dim;
    obs->B = B;
    for (int k = 0; k < c->n_cam; k++) {
        memcpy(obs->images[k], images[k], (size_t)B * (camera_offset(&obs->cams, k + 1) - camera_offset(&obs->cams, k)));
    }
    const float *state_mean = stats, *state_std = stats + S;
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        if (texts != NULL) {
            size_t len = strlen(texts[b]);
            if (len > (size_t)c->max_text) { len = (size_t)c->max_text; }
            int32_t* row = obs->tokens + (size_t)b * c->max_text;
            tokens_from_bytes(row, (const uint8_t*)texts[b], len);
            batch_set_text(obs, c, b, row, len);
        } else {
            batch_set_text(obs, c, b, ids + at, (size_t)n_ids[b]);
            at += (size_t)n_ids[b];
        }
        for (int d = 0; d < Smax; d++) {
            obs->state[(size_t)b * Smax + d] = d < S ? (state[(size_t)b * S + d] - state_mean[d]) / state_std[d] : 0.0f;
        }
        if (noise != NULL) {
            memcpy(obs->eps + (size_t)b * HA, noise + (size_t)b * HA, (size_t)HA * sizeof(float));
        } else {
            flow_noise_width(c->chunk, c->max_action_dim, seed, 0, (uint64_t)b, &obs->t[b], obs->eps + (size_t)b * HA);
        }
    }
}

#endif  // VLA_H
