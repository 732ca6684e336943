"""Per-token timing and per-mode summaries from ``view.tokens`` plus ``view.token_stats``.

``view.token_stats`` holds wall time (``host_ms``) for every token of the session and the
kernel counters (``kernels``, ``busy_ns``, ``kernel_ns``) only for tokens that left the
window; the tokens still in ``view.tokens`` are added here.

The busy share of a mode is its traced steps' kernel-busy time over the wall time of an
*untraced* step (the median of the steps run with CUPTI detached, :mod:`.tracing`) where there
are enough of those, else over the traced steps' own wall time, which tracing stretches
(``busy_basis`` says which).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tracing import busy_correction_ns, launch_path, untraced_wall_ms

__all__ = ["TokenTiming", "token_timing", "ModeSummary", "mode_summaries", "tokens_of",
           "steady_tokens", "traced_tokens", "mode_launch_path"]


@dataclass(frozen=True, slots=True)
class TokenTiming:
    """Where the wall time of one token went (all in ms)."""

    seq: int
    wall_ms: float       # start mark -> end mark
    busy_ms: float       # union of kernel intervals
    kernel_ms: float     # sum of kernel durations
    head_ms: float       # start mark -> first kernel start (host work before the GPU starts)
    tail_ms: float       # last kernel end -> end mark (sync, copy to host, sampling on host)
    span_ms: float       # first kernel start -> last kernel end
    gaps_ms: float       # span - busy: GPU idle between kernels
    busy_frac: float     # busy / wall
    kernels: int
    graph_kernels: int


def token_timing(row) -> TokenTiming:
    """Split one finished TokenRow's wall time; a token without kernels is all head."""
    wall = max(0, row.end_ns - row.start_ns) if row.end_ns else int(row.host_ms * 1e6)
    if row.kernels and row.first_kernel_ns:
        head = max(0, row.first_kernel_ns - row.start_ns)
        tail = max(0, row.end_ns - row.last_kernel_end_ns) if row.end_ns else 0
        span = max(0, row.last_kernel_end_ns - row.first_kernel_ns)
    else:
        head, tail, span = wall, 0, 0
    gaps = max(0, span - row.busy_ns)
    return TokenTiming(row.seq, wall / 1e6, row.busy_ns / 1e6, row.kernel_ns / 1e6, head / 1e6,
                       tail / 1e6, span / 1e6, gaps / 1e6,
                       row.busy_ns / wall if wall else 0.0, row.kernels, row.graph_kernels)


def tokens_of(view, phase: str | None = None, mode: str | None = None,
              sampled_only: bool = True) -> list:
    """Finished tokens in the window, filtered by phase/mode (and sampling). Steps decoded
    beside a compile, or recording CUDA graphs again after tuiprof dropped them, are left
    out (their timing is kept apart)."""
    return [t for t in view.tokens if t.done and (phase is None or t.phase == phase)
            and (mode is None or t.mode == mode) and (t.sampled or not sampled_only)
            and not t.apart]


def traced_tokens(view, phase: str, mode: str) -> int:
    """Tokens of (phase, mode) whose kernels were traced: the ones the kernel aggregates come
    from (sampling leaves the others without records), so the divisor of any per-token figure
    taken from them. Tokens that left the series are counted by the store's running
    statistics."""
    if not view.kernels_traced:
        return 0  # no CUPTI in this session: nothing was traced, whatever the sampling said
    ts = view.token_stats.get((phase, mode)) or {}
    gone = ts["kernels"].count if "kernels" in ts else 0
    return gone + sum(1 for t in view.tokens
                      if t.done and t.sampled and t.phase == phase and t.mode == mode)


def steady_tokens(view, phase: str = "decode", mode: str | None = None, skip: int = 2) -> list:
    """Sampled decode tokens without the first ``skip`` of each run (warm-up, compilation,
    CUDA-graph capture); a run restarts when the step number goes back."""
    out = []
    seen = 0
    last_step = None
    for t in tokens_of(view, phase, mode):
        if last_step is not None and t.step <= last_step:
            seen = 0
        last_step = t.step
        if seen >= skip:
            out.append(t)
        seen += 1
    return out


