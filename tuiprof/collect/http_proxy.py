"""A transparent streaming HTTP proxy in front of a server tuiprof cannot hook
(``tuiprof run --proxy LISTEN=UPSTREAM -- ./server …``): the requests that pass become the
store's requests (source ``proxy``), seen from outside the engine.

What it forwards: every byte, unchanged, both ways, as it arrives (one upstream connection per
client connection, so keep-alive, pipelining, chunked transfer and server-sent events pass as
they are). Nothing is buffered whole: data read from one side is written to the other at once,
and a side whose write buffer passes ``HIGH_WATER`` stops the other side's reading until it
drains (asyncio's flow control: a slow client slows the server, as without the proxy). A
client that goes away closes its upstream connection; an upstream that resets resets the
client; an upstream that refuses the connection gets the client a ``502`` with a one-line body.

What it records (a copy of the bytes, parsed incrementally after they were forwarded; a message
it cannot parse leaves the forwarding as it is and is counted): per request to a generation
path (POST ``…/completions``, ``…/chat/completions``, ``…/completion``, ``…/responses``,
``…/generate``, ``…/generate_stream``): its arrival (when the kernel had the request's first
bytes, earlier than the proxy's read of them while its loop was busy: :mod:`.socket_arrival`,
as the hooks inside a server measure it), each server-sent event that carries generated text (a
token chunk: its time), the response's end (its finish), the HTTP status, the prompt and output
tokens from the server's ``usage`` when it sends one (else the output is the token chunks
counted, and the row says so), the finish reason, and the client's ``X-Request-Id``. A response
that is not a stream has its first token at its end.

Bounded: a request or response head is read up to ``MAX_HEAD``, an event up to ``MAX_EVENT``,
a non-streaming body up to ``MAX_JSON`` (for its ``usage``), at most ``MAX_PENDING`` requests
a connection waiting for their responses (:mod:`.http_tap` parses them); token times are kept by the store (at most
``MAX_TOKEN_TIMES`` a request). One thread runs an asyncio loop; the standard library only.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import struct
import threading
import time
from typing import Any

from .http_tap import Exchange, Tap, event_facts
from .socket_arrival import socket_wait_ns

SOURCE = "proxy"
HIGH_WATER = 64 * 1024     # a side's write buffer above which the other side stops being read
MAX_ID = 128               # characters of a client's X-Request-Id kept
GENERATION = frozenset({"completions", "completion", "responses", "generate", "generate_stream",
                        "infill"})
BAD_GATEWAY = "HTTP/1.1 502 Bad Gateway"


# ------------------------------------------------------------------ the option
def parse_address(text: str, what: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` on a loopback address; ValueError with the
    reason otherwise."""
    text = text.strip()
    if text.isdigit():
        host, port = "127.0.0.1", text
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{what} {text!r}: give PORT or HOST:PORT")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loop = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = False
    if not loop:
        raise ValueError(f"{what} {host}: the proxy listens and connects on loopback only "
                         "(127.0.0.1, ::1, localhost)")
    n = int(port)
    if not 0 < n < 65536:
        raise ValueError(f"{what} port {n}: must be 1 to 65535")
    return host, n


