"""SVG snapshots of the main screen from replayed H100 data, deterministic: no refresh timer,
one explicit refresh, timings/overhead hidden (``deterministic=True``).

Update baselines (after checking the report!) with
``pytest tests/ui/test_snapshots.py --snapshot-update``.
"""
from __future__ import annotations

import pytest

from tuiprof.ui.app import make_app

from .conftest import FakeControl


async def _refresh(pilot):
    await pilot.pause()
    pilot.app.refresh_now()
    await pilot.pause()


@pytest.fixture
def snap_app(store, tmp_path):
    def build():
        ctl = FakeControl(store, mode="compiled", state="done")
        return make_app(ctl, title="tuiprof", export_dir=tmp_path, refresh_hz=0,
                        deterministic=True)
    return build


def test_main_80x24(snap_app, snap_compare):
    assert snap_compare(snap_app(), terminal_size=(80, 24), run_before=_refresh)


def test_main_200x50(snap_app, snap_compare):
    assert snap_compare(snap_app(), terminal_size=(200, 50), run_before=_refresh)


def test_compare_120x40(snap_app, snap_compare):
    async def run_before(pilot):
        await _refresh(pilot)
        await pilot.press("v")
        await pilot.pause(0.3)  # the comparison is built on a timer after the first paint
    assert snap_compare(snap_app(), terminal_size=(120, 40), run_before=run_before)
