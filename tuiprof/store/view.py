"""What readers of the store get: :class:`StoreView`, an immutable picture of a session, and
the types it holds (a step's :class:`TokenRow`, a kernel's :class:`KernelAggregate`, a batch
configuration's :class:`ConfigData`), plus :class:`ViewCursor`, what a mirror of the store
already holds. :class:`~tuiprof.store.session.SessionStore` fills them; a snapshot or a mirror
rebuilds them (:func:`compose_view`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .requests import EMPTY as NO_REQUESTS, RequestsView
from .stats import RunningStats


@dataclass(slots=True)
class TokenRow:
    """Everything known about one generated token (one prefill or one decode step)."""

    seq: int
    step: int
    phase: str
    mode: str
    start_ns: int
    end_ns: int = 0
    token_id: int | None = None
    host_ms: float = 0.0
    gpu_ms: float | None = None
    cycle: int = 0
    batch: int = 1          # sequences this step advanced (a decode step makes ``batch`` tokens)
    positions: int = 1      # input positions of the step over all sequences (a prefill: the prompts')
    config: Any = 1         # the batch configuration the step belongs to (see the module doc)
    compiling: bool = False  # run while a compile ran in the background: timed apart
    # recorded its CUDA graphs again: tuiprof dropped them at its start to attach or detach
    # CUPTI (compiled sessions); timed apart like ``compiling``, its time is tuiprof's
    rerecord: bool = False
    # CUPTI was attached while the step ran (True: a traced step, or one just before or after
    # a burst; False: finalized or absent, the untraced reference; None: not known, e.g. a
    # replay or a snapshot written before this was recorded)
    attached: bool | None = None
    kernels: int = 0
    kernel_ns: int = 0
    busy_ns: int = 0
    first_kernel_ns: int = 0
    last_kernel_end_ns: int = 0
    graph_kernels: int = 0
    # CUPTI graph records (compiled steps between sampling bursts): launches and the span from
    # the first graph's start to the last one's end, on every such step, traced or not
    graphs: int = 0
    graph_first_ns: int = 0
    graph_last_end_ns: int = 0
    # The host window in which the step's model forward launched its work (0: the source did
    # not say), and the traced kernels split by where they were launched: inside it (the
    # model's) or outside it (the loop's own: sampling, generate()'s bookkeeping); a kernel
    # counts for the step that launched it (its CUPTI API record's start)
    model_start_ns: int = 0
    model_end_ns: int = 0
    model_kernels: int = 0
    model_kernel_ns: int = 0
    loop_kernels: int = 0
    loop_kernel_ns: int = 0
    memcpy_count: int = 0
    memcpy_bytes: dict = field(default_factory=dict)
    memset_count: int = 0
    memset_bytes: int = 0
    mallocs: int = 0              # true device cudaMalloc/cudaFree only (alloc_classes)
    frees: int = 0
    malloc_bytes: int = 0
    free_bytes: int = 0
    api_calls: int = 0
    alloc: dict | None = None
    sampled: bool = True
    done: bool = False
    # Requests (a server's): which ones the step advanced (the prefilling ones first, ``prefills``
    # of them), its prompt and decode tokens, requests waiting and running when it began, and
    # KV-cache blocks in use of the total (0: not known); see tuiprof/store/requests.py
    requests: tuple = ()
    prefills: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    pending: int = 0
    running: int = 0
    kv_used: int = 0
    kv_total: int = 0
    busy_cursor: int = 0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__ if k != "busy_cursor"}

    @property
    def apart(self) -> bool:
        """Timed apart from the clean figures: slowed by a compile beside it, or by recording
        CUDA graphs again after tuiprof dropped them."""
        return self.compiling or self.rerecord


@dataclass(slots=True, eq=False)
class KernelAggregate:
    """Running aggregate of one kernel name in one phase and mode."""

    name: str
    phase: str
    mode: str
    stats: RunningStats = field(default_factory=RunningStats)
    grid: tuple = (0, 0, 0)
    block: tuple = (0, 0, 0)
    registers: int = 0
    shared_mem: int = 0
    graph_launches: int = 0
    configs: dict = field(default_factory=dict)  # (grid, block) -> launches, at most 16 kept
    # launches from outside a step's model forward (the loop's own), and their kernel time
    loop_launches: int = 0
    loop_ns: int = 0

    def copy(self, light: bool = False) -> "KernelAggregate":
        stats = self.stats.light_copy() if light else self.stats.copy()
        return KernelAggregate(self.name, self.phase, self.mode, stats, self.grid,
                               self.block, self.registers, self.shared_mem, self.graph_launches,
                               dict(self.configs), self.loop_launches, self.loop_ns)


# per (phase, mode): "span_ns" is a traced step's kernel span (first kernel start to last kernel
# end), "graph_span_ns" an untraced compiled step's span from CUPTI graph records, "busy_pct" a
# traced step's kernel-busy share of its own wall time (derive.busy_fraction)
# "model_*" and "loop_*": a traced step's kernels launched inside and outside its model forward;
# "traced_ms": a traced step's wall time (with sampling, "host_ms" covers every step instead)
# Folded when a step ends (whole session, like "host_ms"): "untraced_ms" / "untraced_gpu_ms" the
# wall and CUDA-event times of steps that ran with CUPTI detached or absent (the reference for
# what tracing costs), "traced_step_ms" / "traced_gpu_ms" those of traced steps
TOKEN_STATS = ("host_ms", "gpu_ms", "kernels", "busy_ns", "kernel_ns", "seqs", "span_ns",
               "graph_span_ns", "busy_pct", "model_kernels", "model_kernel_ns", "loop_kernels",
               "loop_kernel_ns", "traced_ms", "untraced_ms", "untraced_gpu_ms",
               "traced_step_ms", "traced_gpu_ms")


@dataclass(slots=True)
class ConfigData:
    """The aggregates of one batch configuration (a view holds copies: treat them as frozen)."""

    kernels: dict = field(default_factory=dict)      # (name, phase, mode) -> KernelAggregate
    memcpy: dict = field(default_factory=dict)       # (copy_kind, phase, mode) -> (ns, bytes)
    memset: dict = field(default_factory=dict)       # (phase, mode) -> (ns, bytes)
    api: dict = field(default_factory=dict)          # api name -> RunningStats of ns
    nvtx: dict = field(default_factory=dict)         # range name -> RunningStats of ns
    token_stats: dict = field(default_factory=dict)  # (phase, mode) -> {stat name: RunningStats}
    allocs: dict = field(default_factory=lambda: new_allocs())

    def copy(self, light: bool = False, records: bool = True) -> "ConfigData":
        """A copy for a reader; ``light``: statistics without their median histograms;
        ``records=False``: token statistics and NVTX only (the record aggregates left empty)."""
        cp = RunningStats.light_copy if light else RunningStats.copy
        out = ConfigData(nvtx={k: cp(v) for k, v in self.nvtx.items()},
                         token_stats={k: {n: cp(s) for n, s in v.items()}
                                      for k, v in self.token_stats.items()})
        if records:
            out.kernels = {k: v.copy(light) for k, v in self.kernels.items()}
            out.memcpy = {k: (cp(a), cp(b)) for k, (a, b) in self.memcpy.items()}
            out.memset = {k: (cp(a), cp(b)) for k, (a, b) in self.memset.items()}
            out.api = {k: cp(v) for k, v in self.api.items()}
            out.allocs = _copy_allocs(self.allocs)
        return out


def config_order(key: Any) -> tuple:
    """Sort key of configuration keys: batches in increasing order, then named ones."""
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


@dataclass(frozen=True, slots=True)
class StoreView:
    """An immutable, consistent picture of the session for readers."""

    meta: dict
    tokens: list            # TokenRow, oldest first, at most ``series_len``
    kernels: dict           # (name, phase, mode) -> KernelAggregate
    memcpy: dict            # (copy_kind, phase, mode) -> (RunningStats of ns, RunningStats of bytes)
    memset: dict            # (phase, mode) -> (RunningStats of ns, RunningStats of bytes)
    api: dict               # api name -> RunningStats of ns
    token_stats: dict       # (phase, mode) -> {"host_ms", "gpu_ms"} over the whole session, and
                            # {"kernels", "busy_ns", "kernel_ns"} over tokens that left the window
                            # (add ``tokens`` for the rest: see analysis.tokens)
    allocs: dict            # device allocation counters (CUPTI MEMORY2), start-up vs tokens
    nvml: list              # NVML sample dicts, oldest first (bounded): the series "nvml"
    raw: list               # (seq, [records]) for the last ``ring_tokens`` tokens
    counters: dict          # records, dropped, late, unattributed ...
    collectors: dict        # name -> {"ok": bool, "message": str}
    events: list            # (seq, ts_ns, kind, text): mode switches, resets, errors
    nvtx: dict              # range name -> RunningStats of ns (prefill/decode/step ranges)
    overhead: dict          # live overhead estimate
    output: list = field(default_factory=list)  # recent lines a profiled program printed
    batch: Any = 1          # the batch configuration this view shows (tokens, aggregates)
    configs: dict = field(default_factory=dict)   # every configuration: key -> ConfigData
    timeline: list = field(default_factory=list)  # token rows of every configuration
    series: dict = field(default_factory=dict)    # other sampled kinds: kind -> [sample dicts]
    requests: RequestsView = NO_REQUESTS          # a server's requests (store/requests.py)
    # What a metrics scraper counts: "steps" (phase, mode) -> Buckets of a clean step's wall ms,
    # "totals" name -> a count since the session began (never reset; see SessionStore.fleet)
    fleet: dict = field(default_factory=dict)

    @property
    def kernels_traced(self) -> bool:
        """Whether any step can have been traced: CUPTI ran, or kernel records are here (a
        replay, a snapshot). Without CUPTI the sampling schedule still marks steps sampled,
        yet none was traced: their kernel figures are unknown, not zero."""
        cupti = self.collectors.get("cupti")
        return bool(self.kernels) or cupti is None or bool(cupti.get("ok", True))

    @property
    def config_keys(self) -> list:
        """The configurations measured, in order (batches first, increasing)."""
        keys = set(self.configs) | {t.config for t in self.timeline} | {self.batch}
        return sorted(keys, key=config_order)

    def part(self) -> ConfigData:
        """This view's configuration as :class:`ConfigData`."""
        return ConfigData(self.kernels, self.memcpy, self.memset, self.api, self.nvtx,
                          self.token_stats, self.allocs)

    def select(self, key: Any) -> "StoreView":
        """The view of configuration ``key`` (same session, same raw window)."""
        if key == self.batch:
            return self
        parts = dict(self.configs) or {self.batch: self.part()}
        return compose_view(self.meta, self.timeline or self.tokens, parts, key, raw=self.raw,
                            nvml=self.nvml, counters=self.counters, collectors=self.collectors,
                            events=self.events, overhead=self.overhead, output=self.output,
                            series=self.series, requests=self.requests, fleet=self.fleet)


