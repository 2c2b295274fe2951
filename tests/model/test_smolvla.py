"""
test_smolvla.py: the oracle (dev/smolvla.py) against LeRobot 0.6.1 itself, SmolVLA and pi0.

For every case folder under REF_DIR (expert, vlm, all: LeRobot's three training modes), made
by dev/lerobot/make_ref.py with LeRobot's own SmolVLAPolicy and pre-processor, it loads the
policy folder and ref.safetensors, runs the oracle in float64 from the raw uint8 frames, raw
state/actions and LeRobot's language tokens, and checks each tensor as its own named check:
relative error ||x - ref|| / ||ref||. Then the same for pi0 on PI0_REF_DIR's cases, made by
dev/lerobot/make_ref.py --family pi0 with LeRobot's own PI0Policy at test sizes (the raw uint8 frames,
the normalized state and actions it was handed; no pre-processor): loss, v_t, every gradient and
the 10-step chunk. Without PI0_REF_DIR the pi0 checks are skipped, and the closing lines say so.

    build/venv/bin/python tests/model/test_smolvla.py build/lerobot_ref [build/lerobot_ref_pi0]

Tolerance: LeRobot computes in float32 (about 6e-8 relative rounding per operation); the
oracle in float64 is exact by comparison, so every difference is LeRobot's accumulated fp32
rounding through a few hundred dependent operations: 1e-5 relative bounds it with margin.
Closing line `N passed, M failed`; exit status 1 on any failure.
"""

import json
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = os.path.join(ROOT, "dev")
sys.path.insert(0, DEV)
import smolvla  # noqa: E402

TOL_FP32_REF = 1e-5  # float64 oracle vs LeRobot's float32: its rounding, ~1e-7 per op, accumulated
TOL_FP32_ORACLE = 1e-4  # float32 oracle vs float32 LeRobot: two independent fp32 roundings, op orders differ

passed, failed = 0, 0
T_START = time.time()


def rel_error(x, ref):
    x, ref = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if x.shape != ref.shape:
        return math.inf
    denom = ref.norm().item()
    diff = (x - ref).norm().item()
    return diff / denom if denom > 0 else diff  # an all-zero reference: the absolute error


def check(name, ok, detail):
    global passed, failed
    passed, failed = passed + bool(ok), failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name:<96} {detail}")


def check_close(name, x, ref, tol):
    err = rel_error(x, ref)
    check(name, err <= tol and not torch.isnan(x).any(), f"rel {err:.2e} (tol {tol:.0e})")
    return err


def check_zero_by_symmetry(name, out, ref, pname):
    """The vision tower's key biases have an exactly zero gradient: adding b to every key adds
    the same q.b to all scores of a query row, and softmax ignores a shift (the vision
    attention has no mask, so every row sees every key). LeRobot's fp32 value is rounding
    noise (~1e-7 of its neighbours), so a relative error to it means nothing; both are
    measured against the same layer's q_proj.bias gradient instead: the oracle must be zero
    to float64 rounding, LeRobot's noise below the 1e-5 fp32 tolerance."""
    scale = ref["grad." + pname.replace("k_proj.bias", "q_proj.bias")].double().norm().item()
    ours = out["grad." + pname].double().norm().item() / scale
    theirs = ref["grad." + pname].double().norm().item() / scale
    check(name, ours <= 1e-12 and theirs <= TOL_FP32_REF,
          f"zero by symmetry: |oracle| {ours:.1e}, |LeRobot| {theirs:.1e} of |grad q_proj.bias|")


