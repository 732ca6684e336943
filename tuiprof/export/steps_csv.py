"""Every step as one CSV row: the per-step timeline for a spreadsheet, pandas or a plot.

One row per step the session still holds (the store keeps the last ``series_len`` steps of
every configuration; aggregates keep the rest), oldest first, with what the step is (phase,
mode, batch configuration, whether it was traced and whether it ran beside a compile or
re-recorded CUDA graphs) and its times. A session of several ranks gets a ``rank`` column and
every rank's rows. Every cell is a number or one of tuiprof's own words (phase, mode,
configuration), so no cell carries text from a program.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from ..store.rank_set import RanksView
from ..text import csv_cell
from ._atomic import atomic_write_text

COLUMNS = ("seq", "config", "phase", "mode", "batch", "positions", "start_ns", "end_ns",
           "host_ms", "gpu_ms", "traced", "kernels", "kernel_ms", "busy_ms", "compiling",
           "rerecord", "untraced", "requests", "prefill_tokens", "decode_tokens", "pending",
           "kv_used", "kv_total")


def rows(view: Any) -> list[dict]:
    """The steps of ``view`` (every configuration), as dicts of :data:`COLUMNS`."""
    out = []
    for t in (view.timeline or view.tokens):
        if not t.done:
            continue
        traced = bool(t.sampled and t.kernels)
        out.append({
            # a snapshot read back may hold any words here: never a formula or an escape
            "seq": t.seq, "config": _text(t.config), "phase": _text(t.phase),
            "mode": _text(t.mode),
            "batch": t.batch, "positions": t.positions, "start_ns": t.start_ns,
            "end_ns": t.end_ns, "host_ms": round(t.host_ms, 4),
            "gpu_ms": "" if t.gpu_ms is None else round(t.gpu_ms, 4),
            "traced": int(traced), "kernels": t.kernels if traced else "",
            "kernel_ms": round(t.kernel_ns / 1e6, 4) if traced else "",
            "busy_ms": round(t.busy_ns / 1e6, 4) if traced else "",
            "compiling": int(t.compiling), "rerecord": int(t.rerecord),
            # run with CUPTI finalized or absent: the reference for what tracing costs
            "untraced": "" if t.attached is None else int(t.attached is False),
            # a server's step: how many requests (not their ids: a program's text), its mix
            "requests": len(t.requests), "prefill_tokens": t.prefill_tokens,
            "decode_tokens": t.decode_tokens, "pending": t.pending, "kv_used": t.kv_used,
            "kv_total": t.kv_total,
        })
    return out


def _text(value: Any) -> Any:
    return csv_cell(value) if isinstance(value, str) else value


def write_steps_csv(view: Any, path: str | Path) -> Path:
    """Write the steps of ``view`` (a StoreView, or every rank of a RanksView) to ``path``."""
    buf = io.StringIO()
    ranks = isinstance(view, RanksView)
    w = csv.DictWriter(buf, fieldnames=(("rank",) if ranks else ()) + COLUMNS,
                       lineterminator="\n")
    w.writeheader()
    for r, v in enumerate(view.views if ranks else (view,)):
        for row in rows(v):
            w.writerow({"rank": r, **row} if ranks else row)
    return atomic_write_text(Path(path), buf.getvalue())
