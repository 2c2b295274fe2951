#!/usr/bin/env bash
# A block of a kernel gets at most 65536 registers on NVIDIA GPUs: a kernel that ptxas gives more
# than 64 registers per thread cannot launch at 1024 threads ("too many resources requested for
# launch"), a failure no CPU emulation shows. This check reads ptxas's register counts of every
# kernel of train_vla.cu and the kernel library it includes (vla/cuda/*.cuh) (nvcc --resource-usage, each
# precision) and asks that each kernel over 64 registers be declared with __launch_bounds__(N), N
# threads fitting its registers: the compiler then holds to N, and a launch over N fails plainly
# (the launchers keep to N; dev/cuda's benchmarks skip larger blocks).
#
#   dev/cuda/check_registers.sh LOG...      LOG: nvcc --resource-usage output of train_vla.cu
#   (make test makes build/gpu/registers_<precision>.txt and runs this on them)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
[ $# -gt 0 ] || { echo "usage: dev/cuda/check_registers.sh LOG... (nvcc --resource-usage output of train_vla.cu)"; exit 2; }
SRC=${SRC:-train_vla.cu}  # the source whose kernels the logs list, with the headers it includes
SOURCES=("$SRC" vla/cuda/*.cuh)
passed=0
failed=0
check() {  # check OK MESSAGE
    if [ "$1" -eq 1 ]; then passed=$((passed + 1)); echo "ok    $2"; else failed=$((failed + 1)); echo "FAIL  $2"; fi
}

# the value of a __launch_bounds__ argument: a number, or a #define of the sources
bound_value() {
    if [[ "$1" =~ ^[0-9]+$ ]]; then echo "$1"; return; fi
    sed -n "s/^#define $1 \([0-9][0-9]*\).*/\1/p" "${SOURCES[@]}" | head -n 1
}

for log in "$@"; do
    [ -s "$log" ] || { check 0 "$log: missing or empty (nvcc --resource-usage of $SRC)"; continue; }
    # kernel (demangled, template arguments and parameters dropped) and its registers, one per line
    pairs=$(awk '/Compiling entry function/ { fn = $0; sub(/.*function ./, "", fn); sub(/. for .*/, "", fn) }
                 /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); print fn, substr($0, RSTART + 5, RLENGTH - 5) }' "$log" |
            while read -r mangled regs; do
                name=$(echo "$mangled" | c++filt | sed 's/(.*//; s/<.*//; s/^void //')
                echo "$name $regs"
            done | sort -u)
    n_kernels=$(echo "$pairs" | grep -c .)
    ok=0; [ "$n_kernels" -ge 20 ] && ok=1
    check "$ok" "$log: register counts of $n_kernels kernels"
    over=0
    while read -r name regs; do
        if [ -z "$name" ] || [ "$regs" -le 64 ]; then continue; fi
        over=$((over + 1))
        # the kernel's definition: __global__ void __launch_bounds__(N) name( or (N, min blocks)
        arg=$(grep -o "__global__ void __launch_bounds__([A-Za-z0-9_]*\(, [^)]*\)\?) $name(" "${SOURCES[@]}" | head -n 1 |
              sed 's/.*__launch_bounds__(\([A-Za-z0-9_]*\).*/\1/')
        if [ -z "$arg" ]; then
            check 0 "$log: $name uses $regs registers per thread, so a block of 1024 threads cannot launch: declare it with __launch_bounds__(N), N * $regs <= 65536, and launch at most N threads"
            continue
        fi
        n=$(bound_value "$arg")
        # registers are allocated per warp in units of 256, so per thread in steps of 8
        per_thread=$(( (regs + 7) / 8 * 8 ))
        ok=0; [ -n "$n" ] && [ $((n * per_thread)) -le 65536 ] && ok=1
        check "$ok" \
            "$log: $name: $regs registers per thread, __launch_bounds__($arg = ${n:-?}) threads: ${n:-?} x $per_thread <= 65536"
    done <<< "$pairs"
    echo "($log: $over kernels over 64 registers)"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
