"""Self-check of the reference files written by make_ref.py, SmolVLA's or pi0's.

    build/lerobot-venv/bin/python dev/lerobot/check_ref.py --family smolvla [-d build/lerobot_ref]
    build/lerobot-venv/bin/python dev/lerobot/check_ref.py --family pi0 [-d build/lerobot_ref_pi0]

SmolVLA: for every case folder it reloads policy/ with SmolVLAPolicy.from_pretrained (strict) and
the saved pre/post-processors, rebuilds the batch from the stored raw tensors and task strings,
and recomputes what LeRobot computes: pre-processor outputs, prepared images, loss, v_t,
gradients and the sampled chunk. Everything is compared with ref.safetensors.

pi0: for every case folder it reloads policy/ with PI0Policy.from_pretrained (strict, at the test
sizes of make_ref.tiny_pi0_sizes) and compares the loaded weights with model.safetensors tensor by
tensor (from_pretrained returns random weights after a loading error, with only a printed
warning). It then rebuilds the batch from the stored tensors and recomputes what LeRobot
computes: prepared images, loss, v_t, every gradient and the sampled chunk (also without the K/V
cache), all compared with ref.safetensors; and the released model's parameter counts.

The last line is "N passed, M failed"; the exit status is non-zero on any failure.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import contextlib
import io
import json
import logging
import sys
import traceback
from pathlib import Path

import torch

from make_ref import (PI0, PI0_EXPERT, PI0_PALIGEMMA, PI0_RELEASED_TOTAL, PI0_RELEASED_USED, SMOLVLA,
                      SMOLVLA_VLM_FOLDER, collect_grads, forward_backward, images_as_fed, pi0_c_config_lines,
                      pi0_released_counts, sample_chunk, state_digest, tiny_pi0_sizes)

REPO = Path(__file__).resolve().parents[2]
# Same code, same inputs, same process settings: the results repeat to the bit; the bound only
# allows for a different CPU's kernels.
TOL = 1e-6
# SmolVLA's gradients sum many more terms than the loss; same code on the same machine should still
# reproduce them to rounding, so the bound is only slightly looser.
GRAD_TOL = 1e-5


# ----------------------------------------------------------------------------------------------
# what both families share

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


# ----------------------------------------------------------------------------------------------
# SmolVLA

def smolvla_vlm_location(policy_dir, out_dir):
    """The stored absolute VLM path, or this tree's copy when the tree was moved."""
    with open(policy_dir / "config.json") as f:
        stored = json.load(f)["vlm_model_name"]
    if Path(stored).is_dir():
        return stored, False
    return str(out_dir / SMOLVLA_VLM_FOLDER), True


def smolvla_load_policy(policy_dir, out_dir):
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    vlm, moved = smolvla_vlm_location(policy_dir, out_dir)
    cfg = PreTrainedConfig.from_pretrained(policy_dir)
    cfg.vlm_model_name = vlm
    policy = SmolVLAPolicy.from_pretrained(policy_dir, config=cfg, strict=True)
    overrides = {"tokenizer_processor": {"tokenizer_name": vlm}} if moved else {}
    pre, post = make_pre_post_processors(cfg, pretrained_path=str(policy_dir),
                                         preprocessor_overrides=overrides)
    return policy, pre, post


def smolvla_batch_from_ref(info, ref):
    batch = {}
    for cam in info["camera_order"]:
        key = info["cameras"][cam]["key"]
        batch[key] = ref[key].clone()
    batch["observation.state"] = ref["observation.state"].clone()
    batch["action"] = ref["action"].clone()
    batch["action_is_pad"] = ref["action_is_pad"].bool()
    batch["task"] = list(info["tasks"])
    return batch


def smolvla_check_inputs(t, name, info, ref):
    for cam in info["camera_order"]:
        key = info["cameras"][cam]["key"]
        u8 = ref[f"images_u8.{cam}"]
        h, w = info["cameras"][cam]["height"], info["cameras"][cam]["width"]
        t.check(f"{name}/images_u8.{cam} shape", tuple(u8.shape) == (u8.shape[0], h, w, 3))
        fed = u8.permute(0, 3, 1, 2).to(torch.float32) / 255.0
        t.equal(f"{name}/{key} == u8/255", ref[key], fed)


def smolvla_check_preprocessor(t, name, batch, ref):
    t.equal(f"{name}/lang_tokens", batch["observation.language.tokens"].to(torch.int64), ref["lang_tokens"])
    t.equal(f"{name}/lang_masks", batch["observation.language.attention_mask"].to(torch.uint8),
            ref["lang_masks"])


def smolvla_check_grads(t, name, policy, info, ref):
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


