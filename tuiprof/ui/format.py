"""Number formatting shared by the panes (pure; no Textual)."""
from __future__ import annotations

from typing import Any

SPARK_CHARS = " ▁▂▃▄▅▆▇█"


def ns(v: float | None) -> str:
    """A duration in nanoseconds, in the unit that reads best (``4.76 µs``, ``1.23 ms``)."""
    if v is None:
        return "–"
    v = float(v)
    a = abs(v)
    if a < 1e3:
        return f"{v:.0f} ns"
    if a < 1e6:
        return f"{v / 1e3:.2f} µs"
    if a < 1e9:
        return f"{v / 1e6:.2f} ms"
    return f"{v / 1e9:.2f} s"


def ms(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "–"
    if v >= 1000:
        return f"{v / 1000:.2f} s"
    if v >= 100:
        return f"{v:.1f} ms"
    return f"{v:.{digits}f} ms"


def pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}%"


def count(v: float | int | None) -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.1f}"
    return f"{int(v):,}"


def nbytes(v: float | int | None) -> str:
    if v is None:
        return "–"
    v = float(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.2f} {unit}"
        v /= 1024
    return f"{v:.2f} TiB"


def dim3(t: tuple | list | None) -> str:
    if not t:
        return "–"
    return "×".join(str(int(x)) for x in t)


def spark(values: list, width: int, lo: float | None = 0.0, hi: float | None = None) -> str:
    """A one-line bar sparkline of the last ``width`` values on a fixed scale.

    ``lo``/``hi`` fix the scale (``0..100`` for percentages) so that 1% and 15% do not both
    draw a full bar; ``None`` takes the data's own range. Missing values draw as spaces.
    The newest value is at the right edge.
    """
    if width <= 0:
        return ""
    vals = values[-width:]
    nums = [v for v in vals if v is not None]
    if not nums:
        return " " * width
    lo_ = min(nums) if lo is None else lo
    hi_ = max(nums) if hi is None else hi
    span = hi_ - lo_
    out = []
    top = len(SPARK_CHARS) - 1
    for v in vals:
        if v is None:
            out.append(" ")
            continue
        if span <= 0:
            idx = top if v > lo_ else 1
        else:
            f = (min(max(v, lo_), hi_) - lo_) / span
            idx = 1 + int(round(f * (top - 1))) if v > lo_ else 1
        out.append(SPARK_CHARS[idx])
    return "".join(out).rjust(width)


def config_label(batch: Any, mode: str | None = None) -> str:
    """``b4`` / ``b4 eager``: how a configuration is named on screen."""
    name = f"b{batch}" if isinstance(batch, int) else str(batch)
    return f"{name} {mode}" if mode else name
