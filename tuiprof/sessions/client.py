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
import dataclasses
import multiprocessing as mp
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..control import SessionControl, SourceStatus, batch_limit_message, batch_target
from ..spec import ProfilerOptions
from ..startup import ProgressTracker
from . import protocol
from .mirror import Mirror
from .runtime import new_session_dir
from .session_process import SessionSpec, serve


_OPEN_AT_EXIT: set = set()      # controls whose session process was started and not closed
_EXIT_HOOK: list = []
EXIT_GRACE_S = 15.0
CONNECT_TIMEOUT_S = 120.0   # a spawned session process serves within this (imports, spawn)
CONNECT_EXISTING_S = 5.0    # a process that serves already answers within this


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
        if c._client is not None:
            c._client.close()
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
    """A live session in another process: one this control starts (:meth:`start`), or one
    that serves already (:meth:`connect`: a process of a profiled program, or a process
    reached through a detached session's keeper)."""

    def __init__(self, options: ProfilerOptions | None = None, store_kwargs: dict | None = None,
                 *, orphan_snapshot_dir: str | Path | None = None, hook: str | None = None,
                 reply_timeout: float = 60.0, program: dict | None = None,
                 socket_path: str | None = None, follow_env: dict | None = None,
                 pull_every: float = 1.0, poll: bool = True) -> None:
        options = options if options is not None else ProfilerOptions()
        self.options = options
        self.program = program   # run this program instead of the engine (SessionSpec.program)
        # poll=False: no background puller; the caller pulls (a headless run pulls whole
        # views, histograms included, so that the mirror is always a complete snapshot)
        self.poll = poll
        self.store_kwargs = dict(store_kwargs or {})
        self.store = RemoteStore(self)  # type: ignore[assignment]
        self.mirror = Mirror(self.store_kwargs.get("series_len", 2048),
                             self.store_kwargs.get("nvml_len", 6000))
        # Until the session process answers: what the command line says, and the first phase.
        engine = options.engine
        if engine is not None:
            self.mirror.meta = engine.expected_meta()
        tracker = ProgressTracker(options.started_at)
        tracker.begin("starting session process")
        self.status = SourceStatus(state="loading", live=True,
                                   mode=engine.mode if engine is not None else "eager",
                                   progress=tracker.progress)
        self._interrupted = False
        self.orphan_snapshot_dir = str(orphan_snapshot_dir) if orphan_snapshot_dir else None
        self.hook = hook
        self.reply_timeout = reply_timeout
        self.socket_path = socket_path
        self.follow_env = follow_env
        self.pull_every = pull_every    # seconds between pulls nobody asked for (at most)
        self.log_path: str | None = None
        self.relay: Any = None   # a program's output, read here (OutputRelay)
        self.pulls = 0
        self.owner = False              # this control started the process and ends it
        self.remote_pid: int | None = None
        self._own_dir: Path | None = None
        self._proc: Any = None
        self._client: protocol.Client | None = None
        self._connector: Any = None
        self._connected = threading.Event()
        self._rpc = threading.Lock()       # one request in flight on the connection
        self._mirror_lock = threading.Lock()
        # One pull at a time, from sending it to applying its delta: two pulls in flight
        # would both append the program's new output lines to the mirror.
        self._pull_lock = threading.Lock()
        self._want = threading.Event()
        self._keys: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._gone = False
        self._gone_why = ""
        self._puller: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle
    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return self.remote_pid

    def start(self) -> None:
        """Spawn the session process (it loads the model and starts generating)."""
        if self.program is not None:
            self.log_path = self.program["log_path"]   # the program's output: kept
            self._relay_output()
        else:
            self.log_path = new_log_path()
        if self.socket_path is None:
            _sid, self._own_dir = new_session_dir("x")
            self.socket_path = str(self._own_dir / "main.sock")
        ctx = mp.get_context("spawn")  # never fork a process that may hold CUDA or threads
        proc = ctx.Process(target=serve, args=(self.spec(),), name="tuiprof-session")
        proc.start()
        if self.relay is not None:
            self.relay.started()
        self.watch(proc, self.socket_path)

    def _relay_output(self) -> None:
        """The program's stdout and stderr come to this process through pipes (log file and
        recent lines kept here), so whatever ends the session process, a kill or a crash in
        the program included, every byte it wrote is in the log."""
        from ..program.output import OutputRelay  # noqa: PLC0415
        from .session_process import PassFd  # noqa: PLC0415

        prog = self.program
        self.relay = OutputRelay(self.log_path, tee=bool(prog.get("tee")))
        w1, w2 = self.relay.child_fds()
        stdin = prog.get("stdin")
        self.program = dict(prog, fds=(PassFd(stdin) if stdin is not None else None,
                                       PassFd(w1), PassFd(w2)))

    def spec(self, env: dict | None = None) -> SessionSpec:
        """What the session process is started with (``env``: set there before anything)."""
        return SessionSpec(self.options, self.store_kwargs, self.log_path,
                           self.orphan_snapshot_dir, self.hook, self.program, env,
                           self.socket_path, self.follow_env, os.getpid())

    def watch(self, proc: Any, socket_path: str) -> None:
        """Serve a session process this control owns (started here or by a rank launcher):
        its process handle (``is_alive``, ``exitcode``, ``join``, ``kill``) and the socket it
        serves at (connected to, as its owner, once it is there)."""
        self._proc = proc
        self.owner = True
        self.socket_path = socket_path
        self._connector = lambda: protocol.Client.unix(socket_path, role="owner")
        _watch_at_exit(self)
        if self.poll:
            self._start_puller()

    def connect(self, connector: Any, proc: Any = None) -> None:
        """Mirror a process that serves already: ``connector()`` returns a connected
        :class:`~tuiprof.sessions.protocol.Client` (a process's socket, or a keeper's relay)."""
        self._proc = proc
        self._connector = connector
        self._start_puller()

    def _start_puller(self) -> None:
        self._puller = threading.Thread(target=self._pull_loop, name="tuiprof-puller",
                                        daemon=True)
        self._puller.start()

    def _connect(self) -> bool:
        """Connect (retrying while a process starts); False when it cannot be reached."""
        t_end = time.monotonic() + (CONNECT_TIMEOUT_S if self._proc is not None
                                    else CONNECT_EXISTING_S)
        last = "not started"
        while not self._closed.is_set():
            proc = self._proc
            if proc is not None and not proc.is_alive():
                break
            try:
                client = self._connector()
            except protocol.Refused as exc:
                last = str(exc)
                break
            except protocol.ProtocolError as exc:
                last = str(exc)
                if time.monotonic() > t_end:
                    break
                time.sleep(0.05)
                continue
            hello = client.hello if isinstance(client.hello, dict) else {}
            self.remote_pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
            self._client = client
            self._connected.set()
            return True
        self._mark_gone(f"could not connect: {last}")
        self._connected.set()
        return False

    def stop(self, timeout: float = 10.0) -> None:
        """Stop generation and collectors in the session process (data stays fetchable)."""
        if self._gone or (self._proc is None and self._connector is None):
            return
        try:
            self.call("stop", timeout, timeout=timeout + 30)
            self.view(raw=False, wait=True)
        except (SessionGone, RuntimeError):
            pass

    def close(self) -> None:
        """End the session process (after :meth:`stop` and the last fetch), or leave a
        process this control does not own; safe to repeat."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._want.set()
        _OPEN_AT_EXIT.discard(self)
        proc, client = self._proc, self._client
        if client is not None and not self._gone:
            try:
                if self.owner:
                    self.call("close", timeout=5)
                else:
                    with self._rpc:
                        client.close(bye=True)
            except (SessionGone, RuntimeError):
                pass
        if self.owner and proc is not None:
            proc.join(10)
            if proc.is_alive():  # stuck in a model load or torch.compile: it cannot be joined
                proc.kill()
                proc.join(5)
        if client is not None:
            client.close()
        if self.relay is not None:
            self.relay.finish()    # the rest of what the program wrote, into the log
        if self.log_path and self.status.state != "error" and self.program is None:
            try:   # an empty log file is removed; never a device or a FIFO of that name
                if os.path.isfile(self.log_path) and os.path.getsize(self.log_path) == 0:
                    os.unlink(self.log_path)
            except OSError:
                pass
        if self._own_dir is not None:
            import shutil  # noqa: PLC0415
            shutil.rmtree(self._own_dir, ignore_errors=True)

    @property
    def busy(self) -> bool:
        return bool(self._proc is not None and self._proc.is_alive())

    # --------------------------------------------------------------------- requests
    def call(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        """One request and its answer; raises :class:`SessionGone` if the process is gone."""
        timeout = self.reply_timeout if timeout is None else timeout
        if self._puller is None and not self._connected.is_set() and self._connector is not None:
            with self._rpc:   # nothing polls (poll=False): the caller's thread connects
                if not self._connected.is_set():
                    self._connect()
        if not self._connected.wait(timeout):
            raise SessionGone("the session process is not serving yet")
        with self._rpc:
            client = self._client
            if self._gone or client is None:
                raise SessionGone("session process not running")
            try:
                client.send(op, *args)
                t0 = time.monotonic()
                while not client.poll(0.2):
                    if self._proc is not None and not self._proc.is_alive():
                        raise protocol.Closed("the process ended")
                    if time.monotonic() - t0 > timeout:
                        client.close()   # an answer may still come: the stream is unusable
                        self._mark_gone(f"no answer to {op!r} in {timeout:.0f} s")
                        raise SessionGone(f"the session process did not answer {op!r} in "
                                          f"{timeout:.0f} s")
                payload = client.recv_raw()
            except protocol.ProtocolError as exc:
                self._mark_gone(str(exc))
                raise SessionGone("session process ended") from None
        try:
            return protocol.decode_value(payload)
        except protocol.RemoteError as exc:
            raise RuntimeError(str(exc)) from None
        except protocol.ProtocolError as exc:
            self._mark_gone(str(exc))
            raise SessionGone(str(exc)) from None

    def _mark_gone(self, why: str = "") -> None:
        if self._gone:
            return
        self._gone = True
        self._gone_why = why
        if self._closed.is_set():
            return
        proc = self._proc
        if proc is not None:
            proc.join(1)
            code = proc.exitcode
            why = (f"killed by signal {-code}" if code is not None and code < 0
                   else f"exit code {code}")
        else:
            why = why or "its connection closed"
        log = f" (log: {self.log_path})" if self.log_path else ""
        self.status = SourceStatus(
            state="error", mode=self.status.mode, live=False, extra=dict(self.status.extra),
            message=f"the session process ended ({why}); the data shown is kept: press e to "
                    f"save it{log}")

    def view(self, raw: bool = True, raw_tokens: int | None = None,
             wait: bool | None = None, batch: Any = None) -> Any:
        """The mirrored session (configuration ``batch``, default the latest). ``raw=False``
        (the UI's timer) answers at once and asks for the next delta; ``raw=True`` fetches raw
        records and waits (worker threads)."""
        if wait is None:
            wait = raw
        if wait and not self._gone and self._connector is not None:
            try:
                self._pull(raw_tokens if raw else 0)
            except (SessionGone, RuntimeError):
                pass
        else:
            self._want.set()
        with self._mirror_lock:
            view = self.mirror.view(raw, batch)
        return self.with_output(view)

    def with_output(self, view: Any) -> Any:
        """``view`` with the program's output as this process read it (relayed output)."""
        relay = self.relay
        if relay is None:
            return view
        meta = view.meta
        if isinstance(meta.get("program"), dict):
            meta = dict(meta, program=dict(meta["program"], output_lines=relay.lines))
        return dataclasses.replace(view, meta=meta, output=relay.recent(),
                                   counters=dict(view.counters, output_lines=relay.lines))

    def _pull(self, raw_tokens: int | None) -> None:
        # Full statistics (median histograms) only for an export, which asks for all raw records.
        light = raw_tokens is not None
        with self._pull_lock:
            status, delta = self.call("pull", raw_tokens, light)
            with self._mirror_lock:
                self.mirror.apply(delta)
                self.status = status
                self.pulls += 1

    def _pull_loop(self) -> None:
        if not self._connect():
            return
        while not self._closed.is_set() and not self._gone:
            self._want.wait(self.pull_every)
            self._want.clear()
            try:
                while True:
                    op, args = self._keys.get_nowait()
                    self.call(op, *args)
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
    def _key(self, op: str, answer: str, seen: Any = None) -> str:
        """Queue a key for the session; ``seen``: what this UI showed (the session ignores
        the key when another UI's key has changed that already: docs/remote.md)."""
        if self._gone or self._connector is None:
            return "the session process has ended"
        self._keys.put((op, () if seen is None else (seen,)))
        self._want.set()
        return answer

    def toggle_mode(self) -> str:
        if self.status.state == "loading":
            return "model still loading"
        target = "compiled" if self.status.mode == "eager" else "eager"
        return self._key("toggle_mode", f"switching to {target} at the next token",
                         self.status.mode)

    def change_batch(self, up: bool) -> str:
        if self.status.state == "loading":
            return "model still loading"
        want = batch_target(self.status, up)
        if want is None:
            return batch_limit_message(self.status, up)
        return self._key("batch_up" if up else "batch_down",
                         f"switching to batch {want} at the next token",
                         self.status.want_batch or self.status.batch)

    def toggle_pause(self) -> str:
        if self.status.state == "loading":
            return "model still loading"
        paused = self.status.state == "paused"
        if paused:
            return self._key("toggle_pause", "resuming", True)
        if self.program is not None:  # the session answers on the status line (or says why not)
            return self._key("toggle_pause", "pause asked: the program stops at its next step",
                             False)
        return self._key("toggle_pause", "pausing at the next token", False)

    def reset(self) -> str:
        return self._key("reset", "statistics reset")

    # ------------------------------------------------------------------ a program
    def has_output(self) -> bool:
        return self.program is not None or "program" in (self.status.extra or {})

    def disabled_actions(self) -> dict[str, str]:
        if self.program is None:   # a process reached by connect(): what it says it cannot do
            disabled = (self.status.extra or {}).get("disabled")
            return dict(disabled) if isinstance(disabled, dict) else {}
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
