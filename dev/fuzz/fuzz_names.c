// fuzz_names.c: checkpoint names on arbitrary strings. Each input is a list of file names, one a
// line. checkpoint_step_of_name reads each: a name it accepts must be exactly what checkpoint_path
// writes for that step. Then every name that can be a file is made, a link to one valid
// checkpoint, in a folder of this process, and checkpoint_list (what -y 1 and --keep read) over
// it must give the steps of the accepted names, newest first, at most `max` of them (max: the
// input's size mod 6, 0 included).
#include "fuzz_util.h"
#include "../../vla/config.h"
#include "../../vla/shards.h"
#include "../../vla/checkpoint.h"

enum { MAX_NAMES = 64 };

static int compare_steps_down(const void* a, const void* b) {
    uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static char template_path[VLA_PATH_MAX];

// One small valid checkpoint (make_seeds's first config), written once, linked under each name
static void write_template(void) {
    const FlowConfig* c = &FUZZ_SAFETENSORS_CONFIG;
    FlowParamTable t;
    flow_table_build(c, &t);
    size_t nt = flow_trainable_count(&t, TRAIN_MODE_EXPERT);
    float* stats = (float*)mallocCheck(2 * (size_t)(c->state_dim + c->action_dim) * sizeof(float));
    for (int i = 0; i < 2 * (c->state_dim + c->action_dim); i++) { stats[i] = 1.0f; }
    float* params = (float*)callocCheck(t.total, sizeof(float));
    float* moments = (float*)callocCheck(2 * (nt > 0 ? nt : 1), sizeof(float));
    Checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.config = *c; ck.train_mode = TRAIN_MODE_EXPERT; ck.step = 1; ck.seed = 1; ck.sampler_pos = 8;
    ck.n_params = t.total; ck.n_trainable = nt; ck.stats = stats; ck.params = params; ck.m = moments; ck.v = moments + nt;
    snprintf(ck.tokenizer, sizeof(ck.tokenizer), "%s", SHARD_TOKENIZER_BYTES);
    snprintf(template_path, sizeof(template_path), "%s/template.bin", fuzz_dir());
    checkpoint_write(template_path, &ck);
    free(stats); free(params); free(moments);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (template_path[0] == '\0') { write_template(); }
    const char* dir = fuzz_subdir("run");
    char* text = (char*)mallocCheck(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    uint64_t expected[MAX_NAMES];
    int n_expected = 0, n_names = 0;
    for (char *line = text, *next; line != NULL && n_names < MAX_NAMES; line = next, n_names++) {
        next = strchr(line, '\n');
        if (next != NULL) { *next++ = '\0'; }
        uint64_t step;
        if (checkpoint_step_of_name(line, &step)) {
            char written[64];
            checkpoint_path(written, sizeof(written), "", step);
            if (strcmp(written + 1, line) != 0) { abort(); }  // only what checkpoint_path writes
        }
        if (line[0] == '\0' || strchr(line, '/') != NULL || strcmp(line, ".") == 0 || strcmp(line, "..") == 0) { continue; }
        char path[VLA_PATH_MAX + 300];
        snprintf(path, sizeof(path), "%s/%s", dir, line);
        if (link(template_path, path) != 0) {
            if (errno == EEXIST || errno == ENAMETOOLONG) { continue; }  // a name twice, or too long for a file
            perror("link");
            abort();
        }
        if (checkpoint_step_of_name(line, &step)) { expected[n_expected++] = step; }
    }
    free(text);
    int max = (int)(size % 6);
    uint64_t steps[MAX_NAMES];
    int n = checkpoint_list(dir, steps, max);
    qsort(expected, (size_t)n_expected, sizeof(uint64_t), compare_steps_down);
    if (n != (n_expected < max ? n_expected : max)) { abort(); }
    for (int i = 0; i < n; i++) {
        if (steps[i] != expected[i]) { abort(); }
    }
    fuzz_clear_dir(dir);
    return 0;
}
