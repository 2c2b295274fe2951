#!/usr/bin/env python3
"""Self-check of the SmolVLA reference files written by make_ref.py.

    build/lerobot-venv/bin/python dev/lerobot/check_ref.py [-d build/lerobot_ref]

For every case folder it reloads policy/ with SmolVLAPolicy.from_pretrained (strict) and the
saved pre/post-processors, rebuilds the batch from the stored raw tensors and task strings,
and recomputes what LeRobot computes: pre-processor outputs, prepared images, loss, v_t,
gradients and the sampled chunk. Everything is compared with ref.safetensors. The last
line is "N passed, M failed"; the exit status is non-zero on any failure.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
VLM_FOLDER = "tiny_smolvlm"
TOL = 1e-6
# Gradients sum many more terms than the loss; same code on the same machine should still
# reproduce them to rounding, so the bound is only slightly looser.
GRAD_TOL = 1e-5


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, label, ok, detail=""):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL {label} {detail}".rstrip(), flush=True)

    def close(self, label, got, want, tol=TOL):
        if got.shape != want.shape:
            self.check(label, False, f"shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        err = rel_err(got, want)
        self.check(label, err <= tol, f"rel err {err:.3g} > {tol:g}")

    def equal(self, label, got, want):
        same = got.shape == want.shape and torch.equal(got, want)
        self.check(label, same, "not identical")


def rel_err(a, b):
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def load_case(case_dir):
    from safetensors.torch import load_file

    with open(case_dir / "case.json") as f:
        info = json.load(f)
    return info, load_file(str(case_dir / "ref.safetensors"))


def vlm_location(policy_dir, out_dir):
    """The stored absolute VLM path, or this tree's copy when the tree was moved."""
    with open(policy_dir / "config.json") as f:
        stored = json.load(f)["vlm_model_name"]
    if Path(stored).is_dir():
        return stored, False
    return str(out_dir / VLM_FOLDER), True


def load_policy(policy_dir, out_dir):
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    vlm, moved = vlm_location(policy_dir, out_dir)
    cfg = PreTrainedConfig.from_pretrained(policy_dir)
    cfg.vlm_model_name = vlm
    policy = SmolVLAPolicy.from_pretrained(policy_dir, config=cfg, strict=True)
    overrides = {"tokenizer_processor": {"tokenizer_name": vlm}} if moved else {}
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(policy_dir),
                                         preprocessor_overrides=overrides)
    return policy, pre, post


def batch_from_ref(info, ref):
    batch = {}
    for cam in info["camera_order"]:
        key = info["cameras"][cam]["key"]
        batch[key] = ref[key].clone()
    batch["observation.state"] = ref["observation.state"].clone()
    batch["action"] = ref["action"].clone()
    batch["action_is_pad"] = ref["action_is_pad"].bool()
    batch["task"] = list(info["tasks"])
    return batch


def check_inputs(t, name, info, ref):
    for cam in info["camera_order"]:
        key = info["cameras"][cam]["key"]
        u8 = ref[f"images_u8.{cam}"]
        h, w = info["cameras"][cam]["height"], info["cameras"][cam]["width"]
        t.check(f"{name}/images_u8.{cam} shape", tuple(u8.shape) == (u8.shape[0], h, w, 3))
        fed = u8.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        t.equal(f"{name}/{key} == u8/255", ref[key], fed)


def check_preprocessor(t, name, batch, ref):
    t.equal(f"{name}/lang_tokens", batch["observation.language.tokens"].to(torch.int64), ref["lang_tokens"])
    t.equal(f"{name}/lang_masks", batch["observation.language.attention_mask"].to(torch.uint8),
            ref["lang_masks"])


def forward_backward(policy, batch, noise, time):
    captured = {}

    def grab(_module, _inputs, output):
        captured["v_t"] = output.detach().clone()

    hook = policy.model.action_out_proj.register_forward_hook(grab)
    try:
        policy.train()
        policy.zero_grad(set_to_none=True)
        loss, _ = policy.forward(batch, noise=noise.clone(), time=time.clone())
        loss.backward()
    finally:
        hook.remove()
    return loss.detach(), captured["v_t"]


