"""Report tables in the shape ``nsys stats`` prints them: statistics, rounding, CSV, column.

Rules (docs/exports.md, from the nsys 2025.3.1 reference): ``Time (%)``, Avg, Med and StdDev
are rounded to one decimal, half away from zero on the exact double (SQLite ``round``); Min,
Max and totals are integers; StdDev is the sample standard deviation (0.0 for one value);
memory columns print MB (10**6 B) with three decimals. CSV wraps a field in double quotes when
it contains a comma, as nsys does, and (unlike nsys) doubles a quote inside a field: the file is
written by the ``csv`` module, so any CSV reader gets each name back as one cell.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, localcontext
from fractions import Fraction
from typing import Iterable, Sequence

from ..store.stats import RunningStats
from ..text import csv_cell, csv_text, printable

# Column kinds: how a cell is printed.
INT, F1, MB, STR = "int", "f1", "mb", "str"


def round1(x: float) -> float:
    """``round(x, 1)`` the SQLite way: half away from zero on the exact binary value."""
    if not math.isfinite(x):
        return x
    q = Decimal(x).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    return float(q)


def _sqrt_fraction(f: Fraction) -> float:
    if f <= 0:
        return 0.0
    with localcontext() as ctx:
        ctx.prec = 50
        return float((Decimal(f.numerator) / Decimal(f.denominator)).sqrt())


@dataclass(frozen=True, slots=True)
class Stat:
    """count, total, min, max, mean, median and sample stddev of one group."""

    count: int
    total: int | float
    min: int | float
    max: int | float
    avg: float
    med: float
    std: float


def stat_of_values(values: Sequence[int]) -> Stat:
    """Exact statistics of integer values (sum of squares in integers, no rounding drift)."""
    n = len(values)
    if not n:
        return Stat(0, 0, 0, 0, 0.0, 0.0, 0.0)
    vs = sorted(values)
    total = sum(vs)
    med = (vs[(n - 1) // 2] + vs[n // 2]) / 2.0
    std = 0.0
    if n > 1:
        s2 = sum(v * v for v in vs)
        std = _sqrt_fraction(Fraction(n * s2 - total * total, n * (n - 1)))
    return Stat(n, total, vs[0], vs[-1], total / n, med, std)


def stat_of_running(s: RunningStats) -> Stat:
    """Statistics of a :class:`RunningStats`; stddev exact from its histogram when it can be."""
    if not s.count:
        return Stat(0, 0, 0, 0, 0.0, 0.0, 0.0)
    std = s.stddev
    hist = getattr(s, "_hist", None)
    if s.median_exact and hist and s.count > 1 and all(isinstance(k, int) for k in hist):
        n = s.count
        s1 = sum(k * c for k, c in hist.items())
        s2 = sum(k * k * c for k, c in hist.items())
        if s1 == s.total:
            std = _sqrt_fraction(Fraction(n * s2 - s1 * s1, n * (n - 1)))
    return Stat(s.count, s.total, s.min, s.max, s.total / s.count, s.median, std)


def merged(stats: Iterable[RunningStats]) -> RunningStats:
    """A new RunningStats with all of ``stats`` merged in."""
    out = RunningStats()
    for s in stats:
        out.merge(s)
    return out


def percent(total: int | float, grand: int | float) -> float:
    """``round(100.0 * total / grand, 1)``, 0.0 when ``grand`` is 0."""
    return round1(100.0 * total / grand) if grand else 0.0


@dataclass
class Report:
    """One nsys-style report: column labels and kinds, rows of typed cells."""

    name: str                   # e.g. "cuda_gpu_kern_sum"
    title: str                  # e.g. "CUDA GPU Kernel Summary"
    columns: list[str]
    kinds: list[str]
    rows: list[list] = field(default_factory=list)
    skipped: str = ""           # why there is nothing to report (nsys prints SKIPPED)

    def column(self, label: str) -> list:
        i = self.columns.index(label)
        return [r[i] for r in self.rows]


def _cell(v: object, kind: str) -> str:
    if v is None:
        return ""
    if kind == INT:
        return str(int(v))
    if kind == F1:
        return repr(float(v))
    if kind == MB:
        return f"{float(v) / 1e6:.3f}"
    return csv_cell(v)   # a name: printable, and never a spreadsheet formula


def to_csv(report: Report, header: bool = True) -> str:
    """The report as ``nsys stats --format csv`` prints it (``\\n`` line ends), written by the
    ``csv`` module: a name with a quote or a comma stays one cell, and no cell is a formula."""
    rows = ([_cell(v, k) for v, k in zip(row, report.kinds)] for row in report.rows)
    return csv_text(rows, report.columns if header else None)


def _pretty(v: object, kind: str) -> str:
    if v is None:
        return ""
    if kind == INT:
        return f"{int(v):,}"
    if kind == F1:
        return f"{float(v):,.1f}"
    if kind == MB:
        return f"{float(v) / 1e6:,.3f}"
    return printable(v)


def _clip(text: str, colmax: int) -> str:
    return text if colmax <= 0 or len(text) <= colmax else text[: colmax - 1] + "…"


def to_column(report: Report, colmax: int = 100) -> str:
    """The report as nsys's ``column`` format: banner, header, dashes, aligned rows."""
    out = [f" ** {report.title} ({report.name}):", ""]
    if report.skipped:
        out.append(f"SKIPPED: {report.skipped}")
        return "\n".join(out) + "\n"
    cells = [[_clip(_pretty(v, k), colmax) for v, k in zip(r, report.kinds)] for r in report.rows]
    heads = [_clip(c, colmax) for c in report.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def line(vals: list[str], header: bool = False) -> str:
        parts = []
        for v, w, k in zip(vals, widths, report.kinds):
            parts.append(v.ljust(w) if k == STR and not header else
                         (v.center(w) if k == STR else v.rjust(w)))
        return " " + "  ".join(parts).rstrip()

    out.append(line(heads, header=True))
    out.append(" " + "  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out) + "\n"
