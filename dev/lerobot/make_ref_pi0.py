#!/usr/bin/env python3
"""Ground-truth reference files computed by LeRobot 0.6.1's own PI0Policy, at test sizes.

Run with the pinned venv (see requirements.txt next to this file):

    build/lerobot-venv/bin/python dev/lerobot/make_ref_pi0.py -o build/lerobot_ref_pi0

PI0Config has no size settings, so the sizes are replaced at run time (tiny_pi0_sizes): the
names that modeling_pi0 builds its configs and models with are swapped for small versions,
and LeRobot's own code builds the whole module tree at those sizes. On that policy (random
seeded weights) it runs forward + backward with fixed noise and time, samples a 10-step
Euler chunk, and writes everything under OUT/<case>/ for the three training modes (expert,
vlm, all), plus the released model's parameter counts (OUT/released_counts.json). See
README.md ("pi0") for the meaning of every file and tensor.
"""

import os

# Must be set before transformers/huggingface_hub are imported: nothing may be fetched.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import contextlib
import json
import math
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

from make_ref import (CASES, cam_key, images_as_fed, perturb_constant_params, rel_err, safetensors_keys,
                      setup_torch, state_digest, versions)

SEED = 1234
BATCH = 3

# The pi0_tiny preset's sizes. SigLIP: image 32 (PI0Config.image_resolution), patch 8, so 16
# tokens a camera; the projector maps the vision width to the VLM width.
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8)
# The two Gemmas, in the fields of LeRobot's GemmaConfig (what get_gemma_config returns). The
# joint attention reshapes to 8 heads (compute_layer_complete), so both keep 8 heads of one size.
GEMMA = {
    "gemma_2b": dict(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8),    # the VLM
    "gemma_300m": dict(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),   # the expert
}
VOCAB = 256

POLICY = dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32, num_inference_steps=10,
              image_resolution=(32, 32), tokenizer_max_length=16, dtype="float32")

STATE_DIM = 6
ACTION_DIM = 5

# (height, width) as a dataset stores frames; the policy resizes both to 32x32 keeping the
# aspect ratio and pads the rest with zeros, centred.
CAMERAS = {"top": (36, 60), "wrist": (96, 80)}

# Language tokens as PaliGemma's pre-processor hands them over: bos first, right-padded with
# the pad id to tokenizer_max_length. Different lengths, one of them full.
BOS_ID = 2
TOKEN_LENGTHS = [7, 16, 11]
# Number of valid chunk slots per sample; the rest of the chunk ran past the episode's end.
VALID_STEPS = [8, 5, 2]

# The released model's counts (PaliGemma 3B + Gemma 300M); check_ref_pi0.py holds them to these.
RELEASED_TOTAL = 4_028_019_472
RELEASED_USED = 3_238_048_528

# Every parameter belongs to one part, by the start of its name under PI0Pytorch.
PALIGEMMA = "paligemma_with_expert.paligemma."
EXPERT = "paligemma_with_expert.gemma_expert."
PARTS = {
    "vision": (PALIGEMMA + "model.vision_tower.",),
    "projector": (PALIGEMMA + "model.multi_modal_projector.",),
    "embedding": (PALIGEMMA + "model.language_model.embed_tokens.",),
    "vlm_layers": (PALIGEMMA + "model.language_model.layers.",),
    "vlm_norm": (PALIGEMMA + "model.language_model.norm.",),
    "expert_layers": (EXPERT + "model.layers.",),
    "expert_norm": (EXPERT + "model.norm.",),
    "projections": ("state_proj.", "action_in_proj.", "action_out_proj.", "action_time_mlp_in.",
                    "action_time_mlp_out."),
    "lm_heads": (PALIGEMMA + "lm_head.", EXPERT + "lm_head."),
}


# ----------------------------------------------------------------------------------------------
# the test sizes