def check_grads(t, name, policy, info, ref):
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    ref_grads = sorted(k[len("grad."):] for k in ref if k.startswith("grad."))
    t.check(f"{name}/grad count == trainable", len(ref_grads) == len(trainable),
            f"{len(ref_grads)} grad tensors vs {len(trainable)} trainable")
    t.check(f"{name}/grad names == case.json trainable_names",
            ref_grads == sorted(info["trainable_names"]) == sorted(trainable))
    n_trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    n_total = sum(p.numel() for p in policy.parameters())
    t.check(f"{name}/param counts", (n_trainable, n_total) == (info["params_trainable"], info["params_total"]),
            f"{(n_trainable, n_total)} vs {(info['params_trainable'], info['params_total'])}")
    worst, bad = 0.0, []
    for pname, p in policy.named_parameters():
        if not p.requires_grad or f"grad.{pname}" not in ref:
            continue
        if p.grad is None:
            bad.append(f"{pname}: no grad")
            continue
        err = rel_err(p.grad, ref[f"grad.{pname}"])
        worst = max(worst, err)
        if err > GRAD_TOL:
            bad.append(f"{pname}: {err:.3g}")
    t.check(f"{name}/grads (worst rel err {worst:.3g})", not bad, "; ".join(bad[:5]))


def check_sampling(t, name, policy, post, batch, ref, action_dim):
    policy.eval()
    with torch.no_grad():
        images, masks = policy.prepare_images(batch)
        state = policy.prepare_state(batch)
        chunk_norm = policy.model.sample_actions(
            images, masks, batch["observation.language.tokens"],
            batch["observation.language.attention_mask"], state, noise=ref["sample_noise"].clone())
        policy.reset()
        chunk5 = policy.predict_action_chunk(batch, noise=ref["sample_noise"].clone())
    t.close(f"{name}/chunk_norm", chunk_norm, ref["chunk_norm"])
    t.equal(f"{name}/predict_action_chunk == chunk_norm[..., :{action_dim}]", chunk5,
            chunk_norm[:, :, :action_dim])
    t.close(f"{name}/chunk (post-processed)", post(chunk5), ref["chunk"])


def check_case(t, out_dir, case_dir):
    name = case_dir.name
    info, ref = load_case(case_dir)
    policy, pre, post = load_policy(case_dir / "policy", out_dir)
    check_inputs(t, name, info, ref)

    batch = pre(batch_from_ref(info, ref))
    check_preprocessor(t, name, batch, ref)
    t.close(f"{name}/state_norm", policy.prepare_state(batch), ref["state_norm"])
    t.close(f"{name}/actions_norm", policy.prepare_action(batch), ref["actions_norm"])
    with torch.no_grad():
        prepped, _ = policy.prepare_images(batch)
    for cam, img in zip(info["camera_order"], prepped, strict=True):
        t.close(f"{name}/images_prepped.{cam}", img, ref[f"images_prepped.{cam}"])

    loss, v_t = forward_backward(policy, batch, ref["noise"], ref["time"])
    t.close(f"{name}/loss", loss, ref["loss"])
    t.close(f"{name}/v_t", v_t, ref["v_t"])

    # The loss rule, from the stored tensors alone: what a re-implementation must compute.
    dim = info["action_dim"]
    valid = ~ref["action_is_pad"].bool()
    err = (ref["noise"] - ref["actions_norm"] - ref["v_t"]).pow(2)[:, :, :dim] * valid.unsqueeze(-1)
    t.close(f"{name}/loss from stored tensors", err.sum() / (valid.sum() * dim), ref["loss"])

    check_grads(t, name, policy, info, ref)
    check_sampling(t, name, policy, post, batch, ref, dim)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-d", "--dir", default=str(REPO / "build" / "lerobot_ref"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    out_dir = Path(args.dir).resolve()
    t = Tally()
    cases = sorted(p.parent for p in out_dir.glob("*/ref.safetensors"))
    t.check("reference cases present (expert, vlm, all)",
            {c.name for c in cases} == {"expert", "vlm", "all"}, f"found {[c.name for c in cases]}")
    infos = {}
    for case_dir in cases:
        try:
            infos[case_dir.name] = check_case(t, out_dir, case_dir)
        except Exception:
            traceback.print_exc()
            t.check(f"{case_dir.name}/ran without error", False)
    if len(infos) > 1:
        shas = {i["weights_sha256"] for i in infos.values()}
        t.check("same weights in every case", len(shas) == 1)
        losses = {i["loss"] for i in infos.values()}
        t.check("same loss in every case", len(losses) == 1, str(sorted(losses)))
    print(f"{t.passed} passed, {t.failed} failed", flush=True)
    return 1 if t.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        print("0 passed, 1 failed", flush=True)
        sys.exit(1)
