#!/usr/bin/env bash
# The checkpoint bytes of fixed short runs of each trainer: the CPU reference at every preset that
# trains in seconds (tiny, small, pi0_tiny, pi0_small) and each --train mode, train_vla.cu under
# the emulation (dev/cuda/emu) in fp32, bf16 and fp16 at both test presets and each --train mode,
# two ranks and two emulated GPUs with and without ZeRO-1 (-z 1), and a run resumed from its step 2
# (-y 1). A change that should compute nothing new (a move, a rename, a split) leaves every line
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
    if ! "$@" -b 2 -n 3 -u 1 -k 0 -t 1 --workers 1 -s 7 -i data/default -o "$dir" > "$dir.log" 2>&1; then
        echo "$name FAILED: see $dir.log"; status=1; return
    fi
    echo "$name $(sha256sum "$dir"/ckpt_00000003.bin | cut -d ' ' -f 1)"
}
for preset in tiny small pi0_tiny pi0_small; do
    for mode in expert vlm all; do
        run "cpu_${preset}_$mode" ./train_vla_cpu -p "$preset" --train "$mode"
    done
done
for preset in tiny pi0_tiny; do
    for mode in expert vlm all; do
        for p in fp32 bf16 fp16; do
            run "emu_${p}_${preset}_$mode" "$EMU/train_vla_$p" -p "$preset" --train "$mode"
        done
    done
done
for z in 0 1; do
    run "emu_bf16_all_2gpus_z$z" env CUDA_EMU_DEVICES=2 "$EMU/train_vla_bf16" -p tiny --train all -g 2 -z $z
    run "cpu_all_2ranks_z$z" ./train_vla_cpu -p tiny --train all -g 2 -z $z
done
# a resume: two steps with a checkpoint at step 2, then -y 1 runs the third from it
for t in cpu emu; do
    trainer=./train_vla_cpu; [ $t = emu ] && trainer=$EMU/train_vla_bf16
    dir=$WORK/${t}_resume
    rm -rf "$dir"
    if "$trainer" -p tiny --train all -b 2 -n 2 -u 1 -k 2 -t 1 --workers 1 -s 7 -i data/default -o "$dir" > "$dir.log" 2>&1 &&
        "$trainer" -p tiny --train all -b 2 -n 3 -u 1 -k 0 -t 1 --workers 1 -s 7 -i data/default -o "$dir" -y 1 \
            >> "$dir.log" 2>&1; then
        echo "${t}_resume $(sha256sum "$dir"/ckpt_00000003.bin | cut -d ' ' -f 1)"
    else
        echo "${t}_resume FAILED: see $dir.log"; status=1
    fi
done
exit $status
