"""Fixtures for the fault tests: the tiny registry model on the CPU and CLI subprocess helpers."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
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


def hostile_catalogue():
    """tests/hostile.py, loaded by path (it is also a script: python3 tests/hostile.py OUT)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tuiprof_hostile", REPO / "tests" / "hostile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def pty_cli(args: list[str], rows: int, cols: int, cwd: Path | None = None) -> tuple[int, int]:
    """``python -m tuiprof ARGS`` on a real pseudo-terminal of ``rows`` x ``cols`` (the child a
    session leader whose controlling terminal it is): (pid, the terminal's fd)."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            if cwd is not None:
                os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "tuiprof", *args],
                      cli_env(TERM="xterm-256color"))
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return pid, fd


def read_pty(fd: int, wait: float) -> bytes | None:
    """What the terminal holds after up to ``wait`` seconds (b"" when nothing came); None
    once it is closed."""
    if not select.select([fd], [], [], wait)[0]:
        return b""
    try:
        return os.read(fd, 65536) or None
    except OSError:
        return None


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
