"""Findings on both recordings, and on small synthetic sessions for the other rules."""
from __future__ import annotations

import statistics

import pytest
from analysis_data import decode_windows

from tuiprof.analysis import find
from tuiprof.store import SessionStore

GEMV = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
MUL = ("_ZN2at6native29vectorized_elementwise_kernelILi8ENS0_13BinaryFunctorIN3c108BFloat16ES4_S4_"
       "NS0_15binary_internal10MulFunctorIfEEEESt5arrayIPcLm3EEEEviT0_T1_")


def _ids(fs):
    return [f.id for f in fs]


def test_eager_findings(eager_view, eager_facts):
    fs = find(eager_view)
    ids = _ids(fs)
    assert "launch-bound" in ids and "grid-too-small" in ids
    lb = fs[ids.index("launch-bound")]
    assert ids[0] == "launch-bound" and lb.severity == "high"
    assert lb.numbers["busy_ms"] == pytest.approx(eager_facts.kernel_ms_median, rel=0.03)
    assert lb.numbers["wall_ms"] == pytest.approx(eager_facts.step_ms_median, rel=0.02)
    assert "compiled" in lb.advice and "CUDA graph" in lb.advice
    g = fs[ids.index("grid-too-small")]
    assert (g.numbers["blocks_min"], g.numbers["blocks_max"], g.numbers["sm_count"]) == (16, 48, 132)
    assert "16–48 blocks on 132 SMs" in g.title
    impacts = [f.impact_ms_per_token for f in fs if f.impact_ms_per_token is not None]
    assert impacts == sorted(impacts, reverse=True)
    assert "fusable-kernels" in ids                         # 60% elementwise + copy/cast
    assert "gpu-unused" not in ids and "dropped-records" not in ids and "sampled" not in ids


def _head_tail_ms(d: dict) -> tuple[float, float]:
    """Median ms from a decode step's start to its first kernel, and from its last kernel's end
    to the step's end, counted from the recording's JSON."""
    heads, tails = [], []
    for _step, s, e in decode_windows(d):
        ks = [r for r in d["records"] if r[0] == "K" and s <= r[2] <= e]
        heads.append((min(r[2] for r in ks) - s) / 1e6)
        tails.append((e - max(r[3] for r in ks)) / 1e6)
    return statistics.median(heads), statistics.median(tails)


def test_compiled_findings(compiled_view, compiled_json, compiled_facts):
    fs = find(compiled_view)
    ids = _ids(fs)
    assert "launch-bound" not in ids       # compiled mode: the idle time is taken apart instead
    idle = fs[ids.index("gpu-idle-in-step")]
    n = idle.numbers
    assert n["busy_fraction"] == pytest.approx(
        compiled_facts.kernel_ms_median / compiled_facts.step_ms_median, abs=0.03)
    head, tail = _head_tail_ms(compiled_json)
    assert n["head_ms"] == pytest.approx(head, abs=0.02) and n["tail_ms"] == pytest.approx(tail, abs=0.02)
    assert n["host_side_idle_ms"] > n["in_graph_idle_ms"] > 0
    assert n["head_ms"] + n["tail_ms"] + n["gaps_ms"] == pytest.approx(n["idle_ms"], rel=0.05)
    assert "before the first kernel" in idle.evidence and "after the last kernel" in idle.evidence
    assert "inside the graph" in idle.evidence.lower()
    for f in fs:
        assert "try compiled mode" not in f.advice.lower()
        assert "torch.compile(" not in f.advice
    assert "grid-too-small" in ids


# ------------------------------------------------------------------------ synthetic sessions
def _session(n_tokens=6, mode="eager", meta=None, kernels=None, busy_us=100, wall_us=1000,
             mallocs=0, sampled=lambda i: True, alloc=None, step0=0, memkind=3):
    s = SessionStore(meta=meta or {"device": "NVIDIA H100 80GB HBM3", "sm_count": 132,
                                   "model": "toy", "mode": mode})
    t = 1_000_000
    kernels = kernels if kernels is not None else [(GEMV, (4, 4, 1)), (MUL, (1, 1, 1))]
    for i in range(n_tokens):
        seq = s.begin_token("decode", mode, t, step0 + i, sampled=sampled(i))
        recs = []
        if sampled(i):
            k0 = t + 50_000
            per = busy_us * 1000 // max(1, len(kernels))
            for j, (name, grid) in enumerate(kernels):
                st = k0 + j * (per + 1000)
                recs.append(("K", name, st, st + per, *grid, 384, 1, 1, 168, 164308, 7, j, 0))
            for j in range(mallocs):
                recs.append(("A", 1, memkind, 1 << 20, k0 + j, 0xABC + j, j, 0, 0, 7, 1))
        s.add_records(recs)
        s.end_token(seq, t + wall_us * 1000, wall_us / 1000)
        if alloc is not None:
            s.set_token_alloc(seq, {"num_device_alloc": alloc(i)})
        t += wall_us * 1000 + 10
    return s


