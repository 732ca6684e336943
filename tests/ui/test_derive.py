"""Pure derivations and formatting, checked against numbers counted from the recordings' JSON."""
from __future__ import annotations

import pytest
from recordings import launches

from tuiprof.ui import format as fmt
from tuiprof.ui.derive import (busy_fraction, compare, header_numbers, kernel_rows,
                               latency_series, percentile, resolve_kernel_mode, select_kernels)


def test_format_helpers():
    assert fmt.ns(4760) == "4.76 µs" and fmt.ns(1.23e6) == "1.23 ms" and fmt.ns(None) == "–"
    assert fmt.nbytes(1024**3 * 1.2) == "1.20 GiB" and fmt.nbytes(12) == "12 B"
    assert fmt.dim3((4, 12, 1)) == "4×12×1"
    s = fmt.spark([0, 50, 100, None], 6, 0, 100)
    assert len(s) == 6 and s.endswith("█ ") and s.startswith("  ")
    assert fmt.spark([1, 1, 1], 3, 0, 100) == "▁▁▁"       # 1% stays low on a 0..100 scale


def test_percentile():
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99


def test_header_numbers_match_the_recordings(store, eager_raw, eager_facts, compiled_facts):
    h = header_numbers(store.view(), "eager")
    assert h.device == eager_raw["meta"]["device"] == "cuda"   # the GPU's name: device_name
    assert h.weights == eager_raw["meta"]["weights"] and h.dtype == eager_raw["meta"]["dtype"]
    assert h.steps == eager_facts.tokens + compiled_facts.tokens and h.batch == 1
    assert h.itl_p50 == pytest.approx(eager_facts.step_ms_median, rel=0.03)
    hc = header_numbers(store.view(), "compiled")
    assert hc.itl_p50 == pytest.approx(compiled_facts.step_ms_median, rel=0.06)
    assert hc.tok_s > 10 * h.tok_s


def test_comparison_kernels_per_token(store, eager_facts, compiled_facts):
    ea, co = compare(store.view())
    assert ea.kernels_token == pytest.approx(eager_facts.kernels_per_step_median)
    assert co.kernels_token == pytest.approx(compiled_facts.kernels_per_step_median)
    assert co.graph_pct > 99 and ea.graph_pct == 0
    assert ea.alloc_req_token > 1000 and co.alloc_req_token < 10   # ~1,770 vs ~4 a step
    assert ea.busy_pct < 15 < co.busy_pct


def test_kernel_rows_and_selection(store, eager_raw):
    view = store.view()
    rows = kernel_rows(view, "eager", "decode")
    assert sum(r.pct for r in rows) == pytest.approx(100.0)
    nvjet = [r for r in rows if r.name.startswith("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT")]
    assert nvjet and nvjet[0].stats.count == launches(eager_raw, nvjet[0].name)
    top = select_kernels(rows, "pct", True, "", 5)
    assert [r.stats.total for r in top] == sorted((r.stats.total for r in top), reverse=True)
    assert select_kernels(rows, "pct", True, "no-such-kernel", 5) == []
    # The compiled run's prefill ran eagerly: the table falls back to the mode that has data.
    assert resolve_kernel_mode(view, "compiled", "prefill") == "eager"
    merged = kernel_rows(view, "eager", "all")
    assert sum(r.stats.count for r in merged) >= sum(r.stats.count for r in rows)


def test_latency_series_marks_prefill_and_mode_switch(store, eager_facts, compiled_facts):
    s = latency_series(store.view(), 256)
    assert len(s.seq) == eager_facts.tokens + compiled_facts.tokens
    assert [seq for seq, _ in s.prefill] == [0, eager_facts.tokens]
    assert any("compiled" in text for _, text in s.mode_marks)
    assert all(g is not None for g in s.gpu)


def test_busy_fraction_eager_is_low(store):
    rows = [r for r in store.view().tokens if r.phase == "decode" and r.mode == "eager"]
    assert 5 < busy_fraction(rows[10]) < 15                    # 4.1 ms of kernels in ~50 ms


