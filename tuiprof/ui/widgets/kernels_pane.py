"""Top kernels: a keyed DataTable for one configuration (batch, mode) and phase; sortable,
filterable, with details.

Updates are a keyed diff, so a refresh redraws only what changed and keeps the cursor (a
table rebuilt at 4 Hz flickers and costs the event loop): row key = raw kernel name, stale rows
removed, new rows added, ``update_cell`` only for cells whose text changed (never with
``update_width``), ``sort`` only when the order changed. Column widths are fixed.
"""
from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from ... import errors
from ...text import printable
from ...analysis.model_split import model_split
from .. import format as fmt
from ...analysis.tracing import duration_note, tracing_cost
from ..derive import (ALL, PHASE_CYCLE, SORT_CYCLE, KernelRow, kernel_ns_text,
                      kernel_rows,
                      resolve_kernel_phase,
                      resolve_kernel_mode, select_kernels)
from .base import Pane, PaneKey, RefreshContext, cursor_key

# key, label, width, right-aligned
COLUMNS = (
    ("rank", "#", 3, True),
    ("name", "kernel", 30, False),
    ("pct", "% GPU", 6, True),
    ("total", "total", 10, True),
    ("count", "count", 7, True),
    ("avg", "avg", 9, True),
    ("minmax", "min / max", 21, True),
    ("library", "library", 15, False),
    ("category", "category", 23, False),
    ("grid", "grid", 11, False),
    ("block", "block", 9, False),
)
SORT_COLUMN = {"pct": "pct", "count": "count", "avg": "avg", "max": "minmax", "name": "name",
               "library": "library", "category": "category", "total": "total"}
MODE_CYCLE = ("auto", "eager", "compiled")
NAME_MIN, NAME_WANT, NAME_MAX = 24, 40, 56
# Columns given up, first to last, while the kernel name is narrower than NAME_WANT (80x24:
# "ATen elementwise mul bf1…" beside a grid and a block column helps no one).
DROP_ORDER = ("block", "grid", "minmax", "category", "total", "library")


def visible_columns(inner: int) -> tuple[tuple, int]:
    """The columns that fit ``inner`` cells and the name column's width: the name gets the
    width first, columns of lesser value go (``DROP_ORDER``)."""
    cols = list(COLUMNS)

    def name_width() -> int:
        return inner - sum(w + 2 for k, _l, w, _r in cols if k != "name") - 2 - 2

    for key in DROP_ORDER:
        if name_width() >= NAME_WANT:
            break
        cols = [c for c in cols if c[0] != key]
    return tuple(cols), max(NAME_MIN, min(NAME_MAX, name_width()))


def _cells(rank: int, r: KernelRow) -> dict[str, str]:
    s = r.stats
    # CUPTI's times of a short kernel may hold tracing's own cost: corrected by the measured
    # constant (analysis.tracing.DURATION_INFLATION_NS), or marked as upper bounds
    return {
        "rank": str(rank),
        "name": r.info.short,
        "library": r.info.library,
        "category": r.info.category,
        "pct": f"{r.pct:.1f}",
        "total": kernel_ns_text(r, s.total, s.count),
        "count": fmt.count(s.count),
        "avg": kernel_ns_text(r, s.mean),
        "minmax": f"{kernel_ns_text(r, s.min)} / {kernel_ns_text(r, s.max)}",
        "grid": fmt.dim3(r.grid),
        "block": fmt.dim3(r.block),
    }


def _cell(text: str, right: bool) -> Text:
    """A table cell: a Text, never a string (DataTable parses a string as markup)."""
    return Text(text, justify="right") if right else Text(text)


def tracing_caption(view: Any, phase: str, mode: str, shown: list[KernelRow]) -> str:
    """What tracing changes in the table, for its caption: how much slower the traced steps
    these kernels come from ran than untraced ones, and how short kernels' times are read."""
    parts = []
    cost = tracing_cost(view, phase, mode) if phase != ALL else None
    if cost is not None:
        parts.append(f"traced steps {cost.pct:+.0f} % (tracing cost)")
    if any(r.times is not None and (r.times.upper_bound or r.times.correction_ns)
           for r in shown):
        parts.append(duration_note())
    return "".join(f" · {p}" for p in parts)


