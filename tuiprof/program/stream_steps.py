"""Steps cut from the kernel stream itself: a native program that marks none.

The collector's consumer hands every parsed buffer's records to :meth:`StreamSteps.feed`
(the :class:`~tuiprof.collect.cupti_collector.MarkerSink` protocol) before folding them. The
records are held while the kernels seen so far are searched for a decode loop
(:func:`tuiprof.analysis.period.detect`); once one is found with enough confidence, every step
of it is cut from the kernels (source ``auto``: the prefill before each run of decode steps,
then one decode step per period) and the records are folded into those steps. Until then, and
if no loop ever shows, the held records older than ``hold_s`` (of record time) are cut into
fixed windows of ``window_ms`` (source ``windows``) on the records' own clock, so that a live
display lags the program by at most about ``hold_s``.

**A step per graph launch.** A server's steps change with every batch (llama-server's GEMVs
take as many columns as slots are decoding), so no kernel sequence repeats. When none is found
and nearly every kernel ran inside a CUDA graph, each graph launch (its kernels share the
launch's correlation id) is a step, with the kernels launched one by one after it; the step's
batch is the column count of its batched GEMVs (``×N tokens`` in ggml's names).

A step's boundary is the launch (the runtime/driver API record's start) of its first kernel
when that launch came after every kernel of the step before had started; else the kernel's
own start. So every kernel of a step is in the step's window, and with a host that waits for
each token, so are its launches, its copy of the token back, and its sync.
"""
from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter, OrderedDict, deque

import re

from ..analysis.kernels import kernel_info
from ..analysis.period import DECODE, Cut, Loop, cut, detect, unexplained_pauses
from ..store.records import (API, C_END, GRAPH_KERNEL, K_CORR, K_END, K_GRAPH, K_NAME, K_START,
                             K_STREAM, KERNEL, KIND, MEMCPY, R_CORR, R_END, R_START,
                             record_start)
from .steps import WINDOW, StepRecorder

SOURCE = "auto"
WINDOWS = "windows"
HOLD_S = 3.0              # record time held back for the search before windows are cut
SEARCH_KERNELS = 20_000   # the newest kernels searched for a loop
SEARCH_EVERY_S = 1.0      # at most one search per second while none is found
MIN_NEW = 64              # new kernels before another search
LAUNCHES = 65_536         # launch times kept (correlation id -> API start)
MAX_PENDING = 200_000     # kernels of the loop's stream waiting for a boundary
IDLE_STEPS = 10           # a gap after a step longer than this many median steps ends it early
LAUNCH_SHARE = 0.8        # share of the searched kernels inside graph launches: a step a launch
MIN_LAUNCHES = 16         # graph launches seen before a step per launch is taken
BY_LAUNCH = Loop(0, "[a CUDA-graph launch]", 0, (), False, None)   # that mode's loop
_TOKENS = re.compile(r" ×(\d+) tokens")


