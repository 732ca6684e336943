"""What tracing changes: traced steps against untraced ones, and kernel times under CUPTI.

A traced step runs with CUPTI attached and its kernel records on; an *untraced* step runs with
CUPTI finalized between sampling bursts (or without CUPTI at all): the store keeps the wall
(``untraced_ms``) and CUDA-event (``untraced_gpu_ms``) times of those apart from the traced
steps' (``traced_step_ms``, ``traced_gpu_ms``). Steps with CUPTI attached around a burst
without tracing it count on neither side.

* :func:`tracing_cost`: the traced steps' median time against the untraced steps' median, of
  the same configuration, phase and mode (``traced steps run 12 % slower: tracing cost``).
* :func:`untraced_wall_ms`: the basis of the busy share and the launch-bound class where it
  exists: a traced step's kernel-busy time over the untraced steps' median wall time (tracing
  stretches the step: its own wall time would understate how busy the GPU is).
* Kernel durations: CUPTI's record of a kernel may carry tracing's own cost. The measured
  per-kernel constant, by launch path, is :data:`DURATION_INFLATION_NS` (from
  ``bench/verify/tracing_perturbation.py``, docs/performance.md "What tracing changes"); while it is
  not filled in, the times of kernels shorter than :data:`SMALL_KERNEL_NS` are upper bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DURATION_INFLATION_NS", "SMALL_KERNEL_NS", "MIN_UNTRACED", "TracingCost",
           "tracing_cost", "untraced_wall_ms", "KernelTimes", "kernel_times", "launch_path",
           "busy_basis_label"]

# Extra time a kernel's CUPTI record carries while its kernels are traced, by launch path
# ("stream": launched one by one; "graph": a node of a CUDA graph), in ns: the median, over the
# small kernels of bench/verify/tracing_perturbation.py, of their event-timed duration traced minus
# untraced (docs/performance.md, "What tracing changes"). None: not measured on this kind of
# GPU yet: the times of kernels shorter than SMALL_KERNEL_NS are shown as upper bounds. A number:
# it is subtracted from every kernel of that path (the correction is shown where it is used).
# Measured on an H100 (2026-11-26, bench/results/2026-11-26/tracing_kernels_h100.txt): stream
# +184 ns (tiny +0.17 µs, GEMV +0.19 µs, SDPA +0.18 µs a kernel; large kernels +1.3-1.6 µs,
# about 1 %).
# The graph path's figure leans on the stream path's untraced reference (no event pair fits
# inside a graph) and came out negative for multi-kernel graphs, so it stays unmeasured: graph
# kernels shorter than SMALL_KERNEL_NS are shown as upper bounds.
DURATION_INFLATION_NS: dict[str, float | None] = {"stream": 184.0, "graph": None}
SMALL_KERNEL_NS = 5_000       # below this mean duration, a kernel's time is flagged or corrected
MIN_UNTRACED = 8              # untraced steps before their median is used as a basis


def _median(stats: Any) -> float | None:
    return stats.median if stats is not None and stats.count else None


@dataclass(frozen=True, slots=True)
class TracingCost:
    """Traced steps' median time against untraced steps' median, one phase and mode."""

    phase: str
    mode: str
    traced_ms: float
    untraced_ms: float
    traced_steps: int
    untraced_steps: int
    source: str        # "gpu_ms": CUDA events around each step; "host_ms": the step's wall time

    @property
    def ratio(self) -> float:
        return self.traced_ms / self.untraced_ms if self.untraced_ms else 0.0

    @property
    def pct(self) -> float:
        """How much slower a traced step runs, in %."""
        return 100.0 * (self.ratio - 1.0)

    def text(self) -> str:
        """``traced steps run 12 % slower: tracing cost``."""
        if abs(self.pct) < 0.5:
            return "traced steps run as fast as untraced ones"
        return (f"traced steps run {abs(self.pct):.0f} % "
                f"{'slower' if self.pct > 0 else 'faster'}: tracing cost")

    def detail(self) -> str:
        """``GPU 3.10 vs 2.74 ms untraced (medians of 12 and 2,040 steps)``."""
        what = "GPU" if self.source == "gpu_ms" else "wall"
        return (f"{what} {self.traced_ms:.2f} vs {self.untraced_ms:.2f} ms untraced (medians of "
                f"{self.traced_steps:,} and {self.untraced_steps:,} steps)")

    def to_dict(self) -> dict:
        return {"traced_ms": self.traced_ms, "untraced_ms": self.untraced_ms,
                "ratio": self.ratio, "traced_steps": self.traced_steps,
                "untraced_steps": self.untraced_steps, "source": self.source}


def tracing_cost(view: Any, phase: str = "decode", mode: str = "eager") -> TracingCost | None:
    """Traced against untraced steps of the view's configuration (``phase``, ``mode``): by
    CUDA events where both sides have them, else by wall time; None without traced steps or
    with fewer than :data:`MIN_UNTRACED` untraced ones."""
    ts = view.token_stats.get((phase, mode)) or {}
    for source, traced, untraced in (("gpu_ms", "traced_gpu_ms", "untraced_gpu_ms"),
                                     ("host_ms", "traced_step_ms", "untraced_ms")):
        t, u = ts.get(traced), ts.get(untraced)
        if t is not None and t.count and u is not None and u.count >= MIN_UNTRACED \
                and u.median > 0:
            return TracingCost(phase, mode, t.median, u.median, t.count, u.count, source)
    return None


def untraced_wall_ms(view: Any, phase: str = "decode", mode: str = "eager") -> float | None:
    """The median wall time of the view's untraced (``phase``, ``mode``) steps, or None (fewer
    than :data:`MIN_UNTRACED`): the busy share's denominator where it exists."""
    u = (view.token_stats.get((phase, mode)) or {}).get("untraced_ms")
    if u is None or u.count < MIN_UNTRACED or u.median <= 0:
        return None
    return u.median


