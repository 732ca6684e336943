#!/usr/bin/env bash
# The GPU runs still owed for issues 14, 15, 17 and 18, one device call each (each < 10 min on
# the H100 host; carry .whl, and .tmx .old for call 3). From the repository root:
#
#   bash bench/gpu_next.sh 1   # 15: kernels per step engine vs generate() (counts, time, which
#                              #     kernels differ), the NVTX loop's kernels by name, overhead
#                              #     of `tuiprof run` eager and compiled (+ the old API policy)
#   bash bench/gpu_next.sh 2   # 14: batch-32 overhead, compiled 3 blocks and eager 8 blocks
#   bash bench/gpu_next.sh 3   # GPU test of a program's compiled bursts; 18: the app's first
#                              #     step on screen (old vs new) and `c` beside decoding in tmux
#   bash bench/gpu_next.sh 4   # 17: compiled whole processes, none vs default, warm compile cache
#   bash bench/gpu_next.sh 5   # 17: eager whole processes with the app open (none, default, app)
#
# Each prints a short table; at most 8 files go to $OUT (what the device tool brings back).
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { tail -"$1" "$2"; echo; }

case "${1:-}" in
1)
  timeout 210 python bench/verify_program.py --no-overhead --no-screens >"$OUT/p1.txt" 2>&1
  show 45 "$OUT/p1.txt"
  timeout 150 python bench/overhead_program.py --mode eager --rounds 6 --deadline 100 \
    --json "$OUT/ovp_eager.json" >"$OUT/ovp_eager.txt" 2>&1
  show 8 "$OUT/ovp_eager.txt"
  timeout 225 python bench/overhead_program.py --mode compiled --new-tokens 65 --rounds 4 \
    --deadline 150 --configs alone,tuiprof,api-stay-on --json "$OUT/ovp_comp.json" \
    >"$OUT/ovp_comp.txt" 2>&1
  show 20 "$OUT/ovp_comp.txt" ;;
2)
  timeout 400 python bench/overhead.py --batch 32 --modes compiled --blocks 3 \
    --json "$OUT/b32_compiled.json" >"$OUT/b32_compiled.txt" 2>&1
  show 12 "$OUT/b32_compiled.txt"
  timeout 170 python bench/overhead.py --batch 32 --modes eager --blocks 8 \
    --json "$OUT/b32_eager.json" >"$OUT/b32_eager.txt" 2>&1
  show 16 "$OUT/b32_eager.txt" ;;
3)
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_program_gpu.py \
    >"$OUT/gpu_program_test.txt" 2>&1
  show 15 "$OUT/gpu_program_test.txt"
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
  timeout 150 python bench/tmux_capture.py --tmux "$T" --size 200x50 --name compile_beside \
    --steps "30:;0:c;10:;10:;10:;10:;10:;10:;3:q" -- python -m tuiprof --model qwen3-0.6b \
    >/dev/null 2>&1
  grep -E "^(=|.*steps [0-9])" "$OUT/compile_beside.txt" | head -30
  timeout 200 python bench/verify_startup.py --tree .old --tmux "$T" --parts app \
    >"$OUT/startup.txt" 2>&1
  show 20 "$OUT/startup.txt" ;;
4)
  timeout 580 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,default --deadline 470 --json "$OUT/procs_compiled.json" \
    >"$OUT/procs_compiled.txt" 2>&1
  show 24 "$OUT/procs_compiled.txt" ;;
5)
  timeout 580 python bench/overhead_procs.py --mode eager --rounds 8 --tokens 128 \
    --configs none,default,app --deadline 480 --json "$OUT/procs_app.json" \
    >"$OUT/procs_app.txt" 2>&1
  show 36 "$OUT/procs_app.txt" ;;
*)
  echo "usage: bash bench/gpu_next.sh 1|2|3|4|5 (see the head of this file)"; exit 2 ;;
esac
