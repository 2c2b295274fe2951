/*
vla/policy.h: what the policy libraries share (libvla.so, libvla_gpu.so, behind
scripts/vla_policy.py): VLA_API, the POLICY_* return codes and the calling thread's last failure
(vla_policy_last_status, vla_policy_last_error), and raw observations checked and laid out as the
batch the model reads, and the work of a load and of an act call as both libraries hold it.
Needs rng.h, config.h, shards.h, dataset.h and checkpoint.h.
*/
#ifndef VLA_POLICY_H
#define VLA_POLICY_H

#include "common.h"
#include "rng.h"
#include "config.h"
#include "shards.h"
#include "dataset.h"
#include "checkpoint.h"

// ----------------------------------------------------------------------------
// policies: a checkpoint serving raw observations (libvla.so from train_vla.c, libvla_gpu.so from
// train_vla.cu, both behind scripts/vla_policy.py)

#ifdef __cplusplus
#define VLA_API extern "C" __attribute__((visibility("default")))
#else
#define VLA_API __attribute__((visibility("default")))
#endif

// vla_policy_config's 28 values, in the order of a checkpoint's header: the config's fields but
// family (FLOW_CONFIG_FIELDS' order), the train mode, the family
static inline void policy_config_values(const FlowConfig* c, int train_mode, int32_t* out) {
    memcpy(out, c, FLOW_CONFIG_STORED * sizeof(int32_t));
    out[FLOW_CONFIG_STORED] = train_mode;
    out[FLOW_CONFIG_STORED + 1] = c->family;
}

// Makes room in obs for B observations of cameras `cams`; *capacity is what it holds (0 before
// the first call). Frames of other sizes than last time re-lay the batch out.
static inline void policy_reserve(Batch* obs, int* capacity, const FlowConfig* c, const Cameras* cams, int B) {
    if (B <= *capacity && cameras_equal(&obs->cams, cams)) { return; }
    if (*capacity > 0) {
        batch_free(obs);
        *capacity = 0;  // (an allocation that fails below leaves room for none, not the freed room)
    }
    batch_alloc(obs, c, cams, B);
    *capacity = B;
}

// What vla_policy_act and vla_policy_act_tokens return (libvla.so and libvla_gpu.so alike).
enum {
    POLICY_OK = 0,
    POLICY_BAD_BATCH = 1,   // B < 1
    POLICY_BAD_CAMERA = 2,  // a camera size outside [1, VLA_MAX_IMG] (not absent), one whose resize leaves nothing,
                            // or every camera absent
    POLICY_BAD_TOKENS = 3,  // a negative token count, or an id outside [0, vocab)
    POLICY_NOT_BYTES = 4,   // strings for a checkpoint whose tokenizer is not "bytes": pass its token ids
    POLICY_FAILED = 5,      // the library failed inside the call (its line: vla_policy_last_error); the policy
                            // lays its batch out again at the next call
    POLICY_NO_MEMORY = 6,   // out of host or GPU memory for this call (vla_policy_last_error): fewer observations
                            // per call may fit
};

#ifdef VLA_LIBRARY
// The errors of the libraries' entry points, per calling thread: every function that can fail
// (vla_policy_load, _act, _act_tokens, _free) runs its work in vla_catch_call, so a failure inside
// it (an allocation, a CUDA error, any vla_fail) returns POLICY_FAILED or POLICY_NO_MEMORY (a NULL
// policy and the line in err, from vla_policy_load) and never ends the host process.
static VLA_THREAD_LOCAL int policy_status_last = POLICY_OK;
static VLA_THREAD_LOCAL char policy_error_last[8192];

// The POLICY_* code of a vla_catch_call's outcome (POLICY_OK when it returned), kept with its line
// as the calling thread's last status: copied, since a later vla_catch_call (the cleanup after a
// failure) starts a new line.
static inline int policy_status(int caught) {
    policy_status_last = caught == VLA_CAUGHT_NONE ? POLICY_OK : caught == VLA_CAUGHT_NO_MEMORY ? POLICY_NO_MEMORY
                                                                                             : POLICY_FAILED;
    snprintf(policy_error_last, sizeof(policy_error_last), "%s", caught == VLA_CAUGHT_NONE ? "" : vla_caught_message());
    return policy_status_last;
}

// A failure found at the entry point itself (a NULL policy), as a caught one is kept
static inline int policy_refuse(const char* line) {
    policy_status_last = POLICY_FAILED;
    snprintf(policy_error_last, sizeof(policy_error_last), "%s", line);
    return POLICY_FAILED;
}

