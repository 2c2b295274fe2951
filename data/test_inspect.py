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
    return subprocess.run([sys.executable, os.path.join(HERE, "inspect_shards.py"), *args], capture_output=True,
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
