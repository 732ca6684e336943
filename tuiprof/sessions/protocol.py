"""The one wire protocol between tuiprof's processes: a session's processes, the process that
holds the session (the live app, or a detached keeper), the UIs that attach to it, and the
processes a profiled program starts.

Frames: a 4-byte big-endian length, then the payload. A request (client to server) is a JSON
object ``{"op": NAME, "args": [...]}`` of at most :data:`MAX_REQUEST` bytes: the server never
unpickles anything it is sent. A reply (server to client) is ``("ok", value)`` or
``("err", one line)``, pickled, and read back by :class:`SafeUnpickler`, which builds only the
store's data classes and plain containers (never a function, never an arbitrary class).

Every connection starts with ``{"op": "hello", "args": [{"v": VERSION, "role": ..., "token":
...}]}``. Who may connect:

* a Unix socket in the per-user runtime directory (0700 directory, 0600 socket): the server
  reads the peer's uid with ``SO_PEERCRED`` on accept and closes the connection of any other
  uid before reading a byte; the client checks the server's uid the same way;
* TCP (``--listen HOST:PORT``) only with a token: the hello must carry it (compared in
  constant time), or the connection is refused.

A connection that sends no hello within :data:`HELLO_TIMEOUT_S`, stops inside a frame for
:data:`FRAME_TIMEOUT_S`, sends a frame larger than allowed or anything that is not a request is
closed; the session it reached is not otherwise affected. docs/remote.md has the threat model.

This module uses the standard library only: the start-up hook of a program's child processes
imports it before anything else.
"""
from __future__ import annotations

import hmac
import io
import json
import os
import pickle
import select
import socket
import struct
import threading
import time
from typing import Any, Callable

VERSION = 1
MAX_REQUEST = 1 << 16          # bytes of one request (they are small: an op and a few values)
MAX_REPLY = 1 << 30            # bytes of one reply (a whole store's raw records, worst case)
HELLO_TIMEOUT_S = 5.0          # a new connection says hello within this, or is closed
FRAME_TIMEOUT_S = 10.0         # once a frame has begun, the rest of it comes within this
SEND_TIMEOUT_S = 30.0          # a peer that does not read its replies is dropped after this
MAX_CONNECTIONS = 64           # open connections a server keeps; more are refused
MAX_OP = 64                    # characters of an op name
_LEN = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer broke the protocol (or is not a tuiprof peer)."""


class Refused(ProtocolError):
    """The server refused the connection (wrong uid, wrong token, too many connections)."""


class Closed(ProtocolError):
    """The connection ended."""


class RemoteError(RuntimeError):
    """The server answered a request with an error (its one line)."""


class Raw(bytes):
    """A reply payload already encoded (a relay passes another server's reply on unread)."""


# ---------------------------------------------------------------------------- frames
def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes | None:
    """``n`` bytes, None at a clean end of stream before the first byte; raises Closed on an
    end inside, ProtocolError past ``deadline`` (time.monotonic)."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("the peer stopped in the middle of a frame")
            sock.settimeout(left)
        else:
            sock.settimeout(None)
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except socket.timeout:
            raise ProtocolError("the peer stopped in the middle of a frame") from None
        except OSError as exc:
            raise Closed(str(exc)) from None
        if not chunk:
            if not buf:
                return None
            raise Closed("the peer closed the connection inside a frame")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int, first_timeout: float | None = None) -> bytes | None:
    """One frame's payload (None: the peer closed the connection between frames).
    ``first_timeout``: how long to wait for the frame to begin (None: for ever); once it has
    begun, the whole frame must come within :data:`FRAME_TIMEOUT_S`."""
    try:
        ready, _, _ = select.select([sock], [], [], first_timeout)
    except (OSError, ValueError) as exc:
        raise Closed(str(exc)) from None
    if not ready:
        raise ProtocolError("no request in time")
    deadline = time.monotonic() + FRAME_TIMEOUT_S
    head = _recv_exact(sock, 4, deadline)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise ProtocolError(f"a frame of {n} bytes (at most {limit})")
    body = _recv_exact(sock, n, max(deadline, time.monotonic() + n / 50e6)) if n else b""
    if body is None:
        raise Closed("the peer closed the connection inside a frame")
    return body


def send_frame(sock: socket.socket, payload: bytes, timeout: float = SEND_TIMEOUT_S) -> None:
    sock.settimeout(timeout)
    try:
        if len(payload) < 1 << 16:
            sock.sendall(_LEN.pack(len(payload)) + payload)
        else:
            sock.sendall(_LEN.pack(len(payload)))
            sock.sendall(payload)
    except OSError as exc:
        raise Closed(str(exc)) from None


# ---------------------------------------------------------------------------- requests
def encode_request(op: str, args: tuple | list = ()) -> bytes:
    """A request as JSON (plain values only: str, int, float, bool, None, lists, dicts)."""
    return json.dumps({"op": op, "args": list(args)}, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


def decode_request(payload: bytes) -> tuple[str, list]:
    """(op, args) of a request; ProtocolError for anything else."""
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("a request that is not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("op"), str):
        raise ProtocolError("a request without an op")
    op, args = obj["op"], obj.get("args", [])
    if not op or len(op) > MAX_OP or not op.isidentifier():
        raise ProtocolError("a request with a malformed op")
    if not isinstance(args, list):
        raise ProtocolError("a request whose args are not a list")
    return op, args


# ---------------------------------------------------------------------------- replies
def encode_reply(kind: str, value: Any) -> bytes:
    return pickle.dumps((kind, value), protocol=pickle.HIGHEST_PROTOCOL)


_SAFE_BUILTINS = frozenset({"int", "float", "str", "bytes", "bytearray", "list", "dict", "set",
                            "frozenset", "tuple", "bool", "complex", "slice", "range", "object"})
_SAFE_GLOBALS = frozenset({
    ("collections", "deque"), ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("array", "array"), ("array", "_array_reconstructor"),
    ("copyreg", "_reconstructor"), ("datetime", "datetime"), ("datetime", "timedelta"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.dtypes", "Float64DType"), ("numpy.dtypes", "Int64DType"),
    ("numpy.dtypes", "Float32DType"), ("numpy.dtypes", "Int32DType"),
})
# Modules whose classes (data holders: rows, aggregates, statuses) a reply may build.
_DATA_MODULES = ("tuiprof.store.", "tuiprof.control", "tuiprof.startup")


class SafeUnpickler(pickle.Unpickler):
    """Builds the store's data classes and plain containers; refuses every other global (a
    function, a class from anywhere else), so a reply cannot run code in the reader."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module.startswith(_DATA_MODULES) or module in ("tuiprof.control", "tuiprof.startup"):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and getattr(obj, "__module__", "") == module:
                return obj
        raise pickle.UnpicklingError(f"a reply may not build {module}.{name}")


