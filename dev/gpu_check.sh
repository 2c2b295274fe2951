#!/usr/bin/env bash
# train_vla on a GPU, in calls that fit a short lease of one: the headline figures first, the rest
# in a second, optional call.
#
#   dev/gpu_check.sh prepare           # here, without a GPU: the binaries, fixtures, LeRobot's
#                                      # references and wheels the GPU calls carry; prints the call
#   dev/gpu_check.sh [OUTDIR]          # the headline call (BUDGET=420 s): see below
#   dev/gpu_check.sh more [OUTDIR]     # everything else, in order of worth (BUDGET=300 s)
#   DRY_RUN=1 dev/gpu_check.sh [more]  # the stage plan with each stage's expected seconds and their
#                                      # sum; runs nothing, needs no GPU (make test checks it)
#   B=32 STEPS=30 CHUNKS=50 BUDGET=420 STAGES='^bench_' PYTHON=python3 dev/gpu_check.sh
#
# The headline call, in this order: one parallel build of what the call runs (nothing where
# `prepare` built it and the sources match); train_vla, the smolvla preset in bf16 (random
# weights, two cameras stored at 224 px resized to 512 on the device, batch B) with --train expert
# and --train all; LeRobot 0.6.1's own training step at the same settings with bf16 mixed
# precision (its faster setting); one action chunk at batch 1 through libvla_gpu.so, the Euler
# steps as a CUDA graph and launched one by one, against LeRobot's select_action (fp32, its faster
# setting there); the bf16 GPU tests against LeRobot's references and the oracle; and the two
# --profile runs if time is left. `more`: pi0 first (train_vla -p pi0 --train all at batch PI0_B,
# LeRobot's PI0Policy at the same batch in bf16 and fp32, train_vla's chunk at batch 1 through
# libvla_gpu.so against LeRobot's), then the rest of
# the bf16 GPU tests, LeRobot's fp32 step and bf16 chunks, the fp32 and fp16 GPU tests, the
# attention kernels' checks and benchmark, the oracle under torch.compile, a short run on the
# shipped data, the launch scripts, recomputation, task-balanced sampling and the dev/cuda
# programs. What needs no GPU (builds that `prepare` can make, the register counts, the scaling
# model from the logs) does not run here.
#
# Timing: train_vla runs STEPS + 1 steps and leaves the first out of its mean (the first step
# sets up cuBLASLt and the caches; `-u 10` is the learning rate's warm-up, not the timing's);
# LeRobot's bench runs 5 untimed steps, then STEPS timed. Benchmarks write no checkpoint
# (--no-checkpoint). pi0's benchmarks time PI0_STEPS steps the same way.
#
# Every stage carries its expected seconds: a plain number was measured on a GPU, a ~number is an
# estimate. A stage starts only if its expected seconds fit in what is left of BUDGET (else it is
# skipped and listed as such), and the one running when BUDGET is spent is stopped. After every
# stage OUTDIR gets summary.txt (each stage's result and seconds against its expectation),
# table.txt (the figures measured so far) and logs.tar.gz (every log; the logs themselves stay in
# build/gpu_check/logs, or GPU_CHECK_WORK's), so a call cut short still returns what ran;
# device.txt names the GPU, the commit and the date. OUTDIR is $OUT if set, else build/gpu_check.
# PYTHON must import torch with CUDA. The exit status is non-zero if a stage failed, was stopped
# or skipped. A stage whose command refuses its model (train_vla's "error: ..." line on a size past
# what its GPU kernels take, before any step; bench_lerobot's "does not fit" when CUDA runs out of
# memory) is listed as skipped with that line, and the call goes on.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
MODE=headline
case "${1:-}" in headline | more | prepare) MODE=$1; shift ;; esac
OUTDIR=${1:-${OUT:-build/gpu_check}}
PYTHON=${PYTHON:-python3}
B=${B:-32}
STEPS=${STEPS:-30}    # timed training steps of each benchmark
CHUNKS=${CHUNKS:-50}  # timed action chunks of the inference benchmark
# pi0 (`more`): batch 8 fits one 80 GB GPU in both trainers: train_vla's --memory estimates 66.9 GiB
# at --train all with --recompute none (its largest batch there 14); LeRobot's bf16 step about 61 GiB
# (weights 8.3, gradients and moments ~20, what autograd saves ~33, counted on the meta device), its
# fp32 step about 98 GiB (an H200's 141 GB only)
PI0_B=${PI0_B:-8}
PI0_STEPS=${PI0_STEPS:-10}  # (a step at batch 8 is 63 TFLOP of model work: 10 time it well)
JOBS=${JOBS:-$(nproc)}
if [ "$MODE" = more ]; then BUDGET=${BUDGET:-300}; else BUDGET=${BUDGET:-420}; fi
STAGES=${STAGES:-.}
DRY_RUN=${DRY_RUN:-0}
RESERVE=5  # seconds kept for the last tables
OVERHEAD=10  # seconds outside the stages (the device's facts, the wheels' install, the tables): an estimate
BENCH_DATA=build/bench/smolvla.bin  # 2 cameras at 224 px, state 6, action 5 (the Makefile's rule)
WORK=${GPU_CHECK_WORK:-build/gpu_check}  # (tests/bench/test_gpu_check.sh works elsewhere)
LOGS=$WORK/logs
RUNS=$WORK/runs  # the benchmarks' output folders (their log.jsonl; no checkpoints)
for v in BUDGET B STEPS CHUNKS JOBS PI0_B PI0_STEPS; do
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ]; then
        echo "error: $v=${!v}: expected a whole number of at least 1 (e.g. $v=$(case $v in BUDGET) echo 420 ;; PI0_B) echo 8 ;; PI0_STEPS) echo 10 ;; *) echo 30 ;; esac))"
        exit 2
    fi
