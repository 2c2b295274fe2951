"""
test_policy.py: the policy interface, SmolVLA (--family smolvla, the default) or pi0 (--family pi0).

SmolVLA: the policy interface (libvla.so through scripts/vla_policy.py) against the PyTorch
oracle's sampling (dev/model.py) on the same checkpoint, observations and noise, and against the
trainer's own end-of-run evaluation; then the GPU library (libvla_gpu.so) the same way, for each
build named in $VLA_GPU_LIBRARY (colon-separated; make test names the GPU build on a GPU machine,
else the CPU emulation's bf16 and fp32 builds), against the oracle and the CPU library. The
checkpoint is ./train_vla_cpu's, 4 steps of the tiny preset on build/test/s.bin (two cameras of
different sizes, 24x32 and 20x20; state 3, action 2). Instructions as token ids
(vla_policy_act_tokens, VLAPolicy.act_tokens) are checked against the oracle on every build, with
the refusals: bad ids and counts, strings for a checkpoint trained on a tokenizer.json's ids (the
same weights renamed), and in VLAPolicy a missing or differently named tokenizer.json. Frames as
LeRobot passes them (float32 uint8 / 255), and as float64, float16 and int64, give the uint8
frames' actions bit for bit; float frames out of [0, 1], NaN or off the 1/255 grid, integers
outside 0..255 and bool are refused with one line naming the camera. The host process survives
the libraries: out of memory in a child process under RLIMIT_AS is a one-line MemoryError after
which a small batch acts as before (libvla.so, and the first GPU build); a NULL policy is a
return code and a line; every method after close() raises; malformed instructions, states, noise,
frames, token ids and seeds are one-line exceptions raised by vla_policy.py itself. Threads: four
threads on one policy get the serial actions bit for bit, two policies act at once as alone (two
host threads in turn on a GPU build), and threads= leaves the calling thread's OpenMP setting. Run by
`make test` with the project's build/venv (torch; the tokenizers package is not needed: names are compared
before a tokenizer.json is parsed, and tests/lerobot/test_lerobot_io.py serves a real one).

    build/venv/bin/python tests/policy/test_policy.py    # needs libvla.so, train_vla_cpu, build/test/s.bin

pi0: pi0's instruction tokens and pi0 served from raw observations, against LeRobot 0.6.1's own pi0
pre-processor and PI0Policy. Run under build/lerobot-venv (LeRobot, torch, tokenizers,
transformers), in one process:

    build/lerobot-venv/bin/python tests/policy/test_policy.py --family pi0   # needs libvla.so, train_vla_cpu

The GPU library: every build named in $VLA_GPU_LIBRARY (colon-separated, as the SmolVLA checks
take it; make test names the GPU build on a GPU machine), else the CPU emulation's fp32 build
(build/emu/libvla_gpu_fp32.so: make build/emu/libvla_gpu_fp32.so) where it has been built.

Fixtures, all made here and offline:
  - a tokenizer of PaliGemma's kind, trained on robot instructions with the tokenizers library: BPE
    with byte fallback (<0x00>..<0xFF> right after the specials), spaces replaced by U+2581, Gemma's
    special ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4), a post-processor that puts <bos>
    first; tokenizer_config.json names GemmaTokenizer, as PaliGemma's does. It sits in a private
    hub cache (HF_HUB_CACHE, HF_HUB_OFFLINE=1) as a snapshot of google/paligemma-3b-pt-224, so
    LeRobot's pi0 pre-processor loads it by that hub name, down the road the real one takes
    (transformers 5 rebuilds a GemmaTokenizer from tokenizer.json). Its ids are not PaliGemma's.
  - LeRobot's PI0Policy at pi0_tiny's sizes (dev/lerobot/make_ref.py's tiny_pi0_sizes), its
    text table the tokenizer's 512 rows, tokenizer_max_length 48 (pi0's), random seeded weights,
    norms jittered; two cameras of different non-square sizes (36x60 and 96x80, resized to 32 with
    centred padding, an odd pad on each), state 6, action 5 (padded to 32). Its weights go into a
    train_vla checkpoint through dev/model.py's from_lerobot and write_checkpoint, which names the
    tokenizer.json and holds the statistics LeRobot's processors normalize with.
Checks:
  - tokens: LeRobot's pre-processor on a batch of tasks (short, longer than 48 tokens, unicode that
    falls back to bytes, one already ending in "\\n", one letter) gives tokens and attention masks of
    48 columns whatever the batch's longest, equal in all 48 columns to the batch that a shard
    written with vla_shard.TokenizerJSON gives (dev/model.py's build_batch, which test_vla holds to
    vla/dataset.h's dataset_assemble) and to VLAPolicy's tokenization; the trainer
    (./train_vla_cpu --init) trains a step on that shard from the checkpoint, whose tokenizer it names
  - actions: LeRobot (pre-processor, predict_action_chunk from a fixed noise, post-processor) and
    VLAPolicy on the same raw observation (uint8 frames of the dataset's sizes, raw state, task
    strings) and noise: libvla.so and the GPU library within the tolerances below; with one camera
    missing (each in turn: LeRobot feeds an image of -1 masked out), the same; every camera missing
    refused in one line; the full observation again gives its first actions bit for bit
Exits non-zero on any failure; the last line is `N passed, M failed`.
"""

import argparse
import atexit
import contextlib
import ctypes
import ctypes.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")  # vla_policy.py, the library's Python side
for sub in ("scripts", "data", "dev", "dev/lerobot", "tests/lerobot"):
    sys.path.insert(0, os.path.join(ROOT, sub))
import make_ref  # noqa: E402  dev/lerobot: LeRobot's pi0 at test sizes, cam_key, images_as_fed
import model as oracle  # noqa: E402
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402
from vla_policy import CONFIG_FIELDS, MAX_IMG, VLAPolicy  # noqa: E402

check = Checks()
SHARD = os.path.join(ROOT, "build", "test", "s.bin")
STEPS, BATCH, SEED = 4, 4, 1337

# pi0 (--family pi0)
PI0_SEED = 4242
PI0_HUB_NAME = "google/paligemma-3b-pt-224"  # what processor_pi0.py asks AutoTokenizer for
PI0_MAX_TEXT = 48  # PI0Config.tokenizer_max_length
PI0_MODEL_VOCAB = 512  # the test model's text table: room for the tokenizer's ids (as 257152 is for PaliGemma's)
PI0_CAMERAS = make_ref.PI0_CAMERAS  # (h, w) as a dataset stores them: 36x60 and 96x80
PI0_STATE_DIM, PI0_ACTION_DIM = make_ref.STATE_DIM, make_ref.ACTION_DIM
PI0_CHUNK, PI0_MAX_ACTION = make_ref.PI0_POLICY["chunk_size"], make_ref.PI0_POLICY["max_action_dim"]
PI0_GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0-4, as in Gemma's vocabulary
PI0_PAD_ID, PI0_BOS_ID = 0, 2
PI0_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback's pieces
# what the tokenizer learns from: robot instructions (ü is in its alphabet; ✓ and 日本 are not,
# so they fall back to bytes)
PI0_CORPUS = ["pick up the red cube and place it in the bin", "open the top drawer", "close the top drawer",
              "put the spoon inside the drawer", "stack 3 blocks on the table", "push the button", "über the cup",
          "turn the faucet left", "slide the plate to the right", "put 12 cups away", "press the red button twice",
          "move the arm to the left of the blue bowl", "grasp the handle and pull the door open"]
# LeRobot's tokenizer call: short, longer than 48 tokens (cut), unicode partly outside the
# vocabulary, already ending in "\n" (LeRobot adds none then), a single letter
PI0_TOKEN_TASKS = ["pick up the red cube", " ".join(["open the top drawer and close it"] * 8),
                   "stack 3 blocks! ✓ über 日本", "put 12 cups away\n", "x"]
# the observations the policies act on: one cut by the 48 tokens, one with byte fallback
PI0_ACT_TASKS = ["pick up the red cube", "count " + " ".join(str(k) for k in range(40)), "press ✓ the button",
                 "open the top drawer\n"]
