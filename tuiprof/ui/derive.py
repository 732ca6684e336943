"""What the panes show, derived from a :class:`~tuiprof.store.StoreView` (pure; no Textual).

Everything here is a plain function of the view, so it is unit-testable and could run on a
worker thread. Token-level numbers come from ``view.tokens`` (the bounded window of recent
tokens); whole-session numbers from ``view.token_stats``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..analysis.breakdown import KernelRow
from ..analysis.tokens import traced_tokens
from ..analysis.tracing import (MIN_UNTRACED, TracingCost, busy_basis_label, kernel_times,
                                tracing_cost, untraced_wall_ms)
from ..phases import COMPILED, DECODE, EAGER, OTHER, PREFILL
from ..text import printable
from . import format as fmt
from .adapters import kernel_name

ALL = "all"
PHASE_CYCLE = (DECODE, PREFILL, OTHER, ALL)
NVML_SERIES = (
    # key, label, unit ("%": fixed 0..100 scale)
    ("gpm_sm_util", "SM util (GPM)", "%"),
    ("gpm_sm_occupancy", "SM occupancy", "%"),
    ("gpm_dram_bw_util", "DRAM BW util", "%"),
    ("gpm_tensor_util", "Tensor util", "%"),
    ("util_gpu", "GPU util (NVML)", "%"),
    ("util_memory", "Mem util (NVML)", "%"),
)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def median(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def gpu_ms(row: Any) -> float | None:
    """GPU time of a token: the engine's measurement if any, else the union of its kernels."""
    if row.gpu_ms is not None:
        return row.gpu_ms
    if row.busy_ns:
        return row.busy_ns / 1e6
    return None


def busy_fraction(row: Any, wall_ms: float | None = None) -> float | None:
    """Share (%) of a token's wall time during which some kernel of it was running; over
    ``wall_ms`` instead when given (an untraced step's: :func:`busy_wall`), at most 100."""
    if not row.done or row.end_ns <= row.start_ns:
        return None
    if wall_ms:
        return min(100.0, 100.0 * row.busy_ns / 1e6 / wall_ms)
    return 100.0 * row.busy_ns / (row.end_ns - row.start_ns)


def busy_wall(view: Any, phase: str, mode: str) -> float | None:
    """The wall time (ms) a traced step's kernel-busy time is shared over: the median of the
    untraced steps of (``phase``, ``mode``) in the view's configuration, or None (too few:
    each traced step's own wall time, which tracing stretches)."""
    return untraced_wall_ms(view, phase, mode)


def basis_note(wall_ms: float | None) -> str:
    """How the busy shares on screen were computed: ``of an untraced step (2.90 ms)``."""
    label = busy_basis_label(wall_ms is not None)
    return f"{label} ({wall_ms:.2f} ms)" if wall_ms is not None else label


def traced_rows(rows: list, phase: str, mode: str) -> list:
    """Done tokens of (``phase``, ``mode``) whose kernel records are in: the only tokens per-token
    kernel figures may come from. Sampling leaves most tokens untraced, and CUPTI delivers a
    traced token's records some time after it ends. Prefills are traced outside the bursts and
    a loop restart brings one in often, so mixing phases would show a prefill as "the latest
    token"."""
    return [r for r in rows if r.done and r.phase == phase and r.mode == mode
            and getattr(r, "sampled", True) and r.kernels > 0]


@dataclass
class TokenKernels:
    """Kernel figures of one traced token, for a footer that names the token it speaks of."""

    seq: int
    phase: str
    mode: str
    kernels: int
    busy_pct: float | None
    gpu_ms: float | None = None
    host_ms: float | None = None


@dataclass
class EarlierTraced:
    """Running means over the traced tokens of (phase, mode) that have left the series."""

    count: int
    kernels: float | None
    busy_pct: float


