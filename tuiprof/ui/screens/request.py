"""One request in full: how long it waited before its first step and behind which prefills,
its prefill (over how many steps), the decode steps it shared, its time outside any model step,
and the kernels of its steps (``tuiprof.analysis.requests.story``)."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...errors import safe_text
from .. import format as fmt


def render_story(s: Any) -> Table:
    r = s.row
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_row("request", Text(safe_text(r.id, 80), "bold cyan"))
    t.add_row("from", safe_text(r.source, 40) + f" · {r.status}"
              + (f" ({safe_text(r.reason, 60)})" if r.reason else ""))
    counted = getattr(r, "tokens_from", "") == "chunks"
    unknown = counted or (getattr(r, "outside", False) and not r.prompt_tokens)
    t.add_row("tokens", (f"{'?' if unknown else f'{r.prompt_tokens:,}'} prompt → "
                         f"{r.output_tokens:,} output")
              + (" (streamed chunks counted: the server sent no usage)" if counted else "")
              + (f" · {r.kv_blocks} KV-cache blocks" if r.kv_blocks else "")
              + (f" · preempted {r.preemptions}×" if r.preemptions else "")
              + (f" · HTTP {r.http_status}" if getattr(r, "http_status", 0) else ""))
    t.add_row("latency", f"TTFT {fmt.ms(r.ttft_ms, 1)} · end to end {fmt.ms(r.e2e_ms, 1)}"
              + (f" · ITL p50 {fmt.ms(s.itl['p50'], 1)}, p99 {fmt.ms(s.itl['p99'], 1)}, "
                 f"max {fmt.ms(s.itl['max'], 1)}" if s.itl else ""))
    t.add_row("", "")
    if getattr(s, "outside", False):
        t.add_row("seen", Text("from outside the engine, through the proxy: arrival is when "
                               "the proxy's host received its first bytes, its first token the first streamed "
                               "chunk with text; the server does not say when it was queued "
                               "or which steps advanced it, so there is no queue wait and no "
                               "prefill split", "yellow"))
    sock = getattr(s, "in_socket_ms", None)
    if sock is not None:
        t.add_row("socket buffer", f"{fmt.ms(sock, 1)} from the kernel's receipt of its bytes "
                  "to the HTTP server reading them (the server's event loop was busy)")
    if getattr(s, "outside", False):
        pass
    elif s.before_app_ms is not None:
        t.add_row("before the app", f"{fmt.ms(s.before_app_ms, 2)} from the HTTP server's read "
                  "of its first bytes to its app (parsing, the event loop's queue)")
    if s.server_ms is not None and not getattr(s, "outside", False):
        t.add_row("server", f"{fmt.ms(s.server_ms, 2)} from the app to the engine's queue "
                  "(the server's own parsing and tokenisation)")
    if getattr(s, "outside", False):
        pass
    elif s.waited_ms is None:
        t.add_row("waiting", Text("not scheduled yet: no model step has taken it", "yellow"))
    else:
        behind = ""
        if s.behind:
            ids = [i for _, _, ids in s.behind for i in ids]
            shown = ", ".join(safe_text(i, 16) for i in ids[:6]) + (" …" if len(ids) > 6 else "")
            toks = sum(n for _, n, _ in s.behind)
            behind = f", behind {len(s.behind)} prefill step(s) of {toks:,} tokens: {shown}"
        idle = max(0.0, s.waited_ms - s.busy_wait_ms)
        if s.waited_ms > 1 and idle >= 0.5 * s.waited_ms:
            behind += (f"; no model step ran for {fmt.ms(idle, 1)} of it (start-up, the "
                       "engine idle, or the server's own work)")
        t.add_row("waited", f"{fmt.ms(s.waited_ms, 1)} before its first step "
                  f"({s.steps_before} step(s) of other requests ran meanwhile, "
                  f"{fmt.ms(s.busy_wait_ms, 1)} of it){behind}")
    if s.prefill_steps:
        chunked = " (chunked)" if s.prefill_steps > 1 else ""
        t.add_row("prefill", f"over {s.prefill_steps} step(s){chunked}; its first step to its "
                  f"first token {fmt.ms(s.prefill_ms, 1)}")
    if s.decode_steps:
        t.add_row("decode", f"{s.decode_steps:,} steps, shared with {s.shared_mean:.1f} other "
                  "request(s) on average")
    after = getattr(r, "after_engine_ms", None)
    if after is not None:
        t.add_row("after the engine", f"{fmt.ms(after, 2)} from its first token handed over to "
                  "the server writing it to the client (detokenising, the event stream, the "
                  "HTTP server's event loop)")
    if s.outside_ms is not None:
        e2e = (s.outside_ms or 0) + (s.inside_ms or 0)
        share = f" ({s.outside_ms / e2e:.0%})" if e2e > 0 else ""
        t.add_row("outside steps", f"{fmt.ms(s.outside_ms, 1)}{share} of its life with no model "
                  "step running (server Python, tokenisation, HTTP, idle engine)")
    k = s.kernels
    t.add_row("", "")
    line = f"{k['steps']:,} steps; {k['in_view']:,} still in view, {k['traced']} traced"
    if getattr(s, "outside", False):
        line = (f"{k['steps']:,} steps ran while it was in flight (joined by time); "
                f"{k['in_view']:,} still in view, {k['traced']} traced")
    if k["traced"]:
        line += f": {k['kernels']:,} kernels, {fmt.ms(k['kernel_ms'], 2)} of kernel time"
    if k.get("gpu_ms"):
        line += f"; GPU time of its steps {fmt.ms(k['gpu_ms'], 2)}"
    t.add_row("its steps", line)
    if k["top"]:
        lines = Text()
        for i, (name, count, ms_) in enumerate(k["top"]):
            if i:
                lines.append("\n")
            lines.append(f"{fmt.ms(ms_, 3):>10}  {count:>5}×  ")
            lines.append(safe_text(name, 70), "cyan")
        t.add_row("kernels", lines)
    elif not k["traced"]:
        t.add_row("kernels", Text("none of its steps was traced (sampling, or no CUPTI); the "
                                  "kernels pane shows the phase's kernels", "dim"))
    return t


class RequestDetailScreen(ModalScreen):
    BINDINGS = [Binding("escape,enter,q", "dismiss", "close", show=True)]
    DEFAULT_CSS = """
    RequestDetailScreen { align: center middle; }
    RequestDetailScreen > VerticalScroll { width: 110; max-width: 100%; height: auto;
        max-height: 90%; border: round $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, story: Any) -> None:
        super().__init__()
        self.story = story

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(render_story(self.story), id="request-body")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).border_title = (
            f"request — {safe_text(self.story.row.id, 40)} — esc to close")
