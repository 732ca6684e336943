"""Server throughput with tuiprof against without it, whole processes, interleaved (target:
at most 5 % lower with tuiprof), at a fixed concurrency or rate.

Each round runs the same load twice, in alternating order: the load program alone
(``python -m tuiprof.engine.serve_load``: the model under transformers' continuous batching,
requests generated in-process) and ``tuiprof serve --headless`` around the very same program
(CUPTI and NVML at the live app's defaults: ``--sample-every live``). Throughput is what the
load program measures over its load phase (after its warm-up request): requests/s and output
tokens/s. Reports per-round ratios, their median and the spread.

    python bench/overhead/serve_overhead.py --model DIR_OR_NAME --device cuda --concurrency 16 \\
        --requests 256 --prompt-len 128 --output-len 64 --rounds 4 --out out/serve_overhead
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DONE = "tuiprof-serve: done "


def load_args(a: argparse.Namespace) -> list[str]:
    out = ["--model", a.model, "--requests", str(a.requests), "--prompt-len", a.prompt_len,
           "--output-len", a.output_len, "--seed", "0"]
    out += ["--rate", str(a.rate)] if a.rate else ["--concurrency", str(a.concurrency)]
    for flag in ("device", "num_blocks", "max_batch_tokens"):
        v = getattr(a, flag)
        if v is not None:
            out += [f"--{flag.replace('_', '-')}", str(v)]
    return out


def run(cmd: list[str], log: Path, env: dict) -> dict:
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    log.write_text(p.stdout + p.stderr)
    line = next((ln for ln in (p.stdout + p.stderr).splitlines() if ln.startswith(DONE)), None)
    if line is None:
        raise SystemExit(f"no result from {' '.join(cmd[:6])}…; see {log}")
    res = json.loads(line[len(DONE):])
    res["process_s"] = time.monotonic() - t0
    return res


def write_summary(out: Path, rows: list, a: argparse.Namespace) -> dict:
    ratios = [x["slowdown"] for x in rows]
    med = statistics.median(ratios)
    summary = {"median_slowdown": med, "min": min(ratios), "max": max(ratios), "rounds": rows,
               "target": 1.05, "ok": med <= 1.05, "load": load_args(a)}
    (out / "serve_overhead.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-len", default="128")
    ap.add_argument("--output-len", default="64")
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--max-batch-tokens", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tuiprof-args", default="--sample-every live",
                    help="tuiprof serve's collection options (default: the live app's, NVML "
                         "included; the 2026-11-26 H100 runs passed --no-nvml as well)")
    ap.add_argument("--out", default="out/serve_overhead")
    ap.add_argument("--deadline", type=float, default=0,
                    help="start no round after this many seconds (0: no limit)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bare = [sys.executable, "-m", "tuiprof.engine.serve_load", *load_args(a)]
    prof = [sys.executable, "-m", "tuiprof", "serve", "--headless", *a.tuiprof_args.split(),
            "--json", "SNAP", *load_args(a)]
    rows = []
    t_start = time.monotonic()
    for r in range(a.rounds):
        if a.deadline and rows and time.monotonic() - t_start > a.deadline:
            print(f"round {r}: not started, past the {a.deadline:g} s deadline", flush=True)
            break
        order = ("bare", "tuiprof") if r % 2 == 0 else ("tuiprof", "bare")
        got = {}
        for which in order:
            cmd = bare if which == "bare" else [x if x != "SNAP" else str(out / f"r{r}.json")
                                                  for x in prof]
            got[which] = run(cmd, out / f"round{r}-{which}.log", env)
        ratio = got["bare"]["requests_per_s"] / got["tuiprof"]["requests_per_s"]
        rows.append({"round": r, "order": order, **{f"{k}_rps": v["requests_per_s"]
                                                     for k, v in got.items()},
                     "slowdown": ratio})
        print(f"round {r} ({order[0]} first): bare {got['bare']['requests_per_s']:.2f} req/s, "
              f"tuiprof {got['tuiprof']['requests_per_s']:.2f} req/s, bare/tuiprof "
              f"{ratio:.3f}", flush=True)
        summary = write_summary(out, rows, a)   # after every round: a cut run keeps its rounds
    if not rows:
        print("no round ran")
        return 1
    med = summary["median_slowdown"]
    ratios = [x["slowdown"] for x in rows]
    print(f"throughput without/with tuiprof: median {med:.3f} ({min(ratios):.3f}-"
          f"{max(ratios):.3f}) over {len(rows)} rounds; target <= 1.05: "
          f"{'OK' if med <= 1.05 else 'OVER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
