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

What it records (a copy of the bytes, parsed incrementally after they were forwarded; a
message it cannot parse leaves the forwarding as it is and is counted): per request to a
generation path (POST ``…/completions``, ``…/chat/completions``, ``…/completion``,
``…/responses``, ``…/generate``, ``…/generate_stream``): its arrival (the first byte of the
request at the proxy), each server-sent event that carries generated text (a token chunk: its
time), the response's end (its finish), the HTTP status, the prompt and output tokens from the
server's ``usage`` when it sends one (else the output is the token chunks counted, and the
row says so), the finish reason, and the client's ``X-Request-Id``. A response that is not a
stream has its first token at its end.

Bounded: a request or response head is read up to ``MAX_HEAD``, an event up to ``MAX_EVENT``,
a non-streaming body up to ``MAX_JSON`` (for its ``usage``), at most ``MAX_PENDING`` requests
a connection waiting for their responses; token times are kept by the store (at most
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
from collections import deque
from typing import Any, Callable

SOURCE = "proxy"
HIGH_WATER = 64 * 1024     # a side's write buffer above which the other side stops being read
MAX_HEAD = 64 * 1024       # a request's or response's head, parsed
MAX_EVENT = 1 << 20        # one server-sent event's data, parsed
MAX_JSON = 256 * 1024      # a non-streaming response's body kept to read its usage
MAX_PENDING = 64           # requests of one connection waiting for their responses
MAX_LINE = 4096            # a chunk-size or trailer line
MAX_ID = 128               # characters of a client's X-Request-Id kept
GENERATION = frozenset({"completions", "completion", "responses", "generate", "generate_stream",
                        "infill"})
BAD_GATEWAY = "HTTP/1.1 502 Bad Gateway"
STATS_S = 1.0              # how often the proxy's process reports what passed


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


# ------------------------------------------------------------------ framing
class Unparsed(Exception):
    """The bytes are not HTTP/1.1 tuiprof can follow: parsing stops, forwarding goes on."""


class Body:
    """A message body's framing, decoded incrementally: ``length`` (Content-Length),
    ``chunked``, ``close`` (until the connection ends) or ``none``. ``sink`` gets the body's
    bytes (the chunks' data, without their framing)."""

    __slots__ = ("kind", "left", "sink", "done", "st", "line")

    def __init__(self, kind: str, length: int = 0, sink: Callable[[bytes], None] | None = None
                 ) -> None:
        self.kind = kind
        self.left = length
        self.sink = sink
        self.done = kind == "none" or (kind == "length" and length == 0)
        self.st = "size"
        self.line = bytearray()

    def feed(self, data: bytes, i: int) -> int:
        """Consume ``data[i:]``; returns the index where this body ended (the next message
        starts there), or ``len(data)``."""
        n = len(data)
        if self.kind == "close":
            if self.sink is not None and i < n:
                self.sink(data[i:])
            return n
        if self.kind == "length":
            k = min(n - i, self.left)
            if k and self.sink is not None:
                self.sink(data[i:i + k])
            self.left -= k
            self.done = self.left == 0
            return i + k
        while i < n and not self.done:      # chunked
            st = self.st
            if st == "data":
                k = min(n - i, self.left)
                if self.sink is not None:
                    self.sink(data[i:i + k])
                i += k
                self.left -= k
                if not self.left:
                    self.st, self.left = "crlf", 2
            elif st == "crlf":
                k = min(n - i, self.left)
                i += k
                self.left -= k
                if not self.left:
                    self.st = "size"
            else:                            # a chunk-size line, or a trailer line
                j = data.find(b"\n", i)
                end = n if j < 0 else j
                self.line += data[i:end]
                if len(self.line) > MAX_LINE:
                    raise Unparsed("a chunk-size line over 4 KiB")
                if j < 0:
                    return n
                i = j + 1
                line = bytes(self.line).strip()
                self.line.clear()
                if st == "size":
                    try:
                        size = int(line.split(b";", 1)[0].strip(), 16)
                    except ValueError:
                        raise Unparsed("a bad chunk size") from None
                    if size:
                        self.st, self.left = "data", size
                    else:
                        self.st = "trailer"
                elif not line:               # the empty line after the trailers
                    self.done = True
        return i


def parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """(start line, [(lower-case name, value)]) of a message head."""
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise Unparsed("a header line without a colon")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0], headers


