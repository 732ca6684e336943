"""What the store's split of kernels by launch (model forward vs the loop around it) costs the
CUPTI consumer thread: the same traced steps folded with model windows and without.

One eager qwen3-0.6b decode step on the H100 traces ~1,850 kernels and ~1,900 API records; the
records here have that shape (``tests/split_data.py``'s layout), launches and kernels in one
batch as a buffer brings them. Interleaved A B rounds, medians; run from the repository root::

    python bench/overhead/split_cost.py --rounds 8 --steps 64
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from split_data import STEP, records, window  # noqa: E402

from tuiprof.store import SessionStore  # noqa: E402


def fold(steps: int, split: bool, model_k: int, loop_k: int) -> float:
    """Seconds to fold ``steps`` traced steps' records (excluding building them)."""
    store = SessionStore(ring_tokens=8)
    batches = []
    corr = 1
    for i in range(steps):
        apis, kernels = records(i, corr, model_k, loop_k)
        corr += model_k + loop_k
        batches.append([r for pair in zip(apis, kernels) for r in pair])
    t = 0.0
    for i, batch in enumerate(batches):
        seq = store.begin_token("decode", "eager", i * STEP, i,
                                model=window(i) if split else None)
        store.end_token(seq, i * STEP + 900_000, 0.9)
        t0 = time.perf_counter()
        store.add_records(batch)
        t += time.perf_counter() - t0
    return t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--model-kernels", type=int, default=1810)
    p.add_argument("--loop-kernels", type=int, default=40)
    a = p.parse_args()
    n_rec = a.steps * 2 * (a.model_kernels + a.loop_kernels)
    off, on = [], []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for split in order:
            s = fold(a.steps, split, a.model_kernels, a.loop_kernels)
            (on if split else off).append(s)
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"{a.steps} traced steps of {a.model_kernels + a.loop_kernels} kernels and as many "
          f"launch records, {a.rounds} interleaved rounds")
    print(f"without model windows: {m_off / n_rec * 1e6:.2f} µs a record "
          f"({m_off / a.steps * 1e3:.2f} ms a step)")
    print(f"with model windows:    {m_on / n_rec * 1e6:.2f} µs a record "
          f"({m_on / a.steps * 1e3:.2f} ms a step); ratio {m_on / m_off:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
