"""What a JSON snapshot is, and the checks a document passes before it is read: the format's
version and bounds, the JSON Schema (``snapshot.schema.json``, draft 2020-12), compiled rules
for the long token arrays, and integers within int64. A problem is a one-line
:class:`TuiprofError`. docs/snapshot.md describes every field.
"""
from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

from ..errors import TuiprofError, safe_text
from ..store import TokenRow

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
MAX_DEPTH = 32           # nesting allowed inside free-form sections (meta, overhead, findings)
MAX_STRING = 65536       # characters in one string or key (kernel names are bounded alike)
SCHEMA_PATH = Path(__file__).with_name("snapshot.schema.json")

# What a multi-rank snapshot says about the whole job (its "world" section).
WORLD_KEYS = frozenset({"world_size", "launcher", "failure", "clock", "tp_reference",
                        "notices", "processes_dropped", "feeds"})

REQUEST_FIELDS = ("source", "status", "reason", "arrival_ns", "queued_ns", "first_step_ns",
                  "first_step_seq", "first_token_ns", "last_token_ns", "finish_ns",
                  "prompt_tokens", "output_tokens", "kv_blocks", "prefill_steps",
                  "decode_steps", "shared", "preemptions", "model_ns", "traceparent",
                  "app_ns", "client_id", "http_status", "tokens_from", "wire_first_ns",
                  "wire_end_ns", "read_ns")
TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(TokenRow))


class TokenRows(list):
    """Token rows built while reading, a sample of their dicts for the full schema check, and
    the first problem the column check found: (index, why) or None."""

    sample: list
    problem: tuple | None = None


# ------------------------------------------------------------------ checking
@lru_cache(maxsize=1)
def schema() -> dict:
    """The JSON Schema of the snapshot (draft 2020-12)."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema  # noqa: PLC0415

    cls = jsonschema.validators.validator_for(schema())
    return cls(schema())


def not_a_snapshot(where: str, why: str) -> TuiprofError:
    # keys and values quoted from the file may hold control characters: TuiprofError escapes
    return TuiprofError(f"snapshot {where} is not a tuiprof snapshot: {safe_text(why, 300)}")


def free_form_problem(obj: Any, limit: int) -> str | None:
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


def check_version(ver: Any, where: str) -> None:
    if not isinstance(ver, int) or isinstance(ver, bool) or ver < 1:
        raise not_a_snapshot(where, f"schema_version {str(ver)[:20]!r} is not a positive integer")
    if ver > SCHEMA_VERSION:
        raise TuiprofError(f"snapshot schema version {ver} is newer than this tuiprof reads "
                           f"({SCHEMA_VERSION}); upgrade tuiprof")


def validate_snapshot(obj: Any, where: str = "document", all_records: bool = True) -> None:
    """Check a decoded snapshot: format and version first, then the JSON Schema.

    ``all_records=False`` checks only the first records of each token against the schema
    (fast path for :func:`load_snapshot`, which then checks every record while rebuilding).
    """
    if not isinstance(obj, dict):
        raise not_a_snapshot(where, f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("format") != FORMAT:
        raise not_a_snapshot(where, f"format is {str(obj.get('format'))[:40]!r}, not {FORMAT!r}")
    check_version(obj.get("schema_version"), where)
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
        problem = (free_form_problem(obj[key], MAX_DEPTH)
                   if key in obj and key not in checked else None)
        if problem:
            raise not_a_snapshot(where, f"'{key}' {problem}")
    import jsonschema  # noqa: PLC0415 - only readers need it

    if not all_records and isinstance(obj.get("raw"), list):
        doc["raw"] = [dict(r, records=r["records"][:4])
                      if isinstance(r, dict) and isinstance(r.get("records"), list) else r
                      for r in obj["raw"]]
    err = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if err is not None:
        at = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise not_a_snapshot(where, f"{at}: {err.message[:120]}")


SAMPLE = 256     # elements of a long array that the full JSON Schema checks as well


def _sample(items: list) -> list:
    """The first and last elements and an even spread between, at most ``SAMPLE`` (rows
    already built by the streaming reader stand in as their dicts)."""
    if isinstance(items, TokenRows):
        return items.sample
    if len(items) <= SAMPLE:
        return items
    step = len(items) / (SAMPLE - 1)
    return [items[min(len(items) - 1, int(i * step))] for i in range(SAMPLE)]


def _check_items(items: list, check, sub: str | None, key: str, where: str) -> None:
    """Every element of a long array by its compiled rule; the first bad one is reported with
    jsonschema's own words where it has them."""
    if isinstance(items, TokenRows):      # built by the streaming reader, checked by columns
        if items.problem is None:
            return
        i, problem = items.problem
        raise not_a_snapshot(where, f"{key}/{i}: {problem}")
    for i, item in enumerate(items):
        problem = check(item)
        if problem is None:
            continue
        if sub is not None:
            err = _sub_error(sub, item)
            if err is not None:
                at = "/".join(str(p) for p in (key, i, *err.absolute_path))
                raise not_a_snapshot(where, f"{at}: {err.message[:120]}")
        raise not_a_snapshot(where, f"{key}/{i}: {problem}")


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


