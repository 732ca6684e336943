"""SQLite export of the recorded window in the Nsight Systems export schema.

Only the tables and columns that ``nsys stats`` reports read are written (as the 2025.3.1
reports' SQL reads them; docs/exports.md#sqlite-export-write_nsys_sqlite): ``StringIds``, ``CUPTI_ACTIVITY_KIND_KERNEL``/``_MEMCPY``/``_MEMSET``,
``CUPTI_ACTIVITY_KIND_RUNTIME``, ``NVTX_EVENTS``, ``TARGET_INFO_GPU`` and the ``ENUM_*`` tables,
so ``nsys stats tuiprof.sqlite`` runs ``cuda_gpu_kern_sum``, ``cuda_gpu_mem_time_sum``,
``cuda_gpu_mem_size_sum``, ``cuda_gpu_trace``, ``cuda_api_sum`` and ``nvtx_sum`` on it. Like
nsys's lazy export, an activity table with no rows is left out (its reports print SKIPPED).
Timestamps are CUPTI nanoseconds minus the window's first event. The DDL is tuiprof's own.
"""
from __future__ import annotations

import datetime as _dt
import json
import sqlite3
from pathlib import Path

from .. import __version__
from ..errors import TuiprofError
from ..store import StoreView
from ..store.rank_set import RanksView
from ..store.records import COPY_KINDS
from ._atomic import atomic_path
from .names import base_name
from .nsys_reports import CONTEXT_ID, NVTX_DOMAIN
from .window import Window, device_id, device_name, window_of

_COMMON = ("start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
           "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
           "correlationId INTEGER, globalPid INTEGER")

DDL = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": _COMMON + (
        ", demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
        "launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, "
        "gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, "
        "blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
        "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, "
        "localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, "
        "gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
        "sharedMemoryLimitConfig INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": _COMMON + (
        ", bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, "
        "srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, "
        "dstDeviceId INTEGER, dstContextId INTEGER, migrationCause INTEGER, "
        "graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER"),
    "CUPTI_ACTIVITY_KIND_MEMSET": _COMMON + (
        ", value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
        "returnValue INTEGER NOT NULL, callchainId INTEGER"),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER, jsonText TEXT"),
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, "
        "totalMemory INTEGER, smCount INTEGER, uuid TEXT, chipName TEXT, cuDevice INTEGER, "
        "computeMajor INTEGER, computeMinor INTEGER"),
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "ANALYSIS_DETAILS": ("globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
                         "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL"),
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "ENUM_CUDA_MEMCPY_OPER": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_CUDA_MEM_KIND": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_NSYS_EVENT_TYPE": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_NSYS_EVENT_CLASS": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
}

_MEMCPY_ENUM_NAMES = {0: "UNKNOWN", 1: "HTOD", 2: "DTOH", 3: "HTOA", 4: "ATOH", 5: "ATOA",
                      6: "ATOD", 7: "DTOA", 8: "DTOD", 9: "HTOH", 10: "PTOP", 11: "UVM_HTOD",
                      12: "UVM_DTOH", 13: "UVM_DTOD"}
ENUM_CUDA_MEMCPY_OPER = [
    (i, f"CUDA_MEMCPY_KIND_{_MEMCPY_ENUM_NAMES[i]}", label) for i, label in
    list(COPY_KINDS.items()) + [(11, "Unified Host-to-Device"), (12, "Unified Device-to-Host"),
                                (13, "Unified Device-to-Device")]]
ENUM_CUDA_MEM_KIND = [(i, f"CUDA_MEMOPR_MEMORY_KIND_{label.upper().replace(' ', '_')}", label)
                      for i, label in enumerate(["Pageable", "Pinned", "Device", "Array",
                                                 "Managed", "Device Static", "Managed Static",
                                                 "Unknown"])]
