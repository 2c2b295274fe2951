"""A model, not a measurement: step time and samples/s of train_vla on 1, 2, 4 and 8 GPUs of one
NVLink machine, from the one-GPU step time and the cost of NCCL's ring all-reduce.

    python3 dev/scaling_model.py --from-log build/gpu_check/bench_train_vla.log   # a measured step
    python3 dev/scaling_model.py --step-ms 120                                     # a step time you have
    python3 dev/scaling_model.py                                                   # no measurement: assumed MFU

How a step is modelled (train_vla.cu, MULTI_GPU):
- One GPU's step T1 = forward + backward + optimizer. The optimizer (AdamW over fp32 master
  weights, moments and gradients) is memory-bound: T_opt = bytes it moves / HBM bandwidth. The
  rest is split 1:2 between forward and backward (the backward does twice the matrix FLOPs).
- Data parallel (-z 0): the gradients (fp32) are averaged in buckets (vla.h's
  param_bucket_slices: the expert's head, its layers from the last, its input layers, then the
  VLM's layers from the last and its input layers), each launched when the backward pass has
  produced it, one after another on the communication stream. Bucket b is ready when the
  backward has done the share of its FLOPs up to b. A ring all-reduce of n bytes over N GPUs
  takes latency + 2 (N-1)/N n / bus bandwidth (the "bus bandwidth" of nccl-tests). What is still
  running when the backward ends, plus the loss's all-reduce, is exposed: step = T1 + exposed.
- ZeRO-1 (-z 1): a reduce-scatter of the gradients after the backward ((N-1)/N n / bus bandwidth),
  the optimizer on 1/N of the state, an all-gather of the bf16 parameters; none of it overlapped.
The data loader is assumed to keep up (train_vla's does: README, "The loader"); compute per GPU
does not change with N (the per-GPU batch is fixed).
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as vla  # noqa: E402  (dev/model.py: the presets and the parameter table)


def bucket_tensors(cfg):
    """Each gradient bucket's element count and forward FLOPs per sample, in the order the
    backward pass finishes them (vla.h: param_bucket_slices; model_flops_per_sample's terms)."""
    L, d, da, D = cfg.n_layer, cfg.d_model, cfg.d_expert, cfg.d_attn
    NI, Np, H = cfg.n_image_tokens, cfg.n_prefix, cfg.chunk
    Ns = 1 + H
    numel = {"head": 0, "exp_layer": 0, "exp_input": 0, "vlm_layer": 0, "vlm_input": 0}
    for p in vla.param_table(cfg):
        n = 1
        for s in p.shape:
            n *= s
        if p.name.startswith(("vlm_", "exp_")):
            numel[("vlm" if p.group == vla.VLM else "exp") + "_layer"] += n // L
        elif p.name in ("final_norm", "action_out_w", "action_out_b"):
            numel["head"] += n
        else:
            numel[("vlm" if p.group == vla.VLM else "exp") + "_input"] += n
    exp_layer_flops = 2 * Ns * (4 * da * D + 3 * da * cfg.d_expert_ff) + 4 * Ns * (Np + Ns) * D
    vlm_layer_flops = 2 * Np * (4 * d * D + 3 * d * cfg.d_ff) + 4 * Np * Np * D
    vlm_last_flops = 2 * Np * 2 * d * D  # the prefix's last layer computes only k and v
    buckets = [("expert head", numel["head"], 2 * H * da * cfg.action_dim)]
    buckets += [(f"expert layer {l}", numel["exp_layer"], exp_layer_flops) for l in reversed(range(L))]
    buckets += [("expert input", numel["exp_input"],
                 2 * H * (cfg.action_dim * da + 3 * da * da) + 2 * cfg.state_dim * da)]
    buckets += [(f"VLM layer {l}", numel["vlm_layer"], vlm_last_flops if l == L - 1 else vlm_layer_flops)
                for l in reversed(range(L))]
    buckets += [("VLM input", numel["vlm_input"], 2 * NI * 3 * cfg.patch * cfg.patch * d)]
    return buckets


def ring_seconds(nbytes, n, bus_bw, latency, factor):
    """NCCL ring collective over n GPUs: factor 2 (all-reduce) or 1 (reduce-scatter, all-gather)."""
    if n == 1:
        return 0.0
    return latency + factor * (n - 1) / n * nbytes / bus_bw


def model_step(t1, buckets, n_params, n, a):
    """(DDP step seconds, its exposed communication, ZeRO-1 step seconds) on n GPUs."""
    t_opt = n_params * a.opt_bytes_per_param / a.hbm_bw
    t_bwd = (t1 - t_opt) * 2.0 / 3.0
    total_flops = sum(f for _, _, f in buckets)
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
    zero_comm = (ring_seconds(4 * n_params, n, a.bus_bw, a.latency, 1) + 2 * ring_seconds(12, n, a.bus_bw, a.latency, 2)
                 + ring_seconds(2 * n_params, n, a.bus_bw, a.latency, 1))
    zero = t1 - t_opt + t_opt / n + zero_comm
    return ddp, exposed, zero


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--preset", default="base", choices=sorted(vla.PRESETS))
    ap.add_argument("-b", "--batch", type=int, default=16, help="samples per GPU per step")
    ap.add_argument("--step-ms", type=float, help="one GPU's measured step time (ms) at this preset and batch")
    ap.add_argument("--from-log", help="a train_vla log: its 'mean step time' line gives --step-ms")
    ap.add_argument("--mfu", type=float, default=0.40, help="without a measurement: the MFU assumed for one GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="bf16 dense peak (H100 SXM, H200)")
    ap.add_argument("--bus-gbps", type=float, default=360.0,
                    help="ring all-reduce bus bandwidth per GPU, GB/s (NVLink 4: 450 GB/s each way, ~80%% reached)")
    ap.add_argument("--latency-us", type=float, default=20.0, help="fixed cost of one collective, microseconds")
    ap.add_argument("--hbm-tbps", type=float, default=3.35, help="HBM bandwidth, TB/s (H100 SXM)")
    ap.add_argument("--gpus", default="1,2,4,8")
    a = ap.parse_args()
    a.bus_bw = a.bus_gbps * 1e9
    a.latency = a.latency_us * 1e-6
    a.hbm_bw = a.hbm_tbps * 1e12
    # AdamW per parameter: read master, gradient, m, v (16 B), write master, m, v (12 B) and the bf16 copy (2 B)
    a.opt_bytes_per_param = 30

    cfg = vla.PRESETS[a.preset]
    buckets = bucket_tensors(cfg)
    n_params = sum(n for _, n, _ in buckets)
    table = vla.param_table(cfg)
    table_total = table[-1].offset
    for n in table[-1].shape:
        table_total += n
    assert n_params == table_total, f"the buckets hold {n_params} parameters, the table {table_total}"
    flops_per_sample = 3 * sum(f for _, _, f in buckets)
    if a.from_log:
        with open(a.from_log) as f:
            m = re.search(r"^mean step time ([0-9.]+) ms", f.read(), re.M)
        if m is None:
            sys.exit(f"error: {a.from_log} has no 'mean step time' line: give a finished train_vla run's log")
        t1_ms, source = float(m.group(1)), f"measured: {a.from_log}"
    elif a.step_ms:
        t1_ms, source = a.step_ms, "given with --step-ms"
    else:
        t1_ms = 1000.0 * a.batch * flops_per_sample / (a.mfu * a.peak_tflops * 1e12)
        source = f"NOT MEASURED: assumed from {100 * a.mfu:.0f}% MFU of {a.peak_tflops:g} TFLOP/s"
    t1 = t1_ms / 1000.0

    print(f"# scaling model (a model, not a measurement): preset {a.preset}, batch {a.batch} per GPU, "
          f"{n_params / 1e6:.1f}M parameters, {len(buckets)} gradient buckets of {4 * n_params / 1e6:.0f} MB in all")
    print(f"# one-GPU step {t1_ms:.1f} ms ({source}); ring bus bandwidth {a.bus_gbps:g} GB/s, "
          f"{a.latency_us:g} us per collective; HBM {a.hbm_tbps:g} TB/s; optimizer state (master weights, "
          f"AdamW m and v) {12 * n_params / 1e9:.2f} GB per GPU without ZeRO-1")
    print()
    print("| GPUs | all-reduce, all buckets | exposed | DDP step | DDP samples/s | DDP efficiency "
          "| ZeRO-1 step | ZeRO-1 efficiency | ZeRO-1 optimizer state per GPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.gpus.split(",")]:
        ddp, exposed, zero = model_step(t1, buckets, n_params, n, a)
        comm = sum(ring_seconds(4 * numel, n, a.bus_bw, a.latency, 2) for _, numel, _ in buckets)
        state_gb = 12 * n_params / (n if n > 1 else 1) / 1e9
        print(f"| {n} | {1000 * comm:.1f} ms | {1000 * exposed:.1f} ms | {1000 * ddp:.1f} ms | "
              f"{n * a.batch / ddp:.0f} | {100 * t1 / ddp:.0f}% | {1000 * zero:.1f} ms | {100 * t1 / zero:.0f}% | "
              f"{state_gb:.2f} GB |")


if __name__ == "__main__":
    main()
