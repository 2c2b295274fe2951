"""Ground-truth reference files computed by LeRobot 0.6.1's own policies, SmolVLA or pi0.

Run with the pinned venv (see requirements.txt next to this file):

    build/lerobot-venv/bin/python dev/lerobot/make_ref.py --family smolvla -o build/lerobot_ref
    build/lerobot-venv/bin/python dev/lerobot/make_ref.py --family pi0 -o build/lerobot_ref_pi0

SmolVLA (SmolVLAPolicy): it builds a tiny SmolVLM folder (config, tokenizer, processor) offline,
instantiates SmolVLAPolicy on it with random seeded weights, pushes a fixed batch through
LeRobot's own pre-processor, runs forward + backward with explicit noise and time, samples a
10-step Euler chunk, and writes everything under OUT/<case>/ for the three training modes
(expert, vlm, all).

pi0 (PI0Policy): PI0Config has no size settings, so the sizes are replaced at run time
(tiny_pi0_sizes): the names that modeling_pi0 builds its configs and models with are swapped for
small versions, and LeRobot's own code builds the whole module tree at those sizes. On that
policy (random seeded weights) it runs forward + backward with fixed noise and time, samples a
10-step Euler chunk, and writes everything under OUT/<case>/ for the same three modes, plus the
released model's parameter counts (OUT/released_counts.json).

Both families share the cases, the seed, the jitter of constant vectors, B = 3, chunk 8 and the
valid slots 8, 5, 2, and the steps of a case (build_policy, run_policy, ref_tensors, case_info,
save_case); a Family holds what those steps need to know of each policy. See README.md for the
meaning of every file and tensor.
"""

import os

# Must be set before transformers/huggingface_hub are imported: nothing may be fetched.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import shutil
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


# ----------------------------------------------------------------------------------------------
# what both families share

SEED = 1234
BATCH = 3
STATE_DIM = 6
ACTION_DIM = 5
# Number of valid chunk slots per sample; the rest of the chunk ran past the episode's end.
VALID_STEPS = [8, 5, 2]

CASES = {
    "expert": dict(train_expert_only=True, freeze_vision_encoder=True),
    "vlm": dict(train_expert_only=False, freeze_vision_encoder=True),
    "all": dict(train_expert_only=False, freeze_vision_encoder=False),
}


def cam_key(cam):
    return f"observation.images.{cam}"


def setup_torch():
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(SEED)


def images_as_fed(u8):
    """(B,h,w,3) uint8 -> (B,3,h,w) float32 in [0,1], the layout LeRobot datasets return."""
    return (u8.permute(0, 3, 1, 2).to(torch.float32) / 255.0).contiguous()


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


def count_params(policy):
    total = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return total, trainable


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


def safetensors_keys(path):
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


# ----------------------------------------------------------------------------------------------
# what both families share: the steps of a case

@dataclasses.dataclass(frozen=True)
class Family:
    """What the shared steps need to know of one family's policy."""
    cameras: dict             # camera -> (height, width) as a dataset stores its frames
    prepare_images: str       # the policy's method that resizes, pads and scales the frames
    forward_takes_flow: bool  # policy.forward takes noise= and time= (else it samples them itself)
    masked_loss: bool         # the loss leaves out the action_is_pad slots
    sub_configs: Callable     # policy -> the configs of its text model, vision model and expert
    sample_mode: str          # how case.json describes the sampling


WEIGHTS_NOTE = ("LeRobot/transformers random init under torch.manual_seed(seed), then every "
                "all-ones/all-zeros 1-D parameter (norm weights, biases) jittered; "
                "identical in all cases (see weights_sha256)")
FORWARD_MODE = "policy.train() as in LeRobot training; all dropout probabilities are 0"


def random_frames(g, cameras):
    """Random uint8 frames (B,h,w,3) per camera, as a dataset stores them."""
    return {f"images_u8.{cam}": torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8)
            for cam, (h, w) in cameras.items()}


def pad_past_episode_end(action):
    """action_is_pad for a (B, chunk, dim) chunk with VALID_STEPS real slots per sample; the
    padded slots of action are overwritten with the last real one (in place)."""
    is_pad = torch.zeros(action.shape[:2], dtype=torch.bool)
    for b, n in enumerate(VALID_STEPS):
        is_pad[b, n:] = True
        # LeRobot clamps out-of-episode indices, so padded slots repeat the last real frame.
        action[b, n:] = action[b, n - 1]
    return is_pad


def policy_batch(data, cameras, extra):
    """The batch the policy (or its pre-processor) takes: frames as float [0,1], copies of the
    state, actions and padding, then the family's extra entries."""
    batch = {cam_key(c): images_as_fed(data[f"images_u8.{c}"]) for c in cameras}
    for key in ("observation.state", "action", "action_is_pad"):
        batch[key] = data[key].clone()
    batch.update(extra)
    return batch


