"""Allocations: true device cudaMalloc/cudaFree from CUPTI per phase, the other CUPTI memory
records by class (pinned host, pools...), per-token allocations, and the PyTorch caching
allocator's counters and bytes."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .. import format as fmt
from ...analysis.allocs import memory_summary, rest_explained
from ..derive import alloc_deltas
from .base import Pane, RefreshContext


class AllocPane(Pane):
    PANE_TITLE = "allocations"
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
        self._cupti_rows(t, a, view, width)
        allocs = [r.alloc for r in view.tokens if r.alloc]
        t.add_row(Text("caching allocator", "bold"), Text("now", "dim"), Text("Δ/step", "dim"),
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

    def _cupti_rows(self, t: Table, a: dict, view: Any, width: int) -> None:
        m = memory_summary(a)
        if not m.classified:   # a snapshot from before the record classes
            su, tk = a.get("startup", {}), a.get("tokens", {})
            t.add_row(Text("memory records", "bold"), Text("start-up", "dim"),
                      Text("tokens", "dim"), Text("CUPTI, all kinds (old snapshot)", "dim"))
            t.add_row("  allocs / frees",
                      f"{fmt.count(su.get('mallocs'))} / {fmt.count(su.get('frees'))}",
                      f"{fmt.count(tk.get('mallocs'))} / {fmt.count(tk.get('frees'))}",
                      Text("not split into device cudaMalloc and the rest", "dim"))
            return
        t.add_row(Text("device cudaMalloc", "bold"), Text("alloc / free", "dim"),
                  Text("bytes", "dim"), Text("CUPTI: device memory, synchronous, no pool", "dim"))
        if not m.device:
            cupti = view.collectors.get("cupti", {})
            t.add_row("", "", "", Text("none seen", "green") if cupti.get("ok", True)
                      else Text("no CUPTI: no memory records", "dim"))
        for phase, c in m.device.items():
            t.add_row(f"  {phase}", f"{fmt.count(c['mallocs'])} / {fmt.count(c['frees'])}",
                      fmt.nbytes(c["malloc_bytes"]), "")
        done = [r for r in view.tokens if r.done]
        if done:
            last = done[-1]
            per = [r.mallocs for r in done[-width:]]
            t.add_row(f"  #{last.seq} {last.phase}", f"{last.mallocs} / {last.frees}",
                      fmt.nbytes(last.malloc_bytes),
                      Text(fmt.spark(per, width, 0, None), "red") if any(per)
                      else Text("no cudaMalloc in recent tokens", "green"))
        t.add_row(Text("other records", "bold"), Text(fmt.count(m.rest_records), "dim"),
                  Text(fmt.nbytes(m.rest_bytes), "dim"),
                  Text(rest_explained(m, fmt.count), "dim"))
        for c in m.rest[:4]:
            t.add_row(Text(f"  {c.kind}", overflow="ellipsis"),
                      fmt.count(c.mallocs + c.frees), fmt.nbytes(c.malloc_bytes),
                      Text(f"{c.phase} · {c.library} · {c.api}", "dim"))
