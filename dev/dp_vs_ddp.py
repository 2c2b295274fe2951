"""DataParallel against DDP on SmolVLA: bytes and time per step, modelled, or measured on GPUs.

DataParallel: one process, one replica scattered from GPU 0 every step. DDP: one replica per GPU,
gradients all-reduced (what train_vla does with a thread per GPU). Bytes moved and time per step
are MODELLED from the model's sizes by default, measured with --measure where >= 2 GPUs exist.
dev/dp_vs_ddp.md explains the two schemes and the model's assumptions.

    build/venv/bin/python dev/dp_vs_ddp.py                                  # the modelled tables (smolvla, expert and all)
    build/venv/bin/python dev/dp_vs_ddp.py -b 32 --step-ms expert=42 --step-ms all=120     # from one-GPU step times you have
    build/venv/bin/python dev/dp_vs_ddp.py --from-log build/gpu_check/logs/bench_train_vla_expert.log   # from a train_vla run
    build/venv/bin/python dev/dp_vs_ddp.py --measure -b 8                   # torch DP vs torch DDP (and ./train_vla) on the GPUs

The model (every number a bandwidth or a latency is an assumption, printed with the tables):
- Sizes from dev/model.py's parameter table (the weights) and dev/scaling_model.py's buckets (the
  elements that train, in the order the backward pass finishes them). One GPU's step T1 (forward,
  backward, AdamW) is dev/scaling_model.py's: a measured one, or FLOPs at an assumed MFU.
- DP, as torch.nn.DataParallel does it: the module's parameters live on GPU 0 in their own dtype
  (fp32 under autocast: --dp-weights), the batch sits on GPU 0. Each step: scatter the batch
  (peer copies out of GPU 0), broadcast every weight, frozen ones included (replicate ->
  torch.cuda.comm.broadcast_coalesced: NCCL broadcasts of 10 MiB buffers), forward on the N
  replicas, gather the outputs to GPU 0 (their gradients go back in the backward pass), reduce the
  gradients onto GPU 0 once the whole backward has finished (the backward of that one broadcast:
  NCCL reduces of 10 MiB buffers; autograd hands that backward zeros for the frozen tensors'
  outputs and it reduces them too: every weight's gradient, in the weights' dtype, --dp-grads),
  AdamW on GPU 0. NCCL pipelines a broadcast and a reduce along a
  ring, so GPU 0's link carries the weights and the gradients once each, at the bus bandwidth; but
  nothing overlaps: every transfer is added to the step. Python's GIL over the replicas' threads is
  NOT modelled (it only makes DP slower; --measure shows it).
- DDP, as train_vla does it: scaling_model.model_step (buckets all-reduced in a ring under the
  backward pass, only the exposed part added). Each GPU sends and receives 2 (N-1)/N of the
  trainable gradients (fp32) and nothing else: no weights, no batch, no outputs.
- The optimizer takes T1's share on GPU 0 in DP and on every GPU at once in DDP: the same wall time.
"""
import argparse
import contextlib
import gc
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types

DEV = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, DEV)
import scaling_model as sm  # noqa: E402  (the buckets, T1's FLOPs, the ring's cost, the DDP step)

vla = sm.vla  # dev/model.py: the presets, the parameter table, the train modes

# effective bandwidth per GPU, GB/s (the ring's bus bandwidth, and what one GPU's link carries in a
# peer copy): NVLink 4 is 450 GB/s each way per H100 SXM, ~80% reached (scaling_model's default);
# PCIe 5 and 4 x16 are 64 and 32 GB/s each way, ~75% reached, between GPUs without NVLink
LINKS = {"nvlink4": (360.0, "NVLink 4 (H100 SXM), 360 GB/s"),
         "pcie5": (48.0, "PCIe 5 x16, no NVLink, 48 GB/s"),
         "pcie4": (24.0, "PCIe 4 x16, no NVLink, 24 GB/s")}
COMM_BUFFER = 10 * 2**20  # torch.cuda.comm's buffer_size: DP's broadcasts and reduces go in pieces this big
OPT_BYTES_PER_PARAM = 30  # AdamW's memory traffic per trainable element (scaling_model.main's figure)


