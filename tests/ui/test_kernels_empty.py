"""The kernels pane says why it has no kernel instead of showing a blank table; what a reopened
snapshot says of its collectors and model reaches no pane with its escape sequences."""
from __future__ import annotations

import asyncio
import json

from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app
from tuiprof.ui.static import StaticViewControl
from tuiprof.ui.widgets.kernels_pane import KernelsPane

from .conftest import screen_text


def _decoded(store: SessionStore) -> SessionStore:
    t = 0
    for step in range(6):
        seq = store.begin_token("decode", "eager", t, step)
        t += 10_000_000
        store.end_token(seq, t, 10.0)
    return store


def _pane_after_paint(store: SessionStore, tmp_path, size=(80, 24)):
    app = make_app(StaticViewControl(store.view(), "x.json"), title="t", export_dir=tmp_path,
                   refresh_hz=0, deterministic=True)
    seen: dict = {}

    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            pane = app.main.query_one(KernelsPane)
            seen["empty"] = pane.has_class("-empty")
            seen["text"] = screen_text(app)
    asyncio.run(main())
    return seen


def test_no_cupti_names_the_reason(tmp_path):
    store = _decoded(SessionStore(meta={"model": "m", "device": "cpu"}))
    store.set_collector("cupti", False, "no CUPTI: CUDA driver is not found\x1b[2J")
    seen = _pane_after_paint(store, tmp_path, size=(200, 50))
    assert seen["empty"]
    text = " ".join(seen["text"].split())
    assert "No kernel records in this session: no CUPTI: CUDA driver is not found" in text
    assert "\x1b" not in seen["text"]  # the collector's text is made safe first


def test_cupti_on_but_nothing_traced_yet(tmp_path):
    store = _decoded(SessionStore(meta={"model": "m", "device": "cuda"}))
    store.set_collector("cupti", True, "CUPTI: kernels")
    seen = _pane_after_paint(store, tmp_path, size=(200, 50))
    assert seen["empty"] and "No eager decode step traced yet" in " ".join(seen["text"].split())


def test_kernels_present_shows_the_table(store, tmp_path):
    seen = _pane_after_paint(store, tmp_path, size=(200, 50))
    assert not seen["empty"] and "nvjet" in seen["text"]


def test_a_reopened_snapshots_collector_text_reaches_no_pane_raw(tmp_path):
    """A snapshot is a file: what it says of its collectors is made safe on every pane."""
    from tuiprof.export.snapshot import write_snapshot

    store = _decoded(SessionStore(meta={"model": "m", "device": "cpu"}))
    store.set_collector("cupti", False, "no CUPTI\x1b[2J\x1b]0;owned\x07\nsecond line")
    store.set_collector("nvml", False, "no NVML\x1b[31m")
    path = tmp_path / "s.json"
    write_snapshot(store.view(), path)
    doc = json.loads(path.read_text())
    doc["meta"]["model"] = "MODEL\x1b[31m"  # as a hand-edited or hostile file may say
    path.write_text(json.dumps(doc))
    app = make_app(StaticViewControl.from_path(path), title="t", export_dir=tmp_path,
                   refresh_hz=0, deterministic=True)
    texts = []

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            for key in ("1", "2", "3", "4", "5"):
                await pilot.press(key)
                app.refresh_now()
                await pilot.pause()
                texts.append(screen_text(app))
    asyncio.run(main())
    joined = "".join(texts)
    assert "\x1b" not in joined and "\x07" not in joined and "no CUPTI" in joined and "MODEL" in joined


def test_a_refresh_while_the_panes_are_taken_down_does_nothing(tmp_path):
    """Quitting takes the main screen's panes down while it is still mounted; a refresh tick
    that lands then must not raise (Textual re-raises it at exit: a traceback for the user)."""
    from tuiprof.ui.widgets.header import HeaderPane

    store = _decoded(SessionStore(meta={"model": "m", "device": "cpu"}))
    app = make_app(StaticViewControl(store.view(), "x.json"), title="t", export_dir=tmp_path,
                   refresh_hz=0, deterministic=True)
    seen: dict = {}

    async def main():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await app.main.query_one(HeaderPane).remove()
            assert app.main.is_mounted
            app.refresh_view(force=True)
            seen["ok"] = True
    asyncio.run(main())
    assert seen["ok"]
