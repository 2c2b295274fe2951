/*
vla/dataset.h: one or more shards read as one dataset (with pooled normalization statistics),
and the batch the model reads, assembled from it: images at their stored size, instruction ids
and their mask, normalized and padded state and actions. Needs config.h and shards.h.
*/
#ifndef VLA_DATASET_H
#define VLA_DATASET_H

#include "common.h"
#include "config.h"
#include "shards.h"
#include <dirent.h>

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
        if (stat(tok, &st) != 0) {
            int e = errno;
            char said[VLA_SAID_BYTES];
            vla_fail("dataset path %s: %s: check -i", path_said(tok, said), strerror(e));
        }
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
        for (int j = 0; j < i && !failed; j++) {  // one file twice would be trained on twice as often, unsaid
            if (ds->shards[j].dev == s->dev && ds->shards[j].ino == s->ino) {
                snprintf(err, err_size, "-i names the shard %s twice (as %s and as %s): name each shard once (to weigh "
                         "tasks, --balance tasks --task-weights)", files[j], files[j], files[i]);
                failed = 1;
            }
        }
        if (failed) { continue; }
        if (i == 0) {
            ds->n_cam = s->h.n_cam;
            ds->img = s->h.img;
            ds->state_dim = s->h.state_dim;
            ds->action_dim = s->h.action_dim;
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
                snprintf(err, err_size,
                         "%s has cameras of %s pixels but %s has %s (height x width): shards of one dataset "
                         "must agree",
                         files[i], cameras_describe(&cams, mine, sizeof(mine)), files[0],
                         cameras_describe(&ds->cams, first, sizeof(first)));
                failed = 1;
            } else if (strcmp(s->h.tokenizer, ds->tokenizer) != 0 || s->h.vocab != ds->vocab) {
                snprintf(err, err_size,
                         "%s has the token ids of tokenizer %s (vocabulary %u) but %s has %s (%u): shards of "
                         "one dataset must agree: convert them with one tokenizer",
                         files[i], s->h.tokenizer, s->h.vocab, files[0], ds->tokenizer, ds->vocab);
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
                    snprintf(err, err_size,
                             "%s: normalization statistics hold NaN, Inf or a negative std: regenerate the "
                             "shard",
                             ds->shards[i].path);
                    dataset_close(ds);
                    return 1;
                }
                sum += n * m;
                sq += n * (sd * sd + m * m);
            }
            double mean = sum / (double)ds->n_samples, var = sq / (double)ds->n_samples - mean * mean;
            double sd = sqrt(var > 0.0 ? var : 0.0);
            means[which][d] = (float)mean;
            stds[which][d] =
                ds->n_shards == 1 ? ds->shards[0].stats[(which == 0 ? 0 : 2 * S) + dims[which] + d] : (float)sd;
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
} Batch;

// Why the model of config c cannot read dataset ds, or NULL when it can.
static inline const char* flow_data_problem(const FlowConfig* c, const Dataset* ds) {
    static char msg[256];
    if (c->n_cam != ds->cams.n || c->state_dim != (int)ds->state_dim || c->action_dim != (int)ds->action_dim) {
        snprintf(msg, sizeof(msg),
                 "the model's n_cam/state_dim/action_dim (%d, %d, %d) differ from the dataset's (%d, %d, %d): "
                 "use data with the same cameras and dims",
                 c->n_cam, c->state_dim, c->action_dim, ds->cams.n, ds->state_dim, ds->action_dim);
        return msg;
    }
    return NULL;
}

// Points the arrays of a batch of B samples whose frames hold `cams` into `base` (NULL: only
// measures), each at a 64-byte boundary. Returns the bytes it needs; the same layout serves host
// and device copies.
static inline size_t batch_layout(Batch* b, uint8_t* base, const FlowConfig* c, const Cameras* cams, int B) {
    size_t off = 0, HA = (size_t)c->chunk * c->max_action_dim;
    if (cams->n != c->n_cam) { vla_fail("a batch of %d cameras for a model of %d", cams->n, c->n_cam); }
    memset(b, 0, sizeof(*b));
    b->cams = *cams;
#define BATCH_CARVE_(field, type, count) \
    field = base != NULL ? (type*)(base + off) : NULL; \
    off += align_up((size_t)(count) * sizeof(type), 64);
    for (int k = 0; k < cams->n; k++) {
        BATCH_CARVE_(b->images[k], uint8_t, (size_t)B * (camera_offset(cams, k + 1) - camera_offset(cams, k)))
    }
    BATCH_CARVE_(b->tokens, int32_t, (size_t)B * c->max_text)
    BATCH_CARVE_(b->token_mask, float, (size_t)B * c->max_text)
    BATCH_CARVE_(b->state, float, (size_t)B * c->max_state_dim)
    BATCH_CARVE_(b->actions, float, (size_t)B * HA)
    BATCH_CARVE_(b->action_is_pad, float, (size_t)B * c->chunk)
    BATCH_CARVE_(b->t, float, (size_t)B)
    BATCH_CARVE_(b->eps, float, (size_t)B * HA)
#undef BATCH_CARVE_
    b->B = B;
    b->memory = base;
    b->bytes = off;
    return off;
}

