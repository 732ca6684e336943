"""The host collector on this machine's real /proc: a busy thread shows as CPU use, samples
reach the store through ingest as the series "host", and the profiler starts and stops it from
the collector table."""
from __future__ import annotations

import threading
import time

from tuiprof.collect.host import KIND, HostSampler
from tuiprof.store import SessionStore


def _spin(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def test_a_busy_thread_shows_as_cpu_use_in_the_store():
    store = SessionStore()
    host = HostSampler(store, rate_hz=20.0)
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
    host.start()
    spinner.start()
    try:
        deadline = time.monotonic() + 10
        while len(store.view(raw=False).series.get(KIND, [])) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        spinner.join()
        host.stop()
    samples = store.view(raw=False).series[KIND]
    assert len(samples) >= 6
    assert all(s["rss_bytes"] > 10 * 2**20 and s["threads"] >= 2 for s in samples)
    assert max(s["cpu_pct"] for s in samples) > 40          # the spinning thread
    assert [s["ts_ns"] for s in samples] == sorted(s["ts_ns"] for s in samples)
    assert store.view(raw=False).collectors[KIND]["ok"] is True
    assert host.cost_s < 1.0


def test_the_profiler_runs_it_from_the_collector_table():
    from tuiprof.profiler import Profiler
    from tuiprof.spec import ProfilerOptions

    store = SessionStore()
    prof = Profiler(store, ProfilerOptions(cupti=False, nvml=False))
    prof.start_collectors()
    assert "host" in prof.collectors
    col = store.view(raw=False).collectors
    assert col["cupti"]["ok"] is False and col["nvml"]["ok"] is False and col["host"]["ok"]
    time.sleep(1.3)
    prof.stop()
    assert prof.collectors == {}
    assert "host_s" in store.overhead
