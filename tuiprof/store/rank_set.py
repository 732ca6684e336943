"""Ranks and processes: the dimension above the store. A tensor-parallel session has one
:class:`~tuiprof.store.SessionStore` per rank (each in its own process), and so does a
profiled program that starts processes of its own (one store per process it starts, followed
by ``tuiprof run``); readers get them together as a :class:`RanksView`, and a :class:`RankSet`
(a live session of ranks or processes, or a reopened multi-rank snapshot) hands out one store
at a time. In a session of processes (``meta["launcher"] == "processes"``), the processes that
joined one torch.distributed job are that job's ranks (:func:`jobs`).

Clocks: every rank records, right after a barrier of all ranks, its session clock (CUPTI's
timestamps when CUPTI runs, else ``CLOCK_REALTIME``) and the host's ``CLOCK_REALTIME`` read back
to back (``meta["clock_sync"]``). On one host CUPTI's timestamps come from the same clock in
every process, so the per-rank differences (clock - realtime) agree to within the time
between the two reads; :func:`clock_alignment` measures that residual and only shifts a rank's
timeline when it is larger than :data:`ALIGN_ABOVE_NS` (clocks of different sources).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .view import KernelAggregate, StoreView

ALIGN_ABOVE_NS = 50_000   # residuals below this are read noise: timelines are left as they are


@dataclass(frozen=True)
class ClockAlignment:
    """How the ranks' timelines line up: subtract ``offsets_ns[r]`` from rank r's stamps."""

    offsets_ns: tuple[int, ...]
    residual_ns: int | None       # max - min of (clock - realtime) over ranks; None: unknown
    applied: bool                 # False: offsets are all 0 (residual below ALIGN_ABOVE_NS)
    barrier_spread_ns: int | None = None  # realtime spread of the ranks leaving the barrier

    def to_dict(self) -> dict:
        return {"offsets_ns": list(self.offsets_ns), "residual_ns": self.residual_ns,
                "applied": self.applied, "barrier_spread_ns": self.barrier_spread_ns,
                "method": "per-rank (session clock - CLOCK_REALTIME) after a barrier; shifted "
                          f"only when the spread exceeds {ALIGN_ABOVE_NS} ns"}


def clock_alignment(views: tuple) -> ClockAlignment:
    """The alignment of ``views`` from each rank's latest ``clock_sync`` pair."""
    pairs = []
    for v in views:
        sync = v.meta.get("clock_sync") or []
        last = sync[-1] if sync and isinstance(sync[-1], dict) else None
        ok = last is not None and isinstance(last.get("clock_ns"), int) and isinstance(
            last.get("unix_ns"), int)
        pairs.append((last["clock_ns"], last["unix_ns"]) if ok else None)
    n = len(views)
    if any(p is None for p in pairs) or not pairs:
        return ClockAlignment((0,) * n, None, False)
    diffs = [c - u for c, u in pairs]
    residual = max(diffs) - min(diffs)
    spread = max(u for _, u in pairs) - min(u for _, u in pairs)
    if residual <= ALIGN_ABOVE_NS:
        return ClockAlignment((0,) * n, residual, False, spread)
    return ClockAlignment(tuple(d - diffs[0] for d in diffs), residual, True, spread)


@dataclass(frozen=True)
class RanksView:
    """Every rank's :class:`StoreView` at one moment (index = rank) and the session's facts."""

    views: tuple
    meta: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return len(self.views)

    def __getitem__(self, rank: int) -> StoreView:
        return self.views[rank]

    @property
    def clock(self) -> ClockAlignment:
        return clock_alignment(self.views)


def combined_view(rv: "RanksView") -> StoreView:
    """All ranks' aggregates merged into one view (kernels, copies, API, NVTX: what ``nsys
    stats`` sums over the devices of a multi-GPU report); tokens and raw records stay per
    rank and are left out."""

    def merge_into(dst: dict, key, stats) -> None:
        if key in dst:
            dst[key].merge(stats)
        else:
            dst[key] = stats.copy()

    kernels: dict = {}
    memcpy: dict = {}
    memset: dict = {}
    api: dict = {}
    nvtx: dict = {}
    for v in rv.views:
        for key, agg in v.kernels.items():
            if key in kernels:
                kernels[key].stats.merge(agg.stats)
                kernels[key].graph_launches += agg.graph_launches
                kernels[key].loop_launches += agg.loop_launches
                kernels[key].loop_ns += agg.loop_ns
            else:
                kernels[key] = KernelAggregate(agg.name, agg.phase, agg.mode, agg.stats.copy(),
                                               agg.grid, agg.block, agg.registers,
                                               agg.shared_mem, agg.graph_launches,
                                               dict(agg.configs), agg.loop_launches,
                                               agg.loop_ns)
        for table, dst in ((v.memcpy, memcpy), (v.memset, memset)):
            for key, (a, b) in table.items():
                if key in dst:
                    dst[key][0].merge(a)
                    dst[key][1].merge(b)
                else:
                    dst[key] = (a.copy(), b.copy())
        for key, st in v.api.items():
            merge_into(api, key, st)
        for key, st in v.nvtx.items():
            merge_into(nvtx, key, st)
    first = rv.views[0]
    return StoreView(meta=dict(first.meta), tokens=[], kernels=kernels, memcpy=memcpy,
                     memset=memset, api=api, token_stats={}, allocs=first.allocs, nvml=[],
                     raw=[], counters={}, collectors={}, events=[], nvtx=nvtx, overhead={})