def earlier_traced(view: Any, phase: str, mode: str) -> EarlierTraced | None:
    """The store's running means of traced tokens that left the series, or ``None``: compiled
    sampling traces 4 steps in 4,096, so at most times every traced step is older than the
    series of 2,048 (and "no traced step yet" would be wrong). Busy share as
    :func:`busy_fraction`: over an untraced step's wall time where there is one
    (:func:`busy_wall`), else each token over its own."""
    ts = view.token_stats.get((phase, mode)) or {}
    busy, kn = ts.get("busy_pct"), ts.get("kernels")
    kernels = kn.mean if kn is not None and kn.count else None
    wall, busy_ns = busy_wall(view, phase, mode), ts.get("busy_ns")
    if wall is not None and busy_ns is not None and busy_ns.count:
        return EarlierTraced(busy_ns.count, kernels,
                             min(100.0, 100.0 * busy_ns.mean / 1e6 / wall))
    if busy is not None and busy.count:
        return EarlierTraced(busy.count, kernels, busy.mean)
    # A snapshot written before "busy_pct" existed: mean busy time over the median step
    busy_ns, host = ts.get("busy_ns"), ts.get("host_ms")
    if busy is None and busy_ns is not None and busy_ns.count and host is not None \
            and host.median:
        return EarlierTraced(busy_ns.count, kernels, 100.0 * busy_ns.mean / 1e6 / host.median)
    return None


def latest_traced(view: Any, phase: str, mode: str) -> TokenKernels | None:
    """The latest traced token of (``phase``, ``mode``) in the series, or ``None``; its busy
    share over :func:`busy_wall` where there is one."""
    for r in reversed(view.tokens):
        if r.done and r.phase == phase and r.mode == mode and getattr(r, "sampled", True) \
                and r.kernels > 0:
            return TokenKernels(r.seq, r.phase, r.mode, r.kernels,
                                busy_fraction(r, busy_wall(view, phase, mode)), r.gpu_ms,
                                r.host_ms)
    return None


def traced_vs_untraced(view: Any, phase: str, mode: str,
                       k: TokenKernels | None = None) -> str:
    """What tracing costs the steps of (``phase``, ``mode``), for a footer: ``GPU 3.10 vs 2.74
    ms untraced (+13 %: tracing cost)`` for the traced step ``k`` against the untraced steps'
    median, or the medians' ``traced steps run 12 % slower: tracing cost``; "" without
    untraced steps."""
    cost = tracing_cost(view, phase, mode)
    if cost is None:
        return ""
    own = None
    if k is not None:
        own = k.gpu_ms if cost.source == "gpu_ms" else k.host_ms
    if own:
        what = "GPU" if cost.source == "gpu_ms" else "wall"
        pct = 100.0 * (own / cost.untraced_ms - 1.0)
        return (f"{what} {own:.2f} vs {cost.untraced_ms:.2f} ms untraced "
                f"({pct:+.0f} %: tracing cost)")
    return cost.text()


def done_rows(view: Any, phase: str | None = None, mode: str | None = None,
              compiling: bool = False) -> list:
    """Finished rows of the view's configuration; steps decoded beside a compile only when
    ``compiling`` (they are timed apart: the compile slowed them); never a step that
    recorded CUDA graphs again after tuiprof dropped them (timed apart too)."""
    return [r for r in view.tokens if r.done and (phase is None or r.phase == phase)
            and (mode is None or r.mode == mode) and (compiling or not r.compiling)
            and not r.rerecord]


# ------------------------------------------------------------------ header
@dataclass
class HeaderNumbers:
    model: str = "?"
    device: str = "?"
    dtype: str = "?"
    weights: str = "?"
    mode: str = EAGER
    steps: int = 0
    batch: Any = 1                   # sequences per step of the configuration shown
    tok_s: float | None = None       # every sequence counted: batch x steps/s
    ttft_ms: float | None = None
    itl_p50: float | None = None     # ms per step (what each sequence waits per token)
    itl_p99: float | None = None
    # the ms/step figures are of steps measured while traced (too few untraced steps shown:
    # every step traced, or CUPTI attached throughout); tracing stretches a step, so say so
    itl_traced: bool = False
    overhead_pct: float | None = None
    overhead_method: str = ""
    rank: str = ""               # "rank 1/2 TP" in a session of several ranks
    compile_cost: tuple | None = None   # (median ms/step beside a compile, clean median, n)
    beside_compile: bool = False     # the figures are of steps decoded beside a compile


