"""Per-token figures taken from kernel records divide by the tokens that were traced, and a
traced token's busy share is over its own wall time, also once those tokens have left the
store's window: with the live app's sampling (4 tokens in every 256 eager, 4,096 compiled)
dividing by every token made the findings' launches and ms per token 64 to 1,000 times too
small and the busy share ~0 % (seen on snapshots of H100 sessions)."""
from __future__ import annotations

import pytest

from tuiprof.analysis.findings import find
from tuiprof.analysis.tokens import mode_summaries, traced_tokens
from tuiprof.store import SessionStore

from split_data import FILL, kernel

MS = 1_000_000
EVERY = 8          # one traced token in 8
KERNELS = 10       # each traced token: 10 fills of 100 µs back to back = 1 ms busy of its 2 ms


def _sampled_store(tokens: int = 64, series_len: int = 8) -> SessionStore:
    store = SessionStore(ring_tokens=4, series_len=series_len,
                         meta={"model": "m", "device": "cuda", "mode": "eager"})
    store.set_collector("cupti", True, "CUPTI: kernels")
    for i in range(tokens):
        t0 = i * 2 * MS
        traced = i % EVERY == 0
        seq = store.begin_token("decode", "eager", t0, i, sampled=traced)
        if traced:
            store.add_records([kernel(FILL, t0 + MS // 2 + k * MS // 10, MS // 10, 1000 * i + k)
                               for k in range(KERNELS)])
        store.end_token(seq, t0 + 2 * MS, 2.0)
    return store


def test_busy_share_is_the_traced_tokens_own():
    view = _sampled_store().view()
    s = mode_summaries(view)["eager"]
    assert traced_tokens(view, "decode", "eager") == 64 // EVERY
    assert s.kernels_per_token == KERNELS
    assert s.busy_ms_per_token == pytest.approx(1.0)
    assert s.busy_fraction == pytest.approx(0.5)   # 1 ms busy of a 2 ms step, not 1/16 of it


def test_findings_count_per_traced_token():
    view = _sampled_store().view()
    fus = next(f for f in find(view) if f.id == "fusable-kernels")
    assert fus.numbers["launches_per_token"] == pytest.approx(KERNELS)
    assert fus.impact_ms_per_token == pytest.approx(1.0)
    assert "10 launches, 1.00 ms per token" in fus.evidence


def test_same_figures_while_every_token_is_in_the_window():
    small, big = _sampled_store(series_len=8).view(), _sampled_store(series_len=1000).view()
    a, b = mode_summaries(small)["eager"], mode_summaries(big)["eager"]
    assert (a.kernels_per_token, a.busy_fraction) == pytest.approx((b.kernels_per_token,
                                                                    b.busy_fraction))