# ----------------------------------------------------------------------------
# sizes


def model_sizes(cfg, mode, frame_px):
    """What one step handles: weights, trainable elements and their buckets, and per sample the
    inputs (u8 camera frames of frame_px, int32 tokens and a u8 mask, fp32 state, actions, noise
    and t, a u8 padding flag per action) and the output (the velocity, fp32)."""
    buckets = sm.buckets_of(cfg, mode)
    H, A = cfg.chunk, cfg.max_action_dim
    sample = (cfg.n_cam * frame_px * frame_px * 3 + cfg.max_text * (4 + 1) + 4 * cfg.max_state_dim
              + H * A * 4 * 2 + H + 4)
    return types.SimpleNamespace(n_params=vla.param_count(cfg), buckets=buckets,
                                 n_trainable=sum(n for _, n, _ in buckets),
                                 sample_bytes=sample, output_bytes=H * A * 4)


def dp_grad_bytes(sz, a):
    """The gradients DataParallel reduces onto GPU 0: torch's reduces one per parameter tensor in
    the parameters' dtype, zeros for the frozen ones (--dp-grads all); one that skipped frozen
    tensors would reduce the trainable elements in fp32 (--dp-grads trainable)."""
    return a.dp_weight_bytes * sz.n_params if a.dp_grads == "all" else 4 * sz.n_trainable


def dp_bytes(sz, n, batch, a):
    """(bytes over all links, bytes through GPU 0's link) of one DataParallel step on n GPUs."""
    if n == 1:
        return 0, 0
    weights, grads = a.dp_weight_bytes * sz.n_params, dp_grad_bytes(sz, a)
    io = (n - 1) * batch * (sz.sample_bytes + 2 * sz.output_bytes)  # scatter, gather, outputs' gradients back
    return (n - 1) * (weights + grads) + io, weights + grads + io


def ddp_bytes(sz, n):
    """(bytes each GPU sends, bytes over all links) of one DDP step: the ring all-reduce."""
    per_gpu = 2 * (n - 1) / n * 4 * sz.n_trainable
    return per_gpu, n * per_gpu


def pieces_seconds(nbytes, n, a):
    """A broadcast or reduce of nbytes in COMM_BUFFER pieces, each an NCCL call along a ring."""
    return math.ceil(nbytes / COMM_BUFFER) * a.latency + nbytes / a.bus_bw if n > 1 else 0.0


def dp_step(t1, sz, n, batch, a):
    """DataParallel's step on n GPUs: T1 plus every transfer, none overlapped (a dict of parts)."""
    if n == 1:  # torch's DataParallel on one device calls the module
        return dict(scatter=0.0, broadcast=0.0, gather=0.0, reduce=0.0, step=t1)
    parts = dict(scatter=(n - 1) * batch * sz.sample_bytes / a.bus_bw,
                 broadcast=pieces_seconds(a.dp_weight_bytes * sz.n_params, n, a),
                 gather=(n - 1) * batch * 2 * sz.output_bytes / a.bus_bw,
                 reduce=pieces_seconds(dp_grad_bytes(sz, a), n, a))
    parts["step"] = t1 + sum(parts.values())
    return parts


def one_gpu_step(cfg, mode, batch, a):
    """T1 in seconds and where it comes from."""
    name = vla.TRAIN_MODES[mode]
    if name in a.step_ms:
        return a.step_ms[name] / 1000.0, a.step_source[name]
    flops = batch * sm.train_flops_per_sample(cfg, mode)
    return flops / (a.mfu * a.peak_tflops * 1e12), f"assumed: {100 * a.mfu:.0f}% MFU of {a.peak_tflops:g} TFLOP/s"


# ----------------------------------------------------------------------------
# the modelled tables


