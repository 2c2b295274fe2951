"""
model.py: the PyTorch oracle of train_vla: LeRobot's SmolVLA and pi0, with vla/'s plumbing.

The third, independent copy of the model, after train_vla.c and train_vla.cu. dev/smolvla.py computes SmolVLA and pi0
exactly as LeRobot 0.6.1 does (forward, loss, sampling, the resize with padding), from LeRobot's
tensor names. This file adds what the C trainers add around that math, reproduced bit for bit so they
can be compared with it tensor by tensor: vla/config.h's FlowConfig (its family field: 0 SmolVLA,
1 pi0), presets and parameter table (our names, stacked per-layer tensors; a tensor the family does
not have has no element) with the mapping to LeRobot's names both ways, the counter-based
RNG (flow_param_init's seeded weights, the sampler's permutations, the flow noise), the training
modes as the table's train column, batches from the dataset shards, the learning-rate schedule,
AdamW on the trainable elements, the debug-state file that test_vla.c / test_vla_gpu.cu read, and
the trainers' checkpoints (version 2), which --init reads to continue their run. The math itself
is imported from dev/smolvla.py, never copied.

Shapes: B batch, H chunk, A the dataset's action dims, Amax = max_action_dim, Smax = max_state_dim,
Lt = max_text tokens, S = img (the vision tower's square input), h_k x w_k camera k's stored frames.

    build/venv/bin/python dev/model.py -i x.bin -p tiny --debug-state smolvla_debug.bin
    build/venv/bin/python dev/model.py -i x.bin -p tiny --train-mode all -b 8 --train 20
    build/venv/bin/python dev/model.py -i x.bin --init out/small/ckpt_00000100.bin -b 8 --train 20   # continue a C run
    build/venv/bin/python dev/model.py -i x.bin --policy build/lerobot_ref/vlm/policy --debug-state out.bin
    build/venv/bin/python dev/model.py -i build/test/a.bin -p pi0_tiny --dtype float64 -b 4 --seed 1337 --train 5 -n 5 \
        -l 1e-3 -u 2 -w 0.1 -c 0.5 --train-mode all > build/test/a_pi0_train.txt   # pi0's reference losses
    build/venv/bin/python dev/model.py -i x.bin -p pi0_tiny --train 5 --decay-on all --save-params w.bin   # weights after
    python dev/model.py -i x.bin -p smolvla -b 8 --bench 20 --device cuda --amp bf16 --compile

Training modes (--train-mode, LeRobot's flags; vla/config.h's train column, flow_trainable_numel):
  expert  train_expert_only=True:  the expert, state_proj, action_in/out_proj, the time MLP
  vlm     train_expert_only=False, freeze_vision_encoder=True: also the connector, embed_tokens
          and the VLM's layers but its last (the last layer, its final norm and lm_head never train)
  all     also the vision tower
A tensor's trainable elements are a prefix of it (stacked tensors are layer-major): gradients,
AdamW moments, decay, clipping and the gradient norm cover that prefix only; the rest is frozen.
Without --train-mode: the preset's default (flow_default_train_mode: expert for smolvla, all for
the others: pi0's own default, and the presets trained from scratch), the policy's flags with
--policy, the checkpoint's mode with --init. pi0 freezes less in modes vlm and all: its VLM's last layer
trains its input norm and q/k/v (the keys and values feed the expert; the queries get a zero
gradient), and only that layer's o_proj, MLP and norm, which feed nothing, stay frozen.

RNG (vla/rng.h): draw c of stream (seed, s) is splitmix64(key + c * GOLDEN), so any draw is reached by
seeking. Flow noise (flow_noise_width with width max_action_dim, LeRobot's noise (B, H, 32)): global
sample g of step s owns draws g * (1 + 2 H Amax) + 1 ... of stream (seed, RNG_STREAM_NOISE(s)): the
first is t = 0.999 * U^(1/1.5) + 0.001 (then float), then 2 per eps entry (rng_normal's Box-Muller,
then float) in (slot, dim) order: eps[h][d] for h < H, d < Amax, d fastest.

Debug state (--debug-state OUT, a "VLAT" container: magic "VLAT", version 1, then per record a
104-byte header (name[64], dtype 0=f32 1=u8 2=i32, ndim, 4 x u64 dims) and the data).
Everything is computed in float64 (--dtype) and stored as float32:
  config             i32 (27)              SmolVLAConfig in FLOW_CONFIG_FIELDS order, family last (--init
                                           reads states of 26, written before pi0, as SmolVLA)
  hparams            f32 (6)               lr, min_lr_frac, warmup, steps, weight decay, clip
  seed               i32 (1)               init (unless --policy/--init), sampler and flow-noise seed
  train_mode         i32 (1)               0 expert, 1 vlm, 2 all (TRAIN_MODE_*)
  stats              f32 (2(S+A))          state mean, std, action mean, std (the dataset's, std
                                           floored to 1 as dataset_open does)
  param/<name>       f32 table shape       every tensor of FLOW_PARAMETERS, in table order (those the
                                           family does not have with no element)
  batch/indices      i32 (B)               the sampler's samples of step 0
  batch/image<k>     u8  (B, h_k, w_k, 3)  camera k's frames at their stored size, k < n_cam
  batch/tokens       i32 (B, Lt)           token ids, cut to Lt, pad_token past the instruction
  batch/token_mask   f32 (B, Lt)           1 = instruction token, 0 = pad
  batch/state        f32 (B, Smax)         (x - mean) / std, zero-padded
  batch/actions      f32 (B, H, Amax)      normalized chunk (slots past the episode repeat its last
                                           action), zero-padded
  batch/action_is_pad f32 (B, H)           1 = slot past the episode's end (no loss in SmolVLA; pi0's
                                           loss counts every slot)
  batch/t            f32 (B)               flow time of step 0
  batch/eps          f32 (B, H, Amax)      flow noise of step 0
  expect/pixels      f32 (n_cam B, 3, S, S) frames resized with padding, x*2-1 (camera-major)
  expect/v           f32 (B, H, Amax)      velocities v_t (action_out_proj's output)
  expect/loss        f32 (1)               sum over valid slots and the first A dims of (u - v)^2,
                                           / max(1, valid slots * A); pi0: the mean over all B H A
  grad/<name>        f32 table shape       d loss / d param of every tensor with trainable elements in
                                           this mode, the whole tensor, its frozen part zero (tensors
                                           with none have no record). grad/vis_bk is zero by symmetry
                                           (softmax ignores a shift): rounding noise, to be compared
                                           against grad/vis_bq's scale, not relatively
  fd/index           i32 (n, 2)            (table index, flat element) of the largest |grad| of every
                                           tensor whose gradient is not zero (to 1e-12 of the largest)
  fd/value           f32 (n)               central finite differences of the loss there
  expect/sample      f32 (B, H, Amax)      10 Euler steps from batch/eps (t = 1, 0.9, ..., 0.1),
                                           normalized units
  expect/sample_actions f32 (B, H, A)      the same, first A dims, un-normalized (x * std + mean)
  expect/losses      f32 (10)              losses of 10 AdamW steps on this batch (same t, eps)
  expect/norms       f32 (10)              their gradient norms before clipping
--train N --save-params OUT writes the weights after the N steps in the same container: the config
record and a param/<name> record per tensor, in float32 (--init reads it back).

What the C side does to match (besides the math of dev/smolvla.py): the flow noise above; the
batch of dataset_assemble with state/actions zero-padded to Smax/Amax and action_is_pad = 1 -
action_mask; the loss's divisor max(1, valid slots * A) (pi0's: B H A); AdamW (m = 0.9 m + 0.1 g, v = 0.95 v +
0.05 g^2, bias corrections 1 - 0.9^(s+1) and 1 - 0.95^(s+1), update = m_hat / (sqrt(v_hat) + 1e-8)
+ wd p on decay tensors (every trained one with --decay-on all), p -= lr update) on the first
flow_trainable_numel elements of each tensor only, clipping by the global norm of those
gradients; lr_at_step's schedule. Token pads are the config's pad_token, as dataset_assemble writes
them and LeRobot's tokenizer pads (its pad id); pads are masked as keys and as queries, so no number
depends on their value.
"""

import argparse
import collections
import dataclasses
import json
import math
import os
import struct
import statistics
import sys
import time
import types
import zlib

import numpy as np
import torch

DEV = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, DEV)
sys.path.insert(0, os.path.join(DEV, "..", "data"))
import smolvla  # noqa: E402  dev/smolvla.py: SmolVLA's math as LeRobot computes it
from vla_shard import Dataset  # noqa: E402

# ----------------------------------------------------------------------------
# config and presets (vla/config.h: FlowConfig, FLOW_CONFIG_FIELDS, FLOW_PRESETS)


