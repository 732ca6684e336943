"""Lockstep commands for tensor-parallel ranks: every rank switches, pauses and stops at the
same token boundary, or the ranks' collectives would no longer match and hang.

Keys reach rank 0 only. Every ``every`` token boundaries (the same ones on every rank: they
count the same steps) rank 0 broadcasts its wishes (mode, paused, stopped) over a gloo group
on the host, and every rank applies them there. Between these points a boundary costs one
integer increment; the broadcast itself is a few tens of microseconds on one host
(``stats``, docs/multi-gpu.md), once every 4 eager or 32 compiled tokens.
"""
from __future__ import annotations

import time

import torch

from ..phases import MODES as MODE_CODES
# Token boundaries between two agreements, per mode in effect: a key waits at most this many
# tokens (eager ~50 ms a token, compiled ~3 ms) and the broadcast stays off most tokens.
PERIOD = {"eager": 4, "compiled": 32}
PAUSE_POLL_S = 0.2     # while paused, rank 0 re-broadcasts this often (the others wait in it)


class Lockstep:
    """Rank 0's pending commands, agreed by all ranks at the same token boundaries."""

    def __init__(self, group: object, rank: int, world_size: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.every = PERIOD["eager"]
        self._count = 0
        self._buf = torch.zeros(3, dtype=torch.int64)
        self.stats = {"every_eager": PERIOD["eager"], "every_compiled": PERIOD["compiled"],
                      "agreements": 0, "total_us": 0.0, "max_us": 0.0}

    def set_mode(self, mode: str) -> None:
        """Every rank calls this at the same boundary (after an agreed switch)."""
        self.every = PERIOD.get(mode, PERIOD["eager"])
        self._count = 0

    def due(self) -> bool:
        """True at every ``every``-th boundary: the hot path between agreements."""
        self._count += 1
        if self._count < self.every:
            return False
        self._count = 0
        return True

    def agree(self, mode: str, paused: bool, stop: bool) -> tuple[str, bool, bool]:
        """Rank 0's (mode, paused, stop), on every rank (a broadcast over the gloo group)."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        buf = self._buf
        if self.rank == 0:
            buf[0] = MODE_CODES.index(mode) if mode in MODE_CODES else 0
            buf[1] = int(paused)
            buf[2] = int(stop)
        dist.broadcast(buf, src=0, group=self.group)
        us = (time.perf_counter() - t0) * 1e6
        st = self.stats
        st["agreements"] += 1
        st["total_us"] += us
        st["max_us"] = max(st["max_us"], us)
        return MODE_CODES[int(buf[0])], bool(buf[1]), bool(buf[2])


__all__ = ["Lockstep", "PERIOD", "PAUSE_POLL_S"]
