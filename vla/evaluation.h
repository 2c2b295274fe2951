/*
vla/evaluation.h: --eval-every, evaluation while the run trains: a checkpoint's evaluation runs
as a background process at the lowest CPU priority while the training loop goes on; its results
(a flat JSON object of numbers the command writes) go to log.jsonl and TensorBoard at the
checkpoint's step. A failed evaluation is one warning, never a failed run. Needs cli.h,
checkpoint.h and logging.h.
*/
#ifndef VLA_EVALUATION_H
#define VLA_EVALUATION_H

#include "common.h"
#include "cli.h"
#include "logging.h"
#include <spawn.h>
#include <sys/wait.h>
#include <signal.h>

extern char** environ;

// ----------------------------------------------------------------------------
// the command: --eval-cmd with {checkpoint}, {step} and {results} put in, or the Meta-World
// evaluation of scripts/eval_metaworld.py (found beside the trainer's binary)

// The folder above the trainer's binary that holds scripts/eval_metaworld.py (the repository's
// root: the binary is there, or in build/ below it), into root; 0 if found.
static inline int eval_repo_root(char* root, size_t size) {
    char exe[VLA_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) { return -1; }
    exe[n] = '\0';
    for (int up = 0; up < 4; up++) {
        char* slash = strrchr(exe, '/');
        if (slash == NULL) { return -1; }
        *slash = '\0';
        char probe[VLA_PATH_MAX + 64];
        snprintf(probe, sizeof(probe), "%s/scripts/eval_metaworld.py", exe);
        if (access(probe, R_OK) == 0) {
            snprintf(root, size, "%s", exe);
            return 0;
        }
    }
    return -1;
}

// The command --eval-every runs when --eval-cmd is not given, into out ({checkpoint} and {results}
// are put in later): 5 episodes of each MT10 task, through the project's Python
static inline const char* eval_default_command(char* out, size_t size) {
    char root[VLA_PATH_MAX];
    if (eval_repo_root(root, sizeof(root)) != 0) { snprintf(root, sizeof(root), "."); }
    snprintf(out, size, "%s/build/venv/bin/python %s/scripts/eval_metaworld.py --policy {checkpoint} --tasks MT10 "
             "--episodes 5 --scalars {results}", root, root);
    return out;
}

// text quoted for the shell: '...' with each ' as '\''
static inline size_t shell_quote(char* out, size_t size, const char* text) {
    size_t n = 0;
    if (n + 1 < size) { out[n++] = '\''; }
    for (const char* c = text; *c != '\0' && n + 5 < size; c++) {
        if (*c == '\'') { memcpy(out + n, "'\\''", 4); n += 4; }
        else { out[n++] = *c; }
    }
    if (n + 1 < size) { out[n++] = '\''; }
    out[n < size ? n : size - 1] = '\0';
    return n;
}

// cmd with {checkpoint}, {step} and {results} replaced (the paths quoted for the shell), into out
static inline void eval_expand(char* out, size_t size, const char* cmd, const char* checkpoint, int step,
                               const char* results) {
    size_t n = 0;
    for (const char* c = cmd; *c != '\0' && n + 1 < size;) {
        char step_text[16];
        const char* with = NULL;
        size_t skip = 0;
        if (strncmp(c, "{checkpoint}", 12) == 0) { with = checkpoint; skip = 12; }
        else if (strncmp(c, "{results}", 9) == 0) { with = results; skip = 9; }
        else if (strncmp(c, "{step}", 6) == 0) { snprintf(step_text, sizeof(step_text), "%d", step); skip = 6; }
        if (skip == 0) { out[n++] = *c++; continue; }
        if (with != NULL) { n += shell_quote(out + n, size - n, with); }
        else { n += (size_t)snprintf(out + n, size - n, "%s", step_text); }
        if (n >= size) { n = size - 1; }
        c += skip;
    }
    out[n] = '\0';
}

