"""
vla_shard.py: the dataset shard format of vla/shards.h, in numpy.

A shard is one little-endian file (vla/shards.h, "dataset shards"), version 2:
  header         ShardHeader, 512 bytes
  images         u8  (n_frames, frame bytes)  each frame its cameras one after another,
                                              camera k cam_height[k] x cam_width[k] x 3 (HWC)
  state          f32 (n_frames, state_dim)
  action         f32 (n_frames, action_dim)
  frame_episode  u32 (n_frames)            episode of each frame, shard-local
  episodes       ShardEpisode (n_episodes) first_frame u64, length u32, task u32
  task_offsets   u64 (n_tasks + 1)         into task_text
  task_text      u8  (task_bytes)          UTF-8, not NUL-terminated
  stats          f32 state_mean(S) state_std(S) action_mean(A) action_std(A)
  token_offsets  u64 (n_tasks + 1)         into tokens
  tokens         i32 (n_tokens)            each task's instruction as ids in [0, vocab)
Sections follow each other in this order, each at the first 64-byte boundary after the one
before. The header names the tokenizer of the ids ("bytes": id = UTF-8 byte, vocabulary 256; or
"<tokenizer.json basename>:<first 16 hex digits of its sha256>") and its vocabulary size.
Version 1 (a 256-byte header, the first 8 sections, every camera img x img) still reads, as the
same view: camera sizes img x img, tokenizer "bytes", the tokens made from the task text.

Shard checks a file as vla/shards.h's shard_open does, Dataset reads several shards as one with
the pooled statistics of dataset_open, and Dataset.assemble builds one sample exactly as
dataset_assemble. write_shard is the inverse of Shard, for generators and tests.
Bad files raise ValueError with one line that names the file and the fix.
"""

import hashlib
import os

import numpy as np

import hub_cache  # data/hub_cache.py, beside this file: a tokenizer's hub id as its cached folder

SHARD_MAGIC = 0x44414C56  # "VLAD"
SHARD_VERSION = 2
SHARD_ALIGN = 64
HEADER_V1_BYTES = 256  # version 1's header: the first 128 bytes of version 2's, then zeros
MAX_CAM, MAX_IMG, MAX_DIM = 16, 4096, 4096
MAX_VOCAB = 1 << 24
VLA_MIN_STD = np.float32(1e-6)  # a std below this counts as zero: the dim is only centered

HEADER_DTYPE = np.dtype([
    ("magic", "<u4"), ("version", "<u4"),
    ("n_cam", "<u4"), ("img", "<u4"), ("state_dim", "<u4"), ("action_dim", "<u4"),
    ("n_frames", "<u8"), ("n_episodes", "<u8"), ("n_tasks", "<u8"), ("task_bytes", "<u8"),
    ("off_images", "<u8"), ("off_state", "<u8"), ("off_action", "<u8"), ("off_frame_episode", "<u8"),
    ("off_episodes", "<u8"), ("off_task_offsets", "<u8"), ("off_task_text", "<u8"), ("off_stats", "<u8"),
    ("file_size", "<u8"),
    # version 2 from here on
    ("n_tokens", "<u8"), ("off_token_offsets", "<u8"), ("off_tokens", "<u8"),
    ("vocab", "<u4"), ("reserved0", "<u4"),
    ("tokenizer", "u1", (64,)),  # NUL-terminated ASCII
    ("cam_height", "<u4", (MAX_CAM,)), ("cam_width", "<u4", (MAX_CAM,)),
    ("reserved", "<u8", (20,)),
])
assert HEADER_DTYPE.itemsize == 512 and HEADER_DTYPE.fields["n_tokens"][1] == 128
EPISODE_DTYPE = np.dtype([("first_frame", "<u8"), ("length", "<u4"), ("task", "<u4")])
assert EPISODE_DTYPE.itemsize == 16

# instruction tokens each preset of vla/config.h reads (the max_text column of FLOW_PRESETS;
# tests/data/test_metaworld.py checks these against vla/config.h). train_vla's --max-text overrides them.
PRESET_MAX_TEXT = {"tiny": 16, "small": 48, "smolvla": 48, "pi0_tiny": 16, "pi0_small": 48, "pi0": 48}
# rows of each preset's text table (the vocab column, checked the same way): the ids it can read
PRESET_VOCAB = {"tiny": 256, "small": 256, "smolvla": 49280, "pi0_tiny": 256, "pi0_small": 256, "pi0": 257152}


