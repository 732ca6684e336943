"""Helpers for the program step-source tests: a real Profiler and store without collectors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiprof.profiler import Profiler
from tuiprof.spec import ProfilerOptions
from tuiprof.store import SessionStore

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture
def prof() -> Profiler:
    """The listener every step source reports to, over a real store (no CUPTI/NVML here)."""
    return Profiler(SessionStore(ring_tokens=8), ProfilerOptions(cupti=False, nvml=False))


def tiny_qwen3():
    """qwen3-tiny (the registry's definition) as a transformers model with seeded weights: what
    a user's program builds."""
    import torch
    import transformers

    config = json.loads((REPO / "models" / "qwen3-tiny.json").read_text())["config"]
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**config)).eval()


def rows(prof: Profiler) -> list:
    return [t for t in prof.store.view(raw=False).tokens if t.done]


def tuiprof_run(tmp_path: Path, *program: str, options: tuple = (), timeout: float = 120):
    """``tuiprof run --headless --json OUT [options] -- python PROGRAM...`` as a user runs it;
    returns (completed process, snapshot document)."""
    out = tmp_path / "snap.json"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json", str(out),
           *options, "--", "python", *program]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=env)
    doc = json.loads(out.read_text()) if out.exists() else None
    return proc, doc
