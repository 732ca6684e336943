"""Collective calls matched across ranks: transfer, wait, the late rank and why it was late.

Per-rank kernel streams come from :func:`ranks_data.simulate_tp`: host-bound eager decode
simulated rank by rank (each rank's host, its GPU, an all-reduce that completes on every rank
when the last one arrives), fed through real SessionStores; the expected figures are the
simulation's own."""
from __future__ import annotations

import random
import statistics

import pytest

from ranks_data import US, simulate_tp

from tuiprof.analysis.collectives import collectives, match_calls
from tuiprof.analysis.cross_rank import find_ranks, ranks_summary
from tuiprof.store.rank_set import RanksView


def _views(stores):
    return RanksView(tuple(s.view() for s in stores))


def test_order_matching_when_every_rank_has_every_kernel():
    a = [(0, 10, "x"), (20, 30, "x")]
    b = [(5, 11, "x"), (25, 31, "x")]
    assert match_calls([a, b]) == [[0, 0], [1, 1]]


def test_a_missing_kernel_is_matched_by_end_time():
    # rank 1 lacks the second call: the calls still pair by their common end times
    a = [(0, 100, "x"), (200, 300, "x"), (400, 500, "x")]
    b = [(50, 101, "x"), (450, 502, "x")]
    assert match_calls([a, b]) == [[0, 0], [1, None], [2, 1]]


def test_a_known_late_rank_its_lateness_and_the_others_wait():
    # rank 0's host needs 900 µs between a layer's matmul and its all-reduce, the others 100
    stores, truth = simulate_tp([900, 100, 100, 100], steps=6, calls=4, transfer_us=30)
    c = collectives([s.view() for s in stores], "eager")
    assert len(c.keys) == 6 and c.incomplete == 0 and len(c.complete) == 24
    for call in c.complete:
        t = truth[(call.key[1], call.index)]
        assert call.transfer == 30 * US
        assert call.late == 0 == t["late"]
        assert list(call.waits) == [max(t["starts"]) - s for s in t["starts"]]
        assert call.cause == "host"            # its GPU idle until its host launched
    s = ranks_summary(_views(stores))
    assert s.late_rank == 0 and s.ranks[0].late_share == 1.0
    assert s.transfer_ms == pytest.approx(4 * 0.030)
    # the others wait for rank 0's host in every call: the simulation's start differences
    for r in s.ranks:
        want = sum(max(t["starts"]) - t["starts"][r.rank] for t in truth.values()) / 6 / 1e6
        assert r.wait_ms == pytest.approx(want)
    assert s.ranks[0].wait_ms == 0.0 and 3.2 < s.ranks[1].wait_ms < 3.5
    assert 0.8 < s.ranks[0].late_by_ms < 0.9
    # comm = transfer + wait, and the step adds up
    for r in s.ranks:
        assert r.comm_ms == pytest.approx(r.transfer_ms + r.wait_ms)
        assert r.wall_ms == pytest.approx(r.compute_ms + r.comm_ms - r.overlap_ms + r.idle_ms)
        assert r.comm_share == pytest.approx(r.comm_ms / r.wall_ms)
    f = {x.id: x for x in find_ranks(_views(stores), s)}
    late = f["tp-late-rank"]
    wait = statistics.median(r.wait_ms for r in s.ranks[1:])
    assert late.title.startswith(f"Rank 0 arrives last at 100% of the collectives, "
                                 f"{s.ranks[0].late_by_ms:.2f} ms late on median: the others "
                                 f"wait {wait:.1f} ms per step")
    assert f"ranks 1–3 wait {wait:.2f} ms per step inside NCCL" in late.evidence
    assert "the transfer itself is 0.12 ms per step" in late.evidence
    assert "its GPU sat idle until its host launched the collective" in late.evidence
    assert "tp-communication-bound" not in f     # the transfer is 2 % of the step
    assert f["tp-host-bound"].numbers["rank"] == 0


