"""
smolvla.py: the PyTorch oracle of SmolVLA and of pi0, computed exactly as LeRobot 0.6.1 computes them.

An independent, from-scratch copy of LeRobot's SmolVLAPolicy and PI0Policy in plain torch (no
lerobot, no transformers): it loads a LeRobot policy folder (config.json + model.safetensors + the
pre-processor's normalization statistics where it has them) and reproduces LeRobot's
preprocessing, training loss, velocities, gradients and the 10-step sampled action chunk. The C and
CUDA trainers are written to match this file; tests/model/test_smolvla.py checks it against LeRobot itself.
The two are one design (a VLM reads images and language, an action expert of the same depth reads
the noisy chunk, flow matching trains the velocity) and one forward here: what differs is a field
of the config (family) and the few functions that read it (is_pi0 and below).

SmolVLA, in the order the data meets it:
  images (uint8) -> resize with padding, x*2-1 -> SigLIP vision encoder -> pixel shuffle +
  Linear (the connector) -> prefix = [image tokens * sqrt(C), language tokens * sqrt(C),
  state token] -> the VLM's Llama layers over the prefix (their post-RoPE K/V are all the
  expert ever sees of it) -> the action expert's layers over the chunk of noisy actions,
  alternating joint self-attention and cross-attention (layer_kind) -> final RMSNorm ->
  action_out_proj = the flow-matching velocity -> masked mean squared error.
pi0 (PaliGemma 3B with a Gemma 300M expert), where it differs: the resize pads centred; no pixel
  shuffle, the projector has a bias and image tokens are not scaled; prefix = [image tokens,
  language * sqrt(C)]; suffix = [state_proj(state), action tokens], the actions seeing each other
  (bidirectional); every layer joint; Gemma's layers (RMSNorm x rsqrt(mean x^2 + 1e-6) (1 + w),
  GeGLU MLP); the loss is a plain mean over every chunk slot (action_is_pad is not read).

Shapes: B batch, S model image size, P patch, G = S/P patch grid, Cv vision width,
Np prefix tokens (n_cam*G^2/s^2 image + L language (+ 1 state in SmolVLA)), H chunk (action
tokens), Ns suffix tokens (H, + 1 state in pi0), C VLM width, Ce expert width, NH query heads,
NKV key/value heads, HS head size, A real action dims, Amax = max_action_dim (32), Smax =
max_state_dim (32).

    build/venv/bin/python dev/smolvla.py build/lerobot_ref/expert                 # loss, grad norm, chunk
    build/venv/bin/python dev/smolvla.py build/lerobot_ref/vlm --dtype float32 -o out.safetensors
    build/venv/bin/python tests/model/test_smolvla.py build/lerobot_ref           # parity with LeRobot
    build/venv/bin/python dev/smolvla.py build/lerobot_ref/all --c-config build/lerobot_ref/all/c_config.txt
                                                         # the C trainers' config (test_vla reads it)
    build/venv/bin/python dev/smolvla.py build/lerobot_ref_pi0/all                # pi0 (make_ref.py --family pi0)

Runs on torch 1.13 and newer (the project's build/venv has 2.11); numpy and safetensors not needed.
"""

import argparse
import collections
import dataclasses
import glob
import json
import math
import os
import struct
import sys
import time

import torch

import safetensors_format  # dev/safetensors_format.py: the format's header, read and checked

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
import hub_cache  # noqa: E402  data/hub_cache.py: where huggingface_hub keeps a hub id's snapshots

# ----------------------------------------------------------------------------
# safetensors I/O: 8-byte little-endian header length, a JSON header
# {name: {dtype, shape, data_offsets}}, then the raw little-endian bytes (the header read and
# checked by dev/safetensors_format.py)

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
SAFETENSORS_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def load_safetensors(path):
    """name -> tensor of a safetensors file, its header checked as the format requires
    (dev/safetensors_format.py, the project's one reader of it: ValueError, one line, otherwise).
    Each tensor is a private, writable copy of its bytes."""
    assert sys.byteorder == "little", "safetensors data is little-endian"
    tensors = {}
    with safetensors_format.open_regular(path) as f:
        index, _ = safetensors_format.index_of(f, path)
        for name, e in index.items():
            if e.dtype not in SAFETENSORS_DTYPES:
                raise ValueError(f"{safetensors_format.escaped(path)}: tensor {safetensors_format.escaped(name)} has "
                                 f"dtype {e.dtype}, which this oracle does not read (it reads "
                                 f"{', '.join(SAFETENSORS_DTYPES)}): save the tensors in one of those")
            raw = safetensors_format.read_bytes(f, e, path, name)
            dtype = SAFETENSORS_DTYPES[e.dtype]
            if not raw:
                t = torch.empty(0, dtype=dtype)
            elif dtype == torch.bfloat16:  # frombuffer on old torch knows no bfloat16: go through int16
                t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
            elif dtype == torch.bool:
                t = torch.frombuffer(raw, dtype=torch.uint8).bool()
            else:
                t = torch.frombuffer(raw, dtype=dtype)
            tensors[name] = t.reshape(e.shape)
    return tensors


