"""Sessions as processes: a live session in its own process, mirrored into the UI process (no
shared GIL); its protocol, attach and detach, followed child processes, keepers and fleets.

The names below load on first use: a followed child process imports this package's
standard-library modules (``protocol``, ``runtime``, ``follow``) at interpreter start, and
must not pay for the client's imports."""
from __future__ import annotations

from .._lazy import lazy_face

__all__, __getattr__ = lazy_face(__name__, {"RemoteControl": "client", "SessionGone": "client",
                                            "Mirror": "mirror"})
