#!/usr/bin/env bash
# dev/gpu_check.sh without a GPU: the two calls' stage plans (DRY_RUN=1) in their order, each
# stage's expected seconds and the headline call's sum within its budget, benchmarks that write
# no checkpoint and time STEPS steps, STAGES' filter, bad settings, a call whose budget is too
# short for its stages (each skipped and said so), the figures of a stage that ran written to
# OUTDIR as soon as it ended, and pi0's stages (a refusal or an out-of-memory listed as skipped with
# its line, the call going on; train_vla's chunk against LeRobot's in the table, its checkpoint
# removed after). GPU time comes 15 minutes at a time, so a mistake in the script
# should show in make test, not in a call's minutes.
set -u
cd "$(dirname "$0")/../.." || exit 2
out=build/test_gpu_check
rm -rf "$out"
mkdir -p "$out"
export GPU_CHECK_WORK=$out/work  # (not build/gpu_check, which may hold a GPU call's logs)
passed=0
failed=0
check() {  # check DESCRIPTION CONDITION...
    local what=$1
    shift
    if "$@"; then
        echo "ok   $what"
        passed=$((passed + 1))
    else
        echo "FAIL $what"
        failed=$((failed + 1))
    fi
}
stages_of() { sed -n 's/^stage \([a-z0-9_]*\) [~0-9]*: .*/\1/p' "$1" | tr '\n' ' '; }

# ---- the headline call: its stages in the order of worth, the expected seconds, the budget
DRY_RUN=1 dev/gpu_check.sh "$out/headline" > "$out/headline.log" 2>&1
rc=$?
check "DRY_RUN=1 dev/gpu_check.sh exits 0 (exit $rc)" [ $rc -eq 0 ]
listed=$(stages_of "$out/headline.log")
want="build bench_train_vla_expert bench_train_vla_all lerobot_expert_bf16 lerobot_all_bf16 bench_infer lerobot_infer_none \
test_gpu_bf16_lerobot profile_expert profile_all "
check "the headline call: one build, train_vla expert and all, LeRobot's bf16 step, the chunk against LeRobot's, the bf16 \
tests against LeRobot, the profiles ($listed)" [ "$listed" = "$want" ]
n_stages=$(grep -c '^stage ' "$out/headline.log")
n_timed=$(grep -cE '^stage [a-z0-9_]+ ~?[0-9]+: ' "$out/headline.log")
check "every stage carries its expected seconds ($n_timed of $n_stages)" [ "$n_timed" -eq "$n_stages" -a "$n_stages" -gt 0 ]
# the sum, recomputed from the stage lines and the overhead line, and as the script prints it
sum=$(sed -n 's/^stage [a-z0-9_]* ~\{0,1\}\([0-9]*\): .*/\1/p' "$out/headline.log" | awk '{s += $1} END {print s + 0}')
overhead=$(sed -n 's/^(facts, wheels, tables) *~\([0-9]*\) s.*/\1/p' "$out/headline.log")
printed=$(sed -n 's/^sum: \([0-9]*\) s of BUDGET \([0-9]*\) s$/\1 \2/p' "$out/headline.log")
check "the plan's sum is the stages' ($sum s) and the overhead's (${overhead:-?} s): printed '$printed'" \
    [ -n "$overhead" -a "$printed" = "$((sum + ${overhead:-0})) 420" ]
check "the headline call's plan fits its 420 s, builds included ($((sum + ${overhead:-0})) s)" \
    [ $((sum + ${overhead:-0})) -le 420 ]
check "the plan counts the build of the four nvcc binaries on the GPU machine (~95 s), and builds them there unless \
dev/gpu_check.sh prepare did for these sources" \
    bash -c "grep -q '^stage build ~95: make .*build/gpu/train_vla_bf16 .*build/gpu/test_vla_gpu_bf16 .*libvla_gpu.so' \
             '$out/headline.log' || { grep -q '^stage build ~95: make ' '$out/headline.log' &&
             grep -q '^build .*the GPU binaries that dev/gpu_check.sh prepare built' '$out/headline/summary.txt'; }"
