#!/bin/bash
# Serving on the H100, for docs/serving.md, in three calls (see below), results in $OUT:
#   1. a qwen3-0.6b-shaped model directory (random bf16 weights, tokenizer trained here);
#   2. transformers serve --continuous-batching --device cuda under tuiprof run, driven by
#      NVIDIA aiperf at 3 request rates: tuiprof's TTFT/ITL/e2e beside aiperf's, per request
#      (bench/verify/serve_vs_client.py);
#   3. a tuiprof serve rate sweep with an SLO (tuiprof sweep --serve);
#   4. the live app in tmux with the requests pane (80x24 and 200x50 captures);
#   5. the overhead target: throughput with and without tuiprof, whole processes,
#      interleaved (bench/overhead/serve_overhead.py).
# Prepare on the CPU machine, from the project root:
#     ../shared/device/wheels.sh --serving     # .whl: textual, cupti-python, FastAPI, uvicorn, openai
#     bench/client_wheels.sh                   # .aiperf-whl: aiperf and what its profile imports
#     ../shared/device/tmux.sh                 # .tmx: tmux
# Run on the device (carry .whl, .aiperf-whl and .tmx), in three calls:
#     STEPS="1 2 3" bash bench/verify/gpu_serving.sh  # about 6 minutes
#     STEPS="1 4" bash bench/verify/gpu_serving.sh    # about 2 minutes
#     STEPS="1 5" bash bench/verify/gpu_serving.sh    # about 9.5 minutes: 7-8 interleaved rounds
set -uo pipefail
OUT=${OUT:-out/gpu_serving}
STEPS=${STEPS:-"1 2 3 4 5"}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/aiperf-site .aiperf-whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
MODEL=/tmp/qwen3-0.6b-dir
has() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/steps.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

if has 1 || [ ! -d "$MODEL" ]; then
  say "1. model directory"
  python3 -m tuiprof.engine.model_dir "$MODEL" --model qwen3-0.6b --device cuda > "$OUT/model_dir.log" 2>&1 || { cat "$OUT/model_dir.log"; exit 1; }
fi
if has 2; then
  say "2. transformers serve under tuiprof, aiperf at 4, 16, 64 req/s"
  timeout 180 python3 bench/verify/serve_vs_client.py --aiperf "python3 -m aiperf" \
      --aiperf-pythonpath /tmp/aiperf-site --model-dir "$MODEL" --device cuda \
      --rates 4,16,64 --requests 96 --warmup 4 --prompt-len 128 --output-len 64 \
      --tuiprof-args=--no-nvml --out "$OUT/serve_vs_aiperf" > "$OUT/serve_vs_aiperf.txt" 2>&1
  say "   status $? (compare: $OUT/serve_vs_aiperf/compare.md)"
  # the request ranges through the real nsys stats
  python3 -m tuiprof export "$OUT/serve_vs_aiperf/tuiprof.json" --sqlite "$OUT/requests.sqlite" \
      --trace "$OUT/requests-trace.json" > "$OUT/export.txt" 2>&1
  NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
  [ -x "$NSYS" ] && timeout 60 "$NSYS" stats -q -r nvtx_sum -f csv -o "$OUT/nvtx" "$OUT/requests.sqlite" \
      > "$OUT/nsys_stats.txt" 2>&1
fi
if has 3; then
  say "3. tuiprof serve rate sweep"
  timeout 130 python3 -m tuiprof sweep --serve --models "$MODEL" --device cuda \
      --rates 8,32,128 --requests 64 --serve-prompt-len 128 --output-len 64 \
      --slo-ttft-ms 100 --slo-itl-ms 30 --out "$OUT/sweep" > "$OUT/sweep.txt" 2>&1
  say "   status $? ($OUT/sweep/serve-sweep.md)"
fi
if has 4; then
  say "4. the live app in tmux"
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
  $T new-session -d -s s1 -x 200 -y 50 "cd $PWD && PYTHONPATH=$PYTHONPATH python3 -m tuiprof serve --model $MODEL --device cuda --rate 16 --duration 40 --prompt-len 128 --output-len 64 --export-dir $OUT"
  sleep 30
  $T capture-pane -p -t s1 > "$OUT/screen-200x50-grid.txt"
  $T send-keys -t s1 Tab; $T send-keys -t s1 7; sleep 1
  $T send-keys -t s1 Enter; sleep 2
  $T capture-pane -p -t s1 > "$OUT/screen-200x50-request.txt"
  $T send-keys -t s1 Escape; sleep 1
  $T resize-window -t s1 -x 80 -y 24; sleep 2
  $T send-keys -t s1 7; sleep 2
  $T capture-pane -p -t s1 > "$OUT/screen-80x24-requests.txt"
  $T send-keys -t s1 1; sleep 2
  $T capture-pane -p -t s1 > "$OUT/screen-80x24-latency.txt"
  $T send-keys -t s1 q; sleep 8
  $T kill-session -t s1 2>/dev/null
  say "   captures: $OUT/screen-*.txt"
fi
if has 5; then
  say "5. throughput with and without tuiprof"
  # whole processes of this load differ by ±15-20 % on the H100 host: rounds, not length
  timeout 560 python3 bench/overhead/serve_overhead.py --model "$MODEL" --device cuda --concurrency 32 \
      --requests 128 --prompt-len 128 --output-len 64 --rounds 10 --deadline 480 \
      --out "$OUT/overhead" > "$OUT/overhead.txt" 2>&1
  say "   status $? ($OUT/overhead.txt)"
fi
say "done"
