"""A step's bookkeeping cost (``step_cost.py``) across source trees, interleaved in rounds.

Each round runs this checkout's ``bench/overhead/step_cost.py`` once per tree, each in a
fresh process importing that tree's tuiprof (the script is copied into the tree's bench folder
under a dot name, :data:`COPY`, and run from there); the order rotates a round, so a busy moment
of a shared machine falls on every tree alike. It reads each process's median µs a step. The
table gives each round's figures, each tree's median of rounds and its ratio to the first
tree's, and the ratios of each round's pairs (median and range)::

    python bench/overhead/step_cost_ab.py --trees OLD_CHECKOUT,. --rounds 8 --steps 10000

``--clock cpu`` (the default) times by the thread's CPU clock, so that a shared machine's other
work does not count as the hooks' cost; ``--clock wall`` as ``step_cost.py`` does by default.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("step_cost.py")
COPY = ".step_cost_ab_copy.py"   # the script's copy inside each tree (it imports its own tree)
ROW = re.compile(r"^\|\s*\d+\s*\|\s*\d+\s*\|\s*(-?[\d.]+)")


def one(tree: Path, steps: int, inner: int, clock: str) -> float:
    """The median µs a step of one ``step_cost.py`` process importing ``tree``'s tuiprof."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    # this checkout's script (the same measurement for every tree), run as a copy inside the
    # tree: the script puts its own tree first on sys.path
    script = tree / "bench" / "overhead" / COPY
    script.write_text(SCRIPT.read_text())
    out = subprocess.run([sys.executable, str(script), "--steps", str(steps),
                          "--rounds", str(inner), "--clock", clock],
                         env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            return float(m.group(1))
    raise SystemExit(f"no figure from {tree}: {out[-300:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", required=True, help="comma-separated source trees; the first is "
                   "the reference of the ratios")
    p.add_argument("--names", default="", help="comma-separated labels (default: the paths)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--inner", type=int, default=2, help="step_cost.py's own rounds a process")
    p.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                   help="step_cost.py's clock (cpu: the thread's CPU time; a shared machine)")
    a = p.parse_args(argv)
    trees = [Path(t).resolve() for t in a.trees.split(",")]
    names = a.names.split(",") if a.names else [str(t) for t in trees]
    got: dict[str, list[float]] = {n: [] for n in names}
    print(f"| round | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for r in range(a.rounds):
        k = r % len(trees)
        order = list(range(len(trees)))[k:] + list(range(len(trees)))[:k]
        row = {}
        for i in order:
            row[names[i]] = one(trees[i], a.steps, a.inner, a.clock)
            got[names[i]].append(row[names[i]])
        print(f"| {r + 1} | " + " | ".join(f"{row[n]:.1f}" for n in names) + " |", flush=True)
    ref = names[0]
    med_ref = statistics.median(got[ref])
    print()
    print(f"| tree | µs a step: median of {a.rounds} rounds (min–max) | ratio of medians to "
          f"{ref} | per-round ratios: median (min–max) |")
    print("|---|---|---|---|")
    for n in names:
        v = got[n]
        ratios = [x / y for x, y in zip(v, got[ref])]
        print(f"| {n} | {statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f}) | "
              f"{statistics.median(v) / med_ref:.3f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}–{max(ratios):.3f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
