/*
vla/runs.h: what both trainers do around their model: the run folder taken (locked, the
input checked against it, an earlier run moved aside or gone back to), the config for the data,
where a run starts (fresh, --init, -y 1), its checkpoints saved and loaded with what they must
agree on, and evaluation batches. Needs config.h, shards.h, dataset.h, sampler.h, loader.h,
loss_scale.h, checkpoint.h, cli.h and run_folder.h.
*/
#ifndef VLA_RUNS_H
#define VLA_RUNS_H

#include <stdarg.h>
#include "common.h"
#include "config.h"
#include "shards.h"
#include "dataset.h"
#include "sampler.h"
#include "loader.h"
#include "loss_scale.h"
#include "checkpoint.h"
#include "cli.h"
#include "run_folder.h"
#include <sys/file.h>

// -i must not read from the run folder: the trainer writes its checkpoints there (and a
// checkpoint read as a shard is not data).
static inline void run_folder_check_input(const char* spec) {
    char** files;
    int n = dataset_list_files(spec, &files);
    for (int i = 0; i < n; i++) {
        if (run_folder_contains(files[i])) {
            vla_fail("-i %s reads %s from the output folder %s, where the run writes its checkpoints: keep the dataset "
                     "and the run in separate folders (-i, -o)", spec, files[i], run_folder.path);
        }
    }
    for (int i = 0; i < n; i++) { free(files[i]); }
    free(files);
}

// --init of one of the folder's own checkpoints at step `step` takes the run back there: its later
// checkpoints would be pruned or overwritten by the steps taken again, and -y 1 could pick one of
// them up. They move into previous_<N>/ with a copy of log.jsonl (whose later lines the run
// drops, saying so), said in one line.
static inline void run_folder_go_back(const char* dir, const char* init, uint64_t step) {
    uint64_t steps[4096];
    int n = checkpoint_list(dir, steps, 4096), later = 0;
    while (later < n && steps[later] > step) { later++; }
    if (later == 0) { return; }
    char prev[VLA_PATH_MAX + 32], who[VLA_PATH_MAX + 64];
    snprintf(who, sizeof(who), "--init %s", init);
    run_folder_make_previous(dir, who, prev, sizeof(prev));
    for (int i = 0; i < later; i++) {
        char from[VLA_PATH_MAX], to[VLA_PATH_MAX + 64];
        checkpoint_path(from, sizeof(from), dir, steps[i]);
        snprintf(to, sizeof(to), "%s/%s", prev, strrchr(from, '/') + 1);
        if (rename(from, to) != 0) { vla_fail("%s: moving %s into %s failed: %s", who, from, prev, strerror(errno)); }
    }
    char log_path[VLA_PATH_MAX + 16], copy[VLA_PATH_MAX + 64];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", dir);
    snprintf(copy, sizeof(copy), "%s/log.jsonl", prev);
    FILE* in = fopen(log_path, "rb");
    int copied = in != NULL;
    if (in != NULL) {
        FILE* out = fopen(copy, "wb");
        char buf[65536];
        size_t got;
        int bad = out == NULL;
        while (!bad && (got = fread(buf, 1, sizeof(buf), in)) > 0) { bad = fwrite(buf, 1, got, out) != got; }
        if (out != NULL && fclose(out) != 0) { bad = 1; }
        fclose(in);
        if (bad) { vla_fail("%s: copying %s into %s failed: %s", who, log_path, prev, strerror(errno)); }
    }
    printf("%s goes back to step %llu: the %d later checkpoint(s) (up to step %llu)%s moved into %s/\n", who,
           (unsigned long long)step, later, (unsigned long long)steps[0], copied ? " and a copy of log.jsonl" : "",
           prev);
}

