"""Resolving ``--model``: a registry name, a local HF directory, or a cached HF repo id."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import TuiprofError, one_line
from .model_defs import ModelDef, get_model_def, list_models, unknown_model_error

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from and what is known before building it."""

    model_def: ModelDef
    origin: str                      # "registry" | "directory" | "hf-cache"
    weights: str | None = None       # directory or file of *.safetensors; None: random weights
    tokenizer: str | None = None     # directory holding tokenizer files
    trust_remote_code: bool = False

    @property
    def name(self) -> str:
        return self.model_def.name

    @property
    def family(self) -> str:
        return self.model_def.family

    def to_json(self) -> dict:
        """Plain data (JSON): what a process started with a model needs to build it without
        resolving the name again (a compile helper, a detached session's keeper)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ModelSource":
        fields = dict(data)
        return cls(ModelDef(**fields.pop("model_def")), **fields)


def resolve_model(spec: str, trust_remote_code: bool = False) -> ModelSource:
    """Resolve ``spec``; nothing is downloaded. Raises :class:`TuiprofError` on failure.
    A session resolves ``--model`` once, in the CLI (:class:`tuiprof.spec.EngineSpec`); the
    layers below take the :class:`ModelSource`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")        # before huggingface_hub is imported:
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")  # it reads them once, at import
    path = Path(spec).expanduser()
    if path.is_dir():
        return from_directory(path, "directory", trust_remote_code)
    if spec in list_models():
        return ModelSource(get_model_def(spec), "registry", trust_remote_code=trust_remote_code)
    if _REPO_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return from_directory(_cached_snapshot(spec), "hf-cache", trust_remote_code, name=spec)
    if path.exists():
        raise TuiprofError(f"{spec} is a file; pass the directory that holds config.json")
    if os.sep in spec or spec.startswith((".", "~")):
        raise TuiprofError(f"no such model directory: {spec}")
    raise unknown_model_error(spec)


def from_directory(path: Path, origin: str, trust_remote_code: bool = False,
                   name: str | None = None) -> ModelSource:
    """A directory with a HF ``config.json``, ``*.safetensors`` weights and a tokenizer if any."""
    from .families import family_for_model_type

    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise TuiprofError(f"{path} has no config.json (expected a Hugging Face model directory)")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TuiprofError(f"{cfg_path} is not valid JSON: {one_line(exc, 80)}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise TuiprofError(f"{cfg_path} has no 'model_type'; is it a Hugging Face config.json?")
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    weights = str(path) if any(path.glob("*.safetensors")) else None
    if weights is None and any(path.glob("*.bin")):
        raise TuiprofError(f"{path} has only pickle (*.bin) weights; tuiprof loads safetensors "
                           f"only (convert them, or remove them to run with random weights)")
    tokenizer = str(path) if any((path / f).is_file() for f in TOKENIZER_FILES) else None
    defn = ModelDef(name=name or path.resolve().name,
                    family=family_for_model_type(config["model_type"]),
                    description=f"config.json from {path}", dtype=dtype, config=config,
                    path=str(path))
    return ModelSource(defn, origin, weights, tokenizer, trust_remote_code)


def _cached_snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=repo_id, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError and friends), or hub missing
        known = ", ".join(list_models())
        raise TuiprofError(f"'{repo_id}' is not in the local Hugging Face cache and tuiprof never "
                           f"downloads; fetch it first (huggingface-cli download {repo_id}) or use "
                           f"a registry model: {known}") from None
