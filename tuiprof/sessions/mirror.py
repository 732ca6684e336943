"""The UI process's copy of a session store that lives in another process.

:meth:`SessionStore.changes` sends what changed; :class:`Mirror` applies it and answers
``view()`` like the store itself, so the UI reads a remote session through the same
:class:`~tuiprof.store.StoreView` as a local one, for any batch configuration.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from ..store import NVML, ConfigData, SessionStore, StoreView, compose_view
from ..store.requests_mirror import RequestsMirror


class Mirror:
    """Token rows, sampled series (NVML, …) and aggregates of a remote store, bounded like the
    store."""

    def __init__(self, series_len: int = 2048, nvml_len: int = 6000,
                 output_len: int = 1000) -> None:
        self.series_len = series_len
        self.nvml_len = nvml_len
        self._output: deque = deque(maxlen=output_len)
        self.generation = -1
        self.meta: dict = {}
        self.config: Any = 1
        self._tokens: deque = deque(maxlen=series_len)
        self._series: dict[str, deque] = {NVML: deque(maxlen=nvml_len)}
        self._parts: dict[Any, ConfigData] = {}
        empty = SessionStore(series_len=1).view(raw=False)   # zero counters before a pull
        self._session: dict[str, Any] = {k: getattr(empty, k) for k in (
            "counters", "collectors", "overhead", "events")}
        self._raw: list = []
        self._requests = RequestsMirror()
        self._fleet: dict = {}

    def apply(self, delta: dict) -> None:
        """Fold one delta from :meth:`SessionStore.changes` into the mirror."""
        if delta["full"] or delta["generation"] != self.generation:
            n = delta.get("series_len") or self.series_len
            self._tokens = deque(maxlen=n)
            self._series = {NVML: deque(maxlen=self.nvml_len)}
            self._parts = {}
            self._raw = []
            self._output.clear()
            self._requests = RequestsMirror()
            self.generation = delta["generation"]
        self.meta = delta["meta"]
        self.config = delta["config"]
        self._merge_tokens(delta["tokens"])
        for kind, samples in delta["series"].items():
            ring = self._series.get(kind)
            if ring is None:
                ring = self._series[kind] = deque(maxlen=self.series_len)
            ring.extend(samples)
        self._output.extend(delta.get("output", ()))
        for key in ("counters", "collectors", "overhead"):
            self._session[key] = delta[key]
        if delta["events"] is not None:
            self._session["events"] = delta["events"]
        for key, part in delta["parts"].items():
            old = self._parts.get(key)
            if not delta["records"] and old is not None:  # record aggregates unchanged
                part.kernels, part.memcpy, part.memset = old.kernels, old.memcpy, old.memset
                part.api, part.allocs = old.api, old.allocs
            self._parts[key] = part
        if delta["raw"] is not None:
            self._raw = _merge_raw(self._raw, delta["raw"])
        self._requests.apply(delta.get("requests"))
        if delta.get("fleet") is not None:
            self._fleet = delta["fleet"]

    def _merge_tokens(self, rows: list) -> None:
        if not rows:
            return
        tokens = self._tokens
        first = rows[0].seq
        # Rows from ``first`` on are replaced (they changed or are new); older rows stay.
        while tokens and tokens[-1].seq >= first:
            tokens.pop()
        tokens.extend(rows)

    def as_delta(self, full: bool = True) -> dict:
        """What this mirror holds, as a delta another mirror can apply (``full``: everything;
        else nothing new): a process that has ended is served from its last mirror."""
        s = self._session
        delta = {"full": full, "generation": self.generation, "series_len": self.series_len,
                 "meta": dict(self.meta), "config": self.config, "counters": s["counters"],
                 "collectors": s["collectors"], "overhead": s["overhead"],
                 "tokens": [], "series": {}, "parts": {}, "records": False, "events": None,
                 "raw": None, "output": [], "fleet": self._fleet}
        if full:
            delta.update(tokens=list(self._tokens), parts=dict(self._parts), records=True,
                         series={k: list(v) for k, v in self._series.items()},
                         events=s["events"], output=list(self._output),
                         raw={"keep": [seq for seq, _ in self._raw],
                              "add": [(seq, 0, list(recs)) for seq, recs in self._raw]})
        return delta

    def view(self, raw: bool = True, batch: Any = None) -> StoreView:
        """The mirrored session as a :class:`StoreView` of configuration ``batch`` (default:
        the latest step's; raw records as last fetched)."""
        s = self._session
        key = self.config if batch is None else batch
        return compose_view(dict(self.meta), list(self._tokens), dict(self._parts), key,
                            raw=list(self._raw) if raw else [],
                            nvml=list(self._series[NVML]), counters=s["counters"],
                            collectors=s["collectors"], events=s["events"],
                            overhead=s["overhead"], output=list(self._output),
                            series={k: list(v) for k, v in self._series.items() if k != NVML},
                            requests=self._requests.view(), fleet=self._fleet)


def _merge_raw(held: list, change: dict) -> list:
    """The raw entries after one :func:`tuiprof.store.session._raw_changes`: the kept ones,
    each with its new records appended. Lists are rebuilt, never extended in place: a view
    handed to a findings worker may still be reading the old ones."""
    old = dict(held)
    added = {seq: (start, recs) for seq, start, recs in change["add"]}
    out = []
    for seq in change["keep"]:
        recs = old.get(seq, [])
        if seq in added:
            start, more = added[seq]
            recs = recs[:start] + more
        out.append((seq, recs))
    return out
