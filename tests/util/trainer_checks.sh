# shellcheck shell=bash
# The checks tests/runs/test_hardening.sh and tests/runs/test_runs.sh share (sourced, not run): a
# pass/fail tally, a one-line error, a log's steps. Both run train_vla_cpu's tiny preset on
# build/test/a.bin.
DATA=build/test/a.bin
# shellcheck disable=SC2034  # (read by the scripts that source this file)
TRAINER=./train_vla_cpu
# shellcheck disable=SC2034
run=(-i "$DATA" -p tiny -b 2 -t 1 --workers 1)
passed=0
failed=0
check() {  # check CONDITION-EXIT-STATUS MESSAGE
    if [ "$1" -eq 0 ]; then echo "  ok   $2"; passed=$((passed + 1)); else echo "  FAIL $2"; failed=$((failed + 1)); fi
}
# one_line_error FILE NEEDLE: FILE holds exactly one line, an error naming NEEDLE
one_line_error() {
    [ "$(wc -l < "$1")" -eq 1 ] && grep -q '^error: ' "$1" && grep -qF -- "$2" "$1"
}
# steps_once LOG N: the log has steps 1..N, each exactly once, in order
steps_once() {
    [ "$(grep -o '"step": [0-9]*' "$1" | awk '{print $2}' | tr '\n' ' ')" = "$(seq -s ' ' 1 "$2") " ]
}
