"""
model.py: the PyTorch oracle of train_vla, a pi0-style vision-language-action policy.

The third, independent copy of the model (SPEC sections 2 and 5). It reproduces vla.h's
conventions exactly: the parameter table, the counter-based RNG (parameter init, sampler,
flow noise), the batch assembly and the learning-rate schedule, so the C and CUDA trainers
can be compared with it tensor by tensor through the debug-state file it writes.

Shapes: B batch, Np prefix tokens (n_cam*n_patch image + max_text text), Ns = 1+H suffix
tokens (state, H actions), C width of a group (d_model or d_expert), NH heads, HS head size,
D = NH*HS attention width, H chunk, A action dims, S state dims, L layers.

    /usr/bin/python3 dev/model.py -i data/x.bin --preset tiny --dtype float64 --debug-state vla_debug.bin
    /usr/bin/python3 dev/model.py -i data/x.bin --preset tiny -b 8 --train 20
"""

import argparse
import collections
import dataclasses
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from vla_shard import Dataset  # noqa: E402

# ----------------------------------------------------------------------------
# config and the parameter table (vla.h: VLAConfig, VLA_PRESETS, VLA_PARAMETERS)


@dataclasses.dataclass
class VLAConfig:  # field order is the checkpoint's and the debug state's
    n_cam: int
    img: int
    patch: int
    max_text: int
    state_dim: int
    action_dim: int
    chunk: int
    d_model: int
    d_ff: int
    d_expert: int
    d_expert_ff: int
    n_layer: int
    n_head: int
    head_dim: int
    rope_theta: int

    def values(self):
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @property
    def n_patch(self):  # patches per camera
        return (self.img // self.patch) ** 2

    @property
    def n_image_tokens(self):
        return self.n_cam * self.n_patch

    @property
    def n_prefix(self):
        return self.n_image_tokens + self.max_text

    @property
    def d_attn(self):
        return self.n_head * self.head_dim


CONFIG_FIELDS = [f.name for f in dataclasses.fields(VLAConfig)]

# observation fields (n_cam, img, state_dim, action_dim) are replaced by the dataset's
PRESETS = {  # cam img p text S A H d f d_a f_a L NH HS theta
    "tiny": VLAConfig(1, 32, 8, 16, 4, 4, 8, 48, 128, 32, 96, 2, 4, 12, 10000),
    "small": VLAConfig(2, 64, 8, 48, 4, 4, 16, 256, 1024, 192, 512, 6, 4, 64, 10000),
    "base": VLAConfig(2, 224, 16, 48, 32, 32, 50, 960, 2560, 720, 2048, 16, 15, 64, 10000),
}


def config_problem(c):
    """None if the config is usable, else what is wrong (vla_config_problem)."""
    for name in CONFIG_FIELDS:
        if getattr(c, name) <= 0:
            return f"{name} must be positive (got {getattr(c, name)})"
    if c.img % c.patch != 0:
        return f"img {c.img} is not a multiple of patch {c.patch}"
    if c.head_dim % 2 != 0:
        return f"head_dim {c.head_dim} must be even for RoPE"
    if c.d_expert % 2 != 0:
        return f"d_expert {c.d_expert} must be even for the time embedding"
    return None


VLM, EXPERT = 0, 1
NORMAL, NORMAL_OUT, ZERO, ONE = 0, 1, 2, 3
ParamSpec = collections.namedtuple("ParamSpec", "name group decay init shape offset")


def param_table(c):
    """Every parameter tensor in table order, with its element offset into the flat buffer."""
    L, d, da, D = c.n_layer, c.d_model, c.d_expert, c.d_attn
    rows = [  # name, group, decay, init, shape; linear weights are (out, in), layers stacked first
        ("patch_w", VLM, 1, NORMAL, (d, 3 * c.patch * c.patch)),
        ("patch_b", VLM, 0, ZERO, (d,)),
        ("pos_emb", VLM, 1, NORMAL, (c.n_image_tokens, d)),
        ("text_emb", VLM, 1, NORMAL, (256, d)),
        ("state_w", EXPERT, 1, NORMAL, (da, c.state_dim)),
        ("state_b", EXPERT, 0, ZERO, (da,)),
        ("action_in_w", EXPERT, 1, NORMAL, (da, c.action_dim)),
        ("action_in_b", EXPERT, 0, ZERO, (da,)),
        ("time_in_w", EXPERT, 1, NORMAL, (da, 2 * da)),
        ("time_in_b", EXPERT, 0, ZERO, (da,)),
        ("time_out_w", EXPERT, 1, NORMAL, (da, da)),
        ("time_out_b", EXPERT, 0, ZERO, (da,)),
    ]
    for prefix, group, C, Cff in (("vlm", VLM, d, c.d_ff), ("exp", EXPERT, da, c.d_expert_ff)):
        rows += [
            (prefix + "_ln1", group, 0, ONE, (L, C)),
            (prefix + "_wq", group, 1, NORMAL, (L, D, C)),
            (prefix + "_wk", group, 1, NORMAL, (L, D, C)),
            (prefix + "_wv", group, 1, NORMAL, (L, D, C)),
            (prefix + "_wo", group, 1, NORMAL_OUT, (L, C, D)),
            (prefix + "_ln2", group, 0, ONE, (L, C)),
            (prefix + "_wgate", group, 1, NORMAL, (L, Cff, C)),
            (prefix + "_wup", group, 1, NORMAL, (L, Cff, C)),
            (prefix + "_wdown", group, 1, NORMAL_OUT, (L, C, Cff)),
        ]
    rows += [
        ("final_norm", EXPERT, 0, ONE, (da,)),
        ("action_out_w", EXPERT, 1, NORMAL, (c.action_dim, da)),
        ("action_out_b", EXPERT, 0, ZERO, (c.action_dim,)),
    ]
    table, offset = [], 0
    for name, group, decay, init, shape in rows:
        table.append(ParamSpec(name, group, decay, init, shape, offset))
        offset += math.prod(shape)
    return table


# ----------------------------------------------------------------------------
# counter-based RNG, bit-exact with vla.h: draw c of a stream is splitmix64(key + c * GOLDEN),
# so any draw is reached by seeking and whole tensors are drawn at once with uint64 arrays
# (whose multiplications wrap mod 2^64, as in C).

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM_INIT = 1


def STREAM_EPOCH(e):  # sampler permutation of epoch e
    return (2 << 56) + e


def STREAM_NOISE(s):  # t and eps of optimizer step s
    return (3 << 56) + s


def rng_mix64(x):
    """splitmix64 finalizer of a uint64 array."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def rng_key(seed, stream):
    """rng_init's key (as a Python int) of stream `stream` under `seed`."""
    a = int(rng_mix64(np.uint64((seed + GOLDEN) & MASK64)))
    b = int(rng_mix64(np.uint64((stream * GOLDEN + 1) & MASK64)))
    return a ^ b


def rng_draws(key, first, n):
    """Raw u64 draws number first..first+n-1 (draw c is the one rng_u64 returns at counter c)."""
    counters = np.arange(n, dtype=np.uint64) + np.uint64(first)
    with np.errstate(over="ignore"):
        return rng_mix64(np.uint64(key) + counters * np.uint64(GOLDEN))


def u53(u):
    """The top 53 bits as a float64 in [0, 1)."""
    return (u >> np.uint64(11)).astype(np.float64) * 2.0**-53


def rng_normals(key, first, n):
    """n Box-Muller normals (cosine branch) from draws first, first+1, ... two per normal,
    as float32: the value C gets from (float)rng_normal()."""
    u = rng_draws(key, first, 2 * n)
    u1 = ((u[0::2] >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53  # (0, 1]: log is finite
    u2 = u53(u[1::2])
    x = np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)
    # numpy's vectorized log/cos may differ from libm's (which C calls) by a few ulps of the
    # double (5 at most in tests). That decides the float32 only next to a rounding tie:
    # redo the few values within 64 ulps of one with libm, so the float32 is bit-exact.
    margin = 64 * np.spacing(np.abs(x))
    near_tie = (x - margin).astype(np.float32) != (x + margin).astype(np.float32)
    for i in np.flatnonzero(near_tie):
        x[i] = math.sqrt(-2.0 * math.log(u1[i])) * math.cos(6.283185307179586 * u2[i])
    return x.astype(np.float32)


def rng_flow_time(u):
    """t = 0.999 * Beta(1.5, 1) + 0.001 from one uniform, Beta(1.5, 1) = U^(1/1.5); float32.
    libm's pow (math.pow), as C: numpy's may differ in the last bit."""
    return np.float32(0.999 * math.pow(float(u), 1.0 / 1.5) + 0.001)


def param_init(cfg, seed):
    """Parameters from the seed (param_init): normal(0, 0.02), output projections / sqrt(2L),
    biases 0, norm scales 1. Element j of the tensor at offset o uses draws 2(o+j)+1, 2(o+j)+2."""
    key = rng_key(seed, STREAM_INIT)
    out_scale = np.float32(1.0) / np.sqrt(np.float32(2.0) * np.float32(cfg.n_layer))  # float math as C
    params = collections.OrderedDict()
    for s in param_table(cfg):
        numel = math.prod(s.shape)
        if s.init in (ZERO, ONE):
            params[s.name] = np.full(s.shape, 1.0 if s.init == ONE else 0.0, np.float32)
            continue
        std = np.float32(0.02) * out_scale if s.init == NORMAL_OUT else np.float32(0.02)
        x = np.empty(numel, np.float32)
        for j in range(0, numel, 1 << 22):  # chunks keep the uint64 temporaries small
            m = min(1 << 22, numel - j)
            x[j:j + m] = rng_normals(key, 2 * (s.offset + j) + 1, m) * std
        params[s.name] = x.reshape(s.shape)
    return params


def flow_noise(cfg, seed, step, g):
    """t (float32) and eps (float32, (H, A)) of global sample g at optimizer step `step`."""
    key = rng_key(seed, STREAM_NOISE(step))
    HA = cfg.chunk * cfg.action_dim
    base = g * (1 + 2 * HA)  # each sample owns 1 + 2*H*A draws
    t = rng_flow_time(u53(rng_draws(key, base + 1, 1))[0])
    eps = rng_normals(key, base + 2, HA).reshape(cfg.chunk, cfg.action_dim)
    return t, eps


def sampler_permutation(n, seed, epoch):
    """Fisher-Yates over n samples from the epoch's stream (sampler_permutation)."""
    if n > 0xFFFFFFFF:
        raise ValueError(f"dataset has {n} samples; the sampler supports up to 2^32")
    perm = list(range(n))
    draws = rng_draws(rng_key(seed, STREAM_EPOCH(epoch)), 1, max(n - 1, 0))
    bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1 .. 1
    picks = (draws % bounds).tolist()
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = picks[k]
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, np.int64)


class Sampler:
    """Sample at global position pos is perm_e[pos % n] with e = pos // n."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch, self.perm = n, seed, -1, None

    def at(self, pos):
        e = pos // self.n
        if e != self.epoch:
            self.perm, self.epoch = sampler_permutation(self.n, self.seed, e), e
        return int(self.perm[pos % self.n])

    def indices(self, pos, B):  # one rank of B samples, positions pos .. pos+B-1
        return [self.at(pos + i) for i in range(B)]


def lr_at_step(step, lr, warmup, steps, min_lr_frac):
    """Linear warmup to the peak, then cosine to min_lr_frac * peak, in float32 as vla.h."""
    f32 = np.float32
    lr, min_lr_frac = f32(lr), f32(min_lr_frac)
    if step < warmup:
        return float(lr * f32(step + 1) / f32(warmup))
    decay_steps = steps - warmup
    progress = f32(step - warmup) / f32(decay_steps) if decay_steps > 0 else f32(1.0)
    progress = min(progress, f32(1.0))
    floor_lr = lr * min_lr_frac
    cos = f32(math.cos(float(f32(3.14159265358979) * progress)))  # cosf: float64 cos rounded to float
    return float(floor_lr + f32(0.5) * (lr - floor_lr) * (f32(1.0) + cos))


# ----------------------------------------------------------------------------
# the model


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def rope_tables(positions, head_dim, theta, dtype, device="cpu"):
    """cos, sin (T, HS/2) of RoPE at the given sequence positions, computed in float64."""
    k = np.arange(head_dim // 2, dtype=np.float64)
    inv_freq = float(theta) ** (-2.0 * k / head_dim)
    angle = np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]
    return (torch.tensor(np.cos(angle), dtype=dtype, device=device),
            torch.tensor(np.sin(angle), dtype=dtype, device=device))


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on (B, NH, T, HS): pairs (i, i + HS/2) turn by position * inv_freq_i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def time_embedding(t, dim, dtype):
    """Sinusoidal embedding (B, dim) of the flow time: half sin, half cos, periods geometric
    from 4e-3 to 4.0. Computed in float64 from the float32 t (a tensor), then cast."""
    half = dim // 2
    fraction = torch.arange(half, dtype=torch.float64, device=t.device) / max(half - 1, 1)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = 2.0 * math.pi * t.to(torch.float64)[:, None] / period[None, :]
    return torch.cat([torch.sin(angle), torch.cos(angle)], 1).to(dtype)


def attention(q, k, v, visible, sdpa=False):
    """Joint attention: q (B, NH, Tq, HS), k and v (B, NH, Tk, HS), visible (B or 1, 1, Tq, Tk)
    bool. Softmax in float32 or better. Returns (B, Tq, NH*HS), head n in columns n*HS..
    sdpa: PyTorch's fused scaled_dot_product_attention instead (what the GPU benchmark runs)."""
    if sdpa:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    else:
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill(~visible, float("-inf"))  # every row sees at least one key
        y = torch.softmax(scores, -1) @ v
    B, NH, T, HS = y.shape
    return y.transpose(1, 2).reshape(B, T, NH * HS)


class VLA(nn.Module):
    """pi0-style VLA: a VLM stack over the prefix (image patches, text token ids) and an action
    expert stack over the suffix (state, H noisy actions), joined in every attention."""

    def __init__(self, cfg, dtype=torch.float32, sdpa=False):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.sdpa = sdpa and hasattr(F, "scaled_dot_product_attention")  # PyTorch 2.0 and later
        self.table = param_table(cfg)
        for s in self.table:  # registered in table order: named_parameters() walks the table
            self.register_parameter(s.name, nn.Parameter(torch.zeros(s.shape, dtype=dtype)))

    def load(self, params):
        """Copies float32 numpy arrays (name -> array) into the parameters, in this dtype."""
        with torch.no_grad():
            for s in self.table:
                getattr(self, s.name).copy_(torch.from_numpy(np.asarray(params[s.name], np.float32)))

    def heads(self, x):
        """(B, T, NH*HS) -> (B, NH, T, HS)."""
        B, T, _ = x.shape
        return x.view(B, T, self.cfg.n_head, self.cfg.head_dim).transpose(1, 2)

    def mlp(self, x, wgate, wup, wdown):
        return (F.gelu(x @ wgate.T, approximate="tanh") * (x @ wup.T)) @ wdown.T

    def embed_prefix(self, images, tokens):
        """Image patches and text token ids (bytes) -> prefix tokens (B, Np, d)."""
        c = self.cfg
        B, p, n = images.shape[0], c.patch, c.img // c.patch
        x = images.to(self.patch_w.dtype) / 127.5 - 1.0  # (B, cam, img, img, 3) in [-1, 1]
        # patches row-major per camera, each flattened as (pixel row, pixel col, channel)
        x = x.reshape(B, c.n_cam, n, p, n, p, 3).permute(0, 1, 2, 4, 3, 5, 6)
        x = x.reshape(B, c.n_cam * n * n, p * p * 3)
        patches = x @ self.patch_w.T + self.patch_b + self.pos_emb
        return torch.cat([patches, self.text_emb[tokens.long()]], 1)

    def prefix_forward(self, images, tokens, text_mask):
        """The VLM stack over the prefix. Prefix queries never see the suffix, so the prefix runs
        alone first; returns each layer's keys and values (for the suffix) and the valid keys."""
        c = self.cfg
        x = self.embed_prefix(images, tokens)
        B, Np = x.shape[0], x.shape[1]
        valid = torch.cat([torch.ones(B, c.n_image_tokens, dtype=torch.bool, device=x.device), text_mask > 0], 1)
        visible = valid[:, None, None, :]  # (B, 1, 1, Np): bidirectional over the valid prefix
        cos, sin = rope_tables(np.arange(Np), c.head_dim, c.rope_theta, self.patch_w.dtype, x.device)
        kv = []
        for l in range(c.n_layer):
            h = rmsnorm(x, self.vlm_ln1[l])
            k = apply_rope(self.heads(h @ self.vlm_wk[l].T), cos, sin)
            v = self.heads(h @ self.vlm_wv[l].T)
            kv.append((k, v))
            if l == c.n_layer - 1:
                break  # the prefix's output after the last layer feeds nothing: only its k, v
            q = apply_rope(self.heads(h @ self.vlm_wq[l].T), cos, sin)
            x = x + attention(q, k, v, visible, self.sdpa) @ self.vlm_wo[l].T
            x = x + self.mlp(rmsnorm(x, self.vlm_ln2[l]), self.vlm_wgate[l], self.vlm_wup[l], self.vlm_wdown[l])
        return kv, valid

    def suffix_forward(self, kv, valid, state, x_t, t):
        """The action expert over [state, H action tokens] attending to the cached prefix.
        state (B, S), x_t (B, H, A) noisy actions, t (B,) float32 (numpy or tensor). Returns v (B, H, A)."""
        c = self.cfg
        B, H, Np = x_t.shape[0], c.chunk, valid.shape[1]
        state_tok = (state @ self.state_w.T + self.state_b)[:, None, :]  # (B, 1, d_a)
        a = x_t @ self.action_in_w.T + self.action_in_b  # (B, H, d_a)
        t = torch.as_tensor(t, device=x_t.device)
        temb = time_embedding(t, c.d_expert, a.dtype)[:, None, :].expand(B, H, c.d_expert)
        a = F.silu(torch.cat([a, temb], -1) @ self.time_in_w.T + self.time_in_b) @ self.time_out_w.T + self.time_out_b
        x = torch.cat([state_tok, a], 1)  # (B, Ns, d_a)
        # mask: valid prefix for all; the state token for all; action tokens for action queries only
        Ns = 1 + H
        suffix_vis = torch.ones(Ns, Ns, dtype=torch.bool, device=x.device)
        suffix_vis[0, 1:] = False
        visible = torch.cat([valid[:, None, :].expand(B, Ns, Np), suffix_vis.expand(B, Ns, Ns)], 2)[:, None]
        cos, sin = rope_tables(Np + np.arange(Ns), c.head_dim, c.rope_theta, self.patch_w.dtype, x.device)
        for l in range(c.n_layer):
            h = rmsnorm(x, self.exp_ln1[l])
            q = apply_rope(self.heads(h @ self.exp_wq[l].T), cos, sin)
            k = apply_rope(self.heads(h @ self.exp_wk[l].T), cos, sin)
            v = self.heads(h @ self.exp_wv[l].T)
            k = torch.cat([kv[l][0], k], 2)
            v = torch.cat([kv[l][1], v], 2)
            x = x + attention(q, k, v, visible, self.sdpa) @ self.exp_wo[l].T
            x = x + self.mlp(rmsnorm(x, self.exp_ln2[l]), self.exp_wgate[l], self.exp_wup[l], self.exp_wdown[l])
        return rmsnorm(x[:, 1:], self.final_norm) @ self.action_out_w.T + self.action_out_b

    def forward(self, batch):
        """Flow-matching velocity and loss of one batch (dict of tensors; t float32, numpy or tensor).
        x_t = t*eps + (1-t)*a, target u = eps - a; masked slots count zero in the mean."""
        a, eps = batch["actions"], batch["eps"]
        t = torch.as_tensor(batch["t"], device=eps.device).to(eps.dtype)[:, None, None]
        x_t = t * eps + (1 - t) * a
        kv, valid = self.prefix_forward(batch["images"], batch["tokens"], batch["text_mask"])
        v = self.suffix_forward(kv, valid, batch["state"], x_t, batch["t"])
        loss = (batch["action_mask"][:, :, None] * (v - (eps - a)) ** 2).sum() / v.numel()
        return v, loss

    @torch.no_grad()
    def sample_actions(self, batch, action_mean, action_std, steps=10):
        """Inference: the prefix once, then Euler steps from x = eps at t = 1 to t = 0.
        Returns un-normalized actions (B, H, A)."""
        kv, valid = self.prefix_forward(batch["images"], batch["tokens"], batch["text_mask"])
        x = batch["eps"].clone()
        B, dt = x.shape[0], 1.0 / steps
        for k in range(steps):
            t = np.float32(1.0) - np.float32(dt) * np.float32(k)  # float32 as the C loop computes it
            v = self.suffix_forward(kv, valid, batch["state"], x, np.full(B, t, np.float32))
            x = x - dt * v
        return x * torch.tensor(action_std, dtype=x.dtype, device=x.device) + \
            torch.tensor(action_mean, dtype=x.dtype, device=x.device)


# ----------------------------------------------------------------------------
# optimizer: AdamW by hand, so every operation is the one the trainers do


def grad_norm(model):
    """Global L2 norm of all gradients (accumulated in float64)."""
    return math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()))


