"""A live session in its own process, mirrored into the UI process (no shared GIL)."""
from .client import RemoteControl, SessionGone
from .mirror import Mirror

__all__ = ["RemoteControl", "SessionGone", "Mirror"]
