"""GPU tests run their workloads in fresh Python processes (``_workloads.py``) and assert on the
JSON those print. Each workload runs once per pytest session; without CUDA every test skips.
Expected on an H100: eager ~30 s, compiled ~75 s (one torch.compile), agreement ~30 s; the
timeouts (4-5x that, 9 min together) only catch hangs inside a 10-minute device command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:  # the tests import the workloads' parameters
    sys.path.insert(0, str(HERE))

from _workloads import MARK  # noqa: E402


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class Result(dict):
    """The JSON a workload printed; ``log`` is the tail of its stderr."""

    def __init__(self, name: str, data: dict, log: str) -> None:
        super().__init__(data)
        self.name, self.log = name, log


def _tail(text, n: int = 6000) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "")[-n:]


def run_workload(name: str, timeout: int) -> Result:
    """Run ``_workloads.py NAME`` in a child that inherits the environment; fail with its
    output tails when it crashes, times out or prints no result."""
    if not cuda_available():
        pytest.skip("needs a CUDA GPU")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(HERE / "_workloads.py"), name]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"workload {name} ran past {timeout} s\n--- stderr tail ---\n"
                    f"{_tail(exc.stderr)}", pytrace=False)
    found = [ln[len(MARK):] for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not found:
        pytest.fail(f"workload {name} exited with {proc.returncode}"
                    f"{'' if found else ', no result line'}\n--- stdout tail ---\n"
                    f"{_tail(proc.stdout, 2000)}\n--- stderr tail ---\n{_tail(proc.stderr)}",
                    pytrace=False)
    return Result(name, json.loads(found[-1]), _tail(proc.stderr))


@pytest.fixture(scope="session")
def eager_run() -> Result:
    return run_workload("eager", timeout=150)


@pytest.fixture(scope="session")
def compiled_run() -> Result:
    return run_workload("compiled", timeout=240)


@pytest.fixture(scope="session")
def detached_run() -> Result:
    return run_workload("detached", timeout=300)


@pytest.fixture(scope="session")
def rerecord_run() -> Result:
    return run_workload("rerecord", timeout=150)


@pytest.fixture(scope="session")
def agreement_run() -> Result:
    return run_workload("agreement", timeout=150)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A failing test shows the stderr tail of every workload it asserted on (terminal, JUnit)."""
    try:
        return (yield)
    except BaseException:
        for value in item.funcargs.values():
            if isinstance(value, Result):
                item.add_report_section("call", f"stderr of workload {value.name} (tail)",
                                        value.log)
        raise