def fill_missing_grads(model):
    """Tensors the loss does not reach (the VLM's last layer when L = 1) get zeros, never None."""
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)


class AdamW:
    """AdamW (0.9, 0.95, eps 1e-8), decoupled decay on the table's decay tensors,
    global-norm clipping before the update."""

    def __init__(self, model, lr, warmup, steps, min_lr_frac, weight_decay, clip):
        self.model = model
        self.lr, self.warmup, self.steps, self.min_lr_frac = lr, warmup, steps, min_lr_frac
        self.weight_decay, self.clip = weight_decay, clip
        self.m = {s.name: torch.zeros(s.shape, dtype=model.dtype) for s in model.table}
        self.v = {s.name: torch.zeros(s.shape, dtype=model.dtype) for s in model.table}

    @torch.no_grad()
    def step(self, step):
        """Update with the gradients in .grad at 0-based optimizer step `step`.
        Returns (lr, grad norm before clipping)."""
        lr = lr_at_step(step, self.lr, self.warmup, self.steps, self.min_lr_frac)
        norm = grad_norm(self.model)
        scale = self.clip / norm if self.clip > 0 and norm > self.clip else 1.0
        b1, b2 = 1.0 - 0.9 ** (step + 1), 1.0 - 0.95 ** (step + 1)  # bias corrections
        for s in self.model.table:
            p = getattr(self.model, s.name)
            g = p.grad * scale
            m, v = self.m[s.name], self.v[s.name]
            m.mul_(0.9).add_(0.1 * g)
            v.mul_(0.95).add_(0.05 * g * g)
            update = (m / b1) / (torch.sqrt(v / b2) + 1e-8)
            if s.decay:
                update = update + self.weight_decay * p
            p.sub_(lr * update)
        return lr, norm


