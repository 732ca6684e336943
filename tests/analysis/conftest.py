"""Analysis fixtures: each H100 recording replayed once per test session."""
from __future__ import annotations

from pathlib import Path

import pytest
from recordings import COMPILED, EAGER, need, raw

from tuiprof.collect.replay import load_recording, replay_into
from tuiprof.store import SessionStore


def _view(path: Path):
    need(path)
    s = SessionStore()
    replay_into(load_recording(path), s)
    return s.view()


@pytest.fixture(autouse=True)
def kernel_times_not_measured(monkeypatch):
    """The analysis as it reads before the per-kernel cost of tracing is filled in
    (analysis.tracing.DURATION_INFLATION_NS): the figures here are checked against independent
    reads of CUPTI's records; test_tracing.py sets a constant where it tests the correction."""
    from tuiprof.analysis import tracing

    monkeypatch.setattr(tracing, "DURATION_INFLATION_NS", {"stream": None, "graph": None})


@pytest.fixture(scope="session")
def eager_view():
    return _view(EAGER)


@pytest.fixture(scope="session")
def compiled_view():
    return _view(COMPILED)


@pytest.fixture(scope="session")
def eager_json():
    return raw(EAGER)


@pytest.fixture(scope="session")
def compiled_json():
    return raw(COMPILED)
