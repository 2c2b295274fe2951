/*
train_vla.cu: the GPU trainer of LeRobot 0.6.1's robot policies, in CUDA C++: today SmolVLA and pi0,
two families of one model (the flow_ section: a VLM and an action expert trained by flow matching),
each policy a banner section over the kernel library (vla/cuda). Same models, same sections and
same checkpoints as train_vla.c (the CPU reference); the
PyTorch oracle (dev/model.py) and LeRobot's own references (dev/lerobot) are the independent
copies that test_vla_gpu.cu checks this file against. The model section's comment has the shape
legend: NV images, V vision rows, P = B*Np prefix rows, R = B*H action rows, C / Ce / Cv widths,
D = NH*HS, KV = NKV*HS (GQA), Smax / Amax padded state / action dims.

Precision (PRECISION=BF16, the default): weights and activations in bf16 (floatX); fp32 master
weights, AdamW moments, gradients, residual-stream gradients, norm statistics, softmax and every
accumulation. PRECISION=FP32 makes floatX float, for testing against the oracle at 1e-4.
PRECISION=FP16 (GPUs without bf16: sm_70, sm_75) makes floatX IEEE half, the rest as in bf16, with
dynamic loss scaling: fp16's 5 exponent bits flush small gradients to zero, so the loss gradient is
scaled by S before the backward, unscaled with the mean's factor, and a step whose gradients hold
Inf/NaN is skipped and halves S (see "dynamic loss scaling" among the kernels).

Invariants worth knowing before reading:
- What trains is --train (expert, vlm, all: TRAIN_MODE_*): each tensor's trainable elements are
  a prefix of it, packed in table order into one domain (FlowOptDomain), which holds the floatX
  weights that train, the gradients, the master weights, the moments, the checkpoint's m and v,
  the gradient buckets and the ZeRO-1 shards. Frozen weights live on the device as floatX only.
- The VLM runs first over the prefix and keeps its keys/values per layer; the expert attends to
  them. Backward runs the expert first, which deposits gradients into the VLM's keys/values
  (dp_k, dp_v), then the VLM, as far down as something trains.
- The loss is LeRobot's mean over valid entries, taken over the whole optimizer step (every
  micro-step and rank): the passes compute sums, divided once every rank's are in.
- Linear weights are (out, in), row-major; y = x W^T + b. cuBLASLt is column-major, so a
  row-major (N, C) activation is a column-major (C, N) matrix: see matmul_forward (vla/cuda/matmul.cuh).
- Every reduction runs in a fixed order (no floating-point atomics): two runs give the same bits.

Reproduce the oracle's numbers (what test_vla_gpu checks):
  make test     (on a GPU: build/gpu/test_vla_gpu_bf16 build/test build/gpu/train_vla_bf16 --smolvla build/lerobot_ref;
                 without one, the same tests run under the CPU emulation in dev/cuda/emu)
  build/venv/bin/python dev/model.py -i build/test/a.bin -p tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 \
      -l 1e-3 -u 2 -w 0.1 -c 0.5 --train-mode all     (the losses of ./train_vla -p tiny -b 4 ...)
*/
#include "vla/common.h"            // defines: vla_fail, mallocCheck, vla_catch_call, paths and checked sizes
#include "vla/config.h"            // defines: FlowConfig, its presets and parameter table, the row counts
#include "vla/shards.h"            // defines: Shard: the data shards, memory-mapped and checked
#include "vla/dataset.h"           // defines: Dataset, Batch and its layout, ModelInputs
#include "vla/sampler.h"           // defines: the global sampler, --balance tasks' TaskBalance
#include "vla/loader.h"            // defines: Loader: batches assembled by worker threads into a ring
#include "vla/loss_scale.h"        // defines: LossScaleState: fp16's dynamic loss scale on the host
#include "vla/checkpoint.h"        // defines: Checkpoint: the checkpoint file, written and read
#include "vla/cli.h"               // defines: TrainArgs: the command line
#include "vla/schedule.h"          // defines: the learning-rate schedule
#include "vla/logging.h"           // defines: Logger: log.jsonl and the progress line
#include "vla/runs.h"              // defines: the run folder, resume, checkpoints kept, the config table
#include "vla/run_record.h"        // defines: run.json, the run's settings, and -y 1 continuing with them
#include "vla/evaluation.h"        // defines: --eval-every, evaluations in the background while the run trains
#include "vla/bootstrap.h"         // defines: the multi-node bootstrap of NCCL's id
#include "vla/policy.h"            // defines: the policy libraries' C ABI, shared by both
#include "vla/flops.h"             // defines: the model's FLOPs per sample, for MFU
#include "vla/buckets.h"           // defines: Buckets: the gradient buckets of data parallelism
#include "vla/watchdog.h"          // defines: Watchdog: NCCL's errors and hung ranks end the run
#include "vla/memory_plan.h"       // defines: PolicySizes, --memory's plan from a policy's sizes
#include <limits.h>
#include <signal.h>
#if defined(MULTI_GPU)
#include <nccl.h>
#include <omp.h>
#endif

// the kernel library (vla/cuda): one header per operation, its forward and backward kernels with
// their launchers, each compiling alone; in the model's data order
#include "vla/cuda/common.cuh"         // defines: floatX, cudaCheck, Packed128, main_stream, BLOCK
#include "vla/cuda/profiler.cuh"       // defines: the step profiler (--profile STEP), ProfOp
#include "vla/cuda/matmul.cuh"         // defines: matmul_forward, matmul_backward_* (cuBLASLt)
#include "vla/cuda/resize_pad.cuh"     // defines: resize_pad (frames to the model's square input)
#include "vla/cuda/patchify.cuh"       // defines: patchify_chw_kernel
#include "vla/cuda/layernorm.cuh"      // defines: layernorm_forward, layernorm_backward
#include "vla/cuda/attention.cuh"      // defines: GqaAttn, gqa_attention_forward, gqa_attention_backward
#include "vla/cuda/gelu.cuh"           // defines: gelu_forward, gelu_backward
#include "vla/cuda/pixel_shuffle.cuh"  // defines: pixel_shuffle_forward, pixel_shuffle_backward
#include "vla/cuda/embedding.cuh"      // defines: the prefix's and suffix's embedding kernels
#include "vla/cuda/rmsnorm.cuh"        // defines: rmsnorm_forward, rmsnorm_backward
#include "vla/cuda/rope.cuh"           // defines: rope_at
#include "vla/cuda/glu.cuh"            // defines: swiglu_*, geglu_*, silu kernels
#include "vla/cuda/flow_loss.cuh"      // defines: flow_inputs_kernel, the loss kernels, euler_step_f32_kernel
#include "vla/cuda/column_sum.cuh"     // defines: column_sum, bias_backward
#include "vla/cuda/copy.cuh"           // defines: convert, gather/scatter rows, fill, scale
#include "vla/cuda/adamw.cuh"          // defines: the global norm's kernels, adamw_kernel, NORM_BLOCKS
#include "vla/cuda/loss_scale.cuh"     // defines: fp16's dynamic loss scaling, LOSS_SCALING

// ----------------------------------------------------------------------------
// the GPUs

// per GPU, as main_stream: host-to-device batch copies, ordered by events
static thread_local cudaStream_t copy_stream;
// The GPUs a run asks for are there: fails with a hint otherwise. Returns how many are visible.
static int gpu_check_visible(int wanted) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        vla_fail("no CUDA GPU is visible (%s): train on the CPU with train_vla_cpu, or check the driver and "
                 "CUDA_VISIBLE_DEVICES", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (wanted > count) {
        vla_fail("-g %d asks for more GPUs than the %d visible: lower -g or check CUDA_VISIBLE_DEVICES", wanted, count);
    }
    return count;
}

// This thread's GPU: device `device`, its streams, cuBLASLt and workspace.
static void gpu_init(int device, cudaDeviceProp* prop) {
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(prop, device));
    // blocking streams: setup's synchronous copies (legacy stream) stay ordered with the kernels
    cudaCheck(cudaStreamCreate(&main_stream));
    cudaCheck(cudaStreamCreate(&copy_stream));
    matmul_init();
}

static void gpu_shutdown(void) {
    prof_free();
    matmul_free();
    cudaCheck(cudaStreamDestroy(main_stream));
    cudaCheck(cudaStreamDestroy(copy_stream));
}

// ----------------------------------------------------------------------------
// the policy interface: all the loop, data parallelism, the data, evaluation, the config table and
// --memory ask of a policy, as one table of its functions over its model, which only its own
// section reads. The flow_ section below ends with the table of SmolVLA and pi0 (FLOW_POLICY); a new
// policy writes its section and its table, and policy_of, the one place that chooses, returns it.

// What a model holds on its GPU, as the loop reports it
typedef struct {
    size_t device_bytes;  // all of it
    size_t act_bytes;     // of which the activations (the batch's)
    int buckets;          // its gradient buckets, which data parallelism sums as the backward finishes each
} ModelHeld;

struct Dist;  // the data-parallel ranks a model trains with (NULL: alone)

typedef struct {
    PolicySizes sizes;  // from a config alone: what a build and its activations hold, its FLOPs (--memory)
    const char* (*problem)(const FlowConfig* c, int mode);  // what this build does not train, in one line, or NULL
    void (*param_counts)(const FlowConfig* c, int mode, size_t* total, size_t* trainable);
    void (*buckets)(const FlowConfig* c, int mode, Buckets* out);  // its gradient buckets (buckets_free)
    void (*config_rows)(const FlowConfig* c);                      // its own rows of the config table
    float* (*init_params)(const FlowConfig* c, uint64_t seed);     // the seeded weights, host, table layout
    // a model in train mode `mode` at recompute level rc, its optimizer state shard `shard_rank` of shard_world
    void* (*build)(const FlowConfig* c, int mode, int rc, int shard_rank, int shard_world, struct Dist* dist);
    void (*set_params)(void* m, const float* params, const float* moment1, const float* moment2);  // moments NULL: 0
    void (*set_loss_scale)(void* m, const LossScaleState* st, int window);  // fp16 builds
    void (*set_batch)(void* m, int B);  // the activations for B samples
    ModelHeld (*held)(const void* m);
    // a step: forward and backward of each micro-batch (the first zeroes the gradients), then the sums
    // over the ranks with the stop flag, the update, and its scalars read back
    void (*forward)(void* m, const ModelInputs* in, int micro);
    void (*sample_losses)(void* m, const ModelInputs* in, float* sums);  // device (B, 2): squared errors, entries
    void (*backward)(void* m, int zero_grads);
    void (*grads_finish)(void* m, int stop);
    void (*update)(void* m, float lr, float weight_decay, int decay_on, float clip, int step);
    void (*read_scalars)(void* m, float* loss, float* norm, int* stop);
    int (*read_loss_scale)(void* m, LossScaleState* st, float* used);  // fp16 builds: 1 if the step was skipped
    // a checkpoint at `step` (every rank calls it, rank 0 writes), its weights through the host's `params`
    void (*save)(void* m, float* params, const Dataset* ds, const TrainArgs* args, int step, uint64_t sampler_pos,
                 int write, const LossScaleState* loss_scale);
    void (*sample)(void* m, const ModelInputs* in, const float* noise, float* out);  // host (B, H, Amax), normalized
    void (*free)(void* m);
} Policy;

// ----------------------------------------------------------------------------
// model: SmolVLA and pi0 (the flow_ policies), as dev/smolvla.py and train_vla.c compute them (same
// functions, same order):
//   frames -> resize with padding, x*2-1 -> SigLIP -> pixel shuffle -> connector -> prefix = [image
//   tokens * sqrt(C), language * sqrt(C), state_proj(state)] -> the VLM's Llama layers -> the expert's
//   layers over the H action tokens (joint self-attention in even layers, cross-attention to the VLM's
//   re-projected keys/values in odd ones) -> RMSNorm -> action_out_proj (fp32) -> masked squared error.
// The prefix never sees the actions, so the VLM runs first and alone (it is sampling's cache).
// Shapes: NV = n_cam * B images (camera-major: image cam * B + b), S image side, p patch,
// G = S/p, Nv = G*G patches per image, V = NV * Nv vision rows, Cv / Fv vision widths, NI image
// tokens per camera, C / F VLM widths, Ce / Fe expert widths, Np prefix tokens, H chunk,
// T = Np + H sequence, P = B * Np prefix rows, R = B * H action rows, D = NH*HS query width,
// KV = NKV*HS key/value width (GQA), Smax / Amax padded state / action dims.

typedef struct {
#define FLOW_FIELD_X_(nm, ...) floatX* nm;
    FLOW_PARAMETERS(FLOW_FIELD_X_, c)
#undef FLOW_FIELD_X_
} FlowParametersX;


// pi0's suffix holds the state token before the actions: what only that layout needs has no elements otherwise
static inline size_t flow_pi0_rows(const FlowConfig* c, size_t rows) {
    return flow_state_in_suffix(c) ? rows : 0;
}

// Vision layers kept: all when the tower trains, else one slot each layer overwrites
static inline size_t flow_vis_kept(const FlowConfig* c, int mode) {
    return mode == TRAIN_MODE_ALL ? (size_t)c->vis_layers : 1;
}

// Per-layer slots of the attention and MLP halves at recompute level rc: every layer's, or one refilled
static inline size_t flow_attn_slots(size_t layers, int rc) { return rc >= RECOMPUTE_ATTN ? 1 : layers; }
static inline size_t flow_mlp_slots(size_t layers, int rc) { return rc >= RECOMPUTE_LAYER ? 1 : layers; }
static inline size_t flow_vis_attn(const FlowConfig* c, int mode, int rc) {
    return flow_attn_slots(flow_vis_kept(c, mode), rc);
}
static inline size_t flow_vis_mlp(const FlowConfig* c, int mode, int rc) {
    return flow_mlp_slots(flow_vis_kept(c, mode), rc);
}

static inline size_t flow_vis_grad_rows(const FlowConfig* c, int B, int mode) {
    return mode == TRAIN_MODE_ALL ? flow_vrows(c, B) : 0;
}

// Column-sum partials of the backward's widest (rows, columns)
static size_t flow_partial_size(const FlowConfig* c, int B, int mode) {
    size_t V = colsum_chunks(flow_vis_grad_rows(c, B, mode)), P = colsum_chunks(flow_prows(c, B));
    size_t R = colsum_chunks(flow_rrows(c, B)), S = colsum_chunks((size_t)B);
    size_t vision = V * (2 * (size_t)c->vis_width > (size_t)c->vis_ff ? 2 * (size_t)c->vis_width : (size_t)c->vis_ff);
    size_t actions = R * (c->d_expert > c->max_action_dim ? c->d_expert : c->max_action_dim);
    return flow_max3(vision, flow_max3(P * c->d_model, S * c->d_model, 1), actions);
}

