"""Step marks for a program's own decode loop: ``with tuiprof.step("decode", tokens=B): ...``.

When the program does not run under ``tuiprof run``, :func:`step` and :func:`mark_prefill`
return one shared object whose ``__enter__``/``__exit__`` do nothing (well under a microsecond,
``bench/overhead/marks_noop.py``), so the marks can stay in the code. Under ``tuiprof run`` the session
points :data:`_sink` at its step recorder (``tuiprof.program.steps``). This module imports
nothing: ``import tuiprof`` stays as cheap as it was.
"""
from __future__ import annotations

__all__ = ["step", "mark_prefill"]


class _NoStep:
    """The context manager handed out when no tuiprof session listens."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOOP = _NoStep()
_sink = None  # set by a tuiprof session: an object with ``api_step(phase, tokens)``


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
