"""
test_lerobot_io.py: scripts/import_lerobot.py and scripts/export_lerobot.py against LeRobot 0.6.1
itself, on SmolVLA policies (--family smolvla, the default) or pi0 policies (--family pi0). Run by
`make test` under build/lerobot-venv (Python 3.12, lerobot, torch, safetensors), once per family,
in one process each (LeRobot's import is most of the time):

    build/lerobot-venv/bin/python tests/lerobot/test_lerobot_io.py [--family smolvla]
    build/lerobot-venv/bin/python tests/lerobot/test_lerobot_io.py --family pi0
        # both need train_vla_cpu, libvla.so, data/synthetic; SmolVLA's build/lerobot_ref too

SmolVLA. Fixtures, made here with dev/lerobot/make_ref.py's machinery: a tiny SmolVLM folder at
the tiny preset's sizes whose tokenizer gives every byte its own id (so LeRobot's token ids are the
ones the shards and the policy library use), and LeRobot's own SmolVLAPolicy on it (random seeded
weights, norms jittered; two cameras of 24x32 and 20x20, state 3, action 2, LeRobot's default
train flags), saved with save_pretrained and its processors, once in fp32 and once in bf16.
Checks:
  - import: every weight equal to LeRobot's tensor by tensor (fp32 exactly; bf16 widened
    exactly), the header (config, train mode, step 0, seed, tokenizer, zero moments), the
    processors' statistics, lm_head named as skipped; the file loads in the policy library
  - LeRobot -> train_vla -> LeRobot: the exported folder loads with from_pretrained(strict=True)
    and its processors; its actions equal the original policy's and train_vla's (libvla.so) on
    the same raw observation and noise, VLAPolicy's on LeRobot's float frames (uint8 / 255) its
    own on the uint8 frames; LeRobot's own reference policy (build/lerobot_ref/all:
    BPE tokenizer, three cameras) round-trips to its recorded chunk, its tokenizer.json named
  - train_vla fine-tuned -> LeRobot: ./train_vla_cpu --init <import> trains a few steps on a
    synthetic shard of the policy's shapes; the export acts as libvla.so does on that checkpoint;
    dev/model.py's checkpoint writer reproduces the trainer's file byte for byte
  - a tokenizer.json's ids (a byte-level BPE VLM folder): LeRobot's own pre-processor's
    observation.language.tokens and attention_mask for tasks short, cut at 48 tokens, unicode,
    already ending in "\n", are the first columns of the batch a shard written with
    vla_shard.TokenizerJSON gives (dev/model.py's build_batch, vla/dataset.h's dataset_assemble), pads
    and zero mask after; a GPT2Tokenizer-class folder (transformers 5 rebuilds its pre-tokenizer)
    gives the same ids. A LeRobot policy on that BPE VLM: imported, VLAPolicy(tokenizer=...) acts
    as LeRobot on the same observation and noise; fine-tuned on a shard of its tokenizer, exported,
    LeRobot acts as VLAPolicy; refusals (no tokenizer, another's tokenizer.json, bytes shards)
  - bad input (not a SmolVLA folder, no config.json, a missing tensor, a shape mismatch; a --vlm
    path that is not a VLM folder, which the lookup by base name must not replace with the
    fixture's folder of that name): one `error:` line naming the problem, exit status 1, no file
    written, while --vlm names (a folder name, owner/name) still find that folder next to the
    policy and give the checkpoint of config.json's vlm_model_name byte for byte; exports
    LeRobot could not run as the checkpoint does (a VLM of other sizes or another tokenizer, no
    --vlm, wrong camera count, a non-empty output folder) refused the same way
  - safetensors files that are not the format's (two tensors over the same bytes, a name given
    twice, bytes no tensor holds, a header nested 100,000 deep, a tensor name holding a newline
    and an escape code): one line, the name escaped; a valid file with such a name imports, named
    on one line. Every option a refusal of either script names is one it has (a truncated
    checkpoint's export does not say --init)
  - writes: an existing checkpoint or non-empty folder is replaced only with --force (export's
    files alone, the folder's others kept), never in a folder whose .lock a running trainer holds
    (named from its first line, escaped); a file size limit (a child under RLIMIT_FSIZE), a full
    disk (a 256 KiB tmpfs, or an open() that fails with ENOSPC where none mounts) and no memory
    are one line each, with the existing file unchanged and no temporary file left

pi0. Fixtures, made here: LeRobot's own PI0Policy at pi0_tiny's sizes (dev/lerobot/make_ref.py's
tiny_pi0_sizes: PI0Config has no size settings, so the names its model is built from are swapped at
run time), random seeded weights with the norms jittered, LeRobot's default train flags (everything
trains), two cameras of 36x60 and 96x80, state 6, action 5; saved with save_pretrained and its
processors, once in fp32 and once as LeRobot's dtype "bfloat16" keeps it (bf16 but the vision
tower, the projector and the norms). pi0's pre-processor loads google/paligemma-3b-pt-224's
tokenizer by name: a private HF cache holds, under that name, a tokenizer that gives every byte its
own id (the shards' "bytes"), so nothing is fetched and LeRobot's ids are train_vla's. The sizes
file the tools take (--sizes) is make_ref.py's pi0 sizes in LeRobot's own keys.
Checks:
  - import: every weight equal to LeRobot's tensor by tensor (fp32 exactly, bf16 widened exactly),
    the header (pi0_tiny's config with the policy's cameras and dims, family 1, train mode all
    from the flags, step 0, tokenizer bytes, zero moments), the processors' statistics, both
    lm_heads named as skipped; the released sizes (no --sizes) and a c_config.txt beside the policy
    (dev/smolvla.py's older way) agree with --sizes
  - LeRobot -> train_vla -> LeRobot: config.json and the processors as LeRobot saves them; the
    export loads with from_pretrained at those sizes and its state dict equals the original's
    tensor by tensor (from_pretrained returns random weights after a loading error, with only a
    printed warning: the weights are what is compared), PaliGemma's lm_head the embedding, the
    expert's zeros; LeRobot's actions (predict_action_chunk, same observation and noise) equal
    before and after; train_vla's (libvla.so) equal LeRobot's within fp32 rounding
  - fine-tuning on 4 simulated ranks with ZeRO-1 (./train_vla_cpu -g 4 -b 1 -z 1) against one rank
    of batch 4, from the import, 3 steps: ZeRO-1 changes no bit against -z 0; the weights and their
    change agree within fp32 summation order (the vision tower's key biases aside: their gradient is
    zero in exact arithmetic, so AdamW moves them by rounding noise, held below lr / 10); the 4-rank
    checkpoint exported loads in LeRobot with its weights, and LeRobot acts as libvla.so
  - bad input (not a pi0 or SmolVLA folder, a missing tensor, a wrong shape, --sizes missing a
    key, of a wrong type, disagreeing with a tensor, or left out; exports without --sizes or with
    other sizes): one `error:` line naming the problem, exit status 1, nothing written
Exits non-zero on any failure; the last line is `N passed, M failed`.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may be fetched
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")  # the tools under test
for sub in ("scripts", "dev", "data", "dev/lerobot"):
    sys.path.insert(0, os.path.join(ROOT, sub))
import export_lerobot  # noqa: E402
import import_lerobot  # noqa: E402
import make_ref  # noqa: E402  dev/lerobot: the tiny SmolVLM folder, LeRobot's policies at test sizes
import model as vla  # noqa: E402  dev/model.py: the table, LeRobot names, checkpoints
import smolvla  # noqa: E402  dev/smolvla.py: pi0's lm_heads' names
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402
from vla_policy import VLAPolicy  # noqa: E402

check = Checks()
SEED = 2024
CAMERAS = {"top": (24, 32), "wrist": (20, 20)}  # (h, w) as the shard stores them
STATE_DIM, ACTION_DIM, BATCH = 3, 2, 3
TINY = vla.PRESETS["tiny"]
# the tiny preset's sizes as a SmolVLM config and LeRobot policy (vocabulary: the 256 byte ids)
VISION = dict(image_size=TINY.img, patch_size=TINY.patch, hidden_size=TINY.vis_width,
              num_hidden_layers=TINY.vis_layers, num_attention_heads=TINY.vis_heads, intermediate_size=TINY.vis_ff,
              layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh")
TEXT = dict(hidden_size=TINY.d_model, num_attention_heads=TINY.n_head, num_key_value_heads=TINY.n_kv_head,
            head_dim=TINY.head_dim, intermediate_size=TINY.d_ff, num_hidden_layers=TINY.n_layer, rms_norm_eps=1e-5,
            rope_theta=100000.0, max_position_embeddings=512, hidden_act="silu")
POLICY = dict(chunk_size=TINY.chunk, n_action_steps=TINY.chunk, max_state_dim=TINY.max_state_dim,
              max_action_dim=TINY.max_action_dim, resize_imgs_with_padding=(TINY.img, TINY.img), num_steps=10,
              num_vlm_layers=TINY.n_layer, tokenizer_max_length=TINY.max_text,
              expert_width_multiplier=TINY.d_expert / TINY.d_model)
# one shorter than max_text (16, the tiny and pi0_tiny presets'), one cut by it, one that spells a
# digit and punctuation
TASKS = ["pick it up", "open the top drawer and put the spoon inside", "stack 3 blocks!"]
# the BPE policy's tasks (max_text 16): one cut by max_text, one beyond ASCII
BPE_TASKS = ["pick it up", "open the top drawer and put the small spoon inside it, then close it", "stack blocks ✓ über"]
# LeRobot's tokenizer call at its default 48 tokens: short, cut at 48, unicode, already ending in
# "\n" (LeRobot adds none then), digits, a single letter
TOKEN_TASKS = ["pick up the red cube", " ".join(["open the top drawer"] * 14), "stack 3 blocks! ✓ über 日本",
               "put 12 cups away\n", "x"]
# train_vla's fp32 sampling against LeRobot's fp32 sampling: 10 Euler steps through the whole
# model, summed in other orders; the parity suites measure below 1e-6 on these sizes, test_vla
# 1.0e-7 on pi0_tiny's chunk (test_vla's chunk check uses 1e-5, as here)
ACTION_TOL = 1e-5

# pi0 (--family pi0)
PI0_SEED = 4321
PI0_CAMERAS = make_ref.PI0_CAMERAS  # (h, w) as the shard stores them; LeRobot pads them centred to 32x32
PI0_STATE_DIM, PI0_ACTION_DIM = make_ref.STATE_DIM, make_ref.ACTION_DIM
PI0_PRESET = vla.PRESETS["pi0_tiny"]
PI0_SIZES = {"vlm": make_ref.PI0_GEMMA["gemma_2b"], "expert": make_ref.PI0_GEMMA["gemma_300m"],
             "vision": make_ref.PI0_VISION, "vocab_size": make_ref.PI0_VOCAB}
PI0_TOKENIZER = import_lerobot.PALIGEMMA_TOKENIZER
PI0_MODULES = smolvla.MODULES["pi0"]
PI0_VLM_HEAD, PI0_EXPERT_HEAD = PI0_MODULES.vlm_lm_head + "weight", PI0_MODULES.expert_lm_head + "weight"
PI0_EMBED = PI0_MODULES.text + "embed_tokens.weight"
# -g 4 -b 1 -z 1 against -g 1 -b 4: the same samples and noise, the gradient summed per rank then
# across ranks: fp32 rounding of the weights (1e-6; measured 3e-8), and of their change over the
# 3 steps, which AdamW's division by sqrt(v) makes relative to each gradient's size (1e-5, test_vla's
# world-size tolerance; measured 2e-6). Aside: the vision tower's key biases, whose gradient is zero
# in exact arithmetic (q . b_k shifts a query's every score alike, which the softmax ignores): theirs
# is rounding noise, far below AdamW's eps (1e-8), so they move by about lr |g| / eps, a noise of
# the ranks' summation order; they are held to moving less than lr / 10.
PI0_RANKS_TOL_WEIGHTS, PI0_RANKS_TOL_CHANGE, PI0_LR = 1e-6, 1e-5, 1e-3
PI0_NOISE_ONLY = ("vis_bk",)


# ----------------------------------------------------------------------------
# fixtures (the helpers of this part serve pi0's checks too)


def build_byte_tokenizer(out_dir):
    """A byte-level BPE without merges whose byte b has id b, pad = byte 0 (the tiny preset's pad
    id), and SmolVLM's special tokens after the 256 bytes (LeRobot reads their ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = import_lerobot.byte_level_chars()
    bpe = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    sp = make_ref.SMOLVLA_SPECIAL_TOKENS
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token=sp["unk"], bos_token=sp["bos"],
                                  eos_token=sp["end_of_utterance_token"], pad_token=chars[0],
                                  extra_special_tokens={k: v for k, v in sp.items() if k.endswith("_token")})
    tok.save_pretrained(out_dir)


