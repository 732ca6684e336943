"""Runs lost at the edges, and arguments accepted silently: each case failed before the fix.

* an export into a directory that holds another session's export replaces the whole set;
* output paths are checked before a run starts (missing directory, read-only file system, an
  existing directory) and a path that fails at the end falls back to a named location;
* negative or zero counts are refused, ``--max-new-tokens`` past the cache says it is capped,
  ``--tp`` beyond the model's KV heads is refused in under a second, leaving no file;
* a program that ends its process itself (``os._exit``), is killed or crashes loses nothing:
  the snapshot, the summary and its output in the log;
* the second Ctrl-C stops a program that ignores SIGINT; exit codes are 128 + the signal.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from tuiprof.cli import main
from tuiprof.export.snapshot import dumps, read_snapshot, snapshot_dict


@pytest.fixture(scope="module")
def small_doc(eager_path) -> dict:
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore

    store = SessionStore(ring_tokens=4)
    replay_into(load_recording(eager_path), store)
    return snapshot_dict(store.view(), findings=[])


# ------------------------------------------------------------------ exports are complete sets
def test_an_export_replaces_the_other_sessions_set_and_nothing_else(small_doc, tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(small_doc))
    no_mem = copy.deepcopy(small_doc)      # a session without kernel or memory records
    for key in ("kernels", "memcpy", "memset"):
        no_mem[key] = []
    b.write_bytes(dumps(no_mem))
    out = tmp_path / "nsys"
    out.mkdir()
    mine = {"notes.csv": "mine\n", "all_cuda_gpu_kern_sum.csv": "from nsys stats -o all\n",
            "tuiprof_notes.txt": "mine too\n"}
    for name, text in mine.items():
        (out / name).write_text(text)
    assert main(["export", str(a), "--nsys", str(out)]) == 0
    first = {p.name for p in out.iterdir()} - set(mine)
    assert "tuiprof_cuda_gpu_kern_sum.csv" in first and "tuiprof_cuda_gpu_mem_time_sum.csv" in first
    assert main(["export", str(b), "--nsys", str(out)]) == 0
    second = {p.name for p in out.iterdir()} - set(mine)
    # only b's files: a's kern_sum and mem_* CSVs are gone, not left beside b's
    assert second == {"tuiprof_nvtx_sum.csv", "tuiprof_reports.txt", "tuiprof_export.json"}
    assert {n: (out / n).read_text() for n in mine} == mine       # not tuiprof's: untouched
    manifest = json.loads((out / "tuiprof_export.json").read_text())
    assert manifest["files"] == ["tuiprof_nvtx_sum.csv", "tuiprof_reports.txt"]
    capsys.readouterr()


def test_an_export_over_an_older_export_without_a_manifest(small_doc, tmp_path, capsys):
    a = tmp_path / "a.json"
    no_mem = copy.deepcopy(small_doc)
    no_mem["kernels"] = []
    a.write_bytes(dumps(no_mem))
    out = tmp_path / "nsys"
    out.mkdir()
    (out / "tuiprof_cuda_gpu_kern_sum.csv").write_text("an older tuiprof's\n")
    (out / "tuiprof_cuda_api_sum.csv").write_text("an older tuiprof's\n")
    assert main(["export", str(a), "--nsys", str(out)]) == 0
    assert not (out / "tuiprof_cuda_gpu_kern_sum.csv").exists()
    assert not (out / "tuiprof_cuda_api_sum.csv").exists()
    capsys.readouterr()
