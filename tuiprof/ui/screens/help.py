"""Help: every key from the action registry, the panes, and the UI's own refresh cost."""
from __future__ import annotations

from typing import Callable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import adapters
from ..actions import ACTIONS, key_label
from ..registry import PANES, by_key


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close", show=True)]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; max-width: 100%; height: 90%; border: round $primary;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, stats: Callable[[], dict], disabled: dict[str, str] | None = None) -> None:
        super().__init__()
        self._stats = stats
        self._disabled = dict(disabled or {})

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="help-body")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = "tuiprof help — esc to close"
        self.update_body()

    def update_body(self) -> None:
        t = Table.grid(padding=(0, 2))
        t.add_column(width=10, style="bold cyan", no_wrap=True)
        t.add_column()
        for a in ACTIONS:
            why = self._disabled.get(a.action)
            t.add_row(key_label(a), Text(f"{a.help} — disabled: {why}", "dim") if why else a.help)
        t.add_row("ctrl+p", "Command palette (every action above, plus themes)")
        s = self._stats()
        body = Table.grid()
        body.add_row(Text("Keys", "bold underline"))
        body.add_row(t)
        body.add_row(Text(""))
        body.add_row(Text("Panes", "bold underline"))
        body.add_row(Text("\n".join([f"{p.key} {p.tab}: {p.help}" for p in by_key()] + [
            f"Below about 150×40 the panes become tabs: tab / 1–{len(PANES)} switch."])))
        words = adapters.rank_help()
        if words:
            body.add_row(Text(""))
            body.add_row(Text("Across ranks (a, the kernels pane's NCCL split, --headless --tp)",
                              "bold underline"))
            body.add_row(Text(words))
        body.add_row(Text(""))
        body.add_row(Text("UI cost", "bold underline"))
        if s.get("hidden"):
            body.add_row(Text("refresh cost hidden (test mode)", "dim"))
        else:
            body.add_row(Text(
                f"refresh: {s.get('count', 0)} runs, mean {s.get('mean_ms', 0):.2f} ms, "
                f"max {s.get('max_ms', 0):.2f} ms, last {s.get('last_ms', 0):.2f} ms "
                f"at {s.get('hz', 0):g} Hz"))
        self.query_one("#help-body", Static).update(body)
