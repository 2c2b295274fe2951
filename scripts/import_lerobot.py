"""
import_lerobot.py: a LeRobot SmolVLA or pi0 policy folder -> a train_vla checkpoint (version 2).

    build/venv/bin/python scripts/import_lerobot.py POLICY_DIR -o CKPT [--vlm DIR_OR_NAME] [--train-mode MODE]
        [--max-text N] [--tokenizer NAME] [--seed N] [--force]
    build/venv/bin/python scripts/import_lerobot.py lerobot/smolvla_base -o CKPT     # a hub id, downloaded before
    build/venv/bin/python scripts/import_lerobot.py PI0_DIR -o CKPT [--sizes FILE] [--train-mode MODE] ...
    ./train_vla_cpu -i data.bin --init CKPT --weights-only ...         # fine-tune it (its sizes, this data)
    VLAPolicy(CKPT)                                                      # scripts/vla_policy.py

POLICY_DIR is what LeRobot 0.6.1's save_pretrained writes: config.json (type smolvla or pi0),
model.safetensors (fp32, bf16 or fp16, or a mix) and, when the processors were saved next to it,
policy_preprocessor.json / policy_postprocessor.json with their normalizer state files. It may be
a policy's hub id (lerobot/smolvla_base) instead, when no path of that name exists: the HF cache's
snapshot of it that holds config.json is read ($HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub: models--ORG--NAME/snapshots/<refs/main's commit>; data/hub_cache.py says
the whole rule). Nothing is downloaded: an id not cached is an error naming the folders looked at
and the download command (`hf download lerobot/smolvla_base`). A
SmolVLA folder's sizes come from config.json and the VLM config its vlm_model_name names (a local folder, a
folder of that name next to the policy, or the HF cache, by the same rule). --vlm overrides vlm_model_name: a name
(a bare folder name, or an HF repo id owner/name) is looked up the same way; a path (absolute, or
starting with ./ ../ or ~, or of more than one slash) is the VLM's folder as given, and one that
is not a folder holding config.json is an error, never a folder of its base name elsewhere.

A pi0 folder's config.json names its Gemmas by variant only (paligemma_variant gemma_2b,
action_expert_variant gemma_300m), so its sizes are the released variants' (dev/smolvla.py's
PI0_GEMMAS, PI0_SIGLIP), or those of --sizes FILE for a model of other sizes: a JSON object in
LeRobot's own config keys,
    {"vlm": {"width", "depth", "mlp_dim", "num_heads", "num_kv_heads", "head_dim"},
     "expert": {the same keys}, "vocab_size": N,
     "vision": {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size"}}
(the image side is config.json's image_resolution). The two Gemmas run through one attention, so
they share depth, heads, key/value heads and head size. Without --sizes, a c_config.txt in the
folder above the policy (the references of dev/lerobot/make_ref.py --family pi0) gives the sizes.
--vlm is SmolVLA's, --sizes pi0's.

Every tensor of vla/config.h's table (FLOW_PARAMETERS, as dev/model.py states it) is read by its
LeRobot name and shape-checked against the sizes; the lm_heads (SmolVLA's one; pi0's PaliGemma
lm_head and the expert's), which feed nothing, are shape-checked too and listed as skipped, as is
any other tensor the table lacks. Any problem is one line, `error: ...: <fix>`, exit status 1,
nothing written. Every safetensors file is checked as the format requires before a byte of it is
used (dev/safetensors_format.py: names given once, tensors end to end over the data section).
An existing CKPT is replaced only with --force, and never in the run folder of a trainer that is
running (its .lock held): the file is written to CKPT.PID.tmp and renamed, and a failed write
(a full disk, the file size limit) removes it and leaves CKPT as it was.

The checkpoint holds what checkpoint_write in vla/checkpoint.h writes (dev/model.py's write_checkpoint):
  config       the sizes above; max_text = tokenizer_max_length (--max-text overrides)
  train_mode   from train_expert_only / freeze_vision_encoder (expert / vlm / all; --train-mode)
  step 0, sampler_pos 0, seed 1337 (the trainers' default -s; --seed): --init CKPT --weights-only
               (fine-tuning) uses the weights alone; plain --init continues it as a run at step 0
  stats        observation.state mean/std from the pre-processor's normalizer, action mean/std
               from the post-processor's unnormalizer (else the pre-processor's); none saved:
               mean 0, std 1 (said); stds below 1e-6 become 1, as dataset_open floors them
  weights      every table tensor, fp32 (bf16 and fp16 widen exactly)
  m, v         zeros, one per element trainable in train_mode: AdamW's state before its first
               step (version 2 always carries them; a file without them is refused as truncated)
  tokenizer    what the shards' token ids must be: "bytes" when the VLM's tokenizer.json maps
               every byte to its own id and nothing else (the ids the data tools write and the
               policy library makes), else "tokenizer.json:<first 16 hex of its sha256>" (the name
               data/vla_shard.py gives a tokenizer.json); no tokenizer.json found: "vlm:<name>"
               (said; --tokenizer NAME records NAME instead). pi0's tokenizer is the one its
               pre-processor names (LeRobot's: google/paligemma-3b-pt-224), looked up the same
               way: beside the policy, in a folder of its base name, in the HF cache

Runs under the project's build/venv (torch + numpy, the oracle's) or build/lerobot-venv: the safetensors
and JSON files are read here, without the safetensors or lerobot packages.
"""