def empty_reason(view: Any, phase: str, mode: str) -> str:
    """Why the table of (phase, mode) has no kernel yet: a blank table tells a user nothing."""
    if not view.kernels_traced:
        cupti = view.collectors.get("cupti") or {}
        why = errors.safe_text(cupti.get("message") or "CUPTI is off", 200)
        return (f"No kernel records in this session: {why}\n\nStep times, latency, "
                "allocations and utilisation go on without them.")
    return (f"No {mode} {phase} step traced yet. Kernels are traced in short bursts of steps "
            "(the status line's “traced:” says how often), so the first ones arrive after the "
            "first burst; p switches the phase, m the mode.")


def comm_lines(rows: list[KernelRow], ctx: RefreshContext, mode: str, phase: str,
               most: int = 2) -> Text | None:
    """An NCCL kernel's time split into transfer and wait (docs/multi-gpu.md), so that its share
    of GPU time is not read as bandwidth: one line for each of the top ``most`` NCCL rows."""
    comm = [r for r in rows if r.info.category == "communication"][:most]
    if not comm:
        return None
    split = ctx.comm_split
    same = split is not None and split.get("mode") == mode and phase in ("decode", ALL)
    out = Text(no_wrap=True, overflow="ellipsis")
    for i, r in enumerate(comm):
        if i:
            out.append("\n")
        k = split["kernels"].get(r.name) if same else None
        if k is None or not (k["transfer"] + k["wait"]):
            who = ("waiting for the other ranks" if ctx.ranks > 1 else
                   "waiting for the other ranks of the job")
            when = (" (transfer / wait once steps are traced on every rank; a: all ranks)"
                    if ctx.ranks > 1 else "")
            out.append(f"{r.info.short}: {r.pct:.1f} % of GPU time, {who} included: not "
                       f"bandwidth{when}", "yellow")
            continue
        tot = k["transfer"] + k["wait"]
        t_pct, w_pct = r.pct * k["transfer"] / tot, r.pct * k["wait"] / tot
        out.append(f"{r.info.short}: {r.pct:.1f} % of GPU time = ", "bold")
        out.append(f"transfer {t_pct:.1f} %", "green")
        out.append(" + ")
        out.append(f"wait {w_pct:.1f} %", "yellow")
        late, share = split.get("late_rank"), split.get("late_share")
        if late is not None and share is not None:
            out.append(f" (rank {late} arrives last at {share:.0%} of the calls"
                       + (": this rank)" if late == ctx.rank else ")"))
        out.append(f" · {k['calls']:,} calls, {split['steps']} steps traced on every rank", "dim")
    return out


