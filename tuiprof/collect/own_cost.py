"""What a session costs the process it profiles, measured inside that process: the parts of the
overhead figure in the header and the snapshot (``Profiler._update_overhead``).

* :class:`HookClock`: wall time spent in tuiprof's code on threads it does not own (a program's
  main thread, a server's event loop and its batching thread, the built-in engine's decode
  thread): the step hooks, the request hooks, the store's work done there. Wall time, so a hook
  that waited for the GIL counts that wait. Nested spans count once; the program's own code
  between two spans of one wrapper is left out by closing the span before calling it.
* :class:`SessionThreads`: CPU time of the session's own threads (CUPTI's consumer, NVML, the
  host sampler, output capture, serving a UI process, ...), each read from its kernel thread
  clock, so no thread needs to measure itself. A thread whose Python work holds the GIL takes
  that time from a GIL-bound program; the GIL's handoffs themselves are not measured.
* :class:`StepExcess`: what tracing and tuiprof's CUDA-graph drops add to the steps
  themselves, from the steps' own times: a step measured with CUPTI attached (traced, or at a
  burst's edge) or one that recorded its CUDA graphs again, over the mean of untraced steps of
  the same phase and mode. Without untraced steps (CUPTI attached throughout) there is no
  reference, and the figure says so.
"""
from __future__ import annotations

import threading
import time
from time import perf_counter_ns

from ..phases import WINDOW

# threads of the session that do the profiled work itself, not tuiprof's: the built-in engine
# decodes, loads and compiles its model on these (the workload, not its overhead)
WORKLOAD_THREADS = ("tuiprof-engine", "tuiprof-loader", "tuiprof-compile")
OWN_PREFIX = "tuiprof"


class _ThreadSpans:
    """One thread's spans: written by that thread alone (no lock on the hot path), read and
    summed by the session's thread (``HookClock.seconds``)."""

    __slots__ = ("depth", "own", "ns", "excluded_ns", "spans", "thread")

    def __init__(self, own: bool, thread: threading.Thread) -> None:
        self.depth = 0
        self.own = own
        self.ns = 0             # the outermost spans' wall time, integer ns
        self.excluded_ns = 0    # parts of those spans counted elsewhere (CUPTI switches)
        self.spans = 0
        self.thread = thread


