#!/bin/bash
# One device call: bench/overhead/serve_external.py on the GPU machine (a qwen3-0.6b-shaped bf16
# model, random weights), results under $OUT as they come. Prepare on the CPU machine, from the
# project root: ../shared/device/wheels.sh --serving (.whl: textual, cupti-python, FastAPI,
# uvicorn, openai), then run there (carry .whl): BUDGET=360 bash bench/verify/gpu_serve_external.sh
set -uo pipefail
export HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/steps.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/pip.txt" 2>&1 || { say "pip failed"; cat "$OUT/pip.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > "$OUT/versions.txt" 2>&1
python3 -m transformers.cli.transformers serve --help > "$OUT/serve_help.txt" 2>&1
EXTRA=""
grep -q -- "--cb-max-batch-tokens" "$OUT/serve_help.txt" && EXTRA="--cb-max-batch-tokens 2048"
say "model directory"
python3 -m tuiprof.engine.model_dir /tmp/qwen3-0.6b-dir --model qwen3-0.6b --device cuda > "$OUT/model_dir.log" 2>&1 || { say "model dir failed"; tail -20 "$OUT/model_dir.log"; exit 1; }
say "serve_external (extra serve args: $EXTRA)"
timeout $(( ${BUDGET:-400} + 40 - ($(date +%s) - t0) )) python3 bench/overhead/serve_external.py \
  --model-dir /tmp/qwen3-0.6b-dir --device cuda --modes bare,headless,every,live \
  --rates 2,8 --requests 16,32 --rounds 10 --warmup 4 --prompt-words 96 --output-len 64 \
  --cb-num-blocks 128 --serve-args "$EXTRA" --budget $(( ${BUDGET:-400} - ($(date +%s) - t0) )) \
  --start-timeout 180 --work /tmp/serve_external --out "$OUT/serve_external" > "$OUT/serve_external.txt" 2>&1
say "status $?"
tail -30 "$OUT/serve_external.txt"
