"""The wire protocol's refusals, each against a real server on a real socket: another user's
connection, a wrong token, garbage, a frame too large, a half-open connection, a stale socket
of a dead session, a reply that would run code. After each, the server still answers a good
client (the session it serves is not affected)."""
from __future__ import annotations

import os
import pickle
import socket
import struct
import time

import pytest

from tuiprof.sessions import protocol


class Echo(protocol.Handler):
    def request(self, op, args):
        if op == "echo":
            return args
        if op == "boom":
            raise ValueError("bad\nrequest")
        return super().request(op, args)


@pytest.fixture
def sock_dir(tmp_path_factory):
    import tempfile
    d = tempfile.mkdtemp(prefix="tp-", dir="/tmp")   # short: a Unix socket path is < 108 bytes
    os.chmod(d, 0o700)
    yield d
    import shutil
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(sock_dir):
    srv = protocol.Server(Echo, os.path.join(sock_dir, "s.sock"), name="test").start()
    yield srv
    srv.close()


def _good(srv) -> None:
    c = protocol.Client.unix(srv.path, role="control")
    try:
        assert c.request("echo", 1, "x", timeout=5) == [1, "x"]
    finally:
        c.close(bye=True)


def _wait(pred, seconds=10.0):
    t_end = time.monotonic() + seconds
    while not pred():
        assert time.monotonic() < t_end, "timed out"
        time.sleep(0.02)


def test_requests_are_json_and_errors_are_one_line(server):
    _good(server)
    c = protocol.Client.unix(server.path)
    with pytest.raises(protocol.RemoteError, match="^bad request$"):
        c.request("boom")
    with pytest.raises(protocol.RemoteError, match="unknown request"):
        c.request("nope")
    assert c.request("echo", {"a": [1, 2.5, None]}) == [{"a": [1, 2.5, None]}]
    c.close(bye=True)
    assert stat_mode(server.path) == 0o600


def stat_mode(path):
    return os.stat(path).st_mode & 0o777


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_garbage_and_oversized_frames_are_refused_and_the_server_goes_on(server):
    for payload in (b"\x00\x00\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n",
                    struct.pack(">I", 1 << 30) + b"x" * 100,
                    struct.pack(">I", 9) + b'{"op":1}x',
                    _frame(b'{"op":"__import__","args":[1]}')):
        s = socket.socket(socket.AF_UNIX)
        s.connect(server.path)
        s.sendall(payload)
        s.settimeout(10)
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except OSError:
            pass
        s.close()
        assert len(data) > 4, payload        # refused with a reply at once, not left to time out
        kind, msg = protocol.decode_reply(data[4:])
        assert kind == "err" and msg.startswith("refused"), (payload, msg)
    # a pickle sent as a request is not unpickled: it is not JSON, so it is refused
    s = socket.socket(socket.AF_UNIX)
    s.connect(server.path)
    evil = pickle.dumps(os.system)
    s.sendall(struct.pack(">I", len(evil)) + evil)
    s.settimeout(10)
    assert b"not JSON" in s.recv(4096)
    s.close()
    _wait(lambda: server.connections == 0)
    assert server.refused >= 6
    _good(server)


def test_a_half_open_connection_is_closed(server, monkeypatch):
    monkeypatch.setattr(protocol, "HELLO_TIMEOUT_S", 0.5)
    monkeypatch.setattr(protocol, "FRAME_TIMEOUT_S", 0.5)
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(server.path)          # connects, says nothing
    half = socket.socket(socket.AF_UNIX)
    half.connect(server.path)
    half.sendall(b"\x00\x00")            # half a frame's header, then nothing
    c = protocol.Client.unix(server.path)   # a good client at the same time
    half2 = c.sock.dup()
    half2.sendall(b"\x00\x00\x00\x40{")    # after its hello: a frame begun, never finished
    _wait(lambda: server.connections == 0, 10)
    for s in (silent, half):
        s.settimeout(5)
        data = s.recv(4096)
        assert data == b"" or protocol.decode_reply(data[4:])[0] == "err"
        s.close()
    half2.close()
    c.close()
    _good(server)


