"""``tuiprof serve`` and ``tuiprof sweep --serve`` as a user runs them (real processes, a
registry model with random weights on the CPU), and their one-line refusals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.cli import main

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           HF_HUB_OFFLINE="1")


def _tuiprof(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuiprof", *args], capture_output=True,
                          text=True, timeout=timeout, env=ENV, cwd=cwd)


@pytest.mark.slow
def test_serve_headless_records_every_request_of_its_load(tmp_path):
    snap = tmp_path / "serve.json"
    p = _tuiprof("serve", "--model", "qwen3-tiny", "--device", "cpu", "--headless", "--no-nvml",
                 "--json", str(snap), "--concurrency", "2", "--requests", "6",
                 "--prompt-len", "8:12", "--output-len", "5", "--num-blocks", "32", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(snap.read_text())
    reqs = {r["id"]: r for r in doc["requests"]}
    assert sorted(reqs) == ["r0", "r1", "r2", "r3", "r4", "r5", "warmup0"]
    for r in reqs.values():
        assert r["status"] == "finished" and r["output_tokens"] == 5
        assert 8 <= r["prompt_tokens"] <= 12 and r["ttft_ms"] <= r["e2e_ms"]
    assert doc["meta"]["load"]["kind"] == "concurrency" and doc["meta"]["load"]["value"] == 2
    assert doc["meta"]["request_sources"] == {"transformers": 7}
    assert max(t.get("running", 0) for t in doc["tokens"]) <= 2      # closed loop: 2 at most
    assert "requests: 7 finished, 0 failed" in p.stdout


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "qwen3-tiny", "--rate", "0"], "--rate must be positive"),
    (["--model", "qwen3-tiny", "--rate", "2", "--concurrency", "2"], "give one"),
    (["--model", "qwen3-tiny", "--prompt-len", "ten"], "--prompt-len 'ten': expected N"),
    (["--model", "qwen3-tiny", "--json", "/no/such/dir/s.json"], "no such directory"),
])
def test_serve_refuses_bad_options_in_one_line_before_it_starts(args, says, capsys):
    assert main(["serve", "--headless", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("args, says", [
    (["--serve", "--models", "qwen3-tiny"], "--serve needs --rates"),
    (["--serve", "--models", "qwen3-tiny,qwen3-tiny", "--rates", "1"], "one model"),
    (["--serve", "--models", "qwen3-tiny", "--rates", "1", "--output-len", "0"], "--output-len"),
])
def test_sweep_serve_refuses_bad_options(args, says, capsys):
    assert main(["sweep", *args]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.slow
def test_a_rate_sweep_gives_a_cell_per_rate_and_the_slo_finding(tmp_path):
    out = tmp_path / "sweep"
    p = _tuiprof("sweep", "--serve", "--models", "qwen3-tiny", "--device", "cpu",
                 "--rates", "50,200", "--requests", "6", "--prompt-len", "8", "--output-len",
                 "4", "--num-blocks", "32", "--slo-ttft-ms", "60000", "--out", str(out),
                 cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((out / "serve-sweep.json").read_text())
    assert [c["value"] for c in res["cells"]] == [50.0, 200.0]
    assert all(c["status"] == "ok" and c["requests"] == 6 for c in res["cells"])
    assert all(c["attainment"] == 1.0 and c["ttft_p50_ms"] > 0 for c in res["cells"])
    assert res["finding"]["id"] == "slo-max-load" and res["finding"]["numbers"]["best"] == 200.0
    assert "Highest rate meeting the SLO: 200 req/s" in p.stdout
    assert (out / "serve-rate-50.json").exists() and (out / "serve-sweep.md").exists()
    # each cell samples as the live app does (a burst of traced steps in every period), not
    # every step as a headless run would: tracing's cost stays out of the latencies
    from tuiprof.profiler import AUTO_SAMPLE_EVERY
    cell = json.loads((out / "serve-rate-50.json").read_text())
    assert cell["meta"]["sample_every"] == AUTO_SAMPLE_EVERY["eager"]
