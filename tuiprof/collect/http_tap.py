"""What the proxy records, parsed from copies of the bytes after they were forwarded
(:mod:`tuiprof.collect.http_proxy` forwards them): HTTP/1.1 message framing, decoded
incrementally (:class:`Body`), one request and its response (:class:`Exchange`), what a
server-sent event or a JSON body says of it (:func:`event_facts`), and one client connection's
requests and responses (:class:`Tap`). A message it cannot parse stops the parsing of its
connection (:class:`Unparsed`), never the forwarding.
"""
from __future__ import annotations

import json
from collections import deque
from typing import Any, Callable

MAX_HEAD = 64 * 1024       # a request's or response's head, parsed
MAX_EVENT = 1 << 20        # one server-sent event's data, parsed
MAX_JSON = 256 * 1024      # a non-streaming response's body kept to read its usage
MAX_PENDING = 64           # requests of one connection waiting for their responses
MAX_LINE = 4096            # a chunk-size or trailer line


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

    __slots__ = ("rid", "method", "path", "arrival", "read", "status", "reason", "stream", "chunks",
                 "prompt", "output", "json", "jsize", "event", "line", "data", "open",
                 "content_type")

    def __init__(self, method: str, path: str, arrival: int, rid: Any, read: int = 0) -> None:
        self.rid = rid              # the store's id, None: not a generation request
        self.method = method
        self.path = path
        self.arrival = arrival      # the kernel had its first bytes
        self.read = read            # the proxy read them, where later (0: at its arrival)
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

    def __init__(self, proxy: Any, waited: Callable[[], int] | None = None) -> None:
        # the HttpProxy it records for: its clock, count, new_exchange, event and finish
        self.proxy = proxy
        # how long the bytes being read waited in the kernel's socket buffer (ns), asked at a
        # request's first bytes only (tuiprof.collect.socket_arrival)
        self.waited = waited
        self.off = False
        self.req_head = bytearray()
        self.req_t = 0
        self.req_read = 0
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
                    # the request's first bytes: when the kernel had them, and this read
                    wait = self.waited() if self.waited is not None else 0
                    self.req_t, self.req_read = t - wait, (t if wait > 0 else 0)
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
                                     len(self.pending) < MAX_PENDING, self.req_read)
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
