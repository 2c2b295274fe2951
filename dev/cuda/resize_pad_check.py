"""Checks resize_pad's images against LeRobot's own resize_with_pad under torch.

    make build/emu/dev/cuda/resize_pad && build/emu/dev/cuda/resize_pad --dump build/resize_pad.bin
    build/lerobot-venv/bin/python dev/cuda/resize_pad_check.py build/resize_pad.bin

(or dev/cuda/resize_pad --dump FILE on a GPU). The dump holds, per case, random uint8 frames
(n, h, w, 3), the padding's placement, and what the launcher made of them (n, 3, S, S). Here
each case's frames go through what SmolVLA's prepare_images does: u8 / 255 in float32,
channel-major, resize_with_pad(img, S, S, pad_value=0) (torch.nn.functional.interpolate,
bilinear, align_corners=False, then zeros on the left and top), x * 2 - 1. Where LeRobot cannot
be imported, the same rule is applied with torch directly (the script says which). The centred
cases (pi0's padding) are checked against pi0's rule written with torch, as dev/smolvla.py's
prepare_image writes it: the same resize, clamped to [0, 1], the zeros centred (the floor of
half the padding on the top and left). The last line is "N passed, M failed"; the exit status
is non-zero on any failure.
"""

import argparse
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

MAGIC = 0x5A525056  # "VPRZ", as resize_pad.cu writes it
VERSION = 2
HEADER = struct.Struct("<4I")  # magic, version, cases, bytes per floatX
CASE = struct.Struct("<5i")    # n_img, h, w, S, centred


def resize_with_pad_torch(img, size):
    """resize_with_pad(img, size, size, pad_value=0) of lerobot/policies/common/vla_utils.py,
    rewritten with torch (used only where LeRobot cannot be imported)."""
    h, w = img.shape[2:]
    if h == size and w == size:
        return img
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    out = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False)
    return F.pad(out, (max(0, size - rw), 0, max(0, size - rh), 0), value=0)


def resize_with_pad_centred_torch(img, size):
    """pi0's resize with padding (its resize_with_pad_torch, as dev/smolvla.py's prepare_image
    writes it): the same resized image, clamped to [0, 1], padded with zeros centred, the top
    and left getting the floor of half the padding."""
    h, w = img.shape[2:]
    if h == size and w == size:
        return img
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    out = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (size - rh) // 2, (size - rw) // 2
    return F.pad(out, (left, size - rw - left, top, size - rh - top), value=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump", help="the file resize_pad --dump wrote")
    args = ap.parse_args()
    try:
        from lerobot.policies.common.vla_utils import resize_with_pad

        oracle = "LeRobot's resize_with_pad"

        def resize(img, size):
            return resize_with_pad(img, size, size, pad_value=0)
    except ImportError:
        oracle = "torch's interpolate and pad (LeRobot not importable)"
        resize = resize_with_pad_torch

    data = open(args.dump, "rb").read()
    if len(data) < HEADER.size:
        sys.exit(f"{args.dump}: {len(data)} bytes, shorter than the header: rewrite it with resize_pad --dump")
    magic, version, n_cases, floatx_bytes = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        sys.exit(f"{args.dump}: not a resize_pad dump of version {VERSION} (magic {magic:#x}, version {version})")
    if floatx_bytes not in (2, 4):
        sys.exit(f"{args.dump}: floatX of {floatx_bytes} bytes: the file is corrupt")
    # fp32: torch and the kernel both work in float, in different orders (about 1e-7);
    # bf16: the images were rounded to 8 significant bits, at most half a unit (2^-9) in [-1, 1]
    # (fp16, the other 2-byte floatX, rounds finer: its 11 bits are within that too)
    tol = 1e-6 if floatx_bytes == 4 else 2.0**-9 + 1e-6
    build = "fp32" if floatx_bytes == 4 else "bf16 or fp16"
    print(f"{args.dump}: {n_cases} cases from a {build} build, against {oracle} (centred: pi0's rule with torch)")

    torch.set_num_threads(1)
    passed = failed = 0
    off = HEADER.size
    for k in range(n_cases):
        if off + CASE.size > len(data):
            sys.exit(f"{args.dump}: ends inside case {k}: the file is truncated")
        n_img, h, w, size, centred = CASE.unpack_from(data, off)
        off += CASE.size
        if min(n_img, h, w, size) < 1 or centred not in (0, 1):
            sys.exit(f"{args.dump}: case {k} has sizes {n_img} x {h} x {w} -> {size}, centred {centred}: the file is "
                     "corrupt")
        n_in, n_out = n_img * h * w * 3, n_img * 3 * size * size
        if off + n_in + 4 * n_out > len(data):
            sys.exit(f"{args.dump}: ends inside case {k}: the file is truncated")
        frames = np.frombuffer(data, np.uint8, n_in, off).reshape(n_img, h, w, 3)
        off += n_in
        got = torch.from_numpy(np.frombuffer(data, np.float32, n_out, off).reshape(n_img, 3, size, size).copy())
        off += 4 * n_out
        img = torch.from_numpy(frames.copy()).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        want = (resize_with_pad_centred_torch(img, size) if centred else resize(img, size)) * 2.0 - 1.0
        ok = tuple(want.shape) == tuple(got.shape)
        err = (got - want).abs().max().item() if ok else float("inf")
        ok = ok and err <= tol
        where = ", centred" if centred else ""
        print(f"{'  ok  ' if ok else ' FAIL '} {n_img} frames {h} x {w} -> {size}{where}: max |got - want| {err:.2e} "
              f"(tol {tol:.1e})")
        passed += ok
        failed += not ok
    if off != len(data):
        sys.exit(f"{args.dump}: {len(data) - off} bytes after the last case: the file is corrupt")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