PI0_BATCH = len(PI0_ACT_TASKS)
# libvla.so (fp32) against LeRobot (fp32): the same 10 Euler steps through the whole model, each
# sum in another order; LeRobot's normalizer divides by std + 1e-8 (equal to std in fp32 for the
# stds here, all above 0.3). test_vla meets LeRobot's pi0 chunk within 1e-7 relative; 1e-5, as
# test_vla's chunk check and tests/lerobot/test_lerobot_io.py's, leaves room for other weights and sizes
PI0_ACTION_TOL = 1e-5
# the GPU library: test_vla_gpu's tolerance for LeRobot's pi0 chunk in each precision (SMOL_TOL_FWD):
# fp32 1e-4 (fp32 sums in other orders and blockings); fp16 6.25e-3 and bf16 5e-2, from their 11 and
# 8 significant bits per stored activation over the ~40 rounded stages of each velocity
PI0_GPU_TOL = {"fp32": 1e-4, "fp16": 6.25e-3, "bf16": 5e-2}


def resize_nearest(im, h, w):
    """Frames (B, H, W, 3) at another size (nearest pixel): the same scene at a size never trained on."""
    rows = np.arange(h) * im.shape[1] // h
    cols = np.arange(w) * im.shape[2] // w
    return np.ascontiguousarray(im[:, rows][:, :, cols])


def oracle_actions(ck, images, instructions, state, noise):
    """The oracle's 10-step sampling in float64 from the same checkpoint and noise (B, H, Amax):
    (B, H, action_dim) in data units. instructions: strings (their bytes are the ids, as the
    library reads strings) or token id sequences; cut to max_text, right-padded with pad_token."""
    cfg, stats = ck["config"], ck["stats"]
    S, A, B = cfg.state_dim, cfg.action_dim, len(instructions)
    model = oracle.SmolVLA(cfg, ck["train_mode"], torch.float64)
    model.load(ck["params"])
    tokens = np.full((B, cfg.max_text), cfg.pad_token, np.int32)
    mask = np.zeros((B, cfg.max_text), np.float32)
    for b, s in enumerate(instructions):
        ids = (vla_shard.BYTES.encode(s) if isinstance(s, str) else np.asarray(s, np.int32))[:cfg.max_text]
        tokens[b, :len(ids)] = ids
        mask[b, :len(ids)] = 1.0
    norm_state = np.zeros((B, cfg.max_state_dim), np.float32)
    norm_state[:, :S] = (state - stats[:S]) / stats[S:2 * S]  # float32, as the C code normalizes
    arrays = dict(images=images, tokens=tokens, token_mask=mask, state=norm_state,
                  actions=np.zeros((B, cfg.chunk, cfg.max_action_dim), np.float32),
                  action_is_pad=np.zeros((B, cfg.chunk), np.float32), eps=noise, t=np.ones(B, np.float32))
    x = model.prepare(arrays)
    out = model.sample(x, torch.tensor(noise, dtype=torch.float64))[:, :, :A].numpy()
    return out * stats[2 * S + A:] + stats[2 * S:2 * S + A]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def expect_error(what, fn, needle):
    try:
        fn()
        check(False, f"{what}: accepted")
    except ValueError as e:
        check(needle in str(e) and "\n" not in str(e), f"{what}: {e}")


def one_line_refusal(what, fn, kind, *needles):
    """fn() must raise `kind` from scripts/vla_policy.py itself (not from inside numpy or ctypes,
    no chained exception shown), its message one line holding every needle."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the kind is what is checked)
        msg = str(e)
        where = os.path.basename(traceback.extract_tb(e.__traceback__)[-1].filename)
        shown = e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)
        ok = isinstance(e, kind) and "\n" not in msg and all(n in msg for n in needles) and \
            where == "vla_policy.py" and shown
        check(ok, f"{what}: {type(e).__name__} from {where}: {msg}")
        return
    check(False, f"{what}: accepted")


def malformed_input_checks(policy, images, instructions, state):
    """Input the library cannot take, refused in one line before it is called: instructions that
    are not strings or not a sequence, states and noise that are not numbers, frames that are not
    arrays, token ids that are not ints, a seed that is not an int."""
    B = len(instructions)
    bad_instructions = [("an instruction as bytes", [b"go to blue"] + instructions[1:], TypeError,
                         "instruction 0 is bytes: pass str (decode it first"),
                        ("an instruction as an int", instructions[:1] + [7] + instructions[2:], TypeError,
                         "instruction 1 is int: pass str"),
                        ("an instruction that is None", instructions[:2] + [None], TypeError,
                         "instruction 2 is NoneType: pass str"),
                        ("instructions as an int", 3, TypeError, "instructions: int is not a sequence: pass a list"),
                        ("instructions as None", None, TypeError, "instructions: NoneType is not a sequence"),
                        ("instructions as bytes", b"go", ValueError, "instructions: pass a list of B strings"),
                        ("an instruction with a lone surrogate", ["go \udcff"] + instructions[1:], ValueError,
                         "instruction 0 holds '\\udcff' at offset 3, which UTF-8 cannot write")]
    for what, given, kind, needle in bad_instructions:
        one_line_refusal(what, lambda: policy.act(images, given, state), kind, needle)
    rows = state.tolist()
    bad_states = [("a state of dtype object holding strings", np.array([["a", "b", "c"]] * B, dtype=object),
                   "state: holds str where numbers go"),
                  ("a state of strings", state.astype(str), "state: an array of dtype <U"),
                  ("a state of ragged rows", [rows[0], rows[1][:2], rows[2]], "state: rows of different lengths"),
                  ("a state holding None", [rows[0], [1.0, None, 2.0], rows[2]], "state: holds None where numbers go"),
                  ("a complex state", state.astype(np.complex64), "state: an array of dtype complex64")]
    for what, given, needle in bad_states:
        one_line_refusal(what, lambda: policy.act(images, instructions, given), ValueError, needle,
                         f"pass float32 (B, state_dim) = ({B}, 3) raw state")
    one_line_refusal("noise of strings", lambda: policy.act(images, instructions, state, noise=np.full((B, 2, 2), "x")),
                     ValueError, "noise: an array of dtype <U1")
    one_line_refusal("images as None", lambda: policy.act(None, instructions, state), TypeError,
                     "images: NoneType is not a sequence")
    one_line_refusal("one camera's (B, h, w, 3) array for two cameras",
                     lambda: policy.act(images[0], instructions, state), ValueError,
                     f"images: one array of shape {images[0].shape}: pass a list")
    one_line_refusal("a camera's frames as a ragged list", lambda: policy.act(
        [list(images[0][:2]) + [images[0][2, :5]], images[1]], instructions, state), ValueError,
        "camera 0: frames of different shapes")
    one_line_refusal("token ids as strings", lambda: policy.act_tokens(images, ["go", "to", "blue"], state), TypeError,
                     "instruction 0: token ids given as str")
    one_line_refusal("token ids as floats", lambda: policy.act_tokens(images, [[1.5], [2], [3]], state), TypeError,
                     "instruction 0: token ids of dtype float64: pass a sequence of ints")
    one_line_refusal("a seed that is None", lambda: policy.act(images, instructions, state, seed=None), TypeError,
                     "seed: NoneType is not an int: pass an int")


# The child process of library_oom_check: under an address space limit just above what it holds
# after serving a small batch, a batch of 20,000 observations cannot get its activations. The
# library must raise MemoryError (one line) and the same small batch must still act, bit for bit.
OOM_CHILD = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from vla_policy import VLAPolicy
ckpt, library, big = sys.argv[2], sys.argv[3] or None, int(sys.argv[4])
policy = VLAPolicy(ckpt, threads=1, library=library, device="cuda" if library else "cpu")
c, rng = policy.config, np.random.default_rng(1)
def observations(B):
    images = [rng.integers(0, 256, (B, 24, 32, 3), np.uint8), rng.integers(0, 256, (B, 20, 20, 3), np.uint8)]
    return images, ["go to blue"] * B, rng.normal(size=(B, c["state_dim"])).astype(np.float32)
small = observations(2)
first = policy.act(*small, seed=3)
large = observations(big)
held = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
limit = held + (256 << 20) if hard == resource.RLIM_INFINITY else min(held + (256 << 20), hard)
resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
result = {"raised": None, "message": ""}
try:
    policy.act(*large, seed=3)
except Exception as e:
    result = {"raised": type(e).__name__, "message": str(e)}
result["again"] = bool(np.array_equal(policy.act(*small, seed=3), first))
policy.close()
print(json.dumps(result))
"""


