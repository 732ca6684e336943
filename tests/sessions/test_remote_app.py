"""The live app over a session in its own process (what ``tuiprof --model X`` runs).

A real tiny Qwen3 generates on the CPU in a spawned session process; the Textual app runs in
this process under ``run_test`` and reaches the session only through RemoteControl.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal

from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions import RemoteControl
from tuiprof.ui.app import make_app

from ._helpers import quit_app
from ._helpers import until as _until


def _control(tmp_path, **kw) -> RemoteControl:
    opts = ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", max_new_tokens=24, loop=True, prompt_len=8))
    return RemoteControl(opts, {"ring_tokens": 8}, **kw)




def test_keys_reach_the_session_process_and_quit_ends_it(tmp_path):
    ctl = _control(tmp_path)
    ctl.start()
    app = make_app(ctl, export_dir=tmp_path, auto_snapshot=True, refresh_hz=4.0)
    child_pid = ctl.pid
    assert child_pid and child_pid != os.getpid()

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await _until(lambda: app.view is not None and app.view.counters["tokens"] > 10, app)
            assert app.view.meta["model"] == "qwen3-tiny"
            await pilot.press("space")
            await _until(lambda: ctl.status.state == "paused", app)
            # The UI's view is the mirror as of the last pull; ask for a fresh one.
            n = ctl.view(raw=False, wait=True).counters["tokens"]
            await asyncio.sleep(1.0)
            assert ctl.view(raw=False, wait=True).counters["tokens"] == n   # nothing generated
            await pilot.press("space")
            await _until(lambda: app.view.counters["tokens"] > n + 5, app)
            await pilot.press("r")
            await _until(lambda: any(e[2] == "reset" for e in app.view.events), app)
            await pilot.press("e")
            await _until(lambda: list(tmp_path.glob("tuiprof-*.json")), app, 30)
            await quit_app(pilot, app)

    asyncio.run(main())
    ctl.stop()
    ctl.close()
    assert not ctl.busy and ctl._proc.exitcode == 0
    # by time written: two in one second are named -<stamp>.json and -<stamp>-2.json, which
    # sort the other way round by name
    snaps = sorted(tmp_path.glob("tuiprof-*.json"), key=lambda p: p.stat().st_mtime_ns)
    assert len(snaps) == 2                      # the `e` export and the automatic one on `q`
    last = json.loads(snaps[-1].read_text())
    assert last["meta"]["model"] == "qwen3-tiny" and len(last["tokens"]) > 5
    assert app.refresh_stats["count"] >= 5


def test_a_dead_session_process_is_reported_and_its_data_kept(tmp_path):
    ctl = _control(tmp_path)
    ctl.start()
    app = make_app(ctl, export_dir=tmp_path, refresh_hz=4.0)

    async def main():
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(lambda: app.view is not None and app.view.counters["tokens"] > 5, app)
            os.kill(ctl.pid, signal.SIGKILL)
            await _until(lambda: ctl.status.state == "error", app, 20)
            kept = app.view.counters["tokens"]
            assert kept > 5 and len(app.view.tokens) > 5
            msg = ctl.status.message
            assert "session process ended (killed by signal 9)" in msg and "\n" not in msg
            await pilot.press("e")
            await _until(lambda: list(tmp_path.glob("tuiprof-*.json")), app, 20)
            await quit_app(pilot, app)
            return kept

    kept = asyncio.run(main())
    ctl.close()
    snap = json.loads(next(tmp_path.glob("tuiprof-*.json")).read_text())
    assert len(snap["tokens"]) >= min(kept, 5)
