"""The proxy in a process of its own (:class:`ProxyProcess`, the default of ``--proxy``), its
records applied to the store's requests in the session process; and :func:`make_proxy`, the
proxy of ``--proxy SPEC`` in its own process or on a thread of this one.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any

from .http_proxy import SOURCE, HttpProxy, address_text, parse_address, parse_spec

STATS_S = 1.0              # how often the proxy's process reports what passed


class PipeBook:
    """The child's stand-in for the store's requests: each call goes to the parent as one
    message, timed on the child's clock (``time.time_ns``)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.clock = time.time_ns

    def arrived(self, rid: Any, prompt_tokens: int = 0, source: str = SOURCE,
                t: int | None = None, read_t: int | None = None) -> None:
        self.conn.send(("arrived", rid, prompt_tokens, source, t, read_t))

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
                        book.arrived(msg[1], msg[2], msg[3], t=msg[4] + off,
                                     read_t=msg[5] + off if msg[5] else None)
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
