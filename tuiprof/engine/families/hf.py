"""Any Hugging Face causal LM (``AutoModelForCausalLM``) without a dedicated family."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ...errors import TuiprofError, one_line, safe_text
from ..hf_adapter import HFDecoderAdapter, as_dtype, config_dict, resolve_max_len


def param_count(config: Mapping[str, Any]) -> int:
    """Counted on the meta device (no memory, no init): there is no closed form here."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config(config))
    return sum(p.numel() for p in model.parameters())


def preload() -> None:
    """Import transformers' auto classes (seconds), timed and overlapped at start-up, its
    import structure from tuiprof's cache (:mod:`tuiprof.engine.imports`)."""
    from ..imports import kept_structure

    with kept_structure():
        from transformers import AutoModelForCausalLM  # noqa: F401


def build(model_def: Any, *, device: torch.device | str, dtype: torch.dtype | str, seed: int,
          weights: str | None = None, max_len: int | None = None,
          trust_remote_code: bool = False) -> HFDecoderAdapter:
    """Random weights from the config, or ``from_pretrained`` of the ``weights`` directory
    (local files and safetensors only)."""
    from transformers import AutoModelForCausalLM

    config = config_dict(model_def)
    dt = as_dtype(dtype)
    try:
        if weights:
            model = AutoModelForCausalLM.from_pretrained(
                str(Path(weights)), local_files_only=True, use_safetensors=True, dtype=dt,
                trust_remote_code=trust_remote_code).to(device)
        else:
            torch.manual_seed(seed)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(_config(config), dtype=dt,
                                                         trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        hint = "" if trust_remote_code else " (custom model code needs --trust-remote-code)"
        raise TuiprofError(f"cannot build model type '{safe_text(config.get('model_type'), 40)}': "
                           f"{one_line(exc, 140)}{hint}") from None
    model.eval().requires_grad_(False)
    return HFDecoderAdapter(model, resolve_max_len(config, max_len))


def _config(config: Mapping[str, Any]) -> object:
    from ..hf_adapter import hf_config

    try:
        return hf_config(config)
    except (KeyError, ValueError) as exc:
        raise TuiprofError(f"config.json: model type '{safe_text(config.get('model_type'), 40)}' is unknown to "
                           f"this transformers ({one_line(exc, 80)})") from None
