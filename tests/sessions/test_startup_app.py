"""Start-up as the user sees it (docs/performance.md#start-up-from-the-command-to-the-first-token): the live app's first frame, before the session
process has answered, already names the model and the device and shows a progress line; the
session's phases then arrive through the mirror until the first token; and the UI process
never imports torch, even when it unpickles what the session sends."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions import RemoteControl
from tuiprof.startup import command_start
from tuiprof.ui.app import make_app
from tuiprof.ui.widgets.header import HeaderPane

from ._helpers import quit_app

ENGINE = dict(device="cpu", max_new_tokens=16, loop=True, prompt_len=4)


def _options() -> ProfilerOptions:
    return ProfilerOptions(cupti=False, nvml=False,
                           engine=EngineSpec.resolve("nanochat-tiny", **ENGINE),
                           started_at=command_start())


def _screen(app) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


def test_first_frame_shows_model_device_and_progress_until_the_first_token(tmp_path):
    ctl = RemoteControl(_options(), {"ring_tokens": 8})
    ctl.start()
    app = make_app(ctl, export_dir=tmp_path, refresh_hz=4.0)
    frames: dict[str, str] = {}

    async def main():
        async with app.run_test(size=(80, 24)) as pilot:
            frames["first"] = _screen(app)
            t_end = time.monotonic() + 90
            while "steps " not in str(app.main.query_one(HeaderPane).render()):  # decode steps
                assert time.monotonic() < t_end, _screen(app)
                await asyncio.sleep(0.1)
            frames["token"] = _screen(app)
            await quit_app(pilot, app)

    asyncio.run(main())
    ctl.close()
    head = frames["first"].splitlines()[:2]
    assert "nanochat-tiny · cpu · float32 · weights random (seed 0)" in head[0], head
    assert head[1].strip().startswith("loading · "), head     # "loading · 0.4 s · <phase>"
    assert " s · " in head[1] and "steps " not in head[1]
    assert "steps " in frames["token"].splitlines()[1]
    progress = ctl.status.progress      # mirrored from the session process
    names = [p.name for p in progress.phases]
    assert names[0] == "starting session process" and names[-1] == "prefill", names
    for later in ("importing torch", "building model", "initialising weights",
                  "allocating KV cache"):
        assert later in names
    assert progress.first_token_s is not None and progress.first_token_s > progress.phases[0].end_s
    startup = ctl.mirror.meta["startup"]        # what snapshots keep
    assert startup["first_token_s"] == round(progress.first_token_s, 3)


UI_PROCESS = """
import sys, time
from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.sessions import RemoteControl

if __name__ == "__main__":
    ctl = RemoteControl(ProfilerOptions(cupti=False, nvml=False,
                                        engine=EngineSpec.resolve("nanochat-tiny", **%r)), {})
    ctl.start()
    t_end = time.monotonic() + 90
    while ctl.view(raw=False, wait=True).counters["tokens"] < 3 and time.monotonic() < t_end:
        time.sleep(0.1)
    tokens = ctl.view(raw=True).counters["tokens"]
    ctl.stop(); ctl.close()
    print(tokens, sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_the_ui_process_never_imports_torch(tmp_path):
    """meta["torch"] was a TorchVersion: unpickling the first pull after the model loaded
    imported torch into the UI process (1.8 s here), delaying the first token on screen."""
    script = tmp_path / "ui_process.py"
    script.write_text(UI_PROCESS % (ENGINE,))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=150, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    tokens, imported = out.stdout.split(" ", 1)
    assert int(tokens) >= 3 and imported.strip() == "[]", out.stdout
