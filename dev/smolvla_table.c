/*
flow_table.c: vla/config.h's parameter table (SmolVLA's and pi0's presets), seeded init and
flow-noise stream printed, and its checkpoint writer run, so the PyTorch oracle (dev/model.py) is
checked against the C plumbing itself rather than against a copy of it (tests/model/test_model.py
builds and runs this).

  gcc -O2 -o /tmp/flow_table dev/flow_table.c -lm -lpthread
  /tmp/flow_table table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin]
      "config" and the 27 fields in FLOW_CONFIG_FIELDS order (family last); one "spec" line per
      tensor: name lerobot tower kind train decay init slices ndim d0 d1 d2 numel offset (tower,
      train and init resolved for the family), then the trainable elements in modes expert, vlm,
      all, and "layers" with the LeRobot layer of each slice (none for a tensor the family does not
      have); "total N" and "trainable E V A". With SEED and a path: flow_param_init's float32
      parameters, flat in table order, written there.
  /tmp/flow_table noise SEED STEP G CHUNK WIDTH
      t and the CHUNK x WIDTH eps of global sample G at optimizer step STEP, from vla/rng.h's
      flow_noise_width (as %a): SmolVLA draws eps over max_action_dim dims.
  /tmp/flow_table ckpt PRESET N_CAM STATE_DIM ACTION_DIM MODE SEED STEP SAMPLER_POS OUT.bin
      a checkpoint written by vla/checkpoint.h's checkpoint_write, tokenizer "bytes": the weights of
      flow_param_init(SEED); statistics 0.5 + i (means) and 1 + i (stds) for entry i; moments
      packed by flow_opt_domain in train mode MODE (0 expert, 1 vlm, 2 all), m = the element's
      index in the packed domain, v = its tensor's table index + 0.5: every element names its place.
*/
#include "../vla/common.h"
#include "../vla/rng.h"
#include "../vla/config.h"
#include "../vla/checkpoint.h"

static long long arg_int(const char* s) {
    char* end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0') { vla_fail("'%s' is not an integer", s); }
    return v;
}

static int print_table(int argc, char** argv) {
    if (argc != 6 && argc != 8) { vla_fail("usage: %s table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin]", argv[0]); }
    const FlowPreset* p = flow_preset(argv[2]);
    if (p == NULL) { vla_fail("no preset %s", argv[2]); }
    FlowConfig c = p->config;
    c.n_cam = (int32_t)arg_int(argv[3]);
    c.state_dim = (int32_t)arg_int(argv[4]);
    c.action_dim = (int32_t)arg_int(argv[5]);
    const char* problem = flow_config_problem(&c);
    if (problem != NULL) { vla_fail("bad config: %s", problem); }
    printf("config");
#define PRINT_FIELD_(f) printf(" %d", c.f);
    FLOW_CONFIG_FIELDS(PRINT_FIELD_)
#undef PRINT_FIELD_
    printf("\n");
    FlowParamTable t;
    flow_table_build(&c, &t);
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &t.spec[i];
        printf("spec %s %s %d %d %d %d %d %d %d %lld %lld %lld %zu %zu", s->name, s->lerobot, s->tower, s->kind, s->train,
               s->decay, s->init, s->slices, s->ndim, (long long)s->shape[0], (long long)s->shape[1],
               (long long)s->shape[2], s->numel, s->offset);
        for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) { printf(" %zu", flow_trainable_numel(s, mode)); }
        printf(" layers");
        for (size_t k = 0; k < flow_slices(s); k++) { printf("%s%d", k ? "," : " ", flow_slice_layer(&c, s, (int)k)); }
        printf("\n");
    }
    printf("total %zu\n", t.total);
    printf("trainable %zu %zu %zu\n", flow_trainable_count(&t, TRAIN_MODE_EXPERT), flow_trainable_count(&t, TRAIN_MODE_VLM),
           flow_trainable_count(&t, TRAIN_MODE_ALL));
    if (argc == 8) {
        float* params = (float*)mallocCheck(t.total * sizeof(float));
        flow_param_init(params, &t, &c, (uint64_t)arg_int(argv[6]));
        FILE* f = fopenCheck(argv[7], "wb");
        if (fwrite(params, sizeof(float), t.total, f) != t.total || fclose(f) != 0) { vla_fail("writing %s failed", argv[7]); }
        free(params);
    }
    return 0;
}

