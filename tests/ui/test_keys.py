"""Pilot tests: every key, and its effect, on real replayed H100 data."""
from __future__ import annotations

import asyncio
import json

import pytest

from tuiprof.ui import adapters
from tuiprof.ui.registry import PANES, keys as pane_keys
from tuiprof.ui.app import make_app
from tuiprof.ui.screens.compare import CompareScreen
from tuiprof.ui.screens.detail import KernelDetailScreen
from tuiprof.ui.screens.help import HelpScreen
from tuiprof.ui.widgets.kernels_pane import KernelsPane

from .conftest import FakeControl, screen_text


def drive(app, body, size=(200, 50)):
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.refresh_now()
            await pilot.pause()
            await body(pilot)
    asyncio.run(main())


def new_app(control, tmp_path, **kw):
    kw.setdefault("refresh_hz", 0)
    kw.setdefault("start_control", True)
    kw.setdefault("deterministic", True)
    return make_app(control, title="test", export_dir=tmp_path, **kw)


@pytest.fixture
def fake_writers(monkeypatch):
    """Exports stubbed so the key plumbing is tested whatever tuiprof.export provides."""
    written = []

    def write_snapshot(view, path):
        path.write_text(json.dumps({"tokens": len(view.tokens)}))
        written.append(("snapshot", path))
        return path

    def write_nsys(view, directory):
        (directory / "cuda_gpu_kern_sum.csv").write_text("x\n")
        written.append(("nsys", directory))
        return directory

    def export(name, view, path):
        if name == "nsys":
            path.mkdir(parents=True, exist_ok=True)
            return write_nsys(view, path)
        return write_snapshot(view, path)

    monkeypatch.setattr(adapters, "export", export)
    return written


def test_mount_starts_control_and_shows_data(control, tmp_path, eager_facts, compiled_facts):
    app = new_app(control, tmp_path)

    async def body(pilot):
        text = screen_text(app)
        assert "qwen3-0.6b · cuda · bfloat16" in text          # the recordings' meta device
        assert f"steps {eager_facts.tokens + compiled_facts.tokens}" in text and "batch 1" in text
        assert "nvjet" in text            # top kernel of compiled decode
        assert "kernel busy/step" in text and "GPU util (NVML)" in text
        assert "overhead (hidden)" in text     # deterministic mode hides timings
    drive(app, body)
    assert control.calls[0] == "start"


def test_session_keys_call_the_control(control, tmp_path):
    app = new_app(control, tmp_path)

    async def body(pilot):
        await pilot.press("c")
        await pilot.pause()
        assert control.calls.count("toggle_mode") == 1
        assert "compiling" in screen_text(app)
        await pilot.press("space")
        assert control.calls.count("toggle_pause") == 1
        await pilot.press("r")
        await pilot.pause()
        assert control.calls.count("reset") == 1
        assert app.view.counters["tokens"] == 0
        assert "steps 0" in screen_text(app)
    drive(app, body)


def test_compare_help_theme_freeze(control, tmp_path, eager_facts, compiled_facts):
    app = new_app(control, tmp_path)

    async def body(pilot):
        await pilot.press("v")
        await pilot.pause(0.3)      # the comparison is built on a timer after the first paint
        assert isinstance(app.screen, CompareScreen)
        text = screen_text(app)
        assert "tokens/s" in text and "kernels/step" in text
        for f in (eager_facts, compiled_facts):           # kernels per decode step, eager vs compiled
            assert f"{f.kernels_per_step_median:,.0f}" in text
        await pilot.press("v")
        await pilot.pause()
        assert app.screen is app.main
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "eager↔compiled" in screen_text(app) or "torch.compile" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main
        before = app.theme
        await pilot.press("t")
        assert app.theme != before
        await pilot.press("f")
        assert app._frozen
        await pilot.press("f")
        assert not app._frozen
    drive(app, body)


def test_kernel_keys_sort_phase_filter_detail(control, tmp_path):
    app = new_app(control, tmp_path)

    async def body(pilot):
        k = app.main.query_one(KernelsPane)
        assert k.phase == "decode" and k.resolved_mode == "compiled"
        await pilot.press("p")
        assert k.phase == "prefill"
        assert k.resolved_mode == "eager"      # the compiled run's prefill ran eagerly
        await pilot.press("p", "p", "p")
        assert k.phase == "decode"
        await pilot.press("m")
        assert k.mode_choice == "eager" and k.resolved_mode == "eager"
        await pilot.press("m", "m")
        assert k.mode_choice == "auto"
        await pilot.press("s")
        assert k.sort == "count"
        counts = [k.rows[key].stats.count for key in k._order]
        assert counts == sorted(counts, reverse=True)
        await pilot.press("i")
        counts = [k.rows[key].stats.count for key in k._order]
        assert counts == sorted(counts)
        await pilot.press("i", "s", "s", "s", "s", "s", "s")
        assert k.sort == "pct"
        n_all = len(k.rows)
        await pilot.press("slash")
        await pilot.press(*"triton")
        await pilot.pause()
        assert 0 < len(k.rows) < n_all
        assert all("triton" in r.info.short.lower() or "triton" in r.name.lower()
                   or "triton" in r.info.library.lower() for r in k.rows.values())
        await pilot.press("q")                 # typed into the filter, not a quit
        await pilot.pause()
        assert k.filter_text == "tritonq" and not app._quitting
        await pilot.press("backspace", "enter")
        await pilot.pause()
        assert k.filter_text == "triton"
        await pilot.press("enter")             # table focused: details of the cursor row
        await pilot.pause()
        assert isinstance(app.screen, KernelDetailScreen)
        text = screen_text(app)
        assert "demangled" in text and "launch configs" in text and "raw" in text
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert k.filter_text == ""
    drive(app, body)