// ----------------------------------------------------------------------------
// one evaluation at a time, polled by the training loop

typedef struct {
    const char* cmd;          // the command, placeholders in
    const char* output;       // the run's folder (-o), where the checkpoints are
    char dir[VLA_PATH_MAX];   // <output>/eval: each evaluation's checkpoint link, results and log
    pid_t pid;                // the one running, 0: none
    int step;                 // its checkpoint's step
    int waiting;              // the step of the checkpoint waiting for it to end (linked already), 0: none
    char link[VLA_PATH_MAX + 32], results[VLA_PATH_MAX + 32], log[VLA_PATH_MAX + 32];
    double t_start;
} Evaluator;

// A checkpoint's evaluation files, eval/step_N.{bin,json,log}: into the evaluator's, or the link alone
static inline void eval_link_path(const Evaluator* ev, int step, char* out, size_t size) {
    snprintf(out, size, "%s/step_%08d.bin", ev->dir, step);
}
static inline void eval_paths(Evaluator* ev, int step) {
    eval_link_path(ev, step, ev->link, sizeof(ev->link));
    snprintf(ev->results, sizeof(ev->results), "%s/step_%08d.json", ev->dir, step);
    snprintf(ev->log, sizeof(ev->log), "%s/step_%08d.log", ev->dir, step);
}

// Before the run starts: --eval-every without --eval-cmd needs what the Meta-World evaluation runs
// with (the project's Python environment and libvla.so beside the trainer), or it is refused in one
// line saying what to build; a run that could not evaluate would only warn at every checkpoint.
static inline void eval_check(const TrainArgs* a) {
    if (a->eval_every == 0 || a->eval_cmd != NULL) { return; }
    char root[VLA_PATH_MAX], need[VLA_PATH_MAX + 64];
    if (eval_repo_root(root, sizeof(root)) != 0) {
        vla_fail("--eval-every: scripts/eval_metaworld.py is not found beside this trainer (the repository's): run the "
                 "trainer the repository built, or pass --eval-cmd");
    }
    snprintf(need, sizeof(need), "%s/build/venv/bin/python", root);
    if (access(need, X_OK) != 0) {
        vla_fail("--eval-every: the Meta-World evaluation runs under %s, which is missing: run 'make setup' (as root), "
                 "or pass --eval-cmd", need);
    }
    snprintf(need, sizeof(need), "%s/libvla.so", root);
    if (access(need, R_OK) != 0) {
        vla_fail("--eval-every: the Meta-World evaluation serves the checkpoints through %s, which is missing: run "
                 "'make libvla.so', or pass --eval-cmd", need);
    }
}

static inline void eval_init(Evaluator* ev, const TrainArgs* a, char* default_cmd, size_t size) {
    memset(ev, 0, sizeof(*ev));
    ev->cmd = a->eval_cmd != NULL ? a->eval_cmd : eval_default_command(default_cmd, size);
    ev->output = a->output;
    snprintf(ev->dir, sizeof(ev->dir), "%s/eval", a->output);
}

// Whether step `done` is one --eval-every evaluates: each N-th step, and the last (a checkpoint is
// due at both: train_ckpt_due; --no-checkpoint with --eval-every is refused)
static inline int eval_due(const TrainArgs* a, int done) {
    return a->eval_every > 0 && (done % a->eval_every == 0 || done == a->steps);
}

#define EVAL_MAX_VALUES 256  // numbers one evaluation's results may hold

