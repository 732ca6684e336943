"""Running statistics that stay bounded however long a session runs."""
from __future__ import annotations

import math


# Distinct values kept exactly per statistic before durations are folded into log bins.
EXACT_VALUES_CAP = 4096
# Relative width of a log bin once folding starts (the median is then within ~0.5%).
LOG_BIN_RATIO = 1.01


class RunningStats:
    """Count, total, min, max, mean, sample stddev (Welford) and a median.

    The median is exact while the values seen take at most ``EXACT_VALUES_CAP`` distinct values
    (CUPTI kernel timestamps tick in 32 ns steps, so a kernel's durations rarely take more);
    past that, values are counted in 1% log bins and the median is that bin's centre
    (``median_exact`` tells which).
    """

    __slots__ = ("count", "total", "min", "max", "_mean", "_m2", "_hist", "median_exact")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._hist: dict[int, int] = {}
        self.median_exact = True

    def add(self, x: int) -> None:
        """Fold one value in."""
        n = self.count + 1
        self.count = n
        self.total += x
        if n == 1:
            self.min = self.max = x
        elif x < self.min:
            self.min = x
        elif x > self.max:
            self.max = x
        d = x - self._mean
        self._mean += d / n
        self._m2 += d * (x - self._mean)
        if self.median_exact:
            h = self._hist
            h[x] = h.get(x, 0) + 1
            if len(h) > EXACT_VALUES_CAP:
                self._fold()
        else:
            b = _bin(x)
            self._hist[b] = self._hist.get(b, 0) + 1

    def add_many(self, xs: list) -> None:
        """Fold a batch in; same result as ``add`` one by one, a fraction of the cost."""
        n2 = len(xs)
        if n2 == 0:
            return
        if n2 == 1:
            self.add(xs[0])
            return
        tot = sum(xs)
        mean2 = tot / n2
        m2 = sum((x - mean2) ** 2 for x in xs)
        lo, hi = min(xs), max(xs)
        n1 = self.count
        if n1 == 0:
            self.min, self.max = lo, hi
        else:
            if lo < self.min:
                self.min = lo
            if hi > self.max:
                self.max = hi
        n = n1 + n2
        d = mean2 - self._mean
        self._m2 += m2 + d * d * n1 * n2 / n
        self._mean += d * n2 / n
        self.count = n
        self.total += tot
        h = self._hist
        if self.median_exact:
            _count_into(h, xs)
            if len(h) > EXACT_VALUES_CAP:
                self._fold()
        else:
            _count_into(h, [_bin(x) for x in xs])

    def _fold(self) -> None:
        folded: dict[int, int] = {}
        for v, c in self._hist.items():
            b = _bin(v)
            folded[b] = folded.get(b, 0) + c
        self._hist = folded
        self.median_exact = False

    @property
    def mean(self) -> float:
        return self._mean if self.count else 0.0

    @property
    def stddev(self) -> float:
        """Sample standard deviation (n-1), 0 for fewer than two values."""
        return math.sqrt(max(0.0, self._m2) / (self.count - 1)) if self.count > 1 else 0.0

    @property
    def median(self) -> float:
        """Median; the mean of the two middle values for an even count."""
        if not self.count:
            return 0.0
        keys = sorted(self._hist)
        vals = keys if self.median_exact else [_unbin(k) for k in keys]
        lo_rank = (self.count - 1) // 2
        hi_rank = self.count // 2
        seen = 0
        lo = hi = None
        for v, k in zip(vals, keys):
            seen += self._hist[k]
            if lo is None and seen > lo_rank:
                lo = v
            if seen > hi_rank:
                hi = v
                break
        return (lo + hi) / 2.0

    def quantile(self, q: float) -> float:
        """The value at rank ``q`` (0..1) of the values seen: the nearest rank to
        ``q * (count - 1)`` (exact while ``median_exact``, else a 1% bin's centre); a light
        copy keeps only its median. 0.0 when empty."""
        if not self.count:
            return 0.0
        rank = min(self.count - 1, max(0, int(q * (self.count - 1) + 0.5)))
        seen = 0
        for k in sorted(self._hist):
            seen += self._hist[k]
            if seen > rank:
                return float(k) if self.median_exact else _unbin(k)
        return float(self.max)

    def merge(self, other: "RunningStats") -> None:
        """Fold another statistic in (Chan et al. parallel variance)."""
        if not other.count:
            return
        if not self.count:
            self.min, self.max = other.min, other.max
        else:
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)
        n = self.count + other.count
        d = other._mean - self._mean
        self._m2 += other._m2 + d * d * self.count * other.count / n
        self._mean += d * other.count / n
        self.count = n
        self.total += other.total
        if self.median_exact and other.median_exact:
            for v, c in other._hist.items():
                self._hist[v] = self._hist.get(v, 0) + c
            if len(self._hist) > EXACT_VALUES_CAP:
                self._fold()
        else:
            if self.median_exact:
                self._fold()
            src = other._hist if not other.median_exact else {}
            if other.median_exact:
                for v, c in other._hist.items():
                    b = _bin(v)
                    src[b] = src.get(b, 0) + c
            for b, c in src.items():
                self._hist[b] = self._hist.get(b, 0) + c

    def light_copy(self) -> "RunningStats":
        """Same count, total, min, max, mean, stddev and median, without the histogram (the
        median is kept as the one entry left); what a live display needs, a fraction of the
        size. Not for merging or exporting."""
        s = self.copy_moments()
        if self.count:
            s._hist = {self.median: self.count}
        return s

    def copy_moments(self) -> "RunningStats":
        s = RunningStats()
        s.count, s.total, s.min, s.max = self.count, self.total, self.min, self.max
        s._mean, s._m2 = self._mean, self._m2
        return s

    def copy(self) -> "RunningStats":
        s = RunningStats()
        s.count, s.total, s.min, s.max = self.count, self.total, self.min, self.max
        s._mean, s._m2, s.median_exact = self._mean, self._m2, self.median_exact
        s._hist = dict(self._hist)
        return s

    def to_dict(self) -> dict:
        """JSON-ready form; ``from_dict`` restores it exactly."""
        return {
            "count": self.count,
            "total": self.total,
            "min": self.min,
            "max": self.max,
            "mean": self._mean,
            "m2": self._m2,
            "median_exact": self.median_exact,
            "hist": [[k, v] for k, v in sorted(self._hist.items())],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "RunningStats":
        s = cls()
        s.count = int(d["count"])
        s.total = d["total"]
        s.min = d["min"]
        s.max = d["max"]
        s._mean = float(d["mean"])
        s._m2 = float(d["m2"])
        s.median_exact = bool(d["median_exact"])
        s._hist = {int(k): int(v) for k, v in d["hist"]}
        return s


def _bin(x: float) -> int:
    return int(round(math.log(x, LOG_BIN_RATIO))) if x > 0 else -(10**9)


def _unbin(b: int) -> float:
    return LOG_BIN_RATIO**b if b > -(10**9) else 0.0


def _count_into(h: dict, xs: list) -> None:  # noqa: F811 - C-accelerated counting into a dict
    _count_elements(h, xs)


from collections import _count_elements  # noqa: E402  (C helper behind Counter.update)


# Fixed bucket edges (ms) of the cumulative histograms a metrics scraper reads: a step's wall
# time, and a request's latencies. Fixed for the session's life, so every scrape sees the same
# series and counts that only grow (docs/fleet.md).
STEP_EDGES_MS = (0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500,
                 750, 1000, 2000, 5000, 10000)
REQUEST_EDGES_MS = (1, 2.5, 5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500,
                    2000, 3000, 5000, 7500, 10000, 15000, 30000, 60000, 120000)


class Buckets:
    """A histogram with fixed edges whose counts only grow: ``counts[i]`` holds the values in
    ``(edges[i-1], edges[i]]`` (the last slot: above every edge), as Prometheus' ``le`` buckets
    do. Unlike :class:`RunningStats` it is never reset (``r`` resets what a person reads, not
    what a scraper has already counted), and it is a few dozen integers however long the
    session runs."""

    __slots__ = ("edges", "counts", "total", "count")

    def __init__(self, edges: tuple = REQUEST_EDGES_MS) -> None:
        self.edges = tuple(edges)
        self.counts = [0] * (len(self.edges) + 1)
        self.total = 0.0
        self.count = 0

    def add(self, x: float) -> None:
        self.counts[_bisect_left(self.edges, x)] += 1
        self.total += x
        self.count += 1

    def add_many(self, xs) -> None:
        edges, counts = self.edges, self.counts
        n = 0
        for x in xs:
            counts[_bisect_left(edges, x)] += 1
            self.total += x
            n += 1
        self.count += n

    def cumulative(self) -> list:
        """[(upper edge, values at or below it), ...], the last edge ``inf``."""
        out, run = [], 0
        for edge, c in zip(self.edges + (math.inf,), self.counts):
            run += c
            out.append((edge, run))
        return out

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile`` over these buckets (linear inside a bucket; the
        first bucket's lower edge 0); None when empty."""
        if not self.count:
            return None
        rank = q * self.count
        prev_edge, prev = 0.0, 0
        for edge, cum in self.cumulative():
            if cum >= rank:
                if edge == math.inf:
                    return float(self.edges[-1])
                if cum == prev:
                    return float(edge)
                return prev_edge + (edge - prev_edge) * (rank - prev) / (cum - prev)
            prev_edge, prev = float(edge), cum
        return float(self.edges[-1])

    def copy(self) -> "Buckets":
        b = Buckets.__new__(Buckets)
        b.edges, b.counts, b.total, b.count = self.edges, list(self.counts), self.total, self.count
        return b


from bisect import bisect_left as _bisect_left  # noqa: E402