def library_oom_check(name, ckpt_path, library=None):
    """Out of memory inside the library (host memory for libvla.so; under the CUDA emulation the
    device memory it maps, which the limit bounds as it bounds the host's; not on a GPU, whose
    memory no limit of the process bounds) in a child process: MemoryError in one line, the
    policy usable after it, the process alive to exit 0."""
    big = 20000
    r = subprocess.run([sys.executable, "-c", OOM_CHILD, SCRIPTS, ckpt_path, library or "", str(big)],
                       capture_output=True, text=True, timeout=300)
    lines = r.stdout.strip().splitlines()
    try:
        got = json.loads(lines[-1])
    except (IndexError, ValueError):
        check(False, f"{name}: a batch of {big} under an address space limit: the child printed no result (exit "
              f"{r.returncode}): {(r.stdout + r.stderr)[-600:]}")
        return
    msg = got["message"]
    check(r.returncode == 0 and got["raised"] == "MemoryError" and "\n" not in msg and msg.startswith("out of")
          and "pass fewer observations per call" in msg and got["again"],
          f"{name}: a batch of {big} under an address space limit raises MemoryError in one line ({msg}); a batch of "
          f"2 then acts as before it (got {got['again']}); the process exits {r.returncode}")


def library_failure_check(policy):
    """A failure inside the library is a return code and a line, never the end of the process: a
    NULL policy handed to the C functions returns POLICY_FAILED (5) with vla_policy_last_error's line."""
    lib, name = policy.lib, os.path.basename(policy.lib._name)
    out = np.zeros(64, np.float32)
    rc = lib.vla_policy_act_tokens(None, 1, None, None, None, None, None, None, 0, out.ctypes.data)
    line = lib.vla_policy_last_error().decode()
    check(rc == 5 and lib.vla_policy_last_status() == 5 and line == "a NULL policy: load one with vla_policy_load",
          f"{name}: vla_policy_act_tokens on a NULL policy returns 5 (got {rc}) with the line: {line}")


def thread_checks(name, policy, make_other, images, instructions, state, n_threads, per_thread, sizes=(1, 2, 3)):
    """n_threads threads calling act on one policy get exactly the actions of the same calls made
    one after another (the calls are serialized), across batch `sizes` (several: the activations
    are laid out again between calls); and two policies acting at once in two threads
    (make_other() makes the second; None: not checked) get what each gets alone."""
    def job(t, i):  # batch size and seed of thread t's call i
        B = sizes[(t + i) % len(sizes)]
        return [im[:B] for im in images], instructions[:B], state[:B], 100 * t + i

    def act(p, t, i):
        ims, texts, st, seed = job(t, i)
        return p.act(ims, texts, st, seed=seed)

    def run_threads(policies, n_threads):
        results = [[None] * per_thread for _ in range(n_threads)]
        start = threading.Barrier(n_threads)

        def worker(t):
            start.wait()
            for i in range(per_thread):
                try:
                    results[t][i] = act(policies[t % len(policies)], t, i)
                except Exception as e:  # noqa: BLE001  (reported as a mismatch)
                    results[t][i] = e
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return results

    serial = [[act(policy, t, i) for i in range(per_thread)] for t in range(n_threads)]
    results = run_threads([policy], n_threads)
    same = sum(isinstance(r, np.ndarray) and np.array_equal(r, s) for rs, ss in zip(results, serial)
               for r, s in zip(rs, ss))
    errors = [repr(r) for rs in results for r in rs if isinstance(r, Exception)][:1]
    total = n_threads * per_thread
    check(same == total, f"{name}: {n_threads} threads calling act on one policy ({per_thread} call(s) each, batch "
          f"{'/'.join(map(str, sizes))}): {same} of {total} results are the serial ones"
          f"{': ' + errors[0] if errors else ''}")
    if make_other is None:
        return
    other = make_other()
    results = run_threads([policy, other], 2)
    same = sum(isinstance(r, np.ndarray) and np.array_equal(r, s) for rs, ss in zip(results, serial[:2])
               for r, s in zip(rs, ss))
    check(same == 2 * per_thread, f"{name}: two policies acting at once in two threads: {same} of {2 * per_thread} "
          "results are the serial ones")
    other.close()


def closed_checks(name, make_policy, images, instructions, state):
    """After close(), every method that needs the library raises RuntimeError (closed) in one line
    and the process goes on; closing again does nothing."""
    policy = make_policy()
    policy.close()
    policy.close()
    tokens = [list(t.encode()) for t in instructions]
    calls = {"act": lambda: policy.act(images, instructions, state),
             "act_tokens": lambda: policy.act_tokens(images, tokens, state),
             "timing": policy.timing,
             "run": lambda: policy.run(images, state, None, 0, len(instructions), lambda call: 0)}
    refused = []
    for method, fn in calls.items():
        try:
            fn()
        except RuntimeError as e:
            if str(e) == "this VLAPolicy is closed: make a new one":
                refused.append(method)
    check(refused == list(calls) and policy.closed,
          f"{name}: after close() (twice) {', '.join(refused)} raise RuntimeError: this VLAPolicy is closed: make a "
          f"new one (of {', '.join(calls)})")


def openmp_threads_check(ckpt_path, images, instructions, state):
    """threads= is the OpenMP thread count of the policy's own calls: loading and acting leave the
    calling thread's setting as it was (it decided how many threads other OpenMP code there starts)."""
    path = ctypes.util.find_library("gomp")
    if path is None:
        print("(libgomp not found: the OpenMP setting of the calling thread is not checked)")
        return
    gomp = ctypes.CDLL(path)
    before = gomp.omp_get_max_threads()
    policy = VLAPolicy(ckpt_path, threads=before + 1)
    policy.act(images, instructions, state, seed=1)
    after = gomp.omp_get_max_threads()
    policy.close()
    check(after == before, f"a policy of threads={before + 1} loaded and acting in this thread leaves its OpenMP "
          f"threads at {before} (got {after})")


def frame_dtype_checks(policy, images, instructions, state, noise, ours):
    """The library reads 8-bit frames; VLAPolicy takes LeRobot's float frames (uint8 / 255) too, as
    the 8-bit frames they are, and refuses any frame it cannot turn into 8 bits exactly. ours: the
    actions of the uint8 `images`."""
    # float32 as LeRobot makes them (u8.float() / 255), float64, float16, and float32 scaled by
    # a rounded 1/255: each is the same 8-bit frame, so the same actions bit for bit
    as_float = {"float32 uint8 / 255": [im.astype(np.float32) / np.float32(255) for im in images],
                "float64 uint8 / 255": [im / 255.0 for im in images],
                "float16 uint8 / 255": [(im / 255.0).astype(np.float16) for im in images],
                "float32 uint8 * float32(1 / 255)": [im * np.float32(1 / 255) for im in images],
                "int64 0..255": [im.astype(np.int64) for im in images]}
    for label, frames in as_float.items():
        got = policy.act(frames, instructions, state, noise=noise)
        check(np.array_equal(got, ours), f"frames as {label} give the uint8 frames' actions exactly")
    # what a plain cast of float frames to uint8 gives: almost every pixel 0
    truncated = [(im / 255.0).astype(np.uint8) for im in images]
    got = policy.act(as_float["float32 uint8 / 255"], instructions, state, noise=noise)
    check(not np.array_equal(got, policy.act(truncated, instructions, state, noise=noise))
          and not np.array_equal(got, policy.act([0 * im for im in images], instructions, state, noise=noise)),
          "float frames in [0, 1] do not act as the near-black frames a cast to uint8 makes of them")
    # every level k / 255 comes back as k, in each float type
    levels = np.broadcast_to(np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1), (1, 16, 16, 3))
    for dt in (np.float16, np.float32, np.float64):
        grid = (levels.astype(dt) / dt(255)).astype(dt)
        back = policy.cameras([grid, grid])
        check(all(b.dtype == np.uint8 and np.array_equal(b, levels) for b in back),
              f"{np.dtype(dt)} frames of every level k / 255, k = 0..255: read as exactly k")

    def refused(label, k, frame, *needles, absent=None):
        frames = list(images)
        frames[k] = frame
        try:
            policy.act(frames, instructions, state, noise=noise)
            check(False, f"{label}: accepted")
        except ValueError as e:
            msg = str(e)
            ok = "\n" not in msg and msg.startswith(f"camera {k}: ") and all(n in msg for n in needles) \
                and (absent is None or absent not in msg)
            check(ok, f"{label}: one line naming camera {k}: {msg}")

    fix = "pass uint8 frames, or frames in [0, 1] that are uint8 / 255"
    f32 = [im.astype(np.float32) / np.float32(255) for im in images]

    def with_pixel(im, value, dtype=np.float32):
        out = im.astype(dtype)
        out[1, 2, 3, 1] = value
        return out

    refused("float32 frames on the grid but one 0.5 (127.5 / 255)", 1, with_pixel(f32[1], 0.5),
            "float32 frames in [0, 1] are not multiples of 1/255", "e.g. 0.5 at (1, 2, 3, 1)",
            "the library reads 8-bit frames", fix)
    refused("float16 frames of one 0.5", 0, np.full(images[0].shape, 0.5, np.float16), "not multiples of 1/255", fix)
    refused("float32 frames of one 1e-4 (0.0255 / 255)", 0, with_pixel(f32[0], 1e-4), "not multiples of 1/255", fix)
    refused("float64 frames of one 1 + 1/255", 1, with_pixel(f32[1], 1 + 1 / 255, np.float64),
            "float64 frames range over [", ", 1.00392], outside [0, 1]", fix, absent="cast them to uint8")
    refused("float32 frames of one -1/255", 0, with_pixel(f32[0], -1 / 255), "outside [0, 1]", fix)
    refused("float32 frames of 0..255 (not divided by 255)", 1, images[1].astype(np.float32),
            f"range over [{images[1].min()}, {images[1].max()}], outside [0, 1]",
            "whole numbers 0..255: cast them to uint8")
    refused("float32 frames with a NaN", 1, with_pixel(f32[1], np.nan), "float32 frames hold NaN or Inf", fix)
    refused("float64 frames with an Inf", 0, with_pixel(f32[0], np.inf, np.float64), "NaN or Inf", fix)
    refused("int64 frames with a 256", 1, with_pixel(images[1], 256, np.int64), "int64 frames range over",
            "..256, outside 0..255", fix)
    refused("int16 frames with a -1", 0, with_pixel(images[0], -1, np.int16), "int16 frames range over -1..", fix)
    refused("bool frames", 0, images[0] > 127, "frames of dtype bool", fix)


