#!/usr/bin/env python3
"""Ground-truth reference files computed by LeRobot 0.6.1's own SmolVLAPolicy.

Run with the pinned venv (see requirements.txt next to this file):

    build/lerobot-venv/bin/python dev/lerobot/make_ref.py -o build/lerobot_ref

It builds a tiny SmolVLM folder (config, tokenizer, processor) offline, instantiates
SmolVLAPolicy on it with random seeded weights, pushes a fixed batch through LeRobot's
own pre-processor, runs forward + backward with explicit noise and time, samples a
10-step Euler chunk, and writes everything under OUT/<case>/ for the three training
modes (expert, vlm, all). See README.md for the meaning of every tensor.
"""

import os

# Must be set before transformers/huggingface_hub are imported: nothing may be fetched.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import hashlib
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

SEED = 1234
BATCH = 3

# Tiny sizes with the released model's structure (see README.md for the real ones).
VISION = dict(image_size=64, patch_size=8, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=2, intermediate_size=64, layer_norm_eps=1e-6,
              hidden_act="gelu_pytorch_tanh")
TEXT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, num_hidden_layers=4, rms_norm_eps=1e-5,
            rope_theta=100000.0, max_position_embeddings=512, hidden_act="silu")
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (VISION["image_size"] // VISION["patch_size"]) ** 2 // SCALE_FACTOR**2

POLICY = dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32,
              resize_imgs_with_padding=(64, 64), num_steps=10, num_vlm_layers=4,
              tokenizer_max_length=48)

STATE_DIM = 6
ACTION_DIM = 5

# (height, width) as a dataset stores frames. top: upscale + pad top rows; wrist: downscale
# + pad left columns; side: already at model size, so LeRobot skips the resize entirely.
CAMERAS = {"top": (36, 60), "wrist": (96, 80), "side": (64, 64)}

# Different token lengths so right-padding of the language tokens is exercised.
TASKS = [
    "pick up the red cube",
    "open the top drawer and put the small spoon inside it",
    "stack blocks",
]
# Number of valid chunk slots per sample; the rest of the chunk ran past the episode's end.
VALID_STEPS = [8, 5, 2]

CASES = {
    "expert": dict(train_expert_only=True, freeze_vision_encoder=True),
    "vlm": dict(train_expert_only=False, freeze_vision_encoder=True),
    "all": dict(train_expert_only=False, freeze_vision_encoder=False),
}

VLM_FOLDER = "tiny_smolvlm"