def modelled(a):
    cfg = vla.PRESETS[a.preset]
    grads = f"every tensor's gradient in {a.dp_weights}" if a.dp_grads == "all" else "the trainable gradients in fp32"
    print(f"# MODELLED, not measured: preset {a.preset}, batch {a.batch} per GPU; DP broadcasts the weights in "
          f"{a.dp_weights} and reduces {grads}; {a.latency_us:g} us per NCCL call, camera frames "
          f"{a.frame_px} px u8; Python's GIL not modelled")
    for mode in a.modes:
        sz = model_sizes(cfg, mode, a.frame_px)
        t1, source = one_gpu_step(cfg, mode, a.batch, a)
        print(f"\n## --train {vla.TRAIN_MODES[mode]}: {sz.n_params / 1e6:.1f}M weights, {sz.n_trainable / 1e6:.1f}M "
              f"train ({4 * sz.n_trainable / 1e9:.2f} GB of fp32 gradients), {sz.sample_bytes / 1e3:.0f} kB of "
              f"inputs per sample; one-GPU step {1000 * t1:.1f} ms ({source})")
        for link in a.links:
            a.bus_bw = LINKS[link][0] * 1e9
            print(f"\n{LINKS[link][1]}\n")
            print("| GPUs | DP bytes/step, all links | DP bytes via GPU 0 | DDP bytes/GPU | DDP bytes, all links "
                  "| DP step | DP samples/s | DDP step | DDP samples/s | DDP / DP speed |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for n in a.gpus:
                dp_total, dp_gpu0 = dp_bytes(sz, n, a.batch, a)
                ddp_gpu, ddp_total = ddp_bytes(sz, n)
                dp = dp_step(t1, sz, n, a.batch, a)
                ddp, exposed, _ = sm.model_step(t1, sz.buckets, sz.n_trainable, n, a)
                print(f"| {n} | {dp_total / 1e9:.2f} GB | {dp_gpu0 / 1e9:.2f} GB | {ddp_gpu / 1e9:.2f} GB | "
                      f"{ddp_total / 1e9:.2f} GB | {1000 * dp['step']:.1f} ms | {n * a.batch / dp['step']:.0f} | "
                      f"{1000 * ddp:.1f} ms | {n * a.batch / ddp:.0f} | {dp['step'] / ddp:.2f}x |")
                if a.rows:  # machine-readable, for tests/bench/test_dp_vs_ddp.sh
                    print(f"row mode={vla.TRAIN_MODES[mode]} link={link} n={n} batch={a.batch} "
                          f"weights={sz.n_params} trainable={sz.n_trainable} dp_grads={dp_grad_bytes(sz, a)} "
                          f"t1_ms={1000 * t1:.6f} "
                          f"dp_total={dp_total:.0f} dp_gpu0={dp_gpu0:.0f} ddp_gpu={ddp_gpu:.0f} "
                          f"ddp_total={ddp_total:.0f} dp_ms={1000 * dp['step']:.6f} ddp_ms={1000 * ddp:.6f} "
                          f"ddp_exposed_ms={1000 * exposed:.6f} dp_broadcast_ms={1000 * dp['broadcast']:.6f} "
                          f"dp_reduce_ms={1000 * dp['reduce']:.6f}")


# ----------------------------------------------------------------------------
# measured: torch DataParallel, torch DDP, ./train_vla


def random_batch(cfg, batch, frame_px, seed):
    """A batch in build_batch's recorded format with random contents (values do not change timings)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    H, A = cfg.chunk, cfg.max_action_dim
    return dict(images=[rng.integers(0, 256, (batch, frame_px, frame_px, 3), dtype=np.uint8) for _ in range(cfg.n_cam)],
                tokens=rng.integers(0, cfg.vocab, (batch, cfg.max_text), dtype=np.int32),
                token_mask=np.ones((batch, cfg.max_text), np.float32),
                state=rng.standard_normal((batch, cfg.max_state_dim)).astype(np.float32),
                actions=rng.standard_normal((batch, H, A)).astype(np.float32),
                action_is_pad=np.zeros((batch, H), np.float32),
                eps=rng.standard_normal((batch, H, A)).astype(np.float32),
                t=rng.uniform(0.001, 0.999, batch).astype(np.float32))


def make_replica(cfg, mode, device, amp):
    """dev/model.py's SmolVLA (fp32 weights, torch's init) wrapped to return (v, u): the loss is
    taken where the outputs land (GPU 0 for DataParallel, as its users do)."""
    import torch
    import smolvla
    if amp:  # autocast's bf16 scores cannot hold float32's minimum (in every process, as model.py's --bench)
        smolvla.MASKED_SCORE = torch.finfo(torch.bfloat16).min
    model = vla.SmolVLA(cfg, mode, torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)

    class Replica(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vla = model

        def forward(self, x):
            # dev/smolvla.py makes masks and tables with no device argument: this replica's device
            dev = x["state"].device
            with torch.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
                P = vla.to_lerobot(self.vla.cfg, self.vla.tensors())
                return smolvla.forward(P, self.vla.lcfg, x["images"], x["lang_tokens"], x["lang_masks"], x["state"],
                                       x["actions"], x["noise"], x["t"])
    return Replica().to(device)


def make_optimizer(replica, device):
    import torch
    params = [p for p in replica.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                     **({"fused": True} if device.type == "cuda" else {}))


def timed_steps(step, n_warm, n_time, sync):
    for _ in range(n_warm):
        step()
    sync()
    times = []
    for _ in range(n_time):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]  # the median


def train_step_fn(net, lcfg, x, params, opt, device, amp):
    import torch
    import smolvla

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            v, u = net(x)
            loss = smolvla.flow_matching_loss(lcfg, v.float(), u.float(), x["action_is_pad"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
    return step


def measure_dp(cfg, mode, n, a):
    """Median seconds per step of torch.nn.DataParallel over GPUs 0..n-1 (or the CPU), n x batch on GPU 0."""
    import torch
    device = torch.device("cuda:0" if a.cuda else "cpu")
    replica = make_replica(cfg, mode, device, a.amp)
    x = replica.vla.prepare(random_batch(cfg, n * a.batch, a.frame_px, 0), device)
    net = torch.nn.DataParallel(replica, device_ids=list(range(n))) if a.cuda else replica
    params, opt = make_optimizer(replica, device)
    step = train_step_fn(net, replica.vla.lcfg, x, params, opt, device, a.amp)
    return timed_steps(step, a.warmup, a.steps, torch.cuda.synchronize if a.cuda else (lambda: None))


def ddp_worker(rank, n, cfg, mode, a, port, results):
    import torch
    import torch.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("nccl" if a.cuda else "gloo", rank=rank, world_size=n)
    if a.cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    replica = make_replica(cfg, mode, device, a.amp)
    x = replica.vla.prepare(random_batch(cfg, a.batch, a.frame_px, rank), device)
    net = torch.nn.parallel.DistributedDataParallel(replica, device_ids=[rank] if a.cuda else None)
    params, opt = make_optimizer(replica, device)
    step = train_step_fn(net, replica.vla.lcfg, x, params, opt, device, a.amp)

    def sync():
        if a.cuda:
            torch.cuda.synchronize()
        dist.barrier()
    seconds = timed_steps(step, a.warmup, a.steps, sync)
    if rank == 0:
        results.put(seconds)
    dist.destroy_process_group()


def measure_ddp(cfg, mode, n, a):
    """Median seconds per step of torch DDP, one process per GPU (NCCL), or per CPU rank (gloo)."""
    import torch.multiprocessing as mp
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(ddp_worker, args=(n, cfg, mode, a, port, results), nprocs=n, join=True)
    return results.get()


def measure_train_vla(mode, n, a):
    """train_vla's 'mean step time' (ms) at -g n, or None with why not."""
    if not (a.cuda and os.access("./train_vla", os.X_OK)):
        return None, "no ./train_vla binary (make train_vla)" if a.cuda else "no GPU"
    if not a.data or not os.path.exists(a.data):
        return None, f"no data {a.data!r} (--data; make build/bench/smolvla.bin)"
    out = tempfile.mkdtemp(prefix="dp_vs_ddp_")
    try:
        cmd = ["./train_vla", "-p", a.preset, "--train", vla.TRAIN_MODES[mode], "-g", str(n), "-b", str(a.batch),
               "-n", str(a.warmup + a.steps), "-u", "1", "-i", a.data, "-o", out, "-k", "0", "--keep", "1"]
        run = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    m = re.search(r"^mean step time ([0-9.]+) ms", run.stdout, re.M)
    if run.returncode != 0 or m is None:
        tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"{' '.join(cmd)} failed (exit {run.returncode}): {tail[0]}"
    return float(m.group(1)), None


