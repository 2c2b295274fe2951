/*
vla/run_record.h: the run's settings as a readable file, <output>/run.json, and -y 1 continuing
with them. The file holds one entry per start of the run that set them, keyed by the step it
started from; a resume takes the entry of its checkpoint's step, and the flags given again
change it (said in one line each), and a warning where the new settings make the learning rate
jump at the step the run continues from. Needs cli.h, schedule.h, atomic_file.h and run_folder.h.
*/
#ifndef VLA_RUN_RECORD_H
#define VLA_RUN_RECORD_H

#include "common.h"
#include "cli.h"
#include "schedule.h"
#include "run_folder.h"
#include "atomic_file.h"
#include <stddef.h>

// ----------------------------------------------------------------------------
// the settings a run records: each a field of TrainArgs under its option's long name
//
// On -y 1 a setting not given takes the recorded value. One given with another value than the
// record's: RUN_APPLY ones change the run from its checkpoint on, in one line naming the old and
// the new value; RUN_CHECKED ones are the checkpoint's to judge (another --balance, --max-text or
// dataset is refused there, as without a record); RUN_NOTED ones are kept for the reader alone
// (the checkpoint carries the preset's sizes, the --train mode and the seed; --init only starts).

enum { RUN_INT, RUN_FLOAT, RUN_U64, RUN_TEXT, RUN_NAME };  // RUN_NAME: an int indexing names
enum { RUN_APPLY, RUN_CHECKED, RUN_NOTED };

typedef struct {
    const char* option;  // the long option (TRAIN_ARGS_OPTIONS)
    int type;
    size_t offset;       // in TrainArgs
    const char* const* names;
    int n_names;
    int on_resume;
} RunSetting;

#define RUN_FIELD_(type, field) type, offsetof(TrainArgs, field), NULL, 0
#define RUN_NAMED_(field, names) RUN_NAME, offsetof(TrainArgs, field), names, (int)(sizeof(names) / sizeof(names[0]))
static const RunSetting RUN_SETTINGS[] = {
    {"input", RUN_FIELD_(RUN_TEXT, input), RUN_APPLY},
    {"preset", RUN_FIELD_(RUN_TEXT, preset), RUN_NOTED},
    {"train", RUN_NAMED_(train_mode, TRAIN_MODE_NAMES), RUN_NOTED},
    {"max-text", RUN_FIELD_(RUN_INT, max_text), RUN_CHECKED},
    {"batch", RUN_FIELD_(RUN_INT, batch), RUN_APPLY},
    {"gpus", RUN_FIELD_(RUN_INT, ranks), RUN_APPLY},
    {"total-batch", RUN_FIELD_(RUN_INT, total_batch), RUN_APPLY},
    {"steps", RUN_FIELD_(RUN_INT, steps), RUN_APPLY},
    {"lr", RUN_FIELD_(RUN_FLOAT, lr_base), RUN_APPLY},
    {"lr-scale", RUN_NAMED_(lr_scale, LR_SCALE_NAMES), RUN_APPLY},
    {"min-lr-frac", RUN_FIELD_(RUN_FLOAT, min_lr_frac), RUN_APPLY},
    {"warmup", RUN_FIELD_(RUN_INT, warmup), RUN_APPLY},
    {"weight-decay", RUN_FIELD_(RUN_FLOAT, weight_decay), RUN_APPLY},
    {"decay-on", RUN_NAMED_(decay_on, DECAY_ON_NAMES), RUN_APPLY},
    {"clip", RUN_FIELD_(RUN_FLOAT, grad_clip), RUN_APPLY},
    {"seed", RUN_FIELD_(RUN_U64, seed), RUN_NOTED},
    {"zero", RUN_FIELD_(RUN_INT, zero), RUN_APPLY},
    {"recompute", RUN_NAMED_(recompute, RECOMPUTE_NAMES), RUN_APPLY},
    {"ckpt-every", RUN_FIELD_(RUN_INT, ckpt_every), RUN_APPLY},
    {"keep", RUN_FIELD_(RUN_INT, keep), RUN_APPLY},
    {"no-checkpoint", RUN_FIELD_(RUN_INT, no_checkpoint), RUN_APPLY},
    {"log-every", RUN_FIELD_(RUN_INT, log_every), RUN_APPLY},
    {"threads", RUN_FIELD_(RUN_INT, threads), RUN_APPLY},
    {"workers", RUN_FIELD_(RUN_INT, workers), RUN_APPLY},
    {"augment-shift", RUN_FIELD_(RUN_INT, augment), RUN_APPLY},
    {"balance", RUN_NAMED_(balance, BALANCE_NAMES), RUN_CHECKED},
    {"task-weights", RUN_FIELD_(RUN_TEXT, task_weights), RUN_CHECKED},
    {"loss-scale", RUN_FIELD_(RUN_FLOAT, loss_scale), RUN_APPLY},
    {"loss-scale-window", RUN_FIELD_(RUN_INT, loss_scale_window), RUN_APPLY},
    {"eval-every", RUN_FIELD_(RUN_INT, eval_every), RUN_APPLY},
    {"eval-cmd", RUN_FIELD_(RUN_TEXT, eval_cmd), RUN_APPLY},
    {"init", RUN_FIELD_(RUN_TEXT, init), RUN_NOTED},
    {"weights-only", RUN_FIELD_(RUN_INT, weights_only), RUN_NOTED},
};
#undef RUN_FIELD_
#undef RUN_NAMED_
#define RUN_N_SETTINGS ((int)(sizeof(RUN_SETTINGS) / sizeof(RUN_SETTINGS[0])))

