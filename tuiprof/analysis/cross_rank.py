"""Across ranks: where each rank's step goes (compute, the transfer of its collectives, the wait
for the other ranks inside them, idle), which rank the others wait for and why, and the
findings that follow. Pure functions over a :class:`~tuiprof.store.rank_set.RanksView` (any set
of ranks' views: the built-in engine's ranks or the processes of a user's job).

The figures of a rank are means per step over the decode steps **traced on every rank**
(matched by (cycle, step, phase): every rank runs the same steps), so that the columns of
different ranks describe the same steps and add up: wall = compute + comm - overlap + idle, and
comm = transfer + wait when every call matched. The words are defined once, in
:data:`DEFINITIONS` (docs/multi-gpu.md says the same); every pane, the headless summary, the
findings and the exports use them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from .collectives import CAUSES, Collectives, collectives
from .finding import Finding, severity as _severity
from .tokens import mode_summaries

__all__ = ["RankSummary", "StepSkew", "RanksSummary", "ranks_summary", "find_ranks",
           "tp_scaling", "DEFINITIONS", "HELP_LINE", "COMM_BOUND_SHARE", "LATE_SHARE",
           "comm_split"]

# The words every view of a session of ranks uses (docs/multi-gpu.md repeats them).
DEFINITIONS = {
    "step": "wall time of a decode step, from its start mark to its end mark on that rank",
    "compute": "GPU time in kernels other than NCCL's, copies and memsets (their union)",
    "comm": "GPU time inside NCCL kernels (their union) = transfer + wait",
    "transfer": "per collective call, the shortest duration of its kernel over the ranks: the "
                "exchange itself, once every rank is there",
    "wait": "a rank's NCCL kernel duration minus the call's transfer: time inside NCCL waiting "
            "for the last rank to arrive",
    "idle": "step - (compute ∪ comm): the GPU runs nothing (waiting for its host)",
    "overlap": "comm that runs while compute runs too, as a share of comm",
    "NCCL share": "comm / step",
    "late": "the rank whose kernel of a call starts last; late by = its start minus the median "
            "start of the others",
}
HELP_LINE = ("per step, means over the steps traced on every rank: compute = non-NCCL kernels · "
             "comm = NCCL kernels = transfer + wait · transfer = a call's shortest kernel over "
             "the ranks · wait = the rest, waiting for the late rank · idle = GPU doing nothing · "
             "NCCL share = comm / step · overlap = share of comm under compute · late = starts "
             "its kernel last")

COMM_BOUND_SHARE = 0.25      # transfer share of the step that makes TP communication-bound
LATE_SHARE = 0.5             # a rank late at this share of the calls is "the late rank"
LATE_WAIT_SHARE = 0.05       # ... worth a finding when the others wait this share of the step
HOST_SPAN_SHARE = 0.8        # host-bound: launching a step takes this share of it ...
HOST_GPU_SHARE = 0.5         # ... while compute + transfer stay below this share
NO_OVERLAP_FRACTION = 0.05   # of communication time hidden behind compute
NO_OVERLAP_MIN_SHARE = 0.10  # only worth saying when transfer is this much of the step
SCALING_LOW = 0.7            # TP scaling efficiency below this is a finding
LAST_SHARE = 0.75            # without kernels: a rank "ends last" this share of the steps ...
LAST_MIN_SKEW_US = 50.0      # ... and the step ends are this far apart (else: noise)


@dataclass(frozen=True)
class RankSummary:
    """One rank's figures for one mode's decode steps. ``*_ms``: means per step over the steps
    traced on every rank (None without them); ``step_ms``: median of all its decode steps."""

    rank: int
    device: str
    mode: str
    decode_tokens: int
    tokens_per_s: float
    step_ms: float                    # host time per decode step, whole session (median)
    traced_steps: int                 # steps traced on every rank that the figures come from
    wall_ms: float | None = None      # of those steps
    compute_ms: float | None = None
    comm_ms: float | None = None
    transfer_ms: float | None = None
    wait_ms: float | None = None
    overlap_ms: float | None = None
    idle_ms: float | None = None
    comm_share: float | None = None   # NCCL share: comm / step
    overlap_fraction: float | None = None   # of comm
    comm_kernels_per_step: float | None = None
    calls_per_step: float | None = None     # complete calls (matched on every rank)
    late_share: float | None = None   # of the complete calls, those this rank arrived last at
    late_by_ms: float | None = None   # median lateness over those calls
    late_causes: dict = field(default_factory=dict)  # cause -> calls, over those calls
    gpu_idle_before_ms: float | None = None   # median, over those calls, of the idle GPU before
    host_gap_ms: float | None = None          # ... and of its host's gap before the launch
    launches_per_step: float | None = None    # launch API calls (None: no API records)
    host_ms: float | None = None      # step start -> end of its last launch call
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
    late_rank: int | None             # the rank the others wait for (None: none consistently)
    late_basis: str
    clock: dict
    steps: int = 0                    # decode steps traced on every rank
    step_range: tuple | None = None   # ((cycle, step), (cycle, step)) of the first and last
    calls: int = 0                    # complete calls over those steps
    incomplete_calls: int = 0
    transfer_ms: float | None = None  # per step (the same on every rank)
    comm: Collectives | None = None   # the matched calls (None without kernel records)


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


def _mean_ms(values) -> float:
    values = list(values)
    return float(np.mean(values)) / 1e6 if values else 0.0


def _med_ms(values) -> float | None:
    values = list(values)
    return float(median(values)) / 1e6 if values else None


def rank_summary(view, rank: int, mode: str, comm: Collectives | None = None) -> RankSummary:
    """One rank's :class:`RankSummary` for ``mode`` (``comm``: the matched calls of every
    rank; None or no steps: timing only)."""
    ms = mode_summaries(view, "decode").get(mode)
    sm, dram = _nvml_means(view)
    meta = view.meta
    steps = comm.steps[rank] if comm is not None and comm.keys else []
    base = dict(rank=rank, device=str(meta.get("device_name") or meta.get("device") or "?"),
                mode=mode, decode_tokens=ms.tokens if ms else 0,
                tokens_per_s=ms.tokens_per_s if ms else 0.0, step_ms=ms.ms_median if ms else 0.0,
                traced_steps=len(steps), sm_util=sm, dram_util=dram,
                tp_shard=meta.get("tp_shard") if isinstance(meta.get("tp_shard"), dict) else None)
    if not steps:
        return RankSummary(**base)
    n = len(steps)
    wall = sum(s.wall for s in steps)
    comm_ns = sum(s.comm for s in steps)
    names: dict[str, int] = {}
    for s in steps:
        for k, v in s.comm_by_name.items():
            names[k] = names.get(k, 0) + v
    coll = sorted(((k, v / 1e6 / n) for k, v in names.items()), key=lambda kv: -kv[1])
    done = comm.complete
    mine = [c for c in done if c.late == rank]
    arr = [c.arrivals[rank] for c in mine]
    has_api = any(s.launches for s in steps)
    return RankSummary(
        **base, wall_ms=wall / 1e6 / n, compute_ms=_mean_ms(s.compute for s in steps),
        comm_ms=comm_ns / 1e6 / n, transfer_ms=_mean_ms(s.transfer for s in steps),
        wait_ms=_mean_ms(s.wait for s in steps), overlap_ms=_mean_ms(s.overlap for s in steps),
        idle_ms=_mean_ms(s.idle for s in steps), comm_share=comm_ns / wall if wall else None,
        overlap_fraction=(sum(s.overlap for s in steps) / comm_ns) if comm_ns else None,
        comm_kernels_per_step=sum(s.comm_kernels for s in steps) / n,
        calls_per_step=sum(s.calls for s in steps) / n,
        late_share=len(mine) / len(done) if done else None,
        late_by_ms=_med_ms(c.late_by for c in mine),
        late_causes=dict(Counter(c.cause for c in mine if c.cause)),
        gpu_idle_before_ms=_med_ms(a.gpu_idle for a in arr),
        host_gap_ms=_med_ms(a.host_gap for a in arr if a.host_gap is not None),
        launches_per_step=sum(s.launches for s in steps) / n if has_api else None,
        host_ms=_mean_ms(s.host_span for s in steps) if has_api else None,
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
    """Per-rank figures, step skew and the late rank for ``mode`` (default: the mode of rank
    0's latest decode step). Without raw records (a light view) only the timing is filled."""
    mode = mode or _mode_of(rv)
    clock = rv.clock.to_dict()
    if mode is None:
        return RanksSummary(None, [], None, None, "no decode steps yet", clock)
    has_raw = any(v.raw for v in rv.views)
    comm = collectives(rv.views, mode, rv.clock.offsets_ns) if has_raw else None
    ranks = [rank_summary(v, r, mode, comm) for r, v in enumerate(rv.views)]
    skew = step_skew(rv, mode)
    late, basis = _late_rank(ranks, comm, skew)
    extra = {}
    if comm is not None and comm.keys:
        first, last = comm.keys[0], comm.keys[-1]
        done = comm.complete
        extra = dict(steps=len(comm.keys), step_range=(first[:2], last[:2]), calls=len(done),
                     incomplete_calls=comm.incomplete,
                     transfer_ms=_mean_ms(s.transfer for s in comm.steps[0]))
    return RanksSummary(mode, ranks, skew, late, basis, clock, comm=comm, **extra)


def _late_rank(ranks: list, comm: Collectives | None, skew: StepSkew | None
               ) -> tuple[int | None, str]:
    """The rank the others wait for, and on what basis."""
    if comm is not None and comm.complete and len(ranks) > 1:
        top = max(ranks, key=lambda r: r.late_share or 0.0)
        n = len(comm.complete)
        if (top.late_share or 0.0) >= LATE_SHARE:
            return top.rank, (f"starts its kernel last at {top.late_share:.0%} of {n:,} "
                              f"collective calls, {top.late_by_ms:.3f} ms late on median")
        return None, (f"no rank starts last at {LATE_SHARE:.0%} of the {n:,} collective calls "
                      f"(most often rank {top.rank}: {top.late_share or 0:.0%})")
    if comm is not None and comm.keys:
        return None, "no collective call matched on every rank"
    if comm is not None and any(comm.traced):
        return None, ("no step traced on every rank yet (traced steps per rank: "
                      + ", ".join(map(str, comm.traced)) + ")")
    if skew is not None and skew.steps and len(ranks) > 1:
        top = int(np.argmax(skew.last_counts))
        if (skew.last_counts[top] >= LAST_SHARE * skew.steps
                and skew.end_median_us >= LAST_MIN_SKEW_US):
            return top, (f"ends its step last in {skew.last_counts[top]} of {skew.steps} steps, "
                         f"{skew.end_median_us:.0f} µs apart on median (no kernel records)")
        return None, "no kernel records; step ends give no consistent late rank"
    return None, "no decode steps on every rank yet"


def tp_scaling(tp1_ms: float, tpn_ms: float, n: int) -> dict:
    """Speed-up of decode at TP=n over TP=1 and the scaling efficiency (speed-up / n)."""
    speedup = tp1_ms / tpn_ms if tpn_ms > 0 else 0.0
    return {"tp": n, "tp1_ms": tp1_ms, "tpn_ms": tpn_ms, "speedup": speedup,
            "efficiency": speedup / n if n else 0.0}


def comm_split(summary: RanksSummary | None, rank: int) -> dict | None:
    """What the kernels pane shows of ``rank``'s NCCL kernels: ``{"kernels": {raw name:
    {"transfer": ns, "wait": ns, "calls": n}}, "mode", "late_rank", "late_share", "steps"}`` over the
    complete calls; None without any."""
    if summary is None or summary.comm is None or rank >= len(summary.comm.by_kernel):
        return None
    kernels = {name: {"transfer": t, "wait": w, "calls": n}
               for name, (t, w, n) in summary.comm.by_kernel[rank].items()}
    if not kernels:
        return None
    late = summary.ranks[summary.late_rank] if summary.late_rank is not None else None
    return {"kernels": kernels, "mode": summary.mode, "late_rank": summary.late_rank,
            "steps": summary.steps, "late_share": late.late_share if late else None}


# ----------------------------------------------------------------------------- findings
def find_ranks(rv, summary: RanksSummary | None = None) -> list:
    """Findings across ranks: the late rank and why, host-bound ranks, communication-bound
    (transfer), no overlap, TP scaling."""
    s = summary or ranks_summary(rv)
    if s.mode is None or not s.ranks:
        return []
    n = len(s.ranks)
    out: list[Finding] = []
    traced = [r for r in s.ranks if r.comm_share is not None]
    step_ms = float(np.median([r.step_ms for r in s.ranks])) if s.ranks else 0.0
    meta = rv[0].meta
    params = meta.get("model_params") or (meta.get("params") if n == 1 else None)
    if traced and len(traced) == n and s.calls:
        out += _late(s, traced, step_ms)
        out += _host_bound(s, traced, step_ms)
        out += _comm_bound(s, traced, n, step_ms, params)
        out += _no_overlap(s, traced, step_ms)
    out += _scaling(rv, s, n, step_ms)
    out.sort(key=lambda f: -(f.impact_ms_per_token or 0.0))
    return out


def _ranks_text(ranks: list) -> str:
    """"ranks 1–3", "ranks 0, 2", "rank 1"."""
    ids = sorted(r.rank for r in ranks)
    if len(ids) == 1:
        return f"rank {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"ranks {ids[0]}–{ids[-1]}"
    return "ranks " + ", ".join(map(str, ids))


def _late(s: RanksSummary, traced: list, step_ms: float) -> list:
    if s.late_rank is None:
        return []
    late = s.ranks[s.late_rank]
    others = [r for r in traced if r.rank != late.rank]
    wait = float(np.median([r.wait_ms for r in others]))
    wall = late.wall_ms or step_ms
    if not wall or wait < LATE_WAIT_SHARE * wall:
        return []
    cause, count = (Counter(late.late_causes).most_common(1) or [(None, 0)])[0]
    mine = sum(late.late_causes.values()) or 1
    nums = {"mode": s.mode, "late_rank": late.rank, "late_share": late.late_share,
            "late_by_ms": late.late_by_ms, "calls": s.calls, "steps": s.steps,
            "others_wait_ms": wait, "transfer_ms": s.transfer_ms,
            "late_wait_ms": late.wait_ms, "causes": dict(late.late_causes),
            "gpu_idle_before_ms": late.gpu_idle_before_ms, "host_gap_ms": late.host_gap_ms,
            "per_rank_wait_ms": {str(r.rank): r.wait_ms for r in traced}}
    verb = "waits" if len(others) == 1 else "wait"
    ev = (f"{_ranks_text(others)} {verb} {wait:.2f} ms per step inside NCCL (median over them; "
          f"rank {late.rank} {late.wait_ms:.2f} ms); the transfer itself is "
          f"{s.transfer_ms:.2f} ms per step ({s.calls:,} calls over {s.steps} steps traced on "
          f"every rank)")
    if cause is not None:
        ev += f". Before {count / mine:.0%} of its late calls {CAUSES[cause]}"
        if cause in ("host", "sync") and late.gpu_idle_before_ms is not None:
            ev += f": its GPU idle {late.gpu_idle_before_ms:.3f} ms before the kernel (median)"
            if late.host_gap_ms is not None:
                ev += f", its host {late.host_gap_ms:.3f} ms since its previous launch"
    if cause == "compute":
        shards = [r.tp_shard for r in (late, *others)]
        if all(shards) and all("q_heads" in x for x in shards):
            qs = [int(np.diff(x["q_heads"])[0]) for x in shards]
            if len(set(qs)) > 1:
                nums["q_heads"] = {str(r.rank): q for r, q in zip((late, *others), qs)}
                ev += f"; rank {late.rank} holds {qs[0]} attention heads, the others " + \
                      "/".join(str(q) for q in qs[1:])
    adv = {
        "host": ("The steps are host-bound and the ranks out of step: each collective waits for "
                 f"rank {late.rank}'s host, not for the link. Make the host faster on every "
                 "rank: compile the decode step (c: torch.compile with CUDA graphs, one launch "
                 f"a step) or capture CUDA graphs; check what else runs on rank {late.rank}'s "
                 "host (other threads, its CPU affinity)."),
        "sync": (f"Rank {late.rank}'s host synchronises with its GPU before the collective "
                 "(.item(), .cpu(), printing a tensor, torch.cuda.synchronize): move it out of "
                 "the step or after the last collective."),
        "compute": ("Every collective waits for the rank with the most GPU work: balance the "
                    "shards (a head count divisible by the TP degree), and check the slow GPU's "
                    "clocks, power and temperature (NVML) and other processes on it."),
    }.get(cause, "Every collective waits for the last rank to arrive; see what it does before "
                 "its collectives on its own panes (g).")
    title = (f"Rank {late.rank} arrives last at {late.late_share:.0%} of the collectives, "
             f"{late.late_by_ms:.2f} ms late on median: the others wait {wait:.1f} ms per step "
             f"({s.mode})")
    return [Finding("tp-late-rank", title, _severity(wait, step_ms), wait,
                    wait / wall if wall else None, nums, ev, adv)]


def _host_bound(s: RanksSummary, traced: list, step_ms: float) -> list:
    api = [r for r in traced if r.host_ms is not None and r.launches_per_step]
    if len(api) != len(traced):
        return []
    bound = [r for r in api if r.wall_ms and r.host_ms >= HOST_SPAN_SHARE * r.wall_ms
             and (r.compute_ms + r.transfer_ms) <= HOST_GPU_SHARE * r.wall_ms]
    if not bound:
        return []
    ids = [r.rank for r in bound]
    ref = s.ranks[s.late_rank] if s.late_rank in ids else max(bound, key=lambda r: r.host_ms)
    gpu = ref.compute_ms + ref.transfer_ms
    per_rank = ", ".join(f"rank {r.rank} {r.host_ms:.1f} of {r.wall_ms:.1f} ms" for r in api)
    nums = {"mode": s.mode, "rank": ref.rank, "host_ms": ref.host_ms, "wall_ms": ref.wall_ms,
            "launches_per_step": ref.launches_per_step, "gpu_ms": gpu,
            "us_per_launch": ref.host_ms * 1e3 / ref.launches_per_step,
            "per_rank_host_ms": {str(r.rank): r.host_ms for r in api},
            "bound_ranks": [r.rank for r in bound]}
    ev = (f"launching a step takes the host {per_rank} (start to the end of its last launch); "
          f"rank {ref.rank} launches {ref.launches_per_step:,.0f} kernels a step, "
          f"{nums['us_per_launch']:.0f} µs each, while its GPU works "
          f"{ref.compute_ms:.2f} ms (compute) + {ref.transfer_ms:.2f} ms (transfer)")
    adv = ("The GPUs wait for their hosts, and at every collective the ranks wait for the "
           "slowest host: tensor parallelism cannot help a host-bound step. Compile the decode "
           "step (c: torch.compile, reduce-overhead: CUDA graphs replay a step with one launch) "
           "or capture CUDA graphs yourself; fewer, larger kernels (a larger batch) also help.")
    lost = max(0.0, ref.wall_ms - gpu)
    return [Finding("tp-host-bound", f"Host-bound: rank {ref.rank} needs {ref.host_ms:.1f} ms "
                    f"to launch each {ref.wall_ms:.1f} ms step; its GPU works {gpu:.2f} ms "
                    f"({s.mode})", _severity(lost, step_ms), lost,
                    lost / ref.wall_ms if ref.wall_ms else None, nums, ev, adv)]


def _comm_bound(s: RanksSummary, traced: list, n: int, step_ms: float, params) -> list:
    wall = float(np.median([r.wall_ms for r in traced]))
    share = s.transfer_ms / wall if wall else 0.0
    if share < COMM_BOUND_SHARE:
        return []
    lo = min(traced, key=lambda r: r.comm_share)
    names = ", ".join(f"{k} {v:.3f} ms" for k, v in lo.collectives[:2])
    size = f" for a {params / 1e9:.2g}B-parameter model" if params else ""
    nums = {"mode": s.mode, "tp": n, "transfer_ms": s.transfer_ms, "transfer_share": share,
            "wall_ms": wall, "calls_per_step": lo.calls_per_step,
            "per_rank_wait_ms": {str(r.rank): r.wait_ms for r in traced},
            "per_rank_share": {str(r.rank): r.comm_share for r in traced}}
    ev = (f"the collectives' transfer is {s.transfer_ms:.3f} ms of each {wall:.3f} ms {s.mode} "
          f"decode step ({share:.0%}), {lo.calls_per_step:.0f} calls per step"
          + (f" ({names} on rank {lo.rank}, wait included)" if names else "")
          + "; waiting for the late rank comes on top: "
          + ", ".join(f"rank {r.rank} {r.wait_ms:.3f} ms" for r in traced))
    adv = (f"At TP={n}{size} the per-layer all-reduces of a batch-1 decode step cost about as "
           f"much as the matmuls they split. Use fewer GPUs (TP=1 if the model fits) or a "
           f"larger batch: the all-reduce of a few hidden vectors costs nearly the same for 1 "
           f"or 32 sequences.")
    title = (f"Communication-bound: the collectives' transfer is {share:.0%} of the step at "
             f"TP={n}" + (f" for a {params / 1e9:.2g}B model" if params else "") + f" ({s.mode})")
    return [Finding("tp-communication-bound", title, _severity(s.transfer_ms, step_ms),
                    s.transfer_ms, share, nums, ev, adv)]


def _no_overlap(s: RanksSummary, traced: list, step_ms: float) -> list:
    wall = float(np.median([r.wall_ms for r in traced]))
    frac = max((r.overlap_fraction or 0.0) for r in traced)
    if not wall or s.transfer_ms < NO_OVERLAP_MIN_SHARE * wall or frac >= NO_OVERLAP_FRACTION:
        return []
    nums = {"mode": s.mode, "overlap_fraction_max": frac, "transfer_ms": s.transfer_ms,
            "per_rank_overlap": {str(r.rank): r.overlap_fraction for r in traced}}
    ev = (f"{frac:.0%} of the communication time overlaps compute on any rank; "
          f"{s.transfer_ms:.3f} ms of transfer per step is on the critical path")
    adv = ("In tensor-parallel decode each all-reduce needs the matmul before it and the next "
           "layer needs its result, so on one stream nothing hides it. Overlap needs two "
           "micro-batches in flight (split the batch and alternate), asynchronous TP that "
           "pipelines the matmul with the collective, or a fused all-reduce + norm kernel.")
    return [Finding("tp-no-overlap", f"Communication never overlaps compute ({s.mode})",
                    _severity(s.transfer_ms, step_ms), s.transfer_ms, frac, nums, ev, adv)]


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
