"""
test_eval.py: a one-episode closed-loop evaluation smoke test, with a checkpoint trained for two
steps on a tiny generated dataset, and the expert and random baselines through the same harness.
Run by `make test` with the data tools' Python (build/venv). Exits non-zero on any failure; the
last line is `N passed, M failed`.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "data"))
from checks import Checks  # noqa: E402

check = Checks()


def run(*cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True)


def evaluate(tmp, name, *args):
    out = os.path.join(tmp, name + ".json")
    r = run(sys.executable, os.path.join(HERE, "eval_metaworld.py"), "--tasks", "reach-v3", "--episodes", "1",
            "--out", out, *args)
    result = json.load(open(out)) if r.returncode == 0 and os.path.exists(out) else None
    return r, result


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data, run_dir = os.path.join(tmp, "data"), os.path.join(tmp, "run")
        r = run(sys.executable, os.path.join(ROOT, "data", "metaworld_gen.py"), "-o", data, "--tasks", "reach-v3",
                "--episodes", "1", "--img", "16", "--workers", "1")
        r2 = run(os.path.join(ROOT, "train_vla_cpu"), "-p", "tiny", "-i", data, "-n", "2", "-b", "2", "-t", "1",
                 "-o", run_dir)
        ckpt = os.path.join(run_dir, "ckpt_00000002.bin")
        check(r.returncode == 0 and r2.returncode == 0 and os.path.exists(ckpt), "a 2-step checkpoint on generated data")

        r, res = evaluate(tmp, "policy", "--policy", ckpt, "--max-steps", "20", "--replan", "4",
                          "--video-dir", os.path.join(tmp, "videos"))
        ok = res is not None and res["tasks"]["reach-v3"]["episodes"] == 1 and 0.0 <= res["overall"] <= 1.0
        check(ok, "the checkpoint policy runs one 20-step episode and writes JSON"
              + ("" if r.returncode == 0 else f": {r.stderr.strip()[-300:]}"))
        check(ok and "group easy" in r.stdout and "overall" in r.stdout, "the table has the task, its group and overall")
        videos = os.listdir(os.path.join(tmp, "videos")) if os.path.isdir(os.path.join(tmp, "videos")) else []
        check(len(videos) == 1 and videos[0].startswith("reach-v3_ep000") and videos[0].endswith(".gif"),
              f"a GIF of episode 0: {videos}")

        r, res = evaluate(tmp, "expert", "--policy", "expert")
        check(res is not None and res["overall"] == 1.0, "the scripted expert succeeds")
        r, res = evaluate(tmp, "random", "--policy", "random", "--max-steps", "50")
        check(res is not None and res["overall"] == 0.0, "random actions do not succeed in 50 steps")

        r = run(sys.executable, os.path.join(HERE, "eval_metaworld.py"), "--policy", ckpt, "--tasks", "reach-v3",
                "--cameras", "corner,corner2", "--episodes", "1")
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 1 and lines and lines[-1].startswith("error:") and "camera" in lines[-1],
              f"a camera list that disagrees with the checkpoint is a one-line error: {lines[-1] if lines else ''}")


if __name__ == "__main__":
    main()
    check.finish()
