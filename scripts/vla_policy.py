"""
vla_policy.py: a train_vla checkpoint as a policy in Python, through the C model (ctypes): on the
CPU with libvla.so (train_vla.c, fp32), or on a GPU with libvla_gpu.so (train_vla.cu, bf16 unless
built with PRECISION=FP32). Both take the same observations and give the same actions, within
the precision of the one that computes.

    from vla_policy import VLAPolicy
    policy = VLAPolicy("out/small/ckpt_00001000.bin")                 # make libvla.so first
    policy = VLAPolicy("out/small/ckpt_00001000.bin", device="cuda")  # make libvla_gpu.so first
    policy = VLAPolicy("smolvla.bin", tokenizer="SmolVLM2-500M-Video-Instruct/")  # a tokenizer.json's ids
    policy = VLAPolicy("pi0.bin", tokenizer="paligemma-3b-pt-224/")      # pi0: PaliGemma's tokenizer.json
    policy = VLAPolicy("pi0.bin", tokenizer="google/paligemma-3b-pt-224")  # its hub id, from the HF cache
    chunk = policy.act([top, wrist], ["open the door"], state)  # (B, H, A) actions in the data's units

images: one uint8 array (B, h_k, w_k, 3) per camera the model was trained on, in order, of any
size (the model resizes each frame with padding to its square input: on the left and top for
SmolVLA, centred for pi0, as LeRobot pads), or one (B, n_cam, h, w, 3) array when the cameras share
a size. None for a camera the observation lacks: LeRobot then feeds an image of -1 that the
attention masks out, and the library computes exactly that (the present cameras alone; at least
one must be present); instructions: B strings; state: float32 (B, state_dim) raw
(the checkpoint's statistics normalize it). A NaN or Inf in the state or the noise (or a value past
float32's range) and a NUL character in an instruction are one-line ValueErrors naming the element.
The library reads 8-bit frames. Float frames in [0, 1] as LeRobot passes them (uint8 / 255, in
float16, float32 or float64) are accepted when they are 8-bit frames divided by 255: round(x * 255)
gives back the 8-bit frame exactly, so they act as those frames do (and as LeRobot does on them,
to fp32 rounding: the model computes u8 / 255 in float as LeRobot does). Integer frames within
0..255 pass as 8-bit values. Float frames outside [0, 1], NaN or Inf, or off the 1/255 grid are
refused, as are integer frames outside 0..255 and other dtypes: a one-line ValueError naming the
camera, never a silent wrap.
Instructions become the token ids the checkpoint was trained on (its header names the tokenizer):
under "bytes" (the presets trained from scratch) their UTF-8 bytes, as the library reads strings;
under a tokenizer.json ("<basename>:<sha256 prefix>", e.g. a model imported from LeRobot) the
tokenizer= file (or the folder that holds it, or a model's hub id when no path of that name exists:
the HF cache's snapshot holding tokenizer.json, $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub, models--ORG--NAME/snapshots/<refs/main's commit>, data/hub_cache.py's
rule; nothing is downloaded, an id not cached is a ValueError naming the folders looked at and
`hf download ID`), whose name must be the checkpoint's, tokenizes them
as the converters do and as LeRobot's pre-processor does (task + "\\n", data/vla_shard.py's
TokenizerJSON: SmolVLM2's tokenizer.json for SmolVLA, PaliGemma's for pi0, whose ids start with
<bos>), and the ids go to the library (vla_policy_act_tokens). Either way the model reads the first
max_text ids, right-padded with the checkpoint's pad id and masked (what LeRobot's padding to the
batch's longest, SmolVLA, or to max_length, pi0, gives). act_tokens takes ids made elsewhere.
The 10-step flow-matching sampling starts from noise drawn from `seed`, or from `noise`
(B, chunk, max_action_dim): the model's action slots are max_action_dim wide; the first
action_dim of them are the data's.

Errors are one line, raised here; the libraries never end or crash the process. Malformed input
is refused before the library sees it: a ValueError or TypeError naming the argument and the
element (an instruction that is not a str names instruction b; a state of strings or ragged rows,
frames of a dtype the library cannot read). A failure inside the library is MemoryError when it
ran out of host or GPU memory (e.g. a batch too large: a smaller one works right after, the policy
lays its batch out again) and RuntimeError otherwise, with the library's line
(vla_policy_last_error). A checkpoint that cannot be served is a ValueError from the constructor.
close() frees the model at once (the library's memory; also done when the object is collected);
afterwards every method that needs it raises RuntimeError (closed), and closing again does nothing.

Threads: the calls on one VLAPolicy are serialized (a lock held around every library call; the C
policy holds its own lock too): the library keeps one batch's observations and activations per
policy, so several threads may share one policy and each gets exactly the actions it would get
alone, one call at a time. Separate policies share no mutable state and run in parallel in
separate threads (ctypes releases the GIL during the call). On the CPU, threads= is the OpenMP
thread count of that policy's own calls, in whichever thread they come from (set around each
call, then put back); each calling thread has its own OpenMP team and transpose scratch. On a GPU
each host thread that calls in makes its own streams and cuBLASLt state at its first call (32 MiB
of GPU memory it keeps until the process ends: serve from a fixed set of threads), and a policy
called from another thread than before makes its CUDA graph again there.
"""

