/*
vla/policy_gpu.cuh: the policy library on the GPU, libvla_gpu.so (make libvla_gpu.so): a
checkpoint served for Python through ctypes (scripts/vla_policy.py, device="cuda"), with the C
ABI of libvla.so from train_vla.c: vla_policy_load, _config, _device, _tokenizer, _act,
_act_tokens, _timing, _set_graphs, _free, and vla/policy.h's _last_status and _last_error. It owns
VLAPolicy (the model without its training state, the observations on the host and their copy on
the device) and the environment variable VLA_PROFILE_ACT (the act() call the step profiler times,
for dev/bench_infer.py).

Errors: as libvla.so's, every entry point that can fail runs its work in vla_catch_call, so a CUDA
error (cudaCheck, cuBLASLt's), memory that cannot be had on the host or the device, and any other
vla_fail return POLICY_FAILED or POLICY_NO_MEMORY with the line instead of ending the process;
train_vla.cu is C++, so the failure is thrown and the destructors it passes (the profiler's
ProfOp) run.

Threads: a policy runs one call at a time (its lock). The GPU state the model code uses (streams,
cuBLASLt's handle, workspace and plans, vla/cuda/matmul.cuh) is per host thread: each thread that calls
into the library makes its own at its first call and keeps it for the rest of the process (32 MiB
of GPU memory for the workspace), and a policy called from another thread than its last call's
makes its CUDA graph again in the new one.

Included by train_vla.cu under VLA_LIBRARY, after the model (smolvla_build, smolvla_sample,
smolvla_free); the observations are assembled by vla/policy.h's policy_* functions, as libvla.so's
are.
*/
#ifndef VLA_POLICY_GPU_CUH
#define VLA_POLICY_GPU_CUH

struct VLAPolicy {
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
    uint64_t thread;     // policy_gpu_thread of the host thread of its last call: its graph was made there
    pthread_mutex_t lock;  // held by the call that runs
};

// The calling host thread's number once its GPU state is made (gpu_init: device 0, its streams,
// cuBLASLt), 0 before: no two threads get the same one, even when a thread's id is reused.
static thread_local uint64_t policy_gpu_thread = 0;
static uint64_t policy_gpu_threads = 0;  // numbers given (atomic)

static void policy_gpu_thread_init(void) {
    if (policy_gpu_thread != 0) { return; }
    cudaDeviceProp prop;
    gpu_init(0, &prop);
    policy_gpu_thread = __atomic_add_fetch(&policy_gpu_threads, 1, __ATOMIC_RELAXED);
}

// The memory sized by the last call's batch: observations (host and device), activations and the
// graph made for them. A failed call releases it (its layout may be half made, a capture left
// open), and the next call lays its batch out anew.
static void policy_drop_batch(void* arg) {
    VLAPolicy* p = (VLAPolicy*)arg;
    // a failure inside the Euler steps' capture leaves main_stream capturing, which would refuse
    // all later work: end it (where nothing captures this is refused, and the refusal cleared)
    cudaGraph_t open = NULL;
    if (cudaStreamEndCapture(main_stream, &open) == cudaSuccess && open != NULL) { cudaGraphDestroy(open); }
    (void)cudaGetLastError();
    prof.on = prof.stopped = prof.depth = 0;  // a profiled call that failed stops recording (vla/cuda/profiler.cuh)
    if (p->capacity > 0) { smolvla_batch_free(&p->obs); }
    p->capacity = 0;
    void* dev = p->dev_memory;
    p->dev_memory = NULL;
    p->dev_bytes = 0;
    cudaCheck(cudaFree(dev));
    smolvla_drop_activations(&p->model);
}

// Everything the policy holds (its parts as far as they were made)
static void policy_release(void* arg) {
    VLAPolicy* p = (VLAPolicy*)arg;
    policy_drop_batch(p);
    free(p->stats);
    p->stats = NULL;
    smolvla_free(&p->model);
}

// Releases p and frees it; what a CUDA error keeps from being released stays (the device is
// then in no state to take it back)
static void policy_destroy(VLAPolicy* p) {
    if (p == NULL) { return; }
    vla_catch_call(policy_release, p);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static void policy_load(void* arg) {
    PolicyLoad* l = (PolicyLoad*)arg;
    if (checkpoint_read_checked(l->path, &l->ck, l->err, (size_t)l->err_size) != 0) { return; }
    Checkpoint* ck = &l->ck;
    checkpoint_note_unverified(l->path, ck);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        snprintf(l->err, (size_t)l->err_size, "no CUDA GPU is visible: serve the checkpoint on the CPU (device=\"cpu\", "
                 "libvla.so)");
        return;
    }
    policy_gpu_thread_init();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    VLAPolicy* p = (VLAPolicy*)callocCheck(1, sizeof(VLAPolicy));
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        vla_fail_no_memory("cannot make a policy's lock: " VLA_NO_MEMORY_FIX);
    }
    l->p = p;
    p->thread = policy_gpu_thread;
    snprintf(p->device, sizeof(p->device), "%s (%s)", prop.name, PRECISION_NAME);
    p->n_cam = ck->config.n_cam;
    p->train_mode = ck->train_mode;
    snprintf(p->tokenizer, sizeof(p->tokenizer), "%s", ck->tokenizer);
    smolvla_build(&p->model, &ck->config, ck->train_mode);
    smolvla_set_params(&p->model, ck->params);
    // serving trains nothing: the gradients and the optimizer state go
    SmolVLA* m = &p->model;
    float** training[4] = {&m->grads_memory, &m->master, &m->m_memory, &m->v_memory};
    for (int k = 0; k < 4; k++) {
        float* t = *training[k];
        *training[k] = NULL;
        cudaCheck(cudaFree(t));
    }
    m->device_bytes -= m->n_train * sizeof(float) + m->opt_bytes;
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
    p->stats = ck->stats;
    ck->stats = NULL;
    l->loaded = 1;
}

