#!/usr/bin/env bash
# The attention kernels' checks under compute-sanitizer (racecheck, initcheck, memcheck) on a GPU,
# without the benchmarks, each tool's log in OUTDIR: every case (the masked calls' too), or with
# VISION_ONLY=1 the vision tower's alone (65 s for the three tools on an H100).
#   dev/cuda/sanitize_attention.sh [OUTDIR]     (default: $OUT if set, else build/sanitize)
#   TOOLS='racecheck memcheck' VISION_ONLY=1 dev/cuda/sanitize_attention.sh
# Exits non-zero if the build fails, a check fails or a tool reports an error. It builds through
# dev/cuda/Makefile (nvcc -O3 -std=c++17 -arch=<this GPU's> attention_smolvla.cu -lcublasLt ...).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUTDIR=${1:-${OUT:-build/sanitize}}
TOOLS=${TOOLS:-racecheck initcheck memcheck}
LIMIT=${LIMIT:-150}  # seconds a tool may take
mkdir -p "$OUTDIR"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
make -C dev/cuda attention_smolvla > "$OUTDIR/build.log" 2>&1 || { tail -20 "$OUTDIR/build.log"; exit 1; }
export DEV_NO_BENCH=1 ATTENTION_VISION_ONLY=${VISION_ONLY:-0}
status=0
dev/cuda/attention_smolvla > "$OUTDIR/plain.log" 2>&1 || status=1
grep -E '^ FAIL|passed' "$OUTDIR/plain.log"
for tool in $TOOLS; do
    extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    timeout "$LIMIT" "$SAN" --tool "$tool" "${extra[@]}" --print-limit 20 dev/cuda/attention_smolvla > "$OUTDIR/$tool.log" 2>&1
    rc=$?
    echo "== $tool: exit $rc"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard|Error|Invalid|Uninitialized' "$OUTDIR/$tool.log" | head -12
    [ "$rc" -eq 0 ] || status=1
done
exit $status
