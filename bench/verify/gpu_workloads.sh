#!/usr/bin/env bash
# The study workloads' GPU points (docs/workloads.md), in one short run (about 1.5-2 minutes on an H100):
#  (a) the CS336 size sweep: gpt2-small..gpt2-2.7b x L=128,256,512,1024 x inference,
#      train-forward, train-backward, eager, bf16, batch 4, under --memory-limit 12 (GiB), so
#      the large training cells really run out of memory while the small ones run;
#  (b) deepseek-ocr-decoder, headless eager decode of 32 tokens: its top kernels and the MoE
#      routing kernels (top-k, sort, index gather/scatter).
#
# Usage (repository root, package importable): OUT=/tmp/out bash bench/verify/gpu_workloads.sh
# Files in $OUT: deepseek-ocr-decoder.json (snapshot), sweep/ (sweep.csv, sweep.md,
# sweep.json, time.csv, kernels.csv, attention.csv), sweep_progress.log, deepseek.log.
# Overrides: BATCH (4), WARMUP (1), ITERS (3), DTYPE (bfloat16), MEMLIMIT (12), TOKENS (32),
# BUDGET (seconds for the whole script, default 225: the sweep gets what (b) left),
# PROFILE (1; 0 adds --no-profile: no kernel table, about a third faster).
# TINY=1: the same commands on the CPU with the tiny variants (gpt2-tiny, deepseek-tiny),
# plus the kernel printer on a replay of the H100 qwen3 recording (a CPU run has no kernels).
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$(date +%s)
TINY=${TINY:-0}
BATCH=${BATCH:-4}; WARMUP=${WARMUP:-1}; ITERS=${ITERS:-3}; DTYPE=${DTYPE:-bfloat16}
MEMLIMIT=${MEMLIMIT:-12}; TOKENS=${TOKENS:-32}; BUDGET=${BUDGET:-225}; PROFILE=${PROFILE:-1}
NOPROF=""; [ "$PROFILE" = 0 ] && NOPROF="--no-profile"
if [ "$TINY" = 1 ]; then
  MODELS=gpt2-tiny; SEQS=8,16,32,64; LMAX=64; DEVICE="--device cpu"; DTYPE=${DTYPE_TINY:-float32}
  DS=deepseek-tiny; TOKENS=${TOKENS_TINY:-8}; BATCH=${BATCH_TINY:-2}
  # no memory limit on the CPU: one injected OOM exercises the OOM path and the tables
  export TUIPROF_SWEEP_FAULT=${TUIPROF_SWEEP_FAULT:-oom:gpt2-tiny:64:train-backward}
else
  MODELS=gpt2-small,gpt2-medium,gpt2-large,gpt2-xl,gpt2-2.7b; SEQS=128,256,512,1024; LMAX=1024; DEVICE=""
  DS=deepseek-ocr-decoder
fi
log() { echo; echo "=== $* (+$(( $(date +%s) - T0 )) s)"; }

# Prints a snapshot's decode summary, top kernels and the routing kernels (top-k, sort, index).
kernels_py=$(cat <<'PY'
import re, sys
from tuiprof.analysis import mode_summaries, top_kernels
from tuiprof.export.snapshot import read_snapshot

view = read_snapshot(sys.argv[1])
for mode, s in mode_summaries(view).items():
    print(f"{view.meta.get('model')} {mode} decode: {s.tokens} tokens, median {s.ms_median:.2f} ms/token, "
          f"{s.kernels_per_token:.0f} kernels/token, GPU busy {100 * s.busy_fraction:.0f}%")
rows = top_kernels(view, mode=None, n=100000)
if not rows:
    print("no kernel records (no CUPTI here: a CPU run)")
    sys.exit(0)
line = "  {:>6} {:>7} {:>9}  {:<24} {:<13} {}"
print("top 15 decode kernels:")
print(line.format("share", "per-tok", "mean us", "category", "library", "kernel"))
for k in rows[:15]:
    print(line.format(f"{100 * k.share:.1f}%", f"{k.per_token:.1f}", f"{k.mean_us:.2f}", k.info.category,
                      k.info.library, k.info.short[:60]))
GROUPS = (("top-k", re.compile(r"top-?k", re.I)), ("sort", re.compile(r"sort", re.I)),
          ("index", re.compile(r"index|gather|scatter", re.I)))
found = {g: [] for g, _ in GROUPS}
for k in rows:
    fn = k.info.demangled.split("(", 1)[0].split("<", 1)[0]
    for g, rx in GROUPS:
        if rx.search(k.info.short) or rx.search(fn):
            found[g].append(k)
            break
print("routing kernels (top-k / sort / index):")
print(line.format("share", "per-tok", "mean us", "category", "library", "kernel"))
for g, _ in GROUPS:
    for k in found[g]:
        print(line.format(f"{100 * k.share:.1f}%", f"{k.per_token:.1f}", f"{k.mean_us:.2f}", k.info.category,
                          k.info.library, k.info.short[:60]))
print("routing check: " + ", ".join(
    f"{g} {'yes' if found[g] else 'MISSING'} ({sum(k.per_token for k in found[g]):.1f} launches/token, "
    f"{100 * sum(k.share for k in found[g]):.1f}%)" for g, _ in GROUPS))
PY
)

