"""Read Nsight Compute ``--csv`` output (one metric per row) into one dict per launch."""
from __future__ import annotations

import csv
import io
from pathlib import Path

__all__ = ["read_ncu_csv", "parse_ncu_csv"]


def _num(s: str) -> float | str:
    t = s.replace(",", "").strip()
    try:
        return float(t)
    except ValueError:
        return s


def parse_ncu_csv(text: str) -> list[dict]:
    """Launches in ID order: ``{"id", "kernel", "grid", "block", "metrics": {name: value}}``.
    Preamble lines (``==PROF==``, ``==WARNING==``) are skipped; thousands separators removed."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows: dict[int, dict] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        i = int(rec["ID"])
        row = rows.setdefault(i, {"id": i, "kernel": rec["Kernel Name"],
                                  "grid": _tuple(rec.get("Grid Size", "")),
                                  "block": _tuple(rec.get("Block Size", "")), "metrics": {}})
        row["metrics"][rec["Metric Name"]] = _num(rec["Metric Value"])
    return [rows[k] for k in sorted(rows)]


def _tuple(s: str) -> tuple:
    try:
        return tuple(int(x) for x in s.strip("() ").split(","))
    except ValueError:
        return ()


def read_ncu_csv(path: str | Path) -> list[dict]:
    return parse_ncu_csv(Path(path).read_text(errors="replace"))
