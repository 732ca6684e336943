"""Fixtures for the UI tests: the real H100 recordings, replayed into real stores, and a
recording test double of SessionControl (the data is real; only the control is fake)."""
from __future__ import annotations

import time

import pytest
from recordings import COMPILED, EAGER, need

from tuiprof.collect.replay import load_recording, replay_into
from tuiprof.control import SessionControl
from tuiprof.store import SessionStore


@pytest.fixture(autouse=True)
def kernel_times_not_measured(monkeypatch):
    """The panes as they read before the per-kernel cost of tracing is filled in
    (analysis.tracing.DURATION_INFLATION_NS): what the screens show does not change when the
    measured value lands (tests/ui/test_tracing_figures.py shows a corrected table too)."""
    from tuiprof.analysis import tracing

    monkeypatch.setattr(tracing, "DURATION_INFLATION_NS", {"stream": None, "graph": None})


@pytest.fixture(scope="session")
def recordings():
    return {"eager": load_recording(need(EAGER)), "compiled": load_recording(need(COMPILED))}


def combined_store(recs) -> SessionStore:
    """Eager then compiled replayed into one store, a mode-switch event between them:
    what a live session looks like after pressing ``c`` once."""
    st = SessionStore()
    replay_into(recs["eager"], st)
    st.add_event("mode", "eager → compiled", ts_ns=1)
    replay_into(recs["compiled"], st)
    return st


@pytest.fixture
def store(recordings):
    return combined_store(recordings)


class FakeControl(SessionControl):
    """Records every call; behaves like a live session that finished a run."""

    def __init__(self, store, mode: str = "compiled", state: str = "done") -> None:
        super().__init__(store)
        self.calls: list[str] = []
        self.status.live = True
        self.status.mode = mode
        self.status.state = state
        self.status.message = ""

    def start(self) -> None:
        self.calls.append("start")

    def stop(self, timeout: float = 10.0) -> None:
        self.calls.append("stop")
        self.status.state = "stopped"

    def toggle_mode(self) -> str:
        self.calls.append("toggle_mode")
        self.status.state = "compiling"
        self.status.compiling_since = time.monotonic()
        return "compiling the decode step…"

    def toggle_pause(self) -> str:
        self.calls.append("toggle_pause")
        self.status.state = "decode" if self.status.state == "paused" else "paused"
        return "paused" if self.status.state == "paused" else "resumed"

    def reset(self) -> str:
        self.calls.append("reset")
        return super().reset()


@pytest.fixture
def control(store):
    return FakeControl(store)


def screen_text(app) -> str:
    """The current screen as plain text (for assertions)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


def run_main(st, size: tuple[int, int], keys: tuple = ()) -> dict:
    """The app over ``st`` (a finished eager session) at ``size``, after ``keys``: the screen's
    text, the visible panes' ids and the screen shown."""
    import asyncio

    from tuiprof.ui.app import make_app

    app = make_app(FakeControl(st, mode="eager"), title="t", refresh_hz=0, deterministic=True)
    out: dict = {}

    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            for k in keys:
                await pilot.press(k)
                await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            out["text"] = screen_text(app)
            out["panes"] = [p.id for p in app.main.visible_panes()]
            out["screen"] = app.screen
    asyncio.run(main())
    return out
