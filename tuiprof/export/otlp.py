"""``--otlp URL``: a span per request and sampled step spans, sent to an OpenTelemetry
collector over OTLP/HTTP (``opentelemetry-sdk`` and its HTTP exporter: the ``fleet`` extra).

The process that holds the session polls every process's view once a second (on a thread of
its own) and turns what is new into spans:

* each finished request: a span ``request`` from its arrival to its finish, children
  ``queued`` (arrival to its first model step), ``prefill`` (to its first token) and
  ``decode`` (to its finish), with what its story shows (steps shared, time outside model
  steps, preemptions, tokens); a request that arrived with a W3C ``traceparent`` header is a
  child of that context, so it joins the caller's trace;
* traced steps, at most ``STEP_SPANS_PER_POLL`` a poll per process: a span ``step`` with its
  kernel summary (kernels, kernel and busy time, the model's and the loop's, the top
  categories when its records are at hand).

One tracer provider per process, whose resource says host, pid, role, rank, GPU, model and
tuiprof's version. Spans go through a ``BatchSpanProcessor`` whose queue is bounded
(``MAX_QUEUE``): a collector that is slow or gone never blocks anything, the spans that do not
fit are dropped and counted, shown on the status line and in the snapshot's
``meta["feeds"]["otlp"]``. Times are the session clock's, nanoseconds since the epoch.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlparse

from ..errors import TuiprofError
from .feeds import Source, need, process_labels

FLAG = "--otlp"
POLL_S = 1.0
MAX_QUEUE = 2048            # spans waiting for the exporter; more are dropped and counted
MAX_BATCH = 512
EXPORT_TIMEOUT_S = 5.0
CLOSE_WAIT_S = EXPORT_TIMEOUT_S + 1.0   # the most the session's end waits for the last spans
STEP_SPANS_PER_POLL = 4     # traced steps sent a poll, per process
RAW_STEPS = 4               # raw records asked for, to name a step span's kernel categories
MAX_PROVIDERS = 64          # processes with a tracer (the oldest is shut down past this)
SEEN_IDS = 8192             # request ids already sent, per process


def check(value: str) -> str:
    """In the terminal: the packages are there and the URL is http(s)://HOST:PORT[/path]."""
    need("opentelemetry.sdk.trace", FLAG)
    need("opentelemetry.exporter.otlp.proto.http.trace_exporter", FLAG)
    u = urlparse(value)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise TuiprofError(f"{FLAG} {value}: give the collector's OTLP/HTTP address, e.g. "
                           f"http://127.0.0.1:4318")
    try:
        u.port
    except ValueError:
        raise TuiprofError(f"{FLAG} {value}: the port is not a number") from None
    path = u.path.rstrip("/")
    if not path.endswith("/v1/traces"):
        path += "/v1/traces"
    return u._replace(path=path).geturl()


class _Counting:
    """The exporter under the batch processor: counts what it took and what failed."""

    def __init__(self, inner: Any, gate: "_Gate") -> None:
        self.inner, self.gate = inner, gate

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: PLC0415

        n = len(spans)
        g = self.gate
        with g.lock:
            g.taken += n
        try:
            result = self.inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        with g.lock:
            if result == SpanExportResult.SUCCESS:
                g.exported += n
            else:
                g.failed += n
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class _Gate:
    """In front of the ``BatchSpanProcessor``: a span goes in only while fewer than
    ``max_queue`` wait for the exporter (counted from what went in and what the exporter took,
    never fewer than the processor's own queue holds), else it is dropped here and counted,
    so every drop is known exactly and the processor's queue never overflows."""

    def __init__(self, processor: Any, max_queue: int, lock: Any) -> None:
        self.processor, self.max_queue, self.lock = processor, max_queue, lock
        self.handed = self.dropped = self.taken = self.exported = self.failed = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: Any) -> None:
        with self.lock:
            self.handed += 1
            if self.handed - 1 - self.dropped - self.taken >= self.max_queue:
                self.dropped += 1
                return
        self.processor.on_end(span)

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        self.processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.processor.force_flush(timeout_millis)

    def counts(self) -> dict:
        with self.lock:
            return {"spans": self.handed, "dropped": self.dropped, "taken": self.taken,
                    "exported": self.exported, "failed": self.failed}


