"""Steps the program marks itself: :func:`tuiprof.step` and :func:`tuiprof.mark_prefill`
(``tuiprof/marks.py``) report to the session's recorder while it is installed."""
from __future__ import annotations

from typing import Any

from .. import marks
from .steps import StepRecorder

SOURCE = "api"


class ApiSteps:
    """Points :data:`tuiprof.marks._sink` at the recorder while installed."""

    name = SOURCE

    def __init__(self, recorder: StepRecorder) -> None:
        self.recorder = recorder

    def install(self) -> None:
        marks._sink = self.recorder

    def uninstall(self) -> None:
        if marks._sink is self.recorder:
            marks._sink = None
        self.recorder.end(SOURCE)


def make(session: Any) -> ApiSteps | None:
    return None if session.step_ranges else ApiSteps(session.recorder)
