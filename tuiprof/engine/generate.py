"""The generation engine: prefill + batched decode, token by token, on its own thread.

A *configuration* is a mode (eager or compiled) and a batch (sequences decoded together, each
with its own prompt, sharing one position). Commands (pause, resume, stop, mode and batch
switches) are thread-safe and take effect at token boundaries. A compile runs on a worker
thread while the current configuration keeps decoding; the tokens decoded meanwhile are marked
(``compiling``) and the switch happens at the first boundary after the compile finished.

The per-token path is hot: one ``.item()`` sync per step, no logging, and the only Python
object built per step is the :class:`TokenEvent`. Between launching a step and waiting for its
tokens the engine calls ``listener.token_launched((m0, m1))``: on a GPU the device is then
busy, so a listener's bookkeeping done there costs the loop nothing; ``m0``-``m1`` is the host
window of the model's forward (the rest of the step, sampling and the position update, is the
engine's own loop).

Tensor-parallel ranks run one engine each with a :class:`~tuiprof.engine.lockstep.Lockstep`:
their commands then take effect only at boundaries where all ranks agree (rank 0's wishes),
so every rank switches, pauses and stops at the same step, and compiles in the foreground
(all ranks together), at the batch they started with.

A background compile may be done first by a helper process (:mod:`tuiprof.engine.compile_helper`)
that fills inductor's cache while this process goes on decoding without sharing its interpreter
with inductor; the compile here then finds every graph and kernel in the cache. ``compile_cache`` prepares the persistent cache
directory (:mod:`tuiprof.engine.compile_cache`) before this process's first compile.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch

from ..errors import one_line
from .adapter import DecoderAdapter
from .events import EngineListener, NullListener, TokenEvent
from .lockstep import PAUSE_POLL_S, Lockstep
from .memory import is_oom, memory_figures, oom_message

from ..phases import COMPILED, DECODE, EAGER, MODES, PREFILL  # noqa: F401
DEFAULT_MAX_BATCH = 256
COMPILE_SWITCH_INTERVAL_S = 2e-5  # the GIL switch interval while a compile runs beside decoding


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
class CompiledStep:
    """``torch.compile`` of the adapter's decode step, shared by every engine on the adapter.

    A first compile at a batch >= 2 marks the batch dimension dynamic: every batch >= 2 then
    reuses that graph (CUDA graph trees still record one graph per batch size). Batch 1 gets a
    static graph of its own (dynamo specialises size 1). ``batches``: those already run."""

    fn: Callable
    batches: set = field(default_factory=set)
    order: list = field(default_factory=list)   # the batches in the order they were compiled

    def add(self, batch: int) -> None:
        if batch not in self.batches:
            self.batches.add(batch)
            self.order.append(batch)


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


@dataclass
class _CompileJob:
    """A compile for ``batch`` on a worker thread (its first call on a cache of that batch)."""

    batch: int
    cache: Any
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    t0: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    helper: Any = None              # a CompileHelper filling the cache first, if one runs
    helper_s: float | None = None   # how long it took (None: no helper)
    helper_note: str = ""           # one line when it failed (the compile goes on here)
    helper_done: threading.Event = field(default_factory=threading.Event)
    parts: dict = field(default_factory=dict)  # seconds in dynamo and inductor (_compile_times)
    gated_s: float = 0.0            # inductor's part spent waiting for the helper (overlap)
    noted: bool = False
    cancelled: bool = False

    def cancel(self) -> None:
        """The session stops: end the helper; a compile in this process cannot be stopped."""
        self.cancelled = True
        helper = self.helper
        if helper is not None:
            helper.stop()


class Engine:
    """Runs ``adapter`` on a background thread and reports every step to ``listener``.

    ``prompt_ids`` is ``[B, T]``: B is the starting batch. ``max_new_tokens`` counts steps
    including the prefill's; a cycle also ends when the static cache is full. With ``loop`` the
    engine then starts again from the prompt. ``background_compile=False`` compiles on the
    engine thread instead (generation waits: benchmarks and sweeps want that).
    ``compile_helper(batches)``: a started :class:`~tuiprof.engine.compile_helper.CompileHelper`
    compiling ``batches`` in that order, or None (then the compile runs here from the start).
    ``compile_cache()``: called once before the first compile (points inductor at a directory).
    """

    def __init__(self, adapter: DecoderAdapter, prompt_ids: torch.Tensor, *,
                 device: str | torch.device | None = None, max_new_tokens: int | None = 256,
                 loop: bool = False, mode: str = EAGER, compile_mode: str | None = None,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                 clock: Callable[[], int] | None = None, listener: EngineListener | None = None,
                 info: dict | None = None, lockstep: Lockstep | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH, background_compile: bool = True,
                 compile_helper: Callable[[list], Any] | None = None,
                 compile_cache: Callable[[], Any] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if prompt_ids.ndim != 2 or prompt_ids.shape[0] < 1 or prompt_ids.shape[1] < 1:
            raise ValueError("prompt_ids must have shape [B, T] with B, T >= 1")
        if prompt_ids.shape[1] >= adapter.max_len:
            raise ValueError(f"prompt of {prompt_ids.shape[1]} tokens leaves no room in a cache "
                             f"of {adapter.max_len}")
        self.adapter = adapter
        self.device = torch.device(device) if device is not None else _param_device(adapter)
        self.prompt_ids = prompt_ids.to(self.device)
        self.max_new_tokens = max_new_tokens
        self.loop = loop
        self.cuda = self.device.type == "cuda"
        self.compile_mode = compile_mode or ("reduce-overhead" if self.cuda else "default")
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.seed = seed
        self.clock = clock or time.perf_counter_ns
        self.listener: EngineListener = listener or NullListener()
        self.info: dict = dict(info or {})
        self.max_batch = max(int(max_batch), int(prompt_ids.shape[0]))
        self.background_compile = background_compile
        self.compile_helper = compile_helper
        self._prepare_cache = compile_cache
        self.state = "loading"
        self.message = ""
        self.mode = EAGER               # mode in effect; a compiled request switches at a boundary
        self.batch = int(prompt_ids.shape[0])   # batch in effect
        self.tokens = 0                 # steps run in this engine's life
        self.cycle = 0
        self.compile_s: float | None = None
        self.compile_helper_s: float | None = None   # the helper's part of the last compile
        self.compile_parts: dict = {}   # the last compile_batch's dynamo and inductor seconds
        self.graphs_s: float | None = None  # the last switch's warm-up and CUDA-graph recording
        self.compile_cache_hits: dict = {}   # inductor's cache hits/misses in the last compile
        self.error: str | None = None
        self.notes: list[str] = []      # one-line reports of switches that did not happen
        self._want_mode = mode
        self._want_batch = self.batch
        self._paused = False
        self._stop = False
        self._pending = mode != EAGER   # a command waits for the next token boundary
        # A session asked to start compiled compiles before its first compiled step, in the
        # foreground: a bounded run (headless, a sweep) must measure that mode, not eager steps
        # decoded while it compiles. Later switches compile beside decoding.
        self._foreground_compile = mode != EAGER
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._live: _Live | None = None
        self._fallback: _Live | None = None   # the last configuration that fitted, on trial
        self._job: _CompileJob | None = None
        self._compiling = False
        self._switch_saved: float | None = None   # the GIL switch interval before a compile
        self._told = (self.batch, False)
        steps = getattr(adapter, "compiled_steps", None)
        self._compiled: dict = steps if isinstance(steps, dict) else {}
        self._select = self._selector()
        self.lockstep = lockstep
        if lockstep is not None:  # ranks switch at an agreed step: no compile beside decoding
            self.background_compile = False

    # ------------------------------------------------------------- commands
    def start(self) -> None:
        """Start the engine thread; returns at once."""
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._thread = threading.Thread(target=self.run, name="tuiprof-engine", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the engine thread; True once it has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def busy(self) -> bool:
        """The engine thread or a compile worker still runs (a compile cannot be interrupted)."""
        job = self._job
        return self.alive or bool(job is not None and job.thread is not None
                                  and job.thread.is_alive())

    @property
    def want_batch(self) -> int:
        return self._want_batch

    def pause(self) -> str:
        with self._cond:
            self._paused = True
            self._pending = True
        return "pausing after the current token"

    def resume(self) -> str:
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        return "resumed"

    def stop(self) -> str:
        with self._cond:
            self._stop = True
            self._pending = True
            self._cond.notify_all()
        job = self._job
        if job is not None:
            job.cancel()  # a helper process ends with the session, never after it
        self._close_helper()
        return "stopping"

    def _close_helper(self) -> None:
        close = getattr(self.compile_helper, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass

    def request_mode(self, mode: str) -> str:
        """Switch to ``mode`` at the next token boundary (compiling on first use)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        with self._cond:
            self._want_mode = mode
            self._pending = True
        return f"switching to {mode} at the next token"

    def request_batch(self, batch: int) -> str:
        """Decode ``batch`` sequences from the next token boundary on (1 … ``max_batch``): the
        cache is rebuilt and each sequence prefilled; compiled mode compiles/captures first."""
        n = max(1, min(int(batch), self.max_batch))
        with self._cond:
            self._want_batch = n
            self._pending = True
        return f"switching to batch {n} at the next token"

    def decode_once(self) -> None:
        """One more decode step of the configuration in effect, outside the loop and without
        listener calls: for a profiler wrapped around it, after :meth:`run` returned, on the
        thread that ran it (CUDA graphs replay on their own thread)."""
        live = self._live
        if live is None or live.fn is None:
            raise RuntimeError("the engine has not decoded yet")
        if live.position >= self.adapter.max_len:
            raise RuntimeError("the static cache is full")
        if live.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        nxt = self._select(live.fn(*live.step_args()))
        live.tok.copy_(nxt.view(-1, 1))
        live.pos.add_(1)
        live.position += 1

    # ---------------------------------------------------------------- thread
    def run(self) -> None:
        """The engine loop, on the calling thread (``start`` runs it on its own thread)."""
        torch.set_grad_enabled(False)  # grad mode is per thread
        if self.cuda and "torch._inductor.cudagraph_trees" in sys.modules:
            _own_cudagraph_trees()  # else at the first capture: importing inductor costs seconds
        try:
            if self.cuda and self.device.index is not None:
                # The current device is per thread too: without this, CUDA events, allocator
                # statistics and graph capture of a rank on cuda:1 would go to cuda:0.
                torch.cuda.set_device(self.device)
            self._generate()
        except Exception as exc:  # the thread must end cleanly and say why
            if is_oom(exc):
                self._fail(oom_message(exc, self.device, self.state))
            else:
                self._fail(f"{type(exc).__name__}: {one_line(exc)}")
        finally:  # stopped or failed with a compile still running: the interval is per process
            self._restore_switch_interval()
            self._close_helper()

    def _restore_switch_interval(self) -> None:
        saved, self._switch_saved = self._switch_saved, None
        if saved is not None:
            sys.setswitchinterval(saved)

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_state("error", message)

    def _set_state(self, state: str, message: str = "") -> None:
        self.state, self.message = state, message
        self.listener.state_changed(state, message)

    def _tell_config(self) -> None:
        """Tell the listener the batch and compile flag of the steps that follow (on change)."""
        now = (self.batch, self._compiling)
        if now != self._told:
            self._told = now
            told = getattr(self.listener, "configuration_changed", None)
            if told is not None:
                told(self.batch, self._compiling)

    def _steps(self, live: _Live) -> int:
        room = self.adapter.max_len - live.prompt.shape[1]
        return room if self.max_new_tokens is None else min(room, self.max_new_tokens - 1)

    def allocate(self) -> None:
        """Allocate the starting batch's KV cache now (else the first prefill does)."""
        if self._live is None:
            self._live = self._new_live(self.batch, EAGER)

    def _generate(self) -> None:
        self.allocate()
        while True:
            if self.lockstep is not None:
                if not self._agree(can_switch=False):
                    break
            elif self._pending and not self._commands(can_switch=False):
                break
            live = self._live
            try:
                self._prefill(live)
            except Exception as exc:
                if self._fallback is None or not is_oom(exc):
                    raise
                self._fall_back(exc)  # a new batch that does not fit: prefill the old again
                self.cycle += 1
                continue
            result = self._decode(live, self._steps(live))
            if result == "stop":
                break
            if result == "restart":      # a new batch: its own prefill, a new cycle
                self.cycle += 1
                continue
            if not self.loop:
                self._set_state("done", f"{self.tokens} tokens")
                return
            self.cycle += 1
        self._set_state("stopped", f"{self.tokens} tokens")

    def _prefill(self, live: _Live) -> None:
        adapter, listener, clock, perf = self.adapter, self.listener, self.clock, time.perf_counter
        self._set_state(PREFILL)
        self._tell_config()
        plen = live.prompt.shape[1]
        start_ns = clock()
        listener.token_started(PREFILL, EAGER, -1, self.cycle, start_ns)
        t0 = perf()
        if self.cuda:
            ev0, ev1 = _events()
            torch.cuda.nvtx.range_push("step")
            torch.cuda.nvtx.range_push(PREFILL)
            ev0.record()
        m0 = clock()
        if self._compiling:
            logits = beside_compile(adapter.prefill, live.prompt, live.cache)
        else:
            logits = adapter.prefill(live.prompt, live.cache)
        m1 = clock()
        nxt = self._select(logits)
        live.tok.copy_(nxt.view(-1, 1))
        live.pos.fill_(plen)
        live.position = plen
        if live.masks is not None:  # the masks' one check, here rather than in a decode step
            live.masks.settle(live.pos, plen)
        if self.cuda:
            ev1.record()
        listener.token_launched((m0, m1))
        if live.batch == 1:
            token_id, token_ids = nxt.item(), None
        else:
            token_ids = nxt.tolist()
            token_id = token_ids[0]
        t1 = perf()
        end_ns = clock()
        gpu_ms = None
        if self.cuda:
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
            gpu_ms = ev0.elapsed_time(ev1)
        listener.token_finished(TokenEvent(self.tokens, -1, PREFILL, EAGER, token_id, start_ns,
                                           end_ns, (t1 - t0) * 1e3, gpu_ms, self.cycle,
                                           live.batch, self._compiling, token_ids))
        self.tokens += 1
        if self.tokens == 1 and self.background_compile and self.compile_helper is not None:
            prestart = getattr(self.compile_helper, "prestart", None)
            if prestart is not None:  # its imports take seconds: done before a compile is asked
                try:
                    prestart()
                except Exception:
                    pass
        if live.mode == COMPILED and live.fn is None:  # a compiled batch: capture after prefill
            self._use_compiled(live)
        self._set_state("compiling" if self._compiling else DECODE)

    def _decode(self, live: _Live, steps: int) -> str:
        """Decode up to ``steps`` steps of ``live``; "done", "stop" or "restart" (new batch)."""
        listener, clock, perf, cuda, select = (self.listener, self.clock, time.perf_counter,
                                               self.cuda, self._select)
        if cuda:
            ev0, ev1 = _events()
            push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
            mark_step = torch.compiler.cudagraph_mark_step_begin
        gpu_ms = None
        step = 0
        while step < steps:
            lock = self.lockstep
            if lock is not None:
                if lock.due():
                    action = self._agree(can_switch=True)
                    if action != "go":
                        return action
                    live = self._live
            elif self._pending:
                action = self._commands(can_switch=True)
                if action != "go":
                    return action
                live = self._live
                self._tell_config()
            tok, pos, cache, fn = live.tok, live.pos, live.cache, live.fn
            mode, cg, batch, compiling = live.mode, live.cudagraphs, live.batch, self._compiling
            start_ns = clock()
            listener.token_started(DECODE, mode, step, self.cycle, start_ns)
            t0 = perf()
            try:
                if cuda:
                    push("step")
                    push(DECODE)
                    ev0.record()
                    if cg:
                        mark_step()
                args = live.step_args()  # masks made here, as generate() does: the loop's work
                m0 = clock()  # the model's forward launches its work from here ...
                if compiling:
                    logits = beside_compile(fn, *args, rewind=partial(
                        self._rewind, live.position, cache))
                else:
                    logits = fn(*args)
                m1 = clock()  # ... to here; the rest is the loop's own (sampling, position)
                nxt = select(logits)
                tok.copy_(nxt.view(-1, 1))
                pos.add_(1)
                if cuda:
                    ev1.record()
                # the device is busy: listeners' bookkeeping goes here
                listener.token_launched((m0, m1))
                # the one sync per step; ev1 is complete after it
                if batch == 1:
                    token_id, token_ids = nxt.item(), None
                else:
                    token_ids = nxt.tolist()
                    token_id = token_ids[0]
            except Exception as exc:
                if self._fallback is None or not is_oom(exc):
                    raise
                self._fall_back(exc)  # the new batch did not fit: back to the last that did
                return "restart"
            t1 = perf()
            end_ns = clock()
            if cuda:
                pop()
                pop()
                gpu_ms = ev0.elapsed_time(ev1)
            live.position += 1
            listener.token_finished(TokenEvent(self.tokens, step, DECODE, mode, token_id,
                                               start_ns, end_ns, (t1 - t0) * 1e3, gpu_ms,
                                               self.cycle, batch, compiling, token_ids))
            self.tokens += 1
            step += 1
            if self._fallback is not None:
                self._fallback = None  # the new configuration has decoded a step: it fits
        return "done"

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
        cache = self.adapter.new_cache(batch) if cache is None else cache
        tok = torch.zeros((batch, 1), dtype=torch.long, device=self.device)
        plen = self.prompt_ids.shape[1]
        pos = torch.tensor([plen], device=self.device)
        masks = self._decode_masks(cache, batch)
        args = (tok, pos, cache) if masks is None else (tok, pos, cache, masks.at(pos, plen))
        if batch > 1:  # one graph for every batch >= 2 (batch 1 keeps its own)
            self._mark_batch_dynamic(tok, cache, args[3:])
        before, times = _cache_counters(), _compile_times()
        with _no_cudagraphs(self.cuda):
            step.fn(*args)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        after = _cache_counters()
        self.compile_cache_hits = {k: after[k] - before.get(k, 0) for k in after}
        self.compile_parts = {k: v - times.get(k, 0.0) for k, v in _compile_times().items()}
        step.add(batch)

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

    # ------------------------------------------------------------- helpers
    def _new_live(self, batch: int, mode: str) -> _Live:
        prompt = extend_prompt(self.prompt_ids, batch, self.adapter.vocab_size, self.seed)
        cache = self.adapter.new_cache(batch)
        return _Live(batch, cache, prompt,
                     torch.zeros((batch, 1), dtype=torch.long, device=self.device),
                     torch.zeros(1, dtype=torch.long, device=self.device), mode,
                     self.adapter.decode, masks=self._decode_masks(cache, batch))

    def _rewind(self, position: int, cache: Any) -> None:
        """Make ``cache``'s next write land at ``position`` again (a step that is repeated)."""
        truncate = getattr(self.adapter, "truncate", None)
        if truncate is not None:
            truncate(position, cache)

    def _decode_masks(self, cache: Any, batch: int) -> Any:
        """The adapter's masks for ``cache``'s decode steps, where it makes them."""
        make = getattr(self.adapter, "decode_masks", None)
        return make(cache, batch) if make is not None else None

    def _selector(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """logits [B, V] -> next tokens [B] (greedy, or seeded temperature / top-k sampling)."""
        if self.temperature <= 0:
            return lambda logits: logits.argmax(-1)
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        temp, k = self.temperature, self.top_k

        def sample(logits: torch.Tensor) -> torch.Tensor:
            scaled = logits.float() / temp
            if k > 0:
                vals, idx = torch.topk(scaled, k, dim=-1)
                choice = torch.multinomial(torch.softmax(vals, -1), 1, generator=gen)
                return idx.gather(-1, choice).view(-1)
            return torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen).view(-1)

        return sample


