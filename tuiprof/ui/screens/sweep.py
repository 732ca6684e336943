"""A Textual screen that runs a sweep in a thread worker and shows its cells as they finish.

UI only: ``tuiprof.sweep``'s core never imports this module. The worker posts messages
(never touches widgets); ``Escape`` cancels the remaining cells and closes the screen.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tuiprof.sweep.results import SweepResult
from tuiprof.sweep.runner import Progress, run_sweep

COLUMNS = ("model", "L", "pass", "mode", "attn", "status", "median ms", "GEMM %", "dominant")


class SweepScreen(Screen):
    """Runs ``run_sweep(**kwargs)``; ``on_done(result)`` is called on the UI thread at the end."""

    BINDINGS = [Binding("escape", "cancel", "Cancel / close")]

    class Step(Message):
        """A sweep progress event, posted from the worker thread."""

        def __init__(self, progress: Progress) -> None:
            super().__init__()
            self.progress = progress

    class Finished(Message):
        """The sweep ended (or failed with ``error``)."""

        def __init__(self, result: SweepResult | None, error: str | None = None) -> None:
            super().__init__()
            self.result = result
            self.error = error

    def __init__(self, sweep_kwargs: dict[str, Any], on_done: Callable[[SweepResult], None] | None = None) -> None:
        super().__init__()
        self.sweep_kwargs = dict(sweep_kwargs)
        self.on_done = on_done
        self.cancel_event = threading.Event()
        self.result: SweepResult | None = None

    def compose(self) -> ComposeResult:
        yield Static("starting sweep…", id="sweep-status")
        yield DataTable(id="sweep-table", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self._run()

    @work(thread=True, exclusive=True, exit_on_error=False, group="sweep")
    def _run(self) -> None:
        try:
            result = run_sweep(**self.sweep_kwargs, progress=lambda p: self.post_message(self.Step(p)),
                               cancel=self.cancel_event)
        except Exception as exc:  # noqa: BLE001 - shown on the screen
            self.post_message(self.Finished(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(self.Finished(result))

    def on_sweep_screen_step(self, message: "SweepScreen.Step") -> None:
        p = message.progress
        self.query_one("#sweep-status", Static).update(p.line())
        r = p.result
        if p.phase != "done" or r is None:
            return
        c = r.cell
        prof = r.profile
        self.query_one(DataTable).add_row(
            c.model, str(c.seq_len), c.pass_name, c.mode, c.attention or "", r.status,
            f"{r.median_ms:.2f}" if r.median_ms is not None else "",
            f"{100 * prof.gemm_fraction:.1f}" if prof else "", (prof.dominant or "")[:48] if prof else "",
        )

    def on_sweep_screen_finished(self, message: "SweepScreen.Finished") -> None:
        status = self.query_one("#sweep-status", Static)
        if message.error:
            status.update(f"sweep failed: {message.error}")
            return
        self.result = message.result
        bad = sum(r.status in ("oom", "error") for r in message.result.cells)
        status.update(f"done: {len(message.result.cells)} cells, {bad} failed, {message.result.elapsed_s:.1f} s")
        if self.on_done is not None:
            self.on_done(message.result)

    def action_cancel(self) -> None:
        if self.result is None and not self.cancel_event.is_set():
            self.cancel_event.set()
            self.query_one("#sweep-status", Static).update("cancelling after the current cell…")
        else:
            self.dismiss(self.result)


class SweepApp(App):
    """``tuiprof sweep --ui``: the sweep screen as an app; Escape after the end returns the result."""

    TITLE = "tuiprof sweep"

    def __init__(self, sweep_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.sweep_kwargs = sweep_kwargs
        self.result: SweepResult | None = None

    def on_mount(self) -> None:
        self.push_screen(SweepScreen(self.sweep_kwargs, on_done=self._sweep_done), callback=self._sweep_closed)

    def _sweep_done(self, result: SweepResult) -> None:
        self.result = result

    def _sweep_closed(self, result: SweepResult | None) -> None:
        self.exit(result if result is not None else self.result)
