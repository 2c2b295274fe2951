// make_seeds.c: seeds of the fuzz corpora, written by the project's own writers where it has one,
// small enough (a few to 40 kilobytes) that the fuzzers' mutations land in every section. Into
// SEEDS_DIR/NAME for each harness:
//   checkpoint   version-2 checkpoints of small SmolVLA configs, one per train mode (checkpoint_write)
//   shard        shards of both format versions (shard_write: version 2 with cameras of different
//                and non-square sizes, another tokenizer's ids, token counts odd, even and whole
//                multiples of 8 and 16, a token offset table pointing past the tokens;
//                shard_write_v1: version 1);
//                more come from data/synthetic (dev/fuzz/run_fuzz.sh)
//   shards       2 or 3 of those shards packed into one input as fuzz_shards splits it: shards that
//                agree (pooled statistics), and shards that disagree on cameras, their sizes or tokenizer
//   safetensors  LeRobot's weights of FUZZ_SAFETENSORS_CONFIG in all four float dtypes, and small
//                headers (metadata, integer tensors, shapes past 2^40, a name holding a newline,
//                tensors overlapping, a name twice, a gap)
//   log          log.jsonl files as runs leave them, each behind the step a resume starts from
//   names        folders' worth of file names, canonical checkpoint names and near misses
//   boot         node 0's view of hellos (proven and agreeing, proven and disagreeing, strangers:
//                another token, none, short, another version, random bytes) and a node's of
//                replies (proven, forged)
//   make_seeds SEEDS_DIR
#include "fuzz_util.h"
#include "../../vla/rng.h"
#include "../../vla/config.h"
#include "../../vla/safetensors.h"
#include "../../vla/shards.h"
#include "../../vla/shard_writer.h"
#include "../../vla/run_folder.h"
#include "../../vla/checkpoint.h"
#include "../../vla/bootstrap.h"

// A small shard of `cams` (5 frames in 2 episodes, state 3, action 2, the two instructions `tasks`) at path
static void shard_seed_tasks(const char* path, const Cameras* cams, uint64_t seed, const char* const* tasks) {
    enum { FRAMES = 5, S = 3, A = 2 };
    size_t frame = cameras_frame_bytes(cams);
    uint8_t* images = (uint8_t*)mallocCheck(FRAMES * frame);
    Rng r;
    rng_init(&r, seed, 0);
    for (size_t i = 0; i < FRAMES * frame; i++) { images[i] = (uint8_t)rng_u64(&r); }
    float state[FRAMES * S], action[FRAMES * A], stats[2 * (S + A)];
    for (int i = 0; i < FRAMES * S; i++) { state[i] = (float)rng_uniform(&r); }
    for (int i = 0; i < FRAMES * A; i++) { action[i] = (float)rng_uniform(&r) - 0.5f; }
    shard_compute_stats(FRAMES, state, S, action, A, stats);
    ShardEpisode eps[2] = {{0, 3, 1}, {3, 2, 0}};
    shard_write(path, cams, S, A, FRAMES, images, state, action, 2, eps, 2, tasks, stats);
    free(images);
}

// ... of two instructions of 35 byte tokens in all (an odd count)
static void shard_seed(const char* path, const Cameras* cams, uint64_t seed) {
    static const char* const tasks[] = {"open the drawer", "öffne die Schublade"};
    shard_seed_tasks(path, cams, seed, tasks);
}

static const char* seeds_root;