def rank_label(meta: dict) -> str:
    """``rank 1/2`` when the view is one rank of a tensor-parallel session; ``process 2/5 pid
    1234`` (and its rank, if it joined a job) when it is one process of a program's; else
    ""."""
    world, rank = meta.get("world_size"), meta.get("rank")
    label = ""
    if isinstance(world, int) and world > 1 and isinstance(rank, int):
        label = f"rank {rank}/{world}"
    proc = meta.get("process")
    if isinstance(proc, dict) and isinstance(proc.get("count"), int) and proc["count"] > 1:
        head = f"process {proc.get('index')}/{proc['count']} pid {proc.get('pid')}"
        if proc.get("host"):   # a fleet of hosts: which host first
            head = f"host {printable(proc['host'], 24)} {head}"
        label = f"{head} {label}" if label else head
    return label


def compile_cost(view: Any, mode: str) -> tuple | None:
    """``(median ms/step of steps decoded beside a compile, clean median, their count)`` for
    ``mode``'s decode steps of the view's configuration; None when there were none."""
    ts = view.token_stats.get((DECODE, mode)) or {}
    cs = ts.get("compiling_ms")
    if cs is None or not cs.count:
        return None
    clean = ts["host_ms"].median if ts.get("host_ms") is not None and ts["host_ms"].count else None
    return cs.median, clean, cs.count


def compile_cost_text(cost: tuple) -> str:
    """``beside the compile: 12.3 ms/step vs 8.10 clean (+52%, 340 steps)``."""
    busy, clean, n = cost
    more = f", {busy / clean - 1:+.0%}" if clean else ""
    return (f"beside the compile: {busy:.2f} ms/step vs {clean:.2f} clean ({n:,} steps{more})"
            if clean else f"beside the compile: {busy:.2f} ms/step ({n:,} steps)")


def marked_steps(counters: dict) -> int:
    """Steps the session recorded: a program's fixed windows count only while no source marked
    a step (the windows cut while it imported and built its model are not steps of its loop)."""
    total = int(counters.get("tokens", 0))
    windows = int(counters.get("window_steps", 0))
    return total - windows if total > windows else total


def header_numbers(view: Any, mode: str, window: int = 64) -> HeaderNumbers:
    meta = view.meta
    model = printable(meta.get("model") or "?")
    dtype = meta.get("dtype")
    weights = meta.get("weights")
    low = model.lower()
    if not dtype:
        dtype = next((d for d in ("bf16", "fp16", "fp32", "fp8") if d in low), "?")
    if not weights:
        weights = "random" if "random" in low else "?"
    device = printable(meta.get("device") or "?").replace("NVIDIA ", "")
    recent = done_rows(view, DECODE, mode, compiling=True)[-window:]
    beside = bool(recent) and recent[-1].compiling   # a compile runs beside decoding now
    decode = [r for r in recent if r.compiling] if beside else done_rows(view, DECODE, mode)[-window:]
    host = [r.host_ms for r in decode if r.host_ms > 0]
    # ms/step from the untraced steps where enough are shown (a step run with CUPTI attached,
    # traced or at a burst's edge, runs slower); else from all of them, marked traced
    untraced = [r.host_ms for r in decode if r.host_ms > 0 and not r.attached]
    step_ms = untraced if len(untraced) >= MIN_UNTRACED or len(untraced) == len(host) else host
    batch: Any = decode[-1].batch if decode else view.batch
    tok_s = None
    if host:  # a step of a batch makes one token per sequence: count them all
        made = sum(max(1, getattr(r, "batch", 1)) for r in decode if r.host_ms > 0)
        tok_s = 1000.0 * made / sum(host)
    else:
        ts = view.token_stats.get((DECODE, mode))
        if ts and ts["host_ms"].count and ts["host_ms"].mean:
            seqs = ts.get("seqs")
            per = seqs.total / seqs.count if seqs is not None and seqs.count else 1
            tok_s = per * 1000.0 / ts["host_ms"].mean
    prefill = done_rows(view, PREFILL)
    ttft = prefill[-1].host_ms if prefill else None
    if ttft is None:
        for (ph, _m), ts in view.token_stats.items():
            if ph == PREFILL and ts["host_ms"].count:
                ttft = ts["host_ms"].mean
    ov = view.overhead or {}
    return HeaderNumbers(
        model=model, device=device, dtype=printable(dtype), weights=printable(weights),
        mode=printable(mode),
        steps=marked_steps(view.counters), batch=batch, tok_s=tok_s, ttft_ms=ttft,
        itl_p50=percentile(step_ms, 50), itl_p99=percentile(step_ms, 99),
        itl_traced=step_ms is host and len(untraced) < len(host),
        overhead_pct=ov.get("pct"), overhead_method=printable(ov.get("method", "")),
        rank=rank_label(meta),
        compile_cost=compile_cost(view, mode), beside_compile=beside,
    )