// Reads a finished evaluation's results (a flat JSON object of numbers, names of at most 63
// characters without quotes or backslashes) into the log at its step; the number of values read
// (the first four said in `said`), -1 if the file is missing or not such an object.
static inline int eval_log_results(Evaluator* ev, Logger* lg, char* said, size_t said_size) {
    FILE* f = fopen(ev->results, "r");
    if (f == NULL) { return -1; }
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    static char names[EVAL_MAX_VALUES][64];
    static double values[EVAL_MAX_VALUES];
    const char* p = text + strspn(text, " \t\r\n");
    if (*p != '{') { return -1; }
    int count = 0;
    for (p++;;) {
        p += strspn(p, " \t\r\n");
        if (*p == '}') { break; }
        if (count > 0) {
            if (*p != ',') { return -1; }
            p += 1 + strspn(p + 1, " \t\r\n");
        }
        int len;
        if (count == EVAL_MAX_VALUES || sscanf(p, "\"%63[^\"\\]\"%n", names[count], &len) != 1) { return -1; }
        p += len;
        p += strspn(p, " \t\r\n");
        if (*p != ':') { return -1; }
        char* end;
        values[count] = strtod(p + 1, &end);
        if (end == p + 1 || !isfinite(values[count])) { return -1; }
        p = end;
        count++;
    }
    p += 1 + strspn(p + 1, " \t\r\n");
    if (*p != '\0') { return -1; }
    logger_eval(lg, ev->step, count, names, values);
    size_t at = 0;
    said[0] = '\0';
    for (int k = 0; k < count && k < 4 && at + 96 < said_size; k++) {
        at += (size_t)snprintf(said + at, said_size - at, "%s%s %.4g", k > 0 ? ", " : "", names[k], values[k]);
    }
    if (count > 4 && at + 32 < said_size) { snprintf(said + at, said_size - at, ", and %d more", count - 4); }
    if (count == 0) { snprintf(said, said_size, "no values"); }
    return count;
}

static inline void eval_spawn(Evaluator* ev, int step);

// The running evaluation once it ended (never waiting for it): its results logged and said in one
// line, or one warning (a failed evaluation fails nothing else); then the waiting one starts.
static inline void eval_poll(Evaluator* ev, Logger* lg) {
    if (ev->pid == 0) { return; }
    int status;
    pid_t got = waitpid(ev->pid, &status, WNOHANG);
    if (got == 0 || (got < 0 && errno == EINTR)) { return; }
    ev->pid = 0;
    unlink(ev->link);  // (the link alone: the checkpoint stays as long as --keep keeps it)
    double seconds = wall_seconds() - ev->t_start;
    char said[512];
    if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char how[64];
        if (got > 0 && WIFSIGNALED(status)) { snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(status)); }
        else { snprintf(how, sizeof(how), "exit %d", got > 0 ? WEXITSTATUS(status) : -1); }
        printf("warning: the evaluation of step %d failed (%s after %.0f s): its output is in %s (the run does not stop "
               "for it)\n", ev->step, how, seconds, ev->log);
    } else if (eval_log_results(ev, lg, said, sizeof(said)) < 0) {
        printf("warning: the evaluation of step %d wrote no results: %s is missing or not a JSON object of numbers "
               "(its output is in %s; the run does not stop for it)\n", ev->step, ev->results, ev->log);
    } else {
        printf("evaluation of step %d (%.0f s): %s\n", ev->step, seconds, said);
    }
    fflush(stdout);
    if (ev->waiting != 0) {
        int next = ev->waiting;
        ev->waiting = 0;
        eval_spawn(ev, next);
    }
}

// Starts the evaluation of step `step` (its checkpoint linked already): the command at the lowest
// priority (nice 19) in a process group of its own (a Ctrl-C meant for the trainer does not reach
// it), its output into the evaluation's log.
static inline void eval_spawn(Evaluator* ev, int step) {
    ev->step = step;
    eval_paths(ev, step);
    unlink(ev->results);
    char cmd[4 * VLA_PATH_MAX];
    eval_expand(cmd, sizeof(cmd), ev->cmd, ev->link, step, ev->results);
    posix_spawn_file_actions_t files;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&files, 1, ev->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&files, 1, 2);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    char* argv[] = {(char*)"nice", (char*)"-n", (char*)"19", (char*)"/bin/sh", (char*)"-c", cmd, NULL};
    int err = posix_spawnp(&ev->pid, "nice", &files, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    if (err != 0) {
        ev->pid = 0;
        unlink(ev->link);
        printf("warning: cannot start the evaluation of step %d (%s): the run goes on\n", step, strerror(err));
        return;
    }
    ev->t_start = wall_seconds();
    printf("evaluating step %d in the background (pid %d, output in %s)\n", step, (int)ev->pid, ev->log);
    fflush(stdout);
}

