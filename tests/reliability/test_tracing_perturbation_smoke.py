"""bench/verify/tracing_perturbation.py's arithmetic on the CPU (the measurement itself needs a GPU):
the split of a call's time into duration and gaps from events and CUPTI, the constants it
suggests, and the model part's figures from a store of traced and untraced steps."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tracing_data import traced_store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO))
    spec = importlib.util.spec_from_file_location(
        "tracing_perturbation", REPO / "bench" / "verify" / "tracing_perturbation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_records_of_a_block_leave_the_spin_kernel_out_and_group_by_call(bench):
    recs = [("K", "_ZN2at4cuda12_GLOBAL__N_111spin_kernelEl", 0, 5_000_000),
            ("K", "add", 5_001_000, 5_003_000), ("K", "add", 5_004_000, 5_006_000),
            ("R", "cudaLaunchKernel", 1, 2, 9)]
    ks = bench.kernel_records(recs)
    assert ks == [(5_001_000, 5_003_000), (5_004_000, 5_006_000)]
    assert bench.call_spans(ks, 2) == ([0.002, 0.002], 1)
    assert bench.call_spans(ks, 1) == ([0.005], 2)
    assert bench.call_spans(ks, 3)[0] == []          # not a whole number of kernels a call


def _state(pairs, empty, queued, launched, graph, cupti=None):
    s = {"pairs": pairs, "empty": empty, "queued": queued, "launched": launched,
         "graph": graph, "graph_launched": graph + 0.01, "queue_hidden": True}
    if cupti:
        s.update(cupti)
    return s


def test_a_calls_time_splits_into_duration_and_gaps(bench):
    # ms per call: untraced pairs 3.0 µs less 1.0 empty: 2.0 µs bracketed; traced pairs 3.6 less
    # 1.0: 2.6; CUPTI says 2.1 µs: an event pair adds 0.5 µs, the untraced kernel took 1.5 µs,
    # tracing added 0.6 µs to it (2.1 - 1.5 = 2.6 - 2.0)
    cupti = {"cupti_pairs": {"span": 0.0021, "kernels": 1, "dur": 0.0021, "block": None},
             "cupti_queued": {"span": 0.0021, "kernels": 1, "dur": 0.0021, "block": 0.0045},
             "cupti_graph": {"span": 0.0020, "kernels": 1, "dur": 0.0020, "block": 0.0030}}
    rnd = {"untraced": {"tiny": _state(0.003, 0.001, 0.0030, 0.0060, 0.0025)},
           "traced": {"tiny": _state(0.0036, 0.001, 0.0045, 0.0120, 0.0030, cupti)}}
    s = bench.summarize_kernels([rnd, rnd], ["tiny"])["tiny"]
    assert s["rounds"] == 2 and s["kernels"] == 1
    assert s["bracket"] == pytest.approx(0.0005)
    assert s["d_true"] == pytest.approx(0.0015)
    assert s["dur_infl_stream"] == pytest.approx(0.0006)
    assert s["dur_infl_stream_literal"] == pytest.approx(0.0001)
    assert s["dur_infl_graph"] == pytest.approx(0.0005)
    assert s["gap_untraced_stream"] == pytest.approx(0.0015)       # 3.0 - 1.5
    assert s["gap_traced_stream"] == pytest.approx(0.0024)         # 4.5 - 2.1
    assert s["gap_infl_stream"] == pytest.approx(0.0009)
    assert s["step_queued"] == pytest.approx(1.5) and s["step_launched"] == pytest.approx(2.0)
    assert s["step_graph"] == pytest.approx(1.2)
    assert bench.suggested_constants({"tiny": s}) == {"stream": 600.0, "graph": 500.0}
    bench.print_kernels({"device": "test", "summary": {"tiny": s}})


def test_model_figures_split_the_stretch_and_give_the_class_before_and_after(bench, capsys):
    view = traced_store().view(raw=False)
    fig = bench.model_figures(view, "compiled", delta_stream=None, delta_graph=400.0)
    assert fig["path"] == "graph"
    assert (fig["untraced_steps"], fig["traced_steps"], fig["attached_untraced_steps"]) == \
        (48, 4, 1)
    assert fig["step_inflation_events"] == pytest.approx(3.10 / 2.60)
    assert fig["stretch_ms"] == pytest.approx(0.50)
    assert fig["stretch_inside_durations_ms"] == pytest.approx(100 * 400 / 1e6)
    assert fig["traced_busy_ms"] == pytest.approx(1.5)
    assert fig["before"]["class"] == "launch-bound" and fig["before"]["basis"] == "traced"
    assert fig["after"]["class"] != "launch-bound" and fig["after"]["basis"] == "untraced"
    bench.print_model(fig)
    out = capsys.readouterr().out
    assert "0.040 ms inside kernel durations (100 × 400 ns)" in out, out
