#!/usr/bin/env bash
# Smoke test of dev/dp_vs_ddp.py (DataParallel against DDP): its modelled tables must hold together
# (bytes from the model's sizes, N = 1 equal to one GPU's step, DP slower than DDP on every
# machine), --from-log must take a log's step time, --measure without two GPUs must say so and exit
# 0, and the measured code path (torch DP and torch DDP over gloo, 2 processes) must run on the CPU
# at the tiny preset. A few seconds; no timing claims.
#   tests/bench/test_dp_vs_ddp.sh        # last line: "N passed, M failed"; non-zero on failure
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-build/venv/bin/python}
T=$(mktemp -d "${TMPDIR:-/tmp}/test_dp_vs_ddp.XXXXXX")
trap 'rm -rf "$T"' EXIT
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }

run() {  # name, then dp_vs_ddp.py's arguments; output in $T/name.log
  local name=$1; shift
  if "$PY" dev/dp_vs_ddp.py "$@" >"$T/$name.log" 2>&1; then
    ok "$name runs: $*"
  else
    bad "$name exited non-zero ($*); its log ends:"; tail -3 "$T/$name.log" | sed 's/^/     /'
  fi
}

# checks prints one "ok ..." or "FAIL ..." line per check over the rows of the logs it is given
checks() {
  "$PY" - "$@" <<'PY'
import sys
def rows(path):
    out = []
    for line in open(path):
        if line.startswith("row "):
            r = dict(kv.split("=") for kv in line.split()[1:])
            out.append({k: (v if k in ("mode", "link") else float(v)) for k, v in r.items()})
    return out
fp32, bf16, logged, trainable = (rows(p) for p in sys.argv[1:5])
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
def close(x, y, rel=1e-9):  # the script prints bytes as whole numbers and times to 1 ns
    return abs(x - y) <= rel * max(abs(x), abs(y), 1.0) + 0.5e-6
check(len(fp32) == 2 * 2 * 4 and len(bf16) == len(fp32), f"{len(fp32)} rows: expert and all, 2 machines, N = 1, 2, 4, 8")
sizes = {r["mode"]: (r["weights"], r["trainable"]) for r in fp32}
check(abs(sizes["expert"][0] - 402.7e6) < 0.05e6 and abs(sizes["expert"][1] - 99.9e6) < 0.05e6
      and abs(sizes["all"][1] - 392.9e6) < 0.05e6, f"the smolvla sizes (README): {sizes}")
for r in fp32:
    n, W, G, tag = r["n"], r["weights"], r["trainable"], f"{r['mode']} {r['link']} N={r['n']:.0f}"
    check(close(r["ddp_gpu"], 2 * (n - 1) / n * 4 * G, 1e-6) and close(r["ddp_total"], n * r["ddp_gpu"], 1e-6)
          and r["ddp_gpu"] < 2 * 4 * G,
          f"{tag}: DDP sends 2 (N-1)/N x 4 x trainable per GPU ({r['ddp_gpu']:.0f}), under 2 x 4 x trainable")
    # per sample: two 224 px u8 frames, 48 tokens (int32 + u8 mask), state 32, actions and noise
    # 50 x 32 (fp32), 50 padding flags, t; out: the velocity 50 x 32 fp32, and its gradient back
    io = (n - 1) * r["batch"] * (2 * 224 * 224 * 3 + 48 * 5 + 4 * 32 + 2 * 4 * 50 * 32 + 50 + 4 + 2 * 4 * 50 * 32)
    check(r["dp_grads"] == 4 * W and close(r["dp_total"], (n - 1) * (4 * W + 4 * W) + io, 1e-6)
          and close(r["dp_gpu0"], (4 * W + 4 * W + io) if n > 1 else 0, 1e-6),
          f"{tag}: DP moves (N-1) x (fp32 weights + every weight's gradient) + the batch and outputs "
          f"({r['dp_total']:.0f}), GPU 0's link each once + the batch and outputs ({r['dp_gpu0']:.0f})")
    if n == 1:
        check(r["dp_total"] == r["dp_gpu0"] == r["ddp_total"] == 0 and close(r["dp_ms"], r["t1_ms"])
              and close(r["ddp_ms"], r["t1_ms"]), f"{tag}: nothing moves, both steps are the one-GPU step {r['t1_ms']:.1f} ms")
    else:
        check(r["dp_ms"] >= r["t1_ms"] + r["dp_broadcast_ms"] + r["dp_reduce_ms"] - 1e-6 and r["dp_ms"] > r["ddp_ms"]
              and close(r["ddp_ms"], r["t1_ms"] + r["ddp_exposed_ms"], 1e-6),
              f"{tag}: DP {r['dp_ms']:.1f} ms adds its transfers whole, DDP {r['ddp_ms']:.1f} ms only the exposed part")
for mode in ("expert", "all"):
    for link in ("nvlink4", "pcie4"):
        sel = sorted((r for r in fp32 if r["mode"] == mode and r["link"] == link), key=lambda r: r["n"])
        check(all(a["dp_gpu0"] < b["dp_gpu0"] and a["dp_total"] < b["dp_total"] and a["ddp_gpu"] < b["ddp_gpu"]
                  for a, b in zip(sel, sel[1:])), f"{mode} {link}: DP's bytes (GPU 0's and all) grow with N")
for a, b in zip(fp32, bf16):
    check(close(a["dp_total"] - b["dp_total"], (a["n"] - 1) * 2 * 2 * a["weights"], 1e-6)
          and a["ddp_total"] == b["ddp_total"],
          f"{a['mode']} {a['link']} N={a['n']:.0f}: --dp-weights bf16 halves DP's broadcast and reduce, not DDP's bytes")
for a, b in zip(fp32, trainable):
    check(b["dp_grads"] == 4 * b["trainable"] and b["dp_ms"] <= a["dp_ms"]
          and close(a["dp_total"] - b["dp_total"], (a["n"] - 1) * 4 * (a["weights"] - a["trainable"]), 1e-6),
          f"{a['mode']} {a['link']} N={a['n']:.0f}: --dp-grads trainable reduces the trainable gradients only")
check(all(close(r["t1_ms"], 42.5 if r["mode"] == "expert" else 120.0) for r in logged) and len(logged) == 16,
      "--from-log takes each log's mode and mean step time (42.5 and 120.0 ms)")
PY
}

