"""Headline numbers of a session, per mode: TTFT, inter-token latency, ms/token, tokens/s.

Used by the snapshot's ``summary`` and by :mod:`.diff`. Everything here is derived from a
:class:`StoreView` and deterministic (the snapshot's byte-identical round trip relies on it).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..analysis import tracing
from ..analysis.tracing import SMALL_KERNEL_NS, tracing_cost, untraced_wall_ms
from ..store import StoreView
from ..store.records import DECODE, PREFILL


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), ``None`` for no values."""
    if not values:
        return None
    vs = sorted(values)
    pos = (len(vs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(vs) - 1)
    return vs[lo] + (vs[hi] - vs[lo]) * (pos - lo)


def decode_tokens(view: StoreView, mode: str) -> list:
    """Completed decode steps of ``mode`` in the token series, oldest first (steps decoded
    beside a compile left out: the compile slowed them)."""
    return [t for t in view.tokens if t.phase == DECODE and t.mode == mode and t.done
            and not t.apart]


def modes_of(view: StoreView) -> list[str]:
    """Modes with decode tokens, in order of first appearance (token series, then stats)."""
    out: list[str] = []
    for t in view.tokens:
        if t.phase == DECODE and t.mode not in out:
            out.append(t.mode)
    for (phase, mode) in view.token_stats:
        if phase == DECODE and mode not in out:
            out.append(mode)
    return out


def inter_token_ms(view: StoreView, mode: str) -> list[float]:
    """Gaps between consecutive token completions (ms), for decode tokens of ``mode`` whose
    predecessor (seq - 1, any phase) is in the series: what a streaming client sees."""
    by_seq = {t.seq: t for t in view.tokens if t.done}
    out = []
    for t in decode_tokens(view, mode):
        prev = by_seq.get(t.seq - 1)
        if prev is not None and prev.cycle == t.cycle and t.end_ns >= prev.end_ns:
            out.append((t.end_ns - prev.end_ns) / 1e6)
    return out


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def mode_summary(view: StoreView, mode: str) -> dict:
    """Decode figures of one mode (see docs/snapshot.md, ``summary``)."""
    toks = decode_tokens(view, mode)
    host = [t.host_ms for t in toks]
    itl = inter_token_ms(view, mode)
    ts = view.token_stats.get((DECODE, mode), {}).get("host_ms")
    seqs = view.token_stats.get((DECODE, mode), {}).get("seqs")
    tps = None
    if ts is not None and ts.count and ts.total > 0:
        n = seqs.total if seqs is not None and seqs.count == ts.count else ts.count
        tps = n / (ts.total / 1000.0)
    elif host and sum(host) > 0:
        tps = sum(t.batch for t in toks) / (sum(host) / 1000.0)
    batch = (seqs.total / seqs.count if seqs is not None and seqs.count
             else (sum(t.batch for t in toks) / len(toks) if toks else None))
    # kernel figures come from tokens whose device records were kept (sampling), and from the
    # running statistics of tokens that left the window; none without CUPTI
    traced = view.kernels_traced
    ktoks = [t for t in toks if t.sampled] if traced else []
    stats = view.token_stats.get((DECODE, mode), {}) if traced else {}
    wall = sum(t.end_ns - t.start_ns for t in ktoks)
    busy = sum(t.busy_ns for t in ktoks)
    kern = sorted(t.kernels for t in ktoks)
    kmed = percentile(kern, 50)
    kms = percentile([t.kernel_ns / 1e6 for t in ktoks], 50)
    busy_frac = busy / wall if wall > 0 else None
    old_k = stats.get("kernels")
    if not ktoks and old_k is not None and old_k.count:
        kmed = old_k.median
        kms = stats["kernel_ns"].median / 1e6
        if ts is not None and ts.count and stats["busy_ns"].count:
            busy_frac = stats["busy_ns"].mean / 1e6 / ts.mean
    # over an untraced step's wall time where untraced steps were measured (tracing stretches
    # a traced step's own), as the UI and the batch analysis
    untraced = untraced_wall_ms(view, DECODE, mode) if traced else None
    basis = "traced" if busy_frac is not None else None
    if untraced is not None and (ktoks or (old_k is not None and old_k.count)):
        n_old = old_k.count if old_k is not None else 0
        busy_ms = (sum(t.busy_ns for t in ktoks) / 1e6
                   + (stats["busy_ns"].total / 1e6 if n_old else 0.0)) / (len(ktoks) + n_old)
        busy_frac, basis = min(1.0, busy_ms / untraced), "untraced"
    cost = tracing_cost(view, DECODE, mode) if traced else None
    return {
        "decode_tokens": ts.count if ts is not None else len(toks),
        "tokens_in_series": len(toks),
        # over the whole session, as the mean and tokens/s (the series holds the last steps)
        "ms_per_token_median": _r(ts.median if ts is not None and ts.count else
                                  percentile(host, 50)),
        "sampled_tokens": len(ktoks) + (old_k.count if old_k is not None else 0),
        "ms_per_token_mean": _r(ts.mean if ts is not None and ts.count else
                                (sum(host) / len(host) if host else None)),
        "tokens_per_s": _r(tps),
        "batch": _r(batch),
        "itl_ms": {"median": _r(percentile(itl, 50)), "p90": _r(percentile(itl, 90)),
                   "p99": _r(percentile(itl, 99)), "count": len(itl)},
        "kernels_per_token_median": _r(kmed),
        "gpu_busy_fraction": _r(busy_frac),
        "gpu_busy_basis": basis,
        "untraced_ms_per_step_median": _r(untraced),
        # steps measured while traced (CUPTI attached: a burst and its edges) and untraced
        # ones, whole session: a traced step runs slower, so its time is told apart
        **_traced_split(view.token_stats.get((DECODE, mode), {})),
        "tracing_cost": ({k: (_r(v) if isinstance(v, float) else v)
                          for k, v in cost.to_dict().items()} if cost is not None else None),
        "kernel_ms_per_token_median": _r(kms),
    }


def _traced_split(stats: dict) -> dict:
    t, u = stats.get("traced_step_ms"), stats.get("untraced_ms")
    return {"traced_steps": t.count if t is not None else 0,
            "traced_ms_per_step_median": _r(t.median) if t is not None and t.count else None,
            "untraced_steps": u.count if u is not None else 0}


def tracing_mode(view: StoreView) -> str:
    """Which steps were traced, in words (``meta.tracing``), or none without kernel records."""
    if not view.kernels_traced:
        return "none (no kernel records: CUPTI off or absent)"
    return str(view.meta.get("tracing") or
               f"1 step in {view.meta.get('sample_every', '?')} on average")


def summary(view: StoreView) -> dict:
    """``{"ttft_ms": {...}, "modes": {mode: mode_summary}}``."""
    prefill = [t for t in view.tokens if t.phase == PREFILL and t.done]
    pf_stats = [s["host_ms"] for (ph, _m), s in view.token_stats.items() if ph == PREFILL]
    count = sum(s.count for s in pf_stats)
    return {
        "ttft_ms": {
            "last": _r(prefill[-1].host_ms) if prefill else None,
            "median": _r(percentile([t.host_ms for t in prefill], 50)),
            "count": count,
        },
        "tracing": tracing_mode(view),
        "modes": {m: mode_summary(view, m) for m in modes_of(view)},
        "kernel_times": kernel_times_note(),
    }


def kernel_times_note() -> dict:
    """How the kernel times of the file are to be read (analysis.tracing): the measured
    per-kernel cost of tracing by launch path (null: not measured, and the times of kernels
    shorter than ``small_kernel_ns`` are upper bounds)."""
    table = dict(sorted(tracing.DURATION_INFLATION_NS.items()))
    measured = any(v is not None for v in table.values())
    return {"duration_inflation_ns": table, "small_kernel_ns": SMALL_KERNEL_NS,
            "read_as": "corrected" if measured else "upper bounds below small_kernel_ns"}
