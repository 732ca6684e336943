"""``llama_layer`` family: one Llama-2-7B-shaped decoder layer run as a decode workload.

Its building blocks, shared with the other study families, are :mod:`._decoder` (the layers,
the cache, the adapter) and :mod:`._build` (building, seeding and loading on a device).

The layer workload: hidden 4096, 32 heads of 128 (MHA), SwiGLU MLP 11008, RMSNorm, no
RoPE. It has no real embedding or LM head: token ids index a *fixed* seeded table of
``vocab_size x hidden`` (a non-persistent buffer, not a parameter), and the layer's output
hidden state is returned as the "logits" (so ``vocab_size == hidden_size``, 4096). Greedy
decoding therefore works and the engine can drive it like any decoder, while the measured
work is one layer's decode step against a static KV cache.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from tuiprof.engine.families._build import family_build
from tuiprof.engine.families._decoder import (  # noqa: F401 - ATTENTION_IMPLS: the sweep's switch
    ATTENTION_IMPLS,
    CachedDecoderLM,
    RMSNorm,
    SelfAttention,
    SwiGLU,
)


class LlamaLayerLM(CachedDecoderLM):
    """One pre-norm Llama decoder layer (no RoPE) behind a fixed embedding; logits = hidden."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = _layer_config(config)
        self.config = c
        self.vocab_size = c["vocab_size"]
        self.max_len = c["max_len"]
        self.head_dim = c["head_dim"]
        self.attention_impl = c["attention"]
        h = c["hidden_size"]
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.self_attn = SelfAttention(
            h, c["num_heads"], c["num_heads"], c["head_dim"], c["max_len"], impl=c["attention"]
        )
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.mlp = SwiGLU(h, c["intermediate_size"])
        self.register_buffer("embed", torch.empty(self.vocab_size, h), persistent=False)

    def init_buffers(self, generator: torch.Generator | None) -> None:
        p = next(self.parameters())
        embed = torch.empty(self.vocab_size, self.config["hidden_size"], dtype=p.dtype, device=p.device)
        if generator is not None:
            with torch.no_grad():
                embed.normal_(0.0, 1.0, generator=generator)
        self.register_buffer("embed", embed, persistent=False)

    def _run(self, ids, mode, rope, pos, last_only, cache):
        x = F.embedding(ids, self.embed)
        kv = cache[0] if cache is not None else None
        x = x + self.self_attn(self.input_layernorm(x), None, mode, pos, kv)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x[:, -1:] if last_only else x


def _layer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    c = {"rms_norm_eps": 1e-5, "attention": "sdpa", "max_len": 4096, **dict(config)}
    c.setdefault("head_dim", c["hidden_size"] // c["num_heads"])
    c.setdefault("vocab_size", c["hidden_size"])
    if c["vocab_size"] != c["hidden_size"]:
        raise ValueError("llama_layer: vocab_size must equal hidden_size (the layer output is the logits)")
    if c["num_heads"] * c["head_dim"] != c["hidden_size"]:
        raise ValueError("llama_layer: num_heads * head_dim must equal hidden_size")
    return c


def param_count(config: Mapping[str, Any]) -> int:
    """Parameters of the layer (the fixed embedding is a buffer and is not counted)."""
    c = _layer_config(config)
    h, i = c["hidden_size"], c["intermediate_size"]
    return 4 * h * h + 3 * h * i + 2 * h


def embedding_params(config: Mapping[str, Any]) -> int:
    """0: the fixed embedding table is a buffer and there is no LM head."""
    return 0


build = family_build(LlamaLayerLM, "max_len", "llama-layer",
                     "one Llama-2-7B-shaped layer; ``weights`` keys: HF Llama layer keys without "
                     "the ``model.layers.N.`` prefix (``input_layernorm.weight``, "
                     "``self_attn.q_proj.weight``, ...)")
