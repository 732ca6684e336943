"""Lazy, defensive access to :mod:`tuiprof.analysis` and :mod:`tuiprof.export`.

Both packages are optional from the UI's point of view: when one is missing (or its API is not
the one expected) the pane says "analysis not available" instead of failing. Every function
here is pure or thread-safe and never imports Textual.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from ..text import printable


def _get(module: str, name: str) -> Callable | None:
    try:
        mod = importlib.import_module(module)
    except Exception:  # ImportError, or a broken module being written right now
        return None
    fn = getattr(mod, name, None)
    return fn if callable(fn) else None


# ------------------------------------------------------------------ kernel names
@dataclass(frozen=True)
class KernelName:
    """What the UI shows about a kernel name (mirrors ``analysis.kernels.KernelInfo``)."""

    raw: str
    demangled: str
    short: str
    library: str
    category: str


_FALLBACK_LIBS = (
    ("cudnn", "cuDNN"), ("nvjet", "cuBLAS"), ("cublas", "cuBLAS"), ("gemm", "cuBLAS"),
    ("cutlass", "CUTLASS"), ("flash", "flash-attn"), ("triton", "Triton"), ("at::native", "ATen"), ("at6native", "ATen"),
    ("nccl", "NCCL"),
)


def _fallback_name(raw: str) -> KernelName:
    demangled = raw
    if raw.startswith("_Z"):
        try:
            import cxxfilt  # optional
            demangled = cxxfilt.demangle(raw)
        except Exception:
            demangled = raw
    low = raw.lower()
    lib = next((lib for key, lib in _FALLBACK_LIBS if key in low), "?")
    short = demangled.split("(")[0]
    short = re.sub(r"<.*", "", short)
    short = short.split("::")[-1] or demangled
    return _shown(KernelName(raw, demangled, short[:60], lib, "?"))


def _shown(k: KernelName) -> KernelName:
    """The fields a pane shows, made printable (the raw name stays exact: it is the key)."""
    return KernelName(k.raw, printable(k.demangled), printable(k.short), printable(k.library),
                      printable(k.category))


@lru_cache(maxsize=4096)
def kernel_name(raw: str) -> KernelName:
    """Classify a raw (mangled) kernel name; cached, so it is cheap on every refresh."""
    for mod, name in (("tuiprof.analysis.kernels", "kernel_info"), ("tuiprof.analysis", "kernel_info"),
                      ("tuiprof.analysis.kernels", "classify"), ("tuiprof.analysis", "classify")):
        fn = _get(mod, name)
        if fn is None:
            continue
        try:
            info = fn(raw)
            return _shown(KernelName(
                raw=str(getattr(info, "raw", raw) or raw),
                demangled=str(getattr(info, "demangled", raw) or raw),
                short=str(getattr(info, "short", raw) or raw),
                library=str(getattr(info, "library", "?") or "?"),
                category=str(getattr(info, "category", "?") or "?"),
            ))
        except Exception:
            break
    return _fallback_name(raw)


def analysis_available() -> bool:
    return _get("tuiprof.analysis.findings", "find") is not None or _get("tuiprof.analysis", "find") is not None


# ------------------------------------------------------------------ findings
def findings(view: Any) -> tuple[list, str]:
    """``(findings, message)``; message is "" on success, else why there are none."""
    fn = _get("tuiprof.analysis.findings", "find") or _get("tuiprof.analysis", "find")
    if fn is None:
        return [], "analysis not available"
    try:
        found = list(fn(view) or [])
    except Exception as exc:  # a bug in analysis must not take the UI down
        return [], printable(f"analysis failed: {type(exc).__name__}: {exc}", 200)
    return found, ""


def ranks_summary(ranks: Any) -> Any | None:
    """``analysis.ranks.ranks_summary`` of a RanksView, or None."""
    fn = _get("tuiprof.analysis.cross_rank", "ranks_summary")
    if fn is None:
        return None
    try:
        return fn(ranks)
    except Exception:
        return None


def rank_findings(ranks: Any) -> tuple[list, Any]:
    """Cross-rank findings and the summary they come from (``analysis.ranks``), or
    ``([], None)`` when the analysis is missing or fails."""
    summarize = _get("tuiprof.analysis.cross_rank", "ranks_summary")
    find = _get("tuiprof.analysis.cross_rank", "find_ranks")
    if summarize is None or find is None:
        return [], None
    try:
        summary = summarize(ranks)
        return list(find(ranks, summary)), summary
    except Exception:  # a bug in analysis must not take the UI down
        return [], None


def diff_modes(view: Any, a: str = "eager", b: str = "compiled") -> Any | None:
    """``export.diff_modes`` (or ``analysis.diff_modes``) if present; ``None`` otherwise."""
    fn = (_get("tuiprof.export.diff", "diff_modes") or _get("tuiprof.export", "diff_modes")
          or _get("tuiprof.analysis", "diff_modes"))
    if fn is None:
        return None
    try:
        return fn(view, a, b)
    except Exception:
        return None


def diff_configs(view: Any, a: tuple, b: tuple) -> Any | None:
    """``export.diff`` of two configurations ``(batch, mode)`` of one session, or ``None``."""
    fn = _get("tuiprof.export.diff", "diff")
    if fn is None:
        return None
    try:
        from .derive import config_label  # noqa: PLC0415
        return fn(view.select(a[0]), view.select(b[0]), a[1], b[1],
                  labels=(config_label(a[0]), config_label(b[0])))
    except Exception:
        return None


def config_summaries(view: Any) -> list:
    """``analysis.config_summaries`` (MBU, MFU, class per configuration), ``[]`` without it."""
    fn = _get("tuiprof.analysis.batch", "config_summaries")
    if fn is None:
        return []
    try:
        return list(fn(view))
    except Exception:
        return []


def render_diff(result: Any) -> Any | None:
    """A Rich renderable of a ``diff_modes`` result (``export.diff.render_rich``), or ``None``."""
    fn = _get("tuiprof.export.diff", "render_rich") or _get("tuiprof.export", "render_rich")
    if fn is None or result is None:
        return None
    try:
        return fn(result)
    except Exception:
        return None


# ------------------------------------------------------------------ exports
def write_snapshot(view: Any, path) -> Any:
    fn = _get("tuiprof.export.snapshot", "write_snapshot") or _get("tuiprof.export", "write_snapshot")
    if fn is None:
        raise RuntimeError("export not available (tuiprof.export.write_snapshot missing)")
    return fn(view, path)


def read_snapshot(path) -> Any:
    fn = _get("tuiprof.export.snapshot", "read_snapshot") or _get("tuiprof.export", "read_snapshot")
    if fn is None:
        raise RuntimeError("export not available (tuiprof.export.read_snapshot missing)")
    return fn(path)


def write_nsys_reports(view: Any, directory) -> Any:
    fn = (_get("tuiprof.export.nsys_reports", "write_nsys_reports")
          or _get("tuiprof.export", "write_nsys_reports") or _get("tuiprof.export.nsys", "write_nsys_reports"))
    if fn is None:
        raise RuntimeError("export not available (tuiprof.export.write_nsys_reports missing)")
    return fn(view, directory)
