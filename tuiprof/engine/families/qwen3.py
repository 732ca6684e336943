"""Qwen3 dense decoders (Hugging Face ``Qwen3ForCausalLM``)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ..tensor_parallel import TPContext
from ..imports import import_model_classes
from ..hf_adapter import HFDecoderAdapter, build_random, config_dict, resolve_max_len
from ..weights import load_safetensors, safetensors_files


def param_count(config: Mapping[str, Any]) -> int:
    """Closed form: embedding, per layer attention + SwiGLU MLP + 4 norms, final norm, head."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    nq = config["num_attention_heads"]
    nkv = config.get("num_key_value_heads") or nq
    hd = config.get("head_dim") or h // nq
    attn = h * nq * hd + 2 * h * nkv * hd + nq * hd * h
    if config.get("attention_bias", False):
        attn += nq * hd + 2 * nkv * hd
    norms = 2 * h + 2 * hd  # input/post-attention RMSNorm, per-head q_norm/k_norm
    layer = attn + 3 * h * inter + norms
    return embedding_params(config) + config["num_hidden_layers"] * layer + h


def embedding_params(config: Mapping[str, Any]) -> int:
    """Token embedding, plus the LM head when it is not tied."""
    e = config["vocab_size"] * config["hidden_size"]
    return e if config.get("tie_word_embeddings", False) else 2 * e


def preload() -> None:
    """Import transformers' Qwen3 classes (seconds), timed and overlapped at start-up, without
    the optional packages the engine never uses (:mod:`tuiprof.engine.imports`)."""
    import_model_classes("qwen3")


def build(model_def: Any, *, device: torch.device | str, dtype: torch.dtype | str, seed: int,
          weights: str | None = None, max_len: int | None = None,
          tp: TPContext | None = None) -> HFDecoderAdapter:
    """Qwen3 on ``device`` in ``dtype``: seeded random weights, or ``weights`` (safetensors);
    ``tp``: this rank's tensor-parallel shard of the same random weights."""
    Qwen3Config, Qwen3ForCausalLM = import_model_classes("qwen3")
    config = config_dict(model_def)
    cfg = Qwen3Config.from_dict({k: v for k, v in config.items() if k != "model_type"})
    model = build_random(Qwen3ForCausalLM, cfg, dtype=dtype, device=device, seed=seed,
                         init=not weights, tp=tp)
    if weights:
        load_safetensors(model, safetensors_files(weights), torch.device(device))
    return HFDecoderAdapter(model, resolve_max_len(config, max_len))
