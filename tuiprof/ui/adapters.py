"""The UI's calls into :mod:`tuiprof.analysis` and :mod:`tuiprof.export`, guarded.

A pane refreshes several times a second on the UI thread, and findings and exports run in
workers: a bug in an analysis function must show as a one-line message in its pane, not take
the app down. Every function here is pure or thread-safe and never imports Textual.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from ..analysis import batch as _batch
from ..analysis import cross_rank as _cross_rank
from ..analysis import findings as _findings
from ..analysis.kernels import KernelInfo, kernel_info
from ..export import diff as _diff
from ..export import registry as _exports
from ..export import snapshot as _snapshot
from ..store.rank_set import jobs
from ..text import printable
from .format import config_label



@lru_cache(maxsize=4096)
def kernel_name(raw: str) -> KernelInfo:
    """Classify a raw (mangled) kernel name; cached, so it is cheap on every refresh. The
    fields a pane shows are made printable (the raw name stays exact: it is the row's key)."""
    try:
        k = kernel_info(raw)
    except Exception:  # an unparsable name stays readable as it is
        k = KernelInfo(raw, raw, raw[:60], "?", "?")
    return dataclasses.replace(k, demangled=printable(k.demangled), short=printable(k.short),
                               library=printable(k.library), category=printable(k.category))


# ------------------------------------------------------------------ findings
def findings(view: Any) -> tuple[list, str]:
    """``(findings, message)``; message is "" on success, else why there are none."""
    try:
        return list(_findings.find(view) or []), ""
    except Exception as exc:  # a bug in analysis must not take the UI down
        return [], printable(f"analysis failed: {type(exc).__name__}: {exc}", 200)


def ranks_summary(ranks: Any) -> Any | None:
    """The cross-rank summary of a RanksView, or None when it fails."""
    try:
        return _cross_rank.ranks_summary(ranks)
    except Exception:
        return None


def rank_findings(ranks: Any) -> tuple[list, Any]:
    """Cross-rank findings and the summary they come from; a summary whose findings failed
    comes with none, and ``([], None)`` when the summary itself fails (a bug in analysis must
    not take the UI down, nor hide the split the summary has)."""
    try:
        summary = _cross_rank.ranks_summary(ranks)
    except Exception:
        return [], None
    try:
        return list(_cross_rank.find_ranks(ranks, summary)), summary
    except Exception:
        return [], summary


def comm_split(summary: Any, rank: int) -> dict | None:
    """The kernels pane's NCCL split of ``rank`` (``cross_rank.comm_split``), or None."""
    if summary is None:
        return None
    try:
        return _cross_rank.comm_split(summary, rank)
    except Exception:
        return None


def rank_help() -> str:
    """The one line that defines the cross-rank words (``cross_rank.HELP_LINE``)."""
    return _cross_rank.HELP_LINE


def job_findings(ranks: Any) -> list[tuple[str, Any, list, Any]]:
    """Per torch.distributed job among a session's processes: ``(job, its RanksView, its
    cross-rank findings, their summary)`` (``[]`` when the analysis fails)."""
    try:
        out = []
        for key, rv in jobs(ranks):
            found, summary = rank_findings(rv)
            out.append((key, rv, found, summary))
        return out
    except Exception:
        return []


def diff_configs(view: Any, a: tuple, b: tuple) -> Any | None:
    """The diff of two configurations ``(batch, mode)`` of one session, or ``None``."""
    try:
        return _diff.diff(view.select(a[0]), view.select(b[0]), a[1], b[1],
                          labels=(config_label(a[0]), config_label(b[0])))
    except Exception:
        return None


def config_summaries(view: Any) -> list:
    """MBU, MFU and class per configuration, ``[]`` when the analysis fails."""
    try:
        return list(_batch.config_summaries(view))
    except Exception:
        return []


def render_diff(result: Any) -> Any | None:
    """A Rich renderable of a diff result, or ``None``."""
    if result is None:
        return None
    try:
        return _diff.render_rich(result)
    except Exception:
        return None


# ------------------------------------------------------------------ exports
def export(name: str, view: Any, path) -> Any:
    """Write export ``name`` (a row of :data:`tuiprof.export.registry.EXPORTS`) of ``view``."""
    return _exports.write(name, view, path)


def read_snapshot(path) -> Any:
    return _snapshot.read_snapshot(path)
