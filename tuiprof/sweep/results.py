"""Sweep results: cells, the study tables, and their CSV / Markdown / JSON files."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuiprof.sweep.op_summary import ProfileSummary

STATUSES = ("ok", "oom", "error", "skipped")
PASSES = ("inference", "train-forward", "train-backward", "decode")
from ..phases import MODES
from ..text import csv_text


@dataclass
class Cell:
    """One measurement: a model at a sequence length, in a pass and a mode."""

    model: str
    seq_len: int
    batch: int
    pass_name: str  # inference | train-forward | train-backward | decode
    mode: str  # eager | compiled
    attention: str | None = None  # plain | sdpa | None (the family's own)


@dataclass
class CellResult:
    """Timing (ms per iteration) and kernel summary of one cell."""

    cell: Cell
    status: str
    error: str | None = None
    times_ms: list[float] = field(default_factory=list)
    mean_ms: float | None = None
    median_ms: float | None = None
    std_ms: float | None = None
    min_ms: float | None = None
    peak_mem_mib: float | None = None
    profile: ProfileSummary | None = None

    @classmethod
    def from_cell(cls, cell: Cell, status: str, *, error: str | None = None) -> "CellResult":
        return cls(cell=cell, status=status, error=error)

    def set_times(self, times: list[float]) -> None:
        self.times_ms = list(times)
        self.mean_ms = statistics.fmean(times)
        self.median_ms = statistics.median(times)
        self.std_ms = statistics.stdev(times) if len(times) > 1 else 0.0
        self.min_ms = min(times)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens processed per second (``batch * seq_len`` per iteration; 1 for decode)."""
        if not self.median_ms:
            return None
        tokens = 1 if self.cell.pass_name == "decode" else self.cell.batch * self.cell.seq_len
        return tokens / (self.median_ms / 1e3)

    def row(self) -> dict[str, Any]:
        """Flat CSV row."""
        p = self.profile
        c = self.cell
        return {
            "model": c.model, "seq_len": c.seq_len, "batch": c.batch, "pass": c.pass_name, "mode": c.mode,
            "attention": c.attention or "", "status": self.status,
            "mean_ms": _r(self.mean_ms), "median_ms": _r(self.median_ms), "std_ms": _r(self.std_ms),
            "min_ms": _r(self.min_ms), "tokens_per_s": _r(self.tokens_per_s, 1),
            "peak_mem_mib": _r(self.peak_mem_mib, 1),
            "profile_source": p.source if p else "", "profiled_ms": _r(p.total_ms) if p else "",
            "dominant": p.dominant if p else "", "dominant_share": _r(p.dominant_share, 4) if p else "",
            "gemm_fraction": _r(p.gemm_fraction, 4) if p else "",
            "top_non_gemm": p.top_non_gemm if p else "", "top_non_gemm_share": _r(p.top_non_gemm_share, 4) if p else "",
            "attn_softmax_ms": _r(p.attn_softmax_ms) if p else "", "attn_matmul_ms": _r(p.attn_matmul_ms) if p else "",
            "error": self.error or "",
        }

    def to_dict(self) -> dict[str, Any]:
        d = self.row()
        d["times_ms"] = [round(t, 4) for t in self.times_ms]
        d["profile"] = self.profile.to_dict() if self.profile else None
        return d

    def label(self) -> str:
        """Table value: median ms, or the status."""
        return f"{self.median_ms:.2f}" if self.status == "ok" and self.median_ms is not None else self.status.upper()


@dataclass
class Table:
    """A titled table of strings."""

    title: str
    header: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |",
                 "|" + "|".join("---" for _ in self.header) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        return csv_text(self.rows, self.header)


