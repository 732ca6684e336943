"""The streaming proxy (``tuiprof/collect/http_proxy.py``) between real sockets: a real
asyncio HTTP server on 127.0.0.1 that writes exactly the bytes a test gives it, the proxy in
front of it with a real ``RequestBook``, and a raw-socket client. What must hold: every byte
unchanged both ways (chunked transfer and server-sent events included), keep-alive, a client
that goes away closing the upstream connection, an upstream 500 passed as it came, a refused
upstream answered with 502, an upstream reset passed on, back-pressure (a client that does not
read stops the server's writes; the proxy holds a bounded amount), and the requests recorded
from what passed."""
from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time

import pytest

from tuiprof.collect import http_proxy as hp
from tuiprof.collect.http_proxy import HttpProxy, parse_spec
from tuiprof.store.requests import RequestBook


def read_exactly(s: socket.socket, n: int) -> bytes:
    """The next ``n`` bytes from ``s`` (fails if it closes before)."""
    got = bytearray()
    while len(got) < n:
        b = s.recv(65536)
        assert b, f"closed after {len(got)} of {n} bytes"
        got += b
    return bytes(got)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """A real asyncio server on a thread; ``handler(reader, writer, log)`` serves a
    connection; ``log`` keeps what happened (bytes received, connections, closes)."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.log: dict = {"received": bytearray(), "connections": 0, "closed": threading.Event(),
                          "sent": 0, "stalled": threading.Event()}
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def serve(r, w):
                self.log["connections"] += 1
                try:
                    await self.handler(r, w, self.log)
                except (ConnectionError, asyncio.IncompleteReadError):
                    pass
                finally:
                    self.log["closed"].set()
                    w.close()

            self.server = self.loop.run_until_complete(
                asyncio.start_server(serve, "127.0.0.1", self.port))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(5)

    def close(self) -> None:
        def down():
            self.server.close()
            for t in asyncio.all_tasks(self.loop):
                t.cancel()
            self.loop.call_later(0.05, self.loop.stop)
        self.loop.call_soon_threadsafe(down)
        self.thread.join(5)


@pytest.fixture
def book():
    b = RequestBook()
    b.clock = time.monotonic_ns
    return b


@pytest.fixture
def make(book):
    made = []

    def _make(handler, upstream_port=None):
        up = Upstream(handler) if handler is not None else None
        port = up.port if up is not None else upstream_port
        proxy = HttpProxy(book, ("127.0.0.1", free_port()), ("127.0.0.1", port))
        proxy.start()
        made.append((proxy, up))
        return proxy, up

    yield _make
    for proxy, up in made:
        proxy.stop()
        if up is not None:
            up.close()


def connect(proxy) -> socket.socket:
    s = socket.create_connection(proxy.listen, timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_all(s: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        out += b
    return bytes(out)


def wait_for(cond, timeout=10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def request(path="/v1/completions", body=b'{"stream": true}', rid="abc", extra=b"") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n").encode()
    if rid:
        head += f"X-Request-Id: {rid}\r\n".encode()
    return head + extra + b"\r\n" + body


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


TOKENS = [sse({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
          for i in range(5)]
USAGE = sse({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5}})
HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


async def read_request(r) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    return head + await r.readexactly(n)


def streaming(pieces: list, gap=0.002):
    """A handler answering each request with ``pieces`` written one by one."""
    async def handler(r, w, log):
        while True:
            try:
                log["received"] += await read_request(r)
            except asyncio.IncompleteReadError:
                return
            for p in pieces:
                w.write(p)
                log["sent"] += len(p)
                await w.drain()
                await asyncio.sleep(gap)
    return handler


def test_bytes_pass_unchanged_and_the_request_is_recorded(make, book):
    # odd write boundaries: a chunk's size line split, events across chunks
    body = chunked(TOKENS[0] + TOKENS[1][:7], TOKENS[1][7:], *TOKENS[2:], USAGE,
                   b"data: [DONE]\n\n")
    response = HEAD_SSE + body
    cuts = [0, 20, 61, len(HEAD_SSE) + 1, len(HEAD_SSE) + 90, len(HEAD_SSE) + 200, len(response)]
    pieces = [response[a:b] for a, b in zip(cuts, cuts[1:])]
    proxy, up = make(streaming(pieces))
    req = request(rid="client-7")
    s = connect(proxy)
    s.sendall(req[:30])
    time.sleep(0.02)
    s.sendall(req[30:])
    got = read_exactly(s, len(response))
    s.close()
    assert got == response                       # every byte, chunk framing included
    wait_for(lambda: len(up.log["received"]) == len(req))
    assert bytes(up.log["received"]) == req
    wait_for(lambda: book.view().finished)
    r = book.view().get("proxy:client-7")
    assert r.source == "proxy" and r.status == "finished" and r.http_status == 200
    assert r.output_tokens == 5 and r.prompt_tokens == 11 and r.tokens_from == "usage"
    assert len(r.token_ns) == 5 and r.arrival_ns < r.token_ns[0] <= r.finish_ns
    assert r.first_step_ns == 0 and r.queue_ms is None    # no queue time from outside


def test_keep_alive_two_requests_on_one_connection(make, book):
    response = HEAD_SSE + chunked(*TOKENS[:3], b"data: [DONE]\n\n")
    proxy, up = make(streaming([response]))
    s = connect(proxy)
    for rid in ("one", "two"):
        s.sendall(request(rid=rid))
        got = bytearray()
        while not got.endswith(b"0\r\n\r\n"):
            b = s.recv(65536)
            assert b
            got += b
        assert got == response
    s.close()
    assert up.log["connections"] == 1
    wait_for(lambda: len(book.view().finished) == 2)
    rows = {r.id: r for r in book.view().rows}
    assert set(rows) == {"proxy:one", "proxy:two"}
    for r in rows.values():   # no usage sent: the chunks with text are counted, and it says so
        assert r.output_tokens == 3 and r.tokens_from == "chunks" and r.prompt_tokens == 0
    assert rows["proxy:two"].arrival_ns > rows["proxy:one"].finish_ns


def test_non_streaming_json_and_other_paths(make, book):
    out = json.dumps({"choices": [{"text": "hi", "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 4, "completion_tokens": 2}}).encode()
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"\r\n%s" % (len(out), out))
    proxy, up = make(streaming([response]))
    s = connect(proxy)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")   # forwarded, not a request row
    got = read_exactly(s, len(response))
    s.sendall(request(body=b"{}", rid=""))
    got = read_exactly(s, len(response))
    assert got == response
    s.close()
    wait_for(lambda: book.view().finished)
    (r,) = book.view().rows
    assert r.id == "proxy:1" and r.reason == "stop" and r.output_tokens == 2
    assert r.prompt_tokens == 4 and r.first_token_ns == r.finish_ns   # its tokens came at its end
    assert proxy.stats()["other_requests"] == 1


def test_client_disconnect_mid_stream_closes_upstream(make, book):
    async def forever(r, w, log):
        await read_request(r)
        w.write(HEAD_SSE)
        i = 0
        while True:   # streams until its client is gone
            w.write(b"%x\r\n%s\r\n" % (len(TOKENS[0]), TOKENS[0]))
            await w.drain()
            i += 1
            await asyncio.sleep(0.005)
            if r.at_eof():
                return
    proxy, up = make(forever)
    s = connect(proxy)
    s.sendall(request(rid="gone"))
    assert s.recv(65536)
    s.close()
    assert up.log["closed"].wait(10)          # the server saw its connection end
    wait_for(lambda: book.view().finished)
    r = book.view().get("proxy:gone")
    assert r.status == "cancelled" and "client disconnected" in r.reason, r.reason
    assert proxy.stats()["client_disconnects"] == 1


def test_upstream_500_passed_as_it_came(make, book):
    body = b'{"error": {"message": "model not loaded"}}'
    response = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    proxy, up = make(streaming([response]))
    s = connect(proxy)
    s.sendall(request(rid="bad"))
    got = read_exactly(s, len(response))
    assert got == response
    s.close()
    wait_for(lambda: book.view().finished)
    r = book.view().get("proxy:bad")
    assert r.status == "failed" and r.http_status == 500
    assert r.reason == "HTTP 500: error: model not loaded" and r.first_token_ns == 0


def test_connection_refused_is_a_502_with_one_line(make, book):
    proxy, _ = make(None, upstream_port=free_port())     # nothing listens there
    s = connect(proxy)
    s.sendall(request(rid="nobody"))
    got = read_all(s).decode()
    s.close()
    head, _, body = got.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 502 Bad Gateway") and "Connection: close" in head
    assert body.count("\n") == 1 and "refused the connection" in body
    wait_for(lambda: book.view().finished)
    r = book.view().get("proxy:nobody")
    assert r.status == "failed" and r.http_status == 502 and "502" in r.reason


def test_upstream_reset_mid_stream_is_passed_on(make, book):
    async def resets(r, w, log):
        await read_request(r)
        w.write(HEAD_SSE + b"%x\r\n%s\r\n" % (len(TOKENS[0]), TOKENS[0]))
        await w.drain()
        await asyncio.sleep(0.05)
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        w.transport.abort()
    proxy, up = make(resets)
    s = connect(proxy)
    s.sendall(request(rid="reset"))
    got = bytearray()
    with pytest.raises(ConnectionResetError):
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    assert got.startswith(HEAD_SSE)
    s.close()
    wait_for(lambda: book.view().finished)
    r = book.view().get("proxy:reset")
    assert r.status == "failed" and "reset" in r.reason and r.output_tokens == 1


def test_back_pressure_a_slow_client_stops_the_server(make, book):
    total = 64 * 1024 * 1024
    block = bytes(range(256)) * 256                            # 64 KiB

    async def flood(r, w, log):
        await read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                b"Content-Length: %d\r\n\r\n" % total)
        sent = 0
        while sent < total:
            w.write(block)
            try:
                await asyncio.wait_for(w.drain(), 1.0)
            except asyncio.TimeoutError:
                log["stalled"].set()                           # the proxy stopped reading
                await w.drain()
            sent += len(block)
            log["sent"] = sent
    proxy, up = make(flood)
    s = connect(proxy)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.sendall(request(path="/v1/completions", rid="slow"))
    assert up.log["stalled"].wait(30)                         # the client reads nothing yet
    held = up.log["sent"]
    assert held < total                                       # the server was held back
    assert proxy.max_buffered <= hp.HIGH_WATER + 256 * 1024   # the proxy held a bounded amount
    h = hashlib.sha256()
    got = 0
    head = b""
    while got < total:
        b = s.recv(1 << 20)
        assert b
        if not head:
            head, _, b = b.partition(b"\r\n\r\n")
        got += len(b)
        h.update(b)
    s.close()
    assert h.hexdigest() == hashlib.sha256(block * (total // len(block))).hexdigest()
    assert proxy.counts.get("paused", 0) >= 1


def test_duplicate_client_ids_in_flight_stay_apart(make, book):
    response = HEAD_SSE + chunked(*TOKENS[:2])
    proxy, up = make(streaming([response[:40], response[40:]], gap=0.05))
    a, b = connect(proxy), connect(proxy)
    a.sendall(request(rid="same"))
    b.sendall(request(rid="same"))
    for s in (a, b):
        got = bytearray()
        while not got.endswith(b"0\r\n\r\n"):
            got += s.recv(65536)
        s.close()
    wait_for(lambda: len(book.view().finished) == 2)
    ids = sorted(r.id for r in book.view().rows)
    assert ids[0] == "proxy:same" and ids[1].startswith("proxy:same#")
    assert not book.view().misuse


def test_requests_join_the_steps_that_ran_while_they_were_in_flight(book):
    for seq, (a, b) in enumerate(((0, 10), (20, 30), (40, 50), (60, 70))):
        book.step_interval(a, b, seq)
    book.arrived("proxy:x", 0, "proxy", t=25)
    book.finished("proxy:x", "stop", t=55, http_status=200, tokens_from="chunks")
    book.arrived("hooked", 0, "api", t=25)
    book.finished("hooked", "stop", t=55)
    rows = {r.id: r for r in book.view().rows}
    assert list(rows["proxy:x"].steps) == [1, 2]       # by time: the steps while in flight
    assert list(rows["hooked"].steps) == []            # the engine's hooks say which steps
    assert rows["proxy:x"].outside and not rows["hooked"].outside


@pytest.mark.parametrize("text,why", [
    ("8000", "LISTEN=UPSTREAM"), ("8000=", "LISTEN=UPSTREAM"), ("x:1=2", "loopback"),
    ("10.0.0.1:80=81", "loopback"), ("80=99999", "1 to 65535"), ("81=81", "itself"),
    ("a:b=1", "PORT or HOST:PORT")])
def test_bad_specs_are_one_line(text, why):
    with pytest.raises(ValueError, match=why):
        parse_spec(text)


def test_good_specs():
    assert parse_spec("8000=8001") == (("127.0.0.1", 8000), ("127.0.0.1", 8001))
    assert parse_spec("localhost:1=[::1]:2") == (("127.0.0.1", 1), ("::1", 2))


def test_the_command_refuses_a_taken_port_and_bad_syntax(capsys, tmp_path):
    from tuiprof.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = main(["run", "--headless", "--json", str(tmp_path / "s.json"), "--proxy",
                     f"{port}={free_port()}", "--", "python", "-c", "pass"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "in use" in err[0] and "--proxy" in err[0], err
    code = main(["run", "--headless", "--proxy", "8000", "--", "python", "-c", "pass"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "LISTEN=UPSTREAM" in err[0], err
    code = main(["run", "--proxy", "8000=8001", "--model", "qwen3-tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "program of your own" in err[0], err


def test_the_proxy_in_its_own_process_records_into_this_ones_book(book):
    from tuiprof.collect.proxy_process import make_proxy

    response = HEAD_SSE + chunked(*TOKENS[:3], USAGE, b"data: [DONE]\n\n")
    up = Upstream(streaming([response]))
    listen = free_port()
    proxy = make_proxy(book, f"{listen}={up.port}")
    proxy.start()
    try:
        s = socket.create_connection(("127.0.0.1", listen), timeout=10)
        s.sendall(request(rid="far"))
        got = read_exactly(s, len(response))
        s.close()
        assert got == response
        wait_for(lambda: book.view().finished)
    finally:
        proxy.stop()
        up.close()
    r = book.view().get("proxy:far")
    assert r.status == "finished" and r.output_tokens == 5 and len(r.token_ns) == 3
    assert r.arrival_ns <= r.token_ns[0] <= r.finish_ns
    st = proxy.stats()
    assert st["requests"] == 1 and st["bytes_down"] == len(response)


def test_the_proxy_process_says_why_it_cannot_listen(book):
    from tuiprof.collect.proxy_process import make_proxy

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        proxy = make_proxy(book, f"{taken.getsockname()[1]}={free_port()}")
        with pytest.raises(OSError, match="in use"):
            proxy.start()


def test_every_connection_sends_at_once(make, book):
    """Nagle off on both sides: an event written behind an unacknowledged one would wait for
    the client's delayed ACK (40 ms on Linux)."""
    response = HEAD_SSE + chunked(*TOKENS[:2])
    proxy, up = make(streaming([response[:50], response[50:]], gap=0.2))
    s = connect(proxy)
    s.sendall(request(rid="n"))
    wait_for(lambda: proxy.conns and next(iter(proxy.conns)).up is not None)
    c = next(iter(proxy.conns))
    for tr in (c.tr, c.up):
        sock = tr.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    s.close()