# the benchmarks: no checkpoint, STEPS timed steps (the first step untimed)
bench_lines() { grep -E '^stage (bench_train_vla|profile_|bench_recompute|train_default|balance_default)' "$1"; }
check "every train_vla run of the call writes no checkpoint (--no-checkpoint)" \
    bash -c "[ \$(grep -cE '^stage (bench_train_vla|profile_)' '$out/headline.log') -eq 4 ] &&
             ! grep -E '^stage (bench_train_vla|profile_)' '$out/headline.log' | grep -v -q -- '--no-checkpoint'"
DRY_RUN=1 STEPS=7 dev/gpu_check.sh "$out/steps" > "$out/steps.log" 2>&1
check "STEPS=7: train_vla runs 8 steps (the first untimed), LeRobot 7 after 5 untimed" \
    bash -c "grep -q '^stage bench_train_vla_expert .* -n 8 ' '$out/steps.log' &&
             grep -q '^stage lerobot_expert_bf16 .*--steps 7 --warmup 5 ' '$out/steps.log' &&
             grep -q 'the mean of 7 timed steps' '$out/steps/table.txt'"

# ---- the second call: everything else, nothing of the headline's but the build, nothing that
# needs no GPU
DRY_RUN=1 dev/gpu_check.sh more "$out/more" > "$out/more.log" 2>&1
rc=$?
check "DRY_RUN=1 dev/gpu_check.sh more exits 0 (exit $rc)" [ $rc -eq 0 ]
more=$(stages_of "$out/more.log")
both=$(comm -12 <(tr ' ' '\n' <<< "$listed" | sort) <(tr ' ' '\n' <<< "$more" | sort) | grep . | tr '\n' ' ')
check "the two calls share only the build stage ($both)" [ "$both" = "build " ]
in_order() {  # each named stage in $more, after the one before it
    local prev=-1 name i
    local -a list
    read -r -a list <<< "$more"
    for name in "$@"; do
        i=-1
        for j in "${!list[@]}"; do [ "${list[$j]}" = "$name" ] && i=$j; done
        [ "$i" -gt "$prev" ] || { echo "     $name at $i, after position $prev?"; return 1; }
        prev=$i
    done
}
check "more: the rest of the bf16 tests, LeRobot's fp32 step and bf16 chunks, the other precisions, the attention \
kernels, torch.compile, the short runs, the dev/cuda programs" \
    in_order build test_gpu_bf16_rest lerobot_expert_none lerobot_all_none lerobot_infer_bf16 build_more test_gpu_fp32 \
    test_gpu_fp16 attention_bench bench_torch_compile_expert bench_torch_compile_all train_default launchers \
    bench_recompute_attn bench_recompute_layer balance_default build_dev_cuda cuda_adamw cuda_time_mlp
check "more: pi0 first after the build (train_vla -p pi0, LeRobot's PI0Policy in bf16, train_vla's chunk and LeRobot's, \
fp32), then the rest" \
    in_order build bench_pi0_train_vla lerobot_pi0_all_bf16 bench_pi0_infer lerobot_pi0_infer_bf16 lerobot_pi0_all_none \
    test_gpu_bf16_rest
check "pi0's benchmarks: train_vla -p pi0 --train all --recompute none and LeRobot's pi0 at the same batch (PI0_B=8), \
PI0_STEPS=10 timed steps, LeRobot in bf16 and fp32, train_vla's chunk (graph and not) and LeRobot's at batch 1" \
    bash -c "grep -q '^stage bench_pi0_train_vla ~[0-9]*: build/gpu/train_vla_bf16 -p pi0 --train all --recompute none -b 8 -n 11 .*--no-checkpoint' '$out/more.log' &&
             grep -q '^stage lerobot_pi0_all_bf16 ~[0-9]*: .*dev/lerobot/bench_lerobot.py --preset pi0 --train all --amp bf16 --batch 8 --steps 10 --warmup 5 ' '$out/more.log' &&
             grep -q '^stage lerobot_pi0_all_none ~[0-9]*: .*--preset pi0 --train all --amp none --batch 8 ' '$out/more.log' &&
             grep -q '^stage lerobot_pi0_infer_bf16 ~[0-9]*: .*--preset pi0 --infer --infer-batch 1 --amp bf16 --steps 50 --warmup 5 ' '$out/more.log' &&
             grep -q '^stage bench_pi0_infer ~[0-9]*: [^ ]*python3* dev/bench_infer.py --preset pi0 --chunks 50 --warmup 5 --graphs both --out-dir [^ ]* --json ' '$out/more.log'"
