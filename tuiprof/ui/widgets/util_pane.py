"""Utilisation: GPM SM / occupancy / DRAM / tensor, plain NVML util, memory, power, clocks —
beside the kernel-busy share of each token measured from kernel records."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.app import ComposeResult
from textual.widgets import Static

from .. import format as fmt
from ...store.records import DECODE
from ..derive import (NVML_SERIES, basis_note, busy_fraction, busy_wall, earlier_traced, mean,
                      nvml_series, traced_rows)
from .base import Pane, RefreshContext


class UtilPane(Pane):
    PANE_TITLE = "utilisation"
    DEFAULT_CSS = """
    UtilPane VerticalScroll { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="util-body")

    def focus_main(self) -> None:
        self.query_one(VerticalScroll).focus()

    def show(self, view: Any, ctx: RefreshContext) -> None:
        inner = self.content_region.width or (self.app.size.width - 2)
        width = max(8, inner - 16 - 7 - 7 - 3 - 2)
        key = (width, len(view.nvml), view.counters.get("tokens"), view.counters.get("records"))
        if key == self._last and not ctx.changed:
            return
        self._last = key
        tbl = Table.grid(padding=(0, 1))
        tbl.add_column(width=16, no_wrap=True)
        tbl.add_column(width=7, justify="right", no_wrap=True)
        tbl.add_column(width=7, justify="right", no_wrap=True)
        tbl.add_column(width=width, no_wrap=True, overflow="ellipsis")
        n = width
        have_nvml = bool(view.nvml)
        nv = view.collectors.get("nvml", {})
        if not have_nvml:
            msg = nv.get("message") or "no NVML samples yet"
            tbl.add_row(Text("NVML", "bold"), "", "", Text(msg, "dim"))
        else:
            tbl.add_row(Text("metric", "dim"), Text("now", "dim"), Text("mean", "dim"),
                        Text(f"last {min(n, len(view.nvml))} samples (0–100%)", "dim"))
            for key_, label, _unit in NVML_SERIES:
                vals = nvml_series(view, key_, n)
                if all(v is None for v in vals):
                    continue
                style = "cyan" if key_.startswith("gpm") else "yellow"
                tbl.add_row(label, fmt.pct(vals[-1]), fmt.pct(mean(vals)),
                            Text(fmt.spark(vals, n, 0, 100), style))
        # Kernel-busy share per step, from CUPTI records: the number to read beside "GPU util".
        # Traced decode tokens of the current mode only: a prefill (traced outside bursts) is
        # another workload, and untraced tokens have no kernel records.
        rows = traced_rows(view.tokens, DECODE, ctx.mode)[-n:]
        wall = busy_wall(view, DECODE, ctx.mode)  # an untraced step's, where there is one
        busy = [busy_fraction(r, wall) for r in rows]
        earlier = None if rows else earlier_traced(view, DECODE, ctx.mode)
        tbl.add_row(Text("kernel busy/step", "bold"), fmt.pct(busy[-1] if busy else None),
                    fmt.pct(mean(busy) if busy else earlier and earlier.busy_pct),
                    Text(fmt.spark(busy, n, 0, 100), "green"))
        if rows:
            note = f"traced decode/{ctx.mode} tokens: last {len(rows)}"
        elif earlier is not None:  # compiled sampling: the traced steps left the series
            note = (f"traced decode/{ctx.mode}: none in the series; mean of "
                    f"{earlier.count:,} earlier")
        elif not view.kernels_traced:
            note = "no kernel records (CUPTI off)"  # as the latency footer says
        else:
            note = f"no traced decode/{ctx.mode} step yet"
        tbl.add_row("", "", "", Text(note, "dim"))
        if rows or earlier is not None:  # tracing stretches a traced step: say what busy is of
            tbl.add_row("", "", "", Text(f"busy share {basis_note(wall)}", "dim"))
        if have_nvml:
            last = view.nvml[-1]
            parts = []
            if last.get("mem_used_bytes") is not None:
                parts.append(f"mem used {fmt.nbytes(last['mem_used_bytes'])}")
            if last.get("power_mw") is not None:
                parts.append(f"power {last['power_mw'] / 1000:.1f} W")
            if last.get("sm_clock_mhz") is not None:
                parts.append(f"SM clock {last['sm_clock_mhz']:.0f} MHz")
            power = nvml_series(view, "power_mw", n)
            tbl.add_row(Text("memory/power", "bold"), "", "",
                        Text(" · ".join(parts) or "–"))
            if any(p is not None for p in power):
                tbl.add_row("power", "", "", Text(fmt.spark(power, n, None, None), "magenta"))
        self.query_one("#util-body", Static).update(tbl)
