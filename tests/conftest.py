"""Shared test fixtures: the real H100 recordings in tests/data (tests/recordings.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from recordings import COMPILED, EAGER, NCU_CSV, facts, need, raw


@pytest.fixture(scope="session")
def eager_path() -> Path:
    return need(EAGER)


@pytest.fixture(scope="session")
def compiled_path() -> Path:
    return need(COMPILED)


@pytest.fixture(scope="session")
def ncu_csv_path() -> Path:
    return need(NCU_CSV)


@pytest.fixture(scope="session")
def eager_raw(eager_path) -> dict:
    """The eager recording as plain JSON, for independent computations in tests."""
    return raw(eager_path)


@pytest.fixture(scope="session")
def compiled_raw(compiled_path) -> dict:
    return raw(compiled_path)


@pytest.fixture(scope="session")
def eager_facts(eager_path):
    """What the eager recording holds, counted from its JSON (``recordings.Facts``)."""
    return facts(eager_path)


@pytest.fixture(scope="session")
def compiled_facts(compiled_path):
    return facts(compiled_path)


def _replayed(path: Path, ring_tokens: int | None = None):
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=ring_tokens or facts(path).tokens)
    replay_into(load_recording(path), store)
    return store.view()


@pytest.fixture(scope="session")
def eager_view(eager_path):
    """StoreView of the eager recording replayed through the store (every token raw)."""
    return _replayed(eager_path)


@pytest.fixture(scope="session")
def compiled_view(compiled_path):
    return _replayed(compiled_path)


@pytest.fixture(autouse=True)
def _no_process_left_running():
    """A test must end the processes it started: one left running (a session process whose
    test failed before closing it) kept pytest waiting at exit until CI's time ran out. It is
    killed here and the test fails, naming it."""
    import multiprocessing as mp

    before = {p.pid for p in mp.active_children()}
    yield
    left = [p for p in mp.active_children() if p.pid not in before]
    if not left:
        return
    for p in left:
        p.join(10)      # a process told to end may still be writing its last data
    left = [p for p in left if p.is_alive()]
    for p in left:
        p.kill()
        p.join(5)
    assert not left, f"test left processes running: {[p.name for p in left]}"


# The long end-to-end files (a real server under an external client's load, two nodes of
# torchrun, a real Prometheus scraping, the compile helper's real compiles, a wheel built and
# installed): each takes a minute or more on 2 CPU cores, so the
# README's test command (CI's first job, kept under 10 minutes) leaves them to CI's second job
# (`-m system`, before the vLLM tests). Named here, in one place, rather than in each file.
SYSTEM_FILES = {
    "tests/serving/test_serve_external.py",
    "tests/serving/test_proxy_transformers.py",
    "tests/serving/test_before_the_app.py",
    "tests/serving/test_transformers_serve.py",
    "tests/sessions/test_fleet.py",
    "tests/export/test_prometheus.py",
    "tests/engine/test_compile_helper.py",
    "tests/engine/test_precompiled_engine.py",
    "tests/engine/test_precompile_parity.py",
    "tests/sessions/test_torchrun.py",
    "tests/test_wheel.py",
}
_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(_ROOT).as_posix()
        except ValueError:
            continue
        if rel in SYSTEM_FILES:
            item.add_marker(pytest.mark.system)
