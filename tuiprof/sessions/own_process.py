"""What a process of a profiled program knows of itself, for its own session and for its
link to the session that follows it (:mod:`tuiprof.sessions.follow`): its command line as it
was started, and what a fork child undoes of the session it inherited. Standard library
only: a followed process imports it at interpreter start."""
from __future__ import annotations

import sys
from typing import Any


def command_line() -> list[str]:
    """This process's command line as it was started."""
    argv = getattr(sys, "orig_argv", None)
    if argv:
        return list(argv)
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)


def forget_in_fork(session: Any) -> None:
    """In a fork child, on its copy of the parent's program session: put back what its step
    sources patched, so that nothing calls into the parent's collectors (whose threads did
    not survive the fork, and whose CUPTI must not be touched here)."""
    for source in list(getattr(session, "sources", {}).values()):
        patches = getattr(source, "_patches", None)
        if patches is not None:
            try:
                patches.restore()
            except Exception:
                pass
    captures = getattr(session, "captures", None)
    if captures is not None:
        try:
            captures.uninstall()
        except Exception:
            pass
    marks = sys.modules.get("tuiprof.marks")
    if marks is not None:
        marks._sink = None
    session.running = False
