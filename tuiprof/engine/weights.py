"""Loading ``*.safetensors`` weights into a built model (never pickle)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..errors import TuiprofError, one_line, safe_text


def safetensors_files(path: str | Path) -> list[Path]:
    """``path`` itself, or every ``*.safetensors`` of the directory ``path``, sorted."""
    p = Path(path).expanduser()
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not files[0].exists():
        raise TuiprofError(f"no *.safetensors weights at {p}")
    return files


def load_safetensors(model: torch.nn.Module, files: Sequence[str | Path], device: torch.device) -> None:
    """Copy the tensors of ``files`` into ``model``; every parameter must be covered.

    Parameters tied to a loaded one (``lm_head`` with tied embeddings) count as covered.
    """
    from safetensors.torch import load_file

    state = model.state_dict()
    loaded: set[str] = set()
    unexpected: list[str] = []
    for f in files:
        try:
            tensors = load_file(str(f), device=str(device))
        except Exception as exc:  # SafetensorsError is not importable in every version
            raise TuiprofError(f"cannot read weights {f}: {one_line(exc, 120)}") from None
        for key, t in tensors.items():
            dst = state.get(key)
            if dst is None:
                unexpected.append(key)
                continue
            if tuple(dst.shape) != tuple(t.shape):
                raise TuiprofError(f"weights {Path(f).name}: '{safe_text(key)}' has shape {tuple(t.shape)}, "
                                   f"the model expects {tuple(dst.shape)}; wrong config.json?")
            with torch.no_grad():
                dst.copy_(t)
            loaded.add(key)
    if unexpected:
        raise TuiprofError(f"weights do not match the model: unexpected tensors "
                           f"{safe_text(', '.join(unexpected[:3]), 200)}{' ...' if len(unexpected) > 3 else ''}")
    loaded_ptrs = {state[k].data_ptr() for k in loaded}
    missing = [k for k, v in state.items() if k not in loaded and v.data_ptr() not in loaded_ptrs
               and not _is_buffer(model, k)]
    if missing:
        raise TuiprofError(f"weights do not cover the model: missing {', '.join(missing[:3])}"
                           f"{' ...' if len(missing) > 3 else ''}")


def _is_buffer(model: torch.nn.Module, key: str) -> bool:
    mod_name, _, attr = key.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    return attr in mod._buffers
