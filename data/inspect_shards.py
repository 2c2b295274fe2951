"""
inspect_shards.py: validate a train_vla shard set and summarize what the trainer will read.

    build/venv/bin/python data/inspect_shards.py data/default
    build/venv/bin/python data/inspect_shards.py data/mt10 --sheet /tmp/sheet.png --samples 16

SHARDS is a comma-separated list of files and folders, as the trainer's -i.
Every shard gets the reader's checks (vla_shard.Shard, the same as vla/shards.h's shard_open) and more:
NaN/Inf in state or action, NaN/Inf or negative std in the stored statistics, episodes that
cover every frame exactly once, shards that disagree on cameras, state, action or tokenizer.
Each problem is one `error: ...` line on stderr and the exit status is 1; a valid set exits 0
and prints a summary: the shard format version, the cameras and their sizes, the tokenizer of
the instructions and its vocabulary, and each task with its token ids. Oddities that do not stop
training (empty or non-UTF-8 task strings, instructions longer than --max-text tokens, stored
stats that disagree with the data by less than the trainer refuses) are `warning:` lines.

--sheet writes a PNG contact sheet of --samples frames drawn at random (--seed): each
camera's image enlarged (at its own size), the instruction as the model gets it (--max-text
tokens), the episode and the frame's place in it (counted from 1: frame 1 of 40 .. frame 40 of
40), the state and action values, and how much of the --chunk action chunk is valid.
Text is drawn with DejaVu Sans, WenQuanYi Micro Hei and Symbola (SHEET_FONTS), each character
with the first of them that has it, so German, Chinese or emoji instructions are legible; a
character none of the fonts found has is drawn as a box and named in a `warning:` line.
"""

import argparse
import math
import os
import sys
import types
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vla_shard  # noqa: E402

ROWS_PER_BLOCK = 1 << 16  # frames per pass over state/action: bounded memory on big shards


class Moments:
    """Per-dimension count, mean, M2, min and max of a (frames, D) array, merged block by block
    (Chan's parallel update), so very large shards never need a float64 copy."""

    def __init__(self, D):
        self.n = 0
        self.mean = np.zeros(D)
        self.m2 = np.zeros(D)
        self.lo = np.full(D, np.inf)
        self.hi = np.full(D, -np.inf)

    def add(self, block):
        x = block.astype(np.float64)
        other = Moments(x.shape[1])
        other.n = x.shape[0]
        other.mean = x.mean(0)
        other.m2 = ((x - other.mean) ** 2).sum(0)
        other.lo, other.hi = x.min(0), x.max(0)
        self.merge(other)

    def merge(self, other):
        if other.n == 0:
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.n / n)
        self.m2 = self.m2 + other.m2 + delta * delta * (self.n * other.n / n)
        self.lo, self.hi = np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi)
        self.n = n

    def std(self):
        return np.sqrt(self.m2 / self.n)  # population std, as the writers store it


class ShardReport:
    """What one pass over a shard found: its errors, warnings, and the numbers the summary needs."""

    def __init__(self, shard):
        self.shard = shard
        self.errors, self.warnings = [], []
        self.state = Moments(shard.state_dim)
        self.action = Moments(shard.action_dim)


