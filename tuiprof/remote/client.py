"""The UI process's side of a session that runs in its own process.

:class:`RemoteControl` is a :class:`~tuiprof.control.SessionControl` like the in-process
:class:`~tuiprof.profiler.Profiler`, so the app has one code path. The UI thread never waits
on the other process: ``store.view(raw=False)`` returns the mirror at once and wakes a puller
thread that fetches the next delta; keys are queued to that thread and answered from the
mirrored state. Only ``view(raw=True)`` (exports, findings: called from worker threads) and
``stop()`` wait for an answer.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..control import SessionControl, SourceStatus, batch_limit_message, batch_target
from ..engine.load import expected_meta
from ..profiler import ProfilerOptions
from ..startup import ProgressTracker
from .mirror import Mirror
from .session_process import SessionSpec, serve


_OPEN_AT_EXIT: set = set()      # controls whose session process was started and not closed
_EXIT_HOOK: list = []
EXIT_GRACE_S = 15.0


def _watch_at_exit(ctl: "RemoteControl") -> None:
    """Have :func:`_end_sessions_at_exit` end ``ctl``'s process if nobody closes it."""
    _OPEN_AT_EXIT.add(ctl)
    if not _EXIT_HOOK:
        # Registered after multiprocessing's own exit hook (a process was started by now), so
        # it runs first (atexit is LIFO): that hook joins every child and would wait forever
        # on a session process nobody closed (an app that crashed, a failed test).
        atexit.register(_end_sessions_at_exit)
        _EXIT_HOOK.append(True)


def _end_sessions_at_exit() -> None:
    """The interpreter ends with sessions never closed: drop every connection at once (a
    session process takes that for a vanished UI: it stops and writes its orphan snapshot
    where one is configured; ranks all stop together), then kill what has not ended after
    ``EXIT_GRACE_S``."""
    ctls = [c for c in _OPEN_AT_EXIT if not c._closed.is_set()]
    _OPEN_AT_EXIT.clear()
    for c in ctls:
        c._closed.set()
        try:
            c._conn.close()
        except OSError:
            pass
    deadline = time.monotonic() + EXIT_GRACE_S
    for c in ctls:
        c._proc.join(max(0.0, deadline - time.monotonic()))
    for c in ctls:
        if c._proc.is_alive():
            c._proc.kill()
            c._proc.join(5)


def new_log_path(tag: str = "") -> str:
    """A fresh file in the temp directory for a session process's own output."""
    fd, path = tempfile.mkstemp(prefix=f"tuiprof-session-{tag}", suffix=".log")
    os.close(fd)
    return path


class SessionGone(RuntimeError):
    """The session process ended or stopped answering."""


class RemoteStore:
    """What readers of a store need (``view``, ``meta``, ``reset``), served by the mirror."""

    def __init__(self, control: "RemoteControl") -> None:
        self._control = control

    @property
    def meta(self) -> dict:
        return self._control.mirror.meta

    def view(self, raw: bool = True, raw_tokens: int | None = None, batch: Any = None) -> Any:
        return self._control.view(raw, raw_tokens, batch=batch)

    def reset(self) -> None:
        self._control.reset()


