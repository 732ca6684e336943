# Sourced by the GPU scripts (bench/verify/gpu_processes_*.sh): the carried wheels and tmux, the
# environment every process there needs, and $OUT. From the repository root.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 HF_HUB_OFFLINE=1
export TUIPROF_RUNTIME_DIR=/tmp/tuiprof-rt
mkdir -p -m 700 $TUIPROF_RUNTIME_DIR
OUT=${OUT:-$(mktemp -d)}
for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
