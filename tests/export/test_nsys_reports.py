"""nsys-style report CSVs against values computed here from the fixture files."""
from __future__ import annotations

import errno
import os

import pytest

from tuiprof.errors import TuiprofError
from tuiprof.export import nsys_reports as nr
from tuiprof.export.nsys_format import Report, round1, to_column, to_csv

from ._independent import (kernel_groups, mem_groups, parse_nsys_csv, round_half_away,
                           stats_row, token_windows)

KERN_HEADER = "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name"


def _check_time_rows(rows: list[list[str]], groups: dict[str, list[int]], name_col: int = -1):
    grand = sum(sum(v) for v in groups.values())
    assert sorted(r[name_col] for r in rows) == sorted(groups)
    for r in rows:
        s = stats_row(groups[r[name_col]])
        assert r[1] == str(s["total"]) and r[2] == str(s["count"])
        assert float(r[3]) == s["avg"] and float(r[4]) == s["med"]
        assert r[5] == str(s["min"]) and r[6] == str(s["max"])
        assert float(r[7]) == s["std"], (r[-1][:60], r[7], s["std"])
        assert float(r[0]) == round_half_away(100.0 * s["total"] / grand)
        for cell in r[3], r[4], r[7], r[0]:   # one decimal, always printed
            assert "." in cell and len(cell.split(".")[1]) == 1


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_kern_sum_whole_session(which, request):
    view = request.getfixturevalue(f"{which}_view")
    raw = request.getfixturevalue(f"{which}_raw")
    text = to_csv(nr.kern_sum(view))
    header, rows = parse_nsys_csv(text)
    assert header == KERN_HEADER
    groups = kernel_groups(raw)
    _check_time_rows(rows, groups)
    # ORDER BY total DESC, instances, name
    keys = [(-int(r[1]), int(r[2]), r[-1]) for r in rows]
    assert keys == sorted(keys)
    assert sum(int(r[2]) for r in rows) == sum(1 for r in raw["records"] if r[0] == "K")


def test_kern_sum_quotes_names_with_commas(eager_view):
    text = to_csv(nr.kern_sum(eager_view))
    comma_names = [n for n in kernel_groups_names(text) if "," in n]
    assert len(comma_names) >= 5  # several demangled PyTorch names hold commas
    for line in text.splitlines()[1:]:
        fields = line.split(",", 8)
        name = fields[8]
        if "," in name:
            assert name.startswith('"') and name.endswith('"')
        else:
            assert '"' not in name
    # quotes inside a name doubled (unlike nsys), so that a CSV reader gets one cell back
    rep = Report("x", "X", ["Name"], ["str"], [['k "q", x'], ["plain"], ['a"b']])
    assert to_csv(rep) == 'Name\n"k ""q"", x"\nplain\n"a""b"\n'


def kernel_groups_names(text: str) -> list[str]:
    return [r[-1] for r in parse_nsys_csv(text)[1]]


@pytest.mark.parametrize("which", ["eager", "compiled"])
def test_mem_time_and_size(which, request):
    view = request.getfixturevalue(f"{which}_view")
    raw = request.getfixturevalue(f"{which}_raw")
    header, rows = parse_nsys_csv(to_csv(nr.mem_time_sum(view)))
    assert header == ("Time (%),Total Time (ns),Count,Avg (ns),Med (ns),Min (ns),Max (ns),"
                      "StdDev (ns),Operation")
    _check_time_rows(rows, mem_groups(raw, "time"))
    assert [int(r[1]) for r in rows] == sorted((int(r[1]) for r in rows), reverse=True)

    header, rows = parse_nsys_csv(to_csv(nr.mem_size_sum(view)))
    assert header == "Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation"
    groups = mem_groups(raw, "size")
    assert sorted(r[-1] for r in rows) == sorted(groups)
    for r in rows:
        s = stats_row(groups[r[-1]])
        v = s["values"]
        assert r[0] == f"{sum(v) / 1e6:.3f}" and r[1] == str(len(v))
        assert r[2] == f"{sum(v) / len(v) / 1e6:.3f}"
        assert r[4] == f"{min(v) / 1e6:.3f}" and r[5] == f"{max(v) / 1e6:.3f}"
    totals = [sum(groups[r[-1]]) for r in rows]
    assert totals == sorted(totals, reverse=True)


