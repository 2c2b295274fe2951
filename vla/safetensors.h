/*
vla/safetensors.h: LeRobot's model.safetensors, mapped and checked (its JSON header parsed by a
small parser of its own, every tensor's extent against the file), and its weights read by name
into the flat parameter buffer through the table's LeRobot names. Needs config.h.
*/
#ifndef VLA_SAFETENSORS_H
#define VLA_SAFETENSORS_H

#include "common.h"
#include "config.h"
#include <sys/mman.h>

// ----------------------------------------------------------------------------
// safetensors: what LeRobot's model.safetensors is. An 8-byte little-endian header length, a
// JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data. The reader maps the file, parses that header with a small parser of its own,
// and checks every tensor's extent against the file before handing out a byte.

enum { ST_F32 = 0, ST_BF16 = 1, ST_F16 = 2, ST_F64 = 3, ST_I64 = 4, ST_I32 = 5, ST_U8 = 6, ST_BOOL = 7 };
static const char* const ST_DTYPE_NAMES[] = {"F32", "BF16", "F16", "F64", "I64", "I32", "U8", "BOOL"};
static const int ST_DTYPE_BYTES[] = {4, 2, 2, 8, 8, 4, 1, 1};
#define ST_MAX_DIMS 8
#define ST_MAX_HEADER 100000000u  // the format's own limit on the header, 100 MB

typedef struct {
    char name[256];
    int dtype, ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;  // into the data section
} SafeTensorInfo;

typedef struct {
    uint8_t* map;
    size_t size;
    const uint8_t* data;  // the data section
    uint64_t data_size;
    int n;
    SafeTensorInfo* tensors;
} SafeTensors;

typedef struct { const char* p; const char* end; } StJson;

