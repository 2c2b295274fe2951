"""
test_model.py: dev/model.py (the oracle of SmolVLA and pi0 with vla/'s plumbing) against vla/
itself, against LeRobot's references, against the C trainer's checkpoints, and end to end on a
synthetic shard.

  (a) LeRobot: for each case of REF_DIR (dev/lerobot/make_ref.py: expert, vlm, all) the config
      taken from the policy folder is dev/smolvla.py --c-config's, the weights map LeRobot ->
      ours -> LeRobot and ours -> LeRobot -> ours exactly, and on the reference batch the
      velocities, loss, every trainable gradient and the sampled chunk equal dev/smolvla.py's
      (same math: 1e-6, the batch's float32 normalized inputs) and LeRobot's (1e-5, its fp32
      rounding); the trained set is LeRobot's. Then --policy runs on a shard of the same shapes.
      The same for pi0 on PI0_REF_DIR's cases (dev/lerobot/make_ref.py --family pi0; skipped,
      said so, when absent).
  (b) the table: dev/smolvla_table.c, compiled with gcc against vla/, prints every preset's
      config (pi0's too; the released pi0's table holds 3,238,048,528 elements) and each tensor's
      name, LeRobot name, tower, kind, train column, decay, init, slices, shape, offset, trainable
      elements per mode and slice layers; all must be equal.
  (c) the seeded init of tiny, small, pi0_tiny and pi0_small equals flow_param_init bit for bit,
      and the flow noise equals vla/rng.h's flow_noise_width over max_action_dim dims.
  (d) --debug-state and --train 3 in each --train-mode on data/synthetic's shard, tiny and
      pi0_tiny: the records, their shapes, frozen gradients, finite differences, the init and
      noise they hold; and the loss falls at lr 1e-3.
  (e) checkpoints (version 2): files of vla/checkpoint.h's checkpoint_write (through dev/smolvla_table.c) in
      each train mode read back exactly (header, weights, moments packed as FlowOptDomain; both
      families' headers byte for byte), and version-1, truncated, foreign, corrupt and
      mode-mismatched files are one-line errors of --init; then ./train_vla_cpu's own (skipped,
      said so, when the binary is absent): its weights and moments after 3 steps equal the
      oracle's own 3 steps (tiny in modes all and vlm, pi0_tiny in all), and --init CKPT --train 3
      continues the C run with its losses.

    build/venv/bin/python tests/model/test_model.py [REF_DIR [PI0_REF_DIR]]
        (default build/lerobot_ref, build/lerobot_ref_pi0)

Closing line `N passed, M failed`; exit status 1 on any failure.
"""

import contextlib
import dataclasses
import io
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = os.path.join(ROOT, "dev")
sys.path.insert(0, DEV)
import model as M  # noqa: E402
import smolvla  # noqa: E402

TOL_SAME_MATH = 1e-6  # float64 both sides; the only difference is the batch's float32 normalized state/actions
TOL_LEROBOT = 1e-5  # float64 oracle vs LeRobot's float32: its rounding accumulated over a few hundred ops
TOL_FD = 1e-5  # float64 central differences (h = 1e-5: truncation ~1e-10) stored as float32 (~6e-8)
FD_ROUNDOFF = 1e-9  # absolute: the loss's float64 rounding (~3e-16) over 2h, with margin

passed, failed = 0, 0
T_START = time.time()


def check(name, ok, detail=""):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name:<88} {detail}", flush=True)
    return ok


def rel_error(x, ref):
    x, ref = torch.as_tensor(x).double(), torch.as_tensor(ref).double()
    if x.shape != ref.shape:
        return math.inf
    denom = ref.norm().item()
    return (x - ref).norm().item() / denom if denom > 0 else (x - ref).norm().item()


def run(args):
    """The oracle's CLI (dev/model.py's main) on args, in this process: a run costs its own work, not
    a fresh interpreter's import of torch (2.5 s, 39 runs). Returns (exit status, stdout + stderr) as
    `build/venv/bin/python dev/model.py ARGS` gives them: sys.exit's message on stderr with status 1, an uncaught
    exception's traceback with status 1; warnings show in every run, as they would in a new process."""
    out, err = io.StringIO(), io.StringIO()
    threads, cwd = torch.get_num_threads(), os.getcwd()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            os.chdir(ROOT)
            M.main(args)
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except Exception:
            traceback.print_exc()
            rc = 1
        finally:
            os.chdir(cwd)
            torch.set_num_threads(threads)
    return rc, out.getvalue() + err.getvalue()


def step_losses(text):
    """The losses of --train's "step N loss X ..." lines."""
    return [float(line.split()[3]) for line in text.splitlines() if line.startswith("step ")]


def last_line(text):
    return text.strip().splitlines()[-1] if text.strip() else ""


