"""What ``tuiprof.step`` / ``tuiprof.mark_prefill`` and the request marks
(``tuiprof.request_arrived`` / ``request_token`` / ``request_finished``) cost a program that
runs without tuiprof (target: < 1 µs a call), and what a marked step costs under a session
(no collectors; a request's cost under a session is ``bench/overhead/request_cost.py``).

    python bench/overhead/marks_noop.py [--n 1000000]

Per call: the best of 7 repeats of ``n`` calls, minus an empty loop of the same length.
"""
from __future__ import annotations

import argparse
import platform
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SETUP = "import tuiprof"
CASES = {
    "with tuiprof.step('decode', tokens=8): pass": "with tuiprof.step('decode', tokens=8): pass",
    "tuiprof.mark_prefill(tokens=8)": "tuiprof.mark_prefill(tokens=8)",
    "with tuiprof.mark_prefill(): pass": "with tuiprof.mark_prefill(): pass",
    "tuiprof.request_arrived('r1', prompt_tokens=16)":
        "tuiprof.request_arrived('r1', prompt_tokens=16)",
    "tuiprof.request_token('r1')": "tuiprof.request_token('r1')",
    "tuiprof.request_finished('r1', reason='stop')": "tuiprof.request_finished('r1', reason='stop')",
}


def per_call_ns(stmt: str, n: int, setup: str = SETUP) -> float:
    best = min(timeit.repeat(stmt, setup, number=n, repeat=7))
    empty = min(timeit.repeat("pass", setup, number=n, repeat=7))
    return max(0.0, best - empty) / n * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    args = ap.parse_args()
    import tuiprof
    assert tuiprof.marks._sink is None and tuiprof.marks._requests is None
    print(f"{platform.python_implementation()} {platform.python_version()} on "
          f"{platform.machine()}, {args.n:,} calls, best of 7")
    print(f"{'without tuiprof':<48} ns/call")
    worst = 0.0
    for label, stmt in CASES.items():
        ns = per_call_ns(stmt, args.n)
        worst = max(worst, ns)
        print(f"{label:<48} {ns:7.1f}")
    # under a session: the store's bookkeeping for one step (no CUPTI, no NVML)
    setup = (SETUP + "\nfrom tuiprof.profiler import Profiler\nfrom tuiprof.spec import ProfilerOptions\n"
             "from tuiprof.store import SessionStore\n"
             "from tuiprof.program.steps import StepRecorder\n"
             "p = Profiler(SessionStore(), ProfilerOptions(cupti=False, nvml=False, "
             "alloc_every=0))\ntuiprof.marks._sink = StepRecorder(p)")
    ns = per_call_ns("with tuiprof.step('decode', tokens=8): pass", args.n // 100, setup)
    print(f"{'under a session (store work, no collectors)':<48} {ns:7.1f}")
    ok = worst < 1000.0
    print(f"without tuiprof: {'OK' if ok else 'OVER'} (< 1000 ns per mark)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
