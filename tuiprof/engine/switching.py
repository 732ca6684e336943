"""The engine's configuration: a mode (eager or compiled) and a batch, switched at token
boundaries, and the compiles a compiled configuration needs.

:class:`Switching` is the part of :class:`~tuiprof.engine.generate.Engine` its loop calls at a
boundary: ``_commands`` (or ``_agree``, every rank's one answer under a
:class:`~tuiprof.engine.lockstep.Lockstep`) applies what was asked (pause, stop, a mode, a
batch). It keeps no state of its own: it works on the engine's (the live configuration, the
one it falls back to, the wishes and the compile job, under the engine's condition).

A compile runs on a worker thread while the current configuration keeps decoding (its tokens
marked ``compiling``); the switch happens at the first boundary after it finished. It may be
done first by a helper process (:mod:`tuiprof.engine.compile_helper`) that fills inductor's
cache while this process goes on decoding without sharing its interpreter with inductor; the
compile here then finds every graph and kernel in the cache. ``compile_cache`` prepares the
persistent cache directory (:mod:`tuiprof.engine.compile_cache`) before this process's first
compile.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from ..errors import one_line
from ..phases import COMPILED, DECODE, EAGER
from .compile_support import (COMPILE_SWITCH_INTERVAL_S, CompiledStep, _CompileJob,
                              _cache_counters, _compile_times, _inductor_gate, _no_cudagraphs,
                              _Once, _own_cudagraph_trees, _release_memory, _took,
                              _warm_foreground, compile_overlap)
from .lockstep import PAUSE_POLL_S
from .memory import is_oom, memory_figures
from .precompiled import graph_of, mode_options


def extend_prompt(prompt: torch.Tensor, batch: int, vocab_size: int, seed: int) -> torch.Tensor:
    """``[batch, T]`` prompts: the rows of ``prompt`` first, then random ids, a generator seeded
    from (``seed``, row) per row, so that row ``i`` is the same at every batch size."""
    rows, t = prompt.shape
    if batch <= rows:
        return prompt[:batch]
    extra = [torch.randint(0, vocab_size, (1, t), generator=torch.Generator().manual_seed(
        seed * 1_000_003 + i)) for i in range(rows, batch)]
    return torch.cat([prompt, torch.cat(extra).to(prompt.device)])


@dataclass
class _Live:
    """The decode state of one batch configuration: its cache, inputs and step function."""

    batch: int
    cache: Any
    prompt: torch.Tensor            # [batch, T]
    tok: torch.Tensor               # [batch, 1], the next input
    pos: torch.Tensor               # [1], its position
    mode: str = EAGER
    fn: Callable | None = None      # fn(tok, pos, cache[, masks]) -> logits [batch, V]
    cudagraphs: bool = False
    position: int = 0               # host copy of ``pos``
    masks: Any = None               # the adapter's ``decode_masks`` (None: the forward's own)

    def step_args(self) -> tuple:
        """The step's arguments, its masks made for ``pos`` first (outside the forward)."""
        if self.masks is None:
            return self.tok, self.pos, self.cache
        return self.tok, self.pos, self.cache, self.masks.at(self.pos, self.position)


