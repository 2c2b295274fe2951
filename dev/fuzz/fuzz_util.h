// fuzz_util.h: what the fuzz harnesses share. Each input becomes files the readers open by path:
// in-memory files (memfd), reached as /proc/self/fd/N, rewritten for every input; readers of a
// folder get a temporary folder of this process, removed at exit. The small configurations and
// identities the harnesses and make_seeds.c must agree on are here too.
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include "../../vla/common.h"
#include "../../vla/config.h"
#include "../../vla/cli.h"
#include "../../vla/bootstrap.h"
#include <sys/mman.h>  // memfd_create

#define FUZZ_MAX_FILES 4
static int fuzz_fds[FUZZ_MAX_FILES] = {-1, -1, -1, -1};
static char fuzz_paths[FUZZ_MAX_FILES][64];

// The readers print warnings on stdout (instructions that read the same, dropped log lines, ...):
// not wanted at thousands of inputs a second
static inline void fuzz_quiet(void) {
    static int quiet = 0;
    if (!quiet && freopen("/dev/null", "w", stdout) == NULL) { perror("freopen"); abort(); }
    quiet = 1;
}

// The path of in-memory file k (of FUZZ_MAX_FILES) holding exactly data[0..size).
static inline const char* fuzz_file_at(int k, const uint8_t* data, size_t size) {
    if (fuzz_fds[k] < 0) {
        fuzz_fds[k] = memfd_create("fuzz_input", 0);
        if (fuzz_fds[k] < 0) { perror("memfd_create"); abort(); }
        snprintf(fuzz_paths[k], sizeof(fuzz_paths[k]), "/proc/self/fd/%d", fuzz_fds[k]);
        fuzz_quiet();
    }
    if (ftruncate(fuzz_fds[k], 0) != 0 || (size > 0 && pwrite(fuzz_fds[k], data, size, 0) != (ssize_t)size)) {
        perror("writing the fuzz input");
        abort();
    }
    return fuzz_paths[k];
}

// The path of a file holding exactly data[0..size).
static inline const char* fuzz_file(const uint8_t* data, size_t size) { return fuzz_file_at(0, data, size); }

// Removes every entry of dir (files only: the harnesses make no folders inside theirs).
static inline void fuzz_clear_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (d == NULL) { return; }
    for (struct dirent* de = readdir(d); de != NULL; de = readdir(d)) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) { continue; }
        char path[VLA_PATH_MAX + 300];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        unlink(path);
    }
    closedir(d);
}

static char fuzz_dir_path[VLA_PATH_MAX];
static char fuzz_subdir_path[VLA_PATH_MAX];
static inline void fuzz_dir_remove(void) {
    if (fuzz_subdir_path[0] != '\0') { fuzz_clear_dir(fuzz_subdir_path); rmdir(fuzz_subdir_path); }
    fuzz_clear_dir(fuzz_dir_path);
    rmdir(fuzz_dir_path);
}

// A folder of this process under $TMPDIR (or /tmp), made on the first call and removed, with what
// it holds, when the process exits. dev/fuzz/run_fuzz.sh also runs each harness in a TMPDIR of
// its own that it removes, so a harness killed mid-input leaves nothing either.
static inline const char* fuzz_dir(void) {
    if (fuzz_dir_path[0] == '\0') {
        const char* base = getenv("TMPDIR");
        snprintf(fuzz_dir_path, sizeof(fuzz_dir_path), "%s/fuzz_XXXXXX", base != NULL && base[0] != '\0' ? base : "/tmp");
        if (mkdtemp(fuzz_dir_path) == NULL) { perror("mkdtemp"); abort(); }
        atexit(fuzz_dir_remove);
        fuzz_quiet();
    }
    return fuzz_dir_path;
}

// A folder named `name` inside fuzz_dir() (one per process), removed with it.
static inline const char* fuzz_subdir(const char* name) {
    if (fuzz_subdir_path[0] == '\0') {
        snprintf(fuzz_subdir_path, sizeof(fuzz_subdir_path), "%s/%s", fuzz_dir(), name);
        if (mkdir(fuzz_subdir_path, 0755) != 0) { perror("mkdir"); abort(); }
    }
    return fuzz_subdir_path;
}

// The config whose LeRobot weights make_seeds writes as a safetensors seed and fuzz_safetensors
// loads: small, so a seed of every tensor fits the fuzzers' 64 KB inputs.
//  cam S  A  img p  Cv Fv Lv NHv s  vocab pad text C   F   L  NH NKV HS Ce Fe  n  H  Smax Amax theta
static const FlowConfig FUZZ_SAFETENSORS_CONFIG =
    {1, 2, 2, 8,  4, 4, 8, 1, 2,  1, 256, 0,  4,   8,  8,  2, 2, 1,  4, 4, 8,  2, 2, 4,   4,   10000, FAMILY_SMOLVLA};

// The identity of node `node_rank` of a 4-node run of the tiny preset, as fuzz_boot's node 0
// holds it and make_seeds's hellos send it
static inline BootIdentity fuzz_boot_identity(int node_rank) {
    TrainArgs a;
    train_args_defaults(&a);
    a.ranks = 2;
    return boot_identity(&a, &flow_preset("tiny")->config, node_rank, 4, 0, 56);
}
#define FUZZ_BOOT_PAYLOAD 128  // NCCL's unique id

#endif