def scan_values(shard, name, array, moments, report):
    """One pass over state or action: moments for the summary, and the first NaN/Inf with its count."""
    n_bad, first = 0, None
    D = array.shape[1]
    for start in range(0, array.shape[0], ROWS_PER_BLOCK):
        block = array[start:start + ROWS_PER_BLOCK]
        bad = ~np.isfinite(block)
        if bad.any():
            if first is None:
                k = int(np.argmax(bad.ravel()))
                first = (start + k // D, k % D, float(block.ravel()[k]))
            n_bad += int(bad.sum())
        else:
            moments.add(block)
    if n_bad:
        f, d, v = first
        e = int(shard.frame_episode[f])
        report.errors.append(f"{shard.path}: {name} holds {n_bad} NaN/Inf value(s), the first is {v} at frame {f} "
                             f"(episode {e}) dimension {d}: fix the source data and regenerate the shard")


def check_stats(shard, report):
    """The stored normalization stats: finite, std >= 0 (the trainer refuses anything else)."""
    S, A = shard.state_dim, shard.action_dim
    parts = [("state_mean", 0, S, False), ("state_std", S, S, True),
             ("action_mean", 2 * S, A, False), ("action_std", 2 * S + A, A, True)]
    n_bad, first = 0, None
    for name, start, D, is_std in parts:
        v = shard.stats[start:start + D]
        bad = ~np.isfinite(v) | ((v < 0) if is_std else False)
        if bad.any() and first is None:
            d = int(np.argmax(bad))
            first = (name, d, float(v[d]))
        n_bad += int(np.sum(bad))
    if n_bad:
        name, d, v = first
        report.errors.append(f"{shard.path}: normalization stats hold {n_bad} bad value(s) (NaN, Inf or a negative "
                             f"std), the first is {name} dimension {d} = {v}: regenerate the shard")


def check_coverage(shard, report):
    """Every frame in exactly one episode. The reader catches overlaps (a frame names one episode)
    but not a frame no episode claims: the trainer would still draw it, with no valid action."""
    n = shard.n_frames
    first = shard.episodes["first_frame"].astype(np.int64)
    end = first + shard.episodes["length"].astype(np.int64)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, end, -1)
    count = np.cumsum(delta)[:n]  # episodes claiming each frame
    for bad, what in ((count == 0, "lie in no episode"), (count > 1, "lie in more than one episode")):
        if bad.any():
            f = int(np.argmax(bad))
            report.errors.append(f"{shard.path}: {int(bad.sum())} frame(s) {what}, the first is frame {f} "
                                 f"(frame_episode says episode {int(shard.frame_episode[f])}): episodes must cover "
                                 "every frame exactly once; the file is corrupt, regenerate it")


def check_tasks(shard, max_text, report):
    """Task strings the model would read badly: empty, not UTF-8, or cut at max_text tokens."""
    used = np.zeros(shard.n_tasks, bool)
    used[shard.episodes["task"]] = True
    for k in range(shard.n_tasks):
        text = shard.task(k)
        if not text:
            report.warnings.append(f"{shard.path}: task {k} is an empty string: its episodes train without an "
                                   "instruction")
            continue
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as e:
            report.warnings.append(f"{shard.path}: task {k} is not valid UTF-8 (byte {e.start}: {e.reason}): "
                                   f"{text!r}")
        n_tokens = len(shard.task_tokens(k))
        if n_tokens > max_text:
            seen = text[:max_text].decode("utf-8", "replace") if shard.tokenizer == vla_shard.BYTES.name else \
                f"its first {max_text} tokens"
            report.warnings.append(f"{shard.path}: task {k} is {n_tokens} tokens, over --max-text {max_text}: "
                                   f"the model reads only \"{seen}\"")
        if not used[k]:
            report.warnings.append(f"{shard.path}: task {k} is used by no episode")


