"""A fleet's hosts on one machine: detached sessions listening on 127.0.0.1 with a token, started
as a user starts them (``tuiprof run --detach --listen 127.0.0.1:PORT --token-file F``): the
two nodes of a ``torchrun --nnodes 2`` job (c10d rendezvous on 127.0.0.1, gloo on the CPU, one
worker each), or a program that steps forever. Shared by tests/sessions/test_fleet.py and the
bench scripts that measure the multi-host attach; every process is ended by its pid only."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tuiprof.sessions import runtime

REPO = Path(__file__).resolve().parents[2]
TP_JOB = REPO / "tests" / "programs" / "tp_job.py"
STEPS_FOREVER = REPO / "tests" / "programs" / "steps_forever.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def private_runtime() -> str:
    """A runtime directory of this run's own (0700, short: socket paths), for every session it
    starts and attaches to (``TUIPROF_RUNTIME_DIR``)."""
    rt = tempfile.mkdtemp(prefix="tprt-", dir="/tmp")
    os.chmod(rt, 0o700)
    os.environ["TUIPROF_RUNTIME_DIR"] = rt
    return rt


def new_token(tmp: Path) -> Path:
    """A token file (0600) the hosts listen with and the UI attaches with."""
    token = tmp / "token"
    token.write_text(os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    return token


def detach(tmp: Path, program: list, *options: str, timeout: float = 120) -> str:
    """``tuiprof run --detach OPTIONS -- PROGRAM`` (no CUPTI, no NVML, its files in ``tmp``): the
    session's id. Raises RuntimeError with its error output when it does not start."""
    out = subprocess.run(
        [sys.executable, "-m", "tuiprof", "run", "--detach", "--no-cupti", "--no-nvml",
         "--export-dir", str(tmp), *options, "--", *map(str, program)],
        capture_output=True, text=True, timeout=timeout, env=env(), cwd=tmp)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return out.stdout.strip().splitlines()[-1]


def listening(port: int, token: Path) -> tuple[str, ...]:
    return ("--listen", f"127.0.0.1:{port}", "--token-file", str(token))


def steps_forever(tmp: Path, port: int, token: Path) -> str:
    """A program that marks steps until stopped, detached and listening on ``port``."""
    return detach(tmp, ["python", STEPS_FOREVER], *listening(port, token))


def node(tmp: Path, n: int, listen: int, rdzv: int, token: Path, seconds: int = 600) -> str:
    """Node ``n`` of the two-node job, under a detached session listening on ``listen``."""
    return detach(tmp, ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", n,
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv}",
                        "--rdzv-id", f"fleet{rdzv}", TP_JOB, "--new-tokens", "4",
                        "--seconds", seconds],
                  *listening(listen, token), timeout=180)


def nodes(tmp: Path, ports: tuple, token: Path, seconds: int = 600) -> list:
    """Both nodes of the job, started together (each waits for the other at the rendezvous)."""
    rdzv = free_port()
    with ThreadPoolExecutor(2) as ex:
        return list(ex.map(lambda n: node(tmp, n, ports[n], rdzv, token, seconds), (0, 1)))


def ours(pid: int) -> bool:
    """True when ``pid`` is still one of the job's processes (pids wrap on a busy machine: a
    process that ended may have left its number to someone else's)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read()
    except OSError:
        return False
    return any(m in cmd for m in (b"tp_job.py", b"tuiprof", b"torchrun", b"steps_forever"))


def kill_node(sid: str, pids: list) -> None:
    """The whole node goes at once: its keeper's process group (the keeper starts a session
    of its own; the session process and the agent are in it) and the node's processes (the
    agent starts its worker in a session of its own)."""
    info = runtime.read_info(runtime.runtime_root() / sid) or {}
    holder = info.get("holder_pid")
    for pid in pids:
        if pid and runtime.pid_alive(pid) and ours(pid):
            os.kill(pid, signal.SIGKILL)
    if holder and runtime.pid_alive(holder) and ours(holder):
        os.killpg(holder, signal.SIGKILL)
