"""Requests of transformers' own serving paths, found without changing the program.

The patches live in :mod:`tuiprof.program.transformers_steps` (one patch per function, shared
with the steps); this module turns what they see into the store's requests
(:class:`~tuiprof.store.requests.RequestBook`). Where each fact comes from (the same in
transformers 5.17 and 5.24):

* **arrival**: ``ContinuousBatchingManager.add_request`` (``generate_batch``, the manager,
  ``transformers serve``) returns the request's id; the prompt is its ``input_ids``. Under
  ``transformers serve`` the HTTP handler's ``handle_request(body, request_id)`` runs first
  (before tokenisation and the model's lookup) with the same id, and the HTTP request reached
  the server's ASGI app earlier still (``build_server``'s app gets an outermost middleware
  that notes the time in a context variable), and uvicorn's protocol had its first bytes
  earlier again (``data_received``, patched when the app is built): the request arrives then,
  its "before the app" phase lasts until the app's entry, and it enters the engine's queue at
  ``add_request``.
* **its steps**: before each ``_generation_step``, the batch about to run
  (``requests_in_batch``: each request's state and query length). A request with no generated
  token yet is prefilling (its query: prompt tokens of this chunk); the others decode one token.
  The scheduler's waiting and active requests and the paged cache's free blocks give the step's
  pending and running counts and KV-cache blocks used of the total.
* **tokens and finish**: ``ContinuousBatchProcessor.update_batch`` appends each request's new
  token and finishes it; a request's token time is when ``update_batch`` hands it to the
  server (``OutputRouter.deliver_batch``, timed before the server's event loop can have it;
  where a version has no such call, when ``update_batch`` returns), with asynchronous
  batching one step after the one that computed it.
  ``OutputRouter.fail_and_deliver`` fails a request; ``cancel_request`` cancels one.
* **a plain generate()**: each row of the batch is a request that arrives when ``generate()``
  is called; every step gives each row a token (the rows' times are recorded per step and
  handed to the store every ``GENERATE_FLUSH`` steps); when ``generate()`` returns, a row's
  length is where its first end-of-sequence token is (the rest is padding).
"""
from __future__ import annotations

import contextvars
import itertools
import json
from collections import OrderedDict
from typing import Any, Callable

from ..collect.socket_arrival import socket_wait_ns, transport_socket

HTTP = "transformers serve"
BATCHING = "transformers"
GENERATE = "generate"
HTTP_KEEP = 4096        # HTTP arrivals waiting for their add_request
GENERATE_FLUSH = 16     # generate() steps between two updates of its rows
# when the HTTP request reached the server's app (its ASGI middleware sets it, its handler reads
# it: both run in the request's task)
ARRIVAL: contextvars.ContextVar = contextvars.ContextVar("tuiprof_http_arrival", default=0)
# the request's W3C trace context (its traceparent header), read by the same middleware, so the
# request's span can join the client's trace (docs/fleet.md)
TRACEPARENT: contextvars.ContextVar = contextvars.ContextVar("tuiprof_traceparent", default="")


def header_traceparent(scope: Any) -> str:
    """The ``traceparent`` header of an ASGI HTTP scope ("" if none or not well formed)."""
    from ..store.requests import valid_traceparent  # noqa: PLC0415

    for key, value in scope.get("headers") or ():
        if key == b"traceparent":
            try:
                return valid_traceparent(value.decode("ascii").strip().lower())
            except (AttributeError, UnicodeDecodeError):
                return ""
    return ""