def check_stale_stats(shard, report):
    """Stored stats far from the data's own: the trainer normalizes with the stored ones."""
    S, A = shard.state_dim, shard.action_dim
    for name, start, m, D in (("state", 0, report.state, S), ("action", 2 * S, report.action, A)):
        mean, std = shard.stats[start:start + D], shard.stats[start + D:start + 2 * D]
        # what the trainer refuses (shard_open_checked): a mean 10 stds off, a std 10 times off on a varying column
        data_mean, data_std = m.mean.astype(np.float64), m.std().astype(np.float64)
        wide = np.maximum(data_std, std.astype(np.float64))
        far = np.abs(mean - data_mean) > 10 * wide + 1e-5 * np.abs(data_mean) + 1e-6
        varying = (data_std >= vla_shard.VLA_MIN_STD) & (data_std >= 1e-6 * np.abs(data_mean))
        scaled = varying & ((std < 0.1 * data_std) | (std > 10 * data_std))
        if far.any() or scaled.any():
            d = int(np.argmax(far | scaled))
            report.errors.append(f"{shard.path}: {name} column {d}: the stored mean {mean[d]:.6g} and std {std[d]:.6g} "
                                 f"do not describe the frames (mean {data_mean[d]:.6g}, std {data_std[d]:.6g}): "
                                 "train_vla refuses the shard; regenerate it")
            continue
        scale = m.std() + np.abs(m.mean) + 1e-6
        off = (np.abs(mean - m.mean) > 1e-3 * scale) | (np.abs(std - m.std()) > 1e-3 * scale)
        if off.any():
            d = int(np.argmax(off))
            report.warnings.append(f"{shard.path}: stored {name} stats disagree with the data in {int(off.sum())} "
                                   f"dimension(s), first dimension {d}: stored mean {mean[d]:.6g} std {std[d]:.6g}, "
                                   f"data mean {m.mean[d]:.6g} std {m.std()[d]:.6g}; regenerate the shard")


def validate(files, max_text):
    """Opens and checks every shard. Returns (reports of the shards that opened, all errors, all warnings)."""
    reports, errors = [], []
    for path in files:
        try:
            shard = vla_shard.Shard(path)
        except ValueError as e:  # the reader's own one-line message
            errors.append(str(e))
            continue
        except OSError as e:  # e.g. a file that exists but cannot be read
            errors.append(f"{path}: {e.strerror or e}: check the file's permissions")
            continue
        report = ShardReport(shard)
        scan_values(shard, "state", shard.state, report.state, report)
        scan_values(shard, "action", shard.action, report.action, report)
        check_stats(shard, report)
        check_coverage(shard, report)
        check_tasks(shard, max_text, report)
        if not report.errors:
            check_stale_stats(shard, report)
        reports.append(report)
    if reports:
        s0 = reports[0].shard
        ref = (s0.n_cam, s0.img, s0.state_dim, s0.action_dim)
        for r in reports[1:]:
            s = r.shard
            if (s.n_cam, s.img, s.state_dim, s.action_dim) != ref:
                errors.append(f"{s.path} has cameras/img/state/action {s.n_cam}/{s.img}/{s.state_dim}/"
                              f"{s.action_dim} but {s0.path} has {'/'.join(map(str, ref))}: shards of one dataset "
                              "must agree")
            elif (s.cam_height, s.cam_width) != (s0.cam_height, s0.cam_width):
                errors.append(f"{s.path} has cameras of {vla_shard.describe_cameras(s.cam_height, s.cam_width)} pixels "
                              f"but {s0.path} has {vla_shard.describe_cameras(s0.cam_height, s0.cam_width)} (height x "
                              "width): shards of one dataset must agree")
            elif (s.tokenizer, s.vocab) != (s0.tokenizer, s0.vocab):
                errors.append(f"{s.path} has the token ids of tokenizer {s.tokenizer} (vocabulary {s.vocab}) but "
                              f"{s0.path} has {s0.tokenizer} ({s0.vocab}): shards of one dataset must agree: convert "
                              "them with one tokenizer")
    for r in reports:
        errors += r.errors
    warnings = [w for r in reports for w in r.warnings]
    return reports, errors, warnings


# ---------------------------------------------------------------------------
# summary

