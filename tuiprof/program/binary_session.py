"""The native side of a :class:`~tuiprof.program.session.ProgramSession`: the injection
library built, the channel open, the binary run as a child, its records cut into steps.

In order: the library is built (or found in the cache) before anything starts, so a missing
compiler or missing headers is one line and nothing to undo; NVML starts in this process (it
samples the GPU, whoever uses it); this process runs no CUPTI of its own. The steps come from
``--step-range`` NVTX ranges when given (:class:`~.nvtx_steps.NvtxSteps`), else from the kernel
stream (:class:`~.stream_steps.StreamSteps`: the decode loop, else windows).
"""
from __future__ import annotations

import tempfile
import time
from typing import TYPE_CHECKING

from ..collect.cupti_channel import EXIT_WAIT_MS, NativeCollector
from ..collect.native_sampling import BurstSchedule
from ..errors import TuiprofError
from .launch import ProgramResult
from .binary_child import NativeRun, no_gpu_line

if TYPE_CHECKING:
    from .session import ProgramSession


class NativeSide:
    """Build, channel, child process and step cutting for one native program."""

    def __init__(self, session: "ProgramSession") -> None:
        self.session = session
        self.collector: NativeCollector | None = None
        self.run_: NativeRun | None = None
        self.gpu_line: str | None = None

    def clock(self) -> int:
        """The program's CUPTI clock (the records' and the steps')."""
        c = self.collector
        return c.clock() if c is not None else time.time_ns()

    def start(self, sink) -> None:
        """Build the library (a one-line TuiprofError if it cannot), start NVML and the channel;
        ``sink``: the step source the parsed records go through (NVTX ranges or the kernel
        stream's loop)."""
        s = self.session
        prof, store = s.prof, s.prof.store
        inject = prof.options.cupti
        build = None
        if inject:
            from ..injection.build import build as build_library  # noqa: PLC0415

            build = build_library()
        prof.options.cupti = False        # this process traces nothing itself
        prof.start_collectors()
        graphs = getattr(prof.options, "cuda_graph_trace", "node")
        schedule = None
        if inject:
            # CUPTI runs in the binary; --sample-every switches its kernel tracing in bursts
            # of time (a native binary's steps are known only once their records arrive)
            schedule = BurstSchedule.from_option(prof.options.sample_every)
            store.meta["sample_every"] = schedule.every if schedule is not None else 1
            store.meta["tracing"] = native_tracing_words(schedule, graphs)
            store.meta["cuda_graph_trace"] = graphs
        if prof.nvml is not None and prof.nvml.info.get("name"):
            store.meta["device_name"] = prof.nvml.info["name"]
        store.meta.setdefault("device", "cuda (the program's)")
        env: dict[str, str] = {}
        nvtx = "nvtx" in s.sources
        if build is not None:
            c = NativeCollector(store, cupti_lib=str(build.cupti.lib),
                                include=str(build.cupti.include), sink=sink, nvtx=nvtx,
                                program=s.spec.name, graphs=graphs, schedule=schedule)
            try:
                c.start()
            except OSError as exc:
                prof.stop()
                raise TuiprofError("cannot open tuiprof's channel for the program (a Unix "
                                   f"socket in {tempfile.gettempdir()}): "
                                   f"{exc.strerror or exc}") from None
            self.collector = c
            prof.collectors["native"] = c   # stopped with the others, its cost counted
            env = c.env(str(build.path))
            store.meta["native"] = {
                "library": str(build.path), "cuda_h": build.cuda_h,
                "cupti": f"{build.cupti.source} {build.cupti.version}", "steps":
                    "nvtx" if nvtx else "auto (kernel stream), else windows"}
            store.set_collector("cupti", True, "CUPTI: injected into the program at its first "
                                "CUDA call (waiting for it)")
            if nvtx:
                store.set_collector("nvtx", True, "NVTX: steps at ranges "
                                    + ", ".join(s.step_ranges))
        c = self.collector
        self.run_ = NativeRun(s.spec, env, connected=c.connected if c is not None else None,
                              before_signal=c.flush if c is not None else None)

    def run(self) -> ProgramResult:
        return self.run_.run()

    def finish(self) -> None:
        """The binary ended: wait for its exit flush, fold everything, say if no GPU ran."""
        c = self.collector
        if c is None:
            return
        c.wait_end(EXIT_WAIT_MS / 1000 + 2.0)
        c.stop()
        store = self.session.prof.store
        native = store.meta.setdefault("native", {})
        native["channel"] = c.stats()
        line = no_gpu_line(c.connected.is_set(), c.kernels,
                           self.run_.cuda_loaded if self.run_ else False)
        if line:
            self.gpu_line = line
            store.set_collector("cupti", False, line)
            store.add_event("program", line)

    def interrupt(self) -> None:
        if self.run_ is not None:
            import signal  # noqa: PLC0415

            self.run_.flush_records()
            self.run_.signal(signal.SIGINT)

    def stop(self) -> None:
        if self.run_ is not None:
            self.run_.stop()

    def toggle_pause(self) -> str:
        if self.run_ is None:
            return "the program has not started"
        msg = self.run_.toggle_pause()
        status = self.session.prof.status
        status.state = "paused" if self.run_.paused else "running"
        return msg


def native_tracing_words(schedule: BurstSchedule | None, graphs: str) -> str:
    """``meta.tracing`` of a native program: which steps' kernels are traced, and what is seen
    of the others (the snapshot and the header say it)."""
    if schedule is None:
        head = "every step traced (--sample-every 1: CUPTI's kernel tracing on all along)"
    else:
        head = (f"{schedule.words()}; steps that start in a burst are traced, their time "
                "marked so")
    if graphs == "graph":
        return head + ("; CUDA graphs at graph level: one record a launch (its GPU time), "
                       "none of its kernels" + ("; between bursts every graph launch is still "
                                               "seen" if schedule is not None else ""))
    if schedule is not None:
        return head + "; between bursts no kernel is seen: steps are found in bursts only"
    return head