@dataclass
class SweepResult:
    """Every cell of a sweep, with the settings and the device it ran on."""

    device: str
    started: float
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    cells: list[CellResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    def find(self, model: str, seq_len: int, pass_name: str = "inference", mode: str = "eager",
             attention: str | None = None) -> CellResult | None:
        """The result of one cell (``attention`` None matches any)."""
        for r in self.cells:
            c = r.cell
            if (c.model, c.seq_len, c.pass_name, c.mode) == (model, seq_len, pass_name, mode) and (
                    attention is None or c.attention == attention):
                return r
        return None

    def tables(self) -> dict[str, Table]:
        """The study tables: ``time`` (ms per model x sequence length), ``kernels``, ``attention``."""
        seq_lens = sorted({r.cell.seq_len for r in self.cells})
        groups: dict[tuple, dict[int, CellResult]] = {}
        for r in self.cells:
            c = r.cell
            groups.setdefault((c.model, c.pass_name, c.mode, c.attention or "", c.batch), {})[c.seq_len] = r
        time_rows = [[m, p, mode, a, str(b)] + [g[L].label() if L in g else "" for L in seq_lens]
                     for (m, p, mode, a, b), g in groups.items()]
        tables = {"time": Table("Time per iteration (median ms; decode: ms per step)",
                                ["model", "pass", "mode", "attention", "batch"] + [f"L={L}" for L in seq_lens],
                                time_rows)}
        krows = []
        for r in self.cells:
            p, c = r.profile, r.cell
            if p is None:
                continue
            krows.append([c.model, str(c.seq_len), c.pass_name, c.mode, c.attention or "",
                          _short(p.dominant), _pct(p.dominant_share), _pct(p.gemm_fraction),
                          _short(p.top_non_gemm), _pct(p.top_non_gemm_share), p.source])
        tables["kernels"] = Table("Dominant kernel and GEMM fraction per pass",
                                  ["model", "seq_len", "pass", "mode", "attention", "dominant", "dominant %",
                                   "GEMM %", "top non-GEMM", "non-GEMM %", "source"], krows)
        arows = []
        for r in self.cells:
            p, c = r.profile, r.cell
            if p is None or p.attn_softmax_ms is None:
                continue
            ratio = p.attn_softmax_ms / p.attn_matmul_ms if p.attn_matmul_ms else float("nan")
            arows.append([c.model, str(c.seq_len), c.pass_name, c.mode, f"{p.attn_softmax_ms:.3f}",
                          f"{p.attn_matmul_ms:.3f}", f"{ratio:.2f}"])
        tables["attention"] = Table("Plain attention: softmax vs matmul (ms in the profiled iteration)",
                                    ["model", "seq_len", "pass", "mode", "softmax ms", "matmul ms", "softmax/matmul"],
                                    arows)
        return tables

    def markdown(self) -> str:
        head = [f"# tuiprof sweep on {self.device}", "",
                f"{len(self.cells)} cells in {self.elapsed_s:.1f} s; settings: "
                + ", ".join(f"{k}={v}" for k, v in self.settings.items() if v is not None), ""]
        head += [f"- {n}" for n in self.notes] + ([""] if self.notes else [])
        failed = [r for r in self.cells if r.status in ("oom", "error")]
        body = "\n".join(t.markdown() for t in self.tables().values())
        tail = ["", "### Failed cells", ""] + [
            f"- {r.cell.model} L={r.cell.seq_len} {r.cell.pass_name} {r.cell.mode}: {r.status} {r.error or ''}"
            for r in failed] if failed else []
        return "\n".join(head) + "\n" + body + "\n".join(tail) + ("\n" if tail else "")

    def csv(self) -> str:
        """One row per cell, every scalar column."""
        return rows_csv([r.row() for r in self.cells])

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "started": self.started, "elapsed_s": round(self.elapsed_s, 3),
                "settings": self.settings, "notes": self.notes, "cells": [r.to_dict() for r in self.cells]}

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write ``sweep.csv``, ``sweep.md``, ``sweep.json`` and one CSV per table."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / "sweep.csv", "md": out / "sweep.md", "json": out / "sweep.json"}
        paths["csv"].write_text(self.csv())
        paths["md"].write_text(self.markdown())
        paths["json"].write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        for name, table in self.tables().items():
            paths[f"{name}.csv"] = out / f"{name}.csv"
            paths[f"{name}.csv"].write_text(table.csv())
        return paths


def _r(x: float | None, nd: int = 4) -> float | str:
    return "" if x is None else round(x, nd)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}"


def _short(name: str | None, n: int = 60) -> str:
    if not name:
        return ""
    name = name.replace("|", "/")
    return name if len(name) <= n else name[: n - 1] + "…"


def rows_csv(rows: list[dict]) -> str:
    """CSV text of ``rows`` (dicts of the same keys), a header of the first row's keys."""
    if not rows:
        return ""
    keys = list(rows[0])   # kernel names and error text among the cells: csv_text guards them
    return csv_text(([r.get(k) for k in keys] for r in rows), keys)
