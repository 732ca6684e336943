"""The session process on its host: CPU use, resident memory and threads, once a second.

An eager decode is host-bound (the Python thread that launches the kernels is the bottleneck),
so the CPU the session process uses is the other half of the GPU's utilisation: a process at
100 % of one core beside a GPU busy 10 % of the time is launch-bound. Read from
``/proc/self/stat`` and ``/proc/self/statm`` (Linux; elsewhere the collector is off, with the
reason): two small reads a second, no dependency.

Samples go to the store as the series ``"host"``: ``ts_ns``, ``cpu_pct`` (of one core, over
the last period: 250 means two and a half cores), ``rss_bytes``, ``threads``.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

from ..store import SessionStore
from .base import CollectorUnavailable

KIND = "host"
_STAT = "/proc/self/stat"
_STATM = "/proc/self/statm"


class HostSampler:
    """Samples this process's CPU time, RSS and thread count at ``rate_hz``."""

    name = KIND

    def __init__(self, store: SessionStore, rate_hz: float = 1.0,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.store = store
        self.period = 1.0 / max(0.01, rate_hz)
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._last: tuple[float, int] | None = None   # (monotonic s, utime + stime ticks)
        self._cost = 0.0

    @property
    def cost_s(self) -> float:
        return self._cost

    def start(self) -> None:
        try:
            self._read()
        except (OSError, ValueError, IndexError) as exc:
            raise CollectorUnavailable(f"no host CPU figures: {_STAT} unreadable "
                                       f"({type(exc).__name__})") from None
        self.store.set_collector(KIND, True, "host: the session process's CPU and memory")
        self._thread = threading.Thread(target=self._run, name="tuiprof-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def _read(self) -> tuple[int, int, int]:
        """(utime + stime in clock ticks, threads, RSS in pages)."""
        with open(_STAT, "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # the name may hold spaces
        with open(_STATM, "rb") as fh:
            rss = int(fh.read().split()[1])
        # fields[0] is the state (stat field 3): utime is field 14, stime 15, threads 20
        return int(fields[11]) + int(fields[12]), int(fields[17]), rss

    def sample(self) -> dict | None:
        """One sample, or None for the first call (a CPU share needs two readings)."""
        ticks, threads, rss = self._read()
        now = time.monotonic()
        last, self._last = self._last, (now, ticks)
        if last is None or now <= last[0]:
            return None
        cpu = 100.0 * (ticks - last[1]) / self._tick / (now - last[0])
        return {"ts_ns": self.clock(), "cpu_pct": round(cpu, 1),
                "rss_bytes": rss * self._page, "threads": threads}

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            t0 = time.thread_time()
            try:
                smp = self.sample()
            except (OSError, ValueError, IndexError):  # /proc vanished: stop quietly
                return
            if smp is not None:
                self.store.ingest(KIND, smp)
            self._cost += time.thread_time() - t0
            deadline += self.period
            delay = deadline - time.monotonic()
            if delay < 0:
                deadline, delay = time.monotonic(), 0.0
            self._stop.wait(delay)


def make(ctx) -> HostSampler | str:
    """The session's host sampler (:mod:`tuiprof.collect.registry`), or why it is off."""
    if not os.path.exists(_STAT):
        return "no host CPU figures: /proc is Linux's"
    return HostSampler(ctx.store, clock=ctx.clock)
