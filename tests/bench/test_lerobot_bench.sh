#!/usr/bin/env bash
# Smoke test of dev/lerobot/bench_lerobot.py on the CPU: SmolVLA and pi0 at tiny sizes, the released
# models' counts on the meta device, pi0's FLOPs against vla/flops.h's (about three minutes on 2 cores).
# The figures it prints are not benchmark claims: tiny model, shared CPU, 2 timed steps.
#   tests/bench/test_lerobot_bench.sh    # last line: "N passed, M failed"; non-zero on failure
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PY=${LEROBOT_PYTHON:-build/lerobot-venv/bin/python}
BENCH=dev/lerobot/bench_lerobot.py
T=$(mktemp -d "${TMPDIR:-/tmp}/test_lerobot_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }

if [ ! -x "$PY" ]; then
  echo "FAIL no LeRobot venv at $PY (see dev/lerobot/requirements.txt)"
  echo "0 passed, 1 failed"
  exit 1
fi

# The cases run one after another in one Python process, which imports torch and LeRobot once, not
# once a case (about 10 s each on 2 cores). Each case's output (its file descriptors 1 and 2) goes to
# $T/NAME.log, its exit status as the command line gives it (0; 2 for a BenchError, 3 for
# DoesNotFit, 1 otherwise) to $T/NAME.rc and its seconds to $T/NAME.s; `report NAME` says how it went.
# (The out-of-memory and no-CUDA cases below run as processes of their own: they check the exit.)
run_cases() {  # lines of "NAME BENCH-ARGUMENTS..." on stdin
  cat > "$T/cases.txt"
  "$PY" - "$BENCH" "$T" << 'PY'
import os, sys, time, traceback
bench, T = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(bench))
import bench_lerobot as b
saved = os.dup(1), os.dup(2)
for line in open(os.path.join(T, "cases.txt")):
    name, *args = line.split()
    t0 = time.time()
    sys.stdout.flush(), sys.stderr.flush()
    with open(os.path.join(T, name + ".log"), "w") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            rc = b.main(["--work-dir", os.path.join(T, "work"), "--json", os.path.join(T, name + ".json")] + args) or 0
        except b.DoesNotFit as e:
            print(f"bench_lerobot: does not fit: {e}", file=sys.stderr)
            rc = 3
        except b.BenchError as e:
            print(f"bench_lerobot: error: {e}", file=sys.stderr)
            rc = 2
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except Exception as e:
            traceback.print_exc()
            print(f"bench_lerobot: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    open(os.path.join(T, name + ".rc"), "w").write(f"{rc}\n")
    open(os.path.join(T, name + ".s"), "w").write(f"{time.time() - t0:.0f}\n")
PY
}

report() {  # name: how its case went; its output is in $T/name.log
  local name=$1
  if [ "$(cat "$T/$name.rc" 2> /dev/null)" = 0 ]; then
    ok "$name runs ($(cat "$T/$name.s") s): $(grep -E '^(train|infer|count-only)' "$T/$name.log" | tail -1)"
  else
    bad "$name exited non-zero (exit $(cat "$T/$name.rc" 2> /dev/null || echo none)); its log ends:"
    tail -5 "$T/$name.log" 2> /dev/null | sed 's/^/     /'
  fi
}

check() {  # name, Python expression over the report `r` (and `n`, a float()) that must hold
  local name=$1 expr=$2
  if [ ! -s "$T/$name.json" ]; then bad "$name: no JSON"; return; fi
  if "$PY" - "$T/$name.json" "$expr" <<'PY'; then ok "$name: $expr"; else bad "$name: $expr"; fi
import json, math, sys
r = json.load(open(sys.argv[1]))
try:
    good = bool(eval(sys.argv[2], {"math": math, "r": r}))
except Exception as e:
    print(f"     {type(e).__name__}: {e}")
    good = False
sys.exit(0 if good else 1)
PY
}

TINY=(--preset tiny --device cpu --batch 2 --steps 2 --warmup 1)
PI0_TINY=(--preset pi0_tiny --device cpu --batch 2 --steps 2 --warmup 1)
# every case, run now; each is reported and checked below, with what it tests
run_cases << EOF
expert ${TINY[*]} --train expert --flop-check
all ${TINY[*]} --train all --flop-check
infer ${TINY[*]} --infer --flop-check
smolvla --preset smolvla --count-only --batch 32
small --preset small --count-only --batch 8
pi0_all ${PI0_TINY[*]} --flop-check
pi0_infer ${PI0_TINY[*]} --infer --flop-check
pi0 --preset pi0 --count-only --batch 8
EOF

report expert
check expert 'r["train"]["samples_per_s"] > 0 and r["train"]["ms_per_step"] > 0'
check expert 'all(math.isfinite(x) for x in r["train"]["losses"])'
check expert 'r["params"]["total"] == r["param_formula"]["total"] and r["params"]["trainable"] == r["param_formula"]["trainable"]["expert"]'
check expert 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

report all
check all 'r["train"]["samples_per_s"] > 0'
check all 'r["params"]["total"] == r["param_formula"]["total"] and r["params"]["trainable"] == r["param_formula"]["trainable"]["all"]'
check all 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

report infer
check infer 'r["infer"]["ms_per_chunk_median"] > 0 and r["infer"]["batch"] == 1'
check infer 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

# The released sizes, built on the meta device: LeRobot's own counts, no step.
report smolvla
check smolvla 'r["modes"]["expert"]["params"]["total"] == 450046176'
check smolvla 'r["modes"]["expert"]["params"]["total_without_lm_head"] == 402737376'
check smolvla '[r["modes"][m]["params"]["trainable"] for m in ("expert", "vlm", "all")] == [99880992, 306471072, 392904096]'
check smolvla 'all(v["flops_counted"] == v["flops_autograd"] for v in r["modes"].values())'
check smolvla 'r["modes"]["expert"]["prefix_tokens"] == 2 * 64 + r["modes"]["expert"]["lang_tokens"] + 1'

# train_vla's small preset (dev/bench_cpu.sh times LeRobot at it): the counts of vla/config.h's table,
# once the stand-in tokenizer's rows past 256 (64 wide) are taken off the embedding.
report small
check small 'r["modes"]["expert"]["params"]["total_without_lm_head"] - (r["sizes"]["vocab"] - 256) * 64 == 262336'
check small '[r["modes"][m]["params"]["trainable"] - (m != "expert") * (r["sizes"]["vocab"] - 256) * 64 for m in ("expert", "vlm", "all")] == [103648, 181600, 212992]'

# pi0: LeRobot's PI0Policy at pi0_tiny's sizes (make_ref.py's pi0 sizes, put in place at run time), its
# batch fed tokenized and normalized; 2 timed steps, LeRobot's FLOPs counted by FlopCounterMode.
line() {  # name, extended regex its printed line must match
  local name=$1 re=$2 got
  got=$(grep -E '^(train|infer) ' "$T/$name.log" | tail -1)
  if grep -qE "$re" <<< "$got"; then ok "$name: its line reads as it should"; else bad "$name: line '$got' !~ /$re/"; fi
}
report pi0_all
line pi0_all '^train all B=2 amp=none \(dtype float32\): [0-9.]+ ms/step, [0-9.]+ samples/s .*prefix 48 \+ suffix 9 tokens; [0-9.e-]+ GFLOP/sample model'
check pi0_all 'r["settings"]["train"] == "all" and r["dtype"] == "float32" and r["train"]["samples_per_s"] > 0'
check pi0_all 'len(r["train"]["losses"]) == 3 and all(math.isfinite(x) for x in r["train"]["losses"])'
check pi0_all '[r["params"][k] for k in ("total", "used", "lm_heads")] == [162784, 138208, 24576] and r["trained"] == 109408'
check pi0_all 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'
check pi0_all 'r["train"]["prefix_tokens"] == 2 * 16 + 16 and r["train"]["suffix_tokens"] == 8 + 1'

report pi0_infer
line pi0_infer '^infer B=1 dtype float32: [0-9.]+ ms/chunk median'
check pi0_infer 'r["infer"]["ms_per_chunk_median"] > 0 and r["infer"]["batch"] == 1 and r["infer"]["autocast"] is None'
check pi0_infer 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

# The released pi0 on the meta device: LeRobot's own counts (docs/pi0.md), FlopCounterMode exactly.
report pi0
check pi0 'all([r["modes"][m]["params"][k] for k in ("total", "used", "lm_heads")] == [4028019472, 3238048528, 789970944] for m in r["modes"])'
check pi0 '[r["modes"][m]["trained"] for m in ("expert", "vlm", "all")] == [314713120, 2720744480, 3133186832]'
check pi0 'all(v["flops_counted"] == v["flops_autograd"] for v in r["modes"].values())'
check pi0 'r["modes"]["all"]["prefix_tokens"] == 2 * 256 + 48 and r["modes"]["all"]["suffix_tokens"] == 51'

# One FLOP count for both trainers: vla/flops.h's model FLOPs per sample (train_vla's MFU) against
# pi0_train_flops's (LeRobot's MFU here), pi0 and pi0_tiny at two cameras, every train mode. Both
# are sums of whole numbers far below 2^53, so they agree exactly.
cat > "$T/flops.c" << 'EOF'
#include <stdio.h>
#include <stdlib.h>
#include "vla/common.h"
#include "vla/rng.h"
#include "vla/config.h"
#include "vla/flops.h"
int main(int argc, char** argv) {  // preset, cameras: the model FLOPs per sample of each train mode
    if (argc != 3 || flow_preset(argv[1]) == NULL) { return 2; }
    FlowConfig c = flow_preset(argv[1])->config;
    c.n_cam = atoi(argv[2]);
    for (int mode = TRAIN_MODE_EXPERT; mode <= TRAIN_MODE_ALL; mode++) {
        printf("%s %.0f\n", TRAIN_MODE_NAMES[mode], flow_flops_per_sample(&c, mode));
    }
    return 0;
}
EOF
if ! ${CC:-cc} -O1 -I. "$T/flops.c" -o "$T/flops" -lm 2> "$T/flops.err"; then
  bad "flops: a program with vla/flops.h does not compile: $(head -3 "$T/flops.err")"
else
  for preset in pi0 pi0_tiny; do
    if "$T/flops" "$preset" 2 > "$T/flops_$preset.txt" && "$PY" - "$T/flops_$preset.txt" "$preset" << 'PY'; then
import sys
sys.path.insert(0, "dev/lerobot")
import bench_lerobot as b
sz = b.pi0_preset_sizes(sys.argv[2], n_cams=2)
c = dict(line.split() for line in open(sys.argv[1]))
py = {m: b.pi0_train_flops(sz, 1, sz["lang"], m, "model")["total"] for m in b.TRAIN_FLAGS}
print("     " + ", ".join(f"{m} {int(c[m]):,} (C) {py[m]:,} (Python)" for m in py))
sys.exit(0 if all(int(c[m]) == py[m] > 0 for m in py) else 1)
PY
      ok "flops $preset: vla/flops.h and pi0_train_flops agree in every train mode"
    else
      bad "flops $preset: vla/flops.h and pi0_train_flops differ"
    fi
  done
fi

# A CUDA out-of-memory error (raised here by a stand-in for backward): exit 3 and one line.
"$PY" - "$BENCH" "${PI0_TINY[@]}" --work-dir "$T/work" --json "$T/oom.json" > "$T/oom.out" 2> "$T/oom.err" << 'PY'
import runpy, sys
import torch
def out_of_memory(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (a stand-in)")
torch.Tensor.backward = out_of_memory
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
rc=$?
if [ $rc -eq 3 ] && [ "$(wc -l < "$T/oom.err")" -eq 1 ] &&
    grep -q '^bench_lerobot: does not fit: CUDA out of memory: pi0 (pi0_tiny) --train all at batch 2, dtype float32: ' "$T/oom.err"; then
  ok "oom: exit 3, $(cat "$T/oom.err")"
else
  bad "oom: exit $rc, stderr: $(head -3 "$T/oom.err")"
fi
check oom '"out of memory" in r["does_not_fit"]'

# --device cuda without a GPU: a non-zero exit and one clear line.
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  ok "nocuda: skipped (this machine has CUDA)"
else
  "$PY" "$BENCH" --preset tiny --device cuda --work-dir "$T/work" >"$T/nocuda.out" 2>"$T/nocuda.err"
  rc=$?
  if [ $rc -ne 0 ] && [ "$(wc -l <"$T/nocuda.err")" -eq 1 ] && grep -qi "^bench_lerobot: error:.*cuda" "$T/nocuda.err"; then
    ok "nocuda: exit $rc, $(cat "$T/nocuda.err")"
  else
    bad "nocuda: exit $rc, stderr: $(head -3 "$T/nocuda.err")"
  fi
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
