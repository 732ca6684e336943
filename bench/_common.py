"""Helpers shared by the benchmarks: the repository's paths, the test suite's GPU recordings,
resident memory, and key-to-handler latency of a running app.

Scripts under ``bench/overhead``, ``bench/verify`` and ``bench/probes`` put the repository root
on ``sys.path`` and import it as ``bench._common``."""
from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The real H100 recordings the tests replay (tests/data/README.md)
RECORDINGS = REPO / "tests" / "data"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def recording(mode: str) -> Path:
    """The H100 recording of qwen3-0.6b in ``mode`` (eager or compiled), 64 decode steps."""
    return RECORDINGS / f"qwen3-0.6b_{mode}_decode64.json.gz"


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident memory of process ``pid`` in MiB (None once it has gone)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE / (1024 * 1024)
    except OSError:
        return None


class KeyTimer:
    """Times ``s`` (sort the kernel table: cheap, harmless) from key event to handler."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.acted: list[float] = []
        # the kernels pane owns its keys: the app runs a pane's key through action_pane
        orig = app.action_pane

        @functools.wraps(orig)   # Textual passes an action as many arguments as it takes
        def timed(*args):
            self.acted.append(time.perf_counter())
            return orig(*args)
        app.action_pane = timed

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
