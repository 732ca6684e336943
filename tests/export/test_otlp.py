"""``--otlp``: the spans a session sends, received by a local OTLP/HTTP receiver on 127.0.0.1,
decoded with opentelemetry-proto and checked field by field against the snapshot; a request
with a traceparent joins that trace; a slow collector costs dropped spans, counted, never a
blocked session."""
from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto")

from tuiprof import __version__  # noqa: E402
from tuiprof.errors import TuiprofError  # noqa: E402
from tuiprof.export import otlp  # noqa: E402
from tuiprof.export.feeds import Feeds, Source  # noqa: E402
from tuiprof.export.snapshot import write_snapshot  # noqa: E402
from tuiprof.program.transformers_requests import ArrivalMiddleware, TransformersRequests  # noqa: E402
from tuiprof.store import SessionStore  # noqa: E402

from .fleet_data import free_port, serve  # noqa: E402
from .otlp_receiver import Receiver, attrs  # noqa: E402

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_every_span_says_what_the_snapshot_says(tmp_path):
    store = SessionStore(meta={"model": "tiny-test", "device": "cpu"})
    serve(store, 5, traceparents={"req-2": f"00-{TRACE}-{PARENT}-01",
                                  "req-3": "00-not-a-trace-context-01"})
    rx = Receiver(free_port())
    try:
        feed = otlp.OtlpFeed(otlp.check(rx.url), Source.of(store), poll_s=3600)
        feed.poll()
        feed.close()                         # flushes the queue
        stats = feed.stats()
    finally:
        rx.close()
    snap = tmp_path / "s.json"
    write_snapshot(store.view(), snap)
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    spans = rx.spans
    by_id = {s.span_id: s for _, s in spans}
    roots = {attrs(s)["tuiprof.request.id"]: s for _, s in spans if s.name == "request"}
    assert sorted(roots) == sorted(reqs)
    for rid, sp in roots.items():
        r, a = reqs[rid], attrs(sp)
        assert sp.start_time_unix_nano == r["arrival_ns"]
        assert sp.end_time_unix_nano == r["finish_ns"]
        assert a["tuiprof.request.prompt_tokens"] == r["prompt_tokens"]
        assert a["tuiprof.request.output_tokens"] == r["output_tokens"]
        assert a["tuiprof.request.steps_shared"] == r["shared"]
        assert a["tuiprof.request.preemptions"] == r["preemptions"]
        assert a["tuiprof.request.prefill_steps"] == r["prefill_steps"]
        assert a["tuiprof.request.decode_steps"] == r["decode_steps"]
        assert a["tuiprof.request.status"] == r["status"]
        assert a["tuiprof.request.ttft_ms"] == pytest.approx(r["ttft_ms"])
        assert a["tuiprof.request.queue_ms"] == pytest.approx(r["queue_ms"])
        assert a["tuiprof.request.outside_steps_ms"] == pytest.approx(r["outside_ms"])
        kids = {s.name: s for _, s in spans if s.parent_span_id == sp.span_id}
        assert set(kids) == {"queued", "prefill", "decode"}
        assert (kids["queued"].start_time_unix_nano, kids["queued"].end_time_unix_nano) == \
            (r["arrival_ns"], r["first_step_ns"])
        assert (kids["prefill"].start_time_unix_nano, kids["prefill"].end_time_unix_nano) == \
            (r["first_step_ns"], r["first_token_ns"])
        assert (kids["decode"].start_time_unix_nano, kids["decode"].end_time_unix_nano) == \
            (r["first_token_ns"], r["finish_ns"])
        assert all(k.trace_id == sp.trace_id for k in kids.values())
    # the request that came with a trace context is a child of it; a malformed one is ignored
    assert roots["req-2"].trace_id.hex() == TRACE
    assert roots["req-2"].parent_span_id.hex() == PARENT
    assert reqs["req-2"]["traceparent"] == f"00-{TRACE}-{PARENT}-01"
    assert reqs["req-3"]["traceparent"] == "" and roots["req-3"].parent_span_id == b""
    assert roots["req-3"].trace_id.hex() != TRACE
    # sampled step spans: traced steps, with their kernel summary
    steps = [s for _, s in spans if s.name == "step"]
    rows = {t["seq"]: t for t in doc["tokens"]}
    assert 0 < len(steps) <= otlp.STEP_SPANS_PER_POLL
    for sp in steps:
        a = attrs(sp)
        t = rows[a["tuiprof.step.seq"]]
        assert t["sampled"] and sp.start_time_unix_nano == t["start_ns"]
        assert sp.end_time_unix_nano == t["end_ns"]
        assert a["tuiprof.step.kernels"] == t["kernels"] == 2
        assert a["tuiprof.step.kernel_ms"] == pytest.approx(t["kernel_ns"] / 1e6)
        assert a["tuiprof.step.phase"] == t["phase"] and a["tuiprof.step.batch"] == t["batch"]
        assert a["tuiprof.step.kernel_ms.GEMM_GEMV"] == pytest.approx(1.0)
        assert a["tuiprof.step.kernel_ms.elementwise"] == pytest.approx(0.5)
    # resource attributes
    for res, _ in spans:
        assert res["host.name"] == socket.gethostname()
        assert res["process.pid"] == os.getpid()
        assert res["tuiprof.role"] == "engine" and res["tuiprof.rank"] == ""
        assert res["tuiprof.gpu"] == "cpu" and res["tuiprof.model"] == "tiny-test"
        assert res["tuiprof.version"] == __version__
    assert len(by_id) == len(spans) == 4 * 5 + len(steps)
    assert stats["exported"] == stats["spans"] == len(spans) and stats["dropped"] == 0


