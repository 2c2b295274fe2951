"""
export_lerobot.py: a train_vla checkpoint (version 2) -> a LeRobot SmolVLA or pi0 policy folder.

    build/venv/bin/python scripts/export_lerobot.py CKPT -o POLICY_DIR [--vlm NAME_OR_DIR]
        [--cameras top,wrist] [--device cpu] [--force]
    build/venv/bin/python scripts/export_lerobot.py PI0_CKPT -o POLICY_DIR [--sizes FILE] [--cameras ...] [--device ...]
    policy = SmolVLAPolicy.from_pretrained(POLICY_DIR)                     # LeRobot 0.6.1 (PI0Policy for pi0)
    pre = PolicyProcessorPipeline.from_pretrained(POLICY_DIR, "policy_preprocessor.json")
    post = PolicyProcessorPipeline.from_pretrained(POLICY_DIR, "policy_postprocessor.json")

The checkpoint's family picks the policy type. For SmolVLA it writes what LeRobot 0.6.1's
save_pretrained writes for SmolVLA, so that the policy acts as the checkpoint does on the same
observation and noise:
  config.json        type smolvla with the checkpoint's sizes (chunk, max dims, resize to img,
                     tokenizer_max_length = max_text, num_vlm_layers = n_layer, ...), the train
                     flags of its train mode, vlm_model_name = --vlm, load_vlm_weights false
                     (every weight is in model.safetensors)
  model.safetensors  every table tensor under its LeRobot name (vla/config.h's table, dev/model.py's
                     to_lerobot), fp32; lm_head (which feeds nothing and train_vla does not keep)
                     as zeros, so that strict loading finds every tensor
  policy_preprocessor.json / policy_postprocessor.json and their normalizer state files:
                     LeRobot's pipelines (rename, batch, "\\n", tokenizer of --vlm, device,
                     normalizer; unnormalizer, device) with the checkpoint's state and action
                     mean/std (MEAN_STD; images IDENTITY, as SmolVLA's default)
--vlm's tokenizer must make the ids the checkpoint names ("bytes": every byte its own id;
"tokenizer.json:<sha>": that file), else the export is refused; unchecked (said) when its
tokenizer.json is not found here.
pi0 (the checkpoint's family 1) is written as LeRobot 0.6.1 saves a PI0Policy: config.json type
pi0 with PI0Config's defaults (LeRobot's pi0 optimizer and schedule among them), the checkpoint's
chunk, max dims, image_resolution = img, tokenizer_max_length = max_text and the train flags of its
train mode; model.safetensors with both lm_heads, PaliGemma's as the embedding's values (LeRobot's
loader copies that lm_head onto the embedding, the tie of openpi's checkpoints; the embedding's own
tensor, read after it in the file's sorted order, wins today, and equal values make the order moot)
and the expert's as zeros; the pre/post-processors of make_pi0_pre_post_processors (task + "\n",
google/paligemma-3b-pt-224's tokenizer padded to max_length, relative actions off) with the
checkpoint's statistics. PI0Config names its Gemmas by variant only, so a checkpoint at the released
sizes exports as the variants of those sizes; one of other sizes needs --sizes FILE (import_lerobot.py's
sizes file), which must say the checkpoint's sizes, and loads in a LeRobot whose variants build
those sizes. The tokenizer is checked as --vlm's is below, where its tokenizer.json is found (next to
the checkpoint, or in the HF cache under that name).

--vlm is the SmolVLM the sizes come from (LeRobot builds the model from its config.json and
tokenizes with its tokenizer): a local folder or a hub id; default, for the smolvla preset's
sizes, HuggingFaceTB/SmolVLM2-500M-Video-Instruct. A hub id is what config.json names as
vlm_model_name (LeRobot fetches it); here its config is checked against the checkpoint when it can
be found (a folder of that name here or next to the checkpoint; the HF cache's snapshot,
$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub: models--ORG--NAME/snapshots/
<refs/main's commit>, data/hub_cache.py's rule; or the released SmolVLM2's sizes), and nothing is
downloaded: an id found nowhere is an error naming the folders looked at and `hf download ID`.
CKPT is a train_vla checkpoint file, never a hub id (LeRobot's hub ids name policy folders, which
scripts/import_lerobot.py takes). Cameras are
named observation.images.<name>, camera1 .. cameraN unless --cameras says (their order is the
checkpoint's); their feature shape is (3, img, img). config.json's device is --device (none: LeRobot
picks one); the pre-processor's device step says --device or cpu (LeRobot's scripts override it
with the policy's device). Any problem is one line, exit status 1, and nothing is left in
POLICY_DIR: a new (or empty) POLICY_DIR is written beside it as POLICY_DIR.PID.tmp, then renamed.
An existing, non-empty POLICY_DIR is refused unless --force; with it, the files export writes are
written in full into a temporary folder inside it and each renamed over its own name (the
folder's other files stay), and never into the run folder of a trainer that is running (its
.lock held). A failed write (a full disk, the file size limit) removes the temporary folder.

Runs under the project's build/venv (torch + numpy) or build/lerobot-venv; needs neither lerobot nor
the safetensors package.
"""

