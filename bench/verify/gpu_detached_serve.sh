#!/usr/bin/env bash
# A detached session over a real server under real load (issue 40's device check), on one GPU
# (device kind nvidia-h100-x1; carry .whl from ../shared/device/wheels.sh --serving and .tmx
# from ../shared/device/tmux.sh), about 4 minutes. From the repository root:
#
#   bash bench/verify/gpu_detached_serve.sh
#
# 1. `tuiprof run --detach -- transformers serve DIR --continuous-batching --device cuda`,
#    started from tmux window w1, which is then killed (the login drops: SIGHUP);
# 2. load from the openai client (a real HTTP client): 8 concurrent streaming completions,
#    for LOAD_S seconds (default 150);
# 3. attached from a second tmux window at 200x50 (requests pane 7, a request's story with
#    Enter, g, a), detached with q; attached again at 80x24 (7, e), detached with q;
#    `tuiprof ls` between each;
# 4. `tuiprof stop`, then the session's info and the final snapshot's processes and requests.
#
# Read: $OUT/detached_serve.txt (ls, stop, info, the snapshot), $OUT/dserve_attach*.txt (screens).
set -u
cd "$(dirname "$0")/../.."
. bench/verify/gpu_setup.sh
MODEL=${MODEL:-/tmp/qwen3-0.6b-dir}
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu MODEL=DIR: a dry run on the CPU
LOAD_S=${LOAD_S:-150}
PORT=8765
# transformers serve's /v1/models answers 500 without a hub cache directory (a fresh machine)
export HF_HUB_CACHE=${HF_HUB_CACHE:-/tmp/hf-hub}; mkdir -p "$HF_HUB_CACHE"
R=$OUT/detached_serve.txt
say() { echo "[$(date +%T)] $*" | tee -a "$R"; }
[ -d "$MODEL" ] || python3 -m tuiprof.engine.model_dir "$MODEL" --model qwen3-0.6b --device cuda \
  > "$OUT/model_dir.log" 2>&1 || { cat "$OUT/model_dir.log"; exit 1; }
rm -rf /tmp/dserve; mkdir -p /tmp/dserve
say "1. detached from tmux window w1, which is then killed"
$T new-session -d -s w1 -x 200 -y 50 "python3 -m tuiprof run --detach --export-dir /tmp/dserve \
  --snapshot-every 1 -- python3 -m transformers.cli.transformers serve $MODEL \
  --continuous-batching --device $DEVICE --host 127.0.0.1 --port $PORT \
  > /tmp/dserve/sid.txt 2>/tmp/dserve/start.txt; sleep 3"
sleep 8; $T kill-session -t w1 2>/dev/null
sid=$(tail -1 /tmp/dserve/sid.txt); cat /tmp/dserve/start.txt >> "$R"; say "session $sid"
for i in $(seq 120); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/v1/models', timeout=2)" \
    2>/dev/null && break; sleep 1
done
say "server up"
say "2. load: the openai client, 8 streams for $LOAD_S s"
python3 - "$MODEL" "$PORT" "$LOAD_S" > "$OUT/dserve_load.txt" 2>&1 <<'PY' &
import statistics, sys, threading, time
from openai import OpenAI
model, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
end, ttft, e2e, errors, lock = time.monotonic() + secs, [], [], [], threading.Lock()
def worker(k):
    while time.monotonic() < end:
        t0 = time.monotonic(); first = None
        try:
            for ev in client.completions.create(model=model, prompt=f"{k} " + "word " * 120,
                                                max_tokens=64, stream=True):
                first = first or time.monotonic()
        except Exception as exc:   # noqa: BLE001 - counted, the load goes on
            with lock: errors.append(type(exc).__name__)
            time.sleep(0.5); continue
        with lock:
            ttft.append((first or time.monotonic()) - t0); e2e.append(time.monotonic() - t0)
threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1e3 if xs else float("nan")
print(f"client: {len(e2e)} requests, {len(errors)} errors {sorted(set(errors))}; "
      f"TTFT p50 {q(ttft, .5):.1f} ms p99 {q(ttft, .99):.1f} ms; e2e p50 {q(e2e, .5):.1f} ms")
PY
LOAD=$!
sleep 25
python3 -m tuiprof ls >> "$R" 2>&1
say "3. attach from a second window (200x50), q detaches"
OUT=$OUT timeout 70 python3 bench/verify/tmux_capture.py --tmux "$T" --size 200x50 --name dserve_attach1 \
  --steps "12:;0:7;4:;0:Enter;3:;0:Escape;1:g;3:;0:a;4:;0:Escape;1:q;4:" \
  -- python3 -m tuiprof attach "$sid" >/dev/null 2>&1
python3 -m tuiprof ls >> "$R" 2>&1
say "   attach again (80x24)"
OUT=$OUT timeout 60 python3 bench/verify/tmux_capture.py --tmux "$T" --size 80x24 --name dserve_attach2 \
  --steps "12:;0:7;4:;0:1;3:;0:e;4:;0:q;4:" -- python3 -m tuiprof attach "$sid" >/dev/null 2>&1
python3 -m tuiprof ls >> "$R" 2>&1
wait $LOAD; cat "$OUT/dserve_load.txt" >> "$R"
say "4. stop"
timeout 120 python3 -m tuiprof stop "$sid" >> "$R" 2>&1
python3 -m tuiprof ls >> "$R" 2>&1
python3 - "$sid" >> "$R" 2>&1 <<'PY'
import json, sys
from tuiprof.sessions import runtime
info = runtime.read_info(runtime.runtime_root() / sys.argv[1]) or {}
print(json.dumps({k: info.get(k) for k in ("state", "end", "exit_status", "steps", "requests",
                                           "processes", "snapshot", "snapshot_error")}, indent=1))
doc = json.load(open(info["snapshot"]))
for v in doc.get("ranks") or [doc]:
    p = v["meta"].get("process") or {}
    st = (v.get("request_stats") or {}).get("counts")
    print(p.get("pid"), p.get("name"), "steps", v["counters"].get("tokens"),
          "requests kept", len(v.get("requests") or []), "counts", st,
          "sources", v["meta"].get("request_sources"))
PY
ls -la /tmp/dserve >> "$R"
say "done"
