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