def test_uneven_launch_delays_each_call_names_its_own_late_rank():
    rng = random.Random(7)
    delays = {(r, s, c): rng.uniform(50, 600) for r in range(3) for s in range(5) for c in range(6)}
    host = [lambda s, c, r=r: delays[(r, s, c)] for r in range(3)]
    stores, truth = simulate_tp(host, steps=5, calls=6, transfer_us=25)
    c = collectives([s.view() for s in stores], "eager")
    assert len(c.complete) == 30
    lates = set()
    for call in c.complete:
        t = truth[(call.key[1], call.index)]
        assert call.late == t["late"] and call.transfer == 25 * US
        others = [x for i, x in enumerate(t["starts"]) if i != t["late"]]
        assert call.late_by == int(max(t["starts"]) - statistics.median(others))
        lates.add(call.late)
    assert lates == {0, 1, 2}
    s = ranks_summary(_views(stores))
    assert sum(r.late_share for r in s.ranks) == pytest.approx(1.0)


def test_a_missing_kernel_leaves_out_its_call_only():
    stores, truth = simulate_tp([700, 100, 100], steps=4, calls=5, transfer_us=40,
                                drop=((2, 1, 3),))
    c = collectives([s.view() for s in stores], "eager")
    assert c.incomplete == 1 and len(c.complete) == 19
    step1 = [x for x in c.calls if x.key[1] == 1]
    assert [x.complete for x in step1] == [True, True, True, False, True]
    assert step1[3].arrivals[2] is None and step1[3].arrivals[0] is not None
    for call in c.complete:
        t = truth[(call.key[1], call.index)]
        assert call.transfer == 40 * US and call.late == 0
        assert call.arrivals[1].start == t["starts"][1]
    s = ranks_summary(_views(stores))
    assert s.incomplete_calls == 1 and s.calls == 19


def test_a_rank_with_more_gpu_work_is_late_for_compute():
    # the same host pace everywhere; rank 1's matmuls take 300 µs longer (a bigger shard)
    stores, _ = simulate_tp([50, 50], compute_us=[100, 400], steps=3, calls=3)
    s = ranks_summary(_views(stores))
    assert s.late_rank == 1 and s.ranks[1].late_causes == {"compute": 9}
    f = {x.id: x for x in find_ranks(_views(stores), s)}
    assert "more work since the previous collective" in f["tp-late-rank"].evidence
    assert "balance the shards" in f["tp-late-rank"].advice


def test_a_synchronisation_before_the_late_launch_is_named():
    syncs = tuple((0, s, c) for s in range(3) for c in range(2))
    stores, _ = simulate_tp([600, 50], steps=3, calls=2, syncs=syncs)
    s = ranks_summary(_views(stores))
    assert s.ranks[0].late_causes == {"sync": 6}
    assert "synchronises" in {x.id: x for x in find_ranks(_views(stores), s)}["tp-late-rank"].advice


def test_only_steps_traced_on_every_rank_are_compared():
    stores, _ = simulate_tp([300, 100], steps=5, calls=2)
    views = [s.view() for s in stores]
    # rank 1's records of its last two steps have not arrived
    keep = {seq for seq, _ in views[1].raw[:3]}
    partial = views[1].__class__(**{**{f: getattr(views[1], f) for f in views[1].__dataclass_fields__},
                                   "raw": [(q, r) for q, r in views[1].raw if q in keep]})
    c = collectives([views[0], partial], "eager")
    assert [k[1] for k in c.keys] == [0, 1, 2]
    s = ranks_summary(RanksView((views[0], partial)))
    assert s.steps == 3 and all(r.traced_steps == 3 for r in s.ranks)


def test_a_known_delay_on_one_rank_is_found_to_within_ten_percent():
    """bench/verify/verify_tp_wait.py's method on simulated ranks with jittery hosts: rank 2 is
    delayed by D1, then D2, before each collective; the others' wait per call grows by
    D2 - D1, and rank 2 is the late rank in both."""
    def run(delay_us: int) -> float:
        rng = random.Random(11)
        jitter = {(r, s, c): rng.uniform(0, 150) for r in range(4) for s in range(8) for c in range(8)}
        host = [lambda s, c, r=r: 200 + jitter[(r, s, c)] + (delay_us if r == 2 else 0)
                for r in range(4)]
        stores, _ = simulate_tp(host, steps=8, calls=8, transfer_us=20)
        summary = ranks_summary(_views(stores))
        assert summary.late_rank == 2 and summary.ranks[2].late_share >= 0.9
        done = summary.comm.complete
        return statistics.median(statistics.mean(c.waits[r] for r in (0, 1, 3)) for c in done)

    d1, d2 = 500, 1500
    found_us = (run(d2) - run(d1)) / 1e3
    assert found_us == pytest.approx(d2 - d1, rel=0.1)