static int print_noise(int argc, char** argv) {
    if (argc != 7) { vla_fail("usage: %s noise SEED STEP G CHUNK WIDTH", argv[0]); }
    long long chunk = arg_int(argv[5]), width = arg_int(argv[6]);
    if (chunk < 1 || width < 1 || chunk > VLA_MAX_CHUNK || width > VLA_MAX_DIM) {
        vla_fail("CHUNK and WIDTH must be in [1, %d] and [1, %d]", VLA_MAX_CHUNK, VLA_MAX_DIM);
    }
    float t, *eps = (float*)mallocCheck((size_t)(chunk * width) * sizeof(float));
    flow_noise_width((int)chunk, (int)width, (uint64_t)arg_int(argv[2]), (uint64_t)arg_int(argv[3]),
                     (uint64_t)arg_int(argv[4]), &t, eps);
    printf("t %a\neps", t);
    for (long long i = 0; i < chunk * width; i++) { printf(" %a", eps[i]); }
    printf("\n");
    free(eps);
    return 0;
}

static int write_checkpoint(int argc, char** argv) {
    if (argc != 11) {
        vla_fail("usage: %s ckpt PRESET N_CAM STATE_DIM ACTION_DIM MODE SEED STEP SAMPLER_POS OUT.bin", argv[0]);
    }
    const FlowPreset* p = flow_preset(argv[2]);
    if (p == NULL) { vla_fail("no preset %s", argv[2]); }
    Checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.config = p->config;
    ck.config.n_cam = (int32_t)arg_int(argv[3]);
    ck.config.state_dim = (int32_t)arg_int(argv[4]);
    ck.config.action_dim = (int32_t)arg_int(argv[5]);
    const char* problem = flow_config_problem(&ck.config);
    if (problem != NULL) { vla_fail("bad config: %s", problem); }
    ck.train_mode = (int)arg_int(argv[6]);
    if (ck.train_mode < 0 || ck.train_mode >= TRAIN_MODE_COUNT) { vla_fail("MODE must be 0, 1 or 2"); }
    ck.seed = (uint64_t)arg_int(argv[7]);
    ck.step = (uint64_t)arg_int(argv[8]);
    ck.sampler_pos = (uint64_t)arg_int(argv[9]);
    snprintf(ck.tokenizer, sizeof(ck.tokenizer), "bytes");
    FlowParamTable t;
    flow_table_build(&ck.config, &t);
    FlowOptDomain d;
    flow_opt_domain(&t, ck.train_mode, &d);
    ckpt_counts(&ck.config, ck.train_mode, &ck.n_params, &ck.n_trainable);
    int n_stats = 2 * (ck.config.state_dim + ck.config.action_dim);
    ck.stats = (float*)mallocCheck((size_t)n_stats * sizeof(float));
    for (int i = 0; i < n_stats; i++) {
        int is_std = i < 2 * ck.config.state_dim ? i >= ck.config.state_dim : i >= 2 * ck.config.state_dim + ck.config.action_dim;
        ck.stats[i] = is_std ? 1.0f + (float)i : 0.5f + (float)i;
    }
    ck.params = (float*)mallocCheck(t.total * sizeof(float));
    flow_param_init(ck.params, &t, &ck.config, ck.seed);
    ck.m = (float*)mallocCheck((d.total > 0 ? d.total : 1) * sizeof(float));
    ck.v = (float*)mallocCheck((d.total > 0 ? d.total : 1) * sizeof(float));
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        for (size_t j = 0; j < d.numel[i]; j++) {
            ck.m[d.offset[i] + j] = (float)(d.offset[i] + j);
            ck.v[d.offset[i] + j] = (float)i + 0.5f;
        }
    }
    checkpoint_write(argv[10], &ck);
    printf("wrote %s: %llu weights, %llu moments each\n", argv[10], (unsigned long long)ck.n_params,
           (unsigned long long)ck.n_trainable);
    checkpoint_free(&ck);
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "table") == 0) { return print_table(argc, argv); }
    if (argc >= 2 && strcmp(argv[1], "noise") == 0) { return print_noise(argc, argv); }
    if (argc >= 2 && strcmp(argv[1], "ckpt") == 0) { return write_checkpoint(argc, argv); }
    fprintf(stderr, "usage: %s table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin] | noise SEED STEP G CHUNK WIDTH | "
            "ckpt PRESET N_CAM STATE_DIM ACTION_DIM MODE SEED STEP SAMPLER_POS OUT.bin\n", argv[0]);
    return 2;
}
