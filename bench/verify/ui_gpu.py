"""The live app on the GPU: >=60 s of qwen3-0.6b, eager then compiled (switch with `c`),
SVG screenshots of eager, compiled and the comparison view, key latency while eager decode
runs, and decode speed with the UI open. The session runs in its session process, as
``tuiprof --model`` runs it. Prints a short table; screenshots go to OUT."""
from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common import KeyTimer  # noqa: E402

from tuiprof.spec import EngineSpec, ProfilerOptions  # noqa: E402
from tuiprof.sessions import RemoteControl  # noqa: E402
from tuiprof.ui.app import make_app  # noqa: E402

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    prof = RemoteControl(ProfilerOptions(engine=EngineSpec.resolve(
        os.environ.get("TUIPROF_MODEL", "qwen3-0.6b"), loop=True, max_new_tokens=512,
        mode="eager")), {"ring_tokens": 32})
    prof.start()
    store = prof.store
    app = make_app(prof, title="tuiprof qwen3-0.6b", export_dir=OUT, refresh_hz=4.0)
    keys = KeyTimer(app)
    lat: list[float] = []
    marks: dict[str, float] = {}
    rows: dict[str, list] = {}

    async def run():
        async with app.run_test(size=(200, 50)) as pilot:
            t0 = time.monotonic()
            while store.view(raw=False).counters["tokens"] < 5 and time.monotonic() - t0 < 120:
                await asyncio.sleep(0.2)
            await asyncio.sleep(8)  # past the first burst of traced tokens
            marks["eager_start"] = time.monotonic()
            lat.extend(await keys.press(40, spacing=0.4, timeout=3))  # during eager decode
            app.save_screenshot("tuiprof_h100_eager.svg", str(OUT))
            marks["switch"] = time.monotonic()
            rows["eager"] = [t for t in store.view(raw=False).tokens if t.mode == "eager"]
            app.simulate_key("c")
            while prof.status.mode != "compiled" and time.monotonic() - marks["switch"] < 240:
                await asyncio.sleep(0.5)
            marks["compiled"] = time.monotonic()
            await asyncio.sleep(20)
            rows["compiled"] = [t for t in store.view(raw=False).tokens if t.mode == "compiled"]
            app.save_screenshot("tuiprof_h100_compiled.svg", str(OUT))
            app.simulate_key("v")
            await asyncio.sleep(1.5)
            app.save_screenshot("tuiprof_h100_compare.svg", str(OUT))
            marks["end"] = time.monotonic()
            await pilot.press("escape")
            await pilot.press("q")
            await app.workers.wait_for_complete()

    try:
        asyncio.run(run())
    finally:
        prof.stop()
    v = store.view(raw=False)
    prof.close()
    print("\n| measure | value |\n|---|---|")
    print(f"| live run | {marks['end'] - marks['eager_start']:.0f} s "
          f"(eager {marks['switch'] - marks['eager_start']:.0f} s, compile "
          f"{marks['compiled'] - marks['switch']:.0f} s, compiled {marks['end'] - marks['compiled']:.0f} s) |")
    for mode in ("eager", "compiled"):
        ts = [t for t in rows.get(mode, []) if t.phase == "decode" and t.done]
        if len(ts) > 4:
            ts = ts[2:]
            span = (ts[-1].end_ns - ts[0].start_ns) / 1e6
            print(f"| {mode} decode with the UI open | {len(ts)} tokens, {span / len(ts):.3f} ms/token "
                  f"(whole-run), median {statistics.median(t.host_ms for t in ts):.3f} ms |")
    lat.sort()
    if lat:
        print(f"| key → handler during eager decode | median {statistics.median(lat):.1f} ms, "
              f"p90 {lat[int(0.9 * (len(lat) - 1))]:.1f} ms, max {lat[-1]:.1f} ms ({len(lat)} keys) |")
    rs = app.refresh_stats
    print(f"| UI refresh cost | mean {rs.get('mean_ms', 0):.1f} ms, max {rs.get('max_ms', 0):.1f} ms, "
          f"{rs.get('count', 0)} refreshes |")
    print(f"| panes filled | kernels={len(v.kernels)} nvml={len(v.nvml)} tokens={v.counters['tokens']} "
          f"dropped={v.counters['dropped']} |")
    print(f"| overhead estimate | {v.overhead} |")


if __name__ == "__main__":
    main()