// Activations: (type, name, elements), carved from one allocation per type (X floatX, F fp32, I int),
// stacked layer-major. The g_* are backward scratch shared by the towers; r_* one VLM layer's state rows.
#define FLOW_GPU_ACTIVATIONS(X, F, I, c, B, mode, rc) \
    X(pixels,   flow_images(c, B) * 3 * (c)->img * (c)->img)                          /* (NV, 3, S, S) prepared images */ \
    X(patches,  flow_vrows(c, B) * flow_patch_dim(c))                              /* (V, 3pp) */ \
    X(v_res,    (flow_vis_kept(c, mode) + 1) * flow_vrows(c, B) * (c)->vis_width)     /* (Kv+1, V, Cv) layer inputs, then the last output */ \
    X(v_ln1,    flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    F(v_mean1,  flow_vis_attn(c, mode, rc) * flow_vrows(c, B))                                     /* (Ka, V) */ \
    F(v_rstd1,  flow_vis_attn(c, mode, rc) * flow_vrows(c, B))                                     /* (Ka, V) */ \
    X(v_q,      flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_k,      flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_v,      flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    X(v_att,    flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                    /* (Ka, V, Cv) */ \
    F(v_lse,    flow_vis_attn(c, mode, rc) * flow_vrows(c, B) * (c)->vis_heads)                    /* (Ka, NV, NHv, Nv) */ \
    X(v_mid,    flow_vis_mlp(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                     /* (Km, V, Cv) after attention */ \
    X(v_ln2,    flow_vis_mlp(c, mode, rc) * flow_vrows(c, B) * (c)->vis_width)                     /* (Km, V, Cv) */ \
    F(v_mean2,  flow_vis_mlp(c, mode, rc) * flow_vrows(c, B))                                      /* (Km, V) */ \
    F(v_rstd2,  flow_vis_mlp(c, mode, rc) * flow_vrows(c, B))                                      /* (Km, V) */ \
    X(v_fc1,    flow_vis_mlp(c, mode, rc) * flow_vrows(c, B) * (c)->vis_ff)                        /* (Km, V, Fv) before GELU */ \
    X(v_gelu,   flow_vis_mlp(c, mode, rc) * flow_vrows(c, B) * (c)->vis_ff)                        /* (Km, V, Fv) */ \
    X(v_out,    flow_vrows(c, B) * (c)->vis_width)                                    /* (V, Cv) after post_layernorm */ \
    F(v_omean,  flow_vrows(c, B))                                                     /* (V) */ \
    F(v_orstd,  flow_vrows(c, B))                                                     /* (V) */ \
    X(shuffled, flow_vrows(c, B) * (c)->vis_width)                                    /* (NV*NI, s*s*Cv) */ \
    X(img_tok,  flow_images(c, B) * flow_image_tokens(c) * (c)->d_model)           /* (NV*NI, C) connector output */ \
    X(state_x,  (size_t)(B) * (c)->max_state_dim)                                     /* (B, Smax) the batch's state */ \
    X(state_tok, (size_t)(B) * flow_state_width(c))                                /* (B, C or Ce) state_proj(state) */ \
    I(tokens,   (size_t)(B) * (c)->max_text)                                          /* (B, Lt) the batch's ids, for the backward */ \
    I(block,    (size_t)(B) * (flow_n_prefix(c) + flow_n_suffix(c)))            /* (B, T) block ids, -1 = a pad */ \
    I(pos,      (size_t)(B) * (flow_n_prefix(c) + flow_n_suffix(c)))            /* (B, T) RoPE positions */ \
    I(x_pos,    flow_rrows(c, B))                                                     /* (B, Ns) the cross layers' positions */ \
    X(p_res,    (size_t)(c)->n_layer * flow_prows(c, B) * (c)->d_model)               /* (L, P, C) layer inputs */ \
    X(p_ln1,    flow_attn_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_model)               /* (La, P, C) */ \
    F(p_rstd1,  flow_attn_slots((c)->n_layer, rc) * flow_prows(c, B))                              /* (La, P) */ \
    X(p_q,      flow_attn_slots((c)->n_layer, rc) * flow_prows(c, B) * flow_d_attn(c))          /* (La, P, D) after RoPE */ \
    X(p_k,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) after RoPE: what the expert reads */ \
    X(p_v,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) */ \
    X(p_att,    flow_attn_slots((c)->n_layer, rc) * flow_prows(c, B) * flow_d_attn(c))          /* (La, P, D) */ \
    F(p_lse,    flow_attn_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->n_head)                /* (La, B, NH, Np) */ \
    X(p_mid,    flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_model)                /* (Lm, P, C) after attention */ \
    X(p_ln2,    flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_model)                /* (Lm, P, C) */ \
    F(p_rstd2,  flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B))                               /* (Lm, P) */ \
    X(p_gate,   flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(p_up,     flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(p_act,    flow_mlp_slots((c)->n_layer, rc) * flow_prows(c, B) * (c)->d_ff)                   /* (Lm, P, F) */ \
    X(x_t,      flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) noisy actions */ \
    F(target,   flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) u = noise - actions */ \
    F(x_sample, flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) Euler state */ \
    F(t_sample, (size_t)(B))                                                          /* (B) Euler time */ \
    X(a_in,     flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) action_in_proj(x_t) */ \
    X(a_emb,    flow_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) [action_in, time embedding] */ \
    X(t_pre,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) before SiLU */ \
    X(t_act,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) after SiLU */ \
    X(a_tok,    flow_pi0_rows(c, flow_arows(c, B)) * (c)->d_expert)                /* (A, Ce) pi0: the action tokens, before their place */ \
    X(s_res,    ((c)->n_layer + 1) * flow_rrows(c, B) * (c)->d_expert)                /* (L+1, R, Ce) layer inputs, then the last output */ \
    X(s_ln1,    flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert)              /* (La, R, Ce) */ \
    F(s_rstd1,  flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B))                              /* (La, R) */ \
    X(s_q,      flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * flow_d_attn(c))          /* (La, R, D) after RoPE */ \
    X(s_k,      flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * flow_d_kv(c))            /* (La, R, KV) after RoPE (joint layers) */ \
    X(s_v,      flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * flow_d_kv(c))            /* (La, R, KV) (joint layers) */ \
    X(c_k,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) p_k re-projected (cross layers) */ \
    X(c_v,      (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) p_v re-projected (cross layers) */ \
    X(s_att,    flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * flow_d_attn(c))          /* (La, R, D) */ \
    F(s_lse,    flow_attn_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->n_head)                /* (La, B, NH, Ns) */ \
    X(s_mid,    flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert)               /* (Lm, R, Ce) after attention */ \
    X(s_ln2,    flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert)               /* (Lm, R, Ce) */ \
    F(s_rstd2,  flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B))                               /* (Lm, R) */ \
    X(s_gate,   flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(s_up,     flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(s_act,    flow_mlp_slots((c)->n_layer, rc) * flow_rrows(c, B) * (c)->d_expert_ff)            /* (Lm, R, Fe) */ \
    X(f_ln,     flow_rrows(c, B) * (c)->d_expert)                                     /* (R, Ce) after the expert's norm */ \
    F(f_rstd,   flow_rrows(c, B))                                                     /* (R) */ \
    X(f_act,    flow_pi0_rows(c, flow_arows(c, B)) * (c)->d_expert)                /* (A, Ce) pi0: f_ln's action rows */ \
    F(v_t,      flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) velocities, fp32 */ \
    X(d_vt,     flow_arows(c, B) * (c)->max_action_dim)                               /* (B, H, Amax) d loss / d v_t, set by the forward */ \
    F(loss_partial, (size_t)ceil_div(flow_arows(c, B) * (c)->max_action_dim, BLOCK))  /* the loss's per-block sums */ \
    F(scalars,  8)                                                                    /* loss (first its sum), grad norm, stop, valid entries, their inverse */ \
    /* backward scratch */ \
    F(dp_k,     (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) d p_k, from the expert and the VLM */ \
    F(dp_v,     (size_t)(c)->n_layer * flow_prows(c, B) * flow_d_kv(c))            /* (L, P, KV) d p_v */ \
    F(g_res,    flow_max3(flow_prows(c, B) * (c)->d_model, flow_rrows(c, B) * (c)->d_expert, flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_res_x,  flow_max3(flow_prows(c, B) * (c)->d_model, flow_rrows(c, B) * (c)->d_expert, flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_ln,     flow_max3(flow_prows(c, B) * (c)->d_model, flow_rrows(c, B) * (c)->d_expert, flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_att,    flow_max3(flow_prows(c, B) * flow_d_attn(c), flow_rrows(c, B) * flow_d_attn(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_q,      flow_max3(flow_prows(c, B) * flow_d_attn(c), flow_rrows(c, B) * flow_d_attn(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    F(g_kf,     flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    F(g_vf,     flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_kx,     flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_vx,     flow_max3(flow_prows(c, B) * flow_d_kv(c), flow_rrows(c, B) * flow_d_kv(c), flow_vis_grad_rows(c, B, mode) * (c)->vis_width)) \
    X(g_gate,   flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    X(g_up,     flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    X(g_act,    flow_max3(flow_prows(c, B) * (c)->d_ff, flow_rrows(c, B) * (c)->d_expert_ff, flow_vis_grad_rows(c, B, mode) * (c)->vis_ff)) \
    F(delta,    flow_max3(flow_prows(c, B) * (c)->n_head, flow_rrows(c, B) * (c)->n_head, flow_vis_grad_rows(c, B, mode) * (c)->vis_heads)) \
    F(g_dw,     flow_max3((c)->d_model, (c)->d_expert, (c)->vis_width))               /* a frozen norm's dw, dropped */ \
    F(partial,  flow_partial_size(c, B, mode))                                        /* column-sum partials */ \
    X(g_emb,    flow_arows(c, B) * 2 * (c)->d_expert)                                 /* (A, 2Ce) d a_emb */ \
    X(g_tok,    flow_arows(c, B) * (c)->d_expert)                                     /* (A, Ce) */ \
    X(g_state,  flow_pi0_rows(c, (size_t)(B)) * (c)->d_expert)                        /* (B, Ce) pi0: d of the state tokens */ \
    X(g_img,    flow_images(c, B) * flow_image_tokens(c) * (c)->d_model)           /* (NV*NI, C) d img_tok */ \
    X(g_shuf,   flow_vis_grad_rows(c, B, mode) * (c)->vis_width)                      /* (NV*NI, s*s*Cv) d shuffled */ \
    X(r_res,    (size_t)(B) * (c)->d_model)                                           /* (B, C) one VLM layer's state rows */ \
    X(r_ln1,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    F(r_rstd1,  (size_t)(B))                                                          /* (B) */ \
    X(r_q,      (size_t)(B) * flow_d_attn(c))                                      /* (B, D) */ \
    X(r_att,    (size_t)(B) * flow_d_attn(c))                                      /* (B, D) */ \
    F(r_lse,    (size_t)(B) * (c)->n_head)                                            /* (B, NH) */ \
    X(r_mid,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    X(r_ln2,    (size_t)(B) * (c)->d_model)                                           /* (B, C) */ \
    F(r_rstd2,  (size_t)(B))                                                          /* (B) */ \
    X(r_gate,   (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    X(r_up,     (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    X(r_act,    (size_t)(B) * (c)->d_ff)                                              /* (B, F) */ \
    F(r_dk,     (size_t)(B) * flow_d_kv(c))                                        /* (B, KV) their key gradients */ \
    F(r_dv,     (size_t)(B) * flow_d_kv(c))                                        /* (B, KV) */

typedef struct {
#define FLOW_ACT_X_(nm, n) floatX* nm;
#define FLOW_ACT_F_(nm, n) float* nm;
#define FLOW_ACT_I_(nm, n) int* nm;
    FLOW_GPU_ACTIVATIONS(FLOW_ACT_X_, FLOW_ACT_F_, FLOW_ACT_I_, c, B, mode, rc)
#undef FLOW_ACT_X_
#undef FLOW_ACT_F_
#undef FLOW_ACT_I_
} FlowActivations;

// What the weights and the activations take on the device: flow_model_bytes, flow_act_bytes
// What flow_build allocates on a GPU beside the activations, part by part (vla/memory_plan.h's MEM_*),
// for ZeRO-1 over shard_world ranks (1: off); the rest is the norm's partial sums, the RoPE table and
// fp16's loss scale
static void flow_model_parts(const FlowConfig* c, int mode, int shard_world, size_t parts[MEM_PARTS]) {
    FlowParamTable t;
    FlowOptDomain d;
    flow_table_build(c, &t);
    flow_opt_domain(&t, mode, &d);
    size_t shard = zero_shard_size(d.total, shard_world, 16), n_train = shard * shard_world, n_params = n_train;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) { n_params += (t.spec[i].numel - d.numel[i] + 15) / 16 * 16; }
    size_t rope = (size_t)(flow_n_prefix(c) + flow_n_suffix(c)) * (c->head_dim / 2) * 2;
    parts[MEM_WEIGHTS] = n_params * sizeof(floatX);
    parts[MEM_GRADS] = n_train * sizeof(float);
    parts[MEM_MASTER] = shard * sizeof(float);
    parts[MEM_MOMENTS] = 2 * shard * sizeof(float);
    parts[MEM_OTHER] = (NORM_BLOCKS + rope) * sizeof(float) + (LOSS_SCALING ? LOSS_SCALER * sizeof(float) : 0);
}

// Device bytes flow_build allocates on one GPU without ZeRO-1, activations aside (flow_act_bytes):
// what --memory plans with; flow_build checks it holds exactly this
static size_t flow_model_bytes(const FlowConfig* c, int mode, int shard_world = 1) {
    return model_bytes(flow_model_parts, c, mode, shard_world);
}

// The elements one activation tensor of n takes in its type's allocation: rounded up to 64 bytes,
// so that every tensor starts 16-byte aligned (flow_set_batch carves by the same rule)
static inline size_t flow_act_slot_x(size_t n) { return (n * sizeof(floatX) + 63) / 64 * 64 / sizeof(floatX); }
static inline size_t flow_act_slot_4(size_t n) { return (n + 15) / 16 * 16; }  // (float, int)

// The activations' elements of each type for B samples
static void flow_act_counts(const FlowConfig* c, int mode, int B, int rc, size_t* nx, size_t* nf, size_t* ni) {
    *nx = *nf = *ni = 0;
#define FLOW_SIZE_X_(nm, n) *nx += flow_act_slot_x(n);
#define FLOW_SIZE_F_(nm, n) *nf += flow_act_slot_4(n);
#define FLOW_SIZE_I_(nm, n) *ni += flow_act_slot_4(n);
    FLOW_GPU_ACTIVATIONS(FLOW_SIZE_X_, FLOW_SIZE_F_, FLOW_SIZE_I_, c, B, mode, rc)
#undef FLOW_SIZE_X_
#undef FLOW_SIZE_F_
#undef FLOW_SIZE_I_
}

// Device bytes of the activations flow_set_batch allocates for B samples
static size_t flow_act_bytes(const FlowConfig* c, int mode, int B, int rc = RECOMPUTE_NONE) {
    size_t nx, nf, ni;
    flow_act_counts(c, mode, B, rc, &nx, &nf, &ni);
    return nx * sizeof(floatX) + nf * sizeof(float) + ni * sizeof(int);
}

// Sampling's state (flow_sample): the Euler steps as one CUDA graph, and what the last call took
typedef struct {
    int use_graph;          // replay the Euler steps as a CUDA graph (the policy library's default)
    int warm;               // the steps ran once for these activations (their products' plans exist)
    cudaGraphExec_t graph;  // captured for these activations; NULL until then (set_batch drops both)
    cudaEvent_t marks[3];   // before the prefix, before the Euler steps, after them
    float ms[2];            // device time of the last call: the prefix, the Euler steps
    long long launches[2];  // what they handed the device, where it is counted (the CPU emulation); else -1
    int profile_call;       // > 0: the call (1, 2, ...) to time by phase and operation, its steps launched one by one
    int calls;              // calls so far
} FlowSampling;

typedef struct {
    FlowConfig config;
    int mode;                              // TRAIN_MODE_*: what trains, so what has a gradient
    int recompute;                         // RECOMPUTE_*: what the backward runs again (flow_set_recompute)
    FlowParamTable table;
    FlowOptDomain domain;                  // the trainable elements, packed: tensor i's at domain.offset[i]
    size_t frozen_at[FLOW_NUM_TENSORS]; // where a tensor's frozen remainder starts in params_memory
    size_t n_opt;                          // trainable elements: domain.total
    size_t n_train;                        // the domain padded to a whole number of ZeRO shards of 16
    size_t n_params;                       // params_memory's elements: the domain, then the frozen remainders
    size_t shard_lo, shard_hi;             // the domain elements whose optimizer state this model keeps
    floatX* params_memory;  // (n_params) the compute copy of every weight, the only copy of a frozen one
    float* grads_memory;    // (n_train) fp32 gradients of the trainable domain
    float* master;          // (shard) fp32 master weights of the trainable elements
    float* m_memory;        // (shard) AdamW's first moments
    float* v_memory;        // (shard) AdamW's second moments
    size_t opt_bytes;       // device bytes of the three above (what the tests assert)
    float* norm_partial;    // (NORM_BLOCKS) the gradient norm's per-block sums
    float* scaler;          // (LOSS_SCALER) fp16 builds' dynamic loss scale (loss_scale_begin_kernel); else NULL
    int loss_scale_window;  // clean steps before the scale doubles
    FlowParametersX params; // each tensor's first slice (stacked tensors: flow_param)
    FlowParameters grads;   // NULL for a tensor with no trainable part (flow_grad says which slices train)
    int B;                  // batch the activations are sized for
    floatX* acts_x;         // one allocation per activation type
    float* acts_f;
    int* acts_i;
    FlowActivations acts;
    float* rope_cos;        // (T, HS/2) device: LeRobot's angles at positions 0 .. T-1
    float* rope_sin;
    size_t device_bytes;    // what this model holds on the GPU
    size_t act_bytes;       // of which the activations
    Buckets buckets;
    struct Dist* dist;      // the data-parallel ranks it trains with; NULL: alone
    FlowSampling sampling;
} FlowVLA;

static void* flow_device_malloc(FlowVLA* m, size_t bytes) {
    void* p;
    cudaCheck(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    m->device_bytes += bytes;
    return p;
}

// Slice k of parameter tensor i: in the trainable domain when it trains, else in the frozen remainder
static inline floatX* flow_param(const FlowVLA* m, int i, int k) {
    const FlowParamSpec* s = &m->table.spec[i];
    size_t at = (size_t)k * (flow_slice_numel(s)), n_train = m->domain.numel[i];
    return m->params_memory + (at < n_train ? m->domain.offset[i] + at : m->frozen_at[i] + (at - n_train));
}

static inline float* flow_grad(const FlowVLA* m, int i, int k) {
    const FlowParamSpec* s = &m->table.spec[i];
    size_t per = flow_slice_numel(s);
    if (per == 0 || (size_t)(k + 1) * per > m->domain.numel[i]) { return NULL; }
    return m->grads_memory + m->domain.offset[i] + (size_t)k * per;
}

// ZeRO-1: this model keeps one shard's optimizer state (gradients reduce-scattered, weights all-gathered)
static int flow_sharded(const FlowVLA* m) { return m->shard_hi - m->shard_lo < m->n_train; }

// The model's calls into the data-parallel section (nothing without NCCL)
static void dist_sum(struct Dist* d, float* x, size_t n);
static void dist_bucket_done(struct Dist* d, float* grads, const Buckets* k, int b, int sharded);
static void dist_step_sums(struct Dist* d, float* grads, size_t lo, size_t hi, int sharded, float* scalars);
static void dist_gather_params(struct Dist* d, floatX* params, size_t lo, size_t hi);
static const float* dist_gather_state(struct Dist* d, float* gathered, const float* shard, size_t lo, size_t hi,
                                      int sharded);

// Bucket b's gradients are final: summed over the ranks while the backward goes on (ZeRO-1: at the end)
static void flow_bucket_done(FlowVLA* m, int b) {
    dist_bucket_done(m->dist, m->grads_memory, &m->buckets, b, flow_sharded(m));
}

// fp16 builds: the dynamic loss scale's state (a checkpoint's or --loss-scale's) onto the device
static void flow_set_loss_scale(FlowVLA* m, const LossScaleState* st, int window) {
    if (m->scaler == NULL) { return; }
    float h[LOSS_SCALER] = {st->scale, (float)st->clean, (float)st->skipped, st->scale, 1.0f};
    cudaCheck(cudaMemcpy(m->scaler, h, sizeof(h), cudaMemcpyHostToDevice));
    m->loss_scale_window = window;
}

// The loss scale after the last step and the one it ran with (`used`); whether it was skipped (Inf/NaN)
static int flow_read_loss_scale(FlowVLA* m, LossScaleState* st, float* used) {
    float h[LOSS_SCALER];
    cudaCheck(cudaMemcpyAsync(h, m->scaler, sizeof(h), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    int skipped = (uint64_t)h[SCALER_SKIPPED] != st->skipped;
    st->scale = h[SCALER_NEXT]; st->clean = (uint32_t)h[SCALER_CLEAN]; st->skipped = (uint64_t)h[SCALER_SKIPPED];
    if (used != NULL) { *used = h[SCALER_USED]; }
    return skipped;
}

// What of config c in `mode` the GPU trainer's kernels do not take, in one line, or NULL: checked by
// flow_build and, before anything is read or allocated, by a run
static const char* flow_gpu_problem(const FlowConfig* c, int mode) {
    static char msg[320];
    const char* problem = flow_config_problem(c);
    if (problem != NULL) {
        snprintf(msg, sizeof(msg), "bad %s config: %s", FAMILY_NAMES[c->family], problem);
        return msg;
    }
    if (c->head_dim > 32 * ATT5_VALS || c->vis_width / c->vis_heads > 32 * ATT5_VALS) {
        snprintf(msg, sizeof(msg), "head sizes %d and %d: the GPU attention kernels take head sizes up to %d",
                 c->head_dim, c->vis_width / c->vis_heads, 32 * ATT5_VALS);
        return msg;
    }
    if (c->d_model > 32 * RMSNORM_BWD3_COLS || c->d_expert > 32 * RMSNORM_BWD3_COLS ||
        c->vis_width > 32 * LAYERNORM_FWD2_VALS) {
        snprintf(msg, sizeof(msg),
                 "widths %d (VLM), %d (expert), %d (vision): the GPU trainer's norms take widths up to "
                 "%d; train this model with train_vla_cpu",
                 c->d_model, c->d_expert, c->vis_width, 32 * RMSNORM_BWD3_COLS);
        return msg;
    }
    if (mode == TRAIN_MODE_ALL && c->vis_width > 32 * LAYERNORM_BWD3_VALS) {
        snprintf(msg, sizeof(msg),
                 "--train all: the vision tower's width %d is past the GPU trainer's LayerNorm backward "
                 "(up to %d): train it with --train vlm (the vision tower frozen) or with train_vla_cpu",
                 c->vis_width, 32 * LAYERNORM_BWD3_VALS);
        return msg;
    }
    // the kernels move 16 bytes at a time: every width, head size and image side in whole packs
    int widths[] = {c->vis_width, c->vis_ff, c->vis_width / c->vis_heads, c->img, c->d_model, c->d_ff,
                    c->d_expert, c->d_expert_ff, c->head_dim};
    for (int k = 0; k < (int)(sizeof(widths) / sizeof(widths[0])); k++) {
        if (widths[k] % x128::size == 0) { continue; }
        snprintf(msg, sizeof(msg),
                 "the GPU trainer takes widths, head sizes and image sizes that are multiples of %d (%s); this model "
                 "has vision %d / %d / heads of %d, image %d, VLM %d / %d, expert %d / %d, heads of %d: train it with "
                 "train_vla_cpu",
                 x128::size, PRECISION_NAME, c->vis_width, c->vis_ff, c->vis_width / c->vis_heads, c->img, c->d_model,
                 c->d_ff, c->d_expert, c->d_expert_ff, c->head_dim);
        return msg;
    }
    return NULL;
}

// The model for config c in `mode`; ZeRO-1: optimizer state of shard `shard_rank` only
static void flow_build(FlowVLA* m, const FlowConfig* c, int mode, int shard_rank = 0, int shard_world = 1) {
    memset(m, 0, sizeof(*m));
    const char* problem = flow_gpu_problem(c, mode);
    if (problem != NULL) { vla_fail("%s", problem); }
    if (mode < TRAIN_MODE_EXPERT || mode > TRAIN_MODE_ALL) { vla_fail("train mode %d is not one of 0-2", mode); }
    m->config = *c;
    m->mode = mode;
    flow_table_build(c, &m->table);
    flow_opt_domain(&m->table, mode, &m->domain);
    m->n_opt = m->domain.total;
    size_t shard = zero_shard_size(m->n_opt, shard_world, 16);
    m->n_train = shard * shard_world;
    m->shard_lo = (size_t)shard_rank * shard;
    m->shard_hi = m->shard_lo + shard;
    m->n_params = m->n_train;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        m->frozen_at[i] = m->n_params;
        m->n_params += (m->table.spec[i].numel - m->domain.numel[i] + 15) / 16 * 16;  // 32 bytes of bf16
    }
    m->params_memory = (floatX*)flow_device_malloc(m, m->n_params * sizeof(floatX));
    m->grads_memory = (float*)flow_device_malloc(m, m->n_train * sizeof(float));
    cudaCheck(cudaMemset(m->params_memory, 0, m->n_params * sizeof(floatX)));
    cudaCheck(cudaMemset(m->grads_memory, 0, m->n_train * sizeof(float)));  // the padding stays zero (the norm adds it)
    // optimizer state for the shard's trainable elements only: a frozen tensor is its floatX copy alone
    size_t before = m->device_bytes;
    m->master = (float*)flow_device_malloc(m, shard * sizeof(float));
    m->m_memory = (float*)flow_device_malloc(m, shard * sizeof(float));
    m->v_memory = (float*)flow_device_malloc(m, shard * sizeof(float));
    m->opt_bytes = m->device_bytes - before;
    cudaCheck(cudaMemset(m->master, 0, shard * sizeof(float)));
    cudaCheck(cudaMemset(m->m_memory, 0, shard * sizeof(float)));
    cudaCheck(cudaMemset(m->v_memory, 0, shard * sizeof(float)));
    m->norm_partial = (float*)flow_device_malloc(m, NORM_BLOCKS * sizeof(float));
    if (LOSS_SCALING) {
        m->scaler = (float*)flow_device_malloc(m, LOSS_SCALER * sizeof(float));
        LossScaleState fresh = {VLA_LOSS_SCALE_DEFAULT, 0, 0};
        flow_set_loss_scale(m, &fresh, VLA_LOSS_SCALE_WINDOW_DEFAULT);
    }
    int i = 0;
#define FLOW_POINT_X_(nm, ...) \
    m->params.nm = m->table.spec[i].numel > 0 ? flow_param(m, i, 0) : NULL; \
    m->grads.nm = m->domain.numel[i] > 0 ? m->grads_memory + m->domain.offset[i] : NULL; \
    i++;
    FLOW_PARAMETERS(FLOW_POINT_X_, c)
#undef FLOW_POINT_X_
    flow_buckets_build(&m->buckets, c, &m->table, &m->domain);
    // RoPE as LeRobot's apply_rope: timescale theta^e, e = float32(2/HS) * k, pow correctly rounded
    // (in double, then float); angle = pos / timescale in float32
    int T = flow_n_prefix(c) + flow_n_suffix(c), half = c->head_dim / 2;
    float* cs = (float*)mallocCheck((size_t)T * half * 2 * sizeof(float));
    for (int k = 0; k < half; k++) {
        float e = (float)(2.0 / c->head_dim) * (float)k;
        float timescale = (float)pow((double)c->rope_theta, (double)e);
        for (int pos = 0; pos < T; pos++) {
            float angle = (float)pos / timescale;
            cs[(size_t)pos * half + k] = (float)cos((double)angle);
            cs[(size_t)T * half + (size_t)pos * half + k] = (float)sin((double)angle);
        }
    }
    m->rope_cos = (float*)flow_device_malloc(m, (size_t)T * half * 2 * sizeof(float));
    m->rope_sin = m->rope_cos + (size_t)T * half;
    cudaCheck(cudaMemcpy(m->rope_cos, cs, (size_t)T * half * 2 * sizeof(float), cudaMemcpyHostToDevice));
    free(cs);
    if (m->device_bytes != flow_model_bytes(c, mode, shard_world)) {  // what --memory's tables add
        vla_fail("internal: flow_build holds %zu bytes, flow_model_bytes says %zu", m->device_bytes,
                 flow_model_bytes(c, mode, shard_world));
    }
}

// The weights from a host array in the table's layout; AdamW's moments from moment1/2, else zero
static void flow_set_params(FlowVLA* m, const float* params, const float* moment1 = NULL, const float* moment2 = NULL) {
    size_t widest = 0, lo = m->shard_lo, hi = m->shard_hi;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        if (m->table.spec[i].numel > widest) { widest = m->table.spec[i].numel; }
    }
    float* scratch;
    cudaCheck(cudaMalloc(&scratch, widest * sizeof(float)));
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &m->table.spec[i];
        size_t n_train = m->domain.numel[i], o = m->domain.offset[i], first;
        cudaCheck(cudaMemcpyAsync(scratch, params + s->offset, s->numel * sizeof(float), cudaMemcpyHostToDevice,
                                  main_stream));
        if (n_train > 0) { convert(m->params_memory + o, scratch, n_train); }
        if (n_train < s->numel) { convert(m->params_memory + m->frozen_at[i], scratch + n_train, s->numel - n_train); }
        size_t n = zero_part(o, n_train, lo, hi, &first);
        if (n > 0) {
            cudaCheck(cudaMemcpyAsync(m->master + (o + first - lo), scratch + first, n * sizeof(float),
                                      cudaMemcpyDeviceToDevice, main_stream));
        }
        cudaCheck(cudaStreamSynchronize(main_stream));  // the scratch is reused by the next tensor
    }
    cudaCheck(cudaFree(scratch));
    float* moments[2] = {m->m_memory, m->v_memory};
    const float* given[2] = {moment1, moment2};
    size_t n = (m->n_opt > lo ? (m->n_opt < hi ? m->n_opt : hi) - lo : 0);  // the shard's real elements
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaMemset(moments[k], 0, (hi - lo) * sizeof(float)));
        if (given[k] != NULL && n > 0) {
            cudaCheck(cudaMemcpy(moments[k], given[k] + lo, n * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
}

// Frees the activations and the sampling graph that reads them, leaving the model at B 0. What is
// freed is forgotten first: a failure part way (which the policy library survives) leaves nothing
// freed twice, and the activations still held counted.
static void flow_drop_activations(FlowVLA* m) {
    m->sampling.warm = 0;
    if (m->sampling.graph != NULL) {
        cudaGraphExec_t graph = m->sampling.graph;
        m->sampling.graph = NULL;
        cudaCheck(cudaGraphExecDestroy(graph));
    }
    m->device_bytes -= m->act_bytes;
    m->act_bytes = 0;
    m->B = 0;
    void* acts[3] = {m->acts_x, m->acts_f, m->acts_i};
    m->acts_x = NULL;
    m->acts_f = NULL;
    m->acts_i = NULL;
    for (int k = 0; k < 3; k++) { cudaCheck(cudaFree(acts[k])); }
}

static void flow_set_batch(FlowVLA* m, int B) {
    if (m->B == B) { return; }
    flow_drop_activations(m);
    const FlowConfig* c = &m->config;
    int mode = m->mode, rc = m->recompute;
    size_t nx, nf, ni;
    flow_act_counts(c, mode, B, rc, &nx, &nf, &ni);
    m->acts_x = (floatX*)flow_device_malloc(m, nx * sizeof(floatX));
    m->act_bytes += nx * sizeof(floatX);
    m->acts_f = (float*)flow_device_malloc(m, nf * sizeof(float));
    m->act_bytes += nf * sizeof(float);
    m->acts_i = (int*)flow_device_malloc(m, ni * sizeof(int));
    m->act_bytes += ni * sizeof(int);  // (flow_act_bytes's sum, counted as it is allocated)
    floatX* px = m->acts_x;
    float* pf = m->acts_f;
    int* pi = m->acts_i;
#define FLOW_POINT_X_(nm, n) m->acts.nm = px; px += flow_act_slot_x(n);
#define FLOW_POINT_F_(nm, n) m->acts.nm = pf; pf += flow_act_slot_4(n);
#define FLOW_POINT_I_(nm, n) m->acts.nm = pi; pi += flow_act_slot_4(n);
    FLOW_GPU_ACTIVATIONS(FLOW_POINT_X_, FLOW_POINT_F_, FLOW_POINT_I_, c, B, mode, rc)
#undef FLOW_POINT_X_
#undef FLOW_POINT_F_
#undef FLOW_POINT_I_
    m->B = B;
}

// Recompute level rc (RECOMPUTE_*; none when built) from now on: the activations are sized again
static void flow_set_recompute(FlowVLA* m, int rc) {
    if (rc < RECOMPUTE_NONE || rc > RECOMPUTE_LAYER) { vla_fail("recompute level %d is not one of 0-2", rc); }
    if (m->recompute == rc) { return; }
    m->recompute = rc;
    int B = m->B;
    m->B = 0;
    if (m->acts_x != NULL) { flow_set_batch(m, B); }
}

static void flow_free(FlowVLA* m) {
    cudaCheck(cudaFree(m->params_memory)); cudaCheck(cudaFree(m->grads_memory));
    cudaCheck(cudaFree(m->master)); cudaCheck(cudaFree(m->m_memory)); cudaCheck(cudaFree(m->v_memory));
    cudaCheck(cudaFree(m->norm_partial));
    if (m->scaler != NULL) { cudaCheck(cudaFree(m->scaler)); }
    cudaCheck(cudaFree(m->acts_x)); cudaCheck(cudaFree(m->acts_f)); cudaCheck(cudaFree(m->acts_i));
    cudaCheck(cudaFree(m->rope_cos));
    buckets_free(&m->buckets);
    if (m->sampling.graph != NULL) { cudaCheck(cudaGraphExecDestroy(m->sampling.graph)); }
    for (int k = 0; k < 3 && m->sampling.marks[0] != NULL; k++) { cudaCheck(cudaEventDestroy(m->sampling.marks[k])); }
}

// One Llama layer of the VLM or the expert: its weights (floatX) or gradients (float, NULL = frozen)
template <typename T>
struct FlowLayer {
    FLOW_LAYER_FIELDS(T)
};

template <typename T>
static FlowLayer<T> flow_layer(const FlowVLA* m, int expert, int l, int grads) {
    const FlowConfig* c = &m->config;
    int cross = expert && flow_layer_is_cross(c, l), idx[9], slice[9];
    flow_layer_tensors(c, expert, l, idx, slice);
    T* t[9];
    for (int i = 0; i < 9; i++) {
        t[i] = grads ? (T*)(void*)flow_grad(m, idx[i], slice[i]) : (T*)(void*)flow_param(m, idx[i], slice[i]);
    }
    FlowLayer<T> w = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], expert ? c->d_expert : c->d_model,
                      expert ? c->d_expert_ff : c->d_ff, cross, flow_rms_eps(c), flow_rms_offset(c),
                      flow_mlp_gelu(c)};
    return w;
}

// One stack's activations at layer l (N rows), and `out`, the next layer's input
typedef struct {
    floatX *res, *ln1, *q, *k, *v, *att, *mid, *ln2, *gate, *up, *act, *out;
    float *rstd1, *lse, *rstd2;
} FlowLayerActs;

static FlowLayerActs flow_layer_acts(const FlowVLA* m, int expert, int l) {
    const FlowConfig* c = &m->config;
    const FlowActivations* a = &m->acts;
    size_t N = expert ? flow_rrows(c, m->B) : flow_prows(c, m->B), L = (size_t)l;
    size_t La = L % flow_attn_slots(c->n_layer, m->recompute), Lm = L % flow_mlp_slots(c->n_layer, m->recompute);
    size_t C = expert ? c->d_expert : c->d_model, F = expert ? c->d_expert_ff : c->d_ff;
    FlowLayerActs x;
    if (expert) {
        x = FlowLayerActs{a->s_res, a->s_ln1, a->s_q, a->s_k, a->s_v, a->s_att, a->s_mid, a->s_ln2, a->s_gate, a->s_up,
                          a->s_act, a->s_res, a->s_rstd1, a->s_lse, a->s_rstd2};
    } else {
        x = FlowLayerActs{a->p_res, a->p_ln1, a->p_q, a->p_k, a->p_v, a->p_att, a->p_mid, a->p_ln2, a->p_gate, a->p_up,
                          a->p_act, a->p_res, a->p_rstd1, a->p_lse, a->p_rstd2};
    }
    size_t Lkv = expert ? La : L;  // the VLM's keys/values are the expert's too: one slot per layer
    FLOW_LAYER_SLOTS(x, c, N, C, F, L, La, Lm, Lkv);
    return x;
}

// Vision layer l's activations (V rows) and `out`: slot l % Kv, input l % (Kv + 1) of v_res
typedef struct {
    floatX *res, *ln1, *q, *k, *v, *att, *mid, *ln2, *fc1, *gelu, *out;
    float *mean1, *rstd1, *lse, *mean2, *rstd2;
} FlowVisionActs;

static FlowVisionActs flow_vision_acts(const FlowVLA* m, int l) {
    const FlowConfig* c = &m->config;
    const FlowActivations* a = &m->acts;
    size_t kept = flow_vis_kept(c, m->mode), V = flow_vrows(c, m->B);
    size_t La = (size_t)l % flow_vis_attn(c, m->mode, m->recompute),
           Lm = (size_t)l % flow_vis_mlp(c, m->mode, m->recompute);
    size_t VC = V * c->vis_width, VF = V * c->vis_ff;
    FlowVisionActs x = {a->v_res + (size_t)l % (kept + 1) * VC,
                        a->v_ln1 + La * VC,
                        a->v_q + La * VC,
                        a->v_k + La * VC,
                        a->v_v + La * VC,
                        a->v_att + La * VC,
                        a->v_mid + Lm * VC,
                        a->v_ln2 + Lm * VC,
                        a->v_fc1 + Lm * VF,
                        a->v_gelu + Lm * VF,
                        a->v_res + (size_t)(l + 1) % (kept + 1) * VC,
                        a->v_mean1 + La * V,
                        a->v_rstd1 + La * V,
                        a->v_lse + La * V * c->vis_heads,
                        a->v_mean2 + Lm * V,
                        a->v_rstd2 + Lm * V};
    return x;
}

// Attention under the sequence's mask: Tq queries from token q0, keys k0/v0 (Nk0) then k1/v1 (Nk1)
static GqaAttn flow_attn(const FlowVLA* m, int Tq, int q0, const floatX* k0, const floatX* v0, int Nk0,
                         const floatX* k1, const floatX* v1, int Nk1) {
    const FlowConfig* c = &m->config;
    GqaAttn a = {.k0 = k0, .v0 = v0, .k1 = k1, .v1 = v1, .block = m->acts.block, .B = m->B, .NH = c->n_head,
                 .NKV = c->n_kv_head, .HS = c->head_dim, .Tq = Tq, .q0 = q0, .Nk0 = Nk0, .Nk1 = Nk1,
                 .Nt = flow_n_prefix(c) + flow_n_suffix(c)};
    return a;
}

static void flow_rmsnorm_backward(FlowVLA* m, float* dres, floatX* dres_x, float* dw, const floatX* dout,
                                  const floatX* inp, const floatX* w, const float* rstd, int N, int C) {
    if (dw == NULL) {
        dw = m->acts.g_dw;
        cudaCheck(cudaMemsetAsync(dw, 0, C * sizeof(float), main_stream));
    }
    rmsnorm_backward(dres, dres_x, dw, m->acts.partial, dout, inp, w, rstd, N, C, flow_rms_offset(&m->config));
}

// attention output -> o_proj + residual -> RMSNorm -> SwiGLU (GeGLU) MLP + residual; with_out 0 skips down_proj
static void flow_layer_out_forward(const FlowLayer<floatX>* w, const FlowLayerActs* x, int N, int D, int with_out = 1) {
    matmul_forward(x->mid, x->att, w->wo, NULL, x->res, N, D, w->C);
    rmsnorm_forward(x->ln2, x->rstd2, x->mid, w->ln2, N, w->C, w->eps, w->offset);
    matmul_forward(x->gate, x->ln2, w->gate, NULL, NULL, N, w->C, w->F);
    matmul_forward(x->up, x->ln2, w->up, NULL, NULL, N, w->C, w->F);
    glu_forward(x->act, x->gate, x->up, (size_t)N * w->F, w->gelu);
    if (with_out) { matmul_forward(x->out, x->act, w->down, NULL, x->mid, N, w->F, w->C); }
}

// Backward of flow_layer_out_forward: dres, dres_x hold d(out) (N, C), left holding d(mid); g_att d(att)
static void flow_layer_out_backward(FlowVLA* m, const FlowLayer<floatX>* w, const FlowLayer<float>* g,
                                    const FlowLayerActs* x, float* dres, floatX* dres_x, int N, int D) {
    FlowActivations* a = &m->acts;
    int C = w->C, F = w->F;
    matmul_backward_input(a->g_act, dres_x, w->down, N, F, C, 0.0f);
    if (g->down != NULL) { matmul_backward_weight(g->down, dres_x, x->act, N, F, C); }
    glu_backward(a->g_gate, a->g_up, a->g_act, x->gate, x->up, (size_t)N * F, w->gelu);
    matmul_backward_input(a->g_ln, a->g_gate, w->gate, N, C, F, 0.0f);
    matmul_backward_input(a->g_ln, a->g_up, w->up, N, C, F, 1.0f);
    if (g->gate != NULL) { matmul_backward_weight(g->gate, a->g_gate, x->ln2, N, C, F); }
    if (g->up != NULL) { matmul_backward_weight(g->up, a->g_up, x->ln2, N, C, F); }
    flow_rmsnorm_backward(m, dres, dres_x, g->ln2, a->g_ln, x->mid, w->ln2, x->rstd2, N, C);
    matmul_backward_input(a->g_att, dres_x, w->wo, N, D, C, 0.0f);
    if (g->wo != NULL) { matmul_backward_weight(g->wo, dres_x, x->att, N, D, C); }
}

// Backward of ln1 and q/k/v, rotated back from RoPE (dq NULL: the VLM's last layer; dk, dv NULL: cross)
static void flow_layer_qkv_backward(FlowVLA* m, const FlowLayer<floatX>* w, const FlowLayer<float>* g,
                                    const FlowLayerActs* x, float* dres, floatX* dres_x, const floatX* dq,
                                    const floatX* dk, const floatX* dv, int N) {
    FlowActivations* a = &m->acts;
    int C = w->C, D = flow_d_attn(&m->config), KV = flow_d_kv(&m->config);
    float beta = 0.0f;
    if (dq != NULL) {
        matmul_backward_input(a->g_ln, dq, w->wq, N, C, D, beta);
        if (g->wq != NULL) { matmul_backward_weight(g->wq, dq, x->ln1, N, C, D); }
        beta = 1.0f;
    }
    if (dk != NULL) {
        matmul_backward_input(a->g_ln, dk, w->wk, N, C, KV, beta);
        if (g->wk != NULL) { matmul_backward_weight(g->wk, dk, x->ln1, N, C, KV); }
        matmul_backward_input(a->g_ln, dv, w->wv, N, C, KV, 1.0f);
        if (g->wv != NULL) { matmul_backward_weight(g->wv, dv, x->ln1, N, C, KV); }
    }
    flow_rmsnorm_backward(m, dres, dres_x, g->ln1, a->g_ln, x->res, w->ln1, x->rstd1, N, C);
}

// ---- forward

// Every camera's frames -> acts.pixels (NV, 3, S, S), camera-major (image n = cam * B + b)
static void flow_prepare_images(FlowVLA* m, const ModelInputs* in) {
    const FlowConfig* c = &m->config;
    size_t per = (size_t)3 * c->img * c->img;
    for (int cam = 0; cam < c->n_cam; cam++) {
        resize_pad(m->acts.pixels + (size_t)cam * in->B * per, in->frames[cam], in->B, in->frame_h[cam],
                   in->frame_w[cam], c->img, in->frame_stride, 0, flow_pad_centred(c));
    }
}

// SigLIP's attention call of a layer: its images' own keys and values, no mask
static GqaAttn flow_vision_attn(const FlowVLA* m, const FlowVisionActs& x) {
    const FlowConfig* c = &m->config;
    int NV = (int)flow_images(c, m->B), Nv = flow_grid(c) * flow_grid(c);
    GqaAttn a = {.k0 = x.k, .v0 = x.v, .k1 = NULL, .v1 = NULL, .block = NULL, .B = NV, .NH = c->vis_heads,
                 .NKV = c->vis_heads, .HS = c->vis_width / c->vis_heads, .Tq = Nv, .q0 = 0, .Nk0 = Nv, .Nk1 = 0,
                 .Nt = Nv};
    return a;
}

// SigLIP layer l: x.res -> x.out. redo (the backward's recomputation): only what that level dropped,
// by the same kernels on the same inputs: attn the attention half, layer all but fc2.
static void flow_vision_layer_forward(FlowVLA* m, int l, int redo) {
    const FlowConfig* c = &m->config;
    int V = (int)flow_vrows(c, m->B), Cv = c->vis_width, Fv = c->vis_ff;
    FlowVisionActs x = flow_vision_acts(m, l);
    layernorm_forward(x.ln1, x.mean1, x.rstd1, x.res, flow_param(m, FLOWP_vis_ln1_w, l),
                      flow_param(m, FLOWP_vis_ln1_b, l), V, Cv);
    matmul_forward(x.q, x.ln1, flow_param(m, FLOWP_vis_wq, l), flow_param(m, FLOWP_vis_bq, l), NULL, V, Cv, Cv);
    matmul_forward(x.k, x.ln1, flow_param(m, FLOWP_vis_wk, l), flow_param(m, FLOWP_vis_bk, l), NULL, V, Cv, Cv);
    matmul_forward(x.v, x.ln1, flow_param(m, FLOWP_vis_wv, l), flow_param(m, FLOWP_vis_bv, l), NULL, V, Cv, Cv);
    gqa_attention_forward(x.att, x.lse, x.q, flow_vision_attn(m, x));
    if (redo == RECOMPUTE_ATTN) { return; }
    matmul_forward(x.mid, x.att, flow_param(m, FLOWP_vis_wo, l), flow_param(m, FLOWP_vis_bo, l), x.res, V, Cv,
                   Cv);
    layernorm_forward(x.ln2, x.mean2, x.rstd2, x.mid, flow_param(m, FLOWP_vis_ln2_w, l),
                      flow_param(m, FLOWP_vis_ln2_b, l), V, Cv);
    if (m->mode == TRAIN_MODE_ALL) {  // the backward pass reads fc1 (GELU's derivative)
        matmul_forward(x.fc1, x.ln2, flow_param(m, FLOWP_vis_fc1_w, l), flow_param(m, FLOWP_vis_fc1_b, l), NULL,
                       V, Cv, Fv);
        gelu_forward(x.gelu, x.fc1, (size_t)V * Fv);
    } else {  // a frozen tower: GELU in the product's epilogue
        matmul_forward_gelu(x.gelu, x.ln2, flow_param(m, FLOWP_vis_fc1_w, l), flow_param(m, FLOWP_vis_fc1_b, l),
                            V, Cv, Fv);
    }
    if (redo != RECOMPUTE_NONE) { return; }
    matmul_forward(x.out, x.gelu, flow_param(m, FLOWP_vis_fc2_w, l), flow_param(m, FLOWP_vis_fc2_b, l), x.mid, V,
                   Fv, Cv);
}

// SigLIP over every image: pixels -> acts.v_out (V, Cv); position ids are the identity
static void flow_vision_forward(FlowVLA* m) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int NV = (int)flow_images(c, m->B), Nv = flow_grid(c) * flow_grid(c), V = (int)flow_vrows(c, m->B);
    int Cv = c->vis_width;
    size_t VC = (size_t)V * Cv;
    LAUNCH_1D(patchify_chw_kernel, (size_t)V * flow_patch_dim(c), a->patches, a->pixels, NV, c->img, c->patch);
    matmul_forward(a->v_res, a->patches, m->params.vis_patch_w, m->params.vis_patch_b, NULL, V, flow_patch_dim(c),
                   Cv);
    LAUNCH_1D(add_periodic_kernel, VC, a->v_res, m->params.vis_pos, VC, (size_t)Nv * Cv);
    for (int l = 0; l < c->vis_layers; l++) { flow_vision_layer_forward(m, l, RECOMPUTE_NONE); }
    layernorm_forward(a->v_out, a->v_omean, a->v_orstd, flow_vision_acts(m, c->vis_layers - 1).out,
                      m->params.vis_post_w, m->params.vis_post_b, V, Cv);
}

// p_res[0] = [camera tokens][language][state (SmolVLA)] per sample, block ids and RoPE positions of
// [prefix ; suffix]; sqrt(C) in float32, for the image tokens too in SmolVLA. state_tok: the state's
// token, the prefix's last (SmolVLA) or the suffix's first (pi0: flow_suffix_embed places it).
static void flow_prefix_embed(FlowVLA* m, const ModelInputs* in) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = flow_image_tokens(c), Np = flow_n_prefix(c), Lt = c->max_text;
    int NV = (int)flow_images(c, B), S2C = c->scale_factor * c->scale_factor * c->vis_width, G = flow_grid(c);
    float scale = sqrtf((float)C);
    pixel_shuffle_forward(a->shuffled, a->v_out, NV, G, G, c->vis_width, c->scale_factor);
    matmul_forward(a->img_tok, a->shuffled, m->params.connector_w, m->params.connector_b, NULL, NV * NI, S2C, C);
    convert(a->state_x, in->state, (size_t)B * c->max_state_dim);
    matmul_forward(a->state_tok, a->state_x, m->params.state_w, m->params.state_b, NULL, B, c->max_state_dim,
                   flow_state_width(c));
    cudaCheck(cudaMemcpyAsync(a->tokens, in->tokens, (size_t)B * Lt * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                              main_stream));
    LAUNCH_1D(flow_prefix_embed_kernel, (size_t)B * Np * C, a->p_res, a->img_tok, m->params.embed_tokens, a->tokens,
              a->state_tok, B, c->n_cam, NI, Lt, Np, C, scale, flow_scales_images(c) ? scale : 1.0f);
    LAUNCH_1D(flow_sequence_kernel, B, a->block, a->pos, a->x_pos, in->token_mask, B, c->n_cam * NI, Lt, Np,
              flow_n_suffix(c), flow_actions_causal(c));
}

// VLM layer l; the last computes only ln1, keys and values. redo: keys and values kept at every level.
static void flow_vlm_layer_forward(FlowVLA* m, int l, int redo) {
    const FlowConfig* c = &m->config;
    int P = (int)flow_prows(c, m->B), Np = flow_n_prefix(c), T = Np + flow_n_suffix(c);
    int D = flow_d_attn(c), KV = flow_d_kv(c);
    FlowLayer<floatX> w = flow_layer<floatX>(m, 0, l, 0);
    FlowLayerActs x = flow_layer_acts(m, 0, l);
    rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, P, w.C, w.eps, w.offset);
    if (redo == RECOMPUTE_NONE) {
        matmul_forward(x.k, x.ln1, w.wk, NULL, NULL, P, w.C, KV);
        rope_at(x.k, x.k, m->rope_cos, m->rope_sin, m->acts.pos, P, Np, T, c->n_kv_head, c->head_dim, 1.0f);
        matmul_forward(x.v, x.ln1, w.wv, NULL, NULL, P, w.C, KV);
    }
    if (l == c->n_layer - 1) { return; }
    matmul_forward(x.q, x.ln1, w.wq, NULL, NULL, P, w.C, D);
    rope_at(x.q, x.q, m->rope_cos, m->rope_sin, m->acts.pos, P, Np, T, c->n_head, c->head_dim, 1.0f);
    gqa_attention_forward(x.att, x.lse, x.q, flow_attn(m, Np, 0, x.k, x.v, Np, NULL, NULL, 0));
    if (redo == RECOMPUTE_ATTN) { return; }
    flow_layer_out_forward(&w, &x, P, D, redo == RECOMPUTE_NONE);
}

static void flow_vlm_forward(FlowVLA* m) {
    for (int l = 0; l < m->config.n_layer; l++) { flow_vlm_layer_forward(m, l, RECOMPUTE_NONE); }
}

// s_res[0]: the action tokens action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time
// embedding]))), after pi0's state token (state_tok, made by flow_prefix_embed)
static void flow_suffix_embed(FlowVLA* m, const float* t) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, H = c->chunk, Ns = flow_n_suffix(c), Ce = c->d_expert, A = (int)flow_arows(c, B);
    matmul_forward(a->a_in, a->x_t, m->params.action_in_w, m->params.action_in_b, NULL, A, c->max_action_dim, Ce);
    LAUNCH_1D(action_embed_kernel, (size_t)A * 2 * Ce, a->a_emb, a->a_in, t, B, H, Ce);
    matmul_forward(a->t_pre, a->a_emb, m->params.time_in_w, m->params.time_in_b, NULL, A, 2 * Ce, Ce);
    LAUNCH_1D(silu_forward_kernel, (size_t)A * Ce, a->t_act, a->t_pre, (size_t)A * Ce);
    if (!flow_state_in_suffix(c)) {
        matmul_forward(a->s_res, a->t_act, m->params.time_out_w, m->params.time_out_b, NULL, A, Ce, Ce);
        return;
    }
    matmul_forward(a->a_tok, a->t_act, m->params.time_out_w, m->params.time_out_b, NULL, A, Ce, Ce);
    LAUNCH_1D(scatter_rows_kernel, (size_t)B * Ce, a->s_res, a->state_tok, B, Ns, 0, 1, Ce);
    LAUNCH_1D(scatter_rows_kernel, (size_t)A * Ce, a->s_res, a->a_tok, B, Ns, 1, H, Ce);
}

// Expert layer l over the suffix (the actions, after pi0's state token). Joint layer: the suffix's
// q/k/v with RoPE after the valid prefix, keys = [the VLM's K/V ; the suffix's own] under the block mask. Cross layer:
// q with RoPE from 0, keys/values = the VLM's post-RoPE K/V re-projected by the expert (no second RoPE).
// reuse_cross_kv: re-projections valid.
static void flow_expert_layer_forward(FlowVLA* m, int l, int reuse_cross_kv, int redo) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int R = (int)flow_rrows(c, m->B), P = (int)flow_prows(c, m->B), Np = flow_n_prefix(c);
    int H = flow_n_suffix(c), T = Np + H, D = flow_d_attn(c), KV = flow_d_kv(c), Ce = c->d_expert;
    FlowLayer<floatX> w = flow_layer<floatX>(m, 1, l, 0);
    FlowLayerActs x = flow_layer_acts(m, 1, l), px = flow_layer_acts(m, 0, l);
    rmsnorm_forward(x.ln1, x.rstd1, x.res, w.ln1, R, Ce, w.eps, w.offset);
    matmul_forward(x.q, x.ln1, w.wq, NULL, NULL, R, Ce, D);
    GqaAttn keys;
    if (!w.cross) {
        rope_at(x.q, x.q, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_head, c->head_dim, 1.0f);
        matmul_forward(x.k, x.ln1, w.wk, NULL, NULL, R, Ce, KV);
        rope_at(x.k, x.k, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_kv_head, c->head_dim, 1.0f);
        matmul_forward(x.v, x.ln1, w.wv, NULL, NULL, R, Ce, KV);
        keys = flow_attn(m, H, Np, px.k, px.v, Np, x.k, x.v, H);
    } else {
        rope_at(x.q, x.q, m->rope_cos, m->rope_sin, a->x_pos, R, H, H, c->n_head, c->head_dim, 1.0f);
        floatX* ck = a->c_k + (size_t)l * P * KV;
        floatX* cv = a->c_v + (size_t)l * P * KV;
        if (!reuse_cross_kv && redo == RECOMPUTE_NONE) {
            matmul_forward(ck, px.k, w.wk, NULL, NULL, P, KV, KV);
            matmul_forward(cv, px.v, w.wv, NULL, NULL, P, KV, KV);
        }
        keys = flow_attn(m, H, Np, ck, cv, Np, NULL, NULL, 0);
    }
    gqa_attention_forward(x.att, x.lse, x.q, keys);
    if (redo == RECOMPUTE_ATTN) { return; }
    flow_layer_out_forward(&w, &x, R, D, redo == RECOMPUTE_NONE);
}

// The expert's layers over s_res[0] -> final norm -> action_out_proj of the action rows (pi0's
// gathered into f_act first): acts.v_t (B, H, Amax), fp32
static void flow_expert_forward(FlowVLA* m, int reuse_cross_kv) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int R = (int)flow_rrows(c, m->B), A = (int)flow_arows(c, m->B), Ce = c->d_expert;
    for (int l = 0; l < c->n_layer; l++) { flow_expert_layer_forward(m, l, reuse_cross_kv, RECOMPUTE_NONE); }
    rmsnorm_forward(a->f_ln, a->f_rstd, a->s_res + (size_t)c->n_layer * R * Ce, m->params.exp_norm, R, Ce,
                    flow_rms_eps(c), flow_rms_offset(c));
    const floatX* actions = a->f_ln;
    if (flow_state_in_suffix(c)) {
        LAUNCH_1D(gather_rows_kernel, (size_t)A * Ce, a->f_act, a->f_ln, m->B, flow_n_suffix(c), 1, c->chunk, Ce);
        actions = a->f_act;
    }
    // the velocity in fp32: the bias in every row, the product added on it (beta = 1)
    LAUNCH_1D(bias_rows_kernel, (size_t)A * c->max_action_dim, a->v_t, m->params.action_out_b, A, c->max_action_dim);
    matmul_forward_accumulate_f32(a->v_t, actions, m->params.action_out_w, A, Ce, c->max_action_dim);
}

// Images, vision tower, prefix embeddings and the VLM: everything the actions attend to
static void flow_encode_prefix(FlowVLA* m, const ModelInputs* in) {
    flow_set_batch(m, in->B);
    prof_phase("images");
    flow_prepare_images(m, in);
    prof_phase("vision fwd");
    flow_vision_forward(m);
    prof_phase("prefix embed");
    flow_prefix_embed(m, in);
    prof_phase("vlm fwd");
    flow_vlm_forward(m);
}

// Training forward. Flow matching: x_t = t noise + (1 - t) actions, target u = noise - actions,
// velocity v_t. The loss is LeRobot's mean over valid entries of the whole step, so the forward only
// sums: errors into acts.scalars[0], entries into scalars[3]; flow_loss_finish divides.
static void flow_forward(FlowVLA* m, const ModelInputs* in, int micro) {
    const FlowConfig* c = &m->config;
    flow_encode_prefix(m, in);
    FlowActivations* a = &m->acts;
    int B = in->B, HA = c->chunk * c->max_action_dim, n = B * HA;
    prof_phase("expert fwd");
    LAUNCH_1D(flow_inputs_kernel, n, a->x_t, a->target, in->actions, in->noise, in->t, HA, n);
    flow_suffix_embed(m, in->t);
    flow_expert_forward(m, 0);
    prof_phase("loss");
    const float* is_pad = flow_loss_masks_pad(c) ? in->action_is_pad : NULL;  // pi0's loss counts every slot
    valid_entries_kernel<<<1, BLOCK, 0, main_stream>>>(a->scalars + 3, is_pad, B * c->chunk, c->action_dim, micro > 0);
    launchCheck();
    int blocks = ceil_div(n, BLOCK);
    flow_loss_kernel<<<blocks, BLOCK, 0, main_stream>>>(a->d_vt, a->loss_partial, a->v_t, a->target, is_pad,
                                                        c->action_dim, c->max_action_dim, n);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(a->scalars, a->loss_partial, blocks, 1.0, 0, micro > 0);
    launchCheck();
    if (m->scaler != NULL) {  // fp16: the backward starts from the scaled loss's gradient
        if (micro == 0) {
            int e = 0;
            while ((1LL << e) < (long long)c->chunk * c->action_dim) { e++; }
            loss_scale_begin_kernel<<<1, 1, 0, main_stream>>>(m->scaler, ldexpf(1.0f, -e));
            launchCheck();
        }
        LAUNCH_1D(loss_scale_grad_kernel, n, a->d_vt, n, m->scaler);
    }
}

// Once the sums hold every micro-step and rank: the mean loss, and the gradients scaled to the mean's
static void flow_loss_finish(FlowVLA* m) {
    loss_normalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars);
    launchCheck();
    if (m->scaler != NULL) {
        loss_unscale_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars, m->scaler);
        launchCheck();
    }
    size_t n = m->shard_hi - m->shard_lo;
    LAUNCH_1D(scale_kernel, n, m->grads_memory + m->shard_lo, n, m->acts.scalars + 4);
}

// ---- backward

// d acts.d_vt -> the expert -> d s_res[0] in g_res / g_res_x (R, Ce); VLM k/v gradients into dp_k/dp_v
static void flow_expert_backward(FlowVLA* m, int state_only) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, R = (int)flow_rrows(c, B), A = (int)flow_arows(c, B), P = (int)flow_prows(c, B);
    int Np = flow_n_prefix(c), H = flow_n_suffix(c), T = Np + H, D = flow_d_attn(c), KV = flow_d_kv(c);
    int Ce = c->d_expert, L = c->n_layer;
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    if (!flow_state_in_suffix(c)) {
        matmul_backward_input(a->g_ln, a->d_vt, m->params.action_out_w, A, Ce, c->max_action_dim, 0.0f);
        matmul_backward_weight(m->grads.action_out_w, a->d_vt, a->f_ln, A, Ce, c->max_action_dim);
    } else {  // the action rows' gradients into place; the state rows' output feeds nothing
        matmul_backward_input(a->g_tok, a->d_vt, m->params.action_out_w, A, Ce, c->max_action_dim, 0.0f);
        matmul_backward_weight(m->grads.action_out_w, a->d_vt, a->f_act, A, Ce, c->max_action_dim);
        cudaCheck(cudaMemsetAsync(a->g_ln, 0, (size_t)R * Ce * sizeof(floatX), main_stream));
        LAUNCH_1D(scatter_rows_kernel, (size_t)A * Ce, a->g_ln, a->g_tok, B, H, 1, c->chunk, Ce);
    }
    bias_backward(m->grads.action_out_b, a->partial, a->d_vt, A, c->max_action_dim);
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)R * Ce * sizeof(float), main_stream));
    flow_rmsnorm_backward(m, dres, dres_x, m->grads.exp_norm, a->g_ln, a->s_res + (size_t)L * R * Ce,
                          m->params.exp_norm, a->f_rstd, R, Ce);
    for (int l = L - 1; l >= 0; l--) {
        if (m->recompute != RECOMPUTE_NONE) { flow_expert_layer_forward(m, l, 0, m->recompute); }
        FlowLayer<floatX> w = flow_layer<floatX>(m, 1, l, 0);
        FlowLayer<float> g = flow_layer<float>(m, 1, l, 1);
        FlowLayerActs x = flow_layer_acts(m, 1, l), px = flow_layer_acts(m, 0, l);
        float* dpk = a->dp_k + (size_t)l * P * KV;
        float* dpv = a->dp_v + (size_t)l * P * KV;
        flow_layer_out_backward(m, &w, &g, &x, dres, dres_x, R, D);
        if (!w.cross) {
            cudaCheck(cudaMemsetAsync(a->g_kf, 0, (size_t)R * KV * sizeof(float), main_stream));
            cudaCheck(cudaMemsetAsync(a->g_vf, 0, (size_t)R * KV * sizeof(float), main_stream));
            gqa_attention_backward(a->g_q, dpk, dpv, a->g_kf, a->g_vf, a->g_att, x.q, x.att, x.lse, a->delta,
                                   flow_attn(m, H, Np, px.k, px.v, Np, x.k, x.v, H));
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_head, c->head_dim, -1.0f);
            rope_at(a->g_kx, a->g_kf, m->rope_cos, m->rope_sin, a->pos + Np, R, H, T, c->n_kv_head, c->head_dim, -1.0f);
            convert(a->g_vx, a->g_vf, (size_t)R * KV);
            flow_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, a->g_q, a->g_kx, a->g_vx, R);
        } else {
            floatX* ck = a->c_k + (size_t)l * P * KV;
            floatX* cv = a->c_v + (size_t)l * P * KV;
            cudaCheck(cudaMemsetAsync(a->g_kf, 0, (size_t)P * KV * sizeof(float), main_stream));
            cudaCheck(cudaMemsetAsync(a->g_vf, 0, (size_t)P * KV * sizeof(float), main_stream));
            // every prefix row's: the cross k_proj/v_proj weights need them all
            gqa_attention_backward(a->g_q, a->g_kf, a->g_vf, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta,
                                   flow_attn(m, H, Np, ck, cv, Np, NULL, NULL, 0));
            convert(a->g_kx, a->g_kf, (size_t)P * KV);
            convert(a->g_vx, a->g_vf, (size_t)P * KV);
            matmul_backward_weight(g.wk, a->g_kx, px.k, P, KV, KV);
            matmul_backward_weight(g.wv, a->g_vx, px.v, P, KV, KV);
            // through the re-projection into the VLM's post-RoPE K/V (fp32, accumulated)
            size_t first = state_only ? (size_t)(Np - 1) * KV : 0;
            int rows = state_only ? B : P, ld = state_only ? Np * KV : KV;
            matmul_backward_input_accumulate_f32(dpk + first, a->g_kx + first, w.wk, rows, KV, KV, ld, ld);
            matmul_backward_input_accumulate_f32(dpv + first, a->g_vx + first, w.wv, rows, KV, KV, ld, ld);
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->x_pos, R, H, H, c->n_head, c->head_dim, -1.0f);
            flow_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, a->g_q, NULL, NULL, R);
        }
        flow_bucket_done(m, flow_bucket(c, TOWER_EXPERT, l));
    }
}

// d s_res[0] (g_res_x) -> action_time_mlp_out, SiLU, action_time_mlp_in -> action_in_proj; pi0's
// state token -> state_proj
static void flow_suffix_embed_backward(FlowVLA* m) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, R = (int)flow_arows(c, B), Ce = c->d_expert;
    const floatX* dtok = a->g_res_x;  // (A, Ce) d of the action tokens
    if (flow_state_in_suffix(c)) {  // the suffix's rows apart: the action tokens into g_ln, the states
        int Ns = flow_n_suffix(c);
        LAUNCH_1D(gather_rows_kernel, (size_t)B * Ce, a->g_state, a->g_res_x, B, Ns, 0, 1, Ce);
        LAUNCH_1D(gather_rows_kernel, (size_t)R * Ce, a->g_ln, a->g_res_x, B, Ns, 1, c->chunk, Ce);
        matmul_backward_weight(m->grads.state_w, a->g_state, a->state_x, B, c->max_state_dim, Ce);
        bias_backward(m->grads.state_b, a->partial, a->g_state, B, Ce);
        dtok = a->g_ln;
    }
    floatX* dtact = a->g_tok;  // (A, Ce)
    matmul_backward_input(dtact, dtok, m->params.time_out_w, R, Ce, Ce, 0.0f);
    matmul_backward_weight(m->grads.time_out_w, dtok, a->t_act, R, Ce, Ce);
    bias_backward(m->grads.time_out_b, a->partial, dtok, R, Ce);
    LAUNCH_1D(silu_backward_kernel, (size_t)R * Ce, dtact, dtact, a->t_pre, (size_t)R * Ce);
    matmul_backward_input(a->g_emb, dtact, m->params.time_in_w, R, 2 * Ce, Ce, 0.0f);
    matmul_backward_weight(m->grads.time_in_w, dtact, a->a_emb, R, 2 * Ce, Ce);
    bias_backward(m->grads.time_in_b, a->partial, dtact, R, Ce);
    // only the action_in half of g_emb has parameters behind it: read it with row stride 2 Ce
    matmul_backward_weight(m->grads.action_in_w, a->g_emb, a->x_t, R, c->max_action_dim, Ce, 2 * Ce);
    bias_backward(m->grads.action_in_b, a->partial, a->g_emb, R, Ce, 2 * Ce);
}

// The state rows (row Np - 1 of each sample) of a VLM layer's x into the r_*: B rows of one query
static FlowLayerActs flow_state_rows(FlowVLA* m, const FlowLayerActs* x, int last) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, Np = flow_n_prefix(c), C = c->d_model, F = c->d_ff, D = flow_d_attn(c);
    FlowLayerActs r = {a->r_res,  a->r_ln1, a->r_q,   NULL, NULL,       a->r_att, a->r_mid,  a->r_ln2,
                       a->r_gate, a->r_up,  a->r_act, NULL, a->r_rstd1, a->r_lse, a->r_rstd2};
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.res, x->res, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.ln1, x->ln1, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B, r.rstd1, x->rstd1, B, Np, Np - 1, 1, 1);
    if (last) { return r; }  // the last layer: ln1, k and v only
    LAUNCH_1D(gather_rows_kernel, (size_t)B * D, r.q, x->q, B, Np, Np - 1, 1, D);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * D, r.att, x->att, B, Np, Np - 1, 1, D);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * c->n_head, r.lse, x->lse, B * c->n_head, Np, Np - 1, 1, 1);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.mid, x->mid, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * C, r.ln2, x->ln2, B, Np, Np - 1, 1, C);
    LAUNCH_1D(gather_rows_f32_kernel, (size_t)B, r.rstd2, x->rstd2, B, Np, Np - 1, 1, 1);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.gate, x->gate, B, Np, Np - 1, 1, F);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.up, x->up, B, Np, Np - 1, 1, F);
    LAUNCH_1D(gather_rows_kernel, (size_t)B * F, r.act, x->act, B, Np, Np - 1, 1, F);
    return r;
}

