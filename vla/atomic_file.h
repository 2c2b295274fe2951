/*
vla/atomic_file.h: files written whole or not at all (AtomicFile: a temporary file, flushed,
renamed over the name, only into the run's own folder) and the CRC-32 their writers and readers
compute. Needs common.h and run_folder.h.
*/
#ifndef VLA_ATOMIC_FILE_H
#define VLA_ATOMIC_FILE_H

#include "common.h"
#include "run_folder.h"

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320: what zlib.crc32 and `gzip` compute), by
// slicing-by-8: eight bytes per step through eight 256-entry tables. 1.3 to 1.8 GB/s on one x86
// core: a 2.4 GB smolvla checkpoint costs 1.4 to 1.9 s of CPU to checksum, small beside writing or
// reading it. crc32_update(crc32_update(0, a), b) is the CRC of a then b.
static uint32_t crc32_table[8][256];
static pthread_once_t crc32_once = PTHREAD_ONCE_INIT;

static void crc32_build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) { c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
        crc32_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {  // table t: the byte followed by t zero bytes
        for (int t = 1; t < 8; t++) {
            crc32_table[t][i] = (crc32_table[t - 1][i] >> 8) ^ crc32_table[0][crc32_table[t - 1][i] & 0xFF];
        }
    }
}

static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    pthread_once(&crc32_once, crc32_build_tables);
    const uint8_t* p = (const uint8_t*)data;
    uint32_t c = ~crc;
    for (; n > 0 && ((uintptr_t)p & 7) != 0; n--) { c = crc32_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); }
    for (; n >= 8; n -= 8, p += 8) {  // little-endian loads (every machine train_vla builds for)
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc32_table[7][lo & 0xFF] ^ crc32_table[6][(lo >> 8) & 0xFF] ^ crc32_table[5][(lo >> 16) & 0xFF] ^
            crc32_table[4][lo >> 24] ^ crc32_table[3][hi & 0xFF] ^ crc32_table[2][(hi >> 8) & 0xFF] ^
            crc32_table[1][(hi >> 16) & 0xFF] ^ crc32_table[0][hi >> 24];
    }
    for (; n > 0; n--) { c = crc32_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8); }
    return ~c;
}

// A file written whole or not at all: into path.PID.tmp (so two writers never share one), flushed
// to disk, renamed over path. A failed write removes the temporary file and says what failed (a
// full disk: how much space the file needed; a rename, no permission, a read-only folder: that;
// the run folder moved or removed: that, by run_folder_check). Nothing is renamed into a folder
// that replaced the run's. The CRC-32 of what was written accumulates as it goes.
typedef struct {
    FILE* f;
    const char* path;
    char tmp[VLA_PATH_MAX + 32];
    uint64_t bytes;  // the whole file's size, for the message when a write fails
    uint32_t crc;    // crc32_update of every byte written so far
} AtomicFile;

static inline void atomic_file_fail(AtomicFile* a, const char* what, int err) __attribute__((noreturn));
static inline void atomic_file_fail(AtomicFile* a, const char* what, int err) {
    if (a->f != NULL) { fclose(a->f); }
    a->f = NULL;
    unlink(a->tmp);
    run_folder_check(NULL, a->path);
    char dir[VLA_PATH_MAX + 32], need[32], fix[VLA_PATH_MAX + 128];
    path_folder(a->path, dir, sizeof(dir));
    write_failure_fix(err, dir, fix, sizeof(fix));
    if (strcmp(what, "renaming") == 0) {
        vla_fail("renaming %s to %s failed: %s; the temporary file was removed: %s, or write elsewhere (-o)", a->tmp,
                 a->path, strerror(err), fix);
    }
    int space = err == ENOSPC || err == EDQUOT || err == EFBIG, partial = strcmp(what, "writing") == 0;
    vla_fail("%s %s failed: %s%s%s%s: %s, or write elsewhere (-o)", what, a->path, strerror(err),
             space ? ": the file needs " : "", space ? human_bytes(a->bytes, need, sizeof(need)) : "",
             partial ? "; the partial file was removed" : "", fix);
}

static inline void atomic_file_open(AtomicFile* a, const char* path, uint64_t bytes) {
    a->path = path;
    a->bytes = bytes;
    a->f = NULL;
    a->crc = 0;
    if (snprintf(a->tmp, sizeof(a->tmp), "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof(a->tmp)) {
        vla_fail("path %.80s... is longer than %d bytes: use a shorter output folder (-o)", path, VLA_PATH_MAX - 1);
    }
    // a new file of its own, never through a link planted at the temporary name (O_EXCL|O_NOFOLLOW);
    // a leftover of that name (a run of this pid before a reboot) is unlinked, not written through
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(a->tmp) == 0) {
        fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    }
    a->f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (a->f == NULL) {
        int err = errno;
        if (fd >= 0) { close(fd); unlink(a->tmp); }
        atomic_file_fail(a, "creating", err);
    }
}

static inline void atomic_file_write(AtomicFile* a, const void* p, size_t size, size_t n) {
    if (n > 0 && fwrite(p, size, n, a->f) != n) { atomic_file_fail(a, "writing", errno); }
    a->crc = crc32_update(a->crc, p, size * n);
}

// Writes n bytes over those at `offset`, already written (a field known only at the end, such as
// a checksum), leaving the file positioned at its end; the CRC of the writes is not changed.
static inline void atomic_file_patch(AtomicFile* a, uint64_t offset, const void* p, size_t n) {
    if (fseeko(a->f, (off_t)offset, SEEK_SET) != 0 || fwrite(p, 1, n, a->f) != n || fseeko(a->f, 0, SEEK_END) != 0) {
        atomic_file_fail(a, "writing", errno);
    }
}

static inline void atomic_file_commit(AtomicFile* a) {
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) { atomic_file_fail(a, "writing", errno); }
    int rc = fclose(a->f);
    a->f = NULL;
    if (rc != 0) { atomic_file_fail(a, "writing", errno); }
    if (!run_folder_intact()) { atomic_file_fail(a, "writing", ENOENT); }
    if (rename(a->tmp, a->path) != 0) { atomic_file_fail(a, "renaming", errno); }
}

#endif  // VLA_ATOMIC_FILE_H
