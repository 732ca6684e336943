"""Records into the store: each CUPTI record attributed to the step whose window holds it (by
start time) and folded into that step's row and its configuration's aggregates, one small
function per record kind (:mod:`tuiprof.store.records` has their layouts).

:class:`RecordIngest` is a part of :class:`~tuiprof.store.session.SessionStore`: it works on
the store's state (token windows, configurations, counters, launch tables) under the store's
lock, and the store's constructor makes that state.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Iterable

from ..phases import OTHER
from .alloc_classes import (MAX_CLASSES, OVERFLOW, class_key, has_detail, is_device_malloc,
                            memory_class)
from .records import (
    A_BYTES, A_CORR, A_OP, A_TS, ALLOC, API, C_BYTES, C_END, C_KIND, C_START, DIRECTION, G_END,
    G_START, GRAPH, K_CORR, K_END, K_GRAPH, K_LAUNCH, K_NAME, K_REGS, K_SMEM, K_START, KERNEL, KIND,
    MEMCPY, MEMOP_ALLOCATION, MEMSET, R_CORR, R_END, R_NAME, R_START, S_BYTES, S_END, S_START,
)
from .stats import RunningStats
from .view import ConfigData, KernelAggregate, TokenRow, alloc_counter

API_CORR_LEN = 4096
LAUNCH_LEN = 65536  # launches remembered, and kernels waiting for their launch (a step: ~2,000)
TS_INDEX = {KERNEL: K_START, MEMCPY: C_START, MEMSET: S_START, ALLOC: A_TS, API: R_START,
            GRAPH: G_START}
# Where a record with a duration has its end (its start is at TS_INDEX). One that ends before it
# starts (a corrupt buffer, a hand-edited recording) has no duration to fold: it is dropped
# and counted (counters["ends_before_start"]), never a negative time in any aggregate or export.
END_INDEX = {KERNEL: K_END, MEMCPY: C_END, MEMSET: S_END, API: R_END, GRAPH: G_END}
MAX_LAUNCH_CONFIGS = 16   # (grid, block) pairs counted per kernel aggregate


class _Place:
    """Where the records being folded belong: the step whose window holds them (``row`` None:
    outside every step), its raw list, phase, mode and configuration, and whether sampling
    left it out. Kept while the following records fall inside ``[lo, hi]`` (records arrive
    nearly in time order)."""

    __slots__ = ("row", "raw", "phase", "mode", "part", "skip", "lo", "hi")

    def __init__(self, mode: str, part: ConfigData) -> None:
        self.row: TokenRow | None = None
        self.raw: list | None = None
        self.phase, self.mode, self.part = OTHER, mode, part
        self.skip = False
        self.lo = self.hi = -1


class RecordIngest:
    """The record-folding half of the session store (see the module docstring)."""

    def _find_row(self, ts: int) -> TokenRow | None:
        starts = self._win_starts
        if not starts or ts < starts[0]:
            return None
        i = bisect_right(starts, ts) - 1
        row = self._win_rows[i]
        if row.done and row.end_ns and ts > row.end_ns:
            return None  # between tokens
        return row

    def add_records(self, records: Iterable[tuple]) -> None:
        """Attribute records to tokens (by start time) and fold them into the aggregates."""
        with self._lock:
            self._add_records_locked(records)

    def _add_records_locked(self, records: Iterable[tuple]) -> None:
        # Hot path (CUPTI consumer thread): every record CUPTI delivers passes here. Kernel
        # durations are gathered per aggregate and folded in one add_many per batch; the step
        # found for one record is kept while the following records fall inside its window.
        # One function per record kind; kernels and API records, most of them, are sent from
        # here, the other kinds through _fold_other's common checks.
        at = _Place(self._open.mode if self._open is not None else self.meta.get("mode", "eager"),
                    self._cur)
        counters = self._counters
        pending: dict[KernelAggregate, list] = {}
        fold_kernel, fold_api, fold_other = self._fold_kernel, self._fold_api, self._fold_other
        place, find = self._place, self._find_row
        split = self._split
        outside = at.part   # the configuration of records outside every step
        row, raw, skip, kernels, phase, mode = None, None, False, at.part.kernels, OTHER, at.mode
        lo = hi = -1
        n = nk = 0
        for rec in records:
            n += 1
            kind = rec[KIND]
            ts = rec[TS_INDEX[kind]]
            if not (lo <= ts <= hi):
                row = find(ts)
                if row is not None:
                    place(at, row)
                    raw, skip, lo, hi = at.raw, at.skip, at.lo, at.hi
                    kernels, phase, mode = at.part.kernels, at.phase, at.mode
                elif at.row is not None or lo != -1:   # outside every step (the mode stays)
                    at.row, at.raw, at.phase, at.skip, at.part = None, None, OTHER, False, outside
                    raw, skip, lo, hi, kernels, phase = None, False, -1, -1, outside.kernels, OTHER
            if kind != KERNEL:
                if kind == API and rec[R_END] >= ts:   # the next most frequent kind
                    fold_api(rec, at)
                else:
                    fold_other(rec, kind, ts, at)
                continue
            if skip:  # a step left out by sampling
                counters["unsampled"] += 1
            else:
                nk += fold_kernel(rec, row, raw, kernels, phase, mode, pending, split)
        for agg, durs in pending.items():
            agg.stats.add_many(durs)
        counters["kernels"] += nk
        counters["records"] += n

    def _fold_kernel(self, rec: tuple, row: TokenRow | None, raw: list | None, kernels: dict,
                     phase: str, mode: str, pending: dict, split: bool) -> int:
        """A kernel record (of a step not sampled out) into its aggregate (its duration into
        ``pending``) and its step's row: 1 when folded, 0 when it has no duration."""
        start, end = rec[K_START], rec[K_END]
        if end < start:   # ends before it starts: no duration to fold (counted)
            self._counters["ends_before_start"] += 1
            return 0
        if raw is not None:
            raw.append(rec)
        elif row is None:
            self._counters["unattributed"] += 1
        name = rec[K_NAME]
        key = (name, phase, mode)
        agg = kernels.get(key)
        if agg is None:
            agg = kernels[key] = KernelAggregate(name, phase, mode)
            agg.registers, agg.shared_mem = rec[K_REGS], rec[K_SMEM]
        durs = pending.get(agg)
        if durs is None:
            durs = pending[agg] = []
        durs.append(end - start)
        cfg = rec[K_LAUNCH]
        configs = agg.configs
        c = configs.get(cfg)
        if c is not None:
            configs[cfg] = c + 1
        elif len(configs) < MAX_LAUNCH_CONFIGS:
            configs[cfg] = 1
            agg.grid, agg.block = cfg[:3], cfg[3:]
        graph = rec[K_GRAPH]
        if graph:
            agg.graph_launches += 1
        if row is not None:
            row.kernels += 1
            row.kernel_ns += end - start
            if graph:
                row.graph_kernels += 1
            if not row.first_kernel_ns or start < row.first_kernel_ns:
                row.first_kernel_ns = start
            # Union of kernel intervals; records of a stream arrive in start order.
            cur = row.busy_cursor
            if start >= cur:
                row.busy_ns += end - start
                row.busy_cursor = end
            elif end > cur:
                row.busy_ns += end - cur
                row.busy_cursor = end
            if end > row.last_kernel_end_ns:
                row.last_kernel_end_ns = end
        if split:
            launched = self._launch_ts.get(rec[K_CORR])
            if launched is None:
                self._pend_launch(rec[K_CORR], agg, end - start)
            else:
                self._split_kernel(launched, agg, end - start)
        return 1

    def _place(self, at: _Place, row: TokenRow) -> None:
        """Move ``at`` to step ``row`` (the one whose window holds the next record)."""
        at.row = row
        at.lo = row.start_ns
        at.hi = row.end_ns if row.done and row.end_ns else 1 << 62
        at.phase, at.mode = row.phase, row.mode
        at.part = self._part(row.config)
        at.raw = self._raw_by_seq.get(row.seq)
        at.skip = not row.sampled
        if row.seq < self._dirty_seq:
            self._dirty_seq = row.seq

    def _fold_other(self, rec: tuple, kind: str, ts: int, at: _Place) -> None:
        """A record of any kind but a kernel: checked, kept in the raw ring, then folded by
        its kind's function."""
        counters = self._counters
        end_at = END_INDEX.get(kind)
        if end_at is not None and rec[end_at] < ts:   # ends before it starts (counted)
            counters["ends_before_start"] += 1
            return
        row = at.row
        if kind == GRAPH:  # never sampled out, never in the raw ring (not a raw record kind)
            counters["graphs"] += 1
            if row is not None:
                _graph_into_row(row, rec)
            return
        if at.skip and kind != ALLOC:  # a step left out by sampling (API records never are)
            counters["unsampled"] += 1
            return
        if at.raw is not None:
            at.raw.append(rec)
        elif row is None:
            counters["unattributed"] += 1
        if kind == MEMCPY:
            _fold_memcpy(at.part, rec, row, at.phase, at.mode)
        elif kind == MEMSET:
            _fold_memset(at.part, rec, row, at.phase, at.mode)
        elif kind == ALLOC:
            self._fold_alloc(at.part.allocs, rec, row)

    def _fold_api(self, rec: tuple, at: _Place) -> None:
        """A runtime/driver API record (one that does not end before it starts): kept in the raw
        ring, its name's timing, the call that a memory record's correlation id names, and
        where the kernels of its launch were launched from."""
        row, raw, part = at.row, at.raw, at.part
        if raw is not None:
            raw.append(rec)
        elif row is None:
            self._counters["unattributed"] += 1
        name, start, corr_id = rec[R_NAME], rec[R_START], rec[R_CORR]
        s = part.api.get(name)
        if s is None:
            s = part.api[name] = RunningStats()
        s.add(rec[R_END] - start)
        if row is not None:
            row.api_calls += 1
        corr = self._api_corr
        corr[corr_id] = name
        if len(corr) > API_CORR_LEN:
            corr.popitem(last=False)
        if self._split:
            launch_ts = self._launch_ts
            launch_ts[corr_id] = start
            if len(launch_ts) > LAUNCH_LEN:
                launch_ts.popitem(last=False)
            pending = self._launch_pending.pop(corr_id, None)
            if pending is not None:
                self._pending_n -= len(pending)
                for agg, dur in pending:
                    self._split_kernel(start, agg, dur)

    def _pend_launch(self, corr: int, agg: KernelAggregate, dur: int) -> None:
        """A kernel whose API record has not been folded yet (another buffer may hold it)."""
        pending = self._launch_pending
        waiting = pending.get(corr)
        if waiting is None:
            pending[corr] = [(agg, dur)]
        else:
            waiting.append((agg, dur))
        self._pending_n += 1
        while self._pending_n > LAUNCH_LEN:
            _, dropped = pending.popitem(last=False)
            self._pending_n -= len(dropped)
            self._counters["launch_unmatched"] += len(dropped)

    def _split_kernel(self, launched: int, agg: KernelAggregate, dur: int) -> None:
        """Count a kernel for the step that launched it at ``launched``: the model's when inside
        that step's model window, else the loop's own."""
        row = self._split_row  # the launching step of the previous kernel, while it holds
        if row is None or not (row.start_ns <= launched <= row.end_ns):
            row = self._find_row(launched)
            if row is None:
                return
            if row.done:  # a closed window can be reused; an open one may yet be followed
                self._split_row = row
        if not row.model_start_ns:
            return
        if row.model_start_ns <= launched <= row.model_end_ns:
            row.model_kernels += 1
            row.model_kernel_ns += dur
        else:
            row.loop_kernels += 1
            row.loop_kernel_ns += dur
            agg.loop_launches += 1
            agg.loop_ns += dur
        if row.seq < self._dirty_seq:
            self._dirty_seq = row.seq

    def _fold_alloc(self, allocs: dict, rec: tuple, row: TokenRow | None) -> None:
        """Count one memory record into ``allocs`` (its configuration's): everything, true device
        cudaMalloc/cudaFree, and its class."""
        is_alloc = rec[A_OP] == MEMOP_ALLOCATION
        nbytes = rec[A_BYTES]
        pkey = "startup" if row is None else f"{row.phase}/{row.mode}"
        _count_alloc(allocs["startup"] if row is None else allocs["tokens"], is_alloc, nbytes)
        if row is not None:
            _count_alloc(allocs["by_phase"].setdefault(pkey, alloc_counter()), is_alloc, nbytes)
        device = is_device_malloc(rec)
        if device:
            _count_alloc(allocs["device_by_phase"].setdefault(pkey, alloc_counter()),
                         is_alloc, nbytes)
        api = self._api_corr.get(rec[A_CORR]) if has_detail(rec) else None
        classes = allocs["classes"]
        key = class_key(pkey, memory_class(rec, api))
        bucket = classes.get(key)
        if bucket is None:
            if len(classes) >= MAX_CLASSES:
                key = class_key(pkey, OVERFLOW)
            bucket = classes.setdefault(key, alloc_counter())
        _count_alloc(bucket, is_alloc, nbytes)
        if row is not None and device:
            if is_alloc:
                row.mallocs += 1
                row.malloc_bytes += nbytes
            else:
                row.frees += 1
                row.free_bytes += nbytes


