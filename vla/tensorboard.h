/*
vla/tensorboard.h: TensorBoard's event file, written from C: <output>/events.out.tfevents.train_vla
holds the run's scalars by step (the trainers' train/... curves, evaluation's eval/...), for
`tensorboard --logdir out/` and for WandB (`wandb sync --sync-tensorboard out/<run>`). On resume,
records of steps past the checkpoint are dropped, as log.jsonl's lines are, so every step is in
the file once. Needs common.h, atomic_file.h and run_folder.h.

The file is a sequence of records, each framed as TensorFlow's TFRecord:
    uint64 length | uint32 masked CRC-32C of those 8 bytes | length bytes | uint32 masked CRC-32C of them
little-endian, where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Each record is one Event
protocol-buffer message, written by hand here (event.proto and summary.proto's field numbers):
    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }
The first record names the format (file_version "brain.Event:2"); then one Event per scalar.
*/
#ifndef VLA_TENSORBOARD_H
#define VLA_TENSORBOARD_H

#include "common.h"
#include "atomic_file.h"
#include "run_folder.h"

#define TB_FILE_NAME "events.out.tfevents.train_vla"

// ----------------------------------------------------------------------------
// CRC-32C (Castagnoli: the reflected polynomial 0x82f63b78), byte by byte from a table

static inline uint32_t crc32c(const void* data, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) { c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1; }
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char* p = (const unsigned char*)data;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) { crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8); }
    return crc ^ 0xffffffffu;
}

static inline uint32_t tb_masked_crc(const void* data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ----------------------------------------------------------------------------
// protocol-buffer encoding: a growing byte buffer, varints, and the three wire types used here

typedef struct {
    unsigned char* p;
    size_t n, cap;
} TbBytes;

static inline void tb_put(TbBytes* b, const void* data, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n) + 64;
        b->p = (unsigned char*)realloc(b->p, b->cap);
        if (b->p == NULL) { vla_fail("out of memory encoding a TensorBoard event"); }
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static inline void tb_put_varint(TbBytes* b, uint64_t v) {
    unsigned char out[10];
    int n = 0;
    do {
        out[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v != 0) { out[n] |= 0x80; }
        n++;
    } while (v != 0);
    tb_put(b, out, (size_t)n);
}

static inline void tb_put_key(TbBytes* b, int field, int wire) { tb_put_varint(b, (uint64_t)(field << 3 | wire)); }

static inline void tb_put_bytes(TbBytes* b, int field, const void* data, size_t n) {  // wire type 2
    tb_put_key(b, field, 2);
    tb_put_varint(b, n);
    tb_put(b, data, n);
}

static inline void tb_put_le(TbBytes* b, uint64_t v, int bytes) {  // little-endian, whatever the host
    unsigned char out[8];
    for (int i = 0; i < bytes; i++) { out[i] = (unsigned char)(v >> (8 * i)); }
    tb_put(b, out, (size_t)bytes);
}

static inline void tb_put_double(TbBytes* b, int field, double v) {  // wire type 1 (fixed64)
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    tb_put_key(b, field, 1);
    tb_put_le(b, bits, 8);
}

static inline void tb_put_float(TbBytes* b, int field, float v) {  // wire type 5 (fixed32)
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    tb_put_key(b, field, 5);
    tb_put_le(b, bits, 4);
}

static inline size_t tb_varint_size(uint64_t v) {
    size_t n = 1;
    while (v >>= 7) { n++; }
    return n;
}

// An Event: its wall time and step, then the file version or one scalar, summary { value { tag,
// simple_value } }, whose nested lengths are counted first so that each is written in place
static inline void tb_event(TbBytes* ev, double wall_time, int64_t step, const char* file_version, const char* tag,
                            float value) {
    ev->n = 0;
    tb_put_double(ev, 1, wall_time);
    tb_put_key(ev, 2, 0);
    tb_put_varint(ev, (uint64_t)step);
    if (file_version != NULL) { tb_put_bytes(ev, 3, file_version, strlen(file_version)); }
    if (tag != NULL) {
        size_t t = strlen(tag);
        size_t value_bytes = 1 + tb_varint_size(t) + t + 1 + 4;  // the tag (key, length, text), the float (key, 4)
        tb_put_key(ev, 5, 2);
        tb_put_varint(ev, 1 + tb_varint_size(value_bytes) + value_bytes);  // the Summary: its one Value
        tb_put_key(ev, 1, 2);
        tb_put_varint(ev, value_bytes);
        tb_put_bytes(ev, 1, tag, t);
        tb_put_float(ev, 2, value);
    }
}

// The record framing of `data` (n bytes), appended to `out`
static inline void tb_frame(TbBytes* out, const unsigned char* data, size_t n) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++) { len[i] = (unsigned char)((uint64_t)n >> (8 * i)); }
    tb_put(out, len, 8);
    tb_put_le(out, tb_masked_crc(len, 8), 4);
    tb_put(out, data, n);
    tb_put_le(out, tb_masked_crc(data, n), 4);
}

// ----------------------------------------------------------------------------
// decoding, for the resume: the records of a file and each Event's step

static inline uint64_t tb_get_le(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) { v |= (uint64_t)p[i] << (8 * i); }
    return v;
}

// Reads a varint at p[*at] (end: the message's end); 0 if it runs past the end or past 10 bytes
static inline int tb_get_varint(const unsigned char* p, size_t end, size_t* at, uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 70 && *at < end; shift += 7) {
        unsigned char c = p[(*at)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if ((c & 0x80) == 0) { return 1; }
    }
    return 0;
}

