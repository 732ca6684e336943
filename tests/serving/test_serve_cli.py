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
    # the warm-up is kept whole, marked, and apart from every count (it read 7 of 6)
    assert reqs["warmup0"]["warmup"] is True
    assert not any("warmup" in r for rid, r in reqs.items() if rid != "warmup0")
    counts = doc["request_stats"]["counts"]
    assert counts["arrived"] == 6 and counts["finished"] == 6 and counts["warmup"] == 1
    assert doc["request_stats"]["stats"]["e2e_ms"]["count"] == 6
    assert doc["meta"]["request_sources"] == {"transformers": 6}
    assert max(t.get("running", 0) for t in doc["tokens"]) <= 2      # closed loop: 2 at most
    assert "requests: 6 finished, 0 failed, 0 in flight (of 6; from transformers 6)" in p.stdout
    assert "1 warm-up request apart" in p.stdout
    from tuiprof.analysis.requests import window
    from tuiprof.export.snapshot import read_snapshot
    view = read_snapshot(snap)
    assert [r.id for r in view.requests.warmup] == ["warmup0"]
    assert "warmup0" not in {r.id for r in view.requests.rows}
    assert window(view, seconds=1e9).finished == 6


@pytest.mark.parametrize("args, says", [
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--model", "qwen3-tiny", "--rate", "0"], "--rate 0: must be a positive number"),
    (["--model", "qwen3-tiny", "--rate", "2", "--concurrency", "2"], "give one"),
    (["--model", "qwen3-tiny", "--prompt-len", "ten"], "--prompt-len 'ten': expected N"),
    (["--model", "qwen3-tiny", "--json", "/no/such/dir/s.json"], "no such directory"),
    # every number of the load, checked before the model is loaded (these were accepted)
    (["--model", "qwen3-tiny", "--rate", "nan"], "--rate nan: must be a positive number"),
    (["--model", "qwen3-tiny", "--rate", "inf"], "--rate inf: must be a positive number"),
    (["--model", "qwen3-tiny", "--rate", "-1"], "--rate -1: must be a positive number"),
    (["--model", "qwen3-tiny", "--duration", "nan"], "--duration nan: must be a positive"),
    (["--model", "qwen3-tiny", "--num-blocks", "0"], "--num-blocks 0: must be at least 1"),
    (["--model", "qwen3-tiny", "--max-batch-tokens", "0"],
     "--max-batch-tokens 0: must be at least 1"),
    (["--model", "qwen3-tiny", "--warmup", "-1"], "--warmup -1: must be at least 0"),
    (["--model", "qwen3-tiny", "--concurrency", "0"], "--concurrency 0: must be at least 1"),
    (["--model", "qwen3-tiny", "--requests", "0"], "--requests 0: must be at least 1"),
    (["--model", "qwen3-tiny", "--seed", "-1"], "--seed -1: must be 0 to"),
    (["--model", "qwen3-tiny", "--ring-tokens", "0"], "--ring-tokens 0: must be at least 1"),
    (["--model", "qwen3-tiny", "--sample-every", "0"], "--sample-every 0: give auto or live"),
    (["--model", "qwen3-tiny", "--sample-every", "nan"], "--sample-every nan: give auto"),
    (["--model", "qwen3-tiny", "--prompt-len", "64~nan"], "--prompt-len '64~nan'"),
    # the model's context (qwen3-tiny: 512 positions): 10,000,000 ran for minutes
    (["--model", "qwen3-tiny", "--prompt-len", "10000000"],
     "a request of up to 10,000,000 + 64 tokens does not fit the model's 512 positions"),
    (["--model", "qwen3-tiny", "--prompt-len", "64", "--output-len", "400:500"],
     "64 + 500 tokens does not fit the model's 512 positions"),
])
def test_serve_refuses_bad_options_in_one_line_before_it_starts(args, says, capsys,
                                                                 monkeypatch):
    import tuiprof.cli.program

    def started(*a, **k):
        raise AssertionError("the session started")
    monkeypatch.setattr(tuiprof.cli.program, "run_headless", started)
    monkeypatch.setattr(tuiprof.cli.program, "run_live", started)
    assert main(["serve", "--headless", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err


def test_a_request_that_fits_the_context_is_accepted(capsys, monkeypatch):
    import tuiprof.cli.program

    seen = []
    monkeypatch.setattr(tuiprof.cli.program, "run_headless", lambda ns, *a: seen.append(ns) or 0)
    assert main(["serve", "--headless", "--model", "qwen3-tiny", "--prompt-len", "448",
                 "--output-len", "64", "--warmup", "0"]) == 0
    assert seen and "--prompt-len" in seen[0].program


@pytest.mark.slow
def test_ctrl_c_during_serve_stops_the_load_without_a_traceback(tmp_path):
    """Ctrl-C during a long load printed the load program's KeyboardInterrupt traceback."""
    import signal
    import time

    snap = tmp_path / "serve.json"
    proc = subprocess.Popen([sys.executable, "-m", "tuiprof", "serve", "--model", "qwen3-tiny",
                             "--device", "cpu", "--headless", "--no-nvml", "--no-cupti",
                             "--json", str(snap), "--rate", "0.5", "--requests", "1000",
                             "--prompt-len", "8", "--output-len", "4", "--num-blocks", "32"],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        t_end = time.monotonic() + 240
        while True:
            line = proc.stdout.readline()
            assert line and time.monotonic() < t_end, "".join(lines)[-3000:]
            lines.append(line)
            if "tuiprof-serve: serving" in line:
                break
        time.sleep(1.0)                     # the load is under way
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(lines) + out
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "tuiprof serve: interrupted (Ctrl-C)" in text, text[-3000:]
    assert proc.returncode == 130, text[-3000:]
    assert json.loads(snap.read_text())["request_stats"]["counts"]["warmup"] == 1


@pytest.mark.parametrize("args, says", [
    (["--serve", "--models", "qwen3-tiny"], "--serve needs --rates"),
    (["--serve", "--models", "qwen3-tiny,qwen3-tiny", "--rates", "1"], "one model"),
    (["--serve", "--models", "qwen3-tiny", "--rates", "1", "--output-len", "0"], "--output-len"),
    (["--serve", "--models", "qwen3-tiny", "--rates", "1,nan"], "must be a positive number"),
    (["--serve", "--models", "qwen3-tiny", "--rates", "1", "--num-blocks", "0"],
     "--num-blocks 0"),
    (["--serve", "--models", "qwen3-tiny", "--rates", "1", "--serve-prompt-len", "600"],
     "does not fit the model's 512 positions"),
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
    from tuiprof.sampling import AUTO_SAMPLE_EVERY
    cell = json.loads((out / "serve-rate-50.json").read_text())
    assert cell["meta"]["sample_every"] == AUTO_SAMPLE_EVERY["eager"]