// Takes the run folder a->output for this process (the writer of the run), in this order: the
// folder made, locked (another trainer there: refused, naming it), -i checked against it, then
// --new-run moves the earlier run aside or stale temporary files go; a new run into a folder that
// holds a run is refused. A run continues the folder's run with -y 1 (run_start_checkpoint) or
// --init of one of its checkpoints (without --weights-only); every other run is new.
static inline void run_folder_open(const TrainArgs* a) {
    const char* dir = a->output;
    if (!train_args_given(a, "output")) { make_dir(VLA_OUTPUT_ROOT); }  // the default's parent: out/<preset>
    make_dir(dir);
    snprintf(run_folder.path, sizeof(run_folder.path), "%s", dir);
    char lock_path[VLA_PATH_MAX + 16], fix[VLA_PATH_MAX + 128];
    snprintf(lock_path, sizeof(lock_path), "%s/.lock", dir);
    // never through a link: truncating a .lock that is a link to elsewhere would empty a user's file
    int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0 && errno == ELOOP) {
        vla_fail("%s is a symbolic link, not a lock file of train_vla's: remove the link (the file it points to is "
                 "untouched), or write elsewhere with -o", lock_path);
    }
    if (fd < 0) {
        int err = errno;
        vla_fail("cannot write into the output folder %s (creating %s: %s): %s, or pick another with -o", dir,
                 lock_path, strerror(err), write_failure_fix(err, dir, fix, sizeof(fix)));
    }
    struct stat lock_st;
    int regular = fstat(fd, &lock_st) == 0 && S_ISREG(lock_st.st_mode);
    if (!regular || lock_st.st_nlink != 1) {  // a hard link would empty a file elsewhere as a symbolic one would
        close(fd);
        vla_fail("%s is %s, not a lock file of train_vla's: remove it (nothing was written to it), or write elsewhere "
                 "with -o", lock_path, regular ? "a file with other hard links" : "not a regular file");
    }
    int locked = flock(fd, LOCK_EX | LOCK_NB), err = errno;
    char holder[256];  // the line of the trainer that holds it, or held it and was killed
    ssize_t got = pread(fd, holder, sizeof(holder) - 1, 0);
    holder[got > 0 ? got : 0] = '\0';
    holder[strcspn(holder, "\n")] = '\0';
    char holder_text[4 * sizeof(holder)];  // the file's bytes, quoted: one line whatever it holds
    text_escaped(holder, sizeof(holder), holder_text, sizeof(holder_text));
    if (locked != 0 && err == EWOULDBLOCK) {
        vla_fail(
            "the output folder %s is in use by another trainer (%s): wait for it to end, or write elsewhere with -o",
            dir, holder[0] != '\0' ? holder_text : "it has just started");
    }
    if (locked != 0) {
        vla_fail("cannot lock %s: %s: pick an output folder on a file system with locks (-o)", lock_path,
                 strerror(err));
    }
    if (holder[0] != '\0') {
        printf("note: %s names %s, which ended without releasing it: taking it over\n", lock_path, holder_text);
    }
    char host[128] = "?", started[64];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(started, sizeof(started), "%Y-%m-%d %H:%M:%S UTC", &utc);
    char line[300];
    int len = snprintf(line, sizeof(line), "pid %d on %s, since %s\n", (int)getpid(), host, started);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        int err = errno;
        vla_fail("cannot write %s: %s: %s, or pick another output folder with -o", lock_path, strerror(err),
                 write_failure_fix(err, dir, fix, sizeof(fix)));
    }
    struct stat st;
    run_folder.dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (run_folder.dir_fd < 0 || fstat(run_folder.dir_fd, &st) != 0) {
        vla_fail("cannot open the output folder %s: %s", dir, strerror(errno));
    }
    run_folder.dev = st.st_dev;
    run_folder.ino = st.st_ino;
    run_folder.lock_fd = fd;
    atexit(run_folder_release);

    run_folder_check_input(a->input);
    int continues = a->resume || (a->init != NULL && !a->weights_only && run_folder_contains(a->init));
    if (a->new_run && a->init != NULL && run_folder_contains(a->init)) {
        vla_fail("--init %s is in %s, the run --new-run moves aside: copy it elsewhere first, or continue that run "
                 "without --new-run", a->init, dir);
    }
    if (a->new_run) { run_folder_move_aside(dir, "--new-run"); }
    CheckpointHeader h;
    char problem[VLA_PATH_MAX + 512];  // (a bad --init is refused, with this, when it is read)
    if (continues && !a->resume && checkpoint_read_header(a->init, &h, problem, sizeof(problem)) == 0) {
        run_folder_go_back(dir, a->init, h.step);
    }
    run_folder_remove_stale(dir);
    char what[128];
    if (!continues && run_folder_holds_run(dir, what, sizeof(what), NULL)) {
        vla_fail(
            "the output folder %s holds a run (%s): continue it with -y 1 -o %s, or start anew with --new-run (the "
            "earlier run moves into %s/previous_<N>/)",
            dir, what, dir, dir);
    }
}

// ----------------------------------------------------------------------------
// runs: what both trainers do around their model (config, where to start, checkpoints)

// An instruction of the dataset: its text, its token ids, and where it was first met (shard order).
typedef struct { const uint8_t* text; uint64_t len; const int32_t* ids; uint64_t n_ids; size_t order; } Instruction;

static inline int instruction_compare_text(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    int c = memcmp(a->text, b->text, a->len < b->len ? a->len : b->len);
    if (c == 0) { c = a->len < b->len ? -1 : a->len > b->len; }
    return c != 0 ? c : (a->order < b->order ? -1 : a->order > b->order);
}

// Token ids in lexicographic order (a prefix before what extends it), then first met.
static inline int instruction_compare_ids(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    uint64_t m = a->n_ids < b->n_ids ? a->n_ids : b->n_ids;
    for (uint64_t k = 0; k < m; k++) {
        if (a->ids[k] != b->ids[k]) { return a->ids[k] < b->ids[k] ? -1 : 1; }
    }
    if (a->n_ids != b->n_ids) { return a->n_ids < b->n_ids ? -1 : 1; }
    return a->order < b->order ? -1 : a->order > b->order;
}

