"""Exports other tools read: JSON snapshot, nsys-style CSV reports, nsys-schema SQLite,
Chrome/Perfetto trace, and the session diff (docs/exports.md, docs/snapshot.md).

Importing this package is light: each name below loads its module on first use.
"""
from __future__ import annotations

from .._lazy import lazy_face

_WHERE = {
    "snapshot_dict": "snapshot", "write_snapshot": "snapshot", "read_snapshot": "snapshot",
    "load_snapshot": "snapshot", "validate_snapshot": "snapshot", "Snapshot": "snapshot",
    "read_any_snapshot": "snapshot", "ranks_snapshot_dict": "snapshot",
    "write_nsys_reports": "nsys_reports", "build_reports": "nsys_reports",
    "format_reports": "nsys_reports", "write_nsys_sqlite": "nsys_sqlite",
    "check_nsys": "check_nsys", "trace_dict": "trace", "write_trace": "trace",
    "diff": "diff", "diff_modes": "diff", "DiffResult": "diff", "render_text": "diff",
    "render_rich": "diff",
}
__all__, __getattr__ = lazy_face(__name__, _WHERE)
