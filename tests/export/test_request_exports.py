"""A server's requests in every export: the snapshot's top-level ``requests`` (read back
exactly, validated by the schema, reopened by ``tuiprof view``), the Perfetto trace's async
track per request, the nsys SQLite's request ranges, and ``tuiprof diff``'s TTFT/ITL."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from tuiprof.cli import main
from tuiprof.export.diff import diff, render_text
from tuiprof.export.nsys_sqlite import write_nsys_sqlite
from tuiprof.export.snapshot import read_snapshot, snapshot_dict, validate_snapshot, write_snapshot
from tuiprof.export.trace import trace_dict
from tuiprof.store import SessionStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from requests_data import serving_store  # noqa: E402


def test_the_snapshot_carries_the_requests_and_reads_them_back_exactly(tmp_path):
    view = serving_store().view()
    p = write_snapshot(view, tmp_path / "s.json")
    doc = json.loads(p.read_text())
    validate_snapshot(doc)
    reqs = {r["id"]: r for r in doc["requests"]}
    a = reqs["a"]
    assert (a["arrival_ns"], a["first_token_ns"], a["finish_ns"]) == (0, 30_000_000, 111_000_000)
    assert (a["queue_ms"], a["ttft_ms"], a["e2e_ms"], a["outside_ms"]) == (10.0, 30.0, 111.0, 13.0)
    assert a["itl_ms"]["count"] == 4 and a["itl_ms"]["max"] == 50.0
    assert a["prompt_tokens"] == 16 and a["output_tokens"] == 5
    assert reqs["d"]["status"] == "queued" and reqs["d"]["ttft_ms"] is None
    assert doc["request_stats"]["counts"]["finished"] == 2
    assert doc["tokens"][1]["requests"] == ["c", "a", "b"] and doc["tokens"][1]["prefills"] == 1
    back = read_snapshot(p)
    assert [r.id for r in back.requests.rows] == ["a", "b", "c", "d"]
    assert back.requests.get("a").itls_ms() == [50.0, 11.0, 10.0, 10.0]
    p2 = write_snapshot(back, tmp_path / "s2.json")
    assert p2.read_bytes() == p.read_bytes()


def test_a_session_without_requests_writes_no_request_sections():
    doc = snapshot_dict(SessionStore().view(), findings=[])
    assert "requests" not in doc and "request_stats" not in doc


def test_the_trace_has_an_async_track_per_request():
    view = serving_store().view()
    events = [e for e in trace_dict(view)["traceEvents"] if e.get("cat") == "request"]
    by = {}
    for e in events:
        by.setdefault(e["id"], []).append((e["ph"], e["name"], e["ts"]))
    assert sorted(by) == ["a", "b", "c", "d"]
    a = sorted(by["a"], key=lambda x: (x[2], x[0] == "b"))
    names = [n for ph, n, _ in by["a"] if ph == "b"]
    assert names == ["request", "queued", "prefill", "decode"]
    assert all(sum(1 for ph, n, _ in by[r] if ph == "b") == sum(1 for ph, n, _ in by[r]
                                                                if ph == "e") for r in by)
    begin = {n: ts for ph, n, ts in by["a"] if ph == "b"}
    assert begin["prefill"] - begin["queued"] == 10_000.0       # µs: queued 10 ms
    assert begin["decode"] - begin["prefill"] == 20_000.0       # its prefill: 20 ms
    assert [n for ph, n, _ in by["d"] if ph == "b"] == ["request", "queued"]
    assert a


def test_the_nsys_sqlite_has_request_ranges(tmp_path):
    path = write_nsys_sqlite(serving_store().view(), tmp_path / "r.sqlite")
    con = sqlite3.connect(path)
    rows = con.execute("SELECT text, end - start, jsonText FROM NVTX_EVENTS WHERE eventType = 60 "
                       "ORDER BY start, text").fetchall()
    con.close()
    a = [(t, d) for t, d, j in rows if json.loads(j)["request"] == "a"]
    assert dict(a) == {"request": 111_000_000, "request queued": 10_000_000,
                       "request prefill": 20_000_000, "request decode": 81_000_000}
    assert {json.loads(j)["request"] for _, _, j in rows} == {"a", "b", "c", "d"}


def test_diff_compares_ttft_and_itl(tmp_path, capsys):
    a = serving_store().view()
    st = serving_store()
    st.requests.arrived("z", 4, "api", t=200_000_000)
    st.requests.tokens("z", 1, t=400_000_000)
    st.requests.finished("z", "stop", t=400_000_000)
    b = st.view()
    res = diff(a, b)
    by = {c.label: c for c in res.requests}
    assert by["finished requests"].a == 2 and by["finished requests"].b == 3
    assert by["TTFT p99"].b == 200.0
    assert "Requests (every finished request)" in render_text(res)
    pa, pb = write_snapshot(a, tmp_path / "a.json"), write_snapshot(b, tmp_path / "b.json")
    assert main(["diff", str(pa), str(pb)]) == 0
    assert "TTFT p50" in capsys.readouterr().out
