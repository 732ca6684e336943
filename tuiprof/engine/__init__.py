"""Model engine: model definitions, model resolution, decoder adapters and the generation thread.

Importing this package is cheap (no torch); the heavy modules load on first use of a name.
"""
from __future__ import annotations

from .._lazy import lazy_face

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

__all__, __getattr__ = lazy_face(__name__, _EXPORTS)
