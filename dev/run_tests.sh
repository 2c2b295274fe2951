#!/usr/bin/env bash
# Runs every test suite this machine can run (what `make test` calls once everything is built),
# shows each suite's output, and closes with the total as `N passed, M failed`.
# Each suite ends with its own `N passed, M failed` line and exits non-zero on a failure.
set -u
cd "$(dirname "$0")/.."
VENV_PY=${VENV_PY:-build/venv/bin/python}
ORACLE_PY=${ORACLE_PY:-/usr/bin/python3}
LEROBOT_PY=${LEROBOT_PY:-build/lerobot-venv/bin/python}
total_passed=0
total_failed=0
failed_suites=""
suite_times=""  # one line per suite: its wall time, for keeping CI within its budget

run_suite() {
    local name=$1
    shift
    echo
    echo "######## $name: $*"
    local log t0=$SECONDS
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    suite_times="$suite_times$(printf '%5d s  %s' $((SECONDS - t0)) "$name")
"
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    rm -f "$log"
    if [ -z "$line" ]; then
        echo "######## $name: ended (exit $rc) without its summary line: counted as one failure"
        total_failed=$((total_failed + 1))
        failed_suites="$failed_suites $name"
        return
    fi
    local p f
    p=$(echo "$line" | awk '{print $1}')
    f=$(echo "$line" | awk '{print $3}')
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then total_failed=$((total_failed + 1)); fi
    if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then failed_suites="$failed_suites $name"; fi
}

run_suite test_vla ./test_vla build/test build/lerobot_ref
run_suite learning dev/test_learning.sh
run_suite hardening dev/test_hardening.sh
# each fuzz harness for 15 s from the seeds (make fuzz runs them for minutes and keeps a corpus;
# FUZZ_TEST_SECONDS overrides)
run_suite fuzz dev/fuzz/run_fuzz.sh "${FUZZ_TEST_SECONDS:-15}"
# the GPU trainer's tests and the dev/cuda kernel checks: on the GPU (GPU_TESTS=build/gpu, the
# dev/cuda programs built by dev/cuda/Makefile, benchmarks included) or under the CPU emulation
# of CUDA (GPU_TESTS=build/emu, where the emulation's own tests run first)
GPU_TESTS=${GPU_TESTS:-build/emu}
if [ "$GPU_TESTS" = build/emu ]; then
    run_suite cuda_emulation build/emu/dev/cuda/emu/test_emulate
    dev_cuda_dir=build/emu/dev/cuda
else
    dev_cuda_dir=dev/cuda
fi
# (--smolvla: the model against LeRobot's own references; build/test/s_<mode>_state.bin, the
# oracle's debug states, are checked when present, AdamW steps included; the bf16 suite also
# compares -g 1 through NCCL with the trainer built without NCCL)
run_suite test_vla_gpu_fp32 "$GPU_TESTS/test_vla_gpu_fp32" build/test "$GPU_TESTS/train_vla_fp32" --smolvla build/lerobot_ref
# Under the emulation the bf16 suite leaves out three groups whose code no precision changes (the
# NCCL faults, checkpoints across trainers, task-balanced sampling): the fp32 suite runs them, and
# CI's time goes to what bf16 does differently. On a GPU it runs them all.
bf16_skip=
if [ "$GPU_TESTS" = build/emu ]; then bf16_skip=faults,cross_trainer,balance; fi
run_suite test_vla_gpu_bf16 env VLA_GPU_SKIP="$bf16_skip" "$GPU_TESTS/test_vla_gpu_bf16" build/test \
    "$GPU_TESTS/train_vla_bf16" "$GPU_TESTS/train_vla_single_gpu_bf16" --smolvla build/lerobot_ref
# fp16 (PRECISION=FP16, for GPUs without bf16): what its precision and its loss scaling change,
# kept short: the oracle's train mode all (every gradient, the vision tower's too, sampling and 10
# loss-scaled AdamW steps at fp16's tolerances), an injected overflow, the scale's rules and
# resume restoring it. The plumbing it shares with bf16 is tested above;
# VLA_GPU_TESTS=oracle,lerobot,fp16 runs all six SmolVLA cases in fp16.
run_suite test_vla_gpu_fp16 env VLA_GPU_TESTS=oracle:all,fp16 "$GPU_TESTS/test_vla_gpu_fp16" build/test \
    "$GPU_TESTS/train_vla_fp16" --smolvla build/lerobot_ref
for src in dev/cuda/*.cu; do
    name=$(basename "$src" .cu)
    run_suite "dev/cuda/$name" "$dev_cuda_dir/$name"
done
# the device resize (dev/cuda/resize_pad.cu) against LeRobot's own resize_with_pad, through torch
run_suite dev/cuda/resize_pad_check bash -c "$dev_cuda_dir/resize_pad --dump build/resize_pad.dump && \
    $LEROBOT_PY dev/cuda/resize_pad_check.py build/resize_pad.dump"
run_suite launchers env GPU_TESTS="$GPU_TESTS" scripts/test_launchers.sh
run_suite metaworld "$VENV_PY" data/test_metaworld.py
run_suite lerobot "$VENV_PY" data/test_lerobot.py
run_suite inspect "$VENV_PY" data/test_inspect.py
run_suite policy "$ORACLE_PY" scripts/test_policy.py
# LeRobot's own references re-checked through LeRobot
run_suite lerobot_ref "$LEROBOT_PY" dev/lerobot/check_ref.py -d build/lerobot_ref
# LeRobot policies into train_vla checkpoints and back (scripts/import_lerobot.py, export_lerobot.py):
# weights, header, LeRobot's and train_vla's actions after a round trip and after --init fine-tuning
run_suite lerobot_io "$LEROBOT_PY" scripts/test_lerobot_io.py
# the plain LeRobot-faithful oracle of the math (dev/smolvla.py) against those references
run_suite smolvla_oracle "$ORACLE_PY" dev/test_smolvla.py build/lerobot_ref
# the PyTorch oracle with vla.h's plumbing (dev/model.py): vla.h's table, init and noise, LeRobot's
# references, the C trainer's checkpoints continued
run_suite model "$ORACLE_PY" dev/test_model.py build/lerobot_ref
# LeRobot's own SmolVLA training step and inference, timed (the GPU comparison's peer; here a smoke run)
run_suite lerobot_bench env LEROBOT_PYTHON="$LEROBOT_PY" dev/lerobot/test_bench.sh
# train_vla's own inference benchmark (dev/bench_infer.py, the comparison's other side): a smoke run
# on the CPU library and the GPU library ($VLA_GPU_LIBRARY's first: the emulated build without a GPU)
run_suite infer_bench env PYTHON="$ORACLE_PY" dev/test_bench_infer.sh
# DataParallel against DDP (dev/dp_vs_ddp.py): the modelled tables' consistency, and the measured
# code path (torch DP, torch DDP over gloo) on the CPU at the tiny preset
run_suite dp_vs_ddp env PYTHON="$ORACLE_PY" dev/test_dp_vs_ddp.sh
run_suite eval "$VENV_PY" scripts/test_eval.py

echo
echo "wall time per suite:"
printf '%s' "$suite_times"
if [ -n "$failed_suites" ]; then echo "failed suites:$failed_suites"; fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
