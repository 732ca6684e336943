"""Raw CUPTI activity buffers: copy in the callback, parse in bulk with numpy.

Why: cupti-python's buffer-completed callback builds one Python object per record before it
calls back, and that object's fields are read through numpy. Measured on the H100 (2,400
kernels per step, by a probe since removed: docs/history/gpu-verification.md#s3): a callback
that does *nothing* with the records already made each step 5.7× slower, and reading the
fields made it 9.9× slower.
Here the C callbacks (ctypes) only hand out and take back buffers; the completed buffer is
copied (one memcpy) and parsed on a consumer thread: one small Python step per record to walk
the variable-size records, and numpy gathers for every field.

Record layouts are CUPTI's (field offsets are the same in every version cupti-python knows;
only the record sizes differ and are detected from the first buffer, see :class:`Layout`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from itertools import repeat
from typing import Callable

import numpy as np

from ..store.alloc_classes import library_code
from ..store.records import LIB_UNKNOWN

# CUpti_ActivityKind values
KIND_MEMCPY, KIND_MEMSET, KIND_KERNEL, KIND_DRIVER, KIND_RUNTIME = 1, 2, 10, 4, 5
KIND_CONCURRENT_KERNEL = 10
KIND_MARKER = 12
KIND_MEMORY2 = 49
KIND_GRAPH_TRACE = 51

# CUpti_ActivityGraphTrace2 (cupti_activity.h, CUDA 12.x/13.x): kind u32 @0, correlationId u32 @4,
# start u64 @8, end u64 @16, deviceId u32 @24, graphId u32 @28, contextId u32 @32,
# streamId u32 @36, reserved void* @40, then (CUDA 12.5+) endDeviceId, endContextId: 48 or 56
# bytes. One record per CUDA-graph launch: its whole execution, none of its nodes.

# CUpti_ActivityMarker2 (cupti_activity.h, CUDA 12.x/13.x): kind u32 @0, flags u32 @4,
# timestamp u64 @8, id u32 @16, objectKind u32 @20, objectId (pt: processId u32 @24,
# threadId u32 @28), pad u32 @36, name char* @40 (NULL for an end marker), domain char* @48
# (NULL: the default domain); 56 bytes.
MARKER_FLAG_INSTANTANEOUS, MARKER_FLAG_START, MARKER_FLAG_END = 1, 2, 4

# candidate record sizes per kind (CUPTI 12.x/13.x struct versions)
SIZE_CANDIDATES = {
    KIND_CONCURRENT_KERNEL: (216, 224, 232, 248, 208),
    KIND_MEMCPY: (96, 112, 88),
    KIND_MEMSET: (88, 104),
    KIND_MEMORY2: (128,),
    KIND_RUNTIME: (40,),
    KIND_DRIVER: (40,),
    KIND_MARKER: (56,),
    KIND_GRAPH_TRACE: (56, 48),
}


class LayoutError(RuntimeError):
    """The buffer does not parse with any known record size."""


@dataclass
class Layout:
    """Record size per kind, fixed once detected."""

    sizes: dict = field(default_factory=dict)

    def walk(self, mv32: memoryview, nbytes: int) -> dict[int, list[int]]:
        """Offsets of the records of each kind in a buffer of ``nbytes`` valid bytes."""
        sizes = self.sizes
        out: dict[int, list[int]] = {}
        off = 0
        while off < nbytes:
            kind = mv32[off >> 2]
            size = sizes.get(kind)
            if size is None:
                size = self._detect(mv32, nbytes, off, kind)
            lst = out.get(kind)
            if lst is None:
                lst = out[kind] = []
            lst.append(off)
            off += size
        if off != nbytes:
            raise LayoutError(f"records overrun the buffer ({off} != {nbytes})")
        return out

    def _detect(self, mv32: memoryview, nbytes: int, off: int, kind: int) -> int:
        cands = SIZE_CANDIDATES.get(kind)
        if cands is None:
            raise LayoutError(f"unexpected CUPTI record kind {kind}")
        valid = [s for s in cands if self._plausible(mv32, nbytes, off + s, depth=3)]
        if not valid:
            raise LayoutError(f"no known size fits CUPTI record kind {kind}")
        self.sizes[kind] = valid[0]
        if len(valid) > 1:  # ambiguous so far: settle it on a later buffer
            del self.sizes[kind]
        return valid[0]

    def _plausible(self, mv32: memoryview, nbytes: int, off: int, depth: int) -> bool:
        if off == nbytes:
            return True
        if off > nbytes or off % 8:
            return False
        kind = mv32[off >> 2]
        if kind not in SIZE_CANDIDATES:
            return False
        if depth == 0:
            return True
        size = self.sizes.get(kind)
        sizes = (size,) if size is not None else SIZE_CANDIDATES[kind]
        return any(self._plausible(mv32, nbytes, off + s, depth - 1) for s in sizes)


class NameCache:
    """Kernel-name pointers to strings. CUPTI shares one name string among all records of a
    kernel and keeps it alive, so a pointer is read once. ``read`` turns a non-null pointer
    into its string: this process's memory by default; the strings a profiled process sent
    for a native program (:mod:`tuiprof.collect.cupti_channel`)."""

    def __init__(self, read: Callable[[int], str | None] | None = None) -> None:
        self._names: dict[int, str] = {}
        self._read = read or _c_string

    def lookup(self, ptrs: np.ndarray) -> list[str]:
        uniq, inv = np.unique(ptrs, return_inverse=True)
        names = self._names
        strs = []
        for p in uniq.tolist():
            s = names.get(p)
            if s is None:
                s = names[p] = (self._read(p) or "<unknown>") if p else "<unknown>"
            strs.append(s)
        return np.array(strs, dtype=object)[inv].tolist()


class LibraryResolver:
    """Which library a memory record came from, as a ``LIBRARIES`` index.

    CUPTI's ``source`` (a C string CUPTI keeps alive: the shared object that asked for the
    memory) names it directly and is read once per pointer; without it the record's PC is
    looked up in ``/proc/self/maps``, read again only when a PC falls outside every mapping
    known so far (libraries loaded later). Runs on the consumer thread, never in a callback.
    """

    def __init__(self, maps_path: str = "/proc/self/maps",
                 read: Callable[[int], str | None] | None = None) -> None:
        self._maps_path = maps_path
        self._read = read or _c_string
        self._by_source: dict[int, int] = {}
        self._by_pc: dict[int, int] = {}
        self._ranges: list[tuple[int, int, str]] = []
        self._maps_read = 0

    def source(self, ptr: int) -> int:
        code = self._by_source.get(ptr)
        if code is None:
            path = (self._read(ptr) or "") if ptr else ""
            code = self._by_source[ptr] = library_code(path)
        return code

    def pc(self, pc: int) -> int:
        code = self._by_pc.get(pc)
        if code is None:
            path = self._find(pc)
            if path is None and self._maps_read < 16:
                self._read_maps()
                path = self._find(pc)
            code = library_code(path)
            if len(self._by_pc) < 65536:
                self._by_pc[pc] = code
        return code

    def lookup(self, sources: list[int], pcs: list[int]) -> list[int]:
        return [self.source(s) if s else (self.pc(p) if p else LIB_UNKNOWN)
                for s, p in zip(sources, pcs)]

    def _find(self, pc: int) -> str | None:
        for lo, hi, path in self._ranges:
            if lo <= pc < hi:
                return path
        return None

    def _read_maps(self) -> None:
        self._maps_read += 1
        ranges = []
        try:
            with open(self._maps_path) as fh:
                for line in fh:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        lo, hi = parts[0].split("-")
                        ranges.append((int(lo, 16), int(hi, 16), parts[5].strip()))
        except OSError:
            return
        self._ranges = ranges


def parse_buffer(data: bytes, layout: Layout, names: NameCache,
                 api_names: dict[tuple[int, int], str] | None = None,
                 markers: list | None = None,
                 libraries: LibraryResolver | None = None,
                 read: Callable[[int], str | None] | None = None) -> list[tuple]:
    """Parse one completed buffer into record tuples (:mod:`tuiprof.store.records`).

    API records come first (the store matches a kernel to its launch record, and names a
    memory record's API, by correlation id: a kernel or memory record seen after its API
    record needs no waiting), then kernels sorted by start time, then the few other records
    (memory records last).
    NVTX marker records go to ``markers`` (when given) as ``("M", flags, timestamp, id, name,
    domain, thread_id)``, in buffer order; they are not activity records of the store.
    ``read``: how a marker's name pointer becomes a string (default: this process's memory).
    """
    n = len(data)
    if n == 0:
        return []
    mv32 = memoryview(data).cast("I")
    offsets = layout.walk(mv32, n)
    w64 = np.frombuffer(data, dtype=np.uint64)
    w32 = np.frombuffer(data, dtype=np.uint32)
    i32 = np.frombuffer(data, dtype=np.int32)
    w16 = np.frombuffer(data, dtype=np.uint16)
    out: list[tuple] = []
    for kind in (KIND_RUNTIME, KIND_DRIVER):
        offs = offsets.get(kind)
        if offs:
            o = np.asarray(offs, dtype=np.int64)
            q = o >> 2
            dom = 2 if kind == KIND_RUNTIME else 1
            table = api_names or {}
            cb = w32[q + 1].tolist()
            out.extend(("R", table.get((dom, c), f"api#{c}"), s, e, k) for c, s, e, k in zip(
                cb, w64[(o + 8) >> 3].tolist(), w64[(o + 16) >> 3].tolist(),
                w32[q + 8].tolist()))
    koffs = offsets.get(KIND_CONCURRENT_KERNEL)
    if koffs:
        o = np.asarray(koffs, dtype=np.int64)
        start = w64[(o + 16) >> 3]
        order = np.argsort(start, kind="stable")
        o = o[order]
        start = start[order]
        q = o >> 2
        # Packed by position, in the order of store/records.py's K_* indices: this is the
        # parser's hot loop (a tuple per record, built in C by zip); readers use the names.
        cols = [
            names.lookup(w64[(o + 104) >> 3]),
            start.tolist(),
            w64[(o + 24) >> 3].tolist(),
            i32[q + 13].tolist(), i32[q + 14].tolist(), i32[q + 15].tolist(),   # grid 52..60
            i32[q + 16].tolist(), i32[q + 17].tolist(), i32[q + 18].tolist(),   # block 64..72
            w16[(o + 6) >> 1].tolist(),                                          # registers
            (i32[q + 19] + i32[q + 20]).tolist(),                                # static + dynamic smem
            w32[q + 12].tolist(),                                                # stream 48
            w32[q + 23].tolist(),                                                # correlation 92
            w32[q + 39].tolist(),                                                # graph id 156
        ]
        out.extend(zip(repeat("K"), *cols))
    libraries = libraries if libraries is not None else LibraryResolver()
    for kind, offs in sorted(offsets.items(), key=lambda kv: kv[0] == KIND_MEMORY2):
        if kind in (KIND_CONCURRENT_KERNEL, KIND_RUNTIME, KIND_DRIVER):
            continue
        o = np.asarray(offs, dtype=np.int64)
        q = o >> 2
        if kind == KIND_MEMCPY:
            copy_kind = np.frombuffer(data, dtype=np.uint8)[o + 4]
            out.extend(zip(repeat("C"), copy_kind.tolist(), w64[(o + 8) >> 3].tolist(),
                           w64[(o + 16) >> 3].tolist(), w64[(o + 24) >> 3].tolist(),
                           w32[q + 10].tolist(), w32[q + 11].tolist()))
        elif kind == KIND_MEMSET:
            out.extend(zip(repeat("S"), w64[(o + 8) >> 3].tolist(), w64[(o + 16) >> 3].tolist(),
                           w64[(o + 24) >> 3].tolist(), w32[q + 10].tolist(),
                           w32[q + 11].tolist()))
        elif kind == KIND_MEMORY2:
            # CUpti_ActivityMemory4 (cupti_activity.h, CUDA 13.0, 128 bytes): op @4, kind @8,
            # correlation @12, address @16, bytes @24, timestamp @32, PC @40, stream @60,
            # isAsync @72, memoryPoolConfig.memoryPoolType @80, source @120
            libs = libraries.lookup(w64[(o + 120) >> 3].tolist(), w64[(o + 40) >> 3].tolist())
            out.extend(zip(repeat("A"), i32[q + 1].tolist(), i32[q + 2].tolist(),
                           w64[(o + 24) >> 3].tolist(), w64[(o + 32) >> 3].tolist(),
                           w64[(o + 16) >> 3].tolist(), w32[q + 3].tolist(),
                           w32[q + 18].tolist(), w32[q + 20].tolist(), w32[q + 15].tolist(),
                           libs))
        elif kind == KIND_GRAPH_TRACE:
            out.extend(zip(repeat("G"), w64[(o + 8) >> 3].tolist(), w64[(o + 16) >> 3].tolist(),
                           w32[q + 1].tolist(), w32[q + 7].tolist(), w32[q + 9].tolist()))
        elif kind == KIND_MARKER:
            if markers is not None:
                markers.extend(_markers(data, o, q, w32, w64, read or _c_string))
    return out


def _markers(data: bytes, o: np.ndarray, q: np.ndarray, w32: np.ndarray,
             w64: np.ndarray, read: Callable[[int], str | None]) -> list[tuple]:
    # Marker names are not shared like kernel names: read each one (a few per step), never
    # through a pointer cache that a reused address would fool.
    out = []
    for flags, ts, mid, tid, name, dom in zip(
            w32[q + 1].tolist(), w64[(o + 8) >> 3].tolist(), w32[q + 4].tolist(),
            w32[q + 7].tolist(), w64[(o + 40) >> 3].tolist(), w64[(o + 48) >> 3].tolist()):
        out.append(("M", flags, ts, mid, read(name) if name else None,
                    read(dom) if dom else None, tid))
    return out


def _c_string(ptr: int) -> str | None:
    return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else None


# ---------------------------------------------------------------- C callbacks
REQUEST_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                              ctypes.POINTER(ctypes.c_size_t))
COMPLETE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                               ctypes.c_size_t, ctypes.c_size_t)


def find_libcupti() -> ctypes.CDLL:
    """The libcupti that cupti-python already loaded in this process."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            if "libcupti.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise OSError("libcupti is not loaded (call a cupti-python function first)")


