"""
test_lerobot.py: checks data/lerobot_to_shards.py on LeRobot datasets it builds itself.

    build/venv/bin/python tests/data/test_lerobot.py

In a temporary folder it writes one small dataset in both LeRobot layouts: v2.1 (one parquet
and one mp4 per episode) and v3.0 (all episodes in one parquet and one mp4 per camera, found
through meta/episodes). 3 episodes of 5, 7 and 4 frames at 10 fps, 2 tasks, state dim 3,
action dim 2, and two cameras of different shapes:
  front  a "video" feature of 96x64 pixels (width x height), H.264 (or MPEG-4 where libx264 is
         missing) in yuv420p
  wrist  an "image" feature of 64x96 (taller than wide), PNG bytes in the parquet
Every frame is a solid colour that encodes (episode, frame), with 8-pixel bands of another colour
at both ends of its longer side. --frame fit (the default; --img 48 here) must store each camera
at its own size with the aspect kept (front 48x32, wrist 32x48: width x height), equal frame by
frame to PIL's bilinear resize of the source frame, bands included (nothing cut); --img 0 and an
--img above the source's size must keep the source's size. --frame crop --img 16 must cut the
bands off exactly (the square center crop) and store 16x16. The lossy codec's colours must come
out within TOL levels. The converter runs as a subprocess, as a user runs it, and the shards are
read back with vla_shard.Dataset; train_vla_cpu (built by `make train_vla_cpu`) trains two steps
on the fit and the --img 0 shards, whose cameras are not square and differ in size. A camera
whose frames change size is a one-line error under fit and converts under crop.
--tokenizer: a byte-level BPE tokenizer.json trained here (tokenizers package) on the tasks: the
shards hold the ids it gives for task + "\\n" (what LeRobot's SmolVLA pre-processor feeds), name it
"tokenizer.json:<sha256 prefix>", carry its vocabulary; a model folder works as its tokenizer.json;
a missing file, a file that is no tokenizer.json and a tokenizer that adds an EOS are one-line errors.
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from io import BytesIO

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")  # the tools under test
sys.path.insert(0, DATA)
from vla_shard import Dataset, TokenizerJSON, text_collision_warnings, tokenizer_json_id  # noqa: E402

CONVERTER = os.path.join(DATA, "lerobot_to_shards.py")
FPS = 10
LENGTHS = [5, 7, 4]
# the two instructions share their first 16 bytes: the converter must warn that the tiny preset
# (16 bytes) reads them as one task
TASKS = ["pick up the red cube", "pick up the red block and stack it"]
EPISODE_TASK = [0, 1, 0]
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
SOURCE = {FRONT: (64, 96), WRIST: (96, 64)}  # (height, width) of each camera's frames
BAND = 8  # the square crop cuts 16 pixels off each end of the longer side
IMG = 48  # --img of the fit conversions: the longer side, 96 -> 48
CROP_IMG = 16  # --img of the crop conversions: the 64-pixel square is resized down
STORED = {  # (height, width) stored per camera, written out by hand
    "fit": {FRONT: (32, 48), WRIST: (48, 32)},
    "crop": {FRONT: (16, 16), WRIST: (16, 16)},
    "source": SOURCE,  # --img 0, and an --img larger than the frames (fit never scales up)
}
TOL = 12  # colour levels allowed after lossy video coding and resizing
PROGRESS = re.compile(r"\d+/\d+ episodes, .*ETA \S+")  # the converter's per-episode stderr line

passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {name}")
    else:
        failed += 1
        print(f"FAIL  {name}" + (f": {detail}" if detail else ""))
    return ok


# --------------------------------------------------------------------------------------------
# the fixture

def front_colour(e, i):
    return (10 * i, 40 * e, 128)


def wrist_colour(e, i):
    return (200 - 10 * i, 40 * e + 20, 30)


FRONT_BAND, WRIST_BAND = (250, 250, 250), (0, 0, 0)


def frame(cam, colour, band):
    """A camera's frame: the colour, with bands at both ends of the longer side."""
    h, w = SOURCE[cam]
    a = np.empty((h, w, 3), np.uint8)
    a[:] = colour
    if w >= h:
        a[:, :BAND], a[:, w - BAND:] = band, band
    else:
        a[:BAND], a[h - BAND:] = band, band
    return a


def source_frame(cam, e, i):
    return frame(cam, front_colour(e, i), FRONT_BAND) if cam == FRONT else frame(cam, wrist_colour(e, i), WRIST_BAND)


def state_of(e, i):
    return [float(e), float(i), 0.5 * i + 0.125]  # exact in float32


def action_of(e, i):
    return [10.0 * e + i, -0.25 * i]


def png(a):
    buf = BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def pick_codec():
    """libx264 as LeRobot datasets often use; MPEG-4 part 2 where this FFmpeg build lacks it."""
    try:
        av.codec.Codec("libx264", "w")
        return "libx264"
    except Exception:
        return "mpeg4"


