"""CUPTI attached for compiled bursts only: the collector attaches two tokens before each
burst's warm-up and finalizes after it, makes no CUPTI call while finalized (any call would
initialize CUPTI again: its consumer's dropped-record poll and the token clock included), and
the profiler drops the CUDA graphs after each attach and before each finalize. CUPTI cannot run
on a CPU, so a stand-in refuses every call between ``finalize`` and the next registration
(``tests/cupti_standin.py``); the real cycle runs on the H100 (tests/gpu/test_detach_gpu.py,
docs/performance.md#cupti-and-cuda-graphs)."""
from __future__ import annotations

import pytest

from cupti_standin import StandIn, attached_collector

from tuiprof.collect.cupti_collector import ATTACH_LEAD, BURST, CuptiCollector
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore


def _attached(sample_every: int = 8) -> tuple[CuptiCollector, StandIn]:
    return attached_collector(sample_every=sample_every)


def test_attached_around_bursts_only_and_silent_while_finalized():
    c, cupti = _attached(sample_every=8)                 # bursts of 4 in every 32 tokens
    period = 8 * BURST
    switches, traced = [], []
    for seq in range(2 * period):
        want = c.attach_wanted(seq)
        if want is True:
            c.attach()
            switches.append(("attach", seq))
        elif want is False:
            c.detach()
            switches.append(("detach", seq))
        if c.on_token_start(seq):
            traced.append(seq)
        if not c.attached:
            assert c.clock() > 0                          # the host clock, no CUPTI call
            c._poll_dropped()                             # the consumer's poll: no call
    assert switches == [("detach", BURST + 1), ("attach", period - ATTACH_LEAD),
                        ("detach", period + BURST + 1), ("attach", 2 * period - ATTACH_LEAD)]
    assert traced == [1, 2, 3, 4, period + 1, period + 2, period + 3, period + 4]
    assert c.detaches == 2 and c.attached
    # each detach hands the burst's records over before finalizing
    finals = [i for i, name in enumerate(cupti.calls) if name == "finalize"]
    assert len(finals) == 2
    for a, b in zip([0] + finals, finals):
        assert "activity_flush_all" in cupti.calls[a:b]
    with pytest.raises(AssertionError):                  # the stand-in does refuse
        c.detach()
        c._cupti.get_timestamp()


def test_stop_while_detached_makes_no_cupti_call():
    c, cupti = _attached()
    c.detach()
    c.stop()
    assert cupti.calls.count("finalize") == 1 and not c.running


def test_profiler_drops_graphs_after_attach_and_before_detach(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: order.append("drop") or 0)
    prof = Profiler(SessionStore(), ProfilerOptions())      # the default
    c, cupti = _attached(sample_every=8)
    c.bursts_only = False
    real_detach, real_attach = c.detach, c.attach
    c.detach = lambda: (order.append("detach"), real_detach())[1]
    c.attach = lambda: (order.append("attach"), real_attach())[1]
    for mode in ("compiled", "eager"):                    # eager: bursts only too
        prof.cupti, prof.status.mode = c, mode
        order.clear()
        for seq in range(BURST + 1, 8 * BURST + BURST + 1):  # to the end of the second burst
            prof._cycle_cupti(seq, prefill=False)
        assert order == ["drop", "detach", "attach", "drop"], mode
        assert c.bursts_only and c.attached


def test_a_refused_attach_leaves_the_session_detached_without_retrying(monkeypatch):
    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: 0)
    prof = Profiler(SessionStore(), ProfilerOptions())
    c, cupti = _attached(sample_every=8)
    c.bursts_only = False
    prof.cupti, prof.status.mode = c, "eager"
    prof._cycle_cupti(BURST + 1, prefill=False)
    assert not c.attached
    tries = []

    def refuse():
        tries.append(1)
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    cupti.get_timestamp = refuse                      # another profiler took CUPTI meanwhile
    c.raw = True
    for seq in range(8 * BURST - ATTACH_LEAD, 16 * BURST):
        prof._cycle_cupti(seq, prefill=False)
    assert len(tries) == 1 and not c.attached and not c.bursts_only
    msg = c.store.view().collectors["cupti"]
    assert not msg["ok"] and "another profiler holds CUPTI" in msg["message"]


