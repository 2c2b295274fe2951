// make_seeds.c: seeds of the fuzz corpora written by the project's own writers, small enough (a
// few to 30 kilobytes) that the fuzzers' mutations land in every section: version-2 checkpoints
// of small SmolVLA configs, one per train mode (checkpoint_write), into CKPT_DIR, and shards of
// both format versions into SHARD_DIR (shard_write: version 2 with cameras of different and
// non-square sizes, and another tokenizer's ids; shard_write_v1: version 1). More shard seeds come from data/synthetic (dev/fuzz/run_fuzz.sh).
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
    // checkpoints (version 2) of three small SmolVLA configs, one per train mode: every weight, and
    // the moments of that mode's trainable elements only (the third's 20-row text table: one the
    // policy library refuses, byte ids needing 256)
    //  cam S  A  img p  Cv Fv Lv NHv s  vocab pad text C   F   L  NH NKV HS Ce Fe  n  H  Smax Amax theta
    const SmolVLAConfig configs[] = {
        {1, 2, 2, 8,  4, 4, 8, 1, 2,  1, 256, 0,  4,   8,  8,  2, 2, 1,  4, 4, 8,  2, 2, 4,   4,   10000},
        {2, 3, 2, 8,  2, 4, 4, 1, 1,  2, 256, 1,  3,   4,  8,  3, 2, 2,  2, 6, 4,  2, 3, 3,   2,   100},
        {1, 1, 3, 16, 4, 8, 8, 2, 2,  2, 20,  3,  2,   8,  4,  1, 4, 2,  2, 4, 4,  1, 2, 2,   3,   10000},
    };
    const int modes[] = {TRAIN_MODE_EXPERT, TRAIN_MODE_VLM, TRAIN_MODE_ALL};
    const uint64_t steps[] = {0, 5, 1000};
    for (int k = 0; k < (int)(sizeof(configs) / sizeof(configs[0])); k++) {
        const SmolVLAConfig* c = &configs[k];
        const char* problem = smolvla_config_problem(c);
        if (problem != NULL) { vla_fail("seed config %d: %s", k, problem); }
        SmolParamTable t;
        smolvla_table_build(c, &t);
        size_t nt = smolvla_trainable_count(&t, modes[k]);
        int S = c->state_dim, A = c->action_dim;
        float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
        for (int i = 0; i < 2 * (S + A); i++) { stats[i] = 0.5f + 0.25f * (float)(i % 3); }
        float* params = (float*)mallocCheck(t.total * sizeof(float));
        float* moments = (float*)callocCheck(2 * (nt > 0 ? nt : 1), sizeof(float));
        smolvla_param_init(params, &t, c, 1337 + (uint64_t)k);
        for (size_t i = 0; i < nt; i++) {  // moments as a run leaves them: small, v positive
            moments[i] = 1e-3f * params[i];
            moments[nt + i] = 1e-6f * params[i] * params[i];
        }
        Checkpoint ck;
        memset(&ck, 0, sizeof(ck));
        ck.config = *c; ck.train_mode = modes[k]; ck.step = steps[k]; ck.seed = 1337; ck.sampler_pos = steps[k] * 8;
        ck.n_params = t.total; ck.n_trainable = nt; ck.stats = stats; ck.params = params; ck.m = moments;
        ck.v = moments + nt;
        snprintf(ck.tokenizer, sizeof(ck.tokenizer), "%s", SHARD_TOKENIZER_BYTES);
        snprintf(path, sizeof(path), "%s/ckpt_seed_%d.bin", argv[1], k);
        checkpoint_write(path, &ck);
        free(stats); free(params); free(moments);
    }
    return 0;
}
