"""Reading a JSON snapshot back: ``read_snapshot(path)`` gives a :class:`StoreView` equal to the
one written (write -> read -> write is byte-identical), ``load_snapshot`` the findings, summary
and ranks too. Reading is JSON only, bounded (512 MB, nesting depth) and validated
(:mod:`tuiprof.export.snapshot_check`); anything else is a one-line :class:`TuiprofError`.
docs/snapshot.md describes every field.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TuiprofError, safe_text, safe_tree
from ..store import ConfigData, KernelAggregate, RunningStats, StoreView, TokenRow, compose_view
from ..store.ingest import END_INDEX, TS_INDEX
from ..store.rank_set import RanksView
from ..store.records import A_LEN, A_LEN_OLD, ALLOC, API, K_NAME, KERNEL, KIND, MEMCPY, MEMSET
from ..store.requests import RequestRow, RequestsView
from .snapshot_check import (LONG_INT, MAX_DEPTH, MAX_STRING, MISSING, RANKS_FORMAT, REQUEST_FIELDS, SAMPLE,
                             TOKEN_FIELDS, WORLD_KEYS, TokenRows, check_version, column_problem,
                             free_form_problem, int64_problem, not_a_snapshot, token_rules,
                             validate_snapshot)

MAX_RANKS = 1024
MAX_BYTES = 512 * 1024**2


def _stats(d: dict, where: str) -> RunningStats:
    s = RunningStats.from_dict(d)
    # from_dict casts histogram keys to int; float-valued stats (host_ms) keep their values.
    hist = {k: int(v) for k, v in d["hist"]}
    if sum(hist.values()) != s.count or len(hist) != len(d["hist"]):
        raise not_a_snapshot(where, "statistics histogram does not add up to its count")
    s._hist = hist  # noqa: SLF001 - exact restore, see the comment above
    return s


# raw record lengths allowed per kind (store/records.py; the bracketed fields came later)
_REC_LEN = {KERNEL: (15, 15), MEMCPY: (5, 7), MEMSET: (4, 6), ALLOC: (A_LEN_OLD, A_LEN), API: (5, 5)}


def _record(r: list, where: str) -> tuple:
    kind = r[KIND] if r else None
    lo, hi = _REC_LEN.get(kind, (0, -1))
    if not (lo <= len(r) <= hi):
        raise not_a_snapshot(where, f"malformed raw record {safe_text(r)}")
    named = kind in (KERNEL, API)   # a name (K_NAME, R_NAME), then integers
    if named and not (isinstance(r[K_NAME], str) and len(r[K_NAME]) <= MAX_STRING):
        raise not_a_snapshot(where, f"malformed raw record {safe_text(r)}")
    if not all(type(v) is int for v in r[K_NAME + 1 if named else KIND + 1:]):
        raise not_a_snapshot(where, f"malformed raw record {safe_text(r)}")
    return tuple(r)


def _ends_before_start(r: tuple) -> bool:
    end = END_INDEX.get(r[KIND])
    return end is not None and r[end] < r[TS_INDEX[r[KIND]]]


_TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenRow) if f.name != "busy_cursor")


def _read_part(doc: dict, where: str) -> ConfigData:
    """One configuration's aggregates from its sections (top level or ``configurations``)."""
    kernels = {}
    for k in doc["kernels"]:
        agg = KernelAggregate(k["name"], k["phase"], k["mode"], _stats(k["stats"], where),
                              tuple(k["grid"]), tuple(k["block"]), k["registers"],
                              k["shared_mem"], k["graph_launches"],
                              {tuple(c[:6]): c[6] for c in k["configs"]},
                              k.get("loop_launches", 0), k.get("loop_ns", 0))
        kernels[(agg.name, agg.phase, agg.mode)] = agg
    memcpy = {(m["copy_kind"], m["phase"], m["mode"]): (_stats(m["ns"], where),
                                                        _stats(m["bytes"], where))
              for m in doc["memcpy"]}
    memset = {(m["phase"], m["mode"]): (_stats(m["ns"], where), _stats(m["bytes"], where))
              for m in doc["memset"]}
    token_stats = {(t["phase"], t["mode"]): {n: _stats(s, where) for n, s in t["stats"].items()}
                   for t in doc["token_stats"]}
    return ConfigData(kernels=kernels, memcpy=memcpy, memset=memset,
                      api={n: _stats(s, where) for n, s in doc["api"].items()},
                      nvtx={n: _stats(s, where) for n, s in doc["nvtx"].items()},
                      token_stats=token_stats, allocs=doc["allocs"])


