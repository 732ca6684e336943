"""Across ranks: step split, skew, the late rank, findings, clock alignment, TP scaling.

The ranks' stores are real SessionStores fed the records a 2-GPU NCCL run produces (kernel
names as CUPTI reports them); the expected numbers are computed here by hand."""
from __future__ import annotations

import pytest

from ranks_data import GEMV, NCCL, _k, rank_store, two_ranks

from tuiprof.analysis.collectives import collectives
from tuiprof.analysis.cross_rank import DEFINITIONS, HELP_LINE, find_ranks, ranks_summary, tp_scaling
from tuiprof.store import SessionStore
from tuiprof.store.rank_set import ALIGN_ABOVE_NS, RanksView, clock_alignment


def test_step_split_is_interval_arithmetic_over_the_step():
    st = SessionStore()
    seq = st.begin_token("decode", "eager", 0, 0)
    # compute [100, 300] ∪ [400, 600]; communication [550, 900]: 50 ns of overlap
    st.add_records([_k(GEMV, 100, 300, 1), _k(GEMV, 400, 600, 2), _k(NCCL, 550, 900, 3),
                    ("C", 1, 64, 950, 960, 7, 4)])
    st.end_token(seq, 1000, 0.001)
    (s,) = collectives([st.view()], "eager").steps[0]
    assert (s.compute, s.comm, s.overlap) == (410, 350, 50)
    assert s.idle == 1000 - (410 + 350 - 50)
    assert s.comm_kernels == 1 and s.comm_by_name == {"NCCL AllReduce bf16 ring LL": 350}


def test_the_rank_that_computes_more_is_late_and_the_findings_say_why():
    rv = two_ranks()
    s = ranks_summary(rv)
    r0, r1 = s.ranks
    assert (r0.compute_ms, r0.comm_ms) == pytest.approx((1.0, 1.5))
    assert (r1.compute_ms, r1.comm_ms) == pytest.approx((1.6, 0.9))
    # the all-reduce needs 0.9 ms once both are there; rank 0 waits 0.6 ms for rank 1
    assert (r0.transfer_ms, r0.wait_ms, r1.transfer_ms, r1.wait_ms) == pytest.approx(
        (0.9, 0.6, 0.9, 0.0))
    assert r0.comm_share == pytest.approx(1.5 / 4.5) and r1.comm_share == pytest.approx(0.9 / 4.53)
    assert r0.overlap_fraction == 0.0 and r0.idle_ms == pytest.approx(4.5 - 2.5)
    assert r0.collectives[0][0] == "NCCL AllReduce bf16 ring LL"
    assert s.late_rank == 1 and s.steps == 12 and s.calls == 12
    assert (r1.late_share, r1.late_by_ms, r1.late_causes) == (1.0, pytest.approx(0.6), {"compute": 12})
    found = {f.id: f for f in find_ranks(rv, s)}
    assert set(found) == {"tp-late-rank", "tp-no-overlap"}   # transfer 20 %: not comm-bound
    late = found["tp-late-rank"]
    assert late.numbers["late_rank"] == 1 and late.numbers["others_wait_ms"] == pytest.approx(0.6)
    assert late.numbers["q_heads"] == {"1": 9, "0": 8}
    assert "rank 0 waits 0.60 ms per step inside NCCL" in late.evidence
    assert "rank 1 holds 9 attention heads, the others 8" in late.evidence


def test_communication_bound_only_when_the_transfer_itself_is_large():
    r0 = rank_store(0, 8, compute_us=800, comm_us=2400)
    r1 = rank_store(1, 8, compute_us=900, comm_us=2300)
    f = {x.id: x for x in find_ranks(RanksView((r0.view(), r1.view())))}["tp-communication-bound"]
    assert f.numbers["transfer_ms"] == pytest.approx(2.3)
    assert f.numbers["transfer_share"] == pytest.approx(2.3 / 4.5)
    assert f.title.startswith("Communication-bound: the collectives' transfer is 51% of the step "
                              "at TP=2 for a 0.6B")
    assert f.impact_ms_per_token == pytest.approx(2.3)
    # the same NCCL time, but all of it waiting for a late rank: not communication-bound
    w0 = rank_store(0, 8, compute_us=300, comm_us=2400)
    w1 = rank_store(1, 8, compute_us=2600, comm_us=100)
    ids = {x.id for x in find_ranks(RanksView((w0.view(), w1.view())))}
    assert "tp-communication-bound" not in ids and "tp-late-rank" in ids


def test_the_headless_summary_agrees_with_the_figures(capsys):
    from tuiprof.cli.run import _print_ranks_summary

    rv = two_ranks()
    _print_ranks_summary(rv)
    out = capsys.readouterr().out
    assert ("rank 0 eager: 12 decode tokens, 222.2 tokens/s, median 4.50 ms/step; step 4.500 = "
            "compute 1.000 + comm 1.500 (transfer 0.900 + wait 0.600) + idle 2.000 - overlap "
            "0.000 ms; NCCL share 33%, overlap 0%; last at 0% of the calls") in out
    assert "rank 1 eager" in out and "*late*" in out.split("rank 1 eager")[1].splitlines()[0]
    assert "per step: means over 12 eager decode steps traced on every rank, 12 collective" in out
    assert "finding: Rank 1 arrives last at 100% of the collectives" in out
    assert HELP_LINE in out
    assert set(DEFINITIONS) >= {"compute", "comm", "transfer", "wait", "idle", "overlap",
                                "NCCL share"}


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
    # the calls still match on the aligned clock: equal compute, nobody late by much
    assert s.calls == 10 and s.ranks[0].wait_ms == pytest.approx(0.0)


def test_without_kernels_a_small_end_skew_names_no_late_rank():
    r0 = rank_store(0, 10, 1000, 1000)
    r1 = rank_store(1, 10, 1000, 1000, end_lag_us=6)
    views = tuple(RanksView((r0.view(raw=False), r1.view(raw=False))).views)
    s = ranks_summary(RanksView(views))
    assert s.skew.last_counts == (0, 10) and s.late_rank is None
    assert "no consistent late rank" in s.late_basis
    r1 = rank_store(1, 10, 1000, 1000, end_lag_us=300)
    s = ranks_summary(RanksView((r0.view(raw=False), r1.view(raw=False))))
    assert s.late_rank == 1 and "(no kernel records)" in s.late_basis


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