OVERLAP_ENV = "TUIPROF_COMPILE_OVERLAP"
_gate = threading.local()
_gate_installed = False
_gate_lock = threading.Lock()


def _warm_foreground() -> bool:
    """A compile whose graphs are all cached runs with decoding paused
    (``TUIPROF_WARM_COMPILE=beside``: beside decoding, like a cold one)."""
    import os

    return os.environ.get("TUIPROF_WARM_COMPILE", "foreground").strip().lower() != "beside"


def compile_overlap() -> bool:
    """Trace here while the helper compiles (``TUIPROF_COMPILE_OVERLAP=0``: wait for the helper
    first, then compile here from start to end)."""
    import os

    return os.environ.get(OVERLAP_ENV, "1").strip().lower() not in ("0", "off", "no", "false")


class _Once:
    """``fn()`` once; later calls return at once (graph breaks reach inductor more than once)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn, self.called = fn, False

    def __call__(self) -> None:
        if not self.called:
            self.called = True
            self.fn()


class _inductor_gate:
    """While active on this thread, inductor's compile of each graph dynamo hands it first calls
    ``wait()``: dynamo's trace goes on here while the helper fills the cache, and inductor
    then finds the graph in it. Inductor's backend object is wrapped once per process, by its
    ``__call__``; on every other thread, and here outside the block, it is unchanged."""

    def __init__(self, wait: Callable[[], None]) -> None:
        self.wait = wait

    def __enter__(self) -> None:
        _install_gate()
        _gate.wait = self.wait

    def __exit__(self, *exc: Any) -> None:
        _gate.wait = None


def _install_gate() -> None:
    global _gate_installed
    with _gate_lock:
        if _gate_installed:
            return
        wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
        original = getattr(wrapper, "__call__", None)
        if original is None:
            return

        def gated(self, *args: Any, **kwargs: Any) -> Any:
            wait = getattr(_gate, "wait", None)
            if wait is not None:
                wait()
            return original(self, *args, **kwargs)

        wrapper.__call__ = gated
        _gate_installed = True


def _cache_counters() -> dict:
    """Inductor's FX-graph and AOT-autograd cache hits and misses so far in this process."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    return {"fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
            "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
            "aot_miss": counters["aot_autograd"]["autograd_cache_miss"]}


