"""
test_hub_cache.py: data/hub_cache.py, hub ids (lerobot/pusht, lerobot/smolvla_base) as the
folders LeRobot and huggingface_hub downloaded them to, on fake caches built here, and the tools
that take hub ids, run as a user runs them.

    build/venv/bin/python tests/data/test_hub_cache.py

Fake caches in a temporary folder: models--ORG--NAME and datasets--ORG--NAME repositories with
refs/ and snapshots/<commit>/ (config.json, tokenizer.json, meta/info.json), LeRobot dataset roots
<home>/ORG/NAME. Checked: where each environment variable moves the lookup (HF_HUB_CACHE,
HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HF_LEROBOT_HOME, none but HOME) and which wins;
~ and $VARS; the snapshot order (refs/main's first, one lacking the needed file passed over); an
existing path always winning; the one not-found line (the id, every folder looked at, the download
command); the folders themselves against huggingface_hub's and LeRobot's own constants under the
same environments (huggingface_hub of this Python; LeRobot's constants.py through $LEROBOT_PY,
default build/lerobot-venv/bin/python). End to end: data/lerobot_to_shards.py converts a tiny
dataset named by its hub id (from HF_LEROBOT_HOME) with a tokenizer named by its hub id (from
HF_HUB_CACHE) and refuses a missing id in one line; VLAPolicy's tokenizer= takes a hub id;
scripts/import_lerobot.py (under this Python, the project's build/venv) reads a policy's hub id from
the HF cache and names the download of a missing policy and of a missing VLM.
Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")  # the tools under test
sys.path.insert(0, DATA)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hub_cache  # noqa: E402
import vla_shard  # noqa: E402
from checks import Checks  # noqa: E402

check = Checks()
CONVERTER = os.path.join(DATA, "lerobot_to_shards.py")
IMPORTER = os.path.join(ROOT, "scripts", "import_lerobot.py")
LEROBOT_PY = os.environ.get("LEROBOT_PY", os.path.join(ROOT, "build", "lerobot-venv", "bin", "python"))
# every variable that moves a cache, cleared before each case: only what a case sets counts
CACHE_VARS = ["HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_LEROBOT_HOME", "LEROBOT_HOME"]
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


# ----------------------------------------------------------------------------
# fake caches


def write(path, text=""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def snapshot(cache, kind, repo_id, commit=COMMIT_A, files=("config.json",), ref="main"):
    """A repository of a hub cache with one snapshot holding `files` (refs/<ref> names it)."""
    repo = os.path.join(cache, f"{kind}s--" + repo_id.replace("/", "--"))
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(snap, exist_ok=True)
    for name in files:
        write(os.path.join(snap, name), "{}")
    if ref:
        write(os.path.join(repo, "refs", ref), commit)
    return snap


def dataset_root(home, repo_id):
    """A LeRobot dataset root, as LeRobotDataset's root=<home>/<repo_id> holds one."""
    root = os.path.join(home, repo_id)
    write(os.path.join(root, "meta", "info.json"), "{}")
    return root


@contextlib.contextmanager
def environment(home, **values):
    """The cache variables cleared, HOME=home, then values set; all put back afterwards."""
    saved = {k: os.environ.get(k) for k in CACHE_VARS + ["HOME"] + list(values)}
    for k in CACHE_VARS:
        os.environ.pop(k, None)
    os.environ["HOME"] = home
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def resolve(arg, kind, need):
    """hub_cache.local_folder, or the NotFound's line prefixed by NOT FOUND."""
    try:
        return hub_cache.local_folder(arg, kind, need)
    except hub_cache.NotFound as e:
        return f"NOT FOUND {e}"


def model(arg="org/model"):
    return resolve(arg, "model", "config.json")


def dataset(arg="org/data"):
    return resolve(arg, "dataset", os.path.join("meta", "info.json"))


# ----------------------------------------------------------------------------
# the lookup


