"""One kernel in full: demangled and raw names, launch configurations, statistics."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import format as fmt
from ...text import markup, printable
from ..derive import KernelRow, kernel_ns_text


def render_detail(row: KernelRow, view: Any | None = None) -> Table:
    s = row.stats
    n = row.info
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_row("short", Text(n.short, "bold cyan"))
    t.add_row("library", Text(n.library))
    t.add_row("category", Text(n.category))
    t.add_row("mode / phase", Text(printable(f"{row.mode} / {row.phase}")))
    t.add_row("demangled", Text(n.demangled))
    t.add_row("raw", Text(printable(n.raw), "dim"))
    t.add_row("", "")
    t.add_row("launches", fmt.count(s.count) + (f"  ({row.per_token:.1f} per traced token)" if row.per_token else ""))
    t.add_row("from CUDA graphs", fmt.count(row.graph_launches))
    if row.loop_launches:
        t.add_row("outside the model", f"{fmt.count(row.loop_launches)} of them from the loop "
                  "around the model's forward")
    t.add_row("total", f"{fmt.ns(s.total)}  ({row.pct:.1f}% of this phase's GPU time)")
    t.add_row("mean / median", f"{fmt.ns(s.mean)} / {fmt.ns(s.median)}")
    t.add_row("min / max", f"{fmt.ns(s.min)} / {fmt.ns(s.max)}")
    t.add_row("stddev", fmt.ns(s.stddev))
    times = row.times
    if times is not None and (times.upper_bound or times.correction_ns):
        t.add_row("read as", Text(
            f"less {fmt.ns(times.correction_ns)} a launch, tracing's own ({times.path} path; "
            f"the table shows {kernel_ns_text(row, s.mean)} a launch): CUPTI's times above"
            if times.correction_ns else
            "upper bounds: the times above are CUPTI's, recorded while tracing, whose own cost "
            "in a kernel this short is not measured yet (docs/performance.md, "
            "\"What tracing changes\")", "yellow"))
    t.add_row("registers/thread", str(row.registers))
    t.add_row("shared mem", fmt.nbytes(row.shared_mem))
    cfgs = sorted(row.configs.items(), key=lambda kv: -kv[1])
    lines = Text()
    for i, (cfg, c) in enumerate(cfgs):
        if i:
            lines.append("\n")
        lines.append(f"grid {fmt.dim3(cfg[:3])}  block {fmt.dim3(cfg[3:])}  × {c:,}")
    t.add_row("launch configs", lines if cfgs else f"grid {fmt.dim3(row.grid)}  block {fmt.dim3(row.block)}")
    if view is not None:
        others = []
        for (name, ph, md), agg in sorted(view.kernels.items(), key=lambda kv: kv[0][1:]):
            if name == row.name and (ph, md) != (row.phase, row.mode):
                others.append(printable(f"{md}/{ph}") + f": {agg.stats.count:,} × "
                              f"{fmt.ns(agg.stats.mean)}")
        if others:
            t.add_row("elsewhere", Text("\n".join(others)))
    return t


class KernelDetailScreen(ModalScreen):
    BINDINGS = [Binding("escape,enter,q", "dismiss", "close", show=True)]
    DEFAULT_CSS = """
    KernelDetailScreen { align: center middle; }
    KernelDetailScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, row: KernelRow, view: Any | None = None) -> None:
        super().__init__()
        self.row, self.view = row, view

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(render_detail(self.row, self.view), id="detail-body")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = (f"kernel — {markup(self.row.info.short)}"
                                                       " — esc to close")
