"""Decode speed with the live UI open: interleaved windows, session process vs UI process.

``tuiprof --model X`` runs the model, the collectors and the store in a session process and
the Textual app in its own (``tuiprof.sessions``). This benchmark runs exactly that pair: the
app, headless under ``run_test`` at 200×50 (every pane visible and redrawn at 4 Hz, findings
every 2 s), over a RemoteControl, open and pulling for the whole run. In the session process
the windows of ``bench/overhead/overhead.py`` (:class:`bench.overhead.overhead.Windows`, loaded as the session's
hook) alternate ``bare`` (no collection: CUPTI's kinds off, NVML paused, the per-token listener
bypassed) and ``auto`` (tuiprof's defaults) in blocks that hold one sampling period of ``auto``
tokens, exactly as there; the plan runs on the engine thread while the session server goes on
answering the app's pulls. So ``auto``'s ratio to ``bare`` is the decode slowdown a user sees
with the app open, against the same engine without tuiprof's collection (in ``bare`` windows the
app still pulls, but finds nothing new). On the H100::

    python bench/overhead/ui_overhead.py --blocks 8 --json $OUT/ui_overhead.json
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.overhead.overhead import (add_window_options, block_plan, finish,  # noqa: E402
                                     period, sayer, still_waiting, table)


def run(a: argparse.Namespace) -> dict:
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.sessions import RemoteControl
    from tuiprof.ui.app import make_app

    opts = ProfilerOptions(engine=EngineSpec.resolve(a.model, device=a.device, loop=True,
                                              max_new_tokens=a.cycle_tokens, mode="eager",
                                              prompt_len=16))
    ctl = RemoteControl(opts, {"ring_tokens": 32}, hook="bench.overhead.overhead:Windows")
    ctl.start()
    app = make_app(ctl, title="ui-overhead", export_dir=a.tmp, refresh_hz=4.0)
    out: dict = {"windows": []}
    t_run = time.monotonic()

    say = sayer(t_run)

    async def wait_for(pred, seconds, what):
        t_end = time.monotonic() + seconds
        while not pred():
            still_waiting(ctl.status, t_end, what, "ui_overhead")
            await asyncio.sleep(0.2)

    async def plan(windows: list) -> list[dict]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: ctl.call("hook", "start", windows, timeout=60))
        while True:  # the app keeps pulling meanwhile: the session answers between polls
            await asyncio.sleep(0.5)
            st = await loop.run_in_executor(None, lambda: ctl.call("hook", "poll", timeout=60))
            if st["error"]:
                raise SystemExit(f"ui_overhead: {st['error']}")
            if st["done"]:
                return st["results"]

    async def main():
        async with app.run_test(size=(200, 50)):
            await wait_for(lambda: ctl.status.state == "decode", 600, "decode")
            say("decoding (eager), app open")
            for mode in a.modes.split(","):
                if mode != ctl.status.mode:
                    await plan([("auto", 0)])
                    app.action_toggle_mode()
                    await wait_for(lambda: ctl.status.mode == mode
                                   and ctl.status.state == "decode", 600, f"{mode} decode")
                    say(f"decoding ({mode})")
                n = a.eager_tokens if mode == "eager" else a.compiled_tokens
                rounds = max(2, period(mode) // n)
                rounds += rounds % 2
                here = (["auto"] if a.no_bare else ["bare", "auto"]) \
                    + (["none"] if a.none and mode == "eager" else [])
                await plan([(here[0], a.warmup)])
                pulls0 = ctl.pulls
                t0 = time.monotonic()
                for b in range(a.blocks):
                    if a.deadline and time.monotonic() - t_run > a.deadline:
                        say(f"deadline: {b} blocks")
                        break
                    res = await plan(block_plan(here, rounds, n))
                    for i, w in enumerate(res):
                        w.update(block=b, round=i // 2, phase="app open")
                    out["windows"].extend(res)
                    tb = table([w for w in res])
                    row = next(r for r in tb if r["config"] == "auto")
                    say(f"[{mode}] block {b + 1:>2}: auto/{row['base']} {row['pooled_ratio']:.3f}; "
                        f"app pulls so far "
                        f"{ctl.pulls - pulls0} ({(ctl.pulls - pulls0) / (time.monotonic() - t0):.1f}"
                        f"/s), refresh mean {app.refresh_stats['mean_ms']:.1f} ms")
            await plan([("auto", 0)])
            v = ctl.store.view(raw=False)
            out["session"] = {"counters": v.counters,
                              "api": {k: st.count for k, st in v.api.items()},
                              "collectors": v.collectors}
            out["refresh"] = dict(app.refresh_stats)
            out["pulls"] = ctl.pulls
            out["meta"] = {k: ctl.store.meta.get(k) for k in
                           ("model", "device_name", "dtype", "torch", "driver")}
            app.exit()

    try:
        asyncio.run(main())
    finally:
        ctl.stop()
        ctl.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_window_options(p)
    p.add_argument("--deadline", type=float, default=0,
                   help="start no block after this many seconds (the table covers the rest)")
    p.add_argument("--json", default=None)
    p.add_argument("--tmp", default="/tmp")
    p.add_argument("--no-bare", action="store_true",
                   help="leave bare out (bench/overhead/overhead.py --no-bare)")
    p.add_argument("--none", action="store_true",
                   help="also none in eager windows (CUPTI finalized: no tuiprof at all); "
                        "ratios are then to none (bench/overhead/overhead.py)")
    a = p.parse_args(argv)
    out = run(a)
    meta = out.get("meta", {})
    print(f"\n{meta.get('model')} on {meta.get('device_name')}, {meta.get('dtype')}, torch "
          f"{meta.get('torch')}; app refreshed {out['refresh']['count']} times, mean "
          f"{out['refresh']['mean_ms']:.1f} ms (UI process); {out['pulls']} pulls")
    finish(out, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
