"""Helpers of the workload tests (CPU, tiny variants), in a module of their own: test files
import them from here, not from ``conftest`` (several test folders have a ``conftest``
module, and running them in one pytest call leaves only the last one importable as
``conftest``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TINY = ["llama-layer-tiny", "nanochat-tiny", "gpt2-tiny", "deepseek-tiny"]


def build_tiny(name: str, *, seed: int = 0, weights: str | None = None, **overrides):
    """Build a tiny registry model on CPU in float32 through the engine's family loader."""
    from tuiprof.engine.families import get_family
    from tuiprof.engine.model_defs import get_model_def

    defn = get_model_def(name)
    if overrides:
        defn = {"name": defn.name, "family": defn.family, "dtype": defn.dtype,
                "config": {**defn.config, **overrides}}
        family = defn["family"]
    else:
        family = defn.family
    return get_family(family).build(defn, device="cpu", dtype="float32", seed=seed, weights=weights)
