"""Across ranks: step split, skew, slowest rank, findings, clock alignment, TP scaling.

The ranks' stores are real SessionStores fed the records a 2-GPU NCCL run produces (kernel
names as CUPTI reports them); the expected numbers are computed here by hand."""
from __future__ import annotations

import pytest

from ranks_data import GEMV, NCCL, _k, rank_store, two_ranks

from tuiprof.analysis.cross_rank import find_ranks, ranks_summary, step_splits, tp_scaling
from tuiprof.store import SessionStore
from tuiprof.store.rank_set import ALIGN_ABOVE_NS, RanksView, clock_alignment

def test_step_split_is_interval_arithmetic_over_the_step():
    st = SessionStore()
    seq = st.begin_token("decode", "eager", 0, 0)
    # compute [100, 300] ∪ [400, 600]; communication [550, 900]: 50 ns of overlap
    st.add_records([_k(GEMV, 100, 300, 1), _k(GEMV, 400, 600, 2), _k(NCCL, 550, 900, 3),
                    ("C", 1, 64, 950, 960, 7, 4)])
    st.end_token(seq, 1000, 0.001)
    (s,) = step_splits(st.view())
    assert (s.compute_ns, s.comm_ns, s.overlap_ns) == (410, 350, 50)
    assert s.idle_ns == 1000 - (410 + 350 - 50)
    assert s.comm_kernels == 1 and s.comm_by_name == {"NCCL AllReduce bf16 ring LL": 350}


def test_the_rank_that_computes_more_is_the_slowest_and_the_findings_say_so():
    rv = two_ranks()
    s = ranks_summary(rv)
    r0, r1 = s.ranks
    assert (r0.compute_ms, r0.comm_ms) == pytest.approx((1.0, 1.5))
    assert (r1.compute_ms, r1.comm_ms) == pytest.approx((1.6, 0.9))
    assert r0.comm_share == pytest.approx(1.5 / 4.5) and r1.comm_share == pytest.approx(0.9 / 4.53)
    assert r0.overlap_fraction == 0.0 and r0.idle_ms == pytest.approx(4.5 - 2.5)
    assert r0.collectives[0][0] == "NCCL AllReduce bf16 ring LL"
    assert s.slowest == 1
    found = {f.id: f for f in find_ranks(rv, s)}
    assert set(found) == {"tp-straggler", "tp-no-overlap"}   # 20 % on rank 1: not comm-bound
    st = found["tp-straggler"]
    assert st.numbers["slowest_rank"] == 1 and st.numbers["gap_ms"] == pytest.approx(0.6)
    assert st.numbers["q_heads"] == {"1": 9, "0": 8}
    assert "rank 0 waits ~0.600 ms per step" in st.evidence


def test_communication_bound_names_the_share_on_each_rank():
    r0 = rank_store(0, 8, compute_us=800, comm_us=2400)
    r1 = rank_store(1, 8, compute_us=900, comm_us=2300)
    f = {x.id: x for x in find_ranks(RanksView((r0.view(), r1.view())))}["tp-communication-bound"]
    assert f.numbers["comm_share_min"] == pytest.approx(2.3 / 4.5)
    assert f.numbers["comm_share_max"] == pytest.approx(2.4 / 4.5)
    assert f.title.startswith("Communication-bound: all-reduce is 51% of the step at TP=2 for a 0.6B")
    assert f.impact_ms_per_token == pytest.approx(2.3)


def test_step_skew_uses_aligned_clocks():
    # rank 1's clock reads 3 ms ahead: aligned, its steps end 30 µs after rank 0's
    r0 = rank_store(0, 10, 1000, 1000)
    r1 = rank_store(1, 10, 1000, 1000, offset_ns=3_000_000, end_lag_us=30)
    rv = RanksView((r0.view(), r1.view()))
    al = clock_alignment(rv.views)
    assert al.applied and al.offsets_ns == (0, 3_000_000) and al.residual_ns == 3_000_000
    s = ranks_summary(rv)
    assert s.skew.steps == 10 and s.skew.end_median_us == pytest.approx(30.0)
    assert s.skew.last_counts == (0, 10)


def test_clocks_of_one_source_are_left_alone():
    a = rank_store(0, 2, 10, 10)
    b = rank_store(1, 2, 10, 10, offset_ns=ALIGN_ABOVE_NS // 2)
    al = clock_alignment((a.view(), b.view()))
    assert not al.applied and al.offsets_ns == (0, 0) and al.residual_ns == ALIGN_ABOVE_NS // 2


def test_tp_scaling_from_a_tp1_reference():
    assert tp_scaling(3.0, 2.0, 2) == pytest.approx(
        {"tp": 2, "tp1_ms": 3.0, "tpn_ms": 2.0, "speedup": 1.5, "efficiency": 0.75})
    rv = two_ranks()
    step = (4.5 + 4.53) / 2          # the ranks' median step
    rv = RanksView(rv.views, {"tp_reference": {"tp": 1, "mode": "eager", "ms_per_token": step * 1.2,
                                               "source": "TP=1 run"}})
    f = {x.id: x for x in find_ranks(rv)}["tp-scaling"]
    assert f.numbers["efficiency"] == pytest.approx(0.6)
    assert f.severity == "medium" and "×1.20 on 2 GPUs" in f.evidence