MEM_KIND_UNKNOWN_ID = 7
EVENT_PUSHPOP, EVENT_STARTEND, EVENT_DOMAIN_CREATE = 59, 60, 75
ENUM_NSYS_EVENT_TYPE = [(33, "NVTX_CATEGORY", "NvtxCategory"), (34, "NVTX_MARK", "NvtxMark"),
                        (39, "NVTX_THREAD", "NvtxThread"),
                        (59, "NVTX_PUSHPOP_RANGE", "NvtxPushPopRange"),
                        (60, "NVTX_STARTEND_RANGE", "NvtxStartEndRange"),
                        (75, "NVTX_DOMAIN_CREATE", "NvtxDomainCreate"),
                        (76, "NVTX_DOMAIN_DESTROY", "NvtxDomainDestroy")]
ENUM_NSYS_EVENT_CLASS = [(0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA Runtime API"),
                         (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA Driver API"),
                         (27, "TRACE_PROCESS_EVENT_OS_RUNTIME", "OS Runtime API")]

PID = 1  # a fixed, made-up process id: the export must not leak or depend on the host


class _Strings:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.ids)
        return i


def _create(con: sqlite3.Connection, table: str) -> None:
    con.execute(f"CREATE TABLE {table} ({DDL[table]})")


def _insert(con: sqlite3.Connection, table: str, cols: str, rows: list) -> None:
    if not rows:
        return
    marks = ",".join("?" * len(cols.split(",")))
    con.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)


def fill_database(con: sqlite3.Connection, view: StoreView, window: Window | None = None) -> None:
    """Create and fill the tables in an open (empty) database."""
    w = window if window is not None else window_of(view)
    t0 = w.t0
    arrivals = [r.arrival_ns for r in _requests_in(view, w)]
    if arrivals:  # the timeline starts at the earliest request: its queue wait is whole
        t0 = min(arrivals) if w.empty else min(t0, *arrivals)
    fill_parts(con, [(view, w, device_id(view), PID, "tuiprof")], t0)


def fill_database_ranks(con: sqlite3.Connection, rv: RanksView) -> None:
    """All ranks of a session in one database: each rank's rows carry its GPU's ``deviceId``
    and its own process (``globalPid``); ``TARGET_INFO_GPU`` lists every device. Timestamps
    are on the ranks' aligned timeline, from the first event of any rank."""
    parts = []
    for r, (view, off) in enumerate(zip(rv.views, rv.clock.offsets_ns)):
        w = window_of(view)
        _shift(w, off)
        parts.append((view, w, device_id(view), PID + r, f"tuiprof rank {r}"))
    starts = [w.t0 for _, w, *_ in parts if not w.empty]
    fill_parts(con, parts, min(starts) if starts else 0)


def _shift(w: Window, off: int) -> None:
    if not off:
        return
    for op in w.ops:
        op.start, op.end = op.start - off, op.end - off
    for a in w.api:
        a.start, a.end = a.start - off, a.end - off
    w.ranges = [(n, s - off, e - off) for n, s, e in w.ranges]
    w.t0, w.t1 = w.t0 - off, w.t1 - off


