"""
eval_metaworld.py: closed-loop success rate of a policy in Meta-World.

    build/venv/bin/python scripts/eval_metaworld.py --policy out/ckpt_00005000.bin --tasks MT10 --episodes 10
    build/venv/bin/python scripts/eval_metaworld.py --policy expert --tasks MT50 --episodes 5 --out expert.json
    build/venv/bin/python scripts/eval_metaworld.py --policy random --tasks easy --episodes 5

--policy is a train_vla checkpoint (served by libvla.so through scripts/vla_policy.py; `make
libvla.so` first; with --device cuda by libvla_gpu.so on a GPU, `make libvla_gpu.so`), `expert`
(Meta-World's scripted policies: a sanity check that should succeed about always) or `random`
(uniform actions: should about never succeed). Every episode draws its layout from (--seed, task,
episode); the default seed 1000 differs from the data generator's, so evaluation layouts are not
the training ones. An episode runs up to --max-steps (500, Meta-World's horizon) and succeeds if
the task's success flag is ever set (it stops there). A checkpoint policy predicts a chunk of H
actions from each observation and the first --replan of them are executed before it looks again.
Results per task, per difficulty group (easy, medium, hard, very hard: the split of Seo et al.
2022, "Masked World Models") and overall are printed as a table and written as JSON with --out;
--video-dir saves GIFs of the episodes listed in --video-episodes.
"""

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "data"))

DIFFICULTY = {
    "easy": ["button-press-v3", "button-press-topdown-v3", "button-press-topdown-wall-v3", "button-press-wall-v3",
             "coffee-button-v3", "dial-turn-v3", "door-close-v3", "door-lock-v3", "door-open-v3", "door-unlock-v3",
             "drawer-close-v3", "drawer-open-v3", "faucet-close-v3", "faucet-open-v3", "handle-press-v3",
             "handle-press-side-v3", "handle-pull-v3", "handle-pull-side-v3", "lever-pull-v3", "plate-slide-v3",
             "plate-slide-back-v3", "plate-slide-back-side-v3", "plate-slide-side-v3", "reach-v3", "reach-wall-v3",
             "window-close-v3", "window-open-v3", "peg-unplug-side-v3"],
    "medium": ["basketball-v3", "bin-picking-v3", "box-close-v3", "coffee-pull-v3", "coffee-push-v3", "hammer-v3",
               "peg-insert-side-v3", "push-wall-v3", "soccer-v3", "sweep-v3", "sweep-into-v3"],
    "hard": ["assembly-v3", "hand-insert-v3", "pick-out-of-hole-v3", "pick-place-v3", "push-v3", "push-back-v3"],
    "very_hard": ["shelf-place-v3", "disassemble-v3", "stick-pull-v3", "stick-push-v3", "pick-place-wall-v3"],
}
GROUP_OF = {task: group for group, tasks in DIFFICULTY.items() for task in tasks}


def resolve_tasks(spec):
    from metaworld_gen import task_list
    out = []
    for part in spec.split(","):
        part = part.strip()
        out += DIFFICULTY[part] if part in DIFFICULTY else task_list(part)
    return out


class CheckpointPolicy:
    """Replans every `replan` steps from the current observation; executes the chunk in between."""

    def __init__(self, path, replan, seed, device):
        from vla_policy import VLAPolicy
        self.policy = VLAPolicy(path, device=device)
        self.replan, self.seed, self.calls = replan, seed, 0
        c = self.policy.config
        if not 1 <= replan <= c["chunk"]:
            sys.exit(f"error: --replan {replan} must be between 1 and the checkpoint's chunk {c['chunk']}")

    def reset(self):
        self.chunk, self.k = None, 0

    def act(self, scene, instruction):
        if self.chunk is None or self.k >= self.replan:
            images = scene.images()[None]
            self.chunk = self.policy.act(images, [instruction], scene.state()[None], seed=self.seed + self.calls)[0]
            self.calls += 1
            self.k = 0
        self.k += 1
        return self.chunk[self.k - 1]


class ExpertPolicy:
    def reset(self):
        pass

    def act(self, scene, instruction):
        return scene.expert_action()


class RandomPolicy:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def reset(self):
        pass

    def act(self, scene, instruction):
        return self.rng.uniform(-1.0, 1.0, 4).astype(np.float32)


def save_gif(path, frames):
    from PIL import Image
    images = [Image.fromarray(np.concatenate(list(f), axis=1)) for f in frames]  # cameras side by side
    images[0].save(path, save_all=True, append_images=images[1:], duration=40, loop=0)


def summarize(results, tasks):
    """Per-task, per-group and overall success rates (groups and overall weight tasks equally)."""
    table = {}
    for task in tasks:
        r = results[task]
        table[task] = {"group": GROUP_OF[task], "episodes": len(r), "successes": int(sum(s for s, _ in r)),
                       "success_rate": float(np.mean([s for s, _ in r])),
                       "mean_steps": float(np.mean([n for _, n in r]))}
    groups = {}
    for group in DIFFICULTY:
        rates = [table[t]["success_rate"] for t in tasks if GROUP_OF[t] == group]
        if rates:
            groups[group] = {"tasks": len(rates), "success_rate": float(np.mean(rates))}
    overall = float(np.mean([table[t]["success_rate"] for t in tasks]))
    return table, groups, overall