MISSING = _Missing()


def _allowed(spec: dict) -> tuple[frozenset, bool]:
    """The Python types a JSON Schema ``type`` allows, and whether it is an integer (a float
    with an integral value passes too, as jsonschema has it)."""
    names = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
    types = {t for n in names for t in _PY[n]}
    return frozenset(types), _INTEGER in names and _NUMBER not in names


@lru_cache(maxsize=1)
def token_rules() -> tuple:
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
    order, _allowed_, minimum, maps, strings, required, known = token_rules()
    keys = t.keys()
    if not (required <= keys <= known) \
            or tuple(map(type, map(t.get, order, repeat(MISSING)))) not in _GOOD_SIGNATURES \
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
    minimum = token_rules()[2]
    assert {least for _k, least in minimum} == {0}, "the fast path assumes every minimum is 0"
    return tuple(k for k, _least in minimum)


def _is_str(v: Any) -> bool:
    return type(v) is str


def _token_problem_in_full(t: Any) -> str | None:
    if type(t) is not dict:
        return f"{safe_text(t, 40)} is not of type 'object'"
    order, allowed, minimum, maps, strings, required, known = token_rules()
    keys = t.keys()
    if not required <= keys:
        return f"{sorted(required - keys)[0]!r} is a required property"
    if not keys <= known:
        return f"Additional properties are not allowed ({sorted(keys - known)[0]!r} was unexpected)"
    sig = tuple(map(type, map(t.get, order, repeat(MISSING))))
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


def column_problem(rows: list) -> tuple | None:
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
    order, allowed, minimum, maps, strings, _required, _known = token_rules()
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
    if d.get("config") is MISSING:
        del d["config"]
    return d


def props_type(k: str) -> str:
    spec = schema()["$defs"]["token"]["properties"][k]["type"]
    return repr(spec) if isinstance(spec, str) else " or ".join(map(repr, spec))


def _nvml_problem(s: Any) -> str | None:
    """Why an NVML sample breaks the schema (an object: integer ``ts_ns``, numbers or null)."""
    if type(s) is not dict:
        return f"{safe_text(s, 40)} is not of type 'object'"
    ts = s.get("ts_ns", MISSING)
    if ts is MISSING:
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


# Every integer of a snapshot fits a signed 64-bit integer: the SQLite export, numpy and the
# C side of the collectors hold them so (2**64 + 1 crashed `export --sqlite`). JSON numbers
# have no such bound, so a document is checked at load time, for every export and view alike:
# a scan of the text for integer literals of 20 digits or more, or 19 from 9e18 on (C speed;
# nanoseconds since 1970 have 19 digits until 2255), then, only when one is found (it may sit
# in a string), a walk over the decoded values.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
LONG_INT = re.compile(r"(?<![\w.+-])-?(?:\d{20,}|9\d{18})(?![\d.eE])")


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
            stack.extend((v, f"{at}/{k}") for k in TOKEN_FIELDS
                         if _holds_int(v := getattr(o, k)))
    return None


def _holds_int(v: Any) -> bool:
    return type(v) is int or isinstance(v, (dict, list, tuple, TokenRow))