import argparse
import contextlib
import errno
import fcntl
import json
import os
import stat
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
sys.path.insert(0, os.path.join(ROOT, "data"))
import hub_cache  # noqa: E402  data/hub_cache.py: a policy's hub id as its snapshot in the HF cache
import model as vla  # noqa: E402  dev/model.py: vla/'s config, table, LeRobot names, checkpoints
import safetensors_format  # noqa: E402  dev/safetensors_format.py: the format's header, checked; escaping
import smolvla  # noqa: E402  dev/smolvla.py: where a policy's VLM is found
import vla_shard  # noqa: E402  data/vla_shard.py: tokenizer names

SUPPORTED_NORMS = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
FAMILIES = {"smolvla": "SmolVLA", "pi0": "pi0"}  # config.json's type -> the family's name in messages
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"  # what LeRobot's pi0 pre-processor tokenizes with
SIZES_FORMAT = ('{"vlm": {width, depth, mlp_dim, num_heads, num_kv_heads, head_dim}, "expert": {the same}, '
                '"vision": {hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, patch_size}, '
                '"vocab_size": N}')
# pi0's settings the trainers fix (config.json key, the only value they implement: LeRobot's default)
PI0_FIXED = [("n_obs_steps", 1), ("empty_cameras", 0), ("use_relative_actions", False), ("rtc_config", None),
             ("num_inference_steps", 10), ("time_sampling_beta_alpha", 1.5), ("time_sampling_beta_beta", 1.0),
             ("time_sampling_scale", 0.999), ("time_sampling_offset", 0.001), ("min_period", 4e-3),
             ("max_period", 4.0)]
FLOAT_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}


class UserError(Exception):
    """A user-facing problem: printed as one `error:` line."""


def fail(msg):
    raise UserError(msg)


# ----------------------------------------------------------------------------
# safetensors, read lazily (a 450M-parameter model is not loaded twice): the header checked as the
# format requires by dev/safetensors_format.py, the project's one reader of it


@contextlib.contextmanager
def safetensors_file(path):
    """(the file open for reading, name -> Entry(dtype, shape, begin, end) with absolute offsets) of
    a safetensors file, refused in one line unless it is what the format requires."""
    with contextlib.ExitStack() as stack:
        try:
            f = stack.enter_context(safetensors_format.open_regular(path))
            index, _ = safetensors_format.index_of(f, path)
        except ValueError as e:
            fail(f"{e}")
        except OSError as e:
            fail(f"cannot read {path}: {e.strerror}: pass a LeRobot policy folder with a readable model.safetensors")
        yield f, index


def whole(x):
    """A JSON whole number (not a boolean, which Python counts as an int)."""
    return isinstance(x, int) and not isinstance(x, bool)


