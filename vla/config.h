/*
vla/config.h: the model, SmolVLA: FlowConfig, its presets and its one validation
(flow_config_problem), the train modes and recompute levels, and the parameter table
(FLOW_PARAMETERS: our name, LeRobot's name, tower, shape, what trains in which mode, decay,
init) with what is carved from it: tensor pointers, the optimizer's domain, the seeded init, and
ZeRO-1's shards of a flat buffer. Needs common.h and rng.h (the init).
*/
#ifndef VLA_CONFIG_H
#define VLA_CONFIG_H

#include "common.h"
#include "rng.h"

// ----------------------------------------------------------------------------
// the parameter table's columns (the table itself is FLOW_PARAMETERS below)

// where a tensor sits in its tower: the tower's inputs (embeddings), a per-layer tensor with a
// leading layer count, or the head
enum { KIND_INPUT = 0, KIND_LAYER = 1, KIND_HEAD = 2 };
enum { INIT_NORMAL = 0, INIT_NORMAL_OUT = 1, INIT_ZERO = 2, INIT_ONE = 3, INIT_RMS = 4 };
#define VLA_COUNT_(...) +1

// ZeRO-1: rank r of W keeps the optimizer state (master weights, AdamW moments) of the elements
// [r S, (r+1) S) of a flat parameter buffer of `total` elements padded to W S, with S a multiple
// of `align`. Shards do not follow tensor boundaries: a tensor may be split between ranks.
static inline size_t zero_shard_size(size_t total, int world, size_t align) {
    size_t unit = (size_t)world * align;
    return (total + unit - 1) / unit * align;
}

// The part of a tensor (elements [offset, offset + numel) of the flat buffer) inside the shard
// [lo, hi): returns how many elements, and in *first where they start, relative to the tensor.
static inline size_t zero_part(size_t offset, size_t numel, size_t lo, size_t hi, size_t* first) {
    size_t a = offset > lo ? offset : lo, b = offset + numel < hi ? offset + numel : hi;
    *first = a > offset ? a - offset : 0;
    return b > a ? b - a : 0;
}

// ----------------------------------------------------------------------------
// the model: one design in two families, each exactly as LeRobot 0.6.1 computes it.
// SmolVLA (docs/model.md; dev/smolvla.py is its PyTorch oracle, dev/model.py the oracle with the
// plumbing of vla/) and pi0 (docs/pi0.md): a VLM reads the images and the language, an action
// expert of the same depth reads the noisy action chunk, flow matching trains the velocity. The
// config, presets and parameter table below are the families'; their rows carry LeRobot's tensor
// names so that a LeRobot model.safetensors loads by name. test_vla and test_vla_gpu check both
// trainers against LeRobot's own references (dev/lerobot) and against dev/model.py.
//
// SmolVLA's tokens: prefix = [camera 0 | camera 1 | ... (img/patch/scale)^2 each][max_text
// language][state], suffix = [chunk action tokens, causal]. Layer l is joint self-attention over
// [prefix; suffix] when l % self_attn_every == 0, otherwise the actions cross-attend the VLM's
// keys and values of that layer, re-projected by the expert (flow_layer_is_cross).
// pi0's: prefix = [cameras (img/patch)^2 each][language], suffix = [state | chunk action tokens,
// bidirectional]; every layer joint. What else differs is a function below or a column of the
// table: the (1 + w) RMSNorm (eps 1e-6), GeGLU, unscaled image tokens, the projector's bias, the
// padding of resized frames (centred), the loss over padded chunk slots too.

enum { FAMILY_SMOLVLA = 0, FAMILY_PI0 = 1 };
#define FLOW_N_FAMILIES 2
static const char* const FAMILY_NAMES[] = {"smolvla", "pi0"};
// The model section that trains each family, the index of its table in each trainer's POLICIES
// (policy_of): the flow_ section serves both
enum { POLICY_FLOW = 0 };
static const int FAMILY_POLICY[FLOW_N_FAMILIES] = {POLICY_FLOW, POLICY_FLOW};

typedef struct {
    int32_t n_cam;           // cameras; frames keep their stored size and are resized on the device
    int32_t state_dim;       // the dataset's state dims, zero-padded to max_state_dim
    int32_t action_dim;      // the dataset's action dims, zero-padded to max_action_dim; the loss's width
    int32_t img;             // the vision tower's image side: frames are resized with padding to it
    int32_t patch;           // vision patch side
    int32_t vis_width;       // Cv, SigLIP width
    int32_t vis_ff;          // SigLIP MLP width
    int32_t vis_layers;      // SigLIP layers
    int32_t vis_heads;       // SigLIP heads (head size Cv / vis_heads)
    int32_t scale_factor;    // pixel shuffle: s x s neighbouring patches become one token
    int32_t vocab;           // language vocabulary
    int32_t pad_token;       // the tokenizer's pad id (its embedding row gets no gradient, as LeRobot's padding_idx)
    int32_t max_text;        // language tokens, right-padded
    int32_t d_model;         // C, VLM width
    int32_t d_ff;            // VLM MLP width
    int32_t n_layer;         // VLM layers kept, and expert layers
    int32_t n_head;          // query heads of both stacks
    int32_t n_kv_head;       // key/value heads of both stacks (GQA)
    int32_t head_dim;        // HS
    int32_t d_expert;        // Ce, expert width
    int32_t d_expert_ff;     // expert MLP width
    int32_t self_attn_every; // layer l is joint self-attention iff l % self_attn_every == 0
    int32_t chunk;           // H, action tokens
    int32_t max_state_dim;   // state_proj's input width
    int32_t max_action_dim;  // action_in_proj's input and action_out_proj's output width
    int32_t rope_theta;      // 10000: SmolVLA's rope ignores the text config's rope_theta
    int32_t family;          // FAMILY_SMOLVLA or FAMILY_PI0: what differs between the two (below)
} FlowConfig;

#define FLOW_CONFIG_FIELDS(X) \
    X(n_cam) X(state_dim) X(action_dim) X(img) X(patch) X(vis_width) X(vis_ff) X(vis_layers) X(vis_heads) \
    X(scale_factor) X(vocab) X(pad_token) X(max_text) X(d_model) X(d_ff) X(n_layer) X(n_head) X(n_kv_head) \
    X(head_dim) X(d_expert) X(d_expert_ff) X(self_attn_every) X(chunk) X(max_state_dim) X(max_action_dim) \
    X(rope_theta) X(family)