// POLICY_FAILED or POLICY_NO_MEMORY when the calling thread's last call of a function that can
// fail failed inside the library (vla_policy_last_error says how), else POLICY_OK; for
// vla_policy_load's NULL it tells a failure (out of memory, say) from a refused checkpoint.
VLA_API int vla_policy_last_status(void) { return policy_status_last; }

// The one line of that failure ("" after a call that did not fail inside the library)
VLA_API const char* vla_policy_last_error(void) { return policy_error_last; }
#endif

// The cameras of one call: cam_hw holds n_cam (height, width) pairs, (0, 0) for a camera the
// observation lacks. LeRobot feeds a missing camera as an image of -1 whose tokens are masked out,
// after the present cameras (pi0's _preprocess_images; SmolVLA's prepare_images does so for up to
// empty_cameras of them and leaves the others out). A masked key gets a weight of exactly 0 and
// does not advance the positions, so every token anyone sees computes what a model reading only the
// present cameras computes; the libraries run that model (one vision tower serves every camera).
// Writes the present cameras' sizes into cams and their frames into frames, in order; returns
// POLICY_BAD_CAMERA for a size outside [1, VLA_MAX_IMG] that is not (0, 0), or when no camera is
// present.
static inline int policy_present_cameras(int n_cam, const int32_t* cam_hw, const uint8_t* const* images, Cameras* cams,
                                         const uint8_t** frames) {
    memset(cams, 0, sizeof(*cams));
    for (int k = 0; k < n_cam; k++) {
        int h = cam_hw[2 * k], w = cam_hw[2 * k + 1];
        if (h == 0 && w == 0) { continue; }
        if (h < 1 || h > VLA_MAX_IMG || w < 1 || w > VLA_MAX_IMG) { return POLICY_BAD_CAMERA; }
        cams->height[cams->n] = (uint32_t)h;
        cams->width[cams->n] = (uint32_t)w;
        frames[cams->n++] = images[k];
    }
    return cams->n > 0 ? POLICY_OK : POLICY_BAD_CAMERA;
}

// Strings are token ids only under the "bytes" tokenizer (an instruction's UTF-8 bytes); a checkpoint
// trained on another tokenizer's ids takes ids (vla_policy_act_tokens), never silent byte ids.
static inline int policy_takes_strings(const char* tokenizer) { return strcmp(tokenizer, SHARD_TOKENIZER_BYTES) == 0; }

// B instructions as token ids: ids holds them one after another, n_ids[b] for observation b.
static inline int policy_check_tokens(const FlowConfig* c, int B, const int32_t* ids, const int32_t* n_ids) {
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        if (n_ids[b] < 0) { return POLICY_BAD_TOKENS; }
        for (int32_t k = 0; k < n_ids[b]; k++, at++) {
            if (ids[at] < 0 || ids[at] >= c->vocab) { return POLICY_BAD_TOKENS; }
        }
    }
    return POLICY_OK;
}

// The model's batch for B raw observations: images[k] camera k's frames u8 (B, h_k, w_k, 3) HWC of
// any size (obs->cams, the model resizes them); the instructions as `texts` (B UTF-8 strings, their
// bytes the ids: the "bytes" tokenizer) or, texts NULL, as token ids (`ids` and `n_ids` as
// policy_check_tokens takes them), cut to max_text and right-padded with pad_token as the trainer's
// batches; raw state (B, S) normalized with the checkpoint's statistics (state_mean(S) state_std(S)
// ...) and zero-padded; the starting noise in obs->eps: `noise` (B, H, max_action_dim) if given,
// else drawn from `seed`.
static inline void policy_observations(Batch* obs, const FlowConfig* c, const float* stats, int B,
                                       const uint8_t* const* images, const char* const* texts, const int32_t* ids,
                                       const int32_t* n_ids, const float* state, const float* noise, uint64_t seed) {
    int S = c->state_dim, Smax = c->max_state_dim, HA = c->chunk * c->max_action_dim;
    obs->B = B;
    for (int k = 0; k < c->n_cam; k++) {
        memcpy(obs->images[k], images[k],
               (size_t)B * (camera_offset(&obs->cams, k + 1) - camera_offset(&obs->cams, k)));
    }
    const float *state_mean = stats, *state_std = stats + S;
    size_t at = 0;
    for (int b = 0; b < B; b++) {
        if (texts != NULL) {
            size_t len = strlen(texts[b]);
            if (len > (size_t)c->max_text) { len = (size_t)c->max_text; }
            int32_t* row = obs->tokens + (size_t)b * c->max_text;
            tokens_from_bytes(row, (const uint8_t*)texts[b], len);
            batch_set_text(obs, c, b, row, len);
        } else {
            batch_set_text(obs, c, b, ids + at, (size_t)n_ids[b]);
            at += (size_t)n_ids[b];
        }
        for (int d = 0; d < Smax; d++) {
            obs->state[(size_t)b * Smax + d] = d < S ? (state[(size_t)b * S + d] - state_mean[d]) / state_std[d] : 0.0f;
        }
        if (noise != NULL) {
            memcpy(obs->eps + (size_t)b * HA, noise + (size_t)b * HA, (size_t)HA * sizeof(float));
        } else {
            flow_noise_width(c->chunk, c->max_action_dim, seed, 0, (uint64_t)b, &obs->t[b], obs->eps + (size_t)b * HA);
        }
    }
}