// The VLM's layers backward from dp_k, dp_v down to d p_res[0] in g_res / g_res_x (P rows, or B state
// rows). The last layer (ln1 -> k/v) is frozen in every mode, yet the gradient passes through it.
static void flow_vlm_backward(FlowVLA* m, int state_only) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, P = (int)flow_prows(c, B), Np = flow_n_prefix(c), T = Np + flow_n_suffix(c);
    int D = flow_d_attn(c), KV = flow_d_kv(c);
    int N = state_only ? B : P;  // rows taken down
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * c->d_model * sizeof(float), main_stream));
    for (int l = c->n_layer - 1; l >= 0; l--) {
        int last = l == c->n_layer - 1;
        if (m->recompute != RECOMPUTE_NONE) {
            flow_vlm_layer_forward(m, l, m->recompute);
        }  // every row: same kernels
        FlowLayer<floatX> w = flow_layer<floatX>(m, 0, l, 0);
        FlowLayer<float> g = flow_layer<float>(m, 0, l, 1);
        FlowLayerActs all = flow_layer_acts(m, 0, l);
        FlowLayerActs x = state_only ? flow_state_rows(m, &all, last) : all;
        float* dk = a->dp_k + (size_t)l * P * KV;
        float* dv = a->dp_v + (size_t)l * P * KV;
        const floatX* dq = NULL;
        if (!last) {
            flow_layer_out_backward(m, &w, &g, &x, dres, dres_x, N, D);
            // the taken rows' queries (the state's, token Np - 1, or all) over every prefix key
            GqaAttn keys =
                flow_attn(m, state_only ? 1 : Np, state_only ? Np - 1 : 0, all.k, all.v, Np, NULL, NULL, 0);
            gqa_attention_backward(a->g_q, dk, dv, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta, keys);
            rope_at(a->g_q, a->g_q, m->rope_cos, m->rope_sin, a->pos + (state_only ? Np - 1 : 0), N, N / B, T,
                    c->n_head, c->head_dim, -1.0f);
            dq = a->g_q;
        }
        if (state_only) {  // the state rows of this layer's key/value gradients
            LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * KV, a->r_dk, dk, B, Np, Np - 1, 1, KV);
            LAUNCH_1D(gather_rows_f32_kernel, (size_t)B * KV, a->r_dv, dv, B, Np, Np - 1, 1, KV);
            dk = a->r_dk;
            dv = a->r_dv;
        }
        rope_at(a->g_kx, dk, m->rope_cos, m->rope_sin, a->pos + (state_only ? Np - 1 : 0), N, N / B, T, c->n_kv_head,
                c->head_dim, -1.0f);
        convert(a->g_vx, dv, (size_t)N * KV);
        flow_layer_qkv_backward(m, &w, &g, &x, dres, dres_x, dq, a->g_kx, a->g_vx, N);
        flow_bucket_done(m, flow_bucket(c, TOWER_VLM, l));
    }
}