// A checkpoint's header holds the fields but family in order, family after its train mode
// (vla/checkpoint.h): the layout of the files written before pi0, whose padding there reads SmolVLA.
#define FLOW_CONFIG_STORED 26
VLA_STATIC_ASSERT(offsetof(FlowConfig, family) == FLOW_CONFIG_STORED * sizeof(int32_t) &&
                  sizeof(FlowConfig) == (FLOW_CONFIG_STORED + 1) * sizeof(int32_t), "family is the last field");

#define FLOW_VISION_EPS 1e-6f  // SigLIP's LayerNorm, both families

// ---- what differs between the families
static inline int flow_is_pi0(const FlowConfig* c) { return c->family == FAMILY_PI0; }
// RMSNorm (VLM and expert): x rsqrt(mean(x^2) + eps) (offset + w): SmolLM2's Llama norm (offset 0,
// eps 1e-5) or Gemma's (offset 1, eps 1e-6, its weights stored as w and initialized to 0)
static inline float flow_rms_eps(const FlowConfig* c) { return flow_is_pi0(c) ? 1e-6f : 1e-5f; }
static inline float flow_rms_offset(const FlowConfig* c) { return flow_is_pi0(c) ? 1.0f : 0.0f; }
// The MLP of the VLM and the expert: act(gate) * up with SiLU (SwiGLU) or GELU-tanh (GeGLU)
static inline int flow_mlp_gelu(const FlowConfig* c) { return flow_is_pi0(c); }
// Image tokens enter the prefix times sqrt(C) in SmolVLA, as they are in pi0 (language: both)
static inline int flow_scales_images(const FlowConfig* c) { return !flow_is_pi0(c); }
// The state token: the prefix's last token (SmolVLA, width C) or the suffix's first (pi0, width Ce)
static inline int flow_state_in_suffix(const FlowConfig* c) { return flow_is_pi0(c); }
static inline int flow_state_width(const FlowConfig* c) { return flow_is_pi0(c) ? c->d_expert : c->d_model; }
// Action tokens see each other causally (SmolVLA) or all of them (pi0)
static inline int flow_actions_causal(const FlowConfig* c) { return !flow_is_pi0(c); }
// Chunk slots past the episode's end count in the loss (pi0) or not (SmolVLA)
static inline int flow_loss_masks_pad(const FlowConfig* c) { return !flow_is_pi0(c); }
// Resized frames are padded to a square on the left and top (SmolVLA) or centred (pi0)
static inline int flow_pad_centred(const FlowConfig* c) { return flow_is_pi0(c); }
// The projector from the vision tower to the VLM has a bias in pi0
static inline int flow_connector_bias(const FlowConfig* c) { return flow_is_pi0(c); }

static inline int flow_grid(const FlowConfig* c) { return c->img / c->patch; }
static inline int flow_patch_dim(const FlowConfig* c) { return 3 * c->patch * c->patch; }
static inline int flow_image_tokens(const FlowConfig* c) {  // per camera, after the pixel shuffle
    int g = flow_grid(c) / c->scale_factor;
    return g * g;
}
static inline int flow_n_prefix(const FlowConfig* c) {
    return c->n_cam * flow_image_tokens(c) + c->max_text + !flow_state_in_suffix(c);
}
// The expert's tokens per sample: the chunk, and the state token where it is the suffix's
static inline int flow_n_suffix(const FlowConfig* c) { return c->chunk + flow_state_in_suffix(c); }

// Row counts of B samples: V vision rows (images x patches), P prefix rows, R suffix rows (the
// expert's: the action tokens, after the state token in pi0), A action rows (R without the state
// tokens); both trainers' activation tables are written in them
static inline size_t flow_images(const FlowConfig* c, int B) { return (size_t)c->n_cam * B; }
static inline size_t flow_vrows(const FlowConfig* c, int B) {
    return flow_images(c, B) * flow_grid(c) * flow_grid(c);
}
static inline size_t flow_prows(const FlowConfig* c, int B) { return (size_t)B * flow_n_prefix(c); }
static inline size_t flow_rrows(const FlowConfig* c, int B) { return (size_t)B * flow_n_suffix(c); }
static inline size_t flow_arows(const FlowConfig* c, int B) { return (size_t)B * c->chunk; }
static inline size_t flow_max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }
static inline int flow_d_attn(const FlowConfig* c) { return c->n_head * c->head_dim; }
static inline int flow_d_kv(const FlowConfig* c) { return c->n_kv_head * c->head_dim; }
// The layer schedule, named once: cross-attention layers are those that are not joint.
static inline int flow_layer_is_cross(const FlowConfig* c, int l) { return l % c->self_attn_every != 0; }
static inline int flow_n_joint(const FlowConfig* c) {
    return (c->n_layer + c->self_attn_every - 1) / c->self_attn_every;
}
static inline int flow_n_cross(const FlowConfig* c) { return c->n_layer - flow_n_joint(c); }
// Layer l's index among the layers of its kind (the slice of the joint or cross stacks it owns).
static inline int flow_kind_index(const FlowConfig* c, int l) {
    int joints_upto = l / c->self_attn_every + 1;  // joint layers in [0, l]
    return flow_layer_is_cross(c, l) ? l + 1 - joints_upto - 1 : joints_upto - 1;
}
// LeRobot's expert MLP width: Llama's 4 * int(2 Ce / 3) rounded up to a multiple of 256.
static inline int smolvla_expert_ff(int d_expert) { return 256 * ((4 * (2 * d_expert / 3) + 255) / 256); }

typedef struct {
    const char* name;
    const char* what;
    FlowConfig config;
} FlowPreset;

