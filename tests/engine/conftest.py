"""Engine test fixtures: qwen3-tiny on the CPU, built once per session."""
from __future__ import annotations

import pytest

MAX_LEN = 64
PROMPT_LEN = 8


@pytest.fixture(scope="session")
def tiny():
    """A LoadedModel of qwen3-tiny (float32, CPU, seed 0, cache of 64 positions)."""
    from tuiprof.engine.load import load_model

    return load_model("qwen3-tiny", device="cpu", seed=0, max_len=MAX_LEN)


@pytest.fixture(scope="session")
def prompt(tiny):
    from tuiprof.engine.load import prompt_ids

    ids, _ = prompt_ids(tiny, None, PROMPT_LEN, seed=0)
    return ids
