"""The requests pane: percentiles over the window, rates and the requests in flight, at 80x24
(key 7, alone) and in the 200x50 grid; enter opens a request's story (Pilot, real Textual, a
real store fed by the same calls a request source makes)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app
from tuiprof.ui.screens.request import RequestDetailScreen

from .conftest import run_main, screen_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from requests_data import serving_store  # noqa: E402


def _run(st: SessionStore, size: tuple[int, int], keys: tuple = ()) -> dict:
    return run_main(st, size, keys)


def test_key_7_at_80x24_shows_percentiles_rates_and_requests_in_flight():
    out = _run(serving_store(), (80, 24), keys=("7",))
    assert out["panes"] == ["requests"]
    text = out["text"]
    assert "2 in flight" in text
    ttft = next(ln for ln in text.splitlines() if "TTFT" in ln and "p50" not in ln)
    assert "30.0 ms" in ttft, ttft                       # a and b: 30 and 29 ms
    itl = next(ln for ln in text.splitlines() if "ITL" in ln and "p50" not in ln)
    assert "11.0 ms" in itl and "50.0 ms" in itl, itl     # the prefill spike is p90
    assert "queue" in text and "e2e" in text and "111.0 ms" in text
    rows = [ln for ln in text.splitlines() if ln.strip().startswith(("│c ", "│d "))
            or " decode " in ln or " queued " in ln]
    assert any("queued" in ln for ln in rows) and any("decode" in ln for ln in rows), rows
    assert "7 requests" in text


def test_enter_opens_the_story_of_the_request_under_the_cursor():
    out = _run(serving_store(), (100, 30), keys=("7", "enter"))
    assert isinstance(out["screen"], RequestDetailScreen), out["text"]
    text = out["text"]
    # the oldest in flight first: c (arrived at 31 ms) before d (112 ms)
    assert "request — c" in text
    assert "over 1 step(s)" in text and "decode" in text and "4 steps" in text
    assert "outside steps" in text and "11.0 ms" in text


def test_the_grid_at_200x50_makes_room_for_the_pane_only_when_requests_arrived():
    """A session without requests keeps the grid's rows for the kernels; a server's session
    gets the pane; key 7 shows it in any session and says where requests come from."""
    empty = _run(SessionStore(), (200, 50))
    assert "requests" not in empty["panes"] and "7 requests" not in empty["text"]
    served = _run(serving_store(), (200, 50))
    assert "requests" in served["panes"] and "7 requests" in served["text"]
    narrow = _run(SessionStore(), (80, 24), keys=("7",))
    assert narrow["panes"] == ["requests"]
    assert "no requests in this session" in narrow["text"]


def test_tuiprof_view_reopens_the_requests_from_a_snapshot(tmp_path):
    from tuiprof.export.snapshot import read_snapshot, write_snapshot
    from tuiprof.ui.app import view_control

    path = write_snapshot(serving_store().view(), tmp_path / "s.json")
    app = make_app(view_control(read_snapshot(path)), title="t", refresh_hz=0,
                   deterministic=True)
    out: dict = {}

    async def main():
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await pilot.press("7")
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            out["text"] = screen_text(app)
    asyncio.run(main())
    assert "2 in flight" in out["text"] and "queued" in out["text"], out["text"]


def test_a_warm_up_request_is_not_among_the_panes_requests():
    """A warm-up request in flight is neither listed nor counted; the caption says it is
    apart (it was one of the load's requests everywhere)."""
    st = serving_store()
    st.requests.warmup("warm")
    st.requests.arrived("warm", 8, "transformers")
    out = _run(st, (120, 30), keys=("7",))
    text = out["text"]
    assert "2 in flight" in text and "1 warm-up apart" in text, text
    assert "warm " not in text.replace("warm-up", "")
