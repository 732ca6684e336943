"""Every rank side by side (``a``), refreshed by the app's timer while shown.

Timing columns (tokens/s, ms per step, skew, NVML) come from each rank's view on every refresh;
the split of a step into compute, communication and idle needs raw kernel records and comes
from the app's findings worker (the last 16 traced steps of each rank, every ~2 s).
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

from .. import adapters


def _ms(v: float | None, nd: int = 3) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def render_ranks(light: Any, split: Any, selected: int) -> Any:
    """The comparison, one column per rank (fits 80 columns up to 8 ranks): ``light`` (a
    RanksSummary of the views, no raw records) for the timing, ``split`` (from raw records,
    may be None) for compute / communication / idle."""
    if light is None or light.mode is None:
        return Text("no decode steps yet", "dim")
    by_rank = {r.rank: r for r in (split.ranks if split is not None and split.mode == light.mode
                                   else [])}
    slow = split.slowest if split is not None and split.slowest is not None else light.slowest
    t = Table(expand=False, show_edge=False, pad_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    for r in light.ranks:
        head = ("▶" if r.rank == selected else "") + f"rank {r.rank}" + (" ⚑" if slow == r.rank else "")
        t.add_column(head, justify="right", no_wrap=True,
                     style="bold" if r.rank == selected else "")
    ranks = light.ranks
    split_of = [by_rank.get(r.rank) for r in ranks]

    def row(label: str, values: list) -> None:
        t.add_row(label, *values)

    row("device", [r.device.replace("NVIDIA ", "")[:12] for r in ranks])
    row("tokens/s", [f"{r.tokens_per_s:.1f}" for r in ranks])
    row("ms/step", [_ms(r.step_ms, 2) for r in ranks])
    row("compute ms", [_ms(s.compute_ms if s else None) for s in split_of])
    row("comm ms", [_ms(s.comm_ms if s else None) for s in split_of])
    row("idle ms", [_ms(s.idle_ms if s else None) for s in split_of])
    row("NCCL share", [_pct(s.comm_share if s else None) for s in split_of])
    row("overlap", [_pct(s.overlap_fraction if s else None) for s in split_of])
    row("SM util %", ["–" if r.sm_util is None else f"{r.sm_util:.0f}" for r in ranks])
    row("DRAM util %", ["–" if r.dram_util is None else f"{r.dram_util:.0f}" for r in ranks])
    title = Text(f"{light.mode} decode, per step: medians; compute / comm / idle over traced "
                 f"steps", "bold")
    lines: list = [title, t]
    info = Text()
    for s in split_of:
        if s is not None and s.collectives:
            name, ms = s.collectives[0]
            info.append(f"rank {s.rank} top collective: {name} {ms:.3f} ms/step\n")
    sk = light.skew
    if sk is not None:
        info.append(f"step-end skew across ranks: median {sk.end_median_us:.0f} µs, p90 "
                    f"{sk.end_p90_us:.0f} µs, max {sk.end_max_us:.0f} µs over {sk.steps} steps; "
                    f"starts {sk.start_median_us:.0f} µs apart (median)\n")
    basis = split.slowest_basis if split is not None and split.slowest is not None else light.slowest_basis
    info.append(f"⚑ slowest rank: {slow} ({basis})\n" if slow is not None
                else f"slowest rank: – ({basis})\n")
    clock = light.clock
    res = clock.get("residual_ns")
    info.append(f"clocks: residual {('%d ns' % res) if res is not None else 'unknown'}, "
                f"{'aligned' if clock.get('applied') else 'one clock, not shifted'}", "dim")
    if split is None:
        info.append("\ncompute / communication split: waiting for the analysis of traced steps",
                    "dim")
    lines.append(info)
    return Group(*lines)


class RanksScreen(Screen):
    BINDINGS = [Binding("escape,a", "app.pop_screen", "back", show=True),
                Binding("g", "app.next_rank", "rank", show=True)]
    DEFAULT_CSS = """
    RanksScreen #ranks-table { height: auto; padding: 0 1; }
    RanksScreen #ranks-findings { height: auto; padding: 1 1 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="ranks-table")
            yield Static(id="ranks-findings")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = "all ranks"

    def show(self, analysis: Any, views: Any, selected: int) -> None:
        """``analysis``: (summary, cross-rank findings) from raw records, or None yet."""
        try:
            table = self.query_one("#ranks-table", Static)
            found = self.query_one("#ranks-findings", Static)
        except NoMatches:  # pushed but not composed yet (or being dismissed): next tick
            return
        light = adapters.ranks_summary(views)
        split, cross = analysis if analysis is not None else (None, None)
        table.update(render_ranks(light, split, selected))
        if cross is None:
            cross, _ = adapters.rank_findings(views)
        t = Text()
        for f in cross:
            t.append(f"● {f.title}\n", "bold")
            t.append(f"  {f.evidence}\n", "dim")
        found.update(t if cross else Text("no cross-rank findings (yet)", "dim"))
