"""Status line: source state, compile progress, dropped records, degraded collectors, UI cost."""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from ..derive import compile_cost, compile_cost_text
from ...text import printable
from .base import RefreshContext

_STATE_STYLE = {"error": "bold white on red", "compiling": "bold black on yellow",
                "paused": "bold black on cyan", "done": "bold green", "stopped": "bold",
                "read-only": "bold blue", "loading": "bold yellow"}


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; padding: 0 1; background: $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, view: Any, ctx: RefreshContext, *, refresh_stats: dict, frozen: bool,
             kernels: str = "") -> None:
        st = ctx.status
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(f" {printable(st.state, 20)} ", _STATE_STYLE.get(st.state, "bold"))
        if st.state == "compiling":
            if st.compiling_since is not None and not ctx.deterministic:
                t.append(f" compiling {max(0.0, ctx.now - st.compiling_since):.1f}s", "yellow")
            else:
                t.append(" compiling…", "yellow")
        prog = (st.extra or {}).get("program")
        if prog:  # a profiled program: how it runs or ended, and where its output is
            t.append(" ")
            if prog.get("running") is not False:   # running, or not started yet (None)
                t.append(f"▶ {printable(prog.get('name'), 80)}", "bold green")
            else:
                code = prog.get("exit_status")
                t.append(f"■ {printable(prog.get('name'), 80)} exit {printable(code)}",
                         "bold" if code == 0 else "bold red")
                if prog.get("error"):
                    t.append(f" {printable(prog['error'], 200)}", "red")
            t.append(f" · log {printable(prog.get('log'), 120)} (l)", "cyan")
            if st.message and not st.message.startswith(("the program", str(prog.get("name")))):
                t.append(f" · {printable(st.message, 300)}")
        elif st.message:
            t.append(f" {printable(st.message, 300)}", "red" if st.state == "error" else "")
        cost = compile_cost(view, ctx.mode) if st.state == "compiling" else None
        if cost is not None:
            t.append(" │ ")
            t.append(compile_cost_text(cost), "yellow")
        dropped = int(view.counters.get("dropped", 0) or 0)
        t.append(" │ ")
        t.append(f"dropped {dropped:,}", "bold red" if dropped else "dim")
        for name, c in sorted(view.collectors.items()):
            if not c.get("ok", True):
                t.append(" │ ")
                t.append(printable(f"⚠ {name}: {c.get('message') or 'degraded'}", 300), "bold yellow")
            elif "sampled:" in (c.get("message") or ""):
                # Kernel figures come from traced bursts only: say so where the eye goes.
                t.append(" │ ")
                t.append(printable(c["message"].split("sampled:", 1)[1].strip(), 200)
                         .join(("traced: ", "")), "cyan")
        if frozen:
            t.append(" │ ")
            t.append("display frozen (f)", "bold cyan")
        t.append(" │ ")
        if ctx.deterministic:
            t.append("ui –", "dim")
        else:
            t.append(f"ui {refresh_stats.get('mean_ms', 0.0):.1f}/{refresh_stats.get('max_ms', 0.0):.1f} ms", "dim")
        t.append(" │ ? help", "dim")
        self.update(t)
