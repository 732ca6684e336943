#!/usr/bin/env bash
# GPU runs for issue 36 (a program's processes) on several GPUs, one device call each (each
# < 8 min; carry .whl from ../shared/device/wheels.sh and .tmx from ../shared/device/tmux.sh).
# From the repository root:
#
#   bash bench/verify/gpu_processes_multi.sh 2    # nvidia-h200-x2 (or -h100-x2): ~6 min
#       torchrun TP job of the project's own (tests/programs/tp_job.py: qwen3-0.6b, MLPs
#       sharded by hand, NCCL, init_process_group in the script) at 2 ranks under
#       `tuiprof run --headless -- torchrun ...`: per-rank kernels, NCCL share, skew; then the
#       live app over the same job in tmux at 200x50 and 80x24 (g, a).
#   bash bench/verify/gpu_processes_multi.sh 4    # nvidia-h100-x4 (or -h200-x4): ~8.5 min
#       the same at 4 ranks (one tmux size).
#   bash bench/verify/gpu_processes_multi.sh 4b   # the same machine: ~4.5 min on 4 x H100
#       what the built-in --tp left unrun: qwen3-0.6b at TP=4 eager and compiled with per-rank
#       overhead (bench/verify/verify_tp.py), then nanochat-d34 at TP=1 eager and compiled.
#   bash bench/verify/gpu_processes_multi.sh 4c   # the same machine: ~2.5 min on 4 x H100
#       nanochat-d34 at TP=4 eager and compiled with per-rank overhead.
#   bash bench/verify/gpu_processes_multi.sh 2w   # nvidia-h200-x2 (or -h100-x2): ~8 min
#       what a program's rank pays per process: bench/overhead/overhead_program_windows.py --tp
#       on 2 ranks (qwen3-0.6b eager, MLPs sharded as tp_job.py, one all-reduce a layer),
#       tuiprof / none windows in lockstep, CUPTI attached for the bursts only on every rank.
#
# verify_tp.py writes its JSON after every session, so a call cut at its limit keeps what ran.
#
# Read: $OUT/*.txt (tables and screens), $OUT/verify_tp*.json. Where the figures go:
# docs/gpu-verification.md (a new section: device, date, command, the tables) and the
# "Processes of a program" section of docs/multi-gpu.md (per-rank NCCL share and skew of the
# torchrun job at 2 and 4 ranks).
set -u
cd "$(dirname "$0")/../.."
. bench/verify/gpu_setup.sh
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/gpus.txt
JOB=(torchrun --standalone --nproc-per-node "${1:0:1}" tests/programs/tp_job.py --model qwen3-0.6b
     --device cuda)

torchrun_part() {  # N: the headless table, then the live app in tmux at the sizes given
  local n=$1; shift
  timeout 200 python bench/verify/verify_processes.py torchrun --nproc "$n" --device cuda \
    --model qwen3-0.6b --requests 4 --new-tokens 64 2>&1 | tee "$OUT/torchrun_$n.txt"
  for size in "$@"; do
    OUT=$OUT timeout 150 python bench/verify/tmux_capture.py --tmux "$T" --size "$size" \
      --name "live_torchrun${n}_$size" --steps "70:;0:g;4:;0:g;4:;0:a;6:;0:Escape;1:q;12:" \
      -- python -m tuiprof run --export-dir /tmp/live$n -- "${JOB[@]}" --seconds 100 \
      >/dev/null 2>&1
  done
  ls /tmp/live$n >> "$OUT/torchrun_$n.txt"
}

case "${1:-}" in
2)
  torchrun_part 2 200x50 80x24
  ;;
4)
  torchrun_part 4 200x50
  ;;
4b)
  mkdir -p "$OUT/q4" "$OUT/n1"
  OUT=$OUT/q4 timeout 390 python bench/verify/verify_tp.py --models qwen3-0.6b --tp 4 \
    --compiled qwen3-0.6b=4 --overhead-at qwen3-0.6b=4 --screenshots-at '' --eager-window 16 \
    2>&1 | tee "$OUT/verify_tp_qwen3_tp4.txt"
  OUT=$OUT/n1 timeout $((580 - SECONDS)) python bench/verify/verify_tp.py --models nanochat-d34 \
    --tp 1 --compiled nanochat-d34=1 --overhead-at '' --screenshots-at '' 2>&1 \
    | tee "$OUT/verify_tp_nanochat_tp1.txt"
  ;;
4c)
  mkdir -p "$OUT/n4"
  OUT=$OUT/n4 timeout 570 python bench/verify/verify_tp.py --models nanochat-d34 --tp 4 \
    --compiled nanochat-d34=4 --overhead-at nanochat-d34=4 --screenshots-at '' 2>&1 \
    | tee "$OUT/verify_tp_nanochat_tp4.txt"
  ;;
2w)
  timeout 560 torchrun --standalone --nproc-per-node 2 bench/overhead/overhead_program_windows.py \
    --tp --blocks 12 --deadline 420 2>&1 | tee "$OUT/program_windows_tp2.txt" | tail -8
  ;;
*)
  echo "usage: bash bench/verify/gpu_processes_multi.sh 2|2w|4|4b|4c"; exit 2
  ;;
esac
echo "outputs in $OUT"; ls -la "$OUT"
