"""b / B in the app over a real live session (qwen3-tiny on the CPU, in-process Profiler): the
batch changes, both configurations keep their data, the kernels pane and the compare screen
can show either, and the header counts every sequence."""
from __future__ import annotations

import asyncio
import time

from tuiprof.engine.load import load_engine
from tuiprof.profiler import Profiler
from tuiprof.spec import EngineSpec, ProfilerOptions
from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app
from tuiprof.ui.screens.compare import CompareScreen
from tuiprof.ui.widgets.kernels_pane import KernelsPane

from .conftest import screen_text


def test_b_and_B_switch_the_batch_and_keep_every_configuration(tmp_path):
    store = SessionStore()
    opts = ProfilerOptions(cupti=False, nvml=False, engine=EngineSpec.resolve(
        "qwen3-tiny", device="cpu", prompt_len=8, max_new_tokens=32, loop=True,
        max_batch=4))
    prof = Profiler(store, opts)
    prof.start()
    app = make_app(prof, title="live", export_dir=tmp_path, refresh_hz=0)

    async def steps_at(batch: int, n: int) -> None:
        end = time.monotonic() + 60
        while sum(t.phase == "decode" and t.done for t in store.view(raw=False, batch=batch).tokens) < n:
            assert time.monotonic() < end, prof.status
            await asyncio.sleep(0.02)

    said: list[str] = []
    say = app._say
    app._say = lambda msg, severity="information": (said.append(msg), say(msg, severity))[1]

    async def press(*keys: str, until=None) -> None:
        """Post each key as the terminal driver does and wait until the app has answered it
        (pilot.press would wait for the whole process, the busy engine thread included)."""
        for key in keys:
            n = len(said)
            app.simulate_key(key)
            done = until or (lambda: len(said) > n)
            end = time.monotonic() + 30
            while not done():
                assert time.monotonic() < end, f"no answer to {key!r}"
                await asyncio.sleep(0.01)

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await steps_at(1, 5)
            await press("b")
            assert app.last_message == "switching to batch 2 at the next token"
            await steps_at(2, 5)
            app.refresh_now()
            await pilot.pause()
            text = screen_text(app)
            assert "batch 2" in text and "(2 seq ×" in text and "tok/s" in text
            await press("b", "b")            # 4, then the limit
            assert app.last_message.startswith("batch 4 is the largest allowed")
            await steps_at(4, 3)
            await press("B")
            assert app.last_message == "switching to batch 2 at the next token"
            view = store.view(raw=False)
            assert view.config_keys == [1, 2, 4]
            for key in (1, 2, 4):                   # every configuration kept its data
                ts = view.select(key).token_stats[("decode", "eager")]
                assert ts["host_ms"].count >= 3 and ts["seqs"].mean == key
            k = app.main.query_one(KernelsPane)
            await press("k")                  # auto -> batch 1
            assert k.config_choice == 1 and k.resolved_batch == 1
            await press("k", "k")
            assert k.resolved_batch == 4
            labels = ("b1 eager", "b2 eager", "b4 eager", "every configuration")
            await press("v", until=lambda: isinstance(app.screen, CompareScreen)
                        and all(label in screen_text(app) for label in labels))
            before = list(app.screen.pair)
            await press("right_square_bracket", until=lambda: app.screen.pair != before)
            assert app.screen.pair[1] != before[1] and app.screen.pair[0] == before[0]

    try:
        asyncio.run(main())
    finally:
        prof.stop()