check "LeRobot's pi0 runs with its pinned transformers ahead of the image's (the wheels of .whl/pinned)" \
    bash -c "[ \$(grep -c '^stage lerobot_pi0_[a-z0-9_]* ~[0-9]*: env PYTHONPATH=/tmp/lerobot_site_pinned[:a-z_/]* [^ ]*python3* dev/lerobot/bench_lerobot.py ' \
             '$out/more.log') -eq 3 ]"
# the pi0 stages but fp32 within more's BUDGET after the build of a prepared call (~25 s) and the overhead
pi0_sum=$(sed -n 's/^stage \(bench_pi0_train_vla\|lerobot_pi0_all_bf16\|bench_pi0_infer\|lerobot_pi0_infer_bf16\) ~\{0,1\}\([0-9]*\): .*/\2/p' \
    "$out/more.log" | awk '{s += $1; n++} END {print (n == 4 ? s : 0)}')
check "train_vla's pi0 step, LeRobot's, train_vla's chunk and LeRobot's ($pi0_sum s) fit in more's 300 s after a prepared \
build (~25 s), with the overhead and the reserve" [ "$pi0_sum" -gt 0 -a $((pi0_sum + 25 + 10 + 5)) -le 300 ]
DRY_RUN=1 PI0_B=4 PI0_STEPS=3 dev/gpu_check.sh more "$out/pi0_b" > "$out/pi0_b.log" 2>&1
check "PI0_B=4 PI0_STEPS=3: both trainers' pi0 step at batch 4, train_vla 4 steps, LeRobot 3 after 5" \
    bash -c "grep -q '^stage bench_pi0_train_vla .* -b 4 -n 4 ' '$out/pi0_b.log' &&
             grep -q '^stage lerobot_pi0_all_bf16 .*--batch 4 --steps 3 --warmup 5 ' '$out/pi0_b.log' &&
             grep -q 'batch 4, 2 cameras' '$out/pi0_b/table.txt'"
n_cuda=$(find dev/cuda -maxdepth 1 -name '*.cu' ! -name attention_smolvla.cu | wc -l)
n_cuda_stages=$(tr ' ' '\n' <<< "$more" | grep -c '^cuda_')
check "a stage per dev/cuda program but attention_smolvla, which attention_bench runs ($n_cuda_stages for $n_cuda)" \
    [ "$n_cuda_stages" -eq "$n_cuda" ]
check "no stage of either call needs no GPU (register counts, the scaling model from a log)" \
    bash -c "! grep -qE '^stage [a-z0-9_]*(registers|scaling)' '$out/headline.log' '$out/more.log'"
dups=$(tr ' ' '\n' <<< "$more" | grep . | sort | uniq -d | tr '\n' ' ')
check "no stage twice in more${dups:+: $dups}" [ -z "$dups" ]
check "more's train_vla runs write no checkpoint either" \
    bash -c "! grep -E '^stage (bench_pi0_train_vla|bench_recompute|train_default|balance_default)' '$out/more.log' | grep -v -q -- '--no-checkpoint'"
check "the torch.compile stages compile per layer (dev/model.py --compile)" \
    grep -q '^stage bench_torch_compile_expert ~[0-9]*: .*dev/model.py .*--compile$' "$out/more.log"

# ---- the tables and the files of OUTDIR
for mode in expert all; do
    check "the --train $mode table has train_vla, both LeRobot rows and torch.compile's (not run yet)" \
        bash -c "awk '/^--train $mode:/ {on = 1; next} on && /^\$/ {exit} on' '$out/headline/table.txt' > '$out/$mode.rows' &&
                 grep -q '^| train_vla (bf16)  *|  *not run' '$out/$mode.rows' &&
                 grep -q 'torch.compile (per layer)' '$out/$mode.rows' &&
                 grep -q 'LeRobot 0.6.1 (defaults, fp32)' '$out/$mode.rows' &&
                 grep -q 'LeRobot 0.6.1 (bf16 mixed precision)' '$out/$mode.rows'"