# dynamo's own metrics (seconds, summed over calls) that say where a compile's time went
COMPILE_TIMES = {"bytecode_tracing": "dynamo", "OutputGraph.call_user_compiler": "inductor"}


def _compile_times() -> dict:
    """Seconds dynamo spent tracing and in its backend (inductor, or its caches) so far in this
    process (``torch._dynamo.utils.compilation_time_metrics``; empty where torch lacks it)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as metrics
    except Exception:
        return {}
    return {key: float(sum(metrics.get(key, ()))) for key in COMPILE_TIMES}


def _took(job: _CompileJob, graphs_s: float | None = None, graphs: str = "") -> str:
    """How long from the job's start to compiled mode and where it went: ``compiled in 9.8 s
    (dynamo 3.1 s, inductor 1.2 s, CUDA graphs 1.0 s, 4.5 s in a helper process)``. The parts
    are this process's (inductor's less its wait for the helper); the helper's compile overlaps
    them, and the rest is the compiled step's first run, waiting and Python around them."""
    total = job.seconds + (graphs_s or 0.0)
    own = dict(job.parts)
    if "OutputGraph.call_user_compiler" in own:  # less the wait for the helper inside it
        own["OutputGraph.call_user_compiler"] -= job.gated_s
    parts = [f"{name} {own[key]:.1f} s" for key, name in COMPILE_TIMES.items()
             if own.get(key, 0.0) >= 0.05]
    if graphs_s is not None and graphs_s >= 0.05:
        parts.append(f"{graphs} {graphs_s:.1f} s")
    if job.helper_s is not None and not job.helper_note:
        parts.append(f"{job.helper_s:.1f} s in a helper process")
    return f"{total:.1f} s" + (f" ({', '.join(parts)})" if parts else "")