class StreamSteps:
    """Decode steps found in the kernel stream, else windows; see the module docstring.
    A step source (``tuiprof.program.registry``) whose marker sink the native collector feeds:
    ``install`` has nothing to start, ``uninstall`` nothing to end (the collector drains it)."""

    name = SOURCE

    def __init__(self, recorder: StepRecorder, window_ms: float = 100.0, *,
                 hold_s: float = HOLD_S, monotonic=time.monotonic, meta: dict | None = None) -> None:
        self.recorder = recorder
        self.window_ns = int(max(1.0, float(window_ms)) * 1e6)
        self.hold_ns = int(hold_s * 1e9)
        self._now = monotonic
        self.meta = meta if meta is not None else {}
        self.loop: Loop | None = None
        self.found: Cut | None = None
        self._held: list = []
        self._hist: deque = deque(maxlen=SEARCH_KERNELS)  # (start, end, name, stream, corr)
        self._pending: list = []       # loop mode: kernels of the loop's stream, not in a step
        self._after_decode = False     # the pending kernels follow a decode step without a pause
        self._launch: OrderedDict[int, int] = OrderedDict()
        self._watermark = 0            # steps and windows exist up to here (record clock)
        self._newest = 0
        self._new_kernels = 0
        self._searched_at = -1e18
        self.counts = {"decode": 0, "prefill": 0, "identical": 0, "varying": 0, "windows": 0}
        self._durations: deque = deque(maxlen=64)   # recent decode steps' lengths (ns)
        self.by_launch = False         # a step per graph launch (no repeating sequence)
        self._heads: Counter = Counter()   # launches' first kernels (their head)
        self._per: Counter = Counter()     # the head's count in a launch

    @property
    def markers(self) -> "StreamSteps":
        return self

    def install(self) -> None:
        pass

    def uninstall(self) -> None:
        pass

    # ------------------------------------------------------------------- sink
    def feed(self, markers: list, records: list) -> list:
        for rec in records:
            kind = rec[KIND]
            if kind == KERNEL:
                k = (rec[K_START], rec[K_END], rec[K_NAME], rec[K_STREAM], rec[K_CORR],
                     rec[K_GRAPH])
                self._hist.append(k)
                if self.loop is not None and (self.loop.stream is None
                                              or rec[K_STREAM] == self.loop.stream):
                    self._pending.append(k)
                if rec[K_START] > self._newest:
                    self._newest = rec[K_START]
                self._new_kernels += 1
            elif kind == API:
                launch = self._launch
                launch[rec[R_CORR]] = rec[R_START]
                if len(launch) > LAUNCHES:
                    launch.popitem(last=False)
        self._held.extend(records)
        if self.loop is None:
            self._search(final=False)
        if self.loop is not None:
            self._cut(final=False)
        else:
            self._windows(self._newest - self.hold_ns)
        return self._release()

    def drain(self) -> list:
        """The program ended: a last search, every step and window to the end, all records."""
        if self.loop is None:
            self._search(final=True)
        if self.loop is not None:
            self._cut(final=True)
        if self.loop is None:  # after a loop's last step, the tail is no step
            self._windows(max([self._newest] + [_record_end(r) for r in self._held]) + 1,
                          final=True)
        out, self._held = self._held, []
        self._describe()
        return out

    # ----------------------------------------------------------------- search
    def _search(self, final: bool) -> None:
        now = self._now()
        if not final and (self._new_kernels < MIN_NEW or now - self._searched_at < SEARCH_EVERY_S):
            return
        self._searched_at = now
        self._new_kernels = 0
        ks = sorted(self._hist)
        if len(ks) < 6:
            return
        for part in (ks, ks[len(ks) // 2:], ks[3 * len(ks) // 4:]):  # a loop that began late
            found = detect([k[2] for k in part], [k[0] for k in part], [k[1] for k in part],
                           [k[3] for k in part], [k[4] for k in part])
            if found.usable or len(part) < 256:
                break
        if found.usable and not final and len(ks) < SEARCH_KERNELS \
                and found.loop.anchor != GRAPH_KERNEL and unexplained_pauses(
                    [k[0] for k in part], [k[1] for k in part], found):
            # the pauses of a longer step, not yet seen three times: a later search decides
            # (a step per graph launch is no layer of a longer step: its kernels are one launch)
            return
        if not found.usable:
            if final or self.found is None:
                self.found = found
            if self._launches_usable(ks):
                self.loop, self.by_launch = BY_LAUNCH, True
                self._pending = self._unstepped()
                self._describe()
            return
        self.found, self.loop = found, found.loop
        self._after_decode = False
        lp = self.loop
        self._pending = [k for k in self._unstepped() if lp.stream is None or k[3] == lp.stream]
        self._describe()

    def _unstepped(self) -> list:
        """Every kernel held that no step or window took yet, in time order. The search sees
        the newest ``SEARCH_KERNELS`` only: a loop found after more kernels than that arrived
        (a server's first second: ~100,000 kernels) is cut from the first one it holds, not
        from the searched ones (on an H200 the older ones became windows: 142 of ~257 steps)."""
        return sorted((r[K_START], r[K_END], r[K_NAME], r[K_STREAM], r[K_CORR], r[K_GRAPH])
                      for r in self._held if r[KIND] == KERNEL and r[K_START] >= self._watermark)

    # -------------------------------------------------------------------- cut
    @staticmethod
    def _launches_usable(ks: list) -> bool:
        graphed = [k for k in ks if k[5]]
        return (len(graphed) >= LAUNCH_SHARE * len(ks)
                and len({k[4] for k in graphed}) >= MIN_LAUNCHES)

    def _cut_launches(self, final: bool) -> None:
        """A step per graph launch (see the module docstring); the last launch waits for the
        next one (its eager kernels may still come) unless ``final``."""
        pend = self._pending
        pend.sort()
        bounds, last = [], None
        for i, k in enumerate(pend):
            if k[5] and k[4] != last:
                bounds.append(i)
                last = k[4]
        if not bounds:
            return
        bounds = self._eager_steps(pend, bounds)
        edges = bounds + [len(pend)]
        n = len(bounds) if final else len(bounds) - 1
        for j in range(n):
            a, b = edges[j], edges[j + 1]
            start = self._boundary(pend, a)
            end = self._boundary(pend, b) if b < len(pend) else pend[b - 1][1] + 1
            durs = sorted(self._durations)
            if b < len(pend) and durs and end - pend[b - 1][1] > IDLE_STEPS * durs[len(durs) // 2]:
                end = pend[b - 1][1] + 1     # the server waited after this step
            if start < self._watermark:
                continue
            self._windows(start, final=True)
            end = max(end, start + 1)
            batch = max([int(m.group(1)) for m in map(_TOKENS.search, (
                kernel_info(k[2]).short for k in pend[a:b])) if m] or [1])
            step = self.recorder.begin(SOURCE, DECODE, start_ns=start, batch=batch)
            if step is not None:
                self.recorder.end(SOURCE, end_ns=end - 1, step=step)
                self.counts["decode"] += 1
                self.counts["varying"] += 1
                self._durations.append(end - start)
            self._watermark = end
        del pend[:edges[n] if n < len(bounds) else len(pend)]

    def _eager_steps(self, pend: list, bounds: list) -> list:
        """``bounds`` with the steps that ran eagerly after a launch cut apart. llama.cpp runs
        a step kernel by kernel while its graph's shape settles (a slot joined or left): those
        kernels follow the launch before, and were taken into its step (on an H200, steps of
        4 and 5 steps' kernels). A launch's first kernel (its head; ``per`` times in each
        launch) begins an eager step as it begins a launch: every ``per``-th head launched
        alone after a launch starts a step."""
        edges = bounds + [len(pend)]
        done = list(zip(edges, edges[1:]))[:-1]    # the last launch may still be arriving
        self._heads.update(pend[a][2] for a, _ in done)
        if not self._heads:
            return bounds
        head = self._heads.most_common(1)[0][0]
        self._per.update(sum(1 for k in pend[a:b] if k[5] and k[2] == head)
                         for a, b in done if pend[a][2] == head)
        if not self._per:
            return bounds
        per = max(1, self._per.most_common(1)[0][0])
        out = []
        # the kernels before the first launch held: eager steps too when they begin with the
        # head (the step cut last ended there)
        for a, b in ([(0, bounds[0])] if bounds[0] else []) + list(zip(edges, edges[1:])):
            seen = 0
            if pend[a][5]:
                out.append(a)
                a += 1
            for i in range(a, b):
                if not pend[i][5] and pend[i][2] == head:
                    if seen % per == 0:
                        out.append(i)
                    seen += 1
        return out

    def _cut(self, final: bool) -> None:
        pend = self._pending
        if not pend:
            return
        if self.by_launch:
            self._cut_launches(final)
            return
        pend.sort()
        lp = self.loop
        res = cut([k[2] for k in pend], lp, [k[0] for k in pend], [k[1] for k in pend],
                  after_decode=self._after_decode)
        steps = res.steps if final else res.steps[:-1]  # the last may still grow
        for s in steps:
            start = self._boundary(pend, s.first)
            paused = False
            if s.end < len(pend):
                end = self._boundary(pend, s.end)
                paused = self._idle_after(pend, s, end)
                if paused:  # the program paused after this step
                    end = self._last_end(pend[:s.end])
            else:
                end = self._last_end(pend)
            self._after_decode = s.phase == DECODE and not paused
            if start < self._watermark:   # windows were cut there already
                continue
            self._windows(start, final=True)  # records before the step (loading): windows
            end = max(end, start + 1)
            step = self.recorder.begin(SOURCE, s.phase, start_ns=start)
            if step is not None:  # the store's windows include their end: the next one's
                self.recorder.end(SOURCE, end_ns=end - 1, step=step)  # start is not in it
                self.counts["decode" if s.phase == DECODE else "prefill"] += 1
                if s.phase == DECODE:
                    self.counts["identical" if s.identical else "varying"] += 1
                    self._durations.append(end - start)
            self._watermark = end
        keep = steps[-1].end if steps else 0
        if final:
            keep = len(pend)
        del pend[:keep]
        if pend and (len(pend) > MAX_PENDING or pend[0][0] < self._newest - 4 * self.hold_ns):
            # the loop stopped (no boundary for a long time): search again, windows meanwhile
            self.loop = None
            self._pending = []
            self._describe()

    def _idle_after(self, ks: list, s, next_start: int) -> bool:
        """The next step begins long after this one's last kernel (over IDLE_STEPS median
        steps): the program waited (between requests, for input); that wait is no step's."""
        durs = sorted(self._durations)
        return bool(durs) and next_start - ks[s.end - 1][1] > IDLE_STEPS * durs[len(durs) // 2]

    def _last_end(self, ks: list) -> int:
        """The end of the program's last step: after its last kernel, the records that follow
        within a typical step's time (the token's copy back and the sync that waits for it)."""
        end = ks[-1][1] + 1
        durs = sorted(self._durations)
        if durs:
            limit = end + durs[len(durs) // 2]
            end = max([end] + [e + 1 for e in map(_record_end, self._held) if e <= limit])
        return end

    def _boundary(self, ks: list, i: int) -> int:
        """When step ``i`` (an index into ``ks``) begins: its first kernel's launch, if that
        came after the previous kernel started, else the kernel's start."""
        start = ks[i][0]
        launched = self._launch.get(ks[i][4])
        prev = ks[i - 1][0] + 1 if i > 0 else self._watermark
        if launched is not None and prev <= launched < start:
            return launched
        return start

    # ---------------------------------------------------------------- windows
    def _windows(self, until: int, final: bool = False) -> None:
        """Windows of ``window_ns`` from the watermark up to ``until`` (record clock), over
        time that has records: an idle stretch longer than a window is skipped, not cut into
        empty windows. ``final``: the last window ends at ``until`` whatever its length."""
        if until <= self._watermark:
            return
        starts = sorted(t for t in map(record_start, self._held) if t >= self._watermark)
        if not starts:
            return
        w = max(self._watermark, starts[0])
        while w < until:
            end = w + self.window_ns
            if end > until:
                if not final:
                    break
                end = until
            step = self.recorder.begin(WINDOWS, WINDOW, start_ns=w)
            if step is not None:
                self.recorder.end(WINDOWS, end_ns=end - 1, step=step)
                self.counts["windows"] += 1
            self._watermark = end
            i = bisect_left(starts, end)
            if i == len(starts):
                break
            w = end if starts[i] < end + self.window_ns else starts[i]

    def _release(self) -> list:
        wm = self._watermark
        out, keep = [], []
        for r in self._held:
            (out if record_start(r) < wm else keep).append(r)
        self._held = keep
        return out

    def _describe(self) -> None:
        """``meta.auto_steps``: the loop found (from the search that found it) and the steps
        cut so far."""
        info = self.found.describe() if self.found is not None else {"found": False}
        if self.by_launch:
            info = {"found": True, "loop": "a step per CUDA-graph launch (no kernel sequence "
                    "repeats: its batches change)", "kernels_per_step": None,
                    "confidence_label": "by launch", "decode_steps": 0}
        c = self.counts
        if info.get("found"):
            info["searched_decode_steps"] = info.pop("decode_steps")
            info.pop("prefill_steps", None)
            info.pop("identical_steps", None)
        info.update({"source": SOURCE if c["decode"] else WINDOWS, "decode_steps": c["decode"],
                     "prefill_steps": c["prefill"], "identical_steps": c["identical"],
                     "varying_steps": c["varying"], "windows": c["windows"],
                     "loop_active": self.loop is not None})
        self.meta["auto_steps"] = info


def _record_end(rec: tuple) -> int:
    kind = rec[KIND]
    if kind == KERNEL:
        return rec[K_END]
    if kind == API:
        return rec[R_END]
    if kind == MEMCPY:
        return rec[C_END]
    return record_start(rec)


def make(session) -> StreamSteps | None:
    """For a native program whose steps are not NVTX ranges (``--step-range``)."""
    if session.step_ranges:
        return None
    return StreamSteps(session.recorder, session.window_ms, meta=session.prof.store.meta)
