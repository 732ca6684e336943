"""A server's requests: TTFT, ITL, queue wait and end-to-end latency over a sliding window
(p50/p90/p99, with a plot of each finished request's TTFT and end-to-end time), requests/s and
output tokens/s, and the requests in flight (id, age, state, tokens so far, TTFT, ITL p50).
Enter on a request opens its detail (``tuiprof/ui/screens/request.py``). Its data is
``view.requests`` (``tuiprof/store/requests.py``); the numbers come from
``tuiprof/analysis/requests.py``. Request ids are the program's text: sanitised here."""
from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from ...analysis.requests import WINDOW_S, in_flight, window
from ...errors import safe_text
from .. import format as fmt
from .base import Pane, RefreshContext, cursor_key

LABELS = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("queue_ms", "queue"), ("e2e_ms", "e2e"))
COLUMNS = (("id", "request", 18), ("age", "age", 9), ("state", "state", 8),
           ("tokens", "tokens", 7), ("ttft", "TTFT", 9), ("itl", "ITL p50", 9))
MAX_ROWS = 200   # requests in flight listed (the oldest first)
NONE_YET = ("no requests in this session: they come from transformers continuous batching "
            "(generate_batch, transformers serve --continuous-batching), generate(), "
            "tuiprof serve, tuiprof.request_arrived()/request_token()/request_finished(), or "
            "tuiprof run --proxy LISTEN=UPSTREAM in front of any HTTP server")


def rid_text(rid: Any, width: int = 18) -> str:
    """A request id as it may be shown (the program's text, sanitised)."""
    return safe_text(rid, width)


class RequestsPane(Pane):
    PANE_TITLE = "requests"
    DEFAULT_CSS = """
    RequestsPane #requests-top { height: 6; }
    RequestsPane #requests-stats { width: 46; height: 6; }
    RequestsPane PlotextPlot { width: 1fr; height: 6; }
    RequestsPane #requests-caption { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    RequestsPane DataTable { height: 1fr; }
    """

    class OpenRequest(Message):
        """Ask the app to show one request's detail."""

        def __init__(self, rid: Any) -> None:
            super().__init__()
            self.rid = rid

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None
        self._keys: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="requests-caption")
        with Horizontal(id="requests-top"):
            yield Static(id="requests-stats")
            yield PlotextPlot(id="requests-plot")
        table: DataTable = DataTable(id="requests-table", cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table

    def focus_main(self) -> None:
        self.query_one(DataTable).focus()

    def current_request(self) -> Any:
        return self._keys.get(cursor_key(self.query_one(DataTable)))

    def action_detail(self) -> None:
        """``enter`` while this pane is the one shown (the narrow layout): the request under
        the cursor's story (the key is the kernels pane's, see ``TuiprofApp.action_pane``)."""
        self.post_message(self.OpenRequest(self.current_request()))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        rid = self._keys.get(event.row_key.value)
        if rid is not None:
            self.post_message(self.OpenRequest(rid))

    @classmethod
    def has_data(cls, view: Any) -> bool:
        """A server's session: requests arrived (the grid then makes room for the pane)."""
        req = getattr(view, "requests", None)
        return bool(req) or bool(req is not None and req.counts.get("arrived"))

    def show(self, view: Any, ctx: RefreshContext) -> None:
        req = view.requests
        counts = req.counts
        key = (counts.get("arrived"), counts.get("tokens"), counts.get("finished"),
               len(req.rows), self.size.width)
        if key == self._last and not ctx.changed:
            return
        self._last = key
        cap = Text(no_wrap=True, overflow="ellipsis")
        if not req:
            cap.append(NONE_YET, "dim")
            self.query_one("#requests-caption", Static).update(cap)
            self.query_one("#requests-stats", Static).update("")
            self._plot(None)
            self._table([], 0)
            return
        w = window(view, WINDOW_S)
        cap.append(f"{w.in_flight} in flight", "bold")
        if counts.get("warmup"):   # served before the load: in none of the figures here
            cap.append(f" ({counts['warmup']} warm-up apart)", "dim")
        proxied = req.sources.get("proxy", 0)
        if proxied:   # first: at 80 columns the rest of the line is cut
            cap.append(f" · {proxied:,} through the proxy (outside the engine: no queue time)",
                       "yellow")
        cap.append(f" · {w.requests_per_s:.2f} req/s · {w.tokens_per_s:,.1f} output tok/s")
        span = "every request kept" if w.whole else f"last {w.span_s:.0f} s"
        cap.append(f" · {w.finished} finished in the window ({span})", "dim")
        cap.append(f" · {counts.get('finished', 0):,}/{counts.get('arrived', 0):,} done in all",
                   "dim")
        bad = sum(req.misuse.values())
        if bad:
            cap.append(f" · {bad} misuse (events)", "yellow")
        cap.append("  [enter] a request", "dim")
        self.query_one("#requests-caption", Static).update(cap)
        self.query_one("#requests-stats", Static).update(stats_table(w))
        self._plot(w)
        self._table(in_flight(view), len(req.rows))

    def _plot(self, w: Any) -> None:
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        if w is None or not w.series.get("ttft_ms"):
            plt.title("TTFT and e2e of finished requests (none yet)")
            plot.refresh()
            return
        for metric, color in (("e2e_ms", "cyan"), ("ttft_ms", "yellow")):
            pts = sorted(w.series[metric], key=lambda p: -p[0])
            if pts:
                plt.scatter([-a for a, _ in pts], [v for _, v in pts], color=color,
                            marker="braille")
        plt.title("TTFT (yellow), e2e (cyan), ms · s ago")
        plot.refresh()

    def _table(self, rows: list, kept: int) -> None:
        table = self.query_one(DataTable)
        table.clear()
        self._keys = {}
        for i, r in enumerate(rows[:MAX_ROWS]):
            k = f"r{i}"
            self._keys[k] = r.id
            table.add_row(rid_text(r.id), fmt.ms(r.age_ms, 0), r.state, f"{r.tokens:,}",
                          fmt.ms(r.ttft_ms, 1), fmt.ms(r.itl_p50_ms, 1), key=k)


def stats_table(w: Any) -> Table:
    """p50/p90/p99 of TTFT, ITL, queue wait and end-to-end latency over the window."""
    t = Table.grid(padding=(0, 1))
    t.add_column(width=6, no_wrap=True)
    for _ in range(3):
        t.add_column(width=11, justify="right", no_wrap=True)
    t.add_row(Text("ms", "dim"), Text("p50", "bold"), Text("p90", "bold"), Text("p99", "bold"))
    for metric, label in LABELS:
        q = w.quantiles.get(metric)
        if q is None:
            t.add_row(Text(label, "bold"), "–", "–", "–")
        else:
            t.add_row(Text(label, "bold"), *(fmt.ms(v, 1) for v in q))
    return t
