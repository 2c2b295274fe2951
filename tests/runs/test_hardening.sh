#!/usr/bin/env bash
# Hardening tests that need more than a corrupt file (test_vla covers those): a full disk, a long
# output path, a thread count the machine cannot start, a log left by a kill, copies of a checkpoint
# under names the trainer does not write, random SIGKILLs of a run that checkpoints every step, the
# sanitized CPU trainer, and which make targets speak of GPUs.
# The trainer is SmolVLA's tiny preset on build/test/a.bin (--train all, its default): a checkpoint
# holds every weight and the moments of the trainable ones (its size measured first, from a run's).
# Run by `make test` after the
# binaries are built. Ends with `N passed, M failed`.
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=tests/util/trainer_checks.sh
. tests/util/trainer_checks.sh
SANITIZED=build/sanitize/train_vla_cpu
KILLS=${KILLS:-10}
tmp=$(mktemp -d)
mounted=""
cleanup() {
    if [ -n "$mounted" ]; then umount "$mounted" 2> /dev/null; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# the size of one checkpoint of these runs, in bytes and as the trainers' errors say it
$TRAINER "${run[@]}" -n 1 -o "$tmp/size" > /dev/null 2>&1
ckpt=$(stat -c %s "$tmp/size/ckpt_00000001.bin" 2> /dev/null || echo 0)
mib=$(awk -v b="$ckpt" 'BEGIN { printf "%.2f MiB", b / 1048576 }')
check "$([ "$ckpt" -gt 0 ] && echo 0 || echo 1)" "a checkpoint of the tiny preset: $ckpt bytes ($mib)"

echo "== a full disk: the checkpoint's temporary file is removed, the space it needed is said"
out=$tmp/fsize
# RLIMIT_FSIZE caps every file at half a checkpoint: the checkpoint cannot be written. The trainers
# ignore SIGXFSZ themselves, so the write fails with EFBIG instead of the signal killing the process
# (rc 153, no word); the GPU trainer ($GPU_TESTS/train_vla_fp32, the CPU emulation by default) too
GPU_TRAINER=${GPU_TESTS:-build/emu}/train_vla_fp32
for trainer in $TRAINER $GPU_TRAINER; do
    if [ ! -x "$trainer" ]; then echo "  ($trainer is not built: make $trainer)"; continue; fi
    rm -rf "$out"
    (ulimit -f $((ckpt / 2048)); $trainer -i "$DATA" -p tiny -b 2 --workers 1 -n 1 -o "$out" > /dev/null 2> "$tmp/err")
    rc=$?
    one_line_error "$tmp/err" "ckpt_00000001.bin failed: File too large: the file needs $mib" &&
        grep -qF "the partial file was removed: the file is larger than the file size limit allows" "$tmp/err" &&
        [ "$rc" -eq 1 ] && [ -z "$(ls "$out"/*.tmp 2> /dev/null)" ]
    check $? "$trainer under a file size limit: exit $rc, no .tmp left: $(head -c 300 "$tmp/err")"
done
mkdir -p "$tmp/disk"
# a disk of two and a half checkpoints
if mount -t tmpfs -o size=$((ckpt * 5 / 2048))k tmpfs "$tmp/disk" 2> /dev/null; then
    mounted=$tmp/disk
    # two kept checkpoints fit; the third does not while they are there
    $TRAINER "${run[@]}" -n 4 -k 1 --keep 2 -o "$tmp/disk/run" > /dev/null 2> "$tmp/err"
    rc=$?
    used=$(df --output=used -k "$tmp/disk" | tail -n 1 | tr -d ' ')
    two=$((ckpt * 2 / 1024))
    one_line_error "$tmp/err" "ckpt_00000003.bin failed: No space left on device: the file needs $mib" &&
        grep -qF "free space in $tmp/disk/run (" "$tmp/err" &&
        [ "$rc" -eq 1 ] && [ -z "$(ls "$tmp/disk/run"/*.tmp 2> /dev/null)" ] && [ "$used" -lt $((two + 150)) ]
    check $? "a disk of 2.5 checkpoints that fills at the third: exit $rc, no .tmp, ${used} KiB used (two checkpoints: $two): $(head -c 300 "$tmp/err")"
    $TRAINER "${run[@]}" -n 3 -y 1 -o "$tmp/disk/run" > "$tmp/out" 2>&1
    rc=$?
    grep -qF "resumed from $tmp/disk/run/ckpt_00000002.bin" "$tmp/out" && [ "$rc" -eq 1 ]
    check $? "the checkpoint before it is intact: -y 1 resumes from step 2 (and fails again on the full disk, exit $rc)"
    umount "$tmp/disk" && mounted=""
else
    echo "  (tmpfs cannot be mounted here: the full-disk case runs under the file size limit above only)"
fi

echo "== output paths: a long one works whole, one past the limit is refused"
long=$tmp
for i in 1 2 3 4 5 6; do long=$long/$(printf 'd%.0s' $(seq 250))$i; done  # 6 folders of 251 bytes: > 1500 bytes
mkdir -p "$long"
$TRAINER "${run[@]}" -n 2 -k 1 -o "$long" > /dev/null 2>&1 && $TRAINER "${run[@]}" -n 3 -k 1 -y 1 -o "$long" > "$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ -f "$long/ckpt_00000003.bin" ] && grep -qF "resumed from $long/ckpt_00000002.bin" "$tmp/out" &&
    steps_once "$long/log.jsonl" 3
check $? "-o of ${#long} bytes: checkpoints and log.jsonl under their whole names, and -y 1 resumes there (exit $rc)"
too_long=$(printf 'x%.0s' $(seq 4090))
$TRAINER "${run[@]}" -n 1 -o "$too_long" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "-o of 4090 bytes: the output folder's path must be 1 to 4047 bytes long" && [ "$rc" -eq 1 ]
check $? "-o of 4090 bytes is refused: $(head -c 200 "$tmp/err")"
# the bound itself: 4047 bytes train (16 folders of 252 and one more name), 4048 are refused
edge=$tmp
while [ $(( ${#edge} + 253 )) -le 4047 ]; do edge=$edge/$(printf 'e%.0s' $(seq 252)); done
edge=$edge/$(printf 'f%.0s' $(seq $(( 4047 - ${#edge} - 1 ))))
mkdir -p "$edge"
$TRAINER "${run[@]}" -n 1 -o "$edge" > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && [ -f "$edge/ckpt_00000001.bin" ] && [ ! -s "$tmp/err" ]
check $? "-o of ${#edge} bytes, the bound docs/hardening.md gives, trains (exit $rc)"
$TRAINER "${run[@]}" -n 1 -o "${edge}g" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "-o of 4048 bytes: the output folder's path must be 1 to 4047 bytes long" && [ "$rc" -eq 1 ]
check $? "-o of 4048 bytes is refused (exit $rc)"
# a 5,000-byte --init: the message shortens the path and keeps the reason (it was cut inside the path)
far=/$(printf 'p%.0s' $(seq 4999))
$TRAINER "${run[@]}" -n 1 --init "$far" -o "$tmp/far" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "ppp (a path of 5000 bytes): File name too long" && [ "$rc" -eq 1 ] && [ "$(wc -c < "$tmp/err")" -lt 1200 ]
check $? "--init of 5,000 bytes: one line of $(wc -c < "$tmp/err") bytes that ends with its reason (exit $rc)"

echo "== -t past what the machine can start"
# a 4 GiB address space holds a few hundred thread stacks, not 1000
(ulimit -v 4000000; $TRAINER "${run[@]}" -n 1 -t 1000 -o "$tmp/threads" > /dev/null 2> "$tmp/err")
rc=$?
one_line_error "$tmp/err" "-t 1000: this machine could start only" && [ "$rc" -eq 1 ]
check $? "-t 1000 under a 4 GiB address space: exit $rc: $(head -c 200 "$tmp/err")"

echo "== --no-checkpoint (benchmarks): none at the end, none on Ctrl-C, and -k beside it refused"
out=$tmp/nockpt
$TRAINER "${run[@]}" -n 3 --no-checkpoint -o "$out" > "$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ -z "$(ls "$out"/ckpt_* "$out"/*.tmp 2> /dev/null)" ] && steps_once "$out/log.jsonl" 3
check $? "3 steps: exit $rc, no checkpoint and no .tmp in the folder, steps 1-3 in log.jsonl"
$TRAINER "${run[@]}" -n 1000000 --no-checkpoint -o "$tmp/nockpt_int" > "$tmp/out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^step' "$tmp/out" 2> /dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
rc=$?
grep -q '^interrupted at step [0-9]*: no checkpoint written (--no-checkpoint)$' "$tmp/out" && [ "$rc" -eq 130 ] &&
    [ -z "$(ls "$tmp/nockpt_int"/ckpt_* "$tmp/nockpt_int"/*.tmp 2> /dev/null)" ]
check $? "SIGINT: exit $rc, says nothing was written, and nothing was: $(grep '^interrupted' "$tmp/out")"
$TRAINER "${run[@]}" -n 1 --no-checkpoint -k 5 -o "$tmp/nockpt_k" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "--no-checkpoint writes no checkpoint and -k 5 asks for them" && [ "$rc" -eq 1 ]
check $? "with -k 5: exit $rc, one line: $(head -c 200 "$tmp/err")"

echo "== log.jsonl after a kill between a step's line and its checkpoint"
out=$tmp/log
$TRAINER "${run[@]}" -n 3 -k 3 -o "$out" > /dev/null 2>&1
# what a run killed after logging steps 4 and 5 (and half of 6) but before checkpointing them leaves
printf '{"step": 4, "loss": 1}\n{"step": 5, "loss": 1}\n{"step": 6, "lo' >> "$out/log.jsonl"
$TRAINER "${run[@]}" -n 5 -k 5 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && steps_once "$out/log.jsonl" 5 && grep -q "dropped 2 line(s) past step 3" "$tmp/out" &&
    grep -q "dropped a partial last line" "$tmp/out"
check $? "resumed at step 3: steps 1-5 once each in log.jsonl, the 2 stale lines and the partial one dropped (exit $rc)"

echo "== a shard truncated or rewritten under a running trainer: one line naming it, the checkpoints intact"
# 120 episodes, 3 MB: the trainer reads all over it. The shard changes once the run has written a
# checkpoint; truncated, a read past its new end faults (the SIGBUS handler names it) or the check
# after each batch sees the size; rewritten in place by a larger shard of the same shapes, the check
# sees the change (the index tables are private copies, so no read leaves the mapping).
./data/synthetic -o "$tmp/big.bin" --cams 1 --img 32 --state 4 --action 4 --episodes 120 --min-len 6 --max-len 12 \
    --seed 3 > /dev/null
./data/synthetic -o "$tmp/bigger.bin" --cams 1 --img 32 --state 4 --action 4 --episodes 240 --min-len 6 --max-len 12 \
    --seed 4 > /dev/null
for change in truncate rewrite; do
    shard=$tmp/changing_$change.bin
    out=$tmp/changed_$change
    cp "$tmp/big.bin" "$shard"
    timeout 120 $TRAINER -i "$shard" -p tiny -b 2 -t 1 --workers 1 -n 1000000 -k 10 -o "$out" > /dev/null 2> "$tmp/err" &
    pid=$!
    for _ in $(seq 300); do [ -f "$out/ckpt_00000010.bin" ] && break; sleep 0.1; done
    if [ "$change" = truncate ]; then
        truncate -s 100000 "$shard"
    else
        dd if="$tmp/bigger.bin" of="$shard" conv=notrunc status=none
    fi
    wait "$pid"
    rc=$?
    newest=$(find "$out" -name 'ckpt_*.bin' | sort | tail -n 1)
    one_line_error "$tmp/err" "dataset shard $shard" && grep -qE "was truncated|changed while this run read it" "$tmp/err" &&
        [ "$rc" -eq 1 ] && [ -n "$newest" ]
    check $? "$change: exit $rc, one line: $(head -c 300 "$tmp/err")"
    cp "$tmp/big.bin" "$shard"
    $TRAINER -i "$shard" -p tiny -b 2 -t 1 --workers 1 -n "$(( 10#$(basename "$newest" .bin | tr -dc 0-9) + 1 ))" -y 1 \
        -o "$out" > "$tmp/out" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] && grep -qF "resumed from $newest" "$tmp/out"
    check $? "$change: with the shard restored, -y 1 resumes from the newest checkpoint, $(basename "$newest") (exit $rc)"
done

echo "== copies under names checkpoint_path does not write are not checkpoints"
out=$tmp/names
$TRAINER "${run[@]}" -n 2 -k 2 -o "$out" > /dev/null 2>&1
# a newer step under a non-canonical name: -y 1 must not take step 9 and then fail opening ckpt_00000009.bin
cp "$out/ckpt_00000002.bin" "$out/ckpt_9.bin"
cp "$out/ckpt_00000002.bin" "$out/ckpt_-1.bin"
cp "$out/ckpt_00000002.bin" "$out/ckpt_000000009.bin"
$TRAINER "${run[@]}" -n 3 -k 3 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -qF "resumed from $out/ckpt_00000002.bin" "$tmp/out" && [ -f "$out/ckpt_00000003.bin" ] &&
    [ -f "$out/ckpt_9.bin" ] && steps_once "$out/log.jsonl" 3
check $? "ckpt_9.bin, ckpt_-1.bin and ckpt_000000009.bin beside ckpt_00000002.bin: -y 1 resumes from step 2, the copies left alone (exit $rc)"
# a copy under a later step's canonical name: its header says step 3, so -y 1 warns and takes step 3's own file
cp "$out/ckpt_00000003.bin" "$out/ckpt_00000007.bin"
$TRAINER "${run[@]}" -n 4 -k 4 -y 1 -o "$out" > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && grep -qF "resumed from $out/ckpt_00000003.bin" "$tmp/out" && [ "$(wc -l < "$tmp/err")" -eq 1 ] &&
    grep -qF "warning: skipping $out/ckpt_00000007.bin: its header says step 3, but its name says step 7 (a renamed copy?); falling back to the one before it" "$tmp/err" &&
    [ -f "$out/ckpt_00000007.bin" ] && steps_once "$out/log.jsonl" 4
check $? "ckpt_00000003.bin copied to ckpt_00000007.bin: -y 1 warns in one line and resumes from step 3, the copy left alone (exit $rc): $(head -c 300 "$tmp/err")"

echo "== random SIGKILLs of a run that checkpoints every step"
steps=400
last=$(printf 'ckpt_%08d.bin' $steps)
kill_run=("${run[@]}" -n "$steps" -k 1 --keep 2 -s 5)
$TRAINER "${kill_run[@]}" -o "$tmp/straight" > /dev/null 2>&1
check $? "the uninterrupted run ($steps steps of a few ms, a checkpoint after each)"
out=$tmp/killed
kills=0
attempts=0
delays=""
# each attempt resumes with -y 1 and gets SIGKILL after a random 0-60 ms: in its startup, in a
# step or in a checkpoint's write; until KILLS of them died by the signal. Then one runs to the end.
while [ "$kills" -lt "$KILLS" ] && [ "$attempts" -lt $((KILLS * 5)) ]; do
    attempts=$((attempts + 1))
    $TRAINER "${kill_run[@]}" -y 1 -o "$out" > /dev/null 2>&1 &
    pid=$!
    delay=$((RANDOM % 60))
    sleep "$(printf '0.%03d' "$delay")"
    kill -9 "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    if [ $? -eq 137 ]; then kills=$((kills + 1)); delays="$delays $delay"; fi
done
$TRAINER "${kill_run[@]}" -y 1 -o "$out" > /dev/null 2>&1
rc=$?
check $(( kills >= KILLS ? 0 : 1 )) "$kills of $attempts attempts died by SIGKILL (after ms:$delays)"
cmp -s "$tmp/straight/$last" "$out/$last"
check $? "resumed with -y 1 after every kill, the final checkpoint equals the uninterrupted run's byte for byte (exit $rc)"
losses() { grep -o '"loss": [^,]*' "$1"; }
steps_once "$out/log.jsonl" "$steps" && [ "$(losses "$out/log.jsonl")" = "$(losses "$tmp/straight/log.jsonl")" ]
check $? "its log.jsonl holds steps 1-$steps once each, with the uninterrupted run's losses"
[ -z "$(ls "$out"/*.tmp 2> /dev/null)" ] && [ "$(find "$out" -name "ckpt_*.bin" | wc -l)" -eq 2 ]
check $? "no temporary file is left, and --keep 2 holds"

echo "== the CPU trainer under AddressSanitizer and UndefinedBehaviorSanitizer"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
out=$tmp/sanitized
$SANITIZED -i $DATA -p tiny -b 2 -g 2 -z 1 --augment-shift 2 -n 3 -k 2 -t 2 --workers 2 -o "$out" > /dev/null 2> "$tmp/err" &&
    $SANITIZED -i $DATA -p tiny -b 2 -g 2 -z 1 --augment-shift 2 -n 4 -k 2 -t 2 --workers 2 -y 1 -o "$out" > /dev/null 2>> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] && [ -f "$out/ckpt_00000004.bin" ]
check $? "3 steps, then 1 more resumed: 2 simulated ranks, ZeRO-1, image shifts, 2 loader threads: exit $rc, nothing reported$(head -c 300 "$tmp/err")"
$SANITIZED -i build/test/s.bin -p tiny -b 2 -g 2 -d 8 --train vlm --augment-shift 3 -n 2 -t 2 --workers 1 -o "$tmp/sizes" \
    > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] && [ -f "$tmp/sizes/ckpt_00000002.bin" ]
check $? "2 steps on cameras of 24x32 and 20x20 (resized with padding), --train vlm, 2 ranks x 2 micro-steps, shifts of 3: exit $rc, nothing reported$(head -c 300 "$tmp/err")"
cp $DATA "$tmp/nan.bin"
build/venv/bin/python - "$tmp/nan.bin" << 'EOF'
import struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
off_state = struct.unpack_from("<Q", raw, 64)[0]  # ShardHeader.off_state
struct.pack_into("<f", raw, off_state + 8, float("nan"))
open(sys.argv[1], "wb").write(raw)
EOF
# a token offset table whose ends are right and whose middle entry points 1e9 ids past the copy
cp $DATA "$tmp/offsets.bin"
build/venv/bin/python - "$tmp/offsets.bin" << 'EOF'
import struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
off_token_offsets = struct.unpack_from("<Q", raw, 136)[0]  # ShardHeader.off_token_offsets
struct.pack_into("<Q", raw, off_token_offsets + 8, 10**9)
open(sys.argv[1], "wb").write(raw)
EOF
truncated=$tmp/truncated.bin
head -c 5000 "$tmp/straight/$last" > "$truncated"
bad_cases=(
    "shards of two shapes|-i $DATA,build/test/b.bin -p tiny -n 1|shards of one dataset must agree"
    "NaN in a shard|-i $tmp/nan.bin -p tiny -n 1|frame 0, state column 2 is NaN"
    "a token offset past the tokens|-i $tmp/offsets.bin -p tiny -n 1|token offset 1 (1000000000) breaks the table"
    "a truncated checkpoint|-i $DATA -p tiny -n 1 --init $truncated|it is truncated or corrupt"
    "a folder as --init|-i $DATA -p tiny -n 1 --init $tmp|is a folder, not a checkpoint file"
    "another train mode|-i $DATA -p tiny -n 500 --train expert --init $tmp/straight/$last|trained with --train all, this run with --train expert"
)
for c in "${bad_cases[@]}"; do
    IFS='|' read -r what flags needle <<< "$c"
    # shellcheck disable=SC2086
    $SANITIZED $flags -o "$tmp/bad" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "$needle" && [ "$rc" -eq 1 ]
    check $? "$what: exit $rc, one line and no sanitizer report: $(head -c 300 "$tmp/err")"
done

echo "== only GPU builds speak of GPUs"
# (as from a shell: make test's own make exports GPU_ARCH, which would silence the line)
fresh_make() { env -u GPU_ARCH -u MAKEFLAGS -u MFLAGS -u MAKELEVEL CI=true make "$@"; }
fresh_make -n setup train_vla_cpu test_vla 2>&1 | grep -iE 'GPU found|building for|nccl.h' > "$tmp/out"
check $(( $(wc -l < "$tmp/out") == 0 ? 0 : 1 )) "make setup, train_vla_cpu and test_vla say nothing of a GPU: $(head -c 200 "$tmp/out")"
fresh_make -n -B train_vla 2>&1 | grep -c 'building for sm_90' > "$tmp/out"
check $(( $(cat "$tmp/out") == 1 ? 0 : 1 )) "make train_vla names the architecture it builds for, once ($(cat "$tmp/out") line)"

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
