"""Hugging Face causal LMs behind the :class:`DecoderAdapter` contract (static KV cache)."""
from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch

from ..startup import advance, phase
from ..errors import TuiprofError
from .adapter import LinearInfo
from .hf_masks import DecodeMasks, make_masks, mask_maker
from .tensor_parallel import (
    RowParallelLinear, TPContext, fill_from_full, full_param_list, head_split, split_range,
)


def make_static_cache(model: torch.nn.Module, max_len: int, batch: int = 1) -> object:
    """A ``StaticCache`` for ``batch`` sequences, allocated now (not on the first forward) when
    supported."""
    with phase("allocating KV cache"):
        return _static_cache(model, max_len, batch)


def _static_cache(model: torch.nn.Module, max_len: int, batch: int) -> object:
    from transformers import StaticCache

    config = model.config
    param = next(model.parameters())
    try:
        cache = StaticCache(config=config, max_cache_len=max_len)
    except TypeError:  # transformers 4.x wanted batch size, device and dtype up front
        cache = StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len,
                            device=param.device, dtype=param.dtype)
    early = getattr(cache, "early_initialization", None)
    if early is not None:
        heads, head_dim = _kv_geometry(config)
        try:
            early(batch_size=batch, num_heads=heads, head_dim=head_dim, dtype=param.dtype,
                  device=param.device)
        except (TypeError, ValueError, AttributeError):
            pass  # lazily allocated by the first prefill instead
    return cache


def _kv_geometry(config: Any) -> tuple[int, int]:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return int(heads), int(head_dim)


class HFDecoderAdapter:
    """A ``*ForCausalLM`` with ``StaticCache``s; positions go in as ``position_ids``.

    The engine passes a cache per batch configuration (``new_cache``); ``prefill``/``decode``
    without one use the adapter's own cache, allocated at first use for the batch of the ids
    (never beside the engine's: that doubled the KV memory of a session).
    """

    def __init__(self, model: torch.nn.Module, max_len: int) -> None:
        self.model = model
        self.max_len = max_len
        out = model.get_output_embeddings()
        self.vocab_size = int(out.out_features if out is not None else model.config.vocab_size)
        self.device = next(model.parameters()).device
        self.cache: object | None = None
        self._cache_batch = 0
        self.compiled_steps: dict = {}
        # transformers < 5 also wanted cache_position; 5.x derives the write slot from the cache.
        params = inspect.signature(model.forward).parameters
        self._pass_cache_position = "cache_position" in params
        # transformers >= 5.24 names the cache argument ``cache`` (``past_key_values`` still
        # works there, with a FutureWarning on every call's first use)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._make_masks = mask_maker(model)

    def new_cache(self, batch: int) -> object:
        """An empty static cache for ``batch`` sequences."""
        return make_static_cache(self.model, self.max_len, batch)

    def cache_bytes(self, batch: int) -> int:
        """Bytes of a cache for ``batch`` sequences (nothing allocated)."""
        text = self.model.config
        text = text.get_text_config(decoder=True) if hasattr(text, "get_text_config") else text
        heads, head_dim = _kv_geometry(self.model.config)
        elem = next(self.model.parameters()).element_size()
        return 2 * int(text.num_hidden_layers) * batch * heads * self.max_len * head_dim * elem

    def cache_tensors(self, cache: object) -> list[torch.Tensor]:
        """The tensors of ``cache`` whose first dimension is the batch."""
        return [t for layer in getattr(cache, "layers", ()) for t in
                (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, torch.Tensor)]

    def _own(self, batch: int) -> object:
        if self.cache is None or batch != self._cache_batch:
            self.cache = self.new_cache(batch)
            self._cache_batch = batch
        return self.cache

    def reset_cache(self, cache: object | None = None) -> None:
        """Forget every cached position (of ``cache``, or of the adapter's own: made now)."""
        cache = self._own(self._cache_batch or 1) if cache is None else cache
        cache.reset()
        self.truncate(0, cache)

    def release_cache(self) -> None:
        """Give the adapter's own cache back (made again when needed)."""
        self.cache = None
        self._cache_batch = 0

    def truncate(self, length: int, cache: object | None = None) -> None:
        """Make the next write land at ``length`` (StaticLayer keeps its own counter)."""
        cache = self.cache if cache is None else cache
        if cache is None:
            return
        for layer in getattr(cache, "layers", ()):
            counter = getattr(layer, "cumulative_length", None)
            if isinstance(counter, torch.Tensor):
                counter.fill_(length)
            elif counter is not None:
                layer.cumulative_length = length

    def decode_masks(self, cache: object, batch: int) -> DecodeMasks | None:
        """The attention masks of ``cache``'s decode steps, made outside the forward as
        ``generate()`` makes them (None: the forward makes its own)."""
        if self._make_masks is None:
            return None
        return DecodeMasks(self._make_masks, self.model, cache, batch, self.max_len, self.device)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: object,
                 masks: object = None) -> torch.Tensor:
        kwargs = {"cache_position": positions[0]} if self._pass_cache_position else {}
        kwargs[self._cache_kw] = cache
        if masks is not None:
            kwargs["attention_mask"] = masks
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1,
                         **kwargs)
        return out.logits[:, -1, :]

    def prefill(self, input_ids: torch.LongTensor, cache: object | None = None) -> torch.Tensor:
        cache = self._own(input_ids.shape[0]) if cache is None else cache
        self.truncate(0, cache)
        b, t = input_ids.shape
        positions = torch.arange(t, device=input_ids.device).unsqueeze(0).expand(b, t)
        masks = None
        if self._make_masks is not None:  # as generate()'s first step: made before the forward
            masks = make_masks(self._make_masks, self.model, cache, positions,
                               torch.ones_like(input_ids))
        return self._forward(input_ids, positions, cache, masks)

    def decode(self, token: torch.LongTensor, pos: torch.LongTensor,
               cache: object | None = None, masks: object = None) -> torch.Tensor:
        """One step; ``masks`` from :meth:`decode_masks` (without, the forward makes its own)."""
        cache = self._own(token.shape[0]) if cache is None else cache
        return self._forward(token, pos.view(1, 1).expand(token.shape[0], 1), cache, masks)

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Full causal forward without any cache: ``[B, T]`` -> logits ``[B, T, V]``."""
        return self.model(input_ids=input_ids, use_cache=False).logits

    def linear_layers(self) -> list[LinearInfo]:
        """Linear layers in registration order, which is forward order for HF decoders."""
        return [(name, m.in_features, m.out_features) for name, m in self.model.named_modules()
                if isinstance(m, torch.nn.Linear)]


DEFAULT_MAX_LEN = 4096


def config_dict(model_def: Any) -> dict:
    """The HF config fields of a ``ModelDef`` or of a dict with a ``config`` key."""
    config = model_def.get("config") if isinstance(model_def, Mapping) else model_def.config
    return dict(config)


def resolve_max_len(config: Mapping[str, Any], max_len: int | None) -> int:
    """The static cache length: ``max_len`` if given, bounded by the model's positions."""
    limit = int(config.get("max_position_embeddings") or DEFAULT_MAX_LEN)
    return min(int(max_len), limit) if max_len else min(DEFAULT_MAX_LEN, limit)


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    dt = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return dt