def shrink_paligemma_config(config):
    """PaliGemmaWithExpertModel.__init__ has set the text sizes from get_gemma_config and the
    image size from image_resolution; vision widths, the projector and the vocabulary it fixes
    at the released values. Those are replaced here, before the model is built from them."""
    for key, value in VISION.items():
        setattr(config.vision_config, key, value)
    config.projection_dim = config.text_config.hidden_size
    config.vision_config.projection_dim = config.text_config.hidden_size
    config.vocab_size = VOCAB
    config.text_config.vocab_size = VOCAB
    config.image_token_index = VOCAB  # LeRobot's convention: one past the vocabulary (unused by pi0)


@contextlib.contextmanager
def tiny_pi0_sizes():
    """Inside, every PI0Policy / PI0Pytorch built has the test sizes above; LeRobot's files are
    not touched. modeling_pi0 looks these three names up in its own namespace when it builds a
    model, so replacing them there is enough."""
    from lerobot.policies.pi0 import modeling_pi0

    real = {name: getattr(modeling_pi0, name)
            for name in ("get_gemma_config", "PaliGemmaForConditionalGenerationWithPiGemma", "PiGemmaForCausalLM")}

    def tiny_gemma_config(variant):
        return modeling_pi0.GemmaConfig(**GEMMA[variant])

    class TinyPaliGemma(real["PaliGemmaForConditionalGenerationWithPiGemma"]):
        def __init__(self, config):
            shrink_paligemma_config(config)
            super().__init__(config)

    class TinyExpert(real["PiGemmaForCausalLM"]):
        def __init__(self, config, **kwargs):
            config.vocab_size = VOCAB
            super().__init__(config, **kwargs)

    modeling_pi0.get_gemma_config = tiny_gemma_config
    modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma = TinyPaliGemma
    modeling_pi0.PiGemmaForCausalLM = TinyExpert
    try:
        yield
    finally:
        for name, value in real.items():
            setattr(modeling_pi0, name, value)