def test_a_due_prefill_attaches_and_a_compile_beside_decoding_switches_nothing(monkeypatch):
    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: 0)
    prof = Profiler(SessionStore(), ProfilerOptions())
    c, cupti = _attached(sample_every=8)
    prof.cupti, prof.status.mode = c, "eager"
    prof._cycle_cupti(BURST + 1, prefill=False)
    assert not c.attached
    assert prof._cycle_cupti(10, prefill=True) == 0 and c.attached   # attached for it
    assert c.on_token_start(10, prefill=True)                         # and traced
    prof._cycle_cupti(11, prefill=False)
    assert not c.attached
    prof._cycle_cupti(12, prefill=True)      # another prefill within the period: not traced
    assert not c.attached
    prof._compiling = True                   # beside a compile: no switch
    assert prof._cycle_cupti(8 * BURST - ATTACH_LEAD, prefill=False) is None
    assert not c.attached


def test_steps_after_a_graph_drop_are_timed_apart(monkeypatch):
    """The step that records the CUDA graphs again begins after the switch and is kept out
    of the clean figures (its time is tuiprof's); the others are not."""
    from tuiprof.analysis.tokens import tokens_of
    from tuiprof.ui.derive import done_rows, latency_series

    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: 3)
    store = SessionStore()
    prof = Profiler(store, ProfilerOptions(), engine_factory=None)
    c, cupti = _attached(sample_every=8)
    c.store = store
    prof.cupti, prof._may_detach, prof.status.mode = c, True, "compiled"
    clock = iter(range(1_000_000, 10**9, 1_000_000))
    c.clock = lambda: next(clock)            # detach() and the step start read it
    rows = {}
    for seq in range(BURST + 3):
        prof.token_started("decode", "compiled", seq, 0, 10 * seq)
        prof._catch_up()
        rows[seq] = store.view().tokens[-1]
        store.end_token(seq, 10 * seq + 9, host_ms=40.0 if seq == BURST + 1 else 3.0, gpu_ms=2.0)
    switched = rows[BURST + 1]               # the first step after the burst: graphs dropped
    assert switched.rerecord and switched.start_ns >= 1_000_000 and not c.attached
    assert [r.seq for r in rows.values() if r.rerecord] == [BURST + 1]
    view = store.view()
    assert BURST + 1 not in [r.seq for r in done_rows(view, "decode")]
    assert BURST + 1 not in [t.seq for t in tokens_of(view, "decode", sampled_only=False)]
    ts = view.token_stats[("decode", "compiled")]
    assert ts["rerecord_ms"].count == 1 and ts["host_ms"].max == 3.0
    assert latency_series(view).rerecord == [(BURST + 1, 40.0)]


def test_after_a_drop_at_a_prefill_the_next_compiled_step_is_the_one_timed_apart(monkeypatch):
    """A due prefill attaches CUPTI and drops the graphs; the prefill is eager and replays
    none: the compiled step after it records them again (30-55 ms on the H100)."""
    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: 3)
    store = SessionStore()
    prof = Profiler(store, ProfilerOptions())
    c, cupti = _attached(sample_every=8)
    c.store = store
    prof.cupti, prof._may_detach, prof.status.mode = c, True, "compiled"
    c.detach()
    steps = [("prefill", "eager"), ("decode", "compiled"), ("decode", "compiled")]
    for seq, (phase, mode) in enumerate(steps, start=10):
        prof.token_started(phase, mode, seq, 0, 10 * seq)
        prof._catch_up()
        store.end_token(seq - 10, 10 * seq + 9, host_ms=3.0)
    rows = store.view().tokens
    assert [r.phase for r in rows] == ["prefill", "decode", "decode"]
    assert [r.rerecord for r in rows] == [False, True, False]
    assert rows[0].sampled                   # the prefill was traced: it was due


