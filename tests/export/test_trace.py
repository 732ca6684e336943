"""Chrome trace / Perfetto JSON: Trace Event Format rules on the recorded window."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tuiprof.export import trace as tr
from tuiprof.export.window import GpuOp


@pytest.fixture(scope="module")
def doc(tmp_path_factory, compiled_view):
    p = tr.write_trace(compiled_view, tmp_path_factory.mktemp("tr") / "t.json")
    return json.loads(p.read_text())


def test_required_fields_per_phase(doc):
    evs = doc["traceEvents"]
    assert doc["displayTimeUnit"] == "ms"
    for e in evs:
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert {"ts", "dur", "tid", "cat"} <= set(e)
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
        elif e["ph"] == "C":
            assert isinstance(e["ts"], float) and e["args"]
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        else:
            assert e["name"] in ("process_name", "process_labels", "process_sort_index",
                                 "thread_name", "thread_sort_index")
            assert "args" in e and "tid" in e


def test_timestamps_are_relative_microseconds(doc, compiled_raw):
    evs = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    t0 = min(m[2] for m in compiled_raw["marks"])
    assert min(e["ts"] for e in evs) == 0.0 and doc["baseTimeNanoseconds"] == t0
    kern = [e for e in evs if e.get("cat") == "kernel"]
    recs = [r for r in compiled_raw["records"] if r[0] == "K"]
    assert len(kern) == len(recs)
    assert sorted(round(e["dur"] * 1000) for e in kern) == sorted(r[3] - r[2] for r in recs)
    assert sorted(round(e["ts"] * 1000) for e in kern) == sorted(r[2] - t0 for r in recs)
    span_us = (max(m[2] for m in compiled_raw["marks"]) - t0) / 1000
    assert max(e["ts"] + e.get("dur", 0) for e in evs) == pytest.approx(span_us)


def test_metadata_names_every_track(doc):
    evs = doc["traceEvents"]
    procs = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    sort_idx = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_sort_index"}
    for e in evs:
        if e["ph"] in ("X", "C"):
            assert e["pid"] in procs and e["pid"] in sort_idx
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in threads
    names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"stream 7", "tokens"} <= names
    gpu = next(e for e in evs if e["name"] == "process_name" and e["pid"] == 0)
    assert gpu["args"]["name"] == "GPU 0: NVIDIA H100 80GB HBM3"


def _no_partial_overlap(evs):
    tracks = defaultdict(list)
    for e in evs:
        if e["ph"] == "X":
            # viewers convert µs to integer ns (Perfetto does): compare there, not in floats
            s = round(e["ts"] * 1000)
            tracks[(e["pid"], e["tid"])].append((s, s + round(e["dur"] * 1000)))
    for key, spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for s, t in spans:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or t <= stack[-1], (key, s, t, stack[-1])  # nested or disjoint
            stack.append(t)


def test_no_partial_overlap_on_a_track(doc):
    _no_partial_overlap(doc["traceEvents"])


def test_tokens_phases_and_counters(doc, compiled_raw, compiled_facts):
    evs = doc["traceEvents"]
    toks = [e for e in evs if e.get("cat") == "token"]
    assert len(toks) == len([m for m in compiled_raw["marks"] if m[0].endswith("_start")])
    phases = {e["name"]: e for e in evs if e.get("cat") == "phase"}
    assert set(phases) == {"prefill (eager)", "decode (compiled)"}
    assert phases["decode (compiled)"]["args"]["tokens"] == compiled_facts.decode_steps
    lat = [e for e in evs if e["ph"] == "C" and e["name"] == "token latency (ms)"]
    assert len(lat) == len(toks)
    assert any(e["ph"] == "C" and e["name"].startswith("nvml ") for e in evs)


def test_overlapping_ops_go_to_another_lane():
    ops = [GpuOp("K", 0, 100, "a", stream=7), GpuOp("K", 50, 150, "b", stream=7),
           GpuOp("K", 150, 200, "c", stream=7), GpuOp("K", 60, 70, "d", stream=3)]
    assert tr._assign_lanes(ops) == [0, 1, 0, 0]