// d p_res[0] -> state_proj (SmolVLA's state token); embed_tokens (not the pad id's row) and the
// connector; g_shuf = d shuffled
static void flow_prefix_embed_backward(FlowVLA* m, int state_only) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int B = m->B, C = c->d_model, NI = flow_image_tokens(c), Np = flow_n_prefix(c), Lt = c->max_text;
    int NV = (int)flow_images(c, B), S2C = c->scale_factor * c->scale_factor * c->vis_width;
    float scale = sqrtf((float)C);
    if (!flow_state_in_suffix(c)) {  // the state rows: row Np - 1 of each sample, or the B rows of state_only
        const floatX* dstate = state_only ? a->g_res_x : a->g_res_x + (size_t)(Np - 1) * C;
        int ld = state_only ? C : Np * C;
        matmul_backward_weight(m->grads.state_w, dstate, a->state_x, B, c->max_state_dim, C, ld);
        bias_backward(m->grads.state_b, a->partial, dstate, B, C, ld);
    }
    if (state_only) { return; }
    if (m->grads.embed_tokens != NULL) {
        embed_tokens_backward_kernel<<<B * Lt, BLOCK, 0, main_stream>>>(m->grads.embed_tokens, a->g_res, a->tokens, B,
                                                                        c->n_cam * NI, Lt, Np, C, c->pad_token, scale);
        launchCheck();
    }
    if (m->grads.connector_w == NULL) { return; }
    LAUNCH_1D(prefix_image_grad_kernel, (size_t)NV * NI * C, a->g_img, a->g_res, B, c->n_cam, NI, Np, C,
              flow_scales_images(c) ? scale : 1.0f);
    matmul_backward_weight(m->grads.connector_w, a->g_img, a->shuffled, NV * NI, S2C, C);
    if (m->grads.connector_b != NULL) { bias_backward(m->grads.connector_b, a->partial, a->g_img, NV * NI, C); }
    if (m->grads.vis_post_w != NULL) {
        matmul_backward_input(a->g_shuf, a->g_img, m->params.connector_w, NV * NI, S2C, C, 0.0f);
    }
}

