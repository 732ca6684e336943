"""Compiled mode (CPU inductor, mode="default"): same tokens as eager, switches mid-run.

One compile for the whole session: the compiled step is kept on the shared adapter. These
tests compile on the engine thread (``background_compile=False``, as benchmarks do) so that
switches land on exact tokens; tests/engine/test_batch.py covers the background compile.
"""
from __future__ import annotations

import pytest

from tuiprof.engine.events import CollectingListener
from tuiprof.engine.generate import Engine

from ._helpers import ActionListener, run_engine

pytestmark = pytest.mark.slow  # the first inductor compile takes ~35 s on 2 cores (cold cache)

STEPS = 24


@pytest.fixture(scope="module")
def eager_tokens(tiny, prompt) -> list[int]:
    return run_engine(tiny.adapter, prompt, max_new_tokens=STEPS).token_ids


def test_compiled_matches_eager(tiny, prompt, eager_tokens):
    listener = run_engine(tiny.adapter, prompt, max_new_tokens=STEPS, mode="compiled",
                          background_compile=False)
    assert listener.token_ids == eager_tokens
    modes = [e.mode for e in listener.events]
    assert modes == ["eager"] + ["compiled"] * (STEPS - 1)  # prefill always runs eager
    states = [s for s, _ in listener.states]
    if "compiling" in states:  # absent when an earlier test compiled this adapter already
        assert states == ["prefill", "decode", "compiling", "decode", "done"]
        assert listener.states[3][1].startswith("compiled in ")
    assert "default" in tiny.adapter.compiled_steps


def test_mode_switch_mid_run_keeps_the_token_stream(tiny, prompt, eager_tokens):
    engine: Engine | None = None
    actions = {4: lambda: engine.request_mode("compiled"), 10: lambda: engine.request_mode("eager"),
               15: lambda: engine.request_mode("compiled")}
    listener = ActionListener(actions)
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=STEPS, listener=listener,
                    background_compile=False)
    engine.run()
    assert engine.error is None
    assert listener.token_ids == eager_tokens
    modes = [e.mode for e in listener.events]
    assert modes == ["eager"] * 5 + ["compiled"] * 6 + ["eager"] * 5 + ["compiled"] * 8
    assert [s for s, _ in listener.states].count("compiling") <= 1  # built once, then reused


def test_compiled_loop_restarts_cleanly(tiny, prompt, eager_tokens):
    listener = CollectingListener()
    engine = Engine(tiny.adapter, prompt, device="cpu", max_new_tokens=8, loop=True,
                    mode="compiled", listener=listener, background_compile=False)
    engine.start()
    while len(listener.events) < 20 and engine.alive:
        pass
    engine.stop()
    assert engine.join(30) and engine.error is None
    for cycle in (0, 1):
        assert [e.token_id for e in listener.events if e.cycle == cycle] == eager_tokens[:8]