def flow_inputs(seed, chunk_size, max_action_dim, alpha, beta, scale, offset):
    """Noise and time for the training step (time from Beta(alpha, beta) * scale + offset, as the
    policy's own sample_time draws it), and the noise that starts sampling."""
    from lerobot.policies.common.flow_matching import sample_time_beta

    shape = (BATCH, chunk_size, max_action_dim)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(shape, generator=g)
    sample_noise = torch.randn(shape, generator=g)
    torch.manual_seed(seed)
    t = sample_time_beta(BATCH, "cpu", alpha=alpha, beta=beta, scale=scale, offset=offset)
    return noise, t, sample_noise


def assert_no_dropout(policy, text, vision, expert):
    """Training runs in policy.train(); with every dropout probability at 0 that is as
    deterministic as eval(), so the refs do not depend on the RNG state."""
    probs = {"text.attention_dropout": text.attention_dropout,
             "vision.attention_dropout": vision.attention_dropout,
             "expert.attention_dropout": expert.attention_dropout}
    probs.update({f"module {n}": m.p for n, m in policy.named_modules() if isinstance(m, torch.nn.Dropout)})
    live = {k: v for k, v in probs.items() if v}
    if live:
        raise RuntimeError(f"dropout is active: {live}")


def build_policy(make_policy, base_state, family):
    """make_policy() under the seed, then the jitter (first case) or the first case's weights
    verbatim (later cases); checked to have no live dropout."""
    torch.manual_seed(SEED)
    policy = make_policy()
    if base_state is None:
        perturb_constant_params(policy, SEED + 3)
    else:
        policy.load_state_dict(base_state, strict=True)
    assert_no_dropout(policy, *family.sub_configs(policy))
    return policy


@contextlib.contextmanager
def fixed_flow(model, noise, t):
    """Inside, model.sample_noise and model.sample_time hand out the given noise and time (for a
    forward that draws them itself)."""
    def fixed_noise(shape, _device):
        if tuple(shape) != tuple(noise.shape):
            raise RuntimeError(f"noise of shape {tuple(shape)} asked, {tuple(noise.shape)} given")
        return noise.clone()

    def fixed_time(bsize, _device):
        if bsize != t.shape[0]:
            raise RuntimeError(f"time for {bsize} samples asked, {t.shape[0]} given")
        return t.clone()

    model.sample_noise = fixed_noise
    model.sample_time = fixed_time
    try:
        yield
    finally:
        del model.sample_noise
        del model.sample_time


def forward_backward(policy, batch, noise, t, family):
    """LeRobot's training step (without the optimizer) with the given noise and time, capturing
    v_t on the way."""
    captured = {}

    def grab(_module, _inputs, output):
        captured["v_t"] = output.detach().clone()

    if family.forward_takes_flow:
        flow, fixed = {"noise": noise.clone(), "time": t.clone()}, contextlib.nullcontext()
    else:
        flow, fixed = {}, fixed_flow(policy.model, noise, t)
    hook = policy.model.action_out_proj.register_forward_hook(grab)
    try:
        with fixed:
            policy.train()
            policy.zero_grad(set_to_none=True)
            loss, loss_dict = policy.forward(batch, **flow)
            loss.backward()
    finally:
        hook.remove()
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


def reference_loss(v_t, noise, actions_norm, is_pad=None):
    """The loss rule, recomputed independently as a self-check: the mean squared error over the
    real action dims, over every chunk slot (pi0) or the slots that are not padding (SmolVLA)."""
    err = (noise - actions_norm - v_t).pow(2)[:, :, :ACTION_DIM]
    if is_pad is None:
        return err.mean()
    valid = ~is_pad
    return (err * valid.unsqueeze(-1)).sum() / (valid.sum() * ACTION_DIM)


def sample_chunk(policy, batch, sample_noise, family):
    """The raw 32-dim Euler result and LeRobot's own predict_action_chunk (its first dims),
    after checking that they agree."""
    policy.eval()
    with torch.no_grad():
        images, img_masks = getattr(policy, family.prepare_images)(batch)
        state = policy.prepare_state(batch)
        full = policy.model.sample_actions(
            images, img_masks, batch["observation.language.tokens"],
            batch["observation.language.attention_mask"], state, noise=sample_noise.clone())
        policy.reset()
        sliced = policy.predict_action_chunk(batch, noise=sample_noise.clone())
    if not torch.equal(full[:, :, :sliced.shape[-1]], sliced):
        raise RuntimeError("sample_actions and predict_action_chunk disagree")
    return full, sliced


