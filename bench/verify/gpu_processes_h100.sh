#!/usr/bin/env bash
# GPU runs for issues 36 and 40 on one H100 (device kind nvidia-h100-x1), one device call each
# (each < 8 min; carry .whl from ../shared/device/wheels.sh and .tmx from ../shared/device/tmux.sh).
# From the repository root:
#
#   bash bench/verify/gpu_processes_h100.sh 1   # ~6 min
#     a) a spawned-engine program running generate() (tests/programs/spawn_engine.py,
#        qwen3-0.6b): kernels per traced decode step in the spawn child against the same
#        program with its engine in one process (bench/verify/verify_processes.py kernels; target:
#        within 1 %);
#     b) a detached session under load (the same program sending requests for 4 minutes):
#        started in tmux window 1, that window closed (SIGHUP), attached from a second window
#        (g, a), detached with q, attached again at 80x24, tuiprof ls, then tuiprof stop.
#   bash bench/verify/gpu_processes_h100.sh 2   # ~7 min
#     what a detached session costs while nobody is attached: hf_qwen.py alone against
#     `tuiprof run --detach` (bench/verify/verify_processes.py overhead): rounds of eager and compiled
#     pairs interleaved, up to 3, none started after 6 minutes.
#
# Read: $OUT/*.txt. Where the figures go: docs/gpu-verification.md (a new section), the
# "Processes" section of docs/multi-gpu.md (kernels per step, spawn vs one process) and the
# overhead line of docs/remote.md ("Overhead while detached").
set -u
cd "$(dirname "$0")/../.."
. bench/verify/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt

case "${1:-}" in
1)
  timeout 240 python bench/verify/verify_processes.py kernels --device cuda --model qwen3-0.6b \
    --requests 4 --new-tokens 32 2>&1 | tee "$OUT/kernels_spawn_vs_one.txt"
  # b) detached under load: started from tmux window 1, which then closes (a dropped login)
  mkdir -p /tmp/det
  $T new-session -d -s w1 -x 200 -y 50 "python -m tuiprof run --detach --export-dir /tmp/det \
    --snapshot-every 1 -- python tests/programs/spawn_engine.py --model qwen3-0.6b \
    --device cuda --new-tokens 64 --seconds 240 > /tmp/det/sid.txt 2>/tmp/det/start.txt; sleep 2"
  sleep 8; $T kill-session -t w1 2>/dev/null
  sid=$(tail -1 /tmp/det/sid.txt); cat /tmp/det/start.txt > "$OUT/detached.txt"
  sleep 40; python -m tuiprof ls >> "$OUT/detached.txt"
  OUT=$OUT timeout 60 python bench/verify/tmux_capture.py --tmux "$T" --size 200x50 --name attach1 \
    --steps "15:;0:g;4:;0:a;5:;0:Escape;1:q;3:" -- python -m tuiprof attach "$sid" >/dev/null 2>&1
  python -m tuiprof ls >> "$OUT/detached.txt"
  OUT=$OUT timeout 60 python bench/verify/tmux_capture.py --tmux "$T" --size 80x24 --name attach2 \
    --steps "15:;0:e;4:;0:q;3:" -- python -m tuiprof attach "$sid" >/dev/null 2>&1
  python -m tuiprof ls >> "$OUT/detached.txt"
  timeout 200 python -m tuiprof stop "$sid" >> "$OUT/detached.txt" 2>&1
  python -m tuiprof ls >> "$OUT/detached.txt"
  python - "$sid" >> "$OUT/detached.txt" <<'PY'
import sys, json
from tuiprof.sessions import runtime
info = runtime.read_info(runtime.runtime_root() / sys.argv[1]) or {}
print(json.dumps(info, indent=1))
from tuiprof.export.snapshot import read_any_snapshot
snap = read_any_snapshot(info["snapshot"])
for v in getattr(snap, "views", [snap]):
    p = v.meta.get("process") or {}
    ks = [t.kernels for t in v.timeline if t.phase == "decode" and t.kernels]
    print(p.get("pid"), p.get("name"), "steps", v.counters.get("tokens"), "traced decode steps",
          len(ks), "kernels/step", sorted(ks)[len(ks) // 2] if ks else None)
PY
  ls -la /tmp/det >> "$OUT/detached.txt"
  ;;
2)
  timeout 470 python bench/verify/verify_processes.py overhead --modes eager,compiled --rounds 3 \
    --deadline 360 2>&1 \
    | tee "$OUT/overhead_detached.txt"
  ;;
*)
  echo "usage: bash bench/verify/gpu_processes_h100.sh 1|2"; exit 2
  ;;
esac
echo "outputs in $OUT"; ls -la "$OUT"