def read_float32(f, path, entry, name):
    """One tensor of the open file f as float32: bf16 and fp16 widen exactly, fp64 rounds."""
    if entry.dtype not in FLOAT_DTYPES:
        fail(f"{path}: {safetensors_format.escaped(name)} has dtype {entry.dtype}, not a floating-point type: the file "
             "is not a policy's weights")
    try:
        raw = np.frombuffer(safetensors_format.read_bytes(f, entry, path, name), FLOAT_DTYPES[entry.dtype])
    except ValueError as e:
        fail(f"{e}")
    if entry.dtype == "BF16":  # bf16 is the top half of a float32
        return (raw.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(all="ignore"):  # an fp64 NaN or one past float32's range: refused in one line by the caller
        return raw.astype(np.float32)


# ----------------------------------------------------------------------------
# the policy folder


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except RecursionError:
        fail(f"cannot read {what} {path}: its JSON nests too deeply: save the policy again with LeRobot's "
             "save_pretrained")
    except (OSError, ValueError) as e:  # (ValueError: UnicodeDecodeError, JSONDecodeError, an int of 5000 digits)
        fail(f"cannot read {what} {path}: {e}: save the policy again with LeRobot's save_pretrained")


def check_policy_config(policy_dir):
    """config.json, checked for what train_vla's SmolVLA or pi0 implements; returns it."""
    if not os.path.isdir(policy_dir):
        fail(f"{policy_dir} is not a folder: pass the folder LeRobot's save_pretrained wrote (config.json, "
             "model.safetensors)")
    path = os.path.join(policy_dir, "config.json")
    if not os.path.isfile(path):
        fail(f"{policy_dir} has no config.json, so it is not a LeRobot policy folder: pass the folder LeRobot's "
             "save_pretrained wrote (config.json, model.safetensors)")
    pc = read_json(path, "the policy config")
    kind = pc.get("type") if isinstance(pc, dict) else None
    if kind not in FAMILIES:
        fail(f"{path} describes a LeRobot policy of type {kind!r}, not 'smolvla' or 'pi0': train_vla imports SmolVLA "
             "and pi0 policies only")
    family = FAMILIES[kind]
    if not os.path.isfile(os.path.join(policy_dir, "model.safetensors")):
        fail(f"{policy_dir} has no model.safetensors: save the policy with LeRobot's save_pretrained, which writes it")
    inputs, outputs = pc.get("input_features") or {}, pc.get("output_features") or {}
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        fail(f"{path}: input_features and output_features are not objects of features: save the policy again with "
             "LeRobot's save_pretrained")
    inputs = {k: v for k, v in inputs.items() if isinstance(v, dict)}
    if inputs.get("observation.state", {}).get("type") != "STATE" or \
            not isinstance(outputs.get("action"), dict) or outputs["action"].get("type") != "ACTION":
        fail(f"{path}: input_features lacks observation.state (STATE) or output_features lacks action (ACTION): "
             f"{family} needs both; save the policy with its dataset's features")
    if not any(f.get("type") == "VISUAL" for f in inputs.values()):
        fail(f"{path}: no VISUAL input feature: train_vla's {family} reads at least one camera")
    norms = pc.get("normalization_mapping", SUPPORTED_NORMS)
    if not isinstance(norms, dict):
        fail(f"{path}: normalization_mapping is not an object: save the policy again with LeRobot's save_pretrained")
    for kind, mode in SUPPORTED_NORMS.items():
        if norms.get(kind, mode) != mode:
            fail(f"{path}: normalization_mapping {kind} is {norms.get(kind)}: train_vla normalizes {kind} with "
                 f"{mode} only ({family}'s default)")
    if family == "pi0":
        unsupported = PI0_FIXED
        for key in ("paligemma_variant", "action_expert_variant"):
            if pc.get(key) not in smolvla.PI0_GEMMAS:
                fail(f"{path}: {key} is {pc.get(key)!r}, not one of LeRobot's {sorted(smolvla.PI0_GEMMAS)}: save the "
                     "policy again with LeRobot's save_pretrained")
        res = pc.get("image_resolution")
        if not (isinstance(res, list) and len(res) == 2 and all(whole(x) and x > 0 for x in res) and res[0] == res[1]):
            fail(f"{path}: image_resolution is {res}: train_vla's pi0 reads square images (LeRobot's default [224, "
                 "224])")
    else:
        unsupported = [("n_obs_steps", 1), ("empty_cameras", 0), ("add_image_special_tokens", False),
                       ("adapt_to_pi_aloha", False), ("use_delta_joint_actions_aloha", False)]
    for key, default in unsupported:
        if pc.get(key, default) != default:
            fail(f"{path}: {key} is {pc[key]}: train_vla's {family} implements {key} = {default} only (LeRobot's "
                 "default)")
    return pc


def is_vlm_path(vlm):
    """Whether --vlm is a path, the VLM's folder as given, rather than a name looked up as
    vlm_model_name is: absolute, starting with ./ ../ or ~, or of more than one slash (an HF repo
    id, owner/name, has one; a trailing slash does not count)."""
    return (os.path.isabs(vlm) or vlm in (".", "..", "~") or vlm.startswith(("./", "../", "~"))
            or vlm.rstrip("/").count("/") > 1)


def check_vlm_path(vlm, beside="the policy"):
    """--vlm as the folder to read: a path must be a folder holding config.json (the lookup by base
    name would find another folder silently); a name passes as it is. Returns the value to use."""
    if not is_vlm_path(vlm):
        return vlm
    path = os.path.expanduser(vlm)
    fix = "pass the VLM's folder (config.json, tokenizer.json), or a name (a folder name or HF repo id owner/name) " \
          f"to look up next to {beside} and in the HF cache"
    if not os.path.exists(path):
        fail(f"--vlm {vlm}: no such folder: {fix}")
    if not os.path.isdir(path):
        fail(f"--vlm {vlm} is a file, not a folder: {fix}")
    if not os.path.isfile(os.path.join(path, "config.json")):
        fail(f"--vlm {vlm}: the folder has no config.json, so it is not a VLM folder: {fix}")
    return path


def read_sizes(path, option="--sizes"):
    """A pi0 sizes file (SIZES_FORMAT: LeRobot's GemmaConfig and SigLIP config keys) -> its dict,
    every key there and every value a positive whole number."""
    fix = f"write the model's sizes as {SIZES_FORMAT}"
    try:
        with open(path, encoding="utf-8") as f:
            sizes = json.load(f)
    except RecursionError:
        fail(f"{option} {path}: cannot read it: its JSON nests too deeply: {fix}")
    except (OSError, ValueError) as e:
        fail(f"{option} {path}: cannot read it: {e}: {fix}")
    if not isinstance(sizes, dict):
        fail(f"{option} {path} holds a JSON {type(sizes).__name__}, not an object: {fix}")
    for key, fields in smolvla.PI0_SIZE_KEYS.items():
        if key not in sizes:
            fail(f"{option} {path} has no \"{key}\": {fix}")
        if fields is None:
            if not (whole(sizes[key]) and sizes[key] > 0):
                fail(f"{option} {path}: \"{key}\" is {json.dumps(sizes[key])[:40]}, not a positive whole number: {fix}")
            continue
        group = sizes[key]
        if not isinstance(group, dict):
            fail(f"{option} {path}: \"{key}\" is {json.dumps(group)[:40]}, not an object: {fix}")
        for field in fields:
            if field not in group:
                fail(f"{option} {path}: \"{key}\" has no \"{field}\": {fix}")
            if not (whole(group[field]) and group[field] > 0):
                fail(f"{option} {path}: \"{key}\".\"{field}\" is {json.dumps(group[field])[:40]}, not a positive "
                     f"whole number: {fix}")
        extra = sorted(set(group) - set(fields))
        if extra:
            fail(f"{option} {path}: \"{key}\" has the unknown key \"{extra[0]}\": {fix}")
    extra = sorted(set(sizes) - set(smolvla.PI0_SIZE_KEYS))
    if extra:
        fail(f"{option} {path} has the unknown key \"{extra[0]}\": {fix}")
    for field in ("depth", "num_heads", "num_kv_heads", "head_dim"):
        if sizes["vlm"][field] != sizes["expert"][field]:
            fail(f"{option} {path}: \"vlm\".\"{field}\" is {sizes['vlm'][field]}, \"expert\".\"{field}\" "
                 f"{sizes['expert'][field]}: pi0's two Gemmas share one attention, so they share {field}: pass the "
                 "sizes the model was built with")
    return sizes


def policy_sizes(policy_dir, max_text, vlm_name, pi0_sizes=None, family="SmolVLA", source=None):
    """Our SmolVLAConfig of the folder (config.json and its VLM's config; a pi0 folder's: pi0_sizes,
    a sizes file's dict, else the released variants'; source says which, for the messages)."""
    try:
        cfg, lc = vla.config_from_policy(policy_dir, max_text, vlm_name, pi0_sizes)
    except FileNotFoundError as e:
        fail(f"{policy_dir}: {e}: pass --vlm DIR, a folder with the VLM's config.json and tokenizer")
    except (ValueError, KeyError, AssertionError, TypeError) as e:
        what = "the sizes" if family == "pi0" else "its VLM config"
        fail(f"{policy_dir}: config.json or {what}: {type(e).__name__} {e}: train_vla's {family} does not implement "
             "this policy")
    problem = vla.config_problem(cfg)
    if problem and family == "pi0":
        fail(f"{policy_dir}: config.json with {source} makes a config train_vla refuses ({problem}): pass --sizes "
             "FILE with the sizes the model was built at")
    if problem:
        fail(f"{policy_dir}: its sizes make a config train_vla refuses ({problem})")
    return cfg, lc


def read_weights(policy_dir, cfg, source):
    """Every table tensor from model.safetensors into one float32 buffer in table order, each shape
    checked against what `source` (where the sizes came from, for the messages) says; the lm_heads
    shape-checked too. Returns (name -> array view of table shape, file dtypes, skipped LeRobot names)."""
    path = os.path.join(policy_dir, "model.safetensors")
    with safetensors_file(path) as (f, index):
        return read_table(f, path, index, cfg, source)


def read_table(f, path, index, cfg, source):
    """read_weights of the open, checked file f."""
    family = FAMILIES[vla.FAMILY_NAMES[cfg.family]]
    fix = ("pass --sizes FILE with the sizes the model was built at" if cfg.is_pi0 else
           "pass the policy folder they were saved with, or --vlm with the VLM they were trained on")
    # every name and shape first: a folder of other sizes fails before a buffer of the sizes is made
    for s in vla.param_table(cfg):
        names = vla.lerobot_names(cfg, s)
        want = vla.lerobot_shape(cfg, s)
        for i, name in enumerate(names):
            where = s.name if len(names) == 1 else f"{s.name}[{i}]"
            if name not in index:
                fail(f"{path} lacks {name} (train_vla's {where}): the file is not a complete {family} policy of "
                     f"{source}'s sizes: save it again with LeRobot's save_pretrained")
            if index[name][1] != want:
                fail(f"{path}: {name} has shape {list(index[name][1])}, {source} says {list(want)} (train_vla's "
                     f"{where}): the weights belong to another config: {fix}")
    # the lm_heads feed nothing and are not kept, but their rows are the vocabulary and their width a stack's
    for name, want in lm_head_shapes(cfg).items():
        if name in index and index[name][1] != want:
            fail(f"{path}: {name} has shape {list(index[name][1])}, {source} says {list(want)} (vocabulary x width): "
                 f"the weights belong to another config: {fix}")
    flat = np.empty(vla.param_count(cfg), np.float32)
    params, used = {}, set()
    for s in vla.param_table(cfg):
        view = flat[s.offset:s.offset + int(np.prod(s.shape))].reshape(s.shape)
        names = vla.lerobot_names(cfg, s)
        for i, name in enumerate(names):
            x = read_float32(f, path, index[name], name)
            if not np.isfinite(x).all():
                fail(f"{path}: {name} holds NaN or Inf values: the weights are corrupt, save them again")
            (view if len(names) == 1 else view[i]).reshape(-1)[:] = x
            used.add(name)
        params[s.name] = view
    dtypes = sorted({index[n][0] for n in used})
    return params, dtypes, sorted(set(index) - used)


def lm_head_shapes(cfg):
    """LeRobot name -> shape of the family's lm_heads: (vocab, the VLM's width), and pi0's expert's
    (vocab, the expert's width)."""
    m = smolvla.MODULES[vla.FAMILY_NAMES[cfg.family]]
    shapes = {m.vlm_lm_head + "weight": (cfg.vocab, cfg.d_model)}
    if m.expert_lm_head is not None:
        shapes[m.expert_lm_head + "weight"] = (cfg.vocab, cfg.d_expert)
    return shapes


def pipeline_steps(spec, path):
    """A saved processor pipeline's steps: the objects of its "steps" list."""
    steps = spec.get("steps", []) if isinstance(spec, dict) else None
    if not isinstance(steps, list):
        fail(f"{path} is not a saved processor pipeline (an object with a list of steps): save the processors again "
             "with LeRobot")
    return [step for step in steps if isinstance(step, dict)]


def normalizer_stats(policy_dir, pipeline, registry_name):
    """(the state file's path, its tensors) of a saved processor pipeline's normalizer step, or None."""
    path = os.path.join(policy_dir, pipeline)
    if not os.path.isfile(path):
        return None
    steps = pipeline_steps(read_json(path, "the processor"), path)
    for step in steps:
        if step.get("registry_name") != registry_name:
            continue
        norms = (step.get("config") if isinstance(step.get("config"), dict) else {}).get("norm_map", SUPPORTED_NORMS)
        if not isinstance(norms, dict):
            fail(f"{path}: the {registry_name}'s norm_map is {json.dumps(norms)[:60]}, not an object: save the "
                 "processors again with LeRobot")
        for kind in ("STATE", "ACTION"):
            if norms.get(kind, "MEAN_STD") != "MEAN_STD":
                fail(f"{path}: the {registry_name} maps {kind} to {norms[kind]}: train_vla normalizes with MEAN_STD "
                     "only")
        state_file = step.get("state_file")
        if not state_file:
            return None
        if not isinstance(state_file, str):
            fail(f"{path}: the {registry_name}'s state_file is {json.dumps(state_file)[:60]}, not a file name: "
                 "save the processors again with LeRobot")
        st_path = os.path.join(policy_dir, state_file)
        if not os.path.isfile(st_path):
            fail(f"{path} names {state_file}, which is not in {policy_dir}: copy the processor's state files with it")
        with safetensors_file(st_path) as (f, index):
            return st_path, {k: read_float32(f, st_path, e, k) for k, e in index.items()}
    return None


def read_stats(policy_dir, cfg):
    """state mean(S) std(S) action mean(A) std(A), and lines saying where they came from."""
    S, A = cfg.state_dim, cfg.action_dim
    pre = normalizer_stats(policy_dir, "policy_preprocessor.json", "normalizer_processor")
    post = normalizer_stats(policy_dir, "policy_postprocessor.json", "unnormalizer_processor")
    parts, notes = [], []
    for key, dim, sources in (("observation.state", S, [pre]), ("action", A, [post, pre])):
        found = None
        for src in sources:
            if src is not None and f"{key}.mean" in src[1] and f"{key}.std" in src[1]:
                found = src
                break
        if found is None:
            parts += [np.zeros(dim, np.float32), np.ones(dim, np.float32)]
            notes.append(f"{key}: no mean/std saved with the policy: wrote mean 0, std 1 (no normalization)")
            continue
        mean, std = found[1][f"{key}.mean"].reshape(-1), found[1][f"{key}.std"].reshape(-1)
        if mean.size != dim or std.size != dim:
            fail(f"{found[0]}: {key} statistics have {mean.size} and {std.size} values, config.json says {dim} dims: "
                 "the processors belong to another dataset: save them again with the policy")
        if not (np.isfinite(mean).all() and np.isfinite(std).all()):
            fail(f"{found[0]}: {key} statistics hold NaN or Inf: recompute the dataset statistics")
        low = std < vla.MIN_STD
        if low.any():
            std = np.where(low, np.float32(1), std)
            notes.append(f"{key}: std below {float(vla.MIN_STD):g} in dims {np.flatnonzero(low).tolist()}: set to 1, "
                         "as the trainers' dataset_open does")
        parts += [mean, std]
        notes.append(f"{key}: mean/std from {os.path.basename(found[0])}")
    return np.concatenate(parts).astype(np.float32), notes


# ----------------------------------------------------------------------------
# the tokenizer the checkpoint names


def byte_level_chars():
    """The byte-level alphabet: byte b is the character byte-level BPE writes for it (printable
    Latin-1 bytes stand for themselves; the others, in order, for 256, 257, ...)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def is_byte_identity(tok):
    """Whether a tokenizer.json turns any text into its UTF-8 bytes as ids (the "bytes" tokenizer
    of the shards): byte-level BPE without merges whose byte character b has id b, no normalizer,
    and no post-processor that adds tokens. (Its special tokens, if a text spells one, would differ.)"""
    model = tok.get("model") or {}
    if model.get("type") != "BPE" or model.get("merges") or tok.get("normalizer") is not None:
        return False
    if (tok.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        return False
    post = tok.get("post_processor")
    if post is not None and post.get("type") not in ("ByteLevel", "TemplateProcessing"):
        return False
    if post is not None and post.get("type") == "TemplateProcessing" and \
            any("Sequence" not in piece for piece in post.get("single", [])):
        return False
    vocab, chars = model.get("vocab") or {}, byte_level_chars()
    if any(vocab.get(chars[b]) != b for b in range(256)):
        return False
    return all(t["content"] == chars[t["id"]] for t in tok.get("added_tokens", []) if t["id"] < 256)


def pi0_tokenizer(policy_dir):
    """The tokenizer a pi0 folder's saved pre-processor loads (its tokenizer step's tokenizer_name),
    else LeRobot's for pi0."""
    path = os.path.join(policy_dir, "policy_preprocessor.json")
    if os.path.isfile(path):
        for step in pipeline_steps(read_json(path, "the processor"), path):
            name = (step.get("config") if isinstance(step.get("config"), dict) else {}).get("tokenizer_name")
            if step.get("registry_name") == "tokenizer_processor" and isinstance(name, str) and name:
                return name
    return PALIGEMMA_TOKENIZER


