"""CUPTI attached for compiled bursts only: the collector attaches two tokens before each
burst's warm-up and finalizes after it, makes no CUPTI call while finalized (any call would
initialize CUPTI again: its consumer's dropped-record poll and the token clock included), and
the profiler drops the CUDA graphs after each attach and before each finalize. CUPTI cannot run
on a CPU, so a stand-in refuses every call between ``finalize`` and the next registration;
the real cycle runs on the H100 (tests/gpu/test_detach_gpu.py, docs/gpu-verification.md §32)."""
from __future__ import annotations

import pytest

from tuiprof.collect.cupti_collector import ATTACH_LEAD, BURST, CuptiCollector
from tuiprof.profiler import Profiler, ProfilerOptions
from tuiprof.store import SessionStore


class StandIn:
    """Records CUPTI calls; any call between finalize() and the next registration fails."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET, MEMORY2, MARKER = 1, 2, 3, 4, 5

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.finalized = False

    def _call(self, name: str) -> None:
        if self.finalized:
            raise AssertionError(f"CUPTI {name}() called while finalized")
        self.calls.append(name)

    def activity_register_callbacks(self, *cbs) -> None:
        self.finalized = False
        self.calls.append("register")

    def finalize(self) -> None:
        self._call("finalize")
        self.finalized = True

    def __getattr__(self, name):  # activity_enable, activity_flush_all, get_timestamp, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a: self._call(name) or 0


def _attached(sample_every: int = 8) -> tuple[CuptiCollector, StandIn]:
    c = CuptiCollector(SessionStore(), sample_every=sample_every, api=False, raw=False)
    cupti = StandIn()
    c._cupti = cupti
    c._attach()
    c.running = True  # start() without the consumer thread: the test drives everything
    c.bursts_only = True
    return c, cupti


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
    prof = Profiler(SessionStore(), ProfilerOptions(detach_between_bursts=True))
    c, cupti = _attached(sample_every=8)
    real_detach, real_attach = c.detach, c.attach
    c.detach = lambda: (order.append("detach"), real_detach())[1]
    c.attach = lambda: (order.append("attach"), real_attach())[1]
    prof.cupti, prof.status.mode = c, "compiled"
    for seq in range(BURST + 1, 8 * BURST + BURST + 1):  # to the end of the second burst
        prof._cycle_cupti(seq)
    assert order == ["drop", "detach", "attach", "drop"]
    prof.status.mode = "eager"                           # eager: attached throughout
    c.detach()
    order.clear()
    prof._cycle_cupti(40)
    assert order == ["attach", "drop"] and c.attached and not c.bursts_only


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
