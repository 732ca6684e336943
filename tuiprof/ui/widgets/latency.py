"""Per-step latency: host and GPU ms per step (one step advances every sequence of the batch)
of the last N steps, prefill, mode and batch switches and steps beside a compile marked."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from .. import format as fmt
from ..derive import (busy_fraction, compile_cost, compile_cost_text, config_label,
                      latency_series, settled_rows)
from .base import Pane, RefreshContext


class LatencyPane(Pane):
    PANE_TITLE = "latency, ms/step"
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
        done = [r for r in (view.timeline or view.tokens) if r.done]
        if done:
            last = done[-1]
            summary.append(f"#{last.seq} {last.phase}/{config_label(last.batch, last.mode)}: ",
                           "bold")
            summary.append(f"━ host {fmt.ms(last.host_ms)}/step", "cyan")
            summary.append(" · ")
            summary.append(f"━ GPU {fmt.ms(s.gpu[-1])}", "green")
            k = settled_rows(done)[-1]  # the latest token whose kernel records are in
            summary.append(f" · #{k.seq}: kernel-busy {fmt.pct(busy_fraction(k))} · "
                           f"{k.kernels:,} kernels")
            cost = compile_cost(view, ctx.mode)
            if cost is not None:
                summary.append(f" · {compile_cost_text(cost)}", "yellow")
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
        if s.compiling:
            plt.scatter([q for q, _ in s.compiling], [min(v, top) for _, v in s.compiling],
                        color="yellow", marker="braille")
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
            plt.text(text, seq + span * 0.01, top * (0.68 if text.startswith("→b") else 0.82),
                     color="magenta")
        plt.ylim(0, top)
        if len(s.seq) > 1:
            plt.xlim(s.seq[0], s.seq[-1])
        plt.xlabel("step #")
        plt.ylabel("ms/step")
        plot.refresh()