static inline void st_skip_space(StJson* j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) { j->p++; }
}
static inline int st_expect(StJson* j, char ch) {
    st_skip_space(j);
    if (j->p >= j->end || *j->p != ch) { return 1; }
    j->p++;
    return 0;
}
// A JSON string into out (escapes other than \" \\ \/ refused: tensor names have none). Control
// characters are refused, as JSON refuses them: a name holding a newline would split the one-line
// error that names it.
static inline int st_string(StJson* j, char* out, size_t size) {
    if (st_expect(j, '"')) { return 1; }
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        char ch = *j->p++;
        if ((unsigned char)ch < 0x20 || ch == 0x7f) { return 1; }
        if (ch == '\\') {
            if (j->p >= j->end || (*j->p != '"' && *j->p != '\\' && *j->p != '/')) { return 1; }
            ch = *j->p++;
        }
        if (n + 1 >= size) { return 1; }
        out[n++] = ch;
    }
    if (j->p >= j->end) { return 1; }
    j->p++;
    out[n] = '\0';
    return 0;
}
static inline int st_uint(StJson* j, uint64_t* v) {
    st_skip_space(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') { return 1; }
    uint64_t x = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (x > (UINT64_MAX - 9) / 10) { return 1; }
        x = x * 10 + (uint64_t)(*j->p++ - '0');
    }
    *v = x;
    return 0;
}
// [u, u, ...] into v (at most max); returns the count, or -1.
static inline int st_uint_array(StJson* j, uint64_t* v, int max) {
    if (st_expect(j, '[')) { return -1; }
    st_skip_space(j);
    int n = 0;
    if (j->p < j->end && *j->p == ']') { j->p++; return 0; }
    for (;;) {
        if (n >= max || st_uint(j, &v[n])) { return -1; }
        n++;
        st_skip_space(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        return st_expect(j, ']') ? -1 : n;
    }
}
// Skips one JSON value of the __metadata__ kind: an object of strings, as the format says.
static inline int st_skip_value(StJson* j) {
    char buf[4096];
    if (st_expect(j, '{')) { return 1; }
    st_skip_space(j);
    if (j->p < j->end && *j->p == '}') { j->p++; return 0; }
    for (;;) {
        if (st_string(j, buf, sizeof(buf)) || st_expect(j, ':') || st_string(j, buf, sizeof(buf))) { return 1; }
        st_skip_space(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        return st_expect(j, '}');
    }
}

static inline int st_compare_names(const void* a, const void* b) {
    return strcmp((*(const SafeTensorInfo* const*)a)->name, (*(const SafeTensorInfo* const*)b)->name);
}
// by where they start, then where they end (empty tensors share a start with the next)
static inline int st_compare_extents(const void* a, const void* b) {
    const SafeTensorInfo *x = *(const SafeTensorInfo* const*)a, *y = *(const SafeTensorInfo* const*)b;
    if (x->begin != y->begin) { return x->begin < y->begin ? -1 : 1; }
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}

static inline void safetensors_close(SafeTensors* st) {
    if (st->map != NULL && st->map != MAP_FAILED) { munmap(st->map, st->size); }
    free(st->tensors);
    memset(st, 0, sizeof(*st));
}

// Returns 0, or 1 with a one-line reason in err (and nothing left open).
static inline int safetensors_open(SafeTensors* st, const char* file, char* err, size_t err_size) {
    char said[VLA_SAID_BYTES];  // the path as messages quote it (path_said)
    const char* path = path_said(file, said);
    memset(st, 0, sizeof(*st));
#define ST_REJECT_(...) do { snprintf(err, err_size, __VA_ARGS__); safetensors_close(st); return 1; } while (0)
    int fd = open(file, O_RDONLY);
    if (fd < 0) { snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno)); return 1; }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
        close(fd);
        snprintf(err, err_size, "%s is not a safetensors file (not a regular file of at least 8 bytes)", path);
        return 1;
    }
    st->size = (size_t)sb.st_size;
    st->map = (uint8_t*)mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (st->map == MAP_FAILED) { st->map = NULL; ST_REJECT_("cannot map %s: %s", path, strerror(errno)); }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) { header_len = (header_len << 8) | st->map[i]; }
    if (header_len > ST_MAX_HEADER || header_len > st->size - 8) {
        ST_REJECT_("%s: header length %llu does not fit the file of %zu bytes (truncated or not safetensors)", path,
                   (unsigned long long)header_len, st->size);
    }
    st->data = st->map + 8 + header_len;
    st->data_size = st->size - 8 - header_len;
    StJson j = {(const char*)st->map + 8, (const char*)st->map + 8 + header_len};
    int cap = 0, have_metadata = 0;
    if (st_expect(&j, '{')) { ST_REJECT_("%s: the header is not a JSON object", path); }
    st_skip_space(&j);
    int empty = j.p < j.end && *j.p == '}';
    if (empty) { j.p++; }
    while (!empty) {
        char name[256];
        if (st_string(&j, name, sizeof(name)) || st_expect(&j, ':')) {
            ST_REJECT_("%s: a malformed header entry", path);
        }
        if (strcmp(name, "__metadata__") == 0) {
            if (have_metadata++) {
                ST_REJECT_("%s: __metadata__ is given twice: the file is corrupt, write it again", path);
            }
            if (st_skip_value(&j)) { ST_REJECT_("%s: a malformed __metadata__", path); }
        } else {
            if (st->n == cap) {
                cap = cap == 0 ? 64 : 2 * cap;
                SafeTensorInfo* grown = (SafeTensorInfo*)realloc(st->tensors, (size_t)cap * sizeof(SafeTensorInfo));
                if (grown == NULL) { ST_REJECT_("%s: out of memory for the header", path); }
                st->tensors = grown;
            }
            SafeTensorInfo* t = &st->tensors[st->n];
            memset(t, 0, sizeof(*t));
            snprintf(t->name, sizeof(t->name), "%s", name);
            int have_dtype = 0, have_shape = 0, have_offsets = 0;
            if (st_expect(&j, '{')) { ST_REJECT_("%s: tensor %s: not an object", path, name); }
            for (;;) {
                char field[64];
                if (st_string(&j, field, sizeof(field)) || st_expect(&j, ':')) {
                    ST_REJECT_("%s: tensor %s: a malformed field", path, name);
                }
                int* seen = strcmp(field, "dtype") == 0 ? &have_dtype : strcmp(field, "shape") == 0 ? &have_shape
                          : strcmp(field, "data_offsets") == 0 ? &have_offsets : NULL;
                if (seen != NULL && *seen) {  // a second value would silently win over the first
                    ST_REJECT_("%s: tensor %s gives its %s twice: the file is corrupt, write it again", path, name,
                               field);
                }
                if (strcmp(field, "dtype") == 0) {
                    char dt[16];
                    if (st_string(&j, dt, sizeof(dt))) { ST_REJECT_("%s: tensor %s: a malformed dtype", path, name); }
                    t->dtype = -1;
                    for (int k = 0; k < (int)(sizeof(ST_DTYPE_BYTES) / sizeof(int)); k++) {
                        if (strcmp(dt, ST_DTYPE_NAMES[k]) == 0) { t->dtype = k; }
                    }
                    if (t->dtype < 0) {
                        ST_REJECT_("%s: tensor %s has dtype %s, which train_vla does not read", path, name, dt);
                    }
                    have_dtype = 1;
                } else if (strcmp(field, "shape") == 0) {
                    uint64_t dims[ST_MAX_DIMS];
                    int nd = st_uint_array(&j, dims, ST_MAX_DIMS);
                    if (nd < 0) { ST_REJECT_("%s: tensor %s: a malformed shape", path, name); }
                    t->ndim = nd;
                    t->numel = 1;
                    for (int k = 0; k < nd; k++) {
                        if (dims[k] > (1ULL << 40) || __builtin_mul_overflow(t->numel, dims[k], &t->numel)) {
                            ST_REJECT_("%s: tensor %s: its shape overflows", path, name);
                        }
                        t->shape[k] = (int64_t)dims[k];
                    }
                    have_shape = 1;
                } else if (strcmp(field, "data_offsets") == 0) {
                    uint64_t off[2];
                    if (st_uint_array(&j, off, 2) != 2) {
                        ST_REJECT_("%s: tensor %s: malformed data_offsets", path, name);
                    }
                    t->begin = off[0];
                    t->end = off[1];
                    have_offsets = 1;
                } else {
                    ST_REJECT_("%s: tensor %s: unknown field %s", path, name, field);
                }
                st_skip_space(&j);
                if (j.p < j.end && *j.p == ',') { j.p++; continue; }
                if (st_expect(&j, '}')) { ST_REJECT_("%s: tensor %s: a malformed entry", path, name); }
                break;
            }
            if (!have_dtype || !have_shape || !have_offsets) {
                ST_REJECT_("%s: tensor %s lacks its dtype, shape or data_offsets", path, name);
            }
            uint64_t bytes;
            if (__builtin_mul_overflow(t->numel, (uint64_t)ST_DTYPE_BYTES[t->dtype], &bytes) || t->begin > t->end ||
                t->end > st->data_size || t->end - t->begin != bytes) {
                ST_REJECT_("%s: tensor %s: data_offsets [%llu, %llu) do not hold its %llu bytes within the %llu-byte "
                           "data section (truncated?)", path, name, (unsigned long long)t->begin,
                           (unsigned long long)t->end, (unsigned long long)bytes, (unsigned long long)st->data_size);
            }
            st->n++;
        }
        st_skip_space(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        if (st_expect(&j, '}')) { ST_REJECT_("%s: the header is not a well-formed JSON object", path); }
        break;
    }
    st_skip_space(&j);  // writers pad the header with spaces to 8 bytes; anything else after it is not JSON
    if (j.p != j.end) {
        ST_REJECT_("%s: bytes follow the header's JSON object: the file is corrupt, write it again", path);
    }
    // as the format requires: names unique, and the tensors laid end to end from offset 0 to the
    // end of the file, none overlapping another (two names over the same bytes, or bytes no tensor
    // holds, are not a file any writer of the format makes)
    const SafeTensorInfo** order = (const SafeTensorInfo**)malloc((size_t)(st->n > 0 ? st->n : 1) * sizeof(*order));
    if (order == NULL) { ST_REJECT_("%s: out of memory for the header", path); }
    for (int i = 0; i < st->n; i++) { order[i] = &st->tensors[i]; }
    qsort(order, (size_t)st->n, sizeof(*order), st_compare_names);
    for (int i = 1; i < st->n; i++) {
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            char name[256];
            snprintf(name, sizeof(name), "%s", order[i]->name);
            free(order);
            ST_REJECT_("%s: tensor %s is named twice in the header: the file is corrupt, write it again", path, name);
        }
    }
    qsort(order, (size_t)st->n, sizeof(*order), st_compare_extents);
    uint64_t at = 0;
    for (int i = 0; i <= st->n; i++) {
        uint64_t begin = i < st->n ? order[i]->begin : st->data_size;
        if (begin != at) {
            char what[600];
            if (i == st->n) {
                snprintf(what, sizeof(what), "its tensors end at byte %llu of the %llu-byte data section",
                         (unsigned long long)at, (unsigned long long)st->data_size);
            } else if (i == 0) {
                snprintf(what, sizeof(what), "its first tensor %s starts at byte %llu, not 0", order[0]->name,
                         (unsigned long long)begin);
            } else {
                snprintf(what, sizeof(what), "tensor %s [%llu, %llu) %s tensor %s [%llu, %llu)", order[i]->name,
                         (unsigned long long)order[i]->begin, (unsigned long long)order[i]->end,
                         begin < at ? "overlaps" : "leaves a gap after", order[i - 1]->name,
                         (unsigned long long)order[i - 1]->begin, (unsigned long long)order[i - 1]->end);
            }
            free(order);
            ST_REJECT_("%s: %s: the tensors must lie end to end over the data section: the file is corrupt, write it "
                       "again", path, what);
        }
        if (i < st->n) { at = order[i]->end; }
    }
    free(order);
