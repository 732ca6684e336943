"""Across tensor-parallel ranks: where each rank's step goes (compute, communication, idle,
their overlap), how far apart the ranks finish a step, which rank the others wait for, and
the findings that follow. Pure functions over a :class:`~tuiprof.store.rank_set.RanksView`.

Per traced step of one rank (its raw records): *communication* is the union of its NCCL
kernels, *compute* the union of every other kernel, memcpy and memset, *overlap* the time in
both, *idle* the step's wall time in neither. An NCCL kernel runs from its launch until the
collective completes, so it includes the time this rank waits for the slowest one: the rank
with the least communication and the most compute is the one the others wait for.

Steps match across ranks by (cycle, step, phase): every rank runs the same steps in lockstep.
Formulas and thresholds: docs/multi-gpu.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .findings import Finding, _severity
from .intervals import intersection, length, merge
from .kernels import is_communication, kernel_info
from .tokens import mode_summaries

__all__ = ["StepSplit", "step_splits", "RankSummary", "StepSkew", "RanksSummary",
           "ranks_summary", "find_ranks", "tp_scaling", "COMM_BOUND_SHARE", "STRAGGLER_RATIO",
           "NO_OVERLAP_FRACTION"]

COMM_BOUND_SHARE = 0.25      # communication share of the step on the least-waiting rank
STRAGGLER_RATIO = 1.10       # slowest rank's compute per step over the fastest's
STRAGGLER_MIN_MS = 0.02      # ... and at least this much more
NO_OVERLAP_FRACTION = 0.05   # of communication time hidden behind compute
NO_OVERLAP_MIN_SHARE = 0.10  # only worth saying when communication is this much of the step
SCALING_LOW = 0.7            # TP scaling efficiency below this is a finding
LAST_SHARE = 0.75            # without kernels: "slowest" ends this share of the steps last


@dataclass(frozen=True, slots=True)
class StepSplit:
    """One traced step of one rank (ns)."""

    seq: int
    cycle: int
    step: int
    phase: str
    mode: str
    wall_ns: int
    compute_ns: int
    comm_ns: int
    overlap_ns: int
    idle_ns: int
    comm_kernels: int
    comm_by_name: dict


def step_splits(view) -> list[StepSplit]:
    """Compute / communication / overlap / idle of every step whose raw records are in view."""
    rows = {t.seq: t for t in view.tokens if t.done and t.end_ns > t.start_ns}
    out = []
    for seq, recs in view.raw:
        t = rows.get(seq)
        if t is None or not recs:
            continue
        comp, comm = [], []
        by_name: dict[str, int] = {}
        for r in recs:
            kind = r[0]
            if kind == "K":
                if is_communication(r[1]):
                    comm.append((r[2], r[3]))
                    short = kernel_info(r[1]).short
                    by_name[short] = by_name.get(short, 0) + r[3] - r[2]
                else:
                    comp.append((r[2], r[3]))
            elif kind == "C":
                comp.append((r[3], r[4]))
            elif kind == "S":
                comp.append((r[2], r[3]))
        mc, mm = merge(comp), merge(comm)
        c, m = length(mc), length(mm)
        ov = intersection(mc, mm)
        wall = t.end_ns - t.start_ns
        out.append(StepSplit(seq, t.cycle, t.step, t.phase, t.mode, wall, c, m, ov,
                             max(0, wall - (c + m - ov)), len(comm), by_name))
    return out


@dataclass(frozen=True)
class RankSummary:
    """One rank's figures for one mode's decode steps (ms are medians per step)."""

    rank: int
    device: str
    mode: str
    decode_tokens: int
    tokens_per_s: float
    step_ms: float                    # host time per decode step, whole session (median)
    traced_steps: int                 # steps the split below comes from (raw records)
    compute_ms: float | None = None
    comm_ms: float | None = None
    overlap_ms: float | None = None
    idle_ms: float | None = None
    wall_ms: float | None = None      # of the traced steps
    comm_share: float | None = None   # communication / wall, summed over traced steps
    overlap_fraction: float | None = None   # of communication time
    comm_kernels_per_step: float | None = None
    collectives: list = field(default_factory=list)   # (short name, ms per step), largest first
    sm_util: float | None = None      # NVML/GPM means over the latest samples (%)
    dram_util: float | None = None
    tp_shard: dict | None = None


@dataclass(frozen=True)
class StepSkew:
    """How far apart the ranks end (and start) the same decode step (aligned clocks)."""

    steps: int
    end_median_us: float
    end_p90_us: float
    end_max_us: float
    start_median_us: float
    last_counts: tuple                # per rank: steps it ended last


@dataclass(frozen=True)
class RanksSummary:
    mode: str | None
    ranks: list
    skew: StepSkew | None
    slowest: int | None               # the rank the others wait for
    slowest_basis: str
    clock: dict


def _nvml_means(view, n: int = 50) -> tuple[float | None, float | None]:
    samples = list(view.nvml)[-n:]

    def mean(keys: tuple) -> float | None:
        for k in keys:
            vals = [s[k] for s in samples if isinstance(s.get(k), (int, float))]
            if vals:
                return float(np.mean(vals))
        return None

    return mean(("gpm_sm_util", "util_gpu")), mean(("gpm_dram_bw_util", "util_memory"))


def _mode_of(rv) -> str | None:
    for t in reversed(rv[0].tokens):
        if t.done and t.phase == "decode":
            return t.mode
    return None


def rank_summary(view, rank: int, mode: str) -> RankSummary:
    """One rank's :class:`RankSummary` for ``mode``."""
    ms = mode_summaries(view, "decode").get(mode)
    steps = [s for s in step_splits(view) if s.phase == "decode" and s.mode == mode]
    sm, dram = _nvml_means(view)
    meta = view.meta
    base = dict(rank=rank, device=str(meta.get("device_name") or meta.get("device") or "?"),
                mode=mode, decode_tokens=ms.tokens if ms else 0,
                tokens_per_s=ms.tokens_per_s if ms else 0.0, step_ms=ms.ms_median if ms else 0.0,
                traced_steps=len(steps), sm_util=sm, dram_util=dram,
                tp_shard=meta.get("tp_shard") if isinstance(meta.get("tp_shard"), dict) else None)
    if not steps:
        return RankSummary(**base)
    med = lambda xs: float(np.median(xs)) / 1e6  # noqa: E731
    wall = sum(s.wall_ns for s in steps)
    comm = sum(s.comm_ns for s in steps)
    names: dict[str, int] = {}
    for s in steps:
        for k, v in s.comm_by_name.items():
            names[k] = names.get(k, 0) + v
    coll = sorted(((k, v / 1e6 / len(steps)) for k, v in names.items()), key=lambda kv: -kv[1])
    return RankSummary(
        **base, compute_ms=med([s.compute_ns for s in steps]),
        comm_ms=med([s.comm_ns for s in steps]), overlap_ms=med([s.overlap_ns for s in steps]),
        idle_ms=med([s.idle_ns for s in steps]), wall_ms=med([s.wall_ns for s in steps]),
        comm_share=comm / wall if wall else None,
        overlap_fraction=sum(s.overlap_ns for s in steps) / comm if comm else None,
        comm_kernels_per_step=float(np.mean([s.comm_kernels for s in steps])),
        collectives=coll[:4])