def tokenizer_name(policy_dir, pc, vlm_name):
    """(the checkpoint's tokenizer name, a line saying why). A --vlm path is searched alone."""
    pi0 = pc.get("type") == "pi0"
    name = pi0_tokenizer(policy_dir) if pi0 else vlm_name or pc.get("vlm_model_name", "")
    places = [name] if vlm_name and is_vlm_path(vlm_name) else smolvla.vlm_places(name, policy_dir)
    for place in [policy_dir] + places:
        path = os.path.join(place, "tokenizer.json")
        if os.path.isfile(path):
            if is_byte_identity(read_json(path, "the tokenizer")):
                return "bytes", f"bytes ({os.path.normpath(path)} maps every byte to its own id)"
            tid = vla_shard.tokenizer_json_id(path)
            return tid, f"{tid} (of {os.path.normpath(path)})"
    tid = ("vlm:" + os.path.basename(os.path.normpath(name)))[:63]
    if pi0:
        get = f", e.g. with `{hub_cache.download_command(name, 'model')}`" if hub_cache.is_hub_id(name) else ""
        return tid, (f"{tid}: no tokenizer.json of '{name}' (the pre-processor's) was found beside the policy or in "
                     f"the HF cache: shards must name this tokenizer (put its tokenizer.json there{get}, or pass "
                     "--tokenizer NAME, to record another)")
    return tid, (f"{tid}: no tokenizer.json of VLM '{name}' was found: shards must name this tokenizer (pass --vlm "
                 "DIR with its tokenizer.json, or --tokenizer NAME, to record another)")