static inline int instruction_compare_order(const void* pa, const void* pb) {
    const Instruction *a = (const Instruction*)pa, *b = (const Instruction*)pb;
    return a->order < b->order ? -1 : a->order > b->order;
}

typedef struct { size_t first, count; } InstructionGroup;  // a run of the sorted instructions

static inline int instruction_group_compare(const void* pa, const void* pb, void* ins) {
    size_t a = ((const Instruction*)ins)[((const InstructionGroup*)pa)->first].order;
    size_t b = ((const Instruction*)ins)[((const InstructionGroup*)pb)->first].order;
    return a < b ? -1 : a > b;
}

// Warns when distinct instructions of the dataset read the same once their token ids are cut to
// max_text: the model could not tell those tasks apart. One line per group, naming its
// instructions, in the order the shards first name them; the first VLA_COLLISION_LINES groups and
// VLA_COLLISION_NAMES names a group, then how many more. Sorting makes it O(n log n): sorted by
// their ids, the instructions of a group are neighbours, and the longest prefix two instructions
// share is shared by two neighbours. Returns the number of instructions that collide with an
// earlier one.
#define VLA_COLLISION_LINES 10
#define VLA_COLLISION_NAMES 10
static inline int dataset_warn_text_collisions(const Dataset* ds, int max_text) {
    // the distinct instructions over all shards (each shard has its own table), with their tokens
    size_t n = 0, cap = 0;
    for (int s = 0; s < ds->n_shards; s++) { cap += ds->shards[s].h.n_tasks; }
    Instruction* ins = (Instruction*)mallocCheck((cap > 0 ? cap : 1) * sizeof(Instruction));
    for (int s = 0; s < ds->n_shards; s++) {
        const Shard* sh = &ds->shards[s];
        for (uint64_t k = 0; k < sh->h.n_tasks; k++) {
            Instruction t = {sh->task_text + sh->task_offsets[k], sh->task_offsets[k + 1] - sh->task_offsets[k],
                             sh->tokens + sh->token_offsets[k], sh->token_offsets[k + 1] - sh->token_offsets[k], n};
            ins[n++] = t;
        }
    }
    qsort(ins, n, sizeof(Instruction), instruction_compare_text);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {  // the first of equal texts stays
        if (distinct == 0 || ins[distinct - 1].len != ins[i].len ||
            memcmp(ins[distinct - 1].text, ins[i].text, ins[i].len) != 0) { ins[distinct++] = ins[i]; }
    }
    n = distinct;
    qsort(ins, n, sizeof(Instruction), instruction_compare_ids);
    // the fewest tokens that keep every pair apart: one past their longest common prefix
    uint64_t need = 1;
    for (size_t i = 0; i + 1 < n; i++) {
        uint64_t p = 0, m = ins[i].n_ids < ins[i + 1].n_ids ? ins[i].n_ids : ins[i + 1].n_ids;
        while (p < m && ins[i].ids[p] == ins[i + 1].ids[p]) { p++; }
        if (p + 1 > need) { need = p + 1; }
    }
    // the groups: runs of neighbours equal in their first max_text ids (and as long once cut)
    InstructionGroup* groups = (InstructionGroup*)mallocCheck((n > 0 ? n : 1) * sizeof(InstructionGroup));
    size_t n_groups = 0;
    int collisions = 0;
    for (size_t i = 0; i < n;) {
        uint64_t li = ins[i].n_ids < (uint64_t)max_text ? ins[i].n_ids : (uint64_t)max_text;
        size_t j = i + 1;
        while (j < n) {
            uint64_t lj = ins[j].n_ids < (uint64_t)max_text ? ins[j].n_ids : (uint64_t)max_text;
            if (li != lj || memcmp(ins[i].ids, ins[j].ids, li * sizeof(int32_t)) != 0) { break; }
            j++;
        }
        if (j - i > 1) {
            qsort(ins + i, j - i, sizeof(Instruction), instruction_compare_order);
            InstructionGroup g = {i, j - i};
            groups[n_groups++] = g;
            collisions += (int)(j - i - 1);
        }
        i = j;
    }
    qsort_r(groups, n_groups, sizeof(InstructionGroup), instruction_group_compare, ins);
    const char* unit = strcmp(ds->tokenizer, SHARD_TOKENIZER_BYTES) == 0 ? "bytes" : "tokens";
    for (size_t g = 0; g < n_groups && g < VLA_COLLISION_LINES; g++) {
        const Instruction* first = &ins[groups[g].first];
        printf("warning: these instructions are the same in their first %d %s, so the model reads them as one task: ",
               max_text, unit);
        for (size_t k = 0; k < groups[g].count && k < VLA_COLLISION_NAMES; k++) {
            printf("%s\"%.*s\"", k > 0 ? ", " : "", (int)first[k].len, (const char*)first[k].text);
        }
        if (groups[g].count > VLA_COLLISION_NAMES) { printf(" and %zu more", groups[g].count - VLA_COLLISION_NAMES); }
        printf(" (--max-text %llu keeps every instruction distinct)\n", (unsigned long long)need);
    }
    if (n_groups > VLA_COLLISION_LINES) {
        printf("warning: and %zu more groups of instructions the same in their first %d %s: %d of the %zu distinct "
               "instructions read as another (--max-text %llu keeps every instruction distinct)\n",
               n_groups - VLA_COLLISION_LINES, max_text, unit, collisions, n, (unsigned long long)need);
    }
    free(groups); free(ins);
    return collisions;
}

