"""
inspect_shards.py: validate a train_vla shard set and summarize what the trainer will read.

    build/venv/bin/python data/inspect_shards.py data/default
    build/venv/bin/python data/inspect_shards.py data/mt10 --sheet /tmp/sheet.png --samples 16

SHARDS is a comma-separated list of files and folders, as the trainer's -i.
Every shard gets the reader's checks (vla_shard.Shard, the same as vla.h's shard_open) and more:
NaN/Inf in state or action, NaN/Inf or negative std in the stored statistics, episodes that
cover every frame exactly once, shards that disagree on cameras/img/state/action.
Each problem is one `error: ...` line on stderr and the exit status is 1; a valid set exits 0
and prints a summary. Oddities that do not stop training (empty or non-UTF-8 task strings,
instructions longer than --max-text, stored stats that disagree with the data) are `warning:` lines.

--sheet writes a PNG contact sheet of --samples frames drawn at random (--seed): each
camera's image enlarged, the instruction as the model gets it (--max-text bytes), the episode
and frame, the state and action values, and how much of the --chunk action chunk is valid.
"""

import argparse
import math
import os
import sys
import types

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
    """Task strings the model would read badly: empty, not UTF-8, or cut at max_text bytes."""
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
        if len(text) > max_text:
            seen = text[:max_text].decode("utf-8", "replace")
            report.warnings.append(f"{shard.path}: task {k} is {len(text)} bytes, over --max-text {max_text}: "
                                   f"the model reads only \"{seen}\"")
        if not used[k]:
            report.warnings.append(f"{shard.path}: task {k} is used by no episode")


def check_stale_stats(shard, report):
    """Stored stats far from the data's own: the trainer normalizes with the stored ones."""
    S, A = shard.state_dim, shard.action_dim
    for name, start, m, D in (("state", 0, report.state, S), ("action", 2 * S, report.action, A)):
        mean, std = shard.stats[start:start + D], shard.stats[start + D:start + 2 * D]
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
    tasks = {}
    for s in shards:
        ep_task = s.episodes["task"]
        for k in range(s.n_tasks):
            mine = ep_task == k
            eps, frames = tasks.get(s.task(k), (0, 0))
            tasks[s.task(k)] = (eps + int(mine.sum()), frames + int(s.episodes["length"][mine].sum()))

    # samples whose action chunk runs past the episode end: the last chunk-1 frames of each episode
    padded = int(np.minimum(lengths, chunk - 1).sum())

    out = [f"dataset    {spec}",
           f"shards     {len(shards)}",
           f"episodes   {len(lengths)}",
           f"frames     {n_frames}",
           f"cameras    {s0.n_cam} x {s0.img}x{s0.img} RGB",
           f"state      {s0.state_dim} dims",
           f"action     {s0.action_dim} dims",
           f"episode length  min {lengths.min()}  mean {lengths.mean():.1f}  max {lengths.max()} frames",
           f"chunk {chunk}   {padded} of {n_frames} samples ({100.0 * padded / n_frames:.1f}%) reach past their "
           f"episode's end (padded, masked); {int((lengths < chunk).sum())} episode(s) shorter than the chunk",
           f"on disk    {human_bytes(size)} ({size} bytes)",
           f"tasks      {len(tasks)}",
           f"  {'episodes':>8} {'frames':>8}  task"]
    for text, (eps, frames) in sorted(tasks.items(), key=lambda kv: -kv[1][1]):
        cut = f"  (cut to {max_text} bytes)" if len(text) > max_text else ""
        out.append(f"  {eps:>8} {frames:>8}  \"{text.decode('utf-8', 'replace')}\"{cut}")

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

def wrap(draw, font, text, width):
    """Greedy word wrap to a pixel width; a word longer than the width is split by characters."""
    lines, line = [], ""
    for word in text.split(" "):
        candidate = word if not line else line + " " + word
        if draw.textlength(candidate, font=font) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        while draw.textlength(word, font=font) > width and len(word) > 1:
            k = len(word)
            while k > 1 and draw.textlength(word[:k], font=font) > width:
                k -= 1
            lines.append(word[:k])
            word = word[k:]
        line = word
    lines.append(line)
    return lines


def values_text(label, v):
    return label + "  " + " ".join(f"{x:+.3f}" for x in v)


def load_font(size):
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)  # FreeType build: a scalable font
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()  # no FreeType: the fixed bitmap font


