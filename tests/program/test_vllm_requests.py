"""vLLM's API server's requests as tuiprof records them, without vLLM: the ASGI layer and
uvicorn's first bytes around a real asyncio task, vLLM's ``OutputProcessor`` calls given as
the plain objects vLLM hands them (``request_id``, ``new_token_ids``, ``finish_reason``).
The real server is tests/serving/test_vllm_server.py."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tuiprof.analysis.requests import join_requests
from tuiprof.program import vllm_requests as vr
from tuiprof.engine import vllm_load
from tuiprof.program.transformers_requests import READ, RECEIVED
from tuiprof.store import SessionStore


class Clock:
    def __init__(self) -> None:
        self.t = 1_000

    def __call__(self) -> int:
        return self.t


def _request(rid: str, client: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, prompt_token_ids=[1, 2, 3], external_req_id=client,
                           arrival_time=None, trace_headers=None)


def _out(rid: str, n: int = 1, reason=None) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, new_token_ids=[7] * n, finish_reason=reason)


def _serve(reqs: vr.VllmRequests, clock: Clock, client: str, headers=(), first_bytes=None,
           read=0):
    """One streaming request through the middleware, as uvicorn runs it: its first bytes
    noted in the context its task is created from, the app adds the request, vLLM's output
    handler (another task) hands out two tokens and the finish, then the response's last
    chunk leaves."""
    rid = f"cmpl-{client}-0-ab12cd34"

    async def app(scope, receive, send):
        clock.t = 1_300
        reqs.frontend_added(_request(rid, client), clock())
        # vLLM's output handler runs in a task of its own
        clock.t = 1_500
        await asyncio.create_task(_outputs([_out(rid)], 1_500))
        clock.t = 1_600
        await asyncio.create_task(_outputs([_out(rid, 1, "length")], 1_600))
        clock.t = 1_700
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        clock.t = 1_900
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})
        clock.t = 2_000

    async def _outputs(outs, t):
        reqs.frontend_outputs(outs, t)

    async def send(message):
        pass

    mw = vr.ArrivalMiddleware(app, clock=clock, owner=reqs)

    async def connection():
        if first_bytes is not None:
            RECEIVED.set(first_bytes)   # uvicorn's data_received, before it makes the task
            READ.set(read)
        clock.t = 1_100
        await asyncio.create_task(mw({"type": "http", "headers": [
            (b"x-request-id", client.encode()), *headers]}, None, send))

    asyncio.run(connection())
    return rid


def test_a_request_runs_from_its_first_bytes_to_its_last_chunk_sent():
    store, clock = SessionStore(), Clock()
    reqs = vr.VllmRequests(store.requests, clock=clock, wall=clock)
    rid = _serve(reqs, clock, "a", first_bytes=1_020)
    r = {x.id: x for x in store.requests.view().rows}[rid]
    # arrival where uvicorn first had its bytes, the app's entry apart ("before the app")
    assert r.arrival_ns == 1_020 and r.app_ns == 1_100 and r.queued_ns == 1_300
    assert r.first_token_ns == 1_500 and r.last_token_ns == 1_600 and r.output_tokens == 2
    # the end: when the last chunk was handed to the server, not when vLLM finished it
    assert r.status == "finished" and r.reason == "length" and r.finish_ns == 1_900
    assert r.client_id == "a"


def test_the_end_is_when_the_last_bytes_are_handed_over_not_after_the_send():
    """The server's send may return late (its loop busy with other requests) while the client
    has already read the bytes: the request ends as they are handed over."""
    store, clock = SessionStore(), Clock()
    reqs = vr.VllmRequests(store.requests, clock=clock, wall=clock)
    rid = "cmpl-d-0-ab12cd34"

    async def app(scope, receive, send):
        reqs.frontend_added(_request(rid, "d"), 1_300)
        reqs.frontend_outputs([_out(rid, 1, "stop")], 1_500)
        clock.t = 1_900
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})

    async def slow_send(message):
        clock.t += 700        # the task runs again 0.7 µs later on this clock

    asyncio.run(vr.ArrivalMiddleware(app, clock=clock, owner=reqs)(
        {"type": "http", "headers": [(b"x-request-id", b"d")]}, None, slow_send))
    r = {x.id: x for x in store.requests.view().rows}[rid]
    assert r.finish_ns == 1_900


def test_bytes_of_an_earlier_request_are_not_this_ones_arrival():
    store, clock = SessionStore(), Clock()
    reqs = vr.VllmRequests(store.requests, clock=clock, wall=clock)
    rid = _serve(reqs, clock, "b", first_bytes=5_000)   # after the app's entry: not its own
    r = {x.id: x for x in store.requests.view().rows}[rid]
    assert r.arrival_ns == 1_100 and r.finish_ns == 1_900


def test_a_response_that_never_ends_still_finishes_its_request():
    store, clock = SessionStore(), Clock()
    reqs = vr.VllmRequests(store.requests, clock=clock, wall=clock)
    rid = "cmpl-c-0-ab12cd34"

    async def app(scope, receive, send):
        reqs.frontend_added(_request(rid, "c"), 1_300)
        reqs.frontend_outputs([_out(rid, 1, "stop")], 1_500)
        clock.t = 1_800
        raise RuntimeError("the client went away")

    async def run():
        try:
            await vr.ArrivalMiddleware(app, clock=clock, owner=reqs)(
                {"type": "http", "headers": [(b"x-request-id", b"c")]}, None, None)
        except RuntimeError:
            pass

    asyncio.run(run())
    r = {x.id: x for x in store.requests.view().rows}[rid]
    assert r.status == "finished" and r.finish_ns == 1_800


def test_offline_requests_finish_when_vllm_hands_them_out():
    """LLM.generate (no HTTP): the finish is the output processor's."""
    store, clock = SessionStore(), Clock()
    reqs = vr.VllmRequests(store.requests, clock=clock, wall=clock)
    reqs.frontend_added(_request("0", ""), 1_300)
    reqs.frontend_outputs([_out("0", 1, "length")], 1_500)
    r = store.requests.view().rows[0]
    assert r.status == "finished" and r.finish_ns == 1_500


