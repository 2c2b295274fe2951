/*
test_util.h: what test_vla.c (the CPU reference) and test_vla_gpu.cu (the GPU trainer) share:
check bookkeeping, relative errors, the oracle's debug-state reader, and running a trainer
binary (bit-exact resume, bad input). Include after the trainer under test.
*/
#ifndef VLA_TEST_UTIL_H
#define VLA_TEST_UTIL_H

#include "../../vla/common.h"
#include "../../vla/safetensors.h"
#include "../../vla/shards.h"
#include "../../vla/shard_writer.h"
#include "../../vla/atomic_file.h"
#include "../../vla/checkpoint.h"
#include <sys/wait.h>

// ----------------------------------------------------------------------------
// check bookkeeping

static int n_passed = 0, n_failed = 0;

static void check(int ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "  ok  " : " FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok) { n_passed++; } else { n_failed++; }
}

// ||x - ref|| / ||ref|| in double; NaN anywhere in x gives +inf so it can never pass
static double rel_error(const float* x, const float* ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) { return INFINITY; }
        double dlt = (double)x[i] - (double)ref[i];
        num += dlt * dlt;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0.0) { return num == 0.0 ? 0.0 : INFINITY; }
    return sqrt(num / den);
}

// The relative error of the weight updates (weights minus the seed's init) of run x against
// ref's, over the tensors that train in `mode` and whose decay column is `decay` (NaN in x: +inf)
static double update_error(const float* x, const float* ref, const float* init, const FlowParamTable* t, int mode,
                           int decay) {
    double num = 0.0, den = 0.0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &t->spec[i];
        if (s->decay != decay || flow_trainable_numel(s, mode) == 0) { continue; }
        for (size_t j = s->offset; j < s->offset + s->numel; j++) {
            if (!isfinite(x[j])) { return INFINITY; }
            double d = ((double)x[j] - init[j]) - ((double)ref[j] - init[j]), r = (double)ref[j] - init[j];
            num += d * d;
            den += r * r;
        }
    }
    return den > 0.0 ? sqrt(num / den) : INFINITY;
}

// ----------------------------------------------------------------------------
// the oracle's debug state: a "VLAT" container of named tensors (format in dev/model.py)

#define VLAT_MAGIC 0x54414C56u
enum { DT_F32 = 0, DT_U8 = 1, DT_I32 = 2 };

typedef struct {
    char name[64];
    uint32_t dtype, ndim;
    uint64_t shape[4];
    uint64_t numel;
    void* data;
} Record;

typedef struct {
    int n;
    Record* recs;
    uint8_t* file;
} DebugState;

static void debug_state_read(DebugState* ds, const char* path) {
    FILE* f = fopenCheck(path, "rb");
    fseeko(f, 0, SEEK_END);
    uint64_t len = (uint64_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    ds->file = (uint8_t*)mallocCheck(len);
    if (fread(ds->file, 1, len, f) != len) { vla_fail("%s: short read", path); }
    fclose(f);
    uint32_t head[4];
    if (len < 16) { vla_fail("%s: too short for a debug state: rerun make test", path); }
    memcpy(head, ds->file, 16);
    if (head[0] != VLAT_MAGIC || head[1] != 1) { vla_fail("%s: not a version-1 debug state: rerun make test", path); }
    ds->n = (int)head[2];
    ds->recs = (Record*)callocCheck(ds->n, sizeof(Record));
    uint64_t pos = 16;
    for (int i = 0; i < ds->n; i++) {
        Record* r = &ds->recs[i];
        if (pos + 64 + 8 + 32 > len) { vla_fail("%s: truncated at record %d", path, i); }
        memcpy(r->name, ds->file + pos, 64);
        r->name[63] = 0;
        memcpy(&r->dtype, ds->file + pos + 64, 4);
        memcpy(&r->ndim, ds->file + pos + 68, 4);
        memcpy(r->shape, ds->file + pos + 72, 32);
        pos += 104;
        r->numel = 1;
        for (int k = 0; k < 4; k++) { r->numel = mul_check(r->numel, r->shape[k], path, r->name); }
        uint64_t bytes = r->numel * (r->dtype == DT_U8 ? 1 : 4);
        if (r->dtype > DT_I32 || pos + bytes > len) { vla_fail("%s: record %s is corrupt or truncated", path, r->name); }
        r->data = ds->file + pos;  // fine to alias: the records are 4-byte aligned reads via memcpy below
        pos += bytes;
    }
    if (pos != len) { vla_fail("%s: %llu trailing bytes", path, (unsigned long long)(len - pos)); }
}

static const Record* debug_find(const DebugState* ds, const char* name) {
    for (int i = 0; i < ds->n; i++) {
        if (strcmp(ds->recs[i].name, name) == 0) { return &ds->recs[i]; }
    }
    vla_fail("debug state has no record %s: regenerate it with this version of dev/model.py", name);
}

// Copies a record into fresh aligned memory, checking its element count.
static void* debug_get(const DebugState* ds, const char* name, uint64_t numel) {
    const Record* r = debug_find(ds, name);
    if (r->numel != numel) {
        vla_fail("debug state record %s has %llu elements, expected %llu", name, (unsigned long long)r->numel,
                 (unsigned long long)numel);
    }
    size_t bytes = numel * (r->dtype == DT_U8 ? 1 : 4);
    void* out = mallocCheck(bytes);
    memcpy(out, r->data, bytes);
    return out;
}

// ----------------------------------------------------------------------------
// trainer binaries

// Runs a shell command; returns its exit status, or -1 if a signal ended it.
static int run_command(const char* cmd) {
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status)) { return -1; }
    return WEXITSTATUS(status);
}

