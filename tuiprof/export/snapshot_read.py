"""JSON snapshot of a session: everything the UI shows, reopenable with ``tuiprof view``.

``write_snapshot(view, path)`` writes it atomically; ``read_snapshot(path)`` gives back a
:class:`StoreView` equal to the one written (write -> read -> write is byte-identical).
Reading is JSON only, bounded (512 MB, nesting depth) and validated against
``snapshot.schema.json``; anything else is a one-line :class:`TuiprofError`.
docs/snapshot.md describes every field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any, Iterable

from .. import __version__
from ..errors import TuiprofError, safe_text, safe_tree
from ..store import (ConfigData, KernelAggregate, RunningStats, StoreView, TokenRow, compose_view,
                     config_order)
from ..store.rank_set import RanksView
from ..store.requests import RequestRow, RequestsView
from ..store.records import COPY_KINDS, DIRECTION
from ._atomic import atomic_write_bytes
from .names import demangle
from .summary import summary

SCHEMA_VERSION = 8       # 2: batch configurations ("batch", "configurations", token "config");
                         # 3: token "rerecord"; 4: token "model_*"/"loop_*" (a step's kernels
                         # launched inside and outside its model forward), kernel "loop_*";
                         # 5: token "attached" (CUPTI attached while the step ran: traced and
                         # untraced steps told apart) and the token statistics "untraced_*",
                         # "traced_step_ms", "traced_gpu_ms"
                         # 6: a server's "requests" and "request_stats", token "requests",
                         # "prefills", "prefill_tokens", "decode_tokens", "pending", "running",
                         # "kv_used", "kv_total"
                         # 7: request "warmup" (a warm-up request, apart from every count)
                         # 8: request "http_status" and "tokens_from" (requests seen through
                         # the proxy, from outside the engine)
FORMAT = "tuiprof-snapshot"
RANKS_FORMAT = "tuiprof-ranks-snapshot"   # a tensor-parallel session: one snapshot per rank
MAX_RANKS = 1024
MAX_BYTES = 512 * 1024**2
MAX_DEPTH = 32           # nesting allowed inside free-form sections (meta, overhead, findings)
MAX_STRING = 65536       # characters in one string or key (kernel names are bounded alike)
SCHEMA_PATH = Path(__file__).with_name("snapshot.schema.json")

# Meta keys a snapshot keeps; anything else (environment, paths, user names) is dropped.
META_KEYS = frozenset({
    "source", "recording", "device", "device_index", "sm_count", "driver", "cuda", "torch",
    "transformers", "tuiprof", "model", "model_def", "params", "dtype", "weights", "mode",
    "prefill_mode", "prompt_tokens", "decode_tokens", "batch", "max_len", "ring_tokens",
    "seed", "compile_s", "started_utc", "share_host", "device_name", "family", "origin",
    "study", "non_embedding_params", "weight_bytes", "compile_mode", "prompt", "loop",
    "load_s", "vocab_size", "max_new_tokens", "sample_every", "tracing", "gpu_mem_total_bytes",
    "measured_peaks", "startup", "program", "step_source", "step_sources", "window_ms",
    "step_range",
    "rank", "world_size", "local_rank", "tp", "backend", "clock_sync", "lockstep", "tp_shard",
    "model_params", "test_tp_delay",
    "max_batch", "step_time_sources",
    "process", "job", "cuda",
    "native", "auto_steps",
    "request_sources", "load", "proxy",
    "feeds",
})
# What a multi-rank snapshot says about the whole job (its "world" section).
WORLD_KEYS = frozenset({"world_size", "launcher", "failure", "clock", "tp_reference",
                        "notices", "processes_dropped", "feeds"})
HOST_KEY = "host"        # kept only when meta["share_host"] is True


# ------------------------------------------------------------------ helpers
def _scrub_str(s: str) -> str:
    """Path-like strings lose their directories (no home paths in a shared file)."""
    if s.startswith(("/", "~")) or "\\" in s or os.path.expanduser("~") in s:
        return Path(s.replace("\\", "/")).name
    return s


def _jsonable(obj: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: str keys, lists for tuples, None for non-finite floats."""
    if depth > MAX_DEPTH:
        return None
    if obj is None or isinstance(obj, (bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj), depth + 1)
    return str(obj)


