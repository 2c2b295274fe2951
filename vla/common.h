/*
vla/common.h: what every part of train_vla needs: errors that say what to do (vla_fail, one line
on stderr, exit status 1; mallocCheck, callocCheck, fopenCheck, checked size arithmetic), paths
and byte counts for messages, the bounds on every size a file may carry, and a probe of how many
threads can start. Needs only the C library and POSIX.

Errors in user input end the process with one line on stderr that names the problem and how to
fix it. Nothing in vla/ calls abort() on bad input. The readers of files (shard_open_checked,
dataset_open_checked, checkpoint_read_checked) return their error instead, leaving nothing open
or allocated, for the policy library and the fuzzers (dev/fuzz); the trainers call the wrappers
that fail with it. In the policy libraries a failure anywhere else is caught at the library's
entry point instead of ending the process (vla_catch_call).
*/
#ifndef VLA_COMMON_H
#define VLA_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// utilities: errors that say what to do, checked allocation and file calls

// train_vla.cu compiles this header as C++
#ifdef __cplusplus
#define VLA_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define VLA_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

// One line on stderr, exit status 1. Used for every user-facing failure.
//
// The policy libraries (VLA_LIBRARY: libvla.so, libvla_gpu.so) live inside someone else's process,
// which a failure must not end: each of their entry points runs its work through vla_catch_call,
// and a vla_fail on a thread inside one is caught instead. Its line goes to that thread's
// buffer (vla_caught_message) and vla_catch_call returns how the work failed (VLA_CAUGHT_FAILURE,
// or VLA_CAUGHT_NO_MEMORY from mallocCheck, callocCheck and vla_fail_no_memory). C builds jump back
// with longjmp, so nothing between may hold what only its own return would release; C++ builds
// (train_vla.cu) throw, so the destructors in between run. A thread outside any vla_catch_call
// (the trainers; test_vla calling the model directly) prints and exits as before. No vla_fail may
// run inside an OpenMP parallel region: no jump or throw may leave one.
#ifdef VLA_LIBRARY
#ifdef __cplusplus
#include <new>
#define VLA_THREAD_LOCAL thread_local
#else
#include <setjmp.h>
#define VLA_THREAD_LOCAL _Thread_local
#endif
enum { VLA_CAUGHT_NONE = 0, VLA_CAUGHT_FAILURE = 1, VLA_CAUGHT_NO_MEMORY = 2 };
typedef struct VlaCatchFrame {
#ifndef __cplusplus
    jmp_buf jump;
#endif
    struct VlaCatchFrame* outer;  // the enclosing vla_catch_call's, NULL at the outermost
} VlaCatchFrame;
static VLA_THREAD_LOCAL VlaCatchFrame* vla_catch_top = NULL;  // this thread's innermost vla_catch_call
static VLA_THREAD_LOCAL char vla_caught_text[8192];           // the line of its last caught failure
#ifdef __cplusplus
struct VlaCaught { int how; };
#endif
// The line of the calling thread's last failure caught by vla_catch_call ("" if none since it began)
static inline const char* vla_caught_message(void) { return vla_caught_text; }
#endif

static inline void vla_vfail(int no_memory, const char* fmt, va_list ap) __attribute__((noreturn));
static inline void vla_vfail(int no_memory, const char* fmt, va_list ap) {
#ifdef VLA_LIBRARY
    if (vla_catch_top != NULL) {
        vsnprintf(vla_caught_text, sizeof(vla_caught_text), fmt, ap);
        int how = no_memory ? VLA_CAUGHT_NO_MEMORY : VLA_CAUGHT_FAILURE;
#ifdef __cplusplus
        throw VlaCaught{how};
#else
        longjmp(vla_catch_top->jump, how);
#endif
    }
#endif
    (void)no_memory;
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    exit(1);
}

static inline void vla_fail(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void vla_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vla_vfail(0, fmt, ap);
}

