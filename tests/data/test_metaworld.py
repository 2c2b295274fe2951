"""
test_metaworld.py: a tiny Meta-World generator run (one task, two episodes, small images) whose
shard the C reader accepts. Run by `make test` with the data tools' Python (build/venv).
Exits non-zero on any failure; the last line is `N passed, M failed`.
"""

import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")  # the tools under test
sys.path.insert(0, DATA)
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()


def generate(out, workers, *extra):
    cmd = [sys.executable, os.path.join(DATA, "metaworld_gen.py"), "-o", out, "--tasks", "reach-v3", "--episodes", "2",
           "--img", "16", "--workers", str(workers), "--seed", "3", *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out1, out2 = os.path.join(tmp, "one"), os.path.join(tmp, "two")
        r = generate(out1, 1, "--cameras", "corner,corner2")
        r1_err = r.stderr
        check(r.returncode == 0, f"generator runs: {r.stdout.strip() or r.stderr.strip()[-300:]}")
        if r.returncode != 0:
            return
        path = os.path.join(out1, "metaworld_000.bin")
        ds = vla_shard.Dataset(out1)
        s = ds.shards[0]
        check(len(ds.shards) == 1 and s.n_episodes == 2 and s.n_frames > 10,
              f"one shard, two episodes, {s.n_frames} frames")
        check((s.n_cam, s.img, s.state_dim, s.action_dim) == (2, 16, 4, 4),
              "2 cameras at 16 px, state = hand xyz + gripper, 4-dim action")
        task = bytes(s.task(0)).decode()
        check(task == "reach the goal position", f"instruction: {task!r}")
        images = np.asarray(s.images)
        check(images.std() > 5 and not np.array_equal(images[:, 0], images[:, 1]),
              "images are rendered (not blank) and the two cameras differ")
        action = np.asarray(s.action)
        check(np.isfinite(action).all() and np.abs(action).max() <= 1.0, "actions finite and within [-1, 1]")
        state = np.asarray(s.state)
        check(np.isfinite(state).all() and np.abs(state[-1, :3] - state[0, :3]).sum() > 0.01,
              "the hand moves during the episode")
        # the C reader accepts it: one training step of the CPU trainer on it
        trainer = os.path.join(ROOT, "train_vla_cpu")
        r = subprocess.run([trainer, "-p", "tiny", "-i", path, "-n", "1", "-b", "2", "-t", "1", "-o",
                            os.path.join(tmp, "run")], capture_output=True, text=True)
        check(r.returncode == 0 and "step     1/1" in r.stdout,
              "train_vla_cpu reads the shard and trains a step" + ("" if r.returncode == 0 else f": {r.stderr.strip()}"))
        # a fixed seed gives the same dataset, whatever the number of workers
        r = generate(out2, 2, "--cameras", "corner,corner2")
        same = r.returncode == 0 and open(path, "rb").read() == open(os.path.join(out2, "metaworld_000.bin"), "rb").read()
        check(same, "the same seed writes a byte-identical shard with 1 and with 2 workers")
        r = subprocess.run([sys.executable, os.path.join(DATA, "metaworld_gen.py"), "-o", out2, "--tasks", "fly-v3"],
                           capture_output=True, text=True)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "unknown Meta-World task 'fly-v3'" in lines[0],
              f"an unknown task is a one-line error: {lines[-1] if lines else ''}")
        # progress into a pipe: plain lines, one per episode, no carriage returns
        progress = [ln for ln in r1_err.splitlines() if "episodes" in ln and "ETA" in ln]
        check("\r" not in r1_err and len(progress) == 2 and progress[-1].startswith("2/2 episodes"),
              f"redirected, the progress is {len(progress)} plain line(s) without carriage returns")
        tokenized(tmp, out1)
        instructions(tmp)
        failures(tmp)


def tokenized(tmp, bytes_out):
    """--tokenizer: the same episodes with the instruction as a tokenizer.json's ids (task + "\\n");
    a missing file is a one-line error before anything runs."""
    from test_lerobot import build_tokenizer  # a byte-level BPE trained with the tokenizers package

    tok_path = build_tokenizer(os.path.join(tmp, "tok"))
    out = os.path.join(tmp, "tokenized")
    r = generate(out, 1, "--cameras", "corner,corner2", "--tokenizer", tok_path)
    check(r.returncode == 0, "generator runs with --tokenizer" + ("" if r.returncode == 0 else f": {r.stderr[-300:]}"))
    if r.returncode != 0:
        return
    s, b = vla_shard.Shard(os.path.join(out, "metaworld_000.bin")), vla_shard.Shard(os.path.join(bytes_out,
                                                                                             "metaworld_000.bin"))
    tok = vla_shard.TokenizerJSON(tok_path)
    want = tok.encode(b.task(0).decode()).tolist()
    check((s.tokenizer, s.vocab) == (tok.name, tok.vocab) and s.task_tokens(0).tolist() == want
          and np.array_equal(s.images, b.images) and np.array_equal(s.action, b.action) and s.task(0) == b.task(0),
          f"the same episodes, the instruction as {len(want)} ids of {tok.name} (vocabulary {tok.vocab})")
    missing = os.path.join(tmp, "tok_missing")
    r = subprocess.run([sys.executable, os.path.join(DATA, "metaworld_gen.py"), "-o", missing, "--tokenizer",
                        os.path.join(tmp, "nothing.json")], capture_output=True, text=True)
    check(one_error_line(r, "--tokenizer: tokenizer") and not os.path.exists(missing),
          f"a missing --tokenizer is a one-line error, no folder: {r.stderr.strip()}")


