/*
vla/shard_writer.h: shards written (the tests, data/synthetic, the fuzzers' seeds): a header
laid out and its sections each at its offset, written atomically; version 1's layout again; the
normalization statistics the writers store. Needs shards.h and atomic_file.h.
*/
#ifndef VLA_SHARD_WRITER_H
#define VLA_SHARD_WRITER_H

#include "common.h"
#include "shards.h"
#include "atomic_file.h"

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
static inline void shard_compute_stats(uint64_t n_frames, const float* state, int S, const float* action, int A,
                                       float* stats) {
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

#endif  // VLA_SHARD_WRITER_H