class KernelsPane(Pane):
    PANE_TITLE = "top kernels"
    DEFAULT_CSS = """
    KernelsPane #kernels-caption { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    KernelsPane #kernels-comm { display: none; height: auto; max-height: 2; }
    KernelsPane.-comm #kernels-comm { display: block; }
    KernelsPane DataTable { height: 1fr; }
    KernelsPane Input { display: none; height: 3; }
    KernelsPane.-filtering Input { display: block; }
    KernelsPane #kernels-empty { display: none; height: auto; padding: 1 2; color: $text-muted; }
    KernelsPane.-empty #kernels-empty { display: block; }
    KernelsPane.-empty DataTable { height: 2; }
    """

    KEYS = (
        PaneKey("kernel-phase", "p", "phase", "phase", "Kernels: cycle phase (decode/prefill/other/all)"),
        PaneKey("kernel-mode", "m", "mode", "mode", "Kernels: cycle mode (auto/eager/compiled)"),
        PaneKey("kernel-config", "k", "config", "batch shown",
                "Kernels: cycle the batch configuration shown (the one in use, then each measured)"),
        PaneKey("kernel-sort", "s", "sort", "sort", "Kernels: cycle sort column"),
        PaneKey("kernel-invert", "i", "invert", "invert", "Kernels: invert sort order"),
        PaneKey("kernel-filter", "slash", "filter", "filter", "Kernels: filter by text", shown_key="/"),
        PaneKey("kernel-detail", "enter", "detail", "details", "Kernels: details of the selected kernel"),
    )

    class OpenDetail(Message):
        """Ask the app to show one kernel's details."""

        def __init__(self, row: KernelRow) -> None:
            super().__init__()
            self.row = row

    def __init__(self, top_n: int = 50, **kw: Any) -> None:
        super().__init__(**kw)
        self.top_n = top_n
        self.phase = PHASE_CYCLE[0]
        self.mode_choice = "auto"
        self.config_choice: Any = "auto"     # "auto": the batch in use; else a batch key
        self.resolved_batch: Any = None
        self.sort = "pct"
        self.descending = True
        self.filter_text = ""
        self.rows: dict[str, KernelRow] = {}
        self._shown: dict[str, dict[str, str]] = {}
        self._order: list[str] = []
        self._last_sig: tuple | None = None
        self._view: Any = None
        self._ctx: RefreshContext | None = None
        self.resolved_mode = "eager"
        self.columns, self.name_width = visible_columns(0)

    def compose(self) -> ComposeResult:
        yield Static(id="kernels-caption")
        yield Static(id="kernels-comm")
        table: DataTable = DataTable(id="kernels-table", cursor_type="row", zebra_stripes=True)
        self._add_columns(table)
        yield table
        yield Static(id="kernels-empty")
        yield Input(placeholder="filter kernels (name, library, category) — enter to apply, esc to clear",
                    id="kernels-filter")

    def _add_columns(self, table: DataTable) -> None:
        for key, label, width, right in self.columns:
            if key == "name":
                width = self.name_width
            table.add_column(Text(label, justify="right") if right else label, key=key, width=width)

    def on_resize(self) -> None:
        # The name column takes the width left over; a width change rebuilds the columns
        # (rare: only on terminal resize), never on a refresh tick.
        inner = self.content_region.width
        if inner <= 0:
            return
        columns, width = visible_columns(inner)
        if (columns, width) != (self.columns, self.name_width):
            self.columns, self.name_width = columns, width
            table = self.query_one(DataTable)
            table.clear(columns=True)
            self._add_columns(table)
            self._shown.clear()
            self._redraw()

    def focus_main(self) -> None:
        self.query_one(DataTable).focus()

    # ----------------------------------------------------------- state changes (keys)
    def cycle_phase(self) -> str:
        i = PHASE_CYCLE.index(self.phase)
        self.phase = PHASE_CYCLE[(i + 1) % len(PHASE_CYCLE)]
        self._redraw()
        return f"kernels: phase {self.phase}"

    def cycle_mode(self) -> str:
        i = MODE_CYCLE.index(self.mode_choice)
        self.mode_choice = MODE_CYCLE[(i + 1) % len(MODE_CYCLE)]
        self._redraw()
        return f"kernels: mode {self.mode_choice}"

    def cycle_config(self) -> str:
        """Next batch configuration: the one in use ("auto"), then each one measured."""
        keys = list(self._view.config_keys) if self._view is not None else []
        cycle = ["auto", *keys]
        i = cycle.index(self.config_choice) if self.config_choice in cycle else 0
        self.config_choice = cycle[(i + 1) % len(cycle)]
        self._redraw()
        shown = "the batch in use" if self.config_choice == "auto" else fmt.config_label(self.config_choice)
        return f"kernels: {shown}"

    def cycle_sort(self) -> str:
        i = SORT_CYCLE.index(self.sort) if self.sort in SORT_CYCLE else -1
        self.sort = SORT_CYCLE[(i + 1) % len(SORT_CYCLE)]
        self._redraw()
        return f"kernels: sorted by {self.sort}"

    def invert_sort(self) -> str:
        self.descending = not self.descending
        self._redraw()
        return f"kernels: {'descending' if self.descending else 'ascending'}"

    # the pane's keys (KEYS)
    def action_phase(self) -> str:
        return self.cycle_phase()

    def action_mode(self) -> str:
        return self.cycle_mode()

    def action_config(self) -> str:
        return self.cycle_config()

    def action_sort(self) -> str:
        return self.cycle_sort()

    def action_invert(self) -> str:
        return self.invert_sort()

    def action_filter(self) -> None:
        self.open_filter()

    def action_detail(self) -> None:
        row = self.current_row()
        if row is not None:
            self.post_message(self.OpenDetail(row))

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._redraw()

    def open_filter(self) -> None:
        self.add_class("-filtering")
        inp = self.query_one(Input)
        inp.value = self.filter_text
        inp.focus()

    def close_filter(self, clear: bool) -> None:
        if clear:
            self.query_one(Input).value = ""
            self.set_filter("")
        self.remove_class("-filtering")
        self.query_one(DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.set_filter(event.value)
        self.close_filter(clear=False)

    def key_escape(self) -> None:
        if self.has_class("-filtering"):
            self.close_filter(clear=True)

    def current_row(self) -> KernelRow | None:
        return self.rows.get(cursor_key(self.query_one(DataTable)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = self.rows.get(event.row_key.value)
        if row is not None:
            self.post_message(self.OpenDetail(row))

    # ----------------------------------------------------------------- refresh
    def _redraw(self) -> None:
        if self._view is not None and self._ctx is not None:
            self._last_sig = None
            self.show(self._view, self._ctx)

    def show(self, view: Any, ctx: RefreshContext) -> None:
        self._view, self._ctx = view, ctx
        if self.config_choice != "auto" and self.config_choice in view.config_keys:
            view = view.select(self.config_choice)
        self.resolved_batch = view.batch
        want = ctx.mode if self.mode_choice == "auto" else self.mode_choice
        phase = resolve_kernel_phase(view, self.phase)
        mode = resolve_kernel_mode(view, want, phase)
        self.resolved_mode = mode
        sig = (ctx.changed, view.batch, mode, phase, self.sort, self.descending, self.filter_text,
               id(ctx.comm_split))
        if sig == self._last_sig and not ctx.changed:
            return
        self._last_sig = sig
        rows = kernel_rows(view, mode, phase)
        total_ns = sum(r.stats.total for r in rows)
        sel = select_kernels(rows, self.sort, self.descending, self.filter_text, self.top_n)
        self.rows = {r.name: r for r in sel}
        cap = Text(no_wrap=True, overflow="ellipsis")
        cap.append(printable(f"{fmt.config_label(view.batch, mode)} · {phase}", 80), "bold")
        if phase != self.phase:
            cap.append(printable(f" (no {self.phase} steps: every phase)"), "dim")
        if mode != want:
            cap.append(printable(f" (no {want} kernels in this phase)", 80), "dim")
        # first, so that 80 columns show it: a step's kernels, the model's and the loop's
        split = model_split(view, phase).get(mode) if phase != ALL else None
        if split is not None:
            cap.append(f" · per step: model {split.model_kernels:,.0f} "
                       f"({fmt.ms(split.model_ms)}) + loop {split.loop_kernels:,.0f} "
                       f"({fmt.ms(split.loop_ms)})", "cyan")
        cap.append(f" · {len(rows)} kernels · {fmt.ns(total_ns)} GPU"
                   f" · sort {self.sort} {'↓' if self.descending else '↑'}")
        cap.append(tracing_caption(view, phase, mode, sel), "yellow")
        if self.filter_text:
            cap.append(f" · filter “{printable(self.filter_text, 40)}” ({len(sel)} match)", "yellow")
        cap.append("  [k] batch [p]hase [m]ode [s]ort [i]nvert [/]filter [enter]details", "dim")
        self.query_one("#kernels-caption", Static).update(cap)
        comm = comm_lines(sel, ctx, mode, phase)
        self.set_class(bool(comm), "-comm")
        if comm:
            self.query_one("#kernels-comm", Static).update(comm)
        empty = "" if rows else empty_reason(view, phase, mode)
        self.set_class(bool(empty), "-empty")
        if empty:
            self.query_one("#kernels-empty", Static).update(Text(empty))
        self._update_table(sel)

    def _update_table(self, sel: list[KernelRow]) -> None:
        table = self.query_one(DataTable)
        want = [r.name for r in sel]
        want_set = set(want)
        for key in [k for k in self._shown if k not in want_set]:
            table.remove_row(key)
            del self._shown[key]
        rights = {k for k, _l, _w, r in self.columns if r}
        shown = [k for k, *_ in self.columns]
        for rank, r in enumerate(sel, 1):
            cells = _cells(rank, r)
            cells = {k: cells[k] for k in shown}
            old = self._shown.get(r.name)
            if old is None:
                table.add_row(*[_cell(cells[k], k in rights) for k in shown], key=r.name)
                self._shown[r.name] = cells
                continue
            for k, v in cells.items():
                if old[k] != v:
                    table.update_cell(r.name, k, _cell(v, k in rights))
            self._shown[r.name] = cells
        current = [row.key.value for row in table.ordered_rows]
        if current != want:
            table.sort("rank", key=lambda cell: int(cell.plain if isinstance(cell, Text) else cell))
        self._order = want
