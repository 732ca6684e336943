#!/usr/bin/env bash
# The queue of device calls: GPU runs waiting for the H100 host, one case per device call
# (each under 10 minutes; carry .whl, and .tmx for the calls that use tmux). From the
# repository root:
#
#   bash bench/gpu_next.sh NAME
#
# Queued (the issues' open points, each named in the case): llamacpp-sampled-server
# (llamacpp-idle-cost ran on 2026-11-29, docs/history §54; bench/llamacpp/device.sh --only idle
# runs it again). Also here:
# gpu-tests (the whole GPU suite) and test-data (the suite's recordings). To queue a run, add a case below that runs the scripts of bench/README.md with a
# timeout each, writes at most 8 files to $OUT (what the device tool brings back) and prints a
# short table; once it has run, record its figures in docs/results.md (and the run in
# docs/history/) and delete the case. The calls that produced today's figures are named in
# docs/results.md; the earlier queue is in git (docs/history/README.md says where).
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export OUT=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { tail -"$1" "$2"; echo; }
app_capture() {  # NAME SIZE STEPS SECONDS EXPORT_DIR: the app on qwen3-0.6b in tmux ($T)
  OUT=$OUT timeout "$4" python bench/verify/tmux_capture.py --tmux "$T" --size "$2" --name "$1" \
    --steps "$3" -- python -m tuiprof --model qwen3-0.6b --export-dir "$5" >/dev/null 2>&1
}
tmx() {  # tmux from the carried .tmx packages, as $T
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
}

case "${1:-}" in
gpu-tests)
  # the whole GPU test suite (about 5 minutes on the H100)
  OUT=$OUT timeout 560 bash tests/gpu/run_all.sh >"$OUT/gpu_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -20 | cut -c1-300 ;;
test-data)
  # the test suite's recordings (tests/data/README.md)
  bash tests/data/record.sh "$OUT" 2>&1 | tail -4 ;;
llamacpp-sampled-server)
  # issue 54's open points after docs/history §54: llama-server under the sampled default with
  # the burst rules by shape (nothing by correlation id): every kernel's time right after several
  # bursts, how many records each rule dropped (meta: burst_straddled, burst_overlapping), and
  # whether a step per launch can be cut from a burst (one correlation id for a burst's launches
  # in §54); then the live app in tmux. Carry .llama, .whl, .tmx; a build takes 237-328 s.
  LLAMA_ASSETS=.llama LLAMA_TARGETS="llama-bench llama-server llama-quantize" LLAMA_QUANTS=" " \
    OUT=$OUT timeout 560 bash bench/llamacpp/device.sh --only sampled,live --deadline 500 \
    >/dev/null 2>&1
  tail -c 3000 "$OUT/sampled_summary.json"; tail -30 "$OUT/measure.txt" | cut -c1-300 ;;
house-after)
  # after the house was rebuilt (ran 2026-11-29: docs/results.md#gpu-tests; kept to run again
  # after the next move): the whole GPU suite (16 passed before it, 287-385 s on the H100; collection and
  # programs 10 passed in 236 s on the H200 at 8ff7649), then the live app on qwen3-0.6b in
  # tmux at 200x50 and 80x24, the kernels pane's keys (now the pane's own), detail, help,
  # pause, quit
  OUT=$OUT timeout 400 bash tests/gpu/run_all.sh >"$OUT/gpu_tests_after_house.txt" 2>&1
  grep -E "passed|failed" "$OUT/gpu_tests_after_house.txt" | tail -3 | cut -c1-300
  tmx
  keys="40:;0:p;3:p;3:s;3:i;3:m;3:enter;3:Escape;2:?;3:Escape;2:space;4:space;4:q"  # tmux sends key names, or the letters
  app_capture house_200x50 200x50 "$keys" 130 /tmp/exp200
  app_capture house_80x24 80x24 "$keys" 130 /tmp/exp80
  ls "$OUT" ;;
*)
  echo "usage: bash bench/gpu_next.sh gpu-tests|house-after|test-data|llamacpp-sampled-server"; exit 2 ;;
esac