// A setting's value as run.json writes it (a JSON number, string or null), into out
static inline const char* run_setting_json(const RunSetting* s, const TrainArgs* a, char* out, size_t size) {
    const char* p = (const char*)a + s->offset;
    switch (s->type) {
        case RUN_INT: snprintf(out, size, "%d", *(const int*)p); break;
        case RUN_FLOAT: {  // the shortest digits that read back as the same float
            float v = *(const float*)p;
            for (int digits = 6; digits <= 9; digits++) {
                snprintf(out, size, "%.*g", digits, (double)v);
                if (strtof(out, NULL) == v) { break; }
            }
            break;
        }
        case RUN_U64: snprintf(out, size, "%llu", (unsigned long long)*(const uint64_t*)p); break;
        case RUN_NAME: snprintf(out, size, "\"%s\"", s->names[*(const int*)p]); break;
        default: {
            const char* text = *(const char* const*)p;
            if (text == NULL) { snprintf(out, size, "null"); break; }
            size_t n = 0;
            if (n + 1 < size) { out[n++] = '"'; }
            for (const unsigned char* c = (const unsigned char*)text; *c != '\0' && n + 8 < size; c++) {
                if (*c == '"' || *c == '\\') { out[n++] = '\\'; out[n++] = (char)*c; }
                else if (*c < 0x20) { n += (size_t)snprintf(out + n, size - n, "\\u%04x", *c); }
                else { out[n++] = (char)*c; }
            }
            snprintf(out + n, size - n, "\"");
        }
    }
    return out;
}

// The same value as a message shows it: names and text unquoted, no text as "(none)"
static inline const char* run_setting_said(const RunSetting* s, const TrainArgs* a, char* out, size_t size) {
    const char* p = (const char*)a + s->offset;
    if (s->type == RUN_NAME) { snprintf(out, size, "%s", s->names[*(const int*)p]); return out; }
    if (s->type == RUN_TEXT) {
        const char* text = *(const char* const*)p;
        snprintf(out, size, "%s", text != NULL ? text : "(none)");
        return out;
    }
    return run_setting_json(s, a, out, size);
}

// ----------------------------------------------------------------------------
// run.json: its entries, one line each, read back by a reader of that one shape (flat objects
// of numbers, strings and null: what run_record_write writes)

