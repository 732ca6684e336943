"""What the remote-session tests share: waiting on a live app, reading its screen."""
from __future__ import annotations

import asyncio
import time


async def until(pred, app, seconds: float = 60.0) -> None:
    """Refresh ``app`` until ``pred()`` holds; fail after ``seconds``."""
    t_end = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < t_end, "timed out"
        app.refresh_view()
        await asyncio.sleep(0.1)


def screen_text(app) -> str:
    """The current screen as plain text."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


def runtime_dir(monkeypatch) -> str:
    """A private runtime directory for the sessions of one test (short: socket paths)."""
    import os
    import tempfile

    d = tempfile.mkdtemp(prefix="tprt-", dir="/tmp")
    os.chmod(d, 0o700)
    monkeypatch.setenv("TUIPROF_RUNTIME_DIR", d)
    return d


def held_program(tmp_path, program: list, options: tuple = (), seconds: float = 240.0,
                 on_running=None):
    """``tuiprof run [options] -- PROGRAM`` held by this process as the live app holds it
    (no screen): runs until the program's main process ends; returns (the held session, every
    process's view with raw records, the snapshot written)."""
    from tuiprof.cli import parse_args
    from tuiprof.cli.program import live_control
    from tuiprof.cli.sessions import hold

    args = parse_args(["run", "--no-nvml", "--export-dir", str(tmp_path), *options, "--",
                       *program])
    main, name, stem = live_control(args)
    held = hold(args, main, name=name, kind="program", stem=stem)
    held.start()
    try:
        t_end = time.monotonic() + seconds
        while not held.program_ended:
            assert time.monotonic() < t_end, [e.facts() for e in held.entries]
            if on_running is not None:
                on_running(held)
            time.sleep(0.2)
        held.stop()
        rv = held.export_view()
        snap = held.write_snapshot(tmp_path / "snap.json")
    finally:
        held.close()
    return held, rv, snap
