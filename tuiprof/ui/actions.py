"""The single registry of user actions: it feeds the bindings, the footer, the command
palette and the help screen, so a key is defined once and every list of keys agrees
(docs/ui.md#keys). The panes' number keys come from the pane table
(:mod:`tuiprof.ui.registry`), the keys a pane owns from its ``KEYS`` and the export keys from
the export table (:mod:`tuiprof.export.registry`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..export.registry import with_keys
from .registry import by_key, widget_class


@dataclass(frozen=True)
class Action:
    id: str            # binding id (keymaps) and palette id
    key: str           # Textual key name(s), comma-separated
    action: str        # app action
    label: str         # footer text
    help: str          # help screen / palette text
    show: bool = True  # in the footer
    priority: bool = False
    shown_key: str = ""


ACTIONS: tuple[Action, ...] = (
    Action("toggle-mode", "c", "toggle_mode", "eager↔compiled",
           "Switch the live session between eager and torch.compile (compiles on a background thread)"),
    Action("batch-up", "b", "batch_up", "batch×2",
           "Double the batch (sequences decoded together), up to --max-batch; compiled mode "
           "compiles/captures the new shape in the background"),
    Action("batch-down", "B", "batch_down", "batch÷2", "Halve the batch (down to 1)",
           shown_key="B"),
    Action("log", "l", "show_log", "log",
           "The profiled program's output (tuiprof run -- python …); its log file is named there"),
    Action("next-rank", "g", "next_rank", "rank/proc",
           "Sessions of several ranks (--tp) or processes (a program's, followed): show the "
           "next rank, or the next process that does GPU work or marks steps, in every pane"),
    Action("all-ranks", "a", "all_ranks", "all",
           "Every rank side by side (step time, compute / communication / idle, skew, overlap, "
           "NVML); for a program's processes, every process, and each torch.distributed job "
           "among them compared rank by rank"),
    Action("compare", "v", "compare", "compare",
           "Two configurations (batch × mode) side by side, and every configuration measured: "
           "tokens/s, ms/step, MBU, MFU, what bounds it"),
    Action("pause", "space", "pause", "pause", "Pause / resume the source (generation or replay)",
           shown_key="space"),
    Action("reset", "r", "reset", "reset", "Reset all statistics"),
    *(Action(f"export-{e.name}", e.key, f"export('{e.name}')", e.label or e.name,
             f"Export {e.help}") for e in with_keys()),
    Action("help", "question_mark", "help", "help", "This help screen", shown_key="?"),
    Action("quit", "q", "quit", "quit", "Stop the session (auto-snapshot if enabled) and quit"),
    Action("interrupt", "ctrl+c", "interrupt", "ctrl-c",
           "A profiled program: Ctrl-C goes to it (KeyboardInterrupt); again: stop the session",
           show=False, priority=True),
    Action("theme", "t", "toggle_theme", "theme", "Toggle dark / light theme", show=False),
    Action("freeze", "f", "freeze", "freeze", "Freeze / unfreeze the display (collection continues)",
           show=False),
    Action("next-pane", "tab", "next_pane", "next pane", "Next pane (tabs at small sizes)",
           show=False, priority=True, shown_key="tab"),
    Action("prev-pane", "shift+tab", "prev_pane", "prev pane", "Previous pane", show=False,
           priority=True, shown_key="shift+tab"),
    *(Action(f"pane-{p.key}", p.key, f"show_pane({p.key})", p.tab,
             f"The {p.tab} pane: {p.help}", show=False) for p in by_key()),
    # the panes' own keys (each pane's KEYS), run by the pane: TuiprofApp.action_pane
    *(Action(k.id, k.key, f"pane({p.id!r}, {k.name!r})", k.label, k.help, show=k.show,
             shown_key=k.shown_key) for p in by_key() for k in widget_class(p).KEYS),
)


def key_label(a: Action) -> str:
    return a.shown_key or a.key
