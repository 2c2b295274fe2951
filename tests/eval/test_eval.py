"""
test_eval.py: a one-episode closed-loop evaluation smoke test, with a checkpoint of the MT10
recipe's model (the small preset, --train all) trained for two steps on a tiny generated dataset
(16 px frames, resized by the model to its 64), and the expert and random baselines through the
same harness.
Run by `make test` with the data tools' Python (build/venv). Exits non-zero on any failure; the
last line is `N passed, M failed`.
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")  # the tools under test
sys.path.insert(0, os.path.join(ROOT, "data"))
from checks import Checks  # noqa: E402

check = Checks()


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True)


def evaluate(tmp, name, *args):
    out = os.path.join(tmp, name + ".json")
    r = run(sys.executable, os.path.join(SCRIPTS, "eval_metaworld.py"), "--tasks", "reach-v3", "--episodes", "1",
            "--out", out, *args)
    result = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else None
    return r, result


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data, run_dir = os.path.join(tmp, "data"), os.path.join(tmp, "run")
        r = run(sys.executable, os.path.join(ROOT, "data", "metaworld_gen.py"), "-o", data, "--tasks", "reach-v3",
                "--episodes", "1", "--img", "16", "--workers", "1")
        r2 = run(os.path.join(ROOT, "train_vla_cpu"), "-p", "small", "--train", "all", "-i", data, "-n", "2", "-b", "2",
                 "-t", "1", "-o", run_dir)
        ckpt = os.path.join(run_dir, "ckpt_00000002.bin")
        check(r.returncode == 0 and r2.returncode == 0 and os.path.exists(ckpt),
              "a 2-step checkpoint of the small preset (--train all) on generated data"
              + ("" if r2.returncode == 0 else f": {(r2.stdout + r2.stderr).strip()[-300:]}"))

        r, res = evaluate(tmp, "policy", "--policy", ckpt, "--max-steps", "20", "--replan", "4", "--img", "16",
                          "--video-dir", os.path.join(tmp, "videos"))
        ok = res is not None and res["tasks"]["reach-v3"]["episodes"] == 1 and 0.0 <= res["overall"]["success_rate"] <= 1.0
        check(ok, "the checkpoint policy runs one 20-step episode and writes JSON"
              + ("" if r.returncode == 0 else f": {r.stderr.strip()[-300:]}"))
        check(ok and "group easy" in r.stdout and "mean over tasks" in r.stdout, "the table has the task, its group and the mean")
        videos = os.listdir(os.path.join(tmp, "videos")) if os.path.isdir(os.path.join(tmp, "videos")) else []
        check(len(videos) == 1 and videos[0].startswith("reach-v3_ep000") and videos[0].endswith(".gif"),
              f"a GIF of episode 0: {videos}")

        check(ok and "\r" not in r.stderr and "1/1 episodes" in r.stderr,
              "redirected, the progress is plain lines without carriage returns")
        check(ok and ("|    0/1    |" in r.stdout or "|    1/1    |" in r.stdout),
              "the table shows successes/episodes beside the rate")
        check(ok and "averaged over the successful episodes only" in r.stdout,
              "the table's header defines mean steps")
        ep = res["episodes"][0] if ok else {}
        check(ok and ep.get("task") == "reach-v3" and ep.get("episode") == 0 and isinstance(ep.get("layout_seed"), int)
              and ep.get("steps", 0) >= 1 and isinstance(ep.get("success"), bool),
              f"the JSON lists each episode with its outcome, steps and layout seed: {ep}")
        check(ok and set(res["settings"]) >= {"replan", "device", "cameras", "seed", "img"} and res["settings"]["img"] == 16,
              "a checkpoint's settings, the rendered side among them")

        # the first episode again alone, among others, and in two worker processes: the same outcome
        r, alone = evaluate(tmp, "alone", "--policy", ckpt, "--max-steps", "20", "--replan", "4", "--img", "16",
                            "--only", "reach-v3:0", "--video-dir", os.path.join(tmp, "replay"))
        same = alone is not None and ok and {k: alone["episodes"][0][k] for k in ("success", "steps", "layout_seed")} == \
            {k: ep[k] for k in ("success", "steps", "layout_seed")}
        check(same and len(os.listdir(os.path.join(tmp, "replay"))) == 1,
              "--only reach-v3:0 replays the episode exactly (same layout, steps and outcome) and films it")
        r, one = evaluate(tmp, "w1", "--policy", ckpt, "--max-steps", "20", "--replan", "4", "--img", "16",
                          "--episodes", "3")
        r2, two = evaluate(tmp, "w2", "--policy", ckpt, "--max-steps", "20", "--replan", "4", "--img", "16",
                           "--episodes", "3", "--workers", "2")
        check(one is not None and two is not None and one["episodes"] == two["episodes"] and
              one["episodes"][0]["steps"] == ep.get("steps"),
              "3 episodes with 1 and with 2 worker processes: the same records, episode 0 as before"
              + ("" if r2.returncode == 0 else f": {r2.stderr.strip()[-300:]}"))

        r, res = evaluate(tmp, "expert", "--policy", "expert")
        check(res is not None and res["overall"]["success_rate"] == 1.0, "the scripted expert succeeds")
        check(res is not None and not {"replan", "device", "cameras", "img"} & set(res["settings"]),
              f"the expert's JSON records only settings that apply to it: {res and sorted(res['settings'])}")
        r, res = evaluate(tmp, "random", "--policy", "random", "--max-steps", "50")
        check(res is not None and res["overall"]["success_rate"] == 0.0, "random actions do not succeed in 50 steps")
        check(res is not None and res["tasks"]["reach-v3"]["mean_steps"] is None and "|          - |" in r.stdout,
              "with no success, mean steps is empty (-), not the horizon")
        plot_checks(tmp, run_dir)

        for spec, needle in (("reach-v3", "expected TASK:EPISODE"), ("fly-v3:0", "unknown task fly-v3")):
            r = run(sys.executable, os.path.join(SCRIPTS, "eval_metaworld.py"), "--policy", "expert", "--only", spec)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0],
                  f"--only {spec} is a one-line error: {lines}")
        r = run(sys.executable, os.path.join(SCRIPTS, "eval_metaworld.py"), "--policy", ckpt, "--tasks", "reach-v3",
                "--cameras", "corner,corner2", "--episodes", "1")
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and lines and lines[-1].startswith("error:") and "camera" in lines[-1],
              f"a camera list that disagrees with the checkpoint is a one-line error: {lines[-1] if lines else ''}")
        fake = os.path.join(tmp, "tokenizer.json")
        with open(fake, "w") as f:
            f.write("{}")
        r = run(sys.executable, os.path.join(SCRIPTS, "eval_metaworld.py"), "--policy", ckpt, "--tasks", "reach-v3",
                "--episodes", "1", "--tokenizer", fake)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and len(lines) == 1 and "reads instructions as UTF-8 bytes" in lines[0],
              f"--tokenizer for a bytes checkpoint is a one-line error: {lines}")


def plot_checks(tmp, run_dir):
    """scripts/plot_log.py on the 2-step run's log and on a log that a resume appended to."""
    from PIL import Image
    log = os.path.join(run_dir, "log.jsonl")
    resumed = os.path.join(tmp, "resumed.jsonl")
    lines = open(log).read().splitlines()
    with open(resumed, "w") as f:  # steps 1, 2, then 2 again (killed before its checkpoint), 3
        f.write("\n".join(lines + [lines[-1].replace('"loss": ', '"loss": 1') , lines[-1].replace('"step": 2', '"step": 3')])
                + "\n")
    png = os.path.join(tmp, "curves.png")
    r = run(sys.executable, os.path.join(SCRIPTS, "plot_log.py"), log, resumed, "--names", "straight,resumed", "-o", png)
    try:
        im = Image.open(png)
        size = im.size
        colours = len(set(im.convert("RGB").getdata()))
    except OSError:
        size, colours = (0, 0), 0
    check(r.returncode == 0 and size[0] >= 600 and size[1] >= 400 and colours > 20
          and "straight 2 steps, resumed 3 steps" in r.stdout,
          f"plot_log.py draws two runs into a PNG {size}, a repeated step counted once: {r.stdout.strip() or r.stderr.strip()}")
    r = run(sys.executable, os.path.join(SCRIPTS, "plot_log.py"), os.path.join(tmp, "nothing.jsonl"), "-o", png)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:") and "no such log" in lines[0],
          f"a missing log is a one-line error: {lines}")
    garbled = os.path.join(tmp, "garbled.jsonl")
    with open(garbled, "w") as f:
        f.write(open(log).read() + "step 3 loss 0.5\n")
    r = run(sys.executable, os.path.join(SCRIPTS, "plot_log.py"), garbled, "-o", png)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 1 and len(lines) == 1 and "line 3 is not a train_vla log line" in lines[0],
          f"a line that is not a log line is a one-line error naming it: {lines}")


if __name__ == "__main__":
    main()
    check.finish()