def _outside_view(book):
    """A view of requests seen through the proxy and by hooks, with three model steps."""
    from types import SimpleNamespace

    steps = [SimpleNamespace(seq=i, start_ns=a, end_ns=b, done=True, phase="decode",
                             sampled=False, kernels=0, kernel_ns=0, gpu_ms=None, requests=(),
                             prefills=0, prefill_tokens=0, apart=False, host_ms=1.0,
                             decode_tokens=0, kv_total=0, kv_used=0, pending=0)
             for i, (a, b) in enumerate(((0, 10), (20, 30), (40, 50)))]
    for t in steps:
        book.step_interval(t.start_ns, t.end_ns, t.seq)
    book.arrived("proxy:a", 0, "proxy", t=5)
    book.tokens("proxy:a", 1, t=25)
    book.tokens("proxy:a", 1, t=45)
    book.finished("proxy:a", "stop", t=48, http_status=200, tokens_from="chunks",
                  output_tokens=2)
    book.arrived("a", 4, "transformers serve", t=6)
    book.step(0, 0, ("a",), ())
    book.tokens("a", 1, t=22)
    book.tokens("a", 1, t=42)
    book.finished("a", "stop", t=44)
    book.arrived("proxy:b", 0, "proxy", t=41)
    return SimpleNamespace(requests=book.view(), timeline=steps, tokens=steps, raw=())


