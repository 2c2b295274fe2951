"""
lerobot_to_shards.py: a local LeRobot dataset (format v2.0, v2.1 or v3.0) as train_vla shards.

    build/venv/bin/python data/lerobot_to_shards.py ~/lerobot/pusht -o data/pusht --img 96
    build/venv/bin/python data/lerobot_to_shards.py lerobot/pusht -o data/pusht      # a hub id, downloaded before
    build/venv/bin/python data/lerobot_to_shards.py DIR -o OUT --cameras observation.images.top --episodes 0:50

The dataset is its folder, or its hub id (lerobot/pusht) when LeRobot or huggingface_hub has
downloaded it: ~/.cache/huggingface/lerobot/<repo_id> ($HF_LEROBOT_HOME/<repo_id>, LeRobotDataset's
root), then LeRobot's snapshots under that home's hub/ and the hub cache's datasets--ORG--NAME
(data/hub_cache.py says exactly where, and how the environment moves those folders). Nothing is
downloaded: an id found nowhere is an error that names every folder looked at and the download
command. A path that exists is always the path.

Each frame of the dataset becomes one shard frame: the images of the chosen cameras, the state
column and the action column. Every shard holds whole episodes, at most --frames-per-shard
frames (an episode longer than that gets a shard of its own), its own table of the task strings
its episodes use, and the mean and population std of its state and action. Shards are named
<name>_000.bin, _001.bin ... (--name, default: the dataset folder's name, a hub id's NAME); they are written
aside and moved into the output folder only once the whole conversion succeeded, replacing the
shards of an earlier conversion under the same name. A failed or interrupted run leaves the
output folder as it was, and removes it if the run created it.

Images (--frame): `fit`, the default, scales each camera's frames so that their longer side is
--img pixels, aspect ratio kept (the shorter side rounded, at least 1): nothing is cut and no
padding is stored, each camera has its own height x width in the shard (cameras may differ), and
the model resizes it with padding to its input size as LeRobot does (aspect kept, zeros on the
left and top), so it trains on the whole frame that LeRobot shows the same policy at deployment.
A frame whose longer side is --img or less is stored as it is, never scaled up: the model's
resize scales it up itself, and larger frames would only cost space. `crop`, the behaviour before
--frame, center-crops every frame to a square (the shorter side kept whole) and resizes it to
--img x --img: the edges of a wide frame are lost, though LeRobot feeds them to the policy.
`--img 0` stores the source pixels (fit) or the whole square crop (crop). The resize is PIL's
bilinear filter, which widens its support when it shrinks (an antialias LeRobot's resize has not);
the model's resize then runs on the stored frame, and the two resizes are not bit-identical to
LeRobot's single resize of the raw frame. `--img 0` (with fit) leaves that single resize to the
model and so gives exactly LeRobot's input (up to the video decoder's colour conversion), at the
cost of storing full-size frames. All frames of a camera must have one size (a LeRobot feature
has one shape); a shard holds at most 4096 pixels a side.

Instructions: each task string is stored with its token ids (shard format version 2): byte tokens
by default (tokenizer "bytes", what the presets trained from scratch read), or with --tokenizer
PATH the ids of a tokenizer.json (or of the model folder that holds one: the VLM of the SmolVLA
checkpoint to fine-tune, PaliGemma's for pi0; or that model's hub id, found in the hub cache),
made as LeRobot's SmolVLA and pi0 pre-processors make them (the task plus "\\n", the tokenizer's
own special tokens, PaliGemma's <bos> first; no truncation or padding, which are the trainer's:
see data/vla_shard.py's TokenizerJSON). The shards name that tokenizer ("tokenizer.json:<first 16 hex
of its sha256>"), and train_vla refuses a checkpoint trained on another's.

What this reads from a LeRobot dataset (the fields relied on, nothing else):
  meta/info.json  codebase_version; fps; features (dtype "video" or "image" marks a camera,
                  cameras are taken in the order of this dict); data_path and video_path
                  (str.format templates); chunks_size (v2.x, default 1000)
  v2.0 / v2.1     meta/tasks.jsonl     lines {"task_index", "task"}
                  meta/episodes.jsonl  lines {"episode_index", "length", "tasks"}
                  data_path  with episode_chunk (= episode_index // chunks_size) and episode_index:
                             one parquet per episode
                  video_path with episode_chunk, video_key and episode_index: one mp4 per episode
                             and camera, whose frame at time t (seconds) is the parquet row whose
                             timestamp is t
  v3.0            meta/tasks.parquet   column task_index; the task string is the pandas index
                             (stored as a column named in the pandas metadata, usually
                             "__index_level_0__") or a column "task"
                  meta/episodes/chunk-*/file-*.parquet  per episode: episode_index, length,
                             data/chunk_index, data/file_index (dataset_from_index and
                             dataset_to_index give the length when "length" is absent) and per
                             video camera videos/<key>/chunk_index, videos/<key>/file_index,
                             videos/<key>/from_timestamp, videos/<key>/to_timestamp
                  data_path  with chunk_index and file_index: one parquet shared by several
                             episodes; an episode's rows are those with its episode_index
                  video_path with video_key, chunk_index and file_index: one mp4 shared by several
                             episodes; the row with (episode-local) timestamp t shows the frame at
                             from_timestamp + t, and from_timestamp + t must not pass to_timestamp
  data parquet    episode_index, frame_index (row order), timestamp (seconds from the episode's
                  start), task_index (the episode's task is its first frame's), the state and
                  action columns (lists of numbers, or plain numbers for 1-dim ones), and image
                  cameras as structs {bytes: PNG or JPEG file, path}.
A video frame matches a row when its time (pts * time_base) is the nearest to the row's time
and within half a frame period (0.5 / fps) of it; anything else is an error. State and action
values must be finite and within float32's range (the shards store float32): a NaN, an Inf or a
larger value is an error naming the LeRobot episode and frame_index.

Every failure is one line on stderr, "error: ..." with the problem and the fix, exit status 1.
"""