def write_sheet(path, spec, dataset, n_samples, seed, max_text, chunk):
    from PIL import Image, ImageDraw

    cfg = types.SimpleNamespace(n_cam=dataset.n_cam, img=dataset.img, state_dim=dataset.state_dim,
                                action_dim=dataset.action_dim, max_text=max_text, chunk=chunk)
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(dataset.n_samples, size=min(n_samples, dataset.n_samples), replace=False))

    scale = max(1, math.ceil(96 / dataset.img))  # nearest neighbour to at least 96 px: pixels stay visible
    side = dataset.img * scale
    pad, gap = 10, 6
    font, small = load_font(14), load_font(12)
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    line_h = int(font.getbbox("Ag")[3]) + 4
    tile_w = max(dataset.n_cam * (side + gap) - gap, 360)
    text_w = tile_w

    tiles = []
    for index in picks:
        images, text, text_mask, state, actions, action_mask = dataset.assemble(int(index), cfg)
        k = int(np.searchsorted(dataset.first_sample, index, side="right")) - 1
        shard = dataset.shards[k]
        f = int(index) - int(dataset.first_sample[k])
        e = int(shard.frame_episode[f])
        ep = shard.episodes[e]
        full = shard.task(int(ep["task"]))
        seen = bytes(text[:int(text_mask.sum())]).decode("utf-8", "replace")  # the bytes the model gets
        lines = [(f"sample {int(index)}   shard {k}   episode {e}   frame {f - int(ep['first_frame'])}"
                  f" of {int(ep['length'])}", "black", font)]
        for part in wrap(scratch, font, f"\"{seen}\"" + (f"  [+{len(full) - max_text} bytes cut]"
                                                         if len(full) > max_text else ""), text_w):
            lines.append((part, "navy", font))
        for label, v, color in (("state", shard.state[f], "darkgreen"), ("action", shard.action[f], "darkred")):
            for part in wrap(scratch, small, values_text(label, v), text_w):
                lines.append((part, color, small))
        lines.append((f"chunk: {int(action_mask.sum())} of {chunk} actions inside the episode",
                      "dimgray", small))
        tiles.append((images, lines))

    tile_h = side + 4 + max(len(lines) for _, lines in tiles) * line_h
    cols = max(1, min(len(tiles), math.ceil(math.sqrt(len(tiles)))))
    rows = math.ceil(len(tiles) / cols)
    title_h = 2 * line_h + pad
    sheet = Image.new("RGB", (pad + cols * (tile_w + 2 * pad), title_h + pad + rows * (tile_h + 2 * pad)), "white")
    draw = ImageDraw.Draw(sheet)
    draw.text((pad, pad), f"{spec}: {dataset.n_samples} frames, {dataset.n_cam} camera(s) {dataset.img}x"
              f"{dataset.img} shown x{scale}", fill="black", font=font)
    draw.text((pad, pad + line_h), f"{len(tiles)} random samples (seed {seed}), instruction as the model reads "
              f"it (max {max_text} bytes), raw state and action of the frame", fill="dimgray", font=small)

    for i, (images, lines) in enumerate(tiles):
        x0 = pad + (i % cols) * (tile_w + 2 * pad) + pad // 2
        y0 = title_h + pad + (i // cols) * (tile_h + 2 * pad)
        draw.rectangle([x0 - pad // 2, y0 - pad // 2, x0 + tile_w + pad // 2, y0 + tile_h + pad // 2],
                       fill=(244, 244, 244), outline=(200, 200, 200))
        for c in range(images.shape[0]):
            im = Image.fromarray(images[c]).resize((side, side), Image.NEAREST)
            sheet.paste(im, (x0 + c * (side + gap), y0))
        y = y0 + side + 4
        for text, color, fnt in lines:
            draw.text((x0, y), text, fill=color, font=fnt)
            y += line_h
    sheet.save(path)
    return sheet.size


# ---------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description="Validate train_vla dataset shards and summarize them.")
    p.add_argument("shards", metavar="SHARDS", help="comma-separated shard files and folders (as the trainer's -i)")
    p.add_argument("--sheet", metavar="PNG", help="write a contact sheet of random samples to this PNG")
    p.add_argument("--samples", type=int, default=16, help="frames on the contact sheet (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample draw (default 0)")
    p.add_argument("--max-text", type=int, default=48, help="instruction bytes the model reads (default 48)")
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
            w, h = write_sheet(args.sheet, args.shards, dataset, args.samples, args.seed, args.max_text, args.chunk)
        except OSError as e:
            print(f"error: cannot write the contact sheet {args.sheet}: {e}", file=sys.stderr)
            return 1
        print(f"contact sheet {args.sheet} ({w}x{h} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