import ctypes
import operator
import os
import sys
import threading

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import hub_cache  # noqa: E402  data/hub_cache.py: a tokenizer's hub id as its snapshot in the HF cache
import vla_shard  # noqa: E402  data/vla_shard.py: tokenizer names and TokenizerJSON

# vla_policy_config's 28 int32, a checkpoint header's order: FLOW_CONFIG_FIELDS but family, the
# checkpoint's train mode, then the family (0 SmolVLA, 1 pi0)
CONFIG_FIELDS = ["n_cam", "state_dim", "action_dim", "img", "patch", "vis_width", "vis_ff", "vis_layers", "vis_heads",
                 "scale_factor", "vocab", "pad_token", "max_text", "d_model", "d_ff", "n_layer", "n_head", "n_kv_head",
                 "head_dim", "d_expert", "d_expert_ff", "self_attn_every", "chunk", "max_state_dim", "max_action_dim",
                 "rope_theta", "train_mode", "family"]
TRAIN_MODES = ["expert", "vlm", "all"]  # TRAIN_MODE_NAMES
MAX_IMG = 4096  # VLA_MAX_IMG: a camera's height and width

LIBRARIES = {"cpu": "libvla.so", "cuda": "libvla_gpu.so"}
POLICY_FAILED, POLICY_NO_MEMORY = 5, 6  # vla/policy.h: a failure inside the library, its line in vla_policy_last_error
CLOSED = "this VLAPolicy is closed: make a new one"


def library_failure(lib, rc):
    """The exception for a failure inside the library (rc POLICY_FAILED or POLICY_NO_MEMORY), with
    its one line; read on the thread that made the call (the library keeps it per thread)."""
    line = lib.vla_policy_last_error().decode(errors="replace")
    line = " ".join(line.splitlines()) or f"code {rc}"
    return MemoryError(line) if rc == POLICY_NO_MEMORY else RuntimeError(line)


def policy_error(rc, tokenizer):
    """What a return code of vla_policy_act / vla_policy_act_tokens means (vla/policy.h's POLICY_* codes)."""
    return {1: "a batch of fewer than 1 observation",
            2: f"a camera size outside 1..{MAX_IMG}, one whose resize leaves nothing of a side, or no camera",
            3: "a negative token count, or a token id outside the model's vocabulary",
            4: f"instruction strings for a checkpoint of tokenizer {tokenizer}, whose ids are not the strings' "
               "bytes: pass its token ids (vla_policy_act_tokens)"}.get(rc, f"code {rc}")


FRAMES_FIX = "pass uint8 frames, or frames in [0, 1] that are uint8 / 255 (as LeRobot passes them)"