// Loads a checkpoint onto the GPU; NULL and a message in err if it cannot be used
// (vla_policy_last_status: POLICY_OK for a refused checkpoint or no GPU, POLICY_NO_MEMORY or
// POLICY_FAILED when loading failed). threads: unused.
VLA_API VLAPolicy* vla_policy_load(const char* path, int threads, char* err, int err_size) {
    (void)threads;
    PolicyLoad l;
    memset(&l, 0, sizeof(l));
    l.path = path;
    l.err = err;
    l.err_size = err_size;
    return policy_load_caught(&l, policy_load, policy_destroy);
}

// The checkpoint's config and train mode (policy_config_values). (This and the four below but
// _act read or set fields only: nothing in them can fail.)
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
// and sampled there (the prefix once, 10 Euler steps). Sets a->rc to POLICY_OK or why not.
static void policy_act(void* arg) {
    PolicyAct* a = (PolicyAct*)arg;
    VLAPolicy* p = a->p;
    SmolVLAConfig* c = &p->model.config;
    int B = a->B;
    Cameras cams;
    const uint8_t* frames[VLA_MAX_CAM];
    a->rc = policy_act_checks(a, p->n_cam, p->tokenizer, c, &cams, frames);
    if (a->rc != POLICY_OK) { return; }
    policy_gpu_thread_init();
    SmolSampling* s = &p->model.sampling;
    if (p->thread != policy_gpu_thread) {  // its graph holds the last thread's stream work, and its plans are that thread's
        if (s->graph != NULL) {
            cudaGraphExec_t graph = s->graph;
            s->graph = NULL;
            cudaCheck(cudaGraphExecDestroy(graph));
        }
        s->warm = 0;
        p->thread = policy_gpu_thread;
    }
    if (c->n_cam != cams.n) {  // another set of cameras than the last call's: activations and graph made again
        c->n_cam = cams.n;
        p->model.B = 0;
    }
    policy_reserve(&p->obs, &p->capacity, c, &cams, B);
    if (p->obs.bytes > p->dev_bytes) {  // a larger batch or larger frames than before
        void* old = p->dev_memory;
        p->dev_memory = NULL;
        p->dev_bytes = 0;
        cudaCheck(cudaFree(old));
        cudaCheck(cudaMalloc(&p->dev_memory, p->obs.bytes));
        p->dev_bytes = p->obs.bytes;
    }
    smolvla_batch_layout(&p->dev, (uint8_t*)p->dev_memory, c, &cams, p->capacity);  // the host's layout
    policy_observations(&p->obs, c, p->stats, B, frames, a->texts, a->ids, a->n_ids, a->state, a->noise, a->seed);
    cudaCheck(cudaMemcpy(p->dev_memory, p->obs.memory, p->obs.bytes, cudaMemcpyHostToDevice));
    p->dev.B = B;
    int S = c->state_dim, A = c->action_dim, H = c->chunk, Amax = c->max_action_dim;
    const float *action_mean = p->stats + 2 * S, *action_std = p->stats + 2 * S + A;
    a->chunk = (float*)mallocCheck((size_t)B * H * Amax * sizeof(float));
    SmolInputs in = smolvla_inputs(&p->dev);
    smolvla_sample(&p->model, &in, p->dev.eps, a->chunk);
    policy_actions(a->chunk, (size_t)B * H, Amax, A, action_mean, action_std, a->actions);
    a->rc = POLICY_OK;
}

// Runs one act call on its policy: one at a time (the lock), a failure caught and the batch's
// memory released after it.
static int policy_call_act(PolicyAct* a) {
    VLAPolicy* p = a->p;
    if (p == NULL) { return policy_refuse("a NULL policy: load one with vla_policy_load"); }
    pthread_mutex_lock(&p->lock);
    int rc = policy_status(vla_catch_call(policy_act, a));
    free(a->chunk);
    if (rc != POLICY_OK) {
        vla_catch_call(policy_drop_batch, p);  // (a second failure here leaves what it could not release)
    } else {
        rc = a->rc;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

// Instructions as B UTF-8 strings (bytes as token ids): "bytes" checkpoints only, as libvla.so's.
VLA_API int vla_policy_act(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                           const char* const* instructions, const float* state, const float* noise, uint64_t seed,
                           float* actions) {
    PolicyAct a = {p, B, cam_hw, images, instructions, NULL, NULL, state, noise, seed, actions, 1, NULL, POLICY_OK};
    return policy_call_act(&a);
}

// Instructions as token ids of the checkpoint's tokenizer, as libvla.so's: tokens one instruction's
// ids after another, n_tokens[b] for observation b.
VLA_API int vla_policy_act_tokens(VLAPolicy* p, int B, const int32_t* cam_hw, const uint8_t* const* images,
                                  const int32_t* tokens, const int32_t* n_tokens, const float* state, const float* noise,
                                  uint64_t seed, float* actions) {
    PolicyAct a = {p, B, cam_hw, images, NULL, tokens, n_tokens, state, noise, seed, actions, 0, NULL, POLICY_OK};
    return policy_call_act(&a);
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

// Frees the policy (NULL: nothing). No call on it may be running or come after. A CUDA error
// while freeing is kept (vla_policy_last_status) and leaves what it kept from being freed.
VLA_API void vla_policy_free(VLAPolicy* p) {
    if (p == NULL) {
        policy_status(VLA_CAUGHT_NONE);
        return;
    }
    policy_status(vla_catch_call(policy_release, p));
    pthread_mutex_destroy(&p->lock);
    free(p);
}

#endif  // VLA_POLICY_GPU_CUH
