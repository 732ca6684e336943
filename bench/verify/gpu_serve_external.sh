#!/bin/bash
# One device call: bench/overhead/serve_external.py on the GPU machine (a qwen3-0.6b-shaped bf16
# model, random weights): bare, the live app in tmux, headless default, a detached session left
# on, and every step traced (its first EVERY_ROUNDS rounds only: its cost stands out of the
# spread in fewer), 5 interleaved rounds at two rates (a quarter of the bare server's measured
# capacity and 0.8 of it), the servers started once and kept (KEEP=0: fresh servers every
# round), results under $OUT as each cell ends, everything inside TOTAL seconds (default 480:
# a machine's start and its idle time count toward a session's device time too).
#
# Prepare on the CPU machine, from the project root: ../shared/device/wheels.sh --serving (.whl)
# and ../shared/device/tmux.sh (.tmx); carry both. Run there: bash bench/verify/gpu_serve_external.sh
# A dry run of the whole call on the CPU (no wheels, no GPU, the tiny model, the system tmux):
#   OUT=/tmp/dry DEVICE=cpu MODEL=qwen3-tiny TOTAL=480 bash bench/verify/gpu_serve_external.sh
set -uo pipefail
export HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-qwen3-0.6b}
TOTAL=${TOTAL:-480}
t0=$(date +%s)
C=$OUT/call.txt
say() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$C"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /tmp/pip.txt 2>&1 || { say "pip failed"; tail -20 /tmp/pip.txt >> "$C"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
TMUX_CMD=""
if [ -d .tmx ]; then
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  TMUX_CMD="env LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu /tmp/tmxroot/usr/bin/tmux -S /tmp/se-tmux.sock"
elif command -v tmux > /dev/null; then
  TMUX_CMD="tmux -S /tmp/se-tmux.sock"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1
  echo "tmux: ${TMUX_CMD:-none (a pseudo-terminal instead)}"; } >> "$C"
python3 -m transformers.cli.transformers serve --help > /tmp/serve_help.txt 2>&1
EXTRA=""
grep -q -- "--cb-max-batch-tokens" /tmp/serve_help.txt && EXTRA="--cb-max-batch-tokens 2048"
say "model directory"
rm -rf /tmp/se-model /tmp/se-work
python3 -m tuiprof.engine.model_dir /tmp/se-model --model "$MODEL" --device "$DEVICE" > /tmp/model_dir.log 2>&1 \
  || { say "model dir failed"; tail -20 /tmp/model_dir.log >> "$C"; exit 1; }
left=$(( TOTAL - ($(date +%s) - t0) - 15 ))
say "serve_external: ${left} s left (extra serve args: $EXTRA)"
NVML=""; [ "$DEVICE" = cpu ] && NVML="--no-nvml"
KEEP_ARG="--keep-servers"; [ "${KEEP:-1}" = 0 ] && KEEP_ARG=""
timeout -k 40 $(( left + 10 )) python3 bench/overhead/serve_external.py \
  --model-dir /tmp/se-model --device "$DEVICE" --modes bare,live,headless,leave,every \
  --rates auto:0.25,0.8 --probe ${PROBE:-32} --requests ${REQUESTS:-10,28} --rounds 5 --warmup 3 \
  $KEEP_ARG --every-rounds ${EVERY_ROUNDS:-1} \
  --prompt-words ${PROMPT_WORDS:-96} --output-len ${OUTPUT_LEN:-24} --cb-num-blocks 128 $NVML \
  --serve-args "$EXTRA" --tmux "$TMUX_CMD" --deadline "$left" --start-timeout 150 --stop-grace 20 \
  --work /tmp/se-work --out "$OUT/se" > "$OUT/serve_external.txt" 2>&1
say "status $?"
[ -n "$TMUX_CMD" ] && $TMUX_CMD kill-server 2>/dev/null