# ------------------------------------------------------------------ latency chart
@dataclass
class LatencySeries:
    seq: list = field(default_factory=list)
    host: list = field(default_factory=list)
    gpu: list = field(default_factory=list)
    prefill: list = field(default_factory=list)      # (seq, host_ms)
    mode_marks: list = field(default_factory=list)   # (seq, text): mode and batch switches
    modes: list = field(default_factory=list)
    compiling: list = field(default_factory=list)    # (seq, host_ms) of steps beside a compile
    rerecord: list = field(default_factory=list)     # (seq, host_ms) of steps that recorded
                                                     # CUDA graphs again (tuiprof's drop)


def latency_series(view: Any, n: int = 256) -> LatencySeries:
    """ms per step of the last ``n`` steps of every configuration (the session's timeline)."""
    rows = [r for r in (view.timeline or view.tokens) if r.done][-n:]
    out = LatencySeries()
    prev_mode = prev_batch = None
    first = rows[0].seq if rows else 0
    for r in rows:
        out.seq.append(r.seq)
        out.host.append(r.host_ms)
        out.gpu.append(gpu_ms(r))
        out.modes.append(r.mode)
        if r.compiling:
            out.compiling.append((r.seq, r.host_ms))
        if r.rerecord:
            out.rerecord.append((r.seq, r.host_ms))
        if prev_batch is not None and r.batch != prev_batch:
            out.mode_marks.append((r.seq, f"→b{r.batch}"))
        prev_batch = r.batch
        if r.phase == PREFILL:
            out.prefill.append((r.seq, r.host_ms))
        elif prev_mode is not None and r.mode != prev_mode:
            out.mode_marks.append((r.seq, printable(f"→{r.mode}", 40)))
        if r.phase == DECODE:
            prev_mode = r.mode
    marked = {s for s, _ in out.mode_marks}
    for ev in view.events:
        seq, _ts, kind, text = ev
        if kind in ("mode", "batch") and seq >= first and seq not in marked \
                and seq not in {s - 1 for s in marked}:
            out.mode_marks.append((seq, printable(text, 40)))
    out.mode_marks.sort()
    return out


def place_labels(marks: list[tuple[float, str]], x0: float, x1: float,
                 cols: int) -> list[tuple[float, str]]:
    """Where the labels of vertical marks go on one text row of a chart ``cols`` characters wide
    spanning ``x0``..``x1``: ``(x where the label starts, text)``. A label starts just right of
    its mark (or ends just left of it at the right edge); labels that would overlap another or
    leave the chart are dropped, the newest kept first. Their lines stay."""
    if cols <= 0 or x1 <= x0:
        return []
    per_col = (x1 - x0) / cols
    taken: list[tuple[float, float]] = []
    out = []
    for x, text in sorted(marks, reverse=True):
        c = (x - x0) / per_col
        start = c + 1
        if start + len(text) > cols:
            start = c - 1 - len(text)
        end = start + len(text)
        if start < 0 or end > cols or any(start <= b + 1 and a <= end + 1 for a, b in taken):
            continue
        taken.append((start, end))
        out.append((x0 + start * per_col, text))
    return sorted(out)


