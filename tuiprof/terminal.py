"""The process's terminal, for every layer that may outlive it."""
from __future__ import annotations

import os


def detach_terminal() -> None:
    """After SIGHUP the terminal is gone: point stdin/stdout/stderr at /dev/null so that the
    rest of the shutdown (snapshot, summary) does not fail on a dead terminal."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    except OSError:
        pass
