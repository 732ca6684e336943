"""CUDA out of memory in prefill, decode and compilation, on the real qwen3-tiny session.

A CPU cannot run out of CUDA memory, so the OOM is injected: the real adapter is wrapped and one
step raises ``torch.cuda.OutOfMemoryError`` with PyTorch's own message text (the only test
double here). Everything else is the real Profiler, store and snapshot. Expected: the run stops
with state "error" and a one-line message with the memory figures, the tokens measured before
it are kept (store and snapshot), and a new session in the same process runs normally.
"""
from __future__ import annotations

import time

import pytest
import torch

from tuiprof.engine.generate import Engine
from tuiprof.export.snapshot import read_snapshot, write_snapshot
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore

# What PyTorch's caching allocator says (c10/cuda/CUDACachingAllocator.cpp), on one line.
TORCH_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process "
             "has 78.12 GiB memory in use.")
FIGURES = "tried to allocate 2.00 GiB; 1.06 GiB of 79.19 GiB free"


class OomAdapter:
    """The real adapter; the ``n``-th prefill or decode call raises a CUDA OOM instead."""

    def __init__(self, real, prefill_oom_at: int | None = None, decode_oom_at: int | None = None):
        self._real = real
        self.vocab_size, self.max_len = real.vocab_size, real.max_len
        self.compiled_steps: dict = {}          # never share a compiled step with other tests
        self.prefill_oom_at, self.decode_oom_at = prefill_oom_at, decode_oom_at
        self.prefills = self.decodes = 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def reset_cache(self, cache=None):
        self._real.reset_cache(cache)

    def prefill(self, ids, cache=None):
        self.prefills += 1
        if self.prefills == self.prefill_oom_at:
            raise torch.cuda.OutOfMemoryError(TORCH_OOM)
        return self._real.prefill(ids, cache)

    def decode(self, tok, pos, cache=None, masks=None):
        self.decodes += 1
        if self.decodes == self.decode_oom_at:
            raise torch.cuda.OutOfMemoryError(TORCH_OOM)
        return self._real.decode(tok, pos, cache, masks)


def _session(adapter, prompt, **engine_kw):
    """A live Profiler (all collectors asked for; they degrade on this CPU) over ``adapter``."""
    def factory(clock=None, **_):
        return Engine(adapter, prompt, device="cpu", clock=clock,
                      info={"model": "qwen3-tiny", "device": "cpu"}, **engine_kw)

    store = SessionStore(ring_tokens=64)
    prof = Profiler(store, ProfilerOptions(), engine_factory=factory)
    prof.start()
    return prof, store


def _finish(prof, timeout=60.0):
    assert prof.wait(timeout), "the session did not end"
    prof.stop()


def _check_oom(prof, store, tmp_path, where: str, kept: int):
    st = prof.status
    assert st.state == "error"
    msg = st.message
    assert msg.startswith(f"CUDA out of memory {where} ({FIGURES})"), msg
    assert "\n" not in msg and "Traceback" not in msg and "--max-len" in msg
    view = store.view()
    done = [t for t in view.tokens if t.done]
    assert len(done) == kept
    assert any(msg in str(e) for e in view.events)      # the event log has it too
    path = write_snapshot(view, tmp_path / "after-oom.json")
    back = read_snapshot(path)
    assert [t.token_id for t in back.tokens if t.done] == [t.token_id for t in done]
    assert any(msg in str(e) for e in back.events)
    return msg


def _start_again(tiny_loaded, tiny_prompt):
    """The user changes settings and goes on: a new session in the same process works."""
    prof, store = _session(tiny_loaded.adapter, tiny_prompt, max_new_tokens=6)
    _finish(prof)
    assert prof.status.state == "stopped" or prof.status.state == "done", prof.status
    assert sum(t.done for t in store.view().tokens) == 6


def test_oom_in_prefill(tiny_loaded, tiny_prompt, tmp_path):
    # The second cycle's prefill fails, so the first cycle's 6 tokens must survive it.
    adapter = OomAdapter(tiny_loaded.adapter, prefill_oom_at=2)
    prof, store = _session(adapter, tiny_prompt, max_new_tokens=6, loop=True)
    _finish(prof)
    msg = _check_oom(prof, store, tmp_path, "in prefill", kept=6)
    print(msg)
    _start_again(tiny_loaded, tiny_prompt)


def test_oom_in_decode(tiny_loaded, tiny_prompt, tmp_path):
    adapter = OomAdapter(tiny_loaded.adapter, decode_oom_at=5)
    prof, store = _session(adapter, tiny_prompt, max_new_tokens=20)
    _finish(prof)
    msg = _check_oom(prof, store, tmp_path, "in decode", kept=1 + 4)
    print(msg)
    _start_again(tiny_loaded, tiny_prompt)


def test_oom_while_compiling_keeps_decoding(tiny_loaded, tiny_prompt, tmp_path, monkeypatch):
    """The compiled step's first call (on the compile worker, where inductor and CUDA graphs
    allocate) runs out: one line, and the session goes on decoding in eager mode."""
    def compile_that_ooms(fn, **kw):
        def compiled(*a, **k):
            raise torch.cuda.OutOfMemoryError(TORCH_OOM)
        return compiled

    prof, store = _session(OomAdapter(tiny_loaded.adapter), tiny_prompt, max_new_tokens=40,
                           loop=True)
    end = time.monotonic() + 30
    while sum(t.done for t in store.view().tokens) < 4 and time.monotonic() < end:
        time.sleep(0.01)
    monkeypatch.setattr(torch, "compile", compile_that_ooms)
    assert prof.toggle_mode() == "switching to compiled at the next token"
    end = time.monotonic() + 30
    while "out of memory" not in prof.status.message and time.monotonic() < end:
        time.sleep(0.01)
    msg = prof.status.message
    assert msg.startswith(f"out of memory while compiling for batch 1 ({FIGURES}); staying in "
                          f"eager at batch 1"), msg
    assert "\n" not in msg and "Traceback" not in msg
    before = sum(t.done for t in store.view().tokens)
    end = time.monotonic() + 30
    while sum(t.done for t in store.view().tokens) < before + 5 and time.monotonic() < end:
        time.sleep(0.01)
    prof.stop()
    view = store.view()
    assert prof.status.state == "stopped" and prof.status.mode == "eager"
    assert sum(t.done for t in view.tokens) >= before + 5        # still decoding after it
    assert {t.mode for t in view.tokens} == {"eager"}
    assert any(msg in str(e) for e in view.events)
    back = read_snapshot(write_snapshot(view, tmp_path / "after-compile-oom.json"))
    assert any(msg in str(e) for e in back.events)
    print(msg)
    monkeypatch.undo()


def test_oom_message_without_figures_still_one_line():
    from tuiprof.engine.generate import _oom_message

    msg = _oom_message(torch.cuda.OutOfMemoryError("CUDA error: out of memory\nmore"),
                       torch.device("cpu"), "decode")
    assert msg.startswith("CUDA out of memory in decode (memory figures unavailable)")
    assert "\n" not in msg


@pytest.mark.parametrize("text", ["", "x" * 100_000, "Tried to allocate 1e999 GiB"])
def test_oom_message_is_bounded(text):
    from tuiprof.engine.generate import _oom_message

    msg = _oom_message(torch.cuda.OutOfMemoryError(text), torch.device("cpu"))
    assert len(msg) < 300 and "\n" not in msg
