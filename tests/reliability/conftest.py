"""Fixtures for the fault tests: the tiny registry model on the CPU and CLI subprocess helpers."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_loaded():
    """qwen3-tiny on the CPU (float32, seed 0, a cache of 64 positions), built once."""
    from tuiprof.engine.load import load_model

    return load_model("qwen3-tiny", device="cpu", seed=0, max_len=64)


@pytest.fixture(scope="session")
def tiny_prompt(tiny_loaded):
    from tuiprof.engine.load import prompt_ids

    ids, _ = prompt_ids(tiny_loaded, None, 8, seed=0)
    return ids


def cli_env(**extra: str) -> dict:
    """Environment for ``python -m tuiprof`` subprocesses: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def start_cli(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tuiprof", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(**env))


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 90.0) -> list[str]:
    """Read ``proc``'s stderr until a line contains ``needle``; returns the lines read."""
    lines: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r} on stderr; got {lines}")
