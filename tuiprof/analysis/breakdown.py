"""Where the time goes: GPU busy vs wall per token, shares by category and library,
prefill vs decode, eager-attention split, and the rows of the kernel table."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..phases import DECODE, OTHER, PREFILL
from ..store.stats import RunningStats
from .gpus import gpu_spec
from .kernels import ATTENTION, COPY, ELEMENTWISE, MEMCPY, REDUCTION, KernelInfo, kernel_info
from .occupancy import launch_info
from .roofline import match_gemms
from .tokens import steady_tokens, token_timing
from .tracing import untraced_wall_ms

__all__ = ["Share", "shares", "category_shares", "library_shares", "gpu_time_ns",
           "phase_split", "LaunchBound", "launch_bound", "KernelRow", "top_kernels",
           "attention_split", "LAUNCH_BOUND_BUSY_FRACTION", "FUSABLE"]

LAUNCH_BOUND_BUSY_FRACTION = 0.5   # GPU busy less than this share of a token's wall time


@dataclass(frozen=True, slots=True)
class Share:
    key: str
    ns: int
    share: float          # of the total of the same breakdown
    launches: int


def _agg_items(view, phase: str | None, mode: str | None):
    for (name, ph, md), agg in view.kernels.items():
        if (phase is None or ph == phase) and (mode is None or md == mode):
            yield name, agg


def shares(view, by: str = "category", phase: str | None = "decode", mode: str | None = None,
           include_copies: bool = True) -> dict[str, Share]:
    """GPU time per category (or ``by="library"``) over the whole session, largest first.

    Kernel time from the aggregates; with ``include_copies`` the category breakdown also holds
    CUPTI memcpy and memset time as ``memcpy/memset`` (libraries cover kernels only)."""
    ns: dict[str, int] = {}
    n: dict[str, int] = {}
    for name, agg in _agg_items(view, phase, mode):
        info = kernel_info(name)
        key = info.category if by == "category" else info.library
        ns[key] = ns.get(key, 0) + agg.stats.total
        n[key] = n.get(key, 0) + agg.stats.count
    if include_copies and by == "category":
        for (kind, ph, md), (dur, _b) in view.memcpy.items():
            if (phase is None or ph == phase) and (mode is None or md == mode):
                ns[MEMCPY] = ns.get(MEMCPY, 0) + dur.total
                n[MEMCPY] = n.get(MEMCPY, 0) + dur.count
        for (ph, md), (dur, _b) in view.memset.items():
            if (phase is None or ph == phase) and (mode is None or md == mode):
                ns[MEMCPY] = ns.get(MEMCPY, 0) + dur.total
                n[MEMCPY] = n.get(MEMCPY, 0) + dur.count
    total = sum(ns.values())
    rows = [Share(k, v, v / total if total else 0.0, n[k]) for k, v in ns.items()]
    rows.sort(key=lambda s: -s.ns)
    return {s.key: s for s in rows}


def category_shares(view, phase: str | None = "decode", mode: str | None = None) -> dict[str, Share]:
    return shares(view, "category", phase, mode)


def library_shares(view, phase: str | None = "decode", mode: str | None = None) -> dict[str, Share]:
    return shares(view, "library", phase, mode, include_copies=False)


def gpu_time_ns(view, phase: str | None = "decode", mode: str | None = None) -> int:
    """Kernel + memcpy + memset time of ``phase``/``mode`` over the session."""
    return sum(s.ns for s in shares(view, "category", phase, mode).values())


def phase_split(view, mode: str | None = None) -> dict[str, dict]:
    """Prefill vs decode (and ``other``: outside any token): GPU ns, wall ms, tokens."""
    out: dict[str, dict] = {}
    for phase in (PREFILL, DECODE, OTHER):
        gpu = gpu_time_ns(view, phase, mode)
        wall = sum(v["host_ms"].total for (p, m), v in view.token_stats.items()
                   if p == phase and (mode is None or m == mode))
        n = sum(v["host_ms"].count for (p, m), v in view.token_stats.items()
                if p == phase and (mode is None or m == mode))
        if gpu or n:
            out[phase] = {"gpu_ms": gpu / 1e6, "wall_ms": wall, "tokens": n}
    tot = sum(d["gpu_ms"] for d in out.values())
    for d in out.values():
        d["gpu_share"] = d["gpu_ms"] / tot if tot else 0.0
    return out


@dataclass(frozen=True, slots=True)
class LaunchBound:
    """Median split of steady decode tokens of one mode."""

    mode: str
    tokens: int
    wall_ms: float
    busy_ms: float
    busy_fraction: float
    head_ms: float
    tail_ms: float
    gaps_ms: float
    kernels_per_token: float
    us_per_kernel_wall: float     # wall / kernels: host time available per launch
    graph_fraction: float         # graph kernels / kernels
    launch_bound: bool            # busy_fraction < LAUNCH_BOUND_BUSY_FRACTION
    # wall_ms and busy_fraction are of an untraced step ("untraced": the median wall time of
    # the steps run with CUPTI detached, busy over it) or of the traced steps ("traced");
    # head, tail and gaps are the traced steps' either way
    basis: str = "traced"


def launch_bound(view, mode: str | None = None, phase: str = "decode") -> LaunchBound | None:
    """Medians over steady tokens (warm-up skipped) of the busy/idle split; None if no token."""
    toks = steady_tokens(view, phase, mode) or [t for t in view.tokens if t.done and t.sampled
                                                and t.phase == phase and (mode is None or t.mode == mode)]
    if not toks:
        return None
    tt = [token_timing(t) for t in toks]

    def med(k: str) -> float:
        return float(np.median([getattr(x, k) for x in tt]))

    kern = float(np.median([x.kernels for x in tt]))
    wall = med("wall_ms")
    bf = med("busy_frac")
    busy = med("busy_ms")
    basis = "traced"
    untraced = untraced_wall_ms(view, phase, mode or toks[0].mode)
    if untraced is not None:  # tracing stretches the step: an untraced one is the basis
        wall, bf, basis = untraced, min(1.0, busy / untraced), "untraced"
    nk = sum(x.kernels for x in tt)
    return LaunchBound(mode or toks[0].mode, len(tt), wall, busy, bf, med("head_ms"),
                       med("tail_ms"), med("gaps_ms"), kern,
                       wall * 1000 / kern if kern else 0.0,
                       sum(x.graph_kernels for x in tt) / nk if nk else 0.0,
                       bf < LAUNCH_BOUND_BUSY_FRACTION, basis)


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One row of a kernel table (:func:`top_kernels`, the kernels pane): a kernel name's
    aggregate in one phase and mode, joined with its names and classes."""

    name: str                 # raw (mangled) name: the row's key
    info: KernelInfo          # its names and classes (the panes': made printable)
    phase: str
    mode: str
    stats: RunningStats       # its durations, ns
    share: float              # of this phase/mode's kernel time, 0..1
    per_token: float | None   # launches per token of the phase/mode (None: not known)
    grid: tuple
    block: tuple
    registers: int
    shared_mem: int
    graph_launches: int
    blocks: int = 0           # blocks of one launch, and waves on the GPU's SMs (top_kernels)
    waves: float = 0.0
    configs: dict = field(default_factory=dict)   # (grid, block) -> launches, at most 16
    loop_launches: int = 0    # launched outside a step's model forward (the loop's own)
    times: Any = None         # analysis.tracing.KernelTimes: corrected, or an upper bound

    @property
    def launches(self) -> int:
        return self.stats.count

    @property
    def pct(self) -> float:
        """``share`` in percent."""
        return 100.0 * self.share

    @property
    def total_ms(self) -> float:
        return self.stats.total / 1e6

    @property
    def mean_us(self) -> float:
        return self.stats.mean / 1e3

    @property
    def median_us(self) -> float:
        return self.stats.median / 1e3

    @property
    def min_us(self) -> float:
        return self.stats.min / 1e3

    @property
    def max_us(self) -> float:
        return self.stats.max / 1e3

    @property
    def stddev_us(self) -> float:
        return self.stats.stddev / 1e3


