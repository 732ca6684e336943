"""Megatron-style tensor parallelism for the decoders: what each rank holds and computes.

Column-parallel q/k/v and MLP up-projections (each rank keeps a slice of the output
features), row-parallel attention-out and MLP-down projections (a slice of the input features)
followed by an all-reduce, so each layer costs two all-reduces of one hidden vector per token.
Embeddings, norms and the LM head are replicated: every rank computes the full logits and picks
the same token (no gather; the replicated LM head costs each rank the full head GEMV).

Heads are split by KV group: rank r gets a contiguous run of KV heads and the query heads that
read them, as evenly as possible (17 heads over 2 ranks: 9 and 8), so any head count works
as long as there are at least as many KV heads as ranks. Uneven splits make one rank slower
and the others wait for it in the all-reduce: a real straggler, which the analysis shows.

Random weights: every rank generates each *full* tensor in the order and with the rule of the
single-GPU build, from the same seed, and keeps its slice (:func:`fill_from_full`), so TP=N holds
exactly the weights of TP=1 and greedy outputs can be compared token for token.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import TuiprofError

TEST_DELAY_ENV = "TUIPROF_TEST_TP_DELAY_US"   # "rank:us[,rank:us]": for tests only, see below
Slice = tuple[int, int, int]          # (dim, start, stop) of a full tensor kept by one rank
InitRule = Callable[[str, torch.Tensor, torch.Generator], None]   # fills a full tensor in place


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` items over ``parts`` ranks as evenly as possible, the larger shares first."""
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


def split_range(n: int, parts: int, rank: int) -> tuple[int, int]:
    """The ``[start, stop)`` of rank ``rank`` in :func:`split_sizes`."""
    sizes = split_sizes(n, parts)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


@dataclass(frozen=True)
class HeadSplit:
    """The query and KV heads one rank owns (contiguous ranges of the full model's heads)."""

    q: tuple[int, int]
    kv: tuple[int, int]

    @property
    def n_q(self) -> int:
        return self.q[1] - self.q[0]

    @property
    def n_kv(self) -> int:
        return self.kv[1] - self.kv[0]


def head_split(n_heads: int, n_kv_heads: int, world: int, rank: int, *, what: str = "model"
               ) -> HeadSplit:
    """Rank ``rank``'s heads: KV heads split evenly, each with its group of query heads."""
    if n_heads % n_kv_heads:
        raise TuiprofError(f"{what}: {n_heads} query heads are not a multiple of {n_kv_heads} KV heads")
    if n_kv_heads < world:
        raise TuiprofError(f"--tp {world} needs at least {world} KV heads; {what} has {n_kv_heads}: "
                           f"use --tp {n_kv_heads} or fewer")
    group = n_heads // n_kv_heads
    kv0, kv1 = split_range(n_kv_heads, world, rank)
    return HeadSplit((kv0 * group, kv1 * group), (kv0, kv1))


@dataclass(frozen=True)
class TPContext:
    """What sharding needs of the process group: this rank, the world, the group to reduce over."""

    rank: int
    world_size: int
    group: object = None          # torch.distributed ProcessGroup (None: the default group)


def test_delay_ns(rank: int, spec: str | None = None) -> int:
    """The host delay before each eager collective of ``rank`` that ``$TUIPROF_TEST_TP_DELAY_US``
    asks for (``"1:500"``: 500 µs on rank 1; ``"0:200,3:900"``), in ns; 0 when unset.

    For tests only: a rank made late by a known amount, which the cross-rank analysis must find
    as that rank's lateness and the others' wait (tests/sessions, bench/verify/verify_tp_wait.py)."""
    spec = os.environ.get(TEST_DELAY_ENV, "") if spec is None else spec
    out = 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        r, sep, us = part.partition(":")
        try:
            if not sep or float(us) < 0:
                raise ValueError
            if int(r) == rank:
                out = int(float(us) * 1000)
        except ValueError:
            raise TuiprofError(f"{TEST_DELAY_ENV}={spec!r}: give rank:microseconds, e.g. "
                               f"1:500") from None
    return out