def act_raw(lib, handle, images, state, texts=None, ids=None, B=None):
    """One call of vla_policy_act (texts) or vla_policy_act_tokens (ids: sequences), no checks on
    this side: (return code, actions)."""
    B = len(texts if texts is not None else ids) if B is None else B
    cam_hw = np.ascontiguousarray([[im.shape[1], im.shape[2]] for im in images], np.int32)
    frames = (ctypes.c_void_p * len(images))(*[im.ctypes.data for im in images])
    out = np.zeros(max(B, 1) * 64 * 32, np.float32)  # room for any tiny chunk, (B, H, A) from the start
    head = (handle, B, cam_hw.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), frames)
    tail = (state.ctypes.data, None, 0, out.ctypes.data)
    if texts is not None:
        return lib.vla_policy_act(*head, (ctypes.c_char_p * len(texts))(*[t.encode() for t in texts]), *tail), out
    flat = np.ascontiguousarray(np.concatenate([np.zeros(0, np.int64)] + [np.asarray(t, np.int64) for t in ids]),
                                np.int32)
    counts = np.ascontiguousarray([len(t) for t in ids], np.int32)
    return lib.vla_policy_act_tokens(*head, flat.ctypes.data, counts.ctypes.data, *tail), out


def token_checks(policy, ck, ckpt_path, tmp, images, instructions, state, noise, tol):
    """The token-id entry point and the tokenizer rules, on any build of the library: ids give the
    oracle's actions (and, as bytes, the strings' actions); bad ids and counts are refused; a
    checkpoint of another tokenizer refuses strings, and VLAPolicy refuses a tokenizer.json of
    another name. Returns the checkpoint of the other tokenizer's path (written once)."""
    name = os.path.basename(policy.lib._name)
    cfg = ck["config"]
    as_bytes = [vla_shard.BYTES.encode(s) for s in instructions]
    check(np.array_equal(policy.act_tokens(images, as_bytes, state, noise=noise),
                         policy.act(images, instructions, state, noise=noise)),
          f"{name}: act_tokens with the instructions' bytes gives act's actions exactly (one path)")
    # any ids of the vocabulary, one instruction cut by max_text, one of a single id
    rng = np.random.default_rng(3)
    ids = [rng.integers(0, cfg.vocab, 5), rng.integers(0, cfg.vocab, cfg.max_text + 7), [cfg.vocab - 1]]
    got, ref = policy.act_tokens(images, ids, state, noise=noise), oracle_actions(ck, images, ids, state, noise)
    check(rel(got, ref) < tol, f"{name}: vla_policy_act_tokens on ids of 5, max_text + 7 and 1 tokens gives the "
          f"oracle's actions: rel err {rel(got, ref):.2e} (tol {tol:.1e})")
    rc_vocab, _ = act_raw(policy.lib, policy.handle, images, state, ids=[[1, 2], [cfg.vocab], [3]])
    rc_neg, _ = act_raw(policy.lib, policy.handle, images, state, ids=[[1, 2], [], [3]])
    counts = np.ascontiguousarray([2, -1, 1], np.int32)
    cam_hw = np.ascontiguousarray([[im.shape[1], im.shape[2]] for im in images], np.int32)
    frames = (ctypes.c_void_p * len(images))(*[im.ctypes.data for im in images])
    flat = np.ascontiguousarray([1, 2, 3], np.int32)
    out = np.zeros((3, cfg.chunk, cfg.action_dim), np.float32)
    rc_count = policy.lib.vla_policy_act_tokens(policy.handle, 3, cam_hw.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                                frames, flat.ctypes.data, counts.ctypes.data, state.ctypes.data, None, 0,
                                                out.ctypes.data)
    check(rc_vocab == 3 and rc_count == 3 and rc_neg == 0,
          f"{name}: an id equal to the vocabulary ({cfg.vocab}) and a negative count return 3 (got {rc_vocab}, "
          f"{rc_count}); an empty instruction is allowed (got {rc_neg})")
    expect_error(f"{name}: act_tokens with an id outside the vocabulary",
                 lambda: policy.act_tokens(images, [[1], [-1], [2]], state), "outside the model's vocabulary")

    # a checkpoint trained on a tokenizer.json's ids: the same weights under another tokenizer name
    other = os.path.join(tmp, "other_tokenizer.bin")
    if not os.path.exists(other):
        oracle.write_checkpoint(other, ck["config"], ck["train_mode"], ck["stats"], ck["params"], ck["m"], ck["v"],
                                ck["step"], ck["seed"], ck["sampler_pos"], "tokenizer.json:0123456789abcdef")
    err = ctypes.create_string_buffer(1024)
    handle = policy.lib.vla_policy_load(os.fsencode(other), 1, err, len(err))
    check(bool(handle), f"{name}: loads a checkpoint of tokenizer tokenizer.json:0123456789abcdef"
          + ("" if handle else f": {err.value.decode()}"))
    if handle:
        rc, _ = act_raw(policy.lib, handle, images, state, texts=instructions)
        rc_ids, out = act_raw(policy.lib, handle, images, state, ids=as_bytes)
        want = policy.act_tokens(images, as_bytes, state, seed=0)
        check(rc == 4 and rc_ids == 0 and np.array_equal(out[:want.size], want.reshape(-1)),
              f"{name}: vla_policy_act refuses strings for it (4: not byte ids; got {rc}), token ids act (got {rc_ids})")
        policy.lib.vla_policy_free(handle)
    return other


def tokenizer_refusals(ckpt_path, other):
    """VLAPolicy and tokenizers: none for a tokenizer.json checkpoint, one of another name, one for a
    bytes checkpoint: one-line errors naming what is wrong (names compared before any parsing)."""
    fake = os.path.join(os.path.dirname(other), "tokenizer.json")
    with open(fake, "w") as f:
        f.write('{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}')
    fake_name = vla_shard.tokenizer_json_id(fake)
    expect_error("VLAPolicy on a tokenizer.json checkpoint without tokenizer=", lambda: VLAPolicy(other, threads=1),
                 "was trained on token ids of tokenizer tokenizer.json:0123456789abcdef: pass tokenizer=PATH")
    for label, spec in (("a tokenizer.json of another name", fake), ("a folder holding one", os.path.dirname(fake))):
        expect_error(f"VLAPolicy with {label}", lambda: VLAPolicy(other, threads=1, tokenizer=spec),
                     f"is {fake_name}, but checkpoint {other} was trained on token ids of tokenizer.json:0123456789abcdef")
    expect_error("VLAPolicy with a tokenizer that does not exist",
                 lambda: VLAPolicy(other, threads=1, tokenizer=fake + ".missing"), "no such file")
    expect_error("VLAPolicy on a bytes checkpoint with a tokenizer.json",
                 lambda: VLAPolicy(ckpt_path, threads=1, tokenizer=fake), "reads instructions as UTF-8 bytes")


