"""The session process: engine, collectors and store, served to a UI in another process.

Why a process of its own: the generation thread, the collectors and a Textual UI in one
interpreter share one GIL. On the H100 a refresh of the live panes held it long enough to slow
compiled decode by a third (docs/performance.md). Here the UI's only cost to generation is one
small :meth:`SessionStore.changes` per refresh, built and pickled on this process's main
thread.

Requests arrive on a :mod:`multiprocessing` connection as tuples ``(op, *args)`` and are
answered with ``("ok", value)`` or ``("err", one line)``. Both ends are tuiprof's own code in
a pair of processes; nothing read from a file goes through pickle.

With a program (``tuiprof run -- python prog.py``) the program runs on this process's main
thread, so that Ctrl-C (KeyboardInterrupt) and its own signal handlers behave as it expects,
and the requests are served from a thread. Its stdin is /dev/null (the terminal belongs to
the UI); its stdout and stderr go to its log file and the store's output ring.
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
from ..errors import one_line
from ..profiler import Profiler, ProfilerOptions
from ..store import SessionStore


@dataclasses.dataclass
class SessionSpec:
    """Everything the session process needs to start (pickled once, at spawn)."""

    options: ProfilerOptions
    store: dict                      # SessionStore keyword arguments
    log_path: str | None = None      # the process's stdout/stderr (torch warnings) go here
    orphan_snapshot_dir: str | None = None  # snapshot written here if the UI process vanishes
    hook: str | None = None          # "module:callable" (benchmarks): called with the Profiler
    program: dict | None = None      # a program to run: {"spec", "log_path", "options"}
                                     # (tuiprof.cli.program.run_live)
    env: dict | None = None          # environment set first (a rank's RANK, MASTER_PORT, ...)


class SessionServer:
    """Answers the UI process's requests over one Profiler (and the program it profiles)."""

    def __init__(self, prof: Profiler, hook: Any = None, program: Any = None) -> None:
        self.prof = prof
        self.hook = hook
        self.program = program   # a tuiprof.program.program_session.ProgramSession
        self.pulls = 0           # pulls answered (a program's os._exit waits for one more)

    def handle(self, op: str, *args: Any) -> Any:
        prof, program = self.prof, self.program
        if op == "pull":
            cursor, raw_tokens, light = args
            delta, cursor = prof.store.changes(cursor, raw_tokens, light)
            status = status_copy(prof.status)
            if program is not None:
                status.extra.update(program.status_extra())
            self.pulls += 1
            return status, delta, cursor
        if op == "interrupt":
            return program.interrupt() if program is not None else None
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
    if spec.env:
        os.environ.update(spec.env)
    if spec.program is not None:
        _serve_program(conn, spec)
        return
    _redirect_output(spec.log_path)
    # The UI process owns the terminal and the session's life: Ctrl-C and a closed terminal
    # reach it, and it stops this process through the connection. SIGTERM sent here directly
    # stops generation and collection but keeps the data for the UI to fetch.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    term = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: term.set())
    prof = Profiler(SessionStore(**spec.store), spec.options, first_phase="starting session process")
    hook = _load_hook(spec.hook, prof)
    server = SessionServer(prof, hook)
    prof.start()
    orphaned = _serve_requests(conn, server, term)
    _end(prof, spec, orphaned, conn)


def _serve_requests(conn: Any, server: SessionServer, term: threading.Event | None = None) -> bool:
    """Answer requests until ``close``; True when the UI process vanished (orphaned)."""
    prof = server.prof
    while True:
        if term is not None and term.is_set():
            term.clear()
            threading.Thread(target=prof.stop, daemon=True).start()
        try:
            if not conn.poll(0.2):
                continue
            req = conn.recv()
        except (EOFError, OSError):
            return True  # the UI process is gone without saying goodbye
        op, args = req[0], req[1:]
        if op == "close":
            _send(conn, ("ok", None))
            return False
        t0 = time.thread_time()  # answering (reply pickled in send) counts as tuiprof's own
        try:
            reply = ("ok", server.handle(op, *args))
        except Exception as exc:
            reply = ("err", one_line(exc))
        sent = _send(conn, reply)
        prof.serve_s += time.thread_time() - t0
        if not sent:
            return True


def _end(prof: Profiler, spec: SessionSpec, orphaned: bool, conn: Any) -> None:
    prof.stop()
    if orphaned and spec.orphan_snapshot_dir:
        _orphan_snapshot(prof, spec.orphan_snapshot_dir)
    try:
        conn.close()
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


def _serve_program(conn: Any, spec: SessionSpec) -> None:
    """Run the program on this (main) thread; serve the UI from another until it closes."""
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
                             tee=False, relayed=bool(relayed), meta=prog.get("meta"))
    server = SessionServer(prof, _load_hook(spec.hook, prof), program=session)
    try:
        session.start()
        started = True
    except Exception as exc:  # the UI shows why; the process still answers it
        prof.status.state = "error"
        prof.status.message = f"could not start the program: {one_line(exc)}"
        started = False

    def serve_ui() -> None:
        _end(prof, spec, _serve_requests(conn, server), conn)

    threading.Thread(target=serve_ui, name="tuiprof-serve", daemon=True).start()
    if started:
        _keep_on_exit(session, server)
    if started:
        try:
            result = session.run()
        except KeyboardInterrupt:  # a forwarded Ctrl-C that came just as the program ended
            result = ProgramResult(128 + signal.SIGINT, "interrupted")
        except SessionStop:  # a stop that came just as the program ended
            result = ProgramResult(128 + signal.SIGTERM, "stopped")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.finish(result, keep_capture=True)
    while True:  # the serving thread ends the process (q, or the UI process gone)
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
