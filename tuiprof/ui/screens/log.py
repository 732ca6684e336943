"""The profiled program's output: the newest lines the session keeps, and where the rest is."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Log, Static

from ...text import printable


class LogScreen(Screen):
    """Key ``l``: the program's stdout and stderr as it printed them (sanitised lines)."""

    BINDINGS = [Binding("escape,l,q", "dismiss", "close", show=True)]
    DEFAULT_CSS = """
    LogScreen #log-caption { height: 2; padding: 0 1; background: $panel; }
    LogScreen Log { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown = 0          # lines ever written by the program that are on screen

    def compose(self) -> ComposeResult:
        yield Static(id="log-caption")
        yield Log(id="log", highlight=False, auto_scroll=True)
        yield Footer()

    def show(self, view: Any, status: Any) -> None:
        """Append what the program printed since the last call."""
        lines = view.output
        total = int(view.counters.get("output_lines", len(lines)) or 0)
        log = self.query_one(Log)
        new = total - self._shown
        if new < 0 or new > len(lines):  # a new session, or more than the ring keeps
            log.clear()
            if total > len(lines):
                log.write_line(f"… {total - len(lines):,} earlier lines: see the log file")
            new = len(lines)
        if new:
            log.write_lines([printable(ln) for ln in lines[len(lines) - new:]])
        self._shown = total
        prog = (status.extra or {}).get("program") or (view.meta.get("program") or {})
        where = (status.extra or {}).get("log_path") or prog.get("log") or "?"
        cap = Text(no_wrap=True, overflow="ellipsis")
        cap.append(printable(prog.get('name') or 'program', 80) + " ", "bold")
        if prog.get("running", False):
            cap.append("running", "bold green")
        elif prog.get("exit_status") is not None:
            code = prog.get("exit_status")
            cap.append(f"exit status {code}", "bold" if code == 0 else "bold red")
            if prog.get("error"):
                cap.append(f" · {printable(prog['error'], 200)}", "red")
        cap.append(f" · {total:,} lines · all of them in {printable(where)}\n", "")
        cap.append("stdout and stderr as printed (escapes removed); esc or l to close", "dim")
        self.query_one("#log-caption", Static).update(cap)