// n_cam, state_dim and action_dim come from the dataset. smolvla is lerobot/smolvla_base's model
// (SmolVLM2-500M's first 16 layers and its 720-wide expert); pi0 is lerobot/pi0's (PaliGemma 3B:
// SigLIP so400m/14 and Gemma 2B, with the Gemma 300M expert; 3,238,048,528 parameters used: the
// two lm_heads, 790M that nothing reads, are neither stored nor trained). tiny and pi0_tiny run
// the tests in seconds; small and pi0_small train from scratch on the CPU.
static const FlowPreset FLOW_PRESETS[] = {
    // name       what                                     cam S  A  img  p  Cv    Cv_ff Lv NHv s  vocab   pad text C     C_ff   L   NH NKV HS   Ce    Ce_ff n  H   Smax Amax theta  family
    {"tiny",     "tests: runs in seconds on one core",     {1, 4, 4, 32,  8, 32,   64,   1, 2,  2, 256,    0,  16,  48,   96,    2,  4, 2,  16,  48,   256,  2, 8,  32,  32,  10000, FAMILY_SMOLVLA}},
    {"small",    "Meta-World from scratch on the CPU",     {2, 4, 4, 64,  8, 48,   96,   1, 2,  2, 256,    0,  48,  64,   192,   2,  4, 2,  16,  48,   256,  2, 8,  32,  32,  10000, FAMILY_SMOLVLA}},
    {"smolvla",  "lerobot/smolvla_base's sizes (450M)",    {2, 32, 32, 512, 16, 768, 3072, 12, 12, 4, 49280,  2,  48,  960,  2560,  16, 15, 5, 64,  720,  2048, 2, 50, 32,  32,  10000, FAMILY_SMOLVLA}},
    {"pi0_tiny", "tests: pi0's structure in seconds",      {1, 4, 4, 32,  8, 32,   64,   2, 2,  1, 256,    0,  16,  64,   128,   2,  8, 1,  8,   32,   64,   1, 8,  32,  32,  10000, FAMILY_PI0}},
    {"pi0_small","pi0 on Meta-World from scratch, CPU",    {2, 4, 4, 64,  16, 48,  96,   1, 2,  1, 256,    0,  48,  64,   192,   2,  8, 1,  8,   48,   128,  1, 8,  32,  32,  10000, FAMILY_PI0}},
    {"pi0",      "lerobot/pi0's sizes (3.24B)",            {2, 32, 32, 224, 14, 1152, 4304, 27, 16, 1, 257152, 0,  48,  2048, 16384, 18, 8, 1,  256, 1024, 4096, 1, 50, 32,  32,  10000, FAMILY_PI0}},
};
#define FLOW_N_PRESETS ((int)(sizeof(FLOW_PRESETS) / sizeof(FLOW_PRESETS[0])))

static inline const FlowPreset* flow_preset(const char* name) {
    for (int i = 0; i < FLOW_N_PRESETS; i++) {
        if (strcmp(FLOW_PRESETS[i].name, name) == 0) { return &FLOW_PRESETS[i]; }
    }
    return NULL;
}

// The first field where two configs differ ("name a vs b"), or NULL when they agree.
static inline const char* flow_config_diff(const FlowConfig* a, const FlowConfig* b) {
    static char msg[96];
#define FLOW_DIFF_(f) if (a->f != b->f) { snprintf(msg, sizeof(msg), #f " %d vs %d", a->f, b->f); return msg; }
    FLOW_CONFIG_FIELDS(FLOW_DIFF_)
#undef FLOW_DIFF_
    return NULL;
}

// What trains: LeRobot's train_expert_only / freeze_vision_encoder as one mode (--train).
// expert: the action expert and the state/action/time projections (LeRobot's default, and the
// smolvla preset's); vlm: also the VLM but its frozen vision tower, last layer and final norm;
// all: everything. The presets trained from scratch (tiny, small) default to all.
enum { TRAIN_MODE_EXPERT = 0, TRAIN_MODE_VLM = 1, TRAIN_MODE_ALL = 2 };
static const char* const TRAIN_MODE_NAMES[] = {"expert", "vlm", "all"};
#define TRAIN_MODE_COUNT 3

// The mode named `name`, or -1.
static inline int train_mode_parse(const char* name) {
    for (int m = 0; m < TRAIN_MODE_COUNT; m++) {
        if (strcmp(name, TRAIN_MODE_NAMES[m]) == 0) { return m; }
    }
    return -1;
}

// Activation recomputation (--recompute, the GPU trainer's): what of each layer the forward keeps
// for the backward. none: everything; attn: the MLP half, the attention half (input norm, queries,
// keys/values of the layer's own, attention output and its log-sum-exp) is run again from the
// layer's input in the backward; layer: the layer's input alone (and what another layer reads: the
// VLM's keys/values, the cross layers' re-projections), the whole layer run again. Not part of a
// checkpoint: a run may continue with another setting.
enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTN = 1, RECOMPUTE_LAYER = 2 };
static const char* const RECOMPUTE_NAMES[] = {"none", "attn", "layer"};
#define RECOMPUTE_COUNT 3

// The recompute level named `name`, or -1.
static inline int recompute_parse(const char* name) {
    for (int r = 0; r < RECOMPUTE_COUNT; r++) {
        if (strcmp(name, RECOMPUTE_NAMES[r]) == 0) { return r; }
    }
    return -1;
}

// A preset's default mode: LeRobot's for the released models (SmolVLA fine-tunes its expert, pi0
// trains everything), all for the others, which train from scratch.
static inline int flow_default_train_mode(const char* preset) {
    return strcmp(preset, "smolvla") == 0 ? TRAIN_MODE_EXPERT : TRAIN_MODE_ALL;
}

// The towers, in the order the data meets them. TOWER_STATE (the state token's projection) is
// resolved by the family when the table is built: the VLM's in SmolVLA (a prefix token), the
// expert's in pi0 (a suffix token).
enum { TOWER_VISION = 0, TOWER_VLM = 1, TOWER_EXPERT = 2, TOWER_STATE = 3 };
// The train column: in which modes a tensor trains. The VLM's layer stacks train in vlm and all
// modes except their last layer, which LeRobot's SmolVLA always freezes (with the VLM's final norm
// and lm_head: their outputs feed nothing; the last layer's keys and values do feed the expert).
// pi0 freezes nothing, so there the last layer's input norm and q/k/v projections train
// (TRAIN_VLM_QKV: its keys and values feed the expert, and its queries get a zero gradient that
// AdamW's decay still acts on), while its o_proj, MLP and post-attention norm, whose outputs feed
// nothing, get no gradient: resolved by the family when the table is built.
enum { TRAIN_ALWAYS = 0, TRAIN_VLM = 1, TRAIN_VLM_BUT_LAST = 2, TRAIN_VISION = 3, TRAIN_NEVER = 4, TRAIN_VLM_QKV = 5 };
// How slice i of a stacked tensor maps to LeRobot's layer number (the %d in its name).
enum { SLICES_NONE = 0, SLICES_VISION = 1, SLICES_ALL = 2, SLICES_JOINT = 3, SLICES_CROSS = 4 };