def test_launches_per_token_count_traced_tokens_only(recordings):
    """Sampling leaves most tokens without kernel records: launches per token must be counted
    over the traced tokens, not over every token (the compare view showed 0.6 for a GEMV that
    runs 6 times per compiled token)."""
    from tuiprof.collect.replay import replay_into
    from tuiprof.store import SessionStore
    from tuiprof.ui.derive import kernel_rows

    store = SessionStore()
    replay_into(recordings["compiled"], store)
    before = {r.name: r.per_token for r in kernel_rows(store.view(raw=False), "compiled", "decode")}
    t = store.view(raw=False).tokens[-1].end_ns
    for i in range(500):                      # untraced tokens, as between sampling bursts
        seq = store.begin_token("decode", "compiled", t + 10 + i * 1000, 1000 + i, sampled=False)
        store.end_token(seq, t + 500 + i * 1000, 3.0)
    after = {r.name: r.per_token for r in kernel_rows(store.view(raw=False), "compiled", "decode")}
    assert after == before
    nvjet = [v for k, v in after.items() if "nvjet" in k and "64x8" in k and "splitK" not in k]
    assert nvjet and all(v >= 5 for v in nvjet), nvjet


def test_compile_cost_is_the_median_beside_the_compile_against_the_clean_one():
    """Steps decoded while a compile ran are timed apart; what the compile cost them is their
    median against the clean median (the status line and latency pane show it)."""
    from tuiprof.store import SessionStore
    from tuiprof.ui.derive import compile_cost, compile_cost_text

    store = SessionStore()
    t = 0
    for step, (ms, busy) in enumerate([(8.0, False)] * 5 + [(12.0, True)] * 3):
        seq = store.begin_token("decode", "eager", t, step, compiling=busy)
        t += int(ms * 1e6)
        store.end_token(seq, t, ms)
    view = store.view()
    assert compile_cost(view, "eager") == (12.0, 8.0, 3)
    assert compile_cost(view, "compiled") is None
    assert compile_cost_text((12.0, 8.0, 3)) == "beside the compile: 12.00 ms/step vs 8.00 clean (3 steps, +50%)"
    head = header_numbers(view, "eager")     # the compile runs now: the header says so and
    assert head.beside_compile and head.tok_s == pytest.approx(1000 / 12)   # shows those steps


def test_without_cupti_no_step_counts_as_traced():
    """On a CPU (or with --no-cupti) every step is 'sampled' by the schedule but none has kernel
    records: the compare screen said "traced decode steps 3,275" in tmux; it must say none."""
    from tuiprof.store import SessionStore
    from tuiprof.ui.derive import config_summary, traced_tokens

    store = SessionStore()
    for i in range(5):
        seq = store.begin_token("decode", "eager", i * 1000, i)
        store.end_token(seq, i * 1000 + 500, 0.5)
    assert traced_tokens(store.view(), "decode", "eager") == 5   # CUPTI's state unknown
    store.set_collector("cupti", False, "no CUPTI: CUDA driver is not found")
    assert traced_tokens(store.view(), "decode", "eager") == 0
    s = config_summary(store.view(), (1, "eager"))
    assert s.traced == 0 and s.tokens == 5
    # and no kernel figure is made of nothing: "–", not "0 kernels/step" or "0.0 % busy"
    assert s.kernels_token is None and s.busy_pct is None and s.graph_pct is None