def make_stats(g, state_dim=STATE_DIM, action_dim=ACTION_DIM, cameras=CAMERAS):
    """A dataset's statistics as LeRobot's processors take them (the pi0 suites' too); stds above 0.3,
    where std + 1e-8 rounds to std in fp32."""
    mean_s, std_s = torch.randn(state_dim, generator=g), torch.rand(state_dim, generator=g) + 0.3
    mean_a, std_a = torch.randn(action_dim, generator=g), torch.rand(action_dim, generator=g) + 0.3
    stats = {"observation.state": {"mean": mean_s.numpy(), "std": std_s.numpy()},
             "action": {"mean": mean_a.numpy(), "std": std_a.numpy()}}
    for cam in cameras:  # datasets ship image stats too; SmolVLA and pi0 leave images un-normalized
        stats[make_ref.cam_key(cam)] = {"mean": np.full((3, 1, 1), 0.5, np.float32),
                                        "std": np.full((3, 1, 1), 0.25, np.float32)}
    return stats


def save_policy(policy, cfg, stats, folder):
    from lerobot.policies.factory import make_pre_post_processors

    folder.mkdir(parents=True)
    policy.save_pretrained(folder)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    pre.save_pretrained(folder)
    post.save_pretrained(folder)


def build_fixtures(tmp):
    """The byte-tokenizer SmolVLM folder and the policy saved in fp32 and bf16: (vlm, fp32 dir,
    bf16 dir, the policy's fp32 state dict, its bf16 state dict)."""
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    vlm = tmp / "vlm_bytes"
    with contextlib.redirect_stdout(io.StringIO()):
        make_ref.smolvla_build_vlm_folder(vlm, VISION, TEXT, TINY.scale_factor, build_byte_tokenizer,
                                          vocab_size=TINY.vocab)
        cfg = make_ref.smolvla_policy_config(vlm, True, True, cameras=CAMERAS, state_dim=STATE_DIM,
                                             action_dim=ACTION_DIM, policy=POLICY)
        torch.manual_seed(SEED)
        policy = SmolVLAPolicy(cfg)
    make_ref.perturb_constant_params(policy, SEED + 3)
    stats = make_stats(torch.Generator().manual_seed(SEED + 1))
    save_policy(policy, cfg, stats, tmp / "fp32")
    state32 = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    policy.to(torch.bfloat16)
    save_policy(policy, cfg, stats, tmp / "bf16")
    state16 = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    return vlm, tmp / "fp32", tmp / "bf16", state32, state16, stats


def make_observation(g):
    """A raw batch: uint8 frames per camera, raw state, task strings, and the starting noise."""
    frames = {cam: torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)
              for cam, (h, w) in CAMERAS.items()}
    state = torch.randn(BATCH, STATE_DIM, generator=g) * 2
    noise = torch.randn(BATCH, TINY.chunk, TINY.max_action_dim, generator=g)
    return frames, state, noise


# ----------------------------------------------------------------------------
# running the scripts and the policies


def run_script(module, argv):
    """A script's main() in this process: (exit status, stdout + stderr)."""
    out = io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            module.main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue()


def lerobot_actions(policy_dir, frames, state, tasks, noise):
    """LeRobot's own path: from_pretrained (strict), its saved pre-processor, predict_action_chunk
    from the given noise, its post-processor. Returns (actions (B, H, A) float64, the policy)."""
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    with contextlib.redirect_stdout(io.StringIO()):
        policy = SmolVLAPolicy.from_pretrained(str(policy_dir), strict=True)
        pre, post = make_pre_post_processors(policy.config, pretrained_path=str(policy_dir))
    batch = {make_ref.cam_key(c): make_ref.images_as_fed(f) for c, f in frames.items()}
    batch["observation.state"] = state.clone()
    batch["task"] = list(tasks)
    with torch.no_grad():
        chunk = policy.predict_action_chunk(pre(batch), noise=noise.clone())
    return post(chunk).to(torch.float64).numpy(), policy


def vla_actions(ckpt, frames, state, tasks, noise):
    """train_vla's own path: libvla.so on the raw observation (LeRobot appends "\\n" to a task)."""
    policy = VLAPolicy(str(ckpt), threads=1)
    images = [np.ascontiguousarray(f.numpy()) for f in frames.values()]
    out = policy.act(images, [t + "\n" for t in tasks], state.numpy(), noise=noise.numpy())
    policy.close()
    return out.astype(np.float64)


def errors(got, want):
    """(max absolute error, max relative error = max |got - want| / max |want|)."""
    diff = float(np.abs(got - want).max())
    return diff, diff / max(float(np.abs(want).max()), 1e-30)


def same_tensors(ck, state, skip=(vla.LM_HEAD,)):
    """Names of LeRobot tensors whose value differs from the checkpoint's (after widening to fp32)."""
    params = {n: torch.from_numpy(x) for n, x in ck["params"].items()}
    ours = vla.to_lerobot(ck["config"], params)
    theirs = {k: v for k, v in state.items() if k not in skip}
    bad = sorted(set(ours) ^ set(theirs))
    bad += [k for k in ours if k in theirs and not torch.equal(ours[k], theirs[k].to(torch.float32))]
    return bad


def safetensors_dtypes(path):
    """The dtype names (F32, BF16, ...) a safetensors file stores."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}


# ----------------------------------------------------------------------------
# the checks


def check_import(policy_dir, ckpt, state, stats, dtype):
    rc, out = run_script(import_lerobot, [str(policy_dir), "-o", str(ckpt)])
    check(rc == 0 and ckpt.exists(), f"import of the {dtype} policy succeeds" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return None
    print("    | " + out.rstrip().replace("\n", "\n    | "))
    ck = vla.read_checkpoint(str(ckpt))
    want_cfg = vla.SmolVLAConfig(**{**vars(TINY), "n_cam": len(CAMERAS), "state_dim": STATE_DIM,
                                    "action_dim": ACTION_DIM})
    check(ck["config"] == want_cfg, f"{dtype}: the config is the tiny preset's with the policy's 2 cameras, S 3, A 2")
    n_trainable = vla.opt_domain(vla.param_table(ck["config"]), 0)[2]
    zero = all(not x.any() for x in list(ck["m"].values()) + list(ck["v"].values()))
    check((ck["train_mode"], ck["step"], ck["seed"], ck["sampler_pos"], ck["tokenizer"]) == (0, 0, 1337, 0, "bytes")
          and zero and sum(x.size for x in ck["m"].values()) == n_trainable,
          f"{dtype}: header: train mode expert (LeRobot's default flags), step 0, seed 1337, sampler 0, tokenizer "
          f"bytes, zero moments for the {n_trainable} trainable elements")
    want = np.concatenate([stats["observation.state"]["mean"], stats["observation.state"]["std"],
                           stats["action"]["mean"], stats["action"]["std"]]).astype(np.float32)
    check(np.array_equal(ck["stats"], want), f"{dtype}: the processors' state and action mean/std")
    bad = same_tensors(ck, state)
    check(not bad, f"{dtype}: all {len(state) - 1} LeRobot tensors but lm_head equal the checkpoint's exactly"
          + (f" (differ: {bad[:4]})" if bad else ""))
    check(f"skipped: {vla.LM_HEAD}" in out, f"{dtype}: lm_head is named as skipped")
    return ck


def check_errors(tmp, good):
    """Bad folders: one `error:` line naming the problem, exit 1, nothing written."""
    from safetensors.torch import load_file, save_file

    cases = []
    notsmol = tmp / "bad_type"
    notsmol.mkdir()
    pc = json.loads((good / "config.json").read_text())
    (notsmol / "config.json").write_text(json.dumps({**pc, "type": "act"}))
    shutil.copy(good / "model.safetensors", notsmol)
    cases.append(("a LeRobot folder of another policy type", notsmol, "'act', not 'smolvla'"))
    empty = tmp / "bad_empty"
    empty.mkdir()
    cases.append(("a folder without config.json", empty, "has no config.json"))
    weights = load_file(str(good / "model.safetensors"))
    for label, name, edit in (("a missing tensor", "model.action_out_proj.bias", None),
                              ("a shape mismatch", "model.state_proj.weight", torch.zeros(TINY.d_model, 31))):
        folder = tmp / ("bad_" + label.split()[-1])
        shutil.copytree(good, folder)
        changed = dict(weights)
        if edit is None:
            del changed[name]
        else:
            changed[name] = edit
        save_file(changed, str(folder / "model.safetensors"))
        cases.append((label, folder, name + (" has shape [48, 31]" if edit is not None else "")))
    # safetensors headers that are not what the format says: one line each, not a traceback
    def rewrite_header(name, file_glob, edit):
        folder = tmp / ("bad_header_" + name)
        shutil.copytree(good, folder)
        path = sorted(folder.glob(file_glob))[0]
        raw = path.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        head = json.dumps(edit(json.loads(raw[8:8 + n]))).encode()
        path.write_bytes(struct.pack("<Q", len(head)) + head + raw[8 + n:])
        return folder

    def first_tensor(h):
        return next(k for k in h if k != "__metadata__")

    def drop_offsets(h):
        del h[first_tensor(h)]["data_offsets"]
        return h

    def bad_offsets(h):
        h[first_tensor(h)]["data_offsets"] = [0, "12"]
        return h

    def huge_shape(h):
        h[first_tensor(h)]["shape"] = [2**40, 2**40]
        return h

    cases.append(("a safetensors header that is a JSON list",
                  rewrite_header("list", "model.safetensors", lambda h: [h]),
                  "model.safetensors: the header is a JSON list, not an object of tensors: the file is corrupt"))
    cases.append(("a tensor without data_offsets", rewrite_header("nooffsets", "model.safetensors", drop_offsets),
                  "lacks dtype, shape or data_offsets: the file is corrupt"))
    cases.append(("data_offsets [0, \"12\"]", rewrite_header("offsets", "model.safetensors", bad_offsets),
                  'has data_offsets [0, "12"], not two whole numbers: the file is corrupt'))
    # the normalizer's statistics are read whole, whatever their shape: the size it needs is said exactly
    cases.append(("a statistics tensor of shape [2^40, 2^40]",
                  rewrite_header("huge", "policy_preprocessor*normalizer*.safetensors", huge_shape),
                  f"shape [1099511627776, 1099511627776] needs {2**80 * 4} bytes"))
    procs = []
    for label, folder, needle in cases:
        out = tmp / (folder.name + ".bin")
        procs.append((label, needle, out, subprocess.Popen(
            [sys.executable, os.path.join(SCRIPTS, "import_lerobot.py"), str(folder), "-o", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for label, needle, out, p in procs:
        text = p.communicate()[0]
        lines = text.splitlines()
        ok = p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
        written = out.exists() or any(out.parent.glob(out.name + ".*tmp"))  # (the writer's NAME.PID.tmp)
        check(ok and not written, f"{label}: exit {p.returncode}, {len(lines)} line(s), nothing written: "
              f"{text.strip()[:300]}")


def check_vlm_argument(tmp, good, vlm, ckpt):
    """--vlm: a name (a folder name, an HF repo id owner/name) is looked up as vlm_model_name is and
    finds the fixture's VLM next to the policy; a path is the folder as given, and a path that is not
    a VLM folder is one `error:` line naming it, exit 1, nothing written, even where a folder of its
    base name sits next to the policy. ckpt: the import that read config.json's vlm_model_name."""
    for label, name in (("a folder name", vlm.name), ("an HF repo id", "someone/" + vlm.name),
                        ("its absolute path", str(vlm))):
        out = tmp / "vlm_named.bin"
        rc, text = run_script(import_lerobot, [str(good), "-o", str(out), "--vlm", name])
        same = rc == 0 and out.read_bytes() == ckpt.read_bytes()
        check(same, f"--vlm {name} ({label}): found, the checkpoint of vlm_model_name byte for byte"
              + ("" if rc == 0 else f": {text.strip()[:300]}"))
        if out.exists():
            out.unlink()
    no_config = tmp / "elsewhere" / vlm.name
    no_config.mkdir(parents=True)
    a_file = tmp / "elsewhere" / "vlm_file"
    a_file.write_text("x")
    for label, path, needle in (
            ("an absolute path that does not exist", f"/nonexistent/{vlm.name}", "no such folder"),
            ("a ./ path that does not exist", f"./nonexistent/{vlm.name}", "no such folder"),
            ("a path of two slashes that does not exist", f"nowhere/deep/{vlm.name}", "no such folder"),
            ("a folder without config.json", str(no_config), "the folder has no config.json"),
            ("a file", str(a_file), "is a file, not a folder")):
        out = tmp / "vlm_refused.bin"
        rc, text = run_script(import_lerobot, [str(good), "-o", str(out), "--vlm", path])
        lines = text.splitlines()
        ok = rc == 1 and len(lines) == 1 and lines[0].startswith(f"error: --vlm {path}") and needle in lines[0] \
            and "pass the VLM's folder" in lines[0]
        check(ok and not out.exists() and not any(out.parent.glob(out.name + ".*tmp")),
              f"import with --vlm {label}: exit {rc}, {len(lines)} line(s), nothing written: {text.strip()[:300]}")