def vla_presets_column(field):
    """{preset: value} of one field of vla/config.h's FLOW_PRESETS table, the field's column found from
    the order of FLOW_CONFIG_FIELDS."""
    header = open(os.path.join(ROOT, "vla", "config.h")).read()
    start = header.index("#define FLOW_CONFIG_FIELDS(X)")
    fields = re.findall(r"X\((\w+)\)", header[start:header.index("\n\n", start)])
    start = header.index("FLOW_PRESETS[] = {")
    table = header[start:header.index("};", start)]
    rows = re.findall(r'\{"(\w+)",\s*"[^"]*",\s*\{([^}]*)\}', table)
    return {name: int(values.split(",")[fields.index(field)]) for name, values in rows}


def instructions(tmp):
    """Instructions that collide once cut: the presets' text lengths, the warning of the generator."""
    rows = vla_presets_column("max_text")
    check(rows and rows == vla_shard.PRESET_MAX_TEXT,
          f"vla_shard.PRESET_MAX_TEXT matches the max_text column of vla/config.h's FLOW_PRESETS {rows}")
    window = ["slide the window open", "slide the window closed"]
    check(vla_shard.distinct_text_bytes(window) == 18 and vla_shard.text_collisions(window, 17) == [window]
          and vla_shard.text_collisions(window, 18) == [], "the two window instructions need 18 bytes")
    check(vla_shard.distinct_text_bytes(["open the door", "open the door slowly"]) == 14,
          "an instruction that begins another needs its length + 1 (the mask tells them apart)")
    many = [f"task {i // 10:05d} variant {i}" for i in range(400)]  # 40 groups of 10 equal in 16 bytes
    lines = vla_shard.text_collision_warnings(many)
    check(len(lines) == 1 and "preset tiny" in lines[0] and lines[0].count('"') == 200
          and lines[0].count("; and 30 more groups;") == 1,
          f"400 instructions in 40 groups: the tiny preset's line names the first 10 groups and counts the rest "
          f"({len(lines)} line(s): {lines[0][-90:] if lines else ''})")
    r = subprocess.run([sys.executable, os.path.join(DATA, "metaworld_gen.py"), "-o", os.path.join(tmp, "window"),
                        "--tasks", "window-open-v3,window-close-v3", "--episodes", "1", "--img", "16", "--workers", "1"],
                       capture_output=True, text=True)
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    check(r.returncode == 0 and len(warned) == 1 and "preset tiny" in warned[0] and '"slide the window open"' in warned[0]
          and '"slide the window closed"' in warned[0] and "--max-text 18" in warned[0],
          f"the generator warns about MT10's window tasks at the tiny preset: {warned}")


def one_error_line(r, needle):
    lines = r.stderr.strip().splitlines()
    return r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0] \
        and "Traceback" not in r.stderr


def failures(tmp):
    """Bad options and failed runs: one `error:` line, exit 1, and nothing left behind."""
    rows = vla_presets_column("vocab")
    check(rows and rows == vla_shard.PRESET_VOCAB,
          f"vla_shard.PRESET_VOCAB matches the vocab column of vla/config.h's FLOW_PRESETS {rows}")
    # an expert that cannot succeed in 1 step fails the run: into new nested folders and into a
    # folder that was there (with a file of its own), at the same time
    nested, keep = os.path.join(tmp, "new", "a", "b"), os.path.join(tmp, "keep")
    os.makedirs(keep)
    with open(os.path.join(keep, "notes.txt"), "w") as f:
        f.write("not a shard\n")
    runs = [subprocess.Popen([sys.executable, os.path.join(DATA, "metaworld_gen.py"), "-o", out, "--tasks",
                              "reach-v3", "--episodes", "1", "--img", "16", "--workers", "1", "--max-steps", "1",
                              "--max-attempts", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for out in (nested, keep)]
    for (stdout, stderr), p, what in zip((p.communicate() for p in runs), runs, ("a new", "an existing")):
        r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        check(one_error_line(r, "the expert failed 1 layout(s) in a row: raise --max-steps or --max-attempts"),
              f"a failed run into {what} folder is a one-line error: {stderr.strip()[-300:]}")
    check(not os.path.exists(os.path.join(tmp, "new")), "a failed run removes the nested folders it created")
    check(os.listdir(keep) == ["notes.txt"] and open(os.path.join(keep, "notes.txt")).read() == "not a shard\n",
          f"a failed run into an existing folder keeps it and its file, adds nothing: {os.listdir(keep)}")


if __name__ == "__main__":
    main()
    check.finish()
