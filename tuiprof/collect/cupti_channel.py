"""CUPTI records of a native program (C, C++, Rust), received from its injection library.

The session listens on a Unix socket in a private directory (0700) and passes its path to the
program in ``TUIPROF_NATIVE_CHANNEL``; ``CUDA_INJECTION64_PATH`` names tuiprof's injection
library (``tuiprof/injection/inject.c``), which the CUDA driver loads at the program's first
``cuInit``. One thread here accepts the connection, answers its greeting with what to collect,
and reads frames; each completed CUPTI buffer goes through the same raw-buffer parser as the
in-process path (:func:`tuiprof.collect.cupti_raw.parse_buffer`), its strings resolved from
what the program sent, then to the marker sink (steps) and the store.

Frames (host byte order, one machine): a 16-byte header ``u32 magic "TPRF", u32 type, u64
length`` and ``length`` bytes.

- program → session: HELLO (``u32 proto, pid, cupti version, 0; u64 CUPTI timestamp,
  CLOCK_REALTIME ns`` read together: the clock offset), STRINGS (``u64 pointer, u32 length,
  u32 transient, bytes`` padded to 8, repeated: kernel names and memory sources once per
  pointer, NVTX marker names with every buffer), SIZES (``u32 kind, u32 record size`` pairs),
  BUFFER (CUPTI's bytes as they are), STATS and END (``u64 dropped, refused, buffers, bytes,
  lost``, cumulative; END after the exit flush), ERROR (one line of text).
- session → program: CONFIG (``u32 accept, flags, buffer bytes, max buffers, flush period ms,
  exit wait ms, runtime ids, driver ids``, then the callback ids of the API subset); FLUSH
  (no payload: before the session signals the program, whose default action would end it
  without its exit flush), answered with FLUSHED (STATS' payload) once every buffer is sent;
  TRACE (``u32 on``: a sampling burst begins or ends), answered with TRACED (``u32 on, u32 0,
  u64 CUPTI time of the switch``).

Flags: API, MEMORY, MARKERS (what to collect), GRAPHS (graph-level trace: one GRAPH_TRACE
record per CUDA-graph launch and no record of its kernels, chosen for the program's life since
CUPTI does not go back to node-level trace), SAMPLED (the kernel-level kinds start off; the
session's TRACE frames switch them for bursts, :class:`BurstSchedule`).

Bounded: the program's pool holds ``max_buffers`` buffers of ``buffer_bytes``; here one frame
is read at a time (at most ``MAX_FRAME`` bytes), and the string tables hold what the program's
kernels and allocation sites name. A second process of the program that loads the library
(a child it starts) is refused and runs unprofiled; the session says so.
"""
from __future__ import annotations

import os
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

from ..errors import safe_text
from ..store import SessionStore
from ..store.records import (G_CORR, G_END, G_GRAPH, G_START, G_STREAM, GRAPH, GRAPH_KERNEL,
                             KERNEL, KIND)
from .native_sampling import BurstFilter, BurstSchedule, TracedWindows
from .cupti_collector import DRIVER_APIS, RUNTIME_APIS, MarkerSink, _short_api
from .cupti_raw import Layout, LayoutError, LibraryResolver, NameCache, parse_buffer

MAGIC = 0x46525054
PROTO = 2
MSG_HELLO, MSG_STRINGS, MSG_SIZES, MSG_BUFFER = 1, 2, 3, 4
MSG_STATS, MSG_ERROR, MSG_END, MSG_CONFIG = 5, 6, 7, 8
MSG_FLUSH, MSG_FLUSHED, MSG_TRACE, MSG_TRACED = 9, 10, 11, 12
FLAG_API, FLAG_MEMORY, FLAG_MARKERS, FLAG_GRAPHS, FLAG_SAMPLED = 1, 2, 4, 8, 16
TRACED = struct.Struct("=IIQ")
HEADER = struct.Struct("=IIQ")
CONFIG = struct.Struct("=8I")
STATS = struct.Struct("=5Q")
HELLO = struct.Struct("=4I2Q")