class BytesTokenizer:
    """The byte-level vocabulary of the presets trained from scratch: one id per UTF-8 byte."""
    name = "bytes"
    vocab = 256

    def encode(self, text):
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)


BYTES = BytesTokenizer()


def tokenizer_json_id(path):
    """The name a shard gives the tokenizer of a tokenizer.json: its basename and the first 16 hex
    digits of its sha256 (what the converters' --tokenizer writes and a checkpoint records)."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return f"{os.path.basename(path)}:{digest[:16]}"


# What LeRobot 0.6.1 feeds SmolVLA for a task string (lerobot/policies/smolvla/processor_smolvla.py,
# lerobot/processor/newline_task_processor.py and tokenizer_processor.py, with transformers 5.5.4):
#   1. NewLineTaskProcessorStep: task + "\n", unless the task already ends with "\n".
#   2. TokenizerProcessorStep(tokenizer_name=vlm_model_name, max_length=tokenizer_max_length (48),
#      truncation=True, padding=pad_language_to ("longest"), padding_side="right"): the VLM folder's
#      AutoTokenizer called on the batch's tasks, everything else at its default, so
#      add_special_tokens=True: tokenizer.json's post-processor adds what it names (SmolVLM2's adds
#      nothing: no BOS, no EOS). Truncation keeps the first 48 ids (special ones included); padding
#      appends the tokenizer's pad id (SmolVLM2: <|im_end|>, 2) up to the batch's longest; the
#      attention mask is 1 on the ids and 0 on pads, cast to bool. The result is
#      observation.language.tokens (int64) and observation.language.attention_mask (bool), both
#      (B, L) with L = min(48, the longest task's ids).
# A shard stores encode(task), the ids before truncation and padding; the trainers and the policy
# library cut them to max_text (LeRobot's tokenizer_max_length) and right-pad with the config's
# pad_token (the VLM config's pad id), mask 0 on pads (dataset_assemble in vla/dataset.h,
# policy_observations in vla/policy.h). LeRobot's tensors are the first L columns of that batch; the
# other max_text - L columns are what LeRobot writes for a batch whose longest task is longer (pads,
# masked as keys and queries: no number depends on them). Cutting the ids afterwards equals the
# tokenizer's truncation as long as the post-processor adds nothing after the text (an EOS would be
# cut off where LeRobot keeps it): TokenizerJSON refuses a tokenizer that does.
# Where transformers and tokenizer.json can part: transformers 5 loads a tokenizer whose
# tokenizer_config.json names a class with its own constructor (SmolVLM2's names GPT2Tokenizer) by
# rebuilding it from tokenizer.json's vocabulary, merges and post-processor with that class's
# pre-tokenizer (GPT2Tokenizer: plain ByteLevel); the tokenizers library (and transformers 4, which
# trained smolvla_base) runs tokenizer.json as written. The ids differ only where the file's
# pre-tokenizer splits text that ByteLevel keeps in one piece and the merges would join it again;
# tests/lerobot/test_lerobot_io.py checks a Digits + ByteLevel tokenizer whose merges never join digits.
# pi0 (lerobot/policies/pi0/processor_pi0.py) feeds the same ids by another road:
#   1. Pi0NewLineProcessor: task + "\n", unless the task already ends with "\n" (the same rule).
#   2. TokenizerProcessorStep(tokenizer_name="google/paligemma-3b-pt-224", max_length=tokenizer_max_length
#      (48), padding="max_length", padding_side="right", truncation=True): PaliGemma's post-processor
#      puts <bos> (id 2) before the text and nothing after it, so the cut keeps <bos> and the first 47
#      text ids, as LeRobot's truncation does; pads (<pad>, id 0) fill every row to 48 columns whatever
#      the batch's longest, mask 0. The trainers' batches always hold max_text columns: for pi0 they
#      are LeRobot's tensors whole.
#   PaliGemma's tokenizer_config.json names GemmaTokenizer, which transformers 5 rebuilds from
#   tokenizer.json's vocabulary and merges (BPE with byte fallback, spaces replaced by "▁" before
#   anything else, then a split on spaces that finds none), the post-processor from add_bos_token /
#   add_eos_token (true / false): the pipeline tokenizer.json itself writes down, so the ids are the
#   same (tests/policy/test_policy.py --family pi0 checks it on a tokenizer of that kind).
class TokenizerJSON:
    """A tokenizer.json (PyPI tokenizers) as the shards use it: name (tokenizer_json_id), vocab (one
    past its largest id, added tokens included) and encode(text) -> the ids LeRobot's pre-processor
    feeds for that task before truncation and padding (the comment above; SmolVLA's and pi0's
    pre-processors alike). path: a tokenizer.json, or a folder that holds one (a model's, a VLM's,
    PaliGemma's). Raises ValueError with one line."""

    def __init__(self, path):
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer {path}: no such file: pass a tokenizer.json, or the model folder that holds it")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("the tokenizers package is missing: install the data tools' packages (make setup, "
                             "requirements.txt)") from None
        try:
            tok = Tokenizer.from_file(path)
        except Exception as e:  # the Rust parser's message, on one line
            raise ValueError(f"tokenizer {path}: not a tokenizer.json the tokenizers library reads "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        tok.no_truncation()  # the ids whole: truncation is max_text's, in the trainer
        tok.no_padding()
        self.path, self.name, self.tokenizer = path, tokenizer_json_id(path), tok
        self.vocab = 1 + max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
        probe = tok.encode("a\n")
        bare = tok.encode("a\n", add_special_tokens=False).ids
        if probe.ids[len(probe.ids) - len(bare):] != bare:
            raise ValueError(f"tokenizer {path} adds {len(probe.ids) - len(bare)} special token(s), some after the text "
                             "(its post-processor): LeRobot's truncation keeps them, train_vla's cut to max_text would "
                             "drop them; such tokenizers are not supported")
        if not 1 <= self.vocab <= MAX_VOCAB:
            raise ValueError(f"tokenizer {path}: a vocabulary of {self.vocab} ids is outside 1 to {MAX_VOCAB}")

    def encode(self, text):
        if not text.endswith("\n"):
            text += "\n"  # NewLineTaskProcessorStep
        return np.asarray(self.tokenizer.encode(text).ids, np.int32)


def load_tokenizer(spec):
    """"bytes" (or None): BYTES; else a tokenizer.json, a folder holding one, or the hub id of a
    model whose cached snapshot holds one (data/hub_cache.py): TokenizerJSON."""
    if spec in (None, BYTES.name):
        return BYTES
    return TokenizerJSON(hub_cache.local_folder(spec, "model", "tokenizer.json"))


def camera_offsets(heights, widths):
    """Byte offset of each camera in a frame's images, and the frame's bytes as the last entry."""
    return np.cumsum([0] + [int(h) * int(w) * 3 for h, w in zip(heights, widths)]).tolist()


def split_cameras(frame, heights, widths):
    """A frame's images (u8, the cameras one after another) as one (H, W, 3) array per camera."""
    offs = camera_offsets(heights, widths)
    return [frame[offs[k]:offs[k + 1]].reshape(int(heights[k]), int(widths[k]), 3) for k in range(len(heights))]


def square_side(heights, widths):
    """The side when every camera is img x img, else 0 (the header's img)."""
    sides = {int(h) for h in heights} | {int(w) for w in widths}
    return sides.pop() if len(sides) == 1 else 0


def describe_cameras(heights, widths):
    """'8x12, 16x16' (height x width of each camera), as vla/shards.h's messages say it."""
    return ", ".join(f"{int(h)}x{int(w)}" for h, w in zip(heights, widths))


def distinct_text_bytes(instructions, tokenizer=BYTES):
    """The fewest tokens (bytes, for the bytes tokenizer) that keep every distinct instruction
    distinct once cut: one past the longest prefix two of them share (a shorter one that is a
    prefix of a longer counts whole)."""
    texts = sorted({tuple(tokenizer.encode(t).tolist()) for t in instructions})
    need = 1
    for a, b in zip(texts, texts[1:]):  # sorted: the longest shared prefix is between neighbours
        p = 0
        while p < min(len(a), len(b)) and a[p] == b[p]:
            p += 1
        need = max(need, p + 1)
    return need


def text_collisions(instructions, max_text, tokenizer=BYTES):
    """Groups of distinct instructions (lists, in first-seen order) that read the same once their
    tokens are cut to max_text, as the trainers cut them."""
    groups = {}
    for t in dict.fromkeys(instructions):
        groups.setdefault(tuple(tokenizer.encode(t)[:max_text].tolist()), []).append(t)
    return [g for g in groups.values() if len(g) > 1]


def text_collision_warnings(instructions, tokenizer=BYTES):
    """One warning line per text length of the presets of vla/config.h that can read the tokenizer's ids,
    where that length makes instructions identical (the presets of one length named in its line)."""
    lines, need = [], distinct_text_bytes(instructions, tokenizer)
    unit = "bytes" if tokenizer.name == BYTES.name else "tokens"
    readers = {}  # text length -> the presets that read the tokenizer's ids at it, one line for all
    for preset, max_text in PRESET_MAX_TEXT.items():
        if PRESET_VOCAB[preset] >= tokenizer.vocab:
            readers.setdefault(max_text, []).append(preset)
    for max_text, presets in readers.items():
        preset = presets[0] + (f" (and {', '.join(presets[1:])})" if len(presets) > 1 else "")
        groups = text_collisions(instructions, max_text, tokenizer)
        if groups:  # the first 10 groups, 10 names each, then how many more: one line however many
            named = [", ".join(f'"{t}"' for t in g[:10]) + (f" and {len(g) - 10} more" if len(g) > 10 else "")
                     for g in groups[:10]]
            same = "; ".join(named) + (f"; and {len(groups) - 10} more groups" if len(groups) > 10 else "")
            lines.append(f"warning: cut to the {max_text} {unit} preset {preset} reads, these instructions become the "
                         f"same task: {same}; train with --max-text {need} or more to keep every instruction distinct")
    return lines


# sections in file order (the header's field is "off_" + name); version 1 has the first 8
SECTIONS = ["images", "state", "action", "frame_episode", "episodes", "task_offsets", "task_text", "stats",
            "token_offsets", "tokens"]
SECTIONS_V1 = 8


def section_sizes(h, path, frame_bytes, version):
    """Byte sizes of the sections in file order, from the header's counts (and the cameras')."""
    n, S, A = int(h["n_frames"]), int(h["state_dim"]), int(h["action_dim"])
    sizes = [n * frame_bytes, n * S * 4, n * A * 4, n * 4, int(h["n_episodes"]) * 16,
             (int(h["n_tasks"]) + 1) * 8, int(h["task_bytes"]), 8 * (S + A)]
    if version != 1:
        sizes += [(int(h["n_tasks"]) + 1) * 8, int(h["n_tokens"]) * 4]
    # C multiplies in 64 bits: a size that does not fit is a corrupt header there too
    if any(s >= 1 << 64 for s in sizes) or int(h["n_tasks"]) == (1 << 64) - 1:
        raise ValueError(f"{path}: a section size overflows 64 bits: the file is corrupt, regenerate it")
    return sizes


def align_up(x):
    return (x + SHARD_ALIGN - 1) // SHARD_ALIGN * SHARD_ALIGN


class Shard:
    """One memory-mapped shard of version 1 or 2; every size is checked against the file before use.
    images is (n_frames, n_cam, H, W, 3) when every camera has one size (else None: camera_images(k)
    gives camera k's (n_frames, H_k, W_k, 3) for any); frames is (n_frames, frame bytes), as stored."""

    def __init__(self, path):
        self.path = path
        try:
            length = os.path.getsize(path)
        except OSError as e:
            raise ValueError(f"cannot open dataset shard {path}: {e.strerror}: check the -i path") from None
        if length < HEADER_V1_BYTES:
            raise ValueError(f"{path}: {length} bytes is shorter than a shard header (256): "
                             "the file is truncated, regenerate it")
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        raw = bytearray(HEADER_DTYPE.itemsize)
        raw[:128] = bytes(self.map[:128])  # version 1's fields
        h = np.frombuffer(raw, HEADER_DTYPE, 1, 0)[0]
        if h["magic"] != SHARD_MAGIC:
            raise ValueError(f"{path}: bad magic 0x{int(h['magic']):08x} (want 0x{SHARD_MAGIC:08x}): "
                             "not a train_vla dataset shard; convert it with the tools in data/")
        self.version = int(h["version"])
        if self.version not in (1, SHARD_VERSION):
            raise ValueError(f"{path}: shard version {self.version}, this build reads versions 1 and "
                             f"{SHARD_VERSION}: regenerate the shard with this version's data/ tools")
        if self.version != 1:
            if length < HEADER_DTYPE.itemsize:
                raise ValueError(f"{path}: {length} bytes is shorter than a version-2 shard header (512): "
                                 "the file is truncated, regenerate it")
            raw[:] = bytes(self.map[:HEADER_DTYPE.itemsize])
            h = np.frombuffer(raw, HEADER_DTYPE, 1, 0)[0]
        self.header = h
        self.n_cam, self.img = int(h["n_cam"]), int(h["img"])
        self.state_dim, self.action_dim = int(h["state_dim"]), int(h["action_dim"])
        self.n_frames, self.n_episodes = int(h["n_frames"]), int(h["n_episodes"])
        self.n_tasks, self.task_bytes = int(h["n_tasks"]), int(h["task_bytes"])
        if not (1 <= self.n_cam <= MAX_CAM and (self.version != 1 or 1 <= self.img <= MAX_IMG)
                and 1 <= self.state_dim <= MAX_DIM and 1 <= self.action_dim <= MAX_DIM
                and 1 <= self.n_frames <= 0xFFFFFFFF and 1 <= self.n_episodes <= self.n_frames
                and 1 <= self.n_tasks <= 0xFFFFFFFF):
            raise ValueError(f"{path}: header sizes out of range (n_cam {self.n_cam}, img {self.img}, "
                             f"state {self.state_dim}, action {self.action_dim}, frames {self.n_frames}, "
                             f"episodes {self.n_episodes}, tasks {self.n_tasks}): the file is corrupt, regenerate it")
        if self.version == 1:  # the same view as version 2
            self.cam_height = self.cam_width = (self.img,) * self.n_cam
            self.tokenizer, self.vocab, self.n_tokens = BYTES.name, BYTES.vocab, self.task_bytes
        else:
            self.check_header_v2(h, length)
        if int(h["file_size"]) != length:
            raise ValueError(f"{path}: header says {int(h['file_size'])} bytes but the file has {length}: "
                             "the file is truncated or padded, regenerate it")
        self.frame_bytes = camera_offsets(self.cam_height, self.cam_width)[-1]
        sizes = section_sizes(h, path, self.frame_bytes, self.version)
        names = SECTIONS[:len(sizes)]
        offs = [int(h["off_" + name]) for name in names]
        end = HEADER_V1_BYTES if self.version == 1 else HEADER_DTYPE.itemsize
        for i, (name, off, size) in enumerate(zip(names, offs, sizes)):
            if off % SHARD_ALIGN != 0:
                raise ValueError(f"{path}: section {name} starts at offset {off}, not a multiple of {SHARD_ALIGN} as "
                                 "the format requires: the file is corrupt, regenerate it")
            header_bytes = HEADER_V1_BYTES if self.version == 1 else HEADER_DTYPE.itemsize
            if off < header_bytes or off + size > length:
                raise ValueError(f"{path}: section {name} (offset {off}, {size} bytes) does not fit in the "
                                 f"{length}-byte file: the sizes disagree with the file length, regenerate it")
            if off != align_up(end):
                if i == 1:
                    raise ValueError(f"{path}: the camera sizes ({describe_cameras(self.cam_height, self.cam_width)}, "
                                     f"height x width) make {self.n_frames} frames {sizes[0]} bytes of images, ending "
                                     f"at offset {end}, but the next section starts at {off}: the camera sizes "
                                     "disagree with the file; it is corrupt, regenerate it")
                raise ValueError(f"{path}: section {name} starts at offset {off}, but what comes before it ends at "
                                 f"{end} (next boundary {align_up(end)}): the header's sizes disagree with the layout; "
                                 "the file is corrupt, regenerate it")
            end = off + size
        if end != length:
            raise ValueError(f"{path}: the last section ends at offset {end} but the file has {length} bytes: the "
                             "header's sizes disagree with the layout; the file is corrupt, regenerate it")

        def view(i, dtype, count):
            return np.frombuffer(self.map, dtype, count, offs[i])

        n, S, A = self.n_frames, self.state_dim, self.action_dim
        self.frames = view(0, np.uint8, sizes[0]).reshape(n, self.frame_bytes)
        self.images = None
        if len(set(self.cam_height)) == 1 and len(set(self.cam_width)) == 1:
            self.images = self.frames.reshape(n, self.n_cam, self.cam_height[0], self.cam_width[0], 3)
        self.state = view(1, "<f4", n * S).reshape(n, S)
        self.action = view(2, "<f4", n * A).reshape(n, A)
        self.frame_episode = view(3, "<u4", n)
        self.episodes = view(4, EPISODE_DTYPE, self.n_episodes)
        self.task_offsets = view(5, "<u8", self.n_tasks + 1)
        self.task_text = view(6, np.uint8, self.task_bytes)
        self.stats = view(7, "<f4", 2 * (S + A))
        self.check_tables()
        if self.version == 1:  # byte tokens of the task text: the one copy a version-1 shard needs
            self.token_offsets, self.tokens = self.task_offsets, self.task_text.astype(np.int32)
        else:
            self.token_offsets = view(8, "<u8", self.n_tasks + 1)
            self.tokens = view(9, "<i4", self.n_tokens)
        self.check_tokens()

    def check_header_v2(self, h, length):
        """Version 2's fields: the cameras, the tokenizer, the token count; as shard_open."""
        path = self.path
        heights, widths = [int(x) for x in h["cam_height"]], [int(x) for x in h["cam_width"]]
        for k in range(MAX_CAM):
            if k < self.n_cam and not (1 <= heights[k] <= MAX_IMG and 1 <= widths[k] <= MAX_IMG):
                raise ValueError(f"{path}: camera {k} is {heights[k]}x{widths[k]} pixels (height x width), outside 1 to "
                                 f"{MAX_IMG}: the file is corrupt, regenerate it")
            if k >= self.n_cam and (heights[k] or widths[k]):
                raise ValueError(f"{path}: camera {k} has a size ({heights[k]}x{widths[k]}) but the shard has "
                                 f"{self.n_cam} camera(s): the file is corrupt, regenerate it")
        self.cam_height, self.cam_width = tuple(heights[:self.n_cam]), tuple(widths[:self.n_cam])
        if self.img != square_side(self.cam_height, self.cam_width):
            raise ValueError(f"{path}: img {self.img} disagrees with the camera sizes "
                             f"({describe_cameras(self.cam_height, self.cam_width)}, height x width; img is their side "
                             "when all are square and equal, else 0): the file is corrupt, regenerate it")
        name = bytes(h["tokenizer"])
        if b"\0" not in name:
            raise ValueError(f"{path}: the tokenizer name is not NUL-terminated within its 64 bytes: the file is "
                             "corrupt, regenerate it")
        name = name[:name.index(b"\0")]
        if not name or any(c < 0x20 or c >= 0x7f for c in name):
            raise ValueError(f"{path}: the tokenizer name is empty or not printable ASCII: the file is corrupt, "
                             "regenerate it")
        self.tokenizer, self.vocab, self.n_tokens = name.decode("ascii"), int(h["vocab"]), int(h["n_tokens"])
        if not 1 <= self.vocab <= MAX_VOCAB:
            raise ValueError(f"{path}: vocabulary size {self.vocab} of tokenizer {self.tokenizer} is outside 1 to "
                             f"{MAX_VOCAB}: the file is corrupt, regenerate it")
        if self.tokenizer == BYTES.name and self.vocab != BYTES.vocab:
            raise ValueError(f"{path}: tokenizer \"bytes\" with a vocabulary of {self.vocab}, not 256: the file is "
                             "corrupt, regenerate it")
        if self.n_tokens > length // 4:
            raise ValueError(f"{path}: {self.n_tokens} tokens cannot fit in the {length}-byte file: the file is "
                             "corrupt, regenerate it")

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

    def check_tokens(self):
        """The token ids: a table that spans them, every id in the vocabulary, and under "bytes" the
        bytes of each task's text; as shard_open."""
        path, offs = self.path, self.token_offsets
        if offs[0] != 0 or offs[-1] != self.n_tokens:
            raise ValueError(f"{path}: token offsets do not span the {self.n_tokens} tokens: the file is corrupt, "
                             "regenerate it")
        if (offs[1:] < offs[:-1]).any():
            k = int(np.argmax(offs[1:] < offs[:-1]))
            raise ValueError(f"{path}: token offsets are not increasing at task {k}: the file is corrupt, regenerate it")
        bad = (self.tokens < 0) | (self.tokens >= self.vocab)
        if bad.any():
            t = int(np.argmax(bad))
            k = int(np.searchsorted(offs, t, side="right")) - 1
            raise ValueError(f"{path}: task {k} has token id {int(self.tokens[t])}, outside the vocabulary "
                             f"[0, {self.vocab}) of tokenizer {self.tokenizer}: the file is corrupt, regenerate it")
        if self.tokenizer == BYTES.name:
            for k in range(self.n_tasks):
                if not np.array_equal(self.task_tokens(k), np.frombuffer(self.task(k), np.uint8)):
                    raise ValueError(f"{path}: the tokens of task {k} are not the bytes of its text, as tokenizer "
                                     "\"bytes\" says: the file is corrupt, regenerate it")

    def task(self, k):
        """Task string k as bytes."""
        return bytes(self.task_text[int(self.task_offsets[k]):int(self.task_offsets[k + 1])])

    def task_tokens(self, k):
        """The token ids of task k (int32)."""
        return np.asarray(self.tokens[int(self.token_offsets[k]):int(self.token_offsets[k + 1])], np.int32)

    def camera_images(self, k):
        """Camera k's images of every frame, (n_frames, H_k, W_k, 3), a view of the file."""
        offs = camera_offsets(self.cam_height, self.cam_width)
        return self.frames[:, offs[k]:offs[k + 1]].reshape(self.n_frames, self.cam_height[k], self.cam_width[k], 3)


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
        self.cam_height, self.cam_width = s0.cam_height, s0.cam_width
        self.tokenizer, self.vocab = s0.tokenizer, s0.vocab
        for s in self.shards[1:]:
            if (s.n_cam, s.img, s.state_dim, s.action_dim) != (self.n_cam, self.img, self.state_dim, self.action_dim):
                raise ValueError(f"{s.path} has cameras/img/state/action {s.n_cam}/{s.img}/{s.state_dim}/"
                                 f"{s.action_dim} but {s0.path} has {self.n_cam}/{self.img}/{self.state_dim}/"
                                 f"{self.action_dim}: shards of one dataset must agree")
            if (s.cam_height, s.cam_width) != (self.cam_height, self.cam_width):
                raise ValueError(f"{s.path} has cameras of {describe_cameras(s.cam_height, s.cam_width)} pixels but "
                                 f"{s0.path} has {describe_cameras(self.cam_height, self.cam_width)} (height x width): "
                                 "shards of one dataset must agree")
            if (s.tokenizer, s.vocab) != (self.tokenizer, self.vocab):
                raise ValueError(f"{s.path} has the token ids of tokenizer {s.tokenizer} (vocabulary {s.vocab}) but "
                                 f"{s0.path} has {self.tokenizer} ({self.vocab}): shards of one dataset must agree: "
                                 "convert them with one tokenizer")
        self.frame_bytes = s0.frame_bytes
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

    def split_cameras(self, images):
        """One sample's images (as assemble returns them) as one (H, W, 3) array per camera."""
        return split_cameras(images, self.cam_height, self.cam_width)

    def assemble(self, index, cfg):
        """Sample `index` (a global frame number), as dataset_assemble.
        Returns images u8 (frame bytes: the cameras one after another, split_cameras splits them),
        tokens i32 (max_text: the task's ids cut to max_text, then cfg.pad_token, 0 when cfg has none as
        for the bytes presets), text_mask f32 (max_text), state f32 (S) normalized, actions f32 (H, A)
        normalized, action_mask f32 (H)."""
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
        images = np.array(s.frames[f])
        ids = s.task_tokens(int(ep["task"]))[:cfg.max_text]
        tokens = np.full(cfg.max_text, getattr(cfg, "pad_token", 0), np.int32)  # right-padded, as LeRobot
        tokens[:len(ids)] = ids
        text_mask = (np.arange(cfg.max_text) < len(ids)).astype(np.float32)
        state = (s.state[f] - self.state_mean) / self.state_std  # float32 throughout, as C
        last = int(ep["first_frame"]) + int(ep["length"]) - 1
        frames = f + np.arange(cfg.chunk)
        action_mask = (frames <= last).astype(np.float32)
        actions = (s.action[np.minimum(frames, last)] - self.action_mean) / self.action_std  # pads repeat the last
        return images, tokens, text_mask, state.astype(np.float32), actions.astype(np.float32), action_mask


def outermost_missing(path):
    """The outermost folder of `path` that does not exist yet (os.makedirs creates it and all
    below it), or None when `path` exists: what a generator that fails must remove, and no more."""
    path = os.path.abspath(path)
    if os.path.lexists(path):
        return None
    while not os.path.lexists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def write_shard(path, images, state, action, episodes, tasks, stats=None, tokenizer=BYTES, version=SHARD_VERSION):
    """Writes a shard (the layout of shard_header_layout). images u8 (N, cam, H, W, 3), or a list
    with one (N, H_k, W_k, 3) array per camera for cameras of different sizes; state f32 (N, S),
    action f32 (N, A), episodes [(first_frame, length, task)], tasks [str], each task's token ids
    from tokenizer.encode (name, vocab, encode: BYTES by default). stats default to the data's mean
    and population std, as shard_compute_stats. version 1 (square cameras of one size, byte tokens
    only) is for tests of the reader's version-1 path."""
    one_size = not isinstance(images, (list, tuple))
    cams = list(np.swapaxes(np.asarray(images), 0, 1)) if one_size else [np.asarray(c) for c in images]
    n = cams[0].shape[0] if cams and cams[0].ndim == 4 else 0
    if not 1 <= len(cams) <= MAX_CAM or any(c.ndim != 4 or c.shape[0] != n or c.shape[3] != 3 for c in cams):
        raise ValueError(f"{path}: images must be 1 to {MAX_CAM} cameras of (frames, height, width, 3), all with the "
                         f"same frames: got {[c.shape for c in cams]}")
    heights, widths = [c.shape[1] for c in cams], [c.shape[2] for c in cams]
    if one_size:  # (N, cam, H, W, 3) is already the frames' layout
        frames = np.ascontiguousarray(images, np.uint8).reshape(n, -1)
    else:
        frames = np.concatenate([np.ascontiguousarray(c, np.uint8).reshape(n, -1) for c in cams], axis=1)
    state = np.ascontiguousarray(state, np.float32)
    action = np.ascontiguousarray(action, np.float32)
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
    ids = [np.asarray(tokenizer.encode(t), np.int32) for t in tasks]  # where a real tokenizer plugs in
    if any(((x < 0) | (x >= tokenizer.vocab)).any() for x in ids):
        raise ValueError(f"{path}: tokenizer {tokenizer.name} gave ids outside its vocabulary of {tokenizer.vocab}")
    token_offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.uint64)
    side = square_side(heights, widths)
    if version == 1 and (side == 0 or tokenizer.name != BYTES.name):
        raise ValueError(f"{path}: version 1 holds only square cameras of one size and byte tokens")
    h = np.zeros((), HEADER_DTYPE)
    h["magic"], h["version"] = SHARD_MAGIC, version
    h["n_cam"], h["img"], h["state_dim"], h["action_dim"] = len(cams), side, state.shape[1], action.shape[1]
    h["n_frames"], h["n_episodes"], h["n_tasks"], h["task_bytes"] = n, len(eps), len(text), int(task_offsets[-1])
    blobs = [frames.tobytes(), state.tobytes(), action.tobytes(), frame_episode.tobytes(), eps.tobytes(),
             task_offsets.tobytes(), b"".join(text), np.asarray(stats, np.float32).tobytes()]
    header_bytes = HEADER_V1_BYTES
    if version != 1:
        header_bytes = HEADER_DTYPE.itemsize
        h["n_tokens"], h["vocab"] = int(token_offsets[-1]), tokenizer.vocab
        name = tokenizer.name.encode("ascii")
        if not 1 <= len(name) < 64:
            raise ValueError(f"{path}: tokenizer name {tokenizer.name!r} must be 1 to 63 ASCII characters")
        h["tokenizer"][:len(name)] = np.frombuffer(name, np.uint8)
        h["cam_height"][:len(cams)], h["cam_width"][:len(cams)] = heights, widths
        blobs += [token_offsets.tobytes(), np.concatenate([np.zeros(0, np.int32)] + ids).astype("<i4").tobytes()]
    pos, offs = header_bytes, []
    for blob in blobs:
        pos = align_up(pos)
        offs.append(pos)
        pos += len(blob)
    for name, off in zip(SECTIONS, offs):
        h["off_" + name] = off
    h["file_size"] = pos
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:  # temp + rename: a reader never sees half a shard
        f.write(h.tobytes()[:header_bytes])
        for off, blob in zip(offs, blobs):
            f.write(b"\0" * (off - f.tell()))
            f.write(blob)
    os.replace(tmp, path)
