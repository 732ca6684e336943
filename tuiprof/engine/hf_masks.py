"""Attention masks made before a Hugging Face model's forward, as ``generate()`` makes them.

With a static cache, transformers' ``generate()`` builds each step's masks in
``prepare_inputs_for_generation`` (the model's ``create_masks_for_generate``) and hands them to
the forward, so a compiled forward takes the masks as graph inputs instead of building them
inside. The engine does the same: its compiled step is then the graph a user's ``generate()``
compiles, kernel for kernel, and the masks' own kernels fall outside the model's forward.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

FULL = "full_attention"


def mask_maker(model: torch.nn.Module) -> Callable | None:
    """The model's mask function as ``generate()`` picks it, or None where there is none (an
    older transformers, or remote code, whose forward may not take prebuilt masks)."""
    if not type(model).__module__.startswith("transformers."):
        return None
    try:
        from transformers.masking_utils import create_masks_for_generate
    except ImportError:
        return None
    return getattr(model, "create_masks_for_generate", create_masks_for_generate)


def make_masks(make: Callable, model: torch.nn.Module, cache: object, positions: torch.Tensor,
               attention_mask: torch.Tensor) -> Any:
    """``make``'s masks for ids at ``positions`` ``[B, T]`` with the 2-D ``attention_mask`` of
    every position up to the last (what ``prepare_inputs_for_generation`` passes)."""
    b, t = positions.shape
    embeds = torch.empty((b, t, 0), dtype=model.dtype, device=positions.device)
    return make(config=model.config, inputs_embeds=embeds, attention_mask=attention_mask,
                position_ids=positions, **{_cache_kw(make): cache})


def _cache_kw(make: Callable) -> str:
    # transformers >= 5.24 names it ``cache`` (``past_key_values`` warns there)
    try:
        return "cache" if "cache" in inspect.signature(make).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def plain_causal(model: torch.nn.Module) -> bool:
    """Every layer attends causally to every earlier position (no sliding window or chunks)."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is not None:
        return set(types) == {FULL}
    return (getattr(text, "sliding_window", None) is None
            and getattr(text, "attention_chunk_size", None) is None)


class DecodeMasks:
    """The masks of one cache's decode steps (``batch`` sequences, ``max_len`` positions).

    Where the model's decode mask is a plain causal boolean one (``sdpa``, every layer full
    attention), it is one tensor rewritten in place by one kernel a step (``kv <= pos``, with
    the device's position: nothing is read back); checked once against the model's own. Else
    the model's mask function runs each step, as in ``generate()``.
    """

    def __init__(self, make: Callable, model: torch.nn.Module, cache: object, batch: int,
                 max_len: int, device: torch.device) -> None:
        self._make, self._model, self._cache = make, model, cache
        self._ones = torch.ones((batch, max_len), dtype=torch.long, device=device)
        self._batch = batch
        self._kv = torch.arange(max_len, device=device).view(1, 1, 1, max_len).expand(
            batch, 1, 1, max_len)
        self._buf: torch.Tensor | None = None
        self._fast: Any = None
        self._unchecked = plain_causal(model)  # checked at the first step: the model's masks
        # read the cache's length, so they are only right on a cache in use

    @property
    def fast(self) -> bool:
        """The one-kernel path is in use."""
        return self._fast is not None

    def tensors(self) -> list[torch.Tensor]:
        """The persistent tensors whose first dimension is the batch (a compile marks it)."""
        return [self._buf] if self._buf is not None else []

    def settle(self, pos: torch.Tensor, position: int) -> None:
        """Choose the path now, on the cache just prefilled up to ``position`` (else the first
        step's masks choose it, and that step carries the check's kernels)."""
        if self._unchecked:
            self.at(pos, position)

    def at(self, pos: torch.Tensor, position: int) -> Any:
        """The masks for the step at ``pos`` (device ``[1]``; ``position`` its host copy, and
        the cache's length)."""
        if self._fast is not None:
            torch.le(self._kv, pos, out=self._buf)
            return self._fast
        made = self._model_masks(pos, position)
        if self._unchecked:
            self._unchecked = False
            self._fast = self._fast_form(made, pos)
            if self._fast is not None:
                return self.at(pos, position)
        return made

    def _model_masks(self, pos: torch.Tensor, position: int) -> Any:
        return make_masks(self._make, self._model, self._cache,
                          pos.view(1, 1).expand(self._batch, 1), self._ones[:, :position + 1])

    def _fast_form(self, made: Any, pos: torch.Tensor) -> Any:
        """``made`` with its one mask replaced by the buffer, or None when it is not one boolean
        ``kv <= pos`` tensor (read back once)."""
        if isinstance(made, dict) and set(made) == {FULL}:
            mask = made[FULL]
        elif isinstance(made, torch.Tensor):
            mask = made
        else:
            return None
        want = self._kv <= pos
        if (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                or mask.shape != want.shape or not mask.is_contiguous()
                or not torch.equal(mask, want)):
            return None
        self._buf = torch.empty_like(mask)
        return {FULL: self._buf} if isinstance(made, dict) else self._buf