#define RUN_RECORD_MAX 256  // entries: starts of one run that changed its settings
typedef struct {
    int n;
    int from_step[RUN_RECORD_MAX];
    char* line[RUN_RECORD_MAX];  // the entry's JSON line as read, without its newline
} RunRecord;

// The value of `key` in the flat JSON object `line`, unescaped into out (a string's text, or a
// number's or null's characters); 1 if found (*is_text: a string), 0 if not, -1 if malformed.
static inline int run_json_value(const char* line, const char* key, char* out, size_t size, int* is_text) {
    const char* p = line;
    size_t klen = strlen(key);
    while ((p = strchr(p, '"')) != NULL) {
        const char* name = p + 1;
        const char* end = name;
        while (*end != '\0' && *end != '"') { end += (*end == '\\' && end[1] != '\0') ? 2 : 1; }
        if (*end != '"') { return -1; }
        const char* colon = end + 1;
        while (*colon == ' ') { colon++; }
        if (*colon != ':') { p = end + 1; continue; }  // a string value, not a key
        const char* v = colon + 1;
        while (*v == ' ') { v++; }
        int match = (size_t)(end - name) == klen && strncmp(name, key, klen) == 0;
        size_t n = 0;
        *is_text = *v == '"';
        if (*is_text) {
            for (v++; *v != '"'; v++) {
                if (*v == '\0') { return -1; }
                char c = *v;
                if (c == '\\') {
                    v++;
                    if (*v == 'u') {
                        unsigned code;
                        if (sscanf(v + 1, "%4x", &code) != 1 || code > 0xFF) { return -1; }
                        c = (char)code;
                        v += 4;
                    } else if (*v == 'n') { c = '\n'; }
                    else if (*v == 't') { c = '\t'; }
                    else if (*v == '\0') { return -1; }
                    else { c = *v; }
                }
                if (n + 1 < size) { out[n++] = c; }
            }
            p = v + 1;
        } else {
            const char* stop = v + strcspn(v, ",}");
            if (*stop == '\0') { return -1; }
            while (stop > v && stop[-1] == ' ') { stop--; }
            for (const char* c = v; c < stop && n + 1 < size; c++) { out[n++] = *c; }
            p = stop;
        }
        out[n] = '\0';
        if (match) { return 1; }
    }
    return 0;
}

static inline void run_record_free(RunRecord* r) {
    for (int i = 0; i < r->n; i++) { free(r->line[i]); }
    r->n = 0;
}

// Reads <dir>/run.json into r; 0 if it is there, 1 if not (r empty). A file that is not one
// run_record_write wrote is refused, naming it: it may be a user's, and is left as it is.
static inline int run_record_read(const char* dir, RunRecord* r) {
    r->n = 0;
    char path[VLA_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/run.json", dir);
    FILE* f = fopen(path, "r");
    if (f == NULL) { return 1; }
    char* line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == ',')) { line[--len] = '\0'; }
        const char* entry = line + strspn(line, " ");
        if (strncmp(entry, "{\"from_step\":", 13) != 0) { continue; }  // the frame around the entries
        char value[64];
        int is_text, step;
        if (run_json_value(entry, "from_step", value, sizeof(value), &is_text) != 1 || is_text ||
            sscanf(value, "%d", &step) != 1 || step < 0 || r->n == RUN_RECORD_MAX ||
            (r->n > 0 && step <= r->from_step[r->n - 1])) {
            fclose(f);
            free(line);
            run_record_free(r);
            vla_fail("%s, line %d, is not an entry of the run's settings as train_vla writes them: restore the file, "
                     "or move it away to continue with the flags given alone", path, lineno);
        }
        r->from_step[r->n] = step;
        r->line[r->n] = strdup(entry);
        r->n++;
    }
    fclose(f);
    free(line);
    return 0;
}

