"""
bench_infer.py: the inference speed of train_vla's policy: one action chunk at batch 1 from raw
observations (two cameras of 224x224 u8 frames, resized with padding to the model's input on the
device; an instruction; a raw state of 6 dims; action chunks of 5 dims, as LeRobot's benchmark
batch in dev/lerobot/bench_lerobot.py), the prefix once and 10 Euler steps, through the policy
libraries (libvla_gpu.so, libvla.so) and scripts/vla_policy.py, the way eval_metaworld.py serves a
checkpoint. The peer figure is LeRobot's select_action / predict_action_chunk
(dev/lerobot/bench_lerobot.py --infer); dev/gpu_check.sh runs both on one GPU.

    build/venv/bin/python dev/bench_infer.py                                  # smolvla, libvla_gpu.so, graphs and not
    build/venv/bin/python dev/bench_infer.py --chunks 100 --json infer.json
    build/venv/bin/python dev/bench_infer.py --preset tiny --device cpu --chunks 3 --warmup 1          # a smoke run
    build/venv/bin/python dev/bench_infer.py --preset pi0                     # pi0 against LeRobot's PI0Policy chunk
    build/venv/bin/python dev/bench_infer.py --preset smolvla_layers --library build/emu/libvla_gpu_bf16.so \
        --chunks 1 --warmup 2                # launches of a smolvla chunk, counted by the CPU emulation

Why Python (ctypes) and not a C program linking the library: it times the call a user makes,
VLAPolicy.act (the observation checks, the host batch, the copy to the device, sampling, the copy
of the actions back and their un-normalizing), and ctypes adds tens of microseconds, far below the
15 ms target; LeRobot's figure is taken from Python too. The library's own split of the chunk
(prefix, Euler steps) is device time between CUDA events, free of the host side, and under the CPU
emulation of CUDA it also counts the launches of each part (timings there mean nothing).

The checkpoint: the preset's sizes with the benchmark's cameras and dims, random weights, zero
moments; written once under build/bench/ and reused while its sizes match (the file name carries
them). SmolVLA presets: dev/model.py's param_init (the trainers' initialization) in their default
train mode (the smolvla preset's file is ~2.4 GB: 403M fp32 weights, moments of the 100M the
`expert` mode trains). pi0 presets: the same distributions (normal(0, 0.02), output projections
0.02 / sqrt(2 depth), zeros, ones) drawn by numpy's PCG64 on every core, because param_init's
counter-based draws run on one core at 0.25-0.4 us a weight: 15-20 min for pi0's 3.24B, against
~25 ns a weight a core (~5 s on 16 cores). They are written in train mode expert, the fewest AdamW
moments (inference reads the weights alone): pi0's file is 15.5 GB (14.4 GiB: 3.24B fp32
weights, zero moments of the 315M the expert trains), written at the disk's speed after two
copies and a CRC-32 (~1.7 GB/s on one core): ~20 s into memory (--out-dir on a tmpfs), a 2-core
machine's shared disk took 0.12 GB/s.
Presets: those of vla/config.h (tiny, small, smolvla, pi0 at lerobot/pi0's sizes, pi0_tiny for a
smoke run, pi0_small, which LeRobot's bench builds too; pi0's prefix holds 48 text columns as LeRobot's bench feeds it, the instruction's bytes
here, PaliGemma's ids there, padded and masked alike), and smolvla_layers: smolvla's cameras, layer counts, layer
schedule, text length and chunk at the tiny preset's widths, which launch exactly what smolvla
launches (each launcher issues one launch per call whatever the width) and run under the CPU
emulation in seconds.

Each timed chunk is one act() call, wall clock; the report gives the median, p90 and min over the
timed chunks, the library's median device time of the prefix and of the 10 Euler steps where it
reports them (the GPU library), and the launches where it counts them. --graphs both times the
Euler steps replayed as one CUDA graph (the GPU library's default), then launched one by one, in
one policy switched between them (vla_policy_set_graphs), so pi0's checkpoint loads once. The
closing line is machine-readable:
`infer_ms_per_chunk <median>` of the first mode timed.
"""

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from vla_policy import VLAPolicy  # noqa: E402

# LeRobot's benchmark batch (dev/lerobot/bench_lerobot.py: CAMERAS, FRAME_HW, STATE_DIM,
# ACTION_DIM, TASKS[0] at batch 1)
N_CAM, FRAME_HW, STATE_DIM, ACTION_DIM = 2, (224, 224), 6, 5
INSTRUCTION = "push the button"
SEED = 0