def view_from_snapshot(doc: dict, where: str = "document") -> StoreView:
    """Rebuild the :class:`StoreView` of a validated snapshot document (version 1 documents
    hold one configuration: batch 1)."""
    try:
        key = doc.get("batch", 1)
        tokens = []
        for t in doc["tokens"]:
            if type(t) is TokenRow:
                row = t
                if row.config is MISSING:
                    row.config = key
            else:
                row = _row(t)            # validated: only the schema's (= TokenRow's) fields
                if row.config is MISSING:
                    row.config = key
            tokens.append(row)
        parts = {key: _read_part(doc, where)}
        for c in doc.get("configurations", []):
            if c["batch"] in parts:
                raise not_a_snapshot(where, f"configuration {str(c['batch'])[:20]!r} appears twice")
            parts[c["batch"]] = _read_part(c, where)
        raw, reversed_ = [], 0
        for r in doc["raw"]:
            recs = [_record(x, where) for x in r["records"]]
            kept = [x for x in recs if not _ends_before_start(x)]
            reversed_ += len(recs) - len(kept)
            raw.append((r["seq"], kept))
        counters = dict(doc["counters"])
        if reversed_:   # dropped as the store drops them, and counted with them
            counters["ends_before_start"] = counters.get("ends_before_start", 0) + reversed_
        for t in tokens:
            if isinstance(t.requests, list):
                t.requests = tuple(t.requests)
        return compose_view(
            safe_tree(dict(doc["meta"])), tokens, parts, key, raw=raw, nvml=list(doc["nvml"]),
            counters=counters, collectors=safe_tree(dict(doc["collectors"])),
            events=[tuple(safe_tree(list(e))) for e in doc["events"]],
            overhead=safe_tree(dict(doc["overhead"])),
            output=[safe_text(str(line), 4096) for line in doc.get("output", ())],
            series={str(k): list(v) for k, v in doc.get("series", {}).items()},
            requests=_read_requests(doc, where))
    except TuiprofError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as exc:
        raise not_a_snapshot(where, f"{type(exc).__name__}: {safe_text(exc, 80)}") from None


def _read_requests(doc: dict, where: str) -> RequestsView | None:
    """The requests of a snapshot (None when it has none: a version < 5, or no server)."""
    if "requests" not in doc and "request_stats" not in doc:
        return None
    from array import array  # noqa: PLC0415

    rows = []
    for d in doc.get("requests", ()):
        r = RequestRow(d["id"], d["source"], d["arrival_ns"],
                       **{k: d[k] for k in REQUEST_FIELDS[4:] if k in d})
        r.status, r.reason = d["status"], d.get("reason", "")
        r.warmup = d.get("warmup") is True
        r.token_ns = array("q", d["token_ns"])
        r.steps = array("q", d.get("steps", ()))
        rows.append(r)
    st = doc.get("request_stats") or {"counts": {}, "stats": {}}
    return RequestsView(tuple(r for r in rows if not r.warmup),
                        {k: _stats(v, where) for k, v in st["stats"].items()},
                        dict(st["counts"]), dict(st.get("misuse", {})),
                        dict(st.get("sources", {})), int(st.get("keep", len(rows))),
                        warmup=tuple(r for r in rows if r.warmup))


@dataclass
class Snapshot:
    """A loaded snapshot: the view, the stored findings and summary, the whole document.

    A multi-rank snapshot also has ``ranks`` (every rank); ``view`` is then rank 0's."""

    view: StoreView
    findings: list
    summary: dict
    doc: dict
    ranks: RanksView | None = None


