"""
hub_cache.py: a Hugging Face hub id (lerobot/pusht, lerobot/smolvla_base,
google/paligemma-3b-pt-224) as the local folder that LeRobot or huggingface_hub downloaded it to.
Nothing is downloaded and the network is never touched: an id that is not found is one line that
names every folder looked at and the command that downloads it. Standard library only (the data
tools' build/venv, Debian's python3 and build/lerobot-venv all import it).

An argument that exists as a path is that path, whatever it looks like, and an argument that is
no hub id is left to the tool's own messages for a missing path. A hub id is ORG/NAME or NAME,
as huggingface_hub's validate_repo_id has it: each part letters, digits, '-', '_' and '.', at most
96 of them, starting and ending with a letter or digit; no '--' or '..'; no .git at the end. So
nothing starting with ./ ../ / or ~ and nothing of two slashes is one.

Where, with the environment read as huggingface_hub 1.33.0 (constants.py) and LeRobot 0.6.1
(lerobot/utils/constants.py) read it, at the call rather than at import:
  HF_HOME         $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface
                  (~ and $VARS expanded)
  the hub cache   $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its old name), else $HF_HOME/hub
                  (~ and $VARS expanded)
  LeRobot's home  $HF_LEROBOT_HOME (~ expanded), else $HF_HOME/lerobot; LeRobot refuses to run
                  while the old LEROBOT_HOME is set, and so does a dataset lookup here
A variable set to the empty string counts as set, as os.getenv has it in both libraries.

A repository in a hub cache is <cache>/<kind>s--ORG--NAME: its revisions are snapshots/<commit>/,
and refs/<branch or tag> holds the commit of a revision fetched by name. Snapshots are tried in
this order: refs/main's (what huggingface_hub, transformers and LeRobot's policies load by
default), then those of the other refs by name (LeRobot fetches datasets by version tag, v3.0),
then the rest by name. The first folder that holds the file the tool needs (config.json,
tokenizer.json, meta/info.json) is the one:
  a model    <hub cache>/models--ORG--NAME/snapshots/...            policies, VLMs, tokenizers
  a dataset  <LeRobot home>/ORG/NAME                                 LeRobotDataset's root
             <LeRobot home>/hub/datasets--ORG--NAME/snapshots/...   where LeRobot 0.6.1 downloads
             <hub cache>/datasets--ORG--NAME/snapshots/...          hf download --repo-type dataset
So a dataset is found at ~/.cache/huggingface/lerobot/<repo_id> by default.
"""

import os
import re

KINDS = ("model", "dataset")
ID_PART = re.compile(r"\w(?:[\w.-]{0,94}\w)?")  # one part of a repo id, 1 to 96 characters


class NotFound(ValueError):
    """A hub id in none of the caches: the one line says where it was looked for and how to get it."""


def hf_home():
    """huggingface_hub's HF_HOME."""
    default = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                           "huggingface")
    return os.path.expandvars(os.path.expanduser(os.getenv("HF_HOME", default)))


def hub_cache():
    """huggingface_hub's HF_HUB_CACHE: where models, datasets and spaces are cached."""
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(hf_home(), "hub"))
    return os.path.expandvars(os.path.expanduser(os.getenv("HF_HUB_CACHE", legacy)))


def lerobot_home():
    """LeRobot's HF_LEROBOT_HOME: its datasets' roots, <home>/<repo_id>."""
    home = os.getenv("HF_LEROBOT_HOME", os.path.join(hf_home(), "lerobot"))
    return os.path.expanduser(home) or "."  # (LeRobot's Path("") is the current folder)


def is_hub_id(arg):
    """Whether arg reads as a hub repo id, ORG/NAME or NAME."""
    if not isinstance(arg, str) or "--" in arg or ".." in arg or arg.endswith(".git"):
        return False
    parts = arg.split("/")
    return len(parts) <= 2 and all(ID_PART.fullmatch(p) for p in parts)


def snapshots(cache, kind, repo_id):
    """The snapshot folders of repo_id in one hub cache, in lookup order; the repository's own
    folder alone when it has none (so that a message can name where it would be)."""
    repo = os.path.join(cache, f"{kind}s--" + repo_id.replace("/", "--"))
    folder = os.path.join(repo, "snapshots")
    try:
        names = sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    except OSError:
        return [repo]
    try:
        refs = sorted(os.listdir(os.path.join(repo, "refs")), key=lambda r: (r != "main", r))
    except OSError:
        refs = []
    order = []
    for ref in refs:
        try:
            with open(os.path.join(repo, "refs", ref), encoding="utf-8") as f:
                commit = f.read().strip()
        except (OSError, UnicodeDecodeError):  # (refs/pr is a folder of pull requests' refs)
            continue
        if commit in names and commit not in order:
            order.append(commit)
    order += [n for n in names if n not in order]
    return [os.path.join(folder, n) for n in order] or [repo]


def places(repo_id, kind):
    """Every folder that may hold repo_id (a hub id) of this kind, in lookup order."""
    if kind not in KINDS:
        raise ValueError(f"hub_cache: kind {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "model":
        return snapshots(hub_cache(), "model", repo_id)
    if "LEROBOT_HOME" in os.environ:
        raise NotFound(f"{repo_id}: the environment sets LEROBOT_HOME, which LeRobot refuses (it reads "
                       "HF_LEROBOT_HOME): rename the variable to HF_LEROBOT_HOME")
    home = lerobot_home()
    return [os.path.join(home, repo_id)] + snapshots(os.path.join(home, "hub"), "dataset", repo_id) + \
        snapshots(hub_cache(), "dataset", repo_id)


def download_command(repo_id, kind):
    """The command that puts repo_id into the hub cache, where the lookup finds it (huggingface_hub
    1.x's CLI is `hf`; a --local-dir copy under LeRobot's home would be taken by LeRobot 0.6.1 for an
    old-style mirror, .cache/huggingface/download in it, and fetched again)."""
    return f"hf download {repo_id}" + (" --repo-type dataset" if kind == "dataset" else "")


def local_folder(arg, kind, need):
    """The folder to read for arg: arg itself when it exists or is no hub id (the caller's checks
    and messages for paths apply); else the first cached folder of that id (kind "model" or
    "dataset") that holds the file `need`. Raises NotFound with one line when none does."""
    if not is_hub_id(arg) or os.path.exists(arg):
        return arg
    looked = places(arg, kind)
    for place in looked:
        if os.path.isfile(os.path.join(place, need)):
            return place
    also = f", or load it once with LeRobot's LeRobotDataset(\"{arg}\")" if kind == "dataset" else ""
    raise NotFound(f"{arg} is no file or folder here, and as a hub {kind} id it is in no local cache (looked at "
                   f"{', '.join(looked)}; none holds {need}); nothing is downloaded here: download it with "
                   f"`{download_command(arg, kind)}`{also}, or pass its folder")
