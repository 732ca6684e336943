"""A profiled program: collectors first, then its step sources and output capture, then the
program itself on the calling thread; :meth:`ProgramSession.finish` records how it ended.

Used by the headless ``tuiprof run --headless -- python …`` (in tuiprof's own process) and by
the live app's session process (``tuiprof.sessions.session_process``), where the program runs on
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
from ..collect.device import device_facts
from ..errors import TuiprofError
from ..profiler import Profiler
from .launch import ProgramResult, ProgramSpec, run_program
from .binary_session import NativeSide
from .nvtx_steps import NoNvtx
from .output import OutputCapture, RelayedOutput, clean_line
from .registry import STEP_SOURCES, factory, option_values
from .steps import HOST_SOURCES, SOURCES, StepRecorder
from .windows_steps import WindowSteps

NO_PAUSE = "pause needs step boundaries on the program's thread (transformers or tuiprof.step)"
ENGINE_ONLY = {
    "toggle_mode": "c is for tuiprof's own engine: the program's code decides eager or compiled",
    "batch_up": "b is for tuiprof's own engine: the program's code decides its batch",
    "batch_down": "B is for tuiprof's own engine: the program's code decides its batch",
}


class ProgramSession:
    """Collectors, step sources and output capture around one run of a program."""

    def __init__(self, prof: Profiler, spec: ProgramSpec, log_path: str | Path, *,
                 options: dict | None = None, window_ms: float | None = None,
                 step_ranges: tuple[str, ...] | None = None, tee: bool = False,
                 relayed: bool = False, meta: dict | None = None,
                 proxy: str | None = None) -> None:
        """``options``: the step sources' options by ``dest`` (``program.registry.OPTIONS``;
        ``window_ms`` and ``step_ranges`` are shorthands for two of them); ``meta``: facts
        about the run for the snapshot (``tuiprof serve``'s load); ``proxy``: ``--proxy
        LISTEN=UPSTREAM``, a streaming proxy in front of the program's server whose requests
        become the store's (:mod:`tuiprof.collect.http_proxy`)."""
        self.prof = prof
        self.spec = spec
        self.log_path = str(log_path)
        given = dict(options or {})
        if window_ms is not None:
            given["window_ms"] = window_ms
        if step_ranges is not None:
            given["step_range"] = list(step_ranges)
        self.options = option_values(given)
        self.window_ms = float(self.options["window_ms"])
        self.step_ranges = tuple(self.options["step_range"] or ())
        self.tee = tee
        self.meta = dict(meta or {})
        # a native binary runs as a child, its CUPTI injected (tuiprof.program.binary_session)
        self.native = NativeSide(self) if spec.kind == "native" else None
        self.recorder = StepRecorder(prof, self.native.clock if self.native else prof.clock)
        # a server's requests, on the clock of the steps (tuiprof/store/requests.py)
        self.requests = prof.store.requests
        self.requests.clock = self.recorder.clock
        self.proxy_spec = proxy
        self.proxy: Any = None
        # the step sources of this run, in precedence order (tuiprof.program.registry)
        self.sources: dict[str, Any] = {}
        kind = "native" if self.native is not None else "python"
        for spec in STEP_SOURCES:
            if kind not in spec.programs:
                continue
            source = factory(spec)(self)
            if source is not None:
                self.sources[spec.name] = source
        enabled = set(self.sources)
        if "auto" in enabled:  # the kernel stream's source cuts windows itself until a loop shows
            enabled.add("windows")
        self.recorder.enabled = frozenset(enabled)
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
        store.meta.update(self.meta)
        markers = next((m for m in (getattr(s, "markers", None) for s in self.sources.values())
                        if m is not None), None)
        if self.native is not None:  # the child's CUPTI feeds the step source's marker sink
            self.native.start(markers)
            self._start_proxy()
            self.capture.start()
            for name, source in self.sources.items():
                if name != "nvtx":  # NVTX reaches the child through its environment
                    source.install()
            self._running(spec)
            return
        prof.start_collectors(markers=markers)
        self._start_proxy()
        if markers is None and prof.allow_bursts_only(
                self.captures.undroppable, lambda: self.captures.captures):
            # CUPTI attached around its bursts only, on a rank too: the ranks' bursts fall on the
            # same steps (_first_steps), and a rank's CUDA graphs keep it attached (GraphCaptures)
            self.captures.install()
        self.capture.start()
        marks._requests = self.requests   # tuiprof.request_arrived() and the rest
        for name, source in list(self.sources.items()):
            try:
                self._install(name, source)
            except NoNvtx as exc:  # its ranges cannot come: windows instead
                prof.store.set_collector("nvtx", False, str(exc))
                del self.sources[name]
        if not self.sources:
            self.sources["windows"] = WindowSteps(self.recorder, self.window_ms)
            self.recorder.enabled = frozenset({"windows"})
            self.sources["windows"].install()
        self._running(spec)

    def _start_proxy(self) -> None:
        """``--proxy``: listen before the program starts (its clients may come at once); a
        LISTEN taken since the command checked it is one line and nothing starts."""
        if not self.proxy_spec:
            return
        from ..collect.http_proxy import address_text  # noqa: PLC0415
        from ..collect.proxy_process import make_proxy  # noqa: PLC0415

        try:
            proxy = make_proxy(self.requests, self.proxy_spec)
            proxy.start()
        except (OSError, ValueError) as exc:
            self.prof.stop()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise TuiprofError(f"--proxy {self.proxy_spec}: cannot listen: {why}") from None
        self.proxy = proxy
        self.prof.collectors["proxy"] = proxy   # stopped with the others, its cost counted
        store = self.prof.store
        store.meta["proxy"] = proxy.stats()
        store.set_collector("proxy", True, f"proxy: {address_text(proxy.listen)} → "
                            f"{address_text(proxy.upstream)}: requests seen from outside the "
                            "engine (no queue time, TTFT and tokens as they passed)")

    def _running(self, spec: ProgramSpec) -> None:
        prof = self.prof
        self.running = True
        prof.status.state = "running"
        prof.status.message = f"{spec.name} running · log {Path(self.log_path).name}"
        prof._t_start = time.perf_counter()

    def _install(self, name: str, source: Any) -> None:
        if name == "nvtx":
            if self.prof.cupti is None:  # NVTX ranges arrive only through CUPTI
                raise NoNvtx(f"no NVTX steps: --step-range needs CUPTI; using "
                             f"{self.window_ms:g} ms windows")
            source.install()
            self.prof.store.set_collector("nvtx", True, "NVTX: steps at ranges "
                                          + ", ".join(self.step_ranges))
            return
        source.install()

    # -------------------------------------------------------------------- run
    def run(self) -> ProgramResult:
        """Run the program on this thread (the main thread: its signals behave as usual)."""
        self.result = self.native.run() if self.native else run_program(self.spec)
        return self.result

    def finish(self, result: ProgramResult, keep_capture: bool = False) -> None:
        """The program ended: close its last step, stop collecting, record how it ended.
        ``keep_capture``: leave fds 1 and 2 on the log (the live session process goes on)."""
        self.running = False
        self.result = result
        if self.proxy is not None:   # requests still in flight end here (cancelled)
            self.proxy.stop()
            self.prof.store.meta["proxy"] = self.proxy.stats()
        if self.native is not None:  # everything the program sent, cut into its last steps
            self.native.finish()
        for source in reversed(list(self.sources.values())):
            source.uninstall()
        if marks._requests is self.requests:
            marks._requests = None
        self.recorder.close()
        self.captures.uninstall()
        if keep_capture:
            self.capture.flush()
        else:
            self.capture.stop()
        self._describe_device()
        prof = self.prof
        prof.stop()
        meta = prof.store.meta
        info = dict(meta.get("program") or {})
        info.update({"running": False, "exit_status": result.status, "ended": result.how,
                     "error": clean_line(result.error), "output_lines": self.capture.lines,
                     "traceback": [clean_line(x) for x in result.traceback]})
        meta["program"] = info
        meta.update(self.step_facts())
        if self.requests.sources:
            meta["request_sources"] = dict(self.requests.sources)
        prof.status.state = "done" if result.status == 0 else "error"
        prof.status.message = f"{result.line()} · log {Path(self.log_path).name}"
        if result.how == "raised":
            prof.store.add_event("error", clean_line(result.line()))
        if self.native is not None and self.native.gpu_line:
            meta["program"]["gpu"] = self.native.gpu_line
            prof.status.message = f"{result.line()}; {self.native.gpu_line}"

    # ------------------------------------------------------------------ keys
    def toggle_pause(self) -> str:
        rec = self.recorder
        if not self.running:
            return "the program has ended"
        if self.native is not None:
            return self.native.toggle_pause()
        if not (rec.enabled & set(HOST_SOURCES)) or rec.source not in HOST_SOURCES:
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
        if self.native is not None:
            self.native.interrupt()
        else:
            self.recorder.resume()
            os.kill(os.getpid(), signal.SIGINT)
        return "Ctrl-C sent to the program (Ctrl-C again stops the session)"

    def stop_program(self) -> None:
        """The session stops (the live app quits): a native program is ended with it; a
        Python program runs on this process's main thread and ends with the process."""
        if self.native is not None:
            self.native.stop()

    # -------------------------------------------------------------- describe
    def describe_model(self, model: Any) -> None:
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
            meta.update(device_facts(device))
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
                meta.update(device_facts(dev))
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
        facts = {"step_source": rec.source or "none", "step_sources": counts}
        if rec.elsewhere and not rec.marked:
            facts["steps_elsewhere"] = rec.elsewhere
        return facts

    def notes(self) -> list[str]:
        """Lines a headless run prints after the program's end line."""
        return [self.native.gpu_line] if self.native is not None and self.native.gpu_line else []

    def status_extra(self) -> dict:
        """Program facts the UI process shows (``SourceStatus.extra``); ``steps``: the step
        facts so far, which a process that outlives this one writes into the snapshot."""
        if self.proxy is not None:   # what passed the proxy so far (its process reports it)
            self.prof.store.meta["proxy"] = self.proxy.stats()
        meta = self.prof.store.meta.get("program") or {}
        return {"program": {k: meta.get(k) for k in ("name", "log", "running", "exit_status",
                                                      "ended", "error", "traceback")},
                "log_path": self.log_path, "disabled": dict(ENGINE_ONLY),
                "can_interrupt": self.running, "steps": self.step_facts(),
                "notes": self.notes()}


def _version() -> str:
    from .. import __version__  # noqa: PLC0415

    return __version__
