#!/usr/bin/env bash
# Runs a training command until it finishes: after a failure (a lost GPU, an NCCL timeout, a
# killed job) it starts the command again with -y 1, which continues from the newest complete
# checkpoint in the output folder. It gives up after MAX_FAILURES attempts in a row that saved
# no new checkpoint (a failure that repeats, such as a bad flag), returning the last exit status.
#
#   scripts/train_until_done.sh ./train_vla -g 8 -p smolvla -n 20000 -o out/smolvla
#   scripts/train_until_done.sh scripts/train_multi_gpu.sh -n 20000
#
# Ctrl-C or SIGTERM (Slurm's end of the time limit) is passed to the trainer, which saves a
# checkpoint at the end of its step and exits; then the loop stops too, with the trainer's status.
#
# MAX_FAILURES (3): attempts in a row without progress before giving up.
# RETRY_DELAY (10): seconds between attempts (let a restarted node, a freed port catch up).
set -uo pipefail
if [ $# -eq 0 ]; then
    echo "usage: $0 TRAINER [flags...]: runs the trainer with -y 1 until it finishes" >&2
    exit 2
fi
MAX_FAILURES=${MAX_FAILURES:-3}
RETRY_DELAY=${RETRY_DELAY:-10}

# the output folder: the last -o/--output among the flags, else the OUT variable, else out
out=${OUT:-out}
args=("$@")
for ((i = 1; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        -o | --output) if ((i + 1 < ${#args[@]})); then out=${args[i + 1]}; fi ;;
    esac
done

# the step of the newest complete checkpoint in the output folder (0: none); an unfinished
# write lives under another name until its rename, so ckpt_*.bin are complete
newest_step() {
    local newest
    newest=$(find "$out" -maxdepth 1 -name 'ckpt_*.bin' 2> /dev/null | sed -n 's/.*ckpt_0*\([0-9][0-9]*\)\.bin$/\1/p' | sort -n | tail -n 1)
    echo "${newest:-0}"
}

# the trainer runs in the background so that a signal reaches this trap at once: the trap passes
# it on, the loop waits for the trainer's checkpoint and exit, and does not start another attempt
stop=0
child=
trap 'stop=1; if [ -n "$child" ]; then kill -TERM "$child" 2> /dev/null; fi' INT TERM

failures=0
attempt=1
while true; do
    before=$(newest_step)
    echo "train_until_done: attempt $attempt from step $before: $* -y 1"
    "$@" -y 1 &
    child=$!
    while true; do  # a trapped signal ends `wait` early: wait again until the trainer is gone
        wait "$child"
        rc=$?
        if ! kill -0 "$child" 2> /dev/null; then break; fi
    done
    child=
    if [ "$stop" -eq 1 ]; then
        echo "train_until_done: stopped by a signal at checkpoint step $(newest_step) (trainer exit $rc)" >&2
        exit "$rc"
    fi
    if [ "$rc" -eq 0 ]; then
        echo "train_until_done: finished after $attempt attempt(s)"
        exit 0
    fi
    after=$(newest_step)
    if [ "$after" -gt "$before" ]; then failures=0; else failures=$((failures + 1)); fi
    if [ "$failures" -ge "$MAX_FAILURES" ]; then
        echo "train_until_done: giving up: $failures attempt(s) in a row failed (exit $rc) without a new checkpoint" \
             "past step $after; the last attempt's error above says why" >&2
        exit "$rc"
    fi
    echo "train_until_done: attempt $attempt failed (exit $rc) at checkpoint step $after; again in $RETRY_DELAY s" >&2
    sleep "$RETRY_DELAY"
    if [ "$stop" -eq 1 ]; then
        echo "train_until_done: stopped by a signal at checkpoint step $(newest_step)" >&2
        exit "$rc"
    fi
    attempt=$((attempt + 1))
done
