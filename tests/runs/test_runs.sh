#!/usr/bin/env bash
# What a run folder (-o) promises, checked with real processes of train_vla_cpu (the tiny preset on
# build/test/a.bin): one trainer per folder (a second one, and -y 1 beside a running one, refused
# naming the holder; a killed holder's lock taken over), the folder checked before every write
# (moved, removed or replaced under a run: it stops, nothing written elsewhere), nothing of an
# earlier run dropped (a new run into it refused, --new-run moving it into previous_<N>/, -y 1's
# rules), temporary files of a killed save removed, foreign log lines dropped with a note, SIGHUP
# saving like SIGTERM, a signal after the last step ending the run with exit 0, -i inside -o
# refused, write failures said by their cause, one line per checkpoint written, a warning for a
# warmup longer than the run, run.json and -y 1 continuing with it (an interrupted run continued with
# -y 1 -o alone ends with the straight run's log, bit for bit), out/<preset> by default. Each case checks
# the one line and that the files are still there. The GPU trainer ($GPU_TESTS/train_vla_fp32:
# build/emu, the CPU emulation of CUDA, by default) shares the code: its lock, SIGHUP and the
# new-run refusal are checked too.
# Run by `make test`; ends with `N passed, M failed`.
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=tests/util/trainer_checks.sh
. tests/util/trainer_checks.sh
GPU_TESTS=${GPU_TESTS:-build/emu}
GPU_TRAINER=$GPU_TESTS/train_vla_fp32
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done
    chmod -R u+w "$tmp" 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

# fingerprint DIR: names, sizes and contents of the run's files (to check that nothing changed)
fingerprint() { (cd "$1" && find . -name 'ckpt_*' -o -name 'log.jsonl*' | sort | xargs -r md5sum); }
# background OUTFILE ARGS...: a trainer in the background; waits for its first step line
background() {
    local out=$1
    shift
    $TRAINER "$@" > "$out" 2>&1 &
    bg=$!
    pids+=("$bg")
    for _ in $(seq 1200); do grep -q '^step' "$out" 2> /dev/null && return 0; sleep 0.05; done
    return 1
}
# finish PID: its exit status once it ends; one that has not ended in 60 s is killed (status 124)
finish() {
    for _ in $(seq 600); do
        kill -0 "$1" 2> /dev/null || break
        sleep 0.1
    done
    if kill -0 "$1" 2> /dev/null; then kill -9 "$1"; wait "$1" 2> /dev/null; return 124; fi
    wait "$1"
}
long=(-n 1000000 -k 0)

echo "== one owner per run folder"
out=$tmp/owned
background "$tmp/first" "${run[@]}" "${long[@]}" -o "$out"
first=$bg
$TRAINER "${run[@]}" -n 3 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "the output folder $out is in use by another trainer (pid $first on $(hostname)" && [ "$rc" -eq 1 ]
check $? "a second trainer on the same -o: exit $rc: $(head -c 300 "$tmp/err")"
$TRAINER "${run[@]}" -n 3 -y 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "is in use by another trainer (pid $first" && [ "$rc" -eq 1 ] && kill -0 "$first"
check $? "-y 1 while the run goes on: refused the same way (exit $rc), the run goes on"
kill -HUP "$first"
finish "$first"
rc=$?
n=$(grep -c '"step"' "$out/log.jsonl")
saved=$(printf 'ckpt_%08d.bin' "$n")
grep -qF "interrupted: saved step $n to $out; continue with -y 1 -o $out" "$tmp/first" && [ "$rc" -eq 130 ] &&
    [ -f "$out/$saved" ] && steps_once "$out/log.jsonl" "$n" && [ ! -s "$out/.lock" ]
check $? "SIGHUP saves like SIGTERM: exit $rc, step $n saved, the hint names the folder, the lock file emptied: $(grep '^interrupted' "$tmp/first")"
background "$tmp/killed" "${run[@]}" "${long[@]}" -y 1 -o "$out"
killed=$bg
kill -9 "$killed"
wait "$killed" 2> /dev/null
$TRAINER "${run[@]}" -n $((n + 2)) -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -q "^note: $out/.lock names pid $killed on .*, which ended without releasing it: taking it over$" "$tmp/out" &&
    [ "$rc" -eq 0 ] && steps_once "$out/log.jsonl" $((n + 2))