// d shuffled (g_shuf) -> pixel shuffle -> post_layernorm -> SigLIP layers -> patch embeddings
static void flow_vision_backward(FlowVLA* m) {
    const FlowConfig* c = &m->config;
    FlowActivations* a = &m->acts;
    int NV = (int)flow_images(c, m->B), G = flow_grid(c), Nv = G * G, V = (int)flow_vrows(c, m->B);
    int Cv = c->vis_width, Fv = c->vis_ff;
    size_t VC = (size_t)V * Cv;
    float* dres = a->g_res;
    floatX* dres_x = a->g_res_x;
    pixel_shuffle_backward(a->g_ln, a->g_shuf, NV, G, G, Cv, c->scale_factor);  // d v_out
    cudaCheck(cudaMemsetAsync(dres, 0, VC * sizeof(float), main_stream));
    layernorm_backward(dres, dres_x, m->grads.vis_post_w, m->grads.vis_post_b, a->partial, a->g_ln,
                       flow_vision_acts(m, c->vis_layers - 1).out, m->params.vis_post_w, a->v_omean, a->v_orstd, V,
                       Cv);
    for (int l = c->vis_layers - 1; l >= 0; l--) {
        if (m->recompute != RECOMPUTE_NONE) { flow_vision_layer_forward(m, l, m->recompute); }
        FlowVisionActs x = flow_vision_acts(m, l);
        // MLP: out = mid + fc2(gelu(fc1(ln2(mid))))
        matmul_backward_input(a->g_act, dres_x, flow_param(m, FLOWP_vis_fc2_w, l), V, Fv, Cv, 0.0f);
        matmul_backward_weight(flow_grad(m, FLOWP_vis_fc2_w, l), dres_x, x.gelu, V, Fv, Cv);
        bias_backward(flow_grad(m, FLOWP_vis_fc2_b, l), a->partial, dres_x, V, Cv);
        gelu_backward(a->g_gate, a->g_act, x.fc1, (size_t)V * Fv);
        matmul_backward_input(a->g_ln, a->g_gate, flow_param(m, FLOWP_vis_fc1_w, l), V, Cv, Fv, 0.0f);
        matmul_backward_weight(flow_grad(m, FLOWP_vis_fc1_w, l), a->g_gate, x.ln2, V, Cv, Fv);
        bias_backward(flow_grad(m, FLOWP_vis_fc1_b, l), a->partial, a->g_gate, V, Fv);
        layernorm_backward(dres, dres_x, flow_grad(m, FLOWP_vis_ln2_w, l), flow_grad(m, FLOWP_vis_ln2_b, l),
                           a->partial, a->g_ln, x.mid, flow_param(m, FLOWP_vis_ln2_w, l), x.mean2, x.rstd2, V, Cv);
        // attention: mid = x + out_proj(attention(q, k, v))
        matmul_backward_input(a->g_att, dres_x, flow_param(m, FLOWP_vis_wo, l), V, Cv, Cv, 0.0f);
        matmul_backward_weight(flow_grad(m, FLOWP_vis_wo, l), dres_x, x.att, V, Cv, Cv);
        bias_backward(flow_grad(m, FLOWP_vis_bo, l), a->partial, dres_x, V, Cv);
        gqa_attention_backward(a->g_q, a->g_kf, a->g_vf, NULL, NULL, a->g_att, x.q, x.att, x.lse, a->delta,
                               flow_vision_attn(m, x), a->g_kx, a->g_vx);  // (dk, dv in floatX)
        const floatX* dqkv[3] = {a->g_q, a->g_kx, a->g_vx};
        const int wi[3] = {FLOWP_vis_wq, FLOWP_vis_wk, FLOWP_vis_wv},
                  bi[3] = {FLOWP_vis_bq, FLOWP_vis_bk, FLOWP_vis_bv};
        for (int j = 0; j < 3; j++) {
            matmul_backward_input(a->g_ln, dqkv[j], flow_param(m, wi[j], l), V, Cv, Cv, j > 0 ? 1.0f : 0.0f);
            matmul_backward_weight(flow_grad(m, wi[j], l), dqkv[j], x.ln1, V, Cv, Cv);
            bias_backward(flow_grad(m, bi[j], l), a->partial, dqkv[j], V, Cv);
        }
        layernorm_backward(dres, dres_x, flow_grad(m, FLOWP_vis_ln1_w, l), flow_grad(m, FLOWP_vis_ln1_b, l),
                           a->partial, a->g_ln, x.res, flow_param(m, FLOWP_vis_ln1_w, l), x.mean1, x.rstd1, V, Cv);
        flow_bucket_done(m, flow_bucket(c, TOWER_VISION, l));
    }
    // patch i's position row, summed over the images in order; the patch embedding
    LAUNCH_1D(pos_emb_backward_kernel, (size_t)Nv * Cv, m->grads.vis_pos, dres, NV, Nv, Nv, Cv);
    matmul_backward_weight(m->grads.vis_patch_w, dres_x, a->patches, V, flow_patch_dim(c), Cv);
    bias_backward(m->grads.vis_patch_b, a->partial, dres_x, V, Cv);
}

// Gradients of the last forward's loss sum into grads_memory (overwritten when zero_grads), each bucket
// averaged once final. The expert first, then the VLM, as far down as something trains:
//   expert: the expert, its heads, state_proj; only SmolVLA's state row goes back through the frozen
//           VLM (pi0's state token is the expert's: nothing goes into the VLM).
//   vlm:    the whole prefix back into embed_tokens and the connector.
//   all:    and on through the vision tower.
static void flow_backward(FlowVLA* m, int zero_grads) {
    const FlowConfig* c = &m->config;
    int state_only = m->mode == TRAIN_MODE_EXPERT;
    int into_vlm = !(state_only && flow_state_in_suffix(c));
    prof_phase("expert bwd");
    if (zero_grads) { cudaCheck(cudaMemsetAsync(m->grads_memory, 0, m->n_train * sizeof(float), main_stream)); }
    size_t kv = (size_t)c->n_layer * flow_prows(c, m->B) * flow_d_kv(c);
    cudaCheck(cudaMemsetAsync(m->acts.dp_k, 0, kv * sizeof(float), main_stream));
    cudaCheck(cudaMemsetAsync(m->acts.dp_v, 0, kv * sizeof(float), main_stream));
    flow_expert_backward(m, state_only);
    flow_suffix_embed_backward(m);
    flow_bucket_done(m, flow_bucket(c, TOWER_EXPERT, -1));
    if (into_vlm) {
        prof_phase("vlm bwd");
        flow_vlm_backward(m, state_only);
        prof_phase("prefix bwd");
        flow_prefix_embed_backward(m, state_only);
    }
    flow_bucket_done(m, flow_bucket(c, TOWER_VLM, -1));
    if (m->mode == TRAIN_MODE_ALL) {
        prof_phase("vision bwd");
        flow_vision_backward(m);
        flow_bucket_done(m, flow_bucket(c, TOWER_VISION, -1));
    }
}

