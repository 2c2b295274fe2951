#!/usr/bin/env bash
# Runs the fuzz harnesses of dev/fuzz (built by `make fuzz_build`), each for SECONDS, and fails on
# any crash, sanitizer report, hang (one input running past 10 s) or memory blow-up (2 GiB).
#   dev/fuzz/run_fuzz.sh SECONDS [NAME[:SECONDS] ...]
# NAME: shard, shards, checkpoint, policy, safetensors, log, names or boot (all of them when none
# is named); NAME:SECONDS runs that one for its own time.
# FUZZ_CORPUS=DIR keeps each harness's corpus in DIR/NAME and grows it run after run (make fuzz);
# unset, every run starts from the seeds alone (make test), so the test is the same each time.
# The seeds are made by the project's own tools: data/synthetic's shards and dev/fuzz/make_seeds's
# (every harness's; see make_seeds.c). A crashing input is kept in build/fuzz/crashes/ for
# `build/fuzz/fuzz_NAME FILE`. Each harness runs with a TMPDIR of its own (in /dev/shm where it
# can: log.jsonl's rewrite is flushed to disk on every input), removed when it ends.
set -u
cd "$(dirname "$0")/../.." || exit 1
all_seconds=${1:?usage: dev/fuzz/run_fuzz.sh SECONDS [NAME[:SECONDS] ...]}
shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(shard shards checkpoint policy safetensors log names boot)
passed=0
failed=0

seeds=build/fuzz/seeds
if [ ! -f $seeds/done ]; then
    rm -rf $seeds
    mkdir -p $seeds/shard
    s=0
    for shape in "1 8 2 2 2 2 3" "2 8 3 2 3 1 4" "1 16 2 4 4 3 6" "3 8 2 3 2 2 2"; do
        read -r cams img state action episodes min max <<< "$shape"
        s=$((s + 1))
        ./data/synthetic -o $seeds/shard/synthetic_$s.bin --cams "$cams" --img "$img" --state "$state" \
            --action "$action" --episodes "$episodes" --min-len "$min" --max-len "$max" --seed $s > /dev/null || exit 1
    done
    ./data/synthetic -o $seeds/shard/synthetic_sizes.bin --cam-size 8x12 --cam-size 6x6 --state 2 --action 2 \
        --episodes 2 --min-len 2 --max-len 3 --seed 5 > /dev/null || exit 1
    build/fuzz/make_seeds $seeds || exit 1
    touch $seeds/done
fi

mkdir -p build/fuzz/crashes build/fuzz/logs
tmp_base=/dev/shm
[ -d $tmp_base ] && [ -w $tmp_base ] || tmp_base=${TMPDIR:-/tmp}
for target in "${targets[@]}"; do
    name=${target%%:*}
    seconds=$all_seconds
    [ "$name" != "$target" ] && seconds=${target#*:}
    if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then echo "error: $target: expected NAME:SECONDS, SECONDS a whole number"; exit 2; fi
    case $name in
        shard|shards|checkpoint|safetensors|log|names|boot) seed_dir=$seeds/$name ;;
        policy) seed_dir=$seeds/checkpoint ;;
        *) echo "error: unknown fuzz target '$name': use shard, shards, checkpoint, policy, safetensors, log, names or boot"
           exit 2 ;;
    esac
    if [ -n "${FUZZ_CORPUS:-}" ]; then
        corpus=$FUZZ_CORPUS/$name
        mkdir -p "$corpus"
    else
        corpus=$(mktemp -d)
    fi
    # make fuzz's logs stay in build/fuzz/logs; a test run's only when it fails (a test run
    # beside a long one must not write over the long one's log)
    if [ -n "${FUZZ_CORPUS:-}" ]; then log=build/fuzz/logs/$name.log; else log=$(mktemp); fi
    # -max_len: the seeds are 1-20 KB, inputs may grow to 64 KB; the outer timeout catches a
    # harness that stops answering altogether
    work=$(mktemp -d "$tmp_base/fuzz_$name.XXXXXX")
    TMPDIR=$work timeout $((seconds + 300)) "build/fuzz/fuzz_$name" "$corpus" "$seed_dir" -max_total_time="$seconds" \
        -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 -artifact_prefix="build/fuzz/crashes/$name-" \
        > "$log" 2>&1
    rc=$?
    rm -rf "$work"
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}')
    edges=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
    total=$(grep -o 'Loaded 1 modules *([0-9]* inline 8-bit counters)' "$log" | grep -o '([0-9]*' | tr -d '(')
    inputs=$(find "$corpus" -type f | wc -l)
    [ -z "${FUZZ_CORPUS:-}" ] && rm -rf "$corpus"
    summary="$seconds s, ${execs:-?} executions ($(( ${execs:-0} / (seconds > 0 ? seconds : 1) ))/s), ${edges:-?} of ${total:-?} edges covered, ${inputs} corpus inputs"
    if [ "$rc" -eq 0 ] && [ -n "$execs" ]; then
        echo "  ok   fuzz_$name: $summary"
        passed=$((passed + 1))
        if [ -z "${FUZZ_CORPUS:-}" ]; then rm -f "$log"; fi
    else
        if [ -z "${FUZZ_CORPUS:-}" ]; then mv "$log" "build/fuzz/logs/test_$name.log"; log=build/fuzz/logs/test_$name.log; fi
        echo "  FAIL fuzz_$name: exit $rc after $summary; its log: $log"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|ALARM' "$log" | head -n 8 | sed 's/^/       /'
        failed=$((failed + 1))
    fi
done
echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