class RankSet(Protocol):
    """What the UI reads of a session of ranks (a live one, or a snapshot's)."""

    world_size: int

    def rank_store(self, rank: int) -> Any:
        """Rank ``rank``'s store: ``view(raw, raw_tokens)``, ``meta``, ``reset()``."""

    def views(self, raw: bool = False, raw_tokens: int | None = None) -> RanksView:
        """All ranks together."""


def is_rank_set(obj: Any) -> bool:
    """True for a session of more than one rank."""
    return int(getattr(obj, "world_size", 1) or 1) > 1 and callable(getattr(obj, "rank_store", None))


PROCESSES = "processes"   # RanksView.meta["launcher"] of a session of a program's processes


def is_process_set(rv: Any) -> bool:
    """True for the views of a program's processes (not the ranks of ``--tp``)."""
    meta = getattr(rv, "meta", None) or {}
    return meta.get("launcher") == PROCESSES


def process_facts(view: StoreView) -> dict:
    """What a process's store says about the process (pid, parent, command line, state)."""
    p = view.meta.get("process")
    return p if isinstance(p, dict) else {}


_MP_CODE = (("multiprocessing.spawn", "spawn worker"), ("multiprocessing.forkserver", "forkserver"),
            ("multiprocessing.resource_tracker", "resource tracker"),
            ("multiprocessing.semaphore_tracker", "semaphore tracker"))
_OPTS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def process_name(argv: list) -> str:
    """A short name for a process from its command line: the script's file name, ``-m
    module``, or what a ``-c`` of multiprocessing is (``spawn worker``, ``forkserver``)."""
    argv = [str(a) for a in (argv or [])]
    if not argv:
        return "python"
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-c", "-m", "-"):
        opt = args.pop(0)
        if opt in _OPTS_WITH_VALUE and args:
            args.pop(0)
    if not args:
        return argv[0].rsplit("/", 1)[-1]
    if args[0] == "-c":
        code = args[1] if len(args) > 1 else ""
        return next((name for key, name in _MP_CODE if key in code), "python -c")
    if args[0] == "-m":
        return f"-m {args[1]}" if len(args) > 1 else "-m"
    return args[0].rsplit("/", 1)[-1] or "python"


def is_active(view: StoreView) -> bool:
    """A process that does GPU work, or marks steps: the ones ``g`` cycles through."""
    c = view.counters or {}
    return bool(view.meta.get("cuda") or view.meta.get("rank") is not None or c.get("kernels")
                or any(t for t in view.timeline if getattr(t, "phase", "") != "window"))


def cycle_active(views: list | tuple, current: int, step: int = 1) -> int:
    """The next view after ``current`` (``step`` -1: before) that is active
    (:func:`is_active`), wrapping around; among all of them when none is."""
    n = len(views)
    if n == 0:
        return 0
    pool = [i for i, v in enumerate(views) if is_active(v)] or list(range(n))
    later = [i for i in pool if (i - current) * step > 0]
    if later:
        return min(later) if step > 0 else max(later)
    return pool[0] if step > 0 else pool[-1]


def jobs(rv: "RanksView") -> list[tuple[str, "RanksView"]]:
    """The torch.distributed jobs among a session's processes: (job, its ranks' RanksView in
    rank order) for each job whose ranks are all here (world size at least 2). The views of
    ``--tp`` are one job already."""
    if not is_process_set(rv):
        return [("tp", rv)] if rv.world_size > 1 else []
    groups: dict[str, dict[int, StoreView]] = {}
    for v in rv.views:
        m = v.meta
        key, rank, world = m.get("job"), m.get("rank"), m.get("world_size")
        if not key or not isinstance(rank, int) or not isinstance(world, int) or world < 2:
            continue
        groups.setdefault(f"{key}/{world}", {})[rank] = v
    out = []
    for key, by_rank in groups.items():
        world = int(key.rsplit("/", 1)[1])
        if sorted(by_rank) == list(range(world)):
            out.append((key.rsplit("/", 1)[0], RanksView(tuple(by_rank[r] for r in range(world)),
                                                          {"world_size": world,
                                                           "launcher": "torch.distributed"})))
    return out


__all__ = ["RanksView", "RankSet", "ClockAlignment", "clock_alignment", "is_rank_set",
           "combined_view", "ALIGN_ABOVE_NS", "PROCESSES", "is_process_set", "process_facts",
           "process_name", "is_active", "jobs", "cycle_active"]