def decode_reply(payload: bytes) -> tuple[str, Any]:
    try:
        msg = SafeUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:
        raise ProtocolError(f"an unreadable reply ({type(exc).__name__}: {exc})"[:200]) from None
    if not (isinstance(msg, tuple) and len(msg) == 2 and msg[0] in ("ok", "err")):
        raise ProtocolError("a reply that is not (ok|err, value)")
    return msg


# ---------------------------------------------------------------------------- peers
def peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class Peer:
    """Who is at the other end of a server's connection."""

    def __init__(self, pid: int | None, uid: int | None, tcp: bool, role: str = "",
                 info: dict | None = None) -> None:
        self.pid, self.uid, self.tcp = pid, uid, tcp
        self.role = role
        self.info = dict(info or {})


# ---------------------------------------------------------------------------- server
class Handler:
    """What a server does with one connection's requests (one instance per connection)."""

    def hello(self, peer: Peer, args: dict) -> Any:
        """The connection said hello (its role and facts in ``args``); returns the hello's
        answer. Raise :class:`Refused` to refuse it."""
        return {}

    def request(self, op: str, args: list) -> Any:
        raise RemoteError(f"unknown request {op!r}")

    def closed(self, clean: bool) -> None:
        """The connection ended (``clean``: after a ``bye``)."""


