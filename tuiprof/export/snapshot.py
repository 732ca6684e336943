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
from pathlib import Path
from typing import Any, Iterable

from .. import __version__
from ..errors import TuiprofError, safe_text, safe_tree
from ..store import (ConfigData, KernelAggregate, RunningStats, StoreView, TokenRow, compose_view,
                     config_order)
from ..store.rank_set import RanksView
from ..store.records import COPY_KINDS, DIRECTION
from ._atomic import atomic_write_bytes
from .names import demangle
from .summary import summary

SCHEMA_VERSION = 4       # 2: batch configurations ("batch", "configurations", token "config");
                         # 3: token "rerecord"; 4: token "model_*"/"loop_*" (a step's kernels
                         # launched inside and outside its model forward), kernel "loop_*"
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
    "load_s", "vocab_size", "max_new_tokens", "sample_every", "gpu_mem_total_bytes",
    "measured_peaks", "startup", "program", "step_source", "step_sources", "window_ms",
    "step_range",
    "rank", "world_size", "local_rank", "tp", "backend", "clock_sync", "lockstep", "tp_shard",
    "model_params", "test_tp_delay",
    "max_batch", "step_time_sources",
    "process", "job", "cuda", "native", "auto_steps",
})
# What a multi-rank snapshot says about the whole job (its "world" section).
WORLD_KEYS = frozenset({"world_size", "launcher", "failure", "clock", "tp_reference",
                        "notices", "processes_dropped"})
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
    }


def dumps(doc: dict) -> bytes:
    """Canonical bytes of a snapshot document (sorted keys, compact, UTF-8, newline)."""
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TuiprofError(f"cannot encode snapshot: {exc}") from None
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800" escape read back): keep it
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False).encode("ascii") + b"\n"


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
    for key in ("meta", "overhead", "findings", "allocs", "nvml", "series", "tokens", "counters",
                "collectors", "summary", "events", "api", "nvtx", "output",
                "configurations"):
        problem = _free_form_problem(obj[key], MAX_DEPTH) if key in obj else None
        if problem:
            raise _bad(where, f"'{key}' {problem}")
    import jsonschema  # noqa: PLC0415 - only readers need it

    doc = obj
    if not all_records and isinstance(obj.get("raw"), list):
        doc = dict(obj)
        doc["raw"] = [dict(r, records=r["records"][:4])
                      if isinstance(r, dict) and isinstance(r.get("records"), list) else r
                      for r in obj["raw"]]
    err = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if err is not None:
        at = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise _bad(where, f"{at}: {err.message[:120]}")


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
            row = TokenRow(**{k: t[k] for k in _TOKEN_FIELDS if k in t})
            if "config" not in t:
                row.config = key
            tokens.append(row)
        parts = {key: _read_part(doc, where)}
        for c in doc.get("configurations", []):
            if c["batch"] in parts:
                raise _bad(where, f"configuration {str(c['batch'])[:20]!r} appears twice")
            parts[c["batch"]] = _read_part(c, where)
        raw = [(r["seq"], [_record(x, where) for x in r["records"]]) for r in doc["raw"]]
        return compose_view(
            safe_tree(dict(doc["meta"])), tokens, parts, key, raw=raw, nvml=list(doc["nvml"]),
            counters=dict(doc["counters"]), collectors=safe_tree(dict(doc["collectors"])),
            events=[tuple(safe_tree(list(e))) for e in doc["events"]],
            overhead=safe_tree(dict(doc["overhead"])),
            output=[safe_text(str(line), 4096) for line in doc.get("output", ())],
            series={str(k): list(v) for k, v in doc.get("series", {}).items()})
    except TuiprofError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ArithmeticError) as exc:
        raise _bad(where, f"{type(exc).__name__}: {safe_text(exc, 80)}") from None


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
        with open(p, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise TuiprofError(f"no such snapshot: {p}") from None
    except IsADirectoryError:
        raise _bad(where, "it is a directory") from None
    except OSError as exc:
        raise TuiprofError(f"cannot read snapshot {p}: {safe_text(exc.strerror or exc, 120)}") from None
    if len(data) > MAX_BYTES:
        raise _bad(where, f"over the {MAX_BYTES // 1024**2} MB limit")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _bad(where, "not UTF-8 text (a gzip file? unpack it first)") from None
    except RecursionError:
        raise _bad(where, "JSON nested too deeply") from None
    except ValueError as exc:
        raise _bad(where, f"invalid JSON ({safe_text(exc, 80)})") from None


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
