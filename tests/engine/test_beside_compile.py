"""An eager step on the engine thread while torch.fx traces on another thread (a compile)."""
import threading

import pytest
import torch

from tuiprof.engine.compile_support import beside_compile


def test_an_eager_step_survives_fx_tracing_on_another_thread():
    """fx's symbolic tracer patches ``nn.Module.__call__`` for every thread while it traces (an
    H100 session's eager step failed with its NameError during the compile's first minute); the
    step is repeated once the patch is gone, and gives the same result."""
    inside, release = threading.Event(), threading.Event()

    class Blocking(torch.nn.Module):
        def forward(self, x):
            inside.set()
            release.wait(5)   # holds the tracer (and its patch) open
            return x + 1

    tracer = threading.Thread(target=lambda: torch.fx.symbolic_trace(Blocking()))
    tracer.start()
    assert inside.wait(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    x = torch.ones(1, 4)
    try:
        with pytest.raises(NameError, match="not installed as a submodule"):
            model(x)   # the patch is real: a plain eager call fails while it lasts
        threading.Timer(0.05, release.set).start()
        out = beside_compile(model, x)
    finally:
        release.set()
        tracer.join(5)
    assert torch.equal(out, model(x))


def test_other_errors_are_not_retried():
    calls = []

    def fails():
        calls.append(1)
        raise NameError("name 'x' is not defined")

    with pytest.raises(NameError):
        beside_compile(fails)
    assert len(calls) == 1


def test_the_gil_switch_interval_is_restored_when_the_engine_stops_mid_compile(tiny, prompt):
    """A background compile shortens the process's GIL switch interval; an engine stopped
    before the compile ended left it short for the rest of the process (every thread of an
    --in-process app or a sweep paid for the extra switches). The compile here is a step that
    blocks until released, standing in for a long torch.compile."""
    import sys

    from tuiprof.engine.compile_support import COMPILE_SWITCH_INTERVAL_S, CompiledStep
    from tuiprof.engine.generate import Engine

    from ._helpers import wait_for

    release = threading.Event()

    def slow_compile(tok, pos, cache, masks=None):
        release.wait(30)
        return tiny.adapter.decode(tok, pos, cache, masks)

    class OwnSteps:   # the real adapter with compiled steps of its own (not shared)
        compiled_steps: dict = {}

        def __getattr__(self, name):
            return getattr(tiny.adapter, name)

    adapter = OwnSteps()
    before = sys.getswitchinterval()
    engine = Engine(adapter, prompt, device="cpu", max_new_tokens=None, loop=True, max_batch=1)
    adapter.compiled_steps[engine.compile_mode] = CompiledStep(slow_compile)
    engine.start()
    try:
        engine.request_mode("compiled")
        wait_for(lambda: sys.getswitchinterval() < 2 * COMPILE_SWITCH_INTERVAL_S, 30)
        assert engine._compiling            # still compiling: the step blocks
        engine.stop()
        assert engine.join(30)
        assert sys.getswitchinterval() == pytest.approx(before)
    finally:
        engine.stop()
        release.set()
        engine.join(30)
        sys.setswitchinterval(before)


def test_a_repeated_step_rewinds_a_cache_that_counts_its_own_position(tiny, prompt):
    """transformers' StaticLayer moves its own write counter on in each layer's update: a step
    that failed on fx's patch after its layers ran, then repeated, wrote one slot further, and
    the cycle's last step ran past the cache (``index_copy_(): index 64 is out of bounds``,
    seen when a cold compile took 20 s on the CI CPU). Here the patch hits every 7th eager step
    after the whole forward ran, while a compile is held open; the cycles decode the reference
    tokens and never run past the cache."""
    from tuiprof.engine.compile_support import FX_PATCHED, CompiledStep
    from tuiprof.engine.generate import Engine
    from tuiprof.engine.events import CollectingListener

    from ._helpers import run_engine, wait_for

    reference = run_engine(tiny.adapter, prompt).token_ids
    release = threading.Event()
    calls = []

    def held_compile(tok, pos, cache, masks=None):
        release.wait(60)
        return tiny.adapter.decode(tok, pos, cache, masks)

    class Patched:   # the real adapter, its eager step hit by fx's patch now and then
        compiled_steps: dict = {}

        def __getattr__(self, name):
            return getattr(tiny.adapter, name)

        def decode(self, tok, pos, cache=None, masks=None):
            out = tiny.adapter.decode(tok, pos, cache, masks)
            calls.append(1)
            if len(calls) % 7 == 0:
                raise NameError(f"Module 'x' {FX_PATCHED}")
            return out

    adapter = Patched()
    listener = CollectingListener()
    engine = Engine(adapter, prompt, device="cpu", max_new_tokens=None, loop=True, max_batch=1,
                    listener=listener)
    adapter.compiled_steps[engine.compile_mode] = CompiledStep(held_compile)
    engine.start()
    try:
        engine.request_mode("compiled")
        wait_for(lambda: engine.cycle >= 3 or engine.error is not None, 60)
        assert engine._compiling      # every step so far decoded beside the held compile
    finally:
        engine.stop()
        release.set()
        assert engine.join(60)
    assert engine.error is None, engine.error
    n = len(reference)
    cycles = [listener.token_ids[i:i + n] for i in range(0, 3 * n, n)]
    assert cycles == [reference] * 3
