/*
vla/run_folder.h: the run folder (-o): what a folder holds (checkpoints, log, temporary files),
its identity, checked before every write so that a folder removed, moved or replaced stops the
run, and an earlier run moved aside. runs.h takes the folder for a run (run_folder_open). Needs
common.h.
*/
#ifndef VLA_RUN_FOLDER_H
#define VLA_RUN_FOLDER_H

#include "common.h"
#include <dirent.h>

// ----------------------------------------------------------------------------
// the run folder (-o): one owner, nothing of an earlier run lost
//
// The process that writes a run's checkpoints and log (the CPU trainer; the GPU trainer's node 0)
// owns its folder: an exclusive flock on <out>/.lock for the run's lifetime, the lock file naming
// the owner (pid, host, start). The kernel releases the lock when its process ends however it
// ends, so a lock left by a killed trainer is taken over (its line is still there, and said). The
// folder's identity (device, inode; the folder held open, so that a folder made in the place of a
// removed one cannot get its inode) is taken with the lock and checked before every write: a
// folder removed, moved or replaced under the run stops it, with nothing written elsewhere.
// A folder holds a run when it holds a checkpoint file (ckpt_*.bin) or a non-empty log.jsonl. A
// new run into it is refused, saying how to continue it (-y 1) or move it aside (--new-run, into
// <out>/previous_<N>/); -y 1 starts from scratch only where there is no run at all.

typedef struct {
    char path[VLA_PATH_MAX];  // -o as given
    dev_t dev;                // the folder's identity when the run took it
    ino_t ino;
    int dir_fd;               // the folder, held open: its inode cannot go to a folder made in its place
    int lock_fd;              // <path>/.lock, locked; -1: this process owns no run folder
} RunFolder;
static RunFolder run_folder = {"", 0, 0, -1, -1};  // one run per process

static inline void make_dir(const char* dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        int err = errno;
        char parent[VLA_PATH_MAX], fix[VLA_PATH_MAX + 128];
        path_folder(dir, parent, sizeof(parent));
        struct stat st;
        if ((err == ENOENT || err == ENOTDIR) && stat(parent, &st) != 0) {
            snprintf(fix, sizeof(fix), "%s does not exist: create it first", parent);
        } else {
            write_failure_fix(err, parent, fix, sizeof(fix));
        }
        vla_fail("cannot create the output folder %s: %s: %s, or pick another with -o", dir, strerror(err), fix);
    }
}

// A run's file (the log, TensorBoard's events) flushed after a write; if the flush fails, the run
// stops in one line naming the cause and its fix, then how to continue from the last checkpoint
static inline void run_file_flush(FILE* f, const char* path) {
    if (fflush(f) == 0 && !ferror(f)) { return; }
    int err = errno;
    char dir[VLA_PATH_MAX], fix[VLA_PATH_MAX + 128];
    vla_fail("writing %s failed: %s: %s, then continue with -y 1 -o %s", path, strerror(err),
             write_failure_fix(err, path_folder(path, dir, sizeof(dir)), fix, sizeof(fix)), dir);
}

// The files a run writes beside its checkpoints (its settings, TensorBoard's events, the folder of
// --eval-every's evaluations): they go where its log goes (--new-run)
static const char* const RUN_SIDE_FILES[] = {"run.json", "events.out.tfevents.train_vla", "eval"};

