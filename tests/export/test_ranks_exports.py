"""Exports of a tensor-parallel session: one snapshot of every rank, nsys-style reports per
rank and combined (with nsys's Device column), one SQLite of all devices, one trace process
per rank."""
from __future__ import annotations

import csv
import json
import sqlite3

import pytest

from ranks_data import two_ranks

from tuiprof.export.nsys_reports import write_nsys_reports
from tuiprof.export.nsys_sqlite import write_nsys_sqlite
from tuiprof.export.snapshot import (RANKS_FORMAT, load_snapshot, read_any_snapshot,
                                     read_snapshot, write_snapshot)
from tuiprof.export.trace import trace_dict
from tuiprof.store.rank_set import RanksView


def test_a_snapshot_holds_every_rank_and_reads_back_byte_identical(tmp_path):
    rv = two_ranks()
    a = write_snapshot(rv, tmp_path / "a.json")
    doc = json.loads(a.read_text())
    assert doc["format"] == RANKS_FORMAT and len(doc["ranks"]) == 2
    assert doc["world"]["world_size"] == 2 and doc["world"]["clock"]["residual_ns"] == 0
    found = {f["id"]: f for f in doc["findings"]}
    assert set(found) == {"tp-late-rank", "tp-no-overlap"}
    # the exported numbers use the panes' words: transfer, wait, the late rank
    nums = found["tp-late-rank"]["numbers"]
    assert nums["late_rank"] == 1
    assert (nums["transfer_ms"], nums["others_wait_ms"]) == pytest.approx((0.9, 0.6))
    assert [r["meta"]["rank"] for r in doc["ranks"]] == [0, 1]
    back = read_any_snapshot(a)
    assert isinstance(back, RanksView) and back.world_size == 2
    assert [len(v.tokens) for v in back.views] == [12, 12]
    assert read_snapshot(a).meta["rank"] == 0            # one-view readers get rank 0
    assert load_snapshot(a).ranks is not None
    b = write_snapshot(back, tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()


def test_nsys_reports_per_rank_and_combined_with_the_device_column(tmp_path):
    rv = two_ranks()
    names = {p.name for p in write_nsys_reports(rv, tmp_path)}
    for prefix in ("rank0", "rank1", "all"):
        assert f"{prefix}_cuda_gpu_kern_sum.csv" in names
    assert "all_window_cuda_gpu_trace.csv" in names and "rank1_window_cuda_gpu_trace.csv" in names
    with open(tmp_path / "all_cuda_gpu_kern_sum.csv") as fh:
        rows = {r["Name"]: r for r in csv.DictReader(fh)}
    nccl = next(r for n, r in rows.items() if n.startswith("ncclDevKernel_AllReduce"))
    assert int(nccl["Instances"]) == 24                   # 12 steps on each of 2 GPUs
    assert int(nccl["Total Time (ns)"]) == 12 * (1_500_000 + 900_000)
    with open(tmp_path / "all_window_cuda_gpu_trace.csv") as fh:
        devices = {r["Device"] for r in csv.DictReader(fh)}
    assert devices == {"NVIDIA H200 (0)", "NVIDIA H200 (1)"}


def test_one_sqlite_holds_every_device(tmp_path):
    path = write_nsys_sqlite(two_ranks(), tmp_path / "tp.sqlite")
    con = sqlite3.connect(path)
    assert con.execute("SELECT id, name FROM TARGET_INFO_GPU ORDER BY id").fetchall() == [
        (0, "NVIDIA H200"), (1, "NVIDIA H200")]
    per_dev = dict(con.execute("SELECT deviceId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                               "GROUP BY deviceId").fetchall())
    assert per_dev == {0: 24, 1: 24}
    assert len(con.execute("SELECT * FROM PROCESSES").fetchall()) == 2
    # every kernel of a device belongs to that rank's process
    pids = con.execute("SELECT DISTINCT deviceId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    assert len(pids) == 2 and len({p for _, p in pids}) == 2


def test_the_trace_has_one_process_per_rank():
    doc = trace_dict(two_ranks())
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0 (GPU 0: NVIDIA H200)", 1: "rank 1 (GPU 1: NVIDIA H200)"}
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert {e["pid"] for e in kernels} == {0, 1} and len(kernels) == 48
    tokens = [e for e in doc["traceEvents"] if e.get("cat") == "token"]
    assert {e["pid"] for e in tokens} == {0, 1}
