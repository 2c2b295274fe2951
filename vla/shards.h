/*
vla/shards.h: the dataset shard format (header, sections, cameras of any size, the byte
tokenizer) and its reader: a shard mapped and every size checked against the file length before
a byte is trusted, the SIGBUS handler that names a shard truncated while mapped, and the check
that a shard did not change under the run. The writers are in shard_writer.h. Needs common.h.
*/
#ifndef VLA_SHARDS_H
#define VLA_SHARDS_H

#include "common.h"
#include <signal.h>
#include <sys/mman.h>

// ----------------------------------------------------------------------------
// dataset shards (docs/data.md has the format). One file, version 2:
//   header (512 bytes)
//   images         u8  (n_frames, frame bytes)        each frame: its cameras one after another,
//                                                     camera k cam_height[k] x cam_width[k] x 3 (HWC)
//   state          f32 (n_frames, state_dim)
//   action         f32 (n_frames, action_dim)
//   frame_episode  u32 (n_frames)                    episode of each frame, shard-local
//   episodes       ShardEpisode (n_episodes)
//   task_offsets   u64 (n_tasks + 1)                 into task_text
//   task_text      u8  (task_bytes)                  UTF-8, not NUL-terminated
//   stats          f32 state_mean(S) state_std(S) action_mean(A) action_std(A)
//   token_offsets  u64 (n_tasks + 1)                 into tokens
//   tokens         i32 (n_tokens)                    each task's instruction as ids in [0, vocab)
// Sections follow each other in this order, each at the first 64-byte boundary after the one
// before; the header records the offsets and the reader checks that they are exactly there.
// The header names the tokenizer of the ids: "bytes" (id = UTF-8 byte, vocab 256: the presets
// trained from scratch) or a tokenizer.json as "<its basename>:<first 16 hex digits of its
// sha256>". Version 1 (256-byte header: the first 128 bytes of this one, then zeros; the first
// 8 sections; every camera img x img) still reads: the reader maps it to the same view, camera
// sizes img x img, tokenizer "bytes", tokens made from the task text (the frames are not copied).

#define SHARD_MAGIC 0x44414C56u  // "VLAD"
#define SHARD_VERSION 2u
#define SHARD_ALIGN 64
#define SHARD_HEADER_V1 256             // bytes of version 1's header
#define SHARD_TOKENIZER_BYTES "bytes"   // token id = UTF-8 byte
#define SHARD_MAX_VOCAB (1u << 24)
#define VLA_TEXT_VOCAB 256              // the byte tokenizer's vocabulary (the tiny and small presets' text table)
// A std below this counts as zero: the dimension is constant and is only centered.
#define VLA_MIN_STD 1e-6f

typedef struct {
    uint32_t magic, version;
    uint32_t n_cam;
    uint32_t img;                       // side of every camera when all are img x img, else 0
    uint32_t state_dim, action_dim;
    uint64_t n_frames, n_episodes, n_tasks, task_bytes;
    uint64_t off_images, off_state, off_action, off_frame_episode;
    uint64_t off_episodes, off_task_offsets, off_task_text, off_stats;
    uint64_t file_size;
    // version 2 from here on
    uint64_t n_tokens;                  // token ids of all tasks
    uint64_t off_token_offsets, off_tokens;
    uint32_t vocab;                     // every id is in [0, vocab)
    uint32_t reserved0;
    char tokenizer[64];                 // NUL-terminated: "bytes" or "<tokenizer.json basename>:<16 hex>"
    uint32_t cam_height[VLA_MAX_CAM];   // camera k's pixels (0 past n_cam)
    uint32_t cam_width[VLA_MAX_CAM];
    uint64_t reserved[20];
} ShardHeader;
VLA_STATIC_ASSERT(sizeof(ShardHeader) == 512 && VLA_MAX_CAM == 16, "shard header is 512 bytes");
VLA_STATIC_ASSERT(offsetof(ShardHeader, n_tokens) == 128, "version 1's fields come first, where they were");

typedef struct {
    uint64_t first_frame;
    uint32_t length;
    uint32_t task;
} ShardEpisode;
VLA_STATIC_ASSERT(sizeof(ShardEpisode) == 16, "episode record is 16 bytes");

// The cameras of a frame: camera k is height[k] x width[k] pixels, u8 HWC, the cameras one after
// another. A shard's come from its header (shard_cameras); a batch's images are laid out the same.
typedef struct {
    int n;
    uint32_t height[VLA_MAX_CAM], width[VLA_MAX_CAM];
} Cameras;

