"""An eager step on the engine thread while torch.fx traces on another thread (a compile)."""
import threading

import pytest
import torch

from tuiprof.engine.generate import beside_compile


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