// The evaluation of step `step`'s checkpoint (just written, train_ckpt_due): first a hard link to
// it in eval/ (so that --keep pruning the checkpoint leaves the evaluation's copy), then the
// evaluation starts (eval_spawn), or, while another runs, waits for it to end. One waits at a
// time: a newer checkpoint takes the place of a waiting one, said in one warning, so the newest
// (the last step's at the end) is always evaluated.
static inline void eval_start(Evaluator* ev, Logger* lg, int step) {
    char checkpoint[VLA_PATH_MAX], link_path[VLA_PATH_MAX + 32];
    checkpoint_path(checkpoint, sizeof(checkpoint), ev->output, (uint64_t)step);
    eval_poll(ev, lg);
    if (mkdir(ev->dir, 0755) != 0 && errno != EEXIST) {
        printf("warning: cannot make %s (%s): step %d is not evaluated\n", ev->dir, strerror(errno), step);
        return;
    }
    eval_link_path(ev, step, link_path, sizeof(link_path));
    unlink(link_path);
    if (link(checkpoint, link_path) != 0) {
        printf("warning: cannot link %s to %s (%s): step %d is not evaluated\n", link_path, checkpoint,
               strerror(errno), step);
        return;
    }
    if (ev->pid == 0) { eval_spawn(ev, step); return; }
    if (ev->waiting != 0) {
        char old[VLA_PATH_MAX + 32];
        eval_link_path(ev, ev->waiting, old, sizeof(old));
        unlink(old);
        printf("warning: the evaluation of step %d still runs: step %d's, which waited for it, is skipped for step %d's "
               "(a larger --eval-every, or a cheaper --eval-cmd, keeps up)\n", ev->step, ev->waiting, step);
    }
    ev->waiting = step;
}

// The run's end: a finished run waits for its evaluations (the running one and the one waiting,
// said first), unless *stop is set (Ctrl-C) before they end; an interrupted run stops the running
// one (its group, SIGTERM) and drops the waiting one, and says so.
static inline void eval_finish(Evaluator* ev, Logger* lg, const volatile sig_atomic_t* stop) {
    eval_poll(ev, lg);
    if (ev->pid != 0 && !*stop) {
        if (ev->waiting != 0) {
            printf("waiting for the evaluations of steps %d and %d to end (the output of each: %s/step_N.log; Ctrl-C "
                   "stops them)\n", ev->step, ev->waiting, ev->dir);
        } else {
            printf("waiting for the evaluation of step %d to end (its output: %s; Ctrl-C stops it)\n", ev->step,
                   ev->log);
        }
        fflush(stdout);
        while (ev->pid != 0 && !*stop) {
            usleep(100 * 1000);
            eval_poll(ev, lg);
        }
    }
    if (ev->waiting != 0) {
        char old[VLA_PATH_MAX + 32];
        eval_link_path(ev, ev->waiting, old, sizeof(old));
        unlink(old);
        printf("the evaluation of step %d did not start (the run was interrupted): it is not in the log\n", ev->waiting);
        ev->waiting = 0;
    }
    if (ev->pid == 0) { return; }
    kill(-ev->pid, SIGTERM);
    waitpid(ev->pid, NULL, 0);
    ev->pid = 0;
    unlink(ev->link);
    printf("stopped the evaluation of step %d (the run was interrupted): it is not in the log\n", ev->step);
}

#endif  // VLA_EVALUATION_H
