"""``nanochat`` family: the GPT of karpathy/nanochat (d20, d34 and tiny test variants).

Per depth ``d``: model dim ``64 * d``, head dim 128, as many KV heads as query heads,
MLP ``4x`` with ReLU², rotary embeddings (nanochat's sign convention, base 10000),
QK RMSNorm, parameter-free RMSNorm (also right after the embedding and before the head),
untied embedding and LM head, logits soft-capped at 15 (``15 * tanh(z / 15)``), vocab 65,536.

Weights use nanochat's state-dict keys (``transformer.wte.weight``,
``transformer.h.{i}.attn.c_q.weight`` ... ``lm_head.weight``); nanochat saves ``.pt``
checkpoints, so convert them to safetensors first (and strip any ``_orig_mod.`` prefix).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from tuiprof.engine.families._build import family_build
from tuiprof.engine.families._decoder import (  # noqa: F401 - ATTENTION_IMPLS: the sweep's switch
    ATTENTION_IMPLS,
    CachedDecoderLM,
    SelfAttention,
    layer_caches,
)


def _config(config: Mapping[str, Any]) -> dict[str, Any]:
    c = {"sequence_len": 2048, "rope_theta": 10000.0, "logit_softcap": 15.0, "attention": "sdpa", "head_dim": 128,
         "vocab_size": 65536, **dict(config)}
    if "n_layer" in c and "n_embd" not in c:
        c["n_embd"] = 64 * c["n_layer"]
    c.setdefault("n_head", max(1, (c["n_embd"] + c["head_dim"] - 1) // c["head_dim"]))
    c.setdefault("n_kv_head", c["n_head"])
    if c["n_embd"] % c["n_head"]:
        raise ValueError(f"nanochat: n_embd {c['n_embd']} is not divisible by n_head {c['n_head']}")
    c["head_dim"] = c["n_embd"] // c["n_head"]
    return c


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class MLP(nn.Module):
    """``c_proj(relu(c_fc(x))²)`` with a 4x hidden width."""

    tp_split = (("c_fc",), "c_proj")   # column-parallel, row-parallel (tensor parallelism)

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim, bias=False)
        self.c_proj = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    """Pre-norm block with parameter-free norms."""

    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        self.attn = SelfAttention(
            c["n_embd"], c["n_head"], c["n_kv_head"], c["head_dim"], c["sequence_len"],
            names=("c_q", "c_k", "c_v", "c_proj"), rope_style="half_neg", qk_norm=True, impl=c["attention"],
        )
        self.mlp = MLP(c["n_embd"])

    def forward(self, x, rope, mode, pos, kv=None):
        x = x + self.attn(_norm(x), rope, mode, pos, kv)
        return x + self.mlp(_norm(x))


class NanochatGPT(CachedDecoderLM):
    """nanochat's GPT with a static KV cache."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = _config(config)
        self.config = c
        self.vocab_size, self.max_len, self.head_dim = c["vocab_size"], c["sequence_len"], c["head_dim"]
        self.rope_theta, self.attention_impl, self.softcap = c["rope_theta"], c["attention"], c["logit_softcap"]
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(c["vocab_size"], c["n_embd"]),
            "h": nn.ModuleList(Block(c) for _ in range(c["n_layer"])),
        })
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)

    def _run(self, ids, mode, rope, pos, last_only, cache):
        x = _norm(self.transformer["wte"](ids))
        blocks = self.transformer["h"]
        for block, kv in zip(blocks, layer_caches(cache, len(blocks))):
            x = block(x, rope, mode, pos, kv)
        x = _norm(x[:, -1:] if last_only else x)
        logits = self.lm_head(x).float()
        if self.softcap:
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits


def param_count(config: Mapping[str, Any]) -> int:
    """Closed form: untied embedding + head, 12·d² per layer for MHA (q,k,v,o + 4x MLP)."""
    c = _config(config)
    d, kv = c["n_embd"], c["n_kv_head"] * c["head_dim"]
    per_layer = 2 * d * d + 2 * d * kv + 8 * d * d
    return 2 * c["vocab_size"] * d + c["n_layer"] * per_layer


def embedding_params(config: Mapping[str, Any]) -> int:
    """Token embedding plus the untied LM head."""
    c = _config(config)
    return 2 * c["vocab_size"] * c["n_embd"]


build = family_build(NanochatGPT, "sequence_len", "nanochat",
                     "a seeded (or ``weights``-loaded) nanochat GPT")
