"""Header: model, device, dtype, mode, batch, weights; steps, tokens/s, TTFT, ms/step, overhead;
until the first token, the start-up progress line instead of the step figures."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from .. import format as fmt
from ..derive import header_numbers
from .base import RefreshContext


class HeaderPane(Static):
    DEFAULT_CSS = """
    HeaderPane { height: 2; padding: 0 1; background: $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, view: Any, ctx: RefreshContext) -> None:
        h = header_numbers(view, ctx.mode)
        st = ctx.status
        mode_style = "bold magenta" if h.mode == "compiled" else "bold cyan"
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("tuiprof ", "bold")
        if h.rank:
            t.append(f" {h.rank} ", "bold reverse")
            t.append(" ")
        t.append(h.model, "bold")
        t.append(f" · {h.device} · {h.dtype} · weights {h.weights} · mode ")
        t.append(h.mode, mode_style)
        batch = st.batch if st.live else h.batch
        t.append(" · batch ")
        t.append(str(batch), "bold")
        if st.live and st.want_batch and st.want_batch != st.batch:
            t.append(f" → {st.want_batch}", "bold yellow")
        if st.state == "compiling":
            t.append(" (compiling…)", "bold yellow")
        t.append("\n")
        progress = ctx.status.progress
        if h.steps == 0 and progress is not None and ctx.status.state in ("loading", "prefill"):
            # Until the first token: what the start-up is doing, since when, how far.
            t.append("loading", "bold yellow")
            t.append(" · " + progress.line(ctx.now, clock=not ctx.deterministic), "yellow")
            self.update(t)
            return
        t.append(f"steps {h.steps:,}", "bold")
        t.append(" · ")
        if h.tok_s:
            t.append(f"{h.tok_s:,.1f} tok/s", "bold green")
            if isinstance(h.batch, int) and h.batch > 1:
                t.append(f" ({h.batch} seq × {h.tok_s / h.batch:,.1f} steps/s)", "green")
            if h.beside_compile:
                t.append(" beside a compile", "yellow")
        else:
            t.append("– tok/s", "bold green")
        t.append(f" · TTFT {fmt.ms(h.ttft_ms)} · ms/step p50 {fmt.ms(h.itl_p50)} "
                 f"p99 {fmt.ms(h.itl_p99)}")
        if h.itl_traced:  # measured while traced: slower than the program runs untraced
            t.append(" (traced steps)", "yellow")
        if ctx.deterministic:
            t.append(" · overhead (hidden)", "dim")
        elif h.overhead_pct is not None:
            t.append(f" · overhead {h.overhead_pct:.1f}%", "yellow" if h.overhead_pct > 5 else "")
            if h.overhead_method:  # what it does not count first: the line may be cut at 200
                t.append(f" ({h.overhead_method.split('; ', 1)[-1]})", "dim")
        else:
            t.append(" · overhead –", "dim")
        self.update(t)