#undef ST_REJECT_
    return 0;
}

static inline const SafeTensorInfo* safetensors_find(const SafeTensors* st, const char* name) {
    for (int i = 0; i < st->n; i++) {
        if (strcmp(st->tensors[i].name, name) == 0) { return &st->tensors[i]; }
    }
    return NULL;
}

static inline float st_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float mag;
    if (exp == 0) { mag = ldexpf((float)man, -24); }
    else if (exp == 31) { mag = man ? NAN : INFINITY; }
    else { mag = ldexpf((float)(man | 0x400), (int)exp - 25); }
    uint32_t bits;
    memcpy(&bits, &mag, 4);
    bits |= sign;
    memcpy(&mag, &bits, 4);
    return mag;
}

// A floating-point tensor as float32 (bf16 and f16 widened exactly, f64 rounded).
static inline int safetensors_read_f32(const SafeTensors* st, const SafeTensorInfo* t, float* out) {
    const uint8_t* p = st->data + t->begin;
    for (uint64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
            case ST_F32: memcpy(&out[i], p + 4 * i, 4); break;
            case ST_BF16: {
                uint32_t bits = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
                memcpy(&out[i], &bits, 4);
                break;
            }
            case ST_F16: out[i] = st_half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8))); break;
            case ST_F64: {
                double d;
                memcpy(&d, p + 8 * i, 8);
                out[i] = (float)d;
                break;
            }
            default: return 1;
        }
    }
    return 0;
}