import argparse
import contextlib
import json
import os
import shutil
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hub_cache  # noqa: E402  data/hub_cache.py: the download command of a VLM's hub id
import import_lerobot  # noqa: E402  the tokenizer names a checkpoint records
import model as vla  # noqa: E402  dev/model.py: vla/'s config, table, LeRobot names, checkpoints
import smolvla  # noqa: E402  dev/smolvla.py: safetensors I/O, the VLM's config
import vla_shard  # noqa: E402  data/vla_shard.py: tokenizer names

RELEASED_VLM = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"  # what lerobot/smolvla_base embeds
PREPROCESSOR_STATE = "policy_preprocessor_step_5_normalizer_processor.safetensors"
POSTPROCESSOR_STATE = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
PI0_PREPROCESSOR_STATE = "policy_preprocessor_step_6_normalizer_processor.safetensors"  # pi0 adds a step before it
# a sizes file's (group, key) -> the checkpoint's config field it is
PI0_SIZE_FIELDS = {("vlm", "width"): "d_model", ("vlm", "depth"): "n_layer", ("vlm", "mlp_dim"): "d_ff",
                   ("vlm", "num_heads"): "n_head", ("vlm", "num_kv_heads"): "n_kv_head",
                   ("vlm", "head_dim"): "head_dim", ("expert", "width"): "d_expert", ("expert", "depth"): "n_layer",
                   ("expert", "mlp_dim"): "d_expert_ff", ("expert", "num_heads"): "n_head",
                   ("expert", "num_kv_heads"): "n_kv_head", ("expert", "head_dim"): "head_dim",
                   ("vision", "hidden_size"): "vis_width",
                   ("vision", "intermediate_size"): "vis_ff", ("vision", "num_hidden_layers"): "vis_layers",
                   ("vision", "num_attention_heads"): "vis_heads", ("vision", "patch_size"): "patch",
                   ("vocab_size", None): "vocab"}
NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
TRAIN_FLAGS = {"expert": (True, True), "vlm": (False, True), "all": (False, False)}  # (expert only, freeze vision)


say = import_lerobot.say  # a summary line, escaped (a tokenizer name comes from the checkpoint)


class UserError(Exception):
    """A user-facing problem: printed as one `error:` line."""


def fail(msg):
    raise UserError(msg)


def is_released_sizes(cfg):
    p = vla.PRESETS["smolvla"]
    return all(getattr(p, f) == getattr(cfg, f) for f in vla.CONFIG_FIELDS
               if f not in ("n_cam", "state_dim", "action_dim", "max_text"))


def check_vlm(cfg, vlm, ckpt):
    """The VLM's config against the checkpoint's sizes, when the config can be found."""
    try:
        vc = smolvla.find_vlm_config(vlm, os.path.dirname(os.path.abspath(ckpt)))
    except FileNotFoundError as e:  # (the folders looked at, as a folder, next to the checkpoint, in the HF cache)
        fail(f"--vlm {vlm}: {e}: pass the folder of the SmolVLM these weights were trained with")
    except (OSError, ValueError, RecursionError) as e:  # (ValueError: not JSON)
        fail(f"--vlm {vlm}: its config.json cannot be read ({type(e).__name__}: {e}): pass the folder of the SmolVLM "
             "these weights were trained with")
    vc = vc if isinstance(vc, dict) else {}
    v, t = vc.get("vision_config", {}), vc.get("text_config", {})
    if not isinstance(v, dict) or not isinstance(t, dict):
        fail(f"--vlm {vlm}: its config.json's vision_config or text_config is not an object: pass the folder of the "
             "SmolVLM these weights were trained with")
    heads = t.get("num_attention_heads", 0)
    pairs = [
        ("vision image_size", v.get("image_size"), "img", cfg.img),
        ("vision patch_size", v.get("patch_size"), "patch", cfg.patch),
        ("vision hidden_size", v.get("hidden_size"), "vis_width", cfg.vis_width),
        ("vision intermediate_size", v.get("intermediate_size"), "vis_ff", cfg.vis_ff),
        ("vision num_hidden_layers", v.get("num_hidden_layers"), "vis_layers", cfg.vis_layers),
        ("vision num_attention_heads", v.get("num_attention_heads"), "vis_heads", cfg.vis_heads),
        ("scale_factor", vc.get("scale_factor", 2), "scale_factor", cfg.scale_factor),
        ("text hidden_size", t.get("hidden_size"), "d_model", cfg.d_model),
        ("text intermediate_size", t.get("intermediate_size"), "d_ff", cfg.d_ff),
        ("text num_attention_heads", heads, "n_head", cfg.n_head),
        ("text num_key_value_heads", t.get("num_key_value_heads"), "n_kv_head", cfg.n_kv_head),
        ("text head_dim", t.get("head_dim") or t.get("hidden_size", 0) // max(heads, 1), "head_dim", cfg.head_dim),
        ("text vocab_size", t.get("vocab_size"), "vocab", cfg.vocab),
    ]
    if t.get("pad_token_id") is not None:
        pairs.append(("text pad_token_id", t.get("pad_token_id"), "pad_token", cfg.pad_token))
    for theirs, value, ours, want in pairs:
        if value != want:
            fail(f"--vlm {vlm}: its config says {theirs} {value}, the checkpoint's {ours} is {want}: pass the SmolVLM "
                 "these weights were trained with")
    if t.get("num_hidden_layers", 0) < cfg.n_layer:
        fail(f"--vlm {vlm}: its text model has {t.get('num_hidden_layers')} layers, the checkpoint {cfg.n_layer}: pass "
             "the SmolVLM these weights were trained with")


def check_tokenizer(ck, vlm, pi0=False):
    """The VLM's tokenizer (pi0: the pre-processor's, by its hub name) must make the token ids the
    checkpoint was trained on: LeRobot's pre-processor tokenizes with it. Returns a line when it
    cannot be checked."""
    ckpt_dir = os.path.dirname(os.path.abspath(ck["path"]))
    places = [vlm] if import_lerobot.is_vlm_path(vlm) else smolvla.vlm_places(vlm, ckpt_dir)
    for place in places:
        path = os.path.join(place, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        tok = import_lerobot.read_json(path, "the tokenizer")
        theirs = "bytes" if isinstance(tok, dict) and import_lerobot.is_byte_identity(tok) else \
            vla_shard.tokenizer_json_id(path)
        if theirs != ck["tokenizer"] and pi0:
            fail(f"LeRobot's pi0 pre-processor tokenizes with {vlm}, whose tokenizer.json ({os.path.normpath(path)}) "
                 f"makes the token ids of {theirs}, the checkpoint was trained on {ck['tokenizer']}: LeRobot would "
                 "feed the model other ids: fine-tune on shards of that tokenizer")
        if theirs != ck["tokenizer"]:
            fail(f"--vlm {vlm}: its tokenizer.json makes the token ids of {theirs}, the checkpoint was trained on "
                 f"{ck['tokenizer']}: LeRobot would feed the model other ids: pass the SmolVLM folder whose tokenizer "
                 "the training data used")
        return None
    get = f" (`{hub_cache.download_command(vlm, 'model')}` puts it in the HF cache)" if hub_cache.is_hub_id(vlm) else ""
    return (f"note: no tokenizer.json of {vlm} found here{get}: not checked that it makes the checkpoint's token ids "
            f"({ck['tokenizer']})")


def expert_multiplier(cfg):
    """expert_width_multiplier such that LeRobot's int(d_model * m) is d_expert, with its MLP width
    and rope base the ones LeRobot derives; fails when LeRobot cannot build these sizes."""
    m = cfg.d_expert / cfg.d_model
    if int(cfg.d_model * m) != cfg.d_expert:
        m = (cfg.d_expert + 0.5) / cfg.d_model
    if int(cfg.d_model * m) != cfg.d_expert or smolvla.expert_intermediate_size(cfg.d_expert) != cfg.d_expert_ff \
            or cfg.rope_theta != 10000:
        fail(f"the checkpoint's expert (width {cfg.d_expert}, MLP {cfg.d_expert_ff}, rope {cfg.rope_theta}) is not one "
             f"LeRobot's SmolVLA builds from a VLM of width {cfg.d_model}: only SmolVLA-shaped checkpoints export")
    return m


def base_config(kind, cfg, cameras, device):
    """The fields every LeRobot 0.6.1 policy config.json starts with (PreTrainedConfig's), in its order."""
    inputs = {cam: {"type": "VISUAL", "shape": [3, cfg.img, cfg.img]} for cam in cameras}
    inputs["observation.state"] = {"type": "STATE", "shape": [cfg.state_dim]}
    return {
        "type": kind, "n_obs_steps": 1, "input_features": inputs,
        "output_features": {"action": {"type": "ACTION", "shape": [cfg.action_dim]}},
        "device": device, "use_amp": False, "use_peft": False, "push_to_hub": False, "repo_id": None,
        "private": None, "tags": None, "license": None, "pretrained_path": None, "pretrained_revision": None,
    }


def policy_config(cfg, mode, vlm, cameras, device, multiplier):
    """config.json as LeRobot 0.6.1 writes a SmolVLAConfig (its fields, in its order)."""
    expert_only, freeze_vision = TRAIN_FLAGS[vla.TRAIN_MODES[mode]]
    return {
        **base_config("smolvla", cfg, cameras, device),
        "chunk_size": cfg.chunk, "n_action_steps": cfg.chunk, "normalization_mapping": NORM_MAP,
        "max_state_dim": cfg.max_state_dim, "max_action_dim": cfg.max_action_dim,
        "resize_imgs_with_padding": [cfg.img, cfg.img], "empty_cameras": 0, "adapt_to_pi_aloha": False,
        "use_delta_joint_actions_aloha": False, "tokenizer_max_length": cfg.max_text, "num_steps": 10,
        "use_cache": True, "freeze_vision_encoder": freeze_vision, "train_expert_only": expert_only,
        "train_state_proj": True, "optimizer_lr": 1e-4, "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-8,
        "optimizer_weight_decay": 1e-10, "optimizer_grad_clip_norm": 10, "scheduler_warmup_steps": 1000,
        "scheduler_decay_steps": 30000, "scheduler_decay_lr": 2.5e-6, "vlm_model_name": vlm,
        "load_vlm_weights": False, "add_image_special_tokens": False, "attention_mode": "cross_attn",
        "prefix_length": -1, "pad_language_to": "longest", "num_expert_layers": -1, "num_vlm_layers": cfg.n_layer,
        "self_attn_every_n_layers": cfg.self_attn_every, "expert_width_multiplier": multiplier,
        "min_period": 4e-3, "max_period": 4.0, "rtc_config": None, "compile_model": False,
        "compile_mode": "max-autotune",
    }


def processors(cfg, tokenizer, cameras, device):
    """(policy_preprocessor.json, policy_postprocessor.json) as LeRobot 0.6.1 saves SmolVLA's, or pi0's
    (make_pi0_pre_post_processors: its own newline step, padding to max_length, relative actions off)."""
    pi0 = cfg.is_pi0
    features = {cam: {"type": "VISUAL", "shape": [3, cfg.img, cfg.img]} for cam in cameras}
    features["observation.state"] = {"type": "STATE", "shape": [cfg.state_dim]}
    features["action"] = {"type": "ACTION", "shape": [cfg.action_dim]}
    relative = [{"registry_name": "relative_actions_processor",
                 "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}}] if pi0 else []
    pre = {"name": "policy_preprocessor", "steps": [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "pi0_new_line_processor" if pi0 else "smolvla_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {
            "max_length": cfg.max_text, "task_key": "task", "padding_side": "right",
            "padding": "max_length" if pi0 else "longest", "truncation": True, "tokenizer_name": tokenizer}},
        {"registry_name": "device_processor", "config": {"device": device or "cpu", "float_dtype": None}},
        *relative,
        {"registry_name": "normalizer_processor", "config": {"eps": 1e-8, "features": features, "norm_map": NORM_MAP},
         "state_file": PI0_PREPROCESSOR_STATE if pi0 else PREPROCESSOR_STATE},
    ]}
    absolute = [{"registry_name": "absolute_actions_processor", "config": {"enabled": False}}] if pi0 else []
    post = {"name": "policy_postprocessor", "steps": [
        {"registry_name": "unnormalizer_processor",
         "config": {"eps": 1e-8, "features": {"action": features["action"]}, "norm_map": NORM_MAP},
         "state_file": POSTPROCESSOR_STATE},
        *absolute,
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]}
    return pre, post


def pi0_sizes_of(cfg):
    """The checkpoint's sizes as a sizes file says them."""
    sizes = {"vlm": {}, "expert": {}, "vision": {}}
    for (group, key), field in PI0_SIZE_FIELDS.items():
        if key is None:
            sizes[group] = getattr(cfg, field)
        else:
            sizes[group][key] = getattr(cfg, field)
    return sizes


def pi0_variants(cfg, sizes_path):
    """(paligemma_variant, action_expert_variant) for config.json: the released variants of the
    checkpoint's sizes, or, with --sizes (which must say the checkpoint's sizes), the defaults, for a
    LeRobot whose variants build those sizes."""
    if cfg.scale_factor != 1 or cfg.rope_theta != 10000 or cfg.pad_token != smolvla.PI0_PAD or cfg.self_attn_every != 1:
        fail(f"the checkpoint (scale_factor {cfg.scale_factor}, rope_theta {cfg.rope_theta}, pad_token "
             f"{cfg.pad_token}, self_attn_every {cfg.self_attn_every}) is not one LeRobot's PI0Policy builds "
             f"(1, 10000, {smolvla.PI0_PAD}, 1): only pi0-shaped checkpoints export as pi0")
    ours = pi0_sizes_of(cfg)
    if sizes_path is not None:
        try:
            theirs = import_lerobot.read_sizes(sizes_path)
        except import_lerobot.UserError as e:
            fail(f"{e}")
        for (group, key), field in PI0_SIZE_FIELDS.items():
            mine, said = (ours[group], theirs[group]) if key is None else (ours[group][key], theirs[group][key])
            if mine != said:
                where = f'"{group}"' if key is None else f'"{group}"."{key}"'
                fail(f"--sizes {sizes_path}: {where} is {said}, the checkpoint's {field} is {mine}: pass the sizes the "
                     "checkpoint was trained at")
        return "gemma_2b", "gemma_300m"
    vlm = [v for v, g in smolvla.PI0_GEMMAS.items() if g == ours["vlm"]]
    expert = [v for v, g in smolvla.PI0_GEMMAS.items() if g == ours["expert"]]
    if not vlm or not expert or ours["vision"] != smolvla.PI0_SIGLIP or ours["vocab_size"] != smolvla.PI0_VOCAB:
        fail(f"the checkpoint's sizes (VLM width {cfg.d_model} x {cfg.n_layer} layers, expert width {cfg.d_expert}, "
             f"vision width {cfg.vis_width}, vocabulary {cfg.vocab}) are not those of LeRobot's pi0 variants, and "
             "PI0Config names its sizes by variant only: pass --sizes FILE with the checkpoint's sizes (the file its "
             "import took) to export it for a LeRobot whose variants build those sizes")
    return vlm[0], expert[0]  # (the two variants' sizes differ: one name each)


def pi0_policy_config(cfg, mode, cameras, device, variants):
    """config.json as LeRobot 0.6.1 writes a PI0Config (its fields, in its order)."""
    expert_only, freeze_vision = TRAIN_FLAGS[vla.TRAIN_MODES[mode]]
    return {
        **base_config("pi0", cfg, cameras, device),
        "paligemma_variant": variants[0], "action_expert_variant": variants[1], "dtype": "float32",
        "chunk_size": cfg.chunk, "n_action_steps": cfg.chunk, "max_state_dim": cfg.max_state_dim,
        "max_action_dim": cfg.max_action_dim, "num_inference_steps": 10, "time_sampling_beta_alpha": 1.5,
        "time_sampling_beta_beta": 1.0, "time_sampling_scale": 0.999, "time_sampling_offset": 0.001,
        "min_period": 4e-3, "max_period": 4.0, "use_relative_actions": False, "relative_exclude_joints": ["gripper"],
        "action_feature_names": None, "rtc_config": None, "image_resolution": [cfg.img, cfg.img], "empty_cameras": 0,
        "normalization_mapping": NORM_MAP, "gradient_checkpointing": False, "compile_model": False,
        "compile_mode": "max-autotune", "freeze_vision_encoder": freeze_vision, "train_expert_only": expert_only,
        "optimizer_lr": 2.5e-5, "optimizer_betas": [0.9, 0.95], "optimizer_eps": 1e-8, "optimizer_weight_decay": 0.01,
        "optimizer_grad_clip_norm": 1.0, "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 30000,
        "scheduler_decay_lr": 2.5e-6, "tokenizer_max_length": cfg.max_text,
    }


def camera_keys(names, n_cam):
    names = [n.strip() for n in names.split(",")] if names else [f"camera{k + 1}" for k in range(n_cam)]
    keys = [n if n.startswith("observation.images.") else "observation.images." + n for n in names]
    if len(keys) != n_cam or len(set(keys)) != n_cam or any(k == "observation.images." for k in keys):
        fail(f"--cameras {names}: the checkpoint reads {n_cam} camera(s): pass {n_cam} distinct comma-separated names, "
             "in the order it was trained on")
    return keys


def fresh_folder(base):
    """A new, empty folder named base.PID.tmp (base.PID.N.tmp where that is taken: a folder of that
    name is someone's, never removed here)."""
    for n in range(100):
        path = f"{base}.{os.getpid()}{'' if n == 0 else f'.{n}'}.tmp"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    fail(f"{base}.{os.getpid()}.tmp and 99 others like it exist: remove them, or write elsewhere (-o)")


def write_folder(out, force, config, tensors, pre, post, pre_stats, pre_state_file, post_stats):
    """The policy folder. A new (or empty) `out`: written in full beside it, then renamed onto it, so
    a failure leaves nothing. An existing folder (--force): every file written in full into a
    temporary folder inside it, then each renamed over its own name; the folder's other files are
    left as they are. A failure removes the temporary folder and says what failed (one line)."""
    names = written_names(pre_state_file)
    into = bool(os.path.isdir(out) and os.listdir(out))
    if into and not force:  # (it filled while the checkpoint was read)
        fail(f"{out} exists and is not empty: pass --force to replace the files export writes in it, or write "
             "elsewhere (-o)")
    need = sum(t.numel() * t.element_size() for t in tensors.values()) + (1 << 16)  # the weights and their headers
    try:
        tmp = fresh_folder(os.path.join(out, ".export_lerobot") if into else out)
    except OSError as e:
        fail(import_lerobot.write_failure(e, out, need, None, f"{out} is as it was" if into else None))
    renamed = []
    try:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=4)
        smolvla.save_safetensors(os.path.join(tmp, "model.safetensors"), tensors)
        for name, spec in (("policy_preprocessor.json", pre), ("policy_postprocessor.json", post)):
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(spec, f, indent=2)
        smolvla.save_safetensors(os.path.join(tmp, pre_state_file), pre_stats)
        smolvla.save_safetensors(os.path.join(tmp, POSTPROCESSOR_STATE), post_stats)
        for name in names:  # on the disk before a name points at them
            fd = os.open(os.path.join(tmp, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if into:
            for name in names[1:] + names[:1]:  # config.json, which LeRobot reads first, last
                os.replace(os.path.join(tmp, name), os.path.join(out, name))
                renamed.append(name)
            os.rmdir(tmp)
        else:
            os.replace(tmp, out)  # (rename replaces an empty folder as it replaces a file)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        left = None if not into else f"{out} is as it was" if not renamed else \
            f"{out} holds the new {', '.join(renamed)} and its other files as they were"
        fail(import_lerobot.write_failure(e, out, need, f"the temporary folder {tmp}", left))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_output(args):
    """-o: a new folder, an empty one, or with --force a folder whose files of the names export
    writes are replaced (never one a running trainer holds). Returns its absolute path."""
    out = os.path.abspath(args.output)
    if not os.path.isdir(os.path.dirname(out)):
        fail(f"-o {args.output}: folder {os.path.dirname(out)} does not exist: create it first")
    if os.path.islink(out):
        fail(f"-o {args.output} is a symbolic link: pass the folder it points to ({os.path.realpath(out)}), or "
             "another -o")
    if os.path.lexists(out) and not os.path.isdir(out):
        fail(f"-o {args.output} is a file, and export writes a folder: pass a folder name (-o)")
    if not os.path.isdir(out) or not os.listdir(out):
        return out
    if not args.force:
        fail(f"{args.output} exists and is not empty: pass --force to replace the files export writes in it "
             "(config.json, model.safetensors, the processors' files; the others stay), or write elsewhere (-o)")
    return out


def written_names(pre_state_file):
    """The files a policy folder gets from export (the pre-processor's state file is the family's)."""
    return ["config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json",
            pre_state_file, POSTPROCESSOR_STATE]


def folder_files_free(out, pre_state_file):
    """With --force into an existing folder: each name export writes must be a file (or absent), so
    that the renames cannot fail half-way on a folder of that name."""
    for name in written_names(pre_state_file):
        path = os.path.join(out, name)
        if os.path.lexists(path) and not (os.path.isfile(path) or os.path.islink(path)):
            fail(f"{path} is a folder, where export writes a file: move it away, or write elsewhere (-o)")


def export_pi0(args, ck, out):
    """A pi0 checkpoint -> a PI0Policy folder."""
    cfg, mode = ck["config"], ck["train_mode"]
    if args.vlm is not None:
        fail(f"--vlm {args.vlm}: {args.checkpoint} is a pi0 checkpoint, which has no VLM folder (its sizes are its "
             "variants', or --sizes FILE's): leave --vlm out")
    variants = pi0_variants(cfg, args.sizes)
    tokenizer = import_lerobot.PALIGEMMA_TOKENIZER
    tokenizer_note = check_tokenizer(ck, tokenizer, pi0=True)
    cameras = camera_keys(args.cameras, cfg.n_cam)

    params = {name: torch.from_numpy(x) for name, x in ck["params"].items()}
    tensors = dict(vla.to_lerobot(cfg, params))
    m = smolvla.MODULES["pi0"]
    # LeRobot's loader copies PaliGemma's lm_head onto the embedding (the tie of openpi's checkpoints):
    # holding the embedding's values, it leaves the embedding as it is whichever tensor is read last;
    # the expert's feeds nothing
    tensors[m.vlm_lm_head + "weight"] = tensors[m.text + "embed_tokens.weight"].clone()
    tensors[m.expert_lm_head + "weight"] = torch.zeros(cfg.vocab, cfg.d_expert)
    S, A, stats = cfg.state_dim, cfg.action_dim, torch.from_numpy(ck["stats"])
    state = {"observation.state.mean": stats[:S], "observation.state.std": stats[S:2 * S]}
    action = {"action.mean": stats[2 * S:2 * S + A], "action.std": stats[2 * S + A:]}
    pre, post = processors(cfg, tokenizer, cameras, args.device)
    config = pi0_policy_config(cfg, mode, cameras, args.device, variants)
    folder_files_free(out, PI0_PREPROCESSOR_STATE)
    write_folder(out, args.force, config, tensors, pre, post, {**state, **action}, PI0_PREPROCESSOR_STATE, action)
    say(f"export_lerobot: {args.checkpoint} (pi0, step {ck['step']}, train mode {vla.TRAIN_MODES[mode]}, "
        f"tokenizer {ck['tokenizer']}) -> {args.output}")
    say(f"  paligemma_variant {variants[0]}, action_expert_variant {variants[1]}"
        + (f" (at --sizes {args.sizes}'s sizes)" if args.sizes else "") + f"; cameras {', '.join(cameras)}; "
        f"state {S}, action {A} dims; {len(tensors)} tensors (PaliGemma's lm_head = the embedding, the expert's "
        "zeros), fp32")
    if tokenizer_note:
        say(f"  {tokenizer_note}")


def parser():
    ap = argparse.ArgumentParser(description="a train_vla checkpoint -> a LeRobot SmolVLA or pi0 policy folder")
    ap.add_argument("checkpoint", help="a train_vla checkpoint file (version 2; not a hub id: import_lerobot.py takes "
                                       "those)")
    ap.add_argument("-o", "--output", required=True, help="policy folder to write (new, or empty, unless --force)")
    ap.add_argument("--force", action="store_true",
                    help="write into an existing folder: the files export writes are replaced, the others kept (never "
                         "the run folder of a trainer that is running)")
    ap.add_argument("--vlm", metavar="DIR_OR_NAME",
                    help=f"the SmolVLM of these sizes: a path (absolute, starting with ./ ../ or ~, or of more than one "
                         f"slash) is its folder as given and must hold config.json; a name (a folder name, or an HF "
                         f"repo id owner/name) is looked up here, next to the checkpoint, then in the HF cache "
                         f"($HF_HUB_CACHE, else $HF_HOME/hub: data/hub_cache.py; never downloaded); default for "
                         f"the smolvla preset's sizes: {RELEASED_VLM}")
    ap.add_argument("--sizes", metavar="FILE",
                    help="pi0 of other sizes than the released variants': the sizes file its import took, "
                         "which must say the checkpoint's sizes: " + import_lerobot.SIZES_FORMAT)
    ap.add_argument("--cameras", help="comma-separated camera names, in the checkpoint's order (camera1,camera2,...)")
    ap.add_argument("--device", help="config.json's device (default: none, LeRobot picks)")
    return ap


def parse_args(argv):
    return parser().parse_args(argv)


def read_checkpoint(path):
    """dev/model.py's read_checkpoint, each refusal's fix in terms of what export takes (the reader's
    own fix names the trainers' --init, which export does not have)."""
    try:
        return vla.read_checkpoint(path)
    except ValueError as e:
        msg = f"{e}"
    again = "pass an intact checkpoint (an earlier ckpt_*.bin of its run)"
    if msg.startswith("cannot open checkpoint"):
        fail(f"{msg}: pass the path of a train_vla checkpoint file")
    if "bad magic" in msg:
        fail(f"{msg}: pass a train_vla checkpoint (a ckpt_*.bin of a run folder)")
    if "has version 1" in msg:
        fail(f"{msg.rpartition(': ')[0]}: export a checkpoint of a run of this train_vla (version {vla.CKPT_VERSION})")
    if "--init" in msg:
        msg = msg.rpartition(": ")[0]
    fail(f"{msg}: {again}")


def run(args):
    ck = read_checkpoint(args.checkpoint)
    cfg = ck["config"]
    out = check_output(args)
    # a trainer's run folder held by it is never written into, --force or not
    with import_lerobot.run_folder_free(out, args.force) if os.path.isdir(out) else contextlib.nullcontext():
        export(args, ck, cfg, out)


def export(args, ck, cfg, out):
    """run's work, with -o held where it is a run folder."""
    mode = ck["train_mode"]
    ck["path"] = args.checkpoint
    if cfg.is_pi0:
        return export_pi0(args, ck, out)
    if args.sizes is not None:
        fail(f"--sizes {args.sizes}: {args.checkpoint} is a SmolVLA checkpoint, whose sizes --vlm's config says: leave "
             "--sizes out")
    if args.vlm:
        try:  # a path must be the folder as given; a name is looked up (import_lerobot.py's rule)
            vlm = import_lerobot.check_vlm_path(args.vlm, "the checkpoint")
        except import_lerobot.UserError as e:
            fail(f"{e}")
        vlm = os.path.abspath(vlm) if os.path.isdir(vlm) else vlm
    elif is_released_sizes(cfg):
        vlm = RELEASED_VLM
    else:
        fail(f"{args.checkpoint} has sizes other than lerobot/smolvla_base's: pass --vlm DIR, the SmolVLM folder "
             "(config.json, tokenizer, processor) these sizes come from")
    check_vlm(cfg, vlm, args.checkpoint)
    tokenizer_note = check_tokenizer(ck, vlm)
    multiplier = expert_multiplier(cfg)
    cameras = camera_keys(args.cameras, cfg.n_cam)

    params = {name: torch.from_numpy(x) for name, x in ck["params"].items()}
    tensors = dict(vla.to_lerobot(cfg, params))
    tensors[vla.LM_HEAD] = torch.zeros(cfg.vocab, cfg.d_model)
    S, A, stats = cfg.state_dim, cfg.action_dim, torch.from_numpy(ck["stats"])
    state = {"observation.state.mean": stats[:S], "observation.state.std": stats[S:2 * S]}
    action = {"action.mean": stats[2 * S:2 * S + A], "action.std": stats[2 * S + A:]}
    pre, post = processors(cfg, vlm, cameras, args.device)
    config = policy_config(cfg, mode, vlm, cameras, args.device, multiplier)
    folder_files_free(out, PREPROCESSOR_STATE)
    write_folder(out, args.force, config, tensors, pre, post, {**state, **action}, PREPROCESSOR_STATE, action)
    say(f"export_lerobot: {args.checkpoint} (step {ck['step']}, train mode {vla.TRAIN_MODES[mode]}, "
        f"tokenizer {ck['tokenizer']}) -> {args.output}")
    say(f"  vlm_model_name {vlm}; cameras {', '.join(cameras)}; state {S}, action {A} dims; "
        f"{len(tensors)} tensors (lm_head zeros), fp32")
    if tokenizer_note:
        say(f"  {tokenizer_note}")


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (UserError, import_lerobot.UserError) as e:
        import_lerobot.error_exit(f"{e}")
    except MemoryError:
        import_lerobot.error_exit(f"out of memory while exporting {args.checkpoint}: free memory, or export on a "
                                  "machine with more")
    except RecursionError:
        import_lerobot.error_exit("a JSON file export read (the VLM's config.json or tokenizer.json) nests too "
                                  "deeply: pass a --vlm folder saved by transformers")
    except OSError as e:
        import_lerobot.error_exit(f"{e.filename or args.checkpoint}: {e.strerror or e}: pass a readable checkpoint "
                                  "and --vlm folder, and an -o where this user may write")


if __name__ == "__main__":
    main()
