#!/usr/bin/env bash
# CPU training-step time of train_vla_cpu against the PyTorch oracle dev/model.py --train (float32,
# eager) on the same SmolVLA preset, train mode, data, batch and thread count. Both run STEPS + 1
# steps and leave the first (warm-up) out of their mean: STEPS timed steps.
#   dev/bench_cpu.sh                      # small preset, --train all, batch 8, 2 threads, data/default
#   PRESET=tiny MODE=expert B=16 STEPS=20 dev/bench_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-small}
MODE=${MODE:-all}
B=${B:-8}
STEPS=${STEPS:-20}
THREADS=${THREADS:-2}
DATA=${DATA:-data/default}
PYTHON=${PYTHON:-/usr/bin/python3}
make -s train_vla_cpu
rm -rf build/bench_cpu
c_ms=$(./train_vla_cpu -p "$PRESET" --train "$MODE" -b "$B" -n $((STEPS + 1)) -t "$THREADS" -i "$DATA" -o build/bench_cpu --no-checkpoint \
       --log-every 1000000 | awk '/^mean step time/ {print $4}')
py_ms=$(OMP_NUM_THREADS="$THREADS" "$PYTHON" dev/model.py -i "$DATA" -p "$PRESET" --train-mode "$MODE" -b "$B" \
        --train $((STEPS + 1)) --threads "$THREADS" --dtype float32 | awk '/^ms_per_step/ {print $2}')
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "CPU training step of SmolVLA, preset $PRESET, --train $MODE, batch $B, $THREADS threads, $STEPS steps (first excluded), data $DATA"
echo "machine: $cpu ($(nproc) cores), commit $commit, torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
printf '| %-26s | %10s |\n' "trainer" "ms/step"
printf '| %-26s | %10s |\n' "train_vla_cpu (C + OpenMP)" "$c_ms"
printf '| %-26s | %10s |\n' "PyTorch oracle (fp32 eager)" "$py_ms"
awk -v c="$c_ms" -v p="$py_ms" 'BEGIN { printf "PyTorch / train_vla_cpu time ratio: %.2fx\n", p / c }'