def test_mb_formatting_of_known_sizes():
    rep = Report("m", "M", ["Total (MB)"], ["mb"], [[4 * 1024**2], [64 * 1024]])
    assert to_csv(rep).splitlines()[1:] == ["4.194", "0.066"]


def test_nvtx_sum(eager_view, eager_raw):
    header, rows = parse_nsys_csv(to_csv(nr.nvtx_sum(eager_view)))
    assert header == ("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),"
                      "StdDev (ns),Style,Range")
    wins = token_windows(eager_raw)
    groups = {":step": [e - s for _, s, e in wins],
              ":prefill": [e - s for p, s, e in wins if p == "prefill"],
              ":decode": [e - s for p, s, e in wins if p == "decode"]}
    _check_time_rows(rows, groups)
    assert all(r[8] == "PushPop" for r in rows)
    assert [r[-1] for r in rows] == [":step", ":decode", ":prefill"]


def test_api_sum_strips_version_suffix():
    from tuiprof.store import SessionStore

    st = SessionStore(ring_tokens=4)
    seq = st.begin_token("decode", "eager", 1000, 0)
    st.add_records([("R", "cudaLaunchKernel_v7000", 1100, 1110, 1),
                    ("R", "cudaLaunchKernel_v7000", 1200, 1230, 2),
                    ("R", "cuMemAlloc_v2", 1300, 1400, 3),
                    ("R", "cudaGraphLaunch_v10000", 1500, 1501, 4)])
    st.end_token(seq, 2000, 0.001)
    for window in (False, True):
        rep = nr.build_reports(st.view(), window_only=window, names=["cuda_api_sum"])[0]
        header, rows = parse_nsys_csv(to_csv(rep))
        assert header.split(",")[2] == "Num Calls"
        # nsys drops a suffix only when the last 6 characters start with "_v" (substr(v,-6,2))
        assert [r[-1] for r in rows] == ["cuMemAlloc_v2", "cudaLaunchKernel",
                                         "cudaGraphLaunch_v10000"]
        assert rows[1][1:8] == ["40", "2", "20.0", "20.0", "10", "30", str(round1(14.142135623730951))]
        assert rows[0][0] == str(round_half_away(100 * 100 / 141))


def test_api_sum_skipped_without_api_records(no_api_view):
    assert nr.api_sum(no_api_view).skipped
    assert "SKIPPED" in to_column(nr.api_sum(no_api_view))


def test_api_sum_counts_every_recorded_call(eager_view, eager_raw):
    rep = nr.api_sum(eager_view)
    assert not rep.skipped
    _, rows = parse_nsys_csv(to_csv(rep))
    calls = {}
    for r in eager_raw["records"]:
        if r[0] == "R":
            calls[r[1]] = calls.get(r[1], 0) + 1
    assert {row[-1]: int(row[2]) for row in rows} == calls


def test_window_equals_session_when_ring_holds_everything(eager_view):
    # conftest's eager_view keeps every token raw and no record falls outside a token
    for name in ("cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum", "nvtx_sum"):
        a = nr.build_reports(eager_view, False, [name])[0]
        b = nr.build_reports(eager_view, True, [name])[0]
        assert to_csv(a) == to_csv(b), name


def test_window_kern_sum_last_64_tokens(eager_view64, eager_raw):
    first_decode = [s for p, s, _ in token_windows(eager_raw) if p == "decode"][0]
    rep = nr.build_reports(eager_view64, True, ["cuda_gpu_kern_sum"])[0]
    _, rows = parse_nsys_csv(to_csv(rep))
    _check_time_rows(rows, kernel_groups(eager_raw, since=first_decode))


