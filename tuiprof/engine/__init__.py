"""Model engine: model definitions, model resolution, decoder adapters and the generation thread.

Importing this package is cheap (no torch); the heavy modules load on first use of a name.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "generate",
    "load_engine": "load",
    "load_model": "load",
    "TokenEvent": "events",
    "EngineListener": "events",
    "DecoderAdapter": "adapter",
    "resolve_model": "source",
    "ModelSource": "source",
    "list_models": "model_defs",
    "get_model_def": "model_defs",
    "ModelDef": "model_defs",
    "get_family": "families",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
