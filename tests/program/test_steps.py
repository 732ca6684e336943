"""The step recorder: every source reaches the store as tokens, by precedence, never twice."""
from __future__ import annotations

import threading
import time

import tuiprof
from tuiprof import marks
from tuiprof.program.steps import StepRecorder
from tuiprof.program.windows_steps import WindowSteps

from .conftest import rows


def test_marks_do_nothing_without_a_session():
    assert marks._sink is None
    a, b = tuiprof.step("decode", tokens=4), tuiprof.mark_prefill(tokens=4)
    assert a is b is marks._NOOP           # one shared object, nothing allocated per call
    with tuiprof.step():
        pass


def test_api_steps_become_tokens_with_batch_and_positions(prof):
    rec = StepRecorder(prof)
    marks._sink = rec
    try:
        tuiprof.mark_prefill(tokens=3)     # a plain call: lasts until the next step begins
        time.sleep(0.002)
        for _ in range(2):
            with tuiprof.step("decode", tokens=3):
                time.sleep(0.002)
    finally:
        marks._sink = None
    got = [(t.phase, t.batch, t.positions, t.step, t.cycle) for t in rows(prof)]
    assert got == [("prefill", 3, 3, -1, 0), ("decode", 3, 3, 0, 0), ("decode", 3, 3, 1, 0)]
    assert all(t.host_ms > 1.0 for t in rows(prof))
    assert rec.source == "api" and rec.counts["api"] == 3


def test_marks_inside_a_generate_scope_are_ignored_and_an_enclosing_step_ends(prof):
    rec = StepRecorder(prof)
    outer = rec.api_step("decode", 1)
    outer.__enter__()                       # with tuiprof.step(): model.generate(...)
    rec.enter_scope("transformers")         # generate() begins: the api step ends here
    rec.begin("transformers", "prefill", batch=2, positions=16)
    with rec.api_step("decode", 2):         # a mark inside generate(): not a second token
        pass
    rec.begin("transformers", "decode", batch=2, positions=2)
    rec.exit_scope("transformers")
    outer.__exit__(None, None, None)        # ends nothing: its step already ended
    got = [(t.phase, t.batch) for t in rows(prof)]
    assert got == [("decode", 1), ("prefill", 2), ("decode", 2)]
    assert rec.nested == 1
    assert rec.source == "transformers"


def test_windows_cut_time_until_the_program_marks_a_step(prof):
    rec = StepRecorder(prof)
    win = WindowSteps(rec, window_ms=10)
    win.install()
    time.sleep(0.08)
    with rec.api_step("decode", 1):
        pass
    time.sleep(0.05)                        # windows are over for good
    win.uninstall()
    phases = [t.phase for t in rows(prof)]
    assert phases.count("window") >= 3
    assert phases[-1] == "decode" and "window" not in phases[phases.index("decode"):]
    assert all(t.host_ms > 0 for t in rows(prof) if t.phase == "window")


def test_windows_end_when_another_process_runs_the_steps(prof):
    """vLLM's API server runs no model steps (its engine core does): once its app is built,
    its windows stop, the snapshot says where its steps are and no finding asks to mark them."""
    from tuiprof.analysis.findings import _no_steps  # noqa: PLC0415
    from tuiprof.program.vllm_steps import ELSEWHERE  # noqa: PLC0415

    rec = StepRecorder(prof)
    win = WindowSteps(rec, window_ms=10)
    win.install()
    time.sleep(0.06)
    rec.steps_elsewhere(ELSEWHERE)
    win._thread.join(2)
    assert not win._thread.is_alive()          # the windows' thread is gone, not idling
    n = len(rows(prof))
    time.sleep(0.05)
    win.uninstall()
    assert n >= 2 and len(rows(prof)) == n      # no window after
    view = prof.store.view()
    view.meta.update({"source": "program", "step_source": "windows", "window_ms": 10,
                      "steps_elsewhere": ELSEWHERE})
    assert _no_steps(view) == []
    view.meta.pop("steps_elsewhere")
    assert [f.id for f in _no_steps(view)] == ["no-step-boundaries"]


def test_pause_holds_the_program_at_its_next_step(prof):
    rec = StepRecorder(prof)
    done = []

    def loop():
        for _ in range(3):
            with rec.api_step("decode", 1):
                pass
            done.append(1)

    rec.pause()
    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.2)
    assert done == [] and prof.status.state == "paused"
    rec.resume()
    t.join(5)
    assert len(done) == 3 and len(rows(prof)) == 3


def test_window_steps_are_stored_at_their_end_after_a_launch_point_was_seen(prof):
    """Windows (and NVTX ranges) have no moment where the device work is queued: once another
    source has reported one, their steps are still stored as each ends, not a step later."""
    rec = StepRecorder(prof, sources=("transformers", "windows"))
    rec.enter_scope("transformers")
    rec.begin("transformers", "prefill", positions=8)
    rec.launched("transformers")
    rec.exit_scope("transformers")
    for i in range(4):
        rec.begin("windows", "window")
        if i:
            assert [t.phase for t in rows(prof)] == ["prefill"] + ["window"] * i


def test_header_counts_marked_steps_not_the_windows_before_them(prof):
    """The windows cut while a program imports and builds its model are kept (phase window),
    but once it marks steps the header's step count is of those steps only."""
    from tuiprof.ui.derive import header_numbers

    rec = StepRecorder(prof, sources=("transformers", "windows"))
    for _ in range(3):
        rec.begin("windows", "window")
    assert header_numbers(prof.store.view(raw=False), "eager").steps == 2   # 2 windows ended
    rec.enter_scope("transformers")
    rec.begin("transformers", "prefill", positions=8)
    for _ in range(4):
        rec.begin("transformers", "decode")
    rec.exit_scope("transformers")
    view = prof.store.view(raw=False)
    assert view.counters["window_steps"] == 3 and view.counters["tokens"] == 8
    assert header_numbers(view, "eager").steps == 5
