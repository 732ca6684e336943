"""A UI's view of a session held elsewhere (``tuiprof attach``): a detached session's keeper
reached through its socket, one viewer connection per process, relayed by the keeper
(:mod:`tuiprof.sessions.holder`)."""
from __future__ import annotations

import threading
from typing import Any, Callable

from . import protocol
from .client import RemoteControl

from .process_set import ProcessEntry, ProcessSet, _int, _quiet


# ============================================================================ attached
class AttachedSession(ProcessSet):
    """A UI's view of a session held elsewhere (a detached session's keeper): every process
    through the keeper's socket, one viewer connection each. ``q`` leaves it running."""

    detaches = True
    POLL_S = 1.0

    def __init__(self, connect: Callable[..., protocol.Client], sid: str,
                 pull_every: float = 1.0) -> None:
        super().__init__()
        self._connect = connect
        self.sid = sid
        self.pull_every = pull_every
        self.info: dict = {}
        self.control_client: protocol.Client | None = None
        self._closing = threading.Event()
        self.lost = threading.Event()        # the keeper stopped answering (or went)
        self.lost_why = ""
        # mirrors to start from, by process index (a fleet re-attaching to the same session
        # shows what it had until the first pull replaces it)
        self.seed: dict = {}
        self.detach_line = (f"detached from session {sid}; it goes on (tuiprof attach {sid} "
                            f"to come back, tuiprof stop {sid} to end it)")

    def start(self) -> None:
        self.control_client = self._connect("control")
        self.info = self.control_client.request("info", timeout=10)
        self._sync(self.control_client.request("procs", timeout=10))
        threading.Thread(target=self._poll, name="tuiprof-attach", daemon=True).start()

    def _sync(self, procs: Any) -> None:
        for f in procs if isinstance(procs, list) else []:
            if not isinstance(f, dict) or not isinstance(f.get("index"), int):
                continue
            e = self.entry(f["index"])
            if e is None:
                e = ProcessEntry(f["index"], _int(f.get("pid")), _int(f.get("ppid")),
                                 [str(a) for a in f.get("argv") or []], str(f.get("name", "")),
                                 main=bool(f.get("main")), forked_from=_int(f.get("forked_from")))
                ctl = RemoteControl(reply_timeout=60.0, pull_every=self.pull_every)
                seeded = self.seed.pop(e.index, None)
                if seeded is not None:
                    ctl.mirror = seeded
                ctl.connect(lambda i=e.index: self._connect("viewer", proc=i))
                e.ctl = ctl
                self._add(e)
            old = e.state
            e.state = str(f.get("state", e.state))
            e.line, e.note = str(f.get("line", "")), str(f.get("note", ""))
            e.exit_status = _int(f.get("exit_status"))
            e.socket = "relayed" if f.get("serving") else None
            if old == "running" and e.state == "died" and e.line:
                self.notice(e.line)

    def _poll(self) -> None:
        while not self._closing.wait(self.POLL_S):
            c = self.control_client
            if c is None:
                return
            try:
                self._sync(c.request("procs", timeout=10))
                self.info = c.request("info", timeout=10)
            except protocol.ProtocolError as exc:
                if not self._closing.is_set():
                    self.lost_why = str(exc)[:200]
                    self.lost.set()
                    self.notice(f"session {self.sid}: its keeper is gone (tuiprof ls)")
                return
            except protocol.RemoteError:
                continue

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing: an attached UI leaves, the session goes on."""

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        for e in self._entries:
            if e.ctl is not None:
                _quiet(e.ctl.close)()
        if self.control_client is not None:
            self.control_client.close(bye=True)


__all__ = ["AttachedSession"]
