"""Collective calls matched across ranks: how long the exchange itself takes (*transfer*), how
long each rank sits inside NCCL waiting for the others (*wait*), which rank arrives last
(*late rank*) and what that rank was doing before it arrived.

An NCCL kernel starts when its rank reaches the collective and ends when the collective
completes, which needs every rank: the same call's kernels end together on every rank, and the
ones that started early ran on, waiting. So per call:

- *transfer* = the shortest duration of the call's kernel over the ranks (the late rank's,
  nearly: it arrives when the others are ready and only exchanges);
- *wait* of a rank = its duration minus the transfer;
- the *late rank* starts its kernel last; *late by* = its start minus the median start of the
  others.

Calls match by their order within a step (every rank runs the same collectives in the same
order); when a rank lacks a kernel (a dropped record, records still on their way) the calls are
matched by end time instead, and a call some rank has no kernel for is left out of the split
(counted as incomplete). What the late rank did before it arrived comes from its own records:
whether its GPU sat idle just before the kernel (it waited for its host), a synchronisation
API call in its host's gap before the launch, or more GPU work since the previous call than the
others had (a bigger shard, a slower GPU).

Pure functions over per-rank :class:`~tuiprof.store.StoreView` s (any set of ranks' stores: the
built-in engine's, or a user's own torch.distributed job's once its processes are followed).
Definitions and thresholds: docs/multi-gpu.md.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from statistics import median
from typing import Sequence

from ..store.records import (API, C_END, C_START, K_CORR, K_END, K_NAME, K_START, KERNEL, KIND,
                             MEMCPY, MEMSET, R_CORR, R_END, R_NAME, R_START, S_END, S_START)
from .intervals import intersection, length, merge
from .kernels import is_communication, kernel_info

__all__ = ["Arrival", "Call", "StepFigures", "Collectives", "match_calls", "make_call",
           "collectives", "step_keys", "CAUSES", "MAX_END_SPREAD_NS"]

MAX_END_SPREAD_NS = 1_000_000  # most a call's kernels' ends may differ by (end matching)
CAUSE_SHARE = 0.5             # share of the lateness a cause must explain
# What the late rank did before its kernel, in a few words each (the findings' vocabulary).
CAUSES = {
    "host": "its GPU sat idle until its host launched the collective (host-bound: Python and "
            "launch overhead between kernels)",
    "sync": "its host was in a synchronisation call before launching the collective",
    "compute": "its GPU had more work since the previous collective than the others (a bigger "
               "shard, a slower or busier GPU)",
    "unclear": "neither an idle GPU nor extra GPU work explains it",
}
_LAUNCH = "Launch"          # cudaLaunchKernel*, cuLaunchKernel*, cudaGraphLaunch, cuGraphLaunch
_SYNC = "Synchronize"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One rank's kernel of a collective call (ns, on the aligned clock)."""

    rank: int
    name: str                 # raw kernel name
    start: int
    end: int
    launch: int | None        # its launch API call's start (None: no API record for it)
    gpu_idle: int             # the rank's GPU ran nothing for this long right before it
    host_gap: int | None      # host time from the previous launch call's end to this launch
    sync: bool                # a synchronisation API call inside that host gap
    compute_before: int       # this rank's compute since its previous collective ended

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Call:
    """One collective call of one step, on every rank (``arrivals[r]`` None: no kernel)."""

    key: tuple                # (cycle, step, phase) of the step
    index: int                # order within the step
    op: str                   # "NCCL AllReduce bf16 ring LL"
    arrivals: tuple
    transfer: int | None      # ns; None for an incomplete call
    waits: tuple              # per rank (ns), None where missing
    late: int | None          # the rank whose kernel starts last
    late_by: int              # its start minus the median start of the others (ns)
    cause: str | None         # key of CAUSES, for the late rank

    @property
    def complete(self) -> bool:
        return self.transfer is not None


