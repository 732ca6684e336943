"""Every rank side by side (``a``), refreshed by the app's timer while shown.

Timing columns (tokens/s, ms per step, skew, NVML) come from each rank's view on every refresh;
the split of a step into compute, transfer, wait and idle needs every rank's raw kernel records
of the same steps and comes from the app's findings worker (the last 16 traced steps of each
rank, every ~2 s; the latest split with steps traced on every rank stays until the next).
The words are defined once (``analysis.cross_rank.DEFINITIONS``); the last line repeats them.
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

from ... import errors
from .. import adapters


def _ms(v: float | None, nd: int = 3) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def render_ranks(light: Any, split: Any, selected: int, no_kernels: str = "") -> Any:
    """The comparison, one column per rank (fits 80 columns up to 8 ranks): ``light`` (a
    RanksSummary of the views, no raw records) for the timing, ``split`` (from raw records,
    may be None) for compute / transfer / wait / idle and the late rank; ``no_kernels``: why
    this session has no kernel records at all ("" when it has or may have)."""
    if light is None or light.mode is None:
        return Text("no decode steps yet", "dim")
    ok = split is not None and split.mode == light.mode and split.steps
    by_rank = {r.rank: r for r in (split.ranks if ok else [])}
    late = split.late_rank if ok else light.late_rank
    t = Table(expand=False, show_edge=False, pad_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    for r in light.ranks:
        head = ("▶" if r.rank == selected else "") + f"rank {r.rank}" + (" ⚑" if late == r.rank else "")
        t.add_column(head, justify="right", no_wrap=True,
                     style="bold" if r.rank == selected else "")
    ranks = light.ranks
    split_of = [by_rank.get(r.rank) for r in ranks]

    def row(label: str, values: list) -> None:
        t.add_row(label, *values)

    def col(attr: str, fmt=_ms) -> list:
        return [fmt(getattr(s, attr) if s else None) for s in split_of]

    row("device", [r.device.replace("NVIDIA ", "")[:12] for r in ranks])
    row("tokens/s", [f"{r.tokens_per_s:.1f}" for r in ranks])
    row("ms/step", [_ms(r.step_ms, 2) for r in ranks])
    row("step ms", col("wall_ms"))
    row("compute ms", col("compute_ms"))
    row("comm ms", col("comm_ms"))
    row(" transfer", col("transfer_ms"))
    row(" wait", col("wait_ms"))
    row("idle ms", col("idle_ms"))
    row("NCCL share", col("comm_share", _pct))
    row("overlap", col("overlap_fraction", _pct))
    row("last at", col("late_share", _pct))
    row("late by ms", col("late_by_ms"))
    if any(s is not None and s.host_ms is not None for s in split_of):
        row("launch ms", col("host_ms"))
    row("SM util %", ["–" if r.sm_util is None else f"{r.sm_util:.0f}" for r in ranks])
    row("DRAM util %", ["–" if r.dram_util is None else f"{r.dram_util:.0f}" for r in ranks])
    if ok:
        (c0, s0), (c1, s1) = split.step_range
        steps = (f"steps {s0}–{s1} of cycle {c0}" if c0 == c1 else
                 f"cycle {c0} step {s0} to cycle {c1} step {s1}")
        head = (f"{light.mode} decode · per step: means over {split.steps} steps traced on every "
                f"rank ({steps}) · ms/step: median of all decode steps")
    else:
        head = f"{light.mode} decode · ms/step: median of all decode steps"
    lines: list = [Text(head, "bold"), t]
    info = Text()
    if ok:
        if split.transfer_ms is not None:
            info.append(f"transfer {split.transfer_ms:.3f} ms per step over {split.calls:,} "
                        f"collective calls matched on every rank")
            if split.incomplete_calls:
                info.append(f" ({split.incomplete_calls:,} not on every rank: left out)")
            info.append("\n")
        for s in split_of:
            if s is not None and s.collectives:
                name, ms = s.collectives[0]
                info.append(f"rank {s.rank} top collective: {name} {ms:.3f} ms/step\n")
    sk = light.skew
    if sk is not None:
        info.append(f"step-end skew across ranks: median {sk.end_median_us:.0f} µs, p90 "
                    f"{sk.end_p90_us:.0f} µs, max {sk.end_max_us:.0f} µs over {sk.steps} steps; "
                    f"starts {sk.start_median_us:.0f} µs apart (median)\n")
    basis = split.late_basis if ok else light.late_basis
    if late is not None:
        info.append(f"⚑ late rank {late}: {basis}", "bold")
        lr = by_rank.get(late)
        if lr is not None and lr.late_causes:
            cause = max(lr.late_causes, key=lr.late_causes.get)
            what = {"host": "its GPU idle before (its host launched late)",
                    "sync": "its host in a synchronisation", "compute": "more GPU work before",
                    "unclear": "cause unclear"}.get(cause, cause)
            info.append(f"; before {lr.late_causes[cause] / sum(lr.late_causes.values()):.0%} "
                        f"of them: {what}")
            if lr.gpu_idle_before_ms is not None and cause in ("host", "sync"):
                info.append(f", {lr.gpu_idle_before_ms:.3f} ms (median)")
        info.append("\n")
    else:
        info.append(f"late rank: – ({basis})\n")
    clock = light.clock
    res = clock.get("residual_ns")
    info.append(f"clocks: residual {('%d ns' % res) if res is not None else 'unknown'}, "
                f"{'aligned' if clock.get('applied') else 'one clock, not shifted'}\n", "dim")
    if not ok and no_kernels:
        info.append(f"compute / transfer / wait need kernel records: {no_kernels}\n", "dim")
    elif not ok:
        info.append("compute / transfer / wait: waiting for steps traced on every rank (kernels "
                    "are traced in bursts; the status line's “traced:” says how often)\n", "dim")
    help_line = adapters.rank_help()
    if help_line:
        info.append(help_line, "dim italic")
    lines.append(info)
    return Group(*lines)


def _no_kernels(views: Any) -> str:
    """Why no rank can have kernel records (CUPTI off or failed), or ""."""
    for v in getattr(views, "views", ()):
        if not v.kernels_traced:
            cupti = v.collectors.get("cupti") or {}
            return errors.safe_text(cupti.get("message") or "CUPTI is off", 160)
    return ""


class SetScreen(Screen):
    """Every member of a set at once (the ranks of a job, the processes of a program): a table,
    then what is found across them; ``show`` fills both from the app's refresh."""

    TITLE = ""
    PARTS = ("", "")     # the ids of the table and of what is below it
    MEMBER = ""          # what g steps to: "rank", "process"

    def __init_subclass__(cls, **kwargs) -> None:
        # the keys and the layout of every such screen, from its parts and member
        if cls.MEMBER:
            cls.BINDINGS = [Binding("escape,a", "app.pop_screen", "back", show=True),
                            Binding("g", "app.next_rank", cls.MEMBER, show=True)]
            cls.DEFAULT_CSS = (f"{cls.__name__} #{cls.PARTS[0]} {{ height: auto; padding: 0 1; }}\n"
                               f"{cls.__name__} #{cls.PARTS[1]} {{ height: auto; padding: 1 1 0 1; }}")
        super().__init_subclass__(**kwargs)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id=self.PARTS[0])
            yield Static(id=self.PARTS[1])
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = self.TITLE

    def parts(self) -> tuple[Static, Static] | None:
        """The two parts; None while pushed but not composed yet (or being dismissed)."""
        try:
            return tuple(self.query_one(f"#{i}", Static) for i in self.PARTS)
        except NoMatches:
            return None


class RanksScreen(SetScreen):
    TITLE = "all ranks"
    PARTS = ("ranks-table", "ranks-findings")
    MEMBER = "rank"

    def show(self, analysis: Any, views: Any, selected: int) -> None:
        """``analysis``: (summary, cross-rank findings) from raw records, or None yet."""
        parts = self.parts()
        if parts is None:
            return
        table, found = parts
        light = adapters.ranks_summary(views)
        split, cross = analysis if analysis is not None else (None, None)
        table.update(render_ranks(light, split, selected, _no_kernels(views)))
        if cross is None:
            cross, _ = adapters.rank_findings(views)
        t = Text()
        for f in cross:
            t.append(f"● {f.title}\n", "bold")
            t.append(f"  {f.evidence}\n", "dim")
        found.update(t if cross else Text("no cross-rank findings (yet)", "dim"))
