#!/usr/bin/env bash
# Everything train_vla checks on a GPU, in one call: build for the GPU found, run the GPU tests
# (fp32 and bf16 against LeRobot's references and the PyTorch oracle, world sizes, ZeRO-1,
# resume, checkpoints across trainers), the dev/cuda kernel checks and benchmarks, a short
# training run on the default data, the launch scripts, issue 14's fp16 tests, recomputation's
# memory and time at the smolvla preset and a task-balanced run, and the benchmark of issue 12: the
# smolvla preset in bf16, two cameras stored at 224 px (resized to 512 on the device), batch B,
# --train expert and --train all, against dev/model.py --bench under torch.compile and against
# LeRobot's own training step (dev/lerobot/bench_lerobot.py: its defaults, and bf16 mixed
# precision); and the inference benchmark of issue 13: one action chunk of the smolvla preset at
# batch 1 from raw observations through libvla_gpu.so (dev/bench_infer.py: bf16, the Euler steps as
# a CUDA graph and one by one) against LeRobot's select_action / predict_action_chunk (its defaults,
# and bf16 autocast). Ends with tables of samples/s, MFU and peak memory, and of ms per chunk;
# every log stays in the output folder.
#
#   dev/gpu_check.sh [OUTDIR]        (default: $OUT if set, else build/gpu_check)
#   B=32 STEPS=30 CHUNKS=50 PYTHON=python3 dev/gpu_check.sh
#   BUDGET=540 dev/gpu_check.sh      # seconds it may take (default 540, for a 600 s call)
#   STAGES='^(build_bench|bench_|lerobot_)' dev/gpu_check.sh    # only the stages whose names match
#   DRY_RUN=1 dev/gpu_check.sh       # lists the stages in order and runs none (no GPU needed; the
#                                    # tables come out empty): dev/test_gpu_check.sh, in make test
#
# The stages run in the order of what matters most when time is short: the builds the benchmarks
# need, issue 12's benchmark (train_vla, its --profile, the attention kernels and their checks,
# LeRobot's own step in bf16), the bf16 GPU tests (the trainer just timed, against LeRobot's
# references), issue 12's other peers (the oracle under torch.compile, LeRobot's step with its
# defaults), issue 13's inference benchmark, then the other test builds, the fp32 and fp16 GPU
# tests, the dev/cuda programs, LeRobot's chunks under bf16 and the shorter checks. A stage that would start with less than 10 s of
# BUDGET left is skipped, and the one running when BUDGET is spent is stopped (timeout); both are
# listed as such in the summary, and the tables are
# printed from what ran. On the device machine of this workplace (a 600 s limit a call, 15 min a
# session), carry `.whl` (dev/lerobot/wheels.sh) and `build/lerobot_ref` (LeRobot's references,
# made here by `make setup && make build/lerobot_ref/all/ref.safetensors`, 12 MB: the GPU machine
# has no LeRobot venv to make them) and run
#   OUT=$OUT dev/gpu_check.sh
# Only a few files come back from $OUT there, so the logs and JSON files are written to
# build/gpu_check/logs and bundled into OUTDIR/logs.tar.gz after every stage; OUTDIR also gets
# device.txt, summary.txt and table.txt.
#
# PYTHON must import torch with CUDA (the oracle). A failing stage is reported and the others
# still run; the exit status is non-zero if any failed or was stopped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-${OUT:-build/gpu_check}}
PYTHON=${PYTHON:-python3}
B=${B:-32}
STEPS=${STEPS:-30}
CHUNKS=${CHUNKS:-50}  # timed action chunks of the inference benchmark
JOBS=${JOBS:-$(nproc)}
BUDGET=${BUDGET:-540}
STAGES=${STAGES:-.}
DRY_RUN=${DRY_RUN:-0}
RESERVE=15  # seconds kept for the tables after the last stage
BENCH_DATA=build/bench/smolvla.bin  # 2 cameras at 224 px, state 6, action 5 (the Makefile's rule)
if ! [[ "$BUDGET" =~ ^[0-9]+$ ]] || [ "$BUDGET" -le "$RESERVE" ]; then
    echo "error: BUDGET=$BUDGET: expected the seconds this script may take, more than $RESERVE (e.g. BUDGET=540)"
    exit 2
fi
LOGS=build/gpu_check/logs
mkdir -p "$OUTDIR" "$LOGS"
summary=()
failed=0

