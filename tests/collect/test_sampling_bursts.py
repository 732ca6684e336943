"""Burst sampling switches the device kinds *and* the API subset's callback ids together, and a
prefill is always traced. CUPTI cannot run on a CPU, so a stand-in records the enable/disable
calls the collector makes (the real switching is verified on the H100: docs/gpu-verification.md
§12 and §17)."""
from __future__ import annotations

from tuiprof.collect.cupti_collector import BURST, CuptiCollector
from tuiprof.store import SessionStore


class Calls:
    def __init__(self) -> None:
        self.kinds: list[tuple[str, int]] = []
        self.api: list[tuple[int, int]] = []
        self.flushes = 0

    def activity_enable(self, k):
        self.kinds.append(("on", k))

    def activity_disable(self, k):
        self.kinds.append(("off", k))

    def activity_flush_all(self, flag):
        self.flushes += 1

    def api_fn(self, cbid, on):
        self.api.append((cbid, on))


def _collector(sample_every: int) -> tuple[CuptiCollector, Calls]:
    c = CuptiCollector(SessionStore(), sample_every=sample_every)
    calls = Calls()
    c._cupti = calls
    c._device_kinds = [1, 2, 3]
    c._api_ids = [(calls.api_fn, 211), (calls.api_fn, 13)]
    c._api_on = True                     # as after start(): the subset is on
    c._device_on = True
    return c, calls


def test_bursts_switch_kinds_and_api_ids_together():
    c, calls = _collector(sample_every=8)          # bursts of 4 in every 32 tokens
    period = 8 * BURST
    traced = [c.on_token_start(seq, always=(seq == 0)) for seq in range(2 * period)]
    # seq 0 is a prefill: traced; then 1..4 of each period traced, 0 of a period is warm-up
    assert traced[0] is True
    assert [s for s in range(1, 2 * period) if traced[s]] == \
        [1, 2, 3, 4, period + 1, period + 2, period + 3, period + 4]
    # kinds and API ids go off after the burst and on for the next one (warm-up included)
    assert calls.api[:2] == [(211, 0), (13, 0)] and calls.kinds[:3] == [("off", 1), ("off", 2),
                                                                        ("off", 3)]
    assert calls.api[2:4] == [(211, 1), (13, 1)] and calls.kinds[3:6] == [("on", 1), ("on", 2),
                                                                          ("on", 3)]
    assert len(calls.api) == 6 and calls.flushes == 2   # each burst handed over when it ended
    assert c._api_on is False and c._device_on is False


def test_every_token_keeps_api_on_and_paused_turns_kinds_off():
    c, calls = _collector(sample_every=1)
    assert all(c.on_token_start(s) for s in range(10))
    assert calls.api == [] and calls.kinds == []         # nothing to switch
    c.paused = True
    assert c.on_token_start(10) is False
    assert calls.kinds == [("off", 1), ("off", 2), ("off", 3)]
