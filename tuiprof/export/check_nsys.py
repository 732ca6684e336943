"""Compare ``nsys stats`` run on tuiprof's SQLite export with tuiprof's own window CSVs.

Run on a machine with Nsight Systems (or the ``nsys`` inside Nsight Compute)::

    python -m tuiprof.export.check_nsys --nsys /path/to/nsys --recording tests/data/qwen3-0.6b_eager_decode64.json.gz
    python -m tuiprof.export.check_nsys --nsys nsys --sqlite out/tuiprof.sqlite --csv-dir out

The first form replays a recording, writes ``tuiprof.sqlite`` and the ``tuiprof_window_*``
CSVs into ``--out`` (default: a temp dir) and compares; the second compares existing files.
Per report and name it checks the instance count and the total, and says whether the whole
row is identical. Exit status 0 when names, instances and totals all agree.
"""
from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuiprofError

CHECK_REPORTS = ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum",
                 "cuda_gpu_trace", "nvtx_sum", "cuda_api_sum")
# report -> (name column, count column or None (count rows), total column)
_KEYS = {
    "cuda_gpu_kern_sum": ("Name", "Instances", "Total Time (ns)"),
    "cuda_gpu_mem_time_sum": ("Operation", "Count", "Total Time (ns)"),
    "cuda_gpu_mem_size_sum": ("Operation", "Count", "Total (MB)"),
    "cuda_gpu_trace": ("Name", None, "Duration (ns)"),
    "nvtx_sum": ("Range", "Instances", "Total Time (ns)"),
    "cuda_api_sum": ("Name", "Num Calls", "Total Time (ns)"),
}


# what nsys prints on stdout besides a report (a report's CSV captured from stdout holds them)
NSYS_NOISE = ("Processing [", "NOTICE", "SKIPPED", "Generating SQLite file")


def read_nsys_csv(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """Parse a report's CSV, tuiprof's or nsys's. tuiprof writes it with the ``csv`` module (a
    quote inside a cell doubled); nsys quotes only a last column that holds commas and never
    doubles inner quotes. A line is read the ``csv`` way when that gives the header's number
    of cells and writing them back gives the line again, else nsys's way. nsys's own lines
    before the report are skipped."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    lines = [ln for ln in lines if ln.strip() and not ln.startswith(NSYS_NOISE)]
    while lines and lines[0][:1].isspace():  # a notice's indented lines, before the header
        del lines[0]
    if not lines:
        return [], []
    header = _csv_line(lines[0], None) or lines[0].split(",")
    rows = []
    for ln in lines[1:]:
        cells = _csv_line(ln, len(header)) or _nsys_line(ln, len(header))
        if cells is not None:
            rows.append(cells)
    return header, rows


def _csv_line(line: str, n: int | None) -> list[str] | None:
    """``line`` as the ``csv`` module wrote it (None: it was not, or has not ``n`` cells)."""
    try:
        cells = next(csv.reader([line]))
    except (csv.Error, StopIteration):
        return None
    if n is not None and len(cells) != n:
        return None
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    return cells if buf.getvalue() == line else None


def _nsys_line(line: str, n: int) -> list[str] | None:
    """nsys's dialect: only the last column may hold commas (then it is quoted, inner quotes
    as they are)."""
    cells = line.split(",", n - 1)
    if len(cells) != n:
        return None  # a name that spilled over a newline: not produced by tuiprof's data
    last = cells[-1]
    if len(last) >= 2 and last[0] == '"' and last[-1] == '"' and "," in last:
        cells[-1] = last[1:-1]
    return cells


@dataclass
class NameCheck:
    report: str
    name: str
    nsys_count: int | None
    tuiprof_count: int | None
    nsys_total: float | None
    tuiprof_total: float | None
    row_identical: bool

    @property
    def ok(self) -> bool:
        return (self.nsys_count == self.tuiprof_count and self.nsys_total is not None
                and self.tuiprof_total is not None
                and abs(self.nsys_total - self.tuiprof_total) <= 1e-9 * max(1.0, abs(self.nsys_total)))


@dataclass
class CheckResult:
    checks: list[NameCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def _group(report: str, header: list[str], rows: list[list[str]]) -> dict[str, tuple]:
    name_col, count_col, total_col = _KEYS[report]
    ni, ti = header.index(name_col), header.index(total_col)
    ci = header.index(count_col) if count_col else None
    out: dict[str, list] = {}
    for r in rows:
        g = out.setdefault(r[ni], [0, 0.0, []])
        g[0] += int(r[ci].replace(",", "")) if ci is not None else 1
        g[1] += float(r[ti].replace(",", ""))
        g[2].append(tuple(r))
    return {k: (v[0], v[1], sorted(v[2])) for k, v in out.items()}


def compare_report(report: str, nsys_csv: Path, tuiprof_csv: Path) -> list[NameCheck]:
    """Per-name comparison of one report's two CSV files."""
    hn, rn = read_nsys_csv(nsys_csv)
    ht, rt = read_nsys_csv(tuiprof_csv)
    if hn != ht:
        raise TuiprofError(f"{report}: header differs: nsys {hn} vs tuiprof {ht}")
    gn, gt = _group(report, hn, rn), _group(report, ht, rt)
    checks = []
    for name in sorted(set(gn) | set(gt)):
        a, b = gn.get(name), gt.get(name)
        checks.append(NameCheck(report, name, a[0] if a else None, b[0] if b else None,
                                a[1] if a else None, b[1] if b else None,
                                bool(a and b and a[2] == b[2])))
    return checks


