"""A tensor-parallel rank's place in torch.distributed: process group, device, clock pairs.

A rank finds its identity in the environment that ``torchrun`` and tuiprof's own launcher
(:mod:`tuiprof.sessions.rank_launcher`) both set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and joins the default process group with ``env://``: NCCL on
CUDA (one GPU per rank, ``cuda:LOCAL_RANK``), gloo on the CPU. A second, gloo group carries the
engine's lockstep commands (:mod:`tuiprof.engine.lockstep`) on the host, never on a GPU stream.
So a program started by ``torchrun`` and a rank started by ``tuiprof --tp N`` are the same kind
of rank.
"""
from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import TuiprofError

# Every rank's environment: NVLink SHARP / multicast stays off (NCCL, symmetric memory, NVSHMEM).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in the job (from the torchrun environment)."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls) -> "RankInfo | None":
        """The environment's rank, or None outside a distributed job."""
        env = os.environ
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return None
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local = int(env.get("LOCAL_RANK", rank))
        except ValueError:
            raise TuiprofError("RANK, WORLD_SIZE and LOCAL_RANK must be integers") from None
        return cls(rank, world, local)


@dataclass
class TPGroup:
    """This rank's process groups and device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    group: object                 # the default (world) group: NCCL or gloo
    side: object                  # gloo group for host-side coordination
    clock_sync: list = field(default_factory=list)

    def info(self) -> dict:
        """Facts for the session's meta (snapshots, headers)."""
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "tp": self.world_size, "backend": self.backend, "device_index": self.local_rank,
                "clock_sync": list(self.clock_sync)}


_GROUP: TPGroup | None = None


def tp_group(device: str | None = None, timeout_s: float | None = None) -> TPGroup:
    """Join the default process group from the environment (once per process) and return it.

    ``device``: ``cuda``/``cuda:N``/None (a GPU when present: ``cuda:LOCAL_RANK``) or ``cpu``.
    """
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    import torch
    import torch.distributed as dist

    info = RankInfo.from_env()
    if info is None:
        raise TuiprofError("--tp needs a distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, "
                           "MASTER_PORT): start it with `tuiprof --tp N` or torchrun")
    os.environ.update(NO_MULTICAST_ENV)
    cuda = (device or "").startswith("cuda") or (not device and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available():
            raise TuiprofError("--tp on CUDA, but torch sees no GPU; use --device cpu (gloo)")
        if info.local_rank >= torch.cuda.device_count():
            raise TuiprofError(f"rank {info.rank} wants GPU {info.local_rank}, but only "
                               f"{torch.cuda.device_count()} are visible: use --tp "
                               f"{torch.cuda.device_count()} or fewer")
        torch.cuda.set_device(info.local_rank)
        dev = f"cuda:{info.local_rank}"
    else:
        dev = "cpu"
        if "OMP_NUM_THREADS" not in os.environ:
            # N ranks share the host's cores (torchrun caps each at one thread for the same
            # reason): without a cap every rank starts a thread per core and they thrash.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // info.world_size))
    backend = "nccl" if cuda else "gloo"
    timeout = _dt.timedelta(seconds=timeout_s or float(os.environ.get("TUIPROF_TP_TIMEOUT_S",
                                                                      DEFAULT_TIMEOUT_S)))
    if not dist.is_initialized():
        kw = {"device_id": torch.device(dev)} if cuda else {}
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size,
                                timeout=timeout, **kw)
    side = dist.new_group(backend="gloo", timeout=timeout)
    _GROUP = TPGroup(info.rank, info.world_size, info.local_rank, backend, dev,
                     dist.group.WORLD, side)
    return _GROUP


def record_clock(group: TPGroup, clock: Callable[[], int], at: str) -> dict:
    """After a barrier of all ranks: this rank's session clock (CUPTI's when it runs) and the
    host's ``CLOCK_REALTIME``, read back to back. Ranks compare these pairs to align their
    timelines (:mod:`tuiprof.store.rank_set`)."""
    import torch.distributed as dist

    dist.barrier(group=group.side)
    pair = {"at": at, "clock_ns": int(clock()), "unix_ns": time.time_ns()}
    group.clock_sync.append(pair)
    return pair


__all__ = ["RankInfo", "TPGroup", "tp_group", "record_clock", "NO_MULTICAST_ENV"]
