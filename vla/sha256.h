/*
vla/sha256.h: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the multi-node bootstrap's run
token proofs (vla/bootstrap.h). Needs only the C library; test_vla checks them against Python's
hashlib and hmac.
*/
#ifndef VLA_SHA256_H
#define VLA_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

// ----------------------------------------------------------------------------
// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): the run token's proofs

typedef struct {
    uint32_t h[8];
    uint64_t bytes;     // hashed so far
    uint8_t block[64];
    size_t fill;        // bytes waiting in block
} Sha256;

// the first 32 bits of the fractional parts of the cube roots of the first 64 primes
static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static inline uint32_t sha256_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the state h
static inline void sha256_block(uint32_t h[8], const uint8_t* p) {
    uint32_t w[64], v[8];
    for (int t = 0; t < 16; t++) {
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    }
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = sha256_rotr(w[t - 15], 7) ^ sha256_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = sha256_rotr(w[t - 2], 17) ^ sha256_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    memcpy(v, h, sizeof(v));  // v: a b c d e f g h of the standard
    for (int t = 0; t < 64; t++) {
        uint32_t e = v[4], a = v[0];
        uint32_t t1 = v[7] + (sha256_rotr(e, 6) ^ sha256_rotr(e, 11) ^ sha256_rotr(e, 25)) +
                      ((e & v[5]) ^ (~e & v[6])) + SHA256_K[t] + w[t];
        uint32_t t2 = (sha256_rotr(a, 2) ^ sha256_rotr(a, 13) ^ sha256_rotr(a, 22)) +
                      ((a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof(uint32_t));
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) { h[i] += v[i]; }
}

static inline void sha256_init(Sha256* s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->bytes = 0;
    s->fill = 0;
}

static inline void sha256_update(Sha256* s, const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    s->bytes += n;
    while (n > 0) {
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) { sha256_block(s->h, s->block); s->fill = 0; }
    }
}

// The digest (32 bytes) into out; s is spent
static inline void sha256_final(Sha256* s, uint8_t out[32]) {
    static const uint8_t pad[64] = {0x80};
    uint64_t bits = s->bytes * 8;
    sha256_update(s, pad, s->fill < 56 ? 56 - s->fill : 120 - s->fill);  // to 8 bytes short of a block
    uint8_t length[8];
    for (int i = 0; i < 8; i++) { length[i] = (uint8_t)(bits >> (56 - 8 * i)); }
    sha256_update(s, length, 8);
    for (int i = 0; i < 32; i++) { out[i] = (uint8_t)(s->h[i / 4] >> (24 - 8 * (i % 4))); }
}

static inline void sha256(const void* data, size_t n, uint8_t out[32]) {
    Sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, n);
    sha256_final(&s, out);
}

typedef struct {
    Sha256 inner, outer;
} HmacSha256;

static inline void hmac_sha256_init(HmacSha256* m, const void* key, size_t n) {
    uint8_t k[64], pad[64];
    memset(k, 0, sizeof(k));
    if (n > 64) { sha256(key, n, k); } else if (n > 0) { memcpy(k, key, n); }  // a key past a block is hashed first
    for (int i = 0; i < 64; i++) { pad[i] = k[i] ^ 0x36; }
    sha256_init(&m->inner);
    sha256_update(&m->inner, pad, 64);
    for (int i = 0; i < 64; i++) { pad[i] = k[i] ^ 0x5c; }
    sha256_init(&m->outer);
    sha256_update(&m->outer, pad, 64);
}

static inline void hmac_sha256_update(HmacSha256* m, const void* data, size_t n) { sha256_update(&m->inner, data, n); }

static inline void hmac_sha256_final(HmacSha256* m, uint8_t out[32]) {
    uint8_t inner[32];
    sha256_final(&m->inner, inner);
    sha256_update(&m->outer, inner, 32);
    sha256_final(&m->outer, out);
}

#endif  // VLA_SHA256_H
