#!/usr/bin/env bash
# The checkpoint bytes of fixed short runs of each trainer: the CPU reference, and train_vla.cu
# under the emulation (dev/cuda/emu) in fp32, bf16 and fp16, each --train mode, plus two emulated
# GPUs. A change that should compute nothing new (a move, a rename, a split) leaves every line
# the same:
#     dev/checkpoint_bytes.sh > before.txt; (change); dev/checkpoint_bytes.sh | diff before.txt -
# WORK (build/checkpoint_bytes) holds the runs; each run's folder is made anew.
set -u
cd "$(dirname "$0")/.."
WORK=${WORK:-build/checkpoint_bytes}
EMU=build/emu
make -s -j2 train_vla_cpu $EMU/train_vla_fp32 $EMU/train_vla_bf16 $EMU/train_vla_fp16 > "${WORK%/}.make.log" 2>&1 ||
    { echo "error: the build failed: see ${WORK%/}.make.log" >&2; exit 1; }
mkdir -p "$WORK"
status=0
# one fixed run: its name, then the trainer and its extra arguments; prints "name sha256"
run() {
    local name=$1; shift
    local dir=$WORK/$name
    rm -rf "$dir"
    if ! "$@" -p tiny -b 2 -n 3 -u 1 -k 0 -t 1 --workers 1 -s 7 -i data/default -o "$dir" > "$dir.log" 2>&1; then
        echo "$name FAILED: see $dir.log"; status=1; return
    fi
    echo "$name $(sha256sum "$dir"/ckpt_00000003.bin | cut -d ' ' -f 1)"
}
for mode in expert vlm all; do
    run "cpu_$mode" ./train_vla_cpu --train "$mode"
    for p in fp32 bf16 fp16; do
        run "emu_${p}_$mode" "$EMU/train_vla_$p" --train "$mode"
    done
done
run emu_bf16_all_2gpus env CUDA_EMU_DEVICES=2 "$EMU/train_vla_bf16" --train all -g 2
run cpu_all_2ranks ./train_vla_cpu --train all -g 2
exit $status
