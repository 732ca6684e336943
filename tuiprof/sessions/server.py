"""A session's store served over the protocol: the requests a session process answers (pulls,
keys, stop) and one connection's cursor. The session process (:mod:`tuiprof.sessions.session_process`)
and a followed process's own session (:mod:`tuiprof.sessions.child_session`) both serve this way."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

from ..control import SourceStatus
from ..profiler import Profiler
from . import protocol


class SessionServer:
    """Answers requests over one Profiler (and the program it profiles)."""

    def __init__(self, prof: Profiler, hook: Any = None, program: Any = None) -> None:
        self.prof = prof
        self.hook = hook
        self.program = program   # a tuiprof.program.program_session.ProgramSession
        self.pulls = 0           # pulls answered (a program's os._exit waits for one more)
        self._lock = threading.Lock()   # one request at a time, whichever connection

    def pull(self, cursor: Any, raw_tokens: Any, light: bool, mirror: Any = None) -> tuple:
        """(status, delta, cursor) for one mirror."""
        prof, program = self.prof, self.program
        delta, cursor = prof.store.changes(cursor, raw_tokens, light, mirror=mirror)
        delta["meta"] = plain(delta["meta"])
        status = status_copy(prof.status)
        if program is not None:
            status.extra.update(program.status_extra())
        self.pulls += 1
        return status, delta, cursor

    def handle(self, op: str, *args: Any) -> Any:
        with self._lock:
            return self._handle(op, *args)

    def _handle(self, op: str, *args: Any) -> Any:
        prof, program = self.prof, self.program
        if op == "pull":
            cursor, raw_tokens, light = args[:3]
            return self.pull(cursor, raw_tokens, light)
        if op == "interrupt":
            return program.interrupt() if program is not None else None
        stale = _stale_key(prof, program, op, args)
        if stale:
            prof.status.message = stale
            return stale
        if program is not None and op in ("toggle_mode", "toggle_pause"):
            from ..program.program_session import ENGINE_ONLY  # noqa: PLC0415
            msg = ENGINE_ONLY[op] if op in ENGINE_ONLY else program.toggle_pause()
            prof.status.message = msg  # the status line says what happened (or why not)
            return msg
        if op in ("toggle_mode", "toggle_pause", "reset"):
            msg = getattr(prof, op)()
            prof.status.message = msg
            return msg
        if op in ("batch_up", "batch_down"):
            msg = prof.change_batch(op == "batch_up")
            prof.status.message = msg
            return msg
        if op == "stop":
            if program is not None:  # a native program's child process ends with the session
                program.stop_program()
            prof.stop(*[float(a) for a in args[:1]])
            return None
        if op == "busy":
            return prof.busy
        if op == "hook" and self.hook is not None:
            return self.hook.handle(*args)
        raise ValueError(f"unknown request {op!r}")


def _stale_key(prof: Profiler, program: Any, op: str, args: tuple) -> str:
    """Why a key pressed in one UI does nothing, when the session has already moved away
    from what that UI showed (another UI's key came first); "" when it applies. A key carries
    what its UI saw: the mode for ``c``, paused or not for space, the batch asked for b/B."""
    if not args or args[0] is None:
        return ""
    seen = args[0]
    eng = prof.engine
    if op == "toggle_mode" and program is None:
        want = getattr(eng, "_want_mode", prof.status.mode)
        if seen != prof.status.mode or want != prof.status.mode:
            return f"already switching to {want} (a key from another UI came first)"
    if op == "toggle_pause":
        paused = prof.status.state == "paused"
        if program is not None:
            paused = paused or program.recorder.paused
        elif eng is not None:
            paused = paused or bool(getattr(eng, "_paused", False))
        if bool(seen) != paused:
            return ("already pausing (a key from another UI came first)" if paused
                    else "already resumed (a key from another UI came first)")
    if op in ("batch_up", "batch_down") and eng is not None:
        want = getattr(eng, "want_batch", None)
        if want is not None and int(seen) != want:
            return f"already switching to batch {want} (a key from another UI came first)"
    return ""


def plain(obj: Any, depth: int = 0) -> Any:
    """``obj`` with plain types only (a str subclass such as ``torch.__version__`` becomes a
    str): what is sent is rebuilt by a reader that builds no class of torch's, and that must
    not import torch to read a version."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if depth > 32:
        return None
    if isinstance(obj, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v, depth + 1) for v in obj) if type(obj) in (list, tuple) \
            else [plain(v, depth + 1) for v in obj]
    if isinstance(obj, str):
        return str(obj)
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    return str(obj)


def status_copy(st: SourceStatus) -> SourceStatus:
    return dataclasses.replace(st, extra=dict(st.extra))


class Life:
    """When this process ends: its owner closed it, or vanished (orphaned)."""

    def __init__(self) -> None:
        self.end = threading.Event()
        self.orphaned = False
        self.owner_seen = threading.Event()
        self.term = threading.Event()     # SIGTERM: stop collecting, keep serving

    def owner_gone(self, clean: bool) -> None:
        if not clean:
            self.orphaned = True
        self.end.set()


class StoreConnection(protocol.Handler):
    """One connection to a session process: its own cursor into the store."""

    def __init__(self, server: SessionServer, life: Life) -> None:
        self.server = server
        self.life = life
        self.cursor: Any = None
        self.owner = False
        self.closing = False

    def hello(self, peer: protocol.Peer, facts: dict) -> Any:
        if facts.get("role") == "owner":
            if self.life.owner_seen.is_set():
                raise protocol.Refused("this session already has its owner")
            self.owner = True
            self.life.owner_seen.set()
        return {"pid": os.getpid(), "kind": "process"}

    def request(self, op: str, args: list) -> Any:
        if op == "pull":
            raw_tokens = args[0] if args else 0
            light = bool(args[1]) if len(args) > 1 else True
            if raw_tokens is not None and not isinstance(raw_tokens, int):
                raise ValueError("pull: raw_tokens must be an integer or null")
            t0 = time.thread_time()
            status, delta, self.cursor = self.server.pull(self.cursor, raw_tokens, light, self)
            self.server.prof.serve_s += time.thread_time() - t0
            return status, delta
        if op == "restart":      # the next pull sends everything (a mirror started again)
            self.cursor = None
            return None
        if op == "close":
            if not self.owner:
                raise ValueError("close: only the process that started the session ends it")
            self.closing = True
            self.life.owner_gone(True)
            return None
        t0 = time.thread_time()
        try:
            return self.server.handle(op, *args)
        finally:
            self.server.prof.serve_s += time.thread_time() - t0

    def closed(self, clean: bool) -> None:
        self.server.prof.store.forget_mirror(self)
        if self.owner and not self.closing:
            self.life.owner_gone(clean)


def start_server(socket_path: str | None, server: SessionServer,
                 life: Life) -> protocol.Server | None:
    """This process's server at ``socket_path`` (None without one: an in-process test)."""
    if not socket_path:
        return None
    srv = protocol.Server(lambda: StoreConnection(server, life), socket_path,
                          name="tuiprof-serve")
    srv.start()
    return srv