# when the HTTP server's host first had the request's bytes (the kernel's receipt of them,
# :mod:`tuiprof.collect.socket_arrival`): uvicorn's protocol sets it in ``data_received``, in
# the context the request's ASGI task is then created from (uvicorn makes the task while parsing
# those bytes, and a task copies the context it was created in)
RECEIVED: contextvars.ContextVar = contextvars.ContextVar("tuiprof_http_received", default=0)
# when the server's event loop read those bytes (``data_received``); later than RECEIVED by the
# time they waited in the kernel's socket buffer for the loop
READ: contextvars.ContextVar = contextvars.ContextVar("tuiprof_http_read", default=0)
# uvicorn's HTTP protocols (module, class): whichever the server runs
UVICORN_PROTOCOLS = (("uvicorn.protocols.http.h11_impl", "H11Protocol"),
                     ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"))


def received_hook(orig: Callable, clock: Callable[[], int], hooks: Any = None) -> Callable:
    """``data_received`` of a uvicorn HTTP protocol, noting when a request's first bytes came:
    bytes that arrive with no request in progress on the connection (no cycle yet, or the last
    one's response complete) begin a new one. They came when the kernel received them (one
    ``TCP_INFO`` read of the connection's socket: :func:`socket_wait_ns`), which is earlier
    than this read when the event loop was busy; both times are kept. The TCP accept stays
    outside. ``hooks``: the session's :class:`~tuiprof.collect.own_cost.HookClock` (this runs
    on the server's event loop)."""
    def data_received(self: Any, data: bytes) -> Any:
        h = hooks.enter() if hooks is not None else 0.0
        try:
            cycle = getattr(self, "cycle", None)
            if cycle is None or getattr(cycle, "response_complete", False):
                # a request's bytes may come in several reads before its headers are whole:
                # the first read's time holds until a new cycle starts
                mark = getattr(self, "_tuiprof_first", None)
                if mark is None or mark[1] is not cycle:
                    sock = getattr(self, "_tuiprof_sock", False)
                    if sock is False:
                        sock = self._tuiprof_sock = transport_socket(
                            getattr(self, "transport", None))
                    wait = socket_wait_ns(sock)      # before the clock: never too early
                    now = clock()
                    mark = self._tuiprof_first = (now - wait, cycle, now)
                RECEIVED.set(mark[0])
                READ.set(mark[2])
        except Exception:  # never in the server's way
            pass
        finally:
            if hooks is not None:
                hooks.leave(h)
        return orig(self, data)
    data_received.__wrapped__ = orig  # type: ignore[attr-defined]
    return data_received


def first_bytes(app: int) -> tuple[int, int]:
    """(arrival, read) of the HTTP request whose app was entered at ``app``, from its task's
    context: when the kernel had its first bytes, and when the event loop read them (0: at
    its arrival, or not known); (``app``, 0) when no first bytes came before the app's entry
    (they belong to another request, or no protocol was patched)."""
    got, read = RECEIVED.get(), READ.get()
    if not 0 < got <= app:
        return app, 0
    return got, (read if got < read <= app else 0)


def patch_uvicorn(replace: Callable[[Any, str, Any], None], clock: Callable[[], int],
                  hooks: Any = None) -> None:
    """uvicorn's HTTP protocols (transformers serve and vLLM's server run on uvicorn) note when a
    request's first bytes came, before the app: :func:`received_hook` on the ``data_received``
    of each one installed, through ``replace(cls, name, new)``, once."""
    import importlib  # noqa: PLC0415

    for name, cls_name in UVICORN_PROTOCOLS:
        try:
            cls = getattr(importlib.import_module(name), cls_name)
        except Exception:  # not installed (httptools), or another server: app entry only
            continue
        orig = cls.__dict__.get("data_received")
        if orig is None or hasattr(orig, "__wrapped__"):
            continue
        replace(cls, "data_received", received_hook(orig, clock, hooks))


class Wire:
    """One HTTP request's response as its app writes it: the request id its handler was given
    and when the first bytes carrying generated text were written."""

    __slots__ = ("rid", "first")

    def __init__(self) -> None:
        self.rid: Any = None
        self.first = 0


def carries_text(body: Any) -> bool:
    """Whether a response body's piece holds a server-sent event with generated text."""
    if not body or b"data:" not in body:
        return False
    from ..collect.http_proxy import event_facts  # noqa: PLC0415 - the proxy's own reading

    for line in bytes(body).split(b"\n"):
        if line.startswith(b"data:"):
            try:
                if event_facts(json.loads(line[5:]))[0]:
                    return True
            except ValueError:
                continue
    return False


# the response being written for the request of this task (the middleware sets it, the handler
# names its request in it)
WIRE: contextvars.ContextVar = contextvars.ContextVar("tuiprof_http_wire", default=None)


class ArrivalMiddleware:
    """An outermost ASGI middleware: the time an HTTP request reached the app, and, with
    ``requests``, when its response's first token and its last bytes were written: a body
    message is timed as the app hands it to the server's ``send``, which writes it to the
    socket at once (or queues it while the client reads slower), so nobody outside can read
    it earlier. The first token is the first server-sent event that carries generated text,
    read as the proxy reads it (``event_facts``): a chat stream's opening role chunk is none;
    a response that is no stream has its first token at its end."""

    def __init__(self, app: Any, clock: Callable[[], int] | None = None,
                 requests: "TransformersRequests | None" = None, hooks: Any = None) -> None:
        self.app = app
        self.clock = clock
        self.requests = requests
        # the session's HookClock (tuiprof/collect/own_cost.py): this runs on the server's
        # event loop, so its time is the session's overhead
        self.hooks = hooks

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        clock = self.clock
        if scope.get("type") != "http" or clock is None:
            await self.app(scope, receive, send)
            return
        hooks = self.hooks
        h = hooks.enter() if hooks is not None else 0.0
        try:
            ARRIVAL.set(clock())
            try:
                TRACEPARENT.set(header_traceparent(scope))
            except Exception:  # a scope of an unexpected shape: no trace context
                pass
        finally:
            if hooks is not None:
                hooks.leave(h)
        owner = self.requests
        if owner is None:
            await self.app(scope, receive, send)
            return
        w = Wire()
        WIRE.set(w)

        async def timed_send(message: Any) -> None:
            if w.rid is not None and message.get("type") == "http.response.body":
                hs = hooks.enter() if hooks is not None else 0.0
                try:
                    last = not message.get("more_body", False)
                    if last or not w.first:     # the chunks between cost no clock read
                        t = clock()
                        if not w.first and carries_text(message.get("body")):
                            w.first = t
                        if last:
                            rid, w.rid = w.rid, None
                            owner.wired(rid, w.first or t, t)
                except Exception as exc:  # never in the server's way
                    owner.failed_here("send", exc)
                finally:
                    if hooks is not None:
                        hooks.leave(hs)
            await send(message)

        await self.app(scope, receive, timed_send)


class TransformersRequests:
    """What the transformers patches report about requests, into ``book``."""

    def __init__(self, book: Any, clock: Callable[[], int]) -> None:
        self.book = book
        self.clock = clock
        self._http: OrderedDict[Any, int] = OrderedDict()
        # HTTP requests whose responses are being written (their ids)
        self._wires: OrderedDict[Any, None] = OrderedDict()
        self._trace: dict[Any, str] = {}   # request id -> traceparent, for those in _http
        self._calls = itertools.count()
        self._delivered = 0     # when this update handed its outputs to the server (0: not yet)

    def failed_here(self, where: str, exc: BaseException) -> None:
        """A hook's bookkeeping raised (the program goes on): one event the first time at
        ``where``, every one counted (``RequestBook.record_failed``)."""
        try:
            self.book.record_failed(where, exc)
        except Exception:  # a book without it, or one that fails too: nothing more to do
            pass

    # ------------------------------------------------------------ serving, batching
    def http_arrived(self, request_id: Any) -> None:
        """An HTTP request reached ``transformers serve``'s handler."""
        try:
            app = ARRIVAL.get() or self.clock()
            self._http[request_id] = (*first_bytes(app), app)
            tp = TRACEPARENT.get()
            if tp:
                self._trace[request_id] = tp
            w = WIRE.get()
            if w is not None:
                w.rid = request_id
                self._wires[request_id] = None
                if len(self._wires) > HTTP_KEEP:
                    self._wires.popitem(last=False)
            if len(self._http) > HTTP_KEEP:
                old, _ = self._http.popitem(last=False)
                self._trace.pop(old, None)
        except TypeError:
            pass

    def wired(self, rid: Any, first_t: int, end_t: int) -> None:
        """``rid``'s response was written: its first token at ``first_t``, its end at
        ``end_t``."""
        if rid in self._wires:
            del self._wires[rid]
            self.book.wire(rid, first_t, end_t)

    def added(self, rid: Any, input_ids: Any, t: int) -> None:
        """``add_request`` queued ``rid`` (called at ``t``)."""
        if rid is None:
            return
        try:
            n = len(input_ids)
        except TypeError:
            n = 0
        t_http = self._http.pop(rid, None) if isinstance(rid, str) else None
        tp = self._trace.pop(rid, None) if t_http is not None else None
        if t_http is None:
            self.book.arrived(rid, n, BATCHING, t=t, queued_t=t)
        else:
            self.book.arrived(rid, n, HTTP, t=t_http[0], queued_t=t, app_t=t_http[2],
                              traceparent=tp, read_t=t_http[1] or None)

    def step_info(self, proc: Any, manager: Any) -> dict | None:
        """The requests of the batch about to run, for the step's record."""
        states = batch_states(proc)
        if states is None:
            return None
        prefill, decode, blocks = [], [], {}
        ptok = 0
        cache = getattr(proc, "cache", None)
        tables = block_tables(cache)
        for fs in states:
            st = getattr(fs, "state", None)
            rid = getattr(st, "request_id", None)
            if rid is None:
                continue
            if getattr(st, "generated_tokens", None):
                decode.append(rid)
            else:
                prefill.append(rid)
                ptok += int(getattr(fs, "query_length", 0) or 0)
            b = sum(len(t.get(rid, ())) for t in tables) if tables else getattr(
                st, "allocated_blocks", 0)
            if b:
                blocks[rid] = int(b)
        sched = getattr(proc, "scheduler", None)
        pending = len(getattr(sched, "waiting_requests", ()) or ())
        queue = getattr(manager, "input_queue", None)
        try:
            pending += queue.qsize() if queue is not None else 0
        except Exception:
            pass
        running = len(getattr(sched, "active_requests", ()) or ())
        used, total = kv_blocks(cache)
        return {"prefill": tuple(prefill), "decode": tuple(decode), "prefill_tokens": ptok,
                "decode_tokens": len(decode), "pending": pending, "running": running,
                "kv_used": used, "kv_total": total, "blocks": blocks}

    def delivering(self) -> None:
        """``update_batch`` hands its outputs over to the server now."""
        self._delivered = self.clock()

    def before_update(self, proc: Any) -> list | None:
        """The batch ``update_batch`` is about to update: [(state, tokens before), ...]."""
        self._delivered = 0
        states = batch_states(proc)
        if not states:
            return None
        out = []
        for fs in states:
            st = getattr(fs, "state", None)
            if st is not None:
                out.append((st, len(getattr(st, "generated_tokens", ()) or ())))
        return out

    def after_update(self, seen: list | None) -> None:
        """Each request's new tokens since :meth:`before_update`, and the finished ones."""
        t, self._delivered = self._delivered or self.clock(), 0
        if not seen:
            return
        tokens, done = [], []
        for st, before in seen:
            rid = getattr(st, "request_id", None)
            n = len(getattr(st, "generated_tokens", ()) or ()) - before
            if n > 0:
                tokens.append((rid, n))
            status = getattr(st, "status", None)
            if status is not None and int(status) >= 3:  # FINISHED, FAILED
                done.append((rid, finish_reason(st), "failed" if int(status) > 3 else "finished"))
        self.book.advance(t, tokens, done)

    def failed(self, state: Any, error: Any) -> None:
        rid = getattr(state, "request_id", None)
        if rid is not None:
            self.book.finished(rid, reason=f"error: {error}"[:200], status="failed",
                               quiet=True)

    def cancelled(self, rid: Any) -> None:
        self.book.finished(rid, reason="cancelled", status="cancelled", quiet=True)

    # --------------------------------------------------------------- generate()
    def generate_scope(self) -> "GenerateRequests":
        return GenerateRequests(self, next(self._calls))


class GenerateRequests:
    """The rows of one ``generate()`` call as requests."""

    def __init__(self, owner: TransformersRequests, call: int) -> None:
        self.owner = owner
        self.book = owner.book
        self.clock = owner.clock
        self.call = call
        self.t0 = self.clock()
        self.ids: list[str] = []
        self.times: list[int] = []     # one per step that ended: every row's token then
        self.flushed = 0

    def step(self, inputs: Any, batch: int, per_seq: int, t: int | None = None) -> None:
        """A forward begins at ``t`` (``prepare_inputs_for_generation`` returned ``inputs``):
        the previous one's token reached the host then."""
        if not self.ids:  # the prefill: the rows arrive
            self.ids = [f"generate{self.call}/{i}" for i in range(batch)]
            lengths = prompt_lengths(inputs, batch, per_seq)
            for rid, n in zip(self.ids, lengths):
                self.book.arrived(rid, n, GENERATE, t=self.t0, queued_t=self.t0)
            return
        self.times.append(self.clock() if t is None else t)

    def flush_due(self) -> None:
        """Hand the rows' new tokens to the store once ``GENERATE_FLUSH`` steps are pending
        (called after the step's forward is launched: off the step's critical path)."""
        if len(self.times) - self.flushed >= GENERATE_FLUSH:
            self._flush()

    def _flush(self) -> None:
        new = self.times[self.flushed:]
        if new and self.ids:
            self.book.advance_group(self.ids, new)
        self.flushed = len(self.times)

    def done(self, result: Any, eos: Any, ok: bool) -> None:
        """``generate()`` returned ``result`` (or raised: ``ok`` False)."""
        if not self.ids:
            return
        t = self.clock()
        self.times.append(t)
        lengths = output_lengths(result, len(self.ids), len(self.times), eos) if ok else None
        for i, rid in enumerate(self.ids):
            n = lengths[i] if lengths is not None else len(self.times)
            times = self.times[:n]
            self.book.finished(rid, reason="eos" if n < len(self.times) else "length",
                               t=times[-1] if times else t, output_tokens=n, token_ns=times,
                               status="finished" if ok else "failed")


def batch_states(proc: Any) -> list | None:
    """The ``FutureRequestState`` list of the batch in use (asynchronous batching: the pair
    in use), or None."""
    io = getattr(proc, "inputs_and_outputs", None)
    pairs = getattr(io, "io_pairs", None)
    if pairs is not None:
        io = getattr(pairs[getattr(io, "current_pair", 0)], "host_io", io)
    reqs = getattr(io, "requests_in_batch", None)
    return list(reqs) if reqs is not None else None


def block_tables(cache: Any) -> list:
    """The paged cache's block tables (request id -> its blocks), one per attention kind."""
    groups = getattr(cache, "cache_allocators", None)     # transformers 5.24
    if isinstance(groups, dict):
        groups = list(groups.values())
    if groups is None:
        groups = getattr(cache, "group_cache_managers", None) or ()   # 5.17
    return [t for t in (getattr(g, "block_table", None) for g in groups) if isinstance(t, dict)]


def kv_blocks(cache: Any) -> tuple[int, int]:
    """(blocks used, blocks in all) of the paged KV cache; (0, 0) when unknown."""
    if cache is None:
        return 0, 0
    try:
        total = int(getattr(cache, "num_blocks", 0) or 0)
        free = getattr(cache, "get_num_free_blocks", None)   # transformers <= 5.2x
        if callable(free):
            return max(0, total - int(free())), total
        cap = getattr(cache, "compute_free_capacity", None)  # later: a share of the bytes
        if callable(cap) and total:
            return max(0, round(total * (1.0 - float(cap(True))))), total
    except Exception:
        pass
    return 0, 0


def finish_reason(state: Any) -> str:
    if getattr(state, "error", None):
        return "error"
    limit = getattr(state, "max_new_tokens", None)
    n = len(getattr(state, "generated_tokens", ()) or ())
    return "length" if limit is not None and n >= limit else "stop"


def prompt_lengths(inputs: Any, batch: int, per_seq: int) -> list[int]:
    """Each row's prompt tokens: its attention mask's sum, else the padded length."""
    get = inputs.get if isinstance(inputs, dict) else (lambda k: None)
    mask = get("attention_mask")
    try:
        if mask is not None and getattr(mask, "ndim", 0) == 2 and mask.shape[0] == batch:
            return [int(x) for x in mask.sum(-1).tolist()]
    except Exception:
        pass
    return [per_seq] * batch


def output_lengths(result: Any, rows: int, steps: int, eos: Any) -> list[int] | None:
    """Each row's generated tokens in ``result`` (``generate()``'s return): up to and with its
    first end-of-sequence token, else all ``steps``."""
    seqs = getattr(result, "sequences", result)
    eos_ids = {int(e) for e in (eos if isinstance(eos, (list, tuple, set)) else [eos])
               if e is not None} if eos is not None else set()
    try:
        shape = tuple(seqs.shape)
        if len(shape) != 2 or shape[0] != rows:
            return None
        if not eos_ids:
            return [steps] * rows
        new = seqs[:, shape[1] - steps:].tolist()
    except Exception:
        return None
    out = []
    for row in new:
        n = next((i + 1 for i, tok in enumerate(row) if tok in eos_ids), len(row))
        out.append(n)
    return out
