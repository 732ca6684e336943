"""The live overhead figure says what it counts: its own threads' CPU time, and, while CUPTI is
attached, that CUPTI's work inside the decoding thread's CUDA calls is not in it (compiled mode:
most of a session's cost, measured on the H100: docs/results.md#overhead)."""
from __future__ import annotations

from tuiprof.sampling import COMPILED_CUPTI_COST, overhead_method


def test_without_cupti_the_figure_is_the_threads_alone():
    assert overhead_method(False, "compiled") == \
        "tuiprof threads' CPU + step hooks / wall; not counted: GIL waits"


def test_bursts_only_names_what_it_does_not_count():
    text = overhead_method(True, "compiled", bursts_only=True)
    assert "step hooks + CUPTI switches" in text
    assert "not counted: GIL waits, graph re-recording" in text


def test_an_attached_cupti_is_named_as_not_counted():
    eager = overhead_method(True, "eager")
    assert "not counted: CUPTI in CUDA calls" in eager and COMPILED_CUPTI_COST not in eager
    compiled = overhead_method(True, "compiled")
    assert COMPILED_CUPTI_COST in compiled and "--no-cupti" in compiled
