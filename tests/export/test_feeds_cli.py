"""``tuiprof serve --headless --metrics --otlp``: the options reach a real session (the load
program in its session process, held by the headless run), Prometheus text is served while it
runs, and every request of the snapshot arrives as a span at a local OTLP/HTTP receiver."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.proto")

from .fleet_data import free_port  # noqa: E402
from .otlp_receiver import Receiver, attrs  # noqa: E402

REPO = str(Path(__file__).resolve().parents[2])


@pytest.mark.slow
def test_serve_feeds_prometheus_and_otlp(tmp_path):
    rx = Receiver(free_port())
    mport = free_port(exclude=(int(rx.url.rsplit(":", 1)[1]),))
    snap = tmp_path / "serve.json"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuiprof", "serve", "--model", "qwen3-tiny", "--device", "cpu",
         "--headless", "--no-nvml", "--json", str(snap), "--concurrency", "2", "--requests",
         "6", "--prompt-len", "8:12", "--output-len", "5", "--num-blocks", "32",
         "--metrics", f"127.0.0.1:{mport}", "--otlp", rx.url],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    scraped = ""
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5) as r:
                    scraped = r.read().decode()
            except OSError:
                pass
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        rx.close()
    assert proc.returncode == 0, out[-3000:]
    assert "tuiprof_steps_total{" in scraped and 'role="program"' in scraped
    doc = json.loads(snap.read_text())
    # the load's requests: the warm-up is kept apart from every feed as from every count
    reqs = {r["id"]: r for r in doc["requests"] if not r.get("warmup")}
    assert [r["id"] for r in doc["requests"] if r.get("warmup")] == ["warmup0"]
    roots = {attrs(s)["tuiprof.request.id"]: s for _, s in rx.spans if s.name == "request"}
    assert sorted(roots) == sorted(reqs)
    for rid, sp in roots.items():
        assert sp.start_time_unix_nano == reqs[rid]["arrival_ns"]
        assert sp.end_time_unix_nano == reqs[rid]["finish_ns"]
        assert attrs(sp)["tuiprof.request.output_tokens"] == reqs[rid]["output_tokens"]
    res = rx.spans[0][0]
    assert res["tuiprof.role"] == "program" and res["tuiprof.model"]
    feeds = doc["meta"]["feeds"]
    assert feeds["metrics"]["address"] == f"127.0.0.1:{mport}" and feeds["metrics"]["scrapes"]
    assert feeds["otlp"]["dropped"] == 0 and feeds["otlp"]["requests"] == len(reqs)
    assert feeds["otlp"]["exported"] == len(rx.spans)
    assert (f"tuiprof: otlp: {len(reqs)} requests and {feeds['otlp']['steps']} steps as "
            f"{len(rx.spans)} spans to {rx.url}/v1/traces: {len(rx.spans)} exported, 0 dropped"
            in out), out[-2000:]
