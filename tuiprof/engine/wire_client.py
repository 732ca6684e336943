"""One streaming HTTP request over a plain socket, timed twice: by this program's clock and by
the kernel's own timestamps of the bytes leaving and arriving at this socket.

A load client on a loaded host is late twice: between taking its start time and its request's
bytes reaching the kernel (connecting, building the request, a thread waiting for the GIL or a
core), and between the response's last bytes arriving and its thread reading them. Both are the
client's own time, not the server's. The kernel stamps each packet as it leaves
(``SOF_TIMESTAMPING_TX_SOFTWARE``, read back from the socket's error queue) and as it arrives
(``SOF_TIMESTAMPING_RX_SOFTWARE``, with each read), on ``CLOCK_REALTIME``: the interval between
the request's last byte leaving and the response's last byte arriving is the request's time as
the wire saw it, whatever the client's threads were doing. Both intervals are returned; a
profiler's per-request figures are compared with the wire's (``docs/serving.md``, "vLLM"),
and the program's shows what the client itself added.

Linux only for the wire times (``None`` elsewhere, or when the socket refuses the option).
Standard library only: it runs in the Python that has vLLM too (:mod:`.vllm_load`)."""
from __future__ import annotations

import socket
import struct
import time

# linux/net_tstamp.h and asm-generic/socket.h (x86-64, arm64): the standard library names
# SO_TIMESTAMPING only from Python 3.14 on
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
_TX_SOFTWARE, _RX_SOFTWARE, _SOFTWARE = 1 << 1, 1 << 3, 1 << 4
_OPT_ID, _OPT_TSONLY = 1 << 7, 1 << 11
TIMESTAMPING = _TX_SOFTWARE | _RX_SOFTWARE | _SOFTWARE | _OPT_ID | _OPT_TSONLY
_TS = struct.Struct("qq")     # struct timespec; the software stamp is the first of three
_ANC = 512
_READ = 1 << 16
_FIRST_READ = 128


_keeper: list = []


def keep_stamping() -> bool:
    """Keep the kernel stamping arriving packets for as long as this process lives.

    The kernel stamps received packets only while some socket asks for it, and it turns that
    on and off in deferred work: a client whose connections did not overlap lost the stamps of
    a connection's first packets (7 of 40 sequential requests here). One datagram socket that
    asks for them, opened once and never used, keeps them on. ``False``: not on this system."""
    if not _keeper:
        try:
            k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            k.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TIMESTAMPING)
        except OSError:
            _keeper.append(None)
            return False
        _keeper.append(k)
        time.sleep(0.05)    # the deferred switch, once
    return _keeper[0] is not None


def _stamp(ancdata) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _TS.size:
            sec, ns = _TS.unpack_from(data)
            if sec or ns:
                return sec * 1_000_000_000 + ns
    return None


def _sent_stamps(sock: socket.socket) -> list[int]:
    """The kernel's transmit stamps queued on the socket's error queue so far."""
    # non-blocking in Python's sense too: on a socket with a timeout, Python waits for it to
    # be readable again after EAGAIN, whatever MSG_DONTWAIT says
    sock.settimeout(0.0)
    out = []
    while True:
        try:
            _data, anc, _flags, _addr = sock.recvmsg(1, _ANC, socket.MSG_ERRQUEUE
                                                     | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError, OSError):
            return out
        t = _stamp(anc)
        if t is not None:
            out.append(t)


def _dechunk(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(body):
        j = body.find(b"\r\n", i)
        if j < 0:
            break
        try:
            size = int(body[i:j].split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += body[j + 2:j + 2 + size]
        i = j + 2 + size + 2
    return bytes(out)


def stream(port: int, path: str, body: bytes, headers: dict, timeout: float = 600.0,
           host: str = "127.0.0.1", on_first=None) -> dict:
    """POST ``body`` to ``path`` and read the streamed answer to its end (``Connection:
    close``). Returns ``status``, ``body`` (de-chunked), the program's clock (``t0``/``t_first``/
    ``t1``: ``perf_counter`` before connecting, at the first ``data: {`` read, after the last
    read; ``w0``/``w1``: ``time_ns`` at the same two ends) and the wire's (``sent_ns``: the
    request's last byte leaving, ``first_ns``: the arrival of the read that held the first
    ``data: {``, ``last_ns``: the arrival of the response's last bytes; ``None`` without the
    kernel's stamps). ``on_first`` is called once, at the first ``data: {``."""
    keep_stamping()
    w0 = time.time_ns()
    t0 = time.perf_counter()
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        wire = True
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TIMESTAMPING)
        except OSError:
            wire = False
        head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
                f"Content-Length: {len(body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        raw = bytearray()
        t_first = first_ns = last_ns = None
        header_end = -1
        while True:
            # small reads until the first event: a read stamps the last packet it touched, and
            # a late reader finds many waiting (the first token's arrival would read as later)
            data, anc, _flags, _addr = sock.recvmsg(_READ if t_first else _FIRST_READ, _ANC)
            if not data:
                break
            raw += data
            if wire:
                last_ns = _stamp(anc) or last_ns
            if header_end < 0:
                header_end = raw.find(b"\r\n\r\n")
            if t_first is None and header_end >= 0 and raw.find(b"data: {", header_end) >= 0:
                t_first = time.perf_counter()
                first_ns = last_ns
                if on_first is not None:
                    on_first()
        t1 = time.perf_counter()
        w1 = time.time_ns()
        sent = _sent_stamps(sock) if wire else []
    finally:
        sock.close()
    if header_end < 0:
        raise ConnectionError("the server closed the connection before its answer's head")
    lines = bytes(raw[:header_end]).split(b"\r\n")
    status = int(lines[0].split()[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in
              (ln.decode("latin-1").partition(":") for ln in lines[1:])}
    payload = bytes(raw[header_end + 4:])
    if fields.get("transfer-encoding", "").lower() == "chunked":
        payload = _dechunk(payload)
    return {"status": status, "body": payload, "t0": t0, "t_first": t_first, "t1": t1,
            "w0": w0, "w1": w1, "sent_ns": max(sent) if sent else None,
            "first_ns": first_ns, "last_ns": last_ns}


def sse_events(payload: bytes) -> list[bytes]:
    """The ``data:`` payloads of a server-sent event stream, ``[DONE]`` left out."""
    out = []
    for line in payload.split(b"\n"):
        line = line.strip()
        if line.startswith(b"data:") and line != b"data: [DONE]":
            out.append(line[5:].strip())
    return out


def wire_ms(r: dict) -> tuple[float | None, float | None]:
    """(time to the first token, end to end) in ms as the wire saw them, or ``None``s."""
    if r["sent_ns"] is None or r["last_ns"] is None:
        return None, None
    first = (r["first_ns"] - r["sent_ns"]) / 1e6 if r["first_ns"] is not None else None
    return first, (r["last_ns"] - r["sent_ns"]) / 1e6