def test_case(case_dir, family):
    name = os.path.basename(os.path.normpath(case_dir))
    if family != "smolvla":
        name = f"{family} {name}"
    policy_dir = os.path.join(case_dir, "policy")
    ref = smolvla.load_safetensors(os.path.join(case_dir, "ref.safetensors"))
    with open(os.path.join(case_dir, "case.json")) as f:
        info = json.load(f)

    cfg, P, out = smolvla.run(policy_dir, ref, torch.float64)
    check(f"{name}: the policy folder is a {family} policy", cfg.family == family, cfg.family)

    # parameter table and the training mode's frozen set
    case = os.path.basename(os.path.normpath(case_dir))
    if case in smolvla.TRAIN_MODES:
        mode_cfg = smolvla.with_train_mode(cfg, case)
        check(f"{name}: config.json flags are LeRobot's '{case}' mode", mode_cfg == cfg,
              f"train_expert_only={cfg.train_expert_only} freeze_vision_encoder={cfg.freeze_vision_encoder}")
    total, trainable = smolvla.count_parameters(cfg, P)
    check(f"{name}: parameter count", total == info["params_total"], f"{total} vs LeRobot {info['params_total']}")
    check(f"{name}: trainable parameter count", trainable == info["params_trainable"],
          f"{trainable} vs LeRobot {info['params_trainable']}")
    ours = sorted(n for n in P if smolvla.is_trainable(cfg, n))
    check(f"{name}: trainable tensors are LeRobot's requires_grad set", ours == sorted(info["trainable_names"]),
          f"{len(ours)} vs {len(info['trainable_names'])}")

    G = cfg.resize_hw[0] // cfg.vis_patch if cfg.resize_hw else cfg.vis_image_size // cfg.vis_patch
    ids = smolvla.vision_position_ids(cfg, G, G)
    check(f"{name}: vision position ids are the identity (the C trainers assume it)",
          torch.equal(ids, torch.arange(G * G)), f"{G}x{G} patches on a {cfg.vis_image_size // cfg.vis_patch}-wide table")

    # inputs: the raw frames, the resize-with-padding rule, normalization (pi0's references hand over
    # the frames as LeRobot's datasets do, and the state and actions normalized)
    for key in cfg.cameras:
        cam = key.split(".")[-1]
        if key in ref:
            floats = smolvla.images_from_u8(ref[f"images_u8.{cam}"], torch.float64)
            check_close(f"{name}: {key} = u8 / 255", floats, ref[key], TOL_FP32_REF)
        padding = "centred" if smolvla.pad_centred(cfg) else "left and top"
        check_close(f"{name}: images_prepped.{cam} (resize with padding {padding}, x*2-1)",
                    out[f"images_prepped.{cam}"], ref[f"images_prepped.{cam}"], TOL_FP32_REF)
    if "observation.state" in ref:
        check_close(f"{name}: state_norm", out["state_norm"], ref["state_norm"], TOL_FP32_REF)
        check_close(f"{name}: actions_norm", out["actions_norm"], ref["actions_norm"], TOL_FP32_REF)

    # training forward and backward
    check_close(f"{name}: loss", out["loss"], ref["loss"], TOL_FP32_REF)
    check_close(f"{name}: v_t", out["v_t"], ref["v_t"], TOL_FP32_REF)
    grad_names = sorted(k[len("grad."):] for k in ref if k.startswith("grad."))
    worst = {}  # tower -> (rel err, name): each tower's worst gradient
    for pname in grad_names:
        if pname.startswith(smolvla.modules(cfg).vision) and pname.endswith("self_attn.k_proj.bias"):
            check_zero_by_symmetry(f"{name}: grad.{pname}", out, ref, pname)
        elif "grad." + pname in out:
            err = check_close(f"{name}: grad.{pname}", out["grad." + pname], ref["grad." + pname], TOL_FP32_REF)
            tower = next(t for n, _, t in smolvla.parameter_table(cfg) if n == pname)
            worst[tower] = max(worst.get(tower, (0.0, "")), (err, pname))
        elif P[pname].requires_grad and not ref["grad." + pname].any():
            # pi0's last VLM layer's queries: LeRobot concatenates them with the suffix's into one
            # softmax, so autograd reaches them with zeros; here they are not computed (they feed nothing)
            check(f"{name}: grad.{pname}", True, "zero in LeRobot, none here: the queries feed nothing")
        else:
            check(f"{name}: grad.{pname}", False, "LeRobot has a gradient, the oracle's tensor is frozen")
    for tower, (err, pname) in sorted(worst.items()):
        print(f"     {name}: worst {tower} gradient rel {err:.2e} ({pname})")
    frozen = [n for n in P if not smolvla.is_trainable(cfg, n)]
    leaked = [n for n in frozen if "grad." + n in ref or P[n].requires_grad]
    extra = [n for n in P if "grad." + n in out and "grad." + n not in ref]
    # trainable tensors without a gradient: none in SmolVLA (it freezes what feeds nothing); in pi0
    # what feeds nothing (the lm_heads, the VLM's final norm, the last layer past its keys and
    # values: LeRobot's own list, case.json's none_grad_names)
    none_grad = sorted(n for n in P if smolvla.is_trainable(cfg, n) and "grad." + n not in ref)
    check(f"{name}: no gradient for the {len(frozen)} frozen tensors, nor here where LeRobot has none",
          not leaked and not extra, f"leaked {leaked[:3]} extra {extra[:3]}")
    check(f"{name}: the {len(none_grad)} trainable tensors without a gradient are LeRobot's",
          none_grad == sorted(info.get("none_grad_names", [])), f"{none_grad[:3]}")

    # sampling: 10 Euler steps with the prefix K/V cached
    check_close(f"{name}: chunk_norm (10 Euler steps)", out["chunk_norm"][..., :ref["chunk_norm"].shape[-1]],
                ref["chunk_norm"], TOL_FP32_REF)
    if "chunk" in ref:
        check_close(f"{name}: chunk (un-normalized)", out["chunk"], ref["chunk"], TOL_FP32_REF)

    # the oracle in float32 (what the C trainers compute) stays close too
    _, _, out32 = smolvla.run(policy_dir, {k: v for k, v in ref.items() if not k.startswith("grad.")}, torch.float32)
    check_close(f"{name}: float32 oracle loss", out32["loss"], ref["loss"], TOL_FP32_ORACLE)
    check_close(f"{name}: float32 oracle v_t", out32["v_t"], ref["v_t"], TOL_FP32_ORACLE)
    check_close(f"{name}: float32 oracle chunk_norm", out32["chunk_norm"], ref["chunk_norm"], TOL_FP32_ORACLE)