done
check "device.txt, summary.txt and table.txt written to OUTDIR" \
    test -f "$out/headline/device.txt" -a -f "$out/headline/summary.txt" -a -f "$out/headline/table.txt"

DRY_RUN=1 STAGES='^bench_torch_compile_' dev/gpu_check.sh more "$out/some" > "$out/some.log" 2>&1
listed=$(stages_of "$out/some.log")
check "STAGES='^bench_torch_compile_' lists those two alone ($listed)" \
    [ "$listed" = "bench_torch_compile_expert bench_torch_compile_all " ]

for bad in BUDGET=9x STEPS=0 B=-1 PI0_B=0; do
    env DRY_RUN=1 "$bad" dev/gpu_check.sh "$out/bad" > "$out/bad.log" 2>&1
    rc=$?
    check "$bad: exit 2 and one line that names it ($(head -n 1 "$out/bad.log"))" \
        bash -c "[ $rc -eq 2 ] && [ \$(wc -l < '$out/bad.log') -eq 1 ] && grep -q '^error: ${bad%%=*}=' '$out/bad.log'"
done

# ---- a real call (no DRY_RUN) with no GPU: a budget too short for any stage skips each, says so,
# and exits non-zero; nothing is built or run
BUDGET=12 PYTHON=/bin/false dev/gpu_check.sh "$out/short" > "$out/short.log" 2>&1
rc=$?
skipped=$(sed -n 's/^\([a-z0-9_]*\) *skipped: expects ~\{0,1\}[0-9]* s, [0-9-]* s of BUDGET (12 s) left$/\1/p' \
    "$out/short/summary.txt" | grep -v '^lerobot_' | tr '\n' ' ')
check "BUDGET=12: every stage skipped and listed as such (LeRobot's where its wheels are), exit $rc: $skipped" \
    [ "$rc" -ne 0 -a "$skipped" = "build bench_train_vla_expert bench_train_vla_all bench_infer test_gpu_bf16_lerobot \
profile_expert profile_all " ]

# ---- the figures of a stage that ran are in OUTDIR when it ends: the inference stage with a
# stand-in for Python that writes a report of known figures where dev/bench_infer.py would
cat > "$out/python" << 'EOF'
#!/usr/bin/env bash
# dev/bench_infer.py: write a fixed report to --json; anything else: the real python3
if [ "${1:-}" = dev/bench_infer.py ]; then
    while [ $# -gt 0 ]; do [ "$1" = --json ] && json=$2; shift; done
    run() { printf '{"ms_per_chunk_median": %s, "ms_per_chunk_p90": %s, "prefix_ms_median": %s, "steps_ms_median": %s}' "$@"; }
    printf '{"runs": {"graphs": %s, "eager": %s}}\n' "$(run 12.5 13.0 4.0 8.0)" "$(run 15.0 16.0 4.5 10.0)" > "$json"
    echo "infer_ms_per_chunk 12.5"
    exit 0
fi
exec python3 "$@"
EOF
chmod +x "$out/python"
rm -rf "$GPU_CHECK_WORK"
STAGES='^bench_infer$' PYTHON=$PWD/$out/python dev/gpu_check.sh "$out/one" > "$out/one.log" 2>&1
rc=$?
check "one stage run: exit $rc, the summary says ok, the table holds its figures (12.50 ms with the graph, 15.00 and 1.20x \
without, prefix 4.00 + steps 8.00 ms)" \
    bash -c "[ $rc -eq 0 ] && grep -q '^bench_infer  *ok (' '$out/one/summary.txt' &&
             grep -q 'CUDA graph) *| *12.50 | *13.00 | *1.00x | prefix 4.00 + steps 8.00 ms' '$out/one/table.txt' &&
             grep -q 'one by one) *| *15.00 | *16.00 | *1.20x |' '$out/one/table.txt' &&
             tar -tzf '$out/one/logs.tar.gz' | grep -q 'logs/bench_infer.log'"
# (train_vla makes its run folder but not the folders above it: the call makes those)
check "a call on a fresh work folder makes the benchmarks' runs folder" [ -d "$GPU_CHECK_WORK/runs" ]

# ---- pi0's stages run (more, STAGES): train_vla refusing -p pi0 and LeRobot's fp32 step not fitting,
# each listed as skipped with its line, the call going on; LeRobot's bf16 figures in the pi0 table. A
# copy of the script runs in a folder of its own with stand-ins for the trainer, LeRobot's wheel and
# Python, so nothing lands in build/gpu or .whl.
tree=$PWD/$out/tree
mkdir -p "$tree/dev" "$tree/build/gpu" "$tree/.whl"
cp dev/gpu_check.sh "$tree/dev/"
mkdir -p "$tree/.whl/pinned"
touch "$tree/.whl/lerobot-0.6.1-py3-none-any.whl" "$tree/.whl/pinned/transformers-5.5.4-py3-none-any.whl"
cat > "$tree/build/gpu/train_vla_bf16" << 'EOF'
#!/usr/bin/env bash
# train_vla refusing the model after its config table, as train_vla.cu's flow_build does
echo "| model GFLOP per sample | 7854.59                              |"
echo "| peak bf16 TFLOP/s      | 989.4                                |"
echo "error: head sizes 256 and 72: the GPU attention kernels take head sizes up to 128" >&2
exit 1
EOF
cat > "$out/python_pi0" << 'EOF'
#!/usr/bin/env bash
# pip: nothing to install; dev/lerobot/bench_lerobot.py: a report of known figures, or out of memory
# at fp32; dev/bench_infer.py (train_vla's pi0 chunk): a report of known figures; anything else: the
# real python3
[ "${1:-} ${2:-}" = "-m pip" ] && exit 0
if [ "${1:-}" = dev/bench_infer.py ]; then
    while [ $# -gt 0 ]; do
        case $1 in --json) json=$2 ;; --out-dir) dir=$2 ;; esac
        shift
    done
    mkdir -p "$dir" && touch "$dir/infer_pi0_0.bin" && echo "wrote $dir/infer_pi0_0.bin"
    run() { printf '{"ms_per_chunk_median": %s, "ms_per_chunk_p90": %s, "prefix_ms_median": %s, "steps_ms_median": %s}' "$@"; }
    printf '{"runs": {"graphs": %s, "eager": %s}}\n' "$(run 40.0 42.0 15.0 24.0)" "$(run 50.0 52.0 15.5 33.0)" > "$json"
    echo "infer_ms_per_chunk 40.0"
    exit 0
