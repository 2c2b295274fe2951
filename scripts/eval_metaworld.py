"""
eval_metaworld.py: closed-loop success rate of a policy in Meta-World.

    build/venv/bin/python scripts/eval_metaworld.py --policy out/small/ckpt_00005000.bin --tasks MT10 --episodes 10
    build/venv/bin/python scripts/eval_metaworld.py --policy expert --tasks MT50 --episodes 5 --out expert.json
    build/venv/bin/python scripts/eval_metaworld.py --policy random --tasks easy --episodes 5

--policy is a train_vla checkpoint of any preset (tiny, small or smolvla; served by libvla.so
through scripts/vla_policy.py, `make libvla.so` first; with --device cuda by libvla_gpu.so on a
GPU, `make libvla_gpu.so`; a checkpoint trained on a tokenizer.json's ids, e.g. smolvla fine-tuned on
shards made with --tokenizer, needs --tokenizer with that file, its folder or its model's hub id), `expert`
(Meta-World's scripted policies: a sanity check that should succeed about always) or `random`
(uniform actions: should about never succeed). Every episode draws its layout from (--seed, task,
episode); the default seed 1000 differs from the data generator's, so evaluation layouts are not
the training ones. An episode runs up to --max-steps (500, Meta-World's horizon) and succeeds if
the task's success flag is ever set (it stops there). A checkpoint policy predicts a chunk of H
actions from each observation and the first --replan of them are executed before it looks again.
Cameras are rendered at --img pixels: the side the training data was generated at (data/metaworld_gen.py
--img; the model resizes any frame with padding to its own input, so by default they are rendered
at that input's side, which is the MT10 recipe's 64 for the small preset).
Results per task, per difficulty group (easy, medium, hard, very hard: the split of Seo et al.
2022, "Masked World Models") and overall are printed as a table and written as JSON with --out
(--scalars writes the rates alone, as the flat object of numbers `train_vla --eval-every` logs);
--video-dir saves GIFs of the episodes listed in --video-episodes. The JSON lists every episode with its
outcome, steps and layout seed; --only TASK:EPISODE replays chosen episodes exactly (same layout,
same noise), e.g. to film a failure alone. --workers runs episodes in parallel processes; every
episode's layout and noise depend only on (--seed, task, episode), so results do not depend on it.
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
    """Replans every `replan` steps from the current observation; executes the chunk in between.
    The starting noise of each prediction comes from the episode's noise seed and the prediction's
    number in the episode, so an episode replays alone exactly as it ran among the others."""

    def __init__(self, path, replan, device, threads=0, tokenizer=None):
        from vla_policy import VLAPolicy
        self.policy = VLAPolicy(path, threads=threads, device=device, tokenizer=tokenizer)
        self.replan = replan
        c = self.policy.config
        if not 1 <= replan <= c["chunk"]:
            sys.exit(f"error: --replan {replan} must be between 1 and the checkpoint's chunk {c['chunk']}")

    def reset(self, noise_seed):
        self.chunk, self.k, self.noise_seed, self.calls = None, 0, noise_seed, 0

    def act(self, scene, instruction):
        if self.chunk is None or self.k >= self.replan:
            images = [im[None] for im in scene.images()]  # one (1, img, img, 3) array per camera
            seed = (self.noise_seed + self.calls) % 2**64
            self.chunk = self.policy.act(images, [instruction], scene.state()[None], seed=seed)[0]
            self.calls += 1
            self.k = 0
        self.k += 1
        return self.chunk[self.k - 1]


class ExpertPolicy:
    def reset(self, noise_seed):
        pass

    def act(self, scene, instruction):
        return scene.expert_action()


class RandomPolicy:
    """Uniform actions in [-1, 1], drawn from the episode's noise seed."""

    def reset(self, noise_seed):
        self.rng = np.random.default_rng(noise_seed)

    def act(self, scene, instruction):
        return self.rng.uniform(-1.0, 1.0, 4).astype(np.float32)