# ------------------------------------------------------------------ kernels
def kernel_ns_text(r: KernelRow, value_ns: float, launches: int = 1) -> str:
    """A kernel time of row ``r`` as shown: less the measured per-kernel cost of tracing
    (``launches`` times it, for a total), or marked ``≤`` as an upper bound while that cost is
    not measured (:mod:`tuiprof.analysis.tracing`)."""
    t = r.times
    if t is None:
        return fmt.ns(value_ns)
    return ("≤" if t.upper_bound else "") + fmt.ns(max(0.0, value_ns - t.correction_ns * launches))


def kernel_modes(view: Any, phase: str) -> dict[str, int]:
    """Total kernel ns per mode for ``phase`` (``all``: every phase)."""
    out: dict[str, int] = {}
    for (_name, ph, mode), agg in view.kernels.items():
        if phase == ALL or ph == phase:
            out[mode] = out.get(mode, 0) + agg.stats.total
    return out


def resolve_kernel_phase(view: Any, phase: str) -> str:
    """``phase``, or ``all`` when the session has no decode kernels but has others (a program
    without marked steps: its kernels are in ``window`` or ``other``)."""
    if phase == DECODE and not kernel_modes(view, DECODE) and kernel_modes(view, ALL):
        return ALL
    return phase


def resolve_kernel_mode(view: Any, mode: str, phase: str) -> str:
    """The requested mode, or the mode that has kernels in this phase when it has none."""
    modes = kernel_modes(view, phase)
    if modes.get(mode):
        return mode
    if modes:
        return max(modes, key=modes.get)
    return mode


def kernel_rows(view: Any, mode: str, phase: str) -> list[KernelRow]:
    """One row per kernel name in (mode, phase); ``phase == "all"`` merges phases."""
    merged: dict[str, Any] = {}
    for (name, ph, md), agg in view.kernels.items():
        if md != mode or (phase != ALL and ph != phase):
            continue
        cur = merged.get(name)
        if cur is None:
            merged[name] = agg if phase != ALL else agg.copy()
        else:
            cur.stats.merge(agg.stats)
            cur.graph_launches += agg.graph_launches
            cur.loop_launches += agg.loop_launches
            cur.loop_ns += agg.loop_ns
            for cfg, c in agg.configs.items():
                cur.configs[cfg] = cur.configs.get(cfg, 0) + c
    total = sum(a.stats.total for a in merged.values()) or 1
    ntok = traced_tokens(view, phase, mode) if phase != ALL else 0
    rows = []
    for name, agg in merged.items():
        rows.append(KernelRow(
            name=name, info=kernel_name(name), phase=phase, mode=mode, stats=agg.stats,
            share=agg.stats.total / total, grid=agg.grid, block=agg.block,
            registers=agg.registers, shared_mem=agg.shared_mem,
            graph_launches=agg.graph_launches, configs=dict(agg.configs),
            per_token=(agg.stats.count / ntok) if ntok else None,
            loop_launches=agg.loop_launches,
            times=kernel_times(agg.stats.mean, agg.graph_launches, agg.stats.count)))
    return rows


SORT_KEYS = {
    "pct": lambda r: r.stats.total,
    "total": lambda r: r.stats.total,
    "count": lambda r: r.stats.count,
    "avg": lambda r: r.stats.mean,
    "max": lambda r: r.stats.max,
    "name": lambda r: r.info.short.lower(),
    "library": lambda r: (r.info.library.lower(), -r.stats.total),
    "category": lambda r: (r.info.category.lower(), -r.stats.total),
}
SORT_CYCLE = ("pct", "count", "avg", "max", "name", "library", "category")