def measured(a):
    import torch
    cfg = vla.PRESETS[a.preset]
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    a.cuda = not a.cpu
    if a.cuda and have < 2:
        print(f"--measure: needs at least 2 CUDA GPUs, this machine has {have}: only the MODELLED tables above")
        return
    if a.cuda and not hasattr(torch, "set_default_device"):
        sys.exit(f"error: --measure needs torch 2.0 or newer (torch.device as a context; this is {torch.__version__})")
    gpus = [n for n in a.gpus if n <= (have if a.cuda else 8)]
    if a.cuda and have < max(a.gpus):
        print(f"# --gpus past the {have} GPUs here are skipped")
    where = f"{have} x {torch.cuda.get_device_name(0)}" if a.cuda else "the CPU (gloo; timings mean nothing)"
    print(f"\n# MEASURED on {where}: preset {a.preset}, batch {a.batch} per GPU, "
          f"{'bf16 autocast' if a.amp else 'fp32'}, median of {a.steps} steps after {a.warmup}")
    for mode in a.modes:
        print(f"\n## --train {vla.TRAIN_MODES[mode]}\n")
        print("| GPUs | DP step | DP samples/s | DDP step | DDP samples/s | DP / DDP time | train_vla step "
              "| train_vla samples/s |")
        print("|---|---|---|---|---|---|---|---|")
        for n in gpus:
            dp = measure_dp(cfg, mode, n, a)
            if a.cuda:  # hand the DP run's cached memory back before the DDP processes and train_vla start
                gc.collect()
                torch.cuda.empty_cache()
            ddp = measure_ddp(cfg, mode, n, a)
            ms, why = measure_train_vla(mode, n, a)
            ours = f"{ms:.1f} ms | {n * a.batch / (ms / 1000):.0f}" if ms else "- | -"
            print(f"| {n} | {1000 * dp:.1f} ms | {n * a.batch / dp:.0f} | {1000 * ddp:.1f} ms | "
                  f"{n * a.batch / ddp:.0f} | {dp / ddp:.2f}x | {ours} |", flush=True)
            if why and n == gpus[0]:
                print(f"# train_vla not run: {why}")


