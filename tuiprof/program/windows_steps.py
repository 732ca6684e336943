"""Fixed time windows as steps, while nothing else marks the program's steps.

A program that neither calls transformers' ``generate()`` nor marks its loop still has its
kernels, copies and allocations attributed to time: windows of ``window_ms`` (phase
``window``) from the program's start until another source records its first step, after
which windows stop for good. A finding then says that no step boundaries were found and how
to add them (``tuiprof.analysis.findings``).
"""
from __future__ import annotations

import threading
import time

from .steps import WINDOW, StepRecorder, compiled_or_eager

SOURCE = "windows"


class WindowSteps:
    """A thread that opens a new window every ``window_ms`` (drift-free deadlines)."""

    name = SOURCE

    def __init__(self, recorder: StepRecorder, window_ms: float = 100.0) -> None:
        self.recorder = recorder
        self.period = max(1.0, float(window_ms)) / 1000.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tuiprof-windows", daemon=True)
        self._thread.start()

    def uninstall(self) -> None:
        """Stop opening windows; the open one ends now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.recorder.end(SOURCE)

    def _run(self) -> None:
        rec = self.recorder
        deadline = time.monotonic()
        while not self._stop.is_set():
            # steps come from the program now, or from another process: windows are over
            if rec.marked or rec.elsewhere:
                rec.end(SOURCE)
                return
            rec.begin(SOURCE, WINDOW, mode=compiled_or_eager())
            now = time.monotonic()
            deadline += self.period
            if deadline <= now:  # this thread was held up (the GIL): skip, never a 0 ms window
                deadline = now + self.period
            self._stop.wait(deadline - now)


def make(session) -> WindowSteps | None:
    """Windows, unless the steps come from NVTX ranges (a session whose NVTX steps cannot
    run falls back to windows: ``ProgramSession``)."""
    return None if session.step_ranges else WindowSteps(session.recorder, session.window_ms)
