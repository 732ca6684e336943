"""A profiled program: collectors first, then its step sources and output capture, then the
program itself on the calling thread; :meth:`ProgramSession.finish` records how it ended.

Used by the headless ``tuiprof run --headless -- python …`` (in tuiprof's own process) and by
the live app's session process (``tuiprof.remote.session_process``), where the program runs on
the main thread and the UI is served from another.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .. import marks
from ..engine.graphs import GraphCaptures
from ..profiler import Profiler, _device_facts, rank_facts
from .transformers_steps import TransformersSteps
from .launch import ProgramResult, ProgramSpec, run_program
from .nvtx import NvtxSteps
from .output import OutputCapture, RelayedOutput, clean_line
from .steps import SOURCES, StepRecorder
from .windows import WindowSteps

DEFAULT_WINDOW_MS = 100.0
NO_PAUSE = "pause needs step boundaries on the program's thread (transformers or tuiprof.step)"
ENGINE_ONLY = {
    "toggle_mode": "c is for tuiprof's own engine: the program's code decides eager or compiled",
    "batch_up": "b is for tuiprof's own engine: the program's code decides its batch",
    "batch_down": "B is for tuiprof's own engine: the program's code decides its batch",
}


class ProgramSession:
    """Collectors, step sources and output capture around one run of a program."""

    def __init__(self, prof: Profiler, spec: ProgramSpec, log_path: str | Path, *,
                 window_ms: float = DEFAULT_WINDOW_MS, step_ranges: tuple[str, ...] = (),
                 tee: bool = False, relayed: bool = False) -> None:
        self.prof = prof
        self.spec = spec
        self.log_path = str(log_path)
        self.window_ms = float(window_ms)
        self.step_ranges = tuple(step_ranges)
        self.tee = tee
        sources = ("nvtx",) if step_ranges else ("transformers", "api", "windows")
        self.recorder = StepRecorder(prof, prof.clock, sources)
        self.nvtx = NvtxSteps(self.recorder, self.step_ranges) if step_ranges else None
        self.windows: WindowSteps | None = None
        self.hf: Any = None
        # relayed: fds 1 and 2 are another process's pipes, which keeps the log and the lines
        self.capture = RelayedOutput() if relayed else OutputCapture(prof.store, log_path, tee=tee)
        self.captures = GraphCaptures()
        self.result: ProgramResult | None = None
        self.running = False
        self._described = False

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Start the collectors, the step sources and the output capture (in that order)."""
        prof, store, spec = self.prof, self.prof.store, self.spec
        store.meta.update({
            "source": "program", "model": spec.name, "weights": "the program's",
            "program": {"argv": [clean_line(a) for a in spec.argv], "name": spec.name,
                        "log": Path(self.log_path).name, "running": True},
            "window_ms": self.window_ms, "tuiprof": _version(),
        })
        if self.step_ranges:
            store.meta["step_range"] = list(self.step_ranges)
        prof.start_collectors(markers=self.nvtx)
        if self.nvtx is not None:
            self._start_nvtx()
        elif not rank_facts() and prof.allow_bursts_only(self.captures.undroppable):
            self.captures.install()  # one rank: CUPTI attached around its bursts only
        enabled = self.recorder.enabled
        if "transformers" in enabled:
            self.hf = TransformersSteps(self.recorder, describe=self._describe_model)
            self.hf.install()
        if "api" in enabled:
            marks._sink = self.recorder
        if "windows" in enabled:
            self.windows = WindowSteps(self.recorder, self.window_ms)
        self.capture.start()
        if self.windows is not None:
            self.windows.start()
        self.running = True
        prof.status.state = "running"
        prof.status.message = f"{spec.name} running · log {Path(self.log_path).name}"
        prof._t_start = time.perf_counter()

    def _start_nvtx(self) -> None:
        prof = self.prof
        if prof.cupti is None:  # NVTX ranges arrive only through CUPTI
            prof.store.set_collector("nvtx", False, "no NVTX steps: --step-range needs CUPTI; "
                                     f"using {self.window_ms:g} ms windows")
            self.recorder.enabled = frozenset({"windows"})
            self.nvtx = None
            return
        from ..collect.cupti_raw import find_libcupti  # noqa: PLC0415

        lib = find_libcupti()._name
        current = os.environ.get("NVTX_INJECTION64_PATH")
        if current and os.path.realpath(current) != os.path.realpath(lib):
            prof.store.set_collector("nvtx", False, "NVTX_INJECTION64_PATH points at another "
                                     "tool; --step-range sees no ranges (unset it)")
        else:
            os.environ["NVTX_INJECTION64_PATH"] = lib  # read at the program's first NVTX call
            prof.store.set_collector("nvtx", True, "NVTX: steps at ranges "
                                     + ", ".join(self.step_ranges))

    # -------------------------------------------------------------------- run
    def run(self) -> ProgramResult:
        """Run the program on this thread (the main thread: its signals behave as usual)."""
        self.result = run_program(self.spec)
        return self.result

    def finish(self, result: ProgramResult, keep_capture: bool = False) -> None:
        """The program ended: close its last step, stop collecting, record how it ended.
        ``keep_capture``: leave fds 1 and 2 on the log (the live session process goes on)."""
        self.running = False
        self.result = result
        if self.windows is not None:
            self.windows.stop()
        self.recorder.close()
        if marks._sink is self.recorder:
            marks._sink = None
        if self.hf is not None:
            self.hf.uninstall()
        self.captures.uninstall()
        if keep_capture:
            self.capture.flush()
        else:
            self.capture.stop()
        self._describe_device()
        prof = self.prof
        prof.stop()
        rec = self.recorder
        meta = prof.store.meta
        info = dict(meta.get("program") or {})
        info.update({"running": False, "exit_status": result.status, "ended": result.how,
                     "error": clean_line(result.error), "output_lines": self.capture.lines,
                     "traceback": [clean_line(x) for x in result.traceback]})
        meta["program"] = info
        meta.update(self.step_facts())
        prof.status.state = "done" if result.status == 0 else "error"
        prof.status.message = f"{result.line()} · log {Path(self.log_path).name}"
        if result.how == "raised":
            prof.store.add_event("error", clean_line(result.line()))

    # ------------------------------------------------------------------ keys
    def toggle_pause(self) -> str:
        rec = self.recorder
        if not self.running:
            return "the program has ended"
        if not (rec.enabled & {"transformers", "api"}) or rec.source in ("nvtx", "windows", None):
            return NO_PAUSE
        if rec.paused:
            rec.resume()
            self.prof.status.state = "running"
            return "resumed"
        rec.pause()
        return "pausing the program at its next step"

    def interrupt(self) -> str | None:
        """Ctrl-C for the program (KeyboardInterrupt on its main thread); None once it ended."""
        if not self.running:
            return None
        self.recorder.resume()
        os.kill(os.getpid(), signal.SIGINT)
        return "Ctrl-C sent to the program (Ctrl-C again stops the session)"

    # -------------------------------------------------------------- describe
    def _describe_model(self, model: Any) -> None:
        """What the header shows, from the first model that generates."""
        meta = self.prof.store.meta
        cfg = getattr(model, "config", None)
        name = (getattr(cfg, "_name_or_path", "") or (getattr(cfg, "architectures", None)
                                                        or [type(model).__name__])[0])
        device = str(getattr(model, "device", "") or "")
        params = 0
        try:
            params = sum(p.numel() for p in model.parameters())
        except Exception:
            pass
        meta.update({"model": f"{self.spec.name}: {clean_line(str(name), limit=80)}",
                     "device": device or meta.get("device"), "params": params,
                     "dtype": str(getattr(model, "dtype", "")).replace("torch.", "") or None,
                     "family": getattr(cfg, "model_type", None)})
        mods = sys.modules
        for lib in ("torch", "transformers"):
            if lib in mods:
                meta[lib] = getattr(mods[lib], "__version__", None)
        if device:
            meta.update(_device_facts(device))
            self._described = True

    def _describe_device(self) -> None:
        """At the end, for a program no model was described for: where did CUDA run?"""
        if self._described:
            return
        torch = sys.modules.get("torch")
        if torch is None:
            return
        meta = self.prof.store.meta
        meta["torch"] = getattr(torch, "__version__", None)
        try:
            if torch.cuda.is_initialized():
                dev = f"cuda:{torch.cuda.current_device()}"
                meta["device"] = dev
                meta.update(_device_facts(dev))
            elif "device" not in meta:
                meta["device"] = "cpu"
        except Exception:
            pass

    def step_facts(self) -> dict:
        """Where the steps came from so far (``meta.step_source``, ``meta.step_sources``)."""
        rec = self.recorder
        counts = {s: rec.counts[s] for s in SOURCES if rec.counts[s]}
        if rec.nested:
            counts["ignored_nested"] = rec.nested
        return {"step_source": rec.source or "none", "step_sources": counts}

    def status_extra(self) -> dict:
        """Program facts the UI process shows (``SourceStatus.extra``); ``steps``: the step
        facts so far, which a process that outlives this one writes into the snapshot."""
        meta = self.prof.store.meta.get("program") or {}
        return {"program": {k: meta.get(k) for k in ("name", "log", "running", "exit_status",
                                                      "ended", "error", "traceback")},
                "log_path": self.log_path, "disabled": dict(ENGINE_ONLY),
                "can_interrupt": self.running, "steps": self.step_facts()}


def _version() -> str:
    from .. import __version__  # noqa: PLC0415

    return __version__