# ----------------------------------------------------------------------------
# command line


def read_log(path, a):
    """A train_vla log's one-GPU step time for its --train mode (its config table), checked against -b."""
    try:
        with open(path) as f:
            log = f.read()
    except OSError as e:
        sys.exit(f"error: cannot read {path}: {e.strerror}")
    mode = re.search(r"^\| train mode \(--train\)\s+\| (\S+)", log, re.M)
    step = re.search(r"^mean step time ([0-9.]+) ms", log, re.M)
    gpus = re.search(r"^\| GPUs x batch x accum\s+\| (\d+) x (\d+) x", log, re.M)
    if mode is None or step is None or gpus is None:
        sys.exit(f"error: {path} lacks the config table or the 'mean step time' line: give a finished train_vla log")
    if int(gpus.group(1)) != 1:
        sys.exit(f"error: {path} ran on {gpus.group(1)} GPUs: give a one-GPU run")
    if a.batch_given and int(gpus.group(2)) != a.batch:
        sys.exit(f"error: -b {a.batch} but {path} ran with batch {gpus.group(2)}: drop -b or give that log")
    a.batch = int(gpus.group(2))
    a.step_ms[mode.group(1)] = float(step.group(1))
    a.step_source[mode.group(1)] = f"measured: {path}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--preset", default="smolvla", choices=sorted(vla.PRESETS), help="model size (smolvla)")
    ap.add_argument("--train", default="expert,all", help="train modes, comma-separated (expert,all)")
    ap.add_argument("-b", "--batch", type=int, default=None, help="samples per GPU per step (32)")
    ap.add_argument("--gpus", default="1,2,4,8", help="GPU counts (1,2,4,8)")
    ap.add_argument("--links", default="nvlink4,pcie5,pcie4", help=f"machines modelled, of {','.join(LINKS)}")
    ap.add_argument("--dp-weights", choices=["fp32", "bf16"], default="fp32",
                    help="dtype DP broadcasts the weights in: fp32 (torch's parameters under autocast) or bf16")
    ap.add_argument("--dp-grads", choices=["all", "trainable"], default="all",
                    help="what DP reduces: all (torch's DataParallel: every tensor's gradient, zeros for the frozen, "
                    "in the weights' dtype) or trainable (only what trains, fp32)")
    ap.add_argument("--step-ms", action="append", default=[], metavar="MODE=MS",
                    help="one GPU's measured step time at this batch (repeatable, per mode)")
    ap.add_argument("--from-log", action="append", default=[], metavar="LOG", help="a one-GPU train_vla log: its mode's step time")
    ap.add_argument("--mfu", type=float, default=0.40, help="without a measurement: the MFU assumed for one GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="bf16 dense peak (H100 SXM)")
    ap.add_argument("--latency-us", type=float, default=20.0, help="fixed cost of one NCCL call, microseconds")
    ap.add_argument("--hbm-tbps", type=float, default=3.35, help="HBM bandwidth, TB/s (H100 SXM)")
    ap.add_argument("--frame-px", type=int, default=224, help="camera frames' side in pixels (224)")
    ap.add_argument("--rows", action="store_true", help="also print each row as key=value (the test reads them)")
    ap.add_argument("--measure", action="store_true", help="also time torch DP, torch DDP and ./train_vla on the GPUs")
    ap.add_argument("--cpu", action="store_true", help="--measure on the CPU (gloo): checks the code path, not timings")
    ap.add_argument("--steps", type=int, default=10, help="--measure: timed steps (10)")
    ap.add_argument("--warmup", type=int, default=3, help="--measure: untimed steps first (3)")
    ap.add_argument("--amp", choices=["bf16", "none"], default="bf16", help="--measure: autocast (bf16)")
    ap.add_argument("--data", default="build/bench/smolvla.bin", help="--measure: train_vla's data")
    a = ap.parse_args(argv)
    a.batch_given = a.batch is not None
    a.batch = a.batch or 32
    try:
        a.modes = [vla.TRAIN_MODES.index(m) for m in a.train.split(",")]
        a.gpus = [int(n) for n in a.gpus.split(",")]
    except ValueError:
        sys.exit(f"error: --train takes {','.join(vla.TRAIN_MODES)} and --gpus whole numbers, comma-separated")
    a.links = a.links.split(",")
    if any(link not in LINKS for link in a.links):
        sys.exit(f"error: --links takes {','.join(LINKS)}")
    if a.batch < 1 or min(a.gpus) < 1 or a.steps < 1 or a.warmup < 0 or a.frame_px < 1:
        sys.exit("error: -b, --gpus, --steps and --frame-px must be positive, --warmup not negative")
    if a.cpu and not a.measure:
        sys.exit("error: --cpu goes with --measure")
    given, a.step_ms, a.step_source = a.step_ms, {}, {}
    for item in given:
        mode, _, ms = item.partition("=")
        try:
            a.step_ms[mode] = float(ms)
        except ValueError:
            sys.exit(f"error: --step-ms {item}: give MODE=MS, e.g. expert=42.1")
        if mode not in vla.TRAIN_MODES or a.step_ms[mode] <= 0:
            sys.exit(f"error: --step-ms {item}: MODE is one of {','.join(vla.TRAIN_MODES)}, MS positive")
        a.step_source[mode] = "given with --step-ms"
    for path in a.from_log:
        read_log(path, a)
    a.dp_weight_bytes = 4 if a.dp_weights == "fp32" else 2
    a.latency = a.latency_us * 1e-6
    a.hbm_bw = a.hbm_tbps * 1e12
    a.opt_bytes_per_param = OPT_BYTES_PER_PARAM
    a.bus_bw = LINKS[a.links[0]][0] * 1e9
    a.amp = a.amp == "bf16"
    return a


def main(argv=None):
    a = parse_args(argv)
    modelled(a)
    if a.measure:
        measured(a)


if __name__ == "__main__":
    main()