// LeRobot's names: a family's prefix of the module the tensor sits in, then the row's suffix.
enum { NAME_VIS = 0, NAME_CONN = 1, NAME_TXT = 2, NAME_EXP = 3, NAME_TOP = 4 };
static const char* const FLOW_NAME_PREFIX[FLOW_N_FAMILIES][5] = {
    {"model.vlm_with_expert.vlm.model.vision_model.",
     "model.vlm_with_expert.vlm.model.connector.modality_projection.proj.",
     "model.vlm_with_expert.vlm.model.text_model.", "model.vlm_with_expert.lm_expert.", "model."},
    {"model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.",
     "model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear.",
     "model.paligemma_with_expert.paligemma.model.language_model.", "model.paligemma_with_expert.gemma_expert.model.",
     "model."},
};

// Linear weights are (out, in) as torch stores them; per-layer tensors are stacked with a leading
// layer count (the vision layers, all L layers, or the joint / cross layers of the expert's k/v,
// whose input widths differ: Ce in joint layers, the VLM's key/value width in cross layers). A
// tensor the family does not have has no elements (the projector's bias in SmolVLA, the cross
// layers' k/v in pi0) and no slice: nothing names, loads or trains it. INIT_RMS: an RMSNorm's
// weight, 1 in SmolVLA's w form and 0 in pi0's (1 + w) form.
//  X(name,       module,   LeRobot name in it (%d = layer),           tower,        kind,        train,              decay init             slices         nd d0 d1 d2)
#define FLOW_PARAMETERS(X, c) \
    X(vis_patch_w,  NAME_VIS, "embeddings.patch_embedding.weight",        TOWER_VISION, KIND_INPUT, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->vis_width, flow_patch_dim(c), 1) \
    X(vis_patch_b,  NAME_VIS, "embeddings.patch_embedding.bias",          TOWER_VISION, KIND_INPUT, TRAIN_VISION,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(vis_pos,      NAME_VIS, "embeddings.position_embedding.weight",     TOWER_VISION, KIND_INPUT, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_NONE,   2, flow_grid(c) * flow_grid(c), (c)->vis_width, 1) \
    X(vis_ln1_w,    NAME_VIS, "encoder.layers.%d.layer_norm1.weight",     TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ONE,        SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln1_b,    NAME_VIS, "encoder.layers.%d.layer_norm1.bias",       TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wq,       NAME_VIS, "encoder.layers.%d.self_attn.q_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bq,       NAME_VIS, "encoder.layers.%d.self_attn.q_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wk,       NAME_VIS, "encoder.layers.%d.self_attn.k_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bk,       NAME_VIS, "encoder.layers.%d.self_attn.k_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wv,       NAME_VIS, "encoder.layers.%d.self_attn.v_proj.weight",  TOWER_VISION, KIND_LAYER, TRAIN_VISION,     1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bv,       NAME_VIS, "encoder.layers.%d.self_attn.v_proj.bias",    TOWER_VISION, KIND_LAYER, TRAIN_VISION,     0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_wo,       NAME_VIS, "encoder.layers.%d.self_attn.out_proj.weight", TOWER_VISION, KIND_LAYER, TRAIN_VISION,    1, INIT_NORMAL_OUT, SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_width) \
    X(vis_bo,       NAME_VIS, "encoder.layers.%d.self_attn.out_proj.bias",   TOWER_VISION, KIND_LAYER, TRAIN_VISION,    0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln2_w,    NAME_VIS, "encoder.layers.%d.layer_norm2.weight",     TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ONE,        SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_ln2_b,    NAME_VIS, "encoder.layers.%d.layer_norm2.bias",       TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_fc1_w,    NAME_VIS, "encoder.layers.%d.mlp.fc1.weight",         TOWER_VISION, KIND_LAYER, TRAIN_VISION,       1, INIT_NORMAL,     SLICES_VISION, 3, (c)->vis_layers, (c)->vis_ff, (c)->vis_width) \
    X(vis_fc1_b,    NAME_VIS, "encoder.layers.%d.mlp.fc1.bias",           TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_ff, 1) \
    X(vis_fc2_w,    NAME_VIS, "encoder.layers.%d.mlp.fc2.weight",         TOWER_VISION, KIND_LAYER, TRAIN_VISION,       1, INIT_NORMAL_OUT, SLICES_VISION, 3, (c)->vis_layers, (c)->vis_width, (c)->vis_ff) \
    X(vis_fc2_b,    NAME_VIS, "encoder.layers.%d.mlp.fc2.bias",           TOWER_VISION, KIND_LAYER, TRAIN_VISION,       0, INIT_ZERO,       SLICES_VISION, 2, (c)->vis_layers, (c)->vis_width, 1) \
    X(vis_post_w,   NAME_VIS, "post_layernorm.weight",                    TOWER_VISION, KIND_HEAD,  TRAIN_VISION,       0, INIT_ONE,        SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(vis_post_b,   NAME_VIS, "post_layernorm.bias",                      TOWER_VISION, KIND_HEAD,  TRAIN_VISION,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->vis_width, 1, 1) \
    X(connector_w,  NAME_CONN, "weight",                                  TOWER_VLM,    KIND_INPUT, TRAIN_VLM,          1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_model, (c)->vis_width * (c)->scale_factor * (c)->scale_factor, 1) \
    X(connector_b,  NAME_CONN, "bias",                                    TOWER_VLM,    KIND_INPUT, TRAIN_VLM,          0, INIT_ZERO,       SLICES_NONE,   1, flow_connector_bias(c) ? (c)->d_model : 0, 1, 1) \
    X(embed_tokens, NAME_TXT, "embed_tokens.weight",                      TOWER_VLM,    KIND_INPUT, TRAIN_VLM,          1, INIT_NORMAL,     SLICES_NONE,   2, (c)->vocab, (c)->d_model, 1) \
    X(state_w,      NAME_TOP, "state_proj.weight",                        TOWER_STATE,  KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, flow_state_width(c), (c)->max_state_dim, 1) \
    X(state_b,      NAME_TOP, "state_proj.bias",                          TOWER_STATE,  KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, flow_state_width(c), 1, 1) \
    X(vlm_ln1,      NAME_TXT, "layers.%d.input_layernorm.weight",         TOWER_VLM,    KIND_LAYER, TRAIN_VLM_QKV,      0, INIT_RMS,        SLICES_ALL,    2, (c)->n_layer, (c)->d_model, 1) \
    X(vlm_wq,       NAME_TXT, "layers.%d.self_attn.q_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_QKV,      1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, flow_d_attn(c), (c)->d_model) \
    X(vlm_wk,       NAME_TXT, "layers.%d.self_attn.k_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_QKV,      1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, flow_d_kv(c), (c)->d_model) \
    X(vlm_wv,       NAME_TXT, "layers.%d.self_attn.v_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_QKV,      1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, flow_d_kv(c), (c)->d_model) \
    X(vlm_wo,       NAME_TXT, "layers.%d.self_attn.o_proj.weight",        TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_model, flow_d_attn(c)) \
    X(vlm_ln2,      NAME_TXT, "layers.%d.post_attention_layernorm.weight", TOWER_VLM,   KIND_LAYER, TRAIN_VLM_BUT_LAST, 0, INIT_RMS,        SLICES_ALL,    2, (c)->n_layer, (c)->d_model, 1) \
    X(vlm_gate,     NAME_TXT, "layers.%d.mlp.gate_proj.weight",           TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_ff, (c)->d_model) \
    X(vlm_up,       NAME_TXT, "layers.%d.mlp.up_proj.weight",             TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_ff, (c)->d_model) \
    X(vlm_down,     NAME_TXT, "layers.%d.mlp.down_proj.weight",           TOWER_VLM,    KIND_LAYER, TRAIN_VLM_BUT_LAST, 1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_model, (c)->d_ff) \
    X(vlm_norm,     NAME_TXT, "norm.weight",                              TOWER_VLM,    KIND_HEAD,  TRAIN_NEVER,        0, INIT_RMS,        SLICES_NONE,   1, (c)->d_model, 1, 1) \
    X(action_in_w,  NAME_TOP, "action_in_proj.weight",                    TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, (c)->max_action_dim, 1) \
    X(action_in_b,  NAME_TOP, "action_in_proj.bias",                      TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(time_in_w,    NAME_TOP, "action_time_mlp_in.weight",                TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, 2 * (c)->d_expert, 1) \
    X(time_in_b,    NAME_TOP, "action_time_mlp_in.bias",                  TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(time_out_w,   NAME_TOP, "action_time_mlp_out.weight",               TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->d_expert, (c)->d_expert, 1) \
    X(time_out_b,   NAME_TOP, "action_time_mlp_out.bias",                 TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(exp_ln1,      NAME_EXP, "layers.%d.input_layernorm.weight",         TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       0, INIT_RMS,        SLICES_ALL,    2, (c)->n_layer, (c)->d_expert, 1) \
    X(exp_wq,       NAME_EXP, "layers.%d.self_attn.q_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, flow_d_attn(c), (c)->d_expert) \
    X(exp_wk_joint, NAME_EXP, "layers.%d.self_attn.k_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_JOINT,  3, flow_n_joint(c), flow_d_kv(c), (c)->d_expert) \
    X(exp_wv_joint, NAME_EXP, "layers.%d.self_attn.v_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_JOINT,  3, flow_n_joint(c), flow_d_kv(c), (c)->d_expert) \
    X(exp_wk_cross, NAME_EXP, "layers.%d.self_attn.k_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_CROSS,  3, flow_n_cross(c), flow_d_kv(c), flow_d_kv(c)) \
    X(exp_wv_cross, NAME_EXP, "layers.%d.self_attn.v_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_CROSS,  3, flow_n_cross(c), flow_d_kv(c), flow_d_kv(c)) \
    X(exp_wo,       NAME_EXP, "layers.%d.self_attn.o_proj.weight",        TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_expert, flow_d_attn(c)) \
    X(exp_ln2,      NAME_EXP, "layers.%d.post_attention_layernorm.weight", TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,      0, INIT_RMS,        SLICES_ALL,    2, (c)->n_layer, (c)->d_expert, 1) \
    X(exp_gate,     NAME_EXP, "layers.%d.mlp.gate_proj.weight",           TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_expert_ff, (c)->d_expert) \
    X(exp_up,       NAME_EXP, "layers.%d.mlp.up_proj.weight",             TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_ALL,    3, (c)->n_layer, (c)->d_expert_ff, (c)->d_expert) \
    X(exp_down,     NAME_EXP, "layers.%d.mlp.down_proj.weight",           TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS,       1, INIT_NORMAL_OUT, SLICES_ALL,    3, (c)->n_layer, (c)->d_expert, (c)->d_expert_ff) \
    X(exp_norm,     NAME_EXP, "norm.weight",                              TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       0, INIT_RMS,        SLICES_NONE,   1, (c)->d_expert, 1, 1) \
    X(action_out_w, NAME_TOP, "action_out_proj.weight",                   TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       1, INIT_NORMAL,     SLICES_NONE,   2, (c)->max_action_dim, (c)->d_expert, 1) \
    X(action_out_b, NAME_TOP, "action_out_proj.bias",                     TOWER_EXPERT, KIND_HEAD,  TRAIN_ALWAYS,       0, INIT_ZERO,       SLICES_NONE,   1, (c)->max_action_dim, 1, 1)

// Parameter tensor indices, in table order: FLOWP_vis_wq, ...
enum {
#define FLOW_INDEX_(nm, ...) FLOWP_##nm,
    FLOW_PARAMETERS(FLOW_INDEX_, c)
#undef FLOW_INDEX_
};

// The tensors of layer l of the VLM (expert = 0) or of the expert (expert = 1), in FlowLayer's order
// (ln1, wq, wk, wv, wo, ln2, gate, up, down), and the slice of each: l, but for the expert's k/v,
// the joint or cross stacks' slice that layer owns (flow_kind_index). Both trainers' flow_layer.
static inline void flow_layer_tensors(const FlowConfig* c, int expert, int l, int idx[9], int slice[9]) {
    int cross = expert && flow_layer_is_cross(c, l);
    int wk = expert ? (cross ? FLOWP_exp_wk_cross : FLOWP_exp_wk_joint) : FLOWP_vlm_wk;
    int wv = expert ? (cross ? FLOWP_exp_wv_cross : FLOWP_exp_wv_joint) : FLOWP_vlm_wv;
    int t[9] = {expert ? FLOWP_exp_ln1 : FLOWP_vlm_ln1, expert ? FLOWP_exp_wq : FLOWP_vlm_wq, wk, wv,
                expert ? FLOWP_exp_wo : FLOWP_vlm_wo, expert ? FLOWP_exp_ln2 : FLOWP_vlm_ln2,
                expert ? FLOWP_exp_gate : FLOWP_vlm_gate, expert ? FLOWP_exp_up : FLOWP_vlm_up,
                expert ? FLOWP_exp_down : FLOWP_vlm_down};
    for (int i = 0; i < 9; i++) {
        idx[i] = t[i];
        slice[i] = expert && (i == 2 || i == 3) ? flow_kind_index(c, l) : l;
    }
}

// One Llama layer of the VLM or the expert over tensors of type T (its weights, or their gradients:
// NULL = frozen): the fields of both trainers' FlowLayer, as flow_layer fills them
#define FLOW_LAYER_FIELDS(T)                                                                      \
    T *ln1, *wq, *wk, *wv, *wo, *ln2, *gate, *up, *down;                                          \
    int C, F;          /* stream width, MLP width */                                             \
    int cross;         /* an expert layer attending to the VLM's re-projected keys/values */     \
    float eps, offset; /* its RMSNorms' (the family's) */                                         \
    int gelu;          /* GeGLU (pi0) rather than SwiGLU */

// Layer slots of one stack's activations (N rows of width C, MLP width F), both trainers'
// FlowLayerActs x: slot L of the layer inputs and outputs, La of the attention half's, Lm of the MLP
// half's, Lkv of the keys and values (the trainers without recomputation: all L).
#define FLOW_LAYER_SLOTS(x, c, N, C, F, L, La, Lm, Lkv)                                                       \
    do {                                                                                                   \
        size_t D_ = flow_d_attn(c), KV_ = flow_d_kv(c);                                                    \
        (x).res += (L) * (N) * (C); (x).ln1 += (La) * (N) * (C); (x).rstd1 += (La) * (N);                  \
        (x).q += (La) * (N) * D_; (x).k += (Lkv) * (N) * KV_; (x).v += (Lkv) * (N) * KV_;                  \
        (x).att += (La) * (N) * D_; (x).lse += (La) * (N) * (c)->n_head;                                   \
        (x).mid += (Lm) * (N) * (C); (x).ln2 += (Lm) * (N) * (C); (x).rstd2 += (Lm) * (N);                 \
        (x).gate += (Lm) * (N) * (F); (x).up += (Lm) * (N) * (F); (x).act += (Lm) * (N) * (F);             \
        (x).out += ((L) + 1) * (N) * (C); /* the VLM's last layer has no output: p_res has L slices */     \
    } while (0)

enum { FLOW_NUM_TENSORS = 0 FLOW_PARAMETERS(VLA_COUNT_, c) };

typedef struct {
    const char* name;
    char lerobot[128];  // LeRobot's name (the family's module prefix and the row's suffix); %d is the layer
    int tower, kind, train, decay, init, slices, ndim;  // tower, train and init resolved for the family
    int64_t shape[3];
    size_t numel;
    size_t offset;  // in elements, into the one flat allocation
} FlowParamSpec;

typedef struct {
    FlowParamSpec spec[FLOW_NUM_TENSORS];
    size_t total;
} FlowParamTable;

// The family's reading of the columns that depend on it (TOWER_STATE, TRAIN_VLM_QKV, INIT_RMS)
static inline int flow_resolve_tower(const FlowConfig* c, int tower) {
    return tower == TOWER_STATE ? (flow_state_in_suffix(c) ? TOWER_EXPERT : TOWER_VLM) : tower;
}
static inline int flow_resolve_train(const FlowConfig* c, int train) {
    return train == TRAIN_VLM_QKV ? (flow_is_pi0(c) ? TRAIN_VLM : TRAIN_VLM_BUT_LAST) : train;
}
static inline int flow_resolve_init(const FlowConfig* c, int init) {
    return init == INIT_RMS ? (flow_rms_offset(c) != 0.0f ? INIT_ZERO : INIT_ONE) : init;
}

static inline void flow_table_build(const FlowConfig* c, FlowParamTable* t) {
    int i = 0;
    size_t offset = 0;
#define FLOW_SPEC_(nm, where, lr, tw, knd, trn, dec, ini, sl, nd, d0, d1, d2) \
    t->spec[i] = (FlowParamSpec){#nm, "", flow_resolve_tower(c, tw), knd, flow_resolve_train(c, trn), dec, \
                                 flow_resolve_init(c, ini), sl, nd, {d0, d1, d2}, \
                                 (size_t)(d0) * (size_t)(d1) * (size_t)(d2), offset}; \
    snprintf(t->spec[i].lerobot, sizeof(t->spec[i].lerobot), "%s%s", FLOW_NAME_PREFIX[c->family][where], lr); \
    offset += t->spec[i].numel; \
    i++;
    FLOW_PARAMETERS(FLOW_SPEC_, c)
#undef FLOW_SPEC_
    t->total = offset;
}

// One float* per tensor, carved from a flat buffer in table order; NULL for a tensor the family
// does not have.
typedef struct {
#define FLOW_FIELD_(nm, ...) float* nm;
    FLOW_PARAMETERS(FLOW_FIELD_, c)
#undef FLOW_FIELD_
} FlowParameters;

static inline void flow_point(FlowParameters* p, float* base, const FlowParamTable* t) {
    int i = 0;
#define FLOW_POINT_(nm, ...) p->nm = t->spec[i].numel > 0 ? base + t->spec[i].offset : NULL; i++;
    FLOW_PARAMETERS(FLOW_POINT_, c)
#undef FLOW_POINT_
}

// Slices (layers) of a tensor: its leading dimension when stacked, else 1; 0 for a tensor the
// family does not have. The elements of one slice: flow_slice_numel.
static inline size_t flow_slices(const FlowParamSpec* s) {
    return s->numel == 0 ? 0 : s->slices == SLICES_NONE ? 1 : (size_t)s->shape[0];
}
static inline size_t flow_slice_numel(const FlowParamSpec* s) {
    return s->numel == 0 ? 0 : s->numel / flow_slices(s);
}

// The elements of a tensor that train in `mode`: a prefix of it (stacked tensors are layer-major,
// so "every layer but the last" is the first numel - numel/L elements). 0 = frozen.
static inline size_t flow_trainable_numel(const FlowParamSpec* s, int mode) {
    switch (s->train) {
        case TRAIN_ALWAYS: return s->numel;
        case TRAIN_VLM: return mode >= TRAIN_MODE_VLM ? s->numel : 0;
        case TRAIN_VLM_BUT_LAST: return mode >= TRAIN_MODE_VLM ? s->numel - flow_slice_numel(s) : 0;
        case TRAIN_VISION: return mode == TRAIN_MODE_ALL ? s->numel : 0;
        default: return 0;
    }
}

static inline size_t flow_trainable_count(const FlowParamTable* t, int mode) {
    size_t n = 0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) { n += flow_trainable_numel(&t->spec[i], mode); }
    return n;
}

// The optimizer's domain in a mode: the trainable prefix of every tensor, packed in table order.
// AdamW's moments exist for these elements only (tensor i's at offset[i], numel[i] of them); its
// weight decay applies where the table's decay column, or --decay-on all, says (flow_decay).
typedef struct {
    int mode;
    size_t offset[FLOW_NUM_TENSORS];  // tensor i's first moment in the packed m and v
    size_t numel[FLOW_NUM_TENSORS];   // its trainable elements: the first numel[i] (0 = frozen)
    size_t total;                        // elements of m and of v: flow_trainable_count
} FlowOptDomain;

static inline void flow_opt_domain(const FlowParamTable* t, int mode, FlowOptDomain* d) {
    d->mode = mode;
    d->total = 0;
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        d->offset[i] = d->total;
        d->numel[i] = flow_trainable_numel(&t->spec[i], mode);
        d->total += d->numel[i];
    }
}