def save_gif(path, frames):
    from PIL import Image
    images = [Image.fromarray(np.concatenate(list(f), axis=1)) for f in frames]  # cameras side by side
    images[0].save(path, save_all=True, append_images=images[1:], duration=40, loop=0)


def summarize(episodes, tasks, max_steps):
    """Per-task, per-group and overall success rates (groups and overall weight tasks equally).
    mean_steps is over the successful episodes only (None when there are none);
    mean_steps_all counts every failure as the horizon."""
    table = {}
    for task in tasks:
        r = [e for e in episodes if e["task"] == task]
        wins = [e["steps"] for e in r if e["success"]]
        table[task] = {"group": GROUP_OF[task], "episodes": len(r), "successes": len(wins),
                       "success_rate": len(wins) / len(r),
                       "mean_steps": float(np.mean(wins)) if wins else None,
                       "mean_steps_all": float(np.mean([e["steps"] if e["success"] else max_steps for e in r]))}
    groups = {}
    for group in DIFFICULTY:
        rows = [table[t] for t in tasks if GROUP_OF[t] == group]
        if rows:
            groups[group] = {"tasks": len(rows), "successes": sum(x["successes"] for x in rows),
                             "episodes": sum(x["episodes"] for x in rows),
                             "success_rate": float(np.mean([x["success_rate"] for x in rows]))}
    overall = {"tasks": len(tasks), "successes": sum(x["successes"] for x in table.values()),
               "episodes": sum(x["episodes"] for x in table.values()),
               "success_rate": float(np.mean([x["success_rate"] for x in table.values()]))}
    return table, groups, overall


def format_table(table, groups, overall):
    """The printed table: successes/episodes beside the rate, mean steps defined in the header."""
    lines = ["mean steps: steps to the success flag, averaged over the successful episodes only (- when none)",
             f"| {'task':<30} | {'group':<9} | {'successes':>9} | {'rate':>6} | {'mean steps':>10} |",
             f"|{'-' * 32}|{'-' * 11}|{'-' * 11}|{'-' * 8}|{'-' * 12}|"]
    for task, row in table.items():
        steps = f"{row['mean_steps']:10.1f}" if row["mean_steps"] is not None else f"{'-':>10}"
        lines.append(f"| {task:<30} | {row['group']:<9} | {row['successes']:>4}/{row['episodes']:<4} | "
                     f"{100 * row['success_rate']:5.1f}% | {steps} |")
    for group, row in groups.items():
        name = f"group {group} ({row['tasks']} task{'s' if row['tasks'] > 1 else ''})"
        lines.append(f"| {name:<30} | {'':<9} | {row['successes']:>4}/{row['episodes']:<4} | "
                     f"{100 * row['success_rate']:5.1f}% | {'':>10} |")
    lines.append(f"| {'mean over tasks':<30} | {'':<9} | {overall['successes']:>4}/{overall['episodes']:<4} | "
                 f"{100 * overall['success_rate']:5.1f}% | {'':>10} |")
    return "\n".join(lines)


# ---- episodes, run in this process or in a pool of workers

_state = {}  # per process: the policy and one Scene per task


def make_policy(args, threads):
    if args.policy == "expert":
        return ExpertPolicy()
    if args.policy == "random":
        return RandomPolicy()
    return CheckpointPolicy(args.policy, args.replan, args.device, threads, args.tokenizer)


def init_worker(args, img, state_kind, threads, policy=None):
    """policy: one already loaded in this process (else it is loaded here)"""
    warnings.filterwarnings("ignore")  # gymnasium's space checks
    _state.update(args=args, img=img, state_kind=state_kind, scenes={},
                  policy=policy or make_policy(args, threads))


