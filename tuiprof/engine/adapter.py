"""The contract between the generation engine and a model family."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

LinearInfo = tuple[str, int, int]  # (module name, in_features, out_features)


@runtime_checkable
class DecoderAdapter(Protocol):
    """A batch-1 decoder with a static KV cache of ``max_len`` positions.

    Optional extras the engine uses when present:

    * ``linear_layers() -> list[LinearInfo]``: linear layers in forward order (analysis attaches
      these shapes to GEMM launches);
    * ``truncate(length: int) -> None``: the next decode writes at position ``length``; needed
      when the cache tracks its own write position (compile warm-up calls rewind with it);
    * ``compiled_steps: dict``: where compiled decode steps are kept, so they outlive an engine.
    """

    vocab_size: int
    max_len: int

    def reset_cache(self) -> None:
        """Forget every cached position."""
        ...

    def prefill(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Start a sequence at position 0: ``[1, T]`` ids -> logits ``[1, vocab]`` of position T-1."""
        ...

    def decode(self, token: torch.LongTensor, pos: torch.LongTensor) -> torch.Tensor:
        """One token ``[1, 1]`` at position ``pos`` ``[1]`` -> logits ``[1, vocab]``.

        Shapes are static and nothing is read back to the host, so ``torch.compile`` (and CUDA
        graphs) can capture it.
        """
        ...
