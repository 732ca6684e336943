"""The model definitions: ``models/<name>.json``, one model per file, data only.

A file is ``{"name", "family", "description", "dtype", "config": {...HF config fields...},
"study": "...optional"}``. The directory is ``$TUIPROF_MODELS_DIR``, else the package's
``models_data`` where a wheel put it (the build maps the checkout's ``models/`` there), else the
checkout's ``models/`` beside the package (a source checkout or an editable install).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuiprofError, safe_text

REQUIRED_KEYS = {"name": str, "family": str, "description": str, "dtype": str, "config": dict}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class ModelDef:
    """One registry entry."""

    name: str
    family: str
    description: str
    dtype: str
    config: dict
    study: str = ""
    path: str = ""
    extra: dict = field(default_factory=dict)


def models_dir() -> Path:
    """Where the registry lives: ``$TUIPROF_MODELS_DIR``, an installed wheel's ``models_data``,
    else the checkout's ``models/``."""
    env = os.environ.get("TUIPROF_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    return _models_dir(Path(__file__).resolve().parents[1])


def _models_dir(package: Path) -> Path:
    # A wheel's models_data holds the definitions; a folder of that name without any (left
    # behind in a checkout by an older layout, its __pycache__ say) is not one, or every
    # model would read as unknown.
    installed = package / "models_data"
    if installed.is_dir() and any(installed.glob("*.json")):
        return installed
    return package.parent / "models"


def list_models() -> list[str]:
    """Names of the registered models, sorted."""
    d = models_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json"))


def unknown_model_error(name: str) -> TuiprofError:
    known = ", ".join(list_models()) or "none"
    return TuiprofError(f"unknown model '{name}'; known: {known} (or pass a directory with "
                        f"config.json, or a cached Hugging Face repo id)")


def get_model_def(name: str) -> ModelDef:
    """The registry entry ``name``; raises :class:`TuiprofError` if unknown or malformed."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise unknown_model_error(name)
    path = models_dir() / f"{name}.json"
    if not path.is_file():
        raise unknown_model_error(name)
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TuiprofError(f"registry file {path} is not valid JSON: {safe_text(exc, 80)}") from None
    return model_def_from_dict(obj, str(path))


def model_def_from_dict(obj: object, where: str) -> ModelDef:
    """Validate a decoded registry file."""
    if not isinstance(obj, dict):
        raise TuiprofError(f"{where}: expected a JSON object")
    for key, typ in REQUIRED_KEYS.items():
        if not isinstance(obj.get(key), typ):
            raise TuiprofError(f"{where}: missing or malformed '{key}' (expected {typ.__name__})")
    if obj["dtype"] not in DTYPE_BYTES:
        raise TuiprofError(f"{where}: dtype '{safe_text(obj['dtype'], 40)}' is not one of {', '.join(DTYPE_BYTES)}")
    study = obj.get("study", "")
    extra = {k: v for k, v in obj.items() if k not in REQUIRED_KEYS and k != "study"}
    return ModelDef(obj["name"], obj["family"], obj["description"], obj["dtype"],
                    obj["config"], study if isinstance(study, str) else "", where, extra)


def param_count(defn: ModelDef) -> int:
    """Closed-form parameter count from the config (no model is built); tied weights once."""
    from .families import get_family

    return int(get_family(defn.family).param_count(defn.config))


def embedding_params(defn: ModelDef) -> int | None:
    """Parameters in embeddings and LM head, when the family knows (None otherwise)."""
    from .families import get_family

    fn = getattr(get_family(defn.family), "embedding_params", None)
    return int(fn(defn.config)) if fn is not None else None


def weight_bytes(defn: ModelDef, dtype: str | None = None) -> int:
    """Bytes of the weights in ``dtype`` (by default the entry's dtype, bf16 for qwen3)."""
    dt = dtype or defn.dtype
    if dt not in DTYPE_BYTES:
        raise TuiprofError(f"unknown dtype '{dt}'; use one of {', '.join(DTYPE_BYTES)}")
    return param_count(defn) * DTYPE_BYTES[dt]