def test_without_cupti_the_snapshot_summary_and_the_diff_trace_nothing():
    """The compare screen's Summary table (export.diff, also the snapshot's summary and
    ``tuiprof diff``) said "traced decode steps 1,282", "kernels/step 0" and "GPU busy 0.0 %"
    in tmux on the CPU, below a table that said "–" for the same figures."""
    from tuiprof.export.diff import diff_modes
    from tuiprof.export.summary import mode_summary
    from tuiprof.store import SessionStore

    store = SessionStore()
    for i, mode in enumerate(["eager"] * 5 + ["compiled"] * 4):
        seq = store.begin_token("decode", mode, i * 1000, i)
        store.end_token(seq, i * 1000 + 500, 0.5)
    store.set_collector("cupti", False, "no CUPTI: CUDA driver is not found")
    ms = mode_summary(store.view(), "eager")
    assert ms["decode_tokens"] == 5 and ms["sampled_tokens"] == 0
    assert (ms["kernels_per_token_median"], ms["gpu_busy_fraction"],
            ms["kernel_ms_per_token_median"]) == (None, None, None)
    rows = {c.label: (c.a, c.b) for c in diff_modes(store.view(), "eager", "compiled").metrics}
    assert rows["traced decode steps"] == (None, None)
    assert rows["decode steps (all)"] == (5, 4)
    assert rows["kernels/step (median)"] == (None, None)
    assert rows["GPU busy fraction"] == (None, None)


def test_every_table_gives_one_ms_per_step_for_a_configuration():
    """On the CPU the compare screen said "ms/step (median) 0.73 ms" for b1 compiled in its top
    table, the median of the last 2,048 steps, and "0.63 ms" in the table of every
    configuration just below, the whole session's: one figure, two values. All tables (and
    the snapshot summary) now give the whole session's median, as the step counts and tokens/s
    beside it."""
    from tuiprof.analysis.batch import config_summaries
    from tuiprof.export.diff import diff_modes
    from tuiprof.export.summary import mode_summary
    from tuiprof.store import SessionStore
    from tuiprof.ui.derive import config_summary

    store = SessionStore(series_len=10)
    t = 0
    for i in range(31):  # 21 fast steps, then 10 slow ones: the series holds only slow ones
        ms = 1.0 if i < 21 else 5.0
        seq = store.begin_token("decode", "compiled", t, i)
        t += int(ms * 1e6)
        store.end_token(seq, t, ms)
    view = store.view()
    assert {r.host_ms for r in view.tokens} == {5.0}
    assert config_summary(view, (1, "compiled")).ms_token == 1.0
    assert [c.ms_step for c in config_summaries(view)] == [1.0]
    assert mode_summary(view, "compiled")["ms_per_token_median"] == 1.0
    store.begin_token("decode", "eager", t, 0)  # a second mode, for the diff
    store.end_token(store.next_seq() - 1, t + 10**6, 2.0)
    row = next(c for c in diff_modes(store.view(), "eager", "compiled").metrics
               if c.label == "ms/step (median)")
    assert row.b == 1.0


def test_snapshots_without_the_busy_share_still_name_earlier_traced_steps():
    """Snapshots written before the store kept "busy_pct" still give the running figures of
    traced steps that left the series (their old approximation), not "none yet"."""
    from tuiprof.store import RunningStats, SessionStore
    from tuiprof.ui.derive import earlier_traced

    view = SessionStore().view()
    busy, host, kernels = RunningStats(), RunningStats(), RunningStats()
    for _ in range(4):
        busy.add(2_000_000)   # 2 ms of kernels in a 4 ms step
        host.add(4.0)
        kernels.add(540)
    view.token_stats[("decode", "compiled")] = {"busy_ns": busy, "host_ms": host,
                                                "kernels": kernels}
    e = earlier_traced(view, "decode", "compiled")
    assert (e.count, e.kernels, e.busy_pct) == (4, 540, 50.0)


def test_the_header_step_time_leaves_traced_steps_out_or_says_they_are_traced():
    from tracing_data import traced_store

    # bursts: enough untraced steps shown, the traced ones (slower) are left out of ms/step
    h = header_numbers(traced_store(untraced=40, traced=4, untraced_ms=2.74, traced_ms=9.0)
                       .view(), "compiled")
    assert h.itl_p99 == pytest.approx(2.74) and not h.itl_traced
    # every step traced: the figure is of traced steps, and the header says so
    h = header_numbers(traced_store(untraced=0, traced=30, after=0, traced_ms=3.2).view(),
                       "compiled")
    assert h.itl_p50 == pytest.approx(3.2) and h.itl_traced
