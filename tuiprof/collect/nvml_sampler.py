"""NVML sampler: GPU utilisation, GPM metrics (Hopper+), memory, power, clocks, on its own thread.

Samples carry ``ts_ns`` on the clock the session uses for token marks (CUPTI's when CUPTI runs),
so they line up with tokens. Missing NVML or GPM degrades to what is available, with a one-line
reason in the store's collector status. The loop is drift-free (next deadline = previous + period).
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

from ..errors import safe_text
from ..store import NVML, SessionStore
from .base import CollectorUnavailable

GPM_METRICS = {
    "gpm_sm_util": "NVML_GPM_METRIC_SM_UTIL",
    "gpm_sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpm_dram_bw_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "gpm_tensor_util": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
}


class NvmlUnavailable(CollectorUnavailable):
    """NVML cannot be used here; the message is one line for the status bar."""


class NvmlSampler:
    """Samples one GPU at ``rate_hz`` into the store (``ingest("nvml", sample)``); a
    :class:`~tuiprof.collect.base.Collector`."""

    name = "nvml"

    def __init__(self, store: SessionStore, device_index: int = 0, rate_hz: float = 10.0,
                 clock: Callable[[], int] = time.time_ns, gpm: bool = True) -> None:
        self.store = store
        self.device_index = device_index
        self.period = 1.0 / max(0.1, rate_hz)
        self.clock = clock
        self.want_gpm = gpm
        self.gpm = False
        self._nv = None
        self._handle = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list = []
        self.paused = False  # a paused sampler keeps its thread but takes no samples
        self.sample_cost_s = 0.0
        self.count = 0
        self.info: dict = {}

    def start(self) -> None:
        """Initialise NVML and start the thread; raises :class:`NvmlUnavailable`."""
        try:
            import pynvml as nv  # noqa: PLC0415
        except Exception as exc:
            raise NvmlUnavailable(f"no NVML: nvidia-ml-py not importable ({exc.__class__.__name__})") from None
        try:
            nv.nvmlInit()
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as exc:
            raise NvmlUnavailable(f"no NVML: {str(exc)[:80]} (no NVIDIA driver or GPU?)") from None
        self._nv = nv
        self.info = self._static_info()
        message = "NVML"
        if self.want_gpm:
            try:
                support = nv.nvmlGpmQueryDeviceSupport(self._handle)
                self.gpm = bool(support.isSupportedDevice)
            except Exception:
                self.gpm = False
            if self.gpm:
                try:
                    self._samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                    nv.nvmlGpmSampleGet(self._handle, self._samples[0])
                    message += " + GPM"
                except Exception as exc:
                    self.gpm = False
                    message += f"; GPM unavailable ({str(exc)[:40]})"
            else:
                message += "; GPM not supported on this GPU (SM/DRAM/tensor utilisation missing)"
        self.store.meta.update({"driver": self.info.get("driver"),
                                "gpu_mem_total_bytes": self.info.get("mem_total_bytes")})
        self.store.set_collector("nvml", True, message)
        self._thread = threading.Thread(target=self._run, name="tuiprof-nvml", daemon=True)
        self._thread.start()

    def _static_info(self) -> dict:
        nv, h = self._nv, self._handle
        info: dict = {}
        for key, fn in (("name", nv.nvmlDeviceGetName), ("driver", nv.nvmlSystemGetDriverVersion)):
            try:
                v = fn(h) if key == "name" else fn()
                info[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:
                pass
        try:
            info["mem_total_bytes"] = int(nv.nvmlDeviceGetMemoryInfo(h).total)
        except Exception:
            pass
        return info

    def sample(self) -> dict:
        """Take one sample now (also used by tests and the sampler loop)."""
        nv, h = self._nv, self._handle
        s: dict = {"ts_ns": self.clock()}
        try:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            s["util_gpu"], s["util_memory"] = u.gpu, u.memory
        except Exception:
            pass
        try:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            s["mem_used_bytes"], s["mem_total_bytes"] = int(m.used), int(m.total)
        except Exception:
            pass
        for key, fn, arg in (("power_mw", nv.nvmlDeviceGetPowerUsage, None),
                             ("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
                             ("mem_clock_mhz", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
                             ("temperature_c", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)):
            try:
                s[key] = fn(h) if arg is None else fn(h, arg)
            except Exception:
                pass
        try:
            s["throttle_reasons"] = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        except Exception:
            pass
        if self.gpm:
            s.update(self._gpm_values())
        return s

    def _gpm_values(self) -> dict:
        nv = self._nv
        a, b = self._samples
        try:
            nv.nvmlGpmSampleGet(self._handle, b)
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = a, b
            keys = list(GPM_METRICS)
            for i, k in enumerate(keys):
                mg.metrics[i].metricId = getattr(nv, GPM_METRICS[k])
            nv.nvmlGpmMetricsGet(mg)
            out = {}
            for i, k in enumerate(keys):
                v = float(mg.metrics[i].value)
                if mg.metrics[i].nvmlReturn == 0 and math.isfinite(v):  # GPM can return NaN
                    out[k] = round(v, 2)
        except Exception:
            out = {}
        self._samples = [b, a]  # the newer sample is the next interval's start
        return out

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            t0 = time.thread_time()  # CPU time of this thread: waiting for the GIL is not cost
            try:
                if not self.paused:
                    self.store.ingest(NVML, self.sample())
                    self.count += 1
            except Exception as exc:  # a sampler error never ends the session
                self.store.set_collector("nvml", False, f"NVML sampling failed: {safe_text(exc)}")
                return
            self.sample_cost_s += time.thread_time() - t0
            deadline += self.period
            delay = deadline - time.monotonic()
            if delay < 0:  # fell behind: skip missed ticks instead of bursting
                deadline = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    @property
    def cost_s(self) -> float:
        return self.sample_cost_s

    def stop(self) -> None:
        """Stop the thread and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        nv = self._nv
        if nv is not None:
            for s in self._samples:
                try:
                    nv.nvmlGpmSampleFree(s)
                except Exception:
                    pass
            try:
                nv.nvmlShutdown()
            except Exception:
                pass
            self._nv = None


def make(ctx) -> "NvmlSampler | str":
    """The session's NVML sampler (:mod:`tuiprof.collect.registry`), or why it is off."""
    if not ctx.options.nvml:
        return "no NVML: disabled with --no-nvml"
    return NvmlSampler(ctx.store, ctx.device_index, ctx.options.nvml_hz, clock=ctx.clock)
