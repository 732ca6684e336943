#!/usr/bin/env bash
# GPU check of the tensor-parallel wait/transfer split on 4 GPUs (bench/verify/verify_tp_wait.py says
# what and why). From the repository root of a checkout that carries .whl (../shared/device/
# wheels.sh) and .tmx (../shared/device/tmux.sh):
#     OUT=/path bash bench/verify/verify_tp_wait.sh          # about 6 minutes, at most 8
# $OUT receives tp_wait.txt (the table, the checks, each run's summary), tp_wait.json and
# tp_wait_live.txt (the live app in tmux: the all-ranks view, the kernels pane).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD
OUT=${OUT:-$(mktemp -d)}
export OUT
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
T=""
if ls .tmx/*.deb >/dev/null 2>&1; then
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
fi
nvidia-smi --query-gpu=index,name --format=csv,noheader
timeout 450 python3 bench/verify/verify_tp_wait.py --tmux "$T" --budget 420 "$@"