def header(headers: list, name: str) -> str | None:
    for k, v in reversed(headers):
        if k == name:
            return v
    return None


def body_of(headers: list, sink: Any = None, default: str = "none") -> Body:
    te = ",".join(v for k, v in headers if k == "transfer-encoding").lower()
    if "chunked" in te:
        return Body("chunked", sink=sink)
    cl = header(headers, "content-length")
    if cl is not None:
        try:
            n = int(cl.split(",")[0])
        except ValueError:
            raise Unparsed("a bad Content-Length") from None
        if n < 0:
            raise Unparsed("a negative Content-Length")
        return Body("length", n, sink)
    return Body(default, sink=sink)


# ------------------------------------------------------------------ what passes
class Exchange:
    """One request and its response, as seen passing."""

    __slots__ = ("rid", "method", "path", "arrival", "status", "reason", "stream", "chunks",
                 "prompt", "output", "json", "jsize", "event", "line", "data", "open",
                 "content_type")

    def __init__(self, method: str, path: str, arrival: int, rid: Any) -> None:
        self.rid = rid              # the store's id, None: not a generation request
        self.method = method
        self.path = path
        self.arrival = arrival
        self.status = 0
        self.reason = ""
        self.stream = False
        self.chunks = 0             # server-sent events that carried generated text
        self.prompt: int | None = None
        self.output: int | None = None
        self.json: bytearray | None = None
        self.jsize = 0
        self.line = bytearray()     # the event-stream line being read
        self.data: list = []        # the data lines of the event being read
        self.event = 0              # its size
        self.open = False           # its row is in the store


def event_facts(obj: Any) -> tuple[bool, str, int | None, int | None, str]:
    """(carries generated text, finish reason, prompt tokens, output tokens, error) of one
    decoded event (OpenAI completions and chat, the Responses API, llama.cpp's /completion,
    TGI's generate_stream)."""
    if not isinstance(obj, dict):
        return False, "", None, None, ""
    text = False
    reason = ""
    choices = obj.get("choices")
    if isinstance(choices, list):
        for c in choices:
            if not isinstance(c, dict):
                continue
            d = c.get("delta")
            if c.get("text") or (isinstance(d, dict) and (
                    d.get("content") or d.get("reasoning_content") or d.get("tool_calls"))):
                text = True
            if c.get("finish_reason"):
                reason = str(c["finish_reason"])
    kind = obj.get("type")
    if kind == "response.output_text.delta" and obj.get("delta"):
        text = True
    if isinstance(obj.get("content"), str) and obj["content"]:     # llama.cpp /completion
        text = True
    tok = obj.get("token")                                         # TGI
    if isinstance(tok, dict) and not tok.get("special") and tok.get("text"):
        text = True
    prompt = output = None
    usage = obj.get("usage")
    if kind == "response.completed" and isinstance(obj.get("response"), dict):
        usage = obj["response"].get("usage")
    if isinstance(usage, dict):
        p = usage.get("prompt_tokens", usage.get("input_tokens"))
        o = usage.get("completion_tokens", usage.get("output_tokens"))
        prompt = p if isinstance(p, int) else None
        output = o if isinstance(o, int) else None
    if obj.get("stop") is True:                                    # llama.cpp's last event
        p, o = obj.get("tokens_evaluated"), obj.get("tokens_predicted")
        prompt = p if isinstance(p, int) else prompt
        output = o if isinstance(o, int) else output
        if obj.get("stop_type"):
            reason = str(obj["stop_type"])
    err = obj.get("error")
    error = ""
    if err:
        error = str(err.get("message") if isinstance(err, dict) else err)[:160]
    return text, reason, prompt, output, error


