#!/usr/bin/env bash
# dev/gpu_check.sh without a GPU: the stages it would run, in order (DRY_RUN=1), STAGES' filter,
# BUDGET's check and the tables printed from no logs. GPU calls are few and short here, so a
# mistake in the script should show in make test, not in a call's minutes.
set -u
cd "$(dirname "$0")/.." || exit 2
out=build/test_gpu_check
rm -rf "$out"
mkdir -p "$out"
passed=0
failed=0
check() {  # check DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then
        echo "ok   $what"
        passed=$((passed + 1))
    else
        echo "FAIL $what"
        failed=$((failed + 1))
    fi
}

DRY_RUN=1 dev/gpu_check.sh "$out/all" > "$out/all.log" 2>&1
rc=$?
check "DRY_RUN=1 dev/gpu_check.sh exits 0 (exit $rc)" [ $rc -eq 0 ]
mapfile -t stages < <(sed -n 's/^stage \([a-z0-9_]*\): .*/\1/p' "$out/all.log")
echo "     ${#stages[@]} stages: ${stages[*]}"
# where a stage stands in the list (-1 if absent)
at() {
    local i
    for i in "${!stages[@]}"; do
        [ "${stages[$i]}" = "$1" ] && { echo "$i"; return; }
    done
    echo -1
}
in_order() {  # each named stage present, and after the one before it
    local prev=-1 name i
    for name in "$@"; do
        i=$(at "$name")
        [ "$i" -gt "$prev" ] || { echo "     $name at $i, after position $prev?"; return 1; }
        prev=$i
    done
}
check "issue 12's figures first: train_vla, LeRobot's bf16 step, the bf16 tests, torch.compile, LeRobot's defaults" \
    in_order build_bench bench_train_vla_expert bench_train_vla_all profile_expert profile_all attention_bench \
    lerobot_expert_bf16 lerobot_all_bf16 build_tests_bf16 test_gpu_bf16 bench_torch_compile_expert \
    bench_torch_compile_all lerobot_expert_none lerobot_all_none
check "then inference, the other precisions' tests, the dev/cuda programs and the short checks" \
    in_order lerobot_all_none bench_infer lerobot_infer_none build_tests test_gpu_fp32 test_gpu_fp16 cuda_registers \
    cuda_adamw cuda_time_mlp lerobot_infer_bf16 train_default launchers bench_recompute_attn bench_recompute_layer \
    balance_default
n_cuda=$(find dev/cuda -maxdepth 1 -name '*.cu' | wc -l)
n_cuda_stages=$(printf '%s\n' "${stages[@]}" | grep -c '^cuda_[a-z0-9_]*$' )
check "a stage per dev/cuda program and cuda_registers ($n_cuda_stages for $n_cuda programs)" \
    [ "$n_cuda_stages" -eq $((n_cuda + 1)) ]
dups=$(printf '%s\n' "${stages[@]}" | sort | uniq -d | tr '\n' ' ')
check "no stage twice${dups:+: $dups}" [ -z "$dups" ]
check "the torch.compile stages compile per layer (dev/model.py --compile)" \
    grep -q '^stage bench_torch_compile_expert: .*dev/model.py .*--compile$' "$out/all.log"
for mode in expert all; do
    check "the --train $mode table has train_vla, torch.compile and both LeRobot rows" \
        bash -c "awk '/^--train $mode:/ {on = 1; next} on && /^\$/ {exit} on' '$out/all/table.txt' > '$out/$mode.rows' &&
                 grep -q '^| train_vla (bf16' '$out/$mode.rows' && grep -q 'torch.compile (per layer)' '$out/$mode.rows' &&
                 grep -q 'LeRobot 0.6.1 (defaults, fp32)' '$out/$mode.rows' &&
                 grep -q 'LeRobot 0.6.1 (bf16 mixed precision)' '$out/$mode.rows'"
done
check "device.txt, summary.txt and table.txt written to OUTDIR" \
    test -f "$out/all/device.txt" -a -f "$out/all/summary.txt" -a -f "$out/all/table.txt"

DRY_RUN=1 STAGES='^bench_torch_compile_' dev/gpu_check.sh "$out/some" > "$out/some.log" 2>&1
listed=$(sed -n 's/^stage \([a-z0-9_]*\): .*/\1/p' "$out/some.log" | tr '\n' ' ')
check "STAGES='^bench_torch_compile_' lists those two alone ($listed)" \
    [ "$listed" = "bench_torch_compile_expert bench_torch_compile_all " ]

DRY_RUN=1 BUDGET=9x dev/gpu_check.sh "$out/bad" > "$out/bad.log" 2>&1
rc=$?
check "BUDGET=9x: exit 2 and one line that names it ($(head -n 1 "$out/bad.log"))" \
    bash -c "[ $rc -eq 2 ] && [ \$(wc -l < '$out/bad.log') -eq 1 ] && grep -q '^error: BUDGET=9x' '$out/bad.log'"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