def eval_check(policy, ck, shard, text):
    """The trainer's end-of-run evaluation (eval_batch, action_mse): BATCH samples from the sampler's
    position after the run, started from the flow noise of step STEPS. The library on the same
    observations and noise gives the same MSE."""
    m = re.search(r"MSE ([0-9.eE+-]+)[^\n]* on (\d+) samples", text)
    check(m is not None, "the trainer prints its end-of-run evaluation (sampled actions' MSE)")
    if m is None:
        return
    mse_c, n = float(m.group(1)), int(m.group(2))
    cfg = ck["config"]
    idx = oracle.Sampler(shard.n_frames, ck["seed"]).indices(ck["sampler_pos"], n)
    noise = np.stack([oracle.flow_noise(cfg, ck["seed"], ck["step"], g)[1] for g in range(n)])
    images = [np.stack([shard.camera_images(k)[i] for i in idx]) for k in range(cfg.n_cam)]
    tasks = [shard.task(int(shard.episodes[shard.frame_episode[i]]["task"])).decode() for i in idx]
    got = policy.act(images, tasks, shard.state[idx], noise=noise)
    se, count = 0.0, 0
    for b, i in enumerate(idx):
        ep = shard.episodes[shard.frame_episode[i]]
        last = int(ep["first_frame"]) + int(ep["length"]) - 1
        for h in range(cfg.chunk):
            if i + h <= last:
                se += float(((got[b, h].astype(np.float64) - shard.action[i + h]) ** 2).sum())
                count += cfg.action_dim
    mse = se / count
    # the trainer prints 6 decimals; both are the same fp32 code on the same inputs
    check(abs(mse - mse_c) <= 1e-6 + 1e-4 * mse_c,
          f"the library's actions on the trainer's evaluation batch give its MSE: {mse:.6f} vs {mse_c:.6f}")


def graph_check(name, graphs, eager, images, instructions, state, noise):
    """The Euler steps replayed as a CUDA graph (`graphs`, the default) and launched one by one
    (`eager`) give the same bits: at batch 3 (its graph captured at the second call since `graphs`
    was made, replayed at the third), at batch 1 (the activations move: run once, captured,
    replayed) and back at 3. Under the CPU emulation the library counts the launches too: the
    replay is one, the steps one by one are hundreds."""
    same, counts = True, []
    for B in (3, 1, 1, 1, 3, 3):
        obs = ([im[:B] for im in images], instructions[:B], state[:B])
        a, b = graphs.act(*obs, noise=noise[:B]), eager.act(*obs, noise=noise[:B])
        same &= np.array_equal(a, b)
        counts.append((graphs.timing()["steps_launches"], eager.timing()["steps_launches"]))
    check(same, f"{name}: the Euler steps as a CUDA graph and launched one by one give the same actions (6 chunks, "
          "batch 3 -> 1 -> 3)")
    t = graphs.timing()
    check(t["prefix_ms"] > 0 and t["steps_ms"] > 0, f"{name}: timing of the last chunk: prefix {t['prefix_ms']:.2f} ms, "
          f"Euler steps {t['steps_ms']:.2f} ms")
    if counts[0][1] is not None:  # counted: the CPU emulation
        E = counts[0][1]
        # graphs: a replay (captured before), then at each new batch size one by one, a capture and
        # its launch, a replay
        want = [(1, E), (E, E), (1, E), (1, E), (E, E), (1, E)]
        check(counts == want and E > 100, f"{name}: launches of the Euler steps per chunk, graph / one by one: "
              f"{counts} (want {want})")
    eager.close()


