"""The session process on its host: CPU use beside what tuiprof itself takes.

An eager decode that keeps one core at 100 % while the GPU idles is launch-bound on the host;
this pane shows that core next to the GPU's panes. Its data is the ``host`` collector's series
(``view.series["host"]``) and the live overhead (``view.overhead``): its parts (the session's
threads' CPU, its hooks on the program's threads, CUPTI's switches, traced steps over untraced
ones), then the threads' CPU by collector and for serving this UI.
"""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from .. import format as fmt
from .base import Pane, RefreshContext

KIND = "host"
# the figure's parts (tuiprof/collect/own_cost.py), then the threads' part by collector
OWN = (("threads_s", "threads"), ("hooks_s", "hooks"), ("switch_s", "CUPTI switches"),
       ("tracing_s", "traced steps"), ("rerecord_s", "graphs recorded again"),
       ("cupti_s", "of which CUPTI"), ("nvml_s", "NVML"), ("serve_s", "serving the UI"))


class HostPane(Pane):
    PANE_TITLE = "host: the session process"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="host-body")

    def show(self, view: Any, ctx: RefreshContext) -> None:
        samples = view.series.get(KIND) or []
        width = max(8, (self.content_region.width or (self.app.size.width - 2)) - 42)
        key = (width, len(samples), samples[-1]["ts_ns"] if samples else None,
               view.overhead.get("wall_s"))
        if key == self._last and not ctx.changed:
            return
        self._last = key
        self.query_one("#host-body", Static).update(host_table(view, samples, width,
                                                               ctx.deterministic))


def host_table(view: Any, samples: list, width: int, deterministic: bool = False) -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(width=8, no_wrap=True)
    t.add_column(width=30, no_wrap=True)
    t.add_column(width=width, no_wrap=True, overflow="ellipsis")
    if not samples:
        why = (view.collectors.get(KIND) or {}).get("message") or "no host samples (the host collector did not run)"
        t.add_row(Text("CPU", "bold"), Text("–"), Text(why, "dim"))
    else:
        cpu = [s.get("cpu_pct") or 0.0 for s in samples]
        now = samples[-1]
        t.add_row(Text("CPU", "bold"),
                  f"{cpu[-1]:.0f} % of a core" + (f", max {max(cpu[-60:]):.0f}" if len(cpu) > 1
                                                   else ""),
                  Text(fmt.spark(cpu, width, 0.0, max(100.0, max(cpu))), "cyan"))
        t.add_row(Text("memory", "bold"), f"{fmt.nbytes(now.get('rss_bytes'))} resident",
                  Text(f"{now.get('threads')} threads", "dim"))
    ov = view.overhead or {}
    if deterministic or not ov:
        return t
    parts = [f"{label} {ov[key]:.1f} s" for key, label in OWN if ov.get(key)]
    t.add_row(Text("tuiprof", "bold"), f"{ov.get('pct', 0):.1f} % of wall time",
              Text(", ".join(parts) + (f" over {ov.get('wall_s', 0):.0f} s" if parts else ""),
                   "dim"))
    return t
