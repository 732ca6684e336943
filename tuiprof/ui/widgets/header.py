"""Header: model, device, dtype, mode, weights, tokens, tokens/s, TTFT, ITL, overhead; until the
first token, the start-up progress line instead of the token figures."""
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
        mode_style = "bold magenta" if h.mode == "compiled" else "bold cyan"
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("tuiprof ", "bold")
        t.append(h.model, "bold")
        t.append(f" · {h.device} · {h.dtype} · weights {h.weights} · mode ")
        t.append(h.mode, mode_style)
        if ctx.status.state == "compiling":
            t.append(" (compiling…)", "bold yellow")
        t.append("\n")
        progress = ctx.status.progress
        if h.tokens == 0 and progress is not None and ctx.status.state in ("loading", "prefill"):
            # Until the first token: what the start-up is doing, since when, how far.
            t.append("loading", "bold yellow")
            t.append(" · " + progress.line(ctx.now, clock=not ctx.deterministic), "yellow")
            self.update(t)
            return
        t.append(f"tokens {h.tokens:,}", "bold")
        t.append(" · ")
        t.append(f"{h.tok_s:.1f} tok/s" if h.tok_s else "– tok/s", "bold green")
        t.append(f" · TTFT {fmt.ms(h.ttft_ms)} · ITL p50 {fmt.ms(h.itl_p50)} p99 {fmt.ms(h.itl_p99)}")
        if ctx.deterministic:
            t.append(" · overhead (hidden)", "dim")
        elif h.overhead_pct is not None:
            t.append(f" · overhead {h.overhead_pct:.1f}%", "yellow" if h.overhead_pct > 5 else "")
            if h.overhead_method:
                t.append(f" ({h.overhead_method})", "dim")
        else:
            t.append(" · overhead –", "dim")
        self.update(t)
