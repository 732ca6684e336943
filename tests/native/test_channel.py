"""The native hand-off, end to end on the CPU: tuiprof's injection library (built as in use),
loaded by a program the way the CUDA driver loads it, gets CUPTI records in CUPTI's documented
layout from a stand-in libcupti (CUPTI needs a GPU), and sends them over the real socket to a
real :class:`NativeCollector`, whose raw-buffer parser must give back exactly what was built."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tuiprof.collect import cupti_channel as ch
from tuiprof.collect.cupti_channel import NativeCollector
from tuiprof.store import SessionStore

from .helpers import KERNEL, LAUNCH, MEMCPY_ASYNC, Script, compile_native, decode_like, dtypes


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return compile_native(tmp_path_factory.mktemp("native"))


class Capture:
    """A step source that keeps what it is fed (to compare with what was sent) and passes it on."""

    def __init__(self) -> None:
        self.records: list = []
        self.markers: list = []

    def feed(self, markers, records):
        self.markers.extend(markers)
        self.records.extend(records)
        return records

    def drain(self):
        return []


def _collector(native, store, **kw) -> NativeCollector:
    c = NativeCollector(store, cupti_lib=str(native.fake), include=str(native.build.cupti.include),
                        program="driver", **kw)
    c.start()
    return c


def _run(native, c, *args, env=None, timeout=60):
    e = dict(os.environ, **c.env(str(native.build.path)), **(env or {}))
    return subprocess.run([str(native.driver), *args], env=e, capture_output=True, text=True,
                          timeout=timeout)


def test_buffers_arrive_whole_and_parse_exactly(native, tmp_path):
    s = Script()
    s.memory(1, 1 << 20, 900, 0x7000, 1, source="/usr/lib/libcublasLt.so.13")
    s.api(LAUNCH, 950, 990, 10)
    s.kernel("_Z4gemvPKfS0_Pfi", 1000, 1200, 10, grid=(4, 12, 1), block=(384, 1, 1), regs=168,
             smem=(1024, 32), stream=7, graph=5)
    s.memset(64, 1300, 1400, 11)
    s.api(MEMCPY_ASYNC, 1450, 1480, 12)
    s.memcpy(2, 8, 1500, 1600, 12)
    for i in range(200):  # 11 buffers (40 records each), the last one delivered at exit
        s.api(LAUNCH, 2000 + 10 * i, 2005 + 10 * i, 100 + i)
        s.kernel(f"k{i % 3}", 2006 + 10 * i, 2009 + 10 * i, 100 + i)
    store = SessionStore()
    cap = Capture()
    c = _collector(native, store, sink=cap)
    proc = _run(native, c, "run", str(s.write(tmp_path / "s.bin")), "40", "4")
    assert c.wait_end(10)
    c.stop()
    assert proc.returncode == 4, proc.stderr          # exit() from a function, status kept
    assert "driver: emitted 406" in proc.stdout
    recs = cap.records
    assert ("K", "_Z4gemvPKfS0_Pfi", 1000, 1200, 4, 12, 1, 384, 1, 1, 168, 1056, 7, 10, 5) in recs
    assert ("R", "cudaLaunchKernel", 950, 990, 10) in recs
    assert ("R", "cudaMemcpyAsync", 1450, 1480, 12) in recs
    assert ("S", 64, 1300, 1400, 7, 11) in recs
    assert ("C", 2, 8, 1500, 1600, 7, 12) in recs
    alloc = next(r for r in recs if r[0] == "A")
    assert alloc[1:6] == (1, 3, 1 << 20, 900, 0x7000) and alloc[10] == 2  # cuBLAS, by its source
    ks = [r for r in recs if r[0] == "K"]
    assert len(ks) == 201 and len(recs) == 406
    assert [r[1] for r in ks[1:]] == [f"k{i % 3}" for i in range(200)]
    st = c.stats()
    assert st["end_received"] and st["lost"] == 0 and st["dropped"] == 0
    assert st["parsed_buffers"] == st["buffers"] == 11     # 406 records, 40 a buffer
    assert c.pid and abs(c.offset_ns - 5000) < 2_000_000    # the stand-in's clock: +5 us
    assert store.view(raw=False).counters["kernels"] == 201


def test_the_library_asks_for_the_python_paths_kinds_and_api_subset(native, tmp_path):
    from tuiprof.collect.cupti_collector import DRIVER_APIS, RUNTIME_APIS
    from tuiprof.injection.build import callback_ids

    s = Script()
    s.kernel("k", 10, 20, 1)
    c = _collector(native, SessionStore(), nvtx=True)
    proc = _run(native, c, "run", str(s.write(tmp_path / "s.bin")), "4", "0")
    c.stop()
    line = next(x for x in proc.stdout.splitlines() if x.startswith("fake-cupti:"))
    kinds, runtime, driver, flush = (p.split()[1:] for p in line[len("fake-cupti: "):].split(";"))
    # CONCURRENT_KERNEL, MEMCPY, MEMSET, MEMORY2, MARKER (NVTX asked), RUNTIME, DRIVER
    assert sorted(map(int, kinds)) == [1, 2, 4, 5, 10, 12, 49]
    ids = callback_ids(native.build.cupti.include)
    assert sorted(map(int, runtime)) == sorted(ids[(2, n)] for n in RUNTIME_APIS if (2, n) in ids)
    assert sorted(map(int, driver)) == sorted(ids[(1, n)] for n in DRIVER_APIS if (1, n) in ids)
    assert flush == ["500"]
    e = c.env("/x.so")
    assert e["NVTX_INJECTION64_PATH"] == str(native.fake) and e["CUDA_INJECTION64_PATH"] == "/x.so"


def test_cupti_reserves_nsys_device_footprint_unless_asked(native, tmp_path):
    """CUPTI's device-side record buffers move the program's own buffers, and its kernels' speed
    with them (docs/native.md, "Placement"): by default the library asks CUPTI for 7 buffers
    (nsys's 28 MiB), pinned host memory reserves nothing on the device, a TUIPROF_CUPTI_*
    variable sets its attribute, and a value CUPTI refuses is one line."""
    s = Script()
    s.kernel("k", 10, 20, 1)
    script = str(s.write(tmp_path / "s.bin"))

    def attrs(env):
        c = _collector(native, SessionStore())
        proc = _run(native, c, "run", script, "4", "0", env=env)
        c.wait_end(10)
        c.stop()
        line = next((x for x in proc.stdout.splitlines() if x.startswith("fake-cupti-attrs:")),
                    "fake-cupti-attrs:")
        return dict(p.split("=") for p in line.split()[1:]), c

    # DEVICE_BUFFER_SIZE (0), DEVICE_BUFFER_PRE_ALLOCATE_VALUE (6), MEM_ALLOCATION_TYPE_HOST_PINNED (8)
    got, c = attrs({})
    assert got == {"6": "7"} and c.errors == []
    assert attrs({"TUIPROF_CUPTI_DEVICE_BUFFERS": "3"})[0] == {"6": "3"}
    assert attrs({"TUIPROF_CUPTI_HOST_PINNED": "1"})[0] == {"8": "1"}
    got, _ = attrs({"TUIPROF_CUPTI_DEVICE_BUFFER_MB": "8", "TUIPROF_CUPTI_DEVICE_BUFFERS": "1",
                    "TUIPROF_CUPTI_HOST_PINNED": "1"})
    assert got == {"0": str(8 << 20), "6": "1", "8": "1"}
    got, c = attrs({"TUIPROF_CUPTI_HOST_PINNED": "1", "FAKE_CUPTI_REFUSE_ATTR": "8"})
    assert got == {} and c.kernels == 1
    assert c.errors == ["in driver: TUIPROF_CUPTI_HOST_PINNED: CUPTI said CUPTI_ERROR_FAKE"]
    # a CUPTI that refuses the default (one older than device buffers) is not an error
    got, c = attrs({"FAKE_CUPTI_REFUSE_ATTR": "6"})
    assert got == {} and c.kernels == 1 and c.errors == []


def test_nvtx_marker_names_travel_with_their_buffer(native, tmp_path):
    s = Script()
    decode_like(s, 3, marker_name="decode_step")
    cap = Capture()
    c = _collector(native, SessionStore(), sink=cap, nvtx=True)
    _run(native, c, "run", str(s.write(tmp_path / "s.bin")), "60", "0")
    c.wait_end(10)
    c.stop()
    starts = [m for m in cap.markers if m[1] == 2]
    assert [m[4] for m in starts] == ["prefill", "decode_step", "decode_step", "decode_step"]
    assert all(m[4] is None for m in cap.markers if m[1] == 4)


def test_a_cupti_refusal_is_one_line_and_the_rest_is_collected(native, tmp_path):
    s = Script()
    s.kernel("k", 10, 20, 1)
    store = SessionStore()
    c = _collector(native, store)
    proc = _run(native, c, "run", str(s.write(tmp_path / "s.bin")), "4", "0",
                env={"FAKE_CUPTI_REFUSE": "49"})
    c.wait_end(10)
    c.stop()
    assert proc.returncode == 0
    assert c.errors == ["in driver: CUPTI refused activity kind MEMORY2: CUPTI_ERROR_FAKE"]
    assert c.kernels == 1


def test_libcupti_that_does_not_load_is_one_line(native, tmp_path):
    store = SessionStore()
    c = NativeCollector(store, cupti_lib="/nonexistent/libcupti.so.13", program="driver")
    c.start()
    s = Script()
    s.kernel("k", 10, 20, 1)
    proc = _run(native, c, "run", str(s.write(tmp_path / "s.bin")), "4", "0")
    time.sleep(0.3)
    c.stop()
    assert proc.returncode == 0
    assert len(c.errors) == 1
    assert c.errors[0].startswith("in driver: the program could not load libcupti "
                                  "(/nonexistent/libcupti.so.13)")


def test_no_session_at_the_address_is_one_line_and_the_program_runs(native, tmp_path):
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(native.build.path),
               TUIPROF_NATIVE_CHANNEL=str(tmp_path / "gone"),
               TUIPROF_NATIVE_CUPTI=str(native.fake))
    proc = subprocess.run([str(native.driver), "run", "/nonexistent", "4", "6"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 6
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuiprof: cannot reach the tuiprof session")


def test_a_killed_program_is_said_and_what_came_is_kept(native, tmp_path):
    s = Script()
    for i in range(40):
        s.kernel("k", 10 + i, 11 + i, i)
    store = SessionStore()
    c = _collector(native, store)
    proc = _run(native, c, "kill", str(s.write(tmp_path / "s.bin")), "8")
    assert proc.returncode == -signal.SIGKILL
    assert not c.wait_end(5)
    c.stop()
    # whole buffers only (8 records each); the fifth, held by CUPTI, died with the program
    assert 0 < c.kernels <= 32 and c.kernels % 8 == 0
    events = [e[3] for e in store.view(raw=False).events]
    assert any("ended without tuiprof's exit flush" in e for e in events)


def test_a_second_process_is_refused_and_runs_unprofiled(native, tmp_path):
    s = Script()
    s.kernel("k", 10, 20, 1)
    store = SessionStore()
    c = _collector(native, store)
    proc = _run(native, c, "spawn", str(s.write(tmp_path / "s.bin")), "4")
    c.wait_end(10)
    c.stop()
    assert proc.returncode == 0 and "driver: child status 0" in proc.stdout
    assert c.kernels == 1 and c.refused_processes == 1
    events = [e[3] for e in store.view(raw=False).events]
    assert any("also uses CUDA: not profiled" in e for e in events)


# ------------------------------------------------------------------ backpressure
def _serve_config(conn: socket.socket, max_buffers: int, buffer_bytes: int,
                  exit_wait_ms: int) -> None:
    """What a session answers a greeting with (here: a tiny pool, a given exit wait)."""
    _, kind, length = ch.HEADER.unpack(ch._recv_exact(conn, ch.HEADER.size))
    assert kind == ch.MSG_HELLO
    ch._recv_exact(conn, length)
    cfg = ch.CONFIG.pack(1, 0, buffer_bytes, max_buffers, 0, exit_wait_ms, 0, 0)
    conn.sendall(ch.HEADER.pack(ch.MAGIC, ch.MSG_CONFIG, len(cfg)) + cfg)


def _frames(conn: socket.socket) -> list[tuple[int, bytes]]:
    out = []
    conn.settimeout(10)
    while True:
        head = ch._recv_exact(conn, ch.HEADER.size, eof_ok=True)
        if head is None:
            return out
        _, kind, length = ch.HEADER.unpack(head)
        out.append((kind, bytes(ch._recv_exact(conn, length)) if length else b""))


def _listener(tmp: Path) -> tuple[socket.socket, str]:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "c")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    return srv, path


def _big_script(tmp_path: Path, n: int) -> Path:
    s = Script()
    for i in range(n):
        s.kernel(f"kernel_with_a_long_name_{i % 50}", 10 + i, 11 + i, i)
    return s.write(tmp_path / "big.bin")


def test_a_session_that_does_not_read_never_blocks_the_program(native, tmp_path):
    """The pool is 2 buffers of 64 KiB; the session reads nothing until the program is done
    emitting 6,000 kernel records (~1.3 MB): the CUDA thread never waits, the records that
    found no buffer are dropped and counted, and the counts arrive once the session reads."""
    srv, path = _listener(tmp_path)
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(native.build.path),
               TUIPROF_NATIVE_CHANNEL=path, TUIPROF_NATIVE_CUPTI=str(native.fake))
    proc = subprocess.Popen([str(native.driver), "wait", str(_big_script(tmp_path, 6000)),
                             "100000"], env=env, stdout=subprocess.PIPE, text=True)
    conn, _ = srv.accept()
    _serve_config(conn, 2, 65536, 10_000)
    t0 = time.monotonic()
    lines = []                                   # its output, while nobody reads
    while "driver: waiting\n" not in lines and len(lines) < 8:
        lines.append(proc.stdout.readline())
    assert "driver: waiting\n" in lines and time.monotonic() - t0 < 5
    emitted = int(next(x for x in lines if x.startswith("driver: emitted")).split()[-1])
    assert emitted < 6000                        # records found no buffer: dropped by CUPTI
    proc.send_signal(signal.SIGINT)
    frames = _frames(conn)                       # now read: everything sent, then END
    assert proc.wait(10) == 5
    end = [ch.STATS.unpack(d) for k, d in frames if k == ch.MSG_END]
    assert len(end) == 1
    dropped, refused, buffers, nbytes, lost = end[0]
    assert dropped == 6000 - emitted and refused >= 1 and lost == 0
    assert buffers == sum(1 for k, _ in frames if k == ch.MSG_BUFFER)
    record = dtypes()[KERNEL].itemsize           # the kernel record of this cupti-python
    assert nbytes == sum(len(d) for k, d in frames if k == ch.MSG_BUFFER) == emitted * record
    conn.close()
    srv.close()


def test_the_exit_wait_is_bounded_when_the_session_never_reads(native, tmp_path):
    srv, path = _listener(tmp_path)
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(native.build.path),
               TUIPROF_NATIVE_CHANNEL=path, TUIPROF_NATIVE_CUPTI=str(native.fake))
    proc = subprocess.Popen([str(native.driver), "run", str(_big_script(tmp_path, 6000)),
                             "100000", "0"], env=env, stdout=subprocess.DEVNULL)
    conn, _ = srv.accept()
    _serve_config(conn, 4, 1 << 20, 300)
    t0 = time.monotonic()
    assert proc.wait(10) == 0                     # exits though nobody ever reads
    assert time.monotonic() - t0 < 5
    conn.close()
    srv.close()


def test_protocol_numbers_match_the_c_source():
    from tuiprof.collect.cupti_raw import KIND_MARKER
    from tuiprof.injection.build import SOURCE

    text = SOURCE.read_text()
    for name in ("MAGIC", "PROTO", "MSG_HELLO", "MSG_STRINGS", "MSG_SIZES", "MSG_BUFFER",
                 "MSG_STATS", "MSG_ERROR", "MSG_END", "MSG_CONFIG", "MSG_FLUSH", "MSG_FLUSHED",
                 "FLAG_API", "FLAG_MEMORY",
                 "FLAG_MARKERS"):
        value = getattr(ch, name)
        assert f"#define TP_{name} {value:#x}u" in text or f"#define TP_{name} {value}" in text
    # the offsets the sender reads are the parser's
    assert "#define TP_OFF_KERNEL_NAME 104" in text and "#define TP_OFF_MARKER_NAME 40" in text
    assert KIND_MARKER == 12
    assert struct.calcsize("=8I") == ch.CONFIG.size