def test_a_request_from_outside_has_no_queue_in_its_story_and_a_finding_says_so(book):
    from rich.console import Console

    from tuiprof.analysis.request_rules import REQUEST_RULES
    from tuiprof.analysis.requests import in_flight, story
    from tuiprof.ui.screens.request import render_story

    view = _outside_view(book)
    s = story(view, "proxy:a")
    assert s.outside and s.waited_ms is None and s.prefill_ms is None and not s.behind
    assert s.kernels["steps"] == 3 and s.kernels["in_view"] == 3   # by time
    console = Console(width=120, record=True)
    console.print(render_story(s))
    text = console.export_text()
    assert "from outside the engine" in text and "no queue wait" in text
    assert "? prompt → 2 output (streamed chunks counted" in text and "HTTP 200" in text
    assert "waited" not in text and "not scheduled yet" not in text
    assert [r.state for r in in_flight(view) if r.id == "proxy:b"] == ["no token"]
    found = [f for rule in REQUEST_RULES for f in rule(view, None)]
    f = next(f for f in found if f.id == "requests-from-outside")
    assert "no queue time" in f.title and f.numbers["matched"] == 1
    assert f.numbers["ttft_minus_hooks_p50_ms"] == pytest.approx((20 - 16) / 1e6)
    assert f.numbers["tokens_counted_from_chunks"] == 1
    assert not [x for x in found if x.id in ("ttft-split", "requests-waiting")
                and "proxy:" in str(x.numbers)]


