"""Request length distributions of generated load (``tuiprof serve``, ``tuiprof sweep
--serve``): ``N`` fixed, ``A:B`` uniform integers, ``N~S`` normal (at least 1); and the load's
default size. No torch here: the CLI checks the options before it starts anything."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Lengths:
    """A length distribution: fixed, uniform ``lo:hi`` or normal ``mean~sd``."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return min(self.most(), max(1, int(round(rng.gauss(self.a, self.b)))))

    def most(self) -> int:
        """The longest length drawn, all but surely: a normal's mean + 4 standard deviations
        (a draw beyond is cut there by the load)."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return int(math.ceil(self.a + 4 * self.b))

    def mean(self) -> float:
        return {"fixed": self.a, "uniform": (self.a + self.b) / 2}.get(self.kind, self.a)

    def __str__(self) -> str:
        return {"fixed": f"{self.a:g}", "uniform": f"{self.a:g}:{self.b:g}"}.get(
            self.kind, f"{self.a:g}~{self.b:g}")


def parse_lengths(text: str) -> Lengths:
    """``128``, ``64:256`` or ``128~32`` (raises ValueError with a readable reason)."""
    t = str(text).strip()
    try:
        if ":" in t:
            lo, hi = (int(x) for x in t.split(":", 1))
            if not 1 <= lo <= hi:
                raise ValueError
            return Lengths("uniform", lo, hi)
        if "~" in t:
            mean, sd = (float(x) for x in t.split("~", 1))
            if not (math.isfinite(mean) and math.isfinite(sd)) or mean < 1 or sd < 0:
                raise ValueError
            return Lengths("normal", mean, sd)
        n = int(t)
        if n < 1:
            raise ValueError
        return Lengths("fixed", n)
    except ValueError:
        raise ValueError(f"{t!r}: expected N, A:B (uniform) or N~S (normal), each >= 1") from None


def default_load(args: Any) -> None:
    """The load a run gets where its options name none: 32 requests (unless ``--duration``),
    4 in flight (unless ``--rate``)."""
    if args.requests is None and args.duration is None:
        args.requests = 32
    if args.rate is None and args.concurrency is None:
        args.concurrency = 4