@dataclass(frozen=True, slots=True)
class StepFigures:
    """One rank's figures for one step traced on every rank (ns)."""

    key: tuple
    seq: int
    wall: int
    compute: int              # union of non-NCCL kernels, copies and memsets
    comm: int                 # union of NCCL kernels (transfer + wait, when every call matched)
    overlap: int              # compute ∩ comm
    idle: int                 # wall - (compute ∪ comm)
    transfer: int             # sum over the step's complete calls
    wait: int                 # this rank's wait, summed over them
    calls: int                # complete calls in the step
    comm_kernels: int
    launches: int             # launch API calls in the step (0: no API records)
    host_span: int            # step start -> end of its last launch call (0: no API records)
    comm_by_name: dict        # short NCCL name -> ns


@dataclass(frozen=True)
class Collectives:
    """Calls and per-step figures of one mode's decode steps traced on every rank."""

    mode: str
    world: int
    keys: tuple               # the steps traced on every rank, oldest first
    calls: list
    steps: list               # per rank: [StepFigures, ...] in ``keys`` order
    incomplete: int           # calls some rank has no kernel for
    by_kernel: list = field(default_factory=list)   # per rank: raw name -> [transfer, wait, n]
    traced: tuple = ()        # per rank: its traced steps of the mode in the raw window

    @property
    def complete(self) -> list:
        return [c for c in self.calls if c.complete]


# ----------------------------------------------------------------------------- matching
def _op(raw: str) -> str:
    return kernel_info(raw).short


def match_calls(streams: Sequence[Sequence[tuple]]) -> list[list]:
    """Match one step's collective kernels across ranks.

    ``streams[r]``: rank r's collective kernels as ``(start, end, op)``, in start order.
    Returns one row per call: per rank the index into its stream, or None where that rank has
    no kernel of the call. Same count and same ops on every rank: by order. Otherwise by end
    time: a call's kernels end within a few microseconds of each other on every rank (the
    collective completes for all at once), consecutive calls much further apart; the
    tolerance is half the shortest gap between two ends on one rank.
    """
    n = len(streams)
    if n == 0:
        return []
    counts = {len(s) for s in streams}
    if len(counts) == 1:
        count = counts.pop()
        if all(len({streams[r][i][2] for r in range(n)}) == 1 for i in range(count)):
            return [[i] * n for i in range(count)]
    return _match_by_end(streams)