@dataclass(frozen=True, slots=True)
class ModeSummary:
    phase: str
    mode: str
    tokens: int                  # whole session (steps)
    tokens_per_s: float          # every sequence counted: batch x 1000 / mean ms per step
    ms_mean: float
    ms_median: float             # whole session (RunningStats median)
    ms_p90: float                # window only (view.tokens)
    ms_p99: float                # window only
    kernels_per_token: float     # window + tokens that left it
    busy_ms_per_token: float
    busy_fraction: float         # sum busy / sum wall, same tokens
    window_tokens: int
    unsampled_tokens: int        # in the window, without kernel data
    batch: float = 1.0           # sequences per step (mean)
    busy_basis: str = "traced"   # busy_fraction's denominator: "untraced" (the median wall
                                 # time of untraced steps) or "traced" (the traced steps' own)
    traced_busy_fraction: float = 0.0    # sum busy / sum wall of the traced steps themselves
    untraced_ms: float | None = None     # median wall time of untraced steps (None: too few)
    busy_correction_ms: float = 0.0      # taken from a traced step's busy time (tracing's own
                                         # per-kernel cost, analysis.tracing), 0: none


def mode_summaries(view, phase: str = "decode", basis: str = "auto") -> dict[str, ModeSummary]:
    """One :class:`ModeSummary` per mode that has tokens of ``phase``. ``basis``: ``auto``
    (untraced steps' wall time where measured) or ``traced`` (the traced steps' own: what
    tuiprof showed before untraced steps were told apart)."""
    out: dict[str, ModeSummary] = {}
    modes = {m for (p, m) in view.token_stats if p == phase}
    modes |= {t.mode for t in view.tokens if t.phase == phase and t.done}
    for mode in sorted(modes):
        ts = view.token_stats.get((phase, mode), {})
        host = ts.get("host_ms")
        win = tokens_of(view, phase, mode, sampled_only=False)
        sampled = [t for t in win if t.sampled]
        wall = np.array([t.host_ms for t in win], dtype=float)
        n_all = host.count if host is not None and host.count else len(win)
        mean = host.mean if host is not None and host.count else (float(wall.mean()) if len(wall) else 0.0)
        median = host.median if host is not None and host.count else (float(np.median(wall)) if len(wall) else 0.0)
        ev_k = ts.get("kernels")
        ev_b = ts.get("busy_ns")
        n_k = (ev_k.count if ev_k else 0) + len(sampled)
        kernels = (ev_k.total if ev_k else 0) + sum(t.kernels for t in sampled)
        busy_ns = (ev_b.total if ev_b else 0) + sum(t.busy_ns for t in sampled)
        ev_wall_ms = _traced_wall_left(ts, host, win) if ev_k and ev_k.count else 0.0
        wall_ms = ev_wall_ms + sum(t.host_ms for t in sampled)
        seqs = ts.get("seqs")
        batch = (seqs.total / seqs.count if seqs is not None and seqs.count
                 else (sum(t.batch for t in win) / len(win) if win else 1.0))
        per_token = kernels / n_k if n_k else 0.0
        busy_ms = busy_ns / 1e6 / n_k if n_k else 0.0
        traced_frac = busy_ns / 1e6 / wall_ms if wall_ms > 0 else 0.0
        untraced = untraced_wall_ms(view, phase, mode) if basis == "auto" else None
        fix = busy_correction_ns(per_token, mode_launch_path(view, phase, mode)) / 1e6
        frac, basis = traced_frac, "traced"
        if untraced is not None and n_k:
            frac, basis = min(1.0, max(0.0, busy_ms - fix) / untraced), "untraced"
        elif n_k and fix and wall_ms > 0:
            frac = max(0.0, busy_ns / 1e6 - fix * n_k) / wall_ms
        out[mode] = ModeSummary(
            phase, mode, n_all, batch * 1000.0 / mean if mean > 0 else 0.0, mean, median,
            float(np.percentile(wall, 90)) if len(wall) else 0.0,
            float(np.percentile(wall, 99)) if len(wall) else 0.0,
            per_token, busy_ms, frac, len(win), len(win) - len(sampled),
            batch, basis, traced_frac, untraced, fix)
    return out


def mode_launch_path(view, phase: str, mode: str) -> str:
    """How (``phase``, ``mode``)'s traced kernels were launched, most of them: ``graph`` (CUDA
    graphs) or ``stream``."""
    graph = count = 0
    for (_name, ph, md), agg in view.kernels.items():
        if ph == phase and md == mode:
            graph += agg.graph_launches
            count += agg.stats.count
    return launch_path(graph, count)


def _traced_wall_left(ts: dict, host, win: list) -> float:
    """Wall ms of the traced tokens that left the window: the busy share's denominator must
    be the same tokens as its numerator. Snapshots before ``traced_ms``: from the traced
    steps' mean busy share; without either, every token's wall time (right only when every
    token was traced)."""
    traced = ts.get("traced_ms")
    if traced is not None and traced.count:
        return traced.total
    pct, busy = ts.get("busy_pct"), ts.get("busy_ns")
    if pct is not None and pct.count and pct.mean > 0 and busy is not None:
        return busy.total / 1e6 / (pct.mean / 100.0)
    return (host.total - sum(t.host_ms for t in win)) if host is not None else 0.0
