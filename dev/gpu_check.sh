#!/usr/bin/env bash
# Everything train_vla checks on a GPU, in one call: build for the GPU found, run the GPU tests
# (fp32 and bf16 against the PyTorch oracle, determinism, resume, checkpoints across trainers),
# the dev/cuda kernel checks and benchmarks, a short training run on the default data, and the
# base preset against the PyTorch oracle on the same config, batch and GPU (bf16 autocast,
# eager and torch.compile). Ends with a table; every log stays in the output folder.
#
#   dev/gpu_check.sh [OUTDIR]        (default: $OUT if set, else build/gpu_check)
#   B=16 STEPS=30 PYTHON=python3 dev/gpu_check.sh
#
# PYTHON must import torch with CUDA (the oracle). A failing stage is reported and the others
# still run; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-${OUT:-build/gpu_check}}
PYTHON=${PYTHON:-python3}
B=${B:-16}
STEPS=${STEPS:-30}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUTDIR"
summary=()
failed=0

# stage NAME COMMAND...: runs it with its output in $OUTDIR/NAME.log, prints the tail
stage() {
    local name=$1
    shift
    echo
    echo "######## $name: $*"
    local t0=$SECONDS
    "$@" > "$OUTDIR/$name.log" 2>&1
    local rc=$?
    tail -n 8 "$OUTDIR/$name.log"
    if [ $rc -eq 0 ]; then
        summary+=("$(printf '%-22s ok (%ds)' "$name" $((SECONDS - t0)))")
    else
        summary+=("$(printf '%-22s FAILED, exit %d: see %s.log' "$name" $rc "$name")")
        failed=1
    fi
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    nvcc --version | tail -n 2
    "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
} 2>&1 | tee "$OUTDIR/device.txt"

stage build make -j"$JOBS" PYTHON="$PYTHON" train_vla train_vla_cpu data/synthetic build/gpu/train_vla_bf16 \
    build/gpu/train_vla_fp32 build/gpu/train_vla_single_gpu_bf16 build/gpu/test_vla_gpu_bf16 build/gpu/test_vla_gpu_fp32 dev_cuda \
    build/test/a_state.bin build/test/b_state.bin build/test/a_train.txt build/bench/base.bin

