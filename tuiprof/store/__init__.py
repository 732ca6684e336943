"""Session store: bounded, thread-safe, the single source of truth of a session."""
from .records import COMPILED, DECODE, EAGER, PREFILL
from ..phases import OTHER
from .session import NVML, PROGRAM_CONFIG, RECORDS, SessionStore
from .view import ConfigData, KernelAggregate, StoreView, TokenRow, ViewCursor, compose_view, config_order
from .stats import RunningStats

__all__ = ["SessionStore", "StoreView", "TokenRow", "KernelAggregate", "RunningStats",
           "ViewCursor", "ConfigData", "compose_view", "config_order", "OTHER", "PROGRAM_CONFIG",
           "PREFILL", "DECODE", "EAGER", "COMPILED", "NVML", "RECORDS"]