check $? "a lock left by a SIGKILLed trainer is taken over with one note, the run continues (exit $rc): $(grep '^note' "$tmp/out")"

echo "== a new run into a folder that holds a run"
out=$tmp/held
$TRAINER "${run[@]}" -n 2 -o "$out" > /dev/null 2>&1
before=$(fingerprint "$out")
$TRAINER "${run[@]}" -n 3 -o "$out" > "$tmp/out" 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "the output folder $out holds a run (1 checkpoint file and log.jsonl (" &&
    grep -qF "continue it with -y 1 -o $out, or start anew with --new-run" "$tmp/err" && [ "$rc" -eq 1 ] &&
    [ "$(fingerprint "$out")" = "$before" ]
check $? "no -y, no --init: refused (exit $rc), the run's files unchanged: $(head -c 300 "$tmp/err")"
$TRAINER "${run[@]}" -n 3 --init "$out/ckpt_00000002.bin" --weights-only -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "holds a run" && [ "$rc" -eq 1 ] && [ "$(fingerprint "$out")" = "$before" ]
check $? "--init of its checkpoint with --weights-only (a new run from step 0): refused too (exit $rc)"
$TRAINER "${run[@]}" -n 3 --new-run -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF -- "--new-run: moved the earlier run in $out (1 checkpoint file and log.jsonl (" "$tmp/out" &&
    grep -qF "into $out/previous_1/" "$tmp/out" && [ "$rc" -eq 0 ] && [ "$(fingerprint "$out/previous_1")" = "$before" ] &&
    steps_once "$out/log.jsonl" 3 && [ -f "$out/ckpt_00000003.bin" ] && [ ! -e "$out/ckpt_00000002.bin" ]
check $? "--new-run: the earlier run moved whole into previous_1/, the new one from step 1 (exit $rc): $(grep -- '^--new-run' "$tmp/out")"
$TRAINER "${run[@]}" -n 1 --new-run -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF "into $out/previous_2/" "$tmp/out" && [ "$rc" -eq 0 ] && [ "$(fingerprint "$out/previous_1")" = "$before" ] &&
    [ -f "$out/previous_2/ckpt_00000003.bin" ] && steps_once "$out/previous_2/log.jsonl" 3
check $? "again: into previous_2/, previous_1/ untouched (exit $rc)"
$TRAINER "${run[@]}" -n 3 -y 1 --new-run -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "-y 1 continues the run in $out and --new-run moves it aside" && [ "$rc" -eq 1 ]
check $? "-y 1 with --new-run: refused (exit $rc)"

echo "== --init of one of the folder's own checkpoints: the run goes back to it"
out=$tmp/back
$TRAINER "${run[@]}" -n 4 -k 1 --keep 5 -o "$out" > /dev/null 2>&1
later=$(cd "$out" && md5sum ckpt_00000002.bin ckpt_00000003.bin ckpt_00000004.bin log.jsonl)
$TRAINER "${run[@]}" -n 3 -k 1 --keep 5 --init "$out/ckpt_00000001.bin" -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF -- "--init $out/ckpt_00000001.bin goes back to step 1: the 3 later checkpoint(s) (up to step 4) and a copy of log.jsonl moved into $out/previous_1/" "$tmp/out" &&
    grep -qF "$out/log.jsonl: dropped 3 line(s) past step 1, where this run continues" "$tmp/out" && [ "$rc" -eq 0 ] &&
    [ "$(cd "$out/previous_1" && md5sum ckpt_00000002.bin ckpt_00000003.bin ckpt_00000004.bin log.jsonl)" = "$later" ] &&
    steps_once "$out/log.jsonl" 3 && [ ! -e "$out/ckpt_00000004.bin" ]
check $? "the later checkpoints and a copy of the log moved into previous_1/ whole, the log holds steps 1-3 once (exit $rc)"
$TRAINER "${run[@]}" -n 5 -k 1 --keep 5 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF "resumed from $out/ckpt_00000003.bin at step 3" "$tmp/out" && [ "$rc" -eq 0 ] && steps_once "$out/log.jsonl" 5
check $? "-y 1 then continues that run, not the one gone back from (exit $rc)"

echo "== -y 1 starts from scratch only where there is no run"
$TRAINER "${run[@]}" -n 2 -y 1 -o "$tmp/empty" > "$tmp/out" 2>&1
rc=$?
grep -qF -- "-y 1: no checkpoint in $tmp/empty yet: starting from scratch" "$tmp/out" && [ "$rc" -eq 0 ] &&
    steps_once "$tmp/empty/log.jsonl" 2