def check_variables(tmp):
    """Each variable moves the lookup where huggingface_hub and LeRobot move theirs."""
    home = os.path.join(tmp, "home")
    hf = os.path.join(home, ".cache", "huggingface")
    snap = snapshot(os.path.join(hf, "hub"), "model", "org/model")
    root = dataset_root(os.path.join(hf, "lerobot"), "org/data")
    with environment(home):
        check(model() == snap, f"no variable: a model in ~/.cache/huggingface/hub ({model()})")
        check(dataset() == root, f"no variable: a dataset in ~/.cache/huggingface/lerobot/<repo_id> ({dataset()})")

    xdg = os.path.join(tmp, "xdg")
    snap = snapshot(os.path.join(xdg, "huggingface", "hub"), "model", "org/model")
    root = dataset_root(os.path.join(xdg, "huggingface", "lerobot"), "org/data")
    with environment(home, XDG_CACHE_HOME=xdg):
        check(model() == snap and dataset() == root,
              f"XDG_CACHE_HOME: $XDG_CACHE_HOME/huggingface/hub and .../lerobot win over ~/.cache ({model()}, "
              f"{dataset()})")

    hf_home = os.path.join(tmp, "hf_home")
    snap = snapshot(os.path.join(hf_home, "hub"), "model", "org/model")
    root = dataset_root(os.path.join(hf_home, "lerobot"), "org/data")
    with environment(home, XDG_CACHE_HOME=xdg, HF_HOME=hf_home):
        check(model() == snap and dataset() == root,
              f"HF_HOME: $HF_HOME/hub and $HF_HOME/lerobot win over XDG_CACHE_HOME ({model()}, {dataset()})")

    legacy = os.path.join(tmp, "legacy_hub")
    snap = snapshot(legacy, "model", "org/model")
    with environment(home, HF_HOME=hf_home, HUGGINGFACE_HUB_CACHE=legacy):
        check(model() == snap, f"HUGGINGFACE_HUB_CACHE (the old name) wins over $HF_HOME/hub ({model()})")

    hub = os.path.join(tmp, "hub_cache")
    snap = snapshot(hub, "model", "org/model")
    with environment(home, HF_HOME=hf_home, HUGGINGFACE_HUB_CACHE=legacy, HF_HUB_CACHE=hub):
        check(model() == snap, f"HF_HUB_CACHE wins over HUGGINGFACE_HUB_CACHE and HF_HOME ({model()})")
        check(dataset() == os.path.join(hf_home, "lerobot", "org/data"),
              f"HF_HUB_CACHE leaves LeRobot's home at $HF_HOME/lerobot ({dataset()})")

    lerobot = os.path.join(tmp, "lerobot_home")
    root = dataset_root(lerobot, "org/data")
    with environment(home, HF_HOME=hf_home, HF_LEROBOT_HOME=lerobot):
        check(dataset() == root, f"HF_LEROBOT_HOME wins over $HF_HOME/lerobot ({dataset()})")
        check(model() == os.path.join(hf_home, "hub", "models--org--model", "snapshots", COMMIT_A),
              f"HF_LEROBOT_HOME leaves models in the hub cache ({model()})")

    with environment(home, HF_HUB_CACHE="~/tilde_hub", SOME_ROOT=tmp, HF_HOME="$SOME_ROOT/var_home"):
        check(hub_cache.hub_cache() == os.path.join(home, "tilde_hub") and
              hub_cache.hf_home() == os.path.join(tmp, "var_home"),
              f"~ and $VARS are expanded ({hub_cache.hub_cache()}, {hub_cache.hf_home()})")
    with environment(home, HF_LEROBOT_HOME="~/lr"):
        check(hub_cache.lerobot_home() == os.path.join(home, "lr"), f"HF_LEROBOT_HOME's ~ is expanded "
              f"({hub_cache.lerobot_home()})")


