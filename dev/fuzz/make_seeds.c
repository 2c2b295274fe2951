// make_seeds.c: the checkpoint seeds of the fuzz corpora, written by the project's own writer
// (checkpoint_write) for small configs, so that an input is kilobytes and the fuzzers' mutations
// land in every section. The shard seeds come from data/synthetic (dev/fuzz/run_fuzz.sh).
//   make_seeds OUT_DIR
#include "../../vla.h"

int main(int argc, char** argv) {
    if (argc != 2) { vla_fail("usage: %s OUT_DIR", argv[0]); }
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
        char path[VLA_PATH_MAX];
        snprintf(path, sizeof(path), "%s/ckpt_seed_%d.bin", argv[1], k);
        checkpoint_write(path, &ck, t.total);
        free(stats);
        free(state);
    }
    return 0;
}
