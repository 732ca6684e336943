"""Common base of the panes and the per-refresh context handed to them."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from textual.containers import Vertical

from ...control import SourceStatus


@dataclass
class RefreshContext:
    """What a pane may know besides the view: the source's status and UI state."""

    status: SourceStatus
    mode: str
    deterministic: bool = False
    now: float = field(default_factory=time.monotonic)
    changed: bool = True          # the view differs from the previous refresh
    # In a session of several ranks: the shown rank's NCCL kernels split into transfer and
    # wait (``analysis.cross_rank.comm_split``); None without steps traced on every rank.
    comm_split: dict | None = None
    ranks: int = 1                # ranks in the session
    rank: int = 0                 # the rank the panes show


@dataclass(frozen=True)
class PaneKey:
    """A key a pane owns: bound app-wide (it works whatever has the focus), listed in the
    footer, the help screen and the palette through :mod:`tuiprof.ui.actions`, and run by the
    pane's ``action_<name>``, which returns what to tell the user (None: nothing)."""

    id: str            # binding id (keymaps) and palette id
    key: str           # Textual key name(s), comma-separated
    name: str          # the pane's action_<name>
    label: str         # footer text
    help: str          # help screen / palette text
    show: bool = False  # in the footer
    shown_key: str = ""


class Pane(Vertical):
    """A bordered pane of the main screen, selectable by its number key.

    Its key and tab name come from its row in :data:`tuiprof.ui.registry.PANES`; ``PANE_TITLE`` is
    the border's title. ``show(view, ctx)`` is called on every refresh while the pane is
    visible: it only reads the view (never the store, never a thread's state)."""

    PANE_TITLE = "pane"
    TAB_TITLE = "pane"
    PANE_KEY = "0"
    KEYS: tuple[PaneKey, ...] = ()   # the keys this pane owns (see PaneKey)
    can_focus = False

    def on_mount(self) -> None:
        self.border_title = f"{self.PANE_KEY} {self.PANE_TITLE}"

    @classmethod
    def has_data(cls, view: Any) -> bool:
        """Whether ``view`` holds what this pane shows (an ``optional`` pane of the table
        joins the wide grid only then)."""
        return True

    def show(self, view: Any, ctx: RefreshContext) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def focus_main(self) -> None:
        """Give focus to the pane's main widget (if any)."""


def cursor_key(table: Any) -> Any:
    """The row key under a DataTable's cursor (None when the table is empty)."""
    if not table.row_count:
        return None
    try:
        return table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
    except Exception:
        return None
