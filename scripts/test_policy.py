"""
test_policy.py: the policy interface (libvla.so through scripts/vla_policy.py) against the PyTorch
oracle's inference on the same checkpoint and observations; then the GPU library (libvla_gpu.so)
the same way, for each build named in $VLA_GPU_LIBRARY (colon-separated; make test names the GPU
build on a GPU machine, else the CPU emulation's bf16 and fp32 builds). Run by `make test` with
Debian's python3 (torch). Exits non-zero on any failure; the last line is `N passed, M failed`.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "data"))
sys.path.insert(0, os.path.join(ROOT, "dev"))
import model as oracle  # noqa: E402
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402
from vla_policy import CONFIG_FIELDS, VLAPolicy  # noqa: E402

check = Checks()


def oracle_actions(ckpt, images, instructions, state, noise):
    """The oracle's 10-step sampling in float64 from the same checkpoint and noise."""
    cfg, stats = ckpt["config"], ckpt["stats"]
    S, A = cfg.state_dim, cfg.action_dim
    model = oracle.VLA(cfg, torch.float64)
    model.load(ckpt["params"])
    tokens = np.zeros((len(instructions), cfg.max_text), np.int32)  # byte tokens, as the library makes them
    mask = np.zeros((len(instructions), cfg.max_text), np.float32)
    for b, s in enumerate(instructions):
        ids = vla_shard.BYTES.encode(s)[:cfg.max_text]
        tokens[b, :len(ids)] = ids
        mask[b, :len(ids)] = 1.0
    norm_state = (state - stats[:S]) / stats[S:2 * S]  # float32, as the C code normalizes
    batch = {"images": torch.from_numpy(images), "tokens": torch.from_numpy(tokens),
             "text_mask": torch.tensor(mask, dtype=torch.float64),
             "state": torch.tensor(norm_state, dtype=torch.float64), "eps": torch.tensor(noise, dtype=torch.float64)}
    out = model.sample_actions(batch, stats[2 * S:2 * S + A], stats[2 * S + A:])
    return out.numpy()