// Sets setting s of a from an entry's line: 1 if the entry has it, 0 if not; a malformed value is refused.
static inline int run_setting_load(const RunSetting* s, TrainArgs* a, const char* line, const char* path) {
    char value[VLA_PATH_MAX + 64];
    int is_text;
    int found = run_json_value(line, s->option, value, sizeof(value), &is_text);
    if (found == 0) { return 0; }
    char* p = (char*)a + s->offset;
    char* end = value;
    int ok = found == 1;
    if (ok && s->type == RUN_TEXT) {
        ok = is_text || strcmp(value, "null") == 0;
        *(const char**)p = is_text ? strdup(value) : NULL;  // (lives as long as the run's settings)
    } else if (ok && s->type == RUN_NAME) {
        int k = 0;
        while (k < s->n_names && strcmp(value, s->names[k]) != 0) { k++; }
        ok = is_text && k < s->n_names;
        if (ok) { *(int*)p = k; }
    } else if (ok) {
        errno = 0;
        if (s->type == RUN_INT) { *(int*)p = (int)strtol(value, &end, 10); }
        else if (s->type == RUN_FLOAT) { *(float*)p = strtof(value, &end); }
        else { *(uint64_t*)p = strtoull(value, &end, 10); }
        ok = !is_text && errno == 0 && end != value && *end == '\0';
    }
    if (!ok) {
        vla_fail("%s: the value of \"%s\" is not one train_vla writes: restore the file, or move it away to "
                 "continue with the flags given alone", path, s->option);
    }
    return 1;
}

// The entry a run continuing at step `start` goes by: the last one from that step or before it
static inline int run_record_entry(const RunRecord* r, int start) {
    int e = -1;
    for (int i = 0; i < r->n && r->from_step[i] <= start; i++) { e = i; }
    return e;
}

