"""Views shared by the export tests (replays are the slow part: do each once)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def eager_view64(eager_path):
    """The eager recording with a 64-token ring: the prefill token is outside the raw window."""
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=64)
    replay_into(load_recording(eager_path), store)
    return store.view()


@pytest.fixture(scope="session")
def no_api_view(compiled_path):
    """The compiled recording without its API records (a session with CUPTI's API kinds off)."""
    import dataclasses

    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    rec = load_recording(compiled_path)
    rec = dataclasses.replace(rec, records=[r for r in rec.records if r[0] != "R"])
    store = SessionStore()
    replay_into(rec, store)
    return store.view()


@pytest.fixture(scope="session")
def both_modes_view(eager_path, compiled_path):
    """Both recordings replayed into one store (compiled was recorded after eager)."""
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=8)
    replay_into(load_recording(eager_path), store)
    replay_into(load_recording(compiled_path), store)
    return store.view()