def fill_parts(con: sqlite3.Connection, parts: list, t0: int) -> None:
    """Tables for ``parts``: ``(view, window, deviceId, pid, process name)`` each."""
    strings = _Strings()
    kernels, memcpys, memsets, runtime, nvtx = [], [], [], [], []
    threads, processes, gpus = [], [], {}
    t1 = t0
    n = 0
    for view, w, dev, pid, pname in parts:
        gpid = pid << 24
        gtid = gpid | pid
        t1 = max(t1, w.t1)
        for op in w.ops:
            common = (op.start - t0, op.end - t0, dev, CONTEXT_ID, None, op.stream, op.corr, gpid)
            if op.kind == "K":
                kernels.append(common + (
                    strings(op.name), strings(base_name(op.name)), strings(op.raw), op.regs,
                    *op.grid, *op.block, op.smem, 0, 0, 0, n))
            elif op.kind == "C":
                memcpys.append(common + (op.bytes, op.copy_kind, MEM_KIND_UNKNOWN_ID,
                                         MEM_KIND_UNKNOWN_ID, dev, CONTEXT_ID, dev, CONTEXT_ID))
            else:
                memsets.append(common + (0, op.bytes, MEM_KIND_UNKNOWN_ID))
            n += 1
        runtime += [(a.start - t0, a.end - t0, 1 if a.name.startswith("cu") and not
                     a.name.startswith("cuda") else 0, gtid, a.corr, strings(a.name), 0)
                    for a in w.api]
        nvtx += [(s - t0, e - t0, EVENT_PUSHPOP, _text(name), gtid, None, 0, None)
                 for name, s, e in w.ranges]
        threads.append((strings(pname), 0, gtid))
        reqs = _request_ranges(view, w, t0, gpid | (pid + 1))
        if reqs:
            nvtx += reqs
            threads.append((strings(f"{pname} requests"), 0, gpid | (pid + 1)))
        processes.append((gpid, pid, _text(pname)))
        sm = view.meta.get("sm_count")
        gpus.setdefault(dev, (0, dev, _text(device_name(view)),
                              sm if isinstance(sm, int) else None, dev))

    for table in ("StringIds", "ThreadNames", "PROCESSES", "TARGET_INFO_GPU",
                  "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS", "META_DATA_EXPORT",
                  "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND", "ENUM_NSYS_EVENT_TYPE",
                  "ENUM_NSYS_EVENT_CLASS"):
        _create(con, table)
    for table, rows in (("CUPTI_ACTIVITY_KIND_KERNEL", kernels),
                        ("CUPTI_ACTIVITY_KIND_MEMCPY", memcpys),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", memsets),
                        ("CUPTI_ACTIVITY_KIND_RUNTIME", runtime), ("NVTX_EVENTS", nvtx)):
        if rows:
            _create(con, table)
    _insert(con, "CUPTI_ACTIVITY_KIND_KERNEL",
            "start,end,deviceId,contextId,greenContextId,streamId,correlationId,globalPid,"
            "demangledName,shortName,mangledName,registersPerThread,gridX,gridY,gridZ,"
            "blockX,blockY,blockZ,staticSharedMemory,dynamicSharedMemory,localMemoryPerThread,"
            "localMemoryTotal,gridId", kernels)
    _insert(con, "CUPTI_ACTIVITY_KIND_MEMCPY",
            "start,end,deviceId,contextId,greenContextId,streamId,correlationId,globalPid,"
            "bytes,copyKind,srcKind,dstKind,srcDeviceId,srcContextId,dstDeviceId,dstContextId",
            memcpys)
    _insert(con, "CUPTI_ACTIVITY_KIND_MEMSET",
            "start,end,deviceId,contextId,greenContextId,streamId,correlationId,globalPid,"
            "value,bytes,memKind", memsets)
    _insert(con, "CUPTI_ACTIVITY_KIND_RUNTIME",
            "start,end,eventClass,globalTid,correlationId,nameId,returnValue", runtime)
    if nvtx and NVTX_DOMAIN:
        pass  # a named domain would need an eventType-75 row; tuiprof uses the default one
    _insert(con, "NVTX_EVENTS",
            "start,end,eventType,text,globalTid,endGlobalTid,domainId,jsonText", nvtx)
    _insert(con, "ThreadNames", "nameId,priority,globalTid", threads)
    _insert(con, "PROCESSES", "globalPid,pid,name", processes)
    _insert(con, "TARGET_INFO_GPU", "vmId,id,name,smCount,cuDevice", list(gpus.values()))
    utc = _dt.datetime.fromtimestamp(t0 / 1e9, _dt.timezone.utc) if t0 > 0 else None
    _insert(con, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs,utcTime,localTime",
            [(t0, utc.isoformat() if utc else None, None)])
    _insert(con, "ANALYSIS_DETAILS", "globalVid,duration,startTime,stopTime",
            [(0, t1 - t0, 0, t1 - t0)])
    _insert(con, "META_DATA_EXPORT", "name,value",
            [("EXPORT_PRODUCT_VERSION", f"tuiprof {__version__}"),
             ("EXPORT_PRODUCER", "tuiprof (not Nsight Systems)"),
             ("TUIPROF_WINDOW_TOKENS", str(sum(len(w.tokens) for _, w, *_ in parts))),
             ("TUIPROF_TIME_ORIGIN_CUPTI_NS", str(t0))]
            + ([("TUIPROF_RANKS", str(len(parts)))] if len(parts) > 1 else []))
    _insert(con, "ENUM_CUDA_MEMCPY_OPER", "id,name,label", ENUM_CUDA_MEMCPY_OPER)
    _insert(con, "ENUM_CUDA_MEM_KIND", "id,name,label", ENUM_CUDA_MEM_KIND)
    _insert(con, "ENUM_NSYS_EVENT_TYPE", "id,name,label", ENUM_NSYS_EVENT_TYPE)
    _insert(con, "ENUM_NSYS_EVENT_CLASS", "id,name,label", ENUM_NSYS_EVENT_CLASS)
    _insert(con, "StringIds", "id,value", [(i, _text(s)) for s, i in strings.ids.items()])


