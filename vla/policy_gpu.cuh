/*
vla/policy_gpu.cuh: the policy library on the GPU, libvla_gpu.so (make libvla_gpu.so): a
checkpoint served for Python through ctypes (scripts/vla_policy.py, device="cuda"), with the C
ABI of libvla.so from train_vla.c: vla_policy_load, _config, _device, _tokenizer, _act,
_act_tokens, _timing, _set_graphs, _free. It owns VLAPolicy (the model without its training
state, the observations on the host and their copy on the device) and the environment variable
VLA_PROFILE_ACT (the act() call the step profiler times, for dev/bench_infer.py).

Included by train_vla.cu under VLA_LIBRARY, after the model (smolvla_build, smolvla_sample_actions,
smolvla_free); the observations are assembled by vla.h's policy_* functions, as libvla.so's are.
*/
#ifndef VLA_POLICY_GPU_CUH
#define VLA_POLICY_GPU_CUH

typedef struct {
    SmolVLA model;       // its config's n_cam: the cameras of the last call's observations (policy_present_cameras)
    int n_cam;           // the checkpoint's cameras
    int train_mode;      // the checkpoint's
    char tokenizer[64];  // the checkpoint's
    float* stats;        // state_mean(S) state_std(S) action_mean(A) action_std(A), as trained with (host)
    SmolBatch obs;       // host observations, room for `capacity`
    SmolBatch dev;       // their device copy, the same layout
    void* dev_memory;    // (dev_bytes)
    size_t dev_bytes;
    int capacity;
    char device[320];
} VLAPolicy;

static thread_local int policy_gpu_ready = 0;  // streams and cuBLASLt of the calling thread, once

// Loads a checkpoint onto the GPU; NULL and a message in err if it cannot be used. threads: unused.
VLA_API VLAPolicy* vla_policy_load(const char* path, int threads, char* err, int err_size) {
    (void)threads;
    Checkpoint ck;
    if (checkpoint_read_checked(path, &ck, err, (size_t)err_size) != 0) { return NULL; }
    checkpoint_note_unverified(path, &ck);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        snprintf(err, (size_t)err_size, "no CUDA GPU is visible: serve the checkpoint on the CPU (device=\"cpu\", libvla.so)");
        checkpoint_free(&ck);
        return NULL;
    }
    cudaDeviceProp prop;
    if (!policy_gpu_ready) {
        gpu_init(0, &prop);
        policy_gpu_ready = 1;
    } else {
        cudaCheck(cudaGetDeviceProperties(&prop, 0));
    }
    VLAPolicy* p = (VLAPolicy*)callocCheck(1, sizeof(VLAPolicy));
    snprintf(p->device, sizeof(p->device), "%s (%s)", prop.name, PRECISION_NAME);
    p->n_cam = ck.config.n_cam;
    p->train_mode = ck.train_mode;
    snprintf(p->tokenizer, sizeof(p->tokenizer), "%s", ck.tokenizer);
    smolvla_build(&p->model, &ck.config, ck.train_mode);
    smolvla_set_params(&p->model, ck.params);
    // serving trains nothing: the gradients and the optimizer state go
    SmolVLA* m = &p->model;
    float* training[4] = {m->grads_memory, m->master, m->m_memory, m->v_memory};
    for (int k = 0; k < 4; k++) { cudaCheck(cudaFree(training[k])); }
    m->device_bytes -= m->n_train * sizeof(float) + m->opt_bytes;
    m->grads_memory = m->master = m->m_memory = m->v_memory = NULL;
    m->sampling.use_graph = 1;
    const char* profile = getenv("VLA_PROFILE_ACT");  // the act() call to profile (dev/bench_infer.py)
    if (profile != NULL) {
        char* end = NULL;
        long call = strtol(profile, &end, 10);
        if (end == profile || *end != '\0' || call < 1 || call > 1000000000L) {
            fprintf(stderr, "vla: VLA_PROFILE_ACT=%s: expected the number (1, 2, ...) of the act() call to profile: "
                    "ignored\n", profile);
        } else {
            m->sampling.profile_call = (int)call;
        }
    }
    p->stats = ck.stats;
    ck.stats = NULL;
    checkpoint_free(&ck);
    return p;
}

// The checkpoint's config and train mode (policy_config_values)
VLA_API void vla_policy_config(const VLAPolicy* p, int32_t* out) {
    SmolVLAConfig c = p->model.config;
    c.n_cam = p->n_cam;
    policy_config_values(&c, p->train_mode, out);
}

// Where the policy computes, and in which precision.
VLA_API const char* vla_policy_device(const VLAPolicy* p) { return p->device; }