run modelled --rows --links nvlink4,pcie4
grep -q "^# MODELLED, not measured" "$T/modelled.log" && ok "its output says MODELLED, not measured" \
  || bad "no 'MODELLED, not measured' line"
# --measure where there are not two GPUs (nvidia-smi's count, cheaper than importing torch) says so and exits 0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
measure=()
if [ "$gpus" -lt 2 ]; then measure=(--measure); fi
run bf16 --rows --links nvlink4,pcie4 --dp-weights bf16 "${measure[@]}"
if [ "$gpus" -lt 2 ]; then
  grep -q "^--measure: needs at least 2 CUDA GPUs" "$T/bf16.log" && ok "--measure without 2 GPUs: $(tail -1 "$T/bf16.log")" \
    || bad "--measure without 2 GPUs did not say so"
fi
for mode in expert all; do  # a one-GPU train_vla log's lines that --from-log reads
  ms=$([ $mode = expert ] && echo 42.5 || echo 120.0)
  printf '| train mode (--train)   | %-36s |\n| GPUs x batch x accum   | 1 x 32 x 1 |\nmean step time %s ms over 29 steps\n' \
    "$mode" "$ms" > "$T/$mode.log"
done
run trainable --rows --links nvlink4,pcie4 --dp-grads trainable
run logged --rows --links nvlink4,pcie4 --from-log "$T/expert.log" --from-log "$T/all.log"
checks "$T/modelled.log" "$T/bf16.log" "$T/logged.log" "$T/trainable.log" > "$T/checks.out" 2>&1
cat "$T/checks.out"
PASS=$((PASS + $(grep -c '^ok ' "$T/checks.out")))
FAIL=$((FAIL + $(grep -c '^FAIL ' "$T/checks.out")))
grep -qE '^(ok|FAIL) ' "$T/checks.out" || bad "the checks printed nothing: $(tail -1 "$T/checks.out")"

# a mistake ends in one line and a non-zero exit
if "$PY" dev/dp_vs_ddp.py -b 16 --from-log "$T/expert.log" >"$T/bad.log" 2>&1; then bad "-b 16 with a batch-32 log accepted"
else ok "-b 16 with a batch-32 log refused: $(tail -1 "$T/bad.log")"; fi

# the measured code path on the CPU: torch DP (one device) and torch DDP over gloo, 2 processes
run cpu -p tiny --links nvlink4 --train expert --gpus 2 --measure --cpu -b 1 --steps 1 --warmup 0 --frame-px 32
grep -qE '^\| 2 \| [0-9.]+ ms \| [0-9]+ \| [0-9.]+ ms \| [0-9]+ \| [0-9.]+x' "$T/cpu.log" \
  && ok "torch DP and torch DDP (gloo, 2 processes) each timed a step: $(grep -E '^\| 2 \|' "$T/cpu.log" | tail -1)" \
  || bad "no measured row on the CPU"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
