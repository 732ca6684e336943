"""Model families: one module per family, ``tuiprof/engine/families/<family>.py``, imported lazily.

A family module provides:

* ``param_count(config: Mapping) -> int``: closed form from the config, nothing built, tied
  weights counted once (optionally ``embedding_params(config) -> int`` too);
* ``build(model_def, *, device, dtype, seed, weights=None, **options) -> DecoderAdapter``:
  ``model_def`` is a :class:`~tuiprof.engine.model_defs.ModelDef` (or a dict of its fields);
  without ``weights`` the weights are random from ``seed`` and created on ``device`` in
  ``dtype``; ``weights`` is a ``*.safetensors`` file or a directory of them, loaded strictly
  with safetensors (never pickle). Options a family may accept (the loader passes only those
  its ``build`` names): ``max_len`` (static cache length), ``trust_remote_code``;
* optionally ``preload() -> None``: import the heavy modules ``build`` needs (transformers),
  so that start-up times them as a phase of their own while the CUDA context is created.

The ``hf`` family handles any Hugging Face causal LM whose ``model_type`` has no family here.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

from ...errors import TuiprofError

GENERIC = "hf"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def available_families() -> list[str]:
    """Names of the family modules shipped in this package."""
    here = Path(__file__).parent
    return sorted(p.stem for p in here.glob("*.py") if not p.stem.startswith("_"))


def get_family(name: str) -> ModuleType:
    """The family module ``name``; raises :class:`TuiprofError` if there is none."""
    if not _NAME.match(name or "") or name not in available_families():
        raise TuiprofError(f"unknown model family '{name}'; known: {', '.join(available_families())}")
    return importlib.import_module(f"{__name__}.{name}")


def family_for_model_type(model_type: str) -> str:
    """The family for an HF ``model_type`` (``qwen3`` -> ``qwen3``), else the generic ``hf``."""
    mt = (model_type or "").replace("-", "_")
    return mt if mt != GENERIC and mt in available_families() else GENERIC