// After a step's last backward: loss sums, entries and stop flag summed over the ranks, then the means
static void flow_grads_finish(FlowVLA* m, int stop) {
    LAUNCH_1D(fill_kernel, 1, m->acts.scalars + 2, stop ? 1.0f : 0.0f, 1);
    dist_step_sums(m->dist, m->grads_memory, m->shard_lo, m->shard_hi, flow_sharded(m), m->acts.scalars);
    flow_loss_finish(m);
}

// ---- sampling

// Euler steps of dx/dt = v(x, t) in acts.x_sample from t = 1 to 0, as LeRobot's euler_integrate:
// t = float(1 + k dt), dt = -1/n_steps in double, x += float(dt) v. A CUDA graph of it replays.
static void flow_euler_steps(FlowVLA* m) {
    FlowActivations* a = &m->acts;
    int B = m->B, n = (int)flow_arows(&m->config, B) * m->config.max_action_dim, n_steps = 10;
    convert(a->x_t, a->x_sample, n);
    double dt = -1.0 / n_steps;
    for (int k = 0; k < n_steps; k++) {
        LAUNCH_1D(fill_kernel, B, a->t_sample, (float)(1.0 + k * dt), B);
        flow_suffix_embed(m, a->t_sample);
        flow_expert_forward(m, k > 0);
        LAUNCH_1D(euler_step_f32_kernel, n, a->x_sample, a->x_t, a->v_t, (float)dt, n);
    }
}

// Noise (B, H, Amax, device) -> out (B, H, Amax, host): the prefix once, then the Euler steps (a CUDA graph)
static void flow_sample(FlowVLA* m, const ModelInputs* in, const float* noise, float* out) {
    FlowSampling* s = &m->sampling;
    if (s->marks[0] == NULL) {
        for (int k = 0; k < 3; k++) { cudaCheck(cudaEventCreate(&s->marks[k])); }
    }
    int profiled = ++s->calls == s->profile_call;
    double t0 = wall_seconds();
    if (profiled) { prof_begin(); }
    cudaCheck(cudaEventRecord(s->marks[0], main_stream));
    flow_encode_prefix(m, in);
    prof_phase("euler steps");
    FlowActivations* a = &m->acts;
    int n = (int)flow_arows(&m->config, in->B) * m->config.max_action_dim;
    cudaCheck(cudaMemcpyAsync(a->x_sample, noise, n * sizeof(float), cudaMemcpyDeviceToDevice, main_stream));
    cudaCheck(cudaEventRecord(s->marks[1], main_stream));
    if (!s->use_graph || !s->warm || profiled) {
        flow_euler_steps(m);
        s->warm = 1;
    } else {
        if (s->graph == NULL) {
            cudaGraph_t graph = NULL;
            cudaCheck(cudaStreamBeginCapture(main_stream, cudaStreamCaptureModeThreadLocal));
            flow_euler_steps(m);
            cudaCheck(cudaStreamEndCapture(main_stream, &graph));
            cudaCheck(cudaGraphInstantiate(&s->graph, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
        }
        cudaCheck(cudaGraphLaunch(s->graph, main_stream));
    }
    cudaCheck(cudaEventRecord(s->marks[2], main_stream));
    cudaCheck(cudaMemcpyAsync(out, a->x_sample, n * sizeof(float), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaEventElapsedTime(&s->ms[k], s->marks[k], s->marks[k + 1]));
        s->launches[k] = event_launches(s->marks[k], s->marks[k + 1]);
    }
    if (profiled) { prof_end("sampling call", s->calls, 1000.0 * (wall_seconds() - t0)); }
}

// ---- optimizer: AdamW on the trainable elements only

// The trainable gradients' global norm into acts.scalars[1], a fixed grid; ZeRO-1 ranks add their sums
static void flow_global_norm(FlowVLA* m) {
    int sharded = flow_sharded(m);
    norm_squares_kernel<<<NORM_BLOCKS, BLOCK, 0, main_stream>>>(m->norm_partial, m->grads_memory + m->shard_lo,
                                                                 m->shard_hi - m->shard_lo);
    launchCheck();
    sum_finalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars + 1, m->norm_partial, NORM_BLOCKS, 1.0, !sharded, 0);
    launchCheck();
    if (sharded) {
        dist_sum(m->dist, m->acts.scalars + 1, 1);
        sum_finalize_kernel<<<1, 1, 0, main_stream>>>(m->acts.scalars + 1, m->acts.scalars + 1, 1, 1.0, 1, 0);
        launchCheck();
    }
}

// AdamW (0.9, 0.95, 1e-8) on the shard's trainable master weights, a launch per tensor, decoupled decay
// where the table or decay_on (DECAY_ON_*) says; the floatX copy refreshed (ZeRO-1: all-gathered).
// fp16: an Inf/NaN step changes only the loss scale, yet counts.
static void flow_update(FlowVLA* m, float lr, float weight_decay, int decay_on, float clip, int step) {
    const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
    flow_global_norm(m);
    float bc1 = 1.0f - powf(beta1, (float)(step + 1)), bc2 = 1.0f - powf(beta2, (float)(step + 1));
    size_t lo = m->shard_lo;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        size_t first, n = zero_part(m->domain.offset[i], m->domain.numel[i], lo, m->shard_hi, &first);
        if (n == 0) { continue; }
        size_t a = m->domain.offset[i] + first;  // in the domain; the state arrays start at lo
        LAUNCH_1D(adamw_kernel, n, m->master + (a - lo), m->params_memory + a, m->grads_memory + a,
                  m->m_memory + (a - lo), m->v_memory + (a - lo), n, lr, beta1, beta2, eps,
                  flow_decay(&m->table.spec[i], weight_decay, decay_on), bc1, bc2, m->acts.scalars + 1, clip);
    }
    if (m->scaler != NULL) {
        loss_scale_update_kernel<<<1, 1, 0, main_stream>>>(m->scaler, m->acts.scalars + 1, m->loss_scale_window,
                                                           VLA_LOSS_SCALE_MAX);
        launchCheck();
    }
    if (flow_sharded(m)) { dist_gather_params(m->dist, m->params_memory, m->shard_lo, m->shard_hi); }
}

// Loss, gradient norm (before clipping) and stop flag of the last step over every rank, waiting for them
static void flow_read_scalars(FlowVLA* m, float* loss, float* norm, int* stop = NULL) {
    float s[3];
    cudaCheck(cudaMemcpyAsync(s, m->acts.scalars, sizeof(s), cudaMemcpyDeviceToHost, main_stream));
    cudaCheck(cudaStreamSynchronize(main_stream));
    if (loss != NULL) { *loss = s[0]; }
    if (norm != NULL) { *norm = s[1]; }
    if (stop != NULL) { *stop = s[2] > 0.0f; }
}


// ---- checkpoints

// Writes a checkpoint (rank 0): every weight in fp32, and the moments; every rank calls it (ZeRO-1)
static void flow_save(FlowVLA* m, float* params, const Dataset* ds, const TrainArgs* args, int step,
                      uint64_t sampler_pos, int write, const LossScaleState* loss_scale) {
    if (!write && !flow_sharded(m)) { return; }
    size_t total = m->n_train;
    float* gathered = NULL;  // ZeRO-1: room for one state array's shards, gathered
    if (flow_sharded(m)) { cudaCheck(cudaMalloc(&gathered, total * sizeof(float))); }
    float* host = write ? (float*)mallocCheck(3 * total * sizeof(float)) : NULL;
    const float* state[3] = {m->master, m->m_memory, m->v_memory};
    for (int k = 0; k < 3; k++) {
        const float* whole = dist_gather_state(m->dist, gathered, state[k], m->shard_lo, m->shard_hi, flow_sharded(m));
        if (!write) { continue; }
        cudaCheck(cudaMemcpyAsync(host + k * total, whole, total * sizeof(float), cudaMemcpyDeviceToHost, main_stream));
        cudaCheck(cudaStreamSynchronize(main_stream));
    }
    cudaCheck(cudaStreamSynchronize(main_stream));  // (the gathers are done before their buffer goes)
    if (write) {
        for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
            memcpy(params + m->table.spec[i].offset, host + m->domain.offset[i], m->domain.numel[i] * sizeof(float));
        }
        run_checkpoint_save(args, ds, &m->config, step, sampler_pos, params, m->table.total, host + total,
                            host + 2 * total, m->n_opt, loss_scale);
    }
    free(host);
    if (gathered != NULL) { cudaCheck(cudaFree(gathered)); }
}

// ---- the flow_ policy: the interface's functions over FlowVLA

static void flow_config_buckets(const FlowConfig* c, int mode, Buckets* out) {
    FlowParamTable t;
    FlowOptDomain domain;
    flow_table_build(c, &t);
    flow_opt_domain(&t, mode, &domain);
    flow_buckets_build(out, c, &t, &domain);
}

// The attention kernels of the vision tower and the masked attention (attention_version chooses)
static void flow_config_rows(const FlowConfig* c) {
    const char* attention_rows[2] = {"vision attention", "masked attention"};
    int head_sizes[2] = {c->vis_width / c->vis_heads, c->head_dim};
    for (int k = 0; k < 2; k++) {
        int fwd = attention_version(head_sizes[k], false, true), bwd = attention_version(head_sizes[k], true, true);
        if (fwd == bwd) { table_row(attention_rows[k], "%s", attention_version_name(fwd)); }
        else { table_row(attention_rows[k], "%s (backward v%d)", attention_version_name(fwd), bwd); }
    }
}

static void* flow_new(const FlowConfig* c, int mode, int rc, int shard_rank, int shard_world, struct Dist* dist) {
    FlowVLA* m = (FlowVLA*)mallocCheck(sizeof(FlowVLA));
    flow_build(m, c, mode, shard_rank, shard_world);
    flow_set_recompute(m, rc);
    m->dist = dist;
    return m;
}

static ModelHeld flow_held(const void* model) {
    const FlowVLA* m = (const FlowVLA*)model;
    return ModelHeld{m->device_bytes, m->act_bytes, m->buckets.n};
}

// Each sample's squared errors and valid entries of the last forward (pi0's loss counts every slot)
static void flow_sample_losses(void* model, const ModelInputs* in, float* sums) {
    const FlowVLA* m = (const FlowVLA*)model;
    const FlowConfig* c = &m->config;
    const float* is_pad = flow_loss_masks_pad(c) ? in->action_is_pad : NULL;
    sample_loss_kernel<<<in->B, BLOCK, 0, main_stream>>>(sums, m->acts.v_t, m->acts.target, is_pad, c->chunk,
                                                         c->action_dim, c->max_action_dim);
    launchCheck();
}

// (the casts from the interface's opaque model)
#define FLOW_AS_(m) ((FlowVLA*)(m))
static void flow_set_params_(void* m, const float* p, const float* m1, const float* m2) {
    flow_set_params(FLOW_AS_(m), p, m1, m2);
}
static void flow_set_loss_scale_(void* m, const LossScaleState* st, int w) { flow_set_loss_scale(FLOW_AS_(m), st, w); }
static void flow_set_batch_(void* m, int B) { flow_set_batch(FLOW_AS_(m), B); }
static void flow_delete(void* m) { flow_free(FLOW_AS_(m)); free(m); }
static void flow_forward_(void* m, const ModelInputs* in, int micro) { flow_forward(FLOW_AS_(m), in, micro); }
static void flow_backward_(void* m, int zero_grads) { flow_backward(FLOW_AS_(m), zero_grads); }
static void flow_grads_finish_(void* m, int stop) { flow_grads_finish(FLOW_AS_(m), stop); }
static void flow_update_(void* m, float lr, float wd, int decay_on, float clip, int step) {
    flow_update(FLOW_AS_(m), lr, wd, decay_on, clip, step);
}
static void flow_read_scalars_(void* m, float* loss, float* norm, int* stop) {
    flow_read_scalars(FLOW_AS_(m), loss, norm, stop);
}
static int flow_read_loss_scale_(void* m, LossScaleState* st, float* used) {
    return flow_read_loss_scale(FLOW_AS_(m), st, used);
}
static void flow_save_(void* m, float* params, const Dataset* ds, const TrainArgs* args, int step, uint64_t pos,
                       int write, const LossScaleState* loss_scale) {
    flow_save(FLOW_AS_(m), params, ds, args, step, pos, write, loss_scale);
}
static void flow_sample_(void* m, const ModelInputs* in, const float* noise, float* out) {
    flow_sample(FLOW_AS_(m), in, noise, out);
}
#undef FLOW_AS_

static const Policy FLOW_POLICY = {
    .sizes = {flow_model_parts, flow_act_bytes, flow_flops_per_sample, flow_recompute_flops_per_sample},
    .problem = flow_gpu_problem, .param_counts = flow_param_counts, .buckets = flow_config_buckets,
    .config_rows = flow_config_rows, .init_params = flow_init_params,
    .build = flow_new, .set_params = flow_set_params_, .set_loss_scale = flow_set_loss_scale_,
    .set_batch = flow_set_batch_, .held = flow_held,
    .forward = flow_forward_, .sample_losses = flow_sample_losses, .backward = flow_backward_,
    .grads_finish = flow_grads_finish_, .update = flow_update_, .read_scalars = flow_read_scalars_,
    .read_loss_scale = flow_read_loss_scale_,
    .save = flow_save_, .sample = flow_sample_, .free = flow_delete,
};

// ----------------------------------------------------------------------------
// data parallel: one rank per GPU, a host thread each; gradients summed bucket by bucket (NCCL),
// ZeRO-1 with --zero, a watchdog (vla/watchdog.h). Without NCCL, the stand-ins at its end.

// What the ranks of a run share, read-only once they train
typedef struct {
    TrainArgs args;
    Dataset ds;
    FlowConfig config;
    const char* from;      // checkpoint to start from, or NULL: from the seed
    Checkpoint initial;    // the starting weights (and moments), read or drawn once; the moments go once
                           // every rank has them, the weights stay: checkpoints take the frozen ones
    int start;             // optimizer steps already done
    uint64_t sampler_pos;  // global samples consumed before `start`
    LossScaleState loss_scale;  // fp16 builds: the dynamic loss scale the run starts with
    const Policy* policy;  // what trains: the functions of config's policy (policy_of)
    int world;             // ranks over all nodes
    int local_ranks;       // GPUs of this process, one thread each
    int node, nodes;       // this process's place among the nodes, and how many
    TaskBalance balance_storage;
    const TaskBalance* balance;  // --balance tasks' sequence (balance_storage), or NULL: the plain one
} Run;

#if defined(MULTI_GPU)
static void nccl_check_(ncclResult_t r, const char* file, int line) {
    if (r != ncclSuccess && run_aborting) { wait_for_abort(); }
    if (r != ncclSuccess) {
        vla_fail("NCCL error '%s' at %s:%d: rerun with NCCL_DEBUG=INFO to see why", ncclGetErrorString(r), file, line);
    }
}
#define ncclCheck(call) nccl_check_((call), __FILE__, __LINE__)

#if defined(ENABLE_FP32)
static const ncclDataType_t NCCL_FLOATX = ncclFloat;
#elif defined(ENABLE_FP16)
static const ncclDataType_t NCCL_FLOATX = ncclHalf;
#else
static const ncclDataType_t NCCL_FLOATX = ncclBfloat16;
#endif

#define DIST_TIMED_WAITS 4  // a step waits on NCCL once (ZeRO-1: three times)

// One rank's side: the communicator, the communication stream and its events
typedef struct Dist {
    int sync;  // the backward pass sums its buckets over the ranks as they finish (a step's last micro-step)
    ncclComm_t comm;
    cudaStream_t comm_stream;
    int n_buckets;              // the model's gradient buckets
    cudaEvent_t* bucket_ready;  // (n_buckets) their gradients are final on the main stream
    cudaEvent_t scalars_ready, comm_done;
    // the main stream's waits on the communication stream in one step: begin and end of wait i
    cudaEvent_t wait_begin[DIST_TIMED_WAITS], wait_end[DIST_TIMED_WAITS];
    int waits;  // recorded this step
} Dist;

// Work on the communication stream ordered after the main stream's so far (`ready`), ...
static void comm_after_main(Dist* d, cudaEvent_t ready) {
    cudaCheck(cudaEventRecord(ready, main_stream));
    cudaCheck(cudaStreamWaitEvent(d->comm_stream, ready, 0));
}
// ... and the main stream's next work after the communication stream's (the first waits timed)
static void main_after_comm(Dist* d) {
    cudaEvent_t done = d->comm_done;
    if (d->waits < DIST_TIMED_WAITS) {
        cudaCheck(cudaEventRecord(d->wait_begin[d->waits], main_stream));
        done = d->wait_end[d->waits++];
    }
    cudaCheck(cudaEventRecord(done, d->comm_stream));
    ProfOp prof_op("nccl wait");
    cudaCheck(cudaStreamWaitEvent(main_stream, done, 0));
}

// x (n device floats) summed over the ranks in place; nothing for a model alone (d NULL)
static void dist_sum(Dist* d, float* x, size_t n) {
    if (d == NULL) { return; }
    comm_after_main(d, d->scalars_ready);
    ncclCheck(ncclAllReduce(x, x, n, ncclFloat, ncclSum, d->comm, d->comm_stream));
    main_after_comm(d);
}

// Bucket b's gradients (ranges of grads) are final: summed over the ranks on the communication stream
static void dist_bucket_done(Dist* d, float* grads, const Buckets* k, int b, int sharded) {
    if (d == NULL || !d->sync || sharded || k->first[b] == k->first[b + 1]) { return; }  // ZeRO-1: at the end
    cudaCheck(cudaEventRecord(d->bucket_ready[b], main_stream));
    cudaCheck(cudaStreamWaitEvent(d->comm_stream, d->bucket_ready[b], 0));
    ncclCheck(ncclGroupStart());
    for (int r = k->first[b]; r < k->first[b + 1]; r++) {
        ncclCheck(ncclAllReduce(grads + k->offset[r], grads + k->offset[r], k->count[r], ncclFloat, ncclSum, d->comm,
                                d->comm_stream));
    }
    ncclCheck(ncclGroupEnd());
}

// The step's sums over the ranks after its last backward: the 4 scalars (loss sums, entries, stop),
// and with ZeRO-1 (sharded) the gradients reduce-scattered, this rank's shard [lo, hi) summed
static void dist_step_sums(Dist* d, float* grads, size_t lo, size_t hi, int sharded, float* scalars) {
    if (d != NULL) {
        comm_after_main(d, d->scalars_ready);
        if (sharded) {
            ncclCheck(ncclReduceScatter(grads, grads + lo, hi - lo, ncclFloat, ncclSum, d->comm, d->comm_stream));
        }
        ncclCheck(ncclAllReduce(scalars, scalars, 4, ncclFloat, ncclSum, d->comm, d->comm_stream));
        main_after_comm(d);
    }
}

// ZeRO-1: every rank's shard [lo, hi) of the updated weights, all-gathered into params
static void dist_gather_params(Dist* d, floatX* params, size_t lo, size_t hi) {
    comm_after_main(d, d->scalars_ready);
    ncclCheck(ncclAllGather(params + lo, params, hi - lo, NCCL_FLOATX, d->comm, d->comm_stream));
    main_after_comm(d);
}

