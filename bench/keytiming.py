"""Key → handler latency of a running app, for the benchmarks (soak, live UI, OOM).

The ``s`` key's action is wrapped to note when it runs; ``simulate_key`` posts the key as the
terminal driver does (``pilot.press`` would also wait for the whole process to go idle)."""
from __future__ import annotations

import asyncio
import time
from typing import Any


class KeyTimer:
    """Times ``s`` (sort the kernel table: cheap, harmless) from key event to handler."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.acted: list[float] = []
        orig = app.action_kernel_sort

        def timed():
            self.acted.append(time.perf_counter())
            return orig()
        app.action_kernel_sort = timed

    async def press(self, n: int, spacing: float = 0.1, timeout: float = 5.0) -> list[float]:
        """Press ``s`` ``n`` times; the latencies (ms) of the presses that were handled."""
        lat = []
        for _ in range(n):
            k, t = len(self.acted), time.perf_counter()
            self.app.simulate_key("s")
            while len(self.acted) == k and time.perf_counter() - t < timeout:
                await asyncio.sleep(0.001)
            if len(self.acted) > k:
                lat.append((self.acted[k] - t) * 1e3)
            await asyncio.sleep(spacing)
        return lat
