"""Building a study family's module on a device: constructed on ``meta``, materialised in the
dtype asked for, its weights seeded (the same seed and device, the same weights) or loaded
strictly from safetensors, or this rank's tensor-parallel shard of them; and the families'
common ``build`` (:func:`build_adapter`).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from tuiprof import startup
from tuiprof.engine.tensor_parallel import (
    TPContext, fill_from_full, full_param_list, head_split, shard_linear, split_range,
)
from tuiprof.errors import TuiprofError

from tuiprof.engine.families._decoder import CachedDecoderLM, ModuleAdapter, SelfAttention


class WeightsMismatchError(TuiprofError):
    """Safetensors weights whose keys or shapes do not match the model definition."""


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


def family_build(model_cls: type, len_key: str, default_name: str, what: str, *,
                 tp: bool = True) -> Callable[..., ModuleAdapter]:
    """A study family's ``build`` (the contract in ``families/__init__.py``): :func:`build_adapter`
    over ``model_cls``, its cache length under ``len_key``. ``tp``: it takes a tensor-parallel
    context (``--tp`` is offered to the families whose ``build`` names one)."""

    def build(model_def: Mapping[str, Any], *, device: torch.device | str,
              dtype: torch.dtype | str, seed: int, weights: str | None = None,
              max_len: int | None = None, tp: TPContext | None = None) -> ModuleAdapter:
        return build_adapter(model_cls, len_key, default_name, model_def, device=device,
                             dtype=dtype, seed=seed, weights=weights, max_len=max_len, tp=tp)

    def build_single(model_def: Mapping[str, Any], *, device: torch.device | str,
                     dtype: torch.dtype | str, seed: int, weights: str | None = None,
                     max_len: int | None = None) -> ModuleAdapter:
        return build(model_def, device=device, dtype=dtype, seed=seed, weights=weights,
                     max_len=max_len)

    fn = build if tp else build_single
    fn.__name__ = fn.__qualname__ = "build"
    fn.__doc__ = f"Adapter over {what}."
    return fn
