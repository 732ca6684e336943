"""A stand-in for cupti-python on a CPU: the CUPTI calls a collector makes while attached and
detached between bursts, with the thread each came from; any call between ``finalize`` and
the next registration fails, as a real one would initialize CUPTI again. The real cycle runs
on the H100 (tests/gpu/test_detach_gpu.py, tests/gpu/test_program_gpu.py)."""
from __future__ import annotations

import threading

from tuiprof.collect.cupti_collector import CuptiCollector
from tuiprof.store import SessionStore


class StandIn:
    """Records CUPTI calls; any call between finalize() and the next registration fails."""

    class ActivityKind:
        CONCURRENT_KERNEL, MEMCPY, MEMSET, MEMORY2, MARKER = 1, 2, 3, 4, 5

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.threads: list[tuple[str, str]] = []  # (call, thread name) of every switch
        self.finalized = False

    def _call(self, name: str) -> None:
        if self.finalized:
            raise AssertionError(f"CUPTI {name}() called while finalized")
        self.calls.append(name)

    def activity_register_callbacks(self, *cbs) -> None:
        self.finalized = False
        self.calls.append("register")
        self.threads.append(("register", threading.current_thread().name))

    def finalize(self) -> None:
        self._call("finalize")
        self.threads.append(("finalize", threading.current_thread().name))
        self.finalized = True

    def __getattr__(self, name):  # activity_enable, activity_flush_all, get_timestamp, ...
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a: self._call(name) or 0


def attached_collector(store: SessionStore | None = None, sample_every: int = 8,
                       markers=None) -> tuple[CuptiCollector, StandIn]:
    """A collector attached to the stand-in in bursts-only mode, without its consumer thread
    (the test drives everything)."""
    c = CuptiCollector(store or SessionStore(), sample_every=sample_every, api=False, raw=False,
                       markers=markers)
    cupti = StandIn()
    c._cupti = cupti
    c._attach()
    c.running = True
    c.bursts_only = True
    return c, cupti
