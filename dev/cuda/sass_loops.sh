#!/usr/bin/env bash
# The tensor-core loops of train_vla.cu's kernels as the GPU runs them: nvcc compiles train_vla.cu
# (bf16, sm_90 unless ARCH says otherwise) to a cubin, cuobjdump disassembles it, and
# dev/cuda/sass_loops.py lists each matching kernel's loops with their paths' instructions per
# iteration (per key or query tile for the attention kernels) and registers from ptxas. No GPU
# needed: it counts instructions and times nothing.
#
#   dev/cuda/sass_loops.sh [REGEX]    default: version 4's head-size-64 kernels (the smolvla preset's)
#
# cuobjdump and nvdisasm come from PATH or the CUDA toolkit's bin; where the toolkit lacks them (this
# project's CI image ships nvcc and ptxas only), from NVIDIA's PyPI wheels nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm, fetched once into build/cuda-tools with build/venv's pip (make setup).
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 2
REGEX=${1:-'kernel4ILi64E'}
ARCH=${ARCH:-sm_90}
TOOLS_VERSION=13.2.51
out=build/sass
mkdir -p "$out"

tool() {  # the path of cuobjdump or nvdisasm, fetched where missing
    local name=$1 wheel=nvidia-cuda-$1
    if command -v "$name" > /dev/null; then command -v "$name"; return; fi
    if [ -x "/usr/local/cuda/bin/$name" ]; then echo "/usr/local/cuda/bin/$name"; return; fi
    local found
    found=$(find build/cuda-tools -name "$name" -type f 2> /dev/null | head -n 1)
    if [ -z "$found" ]; then
        [ -x build/venv/bin/pip ] || { echo "sass_loops.sh: no $name and no build/venv to fetch it: run make setup" >&2; exit 2; }
        mkdir -p build/cuda-tools
        build/venv/bin/pip download --quiet --no-deps -d build/cuda-tools "$wheel==$TOOLS_VERSION" >&2 ||
            { echo "sass_loops.sh: could not fetch $wheel==$TOOLS_VERSION from PyPI: put $name on PATH" >&2; exit 2; }
        (cd build/cuda-tools && python3 -m zipfile -e "$(ls -1 ${wheel//-/_}-*.whl | head -n 1)" .)
        found=$(find build/cuda-tools -name "$name" -type f | head -n 1)
        chmod +x "$found"
    fi
    echo "$found"
}
cuobjdump=$(tool cuobjdump)
nvdisasm=$(tool nvdisasm)

nvcc -O3 -std=c++17 -arch="$ARCH" -cubin -Xptxas -v train_vla.cu -o "$out/train_vla.cubin" 2> "$out/ptxas.txt"
PATH="$(dirname "$nvdisasm"):$PATH" "$cuobjdump" -sass "$out/train_vla.cubin" > "$out/train_vla.sass"
echo "registers (ptxas, $ARCH):"
awk -v re="$REGEX" '/Compiling entry function/ { fn = $0; sub(/.*function ./, "", fn); sub(/. for .*/, "", fn) }
     /spill stores/ { match($0, /[0-9]+ bytes spill stores/); s = substr($0, RSTART, RLENGTH) }
     /Used [0-9]+ registers/ && fn ~ re { match($0, /Used [0-9]+ registers/); print "  " fn ": " substr($0, RSTART + 5, RLENGTH - 5) ", " s }' \
    "$out/ptxas.txt" | sort -u
python3 dev/cuda/sass_loops.py "$out/train_vla.sass" "$REGEX"
