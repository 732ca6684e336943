"""A step's kernels split by where they were launched: inside the host window of its model
forward (the model's) or outside it (the loop's own), by each kernel's CUPTI API record.

The records are tuples in the layout of ``tuiprof.store.records`` (CUPTI's own fields, as the
raw-buffer parser and the H100 recordings give them); the store, the profiler, the analysis and
the snapshot are the real ones. The real records come from the H100 (docs/gpu-verification.md).
"""
from __future__ import annotations

import json

import pytest

from tuiprof.analysis.findings import find
from tuiprof.analysis.model_split import model_split
from tuiprof.engine.events import TokenEvent
from tuiprof.export.snapshot import SCHEMA_VERSION, read_snapshot, write_snapshot
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore
from tuiprof.store import ingest as store_ingest

from split_data import STEP, US, split_store
from split_data import api as _api
from split_data import kernel as _kernel
from split_data import records as _records
from split_data import window as _window


def _step(store: SessionStore, i: int, model: tuple[int, int] | None, mode: str = "eager") -> int:
    return store.begin_token("decode", mode, i * STEP, i, model=model)


@pytest.mark.parametrize("order", ["api-first", "kernels-first", "interleaved"])
def test_kernels_split_by_launch_whatever_order_the_records_come_in(order):
    store = SessionStore(ring_tokens=8)
    corr = 1
    for i in range(4):
        seq = _step(store, i, _window(i))
        apis, kernels = _records(i, corr, model_kernels=5, loop_kernels=2)
        corr += 7
        if order == "api-first":
            store.add_records(apis + kernels)
        elif order == "kernels-first":   # another buffer held the launches: they come later
            store.add_records(kernels)
            store.add_records(apis)
        else:
            store.add_records([r for pair in zip(kernels, apis) for r in pair])
        store.end_token(seq, i * STEP + 900 * US, 0.9)
    rows = store.view(raw=False).tokens
    assert [(r.kernels, r.model_kernels, r.loop_kernels) for r in rows] == [(7, 5, 2)] * 4
    assert [r.model_kernel_ns for r in rows] == [5 * 4 * US] * 4
    assert [r.loop_kernel_ns for r in rows] == [2 * 11 * US] * 4
    aggs = {k[0]: a for k, a in store.view(raw=False).kernels.items()}
    assert (aggs["fill"].loop_launches, aggs["fill"].loop_ns) == (8, 8 * 11 * US)
    assert aggs["gemv"].loop_launches == 0
    split = model_split(store.view(raw=False))["eager"]
    assert (split.steps, split.model_kernels, split.loop_kernels) == (4, 5.0, 2.0)
    assert split.model_ms == pytest.approx(0.020) and split.loop_ms == pytest.approx(0.022)
    assert split.coverage == 1.0
    assert split.top_loop[0][:2] == ("fill", 2.0)


def test_a_kernel_counts_for_the_step_that_launched_it():
    """A loop that does not sync every step (transformers' deferred stop check) lets step i's
    last kernels run in step i+1's host window: the split follows the launch, not the run."""
    store = SessionStore(ring_tokens=8)
    s0 = _step(store, 0, _window(0))
    store.end_token(s0, 900 * US, 0.9)
    s1 = _step(store, 1, _window(1))
    # launched by step 0's loop at 800 µs, run at 1,050 µs (inside step 1)
    store.add_records([_api("cudaLaunchKernel", 800 * US, 41), _kernel("argmax", 1050 * US,
                                                                       3 * US, 41)])
    store.end_token(s1, STEP + 900 * US, 0.9)
    r0, r1 = store.view(raw=False).tokens
    assert (r0.kernels, r0.loop_kernels, r0.model_kernels) == (0, 1, 0)
    assert (r1.kernels, r1.loop_kernels, r1.model_kernels) == (1, 0, 0)


@pytest.mark.parametrize("launch_first", [True, False])
def test_graph_kernels_follow_their_graph_launch(launch_first):
    """Kernels of a CUDA graph replay all carry the graph launch's correlation id, whether the
    launch record comes before them or after (seen on the H100: a burst's first buffer)."""
    store = SessionStore(ring_tokens=8)
    seq = _step(store, 0, _window(0), mode="compiled")
    launch = [_api("cudaGraphLaunch", 200 * US, 9), _api("cudaLaunchKernel", 700 * US, 10)]
    kernels = [_kernel(f"triton_{k}", 210 * US + k * 5 * US, 4 * US, 9, graph=3)
               for k in range(6)] + [_kernel("fill", 710 * US, 11 * US, 10)]
    store.add_records(launch + kernels if launch_first else kernels + launch)
    store.end_token(seq, 900 * US, 0.9)
    row = store.view(raw=False).tokens[0]
    assert (row.model_kernels, row.loop_kernels, row.graph_kernels) == (6, 1, 6)