class HookClock:
    """Wall time in tuiprof's code on the profiled program's threads (thread-safe).

    Its spans sit on the program's hot path (several a step), so a span costs one clock read at
    each boundary and nothing else: each thread adds integer nanoseconds to its own record, with
    no lock and no allocation; the session's thread sums the records when it reads the figure,
    folding ended threads' records into one total so that the records stay bounded."""

    __slots__ = ("_local", "_lock", "_threads", "_ended", "_base")

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: list[_ThreadSpans] = []
        self._ended = [0, 0, 0]   # ended threads' (ns, excluded ns, spans)
        self._base = (0, 0, 0)    # the sums at the last reset

    def _mine(self) -> _ThreadSpans:
        """This thread's record, made at its first span (a session thread's time is its CPU's:
        its spans count nothing)."""
        t = threading.current_thread()
        rec = self._local.rec = _ThreadSpans(session_thread(t), t)
        with self._lock:
            self._threads.append(rec)
        return rec

    def enter(self) -> int:
        """Open a span on this thread; returns the token for :meth:`leave` (0 inside a span:
        the outer one counts it)."""
        try:
            rec = self._local.rec
        except AttributeError:
            rec = self._mine()
        d = rec.depth
        rec.depth = d + 1
        return 0 if d or rec.own else perf_counter_ns()

    def leave(self, token: int) -> None:
        """Close the span :meth:`enter` opened."""
        if token:
            dt = perf_counter_ns() - token
            rec = self._local.rec
            rec.ns += dt
            rec.spans += 1
            rec.depth = 0
        else:
            try:
                rec = self._local.rec
            except AttributeError:
                return
            if rec.depth:
                rec.depth -= 1

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` timed as a span."""
        token = self.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.leave(token)

    def exclude(self, seconds: float) -> None:
        """``seconds`` of the current span are counted by another part of the figure."""
        rec = getattr(self._local, "rec", None)
        if rec is not None and rec.depth and not rec.own:
            rec.excluded_ns += int(seconds * 1e9)

    def _sums(self) -> tuple[int, int, int]:
        """(ns, excluded ns, spans) of every thread so far; ended threads' records are folded
        into one total (they can no longer change)."""
        with self._lock:
            ended = self._ended
            live = []
            ns, ex, spans = ended
            for rec in self._threads:
                ns += rec.ns
                ex += rec.excluded_ns
                spans += rec.spans
                if rec.thread.is_alive():
                    live.append(rec)
                else:
                    ended[0] += rec.ns
                    ended[1] += rec.excluded_ns
                    ended[2] += rec.spans
            self._threads = live
        b = self._base
        return ns - b[0], ex - b[1], spans - b[2]

    @property
    def total_s(self) -> float:
        """The outermost spans' wall time."""
        return self._sums()[0] / 1e9

    @property
    def excluded_s(self) -> float:
        return self._sums()[1] / 1e9

    @property
    def spans(self) -> int:
        return self._sums()[2]

    @property
    def seconds(self) -> float:
        ns, ex, _spans = self._sums()
        return max(0.0, (ns - ex) / 1e9)

    def reset(self) -> None:
        """Count from now (the built-in engine: once its model is loaded)."""
        self._base = (0, 0, 0)
        self._base = self._sums()


def session_thread(t: threading.Thread, workload: tuple[str, ...] = WORKLOAD_THREADS) -> bool:
    """True for a thread the session started for its own work (its CPU time is counted as the
    threads'), False for the program's threads and the built-in engine's workload threads."""
    name = t.name
    return name.startswith(OWN_PREFIX) and not name.startswith(workload)


def thread_cpu_s(native_id: int) -> float | None:
    """CPU seconds of the thread ``native_id`` of this process (Linux: its kernel CPU clock,
    ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``), None once it has ended or elsewhere."""
    try:
        return time.clock_gettime(((~native_id) << 3) | 6)
    except (OSError, OverflowError, ValueError, AttributeError):
        return None


class SessionThreads:
    """CPU time of the session's own threads, those alive now and those that have ended since
    the first reading (each thread's last reading is kept)."""

    def __init__(self, workload: tuple[str, ...] = WORKLOAD_THREADS) -> None:
        self.workload = workload
        self._last: dict[int, tuple[threading.Thread, float]] = {}
        self._ended_s = 0.0
        self._lock = threading.Lock()
        self.available = thread_cpu_s(threading.get_native_id()) is not None

    def own(self, t: threading.Thread) -> bool:
        return session_thread(t, self.workload)

    def cpu_s(self) -> float:
        """The session's threads' CPU seconds so far."""
        with self._lock:
            live: dict[int, tuple[threading.Thread, float]] = {}
            for t in threading.enumerate():
                nid = getattr(t, "native_id", None)
                if nid is None or not self.own(t):
                    continue
                v = thread_cpu_s(nid)
                if v is not None:
                    live[id(t)] = (t, v)
            for key, (_t, v) in self._last.items():
                if key not in live:   # ended since the last reading: its last value stays
                    self._ended_s += v
            self._last = live
            return self._ended_s + sum(v for _t, v in live.values())


class StepExcess:
    """Steps' time over the untraced reference, by phase, mode and size: ``add`` each finished
    step with its side and its input positions, ``seconds`` for the excess so far. A server's
    steps grow with its batch, and a burst may fall in a busy moment: a traced step is
    compared with untraced steps of about its size (positions within a factor of two), not
    with the session's mean step."""

    SIDES = ("untraced", "traced", "edge", "rerecord")

    def __init__(self) -> None:
        # (phase, mode, size class) -> {side: [count, total ms]}
        self._by: dict[tuple[str, str, int], dict[str, list]] = {}

    def add(self, phase: str, mode: str, side: str | None, host_ms: float,
            positions: int = 1) -> None:
        if side is None:
            return
        key = (phase, mode, max(1, int(positions or 1)).bit_length())
        by = self._by.get(key)
        if by is None:
            by = self._by[key] = {s: [0, 0.0] for s in self.SIDES}
        c = by[side]
        c[0] += 1
        c[1] += host_ms

    def seconds(self, min_reference: int = 8) -> tuple[float, float, int]:
        """(tracing seconds, graph re-recording seconds, steps left out): the excess of traced
        and edge steps and of re-recording ones over the mean untraced step of their phase,
        mode and size; the steps measured attached where that class has fewer than
        ``min_reference`` untraced steps (CUPTI attached throughout) are left out. A program's
        time windows are not steps here (:meth:`windows_attached`)."""
        tracing = rerecord = 0.0
        left_out = 0
        # a copy: the program's thread may add a class while the session stops on another
        for key, by in list(self._by.items()):
            if key[0] == WINDOW:
                continue
            n_ref, ref_total = by["untraced"]
            if n_ref < min_reference:
                left_out += by["traced"][0] + by["edge"][0] + by["rerecord"][0]
                continue
            ref = ref_total / n_ref
            for side in ("traced", "edge"):
                n, total = by[side]
                tracing += total - n * ref
            n, total = by["rerecord"]
            rerecord += total - n * ref
        return max(0.0, tracing) / 1e3, max(0.0, rerecord) / 1e3, left_out

    def attached_steps(self) -> int:
        """Steps measured with CUPTI attached (traced, edge, re-recording), time windows left
        out."""
        return sum(by["traced"][0] + by["edge"][0] + by["rerecord"][0]
                   for key, by in list(self._by.items()) if key[0] != WINDOW)

    def windows_attached(self) -> int:
        """A program's time windows run with CUPTI attached. CUPTI is switched only at the
        steps of the thread that launches, never at a window (its timer thread launches
        nothing), so it stays attached through the windows of a program's start (its imports,
        its model's load) until the first marked step, and through every window of a program
        that marks none: CUPTI's work in those CUDA calls has no untraced peer to measure it
        by. Told apart from the steps': a transformers server's start-up windows were 150-300
        of its attached "steps" on an H200, and the figure then read as if most of its serving
        steps had gone uncounted."""
        return sum(by["traced"][0] + by["edge"][0] + by["rerecord"][0]
                   for key, by in list(self._by.items()) if key[0] == WINDOW)