def matching_preset(cfg):
    """The preset whose sizes these are (the dataset fixes n_cam, state_dim and action_dim), or None."""
    for name, p in vla.PRESETS.items():
        same = [f for f in vla.CONFIG_FIELDS if f not in ("n_cam", "state_dim", "action_dim", "max_text")]
        if all(getattr(p, f) == getattr(cfg, f) for f in same):
            return name
    return None


# ----------------------------------------------------------------------------
# writing: nothing the user has is replaced unless asked (--force), nothing is written into a run
# folder a trainer holds, and a failed write says what failed as what it is (vla/common.h's words)


def refuse_existing(path, force, what="it"):
    """An existing file or folder at path is replaced only with --force."""
    if os.path.lexists(path) and not force:
        fail(f"{path} exists: pass --force to replace {what}, or write elsewhere (-o)")


@contextlib.contextmanager
def run_folder_free(folder, force):
    """Holds folder/.lock while the caller writes into folder, where a trainer left one: a trainer
    holds it with an exclusive flock for its run's lifetime (vla/runs.h's run_folder_open), and a
    file written beside its checkpoints could replace one it is writing or be taken for its own.
    Refused, --force or not, while a trainer holds it, naming the holder from the lock file's first
    line. No .lock: nothing to hold (none is made: the folder is not a run's)."""
    lock = os.path.join(folder, ".lock")
    try:  # read-only and not through a link: the lock file is only looked at, never changed
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield
        return
    except OSError as e:
        what = "a symbolic link, not a trainer's lock file" if e.errno == errno.ELOOP else e.strerror
        fail(f"{lock}: {what}: cannot tell whether a trainer writes into {folder}: write elsewhere (-o)")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            fail(f"{lock} is not a regular file, not a trainer's lock file: write elsewhere (-o)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = safetensors_format.escaped(os.pread(fd, 255, 0).decode("utf-8", "replace").split("\n")[0])
            also = ": --force does not write into it" if force else ""
            fail(f"{folder} is the run folder of a trainer that is running ({holder or 'it has just started'}){also}: "
                 "wait for it to end, or write elsewhere (-o)")
        except OSError as e:
            fail(f"cannot lock {lock}: {e.strerror}: cannot tell whether a trainer writes into {folder}: write "
                 "elsewhere (-o)")
        yield
    finally:
        os.close(fd)  # (the lock goes with the descriptor)


def human_bytes(n):
    """vla/common.h's human_bytes: 428.00 KiB, 1.29 MiB."""
    x, unit = float(n), 0
    units = ["bytes", "KiB", "MiB", "GiB", "TiB"]
    while x >= 1024 and unit < 4:
        x, unit = x / 1024, unit + 1
    return f"{x:.0f} {units[unit]}" if unit == 0 else f"{x:.2f} {units[unit]}"


def write_failure(e, path, need, cleaned, left=None):
    """The one line of an OSError e from writing path (need: the bytes it takes; cleaned: what was
    removed, or None; left: what the user's files are now, or None), its fix as vla/common.h's
    write_failure_fix says it."""
    folder = os.path.dirname(os.path.abspath(path))
    err = e.errno
    if err == errno.EFBIG:
        fix = "the file is larger than the file size limit allows (ulimit -f, or the file system's largest file): " \
              "raise the limit"
    elif err in (errno.ENOSPC, errno.EDQUOT):
        try:
            vfs = os.statvfs(folder)
            fix = f"free space in {folder} ({human_bytes(vfs.f_bavail * vfs.f_frsize)} free there)"
        except OSError:
            fix = f"free space in {folder}"
    elif err == errno.EROFS:
        fix = f"{folder} is on a read-only file system: remount it read-write"
    elif err in (errno.EACCES, errno.EPERM):
        fix = f"this user may not write into {folder}: make it writable"
    else:
        fix = f"check the disk that holds {folder}"
    space = f": it needs {human_bytes(need)}" if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    doing = f"renaming {e.filename} to {e.filename2}" if e.filename2 is not None else f"writing {path}"
    removed = f"; {cleaned} was removed" if cleaned else ""
    left = f"; {left}" if left else ""
    return f"{doing} failed: {e.strerror or e}{space}{removed}{left}: {fix}, or write elsewhere (-o)"


# ----------------------------------------------------------------------------
# main


def parser():
    ap = argparse.ArgumentParser(description="a LeRobot SmolVLA or pi0 policy folder -> a train_vla checkpoint "
                                             "(version 2)")
    ap.add_argument("policy", help="the folder LeRobot's save_pretrained wrote, or a policy's hub id "
                                   "(lerobot/smolvla_base) found in the HF cache ($HF_HUB_CACHE, else $HF_HOME/hub: "
                                   "data/hub_cache.py; never downloaded)")
    ap.add_argument("-o", "--output", required=True, help="checkpoint file to write (a new one, unless --force)")
    ap.add_argument("--force", action="store_true",
                    help="replace -o if it exists (never in the run folder of a trainer that is running)")
    ap.add_argument("--vlm", metavar="DIR_OR_NAME",
                    help="the VLM (its config.json and tokenizer.json), instead of config.json's vlm_model_name: a "
                         "path (absolute, starting with ./ ../ or ~, or of more than one slash) is its folder as "
                         "given and must hold config.json; a name (a folder name, or an HF repo id owner/name) is "
                         "looked up as a folder here, next to the policy, then in the HF cache (as the policy's hub "
                         "id is)")
    ap.add_argument("--sizes", metavar="FILE",
                    help="pi0: the model's sizes, a JSON file in LeRobot's config keys: " + SIZES_FORMAT
                         + " (default: the released sizes of config.json's variants)")
    ap.add_argument("--train-mode", choices=vla.TRAIN_MODES,
                    help="the checkpoint's train mode (default: from train_expert_only / freeze_vision_encoder)")
    ap.add_argument("--max-text", type=int, help="instruction tokens (default: tokenizer_max_length)")
    ap.add_argument("--tokenizer", help="tokenizer name to record (default: from the VLM's tokenizer.json)")
    ap.add_argument("--seed", type=int, default=vla.DEFAULT_SEED, help="the checkpoint's seed (%(default)s)")
    return ap


def parse_args(argv):
    return parser().parse_args(argv)


def policy_folder(policy):
    """The folder of the policy argument: itself, or the HF cache's snapshot of a hub id."""
    try:
        return hub_cache.local_folder(policy, "model", "config.json")
    except hub_cache.NotFound as e:
        fail(f"{e}")


def run(args):
    policy_dir = policy_folder(args.policy)
    if policy_dir != args.policy:  # (the summary names both)
        args.hub_id, args.policy = args.policy, policy_dir
    pc = check_policy_config(policy_dir)
    if args.max_text is not None and not 1 <= args.max_text <= vla.MAX_TEXT:
        fail(f"--max-text {args.max_text}: pass 1 to {vla.MAX_TEXT}")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        fail(f"-o {args.output}: folder {out_dir} does not exist: create it first")
    if os.path.isdir(args.output):
        fail(f"-o {args.output} is a folder: pass a checkpoint file name")
    with run_folder_free(out_dir, args.force):
        refuse_existing(args.output, args.force)
        convert(args, pc)


def convert(args, pc):
    """run's work, with -o's folder held."""
    policy_dir = args.policy
    pi0 = pc["type"] == "pi0"
    if pi0 and args.vlm is not None:
        fail(f"--vlm {args.vlm}: a pi0 policy has no VLM folder to read (its sizes are its variants', or --sizes "
             "FILE's): leave --vlm out")
    if not pi0 and args.sizes is not None:
        fail(f"--sizes {args.sizes}: a SmolVLA policy's sizes are its VLM's config (--vlm): leave --sizes out")
    sizes = None if args.sizes is None else read_sizes(args.sizes)
    vlm = None if args.vlm is None else check_vlm_path(args.vlm)
    if not pi0:
        source = "config.json and its VLM config"
    elif sizes is not None:
        source = f"--sizes {args.sizes}"
    elif os.path.isfile(os.path.join(policy_dir, "..", "c_config.txt")):
        source = "the c_config.txt above the policy"
    else:
        source = f"the released sizes of {pc['paligemma_variant']} and {pc['action_expert_variant']} (no --sizes)"
    cfg, lc = policy_sizes(policy_dir, args.max_text, vlm, sizes, FAMILIES[pc["type"]], source)
    mode = vla.TRAIN_MODES.index(args.train_mode) if args.train_mode else vla.mode_of_policy(lc)
    params, dtypes, skipped = read_weights(policy_dir, cfg, source)
    stats, stat_notes = read_stats(policy_dir, cfg)
    legacy = [n for n in skipped if n.startswith(("normalize_inputs.", "normalize_targets.", "unnormalize_outputs."))]
    if legacy and any("no mean/std saved" in line for line in stat_notes):
        fail(f"{policy_dir}: the statistics are buffers of model.safetensors ({legacy[0]}, ...), as LeRobot before 0.4 "
             "saved them: convert the folder with LeRobot's lerobot/processor/migrate_policy_normalization.py first")
    if args.tokenizer:
        t = args.tokenizer
        if not 0 < len(t.encode()) < 64 or not t.isprintable() or not t.isascii():
            fail(f"--tokenizer {args.tokenizer!r}: pass 1 to 63 printable ASCII characters")
        tok, tok_line = args.tokenizer, f"{args.tokenizer} (--tokenizer)"
    else:
        tok, tok_line = tokenizer_name(policy_dir, pc, vlm)
        if not (tok.isascii() and tok.isprintable()):  # (vlm_model_name or --vlm, as it is)
            fail(f"the tokenizer's name '{safetensors_format.escaped(tok)}' (made from the VLM's name) is not printable "
                 "ASCII, as a checkpoint's must be: pass --tokenizer NAME")
    if not 0 <= args.seed < 2**63:
        fail(f"--seed {args.seed}: pass 0 to 2^63 - 1")

    n_trainable = vla.opt_domain(vla.param_table(cfg), mode)[2]
    refuse_existing(args.output, args.force)  # (again: it may have come while the weights were read)
    existed = os.path.lexists(args.output)
    try:
        size = vla.write_checkpoint(args.output, cfg, mode, stats, params, step=0, seed=args.seed, sampler_pos=0,
                                    tokenizer=tok)
    except OSError as e:  # (write_checkpoint removes its temporary file on any failure)
        need = vla.CKPT_HEADER_BYTES + 4 * stats.size + 4 * vla.param_count(cfg) + 8 * n_trainable
        left = f"{args.output} is as it was" if existed else None
        fail(write_failure(e, args.output, need, "the partial file", left))
    preset = matching_preset(cfg)
    named = f"{args.hub_id} (the HF cache's {policy_dir})" if getattr(args, "hub_id", None) else policy_dir
    say(f"import_lerobot: {named} ({FAMILIES[pc['type']]}, {'/'.join(dtypes)} weights) -> {args.output}")
    say("  config: " + ", ".join(f"{f} {v}" for f, v in zip(vla.CONFIG_FIELDS, cfg.values())))
    say("  sizes: " + (f"from {source}; " if pi0 else "") +
        (f"preset {preset}'s (train with -p {preset} --max-text {cfg.max_text})" if preset else
         "no preset's (the trainers build their model from -p)"))
    say(f"  train mode {vla.TRAIN_MODES[mode]} ({'--train-mode' if args.train_mode else 'from config.json'}); "
        f"step 0, sampler position 0, seed {args.seed}; AdamW moments zero ({n_trainable} elements)")
    say(f"  tokenizer: {tok_line}")
    for line in stat_notes:
        say(f"  statistics: {line}")
    n_names = sum(len(vla.lerobot_names(cfg, s)) for s in vla.param_table(cfg))
    say(f"  weights: {n_names} LeRobot tensors into the table's {len(params)} ({vla.param_count(cfg)} values)")
    heads = lm_head_shapes(cfg)
    for name in skipped:  # (a name from the file, escaped: it may hold a newline)
        say(f"  skipped: {safetensors_format.escaped(name)} (not in train_vla's table"
            + (": it feeds nothing)" if name in heads else ")"))
    say(f"wrote {args.output} ({size} bytes)")


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except UserError as e:
        error_exit(f"{e}")
    except MemoryError:
        error_exit(f"out of memory while importing {args.policy}: free memory, or import on a machine with more")
    except RecursionError:
        error_exit(f"{args.policy}: a JSON file of the policy nests too deeply to be LeRobot's: save the policy again "
                   "with LeRobot's save_pretrained")
    except OSError as e:
        error_exit(f"{e.filename or args.policy}: {e.strerror or e}: pass a readable LeRobot policy folder, and an "
                   "-o where this user may write")


def say(text):
    """One line of the summary: text from the files it names (a tokenizer or tensor name, a path)
    cannot split it."""
    print(safetensors_format.one_line(text))


def error_exit(msg):
    """The one `error:` line (escaped: text from a file cannot split it or forge another), exit 1."""
    print(f"error: {safetensors_format.one_line(msg)}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
