"""The live profiler: wires the engine, the collectors and the store together.

``Profiler`` is the live :class:`~tuiprof.control.SessionControl`: the Textual app, the headless
CLI and the benchmarks drive a session through it. Start-up order matters: CUPTI is enabled
before the model is built, so weight loading and cache creation show up as start-up allocations.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from .collect.allocator import read_allocator_stats
from .collect.base import CollectorUnavailable
from .collect.cupti_collector import CuptiCollector, MarkerSink
from .collect.nvml_sampler import NvmlSampler
from .collect.own_cost import HookClock, SessionThreads, StepExcess
from .collect.registry import COLLECTORS, CollectorContext, CollectorSpec, factory
from .collect.device import device_facts, rank_facts
from .control import SessionControl, batch_limit_message, batch_target
from .engine.graphs import drop_cuda_graphs
from .errors import one_line, safe_text
from .sampling import (AUTO_ALLOC_EVERY, AUTO_SAMPLE_EVERY, LEAVE_SAMPLE_EVERY, STEP_TIME_SOURCES,
                       OwnCostReport, tracing_policy)
from .spec import ProfilerOptions
from .startup import LoadProgress, ProgressTracker, in_thread, phase, tracking
from .store import PROGRAM_CONFIG, SessionStore


# the overhead figure is brought up to date at most this often while steps run, and its series
# keeps that many of those moments (about 17 minutes of them)
OVERHEAD_EVERY_S = 0.25
OVERHEAD_SERIES = 4096
# where the model window goes in the arguments of a queued SessionStore.begin_token
_MODEL_ARG = 11
# token index -> store seq kept for steps whose CUDA-event time comes after they ended
_GPU_LATE = 64


class Profiler(OwnCostReport, SessionControl):
    """A live session: engine thread + CUPTI + NVML + allocator stats → store."""

    def __init__(self, store: SessionStore, options: ProfilerOptions,
                 engine_factory: Callable[..., Any] | None = None,
                 first_phase: str = "starting") -> None:
        super().__init__(store)
        self.options = options
        self.status.state = "loading"
        self.status.live = True
        engine = options.engine   # the built-in engine's run, resolved (None: a program's)
        self.status.mode = engine.mode if engine is not None else "eager"
        # Start-up phases until the first token: from the command's start, which is earlier
        # than now (imports; a session process's spawn, named by ``first_phase``).
        self.tracker = ProgressTracker(options.started_at, on_change=self._on_progress)
        self.tracker.add(first_phase, 0.0, self.tracker.progress.elapsed())
        self._prefill_seen = False
        self._may_detach = False  # CUPTI detached between bursts (allow_bursts_only)
        self._graph_guard: Callable[[], str] | None = None  # why CUPTI must stay attached
        self._captures: Callable[[], int] | None = None  # CUDA-graph captures seen so far
        # an attach for an eager prefill alone left the graphs in place: the captures seen then
        self._kept_graphs_at: int | None = None
        self._rerecord_due = False  # graphs dropped: the next compiled step records them again
        # a program's time windows before its first marked step (0: none, None: steps marked)
        self._windows_first: int | None = 0
        self._bursts_engaged = False  # CUPTI put in bursts-only mode (first switchable token)
        self._nvml_start: Any = None
        self.store.meta["step_time_sources"] = dict(STEP_TIME_SOURCES)
        if engine is not None:  # the header's first frame
            self.store.meta.update(engine.expected_meta())
        self.engine = None
        self.collectors: dict[str, Any] = {}   # name -> started Collector (registry order)
        self._factory = engine_factory
        self._loader: threading.Thread | None = None
        self._open_seq: int | None = None
        self._begun_seq: int | None = None  # the step begun last (its model window may follow)
        self._todo: deque = deque()   # (function, argument): store work queued per token
        self._overlap = False         # the engine calls token_launched: do queued work there
        self._tokens_seen = 0
        self._t_start = time.perf_counter()
        self._cpu0 = time.process_time()
        self.serve_s = 0.0            # CPU time answering a UI in another process (remote)
        self.switch_s = 0.0           # wall time attaching and detaching CUPTI (engine thread)
        # wall time in tuiprof's code on the threads that run the steps and the requests (the
        # listener's calls, the step sources' and request hooks' own work, the queued store
        # work; the CUPTI switches apart: those are switch_s)
        self.hook_clock = HookClock()
        self._threads = SessionThreads()     # the session's own threads' CPU time
        self._excess = StepExcess()          # traced and re-recording steps over untraced ones
        self._threads_base = 0.0
        self._overhead_at = 0.0
        # (unix time, cost seconds so far) at each update while steps run: the figure over any
        # window of the session (a benchmark's load, a quiet hour) is the cost's rise over the
        # time's; handed to the store when the session stops (the snapshot's overhead.series)
        self._overhead_series: deque = deque(maxlen=OVERHEAD_SERIES)
        self._open_side: tuple | None = None  # (phase, mode, side) of the step begun last
        self.done = threading.Event()
        self._stopping = False
        self._old_switch: float | None = None
        self._batch = int(engine.batch or 1) if engine is not None else 1
        self._compiling = False       # steps now run beside a background compile
        self._message_at: int | None = None  # the step seq at which the engine's line was said
        self._seq_of_index: dict[int, int] = {}  # recent steps' TokenEvent.index -> store seq

    # ------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Start collectors and load the model on a background thread; returns at once."""
        self._loader = threading.Thread(target=self._load_and_run, name="tuiprof-loader",
                                        daemon=True)
        self._loader.start()

    def start_collectors(self, device_index: int = 0, nvml_in_background: bool = False,
                         markers: MarkerSink | None = None) -> None:
        """Start the collectors of :data:`~tuiprof.collect.registry.COLLECTORS`, in table order
        (each may degrade with a one-line reason).

        ``nvml_in_background``: the rows marked ``background`` start on a thread (a session's
        start-up overlaps them with the imports); :meth:`_nvml_started` waits for them.
        ``markers``: NVTX marker records go there (``--step-range``).
        """
        for spec in COLLECTORS:
            if spec.background and nvml_in_background:
                self._nvml_start = in_thread(
                    lambda s=spec: self.start_collector(s.name, device_index, markers),
                    f"tuiprof-{spec.name}-start")
            else:
                self.start_collector(spec.name, device_index, markers)
        if self.cupti is not None and self.options.switch_interval_s:
            self._old_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.options.switch_interval_s)

    def start_collector(self, name: str, device_index: int = 0,
                        markers: MarkerSink | None = None) -> None:
        """Build and start the collector of row ``name`` (a one-line reason in the store's
        collector states if it is off or cannot run)."""
        spec = next(s for s in COLLECTORS if s.name == name)
        mode = self.status.mode
        self._start_one(spec, CollectorContext(
            self.store, self.options, self.clock, device_index, mode, markers,
            self._sample_every(mode), self._api_stay_on(mode)))

    def _start_one(self, spec: CollectorSpec, ctx: CollectorContext) -> None:
        made = factory(spec)(ctx)
        if isinstance(made, str):  # off in this session, and why
            self.store.set_collector(spec.name, False, made)
            return
        try:
            with phase(f"starting {spec.label or spec.name}"):
                made.start()
        except CollectorUnavailable as exc:
            self.store.set_collector(spec.name, False, safe_text(exc, 200))
            return
        self.collectors[spec.name] = made

    def _nvml_started(self) -> None:
        if self._nvml_start is not None:
            self._nvml_start.join()
            self._nvml_start = None

    @property
    def cupti(self) -> CuptiCollector | None:
        return self.collectors.get("cupti")

    @cupti.setter
    def cupti(self, collector: CuptiCollector | None) -> None:
        """A collector started elsewhere (benchmarks, test doubles of CUPTI), or none."""
        if collector is None:
            self.collectors.pop("cupti", None)
        else:
            self.collectors["cupti"] = collector

    @property
    def nvml(self) -> NvmlSampler | None:
        return self.collectors.get("nvml")

    def _api_stay_on(self, mode: str) -> bool:
        return mode == "compiled" and self.options.compiled_api_kinds_stay_on

    def _sample_every(self, mode: str) -> int:
        se = self.options.sample_every
        n = (AUTO_SAMPLE_EVERY.get(mode, 1) if se in ("auto", "live") else
             LEAVE_SAMPLE_EVERY.get(mode, 1) if se == "leave" else max(1, int(se)))
        self.store.meta["sample_every"] = n
        self.store.meta["tracing"] = tracing_policy(se, n)
        return n

    def clock(self) -> int:
        """The clock of token marks: CUPTI's timestamps when CUPTI runs."""
        c = self.cupti
        return c.clock() if c is not None and c.running else time.time_ns()

    def _load_and_run(self) -> None:
        try:
            with tracking(self.tracker):
                self._load()
            if self._stopping:  # stopped while loading (Ctrl-C, SIGTERM, q): never start it
                self.done.set()
                return
            self._t_start = time.perf_counter()
            self._cpu0 = time.process_time()
            self.serve_s = 0.0
            self._threads_base = self._threads.cpu_s()   # the load's threads are not the cost
            self.hook_clock.reset()
            self.engine.listener = self
            self.engine.start()
        except Exception as exc:  # one line on the status bar, never a traceback
            self.status.state = "error"
            self.status.message = one_line(exc)
            self.store.add_event("error", self.status.message)
            self.done.set()

    def _load(self) -> None:
        """Collectors, then the engine (phases reported to ``self.tracker``)."""
        self.start_collectors(self.options.device_index, nvml_in_background=True)
        self.status.state = "loading"
        factory = self._factory
        if factory is None:
            from .engine import load_engine as factory  # noqa: PLC0415
        spec = self.options.engine
        kwargs = spec.engine_kwargs() if spec is not None else {}
        self.engine = factory(clock=self.clock, **kwargs)
        self._nvml_started()
        if self._stopping:
            return
        self.store.meta.update(rank_facts())
        self.store.meta.update(self.engine.info)
        self.store.meta["mode"] = self.status.mode
        self._batch = getattr(self.engine, "batch", self._batch)
        self.store.meta["batch"] = self._batch
        if getattr(self.engine, "lockstep", False) is None:  # one rank
            self.allow_bursts_only()
        st = self.status
        st.batch = st.want_batch = self._batch
        st.max_batch = int(getattr(self.engine, "max_batch", self._batch))
        self.store.meta.update(device_facts(self.engine.info.get("device", "cpu")))
        if self.options.measure_peaks:
            from .collect.peaks import measure_peaks  # noqa: PLC0415
            small = not str(self.engine.info.get("device", "cpu")).startswith("cuda")
            with phase("measuring peaks"):
                self.store.meta["measured_peaks"] = (measure_peaks("cpu", copy_mib=64, n=512)
                                                     if small else measure_peaks("cuda"))

    def allow_bursts_only(self, graph_guard: Callable[[], str] | None = None,
                          captures: Callable[[], int] | None = None) -> bool:
        """Let CUPTI be finalized between its bursts from the next step on, if the options
        allow it and CUPTI runs (the built-in engine once loaded, on one rank; a program once
        started). ``graph_guard`` says why CUPTI must stay attached ("" when it need not): a
        program's CUDA graphs that :func:`drop_cuda_graphs` cannot drop. ``captures`` counts
        the CUDA-graph captures so far: with it, an attach for an eager prefill alone keeps
        the graphs (:meth:`_cycle_cupti`)."""
        self._graph_guard = graph_guard
        self._captures = captures
        self._may_detach = bool(self.options.detach_between_bursts and self.cupti is not None
                                and self.cupti.markers is None)
        return self._may_detach

    def _on_progress(self, progress: LoadProgress) -> None:
        self.status.progress = progress
        if progress.facts:  # the device and dtype picked: the header shows them at once
            self.store.meta.update(progress.facts)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop generation, flush and finalise CUPTI, stop NVML. Safe to call twice; a second
        call waits at most half a second for an engine that the first could not join (a
        tensor-parallel rank whose peer died waits in a collective until it times out)."""
        if self.done.is_set() and self._stopping:
            timeout = min(timeout, 0.5)
        self._stopping = True
        if self._loader is not None and self._loader.is_alive():
            self._loader.join(timeout)
        nvml_start = self._nvml_start
        if nvml_start is not None:
            nvml_start.join(timeout)
        eng = self.engine
        if eng is not None:
            try:
                eng.stop()
                if eng.join(timeout):
                    self._catch_up()  # the engine thread is gone: nothing else touches _todo
            except Exception:
                pass
        try:
            for c in list(self.collectors.values()):  # table order: CUPTI's flush first
                try:
                    c.stop()
                except Exception:
                    pass
        finally:
            self._update_overhead(final=True)
            self.collectors.clear()
        if self._old_switch is not None:
            sys.setswitchinterval(self._old_switch)
            self._old_switch = None
        if self.status.state not in ("error",):
            self.status.state = "stopped"
        self.done.set()

    @property
    def busy(self) -> bool:
        """True while the loader, the engine thread or a compile worker still runs after
        :meth:`stop`: a model load or a ``torch.compile`` cannot be interrupted, only waited
        for (or abandoned)."""
        eng = self.engine
        return bool((self._loader is not None and self._loader.is_alive())
                    or (eng is not None and getattr(eng, "busy", getattr(eng, "alive", False))))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until generation finishes (done, stopped or error)."""
        return self.done.wait(timeout)

    # ------------------------------------------------------------------- keys
    def toggle_mode(self) -> str:
        eng = self.engine
        if eng is None:
            return "model still loading"
        target = "compiled" if self.status.mode == "eager" else "eager"
        eng.request_mode(target)
        return f"switching to {target} at the next token"

    def change_batch(self, up: bool) -> str:
        eng = self.engine
        if eng is None:
            return "model still loading"
        st = self.status
        st.want_batch = eng.want_batch
        want = batch_target(st, up)
        if want is None:
            return batch_limit_message(st, up)
        st.want_batch = want
        return eng.request_batch(want)

    def toggle_pause(self) -> str:
        eng = self.engine
        if eng is None:
            return "model still loading"
        if self.status.state == "paused":
            eng.resume()
            return "resumed"
        eng.pause()
        return "pausing at the next token"

    # -------------------------------------------------------- engine listener
    # Only what must precede a step's launch happens in token_started (the sampling switch);
    # the store's bookkeeping for a token is queued and done in token_launched, while the device
    # computes the next step, so it is off the decode loop's critical path (docs/performance.md).
    # Until an engine has called token_launched, queued work is done at once.
    def token_started(self, phase: str, mode: str, step: int, cycle: int, start_ns: int,
                      batch: int | None = None, positions: int = 1, host: bool = True) -> None:
        t0 = self.hook_clock.enter()
        try:
            self._token_started(phase, mode, step, cycle, start_ns, batch, positions, host)
        finally:
            self.hook_clock.leave(t0)

    def _token_started(self, phase: str, mode: str, step: int, cycle: int, start_ns: int,
                       batch: int | None = None, positions: int = 1, host: bool = True) -> None:
        if self._windows_first is not None:
            self._first_steps(phase)
        c = self.collectors.get("cupti")  # the property, once a step
        if phase == "decode" and mode != self.status.mode:
            self._catch_up()
            self.status.mode = mode
            self.store.meta["mode"] = mode
            self.store.add_event("mode", f"mode: {mode}", start_ns)
            if c is not None:
                c.sample_every = self._sample_every(mode)
                # compiled: the API kinds stay on between bursts (CuptiCollector._set_api_records)
                # or come on a token before each; never together with the device kinds
                c.api_kinds_stay_on = self._api_stay_on(mode)
                c.api_lead = mode == "compiled"
                # every compiled step's device span
                c.graph_trace = self.options.graphs and mode == "compiled"
                c.restart_sampling(self.store.next_seq())
                c.announce()
        # next_seq() is this token's: the previous token was begun in its token_launched
        rerecord = False
        native = None if c is not None else getattr(self.collectors.get("native"), "traced_at",
                                                    None)
        if native is not None:  # a native binary: traced when the step began in a burst
            sampled = native(start_ns)
        elif c is None:
            sampled = not self._compiling
        elif self._compiling:
            sampled = c.quiet_token()
        else:
            seq = self.store.next_seq()
            if self._may_detach and host:  # CUPTI switches on the thread that launches
                dropped = self._cycle_cupti(seq, phase == "prefill", mode == "eager")
                if dropped is not None:  # the step begins after the switch
                    start_ns = max(start_ns, c.clock())
                    self._rerecord_due |= dropped > 0
                # the first compiled step after a drop records the graphs again (a prefill
                # is eager: it replays none)
                if self._rerecord_due and phase == "decode" and mode == "compiled":
                    rerecord, self._rerecord_due = True, False
            sampled = c.on_token_start(seq, prefill=phase == "prefill")
        if batch is None:  # the engine: its configured batch is the step's configuration
            batch, config = self._batch, self._batch
        else:  # a program: its batch may change step by step, so one configuration for all
            config = PROGRAM_CONFIG
        attached = c.attached if c is not None else (sampled if native is not None else False)
        self._todo.append((self._begin, (phase, mode, start_ns, step, cycle, sampled, batch,
                                         config, self._compiling, positions, rerecord, None,
                                         attached)))
        if not self._overlap:
            self._catch_up()

    def _first_steps(self, phase: str) -> None:
        """Count a program's time windows until its first marked step, where the sampling
        period starts again: the ranks of one job then trace the same steps (the TP analysis
        compares ranks over steps traced on every rank, matched by cycle and step), however
        long each rank's start-up ran in windows."""
        if phase == "window":
            self._windows_first += 1
            return
        had, self._windows_first = self._windows_first, None
        if had and self.cupti is not None:
            self.cupti.restart_sampling(self.store.next_seq())

    def _cycle_cupti(self, seq: int, prefill: bool, eager: bool = False) -> int | None:
        """Attach or detach CUPTI before token ``seq`` (engine thread, at a boundary); returns
        how many CUDA graphs were dropped (the step records them again), None if nothing
        switched. The graphs are dropped after an attach and before a detach: graphs CUPTI saw
        must not be replayed once it is finalized, and a burst's graphs are recorded under it
        (docs/performance.md#cupti-and-cuda-graphs). Nothing switches while a compile runs beside decoding
        (its steps are quiet anyway).

        An attach for a due prefill alone, outside a burst, when the prefill is ``eager`` and
        the captures are counted, keeps the graphs: an eager step replays none, so CUPTI sees
        none before it is finalized at the next step, unless a capture happened meanwhile
        (then they are dropped before the detach as usual). If CUPTI stays attached into a
        step that is not an eager prefill (a burst's window begins next), the kept graphs are
        dropped before that step, as at a burst's attach. This saves the two recordings of the
        graphs a due prefill's switches cost a compiled program once a period."""
        c = self.cupti
        if self._compiling:
            return None
        why = self._graph_guard() if self._graph_guard is not None else ""
        if why:
            return self._stay_attached(why)
        if not self._bursts_engaged:  # once: a refused attach turns bursts_only off for good
            self._bursts_engaged = c.bursts_only = True
            c.announce()
        want = c.attach_wanted(seq, prefill)
        if want is None:
            if self._kept_graphs_at is None or (prefill and eager):
                return None
            # attached on into a step that may replay the kept graphs (a burst's window
            # begins right after the prefill): they go now, as at a burst's attach
            t0 = time.perf_counter()
            self._kept_graphs_at = None
            dropped = drop_cuda_graphs()
            self._switched(time.perf_counter() - t0)
            return dropped
        t0 = time.perf_counter()
        count = self._captures
        if want:
            dropped = 0
            if c.attach():
                if prefill and eager and count is not None and not c.in_burst_window(seq):
                    self._kept_graphs_at = count()
                else:
                    self._kept_graphs_at = None
                    dropped = drop_cuda_graphs()
        else:
            kept, self._kept_graphs_at = self._kept_graphs_at, None
            dropped = 0 if kept is not None and count() == kept else drop_cuda_graphs()
            _sync_device()  # CUPTI's finalize wants the device idle (a program's loop may not be)
            c.detach()
        self._switched(time.perf_counter() - t0)
        return dropped

    def _switched(self, seconds: float) -> None:
        """A CUPTI switch took ``seconds`` (counted as switches, not as hooks)."""
        self.switch_s += seconds
        self.hook_clock.exclude(seconds)

    @property
    def hooks_s(self) -> float:
        """Wall time in tuiprof's code on the threads that run the steps and requests."""
        return self.hook_clock.seconds

    def _stay_attached(self, why: str) -> int | None:
        """CUPTI attached for good from this step: graphs exist that no drop can remove, and
        a finalize under them would kill their next replay."""
        c = self.cupti
        self._may_detach = False
        c.bursts_only = False
        t0 = time.perf_counter()
        ok = c.attached or c.attach()
        self._switched(time.perf_counter() - t0)
        if not ok:  # refused: attach() said why on the status line; the session goes on
            return None
        c.announce()
        self.store.add_event("cupti", f"CUPTI stays attached: {why}")
        return 0

    def configuration_changed(self, batch: int, compiling: bool) -> None:
        """The engine's next steps run at ``batch``, beside a compile or not (engine thread,
        at a boundary)."""
        self._catch_up()
        if batch != self._batch:
            self._batch = batch
            self.status.batch = batch
            self.store.meta["batch"] = batch
            self.store.add_event("batch", f"batch: {batch}")
            text = f"now decoding {batch} sequence{'s' if batch > 1 else ''} per step"
            # a compile for this batch ends at the same boundary and says so just before
            # ("compiled in 8.5 s (dynamo …)"): that line stays, after the batch's
            if self.status.message and self._message_at == self.store.next_seq():
                text = f"{text} · {self.status.message}"
            self.status.message = text
            if self.cupti is not None:  # trace the new configuration's kernels soon
                self.cupti.restart_sampling(self.store.next_seq())
        if compiling != self._compiling:
            self._compiling = compiling
            if not compiling and self.cupti is not None:
                self.cupti.restart_sampling(self.store.next_seq())
        eng = self.engine
        if eng is not None:
            self.status.want_batch = eng.want_batch

    def unspanned_hooks(self) -> "_Unspanned":
        """The step hooks without their own spans of :attr:`hook_clock`, for a caller that calls
        them inside a span of that clock (``StepRecorder``): the outer span counts them, and
        nested spans would cost a step several calls for nothing."""
        return _Unspanned(self._token_started, self._token_launched, self._token_finished)

    def token_launched(self, model_ns: tuple[int, int] | None = None) -> None:
        t0 = self.hook_clock.enter()
        try:
            self._token_launched(model_ns)
        finally:
            self.hook_clock.leave(t0)

    def _token_launched(self, model_ns: tuple[int, int] | None) -> None:
        self._overlap = self.options.overlap
        if model_ns is not None:  # the model window belongs to the step begun last
            todo = self._todo
            for i in range(len(todo) - 1, -1, -1):
                fn, args = todo[i]
                if fn == self._begin:
                    todo[i] = (fn, args[:_MODEL_ARG] + (model_ns,) + args[_MODEL_ARG + 1:])
                    break
            else:  # that step is in the store already
                todo.append((self._model_window, model_ns))
        self._catch_up()

    def step_requests(self, info: dict) -> None:
        """The requests of the step begun last (a server's; ``StepRecorder.step_requests``):
        stored with that step's other queued work, in order."""
        self._todo.append((self._step_requests, info))
        if not self._overlap:
            self._catch_up()

    def _step_requests(self, info: dict) -> None:
        if self._begun_seq is not None:
            self.store.set_step_requests(self._begun_seq, **info)

    def token_finished(self, ev) -> None:
        t0 = self.hook_clock.enter()
        try:
            self._token_finished(ev)
        finally:
            self.hook_clock.leave(t0)

    def _token_finished(self, ev) -> None:
        self._tokens_seen += 1
        every = self.options.alloc_every
        if every == "auto":  # torch.cuda.memory_stats() costs a few % of a 3 ms compiled token
            every = AUTO_ALLOC_EVERY.get(ev.mode, 1)
        # read now, before the next step allocates; stored with the rest of the token's work
        stats = read_allocator_stats() if every and self._tokens_seen % every == 0 else None
        self._todo.append((self._finish, (ev, stats)))
        if not self._overlap:
            self._catch_up()

    def _catch_up(self) -> None:
        """Do the queued store work of finished and started tokens, in order."""
        todo = self._todo
        while todo:
            fn, arg = todo.popleft()
            fn(arg)

    def _begin(self, args: tuple) -> None:
        self._open_seq = self._begun_seq = self.store.begin_token(*args)
        phase, mode, sampled, compiling, positions, rerecord, attached = (
            args[0], args[1], args[5], args[8], args[9], args[10], args[12])
        side = (None if compiling else "rerecord" if rerecord else
                "untraced" if not attached else "traced" if sampled else "edge")
        self._open_side = (phase, mode, side, positions)

    def _model_window(self, window: tuple[int, int]) -> None:
        if self._begun_seq is not None:
            self.store.set_model_window(self._begun_seq, window[0], window[1])

    def token_gpu_time(self, index: int, gpu_ms: float) -> None:
        """The CUDA-event time of the step ``TokenEvent.index``, read after the step ended (a
        program's steps: their events are polled, never waited for). Stored with the queued
        work, after that step's own."""
        self._todo.append((self._late_gpu, (index, gpu_ms)))
        if not self._overlap:
            self._catch_up()

    def _late_gpu(self, item: tuple) -> None:
        seq = self._seq_of_index.get(item[0])
        if seq is not None:
            self.store.set_token_gpu(seq, item[1])

    def _finish(self, item: tuple) -> None:
        ev, stats = item
        seq = self._open_seq
        if seq is None:
            return
        store = self.store
        late = self._seq_of_index
        late[ev.index] = seq
        if len(late) > _GPU_LATE:
            del late[next(iter(late))]
        store.end_token(seq, ev.end_ns, ev.host_ms, ev.gpu_ms, ev.token_id)
        self._open_seq = None
        side, self._open_side = self._open_side, None
        if side is not None:
            self._excess.add(side[0], side[1], side[2], ev.host_ms, side[3])
        if stats is not None:
            store.set_token_alloc(seq, stats)
        if self._tokens_seen % 8 == 0:
            now = time.perf_counter()
            if now - self._overhead_at >= OVERHEAD_EVERY_S:
                self._update_overhead(now)

    def state_changed(self, state: str, message: str = "") -> None:
        self._catch_up()  # the engine thread, at a boundary: every token so far is stored
        if self.tracker.progress.first_token_s is None:
            self._startup_state(state)
        st = self.status
        if state == "compiling":
            if st.compiling_since is None:
                st.compiling_since = time.monotonic()
        elif state not in ("paused", "prefill"):  # a looping engine's prefill beside a compile
            st.compiling_since = None             # does not end it: the count goes on
        eng = self.engine
        if eng is not None:
            st.want_batch = getattr(eng, "want_batch", st.want_batch)
        st.state = state
        if message:
            st.message = message
            self._message_at = self.store.next_seq()
            if state == "error" or message.startswith(("compile failed", "out of memory")):
                self.store.add_event("error", message)
        if state in ("done", "stopped", "error"):
            self._update_overhead()
            self.done.set()

    def _startup_state(self, state: str) -> None:
        """The first prefill is the last start-up phase; the first decode state follows its
        token. The breakdown then goes into the metadata (snapshots, exports)."""
        if state == "prefill" and not self._prefill_seen:
            self._prefill_seen = True
            self.tracker.begin("prefill")
        elif state == "decode" and self._prefill_seen:
            self.tracker.first_token()
            self.store.meta["startup"] = self.tracker.progress.as_dict()
        elif state == "error":
            self.tracker.end("prefill")


class _Unspanned:
    """A listener's step hooks as :meth:`Profiler.unspanned_hooks` hands them out."""

    __slots__ = ("token_started", "token_launched", "token_finished")

    def __init__(self, started: Callable, launched: Callable, finished: Callable) -> None:
        self.token_started, self.token_launched, self.token_finished = started, launched, finished


def _sync_device() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