stage test_gpu_fp32 build/gpu/test_vla_gpu_fp32 build/test build/gpu/train_vla_fp32
stage test_gpu_bf16 build/gpu/test_vla_gpu_bf16 build/test build/gpu/train_vla_bf16 build/gpu/train_vla_single_gpu_bf16
for prog in dev/cuda/*.cu; do
    name=$(basename "$prog" .cu)
    stage "cuda_$name" "dev/cuda/$name"
done

# a short run on the shipped data (small preset): the loss must fall
stage train_default ./train_vla -b 32 -n 300 -u 30 -l 1e-3 --log-every 50 -o build/gpu_check_run
# the launch scripts on this GPU (the template at 1 GPU, the resume loop's give-up path)
stage launchers env GPU_TESTS=build/gpu scripts/test_launchers.sh

# base preset against the oracle (train_vla at world size 1 through NCCL) on build/bench/base.bin, synthetic data
# of the base shapes (the build stage makes it)
rm -rf build/gpu_check_base
stage bench_train_vla ./train_vla -p base -b "$B" -n "$STEPS" -u 10 -i build/bench/base.bin -o build/gpu_check_base \
    -k 0 --keep 1 --log-every 10
stage bench_torch_eager "$PYTHON" dev/model.py -i build/bench/base.bin -p base -b "$B" --bench "$STEPS" \
    --device cuda --amp bf16
stage bench_torch_compile "$PYTHON" dev/model.py -i build/bench/base.bin -p base -b "$B" --bench "$STEPS" \
    --device cuda --amp bf16 --compile

# the scaling model (README, "Multi-GPU and multi-node") from this GPU's measured base step time
stage scaling_model "$PYTHON" dev/scaling_model.py -p base -b "$B" --from-log "$OUTDIR/bench_train_vla.log"

# LeRobot's own SmolVLA training step and inference on this GPU at the released sizes (random
# weights): the peer of the smolvla comparison. lerobot and its pure-Python dependencies travel as
# wheels (dev/lerobot/wheels.sh, carried as .whl); without them these stages are skipped.
if [ -d .whl ] && ls .whl/lerobot-*.whl > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lerobot_site \
        .whl/*.whl && export PYTHONPATH=/tmp/lerobot_site${PYTHONPATH:+:$PYTHONPATH}
    for train in expert all; do
        for amp in none bf16; do
            stage "lerobot_${train}_${amp}" "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --train "$train" \
                --amp "$amp" --batch 32 --steps 20 --warmup 5 --device cuda --json "$OUTDIR/lerobot_${train}_${amp}.json"
        done
    done
    stage lerobot_infer "$PYTHON" dev/lerobot/bench_lerobot.py --preset smolvla --amp bf16 --infer --steps 50 \
        --device cuda --json "$OUTDIR/lerobot_infer.json"
else
    summary+=("$(printf '%-22s skipped: no .whl/lerobot-*.whl (run dev/lerobot/wheels.sh here, carry .whl)' lerobot)")
fi

echo
echo "######## summary"
printf '%s\n' "${summary[@]}" | tee "$OUTDIR/summary.txt"

# the table: samples/s of each, the ratio to train_vla, MFU on the same FLOP count, peak memory
log=$OUTDIR/bench_train_vla.log
gflop=$(awk -F'|' '/model GFLOP per sample/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
peak=$(awk -F'|' '/peak bf16 TFLOP\/s/ {gsub(/ /, "", $3); print $3}' "$log" 2>/dev/null)
ours=$(awk '/^mean step time/ {print $4, $11}' "$log" 2>/dev/null)      # ms, samples/s
ours_mem=$(sed -n 's/.*peak GPU memory \([0-9.]*\) GiB.*/\1/p' "$log" 2>/dev/null)
{
    echo
    echo "base preset, batch $B, bf16, $STEPS timed steps (train_vla: mean after the first; PyTorch: median after 5 warm-up)"
    echo "device: $(head -n 2 "$OUTDIR/device.txt" | tail -n 1)"
    echo "model FLOPs per sample: ${gflop:-?} GFLOP; peak: ${peak:-?} TFLOP/s (bf16 dense)"
    printf '| %-34s | %10s | %11s | %8s | %7s | %10s |\n' "trainer" "ms/step" "samples/s" "vs ours" "MFU" "memory GiB"
    printf '| %-34s | %10s | %11s | %8s | %7s | %10s |\n' "----" "---" "---" "---" "---" "---"
    read -r ms sps <<< "${ours:-? ?}"
    mfu() { awk -v s="$1" -v g="$gflop" -v p="$peak" 'BEGIN { if (s+0 > 0 && g+0 > 0 && p+0 > 0) printf "%.1f%%", 100 * s * g / (p * 1000); else printf "?" }'; }
    printf '| %-34s | %10s | %11s | %8s | %7s | %10s |\n' "train_vla (bf16)" "$ms" "$sps" "1.00x" "$(mfu "$sps")" "${ours_mem:-?}"
    for kind in eager compile; do
        f=$OUTDIR/bench_torch_$kind.log
        tms=$(awk '/^ms_per_step/ {print $2}' "$f" 2>/dev/null)
        tsps=$(awk '/^samples_per_s/ {print $2}' "$f" 2>/dev/null)
        tmem=$(awk '/^peak_mem_gib/ {print $2}' "$f" 2>/dev/null)
        ratio=$(awk -v a="$sps" -v b="$tsps" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2fx", b / a; else printf "?" }')
        printf '| %-34s | %10s | %11s | %8s | %7s | %10s |\n' "PyTorch $kind, bf16 autocast" "${tms:-?}" "${tsps:-?}" \
            "$ratio" "$(mfu "$tsps")" "${tmem:-?}"
    done
    echo "(vs ours: PyTorch samples/s over train_vla's; below 1 means train_vla is faster)"
    echo "train_vla at world size 1 through NCCL: $(sed -n 's/^communication: //p' "$log" 2>/dev/null)"
} | tee "$OUTDIR/table.txt"
exit $failed