def test_a_second_poll_sends_only_what_is_new():
    store = SessionStore()
    t = serve(store, 3)
    rx = Receiver(free_port())
    try:
        feed = otlp.OtlpFeed(otlp.check(rx.url), Source.of(store), poll_s=3600)
        feed.poll()
        serve(store, 2, t0=t, first=3)
        feed.poll()
        feed.close()
    finally:
        rx.close()
    ids = [attrs(s)["tuiprof.request.id"] for _, s in rx.spans if s.name == "request"]
    assert sorted(ids) == [f"req-{i}" for i in range(5)]


def test_a_slow_collector_drops_counted_spans_and_blocks_nothing(tmp_path):
    store = SessionStore()
    serve(store, 40)
    rx = Receiver(free_port(), delay_s=30)      # answers only when released
    notices: list = []
    src = Source.of(store)
    src.notice = notices.append
    try:
        feed = otlp.OtlpFeed(otlp.check(rx.url), src, poll_s=3600, max_queue=8)
        feed.poll()              # returns: the spans are queued, or dropped when it is full
        s = feed.stats()
        assert s["dropped"] > 0 and s["spans"] == 40 * 4 + s["steps"]
        assert notices and notices[0].startswith(f"otlp: {s['dropped']} spans dropped")
        feeds = Feeds({})
        feeds.running["otlp"] = feed
        view = feeds.annotate(store.view(raw=False))
        assert view.meta["feeds"]["otlp"]["dropped"] == s["dropped"]
        rx.release.set()
        feed.close()
        s = feed.stats()
        assert s["exported"] + s["dropped"] + s["failed"] + s["queued"] == s["spans"]
    finally:
        rx.close()


def test_the_url_is_checked():
    assert otlp.check("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert otlp.check("http://127.0.0.1:4318/v1/traces") == "http://127.0.0.1:4318/v1/traces"
    for bad in ("127.0.0.1:4318", "ftp://x:1", "http://127.0.0.1:port"):
        with pytest.raises(TuiprofError, match="--otlp"):
            otlp.check(bad)


def test_transformers_serve_keeps_the_traceparent_header():
    """The ASGI middleware reads the header in the request's task; add_request gets it."""
    store = SessionStore()
    reqs = TransformersRequests(store.requests, clock=lambda: 123)
    seen = {}

    async def app(scope, receive, send):
        reqs.http_arrived(scope["rid"])
        seen[scope["rid"]] = True

    mw = ArrivalMiddleware(app, clock=lambda: 100)

    async def both():
        for rid, headers in (("a", [(b"traceparent", f"00-{TRACE}-{PARENT}-01".encode())]),
                             ("b", [(b"traceparent", b"garbage")]), ("c", [])):
            await asyncio.create_task(mw({"type": "http", "headers": headers, "rid": rid},
                                         None, None))
    asyncio.run(both())
    for rid in "abc":
        reqs.added(rid, [1, 2, 3], 150)
    rows = {r.id: r for r in store.requests.view().rows}
    assert rows["a"].traceparent == f"00-{TRACE}-{PARENT}-01"
    assert rows["b"].traceparent == rows["c"].traceparent == ""
    assert rows["a"].arrival_ns == 100 and rows["a"].queued_ns == 150


def test_vllm_requests_keep_the_traceparent_header_and_vllms_own_trace_context():
    """vLLM's API server: the middleware's header in the request's task, by X-Request-Id from
    another task, or vLLM's own ``trace_headers`` (its OTLP tracing on); the engine's joined
    row keeps it, so the request span joins the client's (and vLLM's) trace."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from tuiprof.analysis.requests import join_requests
    from tuiprof.program import vllm_requests as vr

    store, engine = SessionStore(), SessionStore()
    reqs = vr.VllmRequests(store.requests, clock=lambda: 200, wall=lambda: 200)
    tp, tp2 = f"00-{TRACE}-{PARENT}-01", f"00-{TRACE}-{'2' * 16}-01"

    def request(rid, ext="", trace=None):
        return SimpleNamespace(request_id=rid, prompt_token_ids=[1, 2], external_req_id=ext,
                               arrival_time=None, trace_headers=trace)

    async def app(scope, receive, send):    # OutputProcessor.add_request in the same task
        reqs.frontend_added(request(f"cmpl-{scope['rid']}-0-ab12", scope["rid"]), 150)

    mw = vr.ArrivalMiddleware(app, clock=lambda: 100, owner=reqs)

    async def both():
        for rid, headers in (("a", [(b"x-request-id", b"a"), (b"traceparent", tp.encode())]),
                             ("b", [(b"x-request-id", b"b"), (b"traceparent", b"garbage")])):
            await asyncio.create_task(mw({"type": "http", "headers": headers, "rid": rid},
                                         None, None))
        # "c" reaches add_request from another task: found by its X-Request-Id
        await asyncio.create_task(vr.ArrivalMiddleware(
            lambda *a: asyncio.sleep(0), clock=lambda: 90, owner=reqs)(
            {"type": "http", "headers": [(b"x-request-id", b"c"),
                                         (b"traceparent", tp.encode())]}, None, None))
    asyncio.run(both())
    reqs.frontend_added(request("cmpl-c-0-ab12", "c"), 160)
    reqs.frontend_added(request("cmpl-d-0-ab12", "d", {"traceparent": tp2}), 170)
    rows = {r.id: r for r in store.requests.view().rows}
    assert rows["cmpl-a-0-ab12"].traceparent == tp and rows["cmpl-a-0-ab12"].arrival_ns == 100
    assert rows["cmpl-b-0-ab12"].traceparent == ""
    assert rows["cmpl-c-0-ab12"].traceparent == tp and rows["cmpl-c-0-ab12"].arrival_ns == 90
    assert rows["cmpl-d-0-ab12"].traceparent == tp2
    # the engine's record of "a" joined with the API server's keeps the trace context
    engine.requests.arrived("cmpl-a-0-ab12", 2, vr.ENGINE, t=140)
    joined = join_requests(engine.requests.view(), store.requests.view())
    assert {r.id: r.traceparent for r in joined.rows}["cmpl-a-0-ab12"] == tp


def test_a_collector_that_is_not_there_costs_counted_failures():
    store = SessionStore()
    serve(store, 3)
    url = otlp.check(f"http://127.0.0.1:{free_port()}")    # nobody listens there
    feed = otlp.OtlpFeed(url, Source.of(store), poll_s=3600)
    feed.poll()
    feed.close()
    s = feed.stats()
    assert s["spans"] == 3 * 4 + s["steps"] and s["exported"] == 0
    # failed, dropped, or not sent when the session's end stopped waiting for them
    assert s["failed"] + s["dropped"] + s["queued"] == s["spans"] and s["spans"] > 0
    assert feed.notice().startswith(f"otlp: {s['dropped']} spans dropped")
