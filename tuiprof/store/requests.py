"""Requests: a record kind of the store beside the steps (one row per request a server served).

A request is told to the store by a producer (transformers' continuous batching, the
``tuiprof.request_*`` API, a plain ``generate()``; ``tuiprof/program/``) in three calls:
arrived, tokens (each token's time), finished. The step that advances it tells which requests
it took, and which of them were prefilling (:meth:`RequestBook.step`). From these the row keeps
its timeline: arrival, the engine's queue, its first step, first token, every token, finish.

Bounded: the last ``keep`` finished requests are kept whole, with every token's time (at most
``MAX_TOKEN_TIMES`` per request); every finished request, kept or not, is folded into running
aggregates (:class:`~tuiprof.store.stats.RunningStats` of TTFT, ITL, queue wait, end-to-end
latency and time outside model steps). Requests in flight are capped at ``max_in_flight``
(a server that never finishes its requests must not grow the store: the oldest are dropped and
counted). A program's mistakes (an unknown id, a request finished twice, tokens after finish)
are counted, reported once each as an event, and never raise into the program.

Thread-safety: one lock of its own, never the store's (a CUPTI fold must not hold up a
server's request bookkeeping). Every change moves ``rev`` on, so a mirror in another process
asks only for the rows that changed (:meth:`RequestBook.changes`).
"""
from __future__ import annotations

import copy
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Callable

from ..errors import one_line
from .stats import REQUEST_EDGES_MS, Buckets, RunningStats

QUEUED, PREFILL, DECODE, FINISHED, FAILED = "queued", "prefill", "decode", "finished", "failed"
DONE_STATES = frozenset({FINISHED, FAILED, "cancelled"})
MAX_TOKEN_TIMES = 8192     # token times kept per request (the rest are counted)
MAX_STEPS = 8192           # step numbers kept per request
STEP_INTERVALS = 65536     # recent model steps (start, end) kept to split a request's time
LATE_ROWS = 1024           # finished requests seen from outside whose steps may still come
LATE_NS = 5_000_000_000    # how long they wait for them (a native program's steps come from
                           # its kernel stream, a CUPTI buffer or more behind its requests)
OUTSIDE_SOURCES = frozenset({"proxy"})   # producers that see requests from outside the engine
GONE_IDS = 1024            # ids of finished requests remembered (to tell a second finish)
STAT_NAMES = ("ttft_ms", "itl_ms", "queue_ms", "e2e_ms", "outside_ms", "prompt_tokens",
              "output_tokens")
# the latencies a metrics scraper reads as cumulative histograms (fixed buckets, never reset)
BUCKET_NAMES = ("ttft_ms", "itl_ms", "queue_ms", "e2e_ms", "outside_ms")
TRACEPARENT_LEN = 55    # a W3C traceparent of version 00: 2-32-16-2 hex digits and 3 dashes
MISUSE = {
    "unknown_id": "tokens or finish for a request that never arrived",
    "finished_twice": "a request finished twice",
    "token_after_finish": "tokens for a request that had finished",
    "arrived_twice": "a request arrived twice while in flight",
    "bad_id": "a request id that is not hashable",
    "dropped_in_flight": "requests in flight dropped: more than the store keeps",
}


_BAD = object()   # an id that cannot be a key (unhashable): said once, nothing recorded


