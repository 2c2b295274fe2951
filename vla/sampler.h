/*
vla/sampler.h: which samples each step takes: task balance (--balance tasks, a weighted round
robin over the dataset's tasks) and the distributed sampler (a permutation per epoch, disjoint
slices per rank), any position's sample following from (seed, position) alone. Needs dataset.h
and rng.h.
*/
#ifndef VLA_SAMPLER_H
#define VLA_SAMPLER_H

#include "common.h"
#include "rng.h"
#include "dataset.h"

// ----------------------------------------------------------------------------
// task-balanced sampling (--balance tasks): position p of the global sequence picks a task by a
// fixed schedule of period P, then that task's next sample. A task is an instruction text (the
// same text in several shards is one task), numbered in order of first appearance over the
// shards' task tables; its samples are its episodes' frames. With integer weights w_t (default 1
// for every task with samples, 0 for one without; divided by their gcd) and P = sum w_t, slot j = p % P of the schedule
// is the smooth weighted round robin's pick (equal weights: 0, 1, ..., T-1), and the draw is task t's k-th with k = (p
// / P) w_t + (earlier slots of t in the period). Draw k of task t is its permutation of pass k / n_t (from (seed, task,
// pass)) at k % n_t. So any position's sample follows from (seed, p) alone: resuming needs only the position, ranks
// taking disjoint slices of [sG, (s+1)G) stay disjoint, and a global batch G that is a multiple of P holds task t
// exactly G w_t / P times (equal weights, T not dividing G: floor or ceil of G / T times each, since every window of G
// positions holds each residue mod T that often). Weight-0 tasks are never drawn.

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
        if (end == p || errno != 0 || v < 0 || v > 1000000 || (*end != ',' && *end != '\0') ||
            (p[0] < '0' || p[0] > '9')) {
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

static inline uint64_t balance_gcd(uint64_t a, uint64_t b) {
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// The tasks of dataset ds and the schedule of `weights` (NULL: equal). Fails with one line when
// the weights are not one per task or their period is too long, or a drawn task has no samples.
static inline void task_balance_build(TaskBalance* tb, const Dataset* ds, const char* weights) {
    memset(tb, 0, sizeof(*tb));
    if (ds->n_samples > UINT32_MAX) {
        vla_fail("dataset has %llu samples; the sampler supports up to 2^32", (unsigned long long)ds->n_samples);
    }
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
        if (n != T) {
            vla_fail(
                "--task-weights %s: %d weights for the dataset's %d tasks: give one per task, in the order "
                "the config table lists the tasks",
                weights, n, T);
        }
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
        vla_fail("--task-weights %s: the weights (divided by their gcd) sum to %llu, above %u: use smaller weights",
                 named, (unsigned long long)period, VLA_MAX_TASK_PERIOD);
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
    return (int)tb
        ->local_task[tb->shard_task_base[shard] + s->episodes[s->frame_episode[index - ds->first_sample[shard]]].task];
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
    if (n > UINT32_MAX) {
        vla_fail("dataset has %llu samples; the sampler supports up to 2^32", (unsigned long long)n);
    }
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

#endif  // VLA_SAMPLER_H