def _events() -> tuple:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _release_memory(cuda: bool) -> None:
    import gc

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


class _no_cudagraphs:
    """Run compiled code without recording CUDA graphs (the compile worker's first call): CUDA
    graph trees bind to the thread that records them, and the engine thread records its own.
    ``cudagraph_capture_sizes=()`` is inductor's switch for "record no shape"."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._patch = None

    def __enter__(self) -> None:
        if self.cuda:
            import torch._inductor.config as inductor_config

            self._patch = inductor_config.patch({"triton.cudagraph_capture_sizes": ()})
            self._patch.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._patch is not None:
            self._patch.__exit__(*exc)


FX_PATCHED = "module is not installed as a submodule"
FX_RETRY_S = 10.0


def beside_compile(fn: Callable, *args: Any, rewind: Callable[[], None] | None = None) -> Any:
    """``fn(*args)`` on the engine thread while a compile runs on the worker.

    torch.fx's symbolic tracer (inductor traces its pattern-matcher replacements with it on a
    process's first compile) patches ``nn.Module.__call__`` for every thread while it traces:
    an eager forward on this thread then fails with fx's NameError (seen on an H100 with
    qwen3-0.6b). The patch lasts milliseconds; the forward is repeated once it is gone, after
    ``rewind``: the layers that ran before the failure have written their K/V (the same values
    again) but, with a cache that counts its own write position (transformers' ``StaticLayer``),
    also moved their counter on; without the rewind the repeat wrote one slot further and the
    cycle's last step ran past the cache. Its token is selected after the forward returns."""
    deadline = time.monotonic() + FX_RETRY_S
    while True:
        try:
            return fn(*args)
        except NameError as exc:
            if FX_PATCHED not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.002)
            if rewind is not None:
                rewind()


