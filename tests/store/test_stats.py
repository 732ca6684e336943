"""RunningStats: exact figures while bounded, nsys conventions (sample stddev, even-count median)."""
from __future__ import annotations

import random
import statistics

import pytest

from tuiprof.store.stats import EXACT_VALUES_CAP, RunningStats


def test_matches_statistics_module():
    rng = random.Random(1)
    xs = [rng.randrange(1, 200) * 32 for _ in range(5001)]
    s = RunningStats()
    s.add_many(xs[:100])
    for x in xs[100:300]:
        s.add(x)
    s.add_many(xs[300:])
    assert (s.count, s.total, s.min, s.max) == (len(xs), sum(xs), min(xs), max(xs))
    assert s.mean == pytest.approx(statistics.mean(xs))
    assert s.stddev == pytest.approx(statistics.stdev(xs))
    assert s.median == statistics.median(xs) and s.median_exact


def test_even_count_median_and_single_value():
    s = RunningStats()
    s.add_many([1, 2, 3, 10])
    assert s.median == 2.5
    one = RunningStats()
    one.add(7)
    assert one.stddev == 0.0 and one.median == 7


def test_bounded_when_values_are_all_distinct():
    s = RunningStats()
    s.add_many(list(range(1, 3 * EXACT_VALUES_CAP)))
    assert not s.median_exact
    assert len(s.to_dict()["hist"]) < EXACT_VALUES_CAP
    assert s.median == pytest.approx(1.5 * EXACT_VALUES_CAP, rel=0.01)


def test_round_trip_and_merge():
    a, b = RunningStats(), RunningStats()
    a.add_many([5, 6, 7])
    b.add_many([1, 100])
    c = RunningStats.from_dict(a.to_dict())
    c.merge(b)
    both = [5, 6, 7, 1, 100]
    assert c.count == 5 and c.median == 6 and c.stddev == pytest.approx(statistics.stdev(both))