// LeRobot's weights into the flat parameter buffer, every tensor of the table by its LeRobot
// name, shape-checked (the flattened shape must match; patch_embedding's (Cv, 3, p, p) is our
// (Cv, 3 p p)). Tensors of the file the table does not hold (lm_head) are ignored here.
static inline int flow_load_safetensors(const SafeTensors* st, const FlowConfig* c, const FlowParamTable* t,
                                        float* params, char* err, size_t err_size) {
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &t->spec[i];
        size_t n_slices = flow_slices(s), per = flow_slice_numel(s);
        for (size_t k = 0; k < n_slices; k++) {
            char name[256];
            if (s->slices == SLICES_NONE) { snprintf(name, sizeof(name), "%s", s->lerobot); }
            else { snprintf(name, sizeof(name), s->lerobot, flow_slice_layer(c, s, (int)k)); }
            const SafeTensorInfo* ti = safetensors_find(st, name);
            if (ti == NULL) { snprintf(err, err_size, "the weights lack %s (for %s)", name, s->name); return 1; }
            int64_t lead = s->slices == SLICES_NONE ? s->shape[0] : s->shape[1];
            if (ti->numel != per || ti->ndim < 1 || ti->shape[0] != lead) {
                snprintf(err, err_size,
                         "%s has %llu values with leading size %lld; this config's %s needs %zu with %lld", name,
                         (unsigned long long)ti->numel, ti->ndim > 0 ? (long long)ti->shape[0] : -1LL, s->name, per,
                         (long long)lead);
                return 1;
            }
            if (safetensors_read_f32(st, ti, params + s->offset + k * per)) {
                snprintf(err, err_size, "%s has dtype %s, not a floating-point type", name, ST_DTYPE_NAMES[ti->dtype]);
                return 1;
            }
        }
    }
    return 0;
}

#endif  // VLA_SAFETENSORS_H