def run_policy(name, policy, batch, flow, family):
    """One case's computation: the training step and its gradients (the loss checked against
    the rule), the normalized state and actions, the prepared images and the sampled chunk."""
    noise, t, sample_noise = flow
    loss, loss_dict, v_t = forward_backward(policy, batch, noise, t, family)
    grads, trainable, zero_grad, none_grad = collect_grads(policy)
    state_norm = policy.prepare_state(batch)
    actions_norm = policy.prepare_action(batch)
    check = reference_loss(v_t, noise, actions_norm, batch["action_is_pad"] if family.masked_loss else None)
    if rel_err(check, loss) > 1e-6:
        raise RuntimeError(f"{name}: loss {loss.item()} does not follow the expected rule ({check.item()})")
    with torch.no_grad():
        prepped, _ = getattr(policy, family.prepare_images)(batch)
    chunk_norm, chunk_sliced = sample_chunk(policy, batch, sample_noise, family)
    return types.SimpleNamespace(
        noise=noise, time=t, sample_noise=sample_noise, loss=loss, loss_dict=loss_dict, v_t=v_t, grads=grads,
        trainable=trainable, zero_grad=zero_grad, none_grad=none_grad, state_norm=state_norm,
        actions_norm=actions_norm, prepped=prepped, chunk_norm=chunk_norm, chunk_sliced=chunk_sliced)


def ref_tensors(data, batch, run, cameras):
    """The tensors of ref.safetensors that both families write: the raw frames, the language
    tokens, the normalized inputs, noise and time, and what run_policy computed."""
    ref = {f"images_u8.{cam}": data[f"images_u8.{cam}"] for cam in cameras}
    ref["lang_tokens"] = batch["observation.language.tokens"].to(torch.int64)
    ref["lang_masks"] = batch["observation.language.attention_mask"].to(torch.uint8)
    ref["action_is_pad"] = data["action_is_pad"].to(torch.uint8)
    ref["state_norm"] = run.state_norm
    ref["actions_norm"] = run.actions_norm
    ref["noise"] = run.noise
    ref["time"] = run.time
    for cam, img in zip(cameras, run.prepped, strict=True):
        ref[f"images_prepped.{cam}"] = img
    ref["loss"] = run.loss.reshape(())
    ref["v_t"] = run.v_t
    for pname, g in run.grads.items():
        ref[f"grad.{pname}"] = g
    ref["sample_noise"] = run.sample_noise
    ref["chunk_norm"] = run.chunk_norm
    return ref


def case_info(name, flags, policy, run, family, head, body, tail):
    """case.json: the case and what every family records, with the family's own fields placed
    after the case name (head), in the middle (body) and before the versions (tail)."""
    return {"case": name, **head, "flags": flags, "seed": SEED, "weights": WEIGHTS_NOTE, "batch_size": BATCH,
            **body, "weights_sha256": state_digest(policy.state_dict()), "forward_mode": FORWARD_MODE,
            "sample_mode": family.sample_mode, "loss": run.loss.item(), "loss_dict": run.loss_dict, **tail,
            "versions": versions()}


def save_case(case_dir, savers, ref, info, grads, texts):
    """Writes OUT/<case>/: policy/ (what each of savers saves: the policy first), ref.safetensors,
    case.json and the named text files; checks that every gradient is named after a saved weight.
    Returns a copy of the policy's weights."""
    from safetensors.torch import save_file

    policy_dir = case_dir / "policy"
    policy_dir.mkdir(parents=True)
    for saver in savers:
        saver.save_pretrained(policy_dir)
    save_file({k: v.detach().contiguous() for k, v in ref.items()}, str(case_dir / "ref.safetensors"))
    for file_name, lines in texts.items():
        with open(case_dir / file_name, "w") as f:
            f.write("\n".join(lines) + "\n")
    saved_names = set(safetensors_keys(policy_dir / "model.safetensors"))
    missing = [n for n in grads if n not in saved_names]
    if missing:
        raise RuntimeError(f"{info['case']}: grad names not in model.safetensors: {missing[:5]}")
    with open(case_dir / "case.json", "w") as f:
        json.dump(info, f, indent=1)
    return {k: v.detach().clone() for k, v in savers[0].state_dict().items()}


def print_case(name, run, total, n_trainable, more=""):
    """One line of progress for a finished case."""
    print(f"{name}: loss {run.loss.item():.9g} trainable {n_trainable} / total {total} "
          f"({len(run.grads)} grad tensors{more})", flush=True)


def run_cases(run_case, **context):
    """run_case(name, flags, base_state, **context) for every case; the first case's weights
    (what it returns) are the base_state of the others."""
    base_state = None
    for name, flags in CASES.items():
        state = run_case(name, flags, base_state, **context)
        if base_state is None:
            base_state = state


# ----------------------------------------------------------------------------------------------
# SmolVLA: SmolVLAPolicy on a tiny SmolVLM folder

# Tiny sizes with the released model's structure (see README.md for the real ones).
SMOLVLA_VISION = dict(image_size=64, patch_size=8, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, layer_norm_eps=1e-6,
                      hidden_act="gelu_pytorch_tanh")
SMOLVLA_TEXT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=128, num_hidden_layers=4, rms_norm_eps=1e-5,
                    rope_theta=100000.0, max_position_embeddings=512, hidden_act="silu")
