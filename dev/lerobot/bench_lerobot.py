"""Benchmark of LeRobot 0.6.1's OWN SmolVLA and pi0 training steps and inference (train_vla's peers).

    python dev/lerobot/bench_lerobot.py --preset smolvla --train expert --batch 32 --steps 20 \
        --warmup 5 --amp bf16 --device cuda [--compile] [--infer] [--json OUT.json]
    python dev/lerobot/bench_lerobot.py --preset smolvla --count-only      # sizes only, no step
    python dev/lerobot/bench_lerobot.py --preset tiny --device cpu --batch 2 --steps 2 --warmup 1
    python dev/lerobot/bench_lerobot.py --preset small --train all --device cpu --threads 2 --batch 8
    python dev/lerobot/bench_lerobot.py --preset pi0 --train all --batch 8 --amp bf16 --device cuda
    python dev/lerobot/bench_lerobot.py --preset pi0 --count-only --batch 8  # LeRobot's counts, on the CPU
    python dev/lerobot/bench_lerobot.py --preset pi0_tiny --device cpu --batch 2 --steps 2 --warmup 1

Random weights, nothing from the hub (HF_HUB_OFFLINE=1): a local SmolVLM folder (config,
tokenizer, processor) with the requested sizes stands in for SmolVLM2-500M-Video-Instruct.

What one timed training step is (LeRobot 0.6.1, lerobot/scripts/lerobot_train.py):
  the loop body at :601-619 (uint8 -> float conversion, which our float batch skips, then
  `batch = preprocessor(batch)`, then `update_policy(...)`), where update_policy (:105-208) is
  policy.train(); with accelerator.autocast(): loss, _ = policy.forward(batch);
  accelerator.backward(loss); accelerator.clip_grad_norm_(policy.parameters(), 10);
  optimizer.step(); optimizer.zero_grad(); lr_scheduler.step(); loss.item(); grad_norm.item().
  The Accelerator is built as at :257-262, the optimizer/scheduler are the policy presets
  (configs/train.py:274-276 -> SmolVLAConfig.get_optimizer_preset / get_scheduler_preset, built
  as optim/factory.py does), TF32 matmuls and cudnn.benchmark are on as at :291-292, and policy,
  optimizer and scheduler go through accelerator.prepare as at :546.
Not timed: dataset reading/decoding (a DataLoader with workers overlaps it in LeRobot), logging,
checkpointing. The headline figure (ms/step, samples/s) is preprocessor + update_policy; the
update_policy part alone is reported too.

Mixed precision: SmolVLAConfig has no `dtype` field, so lerobot_train.py:243-256 passes
mixed_precision=None to Accelerator unless --policy.use_amp=true (then fp16 on CUDA, the autocast
default dtype). bf16 is what `accelerate launch --mixed_precision bf16 lerobot-train ...` gives
(Accelerator reads ACCELERATE_MIXED_PRECISION): accelerate's native AMP, i.e. torch.autocast(
"cuda", torch.bfloat16) around policy.forward (prepare_model patches forward, update_policy adds
accelerator.autocast()), no grad scaler, fp32 master weights. --amp bf16 builds
Accelerator(mixed_precision="bf16"); --amp fp16 is the use_amp path; --amp none is "no" (fp32+TF32).

pi0 (--preset pi0: lerobot/pi0's sizes, 3.24B parameters used; pi0_tiny: make_ref.py's pi0 test
sizes, which its tiny_pi0_sizes puts in place at run time; pi0_small: vla/config.h's preset of that
name, put in place the same way): LeRobot's PI0Policy with random
weights, built by LeRobot's own code on the device it runs on. Nothing is read from the hub: the
policy is built from PI0Config, not from google/paligemma-3b-pt-224, and its pre-processor, whose
first step loads that tokenizer, is not used. The batch is what the pre-processor would hand the
policy: two 224 px cameras in [0, 1] (the policy resizes and rescales them), 48 language tokens
(bos, ids, right padding, the mask), the normalized state and actions. So the timed step is the
batch's copy to the device (LeRobot's DeviceProcessorStep) and update_policy; the tokenizer and
normalization are left out. PI0Config has a dtype field, which lerobot_train.py:246-249 turns
into Accelerate's mixed precision and which also sets the weights' dtype
(PaliGemmaWithExpertModel.to_bfloat16_for_selected_params): --amp bf16 is dtype="bfloat16" (bf16
weights but the vision tower, the projector and the norms, under bf16 autocast; AdamW keeps its
moments in each weight's dtype), --amp none is dtype="float32" (fp32 + TF32), the default; --amp
fp16 is refused. Inference follows lerobot_eval.py: the weights in PI0Config.dtype, no autocast.
--train defaults to all for pi0 (LeRobot's default: neither switch set). A CUDA out-of-memory
error ends the run with one line, "bench_lerobot: does not fit: ...", and exit status 3.
pi0's model FLOPs (pi0_train_flops, count="model") are vla/flops.h's for the same sizes, so both
trainers' MFU share one count (tests/bench/test_lerobot_bench.sh compares them).

The FLOP and parameter formulas (smolvla_train_flops, smolvla_infer_flops, smolvla_param_counts,
pi0_train_flops, pi0_infer_flops, pi0_param_counts) depend on nothing but the standard library so
the project's own benchmark can import them.
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# ----------------------------------------------------------------------------------------------
# Sizes
# ----------------------------------------------------------------------------------------------

# SmolVLM2-500M-Video-Instruct as SmolVLA uses it, plus SmolVLA 0.6.1's defaults.
SMOLVLA_VISION = dict(image_size=512, patch_size=16, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072, layer_norm_eps=1e-6,
                      hidden_act="gelu_pytorch_tanh")
SMOLVLA_TEXT = dict(hidden_size=960, num_attention_heads=15, num_key_value_heads=5, head_dim=64,
                    intermediate_size=2560, num_hidden_layers=32, rms_norm_eps=1e-5,
                    rope_theta=100000.0, max_position_embeddings=8192, hidden_act="silu")
SMOLVLA_VOCAB = 49280
SMOLVLA_SCALE_FACTOR = 4
# The SmolVLAConfig defaults this benchmark relies on; checked against the installed LeRobot.
SMOLVLA_POLICY_DEFAULTS = dict(chunk_size=50, n_action_steps=50, max_state_dim=32, max_action_dim=32,
                               resize_imgs_with_padding=(512, 512), num_steps=10, num_vlm_layers=16,
                               tokenizer_max_length=48, expert_width_multiplier=0.75,
                               self_attn_every_n_layers=2, attention_mode="cross_attn",
                               num_expert_layers=-1, train_state_proj=True, use_cache=True,
                               add_image_special_tokens=False, pad_language_to="longest")

# The released model's parameter counts, as LeRobot counts them (README.md, The model: SmolVLA).
SMOLVLA_EXPECTED = {"total": 450_046_176, "expert": 99_880_992}

# Data as a LeRobot dataset would hand it over (Meta-World/LIBERO-like: two cameras, small state).
CAMERAS = ("top", "wrist")
FRAME_HW = (224, 224)
STATE_DIM = 6
ACTION_DIM = 5
TASKS = (
    "push the button",
    "open the top drawer",
    "put the cream cheese in the bowl",
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
)
SEED = 0

TRAIN_FLAGS = {  # LeRobot's own switches for each training mode
    "expert": dict(train_expert_only=True, freeze_vision_encoder=True),
    "vlm": dict(train_expert_only=False, freeze_vision_encoder=True),
    "all": dict(train_expert_only=False, freeze_vision_encoder=False),
}

# Dense bf16 tensor-core peak (no sparsity), FLOP/s.
PEAK_BF16 = (("H100 PCIe", 756.0e12), ("H100", 989.4e12), ("H200", 989.4e12), ("GH200", 989.4e12),
             ("A100", 312.0e12))


def expert_mlp_size(width):
    """LeRobot's rounding of the expert MLP width (smolvlm_with_expert.get_intermediate_size)."""
    hidden = int(4 * int(2 * width / 3))
    return 256 * ((hidden + 255) // 256)


def flat_sizes(vision, text, scale_factor, vocab, policy, n_cams):
    """One flat dict of every size the formulas below need."""
    width = text["hidden_size"]
    expert_width = int(width * policy["expert_width_multiplier"])
    vlm_layers = policy["num_vlm_layers"] if policy["num_vlm_layers"] > 0 else text["num_hidden_layers"]
    return dict(
        image=vision["image_size"], patch=vision["patch_size"], v_width=vision["hidden_size"],
        v_layers=vision["num_hidden_layers"], v_mlp=vision["intermediate_size"],
        scale_factor=scale_factor,
        width=width, heads=text["num_attention_heads"], kv_heads=text["num_key_value_heads"],
        head_dim=text["head_dim"], mlp=text["intermediate_size"], vlm_layers=vlm_layers,
        vocab=vocab,
        e_width=expert_width, e_mlp=expert_mlp_size(expert_width),
        sa_every=policy["self_attn_every_n_layers"],
        chunk=policy["chunk_size"], state_max=policy["max_state_dim"],
        action_max=policy["max_action_dim"], num_steps=policy["num_steps"], n_cams=n_cams,
    )


def smolvla_sizes(n_cams=2):
    return flat_sizes(SMOLVLA_VISION, SMOLVLA_TEXT, SMOLVLA_SCALE_FACTOR, SMOLVLA_VOCAB,
                      SMOLVLA_POLICY_DEFAULTS, n_cams)


def image_tokens(sz):
    return (sz["image"] // sz["patch"]) ** 2 // sz["scale_factor"] ** 2


def prefix_len(sz, lang_len):
    """Prefix tokens: every camera's image tokens, the (padded) language tokens, one state token."""
    return sz["n_cams"] * image_tokens(sz) + lang_len + 1


# ----------------------------------------------------------------------------------------------
# Parameter count, analytic
# ----------------------------------------------------------------------------------------------

def smolvla_param_counts(sz):
    """Parameters as LeRobot counts them (sum of numel over policy.parameters())."""
    dv, mv, p = sz["v_width"], sz["v_mlp"], sz["patch"]
    n_patch = (sz["image"] // p) ** 2
    vision = (3 * p * p * dv + dv) + n_patch * dv + 2 * dv  # patch conv, positions, post-LN
    vision += sz["v_layers"] * (4 * (dv * dv + dv) + (dv * mv + mv) + (mv * dv + dv) + 4 * dv)
    connector = dv * sz["scale_factor"] ** 2 * sz["width"]
    d, q, kv = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"]
    vlm_layer = d * q + 2 * d * kv + q * d + 3 * d * sz["mlp"] + 2 * d
    embed = sz["vocab"] * d
    lm_head = sz["vocab"] * d
    text = embed + sz["vlm_layers"] * vlm_layer + d  # + final norm
    de, me = sz["e_width"], sz["e_mlp"]
    expert = de  # final norm
    for i in range(sz["vlm_layers"]):
        kv_in = de if i % sz["sa_every"] == 0 else kv  # odd layers: k/v re-project the VLM's K/V
        expert += de * q + q * de + 2 * kv_in * kv + 3 * de * me + 2 * de
    heads = ((sz["state_max"] * d + d) + (sz["action_max"] * de + de) + (de * sz["action_max"] + sz["action_max"])
             + (2 * de * de + de) + (de * de + de))
    total = vision + connector + text + lm_head + expert + heads
    # train_expert_only=False freezes lm_head, the text model's final norm and its last layer.
    all_trainable = total - lm_head - d - vlm_layer
    return {
        "total": total, "total_without_lm_head": total - lm_head, "lm_head": lm_head,
        "vision": vision, "connector": connector, "text_model": text, "expert": expert, "heads": heads,
        "trainable": {"expert": expert + heads, "vlm": all_trainable - vision, "all": all_trainable},
    }


# ----------------------------------------------------------------------------------------------
# FLOPs, analytic
# ----------------------------------------------------------------------------------------------

class _Tally:
    """Per-component forward and backward FLOPs."""

    def __init__(self):
        self.rows = {}

    def add(self, name, fwd, bwd):
        r = self.rows.setdefault(name, [0, 0])
        r[0] += fwd
        r[1] += bwd

    def linear(self, name, tokens, d_in, d_out, dx, dw):
        """y = x W^T over `tokens` rows: forward 2*t*in*out; backward adds one such product for
        dX (when the gradient must reach x's producers) and one for dW (when W trains)."""
        f = 2 * tokens * d_in * d_out
        self.add(name, f, f * (int(dx) + int(dw)))

    def attention(self, name, n_q, n_k, width, dq, dk, dv):
        """Scores Q K^T (n_q x n_k, summed over heads: 2*n_q*n_k*width) and probs @ V (the same).
        Backward: dQ and/or dK for the scores, dP (whenever Q or K needs a gradient) and/or dV for
        the value product, each the size of one forward product. Dense rectangles: masked pairs
        are counted, as every implementation that materializes the scores computes them."""
        f = 2 * n_q * n_k * width
        self.add(name, 2 * f, f * (int(dq) + int(dk) + int(dq or dk) + int(dv)))

    def result(self, batch):
        comp = {k: {"fwd": v[0] * batch, "bwd": v[1] * batch} for k, v in self.rows.items()}
        fwd = sum(v["fwd"] for v in comp.values())
        bwd = sum(v["bwd"] for v in comp.values())
        return {"total": fwd + bwd, "forward": fwd, "backward": bwd,
                "per_sample": (fwd + bwd) / batch, "components": comp}


def _vision_and_connector(t, sz, train_vision, train_connector, backward=True):
    dv, mv, p = sz["v_width"], sz["v_mlp"], sz["patch"]
    n = (sz["image"] // p) ** 2
    g = train_vision and backward
    for _ in range(sz["n_cams"]):
        t.linear("vision.patch_embed", n, 3 * p * p, dv, dx=False, dw=g)
        for _ in range(sz["v_layers"]):
            t.linear("vision.qkv_o", n, dv, 4 * dv, dx=g, dw=g)
            t.linear("vision.mlp", n, dv, 2 * mv, dx=g, dw=g)  # fc1 (dv->mv) + fc2 (mv->dv)
            t.attention("vision.attention", n, n, dv, g, g, g)
        n_img = n // sz["scale_factor"] ** 2
        t.linear("connector", n_img, dv * sz["scale_factor"] ** 2, sz["width"],
                 dx=g, dw=train_connector and backward)


def smolvla_train_flops(sz, batch, lang_len, train="expert", count="model"):
    """FLOPs of one SmolVLA training step (forward + backward), for a batch of `batch` samples
    whose language tokens are padded to `lang_len`. Matrix products only: norms, RoPE, softmax,
    activations, the loss and the optimizer update (about 10-15 FLOPs per trainable parameter)
    are not counted, nor the embedding lookups.

    Forward, per sample (P = prefix tokens = cams*image_tokens + lang_len + 1, C = chunk):
      vision per camera: patch 2*N*(3p^2)*Dv, per layer 2*N*Dv*4Dv (q,k,v,o) + 2*N*2*Dv*Mv (mlp)
        + 4*N^2*Dv (attention), connector 2*(N/s^2)*(Dv s^2)*D;
      VLM layer: 2*P*D*(Q+2KV) + 2*P*Q*D + 2*P*3*D*M;
      expert layer: 2*C*De*Q + 2*C*Q*De + 2*C*3*De*Me, plus k/v 2*C*De*2KV in even (joint)
        layers, 2*P*KV*2KV (the expert re-projecting the VLM's K/V) in odd (cross) layers;
      attention: even layers 4*(P+C)^2*Q over the joint sequence, odd layers 4*P^2*Q (VLM) +
        4*C*P*Q (expert queries on the VLM's keys);
      heads: state_proj 2*Sd*D (one token), action_in 2*C*Ad*De, time MLP 2*C*(2De*De + De*De),
        action_out 2*C*De*Ad.
    Backward: every product adds one product's worth for each input gradient that is computed:
      dW where the weight trains, dX where a gradient must reach the input's producers. So 3x for
      trainable layers inside the graph, 2x for a trainable first layer (patch embedding,
      action_in_proj, state_proj) or a frozen layer the gradient crosses, 1x (forward only) off
      the gradient's path (the vision tower when frozen, the last VLM layer's q/attention/o/MLP,
      whose output feeds nothing).
    count="autograd": what PyTorch's autograd executes for LeRobot's code. With
      train_expert_only the VLM is frozen, but the state token (state_proj trains) is concatenated
      into the prefix, so the whole prefix tensor requires grad and every VLM product on the path
      also runs its dX over all P rows. Checked exactly against torch's FlopCounterMode.
    count="model": the gradients the trainable parameters need. In expert mode that drops the
      VLM's backward (only the state token's own row needs it: under 1/P of it, not counted),
      keeps dW of the expert's cross-attention k/v (no dX into the frozen VLM), and in the joint
      attention of even layers only the C action rows/keys carry gradients: dQ and dP C x (P+C),
      dK and dV C x C. In vlm/all modes it equals "autograd".
    MFU uses count="model": a property of the model and batch, not of an implementation.
    """
    if train not in TRAIN_FLAGS or count not in ("model", "autograd"):
        raise ValueError(f"train={train!r} count={count!r}")
    L = sz["vlm_layers"]
    if (L - 1) % sz["sa_every"] == 0:
        raise NotImplementedError("formula assumes the last VLM layer is a cross-attention layer")
    d, q, kv, m = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"], sz["mlp"]
    de, me, C = sz["e_width"], sz["e_mlp"], sz["chunk"]
    P = prefix_len(sz, lang_len)
    T = P + C
    train_vision = train == "all"
    train_vlm = train in ("vlm", "all")
    # Does the prefix's hidden state carry a gradient into the VLM products?
    g = True if count == "autograd" else train_vlm
    t = _Tally()
    _vision_and_connector(t, sz, train_vision, train_vlm)
    for i in range(L):
        last = i == L - 1
        joint = i % sz["sa_every"] == 0
        gl = g and not last  # last layer: only its k/v feed the expert
        wl = train_vlm and not last
        t.linear("vlm.q", P, d, q, dx=gl, dw=wl)
        t.linear("vlm.kv", P, d, 2 * kv, dx=g, dw=wl)
        t.linear("vlm.o", P, q, d, dx=gl, dw=wl)
        t.linear("vlm.mlp", P, d, 3 * m, dx=gl, dw=wl)  # gate, up (d->m) and down (m->d)
        t.linear("expert.q_o", C, de, 2 * q, dx=True, dw=True)
        t.linear("expert.mlp", C, de, 3 * me, dx=True, dw=True)
        if joint:
            t.linear("expert.kv", C, de, 2 * kv, dx=True, dw=True)
            if g:
                t.attention("attn.joint", T, T, q, True, True, True)
            else:  # model count, expert mode: only the C action rows carry gradients
                f_rect, f_sq = 2 * C * T * q, 2 * C * C * q
                t.add("attn.joint", 2 * (2 * T * T * q), 2 * f_rect + 2 * f_sq)
        else:
            t.linear("expert.kv_cross", P, kv, 2 * kv, dx=g, dw=True)
            t.attention("attn.vlm_prefix", P, P, q, gl, gl, gl)
            t.attention("attn.expert_cross", C, P, q, True, True, True)
    t.linear("head.state_proj", 1, sz["state_max"], d, dx=False, dw=True)
    t.linear("head.action_in_proj", C, sz["action_max"], de, dx=False, dw=True)
    t.linear("head.action_time_mlp", C, de, 3 * de, dx=True, dw=True)  # in (2De->De) + out (De->De)
    t.linear("head.action_out_proj", C, de, sz["action_max"], dx=True, dw=True)
    out = t.result(batch)
    out.update(prefix_tokens=P, suffix_tokens=C, lang_tokens=lang_len, batch=batch, train=train, count=count)
    return out


def smolvla_infer_flops(sz, batch, lang_len):
    """FLOPs of one action chunk as LeRobot samples it (sample_actions with use_cache=True): the
    prefix once (every VLM layer runs self-attention over it to fill the K/V cache), then
    num_steps denoise steps of the expert (even layers attend [cached prefix; actions], odd
    layers re-project the cached VLM K/V with their own k/v, every step)."""
    d, q, kv, m = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"], sz["mlp"]
    de, me, C = sz["e_width"], sz["e_mlp"], sz["chunk"]
    P = prefix_len(sz, lang_len)
    t = _Tally()
    _vision_and_connector(t, sz, False, False, backward=False)
    for _ in range(sz["vlm_layers"]):
        t.linear("vlm.qkvo_mlp", P, d, 2 * q + 2 * kv + 3 * m, dx=False, dw=False)
        t.attention("attn.vlm_prefix", P, P, q, False, False, False)
    t.linear("head.state_proj", 1, sz["state_max"], d, dx=False, dw=False)
    for _ in range(sz["num_steps"]):
        for i in range(sz["vlm_layers"]):
            t.linear("expert.q_o_mlp", C, de, 2 * q + 3 * me, dx=False, dw=False)
            if i % sz["sa_every"] == 0:
                t.linear("expert.kv", C, de, 2 * kv, dx=False, dw=False)
                t.attention("attn.expert_self", C, P + C, q, False, False, False)
            else:
                t.linear("expert.kv_cross", P, kv, 2 * kv, dx=False, dw=False)
                t.attention("attn.expert_cross", C, P, q, False, False, False)
        t.linear("head.action_in_time_out", C, 1, sz["action_max"] * de + 3 * de * de + de * sz["action_max"],
                 dx=False, dw=False)
    out = t.result(batch)
    out.update(prefix_tokens=P, suffix_tokens=C, lang_tokens=lang_len, batch=batch)
    return out


def peak_bf16_flops(device_name):
    for key, peak in PEAK_BF16:
        if key.lower() in device_name.lower():
            return peak
    return None


# ----------------------------------------------------------------------------------------------
# pi0: sizes, parameter count and FLOPs, analytic
# ----------------------------------------------------------------------------------------------

# lerobot/pi0's model (PaliGemma 3B: SigLIP so400m/14 and Gemma 2B, with the Gemma 300M expert),
# as LeRobot 0.6.1's PI0Pytorch builds it: get_gemma_config's two variants, the SigLIP sizes and
# the vocabulary fixed in PaliGemmaWithExpertModel.__init__, PI0Config's defaults. Checked against
# the built model (pi0_sizes_of) whenever one is built.
PI0_VISION = dict(image_size=224, patch_size=14, hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                  num_attention_heads=16)
PI0_GEMMA = {
    "gemma_2b": dict(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
PI0_VOCAB = 257152
PI0_POLICY_DEFAULTS = dict(chunk_size=50, n_action_steps=50, max_state_dim=32, max_action_dim=32,
                           num_inference_steps=10, image_resolution=(224, 224), tokenizer_max_length=48,
                           paligemma_variant="gemma_2b", action_expert_variant="gemma_300m")
# The released model's counts as LeRobot's module holds them (docs/pi0.md): the two lm_heads feed
# nothing; "trained" is what gets a gradient in each mode, as vla/config.h's table marks it.
PI0_EXPECTED = {"total": 4_028_019_472, "used": 3_238_048_528, "lm_heads": 789_970_944,
                "trained": {"expert": 314_713_120, "vlm": 2_720_744_480, "all": 3_133_186_832}}
PI0_PRESETS = ("pi0", "pi0_tiny", "pi0_small")
# vla/config.h's pi0_small in make_ref.py's fields (its PI0_VISION, PI0_GEMMA, PI0_VOCAB, PI0_POLICY)
PI0_SMALL = dict(
    vision=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, patch_size=16),
    gemma={"gemma_2b": dict(width=64, depth=2, mlp_dim=192, num_heads=8, num_kv_heads=1, head_dim=8),
           "gemma_300m": dict(width=48, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=8)},
    vocab=256,
    policy=dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32, num_inference_steps=10,
                image_resolution=(64, 64), tokenizer_max_length=48))


def pi0_flat_sizes(vision, vlm, expert, vocab, policy, n_cams):
    """One flat dict of every size the pi0 formulas need (vision: SigLIP's config fields; vlm and
    expert: get_gemma_config's; policy: PI0Config's fields)."""
    return dict(
        family="pi0", image=policy["image_resolution"][0], patch=vision["patch_size"],
        v_width=vision["hidden_size"], v_layers=vision["num_hidden_layers"], v_mlp=vision["intermediate_size"],
        v_heads=vision["num_attention_heads"], scale_factor=1,
        width=vlm["width"], heads=vlm["num_heads"], kv_heads=vlm["num_kv_heads"], head_dim=vlm["head_dim"],
        mlp=vlm["mlp_dim"], vlm_layers=vlm["depth"], vocab=vocab,
        e_width=expert["width"], e_mlp=expert["mlp_dim"], e_layers=expert["depth"], e_heads=expert["num_heads"],
        e_kv_heads=expert["num_kv_heads"], e_head_dim=expert["head_dim"],
        chunk=policy["chunk_size"], state_max=policy["max_state_dim"], action_max=policy["max_action_dim"],
        num_steps=policy["num_inference_steps"], lang=policy["tokenizer_max_length"], n_cams=n_cams,
    )


def pi0_sizes(n_cams=2):
    return pi0_flat_sizes(PI0_VISION, PI0_GEMMA["gemma_2b"], PI0_GEMMA["gemma_300m"], PI0_VOCAB,
                          PI0_POLICY_DEFAULTS, n_cams)


def _pi0_check_shared(sz):
    """The two stacks share one attention: heads, KV heads, head size and depth (LeRobot reshapes
    the joint attention to 8 heads; vla/config.h has one set of these fields)."""
    pairs = [("heads", "e_heads"), ("kv_heads", "e_kv_heads"), ("head_dim", "e_head_dim"), ("vlm_layers", "e_layers")]
    bad = [f"{a} {sz[a]} vs {b} {sz[b]}" for a, b in pairs if sz[a] != sz[b]]
    if bad:
        raise ValueError("the VLM and the expert differ: " + ", ".join(bad))


def pi0_prefix_len(sz, lang_len):
    """Prefix tokens: every camera's patches (no pixel shuffle), the language tokens padded to
    lang_len. The state token is the suffix's."""
    return sz["n_cams"] * (sz["image"] // sz["patch"]) ** 2 + lang_len


def pi0_param_counts(sz):
    """Parameters of LeRobot's PI0Pytorch by part, what requires grad in each mode (lm_heads
    left out) and what gets a gradient ("trained"): in vlm and all modes the last VLM layer's
    o_proj, MLP and post-attention norm and the VLM's final norm require grad but feed nothing."""
    _pi0_check_shared(sz)
    dv, mv, p = sz["v_width"], sz["v_mlp"], sz["patch"]
    n_patch = (sz["image"] // p) ** 2
    vision = (3 * p * p * dv + dv) + n_patch * dv + 2 * dv  # patch conv, positions, post-LN
    vision += sz["v_layers"] * (4 * (dv * dv + dv) + (dv * mv + mv) + (mv * dv + dv) + 4 * dv)
    d, q, kv = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"]
    projector = dv * d + d
    embedding = sz["vocab"] * d
    qkv, out_mlp = d * q + 2 * d * kv + d, q * d + 3 * d * sz["mlp"] + d  # with input / post-attention norm
    vlm_layers = sz["vlm_layers"] * (qkv + out_mlp)
    de, me = sz["e_width"], sz["e_mlp"]
    expert = sz["vlm_layers"] * (de * q + 2 * de * kv + q * de + 3 * de * me + 2 * de) + de  # + final norm
    sm, am = sz["state_max"], sz["action_max"]
    projections = (sm * de + de) + (am * de + de) + (de * am + am) + (2 * de * de + de) + (de * de + de)
    lm_heads = sz["vocab"] * d + sz["vocab"] * de
    used = vision + projector + embedding + vlm_layers + d + expert + projections
    no_grad = out_mlp + d  # the last layer's o_proj, MLP and post norm, the final norm
    requires = {"expert": expert + projections, "vlm": used - vision, "all": used}
    return {
        "total": used + lm_heads, "used": used, "lm_heads": lm_heads, "vision": vision, "projector": projector,
        "embedding": embedding, "vlm_layers": vlm_layers, "expert": expert, "projections": projections,
        "requires_grad": requires,
        "trained": {m: v - (no_grad if m != "expert" else 0) for m, v in requires.items()},
    }


def pi0_train_flops(sz, batch, lang_len, train="all", count="model"):
    """FLOPs of one pi0 training step (forward + backward) for `batch` samples, the language
    padded to lang_len (LeRobot's tokenizer pads to tokenizer_max_length, 48). Matrix products
    and attention only, as smolvla_train_flops counts.

    Per sample: P = cams * (img/patch)^2 + lang_len prefix tokens, S = chunk + 1 suffix tokens (the
    state token, then the actions), T = P + S; every layer is joint.
    count="model": vla/flops.h's flow_flops_per_sample for the pi0 family, term by term (what
      train_vla's MFU divides by): vision 2*N*3p^2*Dv + Lv*(2*N*(4Dv^2 + 2Dv*Mv) + 4N^2*Dv) per
      camera, the projector 2*N*Dv*D per camera, the VLM (L-1)*(2P*(2DQ + 2D*KV + 3DM) + 4P^2*Q)
      plus the last layer's keys and values 2P*2D*KV (its queries, o_proj and MLP feed nothing),
      the expert per layer 2S*(2De*Q + 3De*Me + 2De*KV) + 4S*(P+S)*Q over the suffix, its heads
      over the chunk 2H*(Ad*De + 3De^2) + 2H*De*Ad and state_proj 2*Sd*De; the backward is 2x the
      forward of the expert always, of the VLM and projector in vlm and all modes, of the vision
      tower in all mode (nothing goes back into the VLM in expert mode: the state is the expert's).
    count="autograd": what autograd executes for LeRobot's PI0Pytorch (checked exactly against
      torch's FlopCounterMode): every VLM layer runs o_proj and the MLP on the prefix; the joint
      attention is one dense T x T product pair per layer whose backward (dQ, dK, dP, dV over all
      T rows) runs in every mode, because the concatenated queries, keys and values require grad;
      so in expert mode too the prefix's hidden states require grad from the first layer's
      attention on, and every frozen VLM product on the loss's path runs its input gradient. The
      rotary embedding's (head_dim/2 x 1) @ (1 x T) product runs once per layer. First layers
      (the patch convolution, state_proj, action_in_proj, a frozen tower's projector) run their
      weight gradient alone.
    """
    if train not in TRAIN_FLAGS or count not in ("model", "autograd"):
        raise ValueError(f"train={train!r} count={count!r}")
    _pi0_check_shared(sz)
    cams, n, p = sz["n_cams"], (sz["image"] // sz["patch"]) ** 2, sz["patch"]
    dv, mv, lv = sz["v_width"], sz["v_mlp"], sz["v_layers"]
    d, q, kv = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"]
    m, L = sz["mlp"], sz["vlm_layers"]
    de, me, H, sd, ad = sz["e_width"], sz["e_mlp"], sz["chunk"], sz["state_max"], sz["action_max"]
    S = H + 1
    P = pi0_prefix_len(sz, lang_len)
    T = P + S
    train_vision, train_vlm = train == "all", train in ("vlm", "all")
    t = _Tally()
    if count == "model":
        vision = cams * (2 * n * 3 * p * p * dv + lv * (2 * n * (4 * dv * dv + 2 * dv * mv) + 4 * n * n * dv))
        t.add("vision", vision, 2 * vision * train_vision)
        projector = cams * 2 * n * dv * d
        t.add("projector", projector, 2 * projector * train_vlm)
        vlm = (L - 1) * (2 * P * (2 * d * q + 2 * d * kv + 3 * d * m) + 4 * P * P * q) + 2 * P * 2 * d * kv
        t.add("vlm", vlm, 2 * vlm * train_vlm)
        layers = L * (2 * S * (2 * de * q + 3 * de * me) + 2 * S * 2 * de * kv + 4 * S * (P + S) * q)
        t.add("expert.layers", layers, 2 * layers)
        heads = 2 * H * (ad * de + 3 * de * de) + 2 * H * de * ad
        t.add("expert.heads", heads, 2 * heads)
        t.add("state_proj", 2 * sd * de, 2 * 2 * sd * de)
    else:
        for _ in range(cams):
            t.linear("vision.patch_embed", n, 3 * p * p, dv, dx=False, dw=train_vision)
            for _ in range(lv):
                t.linear("vision.qkv_o", n, dv, 4 * dv, dx=train_vision, dw=train_vision)
                t.linear("vision.mlp", n, dv, 2 * mv, dx=train_vision, dw=train_vision)
                t.attention("vision.attention", n, n, dv, train_vision, train_vision, train_vision)
            t.linear("projector", n, dv, d, dx=train_vision, dw=train_vlm)
        for i in range(L):
            last = i == L - 1
            x_grad = train_vlm or i > 0  # the prefix's input to layer i requires grad
            t.linear("vlm.qkv", P, d, q + 2 * kv, dx=x_grad, dw=train_vlm)
            t.linear("vlm.o_mlp", P, q, d, dx=not last, dw=train_vlm and not last)
            t.linear("vlm.o_mlp", P, d, 3 * m, dx=not last, dw=train_vlm and not last)
            t.linear("expert.qkvo_mlp", S, de, 2 * q + 2 * kv + 3 * me, dx=True, dw=True)
            t.attention("attn.joint", T, T, q, True, True, True)
            t.add("rope", sz["head_dim"] * T, 0)
        t.linear("head.state_proj", 1, sd, de, dx=False, dw=True)
        t.linear("head.action_in_proj", H, ad, de, dx=False, dw=True)
        t.linear("head.action_time_mlp", H, de, 3 * de, dx=True, dw=True)  # in (2De->De) + out (De->De)
        t.linear("head.action_out_proj", H, de, ad, dx=True, dw=True)
    out = t.result(batch)
    out.update(prefix_tokens=P, suffix_tokens=S, lang_tokens=lang_len, batch=batch, train=train, count=count)
    return out


def pi0_infer_flops(sz, batch, lang_len):
    """FLOPs of one action chunk as LeRobot's sample_actions computes it: the prefix once (every
    VLM layer over the P prefix tokens, o_proj and MLP included, to fill the K/V cache; the rotary
    embedding's product once), then num_steps Euler steps of the expert over the S = chunk + 1
    suffix tokens against [cached prefix; suffix] keys, each with its own rotary product and the
    state, action and time projections."""
    _pi0_check_shared(sz)
    cams, n, p = sz["n_cams"], (sz["image"] // sz["patch"]) ** 2, sz["patch"]
    dv, mv = sz["v_width"], sz["v_mlp"]
    d, q, kv = sz["width"], sz["heads"] * sz["head_dim"], sz["kv_heads"] * sz["head_dim"]
    m, L = sz["mlp"], sz["vlm_layers"]
    de, me, H, sd, ad = sz["e_width"], sz["e_mlp"], sz["chunk"], sz["state_max"], sz["action_max"]
    S = H + 1
    P = pi0_prefix_len(sz, lang_len)
    t = _Tally()
    for _ in range(cams):
        t.linear("vision", n, 3 * p * p, dv, dx=False, dw=False)
        for _ in range(sz["v_layers"]):
            t.linear("vision", n, dv, 4 * dv + 2 * mv, dx=False, dw=False)
            t.attention("vision.attention", n, n, dv, False, False, False)
        t.linear("projector", n, dv, d, dx=False, dw=False)
    t.add("rope", sz["head_dim"] * P, 0)
    for _ in range(L):
        t.linear("vlm.qkvo_mlp", P, d, 2 * q + 2 * kv + 3 * m, dx=False, dw=False)
        t.attention("attn.vlm_prefix", P, P, q, False, False, False)
    for _ in range(sz["num_steps"]):
        t.add("rope", sz["head_dim"] * S, 0)
        for _ in range(L):
            t.linear("expert.qkvo_mlp", S, de, 2 * q + 2 * kv + 3 * me, dx=False, dw=False)
            t.attention("attn.expert", S, P + S, q, False, False, False)
        t.linear("head.state_proj", 1, sd, de, dx=False, dw=False)
        t.linear("head.action_in_time_out", H, 1, ad * de + 3 * de * de + de * ad, dx=False, dw=False)
    out = t.result(batch)
    out.update(prefix_tokens=P, suffix_tokens=S, lang_tokens=lang_len, batch=batch)
    return out


# ----------------------------------------------------------------------------------------------
# LeRobot side
# ----------------------------------------------------------------------------------------------

class BenchError(Exception):
    """A known, user-facing problem: printed as one line, exit status 2."""


# train_vla's `small` preset (vla/config.h, FLOW_PRESETS) in LeRobot's terms, so that dev/bench_cpu.sh
# times both trainers on the same model. The vocabulary is the stand-in tokenizer's, not 256 bytes.
SMALL_VISION = dict(image_size=64, patch_size=8, hidden_size=48, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=96, layer_norm_eps=1e-6,
                    hidden_act="gelu_pytorch_tanh")
SMALL_TEXT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=192, num_hidden_layers=2, rms_norm_eps=1e-5,
                  rope_theta=100000.0, max_position_embeddings=512, hidden_act="silu")
SMALL_POLICY = dict(chunk_size=8, n_action_steps=8, max_state_dim=32, max_action_dim=32,
                    resize_imgs_with_padding=(64, 64), num_steps=10, num_vlm_layers=2,
                    tokenizer_max_length=48)


def preset_config(preset):
    """(vision, text, scale_factor, vocab or None = tokenizer size, policy kwargs to pass)."""
    if preset == "smolvla":
        return SMOLVLA_VISION, SMOLVLA_TEXT, SMOLVLA_SCALE_FACTOR, SMOLVLA_VOCAB, {}
    if preset == "small":
        return SMALL_VISION, SMALL_TEXT, 2, None, dict(SMALL_POLICY)
    sys.path.insert(0, str(HERE))
    import make_ref  # the reference generator's tiny sizes
    return (make_ref.SMOLVLA_VISION, make_ref.SMOLVLA_TEXT, make_ref.SMOLVLA_SCALE_FACTOR, None,
            dict(make_ref.SMOLVLA_POLICY))


def build_vlm_dir(out_dir, vision, text, scale_factor, vocab):
    """A local stand-in for the SmolVLM checkpoint folder LeRobot reads (config, tokenizer,
    processor). The tokenizer is byte-level BPE trained on TASKS with merges enough to make each
    word one token, as SmolLM2's 49k vocabulary does for common English words, so instruction
    lengths are realistic. The special tokens are make_ref.py's."""
    sys.path.insert(0, str(HERE))
    from make_ref import SMOLVLA_SPECIAL_TOKENS as SPECIAL_TOKENS
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (AutoTokenizer, PreTrainedTokenizerFast, SmolVLMConfig, SmolVLMImageProcessor,
                              SmolVLMProcessor, SmolVLMVideoProcessor)

    out_dir.mkdir(parents=True, exist_ok=True)
    specials = sorted(set(SPECIAL_TOKENS.values()), key=list(SPECIAL_TOKENS.values()).index)
    core = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk"]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(
        [task + "\n" for task in TASKS] * 4,
        trainer=trainers.BpeTrainer(vocab_size=4096, min_frequency=1, special_tokens=specials,
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                    show_progress=False))
    named = {k: v for k, v in SPECIAL_TOKENS.items() if k.endswith("_token")}
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token=SPECIAL_TOKENS["unk"],
                            bos_token=SPECIAL_TOKENS["bos"], eos_token=SPECIAL_TOKENS["end_of_utterance_token"],
                            pad_token=SPECIAL_TOKENS["pad"], extra_special_tokens=named).save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    edge = {"longest_edge": vision["image_size"]}
    n_img = (vision["image_size"] // vision["patch_size"]) ** 2 // scale_factor**2
    SmolVLMProcessor(image_processor=SmolVLMImageProcessor(size=edge, max_image_size=edge, do_image_splitting=False),
                     video_processor=SmolVLMVideoProcessor(size=edge, max_image_size=edge),
                     tokenizer=tok, image_seq_len=n_img).save_pretrained(out_dir)
    text_cfg = dict(text, model_type="llama", vocab_size=vocab or len(tok), pad_token_id=tok.pad_token_id,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, attention_bias=False,
                    mlp_bias=False, attention_dropout=0.0, tie_word_embeddings=False)
    SmolVLMConfig(vision_config=dict(vision, num_channels=3, attention_dropout=0.0), text_config=text_cfg,
                  scale_factor=scale_factor, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
                  image_token_id=tok.convert_tokens_to_ids(SPECIAL_TOKENS["image_token"])).save_pretrained(out_dir)
    return text_cfg["vocab_size"]


def policy_config(vlm_dir, train, device, policy_kwargs, compile_mode):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

    feats = {f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, *FRAME_HW))
             for c in CAMERAS}
    feats["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    extra = dict(compile_model=True, compile_mode=compile_mode) if compile_mode else {}
    cfg = SmolVLAConfig(input_features=feats,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
                        device=device, push_to_hub=False, vlm_model_name=str(vlm_dir), load_vlm_weights=False,
                        **TRAIN_FLAGS[train], **policy_kwargs, **extra)
    if not policy_kwargs:  # smolvla preset: LeRobot's defaults must be the released model's
        wrong = {k: (getattr(cfg, k), v) for k, v in SMOLVLA_POLICY_DEFAULTS.items()
                 if (tuple(getattr(cfg, k)) if isinstance(v, tuple) else getattr(cfg, k)) != v}
        if wrong:
            raise BenchError(f"SmolVLAConfig defaults differ from the released model's: {wrong}")
    return cfg


def sizes_of(cfg, vision, text, scale_factor, vocab):
    pol = {k: getattr(cfg, k) for k in ("expert_width_multiplier", "num_vlm_layers", "self_attn_every_n_layers",
                                         "chunk_size", "max_state_dim", "max_action_dim", "num_steps")}
    return flat_sizes(vision, text, scale_factor, vocab, pol, len(CAMERAS))


def make_raw_batch(batch, chunk, torch):
    """Fixed random batch as LeRobot's DataLoader returns it (images float32 in [0,1], CHW), and
    dataset stats. Some samples sit near their episode's end: their last chunk slots are pads
    that repeat the final frame, as LeRobot's clamped indexing does."""
    g = torch.Generator().manual_seed(SEED)
    raw = {f"observation.images.{c}": torch.rand(batch, 3, *FRAME_HW, generator=g) for c in CAMERAS}
    s_mean, s_std = torch.randn(STATE_DIM, generator=g), torch.rand(STATE_DIM, generator=g) + 0.2
    a_mean, a_std = torch.randn(ACTION_DIM, generator=g), torch.rand(ACTION_DIM, generator=g) + 0.2
    state = s_mean + s_std * torch.randn(batch, STATE_DIM, generator=g)
    action = a_mean + a_std * torch.randn(batch, chunk, ACTION_DIM, generator=g)
    is_pad = torch.zeros(batch, chunk, dtype=torch.bool)
    for b in range(0, batch, 3):  # every third sample ends inside its chunk
        valid = 1 + (7 * b + chunk // 2) % chunk
        is_pad[b, valid:] = True
        action[b, valid:] = action[b, valid - 1]
    raw.update({"observation.state": state, "action": action, "action_is_pad": is_pad,
                "task": [TASKS[b % len(TASKS)] for b in range(batch)]})
    stats = {"observation.state": {"mean": s_mean, "std": s_std, "min": state.min(0).values, "max": state.max(0).values},
             "action": {"mean": a_mean, "std": a_std, "min": action.amin((0, 1)), "max": action.amax((0, 1))}}
    for c in CAMERAS:
        stats[f"observation.images.{c}"] = {k: torch.full((3, 1, 1), v) for k, v in
                                            (("mean", 0.5), ("std", 0.29), ("min", 0.0), ("max", 1.0))}
    stats = {k: {s: v.numpy() for s, v in d.items()} for k, d in stats.items()}
    return raw, stats


def fresh(raw):
    """A new dict per step, as the DataLoader yields (the pipeline must not see a reused list)."""
    return {k: (list(v) if isinstance(v, list) else v) for k, v in raw.items()}


def count_params(policy):
    total = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    lm_head = policy.model.vlm_with_expert.vlm.lm_head.weight.numel()
    return {"total": total, "trainable": trainable, "total_without_lm_head": total - lm_head,
            "trainable_without_lm_head": trainable - (lm_head if policy.model.vlm_with_expert.vlm.lm_head.weight.requires_grad else 0)}


def _meta_truths(torch):
    """On the meta device, answer the two data-dependent questions transformers' SigLIP asks
    (is every patch valid: `mask.all()`, and boolean-mask indexing of the position ids) with
    "all ones", which is the truth here: no image has padded patches."""
    from contextlib import ExitStack

    from torch.fx.experimental import _config as fx_config
    from torch.utils._python_dispatch import TorchDispatchMode

    class AllTrue(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and args[0].dtype == torch.bool:
                return True
            return func(*args, **(kwargs or {}))

    stack = ExitStack()
    stack.enter_context(fx_config.patch(meta_nonzero_assume_all_nonzero=True))
    stack.enter_context(AllTrue())
    return stack


def measured_flops(policy, batch, torch, device):
    """torch's FlopCounterMode over one forward + backward of LeRobot's model (matmul-class ops,
    the math SDPA backend so the vision tower's attention decomposes into counted products)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = policy.config
    b = batch["observation.state"].shape[0]
    g = torch.Generator().manual_seed(SEED + 1)
    noise = torch.randn(b, cfg.chunk_size, cfg.max_action_dim, generator=g).to(device)
    t = (torch.rand(b, generator=g) * 0.999 + 0.001).to(device)
    policy.train()
    with _meta_truths(torch) if device == "meta" else nullcontext(), sdpa_kernel([SDPBackend.MATH]), \
            FlopCounterMode(display=False) as fc:
        images, img_masks = policy.prepare_images(batch)
        losses = policy.model.forward(images, img_masks, batch["observation.language.tokens"],
                                      batch["observation.language.attention_mask"], policy.prepare_state(batch),
                                      policy.prepare_action(batch), noise, t)
        losses[:, :, :ACTION_DIM].mean().backward()
    policy.zero_grad(set_to_none=True)
    return fc.get_total_flops()


def measured_infer_flops(policy, batch, torch):
    """FlopCounterMode over one predict_action_chunk (prefix + num_steps Euler steps)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    policy.reset()
    with torch.inference_mode(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        policy.predict_action_chunk(batch)
    return fc.get_total_flops()


def versions(torch):
    import accelerate
    import lerobot
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__, "lerobot": lerobot.__version__,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "cuda": torch.version.cuda}


def check_count(name, got, want, problems):
    if got != want:
        problems.append(f"{name}: LeRobot {got} != formula {want}")


def count_only(args, vlm_dir, vision, text, scale_factor, vocab, policy_kwargs, torch, report):
    """Every training mode's model built on the meta device (no memory, no init cost): LeRobot's
    parameter counts against the formula, and FlopCounterMode against the FLOP formula."""
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    problems = []
    report["modes"] = {}
    for train in TRAIN_FLAGS:
        t0 = time.perf_counter()
        cfg = policy_config(vlm_dir, train, "cpu", policy_kwargs, None)
        with torch.device("meta"):
            torch.manual_seed(SEED)
            policy = SmolVLAPolicy(cfg)
        sz = sizes_of(cfg, vision, text, scale_factor, vocab)
        counts = count_params(policy)
        formula = smolvla_param_counts(sz)
        check_count(f"{train} total", counts["total"], formula["total"], problems)
        check_count(f"{train} trainable", counts["trainable"], formula["trainable"][train], problems)
        raw, stats = make_raw_batch(args.batch, cfg.chunk_size, torch)
        pre, _ = make_pre_post_processors(cfg, dataset_stats=stats)
        batch = {k: (v.to("meta") if torch.is_tensor(v) else v) for k, v in pre(fresh(raw)).items()}
        lang_len = batch["observation.language.tokens"].shape[1]
        got = measured_flops(policy, batch, torch, "meta")
        want = smolvla_train_flops(sz, args.batch, lang_len, train, "autograd")["total"]
        check_count(f"{train} FlopCounterMode", got, want, problems)
        model = smolvla_train_flops(sz, args.batch, lang_len, train, "model")
        report["modes"][train] = {"params": counts, "flops_counted": got, "flops_autograd": want,
                                  "flops_model": model["total"], "flops_model_per_sample": model["per_sample"],
                                  "lang_tokens": lang_len, "prefix_tokens": model["prefix_tokens"],
                                  "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{train:6s} params total {counts['total']:,} trainable {counts['trainable']:,} "
              f"(without lm_head: {counts['total_without_lm_head']:,} / {counts['trainable_without_lm_head']:,}); "
              f"FLOPs/step B={args.batch}: counted {got / 1e9:.4f} G, autograd formula {want / 1e9:.4f} G, "
              f"model {model['total'] / 1e9:.4f} G ({time.perf_counter() - t0:.1f} s)", flush=True)
        del policy
    report["sizes"] = sz
    report["param_formula"] = smolvla_param_counts(sz)
    if args.preset == "smolvla":
        check_count("smolvla total vs LeRobot's count", report["modes"]["expert"]["params"]["total"],
                    SMOLVLA_EXPECTED["total"], problems)
        check_count("smolvla expert trainable vs LeRobot's count", report["modes"]["expert"]["params"]["trainable"],
                    SMOLVLA_EXPECTED["expert"], problems)
    report["problems"] = problems
    return problems


# ---- pi0 (LeRobot's PI0Policy)

class DoesNotFit(BenchError):
    """The run needs more device memory than there is: one line, exit status 3."""


def pi0_preset_parts(preset):
    """(SigLIP sizes, the VLM's and the expert's Gemma sizes, vocabulary, PI0Config settings) of a
    pi0 preset: the released model's, or make_ref.py's pi0 test sizes (pi0_tiny, vla/config.h's
    preset of that name), which its tiny_pi0_sizes replaces at run time."""
    if preset == "pi0":
        return PI0_VISION, PI0_GEMMA["gemma_2b"], PI0_GEMMA["gemma_300m"], PI0_VOCAB, {}
    if preset == "pi0_small":
        vision = dict(PI0_SMALL["vision"], image_size=PI0_SMALL["policy"]["image_resolution"][0])
        return (vision, PI0_SMALL["gemma"]["gemma_2b"], PI0_SMALL["gemma"]["gemma_300m"], PI0_SMALL["vocab"],
                PI0_SMALL["policy"])
    sys.path.insert(0, str(HERE))
    import make_ref
    policy = {k: v for k, v in make_ref.PI0_POLICY.items() if k != "dtype"}  # (--amp sets the dtype)
    vision = dict(make_ref.PI0_VISION, image_size=policy["image_resolution"][0])
    return vision, make_ref.PI0_GEMMA["gemma_2b"], make_ref.PI0_GEMMA["gemma_300m"], make_ref.PI0_VOCAB, policy


def pi0_preset_sizes(preset, n_cams=len(CAMERAS)):
    vision, vlm, expert, vocab, policy = pi0_preset_parts(preset)
    return pi0_flat_sizes(vision, vlm, expert, vocab, dict(PI0_POLICY_DEFAULTS, **policy), n_cams)


def pi0_build_sizes(preset):
    """The context a pi0 preset's model is built in: LeRobot's own sizes, or pi0_tiny's, or
    pi0_small's (make_ref.py's sizes swapped for them while tiny_pi0_sizes builds)."""
    from contextlib import contextmanager, nullcontext
    if preset == "pi0":
        return nullcontext()
    sys.path.insert(0, str(HERE))
    import make_ref
    if preset == "pi0_tiny":
        return make_ref.tiny_pi0_sizes()

    @contextmanager
    def small_sizes():
        names = {"PI0_VISION": PI0_SMALL["vision"], "PI0_GEMMA": PI0_SMALL["gemma"], "PI0_VOCAB": PI0_SMALL["vocab"]}
        real = {name: getattr(make_ref, name) for name in names}
        for name, value in names.items():
            setattr(make_ref, name, value)
        try:
            with make_ref.tiny_pi0_sizes():
                yield
        finally:
            for name, value in real.items():
                setattr(make_ref, name, value)
    return small_sizes()


def pi0_policy_config(preset, train, device, amp, compile_mode):
    """PI0Config for the benchmark's cameras and dims. --amp picks PI0Config.dtype, which LeRobot's
    training reads twice: the weights (bfloat16 but the vision tower, the projector and the norms)
    and Accelerate's mixed precision (lerobot_train.py:246-249)."""
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    feats = {f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, *FRAME_HW))
             for c in CAMERAS}
    feats["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    extra = dict(compile_model=True, compile_mode=compile_mode) if compile_mode else {}
    cfg = PI0Config(input_features=feats,
                    output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))},
                    device=device, push_to_hub=False, dtype={"bf16": "bfloat16", "none": "float32"}[amp],
                    **TRAIN_FLAGS[train], **pi0_preset_parts(preset)[4], **extra)
    if preset == "pi0":  # LeRobot's defaults must be the released model's
        wrong = {k: (getattr(cfg, k), v) for k, v in PI0_POLICY_DEFAULTS.items()
                 if (tuple(getattr(cfg, k)) if isinstance(v, tuple) else getattr(cfg, k)) != v}
        if wrong:
            raise BenchError(f"PI0Config defaults differ from the released model's: {wrong}")
    return cfg


def pi0_sizes_of(model, cfg, n_cams):
    """The sizes of a built PI0Pytorch, read off its modules' configs (a size that did not take
    shows here)."""
    pwe = model.paligemma_with_expert
    v, t, e = pwe.paligemma.config.vision_config, pwe.paligemma.config.text_config, pwe.gemma_expert.config
    vision = {k: getattr(v, k) for k in PI0_VISION}
    gemma = lambda c: dict(width=c.hidden_size, depth=c.num_hidden_layers, mlp_dim=c.intermediate_size,  # noqa: E731
                           num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim)
    policy = {k: getattr(cfg, k) for k in PI0_POLICY_DEFAULTS}
    policy["image_resolution"] = tuple(policy["image_resolution"])
    vocab = pwe.paligemma.model.language_model.embed_tokens.num_embeddings
    return pi0_flat_sizes(vision, gemma(t), gemma(e), vocab, policy, n_cams)


def pi0_count_params(model):
    """A PI0Pytorch's parameters by make_ref.py's pi0 parts; requires_grad without the lm_heads."""
    sys.path.insert(0, str(HERE))
    from make_ref import pi0_part_counts, pi0_part_of
    counts = pi0_part_counts(model)
    counts["requires_grad"] = sum(p.numel() for n, p in model.named_parameters()
                                  if p.requires_grad and pi0_part_of(n) != "lm_heads")
    return counts


def pi0_check_counts(preset, train, counts, formula, problems, trained=None):
    for key in ("total", "used", "lm_heads"):
        check_count(f"{train} {key}", counts[key], formula[key], problems)
    check_count(f"{train} requires_grad", counts["requires_grad"], formula["requires_grad"][train], problems)
    if trained is not None:
        check_count(f"{train} parameters with a gradient", trained, formula["trained"][train], problems)
    if preset == "pi0":
        for key in ("total", "used", "lm_heads"):
            check_count(f"{train} {key} vs LeRobot's count", counts[key], PI0_EXPECTED[key], problems)
        check_count(f"{train} trained vs LeRobot's count", formula["trained"][train], PI0_EXPECTED["trained"][train],
                    problems)


def make_pi0_batch(batch, sz, torch):
    """A fixed random batch as LeRobot's pi0 pre-processor hands it to the policy, its tokenizer
    (PaliGemma's, a hub download) and its normalization already done: the cameras' frames as
    make_raw_batch's (float32 in [0, 1], CHW: PI0Policy resizes and rescales them itself),
    language tokens as the tokenizer gives them (bos, one id per word and the newline, padded on
    the right with 0 to tokenizer_max_length, with the mask), state and actions normalized
    (N(0, 1)), action_is_pad as make_raw_batch's (pi0's loss ignores it)."""
    g = torch.Generator().manual_seed(SEED)
    data = {f"observation.images.{c}": torch.rand(batch, 3, *FRAME_HW, generator=g) for c in CAMERAS}
    data["observation.state"] = torch.randn(batch, STATE_DIM, generator=g)
    data["action"] = torch.randn(batch, sz["chunk"], ACTION_DIM, generator=g)
    is_pad = torch.zeros(batch, sz["chunk"], dtype=torch.bool)
    for b in range(0, batch, 3):  # every third sample ends inside its chunk
        valid = 1 + (7 * b + sz["chunk"] // 2) % sz["chunk"]
        is_pad[b, valid:] = True
        data["action"][b, valid:] = data["action"][b, valid - 1]
    data["action_is_pad"] = is_pad
    tokens = torch.zeros(batch, sz["lang"], dtype=torch.int64)
    masks = torch.zeros(batch, sz["lang"], dtype=torch.bool)
    for b in range(batch):
        n = min(sz["lang"], 2 + len(TASKS[b % len(TASKS)].split()))
        tokens[b, 0] = 2  # PaliGemma's bos
        tokens[b, 1:n] = torch.randint(3, sz["vocab"], (n - 1,), generator=g)
        masks[b, :n] = True
    data["observation.language.tokens"] = tokens
    data["observation.language.attention_mask"] = masks
    return data


def pi0_measured_flops(model, images, img_masks, tokens, masks, state, actions, torch):
    """torch's FlopCounterMode over one forward + backward of LeRobot's PI0Pytorch (the loss as
    PI0Policy.forward reduces it; fixed noise and time; the math SDPA backend, so the vision
    tower's attention decomposes into counted products). Returns the FLOPs and the elements of
    the parameters that got a gradient (lm_heads left out)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    sys.path.insert(0, str(HERE))
    from make_ref import pi0_part_of as part_of

    b, device = state.shape[0], state.device
    g = torch.Generator().manual_seed(SEED + 1)
    noise = torch.randn(actions.shape, generator=g).to(device)
    t = (torch.rand(b, generator=g) * 0.999 + 0.001).to(device)
    model.train()
    model.zero_grad(set_to_none=True)
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fc:
        losses = model.forward(images, img_masks, tokens, masks, state, actions, noise, t)
        losses[:, :, :ACTION_DIM].mean().backward()
    trained = sum(p.numel() for n, p in model.named_parameters() if p.grad is not None and part_of(n) != "lm_heads")
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops(), trained


def pi0_count_only(args, sz, torch, report):
    """Every training mode's PI0Pytorch built on the meta device by LeRobot's own code (shapes
    only: no memory, no init cost): its parameter counts against the formula (and, for pi0,
    LeRobot's released counts), FlopCounterMode over a forward + backward against the autograd
    formula, and what got a gradient against the trained count."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Pytorch

    problems = []
    report["modes"] = {}
    formula = pi0_param_counts(sz)
    B, P = args.batch, pi0_prefix_len(sz, sz["lang"])
    for train in TRAIN_FLAGS:
        t0 = time.perf_counter()
        cfg = pi0_policy_config(args.preset, train, "cpu", "none", None)
        with pi0_build_sizes(args.preset), torch.device("meta"):
            model = PI0Pytorch(cfg)
            got_sz = pi0_sizes_of(model, cfg, sz["n_cams"])
            if got_sz != sz:
                raise BenchError(f"{args.preset}: LeRobot built {got_sz}, the formulas have {sz}")
            counts = pi0_count_params(model)
            side = cfg.image_resolution[0]
            images = [torch.empty(B, 3, side, side) for _ in CAMERAS]
            img_masks = [torch.ones(B, dtype=torch.bool) for _ in CAMERAS]
            tokens = torch.zeros(B, sz["lang"], dtype=torch.int64)
            masks = torch.ones(B, sz["lang"], dtype=torch.bool)
            state = torch.empty(B, cfg.max_state_dim)
            actions = torch.empty(B, cfg.chunk_size, cfg.max_action_dim)
            got, trained = pi0_measured_flops(model, images, img_masks, tokens, masks, state, actions, torch)
        pi0_check_counts(args.preset, train, counts, formula, problems, trained)
        want = pi0_train_flops(sz, B, sz["lang"], train, "autograd")["total"]
        check_count(f"{train} FlopCounterMode", got, want, problems)
        model_fl = pi0_train_flops(sz, B, sz["lang"], train, "model")
        report["modes"][train] = {"params": counts, "trained": trained, "flops_counted": got, "flops_autograd": want,
                                  "flops_model": model_fl["total"], "flops_model_per_sample": model_fl["per_sample"],
                                  "lang_tokens": sz["lang"], "prefix_tokens": P,
                                  "suffix_tokens": model_fl["suffix_tokens"],
                                  "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{train:6s} params total {counts['total']:,} used {counts['used']:,} (lm_heads {counts['lm_heads']:,}); "
              f"requires_grad {counts['requires_grad']:,}, with a gradient {trained:,}; FLOPs/step B={B}: counted "
              f"{got / 1e9:.4f} G, autograd formula {want / 1e9:.4f} G, model {model_fl['total'] / 1e9:.4f} G "
              f"({model_fl['per_sample'] / 1e9:.5g} G a sample; {time.perf_counter() - t0:.1f} s)", flush=True)
        del model
    report["sizes"] = sz
    report["param_formula"] = formula
    report["problems"] = problems
    return problems


def to_device(device, torch):
    """What LeRobot's DeviceProcessorStep does to a batch (pinned host memory, non-blocking)."""
    def move(batch):
        return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
    return move


def main_pi0(args, torch, report):
    """--preset pi0 / pi0_tiny: LeRobot's PI0Policy with random weights, built by LeRobot's own
    code (on the device it runs on, nothing from the hub), its batch tokenized and normalized."""
    if args.amp == "fp16":
        raise BenchError("--amp fp16: PI0Config.dtype takes bfloat16 or float32 (--amp bf16 or none)")
    if args.vlm_dtype != "fp32":
        raise BenchError("--vlm-dtype is SmolVLA's; pi0's weights follow --amp (PI0Config.dtype)")
    sz = pi0_preset_sizes(args.preset)
    report.update(sizes=sz, lang_tokens=sz["lang"])
    if args.count_only:
        problems = pi0_count_only(args, sz, torch, report)
        write_json(args, report)
        if problems:
            raise BenchError("; ".join(problems))
        print("count-only: parameter and FLOP counts agree with the formulas", flush=True)
        return 0

    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    torch.manual_seed(SEED)
    if args.device == "cuda":  # lerobot_train.py:291-292 / lerobot_eval.py:746-747
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    compile_mode = None
    if args.compile:
        compile_mode = args.compile_mode or pi0_policy_config(args.preset, args.train, args.device, args.amp,
                                                              None).compile_mode
    cfg = pi0_policy_config(args.preset, args.train, args.device, args.amp, compile_mode)
    try:
        t0 = time.perf_counter()
        with pi0_build_sizes(args.preset), torch.device(args.device):
            torch.manual_seed(SEED)
            policy = PI0Policy(cfg)
        sync(torch, args.device)
        build_s = time.perf_counter() - t0
        built = pi0_sizes_of(policy.model, cfg, len(CAMERAS))
        if built != sz:
            raise BenchError(f"{args.preset}: LeRobot built {built}, the formulas have {sz}")
        counts = pi0_count_params(policy.model)
        formula = pi0_param_counts(sz)
        problems = []
        pi0_check_counts(args.preset, args.train, counts, formula, problems)
        if problems:
            raise BenchError("; ".join(problems))
        report.update(params=counts, param_formula=formula, build_seconds=build_s, dtype=cfg.dtype)
        print(f"pi0 ({args.preset}) built in {build_s:.1f} s: {counts['total']:,} parameters ({counts['used']:,} used, "
              f"{counts['lm_heads']:,} in the lm_heads that feed nothing), {formula['trained'][args.train]:,} "
              f"trained ({args.train}), dtype {cfg.dtype}", flush=True)

        raw = make_pi0_batch(args.infer_batch if args.infer else args.batch, sz, torch)
        if args.device == "cuda":  # LeRobot's DataLoader pins memory on CUDA (lerobot_train.py:507)
            raw = {k: (v.pin_memory() if torch.is_tensor(v) else v) for k, v in raw.items()}
        pre = to_device(args.device, torch)
        name = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
        peak = args.peak_tflops * 1e12 if args.peak_tflops else (
            peak_bf16_flops(name) if args.device == "cuda" else None)
        report.update(device=name, peak_bf16_flops=peak,
                      mfu_basis="model FLOPs (pi0_train_flops count='model', vla/flops.h's) / time / dense bf16 "
                                "peak, whatever --amp is (TF32 and fp32 peaks are lower)",
                      preprocessing="none timed but the batch's copy to the device: the tokens and the normalized "
                                    "state and actions are fed (LeRobot's pi0 tokenizer is a hub download)")
        if args.infer:
            obs = {k: v for k, v in raw.items() if k not in ("action", "action_is_pad")}
            batch = run_infer(args, cfg, policy, pre, lambda action: action.cpu(), torch, report, obs=obs,
                              autocast=False)
            inf = report["infer"]
            fl = pi0_infer_flops(sz, args.infer_batch, inf["lang_tokens"])
            inf["flops_per_chunk"] = fl["total"]
            inf["mfu"] = fl["total"] / (inf["ms_per_chunk_median"] / 1e3) / peak if peak else None
            print(f"infer B={args.infer_batch} dtype {cfg.dtype}: {inf['ms_per_chunk_median']:.2f} ms/chunk median "
                  f"(predict_action_chunk), {inf['ms_select_action_with_processors_median']:.2f} ms select_action with "
                  f"the copies to and from the device; prefix {fl['prefix_tokens']} + suffix {fl['suffix_tokens']} "
                  f"tokens; {fl['total'] / 1e9:.5g} GFLOP/chunk"
                  + (f", MFU {100 * inf['mfu']:.2f}%" if inf["mfu"] is not None else "")
                  + (f", peak mem {inf['peak_memory_bytes'] / 2**30:.2f} GiB" if inf["peak_memory_bytes"] else ""),
                  flush=True)
        else:
            batch = run_train(args, cfg, policy, pre, raw, torch, report)
            tr = report["train"]
            model = pi0_train_flops(sz, args.batch, tr["lang_tokens"], args.train, "model")
            auto = pi0_train_flops(sz, args.batch, tr["lang_tokens"], args.train, "autograd")
            tr.update(flops_model_per_step=model["total"], flops_model_per_sample=model["per_sample"],
                      flops_autograd_per_step=auto["total"], prefix_tokens=model["prefix_tokens"],
                      suffix_tokens=model["suffix_tokens"], flop_components=model["components"],
                      ms_preprocessor_is="the batch's copy to the device")
            tr["mfu"] = model["total"] / (tr["ms_per_step"] / 1e3) / peak if peak else None
            tr["mfu_executed"] = auto["total"] / (tr["ms_per_step"] / 1e3) / peak if peak else None
            print(f"train {args.train} B={args.batch} amp={args.amp} (dtype {cfg.dtype})"
                  f"{' compiled' if args.compile else ''}: {tr['ms_per_step']:.1f} ms/step, "
                  f"{tr['samples_per_s']:.2f} samples/s (update_policy alone {tr['ms_update_policy_median']:.1f} ms, "
                  f"the batch's copy {tr['ms_preprocessor_median']:.1f} ms); prefix {model['prefix_tokens']} + suffix "
                  f"{model['suffix_tokens']} tokens; {model['per_sample'] / 1e9:.5g} GFLOP/sample model, "
                  f"{auto['per_sample'] / 1e9:.5g} executed"
                  + (f"; MFU {100 * tr['mfu']:.1f}% (executed {100 * tr['mfu_executed']:.1f}%)"
                     if peak else "; MFU n/a")
                  + (f"; peak mem {tr['peak_memory_bytes'] / 2**30:.2f} GiB" if tr["peak_memory_bytes"] else ""),
                  flush=True)
        if args.flop_check:
            b, lang = batch["observation.state"].shape[0], batch["observation.language.tokens"].shape[1]
            if args.infer:
                got = measured_infer_flops(policy, batch, torch)
                want = pi0_infer_flops(sz, b, lang)["total"]
            else:
                images, img_masks = policy._preprocess_images(batch)
                got, trained = pi0_measured_flops(policy.model, images, img_masks, batch["observation.language.tokens"],
                                                  batch["observation.language.attention_mask"],
                                                  policy.prepare_state(batch), policy.prepare_action(batch), torch)
                want = pi0_train_flops(sz, b, lang, args.train, "autograd")["total"]
                report["trained"] = trained
                check_count("parameters with a gradient", trained, formula["trained"][args.train], problems)
            report["flop_check"] = {"what": "one chunk" if args.infer else "forward+backward (autograd count)",
                                    "counted": got, "formula": want}
            print(f"FlopCounterMode {'chunk' if args.infer else 'fwd+bwd'}: {got:,} vs formula {want:,}", flush=True)
            if got != want:
                problems.append(f"FLOP formula {want} != FlopCounterMode {got}")
            if problems:
                write_json(args, report)
                raise BenchError("; ".join(problems))
    except torch.cuda.OutOfMemoryError as e:
        what = "one chunk at batch" if args.infer else f"--train {args.train} at batch"
        msg = (f"CUDA out of memory: pi0 ({args.preset}) {what} {args.infer_batch if args.infer else args.batch}, "
               f"dtype {cfg.dtype}: {str(e).splitlines()[0]}")
        report["does_not_fit"] = msg
        write_json(args, report)
        raise DoesNotFit(msg) from None
    write_json(args, report)
    return 0


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_train(args, cfg, policy, pre, raw, torch, report):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # lerobot_train.py:243-262 (mixed_precision; see the module docstring for bf16).
    mixed = {"none": "no", "bf16": "bf16", "fp16": "fp16"}[args.amp]
    accelerator = Accelerator(step_scheduler_with_optimizer=False, mixed_precision=mixed,
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
                              cpu=cfg.device == "cpu")
    # lerobot_train.py:403 -> optim/factory.py: params = policy.get_optim_params(), preset configs.
    optimizer = cfg.get_optimizer_preset().build(policy.get_optim_params())
    scheduler = cfg.get_scheduler_preset().build(optimizer, 100_000)  # TrainPipelineConfig.steps default
    grad_clip = cfg.get_optimizer_preset().grad_clip_norm
    # lerobot_train.py:546
    policy, optimizer, scheduler = accelerator.prepare(policy, optimizer, scheduler)
    policy.train()  # :557

    def update_policy(batch):  # lerobot_train.py:105-215 without metrics bookkeeping
        policy.train()
        with accelerator.autocast():
            loss, _ = policy.forward(batch)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(policy.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss.item(), grad_norm.item()

    on_gpu = args.device == "cuda"
    pre_ms, upd_ms, step_ms, losses = [], [], [], []
    for i in range(args.warmup + args.steps):
        timed = i >= args.warmup
        if timed and i == args.warmup:
            sync(torch, args.device)
            if on_gpu:
                torch.cuda.reset_peak_memory_stats()
            t_start = time.perf_counter()
        if on_gpu:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
        t0 = time.perf_counter()
        batch = pre(fresh(raw))  # lerobot_train.py:607
        t1 = time.perf_counter()
        if on_gpu:
            ev[1].record()
        loss, gnorm = update_policy(batch)  # :610 (ends in .item(): the step is complete)
        if on_gpu:
            ev[2].record()
            ev[2].synchronize()
        t2 = time.perf_counter()
        if timed:
            if on_gpu:
                pre_ms.append(ev[0].elapsed_time(ev[1]))
                upd_ms.append(ev[1].elapsed_time(ev[2]))
                step_ms.append(ev[0].elapsed_time(ev[2]))
            else:
                pre_ms.append((t1 - t0) * 1e3)
                upd_ms.append((t2 - t1) * 1e3)
                step_ms.append((t2 - t0) * 1e3)
        losses.append(loss)
        if not math.isfinite(loss) or not math.isfinite(gnorm):
            raise BenchError(f"step {i}: loss {loss} grad norm {gnorm} is not finite")
    sync(torch, args.device)
    wall = time.perf_counter() - t_start
    ms = wall * 1e3 / args.steps
    report["train"] = {
        "ms_per_step": ms, "samples_per_s": args.batch * args.steps / wall,
        "ms_per_step_median": statistics.median(step_ms),
        "ms_update_policy_median": statistics.median(upd_ms), "ms_preprocessor_median": statistics.median(pre_ms),
        "samples_per_s_update_only": args.batch / (statistics.median(upd_ms) / 1e3),
        "losses": losses, "lang_tokens": int(batch["observation.language.tokens"].shape[1]),
        "mixed_precision": mixed, "grad_clip_norm": grad_clip,
        "optimizer": type(optimizer.optimizer).__name__, "optimizer_hparams": {
            k: v for k, v in optimizer.optimizer.defaults.items() if isinstance(v, (int, float, tuple, bool, type(None)))},
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
    }
    return batch


def run_infer(args, cfg, policy, pre, post, torch, report, obs=None, autocast=True):
    """Batch-1 chunks, as lerobot_eval.py:291-295 calls the policy: preprocessor, then
    select_action under inference_mode (after reset(), so it samples a new chunk), then the
    post-processor; predict_action_chunk alone is timed too. obs: the observations (default
    make_raw_batch's); autocast=False: none whatever --amp is (pi0, whose dtype is its weights')."""
    from contextlib import nullcontext

    if obs is None:
        raw, _ = make_raw_batch(args.infer_batch, cfg.chunk_size, torch)
        obs = {k: v for k, v in raw.items() if k not in ("action", "action_is_pad")}
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp] if autocast else None
    autocast = (lambda: torch.autocast(device_type=args.device, dtype=amp)) if amp else nullcontext
    policy.eval()
    chunk_ms, e2e_ms = [], []
    for i in range(args.warmup + args.steps):
        sync(torch, args.device)
        if i == args.warmup and args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        batch = pre(fresh(obs))
        policy.reset()
        with torch.inference_mode(), autocast():
            action = policy.select_action(batch)
        action = post(action)
        sync(torch, args.device)
        t1 = time.perf_counter()
        with torch.inference_mode(), autocast():
            chunk = policy.predict_action_chunk(batch)
        sync(torch, args.device)
        t2 = time.perf_counter()
        if i >= args.warmup:
            e2e_ms.append((t1 - t0) * 1e3)
            chunk_ms.append((t2 - t1) * 1e3)
    if tuple(chunk.shape) != (args.infer_batch, cfg.chunk_size, ACTION_DIM):
        raise BenchError(f"predict_action_chunk returned {tuple(chunk.shape)}")
    report["infer"] = {
        "batch": args.infer_batch, "chunks_timed": len(chunk_ms),
        "ms_per_chunk_median": statistics.median(chunk_ms), "ms_per_chunk_min": min(chunk_ms),
        "ms_select_action_with_processors_median": statistics.median(e2e_ms),
        "lang_tokens": int(batch["observation.language.tokens"].shape[1]),
        "autocast": str(amp) if amp else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if args.device == "cuda" else None,
    }
    return batch


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=("smolvla", "small", "tiny") + PI0_PRESETS, default="smolvla")
    ap.add_argument("--train", choices=tuple(TRAIN_FLAGS), default=None,
                    help="expert (train_expert_only, frozen vision), vlm, all; default LeRobot's: expert for "
                         "SmolVLA, all for pi0")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (or chunks with --infer)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                    help="SmolVLA: Accelerate's mixed precision; pi0: PI0Config.dtype (bf16: bfloat16, none: float32), "
                         "which sets both the weights and the mixed precision")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--compile", action="store_true", help="SmolVLAConfig.compile_model=True (LeRobot's own)")
    ap.add_argument("--compile-mode", default=None, help="SmolVLAConfig.compile_mode (default LeRobot's)")
    ap.add_argument("--vlm-dtype", choices=("fp32", "bf16"), default="fp32",
                    help="bf16 = the VLM's dtype when LeRobot loads it with load_vlm_weights=True "
                         "(smolvlm_with_expert.py:91-96, torch_dtype='bfloat16'); fp32 = load_vlm_weights=False")
    ap.add_argument("--infer", action="store_true", help="time inference (batch --infer-batch) instead of training")
    ap.add_argument("--infer-batch", type=int, default=1)
    ap.add_argument("--count-only", action="store_true",
                    help="build every training mode on the meta device; check parameter and FLOP counts; no step")
    ap.add_argument("--flop-check", action="store_true",
                    help="also count one forward+backward with FlopCounterMode and compare to the formula")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the bf16 dense peak used for MFU")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--work-dir", default=None, help="where the VLM folder goes (default: a temp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.train is None:
        args.train = "all" if args.preset in PI0_PRESETS else "expert"
    if min(args.batch, args.steps, args.infer_batch) < 1 or args.warmup < 0:
        raise BenchError("--batch, --steps and --infer-batch must be >= 1, --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import tempfile

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not args.count_only and not torch.cuda.is_available():
        raise BenchError("--device cuda but torch.cuda.is_available() is False (use --device cpu)")
    try:
        import lerobot  # noqa: F401
    except ImportError as e:
        raise BenchError(f"cannot import lerobot ({e}); install dev/lerobot/wheels.sh's wheels or use build/lerobot-venv")

    if args.preset in PI0_PRESETS:
        report = {"preset": args.preset, "versions": versions(torch), "settings": vars(args).copy(),
                  "cameras": {c: list(FRAME_HW) for c in CAMERAS}, "state_dim": STATE_DIM, "action_dim": ACTION_DIM,
                  "tasks": list(TASKS)}
        return main_pi0(args, torch, report)
    vision, text, scale_factor, vocab, policy_kwargs = preset_config(args.preset)
    if args.work_dir:
        work = Path(args.work_dir)
    else:
        import atexit
        import shutil
        work = Path(tempfile.mkdtemp(prefix="bench_lerobot_"))
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    vocab = build_vlm_dir(work / f"{args.preset}_smolvlm", vision, text, scale_factor, vocab)
    vlm_dir = work / f"{args.preset}_smolvlm"

    report = {"preset": args.preset, "versions": versions(torch), "settings": vars(args).copy(),
              "cameras": {c: list(FRAME_HW) for c in CAMERAS}, "state_dim": STATE_DIM, "action_dim": ACTION_DIM,
              "tasks": list(TASKS)}
    if args.count_only:
        problems = count_only(args, vlm_dir, vision, text, scale_factor, vocab, policy_kwargs, torch, report)
        write_json(args, report)
        if problems:
            raise BenchError("; ".join(problems))
        print("count-only: parameter and FLOP counts agree with the formulas", flush=True)
        return 0

    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    # lerobot_train.py:283-292 / lerobot_eval.py:746-747
    torch.manual_seed(SEED)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    compile_mode = None
    cfg = policy_config(vlm_dir, args.train, args.device, policy_kwargs, None)
    if args.compile:
        compile_mode = args.compile_mode or cfg.compile_mode
        cfg = policy_config(vlm_dir, args.train, args.device, policy_kwargs, compile_mode)
    t0 = time.perf_counter()
    policy = SmolVLAPolicy(cfg)
    if args.vlm_dtype == "bf16":
        policy.model.vlm_with_expert.vlm.to(torch.bfloat16)
    policy.to(cfg.device)  # policies/factory.py:377
    build_s = time.perf_counter() - t0
    sz = sizes_of(cfg, vision, text, scale_factor, vocab)
    counts = count_params(policy)
    formula = smolvla_param_counts(sz)
    problems = []
    check_count("total", counts["total"], formula["total"], problems)
    check_count("trainable", counts["trainable"], formula["trainable"][args.train], problems)
    if args.preset == "smolvla":
        check_count("total vs LeRobot's count", counts["total"], SMOLVLA_EXPECTED["total"], problems)
    if problems:
        raise BenchError("; ".join(problems))
    report.update(params=counts, param_formula=formula, sizes=sz, build_seconds=build_s)
    print(f"SmolVLA ({args.preset}) built in {build_s:.1f} s: {counts['total']:,} parameters, "
          f"{counts['trainable']:,} trainable ({args.train}); without lm_head {counts['total_without_lm_head']:,}",
          flush=True)

    raw, stats = make_raw_batch(args.batch, cfg.chunk_size, torch)
    if args.device == "cuda":  # LeRobot's DataLoader pins memory on CUDA (lerobot_train.py:507)
        raw = {k: (v.pin_memory() if torch.is_tensor(v) else v) for k, v in raw.items()}
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)

    name = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (peak_bf16_flops(name) if args.device == "cuda" else None)
    report.update(device=name, peak_bf16_flops=peak,
                  mfu_basis="model FLOPs (smolvla_train_flops count='model') / time / dense bf16 peak, "
                            "whatever --amp is (TF32 and fp32 peaks are lower)")

    if args.infer:
        batch = run_infer(args, cfg, policy, pre, post, torch, report)
        inf = report["infer"]
        fl = smolvla_infer_flops(sz, args.infer_batch, inf["lang_tokens"])
        inf["flops_per_chunk"] = fl["total"]
        inf["mfu"] = fl["total"] / (inf["ms_per_chunk_median"] / 1e3) / peak if peak else None
        print(f"infer B={args.infer_batch} {args.amp}: {inf['ms_per_chunk_median']:.2f} ms/chunk median "
              f"(predict_action_chunk), {inf['ms_select_action_with_processors_median']:.2f} ms with processors; "
              f"prefix {fl['prefix_tokens']} tokens; {fl['total'] / 1e9:.1f} GFLOP/chunk"
              + (f", MFU {100 * inf['mfu']:.2f}%" if inf["mfu"] is not None else "")
              + (f", peak mem {inf['peak_memory_bytes'] / 2**30:.2f} GiB" if inf["peak_memory_bytes"] else ""),
              flush=True)
    else:
        batch = run_train(args, cfg, policy, pre, raw, torch, report)
        tr = report["train"]
        lang = tr["lang_tokens"]
        model = smolvla_train_flops(sz, args.batch, lang, args.train, "model")
        auto = smolvla_train_flops(sz, args.batch, lang, args.train, "autograd")
        tr.update(flops_model_per_step=model["total"], flops_model_per_sample=model["per_sample"],
                  flops_autograd_per_step=auto["total"], prefix_tokens=model["prefix_tokens"],
                  flop_components=model["components"])
        tr["mfu"] = model["total"] / (tr["ms_per_step"] / 1e3) / peak if peak else None
        tr["mfu_executed"] = auto["total"] / (tr["ms_per_step"] / 1e3) / peak if peak else None
        print(f"train {args.train} B={args.batch} amp={args.amp} vlm={args.vlm_dtype}"
              f"{' compiled' if args.compile else ''}: {tr['ms_per_step']:.1f} ms/step, "
              f"{tr['samples_per_s']:.2f} samples/s (update_policy alone {tr['ms_update_policy_median']:.1f} ms, "
              f"preprocessor {tr['ms_preprocessor_median']:.1f} ms); prefix {model['prefix_tokens']} tokens; "
              f"{model['per_sample'] / 1e9:.1f} GFLOP/sample model, {auto['per_sample'] / 1e9:.1f} executed"
              + (f"; MFU {100 * tr['mfu']:.1f}% (executed {100 * tr['mfu_executed']:.1f}%)" if peak else "; MFU n/a")
              + (f"; peak mem {tr['peak_memory_bytes'] / 2**30:.2f} GiB" if tr["peak_memory_bytes"] else ""),
              flush=True)
    if args.flop_check:
        b, lang = batch["observation.state"].shape[0], batch["observation.language.tokens"].shape[1]
        if args.infer:
            got = measured_infer_flops(policy, batch, torch)
            want = smolvla_infer_flops(sz, b, lang)["total"]
        else:
            got = measured_flops(policy, batch, torch, args.device)
            want = smolvla_train_flops(sz, b, lang, args.train, "autograd")["total"]
        report["flop_check"] = {"what": "one chunk" if args.infer else "forward+backward (autograd count)", "counted": got, "formula": want}
        print(f"FlopCounterMode {'chunk' if args.infer else 'fwd+bwd'}: {got:,} vs formula {want:,}", flush=True)
        if got != want:
            write_json(args, report)
            raise BenchError(f"FLOP formula {want} != FlopCounterMode {got}")
    write_json(args, report)
    return 0


def write_json(args, report):
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DoesNotFit as e:
        print(f"bench_lerobot: does not fit: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
    except BenchError as e:
        print(f"bench_lerobot: error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Exception as e:  # unexpected: keep the traceback, end on one clear line
        traceback.print_exc()
        print(f"bench_lerobot: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