def check_datasets(tmp):
    """A dataset: LeRobot's root first, then LeRobot's own snapshots (by version tag), then the hub
    cache's datasets--."""
    home, lerobot, hub = (os.path.join(tmp, n) for n in ("home", "lr", "hub"))
    need = [os.path.join("meta", "info.json")]
    in_hub = snapshot(hub, "dataset", "org/data", COMMIT_A, need)
    with environment(home, HF_LEROBOT_HOME=lerobot, HF_HUB_CACHE=hub):
        check(dataset() == in_hub, f"a dataset only in the hub cache: its datasets--org--data snapshot ({dataset()})")
        in_lerobot_hub = snapshot(os.path.join(lerobot, "hub"), "dataset", "org/data", COMMIT_B, need, ref="v3.0")
        check(dataset() == in_lerobot_hub, f"LeRobot's snapshot (refs/v3.0) wins over the hub cache's ({dataset()})")
        root = dataset_root(lerobot, "org/data")
        check(dataset() == root, f"the dataset's root <home>/<repo_id> wins over every snapshot ({dataset()})")
        check(model("org/data").startswith("NOT FOUND"), "a dataset is not a model: models--org--data is looked for")


def check_snapshots(tmp):
    """refs/main's snapshot first, then the others; one without the needed file is passed over."""
    home, hub = os.path.join(tmp, "home"), os.path.join(tmp, "hub")
    main = snapshot(hub, "model", "org/model", COMMIT_B, ("config.json",))
    other = snapshot(hub, "model", "org/model", COMMIT_A, ("config.json", "tokenizer.json"), ref="1.0")
    with environment(home, HF_HUB_CACHE=hub):
        check(model() == main, f"refs/main's snapshot wins over an earlier name and an earlier ref, 1.0 ({model()})")
        got = resolve("org/model", "model", "tokenizer.json")
        check(got == other, f"a snapshot without tokenizer.json is passed over for one with it ({got})")
        write(os.path.join(hub, "models--org--model", "refs", "main"), "c" * 40)  # a commit not on disk
        check(model() == other, f"refs/main naming a missing snapshot: the others by name ({model()})")


def check_paths(tmp):
    """An existing path is the path; what is no hub id is left as it is for the tool's messages."""
    home, hub = os.path.join(tmp, "home"), os.path.join(tmp, "hub")
    snapshot(hub, "model", "org/model")
    here = os.path.join(tmp, "here")
    os.makedirs(os.path.join(here, "org", "model"))  # (without config.json: the path still wins)
    cwd = os.getcwd()
    os.chdir(here)
    try:
        with environment(home, HF_HUB_CACHE=hub):
            check(model() == "org/model", f"a folder org/model here wins over the cached org/model ({model()})")
            for arg in ("./org/missing", "/nowhere/org/model", "~/org/model", "a/b/c", "org/", "org--x/y", "../up",
                        ".hidden/x", "org/name.git", "-org/name", "org/name-", "", "x" * 97):
                check(model(arg) == arg, f"{arg!r} is no hub id: passed on as it is ({model(arg)})")
            for arg in ("lerobot/pusht", "pusht", "google/paligemma-3b-pt-224", "HuggingFaceTB/SmolVLM2-500M",
                        "a/b", "x" * 96 + "/" + "y" * 96):
                check(hub_cache.is_hub_id(arg), f"{arg!r} reads as a hub id")
    finally:
        os.chdir(cwd)


def check_not_found(tmp):
    """The one line: the id, every folder looked at, the download command, nothing downloaded."""
    home, lerobot, hub = (os.path.join(tmp, n) for n in ("home", "lr", "hub"))
    bare = snapshot(hub, "model", "org/bare", files=())  # a snapshot without config.json
    with environment(home, HF_LEROBOT_HOME=lerobot, HF_HUB_CACHE=hub):
        line = dataset("org/absent")
        looked = [os.path.join(lerobot, "org/absent"), os.path.join(lerobot, "hub", "datasets--org--absent"),
                  os.path.join(hub, "datasets--org--absent")]
        check(line.startswith("NOT FOUND org/absent ") and "\n" not in line and all(p in line for p in looked),
              f"a missing dataset: one line naming the id and the 3 folders looked at: {line}")
        command = "hf download org/absent --repo-type dataset"
        check(f"`{command}`" in line and "LeRobotDataset(\"org/absent\")" in line,
              f"... and the download: `{command}`, or a LeRobotDataset load")
        line = model("org/bare")
        check(bare in line and "none holds config.json" in line and "`hf download org/bare`" in line,
              f"a model whose snapshot lacks config.json: names the snapshot and `hf download org/bare`: {line}")
        check(not os.path.exists(os.path.join(lerobot, "org")) and sorted(os.listdir(hub)) == ["models--org--bare"],
              "nothing is created in the caches")
    with environment(home, LEROBOT_HOME=lerobot):
        line = dataset()
        check(line.startswith("NOT FOUND") and "HF_LEROBOT_HOME" in line,
              f"LEROBOT_HOME, which LeRobot refuses, is refused for a dataset: {line}")