done
if [ "$BUDGET" -le "$RESERVE" ]; then
    echo "error: BUDGET=$BUDGET: expected the seconds this call may take, more than $RESERVE (e.g. BUDGET=420)"
    exit 2
fi

# What the headline call runs, built by `prepare` (here) or by its build stage (there); the
# fixtures of the GPU tests (the oracle's debug states need torch on the CPU: made here too)
GPU_BINARIES=(build/gpu/train_vla_bf16 build/gpu/train_vla_single_gpu_bf16 build/gpu/test_vla_gpu_bf16 libvla_gpu.so)
FIXTURES=(build/test/a.bin build/test/b.bin build/test/s.bin build/test/a_train.txt build/test/a_pi0_train.txt
          build/test/s_expert_state.bin build/test/s_vlm_state.bin build/test/s_all_state.bin)
REFS=build/lerobot_ref
PI0_REFS=build/lerobot_ref_pi0
PREPARED=build/gpu/prepared.txt
PREPARED_COMMIT=build/gpu/prepared_commit.txt
# (the fixtures travel in build/gpu/fixtures: build/test also holds every test's runs, hundreds of MiB)
FIXTURE_COPIES=build/gpu/fixtures
CARRY=(build/gpu libvla_gpu.so "$REFS" "$PI0_REFS" .whl)

# the sources the prepared binaries were built from, and for which GPU: the GPU calls use them
# only where this matches
sources_stamp() {
    echo "arch $1"
    sha256sum train_vla.cu test_vla_gpu.cu tests/util/test_util.h dev/gpu_arch.mk Makefile
    find vla -name '*.h' -o -name '*.cuh' | LC_ALL=C sort | xargs sha256sum
}
# the GPU's architecture (sm_90 for H100 and H200), or GPU_ARCH, or sm_90 without a GPU
gpu_arch() {
    local cc
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -n 1 | tr -d '. ')
    echo "${GPU_ARCH:-sm_${cc:-90}}"
}

if [ "$MODE" = prepare ]; then
    arch=${GPU_ARCH:-sm_90}
    echo "gpu_check prepare: building for $arch what the headline call runs, its fixtures and LeRobot's references"
    CI=true make -j"$JOBS" GPU_ARCH="$arch" "${GPU_BINARIES[@]}" "${FIXTURES[@]}" "$REFS/all/ref.safetensors" \
        "$REFS"/{expert,vlm,all}/c_config.txt "$PI0_REFS/all/ref.safetensors" || exit 1
    if ! ls .whl/lerobot-*.whl > /dev/null 2>&1; then dev/lerobot/wheels.sh || exit 1; fi
    # (pi0's stages: LeRobot's pinned transformers, beside the image's)
    if ! ls .whl/pinned/transformers-*.whl > /dev/null 2>&1; then
        WHL_DIR=.whl/pinned dev/lerobot/wheels.sh --pinned || exit 1
    fi
    mkdir -p "$FIXTURE_COPIES" && cp -p "${FIXTURES[@]}" "$FIXTURE_COPIES"/ || exit 1
    sources_stamp "$arch" > "$PREPARED"
    echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes')" > "$PREPARED_COMMIT"
    echo
    echo "carry (name each in the device call's carry; $(du -sch "${CARRY[@]}" | tail -n 1 | cut -f 1) together, with the"
    echo "working tree's $(git ls-files -z | du -ch --files0-from=- 2> /dev/null | tail -n 1 | cut -f 1)):"
    du -sh "${CARRY[@]}"
    echo "the headline call (BUDGET $BUDGET s; its timeout a minute more):"
    echo "    OUT=\$OUT dev/gpu_check.sh"
    exit 0
fi

# a whole headline call starts from no logs (the last call's are kept beside, in logs.previous)
if [ "$DRY_RUN" != 1 ] && [ "$MODE" = headline ] && [ "$STAGES" = . ] && [ -d "$LOGS" ]; then
    rm -rf "$LOGS.previous" && mv "$LOGS" "$LOGS.previous"
fi
mkdir -p "$OUTDIR" "$LOGS" "$RUNS"  # (train_vla makes its run folder, not the folders above it)
summary=()
failed=0
planned=0     # the sum of the expected seconds of the stages listed (DRY_RUN) or started
plan_lines=()