def test_pane_switching_at_80x24(control, tmp_path):
    app = new_app(control, tmp_path)

    async def body(pilot):
        main = app.main
        assert main.narrow
        assert main.active == 2 and [p.PANE_KEY for p in main.visible_panes()] == ["2"]
        await pilot.press("tab")
        assert main.active == 3
        await pilot.press("shift+tab", "shift+tab")
        assert main.active == 1
        for n in pane_keys():
            await pilot.press(n)
            await pilot.pause()
            assert main.active == int(n)
            assert [p.PANE_KEY for p in main.visible_panes()] == [n]
            assert main.visible_panes()[0].display
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        assert not main.narrow and len(main.visible_panes()) == len([p for p in PANES if not p.optional])
    drive(app, body, size=(80, 24))


def test_exports(control, tmp_path, fake_writers):
    app = new_app(control, tmp_path)

    async def body(pilot):
        await pilot.press("e")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("n")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "nsys written" in app.last_message
    drive(app, body)
    kinds = [k for k, _ in fake_writers]
    assert kinds == ["snapshot", "nsys"]
    snap = fake_writers[0][1]
    assert snap.parent == tmp_path and snap.name.startswith("tuiprof-") and snap.exists()


def test_export_failure_is_reported_not_raised(control, tmp_path, monkeypatch):
    def boom(name, view, path):
        raise OSError("disk full")
    monkeypatch.setattr(adapters, "export", boom)
    app = new_app(control, tmp_path)

    async def body(pilot):
        await pilot.press("e")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "failed" in app.last_message and "disk full" in app.last_message
    drive(app, body)


def test_quit_stops_control_and_writes_auto_snapshot(control, tmp_path, fake_writers):
    app = new_app(control, tmp_path, auto_snapshot=True)

    async def body(pilot):
        await pilot.press("q")
        await app.workers.wait_for_complete()
        await pilot.pause()
    drive(app, body)
    assert "stop" in control.calls
    assert [k for k, _ in fake_writers] == ["snapshot"]
    assert app.return_code == 0
    assert app.return_value == str(fake_writers[0][1])


def test_palette_lists_actions(control, tmp_path):
    app = new_app(control, tmp_path)

    async def body(pilot):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert any("eager and torch.compile" in t for t in titles)
        assert any("Two configurations" in t for t in titles)
    drive(app, body)


def test_refresh_stats_are_measured(control, tmp_path):
    app = new_app(control, tmp_path, deterministic=False)

    async def body(pilot):
        for _ in range(3):
            app.refresh_view(force=True)
        rs = app.refresh_stats
        assert rs["count"] >= 4 and 0 < rs["mean_ms"] <= rs["max_ms"]
        assert "ui " in screen_text(app)
    drive(app, body)


def test_status_line_says_what_is_sampled(recordings, tmp_path):
    """With burst sampling on, the status line names it (kernel figures come from bursts)."""
    import asyncio

    from tuiprof.ui.app import make_app
    from tuiprof.ui.widgets.statusline import StatusLine

    from .conftest import FakeControl, combined_store

    store = combined_store(recordings)
    store.set_collector("cupti", True, "CUPTI: kernels, memcpy, memset, memory, API subset; "
                                       "sampled: 4 tokens in every 128")
    app = make_app(FakeControl(store), export_dir=tmp_path, refresh_hz=0)

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            app.refresh_now()
            await pilot.pause()
            return str(app.main.query_one(StatusLine).render())

    text = asyncio.run(main())
    assert "traced: 4 tokens in every 128" in text, text


def test_compare_paints_a_placeholder_before_the_comparison(control, tmp_path):
    """The comparison takes ~1 s to build on a busy 2-core CPU; until then the screen says so
    instead of showing nothing (tmux at 80×24 caught a blank screen 0.7 s after `v`)."""
    app = new_app(control, tmp_path)

    async def body(pilot):
        app.push_screen(CompareScreen())   # pushed, never shown a view
        await pilot.pause()
        assert "building the comparison" in screen_text(app)
    drive(app, body, size=(80, 24))