static char* read_text(const char* path) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { return strdup(""); }
    fseeko(f, 0, SEEK_END);
    long len = (long)ftello(f);
    fseeko(f, 0, SEEK_SET);
    char* s = (char*)mallocCheck(len + 1);
    s[fread(s, 1, len, f)] = 0;
    fclose(f);
    return s;
}

// The loss column of a log.jsonl, for steps first..last (1-based).
static int read_losses(const char* log, int first, int last, float* out) {
    char* text = read_text(log);
    int n = 0;
    for (char* line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        int step;
        float loss;
        if (sscanf(line, "{\"step\": %d, \"loss\": %f", &step, &loss) == 2 && step >= first && step <= last) {
            out[step - first] = loss;
            n++;
        }
    }
    free(text);
    return n;
}

static int files_equal(const char* a, const char* b) {
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), "cmp -s %s %s", a, b);
    return run_command(cmd) == 0;
}

// Bit-exact resume through a trainer binary (`trainer` is its command with the common flags):
// 6 steps straight vs 3 steps, then -y 1 up to 6. The first leg is all warmup (-u 3 in the
// flags), so its learning rates do not depend on -n.
static void check_resume_bit_exact(const char* dir, const char* trainer, const char* tag) {
    char cmd[4096], p1[1024], p2[1024];
    const char* common = trainer;
    snprintf(cmd, sizeof(cmd), "rm -rf %s/run_full %s/run_resumed && %s -n 6 -i %s/a.bin -o %s/run_full -k 3 > %s/run_full.txt 2>&1",
             dir, dir, common, dir, dir, dir);
    int rc1 = run_command(cmd);
    snprintf(cmd, sizeof(cmd), "%s -n 3 -i %s/a.bin -o %s/run_resumed > %s/run_r1.txt 2>&1", common, dir, dir, dir);
    int rc2 = run_command(cmd);
    snprintf(cmd, sizeof(cmd), "%s -n 6 -i %s/a.bin -o %s/run_resumed -y 1 > %s/run_r2.txt 2>&1", common, dir, dir, dir);
    int rc3 = run_command(cmd);
    float full[6] = {0}, resumed[3] = {0};
    snprintf(p1, sizeof(p1), "%s/run_full/log.jsonl", dir);
    snprintf(p2, sizeof(p2), "%s/run_resumed/log.jsonl", dir);
    int nf = read_losses(p1, 1, 6, full), nr = read_losses(p2, 4, 6, resumed);
    check(rc1 == 0 && rc2 == 0 && rc3 == 0 && nf == 6 && nr == 3, "%s runs: straight, first leg, resumed leg", tag);
    check(nf == 6 && nr == 3 && memcmp(full + 3, resumed, sizeof(resumed)) == 0,
          "%s: resumed losses equal the uninterrupted run bit for bit (steps 4-6: %.7f %.7f %.7f)", tag, resumed[0], resumed[1], resumed[2]);
    snprintf(p1, sizeof(p1), "%s/run_full/ckpt_00000006.bin", dir);
    snprintf(p2, sizeof(p2), "%s/run_resumed/ckpt_00000006.bin", dir);
    check(files_equal(p1, p2), "%s: final checkpoints of the straight and resumed runs are identical files", tag);
}