fi
if [ "${1:-}" = dev/lerobot/bench_lerobot.py ]; then
    infer=0
    while [ $# -gt 0 ]; do
        case $1 in --json) json=$2 ;; --amp) amp=$2 ;; --infer) infer=1 ;; esac
        shift
    done
    if [ $infer = 1 ]; then
        echo '{"infer": {"ms_per_chunk_median": 80.0, "ms_select_action_with_processors_median": 85.5, "peak_memory_bytes": 9663676416}}' > "$json"
    elif [ "$amp" = none ]; then
        echo '{"does_not_fit": "CUDA out of memory: pi0 (pi0) --train all at batch 8, dtype float32: a stand-in"}' > "$json"
        echo "bench_lerobot: does not fit: CUDA out of memory: pi0 (pi0) --train all at batch 8, dtype float32: a stand-in" >&2
        exit 3
    else
        echo '{"train": {"ms_per_step": 250.0, "samples_per_s": 32.0, "peak_memory_bytes": 59055800320}}' > "$json"
    fi
    exit 0
fi
exec python3 "$@"
EOF
chmod +x "$tree/build/gpu/train_vla_bf16" "$out/python_pi0"
STAGES='^(bench_pi0_|lerobot_pi0_)' PYTHON=$PWD/$out/python_pi0 GPU_CHECK_WORK=$tree/work "$tree/dev/gpu_check.sh" more \
    "$PWD/$out/pi0" > "$out/pi0.log" 2>&1
rc=$?
sum_pi0=$out/pi0/summary.txt
check "pi0 stages run: exit $rc (non-zero: two skipped), train_vla's refusal skipped with its line" \
    bash -c "[ $rc -ne 0 ] && grep -q '^bench_pi0_train_vla  *skipped after [0-9]* s: error: head sizes 256 and 72: the GPU attention kernels take head sizes up to 128$' '$sum_pi0'"
