"""A torch.compile that fails is not fatal: one line, and generation goes on in eager mode.

``torch.compile`` is monkeypatched to fail the way real failures do (the backend raising on the
first call of the compiled step, or ``torch.compile`` itself raising); the model, engine,
profiler and store are real (qwen3-tiny on the CPU). The token stream must be exactly the eager
one: a failed warm-up must not disturb the KV cache or the position.

A compile the user cancels (Ctrl-C while compiling) is in test_signals.py: a running compile
cannot be interrupted, the session's data is written and the process ends without waiting.
"""
from __future__ import annotations

import pytest
import torch

from tuiprof.engine.events import CollectingListener
from tuiprof.engine.generate import Engine
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore

STEPS = 16


class _Fresh:
    """The real adapter with its own (empty) store of compiled steps."""

    def __init__(self, real):
        self._real = real
        self.vocab_size, self.max_len = real.vocab_size, real.max_len
        self.compiled_steps: dict = {}

    def __getattr__(self, name):
        return getattr(self._real, name)


def _backend_fails(fn, **kw):
    def compiled(*a, **k):
        raise RuntimeError("backend='inductor' raised:\nCppCompileError: C++ compile error\n...")
    return compiled


def _compile_raises(fn, **kw):
    raise RuntimeError("Dynamo is not supported on Python 3.99+")


@pytest.fixture(scope="module")
def eager_ids(tiny_loaded, tiny_prompt):
    listener = CollectingListener()
    Engine(tiny_loaded.adapter, tiny_prompt, device="cpu", max_new_tokens=STEPS,
           listener=listener).run()
    return listener.token_ids


@pytest.mark.parametrize("broken", [_backend_fails, _compile_raises], ids=["first-call", "compile"])
def test_compile_failure_continues_in_eager(tiny_loaded, tiny_prompt, eager_ids, broken,
                                            monkeypatch):
    monkeypatch.setattr(torch, "compile", broken)
    listener = CollectingListener()
    engine = Engine(_Fresh(tiny_loaded.adapter), tiny_prompt, device="cpu",
                    max_new_tokens=STEPS, mode="compiled", listener=listener)
    engine.run()
    assert engine.error is None and engine.state == "done"
    assert listener.token_ids == eager_ids            # the sequence is intact
    assert {e.mode for e in listener.events} == {"eager"}
    failed = [m for s, m in listener.states if m.startswith("compile failed")]
    assert len(failed) == 1, listener.states           # tried once, not at every token
    assert failed[0].endswith("continuing in eager mode") and "\n" not in failed[0]
    print(failed[0])


def test_compile_failure_in_a_live_session_is_logged(tiny_loaded, tiny_prompt, monkeypatch,
                                                      tmp_path):
    monkeypatch.setattr(torch, "compile", _backend_fails)

    def factory(clock=None, **_):
        return Engine(_Fresh(tiny_loaded.adapter), tiny_prompt, device="cpu", clock=clock,
                      max_new_tokens=STEPS, mode="compiled",
                      info={"model": "qwen3-tiny", "device": "cpu"})

    store = SessionStore()
    prof = Profiler(store, ProfilerOptions(), engine_factory=factory)
    prof.start()
    assert prof.wait(60)
    prof.stop()
    assert prof.status.state in ("done", "stopped")
    assert prof.status.mode == "eager"
    view = store.view()
    assert sum(t.done for t in view.tokens) == STEPS
    errors = [e for e in view.events if "compile failed" in str(e)]
    assert len(errors) == 1
    from tuiprof.export.snapshot import read_snapshot, write_snapshot

    back = read_snapshot(write_snapshot(view, tmp_path / "s.json"))
    assert any("compile failed" in str(e) for e in back.events)