// What a file of a run folder is: 1 a checkpoint (ckpt_*.bin), 2 the log, 3 a temporary file a
// save left (ckpt_*.tmp, log.jsonl.*tmp: the <name>.tmp and <name>.<pid>.tmp forms, and those of
// the side files), 4 a side file (RUN_SIDE_FILES), 0 none of them.
enum { RUN_FILE_NONE = 0, RUN_FILE_CHECKPOINT = 1, RUN_FILE_LOG = 2, RUN_FILE_TEMP = 3, RUN_FILE_SIDE = 4 };
static inline int run_file_kind(const char* name) {
    size_t n = strlen(name);
    int is_ckpt = strncmp(name, "ckpt_", 5) == 0, is_log = strncmp(name, "log.jsonl", 9) == 0;
    int temp = n > 4 && strcmp(name + n - 4, ".tmp") == 0;
    if (temp && (is_ckpt || (is_log && name[9] == '.'))) { return RUN_FILE_TEMP; }
    for (size_t k = 0; k < sizeof(RUN_SIDE_FILES) / sizeof(RUN_SIDE_FILES[0]); k++) {
        size_t len = strlen(RUN_SIDE_FILES[k]);
        if (strncmp(name, RUN_SIDE_FILES[k], len) != 0) { continue; }
        if (name[len] == '\0') { return RUN_FILE_SIDE; }
        if (temp && name[len] == '.') { return RUN_FILE_TEMP; }
    }
    if (is_ckpt && n > 9 && strcmp(name + n - 4, ".bin") == 0) { return RUN_FILE_CHECKPOINT; }
    return strcmp(name, "log.jsonl") == 0 ? RUN_FILE_LOG : RUN_FILE_NONE;
}

// Whether dir holds a run (a checkpoint file or a non-empty log.jsonl); what it holds, said in words
// ("2 checkpoint files and log.jsonl (4.1 KiB)"), into what; the checkpoint files it counts, into
// *n_checkpoints where not NULL.
static inline int run_folder_holds_run(const char* dir, char* what, size_t size, int* n_checkpoints) {
    int checkpoints = 0;
    uint64_t log_bytes = 0;
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        int kind = run_file_kind(de->d_name);
        char path[VLA_PATH_MAX + 300];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (kind == RUN_FILE_CHECKPOINT) { checkpoints++; }
        if (kind == RUN_FILE_LOG && stat(path, &st) == 0) { log_bytes = (uint64_t)st.st_size; }
    }
    if (d != NULL) { closedir(d); }
    char ckpts[64] = "", logged[64] = "", bytes[32];
    if (checkpoints > 0) {
        snprintf(ckpts, sizeof(ckpts), "%d checkpoint file%s", checkpoints, checkpoints > 1 ? "s" : "");
    }
    if (log_bytes > 0) {
        snprintf(logged, sizeof(logged), "log.jsonl (%s)", human_bytes(log_bytes, bytes, sizeof(bytes)));
    }
    snprintf(what, size, "%s%s%s", ckpts, checkpoints > 0 && log_bytes > 0 ? " and " : "", logged);
    if (n_checkpoints != NULL) { *n_checkpoints = checkpoints; }
    return checkpoints > 0 || log_bytes > 0;
}

// Whether path names a file in the run folder (its folder has the folder's identity).
static inline int run_folder_contains(const char* path) {
    char dir[VLA_PATH_MAX];
    struct stat st;
    return run_folder.lock_fd >= 0 && stat(path_folder(path, dir, sizeof(dir)), &st) == 0 &&
           st.st_dev == run_folder.dev && st.st_ino == run_folder.ino;
}

