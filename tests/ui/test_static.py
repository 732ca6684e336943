"""``tuiprof view SNAPSHOT.json``: the same app over a read-only control."""
from __future__ import annotations

import asyncio

import pytest

from tuiprof.ui.app import make_app
from tuiprof.ui.static import StaticViewControl

from .conftest import screen_text


def _roundtrip(view, tmp_path):
    snap = pytest.importorskip("tuiprof.export.snapshot")
    path = tmp_path / "s.json"
    snap.write_snapshot(view, path)
    return path


def test_view_control_helper(store):
    from tuiprof.ui.app import view_control
    ctl = view_control(store.view(), "a.json")
    assert isinstance(ctl, StaticViewControl) and "a.json" in ctl.status.message


def test_static_control_is_read_only(store):
    ctl = StaticViewControl(store.view(), "x.json")
    assert ctl.status.state == "read-only" and not ctl.status.live
    assert "read-only" in ctl.reset() and "read-only" in ctl.toggle_mode()
    assert ctl.store.view() is ctl.store.view()


def test_app_over_a_reopened_snapshot(store, tmp_path):
    path = _roundtrip(store.view(), tmp_path)
    ctl = StaticViewControl.from_path(path)
    app = make_app(ctl, title="view", export_dir=tmp_path, refresh_hz=0, deterministic=True)

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            text = screen_text(app)
            assert "read-only" in text and "nvjet" in text
            await pilot.press("r")
            assert "read-only" in app.last_message
            await pilot.press("c")
            assert "read-only" in app.last_message
            await pilot.press("q")
            await app.workers.wait_for_complete()
            await pilot.pause()
    asyncio.run(main())


def test_view_reopens_a_multi_configuration_snapshot(tmp_path):
    """A session measured at batch 1 and batch 4 (eager) reopens with both configurations:
    the kernels pane can pick either (``k``) and the compare screen lists both."""
    from tuiprof.store import SessionStore
    from tuiprof.ui.screens.compare import CompareScreen
    from tuiprof.ui.widgets.kernels_pane import KernelsPane

    store = SessionStore(meta={"model": "qwen3-tiny", "device": "cpu", "batch": 1})
    t = 0
    for batch, ms in ((1, 10.0), (4, 12.0)):
        for step in range(6):
            seq = store.begin_token("decode", "eager", t, step, batch=batch, config=batch)
            t += int(ms * 1e6)
            store.end_token(seq, t, ms)
    ctl = StaticViewControl.from_path(_roundtrip(store.view(), tmp_path))
    view = ctl.store.view()
    assert view.meta["batch"] == 1 and view.config_keys == [1, 4]
    for key, ms in ((1, 10.0), (4, 12.0)):
        ts = view.select(key).token_stats[("decode", "eager")]
        assert ts["host_ms"].count == 6 and ts["host_ms"].median == ms and ts["seqs"].mean == key
    app = make_app(ctl, title="view", export_dir=tmp_path, refresh_hz=0, deterministic=True)

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            k = app.main.query_one(KernelsPane)
            await pilot.press("k")
            assert k.resolved_batch == 1
            await pilot.press("k")
            assert k.resolved_batch == 4
            await pilot.press("v")
            await pilot.pause(0.3)  # the comparison is built on a timer after the first paint
            assert isinstance(app.screen, CompareScreen)
            text = screen_text(app)
            assert "b1 eager" in text and "b4 eager" in text
    asyncio.run(main())


def test_tuiprof_view_names_the_file_on_the_status_line(store, tmp_path, monkeypatch):
    """``tuiprof view FILE`` said "snapshot snapshot": the control was made without the file's
    name. The name (made printable) follows "snapshot" now."""
    import tuiprof.ui.app as ui_app
    from tuiprof import cli

    path = _roundtrip(store.view(), tmp_path)
    odd = path.with_name("run\x1b[2J.json")
    path.rename(odd)
    seen = {}

    def run_app(control, **kw):
        seen["message"], seen["title"] = control.status.message, kw["title"]
        return 0

    monkeypatch.setattr(ui_app, "run_app", run_app)
    assert cli.main(["view", str(odd)]) == 0
    assert seen["message"] == "snapshot run\\x1b[2J.json", seen
    assert seen["title"] == "tuiprof view run\\x1b[2J.json"
