"""A helper process that does a session's first, cold ``torch.compile`` for it.

Dynamo and inductor run Python for tens of seconds; beside the session's decode loop in one
interpreter they took the GIL from it, and eager decode ran at about an eighth of its speed for
the whole compile. The helper builds the same model (same family code, config, dtype, device,
cache length and prompt length) and compiles the same decode step for the same batches, under
the same inductor configuration, into the session's persistent cache directory
(:mod:`tuiprof.engine.compile_cache`). Meanwhile the session decodes at full speed; when the
helper is done the session compiles in its own process from the warm cache (FX graph, AOT
autograd and Triton hits: the same kernels, only dynamo's trace and the loads remain).

Protocol: the helper starts by importing torch and the family's model code (and, on CUDA,
creating its context), so it can be started ahead of the first compile (``prestart``: after
the session's first token) and wait idle. The session then writes one JSON request line on the
helper's stdin and keeps the pipe open; the helper answers lines on stdout: ``imported
<seconds>``, ``ready <seconds>`` (model built), ``compiled <batch> <seconds>`` per batch,
``done``, or ``error <one line>``. The helper ends when its stdin
closes (the session ended, however it ended), so it never outlives the session. It runs in a
process group of its own (inductor's compile workers with it), which :meth:`CompileHelper.stop`
ends as a whole.

This module is the session's side; the helper process runs
:mod:`tuiprof.engine.compile_helper_main`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "TUIPROF_COMPILE_HELPER"
STOP_WAIT_S = 5.0


def policy(cuda: bool) -> str:
    """``off`` (compile in the session process, as before), ``on`` (a helper started at the
    compile) or ``prestart`` (started after the first token and waiting, imports done: the
    default on CUDA, where importing torch and transformers takes seconds)."""
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("off", "0", "no", "false"):
        return "off"
    if raw in ("on", "prestart"):
        return raw
    return "prestart" if cuda else "on"


@dataclass
class HelperResult:
    ok: bool
    reason: str = ""              # one line when not ok
    seconds: float = 0.0
    compiled: list[int] = field(default_factory=list)


class CompileHelper:
    """The session's side: start the helper, wait for it (releasing the GIL), stop it."""

    def __init__(self, family: str = "", device: str = "cpu", cache_dir: str | None = None,
                 log_path: Path | None = None) -> None:
        self.family, self.device, self.cache_dir = family, device, cache_dir
        self.request: dict = {}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self.saves = threading.Event()   # set once it saved its step (or ended)
        self.lines: list[str] = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        env = dict(os.environ)
        env.pop("TUIPROF_SESSION_FD", None)
        env["PYTHONUNBUFFERED"] = "1"
        cache_dir = self.cache_dir
        if cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
            env["TRITON_CACHE_DIR"] = str(Path(cache_dir) / "triton")
        err: Any = subprocess.DEVNULL
        if self.log_path is not None:
            try:
                err = open(self.log_path, "wb")  # one helper's output: replaced each time
            except OSError:
                err = subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuiprof.engine.compile_helper_main", self.family or "-",
                 self.device], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True,
                close_fds=True)
        finally:
            if err not in (subprocess.DEVNULL,):
                err.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, request: dict) -> None:
        """The compile to do (once): raises OSError if the helper has gone."""
        self.request = dict(request)
        if self.proc is None or self.proc.stdin is None:
            raise OSError("compile helper not started")
        self.proc.stdin.write((json.dumps(self.request) + "\n").encode())
        self.proc.stdin.flush()

    def wait(self) -> HelperResult:
        """Read the helper's answers until it is done, fails, dies or is stopped."""
        t0 = time.perf_counter()
        proc = self.proc
        if proc is None or proc.stdout is None:
            return HelperResult(False, "compile helper not started")
        compiled: list[int] = []
        for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            self.lines.append(line)
            del self.lines[:-32]
            if line.startswith("compiled "):
                compiled.append(int(line.split()[1]))
            elif line == "done":
                if self.request.get("precompile"):
                    # it saves the compiled step for the next session now: read its lines
                    # until it has, then close it (the session's close stops it before)
                    threading.Thread(target=self._finish, args=(proc,), daemon=True,
                                     name="tuiprof-helper-save").start()
                else:
                    self._close(proc)
                return HelperResult(True, seconds=time.perf_counter() - t0, compiled=compiled)
            elif line.startswith("error "):
                self._close(proc)
                return HelperResult(False, f"compile helper failed: {line[6:][:160]}",
                                    time.perf_counter() - t0, compiled)
        code = proc.wait()
        if self._stopped.is_set():
            return HelperResult(False, "compile helper stopped", time.perf_counter() - t0,
                                compiled)
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return HelperResult(False, f"compile helper ended ({how}) before it had compiled",
                            time.perf_counter() - t0, compiled)

    def _finish(self, proc: subprocess.Popen) -> None:
        """After ``done``: the helper's ``saved``/``unsaved`` lines until ``finished``, kept in
        :attr:`lines` (``saves`` is set at the end, whatever happened)."""
        try:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").strip()
                self.lines.append(line)
                del self.lines[:-32]
                if line == "finished":
                    break
        except (OSError, ValueError):
            pass
        finally:
            self.saves.set()
            if not self._stopped.is_set():
                self._close(proc)

    def stop(self) -> None:
        """End the helper and its compile workers (its process group); waits a little."""
        self._stopped.set()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, STOP_WAIT_S)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._close(proc)

    def _close(self, proc: subprocess.Popen) -> None:
        try:
            if proc.stdin is not None:
                proc.stdin.close()   # the helper ends when its stdin closes
        except OSError:
            pass
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