def human_bytes(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024


def dim_table(name, moments, norm_mean, norm_std):
    """Lines of a per-dimension table: the data's own statistics, then what the trainer normalizes with."""
    lines = [f"{name} ({len(moments.mean)} dims): data over all frames | trainer normalization",
             f"  {'dim':>4} {'mean':>11} {'std':>11} {'min':>11} {'max':>11} | {'mean':>11} {'std':>11}"]
    std = moments.std()
    for d in range(len(std)):
        flag = "  constant (std 0): centered only" if std[d] < vla_shard.VLA_MIN_STD else ""
        lines.append(f"  {d:>4} {moments.mean[d]:>11.5g} {std[d]:>11.5g} {moments.lo[d]:>11.5g} "
                     f"{moments.hi[d]:>11.5g} | {norm_mean[d]:>11.5g} {norm_std[d]:>11.5g}{flag}")
    return lines


def summarize(spec, reports, dataset, chunk, max_text):
    shards = [r.shard for r in reports]
    s0 = shards[0]
    n_frames = sum(s.n_frames for s in shards)
    lengths = np.concatenate([s.episodes["length"] for s in shards]).astype(np.int64)
    size = sum(os.path.getsize(s.path) for s in shards)

    # tasks are shard-local tables: merge them by their text
    tasks, task_tokens = {}, {}
    for s in shards:
        ep_task = s.episodes["task"]
        for k in range(s.n_tasks):
            mine = ep_task == k
            eps, frames = tasks.get(s.task(k), (0, 0))
            tasks[s.task(k)] = (eps + int(mine.sum()), frames + int(s.episodes["length"][mine].sum()))
            task_tokens[s.task(k)] = s.task_tokens(k)

    # samples whose action chunk runs past the episode end: the last chunk-1 frames of each episode
    padded = int(np.minimum(lengths, chunk - 1).sum())

    out = [f"dataset    {spec}",
           f"shards     {len(shards)}",
           f"episodes   {len(lengths)}",
           f"frames     {n_frames}",
           f"format     version {', '.join(sorted({str(s.version) for s in shards}))}",
           f"cameras    {s0.n_cam}: {vla_shard.describe_cameras(s0.cam_height, s0.cam_width)} RGB (height x width)",
           f"tokenizer  {s0.tokenizer} (vocabulary {s0.vocab})",
           f"state      {s0.state_dim} dims",
           f"action     {s0.action_dim} dims",
           f"episode length  min {lengths.min()}  mean {lengths.mean():.1f}  max {lengths.max()} frames",
           f"chunk {chunk}   {padded} of {n_frames} samples ({100.0 * padded / n_frames:.1f}%) reach past their "
           f"episode's end (padded, masked); {int((lengths < chunk).sum())} episode(s) shorter than the chunk",
           f"on disk    {human_bytes(size)} ({size} bytes)",
           f"tasks      {len(tasks)}",
           f"  {'episodes':>8} {'frames':>8}  task"]
    for text, (eps, frames) in sorted(tasks.items(), key=lambda kv: -kv[1][1]):
        ids = task_tokens[text]
        cut = f"  (cut to {max_text} tokens)" if len(ids) > max_text else ""
        out.append(f"  {eps:>8} {frames:>8}  \"{text.decode('utf-8', 'replace')}\"{cut}")
        out.append(f"  {'':>8} {'':>8}  tokens ({len(ids)}): {' '.join(str(int(t)) for t in ids)}")

    total_state, total_action = Moments(s0.state_dim), Moments(s0.action_dim)
    for r in reports:
        total_state.merge(r.state)
        total_action.merge(r.action)
    out += [""] + dim_table("state", total_state, dataset.state_mean, dataset.state_std)
    out += [""] + dim_table("action", total_action, dataset.action_mean, dataset.action_std)
    constant = [f"state {d}" for d in np.flatnonzero(total_state.std() < vla_shard.VLA_MIN_STD)] + \
               [f"action {d}" for d in np.flatnonzero(total_action.std() < vla_shard.VLA_MIN_STD)]
    out += ["", "constant dims  " + (", ".join(constant) if constant else "none")
            + ("  (std 0: the trainer divides them by 1, they only get centered)" if constant else "")]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# contact sheet

# Fonts of the contact sheet, tried in this order for each character: the first that has a glyph
# for it draws it. (file, Debian package that installs it, what it is there for)
SHEET_FONTS = [
    ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "fonts-dejavu-core", "Latin, Greek, Cyrillic"),
    ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", "fonts-wqy-microhei", "Chinese, Japanese, Korean"),
    ("/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf", "fonts-symbola", "emoji and symbols"),
]
DEFAULT_FONT_CHARS = set(range(0x20, 0x7F))  # what PIL's built-in font is trusted to draw: printable ASCII


