"""bench/overhead/overhead_program_windows.py runs on the CPU (qwen3-tiny, eager): a real
``tuiprof run`` session around ``generate()`` windows, its transformers step source taken out
and put back window by window. It had stopped working when the step sources moved into a table
and nobody ran it until the GPU did; the real measurement is a GPU run (docs/results.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_program_windows_bench_runs_on_the_cpu(tmp_path):
    out = tmp_path / "w.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "overhead" /
                                               "overhead_program_windows.py"),
                           "--device", "cpu", "--tiny", "--blocks", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    res = json.loads(out.read_text())
    (block,) = res["blocks"]
    # a block holds as many windows with tuiprof as without, and the session saw only the former
    assert len(block["tuiprof"]) == len(block["none"]) > 0
    assert res["counters"]["tokens"] > 0 and res["forced"] == 0
    assert "tuiprof / none" in proc.stdout