// Byte offset of camera k in a frame's images; k = n gives the bytes of a whole frame.
static inline size_t camera_offset(const Cameras* cams, int k) {
    size_t off = 0;
    for (int j = 0; j < k; j++) { off += (size_t)cams->height[j] * cams->width[j] * 3; }
    return off;
}

static inline size_t cameras_frame_bytes(const Cameras* cams) { return camera_offset(cams, cams->n); }

static inline Cameras cameras_square(int n, int img) {
    Cameras cams;
    memset(&cams, 0, sizeof(cams));
    cams.n = n;
    for (int k = 0; k < n && k < VLA_MAX_CAM; k++) { cams.height[k] = cams.width[k] = (uint32_t)img; }
    return cams;
}

static inline int cameras_equal(const Cameras* a, const Cameras* b) {
    int same = a->n == b->n;
    for (int k = 0; same && k < a->n; k++) { same = a->height[k] == b->height[k] && a->width[k] == b->width[k]; }
    return same;
}

// The side when every camera is img x img, else 0.
static inline uint32_t cameras_square_side(const Cameras* cams) {
    for (int k = 0; k < cams->n; k++) {
        if (cams->height[k] != cams->width[k] || cams->height[k] != cams->height[0]) { return 0; }
    }
    return cams->n > 0 ? cams->height[0] : 0;
}

// "8x12, 16x16" (height x width of each camera), for messages
static inline const char* cameras_describe(const Cameras* cams, char* buf, size_t size) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < cams->n && at < size; k++) {
        at += (size_t)snprintf(buf + at, size - at, "%s%ux%u", k > 0 ? ", " : "", cams->height[k], cams->width[k]);
    }
    return buf;
}

static inline Cameras shard_cameras(const ShardHeader* h) {
    if (h->version == 1) { return cameras_square((int)h->n_cam, (int)h->img); }
    Cameras cams;
    memset(&cams, 0, sizeof(cams));
    cams.n = (int)h->n_cam;
    for (int k = 0; k < cams.n && k < VLA_MAX_CAM; k++) {
        cams.height[k] = h->cam_height[k];
        cams.width[k] = h->cam_width[k];
    }
    return cams;
}

// Token ids of UTF-8 text under the "bytes" tokenizer: one id per byte, its value.
static inline void tokens_from_bytes(int32_t* ids, const uint8_t* text, size_t n) {
    for (size_t k = 0; k < n; k++) { ids[k] = (int32_t)text[k]; }
}

typedef struct {
    char path[VLA_PATH_MAX];
    ShardHeader h;       // a version-1 file's as version 2 would say it (cameras, tokenizer, n_tokens)
    uint8_t* map;
    size_t map_size;
    const uint8_t* images;
    const float* state;
    const float* action;
    const uint32_t* frame_episode;
    const ShardEpisode* episodes;
    const uint64_t* task_offsets;
    const uint8_t* task_text;
    const float* stats;
    const uint64_t* token_offsets;  // (n_tasks + 1) into tokens
    const int32_t* tokens;          // (n_tokens)
    int32_t* owned_tokens;          // version 1: the tokens made from task_text at open (else NULL)
    // The tables that addresses are computed from (frame_episode, episodes, task_offsets,
    // token_offsets, tokens) are private copies, checked at open: a file rewritten in place while
    // mapped cannot steer a read outside the mapping. The rest (images, state, action, task_text,
    // stats) is read in place; shard_unchanged notices a change, the SIGBUS handler a truncation.
    void* tables;
    uint64_t dev, ino, size;        // the file as opened: shard_unchanged compares them
    int64_t mtime_ns;
} Shard;

static inline uint64_t align_up(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }

// The sections in file order; version 1 has the first SHARD_SECTIONS_V1.
enum { SHARD_SECTIONS_V1 = 8, SHARD_SECTIONS = 10 };
static const char* const SHARD_SECTION_NAMES[SHARD_SECTIONS] = {
    "images", "state", "action", "frame_episode", "episodes", "task_offsets", "task_text", "stats",
    "token_offsets", "tokens"};

static inline int shard_n_sections(const ShardHeader* h) {
    return h->version == 1 ? SHARD_SECTIONS_V1 : SHARD_SECTIONS;
}
static inline uint64_t shard_header_bytes(const ShardHeader* h) {
    return h->version == 1 ? SHARD_HEADER_V1 : sizeof(ShardHeader);
}

