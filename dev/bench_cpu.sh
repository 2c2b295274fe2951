#!/usr/bin/env bash
# CPU training-step time of train_vla_cpu against the PyTorch oracle dev/model.py --train (float32,
# eager) on the same preset (SmolVLA or pi0), train mode, data, batch and thread count. Both run
# STEPS + 1 steps and leave the first (warm-up) out: the figures are medians of STEPS timed steps.
# Then, where LeRobot's venv is (build/lerobot-venv), the same comparison against LeRobot 0.6.1's
# own training step (dev/lerobot/bench_lerobot.py --device cpu, fp32, update_policy: SmolVLAPolicy
# for small and smolvla, PI0Policy for pi0_tiny, pi0_small and pi0) on its batch: 2 cameras of
# 224 px, state 6, action 5. train_vla_cpu trains on a shard of those shapes (data/synthetic), at
# the same preset, train mode, batch, steps and threads; LeRobot runs one untimed step, then STEPS
# timed.
#   dev/bench_cpu.sh                      # small preset, --train all, batch 8, 2 threads, data/default
#   B=32 dev/bench_cpu.sh
#   PRESET=smolvla MODE=expert B=2 STEPS=5 dev/bench_cpu.sh
#   PRESET=pi0_small B=8 dev/bench_cpu.sh
#   LEROBOT=0 dev/bench_cpu.sh            # the oracle only
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-small}
MODE=${MODE:-all}
B=${B:-8}
STEPS=${STEPS:-20}
THREADS=${THREADS:-2}
DATA=${DATA:-data/default}
PYTHON=${PYTHON:-build/venv/bin/python}
LEROBOT=${LEROBOT:-1}
LEROBOT_PYTHON=${LEROBOT_PYTHON:-build/lerobot-venv/bin/python}
make -s train_vla_cpu
rm -rf build/bench_cpu
case "$PRESET" in pi0*) family=pi0 ;; *) family=SmolVLA ;; esac
c_ms=$(./train_vla_cpu -p "$PRESET" --train "$MODE" -b "$B" -n $((STEPS + 1)) -t "$THREADS" -i "$DATA" -o build/bench_cpu --no-checkpoint \
       --log-every 1000000 | awk '/^median step time/ {print $4}')
py_ms=$(OMP_NUM_THREADS="$THREADS" "$PYTHON" dev/model.py -i "$DATA" -p "$PRESET" --train-mode "$MODE" -b "$B" \
        --train $((STEPS + 1)) --threads "$THREADS" --dtype float32 | awk '/^ms_per_step_median/ {print $2}')
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "CPU training step of $family, preset $PRESET, --train $MODE, batch $B, $THREADS threads, median of $STEPS steps (first excluded), data $DATA"
echo "machine: $cpu ($(nproc) cores), commit $commit, torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
printf '| %-26s | %14s |\n' "trainer" "median ms/step"
printf '| %-26s | %14s |\n' "train_vla_cpu (C + OpenMP)" "$c_ms"
printf '| %-26s | %14s |\n' "PyTorch oracle (fp32 eager)" "$py_ms"
awk -v c="$c_ms" -v p="$py_ms" 'BEGIN { printf "PyTorch / train_vla_cpu time ratio: %.2fx\n", p / c }'

# ---- against LeRobot's own training step, same model sizes, batch, steps and threads
if [[ "$LEROBOT" == 0 ]]; then exit 0; fi
if [[ "$PRESET" == tiny ]]; then
    echo "LeRobot: skipped (dev/lerobot/bench_lerobot.py builds small, smolvla, pi0_tiny, pi0_small and pi0)"
    exit 0
fi
if [[ ! -x "$LEROBOT_PYTHON" ]]; then
    echo "LeRobot: skipped ($LEROBOT_PYTHON not found: make setup makes it)"
    exit 0
fi
make -s data/synthetic
mkdir -p build/bench_cpu_lerobot
shard=build/bench_cpu_lerobot/data.bin
[[ -f "$shard" ]] || ./data/synthetic -o "$shard" --cams 2 --img 224 --state 6 --action 5 --episodes 30 \
    --min-len 20 --max-len 40 > /dev/null
rm -rf build/bench_cpu_lerobot/run
c2_ms=$(./train_vla_cpu -p "$PRESET" --train "$MODE" -b "$B" -n $((STEPS + 1)) -t "$THREADS" -i "$shard" \
        -o build/bench_cpu_lerobot/run --no-checkpoint --log-every 1000000 | awk '/^median step time/ {print $4}')
OMP_NUM_THREADS="$THREADS" "$LEROBOT_PYTHON" dev/lerobot/bench_lerobot.py --preset "$PRESET" --train "$MODE" \
    --batch "$B" --steps "$STEPS" --warmup 1 --device cpu --threads "$THREADS" \
    --json build/bench_cpu_lerobot/lerobot.json > build/bench_cpu_lerobot/lerobot.log 2>&1 \
    || { echo "LeRobot: failed, see build/bench_cpu_lerobot/lerobot.log"; exit 1; }
lr_ms=$("$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); print("%.1f" % d["train"]["ms_per_step_median"])' \
        build/bench_cpu_lerobot/lerobot.json)
echo
echo "against LeRobot 0.6.1's own $family training step (fp32, update_policy): preset $PRESET, --train $MODE,"
echo "batch $B, $THREADS threads, medians of $STEPS timed steps each, 2 cameras of 224 px resized to the preset's, state 6, action 5"
if [[ "$family" == pi0 ]]; then
    echo "(both read the preset's max_text language tokens, padded and masked)"
else
    echo "(train_vla reads the preset's max_text tokens, LeRobot pads its stand-in tokenizer's ids to the batch's longest)"
fi
printf '| %-26s | %14s |\n' "trainer" "median ms/step"
printf '| %-26s | %14s |\n' "train_vla_cpu (C + OpenMP)" "$c2_ms"
printf '| %-26s | %14s |\n' "LeRobot 0.6.1 (fp32 eager)" "$lr_ms"
awk -v c="$c2_ms" -v p="$lr_ms" 'BEGIN { printf "LeRobot / train_vla_cpu time ratio: %.2fx (above 1: train_vla_cpu is faster)\n", p / c }'
