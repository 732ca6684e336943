"""The UI process's copy of a session store that lives in another process.

:meth:`SessionStore.changes` sends what changed; :class:`Mirror` applies it and answers
``view()`` like the store itself, so the UI reads a remote session through the same
:class:`~tuiprof.store.StoreView` as a local one.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from ..store import SessionStore, StoreView


def _empty_records() -> dict:
    v = SessionStore(series_len=1).view(raw=False)
    return {"kernels": v.kernels, "memcpy": v.memcpy, "memset": v.memset, "api": v.api,
            "allocs": v.allocs}


class Mirror:
    """Token rows, NVML samples and aggregates of a remote store, bounded like the store."""

    def __init__(self, series_len: int = 2048, nvml_len: int = 6000,
                 output_len: int = 1000) -> None:
        self.series_len = series_len
        self.nvml_len = nvml_len
        self._output: deque = deque(maxlen=output_len)
        self.generation = -1
        self.meta: dict = {}
        self._tokens: deque = deque(maxlen=series_len)
        self._nvml: deque = deque(maxlen=nvml_len)
        empty = SessionStore(series_len=1).view(raw=False)
        self._parts: dict[str, Any] = {k: getattr(empty, k) for k in (
            "counters", "collectors", "token_stats", "nvtx", "overhead", "events")}
        self._records: dict = _empty_records()
        self._raw: list = []

    def apply(self, delta: dict) -> None:
        """Fold one delta from :meth:`SessionStore.changes` into the mirror."""
        if delta["full"] or delta["generation"] != self.generation:
            n = delta.get("series_len") or self.series_len
            self._tokens = deque(maxlen=n)
            self._nvml = deque(maxlen=self.nvml_len)
            self._records = _empty_records()
            self._raw = []
            self._output.clear()
            self.generation = delta["generation"]
        self.meta = delta["meta"]
        self._merge_tokens(delta["tokens"])
        self._nvml.extend(delta["nvml"])
        self._output.extend(delta.get("output", ()))
        for key in ("counters", "collectors", "token_stats", "nvtx", "overhead"):
            self._parts[key] = delta[key]
        if delta["events"] is not None:
            self._parts["events"] = delta["events"]
        if delta["records"] is not None:
            self._records = delta["records"]
        if delta["raw"] is not None:
            self._raw = delta["raw"]

    def _merge_tokens(self, rows: list) -> None:
        if not rows:
            return
        tokens = self._tokens
        first = rows[0].seq
        # Rows from ``first`` on are replaced (they changed or are new); older rows stay.
        while tokens and tokens[-1].seq >= first:
            tokens.pop()
        tokens.extend(rows)

    def view(self, raw: bool = True) -> StoreView:
        """The mirrored session as a :class:`StoreView` (raw records as last fetched)."""
        p, r = self._parts, self._records
        return StoreView(
            meta=dict(self.meta), tokens=list(self._tokens), kernels=r["kernels"],
            memcpy=r["memcpy"], memset=r["memset"], api=r["api"],
            token_stats=p["token_stats"], allocs=r["allocs"], nvml=list(self._nvml),
            raw=list(self._raw) if raw else [], counters=p["counters"],
            collectors=p["collectors"], events=p["events"], nvtx=p["nvtx"],
            overhead=p["overhead"], output=list(self._output))