def hf_config(config: Mapping[str, Any]) -> object:
    """A transformers config object from a config.json dict."""
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    return AutoConfig.for_model(model_type, **cfg)


def build_random(model_cls: type, config: object, *, dtype: torch.dtype | str,
                 device: torch.device | str, seed: int, init: bool = True,
                 tp: TPContext | None = None) -> torch.nn.Module:
    """Seeded random weights, allocated once on ``device`` in ``dtype``.

    Built on the meta device and materialised with ``to_empty``: letting each ``nn.Linear``
    initialise itself and then HF re-initialise it costs minutes for 0.6B params on a CPU.
    Parameters are drawn in order from one generator on ``device`` seeded with ``seed``, so
    the same seed and device give the same weights. ``init=False`` leaves them uninitialised
    (for weights loaded next). Reports phase ``initialising weights`` (bytes) at start-up.
    ``tp``: this rank's tensor-parallel shard (:func:`shard_config`) of the same weights.
    """
    dt = as_dtype(dtype)
    dev = torch.device(device)
    with torch.device("meta"):
        model = model_cls._from_config(config, dtype=dt)
    full = slices = None
    std = float(getattr(config, "initializer_range", 0.02))
    if tp is not None:
        model.tie_weights()
        full = full_param_list(model)
        local, slices, rowwise, shard = shard_config(model, config, tp)
        with torch.device("meta"):
            model = model_cls._from_config(local, dtype=dt)
        for name in rowwise:
            parent, _, attr = name.rpartition(".")
            old = model.get_submodule(name)
            setattr(model.get_submodule(parent), attr, RowParallelLinear(
                old.in_features, old.out_features, old.bias is not None, tp, device="meta",
                dtype=dt))
        model.tp_shard = shard
    model.to_empty(device=dev)
    model.tie_weights()  # to_empty gives each module its own tensor
    if init:
        gen = torch.Generator(device=dev).manual_seed(seed)
        if tp is not None:
            with phase("initialising weights"):
                fill_from_full(model, full, slices, lambda n, t, g: init_param_(n, t, std, g),
                               gen, dev)
        else:
            params = list(model.named_parameters())
            total, done = sum(p.numel() * p.element_size() for _, p in params), 0
            with torch.no_grad(), phase("initialising weights"):
                for name, p in params:
                    init_param_(name, p, std, gen)
                    done += p.numel() * p.element_size()
                    advance(done, total)
    _rebuild_rotary(model, dev)
    return model.eval().requires_grad_(False)


