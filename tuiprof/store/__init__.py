"""Session store: bounded, thread-safe, the single source of truth of a session."""
from .records import COMPILED, DECODE, EAGER, PREFILL
from .session import OTHER, KernelAggregate, SessionStore, StoreView, TokenRow, ViewCursor
from .stats import RunningStats

__all__ = ["SessionStore", "StoreView", "TokenRow", "KernelAggregate", "RunningStats",
           "ViewCursor", "OTHER", "PREFILL", "DECODE", "EAGER", "COMPILED"]