# the logs, bundled into OUTDIR (when OUTDIR is not the folder that holds them)
bundle() {
    [ "$(cd "$OUTDIR" && pwd)" = "$(cd build/gpu_check && pwd)" ] && return 0
    tar -czf "$OUTDIR/logs.tar.gz.tmp" -C build/gpu_check logs && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
    printf '%s\n' "${summary[@]}" > "$OUTDIR/summary.txt"
}

# fresh DIR: empties a run's output folder before its stage (not in a dry run, which runs nothing)
fresh() {
    [ "$DRY_RUN" = 1 ] || rm -rf "$1"
}

# stage NAME COMMAND...: runs it (if NAME matches STAGES and BUDGET allows) with its output in
# $LOGS/NAME.log, prints the tail; returns non-zero if it failed, was stopped or did not run
stage() {
    local name=$1
    shift
    [[ "$name" =~ $STAGES ]] || return 1
    if [ "$DRY_RUN" = 1 ]; then
        echo "stage $name: $*"
        return 1
    fi
    local left=$((BUDGET - RESERVE - SECONDS))
    if [ "$left" -lt 10 ]; then
        summary+=("$(printf '%-26s skipped: BUDGET (%d s) spent' "$name" "$BUDGET")")
        failed=1
        return 1
    fi
    echo
    echo "######## $name: $*"
    local t0=$SECONDS
    timeout -k 10 "$left" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    tail -n 8 "$LOGS/$name.log"
    if [ $rc -eq 0 ]; then
        summary+=("$(printf '%-26s ok (%ds)' "$name" $((SECONDS - t0)))")
    elif [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $((SECONDS - t0)) -ge "$left" ]; }; then  # timeout's, not a crash
        summary+=("$(printf '%-26s STOPPED after %ds: BUDGET (%d s) spent; see %s.log' "$name" $((SECONDS - t0)) "$BUDGET" \
            "$name")")
        failed=1
    else
        summary+=("$(printf '%-26s FAILED, exit %d (%ds): see %s.log' "$name" $rc $((SECONDS - t0)) "$name")")
        failed=1
    fi
    bundle
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    nvcc --version | tail -n 2
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "settings: B=$B STEPS=$STEPS CHUNKS=$CHUNKS BUDGET=$BUDGET STAGES=$STAGES JOBS=$JOBS"
} 2>&1 | tee "$OUTDIR/device.txt"

# 1. what the benchmarks need
stage build_bench make -j"$JOBS" PYTHON="$PYTHON" train_vla libvla_gpu.so data/synthetic "$BENCH_DATA"

# 2. issue 12's benchmark: the smolvla preset (random weights) on $BENCH_DATA, batch B, bf16, per
# train mode: train_vla (world size 1 through NCCL), LeRobot's own step with bf16 mixed precision
# (its faster setting; its defaults, fp32, run after the bf16 tests, with the oracle under
# torch.compile and bf16 autocast)
for train in expert all; do
    fresh "build/gpu_check_$train"
    stage "bench_train_vla_$train" ./train_vla -p smolvla --train "$train" -b "$B" -n "$STEPS" -u 10 -i "$BENCH_DATA" \
        -o "build/gpu_check_$train" -k 0 --keep 1 --log-every 10
done
# where train_vla's step time goes: one step (the third) of each train mode timed by phase and
# operation, the products and attention calls by shape with their TFLOP/s (--profile)
for train in expert all; do
    fresh "build/gpu_check_prof_$train"
    stage "profile_$train" ./train_vla -p smolvla --train "$train" -b "$B" -n 3 -u 2 -i "$BENCH_DATA" \
        -o "build/gpu_check_prof_$train" -k 0 --log-every 1 --profile 3
