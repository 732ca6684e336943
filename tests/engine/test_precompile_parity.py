"""Kernel parity of a compiled step saved by one process and loaded by another with the same
step compiled afresh by dynamo (``bench/verify/precompile_parity.py``, qwen3-tiny on the CPU):
the loaded step runs the same inductor kernels and ATen calls, the same number of times a step.
The GPU form (CUDA kernels, CUDA graphs) is the same script on the GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "verify" / "precompile_parity.py"


@pytest.mark.slow
def test_a_loaded_step_launches_the_fresh_compiles_kernels(tmp_path):
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("TUIPROF_PRECOMPILE", None)
    out = tmp_path / "parity.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", "qwen3-tiny", "--device", "cpu",
                        "--max-len", "64", "--prompt-len", "8", "--dir", str(tmp_path / "work"),
                        "--json", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    fresh, loaded = doc["fresh"]["steps"], doc["loaded"]["steps"]
    assert doc["parity"] and fresh[-1] == loaded[-1]
    kernels = [k for k in fresh[-1] if k.startswith("cpp_fused")]
    assert kernels, fresh[-1]                 # inductor's own kernels, not only ATen calls
    assert any(k.startswith("aten::mm") for k in fresh[-1])
    assert "parity: same" in r.stdout