def select_kernels(rows: list[KernelRow], sort: str = "pct", descending: bool = True,
                   text: str = "", n: int = 50) -> list[KernelRow]:
    """Filter by case-insensitive substring (short, demangled, library, category), sort, top n."""
    if text:
        t = text.lower()
        rows = [r for r in rows if t in r.info.short.lower() or t in r.info.demangled.lower()
                or t in r.info.library.lower() or t in r.info.category.lower()
                or t in r.name.lower()]
    key = SORT_KEYS.get(sort, SORT_KEYS["pct"])
    rev = descending if sort not in ("name", "library", "category") else not descending
    rows = sorted(rows, key=lambda r: (key(r), r.name), reverse=rev)
    return rows[:n]


# ------------------------------------------------------------------ utilisation / memory
def nvml_series(view: Any, key: str, n: int) -> list:
    return [s.get(key) for s in view.nvml[-n:]]


def mean(values: list) -> float | None:
    nums = [v for v in values if v is not None]
    return sum(nums) / len(nums) if nums else None


def alloc_deltas(view: Any, key: str = "allocation_all_allocated") -> list:
    """Per-token increase of a cumulative caching-allocator counter (decode tokens)."""
    out = []
    prev = None
    for r in view.tokens:
        a = r.alloc
        if not a or key not in a:
            prev = None
            continue
        if prev is not None:
            out.append(a[key] - prev)
        prev = a[key]
    return out


# ------------------------------------------------------------------ mode comparison
@dataclass
class ModeFigures:
    """What the compare screen shows of one configuration (batch x mode): its decode steps'
    figures as shown, and its top kernels. (The analysis's timing of a phase and mode is
    :class:`tuiprof.analysis.tokens.ModeSummary`.)"""

    mode: str
    batch: Any = 1
    tokens: int = 0           # every decode step of the configuration
    traced: int = 0           # decode steps whose kernels were traced (kernel figures' base)
    ms_token: float | None = None
    tok_s: float | None = None
    gpu_ms: float | None = None
    busy_pct: float | None = None
    busy_wall_ms: float | None = None  # busy_pct's basis: an untraced step's wall (None: own)
    kernels_token: float | None = None
    graph_pct: float | None = None
    alloc_req_token: float | None = None
    tracing: TracingCost | None = None        # traced vs untraced steps
    top: list = field(default_factory=list)   # KernelRow, by total time


