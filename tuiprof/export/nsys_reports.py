"""nsys-style summary reports from a session: the CSVs ``nsys stats --format csv`` prints.

``cuda_gpu_kern_sum``, ``cuda_gpu_mem_time_sum``, ``cuda_gpu_mem_size_sum``, ``cuda_api_sum``
and ``nvtx_sum`` come either from the whole-session aggregates (merged across modes and
phases) or, with ``window_only=True``, from the raw records of the recorded window, which
adds the per-instance ``cuda_gpu_trace``. See docs/exports.md for how each column is made.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Callable, Sequence

from ..store import StoreView
from ..store.rank_set import RanksView, combined_view
from ..store.records import COPY_KINDS
from ._atomic import atomic_write_text, ensure_dir
from .names import demangle
from .nsys_format import (
    F1, INT, MB, STR, Report, Stat, merged, percent, round1, stat_of_running,
    stat_of_values, to_column, to_csv,
)
from .window import (MEMSET_NAME, Window, device_label, gc_paused, memcpy_name,
                     ranks_window, strip_api_version, window_of)

SUMMARY_REPORTS = ("nvtx_sum", "cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum",
                   "cuda_gpu_mem_size_sum")
TRACE_REPORT = "cuda_gpu_trace"
NVTX_DOMAIN = ""            # tuiprof's ranges are in the default domain: printed ":step"
NVTX_STYLE = "PushPop"
MEM_KIND_UNKNOWN = "Unknown"   # ENUM_CUDA_MEM_KIND 7: CUPTI memory kinds are not recorded

_TIME_COLS = ["Time (%)", "Total Time (ns)", "{count}", "Avg (ns)", "Med (ns)", "Min (ns)",
              "Max (ns)", "StdDev (ns)"]
_TIME_KINDS = [F1, INT, INT, F1, F1, INT, INT, F1]
TITLES = {
    "cuda_gpu_kern_sum": "CUDA GPU Kernel Summary",
    "cuda_gpu_mem_time_sum": "CUDA GPU MemOps Summary (by Time)",
    "cuda_gpu_mem_size_sum": "CUDA GPU MemOps Summary (by Size)",
    "cuda_api_sum": "CUDA API Summary",
    "nvtx_sum": "NVTX Range Summary",
    "cuda_gpu_trace": "CUDA GPU Trace",
}


def _time_report(name: str, count_label: str, tail: list[str],
                 groups: dict[tuple, Stat], order: Callable[[list], tuple]) -> Report:
    cols = [c.format(count=count_label) for c in _TIME_COLS] + tail
    rep = Report(name, TITLES[name], cols, _TIME_KINDS + [STR] * len(tail))
    grand = sum(s.total for s in groups.values())
    for key, s in groups.items():
        rep.rows.append([percent(s.total, grand), s.total, s.count, round1(s.avg), round1(s.med),
                         s.min, s.max, round1(s.std), *key])
    rep.rows.sort(key=order)
    return rep


def _by_total(row: list) -> tuple:
    return (-row[1], row[-1])


def _kern_order(row: list) -> tuple:
    return (-row[1], row[2], row[-1])  # ORDER BY total DESC, instances, name


# ------------------------------------------------------------------- per report
def kern_sum(view: StoreView, window: Window | None = None) -> Report:
    """cuda_gpu_kern_sum: one row per (demangled) kernel name."""
    groups: dict[tuple, Stat] = {}
    if window is None:
        by: dict[str, list] = defaultdict(list)
        for agg in view.kernels.values():
            by[demangle(agg.name)].append(agg.stats)
        groups = {(n,): stat_of_running(merged(ss)) for n, ss in by.items()}
    else:
        vals: dict[str, list[int]] = defaultdict(list)
        for op in window.ops:
            if op.kind == "K":
                vals[op.name].append(op.end - op.start)
        groups = {(n,): stat_of_values(v) for n, v in vals.items()}
    rep = _time_report("cuda_gpu_kern_sum", "Instances", ["Name"], groups, _kern_order)
    if not rep.rows:
        rep.skipped = "no CUDA kernel data"
    return rep


def _mem_groups(view: StoreView, window: Window | None, which: int) -> dict[tuple, Stat]:
    """which 0: durations, 1: bytes; keyed by nsys operation name."""
    if window is None:
        by: dict[str, list] = defaultdict(list)
        for (kind, _phase, _mode), pair in view.memcpy.items():
            by[memcpy_name(kind)].append(pair[which])
        for _key, pair in view.memset.items():
            by[MEMSET_NAME].append(pair[which])
        return {(n,): stat_of_running(merged(ss)) for n, ss in by.items()}
    vals: dict[str, list[int]] = defaultdict(list)
    for op in window.ops:
        if op.kind in ("C", "S"):
            vals[op.name].append(op.end - op.start if which == 0 else op.bytes or 0)
    return {(n,): stat_of_values(v) for n, v in vals.items()}


def mem_time_sum(view: StoreView, window: Window | None = None) -> Report:
    """cuda_gpu_mem_time_sum: memcpy per copy kind and memset, by time."""
    rep = _time_report("cuda_gpu_mem_time_sum", "Count", ["Operation"],
                       _mem_groups(view, window, 0), _by_total)
    if not rep.rows:
        rep.skipped = "no GPU memory data"
    return rep


def mem_size_sum(view: StoreView, window: Window | None = None) -> Report:
    """cuda_gpu_mem_size_sum: the same operations by bytes (printed in MB = 10**6 B)."""
    cols = ["Total (MB)", "Count", "Avg (MB)", "Med (MB)", "Min (MB)", "Max (MB)",
            "StdDev (MB)", "Operation"]
    rep = Report("cuda_gpu_mem_size_sum", TITLES["cuda_gpu_mem_size_sum"], cols,
                 [MB, INT, MB, MB, MB, MB, MB, STR])
    for (op,), s in _mem_groups(view, window, 1).items():
        rep.rows.append([s.total, s.count, s.avg, s.med, s.min, s.max, s.std, op])
    rep.rows.sort(key=lambda r: (-r[0], r[-1]))
    if not rep.rows:
        rep.skipped = "no GPU memory data"
    return rep


def api_sum(view: StoreView, window: Window | None = None) -> Report:
    """cuda_api_sum: runtime and driver calls by name (``_vNNNN`` suffix dropped)."""
    if window is None:
        by: dict[str, list] = defaultdict(list)
        for name, s in view.api.items():
            by[strip_api_version(name)].append(s)
        groups = {(n,): stat_of_running(merged(ss)) for n, ss in by.items()}
    else:
        vals: dict[str, list[int]] = defaultdict(list)
        for a in window.api:
            vals[strip_api_version(a.name)].append(a.end - a.start)
        groups = {(n,): stat_of_values(v) for n, v in vals.items()}
    rep = _time_report("cuda_api_sum", "Num Calls", ["Name"], groups, _by_total)
    if not rep.rows:
        rep.skipped = "no CUDA API data (tuiprof records API calls only when asked to)"
    return rep


def nvtx_range_name(name: str) -> str:
    """How nsys 2025.3 prints a range of tuiprof's: ``domain:name`` (``:step``)."""
    return f"{NVTX_DOMAIN}:{name}"