def test_a_due_eager_prefills_attach_keeps_the_graphs_unless_one_is_captured(monkeypatch):
    """An attach for an eager prefill alone (outside a burst) drops no graph and its detach
    none either: an eager step replays no graph, so CUPTI saw none. A capture while attached,
    a compiled prefill, or no capture count (the built-in engine) drop them as before."""
    drops: list[int] = []
    monkeypatch.setattr("tuiprof.profiler.drop_cuda_graphs", lambda: drops.append(1) or 3)
    captures = [0]
    prof = Profiler(SessionStore(), ProfilerOptions())
    c, cupti = _attached(sample_every=8)
    prof.cupti, prof._may_detach, prof.status.mode = c, True, "compiled"
    prof.allow_bursts_only(lambda: "", lambda: captures[0])
    prof._may_detach = True
    prof._cycle_cupti(BURST + 1, prefill=False)              # the burst's detach drops
    assert not c.attached and drops == [1]
    drops.clear()
    assert prof._cycle_cupti(10, prefill=True, eager=True) == 0 and c.attached
    assert prof._cycle_cupti(11, prefill=False) == 0 and not c.attached
    assert drops == []                                        # kept across attach and detach
    c._prefill_seq = None                                     # due again
    assert prof._cycle_cupti(12, prefill=True, eager=True) == 0 and c.attached
    captures[0] += 1                                          # a graph recorded under CUPTI
    assert prof._cycle_cupti(13, prefill=False) == 3 and not c.attached
    assert drops == [1]
    for eager, count in ((False, lambda: captures[0]), (True, None)):
        drops.clear()
        c._prefill_seq = None
        prof._captures = count
        assert prof._cycle_cupti(14, prefill=True, eager=eager) == 3 and c.attached
        assert prof._cycle_cupti(15, prefill=False) == 3 and not c.attached
        assert drops == [1, 1]
    # attached on from a kept prefill into a burst's window: the graphs go before its first step
    drops.clear()
    prof._captures = lambda: captures[0]
    lead = 8 * BURST - ATTACH_LEAD
    c._prefill_seq = None
    assert prof._cycle_cupti(lead - 1, prefill=True, eager=True) == 0 and c.attached
    assert drops == []
    assert prof._cycle_cupti(lead, prefill=False) == 3 and c.attached   # no switch, a drop
    assert drops == [1] and prof._kept_graphs_at is None
    assert prof._cycle_cupti(lead + 1, prefill=False) is None            # nothing more
    prof._cycle_cupti(8 * BURST + BURST + 1, prefill=False)               # the burst's detach
    assert drops == [1, 1] and not c.attached
    # a prefill inside a burst's window is the burst's: its graphs go as a burst's do
    drops.clear()
    c._prefill_seq = None
    assert prof._cycle_cupti(2 * 8 * BURST - ATTACH_LEAD, prefill=True, eager=True) == 3
    assert drops == [1]


def test_detach_folds_every_record_before_finalizing():
    """Records still queued are parsed before the finalize: their kernel and API names are
    read through CUPTI (pointers into its memory, get_callback_name), which finalize frees."""
    c, cupti = _attached()
    store = c.store
    seq = store.begin_token("decode", "compiled", 1_000, step=0, sampled=True)
    store.end_token(seq, 90_000, host_ms=0.09, gpu_ms=0.08)
    c._queue.append([("K", "gemv", 2_000, 3_000, 1, 1, 1, 32, 1, 1, 32, 0, 7, 1, 0)])
    seen = []
    finalize = cupti.finalize
    cupti.finalize = lambda: (seen.append(store.view().counters["kernels"]), finalize())
    old_names = c._names
    c.detach()
    assert seen == [1] and not c._queue
    assert c._names is not old_names       # name pointers of the finalized CUPTI are forgotten


def test_a_buffer_given_back_during_the_finalize_is_not_parsed():
    """Its kernel names would point into memory the finalize frees: counted, not parsed."""
    import ctypes

    from tuiprof.collect.cupti_raw import RawBuffers

    c, cupti = _attached()
    pool = c._rawbufs = RawBuffers(4096, c._queue_raw)
    buf, size, recs = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    pool._request(ctypes.pointer(buf), ctypes.pointer(size), ctypes.pointer(recs))
    finalize = cupti.finalize
    cupti.finalize = lambda: (pool._complete(None, 0, buf.value, 4096, 8), finalize())
    c.detach()
    assert not c._queue and pool.stale == 1 and c.stranded_buffers == 1
    assert c.buffer_stats()["stale"] == 1
