#!/usr/bin/env bash
# Tests of the launch scripts: that they parse, that the template turns its knobs into the
# trainer's flags, that the Slurm job hands every node one run token (under stand-ins for
# scontrol and srun), a run of the template on 2 GPUs, and the resume-until-done loop through an
# injected NCCL failure. GPU_TESTS names the folder of the GPU trainer's binaries: build/emu
# (the CPU emulation of CUDA, 2 emulated GPUs with NCCL fault injection) or build/gpu (a real GPU:
# the run uses 1 GPU and the fault test is skipped). Ends with `N passed, M failed`.
set -u
cd "$(dirname "$0")/../.." || exit 1
GPU_TESTS=${GPU_TESTS:-build/emu}
TEST_DATA=${TEST_DATA:-build/test/a.bin}
passed=0
failed=0
check() {  # check CONDITION-EXIT-STATUS MESSAGE
    if [ "$1" -eq 0 ]; then echo "  ok   $2"; passed=$((passed + 1)); else echo "  FAIL $2"; failed=$((failed + 1)); fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
scripts=(scripts/train_1gpu.sh scripts/train_multi_gpu.sh scripts/train_two_nodes.sh scripts/train_slurm.sbatch
         scripts/train_until_done.sh scripts/mt10_recipe.sh tests/runs/test_launchers.sh tests/runs/test_learning.sh
         tests/runs/test_hardening.sh dev/fuzz/run_fuzz.sh dev/fuzz/coverage.sh)

echo "== the scripts parse"
for s in "${scripts[@]}"; do
    bash -n "$s"
    check $? "bash -n $s"
done
if command -v shellcheck > /dev/null; then
    shellcheck -x "${scripts[@]}"  # (-x: the sourced tests/util/trainer_checks.sh is read too)
    check $? "shellcheck finds nothing in ${#scripts[@]} scripts"
else
    echo "(shellcheck not installed: its check skipped)"
fi

echo "== the template's knobs become flags"
line=$(GPUS=4 BATCH=8 TOTAL_BATCH=64 LR=1e-3 LR_SCALE=sqrt ZERO=1 PRESET=smolvla TRAIN=vlm OUT=o WORKERS=3 NCCL_TIMEOUT=50 \
       DRY_RUN=1 scripts/train_multi_gpu.sh -n 5)
[[ " $line " == *" -p smolvla "*" -o o -g 4 -b 8 -d 64 -l 1e-3 --lr-scale sqrt -z 1 "*" --workers 3 --nccl-timeout 50 --train vlm -n 5 " ]]
check $? "GPUS=4 BATCH=8 TOTAL_BATCH=64 LR_SCALE=sqrt ZERO=1 PRESET=smolvla TRAIN=vlm ... -n 5: '$line'"
line=$(PRESET=tiny DRY_RUN=1 scripts/train_multi_gpu.sh)
[[ " $line " == *" -p tiny "* && "$line" != *"--train"* ]]
check $? "no TRAIN: the preset's own train mode (no --train): '$line'"
line=$(GPUS='' CUDA_VISIBLE_DEVICES=2,5,7 DRY_RUN=1 scripts/train_multi_gpu.sh)
[[ " $line " == *" -g 3 "* && "$line" != *"--nodes"* ]]
check $? "CUDA_VISIBLE_DEVICES=2,5,7 gives -g 3 on one node: '$line'"
line=$(VLA_RUN_TOKEN=two-node-secret GPUS=2 MASTER=n0:29500 NODE_RANK=1 DRY_RUN=1 scripts/train_two_nodes.sh -p tiny)
[[ " $line " == *" -g 2 "*" --nodes 2 --node-rank 1 --master n0:29500 -p tiny " && "$line" != *two-node-secret* ]]
check $? "the two-node example on node 1 (the token in the environment, not on the command line): '$line'"
err=$(VLA_RUN_TOKEN=t NODE_RANK=1 DRY_RUN=1 scripts/train_two_nodes.sh 2>&1 > /dev/null)
rc=$?
[ "$rc" -ne 0 ] && [[ "$err" == *"MASTER"* ]]
check $? "the two-node example without MASTER stops: '$err'"
err=$(env -u VLA_RUN_TOKEN MASTER=n0:29500 NODE_RANK=1 DRY_RUN=1 scripts/train_two_nodes.sh 2>&1 > /dev/null)
rc=$?
[ "$rc" -ne 0 ] && [[ "$err" == *"set VLA_RUN_TOKEN to the same secret on both machines"* ]]
check $? "the two-node example without VLA_RUN_TOKEN stops: '$err'"
err=$(PRECISION=FP16 scripts/train_multi_gpu.sh 2>&1 > /dev/null)
rc=$?
[ "$rc" -ne 0 ] && [[ "$err" == *"PRECISION=FP16"* ]]
check $? "an unknown PRECISION stops: '$err'"
err=$(TRAINER=tpu OUT=$tmp/recipe scripts/mt10_recipe.sh 2>&1 > /dev/null)
rc=$?
[ "$rc" -eq 1 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && [[ "$err" == "error: TRAINER=tpu: use gpu or cpu" ]]
check $? "the MT10 recipe stops on an unknown TRAINER with one line: '$err'"

echo "== the Slurm job gives every node the same run token"
# scontrol, make and srun stand-ins: srun records the token its tasks would get (scontrol writes
# its node list a line at a time, as a long one comes: the job must not end on a SIGPIPE)
mkdir -p "$tmp/slurm_bin"
printf '#!/usr/bin/env bash\necho node-a\necho node-b\n' > "$tmp/slurm_bin/scontrol"
printf '#!/usr/bin/env bash\nexit 0\n' > "$tmp/slurm_bin/make"
cat > "$tmp/slurm_bin/srun" << 'SRUN'
#!/usr/bin/env bash
printf "%s" "${VLA_RUN_TOKEN:-}" > "$SRUN_TOKEN_FILE"
SRUN
chmod +x "$tmp/slurm_bin/scontrol" "$tmp/slurm_bin/make" "$tmp/slurm_bin/srun"
slurm_job() {  # slurm_job TOKEN_FILE [VAR=VALUE ...]: the batch script under the stand-ins
    env -u VLA_RUN_TOKEN PATH="$tmp/slurm_bin:$PATH" SLURM_SUBMIT_DIR="$PWD" SLURM_JOB_NODELIST='node-[a-b]' \
        SLURM_JOB_ID=7 SLURM_NNODES=2 GPUS=8 OUT="$tmp/slurm_out" SRUN_TOKEN_FILE="$1" "${@:2}" \
        bash scripts/train_slurm.sbatch
}
out1=$(slurm_job "$tmp/token1" 2>&1)
rc1=$?
out2=$(slurm_job "$tmp/token2" 2>&1)
token1=$(cat "$tmp/token1" 2> /dev/null)
token2=$(cat "$tmp/token2" 2> /dev/null)
[ "$rc1" -eq 0 ] && [[ "$token1" =~ ^[0-9a-f]{32}$ ]] && [ "$token1" != "$token2" ] && [[ "$out1$out2" != *"$token1"* ]] &&
    [[ "$out1" == *"run token made for this job"* ]]
check $? "without VLA_RUN_TOKEN the job makes a random 128-bit token for srun's tasks, another per job, never printed: '$out1'"
out=$(slurm_job "$tmp/token3" VLA_RUN_TOKEN=given-secret 2>&1)
[ "$(cat "$tmp/token3" 2> /dev/null)" = given-secret ] && [[ "$out" != *given-secret* ]]
check $? "a VLA_RUN_TOKEN given to sbatch goes to every task as it is: '$out'"

echo "== the template trains"
if [ "$GPU_TESTS" = build/emu ]; then gpus=2; export CUDA_EMU_DEVICES=2; else gpus=1; fi
trainer="$GPU_TESTS/train_vla_fp32"
TRAINER=$trainer GPUS=$gpus BATCH=2 PRESET=tiny TRAIN=all STEPS=2 DATA=$TEST_DATA OUT=$tmp/t RESUME=0 \
    scripts/train_multi_gpu.sh --log-every 100 > "$tmp/t.txt" 2>&1
rc=$?
lines=$(wc -l < "$tmp/t/log.jsonl" 2> /dev/null || echo 0)
effective=$(grep -o 'effective batch *| *[0-9]*' "$tmp/t.txt" | grep -o '[0-9]*$')
mode=$(grep -o 'train mode (--train) *| *[a-z]*' "$tmp/t.txt" | grep -o '[a-z]*$')
[ "$rc" -eq 0 ] && [ "$lines" -eq 2 ] && [ -f "$tmp/t/ckpt_00000002.bin" ] && [ "$effective" = $((2 * gpus)) ] &&
    [ "$mode" = all ]
check $? "2 steps on $gpus GPU(s) of $trainer: exit $rc, $lines log lines, the step-2 checkpoint, effective batch $effective, train mode $mode"

echo "== resume until done"
if [ "$GPU_TESTS" = build/emu ]; then
    # the first attempt fails at step 3 (an injected NCCL error); later attempts run clean. A step
    # makes one all-reduce per range of its gradient buckets (the banner counts them) and one of
    # the loss's sums: the call in the middle of step 3
    ranges=$(grep -o 'gradient all-reduce *| *[0-9]* buckets, [0-9]* ranges' "$tmp/t.txt" | grep -o '[0-9]* ranges' |
             grep -o '[0-9]*')
    per_step=$((${ranges:-0} + 1))
    call=$((2 * per_step + per_step / 2))
    cat > "$tmp/flaky.sh" << FLAKY
#!/usr/bin/env bash
if [ ! -e "$tmp/failed_once" ]; then touch "$tmp/failed_once"; export CUDA_EMU_NCCL_FAULT=1:$call:error; fi
exec "$trainer" "\$@"
FLAKY
    chmod +x "$tmp/flaky.sh"
    RETRY_DELAY=0 scripts/train_until_done.sh "$tmp/flaky.sh" -p tiny -g 2 -b 2 -n 6 -k 1 \
        -i "$TEST_DATA" -o "$tmp/u" > "$tmp/u.txt" 2>&1
    rc=$?
    attempts=$(grep -c '^train_until_done: attempt [0-9]* from' "$tmp/u.txt")
    grep -q 'attempt 2 from step 2' "$tmp/u.txt" && grep -q 'resumed from .*ckpt_00000002.bin at step 2' "$tmp/u.txt"
    resumed=$?
    [ "$rc" -eq 0 ] && [ "$attempts" -eq 2 ] && [ "$resumed" -eq 0 ] && [ -f "$tmp/u/ckpt_00000006.bin" ]
    check $? "an NCCL error at step 3, then -y 1 from step 2 to step 6: exit $rc, $attempts attempts"
else
    echo "(skipped: the failure is injected through the CPU emulation of NCCL)"
fi
RETRY_DELAY=0 MAX_FAILURES=2 scripts/train_until_done.sh ./train_vla_cpu -b 0 -o "$tmp/bad" > "$tmp/bad.txt" 2>&1
rc=$?
attempts=$(grep -c '^train_until_done: attempt [0-9]* from' "$tmp/bad.txt")
[ "$rc" -ne 0 ] && [ "$attempts" -eq 2 ] && grep -q 'giving up' "$tmp/bad.txt"
check $? "a failure that repeats (-b 0) gives up after MAX_FAILURES=2 attempts with its exit status $rc"

# SIGTERM to the loop (Slurm's time limit): the trainer saves its step and the loop stops there
RETRY_DELAY=0 scripts/train_until_done.sh ./train_vla_cpu -p tiny -b 2 -n 100000 -k 0 --log-every 1000 -t 1 \
    -i "$TEST_DATA" -o "$tmp/sig" > "$tmp/sig.txt" 2>&1 &
loop=$!
for _ in $(seq 600); do  # until the trainer has done a step (at most a minute)
    if [ -s "$tmp/sig/log.jsonl" ]; then break; fi
    sleep 0.1
done
kill -TERM "$loop"
wait "$loop"
rc=$?
attempts=$(grep -c '^train_until_done: attempt [0-9]* from' "$tmp/sig.txt")
saved=$(find "$tmp/sig" -name 'ckpt_*.bin' | wc -l)
[ "$rc" -eq 130 ] && [ "$attempts" -eq 1 ] && [ "$saved" -eq 1 ] && grep -q 'stopped by a signal' "$tmp/sig.txt"
check $? "SIGTERM to the loop: the trainer saves its step ($saved checkpoint), exit $rc, no new attempt ($attempts in all)"

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
