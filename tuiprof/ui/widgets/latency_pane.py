"""Per-step latency: host and GPU ms per step (one step advances every sequence of the batch)
of the last N steps, prefill, mode and batch switches and steps beside a compile marked; a
server's step also gives its mix of prefill and decode tokens and the requests waiting."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from .. import format as fmt
from ...analysis.tracing import busy_basis_label
from ..derive import (busy_wall, compile_cost, compile_cost_text,
                      latency_series, earlier_traced, latest_traced, place_labels,
                      traced_vs_untraced)

# columns of the plot left of its canvas (y tick labels and axis) and right of it
Y_AXIS_COLS = 10
from .base import Pane, RefreshContext


class LatencyPane(Pane):
    PANE_TITLE = "latency, ms/step"
    DEFAULT_CSS = """
    LatencyPane PlotextPlot { height: 1fr; min-height: 5; }
    LatencyPane #latency-summary { height: 2; text-wrap: nowrap; text-overflow: ellipsis; }
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
        key = (tuple(s.seq[-1:]), len(s.seq), tuple(s.mode_marks), s.seq[:1],
               self.query_one(PlotextPlot).size.width)
        summary = Text(no_wrap=True, overflow="ellipsis")
        done = [r for r in (view.timeline or view.tokens) if r.done]
        if done:
            last = done[-1]
            summary.append(f"#{last.seq} {last.phase}/{fmt.config_label(last.batch, last.mode)}: ",
                           "bold")
            if last.requests:  # a server's step: its mix of prompt and decode tokens
                summary.append(f"{last.prefill_tokens:,} prefill + {last.decode_tokens:,} "
                               f"decode tok", "yellow" if last.prefill_tokens else "magenta")
                summary.append(f" ({len(last.requests)} req, {last.pending} waiting) · ")
            summary.append(f"━ host {fmt.ms(last.host_ms)}/step", "cyan")
            if last.attached:   # measured while CUPTI was attached: slower than untraced
                summary.append(" (traced)" if last.sampled else " (CUPTI attached)", "yellow")
            summary.append(" · ")
            summary.append(f"━ GPU {fmt.ms(s.gpu[-1])}", "green")
            cost = compile_cost(view, ctx.mode)
            if cost is not None:
                summary.append(f" · {compile_cost_text(cost)}", "yellow")
            summary.append("\n")
            summary.append(_kernel_note(view, last))
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
        # the scale is the decode steps', without prefills and the steps that recorded CUDA
        # graphs again after tuiprof dropped them (tens of ms; drawn clipped, in red)
        off = {p for p, _ in s.prefill} | {q for q, _ in s.rerecord}
        decode_vals = [h for h, sq in zip(s.host, s.seq) if sq not in off]
        top = max(decode_vals) if decode_vals else max(s.host)
        top = top * 1.15 if top > 0 else 1.0
        host = [min(v, top) for v in s.host]
        plt.plot(s.seq, host, color="cyan", marker="braille")
        if s.compiling:
            plt.scatter([q for q, _ in s.compiling], [min(v, top) for _, v in s.compiling],
                        color="yellow", marker="braille")
        if s.rerecord:
            plt.scatter([q for q, _ in s.rerecord], [min(v, top) for _, v in s.rerecord],
                        color="red", marker="braille")
        gx = [x for x, g in zip(s.seq, s.gpu) if g is not None]
        gy = [min(g, top) for g in s.gpu if g is not None]
        if gx:
            plt.plot(gx, gy, color="green", marker="braille")
        x0, x1 = s.seq[0], max(s.seq[-1], s.seq[0] + 1)
        cols = max(0, plot.size.width - Y_AXIS_COLS)
        for seq, _ms in s.prefill:
            plt.vline(seq, "yellow")
        for seq, _text in s.mode_marks:
            plt.vline(seq, "magenta")
        for marks, y, color in (
                ([(seq, f"prefill {ms_:.0f}ms") for seq, ms_ in s.prefill], 0.95, "yellow"),
                (s.mode_marks, 0.82, "magenta")):
            for x, text in place_labels(marks, x0, x1, cols):
                plt.text(text, x, top * y, color=color, alignment="left")
        plt.ylim(0, top)
        plt.xlim(x0, x1)
        plt.xlabel("step #")
        plt.ylabel("ms/step")
        plot.refresh()


def _kernel_note(view: Any, last: Any) -> Text:
    """Kernel figures of the latest *traced* token of the last token's phase and mode, naming
    that token when it is not the last one (sampling traces few tokens): its busy share (over
    an untraced step's wall time where there is one, and which basis), and its time beside the
    untraced steps' median (what tracing costs)."""
    phase, mode = last.phase, last.mode
    k = latest_traced(view, phase, mode)
    basis = busy_basis_label(busy_wall(view, phase, mode) is not None)
    if k is None:
        if not view.kernels_traced:
            return Text("no kernel records (CUPTI off)", "dim")
        # Sampling traces 4 tokens in thousands in compiled mode: the traced ones may have
        # left the series. Their running means are kept: say so rather than "none yet".
        e = earlier_traced(view, phase, mode)
        if e is None:
            return Text(f"no traced {phase}/{mode} step yet", "dim")
        out = Text(f"traced {phase}/{mode} (mean of {e.count:,} earlier): ")
        cost = traced_vs_untraced(view, phase, mode)
        if cost:
            out.append(cost, "yellow")
            out.append(" · ")
        kernels = f" · {e.kernels:,.0f} kernels" if e.kernels is not None else ""
        out.append(f"busy {fmt.pct(e.busy_pct)} {basis}{kernels}")
        return out
    out = Text("" if k.seq == last.seq else f"traced #{k.seq}: ")
    cost = traced_vs_untraced(view, phase, mode, k)
    if cost:  # first: what tracing did to the step the kernel figures come from
        out.append(cost, "yellow")
        out.append(" · ")
    out.append(f"busy {fmt.pct(k.busy_pct)} {basis} · {k.kernels:,} kernels")
    return out
