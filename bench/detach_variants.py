"""The ``detached`` GPU workload (tests/gpu/_workloads.py) in variants, side by side, to find
what broke ``detach_between_bursts`` at the session's end on the H100 (gpu-verification §32):

    python bench/detach_variants.py full,debug,drop-only,no-flush-period --out DIR

``full`` is the product's path; ``debug`` the same under ``PYTHONMALLOC=debug`` (Python's
allocator checks: a use after free or a call without the GIL aborts there, with a
faulthandler traceback); ``drop-only`` drops the CUDA graphs on the same schedule but never
detaches CUPTI; ``no-flush-period`` is ``full`` with CUPTI's periodic flush off. The variants run
at once (correctness only, no timing), each in its own process; a table of outcomes follows.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"full": {}, "debug": {"PYTHONMALLOC": "debug"}, "drop-only": {},
            "no-flush-period": {}}
MARK = "WORKLOAD-RESULT "


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--out", default=".")
    ap.add_argument("--timeout", type=float, default=400)
    args = ap.parse_args()
    out = Path(args.out)
    procs = {}
    for v in args.variants.split(","):
        env = dict(os.environ, PYTHONFAULTHANDLER="1", **VARIANTS[v],
                   DETACH_VARIANT="full" if v == "debug" else v)
        env["PYTHONPATH"] = f"{REPO}:{REPO / 'tests' / 'gpu'}:" + env.get("PYTHONPATH", "")
        log = open(out / f"detach_{v}.log", "w")
        procs[v] = (subprocess.Popen([sys.executable, str(REPO / "tests/gpu/_workloads.py"),
                                      "detached"], cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT), log, time.perf_counter())
    print(f"{'variant':16} {'rc':>4} {'s':>5} {'detach':>6} {'drops':>5} {'traced':>6} "
          f"{'kernels':>11} {'cycles=':>7} buffers / error")
    for v, (p, log, t0) in procs.items():
        try:
            rc = p.wait(args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "kill"
        log.close()
        dt = time.perf_counter() - t0
        text = (out / f"detach_{v}.log").read_text(errors="replace")
        res = next((json.loads(line[len(MARK):]) for line in text.splitlines()
                    if line.startswith(MARK)), None)
        if res is None:
            tail = " | ".join(line.strip() for line in text.splitlines()[-6:])
            print(f"{v:16} {rc!s:>4} {dt:5.0f}  no result: {tail[-300:]}")
            continue
        s = res["session"]
        dec = [t for t in s["tokens"] if t["phase"] == "decode" and t["done"]]
        traced = [t["kernels"] for t in dec if t["sampled"] and t["mode"] == "compiled"]
        cyc = s["cycles"]
        same = sum(c == cyc[1] for c in cyc[2:]) if len(cyc) > 2 else 0
        kern = f"{min(traced)}-{max(traced)}" if traced else "-"
        err = s.get("stop_error") or s.get("error") or ""
        print(f"{v:16} {rc!s:>4} {dt:5.0f} {s.get('detaches')!s:>6} {s.get('drops')!s:>5} "
              f"{len(traced):>6} {kern:>11} {same:>3}/{max(0, len(cyc) - 2):<3} "
              f"{s.get('buffers_after_stop')} {str(err)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
