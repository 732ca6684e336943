"""Eager vs compiled side by side (``v``), refreshed by the app's timer while shown."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.css.query import NoMatches
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from .. import format as fmt
from ..adapters import diff_modes, render_diff
from ..derive import ModeSummary, compare


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return ""
    r = a / b
    return f"×{r:.2f}" if r >= 1 else f"×{r:.3f}"


def render_summary_table(ea: ModeSummary, co: ModeSummary) -> Table:
    t = Table(title="decode, per token", expand=True, show_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    t.add_column("eager", justify="right", style="cyan")
    t.add_column("compiled", justify="right", style="magenta")
    t.add_column("eager/compiled", justify="right")
    rows = (
        ("decode tokens (all)", ea.tokens, co.tokens, lambda v: fmt.count(v) if v else "–", False),
        ("traced decode tokens", ea.traced, co.traced, lambda v: fmt.count(v) if v else "–", False),
        ("tokens/s", ea.tok_s, co.tok_s, lambda v: f"{v:.1f}" if v else "–", True),
        ("ms/token (median)", ea.ms_token, co.ms_token, fmt.ms, True),
        ("GPU ms/token", ea.gpu_ms, co.gpu_ms, fmt.ms, True),
        ("kernel-busy share (traced)", ea.busy_pct, co.busy_pct, fmt.pct, True),
        ("kernels/token (traced)", ea.kernels_token, co.kernels_token,
         lambda v: fmt.count(round(v, 1)) if v is not None else "–", True),
        ("from CUDA graphs", ea.graph_pct, co.graph_pct, fmt.pct, False),
        ("allocator requests/token", ea.alloc_req_token, co.alloc_req_token,
         lambda v: fmt.count(v) if v is not None else "–", True),
    )
    for label, a, b, f, ratio in rows:
        t.add_row(label, f(a), f(b), _ratio(a, b) if ratio else "")
    return t


def render_top(s: ModeSummary) -> Any:
    t = Table(title=f"top {s.mode} decode kernels", expand=True, show_edge=False)
    t.add_column("kernel", no_wrap=True, overflow="ellipsis", ratio=3)
    t.add_column("lib", no_wrap=True, ratio=1)
    t.add_column("%", justify="right")
    t.add_column("/traced tok", justify="right")
    t.add_column("avg", justify="right")
    if not s.top:
        return Text(f"no {s.mode} decode kernels yet" +
                    (" — press c to switch modes" if s.mode == "compiled" else ""), "dim")
    for r in s.top:
        t.add_row(r.name.short, r.name.library, f"{r.pct:.1f}",
                  f"{r.per_token:.1f}" if r.per_token else "–", fmt.ns(r.stats.mean))
    return t


class CompareScreen(Screen):
    BINDINGS = [Binding("escape,v", "app.pop_screen", "back", show=True)]
    DEFAULT_CSS = """
    CompareScreen #compare-summary { height: auto; padding: 0 1; }
    CompareScreen Horizontal { height: auto; }
    CompareScreen .compare-top { width: 1fr; height: auto; padding: 0 1; }
    CompareScreen #compare-note { height: auto; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="compare-summary")
            with Horizontal():
                yield Static(id="compare-top-eager", classes="compare-top")
                yield Static(id="compare-top-compiled", classes="compare-top")
            yield Static(id="compare-note")
        yield Footer()

    def show(self, view: Any) -> None:
        try:
            summary = self.query_one("#compare-summary", Static)
            self.query_one("#compare-top-eager", Static)
        except NoMatches:  # pushed but not composed yet (or being dismissed): next tick
            return
        ea, co = compare(view)
        summary.update(render_summary_table(ea, co))
        self.query_one("#compare-top-eager", Static).update(render_top(ea))
        self.query_one("#compare-top-compiled", Static).update(render_top(co))
        # export.diff_modes (when present) adds the category split and per-kernel changes.
        rendered = render_diff(diff_modes(view, "eager", "compiled"))
        self.query_one("#compare-note", Static).update(
            rendered if rendered is not None else Text("(export.diff_modes not available)", "dim"))