def test_another_users_connection_is_refused(server, sock_dir):
    """Two layers: the runtime directory is 0700 (another user cannot reach the socket), and
    the server checks the peer's uid (SO_PEERCRED) on accept, in case the socket is reached
    anyway (here the test opens the directory and the socket to everyone)."""
    nobody = 65534
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child drops to another uid, then connects
        os.close(r)
        code = 0
        try:
            os.setgid(nobody)
            os.setuid(nobody)
            try:
                protocol.Client.unix(server.path)
                code = 1                   # reached it: must not happen (0700 directory)
            except protocol.ProtocolError as exc:
                code = 2 if "Permission denied" in str(exc) else 3
            os.write(w, bytes([code]))
            os.chmod  # noqa: B018 - nothing else in the child
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == bytes([2])     # EACCES: the directory keeps it out
    os.close(r)
    os.chmod(sock_dir, 0o755)
    os.chmod(server.path, 0o666)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(nobody)
            os.setuid(nobody)
            try:
                protocol.Client.unix(server.path)
                code = 1
            except protocol.Refused as exc:
                code = 2 if "another user" in str(exc) else 3
            except protocol.ProtocolError:
                code = 4
            os.write(w, bytes([code]))
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == bytes([2])     # refused by SO_PEERCRED, before any request
    os.close(r)
    assert server.refused >= 1
    _good(server)


def test_tcp_needs_its_token(sock_dir):
    with pytest.raises(ValueError):
        protocol.Server(Echo, None, tcp=("127.0.0.1", 0))     # never without a token
    token = "t0k3n-" + "x" * 20
    srv = protocol.Server(Echo, os.path.join(sock_dir, "t.sock"), tcp=("127.0.0.1", 0),
                          token=token).start()
    try:
        host, port = srv.tcp
        with pytest.raises(protocol.Refused, match="wrong token"):
            protocol.Client.tcp(host, port, "wrong" * 5)
        with pytest.raises(protocol.Refused, match="wrong token"):
            protocol.Client.tcp(host, port, token[:-1])
        s = socket.create_connection((host, port))          # no hello at all: JSON garbage
        s.sendall(struct.pack(">I", 2) + b"{}")
        s.settimeout(5)
        assert b"refused" in s.recv(4096)
        s.close()
        c = protocol.Client.tcp(host, port, token)
        assert c.request("echo", 7) == [7]
        c.close(bye=True)
        _good(srv)   # the Unix socket needs no token: the uid check is its lock
    finally:
        srv.close()


def test_a_stale_socket_of_a_dead_session_is_replaced_and_a_live_one_is_not(sock_dir):
    path = os.path.join(sock_dir, "s.sock")
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(path)
    dead.close()                       # its process died: the file stays, nobody listens
    assert os.path.exists(path) and not protocol.is_listening(path)
    with pytest.raises(protocol.ProtocolError, match="cannot connect"):
        protocol.Client.unix(path)     # a client is told plainly
    srv = protocol.Server(Echo, path).start()
    try:
        _good(srv)
        with pytest.raises(OSError, match="already listens"):
            protocol.Server(Echo, path).start()
        _good(srv)
    finally:
        srv.close()
    assert not os.path.exists(path)


def test_a_reply_cannot_run_code_in_the_reader():
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/tuiprof-pwned",))

    with pytest.raises(protocol.ProtocolError, match="may not build"):
        protocol.decode_reply(pickle.dumps(("ok", Evil())))
    assert not os.path.exists("/tmp/tuiprof-pwned")
    # what a session sends decodes: a replayed H100 recording's store, whole, every part
    from tuiprof.collect.replay import load_recording, replay_into
    from tuiprof.store import SessionStore
    from tests.recordings import EAGER
    store = SessionStore(ring_tokens=8)
    replay_into(load_recording(EAGER), store)
    store.requests.arrived("r0", prompt_tokens=8, t=1)      # a server's request rows too
    store.requests.tokens("r0", 2, t=5)
    delta, _ = store.changes(None, None, False)
    kind, value = protocol.decode_reply(protocol.encode_reply("ok", delta))
    assert kind == "ok" and len(value["tokens"]) == len(delta["tokens"]) > 10
    assert value["parts"].keys() == delta["parts"].keys() and value["raw"]["add"]
    rows = value["requests"]["rows"]
    assert [r.id for r in rows] == ["r0"] and len(rows[0].token_ns) == 2