def check_export_errors(tmp, ckpt, vlm):
    """Exports LeRobot could not run as the checkpoint does: one `error:` line, exit 1, no folder."""
    bpe = tmp / "vlm_bpe"  # the tiny sizes, but a BPE tokenizer: other token ids than the checkpoint's bytes
    with contextlib.redirect_stdout(io.StringIO()):
        make_ref.smolvla_build_vlm_folder(bpe, VISION, TEXT, TINY.scale_factor, make_ref.smolvla_build_tokenizer,
                                          vocab_size=TINY.vocab)
    vc = json.loads((bpe / "config.json").read_text())
    vc["text_config"]["pad_token_id"] = TINY.pad_token  # every size the checkpoint's: only the tokenizer differs
    (bpe / "config.json").write_text(json.dumps(vc))
    wide = dict(TEXT, hidden_size=64)
    other = tmp / "vlm_wide"
    with contextlib.redirect_stdout(io.StringIO()):
        make_ref.smolvla_build_vlm_folder(other, VISION, wide, TINY.scale_factor, build_byte_tokenizer,
                                          vocab_size=TINY.vocab)
    taken = tmp / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("x")
    for label, argv, needle in (
            ("a VLM whose tokenizer makes other ids", ["--vlm", str(bpe)], "the checkpoint was trained on bytes"),
            ("a VLM of other sizes", ["--vlm", str(other)], "text hidden_size 64, the checkpoint's d_model is 48"),
            ("no --vlm for sizes other than smolvla_base's", [], "pass --vlm DIR"),
            ("a --vlm path that does not exist (a folder of its base name is beside the checkpoint)",
             ["--vlm", f"/nonexistent/{vlm.name}"], "no such folder"),
            ("a camera list of the wrong length", ["--vlm", str(vlm), "--cameras", "top"], "reads 2 camera(s)")):
        out = tmp / "export_refused"
        rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out)] + argv)
        lines = text.splitlines()
        ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
        check(ok and not out.exists() and not leftovers(tmp, out.name),
              f"export with {label}: exit {rc}, {len(lines)} line(s), no folder: {text.strip()[:300]}")
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(taken), "--vlm", str(vlm)])
    check(refused(rc, text, "exists and is not empty: pass --force") and os.listdir(taken) == ["keep.txt"],
          f"export into a non-empty folder: refused, the folder untouched: {text.strip()[:200]}")


def check_reference(tmp):
    """LeRobot's own reference policy (dev/lerobot/make_ref.py) through import and export: its
    recorded chunk, from its recorded batch and noise."""
    from safetensors.torch import load_file

    case = Path(ROOT) / "build" / "lerobot_ref" / "all"
    if not (case / "ref.safetensors").exists():
        check(False, f"{case} is missing: make build/lerobot_ref/all/ref.safetensors first")
        return
    info = json.loads((case / "case.json").read_text())
    ref = load_file(str(case / "ref.safetensors"))
    vlm = case.parent / make_ref.SMOLVLA_VLM_FOLDER
    ckpt, out = tmp / "ref_all.bin", tmp / "ref_all_policy"
    rc, text = run_script(import_lerobot, [str(case / "policy"), "-o", str(ckpt), "--vlm", str(vlm)])
    check(rc == 0, "import of build/lerobot_ref/all/policy (BPE tokenizer, 3 cameras, train mode all)"
          + ("" if rc == 0 else f": {text}"))
    if rc != 0:
        return
    ck = vla.read_checkpoint(str(ckpt))
    tid = vla_shard.tokenizer_json_id(str(vlm / "tokenizer.json"))
    check(ck["tokenizer"] == tid and ck["config"].pad_token == info["pad_token_id"] and ck["train_mode"] == 2,
          f"it records tokenizer {ck['tokenizer']} (its tokenizer.json), pad id {ck['config'].pad_token}, mode all")
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out), "--vlm", str(vlm), "--cameras",
                                           ",".join(info["camera_order"]), "--device", "cpu"])
    check(rc == 0, "its export" + ("" if rc == 0 else f": {text}"))
    if rc != 0:
        return
    frames = {c: ref[f"images_u8.{c}"] for c in info["camera_order"]}
    got, _ = lerobot_actions(out, frames, ref["observation.state"], info["tasks"], ref["sample_noise"])
    want = ref["chunk"].to(torch.float64).numpy()
    check(np.array_equal(got, want), f"the round-tripped reference policy samples LeRobot's recorded chunk exactly "
          f"(max abs err {errors(got, want)[0]:.3g})")


def one_line_error(fn, *needles):
    """(fn raised ValueError with one line holding every needle, the message)."""
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        return "\n" not in msg and all(n in msg for n in needles), msg
    return False, "accepted"


# ----------------------------------------------------------------------------
# what the scripts write, and the safetensors files they refuse


def refused(rc, text, *needles):
    """A refusal: exit 1, one `error:` line holding every needle."""
    lines = text.splitlines()
    return rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and all(n in lines[0] for n in needles)


def leftovers(folder, name=None):
    """Temporary files or folders a write left in folder: NAME.PID.tmp (of name, or any), NAME.PID.N.tmp,
    .export_lerobot.PID.tmp."""
    import re
    pattern = (re.escape(name) if name else ".+") + r"\.[0-9]+(\.[0-9]+)?\.tmp"
    return sorted(n for n in os.listdir(folder) if re.fullmatch(pattern, n) or n.startswith(".export_lerobot"))


def folder_bytes(folder):
    """name -> bytes of each file of a folder."""
    return {n: (Path(folder) / n).read_bytes() for n in sorted(os.listdir(folder)) if (Path(folder) / n).is_file()}


@contextlib.contextmanager
def trainer_holds(folder, line):
    """folder/.lock held as a running trainer holds it (vla/runs.h: an exclusive flock, its first line
    naming the trainer). A lock of another open file, so this process's own import meets it."""
    import fcntl
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, line.encode())
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def patched(module, name, value):
    """module.name = value for the block (a module global shadows a builtin such as open)."""
    had, old = hasattr(module, name), getattr(module, name, None)
    setattr(module, name, value)
    try:
        yield
    finally:
        if had:
            setattr(module, name, old)
        else:
            delattr(module, name)


def full_disk_open(path, mode="r", *args, **kwargs):
    """open() whose files for writing fail as a full disk does, at the first write."""
    import errno

    class Full(io.FileIO):
        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if "w" not in mode:
        return open(path, mode, *args, **kwargs)
    return io.TextIOWrapper(io.BufferedWriter(Full(path, "w"))) if "b" not in mode else Full(path, "w")


def limited_run(script, argv, fsize):
    """A script in a child process under a file size limit (RLIMIT_FSIZE) with SIGXFSZ ignored, so
    that a write past it fails with EFBIG: a Popen whose output is read with communicate()."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.Popen([sys.executable, os.path.join(SCRIPTS, script)] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=limit)


def rewrite_safetensors(src, dst, edit):
    """dst: src's safetensors file with its header text passed through edit(text, data) -> (text, data)."""
    raw = Path(src).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    text, data = edit(raw[8:8 + n].decode().rstrip(" "), raw[8 + n:])
    head = text.encode()
    Path(dst).write_bytes(struct.pack("<Q", len(head)) + head + data)