def init_param_(name: str, p: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """The seeded init of one parameter: matrices N(0, std), biases 0, RMSNorm gains 1."""
    if p.ndim >= 2:
        p.normal_(0.0, std, generator=gen)
    elif name.endswith("bias"):
        p.zero_()
    else:
        p.fill_(1.0)


# What tuiprof does with the split styles of transformers' ``base_model_tp_plan``.
_REPLICATED = ("replicated_with_grad_allreduce", "replicate", "replicated")
_HEADS = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "o_proj": "q"}


def shard_config(model: torch.nn.Module, config: object, tp: TPContext
                 ) -> tuple[object, dict, list[str], dict]:
    """This rank's config (local heads and MLP width) and where its tensors come from.

    *What* to split is transformers' own declaration, the config's ``base_model_tp_plan``
    ("layers.*.self_attn.q_proj": "colwise", ...); the split itself is tuiprof's (uneven head
    counts, the functional all-reduce under torch.compile): transformers applies its plan only
    when loading a checkpoint with ``from_pretrained`` (DTensor, even splits), not to a model
    built from a config with random weights. Returns (local config, slices, names of the
    row-parallel modules, shard facts)."""
    import copy
    import re

    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not plan:
        raise TuiprofError(f"--tp: {type(model).__name__} declares no tensor-parallel plan")
    prefix = getattr(model, "base_model_prefix", "model")
    rules = [(re.compile("^" + re.escape(k).replace(r"\*", r"\d+") + "$"), v) for k, v in plan.items()]
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    hs = head_split(heads, kv, tp.world_size, tp.rank, what=getattr(config, "model_type", "model"))
    inter = int(config.intermediate_size)
    mlp = split_range(inter, tp.world_size, tp.rank)
    slices: dict = {}
    rowwise: list[str] = []
    for name, mod in model.named_modules():
        rel = name[len(prefix) + 1:] if name.startswith(prefix + ".") else name
        style = next((v for rx, v in rules if rx.match(rel)), None)
        if style is None or style in _REPLICATED:
            continue
        if style == "embedding_rowwise" or not isinstance(mod, torch.nn.Linear):
            # tuiprof replicates embeddings (and any non-linear module a plan splits): the
            # vocabulary-parallel embedding of some transformers versions is not needed to
            # shard a decoder's matmuls (docs/multi-gpu.md)
            continue
        if style not in ("colwise", "rowwise") or not isinstance(mod, torch.nn.Linear):
            raise TuiprofError(f"--tp: split {style!r} of {rel} is not supported by tuiprof")
        which = _HEADS.get(name.rsplit(".", 1)[-1])
        rng = mlp if which is None else tuple(x * hd for x in (hs.q if which == "q" else hs.kv))
        dim = 0 if style == "colwise" else 1
        slices[f"{name}.weight"] = (dim, *rng)
        if style == "colwise" and mod.bias is not None:
            slices[f"{name}.bias"] = (0, *rng)
        if style == "rowwise":
            rowwise.append(name)
    local = copy.deepcopy(config)
    local.num_attention_heads, local.num_key_value_heads = hs.n_q, hs.n_kv
    local.head_dim = hd
    local.intermediate_size = mlp[1] - mlp[0]
    shard = {"rank": tp.rank, "world_size": tp.world_size, "q_heads": list(hs.q),
             "kv_heads": list(hs.kv), "mlp": list(mlp)}
    return local, slices, rowwise, shard


def _rebuild_rotary(model: torch.nn.Module, device: torch.device) -> None:
    """Recompute the non-persistent rotary tables that ``to_empty`` left uninitialised."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if hasattr(child, "inv_freq") and hasattr(child, "config"):
                with torch.device(device):
                    setattr(parent, child_name, type(child)(config=child.config))
