"""``llama_layer`` family: one Llama-2-7B-shaped decoder layer run as a decode workload.

The module also holds the decoder building blocks that the other study families
(``nanochat``, ``cs336``, ``deepseek``) share: RMSNorm, rotary embeddings in three
conventions, a static KV cache updated in place, a plain/SDPA attention switch, seeded
initialisation on the target device, strict safetensors loading and the adapter object
that satisfies ``tuiprof.engine.adapter.DecoderAdapter``.

The layer workload: hidden 4096, 32 heads of 128 (MHA), SwiGLU MLP 11008, RMSNorm, no
RoPE. It has no real embedding or LM head: token ids index a *fixed* seeded table of
``vocab_size x hidden`` (a non-persistent buffer, not a parameter), and the layer's output
hidden state is returned as the "logits" (so ``vocab_size == hidden_size``, 4096). Greedy
decoding therefore works and the engine can drive it like any decoder, while the measured
work is one layer's decode step against a static KV cache.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from tuiprof import startup
from tuiprof.engine.tensor_parallel import (
    TPContext, fill_from_full, full_param_list, head_split, shard_linear, split_range,
)
from tuiprof.errors import TuiprofError

ATTENTION_IMPLS = ("plain", "sdpa")
"""``plain``: matmul + softmax + matmul (annotated for the sweep); ``sdpa``: fused kernel."""

ROPE_STYLES = ("half", "half_neg", "interleaved")
"""``half``: HF ``rotate_half``; ``half_neg``: nanochat's sign convention; ``interleaved``:
adjacent pairs (CS336)."""

ATTN_LABELS = {"scores": "attn::scores_matmul", "softmax": "attn::softmax", "values": "attn::values_matmul"}
"""``record_function`` labels emitted by the plain attention path (read by tuiprof.sweep)."""


class WeightsMismatchError(TuiprofError):
    """Safetensors weights whose keys or shapes do not match the model definition."""


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


# --------------------------------------------------------------------------- build + weights


def build_module(
    factory: Callable[[], CachedDecoderLM],
    *,
    name: str,
    device: torch.device | str,
    dtype: torch.dtype | str,
    seed: int,
    weights: str | None,
    ignore_prefixes: Iterable[str] = (),
    tp: TPContext | None = None,
) -> CachedDecoderLM:
    """Construct on ``meta``, materialise on ``device`` in ``dtype``, then load or seed weights.

    Random weights: see ``init_random``,
    drawn in parameter order from a generator seeded with ``seed`` on ``device`` (the same
    seed and device give the same weights). ``device="meta"`` builds shapes only.
    ``tp``: build this rank's tensor-parallel shard (:func:`shard_decoder`) holding its slice
    of the very weights of the single-device build.
    """
    dtype = _dtype(dtype)
    device = torch.device(device)
    with torch.device("meta"), _init_skipped():
        module = factory()
    module = module.to(dtype=dtype)
    if device.type == "meta":
        module.init_buffers(None)
        return module.eval()
    full = embeddings = slices = None
    if tp is not None:
        full = full_param_list(module)
        embeddings = _embedding_names(module)
        slices = shard_decoder(module, tp)
    module = _to_empty(module, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    if weights:
        load_weights(module, weights, name=name, ignore_prefixes=ignore_prefixes)
    elif tp is not None:
        fill_from_full(module, full, slices,
                       lambda n, t, g: init_param_(t, n in embeddings, g), gen, device)
    else:
        init_random(module, gen)
    module.init_buffers(gen)
    return module.eval()


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                   "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                   "kaiming_normal_", "orthogonal_", "sparse_")


@contextmanager
def _init_skipped() -> Iterator[None]:
    """``torch.nn.init`` does nothing while modules are built on the meta device.

    A meta tensor has no values to initialise, and the meta kernels of random fills
    (``nn.Embedding``'s ``normal_``) import ``torch._dynamo``: 1.5 s of an eager session's
    start-up on a CPU. Weights are drawn after ``to_empty`` (``init_random``), as before.
    """
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS if hasattr(nn.init, name)}

    def skip(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return tensor

    for name in saved:
        setattr(nn.init, name, skip)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _to_empty(module: nn.Module, device: torch.device) -> nn.Module:
    """``module.to_empty(device=device)`` with ``torch.empty`` instead of ``torch.empty_like``,
    whose reference implementation for meta tensors imports sympy (0.9 s on a CPU)."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))


def init_param_(p: torch.Tensor, embedding: bool, gen: torch.Generator) -> None:
    """The seeded init of one parameter: embeddings N(0, 1), other matrices
    N(0, 1/sqrt(fan_in)), vectors (norm gains) ones."""
    if embedding:
        p.normal_(0.0, 1.0, generator=gen)
    elif p.ndim >= 2:
        p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
    else:
        p.fill_(1.0)


def _embedding_names(module: nn.Module) -> set[str]:
    ids = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    return {n for n, p in module.named_parameters() if id(p) in ids}


def init_random(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded init in place, parameter by parameter in order (:func:`init_param_`). Reports
    phase ``initialising weights`` (bytes) at start-up."""
    embeddings = _embedding_names(module)
    params = list(module.named_parameters())
    total, done = sum(p.numel() * p.element_size() for _, p in params), 0
    with torch.no_grad(), startup.phase("initialising weights"):
        for name, p in params:
            init_param_(p, name in embeddings, gen)
            done += p.numel() * p.element_size()
            startup.advance(done, total)


def shard_decoder(module: nn.Module, tp: TPContext) -> dict:
    """Turn a (meta) decoder into rank ``tp.rank``'s shard, in place; returns the slices.

    Attention: q/k/v column-parallel by KV group, the out projection row-parallel; MLPs (any
    module with a ``tp_split``): up projections column-parallel, down row-parallel. The KV
    cache holds this rank's KV heads only. Everything else is replicated."""
    slices: dict = {}
    shard: dict = {"rank": tp.rank, "world_size": tp.world_size}
    names = {id(m): n for n, m in module.named_modules()}
    for m in list(module.modules()):
        prefix = names[id(m)]
        if isinstance(m, SelfAttention):
            hs = head_split(m.n_heads, m.n_kv_heads, tp.world_size, tp.rank,
                            what=type(module).__name__)
            hd = m.head_dim
            q, k, v, o = m.names
            qr, kvr = (hs.q[0] * hd, hs.q[1] * hd), (hs.kv[0] * hd, hs.kv[1] * hd)
            for attr, rng in ((q, qr), (k, kvr), (v, kvr)):
                shard_linear(m, attr, "colwise", rng, tp, f"{prefix}.{attr}", slices)
            shard_linear(m, o, "rowwise", qr, tp, f"{prefix}.{o}", slices)
            m.n_heads, m.n_kv_heads = hs.n_q, hs.n_kv
            shard.update(q_heads=list(hs.q), kv_heads=list(hs.kv))
        elif getattr(m, "tp_split", None) is not None:
            cols, row = m.tp_split
            inter = getattr(m, cols[0]).out_features
            rng = split_range(inter, tp.world_size, tp.rank)
            for attr in cols:
                shard_linear(m, attr, "colwise", rng, tp, f"{prefix}.{attr}", slices)
            shard_linear(m, row, "rowwise", rng, tp, f"{prefix}.{row}", slices)
            shard["mlp"] = list(rng)
    module.tp_shard = shard
    return slices


def load_weights(module: nn.Module, path: str, *, name: str, ignore_prefixes: Iterable[str] = ()) -> None:
    """Load a safetensors file (or every ``*.safetensors`` of a directory), strictly.

    Modules may define ``to_external(state) -> state`` / ``from_external(state) -> state``
    when their checkpoint layout differs from their parameters (e.g. stacked experts);
    keys starting with one of ``ignore_prefixes`` (e.g. a vision tower) are dropped first.
    Raises ``WeightsMismatchError`` with a one-line message on any mismatch.
    """
    from pathlib import Path

    from tuiprof.engine.weights import read_safetensors

    p = Path(path).expanduser()
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files:
        raise WeightsMismatchError(f"no *.safetensors files in {path} for {name}")
    state: dict[str, torch.Tensor] = {
        key: t for _, key, t in read_safetensors(
            files, "cpu", lambda f, why: WeightsMismatchError(f"cannot read weights {f} for {name}: {why}"))}
    prefixes = tuple(ignore_prefixes)
    if prefixes:
        state = {k: v for k, v in state.items() if not k.startswith(prefixes)}
    own = module.state_dict()
    to_ext = getattr(module, "to_external", None)
    expected = {k: tuple(v.shape) for k, v in (to_ext(own) if callable(to_ext) else own).items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = sorted(k for k in expected if k in state and tuple(state[k].shape) != expected[k])
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} with wrong shape "
                         f"(e.g. {k}: file {tuple(state[k].shape)}, model {expected[k]})")
        raise WeightsMismatchError(f"weights {path} do not match model {name}: " + "; ".join(parts))
    from_ext = getattr(module, "from_external", None)
    if callable(from_ext):
        state = from_ext(state)
    with torch.no_grad():
        for k, t in own.items():
            t.copy_(state[k])


def def_field(model_def: Any, key: str, default: Any = None) -> Any:
    """A field of a model definition given as a dict or as a ``registry.ModelDef``."""
    if isinstance(model_def, Mapping):
        return model_def.get(key, default)
    return getattr(model_def, key, default)


def with_max_len(config: Mapping[str, Any], key: str, max_len: int | None) -> Mapping[str, Any]:
    """``config`` with its sequence-length field ``key`` replaced by ``max_len`` (if given)."""
    return config if max_len is None else {**config, key: int(max_len)}


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        out = getattr(torch, str(dtype).replace("torch.", ""))
    except AttributeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    if not isinstance(out, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return out


# --------------------------------------------------------------------------- the layer workload


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


def build_adapter(model_cls: type, len_key: str, default_name: str, model_def: Mapping[str, Any], *,
                  device: torch.device | str, dtype: torch.dtype | str, seed: int,
                  weights: str | None, max_len: int | None,
                  tp: TPContext | None = None) -> ModuleAdapter:
    """The families' common build: config (with ``max_len`` under ``len_key``), seeded or
    ``weights``-loaded module (this rank's shard with ``tp``), adapter."""
    config = with_max_len(def_field(model_def, "config"), len_key, max_len)
    name = def_field(model_def, "name", default_name)
    module = build_module(lambda: model_cls(config), name=name, device=device, dtype=dtype, seed=seed,
                          weights=weights, ignore_prefixes=config.get("weights_ignore_prefixes", ()),
                          tp=tp)
    return ModuleAdapter(module, name)


def build(
    model_def: Mapping[str, Any],
    *,
    device: torch.device | str,
    dtype: torch.dtype | str,
    seed: int,
    weights: str | None = None,
    max_len: int | None = None,
    tp: TPContext | None = None,
) -> ModuleAdapter:
    """Adapter over one Llama-2-7B-shaped layer; ``weights`` keys: HF Llama layer keys without
    the ``model.layers.N.`` prefix (``input_layernorm.weight``, ``self_attn.q_proj.weight``, ...)."""
    return build_adapter(LlamaLayerLM, "max_len", "llama-layer", model_def, device=device,
                         dtype=dtype, seed=seed, weights=weights, max_len=max_len, tp=tp)
