#!/usr/bin/env bash
# Smoke test of dev/lerobot/bench_lerobot.py on the CPU (tiny sizes; under a minute on 2 cores).
# The figures it prints are not benchmark claims: tiny model, shared CPU, 2 timed steps.
#   dev/lerobot/test_bench.sh            # last line: "N passed, M failed"; non-zero on failure
set -uo pipefail

cd "$(dirname "$0")/../.."
PY=${LEROBOT_PYTHON:-build/lerobot-venv/bin/python}
BENCH=dev/lerobot/bench_lerobot.py
T=$(mktemp -d "${TMPDIR:-/tmp}/test_bench.XXXXXX")
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

run() {  # name, then bench arguments; output kept in $T/name.log
  local name=$1; shift
  local t0=$SECONDS
  if "$PY" "$BENCH" --work-dir "$T/work" --json "$T/$name.json" "$@" >"$T/$name.log" 2>&1; then
    ok "$name runs ($((SECONDS - t0)) s): $(grep -E '^(train|infer|count-only)' "$T/$name.log" | tail -1)"
  else
    bad "$name exited non-zero; its log ends:"; tail -5 "$T/$name.log" | sed 's/^/     /'
  fi
}

check() {  # name, Python expression over the report `r` (and `n`, a float()) that must hold
  local name=$1 expr=$2
  if [ ! -s "$T/$name.json" ]; then bad "$name: no JSON"; return; fi
  if python3 - "$T/$name.json" "$expr" <<'PY'; then ok "$name: $expr"; else bad "$name: $expr"; fi
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

run expert "${TINY[@]}" --train expert --flop-check
check expert 'r["train"]["samples_per_s"] > 0 and r["train"]["ms_per_step"] > 0'
check expert 'all(math.isfinite(x) for x in r["train"]["losses"])'
check expert 'r["params"]["total"] == r["param_formula"]["total"] and r["params"]["trainable"] == r["param_formula"]["trainable"]["expert"]'
check expert 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

run all "${TINY[@]}" --train all --flop-check
check all 'r["train"]["samples_per_s"] > 0'
check all 'r["params"]["total"] == r["param_formula"]["total"] and r["params"]["trainable"] == r["param_formula"]["trainable"]["all"]'
check all 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

run infer "${TINY[@]}" --infer --flop-check
check infer 'r["infer"]["ms_per_chunk_median"] > 0 and r["infer"]["batch"] == 1'
check infer 'r["flop_check"]["counted"] == r["flop_check"]["formula"] > 0'

# The released sizes, built on the meta device: LeRobot's own counts, no step.
run smolvla --preset smolvla --count-only --batch 32
check smolvla 'r["modes"]["expert"]["params"]["total"] == 450046176'
check smolvla 'r["modes"]["expert"]["params"]["total_without_lm_head"] == 402737376'
check smolvla '[r["modes"][m]["params"]["trainable"] for m in ("expert", "vlm", "all")] == [99880992, 306471072, 392904096]'
check smolvla 'all(v["flops_counted"] == v["flops_autograd"] for v in r["modes"].values())'
check smolvla 'r["modes"]["expert"]["prefix_tokens"] == 2 * 64 + r["modes"]["expert"]["lang_tokens"] + 1'

# train_vla's small preset (dev/bench_cpu.sh times LeRobot at it): the counts of vla/config.h's table,
# once the stand-in tokenizer's rows past 256 (64 wide) are taken off the embedding.
run small --preset small --count-only --batch 8
check small 'r["modes"]["expert"]["params"]["total_without_lm_head"] - (r["sizes"]["vocab"] - 256) * 64 == 262336'
check small '[r["modes"][m]["params"]["trainable"] - (m != "expert") * (r["sizes"]["vocab"] - 256) * 64 for m in ("expert", "vlm", "all")] == [103648, 181600, 212992]'

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