import argparse
import glob
import json
import os
import re
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hub_cache  # noqa: E402  data/hub_cache.py: hub ids as the folders LeRobot downloaded them to
from console import end_progress, progress_line  # noqa: E402
from vla_shard import (BYTES, MAX_IMG, load_tokenizer, outermost_missing, text_collision_warnings,  # noqa: E402
                       write_shard)


class ConvertError(Exception):
    """A problem with the input or the options: main prints it as one `error:` line."""


def fail(msg):
    raise ConvertError(msg)


# --------------------------------------------------------------------------------------------
# metadata

def load_json(path, what):
    if not os.path.isfile(path):
        fail(f"{path} not found: {what}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read {path}: {e}: the file is damaged, download the dataset again")


def load_jsonl(path, what):
    if not os.path.isfile(path):
        fail(f"{path} not found: {what}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    fail(f"{path} line {n} is not JSON ({e}): the file is damaged, download the dataset again")
    return rows


def read_info(src):
    """meta/info.json, with its major format version checked: returns (info, "v2" or "v3")."""
    path = os.path.join(src, "meta", "info.json")
    info = load_json(path, "not a LeRobot dataset folder (pass the folder that holds meta/, data/ and videos/)")
    if not isinstance(info, dict):
        fail(f"{path} holds a JSON {json_kind(info)}, not an object: the dataset's metadata is corrupt, re-download it")
    # the version first: an old format lacks the other fields and wants the conversion advice
    need = ["codebase_version", "fps", "features", "data_path"]
    missing = [k for k in need if k not in info]
    if "codebase_version" in missing:
        fail(f"{path} lacks the field(s) {', '.join(missing)}: the file is corrupt or the folder is not a LeRobot "
             "dataset; download the dataset again")
    version = str(info["codebase_version"])
    if version in ("v2.0", "v2.1"):
        fmt = "v2"
    elif version == "v3.0":
        fmt = "v3"
    else:
        fail(f"{path}: codebase_version '{version}' is not supported (v2.0, v2.1 and v3.0 are): "
             "convert the dataset to v3.0 with LeRobot's conversion script first")
    if missing:
        fail(f"{path} lacks the field(s) {', '.join(missing)}: the file is corrupt or the folder is not a LeRobot "
             "dataset; download the dataset again")
    kinds = [("fps", (int, float)), ("features", dict), ("data_path", str), ("video_path", (str, type(None))),
             ("chunks_size", int)]
    for key, kind in kinds:
        if key in info and (not isinstance(info[key], kind) or isinstance(info[key], bool)):
            fail(f"{path}: '{key}' is a JSON {json_kind(info[key])}, which LeRobot never writes there: "
                 "the dataset's metadata is corrupt, re-download it")
    return info, fmt


def json_kind(value):
    """The JSON name of a parsed value's type, for messages."""
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    kinds = {dict: "object", list: "list", str: "string", int: "number", float: "number"}
    return kinds.get(type(value), type(value).__name__)


def camera_keys(info, requested):
    """The camera features to convert, in info.json order unless --cameras gives an order."""
    cams = [k for k, f in info["features"].items() if isinstance(f, dict) and f.get("dtype") in ("video", "image")]
    if requested is None:
        if not cams:
            fail("the dataset has no camera (no feature of dtype video or image in meta/info.json): "
                 "train_vla needs at least one camera")
        return cams
    for k in requested:
        if k not in cams:
            fail(f"--cameras: '{k}' is not a camera of this dataset; its cameras are {','.join(cams) or '(none)'}")
    if len(set(requested)) != len(requested):
        fail("--cameras names a camera twice: list each camera once")
    return requested


def read_tasks(src, fmt):
    """{task_index: task string}."""
    if fmt == "v2":
        path = os.path.join(src, "meta", "tasks.jsonl")
        rows = load_jsonl(path, "the dataset's task list is missing, download the dataset again")
        try:
            return {int(r["task_index"]): str(r["task"]) for r in rows}
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: every line needs task_index and task: the file is damaged, download the dataset again")
    path = os.path.join(src, "meta", "tasks.parquet")
    if not os.path.isfile(path):
        fail(f"{path} not found: the dataset's task list is missing, download the dataset again")
    table = read_parquet(path)
    # LeRobot writes a pandas frame indexed by the task string; pyarrow sees the index as a column
    meta = table.schema.pandas_metadata or {}
    names = [c for c in meta.get("index_columns", []) if isinstance(c, str)] + ["task", "__index_level_0__"]
    text_col = next((c for c in names if c in table.column_names), None)
    if "task_index" not in table.column_names or text_col is None:
        fail(f"{path} has columns {table.column_names}, expected task_index and the task strings "
             "(as the index or a 'task' column): the file is damaged, download the dataset again")
    return {int(i): str(t) for i, t in zip(table.column("task_index").to_pylist(), table.column(text_col).to_pylist())}


def read_parquet(path, columns=None):
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as e:
        fail(f"cannot read {path}: {str(e).splitlines()[0]}: the file is missing or damaged, "
             "download the dataset again")


def parquet_columns(path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not os.path.isfile(path):
        fail(f"{path} not found: the dataset is incomplete, download it again")
    try:
        return pq.read_schema(path).names
    except (OSError, pa.ArrowException) as e:
        fail(f"cannot read {path}: {str(e).splitlines()[0]}: the file is damaged, download the dataset again")


def read_episodes(src, fmt, info, cams):
    """One dict per episode, sorted by episode_index: index, length (or None), tasks, data (path),
    and for v3.0 videos {camera: (path, from_timestamp, to_timestamp or None)}."""
    videos = [k for k in cams if info["features"][k]["dtype"] == "video"]
    if videos and not info.get("video_path"):
        fail("meta/info.json has video cameras but no video_path template: the file is damaged, "
             "download the dataset again")
    episodes = []
    if fmt == "v2":
        path = os.path.join(src, "meta", "episodes.jsonl")
        chunks = int(info.get("chunks_size", 1000))
        if chunks < 1:
            fail(f"{os.path.join(src, 'meta', 'info.json')}: chunks_size {chunks} is not positive (episodes are "
                 "grouped chunks_size to a folder): the dataset's metadata is corrupt, re-download it or set it to 1000")
        for r in load_jsonl(path, "the dataset's episode list is missing, download the dataset again"):
            if "episode_index" not in r:
                fail(f"{path}: a line has no episode_index: the file is damaged, download the dataset again")
            e = int(r["episode_index"])
            keys = {"episode_chunk": e // chunks, "episode_index": e}
            episodes.append({
                "index": e, "length": r.get("length"), "tasks": r.get("tasks") or [],
                "data": os.path.join(src, format_path(info["data_path"], **keys)),
                "videos": {k: (os.path.join(src, format_path(info["video_path"], video_key=k, **keys)), 0.0, None)
                           for k in videos},
            })
    else:
        files = sorted(glob.glob(os.path.join(src, "meta", "episodes", "chunk-*", "*.parquet")))
        if not files:
            fail(f"{os.path.join(src, 'meta', 'episodes')} holds no chunk-*/file-*.parquet: the dataset's "
                 "episode list is missing, download the dataset again")
        need = ["episode_index", "data/chunk_index", "data/file_index"]
        for k in videos:
            need += [f"videos/{k}/chunk_index", f"videos/{k}/file_index", f"videos/{k}/from_timestamp"]
        optional = ["length", "tasks", "dataset_from_index", "dataset_to_index"] + [f"videos/{k}/to_timestamp"
                                                                                    for k in videos]
        for path in files:
            names = parquet_columns(path)  # the per-episode stats/* columns are many: read only ours
            missing = [c for c in need if c not in names]
            if missing:
                fail(f"{path} has no column {missing[0]}: the episode list is damaged or from another "
                     "LeRobot version, download the dataset again")
            cols = read_parquet(path, need + [c for c in optional if c in names]).to_pydict()
            for i in range(len(cols["episode_index"])):
                def get(c):
                    return cols[c][i] if c in cols else None
                length = get("length")
                if length is None and get("dataset_to_index") is not None and get("dataset_from_index") is not None:
                    length = get("dataset_to_index") - get("dataset_from_index")
                data = format_path(info["data_path"], chunk_index=get("data/chunk_index"),
                                   file_index=get("data/file_index"))
                vids = {}
                for k in videos:
                    vpath = format_path(info["video_path"], video_key=k, chunk_index=get(f"videos/{k}/chunk_index"),
                                        file_index=get(f"videos/{k}/file_index"))
                    end = get(f"videos/{k}/to_timestamp")
                    vids[k] = (os.path.join(src, vpath), float(get(f"videos/{k}/from_timestamp")),
                               None if end is None else float(end))
                episodes.append({"index": int(get("episode_index")), "length": length, "tasks": get("tasks") or [],
                                 "data": os.path.join(src, data), "videos": vids})
    episodes.sort(key=lambda e: e["index"])
    for a, b in zip(episodes, episodes[1:]):
        if a["index"] == b["index"]:
            fail(f"episode {a['index']} is listed twice in the episode list (meta/): a stale copy of a metadata "
                 "file is left over, remove it or download the dataset again")
    return episodes


def format_path(template, **keys):
    try:
        return template.format(**keys)
    except (KeyError, IndexError, ValueError, TypeError) as e:
        fail(f"meta/info.json path template '{template}' needs {e}, which this format version does not "
             "provide: the file is damaged or from another LeRobot version")


def select_episodes(episodes, spec):
    """--episodes START:END (episode_index values, END excluded, either side may be left out) or N."""
    if spec is None:
        return episodes
    m = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", spec)
    if not m or (not m.group(2) and not m.group(1)) or (not m.group(2) and m.group(3)):
        fail(f"--episodes '{spec}': give START:END (episode indices, END excluded, e.g. 0:100) or one index")
    lo = int(m.group(1)) if m.group(1) else 0
    hi = (int(m.group(3)) if m.group(3) else None) if m.group(2) else lo + 1
    chosen = [e for e in episodes if e["index"] >= lo and (hi is None or e["index"] < hi)]
    if not chosen:
        have = f"{episodes[0]['index']}..{episodes[-1]['index']}" if episodes else "none"
        fail(f"--episodes {spec} selects no episode (the dataset has episode indices {have}): widen the range")
    return chosen


# --------------------------------------------------------------------------------------------
# frame data

class DataFiles:
    """Reads data parquets; v3.0 episodes share files, so the last one read stays in memory."""

    def __init__(self, args, image_cams):
        self.args, self.image_cams = args, image_cams
        self.path, self.table, self.episode_of_row = None, None, None

    def episode(self, ep):
        """The episode's rows in frame order: dict of timestamp (s), task (task_index or None),
        state f32 (n, S), action f32 (n, A), images {camera: [struct]}."""
        import pyarrow as pa
        path = ep["data"]
        if path != self.path:
            names = parquet_columns(path)
            for key, flag in ((self.args.state_key, "--state-key"), (self.args.action_key, "--action-key")):
                if key not in names:
                    fail(f"{path} has no column '{key}' (its columns: {', '.join(names)}): "
                         f"name the right column with {flag}")
            for k in self.image_cams:
                if k not in names:
                    fail(f"{path} has no column for image camera '{k}': the data file is incomplete; "
                         "download it again or leave the camera out with --cameras")
            wanted = [self.args.state_key, self.args.action_key] + self.image_cams
            wanted += [c for c in ("episode_index", "frame_index", "timestamp", "task_index") if c in names]
            self.table = read_parquet(path, list(dict.fromkeys(wanted)))
            self.path = path
            self.episode_of_row = (self.table.column("episode_index").to_numpy().astype(np.int64)
                                   if "episode_index" in self.table.column_names else None)
        table = self.table
        if self.episode_of_row is not None:
            rows = np.flatnonzero(self.episode_of_row == ep["index"])
            if len(rows) != table.num_rows:
                table = table.take(pa.array(rows))
        elif ep["videos"] and any(v[1] != 0.0 for v in ep["videos"].values()):
            fail(f"{path} has no episode_index column, so the episodes it holds cannot be told apart: "
                 "the data file is damaged, download the dataset again")
        n = table.num_rows
        if ep["length"] is not None and int(ep["length"]) != n:
            fail(f"episode {ep['index']}: the episode list says {ep['length']} frames but {path} holds {n}: "
                 "frame count mismatch, the dataset is damaged or was edited by hand; download it again")
        names = table.column_names
        order = np.argsort(table.column("frame_index").to_numpy(), kind="stable") if "frame_index" in names \
            else np.arange(n)
        if "timestamp" in names:
            stamps = table.column("timestamp").to_numpy().astype(np.float64)[order]
        else:  # no timestamps: frames are 1/fps apart, as LeRobot records them
            stamps = (table.column("frame_index").to_numpy()[order] if "frame_index" in names
                      else np.arange(n)) / float(self.args.fps)
        task = int(table.column("task_index")[int(order[0])].as_py()) if n and "task_index" in names else None
        images = {}
        for k in self.image_cams:
            cells = table.column(k).to_pylist()
            images[k] = [cells[i] for i in order]
        a = self.args
        frame_ids = table.column("frame_index").to_numpy()[order] if "frame_index" in names else np.arange(n)
        values = {}
        for what, key, flag in (("state", a.state_key, "--state-key"), ("action", a.action_key, "--action-key")):
            values[what] = checked_f32(float_matrix(table.column(key), key, path, flag)[order], what, key, ep["index"],
                                       frame_ids)
        return {"n": n, "timestamp": stamps, "task": task, "state": values["state"], "action": values["action"],
                "images": images}


F32_MAX = float(np.finfo(np.float32).max)


def checked_f32(x, what, key, episode, frame_ids):
    """An episode's float64 values (n, dim) as float32, or a one-line error naming the LeRobot episode
    and frame (frame_index) of the first NaN, Inf or value past float32's range (it would be Inf)."""
    bad = ~np.isfinite(x) | (np.abs(x) > F32_MAX)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        v = float(x[row, col])
        desc = "NaN" if np.isnan(v) else ("+Inf" if v > 0 else "-Inf") if np.isinf(v) else \
            f"{v:g}, past float32's range"
        fail(f"episode {episode} frame {int(frame_ids[row])}: {what} column '{key}' element {col} is {desc}: train_vla "
             "cannot train on it; fix that episode's data, or leave the episode out with --episodes")
    return x.astype(np.float32)


def float_matrix(col, name, path, flag):
    """A column of number lists (or of plain numbers) as float64 (n, dim)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n, t = len(arr), arr.type
    if arr.null_count:
        fail(f"column '{name}' of {path} has empty (null) rows: pick a column that is set on every frame with {flag}")
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return arr.to_numpy(zero_copy_only=False).astype(np.float64).reshape(n, 1)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        vt = t.value_type
        if pa.types.is_integer(vt) or pa.types.is_floating(vt) or pa.types.is_boolean(vt):
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            if n and (lengths != lengths[0]).any():
                fail(f"column '{name}' of {path} has rows of different lengths ({lengths.min()} to {lengths.max()}): "
                     f"pick a fixed-size column with {flag}")
            dim = int(lengths[0]) if n else 0
            values = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
            return values.reshape(n, dim)
    fail(f"column '{name}' of {path} holds {t}, not numbers or lists of numbers: pick another column with {flag}")


# --------------------------------------------------------------------------------------------
# images

def stored_size(w, h, img, frame):
    """(width, height) at which a w x h source frame is stored: --frame fit scales the longer side
    down to img (aspect kept, never up), crop gives img x img; img 0 keeps the source's pixels."""
    if frame == "crop":
        side = min(w, h) if img == 0 else img
        return side, side
    longer = max(w, h)
    if img == 0 or longer <= img:
        return w, h
    # the shorter side rounded half up, in integers: the longer side is exactly img
    shorter = max(1, (min(w, h) * img * 2 + longer) // (2 * longer))
    return (img, shorter) if w >= h else (shorter, img)


def store_frame(image, img, frame):
    """PIL image -> u8 (height, width, 3) as the shard stores it (stored_size): crop center-crops to
    a square first; a bilinear resize when the size changes."""
    from PIL import Image
    if image.mode != "RGB":
        image = image.convert("RGB")
    w, h = image.size
    if frame == "crop" and w != h:
        s = min(w, h)
        left, top = (w - s) // 2, (h - s) // 2
        image = image.crop((left, top, left + s, top + s))
    size = stored_size(w, h, img, frame)
    if image.size != size:
        image = image.resize(size, Image.BILINEAR)
    return np.asarray(image, np.uint8)


class CameraFrames:
    """One camera's frames of an episode, (n, height, width, 3). Every frame of a camera must have
    the size of the first one converted, which `sizes` (camera -> (height, width), shared by the
    episodes) records: a shard stores one size per camera."""

    def __init__(self, key, n, episode, sizes):
        self.key, self.n, self.episode, self.sizes, self.array = key, n, episode, sizes, None

    def put(self, i, frame):
        hw = frame.shape[:2]
        if max(hw) > MAX_IMG:
            fail(f"camera '{self.key}' has frames of {hw[0]}x{hw[1]} pixels (height x width), more than the {MAX_IMG} "
                 f"a shard holds a side: pass --img {MAX_IMG} or less")
        first = self.sizes.setdefault(self.key, hw)
        if hw != first:
            fail(f"camera '{self.key}' episode {self.episode} frame {i} is stored at {hw[0]}x{hw[1]} but its earlier "
                 f"frames at {first[0]}x{first[1]} (height x width): the camera's source frames change size, which a "
                 "shard cannot hold; store them all at N x N with --frame crop --img N")
        if self.array is None:
            self.array = np.empty((self.n,) + frame.shape, np.uint8)
        self.array[i] = frame


def decode_image(cell, src, key, ep, i, img, frame):
    """An "image" camera's parquet cell {bytes, path} as the u8 image the shard stores."""
    import io
    from PIL import Image
    data = cell.get("bytes") if isinstance(cell, dict) else None
    where = f"camera '{key}' episode {ep} frame {i}"
    try:
        if data:
            image = Image.open(io.BytesIO(data))
        elif isinstance(cell, dict) and cell.get("path"):  # not embedded: a file next to the dataset
            p = cell["path"] if os.path.isabs(cell["path"]) else os.path.join(src, cell["path"])
            image = Image.open(p)
        else:
            fail(f"{where}: the image cell is empty: the data file is damaged, download the dataset again")
        image.load()
    except OSError as e:
        fail(f"{where}: cannot decode the image ({e}): the data file is damaged, download the dataset again")
    return store_frame(image, img, frame)


def ffmpeg_reason(e):
    """FFmpeg's message without the file name PyAV appends (the error names the file already)."""
    return getattr(e, "strerror", None) or str(e)


class VideoReader:
    """One camera's mp4 files, decoded forward; it seeks only when a request goes back in the
    file or far ahead, so the episodes of one v3.0 file are decoded in a single pass."""

    SEEK_AHEAD = 5.0  # seconds: nearer requests decode through instead of seeking

    def __init__(self, key):
        from av.video.reformatter import VideoReformatter
        self.key, self.path, self.container = key, None, None
        self.rgb = VideoReformatter()  # one converter for all frames: keeps its swscale context

    def close(self):
        if self.container is not None:
            self.container.close()
        self.container, self.path = None, None

    def open(self, path, seek_to):
        import av
        self.close()
        if not os.path.isfile(path):
            fail(f"video {path} of camera '{self.key}' not found: the dataset is incomplete, download it again "
                 "or leave the camera out with --cameras")
        try:
            self.container = av.open(path)
            stream = self.container.streams.video[0]
            stream.thread_type = "AUTO"
            if seek_to is not None and seek_to > 0 and stream.time_base:
                # lands on the keyframe at or before seek_to; frames before the target are skipped below
                self.container.seek(int(seek_to / stream.time_base), stream=stream, backward=True)
        except (av.FFmpegError, IndexError) as e:
            self.close()
            fail(f"cannot read video {path} of camera '{self.key}' ({ffmpeg_reason(e)}): the file is damaged "
                 "or not a video, download the dataset again")
        self.path = path
        self.frames = self.container.decode(stream)
        self.buffer, self.eof, self.last_request = [], False, -1e300

    def next_frame(self):
        import av
        try:
            frame = next(self.frames)
        except StopIteration:
            self.eof = True
            return
        except av.FFmpegError as e:
            fail(f"cannot decode video {self.path} of camera '{self.key}' ({ffmpeg_reason(e)}): the file is damaged, "
                 "download the dataset again")
        if frame.pts is None:
            fail(f"video {self.path}: a frame has no timestamp (pts), so it cannot be matched to the data; "
                 "re-encode the video into mp4 with ffmpeg")
        self.buffer.append((float(frame.pts * frame.time_base), frame))

    def frames_at(self, path, times, tol, ep):
        """Frames nearest each time in `times` (ascending, seconds in the file), within tol."""
        t0 = float(times[0])
        if path != self.path or t0 < self.last_request or t0 > self.last_request + self.SEEK_AHEAD:
            self.open(path, t0 - tol)
            self.next_frame()
            if self.buffer and self.buffer[0][0] > t0 + tol:  # the seek went too far: decode from the start
                self.open(path, None)
        out = []
        for i, t in enumerate(times):
            while not self.eof and (not self.buffer or self.buffer[-1][0] <= t + tol):
                self.next_frame()
            self.buffer = [b for b in self.buffer if b[0] >= t - tol]
            if not self.buffer or abs(self.buffer[0][0] - t) > tol:
                end = "the video ends before it" if self.eof and not self.buffer else \
                    f"the next frame is at {self.buffer[0][0]:.4f} s"
                fail(f"video {path} of camera '{self.key}' has no frame within {tol * 1000:.0f} ms of "
                     f"{t:.4f} s (episode {ep}, frame {i}; {end}): the video and the data disagree "
                     "(frame count mismatch or wrong timestamps); download the dataset again or re-encode the episode")
            best = min(self.buffer, key=lambda b: abs(b[0] - t))
            out.append(self.rgb.reformat(best[1], format="rgb24").to_ndarray())  # frame.to_ndarray(format="rgb24")
            self.last_request = t
        return out


# --------------------------------------------------------------------------------------------
# shards

def instruction_tokenizer(args):
    """The tokenizer of the instructions' token ids: an object with name (what the shard header
    records), vocab and encode(text) -> ids: vla_shard.BYTES, or --tokenizer's TokenizerJSON."""
    try:
        return load_tokenizer(args.tokenizer)
    except ValueError as e:
        fail(f"--tokenizer: {e}")


class ShardWriter:
    """Collects whole episodes and writes a shard before the next episode would pass the limit."""

    def __init__(self, out, name, limit, tasks, tokenizer=BYTES):
        self.out, self.name, self.limit, self.tasks, self.tokenizer = out, name, limit, tasks, tokenizer
        self.episodes, self.frames, self.paths = [], 0, []

    def add(self, task, images, state, action):
        """images: one (frames, height, width, 3) array per camera."""
        if self.episodes and self.frames + len(action) > self.limit:
            self.flush()
        self.episodes.append((task, images, state, action))
        self.frames += len(action)

    def flush(self):
        if not self.episodes:
            return
        used = sorted({e[0] for e in self.episodes})  # task indices, in the dataset's order
        table, first = [], 0
        for task, _, _, action in self.episodes:
            table.append((first, len(action), used.index(task)))
            first += len(action)
        path = os.path.join(self.out, f"{self.name}_{len(self.paths):03d}.bin")
        self.paths.append(path)  # listed before writing: a failed write is cleaned up too
        cams = [np.concatenate([e[1][c] for e in self.episodes]) for c in range(len(self.episodes[0][1]))]
        write_shard(path, cams, np.concatenate([e[2] for e in self.episodes]),
                    np.concatenate([e[3] for e in self.episodes]), table, [self.tasks[t] for t in used],
                    tokenizer=self.tokenizer)
        self.episodes, self.frames = [], 0


def progress(done, total, frames, t0):
    elapsed = time.time() - t0
    eta = elapsed / done * (total - done)
    rate = f"{frames / elapsed:.0f} frames/s, " if elapsed > 0 else ""
    progress_line(f"{done}/{total} episodes, {frames} frames, {rate}ETA {int(eta) // 60}m{int(eta) % 60:02d}s",
                  done / total)


def convert(args):
    import av  # noqa: F401 (checked here so that a missing package is one clear error)
    from PIL import Image
    t0 = time.time()
    tokenizer = instruction_tokenizer(args)  # before reading anything: a bad --tokenizer fails at once
    try:
        src = hub_cache.local_folder(args.src, "dataset", os.path.join("meta", "info.json"))
    except hub_cache.NotFound as e:
        fail(f"{e}")
    if not os.path.isdir(src):
        fail(f"{src} is not a folder: pass the LeRobot dataset folder (the one that holds meta/info.json)")
    info, fmt = read_info(src)
    args.fps = float(info["fps"])
    if not args.fps > 0:
        fail(f"meta/info.json: fps {info['fps']} is not positive: the file is damaged, download the dataset again")
    cams = camera_keys(info, args.cameras)
    kinds = {k: info["features"][k]["dtype"] for k in cams}
    tasks = read_tasks(src, fmt)
    episodes = select_episodes(read_episodes(src, fmt, info, cams), args.episodes)
    tol = 0.5 / args.fps  # half a frame period

    data = DataFiles(args, [k for k in cams if kinds[k] == "image"])
    readers = {k: VideoReader(k) for k in cams if kinds[k] == "video"}
    # shards are written to a staging folder and moved into place at the end, so that a failed
    # run leaves the output folder as it was (an earlier conversion stays whole; a folder the run
    # created is removed by main)
    staging = os.path.join(args.output, f".{args.name}.converting")
    shutil.rmtree(staging, ignore_errors=True)
    writer = ShardWriter(staging, args.name, args.frames_per_shard, tasks, tokenizer)
    frames, written, dims, used_tasks = 0, 0, None, set()
    sizes = {}  # camera -> the (height, width) its frames are stored at
    try:
        os.makedirs(staging)
        for done, ep in enumerate(episodes, 1):
            e = ep["index"]
            rows = data.episode(ep)
            n = rows["n"]
            if n == 0:
                end_progress()
                sys.stderr.write(f"warning: episode {e} has no frames in {ep['data']}: skipped\n")
                progress(done, len(episodes), frames, t0)
                continue
            # the episode's task: its first frame's task_index, else the episode list's first task
            if rows["task"] is not None:
                task = rows["task"]
                if task not in tasks:
                    fail(f"episode {e}: task_index {task} is not in the task list ({len(tasks)} tasks): "
                         "the dataset is damaged, download it again")
            elif ep["tasks"] and ep["tasks"][0] in tasks.values():
                task = next(i for i, s in tasks.items() if s == ep["tasks"][0])
            else:
                fail(f"episode {e}: {ep['data']} has no task_index column and the episode list names no known "
                     "task: the dataset is damaged, download it again")
            if task not in used_tasks:
                try:
                    tasks[task].encode("utf-8")
                except UnicodeEncodeError as u:
                    fail(f"episode {e}: task {task} holds an unpaired surrogate (U+{ord(tasks[task][u.start]):04X} at "
                         f"character {u.start}), which is not text: fix that task's string in the dataset's task list")
            if dims is None:
                dims = (rows["state"].shape[1], rows["action"].shape[1])
                if 0 in dims:
                    fail(f"the state column '{args.state_key}' or the action column '{args.action_key}' holds "
                         "empty lists: pick other columns with --state-key/--action-key")
            elif (rows["state"].shape[1], rows["action"].shape[1]) != dims:
                fail(f"episode {e}: state/action have {rows['state'].shape[1]}/{rows['action'].shape[1]} dims, earlier "
                     f"episodes {dims[0]}/{dims[1]}: every frame needs the same sizes, pick other columns")
            images = [CameraFrames(k, n, e, sizes) for k in cams]
            for c, k in enumerate(cams):
                if kinds[k] == "image":
                    for i, cell in enumerate(rows["images"][k]):
                        images[c].put(i, decode_image(cell, src, k, e, i, args.img, args.frame))
                    continue
                path, start, end = ep["videos"][k]
                stamps = start + rows["timestamp"]
                if (np.diff(stamps) <= 0).any():
                    fail(f"episode {e}: timestamps in {ep['data']} do not increase with frame_index: "
                         "the data file is damaged, download the dataset again")
                if end is not None and stamps[-1] > end + tol:
                    fail(f"episode {e}: its last frame is at {stamps[-1]:.4f} s of {path} but the episode's video ends "
                         f"at {end:.4f} s: frame count mismatch between the data and the video (or the parquet holds "
                         "absolute instead of episode-local timestamps); download the dataset again")
                for i, rgb in enumerate(readers[k].frames_at(path, stamps, tol, e)):
                    images[c].put(i, store_frame(Image.fromarray(rgb), args.img, args.frame))
            writer.add(task, [x.array for x in images], rows["state"], rows["action"])
            used_tasks.add(task)
            frames += n
            written += 1
            progress(done, len(episodes), frames, t0)
        writer.flush()
        if frames == 0:
            fail("the selected episodes hold no frames: nothing to write")
        end_progress()
        # shards of an earlier conversion under the same name would be read with the new ones
        stale = sorted(glob.glob(os.path.join(args.output, f"{args.name}_[0-9][0-9][0-9].bin")))
        for p in stale:
            os.remove(p)
        shards = []
        for p in writer.paths:
            shards.append(os.path.join(args.output, os.path.basename(p)))
            os.replace(p, shards[-1])
        stale = [p for p in stale if p not in shards]
    finally:
        for r in readers.values():
            r.close()
        shutil.rmtree(staging, ignore_errors=True)
    others = [p for p in glob.glob(os.path.join(args.output, "*.bin")) if p not in shards]
    if others:
        sys.stderr.write(f"warning: {args.output} also holds {len(others)} other .bin file(s) (e.g. {others[0]}); "
                         "train_vla reads every .bin of a folder\n")
    elapsed = time.time() - t0
    stored = ", ".join(f"{k} {sizes[k][0]}x{sizes[k][1]}" for k in cams)
    print(f"wrote {len(shards)} shard(s) to {args.output}: {written} episodes, {frames} frames, "
          f"{len(used_tasks)} task(s), {len(cams)} camera(s) ({stored}, height x width, --frame {args.frame}), "
          f"state {dims[0]} / action {dims[1]} dims; LeRobot {info['codebase_version']}; "
          f"{elapsed:.1f} s, {frames / max(elapsed, 1e-9):.0f} frames/s"
          + (f"; removed {len(stale)} stale shard(s)" if stale else "")
          + (f"; {args.src} read from {src}" if src != args.src else ""))
    for line in text_collision_warnings([tasks[t] for t in sorted(used_tasks)], tokenizer):
        sys.stderr.write(line + "\n")


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit status 1, like every other failure
        sys.stderr.write(f"error: {message}: see --help\n")
        sys.exit(1)


def main():
    ap = Parser(description="Converts a local LeRobot dataset (v2.0, v2.1 or v3.0; its folder, or the hub id of one "
                            "downloaded before) into train_vla shards.")
    ap.add_argument("src", help="the LeRobot dataset folder (holds meta/info.json), or its hub id (lerobot/pusht) "
                                "found in ~/.cache/huggingface/lerobot/<repo_id> or the HF caches "
                                "(data/hub_cache.py; never downloaded)")
    ap.add_argument("-o", "--output", required=True, help="output folder for the shards")
    ap.add_argument("--img", type=int, default=96,
                    help="image size in pixels: the longer side (fit; smaller frames are kept as they are) or the "
                         "square's side (crop); 0 keeps the source's size (96)")
    ap.add_argument("--frame", choices=["fit", "crop"], default="fit",
                    help="fit: scale to --img, aspect kept, nothing cut or padded (the model pads the whole frame, "
                         "as LeRobot does); crop: center-crop to a square, then resize to --img x --img (fit)")
    ap.add_argument("--cameras", default=None,
                    help="camera features to keep, comma-separated, in shard order (all video/image features)")
    ap.add_argument("--state-key", default="observation.state", help="state column (observation.state)")
    ap.add_argument("--action-key", default="action", help="action column (action)")
    ap.add_argument("--frames-per-shard", type=int, default=20000,
                    help="most frames per shard; an episode is never split (20000)")
    ap.add_argument("--episodes", default=None, help="episode indices START:END, END excluded, e.g. 0:100 (all)")
    ap.add_argument("--name", default=None, help="shard file name prefix (the dataset folder's name, a hub id's NAME)")
    ap.add_argument("--tokenizer", default=None,
                    help="token ids of this tokenizer.json, or of the one in this model folder (or in the HF cache's "
                         "snapshot of this model hub id), made as LeRobot's "
                         "SmolVLA and pi0 pre-processors make them: SmolVLM2's for SmolVLA, PaliGemma's for pi0 "
                         "(default: bytes, the UTF-8 bytes)")
    args = ap.parse_args()
    if args.cameras is not None:
        args.cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
        if not args.cameras:
            ap.error("--cameras is empty")
        if len(args.cameras) > 16:
            ap.error("--cameras: a shard holds at most 16 cameras")
    if args.img != 0 and not 8 <= args.img <= MAX_IMG:
        ap.error(f"--img must be 0 (the source's size) or 8 to {MAX_IMG}")
    if args.frames_per_shard < 1:
        ap.error("--frames-per-shard must be at least 1")
    if args.name is None:
        args.name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(os.path.normpath(os.path.abspath(args.src))))
    elif not re.fullmatch(r"[A-Za-z0-9._-]+", args.name):
        ap.error("--name may hold only letters, digits, '.', '_' and '-'")
    created = outermost_missing(args.output)  # what the run makes (os.makedirs), so what a failure removes
    finished = False
    try:
        convert(args)
        finished = True
    except ConvertError as e:
        error_exit(str(e))
    except ImportError as e:
        error_exit(f"{e}: install the data tools' packages with `make setup`")
    except KeyboardInterrupt:
        error_exit("interrupted: the output folder is as it was, run the conversion again")
    except OSError as e:
        error_exit(f"{e}: check the paths and the free disk space")
    except Exception as e:  # a case this script did not foresee: still one line, no traceback
        msg = str(e).splitlines()[0] if str(e) else ""
        error_exit(f"unexpected {type(e).__name__}: {msg}: please report it with the dataset's meta/info.json")
    finally:
        if not finished and created is not None:
            shutil.rmtree(created, ignore_errors=True)


def error_exit(msg):
    end_progress()  # the error goes on a line of its own
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