check $? "a new folder: starts from scratch, saying so (exit $rc)"
out=$tmp/corrupt
$TRAINER "${run[@]}" -n 2 -k 1 -o "$out" > /dev/null 2>&1
for f in "$out"/ckpt_*.bin; do printf 'garbage' | dd of="$f" bs=1 seek=0 conv=notrunc 2> /dev/null; done
before=$(fingerprint "$out")
$TRAINER "${run[@]}" -n 4 -y 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
grep -q "^error: -y 1: $out holds a run (2 checkpoint files and log.jsonl (.*) but no checkpoint that can continue it" \
    "$tmp/err" && grep -qF -- "--new-run" "$tmp/err" && [ "$(grep -c '^error' "$tmp/err")" -eq 1 ] && [ "$rc" -eq 1 ] &&
    [ "$(fingerprint "$out")" = "$before" ]
check $? "every checkpoint corrupt: refused naming --new-run (exit $rc), the log and the checkpoints untouched: $(grep '^error' "$tmp/err" | head -c 300)"
out=$tmp/logonly
mkdir -p "$out"
printf '{"step": 1, "loss": 1}\n{"step": 2, "loss": 1}\n' > "$out/log.jsonl"
$TRAINER "${run[@]}" -n 2 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF -- "-y 1 found no checkpoint to continue: moved the earlier run in $out (log.jsonl (46 bytes)) into $out/previous_1/" \
    "$tmp/out" && [ "$rc" -eq 0 ] && [ "$(wc -l < "$out/previous_1/log.jsonl")" -eq 2 ] && steps_once "$out/log.jsonl" 2
check $? "a log and no checkpoint (a run killed before its first): the log moves aside, the run starts (exit $rc)"

echo "== the folder moved, removed or replaced under a running trainer"
out=$tmp/moving
background "$tmp/first" "${run[@]}" -n 1000000 -k 1 --keep 1 -o "$out"
first=$bg
mv "$out" "$tmp/moved"
finish "$first"
rc=$?
[ "$(grep -c . "$tmp/first" | tr -d ' ')" -ge 1 ] && [ "$(grep -c '^error' "$tmp/first")" -eq 1 ] &&
    grep -q "^error: the output folder $out was moved to $tmp/moved during the run: .* was not written; put the folder back and continue with -y 1 -o $out$" "$tmp/first" &&
    [ "$rc" -eq 1 ] && [ ! -e "$out" ]
check $? "moved: the run stops (exit $rc), nothing recreated at -o: $(grep '^error' "$tmp/first" | head -c 300)"
mv "$tmp/moved" "$out"
n=$(grep -c '"step"' "$out/log.jsonl")
$TRAINER "${run[@]}" -n $((n + 1)) -k 1 -y 1 -o "$out" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 0 ] && steps_once "$out/log.jsonl" $((n + 1))
check $? "put back: -y 1 continues it, the log whole (exit $rc)"
background "$tmp/first" "${run[@]}" -n 1000000 -k 1 --keep 1 -o "$tmp/removed"
first=$bg
mv "$tmp/removed" "$tmp/gone" && rm -rf "$tmp/gone"  # (rm -rf alone races with the trainer's new files)
mkdir "$tmp/removed"
finish "$first"
rc=$?
# (removed, if the trainer looked before the folder was made again; replaced, after; moved, before rm)
grep -qE "^error: the output folder $tmp/removed was (removed|replaced|moved to $tmp/gone)" "$tmp/first" &&
    [ "$rc" -eq 1 ] && [ -z "$(ls -A "$tmp/removed")" ]
check $? "removed and made again: the run stops (exit $rc), nothing written into the new folder: $(grep '^error' "$tmp/first" | head -c 300)"