// What AdamW's decoupled weight decay acts on (--decay-on): the tensors the table's decay column
// marks (the matrices: linear weights and embeddings), or every trainable tensor, biases and norms
// too, as LeRobot's torch AdamW over all of a policy's parameters does.
enum { DECAY_ON_MATRICES = 0, DECAY_ON_ALL = 1 };
static const char* const DECAY_ON_NAMES[] = {"matrices", "all"};
#define DECAY_ON_COUNT ((int)(sizeof(DECAY_ON_NAMES) / sizeof(DECAY_ON_NAMES[0])))

// The decoupled weight decay of tensor s: `weight_decay` where `decay_on` (DECAY_ON_*) reaches it, else 0.
static inline float flow_decay(const FlowParamSpec* s, float weight_decay, int decay_on) {
    return s->decay || decay_on == DECAY_ON_ALL ? weight_decay : 0.0f;
}

// LeRobot's layer number of slice i of a stacked tensor.
static inline int flow_slice_layer(const FlowConfig* c, const FlowParamSpec* s, int i) {
    if (s->slices == SLICES_JOINT) { return i * c->self_attn_every; }
    if (s->slices == SLICES_CROSS) {  // the i-th layer that is not joint
        for (int l = 0, k = 0; l < c->n_layer; l++) {
            if (flow_layer_is_cross(c, l) && k++ == i) { return l; }
        }
    }
    return i;
}