// Optimizer state made whole: itself, or (sharded) every rank's shard all-gathered into `gathered`
// (every rank calls it)
static const float* dist_gather_state(Dist* d, float* gathered, const float* shard, size_t lo, size_t hi,
                                      int sharded) {
    if (!sharded) { return shard; }
    comm_after_main(d, d->scalars_ready);
    ncclCheck(ncclAllGather(shard, gathered, hi - lo, ncclFloat, d->comm, d->comm_stream));
    main_after_comm(d);
    return gathered;
}

// Any -g and --nodes: NCCL serves them (the build without it refuses more than one GPU)
static void dist_check_args(const TrainArgs* args) {}

// The run's NCCL id: node 0's, handed to the other nodes (dist_share_id) before any rank joins with it
static ncclUniqueId nccl_id;

static void dist_share_id(const Run* run) {
    const TrainArgs* args = &run->args;
    if (run->node == 0) { ncclCheck(ncclGetUniqueId(&nccl_id)); }
    if (run->nodes > 1) {  // node 0 hands its id to the others, once they prove they run the same thing
        printf("node %d of %d: %d GPU(s), meeting at %s, run token %s\n", run->node, run->nodes, run->local_ranks,
               args->master, args->run_token != NULL ? "set" : "not set");  // (never the token itself)
        BootIdentity me = boot_identity(args, &run->config, run->node, run->nodes, run->start, run->ds.n_samples);
        char err[1024];
        if (bootstrap_exchange(args->master, args->bind, args->run_token, &me, &nccl_id, sizeof(nccl_id),
                               args->bootstrap_timeout, err, sizeof(err)) != 0) {
            vla_fail("%s", err);
        }
    }
}

// This rank's communicator (rank `rank`, local GPU `local`), stream and events
static void dist_init(Dist* d, int n_buckets, const Run* run, int rank, Watchdog* w, int local) {
    memset(d, 0, sizeof(*d));
    d->n_buckets = n_buckets;
    ncclCheck(ncclCommInitRank(&d->comm, run->world, nccl_id, rank));
    w->comms[local] = d->comm;
    cudaCheck(cudaStreamCreate(&d->comm_stream));
    d->bucket_ready = (cudaEvent_t*)mallocCheck(n_buckets * sizeof(cudaEvent_t));
    for (int b = 0; b < n_buckets; b++) {
        cudaCheck(cudaEventCreateWithFlags(&d->bucket_ready[b], cudaEventDisableTiming));
    }
    cudaCheck(cudaEventCreateWithFlags(&d->scalars_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&d->comm_done, cudaEventDisableTiming));
    for (int i = 0; i < DIST_TIMED_WAITS; i++) {
        cudaCheck(cudaEventCreate(&d->wait_begin[i]));
        cudaCheck(cudaEventCreate(&d->wait_end[i]));
    }
}

static void dist_free(Dist* d, Watchdog* w, int local) {
    w->comms[local] = NULL;  // (every rank has finished its collectives before it gets here)
    for (int b = 0; b < d->n_buckets; b++) { cudaCheck(cudaEventDestroy(d->bucket_ready[b])); }
    free(d->bucket_ready);
    cudaCheck(cudaEventDestroy(d->scalars_ready));
    cudaCheck(cudaEventDestroy(d->comm_done));
    for (int i = 0; i < DIST_TIMED_WAITS; i++) {
        cudaCheck(cudaEventDestroy(d->wait_begin[i]));
        cudaCheck(cudaEventDestroy(d->wait_end[i]));
    }
    cudaCheck(cudaStreamDestroy(d->comm_stream));
    ncclCheck(ncclCommDestroy(d->comm));
}

static void dist_barrier(void) {
    #pragma omp barrier
}

static void dist_step_begin(Dist* d) { d->waits = 0; }

// The time the main stream waited on the communication stream this step, per wait
static double dist_wait_ms(Dist* d) {
    double total = 0.0;
    for (int i = 0; i < d->waits; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, d->wait_begin[i], d->wait_end[i]));
        if (ms > 0.0f) { total += ms; }
    }
    return total;
}

// Rank 0's closing line on NCCL: what its compute waited for it, per timed step and in all
static void dist_print_waits(double wait_ms, int steps, double step_ms, int world) {
    printf("communication: rank 0's compute waited %.2f ms per step for NCCL, %.1f%% of the step time "
           "(world size %d)\n", wait_ms / steps, 100.0 * wait_ms / step_ms, world);
}

// The process's ranks, a thread each running train(run, w, its local GPU); 1 if a request stopped one
static int run_ranks(Run* run, Watchdog* w, int (*train)(Run*, Watchdog*, int)) {
    int stopped = 0;
    #pragma omp parallel num_threads(run->local_ranks) reduction(| : stopped)
    stopped |= train(run, w, omp_get_thread_num());
    return stopped;
}

#else  // the build without NCCL: one GPU alone, nothing to sum over ranks, gather or watch, so each
// call does nothing (or its one rank's part), and the loop reads the same with or without MULTI_GPU
typedef struct Dist {
    int sync;  // (set by the training loop, read by no one: no buckets to sum)
} Dist;

static void dist_sum(Dist* d, float* x, size_t n) {}
static void dist_bucket_done(Dist* d, float* grads, const Buckets* k, int b, int sharded) {}
static void dist_step_sums(Dist* d, float* grads, size_t lo, size_t hi, int sharded, float* scalars) {}
static void dist_gather_params(Dist* d, floatX* params, size_t lo, size_t hi) {}
static const float* dist_gather_state(Dist* d, float* gathered, const float* shard, size_t lo, size_t hi,
                                      int sharded) {
    return shard;
}

// More than one GPU, here or on other nodes, takes NCCL
static void dist_check_args(const TrainArgs* args) {
    if (args->ranks > 1) {
        vla_fail("-g %d: this train_vla was built without NCCL and trains on one GPU; run -g 1, or rebuild where NCCL "
                 "is installed (make train_vla finds it)", args->ranks);
    }
    if (args->nodes > 1) {
        vla_fail("--nodes %d: this train_vla was built without NCCL: rebuild where NCCL is installed", args->nodes);
    }
}

static void dist_share_id(const Run* run) {}

static void dist_init(Dist* d, int n_buckets, const Run* run, int rank, Watchdog* w, int local) {
    memset(d, 0, sizeof(*d));
}
static void dist_free(Dist* d, Watchdog* w, int local) {}
static void dist_barrier(void) {}
static void dist_step_begin(Dist* d) {}
static double dist_wait_ms(Dist* d) { return 0.0; }
static void dist_print_waits(double wait_ms, int steps, double step_ms, int world) {}
static int run_ranks(Run* run, Watchdog* w, int (*train)(Run*, Watchdog*, int)) { return train(run, w, 0); }
#endif  // MULTI_GPU

// ----------------------------------------------------------------------------
// data: device batches fed from the loader's pinned ring (one buffer in the host batch's layout, so a
// batch is one copy, uploaded on the copy stream), the model's inputs read from one, and
// --balance tasks' per-task losses

// Device copy of a host batch's layout (batch_layout: each camera's frames at their stored
// size, tokens, state, actions, pads, t, noise); the host slot and this buffer are copied in one go.
// Returns its bytes.
static size_t device_batch_alloc(Batch* dev, const FlowConfig* c, const Cameras* cams, int B) {
    size_t bytes = batch_layout(dev, NULL, c, cams, B);
    void* memory;
    cudaCheck(cudaMalloc(&memory, bytes > 0 ? bytes : 1));
    batch_layout(dev, (uint8_t*)memory, c, cams, B);
    return bytes;
}


// Pins the loader's ring of host batches so copies from them are asynchronous.
static void loader_pin(Loader* L, int pin) {
    for (int k = 0; k < L->n_slots; k++) {
        if (pin) { cudaCheck(cudaHostRegister(L->slots[k].memory, L->slots[k].bytes, cudaHostRegisterDefault)); }
        else { cudaCheck(cudaHostUnregister(L->slots[k].memory)); }
    }
}

// --balance tasks' per-task losses of a rank (TaskLosses): the task of each sample goes up with its
// batch; after each forward the samples' squared errors and valid entries are added to their
// tasks' sums on the device; at the end of the step the sums are added over the ranks and become
// each task's mean loss over its valid entries in the whole global batch, as train_vla_cpu logs it.
typedef struct {
    const TaskBalance* tb;  // NULL: none kept
    const Dataset* ds;
    int T, B;
    int* host_task;         // (2, B) the tasks of the batch being uploaded into device batch k (host)
    int* dev_task;          // (2, B) device: device batch k's
    float* sample_sums;     // (B, 2) device: the last forward's per-sample sums
    float* task_sums;       // (T, 2) device: the step's per-task sums (squared errors, valid entries)
    float* host_sums;       // (T, 2)
    double* task_loss;      // (T) the step's mean per task (NaN: no valid entry), what the log writes
} TaskLosses;

static void task_losses_init(TaskLosses* tl, const TaskBalance* tb, const Dataset* ds, int B) {
    memset(tl, 0, sizeof(*tl));
    if (tb == NULL) { return; }
    tl->tb = tb; tl->ds = ds; tl->T = tb->n_tasks; tl->B = B;
    tl->host_task = (int*)mallocCheck(2 * (size_t)B * sizeof(int));
    tl->host_sums = (float*)mallocCheck(2 * (size_t)tl->T * sizeof(float));
    tl->task_loss = (double*)mallocCheck((size_t)tl->T * sizeof(double));
    cudaCheck(cudaMalloc(&tl->dev_task, 2 * (size_t)B * sizeof(int)));
    cudaCheck(cudaMalloc(&tl->sample_sums, 2 * (size_t)B * sizeof(float)));
    cudaCheck(cudaMalloc(&tl->task_sums, 2 * (size_t)tl->T * sizeof(float)));
}

static void task_losses_free(TaskLosses* tl) {
    if (tl->tb == NULL) { return; }
    free(tl->host_task); free(tl->host_sums); free(tl->task_loss);
    cudaCheck(cudaFree(tl->dev_task)); cudaCheck(cudaFree(tl->sample_sums)); cudaCheck(cudaFree(tl->task_sums));
}

// At the end of the step (after the update): the per-task sums added over the ranks, and copied
// for task_losses_read once the step's scalars are read (which waits for the main stream)
static void task_losses_reduce(TaskLosses* tl, Dist* dist) {
    if (tl->tb == NULL) { return; }
    dist_sum(dist, tl->task_sums, 2 * (size_t)tl->T);
    cudaCheck(cudaMemcpyAsync(tl->host_sums, tl->task_sums, 2 * (size_t)tl->T * sizeof(float), cudaMemcpyDeviceToHost,
                              main_stream));
}

static void task_losses_read(TaskLosses* tl) {
    if (tl->tb == NULL) { return; }
    cudaCheck(cudaStreamSynchronize(main_stream));
    for (int t = 0; t < tl->T; t++) {
        float n = tl->host_sums[2 * t + 1];
        tl->task_loss[t] = n > 0.0f ? (double)tl->host_sums[2 * t] / (double)n : NAN;
    }
}

// Starts copying the loader's next batch into dev (device batch k) on the copy stream, once the
// compute that last read dev is done (`consumed`, recorded on the main stream; a fresh event is no
// wait); `uploaded` fires when the batch has landed, with its samples' tasks when tl keeps them.
static void batch_upload(Loader* L, Batch* dev, cudaEvent_t consumed, cudaEvent_t uploaded, TaskLosses* tl, int k) {
    Batch* host = loader_next(L);
    cudaCheck(cudaStreamWaitEvent(copy_stream, consumed, 0));
    cudaCheck(cudaMemcpyAsync(dev->memory, host->memory, host->bytes, cudaMemcpyHostToDevice, copy_stream));
    if (tl->tb != NULL) {
        // (the previous copy from this slot of host_task landed before dev's last use: the step loop
        // waits for each upload before starting the next)
        int* task = tl->host_task + (size_t)k * tl->B;
        const uint64_t* idx = loader_indices(L);
        for (int b = 0; b < tl->B; b++) { task[b] = task_balance_task_of(tl->tb, tl->ds, idx[b]); }
        cudaCheck(cudaMemcpyAsync(tl->dev_task + (size_t)k * tl->B, task, (size_t)tl->B * sizeof(int),
                                  cudaMemcpyHostToDevice, copy_stream));
    }
    cudaCheck(cudaEventRecord(uploaded, copy_stream));
}

// After the forward of device batch k, micro-step `micro` of the step: its samples' sums into their tasks'
static void task_losses_add(TaskLosses* tl, const Policy* P, void* model, const ModelInputs* in, int k, int micro) {
    if (tl->tb == NULL) { return; }
    P->sample_losses(model, in, tl->sample_sums);
    task_loss_add_kernel<<<ceil_div(tl->T, BLOCK), BLOCK, 0, main_stream>>>(
        tl->task_sums, tl->sample_sums, tl->dev_task + (size_t)k * tl->B, in->B, tl->T, micro == 0);
    launchCheck();
}

// ----------------------------------------------------------------------------
// the policy library on the GPU, libvla_gpu.so (make libvla_gpu.so, -DVLA_LIBRARY): a checkpoint
// served for Python through ctypes (scripts/vla_policy.py, device="cuda"), with the C ABI of
// libvla.so from train_vla.c. vla/policy.h writes the entry points both libraries share (_load,
// _config, _tokenizer, _act, _act_tokens, _last_status, _last_error) over the calls this section
// defines (policy_load, policy_destroy, policy_call_act); _device, _timing,
// _set_graphs and _free are this library's. It owns
// VLAPolicy (the model without its training state, the observations on the host and their copy on
// the device) and the environment variable VLA_PROFILE_ACT (the act() call the step profiler times,
// for dev/bench_infer.py).
//
// Errors: as libvla.so's, every entry point that can fail runs its work in vla_catch_call, so a CUDA
// error (cudaCheck, cuBLASLt's), memory that cannot be had on the host or the device, and any other
// vla_fail return POLICY_FAILED or POLICY_NO_MEMORY with the line instead of ending the process;
// train_vla.cu is C++, so the failure is thrown and the destructors it passes (the profiler's
// ProfOp) run.
//
// Threads: a policy runs one call at a time (its lock). The GPU state the model code uses (streams,
// cuBLASLt's handle, workspace and plans, vla/cuda/matmul.cuh) is per host thread: each thread that calls
// into the library makes its own at its first call and keeps it for the rest of the process (32 MiB
// of GPU memory for the workspace), and a policy called from another thread than its last call's
// makes its CUDA graph again in the new one.

#if defined(VLA_LIBRARY)
struct VLAPolicy {
    PolicyFacts facts;  // the checkpoint's config, train mode and tokenizer (first: vla/policy.h reads it)
    FlowVLA model;      // its config's n_cam: the cameras of the last call's observations (policy_present_cameras)
    float* stats;        // state_mean(S) state_std(S) action_mean(A) action_std(A), as trained with (host)
    Batch obs;       // host observations, room for `capacity`
    Batch dev;       // their device copy, the same layout
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
    if (p->capacity > 0) { batch_free(&p->obs); }
    p->capacity = 0;
    void* dev = p->dev_memory;
    p->dev_memory = NULL;
    p->dev_bytes = 0;
    cudaCheck(cudaFree(dev));
    flow_drop_activations(&p->model);
}