class Switching:
    """Mode, batch and compile management of an :class:`~tuiprof.engine.generate.Engine`, on
    its thread at token boundaries (the compile itself on a worker)."""

    # ------------------------------------------------------------ switching
    def _commands(self, can_switch: bool) -> str | bool:
        """Apply pending commands at a token boundary.

        Between decode steps (``can_switch``) answers "go", "stop" or "restart" (a new batch
        needs its prefill); before a prefill answers whether to go on. Switches happen only
        between decode steps, where the step inputs and the cache are live.
        """
        with self._cond:
            if self._stop:
                return "stop" if can_switch else False
            if self._paused:
                resume_state = self.state
                self._set_state("paused")
                while self._paused and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return "stop" if can_switch else False
                self._set_state(resume_state)
            want = (self._want_mode, self._want_batch)
            job = self._job
            waiting = job is not None and not job.done.is_set()
            self._pending = waiting or (want != (self.mode, self.batch))
            if not can_switch:
                return True
        live = self._live
        if job is not None and job.helper_note and not job.noted and (
                job.helper_done.is_set() or job.helper is None):
            job.noted = True
            self._note(job.helper_note)
        if job is not None and job.done.is_set():
            self._job = None
            self._finish_job(job)
            with self._cond:
                want = (self._want_mode, self._want_batch)
                self._pending = want != (self.mode, self.batch)
        if not waiting and want != (self.mode, self.batch):
            self._switch(*want)
        if self._stop:
            return "stop"
        return "restart" if self._live is not live else "go"

    def _agree(self, can_switch: bool) -> str | bool:
        """Lockstep boundary: apply rank 0's commands on every rank (as :meth:`_commands`
        answers: "go"/"stop" between decode steps, whether to go on before a prefill).

        Rank 0 reads its own wishes; the other ranks' local wishes are ignored (keys reach
        rank 0). While paused, rank 0 repeats the agreement every ``PAUSE_POLL_S`` (sooner on a
        key) and the other ranks wait in it."""
        lock = self.lockstep
        with self._cond:
            local = (self._want_mode, self._paused, self._stop)
        want, paused, stop = lock.agree(*local)
        if paused and not stop:
            resume_state = self.state
            self._set_state("paused")
            while paused and not stop:
                with self._cond:
                    if lock.rank == 0 and (self._want_mode, self._paused, self._stop) == local:
                        self._cond.wait(PAUSE_POLL_S)
                    local = (self._want_mode, self._paused, self._stop)
                want, paused, stop = lock.agree(*local)
            if not stop:
                self._set_state(resume_state)
        if stop:
            return "stop" if can_switch else False
        if not can_switch:
            return True
        if want != self.mode:
            with self._cond:
                self._want_mode = want  # the agreed mode, whatever this rank's keys said
            self._switch(want, self.batch)
            lock.set_mode(self.mode)
        return "go"

    def _switch(self, mode: str, batch: int) -> None:
        """Begin or make the switch to (``mode``, ``batch``) on the engine thread."""
        live = self._live
        step = None
        if mode == COMPILED:
            try:
                step = self._compiled_step()
            except Exception as exc:  # torch.compile itself refused
                self._compile_failed(exc)
                return
        if batch == live.batch:
            if mode == EAGER:
                live.fn, live.cudagraphs, live.mode = self.adapter.decode, False, EAGER
                self.mode = EAGER
            elif batch in step.batches:
                self._compiled_now(live)
            else:
                self._start_compile(batch, None)
            return
        try:
            cache = self.adapter.new_cache(batch)
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._refuse_batch(batch, exc)
            return
        if step is not None and batch not in step.batches:
            self._start_compile(batch, cache)
            return
        self._begin_batch(batch, mode, cache)

    def _begin_batch(self, batch: int, mode: str, cache: Any) -> None:
        """Make ``batch`` the live configuration; its prefill starts the next cycle. The old one
        is kept until the new one has decoded a step, to fall back to if it runs out."""
        old = self._live
        prompt = extend_prompt(self.prompt_ids, batch, self.adapter.vocab_size, self.seed)
        new = _Live(batch, cache, prompt, torch.zeros((batch, 1), dtype=torch.long, device=self.device),
                    torch.zeros(1, dtype=torch.long, device=self.device), mode,
                    self.adapter.decode if mode == EAGER else None,
                    masks=self._decode_masks(cache, batch))
        self._fallback = old
        self._live = new
        self.batch, self.mode = batch, mode

    def _fall_back(self, exc: BaseException) -> None:
        """The configuration on trial ran out of memory: back to the one that fitted (its next
        cycle starts with a prefill)."""
        failed, old = self._live.batch, self._fallback
        self._fallback = None
        self._live = old
        self.batch, self.mode = old.batch, old.mode
        self._refuse_batch(failed, exc)

    def _refuse_batch(self, batch: int, exc: BaseException) -> None:
        """A batch that does not fit: one line, and the request goes back to what runs."""
        live = self._live
        with self._cond:
            self._want_mode, self._want_batch = live.mode, live.batch
        _release_memory(self.cuda)
        note = (f"out of memory at batch {batch} ({memory_figures(exc, self.device)}); "
                f"back to batch {live.batch}, the last that fitted")
        self._note(note)

    def _note(self, text: str) -> None:
        self.notes.append(text)
        del self.notes[:-16]
        self._set_state(self.state if self.state != "paused" else DECODE, text)

    # ------------------------------------------------------------- compiling
    def _compiled_step(self) -> CompiledStep:
        step = self._compiled.get(self.compile_mode)
        if not isinstance(step, CompiledStep):
            prepare, self._prepare_cache = self._prepare_cache, None
            if prepare is not None:
                try:
                    prepare()
                except Exception:  # inductor's default cache directory then
                    pass
            fn = torch.compile(self.adapter.decode, mode=self.compile_mode, dynamic=None)
            step = self._compiled[self.compile_mode] = CompiledStep(fn)
        return step

    def _start_compile(self, batch: int, cache: Any) -> None:
        """Compile for ``batch``: on a worker (decoding goes on, its steps marked) or here."""
        scratch = cache if cache is not None else self.adapter.new_cache(batch)
        job = _CompileJob(batch, scratch)
        what = f"torch.compile(mode={self.compile_mode!r}) for batch {batch}"
        foreground, self._foreground_compile = self._foreground_compile, False
        step = self._compiled.get(self.compile_mode)
        done = list(step.order) if isinstance(step, CompiledStep) else []
        # batch 1 has a graph of its own; every batch >= 2 shares the first one's (dynamic)
        new_graph = batch not in done and (batch == 1 or not any(b >= 2 for b in done))
        warm = getattr(self.compile_helper, "warm", None)
        if (not foreground and self.background_compile and new_graph and warm is not None
                and _warm_foreground() and warm([*done, batch])):
            # Everything is in the persistent cache already: a few seconds with decoding
            # paused reach compiled mode sooner than a compile sharing the GIL with decoding.
            foreground, what = True, f"{what} from the cache (decoding paused)"
        if foreground or not self.background_compile:
            self._set_state("compiling", what)
            self._run_job(job)
            self._finish_job(job)
            return
        self._job = job
        self._compiling = True
        if self.compile_helper is not None and new_graph:
            try:
                job.helper = self.compile_helper([*done, batch])
            except Exception as exc:  # could not start: compile here, as before
                job.helper_note = (f"compile helper not started ({type(exc).__name__}: "
                                   f"{one_line(exc, 100)}); compiling in this process")
        # Dynamo and inductor run Python for tens of seconds on the worker: at the default
        # 5 ms switch interval the engine thread waits that long for the GIL at each of a
        # step's many Python-level calls (H100, qwen3-0.6b: 3 ms compiled steps became 415 ms).
        # A short interval hands the GIL back quickly; restored when the job is finished.
        self._switch_saved = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_saved, COMPILE_SWITCH_INTERVAL_S))
        self._tell_config()
        job.thread = threading.Thread(target=self._run_job, args=(job,), daemon=True,
                                      name="tuiprof-compile")
        job.thread.start()
        where = "in a helper process" if job.helper is not None else "in the background"
        self._set_state("compiling", f"{what} {where}; decoding goes on in "
                                     f"{self.mode} at batch {self.batch}")

    def _run_job(self, job: _CompileJob) -> None:
        """The compile itself: the first call of the compiled step, on a scratch cache of the
        job's batch (never the live one). CUDA graphs are left to the engine thread. With a
        helper, dynamo traces here meanwhile and inductor's part waits for the helper (the GIL
        free), then reads what the helper put in the cache (``TUIPROF_COMPILE_OVERLAP=0``: the
        helper is waited for first)."""
        torch.set_grad_enabled(False)
        try:
            self.compile_parts = {}
            self.saved_step = ""
            self._helper_saves = job.helper is not None
            if job.helper is None:
                self.compile_batch(job.batch, job.cache)
            elif compile_overlap():
                # dynamo traces here while the helper compiles; inductor's part waits for it
                wait = _Once(partial(self._await_helper, job, True))
                with _inductor_gate(wait):
                    self.compile_batch(job.batch, job.cache)
                wait()  # no graph reached inductor: the helper is still waited for (or ended)
            else:
                self._await_helper(job)
                self.compile_batch(job.batch, job.cache)
        except BaseException as exc:  # reported at the next boundary, on the engine thread
            job.error = exc
        finally:
            job.parts = dict(self.compile_parts)
            job.saved_step = self.saved_step
            step = self._compiled.get(self.compile_mode)
            if isinstance(step, CompiledStep):
                job.notes, step.notes[:] = list(step.notes), []
            job.seconds = time.perf_counter() - job.t0
            job.done.set()
            with self._cond:
                self._pending = True

    def _await_helper(self, job: _CompileJob, gated: bool = False) -> None:
        """Wait for the job's helper (the GIL is free meanwhile); raises if the session stopped.
        ``gated``: called from inductor's gate, so the wait counts in inductor's time."""
        helper = job.helper
        if helper is not None:
            t0 = time.perf_counter()
            result = helper.wait()
            if gated:
                job.gated_s = time.perf_counter() - t0
            job.helper_s = result.seconds
            job.helper = None
            if not result.ok and not job.cancelled:
                job.helper_note = f"{result.reason}; compiling in this process"
        job.helper_done.set()  # the engine thread tells a failed helper's note
        if job.cancelled:
            raise RuntimeError("the session stopped during the compile")

    def compile_batch(self, batch: int, cache: Any = None) -> None:
        """Compile the decode step for ``batch`` by calling it once on ``cache`` (a scratch
        cache of that batch, made here when None), without recording CUDA graphs. The compile
        helper process calls this too, so that both compile the very same graphs."""
        step = self._compiled_step()
        args = self.compile_args(batch, cache)
        before, times = _cache_counters(), _compile_times()
        with _no_cudagraphs(self.cuda):
            self._ahead_of_time(step, batch, args)
            try:
                step.fn(*args)
            except Exception as exc:
                graph = graph_of(batch)
                if is_oom(exc) or graph not in step.aot:
                    raise
                # the step compiled ahead of time does not run here: dynamo's compile instead
                del step.aot[graph]
                self.saved_step = ""
                saved = getattr(self.compile_helper, "precompiled", None)
                pre = saved() if saved is not None else None
                if pre is not None:
                    step.notes.append(pre.discard(graph, exc))
                step.fn(*args)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        after = _cache_counters()
        self.compile_cache_hits = {k: after[k] - before.get(k, 0) for k in after}
        self.compile_parts = {k: v - times.get(k, 0.0) for k, v in _compile_times().items()}
        step.add(batch)

    def compile_args(self, batch: int, cache: Any = None) -> tuple:
        """The decode step's arguments a compile for ``batch`` traces with (``cache``: a scratch
        cache of that batch, made here when None), the batch dimension marked dynamic above 1:
        one graph for every batch >= 2 (batch 1 keeps its own)."""
        cache = self.adapter.new_cache(batch) if cache is None else cache
        tok = torch.zeros((batch, 1), dtype=torch.long, device=self.device)
        plen = self.prompt_ids.shape[1]
        pos = torch.tensor([plen], device=self.device)
        masks = self._decode_masks(cache, batch)
        args = (tok, pos, cache) if masks is None else (tok, pos, cache, masks.at(pos, plen))
        if batch > 1:
            self._mark_batch_dynamic(tok, cache, args[3:])
        return args

    def _ahead_of_time(self, step: CompiledStep, batch: int, args: tuple) -> None:
        """The graph of ``batch`` from a step saved by an earlier session, else compiled whole
        ahead of time and saved for the next one (:mod:`tuiprof.engine.precompiled`); nothing
        when this session keeps none (the helper process, a TP group, a torch without it): the
        call that follows compiles it with dynamo then."""
        saved = getattr(self.compile_helper, "precompiled", None)
        pre = saved() if saved is not None else None
        graph = graph_of(batch)
        if pre is None or graph in step.aot:
            return
        options = mode_options(self.compile_mode)
        fn, note = pre.load(graph, self.adapter, args, options)
        how = "loaded" if fn is not None else ""
        # a helper process compiling this graph saves it too, after its compile (the session's
        # compile finds its kernels in the cache and needs no second trace of its own)
        if fn is None and not self._helper_saves and not pre.whole_refused(graph):
            fn, saved_note = pre.compile(graph, self.adapter.decode, self.adapter, args, options)
            note = "; ".join(x for x in (note, saved_note) if x)
            how = "saved" if fn is not None and not saved_note else ""
        if note:
            step.notes.append(note)
        if fn is not None:
            step.aot[graph] = fn
        self.saved_step = how

    def _mark_batch_dynamic(self, tok: torch.Tensor, cache: Any, masks: tuple = ()) -> None:
        """Compile the batch dimension as dynamic from the start: a later batch (>= 2) then
        needs no compile of its own, only its CUDA graphs. ``maybe_``: no error where the
        model code specialises it."""
        tensors = getattr(self.adapter, "cache_tensors", None)
        mask_tensors = [t for m in masks for t in (m.values() if isinstance(m, dict) else [m])
                        if isinstance(t, torch.Tensor)]
        for t in [tok, *(tensors(cache) if tensors is not None else ()), *mask_tensors]:
            torch._dynamo.maybe_mark_dynamic(t, 0)

    def _finish_job(self, job: _CompileJob) -> None:
        """At a boundary after a compile ended: switch to what it was for, or say why not."""
        self._compiling = False
        self._restore_switch_interval()
        self._tell_config()
        live = self._live
        if job.error is not None:
            self._compile_failed(job.error, job.batch)
            return
        self.compile_s = job.seconds
        self.compile_helper_s = job.helper_s
        for note in job.notes:  # a saved step that could not be used or kept: one line each
            self._note(note)
        record = getattr(self.compile_helper, "compiled", None)
        if record is not None:  # the next session of this model finds it in the cache
            step = self._compiled.get(self.compile_mode)
            try:
                record(list(step.order) if isinstance(step, CompiledStep) else [job.batch])
            except Exception:
                pass
        want_mode, want_batch = self._want_mode, self._want_batch
        if (want_mode, want_batch) != (COMPILED, job.batch):
            self._set_state(DECODE, f"compiled for batch {job.batch} in {_took(job)}")
            return  # asked for something else meanwhile: the next boundary handles it
        if job.batch != live.batch:  # captured after the new batch's prefill
            self._begin_batch(job.batch, COMPILED, job.cache)
            self._set_state(DECODE, f"compiled in {_took(job)}")
            return
        try:
            self._compiled_now(live)
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._refuse_batch(job.batch, exc)
            return
        if live.mode == COMPILED:
            graphs = "CUDA graphs" if live.cudagraphs else "first step"
            self._set_state(DECODE, f"compiled in {_took(job, self.graphs_s, graphs)}")

    def _compile_failed(self, exc: BaseException, batch: int | None = None) -> None:
        """A compile that failed is not fatal: one line, and the live configuration goes on."""
        live = self._live
        _release_memory(self.cuda)
        with self._cond:
            self._want_mode, self._want_batch = live.mode, live.batch
        if is_oom(exc):
            text = (f"out of memory while compiling for batch {batch or live.batch} "
                    f"({memory_figures(exc, self.device)}); staying in {live.mode} at batch "
                    f"{live.batch}")
        else:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
            first = (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:160]
            text = f"compile failed ({type(exc).__name__}: {first}); continuing in {live.mode} mode"
        if self.lockstep is not None:
            # The other ranks compiled and run the new graph's collectives: this rank cannot
            # go on alone in its old mode. The run stops with the reason.
            raise RuntimeError(f"compile failed on this rank: {text}") from None
        self._note(text)

    def _compiled_now(self, live: _Live) -> None:
        live.mode = COMPILED
        self._use_compiled(live)
        self.mode = COMPILED

    def _use_compiled(self, live: _Live) -> None:
        """Run the compiled step here before using it, without disturbing the sequence.

        Warm-up calls decode the real next (token, position): they write the very K/V the real
        step writes next, and ``truncate`` rewinds caches that count their own write position.
        CUDA graph trees warm up once, record on the second call and replay from the third; they
        are per thread, so this runs on the engine thread.
        """
        if self.cuda:
            _own_cudagraph_trees()  # this thread records and replays the graphs
        step = self._compiled_step()
        cudagraphs = self.cuda and "reduce-overhead" in self.compile_mode
        truncate = getattr(self.adapter, "truncate", None)
        fresh = live.batch not in step.batches
        t0 = time.perf_counter()
        self.graphs_s = None
        if fresh:
            self._set_state("compiling", f"torch.compile(mode={self.compile_mode!r})")
        try:
            for _ in range(3 if cudagraphs else 1):
                if cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                step.fn(*live.step_args())
                if truncate is not None:
                    truncate(live.position, live.cache)
            if self.cuda:
                torch.cuda.synchronize(self.device)
        except Exception as exc:
            live.mode, live.fn, live.cudagraphs = EAGER, self.adapter.decode, False
            self.mode = EAGER
            if truncate is not None:
                truncate(live.position, live.cache)
            if is_oom(exc):
                raise
            with self._cond:
                self._want_mode = EAGER
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()] or [""]
            first = (" ".join(lines[:2]) if lines[0].endswith(":") else lines[0])[:160]
            self._note(f"compile failed ({type(exc).__name__}: {first}); continuing in eager mode")
            return
        step.add(live.batch)
        self.graphs_s = time.perf_counter() - t0
        if fresh:
            self.compile_s = self.graphs_s
            self._set_state(DECODE, f"compiled in {self.compile_s:.1f} s")
        live.fn, live.cudagraphs, live.mode = step.fn, cudagraphs, COMPILED

    def _restore_switch_interval(self) -> None:
        saved, self._switch_saved = self._switch_saved, None
        if saved is not None:
            sys.setswitchinterval(saved)

    def _close_helper(self) -> None:
        close = getattr(self.compile_helper, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass
