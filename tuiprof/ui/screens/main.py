"""The main screen: header, pane area (grid when wide, tabs when narrow), status line, footer.
The panes and their places come from the pane table (:mod:`tuiprof.ui.registry`)."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import Footer, Static

from .. import registry as pane_table
from ..widgets.base import Pane
from ..widgets.header import HeaderPane
from ..widgets.statusline import StatusLine

WIDE_AT = (150, 40)          # columns, rows from which all panes show at once


class MainScreen(Screen):
    """Header, pane area (grid when wide, tabs when narrow), status line, footer."""

    def __init__(self, wide_at: tuple[int, int] = WIDE_AT) -> None:
        super().__init__()
        self.wide_at = wide_at
        self.active = int(pane_table.FIRST)   # pane number: kernels first
        self.present: tuple[str, ...] = ()    # ids of the panes in the wide grid now

    def compose(self) -> ComposeResult:
        yield HeaderPane(id="header")
        yield Static(id="tabbar")
        with Container(id="panes"):  # in the table's grid order
            for spec in pane_table.PANES:
                yield pane_table.make(spec)
        yield StatusLine(id="status")
        yield Footer()

    @property
    def panes(self) -> list[Pane]:
        return sorted(self.query_one("#panes").query_children(Pane),
                      key=lambda p: int(p.PANE_KEY))

    @property
    def narrow(self) -> bool:
        return self.has_class("-narrow")

    def on_mount(self) -> None:
        self.place(None)
        self.apply_layout()
        self.app.show_header()  # the first frame says what is loading, and how far it is

    def place(self, view) -> bool:
        """Lay the wide grid out for the panes that belong in it with ``view`` (an optional
        pane once it has data); True when that changed."""
        by_id = {p.id: p for p in self.panes}
        present = tuple(s.id for s in pane_table.PANES if not s.optional
                        or (view is not None and by_id[s.id].has_data(view)))
        if present == self.present:
            return False
        self.present = present
        specs = tuple(s for s in pane_table.PANES if s.id in present)
        rows, heights, span = pane_table.grid_layout(specs)
        grid = self.query_one("#panes").styles
        grid.grid_size_columns, grid.grid_size_rows = 2, rows
        grid.grid_rows = heights
        for p in self.panes:
            p.styles.column_span = 2 if p.id in span else 1
            p.set_class(p.id not in present, "-absent")
        return True

    def on_resize(self) -> None:
        self.apply_layout()

    def apply_layout(self) -> None:
        w, h = self.app.size
        narrow = w < self.wide_at[0] or h < self.wide_at[1]
        self.set_class(narrow, "-narrow")
        self.set_active(self.active)

    def set_active(self, n: int) -> None:
        self.active = n
        for p in self.panes:
            p.set_class(p.PANE_KEY == str(n), "-active")
        tb = Text(no_wrap=True, overflow="ellipsis")
        for p in self.panes:
            on = p.PANE_KEY == str(n)
            tb.append(f" {p.PANE_KEY} {p.TAB_TITLE} ", "bold reverse" if on else "dim")
            tb.append(" ")
        tb.append(f" tab/1-{len(pane_table.PANES)}", "dim")
        self.query_one("#tabbar", Static).update(tb)

    def visible_panes(self) -> list[Pane]:
        if self.narrow:
            return [p for p in self.panes if p.PANE_KEY == str(self.active)]
        return [p for p in self.panes if p.id in self.present]
