#!/usr/bin/env bash
# Records the test suite's GPU data with tuiprof itself, on a CUDA machine (an H100 for the
# files in this folder): qwen3-0.6b with random weights, batch 1, a 16-token prompt, then 64
# greedy decode steps (65 new tokens: the prefill gives the first), every step traced (a
# --headless run traces every token) and kept raw (`tuiprof record` widens the ring to every
# generated token), eager and compiled.
#
#     bash tests/data/record.sh [OUT_DIR]        # default: tests/data; ~2-3 min on a cold machine
#
# Writes OUT_DIR/qwen3-0.6b_eager_decode64.json.gz and ..._compiled_decode64.json.gz (the
# recording format of docs/recording.md) and prints, for each, its size and the kernels of its
# prefill and decode steps. The tests derive their expected figures from these files.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tests/data}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in eager compiled; do
  python3 -m tuiprof record --model qwen3-0.6b --device cuda --mode "$mode" --batch 1 \
      --prompt-len 16 --max-new-tokens 65 --no-loop --seed 0 --sample-every 1 --alloc-every 1 \
      --ring-tokens 66 --export-dir "$tmp" --json "$tmp/qwen3-0.6b_$mode.json" \
      --record "$out/qwen3-0.6b_${mode}_decode64.json.gz"
done
python3 - "$out" <<'PY'
import gzip, json, os, sys
from collections import Counter
out = sys.argv[1]
for mode in ("eager", "compiled"):
    p = os.path.join(out, f"qwen3-0.6b_{mode}_decode64.json.gz")
    d = json.load(gzip.open(p))
    m = {(e, s): ts for e, s, ts in d["marks"]}
    wins = sorted((s, m[("step_start", s)], m[("step_end", s)]) for e, s in m
                  if e == "step_start" and ("step_end", s) in m)
    per = Counter()
    for r in d["records"]:
        if r[0] == "K":
            for s, a, b in wins:
                if a <= r[2] <= b:
                    per[s] += 1
                    break
    kinds = Counter(r[0] for r in d["records"])
    counts = sorted(per.values())
    print(f"{p}: {os.path.getsize(p) / 1e6:.2f} MB, {len(wins)} decode steps, kernels per step "
          f"min {counts[0] if counts else 0} median {counts[len(counts) // 2] if counts else 0} "
          f"max {counts[-1] if counts else 0}; records {dict(kinds)}; "
          f"device {d['meta'].get('device')!r}, torch {d['meta'].get('torch')!r}")
PY