// Where the owned folder is now, from the lock file the process holds open: "moved to X" or
// "removed", into buf.
static inline const char* run_folder_whereabouts(char* buf, size_t size) {
    char link[64], now[VLA_PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", run_folder.lock_fd);
    ssize_t n = readlink(link, now, sizeof(now) - 1);
    if (n <= 0) { snprintf(buf, size, "removed or moved"); return buf; }
    now[n] = '\0';
    size_t len = strlen(now);
    if (len > 10 && strcmp(now + len - 10, " (deleted)") == 0) { snprintf(buf, size, "removed"); return buf; }
    if (len > 6 && strcmp(now + len - 6, "/.lock") == 0) { now[len - 6] = '\0'; }
    snprintf(buf, size, "moved to %s", now);
    return buf;
}

// Whether the run folder is where it was, the same folder (1 too where this process owns none).
static inline int run_folder_intact(void) {
    struct stat st;
    return run_folder.lock_fd < 0 ||
           (stat(run_folder.path, &st) == 0 && st.st_dev == run_folder.dev && st.st_ino == run_folder.ino);
}

// Before each write into the run folder (what: "step 40's checkpoint", "step 41's log line"): the
// folder must be the one the run took. Removed, moved or replaced: the run stops in one line,
// nothing written. A process that owns no folder (the tests' saves) makes it where missing.
static inline void run_folder_check(const char* dir, const char* what) {
    if (run_folder.lock_fd < 0) {
        if (dir != NULL) { make_dir(dir); }
        return;
    }
    if (run_folder_intact()) { return; }
    struct stat st;
    char where[VLA_PATH_MAX + 32];
    if (stat(run_folder.path, &st) != 0) {
        vla_fail(
            "the output folder %s was %s during the run: %s was not written; put the folder back and continue "
            "with -y 1 -o %s",
            run_folder.path, run_folder_whereabouts(where, sizeof(where)), what, run_folder.path);
    }
    if (st.st_dev != run_folder.dev || st.st_ino != run_folder.ino) {
        vla_fail("the output folder %s was replaced during the run (the run's folder was %s): %s was not written into "
                 "the new one; put the run's folder back and continue with -y 1 -o %s", run_folder.path,
                 run_folder_whereabouts(where, sizeof(where)), what, run_folder.path);
    }
}

// At exit: the lock file is emptied (a lock file that names a process tells of one that ended
// without this), and the kernel drops the lock with the process.
static inline void run_folder_release(void) {
    if (run_folder.lock_fd >= 0 && ftruncate(run_folder.lock_fd, 0) != 0) {}
}

// Makes the folder's first unused previous_<N>/ (its path into prev), for `who`'s message.
static inline void run_folder_make_previous(const char* dir, const char* who, char* prev, size_t size) {
    for (int k = 1;; k++) {
        snprintf(prev, size, "%s/previous_%d", dir, k);
        if (mkdir(prev, 0755) == 0) { return; }
        if (errno != EEXIST) {
            int err = errno;
            char fix[VLA_PATH_MAX + 128];
            vla_fail("%s: cannot create %s: %s: %s", who, prev, strerror(err),
                     write_failure_fix(err, dir, fix, sizeof(fix)));
        }
    }
}

// --new-run: the earlier run's files (checkpoints, log.jsonl, the side files, temporary files) move into the
// folder's first unused previous_<N>/, said in one line that starts with `who`. Nothing is deleted.
static inline void run_folder_move_aside(const char* dir, const char* who) {
    char what[128];
    if (!run_folder_holds_run(dir, what, sizeof(what), NULL)) { return; }
    char prev[VLA_PATH_MAX + 32];
    run_folder_make_previous(dir, who, prev, sizeof(prev));
    int moved = 0;
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        if (run_file_kind(de->d_name) == RUN_FILE_NONE) { continue; }
        char from[VLA_PATH_MAX + 300], to[VLA_PATH_MAX + 332];
        snprintf(from, sizeof(from), "%s/%s", dir, de->d_name);
        snprintf(to, sizeof(to), "%s/%s", prev, de->d_name);
        if (rename(from, to) != 0) {
            vla_fail(
                "%s: moving %s into %s failed: %s (%d file(s) of the earlier run are there already, the rest where "
                "they were): move them by hand",
                who, from, prev, strerror(errno), moved);
        }
        moved++;
    }
    if (d != NULL) { closedir(d); }
    printf("%s: moved the earlier run in %s (%s) into %s/\n", who, dir, what, prev);
}

// Temporary files left by a save that was killed (SIGINT, then SIGKILL): no other process writes
// here, so they are removed, each said with its size.
static inline void run_folder_remove_stale(const char* dir) {
    DIR* d = opendir(dir);
    for (struct dirent* de = d != NULL ? readdir(d) : NULL; de != NULL; de = readdir(d)) {
        if (run_file_kind(de->d_name) != RUN_FILE_TEMP) { continue; }
        char path[VLA_PATH_MAX + 300], bytes[32];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) { continue; }
        char said[VLA_SAID_BYTES];  // a name of any bytes: quoted escaped
        if (unlink(path) == 0) {
            printf("removed %s (%s), a temporary file left by a save that was killed\n", path_said(path, said),
                   human_bytes((uint64_t)st.st_size, bytes, sizeof(bytes)));
        }
    }
    if (d != NULL) { closedir(d); }
}

#endif  // VLA_RUN_FOLDER_H
