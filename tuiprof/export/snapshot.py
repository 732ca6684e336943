"""JSON snapshot of a session: everything the UI shows, reopenable with ``tuiprof view``.

``write_snapshot(view, path)`` writes it atomically; ``read_snapshot(path)`` gives back a
:class:`StoreView` equal to the one written (write -> read -> write is byte-identical).
Reading is JSON only, bounded (512 MB, nesting depth) and validated against
``snapshot.schema.json``; anything else is a one-line :class:`TuiprofError`.
docs/snapshot.md describes every field.

Three modules do the work: :mod:`.snapshot_write`, :mod:`.snapshot_check` (the format's
version, bounds and checks) and :mod:`.snapshot_read`; this one names what callers use.
"""
from __future__ import annotations

from .snapshot_check import (FORMAT, MAX_DEPTH, MAX_STRING, RANKS_FORMAT, SCHEMA_PATH, SCHEMA_VERSION,
                             WORLD_KEYS, int64_problem, schema, validate_snapshot)
from .snapshot_read import (MAX_BYTES, MAX_RANKS, Snapshot, load_snapshot, parse_document,
                            read_any_snapshot, read_snapshot, view_from_snapshot)
from .snapshot_write import (HOST_KEY, META_KEYS, clean_meta, default_findings, default_rank_findings,
                             dumps, ranks_snapshot_dict, request_dict, snapshot_dict, stats_dict,
                             world_meta, write_snapshot)

__all__ = ["FORMAT", "RANKS_FORMAT", "SCHEMA_VERSION", "SCHEMA_PATH", "MAX_BYTES", "MAX_DEPTH",
           "MAX_RANKS", "MAX_STRING", "META_KEYS", "WORLD_KEYS", "HOST_KEY", "Snapshot", "schema",
           "validate_snapshot", "int64_problem", "write_snapshot", "snapshot_dict",
           "ranks_snapshot_dict", "dumps", "clean_meta", "stats_dict", "request_dict", "world_meta",
           "default_findings", "default_rank_findings", "load_snapshot", "read_snapshot",
           "read_any_snapshot", "view_from_snapshot", "parse_document"]