// The header's offset fields, in file order.
static inline void shard_section_offsets(ShardHeader* h, uint64_t* offs[SHARD_SECTIONS]) {
    uint64_t* all[SHARD_SECTIONS] = {&h->off_images, &h->off_state, &h->off_action, &h->off_frame_episode,
                                     &h->off_episodes, &h->off_task_offsets, &h->off_task_text, &h->off_stats,
                                     &h->off_token_offsets, &h->off_tokens};
    memcpy(offs, all, sizeof(all));
}

// Byte sizes of the sections, in file order (the counts must be bounded first: see the reader).
static inline void shard_section_sizes(const ShardHeader* h, const char* path, uint64_t sizes[SHARD_SECTIONS]) {
    Cameras cams = shard_cameras(h);
    sizes[0] = mul_check(h->n_frames, cameras_frame_bytes(&cams), path, "images");
    sizes[1] = mul_check(mul_check(h->n_frames, h->state_dim, path, "state"), 4, path, "state");
    sizes[2] = mul_check(mul_check(h->n_frames, h->action_dim, path, "action"), 4, path, "action");
    sizes[3] = mul_check(h->n_frames, 4, path, "frame_episode");
    sizes[4] = mul_check(h->n_episodes, sizeof(ShardEpisode), path, "episodes");
    if (h->n_tasks == UINT64_MAX) { vla_fail("%s: n_tasks is corrupt: regenerate the shard", path); }
    sizes[5] = mul_check(h->n_tasks + 1, 8, path, "task offsets");
    sizes[6] = h->task_bytes;
    sizes[7] = 8ULL * ((uint64_t)h->state_dim + h->action_dim);
    sizes[8] = h->version == 1 ? 0 : sizes[5];
    sizes[9] = h->version == 1 ? 0 : mul_check(h->n_tokens, 4, path, "tokens");
}

// Fills the offsets and file_size of a header whose version and counts are set.
static inline void shard_header_layout(ShardHeader* h) {
    uint64_t sizes[SHARD_SECTIONS], *offs[SHARD_SECTIONS];
    shard_section_sizes(h, "(new shard)", sizes);
    shard_section_offsets(h, offs);
    uint64_t pos = shard_header_bytes(h);
    for (int i = 0; i < shard_n_sections(h); i++) {
        pos = align_up(pos, SHARD_ALIGN);
        *offs[i] = pos;
        pos += sizes[i];
    }
    h->file_size = pos;
}

// The mapped shards, for the SIGBUS handler: a shard truncated while mapped makes a read past its
// new end fault, and the handler names the shard instead of dying as "Bus error". Shards are opened
// and closed before and after the loader's threads run, so the table does not change under a read.
typedef struct { const uint8_t* start; size_t size; char* path; } ShardMapping;
static ShardMapping* shard_mappings = NULL;
static int shard_n_mappings = 0, shard_mappings_cap = 0;
static struct sigaction shard_sigbus_previous;

static inline void shard_sigbus_write(const char* text) {
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, text, n);
        if (w <= 0) { return; }
        text += w;
        n -= (size_t)w;
    }
}

// Async-signal-safe: write(2) and _exit. A fault outside every shard goes to the handler before.
static inline void shard_on_sigbus(int sig, siginfo_t* info, void* context) {
    const uint8_t* at = (const uint8_t*)info->si_addr;
    for (int i = 0; i < shard_n_mappings; i++) {
        if (at >= shard_mappings[i].start && at < shard_mappings[i].start + shard_mappings[i].size) {
            shard_sigbus_write("error: dataset shard ");
            shard_sigbus_write(shard_mappings[i].path);
            shard_sigbus_write(" was truncated while this run read it: restore the shard and continue with -y 1, or "
                               "start a new run on the new data\n");
            _exit(1);
        }
    }
    sigaction(SIGBUS, &shard_sigbus_previous, NULL);  // the fault repeats under the previous handler
    (void)sig; (void)context;
}

// Makes shard_on_sigbus the SIGBUS handler, the one there before its fallback. Called when the
// first shard opens and again when the loader starts: a library may install its own in between
// (the CUDA emulation does, for its device memory), and then handles the faults that are not ours.
static inline void shard_sigbus_install(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == shard_on_sigbus) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = shard_on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &shard_sigbus_previous);
}

