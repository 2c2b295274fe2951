#!/usr/bin/env bash
# Trains on several GPUs of this machine (or, with NODES > 1, of several machines): the template
# to copy and edit. Every knob is an environment variable with its default below; flags after
# the script's name go to the trainer as they are and win over the knobs (./train_vla -h lists
# them all).
#
#   scripts/train_multi_gpu.sh                              # every visible GPU, defaults below
#   GPUS=4 BATCH=32 TOTAL_BATCH=256 PRESET=smolvla scripts/train_multi_gpu.sh -n 20000
#   CUDA_VISIBLE_DEVICES=2,3 scripts/train_multi_gpu.sh     # GPUs 2 and 3 only
#   DRY_RUN=1 scripts/train_multi_gpu.sh                    # print the command, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."

# --- which GPUs and how many -----------------------------------------------------------------
# GPUS: GPUs on this machine, one rank (host thread + NCCL communicator) each. Default: every
# GPU the process can see: those in CUDA_VISIBLE_DEVICES when it is set (the trainer uses
# the first GPUS of them, in that order), else every GPU nvidia-smi lists.
if [ -z "${GPUS:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        GPUS=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    elif command -v nvidia-smi > /dev/null; then
        GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true)
        if [ "$GPUS" = 0 ]; then
            echo "error: nvidia-smi lists no GPU: check the driver (nvidia-smi -L), or set GPUS" >&2
            exit 1
        fi
    else
        GPUS=1
    fi
fi
# NODES, NODE_RANK, MASTER: a run over several machines (scripts/train_two_nodes.sh, Slurm:
# scripts/train_slurm.sbatch). NODES machines with GPUS GPUs each; NODE_RANK is this machine's
# place (0 .. NODES-1); MASTER is host:port of node 0, where the others fetch NCCL's id. Under
# Slurm the trainer reads SLURM_NNODES and SLURM_NODEID itself, and VLA_MASTER for --master.
# VLA_RUN_TOKEN: the same secret on every node, read by the trainer itself (--run-token's value,
# kept off the command line, which other users of the machine can read); without one node 0
# warns that any host reaching its port can join the run.
NODES=${NODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER=${MASTER:-}

# --- batch and learning rate -----------------------------------------------------------------
# BATCH: samples per GPU per micro-step (what fits in the GPU's memory).
# TOTAL_BATCH: samples per optimizer step over every GPU of every node; a multiple of
# BATCH x GPUS x NODES, the rest is gradient accumulation. 0: BATCH x GPUS x NODES, no accumulation.
BATCH=${BATCH:-16}
TOTAL_BATCH=${TOTAL_BATCH:-0}
# LR: the peak learning rate as tuned on one GPU at BATCH. LR_SCALE: how it grows with the
# number of GPUs x nodes: none (keep LR), linear (LR x world size), sqrt (LR x sqrt(world size)).
LR=${LR:-3e-4}
LR_SCALE=${LR_SCALE:-none}
# ZERO: 1 shards the AdamW moments and master weights over the GPUs (ZeRO-1): less memory per
# GPU for one reduce-scatter + all-gather per step instead of one all-reduce.
ZERO=${ZERO:-0}

# --- what to train, for how long, where to -----------------------------------------------------
PRESET=${PRESET:-small}                # tiny, small, smolvla (lerobot/smolvla_base's sizes)
TRAIN=${TRAIN:-}                       # what trains: expert, vlm, all; empty: the preset's (expert for smolvla, all otherwise)
DATA=${DATA:-data/default}             # shard files or folders, comma-separated
STEPS=${STEPS:-1000}                   # optimizer steps in total
WARMUP=${WARMUP:-100}                  # linear warmup steps
OUT=${OUT:-out}                        # checkpoints and log.jsonl (on shared storage across nodes)
CKPT_EVERY=${CKPT_EVERY:-200}          # steps between checkpoints
RESUME=${RESUME:-1}                    # 1: continue from the newest complete checkpoint in OUT
WORKERS=${WORKERS:-2}                  # data loader threads per GPU, filling batches ahead
NCCL_TIMEOUT=${NCCL_TIMEOUT:-600}      # seconds one step may take (collectives included) before the run aborts

# --- the binary ------------------------------------------------------------------------------
# PRECISION: BF16 (bf16 compute, fp32 master weights and optimizer) or FP32 (everything fp32,
# slower, for checking). TRAINER: a binary to run instead of building one.
PRECISION=${PRECISION:-BF16}
if [ -z "${TRAINER:-}" ]; then
    case "$PRECISION" in
        BF16) TRAINER=./train_vla; build=(train_vla) ;;
        FP32) TRAINER=build/gpu/train_vla_fp32; build=(build/gpu/train_vla_fp32 data) ;;
        *) echo "error: PRECISION=$PRECISION: use BF16 or FP32" >&2; exit 1 ;;
    esac
    if [ -z "${DRY_RUN:-}" ]; then make "${build[@]}" > /dev/null; fi
fi

cmd=("$TRAINER" -p "$PRESET" -i "$DATA" -o "$OUT" -g "$GPUS" -b "$BATCH" -d "$TOTAL_BATCH"
     -l "$LR" --lr-scale "$LR_SCALE" -z "$ZERO" -n "$STEPS" -u "$WARMUP" -k "$CKPT_EVERY"
     -y "$RESUME" --workers "$WORKERS" --nccl-timeout "$NCCL_TIMEOUT")
if [ -n "$TRAIN" ]; then cmd+=(--train "$TRAIN"); fi
if [ "$NODES" != 1 ]; then
    cmd+=(--nodes "$NODES" --node-rank "$NODE_RANK")
    if [ -n "$MASTER" ]; then cmd+=(--master "$MASTER"); fi
fi
cmd+=("$@")
echo "${cmd[*]}"
if [ -n "${DRY_RUN:-}" ]; then exit 0; fi
exec "${cmd[@]}"
