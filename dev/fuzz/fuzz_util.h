// fuzz_util.h: what the fuzz harnesses share. Each input becomes a file the readers open by path:
// an in-memory file (memfd), reached as /proc/self/fd/N, rewritten for every input.
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include "../../vla.h"  // (with sys/mman.h, for memfd_create)

static int fuzz_fd = -1;
static char fuzz_path[64];

// The path of a file holding exactly data[0..size).
static inline const char* fuzz_file(const uint8_t* data, size_t size) {
    if (fuzz_fd < 0) {
        fuzz_fd = memfd_create("fuzz_input", 0);
        if (fuzz_fd < 0) { perror("memfd_create"); abort(); }
        snprintf(fuzz_path, sizeof(fuzz_path), "/proc/self/fd/%d", fuzz_fd);
        // the readers print warnings on stdout (instructions that read the same, ...): not wanted
        // at thousands of inputs a second
        if (freopen("/dev/null", "w", stdout) == NULL) { perror("freopen"); abort(); }
    }
    if (ftruncate(fuzz_fd, 0) != 0 || (size > 0 && pwrite(fuzz_fd, data, size, 0) != (ssize_t)size)) {
        perror("writing the fuzz input");
        abort();
    }
    return fuzz_path;
}

#endif
