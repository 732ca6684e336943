"""The panes say what tracing changes (Pilot, real Textual, a real store of traced and untraced
compiled steps): a traced step's time beside the untraced median, the basis of the busy share,
short kernels' times as upper bounds, and the same in a reopened snapshot."""
from __future__ import annotations

from tracing_data import traced_store

from tuiprof.export.snapshot import read_snapshot, write_snapshot
from tuiprof.ui.derive import compare, traced_vs_untraced, latest_traced

from .conftest import screen_text
from .test_figures import _run


def test_latency_footer_puts_a_traced_step_beside_the_untraced_median():
    store = traced_store()
    view = store.view(raw=False)
    k = latest_traced(view, "decode", "compiled")
    assert traced_vs_untraced(view, "decode", "compiled", k) == \
        "GPU 3.10 vs 2.60 ms untraced (+19 %: tracing cost)"

    async def body(app, pilot):
        footer = str(app.query_one("#latency-summary").render())
        assert (f"traced #{k.seq}: GPU 3.10 vs 2.60 ms untraced (+19 %: tracing cost)"
                " · busy 54.7% of an untraced step · 100 kernels") in footer, footer
        shown = next(ln for ln in screen_text(app).splitlines() if f"traced #{k.seq}" in ln)
        assert "(+19 %: tracing cost) · busy 54.7% of an untraced step" in shown, shown
        await pilot.press("3")
        await pilot.pause()
        text = screen_text(app)
        assert "busy share of an untraced step (2.74 ms)" in text, text
    _run(store, (200, 50), body)


def test_kernels_caption_and_cells_say_what_tracing_changes():
    async def body(app, pilot):
        await pilot.press("2")
        await pilot.pause()
        cap = str(app.query_one("#kernels-caption").render())
        assert "traced steps +19 % (tracing cost)" in cap, cap
        assert "≤: kernels under 5 µs, CUPTI's time may hold tracing's own (upper bound)" \
            in cap, cap
        text = screen_text(app)
        tiny = next(ln for ln in text.splitlines() if "tiny_elementwise" in ln)
        gemv = next(ln for ln in text.splitlines() if "gemv_bf16" in ln)
        assert "≤2.00 µs" in tiny and "≤" not in gemv, (tiny, gemv)
    _run(traced_store(), (200, 50), body)


def test_compare_names_the_busy_basis_and_the_tracing_cost():
    store = traced_store()
    _eager, co = compare(store.view(raw=False))
    assert co.busy_wall_ms == 2.74 and round(co.busy_pct, 1) == 54.7
    assert round(co.tracing.ratio, 3) == 1.192

    async def body(app, pilot):
        await pilot.press("v")
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "kernel-busy share (of an untraced step)" in text, text
        assert "traced / untraced step (tracing cost)" in text and "×1.192" in text, text
        assert "GPU busy of an untraced step" in text, text
    _run(store, (200, 50), body)


def test_a_reopened_snapshot_keeps_traced_and_untraced_steps_apart(tmp_path):
    path = write_snapshot(traced_store().view(), tmp_path / "s.json")
    back = read_snapshot(path)
    assert [t.attached for t in back.tokens].count(False) == 48
    k = latest_traced(back, "decode", "compiled")
    assert traced_vs_untraced(back, "decode", "compiled", k).endswith("(+19 %: tracing cost)")
    import json
    doc = json.loads(path.read_text())
    mode = doc["summary"]["modes"]["compiled"]
    assert mode["gpu_busy_basis"] == "untraced"
    assert mode["untraced_ms_per_step_median"] == 2.74
    assert mode["tracing_cost"]["source"] == "gpu_ms"
    assert round(mode["tracing_cost"]["ratio"], 3) == 1.192
    assert doc["summary"]["kernel_times"]["read_as"] == "upper bounds below small_kernel_ns"
    # a version 4 file (nothing told traced from untraced steps) still loads, on the old basis
    doc["schema_version"] = 4
    for t in doc["tokens"]:
        del t["attached"]
    for t in doc["token_stats"]:
        for k in ("untraced_ms", "untraced_gpu_ms", "traced_step_ms", "traced_gpu_ms"):
            del t["stats"][k]
    old = tmp_path / "v4.json"
    old.write_text(json.dumps(doc))
    view = read_snapshot(old)
    assert all(t.attached is None for t in view.tokens)
    assert traced_vs_untraced(view, "decode", "compiled") == ""
    assert compare(view)[1].busy_wall_ms is None


def test_a_short_kernels_detail_and_the_compare_table_read_its_time_as_an_upper_bound():
    from rich.console import Console

    from tuiprof.ui.derive import kernel_ns_text, kernel_rows
    from tuiprof.ui.screens.compare import render_top
    from tuiprof.ui.screens.detail import render_detail

    view = traced_store().view(raw=False)
    rows = {r.name: r for r in kernel_rows(view, "compiled", "decode")}
    tiny, gemv = rows["tiny_elementwise"], rows["gemv_bf16"]
    assert kernel_ns_text(tiny, tiny.stats.mean) == "≤2.00 µs"
    assert kernel_ns_text(gemv, gemv.stats.mean) == "28.00 µs"
    console = Console(width=200, record=True)
    console.print(render_detail(tiny, view))
    assert "upper bounds: the times above are CUPTI's" in console.export_text()
    console = Console(width=200, record=True)
    console.print(render_detail(gemv, view))
    assert "read as" not in console.export_text()
    console = Console(width=200, record=True)
    console.print(render_top(compare(view)[1]))
    assert "≤2.00 µs" in console.export_text()


def test_the_steps_csv_says_which_steps_ran_untraced(tmp_path):
    import csv

    from tuiprof.export.steps_csv import write_steps_csv

    path = write_steps_csv(traced_store().view(), tmp_path / "steps.csv")
    got = [(r["untraced"], r["traced"]) for r in csv.DictReader(path.open())]
    assert got.count(("1", "0")) == 48 and got.count(("0", "1")) == 4
    assert got.count(("0", "0")) == 1          # the attach lead: attached, not traced


def test_with_the_constant_measured_kernel_times_are_corrected_and_the_caption_says_so(
        monkeypatch):
    from tuiprof.analysis import tracing

    monkeypatch.setattr(tracing, "DURATION_INFLATION_NS", {"stream": None, "graph": 400.0})

    async def body(app, pilot):
        await pilot.press("2")
        await pilot.pause()
        cap = str(app.query_one("#kernels-caption").render())
        assert "kernel times less tracing's own: 0.40 µs a graph kernel" in cap, cap
        text = screen_text(app)
        tiny = next(ln for ln in text.splitlines() if "tiny_elementwise" in ln)
        assert "1.60 µs" in tiny and "≤" not in tiny, tiny
    _run(traced_store(), (200, 50), body)
