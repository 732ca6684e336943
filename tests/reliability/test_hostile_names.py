"""Hostile names through every output: the app (every screen, and the raw bytes it writes to a
real terminal), ``tuiprof diff`` (text and markdown), ``export --nsys`` (CSVs and the text
report), the headless summary and the one-line messages. The catalogue is ``tests/hostile.py``:
Rich/Textual markup, terminal escapes (clear screen, window title, clipboard), bidi overrides,
spreadsheet formulas, line breaks, C1 controls, lone surrogates, very long names.

What must hold: nothing crashes; no hostile character reaches a terminal, stdout or a text
report as it is (it is shown visibly: ``\\x1b``); no markup in a name is applied; a CSV cell
is never read as a formula; the JSON snapshot, the trace and the SQLite export keep every name
exactly.
"""
from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiprof.export.snapshot import read_snapshot
from tuiprof.text import csv_cell, markup, output_line, printable

from .conftest import cli_env, hostile_catalogue, pty_cli, read_pty

_h = hostile_catalogue()
ESCAPES, HOSTILE, has_raw_control, is_number, write_hostile_snapshot = (
    _h.ESCAPES, _h.HOSTILE, _h.has_raw_control, _h.is_number, _h.write_hostile_snapshot)


@pytest.fixture(scope="module")
def hostile_snapshot(tmp_path_factory, eager_path) -> Path:
    return write_hostile_snapshot(eager_path, tmp_path_factory.mktemp("hostile") / "hostile.json")


# ------------------------------------------------------------------ the sanitiser itself
@pytest.mark.parametrize("name", HOSTILE)
def test_printable_shows_every_character_visibly(name):
    out = printable(name)
    assert not has_raw_control(out) and out.isprintable()
    assert printable(name, 30) == out[:29] + "…" if len(out) > 30 else printable(name, 30) == out
    assert printable("plain ünïcode µs → ×") == "plain ünïcode µs → ×"


@pytest.mark.parametrize("name", HOSTILE)
def test_markup_escaped_text_renders_as_itself(name):
    from rich.text import Text
    from textual.content import Content

    esc = markup(name)
    for plain in (Text.from_markup(esc).plain, Content.from_markup(esc).plain):
        if "\\" not in name:        # a run of backslashes before "[" may render doubled
            assert plain == printable(name)
    assert not Text.from_markup(esc).spans      # no style, link or action applied


@pytest.mark.parametrize("cell,want", [("=1+2", "'=1+2"), ("+1", "'+1"), ("-1", "'-1"),
                                       ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "\\x09=1"),
                                       ("nvjet_tst", "nvjet_tst"), ("a=b", "a=b")])
def test_csv_cells_are_never_formulas(cell, want):
    assert csv_cell(cell) == want


def test_program_output_loses_its_colours_and_shows_the_rest():
    assert output_line("\x1b[31mred\x1b[0m \u202eevil") == "red \\u202eevil"
    assert output_line("50%\r100%") == "100%"


# ------------------------------------------------------------------ the app
def _no_markup_applied(app) -> list:
    bad = []
    for strip in app.screen._compositor.render_strips():
        for seg in strip:
            st = seg.style
            if st is not None and (st.link or "@click" in (st.meta or {})):
                bad.append(seg.text)
    return bad


def _screen(app) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


@pytest.mark.parametrize("size", [(200, 50), (80, 24)])
def test_every_screen_of_the_app_over_hostile_names(hostile_snapshot, tmp_path, size):
    from tuiprof.ui.app import make_app
    from tuiprof.ui.static import StaticViewControl

    ctl = StaticViewControl.from_path(hostile_snapshot)
    app = make_app(ctl, title="view", export_dir=tmp_path, refresh_hz=0, deterministic=True)
    seen: dict[str, str] = {}

    async def look(pilot, where: str) -> None:
        await pilot.pause()
        app.refresh_now()
        await pilot.pause()
        text = _screen(app)
        seen[where] = text
        assert not has_raw_control(text), (where, has_raw_control(text))
        assert _no_markup_applied(app) == [], where

    async def main():
        async with app.run_test(size=size) as pilot:
            await look(pilot, "main")
            for key in ("1", "2", "3", "4", "5"):
                await pilot.press(key)
                await look(pilot, f"pane {key}")
            await pilot.press("2")
            for key in ("p", "m", "s", "s", "i"):
                await pilot.press(key)
                await look(pilot, f"kernels {key}")
            await pilot.press("enter")
            await look(pilot, "kernel detail")
            await pilot.press("escape")
            for key in ("v", "l", "question_mark"):
                await pilot.press(key)
                await look(pilot, key)
                await pilot.press("escape")
            await pilot.press("q")
            await app.workers.wait_for_complete()
            await pilot.pause()
    asyncio.run(main())
    assert any("[/bold]x[link=file:///etc/passwd]" in t for t in seen.values()), \
        "the markup name is shown as text"
    assert any("\\x1b]0;pwned" in t for t in seen.values())


def _pty_app(args: list[str], cwd: Path, size=(50, 200), seconds: float = 6.0) -> bytes:
    """Run ``python -m tuiprof ARGS`` on a real pseudo-terminal; every byte it wrote."""
    pid, fd = pty_cli(args, *size, cwd=cwd)
    out = bytearray()
    end = time.monotonic() + seconds
    sent = False
    while True:
        if time.monotonic() > end and not sent:
            os.write(fd, b"q")
            sent = True
            end = time.monotonic() + 20
        elif sent and time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            break
        chunk = read_pty(fd, 0.1)
        if chunk is None:
            break
        out += chunk
        if os.waitpid(pid, os.WNOHANG)[0]:
            break
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    os.close(fd)
    return bytes(out)