def test_the_finding_compares_the_two_views_over_the_same_interval(book):
    """The hooks end where the engine hands over (their token, their finish), the proxy where
    it read the bytes: with the hooks' write times, the proxy's TTFT and end to end are set
    against the hooks' to the bytes their server wrote, and the phases between are given."""
    from rich.console import Console

    from tuiprof.analysis.request_rules import REQUEST_RULES
    from tuiprof.analysis.requests import story
    from tuiprof.ui.screens.request import render_story

    view = _outside_view(book)
    book.wire("a", 23, 46)      # the server wrote the first token at 23, its last bytes at 46
    view.requests = book.view()
    f = next(f for rule in REQUEST_RULES for f in rule(view, None)
             if f.id == "requests-from-outside")
    n = f.numbers
    assert n["ttft_minus_hooks_p50_ms"] == pytest.approx((20 - 16) / 1e6)   # as before
    assert n["ttft_minus_hooks_wire_p50_ms"] == pytest.approx((20 - 17) / 1e6)
    assert n["e2e_minus_hooks_wire_p50_ms"] == pytest.approx((43 - 40) / 1e6)
    assert n["to_server_p50_ms"] == pytest.approx(1 / 1e6)       # 5 at the proxy, 6 the server
    assert n["after_engine_p50_ms"] == pytest.approx(1 / 1e6)    # handed 22, written 23
    assert n["back_to_proxy_p50_ms"] == pytest.approx(2 / 1e6)   # written 23, read 25
    assert "over the same interval" in f.evidence
    console = Console(width=140, record=True)
    console.print(render_story(story(view, "a")))
    assert "after the engine" in console.export_text()


def test_exports_show_no_queue_or_prefill_for_a_request_from_outside(book):
    from tuiprof.analysis.requests import phases

    view = _outside_view(book)
    assert [n for n, _, _ in phases(view.requests.get("proxy:a"), 100)] == [
        "request", "ttft", "decode"]
    assert "queued" in [n for n, _, _ in phases(view.requests.get("a"), 100)]   # the hooks'