# ----------------------------------------------------------------------------
# data: batches exactly as the C trainer builds them


def build_batch(ds, cfg, indices, seed, step, dtype):
    """Assembles the samples and draws their flow noise (global sample g = i, one rank).
    Returns (numpy arrays as assembled, the same as tensors in `dtype`)."""
    parts = [ds.assemble(i, cfg) for i in indices]
    names = ["images", "tokens", "text_mask", "state", "actions", "action_mask"]
    arrays = {n: np.stack([p[k] for p in parts]) for k, n in enumerate(names)}
    arrays["images"] = arrays["images"].reshape(len(indices), cfg.n_cam, cfg.img, cfg.img, 3)  # (square cameras)
    noise = [flow_noise(cfg, seed, step, g) for g in range(len(indices))]
    arrays["t"] = np.array([t for t, _ in noise], np.float32)
    arrays["eps"] = np.stack([e for _, e in noise])
    tensors = {n: torch.from_numpy(x) if x.dtype in (np.uint8, np.int32) else torch.tensor(x, dtype=dtype)
               for n, x in arrays.items() if n != "t"}
    tensors["t"] = arrays["t"]  # t stays float32 numpy: the time embedding is computed in float64
    return arrays, tensors


# ----------------------------------------------------------------------------
# files: checkpoints (read) and the debug state ("VLAT" tensor container)

