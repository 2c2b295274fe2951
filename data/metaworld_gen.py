"""
metaworld_gen.py: Meta-World expert demonstrations as train_vla shards.

Runs Meta-World's scripted expert policy of each task (PyPI metaworld 3.x ships one for all 50),
renders headless with MuJoCo (MUJOCO_GL=egl or osmesa, CPU rendering through Mesa works), and
keeps only successful episodes, stopped a few steps after the success flag first rises.

    build/venv/bin/python data/metaworld_gen.py -o data/mt10 --tasks MT10 --episodes 50 --img 96
    build/venv/bin/python data/metaworld_gen.py -o /tmp/one --tasks reach-v3 --episodes 1 --img 32

Every episode gets its own random layout (object and goal positions) from a seed derived from
(--seed, task, episode, attempt), so the dataset does not depend on the number of workers.
A frame holds the images of each camera before the step, the state (hand xyz and gripper
opening, or the full 39-dim observation with --state full) and the 4-dim expert action
(xyz delta and gripper, clipped to [-1, 1] as the environment does).
Instructions are stored as byte tokens (tokenizer "bytes"), or with --tokenizer PATH as the ids of
a tokenizer.json (or of the model folder holding one, or of a model hub id's snapshot in the HF
cache), made as data/lerobot_to_shards.py makes them.
Shards are written aside and moved into the output folder once every episode is done: a failed
or interrupted run (one `error:` line, exit status 1) leaves the folder as it was, and removes
it if the run created it.
"""

import argparse
import multiprocessing
import os
import shutil
import signal
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from console import end_progress, progress_line  # noqa: E402
from vla_shard import load_tokenizer, outermost_missing, text_collision_warnings, write_shard  # noqa: E402