def write_video(path, frames, codec):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with av.open(path, "w") as out:
        s = out.add_stream(codec, rate=FPS)
        s.height, s.width = SOURCE[FRONT]
        s.pix_fmt = "yuv420p"
        if codec == "libx264":
            s.options = {"crf": "10", "preset": "veryfast"}  # near-lossless: colours survive within a few levels
        else:
            s.bit_rate = 4_000_000
        for i, rgb in enumerate(frames):
            f = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            f.pts, f.time_base = i, Fraction(1, FPS)  # frame i at i / FPS seconds
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode():
            out.mux(p)


def features(version):
    (h, w), (wh, ww) = SOURCE[FRONT], SOURCE[WRIST]
    video_info = {"video.height": h, "video.width": w, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                  "video.fps": FPS, "video.channels": 3, "has_audio": False}
    return {  # cameras first on purpose in a different order than their data columns
        FRONT: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                ("info" if version == "v3.0" else "video_info"): video_info},
        "observation.state": {"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]},
        WRIST: {"dtype": "image", "shape": [wh, ww, 3], "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["a", "b"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }


def data_table(episodes, fixed_size):
    """The parquet rows of the given episodes, LeRobot's columns (global `index` counts from 0
    over all episodes)."""
    cols = {k: [] for k in ["observation.state", "action", WRIST, "timestamp", "frame_index", "episode_index",
                            "index", "task_index"]}
    for e in episodes:
        for i in range(LENGTHS[e]):
            cols["observation.state"].append(state_of(e, i))
            cols["action"].append(action_of(e, i))
            cols[WRIST].append({"bytes": png(source_frame(WRIST, e, i)), "path": None})
            cols["timestamp"].append(i / FPS)  # episode-local in both versions
            cols["frame_index"].append(i)
            cols["episode_index"].append(e)
            cols["index"].append(sum(LENGTHS[:e]) + i)
            cols["task_index"].append(EPISODE_TASK[e])
    f32 = pa.float32()
    return pa.table({
        # v2.1 as a variable list, v3.0 as a fixed-size list: the converter must read both
        "observation.state": pa.array(cols["observation.state"], pa.list_(f32, 3) if fixed_size else pa.list_(f32)),
        "action": pa.array(cols["action"], pa.list_(f32, 2) if fixed_size else pa.list_(f32)),
        WRIST: pa.array(cols[WRIST], pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "timestamp": pa.array(cols["timestamp"], f32),
        "frame_index": pa.array(cols["frame_index"], pa.int64()),
        "episode_index": pa.array(cols["episode_index"], pa.int64()),
        "index": pa.array(cols["index"], pa.int64()),
        "task_index": pa.array(cols["task_index"], pa.int64()),
    })


def front_frames(e):
    return [source_frame(FRONT, e, i) for i in range(LENGTHS[e])]


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def build_v21(root, codec):
    info = {"codebase_version": "v2.1", "robot_type": None, "total_episodes": 3, "total_frames": sum(LENGTHS),
            "total_tasks": 2, "total_videos": 3, "total_chunks": 1, "chunks_size": 1000, "fps": FPS,
            "splits": {"train": "0:3"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": features("v2.1")}
    write_json(f"{root}/meta/info.json", info)
    with open(f"{root}/meta/tasks.jsonl", "w") as f:
        for k, t in enumerate(TASKS):
            f.write(json.dumps({"task_index": k, "task": t}) + "\n")
    with open(f"{root}/meta/episodes.jsonl", "w") as f:
        for e, n in enumerate(LENGTHS):
            f.write(json.dumps({"episode_index": e, "tasks": [TASKS[EPISODE_TASK[e]]], "length": n}) + "\n")
    os.makedirs(f"{root}/data/chunk-000")
    for e in range(len(LENGTHS)):
        pq.write_table(data_table([e], False), f"{root}/data/chunk-000/episode_{e:06d}.parquet")
        write_video(f"{root}/videos/chunk-000/{FRONT}/episode_{e:06d}.mp4", front_frames(e), codec)


def build_v30(root, codec):
    info = {"codebase_version": "v3.0", "robot_type": None, "total_episodes": 3, "total_frames": sum(LENGTHS),
            "total_tasks": 2, "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
            "fps": FPS, "splits": {"train": "0:3"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": features("v3.0")}
    write_json(f"{root}/meta/info.json", info)
    # tasks.parquet as pandas writes a frame indexed by the task string (what LeRobot does)
    tasks = pa.table({"task_index": pa.array(range(len(TASKS)), pa.int64()), "__index_level_0__": TASKS})
    pandas_meta = {"index_columns": ["__index_level_0__"], "column_indexes": [], "columns": []}
    tasks = tasks.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    pq.write_table(tasks, f"{root}/meta/tasks.parquet")
    eps = len(LENGTHS)
    starts = [sum(LENGTHS[:e]) for e in range(eps)]
    meta = {
        "episode_index": list(range(eps)), "tasks": [[TASKS[EPISODE_TASK[e]]] for e in range(eps)],
        "length": LENGTHS, "data/chunk_index": [0] * eps, "data/file_index": [0] * eps,
        "dataset_from_index": starts, "dataset_to_index": [s + n for s, n in zip(starts, LENGTHS)],
        f"videos/{FRONT}/chunk_index": [0] * eps, f"videos/{FRONT}/file_index": [0] * eps,
        f"videos/{FRONT}/from_timestamp": [s / FPS for s in starts],
        f"videos/{FRONT}/to_timestamp": [(s + n) / FPS for s, n in zip(starts, LENGTHS)],
        "meta/episodes/chunk_index": [0] * eps, "meta/episodes/file_index": [0] * eps,
        "stats/action/mean": [[0.0, 0.0]] * eps,  # a per-episode stats column, as LeRobot writes: ignored
    }
    os.makedirs(f"{root}/meta/episodes/chunk-000")
    pq.write_table(pa.table(meta), f"{root}/meta/episodes/chunk-000/file-000.parquet")
    os.makedirs(f"{root}/data/chunk-000")
    pq.write_table(data_table(range(eps), True), f"{root}/data/chunk-000/file-000.parquet")
    write_video(f"{root}/videos/{FRONT}/chunk-000/file-000.mp4",
                [f for e in range(eps) for f in front_frames(e)], codec)


# --------------------------------------------------------------------------------------------
# running the converter and checking its shards

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer(folder, template=None):
    """A byte-level BPE like SmolVLM's (no BOS/EOS unless `template`, a TemplateProcessing single
    string over SPECIALS), trained on the tasks with a small merge budget, saved as
    folder/tokenizer.json; returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=len(SPECIALS) + 256 + 30, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([t + "\n" for t in TASKS] * 3, trainer=trainer)
    if template is not None:
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[
            (t, tok.token_to_id(t)) for t in SPECIALS if t in template])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    return path


def check_tokenizer_shards(tmp, res, tok_path, bytes_ds):
    """The --tokenizer conversions: ids, header, vocabulary, the rest as the bytes conversion."""
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(tok_path)  # the ids as the tokenizers library gives them, independently
    want_ids = [raw.encode(t + "\n").ids for t in TASKS]
    name, vocab = tokenizer_json_id(tok_path), raw.get_vocab_size(with_added_tokens=True)
    for key, label in (("tok", "--tokenizer FILE"), ("tokdir", "--tokenizer FOLDER")):
        if not check_run(label, *res[key]):
            continue
        ds = check_dataset(label, f"{tmp}/out_{key}")
        if ds is None:
            continue
        s = ds.shards[0]
        got = [s.task_tokens(k).tolist() for k in range(s.n_tasks)]
        check(f"{label}: each task's ids are the tokenizer's for task + \"\\n\" (as LeRobot feeds them), not its "
              f"bytes ({[len(x) for x in got]} ids)",
              got == want_ids and got != [list(t.encode()) for t in TASKS], f"got {got}, want {want_ids}")
        check(f"{label}: the header names {name} with its vocabulary of {vocab}",
              (s.tokenizer, s.vocab) == (name, vocab) and name.startswith("tokenizer.json:"), f"{s.tokenizer}, {s.vocab}")
        if bytes_ds is not None:
            b = bytes_ds.shards[0]
            same = (all(np.array_equal(s.camera_images(k), b.camera_images(k)) for k in range(s.n_cam))
                    and np.array_equal(s.state, b.state)
                    and np.array_equal(s.episodes, b.episodes) and bytes(s.task_text) == bytes(b.task_text))
            check(f"{label}: images, state, episodes and task text as the bytes conversion's", same)
    check_error("--tokenizer naming no file", res["tokmissing"], "--tokenizer: tokenizer")
    check_error("--tokenizer naming a file that is no tokenizer.json", res["toknotjson"], "not a tokenizer.json")
    check_error("--tokenizer whose post-processor appends an EOS", res["tokeos"], "some after the text")
    for key in ("tokmissing", "toknotjson", "tokeos"):
        check(f"{key}: no output folder is left behind", not os.path.exists(f"{tmp}/out_{key}"))

    # the tokenizer object itself: special tokens before the text are LeRobot's too (kept), the
    # newline is added once, and the collision warnings count tokens for the presets that read them
    bos = TokenizerJSON(build_tokenizer(f"{tmp}/tok_bos", f"{SPECIALS[1]} $A"))
    t = TokenizerJSON(tok_path)
    check("a post-processor's BOS is kept (add_special_tokens, as LeRobot's call); \"\\n\" is added once",
          bos.encode(TASKS[0]).tolist() == [raw.token_to_id(SPECIALS[1])] + want_ids[0]
          and t.encode(TASKS[0] + "\n").tolist() == want_ids[0], f"{bos.encode(TASKS[0]).tolist()}")
    long = [" ".join(["pick up the red cube"] * 12) + tail for tail in (" now", " later")]
    lines = text_collision_warnings(long, t)
    check("collision warnings count tokens: two instructions equal in their first 48 ids warn for smolvla "
          "only (tiny and small read 256 ids, this tokenizer has more)",
          len(lines) == 1 and "48 tokens preset smolvla" in lines[0] and all(f'"{x}"' in lines[0] for x in long),
          str(lines))


def convert(src, out, *extra):
    """The converter on src, at --img IMG unless extra names another --img."""
    img = [] if "--img" in extra else ["--img", str(IMG)]
    r = subprocess.run([sys.executable, CONVERTER, src, "-o", out, *img, *extra],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def check_run(name, rc, stdout, stderr):
    return check(f"{name}: converter exits 0", rc == 0, f"rc {rc}, stderr: {stderr.strip()[-400:]}")


def expected_episodes(episodes):
    return [(e, LENGTHS[e]) for e in episodes]


def check_dataset(name, out, episodes=(0, 1, 2), cams=(FRONT, WRIST), stored="fit"):
    """Every property of the converted dataset against what the fixture holds; `stored` names the
    camera sizes of STORED that the conversion's --frame and --img give."""
    try:
        ds = Dataset(out)
    except ValueError as e:
        check(f"{name}: shards open with vla_shard.Dataset", False, str(e))
        return None
    s = ds.shards[0]
    n = sum(LENGTHS[e] for e in episodes)
    sizes = [STORED[stored][c] for c in cams]
    side = CROP_IMG if stored == "crop" else 0  # the header's img: the side when all are square, else 0
    got = (ds.n_cam, ds.img, ds.state_dim, ds.action_dim, list(zip(ds.cam_height, ds.cam_width)))
    check(f"{name}: sizes (cameras {len(cams)} of {sizes} height x width, img {side}, state 3, action 2)",
          got == (len(cams), side, 3, 2, sizes), f"got {got}")
    check(f"{name}: {len(episodes)} episodes, {n} frames",
          (sum(x.n_episodes for x in ds.shards), ds.n_samples) == (len(episodes), n),
          f"got {sum(x.n_episodes for x in ds.shards)} episodes, {ds.n_samples} frames")
    # episodes in order with their lengths and task strings, back to back in each shard
    got = [(int(ep["length"]), x.task(int(ep["task"])).decode()) for x in ds.shards for ep in x.episodes]
    want = [(LENGTHS[e], TASKS[EPISODE_TASK[e]]) for e in episodes]
    packed = all(np.array_equal(x.episodes["first_frame"], np.cumsum(x.episodes["length"]) - x.episodes["length"])
                 and int(x.episodes["length"].sum()) == x.n_frames for x in ds.shards)
    check(f"{name}: episode table (lengths {[LENGTHS[e] for e in episodes]}, tasks, first frames)",
          got == want and packed, f"got {got}, want {want}, packed {packed}")
    used = sorted({EPISODE_TASK[e] for e in episodes})
    check(f"{name}: task table holds the tasks used", len(ds.shards) > 1 or
          [s.task(k).decode() for k in range(s.n_tasks)] == [TASKS[t] for t in used],
          f"got {[s.task(k) for k in range(s.n_tasks)]}")
    rows = [(e, i) for e in episodes for i in range(LENGTHS[e])]
    state = np.concatenate([x.state for x in ds.shards])
    action = np.concatenate([x.action for x in ds.shards])
    check(f"{name}: state values exact", np.array_equal(state, np.array([state_of(e, i) for e, i in rows], np.float32)))
    check(f"{name}: action values exact",
          np.array_equal(action, np.array([action_of(e, i) for e, i in rows], np.float32)))
    colour = {FRONT: front_colour, WRIST: wrist_colour}
    band = {FRONT: FRONT_BAND, WRIST: WRIST_BAND}
    for c, cam in enumerate(cams):
        if c >= ds.n_cam or (ds.cam_height[c], ds.cam_width[c]) != sizes[c]:
            continue  # the size check above failed: the pixels cannot be compared
        images = np.concatenate([x.camera_images(c) for x in ds.shards]).astype(np.int64)
        lossless = cam == WRIST  # PNG: the only change is the converter's resize
        limit = 0 if lossless else TOL
        how = "exact" if lossless else f"within {TOL}"
        if stored == "crop":  # the bands are cut off: a solid square, whatever the resize
            want = np.array([colour[cam](e, i) for e, i in rows])[:, None, None, :]
            what = "every pixel its frame's colour (the bands cut off)"
        else:  # the whole frame, resized as PIL resizes it (or kept as it is)
            h, w = sizes[c]
            want = np.stack([np.asarray(Image.fromarray(source_frame(cam, e, i)).resize((w, h), Image.BILINEAR))
                             for e, i in rows]).astype(np.int64)
            what = f"each frame PIL's bilinear resize of its {SOURCE[cam][0]}x{SOURCE[cam][1]} source frame"
        err = np.abs(images - want)
        worst = int(err.max())
        check(f"{name}: camera {c} is {cam.split('.')[-1]}, {what} ({how}; worst {worst})", worst <= limit,
              f"worst pixel off by {worst} at frame {int(err.reshape(len(rows), -1).max(1).argmax())}")
        if stored != "crop":
            # nothing cut, independently of PIL: the outermost rows (portrait) or columns (landscape)
            # of the longer side are pure band (the band is 8 pixels, at most 2x shrunk here)
            ends = images[:, :, [0, -1]] if sizes[c][1] >= sizes[c][0] else images[:, [0, -1]]
            off = int(np.abs(ends - np.array(band[cam])).max())
            check(f"{name}: camera {c} is whole: the bands at both ends of its longer side are kept "
                  f"({how}; worst {off})", off <= limit)
    st = np.concatenate([x.stats for x in ds.shards])
    check(f"{name}: normalization statistics finite", bool(np.isfinite(st).all()))
    ref = np.concatenate([state.astype(np.float64), action.astype(np.float64)], 1)
    mean, std = ref.mean(0), ref.std(0)
    got_mean = np.concatenate([ds.state_mean, ds.action_mean])
    got_std = np.concatenate([ds.state_std, ds.action_std])
    std_want = np.where(std < 1e-6, 1.0, std)  # constant dims read back as std 1 (centered only)
    check(f"{name}: pooled statistics are the frames' mean and std",
          np.allclose(got_mean, mean, rtol=1e-5, atol=1e-5) and np.allclose(got_std, std_want, rtol=1e-4, atol=1e-5),
          f"mean {got_mean} vs {mean}, std {got_std} vs {std_want}")
    return ds


def check_error(name, result, expect):
    """A bad input: exit status 1 and, besides progress lines, one stderr line `error: ...` that
    names the problem."""
    rc, stdout, stderr = result
    lines = [x for x in stderr.strip().splitlines() if not PROGRESS.fullmatch(x)]
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0] \
        and "Traceback" not in stderr
    check(f"{name}: exit 1 with one `error:` line naming {expect!r}", ok, f"rc {rc}, stderr {stderr.strip()!r}")


def build_bad(tmp, v21, v30, codec):
    """Broken copies of the fixture: {name: folder}."""
    bad = {}

    def copy(name, src):
        bad[name] = f"{tmp}/bad_{name}"
        shutil.copytree(src, bad[name])
        return bad[name]

    os.remove(f"{copy('noinfo', v21)}/meta/info.json")
    p = f"{copy('noaction', v21)}/data/chunk-000/episode_000000.parquet"
    pq.write_table(pq.read_table(p).drop_columns(["action"]), p)
    p = f"{copy('version', v30)}/meta/info.json"
    with open(p) as f:
        info = json.load(f)
    info["codebase_version"] = "v1.6"
    write_json(p, info)
    with open(f"{copy('video', v21)}/videos/chunk-000/{FRONT}/episode_000001.mp4", "wb") as f:
        f.write(b"\0not a video" * 100)
    # episode 1's video one frame short of its data
    write_video(f"{copy('short', v21)}/videos/chunk-000/{FRONT}/episode_000001.mp4", front_frames(1)[:-1], codec)
    # the episode list says 8 frames where the data holds 7
    p = f"{copy('length', v30)}/meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    pq.write_table(t.set_column(t.schema.get_field_index("length"), "length", pa.array([5, 8, 4], pa.int64())), p)
    # episode 1's wrist frame 2 of another size (64x80, width x height: stored at 38x48) than the others
    p = f"{copy('resized', v21)}/data/chunk-000/episode_000001.parquet"
    t = pq.read_table(p)
    cells = t.column(WRIST).to_pylist()
    cells[2] = {"bytes": png(source_frame(WRIST, 1, 2)[8:88]), "path": None}
    pq.write_table(t.set_column(t.schema.get_field_index(WRIST), WRIST, pa.array(cells, t.schema.field(WRIST).type)), p)
    # episode 1's state at frame 3 NaN (v2.1); episode 2's action at frame 1 past float32's range, in a
    # float64 column (v3.0); chunks_size 0; a task holding an unpaired surrogate
    p = f"{copy('nanstate', v21)}/data/chunk-000/episode_000001.parquet"
    t = pq.read_table(p)
    rows = t.column("observation.state").to_pylist()
    rows[3][1] = float("nan")
    pq.write_table(t.set_column(t.schema.get_field_index("observation.state"), "observation.state",
                                pa.array(rows, t.schema.field("observation.state").type)), p)
    p = f"{copy('bigaction', v30)}/data/chunk-000/file-000.parquet"
    t = pq.read_table(p)
    rows = t.column("action").to_pylist()
    rows[LENGTHS[0] + LENGTHS[1] + 1][0] = 1e39
    pq.write_table(t.set_column(t.schema.get_field_index("action"), "action", pa.array(rows, pa.list_(pa.float64(), 2))), p)
    p = f"{copy('chunks0', v21)}/meta/info.json"
    with open(p) as f:
        info = json.load(f)
    info["chunks_size"] = 0
    write_json(p, info)
    with open(f"{copy('surrogate', v21)}/meta/tasks.jsonl", "w") as f:
        for k, t in enumerate(TASKS):
            f.write(json.dumps({"task_index": k, "task": t + ("\ud800" if k == 0 else "")}) + "\n")
    # meta/info.json valid JSON but not LeRobot's: a list, a string, an empty object
    for name, info in (("infolist", [1, 2]), ("infostring", "x"), ("infoempty", {})):
        bad[name] = f"{tmp}/bad_{name}"
        write_json(f"{bad[name]}/meta/info.json", info)
    return bad


# Runs the converter with Ctrl-C arriving while the second episode's video is decoded (Python
# raises KeyboardInterrupt there), after the staging folder and episode 0's shard exist.
INTERRUPTED = """
import sys
sys.path.insert(0, {here!r})
import lerobot_to_shards as tool
decode, calls = tool.VideoReader.frames_at, []
def frames_at(self, *args):
    calls.append(1)
    if len(calls) == 2:
        raise KeyboardInterrupt
    return decode(self, *args)
tool.VideoReader.frames_at = frames_at
sys.argv = ["lerobot_to_shards.py", {src!r}, "-o", {out!r}, "--img", "16", "--frames-per-shard", "5"]
tool.main()
"""


def convert_interrupted(src, out):
    r = subprocess.run([sys.executable, "-c", INTERRUPTED.format(here=DATA, src=src, out=out)],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def main():
    codec = pick_codec()
    tmp = tempfile.mkdtemp(prefix="test_lerobot_")
    try:
        v21, v30 = f"{tmp}/pusht_v21", f"{tmp}/pusht_v30"
        build_v21(v21, codec)
        build_v30(v30, codec)
        bad = build_bad(tmp, v21, v30, codec)
        tok_path = build_tokenizer(f"{tmp}/tok_model")
        tok_eos = build_tokenizer(f"{tmp}/tok_eos", f"$A {SPECIALS[2]}")
        with open(f"{tmp}/not_a_tokenizer.json", "w") as f:
            f.write('{"model": 3}')
        print(f"fixture: LeRobot v2.1 and v3.0, episodes {LENGTHS}, video codec {codec} yuv420p, in {tmp}")

        # a folder that exists before a failing conversion, with a file of its own
        keep = f"{tmp}/out_keep"
        os.makedirs(keep)
        with open(f"{keep}/notes.txt", "w") as f:
            f.write("not a shard\n")

        # every conversion at once (each is mostly Python start-up), checked below in order
        runs = {
            "v2.1": (v21,), "v3.0": (v30,),
            "v2.1 crop": (v21, "--frame", "crop", "--img", str(CROP_IMG)),
            "v3.0 crop": (v30, "--frame", "crop", "--img", str(CROP_IMG)),
            "img0": (v30, "--img", "0"), "img128": (v21, "--img", "128"), "img50": (v30, "--img", "50"),
            "resized": (bad["resized"],), "resizedcrop": (bad["resized"], "--frame", "crop", "--img", str(CROP_IMG)),
            "swapped": (v30, "--cameras", f"{WRIST},{FRONT}"), "one": (v21, "--cameras", FRONT),
            "split": (v30, "--frames-per-shard", "12"), "long": (v21, "--frames-per-shard", "6"),
            "range3": (v30, "--episodes", "1:3"), "range2": (v21, "--episodes", "1:"),
            "noinfo": (bad["noinfo"],), "noaction": (bad["noaction"],), "statekey": (v30, "--state-key", "joints"),
            "version": (bad["version"],), "video": (bad["video"],),
            # episode 0 is already written as a shard when episode 1 fails
            "short": (bad["short"], "--frames-per-shard", "5"), "length": (bad["length"],),
            "cameras": (v30, "--cameras", "observation.images.top"), "episodes": (v30, "--episodes", "7:9"),
            "infolist": (bad["infolist"],), "infostring": (bad["infostring"],), "infoempty": (bad["infoempty"],),
            "img": (v30, "--img", "4"),
            "nanstate": (bad["nanstate"],), "bigaction": (bad["bigaction"],), "chunks0": (bad["chunks0"],),
            "surrogate": (bad["surrogate"],),
            # fails after episode 0's shard: into new nested folders, and into a folder that was there
            "nested": (bad["short"], "--frames-per-shard", "5"), "keep": (bad["short"], "--frames-per-shard", "5"),
            "tok": (v30, "--tokenizer", tok_path), "tokdir": (v30, "--tokenizer", os.path.dirname(tok_path)),
            "tokmissing": (v30, "--tokenizer", f"{tmp}/missing/tokenizer.json"),
            "toknotjson": (v30, "--tokenizer", f"{tmp}/not_a_tokenizer.json"), "tokeos": (v30, "--tokenizer", tok_eos),
        }
        outs = {"nested": f"{tmp}/out_nested/a/b", "keep": keep}
        with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
            jobs = {k: pool.submit(convert, a[0], outs.get(k, f"{tmp}/out_{k}"), *a[1:]) for k, a in runs.items()}
            jobs["interrupted"] = pool.submit(convert_interrupted, v21, f"{tmp}/out_interrupted/a")
            res = {k: j.result() for k, j in jobs.items()}

        results = {}
        for name in ("v2.1", "v3.0"):
            out, src = f"{tmp}/out_{name}", runs[name][0]
            rc, stdout, stderr = res[name]
            if check_run(name, rc, stdout, stderr):
                check(f"{name}: summary names episodes, frames, tasks, cameras and their sizes, shards",
                      f"3 episodes, 16 frames, 2 task(s), 2 camera(s) ({FRONT} 32x48, {WRIST} 48x32, height x width, "
                      "--frame fit)" in stdout and "1 shard(s)" in stdout, stdout.strip())
                check(f"{name}: shard named after the dataset folder",
                      sorted(os.listdir(out)) == [f"{os.path.basename(src)}_000.bin"], str(os.listdir(out)))
                check(f"{name}: a progress line per episode on stderr",
                      [x for x in stderr.splitlines() if PROGRESS.fullmatch(x)] != [] and
                      stderr.count(" episodes, ") == 3, stderr.strip())
                warned = [x for x in stderr.splitlines() if x.startswith("warning: cut to the 16 bytes preset tiny")]
                check(f"{name}: a warning names the two instructions that the tiny preset reads as one",
                      len(warned) == 1 and all(f'"{t}"' in warned[0] for t in TASKS) and "--max-text 17" in warned[0],
                      stderr.strip()[-400:])
                results[name] = check_dataset(name, out)

        # --frame crop: the old square frames, the bands cut off
        for name in ("v2.1 crop", "v3.0 crop"):
            if check_run(f"{name} --img {CROP_IMG}", *res[name]):
                results[name] = check_dataset(f"{name} --img {CROP_IMG}", f"{tmp}/out_{name}", stored="crop")

        for v21_key, v30_key in (("v2.1", "v3.0"), ("v2.1 crop", "v3.0 crop")):
            if results.get(v21_key) and results.get(v30_key):
                a, b = results[v21_key].shards[0], results[v30_key].shards[0]
                same = (np.array_equal(a.state, b.state) and np.array_equal(a.action, b.action)
                        and np.array_equal(a.episodes, b.episodes) and bytes(a.task_text) == bytes(b.task_text)
                        and np.array_equal(a.stats, b.stats) and np.array_equal(a.camera_images(1), b.camera_images(1)))
                noise = int(np.abs(a.camera_images(0).astype(int) - b.camera_images(0).astype(int)).max())
                check(f"{v21_key} and {v30_key} give the same shard (video pixels differ by {noise} <= {TOL}: "
                      "codec noise)", same and noise <= TOL)

        # --img 0 keeps the source's size; so does an --img above it (fit never scales up); an --img
        # that no preset's patch divides is fine (the model resizes any size)
        for key, name in (("img0", "--img 0"), ("img128", "--img 128 (above the frames' 96)")):
            if check_run(name, *res[key]):
                check_dataset(name, f"{tmp}/out_{key}", stored="source")
        if check_run("--img 50", *res["img50"]):
            ds = Dataset(f"{tmp}/out_img50")
            got = list(zip(ds.cam_height, ds.cam_width))
            check("--img 50: front 33x50, wrist 50x33 (height x width; 64 * 50 / 96 = 33.3 rounds to 33)",
                  got == [(33, 50), (50, 33)], str(got))

        # the frames of a camera change size: fit cannot store them, crop can
        check_error("a camera whose frames change size, under --frame fit", res["resized"],
                    f"camera '{WRIST}' episode 1 frame 2 is stored at 48x38 but its earlier frames at 48x32")
        check("a camera whose frames change size: no output folder is left behind",
              not os.path.exists(f"{tmp}/out_resized"))
        if check_run("a camera whose frames change size, under --frame crop", *res["resizedcrop"]):
            ds = Dataset(f"{tmp}/out_resizedcrop")
            check("--frame crop stores the camera whose frames change size at 16x16",
                  (ds.img, ds.n_samples) == (CROP_IMG, 16), f"img {ds.img}, {ds.n_samples} frames")

        # train_vla reads the shards: cameras that are not square and differ in size (fit), and at
        # the source's size
        trainer = os.path.join(ROOT, "train_vla_cpu")
        for key in ("v3.0", "img0"):
            if not os.path.isfile(f"{tmp}/out_{key}/pusht_v30_000.bin"):
                check(f"train_vla_cpu on the {key} shards", False, "no shards (their conversion failed)")
                continue
            if not os.access(trainer, os.X_OK):
                check(f"train_vla_cpu on the {key} shards", False, f"{trainer} is missing: run `make train_vla_cpu`")
                continue
            r = subprocess.run([trainer, "-p", "tiny", "-n", "2", "-b", "2", "-t", "1", "-i", f"{tmp}/out_{key}",
                                "-o", f"{tmp}/run_{key}"], capture_output=True, text=True, timeout=300)
            check(f"train_vla_cpu -p tiny trains 2 steps on the {key} shards",
                  r.returncode == 0 and "step     2/2" in r.stdout, f"rc {r.returncode}: {r.stderr.strip()[-400:]}")

        check_tokenizer_shards(tmp, res, tok_path, results.get("v3.0"))

        # cameras in the order --cameras gives
        if check_run("--cameras wrist,front", *res["swapped"]):
            check_dataset("--cameras wrist,front", f"{tmp}/out_swapped", cams=(WRIST, FRONT))
        if check_run("--cameras front", *res["one"]):
            check_dataset("--cameras front", f"{tmp}/out_one", cams=(FRONT,))

        # whole episodes per shard: 5 + 7 fill 12 frames, the episode of 4 starts the next shard
        if check_run("--frames-per-shard 12", *res["split"]):
            ds = check_dataset("--frames-per-shard 12", f"{tmp}/out_split")
            if ds:
                check("--frames-per-shard 12: shards of 12 and 4 frames, each with its own task table",
                      [x.n_frames for x in ds.shards] == [12, 4] and
                      [x.task(k).decode() for x in ds.shards for k in range(x.n_tasks)] == TASKS + [TASKS[0]],
                      f"{[x.n_frames for x in ds.shards]}")
        # an episode longer than the limit gets a shard of its own
        out = f"{tmp}/out_long"
        if check_run("--frames-per-shard 6", *res["long"]):
            ds = Dataset(out)
            check("--frames-per-shard 6: one shard per episode (5, 7, 4 frames)",
                  [x.n_frames for x in ds.shards] == LENGTHS, f"{[x.n_frames for x in ds.shards]}")
            # a new conversion into the same folder with fewer shards removes the old extra ones
            rc, stdout, stderr = convert(v21, out)
            check("rerun into the same folder leaves only the new shard",
                  rc == 0 and sorted(os.listdir(out)) == ["pusht_v21_000.bin"], str(sorted(os.listdir(out))))
            # a failing conversion under the same name leaves that dataset as it was
            rc, stdout, stderr = convert(bad["short"], out, "--name", "pusht_v21", "--frames-per-shard", "5")
            check("failed rerun into the same folder keeps the earlier shard whole",
                  rc == 1 and sorted(os.listdir(out)) == ["pusht_v21_000.bin"] and Dataset(out).n_samples == 16,
                  f"rc {rc}, {sorted(os.listdir(out))}")

        # a range of episodes: in v3.0 this starts inside the shared video (at 0.5 s)
        for key, name in (("range3", "v3.0 --episodes 1:3"), ("range2", "v2.1 --episodes 1:")):
            if check_run(name, *res[key]):
                check_dataset(name, f"{tmp}/out_{key}", episodes=(1, 2))

        # bad inputs: one line each, exit 1, nothing left behind
        check_error("missing meta/info.json", res["noinfo"], "meta/info.json")
        check_error("data without an action column", res["noaction"], "--action-key")
        check_error("--state-key naming no column", res["statekey"], "'joints'")
        check_error("unknown codebase_version", res["version"], "v1.6")
        check_error("unreadable video", res["video"], "episode_000001.mp4")
        check_error("video one frame shorter than the data", res["short"], "frame count mismatch")
        out = f"{tmp}/out_short"
        check("failed conversion into a new folder removes the folder it created",
              not os.path.exists(out), str(os.listdir(out)) if os.path.exists(out) else "")
        check_error("failed conversion into new nested folders", res["nested"], "frame count mismatch")
        check("failed conversion removes the nested folders it created (out_nested/a/b)",
              not os.path.exists(f"{tmp}/out_nested"), str(list(os.walk(f"{tmp}/out_nested"))))
        check_error("failed conversion into an existing folder", res["keep"], "frame count mismatch")
        check("failed conversion into an existing folder keeps the folder and its file, adds nothing",
              os.path.isdir(keep) and os.listdir(keep) == ["notes.txt"]
              and open(f"{keep}/notes.txt").read() == "not a shard\n",
              str(os.listdir(keep)) if os.path.isdir(keep) else "the folder is gone")
        check_error("Ctrl-C during the conversion", res["interrupted"], "interrupted")
        check("Ctrl-C removes the folders the conversion created",
              not os.path.exists(f"{tmp}/out_interrupted"), str(list(os.walk(f"{tmp}/out_interrupted"))))
        for key, kind in (("infolist", "list"), ("infostring", "string")):
            check_error(f"meta/info.json holding a JSON {kind}", res[key],
                        f"{bad[key]}/meta/info.json holds a JSON {kind}, not an object")
        check_error("meta/info.json holding an empty object", res["infoempty"], "lacks the field(s) codebase_version")
        check("the empty meta/info.json is called corrupt or not LeRobot's, not a version to convert",
              "not a LeRobot dataset" in res["infoempty"][2] and "conversion script" not in res["infoempty"][2],
              res["infoempty"][2].strip())
        check_error("--img 4", res["img"], "--img must be 0 (the source's size) or 8 to 4096")
        for key in ("infolist", "infostring", "infoempty", "img"):
            check(f"{key}: no output folder is left behind", not os.path.exists(f"{tmp}/out_{key}"))
        check_error("episode list length differs from the data", res["length"], "frame count mismatch")
        check_error("--cameras naming no camera", res["cameras"], "observation.images.top")
        check_error("bad --episodes", res["episodes"], "--episodes")
        check_error("a NaN state", res["nanstate"], "episode 1 frame 3: state column 'observation.state' element 1 is "
                    "NaN: train_vla cannot train on it; fix that episode's data, or leave the episode out with --episodes")
        check_error("an action past float32's range", res["bigaction"],
                    "episode 2 frame 1: action column 'action' element 0 is 1e+39, past float32's range")
        check_error("chunks_size 0", res["chunks0"], "meta/info.json: chunks_size 0 is not positive")
        check_error("a task with an unpaired surrogate", res["surrogate"],
                    "episode 0: task 0 holds an unpaired surrogate (U+D800 at character 20)")
        for key in ("nanstate", "bigaction", "chunks0", "surrogate"):
            check(f"{key}: no output folder is left behind", not os.path.exists(f"{tmp}/out_{key}"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
