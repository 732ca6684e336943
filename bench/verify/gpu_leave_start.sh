#!/bin/bash
# Does a session left on (tuiprof run --detach) at its defaults (a quarter of the live app's
# sampling, NVML at 2 Hz) start a transformers server on the GPU as one at the live app's rates
# (--sample-every live --nvml-hz 10) and a bare one do? The three start together (qwen3-tiny);
# the seconds until each answers /health, the keepers' and programs' logs, then both stopped.
# Carry .whl (wheels.sh --serving); run from the project root: bash bench/verify/gpu_leave_start.sh
export HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$OUT/diag.txt"; }
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > /tmp/pip.txt 2>&1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export TUIPROF_RUNTIME_DIR=/tmp/rt HF_HUB_CACHE=/tmp/hfc/hub
mkdir -p /tmp/rt /tmp/hfc/hub /tmp/exA /tmp/exB
say pip
python3 -m tuiprof.engine.model_dir /tmp/m --model qwen3-tiny --device "$DEVICE" > /tmp/md.log 2>&1 \
  || tail -5 /tmp/md.log >> "$OUT/diag.txt"
say model
S="python -m transformers.cli.transformers serve /tmp/m --continuous-batching --device $DEVICE --host 127.0.0.1 --cb-num-blocks 64"
(timeout 100 python3 -m tuiprof run --detach --export-dir /tmp/exA --snapshot-every 0 -- $S --port 23401 > "$OUT/detachA.txt" 2>&1; say "A detach rc $?") &
(timeout 100 python3 -m tuiprof run --detach --export-dir /tmp/exB --snapshot-every 0 --sample-every live --nvml-hz 10 -- $S --port 23402 > "$OUT/detachB.txt" 2>&1; say "B detach rc $?") &
$S --port 23403 > "$OUT/bare.txt" 2>&1 &
BARE=$!
a=0; b=0; c=0
for i in $(seq 110); do
  [ $a = 0 ] && curl -s -m 1 127.0.0.1:23401/health > /dev/null && { a=1; say "A (leave defaults) up"; }
  [ $b = 0 ] && curl -s -m 1 127.0.0.1:23402/health > /dev/null && { b=1; say "B (live rates) up"; }
  [ $c = 0 ] && curl -s -m 1 127.0.0.1:23403/health > /dev/null && { c=1; say "bare up"; }
  [ $a$b$c = 111 ] && break
  sleep 0.5
done
say "done waiting: A=$a B=$b bare=$c"
for d in /tmp/rt/*/; do echo "== $d" >> "$OUT/diag.txt"; ls "$d" >> "$OUT/diag.txt"; cat "$d/info.json" >> "$OUT/diag.txt" 2>/dev/null; tail -c 3000 "$d/keeper.log" >> "$OUT/diag.txt" 2>/dev/null; done
for f in /tmp/exA/* /tmp/exB/*; do echo "== $f" >> "$OUT/diag.txt"; tail -c 2500 "$f" >> "$OUT/diag.txt" 2>/dev/null; done
python3 -m tuiprof ls >> "$OUT/diag.txt" 2>&1
for s in $(ls /tmp/rt); do timeout 20 python3 -m tuiprof stop "$s" >> "$OUT/diag.txt" 2>&1; done
kill $BARE 2>/dev/null
say end
