"""A tensor-parallel session: N rank processes, launched and watched from the UI process.

Each rank is a session process like the single-GPU one (:func:`~tuiprof.sessions.session_process.
serve`: engine, collectors and its own store) and joins torch.distributed from the environment
that ``torchrun`` would give it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), so the rank side is the same whoever launched it.

Launcher: ``torch.multiprocessing.start_processes`` (what ``torch.multiprocessing.spawn`` runs),
not the elastic agent behind ``torchrun``. The agent owns its workers: it restarts or tears
down the whole group when one fails and reports only exit codes, which would lose the other
ranks' data and leave no channel to send keys. Here the UI process holds each rank's process
handle and a connection to its socket (a :class:`~tuiprof.sessions.client.RemoteControl` per rank), sees a
death at once, stops the other ranks cleanly (their collectors flush, their data is fetched)
and keeps everything measured. A rank that fails outside its session loop leaves its
traceback in its log file, which the one-line message names.

Keys go to rank 0 only: the ranks' engines agree on rank 0's commands at the same token
boundaries (:mod:`tuiprof.engine.lockstep`).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import traceback
from typing import Any

from ..control import SessionControl, SourceStatus
from ..engine.distributed import NO_MULTICAST_ENV
from ..spec import ProfilerOptions
from ..store.rank_set import RanksView
from .client import RemoteControl, SessionGone, new_log_path
from .runtime import new_session_dir
from .session_process import serve

WATCH_S = 0.25        # how often the UI process looks at every rank
FIXED_BATCH = "tensor-parallel ranks keep the batch they started with; start with --batch N"


def free_port() -> int:
    """A TCP port free on this host now (the rendezvous of the ranks' process group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, addr: str = "127.0.0.1") -> dict:
    """The environment of rank ``rank``: torchrun's variables and no NVLink multicast."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            **NO_MULTICAST_ENV}


def nvml_index(local_rank: int) -> int:
    """The NVML index of ``cuda:local_rank`` (NVML ignores ``CUDA_VISIBLE_DEVICES``)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if local_rank < len(visible) and visible[local_rank].isdigit():
        return int(visible[local_rank])
    return local_rank


def _rank_main(index: int, specs: list) -> None:
    """A rank's process (``torch.multiprocessing`` target): serve its store at its socket."""
    try:
        serve(specs[index])
    except BaseException:
        traceback.print_exc()  # into the rank's log (serve redirected stderr there first)
        raise


class RankSetControl(SessionControl):
    """A live tensor-parallel session of ``world_size`` ranks (see the module docstring).

    Panes read one rank at a time (:meth:`rank_store`); the all-ranks screen and the exports
    read :meth:`views`. ``status`` is rank 0's, or the first failure of any rank.
    """

    def __init__(self, options: ProfilerOptions, store_kwargs: dict | None, world_size: int, *,
                 orphan_snapshot_dir: str | None = None, reply_timeout: float = 60.0,
                 hook: str | None = None) -> None:
        self.world_size = world_size
        self.ranks: list[RemoteControl] = []
        for r in range(world_size):
            opts = dataclasses.replace(options, device_index=nvml_index(r),
                                       engine=dataclasses.replace(options.engine, tp=world_size))
            self.ranks.append(RemoteControl(opts, store_kwargs,
                                            orphan_snapshot_dir=orphan_snapshot_dir,
                                            reply_timeout=reply_timeout, hook=hook))
        self.store = self.ranks[0].store  # type: ignore[assignment]
        self.status = SourceStatus(state="loading", live=True,
                                   mode=options.engine.mode,
                                   message=f"starting {world_size} rank processes")
        self.failure: str | None = None
        self.launcher = "torch.multiprocessing.start_processes (spawn)"
        self._context: Any = None
        self._dir: Any = None
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        """Spawn every rank (they load their shard and start generating in lockstep)."""
        import torch.multiprocessing as tmp


        port = free_port()
        _sid, self._dir = new_session_dir("tp")
        specs = []
        for r, ctl in enumerate(self.ranks):
            ctl.log_path = new_log_path(f"rank{r}-")
            ctl.socket_path = str(self._dir / f"rank{r}.sock")
            specs.append(ctl.spec(rank_env(r, self.world_size, port)))
        self._context = tmp.start_processes(_rank_main, args=(specs,), nprocs=self.world_size,
                                            join=False, start_method="spawn")
        for proc, ctl in zip(self._context.processes, self.ranks):
            ctl.watch(proc, ctl.socket_path)
        self._watcher = threading.Thread(target=self._watch, name="tuiprof-ranks", daemon=True)
        self._watcher.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every rank (at the same agreed step) and fetch the last data of each."""
        self._each(lambda c: c.stop(timeout))
        self._update_status()

    def close(self) -> None:
        self._closing.set()
        self._each(lambda c: c.close())
        if self._dir is not None:
            import shutil
            shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def busy(self) -> bool:
        return any(c.busy for c in self.ranks)

    def _each(self, fn) -> None:
        threads = [threading.Thread(target=fn, args=(c,), daemon=True) for c in self.ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ------------------------------------------------------------------ readers
    def rank_store(self, rank: int) -> Any:
        """Rank ``rank``'s mirrored store (``view``, ``meta``, ``reset``)."""
        return self.ranks[rank].store

    def rank_status(self, rank: int) -> SourceStatus:
        return self.ranks[rank].status

    def views(self, raw: bool = False, raw_tokens: int | None = None) -> RanksView:
        """Every rank's view; ``raw=True`` waits for each rank's records (worker threads)."""
        views: list = [None] * self.world_size

        def one(r: int) -> None:
            views[r] = self.ranks[r].view(raw, raw_tokens)

        if raw:
            threads = [threading.Thread(target=one, args=(r,), daemon=True)
                       for r in range(self.world_size)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for r in range(self.world_size):
                one(r)
        return RanksView(tuple(views), {"world_size": self.world_size, "launcher": self.launcher,
                                        "failure": self.failure})

    # ------------------------------------------------------------------ keys
    def toggle_mode(self) -> str:
        if self.failure:
            return "the ranks were stopped after a failure"
        return self.ranks[0].toggle_mode() + " (all ranks)"

    def toggle_pause(self) -> str:
        if self.failure:
            return "the ranks were stopped after a failure"
        return self.ranks[0].toggle_pause() + " (all ranks)"

    def reset(self) -> str:
        for c in self.ranks:
            c.reset()
        return "statistics reset (all ranks)"

    def change_batch(self, up: bool) -> str:
        return FIXED_BATCH   # the ranks agree on mode and pause, not on a new batch (yet)

    def disabled_actions(self) -> dict[str, str]:
        return {"batch_up": FIXED_BATCH, "batch_down": FIXED_BATCH}

    # ------------------------------------------------------------------ watching
    def _watch(self) -> None:
        while not self._closing.wait(WATCH_S):
            if self.failure is None:
                why = self._first_failure()
                if why is not None:
                    self._fail(*why)
            self._update_status()

    def _first_failure(self) -> tuple[int, str] | None:
        """(rank, why) of a rank that died or failed; a death wins over an error, since a
        dead peer makes the others' collectives fail too."""
        dead = self._dead()
        if dead is not None:
            return dead
        for r, c in enumerate(self.ranks):
            if c.status.state == "error":
                time.sleep(2 * WATCH_S)  # did a peer die and cause this?
                return self._dead() or (r, c.status.message)
        return None

    def _dead(self) -> tuple[int, str] | None:
        for r, c in enumerate(self.ranks):
            proc = c._proc
            if proc is not None and not proc.is_alive():
                return r, self._death(r, proc.exitcode)
        return None

    def _death(self, rank: int, code: int | None) -> str:
        if code is not None and code < 0:
            import signal
            try:
                return f"process killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"process killed by signal {-code}"
        return f"process ended (exit code {code}; its traceback is in the log)"

    def _fail(self, rank: int, why: str) -> None:
        why = " ".join(why.split())
        log = self.ranks[rank].log_path
        self.failure = (f"rank {rank}: {why}; the other ranks were stopped and everything "
                        f"measured is kept (log: {log})")
        survivors = [c for i, c in enumerate(self.ranks) if i != rank]

        def stop(c: RemoteControl) -> None:
            try:
                c.stop(timeout=3.0)   # its engine may wait in a collective: do not wait long
            except SessionGone:
                pass

        threads = [threading.Thread(target=stop, args=(c,), daemon=True) for c in survivors]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)

    def _update_status(self) -> None:
        lead = self.ranks[0].status
        st = dataclasses.replace(lead, extra=dict(lead.extra))
        if self.failure:
            st.state, st.live, st.message = "error", False, self.failure
        else:
            states = [c.status.state for c in self.ranks]
            for state in ("loading", "compiling"):  # the slowest rank sets the pace
                if state in states and st.state != state:
                    st.state = state
                    st.message = f"rank {states.index(state)} {state}"
        self.status = st


__all__ = ["RankSetControl", "FIXED_BATCH", "rank_env", "free_port", "nvml_index"]
