"""Start-up progress: the phases between the command and the first token, with their times.

The engine reports phases (``with phase("importing torch"):``) and amounts
(``advance(done, total, "bytes")``) to the tracker installed for the running thread by
:func:`tracking`; without one these calls do nothing. The profiler owns the tracker; its
immutable :class:`LoadProgress` snapshots travel in
:class:`~tuiprof.control.SourceStatus` to the UI, which shows a progress line from the first
frame, and the finished breakdown goes into the session's metadata (``meta["startup"]``).

Times are ``time.monotonic()`` seconds. On Linux that clock is shared by every process, so a
session process counts its phases from the start of the command in the UI process.
"""
from __future__ import annotations

import contextvars
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator

MAX_PHASES = 32  # a start-up has about ten; bounded whatever reports


def command_start() -> float:
    """``time.monotonic()`` when this process started (Linux: from ``/proc``), else now.

    Counting from the process's start includes the interpreter and the imports before
    ``main()`` runs, which a user waits through as well.
    """
    now = time.monotonic()
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0.0 <= age < 60.0 else now


@dataclass(frozen=True)
class Phase:
    """One start-up phase; times in seconds since the command started."""

    name: str
    start_s: float
    end_s: float | None = None
    done: int = 0
    total: int = 0
    unit: str = ""  # "bytes", "layers" or "" (no amount)

    def amount(self) -> str:
        """``0.31/1.19 GB`` or ``12/28 layers``; empty without an amount."""
        if not self.total:
            return ""
        if self.unit == "bytes":
            return f"{self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB"
        return f"{self.done}/{self.total} {self.unit}".rstrip()