def _own_cudagraph_trees() -> None:
    """Let this thread record and replay CUDA graph trees.

    Their managers live in a thread-local that inductor sets up only for the thread that first
    imports ``cudagraph_trees`` (and for autograd's threads); any other thread fails an
    assertion when it first records. The engine thread is the one that records (the compile
    worker only compiles), so it gets that thread-local here when another thread (an earlier
    engine, a sweep on the main thread) imported the module first."""
    try:
        from torch._inductor import cudagraph_trees as trees
    except Exception:  # pragma: no cover - a torch without inductor
        return
    local = getattr(trees, "local", None)
    if local is None or hasattr(local, "tree_manager_containers"):
        return
    try:
        if torch._C._is_key_in_tls("tree_manager_containers"):
            return
    except Exception:
        pass
    import collections

    local.tree_manager_containers = {}
    local.tree_manager_locks = collections.defaultdict(threading.Lock)


def _param_device(adapter: DecoderAdapter) -> torch.device:
    dev = getattr(adapter, "device", None)
    if dev is not None:
        return torch.device(dev)
    module = getattr(adapter, "module", None) or getattr(adapter, "model", None)
    if isinstance(module, torch.nn.Module):
        return next(module.parameters()).device
    return torch.device("cpu")




def _oom_message(exc: BaseException, device: torch.device, phase: str = "") -> str:
    """Kept for callers of the old name; see :func:`tuiprof.engine.memory.oom_message`."""
    return oom_message(exc, device, phase)