check "LeRobot's pi0 stages after it, its pinned wheels installed: bf16, train_vla's chunk and LeRobot's ok, fp32 skipped \
with its one line" \
    bash -c "! grep -q '^lerobot_pinned' '$sum_pi0' && grep -q '^lerobot_pi0_all_bf16  *ok (' '$sum_pi0' && grep -q '^lerobot_pi0_infer_bf16  *ok (' '$sum_pi0' &&
             grep -q '^bench_pi0_infer  *ok (' '$sum_pi0' &&
             grep -q '^lerobot_pi0_all_none  *skipped after [0-9]* s: bench_lerobot: does not fit: CUDA out of memory: ' '$sum_pi0'"
check "the pi0 table: train_vla refused (and why), LeRobot bf16 at 250.00 ms and 32.00 samples/s, MFU 25.4% on train_vla's \
count, 55.00 GiB; fp32 no fit; the chunk's 85.50 ms" \
    bash -c "awk '/^pi0 preset/ {on = 1} on' '$out/pi0/table.txt' > '$out/pi0.rows' &&
             grep -q '^| train_vla (bf16)  *|  *refused' '$out/pi0.rows' &&
             grep -q '^train_vla refused: error: head sizes 256' '$out/pi0.rows' &&
             grep -q '^| LeRobot 0.6.1 (dtype bfloat16: [^|]*|  *250.00 |  *32.00 |  *? |  *25.4% |  *55.00 |' '$out/pi0.rows' &&
             grep -q '^| LeRobot 0.6.1 (dtype float32, its default)  *|  *no fit' '$out/pi0.rows' &&
             grep -q '^| LeRobot 0.6.1 select_action (dtype bfloat16; the copies)  *|  *85.50 |' '$out/pi0.rows'"
check "the pi0 inference table: train_vla's chunk with the graph (40.00 ms, p90 42.00, prefix 15.00 + steps 24.00 ms) and \
without (50.00, 1.25x), LeRobot's select_action 2.14x and predict_action_chunk 2.00x of it; no 'not timed' left" \
    bash -c "awk '/^pi0 inference/ {on = 1} on && /^\$/ {exit} on' '$out/pi0/table.txt' > '$out/pi0_infer.rows' &&
             grep -q '^| train_vla libvla_gpu.so (bf16, Euler steps as a CUDA graph)  *|  *40.00 |  *42.00 |  *1.00x | prefix 15.00 + steps 24.00 ms' '$out/pi0_infer.rows' &&
             grep -q '^| train_vla libvla_gpu.so (bf16, Euler steps launched one by one)  *|  *50.00 |  *52.00 |  *1.25x | prefix 15.50 + steps 33.00 ms' '$out/pi0_infer.rows' &&
             grep -q '^| LeRobot 0.6.1 select_action (dtype bfloat16; the copies)  *|  *85.50 |  *- |  *2.14x |' '$out/pi0_infer.rows' &&
             grep -q '^| LeRobot 0.6.1 predict_action_chunk (dtype bfloat16)  *|  *80.00 |  *- |  *2.00x |' '$out/pi0_infer.rows' &&
             ! grep -q 'not timed' '$out/pi0/table.txt'"
ckpt_dir=$(sed -n 's|^wrote \(.*\)/infer_pi0_0.bin$|\1|p' "$tree/work/logs/bench_pi0_infer.log" 2> /dev/null)
check "the pi0 chunk's random checkpoint is removed after its stage (${ckpt_dir:-no folder written})" \
    bash -c "[ -n '$ckpt_dir' ] && [ ! -e '$ckpt_dir' ]"

# any other error of train_vla is a failure, not a refusal
cat > "$tree/build/gpu/train_vla_bf16" << 'EOF'
#!/usr/bin/env bash
echo "error: CUDA error an illegal memory access was encountered at train_vla.cu:100" >&2
exit 1
EOF
STAGES='^bench_pi0_train_vla$' PYTHON=$PWD/$out/python_pi0 GPU_CHECK_WORK=$tree/work "$tree/dev/gpu_check.sh" more \
    "$PWD/$out/pi0_failed" > "$out/pi0_failed.log" 2>&1
check "a CUDA error of train_vla -p pi0 is listed as FAILED, not as a refusal" \
    grep -q '^bench_pi0_train_vla  *FAILED, exit 1 ' "$out/pi0_failed/summary.txt"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