def _end_tolerance(streams: Sequence[Sequence[tuple]]) -> int:
    """Half the shortest gap between consecutive kernel ends on any rank, at most
    :data:`MAX_END_SPREAD_NS`."""
    gaps = [b[1] - a[1] for s in streams for a, b in zip(s, s[1:]) if b[1] > a[1]]
    return min(MAX_END_SPREAD_NS, min(gaps) // 2) if gaps else MAX_END_SPREAD_NS


def _match_by_end(streams: Sequence[Sequence[tuple]]) -> list[list]:
    n = len(streams)
    tol = _end_tolerance(streams)
    items = sorted((k[1], r, i, k[2]) for r, s in enumerate(streams) for i, k in enumerate(s))
    rows: list[list] = []
    first_end = None
    cur: list | None = None
    op = None
    for end, r, i, kop in items:
        if cur is not None and end - first_end <= tol and cur[r] is None and kop == op:
            cur[r] = i
            continue
        cur = [None] * n
        cur[r] = i
        first_end, op = end, kop
        rows.append(cur)
    return rows


def make_call(key: tuple, index: int, arrivals: Sequence) -> Call:
    """A :class:`Call` from its per-rank arrivals (None where a rank has no kernel)."""
    present = [a for a in arrivals if a is not None]
    op = _op(present[0].name) if present else ""
    if len(present) < len(arrivals) or len(present) < 2:
        return Call(key, index, op, tuple(arrivals), None, tuple(None for _ in arrivals), None,
                    0, None)
    transfer = min(a.dur for a in present)
    waits = tuple(a.dur - transfer for a in arrivals)
    late_a = max(present, key=lambda a: (a.start, a.rank))
    others = [a.start for a in present if a is not late_a]
    late_by = max(0, int(late_a.start - median(others)))
    cause = _cause(late_a, [a for a in present if a is not late_a], late_by)
    return Call(key, index, op, tuple(arrivals), transfer, waits, late_a.rank, late_by, cause)


def _cause(late: Arrival, others: list, late_by: int) -> str | None:
    """What the late rank did before its kernel (a key of :data:`CAUSES`)."""
    if late_by <= 0:
        return None
    if late.gpu_idle >= CAUSE_SHARE * late_by:
        return "sync" if late.sync else "host"
    extra = late.compute_before - median(a.compute_before for a in others)
    if extra >= CAUSE_SHARE * late_by:
        return "compute"
    return "unclear"


# ----------------------------------------------------------------------------- per rank
def step_keys(view, mode: str, phase: str = "decode") -> dict:
    """(cycle, step, phase) -> (token row, raw records) for the steps of ``mode`` whose raw
    records hold at least one kernel (traced), in the view's raw window."""
    rows = {t.seq: t for t in view.tokens
            if t.done and t.end_ns > t.start_ns and t.phase == phase and t.mode == mode
            and not t.apart}
    out = {}
    for seq, recs in view.raw:
        t = rows.get(seq)
        if t is None or not recs:
            continue
        if any(r[KIND] == KERNEL for r in recs):
            out[(t.cycle, t.step, t.phase)] = (t, recs)
    return out


@dataclass(slots=True)
class _RankStep:
    """One rank's step, sorted and indexed for :func:`_arrivals`."""

    row: object
    off: int
    comm: list          # (start, end, op, raw name, corr) in start order
    comp: list          # merged compute intervals
    comp_starts: list   # their starts, and the running sum of their lengths (``_clipped``)
    comp_cum: list
    kernels: list       # (start, end) of every kernel, copy and memset, in start order
    ends_max: list      # running max of ``kernels`` ends
    launches: list      # (start, end, corr) of launch API calls, in start order
    launch_of: dict     # corr -> launch start
    syncs: list         # (start, end) of synchronisation API calls


def _rank_step(row, recs: list, off: int, ops: dict) -> _RankStep:
    # One pass over the step's records (the findings worker's cost: ~4,000 a traced eager step
    # per rank); ``ops``: raw kernel name -> its collective's short name, or None for compute.
    comm, comp, kernels, launches, syncs = [], [], [], [], []
    launch_of: dict = {}
    for r in recs:
        kind = r[KIND]
        if kind == KERNEL:
            name = r[K_NAME]
            op = ops.get(name, 0)
            if op == 0:
                op = ops[name] = _op(name) if is_communication(name) else None
            s, e = r[K_START] - off, r[K_END] - off
            kernels.append((s, e))
            if op is None:
                comp.append((s, e))
            else:
                comm.append((s, e, op, name, r[K_CORR]))
        elif kind == API:
            name = r[R_NAME]
            if _LAUNCH in name:
                s = r[R_START] - off
                launches.append((s, r[R_END] - off, r[R_CORR]))
                launch_of[r[R_CORR]] = s
            elif _SYNC in name:
                syncs.append((r[R_START] - off, r[R_END] - off))
        elif kind == MEMCPY:
            s, e = r[C_START] - off, r[C_END] - off
            comp.append((s, e))
            kernels.append((s, e))
        elif kind == MEMSET:
            s, e = r[S_START] - off, r[S_END] - off
            comp.append((s, e))
            kernels.append((s, e))
    comm.sort()
    kernels.sort()
    launches.sort()
    run, m = [], None
    for _, e in kernels:
        m = e if m is None or e > m else m
        run.append(m)
    merged = merge(comp)
    cum = [0]
    for s, e in merged:
        cum.append(cum[-1] + e - s)
    return _RankStep(row, off, comm, merged, [s for s, _ in merged], cum, kernels, run,
                     launches, launch_of, syncs)


def _arrival(rank: int, st: _RankStep, i: int) -> Arrival:
    s, e, _op_, raw, corr = st.comm[i]
    step_start = st.row.start_ns - st.off
    # the GPU's last activity before this kernel (any stream), from kernels that started before
    j = bisect_left(st.kernels, (s, -1))
    busy_until = st.ends_max[j - 1] if j > 0 else step_start
    gpu_idle = max(0, s - max(busy_until, step_start))
    prev_end = st.comm[i - 1][1] if i > 0 else step_start
    compute_before = _clipped(st, prev_end, s)
    launch = st.launch_of.get(corr)
    host_gap, sync = None, False
    if launch is not None:
        k = bisect_left(st.launches, (launch, -1 << 62, -1))
        prev_launch_end = st.launches[k - 1][1] if k > 0 else step_start
        host_gap = max(0, launch - prev_launch_end)
        sync = bool(st.syncs) and any(a < launch and b > prev_launch_end for a, b in st.syncs)
    return Arrival(rank, raw, s, e, launch, gpu_idle, host_gap, sync, compute_before)


def _clipped(st: _RankStep, lo: int, hi: int) -> int:
    """Compute time of ``st`` inside ``[lo, hi]`` (merged intervals, prefix sums)."""
    if hi <= lo or not st.comp:
        return 0
    i = max(0, bisect_left(st.comp_starts, lo) - 1)   # the interval that may hold lo
    j = bisect_left(st.comp_starts, hi)               # intervals [i, j) start before hi
    if j <= i:
        return 0
    total = st.comp_cum[j] - st.comp_cum[i]
    s0, e0 = st.comp[i]
    total -= min(max(0, lo - s0), e0 - s0)            # the part of the first before lo
    s1, e1 = st.comp[j - 1]
    total -= min(max(0, e1 - hi), e1 - s1)            # the part of the last after hi
    return max(0, int(total))


def _figures(key: tuple, st: _RankStep, calls: list, rank: int) -> StepFigures:
    row = st.row
    wall = row.end_ns - row.start_ns
    mm = merge((s, e) for s, e, *_ in st.comm)
    c, m = length(st.comp), length(mm)
    ov = intersection(st.comp, mm)
    by_name: dict[str, int] = {}
    for s, e, op, *_ in st.comm:
        by_name[op] = by_name.get(op, 0) + e - s
    done = [x for x in calls if x.complete]
    host = 0
    if st.launches:
        host = max(0, max(b for _, b, _ in st.launches) - (row.start_ns - st.off))
    return StepFigures(key, row.seq, wall, int(c), int(m), int(ov),
                       int(max(0, wall - (c + m - ov))), sum(x.transfer for x in done),
                       sum(x.waits[rank] for x in done), len(done), len(st.comm),
                       len(st.launches), host, by_name)


# ----------------------------------------------------------------------------- all ranks
def collectives(views: Sequence, mode: str, offsets: Sequence[int] | None = None,
                phase: str = "decode") -> Collectives:
    """Match the collective calls of the steps of ``mode`` traced on every rank.

    ``views``: one StoreView per rank (with raw records); ``offsets``: per rank, what to
    subtract from its timestamps to align the clocks (``RanksView.clock.offsets_ns``)."""
    n = len(views)
    offsets = list(offsets) if offsets is not None else [0] * n
    per_rank = [step_keys(v, mode, phase) for v in views]
    common = set(per_rank[0]) if per_rank else set()
    for d in per_rank[1:]:
        common &= set(d)
    keys = tuple(sorted(common, key=lambda k: per_rank[0][k][0].seq))
    calls: list[Call] = []
    steps: list[list] = [[] for _ in range(n)]
    by_kernel: list[dict] = [{} for _ in range(n)]
    incomplete = 0
    ops: dict = {}
    for key in keys:
        rs = [_rank_step(*per_rank[r][key], offsets[r], ops) for r in range(n)]
        rows = match_calls([[(s, e, op) for s, e, op, *_ in st.comm] for st in rs])
        step_calls = []
        for idx, row in enumerate(rows):
            arr = [None if row[r] is None else _arrival(r, rs[r], row[r]) for r in range(n)]
            call = make_call(key, idx, arr)
            step_calls.append(call)
            if not call.complete:
                incomplete += 1
                continue
            for r, a in enumerate(arr):
                acc = by_kernel[r].setdefault(a.name, [0, 0, 0])
                acc[0] += call.transfer
                acc[1] += call.waits[r]
                acc[2] += 1
        calls += step_calls
        for r in range(n):
            steps[r].append(_figures(key, rs[r], step_calls, r))
    return Collectives(mode, n, keys, calls, steps, incomplete, by_kernel,
                       tuple(len(d) for d in per_rank))
