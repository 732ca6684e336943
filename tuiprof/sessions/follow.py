"""Following the processes a profiled program starts (multiprocessing, torch.multiprocessing,
subprocess running Python, torchrun's agent and workers, at any depth).

How a process is reached: the session process puts a directory on ``PYTHONPATH`` whose only
file is a ``sitecustomize.py`` (``tuiprof/sessions/boot``), and names the session's socket in
``TUIPROF_FOLLOW``. Python runs ``sitecustomize`` at interpreter start, before the program's
main module; ours first runs the program's own ``sitecustomize`` if there is one (so nothing is
shadowed), takes its directory off ``sys.path`` again, and, when ``TUIPROF_FOLLOW`` is set,
calls :func:`start`. Forked children (no new interpreter) are reached by
``os.register_at_fork``.

What a followed process does, in order of cost:

* at start (this module: standard library only, a millisecond): registers with the session
  (pid, parent, command line) over the session's socket and keeps that connection open (the
  session learns of its end when it closes), points Python's ``faulthandler`` at a file of
  the session (a segfault is reported by name), and waits for ``torch``;
* when it imports ``torch``: starts its own process session (store, step sources, server:
  :mod:`tuiprof.sessions.child_session`) and tells the session where it serves;
* when it initializes CUDA (``torch.cuda._lazy_init``, before the first CUDA call): starts
  CUPTI and NVML;
* at exit (``atexit``, ``os._exit``): closes its last step, flushes CUPTI, and waits (at most
  :data:`EXIT_WAIT_S`) until the session has fetched it.

Nothing here changes what the program does: no output, no new thread until torch is
imported, ``sys.path`` and ``sys.modules['sitecustomize']`` as they would be. A process started
with ``-S``, ``-E`` or ``-I``, or with an environment that drops ``PYTHONPATH`` or
``TUIPROF_FOLLOW``, is not followed (docs/multi-gpu.md).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from .own_process import command_line, forget_in_fork

FOLLOW_ENV = "TUIPROF_FOLLOW"          # the session's socket: set, the process is followed
OPTIONS_ENV = "TUIPROF_FOLLOW_OPTIONS"  # JSON: what each followed process collects
BOOT_ENV = "TUIPROF_BOOT"              # the directory of tuiprof's sitecustomize (on PYTHONPATH)
ROOT_ENV = "TUIPROF_ROOT"              # where the tuiprof package is (for the boot hook)
EXIT_WAIT_S = 5.0                      # a process ending waits this long for its last fetch
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")

_LINK: "Link | None" = None
_MAIN: list = []        # the session process's own (ProgramSession, Server): a fork copies them


def follow_env(session_socket: str, options: dict, environ: dict | None = None) -> dict:
    """The variables that make a program's processes followed (the session process sets them
    before the program starts; children inherit them)."""
    env = os.environ if environ is None else environ
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [BOOT_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                         if p and p != BOOT_DIR]
    return {FOLLOW_ENV: session_socket, OPTIONS_ENV: json.dumps(options, sort_keys=True),
            BOOT_ENV: BOOT_DIR, ROOT_ENV: root, "PYTHONPATH": os.pathsep.join(path)}


def options() -> dict:
    try:
        opts = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    except ValueError:
        opts = {}
    return opts if isinstance(opts, dict) else {}


class Link:
    """This process's registration with the session: the open connection (its closing tells
    the session this process ended) and what it says before it ends."""

    def __init__(self, socket_path: str, forked_from: int | None = None) -> None:
        from . import protocol  # noqa: PLC0415 - standard library only

        self.socket_path = socket_path
        self.directory = os.path.dirname(socket_path)
        self.pid = os.getpid()
        self.forked_from = forked_from
        self.session: Any = None          # the ChildSession, once torch is imported
        self.cupti_allowed = True         # False in a fork child of a process whose CUPTI ran
        self.ended = False
        self._lock = threading.Lock()
        facts = {"pid": self.pid, "ppid": os.getppid(), "argv": command_line()[:64],
                 "cwd": _cwd(), "started_ns": time.time_ns()}
        if forked_from is not None:
            facts["forked_from"] = forked_from
        self.client = protocol.Client.unix(socket_path, role="child", timeout=5.0, **facts)
        answer = self.client.hello if isinstance(self.client.hello, dict) else {}
        self.index = answer.get("index")

    def tell(self, op: str, *args: Any, timeout: float = EXIT_WAIT_S) -> Any:
        """One request to the session (None when it cannot be reached: the process goes on
        without it)."""
        from . import protocol  # noqa: PLC0415

        with self._lock:
            if self.client is None:
                return None
            try:
                return self.client.request(op, *args, timeout=timeout)
            except protocol.ProtocolError:
                self.client = None
                return None
            except protocol.RemoteError:
                return None

    def drop(self) -> None:
        """Forget the connection without a word (a fork child's copy of its parent's)."""
        c, self.client = self.client, None
        if c is not None:
            try:
                c.sock.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------- start
def start() -> None:
    """Called by the boot ``sitecustomize`` in every new interpreter of a followed program."""
    global _LINK
    path = os.environ.get(FOLLOW_ENV)
    if not path or _LINK is not None:
        return
    try:
        _LINK = Link(path)
    except Exception:
        return   # the session is gone (or refuses): the program runs as it would
    _arm(_LINK)


def follow_from_main(env: dict, session: Any = None, server: Any = None) -> None:
    """In the session process itself, before the program runs: its children are followed
    (they inherit ``env``), and its own forks are handled like any followed process's
    (``session`` and ``server``: what a fork child must let go of)."""
    os.environ.update(env)
    _MAIN[:] = [session, server]
    _hooks()


_HOOKED: list = []   # the process-wide hooks are in (a fork child inherits them)


def _hooks() -> None:
    """Once per process tree: fork children, the end of the process, ``import torch``."""
    if _HOOKED:
        return
    _HOOKED.append(True)
    try:
        os.register_at_fork(after_in_child=_forked)
    except AttributeError:
        pass
    import atexit  # noqa: PLC0415

    atexit.register(_at_exit)
    _wrap_exit()
    from ..program.import_hooks import PostImport  # noqa: PLC0415 - standard library only

    if "torch" not in sys.modules:
        sys.meta_path.insert(0, PostImport({"torch": _torch_imported}))


def _arm(link: Link) -> None:
    _crash_file(link)
    _hooks()
    if "torch" in sys.modules:
        _torch_imported(sys.modules["torch"])


def _crash_file(link: Link) -> None:
    """A fatal signal (segfault, abort) is written to a file of the session, which names it
    in one line; a program that enabled faulthandler itself keeps its own."""
    import faulthandler  # noqa: PLC0415

    if faulthandler.is_enabled():
        return
    try:
        fd = os.open(os.path.join(link.directory, f"crash-{link.pid}.txt"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        fh = os.fdopen(fd, "w")
        faulthandler.enable(file=fh, all_threads=False)
        link._crash = fh  # kept open for the process's life  # type: ignore[attr-defined]
    except (OSError, ValueError, RuntimeError):
        pass


def _torch_imported(torch: Any) -> None:
    """``import torch`` has run: this process gets its own session (CUPTI waits for CUDA)."""
    link = _LINK
    if link is None or link.session is not None or link.client is None:
        return
    try:
        from .child_session import ChildSession  # noqa: PLC0415

        link.session = ChildSession(link, options(), torch)
        link.session.start()
    except Exception as exc:   # never the program's problem: it runs unprofiled
        link.session = None
        link.tell("note", f"not profiled: {type(exc).__name__}: {exc}"[:300])


# ---------------------------------------------------------------------------- forks
def _forked() -> None:
    """A fork child: its copy of the parent's registration and session is the parent's (their
    threads did not survive the fork). It registers as a process of its own; it traces kernels
    only if its parent never started CUPTI (a process that initialized CUDA cannot use it in a
    fork child anyway)."""
    global _LINK
    parent = _LINK
    parent_pid = parent.pid if parent is not None else os.getppid()
    cupti_ran = False
    if parent is not None:
        parent.drop()
        if parent.session is not None:
            cupti_ran = parent.session.forget_in_fork()
        cupti_ran = cupti_ran or not parent.cupti_allowed
    else:   # the session process itself: its CUPTI runs before the program
        cupti_ran = True
        session, server = (_MAIN + [None, None])[:2]
        if server is not None:
            server.forget()
        if session is not None:
            forget_in_fork(session)
    path = os.environ.get(FOLLOW_ENV)
    _LINK = None
    if not path:
        return
    try:
        link = Link(path, forked_from=parent_pid)
    except Exception:
        return
    link.cupti_allowed = not cupti_ran
    _LINK = link
    _crash_file(link)
    if "torch" in sys.modules:
        _torch_imported(sys.modules["torch"])


# ---------------------------------------------------------------------------- the end
def _at_exit() -> None:
    _end(None)


def _end(status: int | None, how: str | None = None) -> None:
    """The process ends: its session flushes, then the session is told (and fetches it),
    with how it ends where the program said so (:func:`end_now`)."""
    link = _LINK
    if link is None or link.ended or link.pid != os.getpid():
        return
    link.ended = True
    if link.session is not None:
        try:
            link.session.finish(status)
        except Exception:
            pass
    if how is None:
        link.tell("exiting", status, timeout=EXIT_WAIT_S)
    else:
        link.tell("exiting", status, how, timeout=EXIT_WAIT_S)


def end_now(how: str) -> None:
    """The program's own shutdown of this process has begun, and may end it with a signal
    (vLLM stops its engine core with SIGKILL when it is slow to go): close the last step,
    flush and be fetched now, saying how it ends (``how``), so that the process reads as
    ended, whatever ends it, with nothing measured lost."""
    _end(None, str(how)[:200])


def _wrap_exit() -> None:
    """``os._exit`` skips atexit: the process's last steps are flushed and fetched first
    (multiprocessing's fork children end this way too)."""
    real = os._exit
    if getattr(real, "__tuiprof__", False):
        return

    def _exit(status: int = 0, _real: Any = real) -> None:
        try:
            _end(int(status))
        except BaseException:
            pass
        _real(status)

    _exit.__tuiprof__ = True  # type: ignore[attr-defined]
    os._exit = _exit


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:
        return ""


__all__ = ["FOLLOW_ENV", "OPTIONS_ENV", "BOOT_ENV", "BOOT_DIR", "follow_env", "start",
           "follow_from_main", "Link", "options"]
