"""The recorded window: the raw records the store keeps for its last ``ring_tokens`` tokens.

The SQLite export, the window CSVs and the trace are all built from :func:`window_of`, so
they describe the very same instances.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Iterator

from ..store import StoreView, TokenRow
from ..store.records import (API, C_BYTES, C_CORR, C_END, C_KIND, C_START, C_STREAM, COPY_KINDS,
                             K_BLOCK, K_CORR, K_END, K_GRAPH, K_GRID, K_NAME, K_REGS, K_SMEM,
                             K_START, K_STREAM, KERNEL, KIND, MEMCPY, MEMSET, R_CORR, R_END, R_NAME,
                             R_START, S_BYTES, S_CORR, S_END, S_START, S_STREAM, record_start)
from .names import demangle

MEMSET_NAME = "[CUDA memset]"


def memcpy_name(copy_kind: int) -> str:
    """nsys's operation name: ``[CUDA memcpy Host-to-Device]``."""
    return f"[CUDA memcpy {COPY_KINDS.get(copy_kind, 'Unknown')}]"


def strip_api_version(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (nsys drops a 6-char ``_vNNNN``)."""
    return name[:-6] if len(name) >= 6 and name[-6:-4] == "_v" else name


@dataclass(slots=True)
class GpuOp:
    """One kernel, memcpy or memset instance of the window."""

    kind: str                 # "K", "C" or "S"
    start: int                # ns, CUPTI clock
    end: int
    name: str                 # demangled kernel name or the nsys operation name
    raw: str = ""             # raw (mangled) kernel name
    stream: int = 0           # 0 when the record does not say
    corr: int | None = None
    grid: tuple = ()
    block: tuple = ()
    regs: int | None = None
    smem: int | None = None
    graph_id: int = 0
    bytes: int | None = None
    copy_kind: int | None = None
    device: int | None = None  # the GPU, in a window of several ranks (else the view's)


@dataclass(slots=True)
class ApiCall:
    name: str                 # as recorded (with its ``_vNNNN`` suffix)
    start: int
    end: int
    corr: int


@dataclass
class Window:
    """Everything of the recorded window, sorted by start time."""

    t0: int                                     # session start: first token or record
    t1: int                                     # last end
    tokens: list[TokenRow] = field(default_factory=list)
    ops: list[GpuOp] = field(default_factory=list)
    api: list[ApiCall] = field(default_factory=list)
    ranges: list[tuple[str, int, int]] = field(default_factory=list)  # (name, start, end)
    devices: dict[int, str] = field(default_factory=dict)  # device id -> label (several ranks)

    @property
    def empty(self) -> bool:
        return not (self.ops or self.api or self.tokens)


def _op(rec: tuple) -> GpuOp | None:
    kind = rec[KIND]
    if kind == KERNEL:
        return GpuOp("K", rec[K_START], rec[K_END], demangle(rec[K_NAME]), rec[K_NAME],
                     rec[K_STREAM], rec[K_CORR], tuple(rec[K_GRID]), tuple(rec[K_BLOCK]),
                     rec[K_REGS], rec[K_SMEM], rec[K_GRAPH])
    if kind == MEMCPY:   # stream and correlation id came later (older recordings lack them)
        return GpuOp("C", rec[C_START], rec[C_END], memcpy_name(rec[C_KIND]),
                     stream=rec[C_STREAM] if len(rec) > C_STREAM else 0,
                     corr=rec[C_CORR] if len(rec) > C_CORR else None, bytes=rec[C_BYTES],
                     copy_kind=rec[C_KIND])
    if kind == MEMSET:
        return GpuOp("S", rec[S_START], rec[S_END], MEMSET_NAME,
                     stream=rec[S_STREAM] if len(rec) > S_STREAM else 0,
                     corr=rec[S_CORR] if len(rec) > S_CORR else None, bytes=rec[S_BYTES])
    return None


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while building many small objects (none of them form cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def window_of(view: StoreView) -> Window:
    """Collect the raw records and tokens of ``view.raw`` (empty window if there are none)."""
    with gc_paused():
        return _window_of(view)


def _window_of(view: StoreView) -> Window:
    seqs = {seq for seq, _ in view.raw}
    tokens = [t for t in view.tokens if t.seq in seqs]
    ops: list[GpuOp] = []
    api: list[ApiCall] = []
    for _, recs in view.raw:
        for rec in recs:
            if rec[KIND] == API:
                api.append(ApiCall(rec[R_NAME], rec[R_START], rec[R_END], rec[R_CORR]))
            else:
                op = _op(rec)
                if op is not None:
                    ops.append(op)
    ops.sort(key=lambda o: (o.start, o.end))
    api.sort(key=lambda a: (a.start, a.end))
    ranges: list[tuple[str, int, int]] = []
    for t in tokens:
        if t.done and t.end_ns >= t.start_ns:
            ranges.append(("step", t.start_ns, t.end_ns))
            ranges.append((t.phase, t.start_ns, t.end_ns))
    starts = [o.start for o in ops[:1]] + [a.start for a in api[:1]] + [t.start_ns for t in tokens[:1]]
    ends = [o.end for o in ops] + [a.end for a in api] + [t.end_ns for t in tokens if t.done]
    t0 = min(starts) if starts else 0
    t1 = max(ends) if ends else t0
    return Window(t0, t1, tokens, ops, api, ranges)


def device_name(view: StoreView) -> str:
    """The GPU's name as nsys gives it (``NVIDIA H100 80GB HBM3``): a session's ``device`` is
    only ``cuda``, its ``device_name`` the GPU's (older recordings kept the name in ``device``)."""
    return str(view.meta.get("device_name") or view.meta.get("device") or "GPU")


def device_label(view: StoreView) -> str:
    """``NVIDIA H100 80GB HBM3 (0)``: TARGET_INFO_GPU.name and the device id."""
    return f"{device_name(view)} ({device_id(view)})"


def device_id(view: StoreView) -> int:
    d = view.meta.get("device_index", 0)
    return d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else 0


def ranks_window(rv) -> Window:
    """One window of every rank's records on the ranks' aligned timeline; each op carries its
    device (the rank's ``device_index``), ``devices`` names them (``NAME (id)``, as nsys)."""
    parts = []
    offsets = rv.clock.offsets_ns
    with gc_paused():
        for view, off in zip(rv.views, offsets):
            w = _window_of(view)
            dev = device_id(view)
            for op in w.ops:
                op.start, op.end, op.device = op.start - off, op.end - off, dev
            for a in w.api:
                a.start, a.end = a.start - off, a.end - off
            w.ranges = [(n, s - off, e - off) for n, s, e in w.ranges]
            w.t0, w.t1 = w.t0 - off, w.t1 - off
            parts.append((w, dev, device_label(view)))
        ops = sorted((op for w, _, _ in parts for op in w.ops), key=lambda o: (o.start, o.end))
        api = sorted((a for w, _, _ in parts for a in w.api), key=lambda a: (a.start, a.end))
    nonempty = [w for w, _, _ in parts if not w.empty]
    t0 = min((w.t0 for w in nonempty), default=0)
    t1 = max((w.t1 for w in nonempty), default=t0)
    return Window(t0, t1, [t for w, _, _ in parts for t in w.tokens], ops, api,
                  [r for w, _, _ in parts for r in w.ranges], {d: lab for _, d, lab in parts})


__all__ = ["Window", "GpuOp", "ApiCall", "window_of", "ranks_window", "memcpy_name", "strip_api_version",
           "MEMSET_NAME", "record_start", "device_id", "device_name", "device_label"]