def main():
    ap = argparse.ArgumentParser(description="closed-loop Meta-World success rate of a policy")
    ap.add_argument("--policy", required=True, help="a train_vla checkpoint, `expert` or `random`")
    ap.add_argument("--tasks", default="MT10", help="MT10, MT50, easy/medium/hard/very_hard, or task names (MT10)")
    ap.add_argument("--episodes", type=int, default=10, help="episodes per task (10)")
    ap.add_argument("--seed", type=int, default=1000, help="layout and noise seed (1000; the generator's default is 0)")
    ap.add_argument("--max-steps", type=int, default=500, help="episode horizon (500)")
    ap.add_argument("--replan", type=int, default=8, help="actions executed from each predicted chunk (8)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where a checkpoint policy runs (cpu)")
    ap.add_argument("--cameras", default="corner", help="cameras the checkpoint was trained on, in order (corner)")
    ap.add_argument("--img", type=int, default=64, help="image side for expert/random videos (64; a checkpoint sets its own)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--video-dir", help="save GIFs of the episodes in --video-episodes here")
    ap.add_argument("--video-episodes", default="0", help="episode numbers to film per task, comma-separated (0)")
    args = ap.parse_args()
    if args.episodes < 1 or args.max_steps < 1:
        sys.exit("error: --episodes and --max-steps must be at least 1")
    os.environ.setdefault("MUJOCO_GL", "egl")
    warnings.filterwarnings("ignore")  # gymnasium's space checks
    from metaworld_gen import INSTRUCTIONS, Scene, episode_seed
    cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
    tasks = resolve_tasks(args.tasks)
    state_kind, img = "hand_gripper", args.img
    if args.policy == "expert":
        policy = ExpertPolicy()
    elif args.policy == "random":
        policy = RandomPolicy(args.seed)
    else:
        try:
            policy = CheckpointPolicy(args.policy, args.replan, args.seed, args.device)
        except (ValueError, FileNotFoundError) as e:
            sys.exit(f"error: {e}")
        c = policy.policy.config
        if c["n_cam"] != len(cameras):
            sys.exit(f"error: the checkpoint reads {c['n_cam']} camera(s) but --cameras names {len(cameras)}: "
                     "pass the cameras it was trained on")
        if c["state_dim"] not in (4, 39):
            sys.exit(f"error: the checkpoint's state_dim {c['state_dim']} is neither Meta-World's hand_gripper (4) "
                     "nor full (39) state")
        state_kind, img = ("hand_gripper" if c["state_dim"] == 4 else "full"), c["img"]
    film = {int(e) for e in args.video_episodes.split(",") if e.strip()} if args.video_dir else set()
    if args.video_dir:
        os.makedirs(args.video_dir, exist_ok=True)

    results, total, done, t0 = {}, len(tasks) * args.episodes, 0, time.time()
    for task in tasks:
        scene = Scene(task, img, cameras, state_kind)
        task_index = list(INSTRUCTIONS).index(task)
        results[task] = []
        for e in range(args.episodes):
            scene.reset(episode_seed(args.seed, task_index, e, 0))
            policy.reset()
            frames, success, steps = [], False, 0
            for steps in range(1, args.max_steps + 1):
                if e in film:
                    frames.append(scene.images())
                if scene.step(policy.act(scene, INSTRUCTIONS[task])):
                    success = True
                    break
            results[task].append((success, steps))
            if frames:
                save_gif(os.path.join(args.video_dir, f"{task}_ep{e:03d}_{'success' if success else 'fail'}.gif"), frames)
            done += 1
            elapsed = time.time() - t0
            eta = elapsed / done * (total - done)
            wins = sum(s for r in results.values() for s, _ in r)
            sys.stderr.write(f"\r[{'#' * int(30 * done / total):<30}] {done}/{total} episodes, {wins} successes, "
                             f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s ")
            sys.stderr.flush()
    sys.stderr.write("\n")
    table, groups, overall = summarize(results, tasks)
    print(f"policy {args.policy}: {len(tasks)} task(s) x {args.episodes} episode(s), seed {args.seed}, "
          f"horizon {args.max_steps}" + (f", replan every {args.replan}" if isinstance(policy, CheckpointPolicy) else ""))
    print(f"| {'task':<30} | {'group':<9} | success | mean steps |")
    for task, row in table.items():
        print(f"| {task:<30} | {row['group']:<9} | {100 * row['success_rate']:6.1f}% | {row['mean_steps']:10.1f} |")
    for group, row in groups.items():
        print(f"| {'group ' + group + ' (' + str(row['tasks']) + ' tasks)':<30} | {'':<9} | {100 * row['success_rate']:6.1f}% | {'':>10} |")
    print(f"| {'overall':<30} | {'':<9} | {100 * overall:6.1f}% | {'':>10} |")
    print(f"{time.time() - t0:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"policy": args.policy, "tasks": table, "groups": groups, "overall": overall,
                       "settings": {k: v for k, v in vars(args).items()}}, f, indent=2)


if __name__ == "__main__":
    main()
