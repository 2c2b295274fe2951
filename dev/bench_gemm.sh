#!/usr/bin/env bash
# The CPU trainer's matrix products against PyTorch's, shape by shape, in one run: dev/bench_gemm
# (train_vla.c's gemm_acc: what train_vla_cpu and libvla.so run) and torch.matmul (build/venv's
# torch, its own BLAS) on the smolvla preset's Linear shapes (forward, input gradient, weight
# gradient), the same thread count, the median of REPS runs each after one warm-up; then the
# GFLOP/s side by side with their ratio (above 1: train_vla faster), and train_vla's as a share of
# its tile's ceiling on these cores (dev/bench_gemm's first line).
#   dev/bench_gemm.sh                  # 2 threads, 5 runs, one sample's rows
#   THREADS=1 REPS=9 ROWS_SCALE=8 dev/bench_gemm.sh   # batch 8's rows
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
REPS=${REPS:-5}
ROWS_SCALE=${ROWS_SCALE:-1}
PYTHON=${PYTHON:-build/venv/bin/python}
make -s dev/bench_gemm
c_out=$(dev/bench_gemm --threads "$THREADS" --reps "$REPS" --rows-scale "$ROWS_SCALE")
shapes=$(mktemp)
trap 'rm -f "$shapes"' EXIT
echo "$c_out" > "$shapes"
py_out=$(OMP_NUM_THREADS="$THREADS" "$PYTHON" - "$THREADS" "$REPS" "$shapes" <<'PY'
import re, statistics, sys, time
import torch
threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
for line in open(sys.argv[3]).read().splitlines()[1:]:
    m = re.search(r"(\d+) x +(\d+) x +(\d+)  (forward|input grad|weight grad)", line)
    M, K, N = int(m.group(1)), int(m.group(2)), int(m.group(3))
    g = torch.Generator().manual_seed(0)
    # the same operand layouts as the C products: x @ W^T, dy @ W, dy^T @ x
    if m.group(4) == "forward":
        a, b = torch.rand(M, K, generator=g), torch.rand(N, K, generator=g).t()
    elif m.group(4) == "input grad":
        a, b = torch.rand(M, K, generator=g), torch.rand(K, N, generator=g)
    else:
        a, b = torch.rand(K, M, generator=g).t(), torch.rand(K, N, generator=g)
    c = torch.zeros(M, N)
    t = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        c.addmm_(a, b)
        t.append(time.perf_counter() - t0)
    print(f"{2.0 * M * K * N / statistics.median(t[1:]) * 1e-9:.1f}")
PY
)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "matrix products of the smolvla preset's Linears, rows x $ROWS_SCALE, $THREADS threads, median of $REPS"
echo "machine: $cpu ($(nproc) cores), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
ceiling=$(echo "$c_out" | head -1 | grep -oE 'ceiling [0-9.]+' | cut -d' ' -f2)
echo "train_vla's $(echo "$c_out" | head -1 | grep -oE 'tile .* GFLOP/s') (its panels in L1, all threads: the products' ceiling)"
printf '| %-28s | %-20s | %-19s | %9s | %9s | %6s | %10s |\n' layer "M x K x N" product train_vla torch ratio "of ceiling"
paste -d'|' <(echo "$c_out" | tail -n +2) <(echo "$py_out") | while IFS='|' read -r c p; do
    name=${c:0:28}
    shape=$(echo "$c" | grep -oE '[0-9]+ x +[0-9]+ x +[0-9]+' | tr -s ' ')
    kind=$(echo "$c" | grep -oE '(forward x@W\^T|input grad dy@W|weight grad dy\^T@x)')
    g=$(echo "$c" | awk '{print $(NF-1)}')
    printf '| %-28s | %-20s | %-19s | %9s | %9s | %5.2fx | %9.0f%% |\n' "$name" "$shape" "$kind" "$g" "$p" \
        "$(awk -v a="$g" -v b="$p" 'BEGIN{print a/b}')" "$(awk -v a="$g" -v c="$ceiling" 'BEGIN{print 100 * a / c}')"
done
