"""Every process of a profiled program (``a``), refreshed by the app's timer while shown.

One row per process the program started (pid, parent, what it runs, its GPU, its rank when it
joined a torch.distributed job, steps, tokens/s, kernels, how it ended); processes that do no
CUDA work and mark no steps are listed dim (``g`` skips them). Below, each torch.distributed
job among them gets the all-ranks comparison of ``--tp`` sessions (compute, communication and
idle per step, NCCL share, skew, the slowest rank), its ranks in rank order.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from ...errors import safe_text
from ...store.rank_set import is_active, jobs, process_facts
from .. import adapters
from .all_ranks import _no_kernels, render_ranks


def _tok_s(view: Any) -> str:
    rows = [t for t in view.timeline if t.done and t.phase == "decode" and t.host_ms > 0]
    if len(rows) < 2:
        return "–"
    ms = sorted(t.host_ms for t in rows[-64:])[len(rows[-64:]) // 2]
    batch = rows[-1].batch or 1
    return f"{1000.0 * batch / ms:.1f}" if ms > 0 else "–"


def render_processes(rv: Any, selected: int) -> Any:
    """The table of processes (one row each)."""
    t = Table(expand=False, show_edge=False, pad_edge=False)
    for head, just in (("#", "right"), ("pid", "right"), ("parent", "right"),
                       ("process", "left"), ("state", "left"), ("GPU", "left"),
                       ("rank", "right"), ("steps", "right"), ("tok/s", "right"),
                       ("kernels", "right")):
        t.add_column(head, justify=just, no_wrap=True)
    for i, v in enumerate(rv.views):
        p = process_facts(v)
        active = is_active(v)
        style = "bold" if i == selected else ("" if active else "dim")
        rank = v.meta.get("rank")
        world = v.meta.get("world_size")
        gpu = str(v.meta.get("device") or ("cuda" if v.meta.get("cuda") else "–"))
        steps = int(v.counters.get("tokens", 0) or 0)
        t.add_row(("▶" if i == selected else "") + str(i), str(p.get("pid", "–")),
                  str(p.get("ppid", "–")), safe_text(p.get("name") or v.meta.get("model"), 28),
                  safe_text(p.get("state", "running"), 8), safe_text(gpu, 10),
                  f"{rank}/{world}" if isinstance(rank, int) else "–",
                  f"{steps:,}", _tok_s(v), f"{int(v.counters.get('kernels', 0) or 0):,}",
                  style=style)
    return t


class ProcessesScreen(Screen):
    BINDINGS = [Binding("escape,a", "app.pop_screen", "back", show=True),
                Binding("g", "app.next_rank", "process", show=True)]
    DEFAULT_CSS = """
    ProcessesScreen #procs-table { height: auto; padding: 0 1; }
    ProcessesScreen #procs-jobs { height: auto; padding: 1 1 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="procs-table")
            yield Static(id="procs-jobs")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = "all processes"

    def show(self, analysis: Any, views: Any, selected: int) -> None:
        """``analysis``: {job: (summary, findings)} from raw records (or None yet)."""
        try:
            table = self.query_one("#procs-table", Static)
            below = self.query_one("#procs-jobs", Static)
        except NoMatches:
            return
        head = Text(f"{views.world_size} processes · g: next active process · dim: no CUDA "
                    f"work, no steps", "dim")
        notices = (views.meta or {}).get("notices") or []
        parts: list = [head, render_processes(views, selected)]
        for line in notices[-4:]:
            parts.append(Text(safe_text(line, 300), "yellow"))
        table.update(Group(*parts))
        blocks: list = []
        analysis = analysis if isinstance(analysis, dict) else {}
        for key, rv in jobs(views):
            split, cross = analysis.get(key, (None, None))
            pick = next((r for r, v in enumerate(rv.views)
                         if process_facts(v).get("index") == selected), -1)
            blocks.append(Text(f"torch.distributed job {safe_text(key, 60)}: "
                               f"{rv.world_size} ranks", "bold"))
            blocks.append(render_ranks(adapters.ranks_summary(rv), split, pick, _no_kernels(rv)))
            if cross is None:
                cross, _ = adapters.rank_findings(rv)
            for f in cross or []:
                blocks.append(Text(f"● {f.title}", "bold"))
                blocks.append(Text(f"  {f.evidence}", "dim"))
        below.update(Group(*blocks) if blocks else Text(
            "no torch.distributed job among these processes", "dim"))