echo "== temporary files of a killed save, foreign log lines"
out=$tmp/stale
$TRAINER "${run[@]}" -n 2 -o "$out" > /dev/null 2>&1
head -c 1000 "$out/ckpt_00000002.bin" > "$out/ckpt_00000003.bin.tmp"
head -c 2000 "$out/ckpt_00000002.bin" > "$out/ckpt_00000004.bin.4242.tmp"
printf 'partial' > "$out/log.jsonl.4242.tmp"
printf 'x' > "$out/$(printf 'ckpt_\nerror: forged.tmp')"
printf 'garbage line\n' >> "$out/log.jsonl"
$TRAINER "${run[@]}" -n 3 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
grep -qF "removed $out/ckpt_00000003.bin.tmp (1000 bytes), a temporary file left by a save that was killed" "$tmp/out" &&
    grep -qF "removed $out/ckpt_00000004.bin.4242.tmp (1.95 KiB)" "$tmp/out" &&
    grep -qF "removed $out/log.jsonl.4242.tmp (7 bytes)" "$tmp/out" && [ -z "$(ls "$out" | grep '\.tmp$')" ] &&
    grep -qF "removed $out/ckpt_\\nerror: forged.tmp (1 bytes)" "$tmp/out" && ! grep -q '^error: forged' "$tmp/out" &&
    grep -qF "$out/log.jsonl: dropped 1 line(s) that are not a step's (they do not start with {\"step\":)" "$tmp/out" &&
    steps_once "$out/log.jsonl" 3 && [ "$(wc -l < "$out/log.jsonl")" -eq 3 ] && [ "$rc" -eq 0 ]
check $? "-y 1: four stale temporary files removed with their sizes (one named with a newline, quoted escaped), the foreign log line dropped with a note (exit $rc)"

echo "== a signal after the last step: the run is complete"
out=$tmp/complete
status=1
for attempt in 1 2 3; do
    rm -rf "$out"
    $TRAINER -i "$DATA" -p tiny -b 48 -t 1 --workers 1 -n 1 -o "$out" > "$tmp/out" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 600); do grep -q '^step' "$tmp/out" 2> /dev/null && break; sleep 0.01; done
    kill -TERM "$pid" 2> /dev/null || continue  # (ended before the signal: again)
    finish "$pid"
    rc=$?
    grep -qF "the run is complete: all 1 steps done, the last checkpoint is in $out (the signal came after the last step)" \
        "$tmp/out" && [ "$rc" -eq 0 ] && [ -f "$out/ckpt_00000001.bin" ] && ! grep -q '^interrupted' "$tmp/out"
    status=$?
    break
done
check $status "SIGTERM after the last step's line: exit ${rc:-?}, said complete, not interrupted: $(grep 'complete\|^interrupted' "$tmp/out")"

echo "== -i inside -o"
out=$tmp/inside
$TRAINER "${run[@]}" -n 1 -o "$out" > /dev/null 2>&1
cp "$DATA" "$out/data.bin"
before=$(fingerprint "$out")
$TRAINER -i "$out" -p tiny -n 2 -y 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "-i $out reads $out/ckpt_00000001.bin from the output folder $out, where the run writes its checkpoints" &&
    [ "$rc" -eq 1 ] && [ "$(fingerprint "$out")" = "$before" ]
check $? "-o equal to -i: refused (exit $rc): $(head -c 300 "$tmp/err")"
$TRAINER -i "$out/data.bin" -p tiny -n 2 -y 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "-i $out/data.bin reads $out/data.bin from the output folder" && [ "$rc" -eq 1 ]
check $? "a shard inside -o: refused (exit $rc)"
$TRAINER -i "$out/ckpt_00000001.bin" -p tiny -n 2 -o "$tmp/other" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "$out/ckpt_00000001.bin is a train_vla checkpoint, not a dataset shard" && [ "$rc" -eq 1 ]
check $? "a checkpoint given as a shard is named as one (exit $rc): $(head -c 300 "$tmp/err")"

echo "== write failures said as what they are"
if [ "$(id -u)" -ne 0 ]; then
    out=$tmp/readonly
    mkdir -p "$out" && chmod a-w "$out"
    $TRAINER "${run[@]}" -n 1 -o "$out" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "cannot write into the output folder $out (creating $out/.lock: Permission denied): this user may not write into $out: make it writable" &&
        [ "$rc" -eq 1 ] && ! grep -q 'free space' "$tmp/err"
    check $? "a folder without write permission: exit $rc, said as permissions: $(head -c 300 "$tmp/err")"
else
    echo "  (root writes into read-only folders: the permission case runs under a read-only mount below)"