def step_skew(rv, mode: str) -> StepSkew | None:
    """Skew of step ends (and starts) over decode steps every rank has, clocks aligned."""
    offsets = rv.clock.offsets_ns
    per_rank = []
    for view, off in zip(rv.views, offsets):
        per_rank.append({(t.cycle, t.step): (t.start_ns - off, t.end_ns - off)
                         for t in view.tokens if t.done and t.phase == "decode" and t.mode == mode})
    common = set(per_rank[0])
    for d in per_rank[1:]:
        common &= set(d)
    if not common:
        return None
    ends, starts, last = [], [], [0] * len(per_rank)
    for key in common:
        e = [d[key][1] for d in per_rank]
        s = [d[key][0] for d in per_rank]
        ends.append(max(e) - min(e))
        starts.append(max(s) - min(s))
        last[int(np.argmax(e))] += 1
    ends_us = np.array(ends, dtype=float) / 1e3
    return StepSkew(len(common), float(np.median(ends_us)), float(np.percentile(ends_us, 90)),
                    float(ends_us.max()), float(np.median(np.array(starts, dtype=float) / 1e3)),
                    tuple(last))


def ranks_summary(rv, mode: str | None = None) -> RanksSummary:
    """Per-rank figures, step skew and the slowest rank for ``mode`` (default: the mode of
    rank 0's latest decode step)."""
    mode = mode or _mode_of(rv)
    clock = rv.clock.to_dict()
    if mode is None:
        return RanksSummary(None, [], None, None, "no decode steps yet", clock)
    ranks = [rank_summary(v, r, mode) for r, v in enumerate(rv.views)]
    skew = step_skew(rv, mode)
    slowest, basis = None, "no decode steps on every rank yet"
    if all(r.compute_ms is not None for r in ranks) and len(ranks) > 1:
        slowest = max(range(len(ranks)), key=lambda i: ranks[i].compute_ms)
        basis = "most compute per traced step (the others wait in the all-reduce)"
    elif skew is not None and skew.steps and max(skew.last_counts) >= LAST_SHARE * skew.steps:
        slowest = int(np.argmax(skew.last_counts))
        basis = (f"ends its step last in {skew.last_counts[slowest]} of {skew.steps} steps "
                 f"(no kernel records)")
    elif skew is not None and skew.steps:
        basis = "no rank ends its steps last consistently (no kernel records)"
    return RanksSummary(mode, ranks, skew, slowest, basis, clock)


