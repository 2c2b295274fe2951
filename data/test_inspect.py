"""
test_inspect.py: the dataset inspector on valid and corrupted shards, run as a user runs it.
Run by `make test` with the data tools' Python (build/venv). Exits non-zero on any failure; the
last line is `N passed, M failed`.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


def inspect(*args):
    return subprocess.run([sys.executable, os.path.join(HERE, "inspect_shards.py"), *args], capture_output=True, text=True)


def make_shard(path, img=16, n_cam=2):
    """3 episodes (5, 7, 4 frames), 2 tasks, state 3, action 2 with a constant second dim."""
    rng = np.random.default_rng(1)
    n = 16
    images = rng.integers(0, 256, (n, n_cam, img, img, 3), dtype=np.uint8)
    state = rng.normal(size=(n, 3)).astype(np.float32)
    action = np.stack([rng.normal(size=n), np.full(n, 0.25)], 1).astype(np.float32)
    vla_shard.write_shard(path, images, state, action, [(0, 5, 0), (5, 7, 1), (12, 4, 0)],
                          ["stack the red block", "open the drawer"])


def patched(src, dst, section, offset_in_section, values):
    """A copy of src with bytes of one section replaced (offsets from the shard's own header)."""
    shutil.copy(src, dst)
    h = np.fromfile(src, vla_shard.HEADER_DTYPE, 1)[0]
    data = np.asarray(values)
    with open(dst, "r+b") as f:
        f.seek(int(h["off_" + section]) + offset_in_section)
        f.write(data.tobytes())


def expect_error(what, path, needle):
    r = inspect(path)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    ok = r.returncode == 1 and len(lines) >= 1 and needle in lines[0] and "Traceback" not in r.stderr
    check(ok, f"{what}: exit {r.returncode}, {lines[0] if lines else r.stderr.strip()[-200:]}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(tmp, "good.bin")
        make_shard(good)
        sheet = os.path.join(tmp, "sheet.png")
        r = inspect(good, "--sheet", sheet, "--samples", "6", "--chunk", "6")
        out = r.stdout
        check(r.returncode == 0 and r.stderr.strip() == "", f"a valid shard exits 0 with nothing on stderr ({r.returncode})")
        check("episodes   3" in out and "frames     16" in out and "tasks      2" in out,
              "the summary counts 3 episodes, 16 frames, 2 tasks")
        check('"stack the red block"' in out and '"open the drawer"' in out, "the summary names both tasks")
        check("constant dims" in out and "action 1" in out, "the constant action dimension is flagged")
        try:
            from PIL import Image
            im = Image.open(sheet)
            px = np.asarray(im.convert("RGB"))
            check(im.width >= 300 and im.height >= 200 and px.std() > 10,
                  f"--sheet writes a non-uniform PNG ({im.width}x{im.height})")
        except (OSError, ImportError) as e:
            check(False, f"--sheet writes a PNG: {e}")

        bad = os.path.join(tmp, "bad.bin")
        shutil.copy(good, bad)
        with open(bad, "r+b") as f:
            f.write(np.uint32(0x12345678).tobytes())
        expect_error("bad magic", bad, "bad magic")
        with open(good, "rb") as f:
            data = f.read()
        with open(bad, "wb") as f:
            f.write(data[:-40])
        expect_error("truncated file", bad, "truncated")
        patched(good, bad, "state", 4 * (3 * 6 + 1), np.float32(np.nan))  # frame 6, dim 1
        expect_error("NaN in state", bad, "NaN/Inf")
        r = inspect(bad)
        check("frame 6" in r.stderr, "the NaN is located: frame 6")
        patched(good, bad, "action", 4 * (2 * 3), np.float32(np.inf))  # frame 3, dim 0
        expect_error("Inf in action", bad, "NaN/Inf")
        patched(good, bad, "frame_episode", 4 * 4, np.uint32(1))  # frame 4 claims episode 1
        expect_error("episode table that does not cover a frame", bad, "frame 4")
        other = os.path.join(tmp, "other.bin")
        make_shard(other, img=24)
        r = inspect(f"{good},{other}")
        check(r.returncode == 1 and "must agree" in r.stderr,
              f"shards of different image sizes: exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
        r = inspect(os.path.join(tmp, "missing.bin"))
        check(r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr,
              "a missing path is a one-line error")


if __name__ == "__main__":
    main()
    check.finish()
