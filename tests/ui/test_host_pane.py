"""The host pane shows the session process's CPU and memory from the store's "host" series,
at 200x50 in the grid and at 80x24 on its key (Pilot, real Textual, real store)."""
from __future__ import annotations

from tuiprof.store import SessionStore
from tuiprof.ui.registry import by_key

from .conftest import run_main


def _store(with_samples: bool = True) -> SessionStore:
    st = SessionStore()
    if with_samples:
        for i, cpu in enumerate((12.0, 97.5, 101.0)):
            st.ingest("host", {"ts_ns": 1_000 + i, "cpu_pct": cpu, "rss_bytes": 3 * 2**30,
                               "threads": 14})
    else:
        st.set_collector("host", False, "no host CPU figures: /proc is Linux's")
    return st


def _run(st: SessionStore, size: tuple[int, int], key: str | None = None) -> dict:
    return run_main(st, size, (key,) if key else ())


def test_the_grid_at_200x50_shows_cpu_and_memory():
    out = _run(_store(), (200, 50))
    # every pane of the table that is not optional, in key order (a new pane joins the grid
    # without this test changing)
    assert out["panes"] == [p.id for p in by_key() if not p.optional] and "host" in out["panes"]
    text = out["text"]
    line = next(ln for ln in text.splitlines() if "CPU" in ln and "% of a core" in ln)
    assert "101 % of a core, max 101" in line, line
    assert "3.00 GiB resident" in text and "14 threads" in text
    assert "6 host: the session process" in text


def test_key_6_shows_it_alone_at_80x24_and_says_why_when_there_is_nothing():
    out = _run(_store(with_samples=False), (80, 24), key="6")
    assert out["panes"] == ["host"]
    assert "/proc is Linux's" in out["text"]
    assert "6 host" in out["text"] and "7 requests" in out["text"]  # all seven tabs fit 80 columns
