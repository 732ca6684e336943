"""Shared test fixtures: the real H100 recordings in ../shared/fixtures."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("TUIPROF_FIXTURES", REPO.parent / "shared" / "fixtures"))
EAGER = FIXTURES / "h100_qwen3-0.6b_eager_decode64.json.gz"
COMPILED = FIXTURES / "h100_qwen3-0.6b_compiled_decode64.json.gz"
NCU_CSV = FIXTURES / "h100_qwen3-0.6b_eager_decode_nvjet.ncu.csv"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"fixture {path} missing: shared/fixtures must sit beside the checkout")
    return path


@pytest.fixture(scope="session")
def eager_path() -> Path:
    return _need(EAGER)


@pytest.fixture(scope="session")
def compiled_path() -> Path:
    return _need(COMPILED)


@pytest.fixture(scope="session")
def ncu_csv_path() -> Path:
    return _need(NCU_CSV)


@pytest.fixture(scope="session")
def eager_raw(eager_path) -> dict:
    """The eager fixture as plain JSON, for independent computations in tests."""
    with gzip.open(eager_path) as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def compiled_raw(compiled_path) -> dict:
    with gzip.open(compiled_path) as fh:
        return json.load(fh)


def _replayed(path: Path, ring_tokens: int = 65):
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=ring_tokens)
    replay_into(load_recording(path), store)
    return store.view()


@pytest.fixture(scope="session")
def eager_view(eager_path):
    """StoreView of the eager fixture replayed through the store (all 65 tokens raw)."""
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