// Runs `binary` with bad input: it must exit 1 (not crash) with a one-line message naming
// the problem.
static void expect_error_from(const char* dir, const char* binary, const char* what, const char* args, const char* needle) {
    char cmd[4096], errpath[1100];
    snprintf(errpath, sizeof(errpath), "%s/stderr.txt", dir);
    snprintf(cmd, sizeof(cmd), "%s %s > /dev/null 2> %s", binary, args, errpath);
    int rc = run_command(cmd);
    char* err = read_text(errpath);
    int lines = 0;
    for (char* p = err; *p; p++) { lines += *p == '\n'; }
    int ok = rc == 1 && lines == 1 && strstr(err, needle) != NULL && strncmp(err, "error: ", 7) == 0;
    char* nl = strchr(err, '\n');
    if (nl) { *nl = 0; }
    check(ok, "%s: exit %d, %d line(s): %s", what, rc, lines, err);
    free(err);
}

// Copies the fixture and patches bytes at an offset (or truncates when data is NULL).
static void corrupt_copy(const char* src, const char* dst, long offset, const void* data, size_t n, long truncate_to) {
    char cmd[2300];
    snprintf(cmd, sizeof(cmd), "cp %s %s", src, dst);
    run_command(cmd);
    if (data != NULL) {
        FILE* f = fopenCheck(dst, "r+b");
        fseek(f, offset, SEEK_SET);
        fwrite(data, 1, n, f);
        fclose(f);
    }
    if (truncate_to >= 0 && truncate(dst, truncate_to) != 0) { vla_fail("truncate %s failed", dst); }
}

// Writes the CRC-32 that a checkpoint's bytes now have into its header, as a trainer writing those
// bytes would (a file made to reach a check past the checksum).
static void checkpoint_reseal(const char* path) {
    FILE* f = fopenCheck(path, "r+b");
    fseeko(f, 0, SEEK_END);
    size_t size = (size_t)ftello(f);
    uint8_t* raw = (uint8_t*)mallocCheck(size);
    fseeko(f, 0, SEEK_SET);
    if (fread(raw, 1, size, f) != size) { vla_fail("reading %s failed", path); }
    uint32_t crc = 0;
    memcpy(raw + offsetof(CheckpointHeader, crc), &crc, 4);
    crc = crc32_update(0, raw, size);
    fseeko(f, (off_t)offsetof(CheckpointHeader, crc), SEEK_SET);
    fwrite(&crc, 4, 1, f);
    fclose(f);
    free(raw);
}

// corrupt_copy, then the copy's checksum made to match: a checkpoint a trainer could have written
static void corrupt_copy_sealed(const char* src, const char* dst, long offset, const void* data, size_t n) {
    corrupt_copy(src, dst, offset, data, n, -1);
    checkpoint_reseal(dst);
}

// The losses of the oracle's --train run (lines "step N loss X ..."), steps 1..n.
static int read_oracle_losses(const char* path, float* out, int n) {
    FILE* f = fopenCheck(path, "r");
    char line[256];
    int m = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        int step;
        float loss;
        if (sscanf(line, "step %d loss %f", &step, &loss) == 2 && step >= 1 && step <= n) { out[step - 1] = loss; m++; }
    }
    fclose(f);
    return m;
}