// vla_fail for memory that could not be had (host or device): the libraries report it as such
// (POLICY_NO_MEMORY, Python's MemoryError), not as a bug
static inline void vla_fail_no_memory(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void vla_fail_no_memory(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vla_vfail(1, fmt, ap);
}

#ifdef VLA_LIBRARY
// Runs fn(arg) on this thread; a vla_fail inside it returns here. Returns VLA_CAUGHT_NONE when fn
// returned, else how it failed, its line in vla_caught_message(). What fn must release on a failure
// has to be reachable from arg (never fn's own locals), for the caller to release. Calls nest.
static inline int vla_catch_call(void (*fn)(void*), void* arg) {
    VlaCatchFrame frame;
    frame.outer = vla_catch_top;
    vla_caught_text[0] = '\0';
    vla_catch_top = &frame;
#ifdef __cplusplus
    int how = VLA_CAUGHT_NONE;
    try {
        fn(arg);
    } catch (const VlaCaught& caught) {
        how = caught.how;
    } catch (const std::bad_alloc&) {  // (an allocation by C++ code, e.g. the CUDA emulation's)
        snprintf(vla_caught_text, sizeof(vla_caught_text), "out of host memory: pass fewer observations per call, or "
                 "free memory");
        how = VLA_CAUGHT_NO_MEMORY;
    } catch (...) {
        snprintf(vla_caught_text, sizeof(vla_caught_text), "an unexpected C++ exception inside the library: report it");
        how = VLA_CAUGHT_FAILURE;
    }
    vla_catch_top = frame.outer;
    return how;
#else
    switch (setjmp(frame.jump)) {  // (setjmp's value may only be tested, never stored)
        case 0:
            fn(arg);
            vla_catch_top = frame.outer;
            return VLA_CAUGHT_NONE;
        case VLA_CAUGHT_NO_MEMORY:
            vla_catch_top = frame.outer;
            return VLA_CAUGHT_NO_MEMORY;
        default:
            vla_catch_top = frame.outer;
            return VLA_CAUGHT_FAILURE;
    }
#endif
}
#define VLA_NO_MEMORY_FIX "pass fewer observations per call, or free memory"
#else
#define VLA_NO_MEMORY_FIX "use a smaller batch (-b) or preset"
#endif

static inline void* malloc_check_(size_t size, const char* file, int line) {
    void* p = malloc(size > 0 ? size : 1);
    if (p == NULL) {
        vla_fail_no_memory("out of memory allocating %zu bytes at %s:%d: " VLA_NO_MEMORY_FIX, size, file, line);
    }
    return p;
}
#define mallocCheck(size) malloc_check_((size), __FILE__, __LINE__)

static inline void* calloc_check_(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
    if (p == NULL) {
        vla_fail_no_memory("out of memory allocating %zu x %zu bytes at %s:%d: " VLA_NO_MEMORY_FIX, n, size, file,
                           line);
    }
    return p;
}
#define callocCheck(n, size) calloc_check_((n), (size), __FILE__, __LINE__)

static inline FILE* fopen_check_(const char* path, const char* mode, const char* file, int line) {
    FILE* f = fopen(path, mode);
    if (f == NULL) {
        vla_fail("cannot open %s (mode %s): %s (at %s:%d)", path, mode, strerror(errno), file, line);
    }
    return f;
}
#define fopenCheck(path, mode) fopen_check_((path), (mode), __FILE__, __LINE__)

static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// qsort's order of doubles (timings, for their medians)
static inline int compare_doubles(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return x < y ? -1 : x > y;
}

// a*b for sizes read from files: overflow is a corrupt file, not a crash
static inline uint64_t mul_check(uint64_t a, uint64_t b, const char* path, const char* what) {
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        vla_fail("%s: size of %s overflows 64 bits: the file is corrupt, regenerate it", path, what);
    }
    return r;
}

// Paths the trainers build (checkpoints, the log, temporary files) fit buffers of this size;
// longer ones are refused where they come in (-o, -i), never cut.
#define VLA_PATH_MAX 4096

// "1.25 GiB": a byte count for messages
static inline const char* human_bytes(uint64_t n, char* buf, size_t size) {
    const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)n;
    int u = 0;
    while (x >= 1024.0 && u < 4) { x /= 1024.0; u++; }
    snprintf(buf, size, u == 0 ? "%.0f %s" : "%.2f %s", x, units[u]);
    return buf;
}

// How to fix a write into folder dir that failed with errno err, said as what it is: no space
// (ENOSPC, EDQUOT), a file past the size limit (EFBIG), no permission or a read-only file system
// (EACCES, EPERM, EROFS), else the disk itself. The caller says where to go on from there.
static inline const char* write_failure_fix(int err, const char* dir, char* buf, size_t size) {
    if (err == EFBIG) {
        snprintf(buf, size, "the file is larger than the file size limit allows (ulimit -f, or the file system's "
                 "largest file): raise the limit");
    } else if (err == ENOSPC || err == EDQUOT) {
        struct statvfs vfs;
        char avail[32];
        if (statvfs(dir, &vfs) == 0) {
            snprintf(buf, size, "free space in %s (%s free there)", dir,
                     human_bytes((uint64_t)vfs.f_bavail * vfs.f_frsize, avail, sizeof(avail)));
        } else {
            snprintf(buf, size, "free space in %s", dir);
        }
    } else if (err == EROFS) {
        snprintf(buf, size, "%s is on a read-only file system: remount it read-write", dir);
    } else if (err == EACCES || err == EPERM) {
        snprintf(buf, size, "this user may not write into %s: make it writable", dir);
    } else {
        snprintf(buf, size, "check the disk that holds %s", dir);
    }
    return buf;
}

// The folder a path is in ("." for a bare name), into buf.
static inline const char* path_folder(const char* path, char* buf, size_t size) {
    snprintf(buf, size, "%s", path);
    char* slash = strrchr(buf, '/');
    if (slash == NULL) { snprintf(buf, size, "."); } else if (slash == buf) { buf[1] = '\0'; } else { *slash = '\0'; }
    return buf;
}

