"""A rank-process hook (``RankSetControl(hook="sessions.tp_bursts_hook:make")``) that stands in
for CUPTI on a CPU, where no kernel records exist: each real gloo all-reduce of the engine's
tensor-parallel layers becomes an NCCL-named kernel record spanning the call (the time this
rank spent in the collective, its wait included, as an NCCL kernel's), the host time between
two of them a compute kernel, and the call's start its launch record. Only the steps of
sampling bursts are "traced", and each rank hands its records over with its own lag: rank 1's
a few steps late and last step first, as CUPTI buffers complete when they will."""
from __future__ import annotations

import os
import threading
import time

NCCL = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
PERIOD, FIRST, BURST = 24, 3, 4      # decode steps FIRST..FIRST+BURST-1 of every PERIOD
LAG = {0: 0, 1: 3}                   # steps before a rank's records of a traced step arrive


def _k(name: str, start: int, end: int, corr: int) -> tuple:
    return ("K", name, start, end, 1, 1, 1, 128, 1, 1, 32, 0, 7, corr, 0)


class BurstRecords:
    def __init__(self, prof) -> None:
        import torch.distributed as dist

        self.prof = prof
        self.rank = int(os.environ.get("RANK", "0"))
        self.calls: list = []
        self.pending: list = []          # (due token, [records]) per traced step
        self.corr = 0
        self._lock = threading.Lock()
        real = dist.all_reduce

        def all_reduce(tensor, *args, **kw):
            t0 = time.time_ns()
            out = real(tensor, *args, **kw)
            with self._lock:
                self.calls.append((t0, time.time_ns()))
            return out

        dist.all_reduce = all_reduce
        self._finished = prof.token_finished
        prof.token_finished = self.token_finished

    def token_finished(self, ev) -> None:
        self._finished(ev)
        with self._lock:
            calls, self.calls = self.calls, []
        traced = ev.phase == "decode" and FIRST <= ev.index % PERIOD < FIRST + BURST
        if traced and calls:
            recs, prev = [], ev.start_ns
            for t0, t1 in calls:
                self.corr += 2
                recs.append(("R", "cudaLaunchKernel_v7000", prev, prev + 1000, self.corr - 1))
                recs.append(_k(GEMM, prev + 2000, max(prev + 3000, t0 - 1000), self.corr - 1))
                recs.append(("R", "cudaLaunchKernel_v7000", t0 - 500, t0, self.corr))
                recs.append(_k(NCCL, t0, t1, self.corr))
                prev = t1
            due = ev.index + LAG.get(self.rank, 0)
            if self.rank == 1:   # a burst's steps arrive last one first on this rank
                due = (ev.index - ev.index % PERIOD) + FIRST + BURST - 1 + LAG[1] + \
                      (FIRST + BURST - 1 - ev.index % PERIOD)
            self.pending.append((due, recs))
        ready = [r for d, r in self.pending if d <= ev.index]
        self.pending = [(d, r) for d, r in self.pending if d > ev.index]
        for recs in ready:
            self.prof.store.add_records(recs)


def make(prof):
    return BurstRecords(prof)