def make_policy_config(train_expert_only, freeze_vision_encoder):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    inputs = {cam_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for c, (h, w) in CAMERAS.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return PI0Config(input_features=inputs, output_features=outputs, device="cpu", push_to_hub=False,
                     train_expert_only=train_expert_only, freeze_vision_encoder=freeze_vision_encoder, **POLICY)


def c_config_lines(policy):
    """The C trainers' config as "name value" lines, read off the built model (so a size that
    did not take shows here)."""
    cfg = policy.config
    pwe = policy.model.paligemma_with_expert
    vision = pwe.paligemma.config.vision_config
    text = pwe.paligemma.config.text_config
    expert = pwe.gemma_expert.config
    embed = pwe.paligemma.model.language_model.embed_tokens
    projector = pwe.paligemma.model.multi_modal_projector.linear
    # the C model runs both stacks through one attention: heads, KV heads and head size are shared
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers"):
        if getattr(text, key) != getattr(expert, key):
            raise RuntimeError(f"VLM and expert differ in {key}: {getattr(text, key)} vs {getattr(expert, key)}")
    # PaliGemma has no pixel shuffle: the projector reads one patch per token
    scale_factor = math.isqrt(projector.in_features // vision.hidden_size)
    rope_theta = text.rope_parameters["rope_theta"]
    fields = [
        ("n_cam", len(cfg.image_features)),
        ("state_dim", cfg.input_features["observation.state"].shape[0]),
        ("action_dim", cfg.output_features["action"].shape[0]),
        ("img", vision.image_size),
        ("patch", vision.patch_size),
        ("vis_width", vision.hidden_size),
        ("vis_ff", vision.intermediate_size),
        ("vis_layers", vision.num_hidden_layers),
        ("vis_heads", vision.num_attention_heads),
        ("scale_factor", scale_factor),
        ("vocab", embed.num_embeddings),
        ("pad_token", embed.padding_idx),
        ("max_text", cfg.tokenizer_max_length),
        ("d_model", text.hidden_size),
        ("d_ff", text.intermediate_size),
        ("n_layer", text.num_hidden_layers),
        ("n_head", text.num_attention_heads),
        ("n_kv_head", text.num_key_value_heads),
        ("head_dim", text.head_dim),
        ("d_expert", expert.hidden_size),
        ("d_expert_ff", expert.intermediate_size),
        ("self_attn_every", 1),  # every pi0 layer is joint self-attention (no cross-attention layers)
        ("chunk", cfg.chunk_size),
        ("max_state_dim", cfg.max_state_dim),
        ("max_action_dim", cfg.max_action_dim),
        ("rope_theta", int(rope_theta) if float(rope_theta).is_integer() else rope_theta),
        ("family", 1),  # 0 SmolVLA, 1 pi0
    ]
    return [f"{name} {value}" for name, value in fields]


# ----------------------------------------------------------------------------------------------
# parameter counts

def part_of(name):
    """The PARTS entry a PI0Pytorch parameter name falls in."""
    found = [part for part, starts in PARTS.items() if name.startswith(starts)]
    if len(found) != 1:
        raise RuntimeError(f"parameter {name} falls in parts {found}, expected exactly one")
    return found[0]


def part_counts(model):
    """Parameter counts of a PI0Pytorch by part; lm_heads are counted but are not 'used'."""
    counts = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():
        counts[part_of(name)] += p.numel()
    total = sum(counts.values())
    return {"total": total, "lm_heads": counts["lm_heads"], "used": total - counts["lm_heads"],
            "parts": counts}


def trainable_counts(model):
    """Trainable parameters (lm_heads excluded) under each case's flags, set by LeRobot's own
    PaliGemmaWithExpertModel._set_requires_grad on the one model."""
    pwe = model.paligemma_with_expert
    counts = {}
    for case, flags in CASES.items():
        for p in model.parameters():
            p.requires_grad_(True)
        pwe.freeze_vision_encoder = flags["freeze_vision_encoder"]
        pwe.train_expert_only = flags["train_expert_only"]
        pwe._set_requires_grad()
        counts[case] = sum(p.numel() for n, p in model.named_parameters()
                           if p.requires_grad and part_of(n) != "lm_heads")
    return counts


def released_counts():
    """The released model (gemma_2b + gemma_300m at 224 px), built on the meta device with the
    real sizes: shapes only, no memory."""
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Pytorch

    with torch.device("meta"):
        model = PI0Pytorch(PI0Config(device="cpu"))
    counts = part_counts(model)
    counts["trainable"] = trainable_counts(model)
    return counts


# ----------------------------------------------------------------------------------------------
# the batch

def make_data(seed):
    """Frames as a dataset stores them, language tokens as the pre-processor makes them,
    normalized state and actions (the policy pads them to 32)."""
    g = torch.Generator().manual_seed(seed)
    data = {}
    for cam, (h, w) in CAMERAS.items():
        data[f"images_u8.{cam}"] = torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)

    length = POLICY["tokenizer_max_length"]
    tokens = torch.zeros(BATCH, length, dtype=torch.int64)  # pad id 0 (checked against the model)
    masks = torch.zeros(BATCH, length, dtype=torch.bool)
    for b, n in enumerate(TOKEN_LENGTHS):
        tokens[b, 0] = BOS_ID
        tokens[b, 1:n] = torch.randint(BOS_ID + 1, VOCAB, (n - 1,), generator=g)
        masks[b, :n] = True
    data["lang_tokens"] = tokens
    data["lang_masks"] = masks

    data["state"] = torch.randn(BATCH, STATE_DIM, generator=g)
    action = torch.randn(BATCH, POLICY["chunk_size"], ACTION_DIM, generator=g)
    is_pad = torch.zeros(BATCH, POLICY["chunk_size"], dtype=torch.bool)
    for b, n in enumerate(VALID_STEPS):
        is_pad[b, n:] = True
        # LeRobot clamps out-of-episode indices, so padded slots repeat the last real frame.
        action[b, n:] = action[b, n - 1]
    data["action"] = action
    data["action_is_pad"] = is_pad
    return data


def make_policy_batch(data):
    batch = {cam_key(c): images_as_fed(data[f"images_u8.{c}"]) for c in CAMERAS}
    batch["observation.state"] = data["state"].clone()
    batch["action"] = data["action"].clone()
    batch["action_is_pad"] = data["action_is_pad"].clone()
    batch["observation.language.tokens"] = data["lang_tokens"].clone()
    batch["observation.language.attention_mask"] = data["lang_masks"].clone()
    return batch


def make_flow_inputs(seed, cfg):
    """The training step's noise and time (PI0Policy.forward samples them itself: they are fed
    in by forward_backward) and the noise that starts sampling."""
    from lerobot.policies.common.flow_matching import sample_time_beta

    shape = (BATCH, cfg.chunk_size, cfg.max_action_dim)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(shape, generator=g)
    sample_noise = torch.randn(shape, generator=g)
    torch.manual_seed(seed)
    # pi0's own distribution: Beta(1.5, 1) * 0.999 + 0.001, in (0.001, 1)
    t = sample_time_beta(BATCH, "cpu", alpha=cfg.time_sampling_beta_alpha, beta=cfg.time_sampling_beta_beta,
                         scale=cfg.time_sampling_scale, offset=cfg.time_sampling_offset)
    return noise, t, sample_noise


# ----------------------------------------------------------------------------------------------
# LeRobot's computation

def forward_backward(policy, batch, noise, t):
    """LeRobot's training step (without the optimizer) with the given noise and time, capturing
    v_t on the way."""
    model = policy.model
    captured = {}

    def grab(_module, _inputs, output):
        captured["v_t"] = output.detach().clone()

    def fixed_noise(shape, _device):
        if tuple(shape) != tuple(noise.shape):
            raise RuntimeError(f"noise of shape {tuple(shape)} asked, {tuple(noise.shape)} given")
        return noise.clone()

    def fixed_time(bsize, _device):
        if bsize != t.shape[0]:
            raise RuntimeError(f"time for {bsize} samples asked, {t.shape[0]} given")
        return t.clone()

    hook = model.action_out_proj.register_forward_hook(grab)
    model.sample_noise = fixed_noise
    model.sample_time = fixed_time
    try:
        policy.train()
        policy.zero_grad(set_to_none=True)
        loss, loss_dict = policy.forward(batch)
        loss.backward()
    finally:
        hook.remove()
        del model.sample_noise
        del model.sample_time
    return loss.detach(), loss_dict, captured["v_t"]


def collect_grads(policy):
    """Every .grad after backward, and which trainable parameters got an all-zero gradient or
    none at all (outputs that feed nothing)."""
    grads, trainable, zero_grad, none_grad = {}, [], [], []
    for name, p in policy.named_parameters():
        if p.requires_grad:
            trainable.append(name)
        if p.grad is None:
            if p.requires_grad:
                none_grad.append(name)
            continue
        grads[name] = p.grad.detach().clone().contiguous()
        if not torch.any(grads[name]):
            zero_grad.append(name)
    return grads, trainable, zero_grad, none_grad


def reference_loss(v_t, noise, actions_norm, action_dim):
    """The loss rule pi0 applies, recomputed as a self-check: a plain mean over (batch, chunk,
    real action dims); unlike SmolVLA, action_is_pad is not used."""
    return (noise - actions_norm - v_t).pow(2)[:, :, :action_dim].mean()


def sample_chunk(policy, batch, sample_noise):
    """The 32-dim Euler result, after checking that predict_action_chunk gives its first dims."""
    policy.eval()
    with torch.no_grad():
        images, img_masks = policy._preprocess_images(batch)
        state = policy.prepare_state(batch)
        full = policy.model.sample_actions(
            images, img_masks, batch["observation.language.tokens"],
            batch["observation.language.attention_mask"], state, noise=sample_noise.clone())
        policy.reset()
        sliced = policy.predict_action_chunk(batch, noise=sample_noise.clone())
    if not torch.equal(full[:, :, :sliced.shape[-1]], sliced):
        raise RuntimeError("sample_actions and predict_action_chunk disagree")
    return full


def build_policy(flags, base_state):
    """PI0Policy at the test sizes: LeRobot's init under the seed, then the jitter (first case),
    or the first case's weights verbatim."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    cfg = make_policy_config(**flags)
    with tiny_pi0_sizes():
        torch.manual_seed(SEED)
        policy = PI0Policy(cfg)
    if base_state is None:
        perturb_constant_params(policy, SEED + 3)
    else:
        policy.load_state_dict(base_state, strict=True)
    assert_no_dropout(policy)
    return policy


def assert_no_dropout(policy):
    """Training runs in policy.train(); with every dropout probability at 0 it is as
    deterministic as eval()."""
    pwe = policy.model.paligemma_with_expert
    probs = {"text.attention_dropout": pwe.paligemma.config.text_config.attention_dropout,
             "vision.attention_dropout": pwe.paligemma.config.vision_config.attention_dropout,
             "expert.attention_dropout": pwe.gemma_expert.config.attention_dropout}
    probs.update({f"module {n}": m.p for n, m in policy.named_modules() if isinstance(m, torch.nn.Dropout)})
    live = {k: v for k, v in probs.items() if v}
    if live:
        raise RuntimeError(f"dropout is active: {live}")


# ----------------------------------------------------------------------------------------------
# one case

def run_case(name, flags, data, out_dir, base_state):
    from safetensors.torch import save_file

    policy = build_policy(flags, base_state)
    cfg = policy.config
    # the embedding's padding_idx (its row zero, its gradient zero) is the id the batch pads with
    pad_id = policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.padding_idx
    if pad_id != 0:
        raise RuntimeError(f"{name}: pad id {pad_id}, but the batch pads the language tokens with 0")
    noise, t, sample_noise = make_flow_inputs(SEED + 2, cfg)
    batch = make_policy_batch(data)

    loss, loss_dict, v_t = forward_backward(policy, batch, noise, t)
    grads, trainable, zero_grad, none_grad = collect_grads(policy)

    state_norm = policy.prepare_state(batch)
    actions_norm = policy.prepare_action(batch)
    check = reference_loss(v_t, noise, actions_norm, ACTION_DIM)
    if rel_err(check, loss) > 1e-6:
        raise RuntimeError(f"{name}: loss {loss.item()} does not follow the expected rule ({check.item()})")
    with torch.no_grad():
        prepped, _ = policy._preprocess_images(batch)
    chunk_norm = sample_chunk(policy, batch, sample_noise)

    case_dir = out_dir / name
    policy_dir = case_dir / "policy"
    policy_dir.mkdir(parents=True)
    policy.save_pretrained(policy_dir)

    ref = {}
    for cam in CAMERAS:
        ref[f"images_u8.{cam}"] = data[f"images_u8.{cam}"]
    ref["lang_tokens"] = data["lang_tokens"]
    ref["lang_masks"] = data["lang_masks"].to(torch.uint8)
    ref["state_norm"] = state_norm
    ref["actions_norm"] = actions_norm
    ref["action_is_pad"] = data["action_is_pad"].to(torch.uint8)
    ref["noise"] = noise
    ref["time"] = t
    for cam, img in zip(CAMERAS, prepped, strict=True):
        ref[f"images_prepped.{cam}"] = img
    ref["loss"] = loss.reshape(())
    ref["v_t"] = v_t
    for pname, g in grads.items():
        ref[f"grad.{pname}"] = g
    ref["sample_noise"] = sample_noise
    ref["chunk_norm"] = chunk_norm
    ref = {k: v.detach().contiguous() for k, v in ref.items()}
    save_file(ref, str(case_dir / "ref.safetensors"))

    with open(case_dir / "c_config.txt", "w") as f:
        f.write("\n".join(c_config_lines(policy)) + "\n")

    saved_names = set(safetensors_keys(policy_dir / "model.safetensors"))
    missing = [n for n in grads if n not in saved_names]
    if missing:
        raise RuntimeError(f"{name}: grad names not in model.safetensors: {missing[:5]}")

    pwe = policy.model.paligemma_with_expert
    counts = part_counts(policy.model)
    n_trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    info = {
        "case": name,
        "flags": flags,
        "seed": SEED,
        "weights": "LeRobot/transformers random init under torch.manual_seed(seed), then every "
                   "all-ones/all-zeros 1-D parameter (norm weights, biases) jittered; "
                   "identical in all cases (see weights_sha256)",
        "batch_size": BATCH,
        "camera_order": list(CAMERAS),
        "cameras": {c: {"key": cam_key(c), "height": h, "width": w} for c, (h, w) in CAMERAS.items()},
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "token_lengths": TOKEN_LENGTHS,
        "bos_id": BOS_ID,
        "pad_token_id": pad_id,
        "valid_steps": VALID_STEPS,
        "loss_uses_action_is_pad": False,
        "settings": {"policy": dict(POLICY, paligemma_variant=cfg.paligemma_variant,
                                    action_expert_variant=cfg.action_expert_variant,
                                    min_period=cfg.min_period, max_period=cfg.max_period,
                                    time_sampling=[cfg.time_sampling_beta_alpha, cfg.time_sampling_beta_beta,
                                                   cfg.time_sampling_scale, cfg.time_sampling_offset]),
                     "vision": VISION, "gemma": GEMMA, "vocab_size": VOCAB},
        "vision_config": pwe.paligemma.config.vision_config.to_dict(),
        "text_config": pwe.paligemma.config.text_config.to_dict(),
        "expert_config": pwe.gemma_expert.config.to_dict(),
        "vision_attn_implementation": pwe.paligemma.config.vision_config._attn_implementation,
        "params_total": counts["total"],
        "params_lm_heads": counts["lm_heads"],
        "params_used": counts["used"],
        "params_parts": counts["parts"],
        "params_trainable": n_trainable,
        "trainable_names": trainable,
        "zero_grad_names": zero_grad,
        "none_grad_names": none_grad,
        "num_grad_tensors": len(grads),
        "param_shapes": {n: list(p.shape) for n, p in policy.named_parameters()},
        "weights_sha256": state_digest(policy.state_dict()),
        "forward_mode": "policy.train() as in LeRobot training; all dropout probabilities are 0",
        "sample_mode": "policy.eval(), prefix K/V computed once",
        "loss": loss.item(),
        "loss_dict": loss_dict,
        "versions": versions(),
    }
    with open(case_dir / "case.json", "w") as f:
        json.dump(info, f, indent=1)
    print(f"{name}: loss {loss.item():.9g} trainable {n_trainable} / total {counts['total']} "
          f"({len(grads)} grad tensors, {len(zero_grad)} all zero, {len(none_grad)} trainable without one)",
          flush=True)
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def print_released(counts):
    print(f"released pi0: {counts['total']:,} parameters, {counts['lm_heads']:,} in the two lm_heads, "
          f"{counts['used']:,} used", flush=True)
    print("  " + ", ".join(f"{part} {n:,}" for part, n in counts["parts"].items()), flush=True)
    print("  trainable without lm_heads: " + ", ".join(f"{c} {n:,}" for c, n in counts["trainable"].items()),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", required=True, help="output folder (recreated)")
    args = ap.parse_args()

    t0 = time.time()
    setup_torch()
    out_dir = Path(args.out).resolve()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)

    released = released_counts()
    print_released(released)
    with open(out_dir / "released_counts.json", "w") as f:
        json.dump(released, f, indent=1)

    data = make_data(SEED + 1)
    base_state = None
    for name, flags in CASES.items():
        state = run_case(name, flags, data, out_dir, base_state)
        if base_state is None:
            base_state = state
    print(f"wrote {out_dir} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
