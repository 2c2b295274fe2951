#!/usr/bin/env bash
# Runs every test suite this machine can run (what `make test` calls once everything is built),
# shows each suite's output, and closes with the total as `N passed, M failed`.
# Each suite ends with its own `N passed, M failed` line and exits non-zero on a failure.
#
# The suites are independent (each writes its own files), so they run TEST_JOBS at a time: a
# worker takes the next suite of the list below as soon as its last one ends, and each suite's
# output is shown whole when it ends. The list starts with the longest suites so that the workers
# end together. Without a GPU most suites are single-threaded (the CUDA emulation above all), so
# TEST_JOBS defaults to 2 there; on a GPU it defaults to 1 (one GPU for every suite).
# TEST_JOBS=1 runs them one after another in the list's order.
set -u
cd "$(dirname "$0")/.." || exit 2
VENV_PY=${VENV_PY:-build/venv/bin/python}
LEROBOT_PY=${LEROBOT_PY:-build/lerobot-venv/bin/python}
GPU_TESTS=${GPU_TESTS:-build/emu}
if [ "$GPU_TESTS" = build/emu ]; then default_jobs=2; else default_jobs=1; fi
TEST_JOBS=${TEST_JOBS:-$default_jobs}
if ! [[ "$TEST_JOBS" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: TEST_JOBS=$TEST_JOBS: expected a positive number of suites to run at once (e.g. TEST_JOBS=2)"
    exit 2
fi

suite_names=()
suite_cmds=()
# add_suite NAME COMMAND...: one suite, run later by a worker
add_suite() {
    local name=$1
    shift
    suite_names+=("$name")
    suite_cmds+=("$(printf '%q ' "$@")")
}

# ---- the suites, longest first (their wall times on a 2-core machine are in docs/performance.md)
# The three test_vla_gpu suites write runs of the same names, so each works in a folder of its own,
# build/test/<precision>, which links to the fixtures that `make test` puts in build/test.
gpu_suite_dir() {
    local dir=build/test/$1 f
    mkdir -p "$dir"
    for f in a.bin b.bin s.bin a_train.txt a_pi0_train.txt s_expert_state.bin s_vlm_state.bin s_all_state.bin; do
        ln -sfn "../$f" "$dir/$f"
    done
    echo "$dir"
}
# the GPU trainer's tests and the dev/cuda kernel checks: on the GPU (GPU_TESTS=build/gpu, the
# dev/cuda programs built by dev/cuda/Makefile, benchmarks included) or under the CPU emulation
# of CUDA (GPU_TESTS=build/emu, where the emulation's own tests run too)
# (--smolvla, --pi0: the model against LeRobot's own references; build/test/s_<mode>_state.bin, the
# oracle's debug states, are checked when present, AdamW steps included; the bf16 suite also
# compares -g 1 through NCCL with the trainer built without NCCL)
add_suite test_vla_gpu_fp32 "$GPU_TESTS/test_vla_gpu_fp32" "$(gpu_suite_dir fp32)" "$GPU_TESTS/train_vla_fp32" --smolvla build/lerobot_ref \
    --pi0 build/lerobot_ref_pi0
# Under the emulation the bf16 suite leaves out three groups whose code no precision changes (the
# NCCL faults, checkpoints across trainers, task-balanced sampling): the fp32 suite runs them, and
# CI's time goes to what bf16 does differently. On a GPU it runs them all.
bf16_skip=
if [ "$GPU_TESTS" = build/emu ]; then bf16_skip=faults,cross_trainer,balance; fi
add_suite test_vla_gpu_bf16 env VLA_GPU_SKIP="$bf16_skip" "$GPU_TESTS/test_vla_gpu_bf16" "$(gpu_suite_dir bf16)" \
    "$GPU_TESTS/train_vla_bf16" "$GPU_TESTS/train_vla_single_gpu_bf16" --smolvla build/lerobot_ref --pi0 build/lerobot_ref_pi0
# fp16 (PRECISION=FP16, for GPUs without bf16): what its precision and its loss scaling change,
# kept short: the oracle's train mode all (every gradient, the vision tower's too, sampling and 10
# loss-scaled AdamW steps at fp16's tolerances), an injected overflow, the scale's rules and
# resume restoring it. The plumbing it shares with bf16 is tested above;
# VLA_GPU_TESTS=oracle,lerobot,fp16 runs all six SmolVLA cases in fp16.
add_suite test_vla_gpu_fp16 env VLA_GPU_TESTS=oracle:all,fp16 "$GPU_TESTS/test_vla_gpu_fp16" "$(gpu_suite_dir fp16)" \
    "$GPU_TESTS/train_vla_fp16" --smolvla build/lerobot_ref
# The emulation runs a block's threads one at a time, warp 0 first; CUDA_EMU_SCHEDULE=reverse runs
# the last warp first, where a missing barrier or cp.async wait that the first order hides shows
# (dev/cuda/emu/emulate.h). The trainer's kernels the other way round: the checks against LeRobot's
# references in bf16 (the flash attention of version 4) and in fp32 (its own attention and
# reductions), train modes expert (its state-only path back through the frozen VLM) and all (every
# other kernel: vlm's are all's without the vision tower's backward); the dev/cuda programs follow below
if [ "$GPU_TESTS" = build/emu ]; then
    for precision in bf16 fp32; do
        add_suite "test_vla_gpu_${precision}_reverse" env CUDA_EMU_SCHEDULE=reverse VLA_GPU_TESTS=lerobot:expert,lerobot:all \
            "build/emu/test_vla_gpu_$precision" "$(gpu_suite_dir "${precision}_reverse")" "build/emu/train_vla_$precision" \
            --smolvla build/lerobot_ref
    done
fi
# A machine with one GPU: the groups that use several say what they skip and run what one GPU
# can (the checks that a real single-GPU machine must pass)
if [ "$GPU_TESTS" = build/emu ]; then
    add_suite test_vla_gpu_one_gpu env CUDA_EMU_DEVICES=1 VLA_GPU_TESTS=multi_gpu,faults,cross_trainer,balance \
        build/emu/test_vla_gpu_fp32 "$(gpu_suite_dir one_gpu)" build/emu/train_vla_fp32
fi
# the PyTorch oracle with vla/'s plumbing (dev/model.py): vla/config.h's table and init, vla/rng.h's noise, LeRobot's
# references, the C trainer's checkpoints continued
add_suite model "$VENV_PY" tests/model/test_model.py build/lerobot_ref
# LeRobot's own SmolVLA training step and inference, timed (the GPU comparison's peer; here a smoke run)
add_suite lerobot_bench env LEROBOT_PYTHON="$LEROBOT_PY" tests/bench/test_lerobot_bench.sh
# the other peer, the oracle's benchmark path (scaled_dot_product_attention, torch.compile)
add_suite oracle_bench "$VENV_PY" tests/bench/test_oracle_bench.py build/test/s.bin
add_suite metaworld "$VENV_PY" tests/data/test_metaworld.py
add_suite learning tests/runs/test_learning.sh
add_suite eval "$VENV_PY" tests/eval/test_eval.py
# each fuzz harness briefly from the seeds: the shard, checkpoint and policy readers for 15 s,
# several shards as one dataset, safetensors, log.jsonl, checkpoint names and the bootstrap's
# messages for 10 s (make fuzz runs them for minutes and keeps a corpus; FUZZ_TEST_SECONDS sets
# one time for all)
if [ -n "${FUZZ_TEST_SECONDS:-}" ]; then
    add_suite fuzz dev/fuzz/run_fuzz.sh "$FUZZ_TEST_SECONDS"
else
    add_suite fuzz dev/fuzz/run_fuzz.sh 15 shard checkpoint policy shards:10 safetensors:10 log:10 names:10 boot:10
fi
# the Python safetensors readers (dev/safetensors_format.py, the oracle's, the import's) on mutated files
add_suite fuzz_safetensors_py "$VENV_PY" dev/fuzz/fuzz_safetensors_py.py --seconds 15
add_suite policy "$VENV_PY" tests/policy/test_policy.py --family smolvla
# LeRobot policies into train_vla checkpoints and back (scripts/import_lerobot.py, export_lerobot.py):
# weights, header, LeRobot's and train_vla's actions after a round trip and after --init fine-tuning
add_suite lerobot_io "$LEROBOT_PY" tests/lerobot/test_lerobot_io.py --family smolvla
# pi0 policies through the same scripts: --sizes, both lm_heads, bf16 and fp32 sources, a fine-tune on
# 4 simulated ranks with ZeRO-1 against 1 rank, exported and reloaded by LeRobot
add_suite lerobot_io_pi0 "$LEROBOT_PY" tests/lerobot/test_lerobot_io.py --family pi0
# pi0's tokens (LeRobot's pi0 pre-processor on a PaliGemma-kind tokenizer) and pi0 served from raw
# observations by the CPU and GPU policy libraries, each camera missing in turn
add_suite policy_pi0 "$LEROBOT_PY" tests/policy/test_policy.py --family pi0
# DataParallel against DDP (dev/dp_vs_ddp.py): the modelled tables' consistency, and the measured
# code path (torch DP, torch DDP over gloo) on the CPU at the tiny preset
add_suite dp_vs_ddp env PYTHON="$VENV_PY" tests/bench/test_dp_vs_ddp.sh
# LeRobot's own references (SmolVLA, pi0) re-checked through LeRobot
add_suite lerobot_ref "$LEROBOT_PY" dev/lerobot/check_ref.py --family smolvla -d build/lerobot_ref
add_suite lerobot_ref_pi0 "$LEROBOT_PY" dev/lerobot/check_ref.py --family pi0 -d build/lerobot_ref_pi0
add_suite hardening tests/runs/test_hardening.sh
# the run folder's promises: one owner, the folder checked before each write, nothing of an earlier
# run dropped (--new-run, -y 1's rules), signals, -i inside -o
add_suite runs env GPU_TESTS="$GPU_TESTS" tests/runs/test_runs.sh
# the README's quick start, run as written in its order (small step counts; the GPU lines emulated without a GPU)
add_suite quickstart env GPU_TESTS="$GPU_TESTS" tests/runs/test_quickstart.sh
# a dataset LeRobot writes itself (its dataset extra), converted by its hub id and compared frame by frame
add_suite lerobot_dataset "$LEROBOT_PY" tests/lerobot/test_lerobot_dataset.py
# TensorBoard's event file of both trainers, read back with tensorboard's own reader; --eval-every's results in it
add_suite tensorboard "$VENV_PY" tests/runs/test_tensorboard.py ./train_vla_cpu "$GPU_TESTS/train_vla_fp32"
if [ "$GPU_TESTS" = build/emu ]; then
    dev_cuda_dir=build/emu/dev/cuda
else
    dev_cuda_dir=dev/cuda
fi
# the device resize (dev/cuda/resize_pad.cu) against LeRobot's own resize_with_pad, through torch
add_suite dev/cuda/resize_pad_check bash -c "$dev_cuda_dir/resize_pad --dump build/resize_pad.dump && \
    $LEROBOT_PY dev/cuda/resize_pad_check.py build/resize_pad.dump"
add_suite lerobot "$VENV_PY" tests/data/test_lerobot.py
add_suite launchers env GPU_TESTS="$GPU_TESTS" tests/runs/test_launchers.sh
# dev/gpu_check.sh's stages in order and its tables, with nothing run (DRY_RUN=1)
add_suite gpu_check_dry tests/bench/test_gpu_check.sh
add_suite test_vla ./test_vla build/test build/lerobot_ref build/lerobot_ref_pi0
# train_vla's own inference benchmark (dev/bench_infer.py, the comparison's other side): a smoke run
# on the CPU library and the GPU library ($VLA_GPU_LIBRARY's first: the emulated build without a GPU)
add_suite infer_bench env PYTHON="$VENV_PY" tests/bench/test_bench_infer.sh
add_suite inspect "$VENV_PY" tests/data/test_inspect.py
# hub ids (lerobot/pusht, lerobot/smolvla_base) found in fake HF and LeRobot caches (data/hub_cache.py), the
# folders against huggingface_hub's and LeRobot's own constants, and the tools that take hub ids
add_suite hub_cache env LEROBOT_PY="$LEROBOT_PY" "$VENV_PY" tests/data/test_hub_cache.py
# the plain LeRobot-faithful oracle of the math (dev/smolvla.py) against those references
add_suite smolvla_oracle "$VENV_PY" tests/model/test_smolvla.py build/lerobot_ref
# ptxas's register counts of train_vla.cu's kernels against their __launch_bounds__ (a failure the
# emulation cannot show: blocks too large for a kernel's registers do not launch on a GPU)
add_suite cuda_registers dev/cuda/check_registers.sh build/gpu/registers_bf16.txt build/gpu/registers_fp32.txt \
    build/gpu/registers_fp16.txt
# the emulation's own tests (without a GPU), then each dev/cuda program's checks
if [ "$GPU_TESTS" = build/emu ]; then add_suite cuda_emulation build/emu/dev/cuda/emu/test_emulate; fi
for src in dev/cuda/*.cu; do
    name=$(basename "$src" .cu)
    add_suite "dev/cuda/$name" "$dev_cuda_dir/$name"
    if [ "$GPU_TESTS" = build/emu ]; then
        add_suite "dev/cuda/$name:reverse" env CUDA_EMU_SCHEDULE=reverse "$dev_cuda_dir/$name"
    fi
done

# ---- the workers
n=${#suite_names[@]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo 0 > "$work/next"
t_start=$SECONDS
echo "running ${n} suites, ${TEST_JOBS} at a time (TEST_JOBS); each suite's output is shown when it ends"

# worker: takes the next suite from the list until none is left; a suite's output goes to its own
# log, shown whole under the print lock when the suite ends
worker() {
    local i t0 rc secs
    while :; do
        # shellcheck disable=SC2016  # (the inner shell expands them)
        i=$(flock "$work/queue.lock" sh -c 'i=$(cat "$1"); echo $((i + 1)) > "$1"; echo "$i"' sh "$work/next")
        [ "$i" -lt "$n" ] || return 0
        t0=$SECONDS
        eval "${suite_cmds[$i]}" > "$work/$i.log" 2>&1 < /dev/null
        rc=$?
        secs=$((SECONDS - t0))
        echo "$rc $secs" > "$work/$i.end"
        # shellcheck disable=SC2016
        flock "$work/print.lock" sh -c 'echo; echo "######## $1: $2"; cat "$3"; echo "######## $1: ended (exit $4) after $5 s"' \
            sh "${suite_names[$i]}" "${suite_cmds[$i]}" "$work/$i.log" "$rc" "$secs"
    done
}
pids=()
for ((w = 0; w < TEST_JOBS; w++)); do
    worker &
    pids+=($!)
done
wait "${pids[@]}"

# ---- the tally, in the list's order
total_passed=0
total_failed=0
failed_suites=""
suite_times=""  # one line per suite: its wall time, for keeping CI within its budget
for ((i = 0; i < n; i++)); do
    name=${suite_names[$i]}
    if [ ! -f "$work/$i.end" ]; then
        echo "######## $name: never ran: counted as one failure"
        total_failed=$((total_failed + 1))
        failed_suites="$failed_suites $name"
        continue
    fi
    read -r rc secs < "$work/$i.end"
    suite_times="$suite_times$(printf '%5d s  %s' "$secs" "$name")
"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$work/$i.log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "######## $name: ended (exit $rc) without its summary line: counted as one failure"
        total_failed=$((total_failed + 1))
        failed_suites="$failed_suites $name"
        continue
    fi
    p=$(echo "$line" | awk '{print $1}')
    f=$(echo "$line" | awk '{print $3}')
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then total_failed=$((total_failed + 1)); fi
    if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then failed_suites="$failed_suites $name"; fi
done

echo
echo "wall time per suite (${TEST_JOBS} at a time; $((SECONDS - t_start)) s in all):"
printf '%s' "$suite_times"
if [ -n "$failed_suites" ]; then echo "failed suites:$failed_suites"; fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
