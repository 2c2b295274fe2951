/*
vla/logging.h: what a run says: rank 0's step lines on stdout, every step as a JSON line in
<output>/log.jsonl and as TensorBoard scalars (train/...) in <output>/events.out.tfevents.train_vla
(tensorboard.h), and the evaluations' results (eval/...) in both. On resume, what the two files hold
of later steps is dropped and the files rewritten atomically. Needs atomic_file.h, run_folder.h,
tensorboard.h and loss_scale.h.
*/
#ifndef VLA_LOGGING_H
#define VLA_LOGGING_H

#include "common.h"
#include "loss_scale.h"
#include "run_folder.h"
#include "atomic_file.h"
#include "tensorboard.h"

// ----------------------------------------------------------------------------
// logging: rank 0 prints; every step also goes to <output>/log.jsonl and TensorBoard's file

typedef struct {
    FILE* jsonl;
    char path[VLA_PATH_MAX];
    double t_start;
    int n_tasks;              // > 0: each line also holds "task_loss", the step's mean loss per task
    const double* task_loss;  // (n_tasks) set by the trainer before logger_step; NaN: no sample of it this step
    double saved_bytes;       // > 0: each line also holds the activation memory --recompute saves (the GPU trainer's)
    const LossScaleState*
        loss_scale;  // fp16 builds, set by the trainer: the scale the step ran with and the skips so far
    double epoch;     // set by the trainer before logger_step: the epochs of samples drawn after the step
    double wait_ms;   // set by the trainer before logger_step: the time the step waited for the data loader
    int steps_seen;   // steps this process logged
    double timed_ms;  // their time after the first (which warms up), what the ETA goes by
    TbWriter tb;      // the same scalars for TensorBoard
} Logger;

// bytes as "12.34 GiB" from 1 GiB up, else "12.3 MiB"
static inline const char* format_bytes(char* out, size_t size, double bytes) {
    if (bytes >= 1024.0 * 1024.0 * 1024.0) { snprintf(out, size, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }
    else { snprintf(out, size, "%.1f MiB", bytes / (1024.0 * 1024.0)); }
    return out;
}

// Opens <dir>/log.jsonl and TensorBoard's file (tb_open) for a run that continues after step
// `start` (0: from scratch). Lines of later steps are dropped, so that every step is there once:
// a run killed after logging a step and before checkpointing it logs that step again when it resumes. So are a partial last line and
// lines that are not a step's ({"step": ...). Each kind dropped is said. Nothing else truncates
// the log: run_folder_open refuses a new run into a folder that holds one.
static inline void logger_open(Logger* lg, const char* dir, int start) {
    run_folder_check(dir, "log.jsonl");
    lg->n_tasks = 0;
    lg->task_loss = NULL;
    lg->saved_bytes = 0.0;
    lg->loss_scale = NULL;
    lg->epoch = NAN;
    lg->wait_ms = NAN;
    lg->steps_seen = 0;
    lg->timed_ms = 0.0;
    snprintf(lg->path, sizeof(lg->path), "%s/log.jsonl", dir);
    FILE* old = fopen(lg->path, "r");
    if (old != NULL) {
        char* line = NULL;
        size_t cap = 0, kept_bytes = 0, kept_cap = 0;
        char* kept = NULL;
        int dropped = 0, later = 0, partial = 0, foreign = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, old)) > 0) {
            int step;
            if (line[n - 1] != '\n') { partial++; dropped++; continue; }
            if (strncmp(line, "{\"step\":", 8) != 0 || sscanf(line, "{\"step\": %d", &step) != 1) {
                foreign++; dropped++; continue;
            }
            if (step > start) { later++; dropped++; continue; }
            if (kept_bytes + (size_t)n > kept_cap) {
                kept_cap = 2 * (kept_bytes + (size_t)n);
                kept = (char*)realloc(kept, kept_cap);
                if (kept == NULL) { vla_fail("out of memory reading %s", lg->path); }
            }
            memcpy(kept + kept_bytes, line, (size_t)n);
            kept_bytes += (size_t)n;
        }
        fclose(old);
        free(line);
        if (dropped > 0) {
            AtomicFile out;
            atomic_file_open(&out, lg->path, kept_bytes);
            atomic_file_write(&out, kept, 1, kept_bytes);
            atomic_file_commit(&out);
            if (later > 0) {
                printf("%s: dropped %d line(s) past step %d, where this run continues: it logs those steps again\n",
                       lg->path, later, start);
            }
            if (partial > 0) { printf("%s: dropped a partial last line, cut by a run that was killed\n", lg->path); }
            if (foreign > 0) {
                printf("%s: dropped %d line(s) that are not a step's (they do not start with {\"step\":)\n", lg->path,
                       foreign);
            }
        }
        free(kept);
    }
    lg->jsonl = fopenCheck(lg->path, "a");
    tb_open(&lg->tb, dir, start);
    lg->t_start = wall_seconds();
}

