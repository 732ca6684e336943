"""Shared helpers for the workload tests (CPU, tiny variants)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: threads only contend on the 2-core CI machine

TINY = ["llama-layer-tiny", "nanochat-tiny", "gpt2-tiny", "deepseek-tiny"]


def build_tiny(name: str, *, seed: int = 0, weights: str | None = None, **overrides):
    """Build a tiny registry model on CPU in float32 through the engine's family loader."""
    from tuiprof.engine.families import get_family
    from tuiprof.engine.registry import get_model_def

    defn = get_model_def(name)
    if overrides:
        defn = {"name": defn.name, "family": defn.family, "dtype": defn.dtype,
                "config": {**defn.config, **overrides}}
        family = defn["family"]
    else:
        family = defn.family
    return get_family(family).build(defn, device="cpu", dtype="float32", seed=seed, weights=weights)


@pytest.fixture(autouse=True)
def _single_thread_determinism():
    import torch

    torch.manual_seed(0)
    yield
