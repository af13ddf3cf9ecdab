#!/usr/bin/env bash
# Fill .gpu-wheels/ (git-ignored) with the wheels of .ci/gpu_wheels.txt for the GPU machine's Python, here where
# pip reaches the package index; .ci/gpu_check.sh installs them there, where nothing can be fetched.
#   bash .ci/gpu_wheels.sh                      # for the GPU image's Python (3.12)
#   GPU_WHEELS_PYTHON=3.11 GPU_WHEELS_DIR=/tmp/w bash .ci/gpu_wheels.sh   # another Python (the CPU dry run)
# Then, on the device: run "bash .ci/gpu_check.sh" with carry [".gpu-wheels"].
set -euo pipefail
cd "$(dirname "$0")/.."

PYVER="${GPU_WHEELS_PYTHON:-3.12}"   # the GPU image's python3 is 3.12.3 (device KINDS.md, read 2026-11)
DIR="${GPU_WHEELS_DIR:-.gpu-wheels}"
MAX_MIB=24                          # the working tree (~37 MiB) and the wheels must stay under the 64 MiB a run sends
LIST=.ci/gpu_wheels.txt
PIP="${PIP:-python3 -m pip}"

echo "gpu_wheels: wheels of $LIST for CPython $PYVER, manylinux x86_64, into $DIR"
rm -rf "$DIR"
mkdir -p "$DIR"
# --no-deps: exactly the listed wheels (the list is the closure, minus what the image has; tests/test_gpu_check.py)
$PIP download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 -d "$DIR" -r "$LIST" 2> >(grep -v "is ignored: it is neither a file nor" >&2)

listed=$(grep -cE '^[A-Za-z0-9]' "$LIST")
got=$(find "$DIR" -name '*.whl' | wc -l)
if [ "$got" -ne "$listed" ]; then
    echo "gpu_wheels: FAILED: $listed wheels listed, $got downloaded" >&2
    exit 1
fi
echo "$PYVER" > "$DIR/PYTHON_VERSION"   # gpu_check.sh refuses to install them into another Python
bytes=$(find "$DIR" -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "gpu_wheels: $got wheels, $mib MiB (limit $MAX_MIB MiB)"
if awk -v b="$bytes" -v m="$MAX_MIB" 'BEGIN {exit !(b > m * 1048576)}'; then
    echo "gpu_wheels: FAILED: $mib MiB is over $MAX_MIB MiB; the run would not travel" >&2
    exit 1
fi