def library_folders(python, code, env):
    """The JSON that `code` prints under `python` in the environment env, or None."""
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    except OSError:
        return None
    return json.loads(r.stdout) if r.returncode == 0 else None


HF_CODE = """
import json, sys
sys.path.insert(0, %r)
import hub_cache
import huggingface_hub.constants as c
print(json.dumps({"theirs": [c.HF_HOME, c.HF_HUB_CACHE], "ours": [hub_cache.hf_home(), hub_cache.hub_cache()]}))
""" % DATA
# LeRobot's constants.py alone (its package's __init__ imports much more), as LeRobot reads it
LEROBOT_CODE = """
import importlib.util, json, os, sys
sys.path.insert(0, %r)
import hub_cache
origin = os.path.dirname(importlib.util.find_spec("lerobot").origin)
spec = importlib.util.spec_from_file_location("lerobot_constants", os.path.join(origin, "utils", "constants.py"))
constants = importlib.util.module_from_spec(spec)
spec.loader.exec_module(constants)
print(json.dumps({"theirs": [str(constants.HF_LEROBOT_HOME)], "ours": [hub_cache.lerobot_home()]}))
""" % DATA


def check_against_libraries(tmp):
    """The folders against huggingface_hub's and LeRobot's own constants, environment by environment."""
    home = os.path.join(tmp, "home")
    cases = [("no variable", {}), ("XDG_CACHE_HOME", {"XDG_CACHE_HOME": os.path.join(tmp, "xdg")}),
             ("HF_HOME with ~", {"XDG_CACHE_HOME": os.path.join(tmp, "xdg"), "HF_HOME": "~/hf"}),
             ("HUGGINGFACE_HUB_CACHE", {"HF_HOME": os.path.join(tmp, "h"), "HUGGINGFACE_HUB_CACHE": "~/old"}),
             ("HF_HUB_CACHE with $VAR", {"HUGGINGFACE_HUB_CACHE": "/old", "HF_HUB_CACHE": "$ROOTVAR/hub",
                                         "ROOTVAR": tmp}),
             ("HF_LEROBOT_HOME with ~", {"HF_HOME": os.path.join(tmp, "h"), "HF_LEROBOT_HOME": "~/lr"}),
             ("HF_HOME empty", {"HF_HOME": ""})]
    for label, values in cases:
        env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
        env.update(values, HOME=home)
        got = library_folders(sys.executable, HF_CODE, env)
        check(got is not None and got["theirs"] == got["ours"],
              f"{label}: HF_HOME and HF_HUB_CACHE as huggingface_hub has them ({got})")
        got = library_folders(LEROBOT_PY, LEROBOT_CODE, env)
        check(got is not None and os.path.normpath(got["theirs"][0]) == os.path.normpath(got["ours"][0]),
              f"{label}: HF_LEROBOT_HOME as LeRobot 0.6.1 has it under {LEROBOT_PY} ({got})")


# ----------------------------------------------------------------------------
# the tools, end to end