def test_a_warm_up_request_is_kept_apart_in_the_api_servers_counts_and_the_engines():
    """``X-Tuiprof-Warmup: 1`` (tuiprof serve's warm-up requests send it): the API server's
    record is a warm-up, and so is the engine core's once joined with it."""
    front, engine, clock = SessionStore(), SessionStore(), Clock()
    reqs = vr.VllmRequests(front.requests, clock=clock, wall=clock)
    warm = _serve(reqs, clock, "warmup0", headers=[(vr.WARMUP_HEADER, b"1")])
    load = _serve(reqs, clock, "r0")
    fv = front.requests.view()
    assert [r.id for r in fv.rows] == [load] and [r.id for r in fv.warmup] == [warm]
    assert fv.counts["arrived"] == fv.counts["finished"] == 1 and fv.counts["warmup"] == 1
    for rid in (warm, load):   # the engine core's own record: it cannot know which is which
        engine.requests.arrived(rid, 3, vr.ENGINE, t=1_200, queued_t=1_250)
        engine.requests.advance(1_400, [(rid, 2)], [(rid, "length", "finished")])
    ev = engine.requests.view()
    assert ev.counts["arrived"] == 2 and ev.counts["tokens"] == 4
    joined = join_requests(ev, fv)
    assert [r.id for r in joined.rows] == [load] and [r.id for r in joined.warmup] == [warm]
    assert joined.warmup[0].warmup and joined.warmup[0].source == "vllm"
    c = joined.counts
    assert (c["arrived"], c["finished"], c["tokens"], c["warmup"]) == (1, 1, 2, 1)
    assert joined.sources == {"vllm": 1}
    # the joined row runs from the API server's arrival to its last chunk sent
    assert joined.rows[0].arrival_ns == 1_100 and joined.rows[0].finish_ns == 1_900
    front2, clock2 = SessionStore(), Clock()
    rid = _serve(vr.VllmRequests(front2.requests, clock=clock2, wall=clock2), clock2, "r1",
                 first_bytes=1_050)
    engine.requests.arrived(rid, 3, vr.ENGINE, t=1_200, queued_t=1_250)
    j = join_requests(engine.requests.view(), front2.requests.view()).get(rid)
    assert (j.arrival_ns, j.app_ns, j.finish_ns) == (1_050, 1_100, 1_900)


