"""Out-of-memory errors: recognising them (CUDA and CPU) and saying them in one line."""
from __future__ import annotations

import re

import torch

_SIZE = r"([\d.]+ (?:[KMGT]iB|bytes))"
_GIB = 1024 ** 3


def is_oom(exc: BaseException) -> bool:
    """True for CUDA OOM errors, ``MemoryError`` and ``RuntimeError``s that say they ran out of
    memory (the CPU allocator's "can't allocate memory" under a memory limit)."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def memory_figures(exc: BaseException, device: torch.device) -> str:
    """What was asked for and what is free, from the device when it still answers, else from
    the allocator's own message ("Tried to allocate X. GPU 0 has a total capacity of T of
    which F is free"; the CPU allocator's "you tried to allocate N bytes")."""
    text = " ".join(str(exc).split())
    figures = "memory figures unavailable"
    if torch.device(device).type == "cuda":
        try:
            free, total = torch.cuda.mem_get_info(device)
            alloc = torch.cuda.memory_allocated(device)
            reserved = torch.cuda.memory_reserved(device)
            figures = (f"{alloc / _GIB:.2f} GiB allocated, {reserved / _GIB:.2f} GiB reserved, "
                       f"{free / _GIB:.2f} of {total / _GIB:.2f} GiB free")
        except Exception:
            figures = ""
    if not figures or figures.startswith("memory figures"):
        cap = re.search(rf"total capacity of {_SIZE} of which {_SIZE} is free", text)
        figures = f"{cap[2]} of {cap[1]} free" if cap else "memory figures unavailable"
    asked = re.search(rf"Tried to allocate {_SIZE}", text)
    cpu = re.search(r"you tried to allocate (\d+) bytes", text)
    if asked:
        figures = f"tried to allocate {asked[1]}; {figures}"
    elif cpu:
        figures = f"tried to allocate {int(cpu[1]) / _GIB:.2f} GiB; {figures}"
    return figures


def oom_message(exc: BaseException, device: torch.device, phase: str = "") -> str:
    """One line for an OOM that ends the session: where, the figures, what to do."""
    where = {"compiling": " while compiling", "prefill": " in prefill",
             "decode": " in decode"}.get(phase, "")
    kind = "CUDA out of memory" if torch.device(device).type == "cuda" or \
        isinstance(exc, torch.cuda.OutOfMemoryError) else "out of memory"
    return (f"{kind}{where} ({memory_figures(exc, device)}); the data so far is kept: try a "
            f"smaller model, a smaller batch, a shorter cache (--max-len) or bf16")
