"""``cs336`` family: the pre-norm Transformer LM of the Stanford CS336 assignments.

Token embedding, ``num_layers`` blocks of ``x + attn(RMSNorm(x))`` and
``x + SwiGLU(RMSNorm(x))`` (``w2(silu(w1 x) * w3 x)``), a final RMSNorm and an untied LM
head. Causal multi-head attention with RoPE on adjacent (interleaved) pairs, theta 10000,
RMSNorm eps 1e-5 with a learnable gain, no biases. ``context_length`` bounds the sequence.

``config["attention"]`` switches the attention path: ``"plain"`` (the assignment's own
``softmax(QKᵀ/√d)·V``, annotated so the sweep can split softmax from matmul time) or
``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention``).

Weight keys are the assignment's: ``token_embeddings.weight``,
``layers.{i}.attn.{q_proj,k_proj,v_proj,output_proj}.weight``, ``layers.{i}.ln1.weight``,
``layers.{i}.ffn.{w1,w2,w3}.weight``, ``layers.{i}.ln2.weight``, ``ln_final.weight``,
``lm_head.weight``.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from tuiprof.engine.families._build import family_build
from tuiprof.engine.families._decoder import (  # noqa: F401 - ATTENTION_IMPLS: the sweep's switch
    ATTENTION_IMPLS,
    CachedDecoderLM,
    RMSNorm,
    SelfAttention,
    SwiGLU,
    layer_caches,
)


def _config(config: Mapping[str, Any]) -> dict[str, Any]:
    c = {"vocab_size": 10000, "context_length": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
         "attention": "plain", **dict(config)}
    if c["d_model"] % c["num_heads"]:
        raise ValueError(f"cs336: d_model {c['d_model']} is not divisible by num_heads {c['num_heads']}")
    return c


class Block(nn.Module):
    """Pre-norm Transformer block with the assignment's module names."""

    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        d, h = c["d_model"], c["num_heads"]
        self.ln1 = RMSNorm(d, c["rms_norm_eps"])
        self.attn = SelfAttention(d, h, h, d // h, c["context_length"],
                                  names=("q_proj", "k_proj", "v_proj", "output_proj"),
                                  rope_style="interleaved", impl=c["attention"])
        self.ln2 = RMSNorm(d, c["rms_norm_eps"])
        self.ffn = SwiGLU(d, c["d_ff"], names=("w1", "w3", "w2"))

    def forward(self, x, rope, mode, pos, kv=None):
        x = x + self.attn(self.ln1(x), rope, mode, pos, kv)
        return x + self.ffn(self.ln2(x))


class TransformerLM(CachedDecoderLM):
    """CS336 Transformer LM with a static KV cache for decoding."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = _config(config)
        self.config = c
        self.vocab_size, self.max_len = c["vocab_size"], c["context_length"]
        self.head_dim = c["d_model"] // c["num_heads"]
        self.rope_theta, self.attention_impl = c["rope_theta"], c["attention"]
        self.token_embeddings = nn.Embedding(c["vocab_size"], c["d_model"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_layers"]))
        self.ln_final = RMSNorm(c["d_model"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)

    def _run(self, ids, mode, rope, pos, last_only, cache):
        x = self.token_embeddings(ids)
        for layer, kv in zip(self.layers, layer_caches(cache, len(self.layers))):
            x = layer(x, rope, mode, pos, kv)
        x = self.ln_final(x[:, -1:] if last_only else x)
        return self.lm_head(x)


def param_count(config: Mapping[str, Any]) -> int:
    """Closed form: ``2·V·d + L·(4·d² + 3·d·d_ff + 2·d) + d``."""
    c = _config(config)
    d, f = c["d_model"], c["d_ff"]
    return 2 * c["vocab_size"] * d + c["num_layers"] * (4 * d * d + 3 * d * f + 2 * d) + d


def embedding_params(config: Mapping[str, Any]) -> int:
    """Token embedding plus the untied LM head."""
    c = _config(config)
    return 2 * c["vocab_size"] * c["d_model"]


build = family_build(TransformerLM, "context_length", "cs336",
                     "a seeded (or ``weights``-loaded) CS336 Transformer LM")
