"""The live app on a program: it runs on the session process's main thread, its output is
in the log view, Ctrl-C reaches it as KeyboardInterrupt, its exit status is on the status
line, and the engine-only key ``c`` is shown disabled and says why."""
from __future__ import annotations

import asyncio
import json

from textual.widgets import Log

from tuiprof.program.launch import parse_program
from tuiprof.spec import ProfilerOptions
from tuiprof.sessions import RemoteControl
from tuiprof.ui.app import make_app
from tuiprof.ui.screens.log import LogScreen
from tuiprof.ui.widgets.statusline import StatusLine

from sessions._helpers import quit_app
from sessions._helpers import until as _until

from .conftest import PROGRAMS


def test_program_in_the_live_app(tmp_path):
    spec = parse_program(["python", str(PROGRAMS / "serve_forever.py")])
    log = tmp_path / "serve.log"
    ctl = RemoteControl(ProfilerOptions(cupti=False, nvml=False), {"ring_tokens": 8},
                        program={"spec": spec, "log_path": str(log),
                                 "options": {"window_ms": 50.0}})
    ctl.start()
    app = make_app(ctl, export_dir=tmp_path, auto_snapshot=True, refresh_hz=4.0)

    def status_text() -> str:
        return str(app.main.query_one(StatusLine).render())

    async def main():
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(lambda: app.view is not None and "serving" in app.view.output, app)
            # the status line follows the session's status, which may reach the app a refresh
            # after the program's first output (seen under load: still "loading" then)
            await _until(lambda: "▶ serve_forever.py" in status_text()
                         and "serve.log" in status_text(), app, 10)
            # c: tuiprof's own engine only; shown disabled, and says why when pressed
            assert app.check_action("toggle_mode", ()) is None
            await pilot.press("c")
            assert "the program's code decides" in app.last_message
            # l: the program's output
            await pilot.press("l")
            await _until(lambda: isinstance(app.screen, LogScreen)
                         and app.screen.query_one(Log).line_count >= 1, app, 10)
            assert "serving" in app.screen.query_one(Log).lines
            await pilot.press("escape")
            # space: this program marks no steps (windows), so it cannot be held at one; the
            # status line says why instead of claiming a pause
            await pilot.press("space")
            await _until(lambda: "pause needs step boundaries" in status_text(), app, 10)
            assert ctl.status.state != "paused"
            # Ctrl-C goes to the program first: it shuts down, and says so
            await pilot.press("ctrl+c")
            await _until(lambda: (ctl.status.extra.get("program") or {}).get("running") is False,
                         app, 20)
            assert ctl.status.extra["program"]["exit_status"] == 130
            await _until(lambda: "exit 130" in status_text(), app, 5)  # at the next refresh
            await _until(lambda: "shutting down" in app.view.output, app, 10)
            await quit_app(pilot, app)

    asyncio.run(main())
    ctl.stop()
    ctl.close()
    assert not ctl.busy
    snap = json.loads(next(tmp_path.glob("tuiprof-*.json")).read_text())
    prog = snap["meta"]["program"]
    assert prog["exit_status"] == 130 and prog["ended"] == "interrupted"
    assert snap["meta"]["step_source"] == "windows"
    assert snap["output"][:2] == ["serving", "shutting down"], snap["output"]
    assert "KeyboardInterrupt" in log.read_text()      # the traceback python prints, kept
