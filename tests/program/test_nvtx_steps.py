"""NVTX ranges as steps: marker records parsed from raw buffers laid out as in CUPTI's
``cupti_activity.h`` (CUpti_ActivityMarker2), and steps built from them on the consumer
thread before the records they hold, whichever buffer comes first."""
from __future__ import annotations

import ctypes
import struct

import pytest

from tuiprof.collect.cupti_raw import (KIND_MARKER, MARKER_FLAG_END, MARKER_FLAG_START, Layout,
                                       NameCache, parse_buffer)
from tuiprof.program.nvtx_steps import NvtxSteps
from tuiprof.program.steps import StepRecorder

from .conftest import rows

_KEEP: list = []   # C strings whose addresses the records hold


def _cstr(text: str | None) -> int:
    if text is None:
        return 0
    buf = ctypes.create_string_buffer(text.encode())
    _KEEP.append(buf)
    return ctypes.addressof(buf)


def marker(flags: int, ts: int, mid: int, name: str | None = None, domain: str | None = None,
           thread: int = 77) -> bytes:
    """One CUpti_ActivityMarker2: kind, flags, timestamp, id, objectKind (2: thread),
    objectId (processId, threadId, unused), pad, name, domain."""
    return struct.pack("<iiQIiIIIIqq", KIND_MARKER, flags, ts, mid, 2, 4242, thread, 0, 0,
                       _cstr(name), _cstr(domain))


def memset(ts: int, nbytes: int = 64) -> bytes:
    """A CUpti_ActivityMemset4 (88 bytes): kind, value, bytes, start, end, ..., stream, corr."""
    rec = struct.pack("<iIQQQ", 2, 0, nbytes, ts, ts + 10)
    rec += b"\0" * 8 + struct.pack("<II", 7, 1)
    return rec + b"\0" * (88 - len(rec))


def test_marker_layout_matches_cupti_python():
    cupti = pytest.importorskip("cupti.cupti")
    assert cupti.activity_marker2_dtype.itemsize == len(marker(MARKER_FLAG_START, 1, 1, "x"))


def test_parse_markers_beside_activity_records():
    data = (marker(MARKER_FLAG_START, 1000, 5, "decode_step", "myserver") + memset(1100)
            + marker(MARKER_FLAG_END, 2000, 5) + marker(1, 2100, 6, "instant"))
    markers: list = []
    out = parse_buffer(data, Layout(), NameCache(), None, markers)
    assert out == [("S", 64, 1100, 1110, 7, 1)]
    assert markers == [("M", MARKER_FLAG_START, 1000, 5, "decode_step", "myserver", 77),
                       ("M", MARKER_FLAG_END, 2000, 5, None, None, 77),
                       ("M", 1, 2100, 6, "instant", None, 77)]
    assert parse_buffer(data, Layout(), NameCache()) == out   # nobody asked for markers


def _kernel(ts: int) -> tuple:
    return ("K", "gemv", ts, ts + 50, 1, 1, 1, 32, 1, 1, 16, 0, 7, 1, 0)


def test_ranges_become_steps_even_when_kernels_arrive_first(prof):
    rec = StepRecorder(prof, sources=("nvtx",))
    clock = [0.0]
    sink = NvtxSteps(rec, ("decode_step", "prefill"), hold_s=1.0, monotonic=lambda: clock[0])
    store = prof.store
    # the per-context kernel buffer comes before the global buffer with the markers
    store.add_records(sink.feed([], [_kernel(1100), _kernel(1300), _kernel(2200)]))
    assert store.view(raw=False).counters["kernels"] == 0          # held back
    m = [("M", MARKER_FLAG_START, 1000, 1, "prefill", None, 7),
         ("M", MARKER_FLAG_END, 1500, 1, None, None, 7),
         ("M", MARKER_FLAG_START, 2000, 2, "other_range", None, 7),
         ("M", MARKER_FLAG_START, 2100, 3, "decode_step", None, 7),
         ("M", MARKER_FLAG_END, 2900, 3, None, None, 7),
         ("M", MARKER_FLAG_END, 3000, 2, None, None, 7)]
    store.add_records(sink.feed(m, [_kernel(3500)]))                # watermark 3000
    clock[0] = 5.0
    store.add_records(sink.feed([], []))                            # the rest, after hold_s
    got = [(t.phase, t.start_ns, t.end_ns, t.kernels) for t in rows(prof)]
    assert got == [("prefill", 1000, 1500, 2), ("decode", 2100, 2900, 1)]
    assert store.view(raw=False).counters["kernels"] == 4           # 3500: between steps
    assert sink.ranges == 2 and rec.source == "nvtx"


def test_held_records_are_bounded(prof):
    sink = NvtxSteps(StepRecorder(prof, sources=("nvtx",)), ("step",), hold_s=60, max_held=5)
    out = sink.feed([], [_kernel(i) for i in range(4)])
    assert out == []
    out = sink.feed([], [_kernel(10 + i) for i in range(4)])       # 8 held > 5: oldest go
    assert [r[2] for r in out] == [0, 1, 2, 3]
    assert [r[2] for r in sink.drain()] == [10, 11, 12, 13]