def test_the_engine_core_keeps_tuiprof_serves_warm_up_apart_by_its_id():
    """The engine core has no HTTP headers, only vLLM's request id, made from the client's
    X-Request-Id: tuiprof serve's warm-up id keeps it apart there, and in the API server even
    without the header."""
    assert vllm_load.WARMUP_ID == vr.WARMUP_ID     # the load program spells it apart
    front, engine, clock = SessionStore(), SessionStore(), Clock()
    reqs = vr.VllmRequests(front.requests, clock=clock, wall=clock)
    warm = _serve(reqs, clock, f"{vr.WARMUP_ID}0")
    load = _serve(reqs, clock, "r0")
    ereqs = vr.VllmRequests(engine.requests, clock=clock, wall=clock)
    for rid in (warm, load):
        ereqs.engine_added(SimpleNamespace(request_id=rid, num_prompt_tokens=3,
                                           arrival_time=None), 1_250)
        engine.requests.advance(1_400, [(rid, 2)], [(rid, "length", "finished")])
    ev = engine.requests.view()
    assert [r.id for r in ev.rows] == [load] and [r.id for r in ev.warmup] == [warm]
    assert ev.counts["arrived"] == 1 and ev.counts["warmup"] == 1 and ev.counts["tokens"] == 2
    fv = front.requests.view()
    assert [r.id for r in fv.rows] == [load] and [r.id for r in fv.warmup] == [warm]
    joined = join_requests(ev, fv)
    assert [r.id for r in joined.rows] == [load] and joined.counts["arrived"] == 1
    w = joined.warmup[0]     # joined with the API server's record, kept apart
    assert (w.id, w.client_id, w.source, w.warmup) == (warm, f"{vr.WARMUP_ID}0", "vllm", True)
    assert joined.sources == {"vllm": 1}


def test_the_kernels_receipt_and_the_loops_read_are_kept_apart():
    """uvicorn's hook gives the kernel's receipt of the first bytes (the arrival) and the event
    loop's read of them: the wait between is the request's "in the socket buffer" phase, and
    "before the app" runs from the read; the join keeps both."""
    from tuiprof.analysis.requests import phases

    front, engine, clock = SessionStore(), SessionStore(), Clock()
    rid = _serve(vr.VllmRequests(front.requests, clock=clock, wall=clock), clock, "s",
                 first_bytes=1_010, read=1_060)
    r = front.requests.view().get(rid)
    assert (r.arrival_ns, r.read_ns, r.app_ns) == (1_010, 1_060, 1_100)
    assert r.in_socket_ms == 50 / 1e6 and r.before_app_ms == 40 / 1e6
    engine.requests.arrived(rid, 3, vr.ENGINE, t=1_200, queued_t=1_250)
    j = join_requests(engine.requests.view(), front.requests.view()).get(rid)
    assert (j.arrival_ns, j.read_ns, j.app_ns) == (1_010, 1_060, 1_100)
    got = [(n, a, b) for n, a, b in phases(j, 2_000)][:3]
    assert got == [("request", 1_010, 1_900), ("in the socket buffer", 1_010, 1_060),
                   ("before the app", 1_060, 1_100)], got
    # a read that is no later than the arrival is no phase
    front2, clock2 = SessionStore(), Clock()
    rid = _serve(vr.VllmRequests(front2.requests, clock=clock2, wall=clock2), clock2, "t",
                 first_bytes=1_010, read=1_010)
    r = front2.requests.view().get(rid)
    assert r.read_ns == 0 and r.in_socket_ms is None and r.before_app_ms == 90 / 1e6


def test_a_steps_requests_split_into_prefill_and_decode_tokens():
    """``Scheduler.schedule()`` has moved each request's computed tokens on by its scheduled
    ones: a prompt's chunk is prefill, a request's one new token decode, a preempted request's
    recomputed tokens prefill; a request of another shape is read with care."""
    def req(computed, prompt, out, tokens=None):
        return SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt,
                               num_output_tokens=out,
                               num_tokens=tokens if tokens is not None else prompt + out)

    pool = SimpleNamespace(num_gpu_blocks=100, get_num_free_blocks=lambda: 60)
    sched = SimpleNamespace(
        requests={"chunk": req(64, 100, 0), "dec": req(22, 12, 10), "pre": req(30, 12, 20),
                  "odd": SimpleNamespace(num_computed_tokens="5", num_prompt_tokens=5)},
        running=[1, 2, 3], waiting=[4], kv_holding_waiting=[],
        kv_cache_manager=SimpleNamespace(block_pool=pool))
    out = SimpleNamespace(num_scheduled_tokens={"chunk": 64, "dec": 1, "pre": 30, "gone": 1})
    info = vr.step_info(sched, out)
    assert info["prefill"] == ("chunk", "pre") and info["decode"] == ("dec", "gone")
    assert (info["prefill_tokens"], info["decode_tokens"]) == (64 + 30, 1 + 1)
    assert (info["running"], info["pending"], info["kv_used"], info["kv_total"]) == (3, 1, 40, 100)
    out = SimpleNamespace(num_scheduled_tokens={"odd": 5})   # its fields are not ints
    info = vr.step_info(sched, out)
    assert info["prefill"] == ("odd",) and info["prefill_tokens"] == 5