// A model's sizes (`what`: "preset NAME" or the checkpoint they come from) with the dataset's
// cameras, state and action dims, and max_text tokens of instruction (0: the sizes' own). Cameras
// may have any size (the model resizes them with padding); state and action dims must fit
// max_state_dim / max_action_dim, the token ids the vocabulary. Warns when instructions become
// identical once cut.
static inline FlowConfig config_with_data(FlowConfig c, const char* what, int max_text, const Dataset* ds) {
    if (ds->cams.n > VLA_MAX_CAM) {
        vla_fail("the dataset has %d cameras, past the bound %d", ds->cams.n, VLA_MAX_CAM);
    }
    if (ds->state_dim > c.max_state_dim || ds->action_dim > c.max_action_dim) {
        vla_fail("the dataset's state and action have %d and %d dims, but %s pads them to %d and %d: pick data "
                 "with at most that many dims", ds->state_dim, ds->action_dim, what, c.max_state_dim, c.max_action_dim);
    }
    if (ds->vocab > (uint32_t)c.vocab) {
        vla_fail(
            "the dataset's instructions are token ids of tokenizer %s, a vocabulary of %u, but %s's text "
            "table has %d rows: convert the data with the model's tokenizer, or with byte tokens (the data/ tools' "
            "default) for the presets trained from scratch",
            ds->tokenizer, ds->vocab, what, c.vocab);
    }
    c.n_cam = ds->cams.n; c.state_dim = ds->state_dim; c.action_dim = ds->action_dim;
    if (max_text > 0) { c.max_text = max_text; }
    const char* problem = flow_config_problem(&c);
    if (problem != NULL) { vla_fail("%s does not fit the dataset: %s: pick another preset", what, problem); }
    dataset_warn_text_collisions(ds, c.max_text);
    return c;
}

// The model config of preset `preset` on dataset ds (max_text 0: the preset's).
static inline FlowConfig config_for_data(const char* preset, int max_text, const Dataset* ds) {
    char what[80];
    snprintf(what, sizeof(what), "preset %s", preset);
    return config_with_data(flow_preset(preset)->config, what, max_text, ds);
}

// The first field where model sizes `sizes` and config c differ, the fields the data and
// --max-text set (cameras, state and action dims, max_text) aside: no tensor depends on them.
static inline const char* flow_sizes_diff(FlowConfig sizes, const FlowConfig* c) {
    sizes.n_cam = c->n_cam;
    sizes.state_dim = c->state_dim;
    sizes.action_dim = c->action_dim;
    sizes.max_text = c->max_text;
    return flow_config_diff(&sizes, c);
}

// The preset whose sizes c has, or NULL.
static inline const char* flow_preset_of(const FlowConfig* c) {
    for (int i = 0; i < FLOW_N_PRESETS; i++) {
        if (flow_sizes_diff(FLOW_PRESETS[i].config, c) == NULL) { return FLOW_PRESETS[i].name; }
    }
    return NULL;
}

// The checkpoint a run starts from: --init, or with -y 1 the newest intact one in the output
// folder (written into buf; a corrupt one is skipped with one line saying so), or NULL to start
// from the seed. Checking a checksum reads the file once more (~2 s for 2.4 GB, then cached).
static inline const char* run_start_checkpoint(const TrainArgs* args, char* buf, size_t size) {
    if (!args->resume) { return args->init; }
    enum { NEWEST = 64 };
    uint64_t steps[NEWEST];
    int n = checkpoint_list(args->output, steps, NEWEST);
    for (int i = 0; i < n; i++) {
        char err[VLA_PATH_MAX + 512];
        checkpoint_path(buf, size, args->output, steps[i]);
        CheckpointHeader h;
        if (checkpoint_verify(buf, err, sizeof(err)) == 0 && checkpoint_read_header(buf, &h, err, sizeof(err)) == 0) {
            if (h.step == steps[i]) { return buf; }
            // a copy renamed to a later step's name would continue from the wrong place
            snprintf(err, sizeof(err), "%s: its header says step %llu, but its name says step %llu (a renamed copy?)",
                     buf, (unsigned long long)h.step, (unsigned long long)steps[i]);
        }
        fprintf(stderr, "warning: skipping %s; %s\n", err,
                i + 1 < n ? "falling back to the one before it" : "there is no older one");
    }
    if (n > 0) {
        vla_fail("no intact checkpoint in %s (the %d complete one%s failed the checks above): pick an intact one with "
                 "--init, or start anew with --new-run (the run moves into %s/previous_<N>/) or in another folder (-o)",
                 args->output, n, n == 1 ? "" : "s", args->output);
    }
    // checkpoint files, none of them usable: refused (they may be recovered; a new run would prune
    // them). A log alone is of a run that stopped before its first checkpoint: it moves aside.
    char what[128];
    int checkpoints;
    if (run_folder_holds_run(args->output, what, sizeof(what), &checkpoints) && checkpoints > 0) {
        vla_fail(
            "-y 1: %s holds a run (%s) but no checkpoint that can continue it (the warnings above say why): start "
            "anew with --new-run (the run moves into %s/previous_<N>/), or continue from a checkpoint of yours with "
            "--init",
            args->output, what, args->output);
    }
    if (run_folder.lock_fd >= 0) { run_folder_move_aside(args->output, "-y 1 found no checkpoint to continue"); }
    printf("-y 1: no checkpoint in %s yet: starting from scratch\n", args->output);
    return NULL;
}