// An Event's step (0 where it has none, as protocol buffers default it); 0 if it does not parse
static inline int tb_event_step(const unsigned char* p, size_t n, int64_t* step) {
    size_t at = 0;
    *step = 0;
    while (at < n) {
        uint64_t key, v;
        if (!tb_get_varint(p, n, &at, &key)) { return 0; }
        int wire = (int)(key & 7);
        if (wire == 0) {
            if (!tb_get_varint(p, n, &at, &v)) { return 0; }
            if ((key >> 3) == 2) { *step = (int64_t)v; }
        } else if (wire == 1 || wire == 5) {
            size_t size = wire == 1 ? 8 : 4;
            if (n - at < size) { return 0; }
            at += size;
        } else if (wire == 2) {
            if (!tb_get_varint(p, n, &at, &v) || v > n - at) { return 0; }
            at += (size_t)v;
        } else {
            return 0;
        }
    }
    return 1;
}

// ----------------------------------------------------------------------------
// the writer: rank 0's, beside log.jsonl

typedef struct {
    FILE* f;  // NULL: not open (other ranks)
    char path[VLA_PATH_MAX];
    TbBytes event, record;  // reused buffers
} TbWriter;

// One Event (tb_event's arguments) framed and appended to the file
static inline void tb_write(TbWriter* tb, int64_t step, const char* file_version, const char* tag, float value) {
    tb_event(&tb->event, wall_seconds(), step, file_version, tag, value);
    tb->record.n = 0;
    tb_frame(&tb->record, tb->event.p, tb->event.n);
    fwrite(tb->record.p, 1, tb->record.n, tb->f);
}

// Opens <dir>/events.out.tfevents.train_vla for a run that continues after step `start` (0: from
// scratch). Records of later steps are dropped, as are a cut last record (a run killed while
// writing it) and anything after a record that fails its CRC; each kind dropped is said, and the
// file is then rewritten atomically. A new file starts with the file-version record.
static inline void tb_open(TbWriter* tb, const char* dir, int start) {
    memset(tb, 0, sizeof(*tb));
    snprintf(tb->path, sizeof(tb->path), "%s/%s", dir, TB_FILE_NAME);
    run_folder_check(dir, TB_FILE_NAME);
    FILE* old = fopen(tb->path, "rb");
    int fresh = old == NULL;
    if (old != NULL) {
        TbBytes all = {NULL, 0, 0}, kept = {NULL, 0, 0};
        unsigned char chunk[1 << 16];
        size_t got;
        while ((got = fread(chunk, 1, sizeof(chunk), old)) > 0) { tb_put(&all, chunk, got); }
        int read_error = ferror(old);
        fclose(old);
        if (read_error) { vla_fail("reading %s failed: check the disk, or move the file aside", tb->path); }
        size_t at = 0;
        int later = 0, cut = 0, bad = 0;
        while (at < all.n) {
            if (all.n - at < 12) { cut = 1; break; }
            uint64_t n = tb_get_le(all.p + at, 8);
            if ((uint32_t)tb_get_le(all.p + at + 8, 4) != tb_masked_crc(all.p + at, 8)) { bad = 1; break; }
            if (n > all.n - at - 12 || all.n - at - 12 - n < 4) { cut = 1; break; }
            const unsigned char* data = all.p + at + 12;
            int64_t step;
            if ((uint32_t)tb_get_le(data + n, 4) != tb_masked_crc(data, (size_t)n) ||
                !tb_event_step(data, (size_t)n, &step)) {
                bad = 1;
                break;
            }
            size_t size = (size_t)n + 16;
            if (step > start) { later++; }
            else { tb_put(&kept, all.p + at, size); }
            at += size;
        }
        if (later > 0 || cut || bad) {
            AtomicFile out;
            atomic_file_open(&out, tb->path, kept.n);
            if (kept.n > 0) { atomic_file_write(&out, kept.p, 1, kept.n); }
            atomic_file_commit(&out);
            if (later > 0) {
                printf("%s: dropped %d record(s) past step %d, where this run continues: it writes those steps again\n",
                       tb->path, later, start);
            }
            if (cut) { printf("%s: dropped a cut last record, left by a run that was killed\n", tb->path); }
            if (bad) {
                printf("%s: dropped the records from byte %zu on: one fails its CRC-32C (TensorBoard stops there too)\n",
                       tb->path, at);
            }
        }
        fresh = kept.n == 0;
        free(all.p);
        free(kept.p);
    }
    tb->f = fopenCheck(tb->path, "ab");
    if (fresh) { tb_write(tb, 0, "brain.Event:2", NULL, 0.0f); }
}

// Appends one scalar (tag, value) of `step`; NaN and infinities are written as they are, which
// TensorBoard shows. The logger's flush (run_file_flush) makes them visible.
static inline void tb_scalar(TbWriter* tb, const char* tag, int step, float value) {
    if (tb->f != NULL) { tb_write(tb, step, NULL, tag, value); }
}

static inline void tb_close(TbWriter* tb) {
    if (tb->f != NULL) { fclose(tb->f); }
    free(tb->event.p);
    free(tb->record.p);
    tb->f = NULL;
    tb->event.p = tb->record.p = NULL;
}

#endif  // VLA_TENSORBOARD_H