// Each library's own policy (train_vla.c's on the CPU, train_vla.cu's on the GPU)
typedef struct VLAPolicy VLAPolicy;

// What a policy's checkpoint says of it, the first member of each library's VLAPolicy (the entry
// points below read it through policy_facts): its config (its cameras as n_cam: the model's config
// takes the last call's), its train mode and the tokenizer of its token ids
typedef struct {
    FlowConfig config;
    int train_mode;
    char tokenizer[64];
} PolicyFacts;

static inline void policy_facts_set(PolicyFacts* f, const Checkpoint* ck) {
    f->config = ck->config;
    f->train_mode = ck->train_mode;
    snprintf(f->tokenizer, sizeof(f->tokenizer), "%s", ck->tokenizer);
}

// vla_policy_load's work, and what it holds so far: a failure part way leaves it for the caller
typedef struct {
    const char* path;
    int threads;
    char* err;
    int err_size;
    Checkpoint ck;
    VLAPolicy* p;  // set once allocated (its parts set as they are made)
    int loaded;    // 0: refused, the reason in err
} PolicyLoad;

// One act call's arguments, its result, and the chunk before un-normalizing (B, H, max_action_dim,
// on the host): allocated for the call, released by the library's policy_call_act whether or not it fails
typedef struct {
    VLAPolicy* p;
    int B;
    const int32_t* cam_hw;
    const uint8_t* const* images;
    const char* const* texts;
    const int32_t* ids;
    const int32_t* n_ids;
    const float* state;
    const float* noise;
    uint64_t seed;
    float* actions;
    int strings;   // the instructions are texts (vla_policy_act), else ids
    float* chunk;
    int rc;
    Cameras cams;  // the cameras present in this call and their frames (policy_present_cameras)
    const uint8_t* frames[VLA_MAX_CAM];
} PolicyAct;

// What every act call checks before it computes, for a policy of n_cam cameras, the tokenizer and
// config c: POLICY_OK with this call's present cameras in cams and their frames in frames, or why not.
static inline int policy_act_checks(const PolicyAct* a, int n_cam, const char* tokenizer, const FlowConfig* c,
                                    Cameras* cams, const uint8_t** frames) {
    if (a->strings && !policy_takes_strings(tokenizer)) { return POLICY_NOT_BYTES; }
    if (a->B < 1) { return POLICY_BAD_BATCH; }
    if (policy_present_cameras(n_cam, a->cam_hw, a->images, cams, frames) != POLICY_OK) { return POLICY_BAD_CAMERA; }
    if (a->texts == NULL && policy_check_tokens(c, a->B, a->ids, a->n_ids) != POLICY_OK) { return POLICY_BAD_TOKENS; }
    return POLICY_OK;
}

// The chunk the model sampled (rows, Amax), normalized, as actions (rows, A) in the data's units
static inline void policy_actions(const float* chunk, size_t rows, int Amax, int A, const float* action_mean,
                                  const float* action_std, float* actions) {
    for (size_t r = 0; r < rows; r++) {
        for (int k = 0; k < A; k++) { actions[r * A + k] = chunk[r * Amax + k] * action_std[k] + action_mean[k]; }
    }
}

#ifdef VLA_LIBRARY
// vla_policy_load of either library: load(l) under vla_catch_call, then the policy, or NULL with the
// refusal or the failure's line in err and what a failure left released by destroy
static inline VLAPolicy* policy_load_caught(PolicyLoad* l, void (*load)(void*), void (*destroy)(VLAPolicy*)) {
    int rc = policy_status(vla_catch_call(load, l));
    checkpoint_free(&l->ck);  // (what a failure left; the statistics moved into the policy)
    if (rc == POLICY_OK && l->loaded) { return l->p; }
    if (rc != POLICY_OK) { snprintf(l->err, (size_t)l->err_size, "%s", vla_policy_last_error()); }
    destroy(l->p);
    return NULL;
}
#endif