// After a line's last write (the run folder checked before it): both files flushed, or the run
// stops in one line saying why and how to go on
static inline void logger_flush(Logger* lg) {
    run_file_flush(lg->jsonl, lg->path);
    if (lg->tb.f != NULL) { run_file_flush(lg->tb.f, lg->tb.path); }
}

// Seconds left after 0-based step `step` of `steps` (its time ms, counted in lg): the steps left at
// the mean time of this process's steps after its first (the first one's alone until then), not
// the last step's, so that one slow or fast step does not swing it
static inline double logger_eta(const Logger* lg, double ms, int step, int steps) {
    double mean_ms = lg->steps_seen > 1 ? lg->timed_ms / (lg->steps_seen - 1) : ms;
    return mean_ms * (steps - step - 1) / 1000.0;
}

// One step's line (ETA: logger_eta). mfu and mem_gib are NAN where they mean nothing (the CPU trainer).
static inline void logger_step(Logger* lg, int step, int steps, float loss, float lr, float norm, double ms,
                               double samples_per_s, double mfu, double mem_gib, int print) {
    if (lg->steps_seen++ > 0) { lg->timed_ms += ms; }
    if (print) {
        double eta = logger_eta(lg, ms, step, steps);
        char extra[256] = "";
        if (!isnan(mfu)) { snprintf(extra, sizeof(extra), " | MFU %5.1f%% | %5.2f GiB", 100.0 * mfu, mem_gib); }
        else if (!isnan(mem_gib)) { snprintf(extra, sizeof(extra), " | %5.2f GiB", mem_gib); }  // a GPU of unknown peak
        if (lg->saved_bytes > 0.0) {
            char saved[32];
            size_t n = strlen(extra);
            snprintf(extra + n, sizeof(extra) - n, " | recompute saves %s",
                     format_bytes(saved, sizeof(saved), lg->saved_bytes));
        }
        if (lg->loss_scale != NULL) {
            size_t used = strlen(extra);
            snprintf(extra + used, sizeof(extra) - used, " | scale %g, %llu skipped", (double)lg->loss_scale->scale,
                     (unsigned long long)lg->loss_scale->skipped);
        }
        size_t used = strlen(extra);
        if (!isnan(lg->epoch)) { snprintf(extra + used, sizeof(extra) - used, " | epoch %.2f", lg->epoch); }
        used = strlen(extra);
        if (!isnan(lg->wait_ms)) { snprintf(extra + used, sizeof(extra) - used, " | data wait %.1f ms", lg->wait_ms); }
        printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %8.1f ms | %7.1f samples/s%s | ETA %dm%02ds\n",
               step + 1, steps, loss, lr, norm, ms, samples_per_s, extra, (int)(eta / 60), (int)eta % 60);
        fflush(stdout);
    }
    char what[64];
    snprintf(what, sizeof(what), "step %d's log line", step + 1);
    run_folder_check(NULL, what);
    fprintf(lg->jsonl, "{\"step\": %d, \"loss\": %.8g, \"lr\": %.6g", step + 1, loss, lr);
    // JSON has no Inf or NaN: an fp16 step skipped for its gradients' Inf/NaN logs no norm
    if (isfinite(norm)) { fprintf(lg->jsonl, ", \"grad_norm\": %.6g", norm); }
    fprintf(lg->jsonl, ", \"ms\": %.3f, \"samples_per_s\": %.3f", ms, samples_per_s);
    if (!isnan(mfu)) { fprintf(lg->jsonl, ", \"mfu\": %.5f", mfu); }
    if (!isnan(mem_gib)) { fprintf(lg->jsonl, ", \"gpu_mem_gib\": %.4f", mem_gib); }
    if (lg->saved_bytes > 0.0) { fprintf(lg->jsonl, ", \"recompute_saved_bytes\": %.0f", lg->saved_bytes); }
    if (lg->loss_scale != NULL) {
        fprintf(lg->jsonl, ", \"loss_scale\": %.9g, \"skipped_steps\": %llu", (double)lg->loss_scale->scale,
                (unsigned long long)lg->loss_scale->skipped);
    }
    if (lg->n_tasks > 0) {
        fprintf(lg->jsonl, ", \"task_loss\": [");
        for (int t = 0; t < lg->n_tasks; t++) {
            if (isnan(lg->task_loss[t])) { fprintf(lg->jsonl, "%snull", t > 0 ? ", " : ""); }
            else { fprintf(lg->jsonl, "%s%.8g", t > 0 ? ", " : "", lg->task_loss[t]); }
        }
        fprintf(lg->jsonl, "]");
    }
    if (!isnan(lg->epoch)) { fprintf(lg->jsonl, ", \"epoch\": %.6g", lg->epoch); }
    if (!isnan(lg->wait_ms)) { fprintf(lg->jsonl, ", \"loader_wait_ms\": %.3f", lg->wait_ms); }
    fprintf(lg->jsonl, "}\n");
    // TensorBoard: the same figures by step, under train/
    int s = step + 1;
    tb_scalar(&lg->tb, "train/loss", s, loss);
    tb_scalar(&lg->tb, "train/lr", s, lr);
    if (isfinite(norm)) { tb_scalar(&lg->tb, "train/grad_norm", s, norm); }
    tb_scalar(&lg->tb, "train/step_ms", s, (float)ms);
    tb_scalar(&lg->tb, "train/samples_per_s", s, (float)samples_per_s);
    if (!isnan(mfu)) { tb_scalar(&lg->tb, "train/mfu", s, (float)mfu); }
    if (!isnan(mem_gib)) { tb_scalar(&lg->tb, "train/gpu_mem_gib", s, (float)mem_gib); }
    if (lg->loss_scale != NULL) {
        tb_scalar(&lg->tb, "train/loss_scale", s, lg->loss_scale->scale);
        tb_scalar(&lg->tb, "train/skipped_steps", s, (float)lg->loss_scale->skipped);
    }
    for (int t = 0; t < lg->n_tasks; t++) {
        if (isnan(lg->task_loss[t])) { continue; }
        char tag[48];
        snprintf(tag, sizeof(tag), "train/task_loss/%d", t);
        tb_scalar(&lg->tb, tag, s, (float)lg->task_loss[t]);
    }
    if (!isnan(lg->epoch)) { tb_scalar(&lg->tb, "train/epoch", s, (float)lg->epoch); }
    if (!isnan(lg->wait_ms)) { tb_scalar(&lg->tb, "train/loader_wait_ms", s, (float)lg->wait_ms); }
    logger_flush(lg);
}

// An evaluation's results for the checkpoint of step `step`: one line {"step": N, "eval": {...}} in
// log.jsonl (readers of the step lines skip it by its "eval" key) and eval/<name> in TensorBoard.
// Names are JSON-safe (evaluation.h checks them).
static inline void logger_eval(Logger* lg, int step, int n, char (*names)[64], const double* values) {
    char what[64];
    snprintf(what, sizeof(what), "step %d's evaluation", step);
    run_folder_check(NULL, what);
    fprintf(lg->jsonl, "{\"step\": %d, \"eval\": {", step);
    for (int k = 0; k < n; k++) {
        fprintf(lg->jsonl, "%s\"%s\": %.8g", k > 0 ? ", " : "", names[k], values[k]);
        char tag[80];
        snprintf(tag, sizeof(tag), "eval/%s", names[k]);
        tb_scalar(&lg->tb, tag, step, (float)values[k]);
    }
    fprintf(lg->jsonl, "}}\n");
    logger_flush(lg);
}

static inline void logger_close(Logger* lg) {
    if (lg->jsonl != NULL) { fclose(lg->jsonl); }
    tb_close(&lg->tb);
}

#endif  // VLA_LOGGING_H
