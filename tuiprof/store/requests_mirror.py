"""The UI process's copy of a session's requests: a :class:`~.requests.RequestBook`'s rows and
aggregates as its :meth:`~.requests.RequestBook.changes` deltas bring them (the session
process holds the book; :mod:`tuiprof.sessions.mirror` carries the deltas)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .requests import EMPTY, RequestRow, RequestsView


class RequestsMirror:
    """The UI process's copy of a :class:`RequestBook` (applies :meth:`RequestBook.changes`)."""

    def __init__(self) -> None:
        self.rows: OrderedDict[Any, RequestRow] = OrderedDict()
        self.rest: dict = {}

    def apply(self, delta: dict | None) -> None:
        if not delta:
            return
        rows = self.rows
        ids = delta.get("ids")
        if ids is not None:
            keep = set(ids)
            for rid in [r for r in rows if r not in keep]:
                del rows[rid]
        for r in delta["rows"]:
            rows[r.id] = r
        if ids is not None:  # the book's order: finished (in finish order), then in flight
            self.rows = OrderedDict((i, rows[i]) for i in ids if i in rows)
        self.rest = {k: delta.get(k, {}) for k in ("stats", "counts", "misuse", "sources", "keep",
                                                    "buckets", "totals")}

    def view(self) -> RequestsView:
        if not self.rest:
            return EMPTY
        done = [r for r in self.rows.values() if r.done and not r.warmup]
        live = [r for r in self.rows.values() if not r.done and not r.warmup]
        return RequestsView(tuple(done + live), self.rest["stats"], self.rest["counts"],
                            self.rest["misuse"], self.rest["sources"], self.rest["keep"] or 0,
                            self.rest["buckets"], self.rest["totals"],
                            tuple(r for r in self.rows.values() if r.warmup))
