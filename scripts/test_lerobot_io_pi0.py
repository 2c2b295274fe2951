"""
test_lerobot_io_pi0.py: scripts/import_lerobot.py and scripts/export_lerobot.py on pi0 policies,
against LeRobot 0.6.1 itself. Runs under build/lerobot-venv (Python 3.12, lerobot, torch,
safetensors), in one process (LeRobot's import is most of the time):

    build/lerobot-venv/bin/python scripts/test_lerobot_io_pi0.py   # needs train_vla_cpu, libvla.so,
                                                                   # data/synthetic

Fixtures, made here: LeRobot's own PI0Policy at pi0_tiny's sizes (dev/lerobot/make_ref_pi0.py's
tiny_pi0_sizes: PI0Config has no size settings, so the names its model is built from are swapped at
run time), random seeded weights with the norms jittered, LeRobot's default train flags (everything
trains), two cameras of 36x60 and 96x80, state 6, action 5; saved with save_pretrained and its
processors, once in fp32 and once as LeRobot's dtype "bfloat16" keeps it (bf16 but the vision
tower, the projector and the norms). pi0's pre-processor loads google/paligemma-3b-pt-224's
tokenizer by name: a private HF cache holds, under that name, a tokenizer that gives every byte its
own id (the shards' "bytes"), so nothing is fetched and LeRobot's ids are train_vla's. The sizes
file the tools take (--sizes) is make_ref_pi0's sizes in LeRobot's own keys.
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
import tempfile

# A private HF cache, named before huggingface_hub reads the environment: it holds the stand-in for
# google/paligemma-3b-pt-224's tokenizer, and nothing may be fetched.
HUB = tempfile.TemporaryDirectory(prefix="pi0_hub_")
os.environ["HF_HUB_CACHE"] = HUB.name
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for sub in ("scripts", "dev", "data", "dev/lerobot"):
    sys.path.insert(0, os.path.join(ROOT, sub))
import export_lerobot  # noqa: E402
import import_lerobot  # noqa: E402
import make_ref  # noqa: E402  dev/lerobot: camera keys, frames as LeRobot feeds them, the norms' jitter
import make_ref_pi0  # noqa: E402  dev/lerobot: LeRobot's PI0Policy at pi0_tiny's sizes
import model as vla  # noqa: E402  dev/model.py: the table, LeRobot names, checkpoints
import smolvla  # noqa: E402  dev/smolvla.py: the lm_heads' names
import test_lerobot_io as io_test  # noqa: E402  the SmolVLA suite's helpers
from checks import Checks  # noqa: E402
from vla_policy import VLAPolicy  # noqa: E402

check = Checks()
SEED = 4321
CAMERAS = make_ref_pi0.CAMERAS  # (h, w) as the shard stores them; LeRobot pads them centred to 32x32
STATE_DIM, ACTION_DIM, BATCH = make_ref_pi0.STATE_DIM, make_ref_pi0.ACTION_DIM, 3
PRESET = vla.PRESETS["pi0_tiny"]
SIZES = {"vlm": make_ref_pi0.GEMMA["gemma_2b"], "expert": make_ref_pi0.GEMMA["gemma_300m"],
         "vision": make_ref_pi0.VISION, "vocab_size": make_ref_pi0.VOCAB}
TOKENIZER = import_lerobot.PALIGEMMA_TOKENIZER
MODULES = smolvla.MODULES["pi0"]
VLM_HEAD, EXPERT_HEAD = MODULES.vlm_lm_head + "weight", MODULES.expert_lm_head + "weight"
EMBED = MODULES.text + "embed_tokens.weight"
# one shorter than max_text (16), one cut by it, one with a digit and punctuation
TASKS = ["pick it up", "open the top drawer and put the spoon inside", "stack 3 blocks!"]
# train_vla's fp32 sampling against LeRobot's: 10 Euler steps through the whole model, the same
# sums in other orders; test_vla measures 1.0e-7 on pi0_tiny's chunk and checks 1e-5, as here
ACTION_TOL = 1e-5
# -g 4 -b 1 -z 1 against -g 1 -b 4: the same samples and noise, the gradient summed per rank then
# across ranks: fp32 rounding of the weights (1e-6; measured 3e-8), and of their change over the
# 3 steps, which AdamW's division by sqrt(v) makes relative to each gradient's size (1e-5, test_vla's
# world-size tolerance; measured 2e-6). Aside: the vision tower's key biases, whose gradient is zero
# in exact arithmetic (q . b_k shifts a query's every score alike, which the softmax ignores): theirs
# is rounding noise, far below AdamW's eps (1e-8), so they move by about lr |g| / eps, a noise of
# the ranks' summation order; they are held to moving less than lr / 10.
RANKS_TOL_WEIGHTS, RANKS_TOL_CHANGE, LR = 1e-6, 1e-5, 1e-3
NOISE_ONLY = ("vis_bk",)


# ----------------------------------------------------------------------------
# fixtures


def place_tokenizer():
    """The byte tokenizer (the SmolVLA suite's: byte b is id b, pad id 0, nothing added) in the
    private HF cache as google/paligemma-3b-pt-224's snapshot."""
    repo = Path(HUB.name) / ("models--" + TOKENIZER.replace("/", "--"))
    commit = "0" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    io_test.build_byte_tokenizer(str(snap))
    # AutoTokenizer reads the model's config first (its type; tokenizer_config.json names the class)
    (snap / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    return snap


def save_policy(policy, stats, folder):
    with contextlib.redirect_stdout(io.StringIO()):  # pi0's processors print as they are made
        io_test.save_policy(policy, policy.config, stats, folder)


def weights(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def build_fixtures(tmp):
    """LeRobot's PI0Policy saved in fp32 and bf16: (fp32 dir, bf16 dir, fp32 weights, bf16 weights,
    stats)."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    cfg = make_ref_pi0.make_policy_config(train_expert_only=False, freeze_vision_encoder=False)
    with make_ref_pi0.tiny_pi0_sizes(), contextlib.redirect_stdout(io.StringIO()):
        torch.manual_seed(SEED)
        policy = PI0Policy(cfg)
    make_ref.perturb_constant_params(policy, SEED + 3)
    stats = io_test.make_stats(torch.Generator().manual_seed(SEED + 1), STATE_DIM, ACTION_DIM, CAMERAS)
    save_policy(policy, stats, tmp / "fp32")
    state32 = weights(policy)
    # what PI0Config(dtype="bfloat16") makes of the same weights
    policy.model.paligemma_with_expert.to_bfloat16_for_selected_params("bfloat16")
    policy.config.dtype = "bfloat16"
    save_policy(policy, stats, tmp / "bf16")
    return tmp / "fp32", tmp / "bf16", state32, weights(policy), stats


def make_observation(g):
    """A raw batch: uint8 frames per camera, raw state, and the starting noise."""
    frames = {cam: torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)
              for cam, (h, w) in CAMERAS.items()}
    state = torch.randn(BATCH, STATE_DIM, generator=g) * 2
    noise = torch.randn(BATCH, PRESET.chunk, PRESET.max_action_dim, generator=g)
    return frames, state, noise


# ----------------------------------------------------------------------------
# LeRobot's side and train_vla's


def load_policy(policy_dir):
    """PI0Policy.from_pretrained at pi0_tiny's sizes, and what it printed (its warnings about the
    patch embedding's name, logged for every checkpoint, left out)."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    out = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with make_ref_pi0.tiny_pi0_sizes(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            policy = PI0Policy.from_pretrained(str(policy_dir), strict=True)
    finally:
        logging.disable(logging.NOTSET)
    return policy, out.getvalue()


def lerobot_actions(policy, policy_dir, frames, state, noise):
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


def vla_actions(ckpt, frames, state, noise):
    """libvla.so on the raw observation (LeRobot's pre-processor appends "\\n" to a task)."""
    policy = VLAPolicy(str(ckpt), threads=1)
    images = [np.ascontiguousarray(f.numpy()) for f in frames.values()]
    out = policy.act(images, [t + "\n" for t in TASKS], state.numpy(), noise=noise.numpy())
    policy.close()
    return out.astype(np.float64)


def table_errors(ck, state):
    """(LeRobot names that differ in set or shape from the checkpoint's, the largest |difference|
    over the rest) of a LeRobot state dict against a checkpoint, lm_heads aside."""
    params = {n: torch.from_numpy(x) for n, x in ck["params"].items()}
    ours = vla.to_lerobot(ck["config"], params)
    theirs = {k: v for k, v in state.items() if k not in (VLM_HEAD, EXPERT_HEAD)}
    bad = sorted(set(ours) ^ set(theirs))
    bad += [k for k in ours if k in theirs and ours[k].shape != theirs[k].shape]
    worst = max((float((ours[k] - theirs[k].float()).abs().max()) for k in ours
                 if k in theirs and ours[k].shape == theirs[k].shape), default=float("inf"))
    return bad, worst


def rel_l2(x, ref):
    """sqrt(sum (x - ref)^2 / sum ref^2), dev/test_util.h's rel_error, in float64."""
    x, ref = x.astype(np.float64), ref.astype(np.float64)
    return float(np.sqrt(((x - ref) ** 2).sum() / max((ref ** 2).sum(), 1e-300)))


def one_error(rc, text, needle, written):
    """A refusal: exit 1, one `error:` line holding needle, nothing written."""
    lines = text.splitlines()
    return rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0] and not written


# ----------------------------------------------------------------------------
# the checks


def check_import(policy_dir, ckpt, sizes_file, state, stats, label):
    rc, out = io_test.run_script(import_lerobot, [str(policy_dir), "-o", str(ckpt), "--sizes", str(sizes_file)])
    check(rc == 0 and ckpt.exists(), f"import of the {label} policy succeeds" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return None
    print("    | " + out.rstrip().replace("\n", "\n    | "))
    ck = vla.read_checkpoint(str(ckpt))
    want = vla.SmolVLAConfig(**{**vars(PRESET), "n_cam": len(CAMERAS), "state_dim": STATE_DIM,
                                "action_dim": ACTION_DIM})
    check(ck["config"] == want and ck["config"].family == 1,
          f"{label}: the config is pi0_tiny's (family 1) with the policy's 2 cameras, S {STATE_DIM}, A {ACTION_DIM}")
    n_trainable = vla.opt_domain(vla.param_table(ck["config"]), 2)[2]
    zero = all(not x.any() for x in list(ck["m"].values()) + list(ck["v"].values()))
    check((ck["train_mode"], ck["step"], ck["seed"], ck["sampler_pos"], ck["tokenizer"]) == (2, 0, 1337, 0, "bytes")
          and zero and sum(x.size for x in ck["m"].values()) == n_trainable,
          f"{label}: header: train mode all (LeRobot's default flags), step 0, seed 1337, sampler 0, tokenizer bytes "
          f"(the pre-processor's {TOKENIZER}), zero moments for the {n_trainable} trainable elements")
    want_stats = np.concatenate([stats["observation.state"]["mean"], stats["observation.state"]["std"],
                                 stats["action"]["mean"], stats["action"]["std"]]).astype(np.float32)
    check(np.array_equal(ck["stats"], want_stats), f"{label}: the processors' state and action mean/std")
    bad, worst = table_errors(ck, state)
    check(not bad and worst == 0.0, f"{label}: all {len(state) - 2} LeRobot tensors but the lm_heads equal the "
          f"checkpoint's (max abs err {worst:.3g})" + (f"; differ: {bad[:4]}" if bad else ""))
    check(f"skipped: {VLM_HEAD}" in out and f"skipped: {EXPERT_HEAD}" in out,
          f"{label}: both lm_heads are named as skipped")
    return ck


def check_sizes_sources(tmp, fp32_dir, sizes_file, a_ckpt):
    """No --sizes means the released variants' sizes (the pi0 preset's, which export names by those
    variants); a c_config.txt above the policy (what make_ref_pi0.py writes) gives the checkpoint
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
    rc, text = io_test.run_script(import_lerobot, [str(fp32_dir), "-o", str(out)])
    check(one_error(rc, text, "the released sizes of gemma_2b and gemma_300m (no --sizes)", out.exists())
          and "pass --sizes FILE" in text,
          f"import of a pi0_tiny folder without --sizes: the released sizes, refused: {text.strip()}")
    case = tmp / "case"
    shutil.copytree(fp32_dir, case / "policy")
    with make_ref_pi0.tiny_pi0_sizes(), contextlib.redirect_stdout(io.StringIO()):
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy
        lines = make_ref_pi0.c_config_lines(PI0Policy(make_ref_pi0.make_policy_config(False, False)))
    (case / "c_config.txt").write_text("\n".join(lines) + "\n")
    out = tmp / "c_config.bin"
    rc, text = io_test.run_script(import_lerobot, [str(case / "policy"), "-o", str(out)])
    check(rc == 0 and out.read_bytes() == a_ckpt.read_bytes() and "c_config.txt" in text,
          "import with a c_config.txt above the policy and no --sizes: the checkpoint --sizes gives, byte for byte"
          + ("" if rc == 0 else f": {text.strip()}"))


def check_round_trip(tmp, src_dir, ckpt, sizes_file, state, label):
    """The import exported and reloaded in LeRobot: its weights, config.json and processors.
    Returns (the folder, the loaded policy) or None."""
    out_dir = tmp / f"exported_{label}"
    rc, out = io_test.run_script(export_lerobot, [str(ckpt), "-o", str(out_dir), "--sizes", str(sizes_file),
                                                  "--cameras", ",".join(CAMERAS), "--device", "cpu"])
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
    policy, printed = load_policy(out_dir)
    loaded = weights(policy)
    bad, worst = table_errors(vla.read_checkpoint(str(ckpt)), loaded)
    ref = {k: v.float() for k, v in state.items()}
    worst_src = max(float((loaded[k] - ref[k]).abs().max()) for k in ref if k not in (VLM_HEAD, EXPERT_HEAD))
    heads = torch.equal(loaded[VLM_HEAD], loaded[EMBED]) and not loaded[EXPERT_HEAD].any()
    check(not bad and worst == 0.0 and worst_src == 0.0 and heads and "All keys loaded successfully" in printed,
          f"{label}: PI0Policy.from_pretrained loads every key; its state dict equals the checkpoint's and the "
          f"original's ({'widened ' if label == 'bf16' else ''}fp32) tensor by tensor (max abs err {worst_src:.3g}), "
          "PaliGemma's lm_head the embedding, the expert's zeros" + (f"; differ: {bad[:4]}" if bad else "")
          + ("" if "All keys" in printed else f"; LeRobot said: {printed.strip()[-300:]}"))
    return out_dir, policy


def check_ranks(tmp, a_ckpt, frames, state, noise, sizes_file):
    """-g 4 -b 1 -z 1 against -g 1 -b 4 from the import, then the 4-rank result in LeRobot."""
    shard = tmp / "s.bin"
    args = ["--episodes", "6", "--min-len", "4", "--max-len", "9", "--seed", "7", "--state", str(STATE_DIM),
            "--action", str(ACTION_DIM)]
    for h, w in CAMERAS.values():
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
                            "--weights-only", "--train", "all", "-n", str(steps), "-u", "1", "-l", str(LR), "-c", "1.0",
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
    names = [n for n in init if n not in NOISE_ONLY]

    def flat(params):
        return np.concatenate([params[n].ravel() for n in names]).astype(np.float64)

    start, w4, w1 = flat(init), flat(c4["params"]), flat(c1["params"])
    e_w, e_d = rel_l2(w4, w1), rel_l2(w4 - start, w1 - start)
    moved = float(np.abs(w1 - start).max())
    check(e_w <= RANKS_TOL_WEIGHTS and e_d <= RANKS_TOL_CHANGE and moved > 0 and c4["step"] == c1["step"] == steps,
          f"-g 4 -b 1 -z 1 vs -g 1 -b 4 after {steps} steps at lr {LR:g}: weights rel err {e_w:.2e} (tol "
          f"{RANKS_TOL_WEIGHTS:g}), their change from the import rel err {e_d:.2e} (tol {RANKS_TOL_CHANGE:g}; "
          f"largest change {moved:.3g}), every tensor but {', '.join(NOISE_ONLY)}")
    drift = max(float(np.abs(c["params"][n] - init[n]).max()) for c in (c4, c1) for n in NOISE_ONLY)
    check(drift < LR / 10, f"{', '.join(NOISE_ONLY)} (a gradient of rounding noise: the softmax ignores a key bias) "
          f"move by at most {drift:.2g} (< lr / 10)")
    out_dir = tmp / "exported_ranks"
    rc, out = io_test.run_script(export_lerobot, [str(p4), "-o", str(out_dir), "--sizes", str(sizes_file),
                                                  "--cameras", ",".join(CAMERAS), "--device", "cpu"])
    check(rc == 0, "export of the 4-rank checkpoint" + ("" if rc == 0 else f": {out}"))
    if rc != 0:
        return
    policy, printed = load_policy(out_dir)
    bad, worst = table_errors(c4, weights(policy))
    check(not bad and worst == 0.0 and "All keys loaded successfully" in printed,
          f"PI0Policy.from_pretrained of it: every tensor the checkpoint's (max abs err {worst:.3g})"
          + (f"; differ: {bad[:4]}" if bad else ""))
    want = vla_actions(p4, frames, state, noise)
    got = lerobot_actions(policy, out_dir, frames, state, noise)
    e_abs, e_rel = io_test.errors(got, want)
    check(e_rel <= ACTION_TOL, f"LeRobot on the exported 4-rank checkpoint vs train_vla (libvla.so) on it: max abs err "
          f"{e_abs:.3g}, max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")


def check_errors(tmp, good, sizes_file, a_ckpt):
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
            ("a wrong shape", "model.state_proj.weight", torch.zeros(SIZES["expert"]["width"], 31),
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
        sizes = json.loads(json.dumps(SIZES))
        edit(sizes)
        path = tmp / f"sizes_{name}.json"
        path.write_text(json.dumps(sizes))
        return ["--sizes", str(path)]

    gate = MODULES.text + "layers.0.mlp.gate_proj.weight"
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
        rc, text = io_test.run_script(import_lerobot, [str(folder), "-o", str(out)] + argv)
        written = out.exists() or any(out.parent.glob(out.name + ".*tmp"))
        check(one_error(rc, text, needle, written), f"import of {label}: exit {rc}, {len(text.splitlines())} line(s), "
              f"nothing written: {text.strip()[:300]}")
    for label, argv, needle in (
            ("no --sizes (sizes not the released variants')", [], "pass --sizes FILE with the checkpoint's sizes"),
            ("--sizes of another VLM MLP width", sizes_with("mlp2", lambda s: s["vlm"].update(mlp_dim=96)),
             '"vlm"."mlp_dim" is 96, the checkpoint\'s d_ff is 128'),
            ("--vlm", ["--sizes", str(sizes_file), "--vlm", str(tmp)], "leave --vlm out"),
            ("a camera list of the wrong length", ["--sizes", str(sizes_file), "--cameras", "top"],
             "reads 2 camera(s)")):
        out = tmp / "export_refused"
        rc, text = io_test.run_script(export_lerobot, [str(a_ckpt), "-o", str(out)] + argv)
        check(one_error(rc, text, needle, out.exists() or Path(str(out) + ".tmp").exists()),
              f"export with {label}: exit {rc}, {len(text.splitlines())} line(s), no folder: {text.strip()[:300]}")


def main():
    t0 = time.time()
    for target in ("train_vla_cpu", "libvla.so", "data/synthetic"):
        if not os.path.exists(os.path.join(ROOT, target)):
            check(False, f"{target} is missing: make {target} first")
            check.finish()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            run_all(tmp)
    finally:
        HUB.cleanup()
    print(f"({time.time() - t0:.1f} s)")
    check.finish()


def run_all(tmp):
    from transformers import AutoTokenizer

    place_tokenizer()
    ids = AutoTokenizer.from_pretrained(TOKENIZER)(TASKS[2] + "\n")["input_ids"]
    check(ids == list((TASKS[2] + "\n").encode()), f"the private HF cache's {TOKENIZER} gives every byte its own id")
    fp32_dir, bf16_dir, state32, state16, stats = build_fixtures(tmp)
    dtypes32, dtypes16 = (io_test.safetensors_dtypes(d / "model.safetensors") for d in (fp32_dir, bf16_dir))
    check(dtypes32 == {"F32"} and dtypes16 == {"F32", "BF16"},
          f"fixtures: LeRobot saved the policy in fp32 ({sorted(dtypes32)}) and as its dtype bfloat16 keeps it "
          f"({sorted(dtypes16)})")
    sizes_file = tmp / "sizes.json"
    sizes_file.write_text(json.dumps(SIZES, indent=1))

    print("import (LeRobot -> train_vla)")
    a_ckpt, a16_ckpt = tmp / "a.bin", tmp / "a16.bin"
    ck = check_import(fp32_dir, a_ckpt, sizes_file, state32, stats, "fp32")
    ck16 = check_import(bf16_dir, a16_ckpt, sizes_file, state16, stats, "bf16")
    if ck is None or ck16 is None:
        check.finish()
    def as_bf16(x):
        return torch.from_numpy(x).to(torch.bfloat16).float()

    rounded = [n for n in ck["params"] if not np.array_equal(ck["params"][n], ck16["params"][n])]
    kept = [n for n in ck["params"] if n not in rounded]
    check(rounded and all(torch.equal(as_bf16(ck["params"][n]), torch.from_numpy(ck16["params"][n])) for n in rounded),
          f"bf16: every weight is the fp32 policy's, rounded to bf16 in the {len(rounded)} tensors LeRobot's dtype "
          f"bfloat16 rounds, unchanged in the {len(kept)} it leaves in fp32 ({', '.join(kept[:4])}, ...)")
    check_sizes_sources(tmp, fp32_dir, sizes_file, a_ckpt)

    print("round trip LeRobot -> train_vla -> LeRobot")
    frames, state, noise = make_observation(torch.Generator().manual_seed(SEED + 5))
    trip = check_round_trip(tmp, fp32_dir, a_ckpt, sizes_file, state32, "fp32")
    trip16 = check_round_trip(tmp, bf16_dir, a16_ckpt, sizes_file, state16, "bf16")
    if trip is None or trip16 is None:
        check.finish()
    original, _ = load_policy(fp32_dir)
    want = lerobot_actions(original, fp32_dir, frames, state, noise)
    got = lerobot_actions(trip[1], trip[0], frames, state, noise)
    e_abs, _ = io_test.errors(got, want)
    check(e_abs == 0.0, f"fp32: LeRobot's actions before and after the round trip, same observation and noise: max abs "
          f"err {e_abs:.3g} (exact)")
    # the bf16 source's values in an fp32 policy (LeRobot's bf16 policy computes in bf16, with its
    # rotary buffers rounded too): the exported folder is computed in fp32
    original.load_state_dict({k: v.float() for k, v in state16.items()}, strict=True)
    want16 = lerobot_actions(original, bf16_dir, frames, state, noise)
    got16 = lerobot_actions(trip16[1], trip16[0], frames, state, noise)
    e_abs, _ = io_test.errors(got16, want16)
    check(e_abs == 0.0, f"bf16: LeRobot's actions of the source's weights (widened) and of the round trip: max abs err "
          f"{e_abs:.3g} (exact)")
    mine = vla_actions(a_ckpt, frames, state, noise)
    e_abs, e_rel = io_test.errors(mine, want)
    check(e_rel <= ACTION_TOL, f"train_vla (libvla.so) vs LeRobot on the imported weights: max abs err {e_abs:.3g}, "
          f"max rel err {e_rel:.3g} (tol {ACTION_TOL:g})")

    print("fine-tuned on 4 simulated ranks -> LeRobot")
    check_ranks(tmp, a_ckpt, frames, state, noise, sizes_file)

    print("bad input")
    check_errors(tmp, fp32_dir, sizes_file, a_ckpt)


if __name__ == "__main__":
    main()
