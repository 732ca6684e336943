"""Every program step's GPU time, from CUDA events, read without waiting for the device.

The built-in engine records a CUDA event before and after each step and reads their elapsed
time after the step's own sync. A profiled program's loop is not ours to sync, so here:

* ``start`` records an event when a step begins, on the calling thread's current stream (the
  program's thread, inside its ``generate()`` or ``tuiprof.step``: the stream its work goes
  to);
* ``stop`` records the second when the step's device work has been queued (``generate()``:
  after its stopping criteria, right before the loop's sync; continuous batching: at the end
  of its generation step; ``tuiprof.step``: at the end of the ``with`` block), or when the
  step ends if no source said so earlier;
* ``poll`` reads the pairs whose second event has completed (``Event.query()``, never a
  wait), oldest first, at the next step's boundary: a step's time reaches the store a step or
  two after the step.

Bounded: events come from a pool of ``pairs`` pairs reused once read. A step that finds the
pool empty (the device more than ``pairs`` steps behind the host) goes untimed and is counted
in ``skipped``. A step that begins while its stream is capturing a CUDA graph is not timed
either (an event recorded then would be part of the graph).

Without CUDA (a CPU run, or CUDA not initialised yet) ``start`` returns None and nothing is
recorded: the check is a dictionary look-up and a function call a step.
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Any, Callable

POOL_PAIRS = 16


class StepTimer:
    """CUDA-event pairs around program steps (see the module docstring). Not thread-safe by
    itself: the :class:`~tuiprof.program.steps.StepRecorder` calls it under its lock."""

    def __init__(self, pairs: int = POOL_PAIRS,
                 make_event: Callable[[], Any] | None = None) -> None:
        # by default torch.cuda.Event(enable_timing=True), once CUDA is initialised in this
        # process; ``make_event``: where no CUDA event can exist (a test on a CPU), a double
        # of the event object (record, query, synchronize, elapsed_time), always ready
        self._ops: _Ops | None = None if make_event is None else _double_ops(make_event)
        self.pairs = max(1, int(pairs))
        self._free: list = []
        self._made = 0
        self._pending: deque = deque()   # (index, start event, end event), oldest first
        self.timed = 0      # steps whose time was read
        self.skipped = 0    # steps left untimed: the pool was empty
        self.failed = False  # an event call raised: timing is off for the rest of the run

    def start(self) -> list | None:
        """Record a step's first event; returns the mark to pass to :meth:`stop` and
        :meth:`finished`, or None when the step goes untimed."""
        ops = self._ops
        if ops is None:
            if self.failed or not _cuda_ready():
                return None
            ops = self._ops = _cuda_ops()   # CUDA is up: the calls are looked up once
        elif self.failed:
            return None
        try:
            if ops.capturing():
                return None
            pair = self._take()
            if pair is None:
                self.skipped += 1
                return None
            stream = ops.stream()
            ops.record(pair[0], stream)
            return [pair[0], pair[1], False, stream]
        except Exception:
            self.failed = True
            return None

    def stop(self, mark: list | None) -> None:
        """The step's device work is queued: record its second event (once), on the stream
        its first went to (the two events of a pair time one stream)."""
        if mark is None or mark[2]:
            return
        try:
            self._ops.record(mark[1], mark[3])
            mark[2] = True
        except Exception:
            self.failed = True

    def finished(self, index: int, mark: list | None) -> None:
        """The step ``index`` (its ``TokenEvent.index``) ended; its time is read by a later
        :meth:`poll`."""
        if mark is None:
            return
        self.stop(mark)
        if mark[2]:
            self._pending.append((index, mark[0], mark[1]))
        else:
            self._free.append((mark[0], mark[1]))

    def poll(self, wait: bool = False) -> list[tuple[int, float]]:
        """``(index, ms)`` of the finished steps whose events have completed, oldest first;
        ``wait``: wait for every one (the program has ended: nothing of its to hold up)."""
        pending = self._pending
        if not pending:
            return []
        ops = self._ops
        out = []
        while pending:
            index, e0, e1 = pending[0]
            try:
                if wait:
                    e1.synchronize()
                elif not ops.query(e1):
                    break
                ms = ops.elapsed(e0, e1)
            except Exception:
                ms = None
            pending.popleft()
            self._free.append((e0, e1))
            if ms is not None and ms >= 0:
                out.append((index, ms))
                self.timed += 1
        return out

    def _take(self) -> tuple | None:
        if self._free:
            return self._free.pop()
        if self._made < self.pairs:
            self._made += 1
            return self._ops.make(), self._ops.make()
        return None


class _Ops:
    """The event calls a step makes, looked up once: ``make`` an event, ``record`` it on a
    stream, ``query`` and ``elapsed`` it, the calling thread's current ``stream`` and whether
    it is ``capturing`` a CUDA graph."""

    __slots__ = ("make", "record", "query", "elapsed", "stream", "capturing")

    def __init__(self, make, record, query, elapsed, stream, capturing) -> None:
        self.make, self.record, self.query, self.elapsed = make, record, query, elapsed
        self.stream, self.capturing = stream, capturing


def _double_ops(make_event: Callable[[], Any]) -> _Ops:
    """A test double's events: their own methods, no stream, never capturing."""
    return _Ops(make_event, lambda ev, stream: ev.record(), lambda ev: ev.query(),
                lambda e0, e1: e0.elapsed_time(e1), lambda: None, lambda: False)


def _cuda_ready() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _cuda_ops() -> _Ops:
    """torch's CUDA-event calls without their Python wrappers where this torch has them:
    ``torch.cuda.Event.record()`` builds a ``Stream`` object each call through three Python
    functions, which is most of what a pair of events costs a step. The current stream is
    read as its ids instead, and its ``Stream`` object made once per stream. Any piece
    missing (another torch): the public calls."""
    import torch  # noqa: PLC0415 - imported already: _cuda_ready found it

    def make():
        return torch.cuda.Event(enable_timing=True)

    C = torch._C
    base = getattr(C, "_CudaEventBase", None)
    fast = base is not None and all(hasattr(base, n) for n in ("record", "query", "elapsed_time")) \
        and all(hasattr(C, n) for n in ("_cuda_getDevice", "_cuda_getCurrentStream",
                                        "_cuda_isCurrentStreamCapturing"))
    if not fast:
        return _Ops(make, lambda ev, stream: ev.record(stream), lambda ev: ev.query(),
                    lambda e0, e1: e0.elapsed_time(e1), torch.cuda.current_stream,
                    torch.cuda.is_current_stream_capturing)
    get_device, get_stream, Stream = C._cuda_getDevice, C._cuda_getCurrentStream, torch.cuda.Stream
    streams: dict = {}

    def stream():
        key = get_stream(get_device())   # (stream id, device index, device type)
        s = streams.get(key)
        if s is None:
            if len(streams) >= 64:   # bounded: a program that makes streams without end
                streams.clear()
            s = streams[key] = Stream(stream_id=key[0], device_index=key[1],
                                      device_type=key[2])
        return s

    return _Ops(make, base.record, base.query, base.elapsed_time, stream,
                C._cuda_isCurrentStreamCapturing)