// The whole training loop through a trainer binary: 5 steps on fixture a, each with its own
// samples, noise and learning rate, against the oracle's --train run (a_train.txt, one rank of 4).
// `trainer` is the command with the flags that make its 4 samples a step (-b 4, or -g 2 -b 2).
static void check_training_loop_of(const char* dir, const char* trainer, const char* preset, const char* oracle_file,
                                   double tol) {
    char cmd[4096], path[1100];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/run_loop && %s -p %s -n 5 -u 2 -l 1e-3 -w 0.1 -c 0.5 -s 1337 -i %s/a.bin "
             "-o %s/run_loop > %s/run_loop.txt 2>&1", dir, trainer, preset, dir, dir, dir);
    int rc = run_command(cmd);
    float ours[5] = {0}, ref[5] = {0};
    snprintf(path, sizeof(path), "%s/run_loop/log.jsonl", dir);
    int n = read_losses(path, 1, 5, ours);
    snprintf(path, sizeof(path), "%s/%s", dir, oracle_file);
    int m = read_oracle_losses(path, ref, 5);
    double e = rel_error(ours, ref, 5);
    check(rc == 0 && n == 5 && m == 5 && e < tol, "%s -p %s vs the oracle's -b 4, 5 steps on shard data: losses %.6f .. "
          "%.6f, rel err %.2e (tol %.1e)", trainer, preset, ours[0], ours[4], e, tol);
}

// The tiny preset (SmolVLA) against a_train.txt; pi0_tiny against a_pi0_train.txt (the Makefile's)
static void check_training_loop(const char* dir, const char* trainer, double tol) {
    check_training_loop_of(dir, trainer, "tiny", "a_train.txt", tol);
    check_training_loop_of(dir, trainer, "pi0_tiny", "a_pi0_train.txt", tol);
}

// ----------------------------------------------------------------------------
// LeRobot's reference files (dev/lerobot): case.json's few fields and ref.safetensors' tensors

// The number after "key": in a JSON text (a LeRobot reference's case.json), or -1 when absent
static long long json_int(const char* text, const char* key) {
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "\"%s\":", key);
    const char* p = strstr(text, pattern);
    return p != NULL ? strtoll(p + strlen(pattern), NULL, 10) : -1;
}

// The strings of the JSON array after "key": (at most max, each cut to 63 bytes); returns the count
static int json_strings(const char* text, const char* key, char out[][64], int max) {
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "\"%s\":", key);
    const char* p = strstr(text, pattern);
    const char* end = p != NULL ? strchr(p, ']') : NULL;
    int n = 0;
    for (p = p != NULL ? strchr(p, '[') : NULL; p != NULL && end != NULL && n < max; n++) {
        const char* open = strchr(p, '"');
        const char* close = open != NULL ? strchr(open + 1, '"') : NULL;
        if (open == NULL || close == NULL || open > end) { break; }
        snprintf(out[n], 64, "%.*s", (int)(close - open - 1), open + 1);
        p = close + 1;
    }
    return n;
}

// A reference tensor by name, whatever its dtype (floats widened or rounded to float32, integers
// and bools converted), checking its element count; NULL when the file lacks it or the count differs.
static float* ref_tensor(const SafeTensors* st, const char* name, size_t numel) {
    const SafeTensorInfo* t = safetensors_find(st, name);
    if (t == NULL || t->numel != numel) { return NULL; }
    float* out = (float*)mallocCheck((numel > 0 ? numel : 1) * sizeof(float));
    if (safetensors_read_f32(st, t, out) == 0) { return out; }
    const uint8_t* p = st->data + t->begin;
    for (size_t i = 0; i < numel; i++) {
        if (t->dtype == ST_I64) { int64_t v; memcpy(&v, p + 8 * i, 8); out[i] = (float)v; }
        else if (t->dtype == ST_I32) { int32_t v; memcpy(&v, p + 4 * i, 4); out[i] = (float)v; }
        else { out[i] = (float)p[i]; }  // U8, BOOL
    }
    return out;
}

