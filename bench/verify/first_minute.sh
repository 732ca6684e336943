#!/usr/bin/env bash
# GPU runs for issue 42 (the first minute), one device call each (each < 9 min on the H100;
# carry .whl and .tmx: ../shared/device/wheels.sh and ../shared/device/tmux.sh make them).
# From the repository root:
#
#   bash bench/verify/first_minute.sh 1   # first token: as before (imports plain, no bytecode
#                                  # tree), the import ways alone, and now; interleaved
#                                  # (qwen3-0.6b, nanochat-d34), 2 rounds (~3 min)
#   bash bench/verify/first_minute.sh 2   # `c` and `b` in the live app, this tree: cold, then warm
#                                  # (helper + persistent cache), kernels per step (~5 min)
#   bash bench/verify/first_minute.sh 3   # the same with the one-process compile as before (~6 min)
#   bash bench/verify/first_minute.sh 4   # kernel parity (1,839 eager / 522 compiled) and the GPU
#                                  # collection tests on this tree (~4 min)
#   bash bench/verify/first_minute.sh 5   # the first minute's rest: a first start (empty bytecode
#                                  # tree, -X importtime) and second starts, whole process, of a
#                                  # tree in .before (the code before) and this one; `c` cold (its
#                                  # helper saves the compiled step) then warm (the step loaded),
#                                  # eager's slowest 5 s beside the cold compile, kernels per
#                                  # step of each (~5 min)
#   bash bench/verify/first_minute.sh 6   # `c` cold then warm with the saved step (torch 2.11
#                                  # included), the kernels' names of both; second starts of
#                                  # .before and this tree, a first start (empty bytecode tree
#                                  # and caches, -X importtime), a py-spy profile of a second
#                                  # start (with .pyspy/*.whl); kernel parity of a loaded step
#                                  # with torch.profiler while time is left (~5 min)
#
# Each prints its table; files go to $OUT (at most 8: a call brings back no more).
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
tmx() {  # tmux from the carried .tmx packages, as $T
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
}

case "${1:-}" in
1)
  timeout 300 python bench/verify/startup_ab.py --rounds 2 --ways 'none+nopyc;all+nopyc;all' \
    >"$OUT/startup_ab_stdout.txt" 2>&1
  grep "^first start" "$OUT/startup_ab_stdout.txt"; tail -10 "$OUT/startup_ab_stdout.txt" ;;
2)
  tmx
  timeout 520 python bench/verify/compile_live.py --tmux "$T" --code after >"$OUT/compile_after.txt" 2>&1
  tail -14 "$OUT/compile_after.txt" ;;
3)
  tmx
  timeout 520 python bench/verify/compile_live.py --tmux "$T" --code before >"$OUT/compile_before.txt" 2>&1
  tail -14 "$OUT/compile_before.txt" ;;
4)
  timeout 240 python bench/verify/verify_program.py --no-overhead --no-screens >"$OUT/parity.txt" 2>&1
  tail -25 "$OUT/parity.txt"
  timeout 280 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_collect_gpu.py \
    >"$OUT/gpu_collect_tests.txt" 2>&1
  tail -5 "$OUT/gpu_collect_tests.txt" ;;
5)
  tmx
  timeout 150 python bench/verify/first_token_whole.py --trees before=.before,this=. --rounds 2 \
    --first --importtime >"$OUT/first_token_whole.txt" 2>&1
  tail -7 "$OUT/first_token_whole.txt"
  timeout 250 python bench/verify/compile_live.py --tmux "$T" --code after --no-batch --eager-s 12 \
    --wait-saved 60 --tag saved >"$OUT/compile_saved.txt" 2>&1
  tail -9 "$OUT/compile_saved.txt"
  # why a step was not saved (the marker's one line) and the helper's own output
  cat /tmp/tuiprof-inductor-after-*/*/precompiled/*.not-whole 2>/dev/null
  tail -5 /tmp/tuiprof-inductor-after-*/*/helper.log 2>/dev/null ;;
6)
  end=$((SECONDS + ${DEADLINE:-285}))
  left() { echo $((end - SECONDS)); }
  tmx
  timeout 170 python bench/verify/compile_live.py --tmux "$T" --code after --no-batch --eager-s 8 \
    --wait-saved 90 --tag saved >"$OUT/compile_saved.txt" 2>&1
  tail -10 "$OUT/compile_saved.txt"
  cat /tmp/tuiprof-inductor-after-*/*/precompiled/*.not-whole 2>/dev/null
  tail -4 /tmp/tuiprof-inductor-after-*/*/helper.log >"$OUT/helper_log.txt" 2>/dev/null
  cat "$OUT/helper_log.txt"
  timeout $(( $(left) > 100 ? 100 : $(left) )) python bench/verify/first_token_whole.py \
    --trees before=.before,this=. --rounds 2 --first --importtime >"$OUT/first_token_whole.txt" 2>&1
  tail -7 "$OUT/first_token_whole.txt"
  if ls .pyspy/*.whl >/dev/null 2>&1 && [ "$(left)" -gt 30 ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/spy .pyspy/*.whl
    d=$(mktemp -d); ( cd "$d" && timeout 40 /tmp/spy/bin/py-spy record -r 200 --threads --idle \
      -f raw -o "$OUT/second_start_pyspy.txt" -- python -m tuiprof --model qwen3-0.6b \
      --headless --max-new-tokens 1 --json "$d/h.json" >"$OUT/second_start_pyspy_log.txt" 2>&1 )
    tail -3 "$OUT/second_start_pyspy_log.txt"
  fi
  cache=$(ls -d /tmp/tuiprof-inductor-after-*/*/ 2>/dev/null | head -1)
  if [ -n "$cache" ] && [ "$(left)" -gt 45 ]; then
    timeout $(( $(left) - 5 )) python bench/verify/precompile_parity.py --model qwen3-0.6b \
      --inductor-cache "$cache" >"$OUT/parity.txt" 2>&1
    tail -12 "$OUT/parity.txt"
  fi
  # a call brings back at most 8 files: the side ones go in one archive
  ( cd "$OUT" && tar czf side.tgz --remove-files compile_live_after_saved_screens.txt \
      helper_log.txt second_start_pyspy_log.txt 2>/dev/null ) ;;
*)
  sed -n 2,20p "$0" ;;
esac