class Server:
    """Accepts connections on a Unix socket (and a TCP address, with a token) and answers each
    on its own thread with a fresh :class:`Handler` from ``make_handler``. Requests of one
    connection are answered in order; connections run side by side."""

    def __init__(self, make_handler: Callable[[], Handler], path: str | None = None, *,
                 tcp: tuple[str, int] | None = None, token: str | None = None,
                 name: str = "tuiprof-server", cost: Callable[[float], None] | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if tcp is not None and not token:
            raise ValueError("a TCP listener needs a token")
        self.make_handler = make_handler
        self.path = path
        self.tcp = tcp
        self.token = token
        self.name = name
        self.cost = cost            # called with the CPU seconds of answering each request
        self.max_connections = max_connections
        self.refused = 0            # connections refused (uid, token, garbage, too many)
        self.accepted = 0
        self._socks: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "Server":
        if self.path is not None:
            self._socks.append(bind_unix(self.path))
        if self.tcp is not None:
            s = socket.create_server(self.tcp, reuse_port=False)
            self._socks.append(s)
            self.tcp = s.getsockname()[:2]
        for s in self._socks:
            t = threading.Thread(target=self._accept, args=(s,), name=f"{self.name}-accept",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self, connections: bool = True) -> None:
        """Stop accepting (the socket file goes); ``connections``: end the open ones too."""
        if self._closed.is_set():
            return
        self._closed.set()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        if connections:
            with self._lock:
                conns = list(self._conns)
            for c in conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def forget(self) -> None:
        """In a forked child: drop the parent's sockets without touching them (they are the
        parent's; closing our copies only releases descriptors)."""
        self._closed.set()
        for s in list(self._socks) + list(self._conns):
            try:
                s.close()   # our descriptor only: no shutdown, no unlink
            except OSError:
                pass
        self._socks.clear()
        self._conns.clear()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # ------------------------------------------------------------------ accepting
    def _accept(self, lsock: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                sock, _addr = lsock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.05)
                continue
            unix = sock.family == socket.AF_UNIX
            try:
                pid, uid = peer_uid(sock) if unix else (None, None)
            except OSError:
                pid = uid = -1
            if unix and uid != os.getuid():
                self._refuse(sock, "another user's connection")
                continue
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not full:
                    self._conns.add(sock)
            if full:
                self._refuse(sock, f"too many connections (at most {self.max_connections})")
                continue
            self.accepted += 1
            if not unix:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            threading.Thread(target=self._serve, args=(sock, Peer(pid, uid, not unix)),
                             name=f"{self.name}-conn", daemon=True).start()

    def _refuse(self, sock: socket.socket, why: str) -> None:
        self.refused += 1
        try:
            send_frame(sock, encode_reply("err", f"refused: {why}"), timeout=1.0)
        except ProtocolError:
            pass
        try:
            sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ one connection
    def _serve(self, sock: socket.socket, peer: Peer) -> None:
        handler: Handler | None = None
        clean = False
        try:
            handler = self._hello(sock, peer)
            if handler is None:
                return
            while not self._closed.is_set():
                try:
                    payload = recv_frame(sock, MAX_REQUEST)
                except ProtocolError:
                    self.refused += 1
                    return
                if payload is None:
                    return
                try:
                    op, args = decode_request(payload)
                except ProtocolError as exc:
                    self.refused += 1
                    self._try_send(sock, encode_reply("err", str(exc)))
                    return
                if op == "bye":
                    clean = True
                    self._try_send(sock, encode_reply("ok", None))
                    return
                t0 = time.thread_time()
                try:
                    value = handler.request(op, args)
                    reply = value if isinstance(value, Raw) else encode_reply("ok", value)
                except Exception as exc:  # one line back; the session goes on
                    reply = encode_reply("err", _one_line(exc))
                sent = self._try_send(sock, reply)
                if self.cost is not None:
                    self.cost(time.thread_time() - t0)
                if not sent:
                    return
        finally:
            with self._lock:
                self._conns.discard(sock)
            try:
                sock.close()
            except OSError:
                pass
            if handler is not None:
                try:
                    handler.closed(clean)
                except Exception:
                    pass

    def _hello(self, sock: socket.socket, peer: Peer) -> Handler | None:
        try:
            payload = recv_frame(sock, MAX_REQUEST, first_timeout=HELLO_TIMEOUT_S)
            if payload is None:
                return None
            op, args = decode_request(payload)
        except ProtocolError as exc:
            self.refused += 1
            self._try_send(sock, encode_reply("err", f"refused: {exc}"))
            return None
        facts = args[0] if args and isinstance(args[0], dict) else {}
        if op != "hello" or facts.get("v") != VERSION:
            self.refused += 1
            self._try_send(sock, encode_reply("err", f"refused: not a tuiprof {VERSION} hello"))
            return None
        if peer.tcp:
            given = facts.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(
                    given.encode("utf-8", "replace"), (self.token or "").encode()):
                self.refused += 1
                self._try_send(sock, encode_reply("err", "refused: wrong token"))
                return None
        peer.role = str(facts.get("role", ""))[:32]
        peer.info = facts
        handler = self.make_handler()
        try:
            answer = handler.hello(peer, facts)
        except Refused as exc:
            self.refused += 1
            self._try_send(sock, encode_reply("err", f"refused: {exc}"))
            return None
        except Exception as exc:
            self._try_send(sock, encode_reply("err", _one_line(exc)))
            return None
        if not self._try_send(sock, encode_reply("ok", answer)):
            handler.closed(False)
            return None
        return handler

    @staticmethod
    def _try_send(sock: socket.socket, payload: bytes) -> bool:
        try:
            send_frame(sock, payload)
            return True
        except ProtocolError:
            return False


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:200]


