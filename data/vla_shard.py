"""
vla_shard.py: the dataset shard format of vla.h, in numpy.

A shard is one little-endian file (vla.h, "dataset shards"):
  header         ShardHeader, 256 bytes
  images         u8  (n_frames, n_cam, img, img, 3)
  state          f32 (n_frames, state_dim)
  action         f32 (n_frames, action_dim)
  frame_episode  u32 (n_frames)            episode of each frame, shard-local
  episodes       ShardEpisode (n_episodes) first_frame u64, length u32, task u32
  task_offsets   u64 (n_tasks + 1)         into task_text
  task_text      u8  (task_bytes)          UTF-8, not NUL-terminated
  stats          f32 state_mean(S) state_std(S) action_mean(A) action_std(A)
Sections start at 64-byte aligned offsets recorded in the header.

Shard checks a file as vla.h's shard_open does, Dataset reads several shards as one with
the pooled statistics of dataset_open, and Dataset.assemble builds one sample exactly as
dataset_assemble. write_shard is the inverse of Shard, for generators and tests.
Bad files raise ValueError with one line that names the file and the fix.
"""

import os

import numpy as np

SHARD_MAGIC = 0x44414C56  # "VLAD"
SHARD_VERSION = 1
SHARD_ALIGN = 64
VLA_MIN_STD = np.float32(1e-6)  # a std below this counts as zero: the dim is only centered

HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "<u4"),
    ("n_cam", "<u4"), ("img", "<u4"), ("state_dim", "<u4"), ("action_dim", "<u4"),
    ("n_frames", "<u8"), ("n_episodes", "<u8"), ("n_tasks", "<u8"), ("task_bytes", "<u8"),
    ("off_images", "<u8"), ("off_state", "<u8"), ("off_action", "<u8"), ("off_frame_episode", "<u8"),
    ("off_episodes", "<u8"), ("off_task_offsets", "<u8"), ("off_task_text", "<u8"), ("off_stats", "<u8"),
    ("file_size", "<u8"),
    ("reserved", "<u8", (16,)),
])
assert HEADER_DTYPE.itemsize == 256
EPISODE_DTYPE = np.dtype([("first_frame", "<u8"), ("length", "<u4"), ("task", "<u4")])
assert EPISODE_DTYPE.itemsize == 16

# instruction bytes each preset of vla.h reads (the text column of VLA_PRESETS; data/test_inspect.py
# checks these against vla.h). train_vla's --max-text overrides them.
PRESET_MAX_TEXT = {"tiny": 16, "small": 48, "base": 48}
# patch side of each preset's vision encoder (the p column of VLA_PRESETS, also checked against
# vla.h by data/test_metaworld.py): the trainer takes a dataset only if img is a multiple of it
PRESET_PATCH = {"tiny": 8, "small": 8, "base": 16}


