"""One place where a program's steps are opened and closed, whichever source marks them.

Sources, by precedence (the order of :data:`tuiprof.program.registry.STEP_SOURCES`):

1. ``transformers``: the forward calls of ``generate()`` and of continuous batching;
2. ``api``: :func:`tuiprof.step` / :func:`tuiprof.mark_prefill` in the program's own loop;
3. ``nvtx``: NVTX ranges named with ``--step-range`` (CUPTI marker records);
4. ``auto``: a native program's decode loop, found in its kernel stream (``stream_steps``);
5. ``windows``: fixed time windows while no other source has marked a step.

One step is open at a time. A source never interrupts a step of a higher-precedence source,
and while a ``generate()`` runs (a *scope*), marks of lower-precedence sources are ignored and
counted in ``nested``: a ``tuiprof.step`` around or inside ``generate()`` never counts a token
twice. A higher-precedence step that begins ends the open lower-precedence one at that instant.

Each step reaches the listener as ``token_started`` … ``token_finished``, exactly like a token
of the built-in engine, so the store, the collectors' sampling and every pane treat it alike.
A source that sees the moment a step's device work has been queued (transformers: the logits
processors run after the forward is launched, before the step's sync) calls :meth:`launched`,
the engine's ``token_launched``: the store's bookkeeping for the boundary is done there, while
the device computes, instead of on the program's critical path. A step without that moment
has its bookkeeping done at its end, as before.

A source that sees where the model's forward begins and ends inside a step (transformers:
``prepare_inputs_for_generation`` returning, ``_update_model_kwargs_for_generation`` called)
calls :meth:`model_begins` and :meth:`model_ends`: the listener gets that host window with
``token_launched`` and the store splits the step's kernels into the model's and the loop's.

Every step of a source on the program's own threads (transformers, api) gets its GPU time from
a pair of CUDA events (:mod:`.step_gpu_time`): the first recorded when the step begins, the second
when its source says that the step's device work is all queued (:meth:`device_done`) or when
it ends; they are read at a later step boundary, never waited for, and reach the listener as
``token_gpu_time(index, ms)``.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..collect.own_cost import HookClock
from ..engine.events import EngineListener, TokenEvent
from .step_gpu_time import StepTimer

from .registry import HOST as HOST_SOURCES, NAMES as SOURCES  # precedence order
from ..phases import DECODE, PREFILL, WINDOW  # noqa: F401

_RANK = {s: i for i, s in enumerate(SOURCES)}  # a source's precedence, 0 the highest


@dataclass(slots=True)
class _Open:
    source: str
    phase: str
    mode: str
    start_ns: int
    step: int
    cycle: int
    launched: bool = False  # its device work was reported queued (listener.token_launched)
    model_start: int = 0    # the host window of its model forward (0: not marked)
    model_end: int = 0
    gpu: list | None = None  # its CUDA-event pair (StepTimer.start), None: not timed

    def model_window(self, end_ns: int) -> tuple[int, int] | None:
        """(start, end) of its model forward; a forward still open ends at ``end_ns``."""
        if not self.model_start:
            return None
        return self.model_start, self.model_end or max(end_ns, self.model_start)


class StepRecorder:
    """Serialises step boundaries from every source into listener calls (thread-safe)."""

    def __init__(self, listener: EngineListener, clock: Callable[[], int] = time.perf_counter_ns,
                 sources: tuple[str, ...] = SOURCES, timer: StepTimer | None = None) -> None:
        self.listener = listener
        # tuiprof's time on the program's threads: the session's overhead counts it (the
        # listener's own, nested in these, once)
        self.hooks: HookClock = getattr(listener, "hook_clock", None) or HookClock()
        # inside this recorder's spans the listener's step hooks need no spans of their own
        # (they would only nest): a listener that shares the clock hands over its hooks
        # without them, and a step pays one clock read at each of its two boundaries
        inner = getattr(listener, "unspanned_hooks", None)
        self._in = (inner() if inner is not None and self.hooks is getattr(
            listener, "hook_clock", None) else listener)
        self.timer = timer if timer is not None else StepTimer()
        self._gpu_sink = getattr(listener, "token_gpu_time", None)
        self.clock = clock
        self.enabled = frozenset(sources)
        self.counts = {s: 0 for s in SOURCES}   # steps recorded per source
        self.nested = 0                         # marks ignored (a higher source held the step)
        # where this process's steps run instead, when another process runs them (vLLM's API
        # server: its engine core's): windows stop, and no finding asks to mark steps here
        self.elsewhere = ""
        self._lock = threading.RLock()
        self._open: _Open | None = None
        self._scopes = {s: 0 for s in SOURCES}
        self._cycle = -1
        self._step = -1
        self._fresh = False   # a cycle just began (a scope): its prefill starts no new one
        self._tokens = 0
        self._state = ""
        self._resume = threading.Event()
        self._resume.set()

    # ------------------------------------------------------------------ sources
    @property
    def marked(self) -> bool:
        """True once a source other than the windows has recorded a step."""
        return any(n for s, n in self.counts.items() if s != "windows")

    def steps_elsewhere(self, where: str) -> None:
        """This process runs no steps of its own: ``where`` does (windows end)."""
        self.elsewhere = where

    @property
    def source(self) -> str | None:
        """The highest-precedence source that recorded steps (the snapshot's step source)."""
        return next((s for s in SOURCES if self.counts[s]), None)

    def enter_scope(self, source: str) -> None:
        """A region where ``source`` marks every step (``generate()``); starts a new cycle."""
        with self._lock:
            self._scopes[source] += 1
            self._new_cycle()

    def exit_scope(self, source: str) -> None:
        """Leave a scope: its last step ends now."""
        with self._lock:
            self._scopes[source] = max(0, self._scopes[source] - 1)
            if not self._scopes[source]:
                self.end(source)

    def _held_above(self, rank: int) -> bool:
        if any(self._scopes[s] for s in SOURCES[:rank]):
            return True
        op = self._open
        return op is not None and SOURCES.index(op.source) < rank

    # ----------------------------------------------------------------- steps
    def begin(self, source: str, phase: str, *, batch: int = 1, positions: int = 1,
              mode: str = "eager", start_ns: int | None = None) -> _Open | None:
        """Open a step at ``start_ns`` (default: now), ending the open one there. Returns the
        step, or None when a higher-precedence source holds it or ``source`` is not enabled."""
        if source not in self.enabled:
            return None
        if not self._resume.is_set() and source in HOST_SOURCES:
            self._wait_resumed(source)
        t0 = self.hooks.enter()
        try:
            return self._begin(source, phase, batch, positions, mode, start_ns)
        finally:
            self.hooks.leave(t0)

    def _begin(self, source: str, phase: str, batch: int, positions: int, mode: str,
               start_ns: int | None) -> _Open | None:
        with self._lock:
            rank = _RANK[source]
            if rank and self._held_above(rank):
                self.nested += 1
                return None
            t = self.clock() if start_ns is None else start_ns
            prev = self._open
            prev_unlaunched = prev is None or not prev.launched
            if prev is not None:
                self._finish(t)
                if not prev.launched:  # no busy-device moment: its bookkeeping is done at its end
                    self._in.token_launched(prev.model_window(t))
            if phase == PREFILL:
                if not self._fresh:
                    self._new_cycle()
            else:
                self._step += 1
            self._fresh = False
            step = -1 if phase == PREFILL else self._step
            op = self._open = _Open(source, phase, mode, t, step, max(0, self._cycle))
            self.counts[source] += 1
            host = source in HOST_SOURCES
            self._in.token_started(phase, mode, step, max(0, self._cycle), t,
                                        batch=max(0, int(batch)),
                                        positions=max(0, int(positions)), host=host)
            if host:  # after token_started, as in the engine: a CUPTI switch there is not the step's
                op.gpu = self.timer.start()
                if prev_unlaunched:  # else read at launched, while the device computes
                    self._read_gpu_times()
            if phase != self._state:
                self._state = phase
                self.listener.state_changed(phase)
            return self._open

    def launched(self, source: str) -> None:
        """The open step's device work is queued (``source`` opened it): the listener does the
        bookkeeping queued at its boundary now, while the device computes."""
        t0 = self.hooks.enter()
        try:
            self._launched(source)
        finally:
            self.hooks.leave(t0)

    def _launched(self, source: str) -> None:
        with self._lock:
            op = self._open
            if op is not None and op.source == source and not op.launched:
                op.launched = True
                self._in.token_launched(op.model_window(self.clock()) if op.model_start
                                        else None)
                self._read_gpu_times()  # the steps before, off the step's critical path

    def device_done(self, source: str) -> None:
        """The open step's device work is all queued (``source`` opened it), before the loop
        waits for it: the step's second CUDA event is recorded now rather than at its end."""
        t0 = self.hooks.enter()
        try:
            with self._lock:
                op = self._open
                if op is not None and op.source == source:
                    self.timer.stop(op.gpu)
        finally:
            self.hooks.leave(t0)

    def step_requests(self, step: _Open | None, info: dict) -> None:
        """The requests ``step`` (the open step, as :meth:`begin` returned it) advances, its
        prompt and decode tokens, the requests waiting and running, KV-cache blocks
        (``SessionStore.set_step_requests``'s arguments): for a listener that keeps them."""
        if step is None or self._open is not step:
            return
        fn = getattr(self.listener, "step_requests", None)
        if fn is not None:
            self.hooks.call(fn, info)

    def model_begins(self, step: _Open | None) -> None:
        """The model's forward of ``step`` (the open step, as :meth:`begin` returned it) starts
        launching now (called on the program's thread, right before the forward)."""
        if step is not None and self._open is step and not step.model_start:
            step.model_start = self.clock()

    def model_ends(self, source: str) -> None:
        """The open step's model forward (``source`` opened it) has returned."""
        op = self._open
        if op is not None and op.source == source and op.model_start and not op.model_end:
            op.model_end = self.clock()

    def end(self, source: str, end_ns: int | None = None, step: _Open | None = None) -> None:
        """End the open step if ``source`` opened it (and it is ``step``, when given)."""
        t0 = self.hooks.enter()
        try:
            self._end(source, end_ns, step)
        finally:
            self.hooks.leave(t0)

    def _end(self, source: str, end_ns: int | None, step: _Open | None) -> None:
        with self._lock:
            op = self._open
            if op is not None and op.source == source and (step is None or op is step):
                t = self.clock() if end_ns is None else end_ns
                self._finish(t)
                # no next step to wait for: store it now
                self._in.token_launched(None if op.launched else op.model_window(t))

    def close(self) -> None:
        """End whatever step is open (the program ended) and read the last steps' GPU times
        (waiting for them is harmless now)."""
        t0 = self.hooks.enter()
        try:
            self._close()
        finally:
            self.hooks.leave(t0)

    def _close(self) -> None:
        with self._lock:
            op, window = self._open, None
            if op is not None:
                t = self.clock()
                self._finish(t)
                window = None if op.launched else op.model_window(t)
            self._read_gpu_times(wait=True)
            self._in.token_launched(window)

    def _finish(self, t: int) -> None:
        op = self._open
        self._open = None
        t = max(t, op.start_ns)
        if op.gpu is not None:
            self.timer.finished(self._tokens, op.gpu)
        self._in.token_finished(TokenEvent(
            self._tokens, op.step, op.phase, op.mode, None, op.start_ns, t,
            (t - op.start_ns) / 1e6, None, op.cycle))
        self._tokens += 1

    def _read_gpu_times(self, wait: bool = False) -> None:
        """Hand the GPU times of ended steps whose events have completed to the listener."""
        sink = self._gpu_sink
        for index, ms in self.timer.poll(wait):
            if sink is not None:
                sink(index, ms)

    def _new_cycle(self) -> None:
        self._cycle += 1
        self._step = -1
        self._fresh = True

    # ------------------------------------------------------------------ pause
    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    def pause(self) -> None:
        """Hold the program at its next step boundary (transformers and api sources)."""
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def _wait_resumed(self, source: str) -> None:
        t0 = self.hooks.enter()
        try:
            with self._lock:
                op = self._open
                if op is not None and op.source == source:
                    t = self.clock()
                    self._finish(t)
                    self._in.token_launched(None if op.launched else op.model_window(t))
                self._state = "paused"
                self.listener.state_changed("paused")
        finally:
            self.hooks.leave(t0)
        # short waits: a signal (Ctrl-C) still reaches a program paused on its main thread
        while not self._resume.wait(0.1):
            pass

    # ----------------------------------------------------------- tuiprof.step
    def api_step(self, name: str, tokens: int = 1, now: bool = False) -> "_ApiStep":
        """The object ``tuiprof.step`` returns under a session (see :mod:`tuiprof.marks`)."""
        s = _ApiStep(self, PREFILL if name == PREFILL else DECODE, tokens)
        if now:
            s.__enter__()
        return s


class _ApiStep:
    """``with tuiprof.step(...)``: a step from ``__enter__`` to ``__exit__``."""

    __slots__ = ("rec", "phase", "tokens", "began", "step")

    def __init__(self, rec: StepRecorder, phase: str, tokens: int) -> None:
        self.rec, self.phase, self.tokens = rec, phase, tokens
        self.began, self.step = False, None

    def __enter__(self) -> None:
        if not self.began:
            self.began = True
            self.step = self.rec.begin("api", self.phase, batch=self.tokens,
                                       positions=self.tokens, mode=compiled_or_eager())
        return None

    def __exit__(self, *exc: object) -> None:
        if self.step is not None:
            self.rec.end("api", step=self.step)
            self.step = None
        return None


def compiled_or_eager() -> str:
    """``compiled`` once torch.compile has produced a graph in this process, else ``eager``
    (the best a step source that does not see the model can say)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return "eager"
    try:
        return "compiled" if dynamo.counters["stats"]["unique_graphs"] else "eager"
    except Exception:
        return "eager"
