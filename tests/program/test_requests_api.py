"""The request API in a hand-written server loop, under ``tuiprof run --headless`` as a user
runs it, and the same program without tuiprof."""
from __future__ import annotations

import os
import subprocess
import sys

from .conftest import PROGRAMS, REPO, tuiprof_run


def test_a_server_loop_reports_its_requests(tmp_path):
    proc, doc = tuiprof_run(tmp_path, str(PROGRAMS / "api_server.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "served 6 requests" in proc.stdout
    # a snapshot without requests once failed here under a loaded suite: say what it held
    assert "requests" in doc, (sorted(doc), doc.get("meta", {}).get("program"),
                               proc.stdout[-1500:], proc.stderr[-1500:])
    reqs = {r["id"]: r for r in doc["requests"]}
    assert sorted(reqs) == [f"req-{i}" for i in range(6)]
    for r in reqs.values():
        assert r["status"] == "finished" and r["reason"] == "length" and r["source"] == "api"
        assert r["output_tokens"] == 5 and len(r["token_ns"]) == 5 and r["prompt_tokens"] == 12
        assert 0 < r["ttft_ms"] <= r["e2e_ms"]
        assert r["itl_ms"]["count"] == 4
    # three at a time: the later ones waited for a place in the batch
    assert reqs["req-5"]["ttft_ms"] > reqs["req-0"]["ttft_ms"]
    stats = doc["request_stats"]
    assert stats["counts"]["finished"] == 6 and stats["misuse"] == {"unknown_id": 1}
    assert doc["meta"]["request_sources"] == {"api": 6}
    assert any(e[2] == "requests" and "never raised" in e[3] for e in doc["events"])
    assert "requests: 6 finished" in proc.stdout
    assert "misuse (counted, never raised): unknown_id 1" in proc.stderr


def test_the_same_server_runs_without_tuiprof(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(PROGRAMS / "api_server.py")], capture_output=True,
                         text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 0 and "served 6 requests" in out.stdout, out.stderr