def smolvla_main():
    exe = os.path.join(ROOT, "train_vla_cpu")
    for target, path in (("train_vla_cpu", exe), ("build/test/s.bin", SHARD), ("libvla.so", os.path.join(ROOT, "libvla.so"))):
        if not os.path.exists(path):
            subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([exe, "-p", "tiny", "-i", SHARD, "-n", str(STEPS), "-b", str(BATCH), "-u", "1", "-l", "1e-2",
                            "-t", "1", "-s", str(SEED), "-o", tmp], capture_output=True, text=True, cwd=ROOT)
        ckpt_path = os.path.join(tmp, f"ckpt_{STEPS:08d}.bin")
        ok = r.returncode == 0 and os.path.exists(ckpt_path)
        check(ok, "train_vla_cpu writes a checkpoint to serve")
        if not ok:
            print((r.stdout + r.stderr)[-2000:])
            return
        ck = oracle.read_checkpoint(ckpt_path)
        policy = VLAPolicy(ckpt_path, threads=1)
        c = policy.config
        # compared by name: the policy reports them in a checkpoint header's order (family after the train mode)
        want = {f: getattr(ck["config"], f) for f in oracle.CONFIG_FIELDS}
        want["train_mode"] = ck["train_mode"]
        check(c == want and len(CONFIG_FIELDS) == len(oracle.CONFIG_FIELDS) + 1,
              f"the policy reports the checkpoint's {len(oracle.CONFIG_FIELDS)} config fields and train mode, by name "
              f"({c['n_cam']} cameras, S {c['state_dim']}, A {c['action_dim']}, H {c['chunk']}, family "
              f"{oracle.FAMILY_NAMES[c['family']]}, --train {policy.train_mode})")
        check(policy.tokenizer == "bytes" and policy.train_mode == "all" and "fp32" in policy.device,
              f"tokenizer {policy.tokenizer}, train mode {policy.train_mode}, device {policy.device}")

        shard = vla_shard.Shard(SHARD)
        frames = [0, 7, 15]
        images = [np.ascontiguousarray(shard.camera_images(k)[frames]) for k in range(c["n_cam"])]
        state = np.ascontiguousarray(shard.state[frames])
        instructions = ["go to blue", "move to the red square",
                        "touch the yellow square with the gripper, then stop"]  # shorter and longer than max_text
        noise = np.random.default_rng(0).normal(size=(3, c["chunk"], c["max_action_dim"])).astype(np.float32)
        ours = policy.act(images, instructions, state, noise=noise)
        ref = oracle_actions(ck, images, instructions, state, noise)
        # fp32 against the float64 oracle: 10 Euler steps through the whole model, as test_vla
        err = rel(ours, ref)
        check(ours.shape == (3, c["chunk"], c["action_dim"]) and err < 1e-5,
              f"actions of 3 observations (cameras 24x32 and 20x20) match the oracle's sampling: rel err {err:.2e} "
              "(tol 1e-5)")
        big = [resize_nearest(images[0], 60, 80), resize_nearest(images[1], 37, 53)]
        err = rel(policy.act(big, instructions, state, noise=noise), oracle_actions(ck, big, instructions, state, noise))
        check(err < 1e-5, f"frames of other sizes (60x80, 37x53) are resized by the model as by the oracle: rel err "
              f"{err:.2e}")
        same = [images[1], images[1]]
        stacked = np.stack(same, axis=1)
        check(np.array_equal(policy.act(stacked, instructions, state, noise=noise),
                             policy.act(same, instructions, state, noise=noise)),
              "a (B, n_cam, h, w, 3) array gives the actions of the same frames as a list per camera")

        a1, a2 = policy.act(images, instructions, state, seed=5), policy.act(images, instructions, state, seed=5)
        a3 = policy.act(images, instructions, state, seed=6)
        check(np.array_equal(a1, a2) and not np.array_equal(a1, a3), "seeded noise: same seed same actions, another differs")
        drawn = np.stack([oracle.flow_noise_width(c["chunk"], c["max_action_dim"], 5, 0, b)[1] for b in range(3)])
        check(np.array_equal(a1, policy.act(images, instructions, state, noise=drawn)),
              "seed 5's noise is flow_noise_width(chunk, max_action_dim, 5, 0, b) for observation b")
        single = policy.act([im[1:2] for im in images], instructions[1:2], state[1:2], noise=noise[1:2])
        check(np.allclose(single[0], ours[1], rtol=1e-5, atol=1e-6), "a batch of one gives that observation's actions")
        eval_check(policy, ck, shard, r.stdout + r.stderr)
        frame_dtype_checks(policy, images, instructions, state, noise, ours)

        # bad input: refused before the library sees it, or by the library's return code
        expect_error("one camera for a two-camera checkpoint", lambda: policy.act(images[:1], instructions, state),
                     "this checkpoint reads 2")
        expect_error("frames without 3 channels", lambda: policy.act([images[0][..., :2], images[1]], instructions,
                                                                     state), "expected (B, h, w, 3)")
        expect_error("noise of action_dim wide slots", lambda: policy.act(images, instructions, state,
                                                                          noise=noise[:, :, :2]), "max_action_dim")
        expect_error("a state of the wrong width", lambda: policy.act(images, instructions, state[:, :2]),
                     "state_dim 3")
        # non-finite observations and noise, NUL characters: one line naming the element, before the library
        bad_state = state.copy()
        bad_state[2, 1] = np.nan
        expect_error("a NaN in the state", lambda: policy.act(images, instructions, bad_state),
                     "state: observation 2, element 1 is NaN: pass finite values")
        big_state = state.astype(np.float64)
        big_state[0, 2] = 1e300
        expect_error("a float64 state past float32's range", lambda: policy.act(images, instructions, big_state),
                     "state: observation 0, element 2 is 1e+300, past float32's range: pass finite values")
        expect_error("a -Inf in act_tokens' state", lambda: policy.act_tokens(
            images, [list(t.encode()) for t in instructions], np.where(bad_state != bad_state, -np.inf, bad_state)),
            "state: observation 2, element 1 is -Inf")
        bad_noise = noise.copy()
        bad_noise[1, 3, 0] = np.inf
        expect_error("an Inf in the noise", lambda: policy.act(images, instructions, state, noise=bad_noise),
                     "noise: observation 1, slot 3, element 0 is +Inf: pass finite values")
        expect_error("an instruction with a NUL", lambda: policy.act(images, ["go to blue", "move\0 to red", "x"], state),
                     "instruction 1 holds a NUL character at offset 4: pass text without NUL characters")
        lib = policy.lib
        out = np.empty((3, c["chunk"], c["action_dim"]), np.float32)
        text = (ctypes.c_char_p * 3)(*[s.encode() for s in instructions])
        for what, B, hw, want in (("B = 0", 0, [[24, 32], [20, 20]], 1),
                                  (f"a camera of {MAX_IMG + 1} rows", 3, [[MAX_IMG + 1, 32], [20, 20]], 2),
                                  ("a camera of 0 columns", 3, [[24, 0], [20, 20]], 2)):
            cam_hw = np.ascontiguousarray(hw, np.int32)
            frames_p = (ctypes.c_void_p * 2)(*[im.ctypes.data for im in images])
            rc = lib.vla_policy_act(policy.handle, B, cam_hw.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), frames_p,
                                    text, state.ctypes.data, None, 0, out.ctypes.data)
            check(rc == want, f"vla_policy_act with {what} returns {want} (got {rc})")

        other = token_checks(policy, ck, ckpt_path, tmp, images, instructions, state, noise, 1e-5)
        tokenizer_refusals(ckpt_path, other)
        malformed_input_checks(policy, images, instructions, state)
        library_failure_check(policy)
        thread_checks("libvla.so", policy, lambda: VLAPolicy(ckpt_path, threads=1), images, instructions, state, 4, 6)
        openmp_threads_check(ckpt_path, images, instructions, state)
        library_oom_check("libvla.so", ckpt_path)
        closed_checks("libvla.so", lambda: VLAPolicy(ckpt_path, threads=1), images, instructions, state)

        expect_error("a missing checkpoint", lambda: VLAPolicy(os.path.join(tmp, "missing.bin")), "cannot open checkpoint")
        # corrupt checkpoints: refused with the reader's message, and this process goes on (sizes
        # from the header are bounded and checked before any buffer is sized from them)
        raw = open(ckpt_path, "rb").read()
        config_at = 8  # after magic and version: the header's 28 int32 in CONFIG_FIELDS' order (the config's
        # fields but family, the train mode, the family)
        corrupt = [("n_layer", 2**31 - 1, "n_layer 2147483647 is past its bound"),
                   ("d_model", 2**22, "d_model 4194304 is past its bound"),
                   ("chunk", 5000, "chunk 5000 is past its bound"),
                   ("max_text", 100000, "max_text 100000 is past its bound"),
                   ("train_mode", 9, "train mode 9"),
                   ("family", 7, "family 7 is not one of 0 (smolvla) and 1 (pi0)")]
        for field, value, needle in corrupt:
            at = config_at + 4 * CONFIG_FIELDS.index(field)
            path = os.path.join(tmp, f"corrupt_{field}.bin")
            open(path, "wb").write(raw[:at] + np.int32(value).tobytes() + raw[at + 4:])
            expect_error(f"a checkpoint with {field} {value}", lambda: VLAPolicy(path), needle)
        path = os.path.join(tmp, "corrupt_stats.bin")
        open(path, "wb").write(raw[:512] + np.float32(np.nan).tobytes() + raw[516:])
        expect_error("a checkpoint with NaN statistics", lambda: VLAPolicy(path), "normalization statistic 0 is nan")
        path = os.path.join(tmp, "corrupt_weights.bin")
        at = 512 + 4 * len(ck["stats"]) + 100  # two bytes inside the weights
        open(path, "wb").write(raw[:at] + bytes([raw[at] ^ 0x10, raw[at + 1] ^ 0x01]) + raw[at + 2:])
        expect_error("a checkpoint with two bytes flipped in its weights", lambda: VLAPolicy(path),
                     "checksum mismatch: the file is corrupt")
        path = os.path.join(tmp, "version1.bin")
        open(path, "wb").write(raw[:4] + np.uint32(1).tobytes() + raw[8:])
        expect_error("a version-1 checkpoint (the model before SmolVLA)", lambda: VLAPolicy(path), "version 1")
        path = os.path.join(tmp, "truncated.bin")
        open(path, "wb").write(raw[:-8])
        expect_error("a truncated checkpoint", lambda: VLAPolicy(path), "truncated")
        policy.close()

        # the GPU library: same checkpoint, observations and noise. Tolerance: fp32 builds 1e-4 (the
        # GPU's fp32 against the float64 oracle, as test_vla_gpu); bf16 builds 2.5e-2, test_vla_gpu's
        # for sampling (8 significant bits per stored value over ~40 rounded stages per velocity)
        libraries = [p for p in os.environ.get("VLA_GPU_LIBRARY", "").split(":") if p]
        if not libraries:
            print("(VLA_GPU_LIBRARY not set: the GPU library is not checked here)")
        for library in libraries:
            name = os.path.basename(library)
            try:
                gpu = VLAPolicy(ckpt_path, library=library, device="cuda")
            except (ValueError, FileNotFoundError, OSError) as e:
                check(False, f"{name} loads the checkpoint: {e}")
                continue
            check(gpu.config == c and gpu.tokenizer == policy.tokenizer, f"{name} on {gpu.device}: the same config")
            tol = 2.5e-2 if "bf16" in gpu.device else 1e-4
            got = gpu.act(images, instructions, state, noise=noise)
            check(rel(got, ref) < tol and rel(got, ours) < tol,
                  f"{name}: actions match the oracle's sampling and the CPU library's: rel err {rel(got, ref):.2e} / "
                  f"{rel(got, ours):.2e} (tol {tol:.1e})")
            got = gpu.act(big, instructions, state, noise=noise)
            check(rel(got, oracle_actions(ck, big, instructions, state, noise)) < tol,
                  f"{name}: frames of other sizes resized on the device as by the oracle")
            g1, g2 = gpu.act(images, instructions, state, seed=5), gpu.act(images, instructions, state, seed=5)
            check(np.array_equal(g1, g2) and rel(g1, a1) < tol,
                  f"{name}: seeded noise gives the same actions twice, and the CPU policy's")
            expect_error(f"{name}: one camera for two", lambda: gpu.act(images[:1], instructions, state), "reads 2")
            graph_check(name, gpu, VLAPolicy(ckpt_path, library=library, device="cuda", graphs=False), images,
                        instructions, state, noise)
            token_checks(gpu, ck, ckpt_path, tmp, images, instructions, state, noise, tol)
            # one policy from two host threads in turn, at the batch of the graph token_checks left:
            # each thread makes its GPU state, and the graph is dropped and the steps run one by one
            # there (few calls: each costs ~0.5 s under the emulation, and make test runs two builds)
            thread_checks(name, gpu, None, images, instructions, state, 2, 1, sizes=(3,))
            library_failure_check(gpu)
            gpu.close()
            if "emulation" not in gpu.device:
                print(f"({name} runs on a GPU: out of device memory is checked under the CUDA emulation)")
            elif library == libraries[0]:  # (the builds differ in precision only, not in how they fail)
                library_oom_check(name, ckpt_path, library)
            closed_checks(name, lambda: VLAPolicy(ckpt_path, library=library, device="cuda"), images, instructions,
                          state)



# ----------------------------------------------------------------------------
# pi0 (--family pi0): fixtures


