#!/usr/bin/env bash
# Trains on one GPU: builds train_vla (bf16) and runs it on the default data into its run folder
# (out/<preset>/, or -o), continuing from the newest checkpoint there if there is one, with the
# settings the run recorded (run.json). Flags after the script's name go
# to the trainer (./train_vla -h lists them) and win over the ones here.
#
#   scripts/train_1gpu.sh                          # the small preset on data/default
#   scripts/train_1gpu.sh -p smolvla -b 32 -n 20000   # another size, batch and length
#   CUDA_VISIBLE_DEVICES=3 scripts/train_1gpu.sh   # on GPU 3 of this machine
set -euo pipefail
cd "$(dirname "$0")/.."
make train_vla > /dev/null
exec ./train_vla -g 1 -y 1 "$@"
