"""Independent computations from the raw fixture JSON (no tuiprof code), for the tests."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from fractions import Fraction

import cxxfilt

COPY_LABEL = {1: "Host-to-Device", 2: "Device-to-Host", 8: "Device-to-Device"}


def gnu_demangle(raw: str) -> str:
    if not raw.startswith("_Z"):
        return raw
    try:
        return cxxfilt.demangle(raw, external_only=False)
    except cxxfilt.Error:
        return raw


def round_half_away(x: float | Fraction, nd: int = 1) -> float:
    """SQLite round(x, nd): half away from zero on the exact value."""
    f = Fraction(x) * 10**nd
    n = math.floor(abs(f) + Fraction(1, 2))
    return math.copysign(n, f) / 10**nd if n else 0.0


def stats_row(values: list[int]) -> dict:
    n = len(values)
    return {
        "total": sum(values), "count": n,
        "avg": round_half_away(Fraction(sum(values), n)),
        "med": round_half_away(Fraction(statistics.median(values))),
        "min": min(values), "max": max(values),
        "std": round_half_away(statistics.stdev(values)) if n > 1 else 0.0,
        "values": values,
    }


def token_windows(raw: dict) -> list[tuple[str, int, int]]:
    """(phase, start, end) of every token from the marks."""
    out, open_ = [], None
    for ev, _step, ts in sorted(raw["marks"], key=lambda m: m[2]):
        if ev.endswith("_start"):
            open_ = ("prefill" if ev.startswith("prefill") else "decode", ts)
        elif open_ is not None:
            out.append((open_[0], open_[1], ts))
            open_ = None
    return out


def kernel_groups(raw: dict, since: int | None = None) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for r in raw["records"]:
        if r[0] == "K" and (since is None or r[2] >= since):
            groups[gnu_demangle(r[1])].append(r[3] - r[2])
    return groups


def mem_groups(raw: dict, field: str) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for r in raw["records"]:
        if r[0] == "C":
            groups[f"[CUDA memcpy {COPY_LABEL[r[1]]}]"].append(r[4] - r[3] if field == "time" else r[2])
        elif r[0] == "S":
            groups["[CUDA memset]"].append(r[3] - r[2] if field == "time" else r[1])
    return groups


def parse_nsys_csv(text: str) -> tuple[str, list[list[str]]]:
    """Header line and rows; only the last field may be quoted (it holds commas)."""
    lines = text.rstrip("\n").split("\n")
    ncol = lines[0].count(",") + 1
    rows = []
    for ln in lines[1:]:
        cells = ln.split(",", ncol - 1)
        if cells[-1].startswith('"'):
            assert cells[-1].endswith('"') and "," in cells[-1], ln[:120]
            cells[-1] = cells[-1][1:-1]
        else:
            assert "," not in cells[-1]
        rows.append(cells)
    return lines[0], rows
