"""A compile runs beside generation: the live session keeps decoding (eager, then compiled at
the old batch), the steps decoded meanwhile are marked, left untraced and kept out of the clean
statistics, and the switch lands at a token boundary without disturbing the sequence.

Real engine, profiler, store and ``torch.compile`` (CPU inductor) on qwen3-tiny. The adapter
gets a decode method of its own so that dynamo has really to compile it (a code object that no
other test compiled), however the tests are ordered.
"""
from __future__ import annotations

import time

import pytest

from tuiprof.engine.generate import Engine
from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore

from ._helpers import run_engine, wait_for

pytestmark = pytest.mark.slow  # two real compiles (a static and a dynamic-batch one)


class _FreshDecode:
    """The real adapter, with a decode step no other test has compiled."""

    def __init__(self, real) -> None:
        self._real = real
        self.vocab_size, self.max_len = real.vocab_size, real.max_len
        self.compiled_steps: dict = {}

    def __getattr__(self, name):
        return getattr(self._real, name)

    def decode(self, token, pos, cache=None, masks=None):
        return self._real.decode(token, pos, cache, masks)


def test_decoding_goes_on_while_compiling_and_those_steps_are_set_apart(tiny, prompt):
    reference = run_engine(tiny.adapter, prompt, max_new_tokens=None).token_ids
    adapter = _FreshDecode(tiny.adapter)

    def factory(clock=None, **_):
        return Engine(adapter, prompt, device="cpu", clock=clock, max_new_tokens=None, loop=True,
                      max_batch=4, info={"model": "qwen3-tiny", "device": "cpu"})

    store = SessionStore(series_len=1_000_000)   # every row stays: counted directly below
    prof = Profiler(store, ProfilerOptions(), engine_factory=factory)
    prof.start()
    try:
        wait_for(lambda: store.view(raw=False).counters["tokens"] >= 5, 60)
        prof.toggle_mode()
        wait_for(lambda: prof.status.mode == "compiled", 300)
        assert prof.change_batch(up=True) == "switching to batch 2 at the next token"
        wait_for(lambda: any(t.batch == 2 and t.mode == "compiled" and t.phase == "decode"
                             for t in store.view(raw=False, batch=2).tokens), 300)
        time.sleep(0.2)
    finally:
        prof.stop()
    assert prof.status.state == "stopped", prof.status

    one = store.view(batch=1)
    rows = [t for t in one.tokens if t.done and t.phase == "decode"]
    eager_busy = [t for t in rows if t.mode == "eager" and t.compiling]
    eager_clean = [t for t in rows if t.mode == "eager" and not t.compiling]
    compiled_busy = [t for t in rows if t.mode == "compiled" and t.compiling]
    assert eager_busy and compiled_busy      # decoding went on through both compiles
    assert not any(t.sampled for t in eager_busy + compiled_busy)   # never traced
    ts = one.token_stats[("decode", "eager")]
    assert ts["host_ms"].count == len(eager_clean)          # the clean statistics...
    assert ts["compiling_ms"].count == len(eager_busy)      # ...and the steps set apart
    assert one.token_stats[("decode", "compiled")]["compiling_ms"].count == len(compiled_busy)
    # The mode switch continued the sequence: the cycle it happened in is the eager stream,
    # token for token, eager steps first.
    switch = next(t for t in rows if t.mode == "compiled")
    cycle = [t for t in one.tokens if t.done and t.cycle == switch.cycle]
    assert [t.token_id for t in cycle] == reference[:len(cycle)]
    # eager steps first (none when the compile ended right at the cycle's start), then compiled
    modes = [t.mode for t in cycle[1:]]
    assert cycle[0].phase == "prefill" and cycle[-1].mode == "compiled"
    assert modes == sorted(modes, key=lambda m: m == "compiled"), modes

    two = store.view(batch=2)
    assert one.config_keys == [1, 2] and two.batch == 2
    assert {t.batch for t in two.tokens} == {2}
    compiled2 = [t for t in two.tokens if t.done and t.phase == "decode"]
    assert compiled2 and {t.mode for t in compiled2} == {"compiled"}
    assert not any(t.compiling for t in compiled2)
    events = [text for _s, _ts, kind, text in one.events if kind in ("batch", "mode")]
    assert events[-2:] in (["mode: compiled", "batch: 2"], ["batch: 2", "mode: compiled"])
