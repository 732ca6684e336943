"""Soak test: a long live session stays flat.

Continuous generation (the engine loops from the prompt when its cache is full) of a model,
compiled mode by default, with the Textual app open (``make_app(...).run_test()``, headless) and
every collector on; the model runs in its session process as ``tuiprof --model`` runs it
(``--in-process``: in this process). Every ``--interval`` seconds one row, written to the CSV
and printed at once (a run cut short keeps its rows): resident memory of the session process and
of the UI process (/proc/PID/statm), GPU memory (the caching allocator's reserved bytes from
the session's allocator statistics, and NVML's used), tokens/s over the interval, CUPTI records
dropped so far, and the latency of key presses (``simulate_key`` → the action handler running on
the event loop, as in tests/ui/test_responsive.py). At the end: a Markdown table (first row
after warm-up vs the last, growth, tokens/s min/median/max, key latency p50/p99).

On the GPU machine (docs/reliability.md, "On the H100")::

    python bench/verify/soak.py --minutes 30 --csv soak.csv            # qwen3-0.6b, compiled
    python bench/verify/soak.py --tokens 100000 --mode eager --csv soak-eager.csv

CPU smoke run (also tests/reliability/test_soak_smoke.py)::

    python bench/verify/soak.py --model qwen3-tiny --tokens 300
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common import KeyTimer, rss_mb  # noqa: E402

MB = 1024 * 1024
FIELDS = ["t_s", "state", "mode", "tokens", "tokens_per_s", "rss_mb", "ui_rss_mb",
          "cuda_reserved_mb", "nvml_used_mb", "dropped", "keys", "key_p50_ms", "key_max_ms",
          "refresh_mean_ms"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--mode", choices=("eager", "compiled"), default="compiled")
    p.add_argument("--minutes", type=float, default=None, help="run this long (default 30)")
    p.add_argument("--tokens", type=int, default=None, help="or until this many tokens")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between rows")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of decode in the final mode before the 'start' row "
                        "(default: one interval)")
    p.add_argument("--cycle-tokens", type=int, default=1024,
                   help="tokens per generation cycle before starting again from the prompt")
    p.add_argument("--device", default=None)
    p.add_argument("--keys", type=int, default=5, help="key presses timed per interval")
    p.add_argument("--csv", default="soak.csv", help="where the rows go")
    p.add_argument("--json", default=None, help="also write the session's snapshot here")
    p.add_argument("--in-process", action="store_true",
                   help="run the model in this process (default: a session process, as the CLI)")
    p.add_argument("--max-rss-growth-mb", type=float, default=None,
                   help="exit 1 when resident memory grows more than this after warm-up")
    a = p.parse_args(argv)
    if a.minutes is None and a.tokens is None:
        a.minutes = 30.0
    return a


def cuda_reserved_mb(view) -> float | None:
    """The caching allocator's reserved bytes, from the newest token that read them."""
    for t in reversed(view.tokens):
        if t.alloc and "reserved_bytes" in t.alloc:
            return t.alloc["reserved_bytes"] / MB
    return None


def nvml_used_mb(view) -> float | None:
    for s in reversed(view.nvml):
        v = s.get("mem_used_bytes")
        if isinstance(v, (int, float)):
            return v / MB
    return None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def fmt(v, nd=1) -> str:
    return "–" if v is None or v != v else f"{v:,.{nd}f}"


