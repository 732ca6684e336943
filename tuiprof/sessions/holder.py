"""A session of processes, as the process that holds it sees them: the live app (``tuiprof
run``), a detached session's keeper (``tuiprof run --detach``), or a UI attached to a keeper
(``tuiprof attach``).

The session's first process is the session process (the program's main process, or the
built-in engine). Every Python process the program starts registers with the holder's server
(``s.sock`` in the session's directory: :mod:`tuiprof.sessions.follow`) and, once it imports
torch, serves its own store at ``p<pid>.sock``; the holder mirrors each with a
:class:`~tuiprof.sessions.client.RemoteControl`. Processes are kept in the order they appeared
(index 0: the session process), at most
:data:`~tuiprof.sessions.process_set.MAX_PROCESSES`.

A UI attached to a keeper connects only to the keeper's socket (one address, so ``ssh -L`` can
carry it): a *viewer* connection bound to one process is relayed, request by request, to that
process's own server on a connection of its own (its own cursor), and answered from the
keeper's mirror once the process has ended.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..control import SourceStatus
from ..store.rank_set import process_name
from . import protocol
from .client import RemoteControl
from .mirror import Mirror
from .runtime import SESSION_SOCKET, now_utc, pid_alive, write_info

from .process_set import ProcessEntry, ProcessSet, _int, _quiet, _Quiet

# multiprocessing's own helpers: they end when the process that started them ends (here the
# session process, which outlives the program's main module), so they are no orphans
HELPERS = ("resource tracker", "semaphore tracker", "forkserver")
WATCH_S = 0.25             # how often the holder looks at its processes
EXITING_PULL_S = 4.0       # a process that says it is ending is fetched within this


# ============================================================================ the holder
class HeldSession(ProcessSet):
    """The session as held by the process that started it: it starts the session process
    (``main``), serves ``s.sock`` (processes register, UIs attach) and mirrors every process.
    """

    def __init__(self, main: RemoteControl, directory: Path, sid: str, *, info: dict,
                 pull_every: float = 1.0, listen: tuple[str, int] | None = None,
                 token: str | None = None, detached: bool = False,
                 keep_dir: bool = False, feeds: Any = None) -> None:
        super().__init__()
        self.feeds = feeds      # live feeds over every process (--metrics, --otlp), or None
        self.main = main
        self.directory = Path(directory)
        self.sid = sid
        self.info = dict(info)
        self.pull_every = pull_every
        self.listen = listen
        self.token = token
        self.detached = detached
        self.keep_dir = keep_dir or detached
        self.server: protocol.Server | None = None
        self.program_ended = False
        self.orphans: list[str] = []
        self.stop_requested = threading.Event()
        self.stopped = threading.Event()     # the final snapshot is written (keeper)
        self.final_snapshot: str | None = None
        self._closing = threading.Event()
        self._watcher: threading.Thread | None = None
        main.pull_every = pull_every

    @property
    def socket_path(self) -> str:
        return str(self.directory / SESSION_SOCKET)

    # ------------------------------------------------------------------ life cycle
    def start(self, running: bool = True) -> None:
        """Serve, start the session process; ``running``: say so in ``info.json`` now (a
        keeper says it once the session process answers)."""
        self.server = protocol.Server(lambda: SessionHandler(self), self.socket_path,
                                      tcp=self.listen, token=self.token, name="tuiprof-session")
        self.server.start()
        if self.server.tcp is not None:
            self.info["listen"] = "%s:%d" % tuple(self.server.tcp)
        self.main.start()
        prog = self.main.program
        engine = self.main.options.engine
        argv = list(prog["spec"].argv) if prog else ["tuiprof", "--model",
                                                     engine.model if engine is not None else ""]
        name = prog["spec"].name if prog else str(self.info.get("name", "model"))
        parent = os.getppid() if self.main.pid == os.getpid() else os.getpid()
        self._add(ProcessEntry(0, self.main.pid, parent, argv, name, main=True,
                               started_ns=time.time_ns(), socket=self.main.socket_path,
                               ctl=self.main))
        self.info.update(pid=self.main.pid, holder_pid=os.getpid(),
                         started=self.info.get("started") or now_utc())
        if running:
            self.info["state"] = "running"
        self.save_info()
        self._watcher = threading.Thread(target=self._watch, name="tuiprof-processes",
                                         daemon=True)
        self._watcher.start()
        if self.feeds:
            self.feeds.start(self)
            self.info["feeds"] = {k: v.get("address") or v.get("url")
                                  for k, v in self.feeds.stats().items()}
            self.save_info()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process's collection (their data stays fetchable)."""
        entries = [e for e in self._entries if e.ctl is not None and e.state == "running"]
        threads = [threading.Thread(target=_quiet(e.ctl.stop), args=(timeout,), daemon=True)
                   for e in entries]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 35)

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        if self.feeds:
            _quiet(self.feeds.close)()
        for e in self._entries[1:]:
            if e.ctl is not None:
                _quiet(e.ctl.close)()
        self.main.close()
        if self.server is not None:
            self.server.close()
        if not self.keep_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ registry
    def register(self, facts: dict, peer_pid: int | None) -> ProcessEntry:
        """A process of the program says hello (at its interpreter's start, or after a
        fork)."""
        pid = peer_pid if peer_pid else _int(facts.get("pid"))
        argv = [str(a)[:400] for a in (facts.get("argv") or [])[:64]
                if isinstance(a, (str, int, float))]
        entries = self._entries
        entry = ProcessEntry(max((e.index for e in entries), default=-1) + 1, pid,
                             _int(facts.get("ppid")), argv, process_name(argv),
                             started_ns=_int(facts.get("started_ns")) or time.time_ns(),
                             forked_from=_int(facts.get("forked_from")))
        if entry.forked_from is not None:
            entry.name = f"fork of {entry.forked_from}"
        self._add(entry)
        return entry

    def serving(self, entry: ProcessEntry, path: Any) -> None:
        """The process serves its store at ``path`` (it imported torch): mirror it."""
        want = str(self.directory / f"p{entry.pid}.sock")
        if path != want:
            raise ValueError(f"a process serves at {want}, not elsewhere")
        entry.socket = want
        ctl = RemoteControl(reply_timeout=30.0, pull_every=self.pull_every)
        ctl.status = SourceStatus(state="running", live=True, message=entry.label)
        entry.ctl = ctl
        ctl.connect(lambda: protocol.Client.unix(want, role="holder"))

    def exiting(self, entry: ProcessEntry, status: Any, how: str = "") -> None:
        """The process is about to end (its collectors flushed): fetch it a last time.
        ``how``: how it ends, when the program ends it ("with the server (...)")."""
        ctl = entry.ctl
        if ctl is not None:
            done = threading.Event()

            def last() -> None:
                try:
                    ctl.view(raw=True)
                except Exception:
                    pass
                done.set()

            threading.Thread(target=last, daemon=True).start()
            done.wait(EXITING_PULL_S)
            ctl._closed.set()   # its connection closes next: that is no failure
        entry.state = "ended"
        entry.exit_status = _int(status)
        entry.line = (f"{entry.label} ended" + (f" (os._exit({status}))"
                                                 if status is not None else "")
                      + (f" {how}" if how else ""))

    def child_gone(self, entry: ProcessEntry, clean: bool) -> None:
        """Its registration closed: it ended (said so before) or died (did not)."""
        if entry.state != "running" or self._closing.is_set():
            return   # it said it ended; or the session ends first (it is an orphan then)
        why = death_reason(entry.pid, self.directory)
        entry.state = "died"
        entry.line = f"{entry.label} died: {why}; the other processes go on, everything " \
                     f"measured is kept (its output is in the log)"
        if entry.ctl is not None:
            entry.ctl._closed.set()
        self.notice(entry.line)

    # ------------------------------------------------------------------ watching
    def _watch(self) -> None:
        while not self._closing.wait(WATCH_S):
            self.check_end()
            for e in self._entries[1:]:   # a running process whose mirror broke: say so once
                ctl = e.ctl
                if (ctl is not None and ctl._gone and e.state == "running" and not e.note
                        and not ctl._closed.is_set()):
                    e.note = f"its data stopped: {ctl._gone_why}"[:300]
                    self.notice(f"{e.label}: {e.note}")

    def check_end(self) -> bool:
        """Has the program's main process ended? (the first time: orphans are reported)"""
        with self._lock:
            if self.program_ended:
                return True
            main = self.main
            prog = (main.status.extra or {}).get("program") or {}
            if not (prog.get("running") is False or (main._gone and not self._closing.is_set())):
                return False
            self.program_ended = True
        self._program_ended(prog)
        return True

    def _program_ended(self, prog: dict) -> None:
        main = self._entries[0]
        main.state = "ended" if not self.main._gone else "died"
        main.exit_status = _int(prog.get("exit_status"))
        main.line = (f"{main.label}: {self.main.status.message}" if self.main._gone else
                     f"{main.label} ended (exit status {main.exit_status})")
        time.sleep(0.5)   # a process ending with the program says so first
        live = [e for e in self._entries[1:] if e.state == "running" and pid_alive(e.pid)]
        for e in [e for e in live if e.name in HELPERS]:
            e.state, e.line = "ended", f"{e.label}: multiprocessing's, ends with the session"
        live = [e for e in live if e.name not in HELPERS]
        for e in live:
            e.state = "orphan"
        self.orphans = [e.label for e in live]
        if live:
            self.notice(f"the program's main process ended; {len(live)} of its processes "
                        f"still run: " + ", ".join(self.orphans[:6])
                        + (" …" if len(live) > 6 else ""))
        self.info.update(exit_status=prog.get("exit_status"), ended=prog.get("ended"),
                         orphans=self.orphans)
        self.save_info()

    # ------------------------------------------------------------------ info, snapshots
    def save_info(self, **changes: Any) -> None:
        self.info.update(changes)
        self.info["id"] = self.sid
        self.info["detached"] = self.detached
        self.info["processes"] = len(self._entries)
        try:
            write_info(self.directory, self.info)
        except OSError:
            pass

    def summary(self) -> dict:
        """What ``tuiprof ls`` and ``attach`` show of this session now."""
        out = dict(self.info)
        out.update(self.totals())
        out["processes"] = len(self._entries)
        out["connections"] = self.server.connections if self.server is not None else 0
        out["state"] = self.info.get("state", "running")
        st = self.main.status
        out["status"] = st.message
        out["host"] = socket.gethostname()
        return out

    def write_snapshot(self, path: Path) -> str:
        """Write every process's snapshot to ``path`` atomically (an earlier snapshot there
        stays whole if this write fails)."""
        from ..export.snapshot import write_snapshot  # noqa: PLC0415

        return str(write_snapshot(self.export_view(), path))

    def export_view(self, raw_tokens: int | None = None) -> Any:
        """As a process set's, with what the session's feeds sent (``meta["feeds"]``): the
        keeper's snapshots and the app's ``e`` and final one say it."""
        view = super().export_view(raw_tokens)
        return self.feeds.annotate(view) if self.feeds else view