def _read_document(p: Path) -> Any:
    where = str(p)
    try:
        size = p.stat().st_size
        if size > MAX_BYTES:
            raise not_a_snapshot(where, f"{size / 1024**2:.0f} MB is over the {MAX_BYTES // 1024**2} MB limit")
        with open(p, "rb", buffering=0) as fh:
            data = bytearray(size + 1)   # exactly the file (one byte more tells a growing one)
            view, n = memoryview(data), 0
            while n < len(data):
                k = fh.readinto(view[n:])
                if not k:
                    break
                n += k
            view.release()
        if n > MAX_BYTES:
            raise not_a_snapshot(where, f"over the {MAX_BYTES // 1024**2} MB limit")
        del data[n:]
        text = data.decode("utf-8")
        del data
    except FileNotFoundError:
        raise TuiprofError(f"no such snapshot: {p}") from None
    except IsADirectoryError:
        raise not_a_snapshot(where, "it is a directory") from None
    except UnicodeDecodeError:
        raise not_a_snapshot(where, "not UTF-8 text (a gzip file? unpack it first)") from None
    except OSError as exc:
        raise TuiprofError(f"cannot read snapshot {p}: {safe_text(exc.strerror or exc, 120)}") from None
    try:
        doc = parse_document(text)
    except RecursionError:
        raise not_a_snapshot(where, "JSON nested too deeply") from None
    except ValueError as exc:
        raise not_a_snapshot(where, f"invalid JSON ({safe_text(exc, 80)})") from None
    if LONG_INT.search(text):         # a literal that may be beyond int64: look at the values
        problem = int64_problem(doc)
        if problem:
            raise not_a_snapshot(where, problem)
    return doc


# ------------------------------------------------------------------ streaming reader
_FRESH_DICT = object()
_DEFAULTS = tuple(MISSING if f.name == "config" else _FRESH_DICT
                  if f.default is dataclasses.MISSING else f.default
                  for f in dataclasses.fields(TokenRow))


def _row(d: dict, names: dict | None = None) -> TokenRow:
    """A checked token dict as a row, positionally (a tenth of the cost of ``**d``); a
    missing ``config`` is left ``MISSING`` for the reader to fill in. ``names``: one copy of
    each phase, mode and map key across the rows (each row read on its own would hold its
    own copies: half of a row's memory)."""
    row = TokenRow(*map(d.get, TOKEN_FIELDS, _DEFAULTS))
    if row.memcpy_bytes is _FRESH_DICT:
        row.memcpy_bytes = {}
    if names is not None:
        one = names.setdefault
        if type(row.phase) is str:
            row.phase = one(row.phase, row.phase)
        if type(row.mode) is str:
            row.mode = one(row.mode, row.mode)
        m = row.memcpy_bytes
        if type(m) is dict and m:
            row.memcpy_bytes = {one(k, k): v for k, v in m.items()}
        a = row.alloc
        if type(a) is dict and a:
            row.alloc = {one(k, k): v for k, v in a.items()}
    return row


class _NotStreamable(Exception):
    """The document is not laid out as the streaming reader expects: json.loads reads it."""


_DECODER = json.JSONDecoder()
_SCAN = _DECODER.scan_once
_WS = re.compile(r"[ \t\n\r]*")


def parse_document(text: str) -> Any:
    """The JSON document in ``text``, as ``json.loads`` reads it, except that the token rows
    of a snapshot (``tokens``, and each rank's in a multi-rank snapshot) become
    :class:`TokenRow` objects as they are read, each after its schema check: a row's dict never
    outlives its row, so a 500k-step snapshot needs a fraction of the memory (and none of the
    time) that a million dicts would. Anything unusual falls back to ``json.loads``."""
    try:
        i = _WS.match(text, 0).end()
        if not text.startswith("{", i):
            raise _NotStreamable
        doc, i = _object(text, i, top=True)
        if _WS.match(text, i).end() != len(text):
            raise _NotStreamable
        return doc
    except (_NotStreamable, StopIteration, IndexError, ValueError):
        return json.loads(text)


def _object(text: str, i: int, top: bool = False, rank: bool = False) -> tuple[dict, int]:
    out: dict = {}
    i = _WS.match(text, i + 1).end()
    if text[i] == "}":
        return out, i + 1
    while True:
        if text[i] != '"':
            raise _NotStreamable
        key, i = _SCAN(text, i)
        i = _WS.match(text, i).end()
        if text[i] != ":":
            raise _NotStreamable
        i = _WS.match(text, i + 1).end()
        if key == "tokens" and (top or rank) and text[i] == "[":
            value, i = _token_array(text, i)
        elif key == "ranks" and top and text[i] == "[":
            value, i = _array(text, i, lambda t, j: _object(t, j, rank=True)
                              if t[j] == "{" else _SCAN(t, j))
        else:
            value, i = _SCAN(text, i)
        out[key] = value
        i = _WS.match(text, i).end()
        c = text[i]
        if c == ",":
            i = _WS.match(text, i + 1).end()
        elif c == "}":
            return out, i + 1
        else:
            raise _NotStreamable