def synthetic(path, *args):
    """A shard from data/synthetic (built by make when missing)."""
    exe = os.path.join(ROOT, "data", "synthetic")
    if not os.path.exists(exe):
        subprocess.run(["make", "-s", "data/synthetic"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run([exe, "-o", path] + list(args), check=True, capture_output=True)
    return path


# ----------------------------------------------------------------------------
# (b), (c): the C plumbing itself


def build_table_tool(tmp):
    exe = os.path.join(tmp, "smolvla_table")
    p = subprocess.run(["gcc", "-O2", "-Wall", "-fopenmp", "-o", exe, os.path.join(DEV, "smolvla_table.c"), "-lm", "-lpthread"],
                       capture_output=True, text=True)
    check("dev/smolvla_table.c compiles against vla/ (gcc)", p.returncode == 0, p.stderr.strip()[-300:])
    return exe if p.returncode == 0 else None


def c_table(exe, preset, obs, seed=None, out=None):
    """(config values, [spec fields], total, trainable per mode) as vla/config.h prints them."""
    extra = [str(seed), out] if out else []
    text = subprocess.run([exe, "table", preset] + [str(v) for v in obs] + extra, check=True, capture_output=True,
                          text=True).stdout
    config, specs, total, trainable = None, [], None, None
    for line in text.splitlines():
        f = line.split()
        if f[0] == "config":
            config = [int(v) for v in f[1:]]
        elif f[0] == "spec":  # (no layer after "layers": a tensor the family does not have)
            at = f.index("layers")
            layers = [int(v) for v in f[at + 1].split(",")] if len(f) > at + 1 else []
            specs.append((f[1], f[2], *[int(v) for v in f[3:at]], layers))
        elif f[0] == "total":
            total = int(f[1])
        elif f[0] == "trainable":
            trainable = [int(v) for v in f[1:]]
    return config, specs, total, trainable


def gets_gradient(lc, name):
    """LeRobot's requires_grad, less what pi0 leaves requiring grad but feeds nothing (case.json's
    none_grad_names, which tests/model/test_smolvla.py holds the oracle to): the VLM's final norm,
    and its last layer but for the input norm and q/k/v (the keys and values feed the expert; the queries share
    LeRobot's one softmax with the suffix's, so autograd reaches them, with a zero gradient). The
    table's train column is this set: what has no gradient gets no optimizer state."""
    if not smolvla.is_trainable(lc, name) or not smolvla.is_pi0(lc):
        return smolvla.is_trainable(lc, name)
    text = smolvla.modules(lc).text
    last = text + f"layers.{lc.n_layer - 1}."
    if name == text + "norm.weight":
        return False
    if name.startswith(last):
        return any(name == last + t + ".weight" for t in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                                                           "self_attn.v_proj"))
    return True


# the presets with the observation sizes they are checked at (pi0's released sizes' table has
# 3,238,048,528 elements: every tensor LeRobot's pi0 uses, its two lm_heads excepted)
TABLE_CASES = (("tiny", (1, 4, 4)), ("tiny", (2, 6, 5)), ("small", (2, 6, 5)), ("smolvla", (3, 32, 7)),
               ("pi0_tiny", (1, 4, 4)), ("pi0_tiny", (2, 6, 5)), ("pi0_small", (2, 6, 5)), ("pi0", (3, 32, 7)))
PI0_RELEASED_USED = 3_238_048_528


def test_table(exe):
    for preset, obs in TABLE_CASES:
        cfg = dataclasses.replace(M.PRESETS[preset], n_cam=obs[0], state_dim=obs[1], action_dim=obs[2])
        config, specs, total, trainable = c_table(exe, preset, obs)
        tag = f"{preset} {obs}"
        check(f"{tag}: config = FLOW_PRESETS' in FLOW_CONFIG_FIELDS order", config == cfg.values(),
              f"{len(config)} fields")
        check(f"{tag}: config_problem agrees (usable)", M.config_problem(cfg) is None, str(M.config_problem(cfg)))
        ours = []
        for s in M.param_table(cfg):
            shape = list(s.shape) + [1] * (3 - len(s.shape))
            numel = math.prod(s.shape)
            ours.append((s.name, s.lerobot, s.tower, s.kind, s.train, s.decay, s.init, s.slices, len(s.shape), *shape,
                         numel, s.offset, *[M.trainable_numel(s, m) for m in range(3)],
                         [M.slice_layer(cfg, s, i) for i in range(M.n_slices(s))]))
        bad = [o[0] for o, c in zip(ours, specs) if o != c]
        check(f"{tag}: {len(specs)} tensors: names, LeRobot names, columns, shapes, offsets, trainable, layers",
              len(ours) == len(specs) and not bad, f"differ: {bad[:4]}" if bad else "")
        ours_trainable = [sum(M.trainable_numel(s, m) for s in M.param_table(cfg)) for m in range(3)]
        check(f"{tag}: total {total} and trainable {trainable} per mode", M.param_count(cfg) == total and
              ours_trainable == trainable, f"ours {M.param_count(cfg)} {ours_trainable}")
        if preset == "pi0":
            check(f"{tag}: the released pi0's {PI0_RELEASED_USED:,} parameters (but its two lm_heads)",
                  total == PI0_RELEASED_USED, f"{total:,}")
        # the table is LeRobot's tensor list (but the lm_heads), and its train column LeRobot's requires_grad
        # where a gradient comes (gets_gradient)
        for mode, name in enumerate(M.TRAIN_MODES):
            lc = M.lerobot_config(cfg, mode)
            lerobot = {n: tuple(shape) for n, shape, _ in smolvla.parameter_table(lc)}
            mapped, disagree = {}, []
            for s in M.param_table(cfg):
                per = M.slice_numel(s)
                for i, n in enumerate(M.lerobot_names(cfg, s)):
                    mapped[n] = M.lerobot_shape(cfg, s)
                    if ((i + 1) * per <= M.trainable_numel(s, mode)) != gets_gradient(lc, n):
                        disagree.append(n)
            if mode == 0:
                heads = M.lm_heads(cfg)
                check(f"{tag}: the table's slices are dev/smolvla.py's LeRobot tensors but the {len(heads)} lm_head(s)",
                      mapped == {n: v for n, v in lerobot.items() if n not in heads} and
                      heads == set(smolvla.lm_heads(lc)), f"{len(mapped)} tensors")
            check(f"{tag}: train column in mode {name} = dev/smolvla.py's is_trainable where a gradient comes, "
                  "per slice", not disagree, f"differ: {disagree[:3]}" if disagree else "")


def test_init_and_noise(exe, tmp):
    for preset, obs, seed in (("tiny", (1, 4, 4), 1337), ("small", (2, 6, 5), 7), ("pi0_tiny", (1, 4, 4), 1337),
                              ("pi0_small", (2, 6, 5), 7)):
        cfg = dataclasses.replace(M.PRESETS[preset], n_cam=obs[0], state_dim=obs[1], action_dim=obs[2])
        path = os.path.join(tmp, f"init_{preset}.bin")
        c_table(exe, preset, obs, seed, path)
        c_init = np.fromfile(path, np.float32)
        ours = np.concatenate([p.reshape(-1) for p in M.param_init(cfg, seed).values()])
        same = c_init.shape == ours.shape and np.array_equal(c_init.view(np.uint32), ours.view(np.uint32))
        check(f"{preset} seed {seed}: param_init = flow_param_init bit for bit", same, f"{ours.size} floats")
    cfg = dataclasses.replace(M.PRESETS["tiny"], n_cam=1, state_dim=4, action_dim=4)
    for seed, step, g in ((1337, 0, 0), (1337, 3, 2), (99, 12, 7)):
        text = subprocess.run([exe, "noise", str(seed), str(step), str(g), str(cfg.chunk), str(cfg.max_action_dim)],
                              check=True, capture_output=True, text=True).stdout.split()
        c_t = np.float32(float.fromhex(text[1]))
        c_eps = np.array([float.fromhex(v) for v in text[3:]], np.float32)
        t, eps = M.flow_noise(cfg, seed, step, g)
        check(f"flow_noise(seed {seed}, step {step}, g {g}) = flow_noise_width over {cfg.max_action_dim} dims",
              t == c_t and eps.shape == (cfg.chunk, cfg.max_action_dim) and np.array_equal(eps.reshape(-1), c_eps),
              f"t {t:.6f}")


# ----------------------------------------------------------------------------
# (a): LeRobot's references


def ref_arrays(ref, cameras):
    """A reference batch as the oracle's batch arrays (normalized inputs as LeRobot's pre-processor made them)."""
    return dict(images=[ref["images_u8." + key.split(".")[-1]].numpy() for key in cameras],
                tokens=ref["lang_tokens"].numpy().astype(np.int32),
                token_mask=ref["lang_masks"].numpy().astype(np.float32),
                state=ref["state_norm"].numpy(), actions=ref["actions_norm"].numpy(),
                action_is_pad=ref["action_is_pad"].numpy().astype(np.float32), t=ref["time"].numpy(),
                eps=ref["noise"].numpy())


def test_lerobot_case(case_dir, tmp, family="smolvla"):
    name = os.path.basename(case_dir) if family == "smolvla" else f"{family} {os.path.basename(case_dir)}"
    policy = os.path.join(case_dir, "policy")
    ref = smolvla.load_safetensors(os.path.join(case_dir, "ref.safetensors"))
    cfg, lc = M.config_from_policy(policy, ref["lang_tokens"].shape[1])
    lines = [f"{k} {v}" for k, v in zip(M.CONFIG_FIELDS, cfg.values())]
    check(f"{name}: config from the policy = dev/smolvla.py --c-config's", lines == smolvla.c_config_lines(case_dir),
          f"{cfg.n_cam} cameras, {cfg.n_layer} layers, pad {cfg.pad_token}")
    check(f"{name}: dev/smolvla.py's config of ours is load_config's (but the pad id)",
          dataclasses.replace(M.lerobot_config(cfg, M.mode_of_policy(lc), lc.cameras), pad_token_id=lc.pad_token_id)
          == dataclasses.replace(lc, prefix_length=-1), "")
    mode = M.mode_of_policy(lc)
    check(f"{name}: the policy's flags are train mode {os.path.basename(case_dir)}",
          M.TRAIN_MODES[mode] == os.path.basename(case_dir), M.TRAIN_MODES[mode])
    check(f"{name}: the policy is family {family}", M.FAMILY_NAMES[cfg.family] == family, M.FAMILY_NAMES[cfg.family])

    raw = smolvla.load_safetensors(os.path.join(policy, "model.safetensors"))
    ours = M.from_lerobot(cfg, raw)
    back = M.to_lerobot(cfg, ours)
    same = set(back) == set(raw) - M.lm_heads(cfg) and all(torch.equal(back[n], raw[n]) for n in back)
    check(f"{name}: LeRobot -> ours -> LeRobot is exact ({len(back)} tensors; the lm_heads are not in the table)",
          same)
    again = M.from_lerobot(cfg, back)
    check(f"{name}: ours -> LeRobot -> ours is exact ({len(again)} tensors)",
          list(again) == list(ours) and all(torch.equal(again[n], ours[n]) for n in ours))
    loaded = M.load_policy_weights(policy, cfg, lc)
    check(f"{name}: load_policy_weights (dev/smolvla.py's loader) = the mapping",
          all(torch.equal(loaded[n], ours[n]) for n in ours))

    model = M.SmolVLA(cfg, mode, torch.float64, cameras=lc.cameras)
    model.load(ours)
    x = model.prepare(ref_arrays(ref, lc.cameras))
    v, loss = model(x)
    loss.backward()
    model.finish_grads()
    _, _, out = smolvla.run(policy, ref, torch.float64)
    for k, key in enumerate(lc.cameras):
        cam = key.split(".")[-1]
        check(f"{name}: {cam} frames resized with padding", rel_error(x["images"][k], ref["images_prepped." + cam])
              <= TOL_LEROBOT, f"rel {rel_error(x['images'][k], ref['images_prepped.' + cam]):.1e}")
    for what, ours_x, theirs, ref_x in (("v_t", v, out["v_t"], ref["v_t"]), ("loss", loss, out["loss"], ref["loss"])):
        e1, e2 = rel_error(ours_x, theirs), rel_error(ours_x, ref_x)
        check(f"{name}: {what} = dev/smolvla.py's and LeRobot's", e1 <= TOL_SAME_MATH and e2 <= TOL_LEROBOT,
              f"rel {e1:.1e} / {e2:.1e}")

    grads = M.to_lerobot(cfg, {s.name: getattr(model, s.name).grad for s in model.table})
    ref_names = sorted(k[5:] for k in ref if k.startswith("grad."))
    trained = []
    for s in model.table:
        per = M.slice_numel(s)
        trained += [n for i, n in enumerate(M.lerobot_names(cfg, s)) if (i + 1) * per <= model.n_train[s.name]]
    frozen_zero = all(not bool(g.any()) for n, g in grads.items() if n not in trained)
    check(f"{name}: the {len(trained)} trained slices are LeRobot's gradients; the frozen ones are zero",
          sorted(trained) == ref_names and frozen_zero, f"{len(ref_names)} in the reference")
    worst_same, worst_ref, symmetric = (0.0, ""), (0.0, ""), 0.0
    for n in ref_names:
        if n.startswith(smolvla.modules(lc).vision) and n.endswith("k_proj.bias"):
            # zero by symmetry (softmax ignores a shift): measured against the layer's q_proj.bias gradient
            scale = ref["grad." + n.replace("k_proj.bias", "q_proj.bias")].double().norm().item()
            symmetric = max(symmetric, grads[n].double().norm().item() / scale)
            continue
        # (pi0's last VLM layer's queries: zero in LeRobot, none in dev/smolvla.py, which skips them)
        same = out.get("grad." + n, torch.zeros_like(grads[n]))
        worst_same = max(worst_same, (rel_error(grads[n], same), n))
        worst_ref = max(worst_ref, (rel_error(grads[n], ref["grad." + n]), n))
    check(f"{name}: gradients = dev/smolvla.py's (worst {worst_same[1].split('model.')[-1]})",
          worst_same[0] <= TOL_SAME_MATH, f"rel {worst_same[0]:.1e}")
    check(f"{name}: gradients = LeRobot's (worst {worst_ref[1].split('model.')[-1]})", worst_ref[0] <= TOL_LEROBOT,
          f"rel {worst_ref[0]:.1e}")
    check(f"{name}: vision key-bias gradients are zero by symmetry", symmetric <= 1e-10, f"{symmetric:.1e}")
    chunk = model.sample(x, ref["sample_noise"].double())
    e1, e2 = rel_error(chunk, out["chunk_norm"]), rel_error(chunk, ref["chunk_norm"])
    check(f"{name}: 10-step sample = dev/smolvla.py's and LeRobot's", e1 <= TOL_SAME_MATH and e2 <= TOL_LEROBOT,
          f"rel {e1:.1e} / {e2:.1e}")
    return cfg, lc


def test_policy_cli(case_dir, cfg, tmp):
    """--policy on a shard with the policy's cameras (up to three sizes, resized), state and action dims."""
    frames = ((36, 60), (96, 80), (64, 64))[:cfg.n_cam]
    sizes = [a for h, w in frames for a in ("--cam-size", f"{h}x{w}")]
    shard = synthetic(os.path.join(tmp, "policy_shape.bin"), *sizes, "--state", str(cfg.state_dim), "--action",
                      str(cfg.action_dim), "--episodes", "3", "--min-len", "4", "--max-len", "9")
    out = os.path.join(tmp, "policy_state.bin")
    rc, text = run(["-i", shard, "--policy", os.path.join(case_dir, "policy"), "--set", "max_text=20", "-b", "2",
                    "-t", "1", "--debug-state", out])
    what = f"{M.FAMILY_NAMES[cfg.family]} {os.path.basename(case_dir)}"
    if not check(f"--policy {what}: --debug-state on a shard of {', '.join(f'{h}x{w}' for h, w in frames)} cameras",
                 rc == 0, last_line(text)):
        print(text)
        return
    rec = M.read_vlat(out)
    weights = M.from_lerobot(cfg, smolvla.load_safetensors(os.path.join(case_dir, "policy", "model.safetensors")))
    check(f"--policy {what}: param/ records are the policy's weights",
          all(np.array_equal(rec["param/" + n], w.numpy()) for n, w in weights.items()))
    shapes = [rec[f"batch/image{k}"].shape for k in range(cfg.n_cam)]
    check(f"--policy {what}: cameras recorded at their stored sizes, resized to img",
          shapes == [(2, h, w, 3) for h, w in frames] and
          rec["expect/pixels"].shape == (2 * cfg.n_cam, 3, cfg.img, cfg.img), str(shapes))
    check(f"--policy {what}: config is the policy's with max_text 20",
          list(rec["config"]) == dataclasses.replace(cfg, max_text=20).values() and int(rec["train_mode"][0]) == 0)


# ----------------------------------------------------------------------------
# (d): the CLI end to end on a synthetic shard


def test_cli(shard, tmp, preset):
    """The CLI of one preset (tiny, pi0_tiny) end to end; the options that do not depend on the
    model (--bench, --set, --init) with tiny's only."""
    cfg = dataclasses.replace(M.PRESETS[preset], n_cam=1, state_dim=4, action_dim=4)
    table = M.param_table(cfg)
    init = M.param_init(cfg, 1337)
    losses = {}
    for mode, name in enumerate(M.TRAIN_MODES):
        mode_name = name if preset == "tiny" else f"{preset} {name}"
        out = os.path.join(tmp, f"debug_{preset}_{name}.bin")
        common = ["-i", shard, "-p", preset, "-t", "1", "-b", "3", "--train-mode", name]
        rc, text = run(common + ["--debug-state", out])
        if not check(f"{mode_name}: --debug-state runs", rc == 0, last_line(text)):
            print(text)
            continue
        rec = M.read_vlat(out)
        B, H, Am, S = 3, cfg.chunk, cfg.max_action_dim, cfg.img
        trained = [s for s in table if M.trainable_numel(s, mode) > 0]
        expect = {"config": (len(M.CONFIG_FIELDS),), "hparams": (6,), "seed": (1,), "train_mode": (1,), "stats": (16,),
                  "batch/indices": (B,), "batch/image0": (B, 32, 32, 3), "batch/tokens": (B, 16),
                  "batch/token_mask": (B, 16), "batch/state": (B, 32), "batch/actions": (B, H, Am),
                  "batch/action_is_pad": (B, H), "batch/t": (B,), "batch/eps": (B, H, Am),
                  "expect/pixels": (B, 3, S, S), "expect/v": (B, H, Am), "expect/loss": (1,),
                  "expect/sample": (B, H, Am), "expect/sample_actions": (B, H, 4), "expect/losses": (10,),
                  "expect/norms": (10,)}
        expect.update({"param/" + s.name: tuple(s.shape) for s in table})  # (those the family lacks: no element)
        expect.update({"grad/" + s.name: tuple(s.shape) for s in trained})
        names = [n for n in rec if not n.startswith("fd/")]
        bad = [n for n in expect if n not in rec or rec[n].shape != expect[n]]
        extra = sorted(set(names) - set(expect))
        check(f"{mode_name}: records and shapes ({len(rec)}; grads of the {len(trained)} tensors that train)",
              not bad and not extra, f"bad {bad[:3]}, extra {extra[:3]}")
        if bad:
            continue
        check(f"{mode_name}: config, seed, train mode", list(rec["config"]) == cfg.values() and
              int(rec["seed"][0]) == 1337 and int(rec["train_mode"][0]) == mode)
        check(f"{mode_name}: param/ records = param_init(1337)",
              all(np.array_equal(rec["param/" + n], p) for n, p in init.items()))
        noise = [M.flow_noise(cfg, 1337, 0, g) for g in range(B)]
        check(f"{mode_name}: batch t and eps = flow_noise of step 0",
              np.array_equal(rec["batch/t"], [t for t, _ in noise]) and
              np.array_equal(rec["batch/eps"], np.stack([e for _, e in noise])))
        pads = rec["batch/state"][:, 4:], rec["batch/actions"][:, :, 4:]
        check(f"{mode_name}: state and actions zero-padded to 32", not any(p.any() for p in pads))
        frozen_ok = all(not rec["grad/" + s.name].reshape(-1)[M.trainable_numel(s, mode):].any() for s in trained)
        partial = [s.name for s in trained if M.trainable_numel(s, mode) < math.prod(s.shape)]
        check(f"{mode_name}: frozen parts of trained tensors have zero gradient ({len(partial)} partly frozen)",
              frozen_ok, ", ".join(partial[:3]))
        idx, fd = rec["fd/index"], rec["fd/value"]
        errs = []
        for (k, j), value in zip(idx, fd):
            g = float(rec["grad/" + table[k].name].reshape(-1)[j])
            errs.append(abs(value - g) / (TOL_FD * abs(g) + FD_ROUNDOFF))
        missed = {s.name for s in trained} - {table[k].name for k in idx[:, 0]} - {"vis_bk"}  # vis_bk: zero by symmetry
        check(f"{mode_name}: {len(fd)} finite differences (every trained tensor) = the gradients",
              len(fd) > 0 and not missed and max(errs) <= 1.0,
              f"worst {max(errs):.2f} of the tolerance" if errs else "none")
        L = rec["expect/losses"]
        check(f"{mode_name}: 10 AdamW steps on one batch: finite, loss falls", np.isfinite(L).all() and
              np.isfinite(rec["expect/norms"]).all() and L[-1] < L[0] and float(L[0]) == float(rec["expect/loss"][0]),
              f"{L[0]:.4f} -> {L[-1]:.4f}")
        losses[name] = float(rec["expect/loss"][0])

        rc, text = run(common + ["--train", "3"])
        steps = step_losses(text)
        ok = rc == 0 and len(steps) == 3 and all(math.isfinite(v) for v in steps)
        # step 1 of --train is the debug state's batch, in float32
        e = abs(steps[0] - losses[name]) / losses[name] if ok else math.inf
        check(f"{mode_name}: --train 3 (float32): step 1's loss is the debug state's", ok and e <= 1e-5,
              f"{steps}, rel {e:.1e}")
    check(f"{preset}: the step-0 loss is the same in every train mode (same weights, batch)",
          len(set(losses.values())) == 1 and len(losses) == 3, str(losses))

    # pi0_tiny's loss falls slower and noisier on this shard (measured: 2.38 -> 1.86 over 40 steps)
    steps, window, ratio = (20, 5, 0.8) if preset == "tiny" else (40, 10, 0.85)
    rc, text = run(["-i", shard, "-p", preset, "-t", "1", "-b", "8", "-l", "1e-3", "--train-mode", "all",
                    "--train", str(steps)])
    L = step_losses(text)
    ok = rc == 0 and len(L) == steps
    first, last = (np.mean(L[:window]), np.mean(L[-window:])) if ok else (math.nan, math.nan)
    check(f"{preset}, {steps} steps at lr 1e-3: the loss falls (mean of the last {window} < {ratio} x the first "
          f"{window})",
          ok and last < ratio * first, f"{first:.4f} -> {last:.4f}")
    if preset != "tiny":
        return

    rc, text = run(["-i", shard, "-p", "tiny", "-t", "1", "--train-mode", "vlm", "--bench", "2", "--amp", "bf16"])
    loss = float(text.split("loss ")[1].split()[0]) if rc == 0 and "loss " in text else math.nan
    check("--bench 2 --amp bf16 (CPU autocast) runs and reports a finite loss",
          math.isfinite(loss) and "ms_per_step" in text, last_line(text))
    rc, text = run(["-i", shard, "-p", "tiny", "-t", "1", "--set", "nope=3", "--train", "1"])
    check("a bad --set fails with one line naming the field", rc == 1 and "unknown field" in text, text.strip()[-80:])
    rc, text = run(["-i", shard, "-p", "tiny", "-t", "1", "-b", "3", "--init", os.path.join(tmp, "debug_tiny_all.bin"),
                    "--train", "1", "--train-mode", "all"])
    steps = step_losses(text)
    e = abs(steps[0] - losses["all"]) / losses["all"] if rc == 0 and steps and "all" in losses else math.inf
    check("--init from a debug state starts from its weights (its step-0 loss)", e <= 1e-5, f"rel {e:.1e}")
    rec = M.read_vlat(os.path.join(tmp, "debug_tiny_all.bin"))
    rec["config"] = rec["config"][:-1]  # as written before pi0: no family
    old = os.path.join(tmp, "debug_before_pi0.bin")
    M.write_vlat(old, list(rec.items()))
    rc, text = run(["-i", shard, "-p", "tiny", "-t", "1", "-b", "3", "--init", old, "--train", "1", "--train-mode",
                    "all"])
    steps = step_losses(text)
    e = abs(steps[0] - losses["all"]) / losses["all"] if rc == 0 and steps and "all" in losses else math.inf
    check("--init from a debug state of 26 config fields (before pi0) reads it as SmolVLA's", e <= 1e-5, f"rel {e:.1e}")


# ----------------------------------------------------------------------------
# (e): the C trainer's checkpoints

TOL_CKPT = 1e-5  # C fp32 against the float64 oracle after 3 AdamW steps: the gradients' fp32 rounding
# through m_hat / sqrt(v_hat) (measured: weights 1.3e-7, moments 7e-7)
TOL_CONTINUE = 1e-5  # losses of 3 more steps, fp32 C run against the float64 oracle continuing it (measured 2.4e-7)


def c_run(shard, out, mode, steps, every, extra=(), preset="tiny"):
    """./train_vla_cpu on the shard (4 samples a step); returns (exit status, output, losses by step)."""
    cmd = [os.path.join(ROOT, "train_vla_cpu"), "-p", preset, "-i", shard, "-b", "4", "-n", str(steps), "-u", "2",
           "-l", "1e-3", "-w", "0.1", "-c", "0.5", "-s", "1234", "-t", "1", "-k", str(every), "--keep", "10",
           "--train", mode, "-o", out] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    losses = {}
    log = os.path.join(out, "log.jsonl")
    if os.path.exists(log):
        import json
        for line in open(log):
            rec = json.loads(line)
            if "loss" in rec:
                losses[int(rec["step"])] = float(rec["loss"])
    return p.returncode, p.stdout + p.stderr, losses


def oracle_steps(shard, cfg, mode, steps, seed):
    """The oracle's first `steps` steps in-process (float64), as --train takes them: (model, AdamW)."""
    ds = M.Dataset(shard)
    model = M.SmolVLA(cfg, mode, torch.float64)
    model.load(M.param_init(cfg, seed))
    opt = M.AdamW(model, float(np.float32(1e-3)), 2, 6, float(np.float32(0.1)), float(np.float32(0.1)),
                  float(np.float32(0.5)))
    sampler = M.Sampler(ds.n_samples, seed)
    for step in range(steps):
        x = model.prepare(M.build_batch(ds, cfg, sampler.indices(4 * step, 4), seed, step))
        M.train_step(model, opt, x, step)
    return model, opt


def test_checkpoint_layout(exe, tmp):
    """Both families' checkpoints through vla/checkpoint.h and back (every mode): the config's fields but
    family at 8, the train mode at 112, the family at 116; write_checkpoint writes those bytes."""
    for preset in ("tiny", "pi0_tiny"):
        cfg = dataclasses.replace(M.PRESETS[preset], n_cam=1, state_dim=4, action_dim=4)
        for mode, mode_name in enumerate(M.TRAIN_MODES):
            path = os.path.join(tmp, f"layout_{preset}_{mode_name}.bin")
            subprocess.run([exe, "ckpt", preset, "1", "4", "4", str(mode), "7", "3", "12", path], check=True,
                           capture_output=True)
            raw = open(path, "rb").read()
            fields = struct.unpack_from("<28i", raw, 8)
            ck = M.read_checkpoint(path)
            ours = os.path.join(tmp, f"layout_{preset}_{mode_name}_ours.bin")
            M.write_checkpoint(ours, cfg, mode, ck["stats"], ck["params"], ck["m"], ck["v"], step=3, seed=7,
                               sampler_pos=12, tokenizer="bytes")
            check(f"{preset} {mode_name}: checkpoint_write's header holds the config but family at 8, the mode at 112, "
                  "the family at 116; read_checkpoint reads it, write_checkpoint writes the same bytes",
                  list(fields) == cfg.values()[:26] + [mode, cfg.family] and ck["config"] == cfg and
                  ck["train_mode"] == mode and open(ours, "rb").read() == raw, f"family {fields[-1]}")


def test_checkpoint_files(exe, shard, tmp):
    """vla/checkpoint.h's checkpoint_write -> read_checkpoint, every mode; bad files -> one-line errors."""
    cfg = dataclasses.replace(M.PRESETS["tiny"], n_cam=1, state_dim=4, action_dim=4)
    table = M.param_table(cfg)
    init = M.param_init(cfg, 7)
    for mode, mode_name in enumerate(M.TRAIN_MODES):
        path = os.path.join(tmp, f"vla_h_{mode_name}.bin")
        subprocess.run([exe, "ckpt", "tiny", "1", "4", "4", str(mode), "7", "3", "12", path], check=True,
                       capture_output=True)
        ck = M.read_checkpoint(path)
        stats = np.array([1.0 + i if (i // 4) % 2 else 0.5 + i for i in range(16)], np.float32)
        check(f"checkpoint_write ({mode_name}) -> read_checkpoint: config, mode, step, seed, position, tokenizer, stats",
              ck["config"] == cfg and ck["train_mode"] == mode and (ck["step"], ck["seed"], ck["sampler_pos"]) ==
              (3, 7, 12) and ck["tokenizer"] == "bytes" and np.array_equal(ck["stats"], stats))
        check(f"checkpoint_write ({mode_name}): every weight, frozen ones too, in table order",
              all(np.array_equal(ck["params"][n], w) for n, w in init.items()))
        offsets, numels, total = M.opt_domain(table, mode)
        packed = [k for k, s in enumerate(table) if numels[k] > 0]
        ok = list(ck["m"]) == [table[k].name for k in packed] and all(
            np.array_equal(ck["m"][table[k].name], np.arange(offsets[k], offsets[k] + numels[k], dtype=np.float32)) and
            np.all(ck["v"][table[k].name] == k + 0.5) for k in packed)
        check(f"checkpoint_write ({mode_name}): m and v packed as flow_opt_domain ({len(packed)} tensors, "
              f"{total} elements)", ok)
    path = os.path.join(tmp, "vla_h_all.bin")
    raw = open(path, "rb").read()
    bad = {"version 1": (raw[:4] + np.uint32(1).tobytes() + raw[8:], "has version 1: it holds the model"),
           "version 3": (raw[:4] + np.uint32(3).tobytes() + raw[8:], "has version 3, this oracle reads 2"),
           "truncated": (raw[:-4], "truncated or corrupt"), "short": (raw[:100], "shorter than its header"),
           "foreign": (b"XXXX" + raw[4:], "is neither a train_vla checkpoint nor a debug-state file"),
           "of a bad config": (raw[:8 + 4 * 15] + np.int32(2**30).tobytes() + raw[8 + 4 * 16:], "n_layer"),
           "of train mode 7": (raw[:112] + np.int32(7).tobytes() + raw[116:], "train mode 7"),
           "of family 2": (raw[:116] + np.int32(2).tobytes() + raw[120:], "family 2 is not one of 0 (smolvla) and 1"),
           "without a tokenizer": (raw[:168] + bytes(64) + raw[232:], "names no tokenizer"),
           "at step 5 of 4 samples": (raw[:120] + np.uint64(5).tobytes() + raw[128:136] + np.uint64(4).tobytes() +
                                      raw[144:], "out of range"),
           "with a NaN statistic": (raw[:512] + np.float32(np.nan).tobytes() + raw[516:], "normalization statistic 0")}

    def resealed(data):  # the CRC-32 its bytes now have, as a trainer writing them would write it
        return data[:M.CKPT_CRC_AT] + struct.pack("<I", M.checkpoint_crc(data)) + data[M.CKPT_CRC_AT + 4:]

    at = M.CKPT_HEADER_BYTES + 4 * 16 + 100  # inside the weights (past 16 statistics)
    flipped = raw[:at] + bytes([raw[at] ^ 0x10, raw[at + 1] ^ 0x01]) + raw[at + 2:]
    bad["with two bytes flipped in its weights"] = (flipped, "checksum mismatch: the file is corrupt")
    first = M.param_table(cfg)[0]
    nan_at = M.CKPT_HEADER_BYTES + 4 * 16 + 4 * (first.offset + 3)
    bad["with a NaN weight (its checksum matching)"] = (
        resealed(raw[:nan_at] + np.float32(np.nan).tobytes() + raw[nan_at + 4:]),
        f"weight 3 of {first.name} ({math.prod(first.shape)} elements) = nan: its weights are not finite")
    for what, (data, needle) in bad.items():
        bad_path = os.path.join(tmp, "bad.bin")
        open(bad_path, "wb").write(data)
        rc, text = run(["-i", shard, "--init", bad_path, "-t", "1", "--train", "1"])
        lines = text.strip().splitlines()
        check(f"--init a checkpoint {what}: a one-line error", rc == 1 and len(lines) == 1 and
              lines[0].startswith("error:") and needle in lines[0], lines[-1][:150] if lines else "")
    old_path = os.path.join(tmp, "vla_h_all_unsealed.bin")  # as written before checkpoints carried a checksum
    open(old_path, "wb").write(raw[:M.CKPT_FLAGS_AT] + bytes(8) + raw[M.CKPT_FLAGS_AT + 8:])
    rc, text = run(["-i", shard, "--init", old_path, "-b", "4", "-t", "1", "--train", "1"])
    check("--init a checkpoint without a checksum: loads with a one-line note", rc == 0 and
          text.count("carries no checksum (an older train_vla's): it loaded unverified") == 1, last_line(text))
    for what in ("with two bytes flipped in its weights", "with a NaN weight (its checksum matching)"):
        data, needle = bad[what]
        open(os.path.join(tmp, "bad.bin"), "wb").write(data)
        try:
            M.read_checkpoint(os.path.join(tmp, "bad.bin"))
            check(f"read_checkpoint (export_lerobot's reader) of a checkpoint {what} refuses it", False, "it read it")
        except ValueError as e:
            check(f"read_checkpoint (export_lerobot's reader) of a checkpoint {what} refuses it", needle in str(e),
                  str(e)[:160])
    rc, text = run(["-i", shard, "--init", path, "--train-mode", "expert", "-t", "1", "--train", "1"])
    lines = text.strip().splitlines()
    check("--init a checkpoint of --train-mode all, --train-mode expert: a one-line error naming its mode",
          rc == 1 and len(lines) == 1 and "pass --train-mode all" in lines[0], lines[-1][:150] if lines else "")
    rc, text = run(["-i", shard, "--init", path, "-b", "4", "-t", "1", "--train", "1"])
    check("--init a checkpoint at step 3 --train 1: takes step 4 with its mode and seed", rc == 0 and
          "step 4 loss" in text, last_line(text))


def test_checkpoints(shard, tmp):
    exe = os.path.join(ROOT, "train_vla_cpu")
    if not os.path.exists(exe):
        print(f"SKIP (e) checkpoints: {exe} is absent: build it with `make train_vla_cpu` to check that the oracle "
              "reads and continues the C trainer's checkpoints")
        return
    for preset, mode_name in (("tiny", "all"), ("tiny", "vlm"), ("pi0_tiny", "all")):
        test_c_run(shard, tmp, preset, mode_name)


def test_c_run(shard, tmp, preset, mode_name):
    """./train_vla_cpu's run of `preset` in train mode `mode_name`: its checkpoint after 3 steps against the
    oracle's 3 steps, and the oracle continuing it against the C run's next 3."""
    cfg = dataclasses.replace(M.PRESETS[preset], n_cam=1, state_dim=4, action_dim=4)
    mode = M.TRAIN_MODES.index(mode_name)
    out = os.path.join(tmp, f"c_run_{preset}_{mode_name}")
    rc, text, losses = c_run(shard, out, mode_name, 6, 3, preset=preset)
    if preset != "tiny":
        mode_name = f"{preset} {mode_name}"
    path = os.path.join(out, "ckpt_00000003.bin")
    if not check(f"./train_vla_cpu -p {preset} --train {M.TRAIN_MODES[mode]} writes a checkpoint at step 3", rc == 0 and
                 os.path.exists(path), last_line(text)):
        print(text[-2000:])
        return
    try:
        ck = M.read_checkpoint(path)
    except ValueError as e:
        check(f"{mode_name}: read_checkpoint reads it", False, str(e))
        return
    ds = M.Dataset(shard)
    table = M.param_table(cfg)
    _, _, n_trainable = M.opt_domain(table, mode)
    check(f"{mode_name}: header: config, train mode, step 3, 12 samples, seed, tokenizer, stats",
          ck["config"] == cfg and ck["train_mode"] == mode and ck["step"] == 3 and ck["sampler_pos"] == 12 and
          ck["seed"] == 1234 and ck["tokenizer"] == ds.tokenizer and np.array_equal(ck["stats"], ds.stats()),
          f"{M.param_count(cfg)} weights, {n_trainable} moments each")
    model, opt = oracle_steps(shard, cfg, mode, 3, 1234)
    init = M.param_init(cfg, 1234)
    frozen_same = all(np.array_equal(ck["params"][s.name].reshape(-1)[M.trainable_numel(s, mode):],
                                     init[s.name].reshape(-1)[M.trainable_numel(s, mode):]) for s in table)
    check(f"{mode_name}: frozen weights are the seed's, bit for bit", frozen_same)
    e_w = rel_error(np.concatenate([ck["params"][s.name].reshape(-1) for s in table]),
                    torch.cat([getattr(model, s.name).detach().reshape(-1) for s in table]))
    check(f"{mode_name}: weights after 3 steps = the oracle's", e_w <= TOL_CKPT, f"rel {e_w:.1e}")
    names = [s.name for s in table if M.trainable_numel(s, mode) > 0]
    check(f"{mode_name}: moments of the {len(names)} tensors that train, packed as FlowOptDomain",
          list(ck["m"]) == names and all(ck["m"][n].size == M.trainable_numel(s, mode) for n, s in
                                        zip(names, [s for s in table if s.name in ck["m"]])))
    for k in ("m", "v"):
        e = rel_error(np.concatenate([ck[k][n] for n in names]),
                      torch.cat([getattr(opt, k)[n] for n in names]))
        check(f"{mode_name}: AdamW {k} after 3 steps = the oracle's", e <= TOL_CKPT, f"rel {e:.1e}")
    rc, text = run(["-i", shard, "--init", path, "-b", "4", "-u", "2", "-l", "1e-3", "-n", "6", "--dtype",
                    "float64", "-t", "1", "--train", "3"])
    steps = {int(line.split()[1]): float(line.split()[3]) for line in text.splitlines() if line.startswith("step ")}
    errs = [abs(steps[s] - losses[s]) / losses[s] for s in (4, 5, 6) if s in steps and s in losses]
    check(f"{mode_name}: --init CKPT --train 3 continues the C run: steps 4-6 have its losses",
          rc == 0 and len(errs) == 3 and max(errs) <= TOL_CONTINUE,
          f"rel {max(errs):.1e}" if len(errs) == 3 else last_line(text))


def main():
    torch.set_num_threads(1)
    ref_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "lerobot_ref")
    pi0_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "build", "lerobot_ref_pi0")
    skipped = None
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_table_tool(tmp)
        if exe:
            test_table(exe)
            test_init_and_noise(exe, tmp)
        cases = [os.path.join(ref_dir, c) for c in M.TRAIN_MODES
                 if os.path.isfile(os.path.join(ref_dir, c, "ref.safetensors"))]
        if check(f"LeRobot reference cases in {ref_dir}", len(cases) == 3,
                 f"{len(cases)} of 3 (make them with dev/lerobot/make_ref.py, see dev/lerobot/README.md)"):
            configs = [test_lerobot_case(case, tmp)[0] for case in cases]
            test_policy_cli(cases[0], configs[0], tmp)
        cases = [os.path.join(pi0_dir, c) for c in M.TRAIN_MODES
                 if os.path.isfile(os.path.join(pi0_dir, c, "ref.safetensors"))]
        if not os.path.isdir(pi0_dir):
            skipped = (f"SKIP (a) pi0: {pi0_dir} is absent: make LeRobot's pi0 references with "
                       f"build/lerobot-venv/bin/python dev/lerobot/make_ref.py --family pi0 -o {pi0_dir}")
            print(skipped)
        elif check(f"LeRobot pi0 reference cases in {pi0_dir}", len(cases) == 3,
                   f"{len(cases)} of 3 (make them with dev/lerobot/make_ref.py --family pi0)"):
            configs = [test_lerobot_case(case, tmp, "pi0")[0] for case in cases]
            test_policy_cli(cases[0], configs[0], tmp)
        shard = synthetic(os.path.join(tmp, "x.bin"), "--cams", "1", "--img", "32", "--state", "4", "--action", "4",
                          "--episodes", "4", "--min-len", "6", "--max-len", "12")
        for preset in ("tiny", "pi0_tiny"):
            test_cli(shard, tmp, preset)
        if exe:
            test_checkpoint_files(exe, shard, tmp)
            test_checkpoint_layout(exe, tmp)
        test_checkpoints(shard, tmp)
    print(f"({time.time() - T_START:.1f} s, torch {torch.__version__})")
    if skipped:
        print(skipped)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