@pytest.mark.slow
@pytest.mark.parametrize("catalogue", ["all", "escapes only"])
def test_the_terminal_gets_no_hostile_sequence(hostile_snapshot, tmp_path, catalogue, eager_path):
    """The bytes the app writes to a real terminal: no title, clipboard or clear-screen sequence
    from a name, no bidi override (the kernels pane used to send the name raw, 8 times; with
    markup names too, the app crashed first)."""
    snap = hostile_snapshot if catalogue == "all" else write_hostile_snapshot(
        eager_path, tmp_path / "escapes.json", ESCAPES)
    raw = _pty_app(["view", str(snap)], tmp_path)
    assert b"Traceback" not in raw and b"Error" not in raw, raw[-3000:]
    assert b"top kernels" in raw, raw[-3000:]
    shown = (b"\\u202eevil", b"\\u2066isolate", b"nul\\x00bell", b"\\x1b[2J")
    assert any(s in raw for s in shown), raw[-3000:]    # a hostile name, escaped, on screen
    for seq in (b"\x1b]0;pwned", b"\x1b]52;c;", "\u202e".encode(), "\u2066".encode(),
                b"bell\x07", b"nul\x00"):
        assert seq not in raw, seq


# ------------------------------------------------------------------ stdout and text reports
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, timeout=120)


def _clean(data: bytes, what: str) -> None:
    text = data.decode("utf-8")   # a lone surrogate written as is would not even decode
    assert not has_raw_control(text.replace("\n", "")), (what, has_raw_control(text))
    assert "Traceback" not in text, text[-2000:]


@pytest.mark.parametrize("markdown", [False, True])
def test_diff_prints_hostile_names_visibly(hostile_snapshot, tmp_path, markdown):
    proc = _cli("diff", str(hostile_snapshot), str(hostile_snapshot),
                *(["--markdown"] if markdown else []), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _clean(proc.stdout, "stdout")
    _clean(proc.stderr, "stderr")
    out = proc.stdout.decode()
    assert "\\x1b[2J\\x1b]0;pwned" in out or "evil" in out
    if markdown:   # every table row is one line: a name cannot break out of its row
        rows = [ln for ln in out.splitlines() if ln.startswith("|")]
        assert rows and all(ln.endswith("|") for ln in rows)


def test_nsys_export_is_clean_and_json_sqlite_trace_keep_names_exact(hostile_snapshot, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = _cli("export", str(hostile_snapshot), "--nsys", str(out / "nsys"), "--sqlite",
                str(out / "s.sqlite"), "--trace", str(out / "t.json"), "--steps-csv",
                str(out / "steps.csv"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _clean(proc.stdout, "stdout")
    names = {k["name"] for k in json.loads(hostile_snapshot.read_text())["kernels"]}
    assert set(HOSTILE[:3]) <= names
    for p in [*sorted((out / "nsys").iterdir()), out / "steps.csv"]:
        data = p.read_bytes()
        _clean(data, p.name)
        if p.suffix == ".csv":
            rows = list(csv.reader(data.decode().splitlines()))
            # a name with quotes and commas ("tab\there,comma,\"quote\"") is one cell
            assert all(len(r) == len(rows[0]) for r in rows), (p.name, rows[0])
            for row in rows:
                for cell in row:
                    assert not cell.startswith(("=", "+", "@")), (p.name, cell)
                    assert not (cell.startswith("-") and not is_number(cell)), (p.name, cell)
    kern = (out / "nsys" / "tuiprof_cuda_gpu_kern_sum.csv").read_text()
    assert "'=HYPERLINK" in kern and "\\x1b]0;pwned" in kern
    # data formats keep the names exactly
    db = sqlite3.connect(out / "s.sqlite")
    try:
        stored = {r[0] for r in db.execute("SELECT value FROM StringIds")}
    finally:
        db.close()
    # the window's names as they are: raw escapes and markup, not their visible forms
    assert any("\x1b]0;pwned\x07" in v for v in stored), stored
    assert any(HOSTILE[0] in v for v in stored) and not any("\\x1b" in v for v in stored)
    trace = json.loads((out / "t.json").read_text())
    traced = {str(e.get("name")) for e in trace["traceEvents"]}
    assert any("\x1b]0;pwned\x07" in v for v in traced)
    assert not any("\\x1b" in v for v in traced)


def test_view_export_and_summary_lines_are_clean(hostile_snapshot, tmp_path):
    """The headless summary of a replay, and the messages naming hostile paths."""
    bad = tmp_path / "\x1b]0;pwned\x07dir"
    proc = _cli("export", str(hostile_snapshot), "--trace", str(bad / "t.json"), cwd=tmp_path)
    assert proc.returncode == 2
    _clean(proc.stderr, "stderr")
    assert "\\x1b]0;pwned" in proc.stderr.decode()
    from tuiprof.cli.common import print_summary

    view = read_snapshot(hostile_snapshot)
    import io
    from contextlib import redirect_stdout
    buf = io.StringIO()
    with redirect_stdout(buf):
        print_summary(view)
    assert not has_raw_control(buf.getvalue().replace("\n", ""))