def check_safetensors_refusals(tmp, good):
    """model.safetensors files that are not what the format requires (two tensors over the same bytes,
    a name given twice, bytes no tensor holds, a header nested 100,000 deep, a tensor name with a
    newline and escape codes): one line, exit 1, no file; a valid file with such a name imports, the
    name escaped in the one line that names it."""
    raw = (good / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    by_shape = {}
    for name in sorted(tensors, key=lambda k: tensors[k]["data_offsets"]):
        by_shape.setdefault((tensors[name]["dtype"], tuple(tensors[name]["shape"])), []).append(name)
    first, second = next(names for names in by_shape.values() if len(names) > 1)[:2]
    evil = "evil\nerror: forged line\x1b[2J"

    def overlap(text, data):  # the later tensor over the earlier one's bytes
        h = json.loads(text)
        h[second]["data_offsets"] = h[first]["data_offsets"]
        return json.dumps(h), data

    def twice(text, data):  # the first tensor named again, over the second's bytes
        entry = json.dumps({**tensors[first], "data_offsets": tensors[second]["data_offsets"]})
        return text[:-1] + f", {json.dumps(first)}: {entry}}}", data

    def trailing(text, data):
        return text, data + b"\0" * 4

    def nested(text, data):
        return text[:-1] + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}", data

    def evil_dtype(text, data):
        h = json.loads(text)
        h[evil] = {"dtype": "F7", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
        return json.dumps(h), data + b"\0" * 4

    def evil_tensor(text, data):  # a valid extra tensor: imported, named as skipped
        h = json.loads(text)
        h[evil] = {"dtype": "F32", "shape": [1], "data_offsets": [len(data), len(data) + 4]}
        return json.dumps(h), data + b"\0" * 4

    escaped_evil = "evil\\nerror: forged line\\x1b[2J"
    for label, edit, needles in (
            ("two tensors over the same bytes", overlap, ["overlaps tensor", "two tensors over the same bytes"]),
            ("a tensor named twice", twice, [f'"{first}" stands twice']),
            ("4 bytes after the last tensor", trailing, ["the last 4 bytes of the data section belong to no tensor"]),
            ("a header nested 100,000 deep", nested, ["the header nests its JSON too deeply"]),
            ("a tensor name holding a newline and an escape code", evil_dtype, [f"tensor {escaped_evil} has dtype"])):
        folder = tmp / ("bad_st_" + edit.__name__)
        shutil.copytree(good, folder)
        rewrite_safetensors(good / "model.safetensors", folder / "model.safetensors", edit)
        out = tmp / (folder.name + ".bin")
        rc, text = run_script(import_lerobot, [str(folder), "-o", str(out)])
        check(refused(rc, text, "model.safetensors: ", *needles, "the file is corrupt") and not out.exists()
              and not leftovers(tmp, out.name),
              f"import of {label}: one line, exit {rc}, nothing written: {text.strip()[:300]!r}")
    folder = tmp / "st_evil_name"
    shutil.copytree(good, folder)
    rewrite_safetensors(good / "model.safetensors", folder / "model.safetensors", evil_tensor)
    out = tmp / "st_evil_name.bin"
    rc, text = run_script(import_lerobot, [str(folder), "-o", str(out)])
    lines = [ln for ln in text.splitlines() if "skipped: evil" in ln]
    check(rc == 0 and out.exists() and lines == [f"  skipped: {escaped_evil} (not in train_vla's table)"]
          and not any(ln.startswith("error") for ln in text.splitlines()),
          f"a valid file with a tensor named {evil!r}: imported, the name escaped on one line: {lines}")
    deep = tmp / "bad_config_nested"
    shutil.copytree(good, deep)
    (deep / "policy_preprocessor.json").write_text("[" * 100000 + "]" * 100000)
    rc, text = run_script(import_lerobot, [str(deep), "-o", str(tmp / "deep.bin")])
    check(refused(rc, text, "policy_preprocessor.json: its JSON nests too deeply") and not (tmp / "deep.bin").exists(),
          f"a processor file nested 100,000 deep: one line, exit {rc}: {text.strip()[:200]}")


def check_writes(tmp, good, ckpt, vlm):
    """Nothing the user has is replaced unless asked (--force), nothing is written into the run folder
    of a running trainer, a failed write (the file size limit, a full disk, no memory) is one line
    and leaves neither a temporary file nor a changed file. ckpt: good's import."""
    want = ckpt.read_bytes()
    run = tmp / "writes"
    run.mkdir()
    # the file size limit (EFBIG), in children started first (their interpreters start while the
    # checks below run): the existing file stays as it was, a new folder is not made
    limited = tmp / "limited"
    limited.mkdir()
    kept, policy = limited / "ckpt_00000004.bin", limited / "policy"
    kept.write_bytes(b"the user's checkpoint")
    procs = [("import --force", limited_run("import_lerobot.py", [str(good), "-o", str(kept), "--force"], 1 << 18)),
             ("export", limited_run("export_lerobot.py", [str(ckpt), "-o", str(policy), "--vlm", str(vlm)], 1 << 18))]
    existing = run / "ckpt_00000004.bin"
    existing.write_bytes(b"the user's checkpoint")
    rc, text = run_script(import_lerobot, [str(good), "-o", str(existing)])
    check(text.strip() == f"error: {existing} exists: pass --force to replace it, or write elsewhere (-o)" and rc == 1
          and existing.read_bytes() == b"the user's checkpoint" and not leftovers(run),
          f"import onto an existing checkpoint: refused in one line, the file unchanged: {text.strip()[:200]}")
    holder = "pid 4242 on somehost\x1b[1m, since 2026-01-02 03:04:05 UTC\nsecond line"
    with trainer_holds(run, holder):
        for argv in ([], ["--force"]):
            rc, text = run_script(import_lerobot, [str(good), "-o", str(existing)] + argv)
            check(refused(rc, text, f"{run} is the run folder of a trainer that is running (pid 4242 on somehost\\x1b"
                                    "[1m, since 2026-01-02 03:04:05 UTC)", "wait for it to end, or write elsewhere")
                  and existing.read_bytes() == b"the user's checkpoint" and not leftovers(run),
                  f"import {' '.join(argv + ['-o'])} into a running trainer's folder: refused naming it, the file "
                  f"unchanged: {text.strip()[:240]}")
        rc, text = run_script(import_lerobot, [str(good), "-o", str(run / "new.bin"), "--force"])
        check(refused(rc, text, "trainer that is running", "--force does not write into it")
              and not (run / "new.bin").exists(), f"import --force of a new file there: refused: {text.strip()[:200]}")
    (run / ".lock").write_text("pid 4242 on somehost, since 2026-01-02 03:04:05 UTC\n")  # a trainer that ended
    rc, text = run_script(import_lerobot, [str(good), "-o", str(existing), "--force"])
    check(rc == 0 and existing.read_bytes() == want and not leftovers(run),
          "import --force onto it once the trainer ended: replaced by the import, byte for byte"
          + ("" if rc == 0 else f": {text.strip()[:200]}"))


    # a full disk (ENOSPC): a 256 KiB tmpfs where this machine mounts one, else open() that fails so
    disk = tmp / "disk"
    disk.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                                 capture_output=True).returncode == 0
    except OSError:  # (no mount command)
        mounted = False
    if not mounted:
        print("    (no tmpfs can be mounted here: the full disk is an open() whose writes fail with ENOSPC)")
    try:
        for label, module, argv, target in (
                ("import", import_lerobot, [str(good), "-o", str(disk / "x.bin")], disk / "x.bin"),
                ("export", export_lerobot, [str(ckpt), "-o", str(disk / "p"), "--vlm", str(vlm)], disk / "p")):
            fake = contextlib.nullcontext() if mounted else patched(vla if module is import_lerobot else module,
                                                                    "open", full_disk_open)
            with fake:
                rc, text = run_script(module, argv)
            check(refused(rc, text, "failed: No space left on device", f"free space in {disk}")
                  and not target.exists() and not leftovers(disk), f"{label} onto a full disk: one line, exit {rc}, "
                  f"nothing left: {text.strip()[:300]}")
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)])

    # out of memory: one line, the temporary file or folder removed
    def no_memory(*args, **kwargs):
        raise MemoryError()
    with patched(import_lerobot, "read_float32", no_memory):
        rc, text = run_script(import_lerobot, [str(good), "-o", str(run / "oom.bin")])
    check(refused(rc, text, "out of memory while importing") and not (run / "oom.bin").exists(),
          f"import out of memory: one line, exit {rc}: {text.strip()[:200]}")
    with patched(export_lerobot.smolvla, "save_safetensors", no_memory):
        rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(tmp / "oom_policy"), "--vlm", str(vlm)])
    check(refused(rc, text, "out of memory while exporting") and not (tmp / "oom_policy").exists()
          and not leftovers(tmp, "oom_policy"), f"export out of memory: one line, exit {rc}, no folder left: "
          f"{text.strip()[:200]}")

    # export: a folder someone named like a temporary one stays; --force replaces only export's files
    theirs = tmp / "kept_policy.tmp"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    out = tmp / "kept_policy"
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out), "--vlm", str(vlm)])
    check(rc == 0 and (theirs / "notes.txt").read_text() == "mine" and not leftovers(tmp, "kept_policy"),
          f"export beside a folder named {theirs.name}: that folder kept" + ("" if rc == 0 else f": {text[-300:]}"))
    fresh = folder_bytes(out)
    (out / "README.md").write_text("the user's notes")
    (out / "config.json").write_text("{}")
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out), "--vlm", str(vlm)])
    check(refused(rc, text, f"{out} exists and is not empty: pass --force")
          and (out / "config.json").read_text() == "{}",
          f"export into it again without --force: refused, untouched: {text.strip()[:200]}")
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out), "--vlm", str(vlm), "--force"])
    now = folder_bytes(out)
    check(rc == 0 and now == {**fresh, "README.md": b"the user's notes"} and not leftovers(out),
          "export --force into it: export's files replaced (as a fresh export writes them), README.md kept, no "
          "temporary folder left" + ("" if rc == 0 else f": {text.strip()[-300:]}"))
    with trainer_holds(out, "pid 77 on elsewhere, since 2026-01-02 03:04:05 UTC\n"):
        (out / "config.json").write_text("{}")
        rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(out), "--vlm", str(vlm), "--force"])
        check(refused(rc, text, "trainer that is running (pid 77 on elsewhere", "--force does not write into it")
              and (out / "config.json").read_text() == "{}" and not leftovers(out),
              f"export --force into a running trainer's folder: refused naming it, untouched: {text.strip()[:200]}")
    a_file = tmp / "a_file"
    a_file.write_text("x")
    rc, text = run_script(export_lerobot, [str(ckpt), "-o", str(a_file), "--vlm", str(vlm), "--force"])
    check(refused(rc, text, "is a file, and export writes a folder") and a_file.read_text() == "x",
          f"export --force onto a file: refused, the file kept: {text.strip()[:200]}")
    for label, p in procs:
        text = p.communicate()[0]
        check(refused(p.returncode, text, "failed: File too large: it needs ", "the file size limit allows (ulimit -f")
              and kept.read_bytes() == b"the user's checkpoint" and not policy.exists() and not leftovers(limited),
              f"{label} under a 256 KiB file size limit: one line, exit {p.returncode}, nothing changed or left: "
              f"{text.strip()[:300]}")


def check_hints(tmp, ckpt, vlm):
    """Every option a refusal of import or export names is one that script has: each `--name` in the
    text of their fail() calls, and export's refusal of a truncated checkpoint (dev/model.py's reader
    names the trainers' --init)."""
    import ast
    import re
    for module in (import_lerobot, export_lerobot):
        options = {o for action in module.parser()._actions for o in action.option_strings}
        tree = ast.parse(Path(module.__file__).read_text())
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                    "fail", "error_exit", "write_failure"):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        named.update(re.findall(r"(?<![\w-])--[a-z][a-z-]*", sub.value))
        check(named and named <= options,
              f"{Path(module.__file__).name}: every option its refusals name is its own ({sorted(named)})"
              + (f"; not its own: {sorted(named - options)}" if named - options else ""))
    short = tmp / "short.bin"
    short.write_bytes(ckpt.read_bytes()[:1000])
    rc, text = run_script(export_lerobot, [str(short), "-o", str(tmp / "short_policy"), "--vlm", str(vlm)])
    check(refused(rc, text, "truncated", "pass an intact checkpoint") and "--init" not in text,
          f"export of a truncated checkpoint: one line naming what export takes: {text.strip()[:200]}")