// Everything the policy holds (its parts as far as they were made)
static void policy_release(void* arg) {
    VLAPolicy* p = (VLAPolicy*)arg;
    policy_drop_batch(p);
    free(p->stats);
    p->stats = NULL;
    flow_free(&p->model);
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
        snprintf(l->err, (size_t)l->err_size,
                 "no CUDA GPU is visible: serve the checkpoint on the CPU (device=\"cpu\", "
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
    policy_facts_set(&p->facts, ck);
    flow_build(&p->model, &ck->config, ck->train_mode);
    flow_set_params(&p->model, ck->params);
    // serving trains nothing: the gradients and the optimizer state go
    FlowVLA* m = &p->model;
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

// Where the policy computes, and in which precision.
VLA_API const char* vla_policy_device(const VLAPolicy* p) { return p->device; }

// Action chunks (B, H, A) in the data's units, as libvla.so's: cam_hw the (height, width) of each
// camera's frames in this call ((0, 0): a camera the observation lacks, policy_present_cameras),
// images[k] camera k's B frames, the instructions as strings or token ids (texts NULL; see
// policy_observations); the observations are assembled on the host, copied to the GPU in one go
// and sampled there (the prefix once, 10 Euler steps). Sets a->rc to POLICY_OK or why not.
static void policy_act(void* arg) {
    PolicyAct* a = (PolicyAct*)arg;
    VLAPolicy* p = a->p;
    FlowConfig* c = &p->model.config;
    int B = a->B;  // (vla/policy.h checked the call: a->cams are the cameras present, a->frames theirs)
    policy_gpu_thread_init();
    FlowSampling* s = &p->model.sampling;
    // another thread than the last call's: the graph holds that thread's stream work, the plans are its own
    if (p->thread != policy_gpu_thread) {
        if (s->graph != NULL) {
            cudaGraphExec_t graph = s->graph;
            s->graph = NULL;
            cudaCheck(cudaGraphExecDestroy(graph));
        }
        s->warm = 0;
        p->thread = policy_gpu_thread;
    }
    if (c->n_cam != a->cams.n) {  // another set of cameras than the last call's: activations and graph made again
        c->n_cam = a->cams.n;
        p->model.B = 0;
    }
    policy_reserve(&p->obs, &p->capacity, c, &a->cams, B);
    if (p->obs.bytes > p->dev_bytes) {  // a larger batch or larger a->frames than before
        void* old = p->dev_memory;
        p->dev_memory = NULL;
        p->dev_bytes = 0;
        cudaCheck(cudaFree(old));
        cudaCheck(cudaMalloc(&p->dev_memory, p->obs.bytes));
        p->dev_bytes = p->obs.bytes;
    }
    batch_layout(&p->dev, (uint8_t*)p->dev_memory, c, &a->cams, p->capacity);  // the host's layout
    policy_observations(&p->obs, c, p->stats, B, a->frames, a->texts, a->ids, a->n_ids, a->state, a->noise, a->seed);
    cudaCheck(cudaMemcpy(p->dev_memory, p->obs.memory, p->obs.bytes, cudaMemcpyHostToDevice));
    p->dev.B = B;
    int S = c->state_dim, A = c->action_dim, H = c->chunk, Amax = c->max_action_dim;
    const float *action_mean = p->stats + 2 * S, *action_std = p->stats + 2 * S + A;
    a->chunk = (float*)mallocCheck((size_t)B * H * Amax * sizeof(float));
    ModelInputs in = model_inputs(&p->dev);
    flow_sample(&p->model, &in, p->dev.eps, a->chunk);
    policy_actions(a->chunk, (size_t)B * H, Amax, A, action_mean, action_std, a->actions);
    a->rc = POLICY_OK;
}

// Runs one act call on its policy: one at a time (the lock), a failure caught and the batch's
// memory released after it.
static int policy_call_act(PolicyAct* a) {
    VLAPolicy* p = a->p;
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

// What the last vla_policy_act took on the device, in ms: out[0] the prefix (images to the VLM's
// keys and values; the noise's copy), out[1] the 10 Euler steps; out[2], out[3] the launches of each (kernels,
// products, copies; a graph's launch counts once) where they are counted (the CPU emulation of
// CUDA), else -1. Zeros before the first call.
VLA_API void vla_policy_timing(const VLAPolicy* p, double* out) {
    const FlowSampling* s = &p->model.sampling;
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
#endif  // VLA_LIBRARY

// ----------------------------------------------------------------------------
// CLI and main

#if !defined(TESTING) && !defined(VLA_LIBRARY)
// How well the policy acts: 10-step sampling from one batch's noise, the normalized chunk
// (B, H, Amax) un-normalized on its action dims, MSE against the batch's actions (data units)
static float eval_action_mse(const Policy* P, void* m, const FlowConfig* c, Batch* dev, const Dataset* ds,
                             uint64_t seed, uint64_t pos, int step) {
    Batch host;
    batch_alloc(&host, c, &ds->cams, dev->B);
    eval_batch(&host, ds, c, seed, pos, step);
    cudaCheck(cudaMemcpy(dev->memory, host.memory, host.bytes, cudaMemcpyHostToDevice));
    size_t rows = (size_t)dev->B * c->chunk;
    float* chunk = (float*)mallocCheck(rows * (c->max_action_dim + c->action_dim) * sizeof(float));
    float* sampled = chunk + rows * c->max_action_dim;  // (B, H, A)
    ModelInputs in = model_inputs(dev);
    P->sample(m, &in, dev->eps, chunk);
    policy_actions(chunk, rows, c->max_action_dim, c->action_dim, ds->action_mean, ds->action_std, sampled);
    float mse = action_mse(&host, ds, c, sampled);
    free(chunk);
    batch_free(&host);
    return mse;
}

// The one place that chooses a policy: each section's table, by vla/config.h's FAMILY_POLICY
static const Policy* const POLICIES[] = {&FLOW_POLICY};
static const Policy* policy_of(int family) { return POLICIES[FAMILY_POLICY[family]]; }

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static void print_config(const Run* run, const cudaDeviceProp* prop, double flops, double peak) {
    const TrainArgs* args = &run->args;
    const FlowConfig* c = &run->config;
    const Policy* P = run->policy;
    size_t total, trainable;
    P->param_counts(c, args->train_mode, &total, &trainable);
    table_run_rows("train_vla", "GPUs", args, c, total, trainable, run->from, &run->ds, run->world);
    Buckets buckets;
    P->buckets(c, args->train_mode, &buckets);
    table_row("gradient all-reduce", "%d buckets, %d ranges", buckets.n, buckets.first[buckets.n]);
    buckets_free(&buckets);
    // per GPU, for its micro-batch
    double gib = 1024.0 * 1024.0 * 1024.0;
    size_t kept_all = P->sizes.act_bytes(c, args->train_mode, args->batch, RECOMPUTE_NONE);
    size_t kept = P->sizes.act_bytes(c, args->train_mode, args->batch, args->recompute);
    table_row("activations (GiB)", "%.2f", (double)kept / gib);
    char saved[32];
    table_row("recompute", "%s: saves %s", RECOMPUTE_NAMES[args->recompute],
              format_bytes(saved, sizeof(saved), (double)(kept_all - kept)));
    if (args->recompute != RECOMPUTE_NONE) {  // MFU counts the model's FLOPs alone
        double extra = P->sizes.recompute_flops(c, args->train_mode, args->recompute);
        table_row("recompute GFLOP/sample", "%.2f (+%.1f%%, not in MFU)", extra / 1e9, 100.0 * extra / flops);
    }
    P->config_rows(c);
    table_row("device", "%.36s", prop->name);
    table_row("precision", "%s", PRECISION_NAME);
    table_row("model GFLOP per sample", "%.2f", flops / 1e9);
    const char* peak_kind = LOSS_SCALING ? "peak fp16 TFLOP/s" : "peak bf16 TFLOP/s";
    if (peak > 0.0) { table_row(peak_kind, "%.1f", peak / 1e12); }
    else { table_row(peak_kind, "unknown for this device: no MFU"); }
    if (LOSS_SCALING) {
        table_row("loss scale (dynamic)", "%g, x2 after %d clean steps", (double)run->loss_scale.scale,
                  args->loss_scale_window);
    }
    table_data_rows(args, run->balance, &run->ds);
    table_rule();
    schedule_warn(args);
    fflush(stdout);
}

// One GPU's training: rank node * local_ranks + local; rank 0 logs. Returns 1 if stopped early.
static int train_rank(Run* run, Watchdog* watchdog, int local) {
    const TrainArgs* args = &run->args;
    const FlowConfig* c = &run->config;
    const Policy* P = run->policy;
    int rank = run->node * run->local_ranks + local, world = run->world, lead = rank == 0;
    cudaDeviceProp prop;
    gpu_init(local, &prop);
    Dist dist;
    void* model = P->build(c, args->train_mode, args->recompute, args->zero ? rank : 0, args->zero ? world : 1, &dist);
    P->set_params(model, run->initial.params, run->initial.m, run->initial.v);
    LossScaleState scale = run->loss_scale;  // fp16 builds: after each step, read back from the device
    LossScaleState logged = scale;           // what a step's log line shows: the scale it ran with
    if (LOSS_SCALING) { P->set_loss_scale(model, &scale, args->loss_scale_window); }
    dist_barrier();  // every rank has its copy of the moments before they go
    if (local == 0) {  // the weights stay for the checkpoints' frozen values
        free(run->initial.m);
        free(run->initial.v);
        run->initial.m = run->initial.v = NULL;
    }
    dist_init(&dist, P->held(model).buckets, run, rank, watchdog, local);

    int64_t global_batch = train_global_batch(args, world);
    // every rank's micro-batches: W = world x accum per step, this rank's every world-th from `rank`
    Loader loader;
    loader_start_balanced(&loader, &run->ds, c, args->seed, run->sampler_pos, (uint64_t)run->start, args->batch,
                          world * args->accum, args->augment, args->workers, 4, world, rank, run->balance);
    TaskLosses task_losses;  // --balance tasks: the loss of each task, logged
    task_losses_init(&task_losses, run->balance, &run->ds, args->batch);
    loader_pin(&loader, 1);
    Batch dev[2];                          // micro-batch j lands in dev[j % 2]
    cudaEvent_t uploaded[2], consumed[2];  // its copy landed; the compute that read it is done
    size_t batch_bytes = 0;
    for (int k = 0; k < 2; k++) {
        batch_bytes += device_batch_alloc(&dev[k], c, &run->ds.cams, args->batch);
        cudaCheck(cudaEventCreateWithFlags(&uploaded[k], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&consumed[k], cudaEventDisableTiming));
    }
    P->set_batch(model, args->batch);
    ModelHeld held = P->held(model);
    Logger logger = {};
    if (lead) {
        logger_open(&logger, args->output, run->start);
        // what --recompute saves: every step's line says it
        logger.saved_bytes = (double)(P->sizes.act_bytes(c, args->train_mode, args->batch, 0) - held.act_bytes);
    }
    if (lead && run->balance != NULL) { logger.n_tasks = task_losses.T; logger.task_loss = task_losses.task_loss; }
    if (LOSS_SCALING) { logger.loss_scale = &logged; }
    Evaluator evaluator;  // (the lead rank's)
    char eval_cmd[4 * VLA_PATH_MAX];
    eval_init(&evaluator, args, eval_cmd, sizeof(eval_cmd));
    double peak = device_peak_flops(prop.name), flops = P->sizes.flops_per_sample(c, args->train_mode);

    double timed_ms = 0.0, peak_mem = 0.0, comm_wait_ms = 0.0;
    int timed_steps = 0, step = run->start, stopped = 0;
    int64_t job = 0, jobs = (int64_t)(args->steps - run->start) * args->accum;
    batch_upload(&loader, &dev[0], consumed[0], uploaded[0], &task_losses, 0);
    for (; step < args->steps && !stopped; step++) {
        double t0 = wall_seconds(), waited = loader.wait_seconds;
        if (lead && step + 1 == args->profile) { prof_begin(); }
        watchdog->step[local] = step;
        watchdog->busy_since[local] = t0;
        dist_step_begin(&dist);
        for (int micro = 0; micro < args->accum; micro++, job++) {
            Batch* batch = &dev[job % 2];
            cudaCheck(cudaStreamWaitEvent(main_stream, uploaded[job % 2], 0));
            dist.sync = micro == args->accum - 1;  // communicate on the last micro-step only
            ModelInputs in = model_inputs(batch);
            P->forward(model, &in, micro);
            task_losses_add(&task_losses, P, model, &in, (int)(job % 2), micro);
            P->backward(model, micro == 0);
            cudaCheck(cudaEventRecord(consumed[job % 2], main_stream));
            // while the GPU computes: hand the host slot back once copied, start the next batch's copy
            cudaCheck(cudaEventSynchronize(uploaded[job % 2]));
            loader_release(&loader);
            if (job + 1 < jobs) {
                int k = (int)((job + 1) % 2);
                batch_upload(&loader, &dev[k], consumed[k], uploaded[k], &task_losses, k);
            }
        }
        prof_phase("grads");
        P->grads_finish(model, stop_requested);
        prof_phase("optimizer");
        P->update(model, lr_at_step(args, step), args->weight_decay, args->decay_on, args->grad_clip, step);
        task_losses_reduce(&task_losses, &dist);
        float loss, norm, used_scale = 0.0f;
        P->read_scalars(model, &loss, &norm, &stopped);
        task_losses_read(&task_losses);
        int skipped = LOSS_SCALING && P->read_loss_scale(model, &scale, &used_scale);
        logged = scale;
        logged.scale = used_scale;
        watchdog->busy_since[local] = 0.0;
        double ms = 1000.0 * (wall_seconds() - t0);
        double wait_ms = dist_wait_ms(&dist);
        if (step > run->start && step + 1 != args->profile) { timed_ms += ms; comm_wait_ms += wait_ms; timed_steps++; }
        int done = step + 1;
        prof_stop();  // (the profiled step's work ends here, before any checkpoint)
        char left[2 * VLA_PATH_MAX + 128];
        if (skipped && used_scale <= 1.0f) {  // not a scale too large: the model overflows fp16 itself
            if (!lead) { break; }
            vla_fail(
                "step %d: Inf/NaN gradients at loss scale %g, the smallest: fp16's range is too small for this run: "
                "lower the learning rate (-l), or train in bf16 or fp32 (PRECISION=BF16 on sm_80 and newer); %s",
                done, (double)used_scale, train_checkpoint_left(args->output, left, sizeof(left)));
        }
        if (!skipped &&
            (!isfinite(loss) || !isfinite(norm))) {  // every rank sees the same values: rank 0 reports and exits
            if (!lead) { break; }
            vla_fail("step %d: loss %g, grad norm %g is not finite: lower the learning rate (-l) or raise the clip; %s",
                     done, loss, norm, train_checkpoint_left(args->output, left, sizeof(left)));
        }
        if (train_ckpt_due(args, done, stopped)) {
            P->save(model, run->initial.params, &run->ds, args, done,
                    run->sampler_pos + (uint64_t)(done - run->start) * global_batch, lead,
                    LOSS_SCALING ? &scale : NULL);
        }
        if (!lead) { continue; }
        size_t free_b, total_b;
        cudaCheck(cudaMemGetInfo(&free_b, &total_b));
        double mem_gib = (double)(total_b - free_b) / (1024.0 * 1024.0 * 1024.0);
        if (mem_gib > peak_mem) { peak_mem = mem_gib; }
        double sps = (double)global_batch / (ms / 1000.0);
        logger.wait_ms = 1000.0 * (loader.wait_seconds - waited);
        logger.epoch = (double)(run->sampler_pos + (uint64_t)(done - run->start) * global_batch) /
                       (double)run->ds.n_samples;
        logger_step(&logger, step, args->steps, loss, lr_at_step(args, step), norm, ms, sps,
                    peak > 0.0 ? flops * sps / (peak * world) : NAN, mem_gib,
                    done % args->log_every == 0 || done == args->steps);
        if (done == args->profile) { prof_end("step", done, ms); }
        if (eval_due(args, done)) { eval_start(&evaluator, &logger, done); }
        eval_poll(&evaluator, &logger);
    }
    cudaCheck(cudaStreamSynchronize(copy_stream));
    loader_pin(&loader, 0);
    loader_stop(&loader);
    if (stopped && step >= args->steps) {
        stopped = 0;
    }  // a stop in the last step: that step's checkpoint ends the run
    if (lead) {
        if (stopped) { train_report_interrupt(args, step); }
        if (LOSS_SCALING) {
            printf(
                "fp16 loss scaling: %llu step(s) of this run's %d skipped for Inf/NaN gradients (%llu in all), loss "
                "scale "
                "now %g\n",
                (unsigned long long)(scale.skipped - run->loss_scale.skipped), step - run->start,
                (unsigned long long)scale.skipped, (double)scale.scale);
        }
        printf("data loader: %d worker thread(s) per GPU, rank 0 waited %.1f ms for batches in %d steps\n",
               args->workers, 1000.0 * loader.wait_seconds, step - run->start);
        printf("eval: 10-step sampled actions vs the data, MSE %.6f (data units) on %d samples\n",
               eval_action_mse(P, model, c, &dev[0], &run->ds, args->seed,
                               run->sampler_pos + (uint64_t)(step - run->start) * global_batch, step),
               args->batch);
        double gib = 1024.0 * 1024.0 * 1024.0;
        if (timed_steps > 0) {
            double ms = timed_ms / timed_steps, sps = global_batch / (ms / 1000.0);
            printf("mean step time %.1f ms over %d steps (first excluded), %.1f samples/s", ms, timed_steps, sps);
            if (peak > 0.0) { printf(", MFU %.1f%%", 100.0 * flops * sps / (peak * world)); }
            char saved[32];
            printf(", peak GPU memory %.2f GiB (%.2f GiB held by the model, %.2f GiB of it activations; --recompute %s "
                   "saves %s)\n", peak_mem, (double)(held.device_bytes + batch_bytes) / gib,
                   (double)held.act_bytes / gib, RECOMPUTE_NAMES[args->recompute],
                   format_bytes(saved, sizeof(saved), logger.saved_bytes));
            dist_print_waits(comm_wait_ms, timed_steps, timed_ms, world);
        }
        eval_finish(&evaluator, &logger, &stop_requested);
        logger_close(&logger);
        if (stop_requested && step >= args->steps) { train_report_interrupt(args, step); }  // the run is complete
    }
    task_losses_free(&task_losses);
    for (int k = 0; k < 2; k++) {
        cudaCheck(cudaFree(dev[k].memory));
        cudaCheck(cudaEventDestroy(uploaded[k]));
        cudaCheck(cudaEventDestroy(consumed[k]));
    }
    dist_free(&dist, watchdog, local);
    P->free(model);
    gpu_shutdown();
    return stopped;
}

int main(int argc, char** argv) {
    Run run;
    // past the file size limit (ulimit -f) a write then fails with EFBIG, said in one line and its
    // temporary file removed; the signal's default would end the run without a word
    signal(SIGXFSZ, SIG_IGN);
    memset(&run, 0, sizeof(run));
    TrainArgs* args = &run.args;
    train_args_parse(args, argc, argv);
    run_record_resume(args);  // -y 1: the settings of the run's run.json, the flags given on top
    eval_check(args);          // --eval-every: what its evaluation needs is there
    if (args->memory) {  // the preset's sizes (its cameras): no dataset, no GPU
        FlowConfig c = flow_preset(args->preset)->config;
        if (args->max_text > 0) { c.max_text = args->max_text; }
        print_memory_table(&policy_of(c.family)->sizes, &c, args->preset, PRECISION_NAME, args->train_mode,
                           args->batch);
        return 0;
    }
    if (!LOSS_SCALING) { train_args_no_loss_scale(args, "this train_vla (built for " PRECISION_NAME ")"); }
    run.loss_scale.scale = args->loss_scale;
    gpu_check_visible(args->ranks);
    dist_check_args(args);
    run.local_ranks = args->ranks;
    run.node = args->node_rank;
    run.nodes = args->nodes;
    run.world = run.nodes * run.local_ranks;
    train_args_for_world(args, run.world);
    if (run.node == 0) { run_folder_open(args); }  // node 0 writes the run: it owns the output folder until it ends
    dataset_open(&run.ds, args->input);
    if (args->balance == BALANCE_TASKS) {  // before a checkpoint is read: it must have been trained with the same
        task_balance_build(&run.balance_storage, &run.ds, args->task_weights);
        args->balance_id = run.balance_storage.fingerprint;
        run.balance = &run.balance_storage;
    }
    char resume_path[VLA_PATH_MAX];
    run.from = run_start_checkpoint(args, resume_path, sizeof(resume_path));
    run.config = run_config(args, run.from, &run.ds);
    run.policy = policy_of(run.config.family);
    const char* gpu_problem = run.policy->problem(&run.config, args->train_mode);
    if (gpu_problem != NULL) { vla_fail("%s", gpu_problem); }
    if (run.from != NULL && args->weights_only) {  // fine-tuning: the weights alone, fresh moments, step 0
        run_weights_load(run.from, &run.config, &run.ds, &run.initial);
        printf("fine-tuning the weights of %s\n", run.from);
    } else if (run.from != NULL) {
        Checkpoint* ck = &run.initial;
        run_checkpoint_load(run.from, &run.config, args, &run.ds, ck);
        run.start = (int)ck->step;
        run.sampler_pos = ck->sampler_pos;
        if (ck->seed != args->seed) { printf("using the checkpoint's seed %llu\n", (unsigned long long)ck->seed); }
        args->seed = ck->seed;
        printf("resumed from %s at step %d\n", run.from, run.start);
        if (LOSS_SCALING && ck->loss_scale.scale > 0.0f) {  // it goes on where it was (--loss-scale starts runs)
            run.loss_scale = ck->loss_scale;
            printf("resumed the loss scale %g (%u clean steps, %llu skipped)\n", (double)run.loss_scale.scale,
                   run.loss_scale.clean, (unsigned long long)run.loss_scale.skipped);
        }
    } else {  // the same init for every rank
        run.initial.params = run.policy->init_params(&run.config, args->seed);
    }
    if (!run_has_steps_left(run.from, run.start, args->steps)) { return 0; }
    if (run.node == 0) { run_record_write(args, run.start, "train_vla"); }
    if (args->profile > 0 && (args->profile <= run.start || args->profile > args->steps)) {
        vla_fail(
            "--profile %d: this run trains steps %d to %d: profile one of them (one after the first, which warms up)",
            args->profile, run.start + 1, args->steps);
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    if (run.node == 0) {
        print_config(&run, &prop, run.policy->sizes.flops_per_sample(&run.config, args->train_mode),
                     device_peak_flops(prop.name));
    }
    dist_share_id(&run);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);  // a closed terminal or a dropped ssh saves too
    Watchdog watchdog;
    watchdog_start(&watchdog, run.local_ranks, run.node, run.world, args->nccl_timeout, args->output, &run_aborting);
    int stopped = run_ranks(&run, &watchdog, train_rank);
    watchdog_stop(&watchdog);
    if (run.balance != NULL) { task_balance_free(&run.balance_storage); }
    checkpoint_free(&run.initial);
    dataset_close(&run.ds);
    return stopped ? 130 : 0;
}
#endif