def frames_u8(k, frames):
    """Camera k's frames as the C-contiguous uint8 array the library reads: uint8 as they are; float
    frames in [0, 1] on the 1/255 grid as round(x * 255), exactly the 8-bit frames they came from;
    integer frames within 0..255 as they are. Anything else is a one-line ValueError."""
    try:
        im = np.asarray(frames)
    except (ValueError, TypeError):  # ragged frames: numpy's own error would not say which camera
        raise ValueError(f"camera {k}: frames of different shapes (or not an array): pass one (B, h, w, 3) "
                         f"array: {FRAMES_FIX}") from None
    dt = im.dtype
    if dt == np.uint8:
        return np.ascontiguousarray(im)
    if im.size == 0:  # nothing to convert: the shape checks say what is wrong
        return np.ascontiguousarray(im, np.uint8)
    if np.issubdtype(dt, np.floating):
        x = im.astype(np.float64)
        if not np.isfinite(x).all():
            raise ValueError(f"camera {k}: {dt} frames hold NaN or Inf: {FRAMES_FIX}")
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 1:
            whole = lo >= 0 and hi <= 255 and np.array_equal(x, np.rint(x))
            hint = " (these are whole numbers 0..255: cast them to uint8)" if whole else ""
            raise ValueError(f"camera {k}: {dt} frames range over [{lo:g}, {hi:g}], outside [0, 1]: {FRAMES_FIX}{hint}")
        scaled = x * 255
        levels = np.rint(scaled)
        # k / 255 rounded to the frames' dtype is off k by at most 255 * eps / 4 after scaling (half
        # an ulp of a value below 1): a tolerance of twice that, and at least 1e-3, takes float32 and
        # float64 frames of uint8 / 255 however computed, and float16's; 0.5 (127.5) stays out
        tol = max(1e-3, 255 * float(np.finfo(dt).eps) / 2)
        off = np.abs(scaled - levels) > tol
        if off.any():
            at = tuple(int(i) for i in np.argwhere(off)[0])
            raise ValueError(f"camera {k}: {dt} frames in [0, 1] are not multiples of 1/255 (e.g. "
                             f"{float(im[at]):.9g} at {at}): the library reads 8-bit frames: {FRAMES_FIX}")
        return np.ascontiguousarray(levels, np.uint8)
    if np.issubdtype(dt, np.integer):
        lo, hi = int(im.min()), int(im.max())
        if lo < 0 or hi > 255:
            raise ValueError(f"camera {k}: {dt} frames range over {lo}..{hi}, outside 0..255: {FRAMES_FIX}")
        return np.ascontiguousarray(im, np.uint8)
    raise ValueError(f"camera {k}: frames of dtype {dt}: {FRAMES_FIX}")


