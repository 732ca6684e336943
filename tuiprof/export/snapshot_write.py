"""Writing a JSON snapshot of a session: everything the UI shows, reopenable with ``tuiprof view``.

``write_snapshot(view, path)`` writes it atomically; only known meta keys are kept, every string
is bounded. The format's version and rules: :mod:`tuiprof.export.snapshot_check`; reading it
back: :mod:`tuiprof.export.snapshot_read`. docs/snapshot.md describes every field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

from .. import __version__
from ..errors import TuiprofError
from ..store import ConfigData, RunningStats, StoreView, config_order
from ..store.rank_set import RanksView
from ..store.records import COPY_KINDS, DIRECTION
from ..store.requests import RequestRow, RequestsView
from ._atomic import atomic_write_bytes
from .names import demangle
from .snapshot_check import FORMAT, MAX_DEPTH, RANKS_FORMAT, SCHEMA_VERSION, WORLD_KEYS, REQUEST_FIELDS
from .summary import summary

# Meta keys a snapshot keeps; anything else (environment, paths, user names) is dropped.
META_KEYS = frozenset({
    "source", "recording", "device", "device_index", "sm_count", "driver", "cuda", "torch",
    "transformers", "tuiprof", "model", "model_def", "params", "dtype", "weights", "mode",
    "prefill_mode", "prompt_tokens", "decode_tokens", "batch", "max_len", "ring_tokens",
    "seed", "compile_s", "started_utc", "share_host", "device_name", "family", "origin",
    "study", "non_embedding_params", "weight_bytes", "compile_mode", "prompt", "loop",
    "load_s", "vocab_size", "max_new_tokens", "sample_every", "tracing", "gpu_mem_total_bytes",
    "measured_peaks", "startup", "program", "step_source", "step_sources", "steps_elsewhere",
    "window_ms",
    "step_range",
    "rank", "world_size", "local_rank", "tp", "backend", "clock_sync", "lockstep", "tp_shard",
    "model_params", "test_tp_delay",
    "max_batch", "step_time_sources",
    "process", "job", "cuda",
    "native", "auto_steps", "cuda_graph_trace",
    "request_sources", "load", "proxy",
    "feeds",
    "vllm",
})
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
def _request_id(rid: Any) -> Any:
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else str(rid)


def request_dict(r: RequestRow) -> dict:
    """One request's entry: its fields, every token's time, its steps, and the derived
    ``queue_ms``, ``ttft_ms``, ``e2e_ms``, ``outside_ms`` and ``itl_ms`` (statistics)."""
    from ..analysis.requests import itl_summary, outside_ms  # noqa: PLC0415

    d = {"id": _request_id(r.id), **{k: getattr(r, k) for k in REQUEST_FIELDS},
         "token_ns": list(r.token_ns), "steps": list(r.steps),
         "in_socket_ms": r.in_socket_ms, "before_app_ms": r.before_app_ms, "after_engine_ms": r.after_engine_ms,
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