fi
mkdir -p "$tmp/ro"
if mount -t tmpfs -o size=4m tmpfs "$tmp/ro" 2> /dev/null; then
    $TRAINER "${run[@]}" -n 1 -o "$tmp/ro/run" > /dev/null 2>&1
    mount -o remount,ro "$tmp/ro"
    $TRAINER "${run[@]}" -n 2 -y 1 -o "$tmp/ro/run" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "$tmp/ro/run is on a read-only file system: remount it read-write" && [ "$rc" -eq 1 ] &&
        ! grep -q 'free space' "$tmp/err" && [ -f "$tmp/ro/run/ckpt_00000001.bin" ]
    check $? "a read-only file system: exit $rc, said as such: $(head -c 300 "$tmp/err")"
    umount "$tmp/ro"
else
    echo "  (tmpfs cannot be mounted here: the read-only case is left out)"
fi

echo "== a .lock that is not the trainer's own file: refused, the file it names untouched"
out=$tmp/locklink
mkdir -p "$out"
printf 'a file of the user\nsecond line\n' > "$tmp/users_file"
ln -s "$tmp/users_file" "$out/.lock"
$TRAINER "${run[@]}" -n 1 -o "$out" > "$tmp/out" 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "$out/.lock is a symbolic link, not a lock file of train_vla's: remove the link" && [ "$rc" -eq 1 ] &&
    [ "$(cat "$tmp/users_file")" = "$(printf 'a file of the user\nsecond line')" ] && ! grep -q 'a file of the user' "$tmp/out" &&
    [ -z "$(ls "$out"/ckpt_* 2> /dev/null)" ]
check $? "a .lock linked to a file elsewhere: exit $rc, the file unchanged and not quoted: $(head -c 300 "$tmp/err")"
rm "$out/.lock"
ln "$tmp/users_file" "$out/.lock"
$TRAINER "${run[@]}" -n 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "$out/.lock is a file with other hard links, not a lock file of train_vla's" && [ "$rc" -eq 1 ] &&
    [ "$(wc -l < "$tmp/users_file")" -eq 2 ]
check $? "a .lock hard-linked to a file elsewhere: exit $rc, the file unchanged: $(head -c 300 "$tmp/err")"
rm "$out/.lock"
mkfifo "$out/.lock"
$TRAINER "${run[@]}" -n 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "$out/.lock is not a regular file, not a lock file of train_vla's" && [ "$rc" -eq 1 ]
check $? "a .lock that is a FIFO: exit $rc: $(head -c 300 "$tmp/err")"
rm "$out/.lock"
printf 'pid 1 on host\nerror: forged\033[31m\n' > "$out/.lock"
$TRAINER "${run[@]}" -n 1 -o "$out" > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -eq 0 ] && grep -qF "note: $out/.lock names pid 1 on host, which ended" "$tmp/out" && ! grep -q 'forged' "$tmp/out"
check $? "a lock left with a second line: the note quotes its first line only (exit $rc)"
printf 'pid 1 on a\rhost\033[2J\n' > "$out/.lock"
$TRAINER "${run[@]}" -n 2 -y 1 -o "$out" > "$tmp/out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -qF 'names pid 1 on a\rhost\x1b[2J, which ended' "$tmp/out" && [ "$(tr -cd '\r\033' < "$tmp/out" | wc -c)" -eq 0 ]
check $? "control bytes in a lock's line are quoted escaped (exit $rc)"

echo "== the GPU trainer ($GPU_TRAINER)"
if [ -x "$GPU_TRAINER" ]; then
    out=$tmp/gpu
    TRAINER=$GPU_TRAINER background "$tmp/first" -i "$DATA" -p tiny -b 2 --workers 1 "${long[@]}" -o "$out"
    first=$bg
    $GPU_TRAINER -i "$DATA" -p tiny -b 2 -n 3 -y 1 -o "$out" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "the output folder $out is in use by another trainer (pid $first on" && [ "$rc" -eq 1 ]
    check $? "a second trainer on its -o: refused naming it (exit $rc)"
    kill -HUP "$first"
    finish "$first"
    rc=$?
    n=$(grep -c '"step"' "$out/log.jsonl")
    grep -qF "interrupted: saved step $n to $out; continue with -y 1 -o $out" "$tmp/first" && [ "$rc" -eq 130 ] &&
        [ -f "$out/$(printf 'ckpt_%08d.bin' "$n")" ] && steps_once "$out/log.jsonl" "$n"
    check $? "SIGHUP saves step $n (exit $rc)"
    before=$(fingerprint "$out")
    $GPU_TRAINER -i "$DATA" -p tiny -b 2 -n 3 -o "$out" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "the output folder $out holds a run (1 checkpoint file and log.jsonl (" && [ "$rc" -eq 1 ] &&
        [ "$(fingerprint "$out")" = "$before" ]
    check $? "a new run into it: refused, the run's files unchanged (exit $rc)"
    ln -s "$tmp/users_file" "$tmp/gpu_link_lock" && mkdir -p "$tmp/gpu_link" && mv "$tmp/gpu_link_lock" "$tmp/gpu_link/.lock"
    $GPU_TRAINER -i "$DATA" -p tiny -b 2 -n 1 -o "$tmp/gpu_link" > /dev/null 2> "$tmp/err"
    rc=$?
    one_line_error "$tmp/err" "$tmp/gpu_link/.lock is a symbolic link, not a lock file of train_vla's" && [ "$rc" -eq 1 ] &&
        [ "$(wc -l < "$tmp/users_file")" -eq 2 ]
    check $? "a .lock linked to a file elsewhere: refused, the file unchanged (exit $rc)"
