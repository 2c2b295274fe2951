#!/usr/bin/env bash
# Fetch (here, where pip reaches PyPI) the wheels an offline GPU machine needs to import
# LeRobot 0.6.1 on top of its image, for dev/lerobot/bench_lerobot.py. The image already has
# torch 2.11.0, transformers 5.17.0, accelerate 1.15.0, huggingface-hub 1.33.0, safetensors 0.8.0,
# tokenizers 0.23.2, numpy 2.5.2 and the rest of the list below; what it lacks is LeRobot itself
# and a few small pure-Python packages. Versions are pinned from dev/lerobot/requirements.txt.
#
#   dev/lerobot/wheels.sh              # minimal set (~2.5 MB): use the image's transformers/numpy
#   dev/lerobot/wheels.sh --pinned     # also transformers 5.5.4 + tokenizers 0.22.2 (~15 MB more),
#                                      # inside LeRobot's transformers<5.6 pin, as build/lerobot-venv
#   dev/lerobot/wheels.sh --simulate   # then run the tiny benchmark in build/lerobot-venv with
#                                      # imports limited to the image's packages + these wheels,
#                                      # under the image's transformers/tokenizers/numpy versions
#
# The minimal set was found by trying (the --simulate run): lerobot, draccus (+ mergedeep, toml;
# pyyaml and typing-inspect are in the image), num2words (SmolVLMProcessor needs it), gymnasium
# (imported by lerobot.envs, which lerobot.policies pulls in; + farama-notifications), termcolor
# (a hard Requires-Dist of lerobot, 8 kB). Not carried: docopt (num2words' Requires-Dist; only
# its command-line script imports it, and PyPI has no wheel for 0.6.2).
#
# On the GPU machine (with .whl copied over), begin the command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;
# (--upgrade only matters if /tmp/site exists already; a fresh machine has none.)
set -euo pipefail

cd "$(dirname "$0")/../.."
REQ=dev/lerobot/requirements.txt
WHL=${WHL_DIR:-.whl}
PINNED=0
SIMULATE=0
for a in "$@"; do
  case "$a" in
    --pinned) PINNED=1 ;;
    --simulate) SIMULATE=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "wheels.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done

NAMES="lerobot draccus mergedeep toml num2words gymnasium farama-notifications termcolor"
[ "$PINNED" = 1 ] && NAMES="$NAMES transformers tokenizers"

# Ignored by git, so the wheels never get committed.
EXCLUDE=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF "/$WHL/" "$EXCLUDE" 2>/dev/null || echo "/$WHL/" >> "$EXCLUDE"
mkdir -p "$WHL"

pin() {  # pinned version of a distribution in requirements.txt (names compared normalized)
  local want; want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  grep -v '^#' "$REQ" | while IFS='=' read -r name _ ver; do
    [ "$(echo "$name" | tr 'A-Z_.' 'a-z--')" = "$want" ] && echo "$ver" && break
  done
}

SPECS=()
for n in $NAMES; do
  v=$(pin "$n")
  [ -n "$v" ] || { echo "wheels.sh: $n is not pinned in $REQ" >&2; exit 1; }
  SPECS+=("$n==$v")
done
if [ "$PINNED" = 0 ]; then  # a previous --pinned run's extras would shadow the image's copies
  for n in transformers tokenizers; do
    for f in "$WHL/$n-$(pin $n)-"*.whl; do
      [ -e "$f" ] && { echo "removing $f (fetched by --pinned)"; rm -f "$f"; }
    done
  done
fi
echo "fetching: ${SPECS[*]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$WHL" "${SPECS[@]}"

# The check below, in Python (pip's vendored `packaging` parses the requirement strings).
python3 - "$WHL" "$PINNED" "${SPECS[@]}" <<'PY'
import glob, os, re, sys, zipfile
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

whl_dir, pinned, specs = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
# The image's Python packages (its pip list).
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split()
IMAGE = {canonicalize_name(n) for n in IMAGE}
# Their versions in the image, for the packages whose pins matter here.
IMAGE_VERSIONS = {"torch": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "accelerate": "1.15.0",
                  "huggingface-hub": "1.33.0", "safetensors": "0.8.0", "tokenizers": "0.23.2", "numpy": "2.5.2",
                  "triton": "3.6.0"}
EXTRAS = {"lerobot": ["", "smolvla", "transformers-dep", "accelerate-dep"]}
# Known and accepted: num2words lists docopt, used only by its command-line script.
ACCEPTED_MISSING = {"docopt"}

env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}

wanted = {canonicalize_name(s.split("==")[0]): s.split("==")[1] for s in specs}
ours, total = {}, 0
for path in sorted(glob.glob(os.path.join(whl_dir, "*.whl"))):
    name, ver = os.path.basename(path).split("-")[:2]
    name = canonicalize_name(name)
    if name in wanted and ver == wanted[name]:
        ours[name] = (ver, path)
        total += os.path.getsize(path)
missing_files = sorted(set(wanted) - set(ours))
if missing_files:
    sys.exit(f"wheels.sh: not downloaded: {missing_files}")

