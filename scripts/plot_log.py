"""
plot_log.py: training curves of one or more runs, from their log.jsonl, as one PNG.

    build/venv/bin/python scripts/plot_log.py out/small/log.jsonl -o curves.png
    build/venv/bin/python scripts/plot_log.py build/run_a/log.jsonl build/run_b/log.jsonl --names lr1e-3,lr3e-4

Four panels against the optimizer step: the loss (each step faint, an exponential moving
average bold, log scale), the learning rate, the gradient norm before clipping (log scale) and
samples/s; the runs are overlaid in one colour each and named in the legend (by default, the
name of the folder holding their log). A log that a resumed run appended to holds some steps
twice (the steps after the last checkpoint were run again): the later line of a step wins, as
the resumed run is the one whose weights continue.
"""

import argparse
import json
import math
import os
import sys


def read_log(path):
    """log.jsonl -> {key: [values]} sorted by step, with the steps as key "step"."""
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
                if "eval" in r:  # an evaluation's results (--eval-every), not a training step
                    continue
                rows[int(r["step"])] = r  # a repeated step (after a resume): the later line wins
            except (ValueError, KeyError, TypeError):
                sys.exit(f"error: {path} line {n} is not a train_vla log line: pass the log.jsonl of a run")
    if not rows:
        sys.exit(f"error: {path} holds no steps: the run has not logged any yet")
    steps = sorted(rows)
    out = {"step": steps}  # 1-based: the step line's number
    for key in ("loss", "lr", "grad_norm", "samples_per_s"):
        out[key] = [float(rows[s].get(key, math.nan)) for s in steps]
    return out


def smooth(values, span):
    """Bias-corrected exponential moving average over `span` steps (as TensorBoard's smoothing)."""
    alpha, avg, weight, out = 2.0 / (span + 1.0), 0.0, 0.0, []
    for v in values:
        if math.isfinite(v):
            avg = (1 - alpha) * avg + alpha * v
            weight = (1 - alpha) * weight + alpha
        out.append(avg / weight if weight > 0 else math.nan)
    return out


def plot(runs, path, title, span):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (ax_loss, ax_lr), (ax_norm, ax_speed) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, log) in enumerate(runs):
        c = colors[i % len(colors)]
        s = log["step"]
        ax_loss.plot(s, log["loss"], color=c, alpha=0.25, linewidth=0.6)
        ax_loss.plot(s, smooth(log["loss"], span), color=c, linewidth=1.6, label=name)
        ax_lr.plot(s, log["lr"], color=c, linewidth=1.4, label=name)
        ax_norm.plot(s, log["grad_norm"], color=c, alpha=0.25, linewidth=0.6)
        ax_norm.plot(s, smooth(log["grad_norm"], span), color=c, linewidth=1.4, label=name)
        ax_speed.plot(s, smooth(log["samples_per_s"], span), color=c, linewidth=1.4, label=name)
    ax_loss.set_yscale("log")
    ax_loss.set_title(f"loss (faint: each step; bold: moving average over {span} steps)", fontsize=10)
    ax_lr.set_title("learning rate", fontsize=10)
    ax_norm.set_yscale("log")
    ax_norm.set_title("gradient norm before clipping", fontsize=10)
    ax_speed.set_title(f"samples/s (moving average over {span} steps)", fontsize=10)
    ax_speed.set_ylim(bottom=0)
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    for ax in axes[1]:
        ax.set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description="loss, learning rate, gradient norm and samples/s of train_vla runs")
    ap.add_argument("logs", nargs="+", help="log.jsonl files (or run folders holding one)")
    ap.add_argument("-o", "--output", default="curves.png", help="PNG to write (curves.png)")
    ap.add_argument("--names", help="a name per run, comma-separated (default: each log's folder name)")
    ap.add_argument("--title", default="", help="a title above the panels")
    ap.add_argument("--smooth", type=int, default=0, help="moving-average span in steps (0: about 1%% of the longest run)")
    args = ap.parse_args()
    paths = [os.path.join(p, "log.jsonl") if os.path.isdir(p) else p for p in args.logs]
    for p in paths:
        if not os.path.isfile(p):
            sys.exit(f"error: {p}: no such log: pass a run's log.jsonl or its output folder (-o of the trainer)")
    names = args.names.split(",") if args.names else [os.path.basename(os.path.dirname(os.path.abspath(p)))
                                                      for p in paths]
    if len(names) != len(paths):
        sys.exit(f"error: --names gives {len(names)} name(s) for {len(paths)} log(s): give one per log")
    runs = [(n, read_log(p)) for n, p in zip(names, paths)]
    span = args.smooth if args.smooth > 0 else max(1, max(len(r["step"]) for _, r in runs) // 100)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("error: matplotlib is missing: run `make setup` (it installs requirements.txt into build/venv)")
    plot(runs, args.output, args.title, span)
    counts = ", ".join(f"{n} {len(r['step'])} steps" for n, r in runs)
    print(f"wrote {args.output}: {len(runs)} run(s), {counts}")


if __name__ == "__main__":
    main()
