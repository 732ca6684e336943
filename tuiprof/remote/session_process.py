"""The session process: engine, collectors and store, served to a UI in another process.

Why a process of its own: the generation thread, the collectors and a Textual UI in one
interpreter share one GIL. On the H100 a refresh of the live panes held it long enough to slow
compiled decode by a third (docs/performance.md). Here the UI's only cost to generation is one
small :meth:`SessionStore.changes` per refresh, built and pickled on this process's main
thread.

Requests arrive on a :mod:`multiprocessing` connection as tuples ``(op, *args)`` and are
answered with ``("ok", value)`` or ``("err", one line)``. Both ends are tuiprof's own code in
a pair of processes; nothing read from a file goes through pickle.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ..control import SourceStatus
from ..profiler import Profiler, ProfilerOptions, one_line
from ..store import SessionStore


@dataclasses.dataclass
class SessionSpec:
    """Everything the session process needs to start (pickled once, at spawn)."""

    options: ProfilerOptions
    store: dict                      # SessionStore keyword arguments
    log_path: str | None = None      # the process's stdout/stderr (torch warnings) go here
    orphan_snapshot_dir: str | None = None  # snapshot written here if the UI process vanishes
    hook: str | None = None          # "module:callable" (benchmarks): called with the Profiler


class SessionServer:
    """Answers the UI process's requests over one Profiler."""

    def __init__(self, prof: Profiler, hook: Any = None) -> None:
        self.prof = prof
        self.hook = hook

    def handle(self, op: str, *args: Any) -> Any:
        prof = self.prof
        if op == "pull":
            cursor, raw_tokens, light = args
            delta, cursor = prof.store.changes(cursor, raw_tokens, light)
            return status_copy(prof.status), delta, cursor
        if op in ("toggle_mode", "toggle_pause", "reset"):
            msg = getattr(prof, op)()
            prof.status.message = msg
            return msg
        if op in ("batch_up", "batch_down"):
            msg = prof.change_batch(op == "batch_up")
            prof.status.message = msg
            return msg
        if op == "stop":
            prof.stop(*args)
            return None
        if op == "busy":
            return prof.busy
        if op == "hook" and self.hook is not None:
            return self.hook.handle(*args)
        raise ValueError(f"unknown request {op!r}")


def status_copy(st: SourceStatus) -> SourceStatus:
    return dataclasses.replace(st, extra=dict(st.extra))


def serve(conn: Any, spec: SessionSpec) -> None:
    """Entry point of the session process (``multiprocessing`` spawn target)."""
    _redirect_output(spec.log_path)
    # The UI process owns the terminal and the session's life: Ctrl-C and a closed terminal
    # reach it, and it stops this process through the connection. SIGTERM sent here directly
    # stops generation and collection but keeps the data for the UI to fetch.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    term = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: term.set())
    prof = Profiler(SessionStore(**spec.store), spec.options)
    hook = _load_hook(spec.hook, prof)
    server = SessionServer(prof, hook)
    prof.start()
    orphaned = False
    while True:
        if term.is_set():
            term.clear()
            threading.Thread(target=prof.stop, daemon=True).start()
        try:
            if not conn.poll(0.2):
                continue
            req = conn.recv()
        except (EOFError, OSError):
            orphaned = True  # the UI process is gone without saying goodbye
            break
        op, args = req[0], req[1:]
        if op == "close":
            _send(conn, ("ok", None))
            break
        try:
            reply = ("ok", server.handle(op, *args))
        except Exception as exc:
            reply = ("err", one_line(exc))
        if not _send(conn, reply):
            orphaned = True
            break
    prof.stop()
    if orphaned and spec.orphan_snapshot_dir:
        _orphan_snapshot(prof, spec.orphan_snapshot_dir)
    try:
        conn.close()
    finally:
        # A torch.compile still running cannot be joined; ending the interpreter under it
        # aborts. Everything is flushed by now, so leave at once.
        os._exit(0)


def _send(conn: Any, msg: tuple) -> bool:
    try:
        conn.send(msg)
        return True
    except (OSError, EOFError, BrokenPipeError):
        return False


def _redirect_output(path: str | None) -> None:
    target = path or os.devnull
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        pass


def _load_hook(spec: str | None, prof: Profiler) -> Any:
    if not spec:
        return None
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)(prof)


def _orphan_snapshot(prof: Profiler, directory: str) -> None:
    from ..export.snapshot import write_snapshot  # noqa: PLC0415

    model = str(prof.store.meta.get("model") or "session").replace("/", "-")[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        write_snapshot(prof.store.view(), Path(directory) / f"tuiprof-{model}-orphan-{stamp}.json")
    except Exception as exc:
        print(f"tuiprof: orphan snapshot failed: {one_line(exc)}", flush=True)
