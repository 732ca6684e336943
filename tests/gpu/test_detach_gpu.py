"""Dropping CUDA graphs in place, and CUPTI attached for compiled bursts only
(``ProfilerOptions.detach_between_bursts``), on a real
GPU: the session survives every finalize (a CUPTI finalized under CUDA graphs it saw kills
their next replay unless they are dropped first), bursts still carry every kernel of the graph
with plausible durations, and the graphs recorded again decode the same tokens."""
from __future__ import annotations

import statistics

import pytest

from _workloads import DETACH_CYCLE, DETACH_CYCLES

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_dropped_graphs_are_recorded_again_and_compute_the_same(rerecord_run):
    """tuiprof.engine.graphs alone, without CUPTI: every drop finds the graphs recorded since
    the last one, and the outputs after each re-recording equal the first ones."""
    r = rerecord_run
    assert all(n >= 1 for n in r["dropped"]), r["dropped"]
    assert r["max_abs_diff"] == [0.0] * len(r["max_abs_diff"]), r
    assert r["eager_diff"] < 1e-2, r


def test_detached_bursts_survive_and_keep_every_kernel(detached_run):
    s = detached_run["session"]
    assert s["error"] is None, s["message"]
    assert s["detaches"] >= 2 * DETACH_CYCLES, s["detaches"]  # a detach after every burst
    dec = [t for t in s["tokens"] if t["phase"] == "decode" and t["done"]]
    sampled = [t for t in dec if t["sampled"] and t["mode"] == "compiled"]
    counts = [t["kernels"] for t in sampled]
    print("detaches", s["detaches"], "sampled compiled steps", len(sampled), "kernels", counts)
    assert len(sampled) >= 8 and min(counts) > 100 and len(set(counts)) == 1, counts
    assert all(not t["kernels"] for t in dec if not t["sampled"])
    nvjet = s["nvjet_mean_ns"]
    assert nvjet and all(1_000 < m < 200_000 for m in nvjet.values()), nvjet
    busy = statistics.median(t["busy_ns"] / 1e6 for t in sampled)
    assert 0.5 < busy < 3.0, busy
    assert s["dropped"] == 0
    assert s["stop_error"] is None, s["stop_error"]


def test_graphs_recorded_again_decode_the_same_tokens(detached_run):
    cycles = detached_run["session"]["cycles"]
    assert len(cycles) == DETACH_CYCLES
    first = cycles[1]  # cycle 0 includes the compile's first steps
    assert len(first) == DETACH_CYCLE
    assert all(c == first for c in cycles[2:]), [sum(a != b for a, b in zip(c, first))
                                                  for c in cycles[2:]]