class Tap:
    """One client connection's requests and responses, parsed from copies of what passed."""

    def __init__(self, proxy: "HttpProxy") -> None:
        self.proxy = proxy
        self.off = False
        self.req_head = bytearray()
        self.req_t = 0
        self.req_body: Body | None = None
        self.resp_head = bytearray()
        self.resp_body: Body | None = None
        self.pending: deque[Exchange] = deque()
        self.cur: Exchange | None = None        # the exchange whose response is being read
        self.tunnel = False
        self._t = 0                             # the time of the response bytes being read
        self.client_eof = False                 # the client closed its side

    # ------------------------------------------------------------ requests
    def request(self, data: bytes, t: int) -> None:
        if self.off or self.tunnel:
            return
        try:
            i, n = 0, len(data)
            while i < n:
                if self.req_body is not None:
                    i = self.req_body.feed(data, i)
                    if self.req_body.done:
                        self.req_body = None
                    continue
                if not self.req_head:
                    while i < n and data[i] in b"\r\n":   # stray line ends between requests
                        i += 1
                    if i == n:
                        return
                    self.req_t = t      # the request's first byte
                self.req_head += data[i:]
                k = self.req_head.find(b"\r\n\r\n")
                if k < 0:
                    self._cap(self.req_head)
                    return
                rest = len(self.req_head) - (k + 4)
                head = bytes(self.req_head[:k + 4])
                self.req_head.clear()
                i = n - rest
                self._request_head(head)
        except Unparsed as exc:
            self.stop_parsing(str(exc))

    def _cap(self, buf: bytearray) -> None:
        if len(buf) > MAX_HEAD:
            raise Unparsed("a head over 64 KiB")

    def _request_head(self, head: bytes) -> None:
        line, headers = parse_head(head)
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise Unparsed("not an HTTP/1.x request")
        method, target = parts[0], parts[1]
        self.req_body = body_of(headers)
        if self.req_body.done:
            self.req_body = None
        path = target.split("?", 1)[0]
        ex = self.proxy.new_exchange(method, path, self.req_t, header(headers, "x-request-id"),
                                     len(self.pending) < MAX_PENDING)
        self.pending.append(ex)
        if method == "CONNECT" or (header(headers, "upgrade") is not None):
            pass   # a 101 or a CONNECT's 2xx turns the connection into a tunnel (response side)

    # ----------------------------------------------------------- responses
    def response(self, data: bytes, t: int) -> None:
        if self.off or self.tunnel:
            return
        self._t = t
        try:
            i, n = 0, len(data)
            while i < n:
                if self.resp_body is not None:
                    i = self.resp_body.feed(data, i)
                    if self.resp_body.done:
                        self.resp_body = None
                        self._response_end(t)
                    continue
                self.resp_head += data[i:]
                k = self.resp_head.find(b"\r\n\r\n")
                if k < 0:
                    self._cap(self.resp_head)
                    return
                rest = len(self.resp_head) - (k + 4)
                head = bytes(self.resp_head[:k + 4])
                self.resp_head.clear()
                i = n - rest
                self._response_head(head, t)
                if self.tunnel:
                    return
        except Unparsed as exc:
            self.stop_parsing(str(exc))

    def _response_head(self, head: bytes, t: int) -> None:
        line, headers = parse_head(head)
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise Unparsed("not an HTTP/1.x response")
        status = int(parts[1])
        if not self.pending:
            raise Unparsed("a response without a request")
        ex = self.pending[0]
        if 100 <= status < 200 and status != 101:
            return      # 100 Continue and the like: the final response follows
        ex.status = status
        self.cur = ex
        if status == 101 or (ex.method == "CONNECT" and 200 <= status < 300):
            self.tunnel = True
            self.proxy.finish(ex, t)
            self.pending.popleft()
            return
        ctype = (header(headers, "content-type") or "").lower()
        coded = (header(headers, "content-encoding") or "identity").lower() != "identity"
        sink = None
        if ex.rid is not None and not coded:
            if ctype.startswith("text/event-stream"):
                ex.stream = True
                sink = self._events
            elif "json" in ctype:
                ex.json = bytearray()
                sink = self._json
        if ex.method == "HEAD" or status in (204, 304):
            body = Body("none")
        else:
            body = body_of(headers, sink, default="close")
        if body.done:
            self._response_end(t)
        else:
            self.resp_body = body

    def _response_end(self, t: int) -> None:
        ex = self.cur
        self.cur = None
        if ex is None:
            return
        if self.pending and self.pending[0] is ex:
            self.pending.popleft()
        self.proxy.finish(ex, t)

    # body sinks (self._t: the time of the read they came in)
    def _json(self, b: bytes) -> None:
        ex = self.cur
        if ex is None or ex.json is None:
            return
        if len(ex.json) + len(b) > MAX_JSON:
            ex.json = None
            return
        ex.json += b

    def _events(self, b: bytes) -> None:
        ex = self.cur
        if ex is None:
            return
        i, n = 0, len(b)
        while i < n:
            j = b.find(b"\n", i)
            if j < 0:
                if len(ex.line) + n - i <= MAX_EVENT:
                    ex.line += b[i:]
                else:
                    ex.event = MAX_EVENT + 1
                return
            if ex.line:
                ex.line += b[i:j]
                line = bytes(ex.line)
                ex.line.clear()
            else:
                line = b[i:j]
            i = j + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                self._dispatch(ex)
            elif line.startswith(b"data:"):
                d = line[5:]
                d = d[1:] if d.startswith(b" ") else d
                ex.event += len(d)
                if ex.event <= MAX_EVENT:
                    ex.data.append(d)

    def _dispatch(self, ex: Exchange) -> None:
        data, size = ex.data, ex.event
        ex.data, ex.event = [], 0
        if not data or size > MAX_EVENT:
            return
        raw = data[0] if len(data) == 1 else b"\n".join(data)
        if raw.strip() == b"[DONE]":
            return
        try:
            obj = json.loads(raw)
        except ValueError:
            return
        self.proxy.event(ex, obj, self._t)

    # -------------------------------------------------------------- ends
    def stop_parsing(self, why: str) -> None:
        """Bytes tuiprof cannot follow: forwarding goes on, the connection's requests end
        where they are (counted)."""
        if self.off:
            return
        self.off = True
        self.proxy.count("unparsed")
        t = self.proxy.clock()
        for ex in self._open():
            self.proxy.finish(ex, t, "failed", f"tuiprof could not follow the HTTP: {why}")
        self.pending.clear()
        self.cur = None

    def _open(self) -> list:
        seen = [] if self.cur is None else [self.cur]
        return seen + [e for e in self.pending if e is not self.cur]

    def upstream_ended(self, t: int, reset: bool) -> None:
        """The upstream connection ended (``reset``: it was reset)."""
        body = self.resp_body
        if body is not None and body.kind == "close" and not reset:
            self.resp_body = None
            self._response_end(t)                 # a body delimited by the close: complete
        why = ("the server reset the connection" if reset else
               "the server closed the connection") + " before the response ended"
        status = "failed"
        due = self._open()
        if self.client_eof and due:    # the client closed first; the server followed it
            status, why = "cancelled", "the client disconnected (it closed its side first)"
            self.proxy.count("client_disconnects")
        for ex in due:
            self.proxy.finish(ex, t, status, why)
        self.pending.clear()
        self.cur = None
        self.resp_body = None

    def client_ended(self, t: int) -> bool:
        """The client went away; returns whether a response was still due (then the upstream
        connection is aborted, not closed)."""
        due = self._open()
        for ex in due:
            self.proxy.finish(ex, t, "cancelled", "the client disconnected")
        self.pending.clear()
        self.cur = None
        return bool(due) or self.resp_body is not None


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
        self.tap = Tap(proxy)
        self.refused = ""
        self.answered = False
        self.closed = False
        self.eof = False

    def connection_made(self, tr: Any) -> None:
        self.tr = tr
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
                     room: bool) -> Exchange:
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
        ex = Exchange(method, path, t, rid)
        if rid is not None:
            self._live.add(rid)
            ex.open = True
            try:
                self.book.arrived(rid, 0, SOURCE, t=t)
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


