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
from ..store.records import K_CORR, K_END, K_GRAPH, K_START, KERNEL, KIND

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

    def window_of(self, ts: int) -> tuple | None:
        """(start, end or None while it runs) of the burst that holds ``ts``, or None."""
        for start, end in reversed(self._w):
            if start <= ts:
                return (start, end) if end is None or ts < end else None
        return None

    def burst_of(self, ts: int) -> int | None:
        """The start of the burst that holds ``ts`` (its key), or None."""
        for start, end in reversed(self._w):
            if start <= ts:
                return start if end is None or ts < end else None
        return None

    def seconds(self) -> float:
        """Time traced in bursts that ended."""
        return sum(b - a for a, b in self._w if b is not None) / 1e9


STRADDLED = "straddled a switch"
OVERLAPPING = "kernels overlapping beyond any real run"
WARMUP = "warm-up"


class BurstFilter:
    """Kernel records a burst must not keep, one buffer at a time (:meth:`filter`):

    - a kernel that starts before its burst, or ends after the burst ended (it straddled a
      switch), and with it every record of its CUDA-graph launch (the rest is part of a step);
    - every record of a graph launch whose kernels overlap one another beyond any real run:
      summed, they take more than ``MAX_OVERLAP`` times the launch's span. On an H200 the
      launches caught by a switch came back so: each kernel of a launch as long as the whole
      launch and more (169 kernels of ~160 ms each in llama-bench; in llama-server all 733
      kernels of one launch ~89 ms each, where the launch takes 1.2 ms), while a decode graph
      captured from one stream runs its kernels one after another;
    - every record of the burst's first graph launch (its correlation id), a warm-up, as the
      Python path's warm-up token is.

    Each is counted (``straddled`` and ``warmup`` in records, ``overlapping`` in launches), and
    the last launches dropped are described in :attr:`dropped` (the snapshot's meta)."""

    MAX_OVERLAP = 4     # kernels of one launch running at once, on average over its span
    BAD = 256           # correlation ids of dropped launches remembered (their later records)

    def __init__(self, windows: TracedWindows) -> None:
        self.windows = windows
        self._first: dict[int, int] = {}   # burst start -> its first graph launch's correlation
        self._bad: dict[int, str] = {}     # dropped launches -> why (insertion-ordered, bounded)
        self.straddled = 0      # records
        self.warmup = 0         # records
        self.overlapping = 0    # launches
        self.overlapped = 0     # their records
        self.dropped: deque = deque(maxlen=16)

    def filter(self, records: list) -> list:
        """``records`` (one parsed buffer) without the kernels above; other kinds stay."""
        launches: dict[int, list] = {}
        edge: set = set()
        for r in records:
            if r[KIND] != KERNEL:
                continue
            w = self.windows.window_of(r[K_START])
            if w is None or (w[1] is not None and r[K_END] > w[1]):
                edge.add(id(r))
            if r[K_GRAPH]:
                launches.setdefault(r[K_CORR], []).append(r)
        why: dict[int, str] = {}
        for corr, ks in launches.items():
            if corr in self._bad:
                why[corr] = self._bad[corr]
            elif any(id(k) in edge for k in ks):
                why[corr] = self._drop(corr, ks, STRADDLED)
            elif len(ks) > 1 and sum(k[K_END] - k[K_START] for k in ks) > self.MAX_OVERLAP * max(
                    1, max(k[K_END] for k in ks) - min(k[K_START] for k in ks)):
                self.overlapping += 1
                why[corr] = self._drop(corr, ks, OVERLAPPING)
            else:
                burst = self.windows.burst_of(ks[0][K_START])
                first = self._first.get(burst)
                if first is None:
                    if len(self._first) > 64:
                        self._first.pop(next(iter(self._first)))
                    first = self._first[burst] = corr
                if corr == first:
                    why[corr] = WARMUP
        out = []
        for r in records:
            if r[KIND] != KERNEL:
                out.append(r)
                continue
            reason = why.get(r[K_CORR]) if r[K_GRAPH] else (STRADDLED if id(r) in edge else None)
            if reason is None:
                out.append(r)
            elif reason == WARMUP:
                self.warmup += 1
            elif reason == STRADDLED:
                self.straddled += 1
            else:
                self.overlapped += 1
        return out

    def _drop(self, corr: int, ks: list, why: str) -> str:
        self._bad[corr] = why
        if len(self._bad) > self.BAD:
            self._bad.pop(next(iter(self._bad)))
        w = self.windows.window_of(ks[0][K_START]) or (None, None)
        start = min(k[K_START] for k in ks)
        self.dropped.append({
            "why": why, "correlation": corr, "kernels": len(ks),
            "span_us": round((max(k[K_END] for k in ks) - start) / 1e3, 1),
            "kernel_us_median": round(sorted(k[K_END] - k[K_START] for k in ks)[len(ks) // 2]
                                      / 1e3, 1),
            "starts": len({k[K_START] for k in ks}), "ends": len({k[K_END] for k in ks}),
            "after_burst_start_us": None if w[0] is None else round((start - w[0]) / 1e3, 1),
            "before_burst_end_us": None if w[1] is None else round(
                (w[1] - max(k[K_END] for k in ks)) / 1e3, 1)})
        return why