_charmaps = {}  # font file -> codepoints: read once per file, shared by the sizes


def font_charmap(path):
    """The codepoints a font file has glyphs for (its first face, as PIL opens it)."""
    if path not in _charmaps:
        from matplotlib.ft2font import FT2Font  # PIL does not tell which characters a font has
        _charmaps[path] = frozenset(FT2Font(path).get_charmap())
    return _charmaps[path]


class SheetFont:
    """The fonts of SHEET_FONTS at one pixel size, used as one font: each character is drawn with the
    first font that has a glyph for it, so instructions in any script, and emoji, are legible. PIL
    has no font fallback of its own. Fonts whose file is missing are left out (`missing` lists them);
    with none found, PIL's built-in font draws everything. Characters that no font has are drawn by
    the first font (as its missing-glyph box) and collected in `uncovered`."""

    def __init__(self, size, fonts=SHEET_FONTS):
        from PIL import ImageFont
        self.faces, self.missing, self.uncovered = [], [], set()  # faces: (PIL font, codepoints)
        for path, package, what in fonts:
            try:
                if not os.path.isfile(path):  # (PIL would look for a file of that name elsewhere)
                    raise FileNotFoundError(path)
                self.faces.append((ImageFont.truetype(path, size), font_charmap(path)))
            except (OSError, RuntimeError):  # no such file, or not a font FreeType reads: as if not installed
                self.missing.append((path, package, what))
        if not self.faces:
            try:
                default = ImageFont.load_default(size=size)  # FreeType build: a scalable font
            except (TypeError, OSError, ImportError):
                default = ImageFont.load_default()  # no FreeType: the fixed bitmap font
            self.faces.append((default, DEFAULT_FONT_CHARS))
        # one baseline for all faces: each is drawn lowered by how much less it rises above it
        self.ascent = max(ascent(f) for f, _ in self.faces)
        self.height = self.ascent + max(descent(f) for f, _ in self.faces)

    def font_for(self, ch):
        cp = ord(ch)
        for font, chars in self.faces:
            if cp in chars:
                return font
        if ch != " " and unicodedata.category(ch) not in ("Mn", "Me", "Cf"):  # marks, joiners: invisible
            self.uncovered.add(ch)
        return self.faces[0][0]

    def runs(self, text):
        """text as (substring, font) runs of characters that share their font."""
        out = []
        for ch in text:
            font = self.font_for(ch)
            if out and out[-1][1] is font:
                out[-1][0] += ch
            else:
                out.append([ch, font])
        return [(run, font) for run, font in out]

    def length(self, text):
        """Advance width of text in pixels, as draw() lays it out."""
        return sum(font.getlength(run) for run, font in self.runs(text))

    def draw(self, draw, xy, text, fill):
        x, y = xy
        for run, font in self.runs(text):
            draw.text((x, y + self.ascent - ascent(font)), run, fill=fill, font=font)
            x += font.getlength(run)

    def warnings(self):
        """One line (or none): font files that are missing and what installs them, or characters
        that no font has."""
        chars = sorted(self.uncovered)
        shown = " ".join((f"'{c}' " if c.isprintable() else "") + f"U+{ord(c):04X}" for c in chars[:5]) \
            + (" ..." if len(chars) > 5 else "")
        if self.missing:
            files = ", ".join(f"{path} ({what})" for path, _, what in self.missing)
            drawn = f"; this sheet has {len(chars)}: {shown}" if chars else ""
            packages = " ".join(package for _, package, _ in self.missing)
            return [f"contact sheet font(s) missing: {files}: characters only they have are drawn as boxes{drawn}; "
                    f"install them with `apt-get install {packages}` (`make setup` does)"]
        if chars:
            return [f"the contact sheet draws {len(chars)} character(s) as boxes: {shown}: none of its fonts has "
                    "them (SHEET_FONTS in data/inspect_shards.py lists the fonts)"]
        return []