CKPT_MAGIC, CKPT_VERSION = 0x43414C56, 1
VLAT_MAGIC, VLAT_VERSION = 0x54414C56, 1
VLAT_DTYPES = {0: np.float32, 1: np.uint8, 2: np.int32}


def read_checkpoint(path):
    """A checkpoint of vla.h: header (256 bytes), stats, params, m, v (all float32).
    Returns a dict with config, step, seed, sampler_pos, stats, params/m/v (name -> array)."""
    with open(path, "rb") as f:
        raw = f.read()

    def fail(why):
        return ValueError(f"checkpoint {path}: {why}: delete it or pick another with --init")

    if len(raw) < 256:
        raise fail(f"{len(raw)} bytes, shorter than its header: it is truncated")
    magic, version = struct.unpack_from("<II", raw, 0)
    if magic != CKPT_MAGIC:
        raise fail(f"not a train_vla checkpoint (bad magic 0x{magic:08x})")
    if version != CKPT_VERSION:
        raise fail(f"version {version}, this oracle reads {CKPT_VERSION}")
    cfg = VLAConfig(*struct.unpack_from("<15i", raw, 8))
    step, seed, sampler_pos, n_params, file_size = struct.unpack_from("<5Q", raw, 72)
    if config_problem(cfg):
        raise fail(f"holds a bad config ({config_problem(cfg)}): it is corrupt")
    table = param_table(cfg)
    total = table[-1].offset + math.prod(table[-1].shape)
    n_stats = 2 * (cfg.state_dim + cfg.action_dim)
    if n_params != total or file_size != 256 + 4 * n_stats + 12 * total or len(raw) != file_size:
        raise fail(f"{len(raw)} bytes, its header implies {256 + 4 * n_stats + 12 * total}: truncated or corrupt")
    flat = np.frombuffer(raw, "<f4", n_stats + 3 * total, 256)
    stats, rest = flat[:n_stats].copy(), flat[n_stats:]

    def tensors(k):
        base = rest[k * total:(k + 1) * total]
        return collections.OrderedDict(
            (s.name, base[s.offset:s.offset + math.prod(s.shape)].reshape(s.shape).copy()) for s in table)

    return dict(config=cfg, step=step, seed=seed, sampler_pos=sampler_pos, stats=stats,
                params=tensors(0), m=tensors(1), v=tensors(2))


