"""How long importing transformers' Qwen3 code takes, each way of tuiprof/engine/imports.py.

Every run is a fresh interpreter: it imports torch (timed apart), then times
``import_model_classes("qwen3")`` under ``TUIPROF_IMPORTS=<way>`` and lists which heavy
packages ended up imported. Rounds run every way once, the order rotating; the table gives
medians and the ratio to ``none`` (the plain ``from transformers import Qwen3ForCausalLM``).
Runs on a CPU or a GPU machine alike (the import chain is the same; nothing touches CUDA)::

    python bench/verify/import_ways.py --rounds 5
    python bench/verify/import_ways.py --ways none,hide,direct,hide+direct --rounds 7

``--importtime FILE``: one more run of ``none`` under ``python -X importtime``, raw output to
FILE, and the 25 slowest modules printed with who imported them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
HEAVY = ("sklearn", "scipy", "sympy", "torch._dynamo", "torch.distributed.tensor",
         "torch._inductor", "numpy", "httpx")
CODE = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from tuiprof.engine.imports import import_model_classes
import_model_classes("qwen3")
t2 = time.perf_counter()
print(json.dumps({"torch_s": t1 - t0, "model_code_s": t2 - t1,
                  "loaded": [m for m in %r if m in sys.modules], "modules": len(sys.modules)}))
""" % (HEAVY,)


def one(way: str) -> dict:
    env = dict(os.environ, TUIPROF_IMPORTS=way.replace("+", ","))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"{way}: {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def importtime(path: Path) -> str:
    env = dict(os.environ, TUIPROF_IMPORTS="none")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", CODE], env=env,
                       capture_output=True, text=True, timeout=300)
    path.write_text(r.stderr)
    rows = []
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m[2]) / 1e6, len(m[3]) // 2, m[4]))
    out = []
    for i, (cum, depth, name) in sorted(enumerate(rows), key=lambda x: -x[1][0])[:25]:
        parent = next((n for _, d, n in rows[i + 1:] if d < depth), "")
        out.append(f"{cum:6.2f} s  {name}  (from {parent})")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", default="none,hide,direct,hide+direct")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--importtime", help="file for a -X importtime run of the plain import")
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    ways = args.ways.split(",")
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for r in range(args.rounds):
        order = ways[r % len(ways):] + ways[:r % len(ways)]
        for w in order:
            runs[w].append(one(w))
        print(f"round {r + 1}: " + ", ".join(f"{w} {runs[w][-1]['model_code_s']:.2f}"
                                             for w in ways), flush=True)
    base = statistics.median(x["model_code_s"] for x in runs[ways[0]])
    print(f"\nimporting Qwen3's model code after torch; median of {args.rounds} fresh "
          f"processes; python {sys.version.split()[0]}")
    try:
        import importlib.metadata as md
        print(f"transformers {md.version('transformers')}, torch {md.version('torch')}")
    except Exception:
        pass
    print(f"| way | model code s (min–max) | / {ways[0]} | torch s | modules | heavy packages imported |")
    print("|---|---|---|---|---|---|")
    for w in ways:
        xs = [x["model_code_s"] for x in runs[w]]
        med = statistics.median(xs)
        print(f"| {w} | {med:.2f} ({min(xs):.2f}–{max(xs):.2f}) | {med / base:.2f} | "
              f"{statistics.median(x['torch_s'] for x in runs[w]):.2f} | "
              f"{runs[w][-1]['modules']} | {', '.join(runs[w][-1]['loaded'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    if args.importtime:
        print(f"\nslowest imports of the plain path (-X importtime, cumulative):\n"
              f"{importtime(Path(args.importtime))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