def _array(text: str, i: int, element) -> tuple[list, int]:
    out: list = []
    i = _WS.match(text, i + 1).end()
    if text[i] == "]":
        return out, i + 1
    while True:
        value, i = element(text, i)
        out.append(value)
        i = _WS.match(text, i).end()
        c = text[i]
        if c == ",":
            i = _WS.match(text, i + 1).end()
        elif c == "]":
            return out, i + 1
        else:
            raise _NotStreamable


def _token_array(text: str, i: int) -> tuple[list, int]:
    """The token rows of a snapshot, each built as soon as it is read (its dict is dropped);
    every column is then checked against the schema at C speed (:func:`column_problem`). A
    row with other keys than the schema's stays a dict, for the validator to report."""
    rows = TokenRows()
    sample: list = []
    _order, _allowed_, _minimum, _maps, _strings, required, known = token_rules()
    append, match, scan, row_of = rows.append, _WS.match, _SCAN, _row
    names: dict = {}
    n = 0
    i = match(text, i + 1).end()
    if text[i] != "]":
        while True:
            d, i = scan(text, i)
            if n < SAMPLE // 2 or (n % 499 == 0 and len(sample) < SAMPLE):
                sample.append(d)
            if type(d) is dict and required <= d.keys() <= known:
                append(row_of(d, names))
            else:
                append(d)
            n += 1
            i = match(text, i).end()
            c = text[i]
            if c == ",":
                i = match(text, i + 1).end()
            elif c == "]":
                break
            else:
                raise _NotStreamable
    rows.sample = sample
    rows.problem = column_problem(rows)
    return rows, i + 1


def _ranks_document(doc: dict, where: str) -> RanksView:
    """Check the multi-rank wrapper and every rank's document; rebuild all views."""
    check_version(doc.get("schema_version"), where)
    ranks, world = doc.get("ranks"), doc.get("world")
    if not isinstance(ranks, list) or not 1 <= len(ranks) <= MAX_RANKS:
        raise not_a_snapshot(where, f"'ranks' must be a list of 1 to {MAX_RANKS} rank snapshots")
    if not isinstance(world, dict) or not isinstance(doc.get("findings", []), list):
        raise not_a_snapshot(where, "'world' must be an object and 'findings' a list")
    for key in ("world", "findings"):
        problem = free_form_problem(doc.get(key, []), MAX_DEPTH)
        if problem:
            raise not_a_snapshot(where, f"'{key}' {problem}")
    views = []
    for r, part in enumerate(ranks):
        at = f"{where} rank {r}"
        validate_snapshot(part, at, all_records=False)
        views.append(view_from_snapshot(part, at))
    return RanksView(tuple(views), {k: v for k, v in world.items() if k in WORLD_KEYS})


def load_snapshot(path: str | Path) -> Snapshot:
    """Read, bound-check, validate and rebuild a snapshot file (one rank or all ranks)."""
    p = Path(path)
    where = str(p)
    doc = _read_document(p)
    if isinstance(doc, dict) and doc.get("format") == RANKS_FORMAT:
        rv = _ranks_document(doc, where)
        first = doc["ranks"][0]
        return Snapshot(rv[0], list(doc.get("findings", [])), dict(first.get("summary", {})),
                        doc, rv)
    validate_snapshot(doc, where, all_records=False)
    view = view_from_snapshot(doc, where)
    return Snapshot(view, list(doc.get("findings", [])), dict(doc.get("summary", {})), doc)


def read_snapshot(path: str | Path) -> StoreView:
    """The :class:`StoreView` stored in a snapshot file (see :func:`load_snapshot`); rank 0's
    for a multi-rank snapshot (:func:`read_any_snapshot` gives every rank)."""
    return load_snapshot(path).view


def read_any_snapshot(path: str | Path) -> StoreView | RanksView:
    """A single-rank snapshot's :class:`StoreView`, or a multi-rank one's :class:`RanksView`."""
    snap = load_snapshot(path)
    return snap.ranks if snap.ranks is not None else snap.view
