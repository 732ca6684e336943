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
        if make_event is None:
            self._make, self._ready, self._capturing = _cuda_event, _cuda_ready, _capturing
        else:
            self._make, self._ready, self._capturing = make_event, _yes, _no
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
        if self.failed or not self._ready():
            return None
        try:
            if self._capturing():
                return None
            pair = self._take()
            if pair is None:
                self.skipped += 1
                return None
            pair[0].record()
            return [pair[0], pair[1], False]
        except Exception:
            self.failed = True
            return None

    def stop(self, mark: list | None) -> None:
        """The step's device work is queued: record its second event (once)."""
        if mark is None or mark[2]:
            return
        try:
            mark[1].record()
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
        out = []
        pending = self._pending
        while pending:
            index, e0, e1 = pending[0]
            try:
                if wait:
                    e1.synchronize()
                elif not e1.query():
                    break
                ms = e0.elapsed_time(e1)
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
            return self._make(), self._make()
        return None


def _yes() -> bool:
    return True


def _no() -> bool:
    return False


def _cuda_ready() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _capturing() -> bool:
    import torch  # noqa: PLC0415 - imported already: _cuda_ready found it

    return torch.cuda.is_current_stream_capturing()


def _cuda_event() -> Any:
    import torch  # noqa: PLC0415

    return torch.cuda.Event(enable_timing=True)
