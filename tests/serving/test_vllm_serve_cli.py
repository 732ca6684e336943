"""``tuiprof serve --engine vllm`` as a user runs it: vLLM's OpenAI server started by the load
program under tuiprof, driven over HTTP, every request recorded and joined to vLLM's steps;
and its one-line refusals (those need no vLLM)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tuiprof.engine.model_dir import make_vllm_model_dir

from .vllm_env import REPO, env, vllm_python

PY, WHY = vllm_python()


def _tuiprof(*args: str, cwd, environ: dict, timeout: float = 900):
    return subprocess.run([sys.executable, "-m", "tuiprof", *args], capture_output=True,
                          text=True, timeout=timeout, env=environ, cwd=cwd)


def test_engine_vllm_refuses_a_registry_name_and_a_missing_python(tmp_path):
    e = dict(os.environ, PYTHONPATH=REPO, TUIPROF_VLLM_PYTHON=str(tmp_path / "nope"))
    p = _tuiprof("serve", "--engine", "vllm", "--model", "qwen3-tiny", "--headless",
                 cwd=tmp_path, environ=e, timeout=120)
    assert p.returncode != 0 and "serves a local model directory" in p.stderr
    assert "Traceback" not in p.stderr
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    p = _tuiprof("serve", "--engine", "vllm", "--model", str(tmp_path / "m"), "--headless",
                 cwd=tmp_path, environ=e, timeout=120)
    assert p.returncode != 0 and "TUIPROF_VLLM_PYTHON" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(PY is None, reason=WHY or "no vLLM")
def test_serve_engine_vllm_records_every_request_of_its_load(tmp_path):
    model = make_vllm_model_dir(tmp_path / "tiny")
    snap = tmp_path / "serve.json"
    p = _tuiprof("serve", "--engine", "vllm", "--model", str(model), "--headless", "--no-nvml",
                 "--json", str(snap), "--concurrency", "2", "--requests", "4",
                 "--prompt-len", "8:12", "--output-len", "6", cwd=tmp_path,
                 environ=env(TUIPROF_VLLM_PYTHON=PY))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    doc = json.loads(snap.read_text())
    engine = next(r for r in doc["ranks"] if r["meta"].get("step_source") == "vllm")
    reqs = {r["client_id"]: r for r in engine["requests"]}
    warm = "tuiprof-warmup-0"    # its X-Request-Id, which vLLM's request id is made from
    assert sorted(reqs) == ["r0", "r1", "r2", "r3", warm]
    for r in reqs.values():
        assert r["status"] == "finished" and r["output_tokens"] == 6 and r["steps"]
        assert 8 <= r["prompt_tokens"] <= 12
    # the warm-up request is kept whole and marked, and apart from every count: in the engine
    # core's record (joined with the API server's) as in the API server's own
    assert reqs[warm]["warmup"] is True
    assert not any(r.get("warmup") for k, r in reqs.items() if k != warm)
    api = next(r for r in doc["ranks"] if r is not engine
               and any(q["source"] == "vllm" for q in r.get("requests") or ()))
    for rank in (engine, api):
        c = rank["request_stats"]["counts"]
        assert (c["arrived"], c["finished"], c["warmup"]) == (4, 4, 1), c
        stats = rank["request_stats"]["stats"]
        assert c["tokens"] == 4 * 6 and stats["e2e_ms"]["count"] == 4
    # the engine core's own statistics (its queue wait, the prompts) leave the warm-up out:
    # it knew it by its id (it sees no HTTP header)
    stats = engine["request_stats"]["stats"]
    assert stats["queue_ms"]["count"] == stats["prompt_tokens"]["count"] == 4, stats
    assert doc["ranks"][0]["meta"]["load"]["generator"] == "tuiprof.engine.vllm_load"