def ascent(font):
    return font.getmetrics()[0] if hasattr(font, "getmetrics") else 0


def descent(font):
    return font.getmetrics()[1] if hasattr(font, "getmetrics") else 11  # the bitmap font's cell is 11 px


def wrap(font, text, width):
    """Greedy word wrap to a pixel width; a word longer than the width is split by characters."""
    lines, line = [], ""
    for word in text.split(" "):
        candidate = word if not line else line + " " + word
        if font.length(candidate) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        while font.length(word) > width and len(word) > 1:
            k = len(word)
            while k > 1 and font.length(word[:k]) > width:
                k -= 1
            lines.append(word[:k])
            word = word[k:]
        line = word
    lines.append(line)
    return lines


def tile_title(index, shard, episode, frame, length):
    """A sheet tile's first line; frame is the episode-local index (from 0), said as a count from 1:
    an episode of 40 frames reads frame 1 of 40 .. frame 40 of 40."""
    return f"sample {index}   shard {shard}   episode {episode}   frame {frame + 1} of {length}"


def values_text(label, v):
    return label + "  " + " ".join(f"{x:+.3f}" for x in v)


def write_sheet(path, spec, dataset, n_samples, seed, max_text, chunk):
    from PIL import Image, ImageDraw

    cfg = types.SimpleNamespace(n_cam=dataset.n_cam, img=dataset.img, state_dim=dataset.state_dim,
                                action_dim=dataset.action_dim, max_text=max_text, chunk=chunk)
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(dataset.n_samples, size=min(n_samples, dataset.n_samples), replace=False))

    # nearest neighbour to at least 96 px on the smallest side: pixels stay visible; every camera by
    # the same factor, at its own size
    heights, widths = dataset.cam_height, dataset.cam_width
    scale = max(1, math.ceil(96 / min(heights + widths)))
    side = max(heights) * scale  # the tallest camera
    pad, gap = 10, 6
    font, small = SheetFont(14), SheetFont(12)
    line_h = font.height + 2
    tile_w = max(sum(w * scale + gap for w in widths) - gap, 360)
    text_w = tile_w
    bytes_tokens = dataset.tokenizer == vla_shard.BYTES.name

    tiles = []
    for index in picks:
        images, tokens, text_mask, state, actions, action_mask = dataset.assemble(int(index), cfg)
        k = int(np.searchsorted(dataset.first_sample, index, side="right")) - 1
        shard = dataset.shards[k]
        f = int(index) - int(dataset.first_sample[k])
        e = int(shard.frame_episode[f])
        ep = shard.episodes[e]
        full, n_ids = shard.task(int(ep["task"])), len(shard.task_tokens(int(ep["task"])))
        n_seen = int(text_mask.sum())
        # the bytes the model gets; the whole text for another tokenizer (its ids are not decoded here)
        seen = (bytes(tokens[:n_seen].astype(np.uint8)) if bytes_tokens else full).decode("utf-8", "replace")
        lines = [(tile_title(int(index), k, e, f - int(ep["first_frame"]), int(ep["length"])), "black", font)]
        cut = f"  [+{n_ids - max_text} tokens cut]" if n_ids > max_text else ""
        for part in wrap(font, f"\"{seen}\"" + cut, text_w):
            lines.append((part, "navy", font))
        for label, v, color in (("state", shard.state[f], "darkgreen"), ("action", shard.action[f], "darkred")):
            for part in wrap(small, values_text(label, v), text_w):
                lines.append((part, color, small))
        lines.append((f"chunk: {int(action_mask.sum())} of {chunk} actions inside the episode",
                      "dimgray", small))
        tiles.append((dataset.split_cameras(images), lines))

    tile_h = side + 4 + max(len(lines) for _, lines in tiles) * line_h
    cols = max(1, min(len(tiles), math.ceil(math.sqrt(len(tiles)))))
    rows = math.ceil(len(tiles) / cols)
    title_h = 2 * line_h + pad
    sheet = Image.new("RGB", (pad + cols * (tile_w + 2 * pad), title_h + pad + rows * (tile_h + 2 * pad)), "white")
    draw = ImageDraw.Draw(sheet)
    font.draw(draw, (pad, pad), f"{spec}: {dataset.n_samples} frames, {dataset.n_cam} camera(s) "
              f"{vla_shard.describe_cameras(heights, widths)} shown x{scale}", fill="black")
    small.draw(draw, (pad, pad + line_h), f"{len(tiles)} random samples (seed {seed}), instruction as the model "
               f"reads it (max {max_text} tokens of {dataset.tokenizer}), raw state and action of the frame",
               fill="dimgray")

    for i, (images, lines) in enumerate(tiles):
        x0 = pad + (i % cols) * (tile_w + 2 * pad) + pad // 2
        y0 = title_h + pad + (i // cols) * (tile_h + 2 * pad)
        draw.rectangle([x0 - pad // 2, y0 - pad // 2, x0 + tile_w + pad // 2, y0 + tile_h + pad // 2],
                       fill=(244, 244, 244), outline=(200, 200, 200))
        x = x0
        for camera in images:
            im = Image.fromarray(camera).resize((camera.shape[1] * scale, camera.shape[0] * scale), Image.NEAREST)
            sheet.paste(im, (x, y0))
            x += camera.shape[1] * scale + gap
        y = y0 + side + 4
        for text, color, fnt in lines:
            fnt.draw(draw, (x0, y), text, fill=color)
            y += line_h
    sheet.save(path)
    font.uncovered |= small.uncovered
    return sheet.size, font.warnings()


# ---------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description="Validate train_vla dataset shards and summarize them.")
    p.add_argument("shards", metavar="SHARDS", help="comma-separated shard files and folders (as the trainer's -i)")
    p.add_argument("--sheet", metavar="PNG", help="write a contact sheet of random samples to this PNG")
    p.add_argument("--samples", type=int, default=16, help="frames on the contact sheet (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample draw (default 0)")
    p.add_argument("--max-text", type=int, default=48, help="instruction tokens the model reads (default 48)")
    p.add_argument("--chunk", type=int, default=16, help="actions per chunk, H (default 16)")
    args = p.parse_args()
    for name in ("samples", "max_text", "chunk"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")

    try:
        files = vla_shard.list_files(args.shards)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    reports, errors, warnings = validate(files, args.max_text)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors:
        return 1

    dataset = vla_shard.Dataset(args.shards)  # the pooled stats exactly as the trainer computes them
    print(summarize(args.shards, reports, dataset, args.chunk, args.max_text))
    if args.sheet:
        try:
            (w, h), sheet_warnings = write_sheet(args.sheet, args.shards, dataset, args.samples, args.seed,
                                                 args.max_text, args.chunk)
        except OSError as e:
            print(f"error: cannot write the contact sheet {args.sheet}: {e}", file=sys.stderr)
            return 1
        except ImportError as e:
            print(f"error: {e}: the contact sheet needs Pillow and matplotlib, install the data tools' packages "
                  "with `make setup`", file=sys.stderr)
            return 1
        for line in sheet_warnings:
            print(f"warning: {line}", file=sys.stderr)
        print(f"contact sheet {args.sheet} ({w}x{h} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
