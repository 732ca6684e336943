"""check_nsys: the CSV dialect parser and the comparison, with a stand-in for nsys."""
from __future__ import annotations

import stat
import sys
from pathlib import Path

from tuiprof.export import check_nsys as cn
from tuiprof.export.nsys_reports import write_nsys_reports


def test_parser_handles_nsys_quoting(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text('Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),'
                 'StdDev (ns),Name\n50.0,4500,3,1500.0,1500.0,1000,2000,500.0,'
                 '"void k1<int>(float *, int)"\n50.0,4500,3,1500.0,1500.0,1000,2000,500.0,k "q"\n')
    header, rows = cn.read_nsys_csv(p)
    assert header[-1] == "Name" and rows[0][-1] == "void k1<int>(float *, int)"
    assert rows[1][-1] == 'k "q"'


def test_parser_skips_what_nsys_prints_before_a_report_on_stdout(tmp_path):
    """``nsys stats --format csv REP.nsys-rep`` on stdout, as the H100 printed it (the SQLite
    file made first): the header is the report's, not nsys's first line."""
    p = tmp_path / "kern_sum.csv"
    p.write_text("Generating SQLite file /tmp/r.sqlite from /tmp/r.nsys-rep\n"
                 "Processing [/tmp/r.sqlite] with [/opt/nsys/reports/cuda_gpu_kern_sum.py]... \n"
                 "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),"
                 "StdDev (ns),Name\n"
                 "92.7,327916264,4608,71162.4,40737.0,39969,318567,86121.3,gemv_small_grid\n"
                 "2.8,9855118,1024,9624.1,8192.0,2368,22528,5108.8,attn_decode\n\n")
    header, rows = cn.read_nsys_csv(p)
    assert header[0] == "Time (%)" and header[-1] == "Name"
    assert [(r[-1], r[2]) for r in rows] == [("gemv_small_grid", "4608"), ("attn_decode", "1024")]


def test_parser_skips_an_existing_exports_notice(tmp_path):
    """The second report of one run, as the H100 printed it: nsys's notice about the SQLite
    file it found runs over indented lines before the header."""
    p = tmp_path / "gpu_trace.csv"
    p.write_text("\nNOTICE: Existing SQLite export found: /tmp/r.sqlite\n"
                 "        It is assumed file was previously exported from: /tmp/r.nsys-rep\n"
                 "        Consider using --force-export=true if needed.\n\n"
                 "Processing [/tmp/r.sqlite] with [/opt/nsys/reports/cuda_gpu_trace.py]... \n\n"
                 "Start (ns),Duration (ns),CorrId,Name\n"
                 "695428373,5697,135,fill_weights\n695451670,5504,137,fill_weights\n")
    header, rows = cn.read_nsys_csv(p)
    assert header == ["Start (ns)", "Duration (ns)", "CorrId", "Name"]
    assert [r[0] for r in rows] == ["695428373", "695451670"]


def test_check_against_fake_nsys(tmp_path, compiled_view):
    csv_dir = tmp_path / "tp"
    write_nsys_reports(compiled_view, csv_dir, window_only=True)
    fake = tmp_path / "nsys"
    # A stand-in that "runs" the reports by copying tuiprof's own CSVs to nsys's file names.
    fake.write_text(f"""#!{sys.executable}
import shutil, sys
args = sys.argv[1:]
reports = args[args.index("--report") + 1].split(",")
base = args[args.index("--output") + 1]
for r in reports:
    src = {str(csv_dir)!r} + "/tuiprof_window_" + r + ".csv"
    try:
        shutil.copy(src, base + "_" + r + ".csv")
    except FileNotFoundError:
        print("SKIPPED: " + r)
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    res = cn.check_nsys(str(fake), tmp_path / "unused.sqlite", csv_dir, out_dir=tmp_path / "o")
    assert res.ok and all(c.row_identical for c in res.checks)
    reports = {c.report for c in res.checks}
    assert {"cuda_gpu_kern_sum", "cuda_gpu_trace", "cuda_gpu_mem_time_sum"} <= reports
    table = cn.format_result(res)
    assert "RESULT: names, instances and totals agree" in table
    # a mismatch is reported
    kern = csv_dir / "tuiprof_window_cuda_gpu_kern_sum.csv"
    lines = kern.read_text().splitlines()
    kern.write_text("\n".join(lines[:-1]) + "\n")
    (tmp_path / "o" / "nsys_cuda_gpu_kern_sum.csv").unlink()
    res2 = cn.check_nsys(str(fake), tmp_path / "unused.sqlite", csv_dir, out_dir=tmp_path / "o")
    assert res2.ok  # both sides read the same (shortened) file
    assert cn.main(["--nsys", str(tmp_path / "missing-nsys"), "--sqlite", "x.sqlite",
                    "--csv-dir", str(csv_dir), "--out", str(tmp_path / "m")]) == 2


def test_compare_report_detects_differences(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    head = "Time (%),Total Time (ns),Count,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Operation\n"
    a.write_text(head + "100.0,10,2,5.0,5.0,4,6,1.4,[CUDA memset]\n")
    b.write_text(head + "100.0,10,3,3.3,4.0,2,4,1.2,[CUDA memset]\n")
    (c,) = cn.compare_report("cuda_gpu_mem_time_sum", a, b)
    assert not c.ok and c.nsys_count == 2 and c.tuiprof_count == 3 and not c.row_identical