// The token ids the checkpoint was trained on ("bytes" for the data/ tools' shards).
VLA_API const char* vla_policy_tokenizer(const VLAPolicy* p) { return p->tokenizer; }

// Action chunks (B, H, A) in the data's units, as libvla.so's: cam_hw the (height, width) of each
// camera's frames in this call ((0, 0): a camera the observation lacks, policy_present_cameras),
// images[k] camera k's B frames, the instructions as strings or token ids (texts NULL; see
// policy_observations); the observations are assembled on the host, copied to the GPU in one go
// and sampled there (the prefix once, 10 Euler steps). Returns POLICY_OK or why not.
static int policy_act(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images, const char* const* texts,
                      const int32_t* ids, const int32_t* n_ids, const float* state, const float* noise, uint64_t seed,
                      float* actions) {
    SmolVLAConfig* c = &p->model.config;
    if (B < 1) { return POLICY_BAD_BATCH; }
    Cameras cams;
    const uint8_t* frames[VLA_MAX_CAM];
    if (policy_present_cameras(p->n_cam, cam_hw, images, &cams, frames) != POLICY_OK) { return POLICY_BAD_CAMERA; }
    if (texts == NULL && policy_check_tokens(c, B, ids, n_ids) != POLICY_OK) { return POLICY_BAD_TOKENS; }
    if (c->n_cam != cams.n) {  // another set of cameras than the last call's: activations and graph made again
        c->n_cam = cams.n;
        p->model.B = 0;
    }
    policy_reserve(&p->obs, &p->capacity, c, &cams, B);
    if (p->obs.bytes > p->dev_bytes) {  // a larger batch or larger frames than before
        cudaCheck(cudaFree(p->dev_memory));
        cudaCheck(cudaMalloc(&p->dev_memory, p->obs.bytes));
        p->dev_bytes = p->obs.bytes;
    }
    smolvla_batch_layout(&p->dev, (uint8_t*)p->dev_memory, c, &cams, p->capacity);  // the host's layout
    policy_observations(&p->obs, c, p->stats, B, frames, texts, ids, n_ids, state, noise, seed);
    cudaCheck(cudaMemcpy(p->dev_memory, p->obs.memory, p->obs.bytes, cudaMemcpyHostToDevice));
    p->dev.B = B;
    int S = c->state_dim, A = c->action_dim;
    smolvla_sample_actions(&p->model, &p->dev, p->stats + 2 * S, p->stats + 2 * S + A, actions);
    return POLICY_OK;
}

// Instructions as B UTF-8 strings (bytes as token ids): "bytes" checkpoints only, as libvla.so's.
VLA_API int vla_policy_act(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                           const char* const* instructions, const float* state, const float* noise, uint64_t seed,
                           float* actions) {
    if (!policy_takes_strings(p->tokenizer)) { return POLICY_NOT_BYTES; }
    return policy_act(p, B, cam_hw, images, instructions, NULL, NULL, state, noise, seed, actions);
}

// Instructions as token ids of the checkpoint's tokenizer, as libvla.so's: tokens one instruction's
// ids after another, n_tokens[b] for observation b.
VLA_API int vla_policy_act_tokens(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                                  const int32_t* tokens, const int32_t* n_tokens, const float* state, const float* noise,
                                  uint64_t seed, float* actions) {
    return policy_act(p, B, cam_hw, images, NULL, tokens, n_tokens, state, noise, seed, actions);
}

// What the last vla_policy_act took on the device, in ms: out[0] the prefix (images to the VLM's
// keys and values; the noise's copy), out[1] the 10 Euler steps; out[2], out[3] the launches of each (kernels,
// products, copies; a graph's launch counts once) where they are counted (the CPU emulation of
// CUDA), else -1. Zeros before the first call.
VLA_API void vla_policy_timing(const VLAPolicy* p, double* out) {
    const SmolSampling* s = &p->model.sampling;
    for (int k = 0; k < 2; k++) {
        out[k] = s->ms[k];
        out[2 + k] = (double)s->launches[k];
    }
}

// Whether the 10 Euler steps replay as one CUDA graph (1, the default) or launch one by one (0).
VLA_API void vla_policy_set_graphs(VLAPolicy* p, int on) { p->model.sampling.use_graph = on != 0; }

VLA_API void vla_policy_free(VLAPolicy* p) {
    if (p == NULL) { return; }
    if (p->capacity > 0) { smolvla_batch_free(&p->obs); }
    cudaCheck(cudaFree(p->dev_memory));
    free(p->stats);
    smolvla_free(&p->model);
    free(p);
}

#endif  // VLA_POLICY_GPU_CUH