def run_nsys_stats(nsys: str, sqlite: Path, out_dir: Path,
                   reports: tuple[str, ...] = CHECK_REPORTS) -> dict[str, Path]:
    """Run ``nsys stats --format csv`` for ``reports``; map report -> CSV written."""
    base = out_dir / "nsys"
    cmd = [nsys, "stats", "--quiet", "--format", "csv", "--report", ",".join(reports),
           "--output", str(base), "--force-overwrite", "true", str(sqlite)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TuiprofError(f"cannot run {nsys}: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TuiprofError(f"nsys stats failed ({proc.returncode}): {tail[0]}")
    found = {r: base.parent / f"{base.name}_{r}.csv" for r in reports}
    return {r: p for r, p in found.items() if p.exists()}


def check_nsys(nsys: str, sqlite: str | Path, csv_dir: str | Path,
               prefix: str = "tuiprof_window", out_dir: str | Path | None = None) -> CheckResult:
    """Run nsys on ``sqlite`` and compare with ``<csv_dir>/<prefix>_<report>.csv``."""
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="tuiprof-nsys-"))
    out.mkdir(parents=True, exist_ok=True)
    produced = run_nsys_stats(nsys, Path(sqlite), out)
    res = CheckResult()
    for report in CHECK_REPORTS:
        ours = Path(csv_dir) / f"{prefix}_{report}.csv"
        theirs = produced.get(report)
        if theirs is not None and not read_nsys_csv(theirs)[0]:
            theirs = None   # nsys leaves an empty file behind a SKIPPED report
        if theirs is None and not ours.exists():
            res.notes.append(f"{report}: neither nsys nor tuiprof has rows (SKIPPED)")
            continue
        if theirs is None or not ours.exists():
            res.notes.append(f"{report}: only {'tuiprof' if theirs is None else 'nsys'} wrote it")
            res.checks.append(NameCheck(report, "(report)", None, 0, None, None, False))
            continue
        res.checks.extend(compare_report(report, theirs, ours))
    res.notes.append(f"nsys CSVs in {out}")
    return res


def format_result(res: CheckResult, width: int = 60) -> str:
    """A small plain-text table: report, name, instances and totals side by side."""
    lines = [f"{'report':<22} {'name':<{width}} {'inst nsys':>9} {'tuiprof':>9} "
             f"{'total nsys':>16} {'tuiprof':>16} {'row':>4} ok"]
    for c in res.checks:
        name = c.name if len(c.name) <= width else c.name[: width - 1] + "…"
        fmt = lambda v: "-" if v is None else f"{v:,.3f}".rstrip("0").rstrip(".")  # noqa: E731
        lines.append(f"{c.report:<22} {name:<{width}} {fmt(c.nsys_count):>9} "
                     f"{fmt(c.tuiprof_count):>9} {fmt(c.nsys_total):>16} "
                     f"{fmt(c.tuiprof_total):>16} {'=' if c.row_identical else '≠':>4} "
                     f"{'yes' if c.ok else 'NO'}")
    lines += [f"note: {n}" for n in res.notes]
    lines.append("RESULT: " + ("names, instances and totals agree" if res.ok else "MISMATCH"))
    return "\n".join(lines)


def _export_from_recording(recording: str, out: Path) -> tuple[Path, Path]:
    from ..collect.replay import load_recording, replay_into
    from ..store import SessionStore
    from .nsys_reports import write_nsys_reports
    from .nsys_sqlite import write_nsys_sqlite

    rec = load_recording(recording)
    store = SessionStore(ring_tokens=max(64, len(rec.marks)))
    replay_into(rec, store)
    view = store.view()
    sqlite = write_nsys_sqlite(view, out / "tuiprof.sqlite")
    write_nsys_reports(view, out, window_only=True)
    return sqlite, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuiprof.export.check_nsys",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nsys", required=True, help="the nsys binary")
    ap.add_argument("--recording", help="replay this recording and export it first")
    ap.add_argument("--sqlite", help="an existing tuiprof .sqlite export")
    ap.add_argument("--csv-dir", help="directory with tuiprof_window_*.csv")
    ap.add_argument("--out", help="where to write exports and nsys CSVs")
    args = ap.parse_args(argv)
    try:
        out = Path(args.out or tempfile.mkdtemp(prefix="tuiprof-check-"))
        out.mkdir(parents=True, exist_ok=True)
        if args.recording:
            sqlite, csv_dir = _export_from_recording(args.recording, out)
        elif args.sqlite and args.csv_dir:
            sqlite, csv_dir = Path(args.sqlite), Path(args.csv_dir)
        else:
            ap.error("give --recording, or --sqlite and --csv-dir")
        res = check_nsys(args.nsys, sqlite, csv_dir, out_dir=out / "nsys")
    except TuiprofError as exc:
        print(f"tuiprof: {exc}", file=sys.stderr)
        return 2
    print(format_result(res))
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
