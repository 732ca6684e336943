"""``-- ./binary ARGS``: a native program (C, C++, Rust...) run as a child of the session.

The binary runs in its own process group with the session's environment plus what the
injection collector asks for (``CUDA_INJECTION64_PATH`` and the channel's address; see
:mod:`tuiprof.collect.cupti_channel`); its stdout and stderr are the session's file descriptors 1
and 2, which the output capture has turned into pipes, so its output is kept as a Python
program's is. Its stdin is the session's, except a terminal (a background process group
reading it would be stopped) and the live app's (``/dev/null``).

Ctrl-C: the first one reaches tuiprof (the binary has its own process group, so the terminal
does not signal it directly) and is passed on to the binary as SIGINT, once; a second one (or
SIGTERM, SIGHUP, the live app quitting) stops the session: SIGTERM to the binary's group, then
SIGKILL after ``KILL_AFTER_S``. Its exit status is passed through: ``128 + N`` when signal N
ended it, as a shell says.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Callable

from .launch import ProgramResult, ProgramSpec, SessionStop

KILL_AFTER_S = 3.0
WATCH_S = 0.05           # how often the child's memory map is read until CUDA shows


class NativeRun:
    """One run of a native binary; :meth:`run` blocks until it ends."""

    def __init__(self, spec: ProgramSpec, env: dict[str, str], *, stdin_null: bool = False,
                 connected: threading.Event | None = None,
                 before_signal: Callable[[], object] | None = None) -> None:
        self.spec = spec
        self.env = env
        self.stdin_null = stdin_null
        self.connected = connected     # set once the injection library reported
        # called before tuiprof signals the binary (SIGINT, SIGTERM): its records come first,
        # since a signal's default action ends it without its exit flush
        self.before_signal = before_signal
        self.proc: subprocess.Popen | None = None
        self.cuda_loaded = False       # the CUDA driver library was mapped in the child
        self._stop = threading.Event()
        self._paused = False

    def run(self) -> ProgramResult:
        env = dict(os.environ)
        env.update(self.env)
        stdin = None
        if self.stdin_null or _is_tty(0):
            stdin = subprocess.DEVNULL
        try:
            group = ({"process_group": 0} if sys.version_info >= (3, 11)
                     else {"preexec_fn": os.setpgrp})
            self.proc = subprocess.Popen([self.spec.launcher, *self.spec.args],
                                         executable=self.spec.target, env=env, stdin=stdin,
                                         close_fds=True, **group)
        except OSError as exc:
            why = exc.strerror or str(exc)
            print(f"tuiprof: cannot run {self.spec.name}: {why}", file=sys.stderr, flush=True)
            return ProgramResult(126 if isinstance(exc, PermissionError) else 127, "failed",
                                 f"cannot run it: {why}")
        interrupted = stopped = False
        while True:
            try:
                rc = self._wait()
                if rc is not None:
                    break
            except KeyboardInterrupt:   # the first Ctrl-C: the binary's
                interrupted = True
                self.flush_records()
                self.signal(signal.SIGINT)
            except SessionStop:         # a second Ctrl-C, SIGTERM, SIGHUP
                stopped = True
                self._stop.set()
        if rc < 0:
            sig = -rc
            name = _signal_name(sig)
            if stopped:
                return ProgramResult(128 + sig, "stopped", name)
            how = "interrupted" if sig == signal.SIGINT and interrupted else "signaled"
            return ProgramResult(128 + sig, how, name)
        return ProgramResult(rc, "stopped" if stopped else "exited")

    def _wait(self) -> int | None:
        """Wait a little; None while the child runs. Ends it when a stop was asked."""
        proc = self.proc
        if self._stop.is_set():
            return self._end()
        try:
            return proc.wait(WATCH_S if not self.cuda_loaded and not self._connected() else 0.25)
        except subprocess.TimeoutExpired:
            if not self.cuda_loaded and not self._connected():
                self.cuda_loaded = _maps_cuda(proc.pid)
            return None

    def flush_records(self) -> None:
        if self.before_signal is not None and self.proc is not None \
                and self.proc.returncode is None:
            self.before_signal()

    def _connected(self) -> bool:
        return self.connected is not None and self.connected.is_set()

    def _end(self) -> int:
        """SIGTERM to the child's group, SIGKILL if it lingers; its status."""
        proc = self.proc
        self.signal(signal.SIGCONT)
        self.flush_records()
        self.signal(signal.SIGTERM)
        try:
            return proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return proc.wait()

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the binary's process group; False once it has ended."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return False
        try:
            os.killpg(proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self) -> None:
        """End the binary (the session stops); :meth:`run` returns its status."""
        self._stop.set()

    @property
    def paused(self) -> bool:
        return self._paused

    def toggle_pause(self) -> str:
        if self.proc is None or self.proc.returncode is not None:
            return "the program has ended"
        self._paused = not self._paused
        self.signal(signal.SIGSTOP if self._paused else signal.SIGCONT)
        return ("paused the program (SIGSTOP to its process group; space resumes)"
                if self._paused else "resumed (SIGCONT)")


def _is_tty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _maps_cuda(pid: int) -> bool:
    """Whether the CUDA driver library is mapped in process ``pid``."""
    try:
        with open(f"/proc/{pid}/maps", errors="replace") as fh:
            return any("libcuda.so" in line for line in fh)
    except OSError:
        return False


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def no_gpu_line(connected: bool, kernels: int, cuda_loaded: bool) -> str | None:
    """One line when the program's GPU path never ran, else None."""
    if not connected:
        if cuda_loaded:
            return ("the program loaded the CUDA driver but never initialised CUDA (no cuInit "
                    "reached tuiprof's injection library): its GPU path never ran")
        return "the program made no CUDA calls: its GPU path never ran"
    if not kernels:
        return "the program initialised CUDA but launched no kernel: its GPU path never ran"
    return None
