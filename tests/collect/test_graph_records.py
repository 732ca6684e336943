"""CUPTI graph records (GRAPH_TRACE): one record per CUDA-graph launch gives every compiled step
a device span between sampling bursts. CUPTI cannot run on a CPU: the parser is fed buffers
laid out as cupti_activity.h documents ``CUpti_ActivityGraphTrace2`` and ``CUpti_ActivityAPI``,
the collector's kind switching is recorded by a stand-in, and the store gets the parsed tuples
(the real records are checked on the H100: docs/gpu-verification.md)."""
from __future__ import annotations

import struct

import pytest

from tuiprof.collect.cupti_collector import BURST, CuptiCollector
from tuiprof.collect.cupti_raw import KIND_GRAPH_TRACE, Layout, NameCache, parse_buffer
from tuiprof.store import SessionStore


def graph_record(start: int, end: int, corr: int, graph: int, stream: int = 7,
                 size: int = 56) -> bytes:
    # kind, correlationId, start, end, deviceId, graphId, contextId, streamId, reserved,
    # endDeviceId, endContextId (the last two only in the 56-byte version)
    rec = struct.pack("<IIQQIIIIQ", KIND_GRAPH_TRACE, corr, start, end, 0, graph, 1, stream, 0)
    if size == 56:
        rec += struct.pack("<II", 0, 1)
    assert len(rec) == size
    return rec


def api_record(cbid: int, start: int, end: int, corr: int) -> bytes:
    # kind (RUNTIME), cbid, start, end, processId, threadId, correlationId, returnValue
    return struct.pack("<IIQQIIII", 5, cbid, start, end, 1, 2, corr, 0)


@pytest.mark.parametrize("size", [56, 48])
def test_graph_records_parse_in_a_mixed_buffer(size):
    data = b"".join([graph_record(1000, 3900, 21, 4, size=size), api_record(211, 900, 950, 21),
                     graph_record(5000, 7950, 22, 4, size=size),
                     graph_record(9000, 9100, 23, 9, stream=3, size=size)])
    layout = Layout()
    out = parse_buffer(data, layout, NameCache(), {(2, 211): "cudaGraphLaunch"})
    assert layout.sizes[KIND_GRAPH_TRACE] == size
    assert [r for r in out if r[0] == "G"] == [("G", 1000, 3900, 21, 4, 7),
                                                ("G", 5000, 7950, 22, 4, 7),
                                                ("G", 9000, 9100, 23, 9, 3)]
    assert ("R", "cudaGraphLaunch", 900, 950, 21) in out


def _step(store: SessionStore, start: int, end: int, sampled: bool) -> int:
    seq = store.begin_token("decode", "compiled", start, step=start, sampled=sampled)
    store.end_token(seq, end, host_ms=(end - start) / 1e6, gpu_ms=(end - start) / 1e6)
    return seq


def test_every_untraced_compiled_step_gets_its_graph_span():
    store = SessionStore(series_len=5)
    # four untraced steps with one graph launch each, one traced step with kernels, then
    # enough steps for all of them to leave the window (their figures join the running stats)
    for i in range(4):
        _step(store, 10_000 * i, 10_000 * i + 9_000, sampled=False)
    traced = _step(store, 40_000, 49_000, sampled=True)
    store.add_records([("G", 10_000 * i + 500, 10_000 * i + 3_500 + 10 * i, 30 + i, 4, 7)
                       for i in range(4)])
    kernel = ("K", "nvjet", 0, 0, 1, 1, 1, 128, 1, 1, 32, 0, 7, 0, 4)
    store.add_records([kernel[:2] + (40_500, 42_000) + kernel[4:],
                       kernel[:2] + (42_100, 43_510) + kernel[4:]])
    rows = {r.seq: r for r in store.view().tokens}
    assert [rows[s].graphs for s in range(4)] == [1, 1, 1, 1]
    assert rows[1].graph_last_end_ns - rows[1].graph_first_ns == 3_010
    assert rows[traced].graphs == 0 and rows[traced].kernels == 2
    view = store.view()
    assert view.counters["unsampled"] == 0      # graph records are never dropped by sampling
    assert view.counters["graphs"] == 4
    for i in range(5):
        _step(store, 60_000 + 10_000 * i, 69_000 + 10_000 * i, sampled=False)
    ts = store.view().token_stats[("decode", "compiled")]
    assert ts["graph_span_ns"].count == 4
    assert ts["graph_span_ns"].median == pytest.approx(3_015, abs=10)
    assert ts["span_ns"].count == 1 and ts["span_ns"].median == pytest.approx(3_010, rel=0.01)
    assert ts["kernels"].count == 1             # kernel counts: the traced step only