// Bytes from a file or the network quoted in a message (a tensor name, a tokenizer's name, the
// line of a lock file): up to n bytes or a NUL, control bytes written as \n, \r, \t or \xNN and a
// backslash as \\, so what a file holds can neither break the message's line nor forge another;
// cut with "..." where out is full. Returns out.
static inline const char* text_escaped(const void* bytes, size_t n, char* out, size_t size) {
    const uint8_t* p = (const uint8_t*)bytes;
    if (size == 0) { return out; }
    size_t k = 0, i = 0;
    for (; i < n && p[i] != 0; i++) {
        char code[8];
        uint8_t b = p[i];
        if (b == '\n') { snprintf(code, sizeof(code), "\\n"); }
        else if (b == '\r') { snprintf(code, sizeof(code), "\\r"); }
        else if (b == '\t') { snprintf(code, sizeof(code), "\\t"); }
        else if (b == '\\') { snprintf(code, sizeof(code), "\\\\"); }
        else if (b < 0x20 || b == 0x7f) { snprintf(code, sizeof(code), "\\x%02x", b); }
        else { code[0] = (char)b; code[1] = '\0'; }
        size_t len = strlen(code);
        if (k + len > size - 1) { break; }
        memcpy(out + k, code, len);
        k += len;
    }
    if (i < n && p[i] != 0 && size >= 4) {  // cut short: say so
        k = k < size - 4 ? k : size - 4;
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
    return out;
}

// A path as messages quote it, into buf of VLA_SAID_BYTES: escaped as text_escaped escapes, and
// past VLA_SAID_PATH bytes its first and last bytes around "...", with its length. A message
// shortens the path, never its reason (it fits the readers' err buffers whatever the path).
#define VLA_SAID_PATH 512
#define VLA_SAID_BYTES (8 * VLA_SAID_PATH + 64)
static inline const char* path_said(const char* path, char* buf) {
    size_t n = strlen(path), keep = VLA_SAID_PATH / 2 - 16;
    if (n <= VLA_SAID_PATH) { return text_escaped(path, n, buf, VLA_SAID_BYTES); }
    text_escaped(path, keep, buf, VLA_SAID_BYTES);
    size_t at = strlen(buf);
    snprintf(buf + at, VLA_SAID_BYTES - at, "...");
    at += 3;
    text_escaped(path + n - keep, keep, buf + at, VLA_SAID_BYTES - at);
    at += strlen(buf + at);
    snprintf(buf + at, VLA_SAID_BYTES - at, " (a path of %zu bytes)", n);
    return buf;
}

// Whether n threads can run at once here (OpenMP's runtime ends the process with its own lines
// when it cannot start the threads -t asks for): starts n - 1 threads that wait, then joins them.
// Returns the number that started besides the caller, n - 1 when all did.
typedef struct { pthread_mutex_t lock; pthread_cond_t go; int released; } ThreadProbe;
static inline void* thread_probe_wait(void* arg) {
    ThreadProbe* p = (ThreadProbe*)arg;
    pthread_mutex_lock(&p->lock);
    while (!p->released) { pthread_cond_wait(&p->go, &p->lock); }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}
static inline int threads_startable(int n) {
    ThreadProbe probe = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_t* ids = (pthread_t*)mallocCheck((size_t)(n > 1 ? n : 1) * sizeof(pthread_t));
    int started = 0;
    while (started < n - 1 && pthread_create(&ids[started], NULL, thread_probe_wait, &probe) == 0) { started++; }
    pthread_mutex_lock(&probe.lock);
    probe.released = 1;
    pthread_cond_broadcast(&probe.go);
    pthread_mutex_unlock(&probe.lock);
    for (int i = 0; i < started; i++) { pthread_join(ids[i], NULL); }
    free(ids);
    return started;
}

// Bounds on every size a file can carry (checkpoint headers, shard headers): generous for real
// models, and small enough that every size derived from them fits an int (token counts, patch
// size, attention width, state + action) and the parameter count fits 64 bits with room to spare.
#define VLA_MAX_CAM 16
#define VLA_MAX_IMG 4096
#define VLA_MAX_DIM 4096          // state_dim, action_dim
#define VLA_MAX_TEXT 1024         // max_text (also --max-text's bound)
#define VLA_MAX_CHUNK 1024        // chunk
#define VLA_MAX_WIDTH 65536       // d_model, d_ff, d_expert, d_expert_ff, n_head x head_dim
#define VLA_MAX_LAYER 1024
#define VLA_MAX_HEAD 1024         // n_head, head_dim
#define VLA_MAX_TOKENS 16384      // image tokens + text + 1 + chunk
#define VLA_MAX_PARAMS (1ULL << 36)  // 256 GiB of fp32 weights
#define VLA_MAX_STEPS (1 << 30)   // optimizer steps of a run (-n's bound)

#endif  // VLA_COMMON_H
