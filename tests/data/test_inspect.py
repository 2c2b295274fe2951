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
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")  # the tools under test
sys.path.insert(0, DATA)
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


def inspect(*args):
    return subprocess.run([sys.executable, os.path.join(DATA, "inspect_shards.py"), *args], capture_output=True,
                          text=True, encoding="utf-8")


def make_shard(path, img=16, n_cam=2, tasks=("stack the red block", "open the drawer")):
    """3 episodes (5, 7, 4 frames) of tasks 0, 1 and 2 (0 again when there are 2), state 3,
    action 2 with a constant second dim."""
    rng = np.random.default_rng(1)
    n = 16
    images = rng.integers(0, 256, (n, n_cam, img, img, 3), dtype=np.uint8)
    state = rng.normal(size=(n, 3)).astype(np.float32)
    action = np.stack([rng.normal(size=n), np.full(n, 0.25)], 1).astype(np.float32)
    vla_shard.write_shard(path, images, state, action, [(0, 5, 0), (5, 7, 1), (12, 4, 2 % len(tasks))], list(tasks))


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
        patched(good, bad, "stats", 4 * 1, np.float32(1e30))  # state mean of column 1, as the trainer refuses it
        expect_error("a state mean of 1e30", bad, "state column 1: the stored mean 1e+30")
        patched(good, bad, "stats", 4 * (6 + 2), np.float32(1e-5))  # action std of column 0, a varying column
        expect_error("an action std of 1e-5", bad, "action column 0: the stored mean")
        patched(good, bad, "stats", 4 * (6 + 3), np.float32(3.0))  # action column 1 is constant: any std goes
        r = inspect(bad)
        check(r.returncode == 0, f"a constant column's std is not compared (exit {r.returncode}) {r.stderr.strip()[-200:]}")
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
        multilingual(tmp)
        missing_fonts()
        tile_titles()
        shard_format(tmp)


def tile_titles():
    """A sheet tile names the frame's place in its episode counted from 1, as a reader counts."""
    import inspect_shards
    first, last = inspect_shards.tile_title(7, 0, 2, 0, 40), inspect_shards.tile_title(46, 0, 2, 39, 40)
    check(first.endswith("episode 2   frame 1 of 40") and last.endswith("episode 2   frame 40 of 40"),
          f"a tile's frame counts from 1: '{first}' .. '{last}'")


def one_line_value_error(fn):
    """The ValueError's message of fn() (the reader's one line), or None when it does not raise."""
    try:
        fn()
    except ValueError as e:
        return str(e) if "\n" not in str(e) else "(several lines) " + str(e)
    return None


