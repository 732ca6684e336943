"""A request arrives when the kernel had its bytes, not when a busy event loop read them.

A real uvicorn server on 127.0.0.1 with tuiprof's ``data_received`` hook, and the proxy in
front of a real asyncio server: each server's event loop is held busy (a handler that blocks
it; a callback that blocks the proxy's loop) while a real client sends a request, and is
released ``HOLD_S`` later. The bytes wait in the kernel's socket buffer meanwhile; the
request's arrival must be before the release (the kernel's receipt, read from ``TCP_INFO``),
never before the client sent, and the loop's read (``read_ns``) after the release. Without the
kernel's time the arrival is the read, after the release."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from tuiprof.collect.socket_arrival import TCP_INFO_LEN, TICK_MS, socket_wait_ns
from tuiprof.store.requests import RequestBook

from .test_proxy import HEAD_SSE, TOKENS, chunked, connect, free_port, make  # noqa: F401
from .test_proxy import read_exactly, request, streaming, wait_for


@pytest.fixture
def book():
    b = RequestBook()
    b.clock = time.time_ns     # the client's clock too
    return b

HOLD_S = 0.3    # how long the server's event loop is held busy after the client sent


def _send_and_hold(send, release, hold=HOLD_S) -> tuple[int, int]:
    """``send()`` now, ``release()`` ``hold`` later: the client's send and the release times."""
    sent = time.time_ns()
    send()
    time.sleep(hold)
    released = time.time_ns()
    release()
    return sent, released


def test_the_kernels_receipt_is_read_from_tcp_info():
    ls = socket.create_server(("127.0.0.1", free_port()))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    try:
        c.sendall(b"x")
        time.sleep(HOLD_S)
        wait = socket_wait_ns(s)
        # at most the time passed (less a jiffy), at least the hold less two jiffies
        assert (HOLD_S * 1e3 - 2 * TICK_MS) * 1e6 <= wait, (wait, TICK_MS)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
        c.sendall(b"y")
        assert socket_wait_ns(s) == 0           # just received: under one jiffy
    finally:
        for x in (c, s, ls):
            x.close()
    assert socket_wait_ns(None) == 0


uvicorn = pytest.importorskip("uvicorn")


def _kinds() -> list:
    """uvicorn's HTTP protocols and event loops installed here (vLLM's server runs httptools
    on uvloop; the standard library's asyncio socket and uvloop's differ)."""
    import importlib.util

    https = ["h11"] + (["httptools"] if importlib.util.find_spec("httptools") else [])
    loops = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
    return [(h, lp) for h in https for lp in loops]


@pytest.mark.parametrize(("http", "loop"), _kinds())
def test_uvicorn_requests_arrive_when_the_kernel_had_them(monkeypatch, http, loop):
    from tuiprof.program import transformers_requests as tr

    monkeypatch.setattr(tr, "UVICORN_PROTOCOLS", tr.UVICORN_PROTOCOLS)
    patched = []

    def replace(cls, name, new):
        monkeypatch.setattr(cls, name, new)
        patched.append(cls)

    tr.patch_uvicorn(replace, time.time_ns)
    assert patched
    gate, blocked = threading.Event(), threading.Event()
    seen: dict = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/block":           # holds the server's event loop
            blocked.set()
            gate.wait(10)
        else:
            app_t = time.time_ns()
            seen[path] = (*tr.first_bytes(app_t), app_t)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http,
                                           loop=loop, log_level="error", lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    wait_for(lambda: server.started)
    conns = []
    try:
        def get(s, path):
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns.append(kept)
        get(kept, "/warm")
        assert read_exactly(kept, 1).startswith(b"H")
        wait_for(lambda: "/warm" in seen)
        time.sleep(0.05)
        holder = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns.append(holder)
        get(holder, "/block")
        assert blocked.wait(10)
        fresh = socket.create_connection(("127.0.0.1", port), timeout=10)
        conns.append(fresh)

        def send():
            get(kept, "/kept")         # a keep-alive connection's next request
            get(fresh, "/fresh")       # a connection the busy loop has not even accepted

        sent, released = _send_and_hold(send, gate.set)
        wait_for(lambda: {"/kept", "/fresh"} <= set(seen))
    finally:
        gate.set()
        server.should_exit = True
        th.join(10)
        for s in conns:
            s.close()
    for path in ("/kept", "/fresh"):
        arrival, read, app_t = seen[path]
        # the kernel's receipt: after the client sent, before the loop was released
        assert sent <= arrival < released, (path, sent, arrival, released)
        # the loop read it once released: a wait in the socket buffer of its own
        assert released <= read <= app_t, (path, released, read, app_t)


def test_the_proxy_measures_arrival_as_the_hooks_do(make, book):
    proxy, up = make(streaming([HEAD_SSE + chunked(*TOKENS, b"data: [DONE]\n\n")]))
    s = connect(proxy)
    s.sendall(request(rid="warm"))
    read_exactly(s, 1)
    wait_for(lambda: book.view().finished)
    gate = threading.Event()
    proxy.loop.call_soon_threadsafe(gate.wait, 10)     # holds the proxy's event loop
    try:
        sent, released = _send_and_hold(lambda: s.sendall(request(rid="held")), gate.set)
        wait_for(lambda: len(book.view().finished) >= 2)
    finally:
        gate.set()
        s.close()
    r = book.view().get("proxy:held")
    assert sent <= r.arrival_ns < released, (sent, r.arrival_ns, released)
    assert released <= r.read_ns, (released, r.read_ns)
    assert r.in_socket_ms == (r.read_ns - r.arrival_ns) / 1e6

    from tuiprof.analysis.requests import phases, story
    names = [n for n, _, _ in phases(r, 0)]
    assert names[:3] == ["request", "in the socket buffer", "ttft"], names
    from types import SimpleNamespace
    view = SimpleNamespace(requests=book.view(), timeline=[], tokens=[], raw=())
    s = story(view, "proxy:held")
    assert s.in_socket_ms == r.in_socket_ms

    # the story shows it as a phase of its own
    from rich.console import Console

    from tuiprof.ui.screens.request import render_story
    con = Console(width=200, record=True)
    con.print(render_story(s))
    assert "socket buffer" in con.export_text()