static inline void shard_mapping_add(const uint8_t* start, size_t size, const char* path) {
    if (shard_mappings_cap == 0) { shard_sigbus_install(); }
    if (shard_n_mappings == shard_mappings_cap) {
        shard_mappings_cap = shard_mappings_cap > 0 ? 2 * shard_mappings_cap : 16;
        shard_mappings = (ShardMapping*)realloc(shard_mappings, (size_t)shard_mappings_cap * sizeof(ShardMapping));
        if (shard_mappings == NULL) { vla_fail("out of memory listing the mapped shards"); }
    }
    ShardMapping m = {start, size, strdup(path)};
    shard_mappings[shard_n_mappings++] = m;
}

static inline void shard_mapping_remove(const uint8_t* start) {
    for (int i = 0; i < shard_n_mappings; i++) {
        if (shard_mappings[i].start == start) {
            free(shard_mappings[i].path);
            shard_mappings[i] = shard_mappings[--shard_n_mappings];
            return;
        }
    }
}

static inline void shard_close(Shard* s) {
    if (s->map != NULL) {
        shard_mapping_remove(s->map);
        munmap(s->map, s->map_size);
    }
    s->map = NULL;
    free(s->owned_tokens);
    s->owned_tokens = NULL;
    free(s->tables);
    s->tables = NULL;
}