def tp_scaling(tp1_ms: float, tpn_ms: float, n: int) -> dict:
    """Speed-up of decode at TP=n over TP=1 and the scaling efficiency (speed-up / n)."""
    speedup = tp1_ms / tpn_ms if tpn_ms > 0 else 0.0
    return {"tp": n, "tp1_ms": tp1_ms, "tpn_ms": tpn_ms, "speedup": speedup,
            "efficiency": speedup / n if n else 0.0}


def find_ranks(rv, summary: RanksSummary | None = None) -> list:
    """Findings across ranks: communication-bound, straggler, no overlap, TP scaling."""
    s = summary or ranks_summary(rv)
    if s.mode is None or not s.ranks:
        return []
    n = len(s.ranks)
    out: list[Finding] = []
    traced = [r for r in s.ranks if r.comm_share is not None]
    step_ms = float(np.median([r.step_ms for r in s.ranks])) if s.ranks else 0.0
    meta = rv[0].meta
    params = meta.get("model_params") or (meta.get("params") if n == 1 else None)
    if traced and len(traced) == n:
        out += _comm_bound(s, traced, n, step_ms, params)
        out += _straggler(s, traced, step_ms)
        out += _no_overlap(s, traced, step_ms)
    out += _scaling(rv, s, n, step_ms)
    out.sort(key=lambda f: -(f.impact_ms_per_token or 0.0))
    return out


def _comm_bound(s: RanksSummary, traced: list, n: int, step_ms: float, params) -> list:
    lo = min(traced, key=lambda r: r.comm_share)
    hi = max(traced, key=lambda r: r.comm_share)
    if lo.comm_share < COMM_BOUND_SHARE:
        return []
    names = ", ".join(f"{k} {v:.3f} ms" for k, v in lo.collectives[:2])
    size = f" for a {params / 1e9:.2g}B-parameter model" if params else ""
    per_rank = ", ".join(f"rank {r.rank} {r.comm_share:.0%}" for r in traced)
    nums = {"mode": s.mode, "tp": n, "comm_share_min": lo.comm_share,
            "comm_share_max": hi.comm_share, "comm_ms_min": lo.comm_ms,
            "comm_ms_max": hi.comm_ms, "collectives_per_step": lo.comm_kernels_per_step,
            "per_rank_share": {str(r.rank): r.comm_share for r in traced}}
    ev = (f"NCCL kernels are {lo.comm_share:.0%}–{hi.comm_share:.0%} of each {s.mode} decode "
          f"step ({per_rank}); {lo.comm_kernels_per_step:.0f} collectives per step"
          + (f" ({names} on rank {lo.rank})" if names else ""))
    adv = (f"At TP={n}{size} the per-layer all-reduces of a batch-1 decode step cost about as "
           f"much as the matmuls they split. Use fewer GPUs (TP=1 if the model fits) or a "
           f"larger batch: the all-reduce of a few hidden vectors costs nearly the same for 1 "
           f"or 32 sequences.")
    title = (f"Communication-bound: all-reduce is {lo.comm_share:.0%} of the step at TP={n}"
             + (f" for a {params / 1e9:.2g}B model" if params else "") + f" ({s.mode})")
    return [Finding("tp-communication-bound", title, _severity(lo.comm_ms, step_ms), lo.comm_ms,
                    lo.comm_share, nums, ev, adv)]


