"""Time intervals ``(start, end)``: their union and intersection (pure functions)."""
from __future__ import annotations

from typing import Iterable


def merge(spans: Iterable) -> list[list]:
    """Sorted, disjoint ``[start, end]`` covering exactly the union of ``spans``."""
    out: list[list] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def length(merged: list) -> float:
    """Total length of disjoint intervals (from :func:`merge`)."""
    return sum(e - s for s, e in merged)


def union_length(spans: Iterable) -> float:
    """Time covered by at least one of ``spans`` (overlaps counted once)."""
    return length(merge(spans))


def intersection(a: list, b: list) -> float:
    """Time covered by both of two merged interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


__all__ = ["merge", "length", "union_length", "intersection"]