def img_side_error(img):
    """None when the patch of some preset divides the image side `img`, else the one-line reason
    and fix, for the generators to reject an --img that no preset could train on."""
    if any(img % p == 0 for p in PRESET_PATCH.values()):
        return None
    by_patch = {}
    for preset, p in PRESET_PATCH.items():
        by_patch.setdefault(p, []).append(preset)
    patches = ", ".join(f"{p} for {'/'.join(names)}" for p, names in sorted(by_patch.items()))
    step = min(PRESET_PATCH.values())
    below = max(img // step * step, step)
    return (f"--img {img}: no preset's patch divides it (patch {patches}): use a multiple of {step}, "
            f"e.g. {below} or {below + step}")


def distinct_text_bytes(instructions):
    """The fewest bytes that keep every distinct instruction distinct once cut (UTF-8): one past
    the longest prefix two of them share (a shorter one that is a prefix of a longer counts whole)."""
    texts = sorted({t.encode("utf-8") for t in instructions})
    need = 1
    for a, b in zip(texts, texts[1:]):  # sorted: the longest shared prefix is between neighbours
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        need = max(need, p + 1)
    return need


def text_collisions(instructions, max_text):
    """Groups of distinct instructions (lists, in first-seen order) that read the same once cut
    to max_text bytes, as the trainers cut them."""
    groups = {}
    for t in dict.fromkeys(instructions):
        groups.setdefault(t.encode("utf-8")[:max_text], []).append(t)
    return [g for g in groups.values() if len(g) > 1]


def text_collision_warnings(instructions):
    """One warning line per preset of vla.h whose text length makes instructions identical."""
    lines, need = [], distinct_text_bytes(instructions)
    for preset, max_text in PRESET_MAX_TEXT.items():
        groups = text_collisions(instructions, max_text)
        if groups:
            same = "; ".join(", ".join(f'"{t}"' for t in g) for g in groups)
            lines.append(f"warning: cut to the {max_text} bytes preset {preset} reads, these instructions become the "
                         f"same task: {same}; train with --max-text {need} or more to keep every instruction distinct")
    return lines


# sections in file order: (name, header offset field)
SECTIONS = ["images", "state", "action", "frame_episode", "episodes", "task_offsets", "task_text", "stats"]


def section_sizes(h, path):
    """Byte sizes of the sections in file order, from the header's counts."""
    n, img, cam = int(h["n_frames"]), int(h["img"]), int(h["n_cam"])
    S, A = int(h["state_dim"]), int(h["action_dim"])
    sizes = [n * cam * img * img * 3, n * S * 4, n * A * 4, n * 4, int(h["n_episodes"]) * 16,
             (int(h["n_tasks"]) + 1) * 8, int(h["task_bytes"]), 8 * (S + A)]
    # C multiplies in 64 bits: a size that does not fit is a corrupt header there too
    if any(s >= 1 << 64 for s in sizes) or int(h["n_tasks"]) == (1 << 64) - 1:
        raise ValueError(f"{path}: a section size overflows 64 bits: the file is corrupt, regenerate it")
    return sizes


def align_up(x):
    return (x + SHARD_ALIGN - 1) // SHARD_ALIGN * SHARD_ALIGN


class Shard:
    """One memory-mapped shard; every size is checked against the file before use."""

    def __init__(self, path):
        self.path = path
        try:
            length = os.path.getsize(path)
        except OSError as e:
            raise ValueError(f"cannot open dataset shard {path}: {e.strerror}: check the -i path") from None
        if length < HEADER_DTYPE.itemsize:
            raise ValueError(f"{path}: {length} bytes is shorter than a shard header (256): "
                             "the file is truncated, regenerate it")
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        h = np.frombuffer(self.map, HEADER_DTYPE, 1, 0)[0]
        self.header = h
        if h["magic"] != SHARD_MAGIC:
            raise ValueError(f"{path}: bad magic 0x{int(h['magic']):08x} (want 0x{SHARD_MAGIC:08x}): "
                             "not a train_vla dataset shard; convert it with the tools in data/")
        if h["version"] != SHARD_VERSION:
            raise ValueError(f"{path}: shard version {int(h['version'])}, this reader reads version "
                             f"{SHARD_VERSION}: regenerate the shard with this version's data/ tools")
        self.n_cam, self.img = int(h["n_cam"]), int(h["img"])
        self.state_dim, self.action_dim = int(h["state_dim"]), int(h["action_dim"])
        self.n_frames, self.n_episodes = int(h["n_frames"]), int(h["n_episodes"])
        self.n_tasks, self.task_bytes = int(h["n_tasks"]), int(h["task_bytes"])
        if not (1 <= self.n_cam <= 16 and 1 <= self.img <= 4096 and 1 <= self.state_dim <= 4096
                and 1 <= self.action_dim <= 4096 and self.n_frames >= 1 and self.n_episodes >= 1
                and self.n_tasks >= 1):
            raise ValueError(f"{path}: header sizes out of range (n_cam {self.n_cam}, img {self.img}, "
                             f"state {self.state_dim}, action {self.action_dim}, frames {self.n_frames}, "
                             f"episodes {self.n_episodes}, tasks {self.n_tasks}): the file is corrupt, regenerate it")
        if int(h["file_size"]) != length:
            raise ValueError(f"{path}: header says {int(h['file_size'])} bytes but the file has {length}: "
                             "the file is truncated or padded, regenerate it")
        sizes = section_sizes(h, path)
        offs = [int(h["off_" + name]) for name in SECTIONS]
        for name, off, size in zip(SECTIONS, offs, sizes):
            if off < HEADER_DTYPE.itemsize or off % 4 != 0 or off + size > length:
                raise ValueError(f"{path}: section {name} (offset {off}, {size} bytes) does not fit in the "
                                 f"{length}-byte file: the sizes disagree with the file length, regenerate it")

        def view(i, dtype, count):
            return np.frombuffer(self.map, dtype, count, offs[i])

        n, S, A = self.n_frames, self.state_dim, self.action_dim
        self.images = view(0, np.uint8, sizes[0]).reshape(n, self.n_cam, self.img, self.img, 3)
        self.state = view(1, "<f4", n * S).reshape(n, S)
        self.action = view(2, "<f4", n * A).reshape(n, A)
        self.frame_episode = view(3, "<u4", n)
        self.episodes = view(4, EPISODE_DTYPE, self.n_episodes)
        self.task_offsets = view(5, "<u8", self.n_tasks + 1)
        self.task_text = view(6, np.uint8, self.task_bytes)
        self.stats = view(7, "<f4", 2 * (S + A))
        self.check_tables()

    def check_tables(self):
        """The tables that index into other sections: every index in range, as shard_open."""
        path, n = self.path, self.n_frames
        first = self.episodes["first_frame"].astype(np.uint64)
        length = self.episodes["length"].astype(np.uint64)
        bad = (length == 0) | (first >= n) | (length > np.uint64(n) - np.minimum(first, np.uint64(n))) \
            | (self.episodes["task"] >= self.n_tasks)
        if bad.any():
            e = int(np.argmax(bad))
            ep = self.episodes[e]
            raise ValueError(f"{path}: episode {e} (first frame {int(ep['first_frame'])}, length {int(ep['length'])}, "
                             f"task {int(ep['task'])}) is out of range: the file is corrupt, regenerate it")
        # every frame an episode claims must name that episode
        starts, lens = first.astype(np.int64), length.astype(np.int64)
        frames = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
        claimed_by = np.repeat(np.arange(self.n_episodes), lens)
        wrong = self.frame_episode[frames] != claimed_by
        if wrong.any():
            k = int(np.argmax(wrong))
            raise ValueError(f"{path}: frame {int(frames[k])} belongs to episode {int(self.frame_episode[frames[k]])} "
                             f"but episode {int(claimed_by[k])} claims it: the file is corrupt, regenerate it")
        if (self.frame_episode >= self.n_episodes).any():
            f = int(np.argmax(self.frame_episode >= self.n_episodes))
            raise ValueError(f"{path}: frame {f} names episode {int(self.frame_episode[f])} of {self.n_episodes}: "
                             "the file is corrupt, regenerate it")
        if self.task_offsets[0] != 0 or self.task_offsets[-1] != self.task_bytes:
            raise ValueError(f"{path}: task string table does not span task_text: the file is corrupt, regenerate it")
        if (self.task_offsets[1:] < self.task_offsets[:-1]).any():
            k = int(np.argmax(self.task_offsets[1:] < self.task_offsets[:-1]))
            raise ValueError(f"{path}: task offsets are not increasing at task {k}: the file is corrupt, regenerate it")

    def task(self, k):
        """Task string k as bytes."""
        return bytes(self.task_text[int(self.task_offsets[k]):int(self.task_offsets[k + 1])])


def list_files(spec):
    """Comma-separated files and folders -> shard paths; a folder gives its *.bin, sorted."""
    files = []
    for tok in spec.split(","):
        if tok == "":
            continue  # strtok skips empty tokens
        if not os.path.exists(tok):
            raise ValueError(f"dataset path {tok}: No such file or directory: check -i")
        if os.path.isdir(tok):
            names = sorted(n for n in os.listdir(tok) if len(n) >= 5 and n.endswith(".bin"))
            if not names:
                raise ValueError(f"folder {tok} holds no *.bin shards: generate data first (see README)")
            files += [f"{tok}/{n}" for n in names]  # C sorts the joined paths; same prefix, same order
        else:
            files.append(tok)
    if not files:
        raise ValueError("no dataset shards given: pass -i FILE[,FILE|DIR...]")
    return files


class Dataset:
    """Shards read as one, with pooled normalization statistics (dataset_open)."""

    def __init__(self, spec):
        self.shards = [Shard(p) for p in list_files(spec)]
        s0 = self.shards[0]
        self.n_cam, self.img, self.state_dim, self.action_dim = s0.n_cam, s0.img, s0.state_dim, s0.action_dim
        for s in self.shards[1:]:
            if (s.n_cam, s.img, s.state_dim, s.action_dim) != (self.n_cam, self.img, self.state_dim, self.action_dim):
                raise ValueError(f"{s.path} has cameras/img/state/action {s.n_cam}/{s.img}/{s.state_dim}/"
                                 f"{s.action_dim} but {s0.path} has {self.n_cam}/{self.img}/{self.state_dim}/"
                                 f"{self.action_dim}: shards of one dataset must agree")
        self.first_sample = np.cumsum([0] + [s.n_frames for s in self.shards]).astype(np.int64)
        self.n_samples = int(self.first_sample[-1])  # every frame starts a sample
        self.state_mean, self.state_std = self.pooled_stats(0, self.state_dim)
        self.action_mean, self.action_std = self.pooled_stats(2 * self.state_dim, self.action_dim)

    def pooled_stats(self, start, D):
        """Shard means and variances weighted by frame counts, in double, as dataset_open."""
        total, sq = np.zeros(D), np.zeros(D)
        for s in self.shards:
            n = float(s.n_frames)
            m = s.stats[start:start + D].astype(np.float64)
            sd = s.stats[start + D:start + 2 * D].astype(np.float64)
            if not (np.isfinite(m).all() and np.isfinite(sd).all() and (sd >= 0).all()):
                raise ValueError(f"{s.path}: normalization statistics hold NaN, Inf or a negative std: "
                                 "regenerate the shard")
            total += n * m
            sq += n * (sd * sd + m * m)
        mean = total / float(self.n_samples)
        var = sq / float(self.n_samples) - mean * mean
        std = np.sqrt(np.maximum(var, 0.0)).astype(np.float32)
        if len(self.shards) == 1:
            std = self.shards[0].stats[start + D:start + 2 * D].copy()  # one shard: its std as stored
        std[~(std >= VLA_MIN_STD)] = 1.0  # constant (or NaN) dims are centered, never divided by 0
        return mean.astype(np.float32), std.astype(np.float32)

    def stats(self):
        """state_mean, state_std, action_mean, action_std in one f32 array: what normalization uses."""
        return np.concatenate([self.state_mean, self.state_std, self.action_mean, self.action_std])

    def assemble(self, index, cfg):
        """Sample `index` (a global frame number), as dataset_assemble.
        Returns images u8 (n_cam, img, img, 3), text u8 (max_text), text_mask f32 (max_text),
        state f32 (S) normalized, actions f32 (H, A) normalized, action_mask f32 (H)."""
        if (cfg.n_cam, cfg.img, cfg.state_dim, cfg.action_dim) != \
                (self.n_cam, self.img, self.state_dim, self.action_dim):
            raise ValueError("config observation fields (n_cam/img/state_dim/action_dim) differ from the "
                             "dataset's: take them from the dataset")
        if not 0 <= index < self.n_samples:
            raise ValueError(f"sample {index} is outside the dataset's {self.n_samples} samples")
        k = int(np.searchsorted(self.first_sample, index, side="right")) - 1
        s = self.shards[k]
        f = index - int(self.first_sample[k])
        ep = s.episodes[s.frame_episode[f]]
        images = np.array(s.images[f])
        t0 = int(s.task_offsets[ep["task"]])
        n_text = min(int(s.task_offsets[ep["task"] + 1]) - t0, cfg.max_text)
        text = np.zeros(cfg.max_text, np.uint8)
        text[:n_text] = s.task_text[t0:t0 + n_text]
        text_mask = (np.arange(cfg.max_text) < n_text).astype(np.float32)
        state = (s.state[f] - self.state_mean) / self.state_std  # float32 throughout, as C
        last = int(ep["first_frame"]) + int(ep["length"]) - 1
        frames = f + np.arange(cfg.chunk)
        action_mask = (frames <= last).astype(np.float32)
        actions = (s.action[np.minimum(frames, last)] - self.action_mean) / self.action_std  # pads repeat the last
        return images, text, text_mask, state.astype(np.float32), actions.astype(np.float32), action_mask


def outermost_missing(path):
    """The outermost folder of `path` that does not exist yet (os.makedirs creates it and all
    below it), or None when `path` exists: what a generator that fails must remove, and no more."""
    path = os.path.abspath(path)
    if os.path.lexists(path):
        return None
    while not os.path.lexists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def write_shard(path, images, state, action, episodes, tasks, stats=None):
    """Writes a shard (the layout of shard_header_layout). images u8 (N, cam, img, img, 3),
    state f32 (N, S), action f32 (N, A), episodes [(first_frame, length, task)], tasks [str].
    stats default to the data's mean and population std, as shard_compute_stats."""
    images = np.ascontiguousarray(images, np.uint8)
    state = np.ascontiguousarray(state, np.float32)
    action = np.ascontiguousarray(action, np.float32)
    n, cam, img = images.shape[0], images.shape[1], images.shape[2]
    if stats is None:
        parts = []
        for x in (state.astype(np.float64), action.astype(np.float64)):
            mean = x.sum(0) / n
            var = (x * x).sum(0) / n - mean * mean
            parts += [mean.astype(np.float32), np.sqrt(np.maximum(var, 0.0)).astype(np.float32)]
        stats = np.concatenate(parts)
    eps = np.array(episodes, EPISODE_DTYPE)
    frame_episode = np.zeros(n, np.uint32)
    for e, (first, length, _) in enumerate(episodes):
        frame_episode[first:first + length] = e
    text = [t.encode() for t in tasks]
    task_offsets = np.cumsum([0] + [len(t) for t in text]).astype(np.uint64)
    h = np.zeros((), HEADER_DTYPE)
    h["magic"], h["version"] = SHARD_MAGIC, SHARD_VERSION
    h["n_cam"], h["img"], h["state_dim"], h["action_dim"] = cam, img, state.shape[1], action.shape[1]
    h["n_frames"], h["n_episodes"], h["n_tasks"], h["task_bytes"] = n, len(eps), len(text), int(task_offsets[-1])
    blobs = [images.tobytes(), state.tobytes(), action.tobytes(), frame_episode.tobytes(), eps.tobytes(),
             task_offsets.tobytes(), b"".join(text), np.asarray(stats, np.float32).tobytes()]
    pos, offs = HEADER_DTYPE.itemsize, []
    for blob in blobs:
        pos = align_up(pos)
        offs.append(pos)
        pos += len(blob)
    for name, off in zip(SECTIONS, offs):
        h["off_" + name] = off
    h["file_size"] = pos
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:  # temp + rename: a reader never sees half a shard
        f.write(h.tobytes())
        for off, blob in zip(offs, blobs):
            f.write(b"\0" * (off - f.tell()))
            f.write(blob)
    os.replace(tmp, path)
