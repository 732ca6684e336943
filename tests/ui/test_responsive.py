"""The UI stays responsive while a real source produces in the background.

ReplayControl feeds the eager H100 recording at half its recorded speed (speed=0.5: ~7 s, a
token every ~100 ms; at full speed its 3.6 s could end, on a loaded CI core, before the test
pressed space to pause it) while keys are pressed; we time key → action (the handler running
on the event loop), and the app's own refresh cost.
"""
from __future__ import annotations

import asyncio
import functools
import time

from tuiprof.collect.replay import ReplayControl
from tuiprof.store import SessionStore
from tuiprof.ui.app import make_app


def test_keys_stay_fast_during_a_realtime_replay(recordings, tmp_path):
    store = SessionStore()
    ctl = ReplayControl(recordings["eager"], store, speed=0.5)
    ctl.start()                                   # as tuiprof.cli does before run_app
    app = make_app(ctl, title="replay", export_dir=tmp_path, refresh_hz=4.0)
    acted: list[float] = []
    def timed(orig):
        @functools.wraps(orig)   # Textual passes an action as many arguments as it takes
        def wrapped(*args):
            acted.append(time.perf_counter())
            return orig(*args)
        return wrapped

    for name in ("pane", "next_pane"):   # s, p, i: the kernels pane's keys (action_pane)
        setattr(app, f"action_{name}", timed(getattr(app, f"action_{name}")))
    latencies: list[float] = []
    tokens_seen: list[int] = []

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            # Start timing once data flows (the first refresh names every kernel once).
            t_wait = time.monotonic() + 10
            while (app.view is None or app.view.counters["tokens"] < 2) and time.monotonic() < t_wait:
                await asyncio.sleep(0.05)
            keys = ["s", "p", "i", "tab"]
            i = 0
            t_end = time.monotonic() + 2.0
            while time.monotonic() < t_end:
                # simulate_key posts the key event as the terminal driver does; pilot.press
                # would also wait for the whole *process* (the replay thread included) to idle.
                n = len(acted)
                t0 = time.perf_counter()
                app.simulate_key(keys[i % len(keys)])
                i += 1
                while len(acted) == n and time.perf_counter() - t0 < 3.0:
                    await asyncio.sleep(0.002)
                if len(acted) > n:
                    latencies.append(acted[n] - t0)
                tokens_seen.append(app.view.counters["tokens"])
                await asyncio.sleep(0.1)
            await pilot.press("space")             # pause the replay thread
            assert ctl.status.state == "paused"
            await pilot.press("space")
            await pilot.press("q")
            # q stops the replay on a worker and the app exits when it is done; waiting on the
            # worker itself races the exit (which cancels it): wait for the replay thread
            t_stop = time.monotonic() + 10
            while ctl._thread.is_alive() and time.monotonic() < t_stop:
                await asyncio.sleep(0.05)
            await pilot.pause()

    try:
        asyncio.run(main())
    finally:
        ctl.stop()
    assert len(latencies) >= 3, latencies
    latencies.sort()
    msg = f"key→action ms: {[round(x * 1000) for x in latencies]}"
    print(msg, app.refresh_stats)
    # Not a speed target (those live in bench/overhead/ui_overhead.py and bench/verify/soak.py): a p90 bound
    # and a refresh-time bound failed now and then with the whole suite on 2 shared cores.
    # What a test can say for sure: every key acted, none waited for the replay to end (a
    # blocked event loop waits seconds), and the panes followed the replay.
    assert len(latencies) == len(tokens_seen), msg
    assert latencies[-1] < 1.5, msg
    assert tokens_seen[-1] > tokens_seen[0], "the panes did not follow the replay"
    assert app.refresh_stats["count"] >= 5, app.refresh_stats