// An integer tensor (token ids: I64 in LeRobot's files) as int32, checking that every value fits
static int32_t* ref_ints(const SafeTensors* st, const char* name, size_t numel) {
    const SafeTensorInfo* t = safetensors_find(st, name);
    if (t == NULL || t->numel != numel || (t->dtype != ST_I64 && t->dtype != ST_I32)) { return NULL; }
    int32_t* out = (int32_t*)mallocCheck((numel > 0 ? numel : 1) * sizeof(int32_t));
    for (size_t i = 0; i < numel; i++) {
        int64_t v = 0;
        if (t->dtype == ST_I64) { memcpy(&v, st->data + t->begin + 8 * i, 8); }
        else { int32_t v32; memcpy(&v32, st->data + t->begin + 4 * i, 4); v = v32; }
        if (v < INT32_MIN || v > INT32_MAX) { free(out); return NULL; }
        out[i] = (int32_t)v;
    }
    return out;
}

// ||x|| in double
static double norm2(const float* x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) { s += (double)x[i] * x[i]; }
    return sqrt(s);
}

#endif  // VLA_TEST_UTIL_H

// ---- task-balanced sampling (--balance tasks) on a 1:10 imbalanced dataset: two shards, task 0
// ("pick up the cube") in 10 episodes over both, task 1 ("open the drawer") in one; 8 frames each.
// The dataset: bal_a.bin (6 episodes of task 0, 1 of task 1) and bal_b.bin (4 of task 0, its own
// task table naming only task 0's text). Returns the -i list.
static const char* write_imbalanced(const char* dir, char* spec, size_t size) {
    enum { LEN = 8, IMG = 8 };
    static const char* const tasks_a[] = {"pick up the cube", "open the drawer"};
    static const char* const tasks_b[] = {"pick up the cube"};
    for (int part = 0; part < 2; part++) {
        int n_ep = part == 0 ? 7 : 4, frames = n_ep * LEN;
        uint8_t* images = (uint8_t*)mallocCheck((size_t)frames * IMG * IMG * 3);
        float* state = (float*)mallocCheck((size_t)frames * 4 * sizeof(float));
        float* action = (float*)mallocCheck((size_t)frames * 4 * sizeof(float));
        float stats[16];
        for (int i = 0; i < frames * IMG * IMG * 3; i++) { images[i] = (uint8_t)(i * 7 + part * 31); }
        for (int i = 0; i < frames * 4; i++) { state[i] = 0.03f * (float)(i % 11); action[i] = 0.05f * (float)(i % 5) - 0.1f * part; }
        ShardEpisode eps[7];
        for (int e = 0; e < n_ep; e++) {
            eps[e].first_frame = (uint64_t)e * LEN; eps[e].length = LEN;
            eps[e].task = part == 0 && e == 3 ? 1u : 0u;
        }
        shard_compute_stats((uint64_t)frames, state, 4, action, 4, stats);
        char path[1100];
        snprintf(path, sizeof(path), "%s/bal_%c.bin", dir, 'a' + part);
        Cameras cams = cameras_square(1, IMG);
        shard_write(path, &cams, 4, 4, (uint64_t)frames, images, state, action, (uint64_t)n_ep, eps, part == 0 ? 2 : 1,
                    part == 0 ? tasks_a : tasks_b, stats);
        free(images); free(state); free(action);
    }
    snprintf(spec, size, "%s/bal_a.bin,%s/bal_b.bin", dir, dir);
    return spec;
}

// A --balance tasks run's log.jsonl of 2 tasks: each of its `steps` lines holds a task_loss per
// task, and the step's loss (their mean weighted by valid entries) lies between them
static void check_task_loss_log(const char* path, int steps, const char* tag) {
    char* text = read_text(path);
    int lines = 0, between = 0;
    for (char* line = text != NULL ? strtok(text, "\n") : NULL; line != NULL; line = strtok(NULL, "\n")) {
        float loss, l0, l1;
        char* at = strstr(line, "\"task_loss\": [");
        lines++;
        if (sscanf(line, "{\"step\": %*d, \"loss\": %f", &loss) == 1 && at != NULL &&
            sscanf(at, "\"task_loss\": [%f, %f]", &l0, &l1) == 2) {
            between += isfinite(l0) && isfinite(l1) && loss >= fminf(l0, l1) * (1 - 1e-6f) && loss <= fmaxf(l0, l1) * (1 + 1e-6f);
        }
    }
    free(text);
    check(lines == steps && between == steps, "%s log.jsonl: %d of %d steps hold a task_loss per task with the step's "
          "loss between them (a mean weighted by valid entries)", tag, between, steps);
}
