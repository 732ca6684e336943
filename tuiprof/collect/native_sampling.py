"""Sampling a native program's kernels: when its injection library traces them (bursts), and
which of its steps ran traced.

A native binary's CUPTI runs in the binary, which tuiprof cannot pause at a step boundary: the
session does not know the program's steps until their records arrive. So a native program is
sampled by time. :class:`BurstSchedule` says when a burst begins and ends (the session sends
the program a TRACE frame, and the library switches the kernel-level kinds on its own sender
thread); the library answers each switch with its CUPTI time, and :class:`TracedWindows` keeps
those times, so a step is marked traced exactly when it started inside a burst.

``--sample-every N`` keeps its one meaning, a step in N traced on average: a burst of
``BURST_S`` every ``N × BURST_S``; ``auto``/``live`` is N = ``AUTO_NATIVE``. Between bursts a
program whose graphs are traced at graph level (``--cuda-graph-trace graph``) still sends one
record per CUDA-graph launch, so each of its graph steps is seen with its GPU time; otherwise
nothing of its kernels arrives between bursts, and its steps are seen in bursts only.
"""
from __future__ import annotations

from collections import deque

from ..store.records import GRAPH_KERNEL  # noqa: F401 - the kernel stream's name for a launch

BURST_S = 0.25        # one burst's length: ~100-200 decode steps of a small model
AUTO_NATIVE = 32      # auto: a burst in every 8 s (llama-bench traced ~3 % of its time)
FIRST_S = 1.0         # the first burst, after the program's first CUDA call (its set-up)
MAX_WINDOWS = 8192    # bursts remembered (8 s apart: 18 hours)


class BurstSchedule:
    """Bursts of ``burst_s`` every ``period_s``, the first ``first_s`` after :meth:`start`;
    :meth:`due` says when to switch. Pure bookkeeping on the clock it is given."""

    def __init__(self, every: int, burst_s: float = BURST_S, first_s: float = FIRST_S) -> None:
        if every < 2:
            raise ValueError("a schedule samples: every >= 2 (1 traces everything)")
        self.every = int(every)
        self.burst_s = float(burst_s)
        self.period_s = self.burst_s * self.every
        self.first_s = float(first_s)
        self.t0: float | None = None
        self.on = False          # what was asked last

    @classmethod
    def from_option(cls, sample_every: int | str) -> "BurstSchedule | None":
        """``--sample-every``'s value: None for 1 (every kernel traced), else the schedule."""
        n = AUTO_NATIVE if sample_every in ("auto", "live") else int(sample_every)
        return None if n <= 1 else cls(n)

    def start(self, now: float) -> None:
        self.t0 = now
        self.on = False

    def wanted(self, now: float) -> bool:
        """Whether a burst runs at ``now``."""
        if self.t0 is None:
            return False
        t = now - self.t0 - self.first_s
        return t >= 0 and t % self.period_s < self.burst_s

    def due(self, now: float) -> bool | None:
        """The switch due at ``now`` (True: on, False: off), once; None when none is."""
        want = self.wanted(now)
        if want == self.on:
            return None
        self.on = want
        return want

    def words(self) -> str:
        return (f"sampled: kernels traced {self.burst_s * 1e3:.0f} ms in every "
                f"{self.period_s:g} s (1 in {self.every})")


class TracedWindows:
    """The bursts' CUPTI times, as the library reported them: ``at(ts)`` tells a traced step
    from one that ran between bursts. ``always``: no sampling, every time is traced."""

    def __init__(self, always: bool = False) -> None:
        self.always = always
        self._w: deque = deque(maxlen=MAX_WINDOWS)   # [start, end or None while it runs]

    def switched(self, on: bool, ts: int) -> None:
        w = self._w
        if on:
            if w and w[-1][1] is None:   # two starts in a row: the first ended here
                w[-1][1] = ts
            w.append([ts, None])
        elif w and w[-1][1] is None:
            w[-1][1] = ts

    def at(self, ts: int) -> bool:
        if self.always:
            return True
        for start, end in reversed(self._w):   # the newest first: steps are recent
            if start <= ts:
                return end is None or ts < end
        return False

    def burst_of(self, ts: int) -> int | None:
        """The start of the burst that holds ``ts`` (its key), or None."""
        for start, end in reversed(self._w):
            if start <= ts:
                return start if end is None or ts < end else None
        return None

    def seconds(self) -> float:
        """Time traced in bursts that ended."""
        return sum(b - a for a, b in self._w if b is not None) / 1e9


class BurstFilter:
    """Kernel records a burst must not keep: one that starts before its burst (it straddled the
    switch on), and every record of the burst's first CUDA-graph launch (its correlation id).
    On an H200, the first graph launch traced after kernel tracing came on carried wrong
    timestamps (each of its kernels ~160 ms long), as the Python path's warm-up token does; the
    first launch of each burst is therefore a warm-up, its records dropped and counted."""

    def __init__(self, windows: TracedWindows) -> None:
        self.windows = windows
        self._first: dict[int, int] = {}   # burst start -> its first graph launch's correlation
        self.straddled = 0
        self.warmup = 0

    def keep(self, start: int, corr: int, graph: int) -> bool:
        burst = self.windows.burst_of(start)
        if burst is None:
            self.straddled += 1
            return False
        if graph:
            first = self._first.get(burst)
            if first is None:
                if len(self._first) > 64:
                    self._first.pop(next(iter(self._first)))
                first = self._first[burst] = corr
            if corr == first:
                self.warmup += 1
                return False
        return True