def compose_view(meta: dict, timeline: list, parts: dict, key: Any, *, raw: list, nvml: list,
                 counters: dict, collectors: dict, events: list, overhead: dict,
                 output: list | None = None, series: dict | None = None,
                 requests: RequestsView | None = None, fleet: dict | None = None) -> StoreView:
    """A :class:`StoreView` of configuration ``key``: its token rows and aggregates, plus the
    session-wide parts (NVML, raw window, counters, events) and every configuration."""
    part = parts.get(key) or ConfigData()
    return StoreView(
        meta=meta, tokens=[r for r in timeline if r.config == key], kernels=part.kernels,
        memcpy=part.memcpy, memset=part.memset, api=part.api, token_stats=part.token_stats,
        allocs=part.allocs, nvml=nvml, raw=raw, counters=counters, collectors=collectors,
        events=events, nvtx=part.nvtx, overhead=overhead, output=list(output or ()), batch=key,
        configs=parts, timeline=timeline, series=dict(series or {}),
        requests=requests if requests is not None else NO_REQUESTS, fleet=dict(fleet or {}))


@dataclass(frozen=True, slots=True)
class ViewCursor:
    """What a mirror of the store already holds (see :meth:`SessionStore.changes`)."""

    generation: int = -1
    token_seq: int = -1          # highest token seq sent
    series: tuple = ()           # (kind, newest sample's ts_ns sent) per sampled kind
    records: int = -1            # records counter when the record aggregates were last sent
    events: tuple = ()           # (count, last event) when events were last sent
    output: int = 0              # program output lines sent
    raw: tuple = ()              # ((seq, record count), ...) of the raw records the mirror holds
    requests: tuple = (-1, -1)   # (rev, evictions) of the request rows sent


def alloc_counter() -> dict:
    return {"mallocs": 0, "frees": 0, "malloc_bytes": 0, "free_bytes": 0}


def new_allocs() -> dict:
    return {"startup": alloc_counter(), "tokens": alloc_counter(), "by_phase": {},
            "device_by_phase": {}, "classes": {}}


def copy_row(row: TokenRow) -> TokenRow:
    c = copy.copy(row)
    c.memcpy_bytes = dict(row.memcpy_bytes)
    return c


def _copy_allocs(a: dict) -> dict:
    out = {"startup": dict(a["startup"]), "tokens": dict(a["tokens"])}
    for name in ("by_phase", "device_by_phase", "classes"):
        out[name] = {k: dict(v) for k, v in a.get(name, {}).items()}
    return out
