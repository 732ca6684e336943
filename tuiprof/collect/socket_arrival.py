"""When the kernel received a request, for an HTTP server whose event loop reads it later.

An asyncio (or uvloop) server reads a connection's bytes when its event loop comes round to
it: while the loop is busy (a long callback, a step of its own, the GIL held by another
thread), a request's bytes wait in the kernel's socket buffer, and the server's
``data_received`` is late by that wait. The client's clock started when it sent; so, for
tuiprof's times to be the client's, a request arrives when the kernel had its bytes.

Linux keeps, per TCP connection, when its last data segment arrived (``icsk_ack.lrcvtime``, in
jiffies); ``getsockopt(IPPROTO_TCP, TCP_INFO)`` gives it as ``tcpi_last_data_recv``,
milliseconds before the call (``struct tcp_info`` in ``linux/tcp.h``: a ``__u32`` at byte 52,
after 8 bytes of ``__u8`` fields and 11 ``__u32``). Its resolution is one jiffy (4 ms at
HZ=250), and a jiffy count can be one more than the time passed, so one jiffy is taken off:
the arrival found is never earlier than the segment's (it may be up to two jiffies later),
and a wait shorter than a jiffy reads as none. Read once, at the first bytes of a request
(:func:`socket_wait_ns`); one system call (about 1 µs, ``bench/overhead/request_cost.py``).

The last data segment is this request's own last one read (a request sent in several
segments arrives when its last segment read came): a later time than the first byte's, never
an earlier one. Where the socket is not TCP, or the call fails, the wait is 0 (the read's
time stands).
"""
from __future__ import annotations

import math
import socket
import struct
import time
from typing import Any

TCPI_LAST_DATA_RECV = 52    # struct tcp_info's tcpi_last_data_recv (ms), a __u32
TCP_INFO_LEN = TCPI_LAST_DATA_RECV + 4
_U32 = struct.Struct("=I")
_TCP_INFO = getattr(socket, "TCP_INFO", None)   # Linux only


def _tick_ms() -> int:
    """One jiffy in whole ms (rounded up): the resolution of the coarse clocks is the kernel's
    tick (``clock_getres(CLOCK_MONOTONIC_COARSE)``); 10 ms (HZ=100, the coarsest) if unknown."""
    try:
        res = time.clock_getres(getattr(time, "CLOCK_MONOTONIC_COARSE", 6))
    except (OSError, AttributeError, ValueError):
        return 10
    if not 0 < res <= 0.1:
        return 10
    return max(1, math.ceil(res * 1000 - 1e-9))


TICK_MS = _tick_ms()


def transport_socket(transport: Any) -> Any:
    """The socket (asyncio's ``TransportSocket``, uvloop's ``PseudoSocket``) of a transport,
    None where it has none."""
    try:
        return transport.get_extra_info("socket")
    except Exception:  # a transport of another kind: the read's time stands
        return None


def socket_wait_ns(sock: Any) -> int:
    """How long the last data segment ``sock`` received has been waiting (ns, less one jiffy,
    0 when under it or unknown)."""
    if sock is None or _TCP_INFO is None:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, TCP_INFO_LEN)
    except (OSError, AttributeError, TypeError, ValueError):
        return 0
    if len(info) < TCP_INFO_LEN:
        return 0
    ms = _U32.unpack_from(info, TCPI_LAST_DATA_RECV)[0] - TICK_MS
    return ms * 1_000_000 if ms > 0 else 0
