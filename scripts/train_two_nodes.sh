#!/usr/bin/env bash
# Two machines with GPUS GPUs each (default 8): run this on both, NODE_RANK=0 on the first.
# Node 0 listens on MASTER (its address as the other node reaches it, and a free port) and hands
# NCCL's id to node 1; NCCL then connects the 2 x GPUS ranks itself. Both nodes must run the
# same configuration (the bootstrap refuses a mismatch, naming the field) and see OUT on shared
# storage: rank 0 writes the checkpoints and every node resumes from them. Both get the same
# VLA_RUN_TOKEN, a secret of your choosing (the script cannot hand one to the other machine):
# a host that reaches node 0's port without it can neither join the run nor stop its start.
#
#   node0$ export VLA_RUN_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'); echo "$VLA_RUN_TOKEN"
#   node0$ MASTER=node0:29500 NODE_RANK=0 scripts/train_two_nodes.sh -p smolvla -n 20000
#   node1$ export VLA_RUN_TOKEN=<the same>
#   node1$ MASTER=node0:29500 NODE_RANK=1 scripts/train_two_nodes.sh -p smolvla -n 20000
#
# The other knobs of scripts/train_multi_gpu.sh apply (BATCH, TOTAL_BATCH, LR_SCALE, ZERO, OUT...).
# Troubleshooting: NCCL_DEBUG=INFO prints how NCCL connects; NCCL_SOCKET_IFNAME=eth0 picks the
# network interface NCCL uses between nodes; NCCL_IB_DISABLE=1 falls back from InfiniBand to TCP.
set -euo pipefail
: "${MASTER:?set MASTER=host:port of node 0 (reachable from node 1, a free port)}"
: "${NODE_RANK:?set NODE_RANK=0 on the first machine, 1 on the second}"
: "${VLA_RUN_TOKEN:?set VLA_RUN_TOKEN to the same secret on both machines, e.g. one from od -An -N16 -tx1 /dev/urandom}"
export VLA_RUN_TOKEN
export MASTER NODE_RANK
export NODES=2
export GPUS=${GPUS:-8}
exec "$(dirname "$0")/train_multi_gpu.sh" "$@"
