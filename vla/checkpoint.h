/*
vla/checkpoint.h: checkpoints, version 2: every weight, the moments of the trainable elements,
the normalization statistics and what the run was; written atomically with a CRC-32, read with
every field checked against the config and the file, listed and pruned in a folder. Needs
config.h, shards.h, sampler.h, loss_scale.h and atomic_file.h.
*/
#ifndef VLA_CHECKPOINT_H
#define VLA_CHECKPOINT_H

#include "common.h"
#include "config.h"
#include "shards.h"
#include "sampler.h"
#include "loss_scale.h"
#include "atomic_file.h"
#include <dirent.h>

// ----------------------------------------------------------------------------
// checkpoints, version 2: header (512 bytes), the dataset's normalization
// statistics state_mean(S) state_std(S) action_mean(A) action_std(A), every fp32 master weight
// in table order (n_params, frozen ones included, so a checkpoint is the whole model), then AdamW's
// m and v for the elements that train in the header's train mode only (n_trainable each, packed
// as FlowOptDomain packs them: each tensor's trainable prefix, in table order). Independent of
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
    int32_t config[FLOW_CONFIG_STORED];  // FlowConfig's fields in order but the last, family (below)
    int32_t train_mode;    // TRAIN_MODE_*: which elements have moments
    int32_t family;        // the config's family: files from before pi0 hold 0 (their padding), SmolVLA
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

// The header's config, and the config into a header
static inline FlowConfig ckpt_header_config(const CheckpointHeader* h) {
    FlowConfig c;
    memcpy(&c, h->config, sizeof(h->config));
    c.family = h->family;
    return c;
}
static inline void ckpt_header_put_config(CheckpointHeader* h, const FlowConfig* c) {
    memcpy(h->config, c, sizeof(h->config));
    h->family = c->family;
}
VLA_STATIC_ASSERT(sizeof(CheckpointHeader) == CKPT_HEADER_BYTES, "checkpoint header is 512 bytes");
VLA_STATIC_ASSERT(offsetof(CheckpointHeader, step) == 120 && offsetof(CheckpointHeader, tokenizer) == 168,
                  "checkpoint header fields are at the offsets the format defines");