done
# the attention kernels at the smolvla shapes, every version (the vision tower's version 3 also at
# fewer images a pass and with bf16 scores, and its version 4, flash attention): the data for
# choosing among them
stage attention_bench bash -c 'make -C dev/cuda attention_smolvla && dev/cuda/attention_smolvla'
# the vision tower's fastest attention there (forward + backward), version 4 only where every one of
# its checks passed; where that is not what the trainer runs by default at the training shape
# (version 4, 128 queries a block), train_vla again with it: VLA_VISION_ATTENTION=3 and version 3's
# variant (VLA_ATTENTION3_SAMPLES, VLA_ATTENTION3_SCORES), or version 4 at 64 queries a block
# (VLA_ATTENTION4_QUERIES)
v4_ok=1
grep -q '^ *FAIL .*v4 vision' "$LOGS/attention_bench.log" 2> /dev/null && v4_ok=0
best_attention=$(awk -v v4_ok="$v4_ok" '/^bench v[34] vision .*\(B 64,/ {  # (the training shape, not the 2 images of inference)
        if ($2 == "v4" && v4_ok != 1) { next }
        n = 0; sc = "fp32"
        if (match($0, /, [0-9]+ a pass/)) { n = substr($0, RSTART + 2, RLENGTH - 9) + 0 }
        if ($0 ~ /bf16 scores/) { sc = "floatx" }
        rows = ($0 ~ /, 64 queries a block/) ? 64 : 128
        match($0, /forward +[0-9.]+ ms/); f = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", f)
        match($0, /backward +[0-9.]+ ms/); b = substr($0, RSTART, RLENGTH); gsub(/[^0-9.]/, "", b)
        if (f + b > 0 && (best == "" || f + b < t)) { t = f + b; best = ($2 == "v4" ? "4 " rows : "3 " n " " sc) }
    } END { print best }' "$LOGS/attention_bench.log" 2> /dev/null)
[ "$v4_ok" = 0 ] && echo "gpu_check: version 4 of the attention failed a check on this GPU: timing version 3 too"
if [ -n "$best_attention" ] && [ "$best_attention" != "4 128" ]; then
    read -r att_version att_a att_b <<< "$best_attention"
    if [ "$att_version" = 4 ]; then
        att_env=(VLA_ATTENTION4_QUERIES="$att_a")
    else
        att_env=(VLA_VISION_ATTENTION=3 VLA_ATTENTION3_SAMPLES="$att_a" VLA_ATTENTION3_SCORES="$att_b")
    fi
    for train in expert all; do
        fresh "build/gpu_check_${train}_alt"
        stage "bench_train_vla_${train}_alt" env "${att_env[@]}" ./train_vla -p smolvla --train "$train" -b "$B" \
            -n "$STEPS" -u 10 -i "$BENCH_DATA" -o "build/gpu_check_${train}_alt" -k 0 --keep 1 --log-every 10
    done
fi
# version 4 on the masked calls of the language stacks (the default of bf16 builds): where one of
# its checks failed on this GPU, train_vla again with version 2 there (VLA_MASKED_ATTENTION=2),
# the figure that stands if version 4 is wrong
if grep -Eq '^ *FAIL .*v4 (prefix|joint|cross|random)' "$LOGS/attention_bench.log" 2> /dev/null; then
    echo "gpu_check: version 4 of the masked attention failed a check on this GPU: timing version 2 there too"
    for train in expert all; do
        fresh "build/gpu_check_${train}_masked2"
        stage "bench_train_vla_${train}_masked2" env VLA_MASKED_ATTENTION=2 ./train_vla -p smolvla --train "$train" \
            -b "$B" -n "$STEPS" -u 10 -i "$BENCH_DATA" -o "build/gpu_check_${train}_masked2" -k 0 --keep 1 --log-every 10
    done
fi
# LeRobot's own SmolVLA training step and inference on this GPU at the released sizes (random
# weights): the peers of the comparisons. lerobot and its pure-Python dependencies travel as wheels
# (dev/lerobot/wheels.sh, carried as .whl); without them these stages are skipped.
have_lerobot=0
if [ "$DRY_RUN" = 1 ]; then
    have_lerobot=1  # (listed as if the wheels were there: nothing runs)
