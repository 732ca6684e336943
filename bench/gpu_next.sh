#!/usr/bin/env bash
# GPU runs for issues 15, 17 and 18, one device call each (each < 10 min on the H100 host;
# carry .whl, and .tmx .old for calls 2 and 5). From the repository root:
#
#   Nothing is queued.
#
# Done (docs/gpu-verification.md §30-§38): 38-42 (§38: the engine's HF masks made before the
#   forward; model forward kernels per decode step engine = generate(), eager 1,839 and compiled
#   522; the compiled engine step 0.977 of before; GPU tests 10 passed; screens), 33-37 (§37: compiled 0.974 with the peer 1.271, app
#   open 1.028 over 8 rounds; 10,000 compiled steps timed, 0.915 of the traced spans; the
#   model/loop split, eager 0.996 and compiled 0.972 of the engine), 27-32 (§36: the GPU tests, 13 passed; the eager
#   engine 1.025 headless / 1.022 app open; generate() eager 1.063 and 1.003, compiled 0.991),
#   22-26 (§35: eager 1.045 headless and 1.048 app open, parts, compiled app open, the eager
#   peer; 22's headless run was cut by the old hard deadline), 11 (eager windows at the 128-step period: 1.108 /
#   1.059, §34), 10-21 (§34: a program's CUPTI attached for bursts
#   only, its GPU tests, generate() eager 1.046 in one process, compiled 1.031 / 1.034 in whole
#   processes; the engine compiled 1.019 beside torch.profiler 1.258), and:
#   bash bench/gpu_next.sh 1   # 17: compiled none, default, late-attach, torch.profiler
#   bash bench/gpu_next.sh 3   # 15: compiled generate() parts, whole processes (not run: 23
#                              #     measures inside one process)
#   bash bench/gpu_next.sh 2   # 18: the app's first step on screen (old tree vs new), tmux
#   bash bench/gpu_next.sh 4   # 17: eager whole processes with the app open (none, default, app)
#   bash bench/gpu_next.sh 5   # 17: a session in tmux pressing c; app-open eager with and
#                              #     without the findings pass
#   bash bench/gpu_next.sh 6   # 17: eager none, default, remote, app (noise-bound, §32)
#   bash bench/gpu_next.sh 7   # 17: compiled recapture (dynamo reset around the finalize)
#   bash bench/gpu_next.sh 8   # 17: compiled burst-attach (crashes at the finalize)
#   bash bench/gpu_next.sh 9   # 17: compiled rerecord (graphs dropped in place: clean)
# Each prints a short table; at most 8 files go to $OUT (what the device tool brings back).
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
show() { tail -"$1" "$2"; echo; }
app_capture() {  # NAME SIZE STEPS SECONDS EXPORT_DIR: the app on qwen3-0.6b in tmux ($T)
  OUT=$OUT timeout "$4" python bench/tmux_capture.py --tmux "$T" --size "$2" --name "$1" \
    --steps "$3" -- python -m tuiprof --model qwen3-0.6b --export-dir "$5" >/dev/null 2>&1
}
tmx() {  # tmux from the carried .tmx packages, as $T
  for f in .tmx/*.deb; do dpkg -x "$f" /tmp/tmxroot; done
  export LD_LIBRARY_PATH=/tmp/tmxroot/usr/lib/x86_64-linux-gnu TERM=xterm-256color
  T="/tmp/tmxroot/usr/bin/tmux -S /tmp/tmx.sock"
}

case "${1:-}" in
1)
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 6 --tokens 2048 \
    --configs none,default,late-attach,torch.profiler --deadline 400 \
    --json "$OUT/procs_compiled_states.json" >"$OUT/procs_compiled_states.txt" 2>&1
  show 30 "$OUT/procs_compiled_states.txt" ;;
2)
  tmx
  timeout 400 python bench/verify_startup.py --tree .old --tmux "$T" --parts app \
    >"$OUT/startup.txt" 2>&1
  show 20 "$OUT/startup.txt" ;;
3)
  timeout 90 python3 -m pytest -q -p no:cacheprovider -rA -k prefills \
    tests/gpu/test_program_gpu.py >"$OUT/gpu_prefills_test.txt" 2>&1
  show 8 "$OUT/gpu_prefills_test.txt"
  timeout 440 python bench/overhead_program.py --mode compiled --new-tokens 65 --rounds 6 \
    --deadline 320 --configs alone,tuiprof,no-api,attached,no-cupti,hooks \
    --json "$OUT/ovp_parts.json" >"$OUT/ovp_parts.txt" 2>&1
  show 12 "$OUT/ovp_parts.txt" ;;
4)
  timeout 560 python bench/overhead_procs.py --mode eager --rounds 8 --tokens 128 \
    --configs none,default,app --deadline 440 --json "$OUT/procs_app.json" \
    >"$OUT/procs_app.txt" 2>&1
  show 36 "$OUT/procs_app.txt" ;;
5)
  # 17: a compiled session's header on the H100 (the overhead method), the counter during c;
  # then the app-open eager rounds again: the app with and without its findings pass.
  tmx
  app_capture gpu_compiled_header_200x50 200x50 "25:;0:c;10:;10:;10:;10:;10:;10:;15:;0:q;5:" \
    150 .
  awk '/^=====/{n=3} n-->0' "$OUT/gpu_compiled_header_200x50.txt" | cut -c1-200 | head -40
  timeout 440 python bench/overhead_procs.py --mode eager --rounds 8 --tokens 128 \
    --configs none,app,app-no-findings --deadline 370 --json "$OUT/procs_app2.json" \
    >"$OUT/procs_app2.txt" 2>&1
  show 30 "$OUT/procs_app2.txt" ;;
6)
  lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA node0)" | tr -s ' '
  timeout 560 python bench/overhead_procs.py --mode eager --rounds 8 --tokens 128 \
    --configs none,default,remote,app --deadline 470 --json "$OUT/procs_remote.json" \
    >"$OUT/procs_remote.txt" 2>&1
  show 40 "$OUT/procs_remote.txt" ;;
7)
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 5 --tokens 2048 \
    --configs none,default,recapture --deadline 420 --json "$OUT/procs_recapture.json" \
    >"$OUT/procs_recapture.txt" 2>&1
  show 30 "$OUT/procs_recapture.txt" ;;
8)
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,default,burst-attach --deadline 440 --json "$OUT/procs_burst_attach.json" \
    >"$OUT/procs_burst_attach.txt" 2>&1
  show 30 "$OUT/procs_burst_attach.txt" ;;
9)
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,default,rerecord --deadline 400 --json "$OUT/procs_rerecord.json" \
    >"$OUT/procs_rerecord.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_rerecord.txt" | tail -24 ;;
10)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_detach_gpu.py \
    >"$OUT/gpu_detach_test.txt" 2>&1
  grep -E "passed|failed|detaches|Error|error" "$OUT/gpu_detach_test.txt" | tail -8
  timeout 400 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,detach,detach-256,default-256 --deadline 310 --json "$OUT/procs_detach.json" \
    >"$OUT/procs_detach.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_detach.txt" | tail -16 ;;
12)
  # 17: what broke detach_between_bursts at stop (§32): the GPU test beside the workload
  # under PYTHONMALLOC=debug, graphs dropped without detaching, and no periodic flush; then
  # compiled none, detach-256 (a burst every 256 steps), default-256, whole processes
  (timeout 300 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_detach_gpu.py \
    >"$OUT/gpu_detach_test.txt" 2>&1) &
  timeout 330 python bench/detach_variants.py debug,drop-only,no-flush-period --out "$OUT" \
    --timeout 320 >"$OUT/detach_variants.txt" 2>&1
  wait
  cat "$OUT/detach_variants.txt" | cut -c1-400
  grep -E "passed|failed|detaches|Error|error" "$OUT/gpu_detach_test.txt" | tail -8 | cut -c1-300
  timeout 230 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,detach-256,default-256 --deadline 200 --json "$OUT/procs_detach.json" \
    >"$OUT/procs_detach.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_detach.txt" | tail -14 ;;
13)
  # 17: compiled none against detach (the live sampling: a burst in every 4,096 steps, so
  # one attach/finalize cycle and two graph drops in each timed run)
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 4096 \
    --configs none,detach --deadline 480 --json "$OUT/procs_detach_live.json" \
    >"$OUT/procs_detach_live.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_detach_live.txt" | tail -26 ;;
14)
  # 17, CUPTI attached for bursts only by default (eager too): the GPU tests of collection
  # (eager and compiled sessions at the defaults) and of detaching, then eager windows in one
  # process against none (auto attaches for its bursts only), headless and with the app open
  timeout 240 python3 -m pytest -q -p no:cacheprovider -rA -k "not dropped_graphs" \
    tests/gpu/test_collect_gpu.py tests/gpu/test_detach_gpu.py >"$OUT/gpu_tests.txt" 2>&1
  grep -E "passed|failed|PASSED|FAILED|Error|error|detaches" "$OUT/gpu_tests.txt" | tail -12 \
    | cut -c1-300
  timeout 160 python bench/overhead.py --modes eager --blocks 6 --none --no-bare \
    --json "$OUT/windows_none2.json" >"$OUT/windows_none2.txt" 2>&1
  tail -6 "$OUT/windows_none2.txt"
  timeout 160 python bench/ui_overhead.py --modes eager --blocks 4 --none --no-bare \
    --json "$OUT/ui_windows_none2.json" >"$OUT/ui_windows_none2.txt" 2>&1
  tail -6 "$OUT/ui_windows_none2.txt" ;;
15)
  # 17: the live app at the defaults (CUPTI attached for bursts only) as a user: eager, c to
  # compiled (graphs dropped around every attach), the latency pane, b, e, q; 200x50 and 80x24
  tmx
  app_capture gpu_s10_keys_200x50 200x50 \
    "25:;0:c;15:;15:;15:;15:;15:;15:;0:1;5:;0:b;15:;10:;0:e;4:;0:q;6:" 260 "$OUT"
  awk '/^=====/{n=4} n-->0' "$OUT/gpu_s10_keys_200x50.txt" | cut -c1-200 | head -60
  app_capture gpu_s10_keys_80x24 80x24 "20:;0:c;20:;20:;20:;0:1;5:;0:q;5:" 150 /tmp
  ls -la "$OUT" ;;
16)
  # 17: 15 again after drop_cuda_graphs found the engine thread's graphs (the app's path:
  # the compile worker imports the trees first); then what the snapshot says of the drops
  tmx
  app_capture gpu_s10_drops_200x50 200x50 \
    "25:;0:c;15:;15:;15:;15:;15:;15:;15:;0:1;5:;0:e;4:;0:q;6:" 230 "$OUT"
  awk '/^=====/{n=3} n-->0' "$OUT/gpu_s10_drops_200x50.txt" | cut -c1-200 | tail -12
  python - "$OUT"/tuiprof-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    rr = [(t["seq"], round(t["host_ms"], 1)) for t in d["tokens"] if t.get("rerecord")]
    st = {f"{x['phase']}/{x['mode']}": {k: (v["count"], round(v["mean"], 2))
          for k, v in x["stats"].items() if k.endswith("_ms")} for x in d["token_stats"]}
    print(f.split("/")[-1], "rerecord rows in window:", rr[:8], st, d["overhead"].get("switch_s"))
PY
  ;;
31)
  # 15: an eager generate() against none inside one process at the 256-step period (§34's
  # 1.046 was at 128)
  timeout 560 python bench/overhead_program_windows.py --blocks 12 --deadline 450 \
    --json "$OUT/ovp_windows_eager256.json" >"$OUT/ovp_windows_eager256.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_windows_eager256.txt" | tail -6 | cut -c1-400 ;;
32)
  # 15: a compiled generate() against none inside one process again (23 read 0.992)
  timeout 560 python bench/overhead_program_windows.py --mode compiled --blocks 10 \
    --deadline 450 --json "$OUT/ovp_windows_compiled2.json" \
    >"$OUT/ovp_windows_compiled2.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_windows_compiled2.txt" | tail -6 | cut -c1-400 ;;
30)
  # 17: the engine, eager, with the app open against none inside one process again (22's
  # second half, with room for more blocks)
  timeout 560 python bench/ui_overhead.py --modes eager --blocks 14 --none --no-bare \
    --deadline 430 --json "$OUT/ui_windows_none256_again.json" \
    >"$OUT/ui_windows_none256_again.txt" 2>&1
  tail -8 "$OUT/ui_windows_none256_again.txt" | cut -c1-400 ;;
27)
  # the GPU tests on the session-12 code (the 256-step eager period), but the program's (28)
  timeout 540 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA --durations=0 \
    tests/gpu/test_collect_gpu.py tests/gpu/test_detach_gpu.py tests/gpu/test_engine_gpu.py \
    tests/gpu/test_zz_torch_profiler_agreement.py >"$OUT/gpu_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|s call" "$OUT/gpu_tests.txt" | tail -20 | cut -c1-300 ;;
28)
  # the program GPU tests on the session-12 code; then a program step's bookkeeping on this host
  timeout 330 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA --durations=0 \
    tests/gpu/test_program_gpu.py >"$OUT/gpu_program_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|s call" "$OUT/gpu_program_tests.txt" | tail -12 \
    | cut -c1-300
  timeout 120 python bench/step_cost.py --rounds 8 >"$OUT/step_cost.txt" 2>&1
  tail -4 "$OUT/step_cost.txt" ;;
29)
  # 17: the engine, eager, headless, against none inside one process again (a third run of 25's
  # method, without the parts), for blocks pooled over the runs
  timeout 560 python bench/overhead.py --modes eager --blocks 14 --none --no-bare \
    --deadline 440 --json "$OUT/windows_none256_again.json" \
    >"$OUT/windows_none256_again.txt" 2>&1
  tail -10 "$OUT/windows_none256_again.txt" | cut -c1-400 ;;
26)
  # 17: the peer, eager: torch.profiler (CUDA activities) against no profiler in one process
  # (the second phase: no tuiprof CUPTI subscriber); then the eager app on screen at 80x24
  timeout 330 python bench/overhead.py --modes eager --blocks 1 --none --no-bare --peer \
    --peer-blocks 8 --deadline 250 --json "$OUT/peer_eager.json" >"$OUT/peer_eager.txt" 2>&1
  tail -9 "$OUT/peer_eager.txt" | cut -c1-330
  tmx
  app_capture gpu_s12_eager_80x24 80x24 "25:;10:;10:;0:?;3:;0:Escape;2:;0:q;6:" 80 "$OUT"
  awk '/^=====/{n=26} n-->0' "$OUT/gpu_s12_eager_80x24.txt" | tail -27 ;;
25)
  # 17: the engine, eager, headless, at the default sampling against none inside one process
  # (22's headless run ended at its old hard deadline), then each per-step part against none
  timeout 560 python bench/overhead.py --modes eager --blocks 12 --none --no-bare --ablate-none \
    --ablate-blocks 6 --deadline 400 --json "$OUT/windows_none256_parts.json" \
    >"$OUT/windows_none256_parts.txt" 2>&1
  tail -12 "$OUT/windows_none256_parts.txt" | cut -c1-400 ;;
22)
  # 17: the engine, eager, at the default sampling (a burst every 256 steps since session 12),
  # against no tuiprof inside one process; then the same with the app open
  timeout 300 python bench/overhead.py --modes eager --blocks 14 --none --no-bare --deadline 235 \
    --json "$OUT/windows_none256.json" >"$OUT/windows_none256.txt" 2>&1
  tail -7 "$OUT/windows_none256.txt" | cut -c1-400
  timeout 255 python bench/ui_overhead.py --modes eager --blocks 10 --none --no-bare \
    --deadline 200 --json "$OUT/ui_windows_none256.json" >"$OUT/ui_windows_none256.txt" 2>&1
  tail -7 "$OUT/ui_windows_none256.txt" | cut -c1-400 ;;
23)
  # 15: a compiled generate() (transformers' own compiled decode, CUDA graphs) under a real
  # ProgramSession against no tuiprof, windows of one 64-token call inside one process
  timeout 560 python bench/overhead_program_windows.py --mode compiled --blocks 12 \
    --deadline 430 --json "$OUT/ovp_windows_compiled.json" >"$OUT/ovp_windows_compiled.txt" 2>&1
  grep -v "Warning\|warn\|^DECODE" "$OUT/ovp_windows_compiled.txt" | tail -20 | cut -c1-400 ;;
24)
  # 17: the engine compiled with the app open against no tuiprof, whole processes
  timeout 575 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,app --deadline 470 --json "$OUT/procs_compiled_app.json" \
    >"$OUT/procs_compiled_app.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_compiled_app.txt" | tail -14 | cut -c1-400 ;;
11)
  timeout 280 python bench/overhead.py --modes eager --blocks 8 --none --no-bare --deadline 270 \
    --json "$OUT/windows_none.json" >"$OUT/windows_none.txt" 2>&1
  tail -8 "$OUT/windows_none.txt"
  timeout 290 python bench/ui_overhead.py --modes eager --blocks 6 --none --no-bare \
    --json "$OUT/ui_windows_none.json" >"$OUT/ui_windows_none.txt" 2>&1
  tail -8 "$OUT/ui_windows_none.txt" ;;
17)
  # 15: a program's CUPTI attached for its bursts only (the default since session 11): the
  # program GPU tests (compiled generate() detaching ~9 times, a graph of the program's own),
  # then the script alone / under tuiprof run / under tuiprof run --cupti-attached, eager
  timeout 320 python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_program_gpu.py \
    >"$OUT/gpu_program_tests.txt" 2>&1
  grep -E "passed|failed|PASSED|FAILED|Error|detaches|traced" "$OUT/gpu_program_tests.txt" \
    | tail -14 | cut -c1-400
  timeout 240 python bench/overhead_program.py --mode eager --rounds 8 --deadline 190 \
    --configs alone,tuiprof,cupti-attached --json "$OUT/ovp_eager.json" \
    >"$OUT/ovp_eager.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_eager.txt" | tail -8 ;;
18)
  timeout 560 python bench/overhead_program.py --mode compiled --new-tokens 65 --rounds 10 \
    --deadline 470 --configs alone,tuiprof,cupti-attached --json "$OUT/ovp_compiled.json" \
    >"$OUT/ovp_compiled.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_compiled.txt" | tail -40 | cut -c1-300 ;;
19)
  # 15: the same with every child on CPUs 2-5 (eager processes differed by ±40 % unpinned)
  lscpu -e=CPU,CORE,SOCKET,NODE | head -18 | tr '\n' ';'; echo
  timeout 230 python bench/overhead_program.py --mode eager --rounds 8 --deadline 180 \
    --cpus 2-5 --configs alone,tuiprof,cupti-attached --json "$OUT/ovp_eager_pinned.json" \
    >"$OUT/ovp_eager_pinned.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_eager_pinned.txt" | tail -6
  timeout 330 python bench/overhead_program.py --mode compiled --new-tokens 65 --rounds 10 \
    --deadline 270 --cpus 2-5 --configs alone,tuiprof --json "$OUT/ovp_compiled_pinned.json" \
    >"$OUT/ovp_compiled_pinned.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_compiled_pinned.txt" | tail -5 ;;
20)
  # 15: eager generate() against no tuiprof inside one process (whole processes cannot
  # resolve 5 %), then the live app on a program as a user: eager 200x50, compiled 80x24
  timeout 200 python bench/overhead_program_windows.py --blocks 12 --deadline 170 \
    --json "$OUT/ovp_windows.json" >"$OUT/ovp_windows.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/ovp_windows.txt" | tail -18 | cut -c1-400
  tmx
  P="python bench/programs/hf_qwen.py --new-tokens 65"
  OUT=$OUT timeout 90 python bench/tmux_capture.py --tmux "$T" --size 200x50 \
    --name gpu_s11_program_eager_200x50 \
    --steps "25:;0:l;4:;0:Escape;8:;0:c;3:;0:space;5:;0:space;10:;0:e;4:;0:q;6:" \
    -- python -m tuiprof run --export-dir "$OUT" -- $P --mode eager --repeats 400 >/dev/null 2>&1
  awk '/^=====/{n=3} n-->0' "$OUT/gpu_s11_program_eager_200x50.txt" | cut -c1-200 | head -40
  OUT=$OUT timeout 170 python bench/tmux_capture.py --tmux "$T" --size 80x24 \
    --name gpu_s11_program_compiled_80x24 --steps "80:;20:;20:;0:1;5:;0:e;4:;0:q;6:" \
    -- python -m tuiprof run --export-dir "$OUT" -- $P --mode compiled --repeats 400 \
    >/dev/null 2>&1
  awk '/^=====/{n=3} n-->0' "$OUT/gpu_s11_program_compiled_80x24.txt" | head -30
  python - "$OUT"/tuiprof-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    o = d["overhead"]
    ev = [e[3] for e in d["events"] if "CUPTI" in e[3]]
    print(f.split("/")[-1], "steps", d["counters"]["tokens"], "kernels", d["counters"]["kernels"],
          "detaches", o.get("detaches"), "switch_s", o.get("switch_s"), "pct", o.get("pct"), ev)
PY
  ;;
21)
  # 17: compiled none, the default (CUPTI attached for bursts only) and the peer
  # torch.profiler (CUDA activities around the same decode), whole processes
  timeout 560 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,default,torch.profiler --deadline 430 --json "$OUT/procs_peer.json" \
    >"$OUT/procs_peer.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_peer.txt" | tail -12 | cut -c1-300 ;;
33)
  # 17: the engine compiled at the default against no tuiprof, torch.profiler beside it, whole
  # processes, 8 rounds in one call (21 fitted 7: the deadline now leaves room for the 8th)
  timeout 580 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,default,torch.profiler --deadline 505 --json "$OUT/procs_peer8.json" \
    >"$OUT/procs_peer8.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_peer8.txt" | tail -12 | cut -c1-300 ;;
34)
  # 17: the engine compiled with the app open against no tuiprof, 8 rounds in one call (24
  # fitted 7 twice)
  timeout 580 python bench/overhead_procs.py --mode compiled --rounds 8 --tokens 2048 \
    --configs none,app --deadline 510 --json "$OUT/procs_compiled_app8.json" \
    >"$OUT/procs_compiled_app8.txt" 2>&1
  grep -v "Warning\|warn" "$OUT/procs_compiled_app8.txt" | tail -14 | cut -c1-400 ;;
35)
  # 15: kernels per decode step, the model forward's apart from the loop's (the engine against
  # generate(), eager and compiled); 17: every compiled step timed over 10,000 steps on this
  # code; the split's GPU test beside the collection tests
  timeout 240 python bench/verify_program.py --no-overhead --no-screens \
    >"$OUT/vp_table.txt" 2>&1
  cat "$OUT/vp_table.txt" | cut -c1-250
  timeout 170 python bench/verify_step_gpu.py --tokens 10000 --json "$OUT/step_gpu_10k.json" \
    --deadline 165 >"$OUT/step_gpu_10k.txt" 2>&1
  tail -14 "$OUT/step_gpu_10k.txt" | cut -c1-250
  timeout 190 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA -s \
    tests/gpu/test_collect_gpu.py >"$OUT/gpu_collect_split.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|model/loop" "$OUT/gpu_collect_split.txt" \
    | tail -12 | cut -c1-300 ;;
36)
  # 15: 35's kernel comparison again after the split's two fixes (launch records parsed before
  # kernels; a graph's kernels share one launch), its snapshots for the screens here, and the
  # split's GPU test
  timeout 240 python bench/verify_program.py --no-overhead --no-screens \
    >"$OUT/vp_table.txt" 2>&1
  grep -v "^\[" "$OUT/vp_table.txt" | head -24 | cut -c1-250
  for f in hf_eager hf_compiled engine_eager; do
    cp "$(ls -d /tmp/verify-program-work-* | tail -1)/$f.json" "$OUT/" 2>/dev/null
  done
  timeout 190 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA -s \
    tests/gpu/test_collect_gpu.py >"$OUT/gpu_collect_split.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|model/loop" "$OUT/gpu_collect_split.txt" \
    | tail -12 | cut -c1-300 ;;
37)
  # 15: the model/loop split as a user sees it: the live app on an eager generate() program
  # (200x50: the kernels pane's caption, the findings) and the engine compiled (80x24)
  tmx
  P="python bench/programs/hf_qwen.py --new-tokens 65"
  OUT=$OUT timeout 100 python bench/tmux_capture.py --tmux "$T" --size 200x50 \
    --name gpu_s14_program_split_200x50 --steps "45:;0:2;3:;15:;0:5;3:;0:Escape;2:;0:q;8:" \
    -- python -m tuiprof run --export-dir "$OUT" -- $P --mode eager --repeats 400 >/dev/null 2>&1
  awk '/^=====/{n=3} n-->0' "$OUT/gpu_s14_program_split_200x50.txt" | cut -c1-200 | head -12
  grep -o "per step: model[^·]*" "$OUT/gpu_s14_program_split_200x50.txt" | sort | uniq -c
  OUT=$OUT timeout 150 python bench/tmux_capture.py --tmux "$T" --size 80x24 \
    --name gpu_s14_engine_compiled_80x24 --steps "95:;0:2;3:;15:;0:q;8:" \
    -- python -m tuiprof --model qwen3-0.6b --mode compiled --export-dir "$OUT" >/dev/null 2>&1
  grep -o "per step: model[^·]*\|model [0-9,]* ([^)]*), loop[^·]*" \
    "$OUT/gpu_s14_engine_compiled_80x24.txt" | sort | uniq -c
  ls "$OUT" ;;
38)
  # 15: the engine's HF step with its masks made before the forward (as generate() does):
  # 36's kernel comparison again, then the engine's speed with masks before vs inside
  timeout 300 python bench/verify_program.py --no-overhead --no-screens \
    >"$OUT/vp_table.txt" 2>&1
  grep -v "^\[" "$OUT/vp_table.txt" | head -24 | cut -c1-250
  bash "$0" 39 ;;
39)
  # 15: 38's speed half alone (38's 256-step eager runs did not fit its 250 s), the split's
  # GPU test, the engine compiled in tmux (the kernels pane's caption)
  timeout 230 python bench/masks_ab.py --model qwen3-0.6b --tokens 128 --rounds 5 \
    >"$OUT/masks_ab.txt" 2>&1
  grep -v Warn "$OUT/masks_ab.txt" | tail -12
  timeout 190 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA -s \
    tests/gpu/test_collect_gpu.py >"$OUT/gpu_collect_split.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|model/loop" "$OUT/gpu_collect_split.txt" \
    | tail -12 | cut -c1-300
  tmx
  OUT=$OUT timeout 100 python bench/tmux_capture.py --tmux "$T" --size 80x24 \
    --name gpu_s15_engine_compiled_80x24 --steps "60:;0:2;3:;15:;0:q;8:" \
    -- python -m tuiprof --model qwen3-0.6b --mode compiled --export-dir "$OUT" >/dev/null 2>&1
  grep -o "per step: model[^·]*" "$OUT/gpu_s15_engine_compiled_80x24.txt" | sort | uniq -c ;;
40)
  # 15: 39's eager half again, more rounds (39: 1.062 with two outlier rounds of 52-57 ms)
  timeout 300 python bench/masks_ab.py --model qwen3-0.6b --tokens 96 --rounds 11 \
    --modes eager >"$OUT/masks_ab_eager.txt" 2>&1
  grep -v Warn "$OUT/masks_ab_eager.txt" | tail -16 ;;
41)
  # 15: the engine GPU tests on the masks-before code (collect's ran in 39), the eager engine
  # at 200x50 in tmux (kernels pane, findings)
  timeout 330 python3 -m pytest -q -p no:logging -p no:cacheprovider -rA --durations=0 \
    tests/gpu/test_detach_gpu.py tests/gpu/test_engine_gpu.py \
    tests/gpu/test_zz_torch_profiler_agreement.py >"$OUT/gpu_tests.txt" 2>&1
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|s call" "$OUT/gpu_tests.txt" | tail -16 | cut -c1-300
  tmx
  OUT=$OUT timeout 110 python bench/tmux_capture.py --tmux "$T" --size 200x50 \
    --name gpu_s15_engine_eager_200x50 --steps "40:;0:2;3:;15:;0:5;3:;10:;0:Escape;2:;0:q;8:" \
    -- python -m tuiprof --model qwen3-0.6b --export-dir "$OUT" >/dev/null 2>&1
  grep -o "per step: model[^·]*" "$OUT/gpu_s15_engine_eager_200x50.txt" | sort | uniq -c ;;
42)
  # 15: 41's screens again with the masks settled in the prefill (41: a decode step carried
  # the masks' one check, loop 20 once): the eager engine at 200x50, compiled at 80x24
  tmx
  OUT=$OUT timeout 110 python bench/tmux_capture.py --tmux "$T" --size 200x50 \
    --name gpu_s15_engine_eager_settled_200x50 \
    --steps "40:;0:2;3:;15:;0:5;3:;10:;0:Escape;2:;0:q;8:" \
    -- python -m tuiprof --model qwen3-0.6b --export-dir "$OUT" >/dev/null 2>&1
  grep -o "per step: model[^·]*" "$OUT/gpu_s15_engine_eager_settled_200x50.txt" | sort | uniq -c
  OUT=$OUT timeout 110 python bench/tmux_capture.py --tmux "$T" --size 80x24 \
    --name gpu_s15_engine_compiled_settled_80x24 --steps "60:;0:2;3:;15:;0:q;8:" \
    -- python -m tuiprof --model qwen3-0.6b --mode compiled --export-dir "$OUT" >/dev/null 2>&1
  grep -o "per step: model[^·]*" "$OUT/gpu_s15_engine_compiled_settled_80x24.txt" | sort | uniq -c
  ls "$OUT" ;;
*)
  echo "usage: bash bench/gpu_next.sh 1-21 (see the head of this file)"; exit 2 ;;
esac
