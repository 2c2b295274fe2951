#!/usr/bin/env bash
# The MT10 recipe end to end, every figure written to one folder:
#   1. data: 50 expert demonstrations per MT10 task (data/metaworld_gen.py, one 64 px corner camera),
#      or the shards (or an .xz of one shard) given in DATA;
#   2. training: train_vla on a GPU (default: the small preset, everything training: --train all),
#      or train_vla_cpu (TRAINER=cpu: the same run on the CPU, about an hour on 2 cores);
#   3. evaluation: the final checkpoint on all 10 tasks, EPISODES per task, on layouts from
#      EVAL_SEED (never used in training), and the expert and random baselines on the same layouts;
#   4. figures: curves.png (scripts/plot_log.py), results.md (the tables, device, commit, times).
#
#   scripts/mt10_recipe.sh                        # on a GPU machine: generate, train, evaluate, plot
#   OUT=build/mt10_gpu DATA=build/mt10/data scripts/mt10_recipe.sh          # reuse generated shards
#   TRAINER=cpu OUT=build/mt10_small scripts/mt10_recipe.sh   # docs/mt10.md's run, on the CPU
#   PRESET=smolvla TRAIN=expert IMG=224 scripts/mt10_recipe.sh    # SmolVLA's sizes, the expert fine-tuned
#
# Every stage is skipped when its output is already there (the shards, the final checkpoint,
# each evaluation's JSON), and an interrupted training resumes from its newest checkpoint, so
# running the script again after a failure or a stop continues where it was.
set -euo pipefail
cd "$(dirname "$0")/.."

TRAINER=${TRAINER:-gpu}                  # gpu: ./train_vla; cpu: ./train_vla_cpu
OUT=${OUT:-build/mt10_$TRAINER}          # the folder every result goes to
DATA=${DATA:-}                           # shards to train on (folder or files, or a .bin.xz); empty: generate
EPISODES_PER_TASK=${EPISODES_PER_TASK:-50}   # demonstrations generated per task
GEN_WORKERS=${GEN_WORKERS:-$(nproc)}     # generator processes
IMG=${IMG:-64}                           # camera side in pixels, generated and rendered in evaluation (the model
                                         # resizes it to its input; at 64, reach's goal is a dot of 1-2 pixels)
PRESET=${PRESET:-small}                  # model size: tiny, small or smolvla (README: presets)
TRAIN=${TRAIN:-all}                      # what trains: expert, vlm or all (train_vla --train)
MAX_TEXT=${MAX_TEXT:-24}                 # instruction bytes the model reads, 0: the preset's (MT10 needs 18 or more)
BATCH=${BATCH:-64}                       # samples per step
STEPS=${STEPS:-20000}                    # optimizer steps
LR=${LR:-1e-3}                           # peak learning rate
WARMUP=${WARMUP:-500}                    # warmup steps
AUGMENT=${AUGMENT:-0}                    # random image shift in pixels
SEED=${SEED:-1337}                       # training seed
CKPT_EVERY=${CKPT_EVERY:-2000}           # checkpoint interval
EPISODES=${EPISODES:-20}                 # evaluation episodes per task
EVAL_SEED=${EVAL_SEED:-2026}             # evaluation layouts: distinct from the generator's (0) and docs/policy.md's 1000
REPLAN=${REPLAN:-4}                      # actions executed from each predicted chunk
EVAL_WORKERS=${EVAL_WORKERS:-$(nproc)}   # evaluation processes (CPU); with a GPU the policy runs there
PY=${PY:-build/venv/bin/python}

case "$TRAINER" in
    gpu) trainer=./train_vla; library=libvla_gpu.so; device=cuda ;;
    cpu) trainer=./train_vla_cpu; library=libvla.so; device=cpu ;;
    *) echo "error: TRAINER=$TRAINER: use gpu or cpu" >&2; exit 1 ;;
esac
[ -x "$PY" ] || { echo "error: $PY is missing: run 'make setup' (as root) first" >&2; exit 1; }
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/recipe.log"; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +changes)
log "MT10 recipe: trainer $TRAINER, preset $PRESET, --train $TRAIN, batch $BATCH, $STEPS steps, lr $LR, commit $commit -> $OUT"