// The one validation of a SmolVLA config: fields positive and bounded, the shapes consistent.
static inline const char* flow_config_problem(const FlowConfig* c) {
    static char msg[256];
    if (c->family < 0 || c->family >= FLOW_N_FAMILIES) {
        snprintf(msg, sizeof(msg), "family %d is not one of 0 (smolvla) and 1 (pi0)", c->family);
        return msg;
    }
#define FLOW_POSITIVE_(f) if (c->f <= 0 && strcmp(#f, "pad_token") != 0 && strcmp(#f, "family") != 0) { \
        snprintf(msg, sizeof(msg), #f " must be positive (got %d)", c->f); return msg; }
    FLOW_CONFIG_FIELDS(FLOW_POSITIVE_)
#undef FLOW_POSITIVE_
#define FLOW_BOUND_(f, max) \
    if (c->f > (max)) { snprintf(msg, sizeof(msg), #f " %d is past its bound %d", c->f, (int)(max)); return msg; }
    FLOW_BOUND_(n_cam, VLA_MAX_CAM) FLOW_BOUND_(img, VLA_MAX_IMG) FLOW_BOUND_(patch, c->img)
    FLOW_BOUND_(vis_width, VLA_MAX_WIDTH) FLOW_BOUND_(vis_ff, VLA_MAX_WIDTH) FLOW_BOUND_(vis_layers, VLA_MAX_LAYER)
    FLOW_BOUND_(vis_heads, c->vis_width) FLOW_BOUND_(scale_factor, c->img / c->patch) FLOW_BOUND_(vocab, 1 << 24)
    FLOW_BOUND_(pad_token, c->vocab - 1) FLOW_BOUND_(max_text, VLA_MAX_TEXT) FLOW_BOUND_(d_model, VLA_MAX_WIDTH)
    FLOW_BOUND_(d_ff, VLA_MAX_WIDTH) FLOW_BOUND_(n_layer, VLA_MAX_LAYER) FLOW_BOUND_(n_head, VLA_MAX_HEAD)
    FLOW_BOUND_(n_kv_head, c->n_head) FLOW_BOUND_(head_dim, VLA_MAX_HEAD) FLOW_BOUND_(d_expert, VLA_MAX_WIDTH)
    FLOW_BOUND_(d_expert_ff, VLA_MAX_WIDTH) FLOW_BOUND_(self_attn_every, c->n_layer) FLOW_BOUND_(chunk, VLA_MAX_CHUNK)
    FLOW_BOUND_(max_state_dim, VLA_MAX_DIM) FLOW_BOUND_(max_action_dim, VLA_MAX_DIM)
    FLOW_BOUND_(state_dim, c->max_state_dim) FLOW_BOUND_(action_dim, c->max_action_dim)
#undef FLOW_BOUND_
    if (c->pad_token < 0) {
        snprintf(msg, sizeof(msg), "pad_token must not be negative (got %d)", c->pad_token);
        return msg;
    }
    if (flow_is_pi0(c) && (c->self_attn_every != 1 || c->scale_factor != 1)) {
        snprintf(msg, sizeof(msg),
                 "pi0 has every layer joint and no pixel shuffle: self_attn_every %d and scale_factor %d "
                 "must be 1",
                 c->self_attn_every, c->scale_factor);
        return msg;
    }
    if (c->img % c->patch != 0 || (c->img / c->patch) % c->scale_factor != 0) {
        snprintf(msg, sizeof(msg), "img %d / patch %d must be a whole grid that scale_factor %d divides", c->img,
                 c->patch, c->scale_factor);
        return msg;
    }
    if (c->vis_width % c->vis_heads != 0) {
        snprintf(msg, sizeof(msg), "vis_width %d is not a multiple of vis_heads %d", c->vis_width, c->vis_heads);
        return msg;
    }
    if (c->n_head % c->n_kv_head != 0) {
        snprintf(msg, sizeof(msg), "n_head %d is not a multiple of n_kv_head %d (GQA)", c->n_head, c->n_kv_head);
        return msg;
    }
    if (c->head_dim % 2 != 0 || c->d_expert % 2 != 0) {
        snprintf(msg, sizeof(msg), "head_dim %d (RoPE) and d_expert %d (time embedding) must be even", c->head_dim,
                 c->d_expert);
        return msg;
    }
    uint64_t tokens = (uint64_t)flow_n_prefix(c) + (uint64_t)flow_n_suffix(c);
    uint64_t vis_tokens = (uint64_t)(c->img / c->patch) * (uint64_t)(c->img / c->patch);
    if (tokens > VLA_MAX_TOKENS || vis_tokens > VLA_MAX_TOKENS) {
        snprintf(msg, sizeof(msg), "%llu tokens (%llu per image in the vision tower) are past the bound %d",
                 (unsigned long long)tokens, (unsigned long long)vis_tokens, VLA_MAX_TOKENS);
        return msg;
    }
    uint64_t total = 0, numel;
    int bad = 0;
#define FLOW_COUNT_(nm, where, lr, tw, knd, trn, dec, ini, sl, nd, d0, d1, d2) \
    bad |= __builtin_mul_overflow((uint64_t)(d0), (uint64_t)(d1), &numel); \
    bad |= __builtin_mul_overflow(numel, (uint64_t)(d2), &numel); \
    bad |= __builtin_add_overflow(total, numel, &total);
    FLOW_PARAMETERS(FLOW_COUNT_, c)
#undef FLOW_COUNT_
    if (bad || total > VLA_MAX_PARAMS) {
        snprintf(msg, sizeof(msg), "the parameter count is past the bound 2^36");
        return msg;
    }
    return NULL;
}

// A config as "name value" lines (every field of FLOW_CONFIG_FIELDS once, but family, which
// files written before pi0 leave out: SmolVLA; dev/smolvla.py --c-config and
// dev/lerobot/make_ref.py --family pi0 write them from LeRobot's models). Returns 0, or 1 with err set.
static inline int flow_config_read(const char* path, FlowConfig* c, char* err, size_t err_size) {
    FILE* f = fopen(path, "r");
    if (f == NULL) { snprintf(err, err_size, "cannot open %s: %s", path, strerror(errno)); return 1; }
    memset(c, 0, sizeof(*c));
    int seen[64] = {0};
    char key[64];
    long long value;
    int status = 0;
    while (status == 0) {
        int got = fscanf(f, "%63s %lld", key, &value);
        if (got == EOF) { break; }
        if (got != 2 || value < INT32_MIN || value > INT32_MAX) {
            snprintf(err, err_size, "%s: a line is not 'name integer'", path);
            status = 1;
            break;
        }
        int i = 0, found = 0;
#define FLOW_READ_(f) if (strcmp(key, #f) == 0) { c->f = (int32_t)value; seen[i]++; found = 1; } i++;
        FLOW_CONFIG_FIELDS(FLOW_READ_)
#undef FLOW_READ_
        if (!found) { snprintf(err, err_size, "%s: unknown field '%s'", path, key); status = 1; }
    }
    fclose(f);
    int i = 0;
#define FLOW_SEEN_(f) if (status == 0 && seen[i] != 1 && !(strcmp(#f, "family") == 0 && seen[i] == 0)) { \
        snprintf(err, err_size, "%s: field " #f " appears %d times (once expected)", path, seen[i]); status = 1; } i++;
    FLOW_CONFIG_FIELDS(FLOW_SEEN_)
#undef FLOW_SEEN_
    const char* problem = status == 0 ? flow_config_problem(c) : NULL;
    if (problem != NULL) { snprintf(err, err_size, "%s: %s", path, problem); status = 1; }
    return status;
}

// Parameters from the seed: normal(0, 0.02), output projections / sqrt(2L)
// of their tower's depth, biases 0, norm scales 1 (pi0's (1 + w) RMSNorms: w = 0). (Imported
// weights replace them.)
static inline void flow_param_init(float* params, const FlowParamTable* t, const FlowConfig* c, uint64_t seed) {
    for (int i = 0; i < FLOW_NUM_TENSORS; i++) {
        const FlowParamSpec* s = &t->spec[i];
        float* p = params + s->offset;
        if (s->init == INIT_ZERO || s->init == INIT_ONE) {
            float v = s->init == INIT_ONE ? 1.0f : 0.0f;
            for (size_t j = 0; j < s->numel; j++) { p[j] = v; }
            continue;
        }
        int depth = s->tower == TOWER_VISION ? c->vis_layers : c->n_layer;
        float std = s->init == INIT_NORMAL_OUT ? 0.02f / sqrtf(2.0f * (float)depth) : 0.02f;
        // element j of the flat buffer takes draws 2j and 2j + 1 wherever it is drawn: chunks of a
        // tensor in parallel (pi0's 3.2B values) give the bits of one pass
        const size_t CHUNK = (size_t)1 << 16;
        long long n_chunks = (long long)((s->numel + CHUNK - 1) / CHUNK);
#if defined(_OPENMP)  // (each value its own counter of the RNG: the same values without OpenMP)
        #pragma omp parallel for schedule(static)
#endif
        for (long long k = 0; k < n_chunks; k++) {
            Rng r;
            rng_init(&r, seed, RNG_STREAM_INIT);
            size_t j0 = (size_t)k * CHUNK, j1 = j0 + CHUNK < s->numel ? j0 + CHUNK : s->numel;
            r.counter = 2 * (uint64_t)(s->offset + j0);
            for (size_t j = j0; j < j1; j++) { p[j] = (float)rng_normal(&r) * std; }
        }
    }
}

// The table's elements in all, and those that train in `mode` (what the config table counts)
static inline void flow_param_counts(const FlowConfig* c, int mode, size_t* total, size_t* trainable) {
    FlowParamTable t;
    flow_table_build(c, &t);
    *total = t.total;
    *trainable = flow_trainable_count(&t, mode);
}

// The seeded weights (flow_param_init) in a new array in the table's layout
static inline float* flow_init_params(const FlowConfig* c, uint64_t seed) {
    FlowParamTable t;
    flow_table_build(c, &t);
    float* params = (float*)mallocCheck(t.total * sizeof(float));
    flow_param_init(params, &t, c, seed);
    return params;
}

#endif  // VLA_CONFIG_H