def finite_f32(name, values, where):
    """values as C-contiguous float32, or a one-line ValueError naming the first non-finite element
    (where(index) says which: observation, slot, element) and what it was: NaN, Inf, or a finite
    value past float32's range (it would become Inf)."""
    raw = np.asarray(values)
    with np.errstate(over="ignore", invalid="ignore"):  # said below, in one line
        out = np.ascontiguousarray(raw, np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        x = raw[at] if raw.shape == out.shape else out[at]
        what = "NaN" if np.isnan(x) else ("+Inf" if x > 0 else "-Inf") if np.isinf(x) else \
            f"{float(x):g}, past float32's range"
        raise ValueError(f"{name}: {where(at)} is {what}: pass finite values")
    return out


def numeric(name, values, want):
    """values as a numpy array of real numbers (a dtype of int, uint or float), or a one-line
    ValueError saying what was given and what to pass (`want`): ragged rows, strings, objects that
    are not numbers, booleans, complex numbers."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError):
        raise ValueError(f"{name}: rows of different lengths (or not an array): pass {want}") from None
    if arr.dtype == object:  # numbers held as objects convert; anything else is said
        if any(x is None for x in arr.reshape(-1)):  # (numpy would make it a NaN)
            raise ValueError(f"{name}: holds None where numbers go: pass {want}")
        try:
            arr = arr.astype(np.float64)
        except (ValueError, TypeError):
            kinds = sorted({type(x).__name__ for x in arr.reshape(-1)} - {"int", "float"})
            raise ValueError(f"{name}: holds {', '.join(kinds) or 'objects'} where numbers go (or rows of different "
                             f"lengths): pass {want}") from None
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name}: an array of dtype {arr.dtype}: pass {want}")
    return arr


def listed(name, values, want):
    """values as a list, or a one-line TypeError saying what to pass (want) when they are no sequence."""
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{name}: {type(values).__name__} is not a sequence: pass {want}") from None


def instruction_texts(instructions):
    """instructions as a list of B str, each one that UTF-8 can write and without NUL; else a
    one-line ValueError or TypeError naming the instruction and what to pass."""
    if isinstance(instructions, (str, bytes, bytearray)):
        raise ValueError("instructions: pass a list of B strings, one per observation")
    texts = listed("instructions", instructions, "a list of B strings, one per observation")
    for b, text in enumerate(texts):
        if isinstance(text, (bytes, bytearray)):
            raise TypeError(f"instruction {b} is bytes: pass str (decode it first, e.g. text.decode('utf-8'))")
        if not isinstance(text, str):
            raise TypeError(f"instruction {b} is {type(text).__name__}: pass str, one instruction per observation")
        if "\0" in text:  # the library reads C strings: it would end there
            raise ValueError(f"instruction {b} holds a NUL character at offset {text.index(chr(0))}: pass text "
                             "without NUL characters")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"instruction {b} holds {text[e.start]!r} at offset {e.start}, which UTF-8 cannot write "
                             "(a lone surrogate): pass valid text") from None
    return texts


def token_sequences(token_ids, vocab, tokenizer):
    """token_ids as B flat int64 arrays within [0, vocab); else a one-line ValueError or TypeError
    naming the instruction."""
    if isinstance(token_ids, (str, bytes, bytearray)):
        raise TypeError("token_ids: pass B sequences of int token ids, one per observation (act takes strings)")
    seqs = listed("token_ids", token_ids, "B sequences of int token ids, one per observation")
    ids = []
    for b, t in enumerate(seqs):
        what = f"instruction {b}: token ids"
        if isinstance(t, (str, bytes, bytearray)):
            raise TypeError(f"{what} given as {type(t).__name__}: pass a sequence of ints (act takes strings)")
        try:
            arr = np.asarray(t)
        except (ValueError, TypeError):
            raise TypeError(f"{what} are not a flat sequence of ints: pass a sequence of ints") from None
        if arr.size == 0:
            ids.append(np.zeros(0, np.int64))
            continue
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{what} of dtype {arr.dtype}: pass a sequence of ints")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"instruction {b}: token id {lo if lo < 0 else hi} is outside the model's vocabulary "
                             f"[0, {vocab}) (tokenizer {tokenizer})")
        ids.append(arr.astype(np.int64).reshape(-1))
    return ids


def load_library(path=None, device="cpu"):
    if device not in LIBRARIES:
        raise ValueError(f"device {device!r}: use one of {', '.join(LIBRARIES)}")
    path = path or os.path.join(ROOT, LIBRARIES[device])
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: build it with `make {os.path.basename(path)}`")
    lib = ctypes.CDLL(path)
    lib.vla_policy_load.restype = ctypes.c_void_p
    lib.vla_policy_load.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.vla_policy_config.restype = None
    lib.vla_policy_config.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
    lib.vla_policy_device.restype = ctypes.c_char_p
    lib.vla_policy_device.argtypes = [ctypes.c_void_p]
    lib.vla_policy_tokenizer.restype = ctypes.c_char_p
    lib.vla_policy_tokenizer.argtypes = [ctypes.c_void_p]
    lib.vla_policy_act.restype = ctypes.c_int
    lib.vla_policy_act.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32),
                                   ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]
    lib.vla_policy_act_tokens.restype = ctypes.c_int
    lib.vla_policy_act_tokens.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int32),
                                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]
    lib.vla_policy_free.restype = None
    lib.vla_policy_free.argtypes = [ctypes.c_void_p]
    if not hasattr(lib, "vla_policy_last_error"):
        raise OSError(f"{path} is older than scripts/vla_policy.py (it has no vla_policy_last_error): rebuild it with "
                      f"`make {os.path.basename(path)}`")
    lib.vla_policy_last_status.restype = ctypes.c_int
    lib.vla_policy_last_status.argtypes = []
    lib.vla_policy_last_error.restype = ctypes.c_char_p
    lib.vla_policy_last_error.argtypes = []
    if hasattr(lib, "vla_policy_timing"):  # the GPU library's: the device time of the last chunk, its parts
        lib.vla_policy_timing.restype = None
        lib.vla_policy_timing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
        lib.vla_policy_set_graphs.restype = None
        lib.vla_policy_set_graphs.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def policy_tokenizer(checkpoint, name, spec):
    """The tokenizer that makes checkpoint's token ids (named `name` in its header) from `spec`: None
    or "bytes" for a "bytes" checkpoint, else a tokenizer.json (or a folder holding one, or a model's
    hub id whose snapshot in the HF cache holds one) of that name. The name is compared before the
    tokenizers package is needed."""
    if name == vla_shard.BYTES.name:
        if spec in (None, vla_shard.BYTES.name):
            return vla_shard.BYTES
        raise ValueError(f"checkpoint {checkpoint} reads instructions as UTF-8 bytes (tokenizer bytes): pass no "
                         f"tokenizer (got {spec})")
    if spec is None or spec == vla_shard.BYTES.name:
        raise ValueError(f"checkpoint {checkpoint} was trained on token ids of tokenizer {name}: pass tokenizer=PATH, "
                         "that tokenizer.json or the model folder that holds it (or the model's hub id)")
    try:
        spec = hub_cache.local_folder(spec, "model", "tokenizer.json")
    except hub_cache.NotFound as e:
        raise ValueError(f"tokenizer {e}") from None
    path = os.path.join(spec, "tokenizer.json") if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(f"tokenizer {path}: no such file: pass the tokenizer.json of tokenizer {name} (checkpoint "
                         f"{checkpoint}), or the folder that holds it")
    got = vla_shard.tokenizer_json_id(path)
    if got != name:
        raise ValueError(f"tokenizer {path} is {got}, but checkpoint {checkpoint} was trained on token ids of {name}: "
                         "pass the tokenizer.json it was trained with")
    return vla_shard.TokenizerJSON(path)


class VLAPolicy:
    """checkpoint: a train_vla checkpoint (version 2); device: "cpu" or "cuda"; threads: OpenMP
    threads of this policy's calls on the CPU (0: the runtime's default); library: another build of
    the library to load; tokenizer: for a checkpoint trained on a tokenizer.json's ids, that file,
    the folder holding it, or a model's hub id cached with it (its name must be the checkpoint's).
    graphs: on a GPU, replay the 10 Euler steps as one CUDA graph (the default; False launches them
    one by one, the same numbers).
    After loading: config (the SmolVLAConfig fields, train_mode and family, by name), train_mode
    (its name), tokenizer (the checkpoint's tokenizer name), text_tokenizer (what makes the ids:
    vla_shard.BYTES or a TokenizerJSON) and device (what computes, e.g. "CPU (fp32)").

    Thread safety: calls on one policy are serialized by a lock (the library keeps one batch's
    activations per policy), so threads may share it and each gets the actions it would get alone;
    separate policies run in parallel. Errors are one line: ValueError or TypeError for malformed
    input, MemoryError when the library runs out of memory (the policy stays usable: a smaller
    batch works), RuntimeError for any other failure inside it, and RuntimeError for any call after
    close() (closing twice is fine). The module's comment says more."""

    def __init__(self, checkpoint, device="cpu", threads=0, library=None, tokenizer=None, graphs=True):
        self._lock = threading.Lock()  # held around every library call
        self.handle = None
        self.lib = load_library(library, device)
        err = ctypes.create_string_buffer(8192)  # (a path past 512 bytes is shortened in messages: path_said)
        self.handle = self.lib.vla_policy_load(os.fsencode(checkpoint), threads, err, len(err))
        if not self.handle:
            rc, line = self.lib.vla_policy_last_status(), " ".join(err.value.decode(errors="replace").splitlines())
            raise MemoryError(line) if rc == POLICY_NO_MEMORY else RuntimeError(line) if rc == POLICY_FAILED else \
                ValueError(line)
        values = (ctypes.c_int32 * len(CONFIG_FIELDS))()
        self.lib.vla_policy_config(self.handle, values)
        self.config = dict(zip(CONFIG_FIELDS, list(values)))
        self.train_mode = TRAIN_MODES[self.config["train_mode"]]
        self.tokenizer = self.lib.vla_policy_tokenizer(self.handle).decode(errors="replace")
        self.device = self.lib.vla_policy_device(self.handle).decode(errors="replace")
        if hasattr(self.lib, "vla_policy_set_graphs"):
            self.lib.vla_policy_set_graphs(self.handle, int(bool(graphs)))
        try:
            self.text_tokenizer = policy_tokenizer(checkpoint, self.tokenizer, tokenizer)
        except ValueError:
            self.close()
            raise

    @property
    def closed(self):
        """Whether close() has freed the model (every call then raises RuntimeError)."""
        return not self.handle

    def _open(self):
        """The library's handle, with self._lock held by the caller; RuntimeError once closed."""
        if not self.handle:
            raise RuntimeError(CLOSED)
        return self.handle

    def cameras(self, images):
        """images as one C-contiguous uint8 (B, h, w, 3) array per camera, None where the
        observation lacks that camera (LeRobot's missing camera: an image of -1 masked out; the
        library computes what that gives, policy_present_cameras in vla/policy.h). The library reads
        8-bit frames: uint8 frames pass as they are; float frames in [0, 1] as LeRobot passes them
        are accepted when they are 8-bit frames divided by 255 (round(x * 255) gives those frames
        back exactly); integer frames within 0..255 too. Others are refused (frames_u8)."""
        n_cam = self.config["n_cam"]
        want = "one (B, h, w, 3) array per camera it was trained on, in order (None for one the observation lacks)"
        if isinstance(images, np.ndarray):
            if images.ndim != 5:
                raise ValueError(f"images: one array of shape {images.shape}: pass a list of {want}, or one (B, n_cam, "
                                 "h, w, 3) array")
            images = [images[:, k] for k in range(images.shape[1])]
        images = listed("images", images, f"a list of {want}")
        if len(images) != n_cam:
            raise ValueError(f"{len(images)} camera(s) given, this checkpoint reads {n_cam}: pass {want}")
        images = [None if im is None else frames_u8(k, im) for k, im in enumerate(images)]
        present = [im for im in images if im is not None]
        if not present:
            raise ValueError(f"every one of the {n_cam} camera(s) is None: pass at least one camera's frames")
        for k, im in enumerate(images):
            if im is None:
                continue
            if im.ndim != 4 or im.shape[3] != 3 or im.shape[0] != present[0].shape[0]:
                raise ValueError(f"camera {k}: frames of shape {im.shape}, expected (B, h, w, 3) uint8 with the same B "
                                 "for every camera")
            if not (1 <= im.shape[1] <= MAX_IMG and 1 <= im.shape[2] <= MAX_IMG):
                raise ValueError(f"camera {k}: frames of {im.shape[1]}x{im.shape[2]} pixels, outside 1..{MAX_IMG}")
        return images

    def act(self, images, instructions, state, noise=None, seed=0):
        """The action chunk (B, chunk, action_dim), float32, in the data's units, for B instruction
        strings (made into the checkpoint's token ids, see the module's comment)."""
        if self.closed:
            raise RuntimeError(CLOSED)
        texts = instruction_texts(instructions)
        if self.text_tokenizer is vla_shard.BYTES:  # the library reads the strings' bytes itself
            encoded = (ctypes.c_char_p * len(texts))(*[s.encode("utf-8") for s in texts])
            return self.run(images, state, noise, seed, len(texts),
                            lambda call: call(self.lib.vla_policy_act, encoded))
        return self.act_tokens(images, [self.text_tokenizer.encode(s) for s in texts], state, noise, seed)

    def act_tokens(self, images, token_ids, state, noise=None, seed=0):
        """act() for instructions given as token ids: B sequences of ids of the checkpoint's tokenizer
        (any length: the model reads the first max_text)."""
        if self.closed:
            raise RuntimeError(CLOSED)
        ids = token_sequences(token_ids, self.config["vocab"], self.tokenizer)
        flat = np.ascontiguousarray(np.concatenate([np.zeros(0, np.int64)] + ids), np.int32)
        counts = np.ascontiguousarray([t.size for t in ids], np.int32)
        return self.run(images, state, noise, seed, len(ids),
                        lambda call: call(self.lib.vla_policy_act_tokens, flat.ctypes.data, counts.ctypes.data))

    def run(self, images, state, noise, seed, n_text, text_call):
        """Checks the observations, then text_call(call) calls the library's act function with the
        instructions' arguments (under the lock); returns the chunk."""
        c = self.config
        if self.closed:
            raise RuntimeError(CLOSED)
        try:
            seed = operator.index(seed) % 2**64
        except TypeError:
            raise TypeError(f"seed: {type(seed).__name__} is not an int: pass an int (the noise's seed), or noise=") \
                from None
        images = self.cameras(images)
        B = next(im for im in images if im is not None).shape[0]
        want = f"float32 (B, state_dim) = ({B}, {c['state_dim']}) raw state"
        state = numeric("state", state, want)
        if B < 1:
            raise ValueError("an empty batch: pass at least one observation")
        if state.shape != (B, c["state_dim"]) or n_text != B:
            raise ValueError(f"state {state.shape} and {n_text} instruction(s) must match "
                             f"{B} observations of state_dim {c['state_dim']}")
        state = finite_f32("state", state, lambda at: f"observation {at[0]}, element {at[1]}")
        if noise is not None:
            want = (B, c["chunk"], c["max_action_dim"])
            noise = numeric("noise", noise, f"float32 {want} (B, chunk, max_action_dim)")
            if noise.shape != want:
                raise ValueError(f"noise has shape {noise.shape}, expected {want} (B, chunk, max_action_dim)")
            noise = finite_f32("noise", noise, lambda at: f"observation {at[0]}, slot {at[1]}, element {at[2]}")
        # a missing camera is (0, 0) with no frames (vla/policy.h's policy_present_cameras)
        cam_hw = np.ascontiguousarray([[0, 0] if im is None else [im.shape[1], im.shape[2]] for im in images], np.int32)
        frames = (ctypes.c_void_p * len(images))(*[None if im is None else im.ctypes.data for im in images])
        out = np.empty((B, c["chunk"], c["action_dim"]), np.float32)

        def call(fn, *text):
            return fn(self._open(), B, cam_hw.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), frames, *text,
                      state.ctypes.data, None if noise is None else noise.ctypes.data, seed, out.ctypes.data)

        with self._lock:
            rc = text_call(call)
            failure = library_failure(self.lib, rc) if rc in (POLICY_FAILED, POLICY_NO_MEMORY) else None
        if failure is not None:
            raise failure
        if rc != 0:
            raise ValueError(f"the library rejected the batch: {policy_error(rc, self.tokenizer)}")
        return out

    def timing(self):
        """What the last act() took on the device, where the library says (the GPU library; None for
        the CPU's): {"prefix_ms", "steps_ms"} (the prefix once; the 10 Euler steps) and
        {"prefix_launches", "steps_launches"} where the library counts them (the CPU emulation of
        CUDA), else None."""
        with self._lock:
            handle = self._open()
            if not hasattr(self.lib, "vla_policy_timing"):
                return None
            out = (ctypes.c_double * 4)()
            self.lib.vla_policy_timing(handle, out)
        launches = [int(x) if x >= 0 else None for x in out[2:]]
        return {"prefix_ms": out[0], "steps_ms": out[1], "prefix_launches": launches[0], "steps_launches": launches[1]}

    def close(self):
        """Frees the model now; later calls raise RuntimeError, closing again does nothing. A failure
        while freeing (a CUDA error) is a RuntimeError; the policy is closed all the same."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # (a constructor that failed before anything was made)
            return
        with lock:
            if not self.handle:
                return
            handle, self.handle = self.handle, None
            self.lib.vla_policy_free(handle)
            rc = self.lib.vla_policy_last_status()
            failure = library_failure(self.lib, rc) if rc in (POLICY_FAILED, POLICY_NO_MEMORY) else None
        if failure is not None:
            raise failure

    def __del__(self):
        try:
            self.close()
        except (RuntimeError, MemoryError):  # (nobody to tell: the policy is gone either way)
            pass
