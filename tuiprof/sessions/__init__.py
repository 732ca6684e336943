"""Sessions as processes: a live session in its own process, mirrored into the UI process (no
shared GIL); its protocol, attach and detach, followed child processes, keepers and fleets.

The names below load on first use: a followed child process imports this package's
standard-library modules (``protocol``, ``runtime``, ``follow``) at interpreter start, and
must not pay for the client's imports."""
from __future__ import annotations

from typing import Any

__all__ = ["RemoteControl", "SessionGone", "Mirror"]


def __getattr__(name: str) -> Any:
    if name in ("RemoteControl", "SessionGone"):
        from . import client
        return getattr(client, name)
    if name == "Mirror":
        from .mirror import Mirror
        return Mirror
    raise AttributeError(name)