// A checkpoint's weights read token ids of its tokenizer: the dataset's must be of the same one.
static inline void run_check_tokenizer(const char* path, const Checkpoint* ck, const Dataset* ds) {
    if (strcmp(ck->tokenizer, ds->tokenizer) != 0) {
        vla_fail(
            "checkpoint %s was trained on token ids of tokenizer %s, the dataset's are of %s: convert the data with "
            "the checkpoint's tokenizer",
            path, ck->tokenizer, ds->tokenizer);
    }
}

// The model a run trains. From the seed: -p's sizes. From a checkpoint `from` (-y 1, --init): its
// sizes unless -p is given, and its --train mode unless --train is given. Cameras, state and action
// dims come from the dataset and the text length from --max-text, else from the checkpoint or
// the preset. Continuing a checkpoint then needs all of them unchanged (run_checkpoint_load says
// which differs); a weights-only start (--weights-only) does not, since no tensor depends on them:
// a model imported from LeRobot, or trained on other data, fine-tunes on this dataset as it is.
// With -p too, a weights-only start checks that the checkpoint has the preset's sizes. First,
// --augment-shift is checked against the dataset's cameras.
static inline FlowConfig run_config(TrainArgs* a, const char* from, const Dataset* ds) {
    // a shift past half of a camera's side moves most of its image out: the camera would show its border
    for (int k = 0; k < ds->cams.n; k++) {
        uint32_t h = ds->cams.height[k], w = ds->cams.width[k], most = ((h < w ? h : w) - 1) / 2;
        if ((uint32_t)a->augment > most) {
            vla_fail("--augment-shift %d is past half of camera %d's %ux%u frames in %s: pass at most %u (or 0, off)",
                     a->augment, k, h, w, a->input, most);
        }
    }
    if (from == NULL) { return config_for_data(a->preset, a->max_text, ds); }
    CheckpointHeader h;
    char err[VLA_PATH_MAX + 512];
    if (checkpoint_read_header(from, &h, err, sizeof(err)) != 0) { vla_fail("%s", err); }
    if (!a->train_given) { a->train_mode = h.train_mode; }
    if (a->preset_given && !a->weights_only) { return config_for_data(a->preset, a->max_text, ds); }
    char what[VLA_PATH_MAX + 32];
    snprintf(what, sizeof(what), "the model of %s", from);
    FlowConfig hc = ckpt_header_config(&h);
    FlowConfig c = config_with_data(hc, what, a->max_text > 0 ? a->max_text : hc.max_text, ds);
    if (a->preset_given) {
        const char* diff = flow_sizes_diff(c, &flow_preset(a->preset)->config);
        if (diff != NULL) {
            vla_fail(
                "checkpoint %s has other sizes than preset %s (%s, checkpoint vs preset): drop -p to fine-tune the "
                "checkpoint's model",
                from, a->preset, diff);
        }
    } else {
        const char* preset = flow_preset_of(&c);
        a->preset = preset != NULL ? preset : "(checkpoint's)";
    }
    return c;
}

// --init FILE --weights-only: the checkpoint's weights (all of them, frozen ones too) as the start
// of a new run of model c on dataset ds: the sizes must be c's (run_config made c from them) and the
// token ids of the same tokenizer; its moments, step, sampler position, seed and statistics are not
// used (the run starts at step 0 with fresh moments, its own seed and the dataset's statistics).
static inline void run_weights_load(const char* path, const FlowConfig* c, const Dataset* ds, Checkpoint* ck) {
    checkpoint_read(path, ck);
    const char* diff = flow_sizes_diff(ck->config, c);
    if (diff != NULL) {
        vla_fail("checkpoint %s has other sizes than this run's model (%s, checkpoint vs this run): drop -p to "
                 "fine-tune the checkpoint's model", path, diff);
    }
    run_check_tokenizer(path, ck, ds);
    free(ck->m); free(ck->v);
    ck->m = ck->v = NULL;
    ck->step = 0;
    ck->sampler_pos = 0;
}

