"""The decoder building blocks the study families (``llama_layer``, ``nanochat``, ``cs336``,
``deepseek``) share: RMSNorm, rotary embeddings in three conventions, a plain/SDPA attention
switch, a static KV cache updated in place, the SwiGLU MLP, the cached decoder module every
family's model derives from, and the adapter object that satisfies
``tuiprof.engine.adapter.DecoderAdapter``. Building one on a device is :mod:`._build`'s.

(A module whose name starts with ``_`` is not a family: ``available_families`` skips it.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from tuiprof import startup


ATTENTION_IMPLS = ("plain", "sdpa")
"""``plain``: matmul + softmax + matmul (annotated for the sweep); ``sdpa``: fused kernel."""

ROPE_STYLES = ("half", "half_neg", "interleaved")
"""``half``: HF ``rotate_half``; ``half_neg``: nanochat's sign convention; ``interleaved``:
adjacent pairs (CS336)."""

ATTN_LABELS = {"scores": "attn::scores_matmul", "softmax": "attn::softmax", "values": "attn::values_matmul"}
"""``record_function`` labels emitted by the plain attention path (read by tuiprof.sweep)."""


# --------------------------------------------------------------------------- primitives


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back; ``weight`` None means parameter-free."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain named ``weight`` (Llama/DeepSeek/CS336 key layout)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(
    max_len: int, head_dim: int, theta: float, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos``/``sin`` tables of shape ``[max_len, head_dim // 2]``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    t = torch.arange(max_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by per-position tables ``[T, D/2]`` (computed in float32)."""
    x32 = x.float()
    if style == "interleaved":
        x1, x2 = x32[..., 0::2], x32[..., 1::2]
        y = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    else:
        d = x32.shape[-1] // 2
        x1, x2 = x32[..., :d], x32[..., d:]
        if style == "half":
            y = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:  # half_neg: nanochat's apply_rotary_emb
            y = torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)
    return y.to(x.dtype)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    impl: str,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Attention of ``q [B,H,T,D]`` over ``k, v [B,Hkv,S,D]``.

    ``mask`` is a boolean "may attend" mask broadcastable to ``[B,H,T,S]``; ``causal`` adds
    the usual lower-triangular mask (query ``i`` of ``T`` sees keys ``<= S-T+i``).
    ``plain`` wraps its three stages in ``record_function`` labels (``ATTN_LABELS``).
    """
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if impl == "sdpa":
        if causal and mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if causal:
            mask = mask & _causal_mask(q.shape[2], k.shape[2], q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if impl != "plain":
        raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, not {impl!r}")
    scale = 1.0 / math.sqrt(q.shape[-1])
    with record_function(ATTN_LABELS["scores"]):
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    with record_function(ATTN_LABELS["softmax"]):
        if causal:
            cm = _causal_mask(q.shape[2], k.shape[2], q.device)
            mask = cm if mask is None else mask & cm
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    with record_function(ATTN_LABELS["values"]):
        return torch.matmul(probs, v)


def _causal_mask(t: int, s: int, device: torch.device) -> torch.Tensor:
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(s - t)


# --------------------------------------------------------------------------- KV cache


class KVCache:
    """Static K/V of one attention layer, ``[batch, kv_heads, max_len, head_dim]``.

    A plain object, not a module buffer: the engine keeps one cache per batch configuration
    and passes it to each step, so a step for another batch can be compiled while this one
    decodes, and ``torch.compile`` may treat the batch dimension as dynamic (module buffers
    always get static shapes). The tensors are written in place (``copy_`` of the prefix at
    prefill, ``index_copy_`` at ``pos`` during decode) and marked as static addresses for CUDA
    graphs.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int, max_len: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (batch, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        _mark_static(self.k)
        _mark_static(self.v)

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write_prefix(self, k: torch.Tensor, v: torch.Tensor) -> None:
        t = k.shape[2]
        self.k[:, :, :t].copy_(k)
        self.v[:, :, :t].copy_(v)

    def write_at(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)

    def visible(self, pos: torch.Tensor) -> torch.Tensor:
        """``[1,1,1,max_len]`` mask of the slots a query at ``pos`` may attend to."""
        slots = torch.arange(self.k.shape[2], device=pos.device)
        return (slots <= pos.view(1)).view(1, 1, 1, -1)


def _mark_static(t: torch.Tensor) -> None:
    """``torch._dynamo.mark_static_address(t)``, without importing ``torch._dynamo``.

    Importing it costs 1.5 s before an eager session's first token (CPU here). The mark is an
    attribute that torch.compile reads when it runs (after importing dynamo itself), so
    while dynamo is not loaded the attribute is set directly, as ``mark_static_address``
    does; ``tests/engine/test_startup.py`` checks that the two still agree.
    """
    import sys

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        t._dynamo_static_input_type = "unguarded"  # type: ignore[attr-defined]
        return
    try:
        dynamo.mark_static_address(t)
    except Exception:  # pragma: no cover - older/odd torch builds
        pass


# --------------------------------------------------------------------------- layers


class SelfAttention(nn.Module):
    """Multi-head (or grouped-query) self-attention with optional RoPE and QK-norm.

    Projection names are given so that each family keeps its checkpoint's key layout
    (``names = (q, k, v, out)``).
    """

    def __init__(
        self,
        hidden: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        names: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
        rope_style: str | None = None,
        qk_norm: bool = False,
        impl: str = "sdpa",
    ) -> None:
        super().__init__()
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}, not {impl!r}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.names, self.rope_style, self.qk_norm, self.impl = names, rope_style, qk_norm, impl
        for name, out in zip(names[:3], (n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim)):
            setattr(self, name, nn.Linear(hidden, out, bias=False))
        setattr(self, names[3], nn.Linear(n_heads * head_dim, hidden, bias=False))
        self.max_len = max_len

    def new_cache(self, batch: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        """An empty cache of this layer for ``batch`` sequences."""
        return KVCache(batch, self.n_kv_heads, self.head_dim, self.max_len, dtype=dtype, device=device)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mode: str,
        pos: torch.Tensor | None = None,
        kv: KVCache | None = None,
    ) -> torch.Tensor:
        """``mode``: ``full`` (no cache), ``prefill`` (fills ``kv``) or ``decode`` (T=1 at ``pos``)."""
        b, t, _ = x.shape
        qn, kn, vn, on = self.names
        q = getattr(self, qn)(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = getattr(self, kn)(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = getattr(self, vn)(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None and self.rope_style is not None:
            q = apply_rope(q, rope[0], rope[1], self.rope_style)
            k = apply_rope(k, rope[0], rope[1], self.rope_style)
        if self.qk_norm:
            q = F.rms_norm(q, (self.head_dim,))
            k = F.rms_norm(k, (self.head_dim,))
        if mode == "decode":
            kv.write_at(pos, k, v)
            y = attend(q, kv.k, kv.v, impl=self.impl, mask=kv.visible(pos))
        else:
            if mode == "prefill":
                kv.write_prefix(k, v)
            y = attend(q, k, v, impl=self.impl, causal=True)
        y = y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)
        return getattr(self, on)(y)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with the family's names ``(gate, up, down)``."""

    def __init__(
        self, hidden: int, inter: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    ) -> None:
        super().__init__()
        self.names = names
        setattr(self, names[0], nn.Linear(hidden, inter, bias=False))
        setattr(self, names[1], nn.Linear(hidden, inter, bias=False))
        setattr(self, names[2], nn.Linear(inter, hidden, bias=False))

    @property
    def tp_split(self) -> tuple[tuple[str, ...], str]:
        """Column-parallel projections and the row-parallel one (tensor parallelism)."""
        return (self.names[0], self.names[1]), self.names[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u, d = (getattr(self, n) for n in self.names)
        return d(F.silu(g(x)) * u(x))


# --------------------------------------------------------------------------- LM base


class CachedDecoderLM(nn.Module):
    """Base of the study decoders: full forward, prefill and static-shape decode.

    Subclasses set ``vocab_size``, ``max_len``, ``head_dim``, ``rope_theta`` (None: no RoPE)
    and implement ``_run(ids, mode, rope, pos, last_only) -> logits [B, T', V]``.
    """

    vocab_size: int
    max_len: int
    head_dim: int
    rope_theta: float | None = None
    attention_impl: str = "sdpa"

    def init_buffers(self, generator: torch.Generator | None) -> None:
        """(Re)build non-persistent buffers on the parameters' device (after ``to_empty``)."""
        if self.rope_theta is not None:
            dev = next(self.parameters()).device
            cos, sin = rope_tables(self.max_len, self.head_dim, self.rope_theta, dev)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def _rope(self, t: int, pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.rope_theta is None:
            return None
        if pos is None:
            if t > self.max_len:
                raise ValueError(f"sequence of {t} tokens exceeds max_len {self.max_len}")
            return self.rope_cos[:t], self.rope_sin[:t]
        return self.rope_cos.index_select(0, pos), self.rope_sin.index_select(0, pos)

    def _run(self, ids: torch.Tensor, mode: str, rope: Any, pos: torch.Tensor | None, last_only: bool,
             cache: list | None) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full causal forward without cache: ``[B, T]`` ids -> ``[B, T, V]`` logits."""
        return self._run(input_ids, "full", self._rope(input_ids.shape[1], None), None, False, None)

    def attention_layers(self) -> list[SelfAttention]:
        return [m for m in self.modules() if isinstance(m, SelfAttention)]

    def new_cache(self, batch: int) -> list[KVCache]:
        """A static KV cache for ``batch`` sequences: one :class:`KVCache` per attention layer."""
        p = next(self.parameters())
        with startup.phase("allocating KV cache"), torch.inference_mode(False), torch.no_grad():
            return [a.new_cache(batch, p.dtype, p.device) for a in self.attention_layers()]

    def prefill(self, input_ids: torch.Tensor, cache: list[KVCache]) -> torch.Tensor:
        """Fill ``cache`` with ``input_ids [B, T]``; float32 logits of the last position ``[B, V]``."""
        if input_ids.shape[0] != cache[0].batch:
            raise ValueError(f"prefill of {input_ids.shape[0]} sequences into a cache for {cache[0].batch}")
        t = input_ids.shape[1]
        return self._run(input_ids, "prefill", self._rope(t, None), None, True, cache)[:, -1].float()

    def decode(self, token: torch.Tensor, pos: torch.Tensor, cache: list[KVCache]) -> torch.Tensor:
        """One static-shape step: ``token [B,1]`` at ``pos [1]`` -> float32 logits ``[B, V]``."""
        return self._run(token, "decode", self._rope(1, pos), pos, True, cache)[:, -1].float()


def layer_caches(cache: list | None, n: int) -> list:
    """Per-layer caches for a family's ``_run`` loop (``None`` for each layer without a cache)."""
    return cache if cache is not None else [None] * n


# --------------------------------------------------------------------------- adapter


@dataclass
class ModuleAdapter:
    """``DecoderAdapter`` over a ``CachedDecoderLM``: batched, with explicit static KV caches.

    ``prefill``/``decode`` without a ``cache`` use the adapter's own one (allocated for the
    batch of the ids), as tests and single-sequence callers do; the engine passes its caches.
    """

    module: CachedDecoderLM
    name: str = ""
    cache: list | None = None

    @property
    def vocab_size(self) -> int:
        return self.module.vocab_size

    @property
    def max_len(self) -> int:
        return self.module.max_len

    @property
    def attention_impl(self) -> str:
        return self.module.attention_impl

    def new_cache(self, batch: int) -> list[KVCache]:
        return self.module.new_cache(batch)

    def cache_tensors(self, cache: list) -> list[torch.Tensor]:
        """The tensors of ``cache`` whose first dimension is the batch."""
        return [t for kv in cache for t in (kv.k, kv.v)]

    def cache_bytes(self, batch: int) -> int:
        """Bytes of a cache for ``batch`` sequences (nothing allocated)."""
        p = next(self.module.parameters())
        return sum(2 * batch * a.n_kv_heads * a.max_len * a.head_dim * p.element_size()
                   for a in self.module.attention_layers())

    def reset_cache(self, cache: list | None = None) -> None:
        """Forget every cached position (the adapter's own cache when ``cache`` is None).

        Nothing to zero: prefill rewrites the prompt's slots and decode writes each slot
        before a query can see it."""
        if cache is None and self.cache is None:
            self.cache = self.new_cache(1)

    def release_cache(self) -> None:
        """Drop the adapter's own cache."""
        self.cache = None

    def _own(self, batch: int) -> list:
        if self.cache is None or self.cache[0].batch != batch:
            self.cache = self.new_cache(batch)
        return self.cache

    def prefill(self, input_ids: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.module.prefill(input_ids, cache if cache is not None else self._own(input_ids.shape[0]))

    def decode(self, token: torch.Tensor, pos: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        with torch.no_grad():
            return self.module.decode(token, pos, cache if cache is not None else self._own(token.shape[0]))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full-sequence logits ``[B, T, V]`` (grad mode is the caller's)."""
        return self.module(input_ids)

    def linear_layers(self) -> list[tuple[str, int, int]]:
        """``(name, in_features, out_features)`` of every GEMM weight, in forward order."""
        extra = getattr(self.module, "linear_layers", None)
        if callable(extra):
            return extra()
        return [(n, m.in_features, m.out_features) for n, m in self.module.named_modules() if isinstance(m, nn.Linear)]
