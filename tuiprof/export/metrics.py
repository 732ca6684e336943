"""``--metrics HOST:PORT``: the session's figures as Prometheus/OpenMetrics text, through
``prometheus_client`` (the ``fleet`` extra), served by the process that holds the session.

A custom collector reads every process's view when Prometheus scrapes (pull): nothing is
counted on the session's hot path for it. Histograms come from the store's fixed-bucket,
never-reset counts (``view.fleet``, ``view.requests.buckets``), so a scrape's buckets only grow
however long the session runs and whatever its rings drop. Labels are bounded: host, pid, role,
rank, GPU, and where it applies mode, phase, a kernel category, a part of tuiprof's own
overhead; never a request id or a kernel's name. The metric names and what each means:
docs/fleet.md.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Any

from .feeds import Source, bind_address, need, port_free, process_labels

FLAG = "--metrics"
BASE = ("host", "pid", "role", "rank", "gpu")
RECENT_STEPS = 64     # the latest steps the rates (steps/s, tokens/s) and shares are taken over
# request latencies: name in the book -> metric name
REQUEST_HISTOGRAMS = (("ttft_ms", "request_ttft", "time to first token"),
                      ("itl_ms", "request_itl", "inter-token latency"),
                      ("queue_ms", "request_queue_wait", "arrival to the first model step"),
                      ("e2e_ms", "request_e2e", "arrival to finish"),
                      ("outside_ms", "request_outside_steps",
                       "a request's time outside any model step"))
REQUEST_TOTALS = (("arrived", "requests that arrived"), ("finished", "requests finished"),
                  ("failed", "requests failed"), ("cancelled", "requests cancelled"),
                  ("preempted", "times a request was sent back to the queue after it started"),
                  ("tokens", "output tokens of requests"))
NVML_GAUGES = (("util_gpu", "gpu_utilization_ratio", 0.01, "NVML GPU utilisation"),
               ("util_memory", "gpu_memory_utilization_ratio", 0.01,
                "NVML memory-controller utilisation"),
               ("mem_used_bytes", "gpu_memory_used_bytes", 1, "device memory used"),
               ("mem_total_bytes", "gpu_memory_total_bytes", 1, "device memory"),
               ("power_mw", "gpu_power_watts", 0.001, "board power"),
               ("sm_clock_mhz", "gpu_sm_clock_hertz", 1e6, "SM clock"),
               ("temperature_c", "gpu_temperature_celsius", 1, "GPU temperature"),
               ("gpm_sm_util", "gpm_sm_utilization_ratio", 0.01, "GPM SM activity"),
               ("gpm_sm_occupancy", "gpm_sm_occupancy_ratio", 0.01, "GPM SM occupancy"),
               ("gpm_dram_bw_util", "gpm_dram_bandwidth_ratio", 0.01,
                "GPM DRAM bandwidth utilisation"),
               ("gpm_tensor_util", "gpm_tensor_utilization_ratio", 0.01,
                "GPM tensor-core activity"))


def check(value: str) -> tuple[str, int]:
    """In the terminal: the package is there, the address is HOST:PORT, the port is free."""
    need("prometheus_client", FLAG)
    host, port = bind_address(value, FLAG)
    port_free(host, port, FLAG)
    return host, port


def _edges_s(buckets: Any) -> list:
    """Cumulative (le in seconds, count) pairs of a :class:`~tuiprof.store.stats.Buckets` in ms."""
    out = []
    for edge, cum in buckets.cumulative():
        le = "+Inf" if edge == math.inf else _num(edge / 1000.0)
        out.append((le, cum))
    return out


def _num(x: float) -> str:
    return repr(float(x))


class SessionCollector:
    """prometheus_client's collector over a session's :class:`Source` (read at each scrape)."""

    def __init__(self, source: Source, extra: Any = None) -> None:
        self.source = source
        self.extra = extra     # () -> {name: value} of the other feeds (spans sent, dropped)
        self.last_scrape_s = 0.0
        self.scrapes = 0
        # counters built from aggregates a person may reset (``r``): kept monotonic here
        self._mono: dict[tuple, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def describe(self) -> list:
        return []   # no describe-time collect: the registry must not read the session at start

    def _monotonic(self, key: tuple, value: float, seen: set) -> float:
        last, base = self._mono.get(key, (0.0, 0.0))
        if value < last:        # the statistics were reset: what was counted stays counted
            base += last
        self._mono[key] = (value, base)
        seen.add(key)
        return base + value

    def collect(self) -> Any:
        from prometheus_client.core import (  # noqa: PLC0415
            CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily)

        t0 = time.perf_counter()
        with self._lock:
            views = self.source.views()
            fams: dict[str, Any] = {}

            def fam(kind: Any, name: str, doc: str, extra: tuple = ()) -> Any:
                f = fams.get(name)
                if f is None:
                    f = fams[name] = kind("tuiprof_" + name, doc, labels=list(BASE + extra))
                return f

            seen: set = set()
            for view in views:
                base = process_labels(view, self.source.host)
                lv = [base[k] for k in BASE]
                self._process(view, lv, fam, seen, CounterMetricFamily, GaugeMetricFamily,
                              HistogramMetricFamily)
            for key in [k for k in self._mono if k not in seen]:
                del self._mono[key]
            g = GaugeMetricFamily("tuiprof_processes", "processes of the session",
                                  labels=["host"])
            g.add_metric([self.source.host], len(views))
            fams["processes"] = g
            g = GaugeMetricFamily("tuiprof_scrape_duration_seconds",
                                  "the previous scrape's time to read the session",
                                  labels=["host"])
            g.add_metric([self.source.host], self.last_scrape_s)
            fams["scrape"] = g
            if self.extra is not None:
                for name, (kind, doc, value) in self.extra().items():
                    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                    f = cls("tuiprof_" + name, doc, labels=["host"])
                    f.add_metric([self.source.host], value)
                    fams[name] = f
        self.last_scrape_s = time.perf_counter() - t0
        self.scrapes += 1
        return list(fams.values())

    def _process(self, view, lv, fam, seen, Counter, Gauge, Histogram) -> None:
        from ..analysis.breakdown import launch_bound, shares  # noqa: PLC0415
        from ..analysis.tokens import token_timing  # noqa: PLC0415

        fleet = view.fleet or {}
        for (phase, mode), b in sorted((fleet.get("steps") or {}).items()):
            fam(Histogram, "step_seconds", "wall time of a step (clean steps: not beside a "
                "compile, not re-recording CUDA graphs)", ("phase", "mode")).add_metric(
                lv + [str(phase), str(mode)], _edges_s(b), b.total / 1000.0)
        totals = fleet.get("totals") or {}
        for key, name, doc in (("steps", "steps", "steps (model forwards) ended"),
                               ("decode_tokens", "decode_tokens", "tokens decoded"),
                               ("prefill_tokens", "prefill_tokens", "prompt tokens prefilled")):
            fam(Counter, name, doc).add_metric(lv, float(totals.get(key, 0)))
        # the latest steps: rates, the batch, the GPU's share of a step
        rows = [t for t in view.tokens[-RECENT_STEPS:] if t.done and t.end_ns]
        if rows:
            span = (rows[-1].end_ns - rows[0].start_ns) / 1e9
            toks = sum((t.decode_tokens or (t.batch if t.phase == "decode" else 0)) for t in rows)
            fam(Gauge, "steps_per_second", f"steps a second over the latest "
                f"{RECENT_STEPS} steps").add_metric(lv, len(rows) / span if span > 0 else 0.0)
            fam(Gauge, "tokens_per_second", f"tokens decoded a second over the latest "
                f"{RECENT_STEPS} steps").add_metric(lv, toks / span if span > 0 else 0.0)
            fam(Gauge, "batch", "sequences the latest step advanced").add_metric(
                lv, float(rows[-1].batch))
        modes = sorted({t.mode for t in view.tokens if t.phase == "decode"})
        for mode in modes:
            lb = None
            try:
                lb = launch_bound(view, mode)
            except Exception:  # too few steps of a kind: no figure yet
                pass
            if lb is not None and view.kernels_traced:
                fam(Gauge, "gpu_busy_ratio", "GPU busy share of a decode step (median over "
                    "steady steps; of an untraced step where measured)", ("mode",)).add_metric(
                    lv + [mode], lb.busy_fraction)
            traced = [t for t in view.tokens if t.mode == mode and t.phase == "decode" and t.done
                      and t.sampled and t.kernels and not t.apart][-RECENT_STEPS:]
            if traced:
                lbn = sum(1 for t in traced if token_timing(t).busy_frac < 0.5)
                fam(Gauge, "launch_bound_ratio", "share of the latest traced decode steps whose "
                    "GPU was busy less than half the step", ("mode",)).add_metric(
                    lv + [mode], lbn / len(traced))
        cats: dict = {}
        parts = view.configs or {view.batch: view.part()}
        for part in parts.values():
            for cat, sh in shares(part, "category", None, None).items():
                cats[cat] = cats.get(cat, 0) + sh.ns
        for key in self._mono:   # counted before a reset emptied the aggregates: still counted
            if key[0] == "kernel" and list(key[1:-1]) == lv:
                cats.setdefault(key[-1], 0)
        for cat, ns in sorted(cats.items()):
            v = self._monotonic(("kernel", *lv, cat), ns / 1e9, seen)
            fam(Counter, "kernel_seconds", "device time of traced steps' kernels (and "
                "memcpy/memset) by category", ("category",)).add_metric(lv + [cat], v)
        req = view.requests
        if req:
            for key, name, doc in REQUEST_HISTOGRAMS:
                b = (req.buckets or {}).get(key)
                if b is not None:
                    fam(Histogram, name + "_seconds", doc + " of finished requests").add_metric(
                        lv, _edges_s(b), b.total / 1000.0)
            fam(Gauge, "requests_in_flight", "requests arrived and not finished").add_metric(
                lv, float(len(req.in_flight)))
            for key, doc in REQUEST_TOTALS:
                name = "request_tokens" if key == "tokens" else f"requests_{key}"
                fam(Counter, name, doc).add_metric(lv, float((req.totals or {}).get(key, 0)))
        if view.nvml:
            smp = view.nvml[-1]
            for key, name, scale, doc in NVML_GAUGES:
                v = smp.get(key)
                if isinstance(v, (int, float)):
                    fam(Gauge, name, doc + " (latest NVML sample)").add_metric(lv, v * scale)
        oh = view.overhead or {}
        if isinstance(oh.get("pct"), (int, float)):
            fam(Gauge, "overhead_ratio", "what the session costs this process over wall time "
                "(its threads' CPU, its hooks on the program's threads, CUPTI switches, traced "
                "steps over untraced ones; docs/performance.md)").add_metric(
                lv, oh["pct"] / 100.0)
        for k, v in sorted(oh.items()):
            if k.endswith("_s") and k != "wall_s" and isinstance(v, (int, float)):
                part = k[:-2][:24]
                fam(Counter, "overhead_cpu_seconds", "the session's cost by part, seconds "
                    "(threads: CPU; hooks, switch, tracing: wall)",
                    ("part",)).add_metric(lv + [part], self._monotonic(("oh", *lv, part),
                                                                        float(v), seen))


class MetricsServer:
    """The running feed: a registry with the session's collector, served over HTTP."""

    def __init__(self, host: str, port: int, source: Source) -> None:
        need("prometheus_client", FLAG)
        from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

        from ..errors import TuiprofError  # noqa: PLC0415

        self.address = f"{host}:{port}"
        self.collector = SessionCollector(source, extra=lambda: self.others())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.extras: list = []     # other feeds' figures: callables -> {name: (kind, doc, v)}
        try:
            out = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise TuiprofError(f"{FLAG} {host}:{port}: cannot listen there "
                               f"({exc.strerror or exc}); pick another port") from None
        self._server, self._thread = out if isinstance(out, tuple) else (None, None)

    def others(self) -> dict:
        out: dict = {}
        for fn in list(self.extras):
            try:
                out.update(fn())
            except Exception:
                pass
        return out

    def stats(self) -> dict:
        return {"address": self.address, "scrapes": self.collector.scrapes,
                "last_scrape_s": round(self.collector.last_scrape_s, 6)}

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def start(parsed: tuple[str, int], source: Source) -> MetricsServer:
    return MetricsServer(parsed[0], parsed[1], source)


def render(source: Source) -> str:
    """The OpenMetrics text of ``source`` now (tests, the cost benchmark)."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415
    from prometheus_client.openmetrics.exposition import generate_latest  # noqa: PLC0415

    reg = CollectorRegistry(auto_describe=False)
    reg.register(SessionCollector(source))
    return generate_latest(reg).decode()