static inline void batch_alloc(Batch* b, const FlowConfig* c, const Cameras* cams, int B) {
    size_t bytes = batch_layout(b, NULL, c, cams, B);
    batch_layout(b, (uint8_t*)callocCheck(bytes, 1), c, cams, B);
}

static inline void batch_free(Batch* b) { free(b->memory); }

// Camera k's image of sample i of the batch.
static inline uint8_t* batch_image(const Batch* b, int k, int i) {
    return b->images[k] + (size_t)i * (camera_offset(&b->cams, k + 1) - camera_offset(&b->cams, k));
}

// Row i's language input: the instruction's n ids cut to max_text, right-padded with the pad id,
// mask 1 on the ids: LeRobot's tokenizer call (truncation, padding_side "right", its pad id; the
// whole rule is written down in data/vla_shard.py). ids may be the row itself.
static inline void batch_set_text(Batch* b, const FlowConfig* c, int i, const int32_t* ids, size_t n) {
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
static inline void dataset_assemble(const Dataset* ds, const FlowConfig* c, uint64_t index, Batch* b, int i) {
    int shard = 0;
    while (index >= ds->first_sample[shard + 1]) { shard++; }
    const Shard* s = &ds->shards[shard];
    uint64_t f = index - ds->first_sample[shard];
    const ShardEpisode* ep = &s->episodes[s->frame_episode[f]];
    if (!cameras_equal(&b->cams, &ds->cams)) {
        vla_fail("a batch laid out for other cameras than the dataset's: allocate it with the dataset's cameras");
    }
    const char* problem = flow_data_problem(c, ds);
    if (problem != NULL) { vla_fail("%s", problem); }
    const uint8_t* frame = s->images + f * cameras_frame_bytes(&ds->cams);
    for (int k = 0; k < c->n_cam; k++) {
        size_t bytes = camera_offset(&ds->cams, k + 1) - camera_offset(&ds->cams, k);
        memcpy(batch_image(b, k, i), frame + camera_offset(&ds->cams, k), bytes);
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
        for (int d = 0; d < Amax; d++) {
            a[d] = d < A ? (s->action[g * A + d] - ds->action_mean[d]) / ds->action_std[d] : 0.0f;
        }
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

// ---- the model's inputs: a batch as both trainers' forward reads it

// The inputs of one batch, in host memory (train_vla.c) or device memory (train_vla.cu). Frames keep
// each camera's stored size; the forward resizes them.
typedef struct {
    int B;
    const uint8_t* frames[VLA_MAX_CAM];  // camera k (the prefix's order): sample b's (frame_h[k], frame_w[k], 3)
                                         // u8 frame at frames[k] + b * frame_stride
    int frame_h[VLA_MAX_CAM], frame_w[VLA_MAX_CAM];
    size_t frame_stride;         // bytes from a sample's frames to the next's (0: each camera's frames packed,
                                 // what train_vla.c takes)
    const int32_t* tokens;       // (B, max_text) token ids in [0, vocab), right-padded
    const float* token_mask;     // (B, max_text) 1 = a real token, 0 = padding
    const float* state;          // (B, max_state_dim) normalized, zero-padded
    // training only:
    const float* actions;        // (B, H, max_action_dim) normalized, zero-padded
    const float* action_is_pad;  // (B, H) 1 = a chunk slot past the episode's end (no loss)
    const float* t;              // (B) flow time
    const float* noise;          // (B, H, max_action_dim)
} ModelInputs;

// The model's inputs from a batch (the first b->B samples of its layout), each camera's frames packed
static inline ModelInputs model_inputs(const Batch* b) {
    ModelInputs in;
    memset(&in, 0, sizeof(in));
    in.B = b->B;
    for (int k = 0; k < b->cams.n; k++) {
        in.frames[k] = b->images[k];
        in.frame_h[k] = (int)b->cams.height[k];
        in.frame_w[k] = (int)b->cams.width[k];
    }
    in.tokens = b->tokens; in.token_mask = b->token_mask; in.state = b->state;
    in.actions = b->actions; in.action_is_pad = b->action_is_pad; in.t = b->t; in.noise = b->eps;
    return in;
}

#endif  // VLA_DATASET_H
