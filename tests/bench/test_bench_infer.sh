#!/usr/bin/env bash
# Smoke test of dev/bench_infer.py (the inference benchmark) at the tiny and pi0_tiny presets: on the
# CPU library and on the GPU library, which is the CPU emulation's build where there is no GPU (then
# the library counts launches too). No timing claims: tiny model, shared CPU, a few chunks.
#   tests/bench/test_bench_infer.sh        # last line: "N passed, M failed"; non-zero on failure
# PYTHON must import torch and numpy (the checkpoint is made with dev/model.py); GPU_LIBRARY is the
# GPU library to load (default: the first of $VLA_GPU_LIBRARY, else build/emu/libvla_gpu_bf16.so).
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-build/venv/bin/python}
VLA_GPU_LIBRARY=${VLA_GPU_LIBRARY:-}
GPU_LIBRARY=${GPU_LIBRARY:-${VLA_GPU_LIBRARY%%:*}}
GPU_LIBRARY=${GPU_LIBRARY:-build/emu/libvla_gpu_bf16.so}
T=$(mktemp -d "${TMPDIR:-/tmp}/test_bench_infer.XXXXXX")
trap 'rm -rf "$T"' EXIT
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }

run() {  # name, then bench arguments; output kept in $T/name.log
  local name=$1; shift
  local t0=$SECONDS
  if "$PY" dev/bench_infer.py --preset tiny --out-dir "$T" --json "$T/$name.json" "$@" >"$T/$name.log" 2>&1; then
    ok "$name runs ($((SECONDS - t0)) s): $(grep -E '^train_vla' "$T/$name.log" | tail -1)"
  else
    bad "$name exited non-zero; its log ends:"; tail -5 "$T/$name.log" | sed 's/^/     /'
  fi
}

check() {  # name, Python expression over the report `r` that must hold
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

run cpu --device cpu --chunks 3 --warmup 1 --threads 1
check cpu 'r["batch"] == 1 and r["cameras"] == [[224, 224], [224, 224]] and (r["state_dim"], r["action_dim"]) == (6, 5)'
check cpu 'r["config"]["n_cam"] == 2 and r["checkpoint_made"] and "fp32" in r["device"]'
check cpu 'r["runs"]["cpu"]["chunks_timed"] == 3 and 0 < r["runs"]["cpu"]["ms_per_chunk_min"] <= r["runs"]["cpu"]["ms_per_chunk_median"] <= r["runs"]["cpu"]["ms_per_chunk_p90"]'
check cpu 'r["infer"]["ms_per_chunk_median"] == r["runs"]["cpu"]["ms_per_chunk_median"]'

if [ ! -f "$GPU_LIBRARY" ]; then
  bad "gpu: no GPU library at $GPU_LIBRARY (make libvla_gpu.so, or build/emu/libvla_gpu_bf16.so without a GPU)"
else
  # warm-up 2: the first chunk runs the Euler steps one by one, the second captures the graph
  run gpu --library "$GPU_LIBRARY" --chunks 2 --warmup 2 --graphs both
  check gpu 'not r["checkpoint_made"] and set(r["runs"]) == {"graphs", "eager"}'
  check gpu 'all(x["chunks_timed"] == 2 and x["ms_per_chunk_median"] > 0 for x in r["runs"].values())'
  check gpu 'all(x["prefix_ms_median"] > 0 and x["steps_ms_median"] > 0 for x in r["runs"].values())'
  # counted only by the CPU emulation: the replayed graph is one launch, the steps one by one hundreds
  check gpu 'r["runs"]["eager"]["steps_launches"] is None or (r["runs"]["graphs"]["steps_launches"] == 1 and r["runs"]["eager"]["steps_launches"] > 100 and r["runs"]["graphs"]["prefix_launches"] == r["runs"]["eager"]["prefix_launches"] > 10)'
  # VLA_PROFILE_ACT=N: the library times its Nth act() call by phase and operation (its Euler steps
  # launched one by one), and the graph is still replayed by the calls after it
  VLA_PROFILE_ACT=3 run profile --library "$GPU_LIBRARY" --chunks 2 --warmup 2 --graphs on
  if grep -q '^profile of sampling call 3: ' "$T/profile.log" && grep -q '^| vision fwd ' "$T/profile.log" &&
     grep -q '^| euler steps ' "$T/profile.log" && grep -q '^| euler steps *| attention fwd ' "$T/profile.log" &&
     [ "$(grep -c '^profile of ' "$T/profile.log")" = 1 ]; then
    ok "VLA_PROFILE_ACT=3: one profile, of the third call, with the prefix's phases and the Euler steps' attention"
  else
    bad "VLA_PROFILE_ACT=3: no profile of the third call with its phases in $(grep -c '' "$T/profile.log") lines of output"
  fi
  check profile 'r["runs"]["graphs on"]["chunks_timed"] == 2'
  check profile 'r["runs"]["graphs on"]["steps_launches"] is None or r["runs"]["graphs on"]["steps_launches"] == 1'
  VLA_PROFILE_ACT=third run profile_bad --library "$GPU_LIBRARY" --chunks 1 --warmup 1 --graphs on
  grep -q 'VLA_PROFILE_ACT=third: expected the number' "$T/profile_bad.log" &&
    ok "VLA_PROFILE_ACT=third: $(grep 'VLA_PROFILE_ACT=third' "$T/profile_bad.log")" ||
    bad "VLA_PROFILE_ACT=third: no warning that names it"
fi

# pi0_tiny: the pi0 family's checkpoint (weights drawn in threads, written in train mode expert) on
# both libraries, one policy switched from the graph to launches
run pi0_cpu --preset pi0_tiny --device cpu --chunks 2 --warmup 1 --threads 1
check pi0_cpu 'r["config"]["family"] == 1 and r["config"]["train_mode"] == 0 and r["checkpoint_made"]'
check pi0_cpu 'r["config"]["n_cam"] == 2 and (r["config"]["state_dim"], r["config"]["action_dim"]) == (6, 5)'
check pi0_cpu 'r["runs"]["cpu"]["chunks_timed"] == 2 and r["runs"]["cpu"]["ms_per_chunk_median"] > 0'
if [ -f "$GPU_LIBRARY" ]; then
  run pi0_gpu --preset pi0_tiny --library "$GPU_LIBRARY" --chunks 2 --warmup 2 --graphs both
  check pi0_gpu 'not r["checkpoint_made"] and r["config"]["family"] == 1 and set(r["runs"]) == {"graphs", "eager"}'
  check pi0_gpu 'all(x["prefix_ms_median"] > 0 and x["steps_ms_median"] > 0 for x in r["runs"].values())'
  check pi0_gpu 'r["runs"]["eager"]["steps_launches"] is None or (r["runs"]["graphs"]["steps_launches"] == 1 and r["runs"]["eager"]["steps_launches"] > 100 and r["runs"]["graphs"]["prefix_launches"] == r["runs"]["eager"]["prefix_launches"] > 10)'
fi

# a checkpoint that is not there: one clear line, non-zero
if "$PY" dev/bench_infer.py --device cpu --checkpoint build/test/missing.bin >"$T/bad.log" 2>&1; then
  bad "a missing checkpoint: accepted"
else
  grep -q "cannot open checkpoint" "$T/bad.log" && ok "a missing checkpoint: $(tail -1 "$T/bad.log")" || \
    bad "a missing checkpoint: $(tail -3 "$T/bad.log")"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
