"""Session store: bounded, thread-safe, the single source of truth of a session."""
from .records import COMPILED, DECODE, EAGER, PREFILL
from .session import OTHER, KernelAggregate, SessionStore, StoreView, TokenRow
from .stats import RunningStats

__all__ = ["SessionStore", "StoreView", "TokenRow", "KernelAggregate", "RunningStats",
           "OTHER", "PREFILL", "DECODE", "EAGER", "COMPILED"]