// How a run starts, for its config table's "start" row (the "from" row names the checkpoint):
// from the seed, continuing a checkpoint, or from a checkpoint's weights alone (fine-tuning).
static inline const char* run_start_kind(const TrainArgs* a, const char* from) {
    return from == NULL ? "seed" : a->weights_only ? "weights" : "continue";
}

// FNV-1a, 64 bits: the dataset fingerprint's hash (a few MB at most, so speed does not matter).
static inline uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    for (size_t k = 0; k < n; k++) { h = (h ^ p[k]) * 0x100000001B3ULL; }
    return h;
}

// A 64-bit fingerprint of the data a run trains on, never 0: of each shard in order, its sizes
// (cameras, dims, frames, episodes, tasks, tokens, tokenizer), its statistics, episode table and
// task text; not the frames (cheap at start-up, and a version-1 shard fingerprints as its
// version-2 conversion). Checkpoints record it so that a resume on other data is caught.
static inline uint64_t dataset_fingerprint(const Dataset* ds) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < ds->n_shards; i++) {
        const Shard* s = &ds->shards[i];
        Cameras cams = shard_cameras(&s->h);
        uint64_t sizes[9] = {(uint64_t)cams.n, s->h.state_dim, s->h.action_dim, s->h.n_frames, s->h.n_episodes,
                             s->h.n_tasks, s->h.task_bytes, s->h.n_tokens, s->h.vocab};
        h = fnv1a64(h, sizes, sizeof(sizes));
        h = fnv1a64(h, cams.height, (size_t)cams.n * sizeof(uint32_t));
        h = fnv1a64(h, cams.width, (size_t)cams.n * sizeof(uint32_t));
        h = fnv1a64(h, s->h.tokenizer, strnlen(s->h.tokenizer, sizeof(s->h.tokenizer)));
        h = fnv1a64(h, s->stats, 2 * (size_t)(s->h.state_dim + s->h.action_dim) * sizeof(float));
        h = fnv1a64(h, s->episodes, (size_t)s->h.n_episodes * sizeof(ShardEpisode));
        h = fnv1a64(h, s->task_offsets, (size_t)(s->h.n_tasks + 1) * sizeof(uint64_t));
        h = fnv1a64(h, s->task_text, (size_t)s->h.task_bytes);
    }
    return h != 0 ? h : 1;
}

// Writes step `step` of a run: host copies of every fp32 master weight (n_params, table order)
// and the AdamW moments of the elements trainable in args->train_mode (n_trainable each, packed as
// FlowOptDomain), with the dataset's normalization statistics and tokenizer; keeps the newest
// args->keep checkpoints. loss_scale: fp16 builds' dynamic loss scale, NULL where there is none.
static inline void run_checkpoint_save(const TrainArgs* args, const Dataset* ds, const FlowConfig* c, int step,
                                       uint64_t sampler_pos, float* params, size_t n_params, float* m, float* v,
                                       size_t n_trainable, const LossScaleState* loss_scale) {
    int S = c->state_dim, A = c->action_dim;
    float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
    memcpy(stats, ds->state_mean, S * sizeof(float));
    memcpy(stats + S, ds->state_std, S * sizeof(float));
    memcpy(stats + 2 * S, ds->action_mean, A * sizeof(float));
    memcpy(stats + 2 * S + A, ds->action_std, A * sizeof(float));
    Checkpoint ck;
    memset(&ck, 0, sizeof(ck));
    ck.config = *c; ck.train_mode = args->train_mode; ck.step = (uint64_t)step; ck.seed = args->seed;
    ck.sampler_pos = sampler_pos; ck.n_params = n_params; ck.n_trainable = n_trainable;
    ck.balance = args->balance; ck.balance_id = args->balance_id;
    int world = args->ranks * args->nodes;
    ck.run.batch = (uint32_t)args->batch; ck.run.world = (uint32_t)world;
    ck.run.total_batch = (uint64_t)train_global_batch(args, world); ck.run.data_id = dataset_fingerprint(ds);
    if (loss_scale != NULL) { ck.loss_scale = *loss_scale; }
    ck.stats = stats; ck.params = params; ck.m = m; ck.v = v;
    snprintf(ck.tokenizer, sizeof(ck.tokenizer), "%s", ds->tokenizer);
    char path[VLA_PATH_MAX], what[64];
    snprintf(what, sizeof(what), "step %d's checkpoint", step);
    run_folder_check(args->output, what);
    checkpoint_path(path, sizeof(path), args->output, (uint64_t)step);
    checkpoint_write(path, &ck);
    checkpoint_prune(args->output, args->keep);
    printf("checkpoint of step %d: %s\n", step, path);
    free(stats);
}

