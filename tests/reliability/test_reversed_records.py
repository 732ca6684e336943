"""A record that ends before it starts (a corrupt buffer, a hand-edited recording or snapshot)
has no duration: it is left out and counted (``counters.ends_before_start``, the summary, the
export's line), never a negative time in an aggregate or an export (a kernel ending 1e12 ns
before its start gave -1e12 ns in every export)."""
from __future__ import annotations

import csv
import gzip
import json
import sqlite3

from tuiprof.cli import main


def _reverse(rec: dict) -> int:
    """End three kernels, a memcpy, a memset and an API call before they start."""
    want = {"K": 3, "C": 1, "S": 1, "R": 1}
    ends = {"K": (2, 3), "C": (3, 4), "S": (2, 3), "R": (2, 3)}
    n = 0
    for r in rec["records"]:
        k = r[0]
        if want.get(k):
            start, end = ends[k]
            r[end] = r[start] - 10**12
            want[k] -= 1
            n += 1
    return n


def _no_negative_duration(tmp_path, snap) -> None:
    out = {"trace": tmp_path / "t.json", "sqlite": tmp_path / "t.sqlite", "nsys": tmp_path / "n",
           "steps-csv": tmp_path / "steps.csv"}
    argv = ["export", str(snap)]
    for flag, path in out.items():
        argv += [f"--{flag}", str(path)]
    assert main(argv) == 0
    trace = json.loads(out["trace"].read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert min(e.get("dur", 0) for e in events) >= 0
    con = sqlite3.connect(out["sqlite"])
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        (least,) = con.execute(f"SELECT min(end - start) FROM {table}").fetchone()
        assert least is None or least >= 0, table
    con.close()
    for f in sorted(out["nsys"].glob("*.csv")):
        with open(f, newline="") as fh:
            rows = list(csv.reader(fh))
        for col, name in enumerate(rows[0]):
            if "(ns)" in name:
                vals = [float(r[col]) for r in rows[1:] if r[col] not in ("", "None")]
                assert not vals or min(vals) >= 0, (f.name, name)


def test_records_that_end_before_they_start_are_left_out_and_counted(tmp_path, capsys,
                                                                     compiled_path):
    rec = json.load(gzip.open(compiled_path))
    n = _reverse(rec)
    bad = tmp_path / "rev.json.gz"
    with gzip.open(bad, "wt") as fh:
        json.dump(rec, fh)
    snap = tmp_path / "rev.json"
    assert main(["replay", str(bad), "--headless", "--json", str(snap)]) == 0
    err = capsys.readouterr().err
    assert f"{n} records that end before they start were left out" in err, err
    doc = json.loads(snap.read_text())
    assert doc["counters"]["ends_before_start"] == n
    for section in ("kernels", "memcpy", "memset"):
        for item in doc[section]:
            stats = item["stats"] if section == "kernels" else item["ns"]
            assert stats["count"] == 0 or stats["min"] >= 0, (section, item)
    assert all(s["min"] >= 0 for s in doc["api"].values() if s["count"])
    assert all(t["kernel_ns"] >= 0 and t["busy_ns"] >= 0 for t in doc["tokens"])
    _no_negative_duration(tmp_path, snap)
    assert f"{n} records that end before they start are left out" in capsys.readouterr().err


def test_a_snapshots_reversed_raw_records_are_left_out_and_counted(tmp_path, capsys,
                                                                   compiled_path):
    snap = tmp_path / "good.json"
    assert main(["replay", str(compiled_path), "--headless", "--json", str(snap)]) == 0
    doc = json.loads(snap.read_text())
    kernels = [r for part in doc["raw"] for r in part["records"] if r[0] == "K"]
    assert len(kernels) > 2
    for r in kernels[:2]:
        r[3] = r[2] - 10**12
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    _no_negative_duration(tmp_path, bad)
    assert "2 records that end before they start are left out" in capsys.readouterr().err
