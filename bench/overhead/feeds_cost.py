"""What do the live feeds cost the process that holds the session? (1) One Prometheus scrape
(``--metrics``: the collector reads every view and renders the text) at a realistic store size;
(2) ``--otlp``'s spans per request: building them (the poll thread) and exporting them to a
local OTLP/HTTP receiver (the batch processor's thread; the receiver, in this process too,
decodes them, so that figure is an upper bound).

    python bench/overhead/feeds_cost.py [--processes 1] [--requests 1000] [--json OUT]

Neither runs on the session's hot path: the scrape and the poll read views (a mirror in the
holder's process, or a copy of the store), as the live app's 4 Hz refresh does.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "export"))

from fleet_data import free_port, kernel, serve  # noqa: E402

from tuiprof.export import metrics, otlp  # noqa: E402
from tuiprof.export.feeds import Source  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402


def realistic_store(requests: int, kernels: int = 300) -> SessionStore:
    """A server's session: ``requests`` requests (4 steps each, 2,048 step rows kept, 1,024
    finished requests kept whole), ``kernels`` distinct kernel names in the aggregates."""
    store = SessionStore(series_len=2048, requests_keep=1024)
    t = serve(store, requests)
    seq = store.begin_token("decode", "eager", t, store.next_seq())
    store.add_records([kernel(f"kernel_{i}_gemm" if i % 3 == 0 else f"elementwise_{i}",
                              t + i * 1000, 500) for i in range(kernels)])
    store.end_token(seq, t + kernels * 1000 + 10_000, 1.0)
    for i in range(256):   # NVML samples
        store.ingest("nvml", {"ts_ns": t + i, "util_gpu": 50, "mem_used_bytes": 1 << 30})
    return store


def scrape_cost(processes: int, requests: int, rounds: int = 30, where: str = "mirror") -> dict:
    """``where``: "mirror", each process's mirror as the live app, a keeper or a headless
    program run holds it (the session in other processes); "store", a store in this process
    (``--in-process``, a headless engine run), whose view copies every kept request."""
    from tuiprof.sessions.mirror import Mirror  # noqa: PLC0415

    stores = [realistic_store(requests) for _ in range(processes)]
    if where == "mirror":
        mirrors = []
        for s in stores:
            m = Mirror()
            m.apply(s.changes(None)[0])
            mirrors.append(m)
        src = Source(lambda raw: [m.view(raw=False) for m in mirrors], host="bench")
    else:
        src = Source(lambda raw: [s.view(raw=False) for s in stores], host="bench")
    metrics.render(src)   # warm: imports, memoised kernel names
    times, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        text = metrics.render(src)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return {"where": where, "processes": processes, "requests_per_process": requests,
            "scrape_ms_median": round(statistics.median(times) * 1e3, 2),
            "scrape_ms_max": round(max(times) * 1e3, 2),
            "scrape_cpu_ms_median": round(statistics.median(cpu) * 1e3, 2),
            "series": series, "bytes": len(text)}


def span_cost(requests: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from export.otlp_receiver import Receiver  # noqa: PLC0415

    store = SessionStore(series_len=2048, requests_keep=max(1024, requests))
    serve(store, requests)
    rx = Receiver(free_port())
    try:
        feed = otlp.OtlpFeed(otlp.check(rx.url), Source.of(store), poll_s=3600,
                             max_queue=max(otlp.MAX_QUEUE, requests * 5))
        c0, t0 = time.process_time(), time.perf_counter()
        feed.poll()
        poll_cpu, poll_wall = time.process_time() - c0, time.perf_counter() - t0
        c1, t1 = time.process_time(), time.perf_counter()
        feed.close()
        flush_cpu, flush_wall = time.process_time() - c1, time.perf_counter() - t1
        s = feed.stats()
    finally:
        rx.close()
    return {"requests": requests, "spans": s["spans"], "exported": s["exported"],
            "dropped": s["dropped"],
            "build_us_per_request": round(poll_cpu / requests * 1e6, 1),
            "build_wall_us_per_request": round(poll_wall / requests * 1e6, 1),
            "export_cpu_us_per_request_upper": round(flush_cpu / requests * 1e6, 1),
            "export_wall_us_per_request": round(flush_wall / requests * 1e6, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"scrape": [scrape_cost(p, a.requests, where=w) for w in ("mirror", "store")
                      for p in sorted({1, a.processes})],
           "otlp": span_cost(a.requests)}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
