// make_seeds.c: seeds of the fuzz corpora written by the project's own writers, small enough (a
// few kilobytes) that the fuzzers' mutations land in every section: checkpoints of small configs
// (checkpoint_write) into CKPT_DIR, and shards of both format versions into SHARD_DIR (shard_write:
// version 2 with cameras of different and non-square sizes, and another tokenizer's ids;
// shard_write_v1: version 1). More shard seeds come from data/synthetic (dev/fuzz/run_fuzz.sh).
//   make_seeds CKPT_DIR SHARD_DIR
#include "../../vla.h"

// A small shard of `cams` (5 frames in 2 episodes, state 3, action 2, two instructions) at path
static void shard_seed(const char* path, const Cameras* cams, uint64_t seed) {
    enum { FRAMES = 5, S = 3, A = 2 };
    size_t frame = cameras_frame_bytes(cams);
    uint8_t* images = (uint8_t*)mallocCheck(FRAMES * frame);
    Rng r;
    rng_init(&r, seed, 0);
    for (size_t i = 0; i < FRAMES * frame; i++) { images[i] = (uint8_t)rng_u64(&r); }
    float state[FRAMES * S], action[FRAMES * A], stats[2 * (S + A)];
    for (int i = 0; i < FRAMES * S; i++) { state[i] = (float)rng_uniform(&r); }
    for (int i = 0; i < FRAMES * A; i++) { action[i] = (float)rng_uniform(&r) - 0.5f; }
    shard_compute_stats(FRAMES, state, S, action, A, stats);
    ShardEpisode eps[2] = {{0, 3, 1}, {3, 2, 0}};
    static const char* const tasks[] = {"open the drawer", "öffne die Schublade"};
    shard_write(path, cams, S, A, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
    free(images);
}

int main(int argc, char** argv) {
    if (argc != 3) { vla_fail("usage: %s CKPT_DIR SHARD_DIR", argv[0]); }
    char path[VLA_PATH_MAX];
    const Cameras shapes[] = {{2, {6, 4}, {10, 4}}, {1, {8}, {8}}, {3, {4, 8, 4}, {4, 8, 12}}};
    for (int k = 0; k < (int)(sizeof(shapes) / sizeof(shapes[0])); k++) {
        snprintf(path, sizeof(path), "%s/shard_v2_%d.bin", argv[2], k);
        shard_seed(path, &shapes[k], 100 + (uint64_t)k);
    }
    // version 1 of the square one, and the square one as the ids of another tokenizer (vocabulary 1000)
    char square[VLA_PATH_MAX];
    snprintf(square, sizeof(square), "%s/shard_v2_1.bin", argv[2]);
    Shard s;
    shard_open(&s, square);
    snprintf(path, sizeof(path), "%s/shard_v1.bin", argv[2]);
    shard_write_v1(path, &s);
    shard_close(&s);
    snprintf(path, sizeof(path), "%s/shard_v2_tokenizer.bin", argv[2]);
    shard_seed(path, &shapes[1], 101);
    ShardHeader h;
    FILE* f = fopenCheck(path, "r+b");
    if (fread(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot read %s", path); }
    memset(h.tokenizer, 0, sizeof(h.tokenizer));
    snprintf(h.tokenizer, sizeof(h.tokenizer), "tokenizer.json:0123456789abcdef");
    h.vocab = 1000;
    fseek(f, 0, SEEK_SET);
    if (fwrite(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot write %s", path); }
    fclose(f);
    // n_cam img patch text S A  H  d  f  d_a f_a L NH HS theta
    const VLAConfig configs[] = {
        {1, 4, 2, 4, 2, 2, 2, 4, 8, 4, 8, 1, 1, 4, 10000},
        {2, 8, 4, 6, 3, 2, 3, 6, 4, 4, 6, 2, 2, 2, 100},
        {1, 8, 8, 8, 4, 4, 4, 8, 16, 8, 16, 1, 2, 4, 10000},
    };
    const uint64_t steps[] = {0, 5, 1000};
    for (int k = 0; k < (int)(sizeof(configs) / sizeof(configs[0])); k++) {
        const VLAConfig* c = &configs[k];
        const char* problem = vla_config_problem(c);
        if (problem != NULL) { vla_fail("seed config %d: %s", k, problem); }
        ParamTable t;
        param_table_build(c, &t);
        int S = c->state_dim, A = c->action_dim;
        float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
        for (int i = 0; i < 2 * (S + A); i++) { stats[i] = 0.5f + 0.25f * (float)(i % 3); }
        float* state = (float*)callocCheck(3 * t.total, sizeof(float));
        param_init(state, &t, c, 1337 + (uint64_t)k);
        for (size_t i = 0; i < t.total; i++) {  // moments as a run leaves them: small, v positive
            state[t.total + i] = 1e-3f * state[i];
            state[2 * t.total + i] = 1e-6f * state[i] * state[i];
        }
        Checkpoint ck = {*c, steps[k], 1337, steps[k] * 8, stats, state, state + t.total, state + 2 * t.total};
        snprintf(path, sizeof(path), "%s/ckpt_seed_%d.bin", argv[1], k);
        checkpoint_write(path, &ck, t.total);
        free(stats);
        free(state);
    }
    return 0;
}