VLA_STATIC_ASSERT(offsetof(CheckpointHeader, loss_scale) == 248 &&
                      offsetof(CheckpointHeader, loss_scale_skipped) == 256,
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
    FlowConfig config;
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

static inline uint64_t ckpt_file_size(const FlowConfig* c, uint64_t n_params, uint64_t n_trainable) {
    return CKPT_HEADER_BYTES + 8ULL * (uint64_t)(c->state_dim + c->action_dim) + 4ULL * n_params + 8ULL * n_trainable;
}

// The element counts a config and mode imply: (all weights, those with moments).
static inline void ckpt_counts(const FlowConfig* c, int mode, uint64_t* n_params, uint64_t* n_trainable) {
    FlowParamTable t;
    flow_table_build(c, &t);
    *n_params = t.total;
    *n_trainable = flow_trainable_count(&t, mode);
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
    ckpt_header_put_config(&h, &ck->config);
    h.magic = CKPT_MAGIC; h.version = CKPT_VERSION; h.train_mode = ck->train_mode;
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

// Reads the header and checks it against the file: the config by flow_config_problem, the
// train mode, the counts and sizes in checked arithmetic, the step and sampler position in range.
// Returns 0 on success; on failure writes a message into err (so callers can skip an incomplete
// file or fail with it).
static inline int checkpoint_read_header(const char* file, CheckpointHeader* h, char* err, size_t err_size) {
    char said[VLA_SAID_BYTES];  // the path as messages quote it (path_said)
    const char* path = path_said(file, said);
    struct stat st;
    if (stat(file, &st) == 0 && !S_ISREG(st.st_mode)) {  // (checked before opening: a pipe would block)
        snprintf(err, err_size, "%s is %s, not a checkpoint file: pass a ckpt_*.bin file", path,
                 S_ISDIR(st.st_mode) ? "a folder" : "a device, pipe or socket");
        return 1;
    }
    FILE* f = fopen(file, "rb");
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
        snprintf(err, err_size,
                 "checkpoint %s has version 1: it holds the model train_vla trained before SmolVLA, which "
                 "this build no longer reads: start a new run",
                 path);
        return 1;
    }
    if (got != sizeof(*h)) {
        snprintf(err, err_size, "checkpoint %s is %lld bytes, shorter than its header: it is truncated", path,
                 (long long)st.st_size);
        return 1;
    }
    if (h->magic != CKPT_MAGIC) {
        snprintf(err, err_size, "%s is not a train_vla checkpoint (bad magic 0x%08x)", path, h->magic);
        return 1;
    }
    if (h->version != CKPT_VERSION) {
        snprintf(err, err_size, "checkpoint %s has version %u, this build reads %u", path, h->version, CKPT_VERSION);
        return 1;
    }
    FlowConfig config = ckpt_header_config(h);
    const char* problem = flow_config_problem(&config);
    if (problem != NULL) {
        snprintf(err, err_size, "checkpoint %s holds a bad config (%s): it is corrupt", path, problem);
        return 1;
    }
    if (h->train_mode < 0 || h->train_mode >= TRAIN_MODE_COUNT) {
        snprintf(err, err_size,
                 "checkpoint %s holds train mode %d, not one of 0 (expert), 1 (vlm), 2 (all): it is corrupt", path,
                 h->train_mode);
        return 1;
    }
    if (memchr(h->tokenizer, '\0', sizeof(h->tokenizer)) == NULL || !tokenizer_name_printable(h->tokenizer)) {
        snprintf(err, err_size,
                 "checkpoint %s names no tokenizer (or an unterminated one, or one not printable ASCII): it "
                 "is corrupt",
                 path);
        return 1;
    }
    if (h->balance >= BALANCE_COUNT || (h->balance == BALANCE_NONE) != (h->balance_id == 0)) {
        snprintf(err, err_size,
                 "checkpoint %s holds balance mode %u with weights fingerprint %llu, not a pair a trainer "
                 "writes: it is corrupt",
                 path, h->balance, (unsigned long long)h->balance_id);
        return 1;
    }
    // the loss scale as train_vla writes it: 0 (none), or a scale in [1, VLA_LOSS_SCALE_MAX] with
    // fewer clean steps than the largest window and no more skipped steps than steps
    if (h->loss_scale == 0.0f
            ? (h->loss_scale_clean != 0 || h->loss_scale_skipped != 0)
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
        snprintf(err, err_size,
                 "checkpoint %s records -b %u on %u rank(s) and %llu samples per step, not a run a trainer "
                 "writes: it is corrupt",
                 path, h->batch, h->world, (unsigned long long)h->total_batch);
        return 1;
    }
    uint64_t n_params, n_trainable;  // bounded: flow_config_problem checked the count
    ckpt_counts(&config, h->train_mode, &n_params, &n_trainable);
    uint64_t size = ckpt_file_size(&config, n_params, n_trainable);
    if (h->n_params != n_params || h->n_trainable != n_trainable || h->file_size != size ||
        (uint64_t)st.st_size != size) {
        snprintf(err, err_size, "checkpoint %s is %lld bytes, its header implies %llu: it is truncated or corrupt",
                 path, (long long)st.st_size, (unsigned long long)size);
        return 1;
    }
    // every optimizer step consumes at least one sample, and fewer than 2^33
    if (h->step > VLA_MAX_STEPS || h->sampler_pos < h->step || h->sampler_pos > (h->step << 33)) {
        snprintf(err, err_size,
                 "checkpoint %s says step %llu after %llu samples, out of range (steps 0 to %d, at least "
                 "one sample each): it is corrupt",
                 path, (unsigned long long)h->step, (unsigned long long)h->sampler_pos, VLA_MAX_STEPS);
        return 1;
    }
    return 0;
}

// Loads a whole checkpoint, allocating its arrays. Returns 0, or 1 with the reason in err and
// nothing allocated.
static inline int checkpoint_read_checked(const char* file, Checkpoint* ck, char* err, size_t err_size) {
    char said[VLA_SAID_BYTES];  // the path as messages quote it (path_said)
    const char* path = path_said(file, said);
    memset(ck, 0, sizeof(*ck));
    CheckpointHeader h;
    if (checkpoint_read_header(file, &h, err, err_size) != 0) { return 1; }
    ck->config = ckpt_header_config(&h); ck->train_mode = h.train_mode; ck->step = h.step; ck->seed = h.seed;
    ck->sampler_pos = h.sampler_pos; ck->n_params = h.n_params; ck->n_trainable = h.n_trainable;
    ck->balance = (int)h.balance; ck->balance_id = h.balance_id;
    ck->loss_scale.scale = h.loss_scale; ck->loss_scale.clean = h.loss_scale_clean;
    ck->loss_scale.skipped = h.loss_scale_skipped;
    ck->run.batch = h.batch; ck->run.world = h.world; ck->run.total_batch = h.total_batch; ck->run.data_id = h.data_id;
    ck->has_crc = (h.flags & CKPT_FLAG_CRC) != 0;
    memcpy(ck->tokenizer, h.tokenizer, sizeof(ck->tokenizer));
    int S = ck->config.state_dim, A = ck->config.action_dim;
    size_t n_stats = 2 * (size_t)(S + A), nt = (size_t)h.n_trainable;
    ck->stats = (float*)mallocCheck(n_stats * sizeof(float));
    ck->params = (float*)mallocCheck(h.n_params * sizeof(float));
    ck->m = (float*)mallocCheck((nt > 0 ? nt : 1) * sizeof(float));
    ck->v = (float*)mallocCheck((nt > 0 ? nt : 1) * sizeof(float));
    FILE* f = fopen(file, "rb");
    int bad = f == NULL || fseeko(f, (off_t)sizeof(h), SEEK_SET) != 0 ||
              fread(ck->stats, sizeof(float), n_stats, f) != n_stats ||
              fread(ck->params, 4, h.n_params, f) != h.n_params || fread(ck->m, 4, nt, f) != nt ||
              fread(ck->v, 4, nt, f) != nt;
    if (f != NULL) { fclose(f); }
    if (bad) {
        snprintf(err, err_size, "checkpoint %s: short read: the file changed while loading or is truncated", path);
    }
    // the statistics as trainers write them: finite means, stds of at least VLA_MIN_STD
    for (int i = 0; i < 2 * (S + A) && !bad; i++) {
        int is_std = i < 2 * S ? i >= S : i >= 2 * S + A;
        if (!isfinite(ck->stats[i]) || (is_std && !(ck->stats[i] >= VLA_MIN_STD))) {
            snprintf(err, err_size,
                     "checkpoint %s: normalization statistic %d is %g (NaN, Inf or a std below %g): it is "
                     "corrupt",
                     path, i, (double)ck->stats[i], (double)VLA_MIN_STD);
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
            snprintf(err, err_size,
                     "checkpoint %s: checksum mismatch: the file is corrupt (CRC-32 0x%08x, its header says "
                     "0x%08x)",
                     path, crc, h.crc);
            bad = 1;
        }
    }
    // finite weights (a run that diverged writes none: it stops at a non-finite loss); the first
    // bad one is named by its tensor. One pass over memory, cheap beside reading the file.
    if (!bad) {
        FlowParamTable t;
        flow_table_build(&ck->config, &t);
        for (int i = 0; i < FLOW_NUM_TENSORS && !bad; i++) {
            const float* w = ck->params + t.spec[i].offset;
            for (size_t k = 0; k < t.spec[i].numel; k++) {
                if (!isfinite(w[k])) {
                    snprintf(err, err_size,
                             "checkpoint %s: weight %zu of %s (%zu elements) is %g: its weights are not "
                             "finite, the run that wrote it diverged",
                             path, k, t.spec[i].name, t.spec[i].numel, (double)w[k]);
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
static inline int checkpoint_verify(const char* file, char* err, size_t err_size) {
    char said[VLA_SAID_BYTES];  // the path as messages quote it (path_said)
    const char* path = path_said(file, said);
    CheckpointHeader h;
    if (checkpoint_read_header(file, &h, err, err_size) != 0) { return 1; }
    if ((h.flags & CKPT_FLAG_CRC) == 0) { return 0; }
    FILE* f = fopen(file, "rb");
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
        vla_fail("checkpoint path in %.80s... is longer than %zu bytes: use a shorter output folder (-o)", dir,
                 size - 1);
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

#endif  // VLA_CHECKPOINT_H