def main():
    shard_path = os.path.join(ROOT, "build", "test", "b.bin")  # 2 cameras, state 3, action 2
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([os.path.join(ROOT, "train_vla_cpu"), "-p", "tiny", "-i", shard_path, "-n", "4", "-b", "4",
                            "-u", "1", "-l", "1e-2", "-t", "1", "-o", tmp], capture_output=True, text=True)
        ckpt_path = os.path.join(tmp, "ckpt_00000004.bin")
        check(r.returncode == 0 and os.path.exists(ckpt_path), "train_vla_cpu writes a checkpoint to serve")
        if r.returncode != 0:
            return
        policy = VLAPolicy(ckpt_path, threads=1)
        c = policy.config
        check((c["n_cam"], c["state_dim"], c["action_dim"], c["chunk"]) == (2, 3, 2, 8),
              f"the policy reports the checkpoint's config ({c['n_cam']} cameras, S {c['state_dim']}, "
              f"A {c['action_dim']}, H {c['chunk']})")
        shard = vla_shard.Shard(shard_path)
        frames = [0, 7, 15]
        images = np.ascontiguousarray(shard.images[frames])
        state = np.ascontiguousarray(shard.state[frames])
        instructions = ["go to blue", "move to the red square",
                        "touch the yellow square with the gripper, then stop"]  # shorter and longer than max_text
        noise = np.random.default_rng(0).normal(size=(3, c["chunk"], c["action_dim"])).astype(np.float32)
        ours = policy.act(images, instructions, state, noise=noise)
        ref = oracle_actions(oracle.read_checkpoint(ckpt_path), images, instructions, state, noise)
        err = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
        # fp32 against the float64 oracle: 10 Euler steps through the whole model, as test_vla
        check(err < 1e-5, f"actions of 3 observations match the oracle's sampling: rel err {err:.2e} (tol 1e-5)")
        a1, a2 = policy.act(images, instructions, state, seed=5), policy.act(images, instructions, state, seed=5)
        a3 = policy.act(images, instructions, state, seed=6)
        check(np.array_equal(a1, a2) and not np.array_equal(a1, a3), "seeded noise: same seed same actions, another differs")
        single = policy.act(images[1:2], instructions[1:2], state[1:2], noise=noise[1:2])
        check(np.allclose(single[0], ours[1], rtol=1e-5, atol=1e-6), "a batch of one gives that observation's actions")
        try:
            policy.act(images[:, :1], instructions, state)
            check(False, "images with the wrong camera count are refused")
        except ValueError as e:
            check("this checkpoint reads" in str(e), f"images with the wrong camera count are refused: {e}")
        try:
            VLAPolicy(os.path.join(tmp, "missing.bin"))
            check(False, "a missing checkpoint is refused")
        except ValueError as e:
            check("cannot open checkpoint" in str(e), f"a missing checkpoint is refused: {e}")
        # corrupt checkpoints: refused with the reader's message, and this process goes on (sizes
        # from the header are bounded and checked before any buffer is sized from them)
        raw = open(ckpt_path, "rb").read()
        config_at = 8  # after magic and version; VLAConfig's 15 int32 in CONFIG_FIELDS order
        corrupt = [("n_layer", 2**31 - 1, "n_layer 2147483647 is past its bound"),
                   ("d_model", 2**22, "d_model 4194304 is past its bound"),
                   ("chunk", 5000, "chunk 5000 is past its bound"),
                   ("max_text", 100000, "max_text 100000 is past its bound")]
        for field, value, needle in corrupt:
            at = config_at + 4 * CONFIG_FIELDS.index(field)
            path = os.path.join(tmp, f"corrupt_{field}.bin")
            open(path, "wb").write(raw[:at] + np.int32(value).tobytes() + raw[at + 4:])
            try:
                VLAPolicy(path)
                check(False, f"a checkpoint with {field} {value} is refused")
            except ValueError as e:
                check(needle in str(e), f"a checkpoint with {field} {value} is refused: {e}")
        path = os.path.join(tmp, "corrupt_stats.bin")
        open(path, "wb").write(raw[:256] + np.float32(np.nan).tobytes() + raw[260:])
        try:
            VLAPolicy(path)
            check(False, "a checkpoint with NaN statistics is refused")
        except ValueError as e:
            check("normalization statistic 0 is nan" in str(e), f"a checkpoint with NaN statistics is refused: {e}")
        policy.close()

        # the GPU library: same checkpoint, observations and noise. Tolerance: fp32 builds 1e-4 (the
        # GPU's fp32 against the float64 oracle, as test_vla_gpu); bf16 builds 2.5e-2, test_vla_gpu's
        # for sampling (8 significant bits per stored value over ~40 rounded stages per velocity)
        libraries = [p for p in os.environ.get("VLA_GPU_LIBRARY", "").split(":") if p]
        if not libraries:
            print("(VLA_GPU_LIBRARY not set: the GPU library is not checked here)")
        for library in libraries:
            gpu = VLAPolicy(ckpt_path, library=library, device="cuda")
            tol = 2.5e-2 if "bf16" in gpu.device else 1e-4
            got = gpu.act(images, instructions, state, noise=noise)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            check(err < tol, f"{os.path.basename(library)} on {gpu.device}: actions match the oracle's sampling: "
                  f"rel err {err:.2e} (tol {tol:.1e})")
            g1, g2 = gpu.act(images, instructions, state, seed=5), gpu.act(images, instructions, state, seed=5)
            check(np.array_equal(g1, g2) and np.linalg.norm(g1 - a1) / np.linalg.norm(a1) < tol,
                  f"{os.path.basename(library)}: seeded noise gives the same actions twice, and the CPU policy's")
            gpu.close()


if __name__ == "__main__":
    main()
    check.finish()
