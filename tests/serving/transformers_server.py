"""``transformers serve DIR --continuous-batching`` on 127.0.0.1 under ``tuiprof run --headless``:
the one way the serving tests and the bench scripts that measure it start the server, wait until
it answers, and stop it with Ctrl-C (the server stops, tuiprof writes its snapshot)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """The running server: its process, the port clients use (the proxy's when there is one),
    and, once stopped, everything it printed."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path | None):
        self.proc, self.port, self.log, self.output = proc, port, log, ""
        self.stopped = False

    def printed(self) -> str:
        if self.log is not None:
            return self.log.read_text(errors="replace") if self.log.exists() else ""
        return self.output


def at_once(fn, calls: list, timeout: float = 60) -> None:
    """``fn(*args)`` for every ``args`` in ``calls``, all at once on threads of their own."""
    threads = [threading.Thread(target=fn, args=args) for args in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def openai_client(openai, port: int, timeout: float = 60):
    """The OpenAI client of the tests, on 127.0.0.1:PORT, no retries (a failure shows)."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                         timeout=timeout, max_retries=0)


def serve_command(model: Path, port: int, snap: Path, *, proxy: int | None = None,
                  num_blocks: int = 32, max_batch_tokens: int = 128) -> list[str]:
    """``tuiprof run --headless --json SNAP [--proxy PROXY=PORT] -- transformers serve ...``"""
    cmd = [sys.executable, "-m", "tuiprof", "run", "--headless", "--no-nvml", "--json", str(snap)]
    if proxy is not None:
        cmd += ["--proxy", f"127.0.0.1:{proxy}=127.0.0.1:{port}"]
    return cmd + ["--", "python", "-m", "transformers.cli.transformers", "serve", str(model),
                  "--continuous-batching", "--device", "cpu", "--host", "127.0.0.1",
                  "--port", str(port), "--cb-num-blocks", str(num_blocks),
                  "--cb-max-batch-tokens", str(max_batch_tokens)]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except (urllib.error.URLError, OSError):   # refused, or the proxy's 502 until it is up
        return False


@contextmanager
def transformers_serve(model: Path, snap: Path, cwd: Path, *, proxy: bool = False,
                       num_blocks: int = 32, max_batch_tokens: int = 128,
                       ready_path: str = "/v1/models", up_s: float = 120, stop_s: float = 90,
                       log: Path | None = None, **env: str) -> Iterator[Served]:
    """The server under tuiprof, answering at ``ready_path`` (through the proxy with ``proxy``),
    stopped with Ctrl-C on the way out. ``env`` adds to the environment. Raises RuntimeError
    with the end of its output when it ends or does not answer in ``up_s`` seconds."""
    port = free_port()
    listen = free_port() if proxy else None
    environ = dict(os.environ, HF_HUB_OFFLINE="1", **env,
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = serve_command(model, port, snap, proxy=listen, num_blocks=num_blocks,
                        max_batch_tokens=max_batch_tokens)
    out = open(log, "w") if log is not None else subprocess.PIPE
    try:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env=environ, cwd=cwd)
    finally:
        if log is not None:
            out.close()
    served = Served(proc, listen or port, log)
    try:
        deadline = time.monotonic() + up_s
        while not _answers(f"http://127.0.0.1:{served.port}{ready_path}"):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = (f"the server ended (status {proc.returncode})" if proc.poll() is not None
                       else f"the server did not come up in {up_s:g} s")
                _stop(served, stop_s)
                raise RuntimeError(f"{why}:\n{served.printed()[-3000:]}")
            time.sleep(0.3)
        yield served
    finally:
        _stop(served, stop_s)


def _stop(served: Served, stop_s: float) -> None:
    if served.stopped:
        return
    served.stopped = True
    proc = served.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=stop_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    served.output = out or served.output