def run_episode(job):
    """job: (task, episode number, film?) -> the episode's record."""
    from metaworld_gen import INSTRUCTIONS, Scene, episode_seed
    task, e, film = job
    args, policy = _state["args"], _state["policy"]
    if task not in _state["scenes"]:
        _state["scenes"][task] = Scene(task, _state["img"], args.cameras, _state["state_kind"])
    scene = _state["scenes"][task]
    task_index = list(INSTRUCTIONS).index(task)
    layout_seed = episode_seed(args.seed, task_index, e, 0)
    noise_seed = episode_seed(args.seed, task_index, e, 1)
    scene.reset(layout_seed)
    policy.reset(noise_seed)
    frames, success, steps = [], False, 0
    for steps in range(1, args.max_steps + 1):
        if film:
            frames.append(scene.images())
        if scene.step(policy.act(scene, INSTRUCTIONS[task])):
            success = True
            break
    video = None
    if frames:
        video = os.path.join(args.video_dir, f"{task}_ep{e:03d}_{'success' if success else 'fail'}.gif")
        save_gif(video, frames)
    return {"task": task, "episode": e, "layout_seed": layout_seed, "noise_seed": noise_seed, "success": success,
            "steps": steps, "video": video}


def parse_only(spec, tasks_known):
    """--only "task:3,task:7" -> [(task, 3), (task, 7)]"""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        task, _, ep = part.rpartition(":")
        if not task or not ep.isdigit():
            sys.exit(f"error: --only {part}: expected TASK:EPISODE, e.g. push-v3:7 (episode numbers as in the JSON)")
        if task not in tasks_known:
            sys.exit(f"error: --only {part}: unknown task {task}")
        out.append((task, int(ep)))
    return out