// -y 1, before anything reads the settings: those of a->output's run.json at the step of the
// newest checkpoint there, then the flags given on top (each change said on stdout, naming the
// old and the new value). A folder with checkpoints and no run.json (an older train_vla's run)
// continues with the flags given, said in one note.
static inline void run_record_resume(TrainArgs* a) {
    if (!a->resume) { return; }
    RunRecord r;
    if (run_record_read(a->output, &r) != 0) {
        uint64_t steps[1];
        if (checkpoint_list(a->output, steps, 1) == 1) {
            printf("note: %s has no run.json (a run of an older train_vla): it continues with the flags given\n",
                   a->output);
        }
        return;
    }
    uint64_t newest[1];
    int start = checkpoint_list(a->output, newest, 1) == 1 ? (int)newest[0] : 0;
    int e = run_record_entry(&r, start);
    if (e < 0) { run_record_free(&r); return; }
    char path[VLA_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/run.json", a->output);
    TrainArgs was = *a, given = *a;
    for (int i = 0; i < RUN_N_SETTINGS; i++) { run_setting_load(&RUN_SETTINGS[i], &was, r.line[e], path); }
    run_record_free(&r);
    for (int i = 0; i < RUN_N_SETTINGS; i++) {
        const RunSetting* s = &RUN_SETTINGS[i];
        if (s->on_resume == RUN_NOTED) { continue; }
        char old_value[VLA_PATH_MAX + 64], new_value[VLA_PATH_MAX + 64];
        run_setting_json(s, &was, old_value, sizeof(old_value));
        run_setting_json(s, a, new_value, sizeof(new_value));
        if (strcmp(old_value, new_value) == 0) { continue; }
        if (!train_args_given(a, s->option)) {  // the record's value
            size_t bytes = s->type == RUN_TEXT ? sizeof(const char*) : s->type == RUN_U64 ? 8 : 4;
            memcpy((char*)a + s->offset, (const char*)&was + s->offset, bytes);
        } else if (s->on_resume == RUN_APPLY) {
            run_setting_said(s, &was, old_value, sizeof(old_value));
            run_setting_said(s, a, new_value, sizeof(new_value));
            printf("-y 1: --%s is %s from step %d on (it was %s, %s says)\n", s->option, new_value, start, old_value,
                   path);
        }
    }
    a->lr = a->lr_base;
    was.lr = was.lr_base;
    // another -n, -l, -u or --min-lr-frac moves the schedule under the step the run continues from
    float before = lr_at_step(&was, start), after = lr_at_step(a, start);
    if (start > 0 && start < a->steps && fabsf(after - before) > 0.01f * fmaxf(before, after)) {
        printf("warning: -y 1: the learning rate jumps from %.3e (the run's schedule at step %d) to %.3e at step %d: the "
               "schedule is now %d steps of warmup and a cosine over -n %d (it was %d and %d); the run goes on as asked\n",
               (double)before, start, (double)after, start + 1, a->warmup, a->steps, was.warmup, was.steps);
    }
    for (int i = 0; i < RUN_N_SETTINGS; i++) {  // the record's texts this run did not take
        const RunSetting* s = &RUN_SETTINGS[i];
        if (s->type != RUN_TEXT) { continue; }
        const char* kept = *(const char* const*)((const char*)a + s->offset);
        const char* read = *(const char* const*)((const char*)&was + s->offset);
        if (read != kept && read != *(const char* const*)((const char*)&given + s->offset)) { free((void*)read); }
    }
}

// Writes <output>/run.json for a run that starts at step `start` (node 0, after the run folder is
// taken): the entries before that step as they were, then this start's settings unless the entry
// it continues says the same. trainer: which trainer runs it.
static inline void run_record_write(const TrainArgs* a, int start, const char* trainer) {
    RunRecord r;
    run_record_read(a->output, &r);
    char* mine = (char*)mallocCheck(RUN_N_SETTINGS * (VLA_PATH_MAX + 96) + 256);
    char started[64];
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(started, sizeof(started), "%Y-%m-%d %H:%M:%S UTC", &utc);
    size_t n = (size_t)sprintf(mine, "{\"from_step\": %d, \"started\": \"%s\", \"trainer\": \"%s\"", start, started,
                               trainer);
    for (int i = 0; i < RUN_N_SETTINGS; i++) {
        char value[2 * VLA_PATH_MAX + 64];
        n += (size_t)sprintf(mine + n, ", \"%s\": %s", RUN_SETTINGS[i].option,
                             run_setting_json(&RUN_SETTINGS[i], a, value, sizeof(value)));
    }
    sprintf(mine + n, "}");
    // the same settings as the entry it continues (its "started" and "trainer" aside): nothing to add
    int e = run_record_entry(&r, start), same = 0;
    if (e >= 0 && e == r.n - 1) {  // (entries past the start are of steps taken again: rewritten)
        const char* was = strstr(r.line[e], "\", \"input\":");
        const char* now_rest = strstr(mine, "\", \"input\":");
        same = was != NULL && now_rest != NULL && strcmp(was, now_rest) == 0;
    }
    if (!same) {
        int keep = 0;
        while (keep < r.n && r.from_step[keep] < start) { keep++; }
        const char* head = "{\n  \"about\": \"train_vla's settings of the run in this folder: one entry per start "
                           "that set them, from its step on; -y 1 continues with the entry of its checkpoint's step "
                           "and the flags given\",\n  \"entries\": [\n";
        size_t bytes = strlen(head) + strlen(mine) + 16;
        for (int i = 0; i < keep; i++) { bytes += strlen(r.line[i]) + 8; }
        char* text = (char*)mallocCheck(bytes);
        size_t at = (size_t)sprintf(text, "%s", head);
        for (int i = 0; i < keep; i++) { at += (size_t)sprintf(text + at, "    %s,\n", r.line[i]); }
        at += (size_t)sprintf(text + at, "    %s\n  ]\n}\n", mine);
        char path[VLA_PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/run.json", a->output);
        run_folder_check(a->output, "run.json");
        AtomicFile out;
        atomic_file_open(&out, path, at);
        atomic_file_write(&out, text, 1, at);
        atomic_file_commit(&out);
        free(text);
    }
    free(mine);
    run_record_free(&r);
}

#endif  // VLA_RUN_RECORD_H