@dataclass(slots=True)
class RequestRow:
    """Everything known about one request. Times are on the session clock (ns)."""

    id: Any
    source: str
    arrival_ns: int
    queued_ns: int = 0          # entered the engine's queue (after tokenisation); 0: unknown
    # the server's app saw it (an HTTP server: its ASGI app's entry), where ``arrival_ns`` is
    # when the HTTP server first had its bytes; 0: unknown or the same
    app_ns: int = 0
    # the HTTP server's event loop read its first bytes, where ``arrival_ns`` is earlier: when
    # the kernel had them (they waited in its socket buffer for the loop); 0: unknown or the same
    read_ns: int = 0
    first_step_ns: int = 0      # start of the first model step that advanced it
    first_step_seq: int = -1
    first_token_ns: int = 0
    last_token_ns: int = 0
    finish_ns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: str = QUEUED
    reason: str = ""            # why it finished (length, stop, eos, error, ...)
    kv_blocks: int = 0          # KV-cache blocks it holds (the most seen)
    prefill_steps: int = 0      # steps that fed its prompt (more than one: a chunked prefill)
    decode_steps: int = 0       # steps that decoded a token for it
    shared: int = 0             # over its decode steps, the other requests in the step
    preemptions: int = 0        # times it was sent back to the queue after it had started
    model_ns: int = -1          # its life inside model steps (any request's), once finished
    warmup: bool = False        # a warm-up request: kept apart from the counts and statistics
    traceparent: str = ""       # the W3C trace context it arrived with (HTTP header), if any
    client_id: str = ""         # the id the client gave (an HTTP X-Request-Id), when known
    http_status: int = 0        # the HTTP status of its response (a proxy sees it; 0: unknown)
    tokens_from: str = ""       # "usage": the server's counts; "chunks": streamed chunks counted
    # an HTTP server seen from inside: when its app wrote the response's first bytes after the
    # first token was handed over, and its last bytes (what a client reads, less the socket);
    # 0: unknown
    wire_first_ns: int = 0
    wire_end_ns: int = 0
    token_ns: array = field(default_factory=lambda: array("q"))
    steps: array = field(default_factory=lambda: array("q"))
    rev: int = 0

    @property
    def done(self) -> bool:
        return self.status in DONE_STATES

    @property
    def in_socket_ms(self) -> float | None:
        """From the kernel's receipt of its first bytes to the HTTP server's event loop reading
        them (they waited in the socket buffer while the loop was busy), or None where not
        known or none."""
        return (self.read_ns - self.arrival_ns) / 1e6 if self.read_ns else None

    @property
    def before_app_ms(self) -> float | None:
        """From the HTTP server's read of its first bytes to its app's entry (parsing, the event
        loop's queue), or None where not known."""
        return (self.app_ns - (self.read_ns or self.arrival_ns)) / 1e6 if self.app_ns else None

    @property
    def after_engine_ms(self) -> float | None:
        """From the engine handing over its first token to the server writing it (detokenising,
        the event stream, the HTTP server's event loop), or None where not known."""
        if not (self.wire_first_ns and self.first_token_ns):
            return None
        return (self.wire_first_ns - self.first_token_ns) / 1e6

    @property
    def outside(self) -> bool:
        """Seen from outside the engine (a proxy): no queue, no step said it advanced it."""
        return self.source in OUTSIDE_SOURCES

    @property
    def queue_ms(self) -> float | None:
        """Arrival to the start of its first model step."""
        return (self.first_step_ns - self.arrival_ns) / 1e6 if self.first_step_ns else None

    @property
    def ttft_ms(self) -> float | None:
        return (self.first_token_ns - self.arrival_ns) / 1e6 if self.first_token_ns else None

    @property
    def e2e_ms(self) -> float | None:
        return (self.finish_ns - self.arrival_ns) / 1e6 if self.finish_ns else None

    def itls_ms(self) -> list[float]:
        """Inter-token latencies: the gaps between its consecutive tokens."""
        t = self.token_ns
        return [(t[i] - t[i - 1]) / 1e6 for i in range(1, len(t))]

    def to_dict(self) -> dict:
        return {k: (list(getattr(self, k)) if k in ("token_ns", "steps") else getattr(self, k))
                for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class RequestsView:
    """The requests of a view: rows (the last finished ones whole, then those in flight, in
    order of arrival) and the aggregates over every request of the session."""

    rows: tuple = ()               # RequestRow, copies: treat as frozen
    stats: dict = field(default_factory=dict)     # STAT_NAMES -> RunningStats (finished ones)
    counts: dict = field(default_factory=dict)    # arrived, finished, failed, ... tokens
    misuse: dict = field(default_factory=dict)    # MISUSE kind -> count
    sources: dict = field(default_factory=dict)   # producer -> requests it reported
    keep: int = 0
    # for metrics scrapers, since the session began (never reset): BUCKET_NAMES -> Buckets of
    # finished requests, and totals (arrived, finished, failed, cancelled, preempted, tokens)
    buckets: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    warmup: tuple = ()             # warm-up requests (RequestRow): apart from rows and counts

    def __bool__(self) -> bool:
        return bool(self.rows) or bool(self.counts.get("arrived"))

    def get(self, rid: Any) -> RequestRow | None:
        for r in self.rows:
            if r.id == rid:
                return r
        return None

    @property
    def in_flight(self) -> list:
        return [r for r in self.rows if not r.done]

    @property
    def finished(self) -> list:
        return [r for r in self.rows if r.done]


EMPTY = RequestsView()


class RequestBook:
    """The store's requests (see the module doc). Producers call :meth:`arrived`,
    :meth:`tokens`, :meth:`finished`; the store calls :meth:`step` and :meth:`step_interval`.

    A request marked as a warm-up (:meth:`warmup`, before or after it arrives: a load
    generator's first request, served before the load starts) is kept whole but apart: it is
    in no count (``counts["warmup"]`` counts them), no total or bucket, no statistic, no
    source's tally and no window of the analysis, and the snapshot marks it (``warmup:
    true``)."""

    def __init__(self, keep: int = 1024, max_in_flight: int = 65536,
                 on_misuse: Callable[[str, str], None] | None = None) -> None:
        self.keep = keep
        self.max_in_flight = max_in_flight
        self.clock: Callable[[], int] = time.time_ns   # the session's clock, set by it
        self.on_misuse = on_misuse   # (kind, text): the first misuse of each kind
        # another process runs this one's model steps (vLLM's API server): a request's time
        # in and out of steps is not known here (-1), rather than all of it outside
        self.steps_elsewhere = False
        self._lock = threading.Lock()
        self._live: dict[Any, RequestRow] = {}
        self._steps_start: deque[int] = deque(maxlen=STEP_INTERVALS)
        self._steps_end: deque[int] = deque(maxlen=STEP_INTERVALS)
        self._steps_seq: deque[int] = deque(maxlen=STEP_INTERVALS)
        self._gone: OrderedDict[Any, None] = OrderedDict()
        self._rev = 0
        self._evicted = 0        # rows that left the kept set (a mirror then gets the id list)
        self.misuse: dict[str, int] = {}
        self.sources: dict[str, int] = {}
        self.lost: dict[str, int] = {}   # where tuiprof's own record of a request failed
        self._warm_ids: OrderedDict[Any, None] = OrderedDict()   # warm-ups yet to arrive
        self.buckets = {k: Buckets(REQUEST_EDGES_MS) for k in BUCKET_NAMES}
        self.totals = {"arrived": 0, "finished": 0, "failed": 0, "cancelled": 0,
                       "preempted": 0, "tokens": 0}
        self._reset_finished()

    def _reset_finished(self) -> None:
        self._done: OrderedDict[Any, RequestRow] = OrderedDict()
        # outside rows finished whose time outside the steps is not yet in the aggregates
        # (steps that ran in their interval may still come)
        self._late: deque[RequestRow] = deque()
        self.stats = {k: RunningStats() for k in STAT_NAMES}
        self.counts = {"arrived": 0, "finished": 0, "failed": 0, "cancelled": 0, "tokens": 0,
                       "preempted": 0, "warmup": 0}

    def reset(self) -> None:
        """Forget finished requests and the aggregates; requests in flight stay."""
        with self._lock:
            self._reset_finished()
            self.counts["arrived"] = sum(1 for r in self._live.values() if not r.warmup)
            self._evicted += 1
            self._rev += 1

    # --------------------------------------------------------------- producers
    def _live_row(self, rid: Any) -> Any:
        """(Lock held.) ``rid``'s row in flight, None when none, ``_BAD`` (said as a misuse)
        for an id that cannot be a key."""
        try:
            return self._live.get(rid)
        except TypeError:
            self._misuse("bad_id", rid)
            return _BAD

    def warmup(self, rid: Any) -> None:
        """Request ``rid`` is a warm-up: said before it arrives (then it is counted apart from
        its arrival on) or while it is in flight (taken out of the counts it was in)."""
        with self._lock:
            row = self._live_row(rid)
            if row is _BAD:
                return
            if row is None:
                self._warm_ids[rid] = None
                while len(self._warm_ids) > GONE_IDS:
                    self._warm_ids.popitem(last=False)
                return
            if not row.warmup:
                row.warmup = True
                for c in (self.counts, self.totals):
                    c["arrived"] -= 1
                    c["tokens"] -= row.output_tokens
                self.counts["warmup"] += 1
                self.sources[row.source] = self.sources.get(row.source, 1) - 1
                self._touch(row)

    def arrived(self, rid: Any, prompt_tokens: int = 0, source: str = "api",
                t: int | None = None, queued_t: int | None = None,
                traceparent: str | None = None, app_t: int | None = None,
                client_id: str = "", read_t: int | None = None) -> None:
        """Request ``rid`` arrived at ``t`` (default now) with ``prompt_tokens``; ``queued_t``:
        when it entered the engine's queue (after the server's own work: parsing,
        tokenisation), if the producer knows; ``traceparent``: the W3C trace context it came
        with (kept only when well formed); ``app_t``: when the server's app saw it, where
        ``t`` is earlier (an HTTP server's first bytes of it); ``client_id``: the id its
        client gave (an HTTP ``X-Request-Id``) when the server's own id differs; ``read_t``:
        when the HTTP server read its first bytes, where ``t`` is the kernel's earlier receipt
        of them."""
        if t is None:
            t = self.clock()
        prompt_tokens = int(prompt_tokens or 0)
        with self._lock:
            row = self._live_row(rid)
            if row is _BAD:
                return
            if row is not None:
                self._misuse("arrived_twice", rid)
                return
            if len(self._live) >= self.max_in_flight:
                old = next(iter(self._live))
                self._live.pop(old)
                self._misuse("dropped_in_flight", old)
                self._evicted += 1
            self._gone.pop(rid, None)
            row = RequestRow(rid, source, t, prompt_tokens=prompt_tokens)
            if queued_t is not None:
                row.queued_ns = queued_t
            if traceparent:
                row.traceparent = valid_traceparent(traceparent)
            if app_t is not None and app_t > t:
                row.app_ns = app_t
            if read_t is not None and read_t > t and (not row.app_ns or read_t <= row.app_ns):
                row.read_ns = read_t
            if client_id:
                row.client_id = str(client_id)
            self._live[rid] = row
            if self._warm_ids and self._warm_ids.pop(rid, False) is None:
                row.warmup = True
                self.counts["warmup"] += 1
            else:
                self.counts["arrived"] += 1
                self.totals["arrived"] += 1
                self.sources[source] = self.sources.get(source, 0) + 1
            self._touch(row)

    def tokens(self, rid: Any, n: int = 1, t: int | None = None) -> None:
        """``n`` output tokens of ``rid`` reached the host at ``t`` (default now)."""
        if t is None:
            t = self.clock()
        with self._lock:
            row = self._live_row(rid)
            if row is _BAD:
                return
            if row is None:
                self._misuse("token_after_finish" if rid in self._gone else "unknown_id", rid)
                return
            self._add_tokens(row, n, t)

    def advance(self, t: int, tokens: list, done: list = ()) -> None:
        """One step's outcome at ``t``, under one lock: ``tokens`` [(id, n), ...] new tokens,
        then ``done`` [(id, reason, status), ...] finished requests."""
        with self._lock:
            live = self._live
            for rid, n in tokens:
                row = live.get(rid)
                if row is not None:
                    self._add_tokens(row, n, t)
        for rid, reason, status in done:
            self.finished(rid, reason, t, status, quiet=True)

    def advance_group(self, ids: list, times: list) -> None:
        """Requests ``ids`` each got one token at each of ``times`` (a plain ``generate()``:
        every row of the batch advances together)."""
        with self._lock:
            live = self._live
            for rid in ids:
                row = live.get(rid)
                if row is None:
                    continue
                for t in times:
                    self._add_tokens(row, 1, t)

    def _add_tokens(self, row: RequestRow, n: int, t: int) -> None:
        if n <= 0:
            return
        # the hot path (every token of every request): plain attribute work under the lock
        if not row.first_token_ns:
            row.first_token_ns = t
        row.last_token_ns = t
        row.output_tokens += n
        row.status = DECODE
        times = row.token_ns
        if len(times) < MAX_TOKEN_TIMES:
            if n == 1:
                times.append(t)
            else:
                times.extend((t,) * min(n, MAX_TOKEN_TIMES - len(times)))
        if not row.warmup:
            self.counts["tokens"] += n
            self.totals["tokens"] += n
        self._rev = rev = self._rev + 1
        row.rev = rev

    def finished(self, rid: Any, reason: str = "", t: int | None = None,
                 status: str = FINISHED, output_tokens: int | None = None,
                 token_ns: list | None = None, quiet: bool = False,
                 prompt_tokens: int | None = None, http_status: int = 0,
                 tokens_from: str = "") -> None:
        """``rid`` is done at ``t`` (default now; ``status``: finished, failed or cancelled).
        ``output_tokens``/``token_ns``/``prompt_tokens``: what the producer knows only at the
        end (a plain ``generate()``: each row's length once the batch is done; a proxy: the
        server's usage). ``http_status``, ``tokens_from``: what a proxy saw (the row's fields).
        ``quiet``: a request that is not in flight is no misuse (a failure path may report one
        that had finished). A request seen from outside the engine learns here the model
        steps that ran while it was in flight (joined by time)."""
        if t is None:
            t = self.clock()
        with self._lock:
            try:
                row = self._live.pop(rid, None)
            except TypeError:
                self._misuse("bad_id", rid)
                return
            if row is None:
                if not quiet:
                    self._misuse("finished_twice" if rid in self._gone else "unknown_id", rid)
                return
            if token_ns is not None:
                row.token_ns = array("q", token_ns[:MAX_TOKEN_TIMES])
                row.first_token_ns = token_ns[0] if token_ns else 0
                row.last_token_ns = token_ns[-1] if token_ns else 0
            if output_tokens is not None:
                if not row.warmup:
                    self.counts["tokens"] += int(output_tokens) - row.output_tokens
                    self.totals["tokens"] += int(output_tokens) - row.output_tokens
                row.output_tokens = int(output_tokens)
            if prompt_tokens is not None:
                row.prompt_tokens = int(prompt_tokens)
            if http_status:
                row.http_status = int(http_status)
            if tokens_from:
                row.tokens_from = str(tokens_from)
            row.finish_ns = max(t, row.last_token_ns, row.arrival_ns)
            if row.outside and not row.steps:
                row.steps = self._steps_between(row.arrival_ns, row.finish_ns)
            row.status = status if status in DONE_STATES else FINISHED
            row.reason = str(reason or "")
            row.model_ns = self._inside(row.arrival_ns, row.finish_ns)
            late = row.outside and not row.warmup and row.model_ns >= 0
            if not row.warmup:
                self._fold(row, outside=not late)
            if late:
                self._late.append(row)
                self._release_late(t - LATE_NS)
            self._done[rid] = row
            self._gone[rid] = None
            if len(self._gone) > GONE_IDS:
                self._gone.popitem(last=False)
            while len(self._done) > self.keep:
                self._done.popitem(last=False)
                self._evicted += 1
            self._touch(row)

    def wire(self, rid: Any, first_t: int, end_t: int) -> None:
        """An HTTP server wrote ``rid``'s first token to its client at ``first_t`` and its
        response's last bytes at ``end_t`` (after the engine finished it, usually)."""
        with self._lock:
            try:
                row = self._live.get(rid) or self._done.get(rid)
            except TypeError:
                self._misuse("bad_id", rid)
                return
            if row is None:
                return      # evicted already, or never recorded: nothing to add to
            row.wire_first_ns = int(first_t or 0)
            row.wire_end_ns = int(end_t or 0)
            self._touch(row)

    def _fold(self, row: RequestRow, outside: bool = True) -> None:
        """Fold a finished row into the aggregates; ``outside``: its time outside the steps
        too (a row seen from outside the engine folds it once its steps are in: _release_late)."""
        key = {FINISHED: "finished", FAILED: "failed"}.get(row.status, "cancelled")
        self.counts[key] += 1
        self.totals[key] += 1
        st = self.stats
        if row.status != FINISHED:
            return
        bk = self.buckets
        arr = row.arrival_ns
        if row.first_step_ns:
            v = (row.first_step_ns - arr) / 1e6
            st["queue_ms"].add(v)
            bk["queue_ms"].add(v)
        if row.first_token_ns:
            v = (row.first_token_ns - arr) / 1e6
            st["ttft_ms"].add(v)
            bk["ttft_ms"].add(v)
        e2e = row.finish_ns - arr
        st["e2e_ms"].add(e2e / 1e6)
        bk["e2e_ms"].add(e2e / 1e6)
        if outside:
            self._fold_outside(row, st, bk)
        itl = row.itls_ms()
        if itl:
            st["itl_ms"].add_many(itl)
            bk["itl_ms"].add_many(itl)
        st["prompt_tokens"].add(row.prompt_tokens)
        st["output_tokens"].add(row.output_tokens)

    @staticmethod
    def _fold_outside(row: RequestRow, st: dict, bk: dict) -> None:
        if row.status == FINISHED and row.model_ns >= 0:
            v = max(0, row.finish_ns - row.arrival_ns - row.model_ns) / 1e6
            st["outside_ms"].add(v)
            bk["outside_ms"].add(v)

    def _release_late(self, until_ns: int) -> None:
        """(Lock held.) Fold the outside rows that finished before ``until_ns`` (the steps of
        their interval are in) and those past ``LATE_ROWS``."""
        late = self._late
        while late and (late[0].finish_ns <= until_ns or len(late) > LATE_ROWS):
            self._fold_outside(late.popleft(), self.stats, self.buckets)

    def steps_until(self, t_ns: int) -> None:
        """The step source has given every step that began before ``t_ns`` (a time window with
        no step, from a program's stream): requests seen from outside that finished before it
        have all their steps."""
        with self._lock:
            self._release_late(t_ns)

    def step(self, seq: int, start_ns: int, prefill: tuple = (), decode: tuple = (),
             blocks: dict | None = None) -> None:
        """Model step ``seq`` (begun at ``start_ns``) advanced ``prefill`` (requests feeding
        their prompt) and ``decode`` (requests getting a token). ``blocks``: id -> KV-cache
        blocks held. A request that had tokens and prefills again was preempted (sent back to
        its prompt: its KV cache was given to others)."""
        n = len(prefill) + len(decode)
        with self._lock:
            live = self._live
            for group, is_prefill in ((prefill, True), (decode, False)):
                for rid in group:
                    row = live.get(rid)
                    if row is None:
                        continue
                    if not row.first_step_ns:
                        row.first_step_ns, row.first_step_seq = start_ns, seq
                    if is_prefill:
                        row.prefill_steps += 1
                        if row.status == DECODE:  # it had tokens: sent back to its prompt
                            row.preemptions += 1
                            if not row.warmup:
                                self.counts["preempted"] += 1
                                self.totals["preempted"] += 1
                        row.status = PREFILL
                    else:
                        row.decode_steps += 1
                        row.shared += n - 1
                    if len(row.steps) < MAX_STEPS:
                        row.steps.append(seq)
                    if blocks:
                        b = blocks.get(rid)
                        if b is not None and b > row.kv_blocks:
                            row.kv_blocks = b
                    self._touch(row)

    def step_interval(self, start_ns: int, end_ns: int, seq: int = -1) -> None:
        """Model step ``seq`` ran from ``start_ns`` to ``end_ns`` (steps do not overlap)."""
        end_ns = max(start_ns, end_ns)
        with self._lock:
            self._steps_start.append(start_ns)
            self._steps_end.append(end_ns)
            self._steps_seq.append(seq)
            # requests seen from outside that finished before this step reached the store (a
            # native program's steps come from its kernel stream, behind its requests) learn
            # it now: the steps that ran while they were in flight, by time
            for row in self._late:
                if row.arrival_ns < end_ns and start_ns < row.finish_ns:
                    if seq >= 0 and len(row.steps) < MAX_STEPS:
                        row.steps.append(seq)
                    row.model_ns += min(end_ns, row.finish_ns) - max(start_ns, row.arrival_ns)
                    self._touch(row)
            if self._late:
                self._release_late(start_ns)

    def _steps_between(self, t0: int, t1: int) -> array:
        """The numbers of the recent model steps that ran during [t0, t1] (at most
        ``MAX_STEPS``, the latest): a request seen from outside the engine is joined to the
        steps by time, not by what the engine says it advanced."""
        starts, ends, seqs = self._steps_start, self._steps_end, self._steps_seq
        i = bisect_right(ends, t0)
        j = bisect_left(starts, t1)
        return array("q", (s for s in islice(seqs, max(i, j - MAX_STEPS), max(i, j)) if s >= 0))

    def _inside(self, t0: int, t1: int) -> int:
        """Time in [t0, t1] covered by the recent model steps (-1: steps this old are gone)."""
        starts, ends = self._steps_start, self._steps_end
        if self.steps_elsewhere:
            return -1
        if not starts:
            return 0
        if t0 < starts[0] and len(starts) == starts.maxlen:
            return -1
        i = max(0, bisect_right(ends, t0))
        j = bisect_left(starts, t1)
        total = 0
        for k in range(i, j):
            total += max(0, min(ends[k], t1) - max(starts[k], t0))
        return total

    def _touch(self, row: RequestRow) -> None:
        self._rev += 1
        row.rev = self._rev

    def record_failed(self, where: str, exc: BaseException) -> None:
        """tuiprof's own record of a request failed at ``where`` (an object of the server's or
        of ``generate()``'s that it could not read). The program goes on, never disturbed; the
        first failure at each place becomes one event, so that missing requests are never
        silent, and every one is counted (``where`` is one of tuiprof's few hook names)."""
        with self._lock:
            n = self.lost[where] = self.lost.get(where, 0) + 1
        if n == 1 and self.on_misuse is not None:
            try:
                self.on_misuse("lost", f"requests: could not record {where} "
                                       f"({type(exc).__name__}: {one_line(exc, 120)}); the "
                                       "program goes on, its requests there may be missing")
            except Exception:
                pass

    def _misuse(self, kind: str, rid: Any) -> None:
        n = self.misuse.get(kind, 0) + 1
        self.misuse[kind] = n
        if n == 1 and self.on_misuse is not None:
            try:
                self.on_misuse(kind, f"{MISUSE[kind]} (first: id {rid!r}); counted, "
                                     "never raised")
            except Exception:
                pass

    # ----------------------------------------------------------------- readers
    def view(self) -> RequestsView:
        """A copy for readers."""
        with self._lock:
            rows = [_copy(r) for r in self._done.values()]
            rows += [_copy(r) for r in self._live.values()]
            stats = {k: s.copy() for k, s in self.stats.items()}
            buckets = self._buckets_copy()
            for r in self._late:   # whole in a copy: their steps so far
                self._fold_outside(r, stats, buckets)
            return RequestsView(tuple(r for r in rows if not r.warmup), stats,
                                dict(self.counts), dict(self.misuse), dict(self.sources),
                                self.keep, buckets, dict(self.totals),
                                tuple(r for r in rows if r.warmup))

    def _buckets_copy(self) -> dict:
        return {k: b.copy() for k, b in self.buckets.items()}

    @property
    def rev(self) -> int:
        return self._rev

    def changes(self, since_rev: int, since_evicted: int, light: bool = True
                ) -> tuple[dict | None, int, int]:
        """What a mirror lacks: ``(delta or None, rev, evicted)``. ``delta["rows"]``: copies of
        the rows changed since ``since_rev``; ``delta["ids"]``: every kept id in order, sent
        only when rows left the kept set since ``since_evicted``."""
        with self._lock:
            if self._late:   # a server gone idle: no step or finish comes to release them
                n = len(self._late)
                self._release_late(self.clock() - LATE_NS)
                if len(self._late) != n:
                    self._rev += 1
            if since_rev == self._rev and since_evicted == self._evicted:
                return None, self._rev, self._evicted
            rows = [_copy(r) for r in self._done.values() if r.rev > since_rev]
            rows += [_copy(r) for r in self._live.values() if r.rev > since_rev]
            cp = RunningStats.light_copy if light else RunningStats.copy
            delta = {"rows": rows, "stats": {k: cp(s) for k, s in self.stats.items()},
                     "counts": dict(self.counts), "misuse": dict(self.misuse),
                     "sources": dict(self.sources), "keep": self.keep,
                     "buckets": self._buckets_copy(), "totals": dict(self.totals),
                     "ids": (list(self._done) + list(self._live)
                             if since_evicted != self._evicted else None)}
            return delta, self._rev, self._evicted


def _copy(row: RequestRow) -> RequestRow:
    c = copy.copy(row)
    c.token_ns = array("q", row.token_ns)
    c.steps = array("q", row.steps)
    return c


_HEX = frozenset("0123456789abcdef")


def valid_traceparent(text: Any) -> str:
    """``text`` if it is a W3C ``traceparent`` a trace can join (version 00, a trace id and
    a parent id not all zeros, lower-case hex), else "": a header is the client's words."""
    if not isinstance(text, str) or len(text) != TRACEPARENT_LEN:
        return ""
    parts = text.split("-")
    if [len(p) for p in parts] != [2, 32, 16, 2] or parts[0] != "00":
        return ""
    if not all(c in _HEX for p in parts for c in p):
        return ""
    if set(parts[1]) == {"0"} or set(parts[2]) == {"0"}:
        return ""
    return text
