"""Every collector of a live session, one row each, in start order (docs/extending.md).

A row names a factory ``make(ctx: CollectorContext) -> Collector | str`` in a module under
``tuiprof/collect/``: it returns the collector, not yet started, or a one-line reason why it is
off in this session (an option such as ``--no-nvml``). The profiler starts them in table order
(a ``background`` one on a thread beside the model's imports) and stops them in table order
when the session ends (:mod:`tuiprof.collect.base` has the contract).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class CollectorSpec:
    name: str            # the key of its state in store.collectors
    make: str            # "module:function" under tuiprof.collect
    help: str            # one line: what it collects
    background: bool = False   # started on a thread: its start is slow (NVML's init)
    label: str = ""            # its name in the start-up phase ("starting CUPTI")


@dataclass
class CollectorContext:
    """What a collector's factory may use to build it."""

    store: Any                      # the SessionStore it hands its output to (ingest)
    options: Any                    # the session's ProfilerOptions
    clock: Callable[[], int]        # the session clock (CUPTI's when CUPTI runs)
    device_index: int = 0           # the GPU this session process samples
    mode: str = "eager"             # the mode the session starts in
    markers: Any = None             # NVTX marker sink (--step-range), for CUPTI
    sample_every: int = 1           # CUPTI's sampling period in this mode
    api_stay_on: bool = False       # CUPTI's API kinds stay on between bursts


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec("cupti", "cupti_collector:make",
                  "kernels, copies, memsets, device allocations and CUDA API calls (CUPTI)",
                  label="CUPTI"),
    CollectorSpec("nvml", "nvml_sampler:make",
                  "GPU utilisation, GPM SM/DRAM/tensor metrics, memory, power, clocks (NVML)",
                  background=True, label="NVML"),
    CollectorSpec("host", "host:make",
                  "the session process's CPU use, resident memory and threads (/proc)"),
)


def factory(spec: CollectorSpec) -> Callable[[CollectorContext], Any]:
    module, fn = spec.make.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), fn)