def test_gpu_trace_rows(compiled_view, compiled_raw):
    rep = nr.build_reports(compiled_view, True, ["cuda_gpu_trace"])[0]
    header, rows = parse_nsys_csv(to_csv(rep))
    assert header == ("Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,"
                      "StcSMem (MB),DymSMem (MB),Bytes (MB),Throughput (MB/s),SrcMemKd,DstMemKd,"
                      "Device,Ctx,GreenCtx,Strm,Name")
    t0 = min(m[2] for m in compiled_raw["marks"])   # the window starts at the prefill mark
    recs = [r for r in compiled_raw["records"] if r[0] in "KCS"]
    assert len(rows) == len(recs)
    starts = [int(r[0]) for r in rows]
    assert starts == sorted(starts)
    assert sorted(starts) == sorted((r[2] if r[0] in "KS" else r[3]) - t0 for r in recs)
    assert sorted(int(r[1]) for r in rows) == sorted(
        (r[3] - r[2]) if r[0] in "KS" else (r[4] - r[3]) for r in recs)
    k = next(r for r in rows if r[-1].startswith("nvjet"))
    assert k[16] == "NVIDIA H100 80GB HBM3 (0)" and k[19] == "7" and k[12] == ""
    c = next(r for r in rows if r[-1] == "[CUDA memcpy Device-to-Host]")
    first = min((r for r in recs if r[0] == "C" and r[1] == 2), key=lambda r: r[3])   # the first D2H
    nbytes, dur = first[2], int(c[1])
    assert dur == first[4] - first[3]
    assert c[12] == f"{nbytes / 1e6:.3f}"
    assert c[13] == f"{nbytes * (1_000_000_000 // dur) / 1e6:.3f}"  # SQLite integer division
    assert c[3] == "" and c[15] == "Unknown"


def test_column_format(eager_view, eager_raw):
    text = to_column(nr.kern_sum(eager_view))
    total, count = {}, {}
    for r in eager_raw["records"]:
        if r[0] == "K":
            total[r[1]] = total.get(r[1], 0) + r[3] - r[2]
            count[r[1]] = count.get(r[1], 0) + 1
    launches = count[max(total, key=total.get)]          # the first row: the most kernel time
    lines = text.splitlines()
    assert lines[0] == " ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):"
    assert set(lines[3].replace(" ", "")) == {"-"}
    assert f"{launches:,}" in text and max(len(ln) for ln in lines) < 260
    assert any(ln.endswith("…") for ln in lines)  # names clipped at 100 characters
    assert lines[2].lstrip().startswith("Time (%)  Total Time (ns)")


def test_write_nsys_reports(tmp_path, compiled_view):
    paths = nr.write_nsys_reports(compiled_view, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["tuiprof_cuda_api_sum.csv", "tuiprof_cuda_gpu_kern_sum.csv",
                     "tuiprof_cuda_gpu_mem_size_sum.csv", "tuiprof_cuda_gpu_mem_time_sum.csv",
                     "tuiprof_nvtx_sum.csv",
                     "tuiprof_reports.txt"]
    wpaths = nr.write_nsys_reports(compiled_view, tmp_path, window_only=True)
    assert (tmp_path / "tuiprof_window_cuda_gpu_trace.csv") in wpaths
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_unwritable_directory_is_one_line_error(tmp_path, compiled_view):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TuiprofError) as ei:
        nr.write_nsys_reports(compiled_view, blocker / "sub")
    assert "\n" not in str(ei.value) and "cannot write" in str(ei.value)


def test_full_disk_leaves_nothing_half_written(tmp_path, compiled_view, monkeypatch):
    target = tmp_path / "tuiprof_cuda_gpu_kern_sum.csv"
    target.write_text("old\n")

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(TuiprofError, match="disk is full"):
        nr.write_nsys_reports(compiled_view, tmp_path)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuiprof_cuda_gpu_kern_sum.csv"]
