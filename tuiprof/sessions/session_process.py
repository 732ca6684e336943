"""The session process: engine, collectors and store, served to the processes that read it.

Why a process of its own: the generation thread, the collectors and a Textual UI in one
interpreter share one GIL. On the H100 a refresh of the live panes held it long enough to slow
compiled decode by a third (docs/performance.md). Here the UI's only cost to generation is one
small :meth:`SessionStore.changes` per refresh, built and pickled on a serving thread.

Requests arrive over :mod:`tuiprof.sessions.protocol` (a Unix socket in the session's private
directory; JSON requests, pickled replies that the reader rebuilds with a safe unpickler), on
any number of connections: the process that started this one (its *owner*: the live app, or
a detached session's keeper), and others (a second UI through the keeper, the keeper's own
mirror). Each connection has its own cursor, so each mirror gets every change. When the owner
goes without saying ``close`` (the live app crashed), the session stops, writes an orphan
snapshot where one is configured, and ends.

With a program (``tuiprof run -- python prog.py``) the program runs on this process's main
thread, so that Ctrl-C (KeyboardInterrupt) and its own signal handlers behave as it expects,
and the requests are served from threads. Its stdin is /dev/null (the terminal belongs to
the UI); its stdout and stderr go to its log file and the store's output ring. The
processes it starts are followed (:mod:`tuiprof.sessions.follow`) when the session asks for it.
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

from ..errors import one_line
from ..profiler import Profiler
from ..spec import ProfilerOptions
from ..store import SessionStore
from . import follow
from .server import Life, SessionServer, start_server

OWNER_WAIT_S = 120.0   # the process that started this one connects within this, or it ends


@dataclasses.dataclass
class SessionSpec:
    """Everything the session process needs to start (pickled once, at spawn)."""

    options: ProfilerOptions
    store: dict                      # SessionStore keyword arguments
    log_path: str | None = None      # the process's stdout/stderr (torch warnings) go here
    orphan_snapshot_dir: str | None = None  # snapshot written here if the UI process vanishes
    hook: str | None = None          # "module:callable" (benchmarks): called with the Profiler
    program: dict | None = None      # a program to run: {"spec", "log_path", "options"}
                                     # (tuiprof.sessions.launch.program_control)
    env: dict | None = None          # environment set first (a rank's RANK, MASTER_PORT, ...)
    socket_path: str | None = None   # where this process serves its store
    follow_env: dict | None = None   # set before the program runs: its children are followed
    owner_pid: int | None = None     # the process that started this one (it connects first)


def _watch_owner(life: Life, owner_pid: int | None) -> None:
    """End the process when its owner never connects (it died while this one started)."""
    parent = owner_pid or os.getppid()

    def run() -> None:
        t_end = time.monotonic() + OWNER_WAIT_S
        while not life.owner_seen.wait(0.5):
            if time.monotonic() > t_end or os.getppid() != parent:
                life.owner_gone(False)
                return

    threading.Thread(target=run, name="tuiprof-owner-watch", daemon=True).start()


def serve(spec: SessionSpec) -> None:
    """Entry point of the session process (``multiprocessing`` spawn target)."""
    if spec.env:
        os.environ.update(spec.env)
    if spec.program is not None:
        _serve_program(spec)
        return
    _redirect_output(spec.log_path)
    # The UI process owns the terminal and the session's life: Ctrl-C and a closed terminal
    # reach it, and it stops this process through the connection. SIGTERM sent here directly
    # stops generation and collection but keeps the data for the UI to fetch.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    life = Life()
    signal.signal(signal.SIGTERM, lambda *_: life.term.set())
    prof = Profiler(SessionStore(**spec.store), spec.options, first_phase="starting session process")
    hook = _load_hook(spec.hook, prof)
    server = SessionServer(prof, hook)
    srv = start_server(spec.socket_path, server, life)
    _watch_owner(life, spec.owner_pid)
    prof.start()
    while not life.end.wait(0.2):
        if life.term.is_set():
            life.term.clear()
            threading.Thread(target=prof.stop, daemon=True).start()
    _end(prof, spec, life.orphaned, srv)


def _end(prof: Profiler, spec: SessionSpec, orphaned: bool, srv: Any) -> None:
    prof.stop()
    if orphaned and spec.orphan_snapshot_dir:
        _orphan_snapshot(prof, spec.orphan_snapshot_dir)
    try:
        if srv is not None:
            srv.close()
    finally:
        _release_named_semaphores()
        # A torch.compile still running cannot be joined, and a program may still run on the
        # main thread; ending the interpreter under either aborts. Everything is flushed by
        # now, so leave at once.
        os._exit(0)


def _release_named_semaphores() -> None:
    """Unlink the named semaphores this process made, as a normal exit would.

    os._exit skips multiprocessing's exit finalizers, so a lock made here (tqdm makes one for
    the progress bar of inductor's compile) stayed registered with the resource tracker this
    process shares with the UI process, which then printed "leaked semaphore objects" when the
    user quit. Only the finalizers are run, not the join of child processes that a normal exit
    also does (a compile worker may not end)."""
    from multiprocessing import util  # noqa: PLC0415

    try:
        util._run_finalizers(0)  # noqa: SLF001 - what util._exit_function runs first
    except Exception:
        pass


def _serve_program(spec: SessionSpec) -> None:
    """Run the program on this (main) thread; serve from other threads until the owner
    closes the session (or vanishes)."""
    from ..program.launch import ProgramResult, SessionStop  # noqa: PLC0415
    from ..program.program_session import ProgramSession  # noqa: PLC0415

    prog = spec.program
    relayed = prog.get("fds")   # (stdin, stdout, stderr): the parent reads the output
    if relayed:
        _adopt_fds(*relayed)
    else:
        _redirect_output(None)  # until the capture starts, nothing may reach the UI's terminal
    if prog.get("own_group"):
        # The terminal's Ctrl-C reaches only the process that started this one, which
        # forwards the first and stops the session at the second.
        os.setpgrp()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # the UI process handles a closed terminal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the UI's Ctrl-C, forwarded
    if prog.get("stop_on_term"):
        signal.signal(signal.SIGTERM, _stop_program)
    prof = Profiler(SessionStore(**spec.store), spec.options)
    session = ProgramSession(prof, prog["spec"], prog["log_path"], options=prog.get("options"),
                             tee=False, relayed=bool(relayed), meta=prog.get("meta"),
                             proxy=prog.get("proxy"))
    server = SessionServer(prof, _load_hook(spec.hook, prof), program=session)
    life = Life()
    srv = start_server(spec.socket_path, server, life)
    _watch_owner(life, spec.owner_pid)
    try:
        session.start()
        started = True
    except Exception as exc:  # the UI shows why; the process still answers it
        prof.status.state = "error"
        prof.status.message = f"could not start the program: {one_line(exc)}"
        started = False

    def wait_end() -> None:
        life.end.wait()
        _end(prof, spec, life.orphaned, srv)

    threading.Thread(target=wait_end, name="tuiprof-end", daemon=True).start()
    if started:
        _keep_on_exit(session, server)
        if spec.follow_env:
            follow.follow_from_main(spec.follow_env, session, srv)
        try:
            result = session.run()
            program_exit()
        except KeyboardInterrupt:  # a forwarded Ctrl-C that came just as the program ended
            result = ProgramResult(128 + signal.SIGINT, "interrupted")
        except SessionStop:  # a stop that came just as the program ended
            result = ProgramResult(128 + signal.SIGTERM, "stopped")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.finish(result, keep_capture=True)
    while True:  # the end thread ends the process (q, or the UI process gone)
        time.sleep(3600)


EXIT_WAIT_S = 3.0   # how long a program's os._exit waits for the session to be fetched


def _keep_on_exit(session: Any, server: SessionServer) -> None:
    """A program that ends its process itself (``os._exit(n)``) skips every cleanup; before it
    goes, its run is recorded as ended (last step closed, collectors flushed) and the process
    that reads the session gets one more copy (at most ``EXIT_WAIT_S``). Then it exits with
    its status as it asked."""
    from ..program.launch import ProgramResult  # noqa: PLC0415

    real_exit = os._exit
    once = threading.Lock()

    def exit_now(status: int = 0) -> None:
        if session.running and once.acquire(blocking=False):
            try:
                seen = server.pulls
                session.finish(ProgramResult(int(status) & 0xFF, "os._exit"), keep_capture=True)
                end = time.monotonic() + EXIT_WAIT_S
                while server.pulls < seen + 2 and time.monotonic() < end:
                    time.sleep(0.02)
            except Exception:
                pass
        real_exit(status)

    os._exit = exit_now


def _stop_program(signum: int, frame: Any) -> None:
    """SIGTERM from the process that started this one: end the program (its main thread
    gets :class:`SessionStop`, which it does not catch as an Exception), so that it ends
    and its run is recorded as stopped."""
    from ..program.launch import SessionStop  # noqa: PLC0415

    raise SessionStop(signum)


class PassFd:
    """A file descriptor handed to the spawned session process (duplicated for it while the
    process starts); it arrives there as a plain fd number."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction  # noqa: PLC0415

        return (_fd_number, (reduction.DupFd(self.fd),))


def _fd_number(dup: Any) -> int:
    return dup.detach()


def _adopt_fds(stdin: int | None, stdout: int, stderr: int) -> None:
    """Make the handed fds this process's 0, 1 and 2 (stdin /dev/null when none)."""
    import sys  # noqa: PLC0415

    if stdin is None:
        stdin = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    try:   # multiprocessing gave this process a /dev/null stdin: the program gets fd 0
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    except OSError:
        pass


def program_exit() -> None:
    """What Python does for a program's process when its main module has run: its ``atexit``
    handlers, last registered first. Among them, multiprocessing's terminates daemonic
    children and joins the others (the program's process ends only then), and those
    registered after it run before it: a library's shutdown that stops its own child
    processes (vLLM's engine core) must run before that join, or the join waits forever."""
    import atexit  # noqa: PLC0415

    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - each handler once, in Python's order
    except Exception:
        pass


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
