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

This module is the loop; switching a configuration and the compiles it needs are
:class:`~tuiprof.engine.switching.Switching`'s, the engine's base class.
"""
from __future__ import annotations

import sys
import threading
import time
from functools import partial
from typing import Any, Callable

import torch

from ..errors import one_line
from .adapter import DecoderAdapter
from .compile_support import _CompileJob, _own_cudagraph_trees, beside_compile
from .events import EngineListener, NullListener, TokenEvent
from .lockstep import Lockstep
from .memory import is_oom, oom_message
from .switching import Switching, _Live, extend_prompt

from ..phases import COMPILED, DECODE, EAGER, MODES, PREFILL  # noqa: F401
DEFAULT_MAX_BATCH = 256


class Engine(Switching):
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
        self.saved_step = ""            # the last compile_batch's saved step: loaded, saved or ""
        self._helper_saves = False      # the compile's helper process saves its step
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
        # the helper is prestarted for a session that decodes on until its user asks for
        # compiled mode (the live app loops); a bounded run (headless) compiles in the
        # foreground or never, and a helper started then is only stopped again at its end
        if (self.tokens == 1 and self.loop and self.background_compile
                and self.compile_helper is not None):
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


def _events() -> tuple:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


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