def _scrub(obj: Any) -> Any:
    if isinstance(obj, str):
        return _scrub_str(obj)
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def clean_meta(meta: dict) -> dict:
    """The part of ``meta`` a snapshot may carry (see ``META_KEYS``)."""
    out = {k: v for k, v in meta.items() if k in META_KEYS}
    if meta.get("share_host") is True and HOST_KEY in meta:
        out[HOST_KEY] = meta[HOST_KEY]
    out = _jsonable(out)
    return {k: (v if k == HOST_KEY else _scrub(v)) for k, v in out.items()}


def stats_dict(s: RunningStats) -> dict:
    """RunningStats in JSON form, plus the derived median and stddev for other readers."""
    d = s.to_dict()
    d["median"] = s.median
    d["stddev"] = s.stddev
    return d


def _finding_dict(f: Any) -> Any:
    if isinstance(f, dict):
        return _jsonable(f)
    to_dict = getattr(f, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    if dataclasses.is_dataclass(f) and not isinstance(f, type):
        return _jsonable(dataclasses.asdict(f))
    return {"text": str(f)}


def _findings(fn, arg: Any) -> list:
    """``fn(arg)`` as a list, or ``[]`` when the analysis fails: a bug there must not lose a
    snapshot."""
    try:
        return list(fn(arg))
    except Exception:
        return []


def default_findings(view: StoreView) -> list:
    """The findings of ``view`` (``[]`` when the analysis fails)."""
    from ..analysis.findings import find  # noqa: PLC0415 - the analysis loads numpy
    return _findings(find, view)


# ------------------------------------------------------------------ writing
def _part_sections(part: ConfigData) -> dict:
    """The aggregate sections of one configuration (kernels, memcpy, memset, token_stats, api,
    nvtx, allocs), sorted so that the bytes are canonical."""
    kernels = []
    for key in sorted(part.kernels, key=lambda k: (k[2], k[1], k[0])):
        a = part.kernels[key]
        kernels.append({
            "name": a.name, "demangled": demangle(a.name), "phase": a.phase, "mode": a.mode,
            "stats": stats_dict(a.stats), "grid": list(a.grid), "block": list(a.block),
            "registers": a.registers, "shared_mem": a.shared_mem,
            "graph_launches": a.graph_launches,
            "configs": [[*cfg, n] for cfg, n in a.configs.items()],
            "loop_launches": a.loop_launches, "loop_ns": a.loop_ns,
        })
    memcpy = [{"copy_kind": k[0], "kind_name": COPY_KINDS.get(k[0], "Unknown"),
               "direction": DIRECTION.get(k[0], "other"), "phase": k[1], "mode": k[2],
               "ns": stats_dict(p[0]), "bytes": stats_dict(p[1])}
              for k, p in sorted(part.memcpy.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0]))]
    memset = [{"phase": k[0], "mode": k[1], "ns": stats_dict(p[0]), "bytes": stats_dict(p[1])}
              for k, p in sorted(part.memset.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    token_stats = [{"phase": k[0], "mode": k[1],
                    "stats": {n: stats_dict(s) for n, s in v.items()}}
                   for k, v in sorted(part.token_stats.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
    return {"kernels": kernels, "memcpy": memcpy, "memset": memset, "token_stats": token_stats,
            "api": {n: stats_dict(s) for n, s in part.api.items()},
            "nvtx": {n: stats_dict(s) for n, s in part.nvtx.items()},
            "allocs": _jsonable(part.allocs)}


def snapshot_dict(view: StoreView, findings: Iterable | None = None,
                  raw_tokens: int | None = None) -> dict:
    """The snapshot document of ``view``; ``findings`` default to the analysis's.

    The top-level sections are the view's batch configuration (``batch``); every other
    configuration of the session is in ``configurations``, and ``tokens`` holds the token
    rows of all of them. ``raw_tokens`` keeps the raw records of only the last N tokens
    (default: all in view).
    """
    if findings is None:
        findings = default_findings(view)
    raw = list(view.raw) if raw_tokens is None else list(view.raw)[-raw_tokens:] if raw_tokens > 0 else []
    others = [{"batch": k, **_part_sections(part)}
              for k, part in sorted(view.configs.items(), key=lambda kv: config_order(kv[0]))
              if k != view.batch]
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "tuiprof": __version__,
        "meta": clean_meta(view.meta),
        "summary": summary(view),
        "batch": _jsonable(view.batch),
        "tokens": [_jsonable(t.to_dict()) for t in (view.timeline or view.tokens)],
        **_part_sections(view.part()),
        "configurations": others,
        "nvml": [_jsonable(s) for s in view.nvml],
        **({"series": {k: [_jsonable(s) for s in v] for k, v in view.series.items()}}
           if view.series else {}),
        "raw": [{"seq": seq, "records": [list(r) for r in recs]} for seq, recs in raw],
        "counters": _jsonable(view.counters),
        "collectors": _jsonable(view.collectors),
        "events": [_jsonable(list(e)) for e in view.events],
        "overhead": _jsonable(view.overhead),
        "findings": [_finding_dict(f) for f in findings],
        "output": [str(line) for line in view.output],
        **(_request_sections(view.requests) if view.requests else {}),
    }


# request fields written as they are (the rest: derived, or the arrays)
_REQUEST_FIELDS = ("source", "status", "reason", "arrival_ns", "queued_ns", "first_step_ns",
                   "first_step_seq", "first_token_ns", "last_token_ns", "finish_ns",
                   "prompt_tokens", "output_tokens", "kv_blocks", "prefill_steps",
                   "decode_steps", "shared", "preemptions", "model_ns", "traceparent",
                   "app_ns", "client_id", "http_status", "tokens_from")


def _request_id(rid: Any) -> Any:
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else str(rid)


def request_dict(r: RequestRow) -> dict:
    """One request's entry: its fields, every token's time, its steps, and the derived
    ``queue_ms``, ``ttft_ms``, ``e2e_ms``, ``outside_ms`` and ``itl_ms`` (statistics)."""
    from ..analysis.requests import itl_summary, outside_ms  # noqa: PLC0415

    d = {"id": _request_id(r.id), **{k: getattr(r, k) for k in _REQUEST_FIELDS},
         "token_ns": list(r.token_ns), "steps": list(r.steps),
         "before_app_ms": r.before_app_ms,
         "queue_ms": r.queue_ms, "ttft_ms": r.ttft_ms, "e2e_ms": r.e2e_ms,
         "outside_ms": outside_ms(r), "itl_ms": itl_summary(r)}
    if r.warmup:    # served before the load: apart from every count (docs/serving.md)
        d["warmup"] = True
    return _jsonable(d)


def _request_sections(req: RequestsView) -> dict:
    return {"requests": [request_dict(r) for r in (*req.warmup, *req.rows)],
            "request_stats": {"counts": dict(req.counts), "misuse": dict(req.misuse),
                              "sources": {str(k): v for k, v in req.sources.items()},
                              "keep": req.keep,
                              "stats": {k: stats_dict(v) for k, v in req.stats.items()}}}


def dumps(doc: dict) -> bytes:
    """Canonical bytes of a snapshot document (sorted keys, compact, ASCII, newline).

    ASCII (``\\u`` escapes) rather than raw UTF-8: one character outside Latin-1 anywhere in
    the file (a "→" in a finding) makes Python hold the whole text at two bytes a character
    when it is read back, which doubled the memory a large snapshot needs to load. It also
    keeps a lone surrogate (valid JSON) exactly."""
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TuiprofError(f"cannot encode snapshot: {exc}") from None
    return text.encode("ascii") + b"\n"


def world_meta(rv: RanksView) -> dict:
    """The ``world`` section: the job's facts and the ranks' clock alignment."""
    meta = {k: v for k, v in rv.meta.items() if k in WORLD_KEYS}
    meta["world_size"] = rv.world_size
    meta["clock"] = rv.clock.to_dict()
    if isinstance(meta.get("failure"), str):  # the rank's log file stays on the machine
        meta["failure"] = re.sub(r"\s*\(log: [^)]*\)", "", meta["failure"])
    return _scrub(_jsonable(meta))


def default_rank_findings(rv: RanksView) -> list:
    """The cross-rank findings of ``rv`` (``[]`` when the analysis fails); for a program's
    processes, those of each torch.distributed job among them."""
    from ..analysis.cross_rank import find_ranks  # noqa: PLC0415
    from ..store.rank_set import is_process_set, jobs  # noqa: PLC0415
    if is_process_set(rv):
        return [f for _, job in jobs(rv) for f in _findings(find_ranks, job)]
    return _findings(find_ranks, rv)


def ranks_snapshot_dict(rv: RanksView, findings: Iterable | None = None,
                        raw_tokens: int | None = None) -> dict:
    """The document of a multi-rank session: ``ranks`` holds one ordinary snapshot document
    per rank (rank order); ``findings`` are the cross-rank ones (docs/snapshot.md)."""
    if findings is None:
        findings = default_rank_findings(rv)
    return {
        "format": RANKS_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "tuiprof": __version__,
        "world": world_meta(rv),
        "findings": [_finding_dict(f) for f in findings],
        "ranks": [snapshot_dict(v, raw_tokens=raw_tokens) for v in rv.views],
    }


def write_snapshot(view: StoreView | RanksView, path: str | Path, findings: Iterable | None = None,
                   raw_tokens: int | None = None) -> Path:
    """Write the snapshot of ``view`` (one rank, or all ranks of a :class:`RanksView`) to
    ``path`` atomically; returns the path."""
    if isinstance(view, RanksView):
        return atomic_write_bytes(path, dumps(ranks_snapshot_dict(view, findings, raw_tokens)))
    return atomic_write_bytes(path, dumps(snapshot_dict(view, findings, raw_tokens)))


# ------------------------------------------------------------------ reading
@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of the snapshot (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema  # noqa: PLC0415

    cls = jsonschema.validators.validator_for(schema())
    return cls(schema())


def _bad(where: str, why: str) -> TuiprofError:
    # keys and values quoted from the file may hold control characters: TuiprofError escapes
    return TuiprofError(f"snapshot {where} is not a tuiprof snapshot: {safe_text(why, 300)}")


def _free_form_problem(obj: Any, limit: int) -> str | None:
    """Why a free-form section is refused (too deep, a gigantic string or key), else None."""
    stack = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return f"is nested deeper than {limit}"
        if isinstance(o, str):
            if len(o) > MAX_STRING:
                return f"holds a string of {len(o):,} characters (the limit is {MAX_STRING:,})"
        elif isinstance(o, dict):
            for k, v in o.items():
                if len(k) > MAX_STRING:
                    return f"holds a key of {len(k):,} characters (the limit is {MAX_STRING:,})"
                stack.append((v, d + 1))
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o if isinstance(v, (dict, list, str)))
    return None


def _check_version(ver: Any, where: str) -> None:
    if not isinstance(ver, int) or isinstance(ver, bool) or ver < 1:
        raise _bad(where, f"schema_version {str(ver)[:20]!r} is not a positive integer")
    if ver > SCHEMA_VERSION:
        raise TuiprofError(f"snapshot schema version {ver} is newer than this tuiprof reads "
                           f"({SCHEMA_VERSION}); upgrade tuiprof")


def validate_snapshot(obj: Any, where: str = "document", all_records: bool = True) -> None:
    """Check a decoded snapshot: format and version first, then the JSON Schema.

    ``all_records=False`` checks only the first records of each token against the schema
    (fast path for :func:`load_snapshot`, which then checks every record while rebuilding).
    """
    if not isinstance(obj, dict):
        raise _bad(where, f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("format") != FORMAT:
        raise _bad(where, f"format is {str(obj.get('format'))[:40]!r}, not {FORMAT!r}")
    _check_version(obj.get("schema_version"), where)
    doc = dict(obj)
    # The two long arrays (a token row per step, an NVML sample per 100 ms) are checked one
    # element at a time by rules compiled from the schema (checked against jsonschema's
    # verdict in the tests); the schema itself then runs on a sample of them and the rest.
    checked = set()
    for key, check, sub in (("tokens", _token_problem, "token"), ("nvml", _nvml_problem, None)):
        items = obj.get(key)
        if isinstance(items, list):
            _check_items(items, check, sub, key, where)
            doc[key] = _sample(items)
            checked.add(key)
    for key in ("meta", "overhead", "findings", "allocs", "nvml", "series", "tokens", "counters",
                "collectors", "summary", "events", "api", "nvtx", "output",
                "configurations", "requests", "request_stats"):
        problem = (_free_form_problem(obj[key], MAX_DEPTH)
                   if key in obj and key not in checked else None)
        if problem:
            raise _bad(where, f"'{key}' {problem}")
    import jsonschema  # noqa: PLC0415 - only readers need it

    if not all_records and isinstance(obj.get("raw"), list):
        doc["raw"] = [dict(r, records=r["records"][:4])
                      if isinstance(r, dict) and isinstance(r.get("records"), list) else r
                      for r in obj["raw"]]
    err = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if err is not None:
        at = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise _bad(where, f"{at}: {err.message[:120]}")


SAMPLE = 256     # elements of a long array that the full JSON Schema checks as well


def _sample(items: list) -> list:
    """The first and last elements and an even spread between, at most ``SAMPLE`` (rows
    already built by the streaming reader stand in as their dicts)."""
    if isinstance(items, _Rows):
        return items.sample
    if len(items) <= SAMPLE:
        return items
    step = len(items) / (SAMPLE - 1)
    return [items[min(len(items) - 1, int(i * step))] for i in range(SAMPLE)]


def _check_items(items: list, check, sub: str | None, key: str, where: str) -> None:
    """Every element of a long array by its compiled rule; the first bad one is reported with
    jsonschema's own words where it has them."""
    if isinstance(items, _Rows):      # built by the streaming reader, checked by columns
        if items.problem is None:
            return
        i, problem = items.problem
        raise _bad(where, f"{key}/{i}: {problem}")
    for i, item in enumerate(items):
        problem = check(item)
        if problem is None:
            continue
        if sub is not None:
            err = _sub_error(sub, item)
            if err is not None:
                at = "/".join(str(p) for p in (key, i, *err.absolute_path))
                raise _bad(where, f"{at}: {err.message[:120]}")
        raise _bad(where, f"{key}/{i}: {problem}")


def _sub_error(name: str, item: Any) -> Any:
    import jsonschema  # noqa: PLC0415

    sc = schema()
    cls = jsonschema.validators.validator_for(sc)
    v = cls({"$defs": sc["$defs"], "$ref": f"#/$defs/{name}"})
    return jsonschema.exceptions.best_match(v.iter_errors(item))


# ------------------------------------------------------------------ compiled rules
_INTEGER, _NUMBER = "integer", "number"
_PY = {"string": (str,), "boolean": (bool,), "null": (type(None),), "object": (dict,),
       "array": (list,), _NUMBER: (int, float), _INTEGER: (int,)}


class _Missing:
    pass


_MISSING = _Missing()


def _allowed(spec: dict) -> tuple[frozenset, bool]:
    """The Python types a JSON Schema ``type`` allows, and whether it is an integer (a float
    with an integral value passes too, as jsonschema has it)."""
    names = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
    types = {t for n in names for t in _PY[n]}
    return frozenset(types), _INTEGER in names and _NUMBER not in names


@lru_cache(maxsize=1)
def _token_rules() -> tuple:
    d = schema()["$defs"]["token"]
    props = d["properties"]
    order = tuple(sorted(props))
    allowed = tuple(_allowed(props[k]) for k in order)
    minimum = tuple((k, props[k]["minimum"]) for k in order if "minimum" in props[k])
    maps = tuple((k, _allowed(props[k]["additionalProperties"])[0]) for k in order
                 if isinstance(props[k].get("additionalProperties"), dict))
    strings = tuple(k for k in order if str in _allowed(props[k])[0])
    return (order, allowed, minimum, maps, strings, frozenset(d["required"]), frozenset(props))


_GOOD_SIGNATURES: set = set()   # type signatures of token rows found good (most rows share few)


def _token_problem(t: Any) -> str | None:
    """Why a token row breaks the schema (``$defs/token``), or None. Nesting and string
    lengths are bounded here too (the free-form check is not run over the rows).

    The common case costs a few C-level passes over the row: its keys, the tuple of its
    values' types (a signature already found good), the minimums, its two small maps; any
    doubt goes to :func:`_token_problem_in_full`, which names the problem."""
    if type(t) is not dict:
        return _token_problem_in_full(t)
    order, _allowed_, minimum, maps, strings, required, known = _token_rules()
    keys = t.keys()
    if not (required <= keys <= known) \
            or tuple(map(type, map(t.get, order, repeat(_MISSING)))) not in _GOOD_SIGNATURES \
            or min(map(t.get, _min_keys_cached(), repeat(0))) < 0 \
            or max(map(len, filter(_is_str, map(t.get, strings))), default=0) > MAX_STRING:
        return _token_problem_in_full(t)
    for k, types in maps:
        m = t.get(k)
        if type(m) is dict and m and (not set(map(type, m.values())) <= types
                                      or max(map(len, m)) > MAX_STRING):
            return _token_problem_in_full(t)
    return None


@lru_cache(maxsize=1)
def _min_keys_cached() -> tuple:
    minimum = _token_rules()[2]
    assert {least for _k, least in minimum} == {0}, "the fast path assumes every minimum is 0"
    return tuple(k for k, _least in minimum)


def _is_str(v: Any) -> bool:
    return type(v) is str


def _token_problem_in_full(t: Any) -> str | None:
    if type(t) is not dict:
        return f"{safe_text(t, 40)} is not of type 'object'"
    order, allowed, minimum, maps, strings, required, known = _token_rules()
    keys = t.keys()
    if not required <= keys:
        return f"{sorted(required - keys)[0]!r} is a required property"
    if not keys <= known:
        return f"Additional properties are not allowed ({sorted(keys - known)[0]!r} was unexpected)"
    sig = tuple(map(type, map(t.get, order, repeat(_MISSING))))
    integral = True
    for k, typ, (types, integer) in zip(order, sig, allowed):
        if typ is _Missing or typ in types:
            continue
        v = t[k]
        if integer and typ is float and v.is_integer():
            integral = False        # value-dependent: this signature is not remembered
            continue
        return f"{k}: {safe_text(v, 40)} is not of type {props_type(k)}"
    for k, least in minimum:
        v = t.get(k)
        if v is not None and v < least:
            return f"{k}: {v} is less than the minimum of {least}"
    for k, types in maps:
        m = t.get(k)
        if type(m) is dict:
            for mk, mv in m.items():
                tv = type(mv)
                if tv not in types and not (int in types and tv is float and mv.is_integer()):
                    return f"{k}/{safe_text(mk, 40)}: {safe_text(mv, 40)} is not allowed"
                if tv is float and float not in types:
                    integral = False
                if len(mk) > MAX_STRING:
                    return f"{k} holds a key of {len(mk):,} characters (the limit is {MAX_STRING:,})"
    for k in strings:
        v = t.get(k)
        if type(v) is str and len(v) > MAX_STRING:
            return f"{k} holds a string of {len(v):,} characters (the limit is {MAX_STRING:,})"
    if integral and len(_GOOD_SIGNATURES) < 4096:
        _GOOD_SIGNATURES.add(sig)
    return None


def _column_problem(rows: list) -> tuple | None:
    """The first row (index, why) whose values break the token schema, checked column by
    column: each field's set of value types, minimums and string lengths come from C-level
    passes over all rows (a few hundred ms for 500,000 rows, where a row-by-row check took
    seconds). Only a column with something unexpected is looked at row by row."""
    built = [r for r in rows if type(r) is TokenRow]
    if len(built) != len(rows):
        i = next(i for i, r in enumerate(rows) if type(r) is not TokenRow)
        return i, _token_problem_in_full(rows[i]) or "malformed token row"
    if not rows:
        return None
    order, allowed, minimum, maps, strings, _required, _known = _token_rules()
    suspect: set[int] = set()
    for k, (types, integer) in zip(order, allowed):
        col = list(map(attrgetter(k), rows))
        kinds = set(map(type, col))
        if k == "config":
            kinds.discard(_Missing)
        if not kinds <= types:
            suspect.update(i for i, v in enumerate(col) if type(v) not in types)
    for k, least in minimum:
        col = map(attrgetter(k), rows)
        if min(col, key=_num_or_min, default=least) < least:
            suspect.update(i for i, r in enumerate(rows) if _num_or_min(getattr(r, k)) < least)
    for k in strings:
        lens = list(map(len, filter(_is_str, map(attrgetter(k), rows))))
        if lens and max(lens) > MAX_STRING:
            suspect.update(i for i, r in enumerate(rows)
                           if type(getattr(r, k)) is str and len(getattr(r, k)) > MAX_STRING)
    for k, types in maps:
        ms = [m for m in map(attrgetter(k), rows) if type(m) is dict]
        kinds = set(map(type, chain.from_iterable(map(dict.values, ms))))
        longest = max(map(len, chain.from_iterable(ms)), default=0)
        if not kinds <= types or longest > MAX_STRING:
            suspect.update(i for i, r in enumerate(rows) if type(getattr(r, k)) is dict)
    for i in sorted(suspect):
        why = _token_problem_in_full(_as_dict(rows[i]))
        if why is not None:
            return i, why
    return None


def _num_or_min(v: Any) -> float:
    return v if type(v) in (int, float) else float("inf")


def _as_dict(row: TokenRow) -> dict:
    d = row.to_dict()
    if d.get("config") is _MISSING:
        del d["config"]
    return d


def props_type(k: str) -> str:
    spec = schema()["$defs"]["token"]["properties"][k]["type"]
    return repr(spec) if isinstance(spec, str) else " or ".join(map(repr, spec))


def _nvml_problem(s: Any) -> str | None:
    """Why an NVML sample breaks the schema (an object: integer ``ts_ns``, numbers or null)."""
    if type(s) is not dict:
        return f"{safe_text(s, 40)} is not of type 'object'"
    ts = s.get("ts_ns", _MISSING)
    if ts is _MISSING:
        return "'ts_ns' is a required property"
    if not (type(ts) is int or (type(ts) is float and ts.is_integer())):
        return f"ts_ns: {safe_text(ts, 40)} is not of type 'integer'"
    if not set(map(type, s.values())) <= _NVML_TYPES:
        bad = next(v for v in s.values() if type(v) not in _NVML_TYPES)
        return f"{safe_text(bad, 40)} is not of type 'number', 'null'"
    for k in s:
        if len(k) > MAX_STRING:
            return f"holds a key of {len(k):,} characters (the limit is {MAX_STRING:,})"
    return None


_NVML_TYPES = frozenset({int, float, type(None)})


def _stats(d: dict, where: str) -> RunningStats:
    s = RunningStats.from_dict(d)
    # from_dict casts histogram keys to int; float-valued stats (host_ms) keep their values.
    hist = {k: int(v) for k, v in d["hist"]}
    if sum(hist.values()) != s.count or len(hist) != len(d["hist"]):
        raise _bad(where, "statistics histogram does not add up to its count")
    s._hist = hist  # noqa: SLF001 - exact restore, see the comment above
    return s


_REC_LEN = {"K": (15, 15), "C": (5, 7), "S": (4, 6), "A": (6, 11), "R": (5, 5)}


def _record(r: list, where: str) -> tuple:
    lo, hi = _REC_LEN.get(r[0] if r else None, (0, -1))
    if not (lo <= len(r) <= hi):
        raise _bad(where, f"malformed raw record {safe_text(r)}")
    first_int = 2 if r[0] in ("K", "R") else 1
    if r[0] in ("K", "R") and not (isinstance(r[1], str) and len(r[1]) <= MAX_STRING):
        raise _bad(where, f"malformed raw record {safe_text(r)}")
    if not all(type(v) is int for v in r[first_int:]):
        raise _bad(where, f"malformed raw record {safe_text(r)}")
    return tuple(r)


# (start, end) positions of the raw record kinds that have a duration (store/records.py)
_SPAN_AT = {"K": (2, 3), "C": (3, 4), "S": (2, 3), "R": (2, 3)}


def _ends_before_start(r: tuple) -> bool:
    at = _SPAN_AT.get(r[0])
    return at is not None and r[at[1]] < r[at[0]]


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
                if row.config is _MISSING:
                    row.config = key
            else:
                row = _row(t)            # validated: only the schema's (= TokenRow's) fields
                if row.config is _MISSING:
                    row.config = key
            tokens.append(row)
        parts = {key: _read_part(doc, where)}
        for c in doc.get("configurations", []):
            if c["batch"] in parts:
                raise _bad(where, f"configuration {str(c['batch'])[:20]!r} appears twice")
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
        raise _bad(where, f"{type(exc).__name__}: {safe_text(exc, 80)}") from None


def _read_requests(doc: dict, where: str) -> RequestsView | None:
    """The requests of a snapshot (None when it has none: a version < 5, or no server)."""
    if "requests" not in doc and "request_stats" not in doc:
        return None
    from array import array  # noqa: PLC0415

    rows = []
    for d in doc.get("requests", ()):
        r = RequestRow(d["id"], d["source"], d["arrival_ns"],
                       **{k: d[k] for k in _REQUEST_FIELDS[4:] if k in d})
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
            raise _bad(where, f"{size / 1024**2:.0f} MB is over the {MAX_BYTES // 1024**2} MB limit")
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
            raise _bad(where, f"over the {MAX_BYTES // 1024**2} MB limit")
        del data[n:]
        text = data.decode("utf-8")
        del data
    except FileNotFoundError:
        raise TuiprofError(f"no such snapshot: {p}") from None
    except IsADirectoryError:
        raise _bad(where, "it is a directory") from None
    except UnicodeDecodeError:
        raise _bad(where, "not UTF-8 text (a gzip file? unpack it first)") from None
    except OSError as exc:
        raise TuiprofError(f"cannot read snapshot {p}: {safe_text(exc.strerror or exc, 120)}") from None
    try:
        doc = parse_document(text)
    except RecursionError:
        raise _bad(where, "JSON nested too deeply") from None
    except ValueError as exc:
        raise _bad(where, f"invalid JSON ({safe_text(exc, 80)})") from None
    if _LONG_INT.search(text):         # a literal that may be beyond int64: look at the values
        problem = int64_problem(doc)
        if problem:
            raise _bad(where, problem)
    return doc


# Every integer of a snapshot fits a signed 64-bit integer: the SQLite export, numpy and the
# C side of the collectors hold them so (2**64 + 1 crashed `export --sqlite`). JSON numbers
# have no such bound, so a document is checked at load time, for every export and view alike:
# a scan of the text for integer literals of 20 digits or more, or 19 from 9e18 on (C speed;
# nanoseconds since 1970 have 19 digits until 2255), then, only when one is found (it may sit
# in a string), a walk over the decoded values.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_LONG_INT = re.compile(r"(?<![\w.+-])-?(?:\d{20,}|9\d{18})(?![\d.eE])")


def int64_problem(doc: Any) -> str | None:
    """Where ``doc`` (decoded JSON; token rows built or not) holds an integer beyond a signed
    64-bit integer, and which, else None."""
    stack: list = [(doc, "")]
    while stack:
        o, at = stack.pop()
        if type(o) is int:
            if not INT64_MIN <= o <= INT64_MAX:
                text = str(o)
                shown = text if len(text) <= 40 else f"{text[:20]}… ({len(text)} digits)"
                return f"{at.lstrip('/') or 'top level'}: {shown} is beyond a 64-bit integer"
        elif isinstance(o, dict):
            stack.extend((v, f"{at}/{k}") for k, v in o.items() if _holds_int(v))
        elif isinstance(o, (list, tuple)):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(o) if _holds_int(v))
        elif isinstance(o, TokenRow):
            stack.extend((v, f"{at}/{k}") for k in _FIELDS
                         if _holds_int(v := getattr(o, k)))
    return None


def _holds_int(v: Any) -> bool:
    return type(v) is int or isinstance(v, (dict, list, tuple, TokenRow))


# ------------------------------------------------------------------ streaming reader
class _Rows(list):
    """Token rows built while reading, a sample of their dicts for the full schema check, and
    the first problem the column check found: (index, why) or None."""

    sample: list
    problem: tuple | None = None


_FIELDS = tuple(f.name for f in dataclasses.fields(TokenRow))
_FRESH_DICT = object()
_DEFAULTS = tuple(_MISSING if f.name == "config" else _FRESH_DICT
                  if f.default is dataclasses.MISSING else f.default
                  for f in dataclasses.fields(TokenRow))


def _row(d: dict, names: dict | None = None) -> TokenRow:
    """A checked token dict as a row, positionally (a tenth of the cost of ``**d``); a
    missing ``config`` is left ``_MISSING`` for the reader to fill in. ``names``: one copy of
    each phase, mode and map key across the rows (each row read on its own would hold its
    own copies: half of a row's memory)."""
    row = TokenRow(*map(d.get, _FIELDS, _DEFAULTS))
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
    every column is then checked against the schema at C speed (:func:`_column_problem`). A
    row with other keys than the schema's stays a dict, for the validator to report."""
    rows = _Rows()
    sample: list = []
    _order, _allowed_, _minimum, _maps, _strings, required, known = _token_rules()
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
    rows.problem = _column_problem(rows)
    return rows, i + 1


def _ranks_document(doc: dict, where: str) -> RanksView:
    """Check the multi-rank wrapper and every rank's document; rebuild all views."""
    _check_version(doc.get("schema_version"), where)
    ranks, world = doc.get("ranks"), doc.get("world")
    if not isinstance(ranks, list) or not 1 <= len(ranks) <= MAX_RANKS:
        raise _bad(where, f"'ranks' must be a list of 1 to {MAX_RANKS} rank snapshots")
    if not isinstance(world, dict) or not isinstance(doc.get("findings", []), list):
        raise _bad(where, "'world' must be an object and 'findings' a list")
    for key in ("world", "findings"):
        problem = _free_form_problem(doc.get(key, []), MAX_DEPTH)
        if problem:
            raise _bad(where, f"'{key}' {problem}")
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