// What a resume of checkpoint ck by a run of args on dataset ds says: another dataset is refused
// (its weights alone may start a run: --weights-only); another batch or world size is said in one
// line; a checkpoint that records no run gets a note that none of this could be checked.
static inline void run_check_resume(const char* path, const Checkpoint* ck, const TrainArgs* args, const Dataset* ds) {
    const CheckpointRun* was = &ck->run;
    if (was->batch == 0) {
        fprintf(stderr, "note: checkpoint %s records no batch size, world size or dataset (an older train_vla's, or a "
                "converter's): this resume cannot check them\n", path);
        return;
    }
    uint64_t data_id = dataset_fingerprint(ds);
    if (was->data_id != data_id) {
        vla_fail(
            "checkpoint %s trained on another dataset (fingerprint %016llx, -i %s has %016llx): continue it on the "
            "data it trained on, or start from its weights alone with --init %s --weights-only",
            path, (unsigned long long)was->data_id, args->input, (unsigned long long)data_id, path);
    }
    int world = args->ranks * args->nodes;
    uint64_t total = (uint64_t)train_global_batch(args, world);
    if (was->batch != (uint32_t)args->batch || was->world != (uint32_t)world || was->total_batch != total) {
        printf(
            "resuming with -b %d on %d rank(s), %llu samples per step (the checkpoint's run: -b %u on %u, %llu): the "
            "sampler continues from sample %llu; %s\n",
            args->batch, world, (unsigned long long)total, was->batch, was->world, (unsigned long long)was->total_batch,
            (unsigned long long)ck->sampler_pos,
            was->total_batch != total ? "the loss curve's steps change size"
                                      : "steps keep their size, the losses their values only to rounding");
    }
}

// Reads a checkpoint to continue the model of config c on dataset ds with args' train mode and
// balance (args->balance_id once the trainer built its TaskBalance); fails if it was written for
// another model, mode, tokenizer, balance or dataset, and says what changes with the batch.
static inline void run_checkpoint_load(const char* path, const FlowConfig* c, const TrainArgs* args,
                                       const Dataset* ds, Checkpoint* ck) {
    int mode = args->train_mode, balance = args->balance;
    uint64_t balance_id = args->balance_id;
    checkpoint_read(path, ck);
    if (ck->balance != balance) {
        vla_fail(
            "checkpoint %s trained with --balance %s, this run with --balance %s: pass --balance %s to continue it",
            path, BALANCE_NAMES[ck->balance], BALANCE_NAMES[balance], BALANCE_NAMES[ck->balance]);
    }
    if (ck->balance_id != balance_id) {
        vla_fail("checkpoint %s balanced other task weights (or another task count) than this run: pass the "
                 "--task-weights it trained with to continue it", path);
    }
    const char* diff = flow_config_diff(&ck->config, c);
    if (diff != NULL) {
        vla_fail("checkpoint %s was written for another model (%s, checkpoint vs this run): use the same preset, "
                 "--max-text and dataset, or another output folder (-o)", path, diff);
    }
    if (ck->train_mode != mode) {
        vla_fail("checkpoint %s trained with --train %s, this run with --train %s: pass --train %s to continue it",
                 path, TRAIN_MODE_NAMES[ck->train_mode], TRAIN_MODE_NAMES[mode], TRAIN_MODE_NAMES[ck->train_mode]);
    }
    run_check_tokenizer(path, ck, ds);
    run_check_resume(path, ck, args, ds);
}

// Whether a run that continues from checkpoint `from` at step `start` has steps left to take
// (1), or is done (0, said on stdout). A checkpoint past the run's end is refused.
static inline int run_has_steps_left(const char* from, int start, int steps) {
    if (start > steps) {
        vla_fail("checkpoint %s is at step %d, past this run's end (-n %d): pass -n above %d to train further, or "
                 "another output folder (-o) for a new run", from, start, steps, start);
    }
    if (start == steps) {
        printf("already at step %d of %d: nothing to do (raise -n to train further)\n", start, steps);
    }
    return start < steps;
}

// The batch the end-of-run evaluation samples actions for: B samples from sampler position pos,
// with the flow noise of step `step` (its eps is the starting noise).
static inline void eval_batch(Batch* batch, const Dataset* ds, const FlowConfig* c, uint64_t seed, uint64_t pos,
                              int step) {
    Sampler sampler;
    sampler_init(&sampler, ds->n_samples, seed);
    uint64_t* idx = (uint64_t*)mallocCheck((size_t)batch->B * sizeof(uint64_t));
    batch_fill_indices(idx, &sampler, pos, 0, 0, batch->B, 1, 0);
    batch_fill(batch, ds, c, idx, seed, (uint64_t)step, 0, 0);
    char err[VLA_PATH_MAX + 256];
    if (dataset_unchanged(ds, idx, batch->B, err, sizeof(err)) != 0) { vla_fail("%s", err); }
    free(idx);
    sampler_free(&sampler);
}