class RemoteControl(SessionControl):
    """A live session in a child process (spawned by :meth:`start`)."""

    def __init__(self, options: ProfilerOptions, store_kwargs: dict | None = None, *,
                 orphan_snapshot_dir: str | Path | None = None, hook: str | None = None,
                 reply_timeout: float = 60.0, program: dict | None = None) -> None:
        self.options = options
        self.program = program   # run this program instead of the engine (SessionSpec.program)
        self.store_kwargs = dict(store_kwargs or {})
        self.store = RemoteStore(self)  # type: ignore[assignment]
        self.mirror = Mirror(self.store_kwargs.get("series_len", 2048),
                             self.store_kwargs.get("nvml_len", 6000))
        # Until the session process answers: what the command line says, and the first phase.
        if "model_spec" in options.engine_kwargs:
            self.mirror.meta = expected_meta(**options.engine_kwargs)
        tracker = ProgressTracker(options.started_at)
        tracker.begin("starting session process")
        self.status = SourceStatus(state="loading", live=True,
                                   mode=options.engine_kwargs.get("mode", "eager"),
                                   progress=tracker.progress)
        self._interrupted = False
        self.orphan_snapshot_dir = str(orphan_snapshot_dir) if orphan_snapshot_dir else None
        self.hook = hook
        self.reply_timeout = reply_timeout
        self.log_path: str | None = None
        self.pulls = 0
        self._proc: Any = None
        self._conn: Any = None
        self._cursor: Any = None
        self._rpc = threading.Lock()       # one request in flight on the connection
        self._mirror_lock = threading.Lock()
        # One pull at a time, from reading the cursor to applying its delta: two pulls from one
        # cursor would both append the program's new output lines to the mirror.
        self._pull_lock = threading.Lock()
        self._want = threading.Event()
        self._keys: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._gone = False
        self._puller: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Spawn the session process (it loads the model and starts generating)."""
        if self.program is not None:
            self.log_path = self.program["log_path"]   # the program's output: kept
        else:
            self.log_path = new_log_path()
        ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA or threads
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(child, self.spec()), name="tuiprof-session")
        proc.start()
        child.close()
        self.attach(proc, parent)

    def spec(self, env: dict | None = None) -> SessionSpec:
        """What the session process is started with (``env``: set there before anything)."""
        return SessionSpec(self.options, self.store_kwargs, self.log_path,
                           self.orphan_snapshot_dir, self.hook, self.program, env)

    def attach(self, proc: Any, conn: Any) -> None:
        """Serve a session process started elsewhere (a rank launcher): its process handle
        (``is_alive``, ``exitcode``, ``join``, ``kill``) and this end of its connection."""
        self._proc = proc
        self._conn = conn
        _watch_at_exit(self)
        self._puller = threading.Thread(target=self._pull_loop, name="tuiprof-puller",
                                        daemon=True)
        self._puller.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop generation and collectors in the session process (data stays fetchable)."""
        if self._proc is None or self._gone:
            return
        try:
            self.call("stop", timeout, timeout=timeout + 30)
            self.view(raw=False, wait=True)
        except SessionGone:
            pass

    def close(self) -> None:
        """End the session process (after :meth:`stop` and the last fetch); safe to repeat."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._want.set()
        proc = self._proc
        if proc is None:
            return
        _OPEN_AT_EXIT.discard(self)
        if not self._gone:
            try:
                self.call("close", timeout=5)
            except SessionGone:
                pass
        proc.join(10)
        if proc.is_alive():  # stuck in a model load or torch.compile: it cannot be joined
            proc.kill()
            proc.join(5)
        try:
            self._conn.close()
        except OSError:
            pass
        if self.log_path and self.status.state != "error" and self.program is None:
            try:
                if os.path.getsize(self.log_path) == 0:
                    os.unlink(self.log_path)
            except OSError:
                pass

    @property
    def busy(self) -> bool:
        return bool(self._proc is not None and self._proc.is_alive())

    # --------------------------------------------------------------------- requests
    def call(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        """One request and its answer; raises :class:`SessionGone` if the process is gone."""
        timeout = self.reply_timeout if timeout is None else timeout
        with self._rpc:
            if self._gone or self._conn is None:
                raise SessionGone("session process not running")
            try:
                self._conn.send((op, *args))
                t0 = time.monotonic()
                while not self._conn.poll(0.2):
                    if not self._proc.is_alive():
                        raise EOFError
                    if time.monotonic() - t0 > timeout:
                        raise SessionGone(f"the session process did not answer {op!r} in "
                                          f"{timeout:.0f} s")
                kind, value = self._conn.recv()
            except (EOFError, OSError):
                self._mark_gone()
                raise SessionGone("session process ended") from None
        if kind == "err":
            raise RuntimeError(value)
        return value

    def _mark_gone(self) -> None:
        if self._gone:
            return
        self._gone = True
        if self._closed.is_set():
            return
        self._proc.join(1)
        code = self._proc.exitcode
        why = (f"killed by signal {-code}" if code is not None and code < 0
               else f"exit code {code}")
        self.status = SourceStatus(
            state="error", mode=self.status.mode, live=False, extra=dict(self.status.extra),
            message=f"the session process ended ({why}); the data shown is kept: press e to "
                    f"save it (log: {self.log_path})")

    def view(self, raw: bool = True, raw_tokens: int | None = None,
             wait: bool | None = None, batch: Any = None) -> Any:
        """The mirrored session (configuration ``batch``, default the latest). ``raw=False``
        (the UI's timer) answers at once and asks for the next delta; ``raw=True`` fetches raw
        records and waits (worker threads)."""
        if wait is None:
            wait = raw
        if wait and not self._gone and self._proc is not None:
            try:
                self._pull(raw_tokens if raw else 0)
            except (SessionGone, RuntimeError):
                pass
        else:
            self._want.set()
        with self._mirror_lock:
            return self.mirror.view(raw, batch)

    def _pull(self, raw_tokens: int | None) -> None:
        # Full statistics (median histograms) only for an export, which asks for all raw records.
        light = raw_tokens is not None
        with self._pull_lock:
            status, delta, cursor = self.call("pull", self._cursor, raw_tokens, light)
            with self._mirror_lock:
                self.mirror.apply(delta)
                self._cursor = cursor
                self.status = status
                self.pulls += 1

    def _pull_loop(self) -> None:
        while not self._closed.is_set() and not self._gone:
            self._want.wait(1.0)
            self._want.clear()
            try:
                while True:
                    op = self._keys.get_nowait()
                    self.call(op)
            except queue.Empty:
                pass
            except (SessionGone, RuntimeError):
                if self._gone:
                    return
            if self._closed.is_set():
                return
            try:
                self._pull(0)
            except (SessionGone, RuntimeError):
                if self._gone:
                    return

    # --------------------------------------------------------------------- keys
    def _key(self, op: str, answer: str) -> str:
        if self._gone or self._proc is None:
            return "the session process has ended"
        self._keys.put(op)
        self._want.set()
        return answer

    def toggle_mode(self) -> str:
        if self.status.state == "loading":
            return "model still loading"
        target = "compiled" if self.status.mode == "eager" else "eager"
        return self._key("toggle_mode", f"switching to {target} at the next token")

    def change_batch(self, up: bool) -> str:
        if self.status.state == "loading":
            return "model still loading"
        want = batch_target(self.status, up)
        if want is None:
            return batch_limit_message(self.status, up)
        return self._key("batch_up" if up else "batch_down", f"switching to batch {want} at the next token")

    def toggle_pause(self) -> str:
        if self.status.state == "loading":
            return "model still loading"
        if self.status.state == "paused":
            return self._key("toggle_pause", "resuming")
        if self.program is not None:  # the session answers on the status line (or says why not)
            return self._key("toggle_pause", "pause asked: the program stops at its next step")
        return self._key("toggle_pause", "pausing at the next token")

    def reset(self) -> str:
        return self._key("reset", "statistics reset")

    # ------------------------------------------------------------------ a program
    def has_output(self) -> bool:
        return self.program is not None

    def disabled_actions(self) -> dict[str, str]:
        if self.program is None:
            return {}
        from ..program.program_session import ENGINE_ONLY  # noqa: PLC0415
        return dict(ENGINE_ONLY)

    def interrupt(self) -> str | None:
        """Forward Ctrl-C to the program while it runs; None: nothing to interrupt."""
        if self.program is None or self._interrupted or self._gone:
            return None
        if not self.status.extra.get("can_interrupt", True):
            return None
        self._interrupted = True
        return self._key("interrupt", "Ctrl-C sent to the program (Ctrl-C again stops the "
                                      "session)")
