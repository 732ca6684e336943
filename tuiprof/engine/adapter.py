"""The contract between the generation engine and a model family."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

LinearInfo = tuple[str, int, int]  # (module name, in_features, out_features)


@runtime_checkable
class DecoderAdapter(Protocol):
    """A batched decoder with static KV caches of ``max_len`` positions.

    The engine keeps one cache per batch configuration (``new_cache``) and passes it to every
    call; ``prefill``/``decode`` without a cache use the adapter's own one (tests, one-off
    callers). All sequences of a batch share one position.

    Optional extras the engine uses when present:

    * ``linear_layers() -> list[LinearInfo]``: linear layers in forward order (analysis attaches
      these shapes to GEMM launches);
    * ``truncate(length: int, cache) -> None``: the next decode writes at position ``length``;
      needed when the cache tracks its own write position (compile warm-up calls rewind with it);
    * ``cache_bytes(batch) -> int``: size of a cache for ``batch`` sequences (for "what fits");
    * ``cache_tensors(cache) -> list[Tensor]``: the tensors whose first dimension is the batch
      (a compile marks it dynamic);
    * ``compiled_steps: dict``: where compiled decode steps are kept, so they outlive an engine;
    * ``decode_masks(cache, batch)``: an object whose ``at(pos, position)`` makes a step's
      attention masks before the forward (the loop's work), passed to ``decode`` as a fourth
      argument: a compiled step then takes them as inputs, as ``generate()``'s does.
    """

    vocab_size: int
    max_len: int

    def new_cache(self, batch: int) -> Any:
        """A static KV cache for ``batch`` sequences, allocated now."""
        ...

    def reset_cache(self, cache: Any = None) -> None:
        """Forget every cached position (of ``cache``, or of the adapter's own)."""
        ...

    def prefill(self, input_ids: torch.LongTensor, cache: Any = None) -> torch.Tensor:
        """Start sequences at position 0: ``[B, T]`` ids -> logits ``[B, vocab]`` of position T-1."""
        ...

    def decode(self, token: torch.LongTensor, pos: torch.LongTensor, cache: Any = None) -> torch.Tensor:
        """One token per sequence ``[B, 1]`` at position ``pos`` ``[1]`` -> logits ``[B, vocab]``.

        Shapes are static and nothing is read back to the host, so ``torch.compile`` (and CUDA
        graphs) can capture it.
        """
        ...