class _Tracer:
    """One process's provider, tracer and what of it has been sent."""

    def __init__(self, feed: "OtlpFeed", resource: dict) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter)
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        from .. import __version__  # noqa: PLC0415

        self.provider = TracerProvider(resource=Resource.create(resource))
        self.gate = _Gate(None, feed.max_queue, threading.Lock())
        exporter = _Counting(OTLPSpanExporter(endpoint=feed.url, timeout=EXPORT_TIMEOUT_S),
                             self.gate)
        # the queue one larger than the gate lets in: a span the exporter popped but has not
        # counted yet still leaves room, so the processor itself never drops one
        self.gate.processor = BatchSpanProcessor(
            exporter, max_queue_size=feed.max_queue + MAX_BATCH,
            max_export_batch_size=min(MAX_BATCH, feed.max_queue), schedule_delay_millis=500)
        self.provider.add_span_processor(self.gate)
        self.tracer = self.provider.get_tracer("tuiprof", __version__)
        self.seen: OrderedDict = OrderedDict()
        self.finished_seen = -1      # the book's finished + failed + cancelled at the last poll
        self.step_seq = -1           # the newest step sent


class OtlpFeed:
    """The running feed (see the module doc)."""

    def __init__(self, url: str, source: Source, poll_s: float = POLL_S,
                 max_queue: int = MAX_QUEUE) -> None:
        need("opentelemetry.sdk.trace", FLAG)
        self.url, self.source, self.poll_s, self.max_queue = url, source, poll_s, max_queue
        self.lock = threading.Lock()
        self._retired = {"spans": 0, "dropped": 0, "taken": 0, "exported": 0, "failed": 0}
        self.requests = self.steps = self.missed = self.errors = 0
        self.last_error = ""
        self._tracers: OrderedDict[tuple, _Tracer] = OrderedDict()
        self._stop = threading.Event()
        self._said_drop = False
        self._thread = threading.Thread(target=self._run, name="tuiprof-otlp", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ life
    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """Turn what is new in every process into spans (the poll thread; tests call it)."""
        try:
            views = self.source.views(RAW_STEPS)
        except Exception:   # a session going away: the next poll sees what is left
            return
        for view in views:
            try:
                self._one(view)
            except Exception as exc:   # counted and said in stats; the session goes on
                from ..errors import one_line  # noqa: PLC0415
                with self.lock:
                    self.errors += 1
                    self.last_error = one_line(exc, 200)
        self._say_drops()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()      # what finished since the last poll
        # flush what is queued, every process's at once, and wait no longer than one export's
        # timeout: a collector that is gone must not hold up the session's end (what was not
        # sent stays counted as queued)
        threads = [threading.Thread(target=_shutdown, args=(t,), daemon=True,
                                    name="tuiprof-otlp-flush")
                   for t in list(self._tracers.values())]
        for th in threads:
            th.start()
        end = time.monotonic() + CLOSE_WAIT_S
        for th in threads:
            th.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ figures
    def _counts(self) -> dict:
        c = dict(self._retired)
        for t in list(self._tracers.values()):
            for k, v in t.gate.counts().items():
                c[k] += v
        return c

    def stats(self) -> dict:
        c = self._counts()
        with self.lock:
            # not sent yet: waiting in the queue, or in an export that has not answered
            queued = max(0, c["spans"] - c["dropped"] - c["exported"] - c["failed"])
            return {"url": self.url, "requests": self.requests, "steps": self.steps,
                    "spans": c["spans"], "exported": c["exported"], "failed": c["failed"],
                    "dropped": c["dropped"], "queued": queued, "missed_requests": self.missed,
                    "max_queue": self.max_queue, "errors": self.errors,
                    "last_error": self.last_error}

    def metric_values(self) -> dict:
        s = self.stats()
        return {"otlp_spans_exported": ("counter", "spans the OTLP collector accepted",
                                        s["exported"]),
                "otlp_spans_dropped": ("counter", "spans dropped: the export queue was full",
                                       s["dropped"]),
                "otlp_spans_failed": ("counter", "spans the collector did not accept",
                                      s["failed"])}

    def notice(self) -> str | None:
        s = self.stats()
        if s["dropped"] or s["failed"]:
            return (f"otlp: {s['dropped']} spans dropped (queue of {self.max_queue} full), "
                    f"{s['failed']} not accepted by {self.url}")
        return None

    def _say_drops(self) -> None:
        line = self.notice()
        if line and not self._said_drop and self.source.notice is not None:
            self._said_drop = True
            try:
                self.source.notice(line)
            except Exception:
                pass

    # ------------------------------------------------------------------ spans
    def _tracer(self, view: Any) -> _Tracer:
        labels = process_labels(view, self.source.host)
        key = (labels["pid"], labels["rank"], labels["role"])
        t = self._tracers.get(key)
        if t is None:
            from .. import __version__  # noqa: PLC0415

            meta = view.meta or {}
            res = {"service.name": "tuiprof", "host.name": labels["host"],
                   "process.pid": int(labels["pid"]) if labels["pid"].isdigit() else 0,
                   "tuiprof.role": labels["role"], "tuiprof.rank": labels["rank"],
                   "tuiprof.gpu": labels["gpu"], "tuiprof.model": str(meta.get("model") or ""),
                   "tuiprof.version": __version__}
            t = self._tracers[key] = _Tracer(self, res)
            while len(self._tracers) > MAX_PROVIDERS:
                _, old = self._tracers.popitem(last=False)
                try:
                    old.provider.shutdown()
                except Exception:
                    pass
                for k, v in old.gate.counts().items():
                    self._retired[k] += v
        return t

    def _end(self, t: _Tracer, span: Any, end_ns: int) -> None:
        """End ``span``: its gate queues it, or drops it (counted) when the queue is full."""
        span.end(end_time=end_ns)

    def _one(self, view: Any) -> None:
        req = view.requests
        if not req and not view.tokens:
            return
        t = self._tracer(view)
        if req:
            done = [r for r in req.rows if r.done and r.id not in t.seen]
            total = sum((req.totals or req.counts).get(k, 0)
                        for k in ("finished", "failed", "cancelled"))
            if t.finished_seen >= 0:
                new = total - t.finished_seen
                if new > len(done):    # finished and gone from the kept rows between polls
                    with self.lock:
                        self.missed += new - len(done)
            t.finished_seen = total
            for r in sorted(done, key=lambda r: r.finish_ns):
                self._request_span(t, r)
                t.seen[r.id] = None
                if len(t.seen) > SEEN_IDS:
                    t.seen.popitem(last=False)
        rows = [r for r in view.tokens if r.done and r.sampled and r.kernels and not r.apart
                and r.seq > t.step_seq]
        if rows:
            raw = dict(view.raw or ())
            for r in rows[-STEP_SPANS_PER_POLL:]:
                self._step_span(t, r, raw.get(r.seq))
            t.step_seq = rows[-1].seq

    def _request_span(self, t: _Tracer, r: Any) -> None:
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
            TraceContextTextMapPropagator)

        parent = None
        if r.traceparent:
            parent = TraceContextTextMapPropagator().extract({"traceparent": r.traceparent})
        e2e = max(0, r.finish_ns - r.arrival_ns)
        outside = max(0, e2e - r.model_ns) if r.model_ns is not None and r.model_ns >= 0 else None
        attrs = {"tuiprof.request.id": str(r.id)[:200], "tuiprof.request.source": str(r.source),
                 "tuiprof.request.status": r.status, "tuiprof.request.reason": str(r.reason)[:80],
                 "tuiprof.request.prompt_tokens": int(r.prompt_tokens),
                 "tuiprof.request.output_tokens": int(r.output_tokens),
                 "tuiprof.request.prefill_steps": int(r.prefill_steps),
                 "tuiprof.request.decode_steps": int(r.decode_steps),
                 "tuiprof.request.steps_shared": int(r.shared),
                 "tuiprof.request.preemptions": int(r.preemptions),
                 "tuiprof.request.kv_blocks": int(r.kv_blocks)}
        if r.ttft_ms is not None:
            attrs["tuiprof.request.ttft_ms"] = float(r.ttft_ms)
        if r.queue_ms is not None:
            attrs["tuiprof.request.queue_ms"] = float(r.queue_ms)
        itl = r.itls_ms()
        if itl:
            attrs["tuiprof.request.itl_mean_ms"] = sum(itl) / len(itl)
        if outside is not None:
            attrs["tuiprof.request.outside_steps_ms"] = outside / 1e6
        span = t.tracer.start_span("request", context=parent, start_time=r.arrival_ns,
                                   attributes=attrs, kind=trace.SpanKind.SERVER)
        if r.status == "failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(r.reason)[:80]))
        ctx = trace.set_span_in_context(span)
        first_step = r.first_step_ns or 0
        first_tok = r.first_token_ns or 0
        phases = []
        if getattr(r, "outside", False):   # the proxy's: no queue or prefill was measured
            phases.append(("ttft", r.arrival_ns, first_tok or r.finish_ns))
            if first_tok:
                phases.append(("decode", first_tok, r.finish_ns))
        elif first_step:
            phases.append(("queued", r.arrival_ns, first_step))
            if first_tok:
                phases.append(("prefill", first_step, max(first_step, first_tok)))
                phases.append(("decode", max(first_step, first_tok), r.finish_ns))
            else:
                phases.append(("prefill", first_step, r.finish_ns))
        else:
            phases.append(("queued", r.arrival_ns, r.finish_ns))
        for name, a, b in phases:
            child = t.tracer.start_span(name, context=ctx, start_time=a)
            self._end(t, child, max(a, b))
        self._end(t, span, max(r.arrival_ns, r.finish_ns))
        with self.lock:
            self.requests += 1

    def _step_span(self, t: _Tracer, row: Any, records: list | None) -> None:
        attrs = {"tuiprof.step.seq": int(row.seq), "tuiprof.step.phase": str(row.phase),
                 "tuiprof.step.mode": str(row.mode), "tuiprof.step.batch": int(row.batch),
                 "tuiprof.step.wall_ms": float(row.host_ms),
                 "tuiprof.step.kernels": int(row.kernels),
                 "tuiprof.step.kernel_ms": row.kernel_ns / 1e6,
                 "tuiprof.step.busy_ms": row.busy_ns / 1e6,
                 "tuiprof.step.graph_kernels": int(row.graph_kernels),
                 "tuiprof.step.model_kernels": int(row.model_kernels),
                 "tuiprof.step.loop_kernels": int(row.loop_kernels),
                 "tuiprof.step.memcpy": int(row.memcpy_count),
                 "tuiprof.step.requests": len(row.requests),
                 "tuiprof.step.prefill_tokens": int(row.prefill_tokens),
                 "tuiprof.step.decode_tokens": int(row.decode_tokens)}
        if row.gpu_ms is not None:
            attrs["tuiprof.step.gpu_ms"] = float(row.gpu_ms)
        for cat, ms in _categories(records):
            attrs[f"tuiprof.step.kernel_ms.{cat}"] = ms
        span = t.tracer.start_span("step", start_time=row.start_ns, attributes=attrs)
        self._end(t, span, max(row.start_ns, row.end_ns))
        with self.lock:
            self.steps += 1


def _shutdown(t: _Tracer) -> None:
    try:
        t.provider.shutdown()
    except Exception:
        pass


def _categories(records: list | None, top: int = 4) -> list:
    """A step's kernel time by category (ms), the ``top`` largest, from its raw records."""
    if not records:
        return []
    from ..analysis.kernels import kernel_info  # noqa: PLC0415
    from ..store.records import K_END, K_NAME, K_START, KERNEL, KIND  # noqa: PLC0415

    ns: dict = {}
    for rec in records:
        if rec and rec[KIND] == KERNEL:
            cat = kernel_info(rec[K_NAME]).category
            ns[cat] = ns.get(cat, 0) + (rec[K_END] - rec[K_START])
    return [(c.replace("/", "_").replace(" ", "_"), v / 1e6)
            for c, v in sorted(ns.items(), key=lambda kv: -kv[1])[:top]]


def start(url: str, source: Source) -> OtlpFeed:
    return OtlpFeed(url, source)