SPECIAL_TOKENS = {
    "unk": "<|endoftext|>",
    "bos": "<|im_start|>",
    "pad": "<|im_end|>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "image_token": "<image>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def cam_key(cam):
    return f"observation.images.{cam}"


def setup_torch():
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(SEED)


def build_tokenizer(out_dir):
    """Byte-level BPE trained on the task strings, so "\\n" is a real token as in SmolLM2.

    No post-processor is attached, so (like SmolVLM's GPT-2 style tokenizer) no BOS/EOS
    is added: the pre-processor's tokens are exactly the BPE pieces of "task\\n".
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(SPECIAL_TOKENS.values()))
    bpe = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    # A small merge budget keeps some words split into several pieces, like a real BPE.
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + 256 + 40,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([t + "\n" for t in TASKS] * 3, trainer=trainer)
    extra = {k: v for k, v in SPECIAL_TOKENS.items() if k.endswith("_token")}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token=SPECIAL_TOKENS["unk"],
        bos_token=SPECIAL_TOKENS["bos"],
        eos_token=SPECIAL_TOKENS["end_of_utterance_token"],
        pad_token=SPECIAL_TOKENS["pad"],
        extra_special_tokens=extra,
    )
    tok.save_pretrained(out_dir)
    return tok


def build_vlm_folder(vlm_dir, vision_sizes=VISION, text_sizes=TEXT, scale_factor=SCALE_FACTOR,
                     tokenizer_builder=build_tokenizer, vocab_size=None):
    """The local stand-in for HuggingFaceTB/SmolVLM2-500M-Video-Instruct that LeRobot loads.

    SmolVLMWithExpertModel calls AutoConfig.from_pretrained and AutoProcessor.from_pretrained
    on vlm_model_name, and reads the image special-token ids from the processor's tokenizer.
    The sizes, the tokenizer and the text vocabulary (default: the tokenizer's size) can be
    replaced (scripts/test_lerobot_io.py builds one at the tiny preset's sizes).
    """
    from transformers import (AutoTokenizer, SmolVLMConfig, SmolVLMImageProcessor,
                              SmolVLMProcessor, SmolVLMVideoProcessor)

    if vlm_dir.exists():
        shutil.rmtree(vlm_dir)
    vlm_dir.mkdir(parents=True)
    tokenizer_builder(vlm_dir)
    tok = AutoTokenizer.from_pretrained(vlm_dir)
    edge = {"longest_edge": vision_sizes["image_size"]}
    processor = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size=edge, max_image_size=edge, do_image_splitting=False),
        tokenizer=tok,
        video_processor=SmolVLMVideoProcessor(size=edge, max_image_size=edge),
        image_seq_len=(vision_sizes["image_size"] // vision_sizes["patch_size"]) ** 2 // scale_factor**2,
    )
    processor.save_pretrained(vlm_dir)

    text = dict(text_sizes, model_type="llama", vocab_size=vocab_size or len(tok), pad_token_id=tok.pad_token_id,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                attention_dropout=0.0, attention_bias=False, mlp_bias=False,
                tie_word_embeddings=False)
    vision = dict(vision_sizes, attention_dropout=0.0, num_channels=3)
    config = SmolVLMConfig(
        vision_config=vision,
        text_config=text,
        scale_factor=scale_factor,
        image_token_id=tok.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"]),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    config.save_pretrained(vlm_dir)
    return tok


def make_policy_config(vlm_dir, train_expert_only, freeze_vision_encoder, cameras=CAMERAS, state_dim=STATE_DIM,
                       action_dim=ACTION_DIM, policy=POLICY):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    inputs = {cam_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w))
              for c, (h, w) in cameras.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    return SmolVLAConfig(
        input_features=inputs,
        output_features=outputs,
        device="cpu",
        push_to_hub=False,
        vlm_model_name=str(vlm_dir),
        load_vlm_weights=False,
        train_expert_only=train_expert_only,
        freeze_vision_encoder=freeze_vision_encoder,
        **policy,
    )


def make_raw_data(seed):
    """A batch as a LeRobot dataset + dataloader would hand it over, plus dataset stats."""
    g = torch.Generator().manual_seed(seed)
    data = {}
    for cam, (h, w) in CAMERAS.items():
        data[f"images_u8.{cam}"] = torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)

    state_mean = torch.randn(STATE_DIM, generator=g)
    state_std = torch.rand(STATE_DIM, generator=g) * 1.5 + 0.2
    act_mean = torch.randn(ACTION_DIM, generator=g)
    act_std = torch.rand(ACTION_DIM, generator=g) * 1.5 + 0.2
    state = state_mean + state_std * torch.randn(BATCH, STATE_DIM, generator=g)
    action = act_mean + act_std * torch.randn(BATCH, POLICY["chunk_size"], ACTION_DIM, generator=g)

    is_pad = torch.zeros(BATCH, POLICY["chunk_size"], dtype=torch.bool)
    for b, n in enumerate(VALID_STEPS):
        is_pad[b, n:] = True
        # LeRobot clamps out-of-episode indices, so padded slots repeat the last real frame.
        action[b, n:] = action[b, n - 1]
    data["observation.state"] = state
    data["action"] = action
    data["action_is_pad"] = is_pad

    stats = {
        "observation.state": {"mean": state_mean.numpy(), "std": state_std.numpy(),
                              "min": state.min(0).values.numpy(), "max": state.max(0).values.numpy()},
        "action": {"mean": act_mean.numpy(), "std": act_std.numpy(),
                   "min": action.amin((0, 1)).numpy(), "max": action.amax((0, 1)).numpy()},
    }
    for cam in CAMERAS:
        # Visual features are IDENTITY-normalized by SmolVLA, but datasets ship (3,1,1) stats.
        f = data[f"images_u8.{cam}"].permute(0, 3, 1, 2).float() / 255.0
        stats[cam_key(cam)] = {
            "mean": f.mean((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "std": f.std((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "min": f.amin((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "max": f.amax((0, 2, 3)).reshape(3, 1, 1).numpy(),
        }
    return data, stats


def images_as_fed(u8):
    """(B,h,w,3) uint8 -> (B,3,h,w) float32 in [0,1], the layout LeRobot datasets return."""
    return (u8.permute(0, 3, 1, 2).to(torch.float32) / 255.0).contiguous()


def make_policy_batch(data):
    batch = {cam_key(c): images_as_fed(data[f"images_u8.{c}"]) for c in CAMERAS}
    batch["observation.state"] = data["observation.state"].clone()
    batch["action"] = data["action"].clone()
    batch["action_is_pad"] = data["action_is_pad"].clone()
    batch["task"] = list(TASKS)
    return batch


def make_flow_inputs(seed):
    """Noise and time passed explicitly to forward, and the noise that starts sampling."""
    from lerobot.policies.common.flow_matching import sample_time_beta

    shape = (BATCH, POLICY["chunk_size"], POLICY["max_action_dim"])
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(shape, generator=g)
    sample_noise = torch.randn(shape, generator=g)
    torch.manual_seed(seed)
    # The distribution SmolVLA's own sample_time uses (Beta(1.5, 1) * 0.999 + 0.001).
    t = sample_time_beta(BATCH, "cpu", alpha=1.5, beta=1.0, scale=0.999, offset=0.001)
    return noise, t, sample_noise


def state_digest(sd):
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def perturb_constant_params(policy, seed):
    """Fresh norms have weight 1 and bias 0, so a re-implementation that dropped a norm's
    scale or a bias would still match. Jitter every constant vector (the init is not what
    is under test, the computation is); the padding row of embed_tokens stays zero.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, p in policy.named_parameters():
            if p.ndim != 1:
                continue
            if torch.all(p == 1):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif torch.all(p == 0):
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def assert_no_dropout(policy):
    """Training runs in policy.train(); with every dropout probability at 0 that is as
    deterministic as eval(), so the refs do not depend on the RNG state."""
    cfg = policy.model.vlm_with_expert.config
    probs = {"text.attention_dropout": cfg.text_config.attention_dropout,
             "vision.attention_dropout": cfg.vision_config.attention_dropout,
             "expert.attention_dropout": policy.model.vlm_with_expert.lm_expert.config.attention_dropout}
    probs.update({f"module {n}": m.p for n, m in policy.named_modules() if isinstance(m, torch.nn.Dropout)})
    live = {k: v for k, v in probs.items() if v}
    if live:
        raise RuntimeError(f"dropout is active: {live}")


def count_params(policy):
    total = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return total, trainable


def forward_backward(policy, batch, noise, t):
    """LeRobot's training step (without the optimizer), capturing v_t on the way."""
    captured = {}

    def grab(_module, _inputs, output):
        captured["v_t"] = output.detach().clone()

    hook = policy.model.action_out_proj.register_forward_hook(grab)
    try:
        policy.train()
        policy.zero_grad(set_to_none=True)
        loss, loss_dict = policy.forward(batch, noise=noise.clone(), time=t.clone())
        loss.backward()
    finally:
        hook.remove()
    return loss.detach(), loss_dict, captured["v_t"]


def collect_grads(policy):
    grads, trainable, no_grad = {}, [], []
    for name, p in policy.named_parameters():
        if not p.requires_grad:
            continue
        trainable.append(name)
        if p.grad is None:
            no_grad.append(name)
        else:
            grads[name] = p.grad.detach().clone().contiguous()
    return grads, trainable, no_grad


def reference_loss(v_t, noise, actions_norm, is_pad, action_dim):
    """The loss rule LeRobot applies, recomputed independently as a self-check."""
    err = (noise - actions_norm - v_t).pow(2)[:, :, :action_dim]
    err = err * (~is_pad).unsqueeze(-1)
    return err.sum() / ((~is_pad).sum() * action_dim)


def sample_chunk(policy, batch, sample_noise):
    """Both the raw 32-dim Euler result and LeRobot's own predict_action_chunk (5 dims)."""
    policy.eval()
    with torch.no_grad():
        images, img_masks = policy.prepare_images(batch)
        state = policy.prepare_state(batch)
        full = policy.model.sample_actions(
            images, img_masks, batch["observation.language.tokens"],
            batch["observation.language.attention_mask"], state, noise=sample_noise.clone())
        policy.reset()
        sliced = policy.predict_action_chunk(batch, noise=sample_noise.clone())
    if not torch.equal(full[:, :, :ACTION_DIM], sliced):
        raise RuntimeError("sample_actions and predict_action_chunk disagree")
    return full, sliced


def rel_err(a, b):
    a = a.detach().to(torch.float64)
    b = b.detach().to(torch.float64)
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def jsonable(obj):
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


def versions():
    import lerobot
    import transformers
    return {"lerobot": lerobot.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0]}


def run_case(name, flags, vlm_dir, tok, data, stats, flow, out_dir, base_state):
    from safetensors.torch import save_file

    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    noise, t, sample_noise = flow
    cfg = make_policy_config(vlm_dir, **flags)
    torch.manual_seed(SEED)
    policy = SmolVLAPolicy(cfg)
    if base_state is None:
        perturb_constant_params(policy, SEED + 3)
    else:
        # The jitter ran on the first case only: later cases take its weights verbatim.
        policy.load_state_dict(base_state, strict=True)
    assert_no_dropout(policy)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)

    batch = pre(make_policy_batch(data))
    loss, loss_dict, v_t = forward_backward(policy, batch, noise, t)
    grads, trainable, no_grad = collect_grads(policy)
    if no_grad:
        raise RuntimeError(f"{name}: trainable parameters without a gradient: {no_grad}")

    state_norm = policy.prepare_state(batch)
    actions_norm = policy.prepare_action(batch)
    check = reference_loss(v_t, noise, actions_norm, batch["action_is_pad"], ACTION_DIM)
    if rel_err(check, loss) > 1e-6:
        raise RuntimeError(f"{name}: loss {loss.item()} does not follow the expected rule ({check.item()})")
    with torch.no_grad():
        prepped, _ = policy.prepare_images(batch)

    chunk_norm, chunk5 = sample_chunk(policy, batch, sample_noise)
    chunk = post(chunk5)

    case_dir = out_dir / name
    policy_dir = case_dir / "policy"
    policy_dir.mkdir(parents=True)
    policy.save_pretrained(policy_dir)
    pre.save_pretrained(policy_dir)
    post.save_pretrained(policy_dir)

    ref = {}
    for cam in CAMERAS:
        ref[f"images_u8.{cam}"] = data[f"images_u8.{cam}"]
        ref[cam_key(cam)] = images_as_fed(data[f"images_u8.{cam}"])
    ref["observation.state"] = data["observation.state"]
    ref["action"] = data["action"]
    ref["action_is_pad"] = data["action_is_pad"].to(torch.uint8)
    ref["lang_tokens"] = batch["observation.language.tokens"].to(torch.int64)
    ref["lang_masks"] = batch["observation.language.attention_mask"].to(torch.uint8)
    ref["state_norm"] = state_norm
    ref["actions_norm"] = actions_norm
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
    ref["chunk"] = chunk
    ref = {k: v.detach().contiguous() for k, v in ref.items()}
    save_file(ref, str(case_dir / "ref.safetensors"))

    total, n_trainable = count_params(policy)
    saved_names = set(safetensors_keys(policy_dir / "model.safetensors"))
    missing = [n for n in trainable if n not in saved_names]
    if missing:
        raise RuntimeError(f"{name}: grad names not in model.safetensors: {missing[:5]}")

    text_cfg = policy.model.vlm_with_expert.config.text_config
    expert = policy.model.vlm_with_expert
    info = {
        "case": name,
        "train_mode": name,
        "flags": flags,
        "seed": SEED,
        "weights": "LeRobot/transformers random init under torch.manual_seed(seed), then every "
                   "all-ones/all-zeros 1-D parameter (norm weights, biases) jittered; "
                   "identical in all cases (see weights_sha256)",
        "batch_size": BATCH,
        "tasks": TASKS,
        "tasks_as_tokenized": [t_ + "\n" for t_ in TASKS],
        "valid_steps": VALID_STEPS,
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "cameras": {c: {"key": cam_key(c), "height": h, "width": w} for c, (h, w) in CAMERAS.items()},
        "camera_order": list(CAMERAS),
        "policy": dict(POLICY, attention_mode=cfg.attention_mode,
                       self_attn_every_n_layers=cfg.self_attn_every_n_layers,
                       expert_width_multiplier=cfg.expert_width_multiplier,
                       num_expert_layers=cfg.num_expert_layers, min_period=cfg.min_period,
                       max_period=cfg.max_period, use_cache=cfg.use_cache,
                       add_image_special_tokens=cfg.add_image_special_tokens,
                       pad_language_to=cfg.pad_language_to, prefix_length=cfg.prefix_length,
                       train_state_proj=cfg.train_state_proj),
        "vision": VISION,
        "text": TEXT,
        "scale_factor": SCALE_FACTOR,
        "image_tokens_per_camera": IMAGE_SEQ_LEN,
        "expert": {"hidden_size": expert.expert_hidden_size,
                   "intermediate_size": expert.lm_expert.config.intermediate_size,
                   "num_layers": expert.num_expert_layers},
        "vocab_size": text_cfg.vocab_size,
        "pad_token_id": tok.pad_token_id,
        "tokenizer": {"path": str(vlm_dir), "bos_added": bool(tok("x")["input_ids"][0] == tok.bos_token_id),
                      "newline_ids": tok("\n")["input_ids"],
                      "special_ids": {k: tok.convert_tokens_to_ids(v) for k, v in SPECIAL_TOKENS.items()}},
        "vision_attn_implementation": expert.vlm.config.vision_config._attn_implementation,
        "params_total": total,
        "params_trainable": n_trainable,
        "trainable_names": trainable,
        "num_grad_tensors": len(grads),
        "weights_sha256": state_digest(policy.state_dict()),
        "forward_mode": "policy.train() as in LeRobot training; all dropout probabilities are 0",
        "sample_mode": "policy.eval(), use_cache=True (prefix K/V computed once)",
        "loss": loss.item(),
        "loss_dict": loss_dict,
        "chunk_norm_dims": POLICY["max_action_dim"],
        "stats": jsonable(stats),
        "versions": versions(),
    }
    with open(case_dir / "case.json", "w") as f:
        json.dump(info, f, indent=1)
    print(f"{name}: loss {loss.item():.9g} trainable {n_trainable} / total {total} "
          f"({len(grads)} grad tensors)", flush=True)
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def safetensors_keys(path):
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


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

    # Not named after a case: the "vlm" case folder would collide with it.
    vlm_dir = out_dir / VLM_FOLDER
    tok = build_vlm_folder(vlm_dir)
    data, stats = make_raw_data(SEED + 1)
    flow = make_flow_inputs(SEED + 2)

    base_state = None
    for name, flags in CASES.items():
        state = run_case(name, flags, vlm_dir, tok, data, stats, flow, out_dir, base_state)
        if base_state is None:
            base_state = state
    print(f"wrote {out_dir} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