def parse_spec(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``LISTEN=UPSTREAM`` (each ``PORT`` or ``HOST:PORT``) -> (listen, upstream)."""
    listen, sep, upstream = str(text).partition("=")
    if not sep or not listen.strip() or not upstream.strip():
        raise ValueError(f"{text!r}: give LISTEN=UPSTREAM, e.g. 8000=8001 or "
                         "127.0.0.1:8000=127.0.0.1:8001")
    a, b = parse_address(listen, "LISTEN"), parse_address(upstream, "UPSTREAM")
    if a == b:
        raise ValueError(f"LISTEN and UPSTREAM are both {a[0]}:{a[1]}: the proxy would talk to "
                         "itself; give the server another port")
    return a, b


def address_text(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(addr: tuple[str, int]) -> socket.socket:
    """A listening socket on ``addr`` (OSError when it cannot be had)."""
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def check_listen(addr: tuple[str, int]) -> str:
    """"" when ``addr`` can be listened on now, else why not (one line)."""
    try:
        bind(addr).close()
    except OSError as exc:
        return f"cannot listen on {address_text(addr)}: {exc.strerror or exc}"
    return ""


# ------------------------------------------------------------------ connections
def no_delay(tr: Any) -> None:
    """Each write goes out at once (no Nagle): a server-sent event must not wait for the
    previous one's acknowledgement (a delayed ACK holds it 40 ms)."""
    sock = tr.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class ClientSide(asyncio.Protocol):
    """A client's connection to LISTEN; its upstream connection is :class:`UpstreamSide`."""

    def __init__(self, proxy: "HttpProxy") -> None:
        self.proxy = proxy
        self.tr: Any = None
        self.up: Any = None
        self.sock: Any = None
        self.tap = Tap(proxy, self._waited)
        self.refused = ""
        self.answered = False
        self.closed = False
        self.eof = False

    def connection_made(self, tr: Any) -> None:
        self.tr = tr
        self.sock = tr.get_extra_info("socket")
        no_delay(tr)
        tr.set_write_buffer_limits(HIGH_WATER)
        tr.pause_reading()             # until the upstream connection is there
        self.proxy.conns.add(self)
        self.proxy.count("connections")
        self.proxy.loop.create_task(self._connect())

    async def _connect(self) -> None:
        p = self.proxy
        try:
            tr, _ = await p.loop.create_connection(lambda: UpstreamSide(self), *p.upstream)
        except OSError as exc:
            self.refused = exc.strerror or type(exc).__name__
            p.count("refused")
            if not self.closed:
                self.tr.resume_reading()
            return
        tr.set_write_buffer_limits(HIGH_WATER)
        if self.closed:
            tr.abort()
            return
        self.up = tr
        self.tr.resume_reading()

    def _waited(self) -> int:
        """How long the bytes being read waited in the kernel's socket buffer (ns): a request
        arrives when the kernel had it, as the hooks inside a server measure it."""
        return socket_wait_ns(self.sock)

    def data_received(self, data: bytes) -> None:
        p = self.proxy
        t = p.clock()
        if self.up is not None:
            self.up.write(data)
        p.bytes_up += len(data)
        self.tap.request(data, t)
        if self.refused and not self.answered and (self.tap.pending or self.tap.off):
            self._bad_gateway(t)

    def _bad_gateway(self, t: int) -> None:
        """The upstream refused the connection: 502 with one line, then close."""
        self.answered = True
        body = (f"tuiprof proxy: the server at {address_text(self.proxy.upstream)} refused the "
                f"connection ({self.refused})\n").encode()
        self.tr.write(f"{BAD_GATEWAY}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        for ex in self.tap._open():
            ex.status = 502
            self.proxy.finish(ex, t, "failed", f"the server refused the connection "
                                               f"({self.refused}): tuiprof answered 502")
        self.tap.pending.clear()
        self.tap.off = True
        self.tr.close()

    def eof_received(self) -> bool:
        self.eof = True
        self.tap.client_eof = True
        if self.up is not None and self.up.can_write_eof():
            self.up.write_eof()
        elif self.refused:
            self.tr.close()
        return True                   # the response may still come

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.proxy.conns.discard(self)
        due = self.tap.client_ended(self.proxy.clock())
        if self.up is not None:
            if due:
                self.proxy.count("client_disconnects")
                self.up.abort()       # the server sees the client go, as without the proxy
            else:
                self.up.close()

    def pause_writing(self) -> None:   # the client reads slower than the server writes
        self.proxy.count("paused")
        if self.up is not None:
            self.up.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None and not self.up.is_closing():
            self.up.resume_reading()

    def abort(self) -> None:
        if self.tr is not None:
            self.tr.abort()
        if self.up is not None:
            self.up.abort()


class UpstreamSide(asyncio.Protocol):
    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.tr: Any = None

    def connection_made(self, tr: Any) -> None:
        self.tr = tr
        no_delay(tr)

    def data_received(self, data: bytes) -> None:
        c = self.client
        p = c.proxy
        t = p.clock()
        c.tr.write(data)
        p.bytes_down += len(data)
        size = c.tr.get_write_buffer_size()
        if size > p.max_buffered:
            p.max_buffered = size
        c.tap.response(data, t)

    def eof_received(self) -> bool:
        c = self.client
        c.tap.upstream_ended(c.proxy.clock(), False)
        if not c.tr.is_closing() and c.tr.can_write_eof():
            c.tr.write_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        c = self.client
        reset = isinstance(exc, ConnectionResetError)
        c.tap.upstream_ended(c.proxy.clock(), reset)
        if c.tr.is_closing():
            return
        if reset:
            c.proxy.count("resets")
            sock = c.tr.get_extra_info("socket")
            if sock is not None:   # pass the reset on: close with SO_LINGER 0 sends an RST
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            c.tr.abort()
        else:
            c.tr.close()              # what was written still reaches the client

    def pause_writing(self) -> None:   # the server reads slower than the client writes
        self.client.tr.pause_reading()

    def resume_writing(self) -> None:
        if not self.client.tr.is_closing():
            self.client.tr.resume_reading()


# ------------------------------------------------------------------ the collector
class HttpProxy:
    """The proxy: a collector whose thread runs an asyncio loop (``tuiprof/collect/base.py``).

    ``book`` is the store's :class:`~tuiprof.store.requests.RequestBook`; its ``clock`` (the
    session's) times every event."""

    name = "proxy"

    def __init__(self, book: Any, listen: tuple[str, int], upstream: tuple[str, int],
                 prefix: str = "proxy:") -> None:
        self.book = book
        self.listen = listen
        self.upstream = upstream
        self.prefix = prefix
        self.loop: Any = None
        self.conns: set[ClientSide] = set()
        self.counts: dict[str, int] = {}
        self.tokens_from = {"usage": 0, "chunks": 0}
        self.statuses: dict[int, int] = {}
        self.bytes_up = self.bytes_down = 0
        self.max_buffered = 0
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._ready = threading.Event()
        self._n = 0
        self._live: set = set()
        self._tid = 0
        self._cpu = 0.0
        self._stopped = False

    def clock(self) -> int:
        return self.book.clock()

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    # ---------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Listen on LISTEN (OSError when it cannot) and serve on a thread of its own."""
        sock = bind(self.listen)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(sock,), name="tuiprof-proxy",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self, sock: socket.socket) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        self._tid = threading.get_native_id()
        try:
            self._server = loop.run_until_complete(
                loop.create_server(lambda: ClientSide(self), sock=sock))
        finally:
            self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._cpu = time.thread_time()
            loop.close()

    def stop(self) -> None:
        """Close every connection (requests in flight end as cancelled) and the thread."""
        if self._stopped or self.loop is None or self._thread is None:
            return
        self._stopped = True
        loop = self.loop

        def down() -> None:
            if self._server is not None:
                self._server.close()
            t = self.clock()
            for c in list(self.conns):
                for ex in c.tap._open():
                    self.finish(ex, t, "cancelled", "the session ended")
                c.tap.pending.clear()
                c.tap.cur = None
                c.tap.off = True
                c.abort()
            loop.call_soon(loop.stop)

        try:
            loop.call_soon_threadsafe(down)
        except RuntimeError:   # the loop is gone already
            return
        self._thread.join(5)

    @property
    def cost_s(self) -> float:
        if self._thread is not None and self._thread.is_alive() and self._thread.ident:
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
            except (OSError, AttributeError):
                return 0.0
        return self._cpu

    def stats(self) -> dict:
        """What passed (``meta.proxy``)."""
        return {"listen": address_text(self.listen), "upstream": address_text(self.upstream),
                "requests": self._n, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "max_buffered": self.max_buffered, "tokens_from": dict(self.tokens_from),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                **self.counts}

    # ----------------------------------------------------------- records
    def new_exchange(self, method: str, path: str, t: int, client_id: str | None,
                     room: bool, read: int = 0) -> Exchange:
        last = path.rstrip("/").rsplit("/", 1)[-1]
        rid = None
        if method == "POST" and last in GENERATION:
            if not room:
                self.count("not_recorded")
            else:
                self._n += 1
                base = (client_id[:MAX_ID] if client_id else str(self._n))
                rid = self.prefix + base
                if rid in self._live:              # the same id twice in flight
                    rid = f"{rid}#{self._n}"
        else:
            self.count("other_requests")
        ex = Exchange(method, path, t, rid, read)
        if rid is not None:
            self._live.add(rid)
            ex.open = True
            try:
                self.book.arrived(rid, 0, SOURCE, t=t, read_t=read or None)
            except Exception:   # the store's bookkeeping never stops the bytes
                ex.open = False
        return ex

    def event(self, ex: Exchange, obj: Any, t: int) -> None:
        text, reason, prompt, output, error = event_facts(obj)
        if text:
            ex.chunks += 1
            if ex.open:
                self.book.tokens(ex.rid, 1, t)
        if reason:
            ex.reason = reason
        if prompt is not None:
            ex.prompt = prompt
        if output is not None:
            ex.output = output
        if error and not ex.reason:
            ex.reason = f"error: {error}"

    def finish(self, ex: Exchange, t: int, status: str | None = None, why: str = "") -> None:
        """The exchange ended at ``t``: its response is complete (``status`` None), or it was
        cut (``status`` failed or cancelled, ``why``)."""
        if ex.status:
            self.statuses[ex.status] = self.statuses.get(ex.status, 0) + 1
        if not ex.open:
            return
        ex.open = False
        self._live.discard(ex.rid)
        if not ex.stream and ex.json is not None and status is None:
            try:
                _, reason, prompt, output, error = event_facts(json.loads(bytes(ex.json)))
                ex.prompt, ex.output = prompt, output
                ex.reason = reason or (f"error: {error}" if error else ex.reason)
            except ValueError:
                pass
        if status is None:
            ok = 200 <= ex.status < 400
            status = "finished" if ok else "failed"
            why = ex.reason or ("" if ok else f"HTTP {ex.status}")
            if not ok and ex.reason:
                why = f"HTTP {ex.status}: {ex.reason}"
        elif ex.status and ex.status >= 400:
            why = f"HTTP {ex.status}: {why}"
        output = ex.output
        tokens_from = "usage" if output is not None else ("chunks" if ex.stream else "")
        if output is None and ex.stream:
            output = ex.chunks
        if tokens_from:
            self.tokens_from[tokens_from] += 1
        token_ns = None
        if not ex.stream and status == "finished":
            token_ns = [t]       # not a stream: its tokens come with its end
        try:
            self.book.finished(ex.rid, why, t, status, output_tokens=output, token_ns=token_ns,
                               prompt_tokens=ex.prompt, http_status=ex.status,
                               tokens_from=tokens_from)
        except Exception:
            pass
