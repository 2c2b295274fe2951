#!/usr/bin/env bash
# Which lines of the readers a fuzz corpus reaches: builds each harness with clang's source-based
# coverage (no sanitizers), replays its seeds once and, where `make fuzz` has grown one, its corpus
# (build/fuzz/corpus/NAME), and prints the line and branch coverage of the functions that
# harness exists to test. The fuzzers' own "cov:" counts every edge of the binary, the sanitizers'
# check branches (never taken while nothing is wrong) included; this is the figure per function.
#   dev/fuzz/coverage.sh [NAME ...]      (NAME as dev/fuzz/run_fuzz.sh takes it; needs llvm-14: llvm-cov, llvm-profdata)
set -u
cd "$(dirname "$0")/../.." || exit 1
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(shard shards checkpoint policy safetensors log names boot)
for tool in clang-14 llvm-profdata-14 llvm-cov-14; do
    command -v $tool > /dev/null || { echo "error: $tool not found: apt-get install clang-14 llvm-14"; exit 1; }
done
mkdir -p build/fuzz/coverage
for name in "${targets[@]}"; do
    case $name in
        shard) functions="shard_open_checked dataset_open_checked shard_section_sizes dataset_assemble batch_set_text batch_fill augment_shift dataset_warn_text_collisions" ;;
        checkpoint) functions="checkpoint_read_header checkpoint_read_checked flow_config_problem flow_table_build flow_opt_domain" ;;
        policy) functions="vla_policy_load checkpoint_read_checked checkpoint_read_header flow_config_problem flow_build vla_policy_act vla_policy_act_tokens policy_check_tokens policy_observations resize_pad" ;;
        shards) functions="dataset_open_checked dataset_list_files shard_open_checked dataset_assemble" ;;
        safetensors) functions="safetensors_open st_string st_uint st_uint_array st_skip_value safetensors_find safetensors_read_f32 flow_load_safetensors" ;;
        log) functions="logger_open logger_close" ;;
        names) functions="checkpoint_step_of_name checkpoint_list checkpoint_read_header" ;;
        boot) functions="boot_hello_parse boot_identity_diff flow_config_diff boot_reply_parse boot_refusal_text" ;;
        *) echo "error: unknown fuzz target '$name': use shard, shards, checkpoint, policy, safetensors, log, names or boot"; exit 2 ;;
    esac
    seeds=build/fuzz/seeds/$([ "$name" = policy ] && echo checkpoint || echo "$name")
    [ -d "$seeds" ] || { echo "error: no seeds for $name: run make fuzz (or make test) first"; exit 1; }
    corpus=$seeds
    # (the seeds that libFuzzer kept out of the corpus, adding nothing new then, still count)
    [ -d "build/fuzz/corpus/$name" ] && corpus="build/fuzz/corpus/$name $seeds"
    bin=build/fuzz/coverage/fuzz_$name
    extra=""
    [ "$name" = policy ] && extra=-fopenmp
    # shellcheck disable=SC2086
    clang-14 -O1 -g -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping -Wno-pass-failed $extra \
        "dev/fuzz/fuzz_$name.c" -lm -lpthread -o "$bin" || exit 1
    work=$(mktemp -d)
    # shellcheck disable=SC2086
    TMPDIR=$work LLVM_PROFILE_FILE=$bin.profraw "$bin" -runs=0 $corpus > /dev/null 2>&1
    rm -rf "$work"
    llvm-profdata-14 merge -sparse "$bin.profraw" -o "$bin.profdata" || exit 1
    # shellcheck disable=SC2086
    echo "== fuzz_$name over $(find $corpus -type f | wc -l) inputs of $corpus"
    llvm-cov-14 report "$bin" -instr-profile="$bin.profdata" -show-functions vla/*.h train_vla.c > "$bin.txt" 2>&1
    printf '%-28s %14s %14s\n' function "lines" "branches"
    for f in $functions; do
        awk -v f="$f" '$1 == f || $1 ~ (":" f "$") {printf "%-28s %6s of %-5s %6s of %-5s\n", f, $5 - $6, $5, $8 - $9, $8; exit}' "$bin.txt"
    done
done