def _text(value: object) -> str:
    """A name as SQLite TEXT: exactly, unless it holds a lone surrogate (valid in JSON, not
    UTF-8), which is written as its ``\\udxxx`` escape."""
    s = str(value)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _requests_in(view: StoreView, w: Window) -> list:
    from ..analysis.requests import export_requests  # noqa: PLC0415

    if not view.requests.rows:
        return []
    return export_requests(view, w.t0, w.t1) if not w.empty else list(view.requests.rows)


def _request_ranges(view: StoreView, w: Window, t0: int, gtid: int) -> list:
    """A server's requests as start/end ranges on a thread of their own: ``request`` and its
    ``request queued``, ``request prefill`` and ``request decode``, the request's id in
    ``jsonText``; those alive in the window (all, with no window)."""
    from ..analysis.requests import now_ns, phases  # noqa: PLC0415

    reqs = _requests_in(view, w)
    now = now_ns(view)
    out = []
    for r in reqs:
        rid = json.dumps({"request": r.id if isinstance(r.id, (str, int)) else str(r.id)})
        for name, s, e in phases(r, now):
            label = "request" if name == "request" else f"request {name}"
            out.append((max(s, t0) - t0, max(e, t0) - t0, EVENT_STARTEND, label, gtid, None, 0,
                        rid))
    return out


def write_nsys_sqlite(view: StoreView | RanksView, path: str | Path) -> Path:
    """Write the recorded window of ``view`` (every rank's, for a :class:`RanksView`) as an
    nsys-schema SQLite file (atomically).

    The name must end in ``.sqlite`` for ``nsys stats`` to open it.
    """
    target = Path(path)
    if target.suffix != ".sqlite":
        raise TuiprofError(f"cannot write {target}: nsys stats only opens files ending in .sqlite")
    window = None if isinstance(view, RanksView) else window_of(view)
    with atomic_path(target, suffix=".tmp") as tmp:
        con = sqlite3.connect(tmp)
        try:
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            with con:
                if window is None:
                    fill_database_ranks(con, view)
                else:
                    fill_database(con, view, window)
        finally:
            con.close()
    return target


__all__ = ["write_nsys_sqlite", "fill_database", "fill_database_ranks", "DDL", "ENUM_CUDA_MEMCPY_OPER",
           "ENUM_CUDA_MEM_KIND", "ENUM_NSYS_EVENT_TYPE", "ENUM_NSYS_EVENT_CLASS"]