# ---- the figures: train_vla's step against its peers, inference, the profiles; printed from
# whatever logs exist, so "not run" marks what this call (or the other one) has not measured
json_field() { "$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1])); t=d.get('train', d); v=t.get(sys.argv[2]); print('?' if v is None else f'{v:.2f}' if isinstance(v, float) else v)" "$1" "$2" 2>/dev/null || echo '?'; }
jget() { "$PYTHON" -c "import json,sys; r=json.load(open(sys.argv[1])); v=eval(sys.argv[2]); print('?' if v is None else (f'{v:.2f}' if isinstance(v, float) else v))" "$1" "$2" 2>/dev/null || echo '?'; }
row() { printf '| %-72s | %10s | %11s | %8s | %7s | %10s |\n' "$@"; }
irow() { printf '| %-64s | %8s | %7s | %7s | %-30s |\n' "$@"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx", b / a; else printf "?" }'; }
step_figures() { awk '/^mean step time/ {print $4, $7, $11}' "$1" 2> /dev/null; }  # ms, timed steps, samples/s
peak_memory() { sed -n 's/.*peak GPU memory \([0-9.]*\) GiB.*/\1/p' "$1" 2> /dev/null; }
# the attention a train_vla log ran, from its config table: "vision v4: flash, mma.sync; masked v4"
attention_used() {
    local vision masked
    vision=$(sed -n 's/^| vision attention *| \(.*[^ ]\) *|$/\1/p' "$1" 2>/dev/null | head -n 1)
    masked=$(sed -n 's/^| masked attention *| \(v[0-9]\).*|$/\1/p' "$1" 2>/dev/null | head -n 1)
    echo "vision ${vision:-?}; masked ${masked:-?}"
}
tables() {
    local train log gflop peak ms n sps mem f amp j what
    echo "smolvla preset, batch $B, 2 cameras at 224 px resized to 512; train_vla: the mean of $STEPS timed steps"
    echo "after 1 untimed; LeRobot: the mean of $STEPS after 5 untimed; torch.compile: the median of $STEPS after 5"
    echo "device: $(sed -n 2p "$OUTDIR/device.txt" 2> /dev/null)"
    echo "$(grep '^commit' "$OUTDIR/device.txt" 2> /dev/null)"
    for train in expert all; do
        log=$LOGS/bench_train_vla_$train.log
        gflop=$(awk -F'|' '/model GFLOP per sample/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
        peak=$(awk -F'|' '/peak bf16 TFLOP\/s/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
        mfu() { awk -v s="$1" -v g="$gflop" -v p="$peak" 'BEGIN { if (s+0 > 0 && g+0 > 0 && p+0 > 0) printf "%.1f%%", 100 * s * g / (p * 1000); else printf "?" }'; }
        read -r ms n sps <<< "$(step_figures "$log")"
        ours=${sps:-}
        echo
        echo "--train $train: ${gflop:-?} GFLOP per sample (train_vla's count); peak ${peak:-?} TFLOP/s (bf16 dense)"
        row "trainer" "ms/step" "samples/s" "vs ours" "MFU" "memory GiB"
        row "----" "---" "---" "---" "---" "---"
        if [ -n "${ms:-}" ]; then
            row "train_vla (bf16, $(attention_used "$log"))" "$ms" "$sps" "1.00x" "$(mfu "$sps")" "$(peak_memory "$log")"
        else
            row "train_vla (bf16)" "not run" "" "" "" ""
        fi
        for amp in bf16 none; do
            j=$LOGS/lerobot_${train}_${amp}.json
            if [ "$amp" = none ]; then what="defaults, fp32"; else what="bf16 mixed precision"; fi
            if [ ! -f "$j" ]; then row "LeRobot 0.6.1 ($what)" "not run" "" "" "" ""; continue; fi
            sps=$(json_field "$j" samples_per_s)
            mem=$(awk -v b="$(json_field "$j" peak_memory_bytes)" 'BEGIN { if (b+0 > 0) printf "%.2f", b / 2^30; else printf "?" }')
            row "LeRobot 0.6.1 ($what)" "$(json_field "$j" ms_per_step)" "$sps" "$(ratio "$ours" "$sps")" "$(mfu "$sps")" "$mem"
        done
        f=$LOGS/bench_torch_compile_$train.log
        if [ -f "$f" ]; then
            sps=$(awk '/^samples_per_s/ {print $2}' "$f")
            row "dev/model.py, torch.compile (per layer), bf16" "$(awk '/^ms_per_step/ {print $2}' "$f")" "${sps:-?}" \
                "$(ratio "$ours" "$sps")" "$(mfu "$sps")" "$(awk '/^peak_mem_gib/ {print $2}' "$f")"
        else
            row "dev/model.py, torch.compile (per layer), bf16" "not run" "" "" "" ""
        fi
        echo "train_vla at world size 1 through NCCL: $(sed -n 's/^communication: //p' "$log" 2>/dev/null)"
    done
    echo "(vs ours: their samples/s over train_vla's; below 1 means train_vla is faster)"

    # inference: ms per chunk of each, the ratio to train_vla's with the CUDA graph
    local ours_json=$LOGS/bench_infer.json ours_ms mode split sel pred
    ours_ms=$(jget "$ours_json" 'r["runs"]["graphs"]["ms_per_chunk_median"]')
    echo
    echo "inference: one action chunk of the smolvla preset, batch 1, 2 cameras at 224 px resized to 512, an"
    echo "instruction, the state; the prefix once and 10 Euler steps; $CHUNKS timed chunks after 5 untimed, medians"
    irow "policy" "ms/chunk" "p90" "vs ours" "on the device"
    irow "----" "---" "---" "---" "---"
    for mode in graphs eager; do
        if [ "$mode" = graphs ]; then what="Euler steps as a CUDA graph"; else what="Euler steps launched one by one"; fi
        [ -f "$ours_json" ] || { irow "train_vla libvla_gpu.so (bf16, $what)" "not run" "" "" ""; continue; }
        split="prefix $(jget "$ours_json" "r['runs']['$mode']['prefix_ms_median']") + steps $(jget "$ours_json" "r['runs']['$mode']['steps_ms_median']") ms"
        ms=$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_median']")
        irow "train_vla libvla_gpu.so (bf16, $what)" "$ms" "$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_p90']")" \
            "$(ratio "$ours_ms" "$ms")" "$split"
    done
    for amp in none bf16; do
        j=$LOGS/lerobot_infer_${amp}.json
        if [ "$amp" = none ]; then what="defaults, fp32"; else what="bf16 autocast"; fi
        [ -f "$j" ] || { irow "LeRobot 0.6.1 select_action + processors ($what)" "not run" "" "" ""; continue; }
        sel=$(jget "$j" 'r["infer"]["ms_select_action_with_processors_median"]')
        pred=$(jget "$j" 'r["infer"]["ms_per_chunk_median"]')
        irow "LeRobot 0.6.1 select_action + processors ($what)" "$sel" "-" "$(ratio "$ours_ms" "$sel")" ""
        irow "LeRobot 0.6.1 predict_action_chunk ($what)" "$pred" "-" "$(ratio "$ours_ms" "$pred")" ""
    done
    echo "(vs ours: their ms per chunk over train_vla's with the CUDA graph; above 1 means train_vla is faster;"
    echo " train_vla's figure is the whole act() call from raw observations, as select_action + processors is)"
    f=$LOGS/bench_infer.log
    if grep -q '^profile of sampling call 3: ' "$f" 2> /dev/null; then
        echo
        echo "inference, VLA_PROFILE_ACT=3: $(sed -n 's/^profile of sampling call 3: //p' "$f" | head -n 1)"
        awk '/^by phase \(calls/ {on = 1; next} on && /^$/ {exit} on' "$f"
        awk '/^by phase and operation/ {on = 1; n = 0; next} on && /^$/ {exit} on && n++ < 12' "$f"
    fi

    # --profile: each train mode's step by phase, and its costliest operations
    for train in expert all; do
        f=$LOGS/profile_$train.log
        [ -f "$f" ] || continue
        echo
        echo "--train $train, --profile 3: $(sed -n 's/^profile of step 3: //p' "$f" | head -n 1)"
        awk '/^by phase \(calls/ {on = 1; next} on && /^$/ {exit} on' "$f"
        awk '/^by phase and operation/ {on = 1; n = 0; next} on && /^$/ {exit} on && n++ < 12' "$f"
    done

    # pi0 (the `more` call): --train all at batch PI0_B, both trainers; LeRobot's chunk at batch 1
    local refused
    log=$LOGS/bench_pi0_train_vla.log
    gflop=$(awk -F'|' '/model GFLOP per sample/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
    peak=$(awk -F'|' '/peak bf16 TFLOP\/s/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
    j=$LOGS/lerobot_pi0_all_bf16.json
    [ -n "$gflop" ] || gflop=$(jget "$j" 'r["train"]["flops_model_per_sample"] / 1e9')
    [ -n "$peak" ] || peak=$(jget "$j" 'r["peak_bf16_flops"] / 1e12')
    read -r ms n sps <<< "$(step_figures "$log")"
    ours=${sps:-}
    echo
    echo "pi0 preset (3.24B parameters, random weights), --train all, batch $PI0_B, 2 cameras at 224 px; train_vla:"
    echo "the mean of $PI0_STEPS timed steps after 1 untimed; LeRobot: the mean of $PI0_STEPS after 5 untimed (its"
    echo "batch fed tokenized and normalized: its copy to the device and update_policy)"
    echo "${gflop:-?} GFLOP per sample (vla/flops.h's count, LeRobot's too); peak ${peak:-?} TFLOP/s (bf16 dense)"
    row "trainer" "ms/step" "samples/s" "vs ours" "MFU" "memory GiB"
    row "----" "---" "---" "---" "---" "---"
    refused=$(grep -E -m 1 '^error: .* takes? ' "$log" 2> /dev/null)
    if [ -n "${ms:-}" ]; then
        row "train_vla (bf16, --recompute none, $(attention_used "$log"))" "$ms" "$sps" "1.00x" "$(mfu "$sps")" \
            "$(peak_memory "$log")"
    elif [ -n "$refused" ]; then
        row "train_vla (bf16)" "refused" "" "" "" ""
    else
        row "train_vla (bf16)" "not run" "" "" "" ""
    fi
    for amp in bf16 none; do
        j=$LOGS/lerobot_pi0_all_${amp}.json
        what="dtype bfloat16: bf16 weights and autocast"
        [ "$amp" = bf16 ] || what="dtype float32, its default"
        if [ ! -f "$j" ]; then
            row "LeRobot 0.6.1 ($what)" "not run" "" "" "" ""
        elif [ "$(jget "$j" 'r.get("does_not_fit")')" != '?' ]; then
            row "LeRobot 0.6.1 ($what)" "no fit" "" "" "" ""
        else
            sps=$(json_field "$j" samples_per_s)
            mem=$(awk -v b="$(json_field "$j" peak_memory_bytes)" 'BEGIN { if (b+0 > 0) printf "%.2f", b / 2^30; else printf "?" }')
            row "LeRobot 0.6.1 ($what)" "$(json_field "$j" ms_per_step)" "$sps" "$(ratio "$ours" "$sps")" "$(mfu "$sps")" "$mem"
        fi
    done
    [ -z "$refused" ] || echo "train_vla refused: $refused"
    for amp in bf16 none; do
        j=$LOGS/lerobot_pi0_all_${amp}.json
        [ "$(jget "$j" 'r.get("does_not_fit")')" = '?' ] ||
            echo "LeRobot (--amp $amp) does not fit: $(jget "$j" 'r["does_not_fit"]')"
    done
    # pi0's chunk: train_vla's (with the graph and without) and LeRobot's, the ratio to train_vla's with the graph
    ours_json=$LOGS/bench_pi0_infer.json
    ours_ms=$(jget "$ours_json" 'r["runs"]["graphs"]["ms_per_chunk_median"]')
    refused=$(grep -E -m 1 '^error: .* takes? ' "$LOGS/bench_pi0_infer.log" 2> /dev/null)
    echo
    echo "pi0 inference: one action chunk at batch 1 (2 cameras at 224 px, 48 tokens, the state; the prefix once"
    echo "and 10 Euler steps), $CHUNKS timed chunks after 5 untimed, medians"
    irow "policy" "ms/chunk" "p90" "vs ours" "on the device"
    irow "----" "---" "---" "---" "---"
    for mode in graphs eager; do
        if [ "$mode" = graphs ]; then what="Euler steps as a CUDA graph"; else what="Euler steps launched one by one"; fi
        if [ ! -f "$ours_json" ]; then
            irow "train_vla libvla_gpu.so (bf16, $what)" "$([ -n "$refused" ] && echo refused || echo not run)" "" "" ""
            continue
        fi
        split="prefix $(jget "$ours_json" "r['runs']['$mode']['prefix_ms_median']") + steps $(jget "$ours_json" "r['runs']['$mode']['steps_ms_median']") ms"
        ms=$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_median']")
        irow "train_vla libvla_gpu.so (bf16, $what)" "$ms" "$(jget "$ours_json" "r['runs']['$mode']['ms_per_chunk_p90']")" \
            "$(ratio "$ours_ms" "$ms")" "$split"
    done
    j=$LOGS/lerobot_pi0_infer_bf16.json
    if [ -f "$j" ]; then
        sel=$(jget "$j" 'r["infer"]["ms_select_action_with_processors_median"]')
        pred=$(jget "$j" 'r["infer"]["ms_per_chunk_median"]')
        irow "LeRobot 0.6.1 select_action (dtype bfloat16; the copies)" "$sel" "-" "$(ratio "$ours_ms" "$sel")" \
            "peak $(jget "$j" 'r["infer"]["peak_memory_bytes"] / 2**30') GiB"
        irow "LeRobot 0.6.1 predict_action_chunk (dtype bfloat16)" "$pred" "-" "$(ratio "$ours_ms" "$pred")" ""
    else
        irow "LeRobot 0.6.1 select_action (dtype bfloat16; the copies)" "not run" "" "" ""
    fi
    echo "(vs ours: their ms per chunk over train_vla's with the CUDA graph; above 1 means train_vla is faster;"
    echo " train_vla's figure is the whole act() call from raw observations and the instruction's bytes, LeRobot's"
    echo " select_action from its tokens and normalized state, with the copies to and from the device)"
    [ -z "$refused" ] || echo "train_vla's library refused pi0: $refused"

    # recomputation (the `more` call): --train all at batch B, none (the benchmark) against attn and layer
    if [ -f "$LOGS/bench_recompute_attn.log" ] || [ -f "$LOGS/bench_recompute_layer.log" ]; then
        local none_sps level
        read -r _ _ none_sps <<< "$(step_figures "$LOGS/bench_train_vla_all.log")"
        echo
        echo "--recompute, --train all, batch $B: step time and memory held (peak GPU memory of the run)"
        row "level" "ms/step" "samples/s" "vs none" "" "memory GiB"
        row "----" "---" "---" "---" "" "---"
        for level in none attn layer; do
            log=$LOGS/bench_recompute_$level.log
            [ "$level" = none ] && log=$LOGS/bench_train_vla_all.log
            read -r ms n sps <<< "$(step_figures "$log")"
            row "$level" "${ms:-not run}" "${sps:-}" "$(ratio "${none_sps:-}" "${sps:-}")" "" "$(peak_memory "$log")"
        done
    fi
    # the attention kernels (the `more` call): dev/cuda/attention_smolvla at the smolvla shapes
    if [ -f "$LOGS/attention_bench.log" ]; then
        echo
        echo "attention at the smolvla shapes (dev/cuda/attention_smolvla; FLOPs as if unmasked):"
        grep '^bench ' "$LOGS/attention_bench.log"
    fi
}

# summary, tables and the logs into OUTDIR: after every stage
publish() {
    printf '%s\n' "${summary[@]}" > "$OUTDIR/summary.txt"
    tables > "$OUTDIR/table.txt.tmp" 2>&1 && mv "$OUTDIR/table.txt.tmp" "$OUTDIR/table.txt"
    [ "$(cd "$OUTDIR" && pwd)" = "$(cd "$WORK" && pwd)" ] && return 0
    tar -czf "$OUTDIR/logs.tar.gz.tmp" -C "$WORK" logs && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
}

# stage NAME EXPECTED COMMAND...: runs COMMAND with its output in $LOGS/NAME.log if NAME matches
# STAGES and EXPECTED seconds ("~N" an estimate, "N" measured on a GPU) fit in what is left of
# BUDGET; the one running when BUDGET is spent is stopped. Returns non-zero if it failed, was
# stopped or did not run. Where the caller has set `refusal` (an extended regex), a command that
# fails with a line matching it, and without a step line, is listed as skipped with that line.
stage() {
    local name=$1 expected=$2
    shift 2
    [[ "$name" =~ $STAGES ]] || return 1
    local secs=${expected#\~}
    if [ "$DRY_RUN" = 1 ]; then
        planned=$((planned + secs))
        plan_lines+=("$(printf '%-28s %5s s %s' "$name" "$expected" "$([ "$secs" = "$expected" ] && echo measured || echo estimate)")")
        echo "stage $name $expected: $*"
        return 1
    fi
    local left=$((BUDGET - RESERVE - SECONDS))
    if [ "$left" -lt "$secs" ] || [ "$left" -lt 10 ]; then
        summary+=("$(printf '%-28s skipped: expects %s s, %d s of BUDGET (%d s) left' "$name" "$expected" "$left" "$BUDGET")")
        failed=1
        return 1  # (no publish: the figures have not changed, and a long list of skips would outlast BUDGET)
    fi
    planned=$((planned + secs))
    echo
    echo "######## $name (expected $expected s, $left s left): $*"
    local t0=$SECONDS reason
    timeout -k 10 "$left" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$? took=$((SECONDS - t0))
    tail -n 8 "$LOGS/$name.log"
    if [ $rc -eq 0 ]; then
        summary+=("$(printf '%-28s ok (%d s; expected %s)' "$name" "$took" "$expected")")
    elif [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ "$took" -ge "$left" ]; }; then  # timeout's, not a crash
        summary+=("$(printf '%-28s STOPPED after %d s: BUDGET (%d s) spent; see %s.log' "$name" "$took" "$BUDGET" "$name")")
        failed=1
    elif [ -n "${refusal:-}" ] && ! grep -q '^step ' "$LOGS/$name.log" &&
        reason=$(grep -E -m 1 "$refusal" "$LOGS/$name.log"); then
        summary+=("$(printf '%-28s skipped after %d s: %s' "$name" "$took" "$reason")")
        failed=1
    else
        summary+=("$(printf '%-28s FAILED, exit %d (%d s): see %s.log' "$name" "$rc" "$took" "$name")")
        failed=1
    fi
    publish
    return $rc
}
note() {  # a line of the summary that is no stage's result
    summary+=("$(printf '%-28s %s' "$1" "$2")")
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    nvcc --version | tail -n 2
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    if git rev-parse --short HEAD > /dev/null 2>&1; then
        echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with local changes)'), $(date -u +%Y-%m-%d)"
    else  # (a copy of the tree without .git: the commit `prepare` saw)
        echo "commit $(cat "$PREPARED_COMMIT" 2> /dev/null || echo unknown) (as prepared), $(date -u +%Y-%m-%d)"
    fi
    echo "call: $MODE; settings: B=$B STEPS=$STEPS CHUNKS=$CHUNKS BUDGET=$BUDGET STAGES=$STAGES JOBS=$JOBS"
} > "$OUTDIR/device.txt" 2>&1
[ "$DRY_RUN" = 1 ] || cat "$OUTDIR/device.txt"

# LeRobot and its pure-Python dependencies travel as wheels (dev/lerobot/wheels.sh, carried as .whl)
have_lerobot=0
wants_lerobot=0
for name in lerobot_{expert,all}_{bf16,none} lerobot_infer_{none,bf16} lerobot_pi0_all_{bf16,none} \
    lerobot_pi0_infer_bf16; do
    [[ "$name" =~ $STAGES ]] && wants_lerobot=1
done
if [ "$DRY_RUN" = 1 ] || [ $wants_lerobot = 0 ]; then
    have_lerobot=1  # (listed as if the wheels were there: nothing runs)
elif ls .whl/lerobot-*.whl > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lerobot_site \
        .whl/*.whl && export PYTHONPATH=/tmp/lerobot_site${PYTHONPATH:+:$PYTHONPATH} && have_lerobot=1
fi
[ $have_lerobot = 1 ] || [ $wants_lerobot = 0 ] || note lerobot "skipped: no .whl/lerobot-*.whl (run dev/lerobot/wheels.sh where pip works, carry .whl)"
# LeRobot's pi0 samples only under the transformers it pins (<5.6; the image's 5.17 no longer takes
# create_causal_mask's cache_position): its stages run with dev/lerobot/wheels.sh --pinned's wheels
# (.whl/pinned, fetched by `prepare`) ahead of the image's
PI0_SITE=/tmp/lerobot_site_pinned
pi0_python=(env "PYTHONPATH=$PI0_SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON")
wants_pi0=0
for name in lerobot_pi0_all_{bf16,none} lerobot_pi0_infer_bf16; do [[ "$name" =~ $STAGES ]] && wants_pi0=1; done
if [ "$DRY_RUN" != 1 ] && [ "$MODE" = more ] && [ $have_lerobot = 1 ] && [ $wants_pi0 = 1 ]; then
    if ! ls .whl/pinned/transformers-*.whl > /dev/null 2>&1 ||
        ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$PI0_SITE" \
            .whl/pinned/*.whl; then
        pi0_python=("$PYTHON")
        note lerobot_pinned "missing: LeRobot's pi0 runs under the image's transformers, where its chunk fails \
(carry .whl/pinned, fetched by dev/gpu_check.sh prepare)"
    fi
fi
# LeRobot's references for the GPU tests (made by `prepare` or `make setup && make test` elsewhere)
refs=()
if [ "$DRY_RUN" = 1 ] || { [ -f "$REFS/all/ref.safetensors" ] && [ -f "$REFS/expert/c_config.txt" ] &&
        [ -f "$REFS/vlm/c_config.txt" ] && [ -f "$REFS/all/c_config.txt" ]; }; then
    refs=(--smolvla "$REFS")
else
    note lerobot_ref "missing: the GPU tests skip their LeRobot cases (carry $REFS, made by dev/gpu_check.sh prepare)"
fi
if [ "$DRY_RUN" = 1 ] || [ -f "$PI0_REFS/all/ref.safetensors" ]; then
    refs+=(--pi0 "$PI0_REFS")
else
    note lerobot_ref_pi0 "missing: the GPU tests skip their pi0 cases (carry $PI0_REFS, made by dev/gpu_check.sh prepare)"
fi

# train_vla_bench NAME EXPECTED MODE [FLAGS...]: the smolvla preset at batch B, STEPS timed steps
train_vla_bench() {
    local name=$1 expected=$2 train=$3
    shift 3
    [ "$DRY_RUN" = 1 ] || rm -rf "${RUNS:?}/$name"
    stage "$name" "$expected" build/gpu/train_vla_bf16 -p smolvla --train "$train" -b "$B" -n $((STEPS + 1)) -u 10 \
        -i "$BENCH_DATA" -o "$RUNS/$name" --no-checkpoint --log-every 10 "$@"
}
# lerobot_train EXPECTED MODE AMP, lerobot_infer EXPECTED AMP: LeRobot's step at batch B, its chunks at batch 1
lerobot_train() {
    [ $have_lerobot = 1 ] || return 1
    stage "lerobot_$2_$3" "$1" "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --train "$2" --amp "$3" \
        --batch "$B" --steps "$STEPS" --warmup 5 --device cuda --json "$LOGS/lerobot_$2_$3.json"
}
lerobot_infer() {
    [ $have_lerobot = 1 ] || return 1
    stage "lerobot_infer_$2" "$1" "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --infer --infer-batch 1 \
        --amp "$2" --steps "$CHUNKS" --warmup 5 --device cuda --json "$LOGS/lerobot_infer_$2.json"
}
# pi0_train_vla EXPECTED: train_vla -p pi0 --train all at batch PI0_B; a refusal of the model (its
# "error: ... take(s) ..." line before any step: a head size or width past what the GPU kernels take,
# after the weights' init) is listed as skipped with its line; any other error is a failure
pi0_train_vla() {
    local refusal='^error: .* takes? '
    [ "$DRY_RUN" = 1 ] || rm -rf "${RUNS:?}/bench_pi0_train_vla"
    stage bench_pi0_train_vla "$1" build/gpu/train_vla_bf16 -p pi0 --train all --recompute none -b "$PI0_B" \
        -n $((PI0_STEPS + 1)) -u 10 -i "$BENCH_DATA" -o "$RUNS/bench_pi0_train_vla" --no-checkpoint --log-every 5
}
# lerobot_pi0_train EXPECTED AMP, lerobot_pi0_infer EXPECTED AMP: LeRobot's PI0Policy, its step at batch
# PI0_B (--train all, its default), its chunks at batch 1, under its pinned transformers; out of memory
# is listed as skipped
lerobot_pi0_train() {
    [ $have_lerobot = 1 ] || return 1
    local refusal='^bench_lerobot: does not fit: '
    stage "lerobot_pi0_all_$2" "$1" "${pi0_python[@]}" dev/lerobot/bench_lerobot.py --preset pi0 --train all \
        --amp "$2" --batch "$PI0_B" --steps "$PI0_STEPS" --warmup 5 --device cuda --json "$LOGS/lerobot_pi0_all_$2.json"
}
# pi0_infer EXPECTED: train_vla's pi0 chunk at batch 1 through libvla_gpu.so, with the CUDA graph and
# without, on a random checkpoint bench_infer.py writes for it (15.5 GB: in memory where /dev/shm has
# room, a disk's write being slower, else in WORK), removed after so that it holds neither for the
# stages after it; the library's refusal of the model (train_vla.cu's "error: ... take(s) ..." line)
# is listed as skipped, as the trainer's is
pi0_infer() {
    local refusal='^error: .* takes? ' dir=$WORK/bench_pi0 rc
    if [ "$(df --output=avail -B 1G /dev/shm 2> /dev/null | tail -n 1)" -ge 20 ] 2> /dev/null; then
        dir=/dev/shm/gpu_check_pi0_$$
    fi
    stage bench_pi0_infer "$1" "$PYTHON" dev/bench_infer.py --preset pi0 --chunks "$CHUNKS" --warmup 5 --graphs both \
        --out-dir "$dir" --json "$LOGS/bench_pi0_infer.json"
    rc=$?
    [ "$DRY_RUN" = 1 ] || rm -rf "$dir"
    return $rc
}
lerobot_pi0_infer() {
    [ $have_lerobot = 1 ] || return 1
    local refusal='^bench_lerobot: does not fit: '
    stage "lerobot_pi0_infer_$2" "$1" "${pi0_python[@]}" dev/lerobot/bench_lerobot.py --preset pi0 --infer \
        --infer-batch 1 --amp "$2" --steps "$CHUNKS" --warmup 5 --device cuda --json "$LOGS/lerobot_pi0_infer_$2.json"
}
# the bf16 GPU tests: the groups against LeRobot's references and the oracle (headline), the rest (more)
test_gpu_bf16() {
    stage "$1" "$2" env "$3" build/gpu/test_vla_gpu_bf16 build/test build/gpu/train_vla_bf16 \
        build/gpu/train_vla_single_gpu_bf16 "${refs[@]}"
}

# what this call builds: the binaries `prepare` did not build for these sources and this GPU (or
# that do not load here), the benchmark's data, the fixtures not carried; for `more` also the CPU
# trainer
# (binaries there already, built here by an earlier call, are up to date for make: a quick build)
have_binaries=1
for bin in "${GPU_BINARIES[@]}"; do
    { [ -f "$bin" ] && ! ldd "$bin" 2> /dev/null | grep -q 'not found'; } || have_binaries=0
done
prepared=0
if [ $have_binaries = 1 ] && [ -f "$PREPARED" ] && [ "$(sources_stamp "$(gpu_arch)")" = "$(cat "$PREPARED")" ]; then
    prepared=1
    note build "the GPU binaries that dev/gpu_check.sh prepare built for these sources ($PREPARED)"
fi
build=(data/synthetic "$BENCH_DATA")
[ "$MODE" = more ] && build+=(train_vla_cpu)  # (checkpoints continued across the trainers)
[ $prepared = 1 ] || build+=("${GPU_BINARIES[@]}")
for f in "${FIXTURES[@]}"; do
    copy=$FIXTURE_COPIES/$(basename "$f")
    [ -f "$f" ] || [ "$DRY_RUN" = 1 ] || [ ! -f "$copy" ] || { mkdir -p "$(dirname "$f")" && cp -p "$copy" "$f"; }
    [ -f "$f" ] || build+=("$f")
done
# (the plan, DRY_RUN, counts the slower case: nothing prepared)
build_expected=$([ $have_binaries = 1 ] && [ "$DRY_RUN" != 1 ] && echo '~25' || echo '~95')

if [ "$MODE" = headline ]; then
    # 1. one parallel build: ~95 s where the four nvcc builds of train_vla.cu run here (~60-80 s
    # each on one core), ~25 s where `prepare` made them (the benchmark's data)
    stage build "$build_expected" make -j"$JOBS" PYTHON="$PYTHON" "${build[@]}" ||
        { [ "$DRY_RUN" = 1 ] || echo "gpu_check: the build failed; the stages that need it will fail too"; }
    # 2. train_vla: setup (~8 s: the 450M weights, cuBLASLt, NCCL) and 31 steps of 75 / 210 ms
    # (the H100's at 1c7af07)
    train_vla_bench bench_train_vla_expert '~15' expert
    train_vla_bench bench_train_vla_all '~20' all
    # 3. LeRobot's step in bf16: imports and the model's build (~25 s), 35 steps (seconds measured on
    # an H200 at 4e9e137, as are the other plain numbers)
    lerobot_train 34 expert bf16
    lerobot_train 33 all bf16
    # 4. one chunk at batch 1: the random checkpoint (2.4 GB, made once by torch), two policies on
    # it, 55 chunks each of ~25 ms; LeRobot's select_action, 55 chunks of ~230 ms
    stage bench_infer 58 env VLA_PROFILE_ACT=3 "$PYTHON" dev/bench_infer.py --preset smolvla --chunks "$CHUNKS" \
        --warmup 5 --graphs both --json "$LOGS/bench_infer.json"
    lerobot_infer 48 none
    # 5. the bf16 trainer against LeRobot's references and the oracle, every train mode
    test_gpu_bf16 test_gpu_bf16_lerobot '~60' VLA_GPU_TESTS=oracle,lerobot
    # 6. where the step's time goes: the third step of each mode by phase, operation and shape
    for train in expert all; do
        [ "$DRY_RUN" = 1 ] || rm -rf "${RUNS:?}/profile_$train"
        stage "profile_$train" '~15' build/gpu/train_vla_bf16 -p smolvla --train "$train" -b "$B" -n 3 -u 2 \
            -i "$BENCH_DATA" -o "$RUNS/profile_$train" --no-checkpoint --log-every 1 --profile 3
    done
else
    stage build "$build_expected" make -j"$JOBS" PYTHON="$PYTHON" "${build[@]}"
    # pi0, the model the headline call does not time. train_vla: the 3.24B weights' init on the host
    # (OpenMP threads draw them in chunks: about 80 s on 2 cores, less on more), the upload, 11
    # steps of ~0.2 s. LeRobot: its imports and the model's build on the GPU (~30 s), 15 steps (bf16
    # ~0.3 s, fp32 ~0.6 s, where it fits); 55 chunks of ~0.1 s. train_vla's chunk: torch's import,
    # the 3.24B weights drawn on every core (~5 s), the 15.5 GB checkpoint written (~20 s into
    # memory: two copies and a CRC-32) and loaded once (~15 s: its CRC-32, the upload), 55 chunks
    # with the graph and 55 without of ~0.05 s
    pi0_train_vla '~100'
    lerobot_pi0_train '~45' bf16
    pi0_infer '~70'
    lerobot_pi0_infer '~40' bf16
    lerobot_pi0_train '~50' none
    # the rest of the bf16 tests, then LeRobot's other settings
    test_gpu_bf16 test_gpu_bf16_rest '~90' VLA_GPU_SKIP=oracle,lerobot
    lerobot_train 32 expert none
    lerobot_train 47 all none
    lerobot_infer '~35' bf16
    # the other precisions and the attention kernels' program: one parallel build
    stage build_more '~90' bash -c "make -j$JOBS build/gpu/train_vla_fp32 build/gpu/test_vla_gpu_fp32 \
        build/gpu/train_vla_fp16 build/gpu/test_vla_gpu_fp16 data/default/metaworld_mt10_000.bin &&
        make -C dev/cuda -j$JOBS attention_smolvla"
    stage test_gpu_fp32 '~120' build/gpu/test_vla_gpu_fp32 build/test build/gpu/train_vla_fp32 "${refs[@]}"
    # fp16: its oracle case and the loss scaling (fp16 tensor cores exist on sm_90 too)
    stage test_gpu_fp16 '~30' env VLA_GPU_TESTS=oracle:all,fp16 build/gpu/test_vla_gpu_fp16 build/test \
        build/gpu/train_vla_fp16 "${refs[@]}"
    # the attention kernels at the smolvla shapes, every version beside the trainer's: their checks
    # and timings (version 3 per images a pass and score type, version 4 at 64 and 128 queries a
    # block, version 2 against version 4 on the masked calls)
    stage attention_bench '~40' dev/cuda/attention_smolvla
    # the oracle under torch.compile (each kind of layer compiled once for all its layers)
    for train in expert all; do
        stage "bench_torch_compile_$train" '~200' "$PYTHON" dev/model.py -i "$BENCH_DATA" -p smolvla \
            --train-mode "$train" -b "$B" --bench "$STEPS" --device cuda --amp bf16 --compile
    done
    # short runs: the shipped data (the loss must fall), the launch scripts at 1 GPU, recomputation's
    # memory and time at the smolvla preset, task-balanced sampling (each a new run in its folder)
    [ "$DRY_RUN" = 1 ] || rm -rf "${RUNS:?}/train_default" "${RUNS:?}/balance_default"
    stage train_default '~30' build/gpu/train_vla_bf16 -b 32 -n 300 -u 30 -l 1e-3 --log-every 50 --no-checkpoint \
        -o "$RUNS/train_default"
    stage launchers '~40' env GPU_TESTS=build/gpu tests/runs/test_launchers.sh
    for level in attn layer; do
        train_vla_bench "bench_recompute_$level" '~25' all --recompute "$level"
    done
    stage balance_default '~20' build/gpu/train_vla_bf16 -b 32 -n 50 -u 10 -l 1e-3 --log-every 10 --balance tasks \
        --no-checkpoint -o "$RUNS/balance_default"
    # the dev/cuda programs: their checks against the CPU and their benchmarks
    stage build_dev_cuda '~150' make -C dev/cuda -j"$JOBS"
    for prog in dev/cuda/*.cu; do
        name=$(basename "$prog" .cu)
        [ "$name" = attention_smolvla ] && continue  # (attention_bench)
        stage "cuda_$name" '~10' "dev/cuda/$name"
    done
fi

if [ "$DRY_RUN" = 1 ]; then
    planned=$((planned + OVERHEAD))
    echo
    echo "plan of the $MODE call (BUDGET $BUDGET s):"
    printf '%s\n' "${plan_lines[@]}"
    printf '%-28s %5s s %s\n' "(facts, wheels, tables)" "~$OVERHEAD" estimate
    echo "sum: $planned s of BUDGET $BUDGET s"
fi
publish
echo
echo "######## summary"
cat "$OUTDIR/summary.txt"
echo
cat "$OUTDIR/table.txt"
exit $failed