def top_kernels(view, mode: str | None = None, phase: str | None = "decode",
                n: int = 20) -> list[KernelRow]:
    """The ``n`` kernels with the most total time in ``phase``/``mode`` (None = all)."""
    spec = gpu_spec(view.meta)
    items = list(_agg_items(view, phase, mode))
    total = sum(a.stats.total for _, a in items)
    ntok = sum(v["host_ms"].count for (p, m), v in view.token_stats.items()
               if (phase is None or p == phase) and (mode is None or m == mode))
    items.sort(key=lambda x: -x[1].stats.total)
    rows = []
    for name, a in items[:n]:
        st = a.stats
        li = launch_info(a.grid, a.block, a.registers, a.shared_mem, spec.sm_count, spec.limits)
        rows.append(KernelRow(name, kernel_info(name), a.phase, a.mode, st,
                              st.total / total if total else 0.0,
                              st.count / ntok if ntok else 0.0, a.grid, a.block, a.registers,
                              a.shared_mem, a.graph_launches, li.blocks, li.waves))
    return rows


def attention_split(view, mode: str | None = None, phase: str = "decode") -> dict:
    """Attention time: fused attention kernels, or for an eager (non-fused) path the softmax
    kernels and the attention matmuls (q·kᵀ, p·v: GEMMs beyond the model's linear layers,
    identified by :func:`tuiprof.analysis.roofline.match_gemms`). Times are ms per token."""
    toks = [t for t in view.tokens if t.done and t.sampled and t.phase == phase
            and (mode is None or t.mode == mode)]
    ntok = len(toks) or 1
    fused = softmax = 0
    for name, agg in _agg_items(view, phase, mode):
        info = kernel_info(name)
        if info.category == ATTENTION:
            fused += agg.stats.total
        elif info.category == REDUCTION and "softmax" in (info.short + info.raw).lower():
            softmax += agg.stats.total
    ntok_all = sum(v["host_ms"].count for (p, m), v in view.token_stats.items()
                   if p == phase and (mode is None or m == mode)) or ntok
    out = {"path": "fused" if fused else ("eager" if softmax else "none"),
           "fused_attention_ms": fused / 1e6 / ntok_all, "softmax_ms": softmax / 1e6 / ntok_all,
           "attention_matmul_ms": None, "linear_matmul_ms": None}
    if out["path"] == "eager":
        m = match_gemms(view, mode=mode, phase=phase)
        if m.ok:
            qk = sum(g.duration_ns + g.aux_ns for g in m.launches if g.linear.name.startswith("attn_"))
            lin = sum(g.duration_ns + g.aux_ns for g in m.launches if not g.linear.name.startswith("attn_"))
            out["attention_matmul_ms"] = qk / 1e6
            out["linear_matmul_ms"] = lin / 1e6
    return out


FUSABLE = (ELEMENTWISE, COPY)  # categories that fusion removes