elif [ -d .whl ] && ls .whl/lerobot-*.whl > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lerobot_site \
        .whl/*.whl && export PYTHONPATH=/tmp/lerobot_site${PYTHONPATH:+:$PYTHONPATH} && have_lerobot=1
fi
# lerobot_train MODE AMP, lerobot_infer AMP: LeRobot's step at batch B, its batch-1 chunks
lerobot_train() {
    stage "lerobot_$1_$2" "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --train "$1" --amp "$2" --batch "$B" \
        --steps "$STEPS" --warmup 5 --device cuda --json "$LOGS/lerobot_$1_$2.json"
}
lerobot_infer() {
    stage "lerobot_infer_$1" "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --infer --infer-batch 1 --amp "$1" \
        --steps "$CHUNKS" --warmup 5 --device cuda --json "$LOGS/lerobot_infer_$1.json"
}
if [ $have_lerobot = 1 ]; then
    for train in expert all; do lerobot_train "$train" bf16; done
else
    summary+=("$(printf '%-26s skipped: no .whl/lerobot-*.whl (run dev/lerobot/wheels.sh here, carry .whl)' lerobot)")
fi

# 3. the GPU tests (fp32 and bf16 against LeRobot's references and the oracle, world sizes, ZeRO-1,
# resume, checkpoints across trainers; fp16's oracle case and loss scaling) and the dev/cuda programs
fixtures=(build/test/a.bin build/test/b.bin build/test/s.bin build/test/a_train.txt build/test/s_expert_state.bin
          build/test/s_vlm_state.bin build/test/s_all_state.bin)
# the bf16 suite first (the trainer the benchmark timed, against LeRobot's references and the
# oracle), before the inference benchmark and the other precisions
stage build_tests_bf16 make -j"$JOBS" PYTHON="$PYTHON" train_vla_cpu build/gpu/train_vla_bf16 \
    build/gpu/train_vla_single_gpu_bf16 build/gpu/test_vla_gpu_bf16 "${fixtures[@]}"
# LeRobot's references: carried (build/lerobot_ref), else made here if LeRobot's venv is (make
# setup); without them the tests say what they skip
refs=()
ref_cases_present() {
    local c
    for c in expert vlm all; do
        [ -f "build/lerobot_ref/$c/ref.safetensors" ] && [ -f "build/lerobot_ref/$c/c_config.txt" ] || return 1
    done
}
if ref_cases_present || [ "$DRY_RUN" = 1 ] || make build/lerobot_ref/all/ref.safetensors > "$LOGS/lerobot_ref.log" 2>&1; then
    refs=(--smolvla build/lerobot_ref)
else
    summary+=("$(printf '%-26s missing: the GPU tests skip the LeRobot cases (carry build/lerobot_ref)' lerobot_ref)")
fi
stage test_gpu_bf16 build/gpu/test_vla_gpu_bf16 build/test build/gpu/train_vla_bf16 build/gpu/train_vla_single_gpu_bf16 \
    "${refs[@]}"

# 4. issue 12's other peers: the oracle under torch.compile (each kind of layer compiled once for
# all its layers: dev/model.py --compile), LeRobot's step with its defaults (fp32), and the scaling
# model (README) from this GPU's measured steps
for train in expert all; do
    stage "bench_torch_compile_$train" "$PYTHON" dev/model.py -i "$BENCH_DATA" -p smolvla --train-mode "$train" -b "$B" \
        --bench "$STEPS" --device cuda --amp bf16 --compile
    [ -f "$LOGS/bench_train_vla_$train.log" ] &&
        stage "scaling_model_$train" "$PYTHON" dev/scaling_model.py --from-log "$LOGS/bench_train_vla_$train.log"
done
if [ $have_lerobot = 1 ]; then
    for train in expert all; do lerobot_train "$train" none; done
fi

# 5. issue 13's inference benchmark: one action chunk of the smolvla preset (random weights; the
# checkpoint is written once under build/bench) at batch 1 from raw observations (2 cameras of
# 224 px resized to 512 on the device, an instruction, the state), the prefix once and 10 Euler
# steps, through libvla_gpu.so (bf16): the steps replayed as a CUDA graph, and launched one by one;
# then LeRobot's batch-1 chunks as lerobot_eval.py asks for them with its defaults (fp32, its
# faster setting here; under bf16 autocast after the tests)
# (VLA_PROFILE_ACT=3: the third call of each policy, a warm-up one, also timed by phase and operation)
stage bench_infer env VLA_PROFILE_ACT=3 "$PYTHON" dev/bench_infer.py --preset smolvla --chunks "$CHUNKS" --warmup 5 \
    --graphs both --json "$LOGS/bench_infer.json"
[ $have_lerobot = 1 ] && lerobot_infer none

# 6. the other precisions' GPU tests and the dev/cuda programs
stage build_tests make -j"$JOBS" PYTHON="$PYTHON" train_vla_cpu build/gpu/train_vla_bf16 build/gpu/train_vla_fp32 \
    build/gpu/train_vla_single_gpu_bf16 build/gpu/test_vla_gpu_bf16 build/gpu/test_vla_gpu_fp32 build/gpu/train_vla_fp16 \
    build/gpu/test_vla_gpu_fp16 dev_cuda build/gpu/registers_bf16.txt build/gpu/registers_fp32.txt \
    build/gpu/registers_fp16.txt "${fixtures[@]}"
stage test_gpu_fp32 build/gpu/test_vla_gpu_fp32 build/test build/gpu/train_vla_fp32 "${refs[@]}"
# fp16 (issue 14): its oracle case and the loss scaling on this GPU (fp16 tensor cores exist on sm_90 too)
stage test_gpu_fp16 env VLA_GPU_TESTS=oracle:all,fp16 build/gpu/test_vla_gpu_fp16 build/test build/gpu/train_vla_fp16 \
    "${refs[@]}"
stage cuda_registers dev/cuda/check_registers.sh build/gpu/registers_bf16.txt build/gpu/registers_fp32.txt \
    build/gpu/registers_fp16.txt
for prog in dev/cuda/*.cu; do
    name=$(basename "$prog" .cu)
    # (attention_smolvla ran as attention_bench)
    [ "$name" = attention_smolvla ] && grep -q '^attention_bench ok' <(printf '%s\n' "${summary[@]}" | tr -s ' ') && continue
    stage "cuda_$name" "dev/cuda/$name"
done

# the rest of LeRobot's figures: its chunks under bf16 autocast
[ $have_lerobot = 1 ] && lerobot_infer bf16

# 7. a short run on the shipped data (small preset): the loss must fall; the launch scripts on this
# GPU (the template at 1 GPU, the resume loop's give-up path)
stage train_default ./train_vla -b 32 -n 300 -u 30 -l 1e-3 --log-every 50 -o build/gpu_check_run
stage launchers env GPU_TESTS=build/gpu scripts/test_launchers.sh

# issue 14's recomputation: --train all of the smolvla preset at batch B with each level, the
# memory it actually holds and the step time it costs (the README's figures are computed ones)
for level in attn layer; do
    fresh "build/gpu_check_all_$level"
    stage "bench_recompute_$level" ./train_vla -p smolvla --train all -b "$B" -n "$STEPS" -u 10 -i "$BENCH_DATA" \
        -o "build/gpu_check_all_$level" -k 0 --keep 1 --log-every 10 --recompute "$level"
done
# and task-balanced sampling on the shipped data (10 tasks): the run and its per-task losses
stage balance_default ./train_vla -b 32 -n 50 -u 10 -l 1e-3 --log-every 10 --balance tasks -o build/gpu_check_balance

echo
echo "######## summary"
printf '%s\n' "${summary[@]}" | tee "$OUTDIR/summary.txt"

# the table: samples/s of each, the ratio to train_vla, MFU on train_vla's FLOP count of the mode
# (forward everywhere, backward where gradients flow), peak memory
json_field() { "$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1])); t=d.get('train', d); v=t.get(sys.argv[2]); print('?' if v is None else f'{v:.2f}' if isinstance(v, float) else v)" "$1" "$2" 2>/dev/null || echo '?'; }
row() { printf '| %-72s | %10s | %11s | %8s | %7s | %10s |\n' "$@"; }
# the attention a train_vla log ran, from its config table: "vision v4: flash, mma.sync; masked v4"
attention_used() {
    local vision masked
    vision=$(sed -n 's/^| vision attention *| \(.*[^ ]\) *|$/\1/p' "$1" 2>/dev/null | head -n 1)
    masked=$(sed -n 's/^| masked attention *| \(v[0-9]\).*|$/\1/p' "$1" 2>/dev/null | head -n 1)
    echo "vision ${vision:-?}; masked ${masked:-?}"
}
{
    echo
    echo "smolvla preset, batch $B, 2 cameras at 224 px resized to 512, $STEPS timed steps"
    echo "device: $(head -n 2 "$OUTDIR/device.txt" | tail -n 1)"
    for train in expert all; do
        log=$LOGS/bench_train_vla_$train.log
        gflop=$(awk -F'|' '/model GFLOP per sample/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
        peak=$(awk -F'|' '/peak bf16 TFLOP\/s/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
        ours=$(awk '/^mean step time/ {print $4, $11}' "$log" 2>/dev/null)      # ms, samples/s
        ours_mem=$(sed -n 's/.*peak GPU memory \([0-9.]*\) GiB.*/\1/p' "$log" 2>/dev/null)
        mfu() { awk -v s="$1" -v g="$gflop" -v p="$peak" 'BEGIN { if (s+0 > 0 && g+0 > 0 && p+0 > 0) printf "%.1f%%", 100 * s * g / (p * 1000); else printf "?" }'; }
        ratio() { awk -v a="$sps" -v b="$1" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx", b / a; else printf "?" }'; }
        echo
        echo "--train $train: ${gflop:-?} GFLOP per sample (train_vla's count); peak ${peak:-?} TFLOP/s (bf16 dense)"
        row "trainer" "ms/step" "samples/s" "vs ours" "MFU" "memory GiB"
        row "----" "---" "---" "---" "---" "---"
        read -r ms sps <<< "${ours:-? ?}"
        row "train_vla (bf16, $(attention_used "$log"))" "$ms" "$sps" "1.00x" "$(mfu "$sps")" "${ours_mem:-?}"
        # the attention benchmark's fastest vision attention where not the default; version 2 on the
        # masked calls where version 4 failed a check there
        for altlog in "$LOGS/bench_train_vla_${train}_alt.log" "$LOGS/bench_train_vla_${train}_masked2.log"; do
            [ -f "$altlog" ] || continue
            read -r vms vsps <<< "$(awk '/^mean step time/ {print $4, $11}' "$altlog")"
            vmem=$(sed -n 's/.*peak GPU memory \([0-9.]*\) GiB.*/\1/p' "$altlog")
            row "train_vla (bf16, $(attention_used "$altlog"))" "${vms:-?}" "${vsps:-?}" "$(ratio "$vsps")" "$(mfu "$vsps")" \
                "${vmem:-?}"
        done
        f=$LOGS/bench_torch_compile_$train.log
        tms=$(awk '/^ms_per_step/ {print $2}' "$f" 2>/dev/null)
        tsps=$(awk '/^samples_per_s/ {print $2}' "$f" 2>/dev/null)
        tmem=$(awk '/^peak_mem_gib/ {print $2}' "$f" 2>/dev/null)
        row "dev/model.py, torch.compile (per layer), bf16" "${tms:-?}" "${tsps:-?}" "$(ratio "$tsps")" "$(mfu "$tsps")" "${tmem:-?}"
        for amp in none bf16; do
            j=$LOGS/lerobot_${train}_${amp}.json
            lms=$(json_field "$j" ms_per_step)
            lsps=$(json_field "$j" samples_per_s)
            lmem=$(json_field "$j" peak_memory_bytes)
            lmem=$(awk -v b="$lmem" 'BEGIN { if (b+0 > 0) printf "%.2f", b / 2^30; else printf "?" }')
            if [ "$amp" = none ]; then what="defaults, fp32"; else what="bf16 mixed precision"; fi
            row "LeRobot 0.6.1 ($what)" "$lms" "$lsps" "$(ratio "$lsps")" \
                "$(mfu "$lsps")" "$lmem"
        done
        echo "train_vla at world size 1 through NCCL: $(sed -n 's/^communication: //p' "$log" 2>/dev/null)"
    done
    echo "(vs ours: their samples/s over train_vla's; below 1 means train_vla is faster)"

    # the attention kernels' benchmark (dev/cuda/attention_smolvla at the smolvla shapes)
    if [ -f "$LOGS/attention_bench.log" ]; then
        echo
        echo "attention at the smolvla shapes (dev/cuda/attention_smolvla; FLOPs as if unmasked):"
        grep '^bench v' "$LOGS/attention_bench.log"
    fi

    # --profile: each train mode's step by phase, and its ten costliest operations
    for train in expert all; do
        f=$LOGS/profile_$train.log
        [ -f "$f" ] || continue
        echo
        echo "--train $train, --profile 3: $(sed -n 's/^profile of step 3: //p' "$f" | head -n 1)"
        awk '/^by phase \(calls/ {on = 1; next} on && /^$/ {exit} on' "$f"
        awk '/^by phase and operation/ {on = 1; n = 0; next} on && /^$/ {exit} on && n++ < 12' "$f"
    done

    # recomputation: --train all at batch B, none (the benchmark above) against attn and layer
    echo
    echo "--recompute, --train all, batch $B: step time and memory held (peak GPU memory of the run)"
    row "level" "ms/step" "samples/s" "vs none" "" "memory GiB"
    row "----" "---" "---" "---" "" "---"
    read -r _ none_sps <<< "$(awk '/^mean step time/ {print $4, $11}' "$LOGS/bench_train_vla_all.log" 2>/dev/null)"
    for level in none attn layer; do
        log=$LOGS/bench_recompute_$level.log
        [ "$level" = none ] && log=$LOGS/bench_train_vla_all.log
        read -r ms sps <<< "$(awk '/^mean step time/ {print $4, $11}' "$log" 2>/dev/null)"
        mem=$(sed -n 's/.*peak GPU memory \([0-9.]*\) GiB.*/\1/p' "$log" 2>/dev/null)
        slow=$(awk -v a="${none_sps:-0}" -v b="${sps:-0}" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx", b / a; else printf "?" }')
        row "$level" "${ms:-?}" "${sps:-?}" "$slow" "" "${mem:-?}"
    done

    # inference: ms per chunk of each, the ratio to train_vla's (CUDA graph)
    jget() { "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); v=eval(sys.argv[2]); print('?' if v is None else (f'{v:.2f}' if isinstance(v, float) else v))" "$1" "$2" 2>/dev/null || echo '?'; }
    irow() { printf '| %-64s | %8s | %7s | %7s | %-30s |\n' "$@"; }
    ours_json=$LOGS/bench_infer.json
    ours_ms=$(jget "$ours_json" 'r["runs"]["graphs"]["ms_per_chunk_median"]')
    vs() { awk -v a="$ours_ms" -v b="$1" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx", b / a; else printf "?" }'; }
    echo
    echo "inference: one action chunk of the smolvla preset, batch 1, 2 cameras at 224 px resized to 512, an"
    echo "instruction, the state; the prefix once and 10 Euler steps; $CHUNKS timed chunks, medians"
    irow "policy" "ms/chunk" "p90" "vs ours" "on the device"
    irow "----" "---" "---" "---" "---"
    for mode in graphs eager; do
        if [ "$mode" = graphs ]; then what="Euler steps as a CUDA graph"; else what="Euler steps launched one by one"; fi
        split="prefix $(jget "$ours_json" "r['runs']['$mode']['prefix_ms_median']") + steps $(jget "$ours_json" "r['runs']['$mode']['steps_ms_median']") ms"
        ms=$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_median']")
        irow "train_vla libvla_gpu.so (bf16, $what)" "$ms" "$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_p90']")" \
            "$(vs "$ms")" "$split"
    done
    for amp in none bf16; do
        j=$LOGS/lerobot_infer_${amp}.json
        if [ "$amp" = none ]; then what="defaults, fp32"; else what="bf16 autocast"; fi
        sel=$(jget "$j" 'r["infer"]["ms_select_action_with_processors_median"]')
        pred=$(jget "$j" 'r["infer"]["ms_per_chunk_median"]')
        irow "LeRobot 0.6.1 select_action + processors ($what)" "$sel" "-" "$(vs "$sel")" ""
        irow "LeRobot 0.6.1 predict_action_chunk ($what)" "$pred" "-" "$(vs "$pred")" ""
    done
    echo "(vs ours: their ms per chunk over train_vla's with the CUDA graph; above 1 means train_vla is faster;"
    echo " train_vla's figure is the whole act() call from raw observations, as select_action + processors is)"
    verdict=$(awk -v a="$ours_ms" 'BEGIN { if (a+0 <= 0) print "not measured"; else if (a <= 15) print "met"; else print "NOT met" }')
    echo "issue 13's target, at most 15 ms per chunk on an H100: $verdict (${ours_ms} ms on $(head -n 2 "$OUTDIR/device.txt" | tail -n 1 | cut -d, -f1))"
    # the profiled call (the first policy's third, its Euler steps launched one by one)
    f=$LOGS/bench_infer.log
    if grep -q '^profile of sampling call 3: ' "$f" 2> /dev/null; then
        echo
        echo "inference, VLA_PROFILE_ACT=3: $(sed -n 's/^profile of sampling call 3: //p' "$f" | head -n 1)"
        awk '/^by phase \(calls/ {on = 1; next} on && /^$/ {exit} on' "$f"
        awk '/^by phase and operation/ {on = 1; n = 0; next} on && /^$/ {exit} on && n++ < 12' "$f"
    fi
} | tee "$OUTDIR/table.txt"
bundle
exit $failed
