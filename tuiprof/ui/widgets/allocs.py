"""Allocations: cudaMalloc/cudaFree from CUPTI (start-up vs tokens), per-token allocations,
and the PyTorch caching allocator's counters and bytes."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .. import format as fmt
from ..derive import alloc_deltas
from .base import Pane, RefreshContext


class AllocPane(Pane):
    PANE_TITLE = "allocations"
    TAB_TITLE = "allocs"
    PANE_KEY = "4"
    DEFAULT_CSS = """
    AllocPane VerticalScroll { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="alloc-body")

    def focus_main(self) -> None:
        self.query_one(VerticalScroll).focus()

    def show(self, view: Any, ctx: RefreshContext) -> None:
        inner = self.content_region.width or (self.app.size.width - 2)
        width = max(8, inner - 20 - 12 - 12 - 3 - 2)
        key = (width, view.counters.get("tokens"), view.counters.get("records"))
        if key == self._last and not ctx.changed:
            return
        self._last = key
        a = view.allocs
        t = Table.grid(padding=(0, 1))
        t.add_column(width=20, no_wrap=True)
        t.add_column(width=12, justify="right", no_wrap=True)
        t.add_column(width=12, justify="right", no_wrap=True)
        t.add_column(width=width, no_wrap=True, overflow="ellipsis")
        t.add_row(Text("cudaMalloc/Free", "bold"), Text("start-up", "dim"), Text("tokens", "dim"),
                  Text("CUPTI memory records", "dim"))
        su, tk = a.get("startup", {}), a.get("tokens", {})
        t.add_row("  mallocs / frees", f"{fmt.count(su.get('mallocs'))} / {fmt.count(su.get('frees'))}",
                  f"{fmt.count(tk.get('mallocs'))} / {fmt.count(tk.get('frees'))}",
                  f"{fmt.nbytes(tk.get('malloc_bytes'))} / {fmt.nbytes(tk.get('free_bytes'))} in tokens")
        done = [r for r in view.tokens if r.done]
        if done:
            last = done[-1]
            per = [r.mallocs for r in done[-width:]]
            t.add_row("  last token", f"{last.mallocs} / {last.frees}", fmt.nbytes(last.malloc_bytes),
                      Text(fmt.spark(per, width, 0, None), "red") if any(per)
                      else Text("no cudaMalloc in recent tokens", "green"))
        allocs = [r.alloc for r in view.tokens if r.alloc]
        t.add_row(Text("caching allocator", "bold"), Text("now", "dim"), Text("Δ/token", "dim"),
                  Text("torch.cuda.memory_stats", "dim"))
        if not allocs:
            t.add_row("", "", "", Text("no allocator statistics yet", "dim"))
        else:
            last_a = allocs[-1]
            if "num_device_alloc" in last_a:
                dm = alloc_deltas(view, "num_device_alloc")
                df = alloc_deltas(view, "num_device_free")
                t.add_row("  cudaMalloc / Free",
                          f"{fmt.count(last_a['num_device_alloc'])} / {fmt.count(last_a.get('num_device_free'))}",
                          f"{fmt.count(dm[-1]) if dm else '–'} / {fmt.count(df[-1]) if df else '–'}",
                          Text("real cudaMalloc/cudaFree by the allocator", "dim"))
            if "allocation_all_allocated" in last_a:
                d = alloc_deltas(view, "allocation_all_allocated")
                t.add_row("  requests", fmt.count(last_a["allocation_all_allocated"]),
                          fmt.count(d[-1]) if d else "–", Text(fmt.spark(d, width, 0, None), "yellow"))
            t.add_row("  active / reserved", fmt.nbytes(last_a.get("active_bytes")),
                      fmt.nbytes(last_a.get("reserved_bytes")), "")
        self.query_one("#alloc-body", Static).update(t)
