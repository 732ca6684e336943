"""The all-ranks split from mirrored stores whose bursts arrive in a different order on each
rank: rank 0's records of a traced step come at once, rank 1's three steps later and last step
first (CUPTI buffers complete when they will). The split uses the steps traced on every rank,
fills as soon as one is, and stays after the burst left the stores' raw ring (the traced
tokens the store keeps for readers of the last traced steps)."""
from __future__ import annotations

from ranks_data import simulate_tp

from tuiprof.analysis.cross_rank import ranks_summary
from tuiprof.sessions.mirror import Mirror
from tuiprof.store import SessionStore
from tuiprof.store.rank_set import RanksView
from tuiprof.ui.app import newer_rank_analysis

BURSTS = ((2, 3, 4, 5), (40, 41, 42, 43))
TRACED = {s for b in BURSTS for s in b}
STEPS = 64
LAG = {0: 0, 1: 3}          # steps between a step and the arrival of its records, per rank


def test_bursts_arriving_in_a_different_order_on_each_rank_fill_the_split_and_stay():
    src, _ = simulate_tp([600, 100], steps=STEPS, calls=3)
    rows = [{t.step: t for t in s.view().tokens} for s in src]
    recs: list[dict] = [{}, {}]       # per rank: step -> its records
    for r, s in enumerate(src):
        by_seq = {t.seq: t.step for t in s.view().tokens}
        for seq, rr in s.view().raw:
            recs[r][by_seq[seq]] = rr
    stores = [SessionStore(ring_tokens=8) for _ in range(2)]
    for r, st in enumerate(stores):
        st.meta.update(src[r].meta)
    mirrors = [Mirror() for _ in range(2)]
    cursors: list = [None, None]
    due: list[dict] = [{}, {}]        # step it arrives at -> [steps whose records arrive then]
    for r in range(2):
        for burst in BURSTS:
            at = burst[-1] + LAG[r]
            due[r].setdefault(at, []).extend(reversed(burst) if r == 1 else burst)
    shown = None
    filled_at = None
    history = []
    for step in range(STEPS):
        for r, st in enumerate(stores):
            t = rows[r][step]
            seq = st.begin_token("decode", "eager", t.start_ns, step, 0)
            if step not in TRACED:   # an untraced step: API records only (no device activity)
                st.add_records([("R", "cudaLaunchKernel_v7000", t.start_ns + 1000,
                                 t.start_ns + 5000, 99)])
            st.end_token(seq, t.end_ns, t.host_ms, None, 1)
            for s in due[r].get(step, ()):
                st.add_records(recs[r][s])
            # the app's findings pull: the raw records of the last 16 traced tokens
            delta, cursors[r] = st.changes(cursors[r], 16)
            mirrors[r].apply(delta)
        rv = RanksView(tuple(m.view() for m in mirrors))
        s = ranks_summary(rv, "eager")
        shown = newer_rank_analysis(shown, (s, []))
        history.append((step, s.steps, shown[0].steps, s.late_basis))
        if filled_at is None and shown[0].steps:
            filled_at = step
    # rank 1's first burst arrives at step 8: the split fills then, with all four steps
    assert filled_at == 5 + LAG[1]
    assert dict((h[0], h[1]) for h in history)[filled_at] == 4
    # until then rank 0's traced steps alone give no split, and the view says why
    assert all(h[1] == 0 for h in history if h[0] < filled_at)
    assert history[5][3] == "no step traced on every rank yet (traced steps per rank: 4, 0)"
    # the ring holds 8 tokens: the first burst left it by step 14, yet its steps stay
    assert all(h[1] == 4 for h in history if filled_at <= h[0] < 43)
    # the second burst: compared as soon as rank 1's records arrive, 8 steps of both
    assert dict((h[0], h[1]) for h in history)[43 + LAG[1]] == 8
    final = shown[0]
    assert final.late_rank == 0 and final.calls == 24 and final.incomplete_calls == 0
    assert [k[1] for k in final.comm.keys] == sorted(TRACED)


def test_a_newer_analysis_without_common_steps_keeps_the_last_split():
    class S:
        def __init__(self, mode, steps):
            self.mode, self.steps = mode, steps

    old = (S("eager", 4), ["f"])
    assert newer_rank_analysis(old, (S("eager", 0), [])) is old
    new = (S("eager", 2), [])
    assert newer_rank_analysis(old, new) is new
    switched = (S("compiled", 0), [])
    assert newer_rank_analysis(old, switched) is switched   # another mode: not the old split
    assert newer_rank_analysis(None, None) is None and newer_rank_analysis(old, None) is old
