"""The generation engine: prefill + token-by-token decode on its own thread.

Commands (pause, resume, stop, mode switch) are thread-safe and take effect at token
boundaries. The per-token path is hot: one ``.item()`` sync per token, no logging, and the
only Python object built per token is the :class:`TokenEvent`. Between launching a step and
waiting for its token the engine calls ``listener.token_launched()``: on a GPU the device is
then busy, so a listener's bookkeeping done there costs the loop nothing.

Tensor-parallel ranks run one engine each with a :class:`~tuiprof.engine.lockstep.Lockstep`:
their commands then take effect only at boundaries where all ranks agree (rank 0's wishes),
so every rank switches, pauses and stops at the same step.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Callable

import torch

from ..errors import one_line
from .adapter import DecoderAdapter
from .events import EngineListener, NullListener, TokenEvent
from .lockstep import PAUSE_POLL_S, Lockstep

EAGER, COMPILED = "eager", "compiled"
PREFILL, DECODE = "prefill", "decode"
MODES = (EAGER, COMPILED)


class Engine:
    """Runs ``adapter`` on a background thread and reports every token to ``listener``.

    ``max_new_tokens`` counts generated tokens including the prefill's; a cycle also ends when
    the static cache is full. With ``loop`` the engine then starts again from the prompt.
    """

    def __init__(self, adapter: DecoderAdapter, prompt_ids: torch.Tensor, *,
                 device: str | torch.device | None = None, max_new_tokens: int | None = 256,
                 loop: bool = False, mode: str = EAGER, compile_mode: str | None = None,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                 clock: Callable[[], int] | None = None, listener: EngineListener | None = None,
                 info: dict | None = None, lockstep: Lockstep | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] < 1:
            raise ValueError("prompt_ids must have shape [1, T] with T >= 1")
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
        self.state = "loading"
        self.message = ""
        self.mode = EAGER               # mode in effect; a compiled request switches at a boundary
        self.tokens = 0                 # tokens generated in this engine's life
        self.cycle = 0
        self.compile_s: float | None = None
        self.error: str | None = None
        self._want_mode = mode
        self._paused = False
        self._stop = False
        self._pending = mode != EAGER   # a command waits for the next token boundary
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._compiled = getattr(adapter, "compiled_steps", None)
        if not isinstance(self._compiled, dict):
            self._compiled = {}
        self._step: Callable = adapter.decode
        self._cudagraphs = False
        self.lockstep = lockstep

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
        return "stopping"

    def request_mode(self, mode: str) -> str:
        """Switch to ``mode`` at the next token boundary (compiling on first use)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        with self._cond:
            self._want_mode = mode
            self._pending = True
        return f"switching to {mode} at the next token"

    # ---------------------------------------------------------------- thread
    def run(self) -> None:
        """The engine loop, on the calling thread (``start`` runs it on its own thread)."""
        torch.set_grad_enabled(False)  # grad mode is per thread
        try:
            if self.cuda and self.device.index is not None:
                # The current device is per thread too: without this, CUDA events, allocator
                # statistics and graph capture of a rank on cuda:1 would go to cuda:0.
                torch.cuda.set_device(self.device)
            self._generate()
        except torch.cuda.OutOfMemoryError as exc:
            self._fail(_oom_message(exc, self.device, self.state))
        except Exception as exc:  # the thread must end cleanly and say why
            self._fail(f"{type(exc).__name__}: {one_line(exc)}")

    def _fail(self, message: str) -> None:
        self.error = message
        self._set_state("error", message)

    def _set_state(self, state: str, message: str = "") -> None:
        self.state, self.message = state, message
        self.listener.state_changed(state, message)

    def _generate(self) -> None:
        adapter, listener, clock, perf = self.adapter, self.listener, self.clock, time.perf_counter
        cuda, dev = self.cuda, self.device
        prompt = self.prompt_ids
        plen = prompt.shape[1]
        room = adapter.max_len - plen
        steps = room if self.max_new_tokens is None else min(room, self.max_new_tokens - 1)
        tok = self._tok = torch.zeros((1, 1), dtype=torch.long, device=dev)
        pos = self._pos = torch.zeros(1, dtype=torch.long, device=dev)
        select = self._selector()
        if cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev1 = torch.cuda.Event(enable_timing=True)
            push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
            mark_step = torch.compiler.cudagraph_mark_step_begin
        gpu_ms = None
        lock = self.lockstep
        while True:
            if lock is not None:
                if not self._agree(plen, can_switch=False):
                    break
            elif self._pending and not self._commands(plen, can_switch=False):
                break
            self._set_state(PREFILL)
            adapter.reset_cache()
            start_ns = clock()
            listener.token_started(PREFILL, EAGER, -1, self.cycle, start_ns)
            t0 = perf()
            if cuda:
                push("step")
                push(PREFILL)
                ev0.record()
            nxt = select(adapter.prefill(prompt))
            tok.copy_(nxt.view(1, 1))
            pos.fill_(plen)
            if cuda:
                ev1.record()
            listener.token_launched()
            token_id = nxt.item()
            t1 = perf()
            end_ns = clock()
            if cuda:
                pop()
                pop()
                gpu_ms = ev0.elapsed_time(ev1)
            listener.token_finished(TokenEvent(self.tokens, -1, PREFILL, EAGER, token_id, start_ns,
                                               end_ns, (t1 - t0) * 1e3, gpu_ms, self.cycle))
            self.tokens += 1
            self._set_state(DECODE)
            stopped = False
            for step in range(steps):
                if lock is not None:
                    if lock.due() and not self._agree(plen + step, can_switch=True):
                        stopped = True
                        break
                elif self._pending and not self._commands(plen + step, can_switch=True):
                    stopped = True
                    break
                mode, fn, cg = self.mode, self._step, self._cudagraphs
                start_ns = clock()
                listener.token_started(DECODE, mode, step, self.cycle, start_ns)
                t0 = perf()
                if cuda:
                    push("step")
                    push(DECODE)
                    ev0.record()
                    if cg:
                        mark_step()
                nxt = select(fn(tok, pos))
                tok.copy_(nxt.view(1, 1))
                pos.add_(1)
                if cuda:
                    ev1.record()
                listener.token_launched()  # the device is busy: listeners' bookkeeping goes here
                token_id = nxt.item()  # the one sync per token; ev1 is complete after it
                t1 = perf()
                end_ns = clock()
                if cuda:
                    pop()
                    pop()
                    gpu_ms = ev0.elapsed_time(ev1)
                listener.token_finished(TokenEvent(self.tokens, step, DECODE, mode, token_id,
                                                   start_ns, end_ns, (t1 - t0) * 1e3, gpu_ms,
                                                   self.cycle))
                self.tokens += 1
            if stopped:
                break
            if not self.loop:
                self._set_state("done", f"{self.tokens} tokens")
                return
            self.cycle += 1
        self._set_state("stopped", f"{self.tokens} tokens")

    def _commands(self, next_pos: int, can_switch: bool) -> bool:
        """Apply pending commands at a token boundary; False when the engine must stop.

        Modes switch only between decode steps (the step inputs and the cache are then live).
        """
        with self._cond:
            if self._stop:
                return False
            if self._paused:
                resume_state = self.state
                self._set_state("paused")
                while self._paused and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return False
                self._set_state(resume_state)
            want = self._want_mode
            self._pending = want != self.mode and not can_switch
        if want != self.mode and can_switch:
            self._switch(want, next_pos)
            return not self._stop  # a stop asked for during a compile ends the run here
        return True

    def _agree(self, next_pos: int, can_switch: bool) -> bool:
        """Lockstep boundary: apply rank 0's commands on every rank; False when all stop.

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
            return False
        if want != self.mode and can_switch:
            self._switch(want, next_pos)
            lock.set_mode(self.mode)
        return True

    def _switch(self, mode: str, next_pos: int) -> None:
        if mode == EAGER:
            self._step, self._cudagraphs, self.mode = self.adapter.decode, False, EAGER
            return
        fn = self._compiled.get(self.compile_mode)
        if fn is None:
            resume_state = self.state
            self._set_state("compiling", f"torch.compile(mode={self.compile_mode!r})")
            t0 = time.perf_counter()
            try:
                fn = self._compile(next_pos)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:  # not fatal: generation goes on in eager mode
                if self.lockstep is not None:
                    # The other ranks compiled and run the new graph's collectives: this rank
                    # cannot go on alone in eager mode. The run stops with the reason.
                    raise RuntimeError(f"compile failed on this rank: {exc}") from None
                truncate = getattr(self.adapter, "truncate", None)
                if truncate is not None:
                    truncate(next_pos)
                with self._cond:
                    self._want_mode = EAGER
                self._set_state(resume_state, f"compile failed ({type(exc).__name__}: "
                                              f"{one_line(exc, 160)}); "
                                              f"continuing in eager mode")
                return
            self.compile_s = time.perf_counter() - t0
            self._compiled[self.compile_mode] = fn
            self._set_state(resume_state, f"compiled in {self.compile_s:.1f} s")
        self._step = fn
        self._cudagraphs = self.cuda and "reduce-overhead" in self.compile_mode
        self.mode = COMPILED

    def _compile(self, next_pos: int) -> Callable:
        """Compile the decode step and warm it up without disturbing the sequence.

        Warm-up calls decode the real next (token, position): they write the very K/V the real
        step writes next, and ``truncate`` rewinds caches that count their own write position.
        """
        cudagraphs = self.cuda and "reduce-overhead" in self.compile_mode
        fn = torch.compile(self.adapter.decode, mode=self.compile_mode, dynamic=False)
        tok, pos = self._tok, self._pos  # the real next input; decode never mutates them
        truncate = getattr(self.adapter, "truncate", None)
        # cudagraph trees warm up once, record on the second call, replay from the third
        for _ in range(3 if cudagraphs else 1):
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            fn(tok, pos)
            if truncate is not None:
                truncate(next_pos)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return fn

    def _selector(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """logits [1, V] -> next token [1] (greedy, or seeded temperature / top-k sampling)."""
        if self.temperature <= 0:
            return lambda logits: logits.argmax(-1)
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        temp, k = self.temperature, self.top_k

        def sample(logits: torch.Tensor) -> torch.Tensor:
            scaled = logits.float() / temp
            if k > 0:
                vals, idx = torch.topk(scaled, k, dim=-1)
                choice = torch.multinomial(torch.softmax(vals, -1), 1, generator=gen)
                return idx.gather(-1, choice).view(1)
            return torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen).view(1)

        return sample


def _param_device(adapter: DecoderAdapter) -> torch.device:
    dev = getattr(adapter, "device", None)
    if dev is not None:
        return torch.device(dev)
    module = getattr(adapter, "module", None) or getattr(adapter, "model", None)
    if isinstance(module, torch.nn.Module):
        return next(module.parameters()).device
    return torch.device("cpu")


_SIZE = r"([\d.]+ (?:[KMGT]iB|bytes))"


def _oom_message(exc: BaseException, device: torch.device, phase: str = "") -> str:
    """One line: where it happened, the memory figures, what to do.

    Figures come from the device when it still answers, else from PyTorch's own message
    ("Tried to allocate X. GPU 0 has a total capacity of T of which F is free").
    """
    gib = 1024 ** 3
    text = " ".join(str(exc).split())
    try:
        free, total = torch.cuda.mem_get_info(device)
        alloc = torch.cuda.memory_allocated(device)
        reserved = torch.cuda.memory_reserved(device)
        figures = (f"{alloc / gib:.2f} GiB allocated, {reserved / gib:.2f} GiB reserved, "
                   f"{free / gib:.2f} of {total / gib:.2f} GiB free")
    except Exception:
        cap = re.search(rf"total capacity of {_SIZE} of which {_SIZE} is free", text)
        figures = f"{cap[2]} of {cap[1]} free" if cap else "memory figures unavailable"
    asked = re.search(rf"Tried to allocate {_SIZE}", text)
    if asked:
        figures = f"tried to allocate {asked[1]}; {figures}"
    where = {"compiling": " while compiling", "prefill": " in prefill",
             "decode": " in decode"}.get(phase, "")
    return (f"CUDA out of memory{where} ({figures}); the data so far is kept: try a smaller "
            f"model, a shorter cache (--max-len) or bf16")