// SEEDS_DIR/kind/name holding data[0..size)
static void seed_write(const char* kind, const char* name, const void* data, size_t size) {
    char path[VLA_PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", seeds_root, kind);
    make_dir(path);
    snprintf(path, sizeof(path), "%s/%s/%s", seeds_root, kind, name);
    FILE* f = fopenCheck(path, "wb");
    if ((size > 0 && fwrite(data, 1, size, f) != size) || fclose(f) != 0) { vla_fail("cannot write %s", path); }
}

static uint8_t* file_bytes(const char* path, size_t* size) {
    FILE* f = fopenCheck(path, "rb");
    fseeko(f, 0, SEEK_END);
    *size = (size_t)ftello(f);
    fseeko(f, 0, SEEK_SET);
    uint8_t* p = (uint8_t*)mallocCheck(*size > 0 ? *size : 1);
    if (fread(p, 1, *size, f) != *size) { vla_fail("cannot read %s", path); }
    fclose(f);
    return p;
}

// fuzz_shards's input: the count less 2, the sizes of all shards but the last (u32), the shards
static void shards_seed(const char* name, const char* shard_dir, const char* const* files, int n) {
    uint8_t* pack = (uint8_t*)mallocCheck(1 + 4 * (size_t)(n - 1));
    size_t size = 1 + 4 * (size_t)(n - 1);
    pack[0] = (uint8_t)(n - 2);
    for (int k = 0; k < n; k++) {
        char path[VLA_PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", shard_dir, files[k]);
        size_t bytes;
        uint8_t* shard = file_bytes(path, &bytes);
        if (k < n - 1) {
            uint32_t len = (uint32_t)bytes;
            memcpy(pack + 1 + 4 * k, &len, 4);
        }
        pack = (uint8_t*)realloc(pack, size + bytes);
        memcpy(pack + size, shard, bytes);
        size += bytes;
        free(shard);
    }
    seed_write("shards", name, pack, size);
    free(pack);
}

// A safetensors file of the given JSON header (padded with spaces to 8 bytes, as writers pad it) and data
static void safetensors_seed(const char* name, const char* header, const void* data, size_t data_size) {
    size_t len = strlen(header), padded = (len + 7) / 8 * 8, size = 8 + padded + data_size;
    uint8_t* file = (uint8_t*)mallocCheck(size);
    for (int i = 0; i < 8; i++) { file[i] = (uint8_t)((uint64_t)padded >> (8 * i)); }
    memcpy(file + 8, header, len);
    memset(file + 8 + len, ' ', padded - len);
    if (data_size > 0) { memcpy(file + 8 + padded, data, data_size); }
    seed_write("safetensors", name, file, size);
    free(file);
}

// Every tensor of FUZZ_SAFETENSORS_CONFIG's table under its LeRobot name (stacked ones a slice
// per layer), the dtypes taking turns (F32, BF16, F16, F64), and one integer tensor the table
// does not hold
static void safetensors_weights_seed(void) {
    const FlowConfig* c = &FUZZ_SAFETENSORS_CONFIG;
    FlowParamTable t;
    flow_table_build(c, &t);
    float* params = (float*)mallocCheck(t.total * sizeof(float));
    flow_param_init(params, &t, c, 7);
    size_t header_cap = 1 << 16, data_cap = 8 * t.total + 64, hn = 0, dn = 0;
    char* header = (char*)mallocCheck(header_cap);
    uint8_t* data = (uint8_t*)mallocCheck(data_cap);
    hn += (size_t)snprintf(header + hn, header_cap - hn, "{\"__metadata__\":{\"format\":\"pt\"}");
    int turn = 0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &t.spec[i];
        size_t n_slices = flow_slices(s), per = flow_slice_numel(s);
        int64_t lead = s->slices == SLICES_NONE ? s->shape[0] : s->shape[1];
        for (size_t k = 0; k < n_slices; k++, turn++) {
            char name[256];
            if (s->slices == SLICES_NONE) { snprintf(name, sizeof(name), "%s", s->lerobot); }
            else { snprintf(name, sizeof(name), s->lerobot, flow_slice_layer(c, s, (int)k)); }
            int dtype = turn % 4;  // ST_F32, ST_BF16, ST_F16, ST_F64
            const float* x = params + s->offset + k * per;
            size_t begin = dn;
            for (size_t e = 0; e < per; e++) {
                uint32_t bits;
                memcpy(&bits, &x[e], 4);
                if (dtype == ST_F32) { memcpy(data + dn, &x[e], 4); dn += 4; }
                else if (dtype == ST_BF16) { uint16_t h = (uint16_t)(bits >> 16); memcpy(data + dn, &h, 2); dn += 2; }
                else if (dtype == ST_F16) {  // small normal values: the exponent rebiased, the mantissa cut
                    int exp = (int)((bits >> 23) & 0xff) - 127 + 15;
                    uint16_t h = (uint16_t)((bits >> 16) & 0x8000);
                    if (exp > 0 && exp < 31) { h |= (uint16_t)((exp << 10) | ((bits >> 13) & 0x3ff)); }
                    memcpy(data + dn, &h, 2);
                    dn += 2;
                } else { double d = x[e]; memcpy(data + dn, &d, 8); dn += 8; }
            }
            char shape[64];
            if ((size_t)lead == per) { snprintf(shape, sizeof(shape), "[%lld]", (long long)lead); }
            else { snprintf(shape, sizeof(shape), "[%lld,%zu]", (long long)lead, per / (size_t)lead); }
            hn += (size_t)snprintf(header + hn, header_cap - hn, ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                                   name, ST_DTYPE_NAMES[dtype], shape, begin, dn);
        }
    }
    int64_t ids[2] = {3, -1};
    memcpy(data + dn, ids, sizeof(ids));
    hn += (size_t)snprintf(header + hn, header_cap - hn, ",\"lm_head.ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[%zu,%zu]}}",
                           dn, dn + sizeof(ids));
    dn += sizeof(ids);
    if (hn >= header_cap - 1) { vla_fail("the safetensors seed's header outgrew its buffer"); }
    safetensors_seed("weights.safetensors", header, data, dn);
    free(params); free(header); free(data);
}

// fuzz_log's input: the step a resume starts from (u16) and the log.jsonl it finds
static void log_seed(const char* name, uint16_t start, const char* text) {
    size_t n = strlen(text);
    uint8_t* input = (uint8_t*)mallocCheck(2 + n);
    memcpy(input, &start, 2);
    memcpy(input + 2, text, n);
    seed_write("log", name, input, 2 + n);
    free(input);
}

// fuzz_boot's input: a flags byte (bit 0: a reply, else a hello; bits 1-3: nodes 1-3 have
// joined), the token (its length in a byte, then it; "" for none), node 0's challenge nonce, for
// a reply the node's nonce, and the bytes received (msg, then more)
static const char* const BOOT_SEED_TOKEN = "the seeds' run token";
static uint8_t boot_seed_challenge[BOOT_NONCE], boot_seed_nonce[BOOT_NONCE];
static void boot_seed(const char* name, uint8_t flags, const char* token, const void* msg, size_t n, const void* more,
                      size_t more_n) {
    uint8_t input[2048];
    size_t t = strlen(token), at = 0;
    input[at++] = flags;
    input[at++] = (uint8_t)t;
    memcpy(input + at, token, t);
    at += t;
    memcpy(input + at, boot_seed_challenge, BOOT_NONCE);
    at += BOOT_NONCE;
    if (flags & 1) { memcpy(input + at, boot_seed_nonce, BOOT_NONCE); at += BOOT_NONCE; }
    memcpy(input + at, msg, n);
    at += n;
    if (more_n > 0) { memcpy(input + at, more, more_n); }
    seed_write("boot", name, input, at + more_n);
}

// A hello of identity id whose proof checks under token ("" for none) and the seeds' challenge
static BootHello boot_seed_hello(BootIdentity id, const char* token) {
    BootHello h;
    memset(&h, 0, sizeof(h));
    h.id = id;
    memcpy(h.nonce, boot_seed_nonce, BOOT_NONCE);
    boot_hello_proof(token, boot_seed_challenge, &h, h.proof);
    return h;
}

// Node 0's reply with its body and the proof that follows them, as one message
static void boot_seed_reply(const char* name, const char* token, BootReply reply, const void* body, size_t body_n,
                            int forged) {
    uint8_t more[1024], proof[BOOT_DIGEST];
    boot_reply_proof(token, boot_seed_nonce, boot_seed_challenge, &reply, body, proof);
    if (forged) { proof[0] ^= 1; }
    memcpy(more, body, body_n);
    memcpy(more + body_n, proof, BOOT_DIGEST);
    boot_seed(name, 1, token, &reply, sizeof(reply), more, body_n + BOOT_DIGEST);
}

int main(int argc, char** argv) {
    if (argc != 2) { vla_fail("usage: %s SEEDS_DIR", argv[0]); }
    seeds_root = argv[1];
    make_dir(seeds_root);
    char ckpt_dir[VLA_PATH_MAX], shard_dir[VLA_PATH_MAX];
    snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/checkpoint", seeds_root);
    snprintf(shard_dir, sizeof(shard_dir), "%s/shard", seeds_root);
    make_dir(ckpt_dir);
    make_dir(shard_dir);
    char path[VLA_PATH_MAX];
    const Cameras shapes[] = {{2, {6, 4}, {10, 4}}, {1, {8}, {8}}, {3, {4, 8, 4}, {4, 8, 12}}};
    for (int k = 0; k < (int)(sizeof(shapes) / sizeof(shapes[0])); k++) {
        snprintf(path, sizeof(path), "%s/shard_v2_%d.bin", shard_dir, k);
        shard_seed(path, &shapes[k], 100 + (uint64_t)k);
    }
    // token counts that fill whole 8- and 16-byte blocks: a read one token past a table lands in
    // malloc's padding after an odd count, but in the next block (where ASan sees it) after these;
    // and the shard whose middle token offset once sent the reader 1e9 ids past its copy
    static const char* const tokens_even[] = {"open", "the door"};                      // 12
    static const char* const tokens_8[] = {"push it!", "pull the handle "};             // 24
    static const char* const tokens_16[] = {"open the drawer ", "close the window"};    // 32
    const char* const* token_counts[] = {tokens_even, tokens_8, tokens_16};
    const char* token_names[] = {"shard_v2_tokens12.bin", "shard_v2_tokens24.bin", "shard_v2_tokens32.bin"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof(path), "%s/%s", shard_dir, token_names[k]);
        shard_seed_tasks(path, &shapes[1], 500 + (uint64_t)k, token_counts[k]);
    }
    snprintf(path, sizeof(path), "%s/shard_v2_token_offsets.bin", shard_dir);
    shard_seed_tasks(path, &shapes[1], 500, tokens_even);
    ShardHeader crash;
    FILE* cf = fopenCheck(path, "r+b");
    if (fread(&crash, sizeof(crash), 1, cf) != 1) { vla_fail("cannot read %s", path); }
    const uint64_t offsets[3] = {0, 1000000000ULL, crash.n_tokens};
    if (fseeko(cf, (off_t)crash.off_token_offsets, SEEK_SET) != 0 || fwrite(offsets, 8, 3, cf) != 3 || fclose(cf) != 0) {
        vla_fail("cannot write %s", path);
    }
    // version 1 of the square one, and the square one as the ids of another tokenizer (vocabulary 1000)
    char square[VLA_PATH_MAX];
    snprintf(square, sizeof(square), "%s/shard_v2_1.bin", shard_dir);
    Shard s;
    shard_open(&s, square);
    snprintf(path, sizeof(path), "%s/shard_v1.bin", shard_dir);
    shard_write_v1(path, &s);
    shard_close(&s);
    snprintf(path, sizeof(path), "%s/shard_v2_tokenizer.bin", shard_dir);
    shard_seed(path, &shapes[1], 101);
    ShardHeader h;
    FILE* f = fopenCheck(path, "r+b");
    if (fread(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot read %s", path); }
    memset(h.tokenizer, 0, sizeof(h.tokenizer));
    snprintf(h.tokenizer, sizeof(h.tokenizer), "tokenizer.json:0123456789abcdef");
    h.vocab = 1000;
    fseek(f, 0, SEEK_SET);
    if (fwrite(&h, sizeof(h), 1, f) != 1) { vla_fail("cannot write %s", path); }
    fclose(f);
    // checkpoints (version 2) of three small SmolVLA configs, one per train mode: every weight, and
    // the moments of that mode's trainable elements only (the third's 20-row text table: one the
    // policy library refuses, byte ids needing 256)
    //  cam S  A  img p  Cv Fv Lv NHv s  vocab pad text C   F   L  NH NKV HS Ce Fe  n  H  Smax Amax theta
    const FlowConfig configs[] = {
        {1, 2, 2, 8,  4, 4, 8, 1, 2,  1, 256, 0,  4,   8,  8,  2, 2, 1,  4, 4, 8,  2, 2, 4,   4,   10000, FAMILY_SMOLVLA},
        {2, 3, 2, 8,  2, 4, 4, 1, 1,  2, 256, 1,  3,   4,  8,  3, 2, 2,  2, 6, 4,  2, 3, 3,   2,   100, FAMILY_SMOLVLA},
        {1, 1, 3, 16, 4, 8, 8, 2, 2,  2, 20,  3,  2,   8,  4,  1, 4, 2,  2, 4, 4,  1, 2, 2,   3,   10000, FAMILY_SMOLVLA},
    };
    const int modes[] = {TRAIN_MODE_EXPERT, TRAIN_MODE_VLM, TRAIN_MODE_ALL};
    const uint64_t steps[] = {0, 5, 1000};
    for (int k = 0; k < (int)(sizeof(configs) / sizeof(configs[0])); k++) {
        const FlowConfig* c = &configs[k];
        const char* problem = flow_config_problem(c);
        if (problem != NULL) { vla_fail("seed config %d: %s", k, problem); }
        FlowParamTable t;
        flow_table_build(c, &t);
        size_t nt = flow_trainable_count(&t, modes[k]);
        int S = c->state_dim, A = c->action_dim;
        float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
        for (int i = 0; i < 2 * (S + A); i++) { stats[i] = 0.5f + 0.25f * (float)(i % 3); }
        float* params = (float*)mallocCheck(t.total * sizeof(float));
        float* moments = (float*)callocCheck(2 * (nt > 0 ? nt : 1), sizeof(float));
        flow_param_init(params, &t, c, 1337 + (uint64_t)k);
        for (size_t i = 0; i < nt; i++) {  // moments as a run leaves them: small, v positive
            moments[i] = 1e-3f * params[i];
            moments[nt + i] = 1e-6f * params[i] * params[i];
        }
        Checkpoint ck;
        memset(&ck, 0, sizeof(ck));
        ck.config = *c; ck.train_mode = modes[k]; ck.step = steps[k]; ck.seed = 1337; ck.sampler_pos = steps[k] * 8;
        ck.n_params = t.total; ck.n_trainable = nt; ck.stats = stats; ck.params = params; ck.m = moments;
        ck.v = moments + nt;
        snprintf(ck.tokenizer, sizeof(ck.tokenizer), "%s", SHARD_TOKENIZER_BYTES);
        snprintf(path, sizeof(path), "%s/ckpt_seed_%d.bin", ckpt_dir, k);
        checkpoint_write(path, &ck);
        free(stats); free(params); free(moments);
    }

    // shards opened together: agreeing ones (of other frames, so other statistics), a version-1
    // shard beside version 2, and ones that disagree on cameras or tokenizer
    snprintf(path, sizeof(path), "%s/shard_v2_0b.bin", shard_dir);
    shard_seed(path, &shapes[0], 200);
    snprintf(path, sizeof(path), "%s/shard_v2_0c.bin", shard_dir);
    shard_seed(path, &shapes[0], 300);
    const char* agree2[] = {"shard_v2_0.bin", "shard_v2_0b.bin"};
    const char* agree3[] = {"shard_v2_0.bin", "shard_v2_0b.bin", "shard_v2_0c.bin"};
    const char* versions[] = {"shard_v1.bin", "shard_v2_1.bin"};
    const Cameras wider = {2, {6, 4}, {10, 8}};  // the first shape's cameras but one, as wide again
    snprintf(path, sizeof(path), "%s/shard_v2_0w.bin", shard_dir);
    shard_seed(path, &wider, 400);
    const char* cameras[] = {"shard_v2_0.bin", "shard_v2_2.bin"};
    const char* sizes[] = {"shard_v2_0.bin", "shard_v2_0b.bin", "shard_v2_0w.bin"};
    const char* tokenizers[] = {"shard_v2_1.bin", "shard_v2_tokenizer.bin", "shard_v2_1.bin"};
    shards_seed("agree_2", shard_dir, agree2, 2);
    shards_seed("agree_3", shard_dir, agree3, 3);
    shards_seed("versions", shard_dir, versions, 2);
    shards_seed("cameras", shard_dir, cameras, 2);
    shards_seed("camera_sizes", shard_dir, sizes, 3);
    shards_seed("tokenizers", shard_dir, tokenizers, 3);

    safetensors_weights_seed();
    const float two[2] = {1.0f, -2.5f};
    safetensors_seed("small.safetensors", "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"b\\\" c\"},"
                     "\"a\\/b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"mask\":{\"shape\":[1,2],\"dtype\":\"BOOL\",\"data_offsets\":[8,10]},"
                     "\"scalar\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[10,11]}}", two, 11);
    safetensors_seed("empty.safetensors", "{}", NULL, 0);
    // what the format forbids: two tensors over the same bytes, a name given twice, bytes no tensor holds
    safetensors_seed("overlap.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", two, 8);
    safetensors_seed("twice.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", two, 8);
    safetensors_seed("gap.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", two, 8);
    // shapes past what any file holds: a dimension over 2^40, and a product past 2^64
    safetensors_seed("huge.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627777],\"data_offsets\":[0,8]}}", two, 8);
    safetensors_seed("overflow.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
                     "\"data_offsets\":[0,8]}}", two, 8);
    // a tensor name holding a newline, which once split the error naming it over two lines
    safetensors_seed("newline.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offset\n\ns\":[0,8]}}", two, 8);

    log_seed("resume", 3, "{\"step\": 1, \"loss\": 1.5, \"lr\": 0.0003, \"grad_norm\": 2.1, \"ms\": 10.000, \"samples_per_s\": 20.000}\n"
             "{\"step\": 2, \"loss\": 1.25, \"lr\": 0.0003}\n{\"step\": 3, \"loss\": 1}\n{\"step\": 4, \"loss\": 1}\n"
             "{\"step\": 5, \"loss\": 1, \"task_loss\": [0.5, null]}\n{\"step\": 6, \"lo");
    log_seed("kept", 10, "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 1}\n");
    log_seed("others", 0, "{\"note\": \"written by hand\"}\n\n{\"step\": -1}\n{\"step\": 99999999999}\n{\"step\": 1}");

    static const char* const names[][2] = {
        {"canonical", "ckpt_00000001.bin\nckpt_00000012.bin\nckpt_00000003.bin\nckpt_123456789.bin\nlog.jsonl\n"},
        {"near_misses", "ckpt_9.bin\nckpt_-1.bin\nckpt_+0000009.bin\nckpt_000000009.bin\nckpt_00000009.bin.tmp\n"
                        "ckpt_00000009.bin\nckpt_00000008.binx\n ckpt_00000007.bin\nckpt_0000000a.bin\n"},
        {"limits", "ckpt_18446744073709551615.bin\nckpt_18446744073709551616.bin\nckpt_00000000.bin\n"
                   "ckpt_99999999.bin\nckpt_100000000.bin\n"},
    };
    for (int k = 0; k < (int)(sizeof(names) / sizeof(names[0])); k++) {
        seed_write("names", names[k][0], names[k][1], strlen(names[k][1]));
    }

    const char* tok = BOOT_SEED_TOKEN;
    for (int i = 0; i < BOOT_NONCE; i++) {
        boot_seed_challenge[i] = (uint8_t)(i * 29 + 3);
        boot_seed_nonce[i] = (uint8_t)(i * 53 + 7);
    }
    BootHello hello = boot_seed_hello(fuzz_boot_identity(1), tok);
    boot_seed("hello_joins", 0, tok, &hello, sizeof(hello), NULL, 0);
    boot_seed("hello_taken", 2, tok, &hello, sizeof(hello), NULL, 0);
    boot_seed("hello_wrong_token", 0, "another token", &hello, sizeof(hello), NULL, 0);
    boot_seed("hello_token_unknown", 0, "", &hello, sizeof(hello), NULL, 0);  // node 0 without a token
    boot_seed("hello_short", 0, tok, &hello, sizeof(hello.id), NULL, 0);
    BootHello plain = boot_seed_hello(fuzz_boot_identity(2), "");
    boot_seed("hello_no_token", 0, "", &plain, sizeof(plain), NULL, 0);
    BootIdentity other = fuzz_boot_identity(3);
    other.batch += 1;
    BootHello sent = boot_seed_hello(other, tok);
    boot_seed("hello_batch", 0, tok, &sent, sizeof(sent), NULL, 0);
    other = fuzz_boot_identity(2);
    other.config.max_text += 1;
    sent = boot_seed_hello(other, tok);
    boot_seed("hello_config", 8, tok, &sent, sizeof(sent), NULL, 0);
    sent = boot_seed_hello(fuzz_boot_identity(4), tok);
    boot_seed("hello_rank", 0, tok, &sent, sizeof(sent), NULL, 0);
    other = fuzz_boot_identity(1);
    other.version -= 1;
    sent = boot_seed_hello(other, tok);
    boot_seed("hello_version", 0, tok, &sent, sizeof(sent), NULL, 0);
    sent = hello;  // a stranger's: the header right, then bytes of no meaning
    for (size_t i = 8; i < sizeof(sent); i++) { ((uint8_t*)&sent)[i] = (uint8_t)(i * 151 + 17); }
    boot_seed("hello_random", 0, tok, &sent, sizeof(sent), NULL, 0);
    uint8_t id[FUZZ_BOOT_PAYLOAD];
    for (int i = 0; i < FUZZ_BOOT_PAYLOAD; i++) { id[i] = (uint8_t)(i * 37); }
    BootReply welcome = {0, FUZZ_BOOT_PAYLOAD};
    boot_seed_reply("reply_welcome", tok, welcome, id, sizeof(id), 0);
    boot_seed_reply("reply_welcome_no_token", "", welcome, id, sizeof(id), 0);
    boot_seed_reply("reply_forged", tok, welcome, id, sizeof(id), 1);
    const char refusal[] = "node 1 disagrees with node 0 on batch 8 vs 5 (node 0 vs node 1)\n\x1b[2J\xc2\x9b";
    BootReply refused = {1, (uint32_t)strlen(refusal)};
    boot_seed_reply("reply_refused", tok, refused, refusal, strlen(refusal), 0);
    BootReply long_refusal = {1, 4096};
    boot_seed("reply_long", 1, tok, &long_refusal, sizeof(long_refusal), refusal, 16);
    return 0;
}