def test_steps_without_a_model_window_are_not_split_and_cost_no_bookkeeping():
    store = SessionStore(ring_tokens=8)
    seq = _step(store, 0, None)
    apis, kernels = _records(0, 1, 3, 1)
    store.add_records(apis + kernels)
    store.end_token(seq, 900 * US, 0.9)
    row = store.view(raw=False).tokens[0]
    assert (row.kernels, row.model_kernels, row.loop_kernels) == (4, 0, 0)
    assert not store._launch_ts and not store._launch_pending   # nothing remembered
    assert model_split(store.view(raw=False)) == {}


def test_launches_never_matched_are_bounded_and_counted(monkeypatch):
    monkeypatch.setattr(store_ingest, "LAUNCH_LEN", 4)
    store = SessionStore(ring_tokens=8)
    seq = _step(store, 0, _window(0))
    store.add_records([_kernel("k", 200 * US + i * US, US, 100 + i) for i in range(10)])
    store.end_token(seq, 900 * US, 0.9)
    view = store.view(raw=False)
    assert view.counters["launch_unmatched"] == 6
    assert len(store._launch_pending) == 4 and store._pending_n == 4
    assert model_split(view)["eager"].coverage == 0.0   # said, not hidden


def test_steps_that_left_the_window_still_count():
    store = SessionStore(ring_tokens=4, series_len=4)
    corr = 1
    for i in range(10):
        seq = _step(store, i, _window(i))
        apis, kernels = _records(i, corr, 3, 1)
        corr += 4
        store.add_records(apis + kernels)
        store.end_token(seq, i * STEP + 900 * US, 0.9)
    view = store.view(raw=False)
    assert len(view.tokens) == 4
    split = model_split(view)["eager"]
    assert (split.steps, split.model_kernels, split.loop_kernels) == (10, 3.0, 1.0)


def test_the_profiler_gives_each_step_its_own_window():
    """The engine's order (token_started, token_launched(window), token_finished) with the
    store work overlapped, and a step source whose window reaches the store after the step was
    stored (no launch point), land on the right rows."""
    store = SessionStore(ring_tokens=8)
    prof = Profiler(store, ProfilerOptions(cupti=False, nvml=False, alloc_every=0))
    for i in range(3):
        t0 = i * STEP
        prof.token_started("decode", "eager", i, 0, t0)
        prof.token_launched((t0 + 10 * i + 5, t0 + 10 * i + 8))
        prof.token_finished(TokenEvent(i, i, "decode", "eager", 1, t0, t0 + 900 * US, 0.9,
                                       None, 0))
    prof.state_changed("done")
    # no overlap (a source that calls token_launched only once the step ended)
    prof2 = Profiler(SessionStore(ring_tokens=8), ProfilerOptions(cupti=False, nvml=False,
                                                                 alloc_every=0, overlap=False))
    prof2.token_started("decode", "eager", 0, 0, 0)
    prof2.token_finished(TokenEvent(0, 0, "decode", "eager", 1, 0, 900, 0.9, None, 0))
    prof2.token_launched((100, 200))
    got = [(r.model_start_ns - r.start_ns, r.model_end_ns - r.start_ns)
           for r in store.view(raw=False).tokens]
    assert got == [(5, 8), (15, 18), (25, 28)]
    row = prof2.store.view(raw=False).tokens[0]
    assert (row.model_start_ns, row.model_end_ns) == (100, 200)


def test_the_split_survives_a_snapshot_and_old_snapshots_still_load(tmp_path):
    view = split_store().view()
    findings = find(view)
    loop = next(f for f in findings if f.id == "loop-kernels")
    assert loop.title.startswith("generate() launches ")
    assert loop.numbers["loop_kernels_per_step"] == 20
    path = write_snapshot(view, tmp_path / "s.json", findings)
    back = read_snapshot(path)
    assert model_split(back) == model_split(view)
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == SCHEMA_VERSION
    # a version 3 document (no model window anywhere) loads, with nothing split
    doc["schema_version"] = 3
    for t in doc["tokens"]:
        t.pop("attached")   # version 5
        for k in ("model_start_ns", "model_end_ns", "model_kernels", "model_kernel_ns",
                  "loop_kernels", "loop_kernel_ns"):
            t.pop(k)
    for k in doc["kernels"]:
        k.pop("loop_launches")
        k.pop("loop_ns")
    for t in doc["token_stats"]:
        for k in ("model_kernels", "model_kernel_ns", "loop_kernels", "loop_kernel_ns"):
            t["stats"].pop(k, None)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert model_split(read_snapshot(old)) == {}