# 1. data
if [ -z "$DATA" ]; then
    DATA=$OUT/data
    if ! ls "$DATA"/*.bin > /dev/null 2>&1; then
        log "generating $EPISODES_PER_TASK demonstrations per task with $GEN_WORKERS workers"
        "$PY" data/metaworld_gen.py -o "$DATA" --tasks MT10 --episodes "$EPISODES_PER_TASK" --img "$IMG" \
            --cameras corner --workers "$GEN_WORKERS" --seed 0 --name mt10 2>&1 | tee "$OUT/generate.log"
    fi
elif [[ "$DATA" == *.xz ]]; then
    mkdir -p "$OUT/data"
    unpacked=$OUT/data/$(basename "${DATA%.xz}")
    if [ ! -f "$unpacked" ]; then xz -dc "$DATA" > "$unpacked.tmp" && mv "$unpacked.tmp" "$unpacked"; fi
    DATA=$OUT/data
fi

# 2. training
make -s "$(basename "$trainer")" "$library" > /dev/null
final=$(printf "%s/run/ckpt_%08d.bin" "$OUT" "$STEPS")
if [ ! -f "$final" ]; then
    log "training: $trainer -p $PRESET --train $TRAIN -b $BATCH -n $STEPS on $DATA (log: $OUT/train.log)"
    start=$(date +%s)
    "$trainer" -p "$PRESET" --train "$TRAIN" --max-text "$MAX_TEXT" -i "$DATA" -b "$BATCH" -n "$STEPS" -u "$WARMUP" -l "$LR" \
        --augment-shift "$AUGMENT" -s "$SEED" -k "$CKPT_EVERY" --keep 20 --log-every 100 -y 1 -o "$OUT/run" \
        >> "$OUT/train.log" 2>&1
    echo $(( $(date +%s) - start )) >> "$OUT/train_seconds"
fi
[ -f "$final" ] || { echo "error: training ended without $final: see $OUT/train.log" >&2; exit 1; }
train_s=$(awk '{ s += $1 } END { print s + 0 }' "$OUT/train_seconds" 2>/dev/null || echo 0)
log "trained: $final (training wall clock $((train_s / 60)) min $((train_s % 60)) s)"

# 3. evaluation on unseen layouts, the baselines on the same ones
evaluate() {  # evaluate NAME POLICY [ARGS...]
    local name=$1 policy=$2
    shift 2
    if [ ! -f "$OUT/eval_$name.json" ]; then
        log "evaluating $name: $EPISODES episodes per task, seed $EVAL_SEED"
        "$PY" scripts/eval_metaworld.py --policy "$policy" --tasks MT10 --episodes "$EPISODES" --seed "$EVAL_SEED" \
            --workers "$EVAL_WORKERS" --out "$OUT/eval_$name.json" "$@" > "$OUT/eval_$name.txt" 2> "$OUT/eval_$name.progress"
    fi
    cat "$OUT/eval_$name.txt"
}
evaluate policy "$final" --replan "$REPLAN" --device "$device" --img "$IMG" --video-dir "$OUT/videos" --video-episodes 0
evaluate expert expert
evaluate random random

# 4. figures
"$PY" scripts/plot_log.py "$OUT/run/log.jsonl" --names "MT10 $PRESET ($TRAINER)" -o "$OUT/curves.png" \
    --title "MT10, preset $PRESET (--train $TRAIN), batch $BATCH, lr $LR, $STEPS steps" > /dev/null
if [ "$TRAINER" = gpu ]; then
    machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1 || echo "GPU")
else
    machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') ($(nproc) cores)"
fi
{
    echo "# MT10: $PRESET preset (--train $TRAIN), $STEPS steps of $BATCH, trained with $trainer"
    echo
    echo "device: $machine; commit $commit; training wall clock $((train_s / 60)) min $((train_s % 60)) s"
    echo "data: $DATA ($(grep -h -m1 -o '[0-9]* episodes of [0-9]* task(s), [0-9]* frames' "$OUT/generate.log" 2> /dev/null || echo "given"))"
    echo "training: -p $PRESET --train $TRAIN --max-text $MAX_TEXT -b $BATCH -n $STEPS -u $WARMUP -l $LR --augment-shift $AUGMENT -s $SEED"
    echo "evaluation: $EPISODES episodes per task, layouts from seed $EVAL_SEED, replanning every $REPLAN actions"
    for name in policy expert random; do
        echo
        echo "## $name"
        echo
        echo '```'
        cat "$OUT/eval_$name.txt"
        echo '```'
    done
    echo
    echo "![training curves](curves.png)"
} > "$OUT/results.md"
log "wrote $OUT/results.md and $OUT/curves.png"
