"""Resolve registry models for the sweep and turn an adapter into callables it can time."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable

import torch


def model_def(name: str) -> Any:
    """The registry entry ``name`` (``tuiprof.engine.model_defs.ModelDef``)."""
    from tuiprof.engine.model_defs import get_model_def

    return get_model_def(name)


def family(name: str) -> Any:
    """The family module (``build``, ``param_count``), through the engine's loader when present."""
    try:
        from tuiprof.engine.families import get_family
    except ImportError:
        return importlib.import_module(f"tuiprof.engine.families.{name}")
    return get_family(name)


def with_attention(defn: Any, impl: str | None) -> Any:
    """``defn`` with ``config["attention"] = impl`` (unchanged when ``impl`` is None)."""
    if impl is None:
        return defn
    config = {**_get(defn, "config"), "attention": impl}
    if dataclasses.is_dataclass(defn):
        return dataclasses.replace(defn, config=config)
    return {**defn, "config": config}


def build_adapter(defn: Any, *, device: torch.device, dtype: str | torch.dtype | None, seed: int,
                  weights: str | None) -> Any:
    """Build the adapter of ``defn`` on ``device``; ``dtype`` None means the entry's dtype."""
    dt = dtype if dtype is not None else _get(defn, "dtype")
    if isinstance(dt, str):
        dt = getattr(torch, dt)
    return family(_get(defn, "family")).build(defn, device=device, dtype=dt, seed=seed, weights=weights)


def has_attention_switch(defn: Any) -> bool:
    """True when the entry's family takes ``config["attention"]`` (it exports ``ATTENTION_IMPLS``)."""
    return bool(getattr(family(_get(defn, "family")), "ATTENTION_IMPLS", None))


def attention_impl(adapter: Any) -> str | None:
    """The adapter's attention path (``plain``/``sdpa``) when it reports one."""
    impl = getattr(adapter, "attention_impl", None)
    return impl if isinstance(impl, str) else None


def forward_fn(
    adapter: Any, compiled: Callable[[torch.nn.Module], Any] | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable ``ids [B, T] -> logits [B, T, V]`` over ``adapter.module``.

    ``compiled`` wraps the module (e.g. ``torch.compile``). Hugging Face models are called
    with ``use_cache=False`` and their ``.logits`` returned.
    """
    module = adapter.module
    target = compiled(module) if compiled is not None else module
    if _is_hf(module):
        return lambda ids: target(input_ids=ids, use_cache=False).logits
    return lambda ids: _logits(target(ids))


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def _is_hf(module: torch.nn.Module) -> bool:
    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel)


def _get(defn: Any, key: str) -> Any:
    return defn[key] if isinstance(defn, dict) else getattr(defn, key)