def pi0_build_tokenizer(folder):
    """A PaliGemma-kind tokenizer folder (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json), trained on PI0_CORPUS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # as transformers' GemmaConverter writes Gemma's tokenizer.json (older files have none): after
    # the normalizer no space is left to split on
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=PI0_GEMMA_SPECIALS, show_progress=False)
    tok.train_from_iterator([t + "\n" for t in PI0_CORPUS] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", PI0_BOS_ID)])
    spec = json.loads(tok.to_str())
    # the byte pieces go into the model's vocabulary right after the specials, as in Gemma's, and
    # not among the added tokens (which would be matched in the text itself)
    vocab = spec["model"]["vocab"]
    learned = sorted((i, piece) for piece, i in vocab.items() if i >= len(PI0_GEMMA_SPECIALS))
    vocab = {piece: i for i, piece in enumerate(PI0_GEMMA_SPECIALS + PI0_BYTE_TOKENS + [piece for _, piece in learned])}
    spec["model"]["vocab"] = vocab
    if len(vocab) > PI0_MODEL_VOCAB or [vocab[s] for s in PI0_GEMMA_SPECIALS] != list(range(len(PI0_GEMMA_SPECIALS))):
        raise RuntimeError(f"the tokenizer's {len(vocab)} ids do not fit the model's {PI0_MODEL_VOCAB}, or its specials "
                           "moved")
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    decoder = {str(i): dict(content=s, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
               for i, s in enumerate(PI0_GEMMA_SPECIALS)}
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="GemmaTokenizer", add_bos_token=True, add_eos_token=False, bos_token="<bos>",
        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>", added_tokens_decoder=decoder,
        clean_up_tokenization_spaces=False, model_max_length=1000000000000000019884624838656)))
    (folder / "special_tokens_map.json").write_text(json.dumps(dict(
        bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")))


def pi0_install_in_hub_cache(folder, name):
    """folder as the snapshot of hub model `name` in HF_HUB_CACHE (refs/main names it), where
    from_pretrained(name) looks offline, with the config.json AutoTokenizer reads first (PaliGemma's
    model type; the tokenizer class comes from tokenizer_config.json)."""
    repo = Path(os.environ["HF_HUB_CACHE"]) / ("models--" + name.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "paligemma"}))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def pi0_build_policy():
    """LeRobot's PI0Policy at pi0_tiny's sizes, the text table PI0_MODEL_VOCAB rows, pi0's 48 tokens."""
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    inputs = {make_ref.cam_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w))
              for c, (h, w) in PI0_CAMERAS.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(PI0_STATE_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(PI0_ACTION_DIM,))}
    cfg = PI0Config(input_features=inputs, output_features=outputs, device="cpu", push_to_hub=False,
                    **dict(make_ref.PI0_POLICY, tokenizer_max_length=PI0_MAX_TEXT))
    make_ref.PI0_VOCAB = PI0_MODEL_VOCAB  # tiny_pi0_sizes sizes the text table from it when the model is built
    with make_ref.tiny_pi0_sizes():
        torch.manual_seed(PI0_SEED)
        policy = PI0Policy(cfg)
    make_ref.perturb_constant_params(policy, PI0_SEED + 1)
    return policy.eval(), cfg


def pi0_write_policy_checkpoint(policy, path, stats, tokenizer):
    """The policy's weights as a train_vla checkpoint of its config (read off the built model),
    LeRobot's train mode, the statistics and the tokenizer.json's name."""
    fields = dict(line.split() for line in make_ref.pi0_c_config_lines(policy))
    cfg = oracle.SmolVLAConfig(**{k: int(v) for k, v in fields.items()})
    params = oracle.from_lerobot(cfg, policy.state_dict())
    oracle.write_checkpoint(str(path), cfg, oracle.mode_of_policy(policy.config), stats,
                            {k: v.detach().numpy() for k, v in params.items()}, tokenizer=tokenizer.name)
    return cfg


def pi0_make_observation(g):
    """A raw batch: uint8 frames per camera at the dataset's sizes, raw state, the starting noise."""
    frames = {cam: torch.randint(0, 256, (PI0_BATCH, h, w, 3), generator=g, dtype=torch.uint8).numpy()
              for cam, (h, w) in PI0_CAMERAS.items()}
    state = (torch.randn(PI0_BATCH, PI0_STATE_DIM, generator=g) * 2).numpy()
    noise = torch.randn(PI0_BATCH, PI0_CHUNK, PI0_MAX_ACTION, generator=g).numpy()
    return frames, state, noise


# ----------------------------------------------------------------------------
# pi0: the two sides


def pi0_lerobot_actions(policy, pre, post, frames, state, tasks, noise):
    """LeRobot's own path: its pre-processor on the raw batch (a camera left out where frames holds
    None), predict_action_chunk from the noise, its post-processor: (B, H, A) float64."""
    batch = {make_ref.cam_key(c): make_ref.images_as_fed(torch.from_numpy(f)) for c, f in frames.items()
             if f is not None}
    batch["observation.state"] = torch.from_numpy(state).clone()
    batch["task"] = list(tasks)
    with torch.no_grad():
        chunk = policy.predict_action_chunk(pre(batch), noise=torch.from_numpy(noise).clone())
    return post(chunk).to(torch.float64).numpy()


def pi0_gpu_libraries():
    """The GPU builds to check: $VLA_GPU_LIBRARY's, else the emulated fp32 build if it is built."""
    named = [p for p in os.environ.get("VLA_GPU_LIBRARY", "").split(":") if p]
    if named:
        return named
    emulated = os.path.join(ROOT, "build", "emu", "libvla_gpu_fp32.so")
    return [emulated] if os.path.exists(emulated) else []


# ----------------------------------------------------------------------------
# pi0: the checks


def pi0_check_tokens(pre, folder, tokenizer, cfg, ckpt, tmp):
    """LeRobot's pre-processor's tokens against a TokenizerJSON shard's batch and VLAPolicy's ids."""
    step = next(s for s in pre.steps if type(s).__name__ == "TokenizerProcessorStep")
    at = step.input_tokenizer
    check(type(at).__name__ == "GemmaTokenizer" and step.tokenizer_name == PI0_HUB_NAME
          and (at.pad_token_id, at.bos_token_id) == (PI0_PAD_ID, PI0_BOS_ID) and len(at) == tokenizer.vocab,
          f"LeRobot's pi0 pre-processor loads {step.tokenizer_name} from the private hub cache as transformers' "
          f"{type(at).__name__} (pad {at.pad_token_id}, bos {at.bos_token_id}, {len(at)} ids; tokenizer.json "
          f"{tokenizer.vocab})")
    lens = [len(tokenizer.encode(t)) for t in PI0_TOKEN_TASKS]
    ids = [tokenizer.encode(t) for t in PI0_TOKEN_TASKS]
    fallback = any(((x >= len(PI0_GEMMA_SPECIALS)) & (x < len(PI0_GEMMA_SPECIALS) + 256)).any() for x in ids)
    check(all(x[0] == PI0_BOS_ID for x in ids) and max(lens) > PI0_MAX_TEXT and fallback
          and np.array_equal(ids[3], tokenizer.encode(PI0_TOKEN_TASKS[3][:-1])),
          f"the tasks' ids ({lens}): <bos> first, one longer than {PI0_MAX_TEXT}, unicode through byte fallback, a task "
          "ending in \"\\n\" tokenized as the same task without it")
    B = len(PI0_TOKEN_TASKS)
    n = 2 * B  # one 2-frame episode per task
    rng = np.random.default_rng(PI0_SEED)
    cams = [rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8) for h, w in PI0_CAMERAS.values()]
    shard = tmp / "tokens.bin"
    vla_shard.write_shard(str(shard), cams, rng.normal(size=(n, PI0_STATE_DIM)).astype(np.float32),
                          rng.normal(size=(n, PI0_ACTION_DIM)).astype(np.float32), [(2 * k, 2, k) for k in range(B)],
                          PI0_TOKEN_TASKS, tokenizer=tokenizer)
    ds = vla_shard.Dataset(str(shard))
    ours = oracle.build_batch(ds, cfg, [2 * k for k in range(B)], PI0_SEED, 0)
    g = torch.Generator().manual_seed(PI0_SEED + 2)
    # every task, then the short ones alone: pi0 pads to 48 columns whatever the batch's longest
    for picks in (list(range(B)), [0, 4]):
        batch = {make_ref.cam_key(c): make_ref.images_as_fed(torch.randint(0, 256, (len(picks), h, w, 3), generator=g,
                                                                           dtype=torch.uint8))
                 for c, (h, w) in PI0_CAMERAS.items()}
        batch["observation.state"] = torch.randn(len(picks), PI0_STATE_DIM, generator=g)
        batch["task"] = [PI0_TOKEN_TASKS[k] for k in picks]
        out = pre(batch)
        theirs = out["observation.language.tokens"].numpy()
        their_mask = out["observation.language.attention_mask"].numpy()
        same = (theirs.shape == (len(picks), PI0_MAX_TEXT) and np.array_equal(ours["tokens"][picks], theirs)
                and np.array_equal(ours["token_mask"][picks] > 0, their_mask))
        check(ds.tokenizer == tokenizer.name and same,
              f"LeRobot's pre-processor (tokens, attention mask: {theirs.shape[0]} x {theirs.shape[1]}) on tasks of "
              f"{[lens[k] for k in picks]} ids equals the trainer's batch from a {tokenizer.name} shard in all "
              f"{PI0_MAX_TEXT} columns (pad id {PI0_PAD_ID}, mask 0 after the ids)")
        if picks == list(range(B)):
            pol = VLAPolicy(str(ckpt), threads=1, tokenizer=str(folder))
            rows = np.full((B, PI0_MAX_TEXT), PI0_PAD_ID, np.int64)
            for b, t in enumerate(PI0_TOKEN_TASKS):
                x = pol.text_tokenizer.encode(t)[:PI0_MAX_TEXT]
                rows[b, :len(x)] = x
            pol.close()
            check(np.array_equal(rows, theirs), "VLAPolicy's ids, cut to 48 and padded with the pad id, are LeRobot's")
    # the C trainer takes the shard on from the checkpoint: one name for one tokenizer
    run = tmp / "run"
    r = subprocess.run([os.path.join(ROOT, "train_vla_cpu"), "-i", str(shard), "--init", str(ckpt), "--weights-only",
                        "-n", "1", "-b", "2", "-u", "1", "-t", "1", "--workers", "1", "-o", str(run)],
                       capture_output=True, text=True)
    check(r.returncode == 0 and (run / "ckpt_00000001.bin").exists(),
          "./train_vla_cpu --init <the pi0 checkpoint> trains a step on the shard of its tokenizer"
          + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))