def settings_of(args):
    """The settings that apply to this policy, for the JSON."""
    keep = ["policy", "tasks", "episodes", "seed", "max_steps", "workers"]
    if args.only:
        keep.append("only")
    if args.policy not in ("expert", "random"):
        keep += ["replan", "device", "cameras", "img"] + (["tokenizer"] if args.tokenizer else [])
    if args.video_dir:
        keep += ["video_dir", "video_episodes", "cameras", "img"]
    return {k: getattr(args, k) for k in dict.fromkeys(keep)}


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
    ap.add_argument("--tokenizer", default=None,
                    help="the tokenizer.json (or its folder, or a model's hub id cached with it) of a checkpoint "
                         "trained on its ids (none: bytes)")
    ap.add_argument("--img", type=int, default=None,
                    help="rendered camera side: the training data's (a checkpoint: its model's input side; expert and "
                    "random: 64)")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes running episodes in parallel, one CPU thread each (1); results do not depend on it")
    ap.add_argument("--only", default="",
                    help="run just these episodes, TASK:EPISODE comma-separated (e.g. a failure from the JSON, to film it)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--scalars", help="write the success rates as one flat JSON object of numbers here "
                    "(success_rate, success_rate/<group>, success_rate/<task>: what train_vla --eval-every logs)")
    ap.add_argument("--video-dir", help="save GIFs of the episodes in --video-episodes (or all of --only) here")
    ap.add_argument("--video-episodes", default="0", help="episode numbers to film per task, comma-separated (0)")
    args = ap.parse_args()
    if args.episodes < 1 or args.max_steps < 1 or args.workers < 1:
        sys.exit("error: --episodes, --max-steps and --workers must be at least 1")
    if args.img is not None and not 1 <= args.img <= 4096:
        sys.exit(f"error: --img {args.img}: render cameras of 1 to 4096 pixels (the training data's side)")
    os.environ.setdefault("MUJOCO_GL", "egl")
    warnings.filterwarnings("ignore")  # gymnasium's space checks
    from console import end_progress, progress_line
    args.cameras = [c.strip() for c in args.cameras.split(",") if c.strip()]
    tasks = resolve_tasks(args.tasks)
    state_kind, img = "hand_gripper", args.img or 64
    threads = 1 if args.workers > 1 else 0
    loaded = None  # the checkpoint policy, loaded here to read its config (and used here with one worker)
    if args.policy not in ("expert", "random"):
        try:
            loaded = CheckpointPolicy(args.policy, args.replan, args.device, threads, args.tokenizer)
        except (ValueError, FileNotFoundError) as e:
            sys.exit(f"error: {e}")
        c = loaded.policy.config
        if c["n_cam"] != len(args.cameras):
            sys.exit(f"error: the checkpoint reads {c['n_cam']} camera(s) but --cameras names {len(args.cameras)}: "
                     "pass the cameras it was trained on")
        if c["state_dim"] not in (4, 39):
            sys.exit(f"error: the checkpoint's state_dim {c['state_dim']} is neither Meta-World's hand_gripper (4) "
                     "nor full (39) state")
        if c["action_dim"] != 4:
            sys.exit(f"error: the checkpoint's action_dim {c['action_dim']} is not Meta-World's 4: pass a checkpoint "
                     "trained on Meta-World data")
        state_kind, img = ("hand_gripper" if c["state_dim"] == 4 else "full"), args.img or c["img"]
        args.img = img
    if args.only:
        episodes = parse_only(args.only, GROUP_OF)
        tasks = list(dict.fromkeys(t for t, _ in episodes))
        film = set(episodes) if args.video_dir else set()
    else:
        episodes = [(t, e) for t in tasks for e in range(args.episodes)]
        film_eps = {int(e) for e in args.video_episodes.split(",") if e.strip()} if args.video_dir else set()
        film = {(t, e) for t, e in episodes if e in film_eps}
    if args.video_dir:
        os.makedirs(args.video_dir, exist_ok=True)
    jobs = [(t, e, (t, e) in film) for t, e in episodes]

    records, t0 = [], time.time()

    def report(rec):
        records.append(rec)
        done, elapsed = len(records), time.time() - t0
        eta = elapsed / done * (len(jobs) - done)
        wins = sum(r["success"] for r in records)
        progress_line(f"{done}/{len(jobs)} episodes, {wins} successes, {rec['task']} episode {rec['episode']}: "
                      f"{'success' if rec['success'] else 'failure'} in {rec['steps']} steps, "
                      f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s", done / len(jobs))

    if args.workers == 1:
        init_worker(args, img, state_kind, threads, loaded)
        for job in jobs:
            report(run_episode(job))
    else:
        if loaded is not None:
            loaded.policy.close()  # each worker loads its own
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # fresh GL contexts per worker
        with ctx.Pool(args.workers, initializer=init_worker, initargs=(args, img, state_kind, threads)) as pool:
            for rec in pool.imap(run_episode, jobs, chunksize=1):  # in job order: the JSON is the same for any count
                report(rec)
    end_progress()
    table, groups, overall = summarize(records, tasks, args.max_steps)
    print(f"policy {args.policy}: {len(tasks)} task(s), {len(jobs)} episode(s), seed {args.seed}, "
          f"horizon {args.max_steps}" + (f", replan every {args.replan}"
                                        if args.policy not in ("expert", "random") else ""))
    print(format_table(table, groups, overall))
    print(f"{time.time() - t0:.1f} s with {args.workers} worker(s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"policy": args.policy, "settings": settings_of(args), "tasks": table, "groups": groups,
                       "overall": overall, "episodes": records}, f, indent=2)
    if args.scalars:
        write_scalars(args.scalars, table, groups, overall)


def write_scalars(path, table, groups, overall):
    """The success rates as one flat JSON object of numbers (overall first, then by group and by task),
    written whole or not at all: what train_vla's --eval-every reads into log.jsonl and TensorBoard."""
    scalars = {"success_rate": overall["success_rate"]}
    scalars.update({f"success_rate/{name}": row["success_rate"] for name, row in groups.items()})
    scalars.update({f"success_rate/{task}": row["success_rate"] for task, row in table.items()})
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(scalars, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
