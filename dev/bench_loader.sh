#!/usr/bin/env bash
# Loader throughput at the small and smolvla preset shapes: samples/s assembled from memory-mapped
# shards by one loader thread (one core), and by the taking thread itself, with and without the
# shift augmentation. small: Meta-World's 2 cameras of 64 px; smolvla: 2 cameras stored at 224 px
# (build/bench/smolvla.bin, LeRobot's benchmark batch; the model resizes them on the device). Writes
# its shards to build/bench (about 250 MB) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
make -s dev/bench_loader data/synthetic build/bench/smolvla.bin > /dev/null
[ -f build/bench/small.bin ] || ./data/synthetic -o build/bench/small.bin --cams 2 --img 64 --state 4 --action 4 \
    --episodes 200 --min-len 20 --max-len 40 > /dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') ($(nproc) cores), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for preset in small smolvla; do
    for workers in 1 0; do
        dev/bench_loader build/bench/$preset.bin $preset 16 $workers "$SECONDS_PER_RUN" 0
    done
    dev/bench_loader build/bench/$preset.bin $preset 16 1 "$SECONDS_PER_RUN" 4
done