def smolvla_check_sampling(t, name, policy, post, batch, ref, action_dim):
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


def smolvla_check_case(t, out_dir, case_dir):
    name = case_dir.name
    info, ref = load_case(case_dir)
    policy, pre, post = smolvla_load_policy(case_dir / "policy", out_dir)
    smolvla_check_inputs(t, name, info, ref)

    batch = pre(smolvla_batch_from_ref(info, ref))
    smolvla_check_preprocessor(t, name, batch, ref)
    t.close(f"{name}/state_norm", policy.prepare_state(batch), ref["state_norm"])
    t.close(f"{name}/actions_norm", policy.prepare_action(batch), ref["actions_norm"])
    with torch.no_grad():
        prepped, _ = policy.prepare_images(batch)
    for cam, img in zip(info["camera_order"], prepped, strict=True):
        t.close(f"{name}/images_prepped.{cam}", img, ref[f"images_prepped.{cam}"])

    loss, _, v_t = forward_backward(policy, batch, ref["noise"], ref["time"], SMOLVLA)
    t.close(f"{name}/loss", loss, ref["loss"])
    t.close(f"{name}/v_t", v_t, ref["v_t"])

    # The loss rule, from the stored tensors alone: what a re-implementation must compute.
    dim = info["action_dim"]
    valid = ~ref["action_is_pad"].bool()
    err = (ref["noise"] - ref["actions_norm"] - ref["v_t"]).pow(2)[:, :, :dim] * valid.unsqueeze(-1)
    t.close(f"{name}/loss from stored tensors", err.sum() / (valid.sum() * dim), ref["loss"])

    smolvla_check_grads(t, name, policy, info, ref)
    smolvla_check_sampling(t, name, policy, post, batch, ref, dim)
    return info


# ----------------------------------------------------------------------------------------------
# pi0