SMOLVLA_SCALE_FACTOR = 2
SMOLVLA_IMAGE_SEQ_LEN = ((SMOLVLA_VISION["image_size"] // SMOLVLA_VISION["patch_size"]) ** 2
                         // SMOLVLA_SCALE_FACTOR**2)

SMOLVLA_POLICY = dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32,
                      resize_imgs_with_padding=(64, 64), num_steps=10, num_vlm_layers=4,
                      tokenizer_max_length=48)

# (height, width) as a dataset stores frames. top: upscale + pad top rows; wrist: downscale
# + pad left columns; side: already at model size, so LeRobot skips the resize entirely.
SMOLVLA_CAMERAS = {"top": (36, 60), "wrist": (96, 80), "side": (64, 64)}

# Different token lengths so right-padding of the language tokens is exercised.
SMOLVLA_TASKS = [
    "pick up the red cube",
    "open the top drawer and put the small spoon inside it",
    "stack blocks",
]

SMOLVLA_VLM_FOLDER = "tiny_smolvlm"

SMOLVLA_SPECIAL_TOKENS = {
    "unk": "<|endoftext|>",
    "bos": "<|im_start|>",
    "pad": "<|im_end|>",
    "fake_image_token": "<fake_token_around_image>",
    "global_image_token": "<global-img>",
    "image_token": "<image>",
    "end_of_utterance_token": "<end_of_utterance>",
}


def smolvla_build_tokenizer(out_dir):
    """Byte-level BPE trained on the task strings, so "\\n" is a real token as in SmolLM2.

    No post-processor is attached, so (like SmolVLM's GPT-2 style tokenizer) no BOS/EOS
    is added: the pre-processor's tokens are exactly the BPE pieces of "task\\n".
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(SMOLVLA_SPECIAL_TOKENS.values()))
    bpe = Tokenizer(models.BPE(unk_token=SMOLVLA_SPECIAL_TOKENS["unk"]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    # A small merge budget keeps some words split into several pieces, like a real BPE.
    trainer = trainers.BpeTrainer(
        vocab_size=len(specials) + 256 + 40,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([t + "\n" for t in SMOLVLA_TASKS] * 3, trainer=trainer)
    extra = {k: v for k, v in SMOLVLA_SPECIAL_TOKENS.items() if k.endswith("_token")}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token=SMOLVLA_SPECIAL_TOKENS["unk"],
        bos_token=SMOLVLA_SPECIAL_TOKENS["bos"],
        eos_token=SMOLVLA_SPECIAL_TOKENS["end_of_utterance_token"],
        pad_token=SMOLVLA_SPECIAL_TOKENS["pad"],
        extra_special_tokens=extra,
    )
    tok.save_pretrained(out_dir)
    return tok


def smolvla_build_vlm_folder(vlm_dir, vision_sizes=SMOLVLA_VISION, text_sizes=SMOLVLA_TEXT,
                             scale_factor=SMOLVLA_SCALE_FACTOR, tokenizer_builder=smolvla_build_tokenizer,
                             vocab_size=None):
    """The local stand-in for HuggingFaceTB/SmolVLM2-500M-Video-Instruct that LeRobot loads.

    SmolVLMWithExpertModel calls AutoConfig.from_pretrained and AutoProcessor.from_pretrained
    on vlm_model_name, and reads the image special-token ids from the processor's tokenizer.
    The sizes, the tokenizer and the text vocabulary (default: the tokenizer's size) can be
    replaced (tests/lerobot/test_lerobot_io.py builds one at the tiny preset's sizes).
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
        image_token_id=tok.convert_tokens_to_ids(SMOLVLA_SPECIAL_TOKENS["image_token"]),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    config.save_pretrained(vlm_dir)
    return tok


def smolvla_policy_config(vlm_dir, train_expert_only, freeze_vision_encoder, cameras=SMOLVLA_CAMERAS,
                          state_dim=STATE_DIM, action_dim=ACTION_DIM, policy=SMOLVLA_POLICY):
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



def smolvla_raw_data(seed):
    """A batch as a LeRobot dataset + dataloader would hand it over, plus dataset stats."""
    g = torch.Generator().manual_seed(seed)
    data = random_frames(g, SMOLVLA_CAMERAS)

    state_mean = torch.randn(STATE_DIM, generator=g)
    state_std = torch.rand(STATE_DIM, generator=g) * 1.5 + 0.2
    act_mean = torch.randn(ACTION_DIM, generator=g)
    act_std = torch.rand(ACTION_DIM, generator=g) * 1.5 + 0.2
    state = state_mean + state_std * torch.randn(BATCH, STATE_DIM, generator=g)
    action = act_mean + act_std * torch.randn(BATCH, SMOLVLA_POLICY["chunk_size"], ACTION_DIM, generator=g)
    is_pad = pad_past_episode_end(action)
    data["observation.state"] = state
    data["action"] = action
    data["action_is_pad"] = is_pad

    stats = {
        "observation.state": {"mean": state_mean.numpy(), "std": state_std.numpy(),
                              "min": state.min(0).values.numpy(), "max": state.max(0).values.numpy()},
        "action": {"mean": act_mean.numpy(), "std": act_std.numpy(),
                   "min": action.amin((0, 1)).numpy(), "max": action.amax((0, 1)).numpy()},
    }
    for cam in SMOLVLA_CAMERAS:
        # Visual features are IDENTITY-normalized by SmolVLA, but datasets ship (3,1,1) stats.
        f = data[f"images_u8.{cam}"].permute(0, 3, 1, 2).float() / 255.0
        stats[cam_key(cam)] = {
            "mean": f.mean((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "std": f.std((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "min": f.amin((0, 2, 3)).reshape(3, 1, 1).numpy(),
            "max": f.amax((0, 2, 3)).reshape(3, 1, 1).numpy(),
        }
    return data, stats


def smolvla_sub_configs(policy):
    """The text, vision and expert configs of a SmolVLAPolicy."""
    vlm_with_expert = policy.model.vlm_with_expert
    return vlm_with_expert.config.text_config, vlm_with_expert.config.vision_config, vlm_with_expert.lm_expert.config


SMOLVLA = Family(cameras=SMOLVLA_CAMERAS, prepare_images="prepare_images", forward_takes_flow=True,
                 masked_loss=True, sub_configs=smolvla_sub_configs,
                 sample_mode="policy.eval(), use_cache=True (prefix K/V computed once)")
# The distribution SmolVLA's own sample_time uses (Beta(1.5, 1) * 0.999 + 0.001).
SMOLVLA_TIME = dict(alpha=1.5, beta=1.0, scale=0.999, offset=0.001)


def smolvla_case_fields(cfg, policy, tok, vlm_dir, run):
    """The SmolVLA part of case.json: the batch, the sizes, the tokenizer, the counts."""
    expert = policy.model.vlm_with_expert
    total, n_trainable = count_params(policy)
    return {
        "tasks": SMOLVLA_TASKS,
        "tasks_as_tokenized": [t_ + "\n" for t_ in SMOLVLA_TASKS],
        "valid_steps": VALID_STEPS,
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "cameras": {c: {"key": cam_key(c), "height": h, "width": w} for c, (h, w) in SMOLVLA_CAMERAS.items()},
        "camera_order": list(SMOLVLA_CAMERAS),
        "policy": dict(SMOLVLA_POLICY, attention_mode=cfg.attention_mode,
                       self_attn_every_n_layers=cfg.self_attn_every_n_layers,
                       expert_width_multiplier=cfg.expert_width_multiplier,
                       num_expert_layers=cfg.num_expert_layers, min_period=cfg.min_period,
                       max_period=cfg.max_period, use_cache=cfg.use_cache,
                       add_image_special_tokens=cfg.add_image_special_tokens,
                       pad_language_to=cfg.pad_language_to, prefix_length=cfg.prefix_length,
                       train_state_proj=cfg.train_state_proj),
        "vision": SMOLVLA_VISION,
        "text": SMOLVLA_TEXT,
        "scale_factor": SMOLVLA_SCALE_FACTOR,
        "image_tokens_per_camera": SMOLVLA_IMAGE_SEQ_LEN,
        "expert": {"hidden_size": expert.expert_hidden_size,
                   "intermediate_size": expert.lm_expert.config.intermediate_size,
                   "num_layers": expert.num_expert_layers},
        "vocab_size": expert.config.text_config.vocab_size,
        "pad_token_id": tok.pad_token_id,
        "tokenizer": {"path": str(vlm_dir), "bos_added": bool(tok("x")["input_ids"][0] == tok.bos_token_id),
                      "newline_ids": tok("\n")["input_ids"],
                      "special_ids": {k: tok.convert_tokens_to_ids(v) for k, v in SMOLVLA_SPECIAL_TOKENS.items()}},
        "vision_attn_implementation": expert.vlm.config.vision_config._attn_implementation,
        "params_total": total,
        "params_trainable": n_trainable,
        "trainable_names": run.trainable,
        "num_grad_tensors": len(run.grads),
    }


def smolvla_run_case(name, flags, base_state, vlm_dir, tok, data, stats, flow, out_dir):
    """One case: SmolVLAPolicy with the case's flags, LeRobot's pre/post-processors, the batch
    through them, the computation, and OUT/<case>/ written."""
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    cfg = smolvla_policy_config(vlm_dir, **flags)
    policy = build_policy(lambda: SmolVLAPolicy(cfg), base_state, SMOLVLA)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    batch = pre(policy_batch(data, SMOLVLA_CAMERAS, {"task": list(SMOLVLA_TASKS)}))
    run = run_policy(name, policy, batch, flow, SMOLVLA)
    if run.none_grad:
        raise RuntimeError(f"{name}: trainable parameters without a gradient: {run.none_grad}")

    ref = ref_tensors(data, batch, run, SMOLVLA_CAMERAS)
    for cam in SMOLVLA_CAMERAS:
        ref[cam_key(cam)] = images_as_fed(data[f"images_u8.{cam}"])
    ref["observation.state"] = data["observation.state"]
    ref["action"] = data["action"]
    ref["chunk"] = post(run.chunk_sliced)
    fields = smolvla_case_fields(cfg, policy, tok, vlm_dir, run)
    info = case_info(name, flags, policy, run, SMOLVLA, {"train_mode": name}, fields,
                     {"chunk_norm_dims": SMOLVLA_POLICY["max_action_dim"], "stats": jsonable(stats)})
    state = save_case(out_dir / name, [policy, pre, post], ref, info, run.grads, {})
    print_case(name, run, fields["params_total"], fields["params_trainable"])
    return state


def smolvla_main(out_dir):
    """The tiny SmolVLM folder, the batch and the flow inputs, then every case."""
    # Not named after a case: the "vlm" case folder would collide with it.
    vlm_dir = out_dir / SMOLVLA_VLM_FOLDER
    tok = smolvla_build_vlm_folder(vlm_dir)
    data, stats = smolvla_raw_data(SEED + 1)
    flow = flow_inputs(SEED + 2, SMOLVLA_POLICY["chunk_size"], SMOLVLA_POLICY["max_action_dim"], **SMOLVLA_TIME)
    run_cases(smolvla_run_case, vlm_dir=vlm_dir, tok=tok, data=data, stats=stats, flow=flow, out_dir=out_dir)


# ----------------------------------------------------------------------------------------------
# pi0: PI0Policy at the pi0_tiny preset's sizes

# The pi0_tiny preset's sizes. SigLIP: image 32 (PI0Config.image_resolution), patch 8, so 16
# tokens a camera; the projector maps the vision width to the VLM width.
PI0_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=8)
# The two Gemmas, in the fields of LeRobot's GemmaConfig (what get_gemma_config returns). The
# joint attention reshapes to 8 heads (compute_layer_complete), so both keep 8 heads of one size.
PI0_GEMMA = {
    "gemma_2b": dict(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8),    # the VLM
    "gemma_300m": dict(width=32, depth=2, mlp_dim=64, num_heads=8, num_kv_heads=1, head_dim=8),   # the expert
}
PI0_VOCAB = 256

PI0_POLICY = dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32, num_inference_steps=10,
                  image_resolution=(32, 32), tokenizer_max_length=16, dtype="float32")

# (height, width) as a dataset stores frames; the policy resizes both to 32x32 keeping the
# aspect ratio and pads the rest with zeros, centred.
PI0_CAMERAS = {"top": (36, 60), "wrist": (96, 80)}

# Language tokens as PaliGemma's pre-processor hands them over: bos first, right-padded with
# the pad id to tokenizer_max_length. Different lengths, one of them full.
PI0_BOS_ID = 2
PI0_TOKEN_LENGTHS = [7, 16, 11]

# The released model's counts (PaliGemma 3B + Gemma 300M); check_ref.py --family pi0 holds them to
# these.
PI0_RELEASED_TOTAL = 4_028_019_472
PI0_RELEASED_USED = 3_238_048_528

# Every parameter belongs to one part, by the start of its name under PI0Pytorch.
PI0_PALIGEMMA = "paligemma_with_expert.paligemma."
PI0_EXPERT = "paligemma_with_expert.gemma_expert."
PI0_PARTS = {
    "vision": (PI0_PALIGEMMA + "model.vision_tower.",),
    "projector": (PI0_PALIGEMMA + "model.multi_modal_projector.",),
    "embedding": (PI0_PALIGEMMA + "model.language_model.embed_tokens.",),
    "vlm_layers": (PI0_PALIGEMMA + "model.language_model.layers.",),
    "vlm_norm": (PI0_PALIGEMMA + "model.language_model.norm.",),
    "expert_layers": (PI0_EXPERT + "model.layers.",),
    "expert_norm": (PI0_EXPERT + "model.norm.",),
    "projections": ("state_proj.", "action_in_proj.", "action_out_proj.", "action_time_mlp_in.",
                    "action_time_mlp_out."),
    "lm_heads": (PI0_PALIGEMMA + "lm_head.", PI0_EXPERT + "lm_head."),
}


# ----------------------------------------------------------------------------------------------
# pi0: the test sizes

def shrink_paligemma_config(config):
    """PaliGemmaWithExpertModel.__init__ has set the text sizes from get_gemma_config and the
    image size from image_resolution; vision widths, the projector and the vocabulary it fixes
    at the released values. Those are replaced here, before the model is built from them."""
    for key, value in PI0_VISION.items():
        setattr(config.vision_config, key, value)
    config.projection_dim = config.text_config.hidden_size
    config.vision_config.projection_dim = config.text_config.hidden_size
    config.vocab_size = PI0_VOCAB
    config.text_config.vocab_size = PI0_VOCAB
    config.image_token_index = PI0_VOCAB  # LeRobot's convention: one past the vocabulary (unused by pi0)


@contextlib.contextmanager
def tiny_pi0_sizes():
    """Inside, every PI0Policy / PI0Pytorch built has the test sizes above; LeRobot's files are
    not touched. modeling_pi0 looks these three names up in its own namespace when it builds a
    model, so replacing them there is enough."""
    from lerobot.policies.pi0 import modeling_pi0

    real = {name: getattr(modeling_pi0, name)
            for name in ("get_gemma_config", "PaliGemmaForConditionalGenerationWithPiGemma", "PiGemmaForCausalLM")}

    def tiny_gemma_config(variant):
        return modeling_pi0.GemmaConfig(**PI0_GEMMA[variant])

    class TinyPaliGemma(real["PaliGemmaForConditionalGenerationWithPiGemma"]):
        def __init__(self, config):
            shrink_paligemma_config(config)
            super().__init__(config)

    class TinyExpert(real["PiGemmaForCausalLM"]):
        def __init__(self, config, **kwargs):
            config.vocab_size = PI0_VOCAB
            super().__init__(config, **kwargs)

    modeling_pi0.get_gemma_config = tiny_gemma_config
    modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma = TinyPaliGemma
    modeling_pi0.PiGemmaForCausalLM = TinyExpert
    try:
        yield
    finally:
        for name, value in real.items():
            setattr(modeling_pi0, name, value)


def pi0_policy_config(train_expert_only, freeze_vision_encoder):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    inputs = {cam_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w)) for c, (h, w) in PI0_CAMERAS.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return PI0Config(input_features=inputs, output_features=outputs, device="cpu", push_to_hub=False,
                     train_expert_only=train_expert_only, freeze_vision_encoder=freeze_vision_encoder, **PI0_POLICY)


def pi0_c_config_lines(policy):
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
# pi0: parameter counts

def pi0_part_of(name):
    """The PI0_PARTS entry a PI0Pytorch parameter name falls in."""
    found = [part for part, starts in PI0_PARTS.items() if name.startswith(starts)]
    if len(found) != 1:
        raise RuntimeError(f"parameter {name} falls in parts {found}, expected exactly one")
    return found[0]


def pi0_part_counts(model):
    """Parameter counts of a PI0Pytorch by part; lm_heads are counted but are not 'used'."""
    counts = dict.fromkeys(PI0_PARTS, 0)
    for name, p in model.named_parameters():
        counts[pi0_part_of(name)] += p.numel()
    total = sum(counts.values())
    return {"total": total, "lm_heads": counts["lm_heads"], "used": total - counts["lm_heads"],
            "parts": counts}


def pi0_trainable_counts(model):
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
                           if p.requires_grad and pi0_part_of(n) != "lm_heads")
    return counts


def pi0_released_counts():
    """The released model (gemma_2b + gemma_300m at 224 px), built on the meta device with the
    real sizes: shapes only, no memory."""
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Pytorch

    with torch.device("meta"):
        model = PI0Pytorch(PI0Config(device="cpu"))
    counts = pi0_part_counts(model)
    counts["trainable"] = pi0_trainable_counts(model)
    return counts



# ----------------------------------------------------------------------------------------------
# pi0: the batch

def pi0_data(seed):
    """Frames as a dataset stores them, language tokens as the pre-processor makes them,
    normalized state and actions (the policy pads them to 32)."""
    g = torch.Generator().manual_seed(seed)
    data = random_frames(g, PI0_CAMERAS)

    length = PI0_POLICY["tokenizer_max_length"]
    tokens = torch.zeros(BATCH, length, dtype=torch.int64)  # pad id 0 (checked against the model)
    masks = torch.zeros(BATCH, length, dtype=torch.bool)
    for b, n in enumerate(PI0_TOKEN_LENGTHS):
        tokens[b, 0] = PI0_BOS_ID
        tokens[b, 1:n] = torch.randint(PI0_BOS_ID + 1, PI0_VOCAB, (n - 1,), generator=g)
        masks[b, :n] = True
    data["lang_tokens"] = tokens
    data["lang_masks"] = masks

    data["observation.state"] = torch.randn(BATCH, STATE_DIM, generator=g)
    action = torch.randn(BATCH, PI0_POLICY["chunk_size"], ACTION_DIM, generator=g)
    data["action_is_pad"] = pad_past_episode_end(action)
    data["action"] = action
    return data


def pi0_language(data):
    """The language entries of pi0's batch (its pre-processor's output, made by pi0_data)."""
    return {"observation.language.tokens": data["lang_tokens"].clone(),
            "observation.language.attention_mask": data["lang_masks"].clone()}


def pi0_time_sampling(cfg):
    """pi0's own time distribution: Beta(alpha, beta) * scale + offset, in (0.001, 1)."""
    return dict(alpha=cfg.time_sampling_beta_alpha, beta=cfg.time_sampling_beta_beta,
                scale=cfg.time_sampling_scale, offset=cfg.time_sampling_offset)


def pi0_sub_configs(policy):
    """The text, vision and expert configs of a PI0Policy."""
    pwe = policy.model.paligemma_with_expert
    return pwe.paligemma.config.text_config, pwe.paligemma.config.vision_config, pwe.gemma_expert.config


PI0 = Family(cameras=PI0_CAMERAS, prepare_images="_preprocess_images", forward_takes_flow=False,
             masked_loss=False, sub_configs=pi0_sub_configs, sample_mode="policy.eval(), prefix K/V computed once")


# ----------------------------------------------------------------------------------------------
# pi0: one case

def pi0_build_policy(flags, base_state):
    """PI0Policy at the test sizes: LeRobot's init under the seed, then the jitter (first case),
    or the first case's weights verbatim."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    cfg = pi0_policy_config(**flags)

    def make_policy():
        with tiny_pi0_sizes():
            return PI0Policy(cfg)

    return build_policy(make_policy, base_state, PI0)


def pi0_case_fields(policy, pad_id, counts, run):
    """The pi0 part of case.json: the batch, the sizes, the configs, the counts."""
    cfg = policy.config
    pwe = policy.model.paligemma_with_expert
    return {
        "camera_order": list(PI0_CAMERAS),
        "cameras": {c: {"key": cam_key(c), "height": h, "width": w} for c, (h, w) in PI0_CAMERAS.items()},
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "token_lengths": PI0_TOKEN_LENGTHS,
        "bos_id": PI0_BOS_ID,
        "pad_token_id": pad_id,
        "valid_steps": VALID_STEPS,
        "loss_uses_action_is_pad": False,
        "settings": {"policy": dict(PI0_POLICY, paligemma_variant=cfg.paligemma_variant,
                                    action_expert_variant=cfg.action_expert_variant,
                                    min_period=cfg.min_period, max_period=cfg.max_period,
                                    time_sampling=list(pi0_time_sampling(cfg).values())),
                     "vision": PI0_VISION, "gemma": PI0_GEMMA, "vocab_size": PI0_VOCAB},
        "vision_config": pwe.paligemma.config.vision_config.to_dict(),
        "text_config": pwe.paligemma.config.text_config.to_dict(),
        "expert_config": pwe.gemma_expert.config.to_dict(),
        "vision_attn_implementation": pwe.paligemma.config.vision_config._attn_implementation,
        "params_total": counts["total"],
        "params_lm_heads": counts["lm_heads"],
        "params_used": counts["used"],
        "params_parts": counts["parts"],
        "params_trainable": count_params(policy)[1],
        "trainable_names": run.trainable,
        "zero_grad_names": run.zero_grad,
        "none_grad_names": run.none_grad,
        "num_grad_tensors": len(run.grads),
        "param_shapes": {n: list(p.shape) for n, p in policy.named_parameters()},
    }


def pi0_run_case(name, flags, base_state, data, out_dir):
    """One case: PI0Policy at the test sizes with the case's flags, the computation, and
    OUT/<case>/ written (with the C trainers' c_config.txt)."""
    policy = pi0_build_policy(flags, base_state)
    # the embedding's padding_idx (its row zero, its gradient zero) is the id the batch pads with
    pad_id = policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.padding_idx
    if pad_id != 0:
        raise RuntimeError(f"{name}: pad id {pad_id}, but the batch pads the language tokens with 0")
    cfg = policy.config
    flow = flow_inputs(SEED + 2, cfg.chunk_size, cfg.max_action_dim, **pi0_time_sampling(cfg))
    batch = policy_batch(data, PI0_CAMERAS, pi0_language(data))
    run = run_policy(name, policy, batch, flow, PI0)

    ref = ref_tensors(data, batch, run, PI0_CAMERAS)
    counts = pi0_part_counts(policy.model)
    fields = pi0_case_fields(policy, pad_id, counts, run)
    info = case_info(name, flags, policy, run, PI0, {}, fields, {})
    state = save_case(out_dir / name, [policy], ref, info, run.grads, {"c_config.txt": pi0_c_config_lines(policy)})
    print_case(name, run, counts["total"], fields["params_trainable"],
               f", {len(run.zero_grad)} all zero, {len(run.none_grad)} trainable without one")
    return state


def pi0_print_released(counts):
    """The released model's counts, on stdout."""
    print(f"released pi0: {counts['total']:,} parameters, {counts['lm_heads']:,} in the two lm_heads, "
          f"{counts['used']:,} used", flush=True)
    print("  " + ", ".join(f"{part} {n:,}" for part, n in counts["parts"].items()), flush=True)
    print("  trainable without lm_heads: " + ", ".join(f"{c} {n:,}" for c, n in counts["trainable"].items()),
          flush=True)


def pi0_main(out_dir):
    """The released model's counts (OUT/released_counts.json), the batch, then every case."""
    released = pi0_released_counts()
    pi0_print_released(released)
    with open(out_dir / "released_counts.json", "w") as f:
        json.dump(released, f, indent=1)
    run_cases(pi0_run_case, data=pi0_data(SEED + 1), out_dir=out_dir)


# ----------------------------------------------------------------------------------------------
# main

FAMILIES = {"smolvla": smolvla_main, "pi0": pi0_main}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), default="smolvla",
                    help="the policy whose references are written (default smolvla)")
    ap.add_argument("-o", "--out", required=True, help="output folder (recreated)")
    args = ap.parse_args()

    t0 = time.time()
    setup_torch()
    out_dir = Path(args.out).resolve()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    FAMILIES[args.family](out_dir)
    print(f"wrote {out_dir} in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
