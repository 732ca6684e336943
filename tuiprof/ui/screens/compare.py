"""Two configurations side by side (``v``), and every configuration of the session in a table.

A configuration is a batch and a mode (``b4 compiled``). The screen opens on eager vs compiled
at the batch in use when both were measured; ``[`` and ``]`` step the left and the right
column through the others. Refreshed by the app's timer while shown.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from .. import format as fmt
from ..adapters import config_summaries, diff_configs, render_diff
from ..derive import (ModeFigures, config_summary, configurations, default_pair,
                      kernel_ns_text)


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return ""
    r = a / b
    return f"×{r:.2f}" if r >= 1 else f"×{r:.3f}"


def _basis(a: ModeFigures, b: ModeFigures) -> str:
    """Which wall time the busy shares are of: an untraced step's, the traced step's own."""
    bases = {s.busy_wall_ms is not None for s in (a, b) if s.busy_pct is not None}
    if bases == {True}:
        return "of an untraced step"
    if bases == {False}:
        return "of its traced step"
    return "untraced step where measured, else traced" if bases else "traced"


def _cost(s: ModeFigures) -> float | None:
    return s.tracing.ratio if s.tracing is not None else None


def render_summary_table(ea: ModeFigures, co: ModeFigures) -> Table:
    la, lb = fmt.config_label(ea.batch, ea.mode), fmt.config_label(co.batch, co.mode)
    t = Table(title="decode, per step (a step advances every sequence of the batch)",
              expand=True, show_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    t.add_column(la, justify="right", style="cyan")
    t.add_column(lb, justify="right", style="magenta")
    t.add_column(f"{la} / {lb}", justify="right")
    rows = (
        ("decode steps (all)", ea.tokens, co.tokens, lambda v: fmt.count(v) if v else "–", False),
        ("traced decode steps", ea.traced, co.traced, lambda v: fmt.count(v) if v else "–", False),
        ("tokens/s (all sequences, all steps)", ea.tok_s, co.tok_s,
         lambda v: f"{v:,.1f}" if v else "–", True),
        ("ms/step (median)", ea.ms_token, co.ms_token, fmt.ms, True),
        ("GPU ms/step", ea.gpu_ms, co.gpu_ms, fmt.ms, True),
        (f"kernel-busy share ({_basis(ea, co)})", ea.busy_pct, co.busy_pct, fmt.pct, True),
        ("traced / untraced step (tracing cost)", _cost(ea), _cost(co),
         lambda v: "–" if v is None else f"×{v:.3f}", False),
        ("kernels/step (traced)", ea.kernels_token, co.kernels_token,
         lambda v: fmt.count(round(v, 1)) if v is not None else "–", True),
        ("from CUDA graphs", ea.graph_pct, co.graph_pct, fmt.pct, False),
        ("allocator requests/step", ea.alloc_req_token, co.alloc_req_token,
         lambda v: fmt.count(v) if v is not None else "–", True),
    )
    for label, a, b, f, ratio in rows:
        t.add_row(label, f(a), f(b), _ratio(a, b) if ratio else "")
    return t


def render_top(s: ModeFigures, traced: bool = True) -> Any:
    """The top decode kernels of one side; ``traced``: whether the session had CUPTI."""
    name = fmt.config_label(s.batch, s.mode)
    t = Table(title=f"top {name} decode kernels", expand=True, show_edge=False)
    t.add_column("kernel", no_wrap=True, overflow="ellipsis", ratio=3)
    t.add_column("lib", no_wrap=True, ratio=1)
    t.add_column("%", justify="right")
    t.add_column("/traced step", justify="right")
    t.add_column("avg", justify="right")
    if not s.top and not traced:
        return Text(f"no {name} decode kernels (CUPTI off)", "dim")
    if not s.top:
        return Text(f"no {name} decode kernels yet" +
                    (" — press c to switch modes" if s.mode == "compiled" else ""), "dim")
    for r in s.top:
        t.add_row(Text(r.info.short), Text(r.info.library), f"{r.pct:.1f}",
                  f"{r.per_token:.1f}" if r.per_token else "–", kernel_ns_text(r, r.stats.mean))
    return t


COLUMNS = (("config", "left", True), ("steps", "right", False), ("tok/s", "right", True),
           ("ms/step", "right", True), ("kernels/step", "right", False),
           ("GPU busy", "right", False), ("MBU", "right", True), ("MFU", "right", True),
           ("bound", "left", True), ("beside compile", "right", False))
# the busy share's basis, after the figure: an untraced step's wall time, or the traced step's
BASIS_MARK = {"untraced": "", "traced": "†"}


def render_configs(rows: list, pair: tuple, compact: bool = False) -> Any:
    """Every configuration: throughput, step time, MBU, MFU and what bounds it (``compact``:
    the columns that fit 80 columns)."""
    if not rows:
        return Text("configurations: analysis not available", "dim")
    traced = any(s.busy is not None and s.busy_basis == "traced" for s in rows)
    t = Table(title="every configuration of the session (decode; MBU/MFU against "
                    f"{rows[0].ridge:.0f} FLOP/B ridge; GPU busy of an untraced step"
                    + ("; † of its traced step: no untraced steps" if traced else "") + ")",
              expand=True, show_edge=False)
    keep = [i for i, (_n, _j, core) in enumerate(COLUMNS) if core or not compact]
    for i in keep:
        name, just, _core = COLUMNS[i]
        t.add_column(name, justify=just, no_wrap=True)
    for s in rows:
        key = (s.batch, s.mode)
        style = "bold cyan" if key == pair[0] else ("bold magenta" if key == pair[1] else "")
        cells = (fmt.config_label(s.batch, s.mode), fmt.count(s.steps), f"{s.tok_s:,.1f}",
                 fmt.ms(s.ms_step), "–" if s.kernels_step is None else f"{s.kernels_step:,.0f}",
                 fmt.pct(None if s.busy is None else 100 * s.busy)
                 + (BASIS_MARK.get(s.busy_basis, "") if s.busy is not None else ""),
                 "–" if s.mbu is None else f"{s.mbu:.1%}",
                 "–" if s.mfu is None else f"{s.mfu:.1%}", s.klass,
                 "–" if not s.compiling_steps else
                 f"{s.compiling_steps:,} × {fmt.ms(s.compiling_ms)}")
        t.add_row(*[cells[i] for i in keep], style=style)
    return t


class CompareScreen(Screen):
    BINDINGS = [Binding("escape,v", "app.pop_screen", "back", show=True),
                Binding("left_square_bracket", "cycle(0)", "left config", key_display="["),
                Binding("right_square_bracket", "cycle(1)", "right config", key_display="]")]
    DEFAULT_CSS = """
    CompareScreen #compare-summary { height: auto; padding: 0 1; }
    CompareScreen Horizontal { height: auto; }
    CompareScreen .compare-top { width: 1fr; height: auto; padding: 0 1; }
    CompareScreen #compare-configs { height: auto; padding: 0 1; }
    CompareScreen #compare-note { height: auto; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.pair: list | None = None      # [(batch, mode), (batch, mode)]
        self._view: Any = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            # painted at once; the comparison replaces it when built (~1 s on a busy 2-core CPU)
            yield Static(Text("building the comparison…", "dim"), id="compare-summary")
            with Horizontal():
                yield Static(id="compare-top-eager", classes="compare-top")
                yield Static(id="compare-top-compiled", classes="compare-top")
            yield Static(id="compare-configs")
            yield Static(id="compare-note")
        yield Footer()

    def action_cycle(self, which: int) -> None:
        """Step one column to the next configuration (never the other column's)."""
        if self._view is None:
            return
        configs = configurations(self._view)
        if self.pair is None or len(configs) < 2:
            return
        cur, other = self.pair[which], self.pair[1 - which]
        i = configs.index(cur) if cur in configs else -1
        for step in range(1, len(configs) + 1):
            nxt = configs[(i + step) % len(configs)]
            if nxt != other:
                self.pair[which] = nxt
                break
        self.show(self._view)
        self.app.notify(markup=False, message=f"comparing {fmt.config_label(*self.pair[0])} with "
                        f"{fmt.config_label(*self.pair[1])}", timeout=2)

    def show(self, view: Any) -> None:
        try:
            summary = self.query_one("#compare-summary", Static)
            self.query_one("#compare-top-eager", Static)
        except NoMatches:  # pushed but not composed yet (or being dismissed): next tick
            return
        self._view = view
        configs = configurations(view)
        if self.pair is None or (configs and not all(c in configs for c in self.pair)):
            self.pair = list(default_pair(view, configs))
        a, b = (config_summary(view, c) for c in self.pair)
        summary.update(render_summary_table(a, b))
        self.query_one("#compare-top-eager", Static).update(render_top(a, view.kernels_traced))
        self.query_one("#compare-top-compiled", Static).update(render_top(b, view.kernels_traced))
        self.query_one("#compare-configs", Static).update(
            render_configs(config_summaries(view), tuple(self.pair), self.app.size.width < 140))
        rendered = render_diff(diff_configs(view, *self.pair))
        self.query_one("#compare-note", Static).update(Group(
            Text("[ and ] pick the configurations compared; b / B change the batch of the "
                 "session", "dim"),
            rendered if rendered is not None else Text("(export.diff not available)", "dim")))