def run(a: argparse.Namespace) -> dict:
    from tuiprof.profiler import Profiler
    from tuiprof.spec import EngineSpec, ProfilerOptions
    from tuiprof.store import SessionStore
    from tuiprof.ui.app import make_app

    opts = ProfilerOptions(engine=EngineSpec.resolve(
        a.model, device=a.device, loop=True, max_new_tokens=a.cycle_tokens,
        mode=a.mode))
    if a.in_process:
        prof = Profiler(SessionStore(ring_tokens=32), opts)
        pid = "self"
    else:
        from tuiprof.sessions import RemoteControl
        prof = RemoteControl(opts, {"ring_tokens": 32})
    prof.start()
    if not a.in_process:
        pid = prof.pid
    store = prof.store
    out = open(a.csv, "w", newline="")
    writer = csv.DictWriter(out, fieldnames=FIELDS)
    writer.writeheader()
    print(",".join(FIELDS), flush=True)
    app = make_app(prof, title=f"soak {a.model}", export_dir=Path(a.csv).parent or ".",
                   refresh_hz=4.0)
    keys = KeyTimer(app)
    rows: list[dict] = []
    all_keys: list[float] = []
    marks: dict[str, float] = {}
    warmup = a.interval if a.warmup is None else a.warmup

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            t0 = time.monotonic()
            # warm-up: the model loads, compiles (compiled mode), then decodes a while
            while time.monotonic() - t0 < 1800:
                st = prof.status
                if st.state == "error":
                    raise SystemExit(f"soak: the session failed: {st.message}")
                if st.state == "decode" and st.mode == a.mode:
                    break
                await asyncio.sleep(0.2)
            marks["decode"] = time.monotonic()
            await asyncio.sleep(warmup)
            marks["start"] = time.monotonic()
            last_t, last_n = time.monotonic(), store.view(raw=False).counters["tokens"]
            first_n = last_n
            while True:
                lat = await keys.press(a.keys, max(0.05, a.interval / max(1, a.keys) - 0.05))
                rest = a.interval - (time.monotonic() - last_t)
                if rest > 0:
                    await asyncio.sleep(rest)
                now = time.monotonic()
                view = store.view(raw=False)
                n = view.counters["tokens"]
                all_keys.extend(lat)
                rss, ui_rss = rss_mb(pid), rss_mb()
                rows.append({
                    "t_s": round(now - marks["start"], 1), "state": prof.status.state,
                    "mode": prof.status.mode, "tokens": n,
                    "tokens_per_s": round((n - last_n) / (now - last_t), 2),
                    "rss_mb": round(rss, 1) if rss else None,
                    "ui_rss_mb": None if a.in_process else round(ui_rss, 1),
                    "cuda_reserved_mb": cuda_reserved_mb(view),
                    "nvml_used_mb": nvml_used_mb(view), "dropped": view.counters.get("dropped", 0),
                    "keys": len(lat), "key_p50_ms": round(pct(lat, 0.5), 2) if lat else None,
                    "key_max_ms": round(max(lat), 2) if lat else None,
                    "refresh_mean_ms": round(app.refresh_stats["mean_ms"], 2),
                })
                writer.writerow(rows[-1])
                out.flush()
                print(",".join(str(rows[-1][k]) for k in FIELDS), flush=True)
                last_t, last_n = now, n
                if prof.status.state == "error":
                    break
                if len(rows) < 2:       # a start row and an end row at least
                    continue
                if a.minutes is not None and now - marks["start"] >= a.minutes * 60:
                    break
                if a.tokens is not None and n - first_n >= a.tokens:
                    break
            marks["end"] = time.monotonic()
            await pilot.press("q")
            await app.workers.wait_for_complete()

    try:
        asyncio.run(main())
    finally:
        out.close()
        prof.stop()
    view = store.view()
    prof.close()
    if a.json:
        from tuiprof.export.snapshot import write_snapshot
        write_snapshot(view, a.json)
    return {"rows": rows, "keys": all_keys, "marks": marks, "prof": prof, "view": view}


def report(a: argparse.Namespace, res: dict) -> int:
    rows, keys = res["rows"], res["keys"]
    if not rows:
        print("soak: no rows recorded", file=sys.stderr)
        return 1
    s, e = rows[0], rows[-1]
    tps = [r["tokens_per_s"] for r in rows]
    view, prof = res["view"], res["prof"]
    meta = view.meta
    span = res["marks"]["end"] - res["marks"]["start"]

    def growth(key):
        return None if s[key] is None or e[key] is None else e[key] - s[key]

    print(f"\n### Soak: {meta.get('model')} on {meta.get('device_name') or meta.get('device')}, "
          f"{a.mode}, {span / 60:.1f} min after warm-up, {e['tokens'] - s['tokens']:,} tokens "
          f"between the first and the last row ({len(rows)} rows every {a.interval:g} s)\n")
    print("| measure | start (after warm-up) | end | growth |")
    print("|---|---:|---:|---:|")
    for label, key, nd in (("resident memory, MB" + ("" if a.in_process else
                                                    " (session process)"), "rss_mb", 1),
                           ("resident memory of the UI process, MB", "ui_rss_mb", 1),
                           ("caching allocator reserved, MB", "cuda_reserved_mb", 1),
                           ("NVML memory used, MB", "nvml_used_mb", 1),
                           ("CUPTI records dropped", "dropped", 0)):
        print(f"| {label} | {fmt(s[key], nd)} | {fmt(e[key], nd)} | {fmt(growth(key), nd)} |")
    print(f"| tokens/s over {a.interval:g} s (min / median / max) | {fmt(min(tps))} / "
          f"{fmt(statistics.median(tps))} / {fmt(max(tps))} | | |")
    print(f"| key → handler latency, ms (p50 / p99, {len(keys)} keys) | "
          f"{fmt(pct(keys, 0.5))} / {fmt(pct(keys, 0.99))} | max {fmt(max(keys) if keys else None)} | |")
    print(f"| UI refresh, mean ms | {fmt(s['refresh_mean_ms'], 2)} | {fmt(e['refresh_mean_ms'], 2)} | |")
    print(f"| final state | {prof.status.state} {prof.status.message[:80]} | | |")
    print(f"\nrows: {a.csv}")
    if prof.status.state == "error":
        return 1
    g = growth("rss_mb")
    if a.max_rss_growth_mb is not None and g is not None and g > a.max_rss_growth_mb:
        print(f"soak: resident memory grew {g:.1f} MB (> {a.max_rss_growth_mb} MB)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    return report(a, run(a))


if __name__ == "__main__":
    raise SystemExit(main())