def _straggler(s: RanksSummary, traced: list, step_ms: float) -> list:
    slow = max(traced, key=lambda r: r.compute_ms)
    fast = min(traced, key=lambda r: r.compute_ms)
    gap = slow.compute_ms - fast.compute_ms
    if slow.compute_ms < fast.compute_ms * STRAGGLER_RATIO or gap < STRAGGLER_MIN_MS:
        return []
    nums = {"mode": s.mode, "slowest_rank": slow.rank, "fastest_rank": fast.rank,
            "slow_compute_ms": slow.compute_ms, "fast_compute_ms": fast.compute_ms,
            "gap_ms": gap, "slow_comm_share": slow.comm_share, "fast_comm_share": fast.comm_share}
    ev = (f"rank {slow.rank} computes {slow.compute_ms:.3f} ms per step, rank {fast.rank} "
          f"{fast.compute_ms:.3f} ms: rank {fast.rank} waits ~{gap:.3f} ms per step in the "
          f"all-reduce (NCCL {fast.comm_share:.0%} of its step vs {slow.comm_share:.0%} on rank "
          f"{slow.rank})")
    if s.skew is not None:
        nums["end_skew_median_us"] = s.skew.end_median_us
        ev += f"; step ends differ by {s.skew.end_median_us:.0f} µs (median)"
    shards = [r.tp_shard for r in (slow, fast)]
    uneven = all(shards) and (np.diff(shards[0].get("q_heads", [0, 0]))[0]
                              != np.diff(shards[1].get("q_heads", [0, 0]))[0])
    if uneven:
        qs = [int(np.diff(x["q_heads"])[0]) for x in shards]
        nums["q_heads"] = {str(slow.rank): qs[0], str(fast.rank): qs[1]}
        ev += f"; rank {slow.rank} holds {qs[0]} attention heads, rank {fast.rank} {qs[1]}"
    adv = ("Every step waits for the slowest rank. Balance the shards (a head count divisible by "
           "the TP degree), and check the slow GPU's clocks, power and temperature (NVML) and "
           "other processes on it.")
    return [Finding("tp-straggler", f"Rank {slow.rank} is the straggler: {gap:.2f} ms more "
                    f"compute per {s.mode} step than rank {fast.rank}",
                    _severity(gap, step_ms), gap, gap / slow.wall_ms if slow.wall_ms else None,
                    nums, ev, adv)]


def _no_overlap(s: RanksSummary, traced: list, step_ms: float) -> list:
    lo = min(traced, key=lambda r: r.comm_share)
    frac = max((r.overlap_fraction or 0.0) for r in traced)
    if lo.comm_share < NO_OVERLAP_MIN_SHARE or frac >= NO_OVERLAP_FRACTION:
        return []
    nums = {"mode": s.mode, "overlap_fraction_max": frac, "comm_ms": lo.comm_ms,
            "per_rank_overlap": {str(r.rank): r.overlap_fraction for r in traced}}
    ev = (f"{frac:.0%} of the communication time overlaps compute on any rank; "
          f"{lo.comm_ms:.3f} ms of all-reduce per step is on the critical path")
    adv = ("In tensor-parallel decode each all-reduce needs the matmul before it and the next "
           "layer needs its result, so on one stream nothing hides it. Overlap needs two "
           "micro-batches in flight (split the batch and alternate), asynchronous TP that "
           "pipelines the matmul with the collective, or a fused all-reduce + norm kernel.")
    return [Finding("tp-no-overlap", f"Communication never overlaps compute ({s.mode})",
                    _severity(lo.comm_ms, step_ms), lo.comm_ms, frac, nums, ev, adv)]


def _scaling(rv, s: RanksSummary, n: int, step_ms: float) -> list:
    ref = rv.meta.get("tp_reference")
    if not isinstance(ref, dict) or not ref.get("ms_per_token") or ref.get("mode") != s.mode:
        return []
    sc = tp_scaling(float(ref["ms_per_token"]), step_ms, n)
    eff = sc["efficiency"]
    sev = "info" if eff >= SCALING_LOW else ("medium" if eff >= 0.4 else "high")
    ev = (f"median {sc['tp1_ms']:.3f} ms per {s.mode} decode step at TP=1 "
          f"({ref.get('source', 'measured')}), {step_ms:.3f} ms at TP={n}: "
          f"×{sc['speedup']:.2f} on {n} GPUs")
    adv = ("" if eff >= SCALING_LOW else
           "The extra GPUs buy little for this model at batch 1: the per-layer all-reduces and "
           "the replicated parts (embedding, LM head, norms) do not shrink with TP. Use fewer "
           "GPUs per replica and more replicas, or a larger batch.")
    lost = max(0.0, step_ms - sc["tp1_ms"] / n)
    return [Finding("tp-scaling", f"TP={n} scaling efficiency {eff:.0%} (×{sc['speedup']:.2f} "
                    f"over TP=1, {s.mode})", sev, lost if eff < SCALING_LOW else None, eff,
                    sc, ev, adv)]
