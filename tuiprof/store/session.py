"""The session store: the single, bounded, thread-safe source of truth of a session.

Producers (engine thread, CUPTI consumer, NVML sampler) write into it; the UI, analysis and
exports read immutable views from :meth:`SessionStore.view`. Nothing here grows with the length
of a session except by a bounded amount: raw records are kept for the last ``ring_tokens``
tokens only, everything older lives on as running aggregates.

**Configurations.** The aggregates (kernels, memcpy, memset, API, NVTX, token statistics,
allocations) are kept per *batch configuration*: the key a step source gives each step
(``begin_token(config=...)``; the engine gives its batch, a program whose batch varies step by
step can give one key such as ``"varying"``). Mode stays a key inside each configuration, so a
configuration as the user sees it is mode x batch. ``view(batch=k)`` is the view of one
configuration (default: the one of the latest step): every reader works on it unchanged, and
``view.configs`` holds the others for selectors and comparisons.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from itertools import islice
from typing import Any, Iterable

from ..errors import safe_text
from .ingest import RecordIngest
from .records import KERNEL, KIND, MEMCPY, MEMSET, PREFILL
from .requests import RequestBook
from .stats import STEP_EDGES_MS, Buckets, RunningStats
from .view import TOKEN_STATS, ConfigData, StoreView, TokenRow, ViewCursor, compose_view, copy_row

NVML, RECORDS = "nvml", "records"   # the kinds of :meth:`SessionStore.ingest` with a name here
PROGRAM_CONFIG = "program"  # the configuration of a profiled program's steps (any batch)
# Traced tokens kept after they left the raw ring, for readers of "the last N traced tokens"
# (findings, the cross-rank split): a sampling burst comes every 256 eager or 4,096 compiled
# tokens, and a ring of 64 tokens lets it go after 4.6 s of eager or 0.2 s of compiled decode.
KEPT_TRACED = 16
# (phase, mode) keys of the step-time buckets (a program may name its own phases); past this,
# the steps of new phases share the key ("other", mode): a scraper's series stay bounded
FLEET_KEYS = 16


class SessionStore(RecordIngest):
    """Bounded, thread-safe store; see the module docstring. Records are folded by
    :class:`~tuiprof.store.ingest.RecordIngest`; readers get a :class:`StoreView`."""

    def __init__(self, ring_tokens: int = 64, series_len: int = 2048, nvml_len: int = 6000,
                 meta: dict | None = None, output_len: int = 1000,
                 requests_keep: int = 1024) -> None:
        self.ring_tokens = ring_tokens
        self.series_len = series_len
        self._lock = threading.Lock()
        self.meta: dict = dict(meta or {})
        # Sampled kinds (a collector's samples, each a dict with ``ts_ns``): bounded rings.
        self._series: dict[str, deque] = {NVML: deque(maxlen=nvml_len)}
        self._nvml = self._series[NVML]
        # A profiled program's output, sanitised lines; not statistics, so ``reset`` keeps it.
        self._output: deque = deque(maxlen=output_len)
        self._output_count = 0   # lines ever added (a mirror's cursor)
        self._events: deque = deque(maxlen=1000)
        self._collectors: dict[str, dict] = {}
        self.overhead: dict = {}
        # Rows changed since each mirror's last delta (mirror key -> lowest seq), so that any
        # number of mirrors (a UI, a second UI, the session's keeper) each get every change.
        self._mirror_dirty: OrderedDict[Any, int] = OrderedDict()
        # A server's requests: a record kind with a lock of its own (producers on the server's
        # threads must not wait for a CUPTI fold); a program's misuse becomes one event per kind
        # (appended without the store's lock: the book calls it holding its own, and deque
        # appends are atomic)
        self.requests = RequestBook(requests_keep, on_misuse=lambda kind, text: self._events.append(
            (self._seq, time.time_ns(), "requests", text)))
        # Counted for metrics scrapers since the session began; ``reset`` leaves them (a
        # scraper's counters must only grow): clean steps' wall times per (phase, mode), at
        # most FLEET_KEYS keys, and totals of steps and tokens
        self._step_buckets: dict[tuple, Buckets] = {}
        self._totals = {"steps": 0, "apart_steps": 0, "decode_tokens": 0, "prefill_tokens": 0}
        self._reset_data()

    # ------------------------------------------------------------------ state
    def _reset_data(self) -> None:
        self._tokens: deque[TokenRow] = deque(maxlen=self.series_len)
        # Token windows for attribution: parallel lists of starts and rows, bounded.
        self._win_starts: deque[int] = deque(maxlen=self.series_len)
        self._win_rows: deque[TokenRow] = deque(maxlen=self.series_len)
        self._open: TokenRow | None = None
        self._raw: deque = deque(maxlen=self.ring_tokens)
        self._raw_by_seq: dict[int, list] = {}
        self._kept: deque = deque(maxlen=KEPT_TRACED)  # traced (seq, records) that left _raw
        if not hasattr(self, "_config"):
            self._config: Any = self.meta.get("batch", 1)  # the configuration of new steps
        self._parts: dict[Any, ConfigData] = {self._config: ConfigData()}
        self._cur = self._parts[self._config]
        # correlation id -> API name of recent runtime/driver records, to name the call that
        # made a memory record (bounded; CUPTI emits an API record before its memory record)
        self._api_corr: OrderedDict[int, str] = OrderedDict()
        # Where kernels were launched (steps that mark their model forward, see
        # ``set_model_window``): correlation id -> API record start, and kernels whose API
        # record has not come yet: correlation id -> [(aggregate, duration), ...] (a CUDA
        # graph's kernels share their graph launch's id). Both bounded.
        self._split = False
        self._split_row: TokenRow | None = None
        self._launch_ts: OrderedDict[int, int] = OrderedDict()
        self._launch_pending: OrderedDict[int, list] = OrderedDict()
        self._pending_n = 0
        self._counters = {"records": 0, "kernels": 0, "dropped": 0, "late": 0,
                          "unattributed": 0, "unsampled": 0, "tokens": 0, "graphs": 0,
                          "window_steps": 0, "launch_unmatched": 0, "ends_before_start": 0}
        self._seq = 0
        # For :meth:`changes`: lowest token seq whose row changed since the last call, and a
        # generation that a reset moves on (a mirror then starts again from scratch).
        self._dirty_seq = 1 << 62
        self._generation = getattr(self, "_generation", -1) + 1

    def reset(self) -> None:
        """Forget every statistic (the ``r`` key); metadata and collector states stay."""
        with self._lock:
            open_row = self._open
            seq = self._seq
            self._reset_data()
            self._seq = seq
            if open_row is not None:
                self._open = open_row
            self._events.append((seq, time.time_ns(), "reset", "statistics reset"))
        self.requests.reset()

    # -------------------------------------------------------------- producers
    def next_seq(self) -> int:
        return self._seq

    @property
    def config(self) -> Any:
        """The configuration of the latest step (the default of :meth:`view`)."""
        return self._config

    def _part(self, key: Any) -> ConfigData:
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = ConfigData()
        return part

    def begin_token(self, phase: str, mode: str, start_ns: int, step: int, cycle: int = 0,
                    sampled: bool = True, batch: int = 1, config: Any = None,
                    compiling: bool = False, positions: int = 1, rerecord: bool = False,
                    model: tuple[int, int] | None = None, attached: bool | None = None) -> int:
        """Open a token window at ``start_ns`` (CUPTI clock); returns its sequence number.

        ``config``: the batch configuration of the step (default: the latest one given);
        ``compiling``: the step ran while a compile ran beside it (its timing is kept apart
        from the configuration's clean statistics); ``positions``: input positions of the
        step over all sequences; ``rerecord``: the step recorded its CUDA graphs again after
        tuiprof dropped them (timed apart); ``model``: the host window of the step's model
        forward (see :meth:`set_model_window`); ``attached``: CUPTI was attached while the
        step ran (False: the step is an untraced reference; None: not known)."""
        with self._lock:
            seq = self._seq
            self._seq += 1
            if config is None:
                config = self._config
            elif config != self._config:
                self._config = config
                self._cur = self._part(config)
            row = TokenRow(seq=seq, step=step, phase=phase, mode=mode, start_ns=start_ns,
                           cycle=cycle, sampled=sampled, batch=batch, config=config,
                           compiling=compiling, positions=positions, rerecord=rerecord,
                           attached=attached)
            if model is not None:
                row.model_start_ns, row.model_end_ns = model
                self._split = True
            self._open = row
            if len(self._win_rows) == self._win_rows.maxlen:
                self._fold_evicted(self._win_rows[0])
            self._tokens.append(row)
            self._win_starts.append(start_ns)
            self._win_rows.append(row)
            raw: list = []
            if len(self._raw) == self._raw.maxlen:
                old_seq, old = self._raw[0]
                self._raw_by_seq.pop(old_seq, None)
                if _traced(old):
                    self._kept.append((old_seq, old))
            self._raw.append((seq, raw))
            self._raw_by_seq[seq] = raw
            return seq

    def set_model_window(self, seq: int, start_ns: int, end_ns: int) -> None:
        """The host window (CUPTI clock) in which token ``seq``'s model forward launched its
        work: its traced kernels are then split into the model's and the loop's own."""
        with self._lock:
            for row in reversed(self._win_rows):
                if row.seq == seq:
                    row.model_start_ns, row.model_end_ns = start_ns, end_ns
                    self._split = True
                    if seq < self._dirty_seq:
                        self._dirty_seq = seq
                    return
                if row.seq < seq:
                    return

    def set_step_requests(self, seq: int, prefill: tuple = (), decode: tuple = (),
                          prefill_tokens: int = 0, decode_tokens: int = 0, pending: int = 0,
                          running: int = 0, kv_used: int = 0, kv_total: int = 0,
                          blocks: dict | None = None) -> None:
        """The requests step ``seq`` advanced: ``prefill`` (feeding their prompt,
        ``prefill_tokens`` in all) and ``decode`` (a token each, ``decode_tokens``), the
        requests waiting (``pending``) and running when it began, KV-cache blocks used of
        ``kv_total``; ``blocks``: request -> blocks it holds. The requests' rows learn their
        steps (:class:`~tuiprof.store.requests.RequestBook`)."""
        start = None
        with self._lock:
            for row in reversed(self._win_rows):
                if row.seq == seq:
                    row.requests = tuple(prefill) + tuple(decode)
                    row.prefills = len(prefill)
                    row.prefill_tokens, row.decode_tokens = prefill_tokens, decode_tokens
                    row.pending, row.running = pending, running
                    row.kv_used, row.kv_total = kv_used, kv_total
                    start = row.start_ns
                    if seq < self._dirty_seq:
                        self._dirty_seq = seq
                    break
                if row.seq < seq:
                    break
        if start is not None:
            self.requests.step(seq, start, tuple(prefill), tuple(decode), blocks)

    def end_token(self, seq: int, end_ns: int, host_ms: float, gpu_ms: float | None = None,
                  token_id: int | None = None) -> None:
        """Close the window of token ``seq`` and fold its timing into the per-mode stats."""
        with self._lock:
            row = self._open
            if row is None or row.seq != seq:
                return
            row.end_ns = end_ns
            row.host_ms = host_ms
            row.gpu_ms = gpu_ms
            row.token_id = token_id
            row.done = True
            if seq < self._dirty_seq:  # a mirror may hold this row from while it was open
                self._dirty_seq = seq
            self._open = None
            self._counters["tokens"] += 1
            self._count_step(row, host_ms)
            if row.phase == "window":  # a program's fixed window (no step marked then)
                self._counters["window_steps"] += 1
                self.requests.steps_until(row.start_ns)
            else:  # a model step: requests in flight now are inside one
                self.requests.step_interval(row.start_ns, end_ns, seq)
            part = self._part(row.config)
            ts = _token_stats(part, row)
            if row.compiling or row.rerecord:  # slowed by a compile beside it or by tuiprof's
                key = "compiling_ms" if row.compiling else "rerecord_ms"  # graph drop: apart
                cs = ts.get(key)
                if cs is None:
                    cs = ts[key] = RunningStats()
                cs.add(host_ms)
                return
            ts["host_ms"].add(host_ms)
            ts["seqs"].add(row.batch)
            if gpu_ms is not None:
                ts["gpu_ms"].add(gpu_ms)
            side = _tracing_side(row)
            if side is not None:
                _add_stat(ts, _SIDE_HOST[side], host_ms)
                if gpu_ms is not None:
                    _add_stat(ts, f"{side}_gpu_ms", gpu_ms)
            nv = part.nvtx
            for name in ("step", row.phase):
                s = nv.get(name)
                if s is None:
                    s = nv[name] = RunningStats()
                s.add(max(0, end_ns - row.start_ns))

    def _count_step(self, row: TokenRow, host_ms: float) -> None:
        # lock held: the step's totals, and its wall time in its (phase, mode) buckets
        tot = self._totals
        tot["steps"] += 1
        if row.prefill_tokens or row.decode_tokens:   # a server's step: its requests' tokens
            tot["prefill_tokens"] += row.prefill_tokens
            tot["decode_tokens"] += row.decode_tokens
        elif row.phase == PREFILL:
            tot["prefill_tokens"] += row.positions
        elif row.phase != "window":
            tot["decode_tokens"] += row.batch
        if row.compiling or row.rerecord:
            tot["apart_steps"] += 1
            return
        key = (row.phase, row.mode)
        b = self._step_buckets.get(key)
        if b is None:
            if len(self._step_buckets) >= FLEET_KEYS:
                key = ("other", row.mode)
                b = self._step_buckets.get(key)
            if b is None:
                b = self._step_buckets[key] = Buckets(STEP_EDGES_MS)
        b.add(host_ms)

    def _fleet_copy(self) -> dict:
        return {"steps": {k: b.copy() for k, b in self._step_buckets.items()},
                "totals": dict(self._totals)}

    def set_token_gpu(self, seq: int, gpu_ms: float) -> None:
        """The CUDA-event time of token ``seq``, known after it ended (a program's step: its
        events are read without waiting for the device, a step or more later)."""
        with self._lock:
            for row in reversed(self._win_rows):
                if row.seq == seq:
                    break
                if row.seq < seq:
                    return
            else:
                return
            if row.gpu_ms is not None or not row.done:
                return
            row.gpu_ms = gpu_ms
            if seq < self._dirty_seq:
                self._dirty_seq = seq
            if row.compiling or row.rerecord:
                return
            ts = _token_stats(self._part(row.config), row)
            ts["gpu_ms"].add(gpu_ms)
            side = _tracing_side(row)
            if side is not None:
                _add_stat(ts, f"{side}_gpu_ms", gpu_ms)

    def _fold_evicted(self, row: TokenRow) -> None:
        # A token leaving the window is long complete: its kernel counts join the running stats.
        part = self._parts.get(row.config)
        ts = part.token_stats.get((row.phase, row.mode)) if part is not None else None
        if ts is None or not row.done or row.compiling or row.rerecord:
            return
        if row.sampled:
            ts["kernels"].add(row.kernels)
            ts["busy_ns"].add(row.busy_ns)
            ts["kernel_ns"].add(row.kernel_ns)
            if "traced_ms" in ts:
                ts["traced_ms"].add(row.host_ms)
            if row.kernels and "span_ns" in ts:
                ts["span_ns"].add(row.last_kernel_end_ns - row.first_kernel_ns)
            if row.kernels and "busy_pct" in ts and row.end_ns > row.start_ns:
                ts["busy_pct"].add(100.0 * row.busy_ns / (row.end_ns - row.start_ns))
            if row.kernels and row.model_start_ns and "model_kernels" in ts:
                ts["model_kernels"].add(row.model_kernels)
                ts["model_kernel_ns"].add(row.model_kernel_ns)
                ts["loop_kernels"].add(row.loop_kernels)
                ts["loop_kernel_ns"].add(row.loop_kernel_ns)
        elif row.graphs and "graph_span_ns" in ts:
            ts["graph_span_ns"].add(row.graph_last_end_ns - row.graph_first_ns)

    def set_token_alloc(self, seq: int, stats: dict) -> None:
        """Attach caching-allocator statistics read after token ``seq``."""
        with self._lock:
            for row in reversed(self._win_rows):
                if row.seq == seq:
                    row.alloc = stats
                    if seq < self._dirty_seq:
                        self._dirty_seq = seq
                    return

    def ingest(self, kind: str, payload: Any) -> None:
        """The one entry through which collectors hand their output to the store.

        ``RECORDS``: CUPTI record tuples (``store.records``), attributed to steps and folded
        into the aggregates. Any other kind is a sampled series: ``payload`` is one sample, a
        dict with ``ts_ns`` on the session clock, kept in a ring of ``series_len`` samples
        (``nvml_len`` for NVML), readable as ``view.series[kind]`` (``view.nvml``), mirrored to
        a UI in another process and written to snapshots."""
        if kind == RECORDS:
            self.add_records(payload)
            return
        ring = self._series.get(kind)
        if ring is None:
            with self._lock:
                ring = self._series.setdefault(kind, deque(maxlen=self.series_len))
        ring.append(payload)  # deque.append is atomic

    def note_dropped(self, n: int) -> None:
        if n:
            with self._lock:
                self._counters["dropped"] += n

    def set_collector(self, name: str, ok: bool, message: str = "") -> None:
        """Record a collector's state, e.g. ``("cupti", False, "no CUPTI: ...")``."""
        message = safe_text(message, 400)  # exception text from libraries, a file's words
        with self._lock:
            self._collectors[name] = {"ok": ok, "message": message}

    def add_event(self, kind: str, text: str, ts_ns: int | None = None) -> None:
        """A discrete event on the timeline: mode switch, error, pause."""
        with self._lock:
            self._events.append((self._seq, ts_ns or time.time_ns(), kind, text))

    def set_overhead(self, **values: Any) -> None:
        with self._lock:
            self.overhead.update(values)

    @property
    def output_len(self) -> int:
        """Lines of program output the ring keeps."""
        return self._output.maxlen or 0

    def add_output(self, lines: Iterable[str], skipped: int = 0) -> None:
        """Append lines a profiled program printed (already sanitised); the oldest drop out.
        ``skipped``: older lines of the same burst that were not even passed (counted only)."""
        lines = list(lines)
        with self._lock:
            self._output.extend(lines)
            self._output_count += len(lines) + skipped

    def _counters_copy(self) -> dict:
        c = dict(self._counters)
        if self._output_count:
            c["output_lines"] = self._output_count
        return c

    # ---------------------------------------------------------------- readers
    def changes(self, since: ViewCursor | None = None, raw_tokens: int | None = 0,
                light: bool = True, mirror: Any = None) -> tuple[dict, ViewCursor]:
        """What changed since ``since``, for one mirror of this store in another process.

        Returns ``(delta, cursor)``; :class:`tuiprof.sessions.mirror.Mirror` applies deltas. Only
        new or changed token rows, new NVML samples and, when records arrived, the record
        aggregates are copied, so the cost to the producers' process stays small however long
        the session is. ``raw_tokens``: raw records of the last N traced tokens (None: every
        token of the ring, 0: none). ``light``: statistics without their median histograms
        (enough to display; exports ask for ``light=False``). ``mirror``: which mirror asks
        (any hashable key; each has its own changed-row mark, see :meth:`forget_mirror`).
        Every configuration is sent (``parts``: key -> ConfigData).
        """
        with self._lock:
            full = since is None or since.generation != self._generation
            if full:
                since = ViewCursor()
            floor = min(since.token_seq + 1, self._mirror_floor(mirror, full))
            rows = []
            for row in reversed(self._tokens):
                if row.seq < floor and row.done:
                    break
                rows.append(copy_row(row))
            rows.reverse()
            seen = dict(since.series)
            series = {}
            for kind, ring in self._series.items():
                new = []
                last = seen.get(kind, -1)
                for smp in reversed(ring):
                    if smp.get("ts_ns", 0) <= last:
                        break
                    new.append(smp)
                new.reverse()
                series[kind] = new
            records = self._counters["records"]
            ev = (len(self._events), self._events[-1] if self._events else None)
            new_out = min(len(self._output), self._output_count - max(0, since.output))
            send_records = full or records != since.records or not light
            delta = {
                "full": full, "generation": self._generation, "series_len": self.series_len,
                "meta": dict(self.meta), "tokens": rows, "series": series,
                "counters": self._counters_copy(),
                "collectors": {k: dict(v) for k, v in self._collectors.items()},
                "config": self._config,
                "parts": {k: p.copy(light, records=send_records) for k, p in self._parts.items()},
                "records": send_records,
                "overhead": dict(self.overhead),
                "events": list(self._events) if (full or ev != since.events) else None,
                "raw": None,
                "output": list(islice(self._output, len(self._output) - new_out, None)),
            }
            held = since.raw if not full else ()
            if raw_tokens != 0:
                delta["raw"], held = _raw_changes(self._raw, raw_tokens, dict(held),
                                                  self._kept)
            for kind, new in series.items():
                if new:
                    seen[kind] = new[-1].get("ts_ns", 0)
            top = self._tokens[-1].seq if self._tokens else since.token_seq
            rsince = since.requests if not full else (-1, -1)
            delta["requests"], *rnow = self.requests.changes(*rsince, light=light)
            delta["fleet"] = self._fleet_copy()
            return delta, ViewCursor(self._generation, max(top, since.token_seq),
                                     tuple(seen.items()), records, ev, self._output_count, held,
                                     tuple(rnow))

    MAX_MIRRORS = 256

    def _mirror_floor(self, mirror: Any, full: bool) -> int:
        """The lowest row seq changed since ``mirror``'s last delta (lock held). The store's
        own mark is folded into every known mirror's; a mirror the store no longer knows
        (forgotten, or evicted past :data:`MAX_MIRRORS`) gets every row again."""
        inf = 1 << 62
        d, self._dirty_seq = self._dirty_seq, inf
        marks = self._mirror_dirty
        if d < inf:
            for k, v in marks.items():
                if d < v:
                    marks[k] = d
        own = marks.pop(mirror, None)
        if own is None:
            own = inf if full else 0
        marks[mirror] = inf
        while len(marks) > self.MAX_MIRRORS:
            marks.popitem(last=False)
        return min(own, d)

    def forget_mirror(self, mirror: Any) -> None:
        """A mirror is gone (its connection closed): stop keeping its changed-row mark."""
        with self._lock:
            self._mirror_dirty.pop(mirror, None)

    def view(self, raw: bool = True, raw_tokens: int | None = None, batch: Any = None,
             light_others: bool | None = None) -> StoreView:
        """A consistent copy for readers; cheap enough for a few calls a second.

        ``raw_tokens``: the raw records of the last N traced tokens, kept ones included (see
        :data:`KEPT_TRACED`; None: every token of the ring).
        ``batch``: the configuration to view (default: the latest step's). The other
        configurations come along in ``view.configs``, without their median histograms unless
        ``light_others`` is False (default: full copies only for a whole export, ``raw=True``
        with every raw token)."""
        if light_others is None:
            light_others = not (raw and raw_tokens is None)
        with self._lock:
            key = self._config if batch is None else batch
            parts = {k: p.copy(light=light_others and k != key) for k, p in self._parts.items()}
            return compose_view(
                dict(self.meta), list(self._tokens), parts, key,
                raw=_raw_tail(self._raw, raw_tokens, self._kept) if raw else [],
                nvml=list(self._nvml),
                counters=self._counters_copy(),
                collectors={k: dict(v) for k, v in self._collectors.items()},
                events=list(self._events), overhead=dict(self.overhead),
                output=list(self._output),
                series={k: list(v) for k, v in self._series.items() if k != NVML},
                requests=self.requests.view(), fleet=self._fleet_copy())


def _token_stats(part: ConfigData, row: TokenRow) -> dict:
    ts = part.token_stats.get((row.phase, row.mode))
    if ts is None:
        ts = part.token_stats[(row.phase, row.mode)] = {k: RunningStats() for k in TOKEN_STATS}
    return ts


def _tracing_side(row: TokenRow) -> str | None:
    """``"untraced"``: the step ran with CUPTI detached or absent (the reference for what
    tracing costs); ``"traced"``: its kernels were traced; None: neither (CUPTI attached around
    a burst without tracing it, or not known)."""
    if row.attached is False:
        return "untraced"
    if row.attached and row.sampled:
        return "traced"
    return None


_SIDE_HOST = {"untraced": "untraced_ms", "traced": "traced_step_ms"}


def _add_stat(ts: dict, name: str, value: float) -> None:
    s = ts.get(name)
    if s is None:  # token statistics read from a snapshot written before this one existed
        s = ts[name] = RunningStats()
    s.add(value)


def _traced(recs: list) -> bool:
    """Whether a token's records hold device activity (a kernel, copy or memset): it was
    traced; API and memory records alone come on untraced tokens too."""
    for r in recs:
        k = r[KIND]
        if k == KERNEL or k == MEMCPY or k == MEMSET:
            return True
    return False


def _raw_entries(ring: deque, n: int | None, kept: Iterable = ()) -> list:
    """The last ``n`` traced (seq, records) entries of the ring and, before them, of the traced
    entries kept after they left it (``kept``), not copied; every entry of the ring when ``n``
    is None (the recorded window)."""
    if n is None:
        return list(ring)
    out = []
    for s, r in reversed(ring):
        if len(out) >= n:
            break
        if r and _traced(r):
            out.append((s, r))
    if len(out) < n:
        for s, r in reversed(kept):
            if len(out) >= n:
                break
            out.append((s, r))
    out.reverse()
    return out


def _raw_tail(ring: deque, n: int | None, kept: Iterable = ()) -> list:
    """Copies of :func:`_raw_entries`."""
    return [(s, list(r)) for s, r in _raw_entries(ring, n, kept)]


def _raw_changes(ring: deque, n: int | None, held: dict[int, int],
                 kept: Iterable = ()) -> tuple[dict, tuple]:
    """The raw records a mirror lacks among the last ``n`` traced entries (every ring entry
    when ``n`` is None), given what it holds (seq -> record count).

    A token's raw list only grows (records arrive after the token ended), so only its new
    tail is sent: ``{"keep": [seq, ...], "add": [(seq, start, records), ...]}``. Findings pull
    the last 16 traced tokens every 2 s; resending them whole cost the session process ~6 MB
    of pickling under the GIL each time (an eager burst is ~4,000 records a token)."""
    keep, add, now = [], [], []
    for seq, recs in _raw_entries(ring, n, kept):
        count = len(recs)
        have = held.get(seq, 0)
        if have > count:
            have = 0
        if count > have:
            add.append((seq, have, recs[have:count]))
        keep.append(seq)
        now.append((seq, count))
    return {"keep": keep, "add": add}, tuple(now)
