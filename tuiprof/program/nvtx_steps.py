"""Steps cut at NVTX ranges the program already pushes (``--step-range NAME``).

CUPTI delivers NVTX ranges as marker records (start and end share an id) once
``NVTX_INJECTION64_PATH`` points at libcupti before the program's first NVTX call; the
collector's consumer thread hands each parsed buffer's markers and records to
:meth:`NvtxSteps.feed` before folding the records into the store.

A range's step is known only when its markers arrive, and markers travel in CUPTI's global
buffers while kernels travel in per-context ones, so a kernel can arrive before the marker
that opens its step. Records are therefore held back until the markers have caught up with
them (their start is before the newest marker seen) or for ``hold_s`` seconds at most, and
folded after; at most ``max_held`` records wait, the oldest go first.
"""
from __future__ import annotations

import os
import time
from collections import deque

from ..collect.cupti_raw import MARKER_FLAG_END, MARKER_FLAG_START
from ..store.records import record_start
from .steps import DECODE, PREFILL, StepRecorder, compiled_or_eager

SOURCE = "nvtx"
HOLD_S = 1.5              # > CUPTI's flush period (500 ms): by then every buffer has come
MAX_HELD = 500_000        # records


class NvtxSteps:
    """The collector's :class:`~tuiprof.collect.cupti_collector.MarkerSink` for one session
    (a step source: CUPTI feeds it, so ``install`` only checks that the ranges will come)."""

    name = SOURCE

    def __init__(self, recorder: StepRecorder, names: tuple[str, ...], hold_s: float = HOLD_S,
                 max_held: int = MAX_HELD, monotonic=time.monotonic) -> None:
        self.recorder = recorder
        self.names = frozenset(names)
        self.hold_s = hold_s
        self.max_held = max_held
        self._now = monotonic
        self._starts: dict[int, tuple[str, int]] = {}   # marker id -> (name, start ts)
        self._open_id: int | None = None
        self._step = None
        self._held: deque = deque()   # (arrival, newest start ts, records)
        self._held_n = 0
        self.watermark = 0            # newest marker timestamp seen
        self.ranges = 0               # ranges named NAME that became steps
        self.overlapping = 0          # ranges that began while another step was open

    def feed(self, markers: list, records: list) -> list:
        for m in markers:
            self._marker(m)
        if records:
            self._held.append((self._now(), max(map(record_start, records)), records))
            self._held_n += len(records)
        return self._release(self._now())

    def drain(self) -> list:
        out = [r for _, _, recs in self._held for r in recs]
        self._held.clear()
        self._held_n = 0
        return out

    def _marker(self, m: tuple) -> None:
        _, flags, ts, mid, name, _domain, _thread = m
        if ts > self.watermark:
            self.watermark = ts
        if flags & MARKER_FLAG_START:
            if name in self.names:
                if len(self._starts) > 4096:  # ends that never came: forget them
                    self._starts.clear()
                self._starts[mid] = (name, ts)
                if self._open_id is None:
                    phase = PREFILL if "prefill" in name.lower() else DECODE
                    self._step = self.recorder.begin(SOURCE, phase, start_ns=ts,
                                                     mode=compiled_or_eager())
                    if self._step is not None:
                        self._open_id = mid
                        self.ranges += 1
                else:
                    self.overlapping += 1
        elif flags & MARKER_FLAG_END:
            if self._starts.pop(mid, None) is not None and mid == self._open_id:
                self.recorder.end(SOURCE, end_ns=ts, step=self._step)
                self._open_id = self._step = None

    def _release(self, now: float) -> list:
        out: list = []
        held = self._held
        while held and (held[0][1] <= self.watermark or now - held[0][0] >= self.hold_s
                        or self._held_n > self.max_held):
            _, _, recs = held.popleft()
            self._held_n -= len(recs)
            out.extend(recs)
        return out

    @property
    def markers(self) -> "NvtxSteps":
        return self

    def install(self) -> None:
        """Point NVTX at CUPTI (read at the program's first NVTX call); raises
        :class:`NoNvtx` with the reason when the ranges cannot arrive."""
        from ..collect.cupti_raw import find_libcupti  # noqa: PLC0415

        lib = find_libcupti()._name
        current = os.environ.get("NVTX_INJECTION64_PATH")
        if current and os.path.realpath(current) != os.path.realpath(lib):
            raise NoNvtx("NVTX_INJECTION64_PATH points at another tool; --step-range sees no "
                         "ranges (unset it)")
        os.environ["NVTX_INJECTION64_PATH"] = lib

    def uninstall(self) -> None:
        self.recorder.end(SOURCE)


class NoNvtx(RuntimeError):
    """NVTX ranges cannot reach this session; one line."""


def make(session) -> NvtxSteps | None:
    return NvtxSteps(session.recorder, session.step_ranges) if session.step_ranges else None