def mode_summary(view: Any, mode: str, top: int = 8) -> ModeFigures:
    """Decode figures of ``mode`` in the view's configuration (per step; tokens/s counts every
    sequence)."""
    rows = done_rows(view, DECODE, mode)
    s = ModeFigures(mode, view.batch)
    ts = view.token_stats.get((DECODE, mode))
    s.tokens = ts["host_ms"].count if ts else len(rows)
    s.traced = traced_tokens(view, DECODE, mode)
    if not rows and not s.tokens:
        return s
    host = [r.host_ms for r in rows]
    # the whole session's median, as the step count and tokens/s beside it and the table of
    # every configuration (the series holds only the last steps)
    s.ms_token = ts["host_ms"].median if ts and ts["host_ms"].count else (
        median(host) if host else None)
    # throughput over every step of the configuration: all sequences' tokens / total time
    seqs_st = ts.get("seqs") if ts else None
    if ts and ts["host_ms"].count and ts["host_ms"].total > 0:
        n = seqs_st.total if seqs_st is not None and seqs_st.count == ts["host_ms"].count \
            else ts["host_ms"].count * (view.batch if isinstance(view.batch, int) else 1)
        s.tok_s = n * 1000.0 / ts["host_ms"].total
    elif host and sum(host) > 0:
        s.tok_s = sum(r.batch for r in rows) * 1000.0 / sum(host)
    g = [gpu_ms(r) for r in rows if gpu_ms(r) is not None]
    s.gpu_ms = median(g)
    # kernel figures only from tokens whose device records were kept (sampling)
    # (none at all without CUPTI: its steps are "sampled" by the schedule, with no records)
    krows = [r for r in rows if getattr(r, "sampled", True)] if s.traced else []
    s.busy_wall_ms = wall = busy_wall(view, DECODE, mode)
    s.tracing = tracing_cost(view, DECODE, mode)
    b = [busy_fraction(r, wall) for r in krows if busy_fraction(r, wall) is not None]
    s.busy_pct = median(b)
    if krows:
        s.kernels_token = sum(r.kernels for r in krows) / len(krows)
        kt = sum(r.kernels for r in krows)
        s.graph_pct = 100.0 * sum(r.graph_kernels for r in krows) / kt if kt else None
    elif s.traced and ts and ts["kernels"].count:  # every token of this mode has left the window
        s.kernels_token = ts["kernels"].mean
        over = wall or s.ms_token
        if over and ts["busy_ns"].count:
            s.busy_pct = min(100.0, 100.0 * ts["busy_ns"].mean / 1e6 / over)
    deltas = []
    prev = None
    for r in view.tokens:
        a = r.alloc if (r.mode == mode and r.phase == DECODE) else None
        v = a.get("allocation_all_allocated") if a else None
        if v is not None and prev is not None:
            deltas.append(v - prev)
        prev = v
    s.alloc_req_token = median(deltas)
    s.top = select_kernels(kernel_rows(view, mode, DECODE), "pct", True, "", top)
    return s


def compare(view: Any, a: str = EAGER, b: str = COMPILED, top: int = 8) -> tuple[ModeFigures, ModeFigures]:
    return mode_summary(view, a, top), mode_summary(view, b, top)


def configurations(view: Any) -> list[tuple]:
    """Every (batch, mode) of the session with decode steps, batches increasing."""
    out = []
    for key in view.config_keys:
        sub = view.select(key)
        modes = {m for (ph, m), ts in sub.token_stats.items() if ph == DECODE and
                 (ts["host_ms"].count or (ts.get("compiling_ms") and ts["compiling_ms"].count))}
        modes |= {r.mode for r in sub.tokens if r.phase == DECODE and r.done}
        out += [(key, m) for m in (EAGER, COMPILED) if m in modes]
        out += [(key, m) for m in sorted(modes - {EAGER, COMPILED})]
    return out


def default_pair(view: Any, configs: list[tuple]) -> tuple[tuple, tuple]:
    """The pair the compare screen opens on: eager vs compiled at the batch in use when both
    were measured, else the first configuration against the one in use."""
    here = [c for c in configs if c[0] == view.batch]
    if {m for _b, m in here} >= {EAGER, COMPILED}:
        return (view.batch, EAGER), (view.batch, COMPILED)
    if len(configs) >= 2:
        cur = here[-1] if here else configs[-1]
        first = configs[0] if configs[0] != cur else configs[1]
        return first, cur
    only = configs[0] if configs else (view.batch, EAGER)
    return only, (only[0], COMPILED if only[1] == EAGER else EAGER)


def config_summary(view: Any, config: tuple, top: int = 8) -> ModeFigures:
    """:func:`mode_summary` of configuration ``(batch, mode)``."""
    return mode_summary(view.select(config[0]), config[1], top)


def view_signature(view: Any) -> tuple:
    """Changes whenever anything a pane shows may have changed (cheap)."""
    c = view.counters
    last = view.tokens[-1] if view.tokens else None
    return (c.get("records"), c.get("tokens"), c.get("dropped"), len(view.nvml),
            view.nvml[-1].get("ts_ns") if view.nvml else None, len(view.events),
            last.seq if last else None, last.done if last else None,
            tuple(sorted((k, v.get("ok")) for k, v in view.collectors.items())),
            tuple(sorted(view.overhead.items())) if view.overhead else ())
