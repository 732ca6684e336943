"""A byte relay on this machine, as ``ssh -L`` forwards a port or a Unix socket: a listener that
carries each connection to a target, counting the bytes each way. ``down()`` drops the listener
and every connection (a link that fails; the session behind it goes on), ``up()`` listens again
at the same address. Addresses are a TCP port on 127.0.0.1 (an int; 0: any free one) or a Unix
socket's path (a str)."""
from __future__ import annotations

import os
import socket
import threading


def _listen(addr: int | str) -> socket.socket:
    if isinstance(addr, int):
        return socket.create_server(("127.0.0.1", addr))
    if os.path.exists(addr):
        os.unlink(addr)
    s = socket.socket(socket.AF_UNIX)
    s.bind(addr)
    s.listen(8)
    return s


def _connect(addr: int | str) -> socket.socket:
    if isinstance(addr, int):
        return socket.create_connection(("127.0.0.1", addr))
    s = socket.socket(socket.AF_UNIX)
    s.connect(addr)
    return s


class Relay:
    def __init__(self, target: int | str, listen: int | str = 0) -> None:
        self.target, self.listen = target, listen
        self.up_bytes = self.down_bytes = 0
        self.lock = threading.Lock()
        self.conns: list = []
        self.srv: socket.socket | None = None

    @property
    def port(self) -> int:
        return self.listen

    def up(self) -> "Relay":
        self.srv = _listen(self.listen)
        if isinstance(self.listen, int):
            self.listen = self.srv.getsockname()[1]   # the same port when it comes back
        threading.Thread(target=self._accept, args=(self.srv,), daemon=True).start()
        return self

    def down(self) -> None:
        self.srv.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def counts(self) -> tuple[int, int]:
        """Bytes carried so far: towards the target, and back."""
        with self.lock:
            return self.up_bytes, self.down_bytes

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                a, _ = srv.accept()
                b = _connect(self.target)
            except OSError:
                return
            with self.lock:
                self.conns += [a, b]
            threading.Thread(target=self._pipe, args=(a, b, "up_bytes"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, a, "down_bytes"), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                with self.lock:
                    setattr(self, way, getattr(self, way) + len(data))
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
