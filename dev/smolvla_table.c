/*
smolvla_table.c: vla.h's SmolVLA parameter table, seeded init and flow-noise stream, printed, so
the PyTorch oracle (dev/model_smolvla.py) is checked against the C plumbing itself rather than
against a copy of it (dev/test_model_smolvla.py builds and runs this).

  gcc -O2 -o /tmp/smolvla_table dev/smolvla_table.c -lm -lpthread
  /tmp/smolvla_table table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin]
      "config" and the 26 fields in SMOLVLA_CONFIG_FIELDS order; one "spec" line per tensor:
      name lerobot tower kind train decay init slices ndim d0 d1 d2 numel offset, then the
      trainable elements in modes expert, vlm, all, and the LeRobot layer of each slice;
      "total N" and "trainable E V A". With SEED and a path: smolvla_param_init's float32
      parameters, flat in table order, written there.
  /tmp/smolvla_table noise SEED STEP G CHUNK WIDTH
      t and the CHUNK x WIDTH eps of global sample G at optimizer step STEP, from vla.h's
      flow_noise with action_dim = WIDTH (as %a): SmolVLA draws eps over max_action_dim dims.
*/
#include "../vla.h"

static long long arg_int(const char* s) {
    char* end;
    long long v = strtoll(s, &end, 10);
    if (*s == '\0' || *end != '\0') { vla_fail("'%s' is not an integer", s); }
    return v;
}

static int print_table(int argc, char** argv) {
    if (argc != 6 && argc != 8) { vla_fail("usage: %s table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin]", argv[0]); }
    const SmolVLAPreset* p = smolvla_preset(argv[2]);
    if (p == NULL) { vla_fail("no SmolVLA preset %s", argv[2]); }
    SmolVLAConfig c = p->config;
    c.n_cam = (int32_t)arg_int(argv[3]);
    c.state_dim = (int32_t)arg_int(argv[4]);
    c.action_dim = (int32_t)arg_int(argv[5]);
    const char* problem = smolvla_config_problem(&c);
    if (problem != NULL) { vla_fail("bad config: %s", problem); }
    printf("config");
#define PRINT_FIELD_(f) printf(" %d", c.f);
    SMOLVLA_CONFIG_FIELDS(PRINT_FIELD_)
#undef PRINT_FIELD_
    printf("\n");
    SmolParamTable t;
    smolvla_table_build(&c, &t);
    for (int i = 0; i < SMOLVLA_NUM_TENSORS; i++) {
        const SmolParamSpec* s = &t.spec[i];
        printf("spec %s %s %d %d %d %d %d %d %d %lld %lld %lld %zu %zu", s->name, s->lerobot, s->tower, s->kind, s->train,
               s->decay, s->init, s->slices, s->ndim, (long long)s->shape[0], (long long)s->shape[1],
               (long long)s->shape[2], s->numel, s->offset);
        for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) { printf(" %zu", smolvla_trainable_numel(s, mode)); }
        printf(" layers");
        for (size_t k = 0; k < smolvla_slices(s); k++) { printf("%s%d", k ? "," : " ", smolvla_slice_layer(&c, s, (int)k)); }
        printf("\n");
    }
    printf("total %zu\n", t.total);
    printf("trainable %zu %zu %zu\n", smolvla_trainable_count(&t, TRAIN_MODE_EXPERT), smolvla_trainable_count(&t, TRAIN_MODE_VLM),
           smolvla_trainable_count(&t, TRAIN_MODE_ALL));
    if (argc == 8) {
        float* params = (float*)mallocCheck(t.total * sizeof(float));
        smolvla_param_init(params, &t, &c, (uint64_t)arg_int(argv[6]));
        FILE* f = fopenCheck(argv[7], "wb");
        if (fwrite(params, sizeof(float), t.total, f) != t.total || fclose(f) != 0) { vla_fail("writing %s failed", argv[7]); }
        free(params);
    }
    return 0;
}

static int print_noise(int argc, char** argv) {
    if (argc != 7) { vla_fail("usage: %s noise SEED STEP G CHUNK WIDTH", argv[0]); }
    VLAConfig c;
    memset(&c, 0, sizeof(c));
    c.chunk = (int32_t)arg_int(argv[5]);
    c.action_dim = (int32_t)arg_int(argv[6]);
    if (c.chunk < 1 || c.action_dim < 1) { vla_fail("CHUNK and WIDTH must be positive"); }
    float t, *eps = (float*)mallocCheck((size_t)c.chunk * c.action_dim * sizeof(float));
    flow_noise(&c, (uint64_t)arg_int(argv[2]), (uint64_t)arg_int(argv[3]), (uint64_t)arg_int(argv[4]), &t, eps);
    printf("t %a\neps", t);
    for (int i = 0; i < c.chunk * c.action_dim; i++) { printf(" %a", eps[i]); }
    printf("\n");
    free(eps);
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "table") == 0) { return print_table(argc, argv); }
    if (argc >= 2 && strcmp(argv[1], "noise") == 0) { return print_noise(argc, argv); }
    fprintf(stderr, "usage: %s table PRESET N_CAM STATE_DIM ACTION_DIM [SEED INIT.bin] | noise SEED STEP G CHUNK WIDTH\n",
            argv[0]);
    return 2;
}