def pi0_load_policy(policy_dir):
    """PI0Policy.from_pretrained at the test sizes, and what it printed. Its logged warnings
    (one per patch_embedding key of any checkpoint) are held back."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    log = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with tiny_pi0_sizes(), contextlib.redirect_stdout(log):
            policy = PI0Policy.from_pretrained(policy_dir, strict=True)
    finally:
        logging.disable(logging.NOTSET)
    return policy, log.getvalue()


def pi0_check_weights(t, name, policy, log, policy_dir, info):
    from safetensors.torch import load_file

    t.check(f"{name}/from_pretrained loaded every key", "All keys loaded successfully!" in log, log.strip())
    saved = load_file(str(policy_dir / "model.safetensors"))
    loaded = policy.state_dict()
    t.check(f"{name}/loaded names == saved names", set(loaded) == set(saved),
            f"only loaded: {sorted(set(loaded) - set(saved))[:3]}, only saved: {sorted(set(saved) - set(loaded))[:3]}")
    differ = [k for k in saved if k in loaded and not torch.equal(loaded[k], saved[k])]
    t.check(f"{name}/loaded weights == model.safetensors ({len(saved)} tensors)", not differ, f"differ: {differ[:5]}")
    t.check(f"{name}/weights sha256 == case.json", state_digest(loaded) == info["weights_sha256"])
    shapes = {n: list(p.shape) for n, p in policy.named_parameters()}
    t.check(f"{name}/parameter names and shapes == case.json", shapes == info["param_shapes"])


def pi0_batch_from_ref(info, ref):
    """The policy's batch as make_ref.py fed it: frames as float [0,1], normalized state and
    actions at their real widths, language tokens and mask."""
    batch = {info["cameras"][cam]["key"]: images_as_fed(ref[f"images_u8.{cam}"]) for cam in info["camera_order"]}
    batch["observation.state"] = ref["state_norm"][:, :info["state_dim"]].clone()
    batch["action"] = ref["actions_norm"][:, :, :info["action_dim"]].clone()
    batch["action_is_pad"] = ref["action_is_pad"].bool()
    batch["observation.language.tokens"] = ref["lang_tokens"].clone()
    batch["observation.language.attention_mask"] = ref["lang_masks"].bool()
    return batch


def pi0_check_inputs(t, name, info, ref, c_config):
    for cam in info["camera_order"]:
        h, w = info["cameras"][cam]["height"], info["cameras"][cam]["width"]
        t.check(f"{name}/images_u8.{cam} shape", tuple(ref[f"images_u8.{cam}"].shape) == (info["batch_size"], h, w, 3))
    tokens, masks = ref["lang_tokens"], ref["lang_masks"].bool()
    t.check(f"{name}/lang_tokens length == max_text", tokens.shape[1] == int(c_config["max_text"]))
    t.check(f"{name}/lang_tokens right-padded with the pad id",
            torch.equal(masks, torch.arange(tokens.shape[1]) < masks.sum(1, keepdim=True))
            and bool((tokens[~masks] == info["pad_token_id"]).all()))
    t.check(f"{name}/state_norm zero past state_dim", not torch.any(ref["state_norm"][:, info["state_dim"]:]))
    t.check(f"{name}/actions_norm zero past action_dim", not torch.any(ref["actions_norm"][:, :, info["action_dim"]:]))
    actions = ref["actions_norm"]
    repeats = all(torch.equal(actions[b, n:], actions[b, n - 1].expand_as(actions[b, n:]))
                  for b, n in enumerate(info["valid_steps"]))
    t.check(f"{name}/padded chunk slots repeat the last real action", repeats)
    valid = (~ref["action_is_pad"].bool()).sum(1).tolist()
    t.check(f"{name}/action_is_pad valid slots", valid == info["valid_steps"], str(valid))


def pi0_expected_grad_gaps(info, n_layer):
    """Trainable parameters whose gradient is all zero, and those that get none. The last VLM
    layer's prefix output and the VLM's final norm feed nothing; that layer's q_proj still
    lies on the graph (its queries are concatenated with the expert's) but only through
    zeros. Neither lm_head is used."""
    last = f"model.{PI0_PALIGEMMA}model.language_model.layers.{n_layer - 1}."
    heads = [f"model.{PI0_PALIGEMMA}lm_head.weight", f"model.{PI0_EXPERT}lm_head.weight"]
    if info["flags"]["train_expert_only"]:
        return [], heads[1:]
    dead = [last + s for s in ("self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight", "post_attention_layernorm.weight")]
    final_norm = f"model.{PI0_PALIGEMMA}model.language_model.norm.weight"
    return [last + "self_attn.q_proj.weight"], sorted(heads + dead + [final_norm])


def pi0_check_grads(t, name, policy, info, ref, n_layer):
    grads, trainable, zero_grad, none_grad = collect_grads(policy)
    t.check(f"{name}/trainable names == case.json", trainable == info["trainable_names"])
    n_trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    t.check(f"{name}/trainable count", n_trainable == info["params_trainable"], f"{n_trainable}")
    stored = sorted(k[len("grad."):] for k in ref if k.startswith("grad."))
    t.check(f"{name}/grad names == stored", sorted(grads) == stored,
            f"{len(grads)} grads vs {len(stored)} stored")
    t.check(f"{name}/all-zero grads == case.json", zero_grad == info["zero_grad_names"], str(zero_grad))
    t.check(f"{name}/missing grads == case.json", none_grad == info["none_grad_names"], str(none_grad))
    want_zero, want_none = pi0_expected_grad_gaps(info, n_layer)
    t.check(f"{name}/all-zero grads are the last VLM layer's q_proj", sorted(zero_grad) == sorted(want_zero))
    t.check(f"{name}/missing grads are the unused outputs", sorted(none_grad) == want_none, str(none_grad))
    worst, bad = 0.0, []
    for pname, g in grads.items():
        if f"grad.{pname}" not in ref:
            continue
        want = ref[f"grad.{pname}"]
        err = 0.0 if torch.equal(g, want) else rel_err(g, want)
        worst = max(worst, err)
        if err > TOL or g.shape != want.shape:
            bad.append(f"{pname}: {err:.3g}")
    t.check(f"{name}/grads (worst rel err {worst:.3g})", not bad, "; ".join(bad[:5]))


def pi0_sample_without_cache(policy, batch, noise):
    """LeRobot's Euler loop with the prefix recomputed at every step: one joint forward of
    prefix and suffix (the training path), no K/V cache. What a trainer that samples that way
    must match."""
    from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d

    model, cfg = policy.model, policy.config
    policy.eval()
    with torch.no_grad():
        images, img_masks = policy._preprocess_images(batch)
        state = policy.prepare_state(batch)
        prefix, prefix_pad, prefix_att = model.embed_prefix(
            images, img_masks, batch["observation.language.tokens"], batch["observation.language.attention_mask"])
        x_t, dt = noise.clone(), -1.0 / cfg.num_inference_steps
        for step in range(cfg.num_inference_steps):
            time = torch.full((x_t.shape[0],), 1.0 + step * dt, dtype=torch.float32)
            suffix, suffix_pad, suffix_att, _ = model.embed_suffix(state, x_t, time)
            pad = torch.cat([prefix_pad, suffix_pad], dim=1)
            att = torch.cat([prefix_att, suffix_att], dim=1)
            (_, out), _ = model.paligemma_with_expert.forward(
                attention_mask=prepare_attention_masks_4d(make_att_2d_masks(pad, att)),
                position_ids=torch.cumsum(pad, dim=1) - 1, past_key_values=None,
                inputs_embeds=[prefix, suffix], use_cache=False, adarms_cond=[None, None])
            x_t = x_t + dt * model.action_out_proj(out[:, -cfg.chunk_size:].to(torch.float32))
    return x_t


def pi0_check_case(t, out_dir, case_dir):
    name = case_dir.name
    info, ref = load_case(case_dir)
    policy, log = pi0_load_policy(case_dir / "policy")
    pi0_check_weights(t, name, policy, log, case_dir / "policy", info)

    with open(case_dir / "c_config.txt") as f:
        stored_lines = f.read().splitlines()
    t.check(f"{name}/c_config.txt == the loaded model's", pi0_c_config_lines(policy) == stored_lines)
    c_config = dict(line.split(" ", 1) for line in stored_lines)
    t.check(f"{name}/pad id == case.json", int(c_config["pad_token"]) == info["pad_token_id"])
    pi0_check_inputs(t, name, info, ref, c_config)

    batch = pi0_batch_from_ref(info, ref)
    t.close(f"{name}/state_norm", policy.prepare_state(batch), ref["state_norm"])
    t.close(f"{name}/actions_norm", policy.prepare_action(batch), ref["actions_norm"])
    with torch.no_grad():
        prepped, _ = policy._preprocess_images(batch)
    for cam, img in zip(info["camera_order"], prepped, strict=True):
        t.close(f"{name}/images_prepped.{cam}", img, ref[f"images_prepped.{cam}"])

    loss, _, v_t = forward_backward(policy, batch, ref["noise"], ref["time"], PI0)
    t.close(f"{name}/loss", loss, ref["loss"])
    t.close(f"{name}/v_t", v_t, ref["v_t"])

    # The loss rule, from the stored tensors alone: a plain mean over (batch, chunk, real action
    # dims); action_is_pad plays no part (SmolVLA's masked mean differs here, as it must).
    dim = info["action_dim"]
    err = (ref["noise"] - ref["actions_norm"] - ref["v_t"]).pow(2)[:, :, :dim]
    t.close(f"{name}/loss from stored tensors", err.mean(), ref["loss"])
    valid = ~ref["action_is_pad"].bool()
    masked = (err * valid.unsqueeze(-1)).sum() / (valid.sum() * dim)
    t.check(f"{name}/loss is not the action_is_pad-masked mean", rel_err(masked, ref["loss"]) > 1e-3)

    pi0_check_grads(t, name, policy, info, ref, int(c_config["n_layer"]))

    chunk_norm, _ = sample_chunk(policy, batch, ref["sample_noise"], PI0)
    t.close(f"{name}/chunk_norm", chunk_norm, ref["chunk_norm"])
    t.close(f"{name}/chunk_norm == joint forward per step (no K/V cache)",
            pi0_sample_without_cache(policy, batch, ref["sample_noise"]), ref["chunk_norm"])
    return info


def pi0_check_released(t, out_dir):
    with open(out_dir / "released_counts.json") as f:
        stored = json.load(f)
    counts = pi0_released_counts()
    t.check("released counts == released_counts.json", counts == stored)
    t.check(f"released total {counts['total']:,} == {PI0_RELEASED_TOTAL:,}", counts["total"] == PI0_RELEASED_TOTAL)
    t.check(f"released used {counts['used']:,} == {PI0_RELEASED_USED:,}", counts["used"] == PI0_RELEASED_USED)
    t.check("released: everything trains in 'all'", counts["trainable"]["all"] == counts["used"])


# ----------------------------------------------------------------------------------------------
# main

FAMILIES = {"smolvla": (smolvla_check_case, "lerobot_ref"), "pi0": (pi0_check_case, "lerobot_ref_pi0")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), default="smolvla",
                    help="the policy whose references are checked (default smolvla)")
    ap.add_argument("-d", "--dir", help="the references (default build/lerobot_ref, for pi0 build/lerobot_ref_pi0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)

    check_case, default_dir = FAMILIES[args.family]
    out_dir = Path(args.dir or REPO / "build" / default_dir).resolve()
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
    if args.family == "pi0":
        try:
            pi0_check_released(t, out_dir)
        except Exception:
            traceback.print_exc()
            t.check("released counts ran without error", False)
    print(f"{t.passed} passed, {t.failed} failed", flush=True)
    return 1 if t.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        print("0 passed, 1 failed", flush=True)
        sys.exit(1)