# Peak memory (GiB) or status per model/pass x sequence length, from sweep.csv.
peaks_py=$(cat <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
seqs = sorted({int(r["seq_len"]) for r in rows})
table = {}
for r in rows:
    v = f"{float(r['peak_mem_mib']) / 1024:.1f}" if r["status"] == "ok" and r["peak_mem_mib"] else r["status"].upper()
    table.setdefault((r["model"], r["pass"], r["batch"]), {})[int(r["seq_len"])] = v
print("| model | pass | batch | " + " | ".join(f"L={L}" for L in seqs) + " |")
print("|---|---|---|" + "---|" * len(seqs))
for (m, p, b), d in table.items():
    print(f"| {m} | {p} | {b} | " + " | ".join(d.get(L, "") for L in seqs) + " |")
n = {s: sum(r["status"] == s for r in rows) for s in ("ok", "oom", "error", "skipped")}
print(f"cells: {len(rows)}: " + ", ".join(f"{k} {v}" for k, v in n.items()))
for r in rows:
    if r["status"] == "error":
        print(f"ERROR {r['model']} L={r['seq_len']} {r['pass']}: {r['error'][:160]}")
PY
)

# The sweep's kernels.csv rows of one sequence length, names shortened (kernel names hold commas).
kernels_csv_py=$(cat <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["seq_len"] == sys.argv[2]]
print("| model | L | pass | dominant | % | GEMM % | top non-GEMM | % |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    cut = lambda s: s if len(s) <= 48 else s[:47] + "~"
    print(f"| {r['model']} | {r['seq_len']} | {r['pass']} | {cut(r['dominant'])} | {r['dominant %']} | "
          f"{r['GEMM %']} | {cut(r['top non-GEMM'])} | {r['non-GEMM %']} |")
PY
)

rm -rf "$OUT/sweep" "$OUT/$DS.json"  # no stale results if a step fails
log "versions"
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')"

log "(b) $DS headless eager decode, $TOKENS tokens"
timeout 100 $PY -m tuiprof --model $DS --headless --sample-every 1 --mode eager --max-new-tokens $((TOKENS + 1)) \
  --ring-tokens 8 $DEVICE --json "$OUT/$DS.json" > "$OUT/deepseek.log" 2>&1
echo "exit $?"; tail -4 "$OUT/deepseek.log"
[ -f "$OUT/$DS.json" ] && timeout 60 $PY -c "$kernels_py" "$OUT/$DS.json"
if [ "$TINY" = 1 ]; then
  FIX=${FIXTURE:-tests/data/qwen3-0.6b_eager_decode64.json.gz}
  if [ -f "$FIX" ]; then
    log "(TINY) kernel printer on a replay of $(basename "$FIX")"
    $PY -m tuiprof replay "$FIX" --headless --json "$OUT/replay.json" > /dev/null 2>&1
    $PY -c "$kernels_py" "$OUT/replay.json"
  fi
fi

LEFT=$(( BUDGET - ($(date +%s) - T0) - 10 ))
[ $LEFT -lt 60 ] && LEFT=60
log "(a) sweep $MODELS x L=$SEQS, batch $BATCH, $DTYPE, eager, --memory-limit $MEMLIMIT, warmup $WARMUP, iters $ITERS (timeout ${LEFT}s)"
timeout $LEFT $PY -m tuiprof sweep --models $MODELS --seq-lens $SEQS \
  --passes inference,train-forward,train-backward --mode eager --batch $BATCH --dtype $DTYPE \
  --memory-limit $MEMLIMIT --warmup $WARMUP --iters $ITERS $NOPROF $DEVICE --out "$OUT/sweep" \
  > "$OUT/sweep_stdout.txt" 2> "$OUT/sweep_progress.log"
code=$?
echo "exit $code (1 = some cells OOM, expected; 124 = timed out: no files written)"
grep -v "^USDT" "$OUT/sweep_progress.log" | tail -2
if [ -f "$OUT/sweep/sweep.csv" ]; then
  grep -v "^|---" "$OUT/sweep_stdout.txt" | head -40
  grep -m2 -E "^(- memory|[0-9]+ cells in)" "$OUT/sweep/sweep.md"
  log "peak memory, GiB (torch.cuda.max_memory_allocated; OOM = over ${MEMLIMIT} GiB)"
  $PY -c "$peaks_py" "$OUT/sweep/sweep.csv"
  log "kernels (dominant, GEMM %, top non-GEMM) of the L=$LMAX cells that ran"
  $PY -c "$kernels_csv_py" "$OUT/sweep/kernels.csv" $LMAX
fi
log "done"
