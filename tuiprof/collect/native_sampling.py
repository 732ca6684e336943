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
from ..store.records import K_CORR, K_END, K_GRAPH, K_START, K_STREAM, KERNEL, KIND

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
        n = (AUTO_NATIVE if sample_every in ("auto", "live") else
             4 * AUTO_NATIVE if sample_every == "leave" else int(sample_every))
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


class BurstFilter:
    """Kernel records a burst must not keep, one buffer at a time (:meth:`filter`):

    - a kernel that starts before its burst or ends after it (it straddled a switch);
    - kernels that run over one another beyond any real run: on one stream, a chain of
      overlapping kernels whose summed time is more than ``MAX_OVERLAP`` times the chain's span.
      On an H200 the records a switch caught came back so: 169 kernels of one llama-bench graph
      launch ~160 ms long each, and in llama-server all 733 kernels of one launch ~89 ms each
      (the launch takes 1.2 ms; every kernel of the pane then read 1.23 ms a launch). Kernels on
      a stream run one after another, a graph's branches a few at once; the chain's later
      records in the next buffer (those starting before its end) go with it.

    Nothing here relies on correlation ids: in llama-server's bursts on the H200 every graph
    launch of a burst came with one (18,024 kernels over 195 ms under one id), so a rule by
    launch (b97003b dropped each burst's first launch) dropped whole bursts. Counted:
    ``straddled`` and ``overlapped`` (records), ``overlapping`` (chains, the last described in
    :attr:`dropped` for the snapshot's meta)."""

    MAX_OVERLAP = 4     # kernels running at once on one stream, on average over their chain

    def __init__(self, windows: TracedWindows) -> None:
        self.windows = windows
        self._until: dict[int, int] = {}   # stream -> end of its last dropped chain
        self.straddled = 0
        self.overlapping = 0
        self.overlapped = 0
        self.dropped: deque = deque(maxlen=16)

    def filter(self, records: list) -> list:
        """``records`` (one parsed buffer) without the kernels above; other kinds stay."""
        bad: set = set()
        streams: dict[int, list] = {}
        for r in records:
            if r[KIND] != KERNEL:
                continue
            w = self.windows.window_of(r[K_START])
            if w is None or (w[1] is not None and r[K_END] > w[1]):
                bad.add(id(r))
                self.straddled += 1
            else:
                streams.setdefault(r[K_STREAM], []).append(r)
        for stream, ks in streams.items():
            ks.sort(key=lambda k: k[K_START])
            until = self._until.get(stream, 0)
            chain: list = []
            end = 0
            for k in ks + [None]:
                if k is not None and k[K_START] < until:     # a chain dropped before goes on
                    bad.add(id(k))
                    self.overlapped += 1
                    until = max(until, k[K_END])
                    continue
                if k is not None and chain and k[K_START] < end:
                    chain.append(k)
                    end = max(end, k[K_END])
                    continue
                if len(chain) > 1 and sum(c[K_END] - c[K_START] for c in chain) > \
                        self.MAX_OVERLAP * (end - chain[0][K_START]):
                    self._drop(chain, end)
                    bad.update(map(id, chain))
                    until = max(until, end)
                if k is not None:
                    chain, end = [k], k[K_END]
            if until:
                self._until[stream] = until
                if len(self._until) > 64:
                    self._until.pop(next(iter(self._until)))
        if not bad:
            return records
        return [r for r in records if id(r) not in bad]

    def _drop(self, chain: list, end: int) -> None:
        self.overlapping += 1
        self.overlapped += len(chain)
        start = chain[0][K_START]
        w = self.windows.window_of(start) or (None, None)
        durs = sorted(k[K_END] - k[K_START] for k in chain)
        self.dropped.append({
            "kernels": len(chain), "span_us": round((end - start) / 1e3, 1),
            "kernel_us_median": round(durs[len(durs) // 2] / 1e3, 1),
            "starts": len({k[K_START] for k in chain}), "ends": len({k[K_END] for k in chain}),
            "correlations": len({k[K_CORR] for k in chain}),
            "graph": bool(chain[0][K_GRAPH]),
            "after_burst_start_us": None if w[0] is None else round((start - w[0]) / 1e3, 1)})
