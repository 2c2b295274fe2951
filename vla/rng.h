/*
vla/rng.h: the counter-based RNG (splitmix64 keyed by seed and stream, any draw reached by
seeking) and the streams train_vla draws from: parameter init, sampler epochs, flow noise (t and
eps of each global sample). dev/model.py reproduces every stream bit for bit. Needs common.h.
*/
#ifndef VLA_RNG_H
#define VLA_RNG_H

#include "common.h"

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
static inline void flow_noise_width(int chunk, int width, uint64_t seed, uint64_t step, uint64_t g, float* t,
                                    float* eps) {
    Rng r;
    rng_init(&r, seed, RNG_STREAM_NOISE(step));
    r.counter = g * flow_noise_draws_width(chunk, width);
    *t = (float)rng_flow_time(&r);
    for (int i = 0; i < chunk * width; i++) { eps[i] = (float)rng_normal(&r); }
}

#endif  // VLA_RNG_H
