"""
test_lerobot_dataset.py: a dataset LeRobot 0.6.1 writes itself, converted to shards and read back.

    build/lerobot-venv/bin/python tests/lerobot/test_lerobot_dataset.py

LeRobot's own LeRobotDataset.create (the venv's `dataset` extra) records a small dataset of two
cameras of different sizes (stored as images), state and action of different widths and three
episodes of two tasks, LeRobotDataset loads it back as any LeRobot user would, then
data/lerobot_to_shards.py converts it (under the project's build/venv, found by the repo id in
HF_LEROBOT_HOME, where LeRobot keeps datasets) and every frame of the shards is compared with
LeRobot's own frames: the pixels of each camera (--img 0 stores them as they are), state, action,
episode and task. Ends with `N passed, M failed`.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "data"))
from checks import Checks  # noqa: E402
import vla_shard  # noqa: E402

VENV_PY = os.path.join(ROOT, "build", "venv", "bin", "python")
REPO_ID = "train_vla_tests/two_cameras"
CAMERAS = {"observation.images.top": (24, 32), "observation.images.wrist": (20, 20)}
EPISODES = [(5, "pick the cube"), (7, "open the drawer"), (4, "pick the cube")]


def main():
    check = Checks()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    tmp = tempfile.mkdtemp()
    try:
        home = os.path.join(tmp, "lerobot_home")
        features = {name: {"dtype": "image", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
                    for name, (h, w) in CAMERAS.items()}
        features["observation.state"] = {"dtype": "float32", "shape": (3,), "names": ["x", "y", "z"]}
        features["action"] = {"dtype": "float32", "shape": (2,), "names": ["a", "b"]}
        rng = np.random.default_rng(5)
        ds = LeRobotDataset.create(REPO_ID, fps=10, features=features, root=os.path.join(home, REPO_ID),
                                   use_videos=False)
        for length, task in EPISODES:
            for _ in range(length):
                frame = {name: rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for name, (h, w) in CAMERAS.items()}
                frame["observation.state"] = rng.standard_normal(3).astype(np.float32)
                frame["action"] = rng.standard_normal(2).astype(np.float32)
                frame["task"] = task
                ds.add_frame(frame)
            ds.save_episode()
        ds.finalize()
        loaded = LeRobotDataset(REPO_ID, root=os.path.join(home, REPO_ID))
        n = sum(length for length, _ in EPISODES)
        check(len(loaded) == n and loaded.meta.total_episodes == len(EPISODES),
              f"LeRobot writes a dataset and loads it back: {len(loaded)} frames, {loaded.meta.total_episodes} episodes")

        out = os.path.join(tmp, "shards")
        env = dict(os.environ, HF_LEROBOT_HOME=home)
        r = subprocess.run([VENV_PY, os.path.join(ROOT, "data", "lerobot_to_shards.py"), REPO_ID, "-o", out,
                            "--img", "0"], capture_output=True, text=True, env=env)
        check(r.returncode == 0, f"data/lerobot_to_shards.py {REPO_ID} (found in HF_LEROBOT_HOME) converts it: exit "
              f"{r.returncode} {r.stderr.strip()[-300:]}")
        if r.returncode != 0:
            return check.finish()
        shards = vla_shard.Dataset(out)
        check(shards.n_samples == n and shards.n_cam == 2 and shards.state_dim == 3 and shards.action_dim == 2,
              f"the shards hold {shards.n_samples} frames, {shards.n_cam} cameras, state {shards.state_dim}, "
              f"action {shards.action_dim}")
        images = {k: [] for k in CAMERAS}
        state, action, episode, task = [], [], [], []
        for i in range(n):
            item = loaded[i]
            for k in CAMERAS:  # LeRobot's (3, H, W) floats in [0, 1]
                images[k].append(np.round(item[k].numpy().transpose(1, 2, 0) * 255).astype(np.uint8))
            state.append(item["observation.state"].numpy())
            action.append(item["action"].numpy())
            episode.append(int(item["episode_index"]))
            task.append(item["task"])
        got_images = {k: np.concatenate([s.camera_images(c) for s in shards.shards]) for c, k in enumerate(CAMERAS)}
        for k in CAMERAS:
            check(np.array_equal(got_images[k], np.stack(images[k])), f"{k}: every frame's pixels are LeRobot's")
        got_state = np.concatenate([s.state for s in shards.shards])
        got_action = np.concatenate([s.action for s in shards.shards])
        check(np.array_equal(got_state, np.stack(state)) and np.array_equal(got_action, np.stack(action)),
              "state and action of every frame are LeRobot's")
        got_tasks = []
        got_episodes = []
        for s in shards.shards:
            for f in range(s.n_frames):
                e = int(s.frame_episode[f])
                got_episodes.append(e)
                got_tasks.append(s.task(int(s.episodes[e]["task"])).decode())
        starts = np.flatnonzero(np.diff([-1] + episode)) if n else []
        check(len(set(got_episodes)) == len(EPISODES) and len(starts) == len(EPISODES),
              f"{len(EPISODES)} episodes, as LeRobot's episode_index has them")
        check(got_tasks == task, "each frame's task is LeRobot's")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check.finish()


if __name__ == "__main__":
    main()
