"""The collector seam: what every producer of a session's data looks like.

A collector runs on threads of its own (or on CUPTI's) and hands what it produces to the store
through one entry, :meth:`tuiprof.store.SessionStore.ingest` (``RECORDS`` for CUPTI record
tuples, a kind of its own for samples). The profiler starts the collectors of
:data:`tuiprof.collect.registry.COLLECTORS` in table order before the model loads and stops
them in reverse order after it; a collector that cannot run here raises
:class:`CollectorUnavailable` from :meth:`Collector.start`, and the session goes on without it
with the one-line reason on the status line.

Contract:

* ``name``: the key of its state in ``store.collectors`` (``set_collector``);
* ``start()``: begin producing; returns at once (work happens on its threads); raises
  :class:`CollectorUnavailable` with a one-line reason;
* ``stop()``: hand over everything produced so far, then stop its threads; safe to call twice
  and after a failed ``start``;
* ``cost_s``: CPU seconds its threads spent (the live overhead figure counts it).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


class CollectorUnavailable(RuntimeError):
    """A collector cannot run here; the message is one line for the status bar."""


@runtime_checkable
class Collector(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def cost_s(self) -> float: ...
