#!/usr/bin/env bash
# The queue of device calls: GPU runs waiting for the H100 host, one case per device call
# (each under 10 minutes; carry .whl, and .tmx for the calls that use tmux). From the
# repository root:
#
#   bash bench/gpu_next.sh NAME
#
# Queued (the issues' open points, each named in the case): ranks-compiled,
# native-cupti-buffers. Also here: gpu-tests (the whole GPU suite) and test-data (the suite's
# recordings). To queue a run, add a case below that runs the scripts of bench/README.md with a
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
ranks-compiled)
  # issue 36, more of what a compiled TP job's rank pays now that ranks drop their graphs by
  # default (tuiprof/engine/graphs.py): the last call's limit cut the windows at 3 blocks
  # (1.011, 0.994, 1.008). An nvidia-h200-x2 or -h100-x2 call (~9 min); the inductor cache is
  # cold on a fresh machine, so the first block starts after ~90 s
  timeout 560 torchrun --standalone --nproc-per-node 2 \
    bench/overhead/overhead_program_windows.py --tp --mode compiled --blocks 10 --deadline 480 \
    2>&1 | tee "$OUT/ranks_windows_compiled.txt" | grep -E "block|ratio" | tail -14 ;;
native-cupti-buffers)
  # issue 41: is CUPTI's device buffer what moves a native kernel's own speed under each tool?
  # (since CUDA 12.0u1 CUPTI reserves its record buffers in device memory, before the
  # program's; decode_like's argmax_token runs 6,816-8,128 ns alone depending on where its
  # buffers land). decode_like's own clocks alone, under tuiprof with CUPTI's defaults and with
  # each knob of tuiprof/native/inject.c, and under nsys; 2 runs each, one H100 (~3 min, carry
  # .whl and .dw). If a knob gives tuiprof nsys's own clocks, the plain means can be compared
  # under the same placement (verify_native.sh with that knob set).
  nvcc -O2 -arch=sm_90 -o /tmp/decode_like tests/gpu/native/decode_like.cu || exit 1
  H=/opt/nvidia/nsight-compute/2025.3.1/host; NSYS=$H/target-linux-x64/nsys
  own() { python -c "
import json, sys
for line in sys.stdin:
    if line.startswith('decode_like: {'):
        k = json.loads(line.split(': ', 1)[1])['in_kernel']
        print('$1:', ' '.join(f'{n[:-3]} {v}' for n, v in sorted(k.items()) if n[:-3] in ('argmax_token', 'attn_decode', 'embed', 'rmsnorm')))"; }
  for r in 1 2; do
    timeout 30 /tmp/decode_like 512 | own "alone"
    for knob in "" TUIPROF_CUPTI_HOST_PINNED=1 "TUIPROF_CUPTI_DEVICE_BUFFER_MB=1 TUIPROF_CUPTI_DEVICE_BUFFERS=1" \
        TUIPROF_CUPTI_DEVICE_BUFFER_MB=8 TUIPROF_CUPTI_DEVICE_BUFFER_MB=32; do
      env $knob timeout 90 python -m tuiprof run --headless --json /tmp/nb.json -- /tmp/decode_like 512 \
        >/tmp/nb.txt 2>&1
      python -c "import json; [print(x) for x in json.load(open('/tmp/nb.json'))['output']]" \
        | own "tuiprof ${knob:-defaults}"
    done
    [ -x "$NSYS" ] && timeout 120 "$NSYS" profile -o /tmp/nb_nsys --force-overwrite true --trace cuda \
      /tmp/decode_like 512 2>/dev/null | own "nsys"
  done | tee "$OUT/native_cupti_buffers.txt" ;;
gpu-tests)
  # the whole GPU test suite (about 5 minutes on the H100)
  OUT=$OUT timeout 560 bash tests/gpu/run_all.sh >"$OUT/gpu_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -20 | cut -c1-300 ;;
test-data)
  # the test suite's recordings (tests/data/README.md)
  bash tests/data/record.sh "$OUT" 2>&1 | tail -4 ;;
*)
  echo "usage: bash bench/gpu_next.sh ranks-compiled|native-cupti-buffers|gpu-tests|test-data"; exit 2 ;;
esac