def check_tokenization(tmp, vlm):
    """LeRobot's pre-processor against a shard written with vla_shard.TokenizerJSON and the trainer's
    batch of it (dev/model.py's build_batch, which test_vla checks against vla/dataset.h's), at LeRobot's
    default tokenizer_max_length 48."""
    from lerobot.policies.factory import make_pre_post_processors
    from transformers import AutoTokenizer

    tok = vla_shard.TokenizerJSON(str(vlm))
    pad = json.loads((vlm / "config.json").read_text())["text_config"]["pad_token_id"]  # what the import records
    cfg = make_ref.smolvla_policy_config(vlm, True, True, cameras=CAMERAS, state_dim=STATE_DIM, action_dim=ACTION_DIM,
                                         policy=dict(POLICY, tokenizer_max_length=48))
    with contextlib.redirect_stdout(io.StringIO()):
        pre, _ = make_pre_post_processors(cfg, dataset_stats=make_stats(torch.Generator().manual_seed(SEED + 7)))
    B = len(TOKEN_TASKS)
    n = 2 * B  # one 2-frame episode per task
    rng = np.random.default_rng(SEED)
    cams = [rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8) for h, w in CAMERAS.values()]
    path = tmp / "tokens.bin"
    vla_shard.write_shard(str(path), cams, rng.normal(size=(n, STATE_DIM)).astype(np.float32),
                          rng.normal(size=(n, ACTION_DIM)).astype(np.float32), [(2 * k, 2, k) for k in range(B)],
                          TOKEN_TASKS, tokenizer=tok)
    ds = vla_shard.Dataset(str(path))
    c48 = vla.SmolVLAConfig(**{**vars(TINY), "n_cam": len(CAMERAS), "state_dim": STATE_DIM, "action_dim": ACTION_DIM,
                               "vocab": tok.vocab, "pad_token": pad, "max_text": 48})
    lens = [len(tok.encode(t)) for t in TOKEN_TASKS]
    g = torch.Generator().manual_seed(SEED + 8)
    # every task (the longest is cut: LeRobot's tensors are 48 wide), then all but the longest
    # (LeRobot pads to the longest left, narrower than the trainer's 48 columns)
    for picks in (list(range(B)), [k for k in range(B) if lens[k] < 48]):
        batch = {make_ref.cam_key(c): make_ref.images_as_fed(torch.randint(0, 256, (len(picks), h, w, 3), generator=g,
                                                                           dtype=torch.uint8))
                 for c, (h, w) in CAMERAS.items()}
        batch["observation.state"] = torch.randn(len(picks), STATE_DIM, generator=g)
        batch["task"] = [TOKEN_TASKS[k] for k in picks]
        out = pre(batch)
        theirs = out["observation.language.tokens"].numpy()
        their_mask = out["observation.language.attention_mask"].numpy()
        ours = vla.build_batch(ds, c48, [2 * k for k in picks], SEED, 0)
        L = theirs.shape[1]
        same = (L == min(48, max(lens[k] for k in picks)) and np.array_equal(ours["tokens"][:, :L], theirs)
                and np.array_equal(ours["token_mask"][:, :L] > 0, their_mask))
        rest = bool((ours["tokens"][:, L:] == pad).all() and not ours["token_mask"][:, L:].any())
        check(ds.tokenizer == tok.name and same and rest,
              f"LeRobot's pre-processor (tokens, attention mask: {theirs.shape[0]} x {L}) on tasks of "
              f"{[lens[k] for k in picks]} ids equals the first {L} columns of the trainer's batch from a {tok.name} "
              f"shard, then pad id {pad} with mask 0")
    # transformers 5 rebuilds a GPT2Tokenizer-class tokenizer with plain ByteLevel pre-tokenization
    gpt2 = tmp / "vlm_gpt2_class"
    shutil.copytree(vlm, gpt2)
    tj = json.loads((vlm / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                 tj["pre_tokenizer"]]}
    (gpt2 / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((gpt2 / "tokenizer_config.json").read_text())
    (gpt2 / "tokenizer_config.json").write_text(json.dumps({**tc, "tokenizer_class": "GPT2Tokenizer"}))
    at = AutoTokenizer.from_pretrained(gpt2)
    rebuilt = type(at).__name__ == "GPT2Tokenizer" and type(at.backend_tokenizer.pre_tokenizer).__name__ == "ByteLevel"
    tg = vla_shard.TokenizerJSON(str(gpt2))
    same = all(at(t if t.endswith("\n") else t + "\n")["input_ids"] == tg.encode(t).tolist() for t in TOKEN_TASKS)
    check(rebuilt and same, "a GPT2Tokenizer-class folder whose tokenizer.json splits digits first: transformers "
          f"rebuilds it with ByteLevel alone ({rebuilt}), the ids are tokenizer.json's (no merge joins digits: {same})")


def check_bpe_policy(tmp, bytes_vlm):
    """A LeRobot policy on a BPE VLM through import, VLAPolicy, fine-tuning on its tokenizer's shard and
    export."""
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    vlm = tmp / "vlm_bpe_policy"
    with contextlib.redirect_stdout(io.StringIO()):
        tok = make_ref.smolvla_build_vlm_folder(vlm, VISION, TEXT, TINY.scale_factor, make_ref.smolvla_build_tokenizer)
        cfg = make_ref.smolvla_policy_config(vlm, True, True, cameras=CAMERAS, state_dim=STATE_DIM,
                                             action_dim=ACTION_DIM, policy=POLICY)
        torch.manual_seed(SEED + 11)
        policy = SmolVLAPolicy(cfg)
    make_ref.perturb_constant_params(policy, SEED + 12)
    stats = make_stats(torch.Generator().manual_seed(SEED + 13))
    pdir = tmp / "bpe_fp32"
    save_policy(policy, cfg, stats, pdir)
    check_tokenization(tmp, vlm)

    ckpt = tmp / "bpe.bin"
    rc, out = run_script(import_lerobot, [str(pdir), "-o", str(ckpt)])
    check(rc == 0, "import of a LeRobot policy on a BPE VLM" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return
    ck = vla.read_checkpoint(str(ckpt))
    tid = vla_shard.tokenizer_json_id(str(vlm / "tokenizer.json"))
    check((ck["tokenizer"], ck["config"].vocab, ck["config"].pad_token) == (tid, len(tok), tok.pad_token_id),
          f"it records tokenizer {ck['tokenizer']}, a text table of {ck['config'].vocab} rows, pad id "
          f"{ck['config'].pad_token}")
    frames, state, noise = make_observation(torch.Generator().manual_seed(SEED + 14))
    images = [np.ascontiguousarray(f.numpy()) for f in frames.values()]
    want, _ = lerobot_actions(pdir, frames, state, BPE_TASKS, noise)
    lens = [len(vla_shard.TokenizerJSON(str(vlm)).encode(t)) for t in BPE_TASKS]
    for label, spec in (("its folder", vlm), ("its tokenizer.json", vlm / "tokenizer.json")):
        pol = VLAPolicy(str(ckpt), threads=1, tokenizer=str(spec))
        got = pol.act(images, BPE_TASKS, state.numpy(), noise=noise.numpy()).astype(np.float64)
        pol.close()
        e_abs, e_rel = errors(got, want)
        check(e_rel <= ACTION_TOL, f"VLAPolicy(tokenizer={label}) vs LeRobot on tasks of {lens} ids (max_text "
              f"{TINY.max_text}): max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")
    ok, msg = one_line_error(lambda: VLAPolicy(str(ckpt), threads=1), tid, "pass tokenizer=PATH")
    check(ok, f"VLAPolicy without tokenizer= refuses it: {msg}")
    other = vla_shard.tokenizer_json_id(str(bytes_vlm / "tokenizer.json"))
    ok, msg = one_line_error(lambda: VLAPolicy(str(ckpt), threads=1, tokenizer=str(bytes_vlm)), tid, other)
    check(ok, f"VLAPolicy with another VLM's tokenizer.json names both: {msg}")

    # fine-tuning on a shard of its tokenizer; a bytes shard is refused
    n, rng = 24, np.random.default_rng(SEED)
    cams = [rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8) for h, w in CAMERAS.values()]
    data = (rng.normal(size=(n, STATE_DIM)).astype(np.float32), rng.normal(size=(n, ACTION_DIM)).astype(np.float32),
            [(0, 9, 0), (9, 8, 1), (17, 7, 2)], BPE_TASKS)
    shard, bytes_shard, run_dir = tmp / "bpe_shard.bin", tmp / "bytes_shard.bin", tmp / "bpe_run"
    vla_shard.write_shard(str(shard), cams, *data, tokenizer=vla_shard.TokenizerJSON(str(vlm)))
    vla_shard.write_shard(str(bytes_shard), cams, *data)
    base = [os.path.join(ROOT, "train_vla_cpu"), "--train", "expert", "--init", str(ckpt), "--weights-only", "-n", "2",
            "-b", "2", "-u", "1", "-l", "1e-2", "-t", "1", "--workers", "1"]
    r = subprocess.run(base + ["-i", str(bytes_shard), "-o", str(tmp / "bytes_run")], capture_output=True, text=True)
    err = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error")]
    check(r.returncode == 1 and len(err) == 1 and tid in err[0] and "bytes" in err[0],
          f"fine-tuning it on a bytes shard: one-line error naming both tokenizers: {err}")
    r = subprocess.run(base + ["-i", str(shard), "-o", str(run_dir)], capture_output=True, text=True)
    tuned = run_dir / "ckpt_00000002.bin"
    check(r.returncode == 0 and tuned.exists(), "./train_vla_cpu --init <import> --weights-only trains on a shard of its "
          "tokenizer" + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))
    if not tuned.exists():
        return
    edir = tmp / "bpe_finetuned"
    rc, out = run_script(export_lerobot, [str(tuned), "-o", str(edir), "--vlm", str(vlm), "--cameras",
                                          ",".join(CAMERAS), "--device", "cpu"])
    check(rc == 0, "export of the fine-tuned BPE checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc == 0:
        pol = VLAPolicy(str(tuned), threads=1, tokenizer=str(vlm))
        mine = pol.act(images, BPE_TASKS, state.numpy(), noise=noise.numpy()).astype(np.float64)
        pol.close()
        got, _ = lerobot_actions(edir, frames, state, BPE_TASKS, noise)
        e_abs, e_rel = errors(got, mine)
        check(e_rel <= ACTION_TOL, f"LeRobot on the exported fine-tuned BPE checkpoint vs VLAPolicy on it: max abs err "
              f"{e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")


def smolvla_run_all(tmp):
    """SmolVLA's checks, in the order of the docstring."""
    vlm, fp32_dir, bf16_dir, state32, state16, stats = build_fixtures(tmp)
    tok_ids = __import__("transformers").AutoTokenizer.from_pretrained(vlm)(TASKS[2] + "\n")["input_ids"]
    check(tok_ids == list((TASKS[2] + "\n").encode()), "the fixture's tokenizer gives every byte its own id")
    check(safetensors_dtypes(fp32_dir / "model.safetensors") == {"F32"}
          and safetensors_dtypes(bf16_dir / "model.safetensors") == {"BF16"},
          "fixtures: LeRobot saved one policy with fp32 weights and one with bf16 weights")

    print("import (LeRobot -> train_vla)")
    a_ckpt, a16_ckpt = tmp / "a.bin", tmp / "a16.bin"
    ck = check_import(fp32_dir, a_ckpt, state32, stats, "fp32")
    ck16 = check_import(bf16_dir, a16_ckpt, state16, stats, "bf16")
    if ck is None or ck16 is None:
        check.finish()
    rounded = all(torch.equal(torch.from_numpy(ck["params"][n]).to(torch.bfloat16).float(),
                              torch.from_numpy(ck16["params"][n])) for n in ck["params"])
    differs = any(not np.array_equal(ck["params"][n], ck16["params"][n]) for n in ck["params"])
    check(rounded and differs, "bf16: the weights are the fp32 policy's rounded to bf16 (and not the fp32 values)")

    print("round trip LeRobot -> train_vla -> LeRobot")
    b_dir = tmp / "exported"
    rc, out = run_script(export_lerobot, [str(a_ckpt), "-o", str(b_dir), "--vlm", str(vlm),
                                          "--cameras", ",".join(CAMERAS), "--device", "cpu"])
    check(rc == 0, "export of the imported checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        check.finish()
    print("    | " + out.rstrip().replace("\n", "\n    | "))
    theirs, ours = (json.loads((d / "config.json").read_text()) for d in (fp32_dir, b_dir))
    differ = [k for k in theirs if k != "input_features" and theirs[k] != ours.get(k)]
    check(list(theirs) == list(ours) and not differ,
          "config.json: LeRobot's fields in LeRobot's order, the same values (camera shapes aside)"
          + (f"; differ: {differ}" if differ else ""))
    frames, state, noise = make_observation(torch.Generator().manual_seed(SEED + 5))
    want, _ = lerobot_actions(fp32_dir, frames, state, TASKS, noise)
    got, policy_b = lerobot_actions(b_dir, frames, state, TASKS, noise)
    bad = same_tensors(ck, policy_b.state_dict())
    lm_zero = not policy_b.state_dict()[vla.LM_HEAD].any()
    check(not bad and lm_zero, "from_pretrained(strict=True) loads every tensor, equal to the original's "
          "(lm_head zeros)" + (f"; differ: {bad[:4]}" if bad else ""))
    e_abs, e_rel = errors(got, want)
    check(e_abs == 0.0, f"exported vs original LeRobot policy, same observation and noise: max abs err "
          f"{e_abs:.3g}, max rel err {e_rel:.3g} (exact)")
    c_act = vla_actions(a_ckpt, frames, state, TASKS, noise)
    e_abs, e_rel = errors(c_act, want)
    check(e_rel <= ACTION_TOL, f"train_vla (libvla.so) vs LeRobot on the imported weights: max abs err "
          f"{e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")
    # the frames as LeRobot's policy receives them (float32 uint8 / 255), channels last
    fed = [make_ref.images_as_fed(f).permute(0, 2, 3, 1).numpy() for f in frames.values()]
    policy = VLAPolicy(str(a_ckpt), threads=1)
    f_act = policy.act(fed, [t + "\n" for t in TASKS], state.numpy(), noise=noise.numpy()).astype(np.float64)
    policy.close()
    e_abs, e_rel = errors(f_act, want)
    check(np.array_equal(f_act, c_act) and e_rel <= ACTION_TOL, "VLAPolicy on LeRobot's float32 frames (uint8 / "
          f"255): the uint8 frames' actions exactly, LeRobot's within max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")
    check_reference(tmp)

    print("a tokenizer.json's ids (byte-level BPE)")
    check_bpe_policy(tmp, vlm)

    print("fine-tuned train_vla -> LeRobot")
    shard, run_dir = tmp / "s.bin", tmp / "run"
    args = ["--episodes", "6", "--min-len", "4", "--max-len", "9", "--seed", "7", "--state", str(STATE_DIM),
            "--action", str(ACTION_DIM)]
    for h, w in CAMERAS.values():
        args += ["--cam-size", f"{h}x{w}"]
    r = subprocess.run([os.path.join(ROOT, "data", "synthetic"), "-o", str(shard)] + args,
                       capture_output=True, text=True)
    steps = 3
    if r.returncode == 0:
        r = subprocess.run([os.path.join(ROOT, "train_vla_cpu"), "-i", str(shard), "--train", "expert",
                            "--init", str(a_ckpt), "--weights-only", "-n", str(steps), "-b", "2", "-u", "1", "-l", "1e-2",
                            "-t", "1", "--workers", "1", "-o", str(run_dir)], capture_output=True, text=True)
    tuned = run_dir / f"ckpt_{steps:08d}.bin"
    check(r.returncode == 0 and tuned.exists(), f"./train_vla_cpu --init <imported> --weights-only trains {steps} steps on a "
          "shard of the policy's shapes" + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))
    if not tuned.exists():
        check.finish()
    ft = vla.read_checkpoint(str(tuned))
    again = tmp / "rewritten.bin"
    vla.write_checkpoint(str(again), ft["config"], ft["train_mode"], ft["stats"], ft["params"], ft["m"], ft["v"],
                         ft["step"], ft["seed"], ft["sampler_pos"], ft["tokenizer"], ft["run"])
    check(again.read_bytes() == tuned.read_bytes(), "dev/model.py's write_checkpoint reproduces the trainer's "
          "checkpoint byte for byte (the writer the import uses)")
    frozen = [s.name for s in vla.param_table(ft["config"]) if vla.trainable_numel(s, 0) == 0]
    moved = [n for n in ft["params"] if n not in frozen and not np.array_equal(ft["params"][n], ck["params"][n])]
    kept = all(np.array_equal(ft["params"][n], ck["params"][n]) for n in frozen)
    check(kept and len(moved) == len(ft["params"]) - len(frozen),
          f"--train expert from the import: the {len(frozen)} frozen tensors kept, the {len(moved)} trainable ones "
          "moved")
    c_dir = tmp / "finetuned"
    rc, out = run_script(export_lerobot, [str(tuned), "-o", str(c_dir), "--vlm", str(vlm),
                                          "--cameras", ",".join(CAMERAS), "--device", "cpu"])
    check(rc == 0, "export of the fine-tuned checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc == 0:
        want = vla_actions(tuned, frames, state, TASKS, noise)
        got, _ = lerobot_actions(c_dir, frames, state, TASKS, noise)
        e_abs, e_rel = errors(got, want)
        check(e_rel <= ACTION_TOL, f"LeRobot on the exported fine-tuned checkpoint vs train_vla (libvla.so) on it: "
              f"max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")

    print("bad input")
    check_errors(tmp, fp32_dir)
    check_safetensors_refusals(tmp, fp32_dir)
    check_vlm_argument(tmp, fp32_dir, vlm, a_ckpt)
    check_export_errors(tmp, a_ckpt, vlm)
    check_hints(tmp, a_ckpt, vlm)
    print("what import and export write: --force, a running trainer's folder, failed writes")
    check_writes(tmp, fp32_dir, a_ckpt, vlm)


# ----------------------------------------------------------------------------
# pi0 (--family pi0): fixtures, LeRobot's PI0Policy at pi0_tiny's sizes


def pi0_place_tokenizer():
    """The byte tokenizer (build_byte_tokenizer's: byte b is id b, pad id 0, nothing added) in the
    private HF cache as google/paligemma-3b-pt-224's snapshot."""
    repo = Path(os.environ["HF_HUB_CACHE"]) / ("models--" + PI0_TOKENIZER.replace("/", "--"))
    commit = "0" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    build_byte_tokenizer(str(snap))
    # AutoTokenizer reads the model's config first (its type; tokenizer_config.json names the class)
    (snap / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    return snap


def pi0_save_policy(policy, stats, folder):
    with contextlib.redirect_stdout(io.StringIO()):  # pi0's processors print as they are made
        save_policy(policy, policy.config, stats, folder)


def pi0_weights(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def pi0_build_fixtures(tmp):
    """LeRobot's PI0Policy saved in fp32 and bf16: (fp32 dir, bf16 dir, fp32 weights, bf16 weights,
    stats)."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    cfg = make_ref.pi0_policy_config(train_expert_only=False, freeze_vision_encoder=False)
    with make_ref.tiny_pi0_sizes(), contextlib.redirect_stdout(io.StringIO()):
        torch.manual_seed(PI0_SEED)
        policy = PI0Policy(cfg)
    make_ref.perturb_constant_params(policy, PI0_SEED + 3)
    stats = make_stats(torch.Generator().manual_seed(PI0_SEED + 1), PI0_STATE_DIM, PI0_ACTION_DIM, PI0_CAMERAS)
    pi0_save_policy(policy, stats, tmp / "fp32")
    state32 = pi0_weights(policy)
    # what PI0Config(dtype="bfloat16") makes of the same weights
    policy.model.paligemma_with_expert.to_bfloat16_for_selected_params("bfloat16")
    policy.config.dtype = "bfloat16"
    pi0_save_policy(policy, stats, tmp / "bf16")
    return tmp / "fp32", tmp / "bf16", state32, pi0_weights(policy), stats


def pi0_make_observation(g):
    """A raw batch: uint8 frames per camera, raw state, and the starting noise."""
    frames = {cam: torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)
              for cam, (h, w) in PI0_CAMERAS.items()}
    state = torch.randn(BATCH, PI0_STATE_DIM, generator=g) * 2
    noise = torch.randn(BATCH, PI0_PRESET.chunk, PI0_PRESET.max_action_dim, generator=g)
    return frames, state, noise


# ----------------------------------------------------------------------------
# pi0: LeRobot's side and train_vla's


def pi0_load_policy(policy_dir):
    """PI0Policy.from_pretrained at pi0_tiny's sizes, and what it printed (its warnings about the
    patch embedding's name, logged for every checkpoint, left out)."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    out = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with make_ref.tiny_pi0_sizes(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            policy = PI0Policy.from_pretrained(str(policy_dir), strict=True)
    finally:
        logging.disable(logging.NOTSET)
    return policy, out.getvalue()


def pi0_lerobot_actions(policy, policy_dir, frames, state, noise):
    """LeRobot's own path: the folder's saved pre-processor, predict_action_chunk from the given
    noise, its post-processor. Returns (B, H, A) float64."""
    from lerobot.policies.factory import make_pre_post_processors

    with contextlib.redirect_stdout(io.StringIO()):
        pre, post = make_pre_post_processors(policy.config, pretrained_path=str(policy_dir))
    batch = {make_ref.cam_key(c): make_ref.images_as_fed(f) for c, f in frames.items()}
    batch["observation.state"] = state.clone()
    batch["task"] = list(TASKS)
    policy.eval()
    policy.reset()
    with torch.no_grad():
        chunk = policy.predict_action_chunk(pre(batch), noise=noise.clone())
    return post(chunk).to(torch.float64).numpy()


def pi0_vla_actions(ckpt, frames, state, noise):
    """libvla.so on the raw observation (LeRobot's pre-processor appends "\\n" to a task)."""
    policy = VLAPolicy(str(ckpt), threads=1)
    images = [np.ascontiguousarray(f.numpy()) for f in frames.values()]
    out = policy.act(images, [t + "\n" for t in TASKS], state.numpy(), noise=noise.numpy())
    policy.close()
    return out.astype(np.float64)


def pi0_table_errors(ck, state):
    """(LeRobot names that differ in set or shape from the checkpoint's, the largest |difference|
    over the rest) of a LeRobot state dict against a checkpoint, lm_heads aside."""
    params = {n: torch.from_numpy(x) for n, x in ck["params"].items()}
    ours = vla.to_lerobot(ck["config"], params)
    theirs = {k: v for k, v in state.items() if k not in (PI0_VLM_HEAD, PI0_EXPERT_HEAD)}
    bad = sorted(set(ours) ^ set(theirs))
    bad += [k for k in ours if k in theirs and ours[k].shape != theirs[k].shape]
    worst = max((float((ours[k] - theirs[k].float()).abs().max()) for k in ours
                 if k in theirs and ours[k].shape == theirs[k].shape), default=float("inf"))
    return bad, worst


def pi0_rel_l2(x, ref):
    """sqrt(sum (x - ref)^2 / sum ref^2), tests/util/test_util.h's rel_error, in float64."""
    x, ref = x.astype(np.float64), ref.astype(np.float64)
    return float(np.sqrt(((x - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300)))


def pi0_one_error(rc, text, needle, written):
    """A refusal: exit 1, one `error:` line holding needle, nothing written."""
    lines = text.splitlines()
    return rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0] and not written


# ----------------------------------------------------------------------------
# pi0: the checks


def pi0_check_import(policy_dir, ckpt, sizes_file, state, stats, label):
    rc, out = run_script(import_lerobot, [str(policy_dir), "-o", str(ckpt), "--sizes", str(sizes_file)])
    check(rc == 0 and ckpt.exists(), f"import of the {label} policy succeeds" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return None
    print("    | " + out.rstrip().replace("\n", "\n    | "))
    ck = vla.read_checkpoint(str(ckpt))
    want = vla.SmolVLAConfig(**{**vars(PI0_PRESET), "n_cam": len(PI0_CAMERAS), "state_dim": PI0_STATE_DIM,
                                "action_dim": PI0_ACTION_DIM})
    check(ck["config"] == want and ck["config"].family == 1,
          f"{label}: the config is pi0_tiny's (family 1) with the policy's 2 cameras, S {PI0_STATE_DIM}, A {PI0_ACTION_DIM}")
    n_trainable = vla.opt_domain(vla.param_table(ck["config"]), 2)[2]
    zero = all(not x.any() for x in list(ck["m"].values()) + list(ck["v"].values()))
    check((ck["train_mode"], ck["step"], ck["seed"], ck["sampler_pos"], ck["tokenizer"]) == (2, 0, 1337, 0, "bytes")
          and zero and sum(x.size for x in ck["m"].values()) == n_trainable,
          f"{label}: header: train mode all (LeRobot's default flags), step 0, seed 1337, sampler 0, tokenizer bytes "
          f"(the pre-processor's {PI0_TOKENIZER}), zero moments for the {n_trainable} trainable elements")
    want_stats = np.concatenate([stats["observation.state"]["mean"], stats["observation.state"]["std"],
                                 stats["action"]["mean"], stats["action"]["std"]]).astype(np.float32)
    check(np.array_equal(ck["stats"], want_stats), f"{label}: the processors' state and action mean/std")
    bad, worst = pi0_table_errors(ck, state)
    check(not bad and worst == 0.0, f"{label}: all {len(state) - 2} LeRobot tensors but the lm_heads equal the "
          f"checkpoint's (max abs err {worst:.3g})" + (f"; differ: {bad[:4]}" if bad else ""))
    check(f"skipped: {PI0_VLM_HEAD}" in out and f"skipped: {PI0_EXPERT_HEAD}" in out,
          f"{label}: both lm_heads are named as skipped")
    return ck


def pi0_check_sizes_sources(tmp, fp32_dir, sizes_file, a_ckpt):
    """No --sizes means the released variants' sizes (the pi0 preset's, which export names by those
    variants); a c_config.txt above the policy (what make_ref.py --family pi0 writes) gives the checkpoint
    --sizes gives."""
    released = tmp / "released_config"
    released.mkdir()
    pc = json.loads((fp32_dir / "config.json").read_text())
    pc.update(image_resolution=[224, 224], chunk_size=50, n_action_steps=50, tokenizer_max_length=48)
    (released / "config.json").write_text(json.dumps(pc))
    cfg, _ = vla.config_from_policy(str(released))
    same = [f for f in vla.CONFIG_FIELDS if f not in ("n_cam", "state_dim", "action_dim")
            and getattr(cfg, f) != getattr(vla.PRESETS["pi0"], f)]
    check(not same and export_lerobot.pi0_variants(cfg, None) == ("gemma_2b", "gemma_300m"),
          "config.json's variants alone (no --sizes) give the pi0 preset's sizes, which export names gemma_2b and "
          "gemma_300m" + (f"; differ: {same}" if same else ""))
    out = tmp / "released.bin"
    rc, text = run_script(import_lerobot, [str(fp32_dir), "-o", str(out)])
    check(pi0_one_error(rc, text, "the released sizes of gemma_2b and gemma_300m (no --sizes)", out.exists())
          and "pass --sizes FILE" in text,
          f"import of a pi0_tiny folder without --sizes: the released sizes, refused: {text.strip()}")
    case = tmp / "case"
    shutil.copytree(fp32_dir, case / "policy")
    with make_ref.tiny_pi0_sizes(), contextlib.redirect_stdout(io.StringIO()):
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy
        lines = make_ref.pi0_c_config_lines(PI0Policy(make_ref.pi0_policy_config(False, False)))
    (case / "c_config.txt").write_text("\n".join(lines) + "\n")
    out = tmp / "c_config.bin"
    rc, text = run_script(import_lerobot, [str(case / "policy"), "-o", str(out)])
    check(rc == 0 and out.read_bytes() == a_ckpt.read_bytes() and "c_config.txt" in text,
          "import with a c_config.txt above the policy and no --sizes: the checkpoint --sizes gives, byte for byte"
          + ("" if rc == 0 else f": {text.strip()}"))


def pi0_check_round_trip(tmp, src_dir, ckpt, sizes_file, state, label):
    """The import exported and reloaded in LeRobot: its weights, config.json and processors.
    Returns (the folder, the loaded policy) or None."""
    out_dir = tmp / f"exported_{label}"
    rc, out = run_script(export_lerobot, [str(ckpt), "-o", str(out_dir), "--sizes", str(sizes_file),
                                          "--cameras", ",".join(PI0_CAMERAS), "--device", "cpu"])
    check(rc == 0, f"{label}: export of the imported checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return None
    print("    | " + out.rstrip().replace("\n", "\n    | "))
    theirs, ours = (json.loads((d / "config.json").read_text()) for d in (src_dir, out_dir))
    differ = [k for k in theirs if k not in ("input_features", "dtype") and theirs[k] != ours.get(k)]
    check(list(theirs) == list(ours) and not differ and ours["dtype"] == "float32",
          f"{label}: config.json: LeRobot's fields in LeRobot's order, the same values (camera shapes aside; dtype "
          "float32, the weights' now)" + (f"; differ: {differ}" if differ else ""))
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        specs = [json.loads((d / name).read_text()) for d in (src_dir, out_dir)]
        for spec in specs:  # the cameras' shapes are the dataset's in LeRobot's, the model's in ours
            for step in spec["steps"]:
                for key in list(step.get("config", {}).get("features", {})):
                    if key.startswith("observation.images."):
                        step["config"]["features"][key]["shape"] = None
        check(specs[0] == specs[1], f"{label}: {name} is LeRobot's, step by step (camera shapes aside)")
    policy, printed = pi0_load_policy(out_dir)
    loaded = pi0_weights(policy)
    bad, worst = pi0_table_errors(vla.read_checkpoint(str(ckpt)), loaded)
    ref = {k: v.float() for k, v in state.items()}
    worst_src = max(float((loaded[k] - ref[k]).abs().max()) for k in ref if k not in (PI0_VLM_HEAD, PI0_EXPERT_HEAD))
    heads = torch.equal(loaded[PI0_VLM_HEAD], loaded[PI0_EMBED]) and not loaded[PI0_EXPERT_HEAD].any()
    check(not bad and worst == 0.0 and worst_src == 0.0 and heads and "All keys loaded successfully" in printed,
          f"{label}: PI0Policy.from_pretrained loads every key; its state dict equals the checkpoint's and the "
          f"original's ({'widened ' if label == 'bf16' else ''}fp32) tensor by tensor (max abs err {worst_src:.3g}), "
          "PaliGemma's lm_head the embedding, the expert's zeros" + (f"; differ: {bad[:4]}" if bad else "")
          + ("" if "All keys" in printed else f"; LeRobot said: {printed.strip()[-300:]}"))
    return out_dir, policy


def pi0_check_ranks(tmp, a_ckpt, frames, state, noise, sizes_file):
    """-g 4 -b 1 -z 1 against -g 1 -b 4 from the import, then the 4-rank result in LeRobot."""
    shard = tmp / "s.bin"
    args = ["--episodes", "6", "--min-len", "4", "--max-len", "9", "--seed", "7", "--state", str(PI0_STATE_DIM),
            "--action", str(PI0_ACTION_DIM)]
    for h, w in PI0_CAMERAS.values():
        args += ["--cam-size", f"{h}x{w}"]
    r = subprocess.run([os.path.join(ROOT, "data", "synthetic"), "-o", str(shard)] + args, capture_output=True,
                       text=True)
    check(r.returncode == 0, "data/synthetic writes a shard of the policy's cameras and dims"
          + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-400:]))
    steps, runs = 3, {}
    for label, world in (("-g 4 -b 1 -z 1", ["-g", "4", "-b", "1", "-z", "1"]), ("-g 4 -b 1", ["-g", "4", "-b", "1"]),
                         ("-g 1 -b 4", ["-g", "1", "-b", "4"])):
        run_dir = tmp / ("run" + "".join(world).replace("-", "_"))
        r = subprocess.run([os.path.join(ROOT, "train_vla_cpu"), "-i", str(shard), "--init", str(a_ckpt),
                            "--weights-only", "--train", "all", "-n", str(steps), "-u", "1", "-l", str(PI0_LR), "-c", "1.0",
                            "-w", "0.01", "-t", "1", "--workers", "1", "-o", str(run_dir)] + world,
                           capture_output=True, text=True)
        path = run_dir / f"ckpt_{steps:08d}.bin"
        check(r.returncode == 0 and path.exists(), f"./train_vla_cpu --init <import> --weights-only --train all "
              f"{label} trains {steps} steps" + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))
        if not path.exists():
            return
        runs[label] = (path, vla.read_checkpoint(str(path)))
    init = vla.read_checkpoint(str(a_ckpt))["params"]
    (p4, c4), (_, c4z0), (_, c1) = runs["-g 4 -b 1 -z 1"], runs["-g 4 -b 1"], runs["-g 1 -b 4"]
    check(all(np.array_equal(c4["params"][n], c4z0["params"][n]) for n in init),
          "ZeRO-1 changes no bit: -g 4 -b 1 -z 1 and -z 0 give the same weights")
    names = [n for n in init if n not in PI0_NOISE_ONLY]

    def flat(params):
        return np.concatenate([params[n].ravel() for n in names]).astype(np.float64)

    start, w4, w1 = flat(init), flat(c4["params"]), flat(c1["params"])
    e_w, e_d = pi0_rel_l2(w4, w1), pi0_rel_l2(w4 - start, w1 - start)
    moved = float(np.abs(w1 - start).max())
    check(e_w <= PI0_RANKS_TOL_WEIGHTS and e_d <= PI0_RANKS_TOL_CHANGE and moved > 0 and c4["step"] == c1["step"] == steps,
          f"-g 4 -b 1 -z 1 vs -g 1 -b 4 after {steps} steps at lr {PI0_LR:g}: weights rel err {e_w:.2e} (tol "
          f"{PI0_RANKS_TOL_WEIGHTS:g}), their change from the import rel err {e_d:.2e} (tol {PI0_RANKS_TOL_CHANGE:g}; "
          f"largest change {moved:.3g}), every tensor but {', '.join(PI0_NOISE_ONLY)}")
    drift = max(float(np.abs(c["params"][n] - init[n]).max()) for c in (c4, c1) for n in PI0_NOISE_ONLY)
    check(drift < PI0_LR / 10, f"{', '.join(PI0_NOISE_ONLY)} (a gradient of rounding noise: the softmax ignores a key bias) "
          f"move by at most {drift:.2g} (< lr / 10)")
    out_dir = tmp / "exported_ranks"
    rc, out = run_script(export_lerobot, [str(p4), "-o", str(out_dir), "--sizes", str(sizes_file),
                                          "--cameras", ",".join(PI0_CAMERAS), "--device", "cpu"])
    check(rc == 0, "export of the 4-rank checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return
    policy, printed = pi0_load_policy(out_dir)
    bad, worst = pi0_table_errors(c4, pi0_weights(policy))
    check(not bad and worst == 0.0 and "All keys loaded successfully" in printed,
          f"PI0Policy.from_pretrained of it: every tensor the checkpoint's (max abs err {worst:.3g})"
          + (f"; differ: {bad[:4]}" if bad else ""))
    want = pi0_vla_actions(p4, frames, state, noise)
    got = pi0_lerobot_actions(policy, out_dir, frames, state, noise)
    e_abs, e_rel = errors(got, want)
    check(e_rel <= ACTION_TOL, f"LeRobot on the exported 4-rank checkpoint vs train_vla (libvla.so) on it: max abs err "
          f"{e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")


def pi0_check_errors(tmp, good, sizes_file, a_ckpt):
    """Bad folders, sizes and exports: one `error:` line, exit 1, nothing written."""
    from safetensors.torch import load_file, save_file

    cases = []
    other = tmp / "bad_type"
    other.mkdir()
    pc = json.loads((good / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**pc, "type": "act"}))
    shutil.copy(good / "model.safetensors", other)
    cases.append(("a LeRobot folder of another policy type", other, [], "'act', not 'smolvla' or 'pi0'"))
    tensors = load_file(str(good / "model.safetensors"))
    for label, name, edit, needle in (
            ("a missing tensor", "model.action_out_proj.bias", None, "lacks model.action_out_proj.bias"),
            ("a wrong shape", "model.state_proj.weight", torch.zeros(PI0_SIZES["expert"]["width"], 31),
             "model.state_proj.weight has shape [32, 31]")):
        folder = tmp / ("bad_" + label.split()[-1])
        shutil.copytree(good, folder)
        changed = dict(tensors)
        if edit is None:
            del changed[name]
        else:
            changed[name] = edit
        save_file(changed, str(folder / "model.safetensors"))
        cases.append((label, folder, ["--sizes", str(sizes_file)], needle))

    def sizes_with(name, edit):
        sizes = json.loads(json.dumps(PI0_SIZES))
        edit(sizes)
        path = tmp / f"sizes_{name}.json"
        path.write_text(json.dumps(sizes))
        return ["--sizes", str(path)]

    gate = PI0_MODULES.text + "layers.0.mlp.gate_proj.weight"
    for label, argv, needle in (
            ("--sizes without \"expert\"", sizes_with("noexpert", lambda s: s.pop("expert")), 'has no "expert"'),
            ("--sizes with \"vlm\".\"width\" a string", sizes_with("string", lambda s: s["vlm"].update(width="64")),
             '"vlm"."width" is "64", not a positive whole number'),
            ("--sizes of another VLM MLP width", sizes_with("mlp", lambda s: s["vlm"].update(mlp_dim=96)),
             f"{gate} has shape [128, 64], --sizes"),
            ("--sizes whose Gemmas differ in head size", sizes_with("heads", lambda s: s["expert"].update(head_dim=4)),
             "share one attention"),
            ("--sizes that is not a file", ["--sizes", str(tmp / "nowhere.json")], "cannot read it"),
            ("--vlm, which pi0 has not", ["--sizes", str(sizes_file), "--vlm", str(tmp)], "leave --vlm out")):
        cases.append((label, good, argv, needle))
    for label, folder, argv, needle in cases:
        out = tmp / "refused.bin"
        rc, text = run_script(import_lerobot, [str(folder), "-o", str(out)] + argv)
        written = out.exists() or any(out.parent.glob(out.name + ".*tmp"))
        check(pi0_one_error(rc, text, needle, written), f"import of {label}: exit {rc}, {len(text.splitlines())} line(s), "
              f"nothing written: {text.strip()[:300]}")
    for label, argv, needle in (
            ("no --sizes (sizes not the released variants')", [], "pass --sizes FILE with the checkpoint's sizes"),
            ("--sizes of another VLM MLP width", sizes_with("mlp2", lambda s: s["vlm"].update(mlp_dim=96)),
             '"vlm"."mlp_dim" is 96, the checkpoint\'s d_ff is 128'),
            ("--vlm", ["--sizes", str(sizes_file), "--vlm", str(tmp)], "leave --vlm out"),
            ("a camera list of the wrong length", ["--sizes", str(sizes_file), "--cameras", "top"],
             "reads 2 camera(s)")):
        out = tmp / "export_refused"
        rc, text = run_script(export_lerobot, [str(a_ckpt), "-o", str(out)] + argv)
        check(pi0_one_error(rc, text, needle, out.exists() or Path(str(out) + ".tmp").exists()),
              f"export with {label}: exit {rc}, {len(text.splitlines())} line(s), no folder: {text.strip()[:300]}")


def pi0_run_all(tmp):
    from transformers import AutoTokenizer

    pi0_place_tokenizer()
    ids = AutoTokenizer.from_pretrained(PI0_TOKENIZER)(TASKS[2] + "\n")["input_ids"]
    check(ids == list((TASKS[2] + "\n").encode()), f"the private HF cache's {PI0_TOKENIZER} gives every byte its own id")
    fp32_dir, bf16_dir, state32, state16, stats = pi0_build_fixtures(tmp)
    dtypes32, dtypes16 = (safetensors_dtypes(d / "model.safetensors") for d in (fp32_dir, bf16_dir))
    check(dtypes32 == {"F32"} and dtypes16 == {"F32", "BF16"},
          f"fixtures: LeRobot saved the policy in fp32 ({sorted(dtypes32)}) and as its dtype bfloat16 keeps it "
          f"({sorted(dtypes16)})")
    sizes_file = tmp / "sizes.json"
    sizes_file.write_text(json.dumps(PI0_SIZES, indent=1))

    print("import (LeRobot -> train_vla)")
    a_ckpt, a16_ckpt = tmp / "a.bin", tmp / "a16.bin"
    ck = pi0_check_import(fp32_dir, a_ckpt, sizes_file, state32, stats, "fp32")
    ck16 = pi0_check_import(bf16_dir, a16_ckpt, sizes_file, state16, stats, "bf16")
    if ck is None or ck16 is None:
        check.finish()
    def as_bf16(x):
        return torch.from_numpy(x).to(torch.bfloat16).float()

    rounded = [n for n in ck["params"] if not np.array_equal(ck["params"][n], ck16["params"][n])]
    kept = [n for n in ck["params"] if n not in rounded]
    check(rounded and all(torch.equal(as_bf16(ck["params"][n]), torch.from_numpy(ck16["params"][n])) for n in rounded),
          f"bf16: every weight is the fp32 policy's, rounded to bf16 in the {len(rounded)} tensors LeRobot's dtype "
          f"bfloat16 rounds, unchanged in the {len(kept)} it leaves in fp32 ({', '.join(kept[:4])}, ...)")
    pi0_check_sizes_sources(tmp, fp32_dir, sizes_file, a_ckpt)

    print("round trip LeRobot -> train_vla -> LeRobot")
    frames, state, noise = pi0_make_observation(torch.Generator().manual_seed(PI0_SEED + 5))
    trip = pi0_check_round_trip(tmp, fp32_dir, a_ckpt, sizes_file, state32, "fp32")
    trip16 = pi0_check_round_trip(tmp, bf16_dir, a16_ckpt, sizes_file, state16, "bf16")
    if trip is None or trip16 is None:
        check.finish()
    original, _ = pi0_load_policy(fp32_dir)
    want = pi0_lerobot_actions(original, fp32_dir, frames, state, noise)
    got = pi0_lerobot_actions(trip[1], trip[0], frames, state, noise)
    e_abs, _ = errors(got, want)
    check(e_abs == 0.0, f"fp32: LeRobot's actions before and after the round trip, same observation and noise: max abs "
          f"err {e_abs:.3g} (exact)")
    # the bf16 source's values in an fp32 policy (LeRobot's bf16 policy computes in bf16, with its
    # rotary buffers rounded too): the exported folder is computed in fp32
    original.load_state_dict({k: v.float() for k, v in state16.items()}, strict=True)
    want16 = pi0_lerobot_actions(original, bf16_dir, frames, state, noise)
    got16 = pi0_lerobot_actions(trip16[1], trip16[0], frames, state, noise)
    e_abs, _ = errors(got16, want16)
    check(e_abs == 0.0, f"bf16: LeRobot's actions of the source's weights (widened) and of the round trip: max abs err "
          f"{e_abs:.3g} (exact)")
    mine = pi0_vla_actions(a_ckpt, frames, state, noise)
    e_abs, e_rel = errors(mine, want)
    check(e_rel <= ACTION_TOL, f"train_vla (libvla.so) vs LeRobot on the imported weights: max abs err {e_abs:.3g}, "
          f"max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")

    print("fine-tuned on 4 simulated ranks -> LeRobot")
    pi0_check_ranks(tmp, a_ckpt, frames, state, noise, sizes_file)

    print("bad input")
    pi0_check_errors(tmp, fp32_dir, sizes_file, a_ckpt)


# ----------------------------------------------------------------------------
# main


def pi0_main():
    """pi0's checks in a private HF cache, named before huggingface_hub reads the environment: it
    holds the stand-in for google/paligemma-3b-pt-224's tokenizer, and nothing may be fetched."""
    if "huggingface_hub" in sys.modules:
        raise RuntimeError("huggingface_hub was imported before HF_HUB_CACHE was set")
    with tempfile.TemporaryDirectory(prefix="pi0_hub_") as hub:
        os.environ["HF_HUB_CACHE"] = hub
        with tempfile.TemporaryDirectory() as tmp_name:
            pi0_run_all(Path(tmp_name))


def smolvla_main():
    with tempfile.TemporaryDirectory() as tmp_name:
        smolvla_run_all(Path(tmp_name))


FAMILIES = {"smolvla": smolvla_main, "pi0": pi0_main}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), default="smolvla",
                    help="the policies imported and exported (default smolvla)")
    args = ap.parse_args(argv)
    t0 = time.time()
    for target in ("train_vla_cpu", "libvla.so", "data/synthetic"):
        if not os.path.exists(os.path.join(ROOT, target)):
            check(False, f"{target} is missing: make {target} first")
            check.finish()
    FAMILIES[args.family]()
    print(f"({time.time() - t0:.1f} s)")
    check.finish()


if __name__ == "__main__":
    main()