def bind_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` (0600). A stale socket there (nobody listening:
    its session died) is replaced; a live one is an error."""
    if len(path.encode()) >= 107:
        raise OSError(f"socket path too long for a Unix socket ({len(path)} characters): "
                      f"{path}; set TUIPROF_RUNTIME_DIR to a shorter directory")
    if os.path.lexists(path):
        if is_listening(path):
            raise OSError(f"a session already listens at {path}")
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        s.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    s.listen(32)
    return s


def is_listening(path: str, timeout: float = 1.0) -> bool:
    """True when a process accepts connections at the Unix socket ``path``."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---------------------------------------------------------------------------- client
class Client:
    """One connection to a :class:`Server`: requests answered in order, one at a time."""

    def __init__(self, sock: socket.socket, hello: Any = None) -> None:
        self.sock = sock
        self.hello = hello          # the server's answer to our hello
        self.lock = threading.Lock()
        self.closed = False
        # called with (bytes received, bytes sent) of each frame: a fleet's per-host traffic
        self.on_bytes: Callable[[int, int], None] | None = None

    @classmethod
    def unix(cls, path: str, role: str = "", timeout: float = 10.0, **facts: Any) -> "Client":
        """Connect to the server at ``path`` (which must run as this user) and say hello."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            _pid, uid = peer_uid(s)
        except OSError as exc:
            s.close()
            raise Closed(f"cannot connect to {path}: {exc.strerror or exc}") from None
        if uid != os.getuid():
            s.close()
            raise Refused(f"the process at {path} runs as another user (uid {uid})")
        return cls._greet(s, role, None, timeout, facts)

    @classmethod
    def tcp(cls, host: str, port: int, token: str, role: str = "", timeout: float = 10.0,
            **facts: Any) -> "Client":
        try:
            s = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise Closed(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return cls._greet(s, role, token, timeout, facts)

    @classmethod
    def _greet(cls, s: socket.socket, role: str, token: str | None, timeout: float,
               facts: dict) -> "Client":
        hello = {"v": VERSION, "role": role, **facts}
        if token is not None:
            hello["token"] = token
        c = cls(s)
        try:
            c.hello = c.request("hello", hello, timeout=timeout)
        except RemoteError as exc:
            c.close()
            text = str(exc)
            raise (Refused(text[len("refused: "):]) if text.startswith("refused: ")
                   else ProtocolError(text)) from None
        except ProtocolError:
            c.close()
            raise
        return c

    def send(self, op: str, *args: Any) -> None:
        """Send one request (its answer comes with :meth:`recv`)."""
        payload = encode_request(op, args)
        send_frame(self.sock, payload)
        if self.on_bytes is not None:
            self.on_bytes(0, len(payload) + 4)

    def poll(self, timeout: float) -> bool:
        """True when an answer (or the end) can be read now."""
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
        except (OSError, ValueError):
            return True
        return bool(ready)

    def recv_raw(self) -> bytes:
        """The next answer as it came (a relay passes it on unread)."""
        payload = recv_frame(self.sock, MAX_REPLY)
        if payload is None:
            raise Closed("the server closed the connection")
        if self.on_bytes is not None:
            self.on_bytes(len(payload) + 4, 0)
        return payload

    def recv(self) -> Any:
        kind, value = decode_reply(self.recv_raw())
        if kind == "err":
            raise RemoteError(value)
        return value

    def request(self, op: str, *args: Any, timeout: float | None = 60.0) -> Any:
        """One request and its answer (RemoteError: the server's error; ProtocolError: the
        connection broke, or no answer within ``timeout``)."""
        return decode_value(self.request_raw(op, *args, timeout=timeout))

    def request_raw(self, op: str, *args: Any, timeout: float | None = 60.0) -> bytes:
        with self.lock:
            if self.closed:
                raise Closed("connection closed")
            try:
                self.send(op, *args)
                if timeout is not None and not self.poll(timeout):
                    raise ProtocolError(f"no answer to {op!r} in {timeout:.0f} s")
                return self.recv_raw()
            except ProtocolError:
                self.close()
                raise

    def close(self, bye: bool = False) -> None:
        if self.closed:
            return
        if bye:
            try:
                self.send("bye")
                if self.poll(2.0):
                    self.recv_raw()
            except ProtocolError:
                pass
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def decode_value(payload: bytes) -> Any:
    kind, value = decode_reply(payload)
    if kind == "err":
        raise RemoteError(value)
    return value


__all__ = ["VERSION", "Server", "Handler", "Client", "Peer", "ProtocolError", "Refused",
           "Closed", "RemoteError", "Raw", "SafeUnpickler", "encode_request", "decode_request",
           "encode_reply", "decode_reply", "decode_value", "bind_unix", "is_listening",
           "peer_uid", "recv_frame", "send_frame"]
