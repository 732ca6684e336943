"""A real SessionStore fed as a server's session would feed it (steps with requests, traced
steps with kernel records), for the metrics and OTLP feeds' tests."""
from __future__ import annotations

import socket

from tuiprof.store import SessionStore

T0 = 1_764_400_000_000_000_000     # 2025-11-29, ns since the epoch (the session clock)
MS = 1_000_000
PORTS = range(18500, 18600)         # this suite's loopback ports


def free_port(exclude: tuple = ()) -> int:
    for port in PORTS:
        if port in exclude:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 18500-18599")


def kernel(name: str, start: int, dur: int) -> tuple:
    return ("K", name, start, start + dur, 1, 1, 1, 128, 1, 1, 32, 0, 7, 1, 0)


def serve(store: SessionStore, n: int, *, t0: int = T0, first: int = 0,
          traceparents: dict | None = None, traced_every: int = 4) -> int:
    """``n`` requests, each: arrives, queues 2 ms, one prefill step, 3 decode steps (the next
    request's prefill shares the first), finishes. Returns the time after the last step."""
    book = store.requests
    t = t0
    for i in range(first, first + n):
        rid = f"req-{i}"
        book.arrived(rid, 16, "api", t=t, traceparent=(traceparents or {}).get(rid))
        t += 2 * MS
        for k in range(4):
            phase = "prefill" if k == 0 else "decode"
            traced = store.next_seq() % traced_every == 0
            seq = store.begin_token(phase, "eager", t, store.next_seq(), sampled=traced)
            if k == 0:
                store.set_step_requests(seq, prefill=(rid,), prefill_tokens=16, running=1)
            else:
                store.set_step_requests(seq, decode=(rid,), decode_tokens=1, running=1)
            if traced:
                store.add_records([kernel("ampere_sgemm_128x64_nn", t + MS // 10, MS),
                                   kernel("void at::native::elementwise_kernel<128, 4>",
                                          t + 2 * MS, MS // 2)])
            dur = (7 if k == 0 else 3) * MS + (i % 5) * MS
            store.end_token(seq, t + dur, dur / MS)
            t += dur
            book.tokens(rid, 1, t=t)
        book.finished(rid, "length", t=t)
        t += MS
    return t
