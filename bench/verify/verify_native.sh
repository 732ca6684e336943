#!/usr/bin/env bash
# GPU verification of native programs (docs/native.md), one device call (~5 minutes on an H100):
# decode_like.cu built with nvcc, its steps found automatically and from NVTX, kernel times
# against nsys, the program's own timing alone vs under tuiprof, and the live app in tmux.
# Carry .whl (../shared/device/wheels.sh), .tmx (../shared/device/tmux.sh) and .dw
# (../shared/device/nsys.sh). From the repository root:
#
#   bash bench/verify/verify_native.sh [--repeat N] [--only …]   # extra options go to verify_native.py
#
# Seven files land in $OUT (the device tool returns at most 8): verify_native.json (every figure
# and check), verify_native.txt (this script's output: every check, the nsys tables, the CPU
# tests' whole output, a recap), steps.json (the snapshot of the auto-steps run) and
# steps_stdout.txt, nsys_kern_sum.csv, nsys_gpu_trace.csv (every kernel and copy nsys saw, for
# the idle time before each kernel), native_live.txt (the tmux captures, one after the other).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
T=""
if ls .tmx/*.deb >/dev/null 2>&1; then
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export TERM=xterm-256color
  T="env LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu /tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
fi
H=/opt/nvidia/nsight-compute/2025.3.1/host
NSYS=$H/target-linux-x64/nsys
Q=$H/linux-desktop-glibc_2_11_3-x64/QdstrmImporter
NS=()
if [ -x "$NSYS" ] && ls .dw/*.deb >/dev/null 2>&1; then
  for f in .dw/*.deb; do dpkg -x "$f" /tmp/dwroot; done
  NS=(--nsys "$NSYS" --importer "$Q" --dw-lib /tmp/dwroot/usr/lib/x86_64-linux-gnu)
fi
# the CPU tests of the native path run last, inside (this machine's compiler, CUPTI headers,
# cupti-python, libcupti and libcuda)
timeout 540 python3 bench/verify/verify_native.py --out "$OUT" --tmux "$T" "${NS[@]}" "$@" \
  2>&1 | tee "$OUT/verify_native.txt"
n=$(find "$OUT" -type f | wc -l)
echo "$n files in \$OUT: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
[ "$n" -le 8 ] || echo "MORE THAN 8 FILES in \$OUT: the device tool returns only 8"
