"""What a front end (the Textual app, the headless CLI, a benchmark) can ask of a session.

A live profiler, a replay and a reopened snapshot all implement :class:`SessionControl`, so the
UI has one code path. Every method returns at once (work happens on the source's own threads)
and answers with a short message for the status line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .startup import LoadProgress
from .store import SessionStore


@dataclass
class SourceStatus:
    """State of the source, read by the UI on its timer."""

    state: str = "idle"          # loading | prefill | decode | compiling | paused | stopped | done | error | read-only
    mode: str = "eager"          # eager | compiled
    message: str = ""            # last one-line message (errors included)
    compiling_since: float | None = None   # time.monotonic() when a compile began
    live: bool = False           # True for a live session (keys that change it are enabled)
    batch: int = 1               # sequences decoded together now
    want_batch: int = 1          # the batch asked for (differs while a switch is under way)
    max_batch: int = 1           # the largest batch b may ask for
    compiling_for: str = ""      # what a compile in the background is for ("compiled b8")
    extra: dict = field(default_factory=dict)
    progress: LoadProgress | None = None   # start-up phases until the first token (live sessions)


class SessionControl:
    """Base class: a read-only source. Live sources override what they support."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.status = SourceStatus(state="read-only")

    def start(self) -> None:
        """Start producing (threads); returns at once."""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every thread and flush collectors; blocks at most ``timeout`` seconds."""

    def close(self) -> None:
        """Release what :meth:`stop` keeps for the last reads (a session process); optional."""

    def toggle_mode(self) -> str:
        return "read-only session: switching modes needs a live run"

    def toggle_pause(self) -> str:
        return "read-only session: nothing to pause"

    def change_batch(self, up: bool) -> str:
        """``b`` doubles the batch, ``B`` halves it (within 1 … ``status.max_batch``)."""
        return "read-only session: changing the batch needs a live run"

    def reset(self) -> str:
        self.store.reset()
        return "statistics reset"

    def has_output(self) -> bool:
        """True when the session profiles a program whose output can be shown (key ``l``)."""
        return "program" in self.store.meta

    def disabled_actions(self) -> dict[str, str]:
        """Actions (by name) this session cannot do, with the reason to show; the app shows
        their keys disabled."""
        return {}

    def interrupt(self) -> str | None:
        """Ctrl-C for the profiled program; None when there is nothing to interrupt (the
        app then stops the session)."""
        return None


def batch_target(status: SourceStatus, up: bool) -> int | None:
    """The batch ``b`` (double) or ``B`` (halve) asks for, None at the limit."""
    cur = status.want_batch or status.batch or 1
    want = min(cur * 2, status.max_batch) if up else max(1, cur // 2)
    return None if want == cur else want


def batch_limit_message(status: SourceStatus, up: bool) -> str:
    if up:
        return (f"batch {status.want_batch} is the largest allowed (--max-batch "
                f"{status.max_batch})")
    return "batch 1 is the smallest"