def pi0_check_actions(name, make, tol, lerobot, frames, state, noise):
    """One library's VLAPolicy (make() opens it) against LeRobot's actions (lerobot(frames)): all
    cameras, each camera missing in turn, every camera missing, all cameras again."""
    from test_lerobot_io import errors, one_line_error

    pol = make()
    cams = list(PI0_CAMERAS)
    full = pol.act([frames[c] for c in cams], PI0_ACT_TASKS, state, noise=noise).astype(np.float64)
    e_abs, e_rel = errors(full, lerobot(frames))
    lens = [len(pol.text_tokenizer.encode(t)) for t in PI0_ACT_TASKS]
    check(e_rel <= tol and max(lens) > PI0_MAX_TEXT, f"{name} ({pol.device}) vs LeRobot on the raw observation (tasks of "
          f"{lens} ids): max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {tol:g})")
    for gone in cams:
        some = {c: (None if c == gone else frames[c]) for c in cams}
        got = pol.act([some[c] for c in cams], PI0_ACT_TASKS, state, noise=noise).astype(np.float64)
        want = lerobot(some)
        e_abs, e_rel = errors(got, want)
        moved = errors(want, full)[0]
        check(e_rel <= tol and moved > 0, f"{name}: camera {gone} missing (LeRobot: an image of -1 masked out; the "
              f"actions move by {moved:.3g}): max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {tol:g})")
    ok, msg = one_line_error(lambda: pol.act([None] * len(cams), PI0_ACT_TASKS, state, noise=noise), "at least one")
    check(ok, f"{name}: every camera missing is refused in one line: {msg}")
    values = (ctypes.c_int32 * len(CONFIG_FIELDS))()
    pol.lib.vla_policy_config(pol.handle, values)
    check(dict(zip(CONFIG_FIELDS, values)) == pol.config, f"{name}: after calls with a camera missing the library "
          f"still reports the checkpoint's config ({values[0]} cameras)")
    again = pol.act([frames[c] for c in cams], PI0_ACT_TASKS, state, noise=noise).astype(np.float64)
    check(np.array_equal(again, full), f"{name}: all cameras again after the missing ones: the first actions bit for "
          "bit")
    pol.close()


def pi0_main():
    """pi0's checks, under LeRobot's venv, in a hub cache of their own."""
    t0 = time.time()
    for target in ("libvla.so", "train_vla_cpu"):
        if not os.path.exists(os.path.join(ROOT, target)):
            check(False, f"{target} is missing: make {target} first")
            check.finish()
    # Before huggingface_hub and transformers are imported: they read these once. Nothing may be
    # fetched, and the hub cache is this test's own, where the tokenizer below is the only model.
    if "huggingface_hub" in sys.modules:
        raise RuntimeError("huggingface_hub was imported before HF_HUB_CACHE was set")
    tmp = Path(tempfile.mkdtemp(prefix="test_policy_pi0."))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ["HF_HUB_CACHE"] = str(tmp / "hub")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lerobot.policies.factory import make_pre_post_processors
    from test_lerobot_io import make_stats

    make_ref.setup_torch()
    folder = tmp / "paligemma_tokenizer"
    pi0_build_tokenizer(folder)
    pi0_install_in_hub_cache(folder, PI0_HUB_NAME)
    tokenizer = vla_shard.TokenizerJSON(str(folder))
    policy, lcfg = pi0_build_policy()
    stats = make_stats(torch.Generator().manual_seed(PI0_SEED + 3), PI0_STATE_DIM, PI0_ACTION_DIM, PI0_CAMERAS)
    flat = np.concatenate([stats["observation.state"]["mean"], stats["observation.state"]["std"],
                           stats["action"]["mean"], stats["action"]["std"]]).astype(np.float32)
    with contextlib.redirect_stdout(io.StringIO()):
        pre, post = make_pre_post_processors(lcfg, dataset_stats=stats)
    ckpt = tmp / "pi0.bin"
    cfg = pi0_write_policy_checkpoint(policy, ckpt, flat, tokenizer)
    check((cfg.family, cfg.vocab, cfg.pad_token, cfg.max_text, cfg.n_cam)
          == (oracle.FAMILY_PI0, PI0_MODEL_VOCAB, PI0_PAD_ID, PI0_MAX_TEXT, len(PI0_CAMERAS)),
          f"the checkpoint: pi0, a text table of {cfg.vocab} rows, pad id {cfg.pad_token}, {cfg.max_text} tokens, "
          f"{cfg.n_cam} cameras, tokenizer {tokenizer.name}")

    print("instruction tokens (LeRobot's pi0 pre-processor)")
    pi0_check_tokens(pre, folder, tokenizer, cfg, ckpt, tmp)

    print("actions from raw observations (LeRobot's PI0Policy)")
    frames, state, noise = pi0_make_observation(torch.Generator().manual_seed(PI0_SEED + 4))

    def lerobot(some):
        return pi0_lerobot_actions(policy, pre, post, some, state, PI0_ACT_TASKS, noise)

    pi0_check_actions("libvla.so", lambda: VLAPolicy(str(ckpt), threads=1, tokenizer=str(folder)), PI0_ACTION_TOL,
                      lerobot, frames, state, noise)
    libraries = pi0_gpu_libraries()
    if not libraries:
        print("(no GPU library: VLA_GPU_LIBRARY is not set and build/emu/libvla_gpu_fp32.so is not built)")
    for library in libraries:
        name = os.path.basename(library)
        try:
            opened = VLAPolicy(str(ckpt), library=library, device="cuda", tokenizer=str(folder))
        except (ValueError, FileNotFoundError, OSError) as e:
            check(False, f"{name} loads the checkpoint: {e}")
            continue
        tol = next((t for p, t in PI0_GPU_TOL.items() if f"({p})" in opened.device), PI0_GPU_TOL["bf16"])
        opened.close()
        pi0_check_actions(name, lambda: VLAPolicy(str(ckpt), library=library, device="cuda", tokenizer=str(folder)),
                          tol, lerobot, frames, state, noise)
    print(f"({time.time() - t0:.1f} s)")


# ----------------------------------------------------------------------------
# main

FAMILIES = {"smolvla": smolvla_main, "pi0": pi0_main}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--family", choices=list(FAMILIES), default="smolvla",
                    help="the policy served (default smolvla; pi0 needs LeRobot's venv)")
    args = ap.parse_args(argv)
    FAMILIES[args.family]()
    check.finish()


if __name__ == "__main__":
    main()
