"""Live collection on a real GPU (run on the GPU machine; skipped without CUDA).

The sessions run in workload processes of their own (_workloads.py): ``eager`` profiles 24 eager
decode tokens, every one traced; ``compiled`` profiles 256 compiled decode tokens, every one
traced up to step FULL, then in bursts of 4 traced tokens in every 32 (kinds switched off and on).
"""
from __future__ import annotations

import statistics

import pytest

from _workloads import BURST_EVERY, DECODE, FULL, SESSION

from tuiprof.collect.cupti_collector import DRIVER_APIS, RUNTIME_APIS, _short_api

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _decode(run) -> list[dict]:
    session = run["session"]
    assert session["error"] is None, session["message"]
    return [t for t in session["tokens"] if t["phase"] == "decode" and t["done"]]


def test_records_arrive_and_kernel_count_is_stable(eager_run, compiled_run):
    eager, compiled = _decode(eager_run), _decode(compiled_run)
    assert len(eager) == SESSION and len(compiled) == DECODE
    for run, traced in ((eager_run, eager[2:]), (compiled_run, compiled[2:FULL])):
        counts = [t["kernels"] for t in traced]
        assert min(counts) > 100
        assert max(counts) == min(counts), counts  # same kernels every decode step
        assert run["session"]["dropped"] == 0
    # compiled decode runs inside CUDA graphs: graph kernels are attributed too
    assert all(t["graph_kernels"] > 0.9 * t["kernels"] for t in compiled[2:FULL])
    print("kernels/token eager", eager[-1]["kernels"], "compiled", compiled[FULL - 1]["kernels"])


def test_nvml_gpm_present_and_moving(eager_run):
    session = eager_run["session"]
    assert session["collectors"]["nvml"]["ok"], session["collectors"]
    sm = session["gpm_sm_util"]
    assert len(sm) >= 5, "no GPM samples"
    assert max(sm) > 0.0 and max(sm) != min(sm), sm


def test_compiled_burst_sampling_keeps_valid_kernel_records(compiled_run):
    """Bursts of 4 traced tokens in compiled mode (kinds switched on and off): the traced
    tokens carry every kernel of the CUDA graph with plausible durations."""
    dec = _decode(compiled_run)
    full = dec[FULL - 1]["kernels"]  # a token traced while the kinds stayed on
    bursts = dec[FULL:]
    sampled = [t for t in bursts if t["sampled"]]
    assert abs(len(sampled) - len(bursts) / BURST_EVERY) <= 4, len(sampled)
    assert all(not t["kernels"] for t in bursts if not t["sampled"])
    counts = [t["kernels"] for t in sampled]
    nvjet = compiled_run["session"]["burst_nvjet_mean_ns"]
    print("kernels per sampled token:", counts, "(every token traced:", full, ") nvjet means:",
          sorted((round(m), n[:40]) for n, m in nvjet.items()))
    assert full > 100 and set(counts) == {full}, (compiled_run["session"]["message"], counts)
    # the GEMVs run ~4-6 µs each; the LM-head GEMV (151,936 x 1,024) ~110 µs
    assert nvjet and all(1_000 < m < 200_000 for m in nvjet.values()), nvjet
    # API records follow the bursts by switching the RUNTIME/DRIVER kinds off and on; a kind
    # switched on again forgets its per-id filter, so the collector applies it again: only the
    # subset's calls may come back (not cudaGetDevice, ~14 per launch)
    subset = {_short_api(n) for n in RUNTIME_APIS + DRIVER_APIS}
    api = compiled_run["session"]["api"]
    assert api and set(api) <= subset, sorted(set(api) - subset)
    busy = statistics.median(t["busy_ns"] / 1e6 for t in sampled)
    print("burst-sampled compiled tokens:", len(sampled), "busy ms median", busy)
    assert 0.5 < busy < 3.0


def test_every_traced_kernel_is_split_by_its_launch(eager_run, compiled_run):
    """Each traced step's kernels are counted for the step that launched them (CUPTI API
    records, correlation ids), inside the engine's model forward or outside it (argmax, the
    token copy and position update: a handful). None is left unmatched."""
    eager, compiled = _decode(eager_run), _decode(compiled_run)
    for name, traced in (("eager", eager[2:]), ("compiled", [t for t in compiled[2:]
                                                              if t["sampled"]])):
        assert traced and all(t["model_start_ns"] for t in traced), name
        split = [(t["kernels"], t["model_kernels"], t["loop_kernels"]) for t in traced]
        assert all(k == m + lp for k, m, lp in split), (name, split[:6])
        loops = sorted({lp for _, _, lp in split})
        assert 1 <= loops[0] and loops[-1] <= 8, (name, loops)
        print(name, "model/loop kernels per step:", sorted({(m, lp) for _, m, lp in split}))


def test_allocator_counters_equal_torchs_memory_stats():
    from tuiprof.collect.allocator import FIELDS, read_allocator_stats
    keep = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 40)]
    del keep[1]
    flat = torch.cuda.memory_stats()
    assert read_allocator_stats() == {k: int(flat.get(v, 0)) for k, v in FIELDS.items()}
    assert read_allocator_stats()["reserved_bytes"] >= 41 << 20