class RawBuffers:
    """Buffer pool and the two C callbacks CUPTI calls; completed buffers are copied to ``sink``.

    One pool serves every CUPTI session of a collector (attached, finalized, attached again):
    its C callbacks and buffers live as long as the collector, since nothing says when CUPTI
    lets go of a pointer it was given. A buffer remembers the session (``epoch``) it was handed
    out in: one that comes back after that session's finalize is not parsed (its kernel names
    point into memory the finalize freed) and is counted in ``stale``; one CUPTI never gives
    back is never handed out again.
    """

    def __init__(self, buffer_bytes: int, sink) -> None:
        self.buffer_bytes = buffer_bytes
        self.sink = sink
        self._free: list[int] = []
        self._arrays: dict[int, np.ndarray] = {}
        self._out: dict[int, int] = {}  # address -> epoch it was handed out in
        self.epoch = 0
        self.stale = 0    # buffers completed after their session ended (not parsed)
        self.unknown = 0  # completions of a pointer that was not out (never parsed, never reused)
        self.request_cb = REQUEST_FN(self._request)
        self.complete_cb = COMPLETE_FN(self._complete)

    def _request(self, buf_pp, size_p, max_records_p) -> None:
        if self._free:
            addr = self._free.pop()
        else:
            arr = np.empty(self.buffer_bytes + 8, dtype=np.uint8)
            base = arr.ctypes.data
            addr = (base + 7) & ~7
            self._arrays[addr] = arr
        self._out[addr] = self.epoch
        buf_pp[0] = addr
        size_p[0] = self.buffer_bytes
        max_records_p[0] = 0

    def _complete(self, ctx, stream_id, buf, size, valid) -> None:
        epoch = self._out.pop(buf, None) if buf else None
        if epoch is None:
            self.unknown += 1
            return
        if epoch != self.epoch:
            self.stale += 1
        elif valid:
            self.sink(ctypes.string_at(buf, valid))
        self._free.append(buf)

    def held(self) -> int:
        """Buffers CUPTI holds now."""
        return len(self._out)

    def end_epoch(self) -> int:
        """The CUPTI session that holds the buffers out now was finalized: what it still
        gives back is stale. Returns how many it holds."""
        self.epoch += 1
        return len(self._out)

    def register(self, lib: ctypes.CDLL) -> None:
        fn = lib.cuptiActivityRegisterCallbacks
        fn.argtypes = [REQUEST_FN, COMPLETE_FN]
        fn.restype = ctypes.c_int
        res = fn(self.request_cb, self.complete_cb)
        if res != 0:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks returned {res}")
