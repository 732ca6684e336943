"""Compare two sessions (or two modes of one session) side by side.

``diff(a_view, b_view)`` compares each session's decode steps of its main mode;
``diff_modes(view, "eager", "compiled")`` compares two modes within one session. Both give a
:class:`DiffResult` that :func:`render_rich` (a rich renderable) and :func:`render_text`
(plain text or markdown) print: tokens/s (every sequence), ms/step, kernels per step, GPU busy fraction,
kernel-time shares per category and the top kernels with their absolute and % change; and for a
server's sessions, its requests: TTFT, ITL, queue wait and end-to-end p50/p99 over every
finished request.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..store import StoreView
from ..store.records import DECODE
from ..text import printable
from .names import kernel_label
from .summary import mode_summary, modes_of


@dataclass
class Side:
    """The figures of one side (one session's mode, decode phase)."""

    label: str
    mode: str
    tokens: int                      # traced decode tokens: the per-token kernel figures' base
    tokens_per_s: float | None
    ms_per_token: float | None
    kernels_per_token: float | None
    busy_fraction: float | None
    kernel_ms_per_token: float | None
    categories: dict[str, float] = field(default_factory=dict)   # category -> share %
    kernels: dict[str, tuple] = field(default_factory=dict)      # raw -> (short, cat, µs/token, launches/token)
    decode_tokens: int = 0           # every decode token of the mode, traced or not
    batch: float | None = None                                   # sequences per step
    requests: dict = field(default_factory=dict)  # figure -> value (a server's requests)


@dataclass
class Change:
    """One compared figure: ``a`` and ``b`` and their difference."""

    label: str
    a: float | None
    b: float | None
    unit: str = ""
    category: str = ""

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def pct(self) -> float | None:
        d = self.delta
        return None if d is None or not self.a else 100.0 * d / self.a


@dataclass
class DiffResult:
    a: Side
    b: Side
    metrics: list[Change]
    categories: list[Change]
    kernels: list[Change]       # label: short kernel name; unit µs/token; category set
    requests: list[Change] = field(default_factory=list)   # TTFT, ITL, ... (servers only)


def side_of(view: StoreView, mode: str | None = None, label: str = "") -> Side:
    """Decode-phase figures of ``mode`` (default: the mode with most decode tokens)."""
    if mode is None:
        counts = {m: mode_summary(view, m)["decode_tokens"] for m in modes_of(view)}
        mode = max(counts, key=lambda m: (counts[m], m)) if counts else str(view.meta.get("mode", "eager"))
    ms = mode_summary(view, mode)
    # kernel totals cover sampled tokens; without CUPTI there are none
    n = ms.get("sampled_tokens") or (ms["decode_tokens"] if view.kernels_traced else 0) or 0
    per_cat: dict[str, int] = defaultdict(int)
    kernels: dict[str, tuple] = {}
    for (name, phase, m), agg in view.kernels.items():
        if phase != DECODE or m != mode:
            continue
        short, cat = (printable(x) for x in kernel_label(name))
        per_cat[cat] += agg.stats.total
        if n:
            kernels[name] = (short, cat, agg.stats.total / n / 1e3, agg.stats.count / n)
    total = sum(per_cat.values())
    cats = {c: 100.0 * t / total for c, t in sorted(per_cat.items(), key=lambda kv: -kv[1])} if total else {}
    shared = _analysis_shares(view, mode)
    if shared is not None:
        cats = shared
    side = Side(printable(label or view.meta.get("recording") or mode, 80), printable(mode, 40),
                n, ms["tokens_per_s"],
                ms["ms_per_token_median"], ms["kernels_per_token_median"],
                ms["gpu_busy_fraction"], ms["kernel_ms_per_token_median"], cats, kernels,
                ms["decode_tokens"] or 0, ms.get("batch"))
    side.requests = request_figures(view)
    return side


REQUEST_FIGURES = (("finished requests", "finished", None, ""),
                   ("TTFT p50", "ttft_ms", 0.5, "ms"), ("TTFT p99", "ttft_ms", 0.99, "ms"),
                   ("ITL p50", "itl_ms", 0.5, "ms"), ("ITL p99", "itl_ms", 0.99, "ms"),
                   ("queue wait p50", "queue_ms", 0.5, "ms"),
                   ("end to end p50", "e2e_ms", 0.5, "ms"),
                   ("outside model steps p50", "outside_ms", 0.5, "ms"))


def request_figures(view: StoreView) -> dict:
    """TTFT, ITL, queue wait and end-to-end percentiles over every finished request of the
    session (its running statistics), empty for a session without requests."""
    req = view.requests
    if not req:
        return {}
    out = {}
    for label, key, q, _unit in REQUEST_FIGURES:
        if q is None:
            out[label] = req.counts.get(key, 0)
            continue
        st = req.stats.get(key)
        out[label] = st.quantile(q) if st is not None and st.count else None
    return out


def _analysis_shares(view: StoreView, mode: str) -> dict[str, float] | None:
    """Category shares (%) from ``tuiprof.analysis`` (what the UI shows) when available."""
    try:
        from ..analysis import category_shares  # noqa: PLC0415 - optional
        got = category_shares(view, phase=DECODE, mode=mode)
        return {str(k): 100.0 * float(getattr(v, "share", v)) for k, v in got.items()}
    except Exception:
        return None


def compare(a: Side, b: Side, top: int = 10) -> DiffResult:
    """Line up two sides."""
    metrics = [
        Change("tokens/s", a.tokens_per_s, b.tokens_per_s, "tok/s"),
        Change("ms/step (median)", a.ms_per_token, b.ms_per_token, "ms"),
        Change("kernels/step (median)", a.kernels_per_token, b.kernels_per_token, ""),
        Change("kernel time/step (median)", a.kernel_ms_per_token, b.kernel_ms_per_token, "ms"),
        Change("GPU busy fraction", _pct(a.busy_fraction), _pct(b.busy_fraction), "%"),
        Change("decode steps (all)", a.decode_tokens, b.decode_tokens, ""),
        Change("traced decode steps", a.tokens or None, b.tokens or None, ""),
        Change("sequences/step", a.batch, b.batch, ""),
    ]
    cat_names = list(a.categories) + [c for c in b.categories if c not in a.categories]
    cats = [Change(printable(c), a.categories.get(c, 0.0), b.categories.get(c, 0.0), "%")
            for c in cat_names]

    def top_of(side: Side) -> list[str]:
        return sorted(side.kernels, key=lambda k: (-side.kernels[k][2], k))[:top]

    names = list(dict.fromkeys(top_of(a) + top_of(b)))
    rows = []
    for raw in names:
        ka, kb = a.kernels.get(raw), b.kernels.get(raw)
        info = ka or kb
        rows.append(Change(info[0], ka[2] if ka else 0.0, kb[2] if kb else 0.0, "µs/token",
                           info[1]))
    rows.sort(key=lambda c: (-max(c.a or 0.0, c.b or 0.0), c.label))
    reqs = [Change(label, a.requests.get(label), b.requests.get(label), unit)
            for label, _k, _q, unit in REQUEST_FIGURES] if (a.requests or b.requests) else []
    return DiffResult(a, b, metrics, cats, rows, reqs)


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def diff(a_view: StoreView, b_view: StoreView, a_mode: str | None = None,
         b_mode: str | None = None, labels: tuple[str, str] | None = None,
         top: int = 10) -> DiffResult:
    """Compare two sessions (e.g. two snapshots: ``tuiprof diff A.json B.json``)."""
    la, lb = labels or ("", "")
    return compare(side_of(a_view, a_mode, la), side_of(b_view, b_mode, lb), top)


def diff_modes(view: StoreView, a: str = "eager", b: str = "compiled", top: int = 10) -> DiffResult:
    """Compare two modes of one session (the UI's eager-vs-compiled view)."""
    return compare(side_of(view, a, a), side_of(view, b, b), top)


# ------------------------------------------------------------------ rendering
def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "–"
    if unit == "µs/token":
        return f"{v:,.2f}"
    if unit in ("%", "tok/s"):
        return f"{v:,.1f}"
    if unit == "" and float(v).is_integer():
        return f"{int(v):,}"
    if abs(v) < 10:
        return f"{v:,.2f}"
    return f"{v:,.1f}"


def _chg(c: Change) -> tuple[str, str]:
    d, p = c.delta, c.pct
    ds = "–" if d is None else ("+" if d > 0 else "") + _num(d, c.unit)
    ps = "–" if p is None else f"{p:+.1f}%"
    return ds, ps


def _rows(res: DiffResult) -> list[tuple[str, list[list[str]]]]:
    sections = []
    sections.append(("Summary", [[c.label, _num(c.a, c.unit), _num(c.b, c.unit), *_chg(c), c.unit]
                                 for c in res.metrics]))
    if res.requests:
        sections.append(("Requests (every finished request)",
                         [[c.label, _num(c.a, c.unit), _num(c.b, c.unit), *_chg(c), c.unit]
                          for c in res.requests]))
    sections.append(("Kernel time by category (share %)",
                     [[c.label, _num(c.a), _num(c.b), *_chg(c), "%"] for c in res.categories]))
    sections.append(("Top kernels (µs per token)",
                     [[f"{c.label} [{c.category}]", _num(c.a, c.unit), _num(c.b, c.unit), *_chg(c),
                       c.unit] for c in res.kernels]))
    return sections


def render_text(res: DiffResult, markdown: bool = False, name_width: int = 48) -> str:
    """Plain-text (aligned) or markdown tables of a diff."""
    a = f"{res.a.label} ({res.a.mode})"
    b = f"{res.b.label} ({res.b.mode})"
    head = ["", a, b, "change", "%", "unit"]
    out: list[str] = []
    for title, rows in _rows(res):
        if markdown:
            out += [f"### {title}", "", "| " + " | ".join(_md(h) for h in head) + " |",
                    "|" + "|".join(["---"] + ["---:"] * 4 + ["---"]) + "|"]
            out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in rows]
        else:
            rows = [[r[0] if len(r[0]) <= name_width else r[0][: name_width - 1] + "…", *r[1:]]
                    for r in rows]
            widths = [max(len(x[i]) for x in rows + [head]) for i in range(len(head))]
            out.append(title)
            out.append("  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i])
                                 for i, h in enumerate(head)).rstrip())
            for r in rows:
                out.append("  ".join(c.ljust(widths[0]) if i == 0 else
                                     (c.ljust(widths[i]) if i == 5 else c.rjust(widths[i]))
                                     for i, c in enumerate(r)).rstrip())
        out.append("")
    return "\n".join(out)


_MD_SPECIAL = re.compile(r"([\\`*_<>\[\]|])")


def _md(cell: str) -> str:
    """A markdown table cell: a name's ``|``, ``<`` (an HTML tag), ``*`` or ``[`` is text."""
    return _MD_SPECIAL.sub(r"\\\1", cell)


def render_rich(res: DiffResult) -> Any:
    """A rich renderable (``rich.console.Group`` of tables) of a diff."""
    from rich.console import Group  # noqa: PLC0415 - rich only when rendering
    from rich.table import Table
    from rich.text import Text

    tables = []
    for title, rows in _rows(res):
        t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        t.add_column("", overflow="ellipsis", max_width=60, no_wrap=True)
        t.add_column(Text(f"{res.a.label} ({res.a.mode})"), justify="right")
        t.add_column(Text(f"{res.b.label} ({res.b.mode})"), justify="right")
        t.add_column("change", justify="right")
        t.add_column("%", justify="right")
        t.add_column("unit")
        for r in rows:
            style = ""
            if r[4].startswith("-"):
                style = "green" if title.startswith("Top") or "ms" in r[5] else ""
            t.add_row(*(Text(c) for c in r), style=style or None)
        tables.append(t)
    return Group(*tables)
