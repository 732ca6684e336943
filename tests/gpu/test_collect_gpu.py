"""Live collection on a real GPU (run on the GPU machine; skipped without CUDA)."""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tuiprof.profiler import Profiler, ProfilerOptions  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

TOKENS = 24


def _session(mode: str, sample_every="auto") -> tuple:
    store = SessionStore(ring_tokens=TOKENS + 2)
    prof = Profiler(store, ProfilerOptions(sample_every=sample_every, engine_kwargs=dict(
        model_spec="qwen3-0.6b", mode=mode, max_new_tokens=TOKENS + 1, loop=False)))
    prof.start()
    assert prof.wait(600), "generation did not finish"
    prof.stop()
    assert prof.status.state != "error", prof.status.message
    return store.view(), prof


@pytest.fixture(scope="module")
def eager():
    return _session("eager")


@pytest.fixture(scope="module")
def compiled():
    return _session("compiled", sample_every=1)


def test_records_arrive_and_kernel_count_is_stable(eager, compiled):
    for view, _ in (eager, compiled):
        dec = [t for t in view.tokens if t.phase == "decode" and t.done]
        assert len(dec) == TOKENS
        counts = [t.kernels for t in dec[2:]]
        assert min(counts) > 100
        assert max(counts) == min(counts), counts  # same kernels every decode step
        assert view.counters["dropped"] == 0
    # compiled decode runs inside CUDA graphs: graph kernels are attributed too
    cdec = [t for t in compiled[0].tokens if t.phase == "decode" and t.done][2:]
    assert all(t.graph_kernels > 0.9 * t.kernels for t in cdec)
    print("kernels/token eager", [t.kernels for t in eager[0].tokens][-1],
          "compiled", cdec[-1].kernels)


def test_nvml_gpm_present_and_moving(eager):
    view, _ = eager
    assert view.collectors["nvml"]["ok"], view.collectors
    sm = [s["gpm_sm_util"] for s in view.nvml if "gpm_sm_util" in s]
    assert len(sm) >= 5, "no GPM samples"
    assert max(sm) > 0.0 and max(sm) != min(sm), sm


def test_compiled_burst_sampling_keeps_valid_kernel_records():
    """Bursts of 4 traced tokens in compiled mode (kinds switched on and off): the traced
    tokens carry every kernel of the CUDA graph with plausible durations."""
    store = SessionStore(ring_tokens=64)
    prof = Profiler(store, ProfilerOptions(sample_every=8, engine_kwargs=dict(
        model_spec="qwen3-0.6b", mode="compiled", max_new_tokens=97, loop=False)))
    prof.start()
    assert prof.wait(600)
    prof.stop()
    view = store.view()
    dec = [t for t in view.tokens if t.phase == "decode" and t.done]
    sampled = [t for t in dec if t.sampled]
    assert 8 <= len(sampled) <= 16, len(sampled)
    assert all(not t.kernels for t in dec if not t.sampled)
    counts = [t.kernels for t in sampled]
    print("kernels per sampled token:", counts, "means:",
          sorted((round(a.stats.mean), a.name[:40]) for a in view.kernels.values()
                 if a.mode == "compiled" and a.phase == "decode")[-5:])
    assert set(counts) == {539}, (prof.status.message, counts[:4])
    nvjet = [a for a in view.kernels.values() if a.name.startswith("nvjet") and a.mode == "compiled"]
    # the GEMVs run ~4-6 µs each; the LM-head GEMV (151,936 x 1,024) ~110 µs
    assert nvjet and all(1_000 < a.stats.mean < 200_000 for a in nvjet), \
        [(a.name, a.stats.mean) for a in nvjet]
    busy = [t.busy_ns / 1e6 for t in sampled]
    print("burst-sampled compiled tokens:", len(sampled), "busy ms median", statistics.median(busy))
    assert 0.5 < statistics.median(busy) < 3.0
