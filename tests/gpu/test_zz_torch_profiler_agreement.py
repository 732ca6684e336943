"""tuiprof's kernel durations agree with torch.profiler's (run on the GPU machine).

The ``agreement`` workload (_workloads.py, a process of its own) decodes the same 8 steps of
qwen3-0.6b (same model, prompt, cache positions and tokens) 5 times under tuiprof's CUPTI
collector and 5 times under torch.profiler, alternating; per kernel name, the median over runs of
the per-run total time must agree within 5% for the kernels that carry 90% of the GPU time.
"""
from __future__ import annotations

import statistics

import pytest

from _workloads import AGREE_ROUNDS

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHARE = 0.90   # compare the kernels that carry this share of tuiprof's GPU time
BOUND = 0.05


def _per_name(runs: list[dict]) -> dict[str, tuple[set, float]]:
    """name -> (launch counts seen per run, median over runs of the run's total ns)."""
    names = set().union(*(r["totals"] for r in runs))
    return {n: ({r["totals"].get(n, (0, 0))[0] for r in runs},
                statistics.median(r["totals"].get(n, (0, 0))[1] for r in runs)) for n in names}


def test_kernel_totals_agree_with_torch_profiler(agreement_run):
    runs = agreement_run["runs"]
    ours = [r for r in runs if r["profiler"] == "tuiprof"]
    theirs = [r for r in runs if r["profiler"] == "torch.profiler"]
    assert len(ours) == len(theirs) == AGREE_ROUNDS
    assert len({tuple(r["tokens"]) for r in runs}) == 1, "runs decoded different tokens"
    assert all(r["dropped"] == 0 for r in ours)
    a, b = _per_name(ours), _per_name(theirs)
    total = sum(t for _, t in a.values())
    top, acc = [], 0.0
    for name in sorted(a, key=lambda n: -a[n][1]):
        if acc >= SHARE * total:
            break
        top.append(name)
        acc += a[name][1]
    rows, bad = [], []
    for name in top:
        counts, ta = a[name]
        counts_b, tb = b.get(name, (set(), 0.0))
        ratio = ta / tb if tb else float("inf")
        ok = abs(ratio - 1) < BOUND and len(counts | counts_b) == 1
        rows.append(f"{'  ' if ok else '!!'} {100 * ta / total:5.1f}% {ratio:7.3f}  launches "
                    f"{sorted(counts)} vs {sorted(counts_b)}  tuiprof {ta / 1e3:9.1f} µs  "
                    f"torch.profiler {tb / 1e3:9.1f} µs  {name[:90]}")
        if not ok:
            bad.append(name)
    table = (f"{len(top)} kernels carry {100 * acc / total:.1f}% of the GPU time; median per-run "
             f"totals over {AGREE_ROUNDS} runs each (ratio tuiprof / torch.profiler):\n"
             + "\n".join(rows))
    print(table)
    assert len(top) >= 5, table
    assert not bad, f"{len(bad)} kernels differ by {100 * BOUND:.0f}% or more, or in launches\n{table}"