@dataclasses.dataclass
class SmolVLAConfig:  # field order is FLOW_CONFIG_FIELDS' and the debug state's
    n_cam: int
    state_dim: int
    action_dim: int
    img: int
    patch: int
    vis_width: int
    vis_ff: int
    vis_layers: int
    vis_heads: int
    scale_factor: int
    vocab: int
    pad_token: int
    max_text: int
    d_model: int
    d_ff: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_expert: int
    d_expert_ff: int
    self_attn_every: int
    chunk: int
    max_state_dim: int
    max_action_dim: int
    rope_theta: int
    family: int = 0  # FAMILY_SMOLVLA or FAMILY_PI0; a file written before pi0 holds none: SmolVLA

    def values(self):
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @property
    def grid(self):  # patches per image side
        return self.img // self.patch

    @property
    def patch_dim(self):
        return 3 * self.patch * self.patch

    @property
    def d_attn(self):
        return self.n_head * self.head_dim

    @property
    def d_kv(self):
        return self.n_kv_head * self.head_dim

    def layer_is_cross(self, l):  # flow_layer_is_cross: the one statement of the layer schedule
        return l % self.self_attn_every != 0

    @property
    def n_joint(self):
        return (self.n_layer + self.self_attn_every - 1) // self.self_attn_every

    @property
    def n_cross(self):
        return self.n_layer - self.n_joint

    # what differs between the families: vla/config.h's functions of the same names, and dev/smolvla.py's
    @property
    def is_pi0(self):
        return self.family == FAMILY_PI0

    @property
    def state_in_suffix(self):  # the state token: the prefix's last (SmolVLA, C wide) or the suffix's first (pi0, Ce)
        return self.is_pi0

    @property
    def state_width(self):
        return self.d_expert if self.state_in_suffix else self.d_model

    @property
    def connector_bias(self):  # pi0's projector has a bias
        return self.is_pi0

    @property
    def image_tokens(self):  # per camera, after the pixel shuffle
        return (self.grid // self.scale_factor) ** 2

    @property
    def n_prefix(self):
        return self.n_cam * self.image_tokens + self.max_text + (not self.state_in_suffix)

    @property
    def n_suffix(self):  # the expert's tokens: the chunk, and pi0's state token
        return self.chunk + self.state_in_suffix


CONFIG_FIELDS = [f.name for f in dataclasses.fields(SmolVLAConfig)]
FAMILY_SMOLVLA, FAMILY_PI0 = 0, 1
FAMILY_NAMES = ["smolvla", "pi0"]  # dev/smolvla.py's family names, by vla/config.h's FAMILY_*

# n_cam, state_dim and action_dim are replaced by the dataset's (FLOW_PRESETS says what each is)
PRESETS = {  # cam S A img p Cv Cv_ff Lv NHv s vocab pad text C C_ff L NH NKV HS Ce Ce_ff n H Smax Amax theta family
    "tiny": SmolVLAConfig(1, 4, 4, 32, 8, 32, 64, 1, 2, 2, 256, 0, 16, 48, 96, 2, 4, 2, 16, 48, 256, 2, 8, 32, 32,
                          10000, FAMILY_SMOLVLA),
    "small": SmolVLAConfig(2, 4, 4, 64, 8, 48, 96, 1, 2, 2, 256, 0, 48, 64, 192, 2, 4, 2, 16, 48, 256, 2, 8, 32, 32,
                           10000, FAMILY_SMOLVLA),
    "smolvla": SmolVLAConfig(2, 32, 32, 512, 16, 768, 3072, 12, 12, 4, 49280, 2, 48, 960, 2560, 16, 15, 5, 64, 720,
                             2048, 2, 50, 32, 32, 10000, FAMILY_SMOLVLA),
    "pi0_tiny": SmolVLAConfig(1, 4, 4, 32, 8, 32, 64, 2, 2, 1, 256, 0, 16, 64, 128, 2, 8, 1, 8, 32, 64, 1, 8, 32, 32,
                              10000, FAMILY_PI0),
    "pi0_small": SmolVLAConfig(2, 4, 4, 64, 16, 48, 96, 1, 2, 1, 256, 0, 48, 64, 192, 2, 8, 1, 8, 48, 128, 1, 8, 32, 32,
                               10000, FAMILY_PI0),
    "pi0": SmolVLAConfig(2, 32, 32, 224, 14, 1152, 4304, 27, 16, 1, 257152, 0, 48, 2048, 16384, 18, 8, 1, 256, 1024,
                         4096, 1, 50, 32, 32, 10000, FAMILY_PI0),
}

# vla/common.h's bounds on the sizes a config may hold
MAX_CAM, MAX_IMG, MAX_DIM, MAX_TEXT, MAX_CHUNK = 16, 4096, 4096, 1024, 1024
MAX_WIDTH, MAX_LAYER, MAX_HEAD, MAX_TOKENS, MAX_PARAMS = 65536, 1024, 1024, 16384, 1 << 36


def config_problem(c):
    """None if the config is usable, else what is wrong (flow_config_problem)."""
    if not 0 <= c.family < len(FAMILY_NAMES):
        return f"family {c.family} is not one of 0 (smolvla) and 1 (pi0)"
    for name in CONFIG_FIELDS:
        if getattr(c, name) <= 0 and name not in ("pad_token", "family"):
            return f"{name} must be positive (got {getattr(c, name)})"
    bounds = dict(n_cam=MAX_CAM, img=MAX_IMG, patch=c.img, vis_width=MAX_WIDTH, vis_ff=MAX_WIDTH,
                  vis_layers=MAX_LAYER, vis_heads=c.vis_width, scale_factor=c.img // c.patch, vocab=1 << 24,
                  pad_token=c.vocab - 1, max_text=MAX_TEXT, d_model=MAX_WIDTH, d_ff=MAX_WIDTH, n_layer=MAX_LAYER,
                  n_head=MAX_HEAD, n_kv_head=c.n_head, head_dim=MAX_HEAD, d_expert=MAX_WIDTH, d_expert_ff=MAX_WIDTH,
                  self_attn_every=c.n_layer, chunk=MAX_CHUNK, max_state_dim=MAX_DIM, max_action_dim=MAX_DIM,
                  state_dim=c.max_state_dim, action_dim=c.max_action_dim)
    for name, bound in bounds.items():
        if getattr(c, name) > bound:
            return f"{name} {getattr(c, name)} is past its bound {bound}"
    if c.pad_token < 0:
        return f"pad_token must not be negative (got {c.pad_token})"
    if c.is_pi0 and (c.self_attn_every != 1 or c.scale_factor != 1):
        return (f"pi0 has every layer joint and no pixel shuffle: self_attn_every {c.self_attn_every} and scale_factor "
                f"{c.scale_factor} must be 1")
    if c.img % c.patch != 0 or (c.img // c.patch) % c.scale_factor != 0:
        return f"img {c.img} / patch {c.patch} must be a whole grid that scale_factor {c.scale_factor} divides"
    if c.vis_width % c.vis_heads != 0:
        return f"vis_width {c.vis_width} is not a multiple of vis_heads {c.vis_heads}"
    if c.n_head % c.n_kv_head != 0:
        return f"n_head {c.n_head} is not a multiple of n_kv_head {c.n_kv_head} (GQA)"
    if c.head_dim % 2 != 0 or c.d_expert % 2 != 0:
        return f"head_dim {c.head_dim} (RoPE) and d_expert {c.d_expert} (time embedding) must be even"
    tokens = c.n_prefix + c.n_suffix
    if tokens > MAX_TOKENS or c.grid * c.grid > MAX_TOKENS:
        return f"{tokens} tokens ({c.grid * c.grid} per image in the vision tower) are past the bound {MAX_TOKENS}"
    if param_count(c) > MAX_PARAMS:
        return "the parameter count is past the bound 2^36"
    return None


# ----------------------------------------------------------------------------
# the parameter table (vla/config.h: FLOW_PARAMETERS), and its mapping to LeRobot's names

TOWER_VISION, TOWER_VLM, TOWER_EXPERT, TOWER_STATE = 0, 1, 2, 3
KIND_INPUT, KIND_LAYER, KIND_HEAD = 0, 1, 2
TRAIN_ALWAYS, TRAIN_VLM, TRAIN_VLM_BUT_LAST, TRAIN_VISION, TRAIN_NEVER, TRAIN_VLM_QKV = 0, 1, 2, 3, 4, 5
SLICES_NONE, SLICES_VISION, SLICES_ALL, SLICES_JOINT, SLICES_CROSS = 0, 1, 2, 3, 4
INIT_NORMAL, INIT_NORMAL_OUT, INIT_ZERO, INIT_ONE, INIT_RMS = 0, 1, 2, 3, 4
NAME_VIS, NAME_CONN, NAME_TXT, NAME_EXP, NAME_TOP = 0, 1, 2, 3, 4  # the module a tensor sits in
TRAIN_MODES = ["expert", "vlm", "all"]  # TRAIN_MODE_EXPERT, _VLM, _ALL: the index is the mode
DECAY_ON = ["matrices", "all"]  # DECAY_ON_MATRICES, _ALL: the table's decay tensors, or every trained one


def default_train_mode(preset):
    """flow_default_train_mode: LeRobot's fine-tuning of the released SmolVLA trains the expert;
    pi0 and the presets trained from scratch train everything."""
    return TRAIN_MODES.index("expert") if preset == "smolvla" else TRAIN_MODES.index("all")


LM_HEAD = smolvla.MODULES["smolvla"].vlm_lm_head + "weight"  # SmolVLA's lm_head feeds nothing: the table leaves it out

ParamSpec = collections.namedtuple("ParamSpec", "name lerobot tower kind train decay init slices shape offset")


def name_prefixes(c):
    """FLOW_NAME_PREFIX[family]: the family's LeRobot module prefix of each NAME_* (dev/smolvla.py's)."""
    m = smolvla.MODULES[FAMILY_NAMES[c.family]]
    return {NAME_VIS: m.vision, NAME_CONN: m.connector + ".", NAME_TXT: m.text, NAME_EXP: m.expert, NAME_TOP: m.heads}


def lm_heads(c):
    """The lm_heads a LeRobot model.safetensors of this family holds: they feed nothing, the table
    leaves them out."""
    m = smolvla.MODULES[FAMILY_NAMES[c.family]]
    return {head + "weight" for head in (m.vlm_lm_head, m.expert_lm_head) if head is not None}


def param_rows(c):
    """FLOW_PARAMETERS' rows as vla/config.h writes them: name, module (NAME_*), LeRobot name in it
    (%d = layer), tower, kind, train, decay, init, slices, shape. Linear weights are (out, in);
    per-layer tensors are stacked layer-major. TOWER_STATE, TRAIN_VLM_QKV and INIT_RMS are the
    family's to resolve (param_table); a tensor the family does not have has no elements (the
    projector's bias in SmolVLA, the cross layers' k/v in pi0)."""
    Cv, Fv, Lv = c.vis_width, c.vis_ff, c.vis_layers
    C, L, D, KV, Ce, Am = c.d_model, c.n_layer, c.d_attn, c.d_kv, c.d_expert, c.max_action_dim
    V, N, T, E, Hd = NAME_VIS, NAME_CONN, NAME_TXT, NAME_EXP, NAME_TOP
    # (tower, kind, train) of each group of rows, and (decay, init) of each kind of tensor
    vis_in, vis_layer = (TOWER_VISION, KIND_INPUT, TRAIN_VISION), (TOWER_VISION, KIND_LAYER, TRAIN_VISION)
    vis_head = (TOWER_VISION, KIND_HEAD, TRAIN_VISION)
    vlm_in, state = (TOWER_VLM, KIND_INPUT, TRAIN_VLM), (TOWER_STATE, KIND_INPUT, TRAIN_ALWAYS)
    vlm_qkv, vlm_layer = (TOWER_VLM, KIND_LAYER, TRAIN_VLM_QKV), (TOWER_VLM, KIND_LAYER, TRAIN_VLM_BUT_LAST)
    vlm_head = (TOWER_VLM, KIND_HEAD, TRAIN_NEVER)
    exp_in, exp_layer = (TOWER_EXPERT, KIND_INPUT, TRAIN_ALWAYS), (TOWER_EXPERT, KIND_LAYER, TRAIN_ALWAYS)
    exp_head = (TOWER_EXPERT, KIND_HEAD, TRAIN_ALWAYS)
    matrix, out, bias = (1, INIT_NORMAL), (1, INIT_NORMAL_OUT), (0, INIT_ZERO)
    scale, rms = (0, INIT_ONE), (0, INIT_RMS)
    VL, ALL, NONE, JOINT, CROSS = SLICES_VISION, SLICES_ALL, SLICES_NONE, SLICES_JOINT, SLICES_CROSS
    return [
        ("vis_patch_w", V, "embeddings.patch_embedding.weight", *vis_in, *matrix, NONE, (Cv, c.patch_dim)),
        ("vis_patch_b", V, "embeddings.patch_embedding.bias", *vis_in, *bias, NONE, (Cv,)),
        ("vis_pos", V, "embeddings.position_embedding.weight", *vis_in, *matrix, NONE, (c.grid * c.grid, Cv)),
        ("vis_ln1_w", V, "encoder.layers.%d.layer_norm1.weight", *vis_layer, *scale, VL, (Lv, Cv)),
        ("vis_ln1_b", V, "encoder.layers.%d.layer_norm1.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_wq", V, "encoder.layers.%d.self_attn.q_proj.weight", *vis_layer, *matrix, VL, (Lv, Cv, Cv)),
        ("vis_bq", V, "encoder.layers.%d.self_attn.q_proj.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_wk", V, "encoder.layers.%d.self_attn.k_proj.weight", *vis_layer, *matrix, VL, (Lv, Cv, Cv)),
        ("vis_bk", V, "encoder.layers.%d.self_attn.k_proj.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_wv", V, "encoder.layers.%d.self_attn.v_proj.weight", *vis_layer, *matrix, VL, (Lv, Cv, Cv)),
        ("vis_bv", V, "encoder.layers.%d.self_attn.v_proj.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_wo", V, "encoder.layers.%d.self_attn.out_proj.weight", *vis_layer, *out, VL, (Lv, Cv, Cv)),
        ("vis_bo", V, "encoder.layers.%d.self_attn.out_proj.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_ln2_w", V, "encoder.layers.%d.layer_norm2.weight", *vis_layer, *scale, VL, (Lv, Cv)),
        ("vis_ln2_b", V, "encoder.layers.%d.layer_norm2.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_fc1_w", V, "encoder.layers.%d.mlp.fc1.weight", *vis_layer, *matrix, VL, (Lv, Fv, Cv)),
        ("vis_fc1_b", V, "encoder.layers.%d.mlp.fc1.bias", *vis_layer, *bias, VL, (Lv, Fv)),
        ("vis_fc2_w", V, "encoder.layers.%d.mlp.fc2.weight", *vis_layer, *out, VL, (Lv, Cv, Fv)),
        ("vis_fc2_b", V, "encoder.layers.%d.mlp.fc2.bias", *vis_layer, *bias, VL, (Lv, Cv)),
        ("vis_post_w", V, "post_layernorm.weight", *vis_head, *scale, NONE, (Cv,)),
        ("vis_post_b", V, "post_layernorm.bias", *vis_head, *bias, NONE, (Cv,)),
        ("connector_w", N, "weight", *vlm_in, *matrix, NONE, (C, Cv * c.scale_factor ** 2)),
        ("connector_b", N, "bias", *vlm_in, *bias, NONE, (C if c.connector_bias else 0,)),
        ("embed_tokens", T, "embed_tokens.weight", *vlm_in, *matrix, NONE, (c.vocab, C)),
        ("state_w", Hd, "state_proj.weight", *state, *matrix, NONE, (c.state_width, c.max_state_dim)),
        ("state_b", Hd, "state_proj.bias", *state, *bias, NONE, (c.state_width,)),
        ("vlm_ln1", T, "layers.%d.input_layernorm.weight", *vlm_qkv, *rms, ALL, (L, C)),
        ("vlm_wq", T, "layers.%d.self_attn.q_proj.weight", *vlm_qkv, *matrix, ALL, (L, D, C)),
        ("vlm_wk", T, "layers.%d.self_attn.k_proj.weight", *vlm_qkv, *matrix, ALL, (L, KV, C)),
        ("vlm_wv", T, "layers.%d.self_attn.v_proj.weight", *vlm_qkv, *matrix, ALL, (L, KV, C)),
        ("vlm_wo", T, "layers.%d.self_attn.o_proj.weight", *vlm_layer, *out, ALL, (L, C, D)),
        ("vlm_ln2", T, "layers.%d.post_attention_layernorm.weight", *vlm_layer, *rms, ALL, (L, C)),
        ("vlm_gate", T, "layers.%d.mlp.gate_proj.weight", *vlm_layer, *matrix, ALL, (L, c.d_ff, C)),
        ("vlm_up", T, "layers.%d.mlp.up_proj.weight", *vlm_layer, *matrix, ALL, (L, c.d_ff, C)),
        ("vlm_down", T, "layers.%d.mlp.down_proj.weight", *vlm_layer, *out, ALL, (L, C, c.d_ff)),
        ("vlm_norm", T, "norm.weight", *vlm_head, *rms, NONE, (C,)),
        ("action_in_w", Hd, "action_in_proj.weight", *exp_in, *matrix, NONE, (Ce, Am)),
        ("action_in_b", Hd, "action_in_proj.bias", *exp_in, *bias, NONE, (Ce,)),
        ("time_in_w", Hd, "action_time_mlp_in.weight", *exp_in, *matrix, NONE, (Ce, 2 * Ce)),
        ("time_in_b", Hd, "action_time_mlp_in.bias", *exp_in, *bias, NONE, (Ce,)),
        ("time_out_w", Hd, "action_time_mlp_out.weight", *exp_in, *matrix, NONE, (Ce, Ce)),
        ("time_out_b", Hd, "action_time_mlp_out.bias", *exp_in, *bias, NONE, (Ce,)),
        ("exp_ln1", E, "layers.%d.input_layernorm.weight", *exp_layer, *rms, ALL, (L, Ce)),
        ("exp_wq", E, "layers.%d.self_attn.q_proj.weight", *exp_layer, *matrix, ALL, (L, D, Ce)),
        # k/v read the expert's stream (Ce wide) in joint layers, the VLM's K/V (KV wide) in cross layers
        ("exp_wk_joint", E, "layers.%d.self_attn.k_proj.weight", *exp_layer, *matrix, JOINT, (c.n_joint, KV, Ce)),
        ("exp_wv_joint", E, "layers.%d.self_attn.v_proj.weight", *exp_layer, *matrix, JOINT, (c.n_joint, KV, Ce)),
        ("exp_wk_cross", E, "layers.%d.self_attn.k_proj.weight", *exp_layer, *matrix, CROSS, (c.n_cross, KV, KV)),
        ("exp_wv_cross", E, "layers.%d.self_attn.v_proj.weight", *exp_layer, *matrix, CROSS, (c.n_cross, KV, KV)),
        ("exp_wo", E, "layers.%d.self_attn.o_proj.weight", *exp_layer, *out, ALL, (L, Ce, D)),
        ("exp_ln2", E, "layers.%d.post_attention_layernorm.weight", *exp_layer, *rms, ALL, (L, Ce)),
        ("exp_gate", E, "layers.%d.mlp.gate_proj.weight", *exp_layer, *matrix, ALL, (L, c.d_expert_ff, Ce)),
        ("exp_up", E, "layers.%d.mlp.up_proj.weight", *exp_layer, *matrix, ALL, (L, c.d_expert_ff, Ce)),
        ("exp_down", E, "layers.%d.mlp.down_proj.weight", *exp_layer, *out, ALL, (L, Ce, c.d_expert_ff)),
        ("exp_norm", E, "norm.weight", *exp_head, *rms, NONE, (Ce,)),
        ("action_out_w", Hd, "action_out_proj.weight", *exp_head, *matrix, NONE, (Am, Ce)),
        ("action_out_b", Hd, "action_out_proj.bias", *exp_head, *bias, NONE, (Am,)),
    ]


# the family's reading of the columns that depend on it (flow_resolve_tower, _train, _init)
def resolve_tower(c, tower):  # the state token's projection: the VLM's (a prefix token) or the expert's (pi0)
    return (TOWER_EXPERT if c.state_in_suffix else TOWER_VLM) if tower == TOWER_STATE else tower


def resolve_train(c, train):
    """The VLM's last layer feeds the expert its keys and values: SmolVLA freezes it whole, pi0 trains its
    input norm and q/k/v (its queries get a zero gradient); its o_proj, MLP and norm feed nothing."""
    return (TRAIN_VLM if c.is_pi0 else TRAIN_VLM_BUT_LAST) if train == TRAIN_VLM_QKV else train


def resolve_init(c, init):  # an RMSNorm's weight: 1 in Llama's w form, 0 in Gemma's (1 + w) form
    return (INIT_ZERO if c.is_pi0 else INIT_ONE) if init == INIT_RMS else init


def param_table(c):
    """Every tensor in table order with its element offset into the flat buffer and its columns
    resolved for the family (flow_table_build)."""
    table, offset, prefix = [], 0, name_prefixes(c)
    for name, where, lerobot, tower, kind, train, decay, init, slices, shape in param_rows(c):
        table.append(ParamSpec(name, prefix[where] + lerobot, resolve_tower(c, tower), kind, resolve_train(c, train),
                               decay, resolve_init(c, init), slices, shape, offset))
        offset += math.prod(shape)
    return table


def param_count(c):
    return sum(math.prod(row[-1]) for row in param_rows(c))


def n_slices(s):
    """flow_slices: a stacked tensor's leading dimension, else 1; 0 for a tensor the family does not have."""
    if math.prod(s.shape) == 0:
        return 0
    return 1 if s.slices == SLICES_NONE else s.shape[0]


def slice_numel(s):  # flow_slice_numel: the elements of one slice
    return math.prod(s.shape) // n_slices(s) if n_slices(s) else 0


def trainable_numel(s, mode):
    """The elements of tensor s that train in `mode` (0 expert, 1 vlm, 2 all): a prefix of it
    (flow_trainable_numel). 'Every layer but the last' is the first numel - numel/L elements."""
    numel = math.prod(s.shape)
    if s.train == TRAIN_ALWAYS:
        return numel
    if s.train == TRAIN_VLM:
        return numel if mode >= 1 else 0
    if s.train == TRAIN_VLM_BUT_LAST:
        return numel - slice_numel(s) if mode >= 1 else 0
    if s.train == TRAIN_VISION:
        return numel if mode == 2 else 0
    return 0


def slice_layer(c, s, i):
    """LeRobot's layer number of slice i of a stacked tensor (flow_slice_layer)."""
    if s.slices == SLICES_JOINT:
        return i * c.self_attn_every
    if s.slices == SLICES_CROSS:
        return [l for l in range(c.n_layer) if c.layer_is_cross(l)][i]
    return i


def lerobot_names(c, s):
    """LeRobot's name of each slice of tensor s (one name for an unstacked tensor, none for a tensor
    the family does not have)."""
    if s.slices == SLICES_NONE:
        return [s.lerobot] if n_slices(s) else []
    return [s.lerobot % slice_layer(c, s, i) for i in range(n_slices(s))]


def lerobot_shape(c, s):
    """The shape LeRobot stores one slice of s in: the patch embedding is a convolution weight."""
    if s.name == "vis_patch_w":
        return (c.vis_width, 3, c.patch, c.patch)
    return tuple(s.shape[1:]) if s.slices != SLICES_NONE else tuple(s.shape)


def to_lerobot(c, params):
    """Our tensors (name -> tensor, table shapes) -> LeRobot's (name -> view of ours, no copy), so
    gradients of dev/smolvla.py's math land in our tensors. The lm_heads are not among them."""
    out = {}
    for s in param_table(c):
        p = params[s.name]
        shape = lerobot_shape(c, s)
        names = lerobot_names(c, s)
        if s.slices == SLICES_NONE:
            out.update({name: p.reshape(shape) for name in names})
        else:
            for i, name in enumerate(names):
                out[name] = p[i].reshape(shape)
    return out


def from_lerobot(c, tensors):
    """LeRobot's tensors (name -> tensor) -> ours (name -> new tensor in table shape). Every tensor
    of the table must be there with LeRobot's shape; the lm_heads, if present, are dropped."""
    expected = {n for s in param_table(c) for n in lerobot_names(c, s)}
    missing = sorted(expected - set(tensors))
    unexpected = sorted(set(tensors) - expected - lm_heads(c))
    if missing or unexpected:
        raise ValueError(f"LeRobot tensors do not match the table: missing {missing[:3]}, unexpected {unexpected[:3]}")
    out = collections.OrderedDict()
    for s in param_table(c):
        slices = []
        for name in lerobot_names(c, s):
            t = tensors[name]
            if tuple(t.shape) != lerobot_shape(c, s):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, the table says {lerobot_shape(c, s)}")
            slices.append(t.reshape(s.shape[1:] if s.slices != SLICES_NONE else s.shape))
        if not slices:  # a tensor the family does not have
            out[s.name] = torch.zeros(s.shape)
        else:
            out[s.name] = slices[0].clone() if s.slices == SLICES_NONE else torch.stack(slices)
    return out


# ----------------------------------------------------------------------------
# counter-based RNG, bit-exact with vla/rng.h: draw c of a stream is splitmix64(key + c * GOLDEN),
# so any draw is reached by seeking and whole tensors are drawn at once with uint64 arrays
# (whose multiplications wrap mod 2^64, as in C).

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM_INIT = 1


def STREAM_EPOCH(e):  # sampler permutation of epoch e
    return (2 << 56) + e


def STREAM_NOISE(s):  # t and eps of optimizer step s
    return (3 << 56) + s


def rng_mix64(x):
    """splitmix64 finalizer of a uint64 array."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def rng_key(seed, stream):
    """rng_init's key (as a Python int) of stream `stream` under `seed`."""
    a = int(rng_mix64(np.uint64((seed + GOLDEN) & MASK64)))
    b = int(rng_mix64(np.uint64((stream * GOLDEN + 1) & MASK64)))
    return a ^ b


def rng_draws(key, first, n):
    """Raw u64 draws number first..first+n-1 (draw c is the one rng_u64 returns at counter c)."""
    counters = np.arange(n, dtype=np.uint64) + np.uint64(first)
    with np.errstate(over="ignore"):
        return rng_mix64(np.uint64(key) + counters * np.uint64(GOLDEN))


def u53(u):
    """The top 53 bits as a float64 in [0, 1)."""
    return (u >> np.uint64(11)).astype(np.float64) * 2.0**-53


def rng_normals(key, first, n):
    """n Box-Muller normals (cosine branch) from draws first, first+1, ... two per normal,
    as float32: the value C gets from (float)rng_normal()."""
    u = rng_draws(key, first, 2 * n)
    u1 = ((u[0::2] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]: log is finite
    u2 = u53(u[1::2])
    x = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    # numpy's vectorized log/cos may differ from libm's (which C calls) by a few ulps of the
    # double (5 at most in tests). That decides the float32 only next to a rounding tie:
    # redo the few values within 64 ulps of one with libm, so the float32 is bit-exact.
    margin = 64 * np.spacing(np.abs(x))
    near_tie = (x - margin).astype(np.float32) != (x + margin).astype(np.float32)
    for i in np.flatnonzero(near_tie):
        x[i] = math.sqrt(-2.0 * math.log(u1[i])) * math.cos(6.283185307179586 * u2[i])
    return x.astype(np.float32)


def rng_flow_time(u):
    """t = 0.999 * Beta(1.5, 1) + 0.001 from one uniform, Beta(1.5, 1) = U^(1/1.5); float32.
    libm's pow (math.pow), as C: numpy's may differ in the last bit."""
    return np.float32(0.999 * math.pow(float(u), 1.0 / 1.5) + 0.001)


def param_init(c, seed):
    """flow_param_init: normal(0, 0.02) from the counter at 2 * offset (element j of the tensor
    at offset o uses draws 2(o+j)+1, 2(o+j)+2), output projections 0.02 / sqrt(2 depth) with depth
    vis_layers in the vision tower and n_layer elsewhere (float math as C), zeros, ones.
    Returns name -> float32 numpy array."""
    key = rng_key(seed, STREAM_INIT)
    params = collections.OrderedDict()
    for s in param_table(c):
        numel = math.prod(s.shape)
        if s.init in (INIT_ZERO, INIT_ONE):
            params[s.name] = np.full(s.shape, 1.0 if s.init == INIT_ONE else 0.0, np.float32)
            continue
        depth = c.vis_layers if s.tower == TOWER_VISION else c.n_layer
        std = np.float32(0.02)
        if s.init == INIT_NORMAL_OUT:
            std = np.float32(0.02) / np.sqrt(np.float32(2.0) * np.float32(depth))  # 0.02f / sqrtf(2.0f * depth)
        x = np.empty(numel, np.float32)
        for j in range(0, numel, 1 << 22):  # chunks keep the uint64 temporaries small
            m = min(1 << 22, numel - j)
            x[j:j + m] = rng_normals(key, 2 * (s.offset + j) + 1, m) * std
        params[s.name] = x.reshape(s.shape)
    return params


def flow_noise_width(chunk, width, seed, step, g):
    """t (float32) and eps (float32, (chunk, width)) of global sample g at optimizer step `step`
    (vla/rng.h's flow_noise_width). Stream (seed, RNG_STREAM_NOISE(step)); sample g owns the
    1 + 2 chunk width draws after counter g (1 + 2 chunk width): one for t, then two per eps entry
    (Box-Muller) in (slot, dim) order. SmolVLA draws eps over max_action_dim dims, LeRobot's width."""
    key = rng_key(seed, STREAM_NOISE(step))
    n = chunk * width
    base = g * (1 + 2 * n)
    t = rng_flow_time(u53(rng_draws(key, base + 1, 1))[0])
    eps = rng_normals(key, base + 2, n).reshape(chunk, width)
    return t, eps


def flow_noise(c, seed, step, g):
    """The flow noise of config c's model: t and eps (H, Amax)."""
    return flow_noise_width(c.chunk, c.max_action_dim, seed, step, g)


def sampler_permutation(n, seed, epoch):
    """Fisher-Yates over n samples from the epoch's stream (sampler_permutation)."""
    if n > 0xFFFFFFFF:
        raise ValueError(f"dataset has {n} samples; the sampler supports up to 2^32")
    perm = list(range(n))
    draws = rng_draws(rng_key(seed, STREAM_EPOCH(epoch)), 1, max(n - 1, 0))
    bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1 .. 1
    picks = (draws % bounds).tolist()
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = picks[k]
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, np.int64)


class Sampler:
    """Sample at global position pos is perm_e[pos % n] with e = pos // n."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch, self.perm = n, seed, -1, None

    def at(self, pos):
        e = pos // self.n
        if e != self.epoch:
            self.perm, self.epoch = sampler_permutation(self.n, self.seed, e), e
        return int(self.perm[pos % self.n])

    def indices(self, pos, B):  # one rank of B samples, positions pos .. pos+B-1
        return [self.at(pos + i) for i in range(B)]


def lr_at_step(step, lr, warmup, steps, min_lr_frac):
    """Linear warmup to the peak, then cosine to min_lr_frac * peak, in float32 as vla/schedule.h."""
    f32 = np.float32
    lr, min_lr_frac = f32(lr), f32(min_lr_frac)
    if step < warmup:
        return float(lr * f32(step + 1) / f32(warmup))
    decay_steps = steps - warmup
    progress = f32(step - warmup) / f32(decay_steps) if decay_steps > 0 else f32(1.0)
    progress = min(progress, f32(1.0))
    floor_lr = lr * min_lr_frac
    cos = f32(math.cos(float(f32(3.14159265358979) * progress)))  # cosf: float64 cos rounded to float
    return float(floor_lr + f32(0.5) * (lr - floor_lr) * (f32(1.0) + cos))


# ----------------------------------------------------------------------------
# the model: our table's tensors, dev/smolvla.py's math on LeRobot-named views of them


def lerobot_config(c, mode, cameras=None):
    """dev/smolvla.py's config of our config in training mode `mode` (the C model's constants:
    LayerNorm eps 1e-6, RMSNorm eps 1e-5 (SmolLM2's) or 1e-6 (Gemma's), 10 sampling steps, periods
    4e-3 .. 4, square resize to img; pi0's every layer joint)."""
    expert_only, freeze_vision = smolvla.TRAIN_MODES[TRAIN_MODES[mode]]
    return smolvla.SmolVLAConfig(
        vis_image_size=c.img, vis_patch=c.patch, vis_width=c.vis_width, vis_layers=c.vis_layers,
        vis_heads=c.vis_heads, vis_mlp=c.vis_ff, vis_eps=1e-6, scale_factor=c.scale_factor,
        width=c.d_model, n_layer=c.n_layer, n_head=c.n_head, n_kv_head=c.n_kv_head, head_dim=c.head_dim,
        mlp=c.d_ff, rms_eps=1e-6 if c.is_pi0 else 1e-5, vocab=c.vocab, pad_token_id=c.pad_token,
        expert_width=c.d_expert, expert_mlp=c.d_expert_ff, chunk=c.chunk, max_state_dim=c.max_state_dim,
        max_action_dim=c.max_action_dim, state_dim=c.state_dim, action_dim=c.action_dim,
        cameras=tuple(cameras or (f"observation.images.cam{k}" for k in range(c.n_cam))),
        resize_hw=(c.img, c.img), num_steps=10, min_period=4e-3, max_period=4.0,
        attention_mode="self_attn" if c.is_pi0 else "cross_attn", self_attn_every_n_layers=c.self_attn_every,
        prefix_length=-1, train_expert_only=expert_only, freeze_vision_encoder=freeze_vision, train_state_proj=True,
        rope_base=float(c.rope_theta), family=FAMILY_NAMES[c.family])


class SmolVLA(torch.nn.Module):
    """The table's tensors as parameters (registered in table order). A tensor requires grad when
    some of it trains in `mode`; after backward its frozen part's gradient is zeroed (LeRobot
    freezes the last VLM layer's tensors, which share stacks with trained layers here)."""

    def __init__(self, cfg, mode, dtype=torch.float64, cameras=None):
        super().__init__()
        self.cfg, self.mode, self.dtype = cfg, mode, dtype
        self.lcfg = lerobot_config(cfg, mode, cameras)
        self.table = param_table(cfg)
        self.n_train = {s.name: trainable_numel(s, mode) for s in self.table}
        for s in self.table:
            self.register_parameter(s.name, torch.nn.Parameter(torch.zeros(s.shape, dtype=dtype),
                                                               requires_grad=self.n_train[s.name] > 0))

    def tensors(self):
        return collections.OrderedDict((s.name, getattr(self, s.name)) for s in self.table)

    def load(self, params):
        """Copies arrays or tensors (our name -> value) into the parameters, in this dtype."""
        with torch.no_grad():
            for s in self.table:
                value = params[s.name]
                if not torch.is_tensor(value):
                    value = torch.from_numpy(np.asarray(value, np.float32))
                getattr(self, s.name).copy_(value)

    def prepare(self, arrays, device="cpu"):
        """A batch as recorded (numpy) -> dev/smolvla.py's inputs: each camera's frames resized with
        padding to img, x*2-1 (B, 3, S, S); tokens int64 and mask bool; t float32."""
        dt = self.dtype
        images = [smolvla.prepare_image(self.lcfg, smolvla.images_from_u8(torch.from_numpy(im), dt))
                  for im in arrays["images"]]
        x = dict(images=images, lang_tokens=torch.from_numpy(arrays["tokens"]).long(),
                 lang_masks=torch.from_numpy(arrays["token_mask"]) > 0,
                 state=torch.tensor(arrays["state"], dtype=dt), actions=torch.tensor(arrays["actions"], dtype=dt),
                 action_is_pad=torch.from_numpy(arrays["action_is_pad"]) > 0,
                 noise=torch.tensor(arrays["eps"], dtype=dt), t=torch.from_numpy(arrays["t"]))
        if device != "cpu":
            x = {k: [v.to(device) for v in x[k]] if k == "images" else x[k].to(device) for k in x}
        return x

    def forward(self, x):
        """Velocities v_t (B, H, Amax) and LeRobot's loss of a prepared batch."""
        P = to_lerobot(self.cfg, self.tensors())
        v, u = smolvla.forward(P, self.lcfg, x["images"], x["lang_tokens"], x["lang_masks"], x["state"],
                               x["actions"], x["noise"], x["t"])
        return v, smolvla.flow_matching_loss(self.lcfg, v, u, x["action_is_pad"])

    def finish_grads(self):
        """After backward: every tensor gets a .grad, zero outside its trainable prefix."""
        for s in self.table:
            p = getattr(self, s.name)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.view(-1)[self.n_train[s.name]:] = 0

    @torch.no_grad()
    def sample(self, x, noise):
        """10 Euler steps from `noise` (B, H, Amax) with the prefix's K/V cached -> normalized chunk."""
        P = to_lerobot(self.cfg, self.tensors())
        return smolvla.sample_actions(P, self.lcfg, x["images"], x["lang_tokens"], x["lang_masks"], x["state"], noise)


# ----------------------------------------------------------------------------
# optimizer: AdamW by hand on the trainable elements, every operation the one the trainers do


def grad_norm(model):
    """Global L2 norm of the trainable gradients (accumulated in float64)."""
    return math.sqrt(sum(float((getattr(model, s.name).grad.view(-1)[:model.n_train[s.name]].double() ** 2).sum())
                         for s in model.table))


class AdamW:
    """AdamW (0.9, 0.95, eps 1e-8, decoupled decay on the table's decay tensors, or on every
    trained one with decay_on "all", global-norm clipping first), on the first trainable_numel
    elements of each tensor only: frozen elements have no moments and neither move nor decay. m and
    v are per tensor here, packed in table order in checkpoints (FlowOptDomain)."""

    def __init__(self, model, lr, warmup, steps, min_lr_frac, weight_decay, clip, decay_on="matrices"):
        self.model = model
        self.lr, self.warmup, self.steps, self.min_lr_frac = lr, warmup, steps, min_lr_frac
        self.weight_decay, self.clip, self.decay_all = weight_decay, clip, decay_on == "all"
        trained = [s.name for s in model.table if model.n_train[s.name] > 0]
        self.m = {name: torch.zeros(model.n_train[name], dtype=model.dtype) for name in trained}
        self.v = {name: torch.zeros(model.n_train[name], dtype=model.dtype) for name in trained}

    @torch.no_grad()
    def step(self, step):
        """Update with the gradients in .grad at 0-based optimizer step `step`.
        Returns (lr, grad norm before clipping)."""
        lr = lr_at_step(step, self.lr, self.warmup, self.steps, self.min_lr_frac)
        norm = grad_norm(self.model)
        scale = self.clip / norm if self.clip > 0 and norm > self.clip else 1.0
        b1, b2 = 1.0 - 0.9 ** (step + 1), 1.0 - 0.95 ** (step + 1)  # bias corrections
        for s in self.model.table:
            if s.name not in self.m:
                continue
            n = self.model.n_train[s.name]
            param = getattr(self.model, s.name)
            p = param.data.view(-1)[:n]
            g = param.grad.view(-1)[:n] * scale
            m, v = self.m[s.name], self.v[s.name]
            m.mul_(0.9).add_(0.1 * g)
            v.mul_(0.95).add_(0.05 * g * g)
            update = (m / b1) / (torch.sqrt(v / b2) + 1e-8)
            if s.decay or self.decay_all:
                update = update + self.weight_decay * p
            p.sub_(lr * update)
        return lr, norm


# ----------------------------------------------------------------------------
# data: batches as the C trainers assemble them


def build_batch(ds, cfg, indices, seed, step):
    """The samples (dataset_assemble) padded to Smax/Amax, and their flow noise (global sample
    g = i, one rank). Returns numpy arrays named as the debug state's batch/ records; images is a
    list with camera k's (B, h_k, w_k, 3) frames."""
    view = types.SimpleNamespace(n_cam=ds.n_cam, img=ds.img, state_dim=ds.state_dim, action_dim=ds.action_dim,
                                 max_text=cfg.max_text, pad_token=cfg.pad_token, chunk=cfg.chunk)
    parts = [ds.assemble(i, view) for i in indices]
    B, H = len(indices), cfg.chunk
    cams = [ds.split_cameras(p[0]) for p in parts]
    a = dict(images=[np.stack([c[k] for c in cams]) for k in range(ds.n_cam)],
             tokens=np.stack([p[1] for p in parts]).astype(np.int32),
             token_mask=np.stack([p[2] for p in parts]).astype(np.float32))
    a["state"] = np.zeros((B, cfg.max_state_dim), np.float32)
    a["state"][:, :cfg.state_dim] = np.stack([p[3] for p in parts])
    a["actions"] = np.zeros((B, H, cfg.max_action_dim), np.float32)
    a["actions"][:, :, :cfg.action_dim] = np.stack([p[4] for p in parts])
    a["action_is_pad"] = 1.0 - np.stack([p[5] for p in parts]).astype(np.float32)
    noise = [flow_noise(cfg, seed, step, g) for g in range(B)]
    a["t"] = np.array([t for t, _ in noise], np.float32)
    a["eps"] = np.stack([e for _, e in noise])
    return a


# ----------------------------------------------------------------------------
# config from a LeRobot policy folder, or from a file of ours


def mode_of_policy(lcfg):
    """LeRobot's flags as a training mode (train_expert_only wins over freeze_vision_encoder)."""
    return 0 if lcfg.train_expert_only else (1 if lcfg.freeze_vision_encoder else 2)


def config_from_policy(policy_dir, max_text=None, vlm_name=None, pi0_sizes=None):
    """Our config of a LeRobot policy folder (dev/smolvla.py's load_config), checking that it uses
    nothing the C model does not implement. max_text: the language tokens a batch holds (default:
    the policy's tokenizer_max_length; LeRobot pads to the batch's longest, which masks the rest).
    vlm_name: where the VLM's config and tokenizer are, instead of the policy's vlm_model_name.
    Returns (our config, dev/smolvla.py's config). A pi0 policy's sizes are dev/smolvla.py's
    load_pi0_config's: pi0_sizes (a sizes file's dict), else its c_config.txt beside the policy,
    else the released variants'."""
    lc = smolvla.load_config(policy_dir, vlm_name, pi0_sizes)
    with open(os.path.join(policy_dir, "config.json")) as f:
        pc = json.load(f)

    def need(ok, what):
        if not ok:
            raise ValueError(f"{policy_dir}: {what}: the C model does not implement this")
    need(lc.resize_hw is not None and lc.resize_hw[0] == lc.resize_hw[1] == lc.vis_image_size,
         f"resize_imgs_with_padding {lc.resize_hw} must be square and the vision tower's {lc.vis_image_size}")
    rms_eps = 1e-6 if smolvla.is_pi0(lc) else 1e-5  # Gemma's, SmolLM2's
    need((lc.vis_eps, lc.rms_eps, lc.num_steps) == (1e-6, rms_eps, 10),
         f"norm eps other than 1e-6/{rms_eps:g} or num_steps != 10")
    need((lc.min_period, lc.max_period) == (4e-3, 4.0), "time-embedding periods other than 4e-3 .. 4")
    need(lc.train_state_proj, "train_state_proj=False")
    need(lc.self_attn_every_n_layers > 0 or "cross" not in lc.attention_mode, "self_attn_every_n_layers <= 0")
    pad = lc.pad_token_id
    if pad is None:  # the VLM config does not say: its tokenizer does
        pad = smolvla.tokenizer_pad_id(vlm_name or pc["vlm_model_name"], policy_dir)
    cfg = SmolVLAConfig(
        n_cam=len(lc.cameras), state_dim=lc.state_dim, action_dim=lc.action_dim, img=lc.resize_hw[0],
        patch=lc.vis_patch, vis_width=lc.vis_width, vis_ff=lc.vis_mlp, vis_layers=lc.vis_layers,
        vis_heads=lc.vis_heads, scale_factor=lc.scale_factor, vocab=lc.vocab, pad_token=pad,
        max_text=max_text or pc.get("tokenizer_max_length", 48), d_model=lc.width, d_ff=lc.mlp,
        n_layer=lc.n_layer, n_head=lc.n_head, n_kv_head=lc.n_kv_head, head_dim=lc.head_dim,
        d_expert=lc.expert_width, d_expert_ff=lc.expert_mlp,
        self_attn_every=lc.self_attn_every_n_layers if "cross" in lc.attention_mode else 1,
        chunk=lc.chunk, max_state_dim=lc.max_state_dim, max_action_dim=lc.max_action_dim,
        rope_theta=int(lc.rope_base), family=FAMILY_NAMES.index(lc.family))
    need(lc.prefix_length <= cfg.n_prefix, "a padded prefix")
    return cfg, lc


def load_policy_weights(policy_dir, cfg, lc):
    """LeRobot's model.safetensors -> our tensors (float32), through dev/smolvla.py's loader."""
    return from_lerobot(cfg, smolvla.load_parameters(policy_dir, lc, torch.float32))


# ----------------------------------------------------------------------------
# files: the debug state ("VLAT" tensor container, written and read) and the trainers' checkpoints
# (version 2, read)

VLAT_MAGIC, VLAT_VERSION = 0x54414C56, 1
VLAT_DTYPES = {0: np.float32, 1: np.uint8, 2: np.int32}
CKPT_MAGIC, CKPT_VERSION, CKPT_HEADER_BYTES = 0x43414C56, 2, 512
CKPT_FLAGS_AT, CKPT_CRC_AT, CKPT_FLAG_CRC = 264, 268, 1  # CheckpointHeader's flags and crc, CKPT_FLAG_CRC
# CheckpointHeader's config: the fields but family in order at 8 (FLOW_CONFIG_STORED of them), the train
# mode at 112, the family at 116 (the padding of files written before pi0: 0, SmolVLA)
CKPT_CONFIG_AT, CKPT_CONFIG_STORED, CKPT_MODE_AT, CKPT_FAMILY_AT = 8, 26, 112, 116
MAX_STEPS, MIN_STD = 1 << 30, np.float32(1e-6)  # VLA_MAX_STEPS, VLA_MIN_STD


def write_vlat(path, records):
    """records: list of (name, numpy array of float32, uint8 or int32); written atomically."""
    codes = {np.dtype(v): k for k, v in VLAT_DTYPES.items()}
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<4I", VLAT_MAGIC, VLAT_VERSION, len(records), 0))
        for name, x in records:
            x = np.ascontiguousarray(x)
            assert len(name.encode()) < 64 and x.dtype in codes and 1 <= x.ndim <= 4, name
            shape = list(x.shape) + [1] * (4 - x.ndim)
            f.write(struct.pack("<64sII4Q", name.encode(), codes[x.dtype], x.ndim, *shape))
            f.write(x.astype(x.dtype.newbyteorder("<")).tobytes())
    os.replace(path + ".tmp", path)


def read_vlat(path):
    """A debug-state file -> OrderedDict name -> numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 16:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than a debug-state header: regenerate it with dev/model.py")
    magic, version, n, _ = struct.unpack_from("<4I", raw, 0)
    if magic != VLAT_MAGIC or version != VLAT_VERSION:
        raise ValueError(f"{path}: not a version-{VLAT_VERSION} debug-state file: regenerate it with dev/model.py")
    out, pos = collections.OrderedDict(), 16
    for _ in range(n):
        if pos + 104 > len(raw):
            raise ValueError(f"{path}: truncated in record {len(out)}: the file is corrupt, regenerate it")
        name, code, ndim, *shape = struct.unpack_from("<64sII4Q", raw, pos)
        pos += 104
        if code not in VLAT_DTYPES or not 1 <= ndim <= 4:
            raise ValueError(f"{path}: record {len(out)} has dtype {code} and {ndim} dims: the file is corrupt, "
                             "regenerate it")
        dtype = np.dtype(VLAT_DTYPES[code]).newbyteorder("<")
        numel = math.prod(shape)
        if pos + numel * dtype.itemsize > len(raw):
            raise ValueError(f"{path}: truncated in record {len(out)}: the file is corrupt, regenerate it")
        out[name.rstrip(b"\0").decode()] = np.frombuffer(raw, dtype, numel, pos).reshape(shape[:ndim]).copy()
        pos += numel * dtype.itemsize
    if pos != len(raw):
        raise ValueError(f"{path}: {len(raw) - pos} trailing bytes: the file is corrupt, regenerate it")
    return out


def opt_domain(table, mode):
    """FlowOptDomain: (offset, trainable elements) of each tensor's moments in the packed m and v,
    and their total."""
    offsets, numels, total = [], [], 0
    for s in table:
        n = trainable_numel(s, mode)
        offsets.append(total)
        numels.append(n)
        total += n
    return offsets, numels, total


def checkpoint_crc(raw):
    """CheckpointHeader's crc: the CRC-32 of the whole file with the crc field's 4 bytes as zero."""
    view = memoryview(raw)
    crc = zlib.crc32(view[:CKPT_CRC_AT])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    return zlib.crc32(view[CKPT_CRC_AT + 4:], crc)


def read_checkpoint(path):
    """A checkpoint of vla/checkpoint.h, version 2, checked as checkpoint_read_checked checks it: header (512
    bytes: magic, version, SmolVLAConfig's fields but family, train_mode, family, step, seed,
    sampler_pos, n_params, n_trainable, file_size, tokenizer[64], ..., at 264 flags, crc, batch,
    world, total_batch, data_id), stats (state mean, std, action mean, std), every weight (n_params, table order), then
    m and v (n_trainable each, the trainable prefix of each tensor in the checkpoint's train mode,
    packed in table order). The CRC-32 is verified where flags say the file carries one (a file
    without one gets a note on stderr), and every weight must be finite. Returns a dict: config,
    train_mode, tokenizer, step, seed, sampler_pos, run (batch, world, total_batch, data_id: the run
    that wrote it, all 0 where none did), stats, params (name -> array of the table's shape), m and
    v (name -> flat array of the tensor's trainable elements, for tensors that have some). Raises
    ValueError with the reason."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"cannot open checkpoint {path}: {e.strerror}")

    def fail(why):
        return ValueError(f"checkpoint {path} {why}: delete it or pick another with --init")

    if len(raw) >= 8 and struct.unpack_from("<II", raw, 0) == (CKPT_MAGIC, 1):
        raise ValueError(f"checkpoint {path} has version 1: it holds the model train_vla trained before SmolVLA, "
                         "which this oracle no longer reads: start a new run")
    if len(raw) < CKPT_HEADER_BYTES:
        raise fail(f"is {len(raw)} bytes, shorter than its header: it is truncated")
    magic, version = struct.unpack_from("<II", raw, 0)
    if magic != CKPT_MAGIC:
        raise ValueError(f"{path} is not a train_vla checkpoint (bad magic 0x{magic:08x})")
    if version != CKPT_VERSION:
        raise fail(f"has version {version}, this oracle reads {CKPT_VERSION}")
    stored = struct.unpack_from(f"<{CKPT_CONFIG_STORED}i", raw, CKPT_CONFIG_AT)
    (mode,), (family,) = struct.unpack_from("<i", raw, CKPT_MODE_AT), struct.unpack_from("<i", raw, CKPT_FAMILY_AT)
    cfg = SmolVLAConfig(*stored, family=family)
    step, seed, sampler_pos, n_params, n_trainable, file_size = struct.unpack_from("<6Q", raw, 120)
    tokenizer = raw[168:232]
    if config_problem(cfg):
        raise fail(f"holds a bad config ({config_problem(cfg)}): it is corrupt")
    if not 0 <= mode < len(TRAIN_MODES):
        raise fail(f"holds train mode {mode}, not one of 0 (expert), 1 (vlm), 2 (all): it is corrupt")
    name = tokenizer[:tokenizer.index(b"\0")] if b"\0" in tokenizer else None
    if not name or any(b < 0x20 or b >= 0x7f for b in name):
        raise fail("names no tokenizer (or an unterminated one, or one not printable ASCII): it is corrupt")
    tokenizer = tokenizer[:tokenizer.index(b"\0")].decode("utf-8", "replace")
    flags, crc, batch, world, total_batch, data_id = struct.unpack_from("<4I2Q", raw, CKPT_FLAGS_AT)
    if flags & ~CKPT_FLAG_CRC or (flags == 0 and crc != 0):
        raise fail(f"holds flags 0x{flags:x} and checksum 0x{crc:08x}, not what a trainer writes: it is corrupt")
    no_run = (batch, world, total_batch, data_id) == (0, 0, 0, 0)
    if not no_run and (0 in (batch, world, total_batch) or total_batch % (batch * world) != 0):
        raise fail(f"records -b {batch} on {world} rank(s) and {total_batch} samples per step, not a run a trainer "
                   "writes: it is corrupt")
    table = param_table(cfg)
    offsets, numels, total_trainable = opt_domain(table, mode)
    total = param_count(cfg)
    S, A = cfg.state_dim, cfg.action_dim
    n_stats = 2 * (S + A)
    size = CKPT_HEADER_BYTES + 4 * n_stats + 4 * total + 8 * total_trainable
    if (n_params, n_trainable, file_size, len(raw)) != (total, total_trainable, size, size):
        raise fail(f"is {len(raw)} bytes, its header implies {size}: it is truncated or corrupt")
    if step > MAX_STEPS or sampler_pos < step or sampler_pos > step << 33:
        raise fail(f"says step {step} after {sampler_pos} samples, out of range (steps 0 to {MAX_STEPS}, at least one "
                   "sample each): it is corrupt")
    flat = np.frombuffer(raw, "<f4", n_stats + total + 2 * total_trainable, CKPT_HEADER_BYTES).astype(np.float32)
    stats = flat[:n_stats].copy()
    is_std = np.r_[np.zeros(S, bool), np.ones(S, bool), np.zeros(A, bool), np.ones(A, bool)]
    bad = ~np.isfinite(stats) | (is_std & ~(stats >= MIN_STD))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise fail(f"has normalization statistic {i} = {stats[i]} (NaN, Inf or a std below {float(MIN_STD):g}): it is "
                   "corrupt")
    if flags & CKPT_FLAG_CRC:
        got = checkpoint_crc(raw)
        if got != crc:
            raise fail(f"has a checksum mismatch: the file is corrupt (CRC-32 0x{got:08x}, its header says 0x{crc:08x})")
    else:
        print(f"note: checkpoint {path} carries no checksum (an older train_vla's): it loaded unverified",
              file=sys.stderr)
    weights = flat[n_stats:n_stats + total]
    for s in table:
        w = weights[s.offset:s.offset + math.prod(s.shape)]
        if not np.isfinite(w).all():
            k = int(np.flatnonzero(~np.isfinite(w))[0])
            raise fail(f"has weight {k} of {s.name} ({w.size} elements) = {w[k]}: its weights are not finite, the run "
                       "that wrote it diverged")
    m_flat = flat[n_stats + total:n_stats + total + total_trainable]
    v_flat = flat[n_stats + total + total_trainable:]
    params, m, v = collections.OrderedDict(), collections.OrderedDict(), collections.OrderedDict()
    for s, off, n in zip(table, offsets, numels):
        params[s.name] = weights[s.offset:s.offset + math.prod(s.shape)].reshape(s.shape).copy()
        if n > 0:
            m[s.name], v[s.name] = m_flat[off:off + n].copy(), v_flat[off:off + n].copy()
    return dict(config=cfg, train_mode=mode, tokenizer=tokenizer, step=step, seed=seed, sampler_pos=sampler_pos,
                run=dict(batch=batch, world=world, total_batch=total_batch, data_id=data_id), stats=stats,
                params=params, m=m, v=v)


DEFAULT_SEED = 1337  # vla/cli.h's TrainArgs default (-s)


def write_checkpoint(path, cfg, train_mode, stats, params, m=None, v=None, step=0, seed=DEFAULT_SEED, sampler_pos=0,
                     tokenizer="bytes", run=None):
    """A checkpoint of vla/checkpoint.h, version 2, with the bytes checkpoint_write writes (read_checkpoint's
    layout): params name -> array of the table's shape (every tensor); m and v name -> flat array of
    the tensor's trainable elements in train_mode (read_checkpoint's form), or None for AdamW's
    state before its first step (zeros); run: read_checkpoint's run dict (the batch, world size and
    data of the run that wrote it), None for none. The CRC-32 accumulates as the bytes are written
    and is written into the header last. Written to PATH.PID.tmp, flushed, then renamed."""
    problem = config_problem(cfg)
    if problem:
        raise ValueError(f"checkpoint {path}: bad config: {problem}")
    table = param_table(cfg)
    offsets, numels, n_trainable = opt_domain(table, train_mode)
    n_params = param_count(cfg)
    S, A = cfg.state_dim, cfg.action_dim
    stats = np.asarray(stats, np.float32).reshape(-1)
    name = tokenizer.encode()
    if stats.size != 2 * (S + A) or not 0 < len(name) < 64 or b"\0" in name:
        raise ValueError(f"checkpoint {path}: {stats.size} statistics for S={S}, A={A}, or tokenizer {tokenizer!r} "
                         "not 1 to 63 bytes")
    size = CKPT_HEADER_BYTES + 4 * stats.size + 4 * n_params + 8 * n_trainable
    stored = cfg.values()[:CKPT_CONFIG_STORED]  # the fields but family; family after the train mode
    header = struct.pack(f"<II{CKPT_CONFIG_STORED}iii6Q64s", CKPT_MAGIC, CKPT_VERSION, *stored, train_mode, cfg.family,
                         step, seed, sampler_pos, n_params, n_trainable, size, name)
    header += b"\0" * (CKPT_FLAGS_AT - len(header))  # balance and loss scale: none
    run = run or dict(batch=0, world=0, total_batch=0, data_id=0)
    header += struct.pack("<4I2Q", CKPT_FLAG_CRC, 0, run["batch"], run["world"], run["total_batch"], run["data_id"])
    header += b"\0" * (CKPT_HEADER_BYTES - len(header))  # reserved

    def moments(mv):
        flat = np.zeros(n_trainable, np.float32)
        for s, off, n in zip(table, offsets, numels):
            if mv is not None and n > 0:
                flat[off:off + n] = np.asarray(mv[s.name], np.float32).reshape(n)
        return flat

    for s in table:
        if tuple(np.shape(params[s.name])) != tuple(s.shape):
            raise ValueError(f"checkpoint {path}: {s.name} has shape {np.shape(params[s.name])}, the table says "
                             f"{tuple(s.shape)}")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            crc = 0

            def put(data):
                nonlocal crc
                f.write(data)
                crc = zlib.crc32(data, crc)

            put(header)
            put(stats.astype("<f4").tobytes())
            for s in table:
                put(np.asarray(params[s.name], np.float32).astype("<f4").tobytes())
            put(moments(m).astype("<f4").tobytes())
            put(moments(v).astype("<f4").tobytes())
            f.seek(CKPT_CRC_AT)
            f.write(struct.pack("<I", crc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return size


def read_init(path):
    """--init's file: a train_vla checkpoint (read_checkpoint's dict), or a VLAT file with a `config`
    record and every `param/<name>` (a debug state of this oracle or of the C trainers): a dict
    with config, params and, when the file has it, train_mode."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"cannot open {path}: {e.strerror}")
    if magic == struct.pack("<I", CKPT_MAGIC):
        return read_checkpoint(path)
    if magic != struct.pack("<I", VLAT_MAGIC):
        raise ValueError(f"{path} is neither a train_vla checkpoint nor a debug-state file (magic {magic!r})")
    rec = read_vlat(path)
    values = rec.get("config")
    # a state written before pi0 has no family: SmolVLA
    if values is None or values.shape not in ((len(CONFIG_FIELDS),), (len(CONFIG_FIELDS) - 1,)):
        raise ValueError(f"{path}: no config record of {len(CONFIG_FIELDS)} ints: not a SmolVLA state file")
    cfg = SmolVLAConfig(*[int(v) for v in values])
    if config_problem(cfg):
        raise ValueError(f"{path}: holds a bad config ({config_problem(cfg)})")
    params = collections.OrderedDict()
    for s in param_table(cfg):
        x = rec.get("param/" + s.name)
        if x is None or x.shape != tuple(s.shape) or x.dtype != np.float32:
            raise ValueError(f"{path}: record param/{s.name} is missing or not float32 {tuple(s.shape)}")
        params[s.name] = x
    out = dict(config=cfg, params=params)
    if "train_mode" in rec and rec["train_mode"].shape == (1,) and 0 <= int(rec["train_mode"][0]) < len(TRAIN_MODES):
        out["train_mode"] = int(rec["train_mode"][0])
    return out


# ----------------------------------------------------------------------------
# CLI


def make_config(args, ds):
    """(config, LeRobot config or None, weights or None, --init's file or None): from --policy,
    --init or the preset with the dataset's observation sizes, then --set."""
    lc, params, init = None, None, None
    if args.policy:
        max_text = None
        for item in args.set:
            field, _, value = item.partition("=")
            if field != "max_text" or not value.isdigit():
                sys.exit(f"error: --set {item} with --policy: the policy fixes every size but max_text=N")
            max_text = int(value)
        try:
            cfg, lc = config_from_policy(args.policy, max_text)
        except (ValueError, FileNotFoundError, KeyError, AssertionError) as e:
            sys.exit(f"error: --policy {args.policy}: {e}")
    elif args.init:
        if args.set:
            sys.exit("error: --set with --init: the file fixes the config, drop --set")
        try:
            init = read_init(args.init)
        except ValueError as e:
            sys.exit(f"error: --init: {e}")
        cfg, params = init["config"], init["params"]
        if "tokenizer" in init and init["tokenizer"] != ds.tokenizer:
            sys.exit(f"error: checkpoint {args.init} was trained on token ids of tokenizer {init['tokenizer']}, the "
                     f"dataset's are of {ds.tokenizer}: convert the data with the checkpoint's tokenizer")
    else:
        cfg = dataclasses.replace(PRESETS[args.preset], n_cam=ds.n_cam, state_dim=ds.state_dim,
                                  action_dim=ds.action_dim)
        for item in args.set:
            field, _, value = item.partition("=")
            if field not in CONFIG_FIELDS:
                sys.exit(f"error: --set {item}: unknown field; fields are {', '.join(CONFIG_FIELDS)}")
            try:
                setattr(cfg, field, int(value))
            except ValueError:
                sys.exit(f"error: --set {item}: expected an integer value")
    if config_problem(cfg):
        sys.exit(f"error: bad config: {config_problem(cfg)}: fix the preset or --set")
    got, want = (cfg.n_cam, cfg.state_dim, cfg.action_dim), (ds.n_cam, ds.state_dim, ds.action_dim)
    if got != want:
        sys.exit(f"error: the model's n_cam/state_dim/action_dim {got} differ from the dataset's {want}: "
                 "use data with the same cameras and dims")
    if ds.vocab > cfg.vocab:
        sys.exit(f"error: the dataset's token ids (tokenizer {ds.tokenizer}, vocabulary {ds.vocab}) do not fit the "
                 f"model's vocabulary of {cfg.vocab}: convert the data with the model's tokenizer")
    if (ds.tokenizer == "bytes") != (cfg.vocab == 256):
        print(f"warning: the dataset's instructions are token ids of tokenizer {ds.tokenizer} (vocabulary {ds.vocab}), "
              f"the model's vocabulary is {cfg.vocab}: it reads them, but they may not be its tokenizer's ids")
    for k, (h, w) in enumerate(zip(ds.cam_height, ds.cam_width)):
        ratio = max(w / cfg.img, h / cfg.img)
        if int(h / ratio) < 1 or int(w / ratio) < 1:
            sys.exit(f"error: camera {k} ({h}x{w}) resizes to nothing at {cfg.img} px")
    if lc is not None:
        params = load_policy_weights(args.policy, cfg, lc)
    return cfg, lc, params, init


def pick_train_mode(args, lc, init):
    """--train-mode, else the checkpoint's or debug state's mode, the policy's flags, the preset's
    default. Continuing a checkpoint's training needs its mode: its moments are that mode's."""
    own = init.get("train_mode") if init else None
    if args.train_mode is None:
        if own is not None:
            return own
        return mode_of_policy(lc) if lc else default_train_mode(args.preset)
    mode = TRAIN_MODES.index(args.train_mode)
    if init is not None and "m" in init and args.train and mode != own:
        sys.exit(f"error: checkpoint {args.init} trained with --train-mode {TRAIN_MODES[own]}, this run with "
                 f"--train-mode {args.train_mode}: pass --train-mode {TRAIN_MODES[own]} (or none) to continue it")
    return mode


@torch.no_grad()
def finite_differences(model, x, h=1e-5):
    """Central differences of the loss, in the model's dtype (float64 for the debug state), at the
    largest-|grad| entry of every tensor whose gradient is not zero (to rounding: the vision key
    bias's is exactly zero by symmetry, its float64 value noise 1e-12 below the rest). Independent
    of autograd: the C test checks its gradients against these. Returns ([(table index, flat)], [value])."""
    index, value = [], []
    present = [s for s in model.table if math.prod(s.shape) > 0]  # (a tensor the family lacks has no element)
    largest = max(float(getattr(model, s.name).grad.abs().max()) for s in present)
    for k, s in enumerate(model.table):
        p = getattr(model, s.name)
        g = p.grad.view(-1)
        if s not in present or not float(g.abs().max()) > 1e-12 * largest:
            continue
        j = int(g.abs().argmax())
        flat = p.data.view(-1)
        p0 = float(flat[j])
        step = h * max(1.0, abs(p0))
        flat[j] = p0 + step
        up = float(model(x)[1])
        flat[j] = p0 - step
        down = float(model(x)[1])
        flat[j] = p0
        index.append((k, j))
        value.append((up - down) / (2 * step))
    return index, value


def train_step(model, opt, x, step):
    model.zero_grad(set_to_none=True)
    _, loss = model(x)
    loss.backward()
    model.finish_grads()
    lr, norm = opt.step(step)
    return float(loss), lr, norm


def debug_state(args, ds, cfg, model):
    """One batch of step 0, its velocities, loss, gradients and samples, then 10 AdamW steps."""
    seed = args.seed
    if not 0 <= seed < 2**31:
        sys.exit("error: --debug-state records the seed as int32: use a seed below 2^31")
    indices = Sampler(ds.n_samples, seed).indices(0, args.batch)
    arrays = build_batch(ds, cfg, indices, seed, 0)
    x = model.prepare(arrays)
    v, loss = model(x)
    loss.backward()
    model.finish_grads()
    trained = [s for s in model.table if model.n_train[s.name] > 0]
    grads = [(s.name, getattr(model, s.name).grad.detach().clone()) for s in trained]
    params0 = [(s.name, getattr(model, s.name).detach().clone()) for s in model.table]
    sample = model.sample(x, x["noise"])
    std = torch.tensor(ds.action_std, dtype=model.dtype)
    mean = torch.tensor(ds.action_mean, dtype=model.dtype)
    sample_actions = sample[:, :, :cfg.action_dim] * std + mean
    fd_index, fd_value = finite_differences(model, x)

    opt = AdamW(model, args.lr, args.warmup, args.steps, args.min_lr_frac, args.wd, args.clip)
    losses, norms = [], []
    for step in range(10):
        step_loss, _, norm = train_step(model, opt, x, step)
        losses.append(step_loss)
        norms.append(norm)
        print(f"debug step {step} loss {step_loss:.6f} norm {norm:.6f}")

    def f32(t):  # every float record is float32, whatever the compute dtype
        return t.detach().numpy().astype(np.float32) if torch.is_tensor(t) else np.asarray(t, np.float32)

    hparams = [args.lr, args.min_lr_frac, args.warmup, args.steps, args.wd, args.clip]
    records = [("config", np.array(cfg.values(), np.int32)), ("hparams", np.array(hparams, np.float32)),
               ("seed", np.array([seed], np.int32)), ("train_mode", np.array([model.mode], np.int32)),
               ("stats", ds.stats())]
    records += [("param/" + name, f32(p)) for name, p in params0]
    records += [("batch/indices", np.array(indices, np.int32))]
    records += [(f"batch/image{k}", im) for k, im in enumerate(arrays["images"])]
    names = ("tokens", "token_mask", "state", "actions", "action_is_pad", "t", "eps")
    records += [("batch/" + n, arrays[n]) for n in names]
    records += [("expect/pixels", f32(torch.cat(x["images"], 0))), ("expect/v", f32(v)),
                ("expect/loss", f32([float(loss)]))]
    records += [("grad/" + name, f32(g)) for name, g in grads]
    records += [("fd/index", np.array(fd_index, np.int32).reshape(-1, 2)), ("fd/value", f32(fd_value))]
    records += [("expect/sample", f32(sample)), ("expect/sample_actions", f32(sample_actions)),
                ("expect/losses", f32(losses)), ("expect/norms", f32(norms))]
    write_vlat(args.debug_state, records)
    print(f"loss {float(loss):.6f}; wrote {len(records)} records to {args.debug_state}")


def train(args, ds, cfg, model, ckpt=None):
    """N optimizer steps as the C trainer takes them (one rank of B samples per step); from a
    checkpoint, its run continued: its step, sampler position and AdamW moments."""
    opt = AdamW(model, args.lr, args.warmup, args.steps, args.min_lr_frac, args.wd, args.clip, args.decay_on)
    step0, pos = 0, 0
    if ckpt is not None:
        step0, pos = ckpt["step"], ckpt["sampler_pos"]
        for name in opt.m:  # the checkpoint's mode is the model's (pick_train_mode): the same tensors
            opt.m[name].copy_(torch.from_numpy(ckpt["m"][name]))
            opt.v[name].copy_(torch.from_numpy(ckpt["v"][name]))
    sampler = Sampler(ds.n_samples, args.seed)
    times = []
    for step in range(step0, step0 + args.train):
        t0 = time.perf_counter()
        x = model.prepare(build_batch(ds, cfg, sampler.indices(pos, args.batch), args.seed, step))
        loss, lr, norm = train_step(model, opt, x, step)
        pos += args.batch
        times.append(time.perf_counter() - t0)
        print(f"step {step + 1} loss {loss:.6f} lr {lr:.4e} norm {norm:.4f}", flush=True)
    timed = times[1:] if len(times) > 1 else times  # the first step warms up allocators and caches
    print(f"ms_per_step {1000.0 * sum(timed) / len(timed):.3f}")
    print(f"ms_per_step_median {1000.0 * statistics.median(timed):.3f}")
    if args.save_params:
        records = [("config", np.array(cfg.values(), np.int32))]
        records += [("param/" + s.name, getattr(model, s.name).detach().numpy().astype(np.float32))
                    for s in model.table]
        write_vlat(args.save_params, records)


def bench(args, ds, cfg, model):
    """Training-step time on one batch kept on the device (loading and the resize excluded): forward,
    backward, global-norm clipping and PyTorch's fused AdamW over the tensors that train (decay on
    the table's decay tensors, or on all with --decay-on all; a stack with a frozen last layer is
    updated whole: the same work), attention through scaled_dot_product_attention, optionally under
    bf16 autocast and torch.compile: what a tuned PyTorch trainer of this model does per step.
    Parameters are drawn by torch's generator from the seed, not vla/config.h's init: values do not
    change the timing."""
    device = torch.device(args.device)
    indices = Sampler(ds.n_samples, args.seed).indices(0, args.batch)
    x = model.prepare(build_batch(ds, cfg, indices, args.seed, 0), device)
    model.to(device)
    if device.type != "cpu":
        # dev/smolvla.py makes its masks, positions and tables without a device argument
        if not hasattr(torch, "set_default_device"):
            sys.exit("error: --device other than cpu needs torch 2.0 or newer (torch.set_default_device)")
        torch.set_default_device(device)
    trained = [s for s in model.table if model.n_train[s.name] > 0]
    decays = [s.decay or args.decay_on == "all" for s in trained]
    groups = [{"params": [getattr(model, s.name) for s, d in zip(trained, decays) if d], "weight_decay": args.wd},
              {"params": [getattr(model, s.name) for s, d in zip(trained, decays) if not d], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    if args.amp == "bf16":
        # autocast makes the attention scores bfloat16, which cannot hold dev/smolvla.py's masked
        # score (float32's minimum): fill with bfloat16's, as far below any real score
        smolvla.MASKED_SCORE = torch.finfo(torch.bfloat16).min
    # attention through torch's fused kernels, as a tuned PyTorch trainer runs it (torch 2.0 on)
    smolvla.SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    forward = model
    if args.compile == "layers":  # one graph per kind of layer, each reused by every layer of its kind
        smolvla.compile_layers(backend=args.compile_backend)
    elif args.compile == "model":  # the whole forward as one graph (its compilation grows with the layers)
        forward = torch.compile(model, backend=args.compile_backend)
    params = [p for g in groups for p in g["params"]]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            _, loss = forward(x)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    for _ in range(5):  # warm-up: allocator, cuBLAS heuristics, torch.compile's compilation
        loss = step()
    sync()
    print(f"warmup_s {time.perf_counter() - t0:.1f} (5 steps, torch.compile: {args.compile or 'off'}, "
          f"attention: {'scaled_dot_product_attention' if smolvla.SDPA else 'products and softmax'})")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.bench):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    ms = 1000.0 * times[len(times) // 2]
    n_train = sum(model.n_train.values())
    print(f"loss {float(loss.detach()):.6f}")
    print(f"params {sum(p.numel() for p in model.parameters())} trainable {n_train} ({TRAIN_MODES[model.mode]})")
    print(f"ms_per_step {ms:.3f}")
    print(f"samples_per_s {args.batch / (ms / 1000.0):.2f}")
    if device.type == "cuda":
        print(f"peak_mem_gib {torch.cuda.max_memory_allocated() / 2**30:.3f}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch oracle of train_vla's SmolVLA and pi0: debug state, reference "
                                 "training")
    ap.add_argument("-i", "--input", required=True, help="dataset shards: files or folders of *.bin, comma-separated")
    ap.add_argument("-p", "--preset", default="tiny", choices=sorted(PRESETS), help="model size (tiny)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a config field after the preset and the dataset (repeatable; with --policy only "
                    "max_text)")
    ap.add_argument("--policy", metavar="DIR", help="config and weights from a LeRobot policy folder (config.json, "
                    "model.safetensors) instead of the preset and the seed; normalization still from the data (-i)")
    ap.add_argument("--train-mode", choices=TRAIN_MODES, default=None,
                    help="what trains, as LeRobot's flags (the preset's default: expert for smolvla, all for the "
                    "others; with --policy the policy's own flags, with --init the file's mode)")
    ap.add_argument("-s", "--seed", type=int, default=1337, help="init, sampler and flow-noise seed (1337)")
    ap.add_argument("-b", "--batch", type=int, default=4, help="samples per step (4)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default=None,
                    help="compute precision (float64 for --debug-state, float32 for --train)")
    ap.add_argument("--init", metavar="FILE", help="config and weights from a train_vla checkpoint (version 2; with "
                    "--train its run continues: step, sampler position, moments, seed) or from a VLAT file with "
                    "`config` and `param/<name>` records (a --debug-state file)")
    ap.add_argument("-l", "--lr", type=float, default=1e-3, help="peak learning rate (1e-3)")
    ap.add_argument("-u", "--warmup", type=int, default=3, help="linear warmup steps (3)")
    ap.add_argument("-n", "--steps", type=int, default=None,
                    help="schedule length (--debug-state: 10, --train N: N more than the start step)")
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor as a fraction of the peak (0.1)")
    ap.add_argument("-w", "--wd", "--weight-decay", type=float, default=0.1,
                    help="AdamW's decoupled weight decay, see --decay-on (0.1)")
    ap.add_argument("--decay-on", choices=DECAY_ON, default="matrices",
                    help="what the decay acts on: matrices (linear weights and embeddings) or all (every trained "
                         "tensor, biases and norms too: LeRobot's AdamW) (matrices)")
    ap.add_argument("-c", "--clip", type=float, default=0.5, help="global gradient-norm clip, 0 disables (0.5)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="torch threads, 0: torch's default")
    ap.add_argument("--save-params", metavar="OUT", help="with --train: write the weights after it (config and "
                    "param/<name> records, float32)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--debug-state", metavar="OUT", help="write the debug-state file the C tests compare with")
    mode.add_argument("--train", type=int, metavar="N", help="train N steps, print losses and ms_per_step")
    mode.add_argument("--bench", type=int, metavar="N", help="time N training steps on one batch on --device (median)")
    ap.add_argument("--device", default="cpu", help="torch device for --bench: cpu or cuda (cpu)")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none", help="--bench under bf16 autocast (none)")
    ap.add_argument("--compile", nargs="?", const="layers", choices=["layers", "model"], default=None,
                    help="--bench through torch.compile: each kind of layer compiled once for all its layers "
                    "(layers, the default) or the whole model as one graph (model)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend (inductor; aot_eager traces without generating code: the tests)")
    args = ap.parse_args(argv)
    for name in ("lr", "min_lr_frac", "wd", "clip"):  # float32 values, as the C trainer parses them
        setattr(args, name, float(np.float32(getattr(args, name))))
    if (args.amp != "none" or args.compile or args.device != "cpu") and not args.bench:
        sys.exit("error: --device, --amp and --compile go with --bench")
    if args.compile_backend != "inductor" and not args.compile:
        sys.exit("error: --compile-backend goes with --compile")
    if args.compile and not hasattr(torch, "compile"):
        sys.exit(f"error: --compile needs torch 2.0 or newer (this is {torch.__version__})")
    if args.debug_state and args.decay_on != "matrices":  # its hparams record holds no --decay-on
        sys.exit("error: --debug-state's file records the decay of matrices alone: drop --decay-on")
    if args.save_params and not args.train:
        sys.exit("error: --save-params writes the weights --train N leaves: add --train N")
    if args.policy and args.init:
        sys.exit("error: --policy and --init both give the weights: pick one")
    if args.batch < 1 or not 0 <= args.seed < 2**63:
        sys.exit("error: -b must be at least 1 and the seed in [0, 2^63)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "float64": torch.float64}[
        args.dtype or ("float64" if args.debug_state else "float32")]
    try:
        ds = Dataset(args.input)
    except ValueError as e:
        sys.exit(f"error: {e}")
    cfg, lc, params, init = make_config(args, ds)
    ckpt = init if init is not None and "m" in init else None
    if args.steps is None:  # the schedule ends with the run (after the checkpoint's steps, if any)
        args.steps = 10 if args.debug_state else (args.train or args.bench) + (ckpt["step"] if ckpt else 0)
    mode = pick_train_mode(args, lc, init)
    if ckpt is not None:
        # as the C trainer: weights, moments, step and seed from the checkpoint; normalization
        # statistics from the training data (the checkpoint's copy serves inference)
        args.seed = ckpt["seed"]
    model = SmolVLA(cfg, mode, dtype, cameras=lc.cameras if lc else None)
    if args.bench:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            sys.exit("error: --device cuda but torch sees no GPU: run on a GPU machine or use --device cpu")
        torch.manual_seed(args.seed)  # (so that runs that differ in how they compute start alike)
        with torch.no_grad():  # table-shaped values without the seed's slow numpy draw
            for s in model.table:
                p = getattr(model, s.name)
                p.fill_(1.0) if s.init == INIT_ONE else p.zero_() if s.init == INIT_ZERO else p.normal_(0.0, 0.02)
        bench(args, ds, cfg, model)
        return
    model.load(params if params is not None else param_init(cfg, args.seed))
    if args.debug_state:
        debug_state(args, ds, cfg, model)
    else:
        train(args, ds, cfg, model, ckpt)


if __name__ == "__main__":
    main()