def shard_format(tmp):
    """Shard format version 2 in Python: writer and reader round trip, cameras of their own sizes,
    token ids; version 1 of the same data reads as the same dataset; the C writer's bytes; corrupt
    version-2 fields refused in one line."""
    rng = np.random.default_rng(7)
    n = 9
    cams = [rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8), rng.integers(0, 256, (n, 8, 12, 3), dtype=np.uint8)]
    state, action = rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 2)).astype(np.float32)
    episodes, tasks = [(0, 4, 1), (4, 5, 0)], ["open the drawer", "打开抽屉"]
    path = os.path.join(tmp, "sizes.bin")
    vla_shard.write_shard(path, cams, state, action, episodes, tasks)
    s = vla_shard.Shard(path)
    same = all(np.array_equal(s.camera_images(k), cams[k]) for k in range(2)) and s.images is None \
        and np.array_equal(s.state, state) and np.array_equal(s.action, action)
    check(s.version == 2 and (s.cam_height, s.cam_width) == ((16, 8), (16, 12)) and s.img == 0 and same,
          f"Python writer and reader: cameras of 16x16 and 8x12 read back exactly (version {s.version}, img {s.img})")
    check(s.tokenizer == "bytes" and s.vocab == 256 and [s.task_tokens(k).tolist() for k in range(2)]
          == [list(t.encode()) for t in tasks], "each task's token ids are the bytes of its UTF-8 text (tokenizer bytes)")
    ds = vla_shard.Dataset(path)
    cfg = types.SimpleNamespace(n_cam=2, img=0, state_dim=3, action_dim=2, max_text=8, chunk=3)
    images, tokens, mask, _, _, _ = ds.assemble(2, cfg)
    parts = ds.split_cameras(images)
    check(np.array_equal(parts[0], cams[0][2]) and np.array_equal(parts[1], cams[1][2])
          and tokens.tolist() == list("打开抽屉".encode()[:8]) and mask.sum() == 8,
          "assemble: a sample's cameras one after another at their own sizes, its first max_text token ids")

    # version 1 and version 2 of the same (square) data: the same dataset, sample by sample
    square = rng.integers(0, 256, (n, 2, 16, 16, 3), dtype=np.uint8)
    v1, v2 = os.path.join(tmp, "square_v1.bin"), os.path.join(tmp, "square_v2.bin")
    vla_shard.write_shard(v1, square, state, action, episodes, tasks, version=1)
    vla_shard.write_shard(v2, square, state, action, episodes, tasks)
    d1, d2 = vla_shard.Dataset(v1), vla_shard.Dataset(v2)
    cfg = types.SimpleNamespace(n_cam=2, img=16, state_dim=3, action_dim=2, max_text=8, chunk=3)
    equal = all(all(np.array_equal(a, b) for a, b in zip(d1.assemble(i, cfg), d2.assemble(i, cfg))) for i in range(n))
    check(d1.shards[0].version == 1 and d2.shards[0].version == 2 and os.path.getsize(v1) < os.path.getsize(v2)
          and equal and np.array_equal(d1.shards[0].images, square) and (d1.cam_height, d1.tokenizer) == ((16, 16), "bytes"),
          "versions 1 and 2 of the same data: identical samples (images, token ids, masks, state, actions)")
    check(one_line_value_error(lambda: vla_shard.write_shard(os.path.join(tmp, "x.bin"), cams, state, action,
                                                             episodes, tasks, version=1)) is not None,
          "the writer refuses version 1 for cameras of two sizes")

    # the C writer (data/synthetic) and this writer give the same bytes for the same content
    c_path, py_path = os.path.join(tmp, "synthetic_sizes.bin"), os.path.join(tmp, "rewritten.bin")
    r = subprocess.run([os.path.join(ROOT, "data", "synthetic"), "-o", c_path, "--cam-size", "8x12", "--cam-size", "6x6",
                        "--episodes", "3", "--min-len", "2", "--max-len", "4", "--state", "3", "--action", "2"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        c = vla_shard.Shard(c_path)
        vla_shard.write_shard(py_path, [c.camera_images(k) for k in range(c.n_cam)], c.state, c.action,
                              [tuple(int(x) for x in ep) for ep in c.episodes],
                              [c.task(k).decode() for k in range(c.n_tasks)], stats=c.stats)
        same = open(c_path, "rb").read() == open(py_path, "rb").read()
    check(r.returncode == 0 and same, "data/synthetic --cam-size 8x12 --cam-size 6x6 and write_shard of what the "
          f"reader read give byte-identical files{': ' + r.stderr.strip() if r.returncode else ''}")

    # corrupt version-2 fields: one line each, from the reader and from the inspector
    h = np.fromfile(path, vla_shard.HEADER_DTYPE, 1)[0]

    def field(name, index=0):
        return vla_shard.HEADER_DTYPE.fields[name][1] + index
    bad = os.path.join(tmp, "bad_v2.bin")
    cases = [
        ("vocabulary 0", field("vocab"), np.uint32(0), "vocabulary size 0 of tokenizer bytes is outside 1 to"),
        ("a token id past the vocabulary", int(h["off_tokens"]), np.int32(300), "has token id 300, outside the vocabulary [0, 256)"),
        ("byte tokens that are not the text's bytes", int(h["off_tokens"]), np.int32(ord("x")), "are not the bytes of its text"),
        ("a tokenizer name without its NUL", field("tokenizer"), np.full(64, ord("x"), np.uint8),
         "the tokenizer name is not NUL-terminated within its 64 bytes"),
        ("camera sizes that do not add up to the images section", field("cam_height", 4), np.uint32(4),
         "the camera sizes (16x16, 4x4, height x width) make 9 frames"),
        ("a camera 0 pixels high", field("cam_height", 4), np.uint32(0), "camera 1 is 0x12 pixels (height x width)"),
    ]
    for what, offset, value, needle in cases:
        shutil.copy(path, bad)
        with open(bad, "r+b") as f:
            f.seek(offset)
            f.write(np.asarray(value).tobytes())
        if what.startswith("camera sizes"):  # camera 1 of 4x4: the header's img (0) stays consistent
            with open(bad, "r+b") as f:
                f.seek(field("cam_width", 4))
                f.write(np.uint32(4).tobytes())
        msg = one_line_value_error(lambda: vla_shard.Shard(bad))
        check(msg is not None and needle in msg, f"{what}: {msg}")
    expect_error("the inspector on a camera 0 pixels high", bad, "camera 1 is 0x12 pixels")

    # the inspector shows the format, the cameras' sizes, the tokenizer and each task's tokens
    r = inspect(path)
    check(r.returncode == 0 and "format     version 2" in r.stdout and "cameras    2: 16x16, 8x12 RGB" in r.stdout
          and "tokenizer  bytes (vocabulary 256)" in r.stdout
          and "tokens (15): 111 112 101 110 32 116 104 101 32 100 114 97 119 101 114" in r.stdout,
          f"the inspector shows the version, cameras, tokenizer and token ids: exit {r.returncode} {r.stderr.strip()[-200:]}")
    sheet = os.path.join(tmp, "sizes.png")
    r = inspect(path, "--sheet", sheet, "--samples", "4")
    check(r.returncode == 0 and os.path.exists(sheet), f"a contact sheet of cameras of two sizes: exit {r.returncode}")


MULTILINGUAL = ["Schublade öffnen", "打开抽屉", "🚪 open the door"]
UNASSIGNED = "\u0378"  # no character: every font draws it as its missing-glyph box (.notdef)


def pixels(draw_text, text):
    """Grey pixels of `text` drawn by draw_text(draw, xy, text) on a black 64x32 image."""
    from PIL import Image, ImageDraw
    im = Image.new("L", (64, 32), 0)
    draw_text(ImageDraw.Draw(im), (2, 2), text)
    return np.asarray(im)


def multilingual(tmp):
    """German, Chinese and emoji instructions: the contact sheet draws each character with a font
    that has it, not as the missing-glyph box of PIL's default font."""
    import inspect_shards
    path, sheet = os.path.join(tmp, "multilingual.bin"), os.path.join(tmp, "multilingual.png")
    make_shard(path, tasks=MULTILINGUAL)
    r = inspect(path, "--sheet", sheet, "--samples", "16")
    check(r.returncode == 0 and r.stderr.strip() == "" and all(f'"{t}"' in r.stdout for t in MULTILINGUAL),
          f"German, Chinese and emoji instructions: exit 0, named in the summary, no box drawn on the sheet "
          f"(no warning) ({r.returncode}: {r.stderr.strip()[-300:]})")
    font = inspect_shards.SheetFont(14)
    chars = sorted({c for t in MULTILINGUAL for c in t if c != " "})
    wrong, boxes = [], []
    for ch in chars:
        chosen = font.font_for(ch)
        if not any(chosen is f and ord(ch) in codepoints for f, codepoints in font.faces):
            wrong.append(f"'{ch}' U+{ord(ch):04X} ({chosen.getname()[0]})")
        # the glyph drawn is not the chosen font's .notdef box
        glyph = pixels(lambda d, xy, t: d.text(xy, t, fill=255, font=chosen), ch)
        box = pixels(lambda d, xy, t: d.text(xy, t, fill=255, font=chosen), UNASSIGNED)
        if not glyph.any() or np.array_equal(glyph, box):
            boxes.append(ch)
    check(not wrong, f"each of the {len(chars)} characters is drawn with a font whose charmap has it; not: {wrong}")
    check(not boxes, f"no character is drawn as its font's missing-glyph box; boxes: {boxes}")
    names = {ch: font.font_for(ch).getname()[0] for ch in "ö打🚪"}
    check(names == {"ö": "DejaVu Sans", "打": "WenQuanYi Micro Hei", "🚪": "Symbola"},
          f"'ö', '打', '🚪' are drawn with DejaVu Sans, WenQuanYi Micro Hei, Symbola: {names}")
    drawn = {ch: pixels(lambda d, xy, t: font.draw(d, xy, t, fill=255), ch) for ch in ("打", "🚪", UNASSIGNED)}
    primary = font.faces[0][0]
    box = pixels(lambda d, xy, t: d.text(xy, t, fill=255, font=primary), UNASSIGNED)
    check(not np.array_equal(drawn["打"], drawn[UNASSIGNED]) and not np.array_equal(drawn["打"], box)
          and not np.array_equal(drawn["🚪"], box), "the sheet's text drawing: '打' and '🚪' differ from the "
          "missing-glyph box of U+0378")
    cjk = font.font_for("打")
    width = font.length("打开抽屉")
    check(width == cjk.getlength("打开抽屉") and width != primary.getlength("打开抽屉"),
          f"text is measured with the fonts that draw it: '打开抽屉' is {width} px, not the {primary.getlength('打开抽屉')} "
          "px of the first font's boxes")
    text = "打开抽屉" * 5 + " Schublade öffnen"
    lines = inspect_shards.wrap(font, text, 100)
    check(len(lines) >= 3 and all(font.length(line) <= 100 for line in lines)
          and "".join(lines) == text.replace(" ", ""),
          f"mixed text wraps within 100 px as drawn: {lines}")


def missing_fonts():
    """A font file that is missing: the sheet's text still draws, and a one-line warning names the
    Debian package that installs it."""
    import inspect_shards
    gone = ("/nonexistent/NoSuchFont.ttf", "fonts-nosuch", "tests")
    font = inspect_shards.SheetFont(14, [gone, inspect_shards.SHEET_FONTS[0]])
    text = pixels(lambda d, xy, t: font.draw(d, xy, t, fill=255), "öffnen")
    lines = font.warnings()
    check(text.any() and len(lines) == 1 and "\n" not in lines[0] and "/nonexistent/NoSuchFont.ttf" in lines[0]
          and "apt-get install fonts-nosuch" in lines[0], f"a missing font file: text still drawn, warning {lines}")
    alone = inspect_shards.SheetFont(14, [gone])
    text = pixels(lambda d, xy, t: alone.draw(d, xy, t, fill=255), "open 打")
    lines = alone.warnings()
    check(text.any() and len(lines) == 1 and "this sheet has 1: '打' U+6253" in lines[0],
          f"no font file at all: PIL's own font draws, and the warning counts the boxes: {lines}")


if __name__ == "__main__":
    main()
    check.finish()