def nvtx_sum(view: StoreView, window: Window | None = None) -> Report:
    """nvtx_sum: tuiprof's own ``step``/``prefill``/``decode`` ranges."""
    if window is None:
        groups = {(NVTX_STYLE, nvtx_range_name(n)): stat_of_running(s)
                  for n, s in view.nvtx.items() if s.count}
    else:
        vals: dict[str, list[int]] = defaultdict(list)
        for name, start, end in window.ranges:
            vals[name].append(end - start)
        groups = {(NVTX_STYLE, nvtx_range_name(n)): stat_of_values(v) for n, v in vals.items()}
    rep = _time_report("nvtx_sum", "Instances", ["Style", "Range"], groups, _by_total)
    if not rep.rows:
        rep.skipped = "no NVTX data"
    return rep


TRACE_COLUMNS = ["Start (ns)", "Duration (ns)", "CorrId", "GrdX", "GrdY", "GrdZ", "BlkX", "BlkY",
                 "BlkZ", "Reg/Trd", "StcSMem (MB)", "DymSMem (MB)", "Bytes (MB)",
                 "Throughput (MB/s)", "SrcMemKd", "DstMemKd", "Device", "Ctx", "GreenCtx",
                 "Strm", "Name"]
TRACE_KINDS = [INT, INT, INT, INT, INT, INT, INT, INT, INT, INT, MB, MB, MB, MB, STR, STR, STR,
               INT, INT, INT, STR]