def write_vlat(path, records):
    """records: list of (name, numpy array of float32, uint8 or int32)."""
    codes = {np.dtype(v): k for k, v in VLAT_DTYPES.items()}
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<4I", VLAT_MAGIC, VLAT_VERSION, len(records), 0))
        for name, x in records:
            x = np.ascontiguousarray(x)
            assert len(name.encode()) < 64 and x.dtype in codes and 1 <= x.ndim <= 4, name
            shape = list(x.shape) + [1] * (4 - x.ndim)
            f.write(struct.pack("<64sII4Q", name.encode(), codes[x.dtype], x.ndim, *shape))
            f.write(x.astype(x.dtype.newbyteorder("<")).tobytes())
    os.replace(path + ".tmp", path)


def read_vlat(path):
    """A debug-state file -> OrderedDict name -> numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, n, _ = struct.unpack_from("<4I", raw, 0)
    if magic != VLAT_MAGIC or version != VLAT_VERSION:
        raise ValueError(f"{path}: not a version-{VLAT_VERSION} debug-state file: regenerate it with dev/model.py")
    out, pos = collections.OrderedDict(), 16
    for _ in range(n):
        name, code, ndim, *shape = struct.unpack_from("<64sII4Q", raw, pos)
        pos += 104
        dtype = np.dtype(VLAT_DTYPES[code]).newbyteorder("<")
        numel = math.prod(shape)
        out[name.rstrip(b"\0").decode()] = np.frombuffer(raw, dtype, numel, pos).reshape(shape[:ndim]).copy()
        pos += numel * dtype.itemsize
    if pos != len(raw):
        raise ValueError(f"{path}: {len(raw) - pos} trailing bytes: the file is corrupt, regenerate it")
    return out


# ----------------------------------------------------------------------------
# CLI


def make_config(args, ds, ckpt):
    """Preset (or the checkpoint's config), observation fields from the dataset, then --set."""
    if ckpt is not None:
        if args.set:
            sys.exit("error: --set with --init: the checkpoint fixes the config, drop --set")
        cfg = dataclasses.replace(ckpt["config"])
    elif ds.img == 0 or ds.vocab > 256:
        sys.exit(f"error: this model reads square cameras of one size and byte tokens; the dataset has cameras "
                 f"{ds.cam_height} x {ds.cam_width} and tokenizer {ds.tokenizer}: convert it with the data/ tools' --img")
    else:
        cfg = dataclasses.replace(PRESETS[args.preset], n_cam=ds.n_cam, img=ds.img,
                                  state_dim=ds.state_dim, action_dim=ds.action_dim)
    for item in args.set:
        field, _, value = item.partition("=")
        if field not in CONFIG_FIELDS:
            sys.exit(f"error: --set {item}: unknown field; fields are {', '.join(CONFIG_FIELDS)}")
        try:
            setattr(cfg, field, int(value))
        except ValueError:
            sys.exit(f"error: --set {item}: expected an integer value")
    if config_problem(cfg):
        sys.exit(f"error: bad config: {config_problem(cfg)}: fix the preset or --set")
    got, want = (cfg.n_cam, cfg.img, cfg.state_dim, cfg.action_dim), (ds.n_cam, ds.img, ds.state_dim, ds.action_dim)
    if got != want:
        sys.exit(f"error: config n_cam/img/state_dim/action_dim {got} differ from the dataset's {want}: "
                 "use data with the same observation sizes")
    return cfg


@torch.no_grad()
def finite_differences(model, batch, grads, h=1e-5):
    """Central differences of the loss, in the model's dtype (float64 for the debug state), at the
    largest-gradient entry of every tensor the loss reaches. Independent of autograd: the C test
    checks its gradients against these. Returns ([(tensor index, flat index)], [value])."""
    index, value = [], []
    for k, (name, g) in enumerate(grads):
        if not bool((g != 0).any()):
            continue
        j = int(g.abs().flatten().argmax())
        p = getattr(model, name).view(-1)
        p0 = float(p[j])
        step = h * max(1.0, abs(p0))
        p[j] = p0 + step
        up = float(model(batch)[1])
        p[j] = p0 - step
        down = float(model(batch)[1])
        p[j] = p0
        index.append((k, j))
        value.append((up - down) / (2 * step))
    return index, value


def debug_state(args, ds, cfg, model, dtype):
    """One batch of step 0, its velocities, loss, gradients and samples, then 10 AdamW steps."""
    seed = args.seed
    if not 0 <= seed < 2**31:
        sys.exit("error: --debug-state records the seed as int32: use a seed below 2^31")
    indices = Sampler(ds.n_samples, seed).indices(0, args.batch)
    arrays, batch = build_batch(ds, cfg, indices, seed, 0, dtype)
    v, loss = model(batch)
    loss.backward()
    fill_missing_grads(model)
    grads = [(s.name, getattr(model, s.name).grad.detach().clone()) for s in model.table]
    sample = model.sample_actions(batch, ds.action_mean, ds.action_std)
    params0 = [(s.name, getattr(model, s.name).detach().clone()) for s in model.table]
    fd_index, fd_value = finite_differences(model, batch, grads)

    opt = AdamW(model, args.lr, args.warmup, args.steps, args.min_lr_frac, args.wd, args.clip)
    losses, norms = [], []
    for step in range(10):
        model.zero_grad(set_to_none=True)
        _, step_loss = model(batch)
        step_loss.backward()
        fill_missing_grads(model)
        _, norm = opt.step(step)
        losses.append(float(step_loss))
        norms.append(norm)
        print(f"debug step {step} loss {float(step_loss):.6f} norm {norm:.6f}")

    def f32(x):  # every float record is float32, whatever the compute dtype
        return x.detach().numpy().astype(np.float32) if torch.is_tensor(x) else np.asarray(x, np.float32)

    hparams = [args.lr, args.min_lr_frac, args.warmup, args.steps, args.wd, args.clip]
    records = [("config", np.array(cfg.values(), np.int32)),
               ("hparams", np.array(hparams, np.float32)),
               ("seed", np.array([seed], np.int32)),
               ("stats", ds.stats())]
    records += [("param/" + name, f32(p)) for name, p in params0]
    records += [("batch/indices", np.array(indices, np.int32))]
    # a record holds at most 4 dims: images go as a stack of (B*n_cam) HWC images
    records += [("batch/images", arrays["images"].reshape(-1, cfg.img, cfg.img, 3))]
    records += [("batch/" + n, arrays[n]) for n in ("tokens", "text_mask", "state", "actions", "action_mask", "t", "eps")]
    records += [("expect/v", f32(v)), ("expect/loss", f32([float(loss)]))]
    records += [("grad/" + name, f32(g)) for name, g in grads]
    records += [("fd/index", np.array(fd_index, np.int32)), ("fd/value", f32(fd_value))]
    records += [("expect/sample", f32(sample)), ("expect/losses", f32(losses)), ("expect/norms", f32(norms))]
    write_vlat(args.debug_state, records)
    print(f"loss {float(loss):.6f}; wrote {len(records)} records to {args.debug_state}")


def train(args, ds, cfg, model, ckpt):
    """N optimizer steps as the C trainer takes them (one rank of B samples per step)."""
    opt = AdamW(model, args.lr, args.warmup, args.steps, args.min_lr_frac, args.wd, args.clip)
    step0, pos = 0, 0
    if ckpt is not None:  # continue the checkpoint's run: its step, sampler position and moments
        step0, pos = ckpt["step"], ckpt["sampler_pos"]
        for s in model.table:
            opt.m[s.name].copy_(torch.from_numpy(ckpt["m"][s.name]))
            opt.v[s.name].copy_(torch.from_numpy(ckpt["v"][s.name]))
    sampler = Sampler(ds.n_samples, args.seed)
    times = []
    for step in range(step0, step0 + args.train):
        t0 = time.perf_counter()
        _, batch = build_batch(ds, cfg, sampler.indices(pos, args.batch), args.seed, step, model.dtype)
        model.zero_grad(set_to_none=True)
        _, loss = model(batch)
        loss.backward()
        fill_missing_grads(model)
        lr, norm = opt.step(step)
        pos += args.batch
        times.append(time.perf_counter() - t0)
        print(f"step {step + 1} loss {float(loss):.6f} lr {lr:.4e} norm {norm:.4f}", flush=True)
    timed = times[1:] if len(times) > 1 else times  # the first step warms up allocators and caches
    print(f"ms_per_step {1000.0 * sum(timed) / len(timed):.3f}")


def bench(args, ds, cfg, model):
    """Training-step time on one batch kept on the device (loading excluded): forward, backward,
    global-norm clipping and PyTorch's fused AdamW (decay on the table's matrices), optionally under
    bf16 autocast and torch.compile, attention through scaled_dot_product_attention: what a tuned
    PyTorch trainer of this model does per step. dev/gpu_check.sh compares train_vla with it."""
    device = torch.device(args.device)
    model.to(device)
    indices = Sampler(ds.n_samples, args.seed).indices(0, args.batch)
    _, batch = build_batch(ds, cfg, indices, args.seed, 0, torch.float32)
    batch = {k: torch.as_tensor(v).to(device) for k, v in batch.items()}
    decay = [getattr(model, s.name) for s in model.table if s.decay]
    no_decay = [getattr(model, s.name) for s in model.table if not s.decay]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    forward = torch.compile(model) if args.compile else model

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            _, loss = forward(batch)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(5):  # warm-up: allocator, cuDNN/cuBLAS heuristics, torch.compile's compilation
        loss = step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.bench):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    ms = 1000.0 * times[len(times) // 2]
    print(f"loss {float(loss):.6f}")
    print(f"ms_per_step {ms:.3f}")
    print(f"samples_per_s {args.batch / (ms / 1000.0):.2f}")
    if device.type == "cuda":
        print(f"peak_mem_gib {torch.cuda.max_memory_allocated() / 2**30:.3f}")


def main():
    ap = argparse.ArgumentParser(description="PyTorch oracle of train_vla: debug state and reference training")
    ap.add_argument("-i", "--input", required=True, help="dataset shards: files or folders of *.bin, comma-separated")
    ap.add_argument("-p", "--preset", default="tiny", choices=sorted(PRESETS), help="model size (tiny)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a config field after the preset and the dataset (repeatable)")
    ap.add_argument("-s", "--seed", type=int, default=1337, help="init, sampler and flow-noise seed (1337)")
    ap.add_argument("-b", "--batch", type=int, default=4, help="samples per step (4)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default=None,
                    help="compute precision (float64 for --debug-state, float32 for --train)")
    ap.add_argument("--init", help="start from this checkpoint: config, weights, seed (and moments, step, sampler position for --train)")
    ap.add_argument("-l", "--lr", type=float, default=1e-3, help="peak learning rate (1e-3)")
    ap.add_argument("-u", "--warmup", type=int, default=3, help="linear warmup steps (3)")
    ap.add_argument("-n", "--steps", type=int, default=None,
                    help="schedule length (--debug-state: 10, --train N: N more than the start step)")
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor as a fraction of the peak (0.1)")
    ap.add_argument("-w", "--wd", "--weight-decay", type=float, default=0.1, help="AdamW decay on matrices (0.1)")
    ap.add_argument("-c", "--clip", type=float, default=0.5, help="global gradient-norm clip, 0 disables (0.5)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="torch threads, 0: torch's default")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--debug-state", metavar="OUT", help="write the debug-state file the C tests compare with")
    mode.add_argument("--train", type=int, metavar="N", help="train N steps, print losses and ms_per_step")
    mode.add_argument("--bench", type=int, metavar="N", help="time N training steps on one batch on --device "
                      "(median; parameters drawn by torch, not the seed's table: values do not change the timing)")
    ap.add_argument("--device", default="cpu", help="torch device for --bench: cpu or cuda (cpu)")
    ap.add_argument("--amp", choices=["none", "bf16"], default="none", help="--bench under bf16 autocast (none)")
    ap.add_argument("--compile", action="store_true", help="--bench through torch.compile")
    args = ap.parse_args()
    for name in ("lr", "min_lr_frac", "wd", "clip"):  # float32 values, as the C trainer parses them
        setattr(args, name, float(np.float32(getattr(args, name))))
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "float64": torch.float64}[
        args.dtype or ("float64" if args.debug_state else "float32")]
    if (args.amp != "none" or args.compile or args.device != "cpu") and not args.bench:
        sys.exit("error: --device, --amp and --compile go with --bench")
    if args.batch < 1 or not 0 <= args.seed < 2**63:
        sys.exit("error: -b must be at least 1 and the seed in [0, 2^63)")

    try:
        ds = Dataset(args.input)
        ckpt = read_checkpoint(args.init) if args.init else None
    except ValueError as e:
        sys.exit(f"error: {e}")
    cfg = make_config(args, ds, ckpt)
    if args.steps is None:  # the schedule ends with the run (after the checkpoint's steps, if any)
        args.steps = 10 if args.debug_state else (args.train or args.bench) + (ckpt["step"] if ckpt else 0)
    model = VLA(cfg, dtype, sdpa=args.bench is not None)
    if args.bench:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            sys.exit("error: --device cuda but torch sees no GPU: run on a GPU machine or use --device cpu")
        with torch.no_grad():  # table-shaped values without the seed's slow numpy draw
            for spec in model.table:
                p = getattr(model, spec.name)
                p.fill_(1.0) if spec.init == ONE else p.zero_() if spec.init == ZERO else p.normal_(0.0, 0.02)
        bench(args, ds, cfg, model)
        return
    if ckpt is not None:
        # as the C trainer: weights, moments, step and seed from the checkpoint; normalization
        # statistics from the training data (the checkpoint's copy serves inference)
        args.seed = ckpt["seed"]
        model.load(ckpt["params"])
    else:
        model.load(param_init(cfg, args.seed))
    if args.debug_state:
        debug_state(args, ds, cfg, model, dtype)
    else:
        train(args, ds, cfg, model, ckpt)


if __name__ == "__main__":
    main()
