"""The external-client server benchmark's CPU form, as CI runs it (a smoke test: no threshold):
``bench/overhead/serve_external.py`` starts ``transformers serve --continuous-batching`` bare
and under ``tuiprof run --headless`` on 127.0.0.1, drives both with its open-loop streaming
client in a process of its own, and reports ratios to bare. Every request is answered, the
ratios are there, and tuiprof's snapshot holds the client's own request ids."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tuiprof.engine.model_dir import make_tiny_model_dir

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_one_tiny_round_bare_and_headless(tmp_path):
    model = make_tiny_model_dir(tmp_path / "tiny")
    # deep, as a user's output folder may be: the sessions' sockets must not live under it
    # (a Unix socket's path has at most 107 characters; the headless server ended at its start)
    out = tmp_path / ("out-" + "d" * 60)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "bench", "overhead", "serve_external.py"),
         "--model-dir", str(model), "--device", "cpu", "--modes", "bare,headless",
         "--rates", "4", "--requests", "3", "--rounds", "1", "--warmup", "1",
         "--prompt-words", "8", "--output-len", "4", "--cb-num-blocks", "32", "--no-nvml",
         "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [json.loads(ln) for ln in (out / "cells.jsonl").read_text().splitlines()]
    cells = [c for c in lines if "mode" in c]
    # after its cells, each round's line: every session's own figure over each of its cells
    assert [c["round"] for c in lines if c.get("kind") == "round"] == [0]
    logs = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-1500:]
                   for p in sorted((out / "servers").glob("*.log")))
    # a server that did not start is left out of its round by the bench (it says why): shown
    assert sorted(c["mode"] for c in cells) == ["bare", "headless"], proc.stdout[-2000:] + logs
    assert all(c["fig"]["ok"] == 3 and c["fig"]["tokens"] > 0 for c in cells), cells
    summary = json.loads((out / "summary.json").read_text())
    ratios = summary["ratios"]["4"]["headless"]
    assert {"tok_s", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tok_s_totals"} <= set(ratios)
    assert "| 4 | headless | 1 |" in (out / "summary.md").read_text()
    # the server under tuiprof saw the client's requests by the ids the client sent
    doc = json.loads((out / "servers" / "tuiprof-headless-0.json").read_text())
    ids = {r["id"] for r in doc["requests"]}
    assert {f"headless-0-4-{i}" for i in range(3)} <= ids, sorted(ids)
    assert doc["meta"]["tracing"].startswith("bursts of 4 steps")
    # the session's own overhead figure stands beside the client's
    assert summary["self_report"]["headless"]["pct"] == doc["overhead"]["pct"]
    assert "headless: the session's own figure over its whole life: overhead" in \
        (out / "summary.md").read_text()
    # pooled latencies and each request's time per output token beside the per-round ratios
    assert {"tpot_p50", "tpot_pooled", "ttft_pooled", "e2e_pooled"} <= set(ratios), ratios
    # what each session says of its own steps: by phase and CUPTI state, its overhead report
    facts = [json.loads(ln) for ln in (out / "sessions.jsonl").read_text().splitlines()]
    assert facts[0]["sessions"]["headless"]["overhead"]["pct"] == doc["overhead"]["pct"]
    assert any(k.startswith("decode/") for k in facts[0]["sessions"]["headless"]["steps"])
    # and its series, from which the bench reads the figure over each cell's load
    assert doc["overhead"]["series"] and all(len(x) == 2 for x in doc["overhead"]["series"])
