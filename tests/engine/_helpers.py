"""Helpers shared by the engine tests."""
from __future__ import annotations

import time

from tuiprof.engine.events import CollectingListener


def run_engine(adapter, prompt, **kwargs) -> CollectingListener:
    """Run an engine to completion on this thread and return what it reported."""
    from tuiprof.engine.generate import Engine

    listener = kwargs.pop("listener", None) or CollectingListener()
    engine = Engine(adapter, prompt, device="cpu", listener=listener, **kwargs)
    engine.run()
    assert engine.error is None, engine.error
    return listener


def wait_for(cond, timeout: float = 20.0) -> None:
    """Poll ``cond`` until true; fail the test after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for the engine")
        time.sleep(0.005)


class ActionListener(CollectingListener):
    """CollectingListener that can also call back into the engine at chosen token indices."""

    def __init__(self, actions: dict | None = None) -> None:
        super().__init__()
        self.actions = actions or {}

    def token_finished(self, ev) -> None:
        super().token_finished(ev)
        action = self.actions.get(ev.index)
        if action is not None:
            action()