# ------------------------------------------------------------------ its own process
class PipeBook:
    """The child's stand-in for the store's requests: each call goes to the parent as one
    message, timed on the child's clock (``time.time_ns``)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.clock = time.time_ns

    def arrived(self, rid: Any, prompt_tokens: int = 0, source: str = SOURCE,
                t: int | None = None) -> None:
        self.conn.send(("arrived", rid, prompt_tokens, source, t))

    def tokens(self, rid: Any, n: int = 1, t: int | None = None) -> None:
        self.conn.send(("tokens", rid, n, t))

    def finished(self, rid: Any, reason: str = "", t: int | None = None, status: str = "",
                 **kw: Any) -> None:
        self.conn.send(("finished", rid, reason, t, status, kw))


def _child(conn: Any, listen: tuple, upstream: tuple) -> None:
    """The proxy's process: serve until the parent says stop (or goes away)."""
    import signal  # noqa: PLC0415

    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the terminal's Ctrl-C is the program's
    proxy = HttpProxy(PipeBook(conn), listen, upstream)
    try:
        proxy.start()
    except OSError as exc:
        conn.send(("error", exc.strerror or str(exc)))
        return
    conn.send(("ready",))

    def report() -> None:            # what passed so far, every STATS_S (the app shows it)
        try:
            conn.send(("stats", proxy.stats(), proxy.cost_s))
        except OSError:
            return
        proxy.loop.call_later(STATS_S, report)

    proxy.loop.call_soon_threadsafe(report)
    try:
        conn.recv()                  # "stop", or EOF when the parent is gone
    except (EOFError, OSError):
        pass
    proxy.stop()
    try:
        conn.send(("stats", proxy.stats(), proxy.cost_s))
        conn.send(("end",))
    except OSError:
        pass


