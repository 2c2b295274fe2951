"""
vla_policy.py: a train_vla checkpoint as a policy in Python, through the C model (ctypes): on the
CPU with libvla.so (train_vla.c, fp32), or on a GPU with libvla_gpu.so (train_vla.cu, bf16 unless
built with PRECISION=FP32). Both take the same observations and give the same actions, within
the precision of the one that computes.

    from vla_policy import VLAPolicy
    policy = VLAPolicy("out/ckpt_00001000.bin")                 # make libvla.so first
    policy = VLAPolicy("out/ckpt_00001000.bin", device="cuda")  # make libvla_gpu.so first
    chunk = policy.act(images, ["open the door"], state)        # (B, H, A) actions in the data's units

images: uint8 (B, n_cam, img, img, 3), the cameras the model was trained on, in order;
instructions: B strings (the library gives the model their UTF-8 bytes as token ids, the "bytes"
tokenizer of the shards it trains on); state: float32 (B, S) raw (the checkpoint's statistics
normalize it).
The 10-step flow-matching sampling starts from noise drawn from `seed`, or from `noise` (B, H, A).
"""

import ctypes
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FIELDS = ["n_cam", "img", "patch", "max_text", "state_dim", "action_dim", "chunk", "d_model", "d_ff",
                 "d_expert", "d_expert_ff", "n_layer", "n_head", "head_dim", "rope_theta"]


LIBRARIES = {"cpu": "libvla.so", "cuda": "libvla_gpu.so"}


def load_library(path=None, device="cpu"):
    if device not in LIBRARIES:
        raise ValueError(f"device {device!r}: use one of {', '.join(LIBRARIES)}")
    path = path or os.path.join(ROOT, LIBRARIES[device])
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: build it with `make {os.path.basename(path)}`")
    lib = ctypes.CDLL(path)
    lib.vla_policy_load.restype = ctypes.c_void_p
    lib.vla_policy_load.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.vla_policy_config.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
    lib.vla_policy_device.restype = ctypes.c_char_p
    lib.vla_policy_device.argtypes = [ctypes.c_void_p]
    lib.vla_policy_act.restype = ctypes.c_int
    lib.vla_policy_act.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p),
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p]
    lib.vla_policy_free.argtypes = [ctypes.c_void_p]
    return lib


class VLAPolicy:
    """checkpoint: a train_vla checkpoint; device: "cpu" or "cuda"; threads: OpenMP threads on the
    CPU (0: the runtime's default); library: another build of the library to load."""

    def __init__(self, checkpoint, threads=0, library=None, device="cpu"):
        self.handle = None
        self.lib = load_library(library, device)
        err = ctypes.create_string_buffer(1024)
        self.handle = self.lib.vla_policy_load(os.fsencode(checkpoint), threads, err, len(err))
        if not self.handle:
            raise ValueError(err.value.decode(errors="replace"))
        values = (ctypes.c_int32 * len(CONFIG_FIELDS))()
        self.lib.vla_policy_config(self.handle, values)
        self.config = dict(zip(CONFIG_FIELDS, list(values)))
        self.device = self.lib.vla_policy_device(self.handle).decode()  # e.g. "CPU (fp32)", "NVIDIA H100 ... (bf16)"

    def act(self, images, instructions, state, seed=0, noise=None):
        c = self.config
        images = np.ascontiguousarray(images, np.uint8)
        state = np.ascontiguousarray(state, np.float32)
        B = images.shape[0]
        want = (B, c["n_cam"], c["img"], c["img"], 3)
        if images.shape != want:
            raise ValueError(f"images have shape {images.shape}, this checkpoint reads {want}")
        if state.shape != (B, c["state_dim"]) or len(instructions) != B:
            raise ValueError(f"state {state.shape} and {len(instructions)} instruction(s) must match "
                             f"{B} observations of state_dim {c['state_dim']}")
        if noise is not None:
            noise = np.ascontiguousarray(noise, np.float32)
            if noise.shape != (B, c["chunk"], c["action_dim"]):
                raise ValueError(f"noise has shape {noise.shape}, expected {(B, c['chunk'], c['action_dim'])}")
        text = (ctypes.c_char_p * B)(*[s.encode() for s in instructions])
        out = np.empty((B, c["chunk"], c["action_dim"]), np.float32)
        rc = self.lib.vla_policy_act(self.handle, B, images.ctypes.data, text, state.ctypes.data,
                                     None if noise is None else noise.ctypes.data, seed, out.ctypes.data)
        if rc != 0:
            raise ValueError("vla_policy_act rejected the batch")
        return out

    def close(self):
        if self.handle:
            self.lib.vla_policy_free(self.handle)
            self.handle = None

    def __del__(self):
        self.close()
