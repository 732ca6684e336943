"""Step marks for a program's own decode loop: ``with tuiprof.step("decode", tokens=B): ...``,
and request marks for a server of one's own: ``tuiprof.request_arrived(id, prompt_tokens=N)``,
``tuiprof.request_token(id, n=1)``, ``tuiprof.request_finished(id, reason="stop")``, and
``tuiprof.request_warmup(id)`` for a request that only warms the server up.

When the program does not run under ``tuiprof run``, :func:`step` and :func:`mark_prefill`
return one shared object whose ``__enter__``/``__exit__`` do nothing, and the request marks
return at once (each well under a microsecond, ``bench/overhead/marks_noop.py``), so the marks can stay
in the code. Under ``tuiprof run`` the session points :data:`_sink` at its step recorder
(``tuiprof.program.steps``) and :data:`_requests` at the store's requests
(``tuiprof.store.requests.RequestBook``). A request mark never raises into the program: a
mistake (an unknown id, a request finished twice, tokens after its finish) is counted and
reported once. This module imports nothing: ``import tuiprof`` stays as cheap as it was.
"""
from __future__ import annotations

__all__ = ["step", "mark_prefill", "request_arrived", "request_token", "request_finished",
           "request_warmup"]


class _NoStep:
    """The context manager handed out when no tuiprof session listens."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP = _NoStep()
_sink = None  # set by a tuiprof session: an object with ``api_step(phase, tokens)``
_requests = None  # set by a tuiprof session: an object with arrived(), tokens(), finished()


def step(name: str = "decode", tokens: int = 1):
    """Mark one step of the program's loop: ``with tuiprof.step("decode", tokens=B): ...``.

    ``name``: ``"prefill"`` for a step that feeds prompts, anything else is a decode step.
    ``tokens``: sequences the step advances (the batch size; tokens/s counts all of them).
    A step ends when the ``with`` block ends, or when the next step begins.
    """
    sink = _sink
    if sink is None:
        return _NOOP
    return sink.api_step(name, tokens)


def mark_prefill(tokens: int = 1):
    """The prefill starts here: ``tuiprof.step("prefill", tokens)``, begun at the call.

    Use it as ``with tuiprof.mark_prefill(tokens=B): ...`` or as a plain call before the
    prefill's forward; a plain call's step lasts until the next step begins.
    """
    sink = _sink
    if sink is None:
        return _NOOP
    return sink.api_step("prefill", tokens, now=True)


def request_arrived(id, prompt_tokens: int = 0, traceparent: str | None = None) -> None:
    """Request ``id`` (any hashable: a string, a number) reached the server now, with a prompt
    of ``prompt_tokens`` tokens. Call it where the server first sees the request (before its
    own parsing and tokenisation): everything until the first token counts in its TTFT.
    ``traceparent``: the request's W3C trace context (its HTTP header), so that with
    ``--otlp`` its span joins the caller's trace."""
    book = _requests
    if book is None:
        return
    try:
        book.arrived(id, prompt_tokens, "api", traceparent=traceparent)
    except Exception:  # never into the server
        pass


def request_token(id, n: int = 1) -> None:
    """Request ``id`` got ``n`` more output tokens now (when the server has them to send)."""
    book = _requests
    if book is None:
        return
    try:
        book.tokens(id, n)
    except Exception:
        pass


def request_finished(id, reason: str = "") -> None:
    """Request ``id`` is done now (``reason``: ``"stop"``, ``"length"``, ``"error"``, …)."""
    book = _requests
    if book is None:
        return
    try:
        book.finished(id, reason)
    except Exception:
        pass


def request_warmup(id) -> None:
    """Request ``id`` only warms the server up (compiles, allocates) before the load it serves:
    call it before the request arrives, or while it is in flight. It is kept whole but apart:
    in no request count, statistic or window (the summary, the requests pane, a sweep's
    cells), and marked ``warmup: true`` in the snapshot."""
    book = _requests
    if book is None:
        return
    try:
        book.warmup(id)
    except Exception:
        pass