// Mean squared error of sampled actions (B, H, A: the dataset's dims, data units) against the
// batch's over the slots inside the episode, in the data's own units.
static inline float action_mse(const Batch* batch, const Dataset* ds, const FlowConfig* c,
                               const float* sampled) {
    int A = c->action_dim, Amax = c->max_action_dim, H = c->chunk;
    double se = 0.0;
    size_t n = 0;
    for (size_t k = 0; k < (size_t)batch->B * H * A; k++) {
        size_t slot = k / A;
        int dim = (int)(k % A);
        if (batch->action_is_pad[slot] != 0.0f) { continue; }
        double truth = (double)batch->actions[slot * Amax + dim] * ds->action_std[dim] + ds->action_mean[dim];
        se += (sampled[k] - truth) * (sampled[k] - truth);
        n++;
    }
    return (float)(se / (double)(n > 0 ? n : 1));
}

// ---- the config table both trainers print before they train: a row is a name and a value

static inline void table_rule(void) { printf("+------------------------+--------------------------------------+\n"); }

// A value longer than its column goes on over the rows below, broken after a '/', ',' or ' '
// where one is near the column's end (a path, a list), else at the column's end.
enum { TABLE_VALUE_COLUMN = 36 };
static inline void table_row(const char* name, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void table_row(const char* name, const char* fmt, ...) {
    char value[VLA_PATH_MAX + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    const char* rest = value;
    do {
        int n = (int)strlen(rest);
        if (n > TABLE_VALUE_COLUMN) {
            n = TABLE_VALUE_COLUMN;
            for (int k = TABLE_VALUE_COLUMN; k > TABLE_VALUE_COLUMN / 2; k--) {
                if (strchr("/, ", rest[k - 1]) != NULL) { n = k; break; }
            }
        }
        printf("| %-22s | %-36.*s |\n", rest == value ? name : "", n, rest);
        rest += n;
    } while (*rest != '\0');
}

// The rows both trainers print first: the trainer and its preset, the model's config, what trains,
// where the run starts, the data, and the batch over `world` ranks (`ranks`: what a rank is, "GPUs")
static inline void table_run_rows(const char* trainer, const char* ranks, const TrainArgs* args, const FlowConfig* c,
                                  size_t params, size_t trainable, const char* from, const Dataset* ds, int world) {
    table_rule();
    table_row(trainer, "%s", args->preset);
    table_rule();
#define TABLE_CONFIG_ROW_(f) table_row(#f, "%d", c->f);
    FLOW_CONFIG_FIELDS(TABLE_CONFIG_ROW_)
#undef TABLE_CONFIG_ROW_
    table_row("parameters", "%zu", params);
    table_row("trainable", "%zu (%.1f%%)", trainable, 100.0 * (double)trainable / (double)params);
    table_row("train mode (--train)", "%s", TRAIN_MODE_NAMES[args->train_mode]);
    table_row("start", "%s", run_start_kind(args, from));
    if (from != NULL) { table_row("from", "%s", from); }
    table_row("output (-o)", "%s", args->output);
    table_row("data (-i)", "%s", args->input);
    table_row("dataset samples", "%llu", (unsigned long long)ds->n_samples);
    table_row("shards", "%d", ds->n_shards);
    char cams[128], what[40];
    table_row("cameras (h x w)", "%s", cameras_describe(&ds->cams, cams, sizeof(cams)));
    snprintf(what, sizeof(what), "%s x batch x accum", ranks);
    table_row(what, "%d x %d x %d", world, args->batch, args->accum);
    table_row("effective batch", "%lld", (long long)train_global_batch(args, world));
    table_row("steps (-n)", "%d", args->steps);
    table_row("peak learning rate", "%g (--lr-scale %s)", args->lr, LR_SCALE_NAMES[args->lr_scale]);
    table_row("schedule", "warmup %d steps, cosine to %g x peak", args->warmup, args->min_lr_frac);
    if (args->grad_clip > 0.0f) { table_row("gradient clip (-c)", "%g", args->grad_clip); }
    else { table_row("gradient clip (-c)", "off"); }
    table_row("seed (-s)", "%llu", (unsigned long long)args->seed);
    table_row("weight decay", "%g on %s (--decay-on)", args->weight_decay, DECAY_ON_NAMES[args->decay_on]);
    table_row("optimizer state", "%s", args->zero && world > 1 ? "sharded over the ranks (ZeRO-1)" : "on every rank");
}

// ... and the rows both print last: the loader, and the sampler's tasks (tb NULL: the plain one)
static inline void table_data_rows(const TrainArgs* args, const TaskBalance* tb, const Dataset* ds) {
    if (args->no_checkpoint) { table_row("checkpoints", "none (--no-checkpoint)"); }
    else if (args->ckpt_every > 0) { table_row("checkpoints", "every %d steps, %d kept", args->ckpt_every, args->keep); }
    else { table_row("checkpoints", "at the end, %d kept", args->keep); }
    table_row("loader threads", "%d", args->workers);
    table_row("augment shift (px)", "%d", args->augment);
    table_row("balance", "%s", BALANCE_NAMES[args->balance]);
    if (tb != NULL) { task_balance_print(tb, ds); }
}

#endif  // VLA_RUNS_H