static inline int64_t stat_mtime_ns(const struct stat* st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

// 0 while the shard's file is the one opened (same file, size and modification time), else 1 with
// a line naming the shard and what changed in err. A stat, cheap enough to call every batch.
static inline int shard_unchanged(const Shard* s, char* err, size_t err_size) {
    struct stat st;
    char what[160];
    if (stat(s->path, &st) != 0) {
        snprintf(what, sizeof(what), "it can no longer be read: %s", strerror(errno));
    } else if ((uint64_t)st.st_dev != s->dev || (uint64_t)st.st_ino != s->ino) {
        snprintf(what, sizeof(what), "another file took its name");
    } else if ((uint64_t)st.st_size != s->size) {
        snprintf(what, sizeof(what), "its size went from %llu to %llu bytes", (unsigned long long)s->size,
                 (unsigned long long)st.st_size);
    } else if (stat_mtime_ns(&st) != s->mtime_ns) {
        snprintf(what, sizeof(what), "it was rewritten");
    } else {
        return 0;
    }
    snprintf(err, err_size, "dataset shard %s changed while this run read it (%s): restore the shard and continue with "
             "-y 1, or start a new run on the new data", s->path, what);
    return 1;
}

// A tokenizer's name as headers hold it (shards, checkpoints): NUL-terminated (the caller checks),
// not empty, printable ASCII, so the messages that quote it stay one line
static inline int tokenizer_name_printable(const char* name) {
    int printable = name[0] != '\0';
    for (const char* p = name; *p != '\0'; p++) { printable &= *p >= 0x20 && *p < 0x7f; }
    return printable;
}

// An offset table of n + 1 entries into a section of `total` items: the first entry that breaks it
// (table[0] not 0, an entry below the one before or past total, table[n] not total), OFFSETS_OK
// when none does. Every entry is checked before any is used, so no read goes past the section.
#define OFFSETS_OK UINT64_MAX
static inline uint64_t offsets_bad_at(const uint64_t* table, uint64_t n, uint64_t total) {
    if (table[0] != 0) { return 0; }
    for (uint64_t k = 1; k <= n; k++) {
        if (table[k] < table[k - 1] || table[k] > total) { return k; }
    }
    return table[n] == total ? OFFSETS_OK : n;
}

// Opens and checks a shard of version 1 or 2: every size against the file, every index in range,
// every token id in its vocabulary, every state and action value finite, the statistics those of
// the values. Returns 0, or 1 with the reason in err and nothing left open.
static inline int shard_open_checked(Shard* s, const char* file, char* err, size_t err_size) {
    char said[VLA_SAID_BYTES];  // the path as messages quote it (path_said)
    const char* path = path_said(file, said);
    memset(s, 0, sizeof(*s));
#define SHARD_REJECT_(...) do { snprintf(err, err_size, __VA_ARGS__); shard_close(s); return 1; } while (0)
    if (snprintf(s->path, sizeof(s->path), "%s", file) >= (int)sizeof(s->path)) {
        SHARD_REJECT_("dataset path %s is longer than %d bytes: use a shorter path", path, VLA_PATH_MAX - 1);
    }
    int fd = open(file, O_RDONLY);
    if (fd < 0) { SHARD_REJECT_("cannot open dataset shard %s: %s: check the -i path", path, strerror(errno)); }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        SHARD_REJECT_("dataset shard %s is not a regular file (%s): pass shard files or folders of them with -i", path,
                      e != 0 ? strerror(e) : "a device, pipe or socket");
    }
    uint64_t len = (uint64_t)st.st_size;
    if (len < SHARD_HEADER_V1) {
        close(fd);
        SHARD_REJECT_("%s: %llu bytes is shorter than a shard header (256): the file is truncated, regenerate it",
                      path, (unsigned long long)len);
    }
    s->map = (uint8_t*)mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        SHARD_REJECT_("%s: mmap failed: %s", path, strerror(map_errno));
    }
    s->map_size = len;
    shard_mapping_add(s->map, len, file);
    s->dev = (uint64_t)st.st_dev; s->ino = (uint64_t)st.st_ino; s->size = len; s->mtime_ns = stat_mtime_ns(&st);
    ShardHeader* h = &s->h;
    memcpy(h, s->map, offsetof(ShardHeader, n_tokens));  // version 1's fields; the rest stays zero for now
    if (h->magic == 0x43414C56u) {  // CKPT_MAGIC, "VLAC" (checkpoint.h)
        SHARD_REJECT_(
            "%s is a train_vla checkpoint, not a dataset shard: pass shards with -i (a checkpoint to start from "
            "goes to --init)",
            path);
    }
    if (h->magic != SHARD_MAGIC) {
        SHARD_REJECT_(
            "%s: bad magic 0x%08x (want 0x%08x): not a train_vla dataset shard; convert it with the tools in data/",
            path, h->magic, SHARD_MAGIC);
    }
    if (h->version != 1 && h->version != SHARD_VERSION) {
        SHARD_REJECT_(
            "%s: shard version %u, this build reads versions 1 and %u: regenerate the shard with this version's "
            "data/ tools",
            path, h->version, SHARD_VERSION);
    }
    if (h->version != 1) {
        if (len < sizeof(ShardHeader)) {
            SHARD_REJECT_("%s: %llu bytes is shorter than a version-2 shard header (512): the file is truncated, "
                          "regenerate it", path, (unsigned long long)len);
        }
        memcpy(h, s->map, sizeof(ShardHeader));
    }
    if (h->n_cam < 1 || h->n_cam > VLA_MAX_CAM || (h->version == 1 && (h->img < 1 || h->img > VLA_MAX_IMG)) ||
        h->state_dim < 1 || h->state_dim > VLA_MAX_DIM || h->action_dim < 1 || h->action_dim > VLA_MAX_DIM ||
        h->n_frames < 1 || h->n_frames > UINT32_MAX || h->n_episodes < 1 || h->n_episodes > h->n_frames ||
        h->n_tasks < 1 || h->n_tasks > UINT32_MAX) {
        SHARD_REJECT_(
            "%s: header sizes out of range (n_cam %u, img %u, state %u, action %u, frames %llu, episodes %llu, "
            "tasks %llu): the file is corrupt, regenerate it",
            path, h->n_cam, h->img, h->state_dim, h->action_dim, (unsigned long long)h->n_frames,
            (unsigned long long)h->n_episodes, (unsigned long long)h->n_tasks);
    }
    if (h->version == 1) {  // the same view as version 2: its cameras, byte tokens (made below)
        for (uint32_t k = 0; k < h->n_cam; k++) { h->cam_height[k] = h->cam_width[k] = h->img; }
        snprintf(h->tokenizer, sizeof(h->tokenizer), "%s", SHARD_TOKENIZER_BYTES);
        h->vocab = VLA_TEXT_VOCAB;
        h->n_tokens = h->task_bytes;
    } else {
        for (int k = 0; k < VLA_MAX_CAM; k++) {
            uint32_t ch = h->cam_height[k], cw = h->cam_width[k];
            int inside = k < (int)h->n_cam;
            if (inside && (ch < 1 || ch > VLA_MAX_IMG || cw < 1 || cw > VLA_MAX_IMG)) {
                SHARD_REJECT_("%s: camera %d is %ux%u pixels (height x width), outside 1 to %d: the file is corrupt, "
                              "regenerate it", path, k, ch, cw, VLA_MAX_IMG);
            }
            if (!inside && (ch != 0 || cw != 0)) {
                SHARD_REJECT_("%s: camera %d has a size (%ux%u) but the shard has %u camera(s): the file is corrupt, "
                              "regenerate it", path, k, ch, cw, h->n_cam);
            }
        }
        Cameras cams = shard_cameras(h);
        if (h->img != cameras_square_side(&cams)) {
            char sizes[256];
            SHARD_REJECT_(
                "%s: img %u disagrees with the camera sizes (%s, height x width; img is their side when all are "
                "square and equal, else 0): the file is corrupt, regenerate it",
                path, h->img, cameras_describe(&cams, sizes, sizeof(sizes)));
        }
        if (memchr(h->tokenizer, '\0', sizeof(h->tokenizer)) == NULL) {
            SHARD_REJECT_("%s: the tokenizer name is not NUL-terminated within its %d bytes: the file is corrupt, "
                          "regenerate it", path, (int)sizeof(h->tokenizer));
        }
        if (!tokenizer_name_printable(h->tokenizer)) {
            SHARD_REJECT_("%s: the tokenizer name is empty or not printable ASCII: the file is corrupt, regenerate it",
                          path);
        }
        if (h->vocab < 1 || h->vocab > SHARD_MAX_VOCAB) {
            SHARD_REJECT_(
                "%s: vocabulary size %u of tokenizer %s is outside 1 to %u: the file is corrupt, regenerate it", path,
                h->vocab, h->tokenizer, SHARD_MAX_VOCAB);
        }
        if (strcmp(h->tokenizer, SHARD_TOKENIZER_BYTES) == 0 && h->vocab != VLA_TEXT_VOCAB) {
            SHARD_REJECT_("%s: tokenizer \"bytes\" with a vocabulary of %u, not %d: the file is corrupt, regenerate it",
                          path, h->vocab, VLA_TEXT_VOCAB);
        }
        if (h->n_tokens > len / 4) {
            SHARD_REJECT_("%s: %llu tokens cannot fit in the %llu-byte file: the file is corrupt, regenerate it", path,
                          (unsigned long long)h->n_tokens, (unsigned long long)len);
        }
    }
    if (h->file_size != len) {
        SHARD_REJECT_(
            "%s: header says %llu bytes but the file has %llu: the file is truncated or padded, regenerate it", path,
            (unsigned long long)h->file_size, (unsigned long long)len);
    }
    // every section where the writers put it: in order, each at the first 64-byte boundary after the
    // one before, the last ending the file. So sizes computed from the header (the cameras') are the
    // sizes of the sections in the file.
    uint64_t sizes[SHARD_SECTIONS], *off_fields[SHARD_SECTIONS], offs[SHARD_SECTIONS];
    shard_section_sizes(h, file, sizes);  // the counts are bounded, so none of these products overflows
    shard_section_offsets(h, off_fields);
    uint64_t end = shard_header_bytes(h);
    for (int i = 0; i < shard_n_sections(h); i++) {
        offs[i] = *off_fields[i];
        const char* name = SHARD_SECTION_NAMES[i];
        if (offs[i] % SHARD_ALIGN != 0) {
            SHARD_REJECT_("%s: section %s starts at offset %llu, not a multiple of %d as the format requires: the file "
                          "is corrupt, regenerate it", path, name, (unsigned long long)offs[i], SHARD_ALIGN);
        }
        uint64_t next;
        if (offs[i] < shard_header_bytes(h) || __builtin_add_overflow(offs[i], sizes[i], &next) || next > len) {
            SHARD_REJECT_(
                "%s: section %s (offset %llu, %llu bytes) does not fit in the %llu-byte file: the sizes disagree "
                "with the file length, regenerate it",
                path, name, (unsigned long long)offs[i], (unsigned long long)sizes[i], (unsigned long long)len);
        }
        if (offs[i] != align_up(end, SHARD_ALIGN)) {
            if (i == 1) {  // the images section's size is the cameras'
                Cameras cams = shard_cameras(h);
                char sizes_text[256];
                SHARD_REJECT_(
                    "%s: the camera sizes (%s, height x width) make %llu frames %llu bytes of images, ending at "
                    "offset %llu, but the next section starts at %llu: the camera sizes disagree with the "
                    "file; it is corrupt, regenerate it",
                    path, cameras_describe(&cams, sizes_text, sizeof(sizes_text)), (unsigned long long)h->n_frames,
                    (unsigned long long)sizes[0], (unsigned long long)end, (unsigned long long)offs[i]);
            }
            SHARD_REJECT_(
                "%s: section %s starts at offset %llu, but what comes before it ends at %llu (next boundary "
                "%llu): the header's sizes disagree with the layout; the file is corrupt, regenerate it",
                path, name, (unsigned long long)offs[i], (unsigned long long)end,
                (unsigned long long)align_up(end, SHARD_ALIGN));
        }
        end = next;
    }
    if (end != len) {
        SHARD_REJECT_(
            "%s: the last section ends at offset %llu but the file has %llu bytes: the header's sizes disagree "
            "with the layout; the file is corrupt, regenerate it",
            path, (unsigned long long)end, (unsigned long long)len);
    }
    s->images = s->map + h->off_images;
    s->state = (const float*)(s->map + h->off_state);
    s->action = (const float*)(s->map + h->off_action);
    s->task_text = s->map + h->off_task_text;
    s->stats = (const float*)(s->map + h->off_stats);
    // the index tables copied, then checked: what is checked is what is read (sections 3, 4, 5,
    // 8, 9, each a multiple of 8 bytes once aligned)
    const int copied[5] = {3, 4, 5, 8, 9};
    uint64_t table_bytes = 0, at = 0;
    for (int k = 0; k < 5; k++) { table_bytes += align_up(sizes[copied[k]], 8); }
    s->tables = mallocCheck(table_bytes);
    void* table[SHARD_SECTIONS] = {NULL};
    for (int k = 0; k < 5 && k < (h->version == 1 ? 3 : 5); k++) {
        table[copied[k]] = (uint8_t*)s->tables + at;
        memcpy(table[copied[k]], s->map + offs[copied[k]], sizes[copied[k]]);
        at += align_up(sizes[copied[k]], 8);
    }
    s->frame_episode = (const uint32_t*)table[3];
    s->episodes = (const ShardEpisode*)table[4];
    s->task_offsets = (const uint64_t*)table[5];
    if (h->version != 1) {
        s->token_offsets = (const uint64_t*)table[8];
        s->tokens = (const int32_t*)table[9];
    }
    // the tables that index into other sections: every index in range
    for (uint64_t e = 0; e < h->n_episodes; e++) {
        const ShardEpisode* ep = &s->episodes[e];
        if (ep->length == 0 || ep->first_frame >= h->n_frames || ep->length > h->n_frames - ep->first_frame ||
            ep->task >= h->n_tasks) {
            SHARD_REJECT_(
                "%s: episode %llu (first frame %llu, length %u, task %u) is out of range: the file is corrupt, "
                "regenerate it",
                path, (unsigned long long)e, (unsigned long long)ep->first_frame, ep->length, ep->task);
        }
        for (uint64_t f = ep->first_frame; f < ep->first_frame + ep->length; f++) {
            if (s->frame_episode[f] != e) {
                SHARD_REJECT_("%s: frame %llu belongs to episode %u but episode %llu claims it: the file is corrupt, "
                              "regenerate it", path, (unsigned long long)f, s->frame_episode[f], (unsigned long long)e);
            }
        }
    }
    for (uint64_t f = 0; f < h->n_frames; f++) {
        if (s->frame_episode[f] >= h->n_episodes) {
            SHARD_REJECT_("%s: frame %llu names episode %u of %llu: the file is corrupt, regenerate it",
                          path, (unsigned long long)f, s->frame_episode[f], (unsigned long long)h->n_episodes);
        }
    }
    uint64_t bad_at = offsets_bad_at(s->task_offsets, h->n_tasks, h->task_bytes);
    if (bad_at != OFFSETS_OK) {
        SHARD_REJECT_("%s: task offset %llu (%llu) breaks the table: offsets must rise from 0 to the %llu bytes of "
                      "task_text: the file is corrupt, regenerate it", path, (unsigned long long)bad_at,
                      (unsigned long long)s->task_offsets[bad_at], (unsigned long long)h->task_bytes);
    }
    if (h->version == 1) {  // byte tokens of the task text: the one copy a version-1 shard needs
        s->owned_tokens = (int32_t*)mallocCheck((h->task_bytes > 0 ? h->task_bytes : 1) * sizeof(int32_t));
        tokens_from_bytes(s->owned_tokens, s->task_text, h->task_bytes);
        s->token_offsets = s->task_offsets;
        s->tokens = s->owned_tokens;
    }
    // the token ids: a table that spans them, every id in the vocabulary, "bytes" ids the text's bytes
    bad_at = offsets_bad_at(s->token_offsets, h->n_tasks, h->n_tokens);
    if (bad_at != OFFSETS_OK) {
        SHARD_REJECT_("%s: token offset %llu (%llu) breaks the table: offsets must rise from 0 to the %llu tokens: the "
                      "file is corrupt, regenerate it", path, (unsigned long long)bad_at,
                      (unsigned long long)s->token_offsets[bad_at], (unsigned long long)h->n_tokens);
    }
    int bytes = strcmp(h->tokenizer, SHARD_TOKENIZER_BYTES) == 0;
    for (uint64_t k = 0; k < h->n_tasks; k++) {
        uint64_t t0 = s->token_offsets[k], t1 = s->token_offsets[k + 1];
        for (uint64_t t = t0; t < t1; t++) {
            if (s->tokens[t] < 0 || (uint32_t)s->tokens[t] >= h->vocab) {
                SHARD_REJECT_(
                    "%s: task %llu has token id %d, outside the vocabulary [0, %u) of tokenizer %s: the file is "
                    "corrupt, regenerate it",
                    path, (unsigned long long)k, s->tokens[t], h->vocab, h->tokenizer);
            }
        }
        uint64_t b0 = s->task_offsets[k], n_text = s->task_offsets[k + 1] - b0;
        int same = n_text == t1 - t0;
        for (uint64_t t = 0; bytes && same && t < n_text; t++) {
            same = s->tokens[t0 + t] == (int32_t)s->task_text[b0 + t];
        }
        if (bytes && !same) {
            SHARD_REJECT_("%s: the tokens of task %llu are not the bytes of its text, as tokenizer \"bytes\" says: the "
                          "file is corrupt, regenerate it", path, (unsigned long long)k);
        }
    }
    // the values the model reads: a NaN or Inf here would end training as a non-finite loss
    const float* values[2] = {s->state, s->action};
    const uint32_t dims[2] = {h->state_dim, h->action_dim};
    for (int which = 0; which < 2; which++) {
        for (uint64_t i = 0; i < h->n_frames * dims[which]; i++) {
            float x = values[which][i];
            if (!isfinite(x)) {
                SHARD_REJECT_(
                    "%s: frame %llu, %s column %llu is %s: the data is corrupt; fix or drop that episode and "
                    "convert again",
                    path, (unsigned long long)(i / dims[which]), which == 0 ? "state" : "action",
                    (unsigned long long)(i % dims[which]),
                    isnan(x) ? "NaN"
                    : x > 0  ? "+Inf"
                             : "-Inf");
            }
        }
    }
    // The statistics against the frames they describe: every writer stores the mean and population
    // std of the shard's own frames, so they agree up to float rounding. The bounds catch what
    // would change training (a mean 10 stds off shifts every normalized value by 10; a std 10 times
    // too large or too small scales them by 10) and leave room for any writer's rounding. A shard
    // that passes pools exactly (dataset_open), so a dataset of such shards has statistics that
    // describe its pooled frames. Non-finite or negative stored values are dataset_open's to name.
    const float* stored[2] = {s->stats, s->stats + 2 * h->state_dim};
    for (int which = 0; which < 2; which++) {
        uint32_t D = dims[which];
        for (uint32_t d = 0; d < D; d++) {
            double sum = 0.0, sq = 0.0;
            for (uint64_t f = 0; f < h->n_frames; f++) { sum += values[which][f * D + d]; }
            double mean = sum / (double)h->n_frames;
            for (uint64_t f = 0; f < h->n_frames; f++) {
                double dx = values[which][f * D + d] - mean;
                sq += dx * dx;
            }
            double sd = sqrt(sq / (double)h->n_frames), m = stored[which][d], msd = stored[which][D + d];
            if (!isfinite(m) || !isfinite(msd) || msd < 0.0) { continue; }
            double scale = sd > msd ? sd : msd;
            const char* column = which == 0 ? "state" : "action";
            if (fabs(m - mean) > 10.0 * scale + 1e-5 * fabs(mean) + 1e-6) {
                SHARD_REJECT_(
                    "%s: %s column %u: the stored mean %.6g is %.3g stds from the frames' mean %.6g (std %.6g): "
                    "the statistics do not describe the data; regenerate the shard",
                    path, column, d, m, fabs(m - mean) / (scale > 0.0 ? scale : 1.0), mean, sd);
            }
            int varying = sd >= VLA_MIN_STD && sd >= 1e-6 * fabs(mean);  // above the rounding of the values
            if (varying && (msd < 0.1 * sd || msd > 10.0 * sd)) {
                SHARD_REJECT_(
                    "%s: %s column %u: the stored std %.6g is %.3g times the frames' std %.6g: the statistics "
                    "do not describe the data; regenerate the shard",
                    path, column, d, msd, msd / sd, sd);
            }
        }
    }
    return 0;
#undef SHARD_REJECT_
}

static inline void shard_open(Shard* s, const char* path) {
    char err[VLA_PATH_MAX + 512];
    if (shard_open_checked(s, path, err, sizeof(err)) != 0) { vla_fail("%s", err); }
}

#endif  // VLA_SHARDS_H