BUFFER_BYTES = 4 << 20     # CUPTI buffer size in the program
MAX_BUFFERS = 16           # the program's pool: at most 64 MiB of records in flight
FLUSH_PERIOD_MS = 500      # records reach a live display at least this often
EXIT_WAIT_MS = 10_000      # at exit, the program waits this long at most for the session
MAX_FRAME = 256 << 20
FLUSH_WAIT_S = 2.0         # how long a flush asked before a signal may take


class ChannelError(RuntimeError):
    """The program's side broke the protocol; the message is one line."""


class NativeCollector:
    """Receives a native program's CUPTI buffers and folds them into ``store``.

    A collector (:mod:`tuiprof.collect.base`): its state is the session's CUPTI state
    (``name``), since it is CUPTI, in another process; ``cost_s`` is the parsing and folding."""

    name = "cupti"

    def __init__(self, store: SessionStore, *, cupti_lib: str, include: str | None = None,
                 sink: MarkerSink | None = None, nvtx: bool = False, api: bool = True,
                 memory: bool = True,
                 buffer_bytes: int = BUFFER_BYTES, max_buffers: int = MAX_BUFFERS,
                 flush_period_ms: int = FLUSH_PERIOD_MS, exit_wait_ms: int = EXIT_WAIT_MS,
                 program: str = "the program", graphs: str = "node",
                 schedule: BurstSchedule | None = None) -> None:
        self.store = store
        self.cupti_lib = str(cupti_lib)
        self.sink = sink   # every parsed buffer's markers and records go through it
        self.nvtx = nvtx      # NVTX marker records wanted (--step-range)
        self.api, self.memory = api, memory
        self.buffer_bytes, self.max_buffers = int(buffer_bytes), int(max_buffers)
        self.flush_period_ms, self.exit_wait_ms = int(flush_period_ms), int(exit_wait_ms)
        self.program = program      # the binary's name, in messages
        self.graphs = graphs        # "node": every kernel of a graph; "graph": one record a launch
        self.schedule = schedule    # sampling bursts (None: every kernel traced, all along)
        self.traced = TracedWindows(always=schedule is None)
        self.burst_filter = BurstFilter(self.traced) if schedule is not None else None
        ids: dict = {}
        if include is not None:
            from ..injection.build import callback_ids  # noqa: PLC0415

            ids = callback_ids(Path(include))
        self._runtime = [ids[(2, n)] for n in RUNTIME_APIS if (2, n) in ids]
        self._driver = [ids[(1, n)] for n in DRIVER_APIS if (1, n) in ids]
        self._api_names = {(d, i): _short_api(n) for (d, n), i in ids.items()}
        self._strings: dict[int, str] = {}
        self._transient: dict[int, str] = {}
        self._layout = Layout()
        self._names = NameCache(self._read)
        self._libraries: LibraryResolver | None = None
        self._dir = ""
        self.address = ""
        self._listen: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.offset_ns = 0         # CUPTI clock - CLOCK_REALTIME in the program
        self.pid: int | None = None
        self.cupti_version = 0
        self.connected = threading.Event()
        self.ended = threading.Event()       # END received: everything measured arrived
        self.closed = threading.Event()      # the connection is over (END, EOF or error)
        self.flushed = threading.Event()     # FLUSHED received (after a FLUSH)
        self.errors: list[str] = []
        self.refused_processes = 0
        self.bursts = 0
        self.buffers = 0
        self.records = 0
        self.kernels = 0
        self.fold_s = 0.0
        self._last = (0, 0, 0, 0, 0)  # STATS seen last
        self.running = False

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        """Listen and start the reader thread; raises OSError."""
        self._dir = tempfile.mkdtemp(prefix="tuiprof-native-")
        self.address = os.path.join(self._dir, "channel")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.address)
            sock.listen(4)
        except OSError:
            sock.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._listen = sock
        self.running = True
        self._thread = threading.Thread(target=self._run, name="tuiprof-native", daemon=True)
        self._thread.start()

    def env(self, library: str) -> dict[str, str]:
        """What the program's environment needs: the driver loads ``library`` at cuInit."""
        env = {"CUDA_INJECTION64_PATH": str(library), "TUIPROF_NATIVE_CHANNEL": self.address,
               "TUIPROF_NATIVE_CUPTI": self.cupti_lib}
        if self.nvtx:  # NVTX ranges reach CUPTI through its NVTX injection
            env["NVTX_INJECTION64_PATH"] = self.cupti_lib
        return env

    @property
    def cost_s(self) -> float:
        return self.fold_s

    def clock(self) -> int:
        """The program's CUPTI clock, from here (CLOCK_REALTIME plus the offset it sent)."""
        return time.time_ns() + self.offset_ns

    def flush(self, timeout: float = FLUSH_WAIT_S) -> bool:
        """Ask the program for every record it holds (before it is signalled); True once they
        all arrived. The program's sender answers within a tenth of a second."""
        conn = self._conn
        if conn is None or self.closed.is_set():
            return False
        self.flushed.clear()
        try:
            conn.sendall(HEADER.pack(MAGIC, MSG_FLUSH, 0))
        except OSError:
            return False
        return self.flushed.wait(timeout)

    def traced_at(self, ts: int) -> bool:
        """Whether the program's kernels were traced at CUPTI time ``ts`` (a step starting
        then is a traced step; the others are seen by their graph records, if at all)."""
        return self.traced.at(ts)

    def _trace(self, on: bool) -> None:
        conn = self._conn
        if conn is None or self.closed.is_set():
            return
        try:
            conn.sendall(HEADER.pack(MAGIC, MSG_TRACE, 4) + struct.pack("=I", int(on)))
        except OSError:
            pass

    def wait_end(self, timeout: float) -> bool:
        """Wait until the program's connection is over; True if its END came."""
        if self.connected.is_set():
            self.closed.wait(timeout)
        return self.ended.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading (what arrived is folded), close the channel, remove its directory."""
        if not self.running:
            return
        if self.connected.is_set():
            self.closed.wait(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.sink is not None:
            self._fold(self.sink.drain())
        for s in (self._conn, self._listen):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        shutil.rmtree(self._dir, ignore_errors=True)
        self.running = False

    # ------------------------------------------------------------------ reader
    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # never a traceback from a thread: one line, data kept
            self._say_error(f"the channel from {self.program} broke: {safe_text(exc, 160)}")
        finally:
            self.closed.set()

    def _serve(self) -> None:
        lst = self._listen
        tick = time.monotonic()
        while not self._stop.is_set():
            socks = [lst] + ([self._conn] if self._conn is not None else [])
            ready, _, _ = select.select(socks, [], [], 0.25)
            if lst in ready:
                conn, _ = lst.accept()
                if self._conn is None and not self.closed.is_set():
                    self._conn = conn
                else:
                    self._refuse(conn)
            if self._conn is not None and self._conn in ready:
                try:
                    if not self._frame(self._conn):
                        self._conn_over()
                except ChannelError as exc:
                    self._say_error(f"the channel from {self.program} broke: {exc}")
                    self._conn_over()
            now = time.monotonic()
            if self.schedule is not None and self._conn is not None and self.connected.is_set():
                want = self.schedule.due(now)
                if want is not None:
                    self._trace(want)
            if self.sink is not None and now - tick >= 0.5:  # held records whose time came
                tick = now
                self._fold(self.sink.feed([], []))

    def _conn_over(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if not self.ended.is_set() and self.connected.is_set():
            self.store.add_event("cupti", f"{self.program} ended without tuiprof's exit flush "
                                 "(killed, _exit or a crash): its last records may be missing")
        self.closed.set()

    def _refuse(self, conn: socket.socket) -> None:
        """Another process of the program: it runs unprofiled (one is what a session holds)."""
        try:
            conn.settimeout(2.0)
            head = _recv_exact(conn, HEADER.size)
            _, kind, length = HEADER.unpack(head)
            if kind == MSG_HELLO and length <= 4096:
                hello = _recv_exact(conn, length)
                pid = HELLO.unpack_from(hello)[1] if length >= HELLO.size else 0
                conn.sendall(HEADER.pack(MAGIC, MSG_CONFIG, CONFIG.size)
                             + CONFIG.pack(0, 0, 0, 0, 0, 0, 0, 0))
                self.refused_processes += 1
                self.store.add_event("cupti", f"process {pid} (started by {self.program}) also "
                                     "uses CUDA: not profiled (one process per session)")
        except (OSError, ChannelError, struct.error):
            pass
        finally:
            conn.close()

    def _frame(self, conn: socket.socket) -> bool:
        """Read and handle one frame; False at the end of the connection."""
        head = _recv_exact(conn, HEADER.size, eof_ok=True)
        if head is None:
            return False
        magic, kind, length = HEADER.unpack(head)
        if magic != MAGIC or length > MAX_FRAME:
            raise ChannelError(f"bad frame (magic {magic:#x}, {length} bytes)")
        data = _recv_exact(conn, length) if length else b""
        if kind == MSG_BUFFER:
            self._buffer(data)
        elif kind == MSG_STRINGS:
            self._strings_frame(data)
        elif kind == MSG_SIZES:
            for k, size in struct.iter_unpack("=II", data[:len(data) // 8 * 8]):
                self._layout.sizes[k] = size
        elif kind == MSG_HELLO:
            self._hello(conn, data)
        elif kind in (MSG_STATS, MSG_END, MSG_FLUSHED):
            self._stats(data)
            if kind == MSG_END:
                self.ended.set()
            elif kind == MSG_FLUSHED:
                self.flushed.set()
        elif kind == MSG_TRACED:
            if len(data) >= TRACED.size:
                on, _, ts = TRACED.unpack_from(data)
                self.traced.switched(bool(on), int(ts))
                if on:
                    self.bursts += 1
        elif kind == MSG_ERROR:
            self._say_error(f"in {self.program}: " + safe_text(data.decode("utf-8", "replace"),
                                                            300))
        else:
            raise ChannelError(f"unknown frame type {kind}")
        return True

    def _hello(self, conn: socket.socket, data: bytes) -> None:
        if len(data) < HELLO.size:
            raise ChannelError("short greeting")
        proto, pid, version, _, cupti_ts, realtime = HELLO.unpack_from(data)
        if proto != PROTO:
            conn.sendall(HEADER.pack(MAGIC, MSG_CONFIG, CONFIG.size) + CONFIG.pack(*[0] * 8))
            raise ChannelError(f"injection library protocol {proto}, session {PROTO} "
                               "(a stale build? remove tuiprof's native cache)")
        self.pid, self.cupti_version = pid, version
        self.offset_ns = int(cupti_ts) - int(realtime)
        self._libraries = LibraryResolver(f"/proc/{pid}/maps", self._read)
        flags = ((FLAG_API if self.api else 0) | (FLAG_MEMORY if self.memory else 0)
                 | (FLAG_MARKERS if self.nvtx else 0)
                 | (FLAG_GRAPHS if self.graphs == "graph" else 0)
                 | (FLAG_SAMPLED if self.schedule is not None else 0))
        ids = self._runtime + self._driver
        payload = CONFIG.pack(1, flags, self.buffer_bytes, self.max_buffers,
                              self.flush_period_ms, self.exit_wait_ms, len(self._runtime),
                              len(self._driver)) + struct.pack(f"={len(ids)}I", *ids)
        conn.sendall(HEADER.pack(MAGIC, MSG_CONFIG, len(payload)) + payload)
        self.store.meta["native"] = {"pid": pid, "cupti_version": version,
                                     "clock_offset_ns": self.offset_ns}
        self.store.set_collector("cupti", True, f"CUPTI in {self.program} (pid {pid}, injected): "
                                 "kernels, memcpy, memset, memory" + (", API subset" if self.api
                                                                       else "")
                                 + ("; CUDA graphs: one record a launch" if self.graphs == "graph"
                                    else "")
                                 + ("; " + self.schedule.words() if self.schedule is not None
                                    else "; every step traced"))
        if self.schedule is not None:
            self.schedule.start(time.monotonic())
        self.connected.set()

    def _strings_frame(self, data: bytes) -> None:
        off, n = 0, len(data)
        keep, transient = self._strings, self._transient
        while off + 16 <= n:
            ptr, length, flag = struct.unpack_from("=QII", data, off)
            off += 16
            text = data[off:off + length].decode("utf-8", "replace")
            off += (length + 7) & ~7
            (transient if flag else keep)[ptr] = text

    def _read(self, ptr: int) -> str | None:
        s = self._transient.get(ptr)
        return s if s is not None else self._strings.get(ptr)

    def _buffer(self, data: bytes) -> None:
        t0 = time.thread_time()
        markers = [] if self.sink is not None else None  # (none unless NVTX is on)
        try:
            records = parse_buffer(data, self._layout, self._names, self._api_names, markers,
                                   self._libraries, read=self._read)
        except LayoutError as exc:
            self._say_error("CUPTI records unreadable: " + safe_text(exc, 120))
            return
        finally:
            self._transient.clear()
        self.buffers += 1
        self.records += len(records)
        self.kernels += sum(1 for r in records if r[KIND] == KERNEL)
        f = self.burst_filter
        if f is not None:
            records = f.filter(records)
        if self.graphs == "graph":
            records = graph_kernels(records)
        if markers is not None:
            records = self.sink.feed(markers, records)
        self.store.add_records(records)
        self.fold_s += time.thread_time() - t0

    def _fold(self, records: list) -> None:
        if records:
            t0 = time.thread_time()
            self.store.add_records(records)
            self.fold_s += time.thread_time() - t0

    def _stats(self, data: bytes) -> None:
        if len(data) < STATS.size:
            return
        now = STATS.unpack_from(data)
        dropped, refused, _, _, lost = (a - b for a, b in zip(now, self._last))
        self._last = now
        if dropped > 0:
            self.store.note_dropped(dropped)
        if refused > 0:
            self.store.add_event("cupti", f"{refused} CUPTI buffer request(s) refused in "
                                 f"{self.program}: the session fell behind (records dropped, "
                                 "counted)")
        if lost > 0:
            self.store.add_event("cupti", f"{lost} CUPTI buffer(s) of {self.program} not sent "
                                 "(the channel broke or the exit wait ran out)")

    def _say_error(self, text: str) -> None:
        self.errors.append(text)
        self.store.set_collector("cupti", False, text)
        self.store.add_event("error", text)

    def stats(self) -> dict:
        """Counts the program sent last (cumulative), for the snapshot's meta."""
        dropped, refused, buffers, nbytes, lost = self._last
        return {"buffers": buffers, "bytes": nbytes, "dropped": dropped, "refused": refused,
                "lost": lost, "parsed_buffers": self.buffers, "records": self.records,
                "kernels": self.kernels, "refused_processes": self.refused_processes,
                "end_received": self.ended.is_set(), "graphs": self.graphs,
                "bursts": self.bursts, "traced_s": round(self.traced.seconds(), 3),
                "burst_straddled": self.burst_filter.straddled if self.burst_filter else 0,
                "burst_overlapping": self.burst_filter.overlapping if self.burst_filter else 0,
                "burst_overlapped": self.burst_filter.overlapped if self.burst_filter else 0,
                "burst_dropped": list(self.burst_filter.dropped) if self.burst_filter else []}


def graph_kernels(records: list) -> list:
    """Graph-level trace: beside each CUDA-graph launch record, a kernel-shaped record of the
    whole launch (``GRAPH_KERNEL``, the launch's stream, correlation and graph ids, no launch
    configuration), so that the kernel stream, the step detector and the kernels pane see the
    launch as one unit of the step's work. The graph record itself stays (the step's graph span)."""
    if not any(r[KIND] == GRAPH for r in records):
        return records
    out = []
    for r in records:
        out.append(r)
        if r[KIND] == GRAPH and (r[G_START] or r[G_END]):  # 0, 0: CUPTI had no times for it
            out.append((KERNEL, GRAPH_KERNEL, r[G_START], r[G_END], 0, 0, 0, 0, 0, 0, 0, 0,
                        r[G_STREAM], r[G_CORR], r[G_GRAPH]))
    return out


def _recv_exact(conn: socket.socket, n: int, eof_ok: bool = False) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = conn.recv_into(view[got:], n - got)
        except InterruptedError:
            continue
        if k == 0:
            if eof_ok and got == 0:
                return None
            raise ChannelError(f"the connection closed mid-frame ({got} of {n} bytes)")
        got += k
    return bytes(buf) if n <= 4096 else buf