else
    echo "  ($GPU_TRAINER is not built: make $GPU_TRAINER)"
fi

echo "== what a run says as it goes"
out=$tmp/says
$TRAINER "${run[@]}" -n 4 -u 1 -k 2 -o "$out" > "$tmp/says_out" 2> "$tmp/says_err"
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c '^checkpoint of step' "$tmp/says_out")" -eq 2 ] &&
    grep -qxF "checkpoint of step 2: $out/ckpt_00000002.bin" "$tmp/says_out" &&
    grep -qxF "checkpoint of step 4: $out/ckpt_00000004.bin" "$tmp/says_out" && [ ! -s "$tmp/says_err" ]
check $? "one line per checkpoint written, naming its step and file, nothing on stderr (exit $rc)"
! grep -q '^warning: --warmup' "$tmp/says_out"
check $? "no warning for a warmup that ends inside the run"
$TRAINER "${run[@]}" -n 4 -u 5 -k 0 -o "$tmp/says_warm" > "$tmp/says_out" 2> "$tmp/says_err"
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c '^warning:' "$tmp/says_out")" -eq 1 ] && [ ! -s "$tmp/says_err" ] &&
    grep -q "^warning: --warmup 5 is longer than the run's 4 steps (-n): .* lower -u or raise -n$" "$tmp/says_out"
check $? "a warmup longer than the run: one warning line under the config table, and the run goes on (exit $rc)"

echo "== the run's settings (run.json) and -y 1 continuing with them"
# the log without what depends on the clock (times, rates, the loader's wait)
steady_log() { sed -E 's/, "(ms|samples_per_s|loader_wait_ms)": [^,}]*//g' "$1"; }
settings=(-n 300 -l 3e-3 -u 37 -k 50 --min-lr-frac 0.2 -s 7)
out=$tmp/settings_straight
$TRAINER "${run[@]}" "${settings[@]}" -o "$out" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q '"steps": 300, "lr": 0.003, ' "$out/run.json" && grep -q '"warmup": 37,' "$out/run.json" &&
    grep -q "\"input\": \"$DATA\"" "$out/run.json" && build/venv/bin/python -c "import json,sys; json.load(open(sys.argv[1]))" "$out/run.json"
check $? "run.json: readable JSON naming every setting the run was given (exit $rc)"
# the same run killed after a checkpoint, then continued with -y 1 -o alone: the straight run's log and checkpoint
out=$tmp/settings_killed
interrupted=0
for _ in 1 2 3; do
    rm -rf "$out"
    $TRAINER "${run[@]}" "${settings[@]}" -o "$out" > /dev/null 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 600); do [ -f "$out/ckpt_00000050.bin" ] && break; sleep 0.02; done
    kill -9 "$pid" 2> /dev/null
    wait "$pid" 2> /dev/null
    [ ! -f "$out/ckpt_00000300.bin" ] && { interrupted=1; break; }  # (done before the kill: again)
done
$TRAINER -y 1 -o "$out" > "$tmp/resumed_out" 2>&1
rc=$?
[ "$interrupted" -eq 1 ] && [ "$rc" -eq 0 ] && ! grep -q '^-y 1:\|learning rate jumps' "$tmp/resumed_out" &&
    [ "$(steady_log "$out/log.jsonl")" = "$(steady_log "$tmp/settings_straight/log.jsonl")" ] &&
    cmp -s "$out/ckpt_00000300.bin" "$tmp/settings_straight/ckpt_00000300.bin"