# Everything in the folder: one version per distribution, or the --no-deps install fails.
seen = {}
for path in glob.glob(os.path.join(whl_dir, "*.whl")):
    n, v = os.path.basename(path).split("-")[:2]
    seen.setdefault(canonicalize_name(n), set()).add(v)
dupes = {n: sorted(v) for n, v in seen.items() if len(v) > 1}
stale = sorted(n for n in seen if n not in wanted)

provided = dict(IMAGE_VERSIONS)
for n in IMAGE:
    provided.setdefault(n, None)
for n, (v, _) in ours.items():
    provided[n] = v  # --target /tmp/site on PYTHONPATH shadows the image's copy

problems, notes = [], []
for name, (ver, path) in sorted(ours.items()):
    with zipfile.ZipFile(path) as z:
        meta = next(f for f in z.namelist() if f.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        # lerobot is used as lerobot[smolvla], whose extras pull transformers, num2words, accelerate.
        extras = EXTRAS.get(name, [""])
        if req.marker is not None and not any(req.marker.evaluate(dict(env, extra=e)) for e in extras):
            continue  # another extra, or another platform
        dep = canonicalize_name(req.name)
        if dep not in provided:
            (notes if dep in ACCEPTED_MISSING else problems).append(
                f"{name} {ver} needs {req} : not in the image nor in {whl_dir}")
            continue
        have = provided[dep]
        if have is not None and req.specifier and not req.specifier.contains(Version(have), prereleases=True):
            notes.append(f"{name} {ver} asks {req}, the GPU machine has {dep} {have}")

print(f"{len(ours)} wheels, {total / 2**20:.2f} MiB:")
for name, (ver, path) in sorted(ours.items()):
    print(f"  {os.path.basename(path):70s} {os.path.getsize(path) / 2**10:9.1f} KiB")
folder = sum(os.path.getsize(p) for p in glob.glob(os.path.join(whl_dir, "*.whl")))
print(f"folder {whl_dir}: {folder / 2**20:.2f} MiB in all (kept under 60 MiB to copy over)")
for n in notes:
    print("note:", n)
if stale:
    print(f"note: other wheels in {whl_dir} (not this script's, installed too): {stale}")
if dupes:
    problems.append(f"several versions in {whl_dir}: {dupes}")
if folder > 60 * 2**20:
    problems.append(f"{whl_dir} holds {folder / 2**20:.1f} MiB, over 60 MiB")
for p in problems:
    print("MISSING:" if "needs" in p else "PROBLEM:", p)
print("Requires-Dist check:", "OK" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
PY

echo "GPU run: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHL/*.whl && export PYTHONPATH=/tmp/site || exit;"

[ "$SIMULATE" = 1 ] || exit 0

# ---- --simulate: as close to the GPU machine as this machine gets ----------------------------
VENV=build/lerobot-venv/bin/python
[ -x "$VENV" ] || { echo "wheels.sh: --simulate needs $VENV" >&2; exit 1; }
SIM=${TMPDIR:-/tmp}/bench_lerobot_sim
mkdir -p "$SIM"
if [ "$PINNED" = 0 ]; then
  # The image's own transformers/tokenizers/numpy shadow the venv's (LeRobot pins older ones).
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$SIM/whl" transformers==5.17.0 tokenizers==0.23.2 numpy==2.5.2
  rm -rf "$SIM/site"
  "$VENV" -m pip install -q --no-index --no-deps --no-compile --target "$SIM/site" "$SIM"/whl/*.whl
  OVERLAY="$SIM/site"
else
  OVERLAY=""
fi
# Allowed distributions: the image's list plus the wheels' names.
sed -n '/^IMAGE = """/,/"""/p' "$0" | sed 's/IMAGE = """//; s/""".*//' | tr ' ' '\n' | sed '/^$/d' > "$SIM/allow.txt"
for n in $NAMES; do echo "$n" >> "$SIM/allow.txt"; done
cat > "$SIM/restricted.py" <<'PY'
"""Run a script with imports limited to the allowed distributions (and the standard library)."""
import importlib.metadata as md, runpy, sys
allow_file, script, *argv = sys.argv[1:]
norm = lambda n: n.lower().replace("_", "-").replace(".", "-")
allowed = {norm(x) for x in open(allow_file).read().split()}
owners = md.packages_distributions()
blocked = set()
class Gate:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        dists = owners.get(top)
        if top in sys.stdlib_module_names or not dists or any(norm(d) in allowed for d in dists):
            return None
        blocked.add(top)
        raise ModuleNotFoundError(f"{name} ({dists}) is neither in the image nor in the wheels", name=name)
sys.meta_path.insert(0, Gate())
sys.argv = [script, *argv]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    print("imports refused:", sorted(blocked) or "none", file=sys.stderr)
PY
echo "simulating the GPU machine's imports (overlay: ${OVERLAY:-none})"
PYTHONPATH="$OVERLAY" "$VENV" "$SIM/restricted.py" "$SIM/allow.txt" dev/lerobot/bench_lerobot.py \
  --preset tiny --device cpu --batch 2 --steps 1 --warmup 1 --train all --flop-check --work-dir "$SIM/work"
