"""Kernel/op classification and the summary of one profiled iteration.

On CUDA the summary is over GPU kernels (torch.profiler CUDA activity, kernel durations);
on CPU it is over operator *self* CPU time (so nested ops are not counted twice). Names are
classified as ``gemm`` (matmul/mm/addmm/bmm/linear/gemm/gemv/nvjet/cutlass/cublas/xmma ...),
``attention`` (fused attention: flash/fmha/SDPA kernels, checked first because their names
may contain ``cutlass``) or ``other``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

GEMM_TOKENS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "gemm", "gemv", "mv", "addmv",
    "einsum", "_scaled_mm", "grouped_mm",
})
GEMM_SUBSTRINGS = ("gemm", "gemv", "nvjet", "cutlass", "cublas", "xmma", "matmul", "wgmma", "hmma")
ATTENTION_SUBSTRINGS = ("flash", "fmha", "scaled_dot_product", "efficient_attention", "cudnn_attention")
ATTN_LABELS = {"scores": "attn::scores_matmul", "softmax": "attn::softmax", "values": "attn::values_matmul"}
"""Must match ``tuiprof.engine.families._decoder.ATTN_LABELS`` (kept here so the sweep
core does not import an engine family)."""

_SKIP_PREFIXES = ("ProfilerStep", "attn::", "## ", "cudaDeviceSynchronize")


def classify(name: str) -> str:
    """``gemm``, ``attention`` or ``other`` for an op or kernel name."""
    low = name.lower()
    if any(s in low for s in ATTENTION_SUBSTRINGS):
        return "attention"
    tokens = set(t for t in re.split(r"[^a-z0-9_]+", low) if t) | set(re.split(r"[^a-z0-9]+", low))
    if tokens & GEMM_TOKENS or any(s in low for s in GEMM_SUBSTRINGS):
        return "gemm"
    return "other"


def is_gemm(name: str) -> bool:
    """True when ``name`` is a matrix-multiply op or kernel."""
    return classify(name) == "gemm"


@dataclass
class OpTime:
    """Time of one op/kernel name within the profiled iteration."""

    name: str
    ms: float
    calls: int
    share: float
    kind: str


@dataclass
class ProfileSummary:
    """What the study tables need from one profiled iteration (times in ms)."""

    source: str  # "cuda-kernels" | "cpu-ops"
    total_ms: float
    gemm_ms: float
    gemm_fraction: float
    dominant: str | None
    dominant_share: float | None
    top_non_gemm: str | None
    top_non_gemm_share: float | None
    attn_softmax_ms: float | None = None
    attn_matmul_ms: float | None = None
    top: list[OpTime] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(times: dict[str, tuple[float, int]], *, source: str, attention: tuple[float, float] | None = None,
              top_n: int = 15) -> ProfileSummary:
    """Summarise ``{name: (microseconds, calls)}``; ``attention`` = (softmax_us, matmul_us)."""
    items = sorted(((n, us, c) for n, (us, c) in times.items() if us > 0), key=lambda r: -r[1])
    total = sum(us for _, us, _ in items)
    gemm = sum(us for n, us, _ in items if is_gemm(n))
    top = [OpTime(n, us / 1e3, c, us / total if total else 0.0, classify(n)) for n, us, c in items[:top_n]]
    non_gemm = next(((n, us) for n, us, _ in items if not is_gemm(n)), None)
    return ProfileSummary(
        source=source,
        total_ms=total / 1e3,
        gemm_ms=gemm / 1e3,
        gemm_fraction=gemm / total if total else 0.0,
        dominant=items[0][0] if items else None,
        dominant_share=items[0][1] / total if items and total else None,
        top_non_gemm=non_gemm[0] if non_gemm else None,
        top_non_gemm_share=non_gemm[1] / total if non_gemm and total else None,
        attn_softmax_ms=attention[0] / 1e3 if attention else None,
        attn_matmul_ms=attention[1] / 1e3 if attention else None,
        top=top,
    )


def summarize_profiler(prof: Any, *, cuda: bool, top_n: int = 15) -> ProfileSummary:
    """Summarise a finished ``torch.profiler.profile``: GPU kernels on CUDA, CPU ops otherwise."""
    from torch.autograd import DeviceType

    events = list(prof.events())
    times: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    if cuda:
        for e in events:
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
                continue
            acc = times[e.name]
            acc[0] += e.time_range.end - e.time_range.start
            acc[1] += 1
    else:
        for e in events:
            if e.device_type != DeviceType.CPU or getattr(e, "is_user_annotation", False) or e.is_async:
                continue
            if e.name.startswith(_SKIP_PREFIXES):
                continue
            acc = times[e.name]
            acc[0] += e.self_cpu_time_total
            acc[1] += 1
    return summarize({k: (v[0], int(v[1])) for k, v in times.items()},
                     source="cuda-kernels" if cuda else "cpu-ops",
                     attention=attention_split(events, cuda=cuda), top_n=top_n)


def attention_split(events: Iterable[Any], *, cuda: bool) -> tuple[float, float] | None:
    """(softmax µs, matmul µs) inside the plain attention path, from its ``record_function``
    labels; None when the labels are absent (fused SDPA, or compiled away)."""
    from torch.autograd import DeviceType

    soft = mat = 0.0
    found = False
    for e in events:
        if e.device_type != DeviceType.CPU or e.name not in ATTN_LABELS.values():
            continue
        found = True
        us = e.device_time_total if cuda else e.cpu_time_total
        if e.name == ATTN_LABELS["softmax"]:
            soft += us
        else:
            mat += us
    return (soft, mat) if found else None