class ProxyProcess:
    """The proxy in a process of its own, its records applied to ``book`` here.

    A Python server profiled by ``tuiprof run`` runs in the session process: a proxy thread
    there would wait for the server's GIL (up to the switch interval) before it could forward
    or time a chunk, and would take the GIL from the server. In its own process it does
    neither; its times (``time.time_ns``) are moved onto the session's clock by the offset
    between the two clocks, read when each message is applied."""

    name = "proxy"
    own_process = True   # cost_s is that process's CPU: the overhead adds it to this one's

    def __init__(self, book: Any, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.book = book
        self.listen = listen
        self.upstream = upstream
        self._proc: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self._stats: dict = {"listen": address_text(listen), "upstream": address_text(upstream)}
        self._cost = 0.0
        self._ended = threading.Event()

    def start(self) -> None:
        """Start the process; OSError when it cannot listen."""
        import os  # noqa: PLC0415
        import subprocess  # noqa: PLC0415
        import sys  # noqa: PLC0415
        from multiprocessing.connection import Connection  # noqa: PLC0415

        here, there = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p))
        # its own session: the terminal's Ctrl-C is the program's, not the proxy's
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(there.fileno()), address_text(self.listen),
             address_text(self.upstream)], pass_fds=[there.fileno()], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        there.close()
        self._conn = conn = Connection(here.detach())
        if not conn.poll(30):
            self._proc.kill()
            raise OSError(0, "the proxy's process did not start in 30 s")
        try:
            msg = conn.recv()
        except EOFError:
            msg = ("error", f"the proxy's process ended (exit status {self._proc.wait(5)})")
        if msg[0] == "error":
            self._proc.wait(5)
            raise OSError(0, msg[1])
        self._reader = threading.Thread(target=self._apply, name="tuiprof-proxy-records",
                                        daemon=True)
        self._reader.start()

    def _apply(self) -> None:
        book, conn = self.book, self._conn
        try:
            while True:
                msg = conn.recv()
                kind = msg[0]
                if kind == "end":
                    break
                if kind == "stats":
                    self._stats, self._cost = msg[1], msg[2]
                    continue
                off = book.clock() - time.time_ns()   # the child's clock onto the session's
                try:
                    if kind == "tokens":
                        book.tokens(msg[1], msg[2], t=msg[3] + off)
                    elif kind == "arrived":
                        book.arrived(msg[1], msg[2], msg[3], t=msg[4] + off)
                    elif kind == "finished":
                        book.finished(msg[1], msg[2], msg[3] + off, msg[4], **msg[5])
                except Exception:   # the store's bookkeeping never stops the records
                    pass
        except (EOFError, OSError):
            pass
        finally:
            self._ended.set()

    def stop(self) -> None:
        if self._proc is None or self._conn is None:
            return
        try:
            self._conn.send("stop")
        except OSError:
            pass
        self._ended.wait(10)
        try:
            self._proc.wait(5)
        except Exception:
            self._proc.kill()
        self._conn.close()
        self._conn = None

    @property
    def cost_s(self) -> float:
        return self._cost

    def stats(self) -> dict:
        return dict(self._stats)


def make_proxy(book: Any, spec: str, own_process: bool = True) -> Any:
    """The proxy of ``--proxy SPEC`` recording into ``book``: in a process of its own (the
    default), or on a thread of this one."""
    listen, upstream = parse_spec(spec)
    return (ProxyProcess if own_process else HttpProxy)(book, listen, upstream)


if __name__ == "__main__":    # the proxy's process (ProxyProcess)
    import sys as _sys
    from multiprocessing.connection import Connection as _Connection

    _child(_Connection(int(_sys.argv[1])), parse_address(_sys.argv[2], "LISTEN"),
           parse_address(_sys.argv[3], "UPSTREAM"))