def death_reason(pid: int | None, directory: Path) -> str:
    """Why a followed process ended without saying so: the fatal signal Python's faulthandler
    wrote, else its exit status if the kernel still has it, else a killing signal (SIGKILL
    from the OOM killer, say: a process can report nothing of that)."""
    try:
        text = (directory / f"crash-{pid}.txt").read_text(errors="replace")
    except OSError:
        text = ""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first:
        return first[:160]
    code = _zombie_status(pid)
    if code is not None:
        sig = code & 0x7F
        if sig:
            import signal  # noqa: PLC0415
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            return f"killed by {name}" + (" (the OOM killer, or kill -9)" if sig == 9 else "")
        return f"exit status {(code >> 8) & 0xFF} without Python's shutdown"
    return "ended without a word (killed by a signal: SIGKILL from the OOM killer or kill -9)"


def _zombie_status(pid: int | None) -> int | None:
    """The wait status of ``pid`` while it is a zombie (its parent has not reaped it)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        if fields[0] != b"Z":
            return None
        return int(fields[49])   # exit_code: field 52 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


# ============================================================================ the server
class SessionHandler(protocol.Handler):
    """One connection to a session's server: a process of the program registering (role
    ``child``), a viewer bound to one process (``viewer``: relayed), or a client asking about
    the session (``control``: ``ls``, ``attach``, ``stop``)."""

    def __init__(self, held: HeldSession) -> None:
        self.held = held
        self.role = ""
        self.entry: ProcessEntry | None = None
        self.upstream: protocol.Client | None = None
        self.sent_full = False

    def hello(self, peer: protocol.Peer, facts: dict) -> Any:
        held = self.held
        role = facts.get("role", "")
        self.role = role
        if role == "child":
            if peer.tcp:
                raise protocol.Refused("processes register over the Unix socket only")
            self.entry = held.register(facts, peer.pid)
            return {"index": self.entry.index, "session": held.sid}
        if role == "viewer":
            self.entry = held.entry(facts.get("proc"))
            if self.entry is None:
                raise protocol.Refused(f"no process {facts.get('proc')!r} in this session")
            return {"pid": self.entry.pid, "kind": "process"}
        if role in ("control", "ui", ""):
            return {"session": held.sid, "kind": "session", "pid": os.getpid()}
        raise protocol.Refused(f"unknown role {str(role)[:20]!r}")

    def request(self, op: str, args: list) -> Any:
        if self.role == "child":
            return self._child(op, args)
        if self.role == "viewer":
            return self._relay(op, args)
        return self._control(op, args)

    def closed(self, clean: bool) -> None:
        if self.role == "child" and self.entry is not None:
            self.held.child_gone(self.entry, clean)
        if self.upstream is not None:
            self.upstream.close(bye=True)
            self.upstream = None

    # ------------------------------------------------------------------ roles
    def _child(self, op: str, args: list) -> Any:
        entry = self.entry
        if op == "serving":
            self.held.serving(entry, args[0] if args else None)
            if len(args) > 1 and isinstance(args[1], str) and args[1]:
                entry.name = args[1][:80]   # what it calls itself (multiprocessing's name)
            return None
        if op == "exiting":
            self.held.exiting(entry, args[0] if args else None,
                              str(args[1])[:200] if len(args) > 1 else "")
            return None
        if op == "note":
            entry.note = str(args[0])[:300] if args else ""
            return None
        raise ValueError(f"unknown request {op!r}")

    def _relay(self, op: str, args: list) -> Any:
        entry = self.entry
        if entry.state == "running" and entry.socket is not None:
            try:
                if self.upstream is None:
                    self.upstream = protocol.Client.unix(entry.socket, role="viewer")
                return protocol.Raw(self.upstream.request_raw(op, *args, timeout=60.0))
            except protocol.ProtocolError:
                self.upstream = None
        ctl = entry.ctl
        if op == "pull":      # it has ended (or serves nothing): what the holder kept
            if ctl is None:
                delta = _mirror_delta_of_meta(_Quiet(entry).meta, not self.sent_full)
                self.sent_full = True
                return SourceStatus(state="quiet"), delta
            with ctl._mirror_lock:
                delta = ctl.mirror.as_delta(full=not self.sent_full)
            self.sent_full = True
            st = dataclasses.replace(ctl.status, extra=dict(ctl.status.extra), live=False)
            return st, delta
        if op in ("restart",):
            self.sent_full = False
            return None
        if op in ("stop", "busy"):
            return None if op == "stop" else False
        return "this process has ended"

    def _control(self, op: str, args: list) -> Any:
        held = self.held
        if op == "info":
            return held.summary()
        if op == "clock":
            # this host's CLOCK_REALTIME, read as late as possible: a fleet UI estimates the
            # offset of this host's clock from the round trip (NTP's way)
            return time.time_ns()
        if op == "procs":
            return [e.facts() for e in held.entries]
        if op == "snapshot":
            return held.snapshot_now() if hasattr(held, "snapshot_now") else None
        if op == "stop":
            if not held.detached:
                raise ValueError("this session belongs to a live app: quit it there (q)")
            held.stop_requested.set()
            if not held.stopped.wait(300):
                raise ValueError("the session did not stop within 300 s")
            return held.final_snapshot
        raise ValueError(f"unknown request {op!r}")


def _mirror_delta_of_meta(meta: dict, full: bool) -> dict:
    m = Mirror(series_len=1)
    m.meta = meta
    return m.as_delta(full)


__all__ = ["HeldSession", "SessionHandler", "death_reason"]
