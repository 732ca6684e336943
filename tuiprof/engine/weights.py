"""Loading ``*.safetensors`` weights into a built model (never pickle)."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from ..errors import TuiprofError, one_line, safe_text
from ..startup import advance, phase


def safetensors_files(path: str | Path) -> list[Path]:
    """``path`` itself, or every ``*.safetensors`` of the directory ``path``, sorted."""
    p = Path(path).expanduser()
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not files[0].exists():
        raise TuiprofError(f"no *.safetensors weights at {p}")
    return files


def data_bytes(files: Sequence[str | Path]) -> int:
    """Bytes of tensor data in safetensors ``files`` (file size less the JSON header)."""
    total = 0
    for f in files:
        try:
            size = Path(f).stat().st_size
            with open(f, "rb") as fh:
                header = struct.unpack("<Q", fh.read(8))[0]
            total += size - 8 - header if 0 <= header <= size - 8 else size
        except (OSError, struct.error):
            pass  # unreadable: reading it says why
    return total


def read_safetensors(files: Sequence[str | Path], device: str,
                     error: Callable[[Path, str], Exception]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """``(file, key, tensor)`` for every tensor of ``files``, read one at a time (never pickle).

    Reports phase ``loading weights`` with the bytes read so far to the start-up tracker. A file
    that cannot be read raises ``error(file, first line of the reason)``.
    """
    from safetensors import safe_open

    total = data_bytes(files)
    done = 0
    with phase("loading weights"):
        advance(0, total)
        for f in files:
            f = Path(f)
            try:
                with safe_open(str(f), framework="pt", device=device) as fh:
                    for key in fh.keys():
                        t = fh.get_tensor(key)
                        done += t.numel() * t.element_size()
                        advance(done, max(total, done))
                        yield f, key, t
            except GeneratorExit:
                raise
            except Exception as exc:  # SafetensorsError is not importable in every version
                raise error(f, one_line(exc, 120)) from None


def load_safetensors(model: torch.nn.Module, files: Sequence[str | Path], device: torch.device) -> None:
    """Copy the tensors of ``files`` into ``model``; every parameter must be covered.

    Parameters tied to a loaded one (``lm_head`` with tied embeddings) count as covered.
    """
    state = model.state_dict()
    loaded: set[str] = set()
    unexpected: list[str] = []
    for f, key, t in read_safetensors(
            files, str(device), lambda f, why: TuiprofError(f"cannot read weights {f}: {why}")):
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