check $? "killed after step 50, continued with -y 1 -o alone: the straight run's log and last checkpoint, bit for bit (exit $rc)"
$TRAINER "${run[@]}" -n 300 -l 3e-3 -y 1 -o "$out" > "$tmp/again_out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q '^already at step 300 of 300' "$tmp/again_out" && ! grep -q '^-y 1:' "$tmp/again_out"
check $? "flags given again with the run's values: silent (exit $rc)"
$TRAINER -y 1 -n 310 -l 1e-3 -o "$out" > "$tmp/more_out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c '^-y 1:' "$tmp/more_out")" -eq 2 ] &&
    grep -qxF -- "-y 1: --steps is 310 from step 300 on (it was 300, $out/run.json says)" "$tmp/more_out" &&
    grep -qxF -- "-y 1: --lr is 0.001 from step 300 on (it was 0.003, $out/run.json says)" "$tmp/more_out" &&
    steps_once "$out/log.jsonl" 310 && grep -c '"from_step"' "$out/run.json" | grep -qx 2 &&
    grep -q '"from_step": 300, .*"steps": 310, "lr": 0.001, ' "$out/run.json"
check $? "a finished run continued with -y 1 -n 310 -l 1e-3: one line per change, old and new value; run.json gains an entry from step 300 (exit $rc)"
# a finished run trained further with -n 600: the cosine now spans 600 steps, so step 301's learning rate
# jumps up from where the run's schedule ended: said in one warning, with both values
out_more=$tmp/settings_further
cp -r "$tmp/settings_straight" "$out_more"
$TRAINER -y 1 -n 600 -k 0 -o "$out_more" > "$tmp/further_out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && [ "$(grep -c '^warning:' "$tmp/further_out")" -eq 1 ] &&
    grep -q '^warning: -y 1: the learning rate jumps from 6.000e-04 (the run.s schedule at step 300) to 1.9[0-9]*e-03 at step 301: the schedule is now 37 steps of warmup and a cosine over -n 600 (it was 37 and 300); the run goes on as asked$' "$tmp/further_out" &&
    steps_once "$out_more/log.jsonl" 600
check $? "a finished run trained further with -y 1 -n 600: one warning that the learning rate jumps at step 301, both values named; it trains to 600 (exit $rc)"
cp "$out/run.json" "$tmp/run.json.kept"
$TRAINER -y 1 -o "$out" > "$tmp/kept_out" 2>&1
rc=$?
[ "$rc" -eq 0 ] && grep -q '^already at step 310 of 310' "$tmp/kept_out" && cmp -s "$out/run.json" "$tmp/run.json.kept"
check $? "-y 1 alone after it: the changed settings hold (already at step 310), run.json as it was (exit $rc)"
$TRAINER -y 1 -p small -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "was written for another model" && [ "$rc" -eq 1 ] && cmp -s "$out/run.json" "$tmp/run.json.kept"
check $? "-y 1 with another preset: refused in one line, run.json unchanged (exit $rc)"
printf '{\n  "entries": [\n    {"from_step": "x"}\n  ]\n}\n' > "$tmp/bad.json"
cp "$tmp/bad.json" "$out/run.json"
$TRAINER -y 1 -o "$out" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "$out/run.json, line 3, is not an entry of the run's settings" && [ "$rc" -eq 1 ] &&
    cmp -s "$out/run.json" "$tmp/bad.json"
check $? "a run.json not of train_vla's: refused in one line naming the file and line, the file untouched (exit $rc)"
cp "$tmp/run.json.kept" "$out/run.json"
$TRAINER "${run[@]}" -n 2 --new-run -o "$out" > /dev/null 2>&1
rc=$?
[ "$rc" -eq 0 ] && cmp -s "$out/previous_1/run.json" "$tmp/run.json.kept" && grep -q '"steps": 2,' "$out/run.json" &&
    [ -s "$out/previous_1/events.out.tfevents.train_vla" ] && [ -s "$out/events.out.tfevents.train_vla" ]
check $? "--new-run: the earlier run.json and TensorBoard file move into previous_1/ with its run (exit $rc)"
out=$tmp/settings_default
mkdir -p "$tmp/cwd" && (cd "$tmp/cwd" && "$OLDPWD/$TRAINER" -i "$OLDPWD/$DATA" -p tiny -b 2 -t 1 -n 1 > out.txt 2>&1 &&
    "$OLDPWD/$TRAINER" -i "$OLDPWD/$DATA" -p pi0_tiny -b 2 -t 1 -n 1 >> out.txt 2>&1)