def _graph_into_row(row: TokenRow, rec: tuple) -> None:
    """A CUDA-graph launch record into its step's row: launches and their span."""
    if not row.graphs or rec[G_START] < row.graph_first_ns:
        row.graph_first_ns = rec[G_START]
    if rec[G_END] > row.graph_last_end_ns:
        row.graph_last_end_ns = rec[G_END]
    row.graphs += 1


def _fold_memcpy(part: ConfigData, rec: tuple, row: TokenRow | None, phase: str,
                 mode: str) -> None:
    kind, nbytes = rec[C_KIND], rec[C_BYTES]
    key = (kind, phase, mode)
    pair = part.memcpy.get(key)
    if pair is None:
        pair = part.memcpy[key] = (RunningStats(), RunningStats())
    pair[0].add(rec[C_END] - rec[C_START])
    pair[1].add(nbytes)
    if row is not None:
        row.memcpy_count += 1
        d = DIRECTION.get(kind, "other")
        row.memcpy_bytes[d] = row.memcpy_bytes.get(d, 0) + nbytes


def _fold_memset(part: ConfigData, rec: tuple, row: TokenRow | None, phase: str,
                 mode: str) -> None:
    key = (phase, mode)
    pair = part.memset.get(key)
    if pair is None:
        pair = part.memset[key] = (RunningStats(), RunningStats())
    pair[0].add(rec[S_END] - rec[S_START])
    pair[1].add(rec[S_BYTES])
    if row is not None:
        row.memset_count += 1
        row.memset_bytes += rec[S_BYTES]


def _count_alloc(bucket: dict, is_alloc: bool, nbytes: int) -> None:
    if is_alloc:
        bucket["mallocs"] += 1
        bucket["malloc_bytes"] += nbytes
    else:
        bucket["frees"] += 1
        bucket["free_bytes"] += nbytes
