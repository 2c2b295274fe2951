"""A model, not a measurement: step time and samples/s of train_vla on 1, 2, 4 and 8 GPUs of one
NVLink machine, from the one-GPU step time and the cost of NCCL's ring all-reduce.

    build/venv/bin/python dev/scaling_model.py --from-log build/gpu_check/logs/bench_train_vla_expert.log   # a measured step (its preset, mode, batch)
    build/venv/bin/python dev/scaling_model.py -p smolvla --train all --step-ms 120                        # a step time you have
    build/venv/bin/python dev/scaling_model.py                                        # no measurement: assumed MFU

How a step is modelled (train_vla.cu, MULTI_GPU), for the preset and train mode (--train: what
trains, as the trainer's --train; the preset's default when not given):
- Sizes come from dev/model.py's parameter table: every weight is held (bf16 for the compute), but
  gradients, fp32 master weights and AdamW's moments exist only for the elements that train in the
  mode (flow_trainable_numel), so gradient bytes are 4 x the trainable count.
- One GPU's step T1 = forward + backward + optimizer. The optimizer (AdamW over the trainable fp32
  master weights, moments and gradients) is memory-bound: T_opt = bytes it moves / HBM bandwidth.
  The rest is split 1:2 between forward and backward (the backward does about twice the matrix
  FLOPs of what it passes through).
- Data parallel (-z 0): the gradients (fp32) are summed in train_vla.cu's buckets, in the order
  the backward finishes them: the expert's layers from the last (its head with the last), its
  input projections; the VLM's layers from the last, the prefix's embeddings (connector, token
  embeddings, state projection); the vision tower's layers from the last (its post-norm with the
  last), its patch and position embeddings. A bucket holds the trainable elements of its layer;
  one with none is not sent. Bucket b is ready when the backward has done the share of its FLOPs
  up to b (forward FLOPs of what the backward passes through: in expert mode the VLM's state
  rows only and no vision tower, in vlm mode the VLM but not the vision tower).
  A ring all-reduce of n bytes over N GPUs takes latency + 2 (N-1)/N n / bus bandwidth (the "bus
  bandwidth" of nccl-tests), one bucket after another on the communication stream. What is still
  running when the backward ends, plus the loss's all-reduce, is exposed: step = T1 + exposed.
- ZeRO-1 (-z 1): a reduce-scatter of the trainable gradients after the backward ((N-1)/N n / bus
  bandwidth), the optimizer on 1/N of the state, an all-gather of the bf16 trainable weights; none
  of it overlapped.
- Without a measurement, T1 comes from an assumed MFU and the training FLOPs per sample of
  dev/lerobot/bench_lerobot.py's smolvla_train_flops (count "model", the language padded to max_text).
The data loader is assumed to keep up (train_vla's does: docs/data.md, "The loader"); compute per GPU
does not change with N (the per-GPU batch is fixed).
"""
import argparse
import math
import os
import re
import sys

DEV = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, DEV)
sys.path.insert(0, os.path.join(DEV, "lerobot"))
import bench_lerobot  # noqa: E402  (its FLOP formulas need only the standard library)
import model as vla  # noqa: E402  (dev/model.py: the presets, the parameter table, the train modes)


def layer_flops(c, l, P):
    """Forward FLOPs per sample of layer l: (the VLM's part, the expert's part), matrix products
    and attention (P prefix tokens, C = chunk action tokens), as train_vla.cu splits them: the
    prefix's own attention is the VLM's, the action queries' attention (over the prefix and the
    actions, or over the prefix alone in a cross layer) the expert's."""
    C, d, de, q, kv = c.chunk, c.d_model, c.d_expert, c.d_attn, c.d_kv
    last = l == c.n_layer - 1
    vlm = 2 * P * d * 2 * kv  # k and v: the expert reads them in every layer
    if not last:  # the last layer's queries, attention, output and MLP feed nothing
        vlm += 2 * P * d * q + 2 * P * q * d + 2 * P * 3 * d * c.d_ff + 4 * P * P * q
    expert = 2 * C * de * q + 2 * C * q * de + 2 * C * 3 * de * c.d_expert_ff
    if c.layer_is_cross(l):
        expert += 2 * P * kv * 2 * kv + 4 * C * P * q  # the VLM's K/V re-projected, action queries on them
    else:
        expert += 2 * C * de * 2 * kv + 4 * C * (P + C) * q
    return vlm, expert


