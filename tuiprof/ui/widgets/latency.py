"""Per-token latency: host ms and GPU ms of the last N tokens, prefill and mode switches marked."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from .. import format as fmt
from ..derive import busy_fraction, settled_rows, latency_series
from .base import Pane, RefreshContext


class LatencyPane(Pane):
    PANE_TITLE = "per-token latency"
    TAB_TITLE = "latency"
    PANE_KEY = "1"
    DEFAULT_CSS = """
    LatencyPane PlotextPlot { height: 1fr; min-height: 5; }
    LatencyPane #latency-summary { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, n_tokens: int = 256, **kw: Any) -> None:
        super().__init__(**kw)
        self.n_tokens = n_tokens
        self._last_key: tuple | None = None

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="latency-plot")
        yield Static(id="latency-summary")

    def show(self, view: Any, ctx: RefreshContext) -> None:
        s = latency_series(view, self.n_tokens)
        key = (tuple(s.seq[-1:]), len(s.seq), tuple(s.mode_marks), s.seq[:1])
        summary = Text(no_wrap=True, overflow="ellipsis")
        done = [r for r in view.tokens if r.done]
        if done:
            last = done[-1]
            summary.append(f"#{last.seq} {last.phase}/{last.mode}: ", "bold")
            summary.append(f"━ host {fmt.ms(last.host_ms)}", "cyan")
            summary.append(" · ")
            summary.append(f"━ GPU {fmt.ms(s.gpu[-1])}", "green")
            k = settled_rows(done)[-1]  # the latest token whose kernel records are in
            summary.append(f" · #{k.seq}: kernel-busy {fmt.pct(busy_fraction(k))} · "
                           f"{k.kernels:,} kernels")
        else:
            summary.append("waiting for the first token…", "dim")
        self.query_one("#latency-summary", Static).update(summary)
        if key == self._last_key:
            return
        self._last_key = key
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        if not s.seq:
            plt.title("no tokens yet")
            plot.refresh()
            return
        decode_vals = [h for h, sq in zip(s.host, s.seq) if sq not in {p for p, _ in s.prefill}]
        top = max(decode_vals) if decode_vals else max(s.host)
        top = top * 1.15 if top > 0 else 1.0
        host = [min(v, top) for v in s.host]
        plt.plot(s.seq, host, color="cyan", marker="braille")
        gx = [x for x, g in zip(s.seq, s.gpu) if g is not None]
        gy = [min(g, top) for g in s.gpu if g is not None]
        if gx:
            plt.plot(gx, gy, color="green", marker="braille")
        span = max(1, s.seq[-1] - s.seq[0])
        for seq, ms_ in s.prefill:
            plt.vline(seq, "yellow")
            plt.text(f"prefill {ms_:.0f}ms", seq + span * 0.01, top * 0.95, color="yellow")
        for seq, text in s.mode_marks:
            plt.vline(seq, "magenta")
            plt.text(text, seq + span * 0.01, top * 0.82, color="magenta")
        plt.ylim(0, top)
        if len(s.seq) > 1:
            plt.xlim(s.seq[0], s.seq[-1])
        plt.xlabel("token #")
        plt.ylabel("ms")
        plot.refresh()