def preset_config(name):
    """The preset's SmolVLAConfig with the benchmark's cameras and dims."""
    import model as oracle  # dev/model.py: imports torch, so only when a checkpoint is made
    if name == "smolvla_layers":
        cfg = dataclasses.replace(oracle.PRESETS["tiny"], n_cam=2, vis_layers=oracle.PRESETS["smolvla"].vis_layers)
        big = oracle.PRESETS["smolvla"]
        cfg = dataclasses.replace(cfg, n_layer=big.n_layer, self_attn_every=big.self_attn_every, max_text=big.max_text,
                                  chunk=big.chunk)
    else:
        cfg = oracle.PRESETS[name]
    return dataclasses.replace(cfg, n_cam=N_CAM, state_dim=STATE_DIM, action_dim=ACTION_DIM), oracle


def random_params(cfg, oracle, seed):
    """param_init's distributions, drawn fast: each tensor of the table in pieces of 2^24 elements,
    piece i of tensor k from PCG64 seeded (seed, k, i), on every core (numpy releases the GIL while
    it draws), so the weights do not depend on the thread count. Returns name -> float32 array."""
    params, jobs = {}, []
    piece = 1 << 24
    for k, s in enumerate(oracle.param_table(cfg)):
        if s.init in (oracle.INIT_ZERO, oracle.INIT_ONE):
            params[s.name] = np.full(s.shape, 1.0 if s.init == oracle.INIT_ONE else 0.0, np.float32)
            continue
        depth = cfg.vis_layers if s.tower == oracle.TOWER_VISION else cfg.n_layer
        std = np.float32(0.02)
        if s.init == oracle.INIT_NORMAL_OUT:
            std = np.float32(0.02) / np.sqrt(np.float32(2.0) * np.float32(depth))
        x = np.empty(s.shape, np.float32)
        flat = x.reshape(-1)
        params[s.name] = x
        jobs += [(flat[j:j + piece], std, (seed, k, j // piece)) for j in range(0, flat.size, piece)]

    def draw(job):
        out, std, key = job
        np.random.Generator(np.random.PCG64(key)).standard_normal(out=out, dtype=np.float32)
        out *= std

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(draw, jobs))
    return params


def checkpoint_for(preset, out_dir):
    """The preset's random-weight checkpoint under out_dir, made if absent: named after a digest of
    its config, so a changed preset makes a new one."""
    sys.path.insert(0, HERE)
    cfg, oracle = preset_config(preset)
    digest = hashlib.sha1(repr(cfg.values()).encode()).hexdigest()[:10]
    path = os.path.join(out_dir, f"infer_{preset}_{digest}.bin")
    if os.path.exists(path):
        return path, False
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    if cfg.is_pi0:  # (the mode sets only how many zero moments the file holds)
        params, how = random_params(cfg, oracle, oracle.DEFAULT_SEED), "drawn by PCG64 in threads"
        mode = oracle.TRAIN_MODES.index("expert")
    else:
        params, how = oracle.param_init(cfg, oracle.DEFAULT_SEED), "param_init's"
        mode = oracle.default_train_mode(preset)
    t1 = time.perf_counter()
    rng = np.random.default_rng(SEED)
    stats = np.concatenate([rng.normal(size=STATE_DIM), rng.uniform(0.2, 1.2, STATE_DIM),
                            rng.normal(size=ACTION_DIM), rng.uniform(0.2, 1.2, ACTION_DIM)]).astype(np.float32)
    size = oracle.write_checkpoint(path, cfg, mode, stats, params)
    print(f"wrote {path}: {oracle.param_count(cfg):,} random weights ({how}, {t1 - t0:.1f} s), train mode "
          f"{oracle.TRAIN_MODES[mode]}, {size / 2**30:.2f} GiB in {time.perf_counter() - t1:.1f} s", flush=True)
    return path, True


def observations():
    """Batch 1: two cameras of 224x224 u8 frames, the instruction, a raw state."""
    rng = np.random.default_rng(SEED)
    images = [rng.integers(0, 256, size=(1, *FRAME_HW, 3), dtype=np.uint8) for _ in range(N_CAM)]
    state = rng.normal(size=(1, STATE_DIM)).astype(np.float32)
    return images, [INSTRUCTION], state


def percentile(xs, q):
    """The q-th percentile (0..100) of xs, linear between the order statistics (numpy's default)."""
    return float(np.percentile(np.asarray(xs, np.float64), q))


def time_chunks(policy, warmup, chunks):
    """Warm-up chunks, then `chunks` timed ones (a new seed each, so new noise): their wall ms and
    the library's split of each where it reports one."""
    images, text, state = observations()
    wall, parts = [], []
    for i in range(warmup + chunks):
        t0 = time.perf_counter()
        actions = policy.act(images, text, state, seed=i)
        t1 = time.perf_counter()
        if actions.shape != (1, policy.config["chunk"], ACTION_DIM) or not np.all(np.isfinite(actions)):
            raise SystemExit(f"bench_infer: error: act() returned {actions.shape} with non-finite values")
        if i >= warmup:
            wall.append((t1 - t0) * 1e3)
            parts.append(policy.timing())
    report = {"chunks_timed": chunks, "warmup": warmup, "ms_per_chunk_median": statistics.median(wall),
              "ms_per_chunk_p90": percentile(wall, 90), "ms_per_chunk_min": min(wall), "ms_per_chunk": wall}
    if parts[0] is not None:
        report.update(prefix_ms_median=statistics.median(p["prefix_ms"] for p in parts),
                      steps_ms_median=statistics.median(p["steps_ms"] for p in parts),
                      prefix_launches=parts[-1]["prefix_launches"], steps_launches=parts[-1]["steps_launches"])
    return report


def describe(name, r):
    line = (f"{name}: {r['ms_per_chunk_median']:.2f} ms/chunk median, p90 {r['ms_per_chunk_p90']:.2f}, "
            f"min {r['ms_per_chunk_min']:.2f} ({r['chunks_timed']} chunks)")
    if "prefix_ms_median" in r:
        line += (f"; on the device: prefix {r['prefix_ms_median']:.2f} ms, 10 Euler steps "
                 f"{r['steps_ms_median']:.2f} ms")
    if r.get("steps_launches") is not None:
        line += f"; launches: prefix {r['prefix_launches']}, Euler steps {r['steps_launches']}"
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("-p", "--preset", default="smolvla",
                    choices=("smolvla", "small", "tiny", "smolvla_layers", "pi0", "pi0_tiny", "pi0_small"))
    ap.add_argument("-d", "--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda: libvla_gpu.so (or --library), cpu: libvla.so (default cuda)")
    ap.add_argument("--library", default=None, help="another build of the library (e.g. build/emu/libvla_gpu_bf16.so)")
    ap.add_argument("--checkpoint", default=None, help="serve this checkpoint instead of the preset's random one")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "bench"), help="where the checkpoint is kept")
    ap.add_argument("-n", "--chunks", type=int, default=50, help="timed chunks (default 50)")
    ap.add_argument("-w", "--warmup", type=int, default=5, help="untimed chunks first (default 5; the graph is "
                    "captured at the second chunk)")
    ap.add_argument("--graphs", default="both", choices=("on", "off", "both"),
                    help="the GPU library's Euler steps as a CUDA graph, one by one, or both in turn (default both)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="OpenMP threads of the CPU library (0: default)")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    if args.chunks < 1 or args.warmup < 0:
        ap.error("--chunks must be >= 1 and --warmup >= 0")

    if args.checkpoint:
        path, made = args.checkpoint, False
    else:
        path, made = checkpoint_for(args.preset, args.out_dir)
    modes = [("graphs", True), ("eager", False)] if args.graphs == "both" else [(f"graphs {args.graphs}", args.graphs == "on")]
    if args.device == "cpu":
        modes = [("cpu", True)]  # the CPU library has no graphs
    report = {"preset": args.preset, "checkpoint": path, "checkpoint_made": made, "batch": 1,
              "cameras": [list(FRAME_HW)] * N_CAM, "state_dim": STATE_DIM, "action_dim": ACTION_DIM,
              "instruction": INSTRUCTION, "settings": vars(args).copy(), "runs": {}}
    # one policy for every mode, its Euler steps switched between graph and launches: one load
    t0 = time.perf_counter()
    try:
        policy = VLAPolicy(path, device=args.device, threads=args.threads, library=args.library, graphs=modes[0][1])
    except (ValueError, OSError) as e:
        raise SystemExit(f"bench_infer: error: {e}")
    load_s = time.perf_counter() - t0
    c = policy.config
    if (c["n_cam"], c["state_dim"], c["action_dim"]) != (N_CAM, STATE_DIM, ACTION_DIM):
        raise SystemExit(f"bench_infer: error: {path} has {c['n_cam']} cameras, state {c['state_dim']}, action "
                         f"{c['action_dim']}: pass a checkpoint of {N_CAM} cameras, state {STATE_DIM}, action "
                         f"{ACTION_DIM}, or none")
    report.update(device=policy.device, config=c, load_s=load_s)
    for name, graphs in modes:
        if hasattr(policy.lib, "vla_policy_set_graphs"):
            policy.lib.vla_policy_set_graphs(policy.handle, int(graphs))
        r = time_chunks(policy, args.warmup, args.chunks)
        report["runs"][name] = r
        print(describe(f"train_vla {args.preset} B=1 on {policy.device}, {name}", r), flush=True)
    policy.close()
    print(f"train_vla {args.preset} B=1: " + ", ".join(f"{name} {r['ms_per_chunk_median']:.2f}"
                                                       for name, r in report["runs"].items())
          + f" ms/chunk (medians); checkpoint loaded in {load_s:.1f} s", flush=True)
    first = next(iter(report["runs"].values()))
    report["infer"] = {k: first[k] for k in ("ms_per_chunk_median", "ms_per_chunk_p90", "ms_per_chunk_min")}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"infer_ms_per_chunk {first['ms_per_chunk_median']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