def test_safetensors_reader():
    """The oracle's safetensors reader (dev/safetensors_format.py's checks): a round trip, and headers
    that are not the format's refused in one line (a list, a tensor without data_offsets, a shape
    whose bytes pass 2^64, two tensors over the same bytes, a name given twice, bytes no tensor
    holds)."""
    import struct
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.safetensors")
        tensors = {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
        smolvla.save_safetensors(path, tensors)
        back = smolvla.load_safetensors(path)
        check("safetensors: a round trip", all(torch.equal(back[k], v) for k, v in tensors.items()), "")
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        x_end = header["x"]["data_offsets"][1]
        twice = json.dumps({"x": header["x"]})[:-1] + ", " + json.dumps({"x": header["x"]})[1:]
        cases = [("a header that is a JSON list", [header], "the header is a JSON list, not an object of tensors"),
                 ("a tensor without data_offsets", {**header, "x": {"dtype": "F32", "shape": [2, 3]}},
                  "tensor x lacks dtype, shape or data_offsets"),
                 ("a shape of [2^40, 2^40]", {**header, "x": {**header["x"], "shape": [2**40, 2**40]}},
                  f"needs {4 * 2**80} bytes"),
                 ("two tensors over the same bytes", {**header, "b": {**header["b"], "data_offsets": [x_end - 4,
                                                                                                     x_end]}},
                  f"tensor b [{x_end - 4}, {x_end}] overlaps tensor x"),
                 ("a name given twice", twice, '"x" stands twice'),
                 ("bytes after the last tensor", {"x": header["x"]}, "bytes of the data section belong to no tensor")]
        for what, bad, needle in cases:
            text = (bad if isinstance(bad, str) else json.dumps(bad)).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
            try:
                smolvla.load_safetensors(path)
                check(f"safetensors: {what}", False, "accepted")
            except ValueError as e:
                check(f"safetensors: {what}", needle in str(e) and "\n" not in str(e), str(e)[-120:])


def reference_cases(root):
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "ref.safetensors"))) \
        if os.path.isdir(root) else []


def main():
    torch.set_num_threads(1)
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[0])
        print("usage: build/venv/bin/python tests/model/test_smolvla.py REF_DIR [PI0_REF_DIR]   (made by "
              "dev/lerobot/make_ref.py --family smolvla and --family pi0; PI0_REF_DIR defaults to "
              "build/lerobot_ref_pi0)")
        sys.exit(2)
    root = sys.argv[1]
    pi0_root = sys.argv[2] if len(sys.argv) == 3 else os.path.join(ROOT, "build", "lerobot_ref_pi0")
    test_safetensors_reader()
    cases = reference_cases(root)
    check(f"reference cases in {root}", len(cases) > 0, f"{cases} (make them with dev/lerobot/make_ref.py)")
    for case in cases:
        test_case(os.path.join(root, case), "smolvla")
    skipped = None
    if os.path.isdir(pi0_root):
        cases = reference_cases(pi0_root)
        check(f"pi0 reference cases in {pi0_root}", len(cases) > 0,
              f"{cases} (make them with dev/lerobot/make_ref.py --family pi0)")
        for case in cases:
            test_case(os.path.join(pi0_root, case), "pi0")
    else:
        skipped = (f"SKIP pi0: {pi0_root} is absent: make LeRobot's pi0 references with "
                   f"build/lerobot-venv/bin/python dev/lerobot/make_ref.py --family pi0 -o {pi0_root} to check the pi0 "
                   "oracle")
        print(skipped)
    print(f"({time.time() - T_START:.1f} s, torch {torch.__version__})")
    if skipped:
        print(skipped)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