CONTEXT_ID = 1


def gpu_trace(view: StoreView, window: Window) -> Report:
    """cuda_gpu_trace: every kernel, memcpy and memset of the window, by start time.

    A memcpy/memset whose record has no stream (the first H100 recordings) has streamId 0 in the
    SQLite export, which nsys 2025.3.1 prints as an empty ``Strm``; so does this CSV.
    """
    rep = Report(TRACE_REPORT, TITLES[TRACE_REPORT], list(TRACE_COLUMNS), list(TRACE_KINDS))
    own = device_label(view)
    t0 = window.t0
    for op in window.ops:
        dev = own if op.device is None else window.devices.get(op.device, own)
        dur = op.end - op.start
        if op.kind == "K":
            rep.rows.append([op.start - t0, dur, op.corr, *op.grid, *op.block, op.regs,
                             op.smem, 0, None, None, None, None, dev, CONTEXT_ID, None,
                             op.stream, op.name])
        else:
            thru = op.bytes * (1_000_000_000 // dur) if dur > 0 else None
            dst = MEM_KIND_UNKNOWN if op.kind == "C" else None
            rep.rows.append([op.start - t0, dur, op.corr, None, None, None, None, None, None,
                             None, None, None, op.bytes, thru, MEM_KIND_UNKNOWN, dst, dev,
                             CONTEXT_ID, None, op.stream or None, op.name])
    if not rep.rows:
        rep.skipped = "no CUDA kernel or memory data"
    return rep


_BUILDERS = {"nvtx_sum": nvtx_sum, "cuda_api_sum": api_sum, "cuda_gpu_kern_sum": kern_sum,
             "cuda_gpu_mem_time_sum": mem_time_sum, "cuda_gpu_mem_size_sum": mem_size_sum}


def build_reports(view: StoreView, window_only: bool = False,
                  names: Sequence[str] | None = None, window: Window | None = None) -> list[Report]:
    """The reports in nsys's default order (plus ``cuda_gpu_trace`` for the window).

    ``window``: the window to report on instead of ``view``'s (several ranks)."""
    if window_only and window is None:
        window = window_of(view)
    elif not window_only:
        window = None
    wanted = list(names) if names else list(SUMMARY_REPORTS) + ([TRACE_REPORT] if window_only else [])
    out = []
    with gc_paused():
        _build(view, window, wanted, out)
    return out


def _build(view: StoreView, window: Window | None, wanted: list[str], out: list) -> None:
    for n in wanted:
        if n == TRACE_REPORT:
            out.append(gpu_trace(view, window if window is not None else window_of(view)))
        elif n in _BUILDERS:
            out.append(_BUILDERS[n](view, window))
        else:
            raise ValueError(f"unknown report {n!r}; known: {', '.join(list(_BUILDERS) + [TRACE_REPORT])}")


def format_reports(view: StoreView, window_only: bool = False, colmax: int = 100) -> str:
    """All reports as aligned console tables (nsys's ``column`` format)."""
    return "\n".join(to_column(r, colmax) for r in build_reports(view, window_only))


MANIFEST = "tuiprof_export.json"   # the files of the last export into a directory
MANIFEST_FORMAT = "tuiprof-export"
# tuiprof's names in a directory without a manifest (an export by an older tuiprof)
_OLD_NAMES = re.compile(r"^tuiprof(_window)?_(reports\.txt|(%s)\.csv)$"
                        % "|".join(SUMMARY_REPORTS + (TRACE_REPORT,)))


def write_nsys_reports(view: StoreView | RanksView, directory: str | Path,
                       window_only: bool = False, prefix: str | None = None, text: bool = True,
                       window: Window | None = None) -> list[Path]:
    """Write ``<prefix>_<report>.csv`` for every report with rows (nsys skips empty ones).

    ``prefix`` defaults to ``tuiprof`` (whole session) or ``tuiprof_window`` (recorded
    window, which also writes ``cuda_gpu_trace``). With ``text`` the console tables go to
    ``<prefix>_reports.txt``. Returns the paths written. A :class:`RanksView` writes every
    rank's reports and the combined ones (:func:`write_rank_reports`).

    An export is a complete set: the files of an earlier export into the same directory
    (listed in its ``tuiprof_export.json``) that this one does not write are removed, so a
    directory never mixes two sessions' reports; files that are not tuiprof's are never
    touched (see :func:`replace_set`).
    """
    d = ensure_dir(directory)
    if isinstance(view, RanksView):
        paths = write_rank_reports(view, d, text=text)
    else:
        paths = _write_reports(view, d, window_only, prefix, text, window)
    return replace_set(d, paths)


def replace_set(directory: Path, paths: list[Path]) -> list[Path]:
    """Make ``paths`` (just written) the directory's whole set of tuiprof reports: remove the
    earlier export's files that were not written again, then list the new set in the manifest.
    An earlier export's files are those its manifest names, or, without a manifest (tuiprof
    before manifests), the files named ``tuiprof_<report>.csv``, ``tuiprof_window_<report>.csv``
    and ``tuiprof[_window]_reports.txt``."""
    names = {p.name for p in paths}
    old = _previous_set(directory)
    for name in sorted(old - names):
        p = directory / name
        if p.parent == directory and p.is_file() and not p.is_symlink():
            try:
                p.unlink()
            except OSError:   # stays; the manifest no longer claims it
                pass
    atomic_write_text(directory / MANIFEST, json.dumps(
        {"format": MANIFEST_FORMAT, "files": sorted(names)}, indent=1) + "\n")
    return paths


def _previous_set(directory: Path) -> set[str]:
    try:
        doc = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {p.name for p in directory.iterdir() if _OLD_NAMES.match(p.name)}
    except (OSError, ValueError):
        return set()
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT \
        else None
    # only plain names of report files: a manifest edited by hand cannot point elsewhere
    return {f for f in files if isinstance(f, str) and _REPORT_NAME.match(f)} \
        if isinstance(files, list) else set()


_REPORT_NAME = re.compile(r"^[A-Za-z0-9_]+_(reports\.txt|(%s)\.csv)$"
                          % "|".join(SUMMARY_REPORTS + (TRACE_REPORT,)))


def _write_reports(view: StoreView, d: Path, window_only: bool = False,
                   prefix: str | None = None, text: bool = True,
                   window: Window | None = None) -> list[Path]:
    """One view's reports into ``d`` (no manifest: see :func:`write_nsys_reports`)."""
    prefix = prefix or ("tuiprof_window" if window_only else "tuiprof")
    reports = build_reports(view, window_only, window=window)
    paths = []
    for rep in reports:
        if rep.skipped:
            continue
        paths.append(atomic_write_text(d / f"{prefix}_{rep.name}.csv", to_csv(rep)))
    if text:
        body = "\n".join(to_column(r) for r in reports if r.name != TRACE_REPORT)
        paths.append(atomic_write_text(d / f"{prefix}_reports.txt", body))
    return paths


def write_rank_reports(rv: RanksView, directory: str | Path, text: bool = True) -> list[Path]:
    """Reports of a multi-rank session: ``rank<r>_*`` and ``rank<r>_window_*`` per rank, and
    ``all_*`` / ``all_window_*`` over every rank: the summaries merge the ranks' aggregates
    (as ``nsys stats`` sums the devices of one report) and ``all_window_cuda_gpu_trace`` lists
    every rank's instances on the aligned timeline with nsys's ``Device`` column."""
    d = ensure_dir(directory)
    paths: list[Path] = []
    for r, view in enumerate(rv.views):
        paths += _write_reports(view, d, prefix=f"rank{r}", text=text)
        paths += _write_reports(view, d, window_only=True, prefix=f"rank{r}_window", text=text)
    merged = combined_view(rv)
    paths += _write_reports(merged, d, prefix="all", text=text)
    paths += _write_reports(merged, d, window_only=True, prefix="all_window", text=text,
                            window=ranks_window(rv))
    return paths


__all__ = ["build_reports", "write_nsys_reports", "write_rank_reports", "format_reports", "kern_sum", "mem_time_sum",
           "mem_size_sum", "api_sum", "nvtx_sum", "gpu_trace", "SUMMARY_REPORTS", "TRACE_REPORT",
           "COPY_KINDS"]