def buckets_of(c, mode):
    """Each gradient bucket of train_vla.cu (flow_bucket): (name, trainable elements, backward
    weight = forward FLOPs per sample of what the backward passes through before the bucket is
    final), in the order the backward pass finishes them: the expert's layers from the top (its
    head with the top one), its input projections, the VLM's layers from the top (its final norm
    with the top one), the prefix's embeddings (connector, token embeddings, state projection), the
    vision tower's layers from the top (its post-LayerNorm with the top one), its patch and
    position embeddings. In expert mode the VLM's backward carries only the state token's rows
    (1/P of its forward); the vision tower is passed through in all mode only."""
    P = c.n_cam * (c.grid // c.scale_factor) ** 2 + c.max_text + 1
    C, de, N, L, Lv = c.chunk, c.d_expert, c.grid * c.grid, c.n_layer, c.vis_layers
    vision_layer = c.n_cam * (2 * N * c.vis_width * 4 * c.vis_width + 2 * N * 2 * c.vis_width * c.vis_ff +
                              4 * N * N * c.vis_width)
    through_vision = mode == 2
    vlm_share = 1.0 if mode >= 1 else 1.0 / P
    numel = {}  # bucket name -> trainable elements

    def add(name, n):
        numel[name] = numel.get(name, 0) + n

    towers = {vla.TOWER_EXPERT: ("expert", L), vla.TOWER_VLM: ("VLM", L), vla.TOWER_VISION: ("vision", Lv)}
    for s in vla.param_table(c):
        tower, depth = towers[s.tower]
        n_train = vla.trainable_numel(s, mode)
        per = vla.slice_numel(s)
        if s.kind == vla.KIND_LAYER:
            for i in range(vla.n_slices(s)):
                layer = i if s.tower == vla.TOWER_VISION else vla.slice_layer(c, s, i)
                add(f"{tower} layer {layer}", max(0, min(per, n_train - i * per)))
        elif s.kind == vla.KIND_HEAD:
            add(f"{tower} layer {depth - 1}", n_train)
        else:
            add(f"{tower} inputs", n_train)
    flops = {"expert inputs": 2 * C * (c.max_action_dim * de + 3 * de * de),
             "VLM inputs": 2 * c.max_state_dim * c.d_model +
             (c.n_cam * 2 * (N // c.scale_factor ** 2) * c.vis_width * c.scale_factor ** 2 * c.d_model if mode >= 1 else 0),
             "vision inputs": c.n_cam * 2 * N * c.patch_dim * c.vis_width if through_vision else 0}
    for l in range(L):
        vlm, expert = layer_flops(c, l, P)
        flops[f"expert layer {l}"] = expert + (2 * C * de * c.max_action_dim if l == L - 1 else 0)
        flops[f"VLM layer {l}"] = vlm * vlm_share
    for i in range(Lv):
        flops[f"vision layer {i}"] = vision_layer if through_vision else 0
    order = [f"expert layer {l}" for l in reversed(range(L))] + ["expert inputs"]
    order += [f"VLM layer {l}" for l in reversed(range(L))] + ["VLM inputs"]
    order += [f"vision layer {i}" for i in reversed(range(Lv))] + ["vision inputs"]
    return [(name, numel.get(name, 0), flops[name]) for name in order if numel.get(name, 0) > 0]


def train_flops_per_sample(c, mode):
    """dev/lerobot/bench_lerobot.py's count of a training step's FLOPs per sample (model count)."""
    sz = dict(image=c.img, patch=c.patch, v_width=c.vis_width, v_layers=c.vis_layers, v_mlp=c.vis_ff,
              scale_factor=c.scale_factor, width=c.d_model, heads=c.n_head, kv_heads=c.n_kv_head,
              head_dim=c.head_dim, mlp=c.d_ff, vlm_layers=c.n_layer, vocab=c.vocab, e_width=c.d_expert,
              e_mlp=c.d_expert_ff, sa_every=c.self_attn_every, chunk=c.chunk, state_max=c.max_state_dim,
              action_max=c.max_action_dim, num_steps=10, n_cams=c.n_cam)
    return bench_lerobot.smolvla_train_flops(sz, 1, c.max_text, vla.TRAIN_MODES[mode], "model")["total"]


def ring_seconds(nbytes, n, bus_bw, latency, factor):
    """NCCL ring collective over n GPUs: factor 2 (all-reduce) or 1 (reduce-scatter, all-gather)."""
    if n == 1:
        return 0.0
    return latency + factor * (n - 1) / n * nbytes / bus_bw


def model_step(t1, buckets, n_trainable, n, a):
    """(DDP step seconds, its exposed communication, ZeRO-1 step seconds) on n GPUs."""
    t_opt = n_trainable * a.opt_bytes_per_param / a.hbm_bw
    t_bwd = (t1 - t_opt) * 2.0 / 3.0
    total_flops = sum(f for _, _, f in buckets) or 1.0
    # DDP: buckets in backward order on one communication stream
    done_flops, comm_free = 0.0, 0.0
    for _, numel, flops in buckets:
        done_flops += flops
        ready = t_bwd * done_flops / total_flops
        comm_free = max(comm_free, ready) + ring_seconds(4 * numel, n, a.bus_bw, a.latency, 2)
    comm_free += ring_seconds(12, n, a.bus_bw, a.latency, 2)  # the loss and the stop flag
    exposed = max(0.0, comm_free - t_bwd)
    ddp = t1 + exposed
    # ZeRO-1: reduce-scatter (fp32), the scalars, the norm's sum, AdamW on a shard, all-gather (bf16)
    zero_comm = (ring_seconds(4 * n_trainable, n, a.bus_bw, a.latency, 1) + 2 * ring_seconds(12, n, a.bus_bw, a.latency, 2)
                 + ring_seconds(2 * n_trainable, n, a.bus_bw, a.latency, 1))
    zero = t1 - t_opt + t_opt / n + zero_comm
    return ddp, exposed, zero


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--preset", default=None, choices=sorted(vla.PRESETS),
                    help="model size (smolvla; --from-log: the run's)")
    ap.add_argument("--train", choices=vla.TRAIN_MODES, default=None,
                    help="what trains, as train_vla's --train (the preset's default: expert for smolvla, all otherwise)")
    ap.add_argument("-b", "--batch", type=int, default=None, help="samples per GPU per step (16; --from-log: the run's)")
    ap.add_argument("--step-ms", type=float, help="one GPU's measured step time (ms) at this preset, mode and batch")
    ap.add_argument("--from-log", help="a train_vla log: its 'mean step time' line gives --step-ms")
    ap.add_argument("--mfu", type=float, default=0.40, help="without a measurement: the MFU assumed for one GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="bf16 dense peak (H100 SXM, H200)")
    ap.add_argument("--bus-gbps", type=float, default=360.0,
                    help="ring all-reduce bus bandwidth per GPU, GB/s (NVLink 4: 450 GB/s each way, ~80%% reached)")
    ap.add_argument("--latency-us", type=float, default=20.0, help="fixed cost of one collective, microseconds")
    ap.add_argument("--hbm-tbps", type=float, default=3.35, help="HBM bandwidth, TB/s (H100 SXM)")
    ap.add_argument("--gpus", default="1,2,4,8")
    a = ap.parse_args()
    log = None
    if a.from_log:
        try:
            with open(a.from_log) as f:
                log = f.read()
        except OSError as e:
            sys.exit(f"error: cannot read {a.from_log}: {e.strerror}")
        # the run's own preset, mode and batch (its config table), unless given, and then they must agree
        for key, row, cast in (("preset", r"^\| train_vla\s+\| (\S+)", str), ("train", r"^\| train mode \(--train\)\s+\| (\S+)", str),
                               ("batch", r"^\| GPUs x batch x accum\s+\| \d+ x (\d+) x", int)):
            m = re.search(row, log, re.M)
            if m is None:
                continue
            if getattr(a, key) is None:
                setattr(a, key, cast(m.group(1)))
            elif getattr(a, key) != cast(m.group(1)):
                sys.exit(f"error: --{key} {getattr(a, key)} but {a.from_log} ran with {m.group(1)}: drop the flag or give that log")
    a.batch = a.batch or 16
    a.preset = a.preset or "smolvla"
    if a.preset not in vla.PRESETS:
        sys.exit(f"error: {a.from_log} trained the sizes of a checkpoint, not a preset: the model covers the presets "
                 f"({', '.join(sorted(vla.PRESETS))}); give -p with the log of a preset's run")
    a.bus_bw = a.bus_gbps * 1e9
    a.latency = a.latency_us * 1e-6
    a.hbm_bw = a.hbm_tbps * 1e12
    # AdamW per trainable element: read master, gradient, m, v (16 B), write master, m, v (12 B) and the bf16 copy (2 B)
    a.opt_bytes_per_param = 30

    cfg = vla.PRESETS[a.preset]
    mode = vla.TRAIN_MODES.index(a.train) if a.train else vla.default_train_mode(a.preset)
    buckets = buckets_of(cfg, mode)
    n_trainable = sum(n for _, n, _ in buckets)
    table = vla.param_table(cfg)
    table_trainable = sum(vla.trainable_numel(s, mode) for s in table)
    assert n_trainable == table_trainable, f"the buckets hold {n_trainable} elements, the table trains {table_trainable}"
    n_params = vla.param_count(cfg)
    flops_per_sample = train_flops_per_sample(cfg, mode)
    if log is not None:
        m = re.search(r"^mean step time ([0-9.]+) ms", log, re.M)
        if m is None:
            sys.exit(f"error: {a.from_log} has no 'mean step time' line: give a finished train_vla run's log")
        t1_ms, source = float(m.group(1)), f"measured: {a.from_log}"
    elif a.step_ms:
        t1_ms, source = a.step_ms, "given with --step-ms"
    else:
        t1_ms = 1000.0 * a.batch * flops_per_sample / (a.mfu * a.peak_tflops * 1e12)
        source = f"NOT MEASURED: assumed from {100 * a.mfu:.0f}% MFU of {a.peak_tflops:g} TFLOP/s"
    t1 = t1_ms / 1000.0

    print(f"# scaling model (a model, not a measurement): preset {a.preset}, --train {vla.TRAIN_MODES[mode]}, batch "
          f"{a.batch} per GPU, {n_params / 1e6:.1f}M parameters of which {n_trainable / 1e6:.1f}M train, "
          f"{len(buckets)} gradient buckets of {4 * n_trainable / 1e6:.0f} MB in all, "
          f"{flops_per_sample / 1e9:.1f} GFLOP per sample")
    print(f"# one-GPU step {t1_ms:.1f} ms ({source}); ring bus bandwidth {a.bus_gbps:g} GB/s, "
          f"{a.latency_us:g} us per collective; HBM {a.hbm_tbps:g} TB/s; optimizer state (master weights, "
          f"AdamW m and v of the trainable elements) {12 * n_trainable / 1e9:.2f} GB per GPU without ZeRO-1")
    print()
    print("| GPUs | all-reduce, all buckets | exposed | DDP step | DDP samples/s | DDP efficiency "
          "| ZeRO-1 step | ZeRO-1 efficiency | ZeRO-1 optimizer state per GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.gpus.split(",")]:
        ddp, exposed, zero = model_step(t1, buckets, n_trainable, n, a)
        comm = sum(ring_seconds(4 * numel, n, a.bus_bw, a.latency, 2) for _, numel, _ in buckets)
        state_gb = 12 * n_trainable / (n if n > 1 else 1) / 1e9
        print(f"| {n} | {1000 * comm:.1f} ms | {1000 * exposed:.1f} ms | {1000 * ddp:.1f} ms | "
              f"{n * a.batch / ddp:.0f} | {100 * t1 / ddp:.0f}% | {1000 * zero:.1f} ms | {100 * t1 / zero:.0f}% | "
              f"{state_gb:.2f} GB |")


if __name__ == "__main__":
    main()
