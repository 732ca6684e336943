#!/usr/bin/env bash
# GPU verification, one part per device call. Usage: bash bench/verify/gpu_verify.sh a|b|c
# Prints short tables; full logs and artefacts go to $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
part=${1:-a}
log() { echo; echo "=== $* ($(date +%H:%M:%S))"; }
if [ "$part" = a ]; then
  log "headless qwen3-0.6b eager, 256 decode tokens"
  timeout 240 python3 -m tuiprof --model qwen3-0.6b --headless --sample-every 1 --max-new-tokens 257 --ring-tokens 16 --json $OUT/eager.json 2>&1 | tail -8
  log "headless qwen3-0.6b compiled, 256 decode tokens"
  timeout 300 python3 -m tuiprof --model qwen3-0.6b --headless --sample-every 1 --mode compiled --max-new-tokens 257 --ring-tokens 16 --json $OUT/compiled.json 2>&1 | tail -8
  log "findings and roofline"
  timeout 120 python3 bench/verify/findings_table.py $OUT/eager.json $OUT/compiled.json 2>&1 | tail -60
  log "record 64 tokens and check nsys stats on the SQLite export"
  timeout 200 python3 -m tuiprof record --model qwen3-0.6b --max-new-tokens 65 --record $OUT/qwen3_eager_rec.json.gz --json /tmp/rec.json 2>&1 | tail -3
  timeout 200 python3 -m tuiprof.export.check_nsys --nsys $NSYS --recording $OUT/qwen3_eager_rec.json.gz --out /tmp/chk 2>&1 | tail -40
fi
if [ "$part" = b ]; then
  log "collection overhead (interleaved windows)"
  timeout 560 python3 bench/overhead/overhead.py --blocks 8 --peer 2>&1 | tail -30
fi
if [ "$part" = c ]; then
  log "engine overhead vs bare static-cache loops"
  timeout 300 python3 bench/overhead/engine_overhead.py --rounds 5 2>&1 | tail -14
  log "live UI on the GPU"
  timeout 300 python3 bench/verify/ui_gpu.py $OUT 2>&1 | tail -14
  log "nsys stats on a real session's SQLite"
  timeout 120 python3 -m tuiprof record --model qwen3-0.6b --max-new-tokens 33 --record /tmp/rec.json.gz --json /tmp/rec.json 2>&1 | tail -2
  timeout 120 python3 -m tuiprof.export.check_nsys --nsys $NSYS --recording /tmp/rec.json.gz --out /tmp/chk 2>&1 | tail -30
fi
if [ "$part" = d ]; then
  log "GPU tests"
  timeout 400 python3 -m pytest -q -s tests/gpu 2>&1 | tail -30
fi
if [ "$part" = e ]; then
  log "collection overhead (interleaved windows), tuiprof configurations"
  timeout 330 python3 bench/overhead/overhead.py --blocks 6 2>&1 | tail -16
  log "live UI on the GPU"
  timeout 250 python3 bench/verify/ui_gpu.py $OUT 2>&1 | tail -10
fi
if [ "$part" = f ]; then
  log "GPU tests (engine, collection)"
  timeout 400 python3 -m pytest -q -s -p no:cacheprovider -p no:logging tests/gpu > $OUT/tests_gpu.txt 2>&1
  grep -E "passed|failed|FAILED|^E  |tokens/s|ns/launch|kernels per sampled|burst-sampled|ours:|theirs:" $OUT/tests_gpu.txt | head -60
  log "study workloads: nanochat-d34 and deepseek-ocr-decoder decode"
  for m in nanochat-d34 deepseek-ocr-decoder; do
    timeout 120 python3 -m tuiprof --model $m --headless --sample-every 1 --max-new-tokens 33 --ring-tokens 8 --json $OUT/$m.json 2>&1 | tail -2
  done
  timeout 60 python3 bench/verify/findings_table.py $OUT/nanochat-d34.json $OUT/deepseek-ocr-decoder.json 2>&1 | grep -v "^|---" | head -60
  log "collection overhead, compiled, tuiprof defaults"
  timeout 200 python3 bench/overhead/overhead.py --blocks 4 --modes compiled 2>&1 | tail -8
fi
