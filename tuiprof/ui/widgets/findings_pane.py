"""Findings: ranked findings from :func:`tuiprof.analysis.findings.find`.

The analysis runs off the UI thread (the app's ``findings`` worker, throttled); this pane only
renders the list it is handed.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...text import printable
from .base import Pane, RefreshContext

_SEV_STYLE = {"critical": "bold white on red", "high": "bold red", "error": "bold red",
              "warning": "bold yellow", "warn": "bold yellow", "medium": "bold yellow",
              "low": "cyan", "info": "cyan"}
_SEV_RANK = {"critical": 0, "high": 1, "error": 1, "warning": 2, "warn": 2, "medium": 2,
             "low": 3, "info": 4}


def _sev(f: Any) -> str:
    s = getattr(f, "severity", "info")
    return str(getattr(s, "name", getattr(s, "value", s))).lower()


def _rank(f: Any) -> tuple:
    s = getattr(f, "severity", None)
    if isinstance(s, (int, float)):
        return (-s,)
    return (_SEV_RANK.get(_sev(f), 5),)


def _numbers(n: Any) -> str:
    if not n:
        return ""
    if isinstance(n, dict):
        return " · ".join(f"{k} {_num(v)}" for k, v in n.items())
    if isinstance(n, (list, tuple)):
        return " · ".join(str(x) for x in n)
    return str(n)


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def render_findings(found: list, message: str = "") -> Any:
    if message:
        return Text(printable(message, 400), "dim")
    if not found:
        return Text("no findings (yet)", "dim")
    parts = []
    # analysis.find ranks by estimated impact; keep its order (sort only unranked lists).
    ranked = found if any(hasattr(f, "impact_ms_per_token") for f in found) else sorted(found, key=_rank)
    for i, f in enumerate(ranked, 1):
        sev = _sev(f)
        t = Text()
        t.append(f"{i}. ", "bold")
        t.append(f"[{sev}] ", _SEV_STYLE.get(sev, "bold"))
        t.append(printable(getattr(f, "title", f), 400), "bold")
        impact = getattr(f, "impact_ms_per_token", None)
        if isinstance(impact, (int, float)):
            # per decode step (one forward over the batch), as the latency pane counts
            t.append(f"  ~{impact:.2f} ms/step", "bold magenta")
        adv = getattr(f, "advice", None)
        if adv:
            t.append(f"\n   → {printable(adv, 1000)}", "green")
        ev = getattr(f, "evidence", None)
        if ev:
            ev_s = "; ".join(map(str, ev)) if isinstance(ev, (list, tuple)) else str(ev)
            t.append(f"\n   evidence: {printable(ev_s, 1000)}")
        nums = _numbers(getattr(f, "numbers", None))
        if nums:
            t.append(f"\n   {printable(nums, 1000)}", "dim")
        parts.append(t)
    return Group(*parts)


class FindingsPane(Pane):
    PANE_TITLE = "findings"
    DEFAULT_CSS = """
    FindingsPane VerticalScroll { height: 1fr; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.found: list = []
        self.message = "analysing…"

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("analysing…", "dim"), id="findings-body")

    def set_findings(self, found: list, message: str) -> None:
        self.found, self.message = list(found), message
        self.query_one("#findings-body", Static).update(render_findings(self.found, message))

    def focus_main(self) -> None:
        self.query_one(VerticalScroll).focus()

    def show(self, view: Any, ctx: RefreshContext) -> None:
        pass  # the app hands results in via set_findings