def busy_basis_label(untraced: bool) -> str:
    """How a busy share was computed, for the screen: over an untraced step's wall time, or
    over the traced step's own (longer: tracing stretches it)."""
    return "of an untraced step" if untraced else "of its traced step"


def launch_path(graph_launches: int, launches: int) -> str:
    """``graph`` when most launches came from CUDA graphs, else ``stream``."""
    return "graph" if launches and 2 * graph_launches >= launches else "stream"


@dataclass(frozen=True, slots=True)
class KernelTimes:
    """How a kernel's CUPTI times are to be read (see :data:`DURATION_INFLATION_NS`)."""

    path: str                  # "stream" or "graph"
    correction_ns: float       # subtracted from each launch (0: none)
    upper_bound: bool          # not corrected, and short enough for tracing's cost to matter

    def mean_ns(self, mean: float) -> float:
        return max(0.0, mean - self.correction_ns)

    def total_ns(self, total: float, count: int) -> float:
        return max(0.0, total - self.correction_ns * count)


def kernel_times(mean_ns: float, graph_launches: int, launches: int,
                 table: dict | None = None) -> KernelTimes:
    """How to read one kernel's times: corrected by its path's measured constant, or flagged
    as an upper bound when that is not measured and the kernel is short."""
    path = launch_path(graph_launches, launches)
    delta = (DURATION_INFLATION_NS if table is None else table).get(path)
    if delta is None:
        return KernelTimes(path, 0.0, mean_ns < SMALL_KERNEL_NS)
    return KernelTimes(path, float(delta), False)


def busy_correction_ns(kernels_per_step: float, path: str, table: dict | None = None) -> float:
    """ns to take from a traced step's kernel-busy time: the path's measured constant per
    kernel (0 while it is not measured: the busy share is then an upper bound)."""
    delta = (DURATION_INFLATION_NS if table is None else table).get(path)
    return float(delta) * kernels_per_step if delta else 0.0


def duration_note(table: dict | None = None) -> str:
    """One line on how kernel times are read, for captions and exports."""
    t = DURATION_INFLATION_NS if table is None else table
    fixed = {p: d for p, d in t.items() if d is not None}
    if not fixed:
        return (f"≤: kernels under {SMALL_KERNEL_NS / 1000:g} µs, CUPTI's time may hold "
                "tracing's own (upper bound)")
    return "kernel times less tracing's own: " + ", ".join(
        f"{d / 1000:.2f} µs a {p} kernel" for p, d in sorted(fixed.items()))