@dataclass(frozen=True)
class LoadProgress:
    """What a session's start-up has done so far (immutable: replaced, never changed)."""

    t0: float                          # time.monotonic() when the command started
    phases: tuple[Phase, ...] = ()
    first_token_s: float | None = None
    facts: tuple[tuple[str, object], ...] = ()   # learnt on the way (device, dtype): for meta

    def open_phases(self) -> list[Phase]:
        return [p for p in self.phases if p.end_s is None]

    def elapsed(self, now: float | None = None) -> float:
        return max(0.0, (time.monotonic() if now is None else now) - self.t0)

    def line(self, now: float | None = None, clock: bool = True) -> str:
        """``4.2 s · building model · initialising weights 0.31/1.19 GB`` (the running phases;
        the last finished one while none runs)."""
        running = self.open_phases() or list(self.phases[-1:])
        parts = [f"{p.name} {p.amount()}".rstrip() for p in running]
        if clock:
            parts.insert(0, f"{self.elapsed(now):.1f} s")
        return " · ".join(parts)

    def as_dict(self) -> dict:
        """The breakdown for a snapshot: phases with start and duration, first token."""
        return {
            "first_token_s": _round(self.first_token_s),
            "phases": [{"name": p.name, "start_s": _round(p.start_s),
                        "seconds": _round(p.end_s - p.start_s) if p.end_s is not None else None,
                        **({"done": p.done, "total": p.total, "unit": p.unit} if p.total else {})}
                       for p in self.phases],
        }

    def summary(self, at_least_s: float = 0.05) -> str:
        """One line: ``first token 6.3 s after start (starting 0.2 s, importing torch 2.1 s, …)``
        (phases shorter than ``at_least_s`` left out; ``as_dict`` has them all)."""
        done = ", ".join(f"{p.name} {p.end_s - p.start_s:.1f} s" for p in self.phases
                         if p.end_s is not None and p.end_s - p.start_s >= at_least_s)
        head = (f"first token {self.first_token_s:.1f} s after start"
                if self.first_token_s is not None else f"{self.elapsed():.1f} s since start")
        return f"{head} ({done})" if done else head


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class ProgressTracker:
    """Builds a session's :class:`LoadProgress`; safe to call from several threads.

    ``on_change`` receives every new snapshot (the profiler puts it in its status).
    """

    def __init__(self, t0: float | None = None,
                 on_change: Callable[[LoadProgress], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._on_change = on_change
        self.progress = LoadProgress(time.monotonic() if t0 is None else t0)

    def _now(self) -> float:
        return time.monotonic() - self.progress.t0

    def _set(self, progress: LoadProgress) -> None:
        self.progress = progress
        if self._on_change is not None:
            self._on_change(progress)

    def begin(self, name: str) -> None:
        """Start phase ``name`` (a phase of that name still running goes on)."""
        with self._lock:
            p = self.progress
            if any(ph.name == name and ph.end_s is None for ph in p.phases):
                return
            phases = p.phases if len(p.phases) < MAX_PHASES else p.phases[1:]
            self._set(replace(p, phases=(*phases, Phase(name, self._now()))))

    def end(self, name: str) -> None:
        """End the running phase ``name`` (nothing if none runs)."""
        self._update(name, lambda ph: replace(ph, end_s=self._now()))

    def advance(self, done: int, total: int, unit: str = "bytes", name: str | None = None) -> None:
        """Set the amount of phase ``name`` (default: the latest running phase)."""
        self._update(name, lambda ph: replace(ph, done=int(done), total=int(total), unit=unit))

    def add(self, name: str, start_s: float, end_s: float) -> None:
        """Record a finished phase measured elsewhere (seconds since the command started)."""
        with self._lock:
            p = self.progress
            self._set(replace(p, phases=(*p.phases[-(MAX_PHASES - 1):], Phase(name, start_s, end_s))))

    def note(self, key: str, value: object) -> None:
        """A fact learnt during start-up (the device picked, the dtype) for the session's meta."""
        with self._lock:
            p = self.progress
            facts = tuple((k, v) for k, v in p.facts if k != key) + ((key, value),)
            self._set(replace(p, facts=facts))

    def first_token(self) -> None:
        """The first token is out: end every running phase and note the time."""
        with self._lock:
            now = self._now()
            p = self.progress
            if p.first_token_s is not None:
                return
            phases = tuple(ph if ph.end_s is not None else replace(ph, end_s=now) for ph in p.phases)
            self._set(replace(p, phases=phases, first_token_s=now))

    def _update(self, name: str | None, change: Callable[[Phase], Phase]) -> None:
        with self._lock:
            phases = list(self.progress.phases)
            for i in range(len(phases) - 1, -1, -1):
                if phases[i].end_s is None and (name is None or phases[i].name == name):
                    phases[i] = change(phases[i])
                    self._set(replace(self.progress, phases=tuple(phases)))
                    return


# ----------------------------------------------------------------- reporting from the engine
_current: contextvars.ContextVar[ProgressTracker | None] = contextvars.ContextVar(
    "tuiprof_startup_tracker", default=None)


@contextmanager
def tracking(tracker: ProgressTracker | None) -> Iterator[ProgressTracker | None]:
    """Report this thread's :func:`phase` and :func:`advance` calls to ``tracker``."""
    token = _current.set(tracker)
    try:
        yield tracker
    finally:
        _current.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the enclosed block as phase ``name`` (if a tracker listens)."""
    tracker = _current.get()
    if tracker is None:
        yield
        return
    tracker.begin(name)
    try:
        yield
    finally:
        tracker.end(name)


def advance(done: int, total: int, unit: str = "bytes") -> None:
    """Amount done in the latest running phase (bytes of weights, layers, ...)."""
    tracker = _current.get()
    if tracker is not None:
        tracker.advance(done, total, unit)


def note(key: str, value: object) -> None:
    """A fact learnt during start-up (e.g. ``device``) for the session's metadata."""
    tracker = _current.get()
    if tracker is not None:
        tracker.note(key, value)


def in_thread(fn: Callable[[], None], name: str) -> threading.Thread:
    """Start ``fn`` on a daemon thread that reports to this thread's tracker."""
    ctx = contextvars.copy_context()
    t = threading.Thread(target=ctx.run, args=(fn,), name=name, daemon=True)
    t.start()
    return t
