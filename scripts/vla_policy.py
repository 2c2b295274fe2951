"""
vla_policy.py: a train_vla checkpoint as a policy in Python, through the C model (ctypes): on the
CPU with libvla.so (train_vla.c, fp32), or on a GPU with libvla_gpu.so (train_vla.cu, bf16 unless
built with PRECISION=FP32). Both take the same observations and give the same actions, within
the precision of the one that computes.

    from vla_policy import VLAPolicy
    policy = VLAPolicy("out/ckpt_00001000.bin")                 # make libvla.so first
    policy = VLAPolicy("out/ckpt_00001000.bin", device="cuda")  # make libvla_gpu.so first
    policy = VLAPolicy("smolvla.bin", tokenizer="SmolVLM2-500M-Video-Instruct/")  # a tokenizer.json's ids
    policy = VLAPolicy("pi0.bin", tokenizer="paligemma-3b-pt-224/")      # pi0: PaliGemma's tokenizer.json
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
tokenizer= file (or the folder that holds it), whose name must be the checkpoint's, tokenizes them
as the converters do and as LeRobot's pre-processor does (task + "\\n", data/vla_shard.py's
TokenizerJSON: SmolVLM2's tokenizer.json for SmolVLA, PaliGemma's for pi0, whose ids start with
<bos>), and the ids go to the library (vla_policy_act_tokens). Either way the model reads the first
max_text ids, right-padded with the checkpoint's pad id and masked (what LeRobot's padding to the
batch's longest, SmolVLA, or to max_length, pi0, gives). act_tokens takes ids made elsewhere.
The 10-step flow-matching sampling starts from noise drawn from `seed`, or from `noise`
(B, chunk, max_action_dim): the model's action slots are max_action_dim wide; the first
action_dim of them are the data's.
"""

import ctypes
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "data"))
import vla_shard  # noqa: E402  data/vla_shard.py: tokenizer names and TokenizerJSON

# vla_policy_config's 28 int32, a checkpoint header's order: SMOLVLA_CONFIG_FIELDS but family, the
# checkpoint's train mode, then the family (0 SmolVLA, 1 pi0)
CONFIG_FIELDS = ["n_cam", "state_dim", "action_dim", "img", "patch", "vis_width", "vis_ff", "vis_layers", "vis_heads",
                 "scale_factor", "vocab", "pad_token", "max_text", "d_model", "d_ff", "n_layer", "n_head", "n_kv_head",
                 "head_dim", "d_expert", "d_expert_ff", "self_attn_every", "chunk", "max_state_dim", "max_action_dim",
                 "rope_theta", "train_mode", "family"]
TRAIN_MODES = ["expert", "vlm", "all"]  # TRAIN_MODE_NAMES
MAX_IMG = 4096  # VLA_MAX_IMG: a camera's height and width