def build_tokenizer(folder):
    """A byte-level BPE tokenizer.json without merges (each byte its own token) in folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    return os.path.join(folder, "tokenizer.json")


def build_tiny_dataset(root, n=3):
    """A LeRobot v2.1 dataset: one episode of n frames, one 8x8 image camera, state 2, action 1."""
    cam = "observation.images.top"
    info = {"codebase_version": "v2.1", "fps": 10, "chunks_size": 1000,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "features": {cam: {"dtype": "image", "shape": [8, 8, 3], "names": ["height", "width", "channels"]},
                         "observation.state": {"dtype": "float32", "shape": [2], "names": None},
                         "action": {"dtype": "float32", "shape": [1], "names": None}}}
    write(os.path.join(root, "meta", "info.json"), json.dumps(info))
    write(os.path.join(root, "meta", "tasks.jsonl"), json.dumps({"task_index": 0, "task": "push the T"}) + "\n")
    write(os.path.join(root, "meta", "episodes.jsonl"),
          json.dumps({"episode_index": 0, "tasks": ["push the T"], "length": n}) + "\n")
    images = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), 30 * i, np.uint8)).save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
    table = pa.table({
        "observation.state": pa.array([[float(i), 0.5] for i in range(n)], pa.list_(pa.float32())),
        "action": pa.array([[float(-i)] for i in range(n)], pa.list_(pa.float32())),
        cam: pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "timestamp": pa.array([i / 10 for i in range(n)], pa.float32()),
        "frame_index": pa.array(range(n), pa.int64()),
        "episode_index": pa.array([0] * n, pa.int64()),
        "index": pa.array(range(n), pa.int64()),
        "task_index": pa.array([0] * n, pa.int64()),
    })
    os.makedirs(os.path.join(root, "data", "chunk-000"))
    pq.write_table(table, os.path.join(root, "data", "chunk-000", "episode_000000.parquet"))


def tool_env(home, **values):
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env.update(values, HOME=home, HF_HUB_OFFLINE="1")
    return env


def one_error_line(r):
    lines = (r.stdout + r.stderr).splitlines()
    return r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (lines[0] if lines else "")


def check_converter(tmp):
    """data/lerobot_to_shards.py on a dataset and a tokenizer named by hub ids."""
    home, lerobot, hub = (os.path.join(tmp, n) for n in ("home", "lr", "hub"))
    build_tiny_dataset(os.path.join(lerobot, "someone", "tiny_push"))
    tok_snap = snapshot(hub, "model", "someone/tiny_tok", files=())
    tok_path = build_tokenizer(tok_snap)
    env = tool_env(home, HF_LEROBOT_HOME=lerobot, HF_HUB_CACHE=hub)
    out = os.path.join(tmp, "shards")
    r = subprocess.run([sys.executable, CONVERTER, "someone/tiny_push", "-o", out, "--img", "8",
                        "--tokenizer", "someone/tiny_tok"], capture_output=True, text=True, env=env, timeout=300)
    check(r.returncode == 0 and "someone/tiny_push read from " + os.path.join(lerobot, "someone", "tiny_push")
          in r.stdout, f"the converter on hub id someone/tiny_push (HF_LEROBOT_HOME): exit {r.returncode}, "
          f"{(r.stdout if r.returncode == 0 else r.stderr).strip()[-400:]}")
    try:
        ds = vla_shard.Dataset(out)
        shard = ds.shards[0]
        want = vla_shard.tokenizer_json_id(tok_path)
        check(ds.n_samples == 3 and os.path.basename(shard.path) == "tiny_push_000.bin" and ds.tokenizer == want,
              f"its shard: 3 frames, named after the id's NAME, tokenizer someone/tiny_tok's {want} "
              f"({ds.n_samples}, {shard.path}, {ds.tokenizer})")
    except (ValueError, OSError, IndexError) as e:
        check(False, f"its shard reads back: {e}")

    r = subprocess.run([sys.executable, CONVERTER, "someone/absent", "-o", os.path.join(tmp, "none")],
                       capture_output=True, text=True, env=env, timeout=120)
    ok, line = one_error_line(r)
    check(ok and os.path.join(lerobot, "someone/absent") in line and "--repo-type dataset" in line
          and not os.path.exists(os.path.join(tmp, "none")),
          f"the converter on a hub id cached nowhere: one error line with the download, no output folder: {line}")
    r = subprocess.run([sys.executable, CONVERTER, "./someone/absent", "-o", os.path.join(tmp, "none")],
                       capture_output=True, text=True, env=env, timeout=120)
    ok, line = one_error_line(r)
    check(ok and line == "error: ./someone/absent is not a folder: pass the LeRobot dataset folder (the one that "
          "holds meta/info.json)", f"a missing path keeps its message: {line}")


def check_policy_tokenizer(tmp):
    """VLAPolicy's tokenizer=: a hub id is the HF cache's snapshot holding tokenizer.json."""
    import vla_policy
    home, hub = os.path.join(tmp, "home"), os.path.join(tmp, "hub")
    snapshot(hub, "model", "google/tok", COMMIT_A, ("config.json",))  # refs/main's, without tokenizer.json
    path = build_tokenizer(snapshot(hub, "model", "google/tok", COMMIT_B, (), ref="v1"))
    name = vla_shard.tokenizer_json_id(path)
    with environment(home, HF_HUB_CACHE=hub):
        try:
            tok = vla_policy.policy_tokenizer("ck.bin", name, "google/tok")
            check(tok.path == path and tok.name == name, f"tokenizer='google/tok': the snapshot that holds "
                  f"tokenizer.json ({tok.path})")
        except ValueError as e:
            check(False, f"tokenizer='google/tok' resolves: {e}")
        try:
            vla_policy.policy_tokenizer("ck.bin", name, "google/absent")
            check(False, "tokenizer='google/absent' is refused")
        except ValueError as e:
            msg = str(e)
            check(msg.startswith("tokenizer google/absent ") and "\n" not in msg and "`hf download google/absent`" in msg
                  and os.path.join(hub, "models--google--absent") in msg,
                  f"tokenizer='google/absent': one-line ValueError with the folder and the download: {msg}")


def check_importer(tmp):
    """scripts/import_lerobot.py on policies named by hub ids (it stops at config.json's checks: no
    weights are needed to see where it reads)."""
    home, hub = os.path.join(tmp, "home"), os.path.join(tmp, "hub")
    act = snapshot(hub, "model", "someone/act_policy")
    write(os.path.join(act, "config.json"), json.dumps({"type": "act"}))
    smol = snapshot(hub, "model", "someone/smol_policy", files=("model.safetensors",))
    write(os.path.join(smol, "config.json"), json.dumps({
        "type": "smolvla", "vlm_model_name": "someone/absent_vlm",
        "input_features": {"observation.state": {"type": "STATE", "shape": [2]},
                           "observation.images.top": {"type": "VISUAL", "shape": [3, 8, 8]}},
        "output_features": {"action": {"type": "ACTION", "shape": [1]}}}))
    env = tool_env(home, HF_HUB_CACHE=hub)
    out = os.path.join(tmp, "ckpt.bin")

    def importer(policy):
        try:
            return subprocess.run([sys.executable, IMPORTER, policy, "-o", out], capture_output=True, text=True, env=env,
                                  timeout=300)
        except OSError as e:
            return subprocess.CompletedProcess([], 127, "", f"{sys.executable}: {e}")

    ok, line = one_error_line(importer("someone/act_policy"))
    check(ok and os.path.join(act, "config.json") in line and "type 'act'" in line,
          f"import of hub id someone/act_policy reads the HF cache's snapshot: {line}")
    ok, line = one_error_line(importer("someone/absent_policy"))
    check(ok and "`hf download someone/absent_policy`" in line and os.path.join(hub, "models--someone--absent_policy")
          in line, f"import of a hub id cached nowhere: one line with the folder and the download: {line}")
    ok, line = one_error_line(importer("someone/smol_policy"))
    check(ok and "someone/absent_vlm" in line and "`hf download someone/absent_vlm`" in line
          and os.path.join(hub, "models--someone--absent_vlm") in line,
          f"import of a policy whose VLM is cached nowhere: one line with its folder and download: {line}")
    check(not os.path.exists(out), "nothing written")


def main():
    groups = [check_variables, check_datasets, check_snapshots, check_paths, check_not_found, check_against_libraries,
              check_converter, check_policy_tokenizer, check_importer]
    for group in groups:
        with tempfile.TemporaryDirectory() as tmp:
            group(os.path.realpath(tmp))
    check.finish()


if __name__ == "__main__":
    main()