#ifdef VLA_LIBRARY
// ---- the entry points both libraries export alike (libvla.so from train_vla.c, libvla_gpu.so from
// train_vla.cu). Each trainer defines VLAPolicy, whose first member is its PolicyFacts, and these
// three; the entry points below call them.
static void policy_load(void* arg);        // a PolicyLoad's work: l->p made and l->loaded, or the refusal in l->err
static void policy_destroy(VLAPolicy* p);  // everything the policy holds, and the policy (NULL: nothing)
static int policy_call_act(PolicyAct* a);  // one checked act call: one at a time, a failure caught, its batch released

static inline const PolicyFacts* policy_facts(const VLAPolicy* p) { return (const PolicyFacts*)(const void*)p; }

// Loads a checkpoint; NULL and a message in err if it cannot be used (vla_policy_last_status:
// POLICY_OK for a refused checkpoint or, on the GPU, no GPU; POLICY_NO_MEMORY or POLICY_FAILED when
// loading failed). threads: the OpenMP threads of the CPU library's calls (0: the calling thread's
// default); the GPU library's take none.
VLA_API VLAPolicy* vla_policy_load(const char* path, int threads, char* err, int err_size) {
    PolicyLoad l;
    memset(&l, 0, sizeof(l));
    l.path = path;
    l.threads = threads;
    l.err = err;
    l.err_size = err_size;
    return policy_load_caught(&l, policy_load, policy_destroy);
}

// The checkpoint's config and train mode (policy_config_values). (This and vla_policy_tokenizer read
// fields only: nothing in them can fail.)
VLA_API void vla_policy_config(const VLAPolicy* p, int32_t* out) {
    policy_config_values(&policy_facts(p)->config, policy_facts(p)->train_mode, out);
}

// The tokenizer of the checkpoint's token ids ("bytes": an instruction's UTF-8 bytes are its ids).
VLA_API const char* vla_policy_tokenizer(const VLAPolicy* p) { return policy_facts(p)->tokenizer; }

// An act call's checks, which read only its arguments and the checkpoint's facts (the cameras
// present into a->cams and a->frames), then the library's call; the call's POLICY_* code
static inline int policy_checked_act(PolicyAct* a) {
    if (a->p == NULL) { return policy_refuse("a NULL policy: load one with vla_policy_load"); }
    const PolicyFacts* f = policy_facts(a->p);
    policy_status(VLA_CAUGHT_NONE);
    int rc = policy_act_checks(a, f->config.n_cam, f->tokenizer, &f->config, &a->cams, a->frames);
    return rc != POLICY_OK ? rc : policy_call_act(a);
}

// Action chunks (B, H, A) in the data's units for B observations: cam_hw the n_cam (height, width)
// pairs of this call's frames ((0, 0): a camera the observation lacks, policy_present_cameras),
// images[k] camera k's B frames (B, h_k, w_k, 3) u8 HWC of any size (resized with padding to the
// model's), raw state (B, S). The starting noise is `noise` (B, H, max_action_dim) if given, else
// drawn from `seed`. Returns POLICY_OK or why not (the POLICY_* codes above).
// Instructions as B UTF-8 strings, their bytes the token ids (cut to max_text): for checkpoints of
// the "bytes" tokenizer only (POLICY_NOT_BYTES otherwise).
VLA_API int vla_policy_act(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                           const char* const* instructions, const float* state, const float* noise, uint64_t seed,
                           float* actions) {
    PolicyAct a = {.p = p, .B = B, .cam_hw = cam_hw, .images = images, .texts = instructions, .ids = NULL,
                   .n_ids = NULL, .state = state, .noise = noise, .seed = seed, .actions = actions, .strings = 1,
                   .chunk = NULL, .rc = POLICY_OK, .cams = {}, .frames = {}};
    return policy_checked_act(&a);
}

// Instructions as token ids of the checkpoint's tokenizer (scripts/vla_policy.py makes them as the
// converters do): tokens the B instructions' ids one after another, n_tokens[b] of them for
// observation b (any count: the model reads the first max_text).
VLA_API int vla_policy_act_tokens(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                                  const int32_t* tokens, const int32_t* n_tokens, const float* state,
                                  const float* noise, uint64_t seed, float* actions) {
    PolicyAct a = {.p = p, .B = B, .cam_hw = cam_hw, .images = images, .texts = NULL, .ids = tokens,
                   .n_ids = n_tokens, .state = state, .noise = noise, .seed = seed, .actions = actions,
                   .strings = 0, .chunk = NULL, .rc = POLICY_OK, .cams = {}, .frames = {}};
    return policy_checked_act(&a);
}
#endif

#endif  // VLA_POLICY_H