def _spin(ns: int) -> None:
    """Busy-wait ``ns`` on the host (a sleep would wake late by the timer's slack)."""
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


class RowParallelLinear(nn.Linear):
    """``nn.Linear`` over a slice of the input features, summed across ranks.

    Eager: ``dist.all_reduce`` in place (an NCCL kernel on the current stream). Under
    ``torch.compile``: the functional collective, which dynamo traces and CUDA graphs capture
    (a plain ``dist.all_reduce`` would break the graph). The bias is added once, after the sum.
    ``$TUIPROF_TEST_TP_DELAY_US`` (tests only) delays this rank's host before each eager
    collective (:func:`test_delay_ns`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPContext,
                 device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.tp_group = tp.group
        self.test_delay_ns = test_delay_ns(tp.rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if torch.compiler.is_compiling():
            import torch.distributed._functional_collectives as funcol  # noqa: PLC0415
            y = funcol.all_reduce(y, "sum", self.tp_group)
        else:
            import torch.distributed as dist  # noqa: PLC0415
            if self.test_delay_ns:
                _spin(self.test_delay_ns)
            dist.all_reduce(y, group=self.tp_group)
        return y if self.bias is None else y + self.bias


def _linear_like(old: nn.Linear, in_f: int, out_f: int, row: TPContext | None) -> nn.Linear:
    kw = {"device": old.weight.device, "dtype": old.weight.dtype}
    if row is not None:
        return RowParallelLinear(in_f, out_f, old.bias is not None, row, **kw)
    return nn.Linear(in_f, out_f, bias=old.bias is not None, **kw)


def shard_linear(parent: nn.Module, attr: str, style: str, rng: tuple[int, int], tp: TPContext,
                 prefix: str, slices: dict[str, Slice]) -> None:
    """Replace ``parent.attr`` (a Linear) by its ``colwise`` or ``rowwise`` part ``rng``.

    ``slices`` receives where the new parameters come from in the full tensors (names under
    ``prefix``, the module's full name)."""
    old = getattr(parent, attr)
    n = rng[1] - rng[0]
    if style == "colwise":
        new = _linear_like(old, old.in_features, n, None)
        slices[f"{prefix}.weight"] = (0, *rng)
        if old.bias is not None:
            slices[f"{prefix}.bias"] = (0, *rng)
    elif style == "rowwise":
        new = _linear_like(old, n, old.out_features, tp)
        slices[f"{prefix}.weight"] = (1, *rng)
    else:
        raise TuiprofError(f"tensor parallelism: unsupported split {style!r} for {prefix}")
    setattr(parent, attr, new)


def fill_from_full(local: nn.Module, full_params: Iterable[tuple[str, tuple, torch.dtype]],
                   slices: dict[str, Slice], rule: InitRule, gen: torch.Generator,
                   device: torch.device) -> None:
    """Generate each full tensor (order, shape and ``rule`` of the single-GPU build) and copy
    this rank's slice of it (or all of it, for a replicated tensor) into ``local``."""
    params = dict(local.named_parameters())
    with torch.no_grad():
        for name, shape, dtype in full_params:
            full = torch.empty(shape, dtype=dtype, device=device)
            rule(name, full, gen)
            dst = params.get(name)
            if dst is None:
                continue  # tied to a parameter already filled
            sl = slices.get(name)
            src = full if sl is None else full.narrow(sl[0], sl[1], sl[2] - sl[1])
            if tuple(src.shape) != tuple(dst.shape):
                raise TuiprofError(f"tensor parallelism: {name} has shape {tuple(dst.shape)} on "
                                   f"this rank, its slice {tuple(src.shape)}")
            dst.copy_(src)
            del full


def full_param_list(model: nn.Module) -> list[tuple[str, tuple, torch.dtype]]:
    """(name, shape, dtype) of every parameter in registration order (tied ones once)."""
    return [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()]


__all__ = ["split_sizes", "split_range", "HeadSplit", "head_split", "TPContext",
           "RowParallelLinear", "test_delay_ns", "TEST_DELAY_ENV", "shard_linear", "fill_from_full", "full_param_list", "Slice"]
