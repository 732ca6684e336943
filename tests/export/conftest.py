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
def both_modes_view(eager_path, compiled_path):
    """Both recordings replayed into one store (compiled was recorded after eager)."""
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=8)
    replay_into(load_recording(eager_path), store)
    replay_into(load_recording(compiled_path), store)
    return store.view()