def test_gpu_unused_cpu():
    s = _session(kernels=[], meta={"device": "cpu", "model": "toy"})
    f = find(s.view())
    assert f[0].id == "gpu-unused" and f[0].severity == "high"


def test_gpu_unused_no_kernels():
    ids = _ids(find(_session(kernels=[]).view()))
    assert "gpu-unused" in ids and "launch-bound" not in ids


def test_dropped_and_sampled_caveats():
    s = _session(n_tokens=8, sampled=lambda i: i % 2 == 0)
    s.note_dropped(500)
    fs = find(s.view())
    ids = _ids(fs)
    assert "dropped-records" in ids and "sampled" in ids
    d = fs[ids.index("dropped-records")]
    assert d.numbers["dropped"] == 500 and d.impact_ms_per_token is None
    assert fs[ids.index("sampled")].numbers == {"unsampled": 4, "tokens": 8}
    assert ids.index("launch-bound") < ids.index("dropped-records")   # impact first, caveats after


def test_device_allocs_cupti_and_allocator():
    fs = find(_session(mallocs=3).view())
    a = [f for f in fs if f.id == "device-allocs"]
    assert a and a[0].numbers["cupti_mallocs_per_token"] == 3
    # pinned host buffers are CUPTI memory records too, but no device cudaMalloc
    assert "device-allocs" not in _ids(find(_session(mallocs=3, memkind=2).view()))
    fs = find(_session(alloc=lambda i: 100 + 2 * i).view())
    a = [f for f in fs if f.id == "device-allocs"]
    assert a and a[0].numbers["allocator_device_allocs_per_token"] == 2
    assert "device-allocs" not in _ids(find(_session(alloc=lambda i: 100).view()))


def test_compiled_slower():
    s = _session(n_tokens=5, mode="eager", wall_us=1000)
    t = 10**10
    for i in range(5):
        seq = s.begin_token("decode", "compiled", t, i)
        s.end_token(seq, t + 2_000_000, 2.0)
        t += 3_000_000
    fs = find(s.view())
    c = [f for f in fs if f.id == "compiled-slower"]
    assert c and c[0].numbers["ratio"] == pytest.approx(2.0)
    assert c[0].impact_ms_per_token == pytest.approx(1.0)


def test_compiled_without_graphs_is_not_told_to_compile():
    s = _session(mode="compiled", busy_us=50, wall_us=2000)
    lb = [f for f in find(s.view()) if f.id == "launch-bound"]
    assert lb and "reduce-overhead" in lb[0].advice
    assert "try compiled mode" not in lb[0].advice.lower()


def test_busy_gpu_has_no_launch_finding():
    ids = _ids(find(_session(busy_us=900, wall_us=1000).view()))
    assert "launch-bound" not in ids and "gpu-idle-in-step" not in ids


def test_findings_are_json_ready(eager_view):
    import json
    for f in find(eager_view):
        assert json.loads(json.dumps(f.to_dict()))["id"] == f.id


def test_empty_view():
    assert find(SessionStore().view()) == []


def test_a_native_programs_fusion_advice_names_no_pytorch_remedy(eager_view):
    """On an H200 a llama-server's findings advised torch.compile for its elementwise kernels:
    a native program has no compiled mode to try."""
    import dataclasses  # noqa: PLC0415

    def fusable(view):
        return next(f for f in find(view) if f.id == "fusable-kernels")

    assert "torch.compile" in fusable(eager_view).advice
    native = dataclasses.replace(eager_view, meta={**eager_view.meta, "native": True})
    adv = fusable(native).advice
    assert "torch.compile" not in adv and "compiled mode" not in adv and "ggml" in adv
