#!/usr/bin/env bash
# The queue of device calls: GPU runs waiting for the H100 host, one case per device call
# (each under 10 minutes; carry .whl, and .tmx for the calls that use tmux). From the
# repository root:
#
#   bash bench/gpu_next.sh NAME
#
# Queued (the issues' open points, each named in the case): ranks-compiled, native-placement,
# gpu-tests. To queue a run, add a case below that runs the scripts of bench/README.md with a
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
  # issue 36, the trial of TUIPROF_RANK_GRAPHS=drop (tuiprof/engine/graphs.py) on a compiled
  # TP job (transformers' compiled decode, CUDA graphs with NCCL's all-reduces inside), on an
  # nvidia-h200-x2 or -h100-x2 call (~8 min):
  # 1. tp_job.py --compiled alone, then under `tuiprof run` at the live sampling with the
  #    trial on: the same tokens, every rank detached between its bursts, no fault or hang;
  # 2. what a rank then pays against no tuiprof (lockstep windows, compiled).
  # If both hold, the trial can become the default (docs/programs.md says what changes).
  J=(torchrun --standalone --nproc-per-node 2 "$PWD/tests/programs/tp_job.py" --model qwen3-0.6b
     --device cuda --compiled --requests 24 --new-tokens 256)
  mkdir -p /tmp/rc && cd /tmp/rc
  timeout 120 "${J[@]}" >"$OUT/tp_compiled_alone.txt" 2>&1; echo "alone: exit $?"
  TUIPROF_RANK_GRAPHS=drop timeout 170 python -m tuiprof run --headless --sample-every live \
    --json /tmp/rc/tpc.json -- "${J[@]}" >"$OUT/tp_compiled_tuiprof.txt" 2>&1
  echo "under tuiprof: exit $?"
  cd - >/dev/null
  diff <(grep -h "^rank 0 of" "$OUT/tp_compiled_alone.txt") \
       <(grep -h "^rank 0 of" /tmp/rc/*.log "$OUT/tp_compiled_tuiprof.txt" | sort -u | sort -t' ' -k6n) \
    >/dev/null && echo "tokens: equal over $(grep -c "^rank 0 of" "$OUT/tp_compiled_alone.txt") requests" \
    || echo "tokens: DIFFER"
  python - <<'PY' 2>&1 | tee "$OUT/tp_compiled_ranks.txt"
from tuiprof.export.snapshot import read_any_snapshot
snap = read_any_snapshot("/tmp/rc/tpc.json")
for v in getattr(snap, "views", [snap]):
    if v.meta.get("rank") is None:
        continue
    kept = [e[3] for e in v.events if "stays attached" in str(e[3])]
    print(f"rank {v.meta.get('rank')}: detached {(v.overhead or {}).get('detaches')} times; "
          f"{((v.collectors or {}).get('cupti') or {}).get('message')}; {kept or 'no stay'}")
PY
  TUIPROF_RANK_GRAPHS=drop timeout 250 torchrun --standalone --nproc-per-node 2 \
    bench/overhead/overhead_program_windows.py --tp --mode compiled --blocks 6 --deadline 190 \
    2>&1 | tee "$OUT/ranks_windows_compiled_drop.txt" | tail -5 ;;
native-placement)
  # issue 41: does where the program's buffers land change a kernel's own speed? decode_like
  # alone, 3 runs at each --pad-mb (device memory taken first, as a tool's would be); each
  # decode kernel's own %globaltimer median. argmax_token read 7,840 ns alone, 6,880 under
  # tuiprof and 6,976 under nsys: if the pads move it as much, placement is the cause (~1 min,
  # one GPU)
  nvcc -O2 -arch=sm_90 -o /tmp/decode_like tests/gpu/native/decode_like.cu || exit 1
  for r in 1 2 3; do for pad in 0 1 2 8 64 512; do
    timeout 30 /tmp/decode_like 512 --pad-mb $pad | python -c "
import json, sys
for line in sys.stdin:
    if line.startswith('decode_like: {'):
        k = json.loads(line.split(': ', 1)[1])['in_kernel']
        print('pad $pad MiB run $r:', ' '.join(f'{n[:-3]} {v}' for n, v in sorted(k.items())))"
  done; done | tee "$OUT/native_placement.txt" ;;
gpu-tests)
  # the whole GPU test suite (about 5 minutes on the H100)
  OUT=$OUT timeout 560 bash tests/gpu/run_all.sh >"$OUT/gpu_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.txt" | tail -20 | cut -c1-300 ;;
test-data)
  # the test suite's recordings (tests/data/README.md)
  bash tests/data/record.sh "$OUT" 2>&1 | tail -4 ;;
*)
  echo "usage: bash bench/gpu_next.sh ranks-compiled|native-placement|gpu-tests|test-data"; exit 2 ;;
esac
