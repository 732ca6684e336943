"""The session of one process of a profiled program that tuiprof did not start itself: its own
Profiler, store, step sources and server (:mod:`tuiprof.sessions.follow` says when it starts).

A :class:`ChildSession` is a :class:`~tuiprof.program.program_session.ProgramSession` whose
program is already running (Python runs it, not tuiprof):

* it starts when the process imports ``torch`` (store, step sources, server at
  ``p<pid>.sock`` in the session's directory), and tells the session where it serves;
* its collectors (CUPTI, NVML) start when the process initializes CUDA, just before
  ``torch.cuda._lazy_init`` does: a process that never uses CUDA (a tokenizer worker, a
  compile worker, multiprocessing's helpers) costs no CUPTI, and its store stays quiet; the
  time windows that stand in for steps start then too;
* ``torch.distributed.init_process_group`` is wrapped: when the process joins a job, its
  rank, world size, local rank, backend and a clock pair go into its store's metadata (the
  ranks of one job are then compared like ``--tp`` ranks);
* the program's output is not captured here: its file descriptors are the session process's
  (inherited), whose capture keeps every line in the program's log.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from .. import __version__
from ..collect.device import rank_facts
from ..profiler import Profiler
from ..spec import ProfilerOptions
from ..program.launch import ProgramResult, ProgramSpec
from ..program.output import clean_line
from ..program.program_session import ProgramSession
from ..program.windows_steps import WindowSteps
from ..store import SessionStore
from ..store.rank_set import process_name
from . import protocol
from .own_process import command_line, forget_in_fork
from .server import Life, SessionServer, StoreConnection


def profiler_options(opts: dict, cupti_allowed: bool) -> ProfilerOptions:
    """A followed process collects what the session process does (``tuiprof run``'s options,
    handed down in the environment)."""
    se = opts.get("sample_every", "auto")
    return ProfilerOptions(cupti=bool(opts.get("cupti", True)) and cupti_allowed,
                           nvml=bool(opts.get("nvml", True)),
                           nvml_hz=float(opts.get("nvml_hz", 10.0)), sample_every=se,
                           alloc_every=opts.get("alloc_every", "auto"),
                           compiled_api_kinds_stay_on=False,
                           detach_between_bursts=bool(opts.get("detach_between_bursts", True)))


def gpu_index() -> int:
    """The NVML index of the GPU this process uses: ``cuda:LOCAL_RANK`` (torchrun and most
    launchers), else ``cuda:0``, through ``CUDA_VISIBLE_DEVICES`` (NVML ignores it)."""
    try:
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        local = 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if local < len(visible) and visible[local].isdigit():
        return int(visible[local])
    return local


class ChildSession(ProgramSession):
    """See the module docstring."""

    def __init__(self, link: Any, opts: dict, torch: Any) -> None:
        argv = command_line()
        self.link = link
        self.torch = torch
        self.cupti_started = False
        self._cuda_lock = threading.Lock()
        self._saved: list[tuple[Any, str, Any]] = []
        self._srv: protocol.Server | None = None
        spec = ProgramSpec("path", argv[1] if len(argv) > 1 else "python", tuple(argv[2:]),
                           argv[0] if argv else "python",
                           label=child_name(argv, link.forked_from))
        store = SessionStore(ring_tokens=int(opts.get("ring_tokens", 64)))
        prof = Profiler(store, profiler_options(opts, link.cupti_allowed))
        sources = {k: v for k, v in (opts.get("sources") or {}).items()}
        super().__init__(prof, spec, os.devnull, options=sources, tee=False)
        self.socket_path = os.path.join(link.directory, f"p{os.getpid()}.sock")

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Store, step sources (windows wait for CUDA) and the server; no collector yet."""

        prof, store = self.prof, self.prof.store
        argv = [clean_line(a) for a in command_line()[:64]]
        store.meta.update({
            "source": "program", "model": self.spec.name, "weights": "the program's",
            "program": {"argv": argv, "name": self.spec.name, "running": True},
            "process": {"pid": os.getpid(), "ppid": os.getppid(), "argv": argv,
                        "forked_from": self.link.forked_from, "followed": True},
            "window_ms": self.window_ms, "tuiprof": _version(),
        })
        store.meta.update(rank_facts())
        job = _job_key()
        if job:
            store.meta["job"] = job
        if not self.link.cupti_allowed:
            store.set_collector("cupti", False, "a fork child of a process whose CUPTI ran: "
                                "kernels are not traced here (nor can CUDA run here)")
        for name, source in list(self.sources.items()):
            if isinstance(source, WindowSteps):
                continue   # windows only once the process uses CUDA
            self._install(name, source)
        self.windows = self.sources.pop("windows", None)
        self.recorder.enabled = frozenset(self.sources) | ({"windows"} if self.windows else set())
        self._patch_torch()
        server = SessionServer(prof, program=self)
        self._srv = protocol.Server(lambda: StoreConnection(server, Life()), self.socket_path,
                                    name="tuiprof-child")
        self._srv.start()
        self.running = True
        prof.status.state = "running"
        prof.status.message = f"{self.spec.name} (pid {os.getpid()}) followed"
        prof._t_start = time.perf_counter()
        self.link.tell("serving", self.socket_path, self.spec.name, timeout=5.0)

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, new)

    def _patch_torch(self) -> None:
        torch = self.torch
        cuda = getattr(torch, "cuda", None)
        lazy = getattr(cuda, "_lazy_init", None)
        if lazy is not None:
            def _lazy_init(*a: Any, _orig: Any = lazy, **kw: Any) -> Any:
                if not self.cupti_started:
                    self.cuda_starting()
                return _orig(*a, **kw)
            self._patch(cuda, "_lazy_init", _lazy_init)
        dist = sys.modules.get("torch.distributed")
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        init = getattr(c10d, "init_process_group", None)
        if init is not None:
            def init_process_group(*a: Any, _orig: Any = init, **kw: Any) -> Any:
                out = _orig(*a, **kw)
                self.joined()
                return out
            for mod in (c10d, dist):
                if mod is not None and getattr(mod, "init_process_group", None) is init:
                    self._patch(mod, "init_process_group", init_process_group)

    def _unpatch(self) -> None:
        for owner, name, orig in reversed(self._saved):
            if orig is None:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, orig)
        self._saved.clear()

    # ------------------------------------------------------------------ CUDA, a job
    def cuda_starting(self) -> None:
        """Before this process's first CUDA initialization: CUPTI and NVML start, and time
        windows stand in for steps until something else marks them."""
        with self._cuda_lock:
            if self.cupti_started:
                return
            self.cupti_started = True
            prof = self.prof
            markers = next((m for m in (getattr(s, "markers", None)
                                        for s in self.sources.values()) if m is not None), None)
            prof.start_collectors(gpu_index(), markers=markers)
            prof.store.meta["cuda"] = True
            if markers is None and prof.allow_bursts_only(
                    self.captures.undroppable, lambda: self.captures.captures):
                self.captures.install()
            if self.windows is not None and not self.recorder.marked:
                self.sources["windows"] = self.windows
                self.windows.install()

    def joined(self) -> None:
        """``init_process_group`` returned: this process is a rank of a job."""
        try:
            dist = sys.modules["torch.distributed"]
            rank, world = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
        except Exception:
            return
        meta = self.prof.store.meta
        try:
            local = int(os.environ.get("LOCAL_RANK", rank))
        except ValueError:
            local = rank
        meta.update({"rank": rank, "world_size": world, "local_rank": local, "tp": world,
                     "backend": backend, "device_index": local,
                     "job": _job_key() or meta.get("job") or f"pg-{os.getppid()}"})
        # a clock pair without a barrier (the program's collectives stay its own): on one
        # host the ranks' clocks are one clock, which the pairs show (store.rank_set)
        pair = {"at": "init_process_group", "clock_ns": int(self.prof.clock()),
                "unix_ns": time.time_ns()}
        meta["clock_sync"] = [pair]
        self.prof.store.add_event("rank", f"joined {backend} as rank {rank} of {world}")

    # ------------------------------------------------------------------ the end
    def finish(self, status: int | None) -> None:  # type: ignore[override]
        """The process ends (``atexit`` or ``os._exit``): its last step closes and CUPTI is
        flushed; the server stays up for the session's last fetch."""
        if not self.running:
            return
        how = "exited" if status is None else "os._exit"
        result = ProgramResult(0 if status is None else int(status) & 0xFF, how)
        try:
            super().finish(result, keep_capture=True)
            self.prof.status.message = f"{self.spec.name} (pid {os.getpid()}): {result.line()}"
        finally:
            self._unpatch()

    def forget_in_fork(self) -> bool:
        """In a fork child, on the copy of its parent's session: put back what it patched (so
        nothing calls into the parent's collectors), drop the parent's sockets. Returns True
        when the parent's CUPTI had started."""

        forget_in_fork(self)
        self._unpatch()
        if self._srv is not None:
            self._srv.forget()
        self.running = False
        return self.cupti_started

    def status_extra(self) -> dict:
        extra = super().status_extra()
        extra.pop("log_path", None)
        return extra


def child_name(argv: list, forked_from: int | None = None) -> str:
    """The process's name: multiprocessing's name for it when the program gave one
    (``EngineCore``), with what it runs (``spawn worker``, ``worker.py``, ``fork of PID``)."""

    name = f"fork of {forked_from}" if forked_from is not None else process_name(argv)
    mp = sys.modules.get("multiprocessing")
    try:
        given = mp.current_process().name if mp is not None else ""
    except Exception:
        given = ""
    if given and given != "MainProcess" and not given.startswith(("Process-", "SpawnProcess-",
                                                                  "ForkProcess-",
                                                                  "ForkServerProcess-")):
        return f"{given} ({name})"
    return name


def _job_key() -> str:
    """What the ranks of one distributed job share: torchrun's run id, else the rendezvous
    address."""
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun:{env['TORCHELASTIC_RUN_ID']}"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT") and env.get("WORLD_SIZE"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return ""


def _version() -> str:
    return __version__


__all__ = ["ChildSession", "profiler_options", "gpu_index"]
