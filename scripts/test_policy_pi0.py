"""
test_policy_pi0.py: pi0's instruction tokens and pi0 served from raw observations, against LeRobot
0.6.1's own pi0 pre-processor and PI0Policy. Run under build/lerobot-venv (LeRobot, torch,
tokenizers, transformers), in one process:

    build/lerobot-venv/bin/python scripts/test_policy_pi0.py    # needs libvla.so and train_vla_cpu

The GPU library: every build named in $VLA_GPU_LIBRARY (colon-separated, as scripts/test_policy.py
takes it; make test names the GPU build on a GPU machine), else the CPU emulation's fp32 build
(build/emu/libvla_gpu_fp32.so: make build/emu/libvla_gpu_fp32.so) where it has been built.

Fixtures, all made here and offline:
  - a tokenizer of PaliGemma's kind, trained on robot instructions with the tokenizers library: BPE
    with byte fallback (<0x00>..<0xFF> right after the specials), spaces replaced by U+2581, Gemma's
    special ids (<pad> 0, <eos> 1, <bos> 2, <unk> 3, <mask> 4), a post-processor that puts <bos>
    first; tokenizer_config.json names GemmaTokenizer, as PaliGemma's does. It sits in a private
    hub cache (HF_HUB_CACHE, HF_HUB_OFFLINE=1) as a snapshot of google/paligemma-3b-pt-224, so
    LeRobot's pi0 pre-processor loads it by that hub name, down the road the real one takes
    (transformers 5 rebuilds a GemmaTokenizer from tokenizer.json). Its ids are not PaliGemma's.
  - LeRobot's PI0Policy at pi0_tiny's sizes (dev/lerobot/make_ref_pi0.py's tiny_pi0_sizes), its
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

import atexit
import os
import shutil
import tempfile

# Before huggingface_hub and transformers are imported: they read these once. Nothing may be
# fetched, and the hub cache is this test's own, where the tokenizer below is the only model.
TMP = tempfile.mkdtemp(prefix="test_policy_pi0.")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
os.environ["HF_HUB_CACHE"] = os.path.join(TMP, "hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for sub in ("scripts", "dev", "data", "dev/lerobot"):
    sys.path.insert(0, os.path.join(ROOT, sub))
import make_ref  # noqa: E402  dev/lerobot: cam_key, images_as_fed, perturb_constant_params
import make_ref_pi0  # noqa: E402  dev/lerobot: LeRobot's pi0 at test sizes
import model as vla  # noqa: E402  dev/model.py: config, LeRobot names, checkpoints, batches
import vla_shard  # noqa: E402
import test_lerobot_io as io_test  # noqa: E402  the SmolVLA suite's statistics and error measures
from checks import Checks  # noqa: E402
from vla_policy import CONFIG_FIELDS, VLAPolicy  # noqa: E402

check = Checks()
SEED = 4242
HUB_NAME = "google/paligemma-3b-pt-224"  # what processor_pi0.py asks AutoTokenizer for
MAX_TEXT = 48  # PI0Config.tokenizer_max_length
MODEL_VOCAB = 512  # the test model's text table: room for the tokenizer's ids (as 257152 is for PaliGemma's)
CAMERAS = make_ref_pi0.CAMERAS  # (h, w) as a dataset stores them: 36x60 and 96x80
STATE_DIM, ACTION_DIM = make_ref_pi0.STATE_DIM, make_ref_pi0.ACTION_DIM
CHUNK, MAX_ACTION = make_ref_pi0.POLICY["chunk_size"], make_ref_pi0.POLICY["max_action_dim"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0-4, as in Gemma's vocabulary
PAD_ID, BOS_ID = 0, 2
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # byte fallback's pieces
# what the tokenizer learns from: robot instructions (ü is in its alphabet; ✓ and 日本 are not,
# so they fall back to bytes)
CORPUS = ["pick up the red cube and place it in the bin", "open the top drawer", "close the top drawer",
          "put the spoon inside the drawer", "stack 3 blocks on the table", "push the button", "über the cup",
          "turn the faucet left", "slide the plate to the right", "put 12 cups away", "press the red button twice",
          "move the arm to the left of the blue bowl", "grasp the handle and pull the door open"]
# LeRobot's tokenizer call: short, longer than 48 tokens (cut), unicode partly outside the
# vocabulary, already ending in "\n" (LeRobot adds none then), a single letter
TOKEN_TASKS = ["pick up the red cube", " ".join(["open the top drawer and close it"] * 8),
               "stack 3 blocks! ✓ über 日本", "put 12 cups away\n", "x"]
# the observations the policies act on: one cut by the 48 tokens, one with byte fallback
ACT_TASKS = ["pick up the red cube", "count " + " ".join(str(k) for k in range(40)), "press ✓ the button",
             "open the top drawer\n"]
BATCH = len(ACT_TASKS)
# libvla.so (fp32) against LeRobot (fp32): the same 10 Euler steps through the whole model, each
# sum in another order; LeRobot's normalizer divides by std + 1e-8 (equal to std in fp32 for the
# stds here, all above 0.3). test_vla meets LeRobot's pi0 chunk within 1e-7 relative; 1e-5, as
# test_vla's chunk check and scripts/test_lerobot_io.py's, leaves room for other weights and sizes
ACTION_TOL = 1e-5
# the GPU library: test_vla_gpu's tolerance for LeRobot's pi0 chunk in each precision (SMOL_TOL_FWD):
# fp32 1e-4 (fp32 sums in other orders and blockings); fp16 6.25e-3 and bf16 5e-2, from their 11 and
# 8 significant bits per stored activation over the ~40 rounded stages of each velocity
GPU_TOL = {"fp32": 1e-4, "fp16": 6.25e-3, "bf16": 5e-2}


# ----------------------------------------------------------------------------
# fixtures


def build_tokenizer(folder):
    """A PaliGemma-kind tokenizer folder (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json), trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # as transformers' GemmaConverter writes Gemma's tokenizer.json (older files have none): after
    # the normalizer no space is left to split on
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=GEMMA_SPECIALS, show_progress=False)
    tok.train_from_iterator([t + "\n" for t in CORPUS] * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", BOS_ID)])
    spec = json.loads(tok.to_str())
    # the byte pieces go into the model's vocabulary right after the specials, as in Gemma's, and
    # not among the added tokens (which would be matched in the text itself)
    vocab = spec["model"]["vocab"]
    learned = sorted((i, piece) for piece, i in vocab.items() if i >= len(GEMMA_SPECIALS))
    vocab = {piece: i for i, piece in enumerate(GEMMA_SPECIALS + BYTE_TOKENS + [piece for _, piece in learned])}
    spec["model"]["vocab"] = vocab
    if len(vocab) > MODEL_VOCAB or [vocab[s] for s in GEMMA_SPECIALS] != list(range(len(GEMMA_SPECIALS))):
        raise RuntimeError(f"the tokenizer's {len(vocab)} ids do not fit the model's {MODEL_VOCAB}, or its specials "
                           "moved")
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    decoder = {str(i): dict(content=s, lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
               for i, s in enumerate(GEMMA_SPECIALS)}
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="GemmaTokenizer", add_bos_token=True, add_eos_token=False, bos_token="<bos>",
        eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>", added_tokens_decoder=decoder,
        clean_up_tokenization_spaces=False, model_max_length=1000000000000000019884624838656)))
    (folder / "special_tokens_map.json").write_text(json.dumps(dict(
        bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")))


def install_in_hub_cache(folder, name):
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


def build_policy():
    """LeRobot's PI0Policy at pi0_tiny's sizes, the text table MODEL_VOCAB rows, pi0's 48 tokens."""
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    inputs = {make_ref.cam_key(c): PolicyFeature(type=FeatureType.VISUAL, shape=(3, h, w))
              for c, (h, w) in CAMERAS.items()}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    outputs = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    cfg = PI0Config(input_features=inputs, output_features=outputs, device="cpu", push_to_hub=False,
                    **dict(make_ref_pi0.POLICY, tokenizer_max_length=MAX_TEXT))
    make_ref_pi0.VOCAB = MODEL_VOCAB  # tiny_pi0_sizes sizes the text table from it when the model is built
    with make_ref_pi0.tiny_pi0_sizes():
        torch.manual_seed(SEED)
        policy = PI0Policy(cfg)
    make_ref.perturb_constant_params(policy, SEED + 1)
    return policy.eval(), cfg


def write_policy_checkpoint(policy, path, stats, tokenizer):
    """The policy's weights as a train_vla checkpoint of its config (read off the built model),
    LeRobot's train mode, the statistics and the tokenizer.json's name."""
    fields = dict(line.split() for line in make_ref_pi0.c_config_lines(policy))
    cfg = vla.SmolVLAConfig(**{k: int(v) for k, v in fields.items()})
    params = vla.from_lerobot(cfg, policy.state_dict())
    vla.write_checkpoint(str(path), cfg, vla.mode_of_policy(policy.config), stats,
                         {k: v.detach().numpy() for k, v in params.items()}, tokenizer=tokenizer.name)
    return cfg


def make_observation(g):
    """A raw batch: uint8 frames per camera at the dataset's sizes, raw state, the starting noise."""
    frames = {cam: torch.randint(0, 256, (BATCH, h, w, 3), generator=g, dtype=torch.uint8).numpy()
              for cam, (h, w) in CAMERAS.items()}
    state = (torch.randn(BATCH, STATE_DIM, generator=g) * 2).numpy()
    noise = torch.randn(BATCH, CHUNK, MAX_ACTION, generator=g).numpy()
    return frames, state, noise


# ----------------------------------------------------------------------------
# the two sides


def lerobot_actions(policy, pre, post, frames, state, tasks, noise):
    """LeRobot's own path: its pre-processor on the raw batch (a camera left out where frames holds
    None), predict_action_chunk from the noise, its post-processor: (B, H, A) float64."""
    batch = {make_ref.cam_key(c): make_ref.images_as_fed(torch.from_numpy(f)) for c, f in frames.items()
             if f is not None}
    batch["observation.state"] = torch.from_numpy(state).clone()
    batch["task"] = list(tasks)
    with torch.no_grad():
        chunk = policy.predict_action_chunk(pre(batch), noise=torch.from_numpy(noise).clone())
    return post(chunk).to(torch.float64).numpy()


def gpu_libraries():
    """The GPU builds to check: $VLA_GPU_LIBRARY's, else the emulated fp32 build if it is built."""
    named = [p for p in os.environ.get("VLA_GPU_LIBRARY", "").split(":") if p]
    if named:
        return named
    emulated = os.path.join(ROOT, "build", "emu", "libvla_gpu_fp32.so")
    return [emulated] if os.path.exists(emulated) else []


# ----------------------------------------------------------------------------
# the checks


def check_tokens(pre, folder, tokenizer, cfg, ckpt):
    """LeRobot's pre-processor's tokens against a TokenizerJSON shard's batch and VLAPolicy's ids."""
    step = next(s for s in pre.steps if type(s).__name__ == "TokenizerProcessorStep")
    at = step.input_tokenizer
    check(type(at).__name__ == "GemmaTokenizer" and step.tokenizer_name == HUB_NAME
          and (at.pad_token_id, at.bos_token_id) == (PAD_ID, BOS_ID) and len(at) == tokenizer.vocab,
          f"LeRobot's pi0 pre-processor loads {step.tokenizer_name} from the private hub cache as transformers' "
          f"{type(at).__name__} (pad {at.pad_token_id}, bos {at.bos_token_id}, {len(at)} ids; tokenizer.json "
          f"{tokenizer.vocab})")
    lens = [len(tokenizer.encode(t)) for t in TOKEN_TASKS]
    ids = [tokenizer.encode(t) for t in TOKEN_TASKS]
    fallback = any(((x >= len(GEMMA_SPECIALS)) & (x < len(GEMMA_SPECIALS) + 256)).any() for x in ids)
    check(all(x[0] == BOS_ID for x in ids) and max(lens) > MAX_TEXT and fallback
          and np.array_equal(ids[3], tokenizer.encode(TOKEN_TASKS[3][:-1])),
          f"the tasks' ids ({lens}): <bos> first, one longer than {MAX_TEXT}, unicode through byte fallback, a task "
          "ending in \"\\n\" tokenized as the same task without it")
    B = len(TOKEN_TASKS)
    n = 2 * B  # one 2-frame episode per task
    rng = np.random.default_rng(SEED)
    cams = [rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8) for h, w in CAMERAS.values()]
    shard = Path(TMP) / "tokens.bin"
    vla_shard.write_shard(str(shard), cams, rng.normal(size=(n, STATE_DIM)).astype(np.float32),
                          rng.normal(size=(n, ACTION_DIM)).astype(np.float32), [(2 * k, 2, k) for k in range(B)],
                          TOKEN_TASKS, tokenizer=tokenizer)
    ds = vla_shard.Dataset(str(shard))
    ours = vla.build_batch(ds, cfg, [2 * k for k in range(B)], SEED, 0)
    g = torch.Generator().manual_seed(SEED + 2)
    # every task, then the short ones alone: pi0 pads to 48 columns whatever the batch's longest
    for picks in (list(range(B)), [0, 4]):
        batch = {make_ref.cam_key(c): make_ref.images_as_fed(torch.randint(0, 256, (len(picks), h, w, 3), generator=g,
                                                                           dtype=torch.uint8))
                 for c, (h, w) in CAMERAS.items()}
        batch["observation.state"] = torch.randn(len(picks), STATE_DIM, generator=g)
        batch["task"] = [TOKEN_TASKS[k] for k in picks]
        out = pre(batch)
        theirs = out["observation.language.tokens"].numpy()
        their_mask = out["observation.language.attention_mask"].numpy()
        same = (theirs.shape == (len(picks), MAX_TEXT) and np.array_equal(ours["tokens"][picks], theirs)
                and np.array_equal(ours["token_mask"][picks] > 0, their_mask))
        check(ds.tokenizer == tokenizer.name and same,
              f"LeRobot's pre-processor (tokens, attention mask: {theirs.shape[0]} x {theirs.shape[1]}) on tasks of "
              f"{[lens[k] for k in picks]} ids equals the trainer's batch from a {tokenizer.name} shard in all "
              f"{MAX_TEXT} columns (pad id {PAD_ID}, mask 0 after the ids)")
        if picks == list(range(B)):
            pol = VLAPolicy(str(ckpt), threads=1, tokenizer=str(folder))
            rows = np.full((B, MAX_TEXT), PAD_ID, np.int64)
            for b, t in enumerate(TOKEN_TASKS):
                x = pol.text_tokenizer.encode(t)[:MAX_TEXT]
                rows[b, :len(x)] = x
            pol.close()
            check(np.array_equal(rows, theirs), "VLAPolicy's ids, cut to 48 and padded with the pad id, are LeRobot's")
    # the C trainer takes the shard on from the checkpoint: one name for one tokenizer
    run = Path(TMP) / "run"
    r = subprocess.run([os.path.join(ROOT, "train_vla_cpu"), "-i", str(shard), "--init", str(ckpt), "--weights-only",
                        "-n", "1", "-b", "2", "-u", "1", "-t", "1", "--workers", "1", "-o", str(run)],
                       capture_output=True, text=True)
    check(r.returncode == 0 and (run / "ckpt_00000001.bin").exists(),
          "./train_vla_cpu --init <the pi0 checkpoint> trains a step on the shard of its tokenizer"
          + ("" if r.returncode == 0 else ": " + (r.stdout + r.stderr)[-600:]))


def check_actions(name, make, tol, lerobot, frames, state, noise):
    """One library's VLAPolicy (make() opens it) against LeRobot's actions (lerobot(frames)): all
    cameras, each camera missing in turn, every camera missing, all cameras again."""
    pol = make()
    cams = list(CAMERAS)
    full = pol.act([frames[c] for c in cams], ACT_TASKS, state, noise=noise).astype(np.float64)
    e_abs, e_rel = io_test.errors(full, lerobot(frames))
    lens = [len(pol.text_tokenizer.encode(t)) for t in ACT_TASKS]
    check(e_rel <= tol and max(lens) > MAX_TEXT, f"{name} ({pol.device}) vs LeRobot on the raw observation (tasks of "
          f"{lens} ids): max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {tol:g})")
    for gone in cams:
        some = {c: (None if c == gone else frames[c]) for c in cams}
        got = pol.act([some[c] for c in cams], ACT_TASKS, state, noise=noise).astype(np.float64)
        want = lerobot(some)
        e_abs, e_rel = io_test.errors(got, want)
        moved = io_test.errors(want, full)[0]
        check(e_rel <= tol and moved > 0, f"{name}: camera {gone} missing (LeRobot: an image of -1 masked out; the "
              f"actions move by {moved:.3g}): max abs err {e_abs:.3g}, max rel err {e_rel:.3g} (tol {tol:g})")
    ok, msg = io_test.one_line_error(lambda: pol.act([None] * len(cams), ACT_TASKS, state, noise=noise), "at least one")
    check(ok, f"{name}: every camera missing is refused in one line: {msg}")
    values = (ctypes.c_int32 * len(CONFIG_FIELDS))()
    pol.lib.vla_policy_config(pol.handle, values)
    check(dict(zip(CONFIG_FIELDS, values)) == pol.config, f"{name}: after calls with a camera missing the library "
          f"still reports the checkpoint's config ({values[0]} cameras)")
    again = pol.act([frames[c] for c in cams], ACT_TASKS, state, noise=noise).astype(np.float64)
    check(np.array_equal(again, full), f"{name}: all cameras again after the missing ones: the first actions bit for "
          "bit")
    pol.close()


def main():
    t0 = time.time()
    for target in ("libvla.so", "train_vla_cpu"):
        if not os.path.exists(os.path.join(ROOT, target)):
            check(False, f"{target} is missing: make {target} first")
            check.finish()
    from lerobot.policies.factory import make_pre_post_processors

    make_ref.setup_torch()
    folder = Path(TMP) / "paligemma_tokenizer"
    build_tokenizer(folder)
    install_in_hub_cache(folder, HUB_NAME)
    tokenizer = vla_shard.TokenizerJSON(str(folder))
    policy, lcfg = build_policy()
    stats = io_test.make_stats(torch.Generator().manual_seed(SEED + 3), STATE_DIM, ACTION_DIM, CAMERAS)
    flat = np.concatenate([stats["observation.state"]["mean"], stats["observation.state"]["std"],
                           stats["action"]["mean"], stats["action"]["std"]]).astype(np.float32)
    with contextlib.redirect_stdout(io.StringIO()):
        pre, post = make_pre_post_processors(lcfg, dataset_stats=stats)
    ckpt = Path(TMP) / "pi0.bin"
    cfg = write_policy_checkpoint(policy, ckpt, flat, tokenizer)
    check((cfg.family, cfg.vocab, cfg.pad_token, cfg.max_text, cfg.n_cam) == (vla.FAMILY_PI0, MODEL_VOCAB, PAD_ID,
                                                                               MAX_TEXT, len(CAMERAS)),
          f"the checkpoint: pi0, a text table of {cfg.vocab} rows, pad id {cfg.pad_token}, {cfg.max_text} tokens, "
          f"{cfg.n_cam} cameras, tokenizer {tokenizer.name}")

    print("instruction tokens (LeRobot's pi0 pre-processor)")
    check_tokens(pre, folder, tokenizer, cfg, ckpt)

    print("actions from raw observations (LeRobot's PI0Policy)")
    frames, state, noise = make_observation(torch.Generator().manual_seed(SEED + 4))

    def lerobot(some):
        return lerobot_actions(policy, pre, post, some, state, ACT_TASKS, noise)

    check_actions("libvla.so", lambda: VLAPolicy(str(ckpt), threads=1, tokenizer=str(folder)), ACTION_TOL, lerobot,
                  frames, state, noise)
    libraries = gpu_libraries()
    if not libraries:
        print("(no GPU library: VLA_GPU_LIBRARY is not set and build/emu/libvla_gpu_fp32.so is not built)")
    for library in libraries:
        name = os.path.basename(library)
        try:
            opened = VLAPolicy(str(ckpt), library=library, device="cuda", tokenizer=str(folder))
        except (ValueError, FileNotFoundError, OSError) as e:
            check(False, f"{name} loads the checkpoint: {e}")
            continue
        tol = next((t for p, t in GPU_TOL.items() if f"({p})" in opened.device), GPU_TOL["bf16"])
        opened.close()
        check_actions(name, lambda: VLAPolicy(str(ckpt), library=library, device="cuda", tokenizer=str(folder)), tol,
                      lerobot, frames, state, noise)
    print(f"({time.time() - t0:.1f} s)")
    check.finish()


if __name__ == "__main__":
    main()