rc=$?
[ "$rc" -eq 0 ] && [ -f "$tmp/cwd/out/tiny/ckpt_00000001.bin" ] && [ -f "$tmp/cwd/out/pi0_tiny/ckpt_00000001.bin" ] &&
    grep -qxF "checkpoint of step 1: out/pi0_tiny/ckpt_00000001.bin" "$tmp/cwd/out.txt"
check $? "without -o each preset's run goes to out/<preset>: two presets one after the other (exit $rc)"

echo "== evaluation while training (--eval-every, --eval-cmd)"
out=$tmp/evals
# each evaluation sleeps 2 s: the steps go on meanwhile; step 4's waits for step 2's, then step 6's takes its place;
# the run waits for step 2's and then step 6's
cmd='sleep 2; printf "{\"success_rate\": 0.%s}" {step} > {results}; echo evaluated {checkpoint}'
t0=$(date +%s.%N)
$TRAINER "${run[@]}" -n 6 -u 1 -k 0 --eval-every 2 --eval-cmd "$cmd" -o "$out" > "$tmp/eval_out" 2> "$tmp/eval_err"
rc=$?
first_step=$(grep -n '^step     6/6' "$tmp/eval_out" | cut -d: -f1)
evaluated=$(grep -n '^evaluation of step 2 ' "$tmp/eval_out" | cut -d: -f1)
[ "$rc" -eq 0 ] && [ -n "$first_step" ] && [ -n "$evaluated" ] && [ "$first_step" -lt "$evaluated" ] &&
    [ "$(grep -c '^warning:' "$tmp/eval_out")" -eq 1 ] &&
    grep -q "^warning: the evaluation of step 2 still runs: step 4's, which waited for it, is skipped for step 6's" "$tmp/eval_out" &&
    grep -q '^waiting for the evaluations of steps 2 and 6 to end' "$tmp/eval_out" &&
    [ "$(grep -c '"eval": ' "$out/log.jsonl")" -eq 2 ] && grep -qxF '{"step": 2, "eval": {"success_rate": 0.2}}' "$out/log.jsonl" &&
    grep -qxF '{"step": 6, "eval": {"success_rate": 0.6}}' "$out/log.jsonl" && steps_once <(grep -v '"eval"' "$out/log.jsonl") 6 &&
    grep -qxF "evaluated $out/eval/step_00000002.bin" "$out/eval/step_00000002.log" && [ ! -e "$out/eval/step_00000002.bin" ] &&
    [ -f "$out/ckpt_00000002.bin" ] && [ ! -s "$tmp/eval_err" ]
check $? "--eval-every 2, 2 s an evaluation: training runs on to step 6 meanwhile, step 4's waiting one gives way to step 6's in one warning, the run waits for both; their results in log.jsonl by step (exit $rc)"
for bad in "exit 3|failed (exit 3 after" "echo not JSON > {results}|wrote no results: $out/eval/step_00000002.json is missing or not a JSON object of numbers"; do
    rm -rf "$out"
    $TRAINER "${run[@]}" -n 2 -u 1 -k 0 --eval-every 2 --eval-cmd "${bad%%|*}" -o "$out" > "$tmp/eval_out" 2> "$tmp/eval_err"
    rc=$?
    [ "$rc" -eq 0 ] && [ "$(grep -c '^warning:' "$tmp/eval_out")" -eq 1 ] &&
        grep -qF "warning: the evaluation of step 2 ${bad#*|}" "$tmp/eval_out" && ! grep -q '"eval"' "$out/log.jsonl" &&
        steps_once "$out/log.jsonl" 2 && [ ! -s "$tmp/eval_err" ]
    check $? "an evaluation that does '${bad%%|*}': one warning line, the run ends with exit 0 ($rc), nothing in the log"
done
$TRAINER "${run[@]}" -n 2 --eval-cmd true -o "$tmp/evals_refused" > /dev/null 2> "$tmp/err"
rc=$?
one_line_error "$tmp/err" "--eval-cmd is the command --eval-every runs: add --eval-every N" && [ "$rc" -eq 1 ] &&
    [ ! -e "$tmp/evals_refused" ]
check $? "--eval-cmd without --eval-every: refused in one line, nothing written (exit $rc)"

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
