"""Diff of the two recordings: eager vs compiled."""
from __future__ import annotations

import statistics

import pytest
from rich.console import Console

from tuiprof.export.diff import diff, diff_modes, render_rich, render_text

from ._independent import token_windows


def _decode_ms(raw):
    return statistics.median((e - s) / 1e6 for p, s, e in token_windows(raw) if p == "decode")


def _kernels_per_step(raw):
    wins = [(s, e) for p, s, e in token_windows(raw) if p == "decode"]
    starts = sorted(r[2] for r in raw["records"] if r[0] == "K")
    import bisect
    return statistics.median(bisect.bisect_right(starts, e) - bisect.bisect_left(starts, s)
                             for s, e in wins)


@pytest.fixture(scope="module")
def result(eager_view, compiled_view):
    return diff(eager_view, compiled_view, labels=("eager.json", "compiled.json"))


def test_headline_numbers(result, eager_raw, compiled_raw):
    m = {c.label: c for c in result.metrics}
    k = m["kernels/step (median)"]
    assert (k.a, k.b) == (_kernels_per_step(eager_raw), _kernels_per_step(compiled_raw))
    assert k.b < k.a / 3                   # CUDA graphs fuse the compiled step's kernels
    ms = m["ms/step (median)"]
    assert ms.a == pytest.approx(_decode_ms(eager_raw), abs=1e-6)
    assert ms.b == pytest.approx(_decode_ms(compiled_raw), abs=1e-6)
    assert ms.delta == pytest.approx(ms.b - ms.a)
    assert ms.pct == pytest.approx(100 * (ms.b - ms.a) / ms.a)
    assert m["tokens/s"].b > 10 * m["tokens/s"].a
    assert 0 < m["GPU busy fraction"].a < m["GPU busy fraction"].b <= 100


def test_categories_and_kernels(result):
    assert sum(c.a for c in result.categories) == pytest.approx(100.0)
    assert sum(c.b for c in result.categories) == pytest.approx(100.0)
    top = result.kernels[0]
    assert "nvjet" in top.label or "GEMV" in top.label  # the 64x8 GEMV dominates both
    # ~170 launches of ~4.7 µs a decode step: µs per step (decode only)
    assert 700 < top.a < 900 and 700 < top.b < 900
    gone = [c for c in result.kernels if c.b == 0.0]
    assert gone and all(c.pct == pytest.approx(-100.0) for c in gone)


def test_renderers(result):
    m = {c.label: c for c in result.metrics}
    k, ms = m["kernels/step (median)"], m["ms/step (median)"]
    text = render_text(result)
    assert "ms/step (median)" in text and f"{k.a:,.0f}" in text and f"{k.b:,.0f}" in text
    assert f"{ms.pct:.1f}%" in text
    md = render_text(result, markdown=True)
    assert f"| ms/step (median) | {ms.a:.3g} | {ms.b:.3g} |" in md
    con = Console(record=True, width=160)
    con.print(render_rich(result))
    out = con.export_text()
    assert "kernels/step" in out and "Top kernels" in out


def test_diff_modes_within_one_session(both_modes_view, eager_facts, compiled_facts):
    res = diff_modes(both_modes_view, "eager", "compiled")
    m = {c.label: c for c in res.metrics}
    assert (m["kernels/step (median)"].a, m["kernels/step (median)"].b) == (
        eager_facts.kernels_per_step_median, compiled_facts.kernels_per_step_median)
    assert res.a.mode == "eager" and res.b.mode == "compiled"
    n = (eager_facts.decode_steps, compiled_facts.decode_steps)
    assert (m["traced decode steps"].a, m["traced decode steps"].b) == n
    assert (m["decode steps (all)"].a, m["decode steps (all)"].b) == n
