"""``deepseek`` family: the DeepSeek-OCR language decoder (DeepSeek-V2-style MoE, plain MHA).

Own implementation: transformers' ``DeepseekV2ForCausalLM`` always builds multi-head latent
attention (``kv_a_proj_with_mqa`` / ``kv_lora_rank``), which cannot express the OCR
decoder's ``use_mla: false`` Llama-style attention (see docs/workloads.md).

Architecture (DeepSeek-OCR ``language_config``): vocab 129,280, hidden 1280, 12 layers,
10 heads of 128 (MHA), RoPE (``rotate_half``, theta 10000), RMSNorm eps 1e-6; layer 0 is
a dense SwiGLU MLP of 6848; the other layers are MoE: a softmax router over 64 routed
experts (SwiGLU of 896), greedy top-6 without renormalisation, ``routed_scaling_factor``
1.0, plus 2 shared experts (one SwiGLU of 2 x 896); untied LM head.

Routed experts are stored stacked (``experts_w1/w3`` ``[E, I, H]``, ``experts_w2``
``[E, H, I]``). Dispatch follows DeepSeek-V2's reference ``moe_infer``: the (token, slot)
expert ids are sorted, tokens gathered in that order, experts run, rows scattered back and
weighted (so decode shows top-k, sort and index kernels, as the real model does).
Full-sequence and prefill passes run each expert on its slice (one host sync); decode
gathers each sorted row's expert weights (static shapes, CUDA-graph friendly).
Checkpoint keys follow HF DeepSeek-V2 naming (``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``
...), converted on load; the vision tower's keys are ignored via ``weights_ignore_prefixes``.
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
    RMSNorm,
    SelfAttention,
    SwiGLU,
    layer_caches,
)

_EXPERT_PARTS = (("experts_w1", "gate_proj"), ("experts_w3", "up_proj"), ("experts_w2", "down_proj"))


def _config(config: Mapping[str, Any]) -> dict[str, Any]:
    c = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "attention": "sdpa", "first_k_dense_replace": 1,
         "routed_scaling_factor": 1.0, "norm_topk_prob": False, "scoring_func": "softmax", "topk_method": "greedy",
         "max_position_embeddings": 8192, **dict(config)}
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.setdefault("max_len", c["max_position_embeddings"])
    if c.get("use_mla", False):
        raise ValueError("deepseek: use_mla=true (multi-head latent attention) is not implemented")
    if c["scoring_func"] != "softmax" or c["topk_method"] != "greedy":
        raise ValueError("deepseek: only scoring_func=softmax with topk_method=greedy is implemented")
    return c


class MoE(nn.Module):
    """Softmax top-k router, stacked routed experts and the shared experts."""

    def __init__(self, c: Mapping[str, Any]) -> None:
        super().__init__()
        h, i, e = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
        self.top_k, self.n_experts = c["num_experts_per_tok"], e
        self.scale, self.norm_topk = c["routed_scaling_factor"], c["norm_topk_prob"]
        self.gate = nn.Linear(h, e, bias=False)
        self.experts_w1 = nn.Parameter(torch.empty(e, i, h))
        self.experts_w3 = nn.Parameter(torch.empty(e, i, h))
        self.experts_w2 = nn.Parameter(torch.empty(e, h, i))
        self.shared_experts = SwiGLU(h, i * c["n_shared_experts"]) if c["n_shared_experts"] else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N, H]`` -> (weights ``[N, k]`` in x's dtype, expert ids ``[N, k]``)."""
        scores = self.gate(x).float().softmax(dim=-1)
        w, idx = torch.topk(scores, self.top_k, dim=-1, sorted=False)
        if self.norm_topk:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return (w * self.scale).to(x.dtype), idx

    def forward(self, x: torch.Tensor, mode: str) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        w, idx = self.route(flat)
        y = self._gathered(flat, w, idx) if mode == "decode" else self._grouped(flat, w, idx)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(shape)

    # Both paths are DeepSeek-V2's reference ``moe_infer``: sort the flattened (token, slot)
    # expert ids (``argsort``), gather the tokens in that order (``x[idxs // top_k]``), run
    # the experts on the sorted rows, scatter the rows back to (token, slot) order
    # (``new_x[idxs] = outs``), weight them and sum over the k slots. They differ only in how
    # the experts run on the sorted rows.

    def _sort_pairs(self, x, idx):
        """Sorted expert ids, the sort permutation ``idxs`` and the tokens in that order."""
        ids, idxs = idx.reshape(-1).sort()  # = argsort(), keeping the sorted ids (one sort kernel)
        return ids, idxs, x[idxs // self.top_k]

    def _combine(self, outs, idxs, w):
        """Sorted expert outputs -> (token, slot) order, weighted, summed over the k slots."""
        new_x = torch.empty_like(outs)
        new_x[idxs] = outs
        return (new_x.view(*w.shape, -1) * w.unsqueeze(-1)).sum(dim=1)

    def _gathered(self, x, w, idx):
        """Decode (few tokens): static shapes, no host read, CUDA-graph friendly. Each sorted
        row gathers its expert's weights (``W[ids]``) and runs as one batched matmul."""
        ids, idxs, xs = self._sort_pairs(x, idx)
        h = torch.einsum("mh,mih->mi", xs, self.experts_w1[ids])
        u = torch.einsum("mh,mih->mi", xs, self.experts_w3[ids])
        outs = torch.einsum("mi,mhi->mh", F.silu(h) * u, self.experts_w2[ids])
        return self._combine(outs, idxs, w)

    def _grouped(self, x, w, idx):
        """Full sequence and prefill: each expert on its contiguous slice of the sorted rows
        (tokens per expert read on the host: one sync per MoE layer, as in ``moe_infer``)."""
        ids, idxs, xs = self._sort_pairs(x, idx)
        counts = torch.bincount(ids, minlength=self.n_experts).tolist()
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                part = xs[start:start + n]
                a = F.silu(part @ self.experts_w1[e].t()) * (part @ self.experts_w3[e].t())
                outs.append(a @ self.experts_w2[e].t())
                start += n
        return self._combine(torch.cat(outs), idxs, w)


class DecoderLayer(nn.Module):
    """Pre-norm layer: Llama attention, then a dense MLP or the MoE."""

    def __init__(self, c: Mapping[str, Any], index: int) -> None:
        super().__init__()
        h = c["hidden_size"]
        self.input_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.self_attn = SelfAttention(h, c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                                       c["max_len"], rope_style="half", impl=c["attention"])
        self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"])
        self.dense = index < c["first_k_dense_replace"]
        self.mlp = SwiGLU(h, c["intermediate_size"]) if self.dense else MoE(c)

    def forward(self, x, rope, mode, pos, kv=None):
        x = x + self.self_attn(self.input_layernorm(x), rope, mode, pos, kv)
        y = self.post_attention_layernorm(x)
        return x + (self.mlp(y) if self.dense else self.mlp(y, mode))


class DeepseekDecoder(CachedDecoderLM):
    """The language decoder (``model.*`` + ``lm_head``) with a static KV cache."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        c = _config(config)
        self.config = c
        self.vocab_size, self.max_len, self.head_dim = c["vocab_size"], c["max_len"], c["head_dim"]
        self.rope_theta, self.attention_impl = c["rope_theta"], c["attention"]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.model.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c["num_hidden_layers"]))
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def _run(self, ids, mode, rope, pos, last_only, cache):
        x = self.model.embed_tokens(ids)
        layers = self.model.layers
        for layer, kv in zip(layers, layer_caches(cache, len(layers))):
            x = layer(x, rope, mode, pos, kv)
        x = self.model.norm(x[:, -1:] if last_only else x)
        return self.lm_head(x)

    # -- checkpoint layout (HF DeepSeek-V2 keys, one module per expert) --------------

    def to_external(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Own state dict -> HF key layout (experts unstacked; views, no copies)."""
        out: dict[str, torch.Tensor] = {}
        for key, t in state.items():
            prefix, _, leaf = key.rpartition(".")
            part = dict(_EXPERT_PARTS).get(leaf)
            if part is None:
                out[key] = t
                continue
            for e in range(t.shape[0]):
                out[f"{prefix}.experts.{e}.{part}.weight"] = t[e]
        return out

    def from_external(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF key layout -> own state dict (experts stacked)."""
        out = {k: v for k, v in state.items() if ".experts." not in k}
        for key, t in self.state_dict().items():
            prefix, _, leaf = key.rpartition(".")
            part = dict(_EXPERT_PARTS).get(leaf)
            if part is not None:
                out[key] = torch.stack([state[f"{prefix}.experts.{e}.{part}.weight"] for e in range(t.shape[0])])
        return out

    def linear_layers(self) -> list[tuple[str, int, int]]:
        """GEMM weights in forward order; routed experts listed per expert after the router."""
        rows: list[tuple[str, int, int]] = []
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                rows.append((name, m.in_features, m.out_features))
                if isinstance(m, nn.Linear) and name.endswith("mlp.gate"):
                    moe = self.get_submodule(name.rpartition(".")[0])
                    e, i, h = moe.experts_w1.shape
                    base = name.rpartition(".")[0]
                    for k in range(e):
                        rows += [(f"{base}.experts.{k}.gate_proj", h, i), (f"{base}.experts.{k}.up_proj", h, i),
                                 (f"{base}.experts.{k}.down_proj", i, h)]
        return rows


def param_count(config: Mapping[str, Any]) -> int:
    """Closed form of the decoder's parameters (embedding, attention, dense/MoE MLPs, norms, head)."""
    c = _config(config)
    h, v, n = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    qo = 2 * h * c["num_attention_heads"] * c["head_dim"]
    kv = 2 * h * c["num_key_value_heads"] * c["head_dim"]
    dense = 3 * h * c["intermediate_size"]
    i = c["moe_intermediate_size"]
    moe = c["n_routed_experts"] * (3 * h * i + h) + 3 * h * i * c["n_shared_experts"]
    n_dense = min(c["first_k_dense_replace"], n)
    return 2 * v * h + n * (qo + kv + 2 * h) + n_dense * dense + (n - n_dense) * moe + h


def embedding_params(config: Mapping[str, Any]) -> int:
    """Token embedding plus the untied LM head."""
    c = _config(config)
    return 2 * c["vocab_size"] * c["hidden_size"]


build = family_build(DeepseekDecoder, "max_len", "deepseek",
                     "a seeded (or ``weights``-loaded) DeepSeek-OCR language decoder", tp=False)