class Calls:
    class ActivityKind:
        RUNTIME, DRIVER, GRAPH_TRACE = 10, 11, KIND_GRAPH_TRACE

    def __init__(self) -> None:
        self.kinds: list[tuple[str, int]] = []

    def activity_enable(self, k):
        self.kinds.append(("on", int(k)))

    def activity_disable(self, k):
        self.kinds.append(("off", int(k)))

    def activity_flush_all(self, flag):
        pass


def test_graph_records_are_on_exactly_while_kernels_are_off():
    c = CuptiCollector(SessionStore(), sample_every=8, api=False, graph_trace=True)
    calls = Calls()
    c._cupti = calls
    c._device_kinds = [1, 2, 3]
    c._device_on = c.attached = True   # as after start()
    period = 8 * BURST
    for seq in range(2 * period):
        c.on_token_start(seq)
        assert c._graphs_on == (not c._device_on)
    # kernels off after the first burst, graph records on; at the next warm-up graph records
    # go off *before* the kernel kinds come on
    first_off = calls.kinds.index(("off", 3))
    assert calls.kinds[first_off + 1] == ("on", KIND_GRAPH_TRACE)
    again = calls.kinds.index(("off", KIND_GRAPH_TRACE))
    assert calls.kinds[again + 1:again + 4] == [("on", 1), ("on", 2), ("on", 3)]
    # eager: no graphs, never switched
    e = CuptiCollector(SessionStore(), sample_every=8, api=False)
    e._cupti, e._device_kinds, e._device_on = Calls(), [1], True
    for seq in range(period):
        e.on_token_start(seq)
    assert ("on", KIND_GRAPH_TRACE) not in e._cupti.kinds


def test_a_refused_graph_kind_is_said_once_and_collection_goes_on():
    class Refuses(Calls):
        def activity_enable(self, k):
            if int(k) == KIND_GRAPH_TRACE:
                raise RuntimeError("CUPTI_ERROR_NOT_COMPATIBLE")
            super().activity_enable(k)

    store = SessionStore()
    c = CuptiCollector(store, sample_every=8, api=False, graph_trace=True)
    c._cupti, c._device_kinds, c._device_on, c.attached = Refuses(), [1], True, True
    for seq in range(3 * 8 * BURST):
        c.on_token_start(seq)
    events = [e for e in store.view().events if "graph" in e[3]]
    assert len(events) == 1 and "NOT_COMPATIBLE" in events[0][3]
    assert not c._graphs_on


def test_the_snapshot_says_where_each_step_figure_comes_from(tmp_path):
    from tuiprof.export.snapshot import read_snapshot, write_snapshot
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions

    store = SessionStore()
    Profiler(store, ProfilerOptions(cupti=False, nvml=False))
    seq = store.begin_token("decode", "compiled", 1_000, step=0, sampled=False)
    store.end_token(seq, 9_000, host_ms=0.008, gpu_ms=0.007)
    store.add_records([("G", 1_500, 7_500, 3, 4, 7)])
    path = tmp_path / "s.json"
    write_snapshot(store.view(), path)
    view = read_snapshot(path)
    sources = view.meta["step_time_sources"]
    assert set(sources) == {"gpu_ms", "span_ns", "graph_span_ns"}
    assert "CUDA events" in sources["gpu_ms"] and "GRAPH_TRACE" in sources["graph_span_ns"]
    row = view.tokens[-1]
    assert row.gpu_ms == 0.007 and row.graphs == 1
    assert row.graph_last_end_ns - row.graph_first_ns == 6_000
