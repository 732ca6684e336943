"""CUPTI memory records as a user should read them: true device cudaMalloc/cudaFree per phase,
and the rest (pinned host buffers, pool allocations, CUPTI's own...) by class, explained.

Reads the store's counters (``view.allocs``, see :mod:`tuiprof.store.alloc_classes`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..store.alloc_classes import DEVICE_MALLOC, NO_DETAIL, split_key

PHASE_ORDER = ("startup", "prefill/eager", "decode/eager", "prefill/compiled", "decode/compiled")


@dataclass
class MemoryClass:
    phase: str
    kind: str
    library: str
    api: str
    mallocs: int
    frees: int
    malloc_bytes: int


@dataclass
class MemorySummary:
    device: dict[str, dict] = field(default_factory=dict)   # phase key -> counter, ordered
    rest: list[MemoryClass] = field(default_factory=list)   # largest first
    rest_records: int = 0
    rest_bytes: int = 0
    rest_by_kind: dict[str, int] = field(default_factory=dict)
    classified: bool = True      # False: a snapshot from before the classes existed


def _phase_rank(key: str) -> tuple:
    return (PHASE_ORDER.index(key) if key in PHASE_ORDER else len(PHASE_ORDER), key)


def memory_summary(allocs: dict[str, Any]) -> MemorySummary:
    classes = allocs.get("classes")
    if classes is None:
        return MemorySummary(classified=False)
    s = MemorySummary()
    for k in sorted(allocs.get("device_by_phase", {}), key=_phase_rank):
        s.device[k] = dict(allocs["device_by_phase"][k])
    for key, c in classes.items():
        phase, kind, lib, api = split_key(key)
        if kind in (DEVICE_MALLOC, NO_DETAIL):
            continue
        n = c.get("mallocs", 0) + c.get("frees", 0)
        s.rest.append(MemoryClass(phase, kind, lib, api, c.get("mallocs", 0), c.get("frees", 0),
                                  c.get("malloc_bytes", 0)))
        s.rest_records += n
        s.rest_bytes += c.get("malloc_bytes", 0)
        s.rest_by_kind[kind] = s.rest_by_kind.get(kind, 0) + n
    s.rest.sort(key=lambda m: -(m.mallocs + m.frees))
    s.rest_by_kind = dict(sorted(s.rest_by_kind.items(), key=lambda kv: -kv[1]))
    return s


def rest_explained(s: MemorySummary, fmt_count=str) -> str:
    """One line: what the records that are not device cudaMalloc are."""
    if not s.rest_records:
        return "no other memory records"
    kinds = " · ".join(f"{k} {fmt_count(n)}" for k, n in s.rest_by_kind.items())
    return f"not device cudaMalloc: {kinds}"
