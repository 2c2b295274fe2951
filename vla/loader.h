/*
vla/loader.h: the batches of ranks (the sampler's indices, assembled, augmented by random
shifts, with their flow noise) and the loader whose worker threads assemble upcoming batches into
a ring of slots. Needs dataset.h, sampler.h and rng.h.
*/
#ifndef VLA_LOADER_H
#define VLA_LOADER_H

#include "common.h"
#include "rng.h"
#include "config.h"
#include "shards.h"
#include "dataset.h"
#include "sampler.h"

// ----------------------------------------------------------------------------
// batches of ranks, augmentation, and the prefetching loader

#define RNG_STREAM_AUGMENT(s) ((4ULL << 56) + (uint64_t)(s))  // image shifts of optimizer step s

// Random shift (pad by replicating the border, crop back) of every camera image of a sample, by
// up to `shift` pixels in x and y: the augmentation DrQ and many VLA recipes use. Drawn from
// (seed, step, global sample), so it is the same whatever rank or thread assembles the sample.
// Sample i of the batch is global sample g of the step.
static inline void augment_shift(Batch* b, int i, int shift, uint64_t seed, uint64_t step, uint64_t g) {
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
        uint8_t* im = batch_image(b, cam, i);
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

static inline void batch_fill(Batch* batch, const Dataset* ds, const FlowConfig* c, const uint64_t* idx,
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
    FlowConfig config;
    Sampler sampler;       // guarded by mu
    uint64_t seed, first_pos, first_step;
    int B, W, augment;
    int stride, offset;    // the global jobs this loader takes
    int n_slots;
    Batch* slots;
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
static inline void loader_start_balanced(Loader* L, const Dataset* ds, const FlowConfig* c, uint64_t seed,
                                         uint64_t first_pos, uint64_t first_step, int B, int W, int augment,
                                         int n_threads, int n_slots, int stride, int offset,
                                         const TaskBalance* balance) {
    memset(L, 0, sizeof(*L));
    L->ds = ds; L->config = *c; L->seed = seed; L->first_pos = first_pos; L->first_step = first_step;
    L->B = B; L->W = W; L->augment = augment; L->n_threads = n_threads;
    L->stride = stride; L->offset = offset;
    L->n_slots = n_slots < 1 ? 1 : n_slots;
    sampler_init(&L->sampler, ds->n_samples, seed);
    if (balance != NULL) { sampler_set_balance(&L->sampler, balance); }
    L->slots = (Batch*)callocCheck(L->n_slots, sizeof(Batch));
    L->slot_job = (int64_t*)callocCheck(L->n_slots, sizeof(int64_t));
    L->slot_idx = (uint64_t*)callocCheck((size_t)L->n_slots * B, sizeof(uint64_t));
    L->slot_state = (int*)callocCheck(L->n_slots, sizeof(int));
    for (int k = 0; k < L->n_slots; k++) { batch_alloc(&L->slots[k], c, &ds->cams, B); }
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

static inline void loader_start_strided(Loader* L, const Dataset* ds, const FlowConfig* c, uint64_t seed,
                                        uint64_t first_pos, uint64_t first_step, int B, int W, int augment,
                                        int n_threads, int n_slots, int stride, int offset) {
    loader_start_balanced(L, ds, c, seed, first_pos, first_step, B, W, augment, n_threads, n_slots, stride, offset,
                          NULL);
}

static inline void loader_start(Loader* L, const Dataset* ds, const FlowConfig* c, uint64_t seed, uint64_t first_pos,
                                uint64_t first_step, int B, int W, int augment, int n_threads, int n_slots) {
    loader_start_strided(L, ds, c, seed, first_pos, first_step, B, W, augment, n_threads, n_slots, 1, 0);
}

// The batch of the next job in order (steps ascending, ranks within a step). Valid until loader_release.
static inline Batch* loader_next(Loader* L) {
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
    for (int k = 0; k < L->n_slots; k++) { batch_free(&L->slots[k]); }
    free(L->slots); free(L->slot_job); free(L->slot_idx); free(L->slot_state); free(L->threads);
    sampler_free(&L->sampler);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
}

#endif  // VLA_LOADER_H
