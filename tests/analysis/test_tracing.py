"""What tracing changes, on a store of traced and untraced steps: the traced steps' cost against
the untraced median, the busy share and the launch-bound class over an untraced step's wall
time (not the traced step's own, which tracing stretches), and kernel times read as upper
bounds until the per-kernel constant is measured, or corrected by it."""
from __future__ import annotations

import pytest
from tracing_data import TINY_US, traced_store

from tuiprof.analysis import tracing
from tuiprof.analysis.batch import config_summaries
from tuiprof.analysis.breakdown import launch_bound
from tuiprof.analysis.tokens import mode_summaries
from tuiprof.analysis.tracing import kernel_times, tracing_cost, untraced_wall_ms


def test_the_store_keeps_untraced_and_traced_steps_apart():
    view = traced_store().view()
    ts = view.token_stats[("decode", "compiled")]
    assert ts["untraced_ms"].count == 48 and ts["untraced_gpu_ms"].count == 48
    assert ts["traced_step_ms"].count == 4 and ts["traced_gpu_ms"].count == 4
    assert ts["host_ms"].count == 53            # the attach lead counts as a step, on no side
    lead = [t for t in view.tokens if t.attached and not t.sampled]
    assert len(lead) == 1


def test_tracing_cost_is_traced_against_untraced_medians_by_events():
    cost = tracing_cost(traced_store().view(), "decode", "compiled")
    assert cost.source == "gpu_ms"
    assert cost.traced_ms == pytest.approx(3.10) and cost.untraced_ms == pytest.approx(2.60)
    assert (cost.traced_steps, cost.untraced_steps) == (4, 48)
    assert cost.text() == "traced steps run 19 % slower: tracing cost"


def test_without_events_the_cost_is_by_wall_time_and_needs_untraced_steps():
    store = traced_store(untraced_gpu=None, traced_gpu=None)
    cost = tracing_cost(store.view(), "decode", "compiled")
    assert cost.source == "host_ms" and cost.ratio == pytest.approx(3.20 / 2.74)
    few = traced_store(untraced=2, after=0)
    assert tracing_cost(few.view(), "decode", "compiled") is None
    assert untraced_wall_ms(few.view(), "decode", "compiled") is None


def test_busy_share_and_class_are_of_an_untraced_step():
    # busy 50 x 2 + 50 x 28 = 1.5 ms a traced step: 47 % of its own 3.2 ms (launch-bound),
    # 55 % of an untraced step's 2.74 ms
    view = traced_store().view()
    ms = mode_summaries(view)["compiled"]
    assert ms.busy_basis == "untraced" and ms.untraced_ms == pytest.approx(2.74)
    assert ms.busy_fraction == pytest.approx(1.5 / 2.74, rel=1e-3)
    assert ms.traced_busy_fraction == pytest.approx(1.5 / 3.2, rel=1e-3)
    after, = config_summaries(view)
    before, = config_summaries(view, basis="traced")
    assert before.klass == "launch-bound" and before.busy_basis == "traced"
    assert "of its traced step" in before.why
    assert after.klass != "launch-bound" and after.busy_basis == "untraced"
    assert after.busy == pytest.approx(1.5 / 2.74, rel=1e-3)
    lb = launch_bound(view, "compiled")
    assert lb.basis == "untraced" and not lb.launch_bound
    assert lb.wall_ms == pytest.approx(2.74)


def test_a_session_without_untraced_steps_keeps_the_traced_basis():
    view = traced_store(untraced=0, after=0).view()
    ms = mode_summaries(view)["compiled"]
    assert ms.busy_basis == "traced" and ms.untraced_ms is None
    assert config_summaries(view)[0].klass == "launch-bound"


def test_short_kernels_are_upper_bounds_until_the_constant_is_measured(monkeypatch):
    tiny = kernel_times(TINY_US * 1000, graph_launches=10, launches=10)
    long = kernel_times(28_000, graph_launches=10, launches=10)
    assert tiny.path == "graph" and tiny.upper_bound and tiny.correction_ns == 0
    assert not long.upper_bound
    assert kernel_times(2000, 0, 10).path == "stream"
    assert "upper bound" in tracing.duration_note()
    table = {"stream": None, "graph": 400.0}   # what the lead fills in from the H100 run
    fixed = kernel_times(TINY_US * 1000, 10, 10, table)
    assert not fixed.upper_bound and fixed.mean_ns(2000) == 1600
    assert fixed.total_ns(20_000, 10) == 16_000
    monkeypatch.setattr(tracing, "DURATION_INFLATION_NS", table)
    assert tracing.duration_note() == "kernel times less tracing's own: 0.40 µs a graph kernel"
    ms = mode_summaries(traced_store().view())["compiled"]    # the busy share corrected too
    assert ms.busy_correction_ms == pytest.approx(100 * 0.0004)
    assert ms.busy_fraction == pytest.approx((1.5 - 0.04) / 2.74, rel=1e-3)
