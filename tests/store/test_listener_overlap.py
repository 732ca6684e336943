"""The profiler's per-token store work runs in ``token_launched`` (while the device computes the
next step), not after each token's sync; engines that never call ``token_launched`` get it done
at once. Measured effect on the H100: docs/performance.md."""
from __future__ import annotations

from tuiprof.engine.events import TokenEvent
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore


def _prof() -> tuple[Profiler, SessionStore]:
    store = SessionStore(ring_tokens=8)
    return Profiler(store, ProfilerOptions(cupti=False, nvml=False, alloc_every=0)), store


def _ev(i: int, step: int, phase: str = "decode") -> TokenEvent:
    return TokenEvent(i, step, phase, "eager", 100 + i, 1000 * i, 1000 * i + 900, 0.9, None, 0)


def _done(store: SessionStore) -> list[int]:
    return [t.seq for t in store.view(raw=False).tokens if t.done]


def test_store_work_waits_for_the_next_launch():
    prof, store = _prof()
    prof.token_started("prefill", "eager", -1, 0, 0)
    prof.token_launched()
    prof.token_finished(_ev(0, -1, "prefill"))
    prof.state_changed("decode")             # a boundary: everything so far is stored
    assert _done(store) == [0]
    for i in range(1, 4):
        prof.token_started("decode", "eager", i - 1, 0, 1000 * i)
        prof.token_launched()                # the previous token's end is stored here ...
        assert _done(store) == list(range(i))
        prof.token_finished(_ev(i, i - 1))   # ... and not after this token's sync
        assert _done(store) == list(range(i))
    prof.state_changed("done")
    rows = store.view(raw=False).tokens
    assert _done(store) == [0, 1, 2, 3]
    assert [t.token_id for t in rows] == [100, 101, 102, 103]
    assert [t.end_ns for t in rows] == [900, 1900, 2900, 3900]


def test_without_token_launched_the_work_is_done_at_once():
    prof, store = _prof()
    for i in range(3):
        prof.token_started("decode", "eager", i, 0, 1000 * i)
        prof.token_finished(_ev(i, i))
        assert _done(store) == list(range(i + 1))


def test_overlap_off_does_the_work_after_each_sync():
    prof, store = _prof()
    prof.options.overlap = False
    for i in range(3):
        prof.token_started("decode", "eager", i, 0, 1000 * i)
        prof.token_launched()
        prof.token_finished(_ev(i, i))
        assert _done(store) == list(range(i + 1))
