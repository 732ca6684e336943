"""llama.cpp's decode loop found in its real kernel stream (an H200 recording in tests/data):
with CUDA graphs on, a decode step is one ``cudaGraphLaunch`` of 538 kernels, 28 layers of 19
repeating inside it; the step must not be cut into its layers. With graphs off, the same
step's kernels are launched one by one."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from tuiprof.analysis.period import detect
from tuiprof.program.steps import StepRecorder
from tuiprof.program.stream_steps import StreamSteps

from .conftest import rows

DATA = Path(__file__).resolve().parents[1] / "data" / "h200_llamacpp_q8_decode.json.gz"


@pytest.fixture(scope="module")
def recording():
    return json.loads(gzip.decompress(DATA.read_bytes()))


def kernels(records):
    return [r for r in records if r[0] == "K"]


def per_launch(records) -> Counter:
    """Kernels per graph launch (every kernel of one launch carries its correlation id)."""
    return Counter(r[13] for r in kernels(records) if r[14])


def feed(prof, records, chunk=300):
    clock = [0.0]
    rec = StepRecorder(prof, sources=("auto", "windows"))
    sink = StreamSteps(rec, 100.0, monotonic=lambda: clock[0], meta=prof.store.meta)
    store = prof.store
    for i in range(0, len(records), chunk):
        clock[0] += 0.5
        store.add_records(sink.feed([], [tuple(r) for r in records[i:i + chunk]]))
    store.add_records(sink.drain())
    rec.close()
    return sink


def test_the_graph_launch_is_the_step_not_its_layers(recording):
    recs = recording["graphs"]
    ks = kernels(recs)
    launches = per_launch(recs)
    size = Counter(launches.values()).most_common(1)[0][0]     # 538: one decode step
    cut = detect([r[1] for r in ks], [r[2] for r in ks], [r[3] for r in ks],
                 [r[12] for r in ks], [r[13] for r in ks])
    assert cut.usable and cut.loop.period == size
    assert cut.decode >= len(launches) - 2      # the first launch may be cut short by the ring


def test_live_cut_of_a_graph_launched_decode_steps(prof, recording):
    """Fed buffer by buffer as the collector does: the first search sees three layers long
    before three steps; the loop found is the whole graph launch, one launch per step."""
    recs = recording["graphs"]
    size = Counter(per_launch(recs).values()).most_common(1)[0][0]
    sink = feed(prof, recs)
    assert sink.loop is not None and sink.loop.period == size
    dec = [t for t in rows(prof) if t.phase == "decode"]
    assert len(dec) >= 8
    assert Counter(t.kernels for t in dec).most_common(1)[0][0] == size
    assert all(t.graph_kernels == t.kernels for t in dec)


def test_without_graphs_the_same_step_is_found(recording):
    recs = recording["no_graphs"]
    ks = kernels(recs)
    assert not any(r[14] for r in ks)
    cut = detect([r[1] for r in ks], [r[2] for r in ks], [r[3] for r in ks],
                 [r[12] for r in ks], [r[13] for r in ks])
    assert cut.usable and cut.loop.time_supported
    assert cut.loop.period == Counter(per_launch(recording["graphs"]).values()).most_common(1)[0][0]


def test_findings_read_the_decode_of_a_quantised_model(prof, recording):
    """The decode-profile finding of the graph-launched Q8_0 decode: the dominant kernel by its
    friendly name (the fused Q8_0 GEMV), its grid against the H200's SMs, one graph launch a
    step, every kernel inside it, and not launch-bound (the graph keeps the GPU busy)."""
    from tuiprof.analysis.findings import find

    prof.store.meta.update({"native": {"pid": 1}, "device_name": "NVIDIA H200"})
    feed(prof, recording["graphs"])
    found = {f.id: f for f in find(prof.store.view(raw=True))}
    f = found["decode-profile"]
    assert f.numbers["kernel"].startswith("ggml GEMV mul_mat_vec_q q8_0")
    assert f.numbers["category"] == "GEMM/GEMV" and f.numbers["sm_count"] == 132
    assert f.numbers["grid_blocks"] > 0 and "on 132 SMs" in f.title
    assert f.numbers["graph_launches_per_step"] == 1 and f.numbers["graph_kernel_share"] == 1.0
    assert f.numbers["launch_bound"] is False and "launch-bound: no" in f.title


def test_without_graphs_the_step_is_not_its_layers_either(prof, recording):
    """Fed buffer by buffer without graphs: the first searches see a few layers (19 kernels
    repeating, no host gap before each) and one pause of the GPU that no layer boundary
    explains; they wait, and the loop found is the 538-kernel step with its host gap."""
    sink = feed(prof, recording["no_graphs"])
    assert sink.loop is not None and sink.loop.period == 538 and sink.loop.time_supported
    dec = [t for t in rows(prof) if t.phase == "decode"]
    assert dec and all(t.kernels == 538 for t in dec)


def test_without_graphs_the_same_decode_is_launch_bound(prof, recording):
    from tuiprof.analysis.findings import find

    prof.store.meta.update({"native": {"pid": 1}, "device_name": "NVIDIA H200"})
    sink = feed(prof, recording["no_graphs"])
    assert sink.loop.period == 538
    f = {f.id: f for f in find(prof.store.view(raw=True))}["decode-profile"]
    assert f.numbers["graph_kernel_share"] == 0 and "no CUDA graph" in f.evidence
    assert f.numbers["kernels_per_token"] == 538
    assert f.numbers["launch_bound"] is True


def test_a_native_programs_advice_speaks_of_the_program_not_of_torch(prof, recording):
    """Graphs off, the Q8_0 decode is launch-bound: the advice names what a native engine can
    do (CUDA graphs, fusion, batching), not torch.compile."""
    from tuiprof.analysis.findings import find

    prof.store.meta.update({"native": {"pid": 1}, "device_name": "NVIDIA H200"})
    feed(prof, recording["no_graphs"])
    f = {f.id: f for f in find(prof.store.view(raw=True))}["launch-bound"]
    assert "CUDA graph" in f.advice and "torch.compile" not in f.advice
