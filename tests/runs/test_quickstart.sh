#!/usr/bin/env bash
# The README's quick start, run as written and in its order, each command after the one before,
# in a scratch folder that links to this checkout (so the runs' out/ is the scratch folder's, not
# the checkout's), with small step counts: the trainers' commands get `-n 3` (and the evaluation
# the checkpoint of step 3 in place of step 1,000's, one episode of 20 steps a task). `make setup`
# and `make test` are left out (make test runs this suite, after make setup). Without a GPU the
# GPU lines run the trainer built for the CPU emulation of CUDA ($GPU_TESTS/train_vla_bf16: what
# ./train_vla computes, slowly) with `-n 1`. Each command must exit 0; then what the quick start
# says it leaves is checked: the run folders out/<preset>/ with their checkpoints, log.jsonl,
# run.json and TensorBoard's file, the curves' PNG, and the lines that name each checkpoint.
# Run by `make test`; ends with `N passed, M failed`.
set -u
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
GPU_TESTS=${GPU_TESTS:-build/emu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() {  # STATUS WHAT
    if [ "$1" -eq 0 ]; then echo "  ok   $2"; passed=$((passed + 1)); else echo " FAIL  $2"; failed=$((failed + 1)); fi
}

# the quick start's commands: its indented block, continuation lines joined, comments dropped
mapfile -t commands < <(awk '
    /^## Quick start/ { on = 1; next }
    on && started && !/^    / { exit }
    on && /^    / {
        started = 1
        line = line substr($0, 5)
        if (line ~ /\\ *$/) { sub(/\\ *$/, "", line); next }
        sub(/ +#.*$/, "", line)
        gsub(/  +/, " ", line)
        print line
        line = ""
    }' README.md)
check $((${#commands[@]} < 5)) "the README's quick start holds ${#commands[@]} commands"

for entry in "$root"/* "$root"/.[!.]*; do
    name=$(basename "$entry")
    [ "$name" = out ] || [ "$name" = .git ] || ln -s "$entry" "$tmp/$name"
done
gpu=0
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L > /dev/null 2>&1; then gpu=1; fi

for cmd in "${commands[@]}"; do
    case "$cmd" in
        "make setup" | "make test") echo "  --   $cmd: left out (make test runs this suite, after make setup)"; continue ;;
    esac
    run=$cmd
    if [[ "$run" == *"./train_vla"* ]]; then
        if [[ "$run" == *"./train_vla_cpu"* ]]; then
            run="$run -n 3"
        elif [ "$gpu" -eq 1 ]; then
            run="$run -n 3"
        else
            # no GPU: the emulated GPU trainer, one step
            run=${run//.\/train_vla /CUDA_EMU_DEVICES=4 $root/$GPU_TESTS/train_vla_bf16 }
            run="$run -n 1"
        fi
    fi
    run=${run//ckpt_00001000.bin/ckpt_00000003.bin}
    run=${run//--episodes 5/--episodes 1 --max-steps 20}
    (cd "$tmp" && timeout 900 bash -c "$run") > "$tmp/said.log" 2>&1
    rc=$?
    check $rc "$cmd  (ran: $run): exit $rc$( [ "$rc" -ne 0 ] && tail -3 "$tmp/said.log" | tr '\n' ' ')"
    cat "$tmp/said.log" >> "$tmp/all.log"
done

# what the quick start says the runs leave
for preset in small pi0_small; do
    dir=$tmp/out/$preset
    [ -f "$dir/ckpt_00000003.bin" ] && [ -s "$dir/log.jsonl" ] && [ -s "$dir/run.json" ] &&
        [ -s "$dir/events.out.tfevents.train_vla" ]
    check $? "out/$preset/ holds the run's checkpoint of step 3, log.jsonl, run.json and TensorBoard's events"
    grep -q "^checkpoint of step 3: out/$preset/ckpt_00000003.bin$" "$tmp/all.log"
    check $? "a line names out/$preset/'s checkpoint"
done
[ -s "$tmp/out/small/curves.png" ]
check $? "the curves' PNG is in out/small/"
grep -q "^| mean over tasks " "$tmp/all.log"
check $? "the evaluation printed its table"
for dir in gpu gpu4; do
    ls "$tmp/out/$dir"/ckpt_*.bin > /dev/null 2>&1
    check $? "the GPU line's run folder out/$dir/ holds its checkpoint"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
