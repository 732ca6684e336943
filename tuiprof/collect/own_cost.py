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

# threads of the session that do the profiled work itself, not tuiprof's: the built-in engine
# decodes, loads and compiles its model on these (the workload, not its overhead)
WORKLOAD_THREADS = ("tuiprof-engine", "tuiprof-loader", "tuiprof-compile")
OWN_PREFIX = "tuiprof"


class HookClock:
    """Wall time in tuiprof's code on the profiled program's threads (thread-safe)."""

    __slots__ = ("_local", "_lock", "total_s", "excluded_s", "spans")

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.total_s = 0.0      # the outermost spans' wall time
        self.excluded_s = 0.0   # parts of those spans counted elsewhere (CUPTI switches)
        self.spans = 0

    def enter(self) -> float:
        """Open a span on this thread; returns the token for :meth:`leave` (0.0 inside a span:
        the outer one counts it)."""
        loc = self._local
        depth = getattr(loc, "depth", None)
        if depth is None:  # a thread's first span: a session thread's time is its CPU's
            depth, loc.own = 0, session_thread(threading.current_thread())
        loc.depth = depth + 1
        return 0.0 if depth or loc.own else time.perf_counter()

    def leave(self, token: float) -> None:
        """Close the span :meth:`enter` opened."""
        loc = self._local
        loc.depth = max(0, getattr(loc, "depth", 1) - 1)
        if token:
            dt = time.perf_counter() - token
            with self._lock:
                self.total_s += dt
                self.spans += 1

    def call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` timed as a span."""
        token = self.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.leave(token)

    def exclude(self, seconds: float) -> None:
        """``seconds`` of the current span are counted by another part of the figure."""
        loc = self._local
        if getattr(loc, "depth", 0) and not loc.own:
            with self._lock:
                self.excluded_s += seconds

    @property
    def seconds(self) -> float:
        return max(0.0, self.total_s - self.excluded_s)

    def reset(self) -> None:
        """Count from now (the built-in engine: once its model is loaded)."""
        with self._lock:
            self.total_s = self.excluded_s = 0.0
            self.spans = 0


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
        ``min_reference`` untraced steps (CUPTI attached throughout) are left out."""
        tracing = rerecord = 0.0
        left_out = 0
        # a copy: the program's thread may add a class while the session stops on another
        for by in list(self._by.values()):
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
        """Steps measured with CUPTI attached (traced, edge, re-recording)."""
        return sum(by["traced"][0] + by["edge"][0] + by["rerecord"][0]
                   for by in list(self._by.values()))