# Instructions for each task, written for this project. The robot is a Sawyer arm on a table.
INSTRUCTIONS = {
    "assembly-v3": "put the ring onto the peg",
    "basketball-v3": "dunk the ball into the basket",
    "bin-picking-v3": "move the cube from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button from the top behind the wall",
    "button-press-v3": "press the button from the front",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial",
    "disassemble-v3": "take the ring off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "turn the lock to lock the door",
    "door-open-v3": "open the door",
    "door-unlock-v3": "turn the lock to unlock the door",
    "hand-insert-v3": "put the hand into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet handle to open it",
    "faucet-close-v3": "turn the faucet handle to close it",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate sideways into the goal",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate back sideways out of the goal",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grab the stick and push the box with it",
    "stick-pull-v3": "grab the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "reach the goal position over the wall",
    "shelf-place-v3": "put the puck on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}

# Cameras whose images MuJoCo renders upside down in Meta-World's scene: turned 180 degrees.
FLIPPED_CAMERAS = {"corner", "corner2", "corner3", "corner4"}


def task_list(spec):
    import metaworld.env_dict as envs
    if spec == "MT10":
        return list(envs.MT10_V3.keys())
    if spec == "MT50":
        return list(envs.ALL_V3_ENVIRONMENTS.keys())
    names = [t.strip() for t in spec.split(",") if t.strip()]
    for n in names:
        if n not in envs.ALL_V3_ENVIRONMENTS:
            sys.exit(f"error: unknown Meta-World task '{n}': use MT10, MT50 or names like reach-v3,push-v3")
    return names


def expert_policy(task):
    """Meta-World's scripted expert for a task: Sawyer<CamelName>V3Policy."""
    import metaworld.policies as policies
    stem = task[:-len("-v3")]
    camel = "".join(part.capitalize() for part in stem.split("-"))
    camel = {"PegInsertSide": "PegInsertionSide"}.get(camel, camel)  # the one name that differs
    return getattr(policies, f"Sawyer{camel}V3Policy")()


def episode_seed(seed, task_index, episode, attempt):
    """A seed per (dataset seed, task, episode, attempt), independent of worker scheduling."""
    return int(np.random.SeedSequence([seed, task_index, episode, attempt]).generate_state(1)[0])


class Scene:
    """One Meta-World task ready to roll out: environment, renderer and scripted expert. Layouts
    (object and goal positions) come from the seed given to reset. Shared with the evaluator."""

    def __init__(self, task, img, cameras, state="hand_gripper", bench_seed=0):
        import metaworld
        import mujoco
        bench = metaworld.MT1(task, seed=bench_seed)
        self.env = bench.train_classes[task]()
        self.env.set_task(bench.train_tasks[0])  # required once; layouts then come from our seeds
        self.env._freeze_rand_vec = False
        self.env.seeded_rand_vec = True
        # a 1024 shadow map and no multisampling: 2x faster CPU rendering, still lit and shadowed
        self.env.model.vis.quality.shadowsize = 1024
        self.env.model.vis.quality.offsamples = 0
        self.renderer = mujoco.Renderer(self.env.model, img, img)
        self.task, self.cameras, self.state_kind = task, list(cameras), state
        self.policy = expert_policy(task)
        self.obs = None

    def reset(self, seed):
        self.env.seed(seed)
        self.obs, _ = self.env.reset()

    def images(self):
        """(n_cam, img, img, 3) u8 of the current state, corner cameras turned upright."""
        images = []
        for cam in self.cameras:
            self.renderer.update_scene(self.env.data, camera=cam)
            img = self.renderer.render()
            images.append(img[::-1, ::-1] if cam in FLIPPED_CAMERAS else img)
        return np.stack(images)

    def state(self):
        return np.asarray(self.obs[:4] if self.state_kind == "hand_gripper" else self.obs, np.float32)

    def expert_action(self):
        return np.clip(self.policy.get_action(self.obs), -1.0, 1.0).astype(np.float32)

    def step(self, action):
        """Applies a 4-dim action (clipped to [-1, 1]); returns the success flag after it."""
        self.obs, _, _, _, info = self.env.step(np.clip(action, -1.0, 1.0).astype(np.float32))
        return bool(info["success"])


class Worker:
    """One Scene per task, reused across episodes in this process."""

    def __init__(self, args):
        self.args, self.scene = args, None

    def episode(self, task, task_index, episode):
        """Runs attempts until one succeeds; returns (images, state, action, attempts)."""
        a = self.args
        if self.scene is None or self.scene.task != task:
            self.scene = Scene(task, a.img, a.cameras, a.state, a.seed)
        scene = self.scene
        for attempt in range(a.max_attempts):
            scene.reset(episode_seed(a.seed, task_index, episode, attempt))
            images, states, actions, success_at = [], [], [], None
            for step in range(a.max_steps):
                action = scene.expert_action()
                images.append(scene.images())
                states.append(scene.state())
                actions.append(action)
                success = scene.step(action)
                if success_at is None and success:
                    success_at = step
                if success_at is not None and step >= success_at + a.extra_steps:
                    break
            if success_at is not None:
                return np.stack(images), np.stack(states), np.stack(actions), attempt + 1
        raise RuntimeError(f"{task} episode {episode}: the expert failed {a.max_attempts} layout(s) in a row: "
                           "raise --max-steps or --max-attempts")


_worker = None


def ignore_interrupt():
    """Pool initializer: Ctrl-C is the main process's to handle (it ends the pool), so the
    workers print no tracebacks of their own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_job(job):
    global _worker
    if _worker is None:
        warnings.filterwarnings("ignore")  # gymnasium's space checks: noise on the progress bar
        _worker = Worker(job[0])
    _, task, task_index, episode = job
    return (task_index, episode) + _worker.episode(task, task_index, episode)


def progress(done, total, frames, t0):
    elapsed = time.time() - t0
    eta = elapsed / done * (total - done) if done else 0.0
    line = (f"{done}/{total} episodes, {frames} frames, {frames / max(elapsed, 1e-9):.0f} frames/s, "
            f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s")
    progress_line(line, done / total)


class ShardWriter:
    """Collects episodes in order and writes a shard whenever --frames-per-shard is reached."""

    def __init__(self, out, name, limit, tokenizer):
        self.out, self.name, self.limit, self.count, self.tokenizer = out, name, limit, 0, tokenizer
        self.episodes, self.frames, self.paths = [], 0, []

    def add(self, task, images, state, action):
        self.episodes.append((task, images, state, action))
        self.frames += len(action)
        if self.frames >= self.limit:
            self.flush()

    def flush(self):
        if not self.episodes:
            return
        tasks = sorted({e[0] for e in self.episodes}, key=list(INSTRUCTIONS).index)
        table, first = [], 0
        for task, _, _, action in self.episodes:
            table.append((first, len(action), tasks.index(task)))
            first += len(action)
        path = os.path.join(self.out, f"{self.name}_{self.count:03d}.bin")
        write_shard(path, np.concatenate([e[1] for e in self.episodes]), np.concatenate([e[2] for e in self.episodes]),
                    np.concatenate([e[3] for e in self.episodes]), table, [INSTRUCTIONS[t] for t in tasks],
                    tokenizer=self.tokenizer)
        self.paths.append(path)
        self.count += 1
        self.episodes, self.frames = [], 0


def main():
    ap = argparse.ArgumentParser(description="Meta-World expert demonstrations as train_vla shards")
    ap.add_argument("-o", "--output", required=True, help="output folder for the shards")
    ap.add_argument("--tasks", default="MT10", help="MT10, MT50 or task names, comma-separated (MT10)")
    ap.add_argument("--episodes", type=int, default=50, help="successful episodes per task (50)")
    ap.add_argument("--img", type=int, default=96, help="square image side in pixels (96)")
    ap.add_argument("--cameras", default="corner", help="MuJoCo cameras, comma-separated, e.g. corner,corner2 (corner)")
    ap.add_argument("--state", choices=["hand_gripper", "full"], default="hand_gripper",
                    help="hand xyz + gripper opening (4 dims) or the full 39-dim observation (hand_gripper)")
    ap.add_argument("--extra-steps", type=int, default=5, help="steps kept after the first success (5)")
    ap.add_argument("--max-steps", type=int, default=500, help="episode horizon (500)")
    ap.add_argument("--max-attempts", type=int, default=5, help="layouts tried per episode before giving up (5)")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="worker processes (all cores)")
    ap.add_argument("--seed", type=int, default=0, help="dataset seed (0)")
    ap.add_argument("--frames-per-shard", type=int, default=20000, help="frames per shard file (20000)")
    ap.add_argument("--name", default="metaworld", help="shard file name prefix (metaworld)")
    ap.add_argument("--tokenizer", default=None,
                    help="token ids of this tokenizer.json, or of the one in this model folder (or in the HF cache's "
                         "snapshot of this model hub id), made as LeRobot's SmolVLA pre-processor makes them "
                         "(default: bytes, the UTF-8 bytes)")
    args = ap.parse_args()
    args.cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
    if args.episodes < 1 or args.img < 8 or args.workers < 1 or not args.cameras:
        sys.exit("error: --episodes and --workers must be at least 1, --img at least 8, and --cameras non-empty")
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import metaworld  # noqa: F401
        import mujoco  # noqa: F401
    except ImportError as e:
        sys.exit(f"error: {e}: install the data tools' packages with `make setup`")
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except ValueError as e:
        sys.exit(f"error: --tokenizer: {e}")
    tasks = task_list(args.tasks)
    for line in text_collision_warnings([INSTRUCTIONS[t] for t in tasks], tokenizer):
        sys.stderr.write(line + "\n")

    created = outermost_missing(args.output)  # what the run makes, so what a failure removes
    finished = False
    try:
        generate(args, tasks, tokenizer)
        finished = True
    except RuntimeError as e:  # the expert failed every layout of an episode
        error_exit(str(e))
    except KeyboardInterrupt:
        error_exit("interrupted: the output folder is as it was, run the generator again")
    except OSError as e:
        error_exit(f"{e}: check the -o path and the free disk space")
    except Exception as e:  # e.g. MuJoCo cannot render: still one line, no traceback
        msg = str(e).splitlines()[0] if str(e) else ""
        error_exit(f"unexpected {type(e).__name__}: {msg}: if MuJoCo cannot render, run `make setup` (Mesa's EGL) "
                   "or try MUJOCO_GL=osmesa; otherwise please report it")
    finally:
        if not finished and created is not None:
            shutil.rmtree(created, ignore_errors=True)


def generate(args, tasks, tokenizer):
    """Runs the episodes and writes the shards. They are written to a staging folder and moved into
    the output folder once every episode succeeded: a failed run leaves the output folder as it was."""
    staging = os.path.join(args.output, f".{args.name}.generating")
    shutil.rmtree(staging, ignore_errors=True)
    jobs = [(args, task, list(INSTRUCTIONS).index(task), e) for task in tasks for e in range(args.episodes)]
    writer = ShardWriter(staging, args.name, args.frames_per_shard, tokenizer)
    t0, frames, attempts = time.time(), 0, 0
    ctx = multiprocessing.get_context("spawn")  # fresh GL contexts per worker
    try:
        os.makedirs(staging)
        with ctx.Pool(min(args.workers, len(jobs)), initializer=ignore_interrupt) as pool:
            results = pool.imap(run_job, jobs, chunksize=1)  # in order: the same shards whatever the worker count
            for done, (task_index, _, images, state, action, tries) in enumerate(results, 1):
                writer.add(list(INSTRUCTIONS)[task_index], images, state, action)
                frames += len(action)
                attempts += tries
                progress(done, len(jobs), frames, t0)
        writer.flush()
        shards = []
        for p in writer.paths:
            shards.append(os.path.join(args.output, os.path.basename(p)))
            os.replace(p, shards[-1])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    elapsed = time.time() - t0
    end_progress()
    print(f"wrote {len(shards)} shard(s) to {args.output}: {len(jobs)} episodes of {len(tasks)} task(s), "
          f"{frames} frames, {len(args.cameras)} camera(s) at {args.img}px; {attempts - len(jobs)} failed layouts "
          f"retried; {elapsed:.1f} s, {frames / elapsed:.1f} frames/s")


def error_exit(msg):
    end_progress()  # the error goes on a line of its own
    sys.stderr.write(f"error: {msg}\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
