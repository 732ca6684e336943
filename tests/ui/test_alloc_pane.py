"""The allocations pane shows true device cudaMalloc/cudaFree per phase apart from the other
CUPTI memory records, and says what those are (Pilot, real Textual, real store).

The H100 session this reproduces: thousands of memory records in tokens while the caching
allocator made no cudaMalloc; the pane read "mallocs / frees — tokens 2,740 / 0"."""
from __future__ import annotations

import asyncio
import dataclasses

from tuiprof.analysis.allocs import memory_summary
from tuiprof.collect.replay import replay_into
from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app

from .conftest import FakeControl, screen_text


def _store(recordings) -> SessionStore:
    """The eager recording without its own memory records, and a prefill holding one real
    cudaMalloc, 2,738 pinned-host records and a pool allocation."""
    st = SessionStore()
    rec = recordings["eager"]
    replay_into(dataclasses.replace(rec, records=[r for r in rec.records if r[0] != "A"]), st)
    prefill = [t for t in st.view(raw=False).tokens if t.phase == "prefill"][-1]
    t0 = prefill.start_ns + 1
    recs = [("R", "cudaMalloc", t0, t0 + 1, 900_001),
            ("A", 1, 3, 2 << 20, t0 + 2, 0xA000, 900_001, 0, 0, 7, 1)]            # 1 cudaMalloc
    recs += [("A", 1, 2, 4096, t0 + 3 + i, 0xB000 + i, 0, 0, 0, 7, 0) for i in range(2738)]
    recs += [("A", 1, 3, 1 << 20, t0 + 9000, 0xC000, 0, 1, 1, 7, 0)]               # pool
    st.add_records(recs)
    return st


def test_pane_separates_cudamalloc_from_the_rest(recordings):
    st = _store(recordings)
    app = make_app(FakeControl(st, mode="eager"), title="t", refresh_hz=0, deterministic=True)

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            await pilot.press("4")
            app.refresh_now()
            await pilot.pause()
            text = screen_text(app)
            assert "device cudaMalloc" in text, text
            line = next(ln for ln in text.splitlines() if "prefill/eager" in ln
                        and "1 / 0" in ln)
            assert "2.00 MiB" in line or "2 MiB" in line, line
            rest = next(ln for ln in text.splitlines() if "other records" in ln)
            assert "2,739" in rest and "not device cudaMalloc: pinned host 2,738" in rest, rest
            assert "PyTorch · cudaMalloc" not in text      # the cudaMalloc is not in the rest
            assert "pinned host" in text and "API unknown" in text
    asyncio.run(main())


def test_old_snapshot_without_classes_still_shows(recordings):
    st = SessionStore()
    replay_into(recordings["eager"], st)
    view = st.view()
    for k in ("classes", "device_by_phase"):
        view.allocs.pop(k)
    assert not memory_summary(view.allocs).classified
    app = make_app(FakeControl(st, mode="eager"), title="t", refresh_hz=0, deterministic=True)
    st.view = lambda *a, **k: view                   # the pane reads an old snapshot's counters

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            assert "CUPTI, all kinds (old snapshot)" in screen_text(app)
    asyncio.run(main())