def save_safetensors(path, tensors, metadata=None):
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        flat = t.reshape(-1)
        raw = flat.to(torch.uint8) if t.dtype == torch.bool else flat.view(torch.uint8)
        blob = raw.numpy().tobytes() if raw.numel() >= 4096 else bytes(raw.tolist())
        header[name] = {"dtype": SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in chunks:
            f.write(blob)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------
# config: every size, read from the policy's config.json and the VLM config it points to


@dataclasses.dataclass
class SmolVLAConfig:
    # vision encoder (SigLIP as SmolVLM uses it)
    vis_image_size: int  # the size its position table was trained for (table side = this / vis_patch)
    vis_patch: int
    vis_width: int
    vis_layers: int
    vis_heads: int
    vis_mlp: int
    vis_eps: float
    scale_factor: int  # pixel shuffle: s x s neighbouring patches become one token
    # language model (SmolLM2's Llama layers); SmolVLA keeps the first n_layer
    width: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    mlp: int
    rms_eps: float
    vocab: int
    pad_token_id: object  # int, or None when the VLM config is unknown
    # action expert: the text config at a smaller width, same heads and head size
    expert_width: int
    expert_mlp: int
    # SmolVLA
    chunk: int
    max_state_dim: int
    max_action_dim: int
    state_dim: int
    action_dim: int
    cameras: tuple  # observation keys, in the order the prefix holds them
    resize_hw: object  # (height, width) of resize-with-padding, or None
    num_steps: int
    min_period: float
    max_period: float
    attention_mode: str
    self_attn_every_n_layers: int
    prefix_length: int
    train_expert_only: bool
    freeze_vision_encoder: bool
    train_state_proj: bool
    rope_base: float = 10000.0  # LeRobot's apply_rope default; the text config's rope_theta is never read
    norm_eps: float = 1e-8  # the normalizer's (x - mean) / (std + eps)
    family: str = "smolvla"  # or "pi0": what differs is a function of it (is_pi0 and below)


# ---- what differs between the families (vla/config.h's functions of the same names)
def is_pi0(cfg):
    return cfg.family == "pi0"


def rms_offset(cfg):
    """RMSNorm x rsqrt(mean(x^2) + eps) (offset + w): Llama's (SmolLM2, offset 0) or Gemma's
    (offset 1: the stored weight is the scale's distance from 1)."""
    return 1.0 if is_pi0(cfg) else 0.0


def mlp_gelu(cfg):
    """The VLM's and the expert's MLP: down(act(gate) * up) with SiLU (SwiGLU) or GELU-tanh (GeGLU)."""
    return is_pi0(cfg)


def scales_images(cfg):
    """Image tokens enter the prefix times sqrt(C) in SmolVLA, as they come in pi0."""
    return not is_pi0(cfg)


def language_scale(cfg):
    """What language embeddings are multiplied by: sqrt(C); Gemma's embedding holds it as a float32
    buffer (GemmaTextScaledWordEmbedding's embed_scale), so pi0's is float32's sqrt(C)."""
    if is_pi0(cfg):
        return float(torch.tensor(cfg.width ** 0.5, dtype=torch.float32))
    return math.sqrt(cfg.width)


def state_in_suffix(cfg):
    """The state token: the prefix's last token (SmolVLA, C wide) or the suffix's first (pi0, Ce wide)."""
    return is_pi0(cfg)


def actions_causal(cfg):
    """Action tokens see the earlier ones (SmolVLA: each its own block) or all of them (pi0: one block)."""
    return not is_pi0(cfg)


def loss_masks_pad(cfg):
    """Chunk slots past the episode's end are left out of the loss (SmolVLA) or count (pi0)."""
    return not is_pi0(cfg)


def pad_centred(cfg):
    """Resized frames are padded to the square on the left and top (SmolVLA's resize_with_pad) or
    centred, the odd pixel at the bottom and right (pi0's resize_with_pad_torch)."""
    return is_pi0(cfg)


def connector_bias(cfg):
    """The projector from the vision tower to the VLM has a bias in pi0 (PaliGemma's multi_modal_projector)."""
    return is_pi0(cfg)


def expert_intermediate_size(width):
    # LeRobot sizes the expert MLP like Llama's 2/3 * 4 * width rounded up to 256
    hidden = int(2 * width / 3)
    hidden = int(4 * hidden)
    return 256 * ((hidden + 255) // 256)


# the VLM that lerobot/smolvla_base embeds, as its config lists it, for when no config is found
KNOWN_VLMS = {
    "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": {
        "scale_factor": 4,
        "vision_config": dict(image_size=512, patch_size=16, hidden_size=768, num_hidden_layers=12,
                              num_attention_heads=12, intermediate_size=3072, layer_norm_eps=1e-6,
                              hidden_act="gelu_pytorch_tanh"),
        "text_config": dict(hidden_size=960, num_attention_heads=15, num_key_value_heads=5, head_dim=64,
                            intermediate_size=2560, num_hidden_layers=32, rms_norm_eps=1e-5,
                            vocab_size=49280, pad_token_id=None, hidden_act="silu"),
    },
}


def vlm_places(name, policy_dir):
    """Where the VLM's files may be: vlm_model_name as a path, a folder of its basename next to the
    policy (or one or two levels up), or, for a hub id, its snapshots in the HF cache (refs/main's
    first: data/hub_cache.py's order and environment)."""
    base = os.path.basename(os.path.normpath(name))
    places = [name, os.path.join(policy_dir, base), os.path.join(policy_dir, "..", base),
              os.path.join(policy_dir, "..", "..", base)]
    return places + (hub_cache.places(name, "model") if hub_cache.is_hub_id(name) else [])


def find_vlm_config(name, policy_dir):
    """The VLM's config.json: vlm_model_name as a path, next to the policy, or in the HF cache."""
    places = vlm_places(name, policy_dir)
    for place in places:
        path = os.path.join(place, "config.json")
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
    if name in KNOWN_VLMS:
        return KNOWN_VLMS[name]
    get = f"; download it with `{hub_cache.download_command(name, 'model')}`" if hub_cache.is_hub_id(name) else ""
    raise FileNotFoundError(f"no config.json for the VLM '{name}' (looked in {', '.join(places)}){get}")


def load_config(policy_dir, vlm_name=None, pi0_sizes=None):
    """The sizes of a policy folder; vlm_name: where to find the VLM instead of its vlm_model_name
    (SmolVLA's). A pi0 policy's: load_pi0_config (pi0_sizes: a sizes file's dict, or None)."""
    with open(os.path.join(policy_dir, "config.json")) as f:
        pc = json.load(f)
    if pc.get("type") == "pi0":
        return load_pi0_config(policy_dir, pc, pi0_sizes)
    vlm = find_vlm_config(vlm_name or pc["vlm_model_name"], policy_dir)
    vc, tc = vlm["vision_config"], vlm["text_config"]
    # features this oracle does not implement must be off, as they are by default
    assert not pc.get("add_image_special_tokens", False), "add_image_special_tokens is not implemented"
    assert pc.get("empty_cameras", 0) == 0, "empty_cameras is not implemented"
    assert not pc.get("adapt_to_pi_aloha", False), "adapt_to_pi_aloha is not implemented"
    assert vc.get("hidden_act", "gelu_pytorch_tanh") == "gelu_pytorch_tanh"
    assert tc.get("hidden_act", "silu") == "silu"
    assert not tc.get("attention_bias", False) and not tc.get("mlp_bias", False)

    n_layer = tc["num_hidden_layers"]
    if pc.get("num_vlm_layers", -1) > 0:
        n_layer = min(n_layer, pc["num_vlm_layers"])  # LeRobot slices layers[:num_vlm_layers]
    n_expert_layers = pc.get("num_expert_layers", -1)
    assert n_expert_layers <= 0 or n_expert_layers == n_layer, "an expert shallower than the VLM is not implemented"
    width = tc["hidden_size"]
    expert_width = int(width * pc["expert_width_multiplier"])
    head_dim = tc.get("head_dim") or width // tc["num_attention_heads"]

    cameras = tuple(k for k, v in pc["input_features"].items() if v["type"] == "VISUAL")
    resize = pc.get("resize_imgs_with_padding")
    return SmolVLAConfig(
        vis_image_size=vc["image_size"], vis_patch=vc["patch_size"], vis_width=vc["hidden_size"],
        vis_layers=vc["num_hidden_layers"], vis_heads=vc["num_attention_heads"],
        vis_mlp=vc["intermediate_size"], vis_eps=vc.get("layer_norm_eps", 1e-6),
        scale_factor=vlm.get("scale_factor", 2),
        width=width, n_layer=n_layer, n_head=tc["num_attention_heads"],
        n_kv_head=tc["num_key_value_heads"], head_dim=head_dim, mlp=tc["intermediate_size"],
        rms_eps=tc["rms_norm_eps"], vocab=tc["vocab_size"], pad_token_id=tc.get("pad_token_id"),
        expert_width=expert_width, expert_mlp=expert_intermediate_size(expert_width),
        chunk=pc["chunk_size"], max_state_dim=pc["max_state_dim"], max_action_dim=pc["max_action_dim"],
        state_dim=pc["input_features"]["observation.state"]["shape"][0],
        action_dim=pc["output_features"]["action"]["shape"][0],
        cameras=cameras,
        # config.json stores (width, height): LeRobot passes [1] as the height
        resize_hw=(resize[1], resize[0]) if resize else None,
        num_steps=pc["num_steps"], min_period=pc["min_period"], max_period=pc["max_period"],
        attention_mode=pc["attention_mode"], self_attn_every_n_layers=pc["self_attn_every_n_layers"],
        prefix_length=pc.get("prefix_length", -1),
        train_expert_only=pc["train_expert_only"], freeze_vision_encoder=pc["freeze_vision_encoder"],
        train_state_proj=pc.get("train_state_proj", True),
    )


# pi0's sizes, which PI0Config names by variant only: the Gemmas of get_gemma_config, and the SigLIP
# so400m/14 tower, vocabulary and pad id that PaliGemmaWithExpertModel fixes inside (as
# vla/config.h's pi0 preset has them). Written in LeRobot's own keys (GemmaConfig's fields, the
# SigLIP config's), the layout of a sizes file (PI0_SIZE_KEYS): a model of other sizes is one such
# file, and the released ones are the same dict.
PI0_GEMMAS = {"gemma_2b": dict(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
              "gemma_300m": dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256)}
PI0_SIGLIP = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                  patch_size=14)
PI0_VOCAB, PI0_PAD = 257152, 0
PI0_SIZE_KEYS = {"vlm": tuple(PI0_GEMMAS["gemma_2b"]), "expert": tuple(PI0_GEMMAS["gemma_300m"]),
                 "vision": tuple(PI0_SIGLIP), "vocab_size": None}


def pi0_released_sizes(paligemma_variant, action_expert_variant):
    """The sizes of LeRobot's pi0 with these variants, in a sizes file's layout."""
    return {"vlm": dict(PI0_GEMMAS[paligemma_variant]), "expert": dict(PI0_GEMMAS[action_expert_variant]),
            "vision": dict(PI0_SIGLIP), "vocab_size": PI0_VOCAB}


def read_c_config(path):
    """A "name value" file of vla/config.h's fields (flow_config_read's format) -> {name: int}. A file
    without a family line was written before pi0: SmolVLA's (family 0)."""
    fields = {"family": 0}
    with open(path) as f:
        for line in f:
            if line.strip():
                name, value = line.split()
                fields[name] = int(value)
    return fields


def pi0_sizes_of_c_config(c):
    """A pi0 c_config.txt's fields as a sizes file says them."""
    vlm = dict(width=c["d_model"], depth=c["n_layer"], mlp_dim=c["d_ff"], num_heads=c["n_head"],
               num_kv_heads=c["n_kv_head"], head_dim=c["head_dim"])
    return {"vlm": vlm, "expert": dict(vlm, width=c["d_expert"], mlp_dim=c["d_expert_ff"]),
            "vision": dict(hidden_size=c["vis_width"], intermediate_size=c["vis_ff"], num_hidden_layers=c["vis_layers"],
                           num_attention_heads=c["vis_heads"], patch_size=c["patch"]),
            "vocab_size": c["vocab"]}


def load_pi0_config(policy_dir, pc, sizes=None):
    """The sizes of a pi0 policy folder. Its config.json holds the policy's settings but no size: the
    Gemma variants are names, and a test-size model is built by replacing what those names build at
    run time (dev/lerobot/make_ref.py --family pi0), which config.json does not record. So the sizes
    are, in this order: `sizes` (a sizes file's dict, PI0_SIZE_KEYS' layout, checked by its reader), the
    model's config as the C trainers read it in the folder above the policy (c_config.txt, which
    make_ref.py writes off the built model), else the released ones of the variants named;
    load_parameters then checks every shape against them."""
    assert pc.get("empty_cameras", 0) == 0, "empty_cameras is not implemented"
    assert not pc.get("use_relative_actions", False), "use_relative_actions is not implemented"
    assert pc.get("rtc_config") is None, "real-time chunking is not implemented"
    res = pc["image_resolution"]
    assert res[0] == res[1], f"PaliGemma reads square images: image_resolution is {res}"
    pad = PI0_PAD  # PaliGemma's tokenizer pads with id 0 at every size
    c_config = os.path.join(policy_dir, "..", "c_config.txt")
    if sizes is None and os.path.isfile(c_config):
        c = read_c_config(c_config)
        assert c["family"] == 1, f"{c_config} is not a pi0 model's config"
        assert c["img"] == res[0] and c["scale_factor"] == 1 and c["rope_theta"] == 10000, f"{c_config} disagrees"
        sizes, pad = pi0_sizes_of_c_config(c), c["pad_token"]
    elif sizes is None:
        sizes = pi0_released_sizes(pc["paligemma_variant"], pc["action_expert_variant"])
    vlm, expert, vision = sizes["vlm"], sizes["expert"], sizes["vision"]
    # one softmax over both streams: the same heads, key/value heads, head size and depth
    assert all(vlm[k] == expert[k] for k in ("num_heads", "num_kv_heads", "head_dim", "depth")), (vlm, expert)
    cameras = tuple(k for k, v in pc["input_features"].items() if v["type"] == "VISUAL")
    return SmolVLAConfig(
        vis_image_size=res[0], vis_patch=vision["patch_size"], vis_width=vision["hidden_size"],
        vis_layers=vision["num_hidden_layers"], vis_heads=vision["num_attention_heads"],
        vis_mlp=vision["intermediate_size"], vis_eps=1e-6, scale_factor=1,
        width=vlm["width"], n_layer=vlm["depth"], n_head=vlm["num_heads"], n_kv_head=vlm["num_kv_heads"],
        head_dim=vlm["head_dim"], mlp=vlm["mlp_dim"], rms_eps=1e-6, vocab=sizes["vocab_size"], pad_token_id=pad,
        expert_width=expert["width"], expert_mlp=expert["mlp_dim"],
        chunk=pc["chunk_size"], max_state_dim=pc["max_state_dim"], max_action_dim=pc["max_action_dim"],
        state_dim=pc["input_features"]["observation.state"]["shape"][0],
        action_dim=pc["output_features"]["action"]["shape"][0], cameras=cameras, resize_hw=(res[0], res[1]),
        num_steps=pc["num_inference_steps"], min_period=pc["min_period"], max_period=pc["max_period"],
        attention_mode="self_attn", self_attn_every_n_layers=1, prefix_length=-1,
        train_expert_only=pc["train_expert_only"], freeze_vision_encoder=pc["freeze_vision_encoder"],
        train_state_proj=True, family="pi0")


def layer_kind(cfg, i):
    """SmolVLA's layer schedule: 'joint' or 'cross' for layer i of the VLM/expert stacks.

    Every self_attn_every_n_layers-th layer (i % n == 0: layers 0, 2, 4, ...) is joint
    self-attention over [prefix; actions]; the others are cross-attention, where the actions
    attend only to the VLM's keys and values of that layer. attention_mode 'self_attn' makes
    every layer joint. The expert's k_proj/v_proj shapes follow the same schedule.
    """
    if "cross" not in cfg.attention_mode:
        return "joint"
    n = cfg.self_attn_every_n_layers
    return "joint" if n > 0 and i % n == 0 else "cross"


# ----------------------------------------------------------------------------
# the parameter table: every tensor of model.safetensors, by LeRobot's names


@dataclasses.dataclass(frozen=True)
class Modules:
    """A family's LeRobot module prefixes: where each tower's tensors are named."""
    vision: str
    connector: str  # the projector's module, without the dot: + ".weight", + ".bias"
    text: str  # the VLM's language model
    expert: str
    heads: str  # state_proj, action_in_proj, action_out_proj, action_time_mlp_in/out
    vlm_lm_head: str  # the VLM's lm_head (feeds nothing)
    expert_lm_head: object  # the expert's lm_head (pi0's, feeds nothing), or None


MODULES = {
    "smolvla": Modules(vision="model.vlm_with_expert.vlm.model.vision_model.",
                       connector="model.vlm_with_expert.vlm.model.connector.modality_projection.proj",
                       text="model.vlm_with_expert.vlm.model.text_model.", expert="model.vlm_with_expert.lm_expert.",
                       heads="model.", vlm_lm_head="model.vlm_with_expert.vlm.lm_head.", expert_lm_head=None),
    "pi0": Modules(vision="model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.",
                   connector="model.paligemma_with_expert.paligemma.model.multi_modal_projector.linear",
                   text="model.paligemma_with_expert.paligemma.model.language_model.",
                   expert="model.paligemma_with_expert.gemma_expert.model.", heads="model.",
                   vlm_lm_head="model.paligemma_with_expert.paligemma.lm_head.",
                   expert_lm_head="model.paligemma_with_expert.gemma_expert.lm_head."),
}


def modules(cfg):
    return MODULES[cfg.family]


def lm_heads(cfg):
    """The names of the lm_heads model.safetensors holds: nothing reads them."""
    m = modules(cfg)
    return [head + "weight" for head in (m.vlm_lm_head, m.expert_lm_head) if head is not None]


def parameter_table(cfg):
    """[(name, shape, tower)] in data-flow order; tower is vision/connector/vlm/expert/heads."""
    m = modules(cfg)
    t = []
    Cv, P, D, KV = cfg.vis_width, cfg.vis_patch, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    G = cfg.vis_image_size // cfg.vis_patch
    t += [(m.vision + "embeddings.patch_embedding.weight", (Cv, 3, P, P), "vision"),
          (m.vision + "embeddings.patch_embedding.bias", (Cv,), "vision"),
          (m.vision + "embeddings.position_embedding.weight", (G * G, Cv), "vision")]
    for i in range(cfg.vis_layers):
        pre = m.vision + f"encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t += [(pre + f"self_attn.{proj}.weight", (Cv, Cv), "vision"), (pre + f"self_attn.{proj}.bias", (Cv,), "vision")]
        for norm in ("layer_norm1", "layer_norm2"):
            t += [(pre + f"{norm}.weight", (Cv,), "vision"), (pre + f"{norm}.bias", (Cv,), "vision")]
        t += [(pre + "mlp.fc1.weight", (cfg.vis_mlp, Cv), "vision"), (pre + "mlp.fc1.bias", (cfg.vis_mlp,), "vision"),
              (pre + "mlp.fc2.weight", (Cv, cfg.vis_mlp), "vision"), (pre + "mlp.fc2.bias", (Cv,), "vision")]
    t += [(m.vision + "post_layernorm.weight", (Cv,), "vision"), (m.vision + "post_layernorm.bias", (Cv,), "vision")]
    t += [(m.connector + ".weight", (cfg.width, Cv * cfg.scale_factor ** 2), "connector")]
    if connector_bias(cfg):
        t += [(m.connector + ".bias", (cfg.width,), "connector")]
    t += [(m.text + "embed_tokens.weight", (cfg.vocab, cfg.width), "vlm")]

    def llama_layer(pre, C, F, kv_in, tower):  # Llama's layer names, which Gemma's share
        return [(pre + "self_attn.q_proj.weight", (D, C), tower), (pre + "self_attn.k_proj.weight", (KV, kv_in), tower),
                (pre + "self_attn.v_proj.weight", (KV, kv_in), tower), (pre + "self_attn.o_proj.weight", (C, D), tower),
                (pre + "mlp.gate_proj.weight", (F, C), tower), (pre + "mlp.up_proj.weight", (F, C), tower),
                (pre + "mlp.down_proj.weight", (C, F), tower),
                (pre + "input_layernorm.weight", (C,), tower), (pre + "post_attention_layernorm.weight", (C,), tower)]

    for i in range(cfg.n_layer):
        t += llama_layer(m.text + f"layers.{i}.", cfg.width, cfg.mlp, cfg.width, "vlm")
    t += [(m.text + "norm.weight", (cfg.width,), "vlm"), (m.vlm_lm_head + "weight", (cfg.vocab, cfg.width), "vlm")]
    for i in range(cfg.n_layer):
        # cross-attention layers re-project the VLM's K/V (KV wide), joint ones project the expert stream
        kv_in = KV if layer_kind(cfg, i) == "cross" else cfg.expert_width
        t += llama_layer(m.expert + f"layers.{i}.", cfg.expert_width, cfg.expert_mlp, kv_in, "expert")
    t += [(m.expert + "norm.weight", (cfg.expert_width,), "expert")]
    if m.expert_lm_head is not None:
        t += [(m.expert_lm_head + "weight", (cfg.vocab, cfg.expert_width), "expert")]
    Ce = cfg.expert_width
    for name, (n_out, n_in) in {"state_proj": (Ce if state_in_suffix(cfg) else cfg.width, cfg.max_state_dim),
                                "action_in_proj": (Ce, cfg.max_action_dim),
                                "action_out_proj": (cfg.max_action_dim, Ce),
                                "action_time_mlp_in": (Ce, 2 * Ce),
                                "action_time_mlp_out": (Ce, Ce)}.items():
        t += [(m.heads + name + ".weight", (n_out, n_in), "heads"), (m.heads + name + ".bias", (n_out,), "heads")]
    return t


# LeRobot's training modes as the two flags that select them (train_expert_only, freeze_vision_encoder)
TRAIN_MODES = {"expert": (True, True), "vlm": (False, True), "all": (False, False)}


def with_train_mode(cfg, mode):
    expert_only, freeze_vision = TRAIN_MODES[mode]
    return dataclasses.replace(cfg, train_expert_only=expert_only, freeze_vision_encoder=freeze_vision)


def is_trainable(cfg, name):
    """Whether LeRobot's requires_grad is True for this tensor (its set_requires_grad rules).

    expert mode (train_expert_only): only the expert, the heads (state_proj if train_state_proj).
    Otherwise the VLM trains too, except the vision tower when freeze_vision_encoder. SmolVLA
    always freezes lm_head, the text model's final norm and its last layer (they feed nothing, so
    LeRobot freezes them for DDP's unused-parameter check; the last layer's K/V do feed the
    expert, yet stay frozen). pi0 freezes none of them: they require grad and get none (or, the
    last layer's q_proj, a zero one), and its expert's lm_head trains with the expert.
    """
    m = modules(cfg)
    if name.startswith(m.expert) or (m.expert_lm_head is not None and name.startswith(m.expert_lm_head)):
        return True
    if name.startswith(m.heads + "state_proj."):
        return cfg.train_state_proj
    if name.startswith(m.heads + "action_"):
        return True
    if cfg.train_expert_only:
        return False
    if name.startswith(m.vision):
        return not cfg.freeze_vision_encoder
    if is_pi0(cfg):
        return True
    if name.startswith(m.vlm_lm_head) or name == m.text + "norm.weight":
        return False
    if name.startswith(m.text + f"layers.{cfg.n_layer - 1}."):
        return False
    return True


def load_parameters(policy_dir, cfg, dtype=torch.float64):
    """model.safetensors (fp32 or bf16) -> {name: tensor in dtype}, checked against the table."""
    raw = load_safetensors(os.path.join(policy_dir, "model.safetensors"))
    table = parameter_table(cfg)
    expected = {name for name, _, _ in table}
    missing, unexpected = sorted(expected - set(raw)), sorted(set(raw) - expected)
    assert not missing and not unexpected, f"model.safetensors: missing {missing[:4]}, unexpected {unexpected[:4]}"
    params = {}
    for name, shape, _ in table:
        assert tuple(raw[name].shape) == tuple(shape), f"{name}: {tuple(raw[name].shape)} != {shape}"
        params[name] = raw[name].to(dtype).requires_grad_(is_trainable(cfg, name))
    return params


def load_normalization(policy_dir):
    """mean/std of observation.state and action, from the pre-processor's normalizer step."""
    for path in sorted(glob.glob(os.path.join(policy_dir, "policy_preprocessor_step_*normalizer*.safetensors"))):
        stats = load_safetensors(path)
        return {f"{key}.{s}": stats[f"{key}.{s}"].to(torch.float64)
                for key in ("observation.state", "action") for s in ("mean", "std")}
    raise FileNotFoundError(f"no normalizer statistics in {policy_dir}")


# ----------------------------------------------------------------------------
# inputs: images, state, actions as LeRobot's pre-processor and prepare_* leave them


def bilinear_resize(img, out_h, out_w):
    """F.interpolate(mode='bilinear', align_corners=False, antialias=False), written out.

    Output pixel i samples the input at src = (i + 0.5) * scale - 0.5, scale = in / out,
    clamped below at 0; it blends rows/columns floor(src) and floor(src) + 1 (the last one
    repeated at the edge) with weights 1 - frac and frac. No antialiasing even when shrinking.
    PyTorch (2.x, the build LeRobot runs) evaluates it in float32 for float32 images, as
    src = fmaf(scale, i + 0.5f, -0.5f) with scale = (float)in / (float)out: one rounding of
    the exact product minus 0.5 (emulated here by computing that in float64). A plain
    float32 multiply-then-subtract moves src by an ulp, i.e. pixels by up to ~3e-6.
    """
    def taps(n_in, n_out):
        f32, f64 = torch.float32, torch.float64
        dev = img.device
        scale = torch.tensor(n_in, dtype=f32, device=dev) / torch.tensor(n_out, dtype=f32, device=dev)
        src = ((torch.arange(n_out, dtype=f64, device=dev) + 0.5) * scale.to(f64) - 0.5).to(f32).clamp(min=0)
        i0 = src.floor().long()
        i1 = torch.clamp(i0 + 1, max=n_in - 1)
        w1 = src - i0.to(f32)
        return i0, i1, (1 - w1).to(img.dtype), w1.to(img.dtype)
    y0, y1, wy0, wy1 = taps(img.shape[2], out_h)
    x0, x1, wx0, wx1 = taps(img.shape[3], out_w)
    rows = img[:, :, y0, :] * wy0[:, None] + img[:, :, y1, :] * wy1[:, None]
    return rows[:, :, :, x0] * wx0 + rows[:, :, :, x1] * wx1


def prepare_image(cfg, img):
    """(B, 3, h, w) in [0, 1] -> (B, 3, S, S) in [-1, 1]: LeRobot's resize with padding, then x*2-1.

    The aspect ratio is kept (ratio = max(w/W, h/H), size int(h/ratio) x int(w/ratio)) and the
    image is padded with zeros (so padding reads -1 after x*2-1): on the LEFT and TOP in SmolVLA
    (resize_with_pad); centred in pi0 (resize_with_pad_torch: top and left get the floor of half
    the padding, bottom and right the rest), which also clamps the resized image to [0, 1] (a
    no-op but for the last ulp: bilinear weights are convex). An image already at the target
    size is not touched.
    """
    if cfg.resize_hw is not None and tuple(img.shape[2:]) != tuple(cfg.resize_hw):
        H, W = cfg.resize_hw
        h, w = img.shape[2:]
        ratio = max(w / W, h / H)
        rh, rw = int(h / ratio), int(w / ratio)
        resized = bilinear_resize(img, rh, rw)
        if pad_centred(cfg):
            top, left = (H - rh) // 2, (W - rw) // 2
            resized = resized.clamp(0.0, 1.0)
        else:
            top, left = max(0, H - rh), max(0, W - rw)
        out = img.new_zeros(img.shape[0], img.shape[1], H, W)
        out[:, :, top:top + rh, left:left + rw] = resized
        img = out
    return img * 2.0 - 1.0


def images_from_u8(frames_u8, dtype):
    """(B, h, w, 3) uint8 frames -> (B, 3, h, w) floats in [0, 1] (LeRobot datasets' x / 255)."""
    return frames_u8.permute(0, 3, 1, 2).to(dtype) / 255.0


def normalize(x, mean, std, eps=1e-8):
    return (x - mean) / (std + eps)


def unnormalize(x, mean, std):
    return x * std + mean


def pad_last_dim(x, n):
    return torch.cat([x, x.new_zeros(*x.shape[:-1], n - x.shape[-1])], -1) if x.shape[-1] < n else x


# ----------------------------------------------------------------------------
# building blocks

# masked scores are filled with float32's most negative value (not -inf), as openpi does: a
# query that sees no key at all (a pad) then gets a uniform row instead of NaN. pi0 adds its own
# constant to them (prepare_attention_masks_4d): any score plus it rounds to it, so filling with it
# is the same softmax (masked entries exp to 0, a row with no key left is uniform).
MASKED_SCORE = torch.finfo(torch.float32).min
PI0_MASKED_SCORE = -2.3819763e38

# attention through torch's fused scaled_dot_product_attention (flash attention where there is no
# mask) instead of the plain products and softmax below: the same function, as a tuned PyTorch
# trainer runs it (dev/model.py --bench turns it on where torch has it; the references stay plain)
SDPA = False


def linear(x, P, name, bias=True):
    y = x @ P[name + ".weight"].t()
    return y + P[name + ".bias"] if bias else y


def layer_norm(x, P, name, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * P[name + ".weight"] + P[name + ".bias"]


def rms_norm(x, weight, eps, offset):
    """x rsqrt(mean(x^2) + eps) (offset + w): offset 0 is Llama's norm, 1 Gemma's (rms_offset)."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * (offset + weight)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x * torch.sigmoid(x)


def rope(x, positions, base):
    """Rotary embedding, rotate-half layout, on x (B, T, heads, HS) at integer positions (B, T).

    Dimension j < HS/2 pairs with j + HS/2 and turns by angle pos / base^(2j/HS). LeRobot
    builds the timescale base^(2j/HS) in float32 and divides (not multiplies by an inverse
    frequency); the same float32 table is used here, then the math runs in x's dtype.
    """
    half = x.shape[-1] // 2
    timescale = base ** ((2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device))
    angle = positions.to(x.dtype)[..., None] / timescale.to(x.dtype)  # (B, T, HS/2)
    sin, cos = torch.sin(angle)[:, :, None, :], torch.cos(angle)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def attention(q, k, v, mask=None, fill=None):
    """Softmax attention with grouped-query heads.

    q (B, Tq, NH, HS), k/v (B, Tk, NKV, HS), mask (B, Tq, Tk) bool (True = may attend) or None.
    GQA: key/value head j serves the NH/NKV consecutive query heads j*g .. j*g+g-1 (LeRobot
    expands each K/V head g times in place, which is repeat_interleave on the head axis).
    Scores are scaled by 1/sqrt(HS) after the product; masked ones get `fill` (MASKED_SCORE when
    None, read at the call: the bf16 bench replaces it). Returns (B, Tq, NH*HS), heads in order.
    """
    fill = MASKED_SCORE if fill is None else fill
    B, Tq, NH, HS = q.shape
    group = NH // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    if SDPA:
        # the mask as an additive bias: a score plus MASKED_SCORE rounds to MASKED_SCORE, the fill
        # below (so a query that sees no key gets the same uniform row, where a boolean mask gives NaN)
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, fill)[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                               attn_mask=bias)
        return out.transpose(1, 2).reshape(B, Tq, NH * HS)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * HS ** -0.5
    if mask is not None:
        scores = torch.where(mask[:, None], scores, torch.full_like(scores, fill))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, Tq, NH * HS)


def gated_mlp(P, pre, x, gelu):
    """down(act(gate(x)) * up(x)): SwiGLU (SiLU, Llama's) or GeGLU (GELU-tanh, Gemma's)."""
    gate = linear(x, P, pre + "gate_proj", bias=False)
    act = gelu_tanh(gate) if gelu else silu(gate)
    return linear(act * linear(x, P, pre + "up_proj", bias=False), P, pre + "down_proj", bias=False)


def make_attention_mask(valid, block_start):
    """openpi's block mask: token i may see token j iff block(j) <= block(i) and both are valid.

    valid (B, T) bool: False for pads (language padding). block_start (B, T) int: 1 where a new
    block begins, 0 where a token joins the previous token's block. block = cumsum(block_start):
    images + language are block 0 (bidirectional), the state token block 1 (sees the prefix, is
    not seen by it), and each action token its own block (causal among actions; pi0's actions
    share block 2: bidirectional). A pad is masked both as a key and as a query (its row is all
    False).
    """
    block = torch.cumsum(block_start, dim=1)
    sees = block[:, None, :] <= block[:, :, None]  # (B, query, key)
    return sees & valid[:, None, :] & valid[:, :, None]


def positions_from_valid(valid):
    """RoPE positions = cumsum(valid) - 1: pads repeat the previous position, they do not advance it."""
    return torch.cumsum(valid.long(), dim=1) - 1


def time_embedding(t, dim, min_period, max_period):
    """Sinusoidal embedding of the flow time t (B,), always computed in float64 like LeRobot.

    Periods are geometric from min_period to max_period over dim/2 frequencies; the embedding
    is [sin(2 pi t / period), cos(2 pi t / period)] (all sines first). LeRobot evaluates the
    angle as t * ((1 / period) * 2 * pi) in float64 and only then casts to the model dtype.
    """
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (1.0 / period * 2 * math.pi)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)


# ----------------------------------------------------------------------------
# vision encoder -> connector


def vision_position_ids(cfg, grid_h, grid_w, device=None):
    """Which row of the position table each patch of a grid_h x grid_w image reads.

    pi0's SigLIP reads row i for patch i (its position_ids buffer). SmolVLM maps patch (r, c)
    to the table through fractional coordinates: with n = table side (vis_image_size / patch),
    frac_r = r * float32(1/grid_h) in float32, clamped to 1 - 1e-6, row = bucketize(frac_r,
    torch.arange(1/n, 1.0, 1/n) in float32, right=True), likewise for c, and id = row * n + col.
    Mathematically row = r when grid == n, but torch.arange's float32 boundaries are not always
    the correctly rounded k/n (its vectorized kernel adds steps to a rounded base), which makes
    rows skip and repeat for some n (19, 25, 29, ...). For n = 32 (the released model) and 8 (the
    tests) it is the identity, which the C trainers assume (tests/model/test_smolvla.py checks it).
    """
    n = cfg.vis_image_size // cfg.vis_patch
    if is_pi0(cfg):
        assert (grid_h, grid_w) == (n, n), f"SigLIP's {n}x{n} position table, a {grid_h}x{grid_w} grid"
        return torch.arange(n * n, device=device)
    boundaries = torch.arange(1 / n, 1.0, 1 / n, dtype=torch.float32, device=device)

    def bucket(g):
        frac = torch.arange(g, dtype=torch.float32, device=device) * (torch.tensor(1.0, dtype=torch.float32, device=device) / g)
        frac = torch.clamp(frac, max=1.0 - 1e-6)
        return torch.bucketize(frac, boundaries, right=True)
    return (bucket(grid_h)[:, None] * n + bucket(grid_w)[None, :]).reshape(-1)


def vision_encoder(P, cfg, pixels):
    """(B, 3, S, S) pixels in [-1, 1] -> (B, G*G, Cv): SigLIP with pre-LayerNorm and no mask."""
    V = modules(cfg).vision
    B, _, S_h, S_w = pixels.shape
    p, Cv = cfg.vis_patch, cfg.vis_width
    gh, gw = S_h // p, S_w // p
    # the patch embedding is a stride-p convolution = a Linear on each patch flattened in
    # (channel, row, column) order, the conv weight's (Cv, 3, p, p) layout; patches are taken
    # row-major over the grid, the way the conv output is flattened
    patches = pixels[:, :, :gh * p, :gw * p].reshape(B, 3, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)
    patches = patches.reshape(B, gh * gw, 3 * p * p)
    w = P[V + "embeddings.patch_embedding.weight"].reshape(Cv, 3 * p * p)
    x = patches @ w.t() + P[V + "embeddings.patch_embedding.bias"]
    x = x + P[V + "embeddings.position_embedding.weight"][vision_position_ids(cfg, gh, gw, pixels.device)]

    for i in range(cfg.vis_layers):
        L = layer_tensors(P, V + f"encoder.layers.{i}.", VISION_LAYER_TENSORS)
        x = vision_layer(L, x, cfg.vis_heads, cfg.vis_eps)
    return layer_norm(x, P, V + "post_layernorm", cfg.vis_eps)


# the tensors of one layer, by their names after the layer's prefix (parameter_table's rows)
VISION_LAYER_TENSORS = tuple(f"{m}.{w}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                   "self_attn.out_proj", "layer_norm1", "layer_norm2", "mlp.fc1",
                                                   "mlp.fc2") for w in ("weight", "bias"))
LLAMA_LAYER_TENSORS = tuple(f"{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                    "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                    "mlp.down_proj", "input_layernorm", "post_attention_layernorm"))


def layer_tensors(P, pre, names):
    """One layer's tensors named without the layer's prefix: what the layer functions below take,
    the same names for every layer (so that one compilation of a layer function serves them all).
    A name P lacks is left out (the VLM's last layer reads only its norm, k and v)."""
    return {n: P[pre + n] for n in names if pre + n in P}


def vision_layer(L, x, NH, eps):
    """One SigLIP encoder layer (pre-LayerNorm) on x (B, T, Cv); L: its tensors (layer_tensors)."""
    B, T, Cv = x.shape
    HS = Cv // NH
    h = layer_norm(x, L, "layer_norm1", eps)
    q = linear(h, L, "self_attn.q_proj").reshape(B, T, NH, HS)
    k = linear(h, L, "self_attn.k_proj").reshape(B, T, NH, HS)
    v = linear(h, L, "self_attn.v_proj").reshape(B, T, NH, HS)
    x = x + linear(attention(q, k, v), L, "self_attn.out_proj")
    h = layer_norm(x, L, "layer_norm2", eps)
    return x + linear(gelu_tanh(linear(h, L, "mlp.fc1")), L, "mlp.fc2")


def pixel_shuffle(x, s):
    """(B, G*G, Cv) -> (B, (G/s)^2, s*s*Cv): each s x s block of patches becomes one token.

    Output token (I, J) (row-major over the G/s x G/s grid) holds the block's patches
    (I*s + m, J*s + k) concatenated in row-major (m, k) order: feature (m*s + k)*Cv + d is
    channel d of patch (I*s + m, J*s + k). This is what SmolVLM's view/permute sequence does.
    s = 1 (pi0) leaves x as it is.
    """
    B, T, Cv = x.shape
    G = int(T ** 0.5)
    assert G * G == T and G % s == 0, f"pixel shuffle needs a square grid divisible by {s}, got {T} patches"
    x = x.reshape(B, G // s, s, G // s, s, Cv)  # (B, I, m, J, k, d)
    x = x.permute(0, 1, 3, 2, 4, 5)  # (B, I, J, m, k, d)
    return x.reshape(B, (G // s) ** 2, s * s * Cv)


def embed_image(P, cfg, pixels):
    """(B, 3, S, S) -> (B, (G/s)^2, C) image tokens (before SmolVLA's sqrt(C) scale)."""
    x = pixel_shuffle(vision_encoder(P, cfg, pixels), cfg.scale_factor)
    return linear(x, P, modules(cfg).connector, bias=connector_bias(cfg))


def embed_tokens(P, cfg, tokens):
    """Language tokens -> rows of embed_tokens. nn.Embedding(padding_idx=pad) never sends a
    gradient to the pad id's row, so looked-up pad rows are detached here."""
    table = P[modules(cfg).text + "embed_tokens.weight"]
    x = table[tokens]
    if cfg.pad_token_id is not None and table.requires_grad:
        x = torch.where((tokens == cfg.pad_token_id)[..., None], x.detach(), x)
    return x


# ----------------------------------------------------------------------------
# prefix and suffix


def embed_prefix(P, cfg, images, lang_tokens, lang_masks, state):
    """[camera 0 tokens][camera 1 tokens]...[language tokens][state token (SmolVLA's)].

    images: list of (B, 3, S, S) prepared pixels, in cfg.cameras order; lang_tokens (B, L)
    int64; lang_masks (B, L) bool; state (B, Smax) normalized and zero-padded.
    Returns embeddings (B, Np, C), valid (B, Np) bool, block_start (B, Np) int.
    Language embeddings are scaled by sqrt(C) (language_scale), image embeddings too in SmolVLA
    (scales_images); the state token is not.
    """
    B, dev = state.shape[0], state.device
    embs, valid, block_start = [], [], []
    for img in images:
        e = embed_image(P, cfg, img)
        if scales_images(cfg):
            e = e * math.sqrt(cfg.width)
        embs.append(e)
        valid.append(torch.ones(B, e.shape[1], dtype=torch.bool, device=dev))  # every camera is present
        block_start.append(torch.zeros(B, e.shape[1], dtype=torch.long, device=dev))
    embs.append(embed_tokens(P, cfg, lang_tokens) * language_scale(cfg))
    valid.append(lang_masks.bool())
    block_start.append(torch.zeros(B, lang_tokens.shape[1], dtype=torch.long, device=dev))
    if not state_in_suffix(cfg):
        embs.append(linear(state, P, modules(cfg).heads + "state_proj")[:, None, :])
        valid.append(torch.ones(B, 1, dtype=torch.bool, device=dev))
        block_start.append(torch.ones(B, 1, dtype=torch.long, device=dev))  # its own block: the prefix does not see it
    embs, valid, block_start = torch.cat(embs, 1), torch.cat(valid, 1), torch.cat(block_start, 1)
    if embs.shape[1] < cfg.prefix_length:  # optional fixed prefix length: invisible zero tokens
        n = cfg.prefix_length - embs.shape[1]
        embs = torch.cat([embs, embs.new_zeros(B, n, embs.shape[2])], 1)
        valid = torch.cat([valid, torch.zeros(B, n, dtype=torch.bool, device=dev)], 1)
        block_start = torch.cat([block_start, torch.zeros(B, n, dtype=torch.long, device=dev)], 1)
    return embs, valid, block_start


def embed_suffix(P, cfg, state, x_t, t):
    """The expert's tokens (B, Ns, Ce): the chunk of noisy actions x_t (B, H, Amax) at flow time t
    (B,) as action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time embedding]))),
    after pi0's state token state_proj(state) (state (B, Smax); SmolVLA's is in the prefix)."""
    heads = modules(cfg).heads
    a = linear(x_t, P, heads + "action_in_proj")
    te = time_embedding(t, cfg.expert_width, cfg.min_period, cfg.max_period).to(a.dtype)
    h = torch.cat([a, te[:, None, :].expand_as(a)], dim=-1)
    h = silu(linear(h, P, heads + "action_time_mlp_in"))
    tokens = linear(h, P, heads + "action_time_mlp_out")
    if state_in_suffix(cfg):
        tokens = torch.cat([linear(state, P, heads + "state_proj")[:, None, :], tokens], 1)
    return tokens


def suffix_blocks(cfg, B, device=None):
    """Every suffix token is valid. SmolVLA: each action token starts its own block (causal). pi0:
    the state token starts block 1, the first action block 2, which the other actions join."""
    valid = torch.ones(B, cfg.chunk + state_in_suffix(cfg), dtype=torch.bool, device=device)
    if actions_causal(cfg):
        return valid, torch.ones(B, cfg.chunk, dtype=torch.long, device=device)
    starts = torch.zeros(B, cfg.chunk + 1, dtype=torch.long, device=device)
    starts[:, :2] = 1
    return valid, starts


# ----------------------------------------------------------------------------
# the two language stacks

# What a layer of the VLM or the expert needs of the config, as plain values (the layer functions
# are compiled once per kind: their arguments are tensors and these constants): heads, key/value
# heads, head size, the RMSNorm's eps and offset, GeGLU or SwiGLU, RoPE's base, the masked score.
Stack = collections.namedtuple("Stack", "NH NKV HS eps offset gelu rope_base fill")


def stack(cfg):
    return Stack(cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rms_eps, rms_offset(cfg), mlp_gelu(cfg), cfg.rope_base,
                 PI0_MASKED_SCORE if is_pi0(cfg) else None)


def vlm_forward(P, cfg, x, mask, positions):
    """The VLM's layers over the prefix x (B, Np, C) -> [(K, V)] per layer, post-RoPE,
    each (B, Np, NKV, HS). These K/V are all that the action expert reads of the prefix.

    The prefix never attends to the suffix (its blocks come later), so its stream is the same
    in training and in sampling: this is the K/V cache. In the joint layers LeRobot runs the
    prefix queries over [prefix; suffix] keys, but the suffix columns are masked to exact
    zeros, so prefix-only attention is the same computation. The last layer's attention
    output, MLP and the final norm feed nothing (LeRobot computes and drops them): only its
    K/V are computed here.
    """
    kv = []
    for i in range(cfg.n_layer):
        L = layer_tensors(P, modules(cfg).text + f"layers.{i}.", LLAMA_LAYER_TENSORS)
        x, k, v = vlm_layer(L, x, mask, positions, stack(cfg), i == cfg.n_layer - 1)
        kv.append((k, v))
    return kv


def vlm_layer(L, x, mask, positions, st, last):
    """One Llama (Gemma) layer of the VLM on the prefix x (B, Np, C) -> (x after it, K, V); the last
    layer only K and V (x comes back as it came in). L: its tensors (layer_tensors); st: stack()."""
    B, Np, _ = x.shape
    h = rms_norm(x, L["input_layernorm.weight"], st.eps, st.offset)
    k = rope(linear(h, L, "self_attn.k_proj", bias=False).reshape(B, Np, st.NKV, st.HS), positions, st.rope_base)
    v = linear(h, L, "self_attn.v_proj", bias=False).reshape(B, Np, st.NKV, st.HS)
    if last:
        return x, k, v
    q = rope(linear(h, L, "self_attn.q_proj", bias=False).reshape(B, Np, st.NH, st.HS), positions, st.rope_base)
    x = x + linear(attention(q, k, v, mask, st.fill), L, "self_attn.o_proj", bias=False)
    x = x + gated_mlp(L, "mlp.", rms_norm(x, L["post_attention_layernorm.weight"], st.eps, st.offset), st.gelu)
    return x, k, v


def expert_forward(P, cfg, x, prefix_kv, mask, positions):
    """The action expert's layers over the suffix x (B, Ns, Ce) -> (B, Ns, Ce) after its norm.

    prefix_kv: vlm_forward's per-layer (K, V); mask (B, Ns, Np + Ns): the suffix rows of the
    full block mask; positions (B, Ns): the suffix's RoPE positions, continuing after the last
    valid prefix token (n_valid_prefix + j).

    joint layer: the suffix's own q/k/v (k/v: Ce -> NKV*HS) with RoPE at its positions;
      keys/values = [VLM prefix K/V ; suffix K/V], so actions see the valid prefix, the state
      and the earlier actions (pi0: the state and every action). This is pi0's every layer: its
      one softmax over [prefix; suffix] queries gives the suffix rows exactly this, and the
      prefix rows vlm_forward's.
    cross layer: only the actions' queries, RoPE'd at positions restarted from 0 (LeRobot
      subtracts the row minimum); keys/values are the VLM's K/V of this layer -- the keys
      already rotated by the VLM's RoPE -- flattened to NKV*HS and re-projected by the
      expert's own k_proj/v_proj (NKV*HS -> NKV*HS, no bias, no second RoPE). Actions see
      only the valid prefix (mask columns :Np), not each other.
    """
    m = modules(cfg)
    for i in range(cfg.n_layer):
        prefix_k, prefix_v = prefix_kv[i]
        L = layer_tensors(P, m.expert + f"layers.{i}.", LLAMA_LAYER_TENSORS)
        x = expert_layer(L, x, prefix_k, prefix_v, mask, positions, stack(cfg), layer_kind(cfg, i) == "joint")
    return rms_norm(x, P[m.expert + "norm.weight"], cfg.rms_eps, rms_offset(cfg))


def expert_layer(L, x, prefix_k, prefix_v, mask, positions, st, joint):
    """One layer of the action expert on x (B, Ns, Ce), joint or cross (expert_forward says what
    each does) over the VLM's K/V of the same layer. L: its tensors (layer_tensors); st: stack()."""
    B, H, _ = x.shape
    Np = prefix_k.shape[1]
    NH, NKV, HS = st.NH, st.NKV, st.HS
    h = rms_norm(x, L["input_layernorm.weight"], st.eps, st.offset)
    q = linear(h, L, "self_attn.q_proj", bias=False).reshape(B, H, NH, HS)
    if joint:
        q = rope(q, positions, st.rope_base)
        k = rope(linear(h, L, "self_attn.k_proj", bias=False).reshape(B, H, NKV, HS), positions, st.rope_base)
        v = linear(h, L, "self_attn.v_proj", bias=False).reshape(B, H, NKV, HS)
        att = attention(q, torch.cat([prefix_k, k], 1), torch.cat([prefix_v, v], 1), mask, st.fill)
    else:
        q = rope(q, positions - positions.min(dim=1, keepdim=True).values, st.rope_base)
        k = linear(prefix_k.reshape(B, Np, NKV * HS), L, "self_attn.k_proj", bias=False).reshape(B, Np, NKV, HS)
        v = linear(prefix_v.reshape(B, Np, NKV * HS), L, "self_attn.v_proj", bias=False).reshape(B, Np, NKV, HS)
        att = attention(q, k, v, mask[:, :, :Np], st.fill)
    x = x + linear(att, L, "self_attn.o_proj", bias=False)
    return x + gated_mlp(L, "mlp.", rms_norm(x, L["post_attention_layernorm.weight"], st.eps, st.offset), st.gelu)


def compile_layers(**options):
    """Puts the three layer functions through torch.compile (regional compilation: each compiled once
    and reused by every layer of its kind, a few graphs instead of the whole model's; dev/model.py
    --bench --compile). The functions above call them through these module names."""
    global vision_layer, vlm_layer, expert_layer
    vision_layer = torch.compile(vision_layer, **options)
    vlm_layer = torch.compile(vlm_layer, **options)
    expert_layer = torch.compile(expert_layer, **options)


# ----------------------------------------------------------------------------
# the policy: training forward, loss, sampling


def encode_prefix(P, cfg, images, lang_tokens, lang_masks, state):
    """Prefix embeddings -> the VLM K/V cache, plus the suffix's mask rows and positions."""
    prefix, p_valid, p_block = embed_prefix(P, cfg, images, lang_tokens, lang_masks, state)
    s_valid, s_block = suffix_blocks(cfg, prefix.shape[0], prefix.device)
    valid, block_start = torch.cat([p_valid, s_valid], 1), torch.cat([p_block, s_block], 1)
    mask = make_attention_mask(valid, block_start)  # (B, Np+Ns, Np+Ns)
    positions = positions_from_valid(valid)
    Np = prefix.shape[1]
    kv = vlm_forward(P, cfg, prefix, mask[:, :Np, :Np], positions[:, :Np])
    return kv, mask[:, Np:, :], positions[:, Np:]


def velocity(P, cfg, kv, suffix_mask, suffix_positions, state, x_t, t):
    """v(x_t, t) (B, H, Amax): the expert's output of the action tokens through action_out_proj."""
    out = expert_forward(P, cfg, embed_suffix(P, cfg, state, x_t, t), kv, suffix_mask, suffix_positions)
    return linear(out[:, -cfg.chunk:], P, modules(cfg).heads + "action_out_proj")


def forward(P, cfg, images, lang_tokens, lang_masks, state, actions, noise, t):
    """Training forward: flow-matching velocity v_t and target u_t, both (B, H, Amax).

    x_t = t * noise + (1 - t) * actions moves from the data (t=0) to noise (t=1); its time
    derivative, the target velocity, is u_t = noise - actions.
    """
    tt = t.to(actions.dtype)[:, None, None]
    x_t = tt * noise + (1 - tt) * actions
    u_t = noise - actions
    kv, suffix_mask, suffix_positions = encode_prefix(P, cfg, images, lang_tokens, lang_masks, state)
    return velocity(P, cfg, kv, suffix_mask, suffix_positions, state, x_t, t), u_t


def flow_matching_loss(cfg, v_t, u_t, action_is_pad):
    """Squared error on the real action dims, averaged.

    Both slice to the dataset's A dims. SmolVLA zeroes the slots past the episode's end
    (action_is_pad), then divides the sum by (number of valid slots in the batch) * A (at least
    1) -- not by B * H * A. pi0 takes the plain mean over B * H * A: action_is_pad is not read.
    """
    err = (u_t - v_t)[:, :, :cfg.action_dim] ** 2
    if not loss_masks_pad(cfg):
        return err.mean()
    in_episode = (~action_is_pad.bool()).to(err.dtype)
    err = err * in_episode[:, :, None]
    # (the count stays a tensor, an exact int64: a Python int would break torch.compile's graph here)
    n_valid = ((~action_is_pad.bool()).sum() * cfg.action_dim).clamp(min=1)
    return err.sum() / n_valid


@torch.no_grad()
def sample_actions(P, cfg, images, lang_tokens, lang_masks, state, noise):
    """num_steps Euler steps of dx/dt = v from t = 1 (noise) to t = 0 -> (B, H, Amax), normalized.

    The prefix runs once: its per-layer post-RoPE K/V are the cache every step reads. The
    time is LeRobot's float32 tensor of 1 + step * dt (1.0, 0.9, ..., 0.1 as float32),
    dt = -1/num_steps applied as a Python double.
    """
    kv, suffix_mask, suffix_positions = encode_prefix(P, cfg, images, lang_tokens, lang_masks, state)
    dt = -1.0 / cfg.num_steps
    x = noise
    B = noise.shape[0]
    for step in range(cfg.num_steps):
        t = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=noise.device).expand(B)
        x = x + dt * velocity(P, cfg, kv, suffix_mask, suffix_positions, state, x, t)
    return x


# ----------------------------------------------------------------------------
# a batch as LeRobot's pre-processor + prepare_* leave it, from raw dataset values


def prepare_batch(cfg, stats, raw, dtype):
    """raw: images_u8.<cam> (B,h,w,3) uint8 keyed by the camera's last name component,
    observation.state (B,S), action (B,H,A), action_is_pad (B,H), lang_tokens, lang_masks.
    stats None (a policy folder without its pre-processor: pi0's references): the state and
    actions come normalized, state_norm (B,S or Smax) and actions_norm (B,H,A or Amax)."""
    images = [prepare_image(cfg, images_from_u8(raw["images_u8." + key.split(".")[-1]], dtype)) for key in cfg.cameras]
    if stats is None:
        state = raw["state_norm"].to(dtype)
    else:
        state = normalize(raw["observation.state"].to(dtype), stats["observation.state.mean"].to(dtype),
                          stats["observation.state.std"].to(dtype), cfg.norm_eps)
    batch = {"images": images, "lang_tokens": raw["lang_tokens"].long(), "lang_masks": raw["lang_masks"].bool(),
             "state": pad_last_dim(state, cfg.max_state_dim)}
    if "action" in raw or "actions_norm" in raw:
        if stats is None:
            actions = raw["actions_norm"].to(dtype)
        else:
            actions = normalize(raw["action"].to(dtype), stats["action.mean"].to(dtype),
                                stats["action.std"].to(dtype), cfg.norm_eps)
        batch["actions"] = pad_last_dim(actions, cfg.max_action_dim)
        batch["action_is_pad"] = raw["action_is_pad"].bool()
    return batch


def run(policy_dir, raw, dtype=torch.float64):
    """Loss, velocities, gradients and the sampled chunk for one batch (raw as in prepare_batch,
    plus noise, time and sample_noise). Returns a dict named like the reference file (chunk, the
    un-normalized one, where the policy folder has the normalization statistics)."""
    cfg = load_config(policy_dir)
    try:
        stats = load_normalization(policy_dir)
    except FileNotFoundError:
        if not is_pi0(cfg):
            raise
        stats = None  # pi0's references hand over normalized inputs
    P = load_parameters(policy_dir, cfg, dtype)
    batch = prepare_batch(cfg, stats, raw, dtype)
    out = {f"images_prepped.{key.split('.')[-1]}": img for key, img in zip(cfg.cameras, batch["images"])}
    out["state_norm"], out["actions_norm"] = batch["state"], batch["actions"]

    v_t, u_t = forward(P, cfg, batch["images"], batch["lang_tokens"], batch["lang_masks"], batch["state"],
                       batch["actions"], raw["noise"].to(dtype), raw["time"])
    loss = flow_matching_loss(cfg, v_t, u_t, batch["action_is_pad"])
    trainable = [name for name, t in P.items() if t.requires_grad]
    grads = torch.autograd.grad(loss, [P[n] for n in trainable], allow_unused=True)
    out["loss"], out["v_t"] = loss.detach(), v_t.detach()
    for name, g in zip(trainable, grads):
        if g is not None:  # None: the tensor feeds nothing (LeRobot leaves its .grad None too)
            out["grad." + name] = g

    chunk_norm = sample_actions(P, cfg, batch["images"], batch["lang_tokens"], batch["lang_masks"], batch["state"],
                                raw["sample_noise"].to(dtype))
    out["chunk_norm"] = chunk_norm
    if stats is not None:
        out["chunk"] = unnormalize(chunk_norm[:, :, :cfg.action_dim], stats["action.mean"].to(dtype),
                                   stats["action.std"].to(dtype))
    return cfg, P, out


def tokenizer_pad_id(name, policy_dir):
    """The pad token's id from the VLM's saved tokenizer (tokenizer_config.json's pad_token looked
    up in tokenizer.json), for a VLM config that does not state pad_token_id. Searched where
    find_vlm_config looks."""
    places = vlm_places(name, policy_dir)
    for place in places:
        if not os.path.isfile(os.path.join(place, "tokenizer.json")):
            continue
        with open(os.path.join(place, "tokenizer_config.json")) as f:
            pad = json.load(f).get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        with open(os.path.join(place, "tokenizer.json")) as f:
            tok = json.load(f)
        for added in tok.get("added_tokens", []):
            if added["content"] == pad:
                return added["id"]
        return tok["model"]["vocab"][pad]
    raise FileNotFoundError(f"the VLM config states no pad_token_id and no tokenizer of '{name}' was found in {places}")


def c_config_lines(case_dir, batch_path=None):
    """The C trainers' FlowConfig (vla/config.h's FLOW_CONFIG_FIELDS, family last: 0 SmolVLA, 1
    pi0) of a LeRobot policy folder, as "name value" lines, and checks that the policy uses nothing
    the C model does not implement."""
    policy_dir = os.path.join(case_dir, "policy")
    cfg = load_config(policy_dir)
    with open(os.path.join(policy_dir, "config.json")) as f:
        pc = json.load(f)
    batch = load_safetensors(batch_path or os.path.join(case_dir, "ref.safetensors"))
    assert cfg.resize_hw is not None and cfg.resize_hw[0] == cfg.resize_hw[1], \
        f"the C model resizes to a square image: resize_imgs_with_padding is {cfg.resize_hw}"
    img = cfg.resize_hw[0]
    # the C model reads patch position i as row i of the table (vision_position_ids is the identity)
    assert img == cfg.vis_image_size, f"resize size {img} != the vision tower's image_size {cfg.vis_image_size}"
    assert cfg.self_attn_every_n_layers > 0 or "cross" not in cfg.attention_mode
    every = cfg.self_attn_every_n_layers if "cross" in cfg.attention_mode else 1  # 1: every layer joint
    # constants of the C model (train_vla.c's model section; the RMSNorm's eps is the family's)
    rms_eps = 1e-6 if is_pi0(cfg) else 1e-5
    assert (cfg.vis_eps, cfg.rms_eps, cfg.num_steps) == (1e-6, rms_eps, 10), (cfg.vis_eps, cfg.rms_eps, cfg.num_steps)
    assert (cfg.min_period, cfg.max_period) == (4e-3, 4.0), (cfg.min_period, cfg.max_period)
    assert cfg.train_state_proj, "train_state_proj=False is not implemented"
    pad = cfg.pad_token_id
    if pad is None:  # the VLM config does not say: ask its tokenizer
        pad = tokenizer_pad_id(pc["vlm_model_name"], policy_dir)
    n_image_tokens = (img // cfg.vis_patch // cfg.scale_factor) ** 2
    # LeRobot pads the language tokens to the longest in the batch (SmolVLA) or to tokenizer_max_length
    # (pi0): max_text is this batch's length
    max_text = batch["lang_tokens"].shape[1]
    assert cfg.prefix_length <= len(cfg.cameras) * n_image_tokens + max_text + 1, "a padded prefix is not implemented"
    fields = dict(
        n_cam=len(cfg.cameras), state_dim=cfg.state_dim, action_dim=cfg.action_dim, img=img, patch=cfg.vis_patch,
        vis_width=cfg.vis_width, vis_ff=cfg.vis_mlp, vis_layers=cfg.vis_layers, vis_heads=cfg.vis_heads,
        scale_factor=cfg.scale_factor, vocab=cfg.vocab, pad_token=pad, max_text=max_text, d_model=cfg.width,
        d_ff=cfg.mlp, n_layer=cfg.n_layer, n_head=cfg.n_head, n_kv_head=cfg.n_kv_head, head_dim=cfg.head_dim,
        d_expert=cfg.expert_width, d_expert_ff=cfg.expert_mlp, self_attn_every=every, chunk=cfg.chunk,
        max_state_dim=cfg.max_state_dim, max_action_dim=cfg.max_action_dim, rope_theta=int(cfg.rope_base),
        family=int(is_pi0(cfg)))
    return [f"{name} {int(value)}" for name, value in fields.items()]


def count_parameters(cfg, P):
    total = sum(t.numel() for t in P.values())
    return total, sum(t.numel() for name, t in P.items() if is_trainable(cfg, name))


def main():
    ap = argparse.ArgumentParser(description="SmolVLA oracle: loss, gradients and a sampled chunk for a LeRobot policy")
    ap.add_argument("case", help="folder with policy/ (LeRobot's save_pretrained) and ref.safetensors (the batch)")
    ap.add_argument("--batch", help="safetensors file with the batch (default: CASE/ref.safetensors)")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("-o", "--out", help="write the oracle's tensors (names as in ref.safetensors) here")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table", action="store_true", help="print the parameter table (trainable per mode) and exit")
    ap.add_argument("--c-config", metavar="FILE", help="write the C trainers' config (vla/config.h's FLOW_CONFIG_FIELDS "
                    "as 'name value' lines) of CASE/policy and the batch's token length, and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.c_config:
        lines = c_config_lines(args.case, args.batch)
        with open(args.c_config + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(args.c_config + ".tmp", args.c_config)
        print(f"wrote {args.c_config}: {', '.join(lines)}")
        return
    if args.table:
        cfg = load_config(os.path.join(args.case, "policy"))
        modes = {m: with_train_mode(cfg, m) for m in TRAIN_MODES}
        table = parameter_table(cfg)
        width = max(len(name) for name, _, _ in table)
        print(f"{'name':<{width}} {'shape':<18} {'tower':<9} " + " ".join(f"{m:>6}" for m in modes))
        for name, shape, tower in table:
            flags = " ".join(f"{'train' if is_trainable(c, name) else '-':>6}" for c in modes.values())
            print(f"{name:<{width}} {str(tuple(shape)):<18} {tower:<9} {flags}")
        return
    t0 = time.time()
    raw = load_safetensors(args.batch or os.path.join(args.case, "ref.safetensors"))
    cfg, P, out = run(os.path.join(args.case, "policy"), raw, getattr(torch, args.dtype))
    total, trainable = count_parameters(cfg, P)
    grad_norm = math.sqrt(sum(float((v.double() ** 2).sum()) for k, v in out.items() if k.startswith("grad.")))
    print(f"parameters {total} ({trainable} trainable), layers {[layer_kind(cfg, i) for i in range(cfg.n_layer)]}")
    chunk = out.get("chunk", out["chunk_norm"])  # un-normalized where the folder has the statistics
    print(f"loss {out['loss'].item():.10g}  grad norm {grad_norm:.10g}  |chunk| {chunk.norm().item():.10g}"
          f"  ({args.dtype}, {time.time() - t0:.2f} s)")
    if args.out:
        save_safetensors(args.out, out, {"dtype": args.dtype})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