LIBRARIES = {"cpu": "libvla.so", "cuda": "libvla_gpu.so"}


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
    im = np.asarray(frames)
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
    if hasattr(lib, "vla_policy_timing"):  # the GPU library's: the device time of the last chunk, its parts
        lib.vla_policy_timing.restype = None
        lib.vla_policy_timing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)]
        lib.vla_policy_set_graphs.restype = None
        lib.vla_policy_set_graphs.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def policy_tokenizer(checkpoint, name, spec):
    """The tokenizer that makes checkpoint's token ids (named `name` in its header) from `spec`: None
    or "bytes" for a "bytes" checkpoint, else a tokenizer.json (or a folder holding one) of that name.
    The name is compared before the tokenizers package is needed."""
    if name == vla_shard.BYTES.name:
        if spec in (None, vla_shard.BYTES.name):
            return vla_shard.BYTES
        raise ValueError(f"checkpoint {checkpoint} reads instructions as UTF-8 bytes (tokenizer bytes): pass no "
                         f"tokenizer (got {spec})")
    if spec is None or spec == vla_shard.BYTES.name:
        raise ValueError(f"checkpoint {checkpoint} was trained on token ids of tokenizer {name}: pass tokenizer=PATH, "
                         "that tokenizer.json or the model folder that holds it")
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
    threads on the CPU (0: the runtime's default); library: another build of the library to load;
    tokenizer: for a checkpoint trained on a tokenizer.json's ids, that file or the folder holding
    it (its name must be the checkpoint's). graphs: on a GPU, replay the 10 Euler steps as one CUDA
    graph (the default; False launches them one by one, the same numbers). After loading: config
    (the SmolVLAConfig fields, train_mode and family, by name), train_mode (its name), tokenizer (the
    checkpoint's tokenizer name), text_tokenizer (what makes the ids: vla_shard.BYTES or a
    TokenizerJSON) and device (what computes, e.g. "CPU (fp32)")."""

    def __init__(self, checkpoint, device="cpu", threads=0, library=None, tokenizer=None, graphs=True):
        self.handle = None
        self.lib = load_library(library, device)
        err = ctypes.create_string_buffer(1024)
        self.handle = self.lib.vla_policy_load(os.fsencode(checkpoint), threads, err, len(err))
        if not self.handle:
            raise ValueError(err.value.decode(errors="replace"))
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

    def cameras(self, images):
        """images as one C-contiguous uint8 (B, h, w, 3) array per camera, None where the
        observation lacks that camera (LeRobot's missing camera: an image of -1 masked out; the
        library computes what that gives, policy_present_cameras in vla/policy.h). The library reads
        8-bit frames: uint8 frames pass as they are; float frames in [0, 1] as LeRobot passes them
        are accepted when they are 8-bit frames divided by 255 (round(x * 255) gives those frames
        back exactly); integer frames within 0..255 too. Others are refused (frames_u8)."""
        n_cam = self.config["n_cam"]
        if isinstance(images, np.ndarray) and images.ndim == 5:
            images = [images[:, k] for k in range(images.shape[1])]
        images = list(images)
        if len(images) != n_cam:
            raise ValueError(f"{len(images)} camera(s) given, this checkpoint reads {n_cam}: pass one (B, h, w, 3) "
                             "array per camera it was trained on, in order (None for one the observation lacks)")
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
        if isinstance(instructions, str):
            raise ValueError("instructions: pass a list of B strings, one per observation")
        for b, text in enumerate(instructions):
            if isinstance(text, str) and "\0" in text:  # the library reads C strings: it would end there
                raise ValueError(f"instruction {b} holds a NUL character at offset {text.index(chr(0))}: pass text "
                                 "without NUL characters")
        if self.text_tokenizer is vla_shard.BYTES:  # the library reads the strings' bytes itself
            return self.run(images, state, noise, seed, len(instructions),
                            lambda call: call(self.lib.vla_policy_act, (ctypes.c_char_p * len(instructions))(
                                *[s.encode("utf-8") for s in instructions])))
        return self.act_tokens(images, [self.text_tokenizer.encode(s) for s in instructions], state, noise, seed)

    def act_tokens(self, images, token_ids, state, noise=None, seed=0):
        """act() for instructions given as token ids: B sequences of ids of the checkpoint's tokenizer
        (any length: the model reads the first max_text)."""
        ids = [np.asarray(t, np.int64).reshape(-1) for t in token_ids]
        vocab = self.config["vocab"]
        for b, t in enumerate(ids):
            if t.size and (t.min() < 0 or t.max() >= vocab):
                raise ValueError(f"instruction {b}: token id {int(t.min() if t.min() < 0 else t.max())} is outside the "
                                 f"model's vocabulary [0, {vocab}) (tokenizer {self.tokenizer})")
        flat = np.ascontiguousarray(np.concatenate([np.zeros(0, np.int64)] + ids), np.int32)
        counts = np.ascontiguousarray([t.size for t in ids], np.int32)
        return self.run(images, state, noise, seed, len(ids),
                        lambda call: call(self.lib.vla_policy_act_tokens, flat.ctypes.data, counts.ctypes.data))

    def run(self, images, state, noise, seed, n_text, text_call):
        """Checks the observations, then text_call(call) calls the library's act function with the
        instructions' arguments; returns the chunk."""
        c = self.config
        images = self.cameras(images)
        B = next(im for im in images if im is not None).shape[0]
        state = np.asarray(state)
        if B < 1:
            raise ValueError("an empty batch: pass at least one observation")
        if state.shape != (B, c["state_dim"]) or n_text != B:
            raise ValueError(f"state {state.shape} and {n_text} instruction(s) must match "
                             f"{B} observations of state_dim {c['state_dim']}")
        state = finite_f32("state", state, lambda at: f"observation {at[0]}, element {at[1]}")
        if noise is not None:
            noise = np.asarray(noise)
            want = (B, c["chunk"], c["max_action_dim"])
            if noise.shape != want:
                raise ValueError(f"noise has shape {noise.shape}, expected {want} (B, chunk, max_action_dim)")
            noise = finite_f32("noise", noise, lambda at: f"observation {at[0]}, slot {at[1]}, element {at[2]}")
        # a missing camera is (0, 0) with no frames (vla/policy.h's policy_present_cameras)
        cam_hw = np.ascontiguousarray([[0, 0] if im is None else [im.shape[1], im.shape[2]] for im in images], np.int32)
        frames = (ctypes.c_void_p * len(images))(*[None if im is None else im.ctypes.data for im in images])
        out = np.empty((B, c["chunk"], c["action_dim"]), np.float32)

        def call(fn, *text):
            return fn(self.handle, B, cam_hw.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), frames, *text,
                      state.ctypes.data, None if noise is None else noise.ctypes.data, seed % 2**64, out.ctypes.data)

        rc = text_call(call)
        if rc != 0:
            raise ValueError(f"the library rejected the batch: {policy_error(rc, self.tokenizer)}")
        return out

    def timing(self):
        """What the last act() took on the device, where the library says (the GPU library; None for
        the CPU's): {"prefix_ms", "steps_ms"} (the prefix once; the 10 Euler steps) and
        {"prefix_launches", "steps_launches"} where the library counts them (the CPU emulation of
        CUDA), else None."""
        if not hasattr(self.lib, "vla_policy_timing"):
            return None
        out = (ctypes.c_double * 4)()
        self.lib.vla_policy_timing(self.handle, out)
        launches = [int(x) if x >= 0 else None for x in out[2:]]
        return {"prefix_ms": out[0], "steps_ms": out[1], "prefix_launches": launches[0], "steps_launches": launches[1]}

    def close(self):
        if self.handle:
            self.lib.vla_policy_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()
